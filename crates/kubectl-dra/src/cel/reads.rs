//! What of `device` a selector reads, so that only that is built, and so
//! that a selector's outcome can be reused for devices that do not differ in
//! it.
//!
//! Over a 1,000-node fleet a request's selectors are evaluated on ~100,000
//! devices. A DeviceClass's `device.driver == "…"` has one outcome per
//! driver, and a request's `device.attributes["neuron.aws.com"].resourceType
//! == "neuron_device"` one per distinct resourceType: evaluated once each
//! instead of once per device, `explain` spends its time on the answer, not
//! on rebuilding the same CEL maps.

use std::sync::Arc;

use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};

use super::release::Release;
use super::split_attribute_name;
use crate::slices::{Attribute, SliceDevice};

/// Outcomes kept per selector, at most: a selector that reads something
/// unique to each device (a PCI address) gains nothing from more.
pub(super) const MEMO_LIMIT: usize = 4096;

/// What a selector's outcome depends on, when it reads only named
/// attributes and the driver: devices equal in these get the same outcome.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct MemoKey {
    pub release: Release,
    pub driver: Arc<str>,
    /// Per attribute read: the entries of the device that become it in the
    /// `device` value, in order (the last usable one is what CEL sees).
    pub attributes: Vec<Vec<Option<Attribute>>>,
}

/// The entries of `device` that the `device` value shows as
/// `attributes[domain][name]`.
pub(super) fn entries(
    driver: &str,
    device: &SliceDevice,
    domain: &str,
    name: &str,
) -> Vec<Option<Attribute>> {
    device
        .attributes
        .iter()
        .filter(|(k, _)| split_attribute_name(driver, k) == (domain, name))
        .map(|(_, v)| v.clone())
        .collect()
}

/// Which fields of `device` an expression can reach. Building the variable
/// is most of what evaluating a class selector such as
/// `device.driver == "neuron.aws.com"` costs (the capacities go through the
/// quantity library), and over 100,000 devices that is seconds: only what
/// the expression can read is built. Any use of `device` other than
/// `device.<field>` counts as reading everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reads {
    pub driver: bool,
    pub attributes: bool,
    pub capacity: bool,
    pub allow_multiple_allocations: bool,
}

impl Reads {
    pub const ALL: Reads = Reads {
        driver: true,
        attributes: true,
        capacity: true,
        allow_multiple_allocations: true,
    };
    pub const NONE: Reads = Reads {
        driver: false,
        attributes: false,
        capacity: false,
        allow_multiple_allocations: false,
    };

    /// Adds what `expr` reads.
    pub(super) fn add(&mut self, expr: &IdedExpr) {
        match &expr.expr {
            Expr::Select(s) if matches!(&s.operand.expr, Expr::Ident(n) if n == "device") => {
                match s.field.as_str() {
                    "driver" => self.driver = true,
                    "attributes" => self.attributes = true,
                    "capacity" => self.capacity = true,
                    "allowMultipleAllocations" => self.allow_multiple_allocations = true,
                    _ => *self = Reads::ALL,
                }
            }
            Expr::Ident(n) if n == "device" => *self = Reads::ALL,
            Expr::Select(s) => self.add(&s.operand),
            Expr::Call(call) => {
                if let Some(target) = call.target.as_deref() {
                    self.add(target);
                }
                call.args.iter().for_each(|a| self.add(a));
            }
            Expr::Comprehension(c) => {
                for e in [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ] {
                    self.add(e);
                }
            }
            Expr::List(list) => list.elements.iter().for_each(|e| self.add(e)),
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(e) = &entry.expr {
                        self.add(&e.key);
                        self.add(&e.value);
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        self.add(&f.value);
                    }
                }
            }
            Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => {}
        }
    }
}

/// `orValue(device.attributes[?"domain"], {})`, what `device.attributes["domain"]`
/// is rewritten to: its domain.
fn domain_map(expr: &IdedExpr) -> Option<&str> {
    let Expr::Call(or_value) = &expr.expr else {
        return None;
    };
    if or_value.func_name != "orValue" {
        return None;
    }
    let Expr::Call(index) = &or_value.target.as_deref()?.expr else {
        return None;
    };
    if index.func_name != operators::OPT_INDEX || index.target.is_some() {
        return None;
    }
    let [map, key] = index.args.as_slice() else {
        return None;
    };
    let is_attributes = matches!(&map.expr, Expr::Select(s)
        if !s.test && s.field == "attributes"
            && matches!(&s.operand.expr, Expr::Ident(n) if n == "device"));
    match &key.expr {
        Expr::Literal(LiteralValue::String(domain)) if is_attributes => Some(&domain[..]),
        _ => None,
    }
}

