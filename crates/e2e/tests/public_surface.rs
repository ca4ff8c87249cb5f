//! `dra-core` is a small SDK: at most [`MAX_PUBLIC_ITEMS`] public
//! items, counted from the source.
//!
//! What counts: every `pub` declaration (not `pub(crate)` or narrower) of a
//! module, function, type, trait, constant, static or exported macro, in any
//! module of the crate, private ones included; and every `pub` associated
//! item of an inherent `impl`. A field, a variant or a trait's method belongs
//! to its item and is not counted again. A `pub use` counts only when it
//! re-exports another crate's item: re-exporting our own item does not make a
//! second one. Items under `#[cfg(test)]` or behind the `testing` and
//! `fuzzing` features are left aside. `dra-core` denies `unreachable_pub`, so
//! every `pub` counted here really is reachable from outside the crate.

use std::path::{Path, PathBuf};

use syn::punctuated::Punctuated;
use syn::{Attribute, ImplItem, Item, Meta, Token, UseTree, Visibility};

/// The bound the issue sets.
const MAX_PUBLIC_ITEMS: usize = 60;

fn dra_core_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dra-core/src")
}

/// Whether a `cfg` predicate holds in a non-test build without the
/// `testing` and `fuzzing` features (any other predicate is taken as true).
fn holds(meta: &Meta) -> bool {
    match meta {
        Meta::Path(p) => !p.is_ident("test"),
        Meta::NameValue(nv) => {
            let value = match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => s.value(),
                _ => String::new(),
            };
            !(nv.path.is_ident("feature") && (value == "testing" || value == "fuzzing"))
        }
        Meta::List(list) => {
            let inner = list
                .parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
                .expect("a cfg predicate parses");
            if list.path.is_ident("all") {
                inner.iter().all(holds)
            } else if list.path.is_ident("any") {
                inner.iter().any(holds)
            } else if list.path.is_ident("not") {
                !inner.iter().all(holds)
            } else {
                true
            }
        }
    }
}

fn compiled(attrs: &[Attribute]) -> bool {
    attrs.iter().filter(|a| a.path().is_ident("cfg")).all(|a| {
        let meta: Meta = a.parse_args().expect("a cfg attribute parses");
        holds(&meta)
    })
}

/// Whether an item is marked public only for the `testing` or `fuzzing`
/// features: `#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]`
/// (or with `any(feature = "testing", feature = "fuzzing")`). Without those
/// features such an item is reachable from nowhere outside the crate: it sits
/// in a private module, and [`dra_core_is_a_small_sdk`] checks that no
/// non-test `pub use` re-exports it.
fn testing_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg_attr")
            && a.meta.require_list().is_ok_and(|l| {
                let tokens = l.tokens.to_string();
                tokens.contains("unreachable_pub")
                    && (tokens.contains("\"testing\"") || tokens.contains("\"fuzzing\""))
            })
    })
}

fn is_pub(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

/// The names a `use` tree brings in.
fn use_leaves(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_leaves(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(n) => out.push([prefix.clone(), vec![n.ident.to_string()]].concat()),
        // The original name: what the checks compare with declarations.
        UseTree::Rename(r) => out.push([prefix.clone(), vec![r.ident.to_string()]].concat()),
        UseTree::Glob(_) => out.push([prefix.clone(), vec!["*".into()]].concat()),
        UseTree::Group(g) => g.items.iter().for_each(|t| use_leaves(t, prefix, out)),
    }
}

struct Counter {
    /// The names of the crate's own modules at every level: a `use` path
    /// starting with one of them (or `crate`, `self`, `super`) is ours.
    local: std::collections::BTreeSet<String>,
    items: Vec<String>,
    /// Items public only for the `testing`/`fuzzing` features.
    testing_only: std::collections::BTreeSet<String>,
    /// The original names our own non-test `pub use` lines re-export.
    reexported: std::collections::BTreeSet<String>,
}

impl Counter {
    fn file(&mut self, path: &Path, module: &str, children_dir: &Path) {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        self.items_of(&file.items, module, children_dir);
    }

    fn items_of(&mut self, items: &[Item], module: &str, dir: &Path) {
        for item in items {
            let (attrs, vis, name): (&[Attribute], Option<&Visibility>, String) = match item {
                Item::Fn(i) => (&i.attrs, Some(&i.vis), i.sig.ident.to_string()),
                Item::Struct(i) => (&i.attrs, Some(&i.vis), i.ident.to_string()),
                Item::Enum(i) => (&i.attrs, Some(&i.vis), i.ident.to_string()),
                Item::Union(i) => (&i.attrs, Some(&i.vis), i.ident.to_string()),
                Item::Trait(i) => (&i.attrs, Some(&i.vis), i.ident.to_string()),
                Item::Type(i) => (&i.attrs, Some(&i.vis), i.ident.to_string()),
                Item::Const(i) => (&i.attrs, Some(&i.vis), i.ident.to_string()),
                Item::Static(i) => (&i.attrs, Some(&i.vis), i.ident.to_string()),
                Item::Mod(i) => (&i.attrs, Some(&i.vis), i.ident.to_string()),
                Item::Macro(i) => {
                    let exported = i.attrs.iter().any(|a| a.path().is_ident("macro_export"));
                    if exported && compiled(&i.attrs) {
                        let name = i.ident.as_ref().map(|n| n.to_string()).unwrap_or_default();
                        self.items.push(format!("{module}::{name}!"));
                    }
                    continue;
                }
                Item::Use(u) => {
                    if is_pub(&u.vis) && compiled(&u.attrs) {
                        let mut leaves = Vec::new();
                        use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
                        for leaf in leaves {
                            if !self.local.contains(&leaf[0]) {
                                self.items
                                    .push(format!("{module}: pub use {}", leaf.join("::")));
                            } else {
                                self.reexported.insert(leaf[leaf.len() - 1].clone());
                            }
                        }
                    }
                    continue;
                }
                Item::Impl(i) => {
                    if i.trait_.is_none() && compiled(&i.attrs) && !testing_only(&i.attrs) {
                        for member in &i.items {
                            let (attrs, vis, name) = match member {
                                ImplItem::Fn(f) => (&f.attrs, &f.vis, f.sig.ident.to_string()),
                                ImplItem::Const(c) => (&c.attrs, &c.vis, c.ident.to_string()),
                                ImplItem::Type(t) => (&t.attrs, &t.vis, t.ident.to_string()),
                                _ => continue,
                            };
                            if is_pub(vis) && compiled(attrs) && !testing_only(attrs) {
                                let ty = &i.self_ty;
                                let ty = quote_type(ty);
                                self.items.push(format!("{module}: {ty}::{name}"));
                            }
                        }
                    }
                    continue;
                }
                _ => continue,
            };
            if !compiled(attrs) {
                continue;
            }
            if testing_only(attrs) {
                self.testing_only.insert(name.clone());
            } else if vis.is_some_and(is_pub) {
                self.items.push(format!("{module}::{name}"));
            }
            if let Item::Mod(m) = item {
                let child = format!("{module}::{name}");
                match &m.content {
                    Some((_, inner)) => self.items_of(inner, &child, &dir.join(&name)),
                    None => {
                        let flat = dir.join(format!("{name}.rs"));
                        let nested = dir.join(&name).join("mod.rs");
                        let path = if flat.exists() { flat } else { nested };
                        self.file(&path, &child, &dir.join(&name));
                    }
                }
            }
        }
    }
}

/// A readable name for an `impl` target: its last path segment.
fn quote_type(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default(),
        _ => "_".into(),
    }
}

