//! The verbs that read runs (or a config) and write what they show: `plexus connectivity`,
//! `plot`, `analyze`, `sample`, `fd` and `rl --eval` (held-out tasks).

use super::{default_figure_dir, runs_among};
use crate::analysis::{self, AnalyzeOptions};
use crate::config::Override;
use crate::plot::Style;
use crate::run_dir::atomic_write;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// `plexus connectivity CONFIG_OR_RUN [--step N]`: C as CSV on stdout.
pub fn connectivity(path: &Path, step: Option<u64>, overrides: &[Override]) -> Result<()> {
    print!("{}", crate::analysis::connectivity::csv(path, step, overrides)?);
    Ok(())
}

/// `plexus plot RUN...`: the paper figures of runs; `plexus plot CONFIG`: the C the config will
/// train with, before any training. Figures at `style`'s width and in its formats.
pub fn plot(runs: &[PathBuf], style: &Style, out: Option<&Path>, title: Option<&str>, step: Option<u64>) -> Result<()> {
    if let [config] = runs {
        if config.is_file() {
            let out = out.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("figures"));
            crate::run_dir::check_output_dir(&out, "the figure folder")?;
            for p in crate::plot::write_all(&crate::plot::figures::config_connectivity(config)?, style, &out)? {
                println!("{}", p.display());
            }
            return Ok(());
        }
    }
    let runs = &runs_among(runs, "plot")?;
    let out = out.map(Path::to_path_buf).unwrap_or_else(|| default_figure_dir(runs));
    crate::run_dir::check_output_dir(&out, "the figure folder")?;
    let written = crate::plot::write_all(&crate::plot::figures::all(runs, title, step)?, style, &out)?;
    if written.is_empty() {
        let names: Vec<String> = runs.iter().map(|r| r.display().to_string()).collect();
        bail!(
            "nothing to plot in {}: no metrics.csv, connectivity or eval rows yet (has the run started? it writes \
             them as it trains)",
            names.join(", ")
        );
    }
    for p in written {
        println!("{}", p.display());
    }
    Ok(())
}

/// `plexus analyze RUN...`: layer-wise exits, pruning, noise; with `correlate`, the Pearson
/// correlation of the runs' converged residual weights (`correlation.csv`).
pub fn analyze(
    runs: &[PathBuf],
    sigmas: Vec<f64>,
    probs: Vec<f64>,
    repeats: usize,
    correlate: bool,
    device: Option<&str>,
) -> Result<()> {
    let device = match device {
        Some(d) => Some(crate::device::from_flag("--device", d)?),
        None => None,
    };
    let runs = &runs_among(runs, "analyze")?;
    let opts = AnalyzeOptions { sigmas, char_probs: probs, repeats, seed: 0, device };
    let correlation = default_figure_dir(runs).parent().map(|p| p.join("correlation.csv")).unwrap_or_default();
    if correlate {
        crate::run_dir::check_output_file(&correlation, "--correlate's output")?;
    }
    let summaries = runs.iter().map(|r| analysis::analyze(r, &opts)).collect::<Result<Vec<_>>>()?;
    crate::report::print_analysis(&summaries);
    if correlate {
        let m = analysis::correlate(runs)?;
        let path = correlation;
        let csv = crate::report::correlation_csv(runs, &m);
        atomic_write(&path, csv.as_bytes())?;
        println!("\nPearson correlation of the converged residual weights a:\n{csv}→ {}", path.display());
    }
    Ok(())
}

/// `plexus sample RUN`: a grid of samples of a diffusion run.
pub fn sample(run: &Path, per_class: usize, o: &crate::diffusion::SampleOptions, device: &str) -> Result<()> {
    let out = crate::diffusion::sample_run(run, per_class, o, device)?;
    let (sampler, steps) = match o.sampler {
        crate::diffusion::Sampler::Ddim => ("ddim", o.steps),
        crate::diffusion::Sampler::Ddpm => ("ddpm", 1000),
    };
    println!("samples ({sampler}, {steps} steps, cfg {}): {}", o.cfg, out.display());
    Ok(())
}

