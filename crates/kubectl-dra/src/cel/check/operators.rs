//! Operators: which operand types have an overload, and the result type
//! where the operands fix it.
//!
//! Type values have `==`, `!=` and `in`, no other operator. Comparing two
//! of them, or one with an operand whose size the cost estimate does not
//! know, is too complex for an API server before 1.38 (see
//! [`crate::cel::release::Release::sizes_type_values`]); the checker takes
//! every operand it cannot type as of unknown size, and an attribute as of
//! known size (the DRA environment declares its maximum length).

use kube_cel::cel::common::ast::operators;

use super::Checker;
use super::types::Ty;
use crate::cel::{macros, ordering};

impl Checker {
    pub(super) fn operator(&self, name: &str, args: &[Option<Ty>]) -> Result<Option<Ty>, String> {
        let name = match name {
            macros::EQUALS => operators::EQUALS,
            macros::NOT_EQUALS => operators::NOT_EQUALS,
            other => ordering::operator(other).unwrap_or(other),
        };
        if let Some(result) = self.type_operands(name, args) {
            return result;
        }
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
                    if let Some(t) = time_arithmetic(name, a, b) {
                        return Ok(Some(t));
                    }
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
            // Both branches have one type (`_?_:_` is `(bool, A, A)`); an
            // attribute (dyn) or a null goes with any.
            operators::CONDITIONAL => match args {
                [_, Some(a), Some(b)] if a == b => Ok(Some(*a)),
                [_, Some(a), Some(b)]
                    if ![*a, *b].iter().any(|t| matches!(t, Ty::Any | Ty::Null))
                        && a.same(*b) == Some(false) =>
                {
                    Err(format!(
                        "found no matching overload for '{name}' applied to '(bool, {}, {})'",
                        a.name(),
                        b.name()
                    ))
                }
                _ => Ok(None),
            },
            _ => Ok(None),
        }
    }

    /// The outcome of an operator on a type value, `None` when no operand
    /// is one.
    fn type_operands(&self, name: &str, args: &[Option<Ty>]) -> Option<Result<Option<Ty>, String>> {
        let is_type = |a: &Option<Ty>| matches!(a, Some(Ty::Type(_)));
        if !args.iter().any(is_type) {
            return None;
        }
        let listed: Vec<&str> = args.iter().map(|a| a.map_or("dyn", Ty::name)).collect();
        let no_overload = || {
            Err(format!(
                "found no matching overload for '{name}' applied to '({})'",
                listed.join(", ")
            ))
        };
        Some(match name {
            operators::EQUALS | operators::NOT_EQUALS => {
                let size_unknown = |a: &Option<Ty>| a.is_none() || is_type(a);
                match args {
                    [a, b] if size_unknown(a) && size_unknown(b) => {
                        if self.release.sizes_type_values() {
                            Ok(Some(Ty::Bool))
                        } else {
                            Err(format!(
                                "too complex, exceeds cost limit ({name} on type values: the API server of Kubernetes {} estimates their size as unbounded; 1.38 does not)",
                                self.release
                            ))
                        }
                    }
                    // A type against an attribute (dyn) is fine, against any
                    // other known type there is no overload.
                    [Some(Ty::Any), _] | [_, Some(Ty::Any)] => Ok(Some(Ty::Bool)),
                    _ => no_overload(),
                }
            }
            // `x in [int]`: membership, whatever the elements.
            operators::IN if args.last().is_some_and(|a| !is_type(a)) => Ok(Some(Ty::Bool)),
            operators::CONDITIONAL if args.first().is_some_and(|c| !is_type(c)) => Ok(match args {
                [_, Some(a), Some(b)] if a == b => Some(*a),
                _ => None,
            }),
            operators::LOGICAL_AND | operators::LOGICAL_OR | operators::LOGICAL_NOT => {
                Err(format!(
                    "found no matching overload for '{name}' applied to '{}'",
                    listed.join(", ")
                ))
            }
            _ => no_overload(),
        })
    }
}

/// The result of `+` and `-` between timestamps and durations, which are
/// the operands of different types these operators have.
fn time_arithmetic(name: &str, a: Ty, b: Ty) -> Option<Ty> {
    use Ty::{Duration, Timestamp};
    match (name, a, b) {
        (operators::ADD, Timestamp, Duration)
        | (operators::ADD, Duration, Timestamp)
        | (operators::SUBSTRACT, Timestamp, Duration) => Some(Timestamp),
        (operators::ADD | operators::SUBSTRACT, Duration, Duration)
        | (operators::SUBSTRACT, Timestamp, Timestamp) => Some(Duration),
        _ => None,
    }
}
