//! Figures with `plotters`, written as PNG, SVG and PDF (vector, converted from the SVG drawing by
//! `svg2pdf`, its fonts embedded: what pdflatex's `\includegraphics` takes). Text uses the DejaVu
//! Sans font embedded in the binary (the `dejavu` crate), so figures render on machines without
//! system fonts.

pub mod figures;
pub mod rl;
pub mod study;

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
    /// Line colour; `None` takes the palette in order.
    pub color: Option<RGBColor>,
    /// A shaded band around the line, `(low, high)` at each point (e.g. mean ± sd over seeds).
    pub band: Option<Vec<(f64, f64)>>,
}

/// The colour of a topology, the same in every figure: residual blue, ACN orange, H-ACN green,
/// ANCRe red, … Several runs of one topology (`variant` = 0, 1, 2, …) get lighter shades of it.
pub fn topology_color(kind: &str, variant: usize) -> RGBColor {
    // Each topology declares its colour in its registry entry.
    let base =
        crate::topology::entry(kind).map_or(RGBColor(90, 90, 160), |e| RGBColor(e.color.0, e.color.1, e.color.2));
    let t = [0.0, 0.35, 0.55, 0.7, 0.8][variant.min(4)];
    let mix = |c: u8| (c as f64 + (255.0 - c as f64) * t) as u8;
    RGBColor(mix(base.0), mix(base.1), mix(base.2))
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

/// Which files a figure is written as (`--formats` of `plot` and `report`; all three by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Formats {
    pub png: bool,
    pub svg: bool,
    pub pdf: bool,
}

impl Formats {
    pub const ALL: Formats = Formats { png: true, svg: true, pdf: true };

    /// Parses `png,svg,pdf` (any non-empty subset, in any order).
    pub fn parse(list: &str) -> Result<Formats> {
        let mut f = Formats { png: false, svg: false, pdf: false };
        for word in list.split(',').map(str::trim) {
            match word {
                "png" => f.png = true,
                "svg" => f.svg = true,
                "pdf" => f.pdf = true,
                other => anyhow::bail!("--formats {list}: `{other}` is not a figure format; allowed: png, svg, pdf"),
            }
        }
        anyhow::ensure!(f.png || f.svg || f.pdf, "--formats {list}: name at least one of png, svg, pdf");
        Ok(f)
    }
}

static FORMATS: std::sync::Mutex<Formats> = std::sync::Mutex::new(Formats::ALL);

/// Sets the formats every figure of this process is written in (the commands do, from
/// `--formats`, before drawing).
pub fn set_formats(f: Formats) {
    *FORMATS.lock().unwrap_or_else(|e| e.into_inner()) = f;
}

fn formats() -> Formats {
    *FORMATS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drawing units per inch: every figure is drawn on a canvas of its printed width × this many
/// units (a 6.75-inch figure is 1200 wide), its PDF page set at this resolution, so that the PDF is
/// exactly the asked width and text sizes given in points ([`pt`]) print at those sizes.
pub const PDF_DPI: f32 = 1200.0 / 6.75;

/// A size in points (1/72 in) in drawing units.
pub fn pt(points: f64) -> u32 {
    (points * f64::from(PDF_DPI) / 72.0).round() as u32
}

/// A font size in points, as plotters takes it: its backends set text at the given size / 1.24
/// (the SVG's `font-size`, the bitmap's glyph scale alike).
pub fn font(points: f64) -> u32 {
    (points * 1.24 * f64::from(PDF_DPI) / 72.0).round() as u32
}

/// Text sizes (points) at the printed width: 8–9 pt, as a paper's figures are set.
const TITLE_PT: f64 = 9.5;
const AXIS_PT: f64 = 9.0;
const TICK_PT: f64 = 8.0;
const LEGEND_PT: f64 = 8.0;
/// Numbers printed in heatmap cells (small matrices only).
const CELL_PT: f64 = 7.0;
/// Curves and legend swatches: 1.2 pt lines, 2 pt dots.
const LINE_PT: f64 = 1.2;
const DOT_PT: f64 = 2.0;

/// About how wide `text` is set in DejaVu Sans at plotters size `size`, in drawing units: digits
/// and most letters are 0.55–0.64 em wide, a point or a comma 0.32.
fn text_width(text: &str, size: u32) -> f64 {
    let ems: f64 = text.chars().map(|c| if matches!(c, '.' | ',' | ' ') { 0.32 } else { 0.64 }).sum();
    ems * f64::from(size) / 1.24
}

/// A title that fits `width` drawing units: at `points`, else smaller down to 7 pt, else cut with
/// an ellipsis. → (text, plotters size).
fn fit_title(title: &str, width: u32, points: f64) -> (String, u32) {
    let room = f64::from(width) * 0.96;
    let mut p = points;
    while p > 7.0 && text_width(title, font(p)) > room {
        p -= 0.5;
    }
    let size = font(p);
    if text_width(title, size) <= room {
        return (title.to_string(), size);
    }
    let keep = (room / text_width("x", size)).floor() as usize;
    (title.chars().take(keep.saturating_sub(1)).collect::<String>() + "…", size)
}

/// A figure's printed width (`--width` of `plot` and `report`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Width {
    /// One column of a two-column paper (NeurIPS, ICML): 3.25 in.
    Single,
    /// The text width of a two-column paper: 6.75 in (the default).
    Double,
    Inches(f64),
}

