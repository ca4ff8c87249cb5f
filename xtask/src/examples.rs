//! Tests of `examples/`: every manifest parses, every object is a v1 API
//! type with no unknown field, and the parts that tie objects together are
//! consistent (class names, request names in constraints and configs, the
//! pod's claim references, the attribute names of constraints, opaque
//! configs). These tests cannot allocate anything; the e2e applies the
//! examples to a cluster.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::manifest_checks;

/// All objects of `kind`.
fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

/// The one object of `kind` (and `name`, when given).
fn one<'a>(objs: &'a [Value], kind: &str, name: Option<&str>) -> Result<&'a Value> {
    let found: Vec<&Value> = of_kind(objs, kind)
        .into_iter()
        .filter(|o| name.is_none_or(|n| o["metadata"]["name"] == n))
        .collect();
    match found.as_slice() {
        [one] => Ok(one),
        _ => anyhow::bail!(
            "expected exactly one {kind}{}, found {}",
            name.map(|n| format!(" named {n}")).unwrap_or_default(),
            found.len()
        ),
    }
}

const CLASSES: [&str; 3] = ["efa.networking.k8s.aws", "neuron.aws.com", "gpu.nvidia.com"];

/// Attributes a constraint may match on: those both sides of a pairing publish.
const SHARED_ATTRIBUTES: [&str; 8] = [
    // Within the Neuron driver: AWS's groups of 4 and 8 chips.
    "neuron.aws.com/topology4_id",
    "neuron.aws.com/topology8_id",
    "resource.kubernetes.io/pcieRoot",
    "resource.kubernetes.io/numaNode",
    "resource.aws.com/devicegroup1_id",
    "resource.aws.com/devicegroup4_id",
    "resource.aws.com/devicegroup8_id",
    "resource.aws.com/devicegroup16_id",
];

fn example_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files = Vec::new();
    for group in std::fs::read_dir(&root).unwrap() {
        let group = group.unwrap().path();
        if !group.is_dir() {
            continue;
        }
        assert!(
            group.join("README.md").is_file(),
            "{} has no README.md",
            group.display()
        );
        for f in std::fs::read_dir(&group).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|e| e == "yaml") {
                files.push(f);
            }
        }
    }
    files.sort();
    files
}

/// The claim spec of a ResourceClaim or ResourceClaimTemplate.
fn claim_spec(obj: &Value) -> Option<&Value> {
    match obj["kind"].as_str()? {
        "ResourceClaim" => Some(&obj["spec"]),
        "ResourceClaimTemplate" => Some(&obj["spec"]["spec"]),
        _ => None,
    }
}

fn check_claim(spec: &Value) -> Result<()> {
    let requests = spec["devices"]["requests"]
        .as_array()
        .context("no devices.requests")?;
    let mut names = BTreeSet::new();
    for r in requests {
        let name = r["name"].as_str().context("request without name")?;
        ensure!(names.insert(name), "duplicate request {name}");
        let exactly = &r["exactly"];
        let class = exactly["deviceClassName"]
            .as_str()
            .context("no exactly.deviceClassName")?;
        ensure!(CLASSES.contains(&class), "unknown DeviceClass {class}");
        match exactly["allocationMode"].as_str().unwrap_or("ExactCount") {
            "All" => ensure!(
                exactly["count"].is_null(),
                "{name}: count with allocationMode All"
            ),
            "ExactCount" => {
                let count = exactly["count"].as_i64().unwrap_or(1);
                ensure!((1..=16).contains(&count), "{name}: count {count}")
            }
            other => anyhow::bail!("{name}: allocationMode {other}"),
        }
        for sel in exactly["selectors"].as_array().into_iter().flatten() {
            let expr = sel["cel"]["expression"]
                .as_str()
                .context("selector without cel.expression")?;
            ensure!(
                expr.contains("device.attributes["),
                "selector reads no attribute: {expr}"
            );
        }
    }
    for c in spec["devices"]["constraints"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for r in c["requests"]
            .as_array()
            .context("constraint without requests")?
        {
            ensure!(
                names.contains(r.as_str().unwrap_or_default()),
                "constraint names unknown request {r}"
            );
        }
        let attr = c["matchAttribute"]
            .as_str()
            .context("constraint without matchAttribute")?;
        ensure!(
            SHARED_ATTRIBUTES.contains(&attr),
            "matchAttribute {attr} is not a shared attribute"
        );
    }
    for c in spec["devices"]["config"].as_array().into_iter().flatten() {
        for r in c["requests"].as_array().into_iter().flatten() {
            ensure!(
                names.contains(r.as_str().unwrap_or_default()),
                "config names unknown request {r}"
            );
        }
        let opaque = &c["opaque"];
        let p = &opaque["parameters"];
        match opaque["driver"].as_str() {
            Some("neuron.aws.com") => {
                // Both of AWS's kinds, under ours and AWS's beta apiVersions.
                ensure!(
                    matches!(
                        p["apiVersion"].as_str(),
                        Some(
                            "neuron.aws.com/v1"
                                | "neuron.aws.com/v1alphav1"
                                | "resource.neuron.aws.com/v1alphav1"
                        )
                    ),
                    "{p}"
                );
                let keys: BTreeSet<&str> =
                    p.as_object().unwrap().keys().map(String::as_str).collect();
                let (field, allowed): (&str, &[i64]) = match p["kind"].as_str() {
                    Some("NeuronConfig") => ("logicalNeuronCore", &[1, 2]),
                    Some("UltraServerConfig") => ("ultraserverMode", &[1, 2, 4]),
                    _ => anyhow::bail!("unknown Neuron config kind: {p}"),
                };
                ensure!(
                    keys.is_subset(&BTreeSet::from(["apiVersion", "kind", field])),
                    "unknown {} field: {keys:?}",
                    p["kind"]
                );
                ensure!(
                    p[field].as_i64().is_some_and(|v| allowed.contains(&v)),
                    "{field} must be one of {allowed:?}"
                );
            }
            Some("efa.networking.k8s.aws") => {
                ensure!(
                    p["apiVersion"] == "efa.networking.k8s.aws/v1" && p["kind"] == "EfaConfig",
                    "{p}"
                )
            }
            other => anyhow::bail!("opaque config for unknown driver {other:?}"),
        }
    }
    Ok(())
}

