//! `plexus report`'s figures: each curve (loss, Γ, an eval metric over training; after `plexus
//! analyze`, a metric against the exit depth or the input noise) of every setting as its mean over
//! seeds with a band of ± one standard deviation. Accuracies are drawn in percent, as the tables
//! show them.

use super::{display_name, quantity, Chart, Dash, Figure, Kind, LineChart, Series, PALETTE};
use crate::study::claims::Arm;
use crate::study::{self, StudyReport};
use anyhow::Result;
use std::collections::BTreeMap;

/// One group's curve as drawn: its mean at each x with the band, `(x, mean, low, high)`.
type Band = Vec<(f64, f64, f64, f64)>;

/// Each group's band of the curve `name`: accuracies in percent; on a log scale (geometric mean
/// ×÷ geometric sd) where a loss spans decades; a layer-wise curve against the fraction of the
/// depth used (`i / L`, so that 8 sublayer units and 4 layers share one axis). → (bands, log).
fn group_bands(r: &StudyReport, name: &str) -> Result<(Vec<Band>, bool)> {
    let percent = study::in_percent(name);
    let scale = |band: Band| match percent {
        // A band held to 0–100 %: a mean + sd past 100 is not an accuracy any seed had.
        true => band
            .into_iter()
            .map(|(x, m, lo, hi)| (x, 100.0 * m, (100.0 * lo).max(0.0), (100.0 * hi).min(100.0)))
            .collect(),
        false => band,
    };
    let linear: Vec<Band> =
        r.groups.iter().map(|g| study::band(r, g, name, false).map(scale)).collect::<Result<_>>()?;
    let log_y = name.ends_with("loss") && super::spans_decades(linear.iter().flatten().map(|p| p.1));
    let mut bands = Vec::new();
    for (g, band) in r.groups.iter().zip(linear) {
        let mut band = if log_y { study::band(r, g, name, true)? } else { band };
        if name.starts_with("layerwise.") {
            let depth = band.iter().map(|p| p.0).fold(0.0, f64::max).max(1.0);
            band.iter_mut().for_each(|p| p.0 /= depth);
        }
        bands.push(band);
    }
    Ok((bands, log_y))
}

/// RL success: the baselines of the same tasks as flat grey dotted lines (their mean over runs).
fn rl_baselines(r: &StudyReport, series: &[Series]) -> Vec<Series> {
    let x_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(0.0, f64::max);
    let mut out = Vec::new();
    for (metric, label, grey) in
        [("straight_success", "straight at the goal", 60), ("random_success", "random policy", 150)]
    {
        let v: Vec<f64> = r.runs.iter().filter_map(|run| run.metrics.get(metric).copied()).collect();
        if !v.is_empty() {
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            out.push(Series {
                label: format!("{label} (mean of the runs' tasks)"),
                points: vec![(0.0, mean), (x_max, mean)],
                color: Some(plotters::style::RGBColor(grey, grey, grey)),
                band: None,
                dash: Dash::Dotted,
            });
        }
    }
    out
}

/// A report curve's title (the quantity in words, what the x axis varies, what the bands are) and
/// x axis title.
fn curve_titles(name: &str, y_label: &str, log_y: bool, seeds: &str, lm: bool) -> (String, &'static str) {
    let x = match name.split('.').next() {
        Some("success") => "environment steps",
        Some("layerwise") => "fraction of the depth used (i / L)",
        Some("noise") if lm => "character noise probability p",
        Some("noise") => "input noise σ",
        _ => "training step",
    };
    let mut title = y_label.split(" (").next().unwrap_or(y_label).to_string();
    if let Some(first) = title.get(..1) {
        title = first.to_uppercase() + &title[1..];
    }
    // What the x axis varies, in the title: the axis title stays short enough for a column.
    if name.starts_with("noise.") {
        title += " under input noise";
    }
    let title = match log_y {
        true => format!("{title}: geometric mean ×÷ geometric sd over {seeds}"),
        false => format!("{title}: mean ± sd over {seeds}"),
    };
    (title, x)
}

