//! `plexus bench`: one config's step (with its profile and Chrome trace), a paired topology
//! comparison, a depth sweep, or a rank of `--nproc`'s data-parallel step.

use crate::experiment::Experiment;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// What `plexus bench` was asked.
pub struct BenchRequest {
    pub config: PathBuf,
    pub overrides: Vec<crate::config::Override>,
    pub options: crate::bench::BenchOptions,
    pub csv: Option<PathBuf>,
    pub compare: Vec<String>,
    pub depths: Vec<usize>,
    pub topologies: Vec<String>,
    pub out: PathBuf,
    pub dist_timeout: std::time::Duration,
}

/// `plexus bench`: one config, a paired topology comparison, a depth sweep, or (as a rank of
/// `--nproc`) the data-parallel step.
pub fn bench(r: &BenchRequest) -> Result<()> {
    let opts = &r.options;
    if let Some(info) = crate::dist::DistInfo::from_env(r.dist_timeout)? {
        anyhow::ensure!(
            r.compare.is_empty() && r.depths.is_empty() && !opts.profile && r.csv.is_none(),
            "a data-parallel benchmark (--nproc) times one config: --compare, --depths, --profile and --csv are \
             for single-process benchmarks"
        );
        let exp = Experiment::from_file(&r.config, &r.overrides)?;
        if let Some(row) = crate::bench::bench_distributed(&exp, opts, info)? {
            crate::bench::table::print_dist_bench(&row);
        }
        return Ok(());
    }
    if opts.trace.is_some() && (!r.compare.is_empty() || !r.depths.is_empty()) {
        bail!("--trace is the Chrome trace of one config's profiled step: not with --compare or --depths");
    }
    // Every output is checked before anything is measured: a CSV to append to (bounded, its
    // columns), the depth sweep's folder; the trace below.
    if let Some(path) = &r.csv {
        let header =
            if r.compare.is_empty() { crate::bench::CSV_HEADER } else { crate::bench::table::COMPARE_CSV_HEADER };
        crate::report::csv_to_append_to(path, header)?;
    }
    if !r.compare.is_empty() {
        crate::bench::depth::compare(&r.config, &r.overrides, opts, &r.compare, r.csv.as_deref())
    } else if r.depths.is_empty() {
        bench_one(r)
    } else {
        crate::run_dir::check_output_dir(&r.out, "--out")?;
        crate::bench::depth::sweep(&r.config, &r.overrides, opts, &r.depths, &r.topologies, &r.out).map(drop)
    }
}

/// One config's step: timed, with its profile and Chrome trace when asked (the trace written
/// through a private folder beside it and renamed into place), appended to the CSV when given.
fn bench_one(r: &BenchRequest) -> Result<()> {
    let exp = Experiment::from_file(&r.config, &r.overrides)?;
    let mut opts = r.options.clone();
    let trace = match (&opts.trace, opts.profile) {
        (Some(t), true) => Some(t.clone()),
        (None, true) => {
            let case = opts.case.clone().unwrap_or_else(|| exp.config().name.clone());
            Some(Path::new("runs/bench-profile").join(format!("{case}.json")))
        }
        (_, false) => None,
    };
    // The profiler writes the trace into a private folder beside it (libtorch writes a
    // temporary file of its own and renames it, and says nothing when that fails); the trace
    // is renamed into place once it is there, and the folder goes with whatever else is in it.
    let staging = match &trace {
        Some(t) => {
            crate::run_dir::check_output_file(t, "--trace")?;
            let dir = t.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let staging = tempfile::Builder::new().prefix(".tmp-trace-").tempdir_in(dir).with_context(|| {
                format!("--trace {}: creating a temporary folder in {}", t.display(), dir.display())
            })?;
            opts.trace = Some(staging.path().join("trace.json"));
            Some(staging)
        }
        None => None,
    };
    let row = crate::bench::bench(&exp, &opts)?;
    if let (Some(trace), Some(staging)) = (&trace, &staging) {
        let written = staging.path().join("trace.json");
        if !written.is_file() {
            bail!(
                "--trace {}: the profiler wrote no Chrome trace (libtorch's profiler failed to save it)",
                trace.display()
            );
        }
        crate::run_dir::check_output_file(trace, "--trace")?;
        std::fs::rename(&written, trace).with_context(|| format!("writing the Chrome trace {}", trace.display()))?;
    }
    crate::bench::table::print_bench(std::slice::from_ref(&row));
    if let Some(trace) = &trace {
        println!("Chrome trace of the profiled step: {} (chrome://tracing or ui.perfetto.dev)", trace.display());
    }
    if let Some(path) = &r.csv {
        crate::report::append_csv(path, crate::bench::CSV_HEADER, &format!("{}\n", row.csv()))?;
    }
    Ok(())
}
