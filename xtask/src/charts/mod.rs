//! `cargo xtask charts`: the Helm charts' checks, one module a concern.
//!
//! [`command`] is the subcommand; [`specs`] says what each chart is (its
//! values, DeviceClasses, images); [`render`] and [`rendering`] run `helm
//! template` and read what it printed; [`objects`], [`daemonset`],
//! [`access`] and [`expect`] check the rendered objects; [`checks`] is the
//! list they make up; [`scan`] runs checkov on the renderings.

pub(crate) mod access;
pub(crate) mod checks;
pub(crate) mod command;
pub(crate) mod daemonset;
pub(crate) mod expect;
pub(crate) mod objects;
pub(crate) mod render;
pub(crate) mod rendering;
pub(crate) mod scan;
pub(crate) mod specs;
