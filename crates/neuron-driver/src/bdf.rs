//! Which PCI function a chip is: the `NEURON_IOCTL_DEVICE_BDF` ioctl.
//!
//! `/sys/class/neuron_device/neuronN` is a virtual device without a PCI
//! parent, and the chip index is not the PCI enumeration order, so sysfs
//! alone cannot say where chip N sits on the PCI tree. The kernel driver
//! answers that with an ioctl on `/dev/neuronN` (what `neuron-ls` uses):
//! `_IOR('N', 101, struct neuron_ioctl_device_bdf *)`, filling
//! `{ u32 bus_number; u8 slot; u8 func; }` for PCI domain 0.
//!
//! The lookup sits behind [`BdfSource`] so that tests can answer it for
//! fixtures, whose device nodes are plain files or character devices
//! without a driver behind them. Limits of the real lookup:
//! - opening the node needs the device cgroup to allow it (`privileged` in
//!   the chart); an unprivileged container gets `EPERM`;
//! - the open must not be `O_WRONLY`: the kernel driver treats such an fd as
//!   "free access" and answers only a few misc ioctls on it, not this one;
//!   we open read-only, which makes the kernel driver count our process as
//!   attached for the instant the fd is open (as `neuron-ls` does). Callers
//!   therefore look a chip up once per appearance, never on every rescan
//!   (see [`crate::discovery::BdfCache`]).

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use topology::PciAddress;

/// Why a chip's PCI address could not be learnt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BdfError {
    #[error("cannot open {path}: {errno}")]
    Open { path: PathBuf, errno: Errno },
    #[error("NEURON_IOCTL_DEVICE_BDF on {path} failed: {errno}")]
    Ioctl { path: PathBuf, errno: Errno },
    #[error(
        "NEURON_IOCTL_DEVICE_BDF on {path} answered an impossible address (bus {bus:#x}, slot {slot:#x}, function {func})"
    )]
    Invalid {
        path: PathBuf,
        bus: u32,
        slot: u8,
        func: u8,
    },
}

impl BdfError {
    /// A short, stable label of the failure kind (for "logged once" and metrics).
    pub fn kind(&self) -> String {
        match self {
            BdfError::Open { errno, .. } => format!("open:{errno:?}"),
            BdfError::Ioctl { errno, .. } => format!("ioctl:{errno:?}"),
            BdfError::Invalid { .. } => "invalid".to_owned(),
        }
    }
}

/// Answers "which PCI function is the chip behind this device node?".
pub trait BdfSource: Send + Sync {
    fn chip_address(&self, device_node: &Path) -> Result<PciAddress, BdfError>;
}

/// The kernel's answer, as the ioctl writes it.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct NeuronIoctlDeviceBdf {
    pub bus_number: u32,
    pub slot: u8,
    pub func: u8,
}

/// The size field of the request code: the kernel header declares the ioctl
/// with a *pointer* type, so the size is that of a pointer, not of the struct
/// (both happen to be 8 on 64-bit Linux).
const DEVICE_BDF_SIZE: usize = std::mem::size_of::<*mut NeuronIoctlDeviceBdf>();
const _: () = assert!(std::mem::size_of::<NeuronIoctlDeviceBdf>() <= 8);

/// The request code, `_IOR('N', 101, <pointer>)`.
pub const NEURON_IOCTL_DEVICE_BDF: nix::sys::ioctl::ioctl_num_type =
    nix::request_code_read!(b'N', 101, DEVICE_BDF_SIZE);

// Generates `unsafe fn neuron_device_bdf(fd, *mut NeuronIoctlDeviceBdf)`.
#[allow(unsafe_code)]
mod sys {
    nix::ioctl_read_bad!(
        neuron_device_bdf,
        super::NEURON_IOCTL_DEVICE_BDF,
        super::NeuronIoctlDeviceBdf
    );
}

/// Turns the kernel's answer into an address (domain 0).
pub fn address_from_answer(
    path: &Path,
    answer: NeuronIoctlDeviceBdf,
) -> Result<PciAddress, BdfError> {
    let invalid = || BdfError::Invalid {
        path: path.to_owned(),
        bus: answer.bus_number,
        slot: answer.slot,
        func: answer.func,
    };
    let bus = u8::try_from(answer.bus_number).map_err(|_| invalid())?;
    PciAddress::new(0, bus, answer.slot, answer.func).ok_or_else(invalid)
}

