//! Device selectors evaluated as kube-scheduler evaluates them.
//!
//! The Kubernetes DRA CEL environment (`k8s.io/dynamic-resource-allocation/cel`)
//! gives a selector one variable, `device`, with `driver`, `attributes`,
//! `capacity` and `allowMultipleAllocations`, plus the Kubernetes libraries
//! each release enables ([`release`]). The `cel` crate supplies the language
//! and `kube-cel` the Kubernetes libraries; `macros` adds what neither has
//! yet, `types` the type values (`type(x) == int`), `timestamps` reads
//! timestamps as Go does, `ordering` orders a NaN as each release does,
//! `check` refuses what the API server refuses, and this module papers over
//! these differences of the `cel` crate:
//!
//! - `device.attributes["some.domain"]` of a domain the device has nothing in
//!   is an empty map in Kubernetes, a missing key in a plain map: the index
//!   is rewritten to `[?domain].orValue({})`.
//! - `x.?field` on a map without `field` must be `optional.none()`; the crate
//!   raises "no such key" instead, so `_?._` is rewritten to the optional
//!   index `_[?_]`, which the crate implements as the spec says.
//! - `==` and `!=` compare by type first in the crate; they are rewritten to
//!   functions that compare as cel-go does (numbers across int, uint and
//!   double; quantities and versions by value), see `macros`. `<`, `<=`,
//!   `>` and `>=` are rewritten to functions that order a NaN as the
//!   release's scheduler does, see `ordering`.
//! - a qualified type name (`net.IP`, `google.protobuf.Duration`) is a
//!   field selection to the crate; it is rewritten to one identifier, the
//!   variable that holds the type, see `types`.
//!
//! Outcomes keep apart an invalid selector (the API server refuses it), what
//! the scheduler would also fail on at run time (a missing attribute read
//! without a guard, a bad `semver()` argument), and what only we cannot do
//! (a construct the crates lack): the last is reported as such, never guessed.

mod check;
mod guard;
mod macros;
mod ordering;
mod reads;
pub mod release;
mod timestamps;
mod types;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::resource::v1::Device;

use crate::slices::{Attribute, Interner, SliceDevice};
use kube_cel::KubeCelExt;
use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr, operators};
use kube_cel::cel::objects::{Key, Map};
use kube_cel::cel::parser::Parser;
use kube_cel::cel::{Context, ExecutionError, Value};

pub use self::check::MAX_LENGTH;
use self::reads::MemoKey;
pub use self::reads::Reads;
pub use self::release::{KubernetesVersion, Release};

/// What one selector says about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Match,
    NoMatch,
    /// The expression fails on this device; the scheduler fails the same way
    /// (it reports a CEL runtime error and does not allocate).
    RuntimeError(String),
    /// The API server of the release refuses the selector: a claim with it
    /// cannot be created, and one stored before cannot match.
    Invalid(String),
    /// We cannot evaluate it (a construct the crates lack); the scheduler may.
    Unsupported(String),
}

/// A compiled selector expression.
#[derive(Debug)]
pub struct Selector {
    source: String,
    program: Result<IdedExpr, Refusal>,
    /// The fields of `device` the expression can reach.
    reads: Reads,
    /// The static check, per release, done on first evaluation.
    checked: OnceLock<(Release, Result<(), String>)>,
    /// The attributes (domain, name) the expression reads, when it reads
    /// nothing of `device` but them and its driver.
    named: Option<Vec<(String, String)>>,
    /// Outcomes by what decides them, when `named` says what that is.
    memo: Mutex<HashMap<MemoKey, Outcome>>,
}

#[derive(Debug, Clone)]
enum Refusal {
    /// A syntax error: every release refuses it.
    Invalid(String),
    /// The parser gave up (a panic inside it).
    Unsupported(String),
}

