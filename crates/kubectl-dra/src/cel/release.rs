//! Which CEL functions the DRA environment of each Kubernetes release has.
//!
//! Two environments matter per release (`k8s.io/apiserver/pkg/cel/environment`
//! and `k8s.io/dynamic-resource-allocation/cel`, v0.37.2 and v0.38.0-beta.0
//! read for this):
//!
//! - the API server validates a *new* selector against the environment of
//!   its minimum compatibility version, one minor below its own (1.38 checks
//!   new claims against 1.37). What is missing there is an invalid selector:
//!   the claim is refused on create.
//! - the scheduler evaluates *stored* selectors with everything its own
//!   version has. That is what the evaluation here uses.
//!
//! The table below is the base environment's versioned options plus the DRA
//! compiler's own, with the feature gates at their defaults:
//!
//! | since | what |
//! |---|---|
//! | always (1.0) | standard library (with the type names `int`, `string`, `net.IP`, … as values), URLs, regex `find`/`findAll`, Kubernetes lists v0 |
//! | 1.28 | optional types v2 (with a list's `first()` and `last()`, `optional.unwrap`, `unwrapOpt`), quantity |
//! | 1.29 | strings extension v2, sets |
//! | 1.30 | IP and CIDR (v0) |
//! | 1.31 | named formats (`format.*`), `cel.bind` |
//! | 1.32 | two-variable comprehensions |
//! | 1.33 | semver |
//! | 1.34 | lists extension v3 (`slice`, `flatten`, `lists.range`, `distinct`, `reverse`, `sort`, `sortBy`); `device.allowMultipleAllocations` when `DRAConsumableCapacity` is on (beta, on by default from 1.36, GA in 1.38) |
//! | 1.37 | Kubernetes lists v1 (`includes`) |
//! | 1.38 | CIDR library v1 in place of v0: adds `cidr(…).isMask()` |
//!
//! What a release's binaries do whatever the environment version, and so
//! also to the one their API server checks new selectors against:
//!
//! - From 1.38 Kubernetes is built with cel-go v0.33 (`cel.dev/cel-go`; 1.37
//!   with `github.com/google/cel-go` v0.29). Its cost estimate gives a type
//!   value a size of one, so `==` and `!=` on type values
//!   (`type(device.attributes["d"].a) == int`) are within the cost limit;
//!   the 1.37 API server estimates them unbounded and refuses them as too
//!   complex ([`Release::sizes_type_values`]). Ordering a NaN (`<`, `<=`,
//!   `>`, `>=`) is false instead of an error ([`Release::orders_nan`]).
//! - What cel-go v0.33 would change besides, 1.38's base environment keeps
//!   as 1.37 had it: optional types pinned at version 2 (so no `hasValue(v)`
//!   of v3), non-strict timestamp parsing (`time.Parse(RFC3339, …)`: a
//!   one-digit hour, a `,` before the fraction, offsets up to `+24:60`, and
//!   no range check on an offset given to `getHours("+25:00")` and the other
//!   accessors; see `timestamps`), cost model version 0 and no limit on the
//!   number of AST nodes.
//!
//! A version newer than every release modelled here (a 1.39 API server) is
//! judged with the newest environment, with a warning on stderr
//! ([`KubernetesVersion`]); one older than 1.34 is an error.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

/// A Kubernetes minor release whose DRA CEL environment we model. The
/// default, what `--kubernetes-version` is when not given, is the project's
/// main release: 1.37 until 1.38.0 is out (1.38 is at its first beta).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Release {
    V1_34,
    V1_35,
    V1_36,
    #[default]
    V1_37,
    V1_38,
}

impl Release {
    pub const ALL: [Release; 5] = [
        Release::V1_34,
        Release::V1_35,
        Release::V1_36,
        Release::V1_37,
        Release::V1_38,
    ];

    /// The newest release modelled: what a newer version is judged as.
    pub const NEWEST: Release = Release::V1_38;

    pub fn minor(self) -> u32 {
        match self {
            Release::V1_34 => 34,
            Release::V1_35 => 35,
            Release::V1_36 => 36,
            Release::V1_37 => 37,
            Release::V1_38 => 38,
        }
    }

