//! Studies over seeds: `plexus sweep` plans a grid of configs × `--set` values × seeds and runs
//! each point as an ordinary run directory under one sweep folder ([`spec`], [`runner`]);
//! `plexus report` reads finished runs back, groups them by config keys and gives each metric's
//! mean, standard deviation, n and 95 % interval, and the paired difference against a baseline
//! on the same seeds ([`collect`], [`stats`]).

pub mod claims;
pub mod collect;
pub mod manifest;
pub mod metric;
pub mod names;
pub mod runner;
pub mod runs_table;
pub mod sensitivity;
pub mod spec;
pub mod stats;
pub mod sweep;

use anyhow::{bail, Result};
use collect::RunRecord;
pub use manifest::{Manifest, Registration, MANIFEST, REGISTRATION_FILE};
use spec::{PlannedRun, ReportSpec, SweepSpec};
use stats::{Paired, Stats};
use std::path::PathBuf;

/// The runs a sweep plans as a report will read them: each run's resolved config (its
/// `config.yaml` once it trains), flattened, with no metrics yet; for checking claims before
/// training ([`claims::check_against_plan`]).
pub fn planned_records(runs: &[PlannedRun]) -> Result<Vec<RunRecord>> {
    use anyhow::Context;
    runs.iter()
        .map(|run| {
            let yaml = runner::resolved_yaml(run).with_context(|| format!("sweep run {}", run.name))?;
            Ok(RunRecord {
                dir: PathBuf::from(&run.name),
                config: collect::flatten_config(&yaml)?,
                metrics: Default::default(),
                curves: Default::default(),
            })
        })
        .collect()
}

/// What to report; `None`/empty fields fall back to the sweep's `report:` section, then to
/// defaults (see [`ReportSpec`]).
pub type ReportOptions = ReportSpec;

/// One group of runs (one setting) and its statistics.
#[derive(Debug, Clone)]
pub struct GroupResult {
    /// The values of the grouping keys.
    pub key: Vec<String>,
    /// Indices into [`StudyReport::runs`].
    pub runs: Vec<usize>,
    /// Per metric: its statistics over the group's runs (of `ln` values where
    /// [`StudyReport::log_scale`] says so).
    pub stats: Vec<Stats>,
    /// Per metric: the paired difference (this group − the baseline group) on shared seeds;
    /// `None` for the baseline itself, or without a baseline or shared seeds.
    pub vs_baseline: Vec<Option<Paired>>,
    /// The baseline group's key, when this group has one.
    pub baseline_key: Option<Vec<String>>,
}

/// A report over runs: groups by config keys, a statistic per metric.
#[derive(Debug, Clone)]
pub struct StudyReport {
    pub by: Vec<String>,
    pub metrics: Vec<String>,
    /// Per metric: whether its statistics (and paired differences) are of `ln` values — positive
    /// metrics whose runs span two decades or more; shown as geometric means and ratios.
    pub log_scale: Vec<bool>,
    /// `(key, value)` of the baseline setting.
    pub baseline: Option<(String, String)>,
    pub groups: Vec<GroupResult>,
    pub runs: Vec<RunRecord>,
    /// Runs found but not finished (no `summary.json`): left out.
    pub unfinished: Vec<PathBuf>,
    /// Curves to draw with a band over seeds.
    pub curves: Vec<String>,
    /// Metrics of the sweep's `report:` section that not every run has yet (e.g. `analysis.*`
    /// before `plexus analyze`): left out of the tables.
    pub missing: Vec<String>,
    /// The study's claims and their verdicts ([`claims`]).
    pub claims: Vec<claims::ClaimResult>,
    /// Runs made under other claims than these, said in a sentence (see `registration_note`).
    pub registration: Option<String>,
    /// Printed width and file formats of the figures: the options', else the spec's `report:`
    /// section's (`None`: the defaults).
    pub width: Option<String>,
    pub formats: Option<String>,
    /// The legends' names for grouping values and arms: the spec's `report.labels`, the
    /// options' over them.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Metrics a table shows by default, in this order, when every run has them: each kind's
/// ([`crate::kinds::RunKind::preferred_metrics`]).
fn preferred() -> Vec<&'static str> {
    crate::kinds::KINDS.iter().flat_map(|k| k.preferred_metrics().iter().copied()).collect()
}

