//! Figures as data: every producer (`plot`, `report`'s curves and claims, `bench --depths`, a run
//! kind's own figure) returns [`Figure`] values, everything in display form (titles, axis titles
//! with units, legend labels, colours, scales); [`render`] is the one function that draws any of
//! them, at either width, to SVG, PNG and PDF. [`Kind::ALL`] lists every kind of figure the program
//! draws: the layout test builds each from real runs through the producers the commands call.

use super::*;

/// What one figure shows, ready to draw.
#[derive(Debug, Clone)]
pub struct Figure {
    /// Its file stem in the output folder (`loss`, `connectivity_<run>`).
    pub file: String,
    pub kind: Kind,
    pub chart: Chart,
}

/// The drawing a figure is: curves, heatmap panels or a claim's paired seeds.
#[derive(Debug, Clone)]
pub enum Chart {
    /// Curves over a linear x axis (the y axis linear or log, as the chart says).
    Lines(LineChart),
    /// Curves with both axes logarithmic (growth laws read as slopes), points marked.
    LogLog(LineChart),
    /// Heatmap panels sharing one colour scale, under one title.
    Heatmaps { title: String, panels: Vec<Heatmap> },
    /// A claim's arms on each seed and their differences.
    Paired(Paired),
}

impl Chart {
    /// The figure's title, as asked (the renderer may set it smaller or on two lines).
    pub fn title(&self) -> &str {
        match self {
            Chart::Lines(c) | Chart::LogLog(c) => &c.title,
            Chart::Heatmaps { title, .. } => title,
            Chart::Paired(p) => &p.title,
        }
    }
}

/// Every kind of figure plexus draws, with the command that draws it. A new figure is a new kind
/// here, a producer returning it, and nothing in the renderer (docs/architecture.md, "Adding a
/// figure").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Loss,
    EvalLoss,
    EvalAccuracy,
    EvalPerplexity,
    Gamma,
    Delta,
    EpsByT,
    Layerwise,
    Pruning,
    Noise,
    Connectivity,
    DepthWidth,
    Ways,
    AncreCoefficients,
    ConnectivityGrid,
    ReportCurve,
    Claim,
    ClaimProfiles,
    DepthTime,
    DepthMemory,
    RlSuccess,
}

impl Kind {
    /// Every kind, in the order the gallery shows them.
    pub const ALL: [Kind; 21] = [
        Kind::Loss,
        Kind::EvalLoss,
        Kind::EvalAccuracy,
        Kind::EvalPerplexity,
        Kind::Gamma,
        Kind::Delta,
        Kind::EpsByT,
        Kind::Layerwise,
        Kind::Pruning,
        Kind::Noise,
        Kind::Connectivity,
        Kind::DepthWidth,
        Kind::Ways,
        Kind::AncreCoefficients,
        Kind::ConnectivityGrid,
        Kind::ReportCurve,
        Kind::Claim,
        Kind::ClaimProfiles,
        Kind::DepthTime,
        Kind::DepthMemory,
        Kind::RlSuccess,
    ];

    /// Its name in the gallery and in the layout test's messages (the file stem of a figure of
    /// one kind per folder).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Loss => "loss",
            Kind::EvalLoss => "eval_loss",
            Kind::EvalAccuracy => "eval_accuracy",
            Kind::EvalPerplexity => "eval_perplexity",
            Kind::Gamma => "gamma",
            Kind::Delta => "delta",
            Kind::EpsByT => "eps_by_t",
            Kind::Layerwise => "layerwise",
            Kind::Pruning => "pruning",
            Kind::Noise => "noise",
            Kind::Connectivity => "connectivity",
            Kind::DepthWidth => "depth_width",
            Kind::Ways => "mudd_ways",
            Kind::AncreCoefficients => "ancre_p",
            Kind::ConnectivityGrid => "connectivity_grid",
            Kind::ReportCurve => "report_curve",
            Kind::Claim => "claim",
            Kind::ClaimProfiles => "claim_profiles",
            Kind::DepthTime => "depth_time",
            Kind::DepthMemory => "depth_memory",
            Kind::RlSuccess => "rl_success",
        }
    }

    /// The command that draws it.
    pub fn command(self) -> &'static str {
        match self {
            Kind::ReportCurve | Kind::Claim | Kind::ClaimProfiles => "plexus report",
            Kind::DepthTime | Kind::DepthMemory => "plexus bench --depths",
            Kind::RlSuccess => "plexus rl",
            _ => "plexus plot",
        }
    }
}

/// What the renderer drew, as the layout check reads it: the title as set, every numeric axis
/// (its ticks and the data it must enclose) and every curve as placed on the canvas.
#[derive(Debug, Clone, Default)]
pub struct Drawn {
    /// The title as asked and as set (smaller, or on two lines, where it did not fit).
    pub title: (String, String),
    pub axes: Vec<DrawnAxis>,
    pub lines: Vec<DrawnLine>,
}

/// A numeric axis as drawn, in drawing space (log10 of the value on a log axis).
#[derive(Debug, Clone)]
pub struct DrawnAxis {
    /// Which axis: `x`, `y`, `colour`, `difference`.
    pub name: String,
    pub axis: Axis,
    /// The smallest and largest value it shows (drawing space).
    pub data: (f64, f64),
}

/// A curve as drawn: its legend label, colour, line pattern, its points on the canvas (pixels)
/// and whether its points are marked.
#[derive(Debug, Clone)]
pub struct DrawnLine {
    pub label: String,
    pub color: RGBColor,
    pub dash: Dash,
    pub pixels: Vec<(f64, f64)>,
    pub markers: bool,
}

/// A figure drawn: the files written, its SVG drawing and what the layout check reads.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub files: Vec<PathBuf>,
    pub svg: String,
    pub drawn: Drawn,
}

/// Draws `figure` once as SVG at `style`'s width and writes `<dir>/<figure.file>.{png,svg,pdf}` as
/// `style`'s formats ask.
pub fn render(figure: &Figure, style: &Style, dir: &Path) -> Result<Rendered> {
    let size = match &figure.chart {
        Chart::Heatmaps { panels, .. } => heatmap_size(panels, style)?,
        _ => style.chart_size(),
    };
    let mut drawn = Drawn::default();
    let svg = draw_svg(size, |root| match &figure.chart {
        Chart::Lines(c) => draw_xy(root, c, false, &mut drawn),
        Chart::LogLog(c) => draw_xy(root, &LineChart { log_y: true, ..c.clone() }, true, &mut drawn),
        Chart::Heatmaps { title, panels } => {
            draw_heatmaps(root, panels, title, heatmap_grid(panels, style), &mut drawn)
        }
        Chart::Paired(p) => draw_paired(root, p, &mut drawn),
    })?;
    std::fs::create_dir_all(dir).map_err(|e| anyhow!("creating the figure folder {}: {e}", dir.display()))?;
    let files = write_formats(&svg, size, style.formats, &dir.join(&figure.file))?;
    Ok(Rendered { files, svg, drawn })
}

/// Renders every figure into `dir`; returns the files written.
pub fn write_all(figures: &[Figure], style: &Style, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for f in figures {
        files.extend(render(f, style, dir)?.files);
    }
    Ok(files)
}
