//! What the API server checks in literals when it compiles a selector:
//! aggregate literals of one type, and `duration`/`timestamp` arguments it
//! can parse.

use kube_cel::cel::common::ast::{CallExpr, Expr, LiteralValue};

use super::types::Ty;

/// `cel.ValidateHomogeneousAggregateLiterals`, which the Kubernetes base
/// environment enables: every element of a literal has the type of the
/// first (an attribute, typed `any`, does not mix with an `int`).
pub(super) fn homogeneous(types: &[Option<Ty>], what: &str) -> Result<(), String> {
    let mut known = types.iter().flatten();
    if let Some(first) = known.next() {
        for t in known {
            if first.same(*t) == Some(false) {
                return Err(format!(
                    "expected type '{}' but found '{}' in a {what}",
                    first.name(),
                    t.name()
                ));
            }
        }
    }
    Ok(())
}

/// The literal arguments the API server parses when it compiles: a
/// `duration("...")` and a `timestamp("...")` must be valid
/// (`cel.ValidateDurationLiterals`, `cel.ValidateTimestampLiterals`).
pub(super) fn literal_argument(name: &str, call: &CallExpr) -> Result<(), String> {
    if call.target.is_some() {
        return Ok(());
    }
    let [arg] = call.args.as_slice() else {
        return Ok(());
    };
    let Expr::Literal(LiteralValue::String(text)) = &arg.expr else {
        return Ok(());
    };
    match name {
        "duration" if !go_duration(text) => Err(format!("invalid duration argument {:?}", &**text)),
        "timestamp" if !rfc3339(text) => Err(format!("invalid timestamp argument {:?}", &**text)),
        _ => Ok(()),
    }
}

/// Go's `time.ParseDuration` syntax: an optional sign, then `0` or one or
/// more decimal numbers each with a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`,
/// `h`).
pub(super) fn go_duration(text: &str) -> bool {
    let s = text.strip_prefix(['-', '+']).unwrap_or(text);
    if s == "0" {
        return true;
    }
    if s.is_empty() {
        return false;
    }
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..digits];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ns", "us", "µs", "μs", "ms", "s", "m", "h"]
            .into_iter()
            .find(|u| rest.starts_with(u) && !(*u == "m" && rest.starts_with("ms")));
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

/// RFC 3339 as Go's `time.Parse(time.RFC3339, ...)` reads it:
/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`.
pub(super) fn rfc3339(text: &str) -> bool {
    let b = text.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        b.get(r.clone())
            .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
            .then(|| text[r].parse::<u32>().ok())
            .flatten()
    };
    let (Some(_), Some(month), Some(day), Some(hour), Some(min), Some(sec)) = (
        digits(0..4),
        digits(5..7),
        digits(8..10),
        digits(11..13),
        digits(14..16),
        digits(17..19),
    ) else {
        return false;
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return false;
    }
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 59 {
        return false;
    }
    let mut rest = &text[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(frac.len());
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    match rest.as_bytes() {
        [b'Z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit()),
        _ => false,
    }
}
