//! The ANCRe §3 case study (Fig. 2): the claims the paper makes, asserted on our runs.

use crate::common;
use common::*;

#[test]
#[ignore = "slow tier: ANCRe Fig. 2b case study"]
fn fig2b_single_shortcut_0to2_beats_0to1_and_cascaded_and_ancre_matches_it() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |f: &str| train_config(&format!("configs/lnn/fig2b/{f}.yaml"), &tmp.path().join(f), &[]);
    let (casc, s01, s02, ancre) = (run("2-cascaded"), run("3-0to1"), run("4-0to2"), run("5-ancre"));
    println!(
        "cascaded {:e}, 0:1 {:e}, 0:2 {:e}, ancre {:e}",
        casc.final_loss, s01.final_loss, s02.final_loss, ancre.final_loss
    );
    // Theorems 3.2/3.3: 0:1 is sublinear, 0:2 linear; after 3000 steps the gap is many decades.
    assert!(s02.final_loss * 100.0 <= s01.final_loss, "0:2 {:e} vs 0:1 {:e}", s02.final_loss, s01.final_loss);
    assert!(s02.final_loss < casc.final_loss, "0:2 {:e} vs cascaded {:e}", s02.final_loss, casc.final_loss);
    assert!(ancre.final_loss * 100.0 <= s01.final_loss, "ancre {:e} vs 0:1 {:e}", ancre.final_loss, s01.final_loss);
    // Every run starts from a real problem (no accidental zero target).
    assert!(s01.initial_loss > 1.0 && s02.initial_loss > 1.0);
    // ANCRe's ingoing coefficients are a distribution over the sources of every target.
    let (name, p) = ancre.parameter_view.expect("ancre reports p");
    assert_eq!(name, "p");
    for j in 1..p.nrows() {
        let col: f64 = (0..j).map(|i| p[[i, j]]).sum();
        assert!((col - 1.0).abs() < 1e-5, "column {j} of p sums to {col}");
    }
}

/// Steps until the loss first falls below `frac` of its initial value.
fn steps_to(losses: &[(f64, f64)], frac: f64) -> f64 {
    let target = losses[0].1 * frac;
    losses.iter().find(|(_, l)| *l <= target).map(|(s, _)| *s).unwrap_or(f64::INFINITY)
}

#[test]
#[ignore = "slow tier: ANCRe Fig. 2a case study"]
fn fig2a_deeper_plain_networks_converge_more_slowly() {
    let tmp = tempfile::tempdir().unwrap();
    let mut times = Vec::new();
    for f in ["1-k2", "2-k3", "3-k4"] {
        let dir = tmp.path().join(f);
        train_config(&format!("configs/lnn/fig2a/{f}.yaml"), &dir, &[]);
        times.push(steps_to(&read_losses(&dir), 1e-3));
    }
    println!("steps to 1e-3 of the initial loss for K = 2, 3, 4: {times:?}");
    assert!(times[0] < times[1] && times[1] < times[2], "{times:?}");
    assert!(times[2].is_finite(), "K=4 never got there: {times:?}");
}

#[test]
fn same_config_and_seed_give_identical_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = "configs/lnn/fig2b/5-ancre.yaml";
    for run in ["a", "b"] {
        train_config(cfg, &tmp.path().join(run), &["train.steps=300"]);
    }
    let a = std::fs::read(tmp.path().join("a/metrics.csv")).unwrap();
    let b = std::fs::read(tmp.path().join("b/metrics.csv")).unwrap();
    assert!(a.len() > 100);
    assert_eq!(a, b, "metrics.csv differs between two runs of the same config");
    // A different seed gives a different initialisation, hence different losses.
    train_config(cfg, &tmp.path().join("c"), &["train.steps=300", "seed=1"]);
    assert_ne!(a, std::fs::read(tmp.path().join("c/metrics.csv")).unwrap());
}

#[test]
fn run_directory_has_the_documented_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let s = train_config("configs/lnn/fig2b/4-0to2.yaml", &dir, &["train.steps=20", "log.every=5"]);
    for f in ["config.yaml", "metrics.csv", "summary.json", "checkpoints/final.safetensors", "connectivity/step_20.csv"]
    {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    assert!(dir.join("figures").is_dir());
    let rows = read_losses(&dir);
    assert_eq!(rows.iter().map(|r| r.0 as u64).collect::<Vec<_>>(), vec![0, 5, 10, 15, 20]);
    assert_eq!(rows.last().unwrap().1, s.final_loss);
    // The resolved config reloads to the same experiment.
    let again = plexus::experiment::Experiment::from_file(&dir.join("config.yaml"), &[]).unwrap();
    assert_eq!(again.config().name, "lnn-fig2b-0to2");
    // No temporary files left behind by the atomic writes.
    let leftovers: Vec<_> =
        walk(&dir).into_iter().filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".tmp-")).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // C of the 0:2 layout: unit 3 reads s_2 = h_2 + h_0, the readout reads s_3 = h_3.
    let c = std::fs::read_to_string(dir.join("connectivity/step_20.csv")).unwrap();
    let rows: Vec<Vec<String>> = c.lines().map(|l| l.split(',').map(str::to_string).collect()).collect();
    assert_eq!(rows[0], ["node", "0", "1", "2", "3", "4"]);
    let at = |i: usize, k: usize| rows[i + 1][k + 1].parse::<f64>().unwrap();
    assert_eq!(
        (at(0, 1), at(1, 2), at(0, 3), at(2, 3), at(1, 3), at(3, 4), at(0, 4)),
        (1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0)
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
