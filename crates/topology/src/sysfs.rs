//! Reading sysfs attributes and links, relative to an injectable root.
//!
//! These helpers encode the sysfs conventions once: attributes end with a
//! newline (some, like Neuron's `core_count`, do not), ids are written as
//! `0x`-prefixed hex, an absent optional attribute is `Ok(None)` and not an
//! error, and a link whose target is gone is an error that names both ends.
//! The drivers reuse them for the trees this crate does not model
//! (`class/infiniband`, `class/infiniband_verbs`, `class/neuron_device`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::{Error, Result};

/// The directory that plays the role of `/sys`.
///
/// Everything this crate reads is below it, so tests and `--sysfs-root`
/// point the same code at generated fixtures or a host's sysfs mounted
/// elsewhere (e.g. `/host/sys` in a container).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysfsRoot {
    path: PathBuf,
}

impl Default for SysfsRoot {
    fn default() -> Self {
        SysfsRoot::new("/sys")
    }
}

impl SysfsRoot {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SysfsRoot { path: path.into() }
    }

    /// The root directory itself.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `rel` below the root (`rel` is written without a leading `/`).
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }

    /// `bus/pci/devices`: one link per PCI function.
    pub fn pci_devices_dir(&self) -> PathBuf {
        self.join("bus/pci/devices")
    }

    /// `devices`: the real tree that the bus and class links point into.
    pub fn devices_dir(&self) -> PathBuf {
        self.join("devices")
    }

    /// `class/<class>`, e.g. `class/infiniband`.
    pub fn class_dir(&self, class: &str) -> PathBuf {
        self.join("class").join(class)
    }

    /// `module/<name>/version`, the version of a loaded kernel module (absent
    /// for built-in modules and modules without a version tag).
    pub fn module_version(&self, module: &str) -> Result<Option<String>> {
        read_attr(self.join("module").join(module).join("version"))
    }
}

/// Reads an attribute and trims surrounding whitespace. `Ok(None)` when the
/// file does not exist.
pub fn read_attr(path: impl AsRef<Path>) -> Result<Option<String>> {
    let path = path.as_ref();
    match fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(s) => Ok(Some(s.trim().to_owned())),
            Err(e) => Err(Error::parse(
                path,
                String::from_utf8_lossy(e.as_bytes()).into_owned(),
                "not UTF-8",
            )),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Like [`read_attr`] but a missing file is an error.
pub fn read_required_attr(path: impl AsRef<Path>) -> Result<String> {
    let path = path.as_ref();
    read_attr(path)?.ok_or_else(|| Error::MissingAttribute {
        path: path.to_owned(),
    })
}

/// Reads and parses an attribute with [`FromStr`]; the error carries the
/// path, the content and the parser's message.
pub fn parse_attr<T>(path: impl AsRef<Path>) -> Result<Option<T>>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let path = path.as_ref();
    match read_attr(path)? {
        None => Ok(None),
        Some(s) => s
            .parse::<T>()
            .map(Some)
            .map_err(|e| Error::parse(path, s.clone(), e.to_string())),
    }
}

