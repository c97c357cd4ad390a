use super::arm::Arm;
use super::evaluate::{mean_pairwise_r, paired_verdict, PERMUTATIONS};
use super::*;
use crate::study::collect::RunRecord;
use crate::study::stats::Stats;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn run(name: &str, seed: u64, value: f64) -> RunRecord {
    RunRecord {
        dir: PathBuf::from(format!("{name}-seed={seed}")),
        config: BTreeMap::from([("name".into(), name.into()), ("seed".into(), seed.to_string())]),
        metrics: BTreeMap::from([("m".into(), value)]),
        curves: BTreeMap::new(),
    }
}

fn claim(id: &str, expect: Expect, margin: Option<f64>) -> Claim {
    Claim {
        id: id.into(),
        statement: String::new(),
        source: String::new(),
        metric: "m".into(),
        b_metric: None,
        a: "name=a".into(),
        b: "name=b".into(),
        across_seeds: None,
        size: None,
        expect,
        scale: Scale::Linear,
        margin,
        effect: None,
        alpha: 0.05,
        family: "study".into(),
        deviation: None,
        amendment: None,
        margin_source: None,
        reregistered: None,
    }
}

/// Runs of arms `a` and `b` on seeds 0, 1, … with these values.
fn arms(values: &[(f64, f64)]) -> Vec<RunRecord> {
    let mut r = Vec::new();
    for (s, &(a, b)) in values.iter().enumerate() {
        r.push(run("a", s as u64, a));
        r.push(run("b", s as u64, b));
    }
    r
}

/// A lower by about 1 on five seeds (differences −1.1, −0.9, −1.0, −1.2, −0.8).
fn runs() -> Vec<RunRecord> {
    arms(&[(0.0, 1.1), (1.0, 1.9), (2.0, 3.0), (3.0, 4.2), (4.0, 4.8)])
}

#[test]
fn the_rule_gives_each_verdict() {
    let r = runs();
    let v = |c: Claim| evaluate(&[c], &r).unwrap().remove(0);
    assert_eq!(v(claim("x", Expect::Less, None)).verdict, Verdict::Holds);
    assert_eq!(v(claim("x", Expect::Greater, None)).verdict, Verdict::DoesNotHold);
    // Equivalent within 2 (|Δ| = 1, sd 0.16): holds; within 0.5: shown to differ by more.
    assert_eq!(v(claim("x", Expect::Equivalent, Some(2.0))).verdict, Verdict::Holds);
    assert_eq!(v(claim("x", Expect::Equivalent, Some(0.5))).verdict, Verdict::DoesNotHold);
    // A direction whose effect is shown smaller than the margin that would matter does not
    // hold; without the margin the same runs are inconclusive.
    let flat = arms(&[(1.01, 1.0), (0.98, 1.0), (1.015, 1.0), (0.99, 1.0), (1.005, 1.0)]);
    let on_flat = |c: Claim| evaluate(&[c], &flat).unwrap().remove(0).verdict;
    assert_eq!(on_flat(claim("x", Expect::Less, Some(0.5))), Verdict::DoesNotHold);
    assert_eq!(on_flat(claim("x", Expect::Less, None)), Verdict::Inconclusive);
    let one = v(claim("x", Expect::Less, None));
    assert_eq!(one.seeds, vec![0, 1, 2, 3, 4]);
    assert!((one.diff.mean + 1.0).abs() < 1e-12);
    assert_eq!(one.p_sign_flip, Some(2.0 / 32.0));
}

/// Two metrics of the same runs: arm B read at `b_metric`, paired run by run (Γ at the end
/// against its start); the same arm and the same metric twice is refused.
#[test]
fn b_metric_compares_two_numbers_of_the_same_runs() {
    let start_end = |seed: u64, start: f64, end: f64| {
        let mut r = run("a", seed, end);
        r.metrics.insert("start".into(), start);
        r
    };
    let r =
        vec![start_end(0, 0.25, 0.31), start_end(1, 0.25, 0.29), start_end(2, 0.26, 0.33), start_end(3, 0.25, 0.30)];
    let mut c = claim("grows", Expect::Greater, None);
    c.b = "name=a".into();
    c.b_metric = Some("start".into());
    let res = evaluate(std::slice::from_ref(&c), &r).unwrap().remove(0);
    assert_eq!(res.values, [(0.31, 0.25), (0.29, 0.25), (0.33, 0.26), (0.30, 0.25)]);
    assert_eq!(res.verdict, Verdict::Holds);
    assert_eq!(c.metrics(), ["m", "start"]);
    c.b_metric = Some("m".into());
    let e = check(&[c]).unwrap_err().to_string();
    assert!(e.contains("same") && e.contains("b_metric"), "{e}");
}

