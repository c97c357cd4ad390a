//! Figures: every producer returns [`Figure`] values (figure.rs: what to draw, in display form),
//! and one renderer ([`render`]) draws any of them once as SVG with `plotters`, written as SVG
//! (its text as the font's outlines), PNG (rasterised from it by `resvg`) and PDF (vector,
//! converted from it by `svg2pdf`, its fonts embedded: what pdflatex's `\includegraphics` takes).
//! Text uses the DejaVu Sans font embedded in the binary (the `dejavu` crate), so figures render
//! the same on machines without system fonts.
//!
//! The parts: `style` (sizes, widths, formats), `colour`, `names` (display names), `axis` (ticks),
//! `legend`, the three drawings (`lines`, `heatmap`, `paired`), `render` (SVG to files) and
//! [`lint`] (what the layout test checks); the producers are [`figures`] (`plexus plot`),
//! [`study`] (`plexus report`) and [`curves`] (a run kind's own figure).

mod axis;
mod colour;
pub mod curves;
mod figure;
pub mod figures;
mod heatmap;
mod legend;
mod lines;
pub mod lint;
mod names;
mod paired;
mod panels;
mod render;
pub mod study;
mod style;
#[cfg(test)]
mod tests;

pub use axis::*;
pub use colour::*;
pub use figure::*;
pub use heatmap::*;
pub use legend::*;
pub use lines::*;
pub use names::*;
pub use paired::*;
pub use render::*;
pub use style::*;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Once;
