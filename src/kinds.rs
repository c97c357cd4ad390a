//! The registry of run kinds: `plexus train` (every backbone, DiT included: they are configs of
//! one trainer) and `plexus rl`. Everything above the trainers that must know which kind a config
//! or a run directory is — sweeps (study/spec.rs, study/runner.rs), the commands, the figures —
//! asks here instead of matching on the verb: how to tell a kind's config, load it (its resolved
//! text and name), train or resume it, where its final weights are, what a resume may change, how
//! its runs are printed and which figure a kind draws of its own. tests/it/layers.rs checks that no
//! other file above the trainers names the RL verb.

use crate::config::Override;
use crate::rl::config::RlExperiment;
use crate::rl::trainer::{RlOptions, RlSummary};
use crate::run_dir::RunDir;
use crate::train::lifecycle::ResumePolicy;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// A config as a kind resolves it: what a run directory's `config.yaml` would hold, and its name.
pub struct Loaded {
    pub yaml: String,
    pub name: String,
}

/// How a command launches a run of any kind.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// Continue the run in the directory from its latest checkpoint.
    pub resume: bool,
    /// Clear a non-empty run directory first (new runs).
    pub overwrite: bool,
    /// No progress lines on stderr.
    pub quiet: bool,
    /// A progress bar on stderr (a terminal, not `--quiet`, rank 0); else plain lines.
    pub progress: bool,
    /// This process's place in a data-parallel run (kinds that have them: [`RunKind::data_parallel`]).
    pub dist: Option<crate::dist::DistInfo>,
    /// `PLEXUS_CRASH_AFTER` (see [`crate::train::engine::CrashAfter`]).
    pub crash_after: Option<u64>,
    /// What the updates a lengthened run adds do, where its schedule depends on its length
    /// ([`crate::train::extend`]).
    pub extend: Option<crate::config::ExtendRule>,
}

/// A kind's own figure of its runs: one curve per run from two columns of its `metrics.csv`
/// (coloured by topology), and horizontal baselines read from the runs' summaries.
pub struct Figure {
    /// File stem in the figure folder (`success` → `success.{png,svg,pdf}`).
    pub file: &'static str,
    pub title: &'static str,
    /// `metrics.csv` columns of the curve, and the axes' labels.
    pub x: &'static str,
    pub y: &'static str,
    pub x_label: &'static str,
    pub y_label: &'static str,
    /// A run's topology kind (its colour), its legend label and its seed (said where two runs
    /// share a label).
    pub describe: fn(&Path) -> Result<(String, String, u64)>,
    /// The baselines' names and grey levels, and a run's value of each (none where its summary
    /// lacks it): the figure draws the mean over the runs that have one.
    pub baselines: &'static [(&'static str, u8)],
    pub baseline_values: fn(&Path) -> Vec<Option<f64>>,
}

