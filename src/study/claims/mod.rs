//! Pre-registered claims and their verdicts. A study's spec lists the claims it tests, each written
//! before its runs: what the paper says, the metric, the two arms compared on shared seeds, the
//! direction (or equivalence within a margin), α and the family it is corrected within. `plexus
//! report` applies one rule to every claim (docs/studies.md, "Claims and verdicts"):
//!
//! - the paired differences `d_i = A_i − B_i` over the seeds both arms ran (on `scale: log`,
//!   `ln A_i − ln B_i`: a ratio, for losses that span decades);
//! - a directional claim (`expect: less | greater`) **holds** when the two-sided paired t-test is
//!   significant after Holm's correction over the family and the mean difference points the
//!   paper's way; it **does not hold** when it is significant the other way, or when a `margin` is
//!   given and the equivalence test (TOST) shows `|Δ| < margin` at α/m (m: the family's size); else
//!   it is **inconclusive**;
//! - an equivalence claim (`expect: equivalent`, with its `margin`) **holds** when TOST is
//!   significant after Holm's correction; it **does not hold** when `|Δ| > margin` is significant at
//!   α/m; else inconclusive;
//! - an inconclusive claim with the paper's `effect` is **underpowered** when that effect needs
//!   more seeds than ran (80 % power at α/m, with the spread the runs showed).
//!
//! A claim about one arm across its seeds (`across_seeds: correlation`, with the vector metric's
//! `size`) has no arm B: its statistic is the mean Pearson correlation r̄ of the vector (say, the
//! converged residual weights `final.a[0..size]`) over every pair of seeds, and its p the share of
//! layer permutations (each seed's vector shuffled on its own, 9,999 of them, a fixed stream) with
//! an r̄ as high: the null is that the seeds share no profile over the layers. It **holds** when
//! that p is significant after Holm and r̄ > 0, **does not hold** when r̄ is as significantly
//! below what the permutations give, else inconclusive; its interval is the bootstrap over seeds.
//!
//! The claim as written is [`schema`]; its arms, [`arm`]; what is checked before any run,
//! [`check`]; the rule applied to the runs, [`evaluate`]; a verdict and how it reads, [`verdict`].

mod arm;
mod check;
mod evaluate;
mod schema;
mod verdict;

pub use arm::{in_an_arm, key_value, metrics_read_from, Arm};
pub use check::{check, check_against_plan, check_written_units, MAX_BARE_ACCURACY_AMOUNT};
pub use evaluate::{evaluate, metric_value, seed_correlation};
pub use schema::{
    claims_fingerprint, figure_stem, AcrossSeeds, Amendment, Claim, Expect, Scale, MAX_ID_CHARS, MAX_SIZE,
};
pub use verdict::{ClaimResult, Verdict};

#[cfg(test)]
mod tests;
