//! A figure's printed size and files: widths of a paper's column and text, text sizes in points,
//! the formats written.

use super::*;

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
pub(super) const TITLE_PT: f64 = 9.5;
pub(super) const AXIS_PT: f64 = 9.0;
pub(super) const TICK_PT: f64 = 8.0;
pub(super) const LEGEND_PT: f64 = 8.0;
/// Numbers printed in heatmap cells (small matrices only).
pub(super) const CELL_PT: f64 = 7.0;
/// Curves and legend swatches: 1.2 pt lines, 2 pt dots.
pub(super) const LINE_PT: f64 = 1.2;
pub(super) const DOT_PT: f64 = 2.0;

/// About how wide `text` is set in DejaVu Sans at plotters size `size`, in drawing units: digits
/// and most letters are 0.55–0.64 em wide, a point or a comma 0.32.
pub(super) fn text_width(text: &str, size: u32) -> f64 {
    let ems: f64 = text.chars().map(|c| if matches!(c, '.' | ',' | ' ') { 0.32 } else { 0.64 }).sum();
    ems * f64::from(size) / 1.24
}

/// A title set to fit `width` drawing units: on one line at `points`, else smaller down to 8 pt,
/// else broken at the word nearest its middle onto two lines (at the largest size down to 7 pt
/// where both fit), never cut. → (lines, plotters size).
pub(super) fn fit_title(title: &str, width: u32, points: f64) -> (Vec<String>, u32) {
    let room = f64::from(width) * 0.96;
    let fits = |s: &str, p: f64| text_width(s, font(p)) <= room;
    let mut p = points;
    while p > 8.0 && !fits(title, p) {
        p -= 0.5;
    }
    if fits(title, p) {
        return (vec![title.to_string()], font(p));
    }
    // The break that leaves the longer line shortest: after a comma or a colon where one such
    // break fits at 7 pt, else between any two words but never beside an `=` (`Γ` / `= ‖a‖₂`).
    let words: Vec<&str> = title.split(' ').collect();
    let halves: Vec<(String, String, bool)> = (1..words.len())
        .filter(|&k| words[k - 1] != "=" && words[k] != "=")
        .map(|k| (words[..k].join(" "), words[k..].join(" "), words[k - 1].ends_with([',', ':', ';'])))
        .collect();
    let longer = |h: &(String, String, bool)| text_width(&h.0, font(7.0)).max(text_width(&h.1, font(7.0)));
    let at_punctuation = halves.iter().any(|h| h.2 && longer(h) <= room);
    let best = halves.iter().filter(|h| h.2 || !at_punctuation).min_by(|x, y| longer(x).total_cmp(&longer(y)));
    let Some((a, b, _)) = best.cloned() else {
        return (vec![title.to_string()], font(7.0));
    };
    let mut p = points;
    while p > 7.0 && !(fits(&a, p) && fits(&b, p)) {
        p -= 0.5;
    }
    (vec![a, b], font(p))
}

/// The area under a title and the title as set.
pub(super) type Titled<DB> = (DrawingArea<DB, Shift>, String);

/// Draws `title` centred across the top of `root` ([`fit_title`]); returns the area under it and
/// the title as set (its lines joined by a space: the title asked for where nothing was cut).
pub(super) fn draw_title<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
) -> Result<Titled<DB>, DrawingAreaErrorKind<DB::ErrorType>> {
    let (w, _) = root.dim_in_pixel();
    let (lines, size) = fit_title(title, w, TITLE_PT);
    let style = ("sans-serif", size).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Top,
    ));
    let line_h = (root.estimate_text_size("Mg", &style)?.1 as f64 * 1.3).ceil() as i32;
    let mut y = pt(3.0) as i32;
    for line in &lines {
        root.draw(&Text::new(line.clone(), (w as i32 / 2, y), style.clone()))?;
        y += line_h;
    }
    Ok((root.margin(y as u32 + pt(2.0), 0, 0, 0), lines.join(" ")))
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
    pub(super) fn canvas_width(&self) -> u32 {
        (self.width.inches() * f64::from(PDF_DPI)).round() as u32
    }

    /// A chart's canvas: the printed width, two thirds as tall.
    pub(super) fn chart_size(&self) -> (u32, u32) {
        let w = self.canvas_width();
        (w, w * 2 / 3)
    }
}

/// A figure's page: `root` filled white, `title` across its top ([`draw_title`]) and recorded in
/// `drawn` as asked and as set; returns the area under the title.
pub(super) fn titled_page<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    drawn: &mut Drawn,
) -> Result<DrawingArea<DB, Shift>>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let (area, set) = draw_title(root, title).map_err(err)?;
    drawn.title = (title.to_string(), set);
    Ok(area)
}
