//! The one error type of the crate.
//!
//! Every variant names the sysfs path it came from and, where a value was
//! read, the offending content, so that a driver's warning is enough to find
//! the broken file on the node without reproducing the scan.

use std::io;
use std::path::PathBuf;

use crate::address::{PciAddress, PciAddressError};

/// What went wrong while reading one piece of sysfs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file or directory exists (or was expected to) but could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The file was read but its content is not what the kernel writes there.
    #[error("{path}: cannot parse {content:?}: {reason}")]
    Parse {
        path: PathBuf,
        content: String,
        reason: String,
    },

    /// An attribute every device of this kind has is absent.
    #[error("{path}: required attribute is missing")]
    MissingAttribute { path: PathBuf },

    /// A symlink whose target does not exist.
    #[error("{path}: dangling symlink to {target}")]
    DanglingLink { path: PathBuf, target: PathBuf },

    /// A symlink that resolves outside the place the kernel puts such targets.
    #[error("{path}: resolves to {target}, which is not under {expected}")]
    UnexpectedLinkTarget {
        path: PathBuf,
        target: PathBuf,
        expected: PathBuf,
    },

    /// A device that was listed a moment ago is gone (hot-unplug, driver
    /// unbind, or a racing scan). Callers usually skip it quietly.
    #[error("PCI device {address} vanished while it was being read ({path})")]
    DeviceVanished { address: PciAddress, path: PathBuf },

    /// A name in sysfs that should be a PCI address is not one.
    #[error("{path}: {source}")]
    PciAddress {
        path: PathBuf,
        #[source]
        source: PciAddressError,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn parse(
        path: impl Into<PathBuf>,
        content: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Error::Parse {
            path: path.into(),
            content: content.into(),
            reason: reason.into(),
        }
    }
}

/// Result alias of the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
