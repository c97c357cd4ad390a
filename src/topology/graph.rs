//! `graph`: a topology given by its direct layer connectivity C (docs/topologies.md, `graph`).
//! Every unit j (1..=L) and the readout (node L+1) read a weighted sum of earlier nodes' outputs,
//! `input_j = Σ_{i ∈ S_j} c_ij · h_i` (`h_0 = x0`, `h_i` unit i's output), over the sources `S_j`
//! a pattern or an edge list gives. The weights are one scalar per edge, fixed or learned, used as
//! they are or softmax-normalised over each node's incoming edges (ANCRe's ingoing form). C *is*
//! that set of weights: `C[i][j] = c_ij` on the edges, 0 elsewhere.
//!
//! ```yaml
//! topology: { kind: graph, pattern: {window: 2}, readout: all, weights: learnable, init: uniform }
//! ```
//!
//! Parameters (learnable weights): `topology.weights.{j-1}` `[|S_j|]` (`normalize: none`) or
//! `topology.logits.{j-1}` `[|S_j|]` (`normalize: softmax`), j = 1..=L+1, sources ascending.

use super::{common, Granularity, Norm, StackInfo, Topology, TopologyEntry, TopologySpec, Unit};
use crate::config::{parse_options, OptionError};
use serde::Deserialize;
use serde_yaml::Value;
use tch::{nn, Kind, Tensor};

pub const ENTRY: TopologyEntry = TopologyEntry {
    name: "graph",
    display: "Graph",
    about: "any connectivity matrix C as YAML: a pattern or edges, fixed or learned weights (docs/graph.md)",
    parse,
    color: (184, 134, 11),
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Weights {
    Fixed,
    Learnable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Normalize {
    None,
    Softmax,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    /// `all` | `chain` | `{window: k}` | `{dilation: d}` | `{blocks: b}` (parsed by hand for
    /// errors that name the allowed shapes).
    pattern: Option<Value>,
    /// `"i:j"` strings, `0 ≤ i < j ≤ L+1`; instead of `pattern`.
    edges: Option<Vec<String>>,
    /// `pattern` | `last` | `all` | `[i, …]`.
    readout: Option<Value>,
    weights: Weights,
    /// `residual` | `acn` | `uniform` | a number | `{from: RUN_DIR, step: N}` | `{file: C.csv}`.
    init: Option<Value>,
    frozen: bool,
    normalize: Normalize,
    temperature: Option<f64>,
    granularity: Option<Granularity>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            pattern: None,
            edges: None,
            readout: None,
            weights: Weights::Learnable,
            init: None,
            frozen: false,
            normalize: Normalize::None,
            temperature: None,
            granularity: None,
        }
    }
}

/// Which earlier nodes each unit reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    All,
    Chain,
    Window(usize),
    Dilation(usize),
    Blocks(usize),
}

impl Pattern {
    /// The sources of node `j` (1..=L+1), ascending.
    fn sources(self, j: usize) -> Vec<usize> {
        match self {
            Pattern::All => (0..j).collect(),
            Pattern::Chain => vec![j - 1],
            Pattern::Window(k) => (j.saturating_sub(k)..j).collect(),
            Pattern::Dilation(d) => (0..j).filter(|i| (j - 1 - i).is_multiple_of(d)).collect(),
            // Unit j sits in block g = ⌊(j−1)/b⌋ (units g·b+1 … g·b+b): it reads the node just before
            // its block (the previous block's last unit, or x0) and every earlier unit of its block.
            Pattern::Blocks(b) => ((j - 1) / b * b..j).collect(),
        }
    }

    fn label(self) -> String {
        match self {
            Pattern::All => "all".into(),
            Pattern::Chain => "chain".into(),
            Pattern::Window(k) => format!("window {k}"),
            Pattern::Dilation(d) => format!("dilation {d}"),
            Pattern::Blocks(b) => format!("blocks of {b}"),
        }
    }
}

