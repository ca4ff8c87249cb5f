//! The topology as SVG, for docs and tickets: the same picture as the
//! terminal's ([`super::text`]), drawn with rectangles and text, every device
//! named in a `<text>` or, for NeuronCores (one small square each), in the
//! square's `<title>` (shown on hover), so a search of the file finds each.
//!
//! Plain SVG 1.1 with no scripts, styles or external fonts, so that GitHub,
//! browsers and ticket systems show it the same.

use std::fmt::Write as _;

use super::text::{counts, group_members, ranges};
use super::{NodeTopology, State, Unit};

const FONT: f64 = 12.0;
/// Advance of one character of a monospace font at [`FONT`].
const CHAR_W: f64 = 7.3;
const LINE_H: f64 = 17.0;
const MARGIN: f64 = 16.0;
const CELL_W: f64 = 176.0;
const CELL_H: f64 = 84.0;
const CORE: f64 = 11.0;

fn fill(state: State) -> &'static str {
    match state {
        State::Free => "#2e7d32",
        State::Allocated => "#e69500",
        State::Tainted => "#8e24aa",
        State::Unhealthy => "#c62828",
    }
}

fn word(state: State) -> &'static str {
    match state {
        State::Free => "free",
        State::Allocated => "allocated",
        State::Tainted => "tainted",
        State::Unhealthy => "unhealthy",
    }
}

/// Escapes text for an XML text node or attribute value.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Drawing state: the body so far and the lowest point reached.
struct Canvas {
    body: String,
    y: f64,
    width: f64,
}

impl Canvas {
    fn text(&mut self, x: f64, y: f64, s: &str, attrs: &str) {
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}"{attrs}>{}</text>"#,
            escape(s)
        );
        self.width = self
            .width
            .max(x + s.chars().count() as f64 * CHAR_W + MARGIN);
    }

    fn line_of_text(&mut self, s: &str, attrs: &str) {
        self.y += LINE_H;
        let y = self.y;
        self.text(MARGIN, y, s, attrs);
    }

    fn dot(&mut self, x: f64, y: f64, u: &Unit) {
        let state = u.state();
        let _ = writeln!(
            self.body,
            r#"<circle cx="{x:.1}" cy="{:.1}" r="4.5" fill="{}"><title>{}: {}</title></circle>"#,
            y - 4.0,
            fill(state),
            escape(&u.id.device),
            escape(&u.status())
        );
    }
}

