//! The checkpoint's bytes: its version read first, then the format of that
//! version; what a newer version's file still tells this build; and the
//! fields this build does not know, written back as they were read.
//!
//! The version decides how the rest is read, so it is read alone first: a
//! newer file is never taken for a corrupt one because a field changed its
//! type. Of a newer file this build reads, leniently, only what unprepare
//! needs: per claim UID its devices (and its spec path when that still
//! reads as one); a claim whose devices do not read is named as such.
//!
//! Unknown fields are kept, not dropped: an additive change (a field an
//! older build can ignore) keeps the version, so that a rollback after it
//! keeps working, and the older build then writes the newer fields back
//! untouched. A claim this build changed or wrote itself is written in its
//! own format (its unknown fields belonged to the entry it replaced).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{CHECKPOINT_VERSION, Checkpoint, PreparedClaim};
use crate::prepare::driver::PreparedDevice;

/// What the bytes of a checkpoint file are.
pub(super) enum Parsed {
    /// This build's version, and what it held beyond this build's fields.
    Current(Checkpoint, AsRead),
    /// A newer version: the claims as far as this build reads them.
    Newer {
        version: u32,
        claims: Result<BTreeMap<String, Result<PreparedClaim, String>>, String>,
    },
    /// Not a checkpoint this build can use (not JSON, no version, an older
    /// version than any written, or this version's format broken).
    Corrupt(String),
}

/// What the file last read held that this build does not know: written
/// back as read by the next save.
#[derive(Debug, Default)]
pub(super) struct AsRead {
    /// Top-level fields besides `version`, `bootId` and `claims`.
    top: Map<String, Value>,
    /// Claims with a field this build does not know (on the claim or on a
    /// device), as parsed and as read: while unchanged, written as read.
    claims: BTreeMap<String, (PreparedClaim, Value)>,
}

impl AsRead {
    fn is_empty(&self) -> bool {
        self.top.is_empty() && self.claims.is_empty()
    }
}

pub(super) fn parse(bytes: &[u8]) -> Parsed {
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return Parsed::Corrupt(e.to_string()),
    };
    // Any whole number above this build's is a newer version, however large.
    let version = match value.get("version").map(u64::deserialize) {
        Some(Ok(v)) => u32::try_from(v).unwrap_or(u32::MAX),
        Some(Err(e)) => return Parsed::Corrupt(format!("version: {e}")),
        None => return Parsed::Corrupt("no version".into()),
    };
    if version > CHECKPOINT_VERSION {
        return Parsed::Newer {
            version,
            claims: lenient_claims(&value),
        };
    }
    if version < CHECKPOINT_VERSION {
        return Parsed::Corrupt(format!(
            "unsupported version {version} (this build reads {CHECKPOINT_VERSION})"
        ));
    }
    let checkpoint = match Checkpoint::deserialize(&value) {
        Ok(c) => c,
        Err(e) => return Parsed::Corrupt(e.to_string()),
    };
    let as_read = unknown_fields(value, &checkpoint);
    Parsed::Current(checkpoint, as_read)
}

/// The claims of a newer file by UID, each with what unprepare needs or why
/// it does not read; `Err` when there is no map of claims at all.
fn lenient_claims(
    value: &Value,
) -> Result<BTreeMap<String, Result<PreparedClaim, String>>, String> {
    let claims = value
        .get("claims")
        .and_then(Value::as_object)
        .ok_or("its claims are not a map of claim UIDs")?;
    Ok(claims
        .iter()
        .map(|(uid, claim)| (uid.clone(), lenient_claim(claim)))
        .collect())
}

