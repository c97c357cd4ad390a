//! A sweep's spec: configs × a grid of `--set` values × seeds, from a YAML file, from flags, or
//! both (flags extend the file), and the runs it plans.
//!
//! ```yaml
//! # configs/studies/hacn-mu.yaml
//! configs: [../mixer-cifar10/cpu/hacn.yaml]   # relative to this file
//! set: {train.topology_lr_mult: 10}           # every run
//! grid: {topology.init.mu: [0.25, 0.75, 1.0]} # one axis per key; the runs are the product
//! seeds: [0, 1, 2]
//! out: runs/studies/hacn-mu                   # default sweep folder (`--out` wins)
//! report: {by: [topology.init.mu], metrics: [eval.accuracy, gamma], baseline: topology.init.mu=1.0}
//! ```

use crate::config;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The most runs one sweep plans (a sweep of more is split into several: its record, its
/// report and a Slurm array of that size are already large).
pub const MAX_RUNS: usize = 10_000;

/// What `plexus report` shows of a sweep unless told otherwise.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSpec {
    /// Config keys to group the runs by (default: every key whose value differs between runs,
    /// except `seed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by: Vec<String>,
    /// Metrics of the table (default: the final and best metrics every run has).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<String>,
    /// `KEY=VALUE`: the setting the others are compared with, paired by seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// Curves drawn with a band over seeds (default: `loss`, and `gamma` where runs log it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub curves: Vec<String>,
    /// Printed width of the figures, as `plexus report --width` takes it (`single`, `double` or
    /// inches; default double); the flag wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<String>,
    /// Figure files, as `plexus report --formats` takes them (`png,svg,pdf`, the default); the
    /// flag wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formats: Option<String>,
    /// How the figures' legends name a grouping value or a claim's arm, as a paper prints it
    /// (`lnn-fig2b-0to1: "0:1"`, `name=mixer-cifar10-cpu-hacn-per-layer: CIFAR-10`): a value of a
    /// grouping key, or an arm as written. Values it does not name are shown as they are (a
    /// topology by its display name, configs' names without what they all share).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

impl ReportSpec {
    /// Checks `width` and `formats` (the words the flags take), so that a sweep's spec with a bad
    /// one is refused before its runs, not at its report.
    pub fn check(&self) -> Result<()> {
        if let Some(w) = &self.width {
            let inches = w.trim().trim_end_matches("in").trim().parse::<f64>();
            let ok = matches!(w.trim(), "single" | "double") || inches.is_ok_and(|v| (2.0..=20.0).contains(&v));
            anyhow::ensure!(
                ok,
                "report.width: `{w}` is not a figure width; allowed: single (3.25 in), double (6.75 in) or inches \
                 from 2 to 20, e.g. 5.5"
            );
        }
        if let Some(f) = &self.formats {
            let words: Vec<&str> = f.split(',').map(str::trim).collect();
            let bad: Vec<&&str> = words.iter().filter(|w| !["png", "svg", "pdf"].contains(w)).collect();
            anyhow::ensure!(
                bad.is_empty() && !words.is_empty(),
                "report.formats: `{f}` is not a list of figure formats; allowed: png, svg, pdf, comma-separated"
            );
        }
        Ok(())
    }
}

/// A sweep as written in its YAML file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    /// Config files (relative to the spec file); several form one more axis of the grid.
    #[serde(default)]
    pub configs: Vec<PathBuf>,
    /// `--set` overrides of every run, in order.
    #[serde(default)]
    pub set: serde_yaml::Mapping,
    /// Axes: a config key and its values; the runs are the product of all axes.
    #[serde(default)]
    pub grid: serde_yaml::Mapping,
    /// Seeds (`seed` key) of every grid point; default `[0]`.
    #[serde(default)]
    pub seeds: Vec<u64>,
    /// The sweep folder when `--out` is not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out: Option<PathBuf>,
    #[serde(default)]
    pub report: ReportSpec,
    /// The claims the study tests, written before its runs; `plexus report` gives each a verdict
    /// ([`super::claims`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<super::claims::Claim>,
    /// What the updates do that a raised run length adds to finished or killed runs whose
    /// schedule depends on their length (cosine): `hold`, `restart` or `stretch`, as
    /// `plexus train --resume --extend` takes it. Without it such a lengthening is refused before
    /// any run starts, naming the choices.
    #[serde(default, rename = "extend", skip_serializing_if = "Option::is_none")]
    pub extend_rule: Option<crate::config::ExtendRule>,
}