/// Reads the runs `paths` stand for (see [`collect::find_runs`]; or the rows of a report's
/// `runs.csv`) and computes the report, with the claims of `spec` (else of the sweep folder's own
/// spec) and their verdicts. `spec`'s `report:` section also fills what `opts` leaves open.
///
/// In stages: the runs ([`collect_runs`]), what the report shows of them (grouping keys, metrics,
/// baseline, curves, scales), each group's statistics ([`group_statistics`]), then the claims
/// ([`judge_claims`]).
pub fn build(paths: &[PathBuf], opts: &ReportOptions, spec: Option<&SweepSpec>) -> Result<StudyReport> {
    let paths = distinct(paths);
    let (from_sweep, axes, claims) = sweep_settings(spec, &paths)?;
    // `CURVE@STEP` values read from the runs' curves, and the speeds read from the loss curve
    // where a run's record lacks them (`decades_per_1k`): the claims' and the table's.
    let at_step: Vec<String> = claims
        .iter()
        .flat_map(|c| c.metrics())
        .chain(opts.metrics.iter().chain(&from_sweep.metrics).cloned())
        .filter(|m| m.contains('@') || sensitivity::derived_from_loss(m))
        .collect();
    let Collected { runs, unfinished, from_tables } = collect_runs(&paths, &at_step)?;
    let by = grouping_keys(opts, &from_sweep, axes, &runs)?;
    let (metrics, mut missing) = report_metrics(opts, &from_sweep, &runs)?;
    let baseline = baseline_setting(opts, &from_sweep, &by, &runs)?;
    let curves = report_curves(opts, &from_sweep, &runs, from_tables)?;
    let log_scale = log_scales(&metrics, &runs);
    let groups = group_statistics(&runs, &by, &metrics, &log_scale, baseline.as_ref());
    let (claims, registration) = judge_claims(claims, spec.is_some(), &runs, &mut missing)?;
    let labels = legend_labels(opts, &from_sweep, &groups, &claims);
    Ok(StudyReport {
        by,
        metrics,
        log_scale,
        baseline,
        groups,
        runs,
        unfinished,
        curves,
        missing,
        claims,
        registration,
        width: opts.width.clone().or(from_sweep.width.clone()),
        formats: opts.formats.clone().or(from_sweep.formats.clone()),
        labels,
    })
}

/// The legends' names: the spec's `report.labels`, the options' over them. A label that names no
/// grouping value and no claim's arm (or its one setting's value) of these runs is said, as a
/// misspelt one would otherwise be silently unused.
fn legend_labels(
    opts: &ReportOptions,
    from_sweep: &ReportSpec,
    groups: &[GroupResult],
    claims: &[claims::ClaimResult],
) -> std::collections::BTreeMap<String, String> {
    let labels: std::collections::BTreeMap<String, String> =
        from_sweep.labels.iter().chain(&opts.labels).map(|(k, v)| (k.clone(), v.clone())).collect();
    let arms = claims.iter().flat_map(|c| [&c.claim.a, &c.claim.b]);
    let named: std::collections::BTreeSet<&str> = groups
        .iter()
        .flat_map(|g| g.key.iter().map(String::as_str))
        .chain(arms.flat_map(|a| std::iter::once(a.as_str()).chain(a.settings().iter().map(|(_, v)| v.as_str()))))
        .collect();
    let unused: Vec<&str> = labels.keys().map(String::as_str).filter(|k| !named.contains(k)).collect();
    if !unused.is_empty() {
        eprintln!(
            "report: report.labels names {} that no group or claim arm of these runs has: {}",
            if unused.len() == 1 { "a value" } else { "values" },
            unused.join(", ")
        );
    }
    labels
}

/// `paths` with a folder given twice read once (`report SWEEP SWEEP` is `report SWEEP`), said.
fn distinct(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut seen = std::collections::BTreeSet::new();
    let (paths, twice): (Vec<PathBuf>, Vec<PathBuf>) =
        paths.iter().cloned().partition(|p| seen.insert(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())));
    if !twice.is_empty() {
        let names: Vec<String> = twice.iter().map(|p| p.display().to_string()).collect();
        eprintln!("report: {} given more than once, read once", names.join(", "));
    }
    paths
}

