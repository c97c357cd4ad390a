//! `plexus sweep` and `plexus report`: a killed sweep re-run ends with the report of an
//! uninterrupted one, the report's statistics equal a hand computation, and the Slurm array
//! names every run once.

use crate::common;

use common::{plexus, repo, text};
use std::ops::Sub;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The sweep of these tests: 2 settings (ANCRe §3's deep linear network without and with ANCRe
/// shortcuts) × 3 seeds, each run long enough to be killed between checkpoints.
fn sweep_args(out: &Path) -> Vec<String> {
    let lnn = repo().join("configs/lnn/fig2b");
    [
        lnn.join("1-none.yaml").display().to_string(),
        lnn.join("5-ancre.yaml").display().to_string(),
        "--seeds".into(),
        "0,1,2".into(),
        "--set".into(),
        "train.steps=2000".into(),
        "--set".into(),
        "log.checkpoint_every=100".into(),
        "--jobs".into(),
        "2".into(),
        "--quiet".into(),
        "--out".into(),
        out.display().to_string(),
    ]
    .into()
}

fn run_dirs(out: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(out)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.join("config.yaml").is_file()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Whether the run has a complete checkpoint in its first half (of 2000 steps): it is then far
/// from finishing, so a kill now leaves it unfinished even on a loaded machine.
fn early_checkpoint(run: &Path) -> bool {
    std::fs::read_dir(run.join("checkpoints"))
        .map(|d| {
            d.filter_map(|e| e.ok()).any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("step_")
                    .and_then(|r| r.strip_suffix(".json"))
                    .and_then(|n| n.parse::<u64>().ok())
                    .is_some_and(|n| n <= 1000)
            })
        })
        .unwrap_or(false)
}

