//! Figures with `plotters`, drawn once as SVG and written as SVG, PNG (rasterised from it by
//! `resvg`) and PDF (vector, converted from it by `svg2pdf`, its fonts embedded: what pdflatex's
//! `\includegraphics` takes). Text uses the DejaVu Sans font embedded in the binary (the `dejavu`
//! crate), so figures render on machines without system fonts.

pub mod curves;
pub mod figures;
pub mod study;
#[cfg(test)]
mod tests;

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

/// How a curve's line is drawn: several settings of one topology share its colour (in lighter
/// shades) and are told apart by the line, as matplotlib's `'-'`, `'--'`, `':'`, `'-.'` would.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dash {
    #[default]
    Solid,
    Dashed,
    Dotted,
    LongDash,
}

impl Dash {
    /// The line of a topology's `variant`-th setting in one figure (0: solid, then dashed,
    /// dotted, long dashes, and round again).
    pub fn of_variant(variant: usize) -> Dash {
        [Dash::Solid, Dash::Dashed, Dash::Dotted, Dash::LongDash][variant % 4]
    }

    /// `(dash, gap)` in points; `None` for a solid line.
    fn pattern(self) -> Option<(f64, f64)> {
        match self {
            Dash::Solid => None,
            Dash::Dashed => Some((4.0, 2.0)),
            Dash::Dotted => Some((1.2, 1.6)),
            Dash::LongDash => Some((8.0, 2.5)),
        }
    }
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
    /// The line's pattern (solid unless several settings share a colour).
    pub dash: Dash,
}

/// The colour of a topology, the same in every figure: residual blue, ACN orange, H-ACN green,
/// ANCRe red, … Several settings of one topology (`variant` = 0, 1, 2, …) get lighter shades of
/// it, and lines of their own pattern ([`Dash::of_variant`]).
pub fn topology_color(kind: &str, variant: usize) -> RGBColor {
    // Each topology declares its colour in its registry entry.
    let base =
        crate::topology::entry(kind).map_or(RGBColor(90, 90, 160), |e| RGBColor(e.color.0, e.color.1, e.color.2));
    // Lighter by setting, but never so light that the line fades into the grid; the line
    // pattern ([`Dash::of_variant`]) tells the settings apart.
    let t = [0.0, 0.3, 0.45, 0.55][variant.min(3)];
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
    /// The width in inches: a single column 3.25, a double column 6.75, else as given.
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

/// How a figure is written: its printed width and the files it is written to (`--width` and
/// `--formats` of `plot` and `report`, or a study spec's `report:` section). Every figure function
/// takes one, so that what one command asked for never reaches another's figures (a sweep's report
/// and the figures of the runs it trained, say).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Style {
    pub width: Width,
    pub formats: Formats,
}

impl Default for Style {
    /// A double-column figure (6.75 in) in PNG, SVG and PDF.
    fn default() -> Self {
        Style { width: Width::Double, formats: Formats::ALL }
    }
}

impl Style {
    /// Parses `--formats` (e.g. `png,pdf`) and `--width` (`single`, `double` or inches).
    pub fn parse(formats: &str, width: &str) -> Result<Style> {
        Ok(Style { width: Width::parse(width)?, formats: Formats::parse(formats)? })
    }

    /// The canvas width of a figure, in drawing units.
    fn canvas_width(&self) -> u32 {
        (self.width.inches() * f64::from(PDF_DPI)).round() as u32
    }

    /// A chart's canvas: the printed width, two thirds as tall.
    fn chart_size(&self) -> (u32, u32) {
        let w = self.canvas_width();
        (w, w * 2 / 3)
    }
}

/// An SVG drawing parsed as usvg lays it out: text shaped (kerning included) with the embedded
/// DejaVu Sans, the family plotters' `sans-serif` is mapped to.
fn svg_tree(svg: &str, origin: &Path) -> Result<svg2pdf::usvg::Tree> {
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
    usvg::Tree::from_str(svg, &options).map_err(|e| anyhow!("{}: {e}", origin.display()))
}

/// The SVG drawing (parsed: [`svg_tree`]) as a vector PDF, its fonts subset into it, its page `PDF_DPI` pixels to
/// the inch (what pdflatex's `\includegraphics` takes).
fn svg_to_pdf(tree: &svg2pdf::usvg::Tree, origin: &Path) -> Result<Vec<u8>> {
    svg2pdf::to_pdf(tree, svg2pdf::ConversionOptions::default(), svg2pdf::PageOptions { dpi: PDF_DPI })
        .map_err(|e| anyhow!("{}: converting to PDF: {e}", origin.display()))
}

/// The SVG drawing (parsed: [`svg_tree`]) rasterised by resvg into PNG bytes of `size` pixels: the PNG is the SVG
/// as drawn, its text placed by the same shaping (plotters' own bitmap text drops each glyph's
/// left side bearing, so kerned pairs such as the "Tr" of "Training" overprint).
fn svg_to_png(tree: &svg2pdf::usvg::Tree, (w, h): (u32, u32), origin: &Path) -> Result<Vec<u8>> {
    let mut pixmap = resvg::tiny_skia::Pixmap::new(w, h).ok_or_else(|| anyhow!("a canvas of {w}×{h} pixels"))?;
    resvg::render(tree, resvg::tiny_skia::Transform::identity(), &mut pixmap.as_mut());
    pixmap.encode_png().map_err(|e| anyhow!("{}: encoding the PNG: {e}", origin.display()))
}

/// Renders `$draw(&root, args…)` once, as an SVG drawing of `size` pixels, and writes from it
/// `<out_base>.png` (rasterised), `.svg` and `.pdf` (vector), each as `$style`'s formats ask;
/// evaluates to `Ok(paths written)`. One drawing serves every format, so what the layout test
/// checks in the SVG is what the PNG shows.
macro_rules! render_png_and_svg {
    ($out_base:expr, $style:expr, $size:expr, $draw:ident($($arg:expr),*)) => {{
        register_fonts();
        let out_base: &Path = $out_base;
        let want = $style.formats;
        let (png, svg, pdf) =
            (out_base.with_extension("png"), out_base.with_extension("svg"), out_base.with_extension("pdf"));
        let mut drawing = String::new();
        {
            let root = SVGBackend::with_string(&mut drawing, $size).into_drawing_area();
            $draw(&root, $($arg),*)?;
            root.present().map_err(|e| anyhow!("{e}"))?;
        }
        // Each file written to a temporary file and renamed into place: a full disk or a crash
        // leaves the previous figure, never a truncated one.
        let mut written = Vec::new();
        // Parsed (text shaped) once for the PNG and the PDF.
        let tree = if want.png || want.pdf { Some(svg_tree(&drawing, &svg)?) } else { None };
        if let (true, Some(tree)) = (want.png, &tree) {
            crate::run_dir::atomic_write(&png, &svg_to_png(tree, $size, &png)?)?;
            written.push(png);
        }
        if want.svg {
            crate::run_dir::atomic_write(&svg, drawing.as_bytes())?;
            written.push(svg);
        }
        if let (true, Some(tree)) = (want.pdf, &tree) {
            crate::run_dir::atomic_write(&pdf, &svg_to_pdf(tree, &pdf)?)?;
            written.push(pdf);
        }
        Ok(written)
    }};
}

