//! The parts of the DRA environment that neither `cel` 0.13 nor `kube-cel`
//! 0.8 provide, written here from the cel-go documentation (`ext/README.md`:
//! bindings, two-variable comprehensions, `sortBy`) and
//! `k8s.io/apiserver/pkg/cel/library/lists.go` (`includes`):
//!
//! - `cel.bind(v, init, body)`, the three-argument `all`/`exists`/`existsOne`,
//!   `transformList`, `transformMap`, `transformMapEntry` and `sortBy` are
//!   macros in cel-go; the `cel` crate's parser only expands the standard
//!   ones and leaves these as calls, which arrive here with their arguments
//!   unevaluated, so each binds its variables in an inner scope itself.
//! - `includes` (Kubernetes lists v1, 1.37) and `isMask` (CIDR v1, 1.38)
//!   are missing from kube-cel, `dyn`, `bool`, `optional.unwrap` and
//!   `unwrapOpt` (optional types v2) from `cel`, and kube-cel's `reverse` also takes
//!   strings, which the DRA environment's strings v2 does not.
//!
//! Drop each one here when a crate release provides it.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use kube_cel::cel::common::ast::Expr;
use kube_cel::cel::common::ast::IdedExpr as Expression;
use kube_cel::cel::objects::{Key, Map, OptionalValue};
use kube_cel::cel::{Context, ExecutionError, FunctionContext, Value};

type Result<T> = std::result::Result<T, ExecutionError>;

pub(super) fn register(ctx: &mut Context<'static>) {
    ctx.add_function("cel.bind", bind);
    ctx.add_function("all", |ftx: &FunctionContext| {
        quantifier(ftx, Quantifier::All)
    });
    ctx.add_function("exists", |ftx: &FunctionContext| {
        quantifier(ftx, Quantifier::Exists)
    });
    ctx.add_function("existsOne", |ftx: &FunctionContext| {
        quantifier(ftx, Quantifier::ExistsOne)
    });
    ctx.add_function("transformList", transform_list);
    ctx.add_function("transformMap", transform_map);
    ctx.add_function("transformMapEntry", transform_map_entry);
    ctx.add_function("sortBy", sort_by);
    ctx.add_function("includes", includes);
    ctx.add_function("isMask", is_mask);
    ctx.add_function("optional.unwrap", |ftx: &FunctionContext| {
        let [list] = ftx.args else {
            return Err(ftx.error("expects one argument"));
        };
        unwrap_optionals(ftx, ftx.ptx.resolve(list)?)
    });
    ctx.add_function("unwrapOpt", |ftx: &FunctionContext| {
        unwrap_optionals(ftx, this(ftx)?)
    });
    ctx.add_function("reverse", reverse);
    ctx.add_function("dyn", dyn_);
    ctx.add_function("bool", bool_);
    ctx.add_function("optMap", |ftx: &FunctionContext| opt_map(ftx, false));
    ctx.add_function("optFlatMap", |ftx: &FunctionContext| opt_map(ftx, true));
    ctx.add_function("format.named", format_named);
    ctx.add_function(EQUALS, |ftx: &FunctionContext| {
        equality(ftx).map(Value::Bool)
    });
    ctx.add_function(NOT_EQUALS, |ftx: &FunctionContext| {
        equality(ftx).map(|eq| Value::Bool(!eq))
    });
}

/// What `==` and `!=` are rewritten to (see the module docs of `cel`): the
/// `cel` crate compares its values by type first, so `2 == 2.0` and
/// `semver("1.0.0+a") == semver("1.0.0+b")` are false there; cel-go, as
/// the scheduler runs it, compares numbers by value across int, uint and
/// double, and Kubernetes quantities and versions by `compareTo` (a
/// version's build metadata does not count).
pub(super) const EQUALS: &str = "@k8s_equals";
pub(super) const NOT_EQUALS: &str = "@k8s_not_equals";

fn equality(ftx: &FunctionContext) -> Result<bool> {
    let [a, b] = ftx.args else {
        return Err(ftx.error("expects two operands"));
    };
    let (a, b) = (ftx.ptx.resolve(a)?, ftx.ptx.resolve(b)?);
    equal(ftx, &a, &b)
}