#[test]
fn a_killed_sweep_re_run_ends_with_the_report_of_an_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let args: Vec<String> = sweep_args(&whole);
    let o = plexus(
        &["sweep"]
            .iter()
            .map(|s| s.to_string())
            .chain(args)
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        tmp.path(),
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("| lnn-fig2b-none | 3 | 0,1,2 |"), "the sweep ends with its report:\n{out}");
    assert_eq!(run_dirs(&whole).len(), 6);

    // The same sweep, killed (SIGKILL) once one run has finished and another is between checkpoints.
    let killed = tmp.path().join("killed");
    let mut child = Command::new(env!("CARGO_BIN_EXE_plexus"))
        .arg("sweep")
        .args(sweep_args(&killed))
        .current_dir(tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        let runs = run_dirs(&killed);
        let finished = runs.iter().filter(|r| r.join("summary.json").is_file()).count();
        let partway = runs.iter().filter(|r| !r.join("summary.json").is_file() && early_checkpoint(r)).count();
        if finished >= 1 && partway >= 1 {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the sweep ended before it could be killed partway");
        assert!(start.elapsed() < Duration::from_secs(120), "no run finished within 2 minutes");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Its runs die with it (they would otherwise go on writing into the folder).
    std::thread::sleep(Duration::from_millis(500));
    let unfinished = run_dirs(&killed).iter().filter(|r| !r.join("summary.json").is_file()).count();
    assert!(unfinished >= 1, "the runs did not stop with the sweep");

    let again: Vec<String> = ["sweep".to_string()].into_iter().chain(sweep_args(&killed)).collect();
    let o = plexus(&again.iter().map(String::as_str).collect::<Vec<_>>(), tmp.path());
    let (out2, err2) = text(&o);
    assert!(o.status.success(), "{out2}\n{err2}");
    assert!(err2.contains("finished before") && !err2.contains("0 finished before"), "{err2}");
    assert!(!err2.contains("(0 of them resumed)"), "a run killed between checkpoints is resumed: {err2}");
    assert_eq!(out2, out, "the re-run sweep's report differs from the uninterrupted one's");
    // Full precision too: the CSVs of both reports are byte-identical.
    let csv = |d: &Path| std::fs::read_to_string(d.join("report/report.csv")).unwrap();
    assert_eq!(csv(&killed), csv(&whole));

    // Re-running a finished sweep trains nothing.
    let o = plexus(&again.iter().map(String::as_str).collect::<Vec<_>>(), tmp.path());
    let (_, err3) = text(&o);
    assert!(err3.contains("6 finished before, 0 finished now"), "{err3}");
}

/// A run directory as `plexus report` reads it: config.yaml, summary.json, eval.csv.
fn fake_run(dir: &Path, kind: &str, seed: u64, acc: f64, evals: &[f64]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.yaml"),
        format!("name: fake\nseed: {seed}\ntopology:\n  kind: {kind}\nlog:\n  every: {seed}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("summary.json"),
        format!(
            r#"{{"final_loss": {}, "eval": {{"step": 10, "loss": 1.0, "accuracy": {acc}}}, "wall_seconds": {seed}}}"#,
            1.0 - acc
        ),
    )
    .unwrap();
    let mut csv = String::from("step,loss,accuracy,perplexity\n");
    for (i, a) in evals.iter().enumerate() {
        csv.push_str(&format!("{},{},{a},\n", 10 * (i + 1), 1.0 - a));
    }
    std::fs::write(dir.join("eval.csv"), csv).unwrap();
}

#[test]
fn report_statistics_equal_a_hand_computation() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let res = [0.80, 0.82, 0.87];
    let base = [0.78, 0.80, 0.84];
    for s in 0..3 {
        fake_run(
            &runs.join(format!("res-{s}")),
            "residual",
            s,
            res[s as usize],
            &[0.5, res[s as usize] + 0.01, res[s as usize]],
        );
        fake_run(&runs.join(format!("plain-{s}")), "plain", s, base[s as usize], &[base[s as usize]]);
    }
    let o = plexus(
        &[
            "report",
            "runs",
            "--metric",
            "eval.accuracy,best.eval.accuracy",
            "--baseline",
            "topology.kind=plain",
            "--format",
            "csv",
        ],
        tmp.path(),
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let mut rows = csv::Reader::from_reader(out.as_bytes());
    let head = rows.headers().unwrap().clone();
    let rows: Vec<csv::StringRecord> = rows.records().map(|r| r.unwrap()).collect();
    let get = |kind: &str, metric: &str, col: &str| -> f64 {
        let r =
            rows.iter().find(|r| &r[0] == kind && &r[1] == metric).unwrap_or_else(|| panic!("no row {kind} {metric}"));
        r[head.iter().position(|h| h == col).unwrap()].parse().unwrap_or(f64::NAN)
    };
    // By hand: mean 0.83; sd = √((0.03² + 0.01² + 0.04²)/2) = √0.0013; half-width t(0.975, 2) · sd/√3
    // with t(0.975, 2) = 4.302653 (standard table).
    let sd = 0.0013f64.sqrt();
    let half = 4.302653 * sd / 3f64.sqrt();
    let close = |a: f64, b: f64| (a - b).abs() < 1e-5;
    assert!(close(get("residual", "eval.accuracy", "mean"), 0.83));
    assert!(close(get("residual", "eval.accuracy", "sd"), sd));
    assert!(close(get("residual", "eval.accuracy", "ci95_low"), 0.83 - half));
    assert!(close(get("residual", "eval.accuracy", "ci95_high"), 0.83 + half));
    assert_eq!(get("residual", "eval.accuracy", "n"), 3.0);
    // Best over evaluations: 0.01 above the final accuracy in every run.
    assert!(close(get("residual", "best.eval.accuracy", "mean"), 0.84));
    // Paired on seeds: differences 0.02, 0.02, 0.03: mean 0.023333, sd 0.0057735, t = 7 with 2
    // degrees of freedom, whose two-sided p is 1 − 7/√(7² + 2) (the t(2) CDF in closed form).
    assert!(close(get("residual", "eval.accuracy", "diff_mean"), 0.07 / 3.0));
    assert!(close(get("residual", "eval.accuracy", "diff_sd"), (0.0001f64 / 3.0).sqrt()));
    assert!(close(get("residual", "eval.accuracy", "p"), 1.0 - 7.0 / 51f64.sqrt()));
    assert!(get("plain", "eval.accuracy", "diff_mean").is_nan(), "the baseline has no difference to itself");

    // plexus analyze's numbers: the half-depth exit, and robustness as the accuracy lost to noise.
    for s in 0..3u64 {
        let a = format!(
            r#"{{"half_depth": {{"units": 2, "loss": 1.0, "accuracy": 0.{s}}}, "noise": [
                {{"kind": "gaussian", "level": 0.0, "mean_loss": 0.5, "mean_accuracy": 0.9}},
                {{"kind": "gaussian", "level": 0.5, "mean_loss": 0.9, "mean_accuracy": 0.{}}}]}}"#,
            6 + s
        );
        std::fs::write(runs.join(format!("res-{s}/analysis.json")), a).unwrap();
    }
    let o = plexus(
        &[
            "report",
            "runs/res-0",
            "runs/res-1",
            "runs/res-2",
            "--format",
            "csv",
            "--metric",
            "analysis.half_depth.accuracy,analysis.noise[0.5].accuracy_drop",
        ],
        tmp.path(),
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let row = |m: &str| out.lines().find(|l| l.contains(m)).unwrap_or_else(|| panic!("{m}: {out}")).to_string();
    // No grouping key varies (only seed): columns metric, n, mean, …
    // Half-depth accuracies 0.0, 0.1, 0.2: mean 0.1; drops 0.9 − 0.6, 0.9 − 0.7, 0.9 − 0.8: mean 0.2.
    assert!(row("half_depth").split(',').nth(2).unwrap().parse::<f64>().unwrap().sub(0.1).abs() < 1e-9, "{out}");
    assert!(row("accuracy_drop").split(',').nth(2).unwrap().parse::<f64>().unwrap().sub(0.2).abs() < 1e-9, "{out}");

    // Markdown and LaTeX carry the same numbers.
    let o = plexus(&["report", "runs", "--metric", "eval.accuracy", "--format", "latex"], tmp.path());
    let (tex, _) = text(&o);
    // Accuracy in percent; the sd to two significant figures, the mean to the same place.
    // Topology kinds by their display names.
    assert!(tex.contains("Residual & 3 & $83.0 \\pm 3.6$"), "{tex}");
    // Printing a table in another format leaves the folder as it is; the default report writes it.
    assert!(!tmp.path().join("runs/report").exists(), "a csv or latex table printed wrote runs/report/");
    let o = plexus(&["report", "runs", "--metric", "eval.accuracy"], tmp.path());
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(tmp.path().join("runs/report/report.md").is_file(), "a folder of runs gets report/ written");

    // Bad requests name what is wrong and what exists.
    for (args, want) in [
        (vec!["report", "runs", "--metric", "eval.acc"], "run"),
        (vec!["report", "runs", "--baseline", "seed=0"], "not one of the keys"),
        (vec!["report", "runs", "--baseline", "topology.kind=hc"], "the runs have plain, residual"),
        (vec!["report", "runs", "--by", "model.depth"], "no run's config has this key"),
        (vec!["report", "nowhere"], "no such directory"),
    ] {
        let o = plexus(&args, tmp.path());
        let (_, err) = text(&o);
        assert!(!o.status.success() && err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn the_slurm_array_names_every_run_once_and_a_task_trains_its_run() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("study.yaml");
    std::fs::write(
        &spec,
        format!(
            "configs: [{}]\nset: {{train.steps: 200}}\ngrid:\n  model.init_std: [0.05, 0.1]\n  model.depth: [3, 4]\nseeds: [0, 1, 2]\nout: sw\n",
            repo().join("configs/lnn/fig2b/1-none.yaml").display()
        ),
    )
    .unwrap();
    let o = plexus(&["sweep", "study.yaml", "--slurm", "array.sh", "--gpus", "all"], tmp.path());
    let (out, err) = text(&o);
    // No GPU here: --gpus only asks for a GPU per task in the script.
    assert!(o.status.success(), "{out}\n{err}");
    let script = std::fs::read_to_string(tmp.path().join("array.sh")).unwrap();
    assert!(script.contains("#SBATCH --array=0-11\n") && script.contains("#SBATCH --gres=gpu:1"), "{script}");
    let body = script.split("RUNS=(\n").nth(1).unwrap().split(")\n").next().unwrap();
    let names: Vec<&str> = body.lines().map(str::trim).collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((names.len(), unique.len()), (12, 12), "every run once: {names:?}");
    let dry = plexus(&["sweep", "--resume", "sw", "--dry-run"], tmp.path());
    let (plan, _) = text(&dry);
    for n in &names {
        assert_eq!(plan.matches(&format!(" {n}  (")).count(), 1, "{n} in the plan:\n{plan}");
    }
    // Task 5 of the array trains run 5 and nothing else.
    let o =
        Command::new("bash").arg("array.sh").env("SLURM_ARRAY_TASK_ID", "5").current_dir(tmp.path()).output().unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
    let done: Vec<PathBuf> =
        run_dirs(&tmp.path().join("sw")).into_iter().filter(|r| r.join("summary.json").is_file()).collect();
    assert_eq!(done, vec![tmp.path().join("sw").join(names[5])]);
    assert!(
        names[5].contains("init_std=0.05") && names[5].contains("depth=4") && names[5].ends_with("seed=2"),
        "{}",
        names[5]
    );
}

#[test]
fn a_wrong_sweep_is_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = repo().join("configs/lnn/fig2b/1-none.yaml").display().to_string();
    let write = |name: &str, body: &str| std::fs::write(tmp.path().join(name), body.replace("CFG", &cfg)).unwrap();
    write("typo.yaml", "configs: [CFG]\nseeds: [0]\ngird: {model.depth: [2]}\n");
    write("scalar.yaml", "configs: [CFG]\ngrid: {model.depth: 3}\n");
    write("badvalue.yaml", "configs: [CFG]\ngrid: {model.depth: [3, -1]}\n");
    for (args, want) in [
        (vec!["sweep", "typo.yaml", "--out", "o"], "gird"),
        (vec!["sweep", "scalar.yaml", "--out", "o"], "allowed: a list of values"),
        (vec!["sweep", "badvalue.yaml", "--out", "o"], "model.depth"),
        (vec!["sweep", cfg.as_str(), "--seeds", "0,0", "--out", "o"], "lists a seed twice"),
        (vec!["sweep", cfg.as_str(), "--grid", "model.depth", "--out", "o"], "expected KEY=VALUE"),
        (vec!["sweep", cfg.as_str()], "Give --out DIR"),
        (vec!["sweep", "--resume", "nowhere"], "not a sweep folder"),
    ] {
        let o = plexus(&args, tmp.path());
        let (_, err) = text(&o);
        assert!(!o.status.success() && err.contains(want), "{args:?}: {err}");
    }
    assert!(!tmp.path().join("o").join("badvalue-depth=-1-seed=0").exists(), "nothing ran");
    // A folder holds one sweep: the same run name planned otherwise is refused.
    let o = plexus(&["sweep", cfg.as_str(), "--set", "train.steps=50", "--out", "o", "--quiet"], tmp.path());
    assert!(o.status.success(), "{:?}", text(&o));
    let o =
        plexus(&["sweep", cfg.as_str(), "--set", "train.steps=60", "--set", "model.depth=3", "--out", "o"], tmp.path());
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("use another --out"), "{err}");
}

