//! What `plexus report` writes of a study: its tables in markdown, CSV and LaTeX (groups, their
//! statistics, the paired differences against the baseline), the claims' rows and verdicts, the
//! runs' values (runs.csv) and the overview of several studies' verdicts. The numbers come from
//! [`crate::study::build`]; this module only decides how they read.

use anyhow::Result;

/// A number with four significant digits (an exponent below 10⁻³ and from 10⁶).
pub fn sig4(x: f64) -> String {
    significant(x, 4)
}

/// Three significant digits, the same way.
fn sig3(x: f64) -> String {
    significant(x, 3)
}

/// `x` with `n` significant digits (1 ≤ n ≤ 7): fixed-point from 10⁻³ to below 10⁶, an exponent
/// outside; `—` for a non-finite value.
fn significant(x: f64, n: i32) -> String {
    if !x.is_finite() {
        return "—".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    if x.abs() < 1e-3 || x.abs() >= 1e6 {
        let p = (n - 1) as usize;
        return format!("{x:.p$e}");
    }
    let digits = (n - 1 - x.abs().log10().floor() as i32).clamp(0, 6) as usize;
    format!("{x:.digits$}")
}

/// `mean ± sd` with the standard deviation rounded to two significant figures and the mean to the
/// same decimal place (`0.446 ± 0.012`, `760 ± 160`); values below 10⁻³ or from 10⁶ share one
/// exponent (`(1.21 ± 0.14)e-12`). Without a spread (one run), four significant digits.
pub fn mean_pm_sd(mean: f64, sd: f64) -> String {
    if !mean.is_finite() {
        return "—".into();
    }
    if !sd.is_finite() {
        return sig4(mean);
    }
    if sd == 0.0 {
        return format!("{} ± 0", sig4(mean));
    }
    let exp =
        if mean != 0.0 && (mean.abs() < 1e-3 || mean.abs() >= 1e6) { mean.abs().log10().floor() as i32 } else { 0 };
    let (m, sd) = (mean / 10f64.powi(exp), sd / 10f64.powi(exp));
    let mut place = sd.log10().floor() as i32 - 1; // the second significant figure of sd
    if (sd / 10f64.powi(place)).round() >= 100.0 {
        place += 1; // 0.0996 rounds to 0.10, whose second figure is one place higher
    }
    let q = 10f64.powi(place);
    let (m, sd) = ((m / q).round() * q, (sd / q).round() * q);
    let decimals = (-place).max(0) as usize;
    let text = format!("{m:.decimals$} ± {sd:.decimals$}");
    if exp == 0 {
        text
    } else {
        format!("({text})e{exp}")
    }
}

/// How a report shows metric `i`: accuracies in percent, metrics on a log scale as geometric
/// means (`×÷` the geometric standard deviation) and their differences as ratios.
#[derive(Clone, Copy)]
struct Shown {
    percent: bool,
    log: bool,
}

impl Shown {
    fn of(r: &crate::study::StudyReport, i: usize) -> Shown {
        Shown { percent: crate::study::in_percent(&r.metrics[i]), log: r.log_scale[i] }
    }

    /// The metric's column title: its name, with `(%)` or `(geometric)`.
    fn title(&self, name: &str) -> String {
        match (self.percent, self.log) {
            (true, _) => format!("{name} (%)"),
            (_, true) => format!("{name} (geometric)"),
            _ => name.to_string(),
        }
    }

    /// A difference of the metric as a verdict's note says it: a ratio on a log scale (`×1.41`),
    /// points of an accuracy (`1.03 points`), else the number.
    fn amount(&self, x: f64) -> String {
        match (self.log, self.percent) {
            (true, _) => format!("×{}", sig3(x.exp())),
            (_, true) => format!("{} points", sig3(100.0 * x)),
            _ => sig3(x),
        }
    }

    fn unit(&self) -> f64 {
        if self.percent {
            100.0
        } else {
            1.0
        }
    }

    /// A group's statistic: `mean ± sd`, or `gm ×÷ gsd` on a log scale.
    fn cell(&self, s: &crate::study::stats::Stats) -> String {
        if self.log {
            return match s.n {
                1 => sig3(s.mean.exp()),
                _ => format!("{} ×÷ {:.2}", sig3(s.mean.exp()), s.sd.exp()),
            };
        }
        mean_pm_sd(s.mean * self.unit(), if s.n == 1 { f64::NAN } else { s.sd * self.unit() })
    }

    /// A value of the metric (a mean, an interval's end): a geometric value on a log scale.
    fn value(&self, v: f64) -> String {
        if self.log {
            sig3(v.exp())
        } else {
            sig3(v * self.unit())
        }
    }

    /// A difference (or, on a log scale, a ratio `×r`).
    fn diff(&self, v: f64) -> String {
        if self.log {
            format!("×{}", sig3(v.exp()))
        } else {
            sig3(v * self.unit())
        }
    }

    fn interval(&self, ci: Option<(f64, f64)>, of_diff: bool) -> String {
        let f = |v: f64| if of_diff { self.diff(v) } else { self.value(v) };
        ci.map_or("—".into(), |(lo, hi)| format!("[{}, {}]", f(lo), f(hi)))
    }
}

/// A p-value: `<0.001`, else three decimals; `—` where there is none (NaN).
fn p_text(p: f64) -> String {
    if p.is_nan() {
        "—".into()
    } else if p < 0.001 {
        "<0.001".into()
    } else {
        format!("{p:.3}")
    }
}

fn seeds_of(r: &crate::study::StudyReport, g: &crate::study::GroupResult) -> String {
    let mut s: Vec<u64> = g.runs.iter().filter_map(|&i| r.runs[i].seed()).collect();
    s.sort();
    s.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// `text` as one markdown table cell: `|` escaped, line breaks as spaces (a run or a config value
/// may hold either; unescaped, they split or end the row).
fn md_cell(text: &str) -> String {
    text.replace('\\', "\\\\").replace('|', "\\|").replace(['\r', '\n'], " ")
}

/// The report as markdown: a table of mean ± sd per setting and metric, then each metric's
/// 95 % interval and, with a baseline, the paired difference on shared seeds.
pub fn markdown(r: &crate::study::StudyReport) -> String {
    markdown_of(r, true)
}

/// The report's first table (mean ± sd per setting) and its claims, without the intervals and the
/// table of runs: `plexus report --format summary`, what docs/claims.md shows of each study.
pub fn summary(r: &crate::study::StudyReport) -> String {
    markdown_of(r, false)
}

/// The lines on the report's metrics that not every run has: those a run has yet to compute
/// (`analysis.*`, `fd.*`), and the speeds a run's loss never reaches within its steps.
fn missing_note(missing: &[String]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let (unreached, later): (Vec<&String>, Vec<&String>) =
        missing.iter().partition(|m| crate::study::sensitivity::derived_from_loss(m));
    if !later.is_empty() {
        let later: Vec<&str> = later.iter().map(|m| m.as_str()).collect();
        let _ = writeln!(
            s,
            "\nNot every run has {} yet (`analysis.*` come from `plexus analyze`, `fd.*` from `plexus fd`): left out.",
            later.join(", ")
        );
    }
    if !unreached.is_empty() {
        let unreached: Vec<&str> = unreached.iter().map(|m| m.as_str()).collect();
        let _ = writeln!(
            s,
            "\nNot every run's loss gets as low as {} asks within its steps: left out of the table.",
            unreached.join(", ")
        );
    }
    s
}

fn markdown_of(r: &crate::study::StudyReport, full: bool) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let by = if r.by.is_empty() { "all runs".to_string() } else { r.by.join(", ") };
    let _ = writeln!(
        s,
        "{} finished runs, grouped by {by}; cells are mean ± standard deviation over the runs (seeds) of a setting.",
        r.runs.len()
    );
    if !r.unfinished.is_empty() {
        let _ = writeln!(s, "\n{} runs not finished, left out: {}", r.unfinished.len(), names(&r.unfinished));
    }
    s.push_str(&missing_note(&r.missing));
    let key_cols: Vec<String> = if r.by.is_empty() { vec!["runs".into()] } else { r.by.clone() };
    let key_of = |g: &crate::study::GroupResult| {
        if r.by.is_empty() {
            vec!["all".to_string()]
        } else {
            g.key.iter().map(|k| md_cell(k)).collect()
        }
    };
    let shown: Vec<Shown> = (0..r.metrics.len()).map(|i| Shown::of(r, i)).collect();
    let titles: Vec<String> = r.metrics.iter().zip(&shown).map(|(m, sh)| sh.title(m)).collect();
    let _ = writeln!(s, "\n| {} | n | seeds | {} |", key_cols.join(" | "), titles.join(" | "));
    let _ = writeln!(s, "|{}", "---|".repeat(key_cols.len() + 2 + r.metrics.len()));
    for g in &r.groups {
        let cells: Vec<String> = g.stats.iter().zip(&shown).map(|(st, sh)| sh.cell(st)).collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            key_of(g).join(" | "),
            g.runs.len(),
            seeds_of(r, g),
            cells.join(" | ")
        );
    }
    if !full {
        if !r.claims.is_empty() {
            s.push('\n');
            s.push_str(&claims_markdown(&r.claims));
            if let Some(note) = &r.registration {
                s.push_str(&format!("\n{note}\n"));
            }
        }
        return s;
    }
    let _ = writeln!(
        s,
        "\n95 % intervals of the mean (Student t over the runs of a setting){}:",
        match &r.baseline {
            Some((k, v)) => format!("; Δ: this setting − {k}={v} on the same seeds (paired t-test)"),
            None => String::new(),
        }
    );
    let mut head = format!("\n| {} | metric | n | mean | 95 % CI |", key_cols.join(" | "));
    if r.baseline.is_some() {
        head.push_str(" Δ (pairs) | Δ 95 % CI | p |");
    }
    let _ = writeln!(s, "{head}");
    let _ = writeln!(s, "|{}", "---|".repeat(key_cols.len() + 4 + if r.baseline.is_some() { 3 } else { 0 }));
    for g in &r.groups {
        for (i, (st, d)) in g.stats.iter().zip(&g.vs_baseline).enumerate() {
            let sh = shown[i];
            let mut row = format!(
                "| {} | {} | {} | {} | {} |",
                key_of(g).join(" | "),
                titles[i],
                st.n,
                sh.value(st.mean),
                sh.interval(st.ci95, false)
            );
            if r.baseline.is_some() {
                row.push_str(&match d {
                    Some(p) => format!(
                        " {} ({}) | {} | {} |",
                        sh.diff(p.diff.mean),
                        p.diff.n,
                        sh.interval(p.diff.ci95, true),
                        p.p.map_or("—".into(), p_text)
                    ),
                    None if g.baseline_key.is_none() => " baseline | | |".into(),
                    None => " no shared seeds | | |".into(),
                });
            }
            let _ = writeln!(s, "{row}");
        }
    }
    let _ = writeln!(s, "\nEach run:\n\n| run | seed | {} |", titles.join(" | "));
    let _ = writeln!(s, "|{}", "---|".repeat(2 + r.metrics.len()));
    for g in &r.groups {
        for &i in &g.runs {
            let run = &r.runs[i];
            let name = run.dir.file_name().map_or(run.dir.display().to_string(), |n| n.to_string_lossy().into_owned());
            let cells: Vec<String> = r
                .metrics
                .iter()
                .zip(&shown)
                .map(|(m, sh)| sig4(run.metrics[m] * if sh.percent { 100.0 } else { 1.0 }))
                .collect();
            let seed = run.seed().map_or("—".into(), |s| s.to_string());
            let _ = writeln!(s, "| {} | {seed} | {} |", md_cell(&name), cells.join(" | "));
        }
    }
    if !r.claims.is_empty() {
        s.push('\n');
        s.push_str(&claims_markdown(&r.claims));
        if let Some(note) = &r.registration {
            s.push_str(&format!("\n{note}\n"));
        }
    }
    s
}