/// A YAML value as the one-line text an error shows.
fn show(v: &Value) -> String {
    serde_yaml::to_string(v).map(|s| s.trim().replace('\n', " ")).unwrap_or_else(|_| format!("{v:?}"))
}

fn parse_pattern(v: Option<&Value>, depth: usize) -> Result<Pattern, OptionError> {
    let allowed = format!(
        "`all`, `chain`, `{{window: k}}` (k in 1..={}), `{{dilation: d}}` or `{{blocks: b}}` (d, b in 1..={depth})",
        depth + 1
    );
    let Some(v) = v else { return Ok(Pattern::All) };
    match v {
        Value::String(s) if s == "all" => Ok(Pattern::All),
        Value::String(s) if s == "chain" => Ok(Pattern::Chain),
        Value::Mapping(m) if m.len() == 1 => {
            let (k, n) = m.iter().next().expect("one entry");
            let name = k.as_str().unwrap_or_default();
            let max = if name == "window" { depth + 1 } else { depth };
            let make: fn(usize) -> Pattern = match name {
                "window" => Pattern::Window,
                "dilation" => Pattern::Dilation,
                "blocks" => Pattern::Blocks,
                _ => return Err(OptionError::new("pattern", show(v), allowed)),
            };
            match n.as_u64().map(|n| n as usize) {
                Some(n) if (1..=max).contains(&n) => Ok(make(n)),
                _ => Err(OptionError::new(format!("pattern.{name}"), show(n), format!("an integer in 1..={max}"))),
            }
        }
        _ => Err(OptionError::new("pattern", show(v), allowed)),
    }
}

/// The readout's sources: `None` = what the pattern (or the edges) give node L+1.
fn parse_readout(v: Option<&Value>, depth: usize) -> Result<Option<Vec<usize>>, OptionError> {
    let allowed = format!("`pattern`, `last`, `all` or a list of distinct nodes in 0..={depth}");
    let Some(v) = v else { return Ok(None) };
    match v {
        Value::String(s) if s == "pattern" => Ok(None),
        Value::String(s) if s == "last" => Ok(Some(vec![depth])),
        Value::String(s) if s == "all" => Ok(Some((0..=depth).collect())),
        Value::Sequence(items) if !items.is_empty() => {
            let mut nodes = Vec::new();
            for (n, item) in items.iter().enumerate() {
                match item.as_u64().map(|i| i as usize) {
                    Some(i) if i <= depth && !nodes.contains(&i) => nodes.push(i),
                    _ => return Err(OptionError::new(format!("readout[{n}]"), show(item), allowed)),
                }
            }
            nodes.sort_unstable();
            Ok(Some(nodes))
        }
        _ => Err(OptionError::new("readout", show(v), allowed)),
    }
}

/// `init: {from, step}`: a run directory's saved C; `init: {file}`: a C written as CSV (what
/// `plexus connectivity` prints, or a run's `connectivity/step_N.csv`), so that a study can commit
/// the exact C it transplants. Either is read once, when a run starts, and pinned in the run
/// ([`crate::pins`]): the run's readers use its copy, and `from` without `step` records the step
/// it read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FromRun {
    from: Option<std::path::PathBuf>,
    step: Option<u64>,
    file: Option<std::path::PathBuf>,
}

/// The config key of the C a graph starts from (its pin in a run's record).
const INIT_KEY: &str = "topology.init";

/// The largest magnitude of an edge weight: the weights are fp32 parameters.
const MAX_WEIGHT: f64 = f32::MAX as f64;

/// A weight `x` as the config gives it: finite and within fp32's range.
fn check_weight(key: &str, x: f64, value: impl std::fmt::Display) -> Result<(), OptionError> {
    match x.is_finite() && x.abs() <= MAX_WEIGHT {
        true => Ok(()),
        false => {
            Err(OptionError::new(key, value, format!("finite weights within fp32's range (|w| ≤ {MAX_WEIGHT:e})")))
        }
    }
}