/// Every shipped study (configs/studies/) plans, and every run it plans resolves to a valid config.
#[test]
fn every_shipped_study_plans_and_its_runs_resolve() {
    let mut n = 0;
    for e in std::fs::read_dir(repo().join("configs/studies")).unwrap() {
        let p = e.unwrap().path();
        let spec = plexus::study::spec::SweepSpec::from_file(&p).unwrap_or_else(|e| panic!("{e:#}"));
        let runs = spec.plan(&p.display().to_string()).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(spec.seeds.len() >= 3, "{}: a study runs at least 3 seeds", p.display());
        assert!(spec.out.is_some(), "{}: a study names its folder", p.display());
        for r in &runs {
            plexus::study::runner::resolved_yaml(r).unwrap_or_else(|e| panic!("{}: {}: {e:#}", p.display(), r.name));
        }
        n += 1;
    }
    assert!(n >= 8, "{n} studies");
}

/// Every file of `dir` (recursively, the lock file aside) with its bytes: a run's files before and
/// after something that must not touch them.
fn snapshot(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().is_some_and(|n| n != ".lock") {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// The config of the short sweeps below.
fn lnn_none() -> String {
    repo().join("configs/lnn/fig2b/1-none.yaml").display().to_string()
}

/// `plexus sweep` of `lnn_none()` over seeds 0 and 1, `steps` long, into `out`.
fn short_sweep(out: &str, steps: &str) -> Vec<String> {
    [
        "sweep".into(),
        lnn_none(),
        "--seeds".into(),
        "0,1".into(),
        "--set".into(),
        format!("train.steps={steps}"),
        "--quiet".into(),
        "--out".into(),
        out.into(),
    ]
    .into()
}

/// Runs [`short_sweep`] in `cwd`.
fn sweep_once(cwd: &Path, out: &str, steps: &str) -> std::process::Output {
    let args = short_sweep(out, steps);
    plexus(&args.iter().map(String::as_str).collect::<Vec<_>>(), cwd)
}

/// Two sweeps started at once on one folder: one runs, the other is refused by the folder's lock
/// before it reads a run's state, so each run trains once; a third started after both touches no
/// finished run (every file byte for byte as before).
#[test]
fn two_sweeps_on_one_folder_one_runs_the_other_is_refused_and_finished_runs_are_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let args = short_sweep("conc", "2000");
    let start = || {
        Command::new(env!("CARGO_BIN_EXE_plexus"))
            .args(&args)
            .current_dir(tmp.path())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start(), start());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let refused: Vec<String> = [&a, &b]
        .iter()
        .filter(|o| !o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    assert_eq!(refused.len(), 1, "exactly one sweep refused: {refused:?}");
    assert!(refused[0].contains("sweep folder conc is in use by another plexus process"), "{}", refused[0]);
    let logs = std::fs::read_to_string(tmp.path().join("conc/logs/1-none-seed=0.log")).unwrap();
    assert_eq!(logs.matches("=== ").count(), 1, "run seed=0 was started once:\n{logs}");
    let before = snapshot(&tmp.path().join("conc"));
    let o = sweep_once(tmp.path(), "conc", "2000");
    assert!(o.status.success(), "{:?}", text(&o));
    let after = snapshot(&tmp.path().join("conc"));
    for (path, bytes) in &before {
        if !path.starts_with(tmp.path().join("conc/report")) && !path.starts_with(tmp.path().join("conc/logs")) {
            assert!(after.get(path) == Some(bytes), "{} changed", path.display());
        }
    }
}

/// A finished run counts as finished only when its summary parses, its metrics are whole and its
/// final weights match their checksum: a damaged one is reported (naming the file and the
/// damage), left as it is, and the sweep exits non-zero.
#[test]
fn a_sweep_names_a_damaged_finished_run_instead_of_counting_it_done() {
    let tmp = tempfile::tempdir().unwrap();
    let o = sweep_once(tmp.path(), "sw", "300");
    assert!(o.status.success(), "{:?}", text(&o));
    let good = tmp.path().join("good");
    std::fs::rename(tmp.path().join("sw"), &good).unwrap();
    let seed0 = "1-none-seed=0";
    type Damage = Box<dyn Fn(&Path)>;
    let damages: [(&str, Damage, &str); 4] = [
        ("summary.json", Box::new(|p| std::fs::write(p, "garbage").unwrap()), "is not a run summary"),
        ("metrics.csv", Box::new(|p| std::fs::write(p, "").unwrap()), "empty or ends in the middle of a row"),
        (
            "metrics.csv",
            Box::new(|p| {
                let b = std::fs::read(p).unwrap();
                std::fs::write(p, &b[..b.len() - 3]).unwrap()
            }),
            "ends in the middle of a row",
        ),
        (
            "checkpoints/final.safetensors",
            Box::new(|p| std::fs::write(p, [0u8; 100]).unwrap()),
            "final.safetensors is corrupt: 100 bytes",
        ),
    ];
    for (file, damage, says) in damages {
        let _ = std::fs::remove_dir_all(tmp.path().join("sw"));
        let copy = Command::new("cp").arg("-a").arg(&good).arg(tmp.path().join("sw")).status().unwrap();
        assert!(copy.success());
        damage(&tmp.path().join("sw").join(seed0).join(file));
        let before = snapshot(&tmp.path().join("sw").join(seed0));
        let o = sweep_once(tmp.path(), "sw", "300");
        let (out, err) = text(&o);
        assert!(!o.status.success(), "{file}: a damaged run passed as finished:\n{out}\n{err}");
        assert!(err.contains(seed0) && err.contains(says) && err.contains("1 finished before"), "{file}: {err}");
        assert_eq!(before, snapshot(&tmp.path().join("sw").join(seed0)), "{file}: the damaged run was touched");
    }
}

/// `report R R` and `report SWEEP SWEEP` count each run once; `--slurm --dry-run` writes the
/// sweep record and the logs folder its script names; a grid past the sweep bound is refused at
/// once, naming the numbers.
#[test]
fn reports_count_a_run_once_slurm_plans_are_whole_and_huge_grids_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let o = sweep_once(tmp.path(), "sw", "300");
    assert!(o.status.success(), "{:?}", text(&o));
    let o = plexus(&["report", "sw", "sw/", "--format", "csv", "--out", "r1"], tmp.path());
    let (out, err) = text(&o);
    assert!(
        o.status.success() && out.contains("final_loss,2,") && err.contains("given more than once"),
        "{out}\n{err}"
    );
    let o = plexus(&["report", "sw/1-none-seed=0", "sw/1-none-seed=0", "sw/1-none-seed=1", "--out", "r2"], tmp.path());
    let (out, err) = text(&o);
    assert!(out.contains("2 finished runs") && err.contains("given more than once"), "{out}\n{err}");

    let o =
        plexus(&["sweep", &lnn_none(), "--seeds", "0,1", "--out", "sl", "--slurm", "job.sh", "--dry-run"], tmp.path());
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(tmp.path().join("sl/sweep.json").is_file() && tmp.path().join("sl/logs").is_dir());

    let t = std::time::Instant::now();
    let values: Vec<String> = (0..1000).map(|i| format!("{}", 0.001 * (i + 1) as f64)).collect();
    let grid = format!("model.init_std={}", values.join(","));
    let o = plexus(
        &[
            "sweep",
            &lnn_none(),
            "--grid",
            &grid,
            "--grid",
            &grid.replace("init_std", "depth"),
            "--out",
            "big",
            "--dry-run",
        ],
        tmp.path(),
    );
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("1 configs × 1000 values of model.init_std × 1000 values of model.depth × 1 seeds make more than the 10000 runs"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let values: Vec<String> = (0..1002).map(|i| i.to_string()).collect();
    let o =
        plexus(&["sweep", &lnn_none(), "--seeds", &values.join(","), "--out", "sl2", "--slurm", "job2.sh"], tmp.path());
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("1002 runs, but a Slurm job array holds at most 1001 tasks"), "{err}");
    assert!(!tmp.path().join("sl2/sweep.json").exists());
}

/// Raising `train.steps` of a finished sweep extends its runs from their last checkpoint (the
/// rule of `train --resume`); lowering it is refused.
#[test]
fn raising_train_steps_extends_a_finished_sweep_and_lowering_it_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |steps: &str| sweep_once(tmp.path(), "sw", steps);
    assert!(run("300").status.success());
    let o = run("600");
    assert!(o.status.success(), "{:?}", text(&o));
    let summary = std::fs::read_to_string(tmp.path().join("sw/1-none-seed=1/summary.json")).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert_eq!((summary["steps"].as_u64(), summary["resumed_from"].as_u64()), (Some(600), Some(300)), "{summary}");
    let log = std::fs::read_to_string(tmp.path().join("sw/logs/1-none-seed=1.log")).unwrap();
    assert!(log.contains("\"--resume\"") && log.matches("=== ").count() == 2, "{log}");
    let o = run("100");
    let (_, err) = text(&o);
    // Said as a sweep's length rule, not as "a run of another config" or a --resume error.
    assert!(
        !o.status.success()
            && err.contains("trained it with train.steps = 600, and the sweep now plans 100")
            && err.contains("may lengthen its runs, not shorten them")
            && !err.contains("another config"),
        "{err}"
    );
}