#[test]
fn noise_is_inconclusive_and_underpowered_when_the_paper_effect_needs_more_seeds() {
    let r = arms(&[(1.0, 1.5), (2.0, 1.2), (0.5, 0.9), (1.3, 0.6)]);
    let mut c = claim("x", Expect::Less, None);
    assert_eq!(evaluate(std::slice::from_ref(&c), &r).unwrap()[0].verdict, Verdict::Inconclusive);
    c.effect = Some(-0.1);
    let res = evaluate(&[c], &r).unwrap().remove(0);
    let Verdict::Underpowered(Some(n)) = res.verdict else { panic!("{:?}", res.verdict) };
    assert!(n > 4 && res.detectable > 0.1, "{n} {}", res.detectable);
}

#[test]
fn holm_corrects_within_a_family() {
    let r = runs();
    let mut other = claim("y", Expect::Less, None);
    other.metric = "m".into();
    let res = evaluate(&[claim("x", Expect::Less, None), other], &r).unwrap();
    assert_eq!(res[0].family_size, 2);
    assert!((res[0].p_holm - 2.0 * res[0].p).abs() < 1e-15 || res[0].p_holm == 1.0);
    let mut alone = claim("y", Expect::Less, None);
    alone.family = "own".into();
    let res = evaluate(&[claim("x", Expect::Less, None), alone], &r).unwrap();
    assert_eq!((res[0].family_size, res[0].p_holm), (1, res[0].p));
}

#[test]
fn bad_claims_are_refused_with_the_reason() {
    let r = runs();
    let e = |c: Claim| evaluate(&[c], &r).unwrap_err().to_string();
    assert!(e(claim("x", Expect::Equivalent, None)).contains("needs a `margin`"));
    // An arm that is no `KEY=VALUE` list is refused as the spec is read.
    let bad = serde_yaml::from_str::<Vec<Claim>>("- {id: x, metric: m, expect: less, a: a, b: name=b}");
    let why = bad.unwrap_err().to_string();
    assert!(why.contains("`a` must be KEY=VALUE"), "{why}");
    // An arm that matches no run says why: the value, or the key, no run has.
    let mut c = claim("x", Expect::Less, None);
    c.b = "name=zzz".into();
    let why = e(c);
    assert!(why.contains("no run has name=zzz") && why.contains("values of name: a, b"), "{why}");
    let mut c = claim("x", Expect::Less, None);
    c.b = "nmae=b".into();
    let why = e(c);
    assert!(why.contains("no run's config has the key `nmae`"), "{why}");
    assert!(evaluate(&[claim("x", Expect::Less, None), claim("x", Expect::Less, None)], &r)
        .unwrap_err()
        .to_string()
        .contains("twice"));
}

/// Runs of arm `a` on seeds 0, 1, … with these vectors as `v[0]` ….
fn vector_runs(vs: &[Vec<f64>]) -> Vec<RunRecord> {
    vs.iter()
        .enumerate()
        .map(|(seed, v)| {
            let mut r = run("a", seed as u64, 0.0);
            r.metrics = v.iter().enumerate().map(|(i, x)| (format!("v[{i}]"), *x)).collect();
            r
        })
        .collect()
}

fn across(size: usize) -> Claim {
    Claim {
        metric: "v".into(),
        b: Arm::default(),
        across_seeds: Some(AcrossSeeds::Correlation),
        size: Some(size),
        ..claim("c", Expect::Greater, None)
    }
}

