//! Writes a generated fleet for measuring `kubectl dra` by hand:
//!
//! ```text
//! cargo run -p kubectl-dra --release --example fleet -- 1000 /tmp/fleet-1000.json
//! /usr/bin/time -v target/release/kubectl-dra -f /tmp/fleet-1000.json explain claim train
//! ```
//!
//! The fleet is described in `tests/support/fleet.rs`.

#[path = "../tests/support/fleet.rs"]
mod fleet;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(nodes), Some(out)) = (args.first().and_then(|n| n.parse().ok()), args.get(1)) else {
        eprintln!("usage: fleet NODES OUT.json");
        return ExitCode::from(2);
    };
    let text = fleet::json(nodes);
    if let Err(e) = std::fs::write(out, &text) {
        eprintln!("error: writing {out}: {e}");
        return ExitCode::FAILURE;
    }
    eprintln!(
        "{out}: {nodes} nodes ({} trn2.48xlarge, {} p5.48xlarge), {:.1} MB",
        nodes.div_ceil(2),
        nodes / 2,
        text.len() as f64 / 1e6
    );
    ExitCode::SUCCESS
}
