//! The plan's effect as a picture: an SVG waterfall from the framework's default (the
//! headline baseline) through each pass's decisions to the planned iteration time, with the
//! advice (moves the export does not apply) drawn apart, hatched, after the planned bar.
//! `trainplan plan` writes it next to the plan (`plan.yaml` → `plan.svg`).
//!
//! ```text
//! ddp_default ████████████  310 ms
//! amp               ▒▒▒▒▒   −120 ms      one bar per pass (its decisions summed), in plan order
//! op-fusion             ▒   −8 ms
//! planned     ██████        182 ms
//! advice: blueconnect  ░    −3 ms        not counted
//! ```
//!
//! Pure: text in, text out; names are XML-escaped.

use std::fmt::Write;

use super::Plan;

/// XML text escaping for names that reach the SVG.
fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\t' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// One row of the waterfall: label, start and end (ms), kind.
#[derive(Debug, PartialEq)]
pub struct Row {
    pub label: String,
    pub from_ms: f64,
    pub to_ms: f64,
    pub kind: Kind,
}

/// What a row is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Total,
    Step,
    Advice,
}

/// The rows: the headline baseline, one step per pass in order of first decision (a
/// baseline start point is a step too), the planned total, then the advice.
pub fn rows(plan: &Plan) -> Vec<Row> {
    let base = plan.predicted.baseline.iteration_ms;
    let name = if plan.predicted.baseline_name.is_empty() {
        "baseline".to_string()
    } else {
        plan.predicted.baseline_name.clone()
    };
    let mut out = vec![Row {
        label: name,
        from_ms: 0.0,
        to_ms: base,
        kind: Kind::Total,
    }];
    let mut order: Vec<(String, f64)> = Vec::new();
    for d in &plan.decisions {
        match order.iter_mut().find(|(p, _)| *p == d.pass) {
            Some((_, e)) => *e += d.effect_ms,
            None => order.push((d.pass.clone(), d.effect_ms)),
        }
    }
    // Each decision's effect is its marginal change along the plan's path from the headline
    // baseline, so the bars meet the planned total by themselves (within the plan's rounding):
    // each bar is exactly its pass's effects, nothing is handed to the last one (issue 27).
    let planned = plan.predicted.planned.iteration_ms;
    let mut at = base;
    for (pass, effect) in order {
        let to = at + effect;
        out.push(Row {
            label: pass,
            from_ms: at,
            to_ms: to,
            kind: Kind::Step,
        });
        at = to;
    }
    out.push(Row {
        label: "planned".into(),
        from_ms: 0.0,
        to_ms: planned,
        kind: Kind::Total,
    });
    for a in &plan.advice {
        out.push(Row {
            label: format!("advice: {}", a.pass),
            from_ms: planned,
            to_ms: (planned + a.effect_ms).max(0.0),
            kind: Kind::Advice,
        });
    }
    out
}