/// Whether a loss is drawn on a log axis: every value positive, the largest more than 20 times
/// the smallest (1.3 decades). One rule for `plexus plot` and `plexus report`, so that the same
/// runs' loss has one scale in both.
pub fn spans_decades(values: impl Iterator<Item = f64>) -> bool {
    let (lo, hi) =
        values.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    lo > 0.0 && hi / lo > 20.0
}

/// Draws `chart` to `<out_base>.png`, `.svg` and `.pdf` (as `style`'s formats ask) at `style`'s
/// printed width, two thirds as tall; returns the paths written.
pub fn line_chart(chart: &LineChart, style: &Style, out_base: &Path) -> Result<Vec<PathBuf>> {
    render_png_and_svg!(out_base, style, style.chart_size(), draw_xy(chart, false))
}

/// Draws `chart` with both axes logarithmic (growth laws read as slopes: O(L) is slope 1, O(L²)
/// slope 2), points marked, to `<out_base>.{png,svg,pdf}`. Non-positive values are dropped.
pub fn loglog_chart(chart: &LineChart, style: &Style, out_base: &Path) -> Result<Vec<PathBuf>> {
    let chart = LineChart { log_y: true, ..chart.clone() };
    render_png_and_svg!(out_base, style, style.chart_size(), draw_xy(&chart, true))
}

/// An axis as drawn: its range and ticks in drawing space (log10 of the value on a log axis, so
/// that one linear coordinate serves linear and log axes alike), and each tick's label.
#[derive(Debug, Clone)]
pub struct Axis {
    pub log: bool,
    pub lo: f64,
    pub hi: f64,
    pub ticks: Vec<(f64, String)>,
}

impl Axis {
    /// A value in drawing space.
    fn at(&self, v: f64) -> f64 {
        if self.log {
            v.log10()
        } else {
            v
        }
    }

    /// The label of the tick at `v` (drawing space); plotters asks for each key point.
    fn label(&self, v: f64) -> String {
        let eps = 1e-9 * (self.hi - self.lo).abs().max(f64::MIN_POSITIVE);
        self.ticks.iter().find(|(t, _)| (t - v).abs() <= eps).map(|t| t.1.clone()).unwrap_or_default()
    }

    fn points(&self) -> Vec<f64> {
        self.ticks.iter().map(|t| t.0).collect()
    }
}

/// A linear axis over the data `lo..hi`, widened by `pad` of the span on each side, with at most
/// `max_ticks` ticks at steps of 1, 2, 2.5 or 5 × 10^k, labelled with the decimals the step needs
/// (`70`, not `70.0`; `0.25`; `20k` from 10⁴ on).
pub fn linear_axis(lo: f64, hi: f64, pad: f64, max_ticks: usize) -> Axis {
    let (lo, hi) = widen_flat(lo, hi);
    let span = hi - lo;
    let (lo, hi) = (lo - pad * span, hi + pad * span);
    let raw = (hi - lo) / (max_ticks.max(2) - 1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let (m, step) =
        [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| (*m, m * mag)).find(|(_, s)| *s >= raw * (1.0 - 1e-9)).unwrap();
    ticked_axis(lo, hi, m, step)
}

/// A range of one value widened to show it: ±10 % of it (±1 around 0).
fn widen_flat(lo: f64, hi: f64) -> (f64, f64) {
    match hi > lo {
        true => (lo, hi),
        false => {
            let d = if lo == 0.0 { 1.0 } else { 0.1 * lo.abs() };
            (lo - d, hi + d)
        }
    }
}

/// A linear axis for values: like [`linear_axis`], but its ends are ticks that enclose the data
/// `lo..hi` (padded by `pad` of the span, and not below 0 for data that are not), as matplotlib's
/// round-number limits, so that no value lies beyond the labelled range; 3 to `max_ticks` ticks.
/// Accuracies of 8 to 53 % get 0, 20, 40, 60, not 20 and 40 alone.
pub fn enclosing_axis(lo: f64, hi: f64, pad: f64, max_ticks: usize) -> Axis {
    let (lo, hi) = widen_flat(lo, hi);
    let span = hi - lo;
    let floor = if lo >= 0.0 { 0.0 } else { f64::NEG_INFINITY };
    let (lo, hi) = ((lo - pad * span).max(floor), hi + pad * span);
    let max_ticks = max_ticks.max(3);
    let mag = 10f64.powf(((hi - lo) / (max_ticks - 1) as f64).log10().floor());
    // Within a millionth of a step of a tick is at it (a quotient's rounding, not the data).
    let ends = |step: f64| ((lo / step + 1e-6).floor(), (hi / step - 1e-6).ceil());
    let (m, step) = [mag, 10.0 * mag]
        .iter()
        .flat_map(|e| [1.0, 2.0, 2.5, 5.0].map(|m| (m, m * e)))
        .find(|&(_, step)| {
            let (a, b) = ends(step);
            b - a < max_ticks as f64
        })
        .unwrap_or((1.0, 100.0 * mag));
    let (a, b) = ends(step);
    ticked_axis(a * step, b * step, m, step)
}

/// The linear axis over `lo..hi` ticked at the multiples of `step` (`m` × 10^k) inside it.
fn ticked_axis(lo: f64, hi: f64, m: f64, step: f64) -> Axis {
    // Thousands as k and millions as M: `250k` reads where `250000` crowds its neighbours.
    let top = lo.abs().max(hi.abs());
    let (unit, suffix) = match () {
        _ if top >= 1e6 && step >= 1e5 => (1e6, "M"),
        _ if top >= 1e4 && step >= 1e3 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let k = (step / unit).log10().floor() as i32;
    let decimals = (-k).max(0) as usize + usize::from(m == 2.5);
    // Within a millionth of a step: an end that is a tick (`enclosing_axis`) keeps its label.
    let (first, last) = ((lo / step - 1e-6).ceil() as i64, (hi / step + 1e-6).floor() as i64);
    let ticks = (first..=last)
        .map(|i| {
            let v = i as f64 * step;
            let s = format!("{:.decimals$}", v / unit);
            // No "-0" (nor "-0.0").
            let s =
                if s.starts_with('-') && s[1..].chars().all(|c| c == '0' || c == '.') { s[1..].to_string() } else { s };
            (v, format!("{s}{suffix}"))
        })
        .collect();
    Axis { log: false, lo, hi, ticks }
}

/// Digits as superscripts: `-3` → `⁻³`.
fn superscript(n: i32) -> String {
    n.to_string()
        .chars()
        .map(|c| match c {
            '-' => '⁻',
            d => ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'][d.to_digit(10).unwrap_or(0) as usize],
        })
        .collect()
}

/// A log axis over the positive data `lo..hi` (padded by 4 % of its decades), ticked at whole
/// decades where it spans several (every 2nd, 3rd, … so that at most `max_ticks` remain), else at
/// 1, 2, 5 × 10^k or at every digit, whichever gives three or more. Labels are plain numbers while
/// every tick lies in 10⁻³–10⁴ (`0.5`, `2`, `1000`), else powers of ten (`10⁻³`, `2×10⁻⁵`).
pub fn log_axis(lo: f64, hi: f64, max_ticks: usize) -> Axis {
    let (a, b) = (lo.log10(), hi.log10());
    let (a, b) = if b - a < 1e-9 { (a - 0.15, b + 0.15) } else { (a, b) };
    let pad = 0.04 * (b - a);
    let (a, b) = (a - pad, b + pad);
    let decades: Vec<i32> = ((a - 1e-9).ceil() as i32..=(b + 1e-9).floor() as i32).collect();
    let inside = |mantissas: &[f64]| -> Vec<f64> {
        (a.floor() as i32..=b.ceil() as i32)
            .flat_map(|d| mantissas.iter().map(move |m| m * 10f64.powi(d)))
            .filter(|v| (a - 1e-9..=b + 1e-9).contains(&v.log10()))
            .collect()
    };
    let mut values: Vec<f64> = if decades.len() >= 3 {
        let stride = [1, 2, 3, 5, 10, 20].into_iter().find(|s| decades.len().div_ceil(*s) <= max_ticks).unwrap_or(50);
        decades.iter().filter(|d| d.rem_euclid(stride as i32) == 0).map(|d| 10f64.powi(*d)).collect()
    } else {
        let sets: [&[f64]; 3] =
            [&[1.0, 2.0, 5.0], &[1.0, 2.0, 3.0, 5.0], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]];
        sets.iter().map(|s| inside(s)).find(|v| v.len() >= 3).unwrap_or_else(|| inside(sets[2]))
    };
    while values.len() > max_ticks {
        values = values.into_iter().step_by(2).collect();
    }
    Axis { log: true, lo: a, hi: b, ticks: log_labels(values) }
}

/// A log axis for values: [`log_axis`]'s ticks, continued in their own pattern (the same decade
/// stride, or the same mantissas) until they enclose the data `lo..hi`, the axis ending at its
/// first and last ticks, so that no value lies below the lowest label (a loss of 0.15 under a
/// lowest tick of 0.5).
pub fn enclosing_log_axis(lo: f64, hi: f64, max_ticks: usize) -> Axis {
    let axis = log_axis(lo, hi, max_ticks);
    let mut values: Vec<f64> = axis.ticks.iter().map(|t| 10f64.powf(t.0)).collect();
    // A range too narrow for two of log_axis's ticks (0.03 decades): 1, 2, 5 × 10^k from the one
    // at or below it.
    let pattern = if values.len() < 2 { vec![1.0, 2.0, 5.0] } else { values.clone() };
    if values.len() < 2 {
        values = vec![next_log_tick(&pattern, lo * (1.0 + 1e-9), false)];
    }
    let (mut first, mut last) = (values[0], values[values.len() - 1]);
    while first > lo * (1.0 + 1e-9) {
        first = next_log_tick(&pattern, first, false);
        values.insert(0, first);
    }
    while last < hi * (1.0 - 1e-9) {
        last = next_log_tick(&pattern, last, true);
        values.push(last);
    }
    Axis { log: true, lo: first.log10(), hi: last.log10(), ticks: log_labels(values) }
}

/// The tick after `v` (above it with `up`, else below) in the pattern of `ticks`: their decade
/// stride where every tick is a power of ten (and there are two), else the smallest of
/// [`log_axis`]'s mantissa sets (1, 2, 5; 1, 2, 3, 5; every digit) that holds every tick's
/// mantissa, in every decade (`1, 2, 5` → … 0.5, 1, 2, 5, 10 …).
fn next_log_tick(ticks: &[f64], v: f64, up: bool) -> f64 {
    let is_decade = |t: f64| (t.log10() - t.log10().round()).abs() < 1e-9;
    if ticks.len() >= 2 && ticks.iter().all(|t| is_decade(*t)) {
        let stride = 10f64.powf((ticks[1].log10() - ticks[0].log10()).round());
        return if up { v * stride } else { v / stride };
    }
    let mantissa = |t: &f64| (t / 10f64.powi(t.log10().floor() as i32)).round();
    let sets: [&[f64]; 3] = [&[1.0, 2.0, 5.0], &[1.0, 2.0, 3.0, 5.0], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]];
    let set = sets.into_iter().find(|set| ticks.iter().all(|t| set.contains(&mantissa(t)))).unwrap_or(sets[2]);
    let d = v.log10().floor() as i32;
    let near = (d - 1..=d + 1).flat_map(|e| set.iter().map(move |m| m * 10f64.powi(e)));
    match up {
        true => near.filter(|t| *t > v * (1.0 + 1e-9)).fold(f64::INFINITY, f64::min),
        false => near.filter(|t| *t < v * (1.0 - 1e-9)).fold(f64::NEG_INFINITY, f64::max),
    }
}