/// One kind of run.
pub trait RunKind: Sync {
    /// The verb that trains it (`plexus <verb>`; a sweep's command line).
    fn verb(&self) -> &'static str;
    /// Whether the top-level sections of a config (a YAML mapping) make it one of this kind's.
    fn tells(&self, config: &serde_yaml::Mapping) -> bool;
    /// The top-level sections that are this kind's own, for messages (`model, data, topology`).
    fn sections(&self) -> &'static [&'static str];
    /// What can be done with a finished run of this kind, for a command that reads another kind's
    /// runs (`run`: the run directory).
    fn offers(&self, run: &Path) -> String;
    /// The config at `file` with `overrides`, resolved and checked.
    fn load(&self, file: &Path, overrides: &[Override]) -> Result<Loaded>;
    /// What a resumed run may change (the run's length key among it).
    fn resume_policy(&self) -> &'static ResumePolicy;
    /// Whether its runs may be data-parallel (several processes, one run).
    fn data_parallel(&self) -> bool {
        false
    }
    /// Trains the config at `file` into `out` (new, or resumed with `launch.resume`, when `file` is
    /// the run's own `config.yaml`).
    fn train(&self, file: &Path, overrides: &[Override], out: &Path, launch: &Launch) -> Result<()>;
    /// The rule a resumed run in `dir` that continues with the config `yaml` gives the updates it
    /// adds, where it lengthens a schedule that depends on its length: `rule` (a sweep's
    /// `extend`), or an error naming the choices when it needs one and `rule` is `None`; `None`
    /// when it lengthens no such schedule.
    fn lengthening(
        &self,
        dir: &RunDir,
        yaml: &str,
        rule: Option<crate::config::ExtendRule>,
    ) -> Result<Option<crate::config::ExtendRule>> {
        let _ = (dir, yaml, rule);
        Ok(None)
    }
    /// The length of the vector metric `metric` (`final.a`, whose entries a report reads as
    /// `final.a[0]` …) that a run of the config at `file` with `overrides` will have, where the
    /// config alone tells it; `None` where it does not (the check of an `across_seeds` claim's
    /// `size` before a sweep's runs then waits for the runs).
    fn vector_len(&self, file: &Path, overrides: &[Override], metric: &str) -> Result<Option<usize>> {
        let _ = (file, overrides, metric);
        Ok(None)
    }
    /// The numbers of its runs' `summary.json` that are not results (counts, times, sizes): left
    /// out of a study's metrics.
    fn not_results(&self) -> &'static [&'static str];
    /// Whether a larger value of the evaluation column `column` is better (its best over a run's
    /// evaluations is then the largest).
    fn higher_is_better(&self, column: &str) -> bool;
    /// The column of its runs' `metrics.csv` that a curve is drawn against (`step`).
    fn x_column(&self) -> &'static str;
    /// The metrics a study's table shows of its runs by default, in this order, where every run
    /// has them.
    fn preferred_metrics(&self) -> &'static [&'static str];
    /// The curves a study draws of its runs by default, where every run logs them.
    fn default_curves(&self) -> &'static [&'static str];
    /// Its own metrics in words, for tables and figures (`time_at_goal` → `time at goal`).
    fn metric_names(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
    /// The metrics its runs hold beyond their summary, from the files the kind writes beside it
    /// (`analysis.json`, `fd.json`, `held_out_eval.json`, …), added to `metrics`.
    fn run_metrics(&self, dir: &Path, metrics: &mut std::collections::BTreeMap<String, f64>) -> Result<()>;
    /// Prints the table of finished runs (their `summary.json`) on stdout.
    fn print(&self, runs: &[PathBuf]) -> Result<()>;
    /// The figure a kind draws of its own runs, if any (train runs' figures are the analysis').
    fn figure(&self) -> Option<&'static Figure>;
    /// The final weights of a finished run: [`RunDir::final_weights`] (both layouts).
    fn final_weights(&self, dir: &RunDir) -> PathBuf {
        dir.final_weights()
    }
}

/// `plexus train`: every supervised, language and diffusion config.
pub struct Train;
/// `plexus rl`: contrastive RL in the point maze.
pub struct Rl;

/// `e`, a config error from loading a config as `kind`'s, where the config is another kind's: an
/// unknown field of `kind`'s schema in a config another kind tells is that kind's config given to
/// the wrong verb, said so (its section, its line, the verb to run it with) instead of as the
/// field. Any other error is `e`.
fn another_kinds(e: crate::config::ConfigError, kind: &dyn RunKind) -> anyhow::Error {
    if !e.allowed.contains("unknown field") {
        return e.into();
    }
    let Ok(text) = crate::config::read_config_text(&e.file) else { return e.into() };
    let other = of_config(&text);
    let Ok(serde_yaml::Value::Mapping(m)) = serde_yaml::from_str::<serde_yaml::Value>(&text) else { return e.into() };
    if other.verb() == kind.verb() || !other.tells(&m) {
        return e.into();
    }
    let key = other.sections().iter().find(|k| m.contains_key(**k)).copied().unwrap_or_default();
    crate::config::ConfigError {
        allowed: format!(
            "this is a `plexus {o}` config ({}), not a `plexus {k}` one ({}): run it with `plexus {o} {}`",
            other.sections().join(", "),
            kind.sections().join(", "),
            e.file.display(),
            o = other.verb(),
            k = kind.verb()
        ),
        key: key.into(),
        value: None,
        line: crate::config::locate_key(&text, key),
        file: e.file,
    }
    .into()
}

