//! Semantic versions (SemVer 2.0) as CEL values, for `version` attributes and
//! the `semver()` functions the scheduler's CEL environment adds
//! (`k8s.io/apiserver/pkg/cel/library/semverlib.go`).
//!
//! Precedence follows SemVer 2.0 §11: numeric fields, then a release sorts
//! after its pre-releases, identifiers compared one by one (numeric < text);
//! build metadata is ignored, also by equality.

use std::cmp::Ordering;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
enum PreRelease {
    Numeric(u64),
    Text(String),
}

impl PartialOrd for PreRelease {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PreRelease {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PreRelease::Numeric(a), PreRelease::Numeric(b)) => a.cmp(b),
            (PreRelease::Numeric(_), PreRelease::Text(_)) => Ordering::Less,
            (PreRelease::Text(_), PreRelease::Numeric(_)) => Ordering::Greater,
            (PreRelease::Text(a), PreRelease::Text(b)) => a.cmp(b),
        }
    }
}

/// A parsed semantic version.
#[derive(Debug, Clone)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    pre: Vec<PreRelease>,
    build: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a semantic version: {why}")]
pub struct VersionError {
    text: String,
    why: &'static str,
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

impl Version {
    /// Strict SemVer 2.0: `MAJOR.MINOR.PATCH[-pre][+build]`, no leading zeros.
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        Self::parse_with(text, false)
    }

    /// With `normalize`, as `semver(text, true)`: a leading `v` is dropped,
    /// missing minor/patch become 0, and leading zeros are tolerated.
    pub fn parse_with(text: &str, normalize: bool) -> Result<Self, VersionError> {
        let err = |why| VersionError {
            text: text.to_string(),
            why,
        };
        let mut rest = text;
        if normalize {
            rest = rest.strip_prefix('v').unwrap_or(rest);
        }
        let (rest, build) = match rest.split_once('+') {
            Some((r, b)) => (r, Some(b)),
            None => (rest, None),
        };
        let (core, pre) = match rest.split_once('-') {
            Some((c, p)) => (c, Some(p)),
            None => (rest, None),
        };
        let mut numbers: Vec<&str> = core.split('.').collect();
        if normalize {
            while numbers.len() < 3 {
                numbers.push("0");
            }
        }
        if numbers.len() != 3 {
            return Err(err("needs exactly MAJOR.MINOR.PATCH"));
        }
        let mut parsed = [0u64; 3];
        for (slot, part) in parsed.iter_mut().zip(&numbers) {
            if part.is_empty() || !part.chars().all(|c| c.is_ascii_digit()) {
                return Err(err("a version number is not a non-negative integer"));
            }
            if !normalize && part.len() > 1 && part.starts_with('0') {
                return Err(err("a version number has a leading zero"));
            }
            *slot = part
                .parse()
                .map_err(|_| err("a version number is too large"))?;
        }
        let mut pre_ids = Vec::new();
        if let Some(pre) = pre {
            for id in pre.split('.') {
                if id.is_empty() || !id.chars().all(is_ident_char) {
                    return Err(err(
                        "a pre-release identifier is empty or has a bad character",
                    ));
                }
                if id.chars().all(|c| c.is_ascii_digit()) {
                    if id.len() > 1 && id.starts_with('0') {
                        return Err(err("a numeric pre-release identifier has a leading zero"));
                    }
                    let n = id
                        .parse()
                        .map_err(|_| err("a pre-release number is too large"))?;
                    pre_ids.push(PreRelease::Numeric(n));
                } else {
                    pre_ids.push(PreRelease::Text(id.to_string()));
                }
            }
        }
        let mut build_ids = Vec::new();
        if let Some(build) = build {
            for id in build.split('.') {
                if id.is_empty() || !id.chars().all(is_ident_char) {
                    return Err(err("a build identifier is empty or has a bad character"));
                }
                build_ids.push(id.to_string());
            }
        }
        Ok(Version {
            major: parsed[0],
            minor: parsed[1],
            patch: parsed[2],
            pre: pre_ids,
            build: build_ids,
        })
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => self.pre.cmp(&other.pre),
            })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        for (i, id) in self.pre.iter().enumerate() {
            f.write_str(if i == 0 { "-" } else { "." })?;
            match id {
                PreRelease::Numeric(n) => write!(f, "{n}")?,
                PreRelease::Text(t) => f.write_str(t)?,
            }
        }
        if !self.build.is_empty() {
            write!(f, "+{}", self.build.join("."))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn precedence_follows_semver_2() {
        // The example chain of SemVer 2.0 §11.
        let chain = [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.0.1",
            "1.1.0",
            "2.0.0",
            "10.0.0",
        ];
        for pair in chain.windows(2) {
            assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
        }
        assert_eq!(v("1.0.0+build.1"), v("1.0.0+other"));
    }

    #[test]
    fn strict_and_normalized_parsing() {
        for bad in [
            "1", "1.0", "v1.0.0", "01.0.0", "1.0.0-", "1.0.0-01", "1.0.0+", "a.b.c", "",
        ] {
            assert!(Version::parse(bad).is_err(), "{bad}");
        }
        let n = |s| Version::parse_with(s, true).map(|v| v.to_string());
        assert_eq!(n("v1").as_deref(), Ok("1.0.0"));
        assert_eq!(n("1.02").as_deref(), Ok("1.2.0"));
        assert_eq!(n("v1.2.3-rc.1+b").as_deref(), Ok("1.2.3-rc.1+b"));
    }
}