impl Width {
    pub fn inches(self) -> f64 {
        match self {
            Width::Single => 3.25,
            Width::Double => 6.75,
            Width::Inches(w) => w,
        }
    }

    /// Parses `single`, `double` or a width in inches (2 to 20).
    pub fn parse(text: &str) -> Result<Width> {
        match text.trim() {
            "single" => Ok(Width::Single),
            "double" => Ok(Width::Double),
            other => match other.trim_end_matches("in").trim().parse::<f64>() {
                Ok(w) if (2.0..=20.0).contains(&w) => Ok(Width::Inches(w)),
                Ok(w) => anyhow::bail!("--width {text}: {w} in is outside 2–20 in"),
                Err(_) => anyhow::bail!(
                    "--width {text}: expected single (3.25 in), double (6.75 in) or a width in inches, e.g. 5.5"
                ),
            },
        }
    }
}

static WIDTH: std::sync::Mutex<Width> = std::sync::Mutex::new(Width::Double);

/// Sets the printed width of every figure of this process (the commands do, from `--width`).
pub fn set_width(w: Width) {
    *WIDTH.lock().unwrap_or_else(|e| e.into_inner()) = w;
}

/// The canvas width of a figure, in drawing units.
fn canvas_width() -> u32 {
    let w = *WIDTH.lock().unwrap_or_else(|e| e.into_inner());
    (w.inches() * f64::from(PDF_DPI)).round() as u32
}

/// A chart's canvas: the printed width, two thirds as tall.
fn chart_size() -> (u32, u32) {
    let w = canvas_width();
    (w, w * 2 / 3)
}

/// Converts the SVG at `svg` into a vector PDF at `pdf` (atomically), with the embedded DejaVu
/// fonts subset into it, its page `PDF_DPI` pixels to the inch.
pub fn svg_to_pdf(svg: &Path, pdf: &Path) -> Result<()> {
    use svg2pdf::usvg;
    static DB: std::sync::OnceLock<std::sync::Arc<usvg::fontdb::Database>> = std::sync::OnceLock::new();
    let db = DB.get_or_init(|| {
        let mut db = usvg::fontdb::Database::new();
        db.load_font_data(dejavu::sans::regular().to_vec());
        db.load_font_data(dejavu::sans::bold().to_vec());
        db.set_sans_serif_family("DejaVu Sans");
        std::sync::Arc::new(db)
    });
    let options = usvg::Options { font_family: "DejaVu Sans".into(), fontdb: db.clone(), ..Default::default() };
    let text = std::fs::read_to_string(svg).map_err(|e| anyhow!("reading {}: {e}", svg.display()))?;
    let tree = usvg::Tree::from_str(&text, &options).map_err(|e| anyhow!("{}: {e}", svg.display()))?;
    let bytes = svg2pdf::to_pdf(&tree, svg2pdf::ConversionOptions::default(), svg2pdf::PageOptions { dpi: PDF_DPI })
        .map_err(|e| anyhow!("{}: converting to PDF: {e}", svg.display()))?;
    crate::run_dir::atomic_write(pdf, &bytes)
}