fn local_module_names(dir: &Path, out: &mut std::collections::BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            out.insert(stem);
            local_module_names(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.insert(stem);
        }
    }
}

fn public_items() -> Counter {
    let src = dra_core_src();
    let mut local: std::collections::BTreeSet<String> =
        ["crate", "self", "super"].map(String::from).into();
    local_module_names(&src, &mut local);
    let mut counter = Counter {
        local,
        items: Vec::new(),
        testing_only: Default::default(),
        reexported: Default::default(),
    };
    counter.file(&src.join("lib.rs"), "dra_core", &src);
    counter
}

#[test]
fn dra_core_is_a_small_sdk() {
    let counter = public_items();
    let items = counter.items;
    let leaked: Vec<_> = counter
        .testing_only
        .intersection(&counter.reexported)
        .collect();
    assert!(
        leaked.is_empty(),
        "items marked public only for testing are re-exported by non-test code: {leaked:?}"
    );
    let lib = std::fs::read_to_string(dra_core_src().join("lib.rs")).unwrap();
    assert!(
        lib.contains("#![deny(unreachable_pub)]"),
        "dra-core denies unreachable_pub, so that every counted item is reachable"
    );
    println!("dra-core public items: {}", items.len());
    for item in &items {
        println!("  {item}");
    }
    assert!(
        items.len() <= MAX_PUBLIC_ITEMS,
        "dra-core declares {} public items (at most {MAX_PUBLIC_ITEMS}):\n{}",
        items.len(),
        items.join("\n")
    );
}

#[test]
fn the_count_sees_what_it_should() {
    let file: syn::File = syn::parse_str(
        r#"
        pub mod a { pub fn f() {} pub(crate) fn g() {} }
        pub struct S;
        impl S { pub fn new() -> Self { S } fn private() {} }
        impl Default for S { fn default() -> Self { S } }
        pub use std::time::Duration;
        pub use a::f;
        #[cfg(test)] pub fn only_in_tests() {}
        #[cfg(feature = "testing")] pub mod testing { pub fn helper() {} }
        #[cfg(all(unix, not(feature = "fuzzing")))] pub fn on_unix() {}
        #[cfg(any(test, feature = "fuzzing"))] pub fn fuzz_only() {}
        #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))] pub struct Internal;
        impl Internal {
            #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))] pub fn poke() {}
        }
        "#,
    )
    .unwrap();
    let mut counter = Counter {
        local: ["crate", "self", "super", "a"].map(String::from).into(),
        items: Vec::new(),
        testing_only: Default::default(),
        reexported: Default::default(),
    };
    counter.items_of(&file.items, "k", Path::new("/nonexistent"));
    assert_eq!(
        counter.items,
        [
            "k::a",
            "k::a::f",
            "k::S",
            "k: S::new",
            "k: pub use std::time::Duration",
            "k::on_unix",
        ]
    );
    assert_eq!(counter.testing_only, ["Internal".to_string()].into());
    assert_eq!(counter.reexported, ["f".to_string()].into());
}