/// An error when `dir` holds a run of another kind than `kind` (the command's): its config would
/// otherwise be refused as an unknown section, which reads as advice to retrain a finished run;
/// this says what can be done with it instead.
pub fn expect_kind(dir: &RunDir, kind: &dyn RunKind) -> Result<()> {
    let Ok(text) = crate::config::read_config_text(&dir.config_file()) else { return Ok(()) };
    let other = of_config(&text);
    if other.verb() != kind.verb() {
        anyhow::bail!(
            "{} is a `plexus {}` run; this command reads `plexus {}` runs. For it, {}",
            dir.path.display(),
            other.verb(),
            kind.verb(),
            other.offers(&dir.path)
        );
    }
    Ok(())
}

/// The kind of the run in `dir`, by its `config.yaml` ([`TRAIN`] where it has none it can read).
pub fn of_run(dir: &RunDir) -> &'static dyn RunKind {
    crate::config::read_config_text(&dir.config_file()).map_or(&TRAIN, |t| of_config(&t))
}

/// The kind of every `plexus train` run.
pub static TRAIN: Train = Train;
/// The kind of every `plexus rl` run.
pub static RL: Rl = Rl;
/// Every kind; a config no other kind tells is [`TRAIN`]'s (its parser says what is wrong).
pub static KINDS: [&dyn RunKind; 2] = [&RL, &TRAIN];

/// The kind whose verb is `verb` (as a sweep's manifest records it).
pub fn by_verb(verb: &str) -> Result<&'static dyn RunKind> {
    KINDS.iter().copied().find(|k| k.verb() == verb).with_context(|| {
        let all: Vec<&str> = KINDS.iter().map(|k| k.verb()).collect();
        format!("`{verb}` is not a kind of run; plexus trains {}", all.join(", "))
    })
}

/// The kind a config's text is for: the first that tells its sections, else [`TRAIN`].
pub fn of_config(text: &str) -> &'static dyn RunKind {
    match serde_yaml::from_str::<serde_yaml::Value>(text) {
        Ok(serde_yaml::Value::Mapping(m)) => KINDS.iter().copied().find(|k| k.tells(&m)).unwrap_or(&TRAIN),
        _ => &TRAIN,
    }
}

