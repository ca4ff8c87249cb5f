//! Which CEL functions the DRA environment of each Kubernetes release has.
//!
//! Two environments matter per release (`k8s.io/apiserver/pkg/cel/environment`
//! and `k8s.io/dynamic-resource-allocation/cel`, v0.37.2 read for this):
//!
//! - the API server validates a *new* selector against the environment of
//!   its minimum compatibility version, one minor below its own (1.37 checks
//!   new claims against 1.36). What is missing there is an invalid selector:
//!   the claim is refused on create.
//! - the scheduler evaluates *stored* selectors with everything its own
//!   version has. That is what the evaluation here uses.
//!
//! The table below is the base environment's versioned options plus the DRA
//! compiler's own, with the feature gates at their defaults:
//!
//! | since | what |
//! |---|---|
//! | always (1.0) | standard library, URLs, regex `find`/`findAll`, Kubernetes lists v0 |
//! | 1.28 | optional types (with a list's `first()` and `last()`), quantity |
//! | 1.29 | strings extension v2, sets |
//! | 1.30 | IP and CIDR |
//! | 1.31 | named formats (`format.*`), `cel.bind` |
//! | 1.32 | two-variable comprehensions |
//! | 1.33 | semver |
//! | 1.34 | lists extension v3 (`slice`, `flatten`, `lists.range`, `distinct`, `reverse`, `sort`, `sortBy`); `device.allowMultipleAllocations` when `DRAConsumableCapacity` is on (beta, on by default from 1.36) |
//! | 1.37 | Kubernetes lists v1 (`includes`) |

use std::fmt;
use std::str::FromStr;

/// A Kubernetes minor release whose DRA CEL environment we model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Release {
    V1_34,
    V1_35,
    V1_36,
    #[default]
    V1_37,
}

impl Release {
    pub const ALL: [Release; 4] = [
        Release::V1_34,
        Release::V1_35,
        Release::V1_36,
        Release::V1_37,
    ];

    pub fn minor(self) -> u32 {
        match self {
            Release::V1_34 => 34,
            Release::V1_35 => 35,
            Release::V1_36 => 36,
            Release::V1_37 => 37,
        }
    }

    /// The environment version the API server checks new selectors against.
    pub fn new_expressions(self) -> u32 {
        self.minor() - 1
    }

    /// Whether `device.allowMultipleAllocations` is declared in the
    /// environment of version `env` (the `DRAConsumableCapacity` gate at its
    /// default: alpha and off in 1.34 and 1.35, beta and on from 1.36).
    pub fn has_multi_allocations(self, env: u32) -> bool {
        env >= 34 && self.minor() >= 36
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor())
    }
}

/// A version string that names no release we model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Kubernetes version {0:?} is not one of 1.34, 1.35, 1.36, 1.37")]
pub struct UnknownRelease(pub String);

impl FromStr for Release {
    type Err = UnknownRelease;

    /// Accepts `1.36`, `v1.36`, `v1.36.2`, `1.36.0-rc.1`, and what an API
    /// server reports as its `gitVersion`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim().trim_start_matches('v');
        let mut parts = trimmed.split(['.', '-', '+']);
        let minor = match (parts.next(), parts.next()) {
            (Some("1"), Some(minor)) => minor,
            _ => return Err(UnknownRelease(s.to_string())),
        };
        Release::ALL
            .into_iter()
            .find(|r| r.minor().to_string() == minor)
            .ok_or_else(|| UnknownRelease(s.to_string()))
    }
}

