//! Reading finished runs for a report: each run's config (flattened to `a.b.c` keys), its final
//! and best metrics, and its curves; grouping runs by config keys.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use super::runs_table::{curves_table_of, read_runs_csv, read_runs_tables, CONFIG_COLUMN};

/// A finished run as a report sees it.
#[derive(Debug, Clone)]
pub struct RunRecord {
    pub dir: PathBuf,
    /// Every scalar of `config.yaml`, keyed `section.key` (lists as `key[i]`), as text.
    pub config: BTreeMap<String, String>,
    /// `summary.json`'s numbers keyed the same way (`final_loss`, `eval.accuracy`, `gamma`, …);
    /// `best.eval.<column>`: the best value over the run's evaluations (`eval.csv`; highest where
    /// its kind says higher is better, lowest otherwise); `initial.gamma` (the first logged Γ);
    /// `final.<view>[i]` (a topology's one-row parameter view at the end: H-ACN's `final.a[i]`);
    /// and the metrics its kind reads from its other files ([`crate::kinds::RunKind::run_metrics`]:
    /// `eps_by_t.<bucket>` (a diffusion run's last validation ε-MSE per timestep bucket); and
    /// after `plexus analyze`, `analysis.half_depth.<metric>` (the exit after ⌊L/2⌋ units) and
    /// `analysis.noise[<level>].<metric>` (under input noise of that σ or probability; also
    /// `accuracy_drop`, the clean accuracy minus that); after
    /// `plexus fd`, `fd.fd`, `fd.real_floor` and `fd.class_agreement` (its latest measurement).
    pub metrics: BTreeMap<String, f64>,
    /// Curves held in memory, `name → (x, y)` in order: a runs table's companion curves file
    /// (`NAME.curves.csv` beside `NAME.csv`, see [`read_runs_tables`]). Empty for a run directory,
    /// whose curves are read from its files ([`curve`]).
    pub curves: BTreeMap<String, Vec<(f64, f64)>>,
}

impl RunRecord {
    /// The curve `name` of this run (see [`curve`]): from its held curves when it was read from a
    /// table that has them, else from its run directory's files; empty when not logged.
    pub fn curve(&self, name: &str) -> Result<Vec<(f64, f64)>> {
        if self.curves.is_empty() {
            curve(&self.dir, name)
        } else {
            Ok(self.curves.get(name).cloned().unwrap_or_default())
        }
    }

    /// The curves this run logs (see [`curve_names`]).
    pub fn curve_names(&self) -> Vec<String> {
        if self.curves.is_empty() {
            curve_names(&self.dir)
        } else {
            self.curves.keys().cloned().collect()
        }
    }

    /// The run's `seed` (what pairs runs across settings), if its config has one.
    pub fn seed(&self) -> Option<u64> {
        self.config.get("seed").and_then(|s| s.parse().ok())
    }
}

/// The run directories `paths` stand for, in order: a sweep folder (`sweep.json`) for its runs,
/// a run directory (`config.yaml`) for itself, any other directory for the run directories
/// directly inside it (sorted).
pub fn find_runs(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in paths {
        if p.join(super::MANIFEST).is_file() {
            out.extend(super::Manifest::read(p)?.runs.iter().map(|r| p.join(&r.name)));
        } else if p.join("config.yaml").is_file() {
            out.push(p.clone());
        } else if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|d| d.join("config.yaml").is_file())
                .collect();
            if found.is_empty() {
                bail!(
                    "{}: neither a sweep folder (sweep.json), a run directory (config.yaml) nor a folder of runs",
                    p.display()
                );
            }
            found.sort();
            out.extend(found);
        } else {
            bail!("{}: no such directory (give run directories or sweep folders)", p.display());
        }
    }
    // A run reached twice (`report R R`, a sweep and one of its runs, two spellings of one
    // path) counts once: twice would halve its standard error for nothing.
    let mut seen = std::collections::BTreeSet::new();
    let mut twice = Vec::new();
    out.retain(|d| {
        let key = std::fs::canonicalize(d).unwrap_or_else(|_| d.clone());
        seen.insert(key) || {
            twice.push(d.display().to_string());
            false
        }
    });
    if !twice.is_empty() {
        eprintln!("report: {} run(s) given more than once, counted once: {}", twice.len(), twice.join(", "));
    }
    Ok(out)
}

