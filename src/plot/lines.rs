//! Line charts: curves with optional bands, linear or log axes, markers on short series.

use super::*;

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

/// A line chart description.
#[derive(Debug, Clone)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// At most this many points in every series: each point is marked, not only joined.
pub(super) const MARKED_UP_TO: usize = 20;

/// A pixel segment of drawn data, end to end.
pub(super) type Segment = ((f64, f64), (f64, f64));

/// A range of values, `(lo, hi)`.
pub(super) type Span = (f64, f64);

/// How a chart's values map to its axes: which points can be drawn, and where a value sits on
/// the y axis (a log axis draws exact zeros a decade below the smallest positive value).
pub(super) struct Scales {
    log_x: bool,
    log_y: bool,
    floor: f64,
}

impl Scales {
    pub(super) fn ok_x(&self, x: f64) -> bool {
        x.is_finite() && (!self.log_x || x > 0.0)
    }

    pub(super) fn y_of(&self, v: f64) -> f64 {
        if self.log_y {
            v.max(self.floor)
        } else {
            v
        }
    }

    /// A series' drawable points in drawing space (`x`, `y` axes as drawn).
    pub(super) fn drawn(&self, s: &Series, x: &Axis, y: &Axis) -> Vec<(f64, f64)> {
        s.points
            .iter()
            .filter(|p| self.ok_x(p.0) && p.1.is_finite())
            .map(|p| (x.at(p.0), y.at(self.y_of(p.1))))
            .collect()
    }

    /// A series' band outline in drawing space, if it has one.
    pub(super) fn band(&self, s: &Series, x: &Axis, y: &Axis) -> Option<Vec<(f64, f64)>> {
        let poly = band_polygon(s, |v| y.at(self.y_of(v)))?;
        Some(poly.into_iter().filter(|p| self.ok_x(p.0)).map(|p| (x.at(p.0), p.1)).collect())
    }
}

