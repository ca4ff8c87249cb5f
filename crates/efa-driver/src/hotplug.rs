//! Keeping the published device set in step with the hardware.
//!
//! Two triggers feed one rescan ([`Inventory::rescan`]):
//! - kernel uevents (`NETLINK_KOBJECT_UEVENT`, multicast group 1: events
//!   sent by the kernel only): any `pci`, `infiniband` or `infiniband_verbs`
//!   event (add, remove, bind, unbind, change) schedules a rescan after a
//!   short settle delay, because one hot-plug emits a burst of events
//!   (function, driver bind, RDMA device, verbs device);
//! - a periodic rescan (`--rescan-interval`, default 60 s) as the fallback
//!   for lost events (socket buffer overrun), a pod without the socket, or
//!   sysfs mounted from elsewhere (fixtures).
//!
//! A rescan reads a few files per PCI function (see `benches/rescan.rs` for
//! its measured cost) and sends on the watch channel only when the device
//! list differs from the last one sent, so the publisher writes nothing in
//! steady state. An EFA that is present but unusable is logged once when it
//! becomes unusable (not on every rescan) and counted in the metrics.
//!
//! Limits: uevents reach a pod's network namespace only if it is owned by
//! the initial user namespace (true for ordinary pods, not for user-namespaced
//! ones); the periodic rescan covers that case.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::Device;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, setsockopt,
    socket, sockopt,
};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch};
use topology::{PciAddress, SysfsRoot};

use crate::attributes;
use crate::discovery::{self, DiscoveryError, UnusableReason};

/// Default period of the fallback rescan.
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(60);
/// How long to wait after a uevent for the rest of its burst.
pub const UEVENT_SETTLE: Duration = Duration::from_millis(250);
/// Subsystems whose events can change the EFA set.
pub const RELEVANT_SUBSYSTEMS: &[&str] = &["pci", "infiniband", "infiniband_verbs"];

/// Kernel uevent multicast group (1 = kernel, 2 = udev re-broadcasts).
const KERNEL_UEVENT_GROUP: u32 = 1;
/// Receive buffer asked for, so a burst (driver reload of 32 EFAs) fits.
const UEVENT_RCVBUF: usize = 1 << 20;

/// The driver's own metrics.
#[derive(Debug, Clone)]
pub struct EfaMetrics {
    /// Usable EFAs currently published.
    pub devices: IntGauge,
    /// EFAs present but not published, by reason.
    pub unusable: IntGaugeVec,
    /// EFAs that became unusable, by reason (counted once per transition).
    pub unusable_total: IntCounterVec,
    /// Rescans, by trigger (`start`, `uevent`, `interval`).
    pub rescans_total: IntCounterVec,
    /// Duration of whole rescans.
    pub rescan_seconds: Histogram,
}

impl EfaMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = EfaMetrics {
            devices: IntGauge::new("efa_driver_devices", "Usable EFAs currently published")?,
            unusable: IntGaugeVec::new(
                Opts::new(
                    "efa_driver_unusable_devices",
                    "EFAs present on the node but not published, by reason",
                ),
                &["reason"],
            )?,
            unusable_total: IntCounterVec::new(
                Opts::new(
                    "efa_driver_unusable_devices_total",
                    "EFAs that became unusable (unbound driver, missing RDMA or verbs device, unreadable sysfs)",
                ),
                &["reason"],
            )?,
            rescans_total: IntCounterVec::new(
                Opts::new("efa_driver_rescans_total", "sysfs rescans, by trigger"),
                &["trigger"],
            )?,
            rescan_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "efa_driver_rescan_duration_seconds",
                    "Duration of a whole sysfs rescan",
                )
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0]),
            )?,
        };
        registry.register(Box::new(m.devices.clone()))?;
        registry.register(Box::new(m.unusable.clone()))?;
        registry.register(Box::new(m.unusable_total.clone()))?;
        registry.register(Box::new(m.rescans_total.clone()))?;
        registry.register(Box::new(m.rescan_seconds.clone()))?;
        Ok(m)
    }
}

/// What caused a rescan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Start,
    Uevent,
    Interval,
}