/// Reads a run; `Ok(None)` when it has not finished (no `summary.json`). One reader per source:
/// its config (and what a sweep recorded of it), its summary, its evaluations, its first Γ, and
/// the files its kind writes beside them ([`crate::kinds::RunKind::run_metrics`]).
pub fn read_run(dir: &Path) -> Result<Option<RunRecord>> {
    let summary = dir.join("summary.json");
    if !summary.is_file() {
        return Ok(None);
    }
    let kind = crate::kinds::of_run(&crate::run_dir::RunDir::new(dir));
    let config = run_config(dir)?;
    let mut metrics = summary_metrics(&summary, kind)?;
    best_evaluations(dir, kind, &mut metrics)?;
    if let Some(g) = curve(dir, "gamma")?.first() {
        metrics.insert("initial.gamma".into(), g.1);
    }
    kind.run_metrics(dir, &mut metrics)?;
    Ok(Some(RunRecord { dir: dir.to_path_buf(), config, metrics, curves: BTreeMap::new() }))
}

/// A run's config, flattened (`topology.init.mu`), with what a sweep made it under: its claims'
/// fingerprint and the spec's commit (`study.claims`, `study.spec_commit`).
fn run_config(dir: &Path) -> Result<BTreeMap<String, String>> {
    let text =
        crate::input_file::read_text(&dir.join("config.yaml"), crate::input_file::MAX_CONFIG_BYTES, "a config file")
            .with_context(|| format!("reading the run {}", dir.display()))?;
    let yaml: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("parsing {}", dir.join("config.yaml").display()))?;
    let mut config = BTreeMap::new();
    flatten_yaml(&yaml, "", &mut config);
    let registration = dir.join(super::REGISTRATION_FILE);
    if registration.is_file() {
        let r: super::Registration = crate::input_file::read_json(&registration, "a study registration")?;
        config.insert("study.claims".into(), r.claims);
        let commit = match (r.spec_commit, r.spec_modified) {
            (None, _) => "uncommitted".to_string(),
            (Some(c), false) => c.chars().take(12).collect(),
            (Some(c), true) => format!("{}+modified", c.chars().take(12).collect::<String>()),
        };
        config.insert("study.spec_commit".into(), commit);
    }
    Ok(config)
}

/// The numbers of a run's `summary.json` (flattened: `eval.accuracy`), but those its kind says
/// are not results (counts, times), and the topology's one-row parameter view at the end (H-ACN's
/// residual weights as `final.a[0]` …).
fn summary_metrics(summary: &Path, kind: &dyn crate::kinds::RunKind) -> Result<BTreeMap<String, f64>> {
    let json: serde_json::Value = crate::input_file::read_json(summary, "a run summary")?;
    let mut metrics = BTreeMap::new();
    flatten_json(&json, "", &mut metrics);
    metrics.retain(|k, _| !kind.not_results().contains(&k.as_str()));
    if let Some([name, serde_json::Value::Array(rows)]) = json["parameter_view"].as_array().map(Vec::as_slice) {
        if let (Some(name), [serde_json::Value::Array(row)]) = (name.as_str(), rows.as_slice()) {
            for (i, v) in row.iter().enumerate() {
                if let Some(v) = v.as_f64() {
                    metrics.insert(format!("final.{name}[{i}]"), v);
                }
            }
        }
    }
    Ok(metrics)
}

/// `best.eval.<column>`: the best value of each column of the run's `eval.csv` over its
/// evaluations (highest where the kind says higher is better, lowest otherwise).
fn best_evaluations(dir: &Path, kind: &dyn crate::kinds::RunKind, metrics: &mut BTreeMap<String, f64>) -> Result<()> {
    let eval = dir.join("eval.csv");
    if eval.is_file() {
        let (cols, rows) = read_csv(&eval)?;
        for (c, name) in cols.iter().enumerate().filter(|(_, n)| *n != "step") {
            let vals = rows.iter().filter_map(|r| r[c]);
            let best = match kind.higher_is_better(name) {
                true => vals.fold(f64::NAN, f64::max),
                false => vals.fold(f64::NAN, f64::min),
            };
            if best.is_finite() {
                metrics.insert(format!("best.eval.{name}"), best);
            }
        }
    }
    Ok(())
}