/// A claim's cells that its tables share: `[claim, source, metric, A vs B]` and `[n, Δ [interval]]`,
/// and how its metric is shown.
fn claim_cells(c: &crate::study::claims::ClaimResult) -> (Shown, [String; 4], [String; 2]) {
    use crate::study::claims::Scale;
    let cl = &c.claim;
    let sh = Shown {
        percent: cl.scale == Scale::Linear && crate::study::in_percent(&cl.metric),
        log: cl.scale == Scale::Log,
    };
    if cl.across_seeds.is_some() {
        // One arm, a vector metric: r̄ over the pairs of seeds and its bootstrap interval.
        let sh = Shown { percent: false, log: false };
        let head = [
            md_cell(&cl.id),
            md_cell(&cl.source),
            format!("{}[0..{}]", md_cell(&cl.metric), cl.size.unwrap_or(0)),
            format!("{} across seeds", md_cell(cl.a.as_str())),
        ];
        let (lo, hi) = c.interval;
        let stat =
            if c.diff.mean.is_finite() { format!("r̄ = {:.3} [{lo:.3}, {hi:.3}]", c.diff.mean) } else { "—".into() };
        return (sh, head, [c.diff.n.to_string(), stat]);
    }
    let id = match &cl.reregistered {
        Some(r) => format!("{} *(re-registered after results, {})*", md_cell(&cl.id), md_cell(&r.date)),
        None => md_cell(&cl.id),
    };
    let head = [
        id,
        md_cell(&cl.source),
        format!("{}{}", md_cell(&cl.metrics().join(" vs ")), if sh.percent { " (%)" } else { "" }),
        format!("{} vs {}", md_cell(cl.a.as_str()), md_cell(cl.b.as_str())),
    ];
    let stat = if c.diff.mean.is_finite() {
        format!("{} {}", sh.diff(c.diff.mean), sh.interval(Some(c.interval), true))
    } else {
        "—".into()
    };
    (sh, head, [c.diff.n.to_string(), stat])
}