/// Parses a sysfs id such as `0x1d0f` (the `0x` is optional).
pub fn parse_hex_id(s: &str) -> Option<u32> {
    let s = s.trim();
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

/// Reads a hex id attribute (`vendor`, `device`, `class`, ...).
pub fn read_hex_attr(path: impl AsRef<Path>) -> Result<Option<u32>> {
    let path = path.as_ref();
    match read_attr(path)? {
        None => Ok(None),
        Some(s) => parse_hex_id(&s)
            .map(Some)
            .ok_or_else(|| Error::parse(path, s, "not a hexadecimal id")),
    }
}

/// Reads a 16-bit hex id attribute (`vendor`, `device`, `subsystem_*`).
pub fn read_hex_u16_attr(path: impl AsRef<Path>) -> Result<Option<u16>> {
    let path = path.as_ref();
    match read_hex_attr(path)? {
        None => Ok(None),
        Some(v) => u16::try_from(v)
            .map(Some)
            .map_err(|_| Error::parse(path, format!("{v:#x}"), "does not fit a 16-bit PCI id")),
    }
}

/// Resolves a symlink (and every link on the way) to an absolute, canonical
/// path. `Ok(None)` when the link itself does not exist; a link whose target
/// is gone is [`Error::DanglingLink`].
pub fn resolve_link(path: impl AsRef<Path>) -> Result<Option<PathBuf>> {
    let path = path.as_ref();
    let target = match fs::read_link(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // Not a symlink (EINVAL): canonicalize still gives the real path.
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => PathBuf::new(),
        Err(e) => return Err(Error::io(path, e)),
    };
    match fs::canonicalize(path) {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::DanglingLink {
            path: path.to_owned(),
            target,
        }),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// The last component of a symlink's target, without resolving it: the
/// kernel names a bound driver, a module or a class device this way
/// (`.../driver` → `../../bus/pci/drivers/efa` gives `efa`).
pub fn link_name(path: impl AsRef<Path>) -> Result<Option<String>> {
    let path = path.as_ref();
    match fs::read_link(path) {
        Ok(target) => match target.file_name().and_then(|n| n.to_str()) {
            Some(name) => Ok(Some(name.to_owned())),
            None => Err(Error::parse(
                path,
                target.display().to_string(),
                "link target has no usable last component",
            )),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// The entry names of a directory, sorted. `Ok(None)` when the directory
/// does not exist (a class that no loaded driver registered, say).
pub fn list_dir(path: impl AsRef<Path>) -> Result<Option<Vec<String>>> {
    let path = path.as_ref();
    let entries = match fs::read_dir(path) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(path, e))?;
        match entry.file_name().into_string() {
            Ok(n) => names.push(n),
            Err(raw) => {
                return Err(Error::parse(
                    path,
                    raw.to_string_lossy().into_owned(),
                    "entry name is not UTF-8",
                ));
            }
        }
    }
    names.sort();
    Ok(Some(names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_ids() {
        let cases: &[(&str, Option<u32>)] = &[
            ("0x1d0f", Some(0x1d0f)),
            ("0X10DE", Some(0x10de)),
            ("efa1", Some(0xefa1)),
            ("0x020000\n", Some(0x020000)),
            ("0x", None),
            ("", None),
            ("banana", None),
            ("0x1234567890", None),
            ("-1", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_hex_id(input), *want, "input {input:?}");
        }
    }

    #[test]
    fn attrs_missing_garbage_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(d.join("num"), "banana\n").unwrap();
        fs::write(d.join("id"), "0x12345\n").unwrap();
        fs::write(d.join("ok"), " 7 \n").unwrap();
        std::os::unix::fs::symlink("nowhere", d.join("dangling")).unwrap();
        std::os::unix::fs::symlink("ok", d.join("good")).unwrap();

        assert_eq!(read_attr(d.join("absent")).unwrap(), None);
        assert_eq!(read_attr(d.join("ok")).unwrap().as_deref(), Some("7"));
        assert_eq!(parse_attr::<u32>(d.join("ok")).unwrap(), Some(7));
        let err = parse_attr::<i32>(d.join("num")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("banana") && msg.contains("num"), "{msg}");
        let err = read_hex_u16_attr(d.join("id")).unwrap_err();
        assert!(err.to_string().contains("0x12345"), "{err}");
        assert!(matches!(
            read_required_attr(d.join("absent")),
            Err(Error::MissingAttribute { .. })
        ));

        assert!(matches!(
            resolve_link(d.join("dangling")),
            Err(Error::DanglingLink { .. })
        ));
        assert_eq!(resolve_link(d.join("absent")).unwrap(), None);
        assert_eq!(
            resolve_link(d.join("good")).unwrap(),
            Some(fs::canonicalize(d.join("ok")).unwrap())
        );
        assert_eq!(
            link_name(d.join("dangling")).unwrap().as_deref(),
            Some("nowhere")
        );
        assert_eq!(list_dir(d.join("absent")).unwrap(), None);
        assert_eq!(list_dir(d).unwrap().unwrap().len(), 5);
    }
}
