//! Strict decoding and resolution of a driver's opaque configuration.
//!
//! Opaque parameters arrive as arbitrary JSON from DeviceClasses and claims.
//! A user only learns about a mistake through the claim's prepare error, so
//! every problem (unknown field at any depth, wrong type, unknown
//! `apiVersion`/`kind`, a value the driver rejects) becomes an error that
//! names the field and what would have been accepted. Nothing is ignored.
//!
//! Resolution follows the reference drivers: entries of other drivers are
//! skipped, class entries come before claim entries, an entry with
//! `requests` applies only to those requests, and the last matching entry
//! wins (whole-object replacement, no field merging).

use std::fmt;

use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;
use serde::de::{self, DeserializeOwned, Visitor};

/// A driver's opaque configuration type.
///
/// `apiVersion` and `kind` are checked and stripped by `dra-core`; the type
/// itself holds only the remaining fields.
pub trait DriverConfig: DeserializeOwned + Clone + fmt::Debug + Send + Sync + 'static {
    /// Accepted `apiVersion` values, e.g. `["neuron.aws.com/v1"]`.
    const API_VERSIONS: &'static [&'static str];
    /// The accepted `kind`, e.g. `"NeuronConfig"`.
    const KIND: &'static str;
    /// Further kinds of the same API group that configure the same devices
    /// (Neuron: `UltraServerConfig` beside `NeuronConfig`), each decoded by
    /// [`DriverConfig::decode_other_kind`]. Default: none.
    const OTHER_KINDS: &'static [&'static str] = &[];

    /// Range and cross-field checks after decoding.
    fn validate(&self) -> Result<(), InvalidValue> {
        Ok(())
    }

    /// Decodes `parameters` (the whole entry, `apiVersion` and `kind`
    /// included) of `kind`, one of [`DriverConfig::OTHER_KINDS`], into a
    /// config that holds only that kind's settings; typically
    /// `decode_config::<ThatKind>(parameters).map(Into::into)`.
    fn decode_other_kind(kind: &str, parameters: &serde_json::Value) -> Result<Self, ConfigError> {
        let _ = parameters;
        Err(ConfigError::Unsupported {
            field: "kind",
            found: format!("{kind:?}"),
            accepted: quoted_list([Self::KIND]),
        })
    }

    /// Combines the configs of different kinds that apply to one request,
    /// `later` (the later entry) over `self`. Entries of one kind never
    /// merge: the last one replaces the earlier ones whole. Default: `later`
    /// (a driver with a single kind never sees two).
    fn merge(self, later: Self) -> Self {
        later
    }
}

/// A decoded value the driver does not accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidValue {
    /// JSON path of the field, e.g. `logicalNeuronCore`.
    pub field: String,
    /// The offending value as the user wrote it.
    pub value: String,
    /// Human-readable accepted values, e.g. `1, 2`.
    pub accepted: String,
}

/// The API server's limit on one entry's opaque parameters (10 KiB); the
/// driver holds to it too, so a larger blob (a class or claim written past
/// the API's validation, a future limit) is refused, not parsed.
pub(crate) const MAX_PARAMETERS_BYTES: usize = 10 * 1024;

/// Why one opaque config entry could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("parameters must be a JSON object, got {found}")]
    NotAnObject { found: &'static str },
    #[error("parameters are {bytes} bytes of JSON; the limit is {limit} bytes")]
    TooLarge { bytes: usize, limit: usize },
    #[error(
        "field `apiVersion`: {found} is not an apiVersion of this driver (accepted values: \
         {accepted}); a config meant for another driver must name that driver in `opaque.driver`"
    )]
    OtherDriver { found: String, accepted: String },
    #[error("field `{field}`: missing; accepted values: {accepted}")]
    Missing {
        field: &'static str,
        accepted: String,
    },
    #[error("field `{field}`: unsupported value {found}; accepted values: {accepted}")]
    Unsupported {
        field: &'static str,
        found: String,
        accepted: String,
    },
    #[error("field `{field}`: unknown field; accepted fields: {accepted}")]
    UnknownField { field: String, accepted: String },
    #[error("field `{field}`: {message}")]
    Decode { field: String, message: String },
    #[error("field `{field}`: value {value} is out of range; accepted values: {accepted}")]
    OutOfRange {
        field: String,
        value: String,
        accepted: String,
    },
}

