//! The signatures of the environment's functions, as far as the checker
//! needs them: the form each is called in, the receivers and arguments it
//! has overloads for, its result type, and what the cost estimate refuses.

use kube_cel::cel::common::ast::{CallExpr, Expr};

use super::types::Ty;

/// Whether `name` exists in the form it is called in: global (`size(x)`),
/// method (`x.size()`), or both.
pub(super) fn form_ok(name: &str, method: bool) -> bool {
    let global_only = matches!(
        name,
        "quantity"
            | "isQuantity"
            | "semver"
            | "isSemver"
            | "cidr"
            | "isIP"
            | "isCIDR"
            | "url"
            | "isURL"
            | "sets.contains"
            | "sets.equivalent"
            | "sets.intersects"
            | "lists.range"
            | "strings.quote"
            | "ip.isCanonical"
            | "optional.of"
            | "optional.none"
            | "optional.ofNonZeroValue"
            | "optional.unwrap"
            | "int"
            | "uint"
            | "double"
            | "bytes"
            | "bool"
            | "type"
            | "dyn"
            | "duration"
            | "timestamp"
            | "cel.bind"
            | "has"
    ) || name.starts_with("format.");
    let both = matches!(name, "size" | "matches" | "ip" | "string");
    if both {
        true
    } else if global_only {
        !method
    } else {
        method
    }
}

/// Whether method `name` can apply to a receiver of type `r`.
pub(super) fn receiver_ok(name: &str, r: Ty) -> bool {
    use Ty::*;
    let r = match r {
        Any => return true,
        // No method takes a type value.
        Type(_) => return false,
        r if r.is_list() => List,
        r if r.is_map() => Map,
        r => r,
    };
    match name {
        "charAt" | "lowerAscii" | "upperAscii" | "replace" | "split" | "substring" | "trim"
        | "format" | "startsWith" | "endsWith" | "matches" | "find" | "findAll" => r == String,
        "contains" => r == String,
        "indexOf" | "lastIndexOf" => matches!(r, String | List),
        "join" | "isSorted" | "sum" | "min" | "max" | "slice" | "flatten" | "distinct"
        | "reverse" | "sort" | "first" | "last" => r == List,
        "sign" | "add" | "sub" | "asApproximateFloat" | "asInteger" | "isInteger" => r == Quantity,
        "isGreaterThan" | "isLessThan" | "compareTo" => matches!(r, Quantity | Semver),
        "major" | "minor" | "patch" => r == Semver,
        "family"
        | "isUnspecified"
        | "isLoopback"
        | "isLinkLocalMulticast"
        | "isLinkLocalUnicast"
        | "isGlobalUnicast" => r == Ip,
        "containsIP" | "containsCIDR" | "masked" | "prefixLength" | "isMask" => r == Cidr,
        "unwrapOpt" => r == List,
        "ip" => r == Cidr,
        "getScheme" | "getHost" | "getHostname" | "getPort" | "getEscapedPath" | "getQuery" => {
            r == Url
        }
        "hasValue" | "value" | "or" | "orValue" | "optMap" | "optFlatMap" => false,
        _ => true,
    }
}

/// The result type of a call whose result type is fixed.
pub(super) fn result_type(name: &str, recv: Option<Ty>) -> Option<Ty> {
    use Ty::*;
    Some(match name {
        "size" | "indexOf" | "lastIndexOf" | "sign" | "asInteger" | "compareTo" | "major"
        | "minor" | "patch" | "int" | "family" | "prefixLength" => Int,
        "uint" => Uint,
        "double" | "asApproximateFloat" => Double,
        "startsWith"
        | "endsWith"
        | "contains"
        | "matches"
        | "isSorted"
        | "isQuantity"
        | "isInteger"
        | "isGreaterThan"
        | "isLessThan"
        | "isSemver"
        | "isIP"
        | "isCIDR"
        | "isURL"
        | "ip.isCanonical"
        | "isUnspecified"
        | "isLoopback"
        | "isLinkLocalMulticast"
        | "isLinkLocalUnicast"
        | "isGlobalUnicast"
        | "containsIP"
        | "containsCIDR"
        | "sets.contains"
        | "sets.equivalent"
        | "sets.intersects"
        | "includes"
        | "isMask"
        | "bool" => Bool,
        "charAt" | "lowerAscii" | "upperAscii" | "replace" | "substring" | "trim" | "join"
        | "format" | "strings.quote" | "find" | "getScheme" | "getHost" | "getHostname"
        | "getPort" | "getEscapedPath" | "string" => String,
        "split" | "findAll" => StringList,
        "slice" | "flatten" | "lists.range" | "distinct" | "sort" | "optional.unwrap"
        | "unwrapOpt" => List,
        // Lists extension only: strings v2 has no `reverse`, so on an
        // attribute the list overload is the one that matches.
        "reverse" if recv.is_some_and(|r| r.is_list() || r == Any) => List,
        "duration" => Duration,
        "timestamp" => Timestamp,
        "getQuery" => Map,
        "quantity" | "add" | "sub" => Quantity,
        "semver" => Semver,
        "ip" => Ip,
        "cidr" | "masked" => Cidr,
        "url" => Url,
        "bytes" => Bytes,
        _ => return None,
    })
}

