//! Learning-rate schedules.

use crate::config::{Schedule, TrainConfig};

/// The learning rate of update `step` (0-based): linear warm-up over `warmup_steps`
/// (`lr · (step+1)/warmup`), then constant or cosine decay to `min_lr_ratio · lr` at the last step.
pub fn lr_at(cfg: &TrainConfig, step: u64) -> f64 {
    let (lr, warm) = (cfg.lr, cfg.warmup_steps);
    if step < warm {
        return lr * (step + 1) as f64 / warm as f64;
    }
    match cfg.schedule {
        Schedule::Constant => lr,
        Schedule::Cosine => {
            let span = cfg.steps.saturating_sub(warm).max(1) as f64;
            let progress = ((step - warm) as f64 / span).min(1.0);
            let min = cfg.min_lr_ratio;
            lr * (min + (1.0 - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_reaches_the_floor() {
        let mut cfg = TrainConfig { lr: 1.0, steps: 110, warmup_steps: 10, min_lr_ratio: 0.1, ..Default::default() };
        cfg.schedule = Schedule::Cosine;
        assert_eq!(lr_at(&cfg, 0), 0.1);
        assert_eq!(lr_at(&cfg, 9), 1.0);
        assert!((lr_at(&cfg, 10) - 1.0).abs() < 1e-12);
        assert!((lr_at(&cfg, 60) - 0.55).abs() < 1e-12, "{}", lr_at(&cfg, 60));
        assert!((lr_at(&cfg, 110) - 0.1).abs() < 1e-12);
    }
}