/// Renders the whole picture as a standalone SVG document.
pub fn render(t: &NodeTopology) -> String {
    let mut c = Canvas {
        body: String::new(),
        y: MARGIN,
        width: 0.0,
    };
    let mut title = format!("Node {}", t.node);
    if let Some(it) = &t.instance_type {
        title.push_str(&format!(" · {it}"));
    }
    title.push_str(&format!(" · {}", counts(t)));
    c.line_of_text(&title, r#" font-weight="bold" font-size="14""#);
    c.y += 6.0;
    c.y += LINE_H;
    let mut x = MARGIN;
    for s in [
        State::Free,
        State::Allocated,
        State::Tainted,
        State::Unhealthy,
    ] {
        let _ = writeln!(
            c.body,
            r#"<circle cx="{:.1}" cy="{:.1}" r="4.5" fill="{}"/>"#,
            x + 4.5,
            c.y - 4.0,
            fill(s)
        );
        let y = c.y;
        c.text(x + 13.0, y, word(s), "");
        x += 13.0 + (word(s).len() as f64 + 2.0) * CHAR_W;
    }

    if !t.roots.is_empty() {
        c.y += 10.0;
        c.line_of_text("PCIe roots", r#" font-weight="bold""#);
        roots(&mut c, t);
    }
    if let Some(grid) = &t.grid {
        c.y += 10.0;
        let how = if grid.torus {
            format!(
                "{}×{} torus: row topology_x, column topology_y",
                grid.rows, grid.cols
            )
        } else {
            "in deviceId order, four to a row".to_string()
        };
        c.line_of_text(&format!("Neuron chips ({how})"), r#" font-weight="bold""#);
        chips(&mut c, grid);
    }
    if !t.others.is_empty() {
        c.y += 10.0;
        c.line_of_text("Other devices", r#" font-weight="bold""#);
        for u in &t.others {
            c.y += LINE_H;
            let y = c.y;
            c.dot(MARGIN + 5.0, y, u);
            c.text(
                MARGIN + 16.0,
                y,
                &format!(
                    "{} {} {}  {}",
                    u.kind.tag(),
                    u.id.device,
                    u.detail,
                    u.status()
                ),
                "",
            );
        }
    }
    if !t.groups.is_empty() {
        c.y += 10.0;
        c.line_of_text("Device groups", r#" font-weight="bold""#);
        for g in &t.groups {
            c.line_of_text(
                &format!(
                    "{:<4} {} = {}: {}",
                    g.label,
                    g.attribute,
                    g.value,
                    group_members(t, &g.label)
                ),
                "",
            );
        }
    }
    let allocated = t.allocated();
    if !allocated.is_empty() {
        c.y += 10.0;
        c.line_of_text("Allocated", r#" font-weight="bold""#);
        let mut by_claim: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for u in allocated {
            for h in &u.holders {
                by_claim.entry(h).or_default().push(&u.id.device);
            }
        }
        for (claim, devices) in by_claim {
            c.line_of_text(&format!("{claim}: {}", devices.join(", ")), "");
        }
    }
    let lines = t.trouble_lines();
    let pools: Vec<&Unit> = t.units().filter(|u| u.pool_problem.is_some()).collect();
    if !lines.is_empty() || !pools.is_empty() {
        c.y += 10.0;
        c.line_of_text("Tainted or unhealthy", r#" font-weight="bold""#);
        for l in lines {
            let state = if l.unhealthy {
                State::Unhealthy
            } else {
                State::Tainted
            };
            c.line_of_text(
                &format!("{}: {} ({})", l.devices, l.taint, l.source),
                &format!(r#" fill="{}""#, fill(state)),
            );
        }
        for u in pools {
            if let Some(p) = &u.pool_problem {
                c.line_of_text(
                    &format!("{}: ignored by the scheduler: {p}", u.id.device),
                    "",
                );
            }
        }
    }

    let width = c.width.max(400.0).ceil();
    let height = (c.y + MARGIN).ceil();
    format!(
        concat!(
            r#"<?xml version="1.0" encoding="UTF-8"?>"#,
            "\n",
            r#"<svg xmlns="http://www.w3.org/2000/svg" version="1.1" xml:space="preserve" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="{f}">"#,
            "\n<title>{title}</title>\n",
            r##"<rect x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>"##,
            "\n{body}</svg>\n"
        ),
        w = width,
        h = height,
        f = FONT,
        title = escape(&format!("kubectl dra topology {}", t.node)),
        body = c.body
    )
}

fn roots(c: &mut Canvas, t: &NodeTopology) {
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
    let left_w = t
        .roots
        .iter()
        .map(|r| r.root.chars().count().max(12))
        .max()
        .unwrap_or(12) as f64
        * CHAR_W
        + 16.0;
    // The widest row of any root, so that every box is as wide and holds it.
    let row_chars = t
        .roots
        .iter()
        .flat_map(|r| r.units.iter())
        .map(|u| {
            let groups = u.groups.join(" ").chars().count();
            5 + name_w
                + 2
                + detail_w
                + if groups > 0 { groups + 2 } else { 0 }
                + 2
                + u.status().chars().count()
        })
        .chain(
            t.roots
                .iter()
                .filter(|r| !r.neuron_chips.is_empty())
                .map(|r| {
                    format!("NRN  Neuron chips {} (grid below)", ranges(&r.neuron_chips))
                        .chars()
                        .count()
                }),
        )
        .max()
        .unwrap_or(40);
    for r in &t.roots {
        let lines = r.units.len() + usize::from(!r.neuron_chips.is_empty());
        let h = lines.max(2) as f64 * LINE_H + 10.0;
        let top = c.y + 6.0;
        let _ = writeln!(
            c.body,
            r##"<rect x="{MARGIN:.1}" y="{top:.1}" width="{:.1}" height="{h:.1}" rx="4" fill="#f5f7fa" stroke="#607d8b"/>"##,
            left_w + 32.0 + row_chars as f64 * CHAR_W
        );
        c.text(
            MARGIN + 8.0,
            top + LINE_H,
            &r.root,
            r#" font-weight="bold""#,
        );
        if !r.numa.is_empty() {
            c.text(
                MARGIN + 8.0,
                top + 2.0 * LINE_H,
                &format!("NUMA {}", r.numa.join(",")),
                "",
            );
        }
        let mut y = top;
        for u in &r.units {
            y += LINE_H;
            let x = MARGIN + left_w;
            c.dot(x + 5.0, y, u);
            let mut s = format!(
                "{:<4} {:<name_w$}  {:<detail_w$}",
                u.kind.tag(),
                u.id.device,
                u.detail
            );
            if !u.groups.is_empty() {
                s.push_str(&format!("  {}", u.groups.join(" ")));
            }
            c.text(x + 16.0, y, &s, "");
            let sx = x + 16.0 + (s.chars().count() as f64 + 2.0) * CHAR_W;
            c.text(
                sx,
                y,
                &u.status(),
                &format!(r#" fill="{}""#, fill(u.state())),
            );
        }
        if !r.neuron_chips.is_empty() {
            y += LINE_H;
            c.text(
                MARGIN + left_w + 16.0,
                y,
                &format!("NRN  Neuron chips {} (grid below)", ranges(&r.neuron_chips)),
                r##" fill="#455a64""##,
            );
        }
        c.y = top + h;
    }
}

fn chips(c: &mut Canvas, grid: &super::NeuronGrid) {
    let top = c.y + 6.0;
    for cell in &grid.chips {
        let x = MARGIN + cell.col as f64 * (CELL_W + 8.0);
        let y = top + cell.row as f64 * (CELL_H + 8.0);
        let state = cell.chip.state();
        let _ = writeln!(
            c.body,
            r##"<rect x="{x:.1}" y="{y:.1}" width="{CELL_W:.1}" height="{CELL_H:.1}" rx="4" fill="#f5f7fa" stroke="{}" stroke-width="{}"><title>{}: {}</title></rect>"##,
            fill(state),
            if state == State::Free { 1 } else { 2 },
            escape(&cell.chip.id.device),
            escape(&cell.chip.status())
        );
        c.dot(x + 10.0, y + LINE_H, &cell.chip);
        c.text(
            x + 20.0,
            y + LINE_H,
            &cell.chip.id.device,
            r#" font-weight="bold""#,
        );
        let groups = if cell.chip.groups.is_empty() {
            "no device group".to_string()
        } else {
            cell.chip.groups.join(" ")
        };
        c.text(x + 8.0, y + 2.0 * LINE_H, &groups, "");
        if cell.cores.is_empty() {
            let s = match cell.core_count {
                Some(n) => format!("{n} cores, whole chip"),
                None => "whole chip".to_string(),
            };
            c.text(x + 8.0, y + 3.0 * LINE_H, &s, "");
        } else {
            for (k, core) in cell.cores.iter().enumerate() {
                let cx = x + 8.0 + k as f64 * (CORE + 3.0);
                let cy = y + 2.0 * LINE_H + 5.0;
                let s = core.state();
                let _ = writeln!(
                    c.body,
                    r##"<rect x="{cx:.1}" y="{cy:.1}" width="{CORE}" height="{CORE}" fill="{}" stroke="#37474f" stroke-width="0.5"><title>{}: {}</title></rect>"##,
                    if s == State::Free { "#ffffff" } else { fill(s) },
                    escape(&core.id.device),
                    escape(&core.status())
                );
            }
        }
        let held = cell
            .cores
            .iter()
            .filter(|u| u.state() != State::Free)
            .count();
        let (status, colour) = if state == State::Free && held > 0 {
            (
                format!("{held} of {} cores in use", cell.cores.len()),
                fill(State::Allocated),
            )
        } else {
            (cell.chip.status(), fill(state))
        };
        let max = ((CELL_W - 16.0) / CHAR_W) as usize;
        let shown: String = if status.chars().count() > max {
            status
                .chars()
                .take(max.saturating_sub(1))
                .chain(['…'])
                .collect()
        } else {
            status
        };
        c.text(
            x + 8.0,
            y + 4.0 * LINE_H,
            &shown,
            &format!(r#" fill="{colour}""#),
        );
        c.width = c.width.max(x + CELL_W + MARGIN);
    }
    c.y = top + grid.rows as f64 * (CELL_H + 8.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(escape(r#"a<b>&"c'"#), "a&lt;b&gt;&amp;&quot;c&apos;");
    }
}
