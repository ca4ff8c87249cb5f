//! The functions Kubernetes adds to CEL that the `cel` crate lacks: the
//! `semver` and `quantity` libraries and the string extensions the DRA
//! environment enables. Written from their documented behaviour
//! (kubernetes.io "CEL in Kubernetes", cel-go `ext/strings`).

use std::cmp::Ordering;
use std::sync::Arc;

use ::cel::objects::Opaque;
use ::cel::{Context, ExecutionError, FunctionContext, Value};

use super::quantity::Quantity;
use super::semver::Version;

type Result<T> = std::result::Result<T, ExecutionError>;

#[derive(Debug, PartialEq, Eq)]
struct SemverValue(Version);

impl Opaque for SemverValue {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

#[derive(Debug, PartialEq, Eq)]
struct QuantityValue(Quantity);

impl Opaque for QuantityValue {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

pub(super) fn semver_value(v: Version) -> Value {
    Value::Opaque(Arc::new(SemverValue(v)))
}

pub(super) fn quantity_value(q: Quantity) -> Value {
    Value::Opaque(Arc::new(QuantityValue(q)))
}

fn as_semver(value: &Value) -> Option<&Version> {
    match value {
        Value::Opaque(o) => o.downcast_ref::<SemverValue>().map(|s| &s.0),
        _ => None,
    }
}

fn as_quantity(value: &Value) -> Option<Quantity> {
    match value {
        Value::Opaque(o) => o.downcast_ref::<QuantityValue>().map(|q| q.0),
        _ => None,
    }
}

/// The resolved arguments of a call (not counting the method target).
fn args(ftx: &FunctionContext) -> Result<Vec<Value>> {
    ftx.args.iter().map(|a| ftx.ptx.resolve(a)).collect()
}

fn arg_string(ftx: &FunctionContext, value: &Value) -> Result<Arc<String>> {
    match value {
        Value::String(s) => Ok(s.clone()),
        other => Err(ftx.error(format!("expected a string, got {}", other.type_of()))),
    }
}

fn arg_int(ftx: &FunctionContext, value: &Value) -> Result<i64> {
    match value {
        Value::Int(i) => Ok(*i),
        other => Err(ftx.error(format!("expected an int, got {}", other.type_of()))),
    }
}

fn this(ftx: &FunctionContext) -> Result<Value> {
    ftx.this
        .clone()
        .ok_or_else(|| ftx.error("must be called as a method"))
}

/// `semver(s)`, `semver(s, normalize)`.
fn semver(ftx: &FunctionContext) -> Result<Value> {
    let a = args(ftx)?;
    let (text, normalize) = match a.as_slice() {
        [s] => (arg_string(ftx, s)?, false),
        [s, Value::Bool(n)] => (arg_string(ftx, s)?, *n),
        _ => return Err(ftx.error("expects (string) or (string, bool)")),
    };
    Version::parse_with(&text, normalize)
        .map(semver_value)
        .map_err(|e| ftx.error(e))
}

fn is_semver(ftx: &FunctionContext) -> Result<Value> {
    let a = args(ftx)?;
    let (text, normalize) = match a.as_slice() {
        [s] => (arg_string(ftx, s)?, false),
        [s, Value::Bool(n)] => (arg_string(ftx, s)?, *n),
        _ => return Err(ftx.error("expects (string) or (string, bool)")),
    };
    Ok(Value::Bool(Version::parse_with(&text, normalize).is_ok()))
}

fn quantity(ftx: &FunctionContext) -> Result<Value> {
    let a = args(ftx)?;
    match a.as_slice() {
        [s] => Quantity::parse(&arg_string(ftx, s)?)
            .map(quantity_value)
            .map_err(|e| ftx.error(e)),
        _ => Err(ftx.error("expects one string")),
    }
}

fn is_quantity(ftx: &FunctionContext) -> Result<Value> {
    let a = args(ftx)?;
    match a.as_slice() {
        [s] => Ok(Value::Bool(Quantity::parse(&arg_string(ftx, s)?).is_ok())),
        _ => Err(ftx.error("expects one string")),
    }
}

/// Ordering of `this` against the single argument, both semvers or both quantities.
fn ordering(ftx: &FunctionContext) -> Result<Ordering> {
    let target = this(ftx)?;
    let a = args(ftx)?;
    let [other] = a.as_slice() else {
        return Err(ftx.error("expects one argument"));
    };
    if let (Some(x), Some(y)) = (as_semver(&target), as_semver(other)) {
        return Ok(x.cmp(y));
    }
    if let (Some(x), Some(y)) = (as_quantity(&target), as_quantity(other)) {
        return Ok(x.cmp(&y));
    }
    Err(ExecutionError::NoSuchOverload)
}

fn compare_to(ftx: &FunctionContext) -> Result<Value> {
    Ok(Value::Int(match ordering(ftx)? {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }))
}

fn is_less_than(ftx: &FunctionContext) -> Result<Value> {
    Ok(Value::Bool(ordering(ftx)? == Ordering::Less))
}

fn is_greater_than(ftx: &FunctionContext) -> Result<Value> {
    Ok(Value::Bool(ordering(ftx)? == Ordering::Greater))
}

fn version_part(ftx: &FunctionContext, part: fn(&Version) -> u64) -> Result<Value> {
    let target = this(ftx)?;
    let v = as_semver(&target).ok_or(ExecutionError::NoSuchOverload)?;
    i64::try_from(part(v))
        .map(Value::Int)
        .map_err(|_| ftx.error("version number out of int range"))
}

fn quantity_this(ftx: &FunctionContext) -> Result<Quantity> {
    as_quantity(&this(ftx)?).ok_or(ExecutionError::NoSuchOverload)
}

/// `q.add(q2)`, `q.add(int)`, `q.sub(...)`.
fn arith(ftx: &FunctionContext, subtract: bool) -> Result<Value> {
    let q = quantity_this(ftx)?;
    let a = args(ftx)?;
    let other = match a.as_slice() {
        [Value::Int(i)] => Quantity::from_int(*i),
        [v] => Some(as_quantity(v).ok_or(ExecutionError::NoSuchOverload)?),
        _ => return Err(ftx.error("expects one argument")),
    };
    let result = other.and_then(|o| {
        if subtract {
            q.checked_sub(o)
        } else {
            q.checked_add(o)
        }
    });
    result
        .map(quantity_value)
        .ok_or_else(|| ftx.error("quantity overflow"))
}

fn sign(ftx: &FunctionContext) -> Result<Value> {
    Ok(Value::Int(quantity_this(ftx)?.sign()))
}

fn is_integer(ftx: &FunctionContext) -> Result<Value> {
    Ok(Value::Bool(quantity_this(ftx)?.is_integer()))
}

fn as_integer(ftx: &FunctionContext) -> Result<Value> {
    quantity_this(ftx)?
        .as_integer()
        .map(Value::Int)
        .ok_or_else(|| ftx.error("cannot convert value to integer"))
}

fn as_approximate_float(ftx: &FunctionContext) -> Result<Value> {
    Ok(Value::Float(quantity_this(ftx)?.as_approximate_float()))
}

fn string_this(ftx: &FunctionContext) -> Result<Arc<String>> {
    match this(ftx)? {
        Value::String(s) => Ok(s),
        _ => Err(ExecutionError::NoSuchOverload),
    }
}

fn lower_ascii(ftx: &FunctionContext) -> Result<Value> {
    Ok(Value::String(Arc::new(
        string_this(ftx)?.to_ascii_lowercase(),
    )))
}

fn upper_ascii(ftx: &FunctionContext) -> Result<Value> {
    Ok(Value::String(Arc::new(
        string_this(ftx)?.to_ascii_uppercase(),
    )))
}

fn trim(ftx: &FunctionContext) -> Result<Value> {
    Ok(Value::String(Arc::new(
        string_this(ftx)?.trim().to_string(),
    )))
}

/// Index in code points, as CEL strings are indexed.
fn char_index(haystack: &str, byte_index: usize) -> i64 {
    i64::try_from(haystack[..byte_index].chars().count()).unwrap_or(i64::MAX)
}

fn index_of(ftx: &FunctionContext) -> Result<Value> {
    let s = string_this(ftx)?;
    let a = args(ftx)?;
    let [needle] = a.as_slice() else {
        return Err(ftx.error("expects one string"));
    };
    let needle = arg_string(ftx, needle)?;
    Ok(Value::Int(
        s.find(needle.as_str()).map_or(-1, |b| char_index(&s, b)),
    ))
}

fn last_index_of(ftx: &FunctionContext) -> Result<Value> {
    let s = string_this(ftx)?;
    let a = args(ftx)?;
    let [needle] = a.as_slice() else {
        return Err(ftx.error("expects one string"));
    };
    let needle = arg_string(ftx, needle)?;
    Ok(Value::Int(
        s.rfind(needle.as_str()).map_or(-1, |b| char_index(&s, b)),
    ))
}

fn replace(ftx: &FunctionContext) -> Result<Value> {
    let s = string_this(ftx)?;
    let a = args(ftx)?;
    let (from, to, limit) = match a.as_slice() {
        [f, t] => (arg_string(ftx, f)?, arg_string(ftx, t)?, -1),
        [f, t, n] => (arg_string(ftx, f)?, arg_string(ftx, t)?, arg_int(ftx, n)?),
        _ => return Err(ftx.error("expects (string, string[, int])")),
    };
    let replaced = match usize::try_from(limit) {
        Ok(n) => s.replacen(from.as_str(), to.as_str(), n),
        Err(_) => s.replace(from.as_str(), to.as_str()),
    };
    Ok(Value::String(Arc::new(replaced)))
}

fn split(ftx: &FunctionContext) -> Result<Value> {
    let s = string_this(ftx)?;
    let a = args(ftx)?;
    let [sep] = a.as_slice() else {
        return Err(ftx.error("expects one string"));
    };
    let sep = arg_string(ftx, sep)?;
    let parts: Vec<Value> = if sep.is_empty() {
        s.chars()
            .map(|c| Value::String(Arc::new(c.to_string())))
            .collect()
    } else {
        s.split(sep.as_str())
            .map(|p| Value::String(Arc::new(p.to_string())))
            .collect()
    };
    Ok(Value::List(Arc::new(parts)))
}

fn substring(ftx: &FunctionContext) -> Result<Value> {
    let s = string_this(ftx)?;
    let chars: Vec<char> = s.chars().collect();
    let a = args(ftx)?;
    let (start, end) = match a.as_slice() {
        [b] => (
            arg_int(ftx, b)?,
            i64::try_from(chars.len()).unwrap_or(i64::MAX),
        ),
        [b, e] => (arg_int(ftx, b)?, arg_int(ftx, e)?),
        _ => return Err(ftx.error("expects (int[, int])")),
    };
    let (Ok(start), Ok(end)) = (usize::try_from(start), usize::try_from(end)) else {
        return Err(ftx.error("index out of range"));
    };
    if start > end || end > chars.len() {
        return Err(ftx.error("index out of range"));
    }
    Ok(Value::String(Arc::new(chars[start..end].iter().collect())))
}

fn join(ftx: &FunctionContext) -> Result<Value> {
    let Value::List(items) = this(ftx)? else {
        return Err(ExecutionError::NoSuchOverload);
    };
    let a = args(ftx)?;
    let sep = match a.as_slice() {
        [] => Arc::new(String::new()),
        [s] => arg_string(ftx, s)?,
        _ => return Err(ftx.error("expects at most one string")),
    };
    let parts = items
        .iter()
        .map(|v| arg_string(ftx, v).map(|s| s.to_string()))
        .collect::<Result<Vec<_>>>()?;
    Ok(Value::String(Arc::new(parts.join(sep.as_str()))))
}

pub(super) fn register(ctx: &mut Context<'static>) {
    ctx.add_function("semver", semver);
    ctx.add_function("isSemver", is_semver);
    ctx.add_function("quantity", quantity);
    ctx.add_function("isQuantity", is_quantity);
    ctx.add_function("compareTo", compare_to);
    ctx.add_function("isLessThan", is_less_than);
    ctx.add_function("isGreaterThan", is_greater_than);
    ctx.add_function("major", |ftx: &FunctionContext| {
        version_part(ftx, |v| v.major)
    });
    ctx.add_function("minor", |ftx: &FunctionContext| {
        version_part(ftx, |v| v.minor)
    });
    ctx.add_function("patch", |ftx: &FunctionContext| {
        version_part(ftx, |v| v.patch)
    });
    ctx.add_function("add", |ftx: &FunctionContext| arith(ftx, false));
    ctx.add_function("sub", |ftx: &FunctionContext| arith(ftx, true));
    ctx.add_function("sign", sign);
    ctx.add_function("isInteger", is_integer);
    ctx.add_function("asInteger", as_integer);
    ctx.add_function("asApproximateFloat", as_approximate_float);
    ctx.add_function("lowerAscii", lower_ascii);
    ctx.add_function("upperAscii", upper_ascii);
    ctx.add_function("trim", trim);
    ctx.add_function("indexOf", index_of);
    ctx.add_function("lastIndexOf", last_index_of);
    ctx.add_function("replace", replace);
    ctx.add_function("split", split);
    ctx.add_function("substring", substring);
    ctx.add_function("join", join);
}
