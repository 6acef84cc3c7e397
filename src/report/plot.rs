//! `--plot FILE.svg`: each comparison's per-step worst difference over its allowance, log scale, with the
//! allowance (1) drawn as a line, so a user sees at a glance where and how fast runs drift.

use std::fmt::Write;

use crate::judge::Outcome;
use crate::judge::{Comparison, GroupDiff};

const W: f64 = 760.0;
const H: f64 = 380.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 76.0;
const BOTTOM: f64 = 50.0;
/// Differences of exactly zero are drawn on this floor, as hollow markers.
const FLOOR: f64 = 1e-10;
/// Anything further past its allowance (a planted bug reaches 1e45; a zero tolerance makes it
/// infinite) is drawn on this ceiling.
const CEIL: f64 = 1e12;
const COLORS: [&str; 3] = ["#1f77b4", "#d62728", "#2ca02c"];

/// `--plot FILE.svg`, an exporter like the reports.
pub struct Plot;

impl super::Exporter for Plot {
    fn render(&self, o: &Outcome) -> String {
        svg(o)
    }
}

pub fn svg(o: &Outcome) -> String {
    let all: Vec<&Comparison> = std::iter::once(&o.runs).chain(&o.golden).collect();
    let points = |c: &Comparison| -> Vec<f64> {
        c.steps.iter().chain([&c.finals]).map(|g: &GroupDiff| g.worst_fraction.min(CEIL)).collect()
    };
    // Each point is the worst element's |Δ| over what it was allowed: the line is at 1.
    let rtol = 1.0;
    let top = all.iter().flat_map(|c| points(c)).chain([rtol * 10.0]).fold(FLOOR, f64::max);
    let (lo, hi) = (FLOOR.log10().floor(), top.log10().ceil().max(FLOOR.log10() + 1.0));
    let n = all.iter().map(|c| c.steps.len() + 1).max().unwrap_or(1);
    let x = |i: usize| LEFT + (W - LEFT - RIGHT) * if n > 1 { i as f64 / (n - 1) as f64 } else { 0.5 };
    let y = |v: f64| TOP + (H - TOP - BOTTOM) * (hi - v.max(FLOOR).log10()) / (hi - lo);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let what = match o.config() {
        Some(cfg) => {
            let t = &cfg.train;
            format!("K={} vs W={}, N={}, B={}", t.shape.acc_steps, t.shape.gpus, t.shape.data_size, t.shape.batch_size)
        }
        None => "recorded traces".to_string(),
    };
    // Two lines, so that neither runs off the right edge whatever the configuration says.
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="22" font-size="14">ddp-verify: worst difference per optimizer step over what was allowed</text>"#,
    );
    let _ = writeln!(s, r#"<text x="{LEFT}" y="40" fill="gray">{}</text>"#, fit(&what, W - LEFT - 10.0, 12.0));
    // Decades on the y axis.
    for e in lo as i32..=hi as i32 {
        let yy = y(10f64.powi(e));
        let _ =
            writeln!(s, r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e5e5e5"/>"##, W - RIGHT);
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">1e{e}</text>"#, LEFT - 6.0, yy + 4.0);
    }
    for i in 0..n {
        let label = if i + 1 == n { "final".to_string() } else { i.to_string() };
        let _ =
            writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{label}</text>"#, x(i), H - BOTTOM + 18.0);
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">optimizer step (last: final weights)</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 10.0
    );
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#ff7f0e" stroke-width="2" stroke-dasharray="6 4"/>"##,
        y(rtol),
        W - RIGHT
    );
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" fill="#ff7f0e">allowed ({:e})</text>"##,
        W - RIGHT + 8.0,
        y(rtol) + 4.0,
        rtol
    );
    let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" fill="gray">exact (0)</text>"#, W - RIGHT + 8.0, y(FLOOR) + 4.0);
    for (k, c) in all.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let pts = points(c);
        let path: Vec<String> = pts.iter().enumerate().map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v))).collect();
        let _ =
            writeln!(s, r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#, path.join(" "));
        for (i, v) in pts.iter().enumerate() {
            let fill = if *v == 0.0 { "white" } else { color };
            let _ =
                writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{fill}" stroke="{color}"/>"#, x(i), y(*v));
        }
        // Legend: one row under the title, entries spaced by their text (~6.6 px a char).
        let lx = LEFT + all[..k].iter().map(|c| 30.0 + 6.6 * (c.left.len() + c.right.len() + 4) as f64).sum::<f64>();
        let _ = writeln!(s, r#"<circle cx="{lx:.1}" cy="56" r="4" fill="{color}"/>"#);
        let _ = writeln!(s, r#"<text x="{:.1}" y="60" fill="{color}">{} vs {}</text>"#, lx + 8.0, c.left, c.right);
    }
    let _ = writeln!(s, "</svg>");
    s
}

/// `text` cut to what fits in `width` px at `size` px (about 0.6 em a character, wide for a
/// sans-serif), ending in an ellipsis where cut.
fn fit(text: &str, width: f64, size: f64) -> String {
    let most = (width / (0.6 * size)) as usize;
    if text.chars().count() <= most {
        return text.to_string();
    }
    let kept: String = text.chars().take(most.saturating_sub(1)).collect();
    format!("{kept}…")
}