impl Selector {
    pub fn compile(source: &str) -> Selector {
        // The ANTLR-based parser is third-party code fed user input: a panic
        // there must become "cannot evaluate", not a crash of the tool.
        let parsed = guard::guarded(|| {
            Parser::new()
                .enable_optional_syntax(true)
                .parse(source)
                .map_err(|e| e.to_string())
        });
        let mut reads = Reads::ALL;
        let mut named = None;
        let program = match parsed {
            Ok(Ok(mut expr)) => {
                rewrite(&mut expr);
                reads = Reads::NONE;
                reads.add(&expr);
                named = reads::named_attributes(&expr);
                Ok(expr)
            }
            Ok(Err(message)) => Err(Refusal::Invalid(format!(
                "syntax error: {}",
                message.trim()
            ))),
            Err(panic) => Err(Refusal::Unsupported(format!(
                "the CEL parser panicked: {panic}"
            ))),
        };
        Selector {
            source: source.to_string(),
            program,
            reads,
            checked: OnceLock::new(),
            named,
            memo: Mutex::new(HashMap::new()),
        }
    }

    /// The fields of `device` to build for [`Selector::evaluate`].
    pub fn reads(&self) -> Reads {
        self.reads
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Why the API server of `release` refuses this selector as a new one,
    /// if it does.
    pub fn invalid(&self, release: Release) -> Option<String> {
        match &self.program {
            Err(Refusal::Invalid(m)) => Some(m.clone()),
            Err(Refusal::Unsupported(_)) => None,
            Ok(expr) => {
                let (checked_for, result) = self
                    .checked
                    .get_or_init(|| (release, check::check(&self.source, expr, release)));
                if *checked_for == release {
                    result.clone().err()
                } else {
                    check::check(&self.source, expr, release).err()
                }
            }
        }
    }

    /// Why we cannot evaluate it at all, if we cannot.
    pub fn compile_error(&self) -> Option<&str> {
        match &self.program {
            Ok(_) => None,
            Err(Refusal::Invalid(m) | Refusal::Unsupported(m)) => Some(m),
        }
    }

    /// [`Selector::evaluate`] on a published device, building only the
    /// fields of `device` the expression reads.
    pub fn evaluate_on(
        &self,
        env: &Environment,
        driver: &Arc<str>,
        device: &SliceDevice,
    ) -> Outcome {
        let Some(named) = &self.named else {
            return self.evaluate(env, &DeviceValue::of(driver, device, self.reads));
        };
        let key = MemoKey {
            release: env.release,
            driver: driver.clone(),
            attributes: named
                .iter()
                .map(|(domain, name)| reads::entries(driver, device, domain, name))
                .collect(),
        };
        if let Some(known) = self.memo.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return known;
        }
        let outcome = self.evaluate(env, &DeviceValue::of(driver, device, self.reads));
        if let Ok(mut m) = self.memo.lock()
            && m.len() < reads::MEMO_LIMIT
        {
            m.insert(key, outcome.clone());
        }
        outcome
    }

    pub fn evaluate(&self, env: &Environment, device: &DeviceValue) -> Outcome {
        match self.invalid(env.release) {
            Some(reason) => Outcome::Invalid(reason),
            None => self.evaluate_stored(env, device),
        }
    }

    /// What the scheduler of the release makes of the selector when it is
    /// stored, whether or not its API server accepts it as new.
    fn evaluate_stored(&self, env: &Environment, device: &DeviceValue) -> Outcome {
        let expr = match &self.program {
            Ok(expr) => expr,
            Err(Refusal::Invalid(m)) => return Outcome::Invalid(m.clone()),
            Err(Refusal::Unsupported(m)) => return Outcome::Unsupported(m.clone()),
        };
        let mut scope = env.base.new_inner_scope();
        scope.add_variable_from_value("device", device.0.clone());
        let result = guard::guarded(|| scope.resolve(expr));
        match result {
            Ok(Ok(Value::Bool(true))) => Outcome::Match,
            Ok(Ok(Value::Bool(false))) => Outcome::NoMatch,
            Ok(Ok(other)) => Outcome::RuntimeError(format!(
                "the expression yields a {}, not a bool",
                other.type_of()
            )),
            Ok(Err(error)) => classify(error),
            Err(panic) => Outcome::Unsupported(format!("the CEL interpreter panicked: {panic}")),
        }
    }
}

fn classify(error: ExecutionError) -> Outcome {
    match error {
        // The static check has vouched for every name: one the interpreter
        // does not know is a gap of the crates, not of the expression.
        ExecutionError::UndeclaredReference(name) if name.as_str() != "device" => {
            Outcome::Unsupported(format!(
                "function or variable `{name}` is not available in kubectl-dra"
            ))
        }
        ExecutionError::UnsupportedFunctionCallIdentifierType(_)
        | ExecutionError::UnsupportedFieldsConstruction(_) => {
            Outcome::Unsupported(format!("not supported by the CEL interpreter: {error}"))
        }
        ExecutionError::NoSuchKey(key) => Outcome::RuntimeError(format!("no such key: {key}")),
        ExecutionError::FunctionError { message, .. }
            if message.starts_with(timestamps::CANNOT) =>
        {
            Outcome::Unsupported(message)
        }
        other => Outcome::RuntimeError(other.to_string()),
    }
}

