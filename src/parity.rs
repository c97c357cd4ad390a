//! The parity harness: every topology and backbone against its PyTorch reference (`parity/`).
//!
//! Protocol (`parity/SPEC.md`): `parity/run.py` builds the reference model from a case config,
//! draws weights, input and output cotangent from the case's seed, runs forward and backward and
//! writes one safetensors file. Here we build the same config, load the weights by name (every
//! parameter must exist on both sides with the same shape: this is also the parameter-count
//! check), run forward and backward, and compare the output and every gradient.

pub mod command;

use crate::config::Precision;
use crate::experiment::Experiment;
use crate::model::Model;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// Parity is judged by an error model, the same on every machine (`parity/SPEC.md`, "Tolerance").
/// The reference runs each case at the case's precision; in float64 from the same parameters,
/// input and cotangent (the "high" run, the exact answer for both sides); and 4 more times at the
/// case's precision with the signs of its rounding errors drawn at random (the "spread" runs:
/// `SPREAD_RUNS` and `SignRandomisedRounding` in parity/run.py). For every tensor t (output, loss,
/// each gradient), with e(a, b) = max |a − b| / max(1, max |b|):
///
/// e(plexus, high) ≤ [`GROWTH`] · r(t) + [`FLOOR_ULPS`] · u,
/// r(t) = max(e(reference, high), e(spread run furthest from high, high)),
///
/// u the unit roundoff of the case's format (2⁻²⁴ in fp32, 2⁻⁸ in bf16).
///
/// r(t), not the reference's one error: two correct programs computing the same function in the
/// same format make rounding errors of one distribution, and a tensor's error is one draw from it.
/// Where a gradient is a sum with cancellation (Hyper-Connections' scalar mixing scales: 300 to
/// 500 terms whose sum is up to 10⁴ times smaller than their magnitudes) valid float32 runs differ
/// in error by more than an order of magnitude: the reference's one run may be luckily close, and
/// a correct plexus run more than 8 times further (the bound from the reference's one run failed
/// 29 of 4260 case-draws, 20 random draws × 3 kernel modes × 71 cases, at ratios up to 3.6;
/// bench/parity-draws.txt). The spread runs sample the distribution instead of trusting one draw:
/// in each, every float32 result of an operator keeps the size of its own rounding error —
/// against the same operator in float64 on the same inputs, a long sum's error included — with
/// its sign drawn at random, element by element, as another summation order or another rounding
/// would make it; exact results stay exact. So r(t) is the worst of 5 valid float32
/// computations of t. Reordering the batch or changing the thread count
/// would not do: they move only the last sums of a gradient, while the errors that cancellation
/// amplifies are made upstream, the same in every order (reversing the batch moved the scalar
/// gradients' errors of the GPT Hyper-Connections case by less than 2×).
///
/// [`GROWTH`] on top: plexus also sums in its own orders (its fused kernels, libtorch's vector
/// width, the thread count), and a sequential sum of n terms is up to ~√(n / log₂ n) times further
/// from the exact sum than a pairwise one: ≤ 8 for the sums in the cases (n ≤ 512). The floor
/// covers a tensor that every run computes (nearly) exactly, where another order of the same sums
/// may still round a few times. Each tensor is judged by its own r(t), so a noisy tensor does not
/// loosen the rest of its case: a planted error of 1e-5 (relative to max(1, max |high|)) fails
/// any tensor with r(t) below about 1.2e-6, which is most of them (tests/it/parity.rs plants one in
/// real cases); a wrong formula is off by O(1). On the same 4260 case-draws no tensor came past
/// 0.7 of its bound.
pub const GROWTH: f64 = 8.0;

/// Draw K ≥ 1 of a case (`plexus parity --draws N`: draws 1 to N) seeds the reference with the
/// case's `seed + DRAW_STRIDE · K` (`parity/run.py`, `DRAW_STRIDE`): other weights, input and
/// cotangent for the same model, and never another case's own draw 0 (whose seeds are small).
/// Draw 0 is the case as written.
pub const DRAW_STRIDE: u64 = 1_000_003;

/// The floor of every tensor's bound, in units of the format's unit roundoff (2⁻²⁴ for fp32, 2⁻⁸
/// for bf16).
pub const FLOOR_ULPS: f64 = 4.0;

