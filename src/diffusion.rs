//! Sampling from a trained DiT (DDPM ancestral sampling and deterministic DDIM, with
//! classifier-free guidance) and the commands that sample: `plexus sample` ([`sample_run`]) and
//! the generator side of `plexus fd`. The DDPM maths of training (schedule, forward process, the
//! loss and the variational bound) is in [`crate::task::ddpm`], re-exported here.

pub use crate::config::DiffusionConfig;
use crate::task::ddpm::learned_log_var;
pub use crate::task::ddpm::{alpha_bar, betas, noisy, pack, vb_bits, Diffusion, Schedule, BUCKETS, EVAL_SEED, STEPS};
use tch::{Kind, Tensor};

/// A reverse-process sampler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sampler {
    /// DDPM ancestral sampling over all 1000 steps, posterior variance `β̃_t` (or the
    /// model's own with `learn_sigma`).
    Ddpm,
    /// DDIM with η = 0 (deterministic) over `steps` evenly spaced timesteps.
    Ddim,
}

/// Which weights of a diffusion run draw the samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Weights {
    /// The moving average (`train.ema`) where the run kept one, else the trained weights.
    #[default]
    Auto,
    /// The moving average; an error if the run kept none.
    Ema,
    /// The weights as trained (`final.safetensors`).
    Raw,
}

/// Where `plexus sample` writes its grid: `figures/samples-{ddim50|ddpm}-cfg{scale}.png`.
pub fn samples_file(run: &crate::run_dir::RunDir, o: &SampleOptions) -> std::path::PathBuf {
    let s = match o.sampler {
        Sampler::Ddim => format!("ddim{}", o.steps),
        Sampler::Ddpm => "ddpm".to_string(),
    };
    let at = o.step.map_or(String::new(), |n| format!("-step{n}"));
    run.figures_dir().join(format!("samples-{s}-cfg{}{at}.png", o.cfg))
}

/// The weights file of `run` for `which`: `final_ema.safetensors` or `final.safetensors`; with
/// `step`, the raw weights of the checkpoint at that step.
pub fn weights_file(
    run: &crate::run_dir::RunDir,
    which: Weights,
    step: Option<u64>,
) -> anyhow::Result<std::path::PathBuf> {
    if let Some(step) = step {
        anyhow::ensure!(
            which != Weights::Ema,
            "--step {step} --weights ema: checkpoints hold the raw weights only (the moving average is kept at the end)"
        );
        return crate::train::checkpoint::weights_at_step(run, step);
    }
    let ema = run.final_ema_checkpoint();
    match which {
        Weights::Raw => Ok(run.final_checkpoint()),
        Weights::Auto if ema.is_file() => Ok(ema),
        Weights::Auto => Ok(run.final_checkpoint()),
        Weights::Ema if ema.is_file() => Ok(ema),
        Weights::Ema => anyhow::bail!(
            "--weights ema: {} has no {} (the run kept no moving average: set train.ema, e.g. 0.9999, when training)",
            run.path.display(),
            ema.display()
        ),
    }
}

/// How to sample: the sampler, its number of steps (DDIM), the guidance scale and the seed; also
/// the flags of `plexus sample` and `plexus fd`.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct SampleOptions {
    /// ddim (deterministic, --steps steps) or ddpm (ancestral, all 1000 steps).
    #[arg(long, value_enum, default_value = "ddim")]
    pub sampler: Sampler,
    /// DDIM steps (DDPM always runs all 1000).
    #[arg(long, default_value_t = 50)]
    pub steps: usize,
    /// Classifier-free guidance scale (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub cfg: f64,
    /// Seed of the noise and of the classes drawn: the same seed gives the same images.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Weights to sample with: the moving average where the run kept one (`auto`), `ema`, or `raw`.
    #[arg(long, value_enum, default_value = "auto")]
    pub weights: Weights,
    /// Use the checkpoint of this training step (its raw weights) instead of the final weights,
    /// e.g. to pick the best step by FD; a run keeps its last `log.keep_checkpoints` checkpoints.
    #[arg(long)]
    pub step: Option<u64>,
}

/// The most images per class `plexus sample` draws into its grid.
pub const MAX_PER_CLASS: usize = 100;
/// The most images sampled at once (`plexus sample`, `plexus fd`).
pub const SAMPLE_CHUNK: i64 = 256;

/// The largest classifier-free guidance scale the sampling commands take (papers use 1.5–10; far
/// beyond, ε̂ overflows and the images are not finite).
pub const MAX_CFG: f64 = 100.0;

impl SampleOptions {
    /// The options in words, as `plexus fd` prints and records them (`ddim, 50 steps, cfg 1, seed
    /// 0, weights auto, final weights` / `…, checkpoint of step 500`).
    pub fn describe(&self) -> String {
        let sampler = match self.sampler {
            Sampler::Ddim => format!("ddim, {} steps", self.steps),
            Sampler::Ddpm => format!("ddpm, {STEPS} steps"),
        };
        let weights = format!("{:?}", self.weights).to_lowercase();
        let at = self.step.map_or("final weights".to_string(), |s| format!("checkpoint of step {s}"));
        format!("{sampler}, cfg {}, seed {}, weights {weights}, {at}", self.cfg, self.seed)
    }