impl Trigger {
    fn label(self) -> &'static str {
        match self {
            Trigger::Start => "start",
            Trigger::Uevent => "uevent",
            Trigger::Interval => "interval",
        }
    }
}

/// The last published device list and what was already warned about.
#[derive(Debug)]
pub struct Inventory {
    root: SysfsRoot,
    last: Option<Vec<Device>>,
    unusable: BTreeMap<PciAddress, UnusableReason>,
    metrics: Option<EfaMetrics>,
}

impl Inventory {
    pub fn new(root: SysfsRoot, metrics: Option<EfaMetrics>) -> Self {
        Inventory {
            root,
            last: None,
            unusable: BTreeMap::new(),
            metrics,
        }
    }

    /// Scans sysfs; `Some(devices)` when the set differs from the last one
    /// returned (always on the first call), `None` when nothing changed.
    pub fn rescan(&mut self, trigger: Trigger) -> Result<Option<Vec<Device>>, DiscoveryError> {
        let started = Instant::now();
        let found = discovery::discover(&self.root)?;
        self.note_unusable(&found.unusable);
        let devices = attributes::devices(&found);
        if let Some(m) = &self.metrics {
            m.rescans_total.with_label_values(&[trigger.label()]).inc();
            m.rescan_seconds.observe(started.elapsed().as_secs_f64());
            m.devices.set(devices.len() as i64);
        }
        if self.last.as_ref() == Some(&devices) {
            return Ok(None);
        }
        tracing::info!(
            devices = devices.len(),
            trigger = trigger.label(),
            "EFA device set changed"
        );
        self.last = Some(devices.clone());
        Ok(Some(devices))
    }

    /// Warns once per EFA and reason; forgets EFAs that recovered or left.
    fn note_unusable(&mut self, now: &[discovery::UnusableEfa]) {
        let mut next = BTreeMap::new();
        for u in now {
            if self.unusable.get(&u.address) != Some(&u.reason) {
                tracing::warn!(
                    pci_bus_id = %u.address,
                    reason = %u.reason,
                    "EFA present but not published"
                );
                if let Some(m) = &self.metrics {
                    m.unusable_total
                        .with_label_values(&[u.reason.label()])
                        .inc();
                }
            }
            next.insert(u.address, u.reason.clone());
        }
        if let Some(m) = &self.metrics {
            m.unusable.reset();
            for reason in next.values() {
                m.unusable.with_label_values(&[reason.label()]).inc();
            }
        }
        self.unusable = next;
    }
}

/// One kernel uevent, reduced to what the watcher looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uevent {
    pub action: String,
    pub devpath: String,
    pub subsystem: Option<String>,
}

impl Uevent {
    /// Parses a kernel uevent datagram: `ACTION@DEVPATH\0KEY=VALUE\0...`.
    /// `None` for anything else (including udev's `libudev` messages).
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

    /// Whether this event can change the set of usable EFAs.
    pub fn is_relevant(&self) -> bool {
        self.subsystem
            .as_deref()
            .is_some_and(|s| RELEVANT_SUBSYSTEMS.contains(&s))
    }
}