/// Rewrites the parsed expression to the Kubernetes semantics (see module docs).
fn rewrite(expr: &mut IdedExpr) {
    if let Some(name) = types::qualified_type_name(expr) {
        expr.expr = Expr::Ident(name.to_string());
        return;
    }
    match &mut expr.expr {
        Expr::Call(call) => {
            if let Some(target) = call.target.as_deref_mut() {
                rewrite(target);
            }
            for arg in &mut call.args {
                rewrite(arg);
            }
            if call.func_name == operators::OPT_SELECT {
                call.func_name = operators::OPT_INDEX.to_string();
            } else if call.func_name == operators::EQUALS {
                call.func_name = macros::EQUALS.to_string();
            } else if call.func_name == operators::NOT_EQUALS {
                call.func_name = macros::NOT_EQUALS.to_string();
            } else if let Some(ours) = ordering::ours(&call.func_name) {
                call.func_name = ours.to_string();
            }
            let domain_map = call.func_name == operators::INDEX
                && call.target.is_none()
                && call.args.first().is_some_and(is_device_domain_map);
            if domain_map {
                let id = expr.id;
                let mut index = std::mem::take(call);
                index.func_name = operators::OPT_INDEX.to_string();
                let empty = IdedExpr {
                    id,
                    expr: Expr::Map(Default::default()),
                };
                expr.expr = Expr::Call(kube_cel::cel::common::ast::CallExpr {
                    func_name: "orValue".to_string(),
                    target: Some(Box::new(IdedExpr {
                        id,
                        expr: Expr::Call(index),
                    })),
                    args: vec![empty],
                });
            }
        }
        Expr::Comprehension(c) => {
            rewrite(&mut c.iter_range);
            rewrite(&mut c.accu_init);
            rewrite(&mut c.loop_cond);
            rewrite(&mut c.loop_step);
            rewrite(&mut c.result);
        }
        Expr::List(list) => list.elements.iter_mut().for_each(rewrite),
        Expr::Map(map) => {
            for entry in &mut map.entries {
                if let EntryExpr::MapEntry(e) = &mut entry.expr {
                    rewrite(&mut e.key);
                    rewrite(&mut e.value);
                }
            }
        }
        Expr::Struct(s) => {
            for entry in &mut s.entries {
                if let EntryExpr::StructField(f) = &mut entry.expr {
                    rewrite(&mut f.value);
                }
            }
        }
        Expr::Select(select) => rewrite(&mut select.operand),
        Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => {}
    }
}

/// `device.attributes` or `device.capacity`.
fn is_device_domain_map(expr: &IdedExpr) -> bool {
    matches!(&expr.expr, Expr::Select(s)
        if !s.test
            && (s.field == "attributes" || s.field == "capacity")
            && matches!(&s.operand.expr, Expr::Ident(name) if name == "device"))
}

/// The functions and macros available to selectors, built once, and the
/// release whose API server decides which selectors are valid.
pub struct Environment {
    base: Context<'static>,
    release: Release,
}

impl Default for Environment {
    fn default() -> Self {
        Self::new()
    }
}

impl Environment {
    /// The environment of the default release ([`Release::default`]).
    pub fn new() -> Self {
        Self::for_release(Release::default())
    }

    pub fn for_release(release: Release) -> Self {
        Environment {
            base: base_context(release),
            release,
        }
    }

    pub fn release(&self) -> Release {
        self.release
    }
}

/// The interpreter's context: the standard library, kube-cel's Kubernetes
/// libraries, and ours. Functions a release lacks are refused by the static
/// check, not left out here: what differs by release is only how its
/// scheduler orders a NaN.
fn base_context(release: Release) -> Context<'static> {
    let mut base = Context::default();
    base.register_all();
    macros::register(&mut base);
    types::register(&mut base);
    timestamps::register(&mut base);
    ordering::register(&mut base, release.orders_nan());
    base
}