/// Renders `$draw(&root, args…)` into `<out_base>.png` and `<out_base>.svg` of `size` pixels (one
/// drawing function serves both backends) and `<out_base>.pdf` from the SVG drawing, each as
/// [`set_formats`] asks, and evaluates to `Ok(paths written)`.
macro_rules! render_png_and_svg {
    ($out_base:expr, $size:expr, $draw:ident($($arg:expr),*)) => {{
        register_fonts();
        let out_base: &Path = $out_base;
        let want = formats();
        let (png, svg, pdf) =
            (out_base.with_extension("png"), out_base.with_extension("svg"), out_base.with_extension("pdf"));
        let mut written = Vec::new();
        // Each file drawn into a temporary file and renamed into place: a full disk or a crash
        // leaves the previous figure, never a truncated one.
        if want.png {
            crate::run_dir::atomic_write_with(&png, |p| {
                let root = BitMapBackend::new(p, $size).into_drawing_area();
                $draw(&root, $($arg),*)?;
                root.present().map_err(|e| anyhow!("{e}"))
            })?;
            written.push(png);
        }
        if want.svg || want.pdf {
            crate::run_dir::atomic_write_with(&svg, |p| {
                let root = SVGBackend::new(p, $size).into_drawing_area();
                $draw(&root, $($arg),*)?;
                root.present().map_err(|e| anyhow!("{e}"))
            })?;
            if want.pdf {
                svg_to_pdf(&svg, &pdf)?;
            }
            if want.svg {
                written.push(svg);
            } else {
                std::fs::remove_file(&svg).map_err(|e| anyhow!("removing {}: {e}", svg.display()))?;
            }
            if want.pdf {
                written.push(pdf);
            }
        }
        Ok(written)
    }};
}

/// Draws `chart` to `<out_base>.png`, `.svg` and `.pdf` (as [`set_formats`] asks) at the printed
/// width ([`set_width`]), two thirds as tall; returns the paths written.
pub fn line_chart(chart: &LineChart, out_base: &Path) -> Result<Vec<PathBuf>> {
    render_png_and_svg!(out_base, chart_size(), draw_lines(chart))
}

fn draw_lines<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &LineChart) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let (title, title_size) = fit_title(&chart.title, root.dim_in_pixel().0, TITLE_PT);
    let mut all: Vec<(f64, f64)> = chart.series.iter().flat_map(|s| s.points.iter().cloned()).collect();
    anyhow::ensure!(!all.is_empty(), "nothing to plot: no data points");
    for s in &chart.series {
        for (&(x, _), &(lo, hi)) in s.points.iter().zip(s.band.iter().flatten()) {
            all.extend([(x, lo), (x, hi)]);
        }
    }
    let x_max = all.iter().map(|p| p.0).fold(f64::MIN, f64::max).max(1.0);
    let x_min = all.iter().map(|p| p.0).fold(f64::MAX, f64::min).min(0.0);
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(&title, ("sans-serif", title_size))
        .margin(pt(6.0))
        .margin_right(pt(14.0))
        .x_label_area_size(pt(26.0))
        .y_label_area_size(pt(38.0));
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
            .label_style(("sans-serif", font(TICK_PT)))
            .axis_desc_style(("sans-serif", font(AXIS_PT)))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0e}"))
            .draw()
            .map_err(err)?;
        for (i, s) in chart.series.iter().enumerate() {
            let color = s.color.unwrap_or(PALETTE[i % PALETTE.len()]);
            let clamp = |y: f64| if y > 0.0 { y } else { floor };
            if let Some(poly) = band_polygon(s, clamp) {
                ctx.draw_series(std::iter::once(Polygon::new(poly, color.mix(0.2).filled()))).map_err(err)?;
            }
            let pts = s.points.iter().map(|&(x, y)| (x, if y > 0.0 { y } else { floor }));
            ctx.draw_series(LineSeries::new(pts, color.stroke_width(pt(LINE_PT))))
                .map_err(err)?
                .label(&s.label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + pt(12.0) as i32, y)], color.stroke_width(pt(LINE_PT)))
                });
        }
        let corner = legend_corner(chart, floor, hi * 2.0, |v| v.max(floor).ln());
        legend(&mut ctx, corner).map_err(err)?;
    } else {
        let lo = all.iter().map(|p| p.1).fold(f64::MAX, f64::min);
        let hi = all.iter().map(|p| p.1).fold(f64::MIN, f64::max);
        let pad = ((hi - lo) * 0.05).max(1e-12);
        let mut ctx = builder.build_cartesian_2d(x_min..x_max, (lo - pad)..(hi + pad)).map_err(err)?;
        ctx.configure_mesh()
            .x_desc(&chart.x_label)
            .y_desc(&chart.y_label)
            .label_style(("sans-serif", font(TICK_PT)))
            .axis_desc_style(("sans-serif", font(AXIS_PT)))
            .x_label_formatter(&|v| tick(*v))
            .draw()
            .map_err(err)?;
        for (i, s) in chart.series.iter().enumerate() {
            let color = s.color.unwrap_or(PALETTE[i % PALETTE.len()]);
            if let Some(poly) = band_polygon(s, |y| y) {
                ctx.draw_series(std::iter::once(Polygon::new(poly, color.mix(0.2).filled()))).map_err(err)?;
            }
            ctx.draw_series(LineSeries::new(s.points.iter().cloned(), color.stroke_width(pt(LINE_PT))))
                .map_err(err)?
                .label(&s.label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + pt(12.0) as i32, y)], color.stroke_width(pt(LINE_PT)))
                });
        }
        legend(&mut ctx, legend_corner(chart, lo - pad, hi + pad, |v| v)).map_err(err)?;
    }
    Ok(())
}

