//! The training loop: build data and model from an [`Experiment`], optimise, log `metrics.csv`,
//! save connectivity matrices, a checkpoint and `summary.json` into a run directory.

use crate::config::Optimizer;
use crate::device;
use crate::experiment::Experiment;
use crate::model::Model;
use crate::run_dir::{atomic_write, atomic_write_with, matrix_csv, RunDir};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::time::Instant;
use tch::{nn, nn::OptimizerConfig, Tensor};

#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// Show a progress bar (on stderr, only when it is a terminal).
    pub progress: bool,
}

/// What `summary.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub name: String,
    pub model: String,
    pub topology: String,
    pub topology_label: String,
    pub steps: u64,
    pub initial_loss: f64,
    pub final_loss: f64,
    pub min_loss: f64,
    /// First logged step whose loss is ≤ 1e-3 × the initial loss (a convergence-speed measure
    /// that, unlike the final loss, does not depend on where fp32 round-off stops progress).
    pub steps_to_1e3: Option<u64>,
    pub num_params: i64,
    pub device: String,
    pub wall_seconds: f64,
    /// The topology's own parameter view at the end (e.g. ANCRe `p`), rows = sources.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameter_view: Option<(String, Vec<Vec<f64>>)>,
}

/// One `metrics.csv` row.
#[derive(Debug, Clone, Serialize)]
struct Row {
    step: u64,
    loss: f64,
    grad_norm: f64,
    lr: f64,
}

pub fn train(exp: &Experiment, dir: &RunDir, opts: &TrainOptions) -> Result<Summary> {
    let cfg = exp.config();
    let dev = device::resolve(device::parse_device(&cfg.device).map_err(anyhow::Error::msg)?)?;
    let compute = device::compute_kind(cfg.precision);
    let task = exp.data.info().task;
    let data = exp.data.load()?;

    let model = device::with_seed(cfg.seed, || Model::new(exp.model.as_ref(), exp.topology.as_ref(), dev, compute));
    atomic_write(&dir.file("config.yaml"), cfg.to_yaml().as_bytes())?;

    let lr = cfg.train.lr;
    let mut adamw = match cfg.train.optimizer {
        Optimizer::Gd => None,
        Optimizer::Adamw => Some(nn::AdamW { wd: cfg.train.weight_decay, ..Default::default() }.build(&model.vs, lr)?),
    };
    let vars: Vec<(String, Tensor)> = {
        let mut v: Vec<_> = model.vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };

    let steps = cfg.train.steps;
    let bar = progress_bar(steps, &cfg.name, opts.progress);
    let start = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    for step in 0..=steps {
        let batch = data.train_batch(step).to_device(dev);
        let output = model.forward(&batch.input, true);
        let loss = match model.topology.regularizer() {
            Some(r) => task.loss(&output, &batch.target) + r,
            None => task.loss(&output, &batch.target),
        };
        let loss_value = loss.double_value(&[]);
        if !loss_value.is_finite() {
            write_metrics(dir, &rows)?;
            let culprit = if output.isfinite().all().int64_value(&[]) == 0 { "model output" } else { "loss" };
            bail!(
                "{}: step {step}: the {culprit} went non-finite (loss = {loss_value}); metrics up to here are in {}",
                cfg.name,
                dir.file("metrics.csv").display()
            );
        }
        for (_, t) in &vars {
            t.shallow_clone().zero_grad();
        }
        loss.backward();
        let grad_norm = global_grad_norm(&vars);
        if !grad_norm.is_finite() {
            write_metrics(dir, &rows)?;
            let name = vars
                .iter()
                .find(|(_, t)| t.grad().isfinite().all().int64_value(&[]) == 0)
                .map(|(n, _)| n.as_str())
                .unwrap_or("?");
            bail!("{}: step {step}: the gradient of `{name}` went non-finite (loss = {loss_value})", cfg.name);
        }
        if step % cfg.log.every == 0 || step == steps {
            rows.push(Row { step, loss: loss_value, grad_norm, lr });
            bar.set_message(format!("{loss_value:.3e}"));
        }
        let c_every = cfg.log.connectivity_every;
        if (c_every > 0 && step % c_every == 0) || step == steps {
            let c = model.connectivity(&batch.input);
            atomic_write(&dir.path.join("connectivity").join(format!("step_{step}.csv")), matrix_csv(&c).as_bytes())?;
        }
        if step == steps {
            break;
        }
        match adamw.as_mut() {
            Some(opt) => opt.step(),
            None => tch::no_grad(|| {
                for (_, t) in vars.iter().filter(|(_, t)| t.grad().defined()) {
                    let _ = t.shallow_clone().g_sub_(&(t.grad() * lr));
                }
            }),
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let wall = start.elapsed().as_secs_f64();

    write_metrics(dir, &rows)?;
    atomic_write_with(&dir.path.join("checkpoints").join("final.safetensors"), |p| {
        model.vs.save(p).with_context(|| format!("saving checkpoint {}", p.display()))
    })?;
    let losses: Vec<f64> = rows.iter().map(|r| r.loss).collect();
    let summary = Summary {
        name: cfg.name.clone(),
        model: exp.model.kind().to_string(),
        topology: exp.topology.kind().to_string(),
        topology_label: exp.topology.label(),
        steps,
        initial_loss: losses[0],
        final_loss: *losses.last().expect("at least one row"),
        min_loss: losses.iter().cloned().fold(f64::INFINITY, f64::min),
        steps_to_1e3: rows.iter().find(|r| r.loss <= 1e-3 * rows[0].loss).map(|r| r.step),
        num_params: model.num_params(),
        device: format!("{dev:?}"),
        wall_seconds: wall,
        parameter_view: model
            .parameter_view(&data.train_batch(0).input.to_device(dev))
            .map(|(n, m)| (n, crate::topology::common::to_rows(&m))),
    };
    atomic_write(&dir.file("summary.json"), serde_json::to_string_pretty(&summary)?.as_bytes())?;
    Ok(summary)
}

fn global_grad_norm(vars: &[(String, Tensor)]) -> f64 {
    tch::no_grad(|| {
        vars.iter()
            .map(|(_, t)| t.grad())
            .filter(|g| g.defined())
            .map(|g| g.to_kind(tch::Kind::Double).square().sum(tch::Kind::Double).double_value(&[]))
            .sum::<f64>()
            .sqrt()
    })
}

fn write_metrics(dir: &RunDir, rows: &[Row]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)?;
    }
    if rows.is_empty() {
        w.write_record(["step", "loss", "grad_norm", "lr"])?;
    }
    atomic_write(&dir.file("metrics.csv"), &w.into_inner()?)
}

fn progress_bar(steps: u64, name: &str, show: bool) -> ProgressBar {
    let bar = ProgressBar::new(steps);
    if !show {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{prefix:>20} [{bar:30}] {pos}/{len} loss {msg} {per_sec} ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(name.to_string());
    bar
}
