//! A small hand-written SVG writer for the experiments' plots: grouped bar charts and line
//! charts with a legend, linear or log₁₀ value axis. No dependencies; the output is a plain
//! string the caller writes next to the `.md` and `.csv`.

#![allow(dead_code)]

use std::fmt::Write as _;

const W: f64 = 860.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f",
];

/// One series: a name and one value per category (`None`: no bar / no point).
pub struct Series {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Value → y pixel, and the ticks to draw.
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Axis {
    fn new(series: &[Series], log: bool) -> Axis {
        let vals: Vec<f64> = series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied())
            .filter(|v| v.is_finite() && (!log || *v > 0.0))
            .collect();
        let max = vals.iter().copied().fold(f64::MIN, f64::max).max(1e-9);
        if log {
            let min = vals.iter().copied().fold(f64::MAX, f64::min).min(max);
            Axis {
                lo: min.log10().floor(),
                hi: max.log10().ceil().max(min.log10().floor() + 1.0),
                log,
            }
        } else {
            Axis {
                lo: 0.0,
                hi: max * 1.1,
                log,
            }
        }
    }
    fn y(&self, v: f64) -> f64 {
        let t = if self.log {
            (v.max(1e-12).log10() - self.lo) / (self.hi - self.lo)
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        TOP + (H - TOP - BOTTOM) * (1.0 - t.clamp(0.0, 1.0))
    }
    fn ticks(&self) -> Vec<(f64, String)> {
        if self.log {
            (self.lo as i32..=self.hi as i32)
                .map(|e| (10f64.powi(e), format!("{}", 10f64.powi(e))))
                .collect()
        } else {
            let step = nice_step(self.hi / 5.0);
            (0..=((self.hi / step) as usize))
                .map(|i| {
                    let v = i as f64 * step;
                    (v, format!("{}", (v * 1000.0).round() / 1000.0))
                })
                .collect()
        }
    }
}

fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.max(1e-12).log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if raw <= m * p {
            return m * p;
        }
    }
    10.0 * p
}

fn frame(out: &mut String, title: &str, y_label: &str, axis: &Axis) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>
"#,
        (LEFT + W - RIGHT) / 2.0,
        esc(title),
        (TOP + H - BOTTOM) / 2.0,
        (TOP + H - BOTTOM) / 2.0,
        esc(y_label)
    );
    for (v, label) in axis.ticks() {
        let y = axis.y(v);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            esc(&label)
        );
    }
    let _ = writeln!(
        out,
        r#"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{}" stroke="black"/><line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="black"/>"#,
        H - BOTTOM,
        W - RIGHT,
        H - BOTTOM,
        H - BOTTOM
    );
}

fn legend(out: &mut String, series: &[Series]) {
    for (i, s) in series.iter().enumerate() {
        let y = TOP + 18.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<rect x="{}" y="{y}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            W - RIGHT + 12.0,
            COLOURS[i % COLOURS.len()],
            W - RIGHT + 30.0,
            y + 10.0,
            esc(&s.name)
        );
    }
}

/// Grouped bars: one group per category, one bar per series.
pub fn bar_chart(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[Series],
    log: bool,
) -> String {
    let axis = Axis::new(series, log);
    let mut out = String::new();
    frame(&mut out, title, y_label, &axis);
    let plot_w = W - LEFT - RIGHT;
    let group = plot_w / categories.len().max(1) as f64;
    let bar = group * 0.8 / series.len().max(1) as f64;
    let base = H - BOTTOM;
    for (c, cat) in categories.iter().enumerate() {
        let x0 = LEFT + group * c as f64 + group * 0.1;
        for (i, s) in series.iter().enumerate() {
            if let Some(Some(v)) = s.values.get(c) {
                let y = axis.y(*v);
                let _ = writeln!(
                    out,
                    r#"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {v:.3}</title></rect>"#,
                    x0 + bar * i as f64,
                    bar.max(1.0),
                    (base - y).max(0.0),
                    COLOURS[i % COLOURS.len()],
                    esc(&s.name)
                );
            }
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            LEFT + group * (c as f64 + 0.5),
            base + 18.0,
            esc(cat)
        );
    }
    legend(&mut out, series);
    out.push_str("</svg>\n");
    out
}

