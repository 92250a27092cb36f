//! The report's plots, drawn with plotters into SVG and rasterised to PNG with resvg — pure Rust, no system
//! fonts: the text is set in Ubuntu Light, embedded from the `epaint_default_fonts` crate and registered
//! with both plotters (layout) and resvg (rendering).
//!
//! * `cluster_cdf` — CDF of each clusterloader2 transition over every pod, with the thresholds;
//! * `node_cdf` — CDF of each node-side stage, from the fleet's merged HDR histograms;
//! * `timeline` — pods first seen (created), scheduled and running per second of the run;
//! * `api_latency` — p99 of the API server's request latency per verb, per scrape interval.
//!
//! The two CDFs have a log axis: transitions and stages differ by orders of magnitude, and the thresholds lie
//! far beyond a fast cluster's figures.
//!
//! Every axis starts at 0 (or, on a log axis, at the smallest value drawn). Series that would hide each other
//! stay visible: identical ones are drawn once under one legend entry naming them all, and each later series
//! is drawn thinner than the one before, so a line on top of another leaves it showing at its edges.

use std::path::Path;
use std::sync::{Arc, Once};

use anyhow::Context;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::apiserver;
use super::measure::Transition;
use super::run::SloResult;

/// The family name plotters and resvg know the embedded font by.
const FAMILY: &str = "sans-serif";
const SIZE: (u32, u32) = (960, 540);
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FAMILY, FontStyle::Normal, epaint_default_fonts::UBUNTU_LIGHT)
            .is_err()
        {
            tracing::warn!("the embedded plot font did not load; plot text may be misplaced");
        }
    });
}

/// A named line.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points.
    pub points: Vec<(f64, f64)>,
}

/// One chart's content.
pub struct Chart<'a> {
    /// Title.
    pub title: &'a str,
    /// X axis label.
    pub x_desc: &'a str,
    /// Y axis label.
    pub y_desc: &'a str,
    /// Lines.
    pub series: Vec<Series>,
    /// Vertical marker lines (x, label).
    pub markers: Vec<(f64, String)>,
    /// Draw lines as steps (for per-second counts).
    pub steps: bool,
    /// A logarithmic x axis; values below [`LOG_FLOOR_MS`] are drawn at it.
    pub log_x: bool,
}

/// The smallest x a log axis shows (1 µs in milliseconds, the histograms' resolution).
pub const LOG_FLOOR_MS: f64 = 0.001;

/// Stroke width of the `i`th series: the first widest, each later one thinner, so overlapping lines all show.
fn stroke(i: usize, of: usize) -> u32 {
    let thicker = of.saturating_sub(1).saturating_sub(i).min(8);
    2 + u32::try_from(thicker).unwrap_or(8)
}

/// Merges series with identical points into one, its legend naming every one of them (`a = b`).
pub fn merge_identical(series: Vec<Series>) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::with_capacity(series.len());
    for s in series {
        match out.iter_mut().find(|o| o.points == s.points) {
            Some(o) => {
                o.name.push_str(" = ");
                o.name.push_str(&s.name);
            }
            None => out.push(s),
        }
    }
    out
}

fn bounds(chart: &Chart<'_>) -> ((f64, f64), (f64, f64)) {
    let xs = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(chart.markers.iter().map(|m| m.0));
    let ys = chart.series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let floor = if chart.log_x { LOG_FLOOR_MS } else { 0.0 };
    let (mut x0, mut x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x.max(floor)), b.max(x.max(floor)))
    });
    if !x0.is_finite() || !x1.is_finite() {
        (x0, x1) = (floor, floor + 1.0);
    }
    let y1 = ys.fold(0.0_f64, f64::max);
    let y1 = if y1 <= 0.0 { 1.0 } else { y1 * 1.05 };
    if chart.log_x {
        // whole decades either side, so the ticks fall on round values
        let (lo, hi) = (
            x0.log10().floor(),
            x1.log10().ceil().max(x0.log10().floor() + 1.0),
        );
        ((10f64.powf(lo), 10f64.powf(hi)), (0.0, y1))
    } else {
        x0 = 0.0;
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        ((x0, x1 + (x1 - x0) * 0.02), (0.0, y1))
    }
}