impl RunKind for Train {
    fn verb(&self) -> &'static str {
        "train"
    }

    fn tells(&self, config: &serde_yaml::Mapping) -> bool {
        config.contains_key("model") || config.contains_key("data")
    }

    fn sections(&self) -> &'static [&'static str] {
        &["model", "data", "topology"]
    }

    fn offers(&self, run: &Path) -> String {
        let p = run.display();
        format!("`plexus analyze {p}`, `plexus plot {p}` and `plexus connectivity {p}` read it")
    }

    fn load(&self, file: &Path, overrides: &[Override]) -> Result<Loaded> {
        let exp = crate::experiment::Experiment::from_file(file, overrides).map_err(|e| another_kinds(e, self))?;
        Ok(Loaded { yaml: exp.config().to_yaml(), name: exp.config().name.clone() })
    }

    fn resume_policy(&self) -> &'static ResumePolicy {
        &crate::train::RESUME_POLICY
    }

    fn lengthening(
        &self,
        dir: &RunDir,
        yaml: &str,
        rule: Option<crate::config::ExtendRule>,
    ) -> Result<Option<crate::config::ExtendRule>> {
        let cfg: crate::config::Config = serde_yaml::from_str(yaml).context("the resolved config")?;
        crate::train::extend::rule_for(dir, &cfg, rule)
    }

    /// `final.<view>`: the topology's one-row parameter view at the end (H-ACN's residual weights
    /// `a`), whose length its parameters give before any training.
    fn vector_len(&self, file: &Path, overrides: &[Override], metric: &str) -> Result<Option<usize>> {
        let Some(view) = metric.strip_prefix("final.") else { return Ok(None) };
        let exp = crate::experiment::Experiment::from_file(file, overrides)?;
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let topology = exp.topology.build(&(vs.root() / "topology"), tch::Kind::Float);
        Ok(topology.parameter_view().and_then(|(name, m)| match (name == view, m.size().as_slice()) {
            (true, &[1, n]) => Some(n as usize),
            _ => None,
        }))
    }

    fn data_parallel(&self) -> bool {
        true
    }

    fn not_results(&self) -> &'static [&'static str] {
        &["steps", "eval.step", "num_params", "wall_seconds", "samples_per_second", "tokens_per_second", "resumed_from"]
    }

    fn higher_is_better(&self, column: &str) -> bool {
        column.ends_with("accuracy")
    }

    fn x_column(&self) -> &'static str {
        "step"
    }

    fn preferred_metrics(&self) -> &'static [&'static str] {
        &[
            "eval.accuracy",
            "best.eval.accuracy",
            "eval.perplexity",
            "eval.loss",
            "best.eval.loss",
            "final_loss",
            "steps_to_1e3",
            "gamma",
        ]
    }

    fn default_curves(&self) -> &'static [&'static str] {
        &["loss", "gamma"]
    }

    /// A diffusion run's ε-MSE per timestep bucket at its last evaluation (`eps_by_t.*`), what
    /// `plexus fd` measured of its final weights (`fd.*`) and what `plexus analyze` measured
    /// (`analysis.*`: the half-depth exit and the accuracy under noise, and its drop).
    fn run_metrics(&self, dir: &Path, metrics: &mut std::collections::BTreeMap<String, f64>) -> Result<()> {
        use crate::run_dir::{flatten_json, read_number_table as read_csv};
        use std::collections::BTreeMap;
        let eps = dir.join("eps_by_t.csv");
        if eps.is_file() {
            let (cols, rows) = read_csv(&eps)?;
            if let Some(last) = rows.last() {
                for (c, name) in cols.iter().enumerate().filter(|(_, n)| *n != "step") {
                    if let Some(v) = last[c] {
                        metrics.insert(format!("eps_by_t.{name}"), v);
                    }
                }
            }
        }
        let fd = dir.join("fd.json");
        if fd.is_file() {
            let json: serde_json::Value = crate::input_file::read_json(&fd, "an FD record")?;
            for k in ["fd", "real_floor", "class_agreement"] {
                if let Some(v) = json[k].as_f64() {
                    metrics.insert(format!("fd.{k}"), v);
                }
            }
        }
        let analysis = dir.join("analysis.json");
        if analysis.is_file() {
            let json: serde_json::Value = crate::input_file::read_json(&analysis, "an analysis record")?;
            let mut flat = BTreeMap::new();
            flatten_json(&json["half_depth"], "analysis.half_depth", &mut flat);
            flat.remove("analysis.half_depth.units");
            for row in json["noise"].as_array().into_iter().flatten() {
                let Some(level) = row["level"].as_f64() else { continue };
                for (k, name) in
                    [("mean_accuracy", "accuracy"), ("mean_loss", "loss"), ("mean_perplexity", "perplexity")]
                {
                    if let Some(v) = row[k].as_f64() {
                        flat.insert(format!("analysis.noise[{level}].{name}"), v);
                    }
                }
            }
            // Robustness is the accuracy lost to the noise, not the accuracy under it (which also
            // carries the clean accuracy's differences).
            if let Some(clean) = flat.get("analysis.noise[0].accuracy").copied() {
                let drops: Vec<(String, f64)> = flat
                    .iter()
                    .filter_map(|(k, v)| Some((k.strip_suffix(".accuracy")?.to_string(), clean - v)))
                    .filter(|(k, _)| k.starts_with("analysis.noise[") && k != "analysis.noise[0]")
                    .map(|(k, d)| (format!("{k}.accuracy_drop"), d))
                    .collect();
                flat.extend(drops);
            }
            metrics.extend(flat);
        }
        Ok(())
    }

    fn train(&self, file: &Path, overrides: &[Override], out: &Path, launch: &Launch) -> Result<()> {
        let dir = if launch.resume { RunDir::open(out)? } else { RunDir::new(out) };
        let exp = match launch.resume {
            true => {
                let mut exp = resumed_experiment(&dir.path, file, overrides)?;
                crate::train::extend::plan(&mut exp.loaded.config, &dir, launch.extend)?;
                exp
            }
            false => crate::experiment::Experiment::from_file(file, overrides)?,
        };
        let main = crate::dist::DistInfo::is_main(launch.dist.as_ref());
        let opts = crate::train::TrainOptions {
            progress: launch.progress,
            log_lines: main && !launch.quiet && !launch.progress,
            resume: launch.resume,
            overwrite: launch.overwrite,
            crash_after: launch.crash_after,
            dist: launch.dist.clone(),
        };
        crate::train::train(&exp, &dir, &opts).map(drop)
    }

    fn print(&self, runs: &[PathBuf]) -> Result<()> {
        let summaries: Vec<crate::train::Summary> = runs.iter().map(|r| summary_of(r)).collect::<Result<_>>()?;
        print_table(&summaries);
        Ok(())
    }

    fn figure(&self) -> Option<&'static Figure> {
        None
    }
}