/// How many arguments a function of the optional types, `type` or `isMask`
/// takes, when a fixed number. `optional.of(1).hasValue(1)` is optional
/// types v3, which no release's environment has (1.38 pins v2).
pub(super) fn arity(name: &str) -> Option<&'static [usize]> {
    match name {
        "hasValue" | "value" | "optional.none" | "unwrapOpt" | "isMask" => Some(&[0]),
        "or"
        | "orValue"
        | "optional.of"
        | "optional.ofNonZeroValue"
        | "optional.unwrap"
        | "type"
        | "dyn" => Some(&[1]),
        _ => None,
    }
}

/// Argument types of the string functions, where the checker knows them:
/// `"abc".contains(1)` has no overload, nor has `lowerAscii(1)`.
pub(super) fn arguments_ok(
    name: &str,
    recv: Option<Ty>,
    args: &[Option<Ty>],
) -> Result<(), String> {
    let string_method = recv == Some(Ty::String) || recv == Some(Ty::Any);
    if !string_method {
        return Ok(());
    }
    let arity: Option<&[usize]> = match name {
        "lowerAscii" | "upperAscii" | "trim" => Some(&[0]),
        "contains" | "startsWith" | "endsWith" | "matches" | "charAt" | "format" => Some(&[1]),
        "indexOf" | "lastIndexOf" | "split" | "substring" | "find" => Some(&[1, 2]),
        "findAll" => Some(&[1, 2]),
        "replace" => Some(&[2, 3]),
        _ => None,
    };
    let wants_string = |i: usize| match name {
        "contains" | "startsWith" | "endsWith" | "matches" | "find" | "findAll" | "split"
        | "indexOf" | "lastIndexOf" => i == 0,
        "replace" => i < 2,
        _ => false,
    };
    let wants_int = |i: usize| match name {
        "charAt" | "substring" => true,
        "indexOf" | "lastIndexOf" | "split" | "findAll" => i == 1,
        "replace" => i == 2,
        _ => false,
    };
    let mismatch = || {
        let list: Vec<&str> = args.iter().map(|a| a.map_or("dyn", Ty::name)).collect();
        format!(
            "found no matching overload for '{name}' applied to 'string.({})'",
            list.join(", ")
        )
    };
    if let Some(counts) = arity
        && !counts.contains(&args.len())
    {
        return Err(mismatch());
    }
    for (i, a) in args.iter().enumerate() {
        let Some(t) = a else { continue };
        if *t == Ty::Any {
            continue;
        }
        if (wants_string(i) && *t != Ty::String) || (wants_int(i) && *t != Ty::Int) {
            return Err(mismatch());
        }
    }
    Ok(())
}

/// The strings extension checks `format` calls whose pattern is a literal
/// (`StringsValidateFormatCalls`): each clause against the static type of
/// its argument. An attribute is typed `google.protobuf.Any`, which no
/// clause accepts.
pub(super) fn format_clauses(pattern: &str, args: &[Option<Ty>]) -> Result<(), String> {
    let mut chars = pattern.chars().peekable();
    let mut index = 0;
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            continue;
        }
        if chars.peek() == Some(&'.') {
            chars.next();
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
        }
        let Some(verb) = chars.next() else {
            return Err("error during formatting: unexpected end of format string".to_string());
        };
        let Some(arg) = args.get(index) else {
            return Err(format!(
                "error during formatting: index {index} out of range"
            ));
        };
        index += 1;
        if *arg == Some(Ty::Any) {
            return Err(format!(
                "error during formatting: clause %{verb} was given google.protobuf.Any"
            ));
        }
    }
    Ok(())
}

/// The API server also refuses a selector whose estimated worst-case cost
/// exceeds the DRA limit (`CELSelectorExpressionMaxCost`, 1,000,000). The
/// estimate multiplies sizes, and the checker knows no size for the
/// elements of a list (`k8s.io/apiserver/pkg/cel/library/cost.go`): so a
/// `join` is always over the limit, as are the list functions that compare
/// strings element by element, and `lists.range` of a number not written
/// in the expression.
pub(super) fn cost(name: &str, call: &CallExpr, recv: Option<Ty>) -> Result<(), String> {
    let too_complex = || Err(format!("too complex, exceeds cost limit ({name})"));
    match name {
        "join" => too_complex(),
        "isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf"
            if recv == Some(Ty::StringList) =>
        {
            too_complex()
        }
        "lists.range" if !matches!(call.args.first().map(|a| &a.expr), Some(Expr::Literal(_))) => {
            too_complex()
        }
        _ => Ok(()),
    }
}
