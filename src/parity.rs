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

/// fp32: max |Rust − PyTorch| ≤ 1e-5 · max(1, max |reference|), per tensor.
pub const TOL_FP32: f64 = 1e-5;
/// bf16 (fp32 master weights, bf16 matmuls through `aten::linear` on both sides): 5e-3 relative,
/// about one bf16 ulp (2⁻⁸). On the same libtorch the two sides run the same kernels and agree to
/// ~1e-7; the margin covers another BLAS or summation order, while any real bug is O(1).
pub const TOL_BF16: f64 = 5e-3;

#[derive(Debug, Clone)]
pub struct CaseResult {
    pub name: String,
    pub precision: Precision,
    /// Relative error of the output.
    pub output_err: f64,
    /// Worst relative error over the gradients of every parameter and of the input.
    pub grad_err: f64,
    /// Which gradient that was.
    pub worst_grad: String,
    pub tolerance: f64,
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
pub fn run_references(parity_dir: &Path, cases: &[PathBuf], out: &Path, device: Device) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let py = python();
    let status = std::process::Command::new(&py)
        .env("PLEXUS_PARITY_DEVICE", device_name(device))
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

fn rel_err(a: &Tensor, reference: &Tensor) -> f64 {
    let r = reference.to_kind(Kind::Double);
    let a = a.to_kind(Kind::Double).to_device(Device::Cpu);
    let scale = r.abs().max().double_value(&[]).max(1.0);
    (a - r).abs().max().double_value(&[]) / scale
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

    let mut output_err = rel_err(&out, get("output.y")?);
    output_err = output_err.max(rel_err(&loss, get("output.loss")?));
    let (mut grad_err, mut worst_grad) = if x.is_floating_point() {
        (rel_err(&x.grad(), get("grad.input")?), "input".to_string())
    } else {
        // Token inputs: the first parameter sets the mark, so the table names a real gradient.
        (f64::NEG_INFINITY, String::new())
    };
    for name in names {
        let g = vars[name].grad();
        let g = if g.defined() { g } else { vars[name].zeros_like() };
        let e = rel_err(&g, get(&format!("grad.{name}"))?);
        if e > grad_err || e.is_nan() {
            (grad_err, worst_grad) = (e, name.clone());
        }
    }
    let tolerance = match cfg.precision {
        Precision::Fp32 => TOL_FP32,
        Precision::Bf16 => TOL_BF16,
    };
    Ok(CaseResult {
        name: case_name(case),
        precision: cfg.precision,
        output_err,
        grad_err,
        worst_grad,
        tolerance,
        params: model.num_params(),
        pass: output_err <= tolerance && grad_err <= tolerance,
    })
}

/// Runs the references and checks every case; one result per case, in order.
/// On `device` (both sides: the Rust model and the PyTorch reference).
pub fn run_all(parity_dir: &Path, cases: &[PathBuf], work: &Path, device: Device) -> Result<Vec<Result<CaseResult>>> {
    run_references(parity_dir, cases, work, device)?;
    Ok(cases.iter().map(|c| check_case(c, &work.join(format!("{}.safetensors", case_name(c))), device)).collect())
}