fn check_pod(pod: &Value, objs: &[Value]) -> Result<()> {
    let spec = &pod["spec"];
    let mut claim_names = BTreeSet::new();
    for rc in spec["resourceClaims"]
        .as_array()
        .context("pod without resourceClaims")?
    {
        claim_names.insert(
            rc["name"]
                .as_str()
                .context("resourceClaims[] without name")?,
        );
        let (kind, name) = match (
            rc["resourceClaimName"].as_str(),
            rc["resourceClaimTemplateName"].as_str(),
        ) {
            (Some(n), None) => ("ResourceClaim", n),
            (None, Some(n)) => ("ResourceClaimTemplate", n),
            _ => anyhow::bail!(
                "resourceClaims[] needs exactly one of resourceClaimName/resourceClaimTemplateName"
            ),
        };
        one(objs, kind, Some(name)).with_context(|| format!("pod refers to {kind} {name}"))?;
    }
    for c in spec["containers"]
        .as_array()
        .context("pod without containers")?
    {
        for claim in c["resources"]["claims"]
            .as_array()
            .context("container uses no claim")?
        {
            let n = claim["name"].as_str().unwrap_or_default();
            ensure!(
                claim_names.contains(n),
                "container claim {n} is not in spec.resourceClaims"
            );
        }
    }
    Ok(())
}

#[test]
fn every_example_is_valid_v1() {
    let files = example_files();
    assert!(files.len() >= 12, "examples went missing: {files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let objs =
            manifest_checks::parse(&text).unwrap_or_else(|e| panic!("{}: {e:#}", f.display()));
        assert!(!objs.is_empty(), "{} is empty", f.display());
        let mut claims = 0;
        for obj in &objs {
            let what = format!("{}: {}", f.display(), manifest_checks::id(obj));
            manifest_checks::check_typed(obj).unwrap_or_else(|e| panic!("{what}: {e:#}"));
            if let Some(spec) = claim_spec(obj) {
                assert_eq!(obj["apiVersion"], "resource.k8s.io/v1", "{what}");
                check_claim(spec).unwrap_or_else(|e| panic!("{what}: {e:#}"));
                claims += 1;
            }
            if obj["kind"] == "Pod" {
                check_pod(obj, &objs).unwrap_or_else(|e| panic!("{what}: {e:#}"));
            }
            // A LeaderWorkerSet's pods are its templates.
            for t in ["leaderTemplate", "workerTemplate"] {
                let template = &obj["spec"]["leaderWorkerTemplate"][t];
                if obj["kind"] == "LeaderWorkerSet" && !template.is_null() {
                    check_pod(template, &objs).unwrap_or_else(|e| panic!("{what} {t}: {e:#}"));
                }
            }
        }
        assert!(claims > 0, "{} has no claim", f.display());
    }
}

#[test]
fn claim_checks_can_fail() {
    let good: Value = serde_json::json!({"devices": {
        "requests": [{"name": "a", "exactly": {"deviceClassName": "neuron.aws.com", "count": 4}},
                     {"name": "b", "exactly": {"deviceClassName": "efa.networking.k8s.aws", "allocationMode": "All"}}],
        "constraints": [{"requests": ["a", "b"], "matchAttribute": "resource.aws.com/devicegroup4_id"}],
        "config": [{"requests": ["a"], "opaque": {"driver": "neuron.aws.com", "parameters":
            {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}}}]}});
    check_claim(&good).unwrap();
    let table: [(&str, &str, Value); 5] = [
        (
            "unknown class",
            "/devices/requests/0/exactly/deviceClassName",
            "neuron".into(),
        ),
        (
            "constraint on unknown request",
            "/devices/constraints/0/requests/1",
            "c".into(),
        ),
        (
            "attribute one side lacks",
            "/devices/constraints/0/matchAttribute",
            "neuron.aws.com/deviceId".into(),
        ),
        (
            "LNC 3",
            "/devices/config/0/opaque/parameters/logicalNeuronCore",
            3.into(),
        ),
        (
            "count with All",
            "/devices/requests/1/exactly/count",
            2.into(),
        ),
    ];
    for (flaw, ptr, value) in table {
        let mut bad = good.clone();
        match bad.pointer_mut(ptr) {
            Some(slot) => *slot = value,
            None => {
                let (parent, key) = ptr.rsplit_once('/').unwrap();
                bad.pointer_mut(parent).unwrap()[key] = value;
            }
        }
        assert!(check_claim(&bad).is_err(), "not caught: {flaw}");
    }
}
