//! The charts of `make bench-scale`, as SVG: converged Apps over time and the controller's RSS
//! over time, one line per row of the table (per contender; the floor once per concurrency
//! tried), written as `<dir>/scale-N<n>-converged.svg` and `<dir>/scale-N<n>-memory.svg`.
//!
//! Drawn with plotters' SVG backend only: text is written as SVG `<text>` (the viewer picks the
//! font), so nothing is read from the system's fonts.
//!
//! # Errors
//! [`Error::Other`] when plotters fails to draw; [`Error::Io`] when a file cannot be written.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::contenders::Contender;
use crate::run::Measurement;
use crate::{Error, Result};

/// Width and height of a chart, pixels.
pub const SIZE: (u32, u32) = (960, 540);
/// Most points drawn per line (a 10,000-App run has ~10,000 changes of the converged count).
pub const MAX_POINTS: usize = 2000;

/// The lines' colours, in order (Tableau 10: distinct, and readable on white).
const COLORS: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// One labelled line.
#[derive(Debug, Clone)]
pub struct Line {
    /// Its legend entry.
    pub label: String,
    /// (x, y) in order of x.
    pub points: Vec<(f64, f64)>,
}

/// What a chart shows.
#[derive(Debug, Clone)]
pub struct Chart<'a> {
    /// Its caption.
    pub title: &'a str,
    /// The x axis's title, with its unit.
    pub x: &'a str,
    /// The y axis's title, with its unit.
    pub y: &'a str,
    /// The lowest top of the y axis (the axis grows with the data above it).
    pub y_min_top: f64,
    /// Where the legend goes.
    pub legend: SeriesLabelPosition,
    /// The lines.
    pub lines: &'a [Line],
}

/// At most `max` points of `points`: every k-th, always the first and the last.
pub fn thin(points: &[(f64, f64)], max: usize) -> Vec<(f64, f64)> {
    if points.len() <= max.max(2) {
        return points.to_vec();
    }
    let stride = points.len().div_ceil(max.max(2) - 1);
    let mut out: Vec<(f64, f64)> = points.iter().step_by(stride).copied().collect();
    if let Some(last) = points.last()
        && out.last() != Some(last)
    {
        out.push(*last);
    }
    out
}

fn drawing<E: std::error::Error + Send + Sync>(
    title: &str,
) -> impl Fn(DrawingAreaErrorKind<E>) -> Error + '_ {
    move |e| Error::Other(format!("drawing the chart {title:?}: {e}"))
}

/// The chart as an SVG document.
///
/// # Errors
/// See the module docs.
pub fn svg(chart: &Chart<'_>) -> Result<String> {
    let finite = |v: f64| v.is_finite();
    let xs = || {
        chart
            .lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.0))
            .filter(|v| finite(*v))
    };
    let x_min = xs().fold(0.0_f64, f64::min);
    let x_max = xs().fold(x_min + 1.0, f64::max);
    let y_max = chart
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .filter(|v| finite(*v))
        .fold(chart.y_min_top.max(1.0), f64::max);
    let mut out = String::new();
    {
        let err = drawing(chart.title);
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let mut c = ChartBuilder::on(&root)
            .caption(chart.title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(x_min..x_max, 0.0..y_max * 1.08)
            .map_err(&err)?;
        c.configure_mesh()
            .x_desc(chart.x)
            .y_desc(chart.y)
            .axis_desc_style(("sans-serif", 15))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(&err)?;
        for (i, line) in chart.lines.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points = thin(&line.points, MAX_POINTS)
                .into_iter()
                .filter(|(x, y)| finite(*x) && finite(*y));
            c.draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(&err)?
                .label(line.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(3))
                });
        }
        if !chart.lines.is_empty() {
            c.configure_series_labels()
                .position(chart.legend.clone())
                .label_font(("sans-serif", 14))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.4))
                .draw()
                .map_err(&err)?;
        }
        root.present().map_err(&err)?;
    }
    Ok(out)
}

/// A row's legend entry: its label, the floor's with its concurrency, with how far it got
/// when it did not converge, `suffix` appended.
fn label(m: &Measurement, suffix: &str) -> String {
    let mut label = m.label();
    if m.contender == Contender::Floor {
        label = format!("{label} (concurrency {})", m.tuning.concurrency);
    }
    if !m.finished() {
        label = format!("{label}: {} of {} converged", m.converged, m.n);
    }
    label + suffix
}

/// Converged Apps over time, one line per row, held at its last count until the run's end.
pub fn converged_lines(rows: &[Measurement]) -> Vec<Line> {
    rows.iter()
        .map(|m| {
            let mut points: Vec<(f64, f64)> = m
                .series
                .converged
                .iter()
                .map(|(t, c)| (*t, *c as f64))
                .collect();
            if let Some(&(t, c)) = points.last()
                && m.series.end > t
            {
                points.push((m.series.end, c));
            }
            Line {
                label: label(m, ""),
                points,
            }
        })
        .collect()
}

