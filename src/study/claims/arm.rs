//! A claim's arms: the runs each one names, `KEY=VALUE[,KEY=VALUE…]` on their configs, parsed
//! once when the spec is read.

use super::Claim;
use crate::study::collect::RunRecord;
use anyhow::{bail, Result};
use std::collections::BTreeMap;

/// One arm of a claim: the runs whose flattened config has every `KEY=VALUE` of it, as written
/// (`topology.kind=hacn,topology.init.mu=0.25`). Empty for the missing arm B of an
/// `across_seeds` claim. It reads and writes as its text, so a claim's fingerprint is the text's.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Arm {
    text: String,
    settings: Vec<(String, String)>,
}

impl TryFrom<String> for Arm {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Arm::default());
        }
        let settings = text
            .split(',')
            .map(|kv| match key_value(kv) {
                Some((k, v)) => Ok((k.to_string(), v.to_string())),
                None => Err(format!("`{text}` must be KEY=VALUE[,KEY=VALUE…], e.g. name=lnn-fig2b-0to2")),
            })
            .collect::<Result<_, String>>()?;
        Ok(Arm { text, settings })
    }
}

/// `KEY=VALUE` split at its first `=`, both sides trimmed; `None` without an `=` or with an empty
/// key. The one reader of a setting written as text in a study (an arm's settings, `--grid`'s axis,
/// `--baseline`); `--set` has its own, [`crate::config::Override`], which also types the value.
pub fn key_value(text: &str) -> Option<(&str, &str)> {
    let (k, v) = text.split_once('=')?;
    (!k.trim().is_empty()).then(|| (k.trim(), v.trim()))
}

impl From<Arm> for String {
    fn from(arm: Arm) -> String {
        arm.text
    }
}

#[cfg(test)]
impl From<&str> for Arm {
    /// An arm written in a test; panics on text that is no arm (specs go through `TryFrom`).
    fn from(text: &str) -> Arm {
        Arm::try_from(text.to_string()).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl std::fmt::Display for Arm {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl Arm {
    /// Whether the arm names no setting (the absent arm B of an across-seeds claim).
    pub fn is_empty(&self) -> bool {
        self.settings.is_empty()
    }

    /// The arm as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Its `(KEY, VALUE)` pairs, in the order written.
    pub fn settings(&self) -> &[(String, String)] {
        &self.settings
    }

    /// Whether a run of flattened `config` is of this arm (never, for an empty arm).
    pub fn matches(&self, config: &BTreeMap<String, String>) -> bool {
        !self.is_empty() && self.settings.iter().all(|(k, v)| config.get(k) == Some(v))
    }
}

/// Whether `run` belongs to one of the claim's arms (the runs whose metrics it reads: a metric
/// that only other runs lack does not hold the claim back).
pub fn in_an_arm(claim: &Claim, run: &RunRecord) -> bool {
    claim.a.matches(&run.config) || claim.b.matches(&run.config)
}

/// The metrics the claim reads from `run`: `metric` (an across-seeds claim's entries) where the
/// run is in arm A, `b_metric` where it is in arm B (both for a claim on two numbers of the same
/// runs); none for a run of neither arm. A claim whose arms read different metrics (`CURVE@WHEN>=V`
/// at each task's own level, say) waits only on what each arm's runs are read at.
pub fn metrics_read_from(claim: &Claim, run: &RunRecord) -> Vec<String> {
    let mut read = Vec::new();
    if claim.a.matches(&run.config) {
        read = if claim.across_seeds.is_some() { claim.metrics() } else { vec![claim.metric.clone()] };
    }
    if claim.b.matches(&run.config) && !read.iter().any(|m| m == claim.metric_of_b()) {
        read.push(claim.metric_of_b().to_string());
    }
    read
}

/// The runs of one arm by seed, in seed order. An arm that names a key
/// no run has, or a value no run has, is an error saying which and what the runs have; so is a
/// run of the arm without a seed, or two runs of the arm with one seed (one run counted twice, or
/// arm keys that leave a setting open): a claim pairs one run per arm and seed.
pub(super) fn arm_runs<'r>(
    claim: &Claim,
    which: &str,
    arm: &Arm,
    runs: &'r [RunRecord],
) -> Result<Vec<(u64, &'r RunRecord)>> {
    let text = arm.as_str();
    if arm.is_empty() {
        bail!("claim `{}`: no arm {which}", claim.id);
    }
    let of_arm: Vec<&RunRecord> = runs.iter().filter(|r| arm.matches(&r.config)).collect();
    if of_arm.is_empty() {
        bail!("claim `{}`: arm {which} ({text}) {}", claim.id, why_no_run(arm.settings(), runs));
    }
    let mut by_seed: Vec<(u64, &RunRecord)> = Vec::new();
    for r in of_arm {
        let Some(seed) = r.seed() else {
            bail!(
                "claim `{}`: run {} of arm {which} ({text}) has no seed (its config's `seed`{}); a claim pairs runs by seed",
                claim.id,
                r.dir.display(),
                r.config.get("seed").map(|s| format!(" is `{s}`, not a whole number ≥ 0")).unwrap_or_default()
            );
        };
        if let Some((_, other)) = by_seed.iter().find(|(s, _)| *s == seed) {
            bail!(
                "claim `{}`: arm {which} ({text}) has two runs with seed {seed}: {} and {}; a claim pairs one run per \
                 arm and seed (is one run counted twice, or do the arm's keys leave a setting open? add KEY=VALUE)",
                claim.id,
                other.dir.display(),
                r.dir.display()
            );
        }
        by_seed.push((seed, r));
    }
    by_seed.sort_by_key(|p| p.0);
    Ok(by_seed)
}

/// Why no run matches the arm `kv`: a key no run's config has (with the keys of its section), a
/// value no run has (with the values they have), or no run with all of them at once.
fn why_no_run(kv: &[(String, String)], runs: &[RunRecord]) -> String {
    let list = |mut v: Vec<String>| {
        v.sort();
        v.dedup();
        let more = v.len().saturating_sub(12);
        v.truncate(12);
        format!("{}{}", v.join(", "), if more > 0 { format!(", … ({more} more)") } else { String::new() })
    };
    for (k, v) in kv {
        if !runs.iter().any(|r| r.config.contains_key(k)) {
            let section = k.split('.').next().unwrap_or(k);
            let near: Vec<String> = runs
                .iter()
                .flat_map(|r| r.config.keys())
                .filter(|c| c.split('.').next() == Some(section))
                .cloned()
                .collect();
            return if near.is_empty() {
                format!(
                    "matches no run: no run's config has the key `{k}` (their sections: {})",
                    list(
                        runs.iter()
                            .flat_map(|r| r.config.keys())
                            .map(|c| c.split('.').next().unwrap_or(c).to_string())
                            .collect()
                    )
                )
            } else {
                format!("matches no run: no run's config has the key `{k}` (keys of `{section}`: {})", list(near))
            };
        }
        if !runs.iter().any(|r| r.config.get(k) == Some(v)) {
            return format!(
                "matches no run: no run has {k}={v} (the runs' values of {k}: {})",
                list(runs.iter().filter_map(|r| r.config.get(k).cloned()).collect())
            );
        }
    }
    "matches no run: each KEY=VALUE is some run's, but no run has all of them".into()
}