/// A sweep that lengthens runs on a cosine schedule follows `train --resume`'s rule: without a
/// rule for the added updates it is refused before any run starts, naming the choices and how to
/// give one; with `--extend hold` each run records the rule, and a later sweep of the same spec
/// (the rule now in every run) finds them finished.
#[test]
fn a_sweep_lengthening_cosine_runs_needs_a_rule_and_records_it() {
    let tmp = tempfile::tempdir().unwrap();
    let args = |steps: &str, extra: &[&str]| {
        let mut a = short_sweep("cos", steps);
        a.extend(["--set".into(), "train.schedule=cosine".into()]);
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let go = |a: Vec<String>| plexus(&a.iter().map(String::as_str).collect::<Vec<_>>(), tmp.path());
    assert!(go(args("200", &[])).status.success());
    let metrics = std::fs::read_to_string(tmp.path().join("cos/1-none-seed=1/metrics.csv")).unwrap();
    let o = go(args("300", &[]));
    let (_, err) = text(&o);
    assert!(
        !o.status.success()
            && err.contains("grows from 200 to 300")
            && err.contains("--extend hold")
            && err.contains("extend: hold|restart|stretch"),
        "{err}"
    );
    let run = tmp.path().join("cos/1-none-seed=1");
    assert_eq!(std::fs::read_to_string(run.join("metrics.csv")).unwrap(), metrics, "nothing ran");
    let o = go(args("300", &["--extend", "hold"]));
    assert!(o.status.success(), "{:?}", text(&o));
    let config = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    assert!(config.contains("from_steps: 200") && config.contains("rule: hold"), "{config}");
    let lengthened = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert!(lengthened.starts_with(&metrics), "the rows of the finished run are kept");
    let o = go(args("300", &[]));
    let (_, err) = text(&o);
    assert!(o.status.success() && err.contains("2 finished before"), "{err}");
}

/// An `across_seeds` claim whose `size` is not the length of the vector its runs will have is
/// refused before any run trains (it would have trained everything and left the claim without a
/// verdict), naming both lengths; the right size plans.
#[test]
fn an_across_seeds_size_other_than_the_vector_is_refused_before_the_runs() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("tiny.yaml"),
        "name: tiny\ndevice: cpu\nmodel: {kind: mlp, width: 8, depth: 4}\ntopology: {kind: hacn}\n\
         data: {kind: synthetic_images, image_size: 4, channels: 1, classes: 3, samples: 32, batch_size: 8}\n\
         train: {optimizer: adamw, lr: 0.01, steps: 4}\n",
    )
    .unwrap();
    let spec = |size: usize| {
        format!(
            "configs: [tiny.yaml]\nseeds: [0, 1, 2]\nout: sw\nclaims:\n  - id: a-shared\n    statement: s\n    \
             source: t\n    metric: final.a\n    a: name=tiny\n    across_seeds: correlation\n    size: {size}\n    \
             expect: greater\n"
        )
    };
    std::fs::write(tmp.path().join("bad.yaml"), spec(5)).unwrap();
    let o = plexus(&["sweep", "bad.yaml", "--quiet"], tmp.path());
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("`size: 5`, but the runs of arm a (name=tiny) will have 4 entries"),
        "{err}"
    );
    assert!(!tmp.path().join("sw").exists(), "nothing was trained or written");
    std::fs::write(tmp.path().join("good.yaml"), spec(4)).unwrap();
    let o = plexus(&["sweep", "good.yaml", "--dry-run"], tmp.path());
    assert!(o.status.success(), "{:?}", text(&o));
}