/// bf16 only, plexus against the bf16 reference directly: ≤ 5e-3 · max(1, max |reference|), about
/// one bf16 ulp (2⁻⁸). Needed besides the bound: a bf16 cast that plexus leaves out brings its result
/// *closer* to float64, which no upper bound on the error can see; the two sides run the same
/// libtorch kernels and agree to ~1e-6, while a missing or extra cast moves results by an ulp.
///
/// On random draws the two sides sometimes round one bf16 value to different neighbours: their
/// float32 values before the cast differ by a float32 unit (another order of a sum, in a fused
/// kernel or in plexus's composite code) and straddle a bf16 rounding boundary. Both results are
/// valid, and the unit that flipped moves everything downstream of it by about one bf16 unit: the
/// direct bound fails that draw (4 of 840 bf16 case-draws in 20 draws × 3 kernel modes,
/// bench/parity-draws.txt; direct errors are below 1e-5 or above 5e-3, nothing between). A cast
/// left out moves every draw. So over several draws ([`direct_is_systematic`]) a case fails the
/// direct bound only where it exceeds it on most of them; on one draw it fails whenever it exceeds it.
pub const TOL_BF16_DIRECT: f64 = 5e-3;

/// Over `draws` random draws of one bf16 case, `past` of them past [`TOL_BF16_DIRECT`] (and
/// within the error model's bound): a cast left out (true: most of the draws; one draw of one is
/// most) or roundings that flipped on a few draws (false).
pub fn direct_is_systematic(past: usize, draws: usize) -> bool {
    2 * past > draws
}

/// The unit roundoff of a precision's narrowest format.
fn unit_roundoff(precision: Precision) -> f64 {
    match precision {
        Precision::Fp32 => f64::powi(2.0, -24),
        Precision::Bf16 => f64::powi(2.0, -8),
    }
}

/// One tensor of a case: how far plexus and the reference are from the float64 run.
#[derive(Debug, Clone)]
pub struct TensorCheck {
    /// `output`, `loss`, `grad.input` or `grad.<parameter>`.
    pub name: String,
    /// e(plexus, float64).
    pub plexus_err: f64,
    /// e(reference at the case's precision, float64).
    pub reference_err: f64,
    /// e(the spread run furthest from float64, float64): the worst of the reference's runs with
    /// sign-randomised rounding errors (see [`GROWTH`]).
    pub spread_err: f64,
    /// e(plexus, reference at the case's precision).
    pub direct_err: f64,
    /// [`GROWTH`] · max(`reference_err`, `spread_err`) + [`FLOOR_ULPS`] units of roundoff.
    pub bound: f64,
}

/// One tensor of a case as [`judge`] takes it: plexus's result and the reference's three.
pub struct Compared {
    /// `output`, `loss`, `grad.input` or `grad.<parameter>`.
    pub name: String,
    pub plexus: Tensor,
    /// The reference at the case's precision.
    pub reference: Tensor,
    /// The reference's spread run furthest from `high` (see [`GROWTH`]).
    pub spread: Tensor,
    /// The reference in float64.
    pub high: Tensor,
}

impl TensorCheck {
    /// `plexus_err / bound`: ≤ 1 passes (NaN for a non-finite error, which fails).
    pub fn ratio(&self) -> f64 {
        if self.plexus_err.is_finite() {
            self.plexus_err / self.bound
        } else {
            f64::NAN
        }
    }
}

#[derive(Debug, Clone)]
pub struct CaseResult {
    pub name: String,
    pub precision: Precision,
    /// Every tensor compared, output first.
    pub tensors: Vec<TensorCheck>,
    /// The largest max(reference, spread) error against float64 over the case.
    pub reference_level: f64,
    /// The tensor with the largest [`TensorCheck::ratio`] (the first non-finite one if any).
    pub worst: TensorCheck,
    /// The largest direct error (plexus against the reference at the case's precision).
    pub direct_err: f64,
    /// The direct tolerance that applies: [`TOL_BF16_DIRECT`] for bf16, none for fp32.
    pub direct_tol: Option<f64>,
    /// Every tensor within its bound (the error model; [`GROWTH`]).
    pub within_bound: bool,
    /// Within the direct tolerance (always for fp32).
    pub within_direct: bool,
    pub params: i64,
    pub pass: bool,
}