/// Every claim of several studies, one row each (`plexus report … --format verdicts`): the study,
/// the claim, its source, its metric and arms, n, Δ with its corrected interval, p after Holm and the
/// verdict — the overview of a page of studies, each study's own table having the rest.
pub fn verdicts(studies: &[(String, Vec<crate::study::claims::ClaimResult>)]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| study | claim | source | metric | A vs B | n | Δ [interval: 1 − α/m; 1 − 2α/m for equivalence and \
         non-inferiority] | p (Holm) | verdict |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for (study, claims) in studies {
        for c in claims {
            let (sh, head, tail) = claim_cells(c);
            let _ = writeln!(
                s,
                "| `{}` | {} | {} | {} | **{}** |",
                md_cell(study),
                head.join(" | "),
                tail.join(" | "),
                p_text(c.p_holm),
                c.verdict_text(&|x| sh.amount(x))
            );
        }
    }
    // The error rate each verdict carries is its family's, not the page's.
    let mut families: std::collections::BTreeMap<(&String, &String), f64> = Default::default();
    for (study, cs) in studies {
        for c in cs {
            let a = families.entry((study, &c.claim.family)).or_insert(0.0);
            *a = a.max(c.claim.alpha);
        }
    }
    let bound = families.values().sum::<f64>().min(1.0);
    let total: usize = studies.iter().map(|(_, cs)| cs.len()).sum();
    let _ = writeln!(
        s,
        "\n{total} claims in {f} families. Holm's correction holds each family's chance of any false \"holds\" to \
         its α (0.05 unless a claim says otherwise); the page as a whole is not corrected: the chance of some false \
         \"holds\" among all {total} is bounded only by the sum of the families' α, {bound:.2}. Read a verdict \
         with its own family, not the page's count of them.",
        f = families.len()
    );
    s
}

