//! `<`, `<=`, `>` and `>=` as the scheduler of the release orders.
//!
//! Ordering a NaN fails in cel-go up to v0.29 (Kubernetes 1.37: "NaN values
//! cannot be ordered"), which is also what the `cel` crate does; from v0.33
//! (1.38) each of the four is false when an operand is a NaN
//! (`common/stdlib/standard.go`). The operators are rewritten to these
//! functions (see `rewrite` in the parent module), which the environment of
//! each release registers with its rule; everything but a NaN is the
//! crate's own ordering.

use std::cmp::Ordering;

use kube_cel::cel::common::ast::IdedExpr;
use kube_cel::cel::common::ast::operators;
use kube_cel::cel::parser::Parser;
use kube_cel::cel::{Context, ExecutionError, FunctionContext, Value};

/// What the ordering operators are rewritten to.
pub(super) const LESS: &str = "@k8s_less";
pub(super) const LESS_EQUALS: &str = "@k8s_less_equals";
pub(super) const GREATER: &str = "@k8s_greater";
pub(super) const GREATER_EQUALS: &str = "@k8s_greater_equals";

/// Our name of an ordering operator, `None` for any other function.
pub(super) fn ours(operator: &str) -> Option<&'static str> {
    Some(match operator {
        operators::LESS => LESS,
        operators::LESS_EQUALS => LESS_EQUALS,
        operators::GREATER => GREATER,
        operators::GREATER_EQUALS => GREATER_EQUALS,
        _ => return None,
    })
}

/// The operator one of ours stands for (for the static check).
pub(super) fn operator(ours: &str) -> Option<&'static str> {
    Some(match ours {
        LESS => operators::LESS,
        LESS_EQUALS => operators::LESS_EQUALS,
        GREATER => operators::GREATER,
        GREATER_EQUALS => operators::GREATER_EQUALS,
        _ => return None,
    })
}

/// Registers the four with the rule of a scheduler that orders a NaN as
/// false (`nan_is_false`) or fails on it.
pub(super) fn register(ctx: &mut Context<'static>, nan_is_false: bool) {
    for name in [LESS, LESS_EQUALS, GREATER, GREATER_EQUALS] {
        ctx.add_function(name, move |ftx: &FunctionContext| {
            compare(ftx, name, nan_is_false)
        });
    }
}

thread_local! {
    /// The crate's own operators, applied to `a` and `b`.
    static CRATE_ORDERING: Option<[IdedExpr; 4]> = {
        let parse = |s: &str| Parser::new().parse(s).ok();
        match (parse("a < b"), parse("a <= b"), parse("a > b"), parse("a >= b")) {
            (Some(l), Some(le), Some(g), Some(ge)) => Some([l, le, g, ge]),
            _ => None,
        }
    };
}

fn compare(ftx: &FunctionContext, name: &str, nan_is_false: bool) -> Result<Value, ExecutionError> {
    let [a, b] = ftx.args else {
        return Err(ftx.error("expects two operands"));
    };
    let (a, b) = (ftx.ptx.resolve(a)?, ftx.ptx.resolve(b)?);
    let numeric = |v: &Value| matches!(v, Value::Int(_) | Value::UInt(_) | Value::Float(_));
    let nan = |v: &Value| matches!(v, Value::Float(f) if f.is_nan());
    if nan_is_false && numeric(&a) && numeric(&b) && (nan(&a) || nan(&b)) {
        return Ok(Value::Bool(false));
    }
    // The common cases directly, as the crate orders them; the rest (and
    // the errors) through the crate's operators.
    let same_kind = matches!(
        (&a, &b),
        (
            Value::Int(_) | Value::UInt(_) | Value::Float(_),
            Value::Int(_) | Value::UInt(_) | Value::Float(_)
        ) | (Value::String(_), Value::String(_))
            | (Value::Bool(_), Value::Bool(_))
            | (Value::Duration(_), Value::Duration(_))
            | (Value::Timestamp(_), Value::Timestamp(_))
    );
    if same_kind && let Some(order) = a.partial_cmp(&b) {
        let holds = match name {
            LESS => order == Ordering::Less,
            LESS_EQUALS => order != Ordering::Greater,
            GREATER => order == Ordering::Greater,
            _ => order != Ordering::Less,
        };
        return Ok(Value::Bool(holds));
    }
    let index = [LESS, LESS_EQUALS, GREATER, GREATER_EQUALS]
        .iter()
        .position(|n| *n == name)
        .unwrap_or(0);
    CRATE_ORDERING.with(|c| {
        let all = c
            .as_ref()
            .ok_or_else(|| ftx.error("cannot parse the ordering operators"))?;
        let mut scope = ftx.ptx.new_inner_scope();
        scope.add_variable_from_value("a", a);
        scope.add_variable_from_value("b", b);
        scope.resolve(&all[index])
    })
}
