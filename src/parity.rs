//! The parity harness: every topology and backbone against its PyTorch reference (`parity/`).
//!
//! Protocol (`parity/SPEC.md`): `parity/run.py` builds the reference model from a case config,
//! draws weights, input and output cotangent from the case's seed, runs forward and backward and
//! writes one safetensors file. Here we build the same config, load the weights by name (every
//! parameter must exist on both sides with the same shape: this is also the parameter-count
//! check), run forward and backward, and compare the output and every gradient.

use crate::config::Precision;
use crate::experiment::Experiment;
use crate::model::Model;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// Parity is judged by an error model, the same on every machine (`parity/SPEC.md`, "Tolerance").
/// The reference runs each case twice: at the case's precision, and in float64 from the same
/// parameters, input and cotangent (the "high" run, the exact answer for both sides). For every
/// tensor t (output, loss, each gradient), with e(a, b) = max |a − b| / max(1, max |b|):
///
/// e(plexus, high) ≤ [`GROWTH`] · e(reference, high) + floor,
///
/// floor = the reference's worst e over the whole case (at least [`FLOOR_ULPS`] units in the last
/// place of the format). Two correct programs computing the same function in the same format
/// differ from the exact answer by rounding errors of one distribution; only the order of the
/// sums differs (plexus's fused kernels, libtorch's vector width, the thread count). A sequential
/// sum of n terms is up to ~√(n / log₂ n) times further from the exact sum than a pairwise one: ≤ 8
/// for the sums in the cases (n ≤ 512), hence [`GROWTH`]. The floor covers a tensor (a scalar
/// gradient) whose reference error happens to be near zero: its error is then judged against the
/// level of the case. A wrong formula is off by O(1), far above either term.
pub const GROWTH: f64 = 8.0;

/// The floor's minimum, in units of the format's unit roundoff (2⁻²⁴ for fp32, 2⁻⁸ for bf16).
pub const FLOOR_ULPS: f64 = 4.0;

/// bf16 only, plexus against the bf16 reference directly: ≤ 5e-3 · max(1, max |reference|), about
/// one bf16 ulp (2⁻⁸). Needed besides the bound: a bf16 cast that plexus leaves out brings its result
/// *closer* to float64, which no upper bound on the error can see; the two sides run the same
/// libtorch kernels and agree to ~1e-6, while a missing or extra cast moves results by an ulp.
pub const TOL_BF16_DIRECT: f64 = 5e-3;

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
    /// e(plexus, reference at the case's precision).
    pub direct_err: f64,
    /// [`GROWTH`] · `reference_err` + the case's floor.
    pub bound: f64,
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
    /// The reference's worst error against float64 over the case (the floor, before its minimum).
    pub reference_level: f64,
    /// The tensor with the largest [`TensorCheck::ratio`] (the first non-finite one if any).
    pub worst: TensorCheck,
    /// The largest direct error (plexus against the reference at the case's precision).
    pub direct_err: f64,
    /// The direct tolerance that applies: [`TOL_BF16_DIRECT`] for bf16, none for fp32.
    pub direct_tol: Option<f64>,
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

pub fn case_name(p: &Path) -> String {
    p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Runs the PyTorch references for `cases` (one Python process), writing `<out>/<case>.safetensors`.
/// On the CPU the reference runs with this process's libtorch thread count (so that
/// `plexus parity --threads N` sets both sides). Where plexus takes the GPU step's fused paths
/// ([`crate::native::gpu_paths_taken`]), the reference rounds as they do (`PLEXUS_PARITY_FUSED=1`:
/// RoPE and SwiGLU in fp32 with one rounding; parity/SPEC.md, "Precision").
pub fn run_references(parity_dir: &Path, cases: &[PathBuf], out: &Path, device: Device) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let py = python();
    let status = std::process::Command::new(&py)
        .env("PLEXUS_PARITY_DEVICE", device_name(device))
        .env("PLEXUS_PARITY_THREADS", tch::get_num_threads().to_string())
        .env("PLEXUS_PARITY_FUSED", if crate::native::gpu_paths_taken(device) { "1" } else { "0" })
        .arg(parity_dir.join("run.py"))
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

/// Judges the tensors of one case by the error model (see [`GROWTH`]). `tensors` holds, per
/// name, (plexus, reference at the case's precision, float64 run).
pub fn judge(
    name: &str,
    precision: Precision,
    tensors: &[(String, Tensor, Tensor, Tensor)],
    params: i64,
) -> CaseResult {
    let errs: Vec<(f64, f64, f64)> =
        tensors.iter().map(|(_, p, r, h)| (rel_err(p, h), rel_err(r, h), rel_err(p, r))).collect();
    let reference_level = errs.iter().map(|e| e.1).fold(0.0, f64::max);
    let floor = reference_level.max(FLOOR_ULPS * unit_roundoff(precision));
    let checks: Vec<TensorCheck> = tensors
        .iter()
        .zip(&errs)
        .map(|((n, ..), &(plexus_err, reference_err, direct_err))| TensorCheck {
            name: n.clone(),
            plexus_err,
            reference_err,
            direct_err,
            bound: GROWTH * reference_err + floor,
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
    let pass = checks.iter().all(|c| c.ratio() <= 1.0) && direct_tol.is_none_or(|t| direct_err <= t);
    CaseResult {
        name: name.to_string(),
        precision,
        tensors: checks,
        reference_level,
        worst,
        direct_err,
        direct_tol,
        params,
        pass,
    }
}

/// Compares one case against its reference file.
pub fn check_case(case: &Path, reference: &Path, device: Device) -> Result<CaseResult> {
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

    // (name, plexus, reference, float64 run) per tensor: output, loss, the input's gradient
    // (float inputs only: language models take integer tokens) and every parameter's gradient.
    let mut tensors = vec![
        ("output".to_string(), out.detach(), get("output.y")?.shallow_clone(), get("high.output.y")?.shallow_clone()),
        (
            "loss".to_string(),
            loss.detach(),
            get("output.loss")?.shallow_clone(),
            get("high.output.loss")?.shallow_clone(),
        ),
    ];
    if x.is_floating_point() {
        tensors.push((
            "grad.input".into(),
            x.grad(),
            get("grad.input")?.shallow_clone(),
            get("high.grad.input")?.shallow_clone(),
        ));
    }
    for name in names {
        let g = vars[name].grad();
        let g = if g.defined() { g } else { vars[name].zeros_like() };
        tensors.push((
            format!("grad.{name}"),
            g,
            get(&format!("grad.{name}"))?.shallow_clone(),
            get(&format!("high.grad.{name}"))?.shallow_clone(),
        ));
    }
    Ok(judge(&case_name(case), cfg.precision, &tensors, model.num_params()))
}

/// Runs the references and checks every case; one result per case, in order.
/// On `device` (both sides: the Rust model and the PyTorch reference).
pub fn run_all(parity_dir: &Path, cases: &[PathBuf], work: &Path, device: Device) -> Result<Vec<Result<CaseResult>>> {
    run_references(parity_dir, cases, work, device)?;
    Ok(cases.iter().map(|c| check_case(c, &work.join(format!("{}.safetensors", case_name(c))), device)).collect())
}