/// One run a sweep plans.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedRun {
    /// Directory name under the sweep folder: `<config stem>-<axis>=<value>…-seed=<s>`.
    pub name: String,
    /// Absolute config file.
    pub config: PathBuf,
    /// `plexus train` or `plexus rl`.
    pub verb: String,
    /// The `--set` overrides: the spec's `set`, the grid point, then `seed=<s>`.
    pub overrides: Vec<config::Override>,
    /// The grid point: `(key, value)` of each axis (the config file's stem first when there
    /// are several configs).
    pub point: Vec<(String, String)>,
    pub seed: u64,
}

/// Whether `p` (a YAML file given to `plexus sweep`) is a sweep spec rather than a config: a
/// mapping with `configs`, `grid` or `seeds`. A file YAML cannot read (say, a seed past 64 bits)
/// is classified by its lines, so that its error is a spec's; an empty file or one holding a list
/// or null is neither, and the error says what is expected.
pub fn is_spec_file(p: &Path) -> Result<bool> {
    let text = crate::config::read_config_text(p)
        .map_err(|e| anyhow::anyhow!("plexus sweep {}: expected {e}", p.display()))?;
    let doc = serde_yaml::from_str::<serde_yaml::Value>(&text).ok();
    let spec_line = |t: &str| ["grid:", "seeds:", "configs:"].iter().any(|k| t.lines().any(|l| l.starts_with(k)));
    Ok(match &doc {
        None if spec_line(&text) => true,
        Some(serde_yaml::Value::Mapping(m)) => ["grid", "seeds", "configs"].iter().any(|k| m.contains_key(*k)),
        // Neither a spec nor a config: say so here, not as a config's missing section.
        Some(serde_yaml::Value::Null) | None if text.trim().is_empty() => bail!(
            "plexus sweep {}: the file is empty; expected a sweep spec (a mapping with `configs`, \
             `grid` or `seeds`) or a config (a mapping with `model`, `data`, `train`, …)",
            p.display()
        ),
        Some(other @ (serde_yaml::Value::Sequence(_) | serde_yaml::Value::Null)) => bail!(
            "plexus sweep {}: the file holds {}; expected a sweep spec (a mapping with `configs`, \
             `grid` or `seeds`) or a config (a mapping with `model`, `data`, `train`, …)",
            p.display(),
            if matches!(other, serde_yaml::Value::Sequence(_)) { "a list" } else { "nothing (null)" }
        ),
        _ => false,
    })
}

