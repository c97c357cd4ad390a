//! Robustness to input noise: zero-mean Gaussian noise on vector/image inputs (H-ACN Fig. 3c),
//! character-level insert/delete/swap noise on token inputs (H-ACN Table 1).

use super::Run;
use crate::data::Task;
use crate::train::eval::evaluate_with;
use anyhow::Result;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tch::{Kind, Tensor};

/// The corruption applied: written `gaussian` / `char` in `noise.csv`.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NoiseKind {
    /// Zero-mean Gaussian noise of standard deviation σ on the model input.
    Gaussian,
    /// Character insert/delete/swap with per-token probability p.
    Char,
}

impl NoiseKind {
    /// The symbol of its level in tables: σ or p.
    pub fn level_symbol(self) -> &'static str {
        match self {
            NoiseKind::Gaussian => "σ",
            NoiseKind::Char => "p",
        }
    }
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct NoiseRow {
    pub kind: NoiseKind,
    pub level: f64,
    pub repeat: usize,
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub perplexity: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NoiseSummary {
    pub kind: NoiseKind,
    pub level: f64,
    pub mean_loss: f64,
    pub mean_accuracy: Option<f64>,
    pub std_accuracy: Option<f64>,
    pub mean_perplexity: Option<f64>,
}

/// Corrupts token sequences `[B, T]`: at each position, with probability `p`, one of insert (a
/// random token before it), delete, or swap (with the next token), chosen uniformly; rows are cut
/// or padded (random tokens) back to T. Only the inputs are corrupted; targets stay clean.
pub fn char_noise(tokens: &Tensor, p: f64, vocab: i64, rng: &mut impl Rng) -> Tensor {
    let (b, t) = (tokens.size()[0], tokens.size()[1]);
    // Token ids are integers far below 2^53: exact through f64.
    let flat: Vec<i64> = crate::host::values(tokens).into_iter().map(|v| v as i64).collect();
    let mut out = Vec::with_capacity((b * t) as usize);
    for row in flat.chunks(t as usize) {
        let mut s: Vec<i64> = Vec::with_capacity(row.len() + 8);
        let mut i = 0;
        while i < row.len() {
            if rng.gen::<f64>() < p {
                match rng.gen_range(0..3) {
                    0 => {
                        s.push(rng.gen_range(0..vocab));
                        s.push(row[i]);
                    }
                    1 => {}
                    _ if i + 1 < row.len() => {
                        s.push(row[i + 1]);
                        s.push(row[i]);
                        i += 1;
                    }
                    _ => s.push(row[i]),
                }
            } else {
                s.push(row[i]);
            }
            i += 1;
        }
        s.resize_with(row.len(), || rng.gen_range(0..vocab));
        out.extend(s);
    }
    Tensor::from_slice(&out).view([b, t]).to_device(tokens.device())
}

/// Every noise level × repeat on the run's evaluation batches.
pub fn robustness(run: &Run, opts: &super::AnalyzeOptions) -> Result<Vec<NoiseRow>> {
    let tokens = run.task == Task::LanguageModel;
    let (kind, levels) = if tokens { (NoiseKind::Char, &opts.char_probs) } else { (NoiseKind::Gaussian, &opts.sigmas) };
    let vocab = run.exp.data.info().output_dim as i64;
    let mut rows = Vec::new();
    for &level in levels {
        for repeat in 0..opts.repeats {
            let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed ^ (repeat as u64) << 32 ^ level.to_bits());
            // The noise goes on the model input (after normalisation), batch by batch, in order.
            let noisy = |x: &Tensor| {
                if tokens {
                    char_noise(x, level, vocab, &mut rng)
                } else {
                    let seed = rng.gen::<u64>();
                    let noise = crate::device::with_seed(seed, || x.randn_like());
                    x.to_kind(Kind::Float) + noise * level
                }
            };
            let mut noisy = noisy;
            let r = evaluate_with(run.task, &run.eval, 0, |x| run.model.forward(&noisy(x), false)).expect("batches");
            rows.push(NoiseRow { kind, level, repeat, loss: r.loss, accuracy: r.accuracy, perplexity: r.perplexity });
        }
    }
    Ok(rows)
}

/// Mean ± std over repeats, per level.
pub fn summarise(rows: &[NoiseRow]) -> Vec<NoiseSummary> {
    let mut levels: Vec<f64> = rows.iter().map(|r| r.level).collect();
    levels.dedup();
    levels
        .into_iter()
        .map(|level| {
            let rs: Vec<&NoiseRow> = rows.iter().filter(|r| r.level == level).collect();
            let n = rs.len() as f64;
            let mean = |f: &dyn Fn(&NoiseRow) -> Option<f64>| -> Option<f64> {
                let v: Vec<f64> = rs.iter().filter_map(|r| f(r)).collect();
                (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
            };
            let mean_acc = mean(&|r| r.accuracy);
            let std_acc = mean_acc.map(|m| {
                (rs.iter().filter_map(|r| r.accuracy).map(|a| (a - m) * (a - m)).sum::<f64>() / n.max(1.0)).sqrt()
            });
            NoiseSummary {
                kind: rs[0].kind,
                level,
                mean_loss: rs.iter().map(|r| r.loss).sum::<f64>() / n,
                mean_accuracy: mean_acc,
                std_accuracy: std_acc,
                mean_perplexity: mean(&|r| r.perplexity),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn char_noise_keeps_shape_and_p_zero_is_identity() {
        let t = Tensor::arange(40, (Kind::Int64, tch::Device::Cpu)).view([2, 20]);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        assert_eq!(
            Vec::<i64>::try_from(char_noise(&t, 0.0, 50, &mut rng).view([-1])).unwrap(),
            (0..40).collect::<Vec<_>>()
        );
        let n = char_noise(&t, 0.5, 50, &mut rng);
        assert_eq!(n.size(), [2, 20]);
        assert!(n.ne_tensor(&t).any().int64_value(&[]) == 1);
    }
}