/// Each tick of a log axis at its position (log10 of the value) with its label: plain numbers
/// while every tick lies in 10⁻³–10⁴ (`0.5`, `2`, `1000`), else powers of ten (`10⁻³`, `2×10⁻⁵`).
fn log_labels(values: Vec<f64>) -> Vec<(f64, String)> {
    let plain = values.iter().all(|v| (1e-3..1e4).contains(v));
    values
        .into_iter()
        .map(|v| {
            let text = if plain {
                let s = format!("{v:.6}");
                s.trim_end_matches('0').trim_end_matches('.').to_string()
            } else {
                let e = v.log10().floor() as i32;
                let m = (v / 10f64.powi(e)).round() as i32;
                match m {
                    1 => format!("10{}", superscript(e)),
                    10 => format!("10{}", superscript(e + 1)),
                    m => format!("{m}×10{}", superscript(e)),
                }
            };
            (v.log10(), text)
        })
        .collect()
}

/// Light grey of the grid at the major ticks (no minor grid: a dense one prints as a grey band).
const GRID: RGBColor = RGBColor(222, 222, 222);

/// At most this many points in every series: each point is marked, not only joined.
const MARKED_UP_TO: usize = 20;

/// A legend entry: its text, colour and line pattern.
struct Entry<'a> {
    label: &'a str,
    color: RGBColor,
    dash: Dash,
}

/// Size of a legend of `entries` in drawing units: a frame around rows of (swatch, gap, text).
fn legend_size<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, entries: &[Entry]) -> (i32, i32) {
    let style: TextStyle = ("sans-serif", font(LEGEND_PT)).into();
    let text_w = entries.iter().map(|e| area.estimate_text_size(e.label, &style).map_or(0, |s| s.0)).max().unwrap_or(0);
    let row = pt(LEGEND_PT * 1.45) as i32;
    let w = pt(4.0) as i32 + pt(14.0) as i32 + pt(4.0) as i32 + text_w as i32 + pt(5.0) as i32;
    (w, row * entries.len() as i32 + pt(4.0) as i32)
}