fn equal(ftx: &FunctionContext, a: &Value, b: &Value) -> Result<bool> {
    match (a, b) {
        (Value::List(x), Value::List(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (x, y) in x.iter().zip(y.iter()) {
                if !equal(ftx, x, y)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        (Value::Map(x), Value::Map(y)) => {
            if x.map.len() != y.map.len() {
                return Ok(false);
            }
            for (k, v) in x.map.iter() {
                match y.map.get(k) {
                    Some(w) if equal(ftx, v, w)? => {}
                    _ => return Ok(false),
                }
            }
            Ok(true)
        }
        (Value::Opaque(x), Value::Opaque(y))
            if x.runtime_type_name() == "kubernetes.Semver"
                && y.runtime_type_name() == "kubernetes.Semver" =>
        {
            // kube-cel keeps the version private and orders build metadata
            // too; SemVer equality ignores it. The Debug form names the
            // fields, build last.
            let without_build = |v: &dyn std::fmt::Debug| {
                let text = format!("{v:?}");
                match text.find(", build:") {
                    Some(i) => text[..i].to_string(),
                    None => text,
                }
            };
            Ok(without_build(x.as_debug()) == without_build(y.as_debug()))
        }
        (Value::Opaque(x), Value::Opaque(y))
            if x.runtime_type_name() == "kubernetes.Quantity"
                && y.runtime_type_name() == "kubernetes.Quantity" =>
        {
            let mut scope = ftx.ptx.new_inner_scope();
            scope.add_variable_from_value("a", a.clone());
            scope.add_variable_from_value("b", b.clone());
            let compare = COMPARE.with(|c| c.clone());
            let compare = compare.ok_or_else(|| ftx.error("cannot parse compareTo"))?;
            Ok(scope.resolve(&compare)? == Value::Int(0))
        }
        _ => Ok(a == b),
    }
}

thread_local! {
    static COMPARE: Option<Expression> =
        kube_cel::cel::parser::Parser::new().parse("a.compareTo(b)").ok();
    /// kube-cel keeps a CIDR's network private: `isMask` compares with
    /// kube-cel's `masked()` of the same CIDR.
    static IS_MASK: Option<Expression> =
        kube_cel::cel::parser::Parser::new().parse("c.masked() == c").ok();
}

/// `cidr.isMask()` (CIDR library v1, Kubernetes 1.38): whether every bit
/// after the prefix is 0, as in `cidr("10.0.0.0/8")` but not
/// `cidr("10.0.0.1/8")`.
fn is_mask(ftx: &FunctionContext) -> Result<Value> {
    let cidr = this(ftx)?;
    if !matches!(&cidr, Value::Opaque(o) if o.runtime_type_name() == "net.CIDR") {
        return Err(ftx.error(format!("no such overload: isMask() of {}", cidr.type_of())));
    }
    let mut scope = ftx.ptx.new_inner_scope();
    scope.add_variable_from_value("c", cidr);
    let is_mask = IS_MASK.with(|e| e.clone());
    let is_mask = is_mask.ok_or_else(|| ftx.error("cannot parse masked()"))?;
    scope.resolve(&is_mask)
}

/// `optional.unwrap(list)` and `list.unwrapOpt()` (optional types v2): the
/// values of the optionals that have one, in order.
fn unwrap_optionals(ftx: &FunctionContext, list: Value) -> Result<Value> {
    let Value::List(items) = list else {
        return Err(ftx.error(format!("no such overload for {}", list.type_of())));
    };
    let mut values = Vec::with_capacity(items.len());
    for item in items.iter() {
        match item {
            Value::Opaque(o) => match o.downcast_ref::<OptionalValue>() {
                Some(optional) => values.extend(optional.value().cloned()),
                None => return Err(ftx.error("the list holds a value that is not an optional")),
            },
            other => {
                return Err(ftx.error(format!(
                    "the list holds a {}, not an optional",
                    other.type_of()
                )));
            }
        }
    }
    Ok(Value::List(Arc::new(values)))
}

/// `opt.optMap(x, expr)` and `opt.optFlatMap(x, expr)` (optional types):
/// none stays none; otherwise `expr` with `x` bound to the value, wrapped
/// in an optional by `optMap`, itself an optional for `optFlatMap`.
fn opt_map(ftx: &FunctionContext, flat: bool) -> Result<Value> {
    let [name, body] = ftx.args else {
        return Err(ftx.error("expects (var, expr)"));
    };
    let name = variable(ftx, name)?;
    let target = this(ftx)?;
    let Value::Opaque(opaque) = &target else {
        return Err(ftx.error(format!("optMap of a {}, not an optional", target.type_of())));
    };
    let Some(optional) = opaque.downcast_ref::<OptionalValue>() else {
        return Err(ftx.error("optMap of a value that is not an optional"));
    };
    let Some(inner) = optional.value() else {
        return Ok(target.clone());
    };
    let result = eval_with(ftx, &[(name, inner)], body)?;
    if flat {
        match &result {
            Value::Opaque(o) if o.downcast_ref::<OptionalValue>().is_some() => Ok(result),
            other => Err(ftx.error(format!(
                "optFlatMap must yield an optional, got {}",
                other.type_of()
            ))),
        }
    } else {
        Ok(Value::Opaque(Arc::new(OptionalValue::of(result))))
    }
}

/// `format.named(name)` is `optional<Format>` in Kubernetes: `none` for a
/// name it does not know. kube-cel returns the format itself (or null), so
/// `format.named("x").value()` failed here where the scheduler succeeds.
fn format_named(ftx: &FunctionContext) -> Result<Value> {
    let [name] = ftx.args else {
        return Err(ftx.error("expects one argument"));
    };
    let name = ftx.ptx.resolve(name)?;
    let Value::String(name) = &name else {
        return Err(ftx.error(format!("format.named of a {}", name.type_of())));
    };
    let direct = format!("format.{name}()");
    let known = super::release::function_since(&format!("format.{name}")).is_some();
    if !known {
        return Ok(Value::Opaque(Arc::new(OptionalValue::none())));
    }
    let expr = kube_cel::cel::parser::Parser::new()
        .parse(&direct)
        .map_err(|e| ftx.error(e.to_string()))?;
    let format = ftx.ptx.resolve(&expr)?;
    Ok(Value::Opaque(Arc::new(OptionalValue::of(format))))
}

/// `dyn(x)`: a type-checker hint, the identity at run time; the `cel` crate
/// has no type checker and no `dyn`.
fn dyn_(ftx: &FunctionContext) -> Result<Value> {
    let [x] = ftx.args else {
        return Err(ftx.error("expects one argument"));
    };
    ftx.ptx.resolve(x)
}

/// `bool(x)`, which the `cel` crate lacks: a bool as is, a string as Go's
/// `strconv.ParseBool` reads it.
fn bool_(ftx: &FunctionContext) -> Result<Value> {
    let [x] = ftx.args else {
        return Err(ftx.error("expects one argument"));
    };
    match ftx.ptx.resolve(x)? {
        Value::Bool(b) => Ok(Value::Bool(b)),
        Value::String(s) => match s.as_str() {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(Value::Bool(true)),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(Value::Bool(false)),
            _ => Err(ftx.error(format!(
                "type conversion error from 'string' to 'bool': {s:?}"
            ))),
        },
        other => Err(ftx.error(format!("no such overload: bool({})", other.type_of()))),
    }
}

/// `reverse()` of lists extension v2. kube-cel also reverses strings (cel-go
/// strings v3), which the DRA environment (strings v2) has not: on a string
/// the scheduler finds no overload at run time.
fn reverse(ftx: &FunctionContext) -> Result<Value> {
    match this(ftx)? {
        Value::List(items) => Ok(Value::List(Arc::new(items.iter().rev().cloned().collect()))),
        other => Err(ftx.error(format!(
            "no such overload: reverse() of {}",
            other.type_of()
        ))),
    }
}

/// The variable name an argument declares (`x` in `l.all(i, x, ...)`).
fn variable<'e>(ftx: &FunctionContext, expr: &'e Expression) -> Result<&'e str> {
    match &expr.expr {
        Expr::Ident(name) => Ok(name.as_str()),
        _ => Err(ftx.error("argument must be a simple name")),
    }
}

fn this(ftx: &FunctionContext) -> Result<Value> {
    ftx.this
        .clone()
        .ok_or_else(|| ftx.error("must be called as a method"))
}

/// `(first, second)` variable values of each iteration: (index, element) of
/// a list, (key, value) of a map. Maps iterate in key order, as the
/// order is unspecified in CEL and a stable one makes results reproducible.
fn pairs(ftx: &FunctionContext, range: &Value) -> Result<Vec<(Value, Value)>> {
    match range {
        Value::List(items) => Ok(items
            .iter()
            .enumerate()
            .map(|(i, v)| (Value::Int(i64::try_from(i).unwrap_or(i64::MAX)), v.clone()))
            .collect()),
        Value::Map(map) => {
            let mut entries: Vec<(&Key, &Value)> = map.map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Ok(entries
                .into_iter()
                .map(|(k, v)| (Value::from(k), v.clone()))
                .collect())
        }
        other => Err(ftx.error(format!("cannot iterate over {}", other.type_of()))),
    }
}

fn eval_with(ftx: &FunctionContext, vars: &[(&str, &Value)], body: &Expression) -> Result<Value> {
    let mut scope = ftx.ptx.new_inner_scope();
    for (name, value) in vars {
        scope.add_variable_from_value(*name, (*value).clone());
    }
    scope.resolve(body)
}

fn as_bool(ftx: &FunctionContext, value: Value) -> Result<bool> {
    match value {
        Value::Bool(b) => Ok(b),
        other => Err(ftx.error(format!("expected a bool, got {}", other.type_of()))),
    }
}

/// `cel.bind(name, init, body)`.
fn bind(ftx: &FunctionContext) -> Result<Value> {
    let [name, init, body] = ftx.args else {
        return Err(ftx.error("expects (name, init, body)"));
    };
    let name = variable(ftx, name)?;
    let value = ftx.ptx.resolve(init)?;
    eval_with(ftx, &[(name, &value)], body)
}

#[derive(Clone, Copy)]
enum Quantifier {
    All,
    Exists,
    ExistsOne,
}

/// The three-argument `all`, `exists`, `existsOne`. As in CEL, `all` is
/// false and `exists` true as soon as one element decides it, even if
/// another element's predicate fails; otherwise the failure is the result.
fn quantifier(ftx: &FunctionContext, q: Quantifier) -> Result<Value> {
    let [first, second, predicate] = ftx.args else {
        return Err(ftx.error("expects (var1, var2, predicate)"));
    };
    let (a, b) = (variable(ftx, first)?, variable(ftx, second)?);
    let range = this(ftx)?;
    let mut error = None;
    let mut count = 0usize;
    for (x, y) in pairs(ftx, &range)? {
        match eval_with(ftx, &[(a, &x), (b, &y)], predicate).and_then(|v| as_bool(ftx, v)) {
            Ok(true) => match q {
                Quantifier::Exists => return Ok(Value::Bool(true)),
                Quantifier::ExistsOne => count += 1,
                Quantifier::All => {}
            },
            Ok(false) => {
                if let Quantifier::All = q {
                    return Ok(Value::Bool(false));
                }
            }
            Err(e) => match q {
                Quantifier::ExistsOne => return Err(e),
                _ => error = error.or(Some(e)),
            },
        }
    }
    if let Some(e) = error {
        return Err(e);
    }
    Ok(Value::Bool(match q {
        Quantifier::All => true,
        Quantifier::Exists => false,
        Quantifier::ExistsOne => count == 1,
    }))
}

/// Splits `(a, b, [filter,] transform)`.
fn transform_args<'e>(
    ftx: &'e FunctionContext,
) -> Result<(&'e str, &'e str, Option<&'e Expression>, &'e Expression)> {
    match ftx.args {
        [a, b, t] => Ok((variable(ftx, a)?, variable(ftx, b)?, None, t)),
        [a, b, f, t] => Ok((variable(ftx, a)?, variable(ftx, b)?, Some(f), t)),
        _ => Err(ftx.error("expects (var1, var2, [filter,] transform)")),
    }
}

