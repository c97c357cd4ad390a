//! Every kind of figure plexus draws ([`plexus::plot::Kind::ALL`]), built from tiny runs this test
//! trains (seconds) through the producers the commands call, drawn at a column's width and at the
//! text width, is laid out as a paper's figure. From the SVG: no text box overlaps another or
//! leaves the canvas (boxes from the font's outlines, as usvg sets the text), no tick label is
//! written `1e1`, the legend's box meets no drawn line or point, and every topology has one
//! colour in every figure. From what the renderer drew ([`plexus::plot::lint`]): 3 or more
//! labelled ticks on every numeric axis and the data inside them, the title set whole, no raw key
//! in a label, glyphs the font has, colours the eye tells apart and dark enough on white, no curve
//! hidden under another. Each check also fails on a planted defect of its kind (the tests at the
//! end). `PLEXUS_REGENERATE_DOCS=1` also copies one PNG of each kind into `docs/figures/gallery/`
//! and rewrites `docs/gallery.md`; without it the gallery is checked to show every kind.

use plexus::analysis::{self, AnalyzeOptions};
use plexus::experiment::Experiment;
use plexus::plot::{self, Figure, Kind};
use plexus::run_dir::RunDir;
use plexus::train::{self, TrainOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use svg2pdf::usvg;

use crate::common;

/// A 4-unit MLP on generated 4-class images, 40 steps.
fn tiny(name: &str, topology: &str, seed: u64) -> String {
    format!(
        "name: {name}
seed: {seed}
model: {{kind: mlp, width: 16, hidden: 32, depth: 4}}
topology: {{kind: {topology}}}
data: {{kind: synthetic_images, image_size: 4, channels: 1, classes: 4, samples: 128, batch_size: 32, noise: 1.0}}
train: {{optimizer: adamw, lr: 0.01, steps: 40}}
log: {{every: 1, eval_every: 10, checkpoint_every: 20, connectivity_every: 10}}
"
    )
}

/// Trains and analyses the runs: residual and H-ACN over three seeds (a setting drawn as a mean
/// with a band), ACN, ANCRe, a sparse `graph` (each unit reads the two nodes before it) and AttnRes
/// over mHC's 3 streams over one.
fn runs(root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for (topology, seeds) in [
        ("residual", 3),
        ("acn", 1),
        ("hacn", 3),
        ("ancre", 1),
        ("graph, pattern: {window: 2}", 1),
        ("compose, depth: {kind: attnres}, width: {kind: mhc, n: 3}", 1),
    ] {
        for seed in 0..seeds {
            let name = topology.split(',').next().unwrap();
            let dir = root.join(format!("{name}-seed={seed}"));
            let e = Experiment::from_str(&tiny(&format!("tiny-{name}"), topology, seed), "<test>", &[])
                .unwrap_or_else(|e| panic!("{e}"));
            let d = RunDir::create(&dir).unwrap();
            train::train(&e, &d, &TrainOptions::default()).unwrap();
            analysis::analyze(&dir, &AnalyzeOptions { repeats: 1, ..Default::default() }).unwrap();
            dirs.push(dir);
        }
    }
    dirs
}

const SPEC: &str = "
claims:
  - id: hacn-not-worse
    statement: H-ACN is not less accurate than residual by more than 20 points.
    source: test
    metric: eval.accuracy
    a: topology.kind=hacn
    b: topology.kind=residual
    expect: at_least
    margin: 20 pp   # a margin of 0.2 as a fraction, said in its unit
  - id: hacn-loss-ratio
    statement: H-ACN's final loss is within a factor of two of residual's.
    source: test
    metric: final_loss
    a: topology.kind=hacn
    b: topology.kind=residual
    expect: equivalent
    scale: log
    margin: 0.693
  - id: hacn-a-profile
    statement: The residual weights of the seeds share a profile.
    source: test
    metric: final.a
    across_seeds: correlation
    size: 4
    a: topology.kind=hacn
    expect: greater
";

/// A run of `config` (YAML) trained and analysed in `dir`.
fn train_and_analyze(config: &str, dir: &Path) -> PathBuf {
    let e = Experiment::from_str(config, "<test>", &[]).unwrap_or_else(|e| panic!("{e}"));
    let d = RunDir::create(dir).unwrap();
    train::train(&e, &d, &TrainOptions::default()).unwrap();
    analysis::analyze(dir, &AnalyzeOptions { repeats: 1, ..Default::default() }).unwrap();
    dir.to_path_buf()
}

/// The figures of the runs no MLP run draws: a language model's perplexity (a tiny GPT), a
/// diffusion model's ε-MSE by timestep (a tiny DiT), the RL success curve (two tiny RL runs) and
/// `bench --depths` (a tiny MLP at depths 2 and 4, one timed step each).
fn other_figures(root: &Path) -> Vec<Figure> {
    let mut figures = Vec::new();
    let gpt = format!(
        "name: tiny-gpt\nseed: 0\n{}topology: {{kind: residual}}\ntrain: {{optimizer: adamw, lr: 0.01, steps: 20}}\n\
         log: {{every: 1, eval_every: 5}}\n",
        common::tiny_backbone("gpt")
    );
    let lm = train_and_analyze(&gpt, &root.join("gpt"));
    figures.extend(plot::figures::all(&[lm], None, None).unwrap());
    // MUDD's C per way (a tiny 3-layer GPT).
    let mudd = "name: tiny-mudd\nseed: 0\nmodel: {kind: gpt, width: 8, depth: 3, heads: 2}\n\
                data: {kind: synthetic_tokens, vocab: 16, seq_len: 6, batch_size: 2}\ntopology: {kind: mudd}\n\
                train: {optimizer: adamw, lr: 0.01, steps: 20}\nlog: {every: 1, eval_every: 5, connectivity_every: 10}\n";
    let run = train_and_analyze(mudd, &root.join("mudd"));
    figures.extend(plot::figures::all(&[run], None, None).unwrap().into_iter().filter(|f| f.kind == plot::Kind::Ways));
    let dit = "name: tiny-dit\nseed: 3\nmodel: {kind: dit, patch: 2, width: 16, depth: 2, heads: 2}\n\
               topology: {kind: residual}\ndata: {kind: synthetic_images, image_size: 8, channels: 3, classes: 4, \
               samples: 32, batch_size: 8}\ntrain: {optimizer: adamw, lr: 3.0e-3, steps: 8}\nlog: {every: 1, \
               eval_every: 4}\n";
    let e = Experiment::from_str(dit, "<test>", &[]).unwrap_or_else(|e| panic!("{e}"));
    let d = RunDir::create(&root.join("dit")).unwrap();
    train::train(&e, &d, &TrainOptions::default()).unwrap();
    figures.extend(plot::figures::eps_by_t(&plot::figures::open_runs(&[root.join("dit")]).unwrap()).unwrap());
    let mut rl = Vec::new();
    for (topology, depth) in [("residual", 4), ("hacn", 4), ("hacn", 8)] {
        let yaml = common::TINY_RL_CONFIG
            .replace("topology: {kind: residual}", &format!("topology: {{kind: {topology}}}"))
            .replace("depth: 4", &format!("depth: {depth}"))
            .replace("name: t", &format!("name: rl-{topology}-{depth}"));
        let exp = plexus::rl::config::RlExperiment::from_str(&yaml, Path::new("rl.yaml"), &[]).unwrap();
        let dir = root.join(format!("rl-{topology}-{depth}"));
        plexus::rl::trainer::train(&exp, &dir, &Default::default()).unwrap();
        rl.push(dir);
    }
    figures.extend(plot::curves::kind_figure(&plexus::kinds::RL, &rl).unwrap());
    let config = root.join("bench-mlp.yaml");
    std::fs::write(&config, tiny("bench-mlp", "residual", 0)).unwrap();
    let opts = plexus::bench::BenchOptions { steps: 1, warmup: 0, ..Default::default() };
    let topologies = ["residual".to_string(), "hacn".to_string()];
    figures
        .extend(plexus::bench::depth::sweep(&config, &[], &opts, &[2, 4], &topologies, &root.join("bench")).unwrap());
    figures
}

/// Every figure of the tiny runs, from the producers `plexus plot`, `plexus report`, `plexus rl`
/// and `plexus bench --depths` call.
fn all_figures(root: &Path) -> Vec<Figure> {
    let study = root.join("study");
    let dirs = runs(&study);
    let mut figures = plot::figures::all(&dirs, None, None).unwrap();
    let spec_file = study.join("spec.yaml");
    std::fs::write(&spec_file, SPEC).unwrap();
    let spec = plexus::study::spec::SweepSpec::from_file(&spec_file).unwrap();
    let curves = ["loss", "eval.accuracy", "layerwise.accuracy", "noise.accuracy"].map(String::from).to_vec();
    let opts = plexus::study::ReportOptions { by: vec!["topology.kind".into()], curves, ..Default::default() };
    let r = plexus::study::build(std::slice::from_ref(&study), &opts, Some(&spec)).unwrap();
    figures.extend(plot::study::band_curves(&r).unwrap());
    figures.extend(plot::study::claim_figures(&r).unwrap());
    figures.extend(other_figures(root));
    figures
}

type Rect = (f64, f64, f64, f64);

/// The value of attribute `name` in the tag `tag`.
fn attr(tag: &str, name: &str) -> Option<String> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(tag[at..].split('"').next()?.to_string())
}