impl RunKind for Rl {
    fn verb(&self) -> &'static str {
        "rl"
    }

    fn tells(&self, config: &serde_yaml::Mapping) -> bool {
        let has = |k: &str| config.contains_key(k);
        (has("env") || has("network") || has("crl")) && !TRAIN.tells(config)
    }

    fn sections(&self) -> &'static [&'static str] {
        &["env", "network", "crl"]
    }

    fn not_results(&self) -> &'static [&'static str] {
        &["params", "env_steps", "updates", "depth", "units", "seconds", "resumed_from"]
    }

    fn higher_is_better(&self, column: &str) -> bool {
        ["success", "time_at_goal"].iter().any(|m| column.ends_with(m))
    }

    fn x_column(&self) -> &'static str {
        "env_steps"
    }

    fn preferred_metrics(&self) -> &'static [&'static str] {
        &["success", "time_at_goal", "straight_success", "random_success"]
    }

    fn default_curves(&self) -> &'static [&'static str] {
        &["success"]
    }

    fn metric_names(&self) -> &'static [(&'static str, &'static str)] {
        &[("time_at_goal", "time at goal"), ("success", "success rate")]
    }

    /// What the trained policy adds to walking straight at the goal, on all tasks and on those where
    /// a wall is in the way (`success_over_straight`, `success_blocked_over_straight`: the paired
    /// comparison of a run with its own baseline), and after `plexus rl --eval` the final policy
    /// on held-out tasks (`held_out.*`).
    fn run_metrics(&self, dir: &Path, metrics: &mut std::collections::BTreeMap<String, f64>) -> Result<()> {
        for (trained, straight, name) in [
            ("success", "straight_success", "success_over_straight"),
            ("success_blocked", "straight_success_blocked", "success_blocked_over_straight"),
        ] {
            if let (Some(a), Some(b)) = (metrics.get(trained), metrics.get(straight)) {
                metrics.insert(name.into(), a - b);
            }
        }
        // After `plexus rl --eval`: the final policy on held-out tasks (each value's first entry; the
        // other two are its interval).
        let held_out = dir.join("held_out_eval.json");
        if held_out.is_file() {
            let json: serde_json::Value = crate::input_file::read_json(&held_out, "a held-out evaluation")?;
            for k in ["success", "time_at_goal", "success_blocked", "straight_success", "straight_success_blocked"] {
                if let Some(v) = json[k][0].as_f64() {
                    metrics.insert(format!("held_out.{k}"), v);
                }
            }
        }
        Ok(())
    }

    fn offers(&self, run: &Path) -> String {
        let p = run.display();
        format!(
            "`plexus rl --plot {p}` draws its success curve and `plexus rl --eval {p}` evaluates its final policy on \
             held-out tasks"
        )
    }

    fn load(&self, file: &Path, overrides: &[Override]) -> Result<Loaded> {
        let exp = RlExperiment::from_file(file, overrides).map_err(|e| another_kinds(e, self))?;
        Ok(Loaded { yaml: exp.config.to_yaml(), name: exp.config.name.clone() })
    }

    fn resume_policy(&self) -> &'static ResumePolicy {
        &crate::rl::trainer::RESUME_POLICY
    }

    fn train(&self, file: &Path, overrides: &[Override], out: &Path, launch: &Launch) -> Result<()> {
        let exp = RlExperiment::from_file(file, overrides)?;
        let opts = RlOptions {
            overwrite: launch.overwrite,
            verbose: !launch.quiet,
            resume: launch.resume,
            crash_after: launch.crash_after,
        };
        crate::rl::trainer::train(&exp, out, &opts).map(drop)
    }

    fn print(&self, runs: &[PathBuf]) -> Result<()> {
        let summaries: Vec<RlSummary> = runs.iter().map(|r| summary_of(r)).collect::<Result<_>>()?;
        print_rl(&summaries);
        Ok(())
    }

    fn figure(&self) -> Option<&'static Figure> {
        Some(&RL_SUCCESS)
    }
}