/// The outline of a series' band: along the upper edge, back along the lower one.
fn band_polygon(s: &Series, y: impl Fn(f64) -> f64) -> Option<Vec<(f64, f64)>> {
    let band = s.band.as_ref().filter(|b| b.len() == s.points.len() && b.len() > 1)?;
    let upper = s.points.iter().zip(band).map(|(&(x, _), &(_, hi))| (x, y(hi)));
    let lower = s.points.iter().zip(band).rev().map(|(&(x, _), &(lo, _))| (x, y(lo)));
    Some(upper.chain(lower).collect())
}

/// Where the legend hides the least: the right corner (upper or lower) whose box — the right 45 %
/// of the width, the top or bottom 30 % of the height — holds fewer of the curves' points; upper
/// on a tie. `y` maps a value to the axis (identity, or log for log axes).
fn legend_corner(chart: &LineChart, lo: f64, hi: f64, y: impl Fn(f64) -> f64) -> SeriesLabelPosition {
    let xs = || chart.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (x_min, x_max) = (xs().fold(f64::MAX, f64::min), xs().fold(f64::MIN, f64::max));
    let right = x_max - 0.45 * (x_max - x_min);
    let (lo, hi) = (y(lo), y(hi));
    let (top, bottom) = (hi - 0.3 * (hi - lo), lo + 0.3 * (hi - lo));
    let tail = || chart.series.iter().flat_map(|s| s.points.iter()).filter(|p| p.0 >= right).map(|p| y(p.1));
    match tail().filter(|v| *v < bottom).count() < tail().filter(|v| *v > top).count() {
        true => SeriesLabelPosition::LowerRight,
        false => SeriesLabelPosition::UpperRight,
    }
}

fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    ctx: &mut ChartContext<'a, DB, CT>,
    corner: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    ctx.configure_series_labels()
        .position(corner)
        .label_font(("sans-serif", font(LEGEND_PT)))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

/// A matrix heatmap description: `values[r][c]`, drawn with row 0 at the top.
#[derive(Debug, Clone)]
pub struct Heatmap {
    pub title: String,
    pub values: ndarray::Array2<f64>,
    pub row_labels: Vec<String>,
    pub col_labels: Vec<String>,
    pub x_label: String,
    pub y_label: String,
    pub colorbar_label: String,
    /// Colour range; `None` uses the data's min and max.
    pub range: Option<(f64, f64)>,
    /// Print the value in each cell (small matrices).
    pub annotate: bool,
}

/// Draws `chart` with both axes logarithmic (growth laws read as slopes: O(L) is slope 1, O(L²)
/// slope 2), points marked, to `<out_base>.{png,svg}`. Non-positive values are dropped.
pub fn loglog_chart(chart: &LineChart, out_base: &Path) -> Result<Vec<PathBuf>> {
    render_png_and_svg!(out_base, chart_size(), draw_loglog(chart))
}

