//! Plain-text rendering of an explanation, for people.

use std::fmt::Write;

use crate::explain::{Allocatable, Explanation, device_status};

pub fn explanation(e: &Explanation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", e.subject);
    if e.allocatable == Allocatable::Allocated {
        for c in &e.chosen {
            let _ = writeln!(
                out,
                "  request {:?}: {} on node {}",
                c.request, c.device, c.node
            );
            for why in &c.why {
                let _ = writeln!(out, "    - {why}");
            }
        }
        if !e.device_status.is_empty() {
            let _ = writeln!(out, "  device status (status.devices):");
        }
        for line in device_status::lines(&e.device_status) {
            let _ = writeln!(out, "    {line}");
        }
    }
    for r in &e.requests {
        let _ = writeln!(
            out,
            "  request {:?}: {} of DeviceClass {:?}",
            r.name, r.wants, r.device_class
        );
        for (i, s) in r.selectors.iter().enumerate() {
            let _ = writeln!(out, "    selector #{i}: {s}");
        }
        let _ = writeln!(
            out,
            "    candidates: {}{}",
            r.candidate_count,
            match &r.best_node {
                Some((node, n)) => format!(" (most on one node: {n} on {node})"),
                None => String::new(),
            }
        );
        for c in &r.candidates {
            let _ = writeln!(out, "      {c}");
        }
        if r.other_class_devices > 0 {
            let _ = writeln!(
                out,
                "    not of this class: {} device(s)",
                r.other_class_devices
            );
        }
        for g in &r.rejected {
            let _ = writeln!(out, "    rejected ({}): {}", g.count, g.reason);
            for d in &g.devices {
                let _ = writeln!(out, "      {d}");
            }
        }
    }
    for c in &e.constraints {
        let _ = writeln!(
            out,
            "  constraint: matchAttribute {} across {}",
            c.attribute,
            c.requests.join(", ")
        );
        for row in &c.rows {
            let counts: Vec<String> = row
                .counts
                .iter()
                .map(|(r, count)| format!("{r} {count}"))
                .collect();
            let _ = writeln!(
                out,
                "    {} {} = {}: {}",
                if row.satisfies_all { "ok  " } else { "short" },
                row.node,
                row.value,
                counts.join(", ")
            );
        }
    }
    if e.allocatable == Allocatable::Yes && !e.chosen.is_empty() {
        let _ = writeln!(out, "  would allocate:");
        for c in &e.chosen {
            let _ = writeln!(out, "    {} -> {} (node {})", c.request, c.device, c.node);
        }
    }
    let _ = writeln!(out, "Verdict: {}", e.verdict);
    for p in &e.problems {
        let _ = writeln!(out, "  No longer holds: {p}");
    }
    for a in &e.advice {
        let _ = writeln!(out, "  To change: {a}");
    }
    out
}