/// The initial weight of every edge, `init[j-1][n]` for the n-th source of node j, and how the
/// label names where they came from.
fn parse_init(v: Option<&Value>, sources: &[Vec<usize>]) -> Result<(Vec<Vec<f64>>, String), OptionError> {
    let l = sources.len() - 1;
    let each = |f: &dyn Fn(usize, usize, usize) -> f64| -> Vec<Vec<f64>> {
        sources.iter().enumerate().map(|(j0, s)| s.iter().map(|&i| f(i, j0 + 1, s.len())).collect()).collect()
    };
    let allowed = "`residual`, `acn`, `uniform`, a finite number, `{from: RUN_DIR, step: N}` or `{file: C.csv}`";
    let Some(v) = v else { return Ok((each(&|_, _, _| 1.0), "residual".into())) };
    match v {
        Value::String(s) if s == "residual" => Ok((each(&|_, _, _| 1.0), s.clone())),
        // ACN's C (docs/topologies.md, `acn`): 1 on the chain edges j−1 → j and on the readout column.
        Value::String(s) if s == "acn" => {
            Ok((each(&|i, j, _| f64::from(u8::from(j == l + 1 || i + 1 == j))), s.clone()))
        }
        Value::String(s) if s == "uniform" => Ok((each(&|_, _, n| 1.0 / n as f64), s.clone())),
        Value::Number(n) => match n.as_f64() {
            Some(x) => {
                check_weight("init", x, show(v))?;
                Ok((each(&|_, _, _| x), show(v)))
            }
            None => Err(OptionError::new("init", show(v), allowed)),
        },
        Value::Mapping(m) => {
            let o: FromRun = parse_options(m).map_err(|mut e| {
                e.key = if e.key.is_empty() { "init".into() } else { format!("init.{e_key}", e_key = e.key) };
                e
            })?;
            let (key, shown, served) = match (&o.from, &o.file, o.step) {
                (Some(run), None, step) => {
                    let served = crate::pins::input(INIT_KEY, || saved_connectivity(run, step))
                        .map_err(|e| OptionError::new("init.from", run.display(), e))?;
                    ("init.from", run.display().to_string(), served)
                }
                (None, Some(file), None) => {
                    let served = crate::pins::input(INIT_KEY, || {
                        let bytes = crate::input_file::read_bounded(file, crate::pins::MAX_COPY_BYTES, "a C as CSV")
                            .map_err(|e| format!("a readable C as CSV ({e:#})"))?;
                        Ok(crate::pins::Found { path: file.clone(), step: None, bytes: Some(bytes) })
                    })
                    .map_err(|e| OptionError::new("init.file", file.display(), e))?;
                    ("init.file", file.display().to_string(), served)
                }
                _ => return Err(OptionError::new("init", show(v), format!("one of {allowed}"))),
            };
            let bytes = served.bytes.unwrap_or_default();
            let origin = match served.step {
                Some(step) => format!("{shown} (its C at step {step})"),
                None => shown.clone(),
            };
            let c = std::str::from_utf8(&bytes)
                .map_err(|_| anyhow::anyhow!("{origin}: not UTF-8 text"))
                .and_then(|text| crate::run_dir::parse_labelled_matrix(text, &origin))
                .map_err(|e| OptionError::new(key, &shown, format!("a C as CSV ({e:#})")))?;
            if c.nrows() != l + 2 {
                return Err(OptionError::new(
                    key,
                    &shown,
                    format!(
                        "a C of L = {l} units at this granularity ({0}×{0}; this one is {1}×{1})",
                        l + 2,
                        c.nrows()
                    ),
                ));
            }
            check_against_edges(&c, sources).map_err(|e| OptionError::new(key, &shown, e))?;
            let label = match (o.from.is_some(), served.step) {
                (true, Some(step)) => format!("C of {shown} at step {step}"),
                _ => format!("C from {}", file_name(&shown)),
            };
            Ok((each(&|i, j, _| c[[i, j]]), label))
        }
        _ => Err(OptionError::new("init", show(v), allowed)),
    }
}

