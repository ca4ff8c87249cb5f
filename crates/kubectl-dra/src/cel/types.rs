//! Type values: `type(x)` and the type names a selector can use as values,
//! as in `type(device.attributes["d"].generation) == int`.
//!
//! cel-go's standard environment declares the type names below as
//! identifiers whose value is the type itself, and `type(x)` yields the
//! type of `x` (`k8s.io/dynamic-resource-allocation/cel` gives the device
//! maps the type `map`). The `cel` crate has neither: a type is an opaque
//! value here, identifiers are variables of the base context, and the
//! qualified names (`net.IP`) are rewritten to one identifier before
//! evaluation, which is also how cel-go resolves them (a qualified name
//! before a field selection). Other names the Kubernetes libraries declare
//! (`kubernetes.Quantity`, `google.protobuf.Any`) are not usable as values:
//! the API server refuses them (checked against 1.37 and 1.38).
//!
//! Whether comparing type values fits the cost limit depends on the
//! release, see [`super::release::Release::sizes_type_values`].

use std::sync::Arc;

use kube_cel::cel::common::ast::{Expr, IdedExpr};
use kube_cel::cel::objects::{Opaque, OptionalValue};
use kube_cel::cel::{Context, ExecutionError, FunctionContext, Value};

/// The type names that are values in every release's DRA environment.
pub(super) const TYPE_NAMES: [&str; 15] = [
    "bool",
    "bytes",
    "double",
    "google.protobuf.Duration",
    "google.protobuf.Timestamp",
    "int",
    "list",
    "map",
    "null_type",
    "optional_type",
    "string",
    "type",
    "uint",
    "net.IP",
    "net.CIDR",
];

/// A CEL type as a value: what `type(x)` yields and a type name denotes.
/// Equal when they name the same type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TypeValue(Arc<str>);

impl Opaque for TypeValue {
    fn runtime_type_name(&self) -> &str {
        "type"
    }
}

fn type_value(name: &str) -> Value {
    Value::Opaque(Arc::new(TypeValue(Arc::from(name))))
}

pub(super) fn register(ctx: &mut Context<'static>) {
    for name in TYPE_NAMES {
        ctx.add_variable_from_value(name, type_value(name));
    }
    ctx.add_function("type", type_of);
}

/// `type(x)`: the CEL type of a value, by the name cel-go gives it.
fn type_of(ftx: &FunctionContext) -> Result<Value, ExecutionError> {
    let [x] = ftx.args else {
        return Err(ftx.error("expects one argument"));
    };
    let value = ftx.ptx.resolve(x)?;
    let name = match &value {
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Int(_) => "int",
        Value::UInt(_) => "uint",
        Value::Float(_) => "double",
        Value::String(_) => "string",
        Value::Bytes(_) => "bytes",
        Value::Bool(_) => "bool",
        Value::Null => "null_type",
        Value::Duration(_) => "google.protobuf.Duration",
        Value::Timestamp(_) => "google.protobuf.Timestamp",
        Value::Opaque(o) if o.downcast_ref::<TypeValue>().is_some() => "type",
        Value::Opaque(o) if o.downcast_ref::<OptionalValue>().is_some() => "optional_type",
        // net.IP, net.CIDR, kubernetes.Quantity, kubernetes.Semver,
        // kubernetes.URL: kube-cel names its types as Kubernetes does.
        Value::Opaque(o) => return Ok(type_value(o.runtime_type_name())),
        Value::Function(..) => return Err(ftx.error("a function has no CEL type")),
    };
    Ok(type_value(name))
}

/// The type name a field selection spells (`net.IP`,
/// `google.protobuf.Duration`), which the expression is rewritten to as one
/// identifier.
pub(super) fn qualified_type_name(expr: &IdedExpr) -> Option<&'static str> {
    let mut path = Vec::new();
    let mut at = expr;
    loop {
        match &at.expr {
            Expr::Select(s) if !s.test => {
                path.push(s.field.as_str());
                at = &s.operand;
            }
            Expr::Ident(root) => {
                path.push(root.as_str());
                break;
            }
            _ => return None,
        }
    }
    if path.len() < 2 {
        return None;
    }
    path.reverse();
    let dotted = path.join(".");
    TYPE_NAMES.into_iter().find(|n| *n == dotted)
}