/// The permutation p against its exact value: 3 seeds of 4 entries have (4!)³ = 13,824 layer
/// orders, all enumerated here. The Monte Carlo p of 9,999 permutations is a binomial
/// estimate: within 4 standard errors (√(p(1 − p)/9,999)) and the +1 of its estimator.
#[test]
fn the_permutation_p_matches_the_exact_one() {
    let v = vec![vec![0.1, 0.5, 0.2, 0.9], vec![0.3, 0.4, 0.1, 0.7], vec![0.2, 0.1, 0.3, 0.8]];
    let all = [0, 1, 2];
    let r = mean_pairwise_r(&v, &all);
    let orders: Vec<Vec<usize>> = {
        let mut out = Vec::new();
        for a in 0..4 {
            for b in 0..4 {
                for c in 0..4 {
                    for d in 0..4 {
                        let o = vec![a, b, c, d];
                        if o.iter().collect::<std::collections::BTreeSet<_>>().len() == 4 {
                            out.push(o);
                        }
                    }
                }
            }
        }
        out
    };
    let (mut hits, mut total) = (0usize, 0usize);
    for o1 in &orders {
        for o2 in &orders {
            let w = vec![v[0].clone(), o1.iter().map(|&i| v[1][i]).collect(), o2.iter().map(|&i| v[2][i]).collect()];
            // Shuffling the first vector too changes nothing: r depends on the orders relative to it.
            hits += usize::from(mean_pairwise_r(&w, &all) >= r - 1e-12);
            total += 1;
        }
    }
    let exact = hits as f64 / total as f64;
    let (r2, p, _, (lo, hi)) = seed_correlation(&v, 0.95);
    assert_eq!(r, r2);
    let se = (exact * (1.0 - exact) / PERMUTATIONS as f64).sqrt();
    assert!((p - exact).abs() < 4.0 * se + 1.0 / PERMUTATIONS as f64, "p {p} against exact {exact}");
    assert!(lo <= r && r <= hi, "{lo} {r} {hi}");
}

/// Seeds that share a profile (plus noise) hold; seeds drawn independently do not.
#[test]
fn a_shared_profile_across_seeds_holds_and_independent_ones_do_not() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(7);
    let profile = [0.2, 0.3, 0.25, 0.28, 0.37, 0.24, 0.23, 0.25];
    let shared: Vec<Vec<f64>> =
        (0..6).map(|_| profile.iter().map(|p| p + rng.gen_range(-0.02..0.02)).collect()).collect();
    let own: Vec<Vec<f64>> = (0..6).map(|_| (0..8).map(|_| rng.gen_range(0.2..0.4)).collect()).collect();
    let verdict = |vs: &[Vec<f64>]| evaluate(&[across(8)], &vector_runs(vs)).unwrap().remove(0);
    let held = verdict(&shared);
    assert_eq!(held.verdict, Verdict::Holds, "r̄ {} p {}", held.diff.mean, held.p);
    assert!(held.diff.mean > 0.8 && held.interval.0 > 0.5, "{:?}", held.interval);
    assert_eq!(held.profiles.len(), 6);
    let apart = verdict(&own);
    assert_ne!(apart.verdict, Verdict::Holds, "r̄ {} p {}", apart.diff.mean, apart.p);
    assert!(apart.p > 0.05, "{}", apart.p);
}

