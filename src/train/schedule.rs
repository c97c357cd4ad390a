//! Learning-rate schedules, and what a lengthened run does with them.
//!
//! A schedule is a pure function of the run's config: `lr_at(cfg, step)`. Cosine depends on the
//! run's length, so raising `train.steps` on a resumed run would re-plan every remaining update
//! (the learning rate of a finished 500-step run jumps 67× at update 500 when it is extended to
//! 600). A lengthening therefore says what the added updates do ([`ExtendRule`]) and the run
//! records it in `train.extensions`: the schedule is then a chain of segments, each from the
//! update a lengthening continued from, and a fresh run of the lengthened `config.yaml` follows
//! the same learning rates as the run that was lengthened.

use crate::config::{ExtendRule, Schedule, TrainConfig};

/// One stretch of the schedule: from update `start` on, the base formula laid out from `origin`
/// to `end` (with `warmup` steps of warm-up from `origin`), or a constant (`hold`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Segment {
    start: u64,
    origin: u64,
    end: u64,
    warmup: u64,
    hold: Option<f64>,
}

impl Segment {
    fn lr(&self, cfg: &TrainConfig, step: u64) -> f64 {
        if let Some(v) = self.hold {
            return v;
        }
        let (lr, s) = (cfg.lr, step.saturating_sub(self.origin));
        if s < self.warmup {
            return lr * (s + 1) as f64 / self.warmup as f64;
        }
        match cfg.schedule {
            Schedule::Constant => lr,
            Schedule::Cosine => {
                let span = (self.end - self.origin).saturating_sub(self.warmup).max(1) as f64;
                let progress = ((s - self.warmup) as f64 / span).min(1.0);
                let min = cfg.min_lr_ratio;
                lr * (min + (1.0 - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))
            }
        }
    }
}

/// The segments of `cfg`'s schedule, the first from update 0; each lengthening of
/// `train.extensions` adds one from its `at` (a later one from the same update replaces it there).
fn segments(cfg: &TrainConfig) -> Vec<Segment> {
    let ext = &cfg.extensions;
    let end_of = |k: usize| ext.get(k).map_or(cfg.steps, |e| e.from_steps);
    let mut segs = vec![Segment { start: 0, origin: 0, end: end_of(0), warmup: cfg.warmup_steps, hold: None }];
    for (k, e) in ext.iter().enumerate() {
        let in_effect = |segs: &[Segment], step: u64| -> Segment {
            *segs.iter().rev().find(|s| s.start <= step).expect("the first segment starts at update 0")
        };
        let end = end_of(k + 1);
        let seg = match e.rule {
            ExtendRule::Hold => {
                let last = e.at.saturating_sub(1);
                let v = in_effect(&segs, last).lr(cfg, last);
                Segment { start: e.at, origin: e.at, end, warmup: 0, hold: Some(v) }
            }
            ExtendRule::Restart => Segment { start: e.at, origin: e.at, end, warmup: 0, hold: None },
            ExtendRule::Stretch => Segment { start: e.at, end, ..in_effect(&segs, e.at) },
        };
        segs.push(seg);
    }
    segs
}

/// The learning rate of update `step` (0-based): linear warm-up over `warmup_steps`
/// (`lr · (step+1)/warmup`), then constant or cosine decay to `min_lr_ratio · lr` at the last step;
/// after a lengthening (`train.extensions`), what its rule gives.
pub fn lr_at(cfg: &TrainConfig, step: u64) -> f64 {
    let segs = segments(cfg);
    let seg = segs.iter().rev().find(|s| s.start <= step).expect("the first segment starts at update 0");
    seg.lr(cfg, step)
}

/// Whether raising `train.steps` would change the learning rate of updates already planned: the
/// schedule in effect at the end is a cosine laid out to the run's end (not a held value).
pub fn depends_on_length(cfg: &TrainConfig) -> bool {
    cfg.schedule == Schedule::Cosine && segments(cfg).last().is_some_and(|s| s.hold.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Extension;

    fn cosine(steps: u64) -> TrainConfig {
        TrainConfig {
            lr: 1.0,
            steps,
            warmup_steps: 10,
            min_lr_ratio: 0.1,
            schedule: Schedule::Cosine,
            ..Default::default()
        }
    }

    #[test]
    fn warmup_then_cosine_reaches_the_floor() {
        let cfg = cosine(110);
        assert_eq!(lr_at(&cfg, 0), 0.1);
        assert_eq!(lr_at(&cfg, 9), 1.0);
        assert!((lr_at(&cfg, 10) - 1.0).abs() < 1e-12);
        assert!((lr_at(&cfg, 60) - 0.55).abs() < 1e-12, "{}", lr_at(&cfg, 60));
        assert!((lr_at(&cfg, 110) - 0.1).abs() < 1e-12);
    }

    /// Each rule, on a 110-update cosine lengthened to 210 from update 110: the updates before
    /// keep their learning rates; `hold` continues at update 109's, `restart` is a fresh cosine
    /// from the peak over the 100 added updates, `stretch` is the 210-update cosine.
    #[test]
    fn a_lengthening_schedules_the_added_updates_by_its_rule() {
        let planned = cosine(110);
        let with = |rule| {
            let mut c = cosine(210);
            c.extensions = vec![Extension { at: 110, from_steps: 110, rule }];
            c
        };
        for rule in ExtendRule::ALL {
            let c = with(rule);
            for s in 0..110 {
                assert_eq!(lr_at(&c, s), lr_at(&planned, s), "{rule}: update {s} keeps its rate");
            }
        }
        let hold = with(ExtendRule::Hold);
        assert!((110..210).all(|s| lr_at(&hold, s) == lr_at(&planned, 109)));
        let restart = with(ExtendRule::Restart);
        assert_eq!(lr_at(&restart, 110), 1.0);
        assert!((lr_at(&restart, 160) - 0.55).abs() < 1e-12);
        assert!((lr_at(&restart, 210) - 0.1).abs() < 1e-12);
        let stretch = with(ExtendRule::Stretch);
        assert!((110..=210).all(|s| lr_at(&stretch, s) == lr_at(&cosine(210), s)));
        assert!(depends_on_length(&planned) && depends_on_length(&restart) && depends_on_length(&stretch));
        assert!(!depends_on_length(&hold), "a held rate does not depend on where the run ends");
        assert!(!depends_on_length(&TrainConfig { steps: 50, ..Default::default() }), "constant");
    }

    /// Two lengthenings chain: a stretch of a restart stretches the restarted cycle; a hold after
    /// a stretch holds the stretched cosine's rate.
    #[test]
    fn lengthenings_chain() {
        let mut c = cosine(400);
        c.extensions = vec![
            Extension { at: 100, from_steps: 110, rule: ExtendRule::Restart },
            Extension { at: 200, from_steps: 300, rule: ExtendRule::Stretch },
        ];
        // The restart laid out 100 → 300, then stretched to 400: a cosine from 100 to 400.
        let fresh = Segment { start: 100, origin: 100, end: 400, warmup: 0, hold: None };
        assert!((200..=400).all(|s| lr_at(&c, s) == fresh.lr(&c, s)));
        assert!((100..200).all(|s| lr_at(&c, s) == Segment { end: 300, ..fresh }.lr(&c, s)));
        c.extensions.push(Extension { at: 250, from_steps: 400, rule: ExtendRule::Hold });
        c.steps = 500;
        assert!((250..500).all(|s| lr_at(&c, s) == fresh.lr(&c, 249)));
    }
}