/// A config's YAML as a report keys it: every scalar as `section.key` (lists as `key[i]`), as text.
pub fn flatten_config(yaml: &str) -> Result<BTreeMap<String, String>> {
    let value: serde_yaml::Value = serde_yaml::from_str(yaml).context("parsing a resolved config")?;
    let mut out = BTreeMap::new();
    flatten_yaml(&value, "", &mut out);
    Ok(out)
}

fn flatten_yaml(v: &serde_yaml::Value, prefix: &str, out: &mut BTreeMap<String, String>) {
    use serde_yaml::Value as V;
    let join = |k: &str| if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
    match v {
        V::Mapping(m) => {
            for (k, v) in m {
                let key = match k {
                    V::String(s) => s.clone(),
                    other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
                };
                flatten_yaml(v, &join(&key), out);
            }
        }
        V::Sequence(s) => {
            for (i, v) in s.iter().enumerate() {
                flatten_yaml(v, &format!("{prefix}[{i}]"), out);
            }
        }
        V::String(s) => drop(out.insert(prefix.to_string(), s.clone())),
        V::Number(n) => drop(out.insert(prefix.to_string(), n.to_string())),
        V::Bool(b) => drop(out.insert(prefix.to_string(), b.to_string())),
        V::Null => drop(out.insert(prefix.to_string(), "null".into())),
        V::Tagged(t) => flatten_yaml(&t.value, prefix, out),
    }
}

use crate::run_dir::{flatten_json, read_number_table as read_csv};

/// The curve `name` of a run, as `(x, value)`: `eval.<column>` from `eval.csv`, any other name a
/// column of `metrics.csv` (`loss`, `gamma`, `grad_norm`; against the column the run's kind logs its progress in
/// steps), both against the step; after `plexus analyze`, `layerwise.<column>` from
/// `layerwise.csv` against the units before the exit, and `noise.<column>` from `noise.csv` against
/// the noise level (the mean over its draws); after `plexus fd --every-checkpoint` (or `--step`),
/// `fd.<column>` from `fd_steps.csv` against the checkpoint's step. Empty when the run does not log
/// it.
pub fn curve(dir: &Path, name: &str) -> Result<Vec<(f64, f64)>> {
    // `metrics.csv` is drawn against the column the run's kind logs its progress in.
    let x_metrics = [crate::kinds::of_run(&crate::run_dir::RunDir::new(dir)).x_column()];
    let (file, col, x_cols): (&str, &str, &[&str]) = if let Some(c) = name.strip_prefix("eval.") {
        ("eval.csv", c, &["step"])
    } else if let Some(c) = name.strip_prefix("layerwise.") {
        ("layerwise.csv", c, &["units"])
    } else if let Some(c) = name.strip_prefix("noise.") {
        ("noise.csv", c, &["level"])
    } else if let Some(c) = name.strip_prefix("fd.") {
        (crate::fd::STEPS_FILE, c, &["step"])
    } else {
        ("metrics.csv", name, &x_metrics)
    };
    let path = dir.join(file);
    if !path.is_file() {
        return Ok(vec![]);
    }
    let (cols, rows) = read_csv(&path)?;
    let (Some(y), Some(x)) =
        (cols.iter().position(|c| c == col), x_cols.iter().find_map(|want| cols.iter().position(|c| c == want)))
    else {
        return Ok(vec![]);
    };
    // plexus writes no value that is not finite (a missing one is an empty cell): a NaN or an
    // infinity in a curve is a damaged or hand-edited file, and would reach a mean unseen.
    if let Some((i, c)) = rows
        .iter()
        .enumerate()
        .find_map(|(i, r)| [x, y].into_iter().find(|&c| r[c].is_some_and(|v| !v.is_finite())).map(|c| (i, c)))
    {
        bail!(
            "{}: row {}, column `{}`: `{}` is not a finite number (plexus writes none; a value it has not is an empty \
             cell): the file is damaged or was edited",
            path.display(),
            i + 2,
            cols[c],
            rows[i][c].unwrap_or(f64::NAN)
        );
    }
    let points: Vec<(f64, f64)> = rows.iter().filter_map(|r| Some((r[x]?, r[y]?))).collect();
    if file != "noise.csv" {
        return Ok(points);
    }
    // Several draws per level, in order: their mean.
    let mut means: Vec<(f64, f64, usize)> = Vec::new();
    for (x, y) in points {
        match means.iter_mut().find(|m| m.0 == x) {
            Some(m) => {
                m.1 += y;
                m.2 += 1;
            }
            None => means.push((x, y, 1)),
        }
    }
    Ok(means.into_iter().map(|(x, sum, n)| (x, sum / n as f64)).collect())
}