/// The SVG document.
pub fn waterfall(plan: &Plan) -> String {
    let rows = rows(plan);
    let (label_w, bar_w, row_h, top) = (210.0, 520.0, 24.0, 48.0);
    let max = rows
        .iter()
        .map(|r| r.from_ms.max(r.to_ms))
        .fold(1e-9, f64::max);
    let x = |ms: f64| label_w + bar_w * ms / max;
    let h = top + row_h * rows.len() as f64 + 30.0;
    let w_ = &plan.workload;
    let title = format!(
        "{} on {}{}, --framework {}: {:.1} ms → {:.1} ms",
        xml(&w_.model),
        xml(&w_.cluster),
        if w_.source == "trace" {
            // The cluster already says "the traced run (N ranks)".
            String::new()
        } else {
            format!(
                " ({} GPU{})",
                w_.ranks,
                if w_.ranks == 1 { "" } else { "s" }
            )
        },
        w_.framework,
        plan.predicted.baseline.iteration_ms,
        plan.predicted.planned.iteration_ms
    );
    // Wide enough for the title (about 8 px a character at 14 px bold), so it is not clipped.
    let w = (label_w + bar_w + 110.0).max(16.0 + 8.0 * title.chars().count() as f64);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    s.push_str(r##"<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="3" height="6" fill="#9ab"/></pattern></defs>"##);
    s.push('\n');
    let _ = writeln!(
        s,
        r#"<text x="8" y="20" font-size="14" font-weight="bold">{title}</text>"#
    );
    let _ = writeln!(
        s,
        r##"<text x="8" y="38" fill="#555">iteration time per pass, in plan order; hatched: advice the export does not apply (not counted)</text>"##
    );
    for (i, r) in rows.iter().enumerate() {
        let y = top + row_h * i as f64;
        let (a, b) = (r.from_ms.min(r.to_ms), r.from_ms.max(r.to_ms));
        let fill = match r.kind {
            Kind::Total => "#4a6fa5".to_string(),
            Kind::Step if r.to_ms <= r.from_ms => "#5a9e6f".to_string(),
            Kind::Step => "#c0504d".to_string(),
            Kind::Advice => "url(#hatch)".to_string(),
        };
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            label_w - 8.0,
            y + 16.0,
            xml(&r.label)
        );
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{fill}"/>"#,
            x(a),
            y + 4.0,
            (x(b) - x(a)).max(1.0),
            row_h - 8.0
        );
        let value = match r.kind {
            Kind::Total => format!("{:.1} ms", r.to_ms),
            _ if (r.to_ms - r.from_ms).abs() < 0.05 => format!("{:+.2} ms", r.to_ms - r.from_ms),
            _ => format!("{:+.1} ms", r.to_ms - r.from_ms),
        };
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}">{}</text>"#,
            x(b) + 6.0,
            y + 16.0,
            value
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::emit::tests::tiny_plan;

    #[test]
    fn bars_run_from_the_baseline_to_the_planned_time() {
        let mut p = tiny_plan();
        // 10 ms → 8 ms: the start point's effect 0, then −1 and −1.
        p.decisions[0].effect_ms = 0.0;
        let r = rows(&p);
        // baseline, 3 passes (baseline start, grad-accumulation, amp), planned.
        assert_eq!(r.len(), 5);
        assert_eq!(r[0].to_ms, 10.0);
        assert_eq!(r[1].from_ms, 10.0);
        // Each bar is its pass's effects; the tiny plan's effects add up to the planned total.
        let effects: f64 = p.decisions.iter().map(|d| d.effect_ms).sum();
        assert!((r[3].to_ms - (10.0 + effects)).abs() < 1e-9);
        assert!((r[3].to_ms - 8.0).abs() < 1e-9, "{r:?}");
        assert_eq!(r[4].label, "planned");
        assert_eq!(r[4].to_ms, 8.0);
        let svg = waterfall(&p);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<rect").count(),
            5 + 1,
            "5 bars + the hatch pattern"
        );
    }

    /// Issue 27: the last bar drew the remainder ("fused-adam −9.8 ms" for a −0.94 ms
    /// decision); a bar is exactly its decisions, whatever the totals say.
    #[test]
    fn bars_are_the_decisions_and_nothing_else() {
        let mut p = tiny_plan();
        p.predicted.planned.iteration_ms = 5.0;
        let r = rows(&p);
        let last = &r[r.len() - 2];
        let want: f64 = p
            .decisions
            .iter()
            .filter(|d| d.pass == last.label)
            .map(|d| d.effect_ms)
            .sum();
        assert!((last.to_ms - last.from_ms - want).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn a_trace_plan_title_is_whole_and_says_no_1_ranks() {
        let mut p = tiny_plan();
        p.workload.source = "trace".into();
        p.workload.ranks = 1;
        p.workload.model =
            "resnet50_v100_2021fmt_shapes_memory.json.gz (search on the slowest, rank 0)".into();
        p.workload.cluster = "the traced run (1 rank)".into();
        let svg = waterfall(&p);
        assert!(!svg.contains("ranks)"), "{svg}");
        assert!(!svg.contains("GPUs)"), "{svg}");
        let title = svg.lines().find(|l| l.contains("font-weight")).unwrap();
        let text = title.split('>').nth(1).unwrap().split('<').next().unwrap();
        let width: f64 = svg
            .split("width=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            width >= 8.0 * text.chars().count() as f64,
            "{width} for {text}"
        );
    }

    #[test]
    fn names_are_escaped() {
        let mut p = tiny_plan();
        p.workload.model = "<x&y>".into();
        let svg = waterfall(&p);
        assert!(svg.contains("&lt;x&amp;y&gt;"));
        assert!(!svg.contains("<x&y>"));
    }
}