/// Draws the legend with its top-left corner at `at` (drawing units of the root).
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[Entry],
    at: (i32, i32),
    markers: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (w, h) = legend_size(area, entries);
    let base = area.get_base_pixel();
    let (x0, y0) = (at.0 - base.0, at.1 - base.1);
    area.draw(&Rectangle::new([(x0, y0), (x0 + w, y0 + h)], WHITE.filled()))?;
    area.draw(&Rectangle::new([(x0, y0), (x0 + w, y0 + h)], RGBColor(200, 200, 200).stroke_width(1)))?;
    let row = pt(LEGEND_PT * 1.45) as i32;
    let thick = (pt(LINE_PT) as i32).max(1);
    for (i, e) in entries.iter().enumerate() {
        let cy = y0 + pt(2.0) as i32 + row * i as i32 + row / 2;
        let sx = x0 + pt(4.0) as i32;
        let sw = pt(14.0) as i32;
        // The swatch is thin filled bars, not a line: a check of the figure tells data lines from
        // it. A patterned line's swatch is its dashes.
        let (on, off) = e.dash.pattern().map_or((sw, 0), |(a, b)| ((pt(a) as i32).max(1), (pt(b) as i32).max(1)));
        let mut x = sx;
        while x < sx + sw {
            let end = (x + on).min(sx + sw);
            area.draw(&Rectangle::new([(x, cy - thick / 2), (end, cy - thick / 2 + thick)], e.color.filled()))?;
            x = end + off;
        }
        if markers {
            area.draw(&Circle::new((sx + sw / 2, cy), pt(DOT_PT), e.color.filled()))?;
        }
        let style =
            ("sans-serif", font(LEGEND_PT)).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Left,
                plotters::style::text_anchor::VPos::Center,
            ));
        area.draw(&Text::new(e.label.to_string(), (sx + sw + pt(4.0) as i32, cy), style))?;
    }
    Ok(())
}

/// Whether the segment `a`–`b` meets the rectangle `r` = (x0, y0, x1, y1).
pub fn segment_hits_rect(a: (f64, f64), b: (f64, f64), r: (f64, f64, f64, f64)) -> bool {
    // Liang–Barsky: clip the segment's parameter range against each side.
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    for (p, q) in [(-dx, a.0 - r.0), (dx, r.2 - a.0), (-dy, a.1 - r.1), (dy, r.3 - a.1)] {
        if p == 0.0 {
            if q < 0.0 {
                return false;
            }
        } else {
            let t = q / p;
            if p < 0.0 {
                t0 = t0.max(t);
            } else {
                t1 = t1.min(t);
            }
            if t0 > t1 {
                return false;
            }
        }
    }
    true
}

/// A linear coordinate over `range` whose ticks (and grid lines) are exactly `keys`: plotters'
/// own picks its ticks itself, and its key-point wrapper does not format `f64` values.
#[derive(Debug, Clone)]
pub struct Ticked {
    pub range: std::ops::Range<f64>,
    pub keys: Vec<f64>,
}

impl Ticked {
    fn new(range: std::ops::Range<f64>, keys: Vec<f64>) -> Self {
        Self { range, keys }
    }
}

impl plotters::coord::ranged1d::Ranged for Ticked {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        // As plotters maps a linear range.
        let (a, b) = (self.range.start, self.range.end);
        if a == b {
            return (limit.1 - limit.0) / 2;
        }
        let t = (v - a) / (b - a);
        let len = f64::from(limit.1 - limit.0);
        match len >= 0.0 {
            true => limit.0 + (len * t + 1e-3).floor() as i32,
            false => limit.0 + (len * t - 1e-3).ceil() as i32,
        }
    }

    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // No light (minor) points: no minor grid.
        match hint.weight().allow_light_points() {
            true => Vec::new(),
            false => self.keys.clone(),
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

type Coord = Cartesian2d<Ticked, Ticked>;

fn xy_context<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    x: &Axis,
    y: &Axis,
    label_areas: (u32, u32),
) -> Result<ChartContext<'a, DB, Coord>, DrawingAreaErrorKind<DB::ErrorType>> {
    ChartBuilder::on(area)
        .margin(pt(4.0))
        .margin_right(pt(10.0))
        .x_label_area_size(label_areas.0)
        .y_label_area_size(label_areas.1)
        .build_cartesian_2d(Ticked::new(x.lo..x.hi, x.points()), Ticked::new(y.lo..y.hi, y.points()))
}

/// The axes, tick labels, titles and major grid every x–y figure shares (no minor grid).
fn draw_axes<DB: DrawingBackend>(
    ctx: &mut ChartContext<'_, DB, Coord>,
    (x, y): (&Axis, &Axis),
    (x_desc, y_desc): (&str, &str),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    ctx.configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style(("sans-serif", font(TICK_PT)))
        .axis_desc_style(("sans-serif", font(AXIS_PT)))
        .x_label_formatter(&|v| x.label(*v))
        .y_label_formatter(&|v| y.label(*v))
        .bold_line_style(GRID.stroke_width(1))
        .light_line_style(TRANSPARENT)
        .axis_style(BLACK.stroke_width(1))
        .set_all_tick_mark_size(pt(2.5))
        .draw()
}

/// Width and height of the widest of `labels` at tick size.
fn widest<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, labels: impl Iterator<Item = String>) -> (u32, u32) {
    let style: TextStyle = ("sans-serif", font(TICK_PT)).into();
    labels
        .map(|l| area.estimate_text_size(&l, &style).unwrap_or((0, 0)))
        .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)))
}

/// A pixel segment of drawn data, end to end.
type Segment = ((f64, f64), (f64, f64));

/// A range of values, `(lo, hi)`.
type Span = (f64, f64);

/// How a chart's values map to its axes: which points can be drawn, and where a value sits on
/// the y axis (a log axis draws exact zeros a decade below the smallest positive value).
struct Scales {
    log_x: bool,
    log_y: bool,
    floor: f64,
}

impl Scales {
    fn ok_x(&self, x: f64) -> bool {
        x.is_finite() && (!self.log_x || x > 0.0)
    }

    fn y_of(&self, v: f64) -> f64 {
        if self.log_y {
            v.max(self.floor)
        } else {
            v
        }
    }

    /// A series' drawable points in drawing space (`x`, `y` axes as drawn).
    fn drawn(&self, s: &Series, x: &Axis, y: &Axis) -> Vec<(f64, f64)> {
        s.points
            .iter()
            .filter(|p| self.ok_x(p.0) && p.1.is_finite())
            .map(|p| (x.at(p.0), y.at(self.y_of(p.1))))
            .collect()
    }

    /// A series' band outline in drawing space, if it has one.
    fn band(&self, s: &Series, x: &Axis, y: &Axis) -> Option<Vec<(f64, f64)>> {
        let poly = band_polygon(s, |v| y.at(self.y_of(v)))?;
        Some(poly.into_iter().filter(|p| self.ok_x(p.0)).map(|p| (x.at(p.0), p.1)).collect())
    }
}

/// The chart's scales and the ranges its axes must span: every finite point and band edge.
fn extent(chart: &LineChart, log_x: bool) -> Result<(Scales, Span, Span)> {
    let mut scales = Scales { log_x, log_y: chart.log_y, floor: f64::NAN };
    let mut all: Vec<(f64, f64)> = Vec::new();
    for s in &chart.series {
        all.extend(s.points.iter().cloned().filter(|p| scales.ok_x(p.0) && p.1.is_finite()));
        for (&(x, _), &(lo, hi)) in s.points.iter().zip(s.band.iter().flatten()) {
            all.extend([(x, lo), (x, hi)].into_iter().filter(|p| scales.ok_x(p.0) && p.1.is_finite()));
        }
    }
    anyhow::ensure!(!all.is_empty(), "nothing to plot: no data points");
    let range = |v: &mut dyn Iterator<Item = f64>| v.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if chart.log_y {
        // Log axes need positive values: exact zeros (a loss converged to machine precision) are
        // drawn a decade below the smallest positive value, so they stay visible.
        let (lo, _) = range(&mut all.iter().map(|p| p.1).filter(|v| *v > 0.0));
        anyhow::ensure!(lo.is_finite() && lo < f64::MAX, "nothing positive to plot on a log axis");
        scales.floor = if all.iter().any(|p| p.1 <= 0.0) { lo / 10.0 } else { lo };
    }
    let x = range(&mut all.iter().map(|p| p.0));
    let y = range(&mut all.iter().map(|p| scales.y_of(p.1)));
    Ok((scales, x, y))
}