/// Draws `chart` as SVG text.
pub fn svg(chart: &Chart<'_>) -> anyhow::Result<String> {
    register_font();
    let mut out = String::new();
    let ((x0, x1), (y0, y1)) = bounds(chart);
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        let e = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("drawing {}: {e}", chart.title);
        root.fill(&WHITE).map_err(e)?;
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(chart.title, (FAMILY, 24))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(64);
        if chart.log_x {
            let c = builder
                .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
                .map_err(e)?;
            draw(c, chart, (y0, y1), LOG_FLOOR_MS)?;
        } else {
            let c = builder.build_cartesian_2d(x0..x1, y0..y1).map_err(e)?;
            draw(c, chart, (y0, y1), 0.0)?;
        }
        root.present().map_err(e)?;
    }
    Ok(out)
}

/// Draws the mesh, markers, series and legend of `chart` on `c`; x values below `floor` are drawn at it.
fn draw<'a, DB, X>(
    mut c: ChartContext<'a, DB, Cartesian2d<X, RangedCoordf64>>,
    chart: &Chart<'_>,
    (y0, y1): (f64, f64),
    floor: f64,
) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing {}: {e}", chart.title);
    c.configure_mesh()
        .x_desc(chart.x_desc)
        .y_desc(chart.y_desc)
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(e)?;
    for (x, label) in &chart.markers {
        let red = RGBColor(200, 0, 0);
        let x = x.max(floor);
        c.draw_series(LineSeries::new(vec![(x, y0), (x, y1)], red.stroke_width(1)))
            .map_err(e)?
            .label(label.clone())
            .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], red));
    }
    let n = chart.series.len();
    for (i, s) in chart.series.iter().enumerate() {
        let style = COLORS[i % COLORS.len()].stroke_width(stroke(i, n));
        let floored = s.points.iter().map(|(x, y)| (x.max(floor), *y));
        let points: Vec<(f64, f64)> = if chart.steps {
            let p: Vec<(f64, f64)> = floored.collect();
            let mut v = Vec::with_capacity(p.len() * 2);
            for w in p.windows(2) {
                v.push(w[0]);
                v.push((w[1].0, w[0].1));
            }
            v.extend(p.last());
            v
        } else {
            floored.collect()
        };
        if let [only] = points[..] {
            // one point makes no line: a dot shows it
            c.draw_series(std::iter::once(Circle::new(only, 3, style.filled())))
                .map_err(e)?;
        }
        c.draw_series(LineSeries::new(points, style))
            .map_err(e)?
            .label(s.name.clone())
            .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], style));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

/// Rasterises SVG text to PNG bytes with the embedded font.
pub fn png(svg: &str) -> anyhow::Result<Vec<u8>> {
    use resvg::{tiny_skia, usvg};
    static FONTS: std::sync::OnceLock<Arc<usvg::fontdb::Database>> = std::sync::OnceLock::new();
    let fonts = FONTS.get_or_init(|| {
        let mut db = usvg::fontdb::Database::new();
        db.load_font_data(epaint_default_fonts::UBUNTU_LIGHT.to_vec());
        db.set_sans_serif_family("Ubuntu");
        Arc::new(db)
    });
    let opts = usvg::Options {
        fontdb: fonts.clone(),
        font_family: "Ubuntu".to_owned(),
        ..Default::default()
    };
    let tree = usvg::Tree::from_str(svg, &opts).context("parsing the plot's SVG")?;
    let size = tree.size().to_int_size();
    let mut pixmap =
        tiny_skia::Pixmap::new(size.width(), size.height()).context("allocating the PNG canvas")?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap.encode_png().context("encoding PNG")
}

/// A CDF (x sorted ascending, y the fraction at or below x).
pub fn cdf(mut samples: Vec<f64>) -> Vec<(f64, f64)> {
    samples.sort_by(f64::total_cmp);
    let n = samples.len() as f64;
    // from 0 at the smallest sample, so even one sample draws a line
    let start = samples.first().map(|v| (*v, 0.0));
    start
        .into_iter()
        .chain(
            samples
                .into_iter()
                .enumerate()
                .map(|(i, v)| (v, (i + 1) as f64 / n)),
        )
        .collect()
}

