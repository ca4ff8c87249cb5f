//! Device health as ResourceSlice device taints.
//!
//! Each [`HealthCondition`] of a device becomes one taint with key
//! `<driver name>/<dimension>` and the condition's value. Recoverable and
//! fatal conditions get `NoSchedule` (the scheduler stops handing the device
//! to claims that do not tolerate it); degraded ones get `None` (visible to
//! people and tools, no effect on scheduling). The driver never sets
//! `NoExecute`: evicting running pods is an administrator's decision, taken
//! with a `DeviceTaintRule` (see `docs/health.md`).
//!
//! [`TaintBook`] remembers what it published, because three rules span
//! scans: one taint per key (two conditions on one dimension merge into the
//! worse), an effect only escalates while its key stays (a fatal condition
//! that a later scan reads as degraded stays `NoSchedule`), and `timeAdded`
//! is the time the key first appeared, so an unchanged device stays
//! byte-identical and nothing is rewritten. A key whose condition is gone
//! (counters reset by a reboot or a driver reload) is dropped and forgotten.
//!
//! `discover` and `run` both go through [`TaintBook::apply`], so `discover`
//! prints the taints exactly as `run` publishes them.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{Device, DeviceTaint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::scan::inventory::{HealthCondition, ScannedDevice, Severity};

/// Most taints the API server accepts on one device.
pub(crate) const MAX_TAINTS_PER_DEVICE: usize = 16;
/// Longest label value (a taint's value).
const MAX_VALUE_LEN: usize = 63;

/// The taint effects the driver sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TaintEffect {
    /// Informational.
    None,
    /// Keeps new claims off the device.
    NoSchedule,
}

impl TaintEffect {
    /// The effect of a condition of this severity.
    pub(crate) fn of(severity: Severity) -> Self {
        match severity {
            Severity::Degraded => TaintEffect::None,
            Severity::Recoverable | Severity::Fatal => TaintEffect::NoSchedule,
        }
    }

    /// The API spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TaintEffect::None => "None",
            TaintEffect::NoSchedule => "NoSchedule",
        }
    }
}

/// `<driver>/<dimension>`.
pub(crate) fn taint_key(driver: &str, dimension: &str) -> String {
    format!("{driver}/{dimension}")
}

/// A change of one device's condition on one dimension, for the WARN log
/// line and the transition counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transition {
    pub device: String,
    pub dimension: String,
    /// `None` when the condition cleared.
    pub value: Option<String>,
    pub severity: Option<Severity>,
}

