//! What the Karpenter run saw, its checks and its table.

use serde::Serialize;

/// The run's findings (written as JSON, printed as a table).
#[derive(Debug, Clone, Default, Serialize)]
pub struct KarpenterReport {
    pub kubernetes: String,
    pub karpenter_version: String,
    pub kwok_version: String,
    /// The instance types offered to Karpenter, each with its templates.
    pub offered: Vec<String>,
    pub provisioned: Provisioned,
    pub unsatisfiable: Vec<Unprovisioned>,
}

/// The pod whose claim an offered type satisfies.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Provisioned {
    /// The `examples/` file applied as written.
    pub example: String,
    pub pod: String,
    /// The drivers of the DeviceClasses its claims request: what
    /// `karpenter.sh/requested-dra-drivers` should name.
    pub expected_drivers: Vec<String>,
    pub nodeclaim: Option<String>,
    /// The NodeClaim's `node.kubernetes.io/instance-type` requirement: every
    /// offered type Karpenter's simulation found the claim fits on.
    pub candidate_types: Vec<String>,
    /// `karpenter.sh/requested-dra-drivers` of the NodeClaim.
    pub requested_dra_drivers: Option<String>,
    pub node: Option<String>,
    /// The Node's `node.kubernetes.io/instance-type` (the fixture the
    /// drivers ran on).
    pub instance_type: Option<String>,
    /// Devices the scheduler allocated (`driver/pool/device`).
    pub allocated: Vec<String>,
    /// Seconds from the pod's creation (Pending) to each step.
    pub to_nodeclaim_s: Option<f64>,
    pub to_node_s: Option<f64>,
    pub to_pools_published_s: Option<f64>,
    pub to_initialized_s: Option<f64>,
    pub to_bound_s: Option<f64>,
    pub to_running_s: Option<f64>,
}

/// A pod whose claim no offered type satisfies.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Unprovisioned {
    pub what: String,
    pub pod: String,
    /// NodeClaims created while it was pending (0 expected).
    pub nodeclaims: usize,
    pub phase: String,
    /// Karpenter's event on the pod (reason: message), if any.
    pub karpenter_reason: Option<String>,
    /// When the API server refused the claim (a field its release lacks).
    pub refused: Option<String>,
}