/// Decode one entry's `parameters` strictly into `C`.
pub fn decode_config<C: DriverConfig>(parameters: &serde_json::Value) -> Result<C, ConfigError> {
    let serde_json::Value::Object(object) = parameters else {
        return Err(ConfigError::NotAnObject {
            found: json_kind(parameters),
        });
    };
    let bytes = serde_json::to_vec(parameters).map_or(usize::MAX, |v| v.len());
    if bytes > MAX_PARAMETERS_BYTES {
        return Err(ConfigError::TooLarge {
            bytes,
            limit: MAX_PARAMETERS_BYTES,
        });
    }
    let mut object = object.clone();
    let api_versions = quoted_list(C::API_VERSIONS.iter().copied());
    match object.remove("apiVersion") {
        None => {
            return Err(ConfigError::Missing {
                field: "apiVersion",
                accepted: api_versions,
            });
        }
        Some(serde_json::Value::String(v)) if C::API_VERSIONS.contains(&v.as_str()) => {}
        // Another API group altogether: most likely another driver's config
        // under this driver's name, not a version this driver lacks.
        Some(serde_json::Value::String(v))
            if !C::API_VERSIONS
                .iter()
                .any(|ours| api_group(ours) == api_group(&v)) =>
        {
            return Err(ConfigError::OtherDriver {
                found: format!("{v:?}"),
                accepted: api_versions,
            });
        }
        Some(other) => {
            return Err(ConfigError::Unsupported {
                field: "apiVersion",
                found: other.to_string(),
                accepted: api_versions,
            });
        }
    }
    let kinds = quoted_list(std::iter::once(C::KIND).chain(C::OTHER_KINDS.iter().copied()));
    match object.remove("kind") {
        None => {
            return Err(ConfigError::Missing {
                field: "kind",
                accepted: kinds,
            });
        }
        Some(serde_json::Value::String(v)) if v == C::KIND => {}
        Some(serde_json::Value::String(v)) if C::OTHER_KINDS.contains(&v.as_str()) => {
            return C::decode_other_kind(&v, parameters);
        }
        Some(other) => {
            return Err(ConfigError::Unsupported {
                field: "kind",
                found: other.to_string(),
                accepted: kinds,
            });
        }
    }

    // Top-level unknown fields get the full list of accepted fields, which
    // serde only offers when the type opts into `deny_unknown_fields`.
    if let Some(fields) = struct_fields::<C>()
        && let Some(unknown) = object.keys().find(|k| !fields.contains(&k.as_str()))
    {
        let accepted = ["apiVersion", "kind"]
            .iter()
            .chain(fields.iter())
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        return Err(ConfigError::UnknownField {
            field: unknown.clone(),
            accepted,
        });
    }

    let value = serde_json::Value::Object(object);
    let mut ignored = Vec::new();
    let mut record = |path: serde_ignored::Path<'_>| {
        // serde_ignored writes `?` for an `Option` layer; users never see one.
        let path = path.to_string();
        ignored.push(
            path.split('.')
                .filter(|seg| *seg != "?")
                .collect::<Vec<_>>()
                .join("."),
        );
    };
    let decoded: Result<C, _> =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(&value, &mut record));
    let config = decoded.map_err(|e| {
        let field = e.path().to_string();
        let message = e.into_inner().to_string();
        // A required top-level field: serde names it in the message and
        // the path is the root (`.`); name the field instead.
        match message
            .strip_prefix("missing field `")
            .and_then(|m| m.strip_suffix('`'))
        {
            Some(missing) if field == "." => ConfigError::Decode {
                field: missing.to_owned(),
                message: "missing (required)".to_owned(),
            },
            _ => ConfigError::Decode { field, message },
        }
    })?;
    if let Some(field) = ignored.into_iter().next() {
        return Err(ConfigError::UnknownField {
            field,
            accepted: "see the driver's documentation".to_string(),
        });
    }
    config.validate().map_err(|v| ConfigError::OutOfRange {
        field: v.field,
        value: v.value,
        accepted: v.accepted,
    })?;
    Ok(config)
}