impl SweepSpec {
    /// Reads a spec file; config paths become absolute (relative to the file).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::input_file::read_text(path, crate::input_file::MAX_CONFIG_BYTES, "a sweep spec")
            .context("reading the sweep spec")?;
        // Not a mapping at all (a runs.csv given as --spec, a list): say what it is, without
        // echoing the file back.
        let raw = serde_yaml::from_str::<serde_yaml::Value>(&text);
        let top = match &raw {
            Ok(serde_yaml::Value::Mapping(_)) | Err(_) => None,
            Ok(serde_yaml::Value::Sequence(_)) => Some("a list"),
            Ok(serde_yaml::Value::Null) => Some("nothing"),
            Ok(_) => Some("a single value (plain text or a number; a CSV table reads so)"),
        };
        if let Some(top) = top {
            bail!(
                "{} is not a sweep spec: it holds {top}, not a mapping of `configs:`, `grid:`, `seeds:`, `claims:`, …",
                path.display()
            );
        }
        let (mut spec, _): (SweepSpec, String) = config::parse_document(&text, path, &[])?;
        let base = path.parent().unwrap_or(Path::new("."));
        for c in &mut spec.configs {
            *c = base.join(&*c);
        }
        super::claims::check(&spec.claims)
            .and_then(|_| super::claims::check_written_units(raw.as_ref().ok().and_then(|r| r.get("claims"))))
            .with_context(|| format!("the sweep spec {}", path.display()))?;
        spec.report.check().with_context(|| format!("the sweep spec {}", path.display()))?;
        Ok(spec)
    }

    /// Adds the flags of `plexus sweep`: more configs, more `--set`, more or replaced axes
    /// (`KEY=V1,V2,…`), and seeds (replacing the file's).
    pub fn extend(
        &mut self,
        configs: &[PathBuf],
        set: &[config::Override],
        grid: &[String],
        seeds: &[u64],
    ) -> Result<()> {
        self.configs.extend(configs.iter().cloned());
        for o in set {
            self.set.insert(o.key().into(), o.written().into());
        }
        let mut axes: Vec<(&str, &String)> = Vec::new();
        for g in grid {
            let (k, v) = split_kv(g, "--grid")?;
            // A second --grid of one key would replace the first without a word.
            if let Some((_, first)) = axes.iter().find(|(key, _)| *key == k) {
                bail!("--grid {k} is given twice ({first} and {g}): give its values once, as --grid {k}=V1,V2,…");
            }
            axes.push((k, g));
            let values: Vec<serde_yaml::Value> = v.split(',').map(|x| x.trim().into()).collect();
            self.grid.insert(k.into(), values.into());
        }
        if !seeds.is_empty() {
            self.seeds = seeds.to_vec();
        }
        Ok(())
    }

    /// The spec's `set:` as overrides; `seed` is refused (each run's seed is its own).
    fn set_overrides(&self, origin: &str) -> Result<Vec<config::Override>> {
        let set: Vec<config::Override> = self
            .set
            .iter()
            .map(|(k, v)| {
                let key = scalar(k, origin, "set")?;
                config::Override::of(&key, scalar(v, origin, "set")?).map_err(|e| anyhow!("{origin}: `set.{key}`: {e}"))
            })
            .collect::<Result<_>>()?;
        if let Some(seed) = set.iter().find(|o| o.key() == "seed").map(config::Override::written) {
            bail!(
                "{origin}: `set.seed` (--set seed={seed}) would be replaced by each run's own seed: a sweep's \
                 seeds are given by `seeds:` in the spec or by --seeds (e.g. --seeds {seed})"
            );
        }
        Ok(set)
    }

    /// The grid's axes: each key and its values as `--set` writes them.
    fn axes(&self, origin: &str) -> Result<Vec<(String, Vec<String>)>> {
        let mut axes: Vec<(String, Vec<String>)> = Vec::new();
        for (k, v) in &self.grid {
            let key = scalar(k, origin, "grid")?;
            if key == "seed" {
                bail!("{origin}: `grid.seed`: seeds are given by `seeds:` (or --seeds), not as a grid axis");
            }
            let serde_yaml::Value::Sequence(vals) = v else {
                bail!(
                    "{origin}: `grid.{key}` is `{}`: allowed: a list of values, e.g. [0.25, 0.75]",
                    config::yaml_text(Some(v))
                );
            };
            if vals.is_empty() {
                bail!("{origin}: `grid.{key}` is an empty list: allowed: at least one value");
            }
            let vals: Vec<String> =
                vals.iter().map(|x| scalar(x, origin, &format!("grid.{key}"))).collect::<Result<_>>()?;
            axes.push((key, vals));
        }
        Ok(axes)
    }

    /// The runs, in order: configs, then axes (first axis outermost), then seeds. `origin` names
    /// the spec in errors.
    pub fn plan(&self, origin: &str) -> Result<Vec<PlannedRun>> {
        if self.configs.is_empty() {
            bail!("{origin}: `configs` is empty: give at least one config file (`configs:` in the spec, or a CONFIG argument)");
        }
        let set = self.set_overrides(origin)?;
        let axes = self.axes(origin)?;
        let seeds = if self.seeds.is_empty() { vec![0] } else { self.seeds.clone() };
        self.check_count(&axes, &seeds, origin)?;
        let mut unique = std::collections::BTreeSet::new();
        if !seeds.iter().all(|s| unique.insert(*s)) {
            bail!("{origin}: `seeds` lists a seed twice: {seeds:?}");
        }
        let shorts = short_names(&axes);
        let mut runs = Vec::new();
        for (config, verb, stem) in self.labelled_configs(origin)? {
            for point in product(&axes) {
                for &seed in &seeds {
                    let mut name = stem.clone();
                    let mut overrides = set.clone();
                    let mut labelled = Vec::new();
                    if self.configs.len() > 1 {
                        labelled.push(("config".to_string(), stem.clone()));
                    }
                    for ((key, value), short) in axes.iter().map(|(k, _)| k).zip(&point).zip(&shorts) {
                        name.push_str(&format!("-{short}={}", dir_safe(value)));
                        overrides.push(
                            config::Override::of(key, value).map_err(|e| anyhow!("{origin}: `grid.{key}`: {e}"))?,
                        );
                        labelled.push((key.clone(), value.clone()));
                    }
                    name.push_str(&format!("-seed={seed}"));
                    overrides.push(config::Override::of("seed", seed)?);
                    runs.push(PlannedRun {
                        name,
                        config: config.clone(),
                        verb: verb.to_string(),
                        overrides,
                        point: labelled,
                        seed,
                    });
                }
            }
        }
        let mut names = std::collections::BTreeSet::new();
        if let Some(r) = runs.iter().find(|r| !names.insert(&r.name)) {
            bail!("{origin}: two runs would share the directory `{}`: give the configs different file names", r.name);
        }
        Ok(runs)
    }

    /// Refuses a plan of more than [`MAX_RUNS`] runs, counted before anything is planned: a grid
    /// of 10⁶ points is refused at once, not after gigabytes of run names.
    fn check_count(&self, axes: &[(String, Vec<String>)], seeds: &[u64], origin: &str) -> Result<()> {
        let count = axes
            .iter()
            .map(|(_, v)| v.len())
            .chain([self.configs.len(), seeds.len()])
            .try_fold(1usize, |n, k| n.checked_mul(k))
            .filter(|&n| n <= MAX_RUNS);
        if count.is_none() {
            let sizes: Vec<String> = [format!("{} configs", self.configs.len())]
                .into_iter()
                .chain(axes.iter().map(|(k, v)| format!("{} values of {k}", v.len())))
                .chain([format!("{} seeds", seeds.len())])
                .collect();
            bail!(
                "{origin}: {} make more than the {MAX_RUNS} runs a sweep may have; split it into \
                 several sweeps (each with its own --out)",
                sizes.join(" × ")
            );
        }
        Ok(())
    }

    /// Each config as (absolute path, its kind's verb, its label in run names): its file stem, or
    /// its `name` where stems collide (`mixer-cifar10/cpu/hacn.yaml` and `mixer-cifar2/cpu/hacn.yaml`).
    fn labelled_configs(&self, origin: &str) -> Result<Vec<(PathBuf, &'static str, String)>> {
        let mut configs = Vec::new();
        for config in &self.configs {
            let config =
                std::path::absolute(config).with_context(|| format!("{origin}: config {}", config.display()))?;
            let text = crate::input_file::read_text(&config, crate::input_file::MAX_CONFIG_BYTES, "a config file")
                .with_context(|| format!("{origin}: reading the config {}", config.display()))?;
            let stem = config.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let name = serde_yaml::from_str::<serde_yaml::Value>(&text)
                .ok()
                .and_then(|v| v.get("name").and_then(|n| n.as_str()).map(String::from))
                .unwrap_or_else(|| stem.clone());
            configs.push((config, crate::kinds::of_config(&text).verb(), stem, name));
        }
        let stems: std::collections::BTreeSet<&String> = configs.iter().map(|c| &c.2).collect();
        let by_name = stems.len() < configs.len();
        Ok(configs.into_iter().map(|(c, verb, stem, name)| (c, verb, if by_name { name } else { stem })).collect())
    }
}