/// The Python interpreter with PyTorch: `PLEXUS_PYTHON` (set by scripts/setup.sh's cargo config),
/// else `python3`.
pub fn python() -> PathBuf {
    std::env::var_os("PLEXUS_PYTHON")
        .map(PathBuf::from)
        .or_else(|| option_env!("PLEXUS_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// The case files (`*.yaml`) in `dir`, sorted, optionally only those whose name contains `only`.
pub fn cases(dir: &Path, only: Option<&str>) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading parity cases in {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .filter(|p| only.is_none_or(|o| case_name(p).contains(o)))
        .collect();
    v.sort();
    Ok(v)
}

/// A parity case's name: its file's stem (`cases/gpt-hyper.yaml` → `gpt-hyper`).
pub fn case_name(p: &Path) -> String {
    p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Runs the PyTorch references for `cases` (one Python process), writing `<out>/<case>.safetensors`,
/// on each case's own draw (`draw` 0) or on draw `draw` (see [`DRAW_STRIDE`]). On the CPU the
/// reference runs with this process's libtorch thread count (so that `plexus parity --threads N`
/// sets both sides; its spread runs take one thread, any order being valid for them). Where plexus takes the GPU step's fused paths
/// ([`crate::native::choice::gpu_paths_taken`]), the reference rounds as they do (`PLEXUS_PARITY_FUSED=1`:
/// RoPE and SwiGLU in fp32 with one rounding; parity/SPEC.md, "Precision"). With `reuse`, a case
/// whose file `out` already holds under the same key — case file, parity/*.py, draw, device,
/// thread count, kernel path, torch version; `<out>/references.json` records each — is not run
/// again (`plexus parity --keep DIR`: the Rust side can be iterated on without the reference's
/// cost, most of a parity run's).
pub fn run_references(
    parity_dir: &Path,
    cases: &[PathBuf],
    out: &Path,
    device: Device,
    draw: u64,
    reuse: bool,
) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let py = python();
    let status = std::process::Command::new(&py)
        .env("PLEXUS_PARITY_DEVICE", device_name(device))
        .env("PLEXUS_PARITY_THREADS", tch::get_num_threads().to_string())
        .env("PLEXUS_PARITY_FUSED", if crate::native::choice::gpu_paths_taken(device) { "1" } else { "0" })
        .arg(parity_dir.join("run.py"))
        .args(["--draw", &draw.to_string()])
        .args(reuse.then_some("--reuse"))
        .arg("--out-dir")
        .arg(out)
        .args(cases)
        .status()
        .with_context(|| {
            format!("running {} (parity needs Python with PyTorch: run scripts/setup.sh)", py.display())
        })?;
    if !status.success() {
        bail!(
            "the PyTorch reference failed ({status}); run `{} parity/run.py --out-dir /tmp/x CASE.yaml` to see why",
            py.display()
        );
    }
    Ok(())
}

/// PyTorch's name of a device (`cpu`, `cuda:0`).
fn device_name(device: Device) -> String {
    match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".into(),
    }
}

/// e(a, b) = max |a − b| / max(1, max |b|), in float64 on the CPU.
fn rel_err(a: &Tensor, reference: &Tensor) -> f64 {
    let r = reference.to_kind(Kind::Double).to_device(Device::Cpu);
    let a = a.to_kind(Kind::Double).to_device(Device::Cpu);
    let scale = r.abs().max().double_value(&[]).max(1.0);
    (a - r).abs().max().double_value(&[]) / scale
}

/// Judges the tensors of one case by the error model (see [`GROWTH`]).
pub fn judge(name: &str, precision: Precision, tensors: &[Compared], params: i64) -> CaseResult {
    let errs: Vec<[f64; 4]> = tensors
        .iter()
        .map(|t| {
            [
                rel_err(&t.plexus, &t.high),
                rel_err(&t.reference, &t.high),
                rel_err(&t.spread, &t.high),
                rel_err(&t.plexus, &t.reference),
            ]
        })
        .collect();
    let reference_level = errs.iter().map(|e| e[1].max(e[2])).fold(0.0, f64::max);
    let floor = FLOOR_ULPS * unit_roundoff(precision);
    let checks: Vec<TensorCheck> = tensors
        .iter()
        .zip(&errs)
        .map(|(t, &[plexus_err, reference_err, spread_err, direct_err])| TensorCheck {
            name: t.name.clone(),
            plexus_err,
            reference_err,
            spread_err,
            direct_err,
            bound: GROWTH * reference_err.max(spread_err) + floor,
        })
        .collect();
    let worst = checks
        .iter()
        .find(|c| c.ratio().is_nan())
        .or_else(|| checks.iter().max_by(|a, b| a.ratio().total_cmp(&b.ratio())))
        .cloned()
        .expect("a case has at least its output");
    let direct_err = checks.iter().map(|c| c.direct_err).fold(0.0, |m: f64, e| if e.is_nan() { e } else { m.max(e) });
    let direct_tol = match precision {
        Precision::Fp32 => None,
        Precision::Bf16 => Some(TOL_BF16_DIRECT),
    };
    let within_bound = checks.iter().all(|c| c.ratio() <= 1.0);
    let within_direct = direct_tol.is_none_or(|t| direct_err <= t);
    CaseResult {
        name: name.to_string(),
        precision,
        tensors: checks,
        reference_level,
        worst,
        direct_err,
        direct_tol,
        within_bound,
        within_direct,
        params,
        pass: within_bound && within_direct,
    }
}

/// One case's tensors: plexus's results beside the reference's, as [`judge`] takes them.
pub struct CaseTensors {
    pub name: String,
    pub precision: Precision,
    pub tensors: Vec<Compared>,
    /// Plexus's parameter count.
    pub params: i64,
}

/// Compares one case against its reference file.
pub fn check_case(case: &Path, reference: &Path, device: Device) -> Result<CaseResult> {
    let c = compare_case(case, reference, device)?;
    Ok(judge(&c.name, c.precision, &c.tensors, c.params))
}

/// Runs one case in plexus from the parameters, input and cotangent of its reference file, and
/// pairs every tensor with the reference's.
pub fn compare_case(case: &Path, reference: &Path, device: Device) -> Result<CaseTensors> {
    let exp = Experiment::from_file(case, &[])?;
    let cfg = exp.config();
    let file: HashMap<String, Tensor> = Tensor::read_safetensors(reference)
        .with_context(|| format!("reading {}", reference.display()))?
        .into_iter()
        .collect();
    let get = |k: &str| file.get(k).with_context(|| format!("{}: no `{k}` in the reference file", reference.display()));

    let model = crate::device::with_seed(0, || {
        Model::new(exp.model.as_ref(), exp.topology.as_ref(), device, cfg.precision.compute_kind())
    });
    let vars = model.vs.variables();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    for name in &names {
        let r = get(&format!("param.{name}"))
            .with_context(|| format!("Rust parameter `{name}` has no PyTorch counterpart"))?;
        let v = &vars[*name];
        if r.size() != v.size() {
            bail!("parameter `{name}`: Rust shape {:?}, PyTorch shape {:?}", v.size(), r.size());
        }
        tch::no_grad(|| v.shallow_clone().copy_(&r.to_device(device)));
    }
    let extra: Vec<&str> =
        file.keys().filter_map(|k| k.strip_prefix("param.")).filter(|k| !vars.contains_key(*k)).collect();
    if !extra.is_empty() {
        bail!("PyTorch parameters missing in Rust: {extra:?}");
    }

    // Language models take integer tokens: no requires_grad, and no `grad.input` to compare.
    let x = get("input.x")?.to_device(device).copy();
    let x = if x.is_floating_point() { x.set_requires_grad(true) } else { x };
    let out = model.forward(&x, true);
    let loss = (&out * get("input.g")?.to_device(device)).sum(Kind::Float);
    let loss = match model.topology.regularizer() {
        Some(r) => loss + r,
        None => loss,
    };
    loss.backward();

    // Per tensor: output, loss, the input's gradient (float inputs only: language models take
    // integer tokens) and every parameter's gradient, with the reference's three.
    let compared = |name: String, plexus: Tensor, key: &str| -> Result<Compared> {
        Ok(Compared {
            name,
            plexus,
            reference: get(key)?.shallow_clone(),
            spread: get(&format!("spread.{key}"))?.shallow_clone(),
            high: get(&format!("high.{key}"))?.shallow_clone(),
        })
    };
    let mut tensors = vec![
        compared("output".into(), out.detach(), "output.y")?,
        compared("loss".into(), loss.detach(), "output.loss")?,
    ];
    if x.is_floating_point() {
        tensors.push(compared("grad.input".into(), x.grad(), "grad.input")?);
    }
    for name in names {
        let g = vars[name].grad();
        let g = if g.defined() { g } else { vars[name].zeros_like() };
        tensors.push(compared(format!("grad.{name}"), g, &format!("grad.{name}"))?);
    }
    Ok(CaseTensors { name: case_name(case), precision: cfg.precision, tensors, params: model.num_params() })
}

/// Runs the references and checks every case as written (draw 0); one result per case, in order.
/// On `device` (both sides: the Rust model and the PyTorch reference).
pub fn run_all(parity_dir: &Path, cases: &[PathBuf], work: &Path, device: Device) -> Result<Vec<Result<CaseResult>>> {
    run_draw(parity_dir, cases, work, device, 0, false)
}

/// [`run_all`] on draw `draw` of every case (see [`DRAW_STRIDE`]), reusing what `work` holds
/// under the same key where `reuse` ([`run_references`]).
pub fn run_draw(
    parity_dir: &Path,
    cases: &[PathBuf],
    work: &Path,
    device: Device,
    draw: u64,
    reuse: bool,
) -> Result<Vec<Result<CaseResult>>> {
    run_references(parity_dir, cases, work, device, draw, reuse)?;
    Ok(cases.iter().map(|c| check_case(c, &work.join(format!("{}.safetensors", case_name(c))), device)).collect())
}