/// An across-seeds claim has one arm, `greater`, and a size; a paired claim has arm b.
#[test]
fn across_seeds_claims_are_checked() {
    assert!(check(&[across(8)]).is_ok());
    for (c, why) in [
        (Claim { b: "name=b".into(), ..across(8) }, "one arm"),
        (Claim { size: Some(2), ..across(8) }, "at least 3"),
        (Claim { expect: Expect::Less, ..across(8) }, "greater"),
        (Claim { b: Arm::default(), ..claim("p", Expect::Greater, None) }, "no arm `b`"),
    ] {
        let e = check(&[c]).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
}

/// A seed's value that is not finite (or not positive on a log scale) makes the claim "not
/// computable", with the seed named and no p or interval; the rest of the family is still
/// judged, with the claim counted in m at p = 1.
#[test]
fn values_no_statistic_can_take_make_a_claim_not_computable() {
    for (a0, log, want) in [
        (f64::INFINITY, true, "seed 0's A (m) is inf"),
        (f64::NAN, false, "seed 0's A (m) is NaN"),
        (f64::NEG_INFINITY, false, "seed 0's A (m) is -inf"),
        (0.0, true, "seed 0's A (m) is 0, and `scale: log` needs positive values"),
    ] {
        let r = arms(&[(a0, 1.1), (1.0, 1.9), (2.0, 3.0), (3.0, 4.2), (4.0, 4.8)]);
        let mut c = claim("x", Expect::Less, None);
        if log {
            c.scale = Scale::Log;
        }
        let mut other = claim("y", Expect::Less, None);
        other.a = "name=a".into();
        other.metric = "n".into();
        other.b_metric = Some("n".into());
        let mut r = r;
        for run in r.iter_mut() {
            let s = run.seed().unwrap() as f64;
            run.metrics.insert("n".into(), if run.config["name"] == "a" { s } else { s + 1.0 });
        }
        let res = evaluate(&[c, other], &r).unwrap();
        assert_eq!(res[0].verdict, Verdict::NotComputable(want.into()), "{a0} {log}");
        assert!(res[0].p.is_nan() && res[0].p_holm.is_nan() && res[0].interval.0.is_nan());
        // The other claim of the family: judged, with m = 2 (the bad claim's p taken as 1).
        assert_eq!(res[1].verdict, Verdict::Holds);
        assert_eq!(res[1].family_size, 2);
        assert_eq!(res[1].p_holm, (2.0 * res[1].p).min(1.0));
    }
}

/// The verdict code itself refuses non-finite differences (an assertion, not a silent p).
#[test]
#[should_panic(expected = "non-finite differences")]
fn the_verdict_asserts_finite_inputs() {
    let diff = Stats { n: 3, mean: f64::NAN, sd: 1.0, ci95: None };
    paired_verdict(&claim("x", Expect::Less, None), &diff, true, 0.05);
}

/// One run per arm and seed: an arm with two runs of one seed (one run copied, or ten rows
/// all carrying seed 0) is an error naming both, never n = 10 from one seed.
#[test]
fn an_arm_with_two_runs_of_one_seed_is_refused() {
    let mut r = runs();
    let mut copy = run("a", 0, 0.5);
    copy.dir = PathBuf::from("a-copy");
    r.push(copy);
    let e = evaluate(&[claim("x", Expect::Less, None)], &r).unwrap_err().to_string();
    assert!(e.contains("two runs with seed 0") && e.contains("a-copy") && e.contains("a-seed=0"), "{e}");
    // Ten runs of arm a, all seed 0, against one b run of seed 0.
    let r: Vec<RunRecord> = (0..10)
        .map(|i| RunRecord { dir: PathBuf::from(format!("a{i}")), ..run("a", 0, i as f64) })
        .chain([run("b", 0, 5.0)])
        .collect();
    let e = evaluate(&[claim("x", Expect::Less, None)], &r).unwrap_err().to_string();
    assert!(e.contains("two runs with seed 0"), "{e}");
    // A run of the arm without a seed is named.
    let mut r = runs();
    r[0].config.remove("seed");
    let e = evaluate(&[claim("x", Expect::Less, None)], &r).unwrap_err().to_string();
    assert!(e.contains("has no seed"), "{e}");
}

/// An across-seeds claim reads the whole vector or refuses: a `size` shorter than the runs'
/// vector is an error (it would test a prefix); a constant or non-finite vector makes the
/// claim not computable, with the seed named, instead of a panic or a p from NaN.
#[test]
fn across_seeds_vectors_are_checked() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(3);
    let good: Vec<Vec<f64>> = (0..5).map(|_| (0..8).map(|i| i as f64 + rng.gen_range(-0.3..0.3)).collect()).collect();
    let e = evaluate(&[across(3)], &vector_runs(&good)).unwrap_err().to_string();
    assert!(e.contains("`size: 3`") && e.contains("8 entries"), "{e}");
    assert_eq!(evaluate(&[across(8)], &vector_runs(&good)).unwrap()[0].verdict, Verdict::Holds);
    let mut constant = good.clone();
    constant[2] = vec![0.25; 8];
    let res = evaluate(&[across(8)], &vector_runs(&constant)).unwrap().remove(0);
    assert_eq!(
        res.verdict,
        Verdict::NotComputable("seed 2's vector v[0..8] is constant (it has no correlation)".into())
    );
    assert!(res.p.is_nan() && res.diff.mean.is_nan());
    let mut nan = good.clone();
    nan[4][5] = f64::NAN;
    let res = evaluate(&[across(8)], &vector_runs(&nan)).unwrap().remove(0);
    assert_eq!(res.verdict, Verdict::NotComputable("seed 4's v[5] is NaN".into()));
}