/// The last part of a path, for labels.
fn file_name(path: &str) -> String {
    std::path::Path::new(path).file_name().map_or(path.to_string(), |f| f.to_string_lossy().into_owned())
}

/// A C given as data against the graph's edges (`sources[j-1]`: what node j reads): every entry
/// within fp32's range, and 0 off the edges (on or below the diagonal — a transposed C — and where
/// the pattern or edge list has no edge). The error names the first entry that is not.
fn check_against_edges(c: &crate::run_dir::Matrix, sources: &[Vec<usize>]) -> Result<(), String> {
    let n = c.nrows();
    for i in 0..n {
        for j in 0..n {
            let v = c[[i, j]];
            if v.abs() > MAX_WEIGHT {
                return Err(format!("C[{i}][{j}] = {v:e}: weights are fp32, |w| ≤ {MAX_WEIGHT:e}"));
            }
            let edge = j >= 1 && sources[j - 1].contains(&i);
            if v != 0.0 && !edge {
                let why = if j <= i {
                    "on or below the diagonal, where C is 0 (rows are sources, columns targets: C[i][j] is node \
                     i's weight in node j's input, i < j; a transposed C?)"
                        .to_string()
                } else {
                    format!("node {i} is not a source of node {j} in this graph's pattern or edges, so C[{i}][{j}] must be 0")
                };
                return Err(format!("C[{i}][{j}] = {v}: {why}"));
            }
        }
    }
    Ok(())
}

/// Finds the C a run saved at `step` (its last saved step if none is given): the file, the step
/// and its bytes.
fn saved_connectivity(dir: &std::path::Path, step: Option<u64>) -> Result<crate::pins::Found, String> {
    let run = crate::run_dir::RunDir::open(dir).map_err(|e| format!("a run directory ({e:#})"))?;
    let steps = run.connectivity_steps().unwrap_or_default();
    let step = match step.or_else(|| steps.last().copied()) {
        Some(s) if steps.contains(&s) => s,
        _ => {
            let saved = steps.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
            return Err(format!("a run with C saved at that step (it saved C at steps: {saved})"));
        }
    };
    let path = run.connectivity_file(step);
    let bytes = crate::input_file::read_bounded(&path, crate::pins::MAX_COPY_BYTES, "a C as CSV")
        .map_err(|e| format!("a readable connectivity/step_{step}.csv ({e:#})"))?;
    Ok(crate::pins::Found { path, step: Some(step), bytes: Some(bytes) })
}

#[derive(Debug)]
struct Spec {
    granularity: Granularity,
    /// `sources[j-1]`: the nodes node j (1..=L+1) reads, ascending.
    sources: Vec<Vec<usize>>,
    /// `init[j-1]`: the initial weights of those edges.
    init: Vec<Vec<f64>>,
    weights: Weights,
    frozen: bool,
    /// The softmax temperature under `normalize: softmax`.
    temperature: Option<f64>,
    label: String,
}

