//! `plexus analyze` on tiny trained runs: the early exit of each topology and depth pruning agree with
//! exits composed here by hand from the backbone's own pieces (embed → units → readout), Γ of an
//! H-ACN run is ‖a‖₂/√L of its checkpoint, and the connectivity CSVs behind the heatmaps show the
//! patterns of H-ACN Fig. 8 at initialisation.

use plexus::analysis::{self, AnalyzeOptions, Run};
use plexus::data::Task;
use plexus::experiment::Experiment;
use plexus::run_dir::RunDir;
use plexus::topology::Norm;
use plexus::train::{self, TrainOptions};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

/// A 4-unit MLP on generated 4-class images; 40 steps are enough to move every weight.
fn tiny(topology: &str) -> String {
    format!(
        "name: tiny-{topology}
seed: 3
model: {{kind: mlp, width: 16, hidden: 32, depth: 4}}
topology: {{kind: {topology}}}
data: {{kind: synthetic_images, image_size: 4, channels: 1, classes: 4, samples: 128, batch_size: 32, noise: 1.0}}
train: {{optimizer: adamw, lr: 0.01, steps: 40}}
log: {{every: 1, eval_every: 20, checkpoint_every: 40, connectivity_every: 10}}
"
    )
}

fn trained(yaml: &str, dir: &Path) -> PathBuf {
    let e = Experiment::from_str(yaml, "<test>", &[]).unwrap_or_else(|e| panic!("{e}"));
    let d = RunDir::create(dir).unwrap();
    train::train(&e, &d, &TrainOptions::default()).unwrap();
    dir.to_path_buf()
}

/// Mean cross-entropy and accuracy of `logits` [N, classes] against `target` [N].
fn metrics(logits: &Tensor, target: &Tensor) -> (f64, f64) {
    let loss = logits.cross_entropy_for_logits(target).double_value(&[]);
    let acc = logits.argmax(-1, false).eq_tensor(target).to_kind(Kind::Double).mean(Kind::Double).double_value(&[]);
    (loss, acc)
}

/// Exits of every depth `k = 0..=L` composed by hand: `stream(x0, outputs, k)` gives what the
/// readout reads after `k` units, from the embedding and the outputs of the units that ran.
fn hand_exits(run: &Run, rule: impl Fn(&Tensor, &[&dyn plexus::topology::Unit], usize) -> Tensor) -> Vec<(f64, f64)> {
    let first = run.eval.batch(0);
    let (input, target) = (&first.input, &first.target);
    assert_eq!(run.eval.len(), 1, "one evaluation batch keeps the by-hand means exact");
    tch::no_grad(|| {
        let x0 = run.model.backbone.embed(input, false);
        run.model.with_units(|units| {
            (0..=units.len())
                .map(|k| metrics(&run.model.backbone.readout(&rule(&x0, units, k), false), target))
                .collect()
        })
    })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * (1.0 + a.abs())
}

#[test]
fn residual_exits_and_pruning_match_the_stream_computed_by_hand() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = trained(&tiny("residual"), &tmp.path().join("res"));
    let run = Run::load(&dir).unwrap();
    assert_eq!(run.task, Task::Classification);
    // Residual: x_k = x_{k−1} + f_k(x_{k−1}); the exit after k units reads the stream x_k.
    let hand = hand_exits(&run, |x0, units, k| {
        let mut x = x0.shallow_clone();
        for f in &units[..k] {
            x = &x + f.forward(&x, Norm::Default, false);
        }
        x
    });
    let exits = analysis::layerwise(&run);
    assert_eq!(exits.len(), 5);
    for (e, (loss, acc)) in exits.iter().zip(&hand) {
        assert!(close(e.loss, *loss), "exit {}: {} vs by hand {loss}", e.units, e.loss);
        assert!(close(e.accuracy.unwrap(), *acc), "exit {}: {:?} vs by hand {acc}", e.units, e.accuracy);
    }
    // Pruning the top k units is the exit after L − k units, row by row.
    let pruned = analysis::pruning(&exits);
    for p in &pruned {
        let (loss, acc) = hand[4 - p.removed];
        assert!(close(p.loss, loss) && close(p.accuracy.unwrap(), acc), "removed {}: {p:?}", p.removed);
    }
    // The full exit is the trained model (its final eval) and is far better than the bare embedding.
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let final_loss = summary["eval"]["loss"].as_f64().expect("summary.json has eval.loss");
    assert!(close(exits[4].loss, final_loss), "{} vs summary {final_loss}", exits[4].loss);
    assert!(exits[4].loss < 0.7 * exits[0].loss, "{exits:?}");
}