    /// The environment version the API server checks new selectors against.
    pub fn new_expressions(self) -> u32 {
        self.minor() - 1
    }

    /// Whether `device.allowMultipleAllocations` is declared in the
    /// environment of version `env` (the `DRAConsumableCapacity` gate at its
    /// default: alpha and off in 1.34 and 1.35, beta and on from 1.36, GA in
    /// 1.38).
    pub fn has_multi_allocations(self, env: u32) -> bool {
        env >= 34 && self.minor() >= 36
    }

    /// Whether the cost estimate of this release's API server knows the size
    /// of a type value (cel-go v0.33, `common/cost/estimator.go`: `TypeKind`
    /// is a scalar). Before, `==` between two operands of unknown size costs
    /// the most a string comparison can, and a type value's size is unknown.
    pub fn sizes_type_values(self) -> bool {
        self >= Release::V1_38
    }

    /// Whether this release's scheduler orders a NaN as not less, not
    /// greater and not equal (cel-go v0.33, `common/stdlib/standard.go`)
    /// rather than failing with "NaN values cannot be ordered".
    pub fn orders_nan(self) -> bool {
        self >= Release::V1_38
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor())
    }
}

/// A version string that names no release we model, nor a newer one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Kubernetes version {0:?} is not 1.34 or later: kubectl-dra models the CEL environments of 1.34 to {newest} (a newer 1.x is judged as {newest})",
    newest = Release::NEWEST
)]
pub struct UnknownRelease(pub String);

/// A Kubernetes version as given (`--kubernetes-version`, an API server's
/// `gitVersion`), read as the release whose environment judges selectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesVersion {
    /// The text as given.
    pub given: String,
    /// The release of the same minor, or [`Release::NEWEST`] for a newer one.
    pub release: Release,
    /// The minor given, when it is newer than every release modelled.
    pub newer_minor: Option<u32>,
}

/// Whether the warning about a newer version was printed by this process.
static WARNED: AtomicBool = AtomicBool::new(false);

impl KubernetesVersion {
    /// Accepts `1.36`, `v1.36`, `v1.36.2`, `1.36.0-rc.1`, `v1.38.0-beta.0`,
    /// `v1.37.2+k3s1`: what an API server reports as its `gitVersion`.
    pub fn parse(text: &str) -> Result<KubernetesVersion, UnknownRelease> {
        let unknown = || UnknownRelease(text.to_string());
        let trimmed = text.trim();
        let trimmed = trimmed.strip_prefix('v').unwrap_or(trimmed);
        let mut parts = trimmed.split(['.', '-', '+']);
        let minor = match (parts.next(), parts.next()) {
            (Some("1"), Some(minor)) if minor.bytes().all(|b| b.is_ascii_digit()) => {
                minor.parse::<u32>().map_err(|_| unknown())?
            }
            _ => return Err(unknown()),
        };
        if minor > Release::NEWEST.minor() {
            return Ok(KubernetesVersion {
                given: text.trim().to_string(),
                release: Release::NEWEST,
                newer_minor: Some(minor),
            });
        }
        let release = Release::ALL
            .into_iter()
            .find(|r| r.minor() == minor)
            .ok_or_else(unknown)?;
        Ok(KubernetesVersion {
            given: text.trim().to_string(),
            release,
            newer_minor: None,
        })
    }

    /// What to tell the user when the version is newer than every release
    /// modelled: its selectors are judged with the newest environment.
    pub fn warning(&self) -> Option<String> {
        self.newer_minor.map(|minor| {
            format!(
                "warning: Kubernetes {} (1.{minor}) is newer than the newest release kubectl-dra models ({}): its selectors are judged with the CEL environment of {}, which may refuse or evaluate differently what 1.{minor} accepts",
                self.given, self.release, self.release
            )
        })
    }

    /// Prints [`KubernetesVersion::warning`] on stderr, the first time in
    /// this process that there is one; `true` when it printed.
    pub fn warn_once(&self) -> bool {
        match self.warning() {
            Some(w) if !WARNED.swap(true, Ordering::Relaxed) => {
                eprintln!("{w}");
                true
            }
            _ => false,
        }
    }
}

impl FromStr for Release {
    type Err = UnknownRelease;