/// Lines: categories evenly spaced on the x axis, one polyline with markers per series.
pub fn line_chart(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[Series],
    log: bool,
) -> String {
    let axis = Axis::new(series, log);
    let mut out = String::new();
    frame(&mut out, title, y_label, &axis);
    let plot_w = W - LEFT - RIGHT;
    let step = plot_w / categories.len().max(1) as f64;
    let x = |c: usize| LEFT + step * (c as f64 + 0.5);
    for (c, cat) in categories.iter().enumerate() {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            x(c),
            H - BOTTOM + 18.0,
            esc(cat)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let pts: Vec<String> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(c, v)| v.map(|v| format!("{:.1},{:.1}", x(c), axis.y(v))))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            pts.join(" ")
        );
        for p in &pts {
            let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                out,
                r#"<circle cx="{px}" cy="{py}" r="3.5" fill="{colour}"/>"#
            );
        }
    }
    legend(&mut out, series);
    out.push_str("</svg>\n");
    out
}

/// One group of points of a scatter plot: (x, y) pairs with a hover label each.
pub struct Points {
    pub name: String,
    pub points: Vec<(f64, f64, String)>,
}

/// Predicted against measured on log₁₀ axes (both the same range), with the diagonal and the
/// ±`band` lines (e.g. 0.1 for ±10 %): one colour per group.
pub fn scatter(title: &str, x_label: &str, y_label: &str, groups: &[Points], band: f64) -> String {
    let vals: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.points.iter().flat_map(|p| [p.0, p.1]))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let max = vals.iter().copied().fold(f64::MIN, f64::max).max(1e-9);
    let min = vals.iter().copied().fold(f64::MAX, f64::min).min(max);
    let axis = Axis {
        lo: min.log10().floor(),
        hi: max.log10().ceil().max(min.log10().floor() + 1.0),
        log: true,
    };
    let plot_w = W - LEFT - RIGHT;
    let x = |v: f64| {
        let t = (v.max(1e-12).log10() - axis.lo) / (axis.hi - axis.lo);
        LEFT + plot_w * t.clamp(0.0, 1.0)
    };
    let mut out = String::new();
    frame(&mut out, title, y_label, &axis);
    for (v, label) in axis.ticks() {
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{TOP}" y2="{}" stroke="#eee"/><text x="{:.1}" y="{}" text-anchor="middle">{}</text>"##,
            x(v),
            x(v),
            H - BOTTOM,
            x(v),
            H - BOTTOM + 18.0,
            esc(&label)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        H - BOTTOM + 40.0,
        esc(x_label)
    );
    let (a, b) = (10f64.powf(axis.lo), 10f64.powf(axis.hi));
    for (f, dash) in [(1.0, ""), (1.0 + band, "4 4"), (1.0 - band, "4 4")] {
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#555" stroke-dasharray="{dash}"/>"##,
            x(a),
            axis.y(a * f),
            x(b),
            axis.y(b * f)
        );
    }
    for (i, g) in groups.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        for (px, py, label) in &g.points {
            if !(px.is_finite() && py.is_finite() && *px > 0.0 && *py > 0.0) {
                continue;
            }
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}" fill-opacity="0.7"><title>{}</title></circle>"#,
                x(*px),
                axis.y(*py),
                esc(label)
            );
        }
    }
    let legend_series: Vec<Series> = groups
        .iter()
        .map(|g| Series {
            name: g.name.clone(),
            values: Vec::new(),
        })
        .collect();
    legend(&mut out, &legend_series);
    out.push_str("</svg>\n");
    out
}