fn cluster_cdf(r: &SloResult) -> Chart<'static> {
    let definition = r.cluster.definition;
    let series = Transition::ALL
        .iter()
        .map(|t| {
            let samples: Vec<f64> = r
                .records
                .iter()
                .filter_map(|p| p.latency_ms(definition, *t))
                .collect();
            let all_zero = !samples.is_empty() && samples.iter().all(|ms| *ms == 0.0);
            Series {
                name: if all_zero {
                    format!("{} (0 for every pod)", t.name())
                } else {
                    t.name().to_owned()
                },
                points: cdf(samples),
            }
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    Chart {
        title: "Pod start-up transitions (cluster side, every pod): CDF",
        x_desc: "latency (ms, log scale; below 0.001 drawn at 0.001)",
        y_desc: "fraction of pods",
        series: merge_identical(series),
        markers: r
            .verdicts
            .iter()
            .map(|v| {
                (
                    v.threshold.limit.as_secs_f64() * 1000.0,
                    format!("SLO {}", v.threshold),
                )
            })
            .collect(),
        steps: false,
        log_x: true,
    }
}

fn node_cdf(r: &SloResult) -> Option<Chart<'static>> {
    let fleet = r.fleet.as_ref()?;
    let series = fleet
        .rows()
        .into_iter()
        .filter_map(|(name, _)| {
            let h = fleet.stages.get(name).filter(|h| !h.is_empty())?;
            let n = h.len() as f64;
            let mut seen = 0u64;
            let first = (h.min() as f64 / 1000.0, 0.0);
            let points = std::iter::once(first)
                .chain(h.iter_recorded().map(|v| {
                    seen += v.count_at_value();
                    (
                        h.highest_equivalent(v.value_iterated_to()) as f64 / 1000.0,
                        seen as f64 / n,
                    )
                }))
                .collect();
            Some(Series {
                name: name.to_owned(),
                points,
            })
        })
        .collect();
    Some(Chart {
        title: "Node-side start-up stages (fleet, merged): CDF",
        x_desc: "time since the previous stage (ms, log scale; below 0.001 drawn at 0.001)",
        y_desc: "fraction of pods",
        series: merge_identical(series),
        markers: Vec::new(),
        steps: false,
        log_x: true,
    })
}

fn timeline(r: &SloResult) -> Chart<'static> {
    let origin = r.started;
    let secs =
        |t: k8s_openapi::jiff::Timestamp| t.duration_since(origin).as_secs_f64().max(0.0).floor() as usize;
    let mut bins: [Vec<f64>; 3] = Default::default();
    let mut bump = |i: usize, at: Option<k8s_openapi::jiff::Timestamp>| {
        if let Some(at) = at {
            let s = secs(at);
            if bins[i].len() <= s {
                bins[i].resize(s + 1, 0.0);
            }
            bins[i][s] += 1.0;
        }
    };
    for p in &r.records {
        bump(0, Some(p.first_seen));
        bump(1, p.bound_seen);
        bump(2, p.running_seen);
    }
    let len = bins.iter().map(Vec::len).max().unwrap_or(0) + 1;
    let series = ["created (first seen)", "scheduled", "running"]
        .iter()
        .zip(bins)
        .map(|(name, mut b)| {
            b.resize(len, 0.0);
            Series {
                name: (*name).to_owned(),
                points: b.into_iter().enumerate().map(|(i, v)| (i as f64, v)).collect(),
            }
        })
        .collect();
    Chart {
        title: "Pods per second",
        x_desc: "seconds since the run began",
        y_desc: "pods per second",
        series,
        markers: Vec::new(),
        steps: true,
        log_x: false,
    }
}