/// `curve-<name>` for each of the report's curves that the runs log: each group's mean over its
/// seeds with a band.
pub fn band_curves(r: &StudyReport) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    let labels = group_labels(r);
    let (unit, lm) = task_of(r);
    // Every group of one size: the title says it once, not each legend entry.
    let sizes: std::collections::BTreeSet<usize> = r.groups.iter().map(|g| g.runs.len()).collect();
    let one_n = (sizes.len() == 1).then(|| sizes.first().copied().unwrap_or(0));
    let colors = group_colors(r);
    for name in &r.curves {
        let (bands, log_y) = group_bands(r, name)?;
        let mut series = Vec::new();
        for (i, (g, band)) in r.groups.iter().zip(bands).enumerate() {
            if band.is_empty() {
                continue;
            }
            let label = match one_n {
                Some(_) => labels[i].clone(),
                None => format!("{} (n = {})", labels[i], g.runs.len()),
            };
            series.push(Series {
                label,
                points: band.iter().map(|&(x, m, _, _)| (x, m)).collect(),
                color: Some(colors[i].0),
                band: Some(band.iter().map(|&(_, _, lo, hi)| (lo, hi)).collect()),
                dash: colors[i].1,
            });
        }
        if series.is_empty() {
            continue;
        }
        if name == "success" {
            series.extend(rl_baselines(r, &series));
        }
        let y_label = quantity(name, unit);
        let seeds = one_n.map_or("seeds".to_string(), |n| format!("{n} seeds"));
        let (title, x) = curve_titles(name, &y_label, log_y, &seeds, lm);
        let chart = LineChart { title, x_label: x.into(), y_label, log_y, series };
        let file = format!("curve-{}", name.replace(['.', '/'], "_"));
        figures.push(Figure { file, kind: Kind::ReportCurve, chart: Chart::Lines(chart) });
    }
    Ok(figures)
}

/// `claim-<id>` for each of the report's claims: the metric of arm A and of arm B on each shared
/// seed (a log axis where the claim compares on a log scale), titled with the claim's quantity,
/// its mean difference and its verdict.
pub fn claim_figures(r: &StudyReport) -> Result<Vec<Figure>> {
    use crate::study::claims::Scale;
    let mut figures = Vec::new();
    for c in &r.claims {
        let cl = &c.claim;
        // Numbers no statistic could take (a value that is not finite) draw no figure either.
        if matches!(c.verdict, crate::study::claims::Verdict::NotComputable(_)) {
            continue;
        }
        if cl.across_seeds.is_some() {
            figures.push(profiles_figure(c));
            continue;
        }
        let log = cl.scale == Scale::Log;
        // Accuracies in percent, as the tables show them.
        let unit = match !log && cl.metrics().iter().all(|m| study::in_percent(m)) {
            true => 100.0,
            false => 1.0,
        };
        // Three significant digits, an exponent where the fixed point would hide them.
        let num = |v: f64| {
            match v.abs() {
                a if a != 0.0 && !(1e-3..1e6).contains(&a) => format!("{v:.2e}"),
                _ => format!("{v:.3}").trim_end_matches('0').trim_end_matches('.').to_string(),
            }
            .replacen('-', "−", 1)
        };
        let delta = match log {
            true => format!("A/B = ×{}", num(c.diff.mean.exp())),
            false => format!("Δ = {}", num(unit * c.diff.mean)),
        };
        let quantities: Vec<String> = cl.metrics().iter().map(|m| quantity(m, task_of(r).0)).collect();
        let metric = quantities.join(" vs ");
        // The differences in the unit they are judged in: A − B, or log(A/B) shown as the ratio.
        // The margin where the claim has one: ±m for equivalence, +m for "at most", −m for "at least".
        use crate::study::claims::Expect;
        let sides: Vec<f64> = match (cl.expect, cl.margin) {
            (Expect::Equivalent, Some(m)) => vec![-m, m],
            (Expect::AtMost, Some(m)) => vec![m],
            (Expect::AtLeast, Some(m)) => vec![-m],
            _ => vec![],
        };
        let (diffs, interval, margin) = match log {
            true => (
                c.values.iter().map(|v| v.0 / v.1).collect::<Vec<f64>>(),
                (c.interval.0.exp(), c.interval.1.exp()),
                sides.iter().map(|m| m.exp()).collect(),
            ),
            false => (
                c.values.iter().map(|v| unit * (v.0 - v.1)).collect(),
                (unit * c.interval.0, unit * c.interval.1),
                sides.iter().map(|m| unit * m).collect(),
            ),
        };
        let chart = super::Paired {
            // The claim's quantity, not its id: a figure in a paper is read without the spec.
            title: capitalised(&format!("{metric}: {delta}, {}", c.verdict)),
            y_label: shared_quantity(&quantities),
            arms: arm_names(cl, &quantities, &r.labels),
            colors: [arm_color(&cl.a, 0), arm_color(&cl.b, 1)],
            values: c.values.iter().map(|v| (unit * v.0, unit * v.1)).collect(),
            log,
            diff_label: if log { "A/B".into() } else { "Δ = A − B".into() },
            diffs,
            interval,
            margin,
        };
        let file = crate::study::claims::figure_stem(&cl.id);
        figures.push(Figure { file, kind: Kind::Claim, chart: Chart::Paired(chart) });
    }
    Ok(figures)
}