/// The curves a run logs: the columns of `metrics.csv` and, as `eval.<column>`, of `eval.csv`
/// (the step columns aside); after `plexus analyze`, `layerwise.<column>` and `noise.<column>`;
/// after `plexus fd` at checkpoints, `fd.<column>` (its setting's columns aside).
pub fn curve_names(dir: &Path) -> Vec<String> {
    // Each file, the prefix of its curves and its columns that are not curves (the x axes, labels,
    // an FD measurement's setting).
    let x_metrics = [crate::kinds::of_run(&crate::run_dir::RunDir::new(dir)).x_column()];
    let files: [(&str, &str, &[&str]); 5] = [
        ("metrics.csv", "", &x_metrics),
        ("eval.csv", "eval.", &["step"]),
        ("layerwise.csv", "layerwise.", &["units", "kind"]),
        ("noise.csv", "noise.", &["kind", "level", "repeat"]),
        (crate::fd::STEPS_FILE, "fd.", &["step", "samples", "sampling", "extractor", "extractor_sha256"]),
    ];
    let mut names = Vec::new();
    for (file, prefix, not_curves) in files {
        if let Ok((cols, _)) = read_csv(&dir.join(file)) {
            names.extend(cols.iter().filter(|c| !not_curves.contains(&c.as_str())).map(|c| format!("{prefix}{c}")));
        }
    }
    names
}

/// The config keys whose values differ between `runs` (a key missing from a run counts as a
/// value), except `seed`, `name` where configs share one, the `log.*` keys and what a sweep recorded
/// of its study (`study.*`).
pub fn varying_keys(runs: &[RunRecord]) -> Vec<String> {
    let mut keys: Vec<String> = runs.iter().flat_map(|r| r.config.keys().cloned()).collect();
    keys.sort();
    keys.dedup();
    keys.retain(|k| k != "seed" && !k.starts_with("log.") && !k.starts_with("study."));
    keys.retain(|k| runs.iter().any(|r| r.config.get(k) != runs[0].config.get(k)));
    keys
}