/// The sweep behind the report — `spec`, else a single sweep folder's own — as its `report:`
/// section (what the options leave open), its axes (its configs by `name` where it has several,
/// and its grid keys) and its claims; defaults and none without a sweep.
fn sweep_settings(
    spec: Option<&SweepSpec>,
    paths: &[PathBuf],
) -> Result<(ReportSpec, Vec<String>, Vec<claims::Claim>)> {
    let sweep_spec = match (spec, paths) {
        (Some(s), _) => Some(s.clone()),
        (None, [one]) if one.join(MANIFEST).is_file() => Some(Manifest::read(one)?.spec),
        _ => None,
    };
    Ok(match sweep_spec {
        Some(s) => {
            let mut axes: Vec<String> = if s.configs.len() > 1 { vec!["name".into()] } else { vec![] };
            axes.extend(s.grid.keys().filter_map(|k| k.as_str().map(String::from)));
            (s.report, axes, s.claims)
        }
        None => (ReportSpec::default(), vec![], vec![]),
    })
}

/// The runs a report reads ([`collect_runs`]).
struct Collected {
    /// Finished runs, with each `CURVE@STEP` value asked for among their metrics.
    runs: Vec<RunRecord>,
    /// Run directories without `summary.json`: left out.
    unfinished: Vec<PathBuf>,
    /// Whether the runs came from runs.csv tables rather than run directories.
    from_tables: bool,
}

/// Reads the runs: from run directories and sweep folders, or from a report's runs.csv files (not
/// both). The value of each metric of `at_step` (`CURVE@STEP`, a claim's or the table's) becomes a
/// metric of each run that logs it (and a column of runs.csv). At least one run must be finished.
fn collect_runs(paths: &[PathBuf], at_step: &[String]) -> Result<Collected> {
    let mut runs = Vec::new();
    let mut unfinished = Vec::new();
    // Anything that exists and is not a directory is read as a table (a device or FIFO is then
    // refused as not a regular file, rather than looked for as a folder of runs).
    let tables: Vec<&PathBuf> = paths.iter().filter(|p| p.exists() && !p.is_dir()).collect();
    let from_tables = !tables.is_empty();
    if from_tables {
        if tables.len() < paths.len() {
            bail!("give either run directories and sweep folders, or a report's runs.csv files, not both");
        }
        runs = collect::read_runs_tables(&tables.iter().map(|t| t.as_path()).collect::<Vec<_>>())?;
    } else {
        for d in collect::find_runs(paths)? {
            match collect::read_run(&d)? {
                Some(r) => runs.push(r),
                None => unfinished.push(d),
            }
        }
    }
    for m in at_step {
        for r in runs.iter_mut() {
            if !r.metrics.contains_key(m) {
                if let Ok(v) = claims::metric_value(r, m) {
                    r.metrics.insert(m.clone(), v);
                }
            }
        }
    }
    if runs.is_empty() {
        bail!(
            "no finished run (with summary.json) among {} run director{}{}",
            unfinished.len(),
            if unfinished.len() == 1 { "y" } else { "ies" },
            unfinished.first().map(|d| format!(", e.g. {}", d.display())).unwrap_or_default()
        );
    }
    Ok(Collected { runs, unfinished, from_tables })
}

/// `a` unless it is empty, else `b`: an option over the sweep's `report:` section.
fn first_given(a: &[String], b: &[String]) -> Vec<String> {
    (if a.is_empty() { b } else { a }).to_vec()
}

/// The keys the runs are grouped by: `--by`, else the sweep's `report: by`, else its axes, else
/// the config keys whose values differ between runs. Each must be in some run's config.
fn grouping_keys(
    opts: &ReportOptions,
    from_sweep: &ReportSpec,
    axes: Vec<String>,
    runs: &[RunRecord],
) -> Result<Vec<String>> {
    let mut by = first_given(&opts.by, &first_given(&from_sweep.by, &axes));
    if by.is_empty() {
        by = collect::varying_keys(runs);
    }
    for k in &by {
        if !runs.iter().any(|r| r.config.contains_key(k)) {
            bail!("--by {k}: no run's config has this key (keys are written as in --set, e.g. topology.init.mu)");
        }
    }
    Ok(by)
}

