//! What the API server refuses before a selector ever runs.
//!
//! The API server type-checks a new selector against its environment (see
//! [`super::release`]) and refuses it as invalid: too long, a function or
//! variable the environment lacks, a field `device` does not have, a regex
//! literal that does not compile, a list literal of mixed types, or an
//! expression whose type is known and is not `bool`. The `cel` crate has no
//! type checker, so this is a partial one: it infers a type only where the
//! expression fixes it (literals, `device.driver`, functions whose result
//! type is fixed) and treats everything read from `device.attributes` and
//! `device.capacity` as dynamic, which the API server does as well. What it
//! cannot prove is left to evaluation.
//!
//! The parts: [`check`] and the walk over the expression are here, `types`
//! is the few types the checker tracks, `calls` resolves function calls and
//! macros against the environment with the signatures of `library`,
//! `operators` checks operator overloads, and `literals` holds the rules on
//! literals the API server applies when it compiles (homogeneous aggregates,
//! valid durations and timestamps).
//!
//! Type names (`int`, `net.IP`) are values of their type (`type(int)`);
//! a comprehension or `cel.bind` variable that holds a type is refused, as
//! cel-go's planner fails on it ("reference to undefined type").

mod calls;
mod library;
mod literals;
mod operators;
mod types;

use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};

use self::literals::homogeneous;
use self::types::{Ty, type_name};
use super::release::Release;

/// `CELSelectorExpressionMaxLength` of `resource.k8s.io/v1`.
pub const MAX_LENGTH: usize = 10 * 1024;

struct Checker {
    release: Release,
    /// The environment version new selectors are checked against.
    env: u32,
    /// The variables in scope, innermost last, and whether each holds a
    /// type value.
    scopes: Vec<(String, bool)>,
}

/// `Err(reason)` when the API server of `release` refuses `source` (already
/// parsed into `expr`) as a new selector.
pub fn check(source: &str, expr: &IdedExpr, release: Release) -> Result<(), String> {
    if source.len() > MAX_LENGTH {
        return Err(format!(
            "{} bytes, longer than the {MAX_LENGTH} the API server accepts",
            source.len()
        ));
    }
    if let Some(at) = one_variable_exists_one(source) {
        return Err(format!(
            "undeclared reference to 'existsOne' at byte {at}: with one variable the macro is `exists_one(x, p)`; `existsOne` takes two, `existsOne(i, v, p)`"
        ));
    }
    let mut checker = Checker {
        release,
        env: release.new_expressions(),
        scopes: Vec::new(),
    };
    match checker.ty(expr)? {
        Some(t) if t != Ty::Bool && t != Ty::Any => Err(format!(
            "must evaluate to bool or the unknown type, not {}",
            t.name()
        )),
        _ => Ok(()),
    }
}

/// Where `source` calls `existsOne` with two arguments (one variable), a
/// form the API server does not declare, though the `cel` crate's parser
/// expands it like `exists_one`: the expansion keeps no trace of the name,
/// so the source is scanned (outside string literals) instead.
fn one_variable_exists_one(source: &str) -> Option<usize> {
    let bytes = source.as_bytes();
    let code = outside_strings(source);
    for (k, &i) in code.iter().enumerate() {
        if !source[i..].starts_with(".existsOne(") {
            continue;
        }
        let (mut depth, mut commas) = (0usize, 0);
        // From the `(`: the call's brackets and its top-level commas.
        for &j in &code[k + ".existsOne".len()..] {
            match bytes[j] {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                }
                b',' if depth == 1 => commas += 1,
                _ => {}
            }
        }
        if commas == 1 {
            return Some(i + 1);
        }
    }
    None
}

/// Byte positions of `source` outside its string literals (quotes and
/// escaped characters included in the literal).
fn outside_strings(source: &str) -> Vec<usize> {
    let bytes = source.as_bytes();
    let mut code = Vec::with_capacity(bytes.len());
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(_) if b == b'\\' => {
                i += 2;
                continue;
            }
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'"' || b == b'\'' => quote = Some(b),
            None => code.push(i),
        }
        i += 1;
    }
    code
}

impl Checker {
    fn bound(&self, name: &str) -> bool {
        name == "device" || self.scopes.iter().any(|(s, _)| s == name)
    }

    fn with<T>(&mut self, names: &[&str], f: impl FnOnce(&mut Self) -> T) -> T {
        let typed: Vec<(&str, bool)> = names.iter().map(|n| (*n, false)).collect();
        self.with_typed(&typed, f)
    }

    /// [`Checker::with`], each name marked when it holds a type value.
    fn with_typed<T>(&mut self, names: &[(&str, bool)], f: impl FnOnce(&mut Self) -> T) -> T {
        let depth = self.scopes.len();
        self.scopes
            .extend(names.iter().map(|(n, t)| (n.to_string(), *t)));
        let out = f(self);
        self.scopes.truncate(depth);
        out
    }