/// Ids are bounded and file-safe, and two ids that would draw to one figure file are refused;
/// an across-seeds `size` is bounded before anything is allocated for it.
#[test]
fn ids_and_sizes_are_bounded() {
    let e = |c: Claim| check(&[c]).unwrap_err().to_string();
    assert!(e(claim(&"x".repeat(300), Expect::Less, None)).contains("1 to 80"));
    assert!(e(claim("a/b", Expect::Less, None)).contains("ASCII letters"));
    let e2 = check(&[claim("x.y", Expect::Less, None), claim("x_y", Expect::Less, None)]).unwrap_err().to_string();
    assert!(e2.contains("one figure file"), "{e2}");
    assert!(check(&[claim("hacn-mu-0.25-beats-1", Expect::Less, None)]).is_ok());
    assert!(e(Claim { size: Some(100_000_000_000), ..across(8) }).contains("at most 4096"));
}

/// Claims are checked against a sweep's plan before training: an arm that matches no planned
/// run is refused, naming the claim and what the runs have.
#[test]
fn claims_are_checked_against_the_planned_runs() {
    let planned: Vec<RunRecord> = runs()
        .into_iter()
        .map(|mut r| {
            r.metrics.clear();
            r
        })
        .collect();
    assert!(check_against_plan(&[claim("x", Expect::Less, None)], &planned).is_ok());
    let mut c = claim("x", Expect::Less, None);
    c.b = "name=bb".into();
    let e = check_against_plan(&[c], &planned).unwrap_err().to_string();
    assert!(e.contains("claim `x`") && e.contains("no run has name=bb"), "{e}");
    let e = check_against_plan(&[across(8)], &planned[..4]).unwrap_err().to_string();
    assert!(e.contains("2 seed(s) of a"), "{e}");
}

/// Every outcome of the rule on a constructed case, in the documented order: an effect shown
/// smaller than the margin does not hold even when significant in the paper's direction; the
/// paper's effect excluded when the interval lies on the near side of it; non-inferiority
/// (`at_most`) holds within its margin and does not hold past it; the power line beside every
/// verdict, "underpowered" beside a "holds" found with little power.
#[test]
fn every_outcome_of_the_rule_is_reached() {
    // A below B by 0.01 with almost no spread: significant, but far below a 0.5 margin.
    let tiny = arms(&[(0.99, 1.0), (1.989, 2.0), (2.9905, 3.0), (3.99, 4.0), (4.9895, 5.0)]);
    let res = evaluate(&[claim("x", Expect::Less, Some(0.5))], &tiny).unwrap().remove(0);
    assert!(res.p_holm < 0.05, "{}", res.p_holm);
    assert_eq!(res.verdict, Verdict::DoesNotHold, "significant but smaller than the margin");
    // The paper says A is lower by 5; these runs are inconclusive on the direction but exclude 5.
    let near_zero = arms(&[(1.01, 1.0), (0.98, 1.0), (1.015, 1.0), (0.99, 1.0), (1.005, 1.0)]);
    let mut c = claim("x", Expect::Less, None);
    c.effect = Some(-5.0);
    let res = evaluate(std::slice::from_ref(&c), &near_zero).unwrap().remove(0);
    assert_eq!(res.verdict, Verdict::EffectExcluded);
    assert!(res.interval.0 > -5.0, "{:?}", res.interval);
    assert_eq!(
        res.verdict_text(&|x| x.to_string()),
        "the paper's effect excluded at this size (100 % power for the paper's effect)"
    );
    // Non-inferiority: A at most 0.1 above B.
    let mut at_most = claim("x", Expect::AtMost, Some(0.1));
    assert_eq!(evaluate(std::slice::from_ref(&at_most), &near_zero).unwrap()[0].verdict, Verdict::Holds);
    let worse = arms(&[(1.5, 1.0), (1.6, 1.0), (1.45, 1.0), (1.55, 1.0), (1.5, 1.0)]);
    assert_eq!(evaluate(std::slice::from_ref(&at_most), &worse).unwrap()[0].verdict, Verdict::DoesNotHold);
    // Far better than B is not a failure of "at most" (two-sided equivalence would call it one).
    let better = arms(&[(0.1, 1.0), (0.2, 1.0), (0.15, 1.0), (0.12, 1.0), (0.18, 1.0)]);
    assert_eq!(evaluate(std::slice::from_ref(&at_most), &better).unwrap()[0].verdict, Verdict::Holds);
    let mut equivalent = at_most.clone();
    equivalent.expect = Expect::Equivalent;
    assert_eq!(evaluate(&[equivalent], &better).unwrap()[0].verdict, Verdict::DoesNotHold);
    at_most.margin = None;
    assert!(check(&[at_most]).unwrap_err().to_string().contains("needs a `margin`"));
    // A "holds" found with little power for the paper's (larger) effect says so.
    let noisy = arms(&[(0.0, 1.0), (0.3, 1.4), (0.5, 1.0), (-0.2, 0.9), (0.1, 1.3), (0.6, 1.2)]);
    let mut c = claim("x", Expect::Less, None);
    c.effect = Some(-0.3);
    let res = evaluate(&[c], &noisy).unwrap().remove(0);
    assert_eq!(res.verdict, Verdict::Holds);
    let power = res.power.unwrap();
    assert!(power < 0.8, "{power}");
    assert!(
        res.verdict_text(&|x| x.to_string()).starts_with("holds (underpowered:"),
        "{}",
        res.verdict_text(&|x| x.to_string())
    );
}

