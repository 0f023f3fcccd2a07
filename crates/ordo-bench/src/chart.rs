//! The main figure as SVG, written by hand: text is left to the viewer's
//! fonts, so nothing here depends on a font library, and the output is
//! byte-for-byte reproducible from the same rows.
//!
//! One line of panels per workload: throughput (operations per second) on
//! the left, KiB written to the device per operation on the right. A
//! workload swept over an fsync interval (fcmicro, randwrite) is drawn as
//! lines over the interval on a log2 axis, as in the fast-commit paper;
//! every other workload as bars, one per target, grouped by case.

use std::fmt::Write as _;

use crate::report::Row;

const PANEL_W: f64 = 470.0;
const PANEL_H: f64 = 270.0;
const MARGIN_L: f64 = 70.0;
const MARGIN_R: f64 = 15.0;
const MARGIN_T: f64 = 30.0;
const MARGIN_B: f64 = 60.0;
const GAP: f64 = 20.0;
const PALETTE: [&str; 16] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#e7969c", "#637939", "#d6616b", "#7b4173", "#3182bd",
];
/// Height of one legend or caption line.
const LINE_H: f64 = 18.0;
/// Longest caption line, in characters.
const CAPTION_CHARS_MAX: usize = 150;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round axis maximum at or above `x` (1, 2 or 5 times a power of ten).
fn nice_max(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= x {
            return m * p;
        }
    }
    10.0 * p
}

fn fmt_tick(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A value as a bar label.
fn fmt_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Largest ratio of the largest to the smallest positive value drawn on a
/// linear axis; beyond it (tmpfs next to a flushing disk) the axis is
/// logarithmic, so the small bars stay readable.
const LINEAR_RANGE_MAX: f64 = 50.0;

/// A vertical axis: linear from 0, or logarithmic over whole decades.
struct YScale {
    log: bool,
    lo: f64,
    hi: f64,
}

impl YScale {
    fn for_values(values: impl Iterator<Item = f64>) -> YScale {
        let v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
        let max = v.iter().copied().fold(0.0, f64::max);
        let min_pos = v
            .iter()
            .copied()
            .filter(|&x| x > 0.0)
            .fold(f64::MAX, f64::min);
        if max > 0.0 && min_pos < f64::MAX && max / min_pos > LINEAR_RANGE_MAX {
            YScale {
                log: true,
                lo: 10f64.powf(min_pos.log10().floor()),
                hi: 10f64.powf(max.log10().ceil()),
            }
        } else {
            YScale {
                log: false,
                lo: 0.0,
                hi: nice_max(max),
            }
        }
    }

    /// Where `v` sits between the bottom (0) and the top (1).
    fn frac(&self, v: f64) -> f64 {
        let f = if self.log {
            if v <= 0.0 {
                return 0.0;
            }
            (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        f.clamp(0.0, 1.0)
    }

    /// Grid values: five steps on a linear axis, each decade on a log one.
    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let mut t = Vec::new();
            let mut x = self.lo;
            while x <= self.hi * 1.000_001 {
                t.push(x);
                x *= 10.0;
            }
            t
        } else {
            (0..=5).map(|i| self.hi * i as f64 / 5.0).collect()
        }
    }
}

/// The fsync interval of a swept case ("n=16" → 16).
fn sweep_n(case: &str) -> Option<f64> {
    case.strip_prefix("n=")?.parse().ok()
}

struct Panel<'a> {
    x0: f64,
    y0: f64,
    title: String,
    metric: fn(&Row) -> Option<f64>,
    rows: Vec<&'a Row>,
    targets: &'a [String],
}