#[test]
fn acn_exit_reads_the_running_sum_of_the_unit_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = trained(&tiny("acn"), &tmp.path().join("acn"));
    let run = Run::load(&dir).unwrap();
    // ACN: x_k = f_k(x_{k−1}) with no shortcut; the readout reads x0 + x1 + … + x_k.
    let by_sum = |x0: &Tensor, units: &[&dyn plexus::topology::Unit], k: usize| {
        let (mut x, mut sum) = (x0.shallow_clone(), x0.shallow_clone());
        for f in &units[..k] {
            x = f.forward(&x, Norm::Default, false);
            sum = &sum + &x;
        }
        sum
    };
    let hand = hand_exits(&run, by_sum);
    let exits = analysis::layerwise(&run);
    for (e, (loss, acc)) in exits.iter().zip(&hand) {
        assert!(close(e.loss, *loss) && close(e.accuracy.unwrap(), *acc), "exit {}: {e:?} vs {loss} {acc}", e.units);
    }
    // And not the residual stream's definition: reading x_k alone gives other numbers.
    let last_only = hand_exits(&run, |x0, units, k| {
        let mut x = x0.shallow_clone();
        for f in &units[..k] {
            x = f.forward(&x, Norm::Default, false);
        }
        x
    });
    assert!((1..=4).any(|k| !close(last_only[k].0, hand[k].0)), "the two exit rules must differ on this model");
}

#[test]
fn gamma_of_an_hacn_run_is_the_rms_of_its_checkpointed_residual_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let yaml = tiny("hacn").replace("{kind: hacn}", "{kind: hacn, init: {kind: normal, mu: 0.5, sigma: 0.1}}");
    let dir = trained(&yaml, &tmp.path().join("hacn"));
    let ck = Tensor::read_safetensors(dir.join("checkpoints/final.safetensors")).unwrap();
    // The default convention: a = alpha (the paper's).
    let a = &ck.iter().find(|(n, _)| n == "topology.alpha").expect("topology.alpha in the checkpoint").1;
    let a: Vec<f64> = Vec::<f64>::try_from(a.to_kind(Kind::Double).flatten(0, -1)).unwrap();
    assert_eq!(a.len(), 4);
    let expected = a.iter().map(|v| v * v).sum::<f64>().sqrt() / (a.len() as f64).sqrt();
    let summary = analysis::analyze(&dir, &AnalyzeOptions { repeats: 1, ..Default::default() }).unwrap();
    let gamma = summary.gamma.expect("hacn reports Γ");
    assert!((gamma - expected).abs() < 1e-6, "Γ {gamma} vs ‖a‖/√L {expected}");
    // gamma.csv ends at the same value, and Δ_t ends at 0 and starts where a_0 was.
    let last: Vec<String> = std::fs::read_to_string(dir.join("gamma.csv")).unwrap().lines().map(String::from).collect();
    let g: f64 = last.last().unwrap().split(',').nth(1).unwrap().parse().unwrap();
    assert!((g - expected).abs() < 1e-5, "gamma.csv ends at {g}, expected {expected}");
    let delta = std::fs::read_to_string(dir.join("delta.csv")).unwrap();
    let rows: Vec<f64> = delta.lines().skip(1).map(|l| l.split(',').nth(1).unwrap().parse().unwrap()).collect();
    assert_eq!(*rows.last().unwrap(), 0.0);
    assert!(rows[0] > 1e-3, "the weights moved during training: {delta}");
}

