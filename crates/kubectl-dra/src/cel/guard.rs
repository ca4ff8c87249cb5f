//! Third-party CEL code run so that its panic is an answer, not a crash.
//!
//! The parser and the interpreter are crates fed user input (the selectors
//! of whatever claims the user points us at); some inputs panic them (a
//! byte index inside a multi-byte character, for one:
//! `format.datetime().validate("2024-01-01T12:34:5éZ")` in kube-cel 0.8).
//! [`guarded`] turns such a panic into an error for that one expression,
//! with the panic's message and where it happened, and keeps the default
//! panic report (a "thread 'main' panicked" line and, with
//! `RUST_BACKTRACE`, a backtrace) off the user's terminal for it: the
//! caller reports the failure in its own words. A panic anywhere else is
//! reported as before. This relies on the release profile unwinding
//! (`panic = "unwind"`, docs/reliability.md), which `tests/cli.rs` checks
//! on the release binary.

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe, PanicHookInfo};
use std::sync::Once;

thread_local! {
    /// How many [`guarded`] calls this thread is inside.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// What the hook saw of the last panic inside one.
    static SEEN: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Runs `f`; a panic in it comes back as `Err` with its message and place.
pub(super) fn guarded<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if DEPTH.with(Cell::get) > 0 {
                SEEN.with(|s| *s.borrow_mut() = Some(describe(info)));
            } else {
                previous(info);
            }
        }));
    });
    DEPTH.with(|d| d.set(d.get() + 1));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    DEPTH.with(|d| d.set(d.get() - 1));
    result.map_err(|payload| {
        SEEN.with(|s| s.borrow_mut().take())
            .unwrap_or_else(|| message(payload.as_ref()).to_string())
    })
}

fn describe(info: &PanicHookInfo<'_>) -> String {
    let text = message(info.payload());
    match info.location() {
        Some(at) => format!("{text} (at {}:{})", short_path(at.file()), at.line()),
        None => text.to_string(),
    }
}

fn message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic without a message"
    }
}

/// `…/registry/src/index.crates.io-…/kube-cel-0.8.0/src/x.rs` as
/// `kube-cel-0.8.0/src/x.rs`: the crate and version say whose bug it is;
/// the builder's home directory says nothing.
fn short_path(file: &str) -> &str {
    match file.find("/registry/src/") {
        Some(i) => {
            let rest = &file[i + "/registry/src/".len()..];
            rest.split_once('/').map_or(rest, |(_, inside)| inside)
        }
        None => file,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_is_an_error_with_its_message_and_place() {
        let err = guarded(|| -> u32 { panic!("boom {}", 7) }).unwrap_err();
        assert!(err.starts_with("boom 7 (at "), "{err}");
        assert!(err.contains("guard.rs:"), "{err}");
        assert_eq!(guarded(|| 5), Ok(5));
    }

    #[test]
    fn nested_guards_each_see_their_own_panic() {
        let outer = guarded(|| {
            let inner = guarded(|| -> () { panic!("inner") }).unwrap_err();
            assert!(inner.starts_with("inner"), "{inner}");
            panic!("outer");
        })
        .unwrap_err();
        assert!(outer.starts_with("outer"), "{outer}");
        assert_eq!(DEPTH.with(Cell::get), 0);
    }

    #[test]
    fn registry_paths_keep_the_crate_and_version() {
        assert_eq!(
            short_path(
                "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/kube-cel-0.8.0/src/functions/named_format.rs"
            ),
            "kube-cel-0.8.0/src/functions/named_format.rs"
        );
        assert_eq!(short_path("crates/x/src/y.rs"), "crates/x/src/y.rs");
    }
}
