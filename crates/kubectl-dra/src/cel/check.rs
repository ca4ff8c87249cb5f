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

use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};

use super::release::{Release, function_since};

/// `CELSelectorExpressionMaxLength` of `resource.k8s.io/v1`.
pub const MAX_LENGTH: usize = 10 * 1024;

/// A type fixed by the expression itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    List,
    Map,
    Quantity,
    Semver,
    Ip,
    Cidr,
    Url,
}

impl Ty {
    fn name(self) -> &'static str {
        match self {
            Ty::Bool => "bool",
            Ty::Int => "int",
            Ty::Uint => "uint",
            Ty::Double => "double",
            Ty::String => "string",
            Ty::Bytes => "bytes",
            Ty::Null => "null",
            Ty::List => "list",
            Ty::Map => "map",
            Ty::Quantity => "kubernetes.Quantity",
            Ty::Semver => "kubernetes.Semver",
            Ty::Ip => "net.IP",
            Ty::Cidr => "net.CIDR",
            Ty::Url => "kubernetes.URL",
        }
    }

    fn numeric(self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }
}

struct Checker {
    release: Release,
    /// The environment version new selectors are checked against.
    env: u32,
    scopes: Vec<String>,
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
    let mut checker = Checker {
        release,
        env: release.new_expressions(),
        scopes: Vec::new(),
    };
    match checker.ty(expr)? {
        Some(t) if t != Ty::Bool => Err(format!(
            "the expression is a {}, a selector must be a bool",
            t.name()
        )),
        _ => Ok(()),
    }
}

impl Checker {
    fn bound(&self, name: &str) -> bool {
        name == "device" || self.scopes.iter().any(|s| s == name)
    }

