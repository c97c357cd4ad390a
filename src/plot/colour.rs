//! Colours and line patterns: one colour per topology in every figure (its registry's), the
//! Tableau-10 palette for everything else, viridis for heatmaps.

use super::*;

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
    pub(super) fn pattern(self) -> Option<(f64, f64)> {
        match self {
            Dash::Solid => None,
            Dash::Dashed => Some((4.0, 2.0)),
            Dash::Dotted => Some((1.2, 1.6)),
            Dash::LongDash => Some((8.0, 2.5)),
        }
    }
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

/// A series' colour: its own, else the palette's by position.
pub(super) fn series_color(i: usize, s: &Series) -> RGBColor {
    s.color.unwrap_or(PALETTE[i % PALETTE.len()])
}

pub(super) fn viridis(t: f64) -> RGBColor {
    use plotters::style::colors::colormaps::{ColorMap, ViridisRGB};
    ViridisRGB.get_color(t.clamp(0.0, 1.0))
}