/// `KEY=VALUE` of a flag.
fn split_kv<'a>(s: &'a str, flag: &str) -> Result<(&'a str, &'a str)> {
    match super::claims::key_value(s) {
        Some((k, v)) if !v.is_empty() => Ok((k, v)),
        _ => bail!("{flag} {s}: expected KEY=VALUE, e.g. {flag} topology.init.mu=0.25"),
    }
}

/// A scalar YAML value as `--set` writes it.
fn scalar(v: &serde_yaml::Value, origin: &str, key: &str) -> Result<String> {
    use serde_yaml::Value as V;
    Ok(match v {
        V::String(s) => s.clone(),
        V::Number(n) => n.to_string(),
        V::Bool(b) => b.to_string(),
        _ => bail!(
            "{origin}: `{key}` holds `{}`: allowed: a plain value (number, word, true/false)",
            config::yaml_text(Some(v))
        ),
    })
}

/// Every combination of the axes' values, first axis outermost (one empty point without axes).
fn product(axes: &[(String, Vec<String>)]) -> Vec<Vec<String>> {
    axes.iter().fold(vec![vec![]], |acc, (_, vals)| {
        acc.iter().flat_map(|p| vals.iter().map(move |v| [p.clone(), vec![v.clone()]].concat())).collect()
    })
}