/// `group/version` → `group` (a bare `v1` is the core group, `""`).
fn api_group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn quoted_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    items
        .into_iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The field names a derived `Deserialize` struct declares, learnt by letting
/// it ask a deserializer that only records the question.
fn struct_fields<C: DeserializeOwned>() -> Option<&'static [&'static str]> {
    struct Recorder<'a>(&'a mut Option<&'static [&'static str]>);

    #[derive(Debug)]
    struct Stop;
    impl fmt::Display for Stop {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("field introspection")
        }
    }
    impl std::error::Error for Stop {}
    impl de::Error for Stop {
        fn custom<T: fmt::Display>(_: T) -> Self {
            Stop
        }
    }

    impl<'de> de::Deserializer<'de> for Recorder<'_> {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            *self.0 = Some(fields);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }

    let mut fields = None;
    let _ = C::deserialize(Recorder(&mut fields));
    fields
}

/// Where an opaque config entry came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConfigSource {
    Class,
    Claim,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigSource::Class => "DeviceClass",
            ConfigSource::Claim => "ResourceClaim",
        })
    }
}

/// A config entry of the allocation that failed to decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("opaque config #{index} (from {origin}): {error}")]
pub struct ConfigEntryError {
    /// Position in `status.allocation.devices.config`.
    pub index: usize,
    pub origin: ConfigSource,
    pub error: ConfigError,
}

/// One decoded entry for our driver, in precedence order.
#[derive(Debug, Clone)]
pub struct ResolvedConfig<C> {
    requests: Vec<String>,
    /// The entry's `kind`: entries of one kind replace each other, entries
    /// of different kinds merge ([`DriverConfig::merge`]).
    kind: String,
    config: C,
}

/// Decode every entry of the allocation that belongs to `driver`, ordered
/// class-first; the first failing entry fails the claim.
pub fn decode_allocation_configs<C: DriverConfig>(
    driver: &str,
    entries: &[DeviceAllocationConfiguration],
) -> Result<Vec<ResolvedConfig<C>>, ConfigEntryError> {
    let mut ours: Vec<(ConfigSource, usize, &DeviceAllocationConfiguration)> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.opaque.as_ref().is_some_and(|o| o.driver == driver))
        .map(|(i, e)| {
            let source = if e.source == "FromClass" {
                ConfigSource::Class
            } else {
                ConfigSource::Claim
            };
            (source, i, e)
        })
        .collect();
    // Stable: keeps the API order within each source.
    ours.sort_by_key(|(source, _, _)| *source);
    ours.into_iter()
        .filter_map(|(source, index, entry)| {
            let opaque = entry.opaque.as_ref()?;
            let kind = opaque
                .parameters
                .0
                .get("kind")
                .and_then(|k| k.as_str())
                .unwrap_or(C::KIND)
                .to_owned();
            Some(
                decode_config::<C>(&opaque.parameters.0)
                    .map(|config| ResolvedConfig {
                        requests: entry.requests.clone().unwrap_or_default(),
                        kind,
                        config,
                    })
                    .map_err(|error| ConfigEntryError {
                        index,
                        origin: source,
                        error,
                    }),
            )
        })
        .collect()
}

/// The config for one allocation result: of each kind, the last entry whose
/// `requests` names the result's request (full `a/b` or base `a`) or is
/// empty; the kinds' configs merged in precedence order.
pub fn config_for_request<C: DriverConfig>(
    resolved: &[ResolvedConfig<C>],
    request: &str,
) -> Option<C> {
    let base = base_request(request);
    let matching: Vec<&ResolvedConfig<C>> = resolved
        .iter()
        .filter(|r| r.requests.is_empty() || r.requests.iter().any(|q| q == request || q == base))
        .collect();
    // Keep the last entry of each kind, in precedence order.
    let last_of_kind = matching
        .iter()
        .enumerate()
        .filter(|(i, r)| !matching[i + 1..].iter().any(|later| later.kind == r.kind));
    last_of_kind.fold(None, |merged: Option<C>, (_, r)| {
        Some(match merged {
            None => r.config.clone(),
            Some(earlier) => earlier.merge(r.config.clone()),
        })
    })
}

/// `a/b` → `a`: kubelet wants the base request name.
pub(crate) fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

#[cfg(test)]
mod tests;