/// The names under a claim's two columns: its arms' ([`arm_label`]), or, where both columns are
/// one arm's runs under two metrics (Γ at the end against Γ at the start), the metrics'.
fn arm_names(
    cl: &crate::study::claims::Claim,
    quantities: &[String],
    labels: &BTreeMap<String, String>,
) -> [String; 2] {
    match (cl.a == cl.b, quantities) {
        (true, [qa, qb]) => [qa.clone(), qb.clone()],
        _ => [arm_label(&cl.a, labels), arm_label(&cl.b, labels)],
    }
}

/// A claim's y axis title: its one metric, or what its two metrics measure (`Γ when accuracy
/// first reaches 32.5 %` and `… 62.5 %` → `Γ`), the words they share up to a `when`, `at` or
/// `after`, else the two joined.
fn shared_quantity(quantities: &[String]) -> String {
    let [a, b] = quantities else { return quantities.join(" vs ") };
    let words: Vec<&str> = a.split(' ').zip(b.split(' ')).take_while(|(x, y)| x == y).map(|(x, _)| x).collect();
    match words.iter().position(|w| ["when", "at", "after"].contains(w)) {
        Some(k) if k > 0 => words[..k].join(" "),
        _ => format!("{a} vs {b}"),
    }
}

/// An arm as a legend names it: its label in the spec's `report.labels` (the arm as written, else
/// its one setting's value), else `topology.kind=hacn,topology.init.mu=0.25` → `H-ACN, μ = 0.25`.
fn arm_label(arm: &Arm, labels: &BTreeMap<String, String>) -> String {
    let named = labels.get(arm.as_str()).or(match arm.settings() {
        [(_, v)] => labels.get(v),
        _ => None,
    });
    named
        .cloned()
        .unwrap_or_else(|| arm.settings().iter().map(|(k, v)| setting_label(k, v)).collect::<Vec<_>>().join(", "))
}

/// An arm's colour: its topology's where it names one, else the palette's.
fn arm_color(arm: &Arm, i: usize) -> plotters::style::RGBColor {
    arm.settings()
        .iter()
        .find(|(k, _)| k.ends_with("topology.kind"))
        .map_or(PALETTE[i], |(_, v)| super::topology_color(v, 0))
}

/// One grouping key's value as a legend shows it: a topology by its name (`H-ACN`), a key by its
/// symbol (`μ = 0.25`), a config's name as it is.
fn setting_label(key: &str, value: &str) -> String {
    match short(key) {
        _ if key.ends_with("topology.kind") => display_name(value),
        "name" => value.to_string(),
        k => format!("{} = {value}", symbol(k)),
    }
}

/// The symbols the papers use for the usual keys.
fn symbol(key: &str) -> &str {
    match key {
        "mu" => "μ",
        "sigma" => "σ",
        "tau" => "τ",
        "lr" => "learning rate",
        "depth" => "depth",
        other => other,
    }
}

