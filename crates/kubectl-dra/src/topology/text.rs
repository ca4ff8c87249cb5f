//! The topology for a terminal: Unicode boxes, one mark per device state,
//! colour only when asked (the binary asks when stdout is a terminal and
//! `NO_COLOR` is unset), so piped output and logs stay plain.
//!
//! The layout is for 80 to 100 columns: PCIe roots as one two-column table
//! (root, devices), the Neuron chips as a grid of cells four wide, then the
//! lines a picture cannot hold (device groups, who holds what, full taints).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{ChipCell, NodeTopology, State, Unit, UnitKind};

/// A grid cell's text is cut to this many columns (names are shorter).
const CELL_MAX: usize = 21;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Paint {
    Plain,
    Bold,
    State(State),
}

/// One line of text made of painted segments.
#[derive(Debug, Clone, Default)]
struct Line(Vec<(String, Paint)>);

impl Line {
    fn new() -> Line {
        Line(Vec::new())
    }

    fn plain(s: impl Into<String>) -> Line {
        Line(vec![(s.into(), Paint::Plain)])
    }

    fn push(mut self, s: impl Into<String>, p: Paint) -> Line {
        self.0.push((s.into(), p));
        self
    }

    fn width(&self) -> usize {
        self.0.iter().map(|(s, _)| s.chars().count()).sum()
    }

    /// At most `max` columns, the last one `…` when cut.
    fn truncate(self, max: usize) -> Line {
        if self.width() <= max {
            return self;
        }
        let mut left = max.saturating_sub(1);
        let mut out = Line::new();
        for (s, p) in self.0 {
            if left == 0 {
                break;
            }
            let taken: String = s.chars().take(left).collect();
            left -= taken.chars().count();
            out.0.push((taken, p));
        }
        out.push("…", Paint::Plain)
    }

    fn render(&self, color: bool, pad_to: usize) -> String {
        let mut out = String::new();
        for (s, p) in &self.0 {
            match (color, paint_code(*p)) {
                (true, Some(code)) => {
                    let _ = write!(out, "\x1b[{code}m{s}\x1b[0m");
                }
                _ => out.push_str(s),
            }
        }
        out.extend(std::iter::repeat_n(
            ' ',
            pad_to.saturating_sub(self.width()),
        ));
        out
    }
}

fn paint_code(p: Paint) -> Option<&'static str> {
    match p {
        Paint::Plain => None,
        Paint::Bold => Some("1"),
        Paint::State(State::Free) => Some("32"),
        Paint::State(State::Allocated) => Some("33"),
        Paint::State(State::Tainted) => Some("35"),
        Paint::State(State::Unhealthy) => Some("1;31"),
    }
}

/// The mark drawn before a device.
pub fn mark(state: State) -> &'static str {
    match state {
        State::Free => "○",
        State::Allocated => "●",
        State::Tainted => "▲",
        State::Unhealthy => "✖",
    }
}

/// The mark of one NeuronCore in a chip cell.
pub fn core_mark(state: State) -> &'static str {
    match state {
        State::Free => "□",
        State::Allocated => "■",
        State::Tainted | State::Unhealthy => "✕",
    }
}

