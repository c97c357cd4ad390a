//! A claim's paired figure: each seed's A and B joined (a slope chart), beside the differences.

use super::*;

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

/// The paired panel's left half: each seed's A and B joined in grey, the arms' points in their
/// colours, their means joined in black; the arms named under their columns where the names fit.
fn draw_arms<DB: DrawingBackend>(
    left: &DrawingArea<DB, Shift>,
    c: &Paired,
    axis_h: u32,
    drawn: &mut Drawn,
) -> Result<u32>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    let (lo, hi) = span(c.log, &mut c.values.iter().flat_map(|v| [v.0, v.1]));
    anyhow::ensure!(lo <= hi, "nothing to plot: no paired values");
    let (names_w, tick_h) = widest(left, c.arms.iter().cloned());
    // The arms' names under their columns where they fit, else A and B there and the names on two
    // lines under the panel.
    let fits = f64::from(names_w) <= 0.42 * f64::from(left.dim_in_pixel().0);
    let ticks = match fits {
        true => c.arms.clone(),
        false => ["A".to_string(), "B".to_string()],
    };
    let x = Axis { log: false, lo: -0.35, hi: 1.35, ticks: vec![(0.0, ticks[0].clone()), (1.0, ticks[1].clone())] };
    let line_h = (f64::from(tick_h) * 1.25) as u32;
    let x_area = tick_h + pt(8.0) + if fits { 0 } else { 2 * line_h + pt(2.0) };
    let plot_h = f64::from(left.dim_in_pixel().1.saturating_sub(x_area + pt(8.0)));
    let y = thinned(value_axis(c.log, (lo, hi), 0.08, if c.log { 5 } else { 6 }), plot_h);
    let y_area = widest(left, y.ticks.iter().map(|t| t.1.clone())).0 + axis_h + pt(10.0);
    let mut ctx = xy_context(left, &x, &y, (x_area, y_area)).map_err(err)?;
    draw_axes(&mut ctx, (&x, &y), ("", &c.y_label)).map_err(err)?;
    if !fits {
        draw_arm_key(left, c, (y_area, line_h)).map_err(err)?;
    }
    let grey = RGBColor(170, 170, 170);
    let ok = |v: &f64| finite_on(c.log, *v);
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
    drawn.axes.push(DrawnAxis { name: "y".into(), data: (y.at(lo), y.at(hi)), axis: y });
    Ok(x_area)
}

/// "A: <arm>" and "B: <arm>" on two lines at the foot of the left panel, centred under the plot.
fn draw_arm_key<DB: DrawingBackend>(
    left: &DrawingArea<DB, Shift>,
    c: &Paired,
    (y_area, line_h): (u32, u32),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (w, h) = left.dim_in_pixel();
    let style = ("sans-serif", font(TICK_PT)).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Bottom,
    ));
    let cx = (y_area + w) as i32 / 2;
    for (k, (tag, arm)) in ["A", "B"].iter().zip(&c.arms).enumerate() {
        let y = h as i32 - pt(2.0) as i32 - (1 - k as i32) * line_h as i32;
        left.draw(&Text::new(format!("{tag}: {arm}"), (cx, y), style.clone()))?;
    }
    Ok(())
}

/// Whether `v` can be drawn on the paired figure's axes (positive on a log axis).
fn finite_on(log: bool, v: f64) -> bool {
    v.is_finite() && (!log || v > 0.0)
}

/// The smallest and largest drawable of `values`.
fn span(log: bool, values: &mut dyn Iterator<Item = f64>) -> (f64, f64) {
    values.filter(|v| finite_on(log, *v)).fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)))
}

/// The paired panel's right half: each seed's difference, the mean's interval, the line of no
/// effect and the margins.
fn draw_differences<DB: DrawingBackend>(
    right: &DrawingArea<DB, Shift>,
    c: &Paired,
    (axis_h, x_area): (u32, u32),
    drawn: &mut Drawn,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    let ok = |v: &f64| finite_on(c.log, *v);
    let none = if c.log { 1.0 } else { 0.0 };
    let all = c.diffs.iter().copied().chain([c.interval.0, c.interval.1, none]).chain(c.margin.iter().copied());
    let (dlo, dhi) = span(c.log, &mut all.clone());
    let plot_h = f64::from(right.dim_in_pixel().1.saturating_sub(x_area + pt(8.0)));
    let dy = thinned(value_axis(c.log, (dlo, dhi), 0.08, if c.log { 5 } else { 6 }), plot_h);
    let dx = Axis { log: false, lo: -1.0, hi: 1.0, ticks: vec![] };
    let dy_area = widest(right, dy.ticks.iter().map(|t| t.1.clone())).0 + axis_h + pt(10.0);
    let mut dctx = xy_context(right, &dx, &dy, (x_area, dy_area)).map_err(err)?;
    draw_axes(&mut dctx, (&dx, &dy), (&c.diff_label, "")).map_err(err)?;
    dctx.draw_series(LineSeries::new([(-1.0, dy.at(none)), (1.0, dy.at(none))], BLACK.stroke_width(1))).map_err(err)?;
    let red = RGBColor(214, 39, 40);
    for m in &c.margin {
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
    let grey = RGBColor(170, 170, 170).mix(0.9);
    dctx.draw_series(
        c.diffs
            .iter()
            .enumerate()
            .filter(|(_, d)| ok(d))
            .map(|(i, d)| Circle::new((-0.8 + 0.9 * i as f64 / (n - 1.0), dy.at(*d)), pt(DOT_PT), grey.filled())),
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
    drawn.axes.push(DrawnAxis { name: "difference".into(), data: (dy.at(dlo), dy.at(dhi)), axis: dy });
    Ok(())
}

/// The paired figure: its title, the arms on the left three fifths, the differences beside them.
pub(super) fn draw_paired<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &Paired,
    drawn: &mut Drawn,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing: {e:?}");
    let area = titled_page(root, &c.title, drawn)?;
    let (w, _) = area.dim_in_pixel();
    let (left, right) = area.split_horizontally(w * 3 / 5);
    let axis_h = area.estimate_text_size("Mg", &("sans-serif", font(AXIS_PT)).into()).map_err(err)?.1;
    let x_area = draw_arms(&left, c, axis_h, drawn)?;
    draw_differences(&right, c, (axis_h, x_area), drawn)
}