/// Each group's legend label from its grouping keys: a value's label in the spec's
/// `report.labels`, else configs' names shortened by the words they all start and end with
/// (`lnn-fig2b-none`, `lnn-fig2b-ancre` → `none`, `ancre`; `mixer-cifar10-cpu-hacn`,
/// `mixer-cifar2-cpu-hacn` → `cifar10`, `cifar2`).
fn group_labels(r: &StudyReport) -> Vec<String> {
    if r.by.is_empty() {
        return r.groups.iter().map(|_| "all runs".to_string()).collect();
    }
    let cuts: Vec<(usize, usize)> = (0..r.by.len())
        .map(|i| match r.by[i].as_str() {
            "name" => shared_words(&r.groups.iter().map(|g| g.key[i].as_str()).collect::<Vec<_>>()),
            _ => (0, 0),
        })
        .collect();
    r.groups
        .iter()
        .map(|g| {
            r.by.iter()
                .zip(&g.key)
                .zip(&cuts)
                .map(|((k, v), &(head, tail))| match r.labels.get(v) {
                    Some(label) => label.clone(),
                    None => setting_label(
                        k,
                        v.get(head..v.len().saturating_sub(tail)).filter(|s| !s.is_empty()).unwrap_or(v),
                    ),
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect()
}

/// How many bytes every one of `values` (two or more) starts with and ends with, cut at a word
/// boundary (`-` or `_`), so that each keeps at least one word of its own.
fn shared_words(values: &[&str]) -> (usize, usize) {
    let [first, rest @ ..] = values else { return (0, 0) };
    if rest.is_empty() {
        return (0, 0);
    }
    let common = |a: &[u8], b: &[u8]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let shortest = values.iter().map(|v| v.len()).min().unwrap_or(0);
    let head_n = rest.iter().map(|v| common(first.as_bytes(), v.as_bytes())).min().unwrap_or(0);
    let head = first.get(..head_n.min(shortest)).and_then(|p| p.rfind(['-', '_'])).map_or(0, |p| p + 1);
    let rev = |v: &str| v.bytes().rev().collect::<Vec<u8>>();
    let tail_n = rest.iter().map(|v| common(&rev(first), &rev(v))).min().unwrap_or(0).min(shortest - head);
    let tail = first.get(first.len() - tail_n..).and_then(|t| t.find(['-', '_'])).map_or(0, |p| tail_n - p);
    (head, tail)
}

/// What the report's runs' loss is measured in (for its axis title) and whether they are language
/// models (their noise is a character probability), from the first run's config.
fn task_of(r: &StudyReport) -> (&'static str, bool) {
    use crate::data::Task;
    let Some(run) = r.runs.first() else { return ("", false) };
    match crate::experiment::Experiment::of_run(&run.dir, &run.dir.join("config.yaml"), &[]).map(|e| e.task()) {
        Ok(Task::Classification) => (" (nats)", false),
        Ok(Task::LanguageModel) => (" (nats)", true),
        Ok(Task::Diffusion(_)) => (" (ε-MSE)", false),
        Ok(Task::HalfSumSquares) => (" (½ squared error)", false),
        // Runs read back from a runs.csv have no config.yaml here: their metrics say the task.
        Err(_) if run.metrics.contains_key("eval.perplexity") => (" (nats)", true),
        Err(_) if run.metrics.keys().any(|k| k.ends_with("accuracy")) => (" (nats)", false),
        Err(_) if run.metrics.keys().any(|k| k.starts_with("eps_by_t.") || k.starts_with("fd.")) => (" (ε-MSE)", false),
        Err(_) => ("", false),
    }
}

/// An `across_seeds` claim's figure: each seed's vector against its index (the residual weights
/// unit by unit), titled with r̄ and the verdict.
fn profiles_figure(c: &crate::study::claims::ClaimResult) -> Figure {
    let cl = &c.claim;
    let series = c
        .seeds
        .iter()
        .zip(&c.profiles)
        .enumerate()
        .map(|(k, (seed, v))| Series {
            label: format!("seed {seed}"),
            points: v.iter().enumerate().map(|(i, y)| (i as f64, *y)).collect(),
            color: Some(PALETTE[k % PALETTE.len()]),
            band: None,
            dash: Dash::Solid,
        })
        .collect();
    let chart = LineChart {
        // "mean r", not r̄: the combining macron is set beside the r, not over it, in the figures' font.
        title: capitalised(&format!(
            "{} of each seed: mean r = {:.3}, {} seeds, {}",
            vector_label(&cl.metric),
            c.diff.mean,
            c.seeds.len(),
            c.verdict
        )),
        x_label: "unit".into(),
        y_label: vector_label(&cl.metric),
        log_y: false,
        series,
    };
    let file = crate::study::claims::figure_stem(&cl.id);
    Figure { file, kind: Kind::ClaimProfiles, chart: Chart::Lines(chart) }
}

/// The axis title of a claim's vector metric (`final.a[0..8]` → `final residual weight a`).
fn vector_label(metric: &str) -> String {
    let name = metric.split('[').next().unwrap_or(metric);
    match name {
        "final.a" => "final residual weight a".into(),
        "initial.a" => "initial residual weight a".into(),
        other => other.to_string(),
    }
}

/// One colour per group: where every run of a group has one topology (`topology.kind`, or an RL
/// network's `network.topology.kind`), that topology's colour — the one `plexus plot` draws it in,
/// lightened and with its own line pattern for a second group of the same topology — so a
/// topology looks the same in every figure; otherwise the palette in group order, solid.
fn group_colors(r: &StudyReport) -> Vec<(plotters::style::RGBColor, Dash)> {
    let kind_of = |g: &crate::study::GroupResult| -> Option<String> {
        let kinds: std::collections::BTreeSet<&String> = g
            .runs
            .iter()
            .filter_map(|&i| {
                let c = &r.runs[i].config;
                c.get("topology.kind").or_else(|| c.get("network.topology.kind"))
            })
            .collect();
        match kinds.into_iter().collect::<Vec<_>>().as_slice() {
            [one]
                if g.runs.iter().all(|&i| {
                    let c = &r.runs[i].config;
                    c.contains_key("topology.kind") || c.contains_key("network.topology.kind")
                }) =>
            {
                Some((*one).clone())
            }
            _ => None,
        }
    };
    let kinds: Vec<Option<String>> = r.groups.iter().map(kind_of).collect();
    if kinds.iter().any(Option::is_none) {
        return (0..r.groups.len()).map(|i| (PALETTE[i % PALETTE.len()], Dash::Solid)).collect();
    }
    let mut seen: std::collections::HashMap<&String, usize> = std::collections::HashMap::new();
    kinds
        .iter()
        .map(|k| {
            let k = k.as_ref().expect("checked");
            let v = seen.entry(k).or_default();
            *v += 1;
            (super::topology_color(k, *v - 1), Dash::of_variant(*v - 1))
        })
        .collect()
}

/// `topology.init.mu` → `mu` in legends.
fn short(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

/// `text` with its first letter upper-case, as a figure's title starts.
fn capitalised(text: &str) -> String {
    let mut c = text.chars();
    c.next().map_or_else(String::new, |f| f.to_uppercase().chain(c).collect())
}

#[cfg(test)]
mod tests {
    use super::shared_words;

    /// What a legend drops of configs' names: the words every one starts and ends with, never a
    /// part of a word or a whole name.
    #[test]
    fn names_lose_the_words_they_share() {
        let cut = |values: &[&str]| {
            let (head, tail) = shared_words(values);
            values.iter().map(|v| v[head..v.len() - tail].to_string()).collect::<Vec<_>>()
        };
        assert_eq!(cut(&["lnn-fig2b-none", "lnn-fig2b-ancre"]), ["none", "ancre"]);
        assert_eq!(cut(&["mixer-cifar10-cpu-hacn", "mixer-cifar2-cpu-hacn"]), ["cifar10", "cifar2"]);
        assert_eq!(cut(&["lnn-fig2b-0to1", "lnn-fig2b-0to2"]), ["0to1", "0to2"]);
        assert_eq!(cut(&["res-a", "acn-a"]), ["res", "acn"]);
        assert_eq!(cut(&["ab-x", "ab-x-y"]), ["x", "x-y"]);
        assert_eq!(cut(&["only"]), ["only"]);
        assert_eq!(shared_words(&["é-a", "é-b"]), (3, 0));
    }
}