/// The uevent socket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum HotplugError {
    #[error("netlink uevent socket: {op}: {source}")]
    Socket {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn sock_err(op: &'static str) -> impl FnOnce(nix::Error) -> HotplugError {
    move |e| HotplugError::Socket {
        op,
        source: std::io::Error::from(e),
    }
}

/// A non-blocking `NETLINK_KOBJECT_UEVENT` socket on the kernel's group.
#[derive(Debug)]
pub struct UeventSocket {
    fd: AsyncFd<OwnedFd>,
}

impl UeventSocket {
    /// Opens and binds the socket. Needs a Tokio runtime.
    pub fn open() -> Result<Self, HotplugError> {
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
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| HotplugError::Socket {
            op: "register with the runtime",
            source: std::io::Error::from(e),
        })?;
        Ok(UeventSocket { fd })
    }

    /// The next datagram. `Err(ENOBUFS)` means events were lost.
    pub async fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize> {
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

/// Reads uevents and sends a [`Trigger::Uevent`] for each relevant one (and
/// for lost events). Returns when the receiver is gone or the socket fails.
pub async fn forward_uevents(socket: UeventSocket, triggers: mpsc::Sender<Trigger>) {
    let mut buf = vec![0u8; 8192];
    loop {
        let relevant = match socket.recv(&mut buf).await {
            Ok(n) => Uevent::parse(&buf[..n]).is_some_and(|e| {
                tracing::trace!(action = %e.action, devpath = %e.devpath, subsystem = ?e.subsystem, "uevent");
                e.is_relevant()
            }),
            // Overrun: something happened that we did not see; rescan.
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => true,
            Err(error) => {
                tracing::warn!(%error, "uevent socket failed; relying on periodic rescans");
                return;
            }
        };
        // A full channel already holds a pending trigger: dropping is fine.
        if relevant
            && let Err(mpsc::error::TrySendError::Closed(_)) = triggers.try_send(Trigger::Uevent)
        {
            return;
        }
    }
}

/// How the watcher runs.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    pub rescan_interval: Duration,
    pub settle: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            rescan_interval: DEFAULT_RESCAN_INTERVAL,
            settle: UEVENT_SETTLE,
        }
    }
}

/// Rescans on every trigger and on the interval, sending changed device sets
/// on `tx`. Returns when every receiver of `tx` is gone. A failing rescan
/// keeps the last published set (a transient sysfs problem must not
/// unpublish healthy devices).
pub async fn watch_devices(
    mut inventory: Inventory,
    tx: watch::Sender<Vec<Device>>,
    mut triggers: mpsc::Receiver<Trigger>,
    config: WatchConfig,
) {
    let mut interval = tokio::time::interval(config.rescan_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await; // the first tick is immediate; the caller already scanned
    let mut events_open = true;
    loop {
        let trigger = tokio::select! {
            _ = tx.closed() => return,
            _ = interval.tick() => Trigger::Interval,
            t = triggers.recv(), if events_open => match t {
                Some(t) => {
                    // Let the rest of the burst arrive, then drain it.
                    tokio::time::sleep(config.settle).await;
                    while triggers.try_recv().is_ok() {}
                    t
                }
                None => {
                    events_open = false;
                    continue;
                }
            },
        };
        match inventory.rescan(trigger) {
            Ok(Some(devices)) => {
                if tx.send(devices).is_err() {
                    return;
                }
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "EFA rescan failed; keeping the published set"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_uevents() {
        let add = b"add@/devices/pci0000:44/0000:44:01.0/0000:45:00.0/0000:46:00.0/0000:4f:00.0\0ACTION=add\0DEVPATH=/devices/pci0000:44/0000:44:01.0/0000:45:00.0/0000:46:00.0/0000:4f:00.0\0SUBSYSTEM=pci\0PCI_ID=1D0F:EFA1\0SEQNUM=1234\0";
        let e = Uevent::parse(add).unwrap();
        assert_eq!(e.action, "add");
        assert_eq!(e.subsystem.as_deref(), Some("pci"));
        assert!(e.is_relevant());

        let verbs = b"remove@/devices/pci0000:44/x/infiniband_verbs/uverbs3\0ACTION=remove\0SUBSYSTEM=infiniband_verbs\0";
        assert!(Uevent::parse(verbs).unwrap().is_relevant());
        let unbind = b"unbind@/devices/pci0000:44/x\0ACTION=unbind\0SUBSYSTEM=pci\0DRIVER=efa\0";
        assert_eq!(Uevent::parse(unbind).unwrap().action, "unbind");

        let net = b"change@/devices/virtual/net/lo\0ACTION=change\0SUBSYSTEM=net\0";
        assert!(!Uevent::parse(net).unwrap().is_relevant());
        let no_subsystem = b"add@/devices/foo\0ACTION=add\0";
        assert!(!Uevent::parse(no_subsystem).unwrap().is_relevant());

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
    fn metrics_register_once() {
        let registry = Registry::new();
        EfaMetrics::register(&registry).unwrap();
        assert!(EfaMetrics::register(&registry).is_err(), "duplicate names");
    }
}