/// A device as the `device` CEL variable.
#[derive(Debug, Clone)]
pub struct DeviceValue(Value);

/// Splits a qualified attribute name; unqualified names are in the driver's domain.
pub fn split_attribute_name<'a>(driver: &'a str, name: &'a str) -> (&'a str, &'a str) {
    match name.rsplit_once('/') {
        Some((domain, id)) => (domain, id),
        None => (driver, name),
    }
}

#[derive(Clone, Copy)]
enum Library {
    Quantity,
    Semver,
}

thread_local! {
    /// kube-cel keeps its quantity and semver types private: a `device`
    /// value of those types is made by calling its `quantity()` and
    /// `semver()`, in a context built once per thread.
    static CONVERTER: Option<(Context<'static>, IdedExpr, IdedExpr)> = {
        let mut ctx = Context::default();
        ctx.register_all();
        let parse = |s: &str| Parser::new().parse(s).ok();
        match (parse("quantity(text)"), parse("semver(text)")) {
            (Some(q), Some(v)) => Some((ctx, q, v)),
            _ => None,
        }
    };
}

/// `text` as a Kubernetes quantity or semver CEL value, `None` when it is
/// not one.
fn library_value(library: Library, text: &str) -> Option<Value> {
    CONVERTER.with(|converter| {
        let (ctx, quantity, semver) = converter.as_ref()?;
        let mut scope = ctx.new_inner_scope();
        scope.add_variable_from_value("text", text.to_string());
        let expr = match library {
            Library::Quantity => quantity,
            Library::Semver => semver,
        };
        scope.resolve(expr).ok()
    })
}

impl DeviceValue {
    /// Every field of a device as the API publishes it.
    pub fn new(driver: &str, device: &Device) -> DeviceValue {
        let compact = SliceDevice::from_api(device, &mut Interner::default());
        DeviceValue::of(driver, &compact, Reads::ALL)
    }

    /// The fields in `reads` of a device. Attribute values that cannot be
    /// represented (a `version` that is not SemVer) are left out: reading
    /// them is then a "no such key" error, which is also how an unusable
    /// attribute behaves in the scheduler.
    pub fn of(driver: &str, device: &SliceDevice, reads: Reads) -> DeviceValue {
        let nested = |m: BTreeMap<&str, HashMap<Key, Value>>| {
            let outer: HashMap<Key, Value> = m
                .into_iter()
                .map(|(domain, inner)| (Key::from(domain), Value::Map(Map::from(inner))))
                .collect();
            Value::Map(Map::from(outer))
        };
        let mut fields: HashMap<Key, Value> = HashMap::new();
        if reads.driver {
            fields.insert(
                Key::from("driver"),
                Value::String(Arc::new(driver.to_string())),
            );
        }
        if reads.attributes {
            let mut attributes: BTreeMap<&str, HashMap<Key, Value>> = BTreeMap::new();
            for (name, attr) in &device.attributes {
                let (domain, id) = split_attribute_name(driver, name);
                let value = match attr {
                    Some(Attribute::String(s)) => Value::String(Arc::new(s.to_string())),
                    Some(Attribute::Int(i)) => Value::Int(*i),
                    Some(Attribute::Bool(b)) => Value::Bool(*b),
                    Some(Attribute::Version(v)) => match library_value(Library::Semver, v) {
                        Some(version) => version,
                        None => continue,
                    },
                    None => continue,
                };
                attributes
                    .entry(domain)
                    .or_default()
                    .insert(Key::from(id), value);
            }
            fields.insert(Key::from("attributes"), nested(attributes));
        }
        if reads.capacity {
            let mut capacity: BTreeMap<&str, HashMap<Key, Value>> = BTreeMap::new();
            for (name, value) in &device.capacity {
                let (domain, id) = split_attribute_name(driver, name);
                if let Some(q) = library_value(Library::Quantity, value) {
                    capacity.entry(domain).or_default().insert(Key::from(id), q);
                }
            }
            fields.insert(Key::from("capacity"), nested(capacity));
        }
        if reads.allow_multiple_allocations {
            fields.insert(
                Key::from("allowMultipleAllocations"),
                Value::Bool(device.allow_multiple_allocations.unwrap_or(false)),
            );
        }
        DeviceValue(Value::Map(Map::from(fields)))
    }
}

#[cfg(test)]
mod tests;