    /// The flags `plexus sample` and `plexus fd` share, checked once for both: `--cfg` a finite
    /// scale in 0..=[`MAX_CFG`], `--steps` in 1..=1000.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.cfg.is_finite() && (0.0..=MAX_CFG).contains(&self.cfg),
            "--cfg must be a finite guidance scale in 0..={MAX_CFG} (1 = no guidance), got {}",
            self.cfg
        );
        anyhow::ensure!(
            (1..=STEPS as usize).contains(&self.steps),
            "--steps must be in 1..={STEPS}, got {}",
            self.steps
        );
        Ok(())
    }
}

/// The timesteps a sampler visits, descending: every `t` for DDPM; for DDIM `steps` timesteps
/// `⌊i·T/steps⌋`, `i = steps−1..0`.
pub fn timesteps(sampler: Sampler, steps: usize) -> Vec<i64> {
    match sampler {
        Sampler::Ddpm => (0..STEPS).rev().collect(),
        Sampler::Ddim => {
            let n = (steps as i64).clamp(1, STEPS);
            let mut v: Vec<i64> = (0..n).map(|i| i * STEPS / n).collect();
            v.dedup();
            v.reverse();
            v
        }
    }
}

/// Draws images from the reverse process. `eps` is the model: a packed input
/// ([`crate::model::dit::pack`]) `[N, C·S·S + 2]` → `[N, out_C, S, S]` (its first `C` channels are
/// ε̂). `labels` `[N]` int64 on the model's device; `shape` = `[N, C, S, S]`; options `o`. Classifier-free
/// guidance with scale `cfg`: `ε̂ = ε̂(∅) + cfg·(ε̂(y) − ε̂(∅))` (the model runs on the labels and the
/// null class in one batch of `2N`; `cfg = 1` runs it on the labels alone). The start noise and
/// DDPM's noise are drawn from `seed` (deterministic for a seed on a device). Returns `x_0`
/// `[N, C, S, S]` fp32, in the model's data space (the training input transform's output).
pub fn sample(
    eps: impl Fn(&Tensor) -> Tensor,
    d: &Diffusion,
    shape: [i64; 4],
    labels: &Tensor,
    o: &SampleOptions,
) -> Tensor {
    let SampleOptions { sampler, steps, cfg, seed, .. } = *o;
    let dev = labels.device();
    let ab: Vec<f64> = crate::host::values(&alpha_bar());
    let beta: Vec<f64> = crate::host::values(&betas());
    let _seed = crate::device::seed_guard(seed);
    tch::no_grad(|| {
        let mut x = Tensor::randn(shape, (Kind::Float, dev));
        let n = shape[0];
        // ε̂ (guided) and, with `learn_sigma`, the variance channels `v` of the conditional half.
        let guided = |x: &Tensor, t: i64| -> (Tensor, Option<Tensor>) {
            let tt = Tensor::full([n], t, (Kind::Int64, dev));
            let c = d.channels;
            let variance = |out: &Tensor| d.learn_sigma.then(|| out.narrow(0, 0, n).narrow(1, c, c));
            if cfg == 1.0 {
                let out = eps(&pack(x, &tt, labels));
                return (out.narrow(1, 0, c), variance(&out));
            }
            let null = labels.full_like(d.num_classes);
            let out = eps(&Tensor::cat(&[pack(x, &tt, labels), pack(x, &tt, &null)], 0));
            let e = out.narrow(1, 0, c);
            let (cond, uncond) = (e.narrow(0, 0, n), e.narrow(0, n, n));
            (&uncond + (cond - &uncond) * cfg, variance(&out))
        };
        let schedule = d.learn_sigma.then(|| Schedule::on(dev));
        let ts = timesteps(sampler, steps);
        for (i, &t) in ts.iter().enumerate() {
            let (e, v) = guided(&x, t);
            let a = ab[t as usize];
            match sampler {
                Sampler::Ddim => {
                    let prev = ts.get(i + 1).map_or(1.0, |&p| ab[p as usize]);
                    let x0 = (&x - &e * (1.0 - a).sqrt()) / a.sqrt();
                    x = x0 * prev.sqrt() + e * (1.0 - prev).sqrt();
                }
                Sampler::Ddpm => {
                    let b = beta[t as usize];
                    let mean = (&x - e * (b / (1.0 - a).sqrt())) / (1.0 - b).sqrt();
                    x = if t > 0 {
                        let noise = x.randn_like();
                        let noise = match (&v, &schedule) {
                            (Some(v), Some(s)) => {
                                let tt = Tensor::full([n], t, (Kind::Int64, dev));
                                noise * (learned_log_var(s, v, &tt) * 0.5).exp()
                            }
                            _ => noise * (b * (1.0 - ab[t as usize - 1]) / (1.0 - a)).sqrt(),
                        };
                        mean + noise
                    } else {
                        mean
                    };
                }
            }
        }
        x
    })
}