fn parse(opts: &serde_yaml::Mapping, stack: StackInfo) -> Result<Box<dyn TopologySpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let (granularity, depth) = common::granularity(o.granularity, Granularity::Sublayer, stack)?;
    let readout = parse_readout(o.readout.as_ref(), depth)?;
    let (mut sources, what) = match &o.edges {
        Some(edges) => {
            if let Some(p) = &o.pattern {
                return Err(OptionError::new("pattern", show(p), "absent when `edges` is given (one or the other)"));
            }
            let allowed =
                format!("an edge `i:j` with integers 0 ≤ i < j ≤ {} (node {} is the readout)", depth + 1, depth + 1);
            let mut sources = vec![Vec::new(); depth + 1];
            for (n, s) in edges.iter().enumerate() {
                let (i, j) = common::parse_edge(s, depth + 1)
                    .map_err(|_| OptionError::new(format!("edges[{n}]"), s, &allowed))?;
                if sources[j - 1].contains(&i) {
                    return Err(OptionError::new(format!("edges[{n}]"), s, "each edge at most once"));
                }
                if j == depth + 1 && readout.is_some() {
                    return Err(OptionError::new(
                        format!("edges[{n}]"),
                        s,
                        "no edge into the readout when `readout` is given (one or the other)",
                    ));
                }
                sources[j - 1].push(i);
            }
            sources.iter_mut().for_each(|s| s.sort_unstable());
            (sources, format!("{} edges", edges.len()))
        }
        None => {
            let p = parse_pattern(o.pattern.as_ref(), depth)?;
            ((1..=depth + 1).map(|j| p.sources(j)).collect::<Vec<_>>(), p.label())
        }
    };
    if let Some(r) = &readout {
        sources[depth] = r.clone();
    }
    if let Some(j0) = sources.iter().position(Vec::is_empty) {
        let node = if j0 == depth { format!("the readout (node {})", depth + 1) } else { format!("unit {}", j0 + 1) };
        return Err(OptionError::new(
            "edges",
            format!("{:?}", o.edges.unwrap_or_default()),
            format!("edges that give every unit and the readout at least one input ({node} has none)"),
        ));
    }
    let (init, init_label) = parse_init(o.init.as_ref(), &sources)?;
    if o.frozen && o.weights == Weights::Fixed {
        return Err(OptionError::new(
            "frozen",
            true,
            "false unless `weights: learnable` (fixed weights are no parameters)",
        ));
    }
    let temperature = match (o.normalize, o.temperature) {
        (Normalize::None, Some(t)) => {
            return Err(OptionError::new("temperature", t, "absent unless `normalize: softmax`"));
        }
        (Normalize::None, None) => None,
        (Normalize::Softmax, t) => {
            let t = t.unwrap_or(1.0);
            // fp32 holds the logits and divides them by τ: τ must be a normal fp32 number.
            if !(t.is_finite() && (f32::MIN_POSITIVE as f64..=f32::MAX as f64).contains(&t)) {
                return Err(OptionError::new(
                    "temperature",
                    crate::config::show_number(t),
                    format!(
                        "a finite temperature > 0 within fp32's normal range ({:e} to {:e})",
                        f32::MIN_POSITIVE,
                        f32::MAX
                    ),
                ));
            }
            // The logits start at τ·ln w, so that the softmax starts at w / Σ w: w must be > 0.
            if let Some(x) = init.iter().flatten().find(|x| x.is_nan() || **x <= 0.0) {
                return Err(OptionError::new(
                    "init",
                    o.init.as_ref().map_or("residual".into(), show),
                    format!("weights > 0 on every edge under `normalize: softmax` (this one gives {x})"),
                ));
            }
            // … and fp32 logits τ·ln w must give back ln w when divided by τ (a τ so small that
            // they underflow would start the softmax uniform instead).
            for &w in init.iter().flatten() {
                let logit = (t * w.ln()) as f32;
                let back = f64::from(logit / t as f32);
                if !(logit.is_finite() && (back - w.ln()).abs() <= 1e-4 * w.ln().abs().max(1.0)) {
                    return Err(OptionError::new(
                        "temperature",
                        crate::config::show_number(t),
                        format!(
                            "a temperature whose fp32 logits τ·ln w hold the initial weights (weight {} gives the \
                             logit {logit:e}, which gives back {back:e} for ln w = {:e}); use a temperature nearer 1",
                            crate::config::show_number(w),
                            w.ln()
                        ),
                    ));
                }
            }
            Some(t)
        }
    };
    let readout_label = match o.readout.as_ref() {
        None => String::new(),
        Some(v) => format!(", readout {}", show(v)),
    };
    let kind = match (o.weights, o.frozen) {
        (Weights::Fixed, _) => "fixed",
        (_, true) => "frozen",
        _ => "learned",
    };
    let norm = temperature.map_or(String::new(), |t| format!(", softmax τ={}", crate::config::show_number(t)));
    let label = format!("{what}{readout_label}, {init_label} {kind}{norm}");
    Ok(Box::new(Spec { granularity, sources, init, weights: o.weights, frozen: o.frozen, temperature, label }))
}

