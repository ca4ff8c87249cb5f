//! `cargo xtask chaos`: the drivers under faults on the local cluster (real
//! etcd, kube-apiserver, scheduler, kubelets and containerd; the drivers as
//! host processes, as `cargo xtask e2e --cluster local` runs them).
//!
//! Parts, in this order, each on the same testbed:
//! - [`cycles`]: pods with claims created and deleted while the drivers are
//!   SIGKILLed at random moments, with the end checks;
//! - [`faults`]: kubelet restarted while a pod holds a claim, a simulated
//!   node reboot, and the API server stopped then etcd restarted;
//! - [`disk`]: a corrupt checkpoint, a full CDI directory and a read-only
//!   checkpoint directory under the EFA driver.
//!
//! Figures are collected into a [`ChaosReport`] and printed as a table; a
//! failed check is a figure (what was seen), not an early exit, so that one
//! run reports everything.

pub mod cycles;
pub mod disk;
pub mod faults;

use std::time::{Duration, Instant};

use anyhow::Result;

pub use cycles::CycleFigures;
pub use disk::DiskFigures;
use e2e::local::LocalTestbed;
use e2e::testbed::{LocalOptions, ManagedTestbed};
pub use faults::FaultFigures;
use local_cluster::versions::KubernetesVersion;

/// What to run.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// Create/delete cycles.
    pub cycles: u64,
    /// SIGKILLs per driver over the cycles.
    pub kills: u64,
    /// Stop starting cycles after this long (the figures say how many ran).
    pub max_duration: Option<Duration>,
    /// How long a pod may take to run (the kubelet retries a prepare that
    /// failed while a driver was down at its next periodic sync of the pod).
    pub pod_timeout: Duration,
    /// Seed of the kill plan.
    pub seed: u64,
    /// Run the kubelet, reboot, outage and disk faults after the cycles.
    pub faults: bool,
    /// Cycles at a time ([`cycles`]).
    pub lanes: u64,
    /// The kubelets' `syncFrequency` (`None`: the kubelet's 1 min). A pod
    /// whose prepare failed while its driver was dead waits for it
    /// (kubernetes#139836).
    pub kubelet_sync_frequency: Option<Duration>,
    pub kubernetes_version: KubernetesVersion,
}

/// A small xorshift generator: the kill plan is reproducible from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChaosReport {
    pub kubernetes_version: String,
    pub seed: u64,
    pub cycles_asked: u64,
    pub kills_asked: u64,
    pub lanes: u64,
    /// The kubelets' `syncFrequency` in seconds (`None`: the default, 60).
    pub kubelet_sync_frequency_s: Option<f64>,
    pub cycles: CycleFigures,
    pub faults: Option<FaultFigures>,
    pub disk: Option<DiskFigures>,
    /// A part that could not finish, with its error.
    pub errors: Vec<String>,
    pub seconds: f64,
}