/// The name of each axis in run directory names: the key's last segment (`mu` for
/// `topology.init.mu`), or the whole key where two axes share it.
fn short_names(axes: &[(String, Vec<String>)]) -> Vec<String> {
    let last = |k: &str| k.rsplit('.').next().unwrap_or(k).to_string();
    axes.iter()
        .map(|(k, _)| match axes.iter().filter(|(o, _)| last(o) == last(k)).count() {
            1 => last(k),
            _ => k.clone(),
        })
        .collect()
}

/// A value as part of a directory name: `/` and whitespace become `_`.
fn dir_safe(v: &str) -> String {
    v.chars().map(|c| if c == '/' || c.is_whitespace() { '_' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_is_the_product_of_its_axes_first_axis_outermost() {
        let axes =
            vec![("a.x".to_string(), vec!["1".into(), "2".into()]), ("b.x".to_string(), vec!["p".into(), "q".into()])];
        assert_eq!(product(&axes), vec![vec!["1", "p"], vec!["1", "q"], vec!["2", "p"], vec!["2", "q"]]);
        assert_eq!(short_names(&axes), vec!["a.x", "b.x"]);
        assert_eq!(product(&[]), vec![Vec::<String>::new()]);
    }

    /// One key's values are given once: a second --grid of it is refused, not a silent replacement.
    #[test]
    fn a_grid_key_given_twice_is_refused() {
        let mut spec = SweepSpec::default();
        let e = spec.extend(&[], &[], &["k=0.1".into(), "k=0.2,0.3".into()], &[]).unwrap_err().to_string();
        assert!(e.contains("--grid k is given twice (k=0.1 and k=0.2,0.3)"), "{e}");
        spec.extend(&[], &[], &["k=0.1,0.2".into(), "j=1".into()], &[]).unwrap();
        assert_eq!(spec.grid.len(), 2);
    }

    /// A file that is not a mapping (a runs.csv given as --spec) is named by what it holds, and
    /// its text is not echoed back.
    #[test]
    fn a_spec_that_is_not_a_mapping_says_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("runs.csv");
        std::fs::write(&p, "run,config:seed,final_loss\nr0,0,0.123456\nr1,1,0.654321\n").unwrap();
        let e = format!("{:#}", SweepSpec::from_file(&p).unwrap_err());
        assert!(e.contains("is not a sweep spec: it holds a single value") && !e.contains("0.123456"), "{e}");
    }

    /// A margin on an accuracy written as 0.5 (meant as half a point, read as 50 points) is
    /// refused with both readings; `50 pp` says it is meant and reads as 0.5; `pp` on a loss is
    /// refused; a fraction below 5 points passes; the fingerprint holds the number either way.
    #[test]
    fn accuracy_margins_say_their_unit() {
        let dir = tempfile::tempdir().unwrap();
        let spec = |margin: &str, metric: &str| {
            let p = dir.path().join("s.yaml");
            std::fs::write(
                &p,
                format!(
                    "configs: [c.yaml]\nclaims:\n  - {{id: x, statement: s, source: p, metric: {metric}, a: k=1, b: k=2, \
                     expect: greater, margin: {margin}}}\n"
                ),
            )
            .unwrap();
            SweepSpec::from_file(&p).map_err(|e| format!("{e:#}"))
        };
        let e = spec("0.5", "eval.accuracy").unwrap_err();
        assert!(e.contains("reads as 50 points") && e.contains("`margin: 50 pp`") && e.contains("0.005"), "{e}");
        let written = spec("'50 pp'", "eval.accuracy").unwrap();
        assert_eq!(written.claims[0].margin, Some(0.5));
        let plain = spec("0.5", "final_loss").unwrap();
        assert_eq!(
            super::super::claims::claims_fingerprint(&written.claims),
            super::super::claims::claims_fingerprint(&[super::super::claims::Claim {
                metric: "eval.accuracy".into(),
                ..plain.claims[0].clone()
            }])
        );
        assert!(spec("'2 pp'", "final_loss").unwrap_err().contains("percentage points (pp) are for an accuracy"));
        assert!(spec("'2 points'", "eval.accuracy").unwrap_err().contains("neither a number nor percentage points"));
        assert_eq!(spec("0.005", "best.eval.accuracy").unwrap().claims[0].margin, Some(0.005));
        // 0.1 meant as a tenth of a point would be 10 points: refused too; '10 pp' passes.
        assert!(spec("0.1", "eval.accuracy").unwrap_err().contains("reads as 10 points"));
        assert_eq!(spec("'10 pp'", "eval.accuracy").unwrap().claims[0].margin, Some(0.1));
    }
}
