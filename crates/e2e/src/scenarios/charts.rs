//! "`helm template charts/<chart> | kubectl apply --dry-run=server`":
//! every object both charts render, with default and with non-default values,
//! goes through the API server's validation and admission without being
//! stored. The testbed itself applies only the RBAC, DeviceClass and
//! admission-policy objects (the drivers run as host processes), so this is
//! where the DaemonSet, its securityContext and the Service meet the real
//! API server.

use anyhow::{Context, Result, bail};

use crate::charts::{EFA_CHART, Helm, NEURON_CHART};
use crate::manifests;
use crate::testbed::Testbed;

/// Kinds whose CRD a plain cluster does not have: the ServiceMonitor is
/// opt-in (`metrics.serviceMonitor.enabled`) and needs the Prometheus
/// operator's CRD, which the local cluster does not install.
const NEEDS_A_CRD: &[&str] = &["ServiceMonitor"];

pub async fn chart_objects<T: Testbed>(tb: &T, ns: &str) -> Result<()> {
    let helm = Helm::locate()?;
    let client = tb.client();
    let mut checked = Vec::new();
    for chart in [EFA_CHART, NEURON_CHART] {
        for values in [&[][..], &["ci/nondefault-values.yaml"][..]] {
            let objects = helm
                .render_with_values(chart, values)
                .with_context(|| format!("rendering {} with {values:?}", chart.name))?;
            let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
            // Non-default values may switch RBAC, the policy and the default
            // class off (the neuron chart's CI values do); defaults have all.
            let required: &[&str] = if values.is_empty() {
                &[
                    "DaemonSet",
                    "DeviceClass",
                    "ServiceAccount",
                    "ClusterRole",
                    "ValidatingAdmissionPolicy",
                    "ValidatingAdmissionPolicyBinding",
                ]
            } else {
                &["DaemonSet"]
            };
            for required in required {
                if !kinds.contains(required) {
                    bail!(
                        "{} with {values:?} rendered no {required}: {kinds:?}",
                        chart.name
                    );
                }
            }
            for obj in &objects {
                let kind = obj["kind"].as_str().unwrap_or_default();
                if NEEDS_A_CRD.contains(&kind) {
                    continue;
                }
                // Namespaced objects go to the scenario's own namespace: a
                // testbed whose releases carry the same names (kind's
                // `neuron`, which the non-default values' fullnameOverride
                // also gives) would otherwise turn the dry run into an
                // update of the installed DaemonSet (immutable selector,
                // fields merged from the installed one).
                manifests::apply_dry_run(&client, obj, Some(ns))
                    .await
                    .with_context(|| {
                        format!("{} with {values:?}: the API server refused it", chart.name)
                    })?;
                checked.push(format!("{} {}", chart.name, manifests::id(obj)));
            }
        }
    }
    eprintln!(
        "aws-dra-e2e: {} chart objects passed server-side dry-run",
        checked.len()
    );
    Ok(())
}