impl KarpenterReport {
    /// What did not happen as it should.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        let p = &self.provisioned;
        if p.nodeclaim.is_none() {
            out.push(format!("{}: no NodeClaim", p.pod));
        }
        let drivers = p.requested_dra_drivers.as_deref().unwrap_or("");
        for d in &p.expected_drivers {
            if !drivers.split(',').any(|x| x.trim() == d) {
                out.push(format!(
                    "{}: karpenter.sh/requested-dra-drivers is {drivers:?}, without {d}",
                    p.pod
                ));
            }
        }
        if p.to_initialized_s.is_none() {
            out.push(format!("{}: the NodeClaim never became Initialized", p.pod));
        }
        if p.to_running_s.is_none() {
            out.push(format!("{}: never Running", p.pod));
        }
        if p.allocated.is_empty() && p.to_bound_s.is_some() {
            out.push(format!("{}: bound without an allocation", p.pod));
        }
        for u in &self.unsatisfiable {
            if u.refused.is_some() {
                continue;
            }
            if u.nodeclaims > 0 {
                out.push(format!(
                    "{}: {} NodeClaim(s) for an unsatisfiable claim",
                    u.pod, u.nodeclaims
                ));
            }
            if u.phase != "Pending" {
                out.push(format!("{}: {} (Pending expected)", u.pod, u.phase));
            }
            if u.karpenter_reason.is_none() {
                out.push(format!("{}: no event from Karpenter", u.pod));
            }
        }
        out
    }

    /// Markdown for docs/autoscaling.md.
    pub fn table(&self) -> Vec<String> {
        let p = &self.provisioned;
        let secs = |v: Option<f64>| v.map_or("never".to_string(), |s| format!("{s:.1} s"));
        let mut lines = vec![
            format!(
                "Karpenter {} (kwok provider), KWOK {}, Kubernetes {}; offered: {}",
                self.karpenter_version,
                self.kwok_version,
                self.kubernetes,
                self.offered.join(", ")
            ),
            String::new(),
            format!("`{}` (pod `{}`):", p.example, p.pod),
            String::new(),
            "| step | from Pending |".into(),
            "|---|---|".into(),
            format!("| NodeClaim created | {} |", secs(p.to_nodeclaim_s)),
            format!("| Node registered (kwok) | {} |", secs(p.to_node_s)),
            format!(
                "| pools of {} complete | {} |",
                p.expected_drivers.join(" and "),
                secs(p.to_pools_published_s)
            ),
            format!("| NodeClaim Initialized | {} |", secs(p.to_initialized_s)),
            format!("| pod bound | {} |", secs(p.to_bound_s)),
            format!("| pod Running | {} |", secs(p.to_running_s)),
            String::new(),
            format!(
                "NodeClaim {}: candidates [{}], requested-dra-drivers {:?}, node {} ({}); allocated {}",
                p.nodeclaim.as_deref().unwrap_or("-"),
                p.candidate_types.join(", "),
                p.requested_dra_drivers.as_deref().unwrap_or("-"),
                p.node.as_deref().unwrap_or("-"),
                p.instance_type.as_deref().unwrap_or("-"),
                p.allocated.join(" "),
            ),
            String::new(),
            "| claim no offered type satisfies | NodeClaims | phase | Karpenter's reason |".into(),
            "|---|---|---|---|".into(),
        ];
        for u in &self.unsatisfiable {
            let reason = match (&u.refused, &u.karpenter_reason) {
                (Some(r), _) => format!("refused by the API server: {r}"),
                (None, Some(r)) => r.replace('|', "\\|"),
                (None, None) => "none".into(),
            };
            lines.push(format!(
                "| {} | {} | {} | {} |",
                u.what, u.nodeclaims, u.phase, reason
            ));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> KarpenterReport {
        KarpenterReport {
            provisioned: Provisioned {
                pod: "p".into(),
                expected_drivers: vec!["efa.networking.k8s.aws".into(), "neuron.aws.com".into()],
                nodeclaim: Some("nc".into()),
                requested_dra_drivers: Some("efa.networking.k8s.aws,neuron.aws.com".into()),
                allocated: vec!["neuron.aws.com/n/neurondevice0".into()],
                to_initialized_s: Some(3.0),
                to_bound_s: Some(4.0),
                to_running_s: Some(5.0),
                ..Provisioned::default()
            },
            unsatisfiable: vec![Unprovisioned {
                pod: "u".into(),
                phase: "Pending".into(),
                karpenter_reason: Some("FailedScheduling: no instance type".into()),
                ..Unprovisioned::default()
            }],
            ..KarpenterReport::default()
        }
    }

    #[test]
    fn a_run_that_went_as_it_should_has_no_failures() {
        assert_eq!(good().failures(), Vec::<String>::new());
    }

    #[test]
    fn a_missing_driver_a_nodeclaim_too_many_and_silence_fail() {
        let mut r = good();
        r.provisioned.requested_dra_drivers = Some("neuron.aws.com".into());
        r.unsatisfiable[0].nodeclaims = 1;
        r.unsatisfiable[0].karpenter_reason = None;
        let f = r.failures();
        assert_eq!(f.len(), 3, "{f:#?}");
        assert!(f[0].contains("without efa.networking.k8s.aws"), "{f:#?}");
    }

    #[test]
    fn a_refused_claim_is_reported_not_failed() {
        let mut r = good();
        r.unsatisfiable[0].refused = Some("unknown field".into());
        r.unsatisfiable[0].karpenter_reason = None;
        assert!(r.failures().is_empty());
        assert!(
            r.table()
                .iter()
                .any(|l| l.contains("refused by the API server"))
        );
    }

    #[test]
    fn the_table_says_never_for_a_step_not_reached() {
        let mut r = good();
        r.provisioned.to_running_s = None;
        assert!(r.table().iter().any(|l| l == "| pod Running | never |"));
        assert!(r.failures().iter().any(|f| f.contains("never Running")));
    }
}
