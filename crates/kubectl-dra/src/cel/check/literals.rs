//! What the API server checks in literals when it compiles a selector:
//! aggregate literals of one type, and `duration`/`timestamp` arguments it
//! can parse.

use kube_cel::cel::common::ast::{CallExpr, Expr, LiteralValue};

use super::types::Ty;
use crate::cel::timestamps;

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
/// (`cel.ValidateDurationLiterals`, `cel.ValidateTimestampLiterals`; a
/// timestamp as `timestamps` reads it).
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
        "timestamp" if timestamps::parse(text).is_err() => {
            Err(format!("invalid timestamp argument {:?}", &**text))
        }
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