/// One config file per setting (each with its own `name`, and options only one topology has):
/// the default grouping includes those keys, and `--baseline topology.kind=residual` still pairs
/// each setting with the residual runs on shared seeds instead of answering "no shared seeds".
#[test]
fn a_baseline_pairs_with_its_group_when_names_and_topology_options_differ_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, topo, seed, acc) in [
        ("res", "kind: residual", 0, 0.80),
        ("res", "kind: residual", 1, 0.82),
        ("hacn", "kind: hacn\n  depth_ln: true", 0, 0.85),
        ("hacn", "kind: hacn\n  depth_ln: true", 1, 0.86),
    ] {
        let dir = tmp.path().join(format!("{name}-{seed}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.yaml"), format!("name: {name}\nseed: {seed}\ntopology:\n  {topo}\n")).unwrap();
        std::fs::write(dir.join("summary.json"), format!(r#"{{"eval": {{"accuracy": {acc}}}}}"#)).unwrap();
    }
    let o = plexus(&["report", ".", "--baseline", "topology.kind=residual", "--metric", "eval.accuracy"], tmp.path());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("| hacn | true | hacn | eval.accuracy (%)"))
        .unwrap_or_else(|| panic!("{out}"));
    // Δ = mean of (0.85 − 0.80, 0.86 − 0.82) = 0.045 over 2 pairs: 4.50 points.
    assert!(row.contains("| 4.50 (2) |"), "{row}");
}

