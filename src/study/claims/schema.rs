//! A claim as a spec writes it: its fields, and the fingerprint a sweep records.

use super::Arm;
use serde::{Deserialize, Serialize};

/// What the paper says about arm A relative to arm B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// A's metric is lower than B's (a loss, a step count).
    Less,
    /// A's metric is higher than B's (an accuracy).
    Greater,
    /// A and B agree within `margin`.
    Equivalent,
    /// A is not above B by `margin` or more (non-inferiority where lower is better: a loss "on
    /// par with the best" is `at_most` the best's plus the margin).
    AtMost,
    /// A is not below B by `margin` or more (non-inferiority where higher is better).
    AtLeast,
}

/// The scale a claim compares on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// `A − B`, in the metric's unit.
    #[default]
    Linear,
    /// `ln A − ln B` (a ratio A/B): for positive quantities that span decades, such as losses.
    Log,
}

fn default_alpha() -> f64 {
    0.05
}

fn default_family() -> String {
    "study".into()
}

/// One claim of a study, as written in its spec (`claims:`), before the runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// A short name, unique in the study (`fig2b-0to2-faster`).
    pub id: String,
    /// What the paper says, in a sentence.
    pub statement: String,
    /// The paper and its figure or table (`ANCRe Fig. 2b`).
    pub source: String,
    /// A run metric as `plexus report` names it (`final_loss`, `best.eval.accuracy`, …), or
    /// `CURVE@STEP` for a logged curve's value at a step (`loss@300`, `eval.accuracy@400`), or
    /// `CURVE@WHEN>=V` for its value at the first logged step where the curve `WHEN` reaches `V`
    /// (a stop rule: `gamma@eval.accuracy>=0.69`, Γ when the accuracy first reaches 69 %).
    pub metric: String,
    /// Arm B's metric where it is not `metric`: with `b` the same arm as `a`, a claim about two
    /// numbers of the same runs, such as Γ at the end against its start (`metric: gamma`,
    /// `b_metric: initial.gamma`), paired run by run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b_metric: Option<String>,
    /// Arm A: `KEY=VALUE[,KEY=VALUE…]` on the runs' config (`name=lnn-fig2b-0to2`).
    pub a: Arm,
    /// Arm B, the same way (none for an `across_seeds` claim).
    #[serde(default)]
    pub b: Arm,
    /// A statistic of arm A across its seeds instead of a paired comparison (see the module's
    /// doc): `metric` is then a vector, read as `metric[0]` … `metric[size − 1]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub across_seeds: Option<AcrossSeeds>,
    /// The length of an `across_seeds` claim's vector (2 × layers for the Mixer's residual
    /// weights: one per sublayer), fixed when the claim is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<usize>,
    pub expect: Expect,
    #[serde(default)]
    pub scale: Scale,
    /// For `equivalent`: the largest |Δ| that counts as equal (required). For a direction: the
    /// smallest |Δ| that would matter (optional; an effect shown smaller is "does not hold").
    /// In the metric's unit, or in ln units on `scale: log`.
    /// On an accuracy, a fraction (0.005, half a point) or percentage points written `0.5 pp`.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "fraction_or_points")]
    pub margin: Option<f64>,
    /// The effect the paper reports (Δ in the metric's unit, or ln A/B on `scale: log`), for the
    /// power line: the seeds it would need here.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "fraction_or_points")]
    pub effect: Option<f64>,
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Claims of one family are corrected together (Holm); default: the whole study.
    #[serde(default = "default_family")]
    pub family: String,
    /// How the setting departs from the paper's, and why (shown beside the verdict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deviation: Option<String>,
    /// A change made to the claim after its runs, with its reason (listed with the verdict: a
    /// pre-registered claim changed later says so on the page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amendment: Option<Amendment>,
    /// Who chose the margin: `plexus` (this project's choice, said beside the margin on the page)
    /// or the paper's words that give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin_source: Option<String>,
    /// A registration made after the results of an earlier one were seen (the page labels the
    /// claim "re-registered after results"); it is judged on seeds the earlier one did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reregistered: Option<Amendment>,
}

/// A change to a claim after its runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Amendment {
    /// When (`2026-11-27`).
    pub date: String,
    /// What changed (`metric: fd.fd@400 → fd.fd@500`).
    pub change: String,
    /// Why, and what had been seen of the results when it was made.
    pub reason: String,
}

/// A margin or effect: a number, or percentage points written `N pp` (read as N / 100, the
/// fraction an accuracy is in the runs' files); a claim's fingerprint holds the number either way.
fn fraction_or_points<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<f64>, D::Error> {
    struct Amount;
    impl serde::de::Visitor<'_> for Amount {
        type Value = f64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a number, or percentage points of an accuracy written `0.5 pp`")
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<f64, E> {
            Ok(v)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_str<E: serde::de::Error>(self, t: &str) -> std::result::Result<f64, E> {
            points(t).ok_or_else(|| {
                E::custom(format!(
                    "`{t}` is neither a number nor percentage points (`0.5 pp`: half a point of an accuracy)"
                ))
            })
        }
    }
    d.deserialize_any(Amount).map(Some)
}

/// `N pp` as a fraction (N / 100); `None` for anything else.
pub(super) fn points(text: &str) -> Option<f64> {
    let n: f64 = text.trim().strip_suffix("pp")?.trim().parse().ok()?;
    n.is_finite().then_some(n / 100.0)
}

/// The fingerprint of a study's claims as written (every field, amendments included): CRC-32C of
/// their JSON, 8 hex digits. A sweep records it in each run it trains (`study.json`), so a report
/// can say which runs were made under other claims.
pub fn claims_fingerprint(claims: &[Claim]) -> String {
    let json = serde_json::to_string(claims).expect("claims serialise");
    format!("{:08x}", crc32c::crc32c(json.as_bytes()))
}

/// A statistic of one arm over its seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcrossSeeds {
    /// The mean pairwise Pearson correlation of a vector metric over the arm's seeds.
    Correlation,
}

impl Claim {
    /// The metric arm B is read at: `b_metric`, else `metric`.
    pub fn metric_of_b(&self) -> &str {
        self.b_metric.as_deref().unwrap_or(&self.metric)
    }

    /// The metrics the claim reads: `metric`, and `b_metric` where it differs; an
    /// `across_seeds` claim's `metric[0]` … `metric[size − 1]`.
    pub fn metrics(&self) -> Vec<String> {
        if self.across_seeds.is_some() {
            // Bounded here too: a spec read back from a sweep record has not been through `check`.
            return (0..self.size.unwrap_or(0).min(MAX_SIZE)).map(|i| format!("{}[{i}]", self.metric)).collect();
        }
        let mut m = vec![self.metric.clone()];
        if self.metric_of_b() != self.metric {
            m.push(self.metric_of_b().to_string());
        }
        m
    }
}

/// The longest claim id (it names the claim's figure file).
pub const MAX_ID_CHARS: usize = 80;

/// The longest vector an `across_seeds` claim reads (far above any network's depth).
pub const MAX_SIZE: usize = 4_096;

/// The file stem of a claim's figure: `claim-<id>`, with every character other than ASCII letters,
/// digits and `-` written `_` (so `x.y` and `x_y` share a stem: [`check`] refuses that pair).
pub fn figure_stem(id: &str) -> String {
    format!("claim-{}", id.replace(|ch: char| !ch.is_ascii_alphanumeric() && ch != '-', "_"))
}