/// A claim of a newer file: whole when it reads in this build's format,
/// else its devices (which unprepare hands the driver) and what else still
/// reads; an unreadable spec path is left empty (the spec is then found by
/// the claim's UID).
fn lenient_claim(claim: &Value) -> Result<PreparedClaim, String> {
    if let Ok(whole) = PreparedClaim::deserialize(claim) {
        return Ok(whole);
    }
    let text = |key: &str| {
        claim
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let devices = claim
        .get("devices")
        .ok_or_else(|| "it records no devices".to_owned())
        .and_then(|d| {
            Vec::<PreparedDevice>::deserialize(d).map_err(|e| format!("its devices: {e}"))
        })?;
    Ok(PreparedClaim {
        namespace: text("namespace"),
        name: text("name"),
        devices,
        cdi_spec_path: PathBuf::from(text("cdiSpecPath")),
    })
}

/// The names this build writes: of the top level, of a claim, of a device
/// (from a sample with every field set, so that they follow the types).
fn known() -> &'static [BTreeSet<String>; 3] {
    static KNOWN: OnceLock<[BTreeSet<String>; 3]> = OnceLock::new();
    KNOWN.get_or_init(|| {
        let device = PreparedDevice {
            request_names: vec![String::new()],
            pool: String::new(),
            device: String::new(),
            admin_access: true,
            cdi_device_ids: vec![String::new()],
            share_ids: vec![String::new()],
        };
        let claim = PreparedClaim {
            namespace: String::new(),
            name: String::new(),
            devices: vec![device.clone()],
            cdi_spec_path: PathBuf::new(),
        };
        let keys = |v: Value| match v {
            Value::Object(map) => map.into_iter().map(|(k, _)| k).collect(),
            _ => BTreeSet::new(),
        };
        let to = |v: serde_json::Result<Value>| keys(v.expect("a checkpoint type serializes"));
        [
            to(serde_json::to_value(Checkpoint::default())),
            to(serde_json::to_value(claim)),
            to(serde_json::to_value(device)),
        ]
    })
}

/// Whether a claim as read has a field this build does not know.
fn has_unknown(claim: &Value) -> bool {
    let [_, claim_keys, device_keys] = known();
    let unknown_in = |v: &Value, keys: &BTreeSet<String>| {
        v.as_object()
            .is_some_and(|m| m.keys().any(|k| !keys.contains(k)))
    };
    unknown_in(claim, claim_keys)
        || claim
            .get("devices")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|d| unknown_in(d, device_keys)))
}

fn unknown_fields(value: Value, checkpoint: &Checkpoint) -> AsRead {
    let mut as_read = AsRead::default();
    let Value::Object(top) = value else {
        return as_read;
    };
    for (key, v) in top {
        if key == "claims" {
            let Value::Object(claims) = v else { continue };
            for (uid, raw) in claims {
                if let Some(parsed) = checkpoint.claims.get(&uid)
                    && has_unknown(&raw)
                {
                    as_read.claims.insert(uid, (parsed.clone(), raw));
                }
            }
        } else if !known()[0].contains(&key) {
            as_read.top.insert(key, v);
        }
    }
    as_read
}

/// The bytes of `checkpoint` in this build's version (whatever its
/// `version` says: an empty `Checkpoint::default()` is an empty checkpoint,
/// not one of version 0), with what `as_read` kept of the file it was read
/// from: its unknown top-level fields, and each claim still as read
/// (unknown fields included) while this build has not changed it.
pub(super) fn encode(checkpoint: &Checkpoint, as_read: &AsRead) -> serde_json::Result<Vec<u8>> {
    if as_read.is_empty() && checkpoint.version == CHECKPOINT_VERSION {
        return serde_json::to_vec_pretty(checkpoint);
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Out<'a> {
        version: u32,
        boot_id: &'a str,
        claims: BTreeMap<&'a str, OutClaim<'a>>,
        #[serde(flatten)]
        top: &'a Map<String, Value>,
    }
    #[derive(Serialize)]
    #[serde(untagged)]
    enum OutClaim<'a> {
        Ours(&'a PreparedClaim),
        AsRead(&'a Value),
    }
    let claims = checkpoint
        .claims
        .iter()
        .map(|(uid, claim)| {
            let out = match as_read.claims.get(uid) {
                Some((parsed, raw)) if parsed == claim => OutClaim::AsRead(raw),
                _ => OutClaim::Ours(claim),
            };
            (uid.as_str(), out)
        })
        .collect();
    serde_json::to_vec_pretty(&Out {
        version: CHECKPOINT_VERSION,
        boot_id: &checkpoint.boot_id,
        claims,
        top: &as_read.top,
    })
}
