//! A report's tables read back: `runs.csv` (one row per run: the config keys the report used and
//! its metrics at full precision) and its companion `runs.curves.csv` (every logged point), so
//! that a report and its claims' verdicts can be recomputed from small committed files.

use super::collect::RunRecord;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The prefix of the config columns in a report's `runs.csv` (`config:seed`, `config:name`);
/// the other columns after `run` are metrics.
pub const CONFIG_COLUMN: &str = "config:";

/// The runs of a report's `runs.csv` (written by `plexus report` beside report.md: one row per
/// run, its config keys the report used and its metrics at full precision), so that a report and
/// its claims' verdicts can be recomputed from a small committed file. Runs read this way have no
/// curves: their `dir` is the run's name.
///
/// A table is checked as data, since a verdict computed from a damaged one would be silently
/// wrong: the file is read within [`crate::input_file::MAX_RECORD_BYTES`]; its header has `run`
/// first and no column twice; it has at least one row; `config:seed` is a whole number ≥ 0; each
/// metric cell is empty or a finite number (plexus writes no other); and a run listed twice is one
/// run when its rows agree, else an error naming both rows.
pub fn read_runs_csv(path: &Path) -> Result<Vec<RunRecord>> {
    read_runs_tables(&[path])
}

/// [`read_runs_csv`] over several tables: a run (by its name) in two of them, or twice in one,
/// is one run when its rows agree, else an error naming both places.
pub fn read_runs_tables(paths: &[&Path]) -> Result<Vec<RunRecord>> {
    let mut runs: Vec<RunRecord> = Vec::new();
    let mut origin: Vec<String> = Vec::new();
    let mut repeated = 0usize;
    for path in paths {
        for (row, run) in read_one_runs_csv(path)? {
            let here = format!("{} row {row}", path.display());
            match runs.iter().position(|r| r.dir == run.dir) {
                None => {
                    runs.push(run);
                    origin.push(here);
                }
                Some(i) if runs[i].config == run.config && runs[i].metrics == run.metrics => repeated += 1,
                Some(i) => bail!(
                    "run {} is listed twice with different values: {} and {here}; a run is one row (remove the \
                     stale copy)",
                    run.dir.display(),
                    origin[i]
                ),
            }
        }
    }
    if repeated > 0 {
        eprintln!("report: {repeated} row(s) repeat a run already read with the same values; each run counted once");
    }
    for path in paths {
        let companion = curves_table_of(path);
        if companion.is_file() {
            read_curves_table(&companion, &mut runs)?;
        }
    }
    Ok(runs)
}

/// The curves table that goes with a runs table: `NAME.curves.csv` beside `NAME.csv` (a report
/// folder's `runs.csv` has `runs.curves.csv`).
pub fn curves_table_of(runs_csv: &Path) -> PathBuf {
    let stem = runs_csv.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    runs_csv.with_file_name(format!("{stem}.curves.csv"))
}

/// Reads a curves table (`run,curve,x,y`, one row per logged point, in order) into the runs it
/// names; a run the runs tables do not have, or a number that is not one, is an error naming the
/// row.
fn read_curves_table(path: &Path, runs: &mut [RunRecord]) -> Result<()> {
    let bytes = crate::input_file::read_bounded(path, crate::input_file::MAX_RECORD_BYTES, "a report's curves table")?;
    let mut r = csv::ReaderBuilder::new().flexible(false).from_reader(bytes.as_slice());
    let head: Vec<String> =
        r.headers().with_context(|| format!("reading {}", path.display()))?.iter().map(String::from).collect();
    if head != ["run", "curve", "x", "y"] {
        bail!(
            "{}: not a curves table (its columns must be run, curve, x, y; it has {})",
            path.display(),
            head.join(", ")
        );
    }
    for (line, rec) in r.records().enumerate() {
        let row = line + 2;
        let rec = rec.with_context(|| format!("{}: row {row}", path.display()))?;
        let Some(run) = runs.iter_mut().find(|run| run.dir.as_os_str() == &rec[0]) else {
            bail!("{}: row {row} names run `{}`, which the runs table does not list", path.display(), &rec[0]);
        };
        let number = |i: usize| -> Result<f64> {
            rec[i].parse::<f64>().ok().filter(|v| !v.is_nan()).ok_or_else(|| {
                anyhow::anyhow!("{}: row {row}, column {}: `{}` is not a number", path.display(), head[i], &rec[i])
            })
        };
        let point = (number(2)?, number(3)?);
        run.curves.entry(rec[1].to_string()).or_default().push(point);
    }
    Ok(())
}

/// One runs.csv's rows as `(row number, run)` (see [`read_runs_csv`]).
fn read_one_runs_csv(path: &Path) -> Result<Vec<(usize, RunRecord)>> {
    let bytes = crate::input_file::read_bounded(path, crate::input_file::MAX_RECORD_BYTES, "a report's runs.csv")?;
    let mut r = csv::ReaderBuilder::new().flexible(false).from_reader(bytes.as_slice());
    let head: Vec<String> =
        r.headers().with_context(|| format!("reading {}", path.display()))?.iter().map(String::from).collect();
    if head.first().map(String::as_str) != Some("run") {
        bail!("{}: not a report's runs.csv (its first column must be `run`)", path.display());
    }
    for (i, col) in head.iter().enumerate() {
        if let Some(j) = head[..i].iter().position(|c| c == col) {
            bail!(
                "{}: column `{col}` appears twice (columns {} and {}); each config key and metric is one column",
                path.display(),
                j + 1,
                i + 1
            );
        }
    }
    let mut runs = Vec::new();
    for (line, rec) in r.records().enumerate() {
        let row = line + 2;
        let rec = rec.with_context(|| format!("{}: row {row}", path.display()))?;
        if rec[0].trim().is_empty() {
            bail!("{}: row {row} has no run name (column `run`)", path.display());
        }
        let mut run = RunRecord {
            dir: PathBuf::from(&rec[0]),
            config: BTreeMap::new(),
            metrics: BTreeMap::new(),
            curves: BTreeMap::new(),
        };
        for (col, value) in head.iter().zip(rec.iter()).skip(1) {
            let shown = || -> String {
                let v: String = value.chars().take(24).collect();
                if value.chars().count() > 24 {
                    format!("{v}…")
                } else {
                    v
                }
            };
            if let Some(key) = col.strip_prefix(CONFIG_COLUMN) {
                if key == "seed" && value.parse::<u64>().is_err() {
                    bail!(
                        "{}: row {row} (run {}), column `{col}`: `{}` is not a seed (a whole number ≥ 0, as a run's \
                         config has it)",
                        path.display(),
                        &rec[0],
                        shown()
                    );
                }
                run.config.insert(key.to_string(), value.to_string());
            } else if !value.is_empty() {
                let v: f64 = value.parse().map_err(|_| {
                    anyhow::anyhow!("{}: row {row}, column {col}: `{}` is not a number", path.display(), shown())
                })?;
                if !v.is_finite() {
                    bail!(
                        "{}: row {row} (run {}), column `{col}`: `{}` is not a finite number; plexus report writes \
                         none (a run without the metric leaves the cell empty)",
                        path.display(),
                        &rec[0],
                        shown()
                    );
                }
                run.metrics.insert(col.clone(), v);
            }
        }
        runs.push((row, run));
    }
    if runs.is_empty() {
        bail!("{}: a runs.csv without rows (only its header): no run to report", path.display());
    }
    Ok(runs)
}