/// Each (var1, var2) that passes the filter, with its transform.
fn transformed(ftx: &FunctionContext) -> Result<Vec<(Value, Value)>> {
    let (a, b, filter, transform) = transform_args(ftx)?;
    let range = this(ftx)?;
    let mut out = Vec::new();
    for (x, y) in pairs(ftx, &range)? {
        let vars = [(a, &x), (b, &y)];
        if let Some(f) = filter
            && !as_bool(ftx, eval_with(ftx, &vars, f)?)?
        {
            continue;
        }
        let t = eval_with(ftx, &vars, transform)?;
        out.push((x, t));
    }
    Ok(out)
}

fn transform_list(ftx: &FunctionContext) -> Result<Value> {
    let values = transformed(ftx)?.into_iter().map(|(_, t)| t).collect();
    Ok(Value::List(Arc::new(values)))
}

fn key(ftx: &FunctionContext, value: Value) -> Result<Key> {
    value
        .try_into()
        .map_err(|v: Value| ftx.error(format!("{} cannot be a map key", v.type_of())))
}

fn transform_map(ftx: &FunctionContext) -> Result<Value> {
    let mut map = HashMap::new();
    for (k, t) in transformed(ftx)? {
        map.insert(key(ftx, k)?, t);
    }
    Ok(Value::Map(Map::from(map)))
}

