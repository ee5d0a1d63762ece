//! The plot of a run (SVG): throughput per tenant over time above, p99
//! latency per honest workload over time below (log scale), the phases
//! shaded and the live QoS changes marked in both.

use std::path::Path;

use plotters::prelude::*;

use crate::report::{Report, Series};

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 780;

/// Draws `r` into the SVG file `path`.
pub fn draw(r: &Report, path: &Path) -> Result<(), String> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    let fail = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let root = root
        .titled(&format!("QoS lab: {}", r.scenario), ("sans-serif", 22))
        .map_err(|e| fail(&e))?;
    let (top, bottom) = root.split_vertically(HEIGHT / 2 - 20);
    let t_max = r.duration_s.max(0.1);

    // Throughput per tenant.
    let y_max = max_of(&r.tenant_mib_per_s).max(1.0) * 1.15;
    let mut c = ChartBuilder::on(&top)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .caption(
            "throughput per tenant (engine counters)",
            ("sans-serif", 16),
        )
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)
        .map_err(|e| fail(&e))?;
    c.configure_mesh()
        .x_desc("s")
        .y_desc("MiB/s")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| fail(&e))?;
    marks(&mut c, r, (0.0, y_max), (y_max * 0.98, y_max * 0.91)).map_err(|e| fail(&e))?;
    lines(&mut c, &r.t_s, &r.tenant_mib_per_s, 0).map_err(|e| fail(&e))?;

    // p99 latency per honest workload, log scale.
    let lo = min_of(&r.workload_p99_us).unwrap_or(1.0).max(0.01) / 1.5;
    let hi = max_of(&r.workload_p99_us).max(lo * 10.0) * 1.5;
    let mut c = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .caption(
            "p99 post-to-completion latency per workload (per interval)",
            ("sans-serif", 16),
        )
        .build_cartesian_2d(0f64..t_max, (lo..hi).log_scale())
        .map_err(|e| fail(&e))?;
    c.configure_mesh()
        .x_desc("s")
        .y_desc("µs")
        .y_label_formatter(&|v| format!("{v}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| fail(&e))?;
    marks(&mut c, r, (lo, hi), (hi / 1.05, hi / 1.4)).map_err(|e| fail(&e))?;
    lines(&mut c, &r.t_s, &r.workload_p99_us, 5).map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// Draws every series of `series` (at interval ends `t`) as a line in a
/// colour of its own (the palette from `first`), with its legend.
fn lines<'a, X, Y>(
    c: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    t: &[f64],
    series: &[Series],
    first: usize,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (k, s) in series.iter().enumerate() {
        let color = Palette99::pick(k + first).to_rgba();
        c.draw_series(LineSeries::new(points(t, s), color.stroke_width(2)))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    if !series.is_empty() {
        c.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    Ok(())
}

/// Points of `s` at interval ends `t`; gaps (intervals without a value)
/// are skipped.
fn points(t: &[f64], s: &Series) -> Vec<(f64, f64)> {
    t.iter()
        .zip(&s.values)
        .filter_map(|(&x, v)| v.map(|y| (x, y)))
        .collect()
}

fn max_of(series: &[Series]) -> f64 {
    series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0, |a: f64, &b| a.max(b))
}

fn min_of(series: &[Series]) -> Option<f64> {
    series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .copied()
        .filter(|v| *v > 0.0)
        .reduce(f64::min)
}

/// The phases as shaded bands spanning `lo..hi` with their names at
/// `phase_y`, the changes as dashed vertical lines with what they changed
/// at `change_y`.
fn marks<X, Y>(
    c: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>,
    r: &Report,
    (lo, hi): (f64, f64),
    (phase_y, change_y): (f64, f64),
) -> Result<(), DrawingAreaErrorKind<std::io::Error>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (k, p) in r.phases.iter().enumerate() {
        let shade = if k % 2 == 0 {
            BLUE.mix(0.06)
        } else {
            GREEN.mix(0.06)
        };
        c.draw_series(std::iter::once(Rectangle::new(
            [(p.from_s, lo), (p.to_s, hi)],
            shade.filled(),
        )))?;
        c.draw_series(std::iter::once(Text::new(
            p.name.clone(),
            (p.from_s, phase_y),
            ("sans-serif", 12).into_font().color(&BLACK.mix(0.6)),
        )))?;
    }
    for ch in &r.changes {
        let style = RED.mix(0.8).stroke_width(1);
        c.draw_series(DashedLineSeries::new(
            vec![(ch.at_s, lo), (ch.at_s, hi)],
            6,
            4,
            style,
        ))?;
        c.draw_series(std::iter::once(Text::new(
            ch.what.clone(),
            (ch.at_s, change_y),
            ("sans-serif", 11).into_font().color(&RED),
        )))?;
    }
    Ok(())
}