/// The claims' verdicts as markdown: one row per claim, then each claim's statement and deviation.
pub fn claims_markdown(claims: &[crate::study::claims::ClaimResult]) -> String {
    use crate::study::claims::Expect;
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Claims, by the rule of docs/studies.md (\"Claims and verdicts\"): Δ = A − B over the seeds both \
         arms ran (on a log scale the ratio A/B), its interval at the level corrected for the family \
         (1 − α/m for a direction; 1 − 2α/m for equivalence and non-inferiority, the level of their \
         one-sided tests at α/m), p of the paired t-test (equivalence: TOST; non-inferiority: the \
         one-sided test against the margin) after Holm's correction, p_sf the exact sign-flip p of a \
         directional claim (it tests Δ = 0, not a margin: — on the others), and the smallest |Δ| these \
         seeds detect with 80 % power at α/m. A verdict that changes under another reading of the \
         claim's question (docs/studies.md, \"The sensitivity line\") is marked metric-sensitive.{}\n",
        if claims.iter().any(|c| c.claim.across_seeds.is_some()) {
            " A claim across seeds has one arm: r̄, the mean correlation of its vector over the pairs of seeds, its \
             bootstrap interval over seeds at the corrected level, and p of the layer permutations after Holm's \
             correction (docs/studies.md, \"Claims across seeds\")."
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "| claim | source | metric | A vs B | expected | n | Δ [interval] | p (Holm) | p_sf | detectable | verdict |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for c in claims {
        let cl = &c.claim;
        let (sh, head, tail) = claim_cells(c);
        let expected = match (cl.expect, cl.margin) {
            _ if cl.across_seeds.is_some() => "r̄ > permuted".to_string(),
            (Expect::Less, _) => "A < B".to_string(),
            (Expect::Greater, _) => "A > B".to_string(),
            (Expect::Equivalent, Some(m)) if sh.log => format!("A/B within ×÷{}", sig3(m.exp())),
            (Expect::Equivalent, Some(m)) => format!("|Δ| < {}", sig3(m * sh.unit())),
            (Expect::AtMost, Some(m)) if sh.log => format!("A/B < ×{}", sig3(m.exp())),
            (Expect::AtMost, Some(m)) => format!("A − B < {}", sig3(m * sh.unit())),
            (Expect::AtLeast, Some(m)) if sh.log => format!("A/B > ÷{}", sig3(m.exp())),
            (Expect::AtLeast, Some(m)) => format!("A − B > −{}", sig3(m * sh.unit())),
            (Expect::Equivalent | Expect::AtMost | Expect::AtLeast, None) => unreachable!("checked"),
        };
        let expected = match cl.margin_source.as_deref() {
            Some("plexus") if cl.margin.is_some() => format!("{expected} (plexus' margin)"),
            Some(source) if cl.margin.is_some() => format!("{expected} (margin: {})", md_cell(source)),
            _ => expected,
        };
        let detectable = match () {
            _ if !c.detectable.is_finite() => "—".to_string(),
            _ if sh.log => format!("×÷{}", sig3(c.detectable.exp())),
            _ => sig3(c.detectable * sh.unit()),
        };
        let _ = writeln!(
            s,
            "| {} | {expected} | {} | {} (raw {}, m = {}) | {} | {detectable} | **{}** |",
            head.join(" | "),
            tail.join(" | "),
            p_text(c.p_holm),
            p_text(c.p),
            c.family_size,
            match cl.expect {
                Expect::Less | Expect::Greater => c.p_sign_flip.map_or("—".into(), p_text),
                _ => "—".into(),
            },
            c.verdict_text(&|x| sh.amount(x))
        );
    }
    s.push('\n');
    for c in claims {
        let _ = write!(s, "- `{}`: {}", c.claim.id, c.claim.statement);
        if let Some(d) = &c.claim.deviation {
            let _ = write!(s, " *Deviation from the paper:* {d}");
        }
        if let Some(a) = &c.claim.amendment {
            let _ = write!(s, " *Amended after the runs ({}):* {} — {}", a.date, a.change, a.reason);
        }
        if let Some(r) = &c.claim.reregistered {
            let _ = write!(s, " *Re-registered after results ({}):* {} — {}", r.date, r.change, r.reason);
        }
        if !c.sensitivity.is_empty() {
            let readings: Vec<String> =
                c.sensitivity.iter().map(|(name, v)| format!("{name}: {}", v.short())).collect();
            let _ = write!(
                s,
                " *Under the other readings:* {}{}.",
                readings.join("; "),
                if c.metric_sensitive() { " — **metric-sensitive**" } else { " — the same verdict" }
            );
        }
        s.push('\n');
    }
    s
}

/// Each run of the report, one row each: its name, the config keys the report used (grouping keys,
/// the claims' arm keys and `seed`, as `config:KEY`) and its metrics at full precision (the table's
/// and the claims'). `plexus report RUNS.csv --spec SPEC` recomputes the report from it.
pub fn runs_csv(r: &crate::study::StudyReport) -> Result<String> {
    let mut keys: Vec<String> = r.by.clone();
    for c in &r.claims {
        for arm in [&c.claim.a, &c.claim.b] {
            keys.extend(arm.settings().iter().map(|(k, _)| k.clone()));
        }
    }
    keys.push("seed".into());
    // What each run was made under, where its sweep recorded it.
    for k in ["study.claims", "study.spec_commit"] {
        if r.runs.iter().any(|run| run.config.contains_key(k)) {
            keys.push(k.into());
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    keys.retain(|k| seen.insert(k.clone()));
    let mut metrics = r.metrics.clone();
    for c in &r.claims {
        for m in c.claim.metrics() {
            if !metrics.contains(&m) {
                metrics.push(m);
            }
        }
    }
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut head = vec!["run".to_string()];
    head.extend(keys.iter().map(|k| format!("{}{k}", crate::study::collect::CONFIG_COLUMN)));
    head.extend(metrics.iter().cloned());
    w.write_record(&head)?;
    for run in &r.runs {
        let name = run.dir.file_name().map_or(run.dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        let mut row = vec![name];
        row.extend(keys.iter().map(|k| run.config.get(k).cloned().unwrap_or_default()));
        row.extend(metrics.iter().map(|m| run.metrics.get(m).map_or(String::new(), |v| v.to_string())));
        w.write_record(&row)?;
    }
    Ok(String::from_utf8(w.into_inner()?)?)
}

fn names(dirs: &[std::path::PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.file_name().map_or(d.display().to_string(), |n| n.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The report as CSV, one row per setting and metric (machine-readable: full precision, empty
/// cells where a statistic does not exist).
pub fn csv(r: &crate::study::StudyReport) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut head: Vec<String> = r.by.clone();
    head.extend(
        [
            "metric",
            "n",
            "mean",
            "sd",
            "ci95_low",
            "ci95_high",
            "diff_n",
            "diff_mean",
            "diff_sd",
            "diff_ci95_low",
            "diff_ci95_high",
            "p",
            "scale",
        ]
        .map(String::from),
    );
    w.write_record(&head)?;
    for g in &r.groups {
        for (i, (m, (st, d))) in r.metrics.iter().zip(g.stats.iter().zip(&g.vs_baseline)).enumerate() {
            // On a log scale: the geometric mean, the geometric sd (a factor), the interval's
            // ends, and the ratio to the baseline with its interval; p is the same test's.
            let log = r.log_scale[i];
            let num = |x: Option<f64>| {
                x.map(|v| if log { v.exp() } else { v })
                    .filter(|v| v.is_finite())
                    .map_or(String::new(), |v| v.to_string())
            };
            let mut row = g.key.clone();
            row.push(m.clone());
            row.push(st.n.to_string());
            row.extend([Some(st.mean), Some(st.sd), st.ci95.map(|c| c.0), st.ci95.map(|c| c.1)].map(num));
            match d {
                Some(p) => {
                    row.push(p.diff.n.to_string());
                    row.extend(
                        [Some(p.diff.mean), Some(p.diff.sd), p.diff.ci95.map(|c| c.0), p.diff.ci95.map(|c| c.1), p.p]
                            .map(num),
                    );
                }
                None => row.extend(std::iter::repeat_n(String::new(), 6)),
            }
            // p is not a value of the metric: never exponentiated.
            if log {
                if let Some(p) = d.as_ref().and_then(|d| d.p) {
                    let n = row.len();
                    row[n - 1] = p.to_string();
                }
            }
            row.push(if log { "log" } else { "linear" }.into());
            w.write_record(&row)?;
        }
    }
    Ok(String::from_utf8(w.into_inner()?)?)
}

/// `s` as LaTeX text: its special characters escaped, and the symbols the tables use (Γ, μ, ×, ÷,
/// superscript exponents) in math mode, so that pdfLaTeX without Unicode fonts sets them.
fn tex(s: &str) -> String {
    let escaped = s
        .replace('\\', "\\textbackslash{}")
        .replace('_', "\\_")
        .replace('%', "\\%")
        .replace('&', "\\&")
        .replace('#', "\\#");
    let mut out = String::new();
    let mut chars = escaped.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            'Γ' => out.push_str("$\\Gamma$"),
            'μ' => out.push_str("$\\mu$"),
            'α' => out.push_str("$\\alpha$"),
            '×' => out.push_str("$\\times$"),
            '÷' => out.push_str("$\\div$"),
            '≤' => out.push_str("$\\le$"),
            '≥' => out.push_str("$\\ge$"),
            '−' => out.push_str("$-$"),
            '⁻' | '⁰'..='⁹' | '¹' | '²' | '³' => {
                let mut sup = String::new();
                let mut push = |c: char| match c {
                    '⁻' => sup.push('-'),
                    '⁰' => sup.push('0'),
                    '¹' => sup.push('1'),
                    '²' => sup.push('2'),
                    '³' => sup.push('3'),
                    c => sup.push(char::from_digit(c as u32 - '⁰' as u32, 10).unwrap_or('?')),
                };
                push(c);
                while let Some(&n) = chars.peek() {
                    if matches!(n, '⁻' | '⁰' | '¹' | '²' | '³' | '⁴'..='⁹') {
                        push(n);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push_str(&format!("$^{{{sup}}}$"));
            }
            c => out.push(c),
        }
    }
    out
}

/// A cell of the tables' math (`mean ± sd`, `gm ×÷ gsd`, an interval) as LaTeX math.
fn tex_math(cell: &str) -> String {
    format!(
        "${}$",
        cell.replace('±', "\\pm")
            .replace("×÷", "\\times\\!/\\!\\div")
            .replace('×', "\\times")
            .replace('—', "\\text{---}")
    )
}

/// The report as LaTeX (booktabs) tables, labelled for a paper: one row per setting with `mean ±
/// sd` per metric (keys, values and metrics by their display names: `topology`, `H-ACN`, `rate
/// (decades / 1,000 steps)`), then, where the report has claims, one row per claim with its
/// expected direction, n, Δ and interval, Holm's p and verdict.
pub fn latex(r: &crate::study::StudyReport) -> String {
    use crate::study::names;
    use std::fmt::Write;
    let mut s = String::new();
    let keys = r.by.len().max(1);
    let _ = writeln!(s, "% plexus report: mean ± standard deviation over seeds; needs \\usepackage{{booktabs}}");
    let _ = writeln!(s, "\\begin{{tabular}}{{{}r{}}}", "l".repeat(keys), "c".repeat(r.metrics.len()));
    let _ = writeln!(s, "\\toprule");
    let key_cols: Vec<String> =
        if r.by.is_empty() { vec!["runs".into()] } else { r.by.iter().map(|k| tex(&names::key(k))).collect() };
    let metric_cols: Vec<String> =
        r.metrics.iter().enumerate().map(|(i, m)| tex(&Shown::of(r, i).title(&names::metric(m)))).collect();
    let _ = writeln!(s, "{} & $n$ & {} \\\\", key_cols.join(" & "), metric_cols.join(" & "));
    let _ = writeln!(s, "\\midrule");
    for g in &r.groups {
        let key: Vec<String> = if r.by.is_empty() {
            vec!["all".into()]
        } else {
            r.by.iter().zip(&g.key).map(|(k, v)| tex(&names::value(k, v))).collect()
        };
        let cells: Vec<String> =
            g.stats.iter().enumerate().map(|(i, st)| tex_math(&Shown::of(r, i).cell(st))).collect();
        let _ = writeln!(s, "{} & {} & {} \\\\", key.join(" & "), g.runs.len(), cells.join(" & "));
    }
    let _ = writeln!(s, "\\bottomrule\n\\end{{tabular}}");
    if !r.claims.is_empty() {
        s.push_str(&latex_claims(&r.claims));
    }
    s
}

/// The claims as a LaTeX table: claim, metric, what is expected, n, Δ [interval], Holm's p and the
/// verdict (with its notes), under a caption line that names the levels.
fn latex_claims(claims: &[crate::study::claims::ClaimResult]) -> String {
    use crate::study::names;
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n% Claims (docs/studies.md): Δ = A − B over shared seeds (a ratio A/B on a log scale), its interval at \
         1 − α/m (1 − 2α/m for equivalence and non-inferiority), p after Holm's correction within the family."
    );
    let _ = writeln!(s, "\\begin{{tabular}}{{lllrclp{{4.5cm}}}}\n\\toprule");
    let _ =
        writeln!(s, "claim & metric & expected & $n$ & $\\Delta$ [interval] & $p$ (Holm) & verdict \\\\\n\\midrule");
    for c in claims {
        let (sh, head, tail) = claim_cells(c);
        let cl = &c.claim;
        let metric = tex(&cl.metrics().iter().map(|m| names::metric(m)).collect::<Vec<_>>().join(" vs "));
        let expected = match cl.expect {
            crate::study::claims::Expect::Less => "A < B",
            crate::study::claims::Expect::Greater => "A > B",
            crate::study::claims::Expect::Equivalent => "A ≈ B",
            crate::study::claims::Expect::AtMost => "A not above B",
            crate::study::claims::Expect::AtLeast => "A not below B",
        };
        let id = tex(&cl.id) + if cl.reregistered.is_some() { "$^\\dagger$" } else { "" };
        let _ = writeln!(
            s,
            "{id} & {metric}{} & {} & {} & {} & {} & {} \\\\",
            if sh.percent { " (\\%)" } else { "" },
            tex(expected),
            tail[0],
            tex_math(&tail[1]),
            tex(&p_text(c.p_holm)),
            tex(&c.verdict_text(&|x| sh.amount(x)))
        );
        let _ = head;
    }
    let _ = writeln!(s, "\\bottomrule\n\\end{{tabular}}");
    if claims.iter().any(|c| c.claim.reregistered.is_some()) {
        let _ = writeln!(s, "% $^\\dagger$ re-registered after the results of an earlier registration were seen.");
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_sd_has_two_significant_figures_and_the_mean_its_decimal_place() {
        use super::mean_pm_sd as pm;
        assert_eq!(pm(0.4463, 0.01239), "0.446 ± 0.012");
        assert_eq!(pm(762.0, 162.2), "760 ± 160");
        assert_eq!(pm(74.0, 5.477), "74.0 ± 5.5");
        assert_eq!(pm(1.208e-12, 1.426e-13), "(1.21 ± 0.14)e-12");
        assert_eq!(pm(0.25, 0.0996), "0.25 ± 0.10");
        assert_eq!(pm(60.0, 0.0), "60.00 ± 0");
        assert_eq!(pm(0.5, f64::NAN), "0.5000");
    }

    #[test]
    fn markdown_cells_escape_pipes_and_line_breaks() {
        assert_eq!(super::md_cell("a|b\nc\\d"), "a\\|b c\\\\d");
        assert_eq!(super::md_cell("plain-name=0.25"), "plain-name=0.25");
    }
}