/// A margin or effect on an accuracy is a fraction: 2 (meant as 2 points) is refused with the
/// fraction it likely means; 0.02 passes.
#[test]
fn accuracy_margins_are_fractions() {
    let mut c = claim("x", Expect::Greater, Some(2.0));
    c.metric = "eval.accuracy".into();
    let e = check(std::slice::from_ref(&c)).unwrap_err().to_string();
    assert!(e.contains("margin 2") && e.contains("did you mean 0.02"), "{e}");
    c.margin = Some(0.02);
    c.effect = Some(-1.5);
    assert!(check(std::slice::from_ref(&c)).unwrap_err().to_string().contains("effect -1.5"));
    c.effect = Some(0.004);
    assert!(check(&[c]).is_ok());
}

/// Each arm's runs are read at their own metric: A at `metric`, B at `b_metric`.
#[test]
fn each_arm_is_read_at_its_own_metric() {
    let mut c = claim("x", Expect::Greater, None);
    c.metric = "gamma@eval.accuracy>=0.3".into();
    c.b_metric = Some("gamma@eval.accuracy>=0.6".into());
    assert_eq!(metrics_read_from(&c, &run("a", 0, 1.0)), vec!["gamma@eval.accuracy>=0.3".to_string()]);
    assert_eq!(metrics_read_from(&c, &run("b", 0, 1.0)), vec!["gamma@eval.accuracy>=0.6".to_string()]);
    assert!(metrics_read_from(&c, &run("c", 0, 1.0)).is_empty());
    let mut same = claim("x", Expect::Greater, None);
    same.b = same.a.clone();
    same.b_metric = Some("initial.gamma".into());
    assert_eq!(metrics_read_from(&same, &run("a", 0, 1.0)), vec!["m".to_string(), "initial.gamma".to_string()]);
}

/// The runs a claim reads are its arms': a run of a third setting is none of them.
#[test]
fn a_claims_runs_are_those_of_its_arms() {
    let c = claim("x", Expect::Less, None);
    assert!(in_an_arm(&c, &run("a", 0, 1.0)) && in_an_arm(&c, &run("b", 3, 1.0)));
    assert!(!in_an_arm(&c, &run("c", 0, 1.0)));
    assert!(!in_an_arm(&across(8), &run("b", 0, 1.0)));
}

/// `CURVE@WHEN>=V` reads the curve where the stop rule would have ended the run: Γ at the
/// first evaluation whose accuracy reaches 0.6 (step 20, not the later and higher 30), and an
/// error naming the best value when the rule never fires or the curve is not logged there.
#[test]
fn a_stop_rule_reads_the_curve_at_the_first_step_that_reaches_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("metrics.csv"),
        "step,loss,gamma\n0,2.3,0.25\n10,2.0,0.3\n20,1.8,0.35\n30,1.7,0.4\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("eval.csv"),
        "step,loss,accuracy\n0,2.3,0.1\n20,1.9,0.61\n25,1.9,0.58\n30,1.8,0.7\n",
    )
    .unwrap();
    let mut r = run("a", 0, 1.0);
    r.dir = dir.path().to_path_buf();
    assert_eq!(metric_value(&r, "gamma@eval.accuracy>=0.6").unwrap(), 0.35);
    assert_eq!(metric_value(&r, "eval.loss@eval.accuracy>=0.7").unwrap(), 1.8);
    let never = metric_value(&r, "gamma@eval.accuracy>=0.9").unwrap_err().to_string();
    assert!(never.contains("never reaches 0.9") && never.contains("0.7 at step 30"), "{never}");
    std::fs::write(dir.path().join("eval.csv"), "step,loss,accuracy\n5,2.3,0.6\n").unwrap();
    let unlogged = metric_value(&r, "gamma@eval.accuracy>=0.6").unwrap_err().to_string();
    assert!(unlogged.contains("at step 5") && unlogged.contains("not logged"), "{unlogged}");
    let bad = metric_value(&r, "gamma@eval.accuracy>=x").unwrap_err().to_string();
    assert!(bad.contains("finite number"), "{bad}");
}