/// Renders the whole picture.
pub fn render(t: &NodeTopology, color: bool) -> String {
    let mut out = String::new();
    let mut title = Line::new().push(format!("Node {}", t.node), Paint::Bold);
    if let Some(it) = &t.instance_type {
        title = title.push(format!(" · {it}"), Paint::Plain);
    }
    title = title.push(format!(" · {}", counts(t)), Paint::Plain);
    line(&mut out, &title, color);
    let mut legend = Line::new();
    for (i, s) in [
        State::Free,
        State::Allocated,
        State::Tainted,
        State::Unhealthy,
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            legend = legend.push("  ", Paint::Plain);
        }
        legend = legend
            .push(mark(s), Paint::State(s))
            .push(format!(" {}", state_word(s)), Paint::Plain);
    }
    line(&mut out, &legend, color);

    if !t.roots.is_empty() {
        out.push('\n');
        line(
            &mut out,
            &Line::plain("").push("PCIe roots", Paint::Bold),
            color,
        );
        roots_table(&mut out, t, color);
    }
    if let Some(grid) = &t.grid {
        out.push('\n');
        let how = if grid.torus {
            format!(
                "{}×{} torus: row topology_x, column topology_y",
                grid.rows, grid.cols
            )
        } else {
            "in deviceId order, four to a row".to_string()
        };
        line(
            &mut out,
            &Line::new()
                .push("Neuron chips", Paint::Bold)
                .push(format!(" ({how})"), Paint::Plain),
            color,
        );
        chip_grid(&mut out, grid, color);
        if grid.chips.iter().any(|c| !c.cores.is_empty()) {
            line(
                &mut out,
                &Line::plain("NeuronCores: ")
                    .push(core_mark(State::Free), Paint::State(State::Free))
                    .push(" free  ", Paint::Plain)
                    .push(core_mark(State::Allocated), Paint::State(State::Allocated))
                    .push(" allocated  ", Paint::Plain)
                    .push(core_mark(State::Unhealthy), Paint::State(State::Unhealthy))
                    .push(" tainted or unhealthy", Paint::Plain),
                color,
            );
        }
    }
    if !t.others.is_empty() {
        out.push('\n');
        line(
            &mut out,
            &Line::new().push("Other devices", Paint::Bold),
            color,
        );
        for u in &t.others {
            line(&mut out, &unit_line(u, 0, 0).0, color);
        }
    }
    if !t.groups.is_empty() {
        out.push('\n');
        line(
            &mut out,
            &Line::new().push("Device groups", Paint::Bold),
            color,
        );
        for g in &t.groups {
            let _ = writeln!(
                out,
                "  {:<4} {} = {}: {}",
                g.label,
                g.attribute,
                g.value,
                group_members(t, &g.label)
            );
        }
    }
    let allocated = t.allocated();
    if !allocated.is_empty() {
        out.push('\n');
        line(&mut out, &Line::new().push("Allocated", Paint::Bold), color);
        let mut by_claim: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for u in allocated {
            for h in &u.holders {
                by_claim.entry(h).or_default().push(&u.id.device);
            }
        }
        for (claim, devices) in by_claim {
            line(
                &mut out,
                &Line::plain("  ")
                    .push(mark(State::Allocated), Paint::State(State::Allocated))
                    .push(format!(" {claim}: {}", devices.join(", ")), Paint::Plain),
                color,
            );
        }
    }
    let lines = t.trouble_lines();
    let pools: Vec<&Unit> = t.units().filter(|u| u.pool_problem.is_some()).collect();
    if !lines.is_empty() || !pools.is_empty() {
        out.push('\n');
        line(
            &mut out,
            &Line::new().push("Tainted or unhealthy", Paint::Bold),
            color,
        );
        for l in lines {
            let state = if l.unhealthy {
                State::Unhealthy
            } else {
                State::Tainted
            };
            line(
                &mut out,
                &Line::plain("  ")
                    .push(mark(state), Paint::State(state))
                    .push(
                        format!(" {}: {} ({})", l.devices, l.taint, l.source),
                        Paint::Plain,
                    ),
                color,
            );
        }
        for u in pools {
            if let Some(p) = &u.pool_problem {
                let _ = writeln!(out, "  ! {}: ignored by the scheduler: {p}", u.id.device);
            }
        }
    }
    out
}

fn line(out: &mut String, l: &Line, color: bool) {
    out.push_str(l.render(color, 0).trim_end());
    out.push('\n');
}

fn state_word(s: State) -> &'static str {
    match s {
        State::Free => "free",
        State::Allocated => "allocated",
        State::Tainted => "tainted",
        State::Unhealthy => "unhealthy",
    }
}

/// `8 GPUs, 32 EFAs, 16 Neuron chips (128 cores)`.
pub fn counts(t: &NodeTopology) -> String {
    let mut n: BTreeMap<UnitKind, usize> = BTreeMap::new();
    for u in t.units() {
        *n.entry(u.kind).or_default() += 1;
    }
    let mut parts = Vec::new();
    let mut add = |kind: UnitKind, one: &str, many: &str| {
        if let Some(&c) = n.get(&kind) {
            parts.push(format!("{c} {}", if c == 1 { one } else { many }));
        }
    };
    add(UnitKind::Gpu, "GPU", "GPUs");
    add(UnitKind::Efa, "EFA", "EFAs");
    add(UnitKind::NeuronChip, "Neuron chip", "Neuron chips");
    add(
        UnitKind::NeuronCore,
        "NeuronCore device",
        "NeuronCore devices",
    );
    add(
        UnitKind::NeuronNode,
        "whole-node device",
        "whole-node devices",
    );
    add(UnitKind::Other, "other device", "other devices");
    parts.join(", ")
}