impl Transition {
    /// Logs the one WARN line of this transition.
    pub(crate) fn log(&self) {
        match (&self.value, self.severity) {
            (Some(value), Some(severity)) => tracing::warn!(
                device = %self.device,
                dimension = %self.dimension,
                value = %value,
                severity = ?severity,
                "device health condition changed"
            ),
            _ => tracing::warn!(
                device = %self.device,
                dimension = %self.dimension,
                value = "cleared",
                "device health condition cleared"
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Published {
    value: String,
    severity: Severity,
    effect: TaintEffect,
    time_added: Timestamp,
}

/// What was published per device and dimension (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct TaintBook {
    driver: String,
    published: BTreeMap<String, BTreeMap<String, Published>>,
}

impl TaintBook {
    /// A book for the devices of `driver` (the taint key prefix).
    pub(crate) fn new(driver: &str) -> Self {
        TaintBook {
            driver: driver.to_owned(),
            published: BTreeMap::new(),
        }
    }

    /// Sets each scanned device's `taints` from its health, at time `now`,
    /// and returns the transitions since the previous call. Devices not in
    /// `scanned` are forgotten.
    pub(crate) fn apply(
        &mut self,
        scanned: &mut [ScannedDevice],
        now: Timestamp,
    ) -> Vec<Transition> {
        // The API stores timeAdded with second precision; keep ours equal
        // to what is read back.
        let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
        let mut transitions = Vec::new();
        let mut next = BTreeMap::new();
        for s in scanned.iter_mut() {
            if s.health.conditions.is_empty() && !self.published.contains_key(&s.device.name) {
                // Healthy and untainted before: nothing changes, nothing is
                // kept (most devices on most scans), and a device shared
                // with the inventory stays shared.
                set_taints(&mut s.device, None);
                continue;
            }
            let name = s.device.name.clone();
            let before = self.published.remove(&name).unwrap_or_default();
            let mut after: BTreeMap<String, Published> = BTreeMap::new();
            for c in worst_per_dimension(&s.health.conditions) {
                let previous = before.get(&c.dimension);
                let effect = TaintEffect::of(c.severity)
                    .max(previous.map_or(TaintEffect::None, |p| p.effect));
                let entry = Published {
                    value: c.value.chars().take(MAX_VALUE_LEN).collect(),
                    severity: c.severity,
                    effect,
                    time_added: previous.map_or(now, |p| p.time_added),
                };
                if previous.map(|p| (&p.value, p.severity)) != Some((&entry.value, entry.severity))
                {
                    transitions.push(Transition {
                        device: name.clone(),
                        dimension: c.dimension.clone(),
                        value: Some(entry.value.clone()),
                        severity: Some(c.severity),
                    });
                }
                after.insert(c.dimension.clone(), entry);
            }
            for dimension in before.keys().filter(|d| !after.contains_key(*d)) {
                transitions.push(Transition {
                    device: name.clone(),
                    dimension: dimension.clone(),
                    value: None,
                    severity: None,
                });
            }
            set_taints(&mut s.device, self.taints(&after));
            if !after.is_empty() {
                next.insert(name, after);
            }
        }
        self.published = next;
        transitions
    }

    fn taints(&self, published: &BTreeMap<String, Published>) -> Option<Vec<DeviceTaint>> {
        if published.is_empty() {
            return None;
        }
        // Worst first, so that the API's per-device limit cuts the least
        // important ones.
        let mut list: Vec<(&String, &Published)> = published.iter().collect();
        list.sort_by(|a, b| b.1.effect.cmp(&a.1.effect).then(a.0.cmp(b.0)));
        let mut taints: Vec<DeviceTaint> = list
            .into_iter()
            .take(MAX_TAINTS_PER_DEVICE)
            .map(|(dimension, p)| DeviceTaint {
                key: taint_key(&self.driver, dimension),
                value: Some(p.value.clone()),
                effect: p.effect.as_str().to_owned(),
                time_added: Some(Time(p.time_added)),
            })
            .collect();
        taints.sort_by(|a, b| a.key.cmp(&b.key));
        Some(taints)
    }
}

/// Gives `device` these taints, copying it first only where they differ
/// and it is shared ([`Arc::make_mut`]): a device the inventory keeps is
/// never written.
fn set_taints(device: &mut Arc<Device>, taints: Option<Vec<DeviceTaint>>) {
    if device.taints != taints {
        Arc::make_mut(device).taints = taints;
    }
}

/// One condition per dimension: the worst, and of equals the first.
fn worst_per_dimension(conditions: &[HealthCondition]) -> Vec<&HealthCondition> {
    let mut by_dimension: BTreeMap<&str, &HealthCondition> = BTreeMap::new();
    for c in conditions {
        match by_dimension.get(c.dimension.as_str()) {
            Some(seen) if seen.severity >= c.severity => {}
            _ => {
                by_dimension.insert(&c.dimension, c);
            }
        }
    }
    by_dimension.into_values().collect()
}

/// Whether any device carries taints.
pub(crate) fn any_tainted(devices: &[Device]) -> bool {
    devices
        .iter()
        .any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
}

/// The devices without their taints (what an API server that drops the
/// field keeps).
pub(crate) fn without_taints(devices: &[Device]) -> Vec<Device> {
    devices
        .iter()
        .map(|d| Device {
            taints: None,
            ..d.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::inventory::DeviceHealth;

    const DRIVER: &str = "neuron.aws.com";

    fn scanned(name: &str, conditions: &[(&str, Severity, &str)]) -> ScannedDevice {
        ScannedDevice {
            device: Arc::new(Device {
                name: name.into(),
                ..Default::default()
            }),
            health: DeviceHealth {
                conditions: conditions
                    .iter()
                    .map(|(d, s, v)| HealthCondition {
                        dimension: (*d).into(),
                        severity: *s,
                        value: (*v).into(),
                    })
                    .collect(),
            },
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn taints(s: &ScannedDevice) -> Vec<(String, String, String, i64)> {
        s.device
            .taints
            .iter()
            .flatten()
            .map(|t| {
                (
                    t.key.clone(),
                    t.value.clone().unwrap_or_default(),
                    t.effect.clone(),
                    t.time_added.as_ref().unwrap().0.as_second(),
                )
            })
            .collect()
    }

    #[test]
    fn effects_keys_and_healthy_devices() {
        let mut book = TaintBook::new(DRIVER);
        let mut devices = vec![
            scanned("a", &[]),
            scanned(
                "b",
                &[
                    ("sram-ecc-uncorrected", Severity::Fatal, "1"),
                    ("hbm-ue-repairable", Severity::Recoverable, "2"),
                    ("retrans-pkts-rate", Severity::Degraded, "1500"),
                ],
            ),
        ];
        let transitions = book.apply(&mut devices, at(100));
        assert_eq!(devices[0].device.taints, None, "healthy: no taints");
        let key = |d: &str| format!("{DRIVER}/{d}");
        assert_eq!(
            taints(&devices[1]),
            vec![
                (
                    key("hbm-ue-repairable"),
                    "2".into(),
                    "NoSchedule".into(),
                    100
                ),
                (key("retrans-pkts-rate"), "1500".into(), "None".into(), 100),
                (
                    key("sram-ecc-uncorrected"),
                    "1".into(),
                    "NoSchedule".into(),
                    100
                ),
            ]
        );
        assert_eq!(transitions.len(), 3);
        assert!(transitions.iter().all(|t| t.device == "b"));
    }

    #[test]
    fn one_taint_per_key_effect_escalates_time_added_once() {
        let mut book = TaintBook::new(DRIVER);
        let mut d = vec![scanned(
            "x",
            &[
                ("link", Severity::Degraded, "1"),
                ("link", Severity::Fatal, "9"),
            ],
        )];
        assert_eq!(
            book.apply(&mut d, at(10)).len(),
            1,
            "one transition per key"
        );
        let first = taints(&d[0]);
        assert_eq!(
            first,
            vec![(
                format!("{DRIVER}/link"),
                "9".into(),
                "NoSchedule".into(),
                10
            )]
        );

        // Same condition later: identical taint, no transition.
        let mut d = vec![scanned("x", &[("link", Severity::Fatal, "9")])];
        assert!(book.apply(&mut d, at(20)).is_empty());
        assert_eq!(taints(&d[0]), first);

        // Read as degraded now: the effect stays NoSchedule, timeAdded stays.
        let mut d = vec![scanned("x", &[("link", Severity::Degraded, "12")])];
        assert_eq!(book.apply(&mut d, at(30)).len(), 1);
        assert_eq!(
            taints(&d[0]),
            vec![(
                format!("{DRIVER}/link"),
                "12".into(),
                "NoSchedule".into(),
                10
            )]
        );

        // Cleared (counters reset): taint gone, transition logged, forgotten.
        let mut d = vec![scanned("x", &[])];
        let t = book.apply(&mut d, at(40));
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].value, None);
        assert_eq!(d[0].device.taints, None);

        // Back again: a fresh timeAdded and effect from its own severity.
        let mut d = vec![scanned("x", &[("link", Severity::Degraded, "1")])];
        book.apply(&mut d, at(50));
        assert_eq!(
            taints(&d[0]),
            vec![(format!("{DRIVER}/link"), "1".into(), "None".into(), 50)]
        );
    }

    #[test]
    fn time_added_has_second_precision_and_values_fit_a_label() {
        let mut book = TaintBook::new(DRIVER);
        let long = "9".repeat(80);
        let mut d = vec![scanned("x", &[("c", Severity::Fatal, &long)])];
        let now = Timestamp::from_millisecond(12_345).unwrap();
        book.apply(&mut d, now);
        let t = &d[0].device.taints.as_ref().unwrap()[0];
        assert_eq!(t.time_added.as_ref().unwrap().0, at(12));
        assert_eq!(t.value.as_ref().unwrap().len(), MAX_VALUE_LEN);
    }

    #[test]
    fn at_most_sixteen_worst_first() {
        let mut book = TaintBook::new(DRIVER);
        let dims: Vec<String> = (0..20).map(|i| format!("d{i:02}")).collect();
        let mut conditions: Vec<(&str, Severity, &str)> = dims
            .iter()
            .map(|d| (d.as_str(), Severity::Degraded, "1"))
            .collect();
        conditions.push(("zz-fatal", Severity::Fatal, "1"));
        let mut d = vec![scanned("x", &conditions)];
        book.apply(&mut d, at(1));
        let list = d[0].device.taints.as_ref().unwrap();
        assert_eq!(list.len(), MAX_TAINTS_PER_DEVICE);
        assert!(list.iter().any(|t| t.key.ends_with("/zz-fatal")));
        assert!(any_tainted(&[(*d[0].device).clone()]));
        assert!(!any_tainted(&without_taints(&[(*d[0].device).clone()])));
    }
}