impl TopologySpec for Spec {
    fn kind(&self) -> &'static str {
        ENTRY.name
    }
    fn label(&self) -> String {
        self.label.clone()
    }
    fn granularity(&self) -> Granularity {
        self.granularity
    }
    fn absent_edges(&self) -> Vec<(usize, usize)> {
        let read = |i: usize, j: usize| self.sources[j - 1].contains(&i);
        (1..=self.sources.len()).flat_map(|j| (0..j).filter(move |&i| !read(i, j)).map(move |i| (i, j))).collect()
    }
    fn build(&self, vs: &nn::Path, _compute: Kind) -> Box<dyn Topology> {
        let group = vs / if self.temperature.is_some() { "logits" } else { "weights" };
        let params = self
            .init
            .iter()
            .enumerate()
            .map(|(j0, w)| {
                // Softmax: logits τ·ln w, so that softmax(logits / τ) = w / Σ w.
                let v: Vec<f32> = w.iter().map(|&x| self.temperature.map_or(x, |t| t * x.ln()) as f32).collect();
                let v = Tensor::from_slice(&v).to_device(vs.device());
                match self.weights {
                    Weights::Learnable => common::param_from(&group, &j0.to_string(), &v, !self.frozen),
                    Weights::Fixed => v,
                }
            })
            .collect();
        Box::new(Graph { sources: self.sources.clone(), params, temperature: self.temperature })
    }
}

struct Graph {
    /// `sources[j-1]`: the nodes node j reads, ascending.
    sources: Vec<Vec<usize>>,
    /// `params[j-1]` `[|S_j|]`: node j's weights, or its logits under softmax.
    params: Vec<Tensor>,
    temperature: Option<f64>,
}

impl Graph {
    /// Node j's edge weights `c_·j` `[|S_j|]` (j = 1..=L+1), in the parameters' dtype.
    fn coefficients(&self, j: usize) -> Tensor {
        let p = &self.params[j - 1];
        match self.temperature {
            Some(t) => (p / t).softmax(0, p.kind()),
            None => p.shallow_clone(),
        }
    }

    /// The input of node j: `Σ_n c_·j[n] · h_{S_j[n]}` over the outputs so far, `[.., D]`.
    fn input(&self, outputs: &common::History, j: usize) -> Tensor {
        outputs.mix(&self.sources[j - 1], &self.coefficients(j).to_kind(outputs.state(0).kind()))
    }
}

impl Topology for Graph {
    fn forward(&self, x0: &Tensor, units: &[&dyn Unit], train: bool) -> Tensor {
        // The outputs h_0 … h_L; each unit's output is read by several later sums, so it is kept
        // in fp32 (`Unit::forward`, not `forward_compute`).
        let mut outputs = common::History::new(units.len() + 1, x0);
        outputs.push(x0.shallow_clone());
        for (k, f) in units.iter().enumerate() {
            let input = self.input(&outputs, k + 1);
            outputs.push(f.forward(&input, Norm::Default, train));
        }
        // After a prefix of n < L units (an early exit) the readout reads what unit n+1 would.
        self.input(&outputs, units.len() + 1)
    }

    fn parameter_view(&self) -> Option<(String, Tensor)> {
        let cols: Vec<Vec<f64>> = tch::no_grad(|| {
            (1..=self.sources.len())
                .map(|j| {
                    let mut col = vec![0.0; j];
                    for (&i, v) in self.sources[j - 1].iter().zip(common::to_vec(&self.coefficients(j))) {
                        col[i] = v;
                    }
                    col
                })
                .collect()
        });
        Some(("C".into(), common::connectivity_from_columns(&cols)))
    }
}