/// Runs grouped by the values of `by` (in the order groups first appear).
pub fn group(runs: &[RunRecord], by: &[String]) -> Vec<(Vec<String>, Vec<usize>)> {
    let mut groups: Vec<(Vec<String>, Vec<usize>)> = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let key: Vec<String> = by.iter().map(|k| r.config.get(k).cloned().unwrap_or_else(|| "—".into())).collect();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `plexus analyze`'s files as curves: the layer-wise exits against the units before the exit,
    /// the noise rows against the level with the draws averaged (text cells such as `kind` and
    /// empty ones read as missing), and their names listed without the x columns.
    #[test]
    fn exits_and_noise_levels_are_curves_against_depth_and_level() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("layerwise.csv"),
            "units,loss,accuracy,perplexity\n0,2.2,0.2,\n1,1.9,0.3,\n2,0.5,0.8,\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("noise.csv"),
            "kind,level,repeat,loss,accuracy,perplexity\ngaussian,0.0,0,0.4,0.8,\ngaussian,0.0,1,0.4,0.8,\n\
             gaussian,0.1,0,0.5,0.7,\ngaussian,0.1,1,0.5,0.6,\n",
        )
        .unwrap();
        assert_eq!(curve(dir.path(), "layerwise.accuracy").unwrap(), [(0.0, 0.2), (1.0, 0.3), (2.0, 0.8)]);
        let noise = curve(dir.path(), "noise.accuracy").unwrap();
        assert_eq!(noise.len(), 2);
        assert_eq!(noise[0], (0.0, 0.8));
        assert!((noise[1].0 - 0.1).abs() < 1e-12 && (noise[1].1 - 0.65).abs() < 1e-12, "{noise:?}");
        assert!(curve(dir.path(), "layerwise.perplexity").unwrap().is_empty(), "an empty column is no curve");
        assert!(curve(dir.path(), "eval.accuracy").unwrap().is_empty(), "no eval.csv");
        let names = curve_names(dir.path());
        for want in ["layerwise.loss", "layerwise.accuracy", "noise.accuracy"] {
            assert!(names.contains(&want.to_string()), "{names:?}");
        }
        assert!(
            !names.iter().any(|n| n.ends_with(".units") || n.ends_with(".level") || n.ends_with(".repeat")),
            "{names:?}"
        );
    }

    /// A topology's one-row parameter view at the end becomes `final.<name>[i]`, and `plexus rl
    /// --eval`'s file the `held_out.*` metrics (each value's first entry); a view of several rows
    /// adds nothing.
    #[test]
    fn final_parameter_views_and_held_out_evaluations_are_metrics() {
        let dir = tempfile::tempdir().unwrap();
        // An RL run (its kind reads the held-out file): `network` is that kind's section.
        std::fs::write(dir.path().join("config.yaml"), "name: r\nseed: 3\nnetwork: {depth: 4}\n").unwrap();
        std::fs::write(
            dir.path().join("summary.json"),
            r#"{"final_loss": 0.5, "parameter_view": ["a", [[0.2, 0.3, 0.25]]]}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("held_out_eval.json"),
            r#"{"success": [0.6, 0.5, 0.7], "time_at_goal": [0.4, 0.3, 0.5], "tasks": 100}"#,
        )
        .unwrap();
        let r = read_run(dir.path()).unwrap().unwrap();
        let got: Vec<(&str, f64)> = r.metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        for want in [
            ("final.a[0]", 0.2),
            ("final.a[1]", 0.3),
            ("final.a[2]", 0.25),
            ("held_out.success", 0.6),
            ("held_out.time_at_goal", 0.4),
        ] {
            assert!(got.contains(&want), "{want:?} not in {got:?}");
        }
        assert!(!got.iter().any(|(k, _)| k.starts_with("parameter_view") || k.starts_with("held_out.tasks")));
        std::fs::write(
            dir.path().join("summary.json"),
            r#"{"final_loss": 0.5, "parameter_view": ["H_res", [[1.0, 0.0], [0.0, 1.0]]]}"#,
        )
        .unwrap();
        let r = read_run(dir.path()).unwrap().unwrap();
        assert!(!r.metrics.keys().any(|k| k.starts_with("final.")), "{:?}", r.metrics.keys());
    }

    /// A runs.csv is checked as data: a run repeated with the same values is one run (within a
    /// file or across two), with other values an error naming both rows; a column twice, a seed
    /// that is not a whole number ≥ 0, a value that is not finite and a table without rows are
    /// errors naming the file, row and column.
    #[test]
    fn runs_tables_are_checked_as_data() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let head = "run,config:name,config:seed,m\n";
        let a = write("a.csv", &format!("{head}r0,a,0,1.5\nr1,a,1,2.5\nr0,a,0,1.5\n"));
        let runs = read_runs_csv(&a).unwrap();
        assert_eq!(runs.len(), 2, "a repeated row is one run");
        let b = write("b.csv", &format!("{head}r1,a,1,2.5\nr2,a,2,3.5\n"));
        assert_eq!(read_runs_tables(&[&a, &b]).unwrap().len(), 3, "a run in two files is one run");
        let c = write("c.csv", &format!("{head}r1,a,1,9.0\n"));
        let e = read_runs_tables(&[&a, &c]).unwrap_err().to_string();
        assert!(
            e.contains("run r1 is listed twice with different values")
                && e.contains("a.csv row 3")
                && e.contains("c.csv row 2"),
            "{e}"
        );
        for (text, want) in [
            ("run,config:seed,m,m\nr0,0,1,2\n", "column `m` appears twice (columns 3 and 4)"),
            ("run,config:seed,m\nr0,3.0,1\n", "row 2 (run r0), column `config:seed`: `3.0` is not a seed"),
            ("run,config:seed,m\nr0,-3,1\n", "`-3` is not a seed"),
            ("run,config:seed,m\nr0,0,NaN\n", "row 2 (run r0), column `m`: `NaN` is not a finite number"),
            ("run,config:seed,m\nr0,0,inf\n", "`inf` is not a finite number"),
            ("run,config:seed,m\n", "without rows"),
            ("run,config:seed,m\n,0,1\n", "row 2 has no run name"),
        ] {
            let e = read_runs_csv(&write("x.csv", text)).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        // A device is refused as one, and read no further.
        let e = read_runs_csv(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("character device"), "{e}");
    }
}
