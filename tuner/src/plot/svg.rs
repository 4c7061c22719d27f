//! Drawing a [`Chart`] as SVG with plotters (SVG backend only; text is left to the viewer's
//! fonts).

use super::{Chart, PlotError, Style};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

/// Distinct, print-safe colours for measured series (floors are drawn in greys).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
    RGBColor(0, 0, 128),
];
const FLOOR_GREYS: [RGBColor; 3] =
    [RGBColor(0, 0, 0), RGBColor(110, 110, 110), RGBColor(170, 170, 170)];

/// Axis bounds over every point, with a margin; log axes keep to positive values.
fn bounds(values: impl Iterator<Item = f64>, log: bool) -> Option<(f64, f64)> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return None;
    }
    Some(if log {
        (lo / 1.25, hi * 1.25)
    } else {
        let pad = ((hi - lo) * 0.05).max(hi.abs() * 0.05).max(1e-9);
        (lo - pad, hi + pad)
    })
}

/// Render `chart` (width x height pixels) to an SVG document.
pub fn render(chart: &Chart, size: (u32, u32)) -> Result<String, PlotError> {
    let points = || chart.series.iter().flat_map(|s| s.points.iter());
    let xb = bounds(points().map(|p| p.0), chart.log_x);
    let yb = bounds(points().map(|p| p.1), chart.log_y);
    let (Some(xb), Some(mut yb)) = (xb, yb) else {
        return Err(PlotError::Empty(chart.title.clone()));
    };
    // Headroom above the data for the legend (upper left): its rows' share of the plot height.
    let legend = (chart.series.len() as f64 * 19.0 + 16.0) / (size.1 as f64 - 100.0);
    let keep = (1.0 - legend.min(0.6)).max(0.4);
    yb.1 = if chart.log_y {
        (yb.0.ln() + (yb.1.ln() - yb.0.ln()) / keep).exp()
    } else {
        yb.0 + (yb.1 - yb.0) / keep
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw)?;
        match (chart.log_x, chart.log_y) {
            (true, true) => {
                draw_on(&root, chart, (xb.0..xb.1).log_scale(), (yb.0..yb.1).log_scale())?
            }
            (true, false) => draw_on(&root, chart, (xb.0..xb.1).log_scale(), yb.0..yb.1)?,
            (false, true) => draw_on(&root, chart, xb.0..xb.1, (yb.0..yb.1).log_scale())?,
            (false, false) => draw_on(&root, chart, xb.0..xb.1, yb.0..yb.1)?,
        }
        root.present().map_err(draw)?;
    }
    Ok(svg)
}

fn draw<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

fn draw_on<'a, X, Y>(
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    chart: &Chart,
    x: X,
    y: Y,
) -> Result<(), PlotError>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut c = ChartBuilder::on(root)
        .caption(&chart.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)
        .map_err(draw)?;
    c.configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .y_labels(12)
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .x_label_formatter(&|v| short_number(*v))
        .y_label_formatter(&|v| short_number(*v))
        .draw()
        .map_err(draw)?;
    let (mut measured, mut floors) = (0usize, 0usize);
    for s in &chart.series {
        let color = match s.style {
            Style::Floor => {
                floors += 1;
                FLOOR_GREYS[(floors - 1) % FLOOR_GREYS.len()]
            }
            _ => {
                measured += 1;
                PALETTE[(measured - 1) % PALETTE.len()]
            }
        };
        let pts: Vec<(f64, f64)> = s.points.clone();
        let line = ShapeStyle { color: color.to_rgba(), filled: false, stroke_width: 2 };
        let anno = match s.style {
            Style::Floor => {
                c.draw_series(DashedLineSeries::new(pts.clone(), 6, 4, line)).map_err(draw)?
            }
            Style::Line | Style::Curve => {
                c.draw_series(LineSeries::new(pts.clone(), line)).map_err(draw)?
            }
            Style::Points => c
                .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(draw)?,
        };
        anno.label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], line));
        if s.style == Style::Line {
            c.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled()))).map_err(draw)?;
        }
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(draw)?;
    Ok(())
}

/// Tick labels: 1, 16, 1024, 3.5, 0.25.
fn short_number(v: f64) -> String {
    if v >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
