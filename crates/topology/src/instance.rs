//! Which EC2 instance type this node is, from DMI.
//!
//! EC2 writes the instance type into the DMI product name
//! (`devices/virtual/dmi/id/product_name`). Off EC2 that file holds a
//! vendor's model name, which does not parse as an instance type; callers
//! get an error naming the content and can treat the type as unknown.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::sysfs::{SysfsRoot, read_attr};

/// Path of the DMI product name below the sysfs root.
pub const DMI_PRODUCT_NAME: &str = "devices/virtual/dmi/id/product_name";

/// Why a string is not an instance type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not an EC2 instance type: {reason}")]
pub struct InstanceTypeError {
    pub input: String,
    pub reason: &'static str,
}

/// An EC2 instance type such as `trn2.48xlarge`: `<family>.<size>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceType {
    name: String,
    dot: usize,
}

impl InstanceType {
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The part before the first `.`: `trn2.48xlarge` → `trn2`,
    /// `trn3-dev0.48xlarge` → `trn3-dev0`.
    pub fn family(&self) -> &str {
        &self.name[..self.dot]
    }

    /// The part after the first `.`: `48xlarge`, `metal`.
    pub fn size(&self) -> &str {
        &self.name[self.dot + 1..]
    }

    /// Reads the instance type from DMI. `Ok(None)` when the file is absent
    /// (not a DMI platform, or a fixture without it).
    pub fn from_sysfs(root: &SysfsRoot) -> Result<Option<InstanceType>> {
        let path = root.join(DMI_PRODUCT_NAME);
        match read_attr(&path)? {
            None => Ok(None),
            Some(s) => s
                .parse()
                .map(Some)
                .map_err(|e: InstanceTypeError| Error::parse(&path, s, e.reason)),
        }
    }
}

impl FromStr for InstanceType {
    type Err = InstanceTypeError;

    fn from_str(input: &str) -> Result<Self, InstanceTypeError> {
        let err = |reason| InstanceTypeError {
            input: input.to_owned(),
            reason,
        };
        let (family, size) = input.split_once('.').ok_or_else(|| err("no '.'"))?;
        let ok_chars = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if family.is_empty() || !family.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err(err("family must start with a lowercase letter"));
        }
        if !ok_chars(family) {
            return Err(err("family has characters other than a-z, 0-9, '-'"));
        }
        if size.is_empty() || !ok_chars(size) {
            return Err(err("size must be non-empty a-z, 0-9, '-'"));
        }
        Ok(InstanceType {
            name: input.to_owned(),
            dot: family.len(),
        })
    }
}

impl fmt::Display for InstanceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families() {
        for (s, fam, size) in [
            ("trn2.48xlarge", "trn2", "48xlarge"),
            ("trn3-dev0.48xlarge", "trn3-dev0", "48xlarge"),
            ("p5.48xlarge", "p5", "48xlarge"),
            ("m5.metal", "m5", "metal"),
        ] {
            let t: InstanceType = s.parse().unwrap();
            assert_eq!((t.family(), t.size(), t.as_str()), (fam, size, s));
        }
        for bad in [
            "",
            "trn2",
            ".48xlarge",
            "trn2.",
            "Standard PC (Q35 + ICH9, 2009)",
            "TRN2.48XLARGE",
            "2x.large",
        ] {
            let e = bad.parse::<InstanceType>().unwrap_err();
            assert_eq!(e.input, bad);
        }
    }

    #[test]
    fn from_dmi() {
        let dir = tempfile::tempdir().unwrap();
        let root = SysfsRoot::new(dir.path());
        assert_eq!(InstanceType::from_sysfs(&root).unwrap(), None);
        let p = root.join(DMI_PRODUCT_NAME);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "trn2.48xlarge\n").unwrap();
        assert_eq!(
            InstanceType::from_sysfs(&root).unwrap().unwrap().family(),
            "trn2"
        );
        std::fs::write(&p, "PowerEdge R750\n").unwrap();
        let e = InstanceType::from_sysfs(&root).unwrap_err().to_string();
        assert!(
            e.contains("PowerEdge R750") && e.contains("product_name"),
            "{e}"
        );
    }
}