/// The attributes an expression reads, as (domain, name), when it reads
/// nothing of `device` but those (by `.name`, `["name"]`, `[?"name"]` or
/// `has(….name)` on `device.attributes["domain"]`) and `device.driver`.
/// Only the value of each such attribute is then observable: a missing one
/// reads the same (`no such key`, or `has` false) whether its domain has
/// other attributes or none.
pub(super) fn named_attributes(expr: &IdedExpr) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    walk(expr, &mut out).then_some(out)
}

fn walk(expr: &IdedExpr, out: &mut Vec<(String, String)>) -> bool {
    match &expr.expr {
        Expr::Select(s) => {
            if let Some(domain) = domain_map(&s.operand) {
                out.push((domain.to_string(), s.field.clone()));
                return true;
            }
            match &s.operand.expr {
                Expr::Ident(n) if n == "device" => s.field == "driver",
                _ => walk(&s.operand, out),
            }
        }
        Expr::Ident(n) => n != "device",
        Expr::Call(call) => {
            if (call.func_name == operators::INDEX || call.func_name == operators::OPT_INDEX)
                && call.target.is_none()
                && let [map, key] = call.args.as_slice()
                && let Some(domain) = domain_map(map)
                && let Expr::Literal(LiteralValue::String(name)) = &key.expr
            {
                out.push((domain.to_string(), name.to_string()));
                return true;
            }
            call.target.as_deref().is_none_or(|t| walk(t, out))
                && call.args.iter().all(|a| walk(a, out))
        }
        Expr::Comprehension(c) => [
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ]
        .into_iter()
        .all(|e| walk(e, out)),
        Expr::List(list) => list.elements.iter().all(|e| walk(e, out)),
        Expr::Map(map) => map.entries.iter().all(|entry| entry_ok(&entry.expr, out)),
        Expr::Struct(s) => s.entries.iter().all(|entry| entry_ok(&entry.expr, out)),
        Expr::Unspecified | Expr::Literal(_) => true,
    }
}

fn entry_ok(entry: &EntryExpr, out: &mut Vec<(String, String)>) -> bool {
    match entry {
        EntryExpr::MapEntry(e) => walk(&e.key, out) && walk(&e.value, out),
        EntryExpr::StructField(f) => walk(&f.value, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_cel::cel::parser::Parser;

    fn named(source: &str) -> Option<Vec<(String, String)>> {
        let mut expr = Parser::new()
            .enable_optional_syntax(true)
            .parse(source)
            .unwrap_or_else(|e| panic!("{e}"));
        super::super::rewrite(&mut expr);
        named_attributes(&expr)
    }

    #[test]
    fn what_decides_an_outcome() {
        let pair = |d: &str, n: &str| (d.to_string(), n.to_string());
        assert_eq!(named(r#"device.driver == "neuron.aws.com""#), Some(vec![]));
        assert_eq!(
            named(r#"device.attributes["neuron.aws.com"].resourceType == "neuron_device""#),
            Some(vec![pair("neuron.aws.com", "resourceType")])
        );
        assert_eq!(
            named(r#"has(device.attributes["a.b"].x) && device.attributes["a.b"]["y"] > 2"#),
            Some(vec![pair("a.b", "x"), pair("a.b", "y")])
        );
        assert_eq!(
            named(r#"device.attributes["a.b"].?x.orValue(1) == 1"#),
            Some(vec![pair("a.b", "x")])
        );
        // Anything else of `device` decides too: no reuse.
        for other in [
            r#"device.attributes["a.b"].size() > 0"#,
            r#"device.attributes["a.b"].exists(k, k == "x")"#,
            r#"device.capacity["a.b"].memory.isGreaterThan(quantity("1Gi"))"#,
            r#"device.allowMultipleAllocations"#,
            r#"device.attributes.size() > 0"#,
            r#"[device].size() == 1"#,
        ] {
            assert_eq!(named(other), None, "{other}");
        }
    }
}