    /// Whether `name` is a variable in scope that holds a type value.
    fn holds_type(&self, name: &str) -> bool {
        self.scopes
            .iter()
            .rev()
            .find(|(s, _)| s == name)
            .is_some_and(|(_, t)| *t)
    }

    fn undeclared(&self, what: &str) -> String {
        format!(
            "undeclared reference to '{what}' (the API server of Kubernetes {} checks new selectors against the 1.{} environment)",
            self.release, self.env
        )
    }

    /// The static type of `expr`, `None` when only evaluation can tell.
    fn ty(&mut self, expr: &IdedExpr) -> Result<Option<Ty>, String> {
        match &expr.expr {
            Expr::Literal(lit) => Ok(Some(match lit {
                LiteralValue::Boolean(_) => Ty::Bool,
                LiteralValue::Int(_) => Ty::Int,
                LiteralValue::UInt(_) => Ty::Uint,
                LiteralValue::Double(_) => Ty::Double,
                LiteralValue::String(_) => Ty::String,
                LiteralValue::Bytes(_) => Ty::Bytes,
                LiteralValue::Null => Ty::Null,
            })),
            Expr::Ident(name) => {
                if self.holds_type(name) {
                    Err(format!("reference to undefined type: {name}"))
                } else if self.bound(name) {
                    Ok(None)
                } else if let Some(t) = type_name(name) {
                    Ok(Some(t))
                } else {
                    Err(self.undeclared(name))
                }
            }
            Expr::Select(select) => {
                if let Expr::Ident(name) = &select.operand.expr
                    && name == "device"
                    && !self.scopes.iter().any(|(s, _)| s == "device")
                {
                    return match select.field.as_str() {
                        "driver" => Ok(Some(Ty::String)),
                        "attributes" => Ok(Some(Ty::Attributes)),
                        "capacity" => Ok(Some(Ty::Capacity)),
                        "allowMultipleAllocations"
                            if self.release.has_multi_allocations(self.env) =>
                        {
                            Ok(Some(Ty::Bool))
                        }
                        other => Err(format!(
                            "undefined field '{other}' of device (Kubernetes {})",
                            self.release
                        )),
                    }
                    .map(|t| if select.test { Some(Ty::Bool) } else { t });
                }
                let operand = self.ty(&select.operand)?;
                if let Some(t) = operand
                    && !t.is_map()
                    && t != Ty::Any
                {
                    return Err(format!(
                        "type '{}' does not support field selection",
                        t.name()
                    ));
                }
                Ok(if select.test {
                    Some(Ty::Bool)
                } else {
                    operand.and_then(Ty::element)
                })
            }
            Expr::List(list) => {
                let mut types = Vec::with_capacity(list.elements.len());
                for e in &list.elements {
                    types.push(self.ty(e)?);
                }
                homogeneous(&types, "list literal")?;
                Ok(Some(match types.first() {
                    Some(Some(Ty::String)) => Ty::StringList,
                    _ => Ty::List,
                }))
            }
            Expr::Map(map) => {
                let mut keys = Vec::new();
                let mut values = Vec::new();
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(e) = &entry.expr {
                        keys.push(self.ty(&e.key)?);
                        values.push(self.ty(&e.value)?);
                    }
                }
                homogeneous(&keys, "map literal key")?;
                homogeneous(&values, "map literal value")?;
                Ok(Some(Ty::Map))
            }
            Expr::Struct(s) => Err(format!(
                "undeclared reference to message type '{}'",
                s.type_name
            )),
            Expr::Comprehension(c) => {
                self.ty(&c.iter_range)?;
                self.ty(&c.accu_init)?;
                // Over a literal list of types, the variable holds a type.
                let over_types = match &c.iter_range.expr {
                    Expr::List(list) => match list.elements.first() {
                        Some(first) => matches!(self.ty(first)?, Some(Ty::Type(_))),
                        None => false,
                    },
                    _ => false,
                };
                let mut names = vec![
                    (c.iter_var.as_str(), over_types && c.iter_var2.is_none()),
                    (c.accu_var.as_str(), false),
                ];
                if let Some(v2) = &c.iter_var2 {
                    names.push((v2, over_types));
                }
                self.with_typed(&names, |s| {
                    s.ty(&c.loop_cond)?;
                    s.ty(&c.loop_step)
                })?;
                let result = self.with(&[c.accu_var.as_str()], |s| s.ty(&c.result))?;
                // exists/all yield bool, map/filter a list
                Ok(result)
            }
            Expr::Call(call) => self.call(call),
            Expr::Unspecified => Ok(None),
        }
    }
}
