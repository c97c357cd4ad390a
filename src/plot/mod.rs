//! Figures with `plotters`, written as PNG and SVG. Text uses the DejaVu Sans font embedded in the
//! binary (the `dejavu` crate), so figures render on machines without system fonts.

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Once;

/// Tableau-10: distinguishable, colour-blind-friendlier than the plotters defaults.
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

static FONTS: Once = Once::new();

/// Registers the embedded font under the family name plotters asks for by default.
pub fn register_fonts() {
    FONTS.call_once(|| {
        for family in ["sans-serif", "DejaVu Sans"] {
            let _ = plotters::style::register_font(family, FontStyle::Normal, dejavu::sans::regular());
            let _ = plotters::style::register_font(family, FontStyle::Bold, dejavu::sans::bold());
        }
    });
}

/// One curve.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart description.
#[derive(Debug, Clone)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// Draws `chart` to `<out_base>.png` (1200×800) and `<out_base>.svg`; returns both paths.
pub fn line_chart(chart: &LineChart, out_base: &Path) -> Result<Vec<PathBuf>> {
    register_fonts();
    if let Some(dir) = out_base.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let png = out_base.with_extension("png");
    let svg = out_base.with_extension("svg");
    {
        let root = BitMapBackend::new(&png, (1200, 800)).into_drawing_area();
        draw_lines(&root, chart)?;
        root.present().map_err(|e| anyhow!("writing {}: {e}", png.display()))?;
    }
    {
        let root = SVGBackend::new(&svg, (1200, 800)).into_drawing_area();
        draw_lines(&root, chart)?;
        root.present().map_err(|e| anyhow!("writing {}: {e}", svg.display()))?;
    }
    Ok(vec![png, svg])
}

fn draw_lines<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &LineChart) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let all: Vec<(f64, f64)> = chart.series.iter().flat_map(|s| s.points.iter().cloned()).collect();
    anyhow::ensure!(!all.is_empty(), "nothing to plot: no data points");
    let x_max = all.iter().map(|p| p.0).fold(f64::MIN, f64::max).max(1.0);
    let x_min = all.iter().map(|p| p.0).fold(f64::MAX, f64::min).min(0.0);
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(&chart.title, ("sans-serif", 34))
        .margin(20)
        .margin_right(50)
        .x_label_area_size(70)
        .y_label_area_size(110);
    if chart.log_y {
        // Log axes need positive values; clamp exact zeros (converged to machine precision) to
        // a decade below the smallest positive value so they stay visible.
        let pos: Vec<f64> = all.iter().map(|p| p.1).filter(|v| *v > 0.0 && v.is_finite()).collect();
        let lo = pos.iter().cloned().fold(f64::MAX, f64::min);
        let hi = pos.iter().cloned().fold(f64::MIN, f64::max);
        anyhow::ensure!(lo.is_finite() && hi.is_finite(), "nothing positive to plot on a log axis");
        let floor = lo / 10.0;
        let y_range = (floor..hi * 2.0).log_scale();
        let mut ctx = builder.build_cartesian_2d(x_min..x_max, y_range).map_err(err)?;
        ctx.configure_mesh()
            .x_desc(&chart.x_label)
            .y_desc(&chart.y_label)
            .label_style(("sans-serif", 22))
            .axis_desc_style(("sans-serif", 26))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0e}"))
            .draw()
            .map_err(err)?;
        for (i, s) in chart.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let pts = s.points.iter().map(|&(x, y)| (x, if y > 0.0 { y } else { floor }));
            ctx.draw_series(LineSeries::new(pts, color.stroke_width(3)))
                .map_err(err)?
                .label(&s.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 30, y)], color.stroke_width(3)));
        }
        legend(&mut ctx).map_err(err)?;
    } else {
        let lo = all.iter().map(|p| p.1).fold(f64::MAX, f64::min);
        let hi = all.iter().map(|p| p.1).fold(f64::MIN, f64::max);
        let pad = ((hi - lo) * 0.05).max(1e-12);
        let mut ctx = builder.build_cartesian_2d(x_min..x_max, (lo - pad)..(hi + pad)).map_err(err)?;
        ctx.configure_mesh()
            .x_desc(&chart.x_label)
            .y_desc(&chart.y_label)
            .label_style(("sans-serif", 22))
            .axis_desc_style(("sans-serif", 26))
            .draw()
            .map_err(err)?;
        for (i, s) in chart.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            ctx.draw_series(LineSeries::new(s.points.iter().cloned(), color.stroke_width(3)))
                .map_err(err)?
                .label(&s.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 30, y)], color.stroke_width(3)));
        }
        legend(&mut ctx).map_err(err)?;
    }
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    ctx: &mut ChartContext<'a, DB, CT>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 22))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}