/// `plexus fd RUN --extractor CLASSIFIER_RUN`: a Fréchet distance of generated against real images,
/// of the final weights, of the checkpoint of `o.step`, or (`every_checkpoint`) of each checkpoint
/// the run kept: the distance over training.
pub fn fd(
    run: &Path,
    extractor: &Path,
    samples: usize,
    o: &crate::diffusion::SampleOptions,
    every_checkpoint: bool,
    device: &str,
) -> Result<()> {
    if !every_checkpoint {
        return fd_at(run, extractor, samples, o, device);
    }
    let steps = crate::fd::checkpoint_steps(run)?;
    if steps.is_empty() {
        bail!(
            "--every-checkpoint: {} kept no complete checkpoint (set log.checkpoint_every and log.keep_checkpoints \
             when training)",
            run.display()
        );
    }
    let listed: Vec<String> = steps.iter().map(u64::to_string).collect();
    println!("{} checkpoints: steps {}", steps.len(), listed.join(", "));
    for step in steps {
        fd_at(run, extractor, samples, &crate::diffusion::SampleOptions { step: Some(step), ..*o }, device)?;
    }
    Ok(())
}

/// One measurement of `plexus fd`, printed and kept with the run ([`crate::fd::record`]).
fn fd_at(
    run: &Path,
    extractor: &Path,
    samples: usize,
    o: &crate::diffusion::SampleOptions,
    device: &str,
) -> Result<()> {
    let r = crate::fd::fd_command(run, extractor, samples, o, device)?;
    let file = crate::fd::record(run, o.step, o, &r)?;
    let at = o.step.map_or("the final weights".to_string(), |s| format!("the checkpoint of step {s}"));
    println!(
        "Fréchet distance {:.4} ({samples} generated from {at} vs {samples} real test images, features of the \
         plexus-trained classifier {}; NOT FID-50K: no Inception network, not comparable with published FIDs)",
        r.fd,
        extractor.display()
    );
    match r.real_floor {
        Some(f) => println!(
            "real-vs-real floor {f:.4} (two disjoint sets of {samples} real test images: the distance sampling alone \
             gives at this count; read the distance above against it)"
        ),
        None => println!("real-vs-real floor: not measured (needs {} held-out images, data.eval_samples)", 2 * samples),
    }
    println!(
        "class agreement {:.1} % (generated images the extractor classifies as the label they were drawn for; \
         chance {:.1} %, the extractor's accuracy on real test images {:.1} %)",
        100.0 * r.class_agreement,
        100.0 / r.classes as f64,
        100.0 * r.extractor_accuracy
    );
    println!("written: {}", file.display());
    Ok(())
}

/// `plexus rl --eval RUN_DIR... [--episodes N]`: each finished run's final policy, the
/// straight-line walker and the random policy on the same `episodes` tasks the run never saw;
/// a table on stdout, and `held_out_eval.json` in each run directory.
pub fn held_out_eval(runs: &[PathBuf], episodes: usize, device: Option<&str>) -> Result<()> {
    anyhow::ensure!(episodes >= 1, "--episodes must be at least 1");
    let device = device
        .map(|d| crate::device::parse_device(d).map_err(anyhow::Error::msg).and_then(crate::device::resolve))
        .transpose()?;
    let mut rows = Vec::new();
    for r in &runs_among(runs, "rl --eval")? {
        let run = crate::rl::trained::open(r, device)?;
        let e = crate::rl::trained::held_out(&run, episodes);
        let row = crate::report::RlHeldOutRow::new(&run.exp.config.name, r, &e);
        crate::run_dir::atomic_write(&r.join("held_out_eval.json"), serde_json::to_string_pretty(&row)?.as_bytes())?;
        rows.push(row);
    }
    crate::report::print_rl_held_out(&rows, episodes);
    Ok(())
}
