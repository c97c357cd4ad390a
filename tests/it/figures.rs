//! Every figure kind of `plexus plot` and `plexus report`, drawn at a column's width and at the
//! text width from tiny runs this test trains (a few seconds), is laid out as a paper's figure:
//! no text box overlaps another or leaves the canvas (boxes from the font's outlines, as usvg sets
//! the SVG's text), no tick label is written `1e1`, the legend's box meets no drawn line or point,
//! and every topology has one colour in every figure. `PLEXUS_REGENERATE_DOCS=1` also copies the
//! PNGs into `docs/figures/gallery/` and rewrites `docs/gallery.md`; without it the gallery is
//! checked to show every figure kind at both widths.

use plexus::analysis::{self, AnalyzeOptions};
use plexus::experiment::Experiment;
use plexus::run_dir::RunDir;
use plexus::train::{self, TrainOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use svg2pdf::usvg;

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
/// with a band), ACN and ANCRe over one.
fn runs(root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for (topology, seeds) in [("residual", 3), ("acn", 1), ("hacn", 3), ("ancre", 1)] {
        for seed in 0..seeds {
            let dir = root.join(format!("{topology}-seed={seed}"));
            let e = Experiment::from_str(&tiny(&format!("tiny-{topology}"), topology, seed), "<test>", &[])
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

/// Draws every figure kind at `width` (SVG and PNG) into `out`; returns the SVGs.
fn draw_all(runs: &[PathBuf], study: &Path, width: &str, out: &Path) -> Vec<PathBuf> {
    use plexus::plot::{self, LineChart, Series};
    let style = plot::Style::parse("png,svg", width).unwrap();
    let mut files = plot::figures::all(runs, &style, out, None, None).unwrap();
    let spec_file = study.join("spec.yaml");
    std::fs::write(&spec_file, SPEC).unwrap();
    let spec = plexus::study::spec::SweepSpec::from_file(&spec_file).unwrap();
    let curves = ["loss", "eval.accuracy", "layerwise.accuracy", "noise.accuracy"].map(String::from).to_vec();
    let opts = plexus::study::ReportOptions { by: vec!["topology.kind".into()], curves, ..Default::default() };
    let r = plexus::study::build(&[study.to_path_buf()], &opts, Some(&spec)).unwrap();
    files.extend(plot::study::band_curves(&r, &style, out).unwrap());
    files.extend(plot::study::claim_figures(&r, &style, out).unwrap());
    // The kinds that need runs this test cannot train in seconds (plexus bench's growth with depth,
    // plexus rl's success), drawn by the same functions from numbers of their shape.
    let depth = |k: f64| (1..=5).map(|i| (2f64.powi(i + 1), 3.0 * 2f64.powf(k * f64::from(i)))).collect::<Vec<_>>();
    let color = |t: &str| Some(plot::topology_color(t, 0));
    files.extend(
        plot::loglog_chart(
            &LineChart {
                title: "Step time versus depth".into(),
                x_label: "depth L".into(),
                y_label: "ms per training step".into(),
                log_y: true,
                series: vec![
                    Series {
                        label: "Residual (k = 1.00)".into(),
                        points: depth(1.0),
                        color: color("residual"),
                        band: None,
                        dash: plot::Dash::Solid,
                    },
                    Series {
                        label: "H-ACN (k = 1.02)".into(),
                        points: depth(1.02),
                        color: color("hacn"),
                        band: None,
                        dash: plot::Dash::Solid,
                    },
                    Series {
                        label: "ANCRe (k = 2.00)".into(),
                        points: depth(2.0),
                        color: color("ancre"),
                        band: None,
                        dash: plot::Dash::Solid,
                    },
                ],
            },
            &style,
            &out.join("depth_time"),
        )
        .unwrap(),
    );
    let success =
        |rate: f64| (0..=20).map(|i| (f64::from(i) * 5000.0, rate * (1.0 - (-f64::from(i) / 6.0).exp()))).collect();
    files.extend(
        plot::line_chart(
            &LineChart {
                title: "Contrastive RL, point maze: evaluation success".into(),
                x_label: "environment steps".into(),
                y_label: "success rate".into(),
                log_y: false,
                series: vec![
                    Series {
                        label: "Residual, depth 16".into(),
                        points: success(0.6),
                        color: color("residual"),
                        band: None,
                        dash: plot::Dash::Solid,
                    },
                    Series {
                        label: "H-ACN, depth 16".into(),
                        points: success(0.8),
                        color: color("hacn"),
                        band: None,
                        dash: plot::Dash::Solid,
                    },
                    Series {
                        label: "H-ACN, depth 4".into(),
                        points: success(0.7),
                        color: Some(plot::topology_color("hacn", 1)),
                        band: None,
                        dash: plot::Dash::of_variant(1),
                    },
                    Series {
                        label: "random policy".into(),
                        points: vec![(0.0, 0.1), (100_000.0, 0.1)],
                        color: Some(plotters::style::RGBColor(150, 150, 150)),
                        band: None,
                        dash: plot::Dash::Solid,
                    },
                ],
            },
            &style,
            &out.join("success"),
        )
        .unwrap(),
    );
    files.into_iter().filter(|f| f.extension().is_some_and(|e| e == "svg")).collect()
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
/// the polylines (data) and the points (circles) outside the legend, the legend's swatches (thin
/// filled rectangles inside it) and the texts beside them.
struct Figure {
    size: (f64, f64),
    texts: Vec<(String, Rect)>,
    legend: Option<Rect>,
    lines: Vec<Vec<(f64, f64)>>,
    points: Vec<(f64, f64, f64)>,
    /// Legend entries: the text and the colour of its swatch.
    entries: Vec<(String, String)>,
}

fn read(svg: &Path) -> Figure {
    let text = std::fs::read_to_string(svg).unwrap();
    let mut db = usvg::fontdb::Database::new();
    db.load_font_data(dejavu::sans::regular().to_vec());
    db.load_font_data(dejavu::sans::bold().to_vec());
    db.set_sans_serif_family("DejaVu Sans");
    let options =
        usvg::Options { font_family: "DejaVu Sans".into(), fontdb: std::sync::Arc::new(db), ..Default::default() };
    let tree = usvg::Tree::from_str(&text, &options).unwrap();
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
    let legend = tags
        .iter()
        .filter(|t| t.starts_with("rect") && attr(t, "fill").as_deref() == Some("#FFFFFF"))
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
    Figure { size, texts, legend, lines, points, entries }
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
fn problems(f: &Figure) -> Vec<String> {
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

/// The figure kinds: a file's stem without the run it is of.
fn kind(stem: &str) -> String {
    for prefix in ["connectivity_grid_", "connectivity_", "ancre_p_"] {
        if stem.starts_with(prefix) {
            return prefix.trim_end_matches('_').to_string();
        }
    }
    stem.to_string()
}

#[test]
fn every_figure_kind_is_laid_out_as_a_papers_figure_at_both_widths() {
    let tmp = tempfile::tempdir().unwrap();
    let study = tmp.path().join("study");
    let dirs = runs(&study);
    let mut colours: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut kinds: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut failures = Vec::new();
    for width in ["single", "double"] {
        let out = tmp.path().join(width);
        let svgs = draw_all(&dirs, &study, width, &out);
        for svg in &svgs {
            let name = svg.file_stem().unwrap().to_string_lossy().to_string();
            kinds.entry(width.into()).or_default().push(name.clone());
            let f = read(svg);
            failures.extend(problems(&f).into_iter().map(|p| format!("{width}/{name}: {p}")));
            for (label, fill) in f.entries {
                // A topology's legend entries start with its name: "H-ACN", "H-ACN (mean ± sd, 3 seeds)".
                let topology = label.split([' ', ',']).next().unwrap_or_default().to_string();
                colours.entry(topology).or_default().entry(fill).or_default().push(format!("{width}/{name}"));
            }
        }
        if std::env::var_os("PLEXUS_REGENERATE_DOCS").is_some() {
            let gallery = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/figures/gallery").join(width);
            let _ = std::fs::remove_dir_all(&gallery);
            std::fs::create_dir_all(&gallery).unwrap();
            for svg in &svgs {
                let name = kind(&svg.file_stem().unwrap().to_string_lossy());
                // One figure of each kind: the per-run ones of the first H-ACN seed (ANCRe's own
                // view of its only run).
                let stem = svg.file_stem().unwrap().to_string_lossy().to_string();
                if stem != name && !stem.ends_with("hacn-seed=0") && name != "ancre_p" {
                    continue;
                }
                std::fs::copy(svg.with_extension("png"), gallery.join(format!("{name}.png"))).unwrap();
            }
        }
    }
    assert!(failures.is_empty(), "{} layout problems:\n{}", failures.len(), failures.join("\n"));
    // The topologies this test trains are each drawn in exactly one colour, their registry's.
    for (topology, kind) in [("Residual", "residual"), ("ACN", "acn"), ("H-ACN", "hacn"), ("ANCRe", "ancre")] {
        let seen = colours.get(topology).unwrap_or_else(|| panic!("no legend names {topology}: {colours:?}"));
        let c = plexus::plot::topology_color(kind, 0);
        let want = format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
        assert_eq!(seen.keys().collect::<Vec<_>>(), [&want], "{topology} drawn in several colours: {seen:?}");
    }
    // Every kind at both widths, and the per-run figures of the three H-ACN seeds in three files.
    assert_eq!(kinds["single"], kinds["double"]);
    for stem in ["connectivity_hacn-seed=0", "connectivity_hacn-seed=1", "connectivity_hacn-seed=2"] {
        assert!(kinds["double"].iter().any(|k| k == stem), "no {stem} among {:?}", kinds["double"]);
    }
    let mut all: Vec<String> = kinds["double"].iter().map(|s| kind(s)).collect();
    all.sort();
    all.dedup();
    for must in [
        "loss",
        "eval_loss",
        "eval_accuracy",
        "gamma",
        "delta",
        "layerwise",
        "pruning",
        "noise",
        "connectivity",
        "ancre_p",
    ] {
        assert!(all.iter().any(|k| k == must), "no {must} figure among {all:?}");
    }
    let gallery_md = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/gallery.md");
    if std::env::var_os("PLEXUS_REGENERATE_DOCS").is_some() {
        let mut md = String::from(
            "# Figure gallery\n\nEvery figure kind of `plexus plot` and `plexus report`, at a column's width (`--width \
             single`, 3.25 in) and at the text width (`--width double`, 6.75 in, the default), drawn from tiny runs \
             (a 4-unit MLP on generated images, 40 steps) that `tests/it/figures.rs` trains; the per-run figures are \
             those of one H-ACN seed. The same test checks each at both widths: no text overlaps another or leaves \
             the canvas, no tick label reads `1e1`, the legend covers no line or point, and each topology has one \
             colour in every figure. Regenerate with\n\n```sh\nPLEXUS_REGENERATE_DOCS=1 cargo test --release --test \
             figures\n```\n\nThe bench's depth figure and the RL success figure are drawn from numbers of their \
             shape, not from runs.\n",
        );
        for k in &all {
            md += &format!(
                "\n## `{k}`\n\n<img src=\"figures/gallery/single/{k}.png\" width=\"40%\"> \
                 <img src=\"figures/gallery/double/{k}.png\" width=\"58%\">\n"
            );
        }
        std::fs::write(&gallery_md, md).unwrap();
    }
    let md = std::fs::read_to_string(&gallery_md).unwrap_or_default();
    for k in &all {
        for width in ["single", "double"] {
            assert!(
                md.contains(&format!("figures/gallery/{width}/{k}.png")),
                "docs/gallery.md does not show {k} at {width} width (PLEXUS_REGENERATE_DOCS=1 cargo test --release \
                 --test figures rewrites it)"
            );
        }
    }
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
    let tmp = tempfile::tempdir().unwrap();
    for (y, leaves) in [(40, true), (260, true), (150, false)] {
        let path = tmp.path().join(format!("rotated-{y}.svg"));
        std::fs::write(&path, svg(y)).unwrap();
        let f = read(&path);
        let (_, b) = &f.texts[0];
        assert!(b.3 - b.1 > 3.0 * (b.2 - b.0), "y = {y}: the box {b:?} is not the rotated text's (taller than wide)");
        let found = problems(&f).iter().any(|p| p.contains("leaves the canvas"));
        assert_eq!(found, leaves, "y = {y}: {b:?} on {:?}: {:?}", f.size, problems(&f));
    }
}