/// The x axis with as many ticks as fit their labels in `plot_w` with room between them (at most
/// 7, at least 2).
fn fitting_x_axis<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (lo, hi): (f64, f64),
    log_x: bool,
    pad: f64,
    plot_w: f64,
) -> Axis {
    let mut x = log_axis(1.0, 10.0, 2);
    for max in (2..=7).rev() {
        x = match log_x {
            true => log_axis(lo, hi, max),
            false => linear_axis(lo, hi, pad, max),
        };
        let (lw, _) = widest(area, x.ticks.iter().map(|t| t.1.clone()));
        if x.ticks.len() as f64 * (f64::from(lw) + f64::from(pt(10.0))) <= plot_w {
            break;
        }
    }
    x
}

/// Every line, marker cross and band edge of `chart` as pixel segments of `ctx`: what a legend
/// placed inside the plot must not touch.
fn data_segments<DB: DrawingBackend>(
    ctx: &ChartContext<'_, DB, Coord>,
    chart: &LineChart,
    (x, y, scales): (&Axis, &Axis, &Scales),
    markers: bool,
) -> Vec<Segment> {
    let px = |p: (f64, f64)| {
        let c = ctx.backend_coord(&p);
        (f64::from(c.0), f64::from(c.1))
    };
    let r = f64::from(pt(DOT_PT));
    let mut segments = Vec::new();
    for s in &chart.series {
        let pts: Vec<(f64, f64)> = scales.drawn(s, x, y).into_iter().map(px).collect();
        segments.extend(pts.windows(2).map(|w| (w[0], w[1])));
        if markers || pts.len() == 1 {
            // A point as the cross of its marker.
            segments
                .extend(pts.iter().flat_map(|p| [((p.0 - r, p.1), (p.0 + r, p.1)), ((p.0, p.1 - r), (p.0, p.1 + r))]));
        }
        if let Some(poly) = scales.band(s, x, y) {
            let poly: Vec<(f64, f64)> = poly.into_iter().map(px).collect();
            segments.extend(poly.windows(2).map(|w| (w[0], w[1])));
        }
    }
    segments
}

/// Where a `size` legend goes inside the plot area `(xr, yr)` (pixels): the first corner, then
/// edge middle, whose box touches none of `segments`; `None` where every place does.
fn legend_inside(
    (xr, yr): (std::ops::Range<i32>, std::ops::Range<i32>),
    (lw, lh): (i32, i32),
    segments: &[Segment],
) -> Option<(i32, i32)> {
    let inset = pt(4.0) as i32;
    let (l, rgt, t, b) = (xr.start + inset, xr.end - inset - lw, yr.start + inset, yr.end - inset - lh);
    let (cx, cy) = ((xr.start + xr.end - lw) / 2, (yr.start + yr.end - lh) / 2);
    let fits = lw <= xr.end - xr.start - 2 * inset && lh <= yr.end - yr.start - 2 * inset;
    [(rgt, t), (l, t), (rgt, b), (l, b), (cx, t), (cx, b), (rgt, cy), (l, cy)].into_iter().find(|&(x0, y0)| {
        let rect = (f64::from(x0) - 2.0, f64::from(y0) - 2.0, f64::from(x0 + lw) + 2.0, f64::from(y0 + lh) + 2.0);
        fits && !segments.iter().any(|(a, b)| segment_hits_rect(*a, *b, rect))
    })
}

/// The plot's area and the legend's top-left corner (`i32::MIN` for none): inside where it
/// fits, else to the right where it takes at most 40 % of the width, else below. A single line's
/// legend only where it fits inside (it names the topology of the line).
fn legend_layout<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    inside: Option<(i32, i32)>,
    series: usize,
    (lw, lh): (i32, i32),
) -> (DrawingArea<DB, Shift>, (i32, i32)) {
    let (w, h) = area.dim_in_pixel();
    match inside {
        Some(p) => (area.clone(), p),
        None if series <= 1 => (area.clone(), (i32::MIN, 0)),
        None if lw as u32 <= w * 2 / 5 => {
            let (left, right) = area.split_horizontally(w - lw as u32 - pt(4.0));
            let base = right.get_base_pixel();
            (left, (base.0, base.1 + pt(4.0) as i32))
        }
        None => {
            let (top, bottom) = area.split_vertically(h.saturating_sub(lh as u32 + pt(4.0)));
            let base = bottom.get_base_pixel();
            (top, (base.0 + (w as i32 - lw) / 2, base.1 + pt(2.0) as i32))
        }
    }
}

/// The bands (under every line), then the lines, dashed where a series asks, and their markers.
fn draw_lines<DB: DrawingBackend>(
    ctx: &mut ChartContext<'_, DB, Coord>,
    chart: &LineChart,
    (x, y, scales): (&Axis, &Axis, &Scales),
    markers: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for (i, s) in chart.series.iter().enumerate() {
        if let Some(poly) = scales.band(s, x, y) {
            ctx.draw_series(std::iter::once(Polygon::new(poly, series_color(i, s).mix(0.2).filled())))?;
        }
    }
    for (i, s) in chart.series.iter().enumerate() {
        let c = series_color(i, s);
        let pts = scales.drawn(s, x, y);
        let stroke = c.stroke_width(pt(LINE_PT));
        match s.dash.pattern() {
            None => ctx.draw_series(LineSeries::new(pts.clone(), stroke))?,
            Some((on, off)) => {
                ctx.draw_series(DashedLineSeries::new(pts.clone(), pt(on).max(1), pt(off).max(1), stroke))?
            }
        };
        if markers || pts.len() == 1 {
            ctx.draw_series(pts.into_iter().map(|p| Circle::new(p, pt(DOT_PT), c.filled())))?;
        }
    }
    Ok(())
}

/// A series' colour: its own, else the palette's by position.
fn series_color(i: usize, s: &Series) -> RGBColor {
    s.color.unwrap_or(PALETTE[i % PALETTE.len()])
}

