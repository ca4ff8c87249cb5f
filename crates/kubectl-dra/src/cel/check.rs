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
    Duration,
    Timestamp,
    /// An attribute value: the DRA environment declares attributes as
    /// `map(string, map(string, google.protobuf.Any))`, which the checker
    /// treats as dynamic for overloads but as its own type in list literals
    /// and format clauses.
    Any,
    /// `device.attributes`: `map(string, map(string, any))`.
    Attributes,
    /// `device.attributes[domain]`: `map(string, any)`.
    AttributeDomain,
    /// `device.capacity`: `map(string, map(string, kubernetes.Quantity))`.
    Capacity,
    /// `device.capacity[domain]`.
    CapacityDomain,
    /// A list whose elements are strings (`split`, `findAll`, a literal of
    /// strings): what the cost estimate of the list functions depends on.
    StringList,
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
            Ty::Duration => "google.protobuf.Duration",
            Ty::Timestamp => "google.protobuf.Timestamp",
            Ty::Any => "any",
            Ty::Attributes | Ty::Capacity => "map(string, map(string, dyn))",
            Ty::AttributeDomain | Ty::CapacityDomain => "map(string, dyn)",
            Ty::StringList => "list(string)",
        }
    }

    fn numeric(self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }

    fn is_map(self) -> bool {
        matches!(
            self,
            Ty::Map | Ty::Attributes | Ty::AttributeDomain | Ty::Capacity | Ty::CapacityDomain
        )
    }

    fn is_list(self) -> bool {
        matches!(self, Ty::List | Ty::StringList)
    }

    /// Whether two types known to the checker are the same CEL type, `None`
    /// where we track too little to tell (a list of unknown elements, a map
    /// of unknown entries).
    fn same(self, other: Ty) -> Option<bool> {
        if self == other {
            return Some(true);
        }
        if (self.is_list() && other.is_list()) || (self.is_map() && other.is_map()) {
            return None;
        }
        Some(false)
    }

    /// The type of the element a `[...]` or `.field` on this type reads.
    fn element(self) -> Option<Ty> {
        match self {
            Ty::Attributes => Some(Ty::AttributeDomain),
            Ty::Capacity => Some(Ty::CapacityDomain),
            Ty::AttributeDomain => Some(Ty::Any),
            Ty::CapacityDomain => Some(Ty::Quantity),
            Ty::StringList => Some(Ty::String),
            _ => None,
        }
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
            ("sortBy" | "optMap" | "optFlatMap", 2, true) => 1,
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
                "optMap" | "optFlatMap" => None,
                _ => Some(Ty::Map),
            });
        }
        let target = match &call.target {
            Some(t) => Some(self.ty(t)?),
            None => None,
        };
        let mut args = Vec::with_capacity(call.args.len());
        let mut format_args = None;
        for a in &call.args {
            // The strings extension exempts the argument list of `format`
            // from the homogeneous-literal rule: its clauses are checked
            // one by one instead.
            if name == "format"
                && let Expr::List(list) = &a.expr
            {
                let mut types = Vec::with_capacity(list.elements.len());
                for e in &list.elements {
                    types.push(self.ty(e)?);
                }
                format_args = Some(types);
                args.push(Some(Ty::List));
                continue;
            }
            args.push(self.ty(a)?);
        }
        if name.starts_with(['_', '!', '@', '-']) {
            return self.operator(name, &args);
        }
        if function_since(name).is_none_or(|since| since > self.env)
            || !form_ok(name, call.target.is_some())
        {
            return Err(self.undeclared(name));
        }
        self.regex_literal(name, call)?;
        literal_argument(name, call)?;
        let recv = target.flatten();
        if let Some(r) = recv
            && !receiver_ok(name, r)
        {
            return Err(format!(
                "found no matching overload for '{name}' applied to '{}'",
                r.name()
            ));
        }
        arguments_ok(name, recv, &args)?;
        if name == "format"
            && let (Some(Expr::Literal(LiteralValue::String(pattern))), Some(types)) = (
                call.target.as_deref().map(|t| &t.expr),
                format_args.as_deref(),
            )
        {
            format_clauses(pattern, types)?;
        }
        cost(name, call, recv)?;
        // `orValue` of `device.attributes[?domain]` (how the domain index is
        // rewritten, see the module docs) keeps the domain's type.
        if name == "orValue"
            && let Some(Expr::Call(inner)) = call.target.as_deref().map(|t| &t.expr)
            && inner.func_name == operators::OPT_INDEX
            && let Some(map) = inner.args.first()
            && let Some(t) = self.ty(map)?
            && matches!(t, Ty::Attributes | Ty::Capacity)
        {
            return Ok(t.element());
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
        let name = match name {
            super::macros::EQUALS => operators::EQUALS,
            super::macros::NOT_EQUALS => operators::NOT_EQUALS,
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

/// `cel.ValidateHomogeneousAggregateLiterals`, which the Kubernetes base
/// environment enables: every element of a literal has the type of the
/// first (an attribute, typed `any`, does not mix with an `int`).
fn homogeneous(types: &[Option<Ty>], what: &str) -> Result<(), String> {
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
    let r = match r {
        Any => return true,
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
        "split" | "findAll" => StringList,
        "slice" | "flatten" | "lists.range" | "distinct" | "sort" => List,
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

/// The literal arguments the API server parses when it compiles: a
/// `duration("...")` and a `timestamp("...")` must be valid
/// (`cel.ValidateDurationLiterals`, `cel.ValidateTimestampLiterals`).
fn literal_argument(name: &str, call: &kube_cel::cel::common::ast::CallExpr) -> Result<(), String> {
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
        "timestamp" if !rfc3339(text) => Err(format!("invalid timestamp argument {:?}", &**text)),
        _ => Ok(()),
    }
}

/// Go's `time.ParseDuration` syntax: an optional sign, then `0` or one or
/// more decimal numbers each with a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`,
/// `h`).
fn go_duration(text: &str) -> bool {
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

/// RFC 3339 as Go's `time.Parse(time.RFC3339, ...)` reads it:
/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`.
fn rfc3339(text: &str) -> bool {
    let b = text.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        b.get(r.clone())
            .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
            .then(|| text[r].parse::<u32>().ok())
            .flatten()
    };
    let (Some(_), Some(month), Some(day), Some(hour), Some(min), Some(sec)) = (
        digits(0..4),
        digits(5..7),
        digits(8..10),
        digits(11..13),
        digits(14..16),
        digits(17..19),
    ) else {
        return false;
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return false;
    }
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 59 {
        return false;
    }
    let mut rest = &text[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(frac.len());
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    match rest.as_bytes() {
        [b'Z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit()),
        _ => false,
    }
}

/// Argument types of the string functions, where the checker knows them:
/// `"abc".contains(1)` has no overload, nor has `lowerAscii(1)`.
fn arguments_ok(name: &str, recv: Option<Ty>, args: &[Option<Ty>]) -> Result<(), String> {
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
fn format_clauses(pattern: &str, args: &[Option<Ty>]) -> Result<(), String> {
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
fn cost(
    name: &str,
    call: &kube_cel::cel::common::ast::CallExpr,
    recv: Option<Ty>,
) -> Result<(), String> {
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