fn num(tag: &str, name: &str) -> f64 {
    attr(tag, name).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// What a figure draws, read from its SVG: the canvas, each text's content and ink box (usvg sets
/// the text with the embedded font), the legend's box (a white rectangle smaller than the canvas),
/// the polylines (data; a heatmap's hatching too) and the points (circles) outside the legend, the legend's swatches (thin
/// filled rectangles inside it) and the texts beside them.
struct Svg {
    size: (f64, f64),
    texts: Vec<(String, Rect)>,
    legend: Option<Rect>,
    lines: Vec<Vec<(f64, f64)>>,
    points: Vec<(f64, f64, f64)>,
    /// Legend entries: the text and the colour of its swatch.
    entries: Vec<(String, String)>,
}

fn read(text: &str) -> Svg {
    let mut db = usvg::fontdb::Database::new();
    db.load_font_data(dejavu::sans::regular().to_vec());
    db.load_font_data(dejavu::sans::bold().to_vec());
    db.set_sans_serif_family("DejaVu Sans");
    let options =
        usvg::Options { font_family: "DejaVu Sans".into(), fontdb: std::sync::Arc::new(db), ..Default::default() };
    let tree = usvg::Tree::from_str(text, &options).unwrap();
    let size = (f64::from(tree.size().width()), f64::from(tree.size().height()));
    let mut texts = Vec::new();
    fn walk(g: &usvg::Group, out: &mut Vec<(String, Rect)>) {
        for n in g.children() {
            match n {
                usvg::Node::Group(g) => walk(g, out),
                usvg::Node::Text(t) => {
                    let b = t.abs_bounding_box();
                    let s: String = t.chunks().iter().map(|c| c.text().to_string()).collect();
                    if !s.trim().is_empty() {
                        out.push((
                            s,
                            (f64::from(b.left()), f64::from(b.top()), f64::from(b.right()), f64::from(b.bottom())),
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    walk(tree.root(), &mut texts);
    let tags: Vec<&str> = text.split('<').skip(1).map(|t| t.split('>').next().unwrap_or("")).collect();
    let rect = |t: &str| {
        let (x, y) = (num(t, "x"), num(t, "y"));
        (x, y, x + num(t, "width"), y + num(t, "height"))
    };
    // The legend's frame: a white box with a light grey (#C8C8C8) border (a white heatmap cell,
    // an absent edge, has none).
    let legend = tags
        .iter()
        .filter(|t| t.starts_with("rect") && attr(t, "stroke").as_deref() == Some("#C8C8C8"))
        .map(|t| rect(t))
        .find(|r| r.2 - r.0 < size.0 - 1.0);
    let inside = |x: f64, y: f64| legend.is_some_and(|l| x >= l.0 && x <= l.2 && y >= l.1 && y <= l.3);
    let mut lines = Vec::new();
    let mut points = Vec::new();
    let mut swatches = Vec::new();
    for t in &tags {
        if t.starts_with("polyline") {
            let pts = attr(t, "points").unwrap_or_default();
            lines.push(
                pts.split_whitespace()
                    .filter_map(|p| p.split_once(',').map(|(x, y)| (x.parse().unwrap(), y.parse().unwrap())))
                    .collect(),
            );
        } else if t.starts_with("circle") {
            let (x, y) = (num(t, "cx"), num(t, "cy"));
            if !inside(x, y) {
                points.push((x, y, num(t, "r")));
            }
        } else if t.starts_with("rect") {
            let r = rect(t);
            if inside(r.0, r.1) && r.3 - r.1 < 8.0 && r.2 - r.0 > 10.0 {
                swatches.push((r, attr(t, "fill").unwrap_or_default()));
            }
        }
    }
    let entries = swatches
        .iter()
        .filter_map(|(r, fill)| {
            let cy = (r.1 + r.3) / 2.0;
            texts
                .iter()
                .find(|(_, b)| b.0 > r.2 && b.0 - r.2 < 30.0 && b.1 <= cy + 2.0 && b.3 >= cy - 2.0)
                .map(|(s, _)| (s.clone(), fill.to_uppercase()))
        })
        .collect();
    Svg { size, texts, legend, lines, points, entries }
}

fn overlap(a: &Rect, b: &Rect) -> bool {
    a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3
}

/// Whether the segment `a`–`b` meets the rectangle `r` (any point of it inside `r`, sampled
/// finely enough for segments of a figure).
fn crosses(a: (f64, f64), b: (f64, f64), r: &Rect) -> bool {
    let n = (((b.0 - a.0).abs() + (b.1 - a.1).abs()) / 0.5).ceil().max(1.0) as usize;
    (0..=n).any(|i| {
        let t = i as f64 / n as f64;
        let (x, y) = (a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1));
        x > r.0 && x < r.2 && y > r.1 && y < r.3
    })
}

/// What is wrong with the layout of one figure.
fn problems(f: &Svg) -> Vec<String> {
    let mut p = Vec::new();
    let sci = |s: &str| {
        let s = s.trim().trim_start_matches('-');
        s.split_once('e').is_some_and(|(m, e)| {
            !m.is_empty()
                && m.chars().all(|c| c.is_ascii_digit() || c == '.')
                && !e.is_empty()
                && e.trim_start_matches(['-', '+']).chars().all(|c| c.is_ascii_digit())
        })
    };
    for (i, (s, b)) in f.texts.iter().enumerate() {
        if sci(s) {
            p.push(format!("tick label `{s}` in NeM form"));
        }
        if b.0 < -0.5 || b.1 < -0.5 || b.2 > f.size.0 + 0.5 || b.3 > f.size.1 + 0.5 {
            p.push(format!("`{s}` leaves the canvas: {b:?} on {:?}", f.size));
        }
        for (t, c) in &f.texts[i + 1..] {
            if overlap(b, c) {
                p.push(format!("`{s}` {b:?} overlaps `{t}` {c:?}"));
            }
        }
    }
    if let Some(l) = &f.legend {
        for line in &f.lines {
            if line.windows(2).any(|w| crosses(w[0], w[1], l)) || (line.len() == 1 && crosses(line[0], line[0], l)) {
                p.push(format!("the legend {l:?} covers a line"));
                break;
            }
        }
        for (x, y, r) in &f.points {
            if overlap(&(x - r, y - r, x + r, y + r), l) {
                p.push(format!("the legend {l:?} covers the point ({x}, {y})"));
                break;
            }
        }
    }
    p
}

/// Everything wrong with a figure rendered: in its SVG and in what the renderer drew.
fn all_problems(f: &Figure, r: &plot::Rendered) -> Vec<String> {
    let mut p = problems(&read(&r.svg));
    p.extend(plot::lint::problems(f, &r.drawn));
    p
}

#[test]
fn every_figure_kind_is_laid_out_as_a_papers_figure_at_both_widths() {
    let tmp = tempfile::tempdir().unwrap();
    let figures = all_figures(tmp.path());
    // Every kind in the list is drawn by its producer from these runs.
    for kind in Kind::ALL {
        assert!(
            figures.iter().any(|f| f.kind == kind),
            "no {} figure ({}) from the tiny runs",
            kind.name(),
            kind.command()
        );
    }
    // The sparse graph's C draws the edges it does not have as absent: window 2 over 4 units and
    // the readout leaves out (0, 3), (0, 4), (1, 4), (0, 5), (1, 5), (2, 5).
    let graph = figures.iter().find(|f| f.file == "connectivity_graph-seed=0").expect("the graph run's C");
    let plot::Chart::Heatmaps { panels, .. } = &graph.chart else { panic!("C is a heatmap") };
    assert_eq!(panels[0].absent, [(0, 2), (0, 3), (1, 3), (0, 4), (1, 4), (2, 4)]);
    let mut colours: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut gallery: BTreeMap<(Kind, &str), PathBuf> = BTreeMap::new();
    for width in ["single", "double"] {
        let style = plot::Style::parse("png,svg", width).unwrap();
        let out = tmp.path().join(width);
        for (k, f) in figures.iter().enumerate() {
            let dir = out.join(k.to_string());
            let r = plot::render(f, &style, &dir).unwrap_or_else(|e| panic!("{}: {e}", f.file));
            failures.extend(all_problems(f, &r).into_iter().map(|p| format!("{width}/{}: {p}", f.file)));
            for (label, fill) in read(&r.svg).entries {
                // A topology's legend entries start with its name: "H-ACN", "H-ACN (mean ± sd, 3 seeds)".
                let topology = label.split([' ', ',']).next().unwrap_or_default().to_string();
                colours.entry(topology).or_default().entry(fill).or_default().push(format!("{width}/{}", f.file));
            }
            // The gallery shows the first figure of each kind: the per-run ones of the first
            // residual seed, H-ACN's where a kind draws only runs with residual weights.
            gallery.entry((f.kind, width)).or_insert_with(|| dir.join(&f.file).with_extension("png"));
        }
    }
    assert!(failures.is_empty(), "{} layout problems:\n{}", failures.len(), failures.join("\n"));
    // The topologies this test trains are each drawn in exactly one colour, their registry's.
    for (topology, kind) in [("Residual", "residual"), ("ACN", "acn"), ("H-ACN", "hacn"), ("ANCRe", "ancre")] {
        let seen = colours.get(topology).unwrap_or_else(|| panic!("no legend names {topology}: {colours:?}"));
        let c = plexus::plot::topology_color(kind, 0);
        let want = format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
        assert!(seen.contains_key(&want), "{topology} is not drawn in its colour {want}: {seen:?}");
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("PLEXUS_REGENERATE_DOCS").is_some() {
        for width in ["single", "double"] {
            let dir = root.join("docs/figures/gallery").join(width);
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            for kind in Kind::ALL {
                std::fs::copy(&gallery[&(kind, width)], dir.join(format!("{}.png", kind.name()))).unwrap();
            }
        }
        std::fs::write(root.join("docs/gallery.md"), gallery_md()).unwrap();
    }
    let md = std::fs::read_to_string(root.join("docs/gallery.md")).unwrap_or_default();
    assert_eq!(md, gallery_md(), "docs/gallery.md is not the list of figure kinds (PLEXUS_REGENERATE_DOCS=1 cargo test --release --test it figures rewrites it)");
}

/// docs/gallery.md: every kind of [`Kind::ALL`] at both widths.
fn gallery_md() -> String {
    let mut md = String::from(
        "# Figure gallery\n\nEvery kind of figure plexus draws (`plexus::plot::Kind::ALL`), at a column's width \
         (`--width single`, 3.25 in) and at the text width (`--width double`, 6.75 in, the default), drawn from \
         tiny runs that `tests/it/figures.rs` trains in seconds (4-unit MLPs on generated images, a tiny GPT and a \
         tiny MUDD GPT, a tiny DiT, three tiny RL runs and a two-depth `bench --depths`): the numbers are a smoke test's, the \
         layout is the real one. The same test checks each at both widths: no text overlaps another or leaves the \
         canvas, the legend covers no line or point, every numeric axis has 3 or more labelled ticks around its \
         data, titles are set whole, labels are words (no `eval.loss`, `kind=residual` or `Δ_t`), colours are told \
         apart and dark enough on white, no curve hides under another, and each topology has one colour. \
         Regenerate with\n\n```sh\nPLEXUS_REGENERATE_DOCS=1 cargo test --release --test it figures\n```\n",
    );
    for kind in Kind::ALL {
        let k = kind.name();
        md += &format!(
            "\n## `{k}` ({})\n\n<img src=\"figures/gallery/single/{k}.png\" width=\"40%\"> \
             <img src=\"figures/gallery/double/{k}.png\" width=\"58%\">\n",
            kind.command()
        );
    }
    md
}

/// The layout check follows rotated text (plotters writes a y-axis title as a `<text>` with
/// `transform="rotate(270, x, y)"`; usvg's boxes are in canvas coordinates, after the rotation): a
/// colour bar's title that runs off the top or the bottom of the canvas is found, and the same title
/// placed where it fits passes.
#[test]
fn a_rotated_title_that_leaves_the_canvas_is_found() {
    let svg = |y: u32| {
        format!(
            "<svg width=\"200\" height=\"300\" viewBox=\"0 0 200 300\" xmlns=\"http://www.w3.org/2000/svg\">\
             <text x=\"20\" y=\"{y}\" dy=\"0.76em\" text-anchor=\"middle\" font-family=\"sans-serif\" font-size=\"14\" \
             fill=\"#000000\" transform=\"rotate(270, 20, {y})\">weight of the connection</text></svg>"
        )
    };
    for (y, leaves) in [(40, true), (260, true), (150, false)] {
        let f = read(&svg(y));
        let (_, b) = &f.texts[0];
        assert!(b.3 - b.1 > 3.0 * (b.2 - b.0), "y = {y}: the box {b:?} is not the rotated text's (taller than wide)");
        let found = problems(&f).iter().any(|p| p.contains("leaves the canvas"));
        assert_eq!(found, leaves, "y = {y}: {b:?} on {:?}: {:?}", f.size, problems(&f));
    }
}

/// A clean line chart of three topologies over 30 steps, rendered at the text width: the figure
/// each planted-defect test below spoils in one way.
fn clean(series: Vec<plot::Series>, title: &str) -> (Figure, plot::Rendered, tempfile::TempDir) {
    let chart = plot::LineChart {
        title: title.into(),
        x_label: "training step".into(),
        y_label: "training loss (nats)".into(),
        log_y: false,
        series,
    };
    let f = Figure { file: "clean".into(), kind: Kind::Loss, chart: plot::Chart::Lines(chart) };
    let tmp = tempfile::tempdir().unwrap();
    let r = plot::render(&f, &plot::Style::parse("svg", "double").unwrap(), tmp.path()).unwrap();
    (f, r, tmp)
}

fn curve(label: &str, kind: &str, k: f64) -> plot::Series {
    plot::Series {
        label: label.into(),
        points: (0..30).map(|i| (f64::from(i), 2.0 * (-k * f64::from(i) / 10.0).exp() + 0.1)).collect(),
        color: Some(plot::topology_color(kind, 0)),
        band: None,
        dash: plot::Dash::Solid,
    }
}

fn three() -> Vec<plot::Series> {
    vec![curve("Residual", "residual", 1.0), curve("H-ACN", "hacn", 2.0), curve("ANCRe", "ancre", 3.0)]
}

/// The clean figure passes every check; `plant` spoils it and the checks find `want`.
fn finds(plant: impl FnOnce(&mut Figure, &mut plot::Rendered), want: &str) {
    let (mut f, mut r, _tmp) = clean(three(), "Training loss");
    assert_eq!(all_problems(&f, &r), Vec::<String>::new(), "the clean figure");
    plant(&mut f, &mut r);
    let p = all_problems(&f, &r);
    assert!(p.iter().any(|p| p.contains(want)), "no `{want}` among {p:?}");
}

#[test]
fn overlapping_text_is_found() {
    finds(
        |_, r| {
            // A second copy of the title, 2 units lower.
            let at = r.svg.find("<text").unwrap();
            let end = at + r.svg[at..].find("</text>").unwrap() + 7;
            let copy = r.svg[at..end].replacen(" y=\"", " y=\"2", 1);
            r.svg.insert_str(end, &copy);
        },
        "overlaps",
    );
}

#[test]
fn a_legend_over_a_line_is_found() {
    finds(
        |_, r| {
            let l = read(&r.svg).legend.expect("a legend");
            let line = format!(
                "<polyline fill=\"none\" stroke=\"#000000\" points=\"{},{} {},{}\"/>",
                l.0 - 5.0,
                l.1 - 5.0,
                l.2 + 5.0,
                l.3 + 5.0
            );
            r.svg = r.svg.replace("</svg>", &format!("{line}</svg>"));
        },
        "covers a line",
    );
}

#[test]
fn an_axis_of_two_ticks_is_found() {
    finds(|_, r| r.drawn.axes[1].axis = plot::linear_axis(8.0, 53.0, 0.0, 3), "2 labelled ticks");
}

#[test]
fn data_beyond_the_ticks_are_found() {
    finds(
        |_, r| {
            // 0.5, 1, 2 on a log axis of losses down to 0.15 (ancre-fig2b before issue 69).
            r.drawn.axes[1].axis = plot::log_axis(0.5, 2.0, 6);
            r.drawn.axes[1].data = (0.15f64.log10(), 2f64.log10());
        },
        "lie beyond its ticks",
    );
}

#[test]
fn a_cut_title_is_found() {
    // A title too long for a column is set on two lines, whole.
    let long = "Held-out accuracy under input noise: geometric mean ×÷ geometric sd over 10 seeds, residual and H-ACN";
    let chart = plot::LineChart {
        title: long.into(),
        x_label: "σ".into(),
        y_label: "accuracy (%)".into(),
        log_y: false,
        series: three(),
    };
    let f = Figure { file: "long".into(), kind: Kind::Noise, chart: plot::Chart::Lines(chart) };
    let tmp = tempfile::tempdir().unwrap();
    let r = plot::render(&f, &plot::Style::parse("svg", "single").unwrap(), tmp.path()).unwrap();
    assert_eq!(all_problems(&f, &r), Vec::<String>::new());
    assert_eq!(r.drawn.title.1, long);
    finds(|_, r| r.drawn.title.1 = "Training l…".into(), "is set as");
}

#[test]
fn raw_keys_in_labels_are_found() {
    for (label, why) in [
        ("kind=residual (n = 10)", "key=value"),
        ("eval.loss", "dotted key"),
        ("final_loss", "underscore"),
        ("Δ_t", "underscore"),
    ] {
        finds(
            |f, _| {
                if let plot::Chart::Lines(c) = &mut f.chart {
                    c.series[0].label = label.into()
                }
            },
            why,
        );
    }
    // Words with numbers, spaced equations and decimals are not keys.
    for fine in ["H-ACN (μ = 0.25)", "H-ACN (μ=0.25, DLN)", "Γ = ‖a‖₂/√L", "step 40 (100%)", "lr 0.001", "a=1"]
    {
        assert_eq!(plot::lint::raw_key(fine), None, "{fine}");
    }
}

#[test]
fn a_character_the_font_lacks_is_found() {
    finds(
        |f, _| {
            if let plot::Chart::Lines(c) = &mut f.chart {
                c.title = "连接 loss".into()
            }
        },
        "no glyph",
    );
    assert_eq!(
        plot::lint::missing_glyphs("Δₜ = ‖a(T) − a(t)‖₂, log(pᵢⱼ / maxᵢ pᵢⱼ), σ, ×÷, ±, μ").collect::<String>(),
        ""
    );
}

#[test]
fn colours_too_close_or_too_pale_are_found() {
    finds(|_, r| r.drawn.lines[1].color = r.drawn.lines[0].color, "ΔE");
    finds(|_, r| r.drawn.lines[2].color = plotters::style::RGBColor(255, 230, 150), "on white");
    // The same colour in another line pattern is told apart by the pattern.
    let (f, mut r, _tmp) = clean(three(), "Training loss");
    r.drawn.lines[1].color = r.drawn.lines[0].color;
    r.drawn.lines[1].dash = plot::Dash::Dashed;
    assert_eq!(plot::lint::colour_problems(&f, &r.drawn), Vec::<String>::new());
}

#[test]
fn a_curve_hidden_under_another_is_marked_and_an_unmarked_one_is_found() {
    // Residual's curve exactly under ANCRe's (the eval loss of dit-fmnist): drawn first, it gets
    // markers over every line, and passes.
    let mut series = three();
    series[2].points = series[0].points.clone();
    series[0].points.truncate(20);
    series[2].points.truncate(20);
    let (f, mut r, _tmp) = clean(series, "Training loss");
    assert!(r.drawn.lines[0].markers, "the hidden curve is marked");
    assert_eq!(all_problems(&f, &r), Vec::<String>::new());
    r.drawn.lines[0].markers = false;
    let p = plot::lint::hidden_lines(&r.drawn);
    assert!(p.iter().any(|p| p.contains("`Residual` is hidden under `ANCRe`")), "{p:?}");
}

/// The figures of every committed study (docs/claims/*.csv with its spec, as `plexus report TABLE
/// --spec SPEC` draws them, and so scripts/docs-figures.sh for docs/figures/) pass the same
/// checks at both widths: the layout test on real figures, not only on the tiny runs'.
#[test]
fn every_committed_studys_figures_pass_the_layout_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let mut drawn = 0;
    let mut tables: Vec<PathBuf> = std::fs::read_dir(root.join("docs/claims"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "csv") && !p.to_string_lossy().ends_with(".curves.csv"))
        .collect();
    tables.sort();
    for table in &tables {
        let name = table.file_stem().unwrap().to_string_lossy().to_string();
        let spec_file = root.join("configs/studies").join(format!("{name}.yaml"));
        let spec = plexus::study::spec::SweepSpec::from_file(&spec_file).unwrap_or_else(|e| panic!("{name}: {e}"));
        let r = plexus::study::build(std::slice::from_ref(table), &Default::default(), Some(&spec))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut figures = plot::study::band_curves(&r).unwrap();
        figures.extend(plot::study::claim_figures(&r).unwrap());
        for width in ["single", "double"] {
            let style = plot::Style::parse("svg", width).unwrap();
            for f in &figures {
                let rendered = plot::render(f, &style, &tmp.path().join(&name).join(width)).unwrap();
                failures
                    .extend(all_problems(f, &rendered).into_iter().map(|p| format!("{name} {width}/{}: {p}", f.file)));
                drawn += 1;
            }
        }
    }
    assert!(drawn > 50, "only {drawn} figures drawn from {} tables", tables.len());
    assert!(failures.is_empty(), "{} layout problems:\n{}", failures.len(), failures.join("\n"));
}
