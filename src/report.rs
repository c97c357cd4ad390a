//! What the commands print and write besides run directories: result tables (training,
//! analysis, benchmarks), `results.csv`, appended benchmark CSVs; a study's tables and verdicts
//! in [`study`].

use crate::analysis;
use crate::run_dir::RunDir;
use crate::train::Summary;
use anyhow::{Context, Result};
use std::path::Path;

/// The text of the CSV `path` that rows are to be appended to: `None` when it does not exist yet;
/// refused when it is not a regular file ([`crate::run_dir::check_output_file`]), larger than
/// [`crate::input_file::MAX_RECORD_BYTES`] (read with that bound), or has other columns than
/// `header`. `plexus bench` calls it before it measures anything, [`append_csv`] again when it writes.
pub fn csv_to_append_to(path: &Path, header: &str) -> Result<Option<String>> {
    (|| -> Result<Option<String>> {
        crate::run_dir::check_append_file(path, "--csv")?;
        if !path.exists() {
            return Ok(None);
        }
        let text = crate::input_file::read_text(path, crate::input_file::MAX_RECORD_BYTES, "a benchmark CSV")?;
        // Rows under another header (a CSV from an older plexus) would be read as wrong columns.
        let first = text.lines().next().unwrap_or("");
        if !first.is_empty() && first != header {
            anyhow::bail!(
                "it has other columns ({first}) than this plexus writes ({header}); move it away or delete it"
            );
        }
        Ok(Some(text))
    })()
    .with_context(|| format!("appending to the CSV {}", path.display()))
}

/// Appends `rows` (CSV lines, each ending in a newline) to the CSV at `path`, writing `header`
/// first when the file is new (see [`csv_to_append_to`] for what is refused).
pub fn append_csv(path: &Path, header: &str, rows: &str) -> Result<()> {
    // The whole file rewritten atomically, not appended to: a full disk leaves it as it was.
    let mut text = csv_to_append_to(path, header)?.unwrap_or_else(|| format!("{header}\n"));
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(rows);
    crate::run_dir::atomic_write(path, text.as_bytes())
        .with_context(|| format!("appending to the CSV {}", path.display()))
}

/// The analysis table: final metric, Γ, the exit at half depth, robustness at the largest noise.
pub fn print_analysis(rows: &[analysis::AnalysisSummary]) {
    println!(
        "\n{:<22} {:<24} {:>6} {:>14} {:>7} {:>20} {:>18}",
        "run", "topology", "units", "final", "Γ", "exit at L/2", "largest noise"
    );
    let metric = |acc: Option<f64>, ppl: Option<f64>, loss: f64| match (ppl, acc) {
        (Some(p), _) => format!("ppl {p:.2}"),
        (None, Some(a)) => format!("acc {:.2}%", 100.0 * a),
        _ => format!("loss {loss:.3e}"),
    };
    for r in rows {
        let fin = r.final_eval.as_ref().map(|e| metric(e.accuracy, e.perplexity, e.loss)).unwrap_or_default();
        let half = format!(
            "{} units: {}",
            r.half_depth.units,
            metric(r.half_depth.accuracy, r.half_depth.perplexity, r.half_depth.loss)
        );
        let noisy = r
            .noise
            .last()
            .map(|n| {
                format!(
                    "{}={}: {}",
                    n.kind.level_symbol(),
                    n.level,
                    metric(n.mean_accuracy, n.mean_perplexity, n.mean_loss)
                )
            })
            .unwrap_or_default();
        let gamma = r.gamma.map(|g| format!("{g:.3}")).unwrap_or_else(|| "-".into());
        println!("{:<22} {:<24} {:>6} {:>14} {:>7} {:>20} {:>18}", r.run, r.topology, r.depth, fin, gamma, half, noisy);
    }
}