/// The metrics of the tables, and those of the sweep's spec that not every run has yet. Metrics
/// asked for on the command line must exist in every run; those of the sweep's spec may wait for
/// `plexus analyze` and are left out (and named) until every run has them; without either, the
/// [`preferred`] ones every run has, else every metric every run has.
fn report_metrics(
    opts: &ReportOptions,
    from_sweep: &ReportSpec,
    runs: &[RunRecord],
) -> Result<(Vec<String>, Vec<String>)> {
    let common = |m: &str| runs.iter().all(|r| r.metrics.contains_key(m));
    let mut missing = Vec::new();
    let metrics = if !opts.metrics.is_empty() {
        for name in &opts.metrics {
            if let Some(r) = runs.iter().find(|r| !r.metrics.contains_key(name)) {
                if name.contains('@') || sensitivity::derived_from_loss(name) {
                    // Its own error: the curve missing, or the steps it is logged at.
                    claims::metric_value(r, name).map_err(|e| anyhow::anyhow!("--metric {name}: {e}"))?;
                }
                bail!(
                    "--metric {name}: run {} has no such metric; it has: {}",
                    r.dir.display(),
                    r.metrics.keys().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                );
            }
        }
        opts.metrics.clone()
    } else if !from_sweep.metrics.is_empty() {
        let (have, lack): (Vec<String>, Vec<String>) = from_sweep.metrics.iter().cloned().partition(|m| common(m));
        missing = lack;
        have
    } else {
        let mut m: Vec<String> = preferred().iter().filter(|m| common(m)).map(|s| s.to_string()).collect();
        if m.is_empty() {
            m = runs[0].metrics.keys().filter(|k| common(k)).cloned().collect();
        }
        m
    };
    if metrics.is_empty() {
        bail!(
            "no metric is in every run{}",
            if missing.is_empty() { String::new() } else { format!(" (asked for: {})", missing.join(", ")) }
        );
    }
    Ok((metrics, missing))
}