/// The experiment a resumed `plexus train` run continues: `config` with `overrides`, parsed
/// against what the run pinned. Where the config is fine and a `--set` makes it invalid, the error
/// names the `--set`s that would change what the run keeps.
fn resumed_experiment(run: &Path, config: &Path, overrides: &[Override]) -> Result<crate::experiment::Experiment> {
    use crate::experiment::Experiment;
    match Experiment::of_run(run, config, overrides) {
        Ok(exp) => Ok(exp),
        // The run's config is fine and a --set makes it invalid: name the --set that changes what
        // a resumed run keeps (`topology.kind=residual` on an H-ACN run leaves `topology.init`
        // behind, and the error would otherwise blame the run's own config.yaml).
        Err(e) if !overrides.is_empty() && Experiment::of_run(run, config, &[]).is_ok() => {
            let p = &crate::train::RESUME_POLICY;
            let refused: Vec<String> = overrides
                .iter()
                .filter(|o| o.key() != p.length && !(p.may_change)(o.key()))
                .map(Override::to_string)
                .collect();
            if refused.is_empty() {
                return Err(e);
            }
            anyhow::bail!(
                "--resume {}: --set {} would change what the run trains; only {} (which may grow, to extend the \
                 run, but not shrink) and {} may change on resume; start a new run (another --out, or \
                 --overwrite) for anything else",
                run.display(),
                refused.join(" --set "),
                p.length,
                p.describe
            );
        }
        Err(e) => Err(e),
    }
}

/// A finished run's `summary.json`.
fn summary_of<T: serde::de::DeserializeOwned>(run: &Path) -> Result<T> {
    crate::input_file::read_json(&RunDir::new(run).summary_file(), "a run summary")
}

/// The RL figure: evaluation success against environment steps, with the random policy (light
/// grey) and the policy that walks straight at the goal (dark grey) on the same tasks.
static RL_SUCCESS: Figure = Figure {
    file: "success",
    title: "Contrastive RL, point maze: evaluation success",
    x: "env_steps",
    y: "success",
    x_label: "environment steps",
    y_label: "success rate",
    describe: |dir| {
        let exp = RlExperiment::from_file(&dir.join("config.yaml"), &[])
            .with_context(|| format!("{} is not a `plexus rl` run directory", dir.display()))?;
        let kind = exp.topology.kind().to_string();
        let label = format!("{}, depth {}", display_name(&kind), exp.config.network.depth);
        Ok((kind, label, exp.config.seed))
    },
    baselines: &[("random policy", 150), ("straight at the goal", 60)],
    baseline_values: |dir| match summary_of::<RlSummary>(dir) {
        // Runs written before the straight-line baseline have none (0 from the default).
        Ok(s) => vec![Some(s.random_success), (s.straight_success > 0.0).then_some(s.straight_success)],
        Err(_) => vec![None, None],
    },
};