fn draw_loglog<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &LineChart) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let (title, title_size) = fit_title(&chart.title, root.dim_in_pixel().0, TITLE_PT);
    let all: Vec<(f64, f64)> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().cloned())
        .filter(|(x, y)| *x > 0.0 && *y > 0.0 && y.is_finite())
        .collect();
    anyhow::ensure!(!all.is_empty(), "nothing positive to plot on log-log axes");
    let fold = |f: fn(f64, f64) -> f64, init: f64, sel: fn(&(f64, f64)) -> f64| all.iter().map(sel).fold(init, f);
    let (x_lo, x_hi) = (fold(f64::min, f64::MAX, |p| p.0), fold(f64::max, f64::MIN, |p| p.0));
    let (y_lo, y_hi) = (fold(f64::min, f64::MAX, |p| p.1), fold(f64::max, f64::MIN, |p| p.1));
    let mut ctx = ChartBuilder::on(root)
        .caption(&title, ("sans-serif", title_size))
        .margin(pt(6.0))
        .margin_right(pt(14.0))
        .x_label_area_size(pt(26.0))
        .y_label_area_size(pt(38.0))
        .build_cartesian_2d((x_lo / 1.2..x_hi * 1.2).log_scale(), (y_lo / 1.5..y_hi * 1.5).log_scale())
        .map_err(err)?;
    ctx.configure_mesh()
        .x_desc(&chart.x_label)
        .y_desc(&chart.y_label)
        .label_style(("sans-serif", font(TICK_PT)))
        .axis_desc_style(("sans-serif", font(AXIS_PT)))
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(err)?;
    for (i, s) in chart.series.iter().enumerate() {
        let color = s.color.unwrap_or(PALETTE[i % PALETTE.len()]);
        let pts: Vec<(f64, f64)> = s.points.iter().cloned().filter(|(x, y)| *x > 0.0 && *y > 0.0).collect();
        ctx.draw_series(LineSeries::new(pts.clone(), color.stroke_width(pt(LINE_PT))))
            .map_err(err)?
            .label(&s.label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + pt(12.0) as i32, y)], color.stroke_width(pt(LINE_PT)))
            });
        ctx.draw_series(pts.into_iter().map(|p| Circle::new(p, pt(DOT_PT), color.filled()))).map_err(err)?;
    }
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", font(LEGEND_PT)))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// A tick label without trailing zeros: `50`, `0.1`, `2.5` (not `50.0`, `0.10`).
fn tick(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

/// Draws one or more heatmaps side by side (a grid of panels sharing one colour scale and one
/// colorbar) to `<out_base>.png` and `.svg`.
pub fn heatmaps(panels: &[Heatmap], title: &str, out_base: &Path) -> Result<Vec<PathBuf>> {
    anyhow::ensure!(!panels.is_empty(), "no heatmap to draw");
    let width = canvas_width();
    let (rows, cols) = panel_grid(width, panels.len());
    let panel = width.saturating_sub(COLORBAR) / cols;
    // Each row as tall as a panel is wide (square cells for a square matrix) plus its title and
    // labels, within 1.4–4.5 in.
    let row_height = (panel + pt(10.0)).clamp(pt(100.0), pt(324.0));
    let size = (width, row_height * rows + pt(16.0));
    render_png_and_svg!(out_base, size, draw_heatmaps(panels, title, (rows, cols)))
}

/// The colour bar's share of a heatmap figure's width (0.86 in).
const COLORBAR: u32 = 153;

/// Rows and columns of heatmap panels on a canvas `width` wide: side by side while each panel is
/// at least 1.1 in wide, else in rows (five snapshots of C in one column of a paper: 2 × 3).
fn panel_grid(width: u32, n: usize) -> (u32, u32) {
    let fit = (width.saturating_sub(COLORBAR) / pt(80.0)).max(1);
    let n = n.max(1) as u32;
    let cols = fit.min(n);
    (n.div_ceil(cols), cols)
}

fn viridis(t: f64) -> RGBColor {
    use plotters::style::colors::colormaps::{ColorMap, ViridisRGB};
    ViridisRGB.get_color(t.clamp(0.0, 1.0))
}

fn draw_heatmaps<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    panels: &[Heatmap],
    title: &str,
    grid: (u32, u32),
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let (lo, hi) = panels.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        let (a, b) = p.range.unwrap_or_else(|| {
            let v = p.values.iter().filter(|v| v.is_finite());
            v.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)))
        });
        (lo.min(a), hi.max(b))
    });
    let (lo, hi) = if hi > lo { (lo, hi) } else { (lo - 0.5, lo + 0.5) };
    let (title, title_size) = fit_title(title, root.dim_in_pixel().0, TITLE_PT);
    let area = root.titled(&title, ("sans-serif", title_size)).map_err(err)?;
    let (main, bar) = area.split_horizontally(area.dim_in_pixel().0.saturating_sub(COLORBAR));
    let (grid_rows, grid_cols) = (grid.0 as usize, grid.1 as usize);
    for (i, (p, panel_area)) in panels.iter().zip(main.split_evenly((grid_rows, grid_cols))).enumerate() {
        // Axis titles on the outer panels only: the left column's y, the bottom row's x.
        let (left, bottom) = (i % grid_cols == 0, i + grid_cols >= panels.len());
        let (rows, cols) = p.values.dim();
        // Numbers in the cells only where "0.00" fits one (with a margin), centred.
        let cell_width = f64::from(panel_area.dim_in_pixel().0.saturating_sub(pt(34.0))) / cols.max(1) as f64;
        let annotate = p.annotate && cell_width >= 1.15 * text_width("0.00", font(CELL_PT));
        let mut chart = ChartBuilder::on(&panel_area)
            .caption(&p.title, ("sans-serif", font(AXIS_PT)))
            .margin(pt(5.0))
            .x_label_area_size(pt(22.0))
            .y_label_area_size(pt(24.0))
            .build_cartesian_2d(0.0..cols as f64, rows as f64..0.0)
            .map_err(err)?;
        let (rl, cl) = (p.row_labels.clone(), p.col_labels.clone());
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(if bottom { p.x_label.as_str() } else { "" })
            .y_desc(if left { p.y_label.as_str() } else { "" })
            .x_labels(cols.min(if grid_cols > 2 { 5 } else { 12 }))
            .y_labels(rows.min(12))
            .x_label_formatter(&|v| cl.get(v.floor() as usize).cloned().unwrap_or_default())
            .y_label_formatter(&|v| rl.get(v.floor() as usize).cloned().unwrap_or_default())
            .label_style(("sans-serif", font(TICK_PT)))
            .axis_desc_style(("sans-serif", font(AXIS_PT)))
            .draw()
            .map_err(err)?;
        for (r, row) in p.values.rows().into_iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                let color = if v.is_finite() { viridis((v - lo) / (hi - lo)) } else { RGBColor(235, 235, 235) };
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(c as f64, r as f64), (c as f64 + 1.0, r as f64 + 1.0)],
                        color.filled(),
                    )))
                    .map_err(err)?;
                if annotate && v.is_finite() {
                    let t = (v - lo) / (hi - lo);
                    let ink = if t > 0.6 { BLACK } else { WHITE };
                    chart
                        .draw_series(std::iter::once(Text::new(
                            format!("{v:.2}"),
                            (c as f64 + 0.5, r as f64 + 0.5),
                            ("sans-serif", font(CELL_PT)).into_font().color(&ink).pos(
                                plotters::style::text_anchor::Pos::new(
                                    plotters::style::text_anchor::HPos::Center,
                                    plotters::style::text_anchor::VPos::Center,
                                ),
                            ),
                        )))
                        .map_err(err)?;
                }
            }
        }
    }
    // Colorbar, with as many tick labels as fit its height (one per 14 pt, 2 to 11).
    let ticks = ((bar.dim_in_pixel().1.saturating_sub(pt(48.0))) / pt(14.0)).clamp(2, 11) as usize;
    let mut cb = ChartBuilder::on(&bar)
        .margin_top(pt(22.0))
        .margin_bottom(pt(26.0))
        .margin_right(pt(2.0))
        .y_label_area_size(pt(44.0))
        .build_cartesian_2d(0.0..1.0, lo..hi)
        .map_err(err)?;
    cb.configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_desc(&panels[0].colorbar_label)
        .y_labels(ticks)
        .label_style(("sans-serif", font(TICK_PT)))
        .axis_desc_style(("sans-serif", font(AXIS_PT)))
        .y_label_formatter(&|v| format!("{v:.2}"))
        .draw()
        .map_err(err)?;
    let steps = 100;
    for i in 0..steps {
        let a = lo + (hi - lo) * i as f64 / steps as f64;
        let b = lo + (hi - lo) * (i + 1) as f64 / steps as f64;
        cb.draw_series(std::iter::once(Rectangle::new(
            [(0.0, a), (1.0, b)],
            viridis(i as f64 / steps as f64).filled(),
        )))
        .map_err(err)?;
    }
    Ok(())
}