/// `CURVE@STEP` at a step the curve holds twice: the same value is read, two values are an
/// error naming both, never one of them picked.
#[test]
fn a_step_logged_twice_with_two_values_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("metrics.csv"),
        "step,loss
10,2.0
10,2.0
20,1.8
20,1.7
",
    )
    .unwrap();
    let mut r = run("a", 0, 1.0);
    r.dir = dir.path().to_path_buf();
    assert_eq!(metric_value(&r, "loss@10").unwrap(), 2.0);
    let e = metric_value(&r, "loss@20").unwrap_err().to_string();
    assert!(e.contains("2 different values at step 20") && e.contains("1.8, 1.7"), "{e}");
    // A stop rule too: the curve it stops on, and the one it reads there, one value a step.
    std::fs::write(dir.path().join("eval.csv"), "step,loss,accuracy\n10,2.0,0.3\n10,2.0,0.5\n").unwrap();
    let e = metric_value(&r, "loss@eval.accuracy>=0.45").unwrap_err().to_string();
    assert!(e.contains("curve `eval.accuracy` has 2 different values at step 10"), "{e}");
    std::fs::write(dir.path().join("eval.csv"), "step,loss,accuracy\n10,2.0,0.3\n20,2.0,0.5\n").unwrap();
    let e = metric_value(&r, "loss@eval.accuracy>=0.45").unwrap_err().to_string();
    assert!(e.contains("curve `loss` has 2 different values at step 20"), "{e}");
}

/// The unit guard knows every form of an accuracy (`eval.accuracy@400` is one): a bare 0.5
/// (50 points) is refused in a margin and an effect, `1 pp` is accepted; an effect pointing
/// against `expect` is refused; a metric whose `@` part is not a step or a stop rule is
/// refused before any run.
#[test]
fn every_form_of_a_metric_gets_every_check() {
    let yaml = |body: &str| -> serde_yaml::Value {
        serde_yaml::from_str(&format!("- {{id: x, metric: eval.accuracy@400, {body}}}")).unwrap()
    };
    for body in ["margin: 0.5", "effect: 0.5"] {
        assert!(check_written_units(Some(&yaml(body))).is_err(), "{body}");
    }
    let mut c = claim("x", Expect::Greater, Some(1.0));
    c.metric = "eval.accuracy@400".into();
    let e = check(&[c]).unwrap_err().to_string();
    assert!(e.contains("margin 1") && e.contains("did you mean 0.01"), "{e}");
    check_written_units(Some(&yaml("margin: 1 pp"))).unwrap();
    let e = check_written_units(Some(&yaml("margin: 0.5"))).unwrap_err().to_string();
    assert!(e.contains("50 points of accuracy") && e.contains("50 pp") && e.contains("0.005"), "{e}");
    let mut c = claim("x", Expect::Greater, None);
    c.metric = "eval.accuracy@400".into();
    c.effect = Some(-0.02);
    let e = check(std::slice::from_ref(&c)).unwrap_err().to_string();
    assert!(e.contains("effect -0.02 points against `expect: greater`"), "{e}");
    c.expect = Expect::Less;
    check(std::slice::from_ref(&c)).unwrap();
    c.margin = Some(f64::INFINITY);
    let e = check(std::slice::from_ref(&c)).unwrap_err().to_string();
    assert!(e.contains("margin must be a finite number > 0, got inf"), "{e}");
    c.margin = None;
    c.metric = "eval.accuracy@soon".into();
    let e = check(&[c]).unwrap_err().to_string();
    assert!(e.contains("after `@` comes a step"), "{e}");
}
