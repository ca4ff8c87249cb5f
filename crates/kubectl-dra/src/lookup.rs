//! `-A/--all-namespaces` for `explain`: which namespace holds the claim or
//! pod of that name.
//!
//! kubectl's `-A` lists across namespaces; for a command about one object it
//! means "find it wherever it is". A name found in several namespaces is an
//! error that lists them, never a guess.

use crate::inventory::Inventory;

/// What `explain` was asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    Claim,
    Pod,
}

impl ObjectKind {
    fn kind(self) -> &'static str {
        match self {
            ObjectKind::Claim => "ResourceClaim",
            ObjectKind::Pod => "Pod",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            ObjectKind::Claim => "resourceclaims",
            ObjectKind::Pod => "pods",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LookupError {
    #[error(
        "no {} named {name:?} in any namespace; check the name with `kubectl get {} -A`{}",
        .kind.kind(),
        .kind.plural(),
        if *.offline { ", and that the -f files hold it" } else { "" }
    )]
    NotFound {
        kind: ObjectKind,
        name: String,
        offline: bool,
    },
    #[error(
        "{} {name:?} exists in {} namespaces ({}); name one with -n NAMESPACE instead of -A",
        .kind.kind(),
        .namespaces.len(),
        .namespaces.join(", ")
    )]
    Ambiguous {
        kind: ObjectKind,
        name: String,
        namespaces: Vec<String>,
    },
}

/// The one namespace that has a `kind` called `name`.
pub fn namespace_of(
    inventory: &Inventory,
    kind: ObjectKind,
    name: &str,
    offline: bool,
) -> Result<String, LookupError> {
    let metas: Vec<&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta> = match kind {
        ObjectKind::Claim => inventory.claims.iter().map(|c| &c.metadata).collect(),
        ObjectKind::Pod => inventory.pods.iter().map(|p| &p.metadata).collect(),
    };
    let mut namespaces: Vec<String> = metas
        .into_iter()
        .filter(|m| m.name.as_deref() == Some(name))
        .map(|m| m.namespace.clone().unwrap_or_else(|| "default".to_string()))
        .collect();
    namespaces.sort();
    namespaces.dedup();
    match namespaces.len() {
        0 => Err(LookupError::NotFound {
            kind,
            name: name.to_string(),
            offline,
        }),
        1 => Ok(namespaces.remove(0)),
        _ => Err(LookupError::Ambiguous {
            kind,
            name: name.to_string(),
            namespaces,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::ResourceClaim;

    fn claim(ns: &str, name: &str) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.namespace = Some(ns.to_string());
        c.metadata.name = Some(name.to_string());
        c
    }

    #[test]
    fn finds_the_one_namespace_or_lists_them_all() {
        let inv = Inventory {
            claims: vec![claim("a", "x"), claim("b", "y"), claim("c", "y")],
            ..Default::default()
        };
        assert_eq!(
            namespace_of(&inv, ObjectKind::Claim, "x", false),
            Ok("a".into())
        );
        let e = namespace_of(&inv, ObjectKind::Claim, "y", false).expect_err("two");
        assert_eq!(
            e.to_string(),
            "ResourceClaim \"y\" exists in 2 namespaces (b, c); name one with -n NAMESPACE instead of -A"
        );
        let e = namespace_of(&inv, ObjectKind::Pod, "x", true).expect_err("none");
        assert_eq!(
            e.to_string(),
            "no Pod named \"x\" in any namespace; check the name with `kubectl get pods -A`, and that the -f files hold it"
        );
    }
}