/// Like `transformMap`, but the transform yields `{key: value}` maps that are
/// merged; a key produced twice is an error.
fn transform_map_entry(ftx: &FunctionContext) -> Result<Value> {
    let mut map = HashMap::new();
    for (_, t) in transformed(ftx)? {
        let Value::Map(entry) = t else {
            return Err(ftx.error("the transform must yield a map"));
        };
        for (k, v) in entry.map.iter() {
            if map.insert(k.clone(), v.clone()).is_some() {
                return Err(ftx.error(format!("insert failed: key {k:?} already exists")));
            }
        }
    }
    Ok(Value::Map(Map::from(map)))
}

/// `list.sortBy(e, key)`: stable sort by the key each element yields; keys
/// must be of one orderable type.
fn sort_by(ftx: &FunctionContext) -> Result<Value> {
    let [var, key_expr] = ftx.args else {
        return Err(ftx.error("expects (var, key)"));
    };
    let var = variable(ftx, var)?;
    let Value::List(items) = this(ftx)? else {
        return Err(ftx.error("sortBy applies to a list"));
    };
    let mut keyed = Vec::with_capacity(items.len());
    for item in items.iter() {
        let k = eval_with(ftx, &[(var, item)], key_expr)?;
        if !matches!(
            k,
            Value::Int(_)
                | Value::UInt(_)
                | Value::Float(_)
                | Value::String(_)
                | Value::Bool(_)
                | Value::Bytes(_)
                | Value::Duration(_)
                | Value::Timestamp(_)
        ) {
            return Err(ftx.error(format!("sortBy: {} keys are not orderable", k.type_of())));
        }
        keyed.push((k, item.clone()));
    }
    let mut failed = false;
    keyed.sort_by(|a, b| {
        if std::mem::discriminant(&a.0) != std::mem::discriminant(&b.0) {
            failed = true;
            return Ordering::Equal;
        }
        a.0.partial_cmp(&b.0).unwrap_or(Ordering::Equal)
    });
    if failed {
        return Err(ftx.error("sortBy: keys of different types"));
    }
    Ok(Value::List(Arc::new(
        keyed.into_iter().map(|(_, v)| v).collect(),
    )))
}

/// `includes(x)` of Kubernetes lists v1: membership for a list, equality
/// for a scalar.
fn includes(ftx: &FunctionContext) -> Result<Value> {
    let target = this(ftx)?;
    let [needle] = ftx.args else {
        return Err(ftx.error("expects one argument"));
    };
    let needle = ftx.ptx.resolve(needle)?;
    Ok(Value::Bool(match &target {
        Value::List(items) => items.contains(&needle),
        other => *other == needle,
    }))
}