/// A spec's claims get their verdicts from run directories, the report writes the per-run values
/// to runs.csv, and `report RUNS.csv --spec SPEC` prints the same tables and verdicts from it.
#[test]
fn claims_are_judged_from_runs_and_again_from_their_runs_csv() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    // H-ACN above residual by 4–6 points on each of 4 seeds; a loss 1000× lower.
    for (name, seed, acc, loss) in [
        ("res", 0, 0.80, 1e-3),
        ("res", 1, 0.82, 2e-3),
        ("res", 2, 0.79, 1.5e-3),
        ("res", 3, 0.81, 1e-3),
        ("hacn", 0, 0.85, 1e-6),
        ("hacn", 1, 0.86, 3e-6),
        ("hacn", 2, 0.85, 2e-6),
        ("hacn", 3, 0.86, 1e-6),
    ] {
        let dir = runs.join(format!("{name}-{seed}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.yaml"), format!("name: {name}\nseed: {seed}\n")).unwrap();
        std::fs::write(dir.join("summary.json"), format!(r#"{{"final_loss": {loss}, "eval": {{"accuracy": {acc}}}}}"#))
            .unwrap();
    }
    let spec = tmp.path().join("spec.yaml");
    std::fs::write(
        &spec,
        "configs: []\nreport: {by: [name], metrics: [eval.accuracy, final_loss]}\nclaims:\n\
         - {id: acc, statement: H-ACN is more accurate., source: test, metric: eval.accuracy, a: name=hacn, b: name=res, expect: greater}\n\
         - {id: loss, statement: H-ACN ends lower., source: test, metric: final_loss, scale: log, a: name=hacn, b: name=res, expect: greater}\n",
    )
    .unwrap();
    let s = |p: &Path| p.display().to_string();
    let out = tmp.path().join("rep");
    let o = plexus(&["report", &s(&runs), "--spec", &s(&spec), "--out", &s(&out), "--format", "summary"], tmp.path());
    let (first, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let row = |id: &str| {
        first.lines().find(|l| l.starts_with(&format!("| {id} |"))).unwrap_or_else(|| panic!("{first}")).to_string()
    };
    assert!(row("acc").ends_with("| **holds** |"), "{first}");
    assert!(row("acc").contains("| 5.00 ["), "Δ in points: {first}");
    assert!(row("loss").ends_with("| **does not hold** |"), "{first}");
    assert!(first.contains("final_loss (geometric)"), "a loss spanning decades is summarised on a log scale: {first}");
    for id in ["acc", "loss"] {
        assert!(out.join(format!("claim-{id}.png")).is_file(), "the figure of claim {id}");
    }
    let again = plexus(&["report", &s(&out.join("runs.csv")), "--spec", &s(&spec), "--format", "summary"], tmp.path());
    assert!(again.status.success(), "{}", text(&again).1);
    assert_eq!(text(&again).0, first);
    // The overview of two studies (here the same one twice, from its runs and from its runs.csv):
    // one row per claim each, named by the spec's file stem, with the summary's verdicts.
    let csv = s(&out.join("runs.csv"));
    let both = plexus(
        &["report", &s(&runs), &csv, "--spec", &s(&spec), "--spec", &s(&spec), "--format", "verdicts"],
        tmp.path(),
    );
    let (table, err) = text(&both);
    assert!(both.status.success(), "{err}");
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| `spec` |")).collect();
    assert_eq!(rows.len(), 4, "{table}");
    assert!(rows[0].contains("| acc |") && rows[0].ends_with("| **holds** |"), "{table}");
    assert!(rows[3].contains("| loss |") && rows[3].ends_with("| **does not hold** |"), "{table}");
    // Several specs only with `verdicts`, and as many as the paths.
    let e = plexus(&["report", &s(&runs), &csv, "--spec", &s(&spec), "--spec", &s(&spec)], tmp.path());
    assert!(!e.status.success() && text(&e).1.contains("--format verdicts only"), "{}", text(&e).1);
    let e =
        plexus(&["report", &s(&runs), "--spec", &s(&spec), "--spec", &s(&spec), "--format", "verdicts"], tmp.path());
    assert!(!e.status.success() && text(&e).1.contains("1 path(s), 2 spec(s)"), "{}", text(&e).1);
}

/// An RL study survives a second sweep, a resume and a requeued Slurm task (`--only`): each
/// finds its finished runs where `plexus rl` writes the final weights
/// (`checkpoints/final.safetensors`), skips them and leaves every file byte for byte as it was —
/// none reported damaged. (Before, the sweep looked for RL weights at the run's root and called
/// every finished RL run damaged.)
#[test]
fn an_rl_study_swept_twice_resumed_and_requeued_keeps_its_finished_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("tiny-rl.yaml");
    std::fs::write(&cfg, common::TINY_RL_CONFIG).unwrap();
    swept_twice_resumed_and_requeued(tmp.path(), &[cfg.to_str().unwrap()]);
}

/// The same for a `plexus train` study (the deep linear network, 300 steps).
#[test]
fn a_train_study_swept_twice_resumed_and_requeued_keeps_its_finished_runs() {
    let tmp = tempfile::tempdir().unwrap();
    swept_twice_resumed_and_requeued(tmp.path(), &[&lnn_none(), "--set", "train.steps=300"]);
}

/// Sweeps `config` (and extra arguments) over seeds 0 and 1 into `study/` under `cwd`, then sweeps
/// it again, resumes it and requeues one run: each time every finished run is counted as
/// finished before (none damaged, none trained again) and no file of a run changes.
fn swept_twice_resumed_and_requeued(cwd: &Path, config: &[&str]) {
    let sweep = |extra: &[&str]| {
        let mut args = vec!["sweep"];
        args.extend_from_slice(config);
        args.extend_from_slice(&["--seeds", "0,1", "--quiet", "--out", "study"]);
        args.extend_from_slice(extra);
        plexus(&args, cwd)
    };
    let o = sweep(&[]);
    assert!(o.status.success(), "{:?}", text(&o));
    let out = cwd.join("study");
    let runs = run_dirs(&out);
    assert_eq!(runs.len(), 2, "{runs:?}");
    for r in &runs {
        assert!(r.join("checkpoints/final.safetensors").is_file(), "{}", r.display());
    }
    let name = runs[0].file_name().unwrap().to_str().unwrap().to_string();
    let before = snapshot(&out);
    let again: [(&str, Vec<String>); 3] = [
        ("a second sweep", vec![]),
        ("a resume", vec!["--resume".into(), out.display().to_string(), "--quiet".into()]),
        (
            "a requeued task",
            vec!["--resume".into(), out.display().to_string(), "--only".into(), name.clone(), "--quiet".into()],
        ),
    ];
    for (what, args) in again {
        let o = if args.is_empty() {
            sweep(&[])
        } else {
            let mut a = vec!["sweep"];
            a.extend(args.iter().map(String::as_str));
            plexus(&a, cwd)
        };
        let (_, err) = text(&o);
        assert!(o.status.success(), "{what}: {err}");
        assert!(!err.contains("damaged") && !err.contains("FAILED"), "{what}: {err}");
        let finished_before = if what == "a requeued task" { "1 finished before" } else { "2 finished before" };
        assert!(err.contains(finished_before) && err.contains("0 finished now"), "{what}: {err}");
        let after = snapshot(&out);
        for (path, bytes) in &before {
            if !path.starts_with(out.join("report")) && !path.starts_with(out.join("logs")) {
                assert!(after.get(path) == Some(bytes), "{what}: {} changed", path.display());
            }
        }
    }
}

/// A claim that could never be judged on what the sweep plans (an arm no planned run matches) is
/// refused before any run trains, naming the claim and what the runs have; the sweep folder is
/// not created.
#[test]
fn a_claim_whose_arm_matches_no_planned_run_is_refused_before_training() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("study.yaml");
    std::fs::write(
        &spec,
        format!(
            "configs: [{}]\nseeds: [0, 1]\nset: {{train.steps: 50}}\nclaims:\n  - id: c\n    statement: s\n    \
             source: x\n    metric: final_loss\n    a: name=lnn-fig2b-none\n    b: name=lnn-fig2b-nnoe\n    expect: less\n",
            lnn_none()
        ),
    )
    .unwrap();
    let o = plexus(&["sweep", spec.to_str().unwrap(), "--out", "s", "--quiet"], tmp.path());
    let (_, err) = text(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("claim `c`") && err.contains("no run has name=lnn-fig2b-nnoe") && err.contains("lnn-fig2b-none"),
        "{err}"
    );
    assert!(!tmp.path().join("s").exists(), "the sweep folder was created");
}