/// The baseline setting `(key, value)`: `--baseline KEY=VALUE`, else the sweep's; its key must be
/// a grouping key and some run must have the value.
fn baseline_setting(
    opts: &ReportOptions,
    from_sweep: &ReportSpec,
    by: &[String],
    runs: &[RunRecord],
) -> Result<Option<(String, String)>> {
    let Some(b) = opts.baseline.clone().or(from_sweep.baseline.clone()) else {
        return Ok(None);
    };
    let Some((k, v)) = claims::key_value(&b) else {
        bail!("--baseline {b}: expected KEY=VALUE, e.g. --baseline topology.kind=residual");
    };
    let (k, v) = (k.to_string(), v.to_string());
    let Some(pos) = by.iter().position(|x| *x == k) else {
        bail!("--baseline {b}: `{k}` is not one of the keys the runs are grouped by ({})", by.join(", "));
    };
    if !runs.iter().any(|r| r.config.get(&by[pos]) == Some(&v)) {
        let mut seen: Vec<&String> = runs.iter().filter_map(|r| r.config.get(&k)).collect();
        seen.sort();
        seen.dedup();
        bail!(
            "--baseline {b}: no run has {k} = {v}; the runs have {}",
            seen.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(Some((k, v)))
}

/// The curves drawn with a band over seeds: `--curves` (each logged by some run, else nothing
/// would be drawn), else the sweep's, else those of loss, Γ and success every run logs; none for
/// runs read back from a runs.csv without its curves table.
fn report_curves(
    opts: &ReportOptions,
    from_sweep: &ReportSpec,
    runs: &[RunRecord],
    from_tables: bool,
) -> Result<Vec<String>> {
    let mut curves = first_given(&opts.curves, &from_sweep.curves);
    for c in &opts.curves {
        if !runs.iter().any(|r| r.curve(c).is_ok_and(|p| !p.is_empty())) {
            let logged = runs[0].curve_names();
            bail!(
                "--curves {c}: no run logs this curve; {} logs {}",
                runs[0].dir.display(),
                if logged.is_empty() { "none".to_string() } else { logged.join(", ") }
            );
        }
    }
    if curves.is_empty() {
        curves = crate::kinds::KINDS
            .iter()
            .flat_map(|k| k.default_curves().iter().copied())
            .filter(|c| runs.iter().all(|r| r.curve(c).is_ok_and(|p| !p.is_empty())))
            .map(String::from)
            .collect();
    }
    if from_tables && runs.iter().any(|r| r.curves.is_empty()) {
        curves.clear();
    }
    Ok(curves)
}

/// Per metric, whether its statistics are of `ln` values: positive metrics that span two decades
/// or more over the runs (losses near round-off, say) get a geometric mean and an interval of the
/// log, which an arithmetic interval (reaching below zero) is not.
fn log_scales(metrics: &[String], runs: &[RunRecord]) -> Vec<bool> {
    metrics
        .iter()
        .map(|m| {
            let vs: Vec<f64> = runs.iter().map(|r| r.metrics[m]).collect();
            let (lo, hi) = vs.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            lo > 0.0 && hi / lo >= 100.0
        })
        .collect()
}

/// The runs grouped by `by`, each group with every metric's statistics and its paired difference
/// from the baseline group on shared seeds (of `ln` values where `log_scale` says so).
fn group_statistics(
    runs: &[RunRecord],
    by: &[String],
    metrics: &[String],
    log_scale: &[bool],
    baseline: Option<&(String, String)>,
) -> Vec<GroupResult> {
    let value = |log: bool, v: f64| if log { v.ln() } else { v };
    let grouped = collect::group(runs, by);
    grouped
        .iter()
        .map(|(key, members)| {
            let stats = metrics
                .iter()
                .zip(log_scale)
                .map(|(m, &log)| {
                    stats::describe(&members.iter().map(|&i| value(log, runs[i].metrics[m])).collect::<Vec<_>>())
                })
                .collect();
            let baseline_key = baseline.and_then(|(k, v)| {
                let pos = by.iter().position(|x| x == k)?;
                if key[pos] == *v {
                    return None;
                }
                let mut bk = key.clone();
                bk[pos] = v.clone();
                Some(bk)
            });
            let partner = baseline_key.as_ref().and_then(|bk| baseline_group(&grouped, bk, by));
            let vs_baseline = metrics
                .iter()
                .zip(log_scale)
                .map(|(m, &log)| {
                    let (_, base) = partner?;
                    let pairs: Vec<(f64, f64)> = members
                        .iter()
                        .filter_map(|&i| {
                            let s = runs[i].seed()?;
                            let j = base.iter().find(|&&j| runs[j].seed() == Some(s))?;
                            Some((value(log, runs[i].metrics[m]), value(log, runs[*j].metrics[m])))
                        })
                        .collect();
                    (!pairs.is_empty()).then(|| stats::paired(&pairs))
                })
                .collect();
            GroupResult { key: key.clone(), runs: members.clone(), stats, vs_baseline, baseline_key }
        })
        .collect()
}

/// The group a group is compared with: the one whose key is `baseline_key`. Grouped by keys that
/// go with the setting (one config file per setting, each with its own `name`; options only the
/// other topology has, absent in the baseline: "—"), the baseline's group differs in those too:
/// it is then the one group that has the baseline value and agrees on every other key it has.
fn baseline_group<'a>(
    grouped: &'a [(Vec<String>, Vec<usize>)],
    baseline_key: &[String],
    by: &[String],
) -> Option<&'a (Vec<String>, Vec<usize>)> {
    let name_pos = by.iter().position(|x| x == "name");
    grouped.iter().find(|(k, _)| k == baseline_key).or_else(|| {
        let same = |k: &Vec<String>| {
            k.iter().zip(baseline_key).enumerate().all(|(i, (a, b))| Some(i) == name_pos || a == b || a == "—")
        };
        let mut found = grouped.iter().filter(|(k, _)| same(k));
        match (found.next(), found.next()) {
            (Some(one), None) => Some(one),
            _ => None,
        }
    })
}

/// The claims' verdicts, and the sentence on runs made under other claims. A claim whose metric
/// not every run has yet (`analysis.*` before `plexus analyze`, `fd.*` before `plexus fd`) waits,
/// named in `missing`; asked for with `--spec` (`with_spec`), the claims are the point, and a
/// missing metric is an error. The fingerprint covers the claims as written, waiting ones too.
fn judge_claims(
    claims: Vec<claims::Claim>,
    with_spec: bool,
    runs: &[RunRecord],
    missing: &mut Vec<String>,
) -> Result<(Vec<claims::ClaimResult>, Option<String>)> {
    let registration = registration_note(&claims, runs);
    let (ready, waiting): (Vec<claims::Claim>, Vec<claims::Claim>) = claims.into_iter().partition(|c| {
        with_spec
            || runs.iter().all(|r| claims::metrics_read_from(c, r).iter().all(|m| claims::metric_value(r, m).is_ok()))
    });
    missing.extend(waiting.iter().map(|c| format!("{} (claim `{}`)", c.metrics().join(", "), c.id)));
    Ok((claims::evaluate(&ready, runs)?, registration))
}

