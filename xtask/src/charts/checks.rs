//! `cargo xtask charts check`: the Helm charts, checked with real Helm.
//!
//! Builds (or reuses) Helm, vendors the shared library chart into each driver
//! chart, runs `helm lint --strict` and `helm template` with the default
//! values, the chart's `ci/*-values.yaml` and the kind e2e values, and
//! asserts concrete properties of the rendered objects, read as typed
//! k8s-openapi objects ([`crate::charts::objects`]: security context, host
//! mounts at identical paths, flags and env, RBAC verbs, the admission policy
//! expression, DeviceClass CEL). It also checks that values the schema must
//! refuse are refused. Limits: it does not talk to an API server; applying
//! the rendered objects server-side is the e2e's job (`cargo xtask charts
//! render` gives them).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, ensure};

use crate::charts::expect::{Expect, NAMESPACE, RELEASE};
use crate::charts::objects::check_rendered;
use crate::charts::render::{build_dependencies, path_str, render};
use crate::charts::specs::{CHARTS, EFA, kind_helm_values};
use crate::helm::Helm;
use crate::manifest_checks;

pub fn check(helm: &Helm, root: &Path) -> Result<()> {
    let started = Instant::now();
    let mut rendered = 0;
    let schemas: Vec<String> = CHARTS
        .iter()
        .map(|c| {
            std::fs::read_to_string(root.join("charts").join(c.name).join("values.schema.json"))
        })
        .collect::<std::io::Result<_>>()?;
    ensure!(
        schemas[0] == schemas[1],
        "charts/*/values.schema.json differ: the two charts share one values layout, keep the files identical"
    );
    let tmp = tempfile::tempdir()?;
    for spec in CHARTS {
        let dir = root.join("charts").join(spec.name);
        build_dependencies(helm, root, spec)?;
        let ci_values = dir.join("ci").join("nondefault-values.yaml");
        let kind_values = tmp.path().join(format!("{}-kind.yaml", spec.name));
        std::fs::write(&kind_values, kind_helm_values(spec)?)?;
        for values in [None, Some(&ci_values), Some(&kind_values)] {
            let mut args = vec!["lint", "--strict", path_str(&dir)?];
            if let Some(v) = values {
                args.extend(["-f", path_str(v)?]);
            }
            helm.output(&args)
                .with_context(|| format!("helm lint of {}", spec.name))?;
        }
        // Rendered for the main release unless a variant names another:
        // the extended-resource classes follow the cluster's version.
        let main = local_cluster::toolchain::default_kubernetes_version().to_string();
        let variants: [(&str, Vec<PathBuf>, Expect, &str); 4] = [
            ("defaults", vec![], Expect::defaults(spec), &main),
            (
                "defaults for a 1.34 cluster",
                vec![],
                Expect::defaults_before_extended_resources(spec),
                "v1.34.4",
            ),
            (
                "ci/nondefault-values.yaml",
                vec![ci_values],
                Expect::nondefault(spec),
                &main,
            ),
            (
                "kind e2e values",
                vec![kind_values],
                Expect::kind(spec)?,
                &main,
            ),
        ];
        for (label, values, expect, version) in variants {
            let yaml = render(helm, root, spec, RELEASE, NAMESPACE, &values, Some(version))?;
            let objs = manifest_checks::parse(&yaml)
                .with_context(|| format!("{} ({label}) rendered invalid YAML", spec.name))?;
            check_rendered(spec, &expect, &objs)
                .with_context(|| format!("{} rendered with {label}", spec.name))?;
            eprintln!(
                "==> charts: {} with {label}: {} objects ok",
                spec.name,
                objs.len()
            );
            rendered += 1;
        }
        for (bad, why) in [
            ("bogusKey=1", "an unknown top-level key"),
            ("hostPaths.cdiRoot=relative/dir", "a relative host path"),
            ("logFormat=xml", "an unknown log format"),
            (
                "deviceClasses.extra[0].name=Bad_Name",
                "a DeviceClass name that is not a DNS subdomain",
            ),
            (
                "image.digest=latest",
                "an image digest that is not sha256:<hex>",
            ),
            (
                "resources.limits.cpu=lots",
                "a CPU limit that is not a quantity",
            ),
            (
                "securityContext.selinuxOptions.type=super_t",
                "a misspelt securityContext field",
            ),
            (
                "podSecurityContext.runAsUser=-1",
                "a negative UID in podSecurityContext",
            ),
            (
                "nodeAffinity.excludeComputeTypes=fargate",
                "excluded compute types that are not a list",
            ),
            (
                "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=a,affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Like",
                "a node selector operator Kubernetes does not have",
            ),
            ("affinity.nodeAfinity.x=y", "a misspelt affinity field"),
            (
                "networkPolicy.metricsFrom[0].podSelectr.app=prometheus",
                "a misspelt NetworkPolicy peer field",
            ),
        ] {
            let args = ["lint", "--strict", path_str(&dir)?, "--set", bad];
            let _turn = e2e::charts::chart_dirs_lock(&args)?;
            let out = helm.command().args(args).output()?;
            ensure!(
                !out.status.success(),
                "{}: helm lint accepted {why} ({bad}): values.schema.json is too loose",
                spec.name
            );
        }
    }
    for spec in CHARTS {
        notes_warn_without_the_admission_policy(helm, root, spec)?;
    }
    unit_test_rendering_is_current(helm, root)?;
    eprintln!(
        "==> charts: helm {} lint + {rendered} renders checked in {:.0}s",
        helm.version,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The unit tests of [`crate::charts::objects`] run without Helm on a stored
/// rendering (`xtask/src/charts/testdata/efa-rendered-defaults.yaml`). A template
/// change that is not carried into that file makes those tests check an old
/// chart (or fail on a rule the chart has since gained), so the stored file
/// must equal what `helm template` renders now, object for object.
fn unit_test_rendering_is_current(helm: &Helm, root: &Path) -> Result<()> {
    let stored_path = root.join("xtask/src/charts/testdata/efa-rendered-defaults.yaml");
    let stored = manifest_checks::parse(&std::fs::read_to_string(&stored_path)?)?;
    let now = manifest_checks::parse(&render(helm, root, &EFA, RELEASE, NAMESPACE, &[], None)?)?;
    ensure!(
        stored == now,
        "{} is not what `helm template {RELEASE} charts/{} --namespace {NAMESPACE}` renders now: \
         regenerate it (keep its two comment lines) so that the chart_objects unit tests check the current chart",
        stored_path.display(),
        EFA.name
    );
    Ok(())
}

/// The install notes (`helm install --dry-run=client`, what a user sees)
/// warn when the admission policy is off but RBAC is on: nothing then
/// confines a node's driver to its own node's objects. No warning with the
/// defaults; the Node patch is named only for a chart that may patch Nodes.
/// They also warn with `hostNetwork=true`, where the ops port is a port of
/// the node that no NetworkPolicy covers.
fn notes_warn_without_the_admission_policy(
    helm: &Helm,
    root: &Path,
    spec: &crate::charts::specs::ChartSpec,
) -> Result<()> {
    let dir = root.join("charts").join(spec.name);
    let notes = |set: &[&str]| -> Result<String> {
        let mut args = vec![
            "install",
            RELEASE,
            path_str(&dir)?,
            "--dry-run=client",
            "--namespace",
            NAMESPACE,
        ];
        for s in set {
            args.extend(["--set", s]);
        }
        let out = helm.output(&args)?;
        Ok(out
            .split_once("NOTES:")
            .map(|(_, n)| n.to_owned())
            .unwrap_or_default())
    };
    let defaults = notes(&[])?;
    ensure!(
        !defaults.is_empty() && !defaults.contains("WARNING"),
        "{}: the default install notes are missing or warn:\n{defaults}",
        spec.name
    );
    let off = notes(&["validatingAdmissionPolicy.enabled=false"])?;
    ensure!(
        off.contains("WARNING: validatingAdmissionPolicy.enabled=false"),
        "{}: no warning in the install notes with the admission policy off:\n{off}",
        spec.name
    );
    let patches_nodes = spec.node_verbs.contains(&"patch");
    ensure!(
        off.contains("patch\nevery Node") == patches_nodes,
        "{}: the warning {} the Node patch, but the chart {} patch Nodes:\n{off}",
        spec.name,
        if patches_nodes { "omits" } else { "names" },
        if patches_nodes { "may" } else { "may not" }
    );
    let no_rbac = notes(&[
        "validatingAdmissionPolicy.enabled=false",
        "rbac.create=false",
    ])?;
    ensure!(
        !no_rbac.contains("WARNING"),
        "{}: warns about the policy though the chart grants nothing (rbac.create=false)",
        spec.name
    );
    let host = notes(&["hostNetwork=true", "metrics.port=9464"])?;
    ensure!(
        host.contains(
            "WARNING: hostNetwork=true. /metrics, /healthz and /readyz listen on port 9464"
        ),
        "{}: no warning in the install notes that hostNetwork puts the ops port beyond the NetworkPolicy:\n{host}",
        spec.name
    );
    eprintln!(
        "==> charts: {} install notes warn without the admission policy and with hostNetwork",
        spec.name
    );
    Ok(())
}