/// Pre-registration you can check: a sweep records in each run the fingerprint of the claims it
/// was made under and the spec's commit (`study.json`); the report's runs.csv carries them; a
/// report whose spec's claims changed since says how many runs were made under other claims.
#[test]
fn runs_record_the_claims_they_were_made_under_and_a_changed_claim_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("study.yaml");
    let write_spec = |statement: &str| {
        std::fs::write(
            &spec,
            format!(
                "configs: [{}]\nseeds: [0, 1, 2]\nset: {{train.steps: 60}}\nclaims:\n  - id: c\n    statement: {statement}\n    \
                 source: x\n    metric: final_loss\n    b_metric: min_loss\n    a: name=lnn-fig2b-none\n    \
                 b: name=lnn-fig2b-none\n    expect: greater\n",
                lnn_none()
            ),
        )
        .unwrap()
    };
    write_spec("the last loss is not below the lowest");
    let o = plexus(&["sweep", spec.to_str().unwrap(), "--out", "s", "--quiet"], tmp.path());
    assert!(o.status.success(), "{:?}", text(&o));
    let runs = run_dirs(&tmp.path().join("s"));
    assert_eq!(runs.len(), 3);
    let recorded: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| serde_json::from_str(&std::fs::read_to_string(r.join("study.json")).unwrap()).unwrap())
        .collect();
    let fingerprint = recorded[0]["claims"].as_str().unwrap().to_string();
    assert_eq!(fingerprint.len(), 8);
    assert!(recorded.iter().all(|r| r["claims"] == fingerprint.as_str() && r["spec_commit"].is_null()), "{recorded:?}");
    let csv = std::fs::read_to_string(tmp.path().join("s/report/runs.csv")).unwrap();
    assert!(csv.lines().next().unwrap().contains("config:study.claims"), "{csv}");
    assert!(csv.contains(&fingerprint), "{csv}");
    let report = |args: &[&str]| {
        let mut a = vec!["report"];
        a.extend_from_slice(args);
        let o = plexus(&a, tmp.path());
        assert!(o.status.success(), "{:?}", text(&o));
        text(&o).0
    };
    let spec_arg = spec.to_str().unwrap();
    let md = report(&["s", "--spec", spec_arg]);
    assert!(!md.contains("Made under other claims"), "{md}");
    // The claim is changed after the runs: the report says so, from the runs and from runs.csv.
    write_spec("the last loss is above the lowest");
    for from in ["s", "s/report/runs.csv"] {
        let md = report(&[from, "--spec", spec_arg]);
        assert!(
            md.contains("**Made under other claims:** 3 of the 3 runs") && md.contains(&fingerprint),
            "{from}: {md}"
        );
    }
}

