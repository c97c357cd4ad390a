//! Axes: linear and log ticks that enclose the data, labelled as a paper's figure is, and the
//! plotters coordinate and frame every x–y panel shares.

use super::*;

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
    pub(super) fn at(&self, v: f64) -> f64 {
        if self.log {
            v.log10()
        } else {
            v
        }
    }

    /// The label of the tick at `v` (drawing space); plotters asks for each key point.
    pub(super) fn label(&self, v: f64) -> String {
        let eps = 1e-9 * (self.hi - self.lo).abs().max(f64::MIN_POSITIVE);
        self.ticks.iter().find(|(t, _)| (t - v).abs() <= eps).map(|t| t.1.clone()).unwrap_or_default()
    }

    pub(super) fn points(&self) -> Vec<f64> {
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
pub(super) fn widen_flat(lo: f64, hi: f64) -> (f64, f64) {
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
pub(super) fn ticked_axis(lo: f64, hi: f64, m: f64, step: f64) -> Axis {
    // Thousands as k and millions as M: `250k` reads where `250000` crowds its neighbours.
    let top = lo.abs().max(hi.abs());
    let (unit, suffix) = match () {
        _ if top >= 1e6 && step >= 1e5 => (1e6, "M"),
        _ if top >= 1e4 && step >= 1e3 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let k = (step / unit).log10().floor() as i32;
    // 2.5 × 10^k needs one more decimal than its step only below 10 (0.25, 2.5; not 25).
    let decimals = (-k).max(0) as usize + usize::from(m == 2.5 && k <= 0);
    // Within a millionth of a step: an end that is a tick (`enclosing_axis`) keeps its label.
    let (first, last) = ((lo / step - 1e-6).ceil() as i64, (hi / step + 1e-6).floor() as i64);
    let ticks = (first..=last)
        .map(|i| {
            let v = i as f64 * step;
            let s = format!("{:.decimals$}", v / unit);
            // No "-0" (nor "-0.0").
            let s =
                if s.starts_with('-') && s[1..].chars().all(|c| c == '0' || c == '.') { s[1..].to_string() } else { s };
            // A minus sign, not a hyphen, as a paper sets numbers.
            (v, format!("{}{suffix}", s.replacen('-', "−", 1)))
        })
        .collect();
    Axis { log: false, lo, hi, ticks }
}

/// Digits as superscripts: `-3` → `⁻³`.
pub(super) fn superscript(n: i32) -> String {
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

/// Ticks at every digit of a decade: as a pattern for [`next_log_tick`], the next digit.
const EVERY_DIGIT: [f64; 9] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];

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
    // Two ticks around a narrow range (14–16 between 10 and 20): a third at the next digit on the
    // side the data are nearer (30), so that the axis reads as a scale.
    if values.len() < 3 {
        let up = (last / hi).log10() < (lo / first).log10();
        match up {
            true => values.push(next_log_tick(&EVERY_DIGIT, last, true)),
            false => values.insert(0, next_log_tick(&EVERY_DIGIT, first, false)),
        }
        (first, last) = (values[0], values[values.len() - 1]);
    }
    Axis { log: true, lo: first.log10(), hi: last.log10(), ticks: log_labels(values) }
}

/// The tick after `v` (above it with `up`, else below) in the pattern of `ticks`: their decade
/// stride where every tick is a power of ten (and there are two), else the smallest of
/// [`log_axis`]'s mantissa sets (1, 2, 5; 1, 2, 3, 5; every digit) that holds every tick's
/// mantissa, in every decade (`1, 2, 5` → … 0.5, 1, 2, 5, 10 …).
pub(super) fn next_log_tick(ticks: &[f64], v: f64, up: bool) -> f64 {
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
pub(super) fn log_labels(values: Vec<f64>) -> Vec<(f64, String)> {
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
pub(super) const GRID: RGBColor = RGBColor(222, 222, 222);

/// A linear coordinate over `range` whose ticks (and grid lines) are exactly `keys`: plotters'
/// own picks its ticks itself, and its key-point wrapper does not format `f64` values.
#[derive(Debug, Clone)]
pub struct Ticked {
    pub range: std::ops::Range<f64>,
    pub keys: Vec<f64>,
}

impl Ticked {
    pub(super) fn new(range: std::ops::Range<f64>, keys: Vec<f64>) -> Self {
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

pub(super) type Coord = Cartesian2d<Ticked, Ticked>;

pub(super) fn xy_context<'a, DB: DrawingBackend>(
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
pub(super) fn draw_axes<DB: DrawingBackend>(
    ctx: &mut ChartContext<'_, DB, Coord>,
    (x, y): (&Axis, &Axis),
    (x_desc, y_desc): (&str, &str),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    // The axis titles at 9 pt, smaller down to 7 where the y title is longer than the plot is tall
    // (a single column's plot under a two-line title), so that it stays beside the plot.
    let plot_h = f64::from(ctx.plotting_area().dim_in_pixel().1);
    let desc_pt =
        [AXIS_PT, 8.5, 8.0, 7.5, 7.0].into_iter().find(|p| text_width(y_desc, font(*p)) <= plot_h).unwrap_or(7.0);
    ctx.configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style(("sans-serif", font(TICK_PT)))
        .axis_desc_style(("sans-serif", font(desc_pt)))
        .x_label_formatter(&|v| x.label(*v))
        .y_label_formatter(&|v| y.label(*v))
        .bold_line_style(GRID.stroke_width(1))
        .light_line_style(TRANSPARENT)
        .axis_style(BLACK.stroke_width(1))
        .set_all_tick_mark_size(pt(2.5))
        .draw()
}

/// Width and height of the widest of `labels` at tick size.
pub(super) fn widest<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    labels: impl Iterator<Item = String>,
) -> (u32, u32) {
    let style: TextStyle = ("sans-serif", font(TICK_PT)).into();
    labels
        .map(|l| area.estimate_text_size(&l, &style).unwrap_or((0, 0)))
        .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)))
}

/// The height of a line of tick labels, in drawing units (the font's ascent and descent at 8 pt).
pub(super) fn tick_line() -> f64 {
    1.2 * f64::from(pt(TICK_PT))
}

/// Whether the labels of `axis`'s ticks, on a `length`-pixel axis, are a line and a tenth apart
/// (log ticks at every digit are closer at the top of a decade: the least gap counts).
pub(super) fn ticks_fit(axis: &Axis, length: f64) -> bool {
    let px = |v: f64| (v - axis.lo) / (axis.hi - axis.lo).max(f64::MIN_POSITIVE) * length;
    let labelled: Vec<f64> = axis.ticks.iter().filter(|t| !t.1.is_empty()).map(|t| px(t.0)).collect();
    labelled.windows(2).all(|w| (w[1] - w[0]).abs() >= 1.1 * tick_line())
}

/// `axis` with its tick labels thinned from the lowest up until they fit a `length`-pixel axis
/// ([`ticks_fit`]): each kept where it clears the last kept, the top tick kept in place of the one
/// below it where they crowd (the ticks a log axis needs to enclose its data, 0.8, 0.9, 1, …,
/// read as a scale); every tick and its grid line stay.
pub(super) fn thinned(mut axis: Axis, length: f64) -> Axis {
    let px = |v: f64| (v - axis.lo) / (axis.hi - axis.lo).max(f64::MIN_POSITIVE) * length;
    let room = 1.1 * tick_line();
    let n = axis.ticks.len();
    let mut last: Option<f64> = None;
    let mut kept = vec![false; n];
    for (i, t) in axis.ticks.iter().enumerate() {
        let at = px(t.0);
        if last.is_none_or(|l| (at - l).abs() >= room) {
            kept[i] = true;
            last = Some(at);
        }
    }
    // The top tick labelled, so that the range reads at both ends.
    if n > 1 && !kept[n - 1] {
        let top = px(axis.ticks[n - 1].0);
        if let Some(j) = (0..n - 1).rev().find(|&j| kept[j] && (top - px(axis.ticks[j].0)).abs() < room) {
            kept[j] = j == 0;
        }
        kept[n - 1] = true;
    }
    for (t, keep) in axis.ticks.iter_mut().zip(kept) {
        if !keep {
            t.1.clear();
        }
    }
    axis
}

/// A value axis: ticks that enclose `(lo, hi)` (padded by `pad` of the span on a linear axis), at
/// most `max_ticks` of them on a linear axis and about as many on a log one.
pub(super) fn value_axis(log: bool, (lo, hi): (f64, f64), pad: f64, max_ticks: usize) -> Axis {
    match log {
        true => enclosing_log_axis(lo, hi, max_ticks),
        false => enclosing_axis(lo, hi, pad, max_ticks),
    }
}