impl Panel<'_> {
    fn frame(&self, svg: &mut String, ys: &YScale) -> (f64, f64, f64, f64) {
        let (px, py) = (self.x0 + MARGIN_L, self.y0 + MARGIN_T);
        let (w, h) = (PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B);
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="14" text-anchor="middle" font-weight="bold">{}</text>"#,
            px + w / 2.0,
            self.y0 + 18.0,
            esc(&self.title)
        );
        for v in ys.ticks() {
            let y = py + h - h * ys.frac(v);
            let _ = writeln!(
                svg,
                r##"<line x1="{px:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
                px + w,
                px - 6.0,
                y + 4.0,
                fmt_tick(v)
            );
        }
        let _ = writeln!(
            svg,
            r##"<rect x="{px:.1}" y="{py:.1}" width="{w:.1}" height="{h:.1}" fill="none" stroke="#333"/>"##
        );
        (px, py, w, h)
    }

    fn bars(&self, svg: &mut String) {
        let mut cases: Vec<&str> = Vec::new();
        for r in &self.rows {
            if !cases.contains(&r.case.as_str()) {
                cases.push(&r.case);
            }
        }
        let ys = YScale::for_values(self.rows.iter().filter_map(|r| (self.metric)(r)));
        let (px, py, w, h) = self.frame(svg, &ys);
        let group_w = w / cases.len().max(1) as f64;
        let bar_w = group_w * 0.8 / self.targets.len().max(1) as f64;
        for (ci, case) in cases.iter().enumerate() {
            let gx = px + group_w * ci as f64 + group_w * 0.1;
            if !case.is_empty() {
                let _ = writeln!(
                    svg,
                    r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
                    gx + group_w * 0.4,
                    py + h + 16.0,
                    esc(case)
                );
            }
            for (ti, t) in self.targets.iter().enumerate() {
                let Some(r) = self.rows.iter().find(|r| r.case == *case && &r.target == t) else {
                    continue;
                };
                let Some(v) = (self.metric)(r) else { continue };
                let bh = h * ys.frac(v);
                let x = gx + bar_w * ti as f64;
                let _ = writeln!(
                    svg,
                    r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                    py + h - bh,
                    (bar_w - 2.0).max(1.0),
                    PALETTE[ti % PALETTE.len()],
                    esc(t),
                    fmt_value(v)
                );
                let _ = writeln!(
                    svg,
                    r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
                    x + bar_w / 2.0 - 1.0,
                    py + h - bh - 3.0,
                    fmt_value(v)
                );
            }
        }
    }

    fn lines(&self, svg: &mut String) {
        let ns: Vec<f64> = self.rows.iter().filter_map(|r| sweep_n(&r.case)).collect();
        let (lo, hi) = ns
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &n| (a.min(n), b.max(n)));
        let (lo, hi) = (
            lo.max(1.0).log2(),
            hi.max(1.0).log2().max(lo.max(1.0).log2() + 1.0),
        );
        let ys = YScale::for_values(self.rows.iter().filter_map(|r| (self.metric)(r)));
        let (px, py, w, h) = self.frame(svg, &ys);
        let xof = |n: f64| px + w * (n.max(1.0).log2() - lo) / (hi - lo);
        let mut ticks = ns.clone();
        ticks.sort_by(f64::total_cmp);
        ticks.dedup();
        for n in &ticks {
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{n}</text>"#,
                xof(*n),
                py + h + 16.0
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">fsync every n operations</text>"#,
            px + w / 2.0,
            py + h + 32.0
        );
        for (ti, t) in self.targets.iter().enumerate() {
            let mut pts: Vec<(f64, f64)> = self
                .rows
                .iter()
                .filter(|r| &r.target == t)
                .filter_map(|r| Some((sweep_n(&r.case)?, (self.metric)(r)?)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if pts.is_empty() {
                continue;
            }
            let color = PALETTE[ti % PALETTE.len()];
            let path: Vec<String> = pts
                .iter()
                .map(|(n, v)| format!("{:.1},{:.1}", xof(*n), py + h - h * ys.frac(*v)))
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
                path.join(" ")
            );
            for p in &path {
                let (x, y) = p.split_once(',').expect("formatted with a comma");
                let _ = writeln!(svg, r#"<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>"#);
            }
        }
    }
}

/// Splits `text` into lines of at most `max` characters, breaking after a
/// space or a comma (a single longer word is left whole).
fn wrap(text: &str, max: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for para in text.lines() {
        let mut cur = String::new();
        let mut word = String::new();
        for c in para.chars() {
            word.push(c);
            if c == ' ' || c == ',' {
                if cur.chars().count() + word.chars().count() > max && !cur.is_empty() {
                    lines.push(cur.trim_end().to_string());
                    cur.clear();
                }
                cur.push_str(&word);
                word.clear();
            }
        }
        if cur.chars().count() + word.chars().count() > max && !cur.is_empty() {
            lines.push(cur.trim_end().to_string());
            cur.clear();
        }
        cur.push_str(&word);
        lines.push(cur.trim_end().to_string());
    }
    lines
}

/// Legend entries laid out in rows that fit `width`: (row, x) per target.
fn legend_layout(targets: &[String], width: f64) -> Vec<(usize, f64)> {
    let mut out = Vec::with_capacity(targets.len());
    let (mut row, mut x) = (0usize, MARGIN_L);
    for t in targets {
        let w = 24.0 + 7.5 * t.chars().count() as f64;
        if x + w > width - 10.0 && x > MARGIN_L {
            row += 1;
            x = MARGIN_L;
        }
        out.push((row, x));
        x += w;
    }
    out
}