    fn with<T>(&mut self, names: &[&str], f: impl FnOnce(&mut Self) -> T) -> T {
        let depth = self.scopes.len();
        self.scopes.extend(names.iter().map(|n| n.to_string()));
        let out = f(self);
        self.scopes.truncate(depth);
        out
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
                if self.bound(name) {
                    Ok(None)
                } else {
                    Err(self.undeclared(name))
                }
            }
            Expr::Select(select) => {
                if let Expr::Ident(name) = &select.operand.expr
                    && name == "device"
                    && !self.scopes.iter().any(|s| s == "device")
                {
                    return match select.field.as_str() {
                        "driver" => Ok(Some(Ty::String)),
                        "attributes" | "capacity" => Ok(Some(Ty::Map)),
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
                    && t != Ty::Map
                {
                    return Err(format!(
                        "type '{}' does not support field selection",
                        t.name()
                    ));
                }
                Ok(if select.test { Some(Ty::Bool) } else { None })
            }
            Expr::List(list) => {
                let mut first = None;
                for e in &list.elements {
                    if let Some(t) = self.ty(e)? {
                        match first {
                            None => first = Some(t),
                            Some(f) if f != t => {
                                return Err(format!(
                                    "expected type '{}' but found '{}' in a list literal",
                                    f.name(),
                                    t.name()
                                ));
                            }
                            Some(_) => {}
                        }
                    }
                }
                Ok(Some(Ty::List))
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(e) = &entry.expr {
                        self.ty(&e.key)?;
                        self.ty(&e.value)?;
                    }
                }
                Ok(Some(Ty::Map))
            }
            Expr::Struct(s) => Err(format!(
                "undeclared reference to message type '{}'",
                s.type_name
            )),
            Expr::Comprehension(c) => {
                self.ty(&c.iter_range)?;
                self.ty(&c.accu_init)?;
                let mut names = vec![c.iter_var.as_str(), c.accu_var.as_str()];
                if let Some(v2) = &c.iter_var2 {
                    names.push(v2);
                }
                self.with(&names, |s| {
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

    fn call(&mut self, call: &kube_cel::cel::common::ast::CallExpr) -> Result<Option<Ty>, String> {
        // `cel.bind(...)`, `sets.contains(...)`: a qualified global function,
        // parsed as a method of an identifier that names no variable.
        if let Some(target) = &call.target
            && let Expr::Ident(namespace) = &target.expr
            && !self.bound(namespace)
        {
            let qualified = format!("{namespace}.{}", call.func_name);
            if function_since(&qualified).is_some() {
                let mut global = call.clone();
                global.func_name = qualified;
                global.target = None;
                return self.call(&global);
            }
        }
        let name = call.func_name.as_str();
        // Macros with variables: the first argument(s) are names, not expressions.
        let declares = match (name, call.args.len(), call.target.is_some()) {
            ("cel.bind", 3, false) => 1,
            ("all" | "exists" | "existsOne", 3, true) => 2,
            ("transformList" | "transformMap" | "transformMapEntry", 3 | 4, true) => 2,
            ("sortBy", 2, true) => 1,
            _ => 0,
        };
        if declares > 0 {
            if let Some(since) = function_since(name)
                && since > self.env
            {
                return Err(self.undeclared(name));
            }
            if name != "sortBy" && declares == 2 && self.env < 32 {
                return Err(self.undeclared(name));
            }
            let mut names = Vec::new();
            for a in &call.args[..declares] {
                match &a.expr {
                    Expr::Ident(n) => names.push(n.clone()),
                    _ => return Err(format!("{name}: argument must be a simple name")),
                }
            }
            if let Some(t) = &call.target {
                self.ty(t)?;
            }
            let rest = &call.args[declares..];
            if name == "cel.bind" {
                self.ty(&rest[0])?;
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                return self.with(&refs, |s| s.ty(&rest[1]));
            }
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            self.with(&refs, |s| {
                for a in rest {
                    s.ty(a)?;
                }
                Ok::<(), String>(())
            })?;
            return Ok(match name {
                "all" | "exists" | "existsOne" => Some(Ty::Bool),
                "transformList" | "sortBy" => Some(Ty::List),
                _ => Some(Ty::Map),
            });
        }
        let target = match &call.target {
            Some(t) => Some(self.ty(t)?),
            None => None,
        };
        let mut args = Vec::with_capacity(call.args.len());
        for a in &call.args {
            args.push(self.ty(a)?);
        }
        if name.starts_with('_') || name.starts_with('!') || name.starts_with('@') {
            return self.operator(name, &args);
        }
        if function_since(name).is_none_or(|since| since > self.env)
            || !form_ok(name, call.target.is_some())
        {
            return Err(self.undeclared(name));
        }
        self.regex_literal(name, call)?;
        let recv = target.flatten();
        if let Some(r) = recv
            && !receiver_ok(name, r)
        {
            return Err(format!(
                "found no matching overload for '{name}' applied to '{}'",
                r.name()
            ));
        }
        Ok(result_type(name, recv))
    }

    /// Regex literals must compile (`cel.ValidateRegexLiterals`).
    fn regex_literal(
        &self,
        name: &str,
        call: &kube_cel::cel::common::ast::CallExpr,
    ) -> Result<(), String> {
        if !matches!(name, "matches" | "find" | "findAll") {
            return Ok(());
        }
        let pattern = match (call.target.is_some(), call.args.as_slice()) {
            (true, [p, ..]) => p,
            (false, [_, p, ..]) => p,
            _ => return Ok(()),
        };
        if let Expr::Literal(LiteralValue::String(p)) = &pattern.expr
            && let Err(e) = regex::Regex::new(p)
        {
            return Err(format!("invalid regular expression {:?}: {e}", &**p));
        }
        Ok(())
    }

    fn operator(&self, name: &str, args: &[Option<Ty>]) -> Result<Option<Ty>, String> {
        let both = match args {
            [Some(a), Some(b)] => Some((*a, *b)),
            _ => None,
        };
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
                    && a != b
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
                    && a != b
                    && !(a.numeric() && b.numeric())
                {
                    return Err(mismatch(a, b));
                }
                Ok(Some(Ty::Bool))
            }
            operators::LOGICAL_AND | operators::LOGICAL_OR | operators::LOGICAL_NOT => {
                if let Some(t) = args.iter().flatten().find(|t| **t != Ty::Bool) {
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
                    if a != b {
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
            operators::NEGATE => Ok(args.first().copied().flatten()),
            operators::CONDITIONAL => Ok(match args {
                [_, Some(a), Some(b)] if a == b => Some(*a),
                _ => None,
            }),
            _ => Ok(None),
        }
    }
}

/// Whether `name` exists in the form it is called in: global (`size(x)`),
/// method (`x.size()`), or both.
fn form_ok(name: &str, method: bool) -> bool {
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
fn receiver_ok(name: &str, r: Ty) -> bool {
    use Ty::*;
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
        "containsIP" | "containsCIDR" | "masked" | "prefixLength" => r == Cidr,
        "ip" => r == Cidr,
        "getScheme" | "getHost" | "getHostname" | "getPort" | "getEscapedPath" | "getQuery" => {
            r == Url
        }
        "hasValue" | "value" | "or" | "orValue" | "optMap" | "optFlatMap" => false,
        _ => true,
    }
}

/// The result type of a call whose result type is fixed.
fn result_type(name: &str, recv: Option<Ty>) -> Option<Ty> {
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
        | "bool" => Bool,
        "charAt" | "lowerAscii" | "upperAscii" | "replace" | "substring" | "trim" | "join"
        | "format" | "strings.quote" | "find" | "getScheme" | "getHost" | "getHostname"
        | "getPort" | "getEscapedPath" | "string" => String,
        "split" | "findAll" | "slice" | "flatten" | "lists.range" | "distinct" | "sort" => List,
        "reverse" if recv == Some(List) => List,
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
