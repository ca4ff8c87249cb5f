//! Operators: which operand types have an overload, and the result type
//! where the operands fix it.

use kube_cel::cel::common::ast::operators;

use super::Checker;
use super::types::Ty;
use crate::cel::macros;

impl Checker {
    pub(super) fn operator(&self, name: &str, args: &[Option<Ty>]) -> Result<Option<Ty>, String> {
        let name = match name {
            macros::EQUALS => operators::EQUALS,
            macros::NOT_EQUALS => operators::NOT_EQUALS,
            other => other,
        };
        if name == operators::INDEX {
            return Ok(args.first().copied().flatten().and_then(Ty::element));
        }
        if name == operators::OPT_INDEX {
            // An optional, which the checker does not track.
            return Ok(None);
        }
        // An attribute (`any`) matches an overload like `dyn`: the other
        // operand decides the overload, and so the result type.
        let both = match args {
            [Some(a), Some(b)] if *a != Ty::Any && *b != Ty::Any => Some((*a, *b)),
            _ => None,
        };
        let arithmetic = matches!(
            name,
            operators::ADD
                | operators::SUBSTRACT
                | operators::MULTIPLY
                | operators::DIVIDE
                | operators::MODULO
        );
        if arithmetic && let [Some(a), Some(b)] = args {
            match (*a, *b) {
                (Ty::Any, Ty::Any) => return Ok(None),
                (Ty::Any, t) | (t, Ty::Any) => return Ok(Some(t)),
                _ => {}
            }
        }
        let mismatch = |a: Ty, b: Ty| {
            format!(
                "found no matching overload for '{name}' applied to '({}, {})'",
                a.name(),
                b.name()
            )
        };
        match name {
            operators::EQUALS | operators::NOT_EQUALS => {
                if let Some((a, b)) = both
                    && a.same(b) == Some(false)
                    && !(a.numeric() && b.numeric())
                    && a != Ty::Null
                    && b != Ty::Null
                {
                    return Err(mismatch(a, b));
                }
                Ok(Some(Ty::Bool))
            }
            operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS => {
                if let Some((a, b)) = both
                    && a.same(b) == Some(false)
                    && !(a.numeric() && b.numeric())
                {
                    return Err(mismatch(a, b));
                }
                Ok(Some(Ty::Bool))
            }
            operators::LOGICAL_AND | operators::LOGICAL_OR | operators::LOGICAL_NOT => {
                if let Some(t) = args
                    .iter()
                    .flatten()
                    .find(|t| **t != Ty::Bool && **t != Ty::Any)
                {
                    return Err(format!(
                        "found no matching overload for '{name}' applied to '{}'",
                        t.name()
                    ));
                }
                Ok(Some(Ty::Bool))
            }
            operators::IN | operators::NOT_STRICTLY_FALSE => Ok(Some(Ty::Bool)),
            operators::ADD
            | operators::SUBSTRACT
            | operators::MULTIPLY
            | operators::DIVIDE
            | operators::MODULO => {
                if let Some((a, b)) = both {
                    if a.same(b) == Some(false) {
                        return Err(mismatch(a, b));
                    }
                    if !(a.numeric()
                        || (name == operators::ADD
                            && matches!(a, Ty::String | Ty::Bytes | Ty::List)))
                    {
                        return Err(mismatch(a, b));
                    }
                    return Ok(Some(a));
                }
                Ok(None)
            }
            operators::NEGATE => Ok(args.first().copied().flatten().filter(|t| *t != Ty::Any)),
            operators::CONDITIONAL => Ok(match args {
                [_, Some(a), Some(b)] if a == b => Some(*a),
                _ => None,
            }),
            _ => Ok(None),
        }
    }
}