/// Lines, log or linear axes: ticks from [`linear_axis`] / [`log_axis`], ranges fitted to the data,
/// points marked where series are short, the legend in the first corner (or edge) of the plot where
/// it covers no line, band edge or point, else outside the plot.
fn draw_xy<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &LineChart, log_x: bool) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let (title, title_size) = fit_title(&chart.title, root.dim_in_pixel().0, TITLE_PT);
    let (scales, x_range, (y_lo, y_hi)) = extent(chart, log_x)?;
    let markers = chart.series.iter().all(|s| s.points.len() <= MARKED_UP_TO);
    let y = match chart.log_y {
        true => enclosing_log_axis(y_lo, y_hi, 6),
        false => enclosing_axis(y_lo, y_hi, 0.0, 6),
    };
    let area = root.margin(pt(3.0), 0, 0, 0).titled(&title, ("sans-serif", title_size)).map_err(err)?;
    let y_w = widest(&area, y.ticks.iter().map(|t| t.1.clone())).0;
    let axis_h = area.estimate_text_size("Mg", &("sans-serif", font(AXIS_PT)).into()).map_err(err)?.1;
    let y_area = y_w + axis_h + pt(10.0);
    let plot_w = area.dim_in_pixel().0.saturating_sub(y_area + pt(14.0)) as f64;
    let x = fitting_x_axis(&area, x_range, log_x, if markers { 0.03 } else { 0.0 }, plot_w);
    let x_area = widest(&area, x.ticks.iter().map(|t| t.1.clone())).1 + axis_h + pt(10.0);
    let entries: Vec<Entry> = chart
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| Entry { label: &s.label, color: series_color(i, s), dash: s.dash })
        .collect();
    let size = legend_size(&area, &entries);
    let inside = {
        let ctx = xy_context(&area, &x, &y, (x_area, y_area)).map_err(err)?;
        legend_inside(
            ctx.plotting_area().get_pixel_range(),
            size,
            &data_segments(&ctx, chart, (&x, &y, &scales), markers),
        )
    };
    let (plot_area, legend_at) = legend_layout(&area, inside, chart.series.len(), size);
    let mut ctx = xy_context(&plot_area, &x, &y, (x_area, y_area)).map_err(err)?;
    draw_axes(&mut ctx, (&x, &y), (&chart.x_label, &chart.y_label)).map_err(err)?;
    draw_lines(&mut ctx, chart, (&x, &y, &scales), markers).map_err(err)?;
    if legend_at.0 != i32::MIN {
        draw_legend(root, &entries, legend_at, markers).map_err(err)?;
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

/// Draws one or more heatmaps side by side (a grid of panels sharing one colour scale and one
/// colorbar) to `<out_base>.png` and `.svg`.
pub fn heatmaps(panels: &[Heatmap], title: &str, style: &Style, out_base: &Path) -> Result<Vec<PathBuf>> {
    anyhow::ensure!(!panels.is_empty(), "no heatmap to draw");
    let width = style.canvas_width();
    let (rows, cols) = panel_grid(width, panels.len());
    let panel = width.saturating_sub(COLORBAR) / cols;
    // Each row as tall as a panel is wide (square cells for a square matrix) plus its title and
    // labels, within 1.4–4.5 in.
    let row_height = (panel + pt(10.0)).clamp(pt(100.0), pt(324.0));
    // Tall enough for the colour bar's title, which runs along the bar beside every row: in a
    // single row of small panels (C over training at double width) it would leave the canvas.
    let colorbar_title = text_width(&panels[0].colorbar_label, font(AXIS_PT)) as u32;
    let size = (width, (row_height * rows + pt(16.0)).max(colorbar_title + pt(64.0)));
    render_png_and_svg!(out_base, style, size, draw_heatmaps(panels, title, (rows, cols)))
}

/// The colour bar's share of a heatmap figure's width (0.98 in).
const COLORBAR: u32 = 175;

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

/// The colour range every panel shares: the union of each panel's `range`, else its finite
/// values' min and max (a constant matrix gets a unit range around its value).
fn color_range(panels: &[Heatmap]) -> (f64, f64) {
    let (lo, hi) = panels.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        let (a, b) = p.range.unwrap_or_else(|| {
            let v = p.values.iter().filter(|v| v.is_finite());
            v.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)))
        });
        (lo.min(a), hi.max(b))
    });
    if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, lo + 0.5)
    }
}

/// How one heatmap panel is ticked: the tick size, the label areas (pixels), the nodes ticked on
/// each axis (cell centres) and the cell width.
struct PanelTicks {
    tick_pt: f64,
    x_area: u32,
    y_area: u32,
    x_keys: Vec<f64>,
    y_keys: Vec<f64>,
    cell_w: f64,
}

/// The columns ticked on cells `cell` wide with labels `widths` wide: from the last (the readout,
/// `out`, always ticked) leftwards, each whose label clears the previous one ticked by a tenth of
/// their widths — so a wide `out` beside narrow digits costs one tick, not every other one.
fn ticked_columns(cell: f64, widths: &[f64]) -> Vec<usize> {
    let cols = widths.len();
    let mut shown = vec![cols.saturating_sub(1)];
    for c in (0..cols.saturating_sub(1)).rev() {
        let last = *shown.last().expect("one");
        if (last - c) as f64 * cell >= 1.1 * (widths[c] + widths.get(last).copied().unwrap_or(0.0)) / 2.0 {
            shown.push(c);
        }
    }
    shown.reverse();
    shown
}

/// The ticks of panel `p` in `area`, with the axis titles on the outer panels only (`left`: the
/// left column's y, `bottom`: the bottom row's x); tick labels at 8 pt, or 7 pt where that puts
/// one on more nodes.
fn panel_ticks<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Heatmap,
    (left, bottom): (bool, bool),
    axis_h: u32,
) -> PanelTicks {
    let (rows, cols) = p.values.dim();
    let (pw, ph) = area.dim_in_pixel();
    let measure = |points: f64| {
        let style: TextStyle = ("sans-serif", font(points)).into();
        let size = |l: &String| area.estimate_text_size(l, &style).unwrap_or((0, 0));
        let row_w = p.row_labels.iter().map(|l| size(l).0).max().unwrap_or(0);
        let mut col_ws: Vec<f64> = p.col_labels.iter().map(|l| f64::from(size(l).0)).collect();
        col_ws.resize(cols, 0.0);
        let tick_h = p.col_labels.iter().chain(&p.row_labels).map(|l| size(l).1).max().unwrap_or(0);
        (row_w, col_ws, tick_h)
    };
    // The cells' width as in a panel of the left column (with the axis title), so that every
    // panel ticks the same nodes.
    let cell_of = |row_w: u32| f64::from(pw.saturating_sub(row_w + axis_h + pt(19.0))) / cols.max(1) as f64;
    let count_at = |points: f64| {
        let (row_w, col_ws, _) = measure(points);
        ticked_columns(cell_of(row_w), &col_ws).len()
    };
    let tick_pt = if count_at(TICK_PT - 1.0) > count_at(TICK_PT) { TICK_PT - 1.0 } else { TICK_PT };
    let (row_w, col_ws, tick_h) = measure(tick_pt);
    // Room for the tick labels, a gap and (outer panels) the axis title beside them.
    let y_area = row_w + pt(6.0) + if left { axis_h + pt(3.0) } else { 0 };
    let x_area = tick_h + pt(6.0) + if bottom { axis_h + pt(3.0) } else { 0 };
    let cell_w = cell_of(row_w);
    let cell_h = f64::from(ph.saturating_sub(x_area + pt(20.0))) / rows.max(1) as f64;
    let sy = (1..).find(|s| cell_h * *s as f64 >= 1.1 * f64::from(tick_h)).unwrap_or(1);
    PanelTicks {
        tick_pt,
        x_area,
        y_area,
        x_keys: ticked_columns(cell_w, &col_ws).into_iter().map(|c| c as f64 + 0.5).collect(),
        y_keys: (0..rows).step_by(sy).map(|r| r as f64 + 0.5).collect(),
        cell_w,
    }
}