    /// [`KubernetesVersion::parse`]; a newer version is the newest release,
    /// with the warning printed once on stderr.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let version = KubernetesVersion::parse(s)?;
        version.warn_once();
        Ok(version.release)
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
        | "last"
        // optional types v2, as `first` and `last`
        | "optional.unwrap"
        | "unwrapOpt" => 28,
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
        // CIDR library v1
        "isMask" => 38,
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
            // what a 1.38 API server in its first beta reports as gitVersion
            ("v1.38.0-beta.0", Release::V1_38),
            (" v1.38.1-eks-4f2a1c0 ", Release::V1_38),
        ] {
            assert_eq!(text.parse::<Release>(), Ok(want), "{text}");
            let version = KubernetesVersion::parse(text).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(version.newer_minor, None, "{text}");
            assert_eq!(version.warning(), None, "{text}");
        }
        for bad in ["1.33", "2.34", "", "v1", "1.3", "1.x", "1.-39", "v1.0.0"] {
            assert!(bad.parse::<Release>().is_err(), "{bad}");
        }
        let old = "v1.33.4".parse::<Release>().err().map(|e| e.to_string());
        assert_eq!(
            old.as_deref(),
            Some(
                "Kubernetes version \"v1.33.4\" is not 1.34 or later: kubectl-dra models the CEL environments of 1.34 to 1.38 (a newer 1.x is judged as 1.38)"
            )
        );
    }

    /// A release newer than every one modelled is judged as the newest,
    /// with a warning that names both; the warning is printed once.
    #[test]
    fn a_newer_release_is_judged_as_the_newest_with_a_warning() {
        for (text, minor) in [("v1.39.0", 39), ("1.40", 40), ("v1.39.0-alpha.1", 39)] {
            let version = KubernetesVersion::parse(text).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(version.release, Release::NEWEST, "{text}");
            assert_eq!(version.newer_minor, Some(minor), "{text}");
            let warning = version.warning().unwrap_or_default();
            assert!(warning.starts_with("warning: "), "{warning}");
            assert!(warning.contains(text), "{warning}");
            assert!(
                warning.contains("newest release kubectl-dra models (1.38)"),
                "{warning}"
            );
            assert_eq!(text.parse::<Release>(), Ok(Release::NEWEST), "{text}");
        }
        // Parsed above: whichever printed first, nothing prints again.
        let again = KubernetesVersion::parse("v1.41.0").map(|v| v.warn_once());
        assert_eq!(again, Ok(false));
        assert!(WARNED.load(Ordering::Relaxed));
    }

    #[test]
    fn new_selectors_are_checked_one_minor_down() {
        assert_eq!(Release::V1_37.new_expressions(), 36);
        assert_eq!(Release::V1_38.new_expressions(), 37);
        assert!(function_since("sort").is_some_and(|v| v > Release::V1_34.new_expressions()));
        assert!(function_since("sort").is_some_and(|v| v <= Release::V1_35.new_expressions()));
        assert!(function_since("includes").is_some_and(|v| v > Release::V1_37.new_expressions()));
        assert!(function_since("includes").is_some_and(|v| v <= Release::V1_38.new_expressions()));
        // CIDR v1: in the 1.38 environment, which no API server up to 1.38
        // checks new selectors against
        assert_eq!(function_since("isMask"), Some(38));
        assert!(!Release::V1_35.has_multi_allocations(Release::V1_35.new_expressions()));
        assert!(Release::V1_37.has_multi_allocations(Release::V1_37.new_expressions()));
        assert!(Release::V1_38.has_multi_allocations(Release::V1_38.new_expressions()));
        assert_eq!(function_since("math.greatest"), None);
    }

    /// What the 1.38 binaries change whatever the environment version.
    #[test]
    fn cel_go_v0_33_comes_with_1_38() {
        for release in Release::ALL {
            let v0_33 = release >= Release::V1_38;
            assert_eq!(release.sizes_type_values(), v0_33, "{release}");
            assert_eq!(release.orders_nan(), v0_33, "{release}");
        }
        // The main release stays the default until 1.38.0 is out.
        assert_eq!(Release::default(), Release::V1_37);
    }
}