/// `chips 0-3 · efa-0000-10-19-0, efa-0000-a0-19-0`.
pub fn group_members(t: &NodeTopology, label: &str) -> String {
    let chips: Vec<i64> = t
        .grid
        .iter()
        .flat_map(|g| g.chips.iter())
        .filter(|c| c.chip.groups.iter().any(|l| l == label))
        .map(|c| c.index)
        .collect();
    let others: Vec<&Unit> = t
        .roots
        .iter()
        .flat_map(|r| r.units.iter())
        .chain(t.others.iter())
        .filter(|u| u.groups.iter().any(|l| l == label))
        .collect();
    let mut parts = Vec::new();
    if !chips.is_empty() {
        parts.push(format!("chips {}", ranges(&chips)));
    }
    // Their rows above carry the label too; past a handful a count reads better.
    match others.len() {
        0 => {}
        1..=4 => parts.push(
            others
                .iter()
                .map(|u| u.id.device.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        n if others.iter().all(|u| u.kind == UnitKind::Efa) => parts.push(format!("{n} EFAs")),
        n => parts.push(format!("{n} devices")),
    }
    parts.join(" · ")
}

/// `0-3,8,10-11` from sorted or unsorted indices.
pub fn ranges(values: &[i64]) -> String {
    let mut v = values.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        let mut end = start;
        while i + 1 < v.len() && v[i + 1] == end + 1 {
            i += 1;
            end = v[i];
        }
        out.push(if end == start {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

/// A device row: mark, tag, name, detail, groups, status; names and details
/// padded to the widths given so that rows line up.
fn unit_line(u: &Unit, name_w: usize, detail_w: usize) -> (Line, usize) {
    let state = u.state();
    let mut l = Line::new()
        .push(mark(state), Paint::State(state))
        .push(format!(" {:<4} ", u.kind.tag()), Paint::Plain)
        .push(format!("{:<name_w$}", u.id.device), Paint::Plain);
    if detail_w > 0 || !u.detail.is_empty() {
        l = l.push(format!("  {:<detail_w$}", u.detail), Paint::Plain);
    }
    if !u.groups.is_empty() {
        l = l.push(format!("  {}", u.groups.join(" ")), Paint::Plain);
    }
    l = l
        .push("  ", Paint::Plain)
        .push(u.status(), Paint::State(state));
    let w = l.width();
    (l, w)
}

fn roots_table(out: &mut String, t: &NodeTopology, color: bool) {
    let name_w = t
        .roots
        .iter()
        .flat_map(|r| r.units.iter())
        .map(|u| u.id.device.chars().count())
        .max()
        .unwrap_or(0);
    let detail_w = t
        .roots
        .iter()
        .flat_map(|r| r.units.iter())
        .map(|u| u.detail.chars().count())
        .max()
        .unwrap_or(0);
    // Per root: left column lines and right column lines.
    let mut blocks: Vec<(Vec<Line>, Vec<Line>)> = Vec::new();
    for r in &t.roots {
        let mut left = vec![Line::plain(r.root.clone())];
        if !r.numa.is_empty() {
            left.push(Line::plain(format!("NUMA {}", r.numa.join(","))));
        }
        let mut right: Vec<Line> = r
            .units
            .iter()
            .map(|u| unit_line(u, name_w, detail_w).0)
            .collect();
        if !r.neuron_chips.is_empty() {
            right.push(Line::plain(format!(
                "  NRN  Neuron chip{} {} (grid below)",
                if r.neuron_chips.len() == 1 { "" } else { "s" },
                ranges(&r.neuron_chips)
            )));
        }
        blocks.push((left, right));
    }
    let lw = blocks
        .iter()
        .flat_map(|b| b.0.iter())
        .map(Line::width)
        .max()
        .unwrap_or(0);
    let rw = blocks
        .iter()
        .flat_map(|b| b.1.iter())
        .map(Line::width)
        .max()
        .unwrap_or(0);
    let rule = |l: &str, m: &str, r: &str| {
        format!("{l}{}{m}{}{r}\n", "─".repeat(lw + 2), "─".repeat(rw + 2))
    };
    out.push_str(&rule("╭", "┬", "╮"));
    for (i, (left, right)) in blocks.iter().enumerate() {
        if i > 0 {
            out.push_str(&rule("├", "┼", "┤"));
        }
        for k in 0..left.len().max(right.len()) {
            let l = left.get(k).cloned().unwrap_or_default();
            let r = right.get(k).cloned().unwrap_or_default();
            let _ = writeln!(out, "│ {} │ {} │", l.render(color, lw), r.render(color, rw));
        }
    }
    out.push_str(&rule("╰", "┴", "╯"));
}

fn cell_lines(c: &ChipCell) -> Vec<Line> {
    let state = c.chip.state();
    let mut lines = vec![
        Line::new()
            .push(mark(state), Paint::State(state))
            .push(format!(" {}", c.chip.id.device), Paint::Plain),
    ];
    let groups = if c.chip.groups.is_empty() {
        "no device group".to_string()
    } else {
        c.chip.groups.join(" ")
    };
    lines.push(Line::plain(format!("  {groups}")));
    if c.cores.is_empty() {
        lines.push(Line::plain(match c.core_count {
            Some(n) => format!("  {n} cores, whole chip"),
            None => "  whole chip".to_string(),
        }));
    } else {
        let mut l = Line::plain("  ");
        for core in &c.cores {
            let s = core.state();
            l = l.push(core_mark(s), Paint::State(s));
        }
        lines.push(l);
    }
    let status = if state == State::Free {
        let held: usize = c.cores.iter().filter(|u| u.state() != State::Free).count();
        if held > 0 {
            format!("{held} of {} cores in use", c.cores.len())
        } else {
            "free".to_string()
        }
    } else {
        c.chip.status()
    };
    let paint = if state == State::Free && status != "free" {
        Paint::State(State::Allocated)
    } else {
        Paint::State(state)
    };
    lines.push(Line::plain("  ").push(status, paint));
    lines.into_iter().map(|l| l.truncate(CELL_MAX)).collect()
}

fn chip_grid(out: &mut String, grid: &super::NeuronGrid, color: bool) {
    let mut cells: BTreeMap<(usize, usize), Vec<Line>> = BTreeMap::new();
    for c in &grid.chips {
        cells.insert((c.row, c.col), cell_lines(c));
    }
    let w = cells.values().flatten().map(Line::width).max().unwrap_or(0);
    let h = cells.values().map(Vec::len).max().unwrap_or(0);
    let rule = |l: &str, m: &str, r: &str| {
        let mut s = String::from(l);
        for col in 0..grid.cols {
            if col > 0 {
                s.push_str(m);
            }
            s.push_str(&"─".repeat(w + 2));
        }
        s.push_str(r);
        s.push('\n');
        s
    };
    out.push_str(&rule("╭", "┬", "╮"));
    for row in 0..grid.rows {
        if row > 0 {
            out.push_str(&rule("├", "┼", "┤"));
        }
        for k in 0..h {
            out.push('│');
            for col in 0..grid.cols {
                let l = cells
                    .get(&(row, col))
                    .and_then(|c| c.get(k))
                    .cloned()
                    .unwrap_or_default();
                let _ = write!(out, " {} │", l.render(color, w));
            }
            out.push('\n');
        }
    }
    out.push_str(&rule("╰", "┴", "╯"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_condense_runs() {
        assert_eq!(ranges(&[3, 0, 1, 2, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(ranges(&[5]), "5");
        assert_eq!(ranges(&[]), "");
    }

    #[test]
    fn truncation_keeps_width() {
        let l = Line::plain("abcdef").push("ghij", Paint::Bold).truncate(7);
        assert_eq!(l.width(), 7);
        assert_eq!(l.render(false, 0), "abcdef…");
    }

    #[test]
    fn colour_only_when_asked() {
        let l = Line::new().push("x", Paint::State(State::Unhealthy));
        assert_eq!(l.render(false, 3), "x  ");
        assert_eq!(l.render(true, 0), "\x1b[1;31mx\x1b[0m");
    }
}