/// The chart's scales and the ranges its axes must span: every finite point and band edge.
pub(super) fn extent(chart: &LineChart, log_x: bool) -> Result<(Scales, Span, Span)> {
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
pub(super) fn fitting_x_axis<DB: DrawingBackend>(
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
/// Each series' drawn points in pixels of `ctx`.
pub(super) fn pixels<DB: DrawingBackend>(
    ctx: &ChartContext<'_, DB, Coord>,
    chart: &LineChart,
    (x, y, scales): (&Axis, &Axis, &Scales),
) -> Vec<Vec<(f64, f64)>> {
    let px = |p: (f64, f64)| {
        let c = ctx.backend_coord(&p);
        (f64::from(c.0), f64::from(c.1))
    };
    chart.series.iter().map(|s| scales.drawn(s, x, y).into_iter().map(px).collect()).collect()
}

/// Which series get their points marked: every one where all are short, a single point, and a
/// line that a later one (drawn over it) covers end to end — its markers, drawn last, keep it
/// visible (residual's eval loss under ANCRe's).
pub(super) fn marked(lines: &[Vec<(f64, f64)>], markers: bool) -> Vec<bool> {
    let tol = f64::from(pt(LINE_PT));
    (0..lines.len())
        .map(|i| {
            markers || lines[i].len() == 1 || lines[i + 1..].iter().any(|top| super::lint::covers(top, &lines[i], tol))
        })
        .collect()
}

/// Every line, marker cross and band edge of `chart` as pixel segments of `ctx`: what a legend
/// placed inside the plot must not touch.
pub(super) fn data_segments<DB: DrawingBackend>(
    ctx: &ChartContext<'_, DB, Coord>,
    chart: &LineChart,
    (x, y, scales): (&Axis, &Axis, &Scales),
    marks: &[bool],
) -> Vec<Segment> {
    let px = |p: (f64, f64)| {
        let c = ctx.backend_coord(&p);
        (f64::from(c.0), f64::from(c.1))
    };
    let r = f64::from(pt(DOT_PT));
    let mut segments = Vec::new();
    for ((s, pts), &marked) in chart.series.iter().zip(pixels(ctx, chart, (x, y, scales))).zip(marks) {
        segments.extend(pts.windows(2).map(|w| (w[0], w[1])));
        if marked {
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

/// The bands (under every line), then the lines, dashed where a series asks, then the markers of
/// the series [`marked`] marks (over every line, the first series' last); each curve as drawn goes
/// to `drawn`.
pub(super) fn draw_lines<DB: DrawingBackend>(
    ctx: &mut ChartContext<'_, DB, Coord>,
    chart: &LineChart,
    (x, y, scales): (&Axis, &Axis, &Scales),
    marks: &[bool],
    drawn: &mut Drawn,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for (i, s) in chart.series.iter().enumerate() {
        if let Some(poly) = scales.band(s, x, y) {
            ctx.draw_series(std::iter::once(Polygon::new(poly, series_color(i, s).mix(0.2).filled())))?;
        }
    }
    for (i, s) in chart.series.iter().enumerate() {
        let pts = scales.drawn(s, x, y);
        let stroke = series_color(i, s).stroke_width(pt(LINE_PT));
        match s.dash.pattern() {
            None => ctx.draw_series(LineSeries::new(pts, stroke))?,
            Some((on, off)) => ctx.draw_series(DashedLineSeries::new(pts, pt(on).max(1), pt(off).max(1), stroke))?,
        };
    }
    // Markers from the last series to the first: an earlier curve that a later one covers keeps
    // its points on top, where its line is hidden.
    for (i, s) in chart.series.iter().enumerate().rev() {
        if marks[i] {
            let c = series_color(i, s);
            ctx.draw_series(scales.drawn(s, x, y).into_iter().map(|p| Circle::new(p, pt(DOT_PT), c.filled())))?;
        }
    }
    let placed = pixels(ctx, chart, (x, y, scales));
    for ((i, s), (px, &marked)) in chart.series.iter().enumerate().zip(placed.into_iter().zip(marks)) {
        let c = series_color(i, s);
        drawn.lines.push(DrawnLine { label: s.label.clone(), color: c, dash: s.dash, pixels: px, markers: marked });
    }
    Ok(())
}

/// Lines, log or linear axes: ticks from [`linear_axis`] / [`log_axis`], ranges fitted to the data,
/// points marked where series are short, the legend in the first corner (or edge) of the plot where
/// it covers no line, band edge or point, else outside the plot.
pub(super) fn draw_xy<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &LineChart,
    log_x: bool,
    drawn: &mut Drawn,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    let area = titled_page(root, &chart.title, drawn)?;
    let (scales, x_range, (y_lo, y_hi)) = extent(chart, log_x)?;
    let markers = chart.series.iter().all(|s| s.points.len() <= MARKED_UP_TO);
    let y = value_axis(chart.log_y, (y_lo, y_hi), 0.0, 6);
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
    let shape = legend_size(&area, &entries);
    let size = shape.size();
    let inside = {
        let ctx = xy_context(&area, &x, &y, (x_area, y_area)).map_err(err)?;
        let marks = marked(&pixels(&ctx, chart, (&x, &y, &scales)), markers);
        let segments = data_segments(&ctx, chart, (&x, &y, &scales), &marks);
        legend_inside(ctx.plotting_area().get_pixel_range(), size, &segments)
    };
    let (plot_area, legend_at, shape) = legend_layout(&area, inside, chart.series.len(), shape);
    // Fewer y ticks where the plot left by the legend is short: labels a line and a half apart.
    let plot_h = f64::from(plot_area.dim_in_pixel().1.saturating_sub(x_area + pt(8.0)));
    let y = (3..=6)
        .rev()
        .map(|max| value_axis(chart.log_y, (y_lo, y_hi), 0.0, max))
        .find(|a| ticks_fit(a, plot_h))
        .unwrap_or_else(|| thinned(value_axis(chart.log_y, (y_lo, y_hi), 0.0, 3), plot_h));
    let mut ctx = xy_context(&plot_area, &x, &y, (x_area, y_area)).map_err(err)?;
    // Which curves a later one covers, as placed in the final plot.
    let marks = marked(&pixels(&ctx, chart, (&x, &y, &scales)), markers);
    draw_axes(&mut ctx, (&x, &y), (&chart.x_label, &chart.y_label)).map_err(err)?;
    draw_lines(&mut ctx, chart, (&x, &y, &scales), &marks, drawn).map_err(err)?;
    if legend_at.0 != i32::MIN {
        draw_legend(root, &entries, legend_at, markers, &shape).map_err(err)?;
    }
    let at = |a: &Axis, (lo, hi): Span| (a.at(lo), a.at(hi));
    drawn.axes.push(DrawnAxis { name: "x".into(), data: at(&x, x_range), axis: x });
    drawn.axes.push(DrawnAxis { name: "y".into(), data: at(&y, (y_lo, y_hi)), axis: y });
    Ok(())
}

/// The outline of a series' band: along the upper edge, back along the lower one.
pub(super) fn band_polygon(s: &Series, y: impl Fn(f64) -> f64) -> Option<Vec<(f64, f64)>> {
    let band = s.band.as_ref().filter(|b| b.len() == s.points.len() && b.len() > 1)?;
    let upper = s.points.iter().zip(band).map(|(&(x, _), &(_, hi))| (x, y(hi)));
    let lower = s.points.iter().zip(band).rev().map(|(&(x, _), &(lo, _))| (x, y(lo)));
    Some(upper.chain(lower).collect())
}
