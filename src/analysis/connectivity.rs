//! `plexus connectivity`: the matrix C of a config's freshly initialised model or of a trained
//! run (its final weights, or a step it saved), on the probe batch the trainer uses.

use crate::config::Override;
use crate::experiment::Experiment;
use crate::run_dir::RunDir;
use anyhow::{bail, Result};
use std::path::Path;

/// C as CSV for a config (initialised model) or a run directory (final checkpoint, or a saved step).
pub fn csv(path: &Path, step: Option<u64>, overrides: &[Override]) -> Result<String> {
    if let (true, Some(step)) = (path.is_dir(), step) {
        let run = RunDir::open(path)?;
        crate::kinds::expect_kind(&run, &crate::kinds::TRAIN)?;
        let f = run.connectivity_file(step);
        if !f.is_file() {
            let saved = run.connectivity_steps().unwrap_or_default();
            let saved = match saved.as_slice() {
                [] => "none (the run saves C every log.connectivity_every steps; 0 is never)".to_string(),
                s => s.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
            };
            bail!("no C saved at step {step} in {}: the saved steps are {saved}", path.display());
        }
        return crate::input_file::read_text(&f, crate::input_file::MAX_RECORD_BYTES, "a matrix CSV");
    }
    anyhow::ensure!(step.is_none(), "--step needs a run directory, not a config");
    Ok(crate::run_dir::matrix_csv(&matrix(path, overrides)?))
}

/// C `[L + 2, L + 2]` (row = source node, column = target) of a config's initialised model or of a
/// run's final weights.
pub fn matrix(path: &Path, overrides: &[Override]) -> Result<crate::run_dir::Matrix> {
    let dev = tch::Device::Cpu;
    let (exp, model) = if path.is_dir() {
        crate::kinds::expect_kind(&RunDir::open(path)?, &crate::kinds::TRAIN)?;
        let open = crate::train::trained::OpenOptions {
            device: Some(dev),
            compute: Some(tch::Kind::Float),
            overrides,
            ..Default::default()
        };
        let run = crate::train::trained::open(path, &open)?;
        (run.exp, run.model)
    } else {
        let exp = Experiment::from_file(path, overrides)?;
        let model = crate::device::with_seed(exp.config().seed, || {
            crate::model::Model::new(exp.model.as_ref(), exp.topology.as_ref(), dev, tch::Kind::Float)
        });
        (exp, model)
    };
    let cfg = exp.config();
    let c = match exp.data.load() {
        Ok(data) => {
            if path.is_dir() {
                exp.check_data(path, data.as_ref())?;
            }
            model.connectivity(&exp.probe_input(&data.train_batch(0)?, &data.input_transform(), dev))
        }
        // C needs the model and the data's shape, not the data: without it, a random batch of
        // that shape, and a second one to say whether C depends on the input at all.
        Err(e) => {
            let info = exp.data.info();
            let on = |seed: u64| {
                model.connectivity(&exp.probe_input(
                    &random_batch(&info, seed),
                    &crate::data::InputTransform::Identity,
                    dev,
                ))
            };
            let (c, other) = (on(cfg.seed), on(cfg.seed.wrapping_add(1)));
            let differs = crate::host::scalar(&(&c - other).abs().max()) > 1e-9;
            let shape: Vec<usize> =
                [RANDOM_BATCH as usize].into_iter().chain(info.input_shape.iter().copied()).collect();
            eprintln!(
                "note: the data is not available ({}); C is computed on a random batch of the data's shape {shape:?}. {}",
                format!("{e:#}").lines().next().unwrap_or(""),
                if differs {
                    "This topology's C depends on the input (two random batches give different C): on real data it \
                     will differ; put the data where data.root says (or set PLEXUS_DATA) for C on it"
                        .to_string()
                } else {
                    "This topology's C does not depend on the input (two random batches give the same C): it is \
                     exact"
                        .to_string()
                }
            );
            c
        }
    };
    Ok(crate::host::matrix(&c))
}

/// Examples in [`random_batch`].
const RANDOM_BATCH: i64 = 8;

/// A batch of the data's shape drawn from `seed`, in the model's input space: N(0, 1) images or
/// vectors, uniform token ids for language models, with uniform labels where there are classes.
fn random_batch(info: &crate::data::DataInfo, seed: u64) -> crate::data::Batch {
    use crate::data::Task;
    let b = RANDOM_BATCH;
    let shape: Vec<i64> = [b].into_iter().chain(info.input_shape.iter().map(|&d| d as i64)).collect();
    let opts = (tch::Kind::Float, tch::Device::Cpu);
    crate::device::with_seed(seed, || match &info.task {
        Task::LanguageModel => {
            let tokens =
                tch::Tensor::randint(info.output_dim as i64, shape.as_slice(), (tch::Kind::Int64, tch::Device::Cpu));
            crate::data::Batch { target: tokens.shallow_clone(), input: tokens }
        }
        Task::Classification | Task::Diffusion(_) => {
            let classes = match &info.task {
                Task::Diffusion(d) => d.num_classes,
                _ => info.output_dim as i64,
            };
            crate::data::Batch {
                input: tch::Tensor::randn(shape.as_slice(), opts),
                target: tch::Tensor::randint(classes, [b], (tch::Kind::Int64, tch::Device::Cpu)),
            }
        }
        Task::HalfSumSquares => crate::data::Batch {
            input: tch::Tensor::randn(shape.as_slice(), opts),
            target: tch::Tensor::randn([b, info.output_dim as i64], opts),
        },
    })
}