/// One panel: its title, ticked axes, and each cell in the shared colour range `(lo, hi)` (grey
/// where not finite), its value printed where `annotate` asks and "0.00" fits a cell.
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Heatmap,
    outer: (bool, bool),
    (lo, hi): (f64, f64),
    axis_h: u32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (rows, cols) = p.values.dim();
    let t = panel_ticks(area, p, outer, axis_h);
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", font(AXIS_PT)))
        .margin(pt(4.0))
        .x_label_area_size(t.x_area)
        .y_label_area_size(t.y_area)
        .build_cartesian_2d(Ticked::new(0.0..cols as f64, t.x_keys), Ticked::new(rows as f64..0.0, t.y_keys))?;
    let (rl, cl) = (&p.row_labels, &p.col_labels);
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc(if outer.1 { p.x_label.as_str() } else { "" })
        .y_desc(if outer.0 { p.y_label.as_str() } else { "" })
        .x_label_formatter(&|v| cl.get(v.floor() as usize).cloned().unwrap_or_default())
        .y_label_formatter(&|v| rl.get(v.floor() as usize).cloned().unwrap_or_default())
        .label_style(("sans-serif", font(t.tick_pt)))
        .axis_desc_style(("sans-serif", font(AXIS_PT)))
        .set_all_tick_mark_size(pt(2.0))
        .draw()?;
    let annotate = p.annotate && t.cell_w >= 1.15 * text_width("0.00", font(CELL_PT));
    let centred = plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Center,
    );
    for ((r, c), v) in p.values.indexed_iter() {
        let (x, y) = (c as f64, r as f64);
        let color = if v.is_finite() { viridis((v - lo) / (hi - lo)) } else { RGBColor(235, 235, 235) };
        chart.draw_series(std::iter::once(Rectangle::new([(x, y), (x + 1.0, y + 1.0)], color.filled())))?;
        if annotate && v.is_finite() {
            let ink = if (v - lo) / (hi - lo) > 0.6 { BLACK } else { WHITE };
            let style = ("sans-serif", font(CELL_PT)).into_font().color(&ink).pos(centred);
            chart.draw_series(std::iter::once(Text::new(format!("{v:.2}"), (x + 0.5, y + 0.5), style)))?;
        }
    }
    Ok(())
}

/// The colour bar: its ticks and title on its right, as matplotlib draws one, ticked at nice
/// values (one per 24 pt of height at most).
fn draw_colorbar<DB: DrawingBackend>(
    bar: &DrawingArea<DB, Shift>,
    label: &str,
    (lo, hi): (f64, f64),
    axis_h: u32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let max_ticks = ((bar.dim_in_pixel().1.saturating_sub(pt(48.0))) / pt(24.0)).clamp(2, 8) as usize;
    let axis = linear_axis(lo, hi, 0.0, max_ticks);
    let label_w = widest(bar, axis.ticks.iter().map(|t| t.1.clone())).0;
    let mut cb = ChartBuilder::on(bar)
        .margin_top(pt(22.0))
        .margin_bottom(pt(26.0))
        .margin_left(pt(6.0))
        .margin_right(axis_h)
        .right_y_label_area_size(label_w + axis_h + pt(14.0))
        .build_cartesian_2d(Ticked::new(0.0..1.0, vec![]), Ticked::new(lo..hi, axis.points()))?;
    cb.configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_desc(label)
        .label_style(("sans-serif", font(TICK_PT)))
        .axis_desc_style(("sans-serif", font(AXIS_PT)))
        .y_label_formatter(&|v| axis.label(*v))
        .set_all_tick_mark_size(pt(2.0))
        .draw()?;
    let steps = 100;
    for i in 0..steps {
        let a = lo + (hi - lo) * i as f64 / steps as f64;
        let b = lo + (hi - lo) * (i + 1) as f64 / steps as f64;
        cb.draw_series(std::iter::once(Rectangle::new(
            [(0.0, a), (1.0, b)],
            viridis(i as f64 / steps as f64).filled(),
        )))?;
    }
    Ok(())
}

/// The panels in a `grid` (rows, columns) under the figure's title, then the shared colour bar.
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
    let range = color_range(panels);
    let (title, title_size) = fit_title(title, root.dim_in_pixel().0, TITLE_PT);
    let area = root.margin(pt(3.0), 0, 0, 0).titled(&title, ("sans-serif", title_size)).map_err(err)?;
    let (main, bar) = area.split_horizontally(area.dim_in_pixel().0.saturating_sub(COLORBAR));
    let (grid_rows, grid_cols) = (grid.0 as usize, grid.1 as usize);
    let axis_h = area.estimate_text_size("Mg", &("sans-serif", font(AXIS_PT)).into()).map_err(err)?.1;
    for (i, (p, panel_area)) in panels.iter().zip(main.split_evenly((grid_rows, grid_cols))).enumerate() {
        let outer = (i % grid_cols == 0, i + grid_cols >= panels.len());
        draw_panel(&panel_area, p, outer, range, axis_h).map_err(err)?;
    }
    draw_colorbar(&bar, &panels[0].colorbar_label, range, axis_h).map_err(err)
}

/// A topology's name as the papers print it (`hacn` → `H-ACN`), for legends; the registry
/// holds it, so a new topology brings its own. Any other name is shown as it is.
pub fn display_name(kind: &str) -> String {
    crate::topology::entry(kind).map_or(kind, |e| e.display).to_string()
}

/// The axis title of a logged quantity, with its unit: `loss` → `training loss (nats)` (the unit
/// given), `eval.accuracy` → `held-out accuracy (%)`, `gamma` → `Γ`, `fd.fd` → `Fréchet distance`,
/// …; a name it does not know
/// is shown as it is.
pub fn quantity(name: &str, loss_unit: &str) -> String {
    let (prefix, base) = match name.split_once('.') {
        Some((p, b)) => (p, b),
        None => ("", name),
    };
    let what = match prefix {
        "eval" => "held-out ",
        "layerwise" => "exit ",
        "noise" => "",
        _ => "",
    };
    match base {
        "loss" if prefix.is_empty() => format!("training loss{loss_unit}"),
        "loss" => format!("{what}loss{loss_unit}"),
        b if b.ends_with("accuracy") => format!("{what}accuracy (%)"),
        "perplexity" => format!("{what}perplexity"),
        "gamma" => "Γ".into(),
        "success" => "success rate".into(),
        "grad_norm" => "gradient norm".into(),
        "lr" => "learning rate".into(),
        // `plexus fd` at checkpoints: distances in the extractor's feature space, unitless.
        // Short enough for a single-column figure's axis.
        "fd" if prefix == "fd" => "Fréchet distance".into(),
        "real_floor" if prefix == "fd" => "real-vs-real distance".into(),
        "class_agreement" if prefix == "fd" => "class agreement".into(),
        // A summary number (`final_loss`, `decades_per_1k`) as the report's tables name it.
        _ => crate::study::names::metric(name),
    }
}

/// A claim's figure: each seed's value under arm A and arm B joined by a line (a slope chart, the
/// mean of each arm in black over them), and beside it each seed's difference with the mean's
/// interval, the line of no effect and the claim's margin where it has one.
#[derive(Debug, Clone)]
pub struct Paired {
    pub title: String,
    /// The metric, with its unit.
    pub y_label: String,
    /// How the arms are named under their columns.
    pub arms: [String; 2],
    pub colors: [RGBColor; 2],
    /// `(A, B)` on each seed.
    pub values: Vec<(f64, f64)>,
    /// Values and differences on log axes (a claim on a log scale: differences are ratios A/B).
    pub log: bool,
    pub diff_label: String,
    pub diffs: Vec<f64>,
    /// The interval of the mean difference (ratio on a log scale).
    pub interval: (f64, f64),
    /// The margins drawn on the differences (none, one or two).
    pub margin: Vec<f64>,
}

