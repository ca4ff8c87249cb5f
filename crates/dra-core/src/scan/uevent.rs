//! Kernel uevents (`NETLINK_KOBJECT_UEVENT`): how a driver learns within
//! milliseconds that a device appeared, vanished or was (un)bound, without
//! polling sysfs (which gives no inotify events).
//!
//! Listens on multicast group 1 (events the kernel sends itself, not udev's
//! re-broadcasts). A driver forwards the events of the subsystems it cares
//! about into its rescan loop ([`forward_uevents`]) and keeps a periodic
//! rescan as the fallback for lost events. Limits: uevents reach a pod's
//! network namespace only when it is owned by the initial user namespace
//! (true for ordinary pods, not for user-namespaced ones).

use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, setsockopt,
    socket, sockopt,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

/// Kernel uevent multicast group (1 = kernel, 2 = udev re-broadcasts).
const KERNEL_UEVENT_GROUP: u32 = 1;
/// Receive buffer asked for, so a burst (driver reload of 32 devices) fits.
const UEVENT_RCVBUF: usize = 1 << 20;

/// One kernel uevent, reduced to what the watcher looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub struct Uevent {
    pub action: String,
    pub devpath: String,
    pub subsystem: Option<String>,
}

impl Uevent {
    /// Parses a kernel uevent datagram: `ACTION@DEVPATH\0KEY=VALUE\0...`.
    /// `None` for anything else (including udev's `libudev` messages).
    #[cfg_attr(
        not(any(feature = "testing", feature = "fuzzing")),
        allow(unreachable_pub)
    )]
    pub fn parse(datagram: &[u8]) -> Option<Uevent> {
        let mut fields = datagram
            .split(|b| *b == 0)
            .filter(|f| !f.is_empty())
            .map(std::str::from_utf8);
        let header = fields.next()?.ok()?;
        let (action, devpath) = header.split_once('@')?;
        if action.is_empty() || !devpath.starts_with('/') {
            return None;
        }
        let mut subsystem = None;
        for field in fields {
            if let Some(v) = field.ok().and_then(|f| f.strip_prefix("SUBSYSTEM=")) {
                subsystem = Some(v.to_owned());
            }
        }
        Some(Uevent {
            action: action.to_owned(),
            devpath: devpath.to_owned(),
            subsystem,
        })
    }

    /// Whether the event comes from one of `subsystems` (e.g. `pci`).
    #[cfg_attr(
        not(any(feature = "testing", feature = "fuzzing")),
        allow(unreachable_pub)
    )]
    pub fn in_subsystems(&self, subsystems: &[&str]) -> bool {
        self.subsystem
            .as_deref()
            .is_some_and(|s| subsystems.contains(&s))
    }
}

/// The uevent socket could not be opened.
#[derive(Debug, thiserror::Error)]
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub enum UeventError {
    #[error("netlink uevent socket: {op}: {source}")]
    Socket {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn sock_err(op: &'static str) -> impl FnOnce(nix::Error) -> UeventError {
    move |e| UeventError::Socket {
        op,
        source: std::io::Error::from(e),
    }
}

/// A non-blocking `NETLINK_KOBJECT_UEVENT` socket on the kernel's group.
#[derive(Debug)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct UeventSocket {
    fd: AsyncFd<OwnedFd>,
}

impl UeventSocket {
    /// Opens and binds the socket. Needs a Tokio runtime.
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn open() -> Result<Self, UeventError> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Datagram,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkKObjectUEvent,
        )
        .map_err(sock_err("socket"))?;
        // Best effort: a smaller buffer only means more reliance on rescans.
        if let Err(error) = setsockopt(&fd, sockopt::RcvBuf, &UEVENT_RCVBUF) {
            tracing::debug!(%error, "cannot enlarge the uevent receive buffer");
        }
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, KERNEL_UEVENT_GROUP))
            .map_err(sock_err("bind"))?;
        // SAFETY: `register` requires that the descriptor stays open and the
        // same for the AsyncFd's lifetime. The AsyncFd owns the `OwnedFd`
        // (nobody else can close or replace it) and `OwnedFd::as_raw_fd`
        // always returns the descriptor it was created with.
        #[allow(unsafe_code)]
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| UeventError::Socket {
            op: "register with the runtime",
            source: std::io::Error::from(e),
        })?;
        Ok(UeventSocket { fd })
    }

    /// The next datagram. `Err(ENOBUFS)` means events were lost.
    pub(crate) async fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| {
                recv(fd.get_ref().as_raw_fd(), buf, MsgFlags::empty()).map_err(std::io::Error::from)
            }) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }
}