fn api_latency(r: &SloResult) -> Option<Chart<'static>> {
    let scrapes = r.api.as_ref().ok().filter(|s| s.len() >= 2)?;
    let verbs: std::collections::BTreeSet<&String> = scrapes.iter().flat_map(|s| s.by_verb.keys()).collect();
    let series = verbs
        .into_iter()
        .filter_map(|verb| {
            let points: Vec<(f64, f64)> = scrapes
                .windows(2)
                .filter_map(|w| {
                    let later = w[1].by_verb.get(verb)?;
                    let earlier = w[0].by_verb.get(verb).cloned().unwrap_or_default();
                    let d = apiserver::delta(
                        &[(verb.clone(), later.clone())].into(),
                        &[(verb.clone(), earlier)].into(),
                    );
                    let b = d.get(verb)?;
                    (apiserver::total(b) > 0).then(|| (w[1].at, apiserver::quantile_ms(b, 0.99)))
                })
                .collect();
            (!points.is_empty()).then(|| Series {
                name: format!("{verb} p99"),
                points,
            })
        })
        .collect();
    Some(Chart {
        title: "API server request latency (p99 per scrape interval)",
        x_desc: "seconds since the run began",
        y_desc: "p99 latency (ms)",
        series,
        markers: Vec::new(),
        steps: false,
        log_x: false,
    })
}

/// Writes every plot the run has data for, as `<name>.svg` and `<name>.png`; returns the file names.
pub fn write_all(r: &SloResult, dir: &Path) -> anyhow::Result<Vec<String>> {
    let charts: Vec<(&str, Chart<'_>)> = [
        Some(("cluster_cdf", cluster_cdf(r))),
        node_cdf(r).map(|c| ("node_cdf", c)),
        Some(("timeline", timeline(r))),
        api_latency(r).map(|c| ("api_latency", c)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut files = Vec::new();
    for (name, chart) in charts {
        let text = svg(&chart)?;
        let svg_name = format!("{name}.svg");
        std::fs::write(dir.join(&svg_name), &text).with_context(|| format!("writing {svg_name}"))?;
        let png_name = format!("{name}.png");
        std::fs::write(dir.join(&png_name), png(&text)?).with_context(|| format!("writing {png_name}"))?;
        files.push(svg_name);
        files.push(png_name);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_renders_to_svg_with_its_text_and_to_a_png() {
        let chart = Chart {
            title: "t",
            x_desc: "latency (ms)",
            y_desc: "fraction",
            series: vec![Series {
                name: "pod_startup".into(),
                points: cdf(vec![100.0, 300.0, 200.0, 900.0]),
            }],
            markers: vec![(1000.0, "SLO".into())],
            steps: false,
            log_x: false,
        };
        let s = svg(&chart).unwrap();
        assert!(s.contains("pod_startup") && s.contains("latency (ms)"), "{s}");
        let p = png(&s).unwrap();
        assert_eq!(&p[1..4], b"PNG");
        assert_eq!(cdf(vec![2.0, 1.0]), vec![(1.0, 0.0), (1.0, 0.5), (2.0, 1.0)]);
    }

    fn series(name: &str, points: &[(f64, f64)]) -> Series {
        Series {
            name: name.into(),
            points: points.to_vec(),
        }
    }

    #[test]
    fn identical_series_share_one_line_and_later_lines_are_thinner() {
        let merged = merge_identical(vec![
            series("schedule_to_run", &[(1.0, 0.5), (2.0, 1.0)]),
            series("run_to_watch", &[(0.0, 0.0), (0.0, 1.0)]),
            series("schedule_to_watch", &[(1.0, 0.5), (2.0, 1.0)]),
        ]);
        let names: Vec<&str> = merged.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["schedule_to_run = schedule_to_watch", "run_to_watch"]);
        let widths: Vec<u32> = (0..4).map(|i| stroke(i, 4)).collect();
        assert_eq!(widths, [5, 4, 3, 2]);
    }

    #[test]
    fn axes_start_at_zero_or_at_the_smallest_decade_drawn() {
        let mut chart = Chart {
            title: "t",
            x_desc: "x",
            y_desc: "y",
            series: vec![series("a", &[(0.0, 0.0), (0.0004, 0.3), (42.0, 1.0)])],
            markers: Vec::new(),
            steps: false,
            log_x: false,
        };
        let ((x0, x1), (y0, _)) = bounds(&chart);
        assert_eq!((x0, y0), (0.0, 0.0));
        assert!(x1 > 42.0);
        chart.log_x = true;
        let ((x0, x1), _) = bounds(&chart);
        assert_eq!((x0, x1), (0.001, 100.0), "0 and 0.4 µs drawn at the 1 µs floor");
        let s = svg(&chart).unwrap();
        assert!(s.contains("<polyline") || s.contains("<path"), "a line is drawn");
    }
}