fn ms_stats(v: &[u64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let p = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    format!(
        "median {:.1} s, p95 {:.1} s, max {:.1} s (n={})",
        p(0.5) as f64 / 1000.0,
        p(0.95) as f64 / 1000.0,
        s[s.len() - 1] as f64 / 1000.0,
        s.len()
    )
}

/// The longest a driver's pool may take to be complete again after the API
/// server's return (docs/reliability.md, "Chaos": within 10 s).
const RECONCILED_WITHIN_MS: u64 = 10_000;

impl ChaosReport {
    /// Every check that failed, as a line each; empty when the run is clean.
    /// Durations other than the slices' reconciliation are figures, not
    /// checks (they depend on the kubelet's settings and the machine).
    pub fn failures(&self) -> Vec<String> {
        let c = &self.cycles;
        let mut out = Vec::new();
        let mut named = |what: &str, v: &[String]| {
            if !v.is_empty() {
                out.push(format!("{what}: {}", list(v)));
            }
        };
        named("pods did not run", &c.not_run);
        named("pods stuck", &c.stuck);
        named("devices held by two claims", &c.double_held);
        named("checkpoint entries or CDI specs left behind", &c.leftovers);
        named("parts not finished", &self.errors);
        let mut check = |failed: bool, what: &str| {
            if failed {
                out.push(what.to_string());
            }
        };
        if let Some(f) = &self.faults {
            check(
                f.kubelet_driver_restarts.is_some_and(|n| n > 0),
                "a driver restarted while the kubelet did",
            );
            check(
                f.kubelet_pod_unaffected == Some(false),
                "the kubelet restart changed a held pod's container",
            );
            check(
                f.reboot_forgotten_at_start == Some(false),
                "after the simulated reboot the driver kept the old boot's claims",
            );
            check(
                f.reboot_new_pod_ok == Some(false),
                "no new pod ran after the simulated reboot",
            );
            check(
                f.outage_driver_restarts.is_some_and(|n| n > 0),
                "a driver restarted during the API server outage",
            );
            check(
                f.outage_pod_unaffected == Some(false),
                "the outage changed a held pod's container",
            );
            for (driver, ms) in &f.outage_slices_ms {
                check(
                    *ms > RECONCILED_WITHIN_MS,
                    &format!("{driver}: slices reconciled {ms} ms after the return (over 10 s)"),
                );
            }
        }
        if let Some(d) = &self.disk {
            check(
                d.driver_restarts.is_some_and(|n| n > 0),
                "the EFA driver restarted during the disk faults",
            );
            check(
                d.corrupt_moved_aside == Some(false),
                "the corrupt checkpoint was not moved aside",
            );
            check(
                d.corrupt_specs_left.is_some_and(|n| n > 0),
                "CDI specs left after the corrupt checkpoint's claim was deleted",
            );
            check(
                d.full_event.is_none(),
                "no pod event for the full CDI directory",
            );
            check(
                d.readonly_event.is_none(),
                "no pod event for the read-only checkpoint directory",
            );
        }
        out
    }

    /// The figures as a Markdown table.
    pub fn table(&self) -> Vec<String> {
        let c = &self.cycles;
        let mut rows = vec![
            "| check | figure |".to_string(),
            "| --- | --- |".to_string(),
            format!(
                "| create/delete cycles (5 pods, 4 claims each: single EFA, shared EFA, GPU+EFA aligned, Neuron), {} at a time | {} run of {} asked, {:.0} s |",
                self.lanes, c.cycles, self.cycles_asked, c.seconds
            ),
            format!(
                "| kubelet `syncFrequency` (a prepare that failed while the driver was dead is retried at the next sync, kubernetes#139836) | {} |",
                match self.kubelet_sync_frequency_s {
                    Some(s) => format!("{s:.0} s (set for this run)"),
                    None => "60 s (the default)".to_string(),
                }
            ),
            format!(
                "| SIGKILLs (asked {} per driver) | {} |",
                self.kills_asked,
                if c.kills.is_empty() {
                    "none".to_string()
                } else {
                    c.kills
                        .iter()
                        .map(|(k, n)| format!("{k}: {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
            format!(
                "| driver start after a kill → its pool seen complete in the API | {} |",
                ms_stats(&c.restart_ms)
            ),
            format!(
                "| pods that ran / created | {} / {} ({} distinct claims) |",
                c.pods_ran, c.pods_created, c.claims
            ),
            format!(
                "| cycle: created → all 5 pods Running | {} |",
                ms_stats(&c.all_running_ms)
            ),
            format!(
                "| pods stuck (not gone 120 s after deletion) | {} |",
                list(&c.stuck)
            ),
            format!("| pods that did not run | {} |", list(&c.not_run)),
            format!(
                "| device held by two claims (allocations, checkpoints) | {} |",
                list(&c.double_held)
            ),
            format!(
                "| checkpoint entry or CDI spec left for a deleted claim (90 s) | {} |",
                list(&c.leftovers)
            ),
        ];
        if let Some(f) = &self.faults {
            rows.extend(f.rows());
        }
        if let Some(d) = &self.disk {
            rows.extend(d.rows());
        }
        for e in &self.errors {
            rows.push(format!("| part not finished | {e} |"));
        }
        rows
    }
}

fn list(v: &[String]) -> String {
    match v.len() {
        0 => "0".into(),
        n if n <= 3 => format!("{n}: {}", v.join("; ")),
        n => format!("{n}: {}; …", v[..3].join("; ")),
    }
}

/// Brings the testbed up (p5 with EFA and the test GPU driver, trn2 with
/// EFA and Neuron), runs the parts and shuts it down.
pub async fn run(options: &ChaosOptions) -> Result<ChaosReport> {
    let started = Instant::now();
    let testbed = LocalTestbed::start(LocalOptions {
        kubernetes_version: options.kubernetes_version.clone(),
        kubelet_sync_frequency: options.kubelet_sync_frequency,
        ..LocalOptions::default()
    })
    .await?;
    eprintln!(
        "==> chaos: testbed up in {:.0}s; logs in {}",
        started.elapsed().as_secs_f64(),
        testbed.run_dir().display()
    );
    let mut rng = Rng::new(options.seed);
    let mut errors = Vec::new();
    let cycles = match cycles::run(&testbed, options, &mut rng).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("==> chaos: cycles failed: {e:#}");
            errors.push(format!("cycles: {e:#}"));
            CycleFigures::default()
        }
    };
    let faults = if options.faults {
        let mut f = FaultFigures::default();
        if let Err(e) = faults::run(&testbed, &mut f).await {
            eprintln!("==> chaos: faults failed: {e:#}");
            errors.push(format!("faults: {e:#}"));
        }
        Some(f)
    } else {
        None
    };
    let disk = if options.faults {
        let mut d = DiskFigures::default();
        if let Err(e) = disk::run(&testbed, &mut d).await {
            eprintln!("==> chaos: disk faults failed: {e:#}");
            errors.push(format!("disk: {e:#}"));
        }
        Some(d)
    } else {
        None
    };
    let report = testbed.shutdown();
    if !report.is_clean() {
        errors.push(format!("teardown left {report:?}"));
    }
    Ok(ChaosReport {
        kubernetes_version: options.kubernetes_version.to_string(),
        seed: options.seed,
        cycles_asked: options.cycles,
        kills_asked: options.kills,
        lanes: options.lanes,
        kubelet_sync_frequency_s: options.kubelet_sync_frequency.map(|d| d.as_secs_f64()),
        cycles,
        faults,
        disk,
        errors,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_plan_is_reproducible_and_in_range() {
        let (mut a, mut b) = (Rng::new(17), Rng::new(17));
        for _ in 0..1000 {
            let x = a.below(8000);
            assert!(x < 8000);
            assert_eq!(x, b.below(8000));
        }
    }

    fn clean_report() -> ChaosReport {
        ChaosReport {
            kubernetes_version: "v1.37.2".into(),
            seed: 1,
            cycles_asked: 1,
            kills_asked: 0,
            lanes: 1,
            kubelet_sync_frequency_s: None,
            cycles: CycleFigures::default(),
            faults: Some(FaultFigures::default()),
            disk: Some(DiskFigures {
                full_event: Some("No space left on device".into()),
                readonly_event: Some("Read-only file system".into()),
                ..DiskFigures::default()
            }),
            errors: Vec::new(),
            seconds: 1.0,
        }
    }

    #[test]
    fn a_clean_run_has_no_failures_and_each_broken_check_is_named() {
        assert_eq!(clean_report().failures(), Vec::<String>::new());
        let mut r = clean_report();
        r.cycles.stuck.push("cycle 3: c3-single not gone".into());
        r.cycles.leftovers.push("p5 CDI spec x".into());
        if let Some(f) = r.faults.as_mut() {
            f.outage_slices_ms = vec![
                ("p5/efa-driver".into(), 57_100),
                ("trn2/efa-driver".into(), 100),
            ];
        }
        if let Some(d) = r.disk.as_mut() {
            d.readonly_event = None;
        }
        let failures = r.failures();
        assert_eq!(failures.len(), 4, "{failures:?}");
        assert!(
            failures[0].starts_with("pods stuck: 1: cycle 3"),
            "{failures:?}"
        );
        assert!(failures[1].contains("left behind"), "{failures:?}");
        assert!(
            failures[2].contains("p5/efa-driver: slices reconciled 57100 ms"),
            "{failures:?}"
        );
        assert!(failures[3].contains("read-only"), "{failures:?}");
    }

    #[test]
    fn stats_name_median_p95_and_max() {
        assert_eq!(ms_stats(&[]), "-");
        assert_eq!(
            ms_stats(&[3000, 1000, 2000]),
            "median 2.0 s, p95 3.0 s, max 3.0 s (n=3)"
        );
    }
}
