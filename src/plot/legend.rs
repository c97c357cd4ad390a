//! The legend of a line chart: its size, where it goes (inside the plot where it covers no data,
//! else beside or below it) and how it is drawn.

use super::*;

/// A legend entry: its text, colour and line pattern.
pub(super) struct Entry<'a> {
    pub(super) label: &'a str,
    pub(super) color: RGBColor,
    pub(super) dash: Dash,
}

/// A legend's shape in drawing units: `n` entries of (swatch, gap, text) in columns `col_w` wide
/// and rows `row` tall, filled row by row.
#[derive(Debug, Clone, Copy)]
pub(super) struct LegendShape {
    pub(super) col_w: i32,
    pub(super) row: i32,
    pub(super) n: usize,
    pub(super) cols: usize,
}

impl LegendShape {
    /// Its frame's width and height.
    pub(super) fn size(&self) -> (i32, i32) {
        let rows = self.n.div_ceil(self.cols.max(1)) as i32;
        (self.col_w * self.cols as i32, self.row * rows + pt(4.0) as i32)
    }
}

/// The shape of a one-column legend of `entries`.
pub(super) fn legend_size<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, entries: &[Entry]) -> LegendShape {
    let style: TextStyle = ("sans-serif", font(LEGEND_PT)).into();
    let text_w = entries.iter().map(|e| area.estimate_text_size(e.label, &style).map_or(0, |s| s.0)).max().unwrap_or(0);
    let row = pt(LEGEND_PT * 1.45) as i32;
    let col_w = pt(4.0) as i32 + pt(14.0) as i32 + pt(4.0) as i32 + text_w as i32 + pt(5.0) as i32;
    LegendShape { col_w, row, n: entries.len(), cols: 1 }
}

/// Draws the legend with its top-left corner at `at` (drawing units of the root).
pub(super) fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[Entry],
    at: (i32, i32),
    markers: bool,
    shape: &LegendShape,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (w, h) = shape.size();
    let base = area.get_base_pixel();
    let (x0, y0) = (at.0 - base.0, at.1 - base.1);
    area.draw(&Rectangle::new([(x0, y0), (x0 + w, y0 + h)], WHITE.filled()))?;
    area.draw(&Rectangle::new([(x0, y0), (x0 + w, y0 + h)], RGBColor(200, 200, 200).stroke_width(1)))?;
    let row = shape.row;
    let thick = (pt(LINE_PT) as i32).max(1);
    for (i, e) in entries.iter().enumerate() {
        let (r, c) = ((i / shape.cols) as i32, (i % shape.cols) as i32);
        let cy = y0 + pt(2.0) as i32 + row * r + row / 2;
        let sx = x0 + pt(4.0) as i32 + shape.col_w * c;
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

/// Where a `size` legend goes inside the plot area `(xr, yr)` (pixels): the first corner, then
/// edge middle, whose box touches none of `segments`; `None` where every place does.
pub(super) fn legend_inside(
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

/// The plot's area, the legend's top-left corner (`i32::MIN` for none) and its shape: inside
/// where it fits, else to the right where it takes at most 40 % of the width, else below in as
/// many columns as the width holds (so that it takes rows, not half the figure's height). A
/// single line's legend only where it fits inside (it names the topology of the line).
pub(super) fn legend_layout<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    inside: Option<(i32, i32)>,
    series: usize,
    shape: LegendShape,
) -> (DrawingArea<DB, Shift>, (i32, i32), LegendShape) {
    let (w, h) = area.dim_in_pixel();
    let (lw, _) = shape.size();
    match inside {
        Some(p) => (area.clone(), p, shape),
        None if series <= 1 => (area.clone(), (i32::MIN, 0), shape),
        None if lw as u32 <= w * 2 / 5 => {
            let (left, right) = area.split_horizontally(w - lw as u32 - pt(4.0));
            let base = right.get_base_pixel();
            (left, (base.0, base.1 + pt(4.0) as i32), shape)
        }
        None => {
            let cols = ((w as i32 - pt(8.0) as i32) / shape.col_w.max(1)).clamp(1, shape.n.max(1) as i32) as usize;
            let shape = LegendShape { cols, ..shape };
            let (lw, lh) = shape.size();
            let (top, bottom) = area.split_vertically(h.saturating_sub(lh as u32 + pt(4.0)));
            let base = bottom.get_base_pixel();
            (top, (base.0 + (w as i32 - lw) / 2, base.1 + pt(2.0) as i32), shape)
        }
    }
}