/// The SVG figure of `rows` (failed rows are left out), with `caption`
/// (the command that reproduces it, and the machine) under it.
pub fn svg(rows: &[Row], caption: &str) -> String {
    let ok: Vec<&Row> = rows.iter().filter(|r| r.error.is_none()).collect();
    let mut targets: Vec<String> = Vec::new();
    let mut workloads: Vec<String> = Vec::new();
    for r in &ok {
        if !targets.contains(&r.target) {
            targets.push(r.target.clone());
        }
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload.clone());
        }
    }
    let width = 2.0 * PANEL_W + GAP;
    let legend = legend_layout(&targets, width);
    let legend_rows = legend.last().map_or(1, |l| l.0 + 1);
    let legend_h = 6.0 + LINE_H * legend_rows as f64;
    let caption_lines = wrap(caption, CAPTION_CHARS_MAX);
    let height = legend_h
        + workloads.len().max(1) as f64 * PANEL_H
        + LINE_H * caption_lines.len() as f64
        + 10.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect x="0" y="0" width="{width:.0}" height="{height:.0}" fill="white"/>"#
    );
    for (ti, (t, &(row, lx))) in targets.iter().zip(&legend).enumerate() {
        let y = 6.0 + LINE_H * row as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{lx:.1}" y="{y:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            PALETTE[ti % PALETTE.len()],
            lx + 16.0,
            y + 10.0,
            esc(t)
        );
    }
    for (wi, w) in workloads.iter().enumerate() {
        let rows: Vec<&Row> = ok.iter().copied().filter(|r| &r.workload == w).collect();
        let mut ns: Vec<String> = rows.iter().map(|r| r.case.clone()).collect();
        ns.sort();
        ns.dedup();
        let swept = ns.len() > 1 && rows.iter().all(|r| sweep_n(&r.case).is_some());
        let y0 = legend_h + wi as f64 * PANEL_H;
        let unit = if rows.iter().any(|r| r.virtual_time) {
            " (virtual time)"
        } else {
            ""
        };
        let panels = [
            Panel {
                x0: 0.0,
                y0,
                title: format!("{w}: operations/s{unit}"),
                metric: |r| Some(r.ops_per_sec),
                rows: rows.clone(),
                targets: &targets,
            },
            Panel {
                x0: PANEL_W + GAP,
                y0,
                title: format!("{w}: KiB written per operation"),
                metric: |r| r.kib_per_op,
                rows,
                targets: &targets,
            },
        ];
        for p in &panels {
            if swept {
                p.lines(&mut svg);
            } else {
                p.bars(&mut svg);
            }
        }
    }
    let caption_top = height - 10.0 - LINE_H * caption_lines.len() as f64;
    for (i, line) in caption_lines.iter().enumerate() {
        let _ = writeln!(
            svg,
            r##"<text x="10" y="{:.1}" font-size="11" fill="#444">{}</text>"##,
            caption_top + LINE_H * (i as f64 + 0.8),
            esc(line)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str, workload: &str, case: &str, ops: f64, kib: f64) -> Row {
        Row {
            target: target.into(),
            workload: workload.into(),
            case: case.into(),
            ops_per_sec: ops,
            kib_per_op: Some(kib),
            ..Row::default()
        }
    }

    #[test]
    fn wide_ranges_get_a_log_axis() {
        let lin = YScale::for_values([10.0, 200.0].into_iter());
        assert!(!lin.log);
        assert_eq!(lin.frac(100.0), 0.5);
        let log = YScale::for_values([90.0, 40_000.0].into_iter());
        assert!(log.log);
        assert_eq!((log.lo, log.hi), (10.0, 100_000.0));
        assert_eq!(log.ticks().len(), 5);
        assert!((log.frac(1000.0) - 0.5).abs() < 1e-9);
        assert_eq!(log.frac(0.0), 0.0);
    }

    #[test]
    fn captions_wrap_and_legends_fit() {
        let lines = wrap("ordo bench x --targets a,b,c,d\nmachine", 12);
        assert!(lines.iter().all(|l| l.chars().count() <= 12), "{lines:?}");
        assert_eq!(lines.last().unwrap(), "machine");
        assert_eq!(
            lines.concat().replace(' ', ""),
            "ordobenchx--targetsa,b,c,dmachine"
        );
        let many: Vec<String> = (0..12).map(|i| format!("ordo-lib:journal{i}")).collect();
        let layout = legend_layout(&many, 2.0 * PANEL_W + GAP);
        assert!(layout.last().unwrap().0 > 0, "wraps to a second row");
        assert!(layout.iter().all(|&(_, x)| x < 2.0 * PANEL_W + GAP));
    }

    #[test]
    fn nice_maxima() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(3.2), 5.0);
        assert_eq!(nice_max(2110.0), 5000.0);
        assert_eq!(nice_max(10.0), 10.0);
        assert_eq!(nice_max(0.13), 0.2);
    }

    #[test]
    fn bars_and_lines_are_drawn_per_target() {
        let rows = vec![
            row("ext4:ordered", "varmail", "", 900.0, 40.0),
            row("tmpfs", "varmail", "", 9000.0, 0.0),
            row("ext4:ordered", "fcmicro", "n=1", 2000.0, 36.0),
            row("ext4:ordered", "fcmicro", "n=4", 5000.0, 12.0),
            row("tmpfs", "fcmicro", "n=1", 90000.0, 0.0),
            row("tmpfs", "fcmicro", "n=4", 95000.0, 0.0),
            Row {
                error: Some("x".into()),
                ..row("ordo:async", "varmail", "", 0.0, 0.0)
            },
        ];
        let s = svg(&rows, "ordo bench varmail <targets>");
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 4, "2 targets x 2 panels");
        assert!(s.contains("ext4:ordered: 900"));
        assert!(s.contains(">9000<"), "bar labels");
        assert!(!s.contains("ordo:async"), "failed rows are left out");
        assert!(s.contains("&lt;targets&gt;"), "caption escaped");
        assert_eq!(
            s,
            svg(&rows, "ordo bench varmail <targets>"),
            "deterministic"
        );
    }
}
