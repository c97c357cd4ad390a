//! What the layout test checks in a figure's data and in what the renderer drew: tick counts,
//! data inside the ticks, titles set whole, labels in display form, colours told apart and every
//! curve visible. Each check returns what is wrong in words; tests/it/figures.rs runs them on every
//! kind of figure and on a planted defect of each.

use super::*;

/// Whether the polyline `top` covers every point of `under` (sampled each pixel along it) within
/// `tol` pixels: `under`, drawn first, would not be seen.
pub fn covers(top: &[(f64, f64)], under: &[(f64, f64)], tol: f64) -> bool {
    if top.is_empty() || under.is_empty() {
        return false;
    }
    let near = |p: (f64, f64)| {
        let d = |a: (f64, f64), b: (f64, f64)| {
            let (dx, dy) = (b.0 - a.0, b.1 - a.1);
            let len2 = dx * dx + dy * dy;
            let t = if len2 == 0.0 { 0.0 } else { (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / len2).clamp(0.0, 1.0) };
            ((a.0 + t * dx - p.0).powi(2) + (a.1 + t * dy - p.1).powi(2)).sqrt()
        };
        match top.len() {
            1 => d(top[0], top[0]) <= tol,
            _ => top.windows(2).any(|w| d(w[0], w[1]) <= tol),
        }
    };
    let samples = under.windows(2).flat_map(|w| {
        let n = ((w[1].0 - w[0].0).abs() + (w[1].1 - w[0].1).abs()).ceil().max(1.0) as usize;
        (0..=n).map(move |k| {
            let t = k as f64 / n as f64;
            (w[0].0 + t * (w[1].0 - w[0].0), w[0].1 + t * (w[1].1 - w[0].1))
        })
    });
    under.iter().copied().chain(samples).all(near)
}

/// Everything wrong with `figure` as `drawn`: each a sentence naming the figure's part.
pub fn problems(figure: &Figure, drawn: &Drawn) -> Vec<String> {
    let mut p = Vec::new();
    p.extend(axis_problems(drawn));
    if drawn.title.0 != drawn.title.1 {
        p.push(format!("the title `{}` is set as `{}`", drawn.title.0, drawn.title.1));
    }
    for (part, text) in labels(figure) {
        p.extend(raw_key(&text).map(|why| format!("{part} `{text}`: {why}")));
        p.extend(missing_glyphs(&text).map(|c| format!("{part} `{text}`: the font has no glyph for `{c}`")));
    }
    p.extend(colour_problems(figure, drawn));
    p.extend(hidden_lines(drawn));
    p
}

/// Every numeric axis has 3 or more labelled ticks; a value axis (`y`, `colour`, `difference`)
/// ends at ticks that enclose its data, the `x` axis spans its data.
pub fn axis_problems(drawn: &Drawn) -> Vec<String> {
    let mut p = Vec::new();
    for a in &drawn.axes {
        let labelled = a.axis.ticks.iter().filter(|t| !t.1.trim().is_empty()).count();
        if labelled < 3 {
            p.push(format!("the {} axis has {labelled} labelled ticks (3 or more)", a.name));
        }
        // Within a millionth of the axis's span of a tick is at it (float32 values of C at 1).
        let eps = 1e-6 * (a.axis.hi - a.axis.lo).abs().max(1e-300);
        let (lo, hi) = match a.name.as_str() {
            "x" => (a.axis.lo, a.axis.hi),
            _ => (a.axis.ticks.first().map_or(f64::NAN, |t| t.0), a.axis.ticks.last().map_or(f64::NAN, |t| t.0)),
        };
        if !(lo <= a.data.0 + eps && hi >= a.data.1 - eps) {
            let what = if a.name == "x" { "axis" } else { "ticks" };
            p.push(format!("the {} axis's data {:?} lie beyond its {what} ({lo}, {hi})", a.name, a.data));
        }
    }
    p
}

/// Every text a figure prints, with where it is: title, axis titles, legend labels, panel titles,
/// the colour bar's title, the arms' names.
pub fn labels(figure: &Figure) -> Vec<(&'static str, String)> {
    let mut out = vec![("the title", figure.chart.title().to_string())];
    match &figure.chart {
        Chart::Lines(c) | Chart::LogLog(c) => {
            out.extend([("the x axis title", c.x_label.clone()), ("the y axis title", c.y_label.clone())]);
            out.extend(c.series.iter().map(|s| ("a legend entry", s.label.clone())));
        }
        Chart::Heatmaps { panels, .. } => {
            for h in panels {
                out.extend([("a panel title", h.title.clone()), ("the colour bar's title", h.colorbar_label.clone())]);
                out.extend([("the x axis title", h.x_label.clone()), ("the y axis title", h.y_label.clone())]);
            }
        }
        Chart::Paired(c) => {
            out.extend([("the y axis title", c.y_label.clone()), ("the difference axis title", c.diff_label.clone())]);
            out.extend(c.arms.iter().map(|a| ("an arm's name", a.clone())));
        }
    }
    out.retain(|(_, t)| !t.is_empty());
    out
}