/// Rows of a connectivity CSV (source node) × columns (target node), header and index dropped.
fn matrix(p: &Path) -> Vec<Vec<f64>> {
    plexus::run_dir::read_matrix(p).unwrap().rows().into_iter().map(|r| r.to_vec()).collect()
}

#[test]
fn heatmaps_at_init_show_the_residual_and_acn_patterns_of_hacn_fig8() {
    let tmp = tempfile::tempdir().unwrap();
    for topology in ["residual", "acn"] {
        let yaml = tiny(topology).replace("steps: 40", "steps: 1");
        let dir = trained(&yaml, &tmp.path().join(topology));
        let c = matrix(&dir.join("connectivity/step_0.csv"));
        let n = 4 + 2; // embedding, 4 units, readout
        assert_eq!((c.len(), c[0].len()), (n, n));
        for (i, row) in c.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                // Residual: every node reaches every later node with weight 1 (a full upper triangle).
                // ACN: each node feeds only the next unit and, directly, the readout.
                let expected = match topology {
                    "residual" => (j > i) as u8 as f64,
                    _ => (j == i + 1 || (j == n - 1 && i < n - 1)) as u8 as f64,
                };
                assert_eq!(v, expected, "{topology}: C[{i}][{j}] = {v}, expected {expected}");
            }
        }
        // The figure drawn from it exists.
        let figs = plot_runs(&dir, &dir.join("figures"));
        // Named by the run directory (`<tmp>/<topology>`), not by the config's name.
        let png = dir.join(format!("figures/connectivity_{topology}.png"));
        assert!(figs.contains(&png), "{} not among {figs:?}", png.display());
    }
}

/// Pearson correlation written out, for the check below.
fn pearson_by_hand(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let sxx: f64 = x.iter().map(|a| (a - mx).powi(2)).sum();
    let syy: f64 = y.iter().map(|b| (b - my).powi(2)).sum();
    sxy / (sxx * syy).sqrt()
}

#[test]
fn seed_correlation_is_the_pearson_correlation_of_the_checkpointed_residual_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tiny("hacn").replace("{kind: hacn}", "{kind: hacn, init: {kind: normal, mu: 0.5, sigma: 0.2}}");
    let runs: Vec<PathBuf> = (0..3)
        .map(|s| trained(&base.replace("seed: 3", &format!("seed: {}", 10 + s)), &tmp.path().join(format!("s{s}"))))
        .collect();
    let alphas: Vec<Vec<f64>> = runs
        .iter()
        .map(|d| {
            let ck = Tensor::read_safetensors(d.join("checkpoints/final.safetensors")).unwrap();
            let a = &ck.iter().find(|(n, _)| n == "topology.alpha").unwrap().1;
            Vec::<f64>::try_from(a.to_kind(Kind::Double).flatten(0, -1)).unwrap()
        })
        .collect();
    assert!(alphas[0] != alphas[1], "different seeds, different weights");
    let m = analysis::correlate(&runs).unwrap();
    for i in 0..3 {
        assert!((m[[i, i]] - 1.0).abs() < 1e-12);
        for j in 0..3 {
            let want = pearson_by_hand(&alphas[i], &alphas[j]);
            // params/a_step_N.csv holds the weights as printed decimals: agreement to 1e-5.
            assert!((m[[i, j]] - want).abs() < 1e-5, "runs {i},{j}: {} vs {want}", m[[i, j]]);
        }
    }
}

