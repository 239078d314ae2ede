//! A small SVG line chart for the scale benchmark (`capstan-bench-scale
//! --svg`): one panel per figure, the fleet size on the x axis, one line
//! per variant (Wasm, native). Pure: figures in, SVG text out, so it is
//! tested without running a benchmark and needs no plotting dependency.

use std::fmt::Write as _;

/// One figure against the fleet size, one series per variant.
#[derive(Debug, Clone)]
pub struct Panel {
    /// What the y axis shows, with its unit ("seconds to all Ready").
    pub title: String,
    /// (variant name, points as (machines, value)), drawn in order.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

const PANEL_W: f64 = 300.0;
const PANEL_H: f64 = 220.0;
const MARGIN_L: f64 = 52.0;
const MARGIN_R: f64 = 14.0;
const MARGIN_T: f64 = 30.0;
const MARGIN_B: f64 = 38.0;
const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// Escape text for SVG.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A tick label without needless decimals.
fn tick(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The panels side by side, with a legend under the first, as an SVG
/// document. Axes start at zero; a panel with no points is drawn empty.
pub fn svg(caption: &str, panels: &[Panel]) -> String {
    let width = PANEL_W * panels.len().max(1) as f64;
    let height = PANEL_H + 40.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="8" y="16" font-size="12" font-weight="bold">{}</text>"#,
        escape(caption)
    );
    for (i, panel) in panels.iter().enumerate() {
        draw_panel(&mut out, panel, PANEL_W * i as f64);
    }
    // Legend: the variants of the first panel.
    if let Some(first) = panels.first() {
        for (k, (name, _)) in first.series.iter().enumerate() {
            let x = 8.0 + 110.0 * k as f64;
            let y = PANEL_H + 28.0;
            let colour = COLOURS[k % COLOURS.len()];
            let _ = writeln!(
                out,
                r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{colour}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
                x + 18.0,
                x + 22.0,
                y + 4.0,
                escape(name)
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

fn draw_panel(out: &mut String, panel: &Panel, left: f64) {
    let points = panel.series.iter().flat_map(|(_, p)| p.iter());
    let (max_x, max_y) = points.fold((0.0f64, 0.0f64), |(mx, my), &(x, y)| (mx.max(x), my.max(y)));
    let (max_x, max_y) = (
        if max_x > 0.0 { max_x } else { 1.0 },
        if max_y > 0.0 { max_y * 1.1 } else { 1.0 },
    );
    let (x0, y0) = (left + MARGIN_L, PANEL_H - MARGIN_B + 20.0);
    let (w, h) = (PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B);
    let px = |x: f64| x0 + w * x / max_x;
    let py = |y: f64| y0 - h * y / max_y;
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"#,
        x0 + w / 2.0,
        MARGIN_T + 8.0,
        escape(&panel.title)
    );
    // Axes, with four ticks each.
    let _ = writeln!(
        out,
        r##"<path d="M{x0},{} V{y0} H{}" fill="none" stroke="#333"/>"##,
        y0 - h,
        x0 + w
    );
    for k in 0..=4 {
        let (vx, vy) = (max_x * k as f64 / 4.0, max_y * k as f64 / 4.0);
        let _ = writeln!(
            out,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#555">{}</text><text x="{}" y="{}" text-anchor="end" fill="#555">{}</text>"##,
            px(vx),
            y0 + 14.0,
            tick(vx),
            x0 - 4.0,
            py(vy) + 4.0,
            tick(vy)
        );
    }
    let _ = writeln!(
        out,
        r##"<text x="{}" y="{}" text-anchor="middle" fill="#555">machines</text>"##,
        x0 + w / 2.0,
        y0 + 28.0
    );
    for (k, (_, points)) in panel.series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let mut sorted = points.clone();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = sorted
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for &(x, y) in &sorted {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"><title>{} machines: {}</title></circle>"#,
                px(x),
                py(y),
                x,
                tick(y)
            );
        }
    }
}