/// Why `text` reads as a config key or a file name rather than words, if it does: a `_`
/// (`final_loss`, `Δ_t`), a `=` after a word-long key (`kind=residual`), or a `.` between letters
/// (`eval.loss`).
pub fn raw_key(text: &str) -> Option<&'static str> {
    let c: Vec<char> = text.chars().collect();
    let letter = |i: usize| c.get(i).is_some_and(|c| c.is_alphabetic());
    if text.contains('_') {
        return Some("an underscore (a key, or TeX's subscript, where a display name or a subscript belongs)");
    }
    // A config or run name: a word of lower-case letters and digits with two or more hyphens
    // (`mixer-cifar2-cpu-hacn`, `crl-serpentine-cpu-d4`).
    let slug = |w: &str| {
        w.matches('-').count() >= 2 && w.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    if text.split([' ', ',', '(', ')', ':']).any(slug) {
        return Some("a config's or run's name (a slug), where `report.labels` or a display name belongs");
    }
    for i in 0..c.len() {
        // A key of two or more ASCII letters before an `=` (`kind=residual`, `topology_lr_mult=30`);
        // a symbol's value (`μ=0.25`, `a=1`) is how papers write it.
        let key = c[..i].iter().rev().take_while(|c| c.is_ascii_alphanumeric() || **c == '.').count();
        if c[i] == '=' && key >= 2 {
            return Some("a `key=value` (a setting as the config writes it, not in words)");
        }
        if c[i] == '.' && i > 0 && letter(i - 1) && letter(i + 1) {
            return Some("a dotted key (`eval.loss`), not a quantity's name");
        }
    }
    None
}

/// The characters of `text` the embedded font (DejaVu Sans) has no glyph for.
pub fn missing_glyphs(text: &str) -> impl Iterator<Item = char> + '_ {
    static FACE: std::sync::OnceLock<Option<ttf_parser::Face<'static>>> = std::sync::OnceLock::new();
    let face = FACE.get_or_init(|| ttf_parser::Face::parse(dejavu::sans::regular(), 0).ok());
    text.chars().filter(move |c| !c.is_whitespace() && face.as_ref().is_some_and(|f| f.glyph_index(*c).is_none()))
}

/// A colour in CIE L*a*b* (D65), for distances as the eye sees them.
pub fn lab(c: RGBColor) -> (f64, f64, f64) {
    let lin = |v: u8| {
        let v = f64::from(v) / 255.0;
        if v <= 0.04045 {
            v / 12.92
        } else {
            ((v + 0.055) / 1.055).powf(2.4)
        }
    };
    let (r, g, b) = (lin(c.0), lin(c.1), lin(c.2));
    let x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047;
    let y = 0.2126 * r + 0.7152 * g + 0.0722 * b;
    let z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883;
    let f = |t: f64| if t > 0.008856 { t.cbrt() } else { 7.787 * t + 16.0 / 116.0 };
    (116.0 * f(y) - 16.0, 500.0 * (f(x) - f(y)), 200.0 * (f(y) - f(z)))
}

/// The CIE76 distance ΔE between two colours: about 2.3 is the least the eye tells apart, 10 and
/// more reads as a different colour at a glance.
pub fn delta_e(a: RGBColor, b: RGBColor) -> f64 {
    let (p, q) = (lab(a), lab(b));
    ((p.0 - q.0).powi(2) + (p.1 - q.1).powi(2) + (p.2 - q.2).powi(2)).sqrt()
}

/// The contrast ratio of a colour against white (WCAG: 1 for white, 21 for black).
pub fn contrast_on_white(c: RGBColor) -> f64 {
    let (l, _, _) = lab(c);
    let y = if l > 8.0 { ((l + 16.0) / 116.0).powi(3) } else { l / 903.3 };
    1.05 / (y + 0.05)
}

/// The least ΔE between two curves drawn with the same line pattern.
pub const MIN_DELTA_E: f64 = 10.0;

/// The least contrast of a curve against the white page.
pub const MIN_CONTRAST: f64 = 2.0;

/// Curves of one pattern in colours the eye tells apart ([`MIN_DELTA_E`]), each dark enough on
/// white ([`MIN_CONTRAST`]); a claim's two arms likewise.
pub fn colour_problems(figure: &Figure, drawn: &Drawn) -> Vec<String> {
    let mut colours: Vec<(String, RGBColor, Dash)> =
        drawn.lines.iter().map(|l| (l.label.clone(), l.color, l.dash)).collect();
    if let Chart::Paired(c) = &figure.chart {
        colours.extend(c.arms.iter().zip(c.colors).map(|(a, c)| (a.clone(), c, Dash::Solid)));
    }
    let mut p = Vec::new();
    for (i, (a, ca, da)) in colours.iter().enumerate() {
        if contrast_on_white(*ca) < MIN_CONTRAST {
            p.push(format!(
                "`{a}` is drawn in {ca:?}, {:.2}:1 on white (at least {MIN_CONTRAST})",
                contrast_on_white(*ca)
            ));
        }
        for (b, cb, db) in &colours[i + 1..] {
            if da == db && delta_e(*ca, *cb) < MIN_DELTA_E {
                p.push(format!("`{a}` and `{b}` share a line pattern in colours ΔE {:.1} apart", delta_e(*ca, *cb)));
            }
        }
    }
    p
}

/// No curve hidden under a later one (drawn over it) without its points marked.
pub fn hidden_lines(drawn: &Drawn) -> Vec<String> {
    let tol = f64::from(pt(LINE_PT));
    let mut p = Vec::new();
    for (i, under) in drawn.lines.iter().enumerate() {
        if under.markers {
            continue;
        }
        if let Some(top) = drawn.lines[i + 1..].iter().find(|top| covers(&top.pixels, &under.pixels, tol)) {
            p.push(format!("`{}` is hidden under `{}`, its points unmarked", under.label, top.label));
        }
    }
    p
}
