//! `explain` against 1000 nodes' slices: the issue wants an answer in under
//! a second. The cluster is generated from our drivers' real `discover`
//! output (trn2, trn1 and p5 nodes, renamed), with a quarter of the
//! EFAs already allocated, and the whole path is measured: indexing the
//! slices and claims, then explaining.
//!
//! Run: `cargo bench -p kubectl-dra --bench explain`.

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use kubectl_dra::explain::{Allocatable, Scope, explain, subjects_for_claim, subjects_for_pod};
use kubectl_dra::inventory::Inventory;
use kubectl_dra::world::World;

const NODES: usize = 1000;

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A node's discover output under another node name (node name = pool name).
fn renamed(text: &str, from: &str, to: &str) -> String {
    text.replace(&format!("nodeName: {from}\n"), &format!("nodeName: {to}\n"))
        .replace(&format!("name: {from}\n"), &format!("name: {to}\n"))
        .replace(&format!("name: {from}-"), &format!("name: {to}-"))
}

fn cluster() -> Inventory {
    let mut inv = Inventory::default();
    let add = |inv: &mut Inventory, text: &str| {
        inv.add_text(Path::new("generated"), text)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    add(&mut inv, &fixture("classes.yaml"));
    let shapes = [
        (
            "trn2",
            vec![fixture("trn2-efa.yaml"), fixture("trn2-neuron.yaml")],
        ),
        (
            "trn1",
            vec![fixture("trn1-efa.yaml"), fixture("trn1-neuron.yaml")],
        ),
        ("p5", vec![fixture("p5-efa.yaml")]),
    ];
    let mut holders = String::new();
    for n in 0..NODES {
        let (shape, files) = &shapes[n % shapes.len()];
        let node = format!("{shape}-{n:04}");
        for f in files {
            add(&mut inv, &renamed(f, shape, &node));
        }
        // Every fourth node has one EFA-hungry claim allocated on it.
        if n % 4 == 0 {
            let results: String = inv
                .slices
                .iter()
                .filter(|s| s.spec.pool.name == node && s.spec.driver == "efa.networking.k8s.aws")
                .flat_map(|s| s.spec.devices.iter().flatten())
                .take(4)
                .map(|d| format!("      - {{request: efas, driver: efa.networking.k8s.aws, pool: {node}, device: {}}}\n", d.name))
                .collect();
            holders.push_str(&format!(
                "---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: holder-{n}, namespace: jobs}}\nspec:\n  devices:\n    requests:\n    - name: efas\n      exactly: {{deviceClassName: efa.networking.k8s.aws, count: 4}}\nstatus:\n  allocation:\n    devices:\n      results:\n{results}"
            ));
        }
    }
    add(&mut inv, &holders);
    add(
        &mut inv,
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../examples/neuron/neuron-4-chips-with-efas.yaml"),
        )
        .unwrap_or_else(|e| panic!("{e}")),
    );
    add(
        &mut inv,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: impossible, namespace: default}\nspec:\n  devices:\n    requests:\n    - name: neurons\n      exactly:\n        deviceClassName: neuron.aws.com\n        count: 8\n        selectors:\n        - cel: {expression: 'device.attributes[\"neuron.aws.com\"].instanceType == \"trn1.32xlarge\"'}\n    - name: efas\n      exactly: {deviceClassName: efa.networking.k8s.aws, count: 8}\n    constraints:\n    - requests: [neurons, efas]\n      matchAttribute: resource.aws.com/devicegroup8_id\n",
    );
    inv
}

fn bench(c: &mut Criterion) {
    let inv = cluster();
    assert!(
        inv.slices.len() >= NODES,
        "generated {} slices",
        inv.slices.len()
    );
    let (pod_subjects, pod_scope) = subjects_for_pod(&inv, "default", "neuron-4-chips-with-efas")
        .unwrap_or_else(|e| panic!("{e}"));
    let impossible =
        subjects_for_claim(&inv, "default", "impossible").unwrap_or_else(|e| panic!("{e}"));
    // The answers themselves, so the benchmark measures real work.
    {
        let world = World::new(&inv);
        let e = explain(&world, &pod_subjects[0], &pod_scope);
        assert_eq!(e.allocatable, Allocatable::Yes, "{}", e.verdict);
        let e = explain(&world, &impossible[0], &Scope::default());
        assert_eq!(e.allocatable, Allocatable::No, "{}", e.verdict);
    }
    let mut group = c.benchmark_group("explain_1000_nodes");
    group.sample_size(10);
    group.bench_function("pending_pod_allocatable", |b| {
        b.iter(|| {
            let world = World::new(black_box(&inv));
            explain(&world, &pod_subjects[0], &pod_scope)
        })
    });
    group.bench_function("unsatisfiable_claim", |b| {
        b.iter(|| {
            let world = World::new(black_box(&inv));
            explain(&world, &impossible[0], &Scope::default())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