/// Each saved C and parameter view is also a NumPy array (`.npy`, float64) beside its CSV:
/// `numpy.load` gives the CSV's numbers exactly.
#[test]
fn connectivity_and_parameter_views_load_in_numpy_with_the_csvs_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained(&tiny("hacn"), &tmp.path().join("run"));
    let mut csvs: Vec<PathBuf> = Vec::new();
    for sub in ["connectivity", "params"] {
        for e in std::fs::read_dir(run.join(sub)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "csv") {
                csvs.push(p);
            }
        }
    }
    csvs.sort();
    assert!(csvs.len() >= 10, "{csvs:?}");
    let script = "import json, sys, numpy as np\n\
                  print(json.dumps([[repr(float(v)) for v in np.load(p).ravel()] + [list(np.load(p).shape), str(np.load(p).dtype)] for p in sys.argv[1:]]))";
    let npys: Vec<PathBuf> = csvs.iter().map(|c| c.with_extension("npy")).collect();
    let o = std::process::Command::new(plexus::parity::python()).arg("-c").arg(script).args(&npys).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let loaded: Vec<Vec<serde_json::Value>> = serde_json::from_slice(&o.stdout).unwrap();
    for (csv, got) in csvs.iter().zip(loaded) {
        let want = plexus::run_dir::read_matrix(csv).unwrap();
        let (shape, dtype) = (&got[got.len() - 2], &got[got.len() - 1]);
        assert_eq!(shape, &serde_json::json!([want.nrows(), want.ncols()]), "{}", csv.display());
        assert_eq!(dtype, "float64");
        // repr() of a float64 round-trips: the exact value, compared as text parsed by Rust.
        let values: Vec<f64> = got[..got.len() - 2].iter().map(|v| v.as_str().unwrap().parse().unwrap()).collect();
        assert_eq!(values, want.iter().copied().collect::<Vec<_>>(), "{}", csv.display());
    }
}

/// Every figure kind is also a vector PDF: DejaVu embedded (a font file in the PDF, subset), a page
/// of the figure's size at `PDF_DPI` (a 1200-pixel figure is 6.75 in = 486 pt wide); where
/// `pdflatex` is installed, a LaTeX document including each PDF builds.
#[test]
fn every_figure_is_also_a_pdf_with_its_fonts_embedded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = trained(&tiny("hacn"), &tmp.path().join("run"));
    let opts = AnalyzeOptions { repeats: 1, ..Default::default() };
    analysis::analyze(&dir, &opts).unwrap();
    let figs = plot_runs(&dir, &dir.join("figures"));
    let pdfs: Vec<&PathBuf> = figs.iter().filter(|f| f.extension().is_some_and(|x| x == "pdf")).collect();
    let pngs = figs.iter().filter(|f| f.extension().is_some_and(|x| x == "png")).count();
    assert_eq!(pdfs.len(), pngs, "one PDF per figure: {figs:?}");
    assert!(pdfs.len() >= 6, "{figs:?}");
    for pdf in &pdfs {
        let bytes = std::fs::read(pdf).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.starts_with("%PDF-"), "{}", pdf.display());
        assert!(text.contains("/FontFile2") && text.contains("DejaVuSans"), "{}: fonts not embedded", pdf.display());
        let png = image::image_dimensions(pdf.with_extension("png")).unwrap();
        let media = text.split("/MediaBox [").nth(1).and_then(|s| s.split(']').next()).unwrap();
        let w: f64 = media.split_whitespace().nth(2).unwrap().parse().unwrap();
        let want = png.0 as f64 * 72.0 / plexus::plot::PDF_DPI as f64;
        assert!((w - want).abs() < 0.5, "{}: page {w} pt wide, expected {want}", pdf.display());
    }
    let Ok(latex) = which_pdflatex() else {
        eprintln!("skipped the LaTeX build: pdflatex is not installed (apt-get install texlive-latex-base)");
        return;
    };
    let mut doc = String::from("\\documentclass{article}\\usepackage{graphicx}\\begin{document}\n");
    for pdf in &pdfs {
        doc += &format!("\\includegraphics[width=3.25in]{{{}}}\n", pdf.display());
    }
    doc += "\\end{document}\n";
    std::fs::write(tmp.path().join("figs.tex"), doc).unwrap();
    let o = std::process::Command::new(latex)
        .args(["-interaction=nonstopmode", "figs.tex"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

fn which_pdflatex() -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("pdflatex")).find(|p| p.is_file()))
        .ok_or(())
}

/// The files `plexus plot RUN` writes of `run` into `out` (double width, PNG, SVG and PDF).
fn plot_runs(run: &Path, out: &Path) -> Vec<PathBuf> {
    let figures = plexus::plot::figures::all(std::slice::from_ref(&run.to_path_buf()), None, None).unwrap();
    plexus::plot::write_all(&figures, &Default::default(), out).unwrap()
}