/// `plexus sample`: loads a DiT run's final checkpoint, draws `per_class` images of every class
/// (classes in rows) and writes them as one PNG grid into the run's figures directory
/// ([`samples_file`]). Pixels are mapped back through the data's input
/// transform (`x·std + mean`, clamped to [0, 1]); images with more than 3 channels (latents) show
/// their first 3 channels, each min-max scaled. Returns the PNG's path.
pub fn sample_run(
    run: &std::path::Path,
    per_class: usize,
    o: &SampleOptions,
    device: &str,
) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    let dir = crate::run_dir::RunDir::open(run)?;
    crate::kinds::expect_kind(&dir, &crate::kinds::TRAIN)?;
    let exp = crate::experiment::Experiment::of_run(&dir.path, &dir.config_file(), &[])?;
    let crate::data::Task::Diffusion(d) = exp.task() else {
        anyhow::bail!("{}: not a diffusion run (model.kind is `{}`, not `dit`)", run.display(), exp.model.kind());
    };
    anyhow::ensure!(
        (1..=MAX_PER_CLASS).contains(&per_class),
        "--per-class {per_class}: expected an integer in 1..={MAX_PER_CLASS} (images per class in the PNG grid; \
         to score many samples, use plexus fd --samples)"
    );
    o.check()?;
    let dev = crate::device::from_flag("--device", device)?;
    let choose = |d: &crate::run_dir::RunDir| weights_file(d, o.weights, o.step);
    let open = crate::train::trained::OpenOptions {
        device: Some(dev),
        compute: Some(Kind::Float),
        weights: &choose,
        ..Default::default()
    };
    let model = crate::train::trained::open(run, &open)?.model;
    let info = exp.data.info();
    let (c, s) = (info.input_shape[0] as i64, info.input_shape[1] as i64);
    let k = d.num_classes;
    let labels = Tensor::arange(k, (Kind::Int64, dev)).repeat_interleave_self_int(per_class as i64, 0, None);
    let n = labels.size()[0];
    // In chunks of at most SAMPLE_CHUNK images, so memory does not grow with the grid (chunk i
    // draws its noise from seed + its first image's index, as `plexus fd` does).
    let x = Tensor::cat(
        &(0..n)
            .step_by(SAMPLE_CHUNK as usize)
            .map(|at| {
                let m = (n - at).min(SAMPLE_CHUNK);
                let chunk = SampleOptions { seed: o.seed.wrapping_add(at as u64), ..*o };
                sample(|x| model.forward(x, false), &d, [m, c, s, s], &labels.narrow(0, at, m), &chunk)
            })
            .collect::<Vec<_>>(),
        0,
    );
    let transform = exp.load_run_data(&dir.path)?.input_transform();
    let x = match transform {
        crate::data::InputTransform::Pixels { mean, std } => {
            let col = |v: &[f64]| {
                let v: Vec<f32> = (0..c as usize).map(|i| v[i.min(v.len() - 1)] as f32).collect();
                Tensor::from_slice(&v).view([1, c, 1, 1]).to_device(dev)
            };
            (x * col(&std) + col(&mean)).clamp(0.0, 1.0)
        }
        crate::data::InputTransform::Identity => {
            let lo = x.amin([0, 2, 3], true);
            let hi = x.amax([0, 2, 3], true);
            (x - &lo) / (hi - lo + 1e-8)
        }
    };
    let x = if c > 3 { x.narrow(1, 0, 3) } else { x };
    let ch = x.size()[1];
    // Grid [k·(S+2), per·(S+2), ch] with 2-pixel gaps, row = class.
    let g = (s + 2) as usize;
    let (h, w) = (k as usize * g, per_class * g);
    let px: Vec<f32> = crate::host::values(&(x * 255.0).round()).into_iter().map(|v| v as f32).collect();
    let mut img = image::RgbImage::new(w as u32, h as u32);
    for i in 0..n as usize {
        let (row, col) = (i / per_class, i % per_class);
        for yy in 0..s as usize {
            for xx in 0..s as usize {
                let at = |cc: usize| px[((i * ch as usize + cc) * s as usize + yy) * s as usize + xx] as u8;
                let rgb = if ch == 1 { [at(0); 3] } else { [at(0), at(1), at(2)] };
                img.put_pixel((col * g + 1 + xx) as u32, (row * g + 1 + yy) as u32, image::Rgb(rgb));
            }
        }
    }
    let out = samples_file(&dir, o);
    crate::run_dir::atomic_write_with(&out, |p| img.save(p).context("encoding the PNG"))?;
    Ok(out)
}
