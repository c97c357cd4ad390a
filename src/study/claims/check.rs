//! What is checked of a study's claims before any run: the spec's own (ids, arms, margins, α,
//! how units are written) and, against the runs a sweep plans, that each claim can be judged.

use super::arm::arm_runs;
use super::schema::points;
use super::{figure_stem, Claim, Expect, Scale, MAX_ID_CHARS, MAX_SIZE};
use crate::study::collect::RunRecord;
use crate::study::metric::Metric;
use anyhow::{bail, Result};

/// The largest bare number a margin or effect on an accuracy may be (5 points as a fraction): a
/// number meant in points and read as a fraction is 100 times too large, and every plausible
/// margin in points (0.05 to 20) lands at or above this, so such a number is refused unless
/// written with its unit (`margin: 0.5` meant as half a point would be 50 points; `50 pp` says
/// that is meant).
pub const MAX_BARE_ACCURACY_AMOUNT: f64 = 0.05;

/// Checks how a spec's claims write their margins and effects (`claims` as the YAML has it): on
/// an accuracy, a bare number of at least [`MAX_BARE_ACCURACY_AMOUNT`] is refused with the two
/// readings it may have, and `pp` on a metric that is not an accuracy is refused.
pub fn check_written_units(claims: Option<&serde_yaml::Value>) -> Result<()> {
    for c in claims.and_then(|c| c.as_sequence()).into_iter().flatten() {
        let text = |k: &str| c.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
        let (id, metric, b_metric) = (text("id"), text("metric"), text("b_metric"));
        let log = text("scale") == "log";
        let accuracy = !log && (crate::study::in_percent(&metric) || crate::study::in_percent(&b_metric));
        for what in ["margin", "effect"] {
            match c.get(what) {
                Some(serde_yaml::Value::Number(n)) if accuracy => {
                    let v = n.as_f64().unwrap_or(f64::NAN);
                    if v.abs() >= MAX_BARE_ACCURACY_AMOUNT && v.abs() < 1.0 {
                        bail!(
                            "claim `{id}`: {what} {v} on {metric} reads as {} points of accuracy (a claim takes an \
                             accuracy as a fraction); write `{what}: {} pp` if you mean that, or {} for {v} points",
                            v * 100.0,
                            v * 100.0,
                            v / 100.0
                        );
                    }
                }
                Some(serde_yaml::Value::String(t)) if points(t).is_some() && !accuracy => bail!(
                    "claim `{id}`: {what} `{t}`: percentage points (pp) are for an accuracy on a linear scale; \
                     {metric} takes a plain number{}",
                    if log { " (on scale: log, a ln ratio)" } else { "" }
                ),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Checks a study's claims before any run: ids of letters, digits, `.`, `_` and `-` (at most
/// [`MAX_ID_CHARS`]), unique, and unique as figure files; valid arms; a margin where one is needed;
/// α in (0, 0.5); finite margins and effects; an `across_seeds` vector of at most [`MAX_SIZE`].
pub fn check(claims: &[Claim]) -> Result<()> {
    let mut ids = std::collections::BTreeSet::new();
    let mut stems: std::collections::BTreeMap<String, &str> = std::collections::BTreeMap::new();
    for c in claims {
        check_id(c, &mut ids, &mut stems)?;
        if c.a.is_empty() {
            bail!("claim `{}`: no arm `a` (the runs it is about, as KEY=VALUE[,KEY=VALUE…])", c.id);
        }
        for m in std::iter::once(&c.metric).chain(&c.b_metric) {
            Metric::parse(m).map_err(|e| anyhow::anyhow!("claim `{}`: {e}", c.id))?;
        }
        if c.across_seeds.is_some() {
            check_across_seeds(c)?;
        } else {
            check_paired(c)?;
        }
    }
    Ok(())
}

/// A claim's id: of letters, digits, `.`, `_` and `-`, at most [`MAX_ID_CHARS`], not among `ids`
/// and not drawing to a figure file of `stems` (the ids seen so far, which it joins).
fn check_id<'c>(
    c: &'c Claim,
    ids: &mut std::collections::BTreeSet<&'c String>,
    stems: &mut std::collections::BTreeMap<String, &'c str>,
) -> Result<()> {
    let shown: String = c.id.chars().take(40).collect();
    if c.id.is_empty()
        || c.id.chars().count() > MAX_ID_CHARS
        || !c.id.chars().all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-'))
    {
        bail!(
            "claim id `{shown}{}`: ids are 1 to {MAX_ID_CHARS} ASCII letters, digits, `.`, `_` or `-` \
             (it names the claim's figure file), e.g. fig2b-0to2-faster",
            if c.id.chars().count() > 40 { "…" } else { "" }
        );
    }
    if !ids.insert(&c.id) {
        bail!("claim `{}` is listed twice (ids must be unique in a study)", c.id);
    }
    if let Some(other) = stems.insert(figure_stem(&c.id), &c.id) {
        bail!(
            "claims `{other}` and `{}` would draw to one figure file ({}.png): ids must differ in more than \
             `.` against `_`",
            c.id,
            figure_stem(&c.id)
        );
    }
    Ok(())
}

/// A claim on two arms (or two metrics of one arm): arm B, distinct sides, α, the margin its
/// `expect` needs, and an effect and margin in the metric's unit pointing the claim's way.
fn check_paired(c: &Claim) -> Result<()> {
    if c.b.is_empty() {
        bail!("claim `{}`: no arm `b` (a paired claim compares two arms; `across_seeds` claims have one)", c.id);
    }
    if c.size.is_some() {
        bail!("claim `{}`: `size` is for `across_seeds` claims", c.id);
    }
    if c.a == c.b && c.b_metric.as_ref().is_none_or(|m| *m == c.metric) {
        bail!(
            "claim `{}`: arms a and b are the same ({}) with the same metric; compare two arms, or two metrics \
             of the same runs with b_metric",
            c.id,
            c.a
        );
    }
    if !(c.alpha > 0.0 && c.alpha < 0.5) {
        bail!("claim `{}`: alpha {} must be in (0, 0.5)", c.id, c.alpha);
    }
    match (c.expect, c.margin) {
        (Expect::Equivalent, None) => bail!("claim `{}`: `expect: equivalent` needs a `margin`", c.id),
        (Expect::AtMost | Expect::AtLeast, None) => bail!(
            "claim `{}`: `expect: {}` needs a `margin` (how much worse than B still counts as on par)",
            c.id,
            if c.expect == Expect::AtMost { "at_most" } else { "at_least" }
        ),
        (_, Some(m)) if !(m.is_finite() && m > 0.0) => {
            bail!("claim `{}`: margin must be a finite number > 0, got {m}", c.id)
        }
        _ => {}
    }
    check_effect(c)?;
    check_accuracy_amounts(c)
}

/// The paper's effect: finite, non-zero, and pointing the way the claim expects — a negative
/// effect on a claim that A is greater would make the power line and "the paper's effect
/// excluded" test another claim than the one written.
fn check_effect(c: &Claim) -> Result<()> {
    if let Some(e) = c.effect.filter(|e| !e.is_finite() || *e == 0.0) {
        bail!("claim `{}`: effect must be a finite, non-zero number (the paper's Δ), got {e}", c.id);
    }
    let against = match c.expect {
        Expect::Greater => c.effect.filter(|e| *e < 0.0),
        Expect::Less => c.effect.filter(|e| *e > 0.0),
        _ => None,
    };
    if let Some(e) = against {
        let want = if c.expect == Expect::Greater { "positive (A above B)" } else { "negative (A below B)" };
        bail!(
            "claim `{}`: effect {e} points against `expect: {}`: the paper's Δ = A − B (ln A/B on scale: log) of \
             this claim is {want}",
            c.id,
            if c.expect == Expect::Greater { "greater" } else { "less" }
        );
    }
    Ok(())
}

/// An accuracy is a fraction in the runs' files and a percentage in the tables: a margin or effect
/// of 2 meant as 2 points would be a 200-point one, and the claim would hold trivially.
fn check_accuracy_amounts(c: &Claim) -> Result<()> {
    if c.scale == Scale::Linear && c.metrics().iter().any(|m| crate::study::in_percent(m)) {
        for (what, v) in [("margin", c.margin), ("effect", c.effect)] {
            if let Some(v) = v.filter(|v| v.abs() >= 1.0) {
                bail!(
                    "claim `{}`: {what} {v} on {} — an accuracy is a fraction (0 to 1) in a claim, though the \
                     tables print percent: did you mean {} ({v} points)?",
                    c.id,
                    c.metric,
                    v / 100.0
                );
            }
        }
    }
    Ok(())
}

/// The fields an `across_seeds` claim needs and those it may not have.
fn check_across_seeds(c: &Claim) -> Result<()> {
    let bad = |what: &str| bail!("claim `{}`: an `across_seeds` claim {what}", c.id);
    if !c.b.is_empty() || c.b_metric.is_some() {
        return bad("has one arm, `a`: no `b` or `b_metric`");
    }
    if c.expect != Expect::Greater {
        return bad("expects `greater` (a correlation above the permutations')");
    }
    if c.margin.is_some() || c.scale != Scale::Linear {
        return bad("takes no `margin` and no `scale`");
    }
    if c.size.is_none_or(|n| n < 3) {
        return bad("needs the vector's `size`, at least 3 (a correlation of 2 values is ±1)");
    }
    if c.size.is_some_and(|n| n > MAX_SIZE) {
        return bad(&format!("reads at most {MAX_SIZE} entries (`size`; one per layer or unit)"));
    }
    if !(c.alpha > 0.0 && c.alpha < 0.5) {
        bail!("claim `{}`: alpha {} must be in (0, 0.5)", c.id, c.alpha);
    }
    Ok(())
}

/// Checks `claims` against the runs a sweep plans, before any of them trains (`planned`: each
/// planned run's resolved config, flattened as a report reads it, without metrics): every arm
/// matches planned runs, one per seed; a paired claim's arms share at least 2 seeds and an
/// `across_seeds` claim's arm has at least 3. A claim that could never be judged is refused here,
/// not after the training.
pub fn check_against_plan(claims: &[Claim], planned: &[RunRecord]) -> Result<()> {
    check(claims)?;
    for c in claims {
        let a = arm_runs(c, "a", &c.a, planned)?;
        if c.across_seeds.is_some() {
            if a.len() < 3 {
                bail!(
                    "claim `{}`: the sweep plans {} seed(s) of a ({}); a correlation across seeds needs at least 3",
                    c.id,
                    a.len(),
                    c.a
                );
            }
            continue;
        }
        let b = arm_runs(c, "b", &c.b, planned)?;
        let shared = a.iter().filter(|(s, _)| b.iter().any(|(t, _)| s == t)).count();
        if shared < 2 {
            bail!(
                "claim `{}`: the sweep plans {shared} seed(s) shared by a ({}) and b ({}); a verdict needs at least 2",
                c.id,
                c.a,
                c.b
            );
        }
    }
    Ok(())
}