/// Since which environment version a global function or method exists, or
/// `None` when the DRA environment has no such function in any release.
pub fn function_since(name: &str) -> Option<u32> {
    Some(match name {
        // standard library and macros
        "size" | "contains" | "startsWith" | "endsWith" | "matches" | "int" | "uint" | "double"
        | "string" | "bytes" | "bool" | "type" | "dyn" | "duration" | "timestamp" | "has"
        | "all" | "exists" | "exists_one" | "map" | "filter" | "getFullYear" | "getMonth"
        | "getDayOfYear" | "getDayOfMonth" | "getDate" | "getDayOfWeek" | "getHours"
        | "getMinutes" | "getSeconds" | "getMilliseconds" => 0,
        // Kubernetes URLs and regex
        "url" | "isURL" | "getScheme" | "getHost" | "getHostname" | "getPort"
        | "getEscapedPath" | "getQuery" | "find" | "findAll" => 0,
        // Kubernetes lists v0
        "isSorted" | "sum" | "min" | "max" | "indexOf" | "lastIndexOf" => 0,
        // optional types, quantity
        "optional.of"
        | "optional.none"
        | "optional.ofNonZeroValue"
        | "hasValue"
        | "value"
        | "or"
        | "orValue"
        | "optMap"
        | "optFlatMap"
        // `first()` and `last()` of a list come with the optional types,
        // not with the lists extension: the 1.34 API server (checking new
        // selectors against 1.33) accepts them (differential test).
        | "first"
        | "last" => 28,
        // No `sign`: the 1.37 API server finds no overload of it for a
        // quantity (checked by the differential test).
        "quantity" | "isQuantity" | "isGreaterThan" | "isLessThan" | "compareTo" | "add"
        | "sub" | "asApproximateFloat" | "asInteger" | "isInteger" => 28,
        // strings v2, sets
        "charAt" | "lowerAscii" | "upperAscii" | "replace" | "split" | "substring" | "trim"
        | "join" | "format" | "strings.quote" => 29,
        "sets.contains" | "sets.equivalent" | "sets.intersects" => 29,
        // IP and CIDR
        "ip"
        | "isIP"
        | "ip.isCanonical"
        | "family"
        | "isUnspecified"
        | "isLoopback"
        | "isLinkLocalMulticast"
        | "isLinkLocalUnicast"
        | "isGlobalUnicast"
        | "cidr"
        | "isCIDR"
        | "containsIP"
        | "containsCIDR"
        | "masked"
        | "prefixLength" => 30,
        // named formats, bindings
        "format.named"
        | "validate"
        | "format.dns1123Label"
        | "format.dns1123Subdomain"
        | "format.dns1035Label"
        | "format.qualifiedName"
        | "format.dns1123LabelPrefix"
        | "format.dns1123SubdomainPrefix"
        | "format.dns1035LabelPrefix"
        | "format.labelValue"
        | "format.uri"
        | "format.uuid"
        | "format.byte"
        | "format.date"
        | "format.datetime"
        | "cel.bind" => 31,
        // two-variable comprehensions (the 3-argument all/exists are checked by arity)
        "existsOne" | "transformList" | "transformMap" | "transformMapEntry" => 32,
        "semver" | "isSemver" | "major" | "minor" | "patch" => 33,
        // lists extension v3
        "slice" | "flatten" | "lists.range" | "distinct" | "reverse" | "sort" | "sortBy" => 34,
        // Kubernetes lists v1
        "includes" => 37,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_release_names() {
        for (text, want) in [
            ("1.34", Release::V1_34),
            ("v1.35.2", Release::V1_35),
            ("1.36.0-rc.1", Release::V1_36),
            ("v1.37.2+k3s1", Release::V1_37),
        ] {
            assert_eq!(text.parse::<Release>(), Ok(want), "{text}");
        }
        for bad in ["1.33", "2.34", "", "v1", "1.3"] {
            assert!(bad.parse::<Release>().is_err(), "{bad}");
        }
    }

    #[test]
    fn new_selectors_are_checked_one_minor_down() {
        assert_eq!(Release::V1_37.new_expressions(), 36);
        assert!(function_since("sort").is_some_and(|v| v > Release::V1_34.new_expressions()));
        assert!(function_since("sort").is_some_and(|v| v <= Release::V1_35.new_expressions()));
        assert!(function_since("includes").is_some_and(|v| v > Release::V1_37.new_expressions()));
        assert!(!Release::V1_35.has_multi_allocations(Release::V1_35.new_expressions()));
        assert!(Release::V1_37.has_multi_allocations(Release::V1_37.new_expressions()));
        assert_eq!(function_since("math.greatest"), None);
    }
}