/// The controller's RSS in MiB over time, one line per row (sharded rows: the largest replica).
pub fn memory_lines(rows: &[Measurement]) -> Vec<Line> {
    rows.iter()
        .map(|m| Line {
            label: label(
                m,
                if m.processes.len() > 1 {
                    " (largest replica)"
                } else {
                    ""
                },
            ),
            points: m
                .series
                .rss
                .iter()
                .map(|(t, b)| (*t, *b as f64 / (1024.0 * 1024.0)))
                .collect(),
        })
        .collect()
}

/// Where the two charts of `n` Apps go in `dir`: (converged, memory).
pub fn paths(dir: &Path, n: usize) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("scale-N{n}-converged.svg")),
        dir.join(format!("scale-N{n}-memory.svg")),
    )
}

/// Draws the two charts of `n` Apps into `dir` (created if missing); returns their paths.
///
/// # Errors
/// See the module docs.
pub fn write(dir: &Path, n: usize, rows: &[Measurement]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
    let (converged_path, memory_path) = paths(dir, n);
    let converged = converged_lines(rows);
    let memory = memory_lines(rows);
    let converged_title = format!("bench-scale N={n}: converged Apps since the first create");
    let memory_title =
        format!("bench-scale N={n}: controller RSS (converging, settling, idle window)");
    let charts = [
        (
            converged_path,
            Chart {
                title: &converged_title,
                x: "seconds since the first App was created (s)",
                y: "converged Apps (count)",
                y_min_top: n as f64,
                legend: SeriesLabelPosition::LowerRight,
                lines: &converged,
            },
        ),
        (
            memory_path,
            Chart {
                title: &memory_title,
                x: "seconds since the first App was created (s)",
                y: "resident set size (MiB)",
                y_min_top: 1.0,
                legend: SeriesLabelPosition::UpperRight,
                lines: &memory,
            },
        ),
    ];
    let mut written = Vec::new();
    for (path, chart) in charts {
        let text = svg(&chart)?;
        std::fs::write(&path, text).map_err(Error::io("writing", &path))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rising(label: &str, n: usize, seconds: f64) -> Line {
        Line {
            label: label.into(),
            points: (0..=n)
                .map(|i| (seconds * i as f64 / n as f64, i as f64))
                .collect(),
        }
    }

    fn texts(svg: &str) -> Vec<String> {
        let doc = match roxmltree::Document::parse(svg) {
            Ok(doc) => doc,
            Err(e) => panic!("not well-formed XML: {e}\n{svg}"),
        };
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            // plotters writes each text on a line of its own inside <text>.
            .filter_map(|n| n.text().map(|t| t.trim().to_string()))
            .collect()
    }

    #[test]
    fn a_chart_is_well_formed_svg_with_every_label_and_axis_title() -> Result<()> {
        let lines = vec![
            rising("floor (concurrency 16)", 1000, 20.4),
            rising("wasmop", 1000, 39.1),
            rising("kube-rs: 610 of 1000 converged", 610, 120.0),
            rising("controller-runtime", 1000, 51.1),
            // 5,000 points: thinned to MAX_POINTS, the last kept.
            rising("wasmop x3 (largest replica) & <friends>", 5000, 60.0),
        ];
        let chart = Chart {
            title: "bench-scale N=1000: converged Apps since the first create",
            x: "seconds since the first App was created (s)",
            y: "converged Apps (count)",
            y_min_top: 1000.0,
            legend: SeriesLabelPosition::LowerRight,
            lines: &lines,
        };
        let svg = svg(&chart)?;
        let texts = texts(&svg);
        for wanted in lines
            .iter()
            .map(|l| l.label.as_str())
            .chain([chart.title, chart.x, chart.y])
        {
            assert!(
                texts.iter().any(|t| t == wanted),
                "no text {wanted:?} in {texts:?}"
            );
        }
        // A polyline per line (width 2), and one per legend mark (width 3).
        for width in ["stroke-width=\"2\" points", "stroke-width=\"3\" points"] {
            assert_eq!(svg.matches(width).count(), lines.len(), "{width}: {svg}");
        }
        Ok(())
    }

    #[test]
    fn a_chart_without_data_is_still_well_formed() -> Result<()> {
        let svg = svg(&Chart {
            title: "empty",
            x: "s",
            y: "MiB",
            y_min_top: 1.0,
            legend: SeriesLabelPosition::UpperRight,
            lines: &[],
        })?;
        assert!(texts(&svg).iter().any(|t| t == "empty"), "{svg}");
        Ok(())
    }

    #[test]
    fn thinning_keeps_the_ends_and_at_most_max_points() {
        let points: Vec<(f64, f64)> = (0..10_001).map(|i| (i as f64, i as f64)).collect();
        let thin = thin(&points, MAX_POINTS);
        assert!(thin.len() <= MAX_POINTS, "{}", thin.len());
        assert_eq!(thin.first(), points.first());
        assert_eq!(thin.last(), points.last());
        assert_eq!(super::thin(&points[..5], MAX_POINTS), points[..5].to_vec());
    }
}