/// The real lookup: open the node read-only, ask, close.
#[derive(Debug, Default, Clone, Copy)]
pub struct NeuronIoctl;

impl BdfSource for NeuronIoctl {
    fn chip_address(&self, device_node: &Path) -> Result<PciAddress, BdfError> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_CLOEXEC)
            .open(device_node)
            .map_err(|e| BdfError::Open {
                path: device_node.to_owned(),
                errno: Errno::from_raw(e.raw_os_error().unwrap_or(0)),
            })?;
        let mut answer = NeuronIoctlDeviceBdf::default();
        // SAFETY: `file` is an open descriptor for the duration of the call,
        // `answer` is a live, writable, properly aligned `repr(C)` struct of
        // the layout the kernel writes (u32, u8, u8; 8 bytes with padding),
        // and the request code encodes a read of at most that many bytes.
        #[allow(unsafe_code)]
        let result = unsafe { sys::neuron_device_bdf(file.as_raw_fd(), &mut answer) };
        result.map_err(|errno| BdfError::Ioctl {
            path: device_node.to_owned(),
            errno,
        })?;
        address_from_answer(device_node, answer)
    }
}

/// A fixed table, for tests and fixtures: device node path → answer.
#[derive(Debug, Default, Clone)]
pub struct StaticBdf {
    pub answers: Vec<(PathBuf, Result<PciAddress, BdfError>)>,
}

impl BdfSource for StaticBdf {
    fn chip_address(&self, device_node: &Path) -> Result<PciAddress, BdfError> {
        self.answers
            .iter()
            .find(|(p, _)| p == device_node)
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| {
                Err(BdfError::Open {
                    path: device_node.to_owned(),
                    errno: Errno::ENOENT,
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_code_matches_the_kernel_header() {
        // _IOR('N', 101, 8 bytes): dir=read(2)<<30 | size 8<<16 | 'N'<<8 | 101.
        assert_eq!(format!("{NEURON_IOCTL_DEVICE_BDF:#x}"), "0x80084e65");
        assert_eq!(std::mem::size_of::<NeuronIoctlDeviceBdf>(), 8);
    }

    #[test]
    fn answers_become_addresses() {
        let p = Path::new("/dev/neuron0");
        let ok = |bus, slot, func| {
            address_from_answer(
                p,
                NeuronIoctlDeviceBdf {
                    bus_number: bus,
                    slot,
                    func,
                },
            )
        };
        assert_eq!(ok(0xcc, 0, 0).unwrap().to_string(), "0000:cc:00.0");
        assert_eq!(ok(0x10, 0x1c, 1).unwrap().to_string(), "0000:10:1c.1");
        for (bus, slot, func) in [(0x100, 0, 0), (0x10, 0x20, 0), (0x10, 0, 8)] {
            let e = ok(bus, slot, func).unwrap_err();
            assert!(matches!(e, BdfError::Invalid { .. }), "{e}");
            assert!(e.to_string().contains("/dev/neuron0"), "{e}");
        }
    }

    #[test]
    fn plain_file_gets_enotty_and_missing_node_enoent() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("neuron0");
        std::fs::write(&node, "").unwrap();
        let e = NeuronIoctl.chip_address(&node).unwrap_err();
        assert_eq!(
            e,
            BdfError::Ioctl {
                path: node.clone(),
                errno: Errno::ENOTTY
            }
        );
        assert_eq!(e.kind(), "ioctl:ENOTTY");
        let missing = dir.path().join("neuron9");
        assert!(matches!(
            NeuronIoctl.chip_address(&missing),
            Err(BdfError::Open {
                errno: Errno::ENOENT,
                ..
            })
        ));
    }

    #[test]
    fn char_device_without_a_driver_is_enxio() {
        use nix::sys::stat::{Mode, SFlag, makedev, mknod};
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("neuron0");
        // Major 245 has no driver here (as in the fixtures). Without
        // CAP_MKNOD this case cannot be built; the plain-file case above
        // still covers the fallback.
        if mknod(
            &node,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            makedev(245, 0),
        )
        .is_err()
        {
            eprintln!("skipping: mknod not permitted");
            return;
        }
        let e = NeuronIoctl.chip_address(&node).unwrap_err();
        assert!(
            matches!(
                e,
                BdfError::Open {
                    errno: Errno::ENXIO | Errno::ENODEV,
                    ..
                }
            ),
            "{e}"
        );
    }
}
