//! The timeline picture: per rule, admitted and denied (shadow included) per second, the new
//! config in solid lines and the baseline in thin ones.

use std::path::Path;

use plotters::prelude::*;

use crate::Replay;

/// One line of a panel: its legend, points and style.
type Line<'a> = (&'a str, Vec<(f64, f64)>, ShapeStyle);

/// Seconds per point: long logs are averaged into at most 600 points per line.
fn bucket(seconds: usize) -> usize {
    seconds.div_ceil(600).max(1)
}

/// Writes the SVG timeline to `path`.
///
/// # Errors
/// Drawing or writing errors, as text.
pub fn timeline_svg(replay: &Replay, path: &Path) -> Result<(), String> {
    draw(replay, path).map_err(|e| e.to_string())
}

#[allow(clippy::cast_precision_loss)]
fn series(timeline: &[(u32, u32)], width: usize, denied: bool) -> Vec<(f64, f64)> {
    timeline
        .chunks(width)
        .enumerate()
        .map(|(i, chunk)| {
            let sum: u64 = chunk
                .iter()
                .map(|&(a, d)| u64::from(if denied { d } else { a }))
                .sum();
            ((i * width) as f64, sum as f64 / chunk.len() as f64)
        })
        .collect()
}

fn draw(replay: &Replay, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let rules = &replay.new.rules;
    let panels = rules.len().max(1);
    let height = u32::try_from(panels * 260).unwrap_or(u32::MAX);
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((panels, 1));
    let seconds = rules
        .iter()
        .chain(replay.baseline.iter().flat_map(|b| b.rules.iter()))
        .map(|r| r.timeline.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let width = bucket(seconds);
    for (area, rule) in areas.iter().zip(rules) {
        let base = replay
            .baseline
            .as_ref()
            .and_then(|b| b.rules.iter().find(|r| r.rule == rule.rule));
        let lines: Vec<Line<'_>> = [
            Some((
                "new: admitted",
                series(&rule.timeline, width, false),
                GREEN.stroke_width(2),
            )),
            Some((
                "new: denied",
                series(&rule.timeline, width, true),
                RED.stroke_width(2),
            )),
            base.map(|b| {
                (
                    "baseline: admitted",
                    series(&b.timeline, width, false),
                    BLUE.mix(0.6).stroke_width(1),
                )
            }),
            base.map(|b| {
                (
                    "baseline: denied",
                    series(&b.timeline, width, true),
                    MAGENTA.mix(0.6).stroke_width(1),
                )
            }),
        ]
        .into_iter()
        .flatten()
        .collect();
        let top = lines
            .iter()
            .flat_map(|(_, points, _)| points.iter().map(|p| p.1))
            .fold(1.0_f64, f64::max)
            * 1.1;
        #[allow(clippy::cast_precision_loss)]
        let x_end = seconds as f64;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("rule `{}`: requests per second", rule.rule),
                ("sans-serif", 16),
            )
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..x_end, 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the first request")
            .draw()?;
        for (label, points, style) in lines {
            chart
                .draw_series(LineSeries::new(points, style))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], style));
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
