//! `plexus rl CONFIG_OR_DIR... [--out DIR] [--set k=v ...] [--overwrite] [--quiet]` trains each
//! config (a directory stands for its `*.yaml` files) and draws the success figure;
//! `plexus rl --plot RUN_DIR... [--out DIR]` only draws it for finished runs;
//! `plexus rl --resume RUN_DIR [--set train.env_steps=N]` continues a run from its last checkpoint.

use super::config::RlExperiment;
use super::trainer::{self, RlOptions, RlSummary};
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

pub fn run(
    inputs: &[PathBuf],
    out: Option<&Path>,
    overrides: &[String],
    overwrite: bool,
    plot_only: bool,
    quiet: bool,
) -> Result<()> {
    if plot_only {
        let dir = out.map(Path::to_path_buf).unwrap_or_else(|| crate::commands::default_figure_dir(inputs));
        for p in super::plot::success(inputs, &dir)? {
            println!("{}", p.display());
        }
        return Ok(());
    }
    // Every config is checked, and every run directory, before the first run starts.
    let mut exps = Vec::new();
    for f in crate::commands::config_files(inputs)? {
        exps.push(RlExperiment::from_file(&f, overrides)?);
    }
    let mut names = std::collections::HashSet::new();
    for e in &exps {
        if !names.insert(e.config.name.clone()) {
            bail!("two configs share the name `{}`; run names must be unique within one command", e.config.name);
        }
    }
    let dirs: Vec<PathBuf> = exps
        .iter()
        .map(|e| match (out, exps.len()) {
            (Some(o), 1) => o.to_path_buf(),
            (Some(o), _) => o.join(&e.config.name),
            (None, _) => Path::new("runs").join(&e.config.name),
        })
        .collect();
    for d in &dirs {
        crate::run_dir::check_new(d, overwrite)?;
    }
    let mut summaries = Vec::new();
    for (e, d) in exps.iter().zip(&dirs) {
        eprintln!("rl {} → {}", e.config.name, d.display());
        summaries.push(trainer::train(e, d, &RlOptions { overwrite, verbose: !quiet, ..Default::default() })?);
    }
    print_table(&summaries);
    if dirs.len() > 1 {
        for p in super::plot::success(&dirs, &crate::commands::default_figure_dir(&dirs))? {
            println!("figure: {}", p.display());
        }
    } else {
        println!("figure: {}", dirs[0].join("figures/success.png").display());
    }
    Ok(())
}

/// `plexus rl --resume RUN_DIR [--set train.env_steps=N]`: continues a run from its latest
/// checkpoint with the config it was trained with (plus the overrides the trainer accepts).
pub fn resume(run: &Path, overrides: &[String], quiet: bool) -> Result<()> {
    let file = run.join("config.yaml");
    if !file.is_file() {
        bail!("--resume: {} is not a `plexus rl` run directory (no config.yaml)", run.display());
    }
    let exp = RlExperiment::from_file(&file, overrides)?;
    eprintln!("rl {} → {} (resuming)", exp.config.name, run.display());
    let s = trainer::train(&exp, run, &RlOptions { resume: true, verbose: !quiet, ..Default::default() })?;
    print_table(std::slice::from_ref(&s));
    println!("figure: {}", run.join("figures/success.png").display());
    Ok(())
}

fn print_table(rows: &[RlSummary]) {
    println!(
        "{:<24} {:<12} {:>5} {:>6} {:>10} {:>9} {:>9} {:>8} {:>9}",
        "run", "topology", "depth", "units", "env steps", "success", "at goal", "random", "time"
    );
    for s in rows {
        println!(
            "{:<24} {:<12} {:>5} {:>6} {:>10} {:>9.3} {:>9.3} {:>8.3} {:>8.1}s",
            s.name, s.topology, s.depth, s.units, s.env_steps, s.success, s.time_at_goal, s.random_success, s.seconds
        );
    }
}