/// Draws a [`Paired`] figure to `<out_base>.{png,svg,pdf}` at the printed width.
pub fn paired_chart(c: &Paired, style: &Style, out_base: &Path) -> Result<Vec<PathBuf>> {
    render_png_and_svg!(out_base, style, style.chart_size(), draw_paired(c))
}

fn draw_paired<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &Paired) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let (title, title_size) = fit_title(&c.title, root.dim_in_pixel().0, TITLE_PT);
    let area = root.margin(pt(3.0), 0, 0, 0).titled(&title, ("sans-serif", title_size)).map_err(err)?;
    let (w, _) = area.dim_in_pixel();
    let (left, right) = area.split_horizontally(w * 3 / 5);
    let ok = |v: &f64| v.is_finite() && (!c.log || *v > 0.0);
    let span =
        |v: &mut dyn Iterator<Item = f64>| v.filter(ok).fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let axis =
        |(lo, hi): (f64, f64)| if c.log { enclosing_log_axis(lo, hi, 5) } else { enclosing_axis(lo, hi, 0.08, 6) };
    let (lo, hi) = span(&mut c.values.iter().flat_map(|v| [v.0, v.1]));
    anyhow::ensure!(lo <= hi, "nothing to plot: no paired values");
    let y = axis((lo, hi));
    let axis_h = area.estimate_text_size("Mg", &("sans-serif", font(AXIS_PT)).into()).map_err(err)?.1;
    // The arms' names under their columns where they fit half the panel, else A and B there and
    // the names in the axis title.
    let (names_w, tick_h) = widest(&left, c.arms.iter().cloned());
    let fits = f64::from(names_w) <= 0.42 * f64::from(left.dim_in_pixel().0);
    let (ticks, x_desc) = match fits {
        true => (c.arms.clone(), String::new()),
        false => (["A".to_string(), "B".to_string()], format!("A: {}, B: {}", c.arms[0], c.arms[1])),
    };
    let x = Axis { log: false, lo: -0.35, hi: 1.35, ticks: vec![(0.0, ticks[0].clone()), (1.0, ticks[1].clone())] };
    let y_area = widest(&left, y.ticks.iter().map(|t| t.1.clone())).0 + axis_h + pt(10.0);
    let x_area = tick_h + pt(8.0) + if x_desc.is_empty() { 0 } else { axis_h + pt(2.0) };
    let mut ctx = xy_context(&left, &x, &y, (x_area, y_area)).map_err(err)?;
    draw_axes(&mut ctx, (&x, &y), (&x_desc, &c.y_label)).map_err(err)?;
    let grey = RGBColor(170, 170, 170);
    let pairs: Vec<(f64, f64)> =
        c.values.iter().filter(|v| ok(&v.0) && ok(&v.1)).map(|v| (y.at(v.0), y.at(v.1))).collect();
    for &(a, b) in &pairs {
        ctx.draw_series(LineSeries::new([(0.0, a), (1.0, b)], grey.stroke_width(pt(0.8)))).map_err(err)?;
    }
    for (k, col) in c.colors.iter().enumerate() {
        ctx.draw_series(
            pairs.iter().map(|p| Circle::new((k as f64, if k == 0 { p.0 } else { p.1 }), pt(DOT_PT), col.filled())),
        )
        .map_err(err)?;
    }
    if !pairs.is_empty() {
        // The arms' means (of what is drawn: the geometric mean on a log axis).
        let n = pairs.len() as f64;
        let (ma, mb) = (pairs.iter().map(|p| p.0).sum::<f64>() / n, pairs.iter().map(|p| p.1).sum::<f64>() / n);
        ctx.draw_series(LineSeries::new([(0.0, ma), (1.0, mb)], BLACK.stroke_width(pt(LINE_PT * 1.5)))).map_err(err)?;
    }
    // The differences: each seed's, the mean's interval, no effect and the margins.
    let none = if c.log { 1.0 } else { 0.0 };
    let (dlo, dhi) =
        span(&mut c.diffs.iter().copied().chain([c.interval.0, c.interval.1, none]).chain(c.margin.iter().copied()));
    let dy = axis((dlo, dhi));
    let dx = Axis { log: false, lo: -1.0, hi: 1.0, ticks: vec![] };
    let dy_area = widest(&right, dy.ticks.iter().map(|t| t.1.clone())).0 + axis_h + pt(10.0);
    let mut dctx = xy_context(&right, &dx, &dy, (x_area, dy_area)).map_err(err)?;
    dctx.configure_mesh()
        .x_desc(&c.diff_label)
        .label_style(("sans-serif", font(TICK_PT)))
        .axis_desc_style(("sans-serif", font(AXIS_PT)))
        .y_label_formatter(&|v| dy.label(*v))
        .bold_line_style(GRID.stroke_width(1))
        .light_line_style(TRANSPARENT)
        .axis_style(BLACK.stroke_width(1))
        .set_all_tick_mark_size(pt(2.5))
        .draw()
        .map_err(err)?;
    dctx.draw_series(LineSeries::new([(-1.0, dy.at(none)), (1.0, dy.at(none))], BLACK.stroke_width(1))).map_err(err)?;
    for m in &c.margin {
        let red = RGBColor(214, 39, 40);
        dctx.draw_series(LineSeries::new([(-1.0, dy.at(*m)), (1.0, dy.at(*m))], red.stroke_width(pt(0.8))))
            .map_err(err)?;
        // Named at its right end, above the line.
        let style =
            ("sans-serif", font(LEGEND_PT)).into_font().color(&red).pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Right,
                plotters::style::text_anchor::VPos::Bottom,
            ));
        dctx.draw_series(std::iter::once(Text::new("margin", (0.97, dy.at(*m)), style))).map_err(err)?;
    }
    let n = c.diffs.len().max(2) as f64;
    dctx.draw_series(
        c.diffs.iter().enumerate().filter(|(_, d)| ok(d)).map(|(i, d)| {
            Circle::new((-0.8 + 0.9 * i as f64 / (n - 1.0), dy.at(*d)), pt(DOT_PT), grey.mix(0.9).filled())
        }),
    )
    .map_err(err)?;
    if ok(&c.interval.0) && ok(&c.interval.1) {
        let ink = BLACK.stroke_width(pt(LINE_PT * 1.5));
        dctx.draw_series(LineSeries::new([(0.55, dy.at(c.interval.0)), (0.55, dy.at(c.interval.1))], ink))
            .map_err(err)?;
        let mean: Vec<f64> = c.diffs.iter().copied().filter(ok).map(|d| dy.at(d)).collect();
        if !mean.is_empty() {
            let m = mean.iter().sum::<f64>() / mean.len() as f64;
            dctx.draw_series(std::iter::once(Circle::new((0.55, m), pt(DOT_PT * 1.4), BLACK.filled()))).map_err(err)?;
        }
    }
    Ok(())
}