/// A spec's `report:` section sets the figures' width and formats (a sweep's own report has no
/// flags), the flags win over it, the line printed names what was written, and a bad value is
/// refused naming the file, the key, the value and what is allowed.
#[test]
fn a_specs_report_section_sets_the_figures_width_and_formats() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    for (kind, seed, acc) in [("residual", 0, 0.8), ("residual", 1, 0.82), ("hacn", 0, 0.85), ("hacn", 1, 0.84)] {
        fake_run(&runs.join(format!("{kind}-{seed}")), kind, seed, acc, &[acc - 0.2, acc]);
    }
    let spec = tmp.path().join("spec.yaml");
    std::fs::write(&spec, "report: {curves: [eval.accuracy], width: single, formats: png}\n").unwrap();
    let png_width = |p: &Path| {
        let b = std::fs::read(p).unwrap();
        u32::from_be_bytes([b[16], b[17], b[18], b[19]])
    };
    let column = (3.25 * f64::from(plexus::plot::PDF_DPI)).round() as u32;
    let o = plexus(&["report", "runs", "--spec", "spec.yaml", "--out", "rep"], tmp.path());
    assert!(o.status.success(), "{}", text(&o).1);
    let figures: Vec<PathBuf> = std::fs::read_dir(tmp.path().join("rep"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("curve-"))
        .collect();
    assert!(!figures.is_empty() && figures.iter().all(|p| p.extension().unwrap() == "png"), "{figures:?}");
    assert_eq!(png_width(&tmp.path().join("rep/curve-eval_accuracy.png")), column);
    assert!(text(&o).1.contains(&format!("{} figure files (curve-*: .png)", figures.len())), "{}", text(&o).1);
    // The flags win.
    let o = plexus(&["report", "runs", "--spec", "spec.yaml", "--out", "rep2", "--width", "double"], tmp.path());
    assert!(o.status.success(), "{}", text(&o).1);
    assert_eq!(png_width(&tmp.path().join("rep2/curve-eval_accuracy.png")), 1200, "6.75 in");
    std::fs::write(&spec, "report: {width: wide}\n").unwrap();
    let o = plexus(&["report", "runs", "--spec", "spec.yaml", "--out", "rep3"], tmp.path());
    let e = text(&o).1;
    assert!(
        !o.status.success() && e.contains("spec.yaml") && e.contains("report.width") && e.contains("`wide`"),
        "{e}"
    );
    assert!(e.contains("single") && e.contains("double"), "{e}");
    std::fs::write(&spec, "report: {formats: \"png,eps\"}\n").unwrap();
    let e = text(&plexus(&["report", "runs", "--spec", "spec.yaml", "--out", "rep3"], tmp.path())).1;
    assert!(e.contains("report.formats") && e.contains("png,eps") && e.contains("png, svg, pdf"), "{e}");
}