/// Reads uevents and sends `trigger` on `triggers` for each event of one of
/// `subsystems`, and for lost events (socket overrun). A full channel
/// already holds a pending trigger, so nothing is queued twice. Returns when
/// the receiver is gone or the socket fails.
pub(crate) async fn forward_uevents<T: Clone + Send>(
    socket: UeventSocket,
    subsystems: &[&str],
    triggers: mpsc::Sender<T>,
    trigger: T,
) {
    let mut buf = vec![0u8; 8192];
    loop {
        let relevant = match socket.recv(&mut buf).await {
            Ok(n) => Uevent::parse(&buf[..n]).is_some_and(|e| {
                tracing::trace!(action = %e.action, devpath = %e.devpath, subsystem = ?e.subsystem, "uevent");
                e.in_subsystems(subsystems)
            }),
            // Overrun: something happened that we did not see; rescan.
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => true,
            Err(error) => {
                tracing::warn!(%error, "uevent socket failed; relying on periodic rescans");
                return;
            }
        };
        if relevant
            && let Err(mpsc::error::TrySendError::Closed(_)) = triggers.try_send(trigger.clone())
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_uevents() {
        const EFA: &[&str] = &["pci", "infiniband", "infiniband_verbs"];
        let add = b"add@/devices/pci0000:44/0000:44:01.0/0000:45:00.0/0000:46:00.0/0000:4f:00.0\0ACTION=add\0DEVPATH=/devices/pci0000:44/0000:44:01.0/0000:45:00.0/0000:46:00.0/0000:4f:00.0\0SUBSYSTEM=pci\0PCI_ID=1D0F:EFA1\0SEQNUM=1234\0";
        let e = Uevent::parse(add).unwrap();
        assert_eq!(e.action, "add");
        assert_eq!(e.subsystem.as_deref(), Some("pci"));
        assert!(e.in_subsystems(EFA));

        let verbs = b"remove@/devices/pci0000:44/x/infiniband_verbs/uverbs3\0ACTION=remove\0SUBSYSTEM=infiniband_verbs\0";
        assert!(Uevent::parse(verbs).unwrap().in_subsystems(EFA));
        let unbind = b"unbind@/devices/pci0000:44/x\0ACTION=unbind\0SUBSYSTEM=pci\0DRIVER=efa\0";
        assert_eq!(Uevent::parse(unbind).unwrap().action, "unbind");

        let net = b"change@/devices/virtual/net/lo\0ACTION=change\0SUBSYSTEM=net\0";
        assert!(!Uevent::parse(net).unwrap().in_subsystems(EFA));
        let no_subsystem = b"add@/devices/foo\0ACTION=add\0";
        assert!(!Uevent::parse(no_subsystem).unwrap().in_subsystems(EFA));

        for bad in [
            &b""[..],
            b"libudev\0\xfe\xed\xca\xfe",
            b"add\0SUBSYSTEM=pci\0",
            b"@/devices/x\0",
            b"add@devices\0",
            b"\xff\xfe@/x\0",
        ] {
            assert_eq!(Uevent::parse(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = Uevent::parse(&bytes);
        }

        #[test]
        fn parse_reads_what_was_written(
            action in "[a-z]{1,8}",
            path in "(/[a-z0-9:.]{1,12}){1,6}",
            subsystem in "[a-z_]{1,16}",
        ) {
            let datagram = format!("{action}@{path}\0ACTION={action}\0SUBSYSTEM={subsystem}\0SEQNUM=7\0");
            let e = Uevent::parse(datagram.as_bytes()).unwrap();
            proptest::prop_assert_eq!(e.action, action);
            proptest::prop_assert_eq!(e.devpath, path);
            proptest::prop_assert_eq!(e.subsystem, Some(subsystem));
        }
    }

    #[test]
    fn socket_opens() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async { UeventSocket::open().unwrap() });
    }
}