/// Where runs record the claims they were made under (`study.claims`, from their sweep's
/// `study.json`) and some differ from `claims` (the report's): a sentence naming how many, the two
/// fingerprints and the specs' commits, for the page beside the verdicts. `None` when every run
/// agrees, or none records it (runs of plexus before 2026-11-28, a runs.csv without the column).
fn registration_note(claims: &[claims::Claim], runs: &[RunRecord]) -> Option<String> {
    if claims.is_empty() {
        return None;
    }
    let now = claims::claims_fingerprint(claims);
    let recorded: Vec<&RunRecord> = runs.iter().filter(|r| r.config.contains_key("study.claims")).collect();
    let other: Vec<&&RunRecord> = recorded.iter().filter(|r| r.config["study.claims"] != now).collect();
    if other.is_empty() {
        return None;
    }
    let mut theirs: Vec<String> = other
        .iter()
        .map(|r| {
            let commit = r.config.get("study.spec_commit").map_or("?", String::as_str);
            format!("{} (spec at {commit})", r.config["study.claims"])
        })
        .collect();
    theirs.sort();
    theirs.dedup();
    Some(format!(
        "**Made under other claims:** {} of the {} runs that record it were made under claims other than these \
         (fingerprint {now}; theirs: {}): a claim was written or changed after those runs — see each claim's \
         amendment, and read its verdict as not pre-registered for them.",
        other.len(),
        recorded.len(),
        theirs.join(", ")
    ))
}

/// The report's curves, every run's logged points, as a table `run,curve,x,y` (runs named as in
/// runs.csv): written beside runs.csv as `runs.curves.csv`, so that a report recomputed from the
/// tables (`plexus report runs.csv --spec …`) draws the same curves as the runs did.
pub fn curves_csv(r: &StudyReport) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["run", "curve", "x", "y"])?;
    for run in &r.runs {
        let name = run.dir.file_name().map_or(run.dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        for c in &r.curves {
            for (x, y) in run.curve(c)? {
                w.write_record([name.clone(), c.clone(), x.to_string(), y.to_string()])?;
            }
        }
    }
    Ok(String::from_utf8(w.into_inner()?)?)
}

/// Whether `metric` is an accuracy (or a drop of one), which tables and figures show in percent:
/// in every form (`eval.accuracy`, `eval.accuracy@400`; [`metric::Metric`]).
pub fn in_percent(metric: &str) -> bool {
    metric::is_accuracy(metric)
}

/// The curve `name` of a group over its runs: at each step every run logged, the mean and the
/// mean ± one standard deviation, as `(step, mean, low, high)`. With `log`, the same in log space
/// (geometric mean, × and ÷ the geometric standard deviation), for curves drawn on a log axis
/// whose values span decades (values ≤ 0 are left out there).
pub fn band(report: &StudyReport, group: &GroupResult, name: &str, log: bool) -> Result<Vec<(f64, f64, f64, f64)>> {
    // Keyed by x in units of 10⁻⁹ (steps, exit depths and noise levels alike), so that equal x
    // of different runs meet.
    let key = |x: f64| (x * 1e9).round() as i64;
    let curves: Vec<std::collections::BTreeMap<i64, f64>> = group
        .runs
        .iter()
        .map(|&i| Ok(report.runs[i].curve(name)?.into_iter().map(|(x, y)| (key(x), y)).collect()))
        .collect::<Result<_>>()?;
    if curves.iter().any(|c| c.is_empty()) {
        return Ok(vec![]);
    }
    let steps: Vec<i64> = curves[0].keys().filter(|s| curves.iter().all(|c| c.contains_key(s))).cloned().collect();
    Ok(steps
        .into_iter()
        .filter_map(|s| {
            let ys: Vec<f64> = curves.iter().map(|c| c[&s]).collect();
            if log {
                let logs: Vec<f64> = ys.iter().filter(|y| **y > 0.0).map(|y| y.ln()).collect();
                if logs.is_empty() {
                    return None;
                }
                let st = stats::describe(&logs);
                let sd = if st.sd.is_finite() { st.sd } else { 0.0 };
                return Some((s as f64 / 1e9, st.mean.exp(), (st.mean - sd).exp(), (st.mean + sd).exp()));
            }
            let st = stats::describe(&ys);
            let sd = if st.sd.is_finite() { st.sd } else { 0.0 };
            Some((s as f64 / 1e9, st.mean, st.mean - sd, st.mean + sd))
        })
        .collect())
}
