//! `explain`, `devices` and `topology` on 100 and 1,000 nodes, from what
//! `-f` reads: the fleet of `tests/support/fleet.rs` (our drivers' real
//! `discover` output, half trn2.48xlarge with NeuronCore partitions, half
//! p5.48xlarge) as one JSON list. Each iteration is the whole path: parsing
//! the text, indexing slices and claims, then the command's work.
//!
//! Run: `cargo bench -p kubectl-dra --bench explain`.

#[path = "../tests/support/fleet.rs"]
mod fleet;

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use kubectl_dra::devices::{self, Filter};
use kubectl_dra::explain::{Allocatable, Scope, explain, subjects_for_claim, subjects_for_pod};
use kubectl_dra::inventory::Inventory;
use kubectl_dra::topology;
use kubectl_dra::world::World;

fn load(text: &str) -> Inventory {
    let mut inv = Inventory::default();
    inv.add_text(Path::new("fleet.json"), text)
        .unwrap_or_else(|e| panic!("{e}"));
    inv
}

fn explain_claim(text: &str) -> Allocatable {
    let inv = load(text);
    let world = World::new(&inv);
    let subjects = subjects_for_claim(&inv, "default", "train").unwrap_or_else(|e| panic!("{e}"));
    explain(&world, &subjects[0], &Scope::default()).allocatable
}

fn explain_pod(text: &str) -> Allocatable {
    let inv = load(text);
    let world = World::new(&inv);
    let (subjects, scope) = subjects_for_pod(&inv, "default", "neuron-4-chips-with-efas")
        .unwrap_or_else(|e| panic!("{e}"));
    explain(&world, &subjects[0], &scope).allocatable
}

fn devices_table(text: &str) -> usize {
    let inv = load(text);
    let world = World::new(&inv);
    devices::table(&devices::rows(&world, &Filter::default()), false).len()
}

fn topology_text(text: &str) -> usize {
    let inv = load(text);
    let world = World::new(&inv);
    let picture = topology::build(&world, &fleet::node_name(0)).unwrap_or_else(|e| panic!("{e}"));
    topology::text::render(&picture, false).len()
}

fn bench(c: &mut Criterion) {
    for nodes in [100, 1000] {
        let text = fleet::json(nodes);
        // The answers themselves, so that the benchmark measures real work.
        assert_eq!(explain_claim(&text), Allocatable::Yes);
        assert_eq!(explain_pod(&text), Allocatable::Yes);
        let mut group = c.benchmark_group(format!("{nodes}_nodes"));
        group.sample_size(if nodes >= 1000 { 10 } else { 20 });
        group.bench_function("explain_claim", |b| {
            b.iter(|| explain_claim(black_box(&text)))
        });
        group.bench_function("explain_pod", |b| b.iter(|| explain_pod(black_box(&text))));
        group.bench_function("devices", |b| b.iter(|| devices_table(black_box(&text))));
        group.bench_function("topology", |b| b.iter(|| topology_text(black_box(&text))));
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