/// The runs' summaries as CSV text, one row per run (the table `plexus train` writes beside a set's
/// runs).
pub fn results_csv(summaries: &[Summary]) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "run",
        "topology",
        "layout",
        "steps",
        "initial_loss",
        "final_loss",
        "min_loss",
        "steps_to_1e-3",
        "params",
        "seconds",
    ])?;
    for s in summaries {
        w.write_record([
            s.name.clone(),
            s.topology.clone(),
            s.topology_label.clone(),
            s.steps.to_string(),
            s.initial_loss.to_string(),
            s.final_loss.to_string(),
            s.min_loss.to_string(),
            s.steps_to_1e3.map(|v| v.to_string()).unwrap_or_default(),
            s.num_params.to_string(),
            format!("{:.3}", s.wall_seconds),
        ])?;
    }
    Ok(String::from_utf8(w.into_inner()?)?)
}

/// `(step, loss)` of every `metrics.csv` row of a run.
pub fn read_losses(run: &Path) -> Result<Vec<(f64, f64)>> {
    let dir = RunDir::new(run);
    anyhow::ensure!(dir.metrics_file().is_file(), "{}: no metrics.csv", run.display());
    Ok(dir.metrics()?.iter().map(|m| (m.step as f64, m.loss)).collect())
}

/// One run of `plexus rl --eval`: the final policy and the two baselines on the same held-out
/// tasks, with 95 % intervals (success: Wilson; time at goal: over the tasks).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RlHeldOutRow {
    pub run: String,
    pub dir: String,
    pub tasks: usize,
    pub blocked_share: f64,
    /// `[rate, low, high]` for the trained policy, the straight-line walker and the random policy.
    pub success: [f64; 3],
    pub straight_success: [f64; 3],
    pub random_success: [f64; 3],
    pub time_at_goal: [f64; 3],
    pub straight_time_at_goal: [f64; 3],
    /// Success on the tasks whose straight line crosses a wall.
    pub success_blocked: [f64; 3],
    pub straight_success_blocked: [f64; 3],
}

impl RlHeldOutRow {
    /// The row of run `name` (in `dir`) from its held-out evaluation `e`: success rates with Wilson
    /// intervals and times at the goal with intervals over the tasks, for the policy and both
    /// baselines, and success on the blocked tasks.
    pub fn new(name: &str, dir: &std::path::Path, e: &crate::rl::trained::HeldOut) -> Self {
        use crate::rl::trained::{time_at_goal95, wilson95};
        let rate = |ep: &crate::rl::trainer::Episodes, blocked: Option<bool>| {
            let hits: Vec<bool> = ep
                .reached
                .iter()
                .zip(&ep.blocked)
                .filter(|(_, b)| blocked.is_none_or(|want| **b == want))
                .map(|(r, _)| *r)
                .collect();
            let k = hits.iter().filter(|&&h| h).count();
            let (lo, hi) = wilson95(k, hits.len());
            [k as f64 / hits.len() as f64, lo, hi]
        };
        let time = |ep: &crate::rl::trainer::Episodes| {
            let (m, lo, hi) = time_at_goal95(ep);
            [m, lo, hi]
        };
        Self {
            run: name.to_string(),
            dir: dir.display().to_string(),
            tasks: e.trained.reached.len(),
            blocked_share: e.trained.blocked_share(),
            success: rate(&e.trained, None),
            straight_success: rate(&e.straight, None),
            random_success: rate(&e.random, None),
            time_at_goal: time(&e.trained),
            straight_time_at_goal: time(&e.straight),
            success_blocked: rate(&e.trained, Some(true)),
            straight_success_blocked: rate(&e.straight, Some(true)),
        }
    }
}

/// The `plexus rl --eval` table: success and time at goal in percent with their 95 % intervals.
pub fn print_rl_held_out(rows: &[RlHeldOutRow], tasks: usize) {
    let pct = |v: [f64; 3]| format!("{:.1} [{:.1}, {:.1}]", 100.0 * v[0], 100.0 * v[1], 100.0 * v[2]);
    println!(
        "{:<32} {:>20} {:>20} {:>20} {:>20} {:>20} {:>8}",
        "run", "success %", "at goal %", "straight %", "random %", "success|b %", "blocked"
    );
    for r in rows {
        println!(
            "{:<32} {:>20} {:>20} {:>20} {:>20} {:>20} {:>7.0}%",
            r.run,
            pct(r.success),
            pct(r.time_at_goal),
            pct(r.straight_success),
            pct(r.random_success),
            pct(r.success_blocked),
            100.0 * r.blocked_share
        );
    }
    println!(
        "({tasks} held-out tasks per run, the same for every run of one seed; [95 % interval]; |b: on the tasks whose \
         straight line to the goal crosses a wall, `blocked` of them)"
    );
}

