//! Heatmap panels (C, ANCRe's coefficients) in a grid sharing one colour scale and colour bar.

use super::*;

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
    /// Cells `(row, column)` that are no edge of the wiring (a sparse `graph`): drawn hatched, not
    /// in the colour of a value, and named under the colour bar.
    pub absent: Vec<(usize, usize)>,
}

/// The rows and columns of a heatmap figure's panels at `style`'s width.
pub(super) fn heatmap_grid(panels: &[Heatmap], style: &Style) -> (u32, u32) {
    panel_grid(style.canvas_width(), panels.len())
}

/// A heatmap figure's canvas: its width, each row of panels as tall as a panel is wide (square
/// cells for a square matrix) plus its title and labels, within 1.4–4.5 in.
pub(super) fn heatmap_size(panels: &[Heatmap], style: &Style) -> Result<(u32, u32)> {
    anyhow::ensure!(!panels.is_empty(), "no heatmap to draw");
    let width = style.canvas_width();
    let (rows, cols) = heatmap_grid(panels, style);
    let panel = width.saturating_sub(COLORBAR) / cols;
    let row_height = (panel + pt(10.0)).clamp(pt(100.0), pt(324.0));
    // Tall enough for the colour bar's title, which runs along the bar beside every row: in a
    // single row of small panels (C over training at double width) it would leave the canvas.
    let colorbar_title = text_width(&panels[0].colorbar_label, font(AXIS_PT)) as u32;
    Ok((width, (row_height * rows + pt(16.0)).max(colorbar_title + pt(64.0))))
}

/// The colour bar's share of a heatmap figure's width (0.98 in).
pub(super) const COLORBAR: u32 = 175;

/// Rows and columns of heatmap panels on a canvas `width` wide: side by side while each panel is
/// at least 1.1 in wide, else in rows (five snapshots of C in one column of a paper: 2 × 3).
pub(super) fn panel_grid(width: u32, n: usize) -> (u32, u32) {
    let fit = (width.saturating_sub(COLORBAR) / pt(80.0)).max(1);
    let n = n.max(1) as u32;
    let cols = fit.min(n);
    (n.div_ceil(cols), cols)
}

/// The colour range every panel shares: the union of each panel's `range`, else its finite
/// values' min and max (a constant matrix gets a unit range around its value).
pub(super) fn color_range(panels: &[Heatmap]) -> (f64, f64) {
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
pub(super) struct PanelTicks {
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
pub(super) fn ticked_columns(cell: f64, widths: &[f64]) -> Vec<usize> {
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
pub(super) fn panel_ticks<DB: DrawingBackend>(
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
pub(super) fn draw_panel<DB: DrawingBackend>(
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
        if p.absent.contains(&(r, c)) {
            chart.draw_series(std::iter::once(Rectangle::new([(x, y), (x + 1.0, y + 1.0)], WHITE.filled())))?;
            chart.draw_series(hatch(x, y))?;
            continue;
        }
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

/// Grey diagonal hatching of the unit cell at `(x, y)`: an edge the wiring does not have.
fn hatch(x: f64, y: f64) -> Vec<PathElement<(f64, f64)>> {
    let grey = RGBColor(150, 150, 150).stroke_width(pt(0.6));
    [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
        .iter()
        .map(|&k: &f64| {
            // The segment of the line u + v = k inside the cell.
            let (a, b) = ((k - 1.0).max(0.0), k.min(1.0));
            PathElement::new(vec![(x + a, y + k - a), (x + b, y + k - b)], grey)
        })
        .collect()
}

/// Under the colour bar: a hatched swatch and "no edge", where a panel has absent edges.
fn draw_absent_key<DB: DrawingBackend>(
    bar: &DrawingArea<DB, Shift>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (_, h) = bar.dim_in_pixel();
    let (s, x0, y0) = (pt(8.0) as i32, pt(6.0) as i32, h as i32 - pt(14.0) as i32);
    bar.draw(&Rectangle::new([(x0, y0), (x0 + s, y0 + s)], RGBColor(150, 150, 150).stroke_width(1)))?;
    for k in 1..4 {
        let d = s * k / 4;
        let grey = RGBColor(150, 150, 150).stroke_width(pt(0.6));
        bar.draw(&PathElement::new(vec![(x0, y0 + d), (x0 + d, y0)], grey))?;
        bar.draw(&PathElement::new(vec![(x0 + d, y0 + s), (x0 + s, y0 + d)], grey))?;
    }
    let style = ("sans-serif", font(LEGEND_PT)).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Left,
        plotters::style::text_anchor::VPos::Center,
    ));
    bar.draw(&Text::new("no edge", (x0 + s + pt(3.0) as i32, y0 + s / 2), style))
}

/// The colour bar's axis: ticks at nice values that enclose the panels' colour range (3 to one
/// per 24 pt of the bar's height), the bar running from the first tick to the last.
pub(super) fn colorbar_axis<DB: DrawingBackend>(bar: &DrawingArea<DB, Shift>, (lo, hi): (f64, f64)) -> Axis {
    let max_ticks = ((bar.dim_in_pixel().1.saturating_sub(pt(48.0))) / pt(24.0)).clamp(3, 8) as usize;
    enclosing_axis(lo, hi, 0.0, max_ticks)
}

/// The colour bar: its ticks and title on its right, as matplotlib draws one.
pub(super) fn draw_colorbar<DB: DrawingBackend>(
    bar: &DrawingArea<DB, Shift>,
    label: &str,
    axis: &Axis,
    axis_h: u32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (lo, hi) = (axis.lo, axis.hi);
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

/// The panels in a `grid` (rows, columns) under the figure's title, then the shared colour bar,
/// its ticks enclosing every panel's values.
pub(super) fn draw_heatmaps<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    panels: &[Heatmap],
    title: &str,
    grid: (u32, u32),
    drawn: &mut Drawn,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    let area = titled_page(root, title, drawn)?;
    let (main, bar) = area.split_horizontally(area.dim_in_pixel().0.saturating_sub(COLORBAR));
    let data = color_range(panels);
    let axis = colorbar_axis(&bar, data);
    let range = (axis.lo, axis.hi);
    let (grid_rows, grid_cols) = (grid.0 as usize, grid.1 as usize);
    let axis_h = area.estimate_text_size("Mg", &("sans-serif", font(AXIS_PT)).into()).map_err(err)?.1;
    for (i, (p, panel_area)) in panels.iter().zip(main.split_evenly((grid_rows, grid_cols))).enumerate() {
        let outer = (i % grid_cols == 0, i + grid_cols >= panels.len());
        draw_panel(&panel_area, p, outer, range, axis_h).map_err(err)?;
    }
    draw_colorbar(&bar, &panels[0].colorbar_label, &axis, axis_h).map_err(err)?;
    if panels.iter().any(|p| !p.absent.is_empty()) {
        draw_absent_key(&bar).map_err(err)?;
    }
    drawn.axes.push(DrawnAxis { name: "colour".into(), data, axis });
    Ok(())
}