/// A topology's name as figures show it (the topology registry's display name).
fn display_name(kind: &str) -> String {
    crate::topology::entry(kind).map_or(kind, |e| e.display).to_string()
}

/// The table of finished `plexus train` runs: with an evaluation column set when any run has a
/// held-out set, else the loss's descent.
pub fn print_table(summaries: &[crate::train::Summary]) {
    let with_eval = summaries.iter().any(|s| s.eval.is_some());
    if with_eval {
        println!(
            "\n{:<28} {:<10} {:<16} {:>7} {:>11} {:>10} {:>14} {:>6} {:>9}",
            "run", "topology", "layout", "steps", "train loss", "eval loss", "eval metric", "Γ", "time"
        );
    } else {
        println!(
            "\n{:<28} {:<10} {:<16} {:>7} {:>12} {:>12} {:>11} {:>9}",
            "run", "topology", "layout", "steps", "final loss", "min loss", "to 1e-3·L0", "time"
        );
    }
    for s in summaries {
        if with_eval {
            let (loss, metric) = match &s.eval {
                Some(e) => (
                    format!("{:.4}", e.loss),
                    match (e.perplexity, e.accuracy) {
                        (Some(p), _) => format!("ppl {p:.2}"),
                        (None, Some(a)) => format!("acc {:.2}%", 100.0 * a),
                        _ => "-".into(),
                    },
                ),
                None => ("-".into(), "-".into()),
            };
            let gamma = s.gamma.map(|g| format!("{g:.3}")).unwrap_or_else(|| "-".into());
            println!(
                "{:<28} {:<10} {:<16} {:>7} {:>11.4} {:>10} {:>14} {:>6} {:>8.1}s",
                s.name, s.topology, s.topology_label, s.steps, s.final_loss, loss, metric, gamma, s.wall_seconds
            );
        } else {
            let reach = s.steps_to_1e3.map(|v| v.to_string()).unwrap_or_else(|| "never".into());
            println!(
                "{:<28} {:<10} {:<16} {:>7} {:>12.3e} {:>12.3e} {:>11} {:>8.2}s",
                s.name, s.topology, s.topology_label, s.steps, s.final_loss, s.min_loss, reach, s.wall_seconds
            );
        }
    }
}

/// The `plexus rl` table: one row per run; success on all evaluation tasks, then on those whose
/// straight line from start to goal crosses a wall (`blocked`: their share), where a policy must
/// have learned the maze to succeed.
fn print_rl(rows: &[RlSummary]) {
    println!(
        "{:<24} {:<12} {:>5} {:>6} {:>10} {:>9} {:>9} {:>8} {:>9} {:>8} {:>9} {:>9} {:>9}",
        "run",
        "topology",
        "depth",
        "units",
        "env steps",
        "success",
        "at goal",
        "random",
        "straight",
        "blocked",
        "trained|b",
        "straight|b",
        "time"
    );
    for s in rows {
        println!(
            "{:<24} {:<12} {:>5} {:>6} {:>10} {:>9.3} {:>9.3} {:>8.3} {:>9.3} {:>7.0}% {:>9.3} {:>10.3} {:>8.1}s",
            s.name,
            s.topology,
            s.depth,
            s.units,
            s.env_steps,
            s.success,
            s.time_at_goal,
            s.random_success,
            s.straight_success,
            100.0 * s.blocked_share,
            s.success_blocked,
            s.straight_success_blocked,
            s.seconds
        );
    }
    println!("(|b: on the evaluation tasks whose straight line to the goal crosses a wall, `blocked` of them)");
}