/// The correlation matrix of `plexus analyze --correlate` as CSV (`run,<run>,…` header, one row
/// per run).
pub fn correlation_csv(runs: &[std::path::PathBuf], m: &ndarray::Array2<f64>) -> String {
    let mut s = String::from("run");
    for r in runs {
        s += &format!(",{}", r.display());
    }
    s.push('\n');
    for (r, row) in runs.iter().zip(m.rows()) {
        s += &r.display().to_string();
        for v in row {
            s += &format!(",{v}");
        }
        s.push('\n');
    }
    s
}

/// What `plexus tokenize` wrote.
pub fn print_tokenize(out: &Path, r: &crate::data::tokenize::TokenizeReport, threads: usize) {
    println!(
        "{}: train.bin {} tokens, val.bin {} tokens ({} MB of text in {:.1}s, {:.1} MB/s, {threads} threads)",
        out.display(),
        r.train_tokens,
        r.val_tokens,
        r.bytes / 1_000_000,
        r.seconds,
        r.bytes as f64 / 1e6 / r.seconds.max(1e-9)
    );
}

/// `plexus list`: what the registries hold.
pub fn print_registries() {
    println!("topologies (topology.kind):");
    for e in crate::topology::REGISTRY {
        println!("  {:<12} {}", e.name, e.about);
    }
    println!("backbones (model.kind):");
    for e in crate::model::REGISTRY {
        println!("  {:<12} {}", e.name, e.about);
        println!("  {:<12} {}", "", backbone_options(&(e.options)()));
    }
    println!("datasets (data.kind):");
    for e in crate::data::REGISTRY {
        println!("  {:<20} {}", e.name, e.about);
    }
    println!("embedded config sets (plexus demo --figure NAME):");
    for s in crate::sets::SETS {
        println!("  {:<12} {}", s.name, s.about);
    }
}

/// A backbone's options on one line: `patch: 4, width: 128, …; depth required; image_size, … from
/// the data or the width` (what [`crate::config::option_defaults`] gives).
fn backbone_options(options: &serde_yaml::Mapping) -> String {
    let (mut given, mut required, mut derived) = (Vec::new(), Vec::new(), Vec::new());
    for (k, v) in options {
        let k = k.as_str().unwrap_or_default();
        match v {
            serde_yaml::Value::Null => derived.push(k.to_string()),
            serde_yaml::Value::String(s) if s == "required" => required.push(k.to_string()),
            v => given.push(format!("{k}: {}", serde_yaml::to_string(v).unwrap_or_default().trim())),
        }
    }
    let mut parts = vec![given.join(", ")];
    if !required.is_empty() {
        parts.push(format!("{} required", required.join(", ")));
    }
    if !derived.is_empty() {
        parts.push(format!("{} derived from the data or the width", derived.join(", ")));
    }
    parts.retain(|p| !p.is_empty());
    parts.join("; ")
}

pub mod study;

#[cfg(test)]
mod tests {
    #[test]
    fn rows_are_appended_under_their_own_header_only() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("sub/raw.csv");
        super::append_csv(&p, "a,b", "1,2\n").unwrap();
        super::append_csv(&p, "a,b", "3,4\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a,b\n1,2\n3,4\n");
        let e = format!("{:#}", super::append_csv(&p, "a,b,c", "5,6,7\n").unwrap_err());
        assert!(e.contains("raw.csv") && e.contains("other columns (a,b)") && e.contains("(a,b,c)"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a,b\n1,2\n3,4\n", "nothing appended");
    }
}
