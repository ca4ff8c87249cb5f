//! Function calls and macros: declared in the environment of the release,
//! in the form they are called in (global or method), on a receiver and
//! with arguments they have an overload for, within the cost limit.

use kube_cel::cel::common::ast::{CallExpr, Expr, LiteralValue, operators};

use super::Checker;
use super::library::{
    arguments_ok, arity, cost, form_ok, format_clauses, receiver_ok, result_type,
};
use super::literals::literal_argument;
use super::types::{Ty, type_of};
use crate::cel::release::function_since;

impl Checker {
    pub(super) fn call(&mut self, call: &CallExpr) -> Result<Option<Ty>, String> {
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
                let holds_type = matches!(self.ty(&rest[0])?, Some(Ty::Type(_)));
                return self.with_typed(&[(names[0].as_str(), holds_type)], |s| s.ty(&rest[1]));
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
        let no_overload = || {
            let listed: Vec<&str> = args.iter().map(|a| a.map_or("dyn", Ty::name)).collect();
            format!(
                "found no matching overload for '{name}' applied to '({})'",
                listed.join(", ")
            )
        };
        if arity(name).is_some_and(|counts| !counts.contains(&args.len())) {
            return Err(no_overload());
        }
        // A type value goes into `type`, `dyn` and an optional, and into no
        // other global function (`string(int)` has no overload).
        let takes_types = matches!(
            name,
            "type" | "dyn" | "optional.of" | "optional.ofNonZeroValue"
        );
        if call.target.is_none()
            && !takes_types
            && args.iter().any(|a| matches!(a, Some(Ty::Type(_))))
        {
            return Err(no_overload());
        }
        if name == "type" {
            return Ok(Some(type_of(args.first().copied().flatten())));
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
    pub(super) fn regex_literal(&self, name: &str, call: &CallExpr) -> Result<(), String> {
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
}
