//! The norm-and-projection kernels: mHC's RMS projection ([`plexus_native::kernels::rms_project`]),
//! Hyper-Connections' LayerNorm + projection ([`plexus_native::kernels::norm_project`]) and their
//! fused pre-unit step ([`plexus_native::kernels::hyper_pre`]), against the composite formulas.

use crate::max_diff;
use plexus_native::{kernels, setting};
use tch::{Kind, Tensor};

/// The LayerNorm's ε of Hyper-Connections' dynamic logits (plexus' `topology::hyper`).
const NORM_EPS: f64 = 1e-5;

/// `a @ b` in the `compute` precision, read back in fp32 (plexus' `topology::common::matmul`).
fn matmul_in(a: &Tensor, b: &Tensor, compute: Kind) -> Tensor {
    a.to_kind(compute).matmul(&b.to_kind(compute)).to_kind(Kind::Float)
}

/// The RMS projection with bf16 products ([`kernels::rms_project`] with compute bf16, what a GPU
/// step runs under `precision: bf16`) against the composite it replaces (mHC's `project` in
/// plexus, its last lines: the norm, then the bf16 product read back in fp32), q and the gradients of v and φ. The
/// roundings are the composite's, so the two differ only where an fp32 sum taken in another
/// order tips a bf16 rounding (rare, by one bf16 unit) and otherwise by fp32 roundoff: at most
/// 2 % of the elements more than 2⁻¹⁶ of the tensor's largest magnitude apart, none more than
/// 2⁻⁷ (a rounding left out moves most elements by about 2⁻⁹).
#[test]
fn the_rms_projection_in_bf16_rounds_as_the_composite() {
    tch::manual_seed(5);
    let opts = (Kind::Float, tch::Device::Cpu);
    let inputs = [Tensor::randn([3, 7, 40], opts) * 2.0 + 0.5, Tensor::randn([40, 24], opts) * 0.1];
    let g = Tensor::randn([3, 7, 24], opts);
    let run = |fused: bool| -> Vec<Tensor> {
        let xs: Vec<Tensor> = inputs.iter().map(|t| t.detach().set_requires_grad(true)).collect();
        let q = if fused {
            kernels::rms_project(&xs[0], &xs[1], Kind::BFloat16).unwrap()
        } else {
            let r = xs[0].norm_scalaropt_dim(2.0, [-1i64], true) / 40f64.sqrt();
            matmul_in(&xs[0], &xs[1], Kind::BFloat16) / r
        };
        (&q * &g).sum(Kind::Float).backward();
        std::iter::once(q.detach()).chain(xs.iter().map(|x| x.grad())).collect()
    };
    let (fused, composite) = (run(true), run(false));
    for (i, (a, b)) in fused.iter().zip(&composite).enumerate() {
        let gap = (a - b).abs() / b.abs().max();
        let apart = gap.gt(2f64.powi(-16)).to_kind(Kind::Double).mean(Kind::Double).double_value(&[]);
        let largest = gap.max().double_value(&[]);
        assert!(apart <= 0.02 && largest <= 2f64.powi(-7), "output {i} (q, dv, dφ): {apart} apart, {largest:e}");
    }
}

/// The fused RMS projection against the composite formula (fp64, fp32): the value and the
/// gradients of the streams and of φ. (The model's own fused-against-composite check is
/// `plexus parity` on the mHC cases.)
#[test]
fn the_fused_rms_projection_matches_the_composite_one() {
    tch::manual_seed(5);
    for (kind, tol) in [(Kind::Double, 1e-12), (Kind::Float, 2e-5)] {
        let opts = (kind, tch::Device::Cpu);
        let inputs = [Tensor::randn([3, 7, 40], opts) * 2.0 + 0.5, Tensor::randn([40, 24], opts) * 0.1];
        let g = Tensor::randn([3, 7, 24], opts);
        let run = |fused: bool| -> Vec<Tensor> {
            let xs: Vec<Tensor> = inputs.iter().map(|t| t.detach().set_requires_grad(true)).collect();
            let q = if fused {
                kernels::rms_project(&xs[0], &xs[1], xs[0].kind()).unwrap()
            } else {
                // The composite formula in the inputs' precision (`project` returns fp32).
                let r = xs[0].norm_scalaropt_dim(2.0, [-1i64], true) / 40f64.sqrt();
                xs[0].matmul(&xs[1]) / r
            };
            (&q * &g).sum(kind).backward();
            std::iter::once(q.detach()).chain(xs.iter().map(|x| x.grad())).collect()
        };
        let (fused, reference) = (run(true), run(false));
        for (i, (a, b)) in fused.iter().zip(&reference).enumerate() {
            assert_eq!(a.size(), b.size(), "output {i}");
            let err = max_diff(a, b) / b.abs().max().double_value(&[]).max(1.0);
            assert!(err < tol, "{kind:?}: output {i} (0 = q, then dv, dφ) off by {err:e}");
        }
    }
}

/// The fused LayerNorm + projection against LayerNorm then matmul (fp32 and fp64): the value
/// and the gradients of the streams, γ, β and W, with D = 13 and 37 (not multiples of 8 lanes),
/// K outputs through the one-pass and the generic loops, rows far from zero mean, for each
/// instruction set the machine runs.
#[test]
fn the_fused_norm_and_projection_match_layer_norm_then_matmul() {
    for isa in setting::kernel_isas() {
        for d in [13i64, 37] {
            // K = 3, 6, 10: the one-pass kernels for n = 1, 4, 8 streams; K = 5: the generic loops.
            for k in [3i64, 5, 6, 10] {
                // Rows of spread 3 about 1, and of spread 1 about 100 (the one-pass moments
                // must not cancel there).
                for (scale, offset) in [(3.0, 1.0), (1.0, 100.0)] {
                    setting::with_kernel_isa(isa, || norm_project_matches(d, k, scale, offset, isa));
                }
            }
        }
    }
}

/// The fused pre-unit step ([`kernels::hyper_pre`]: norm, projection, tanh-scaled weights, read)
/// against the same formulas in libtorch operators in fp64: u, res and post, and the gradients
/// of the streams and of all eight parameters, for n = 1, 3 (the generic loops), 2, 4, 8, D = 13
/// and 37, logits from about ±0.1 to beyond ±9 (where tanh saturates), each instruction set the
/// machine runs; once with every output used and once with only u (res and post then have no
/// gradient, which the kernel takes as zeros).
#[test]
fn the_fused_pre_step_matches_the_composite_formulas() {
    for isa in setting::kernel_isas() {
        for n in [1i64, 2, 3, 4, 8] {
            for d in [13i64, 37] {
                for only_u in [false, true] {
                    setting::with_kernel_isa(isa, || pre_step_matches(n, d, only_u, isa));
                }
            }
        }
    }
}

fn pre_step_matches(n: i64, d: i64, only_u: bool, isa: setting::KernelIsa) {
    // h, γ, β, W_a, w_b, A_static, B_static, s_a, s_b; W_a's columns scaled 0.1 … 8 so that
    // the logits run from small to saturated.
    let col_scale = Tensor::logspace(-1.0, 0.9, n + 1, 10.0, (Kind::Double, tch::Device::Cpu));
    let inputs = [
        uniform(&[2, 5, n, d], 11) * 2.0 + 0.5,
        uniform(&[d], 12),
        uniform(&[d], 13),
        uniform(&[d, n + 1], 14) * col_scale,
        uniform(&[d], 15) * 0.3,
        uniform(&[n, n + 1], 16),
        uniform(&[n], 17),
        uniform(&[], 18),
        uniform(&[], 19),
    ];
    let (gu, gres, gpost) = (uniform(&[2, 5, d], 20), uniform(&[2, 5, n, n], 21), uniform(&[2, 5, n], 22));
    // fp64: the worst error measured is 2e-14 (dH), and a tanh whose exp polynomial stops at
    // degree 9 instead of 12 fails. fp32: up to 1.5e-5 (dH, baseline loops, n = 8, D = 37),
    // the one-pass norm-projection's rounding at logits of ±9 (the composite fp32 code is
    // off the fp64 by 3e-6 there).
    for (kind, tol) in [(Kind::Double, 2e-13), (Kind::Float, 3e-5)] {
        let run = |fused: bool| -> Vec<Tensor> {
            let of = if fused { kind } else { Kind::Double };
            let x: Vec<Tensor> = inputs.iter().map(|t| t.to_kind(of).detach().set_requires_grad(true)).collect();
            let (u, res, post) = if fused {
                let params: &[Tensor; 8] = x[1..].try_into().unwrap();
                let p = kernels::HyperPreParams::from_slice(params, NORM_EPS);
                kernels::hyper_pre(&x[0], &p).unwrap()
            } else {
                let normed = x[0].layer_norm([d], Some(&x[1]), Some(&x[2]), NORM_EPS, false);
                let a = &x[5] + normed.matmul(&x[3]).tanh() * &x[7];
                let b = &x[6] + normed.matmul(&x[4]).tanh() * &x[8];
                let pre = a.narrow(-1, 0, 1);
                ((&pre * &x[0]).sum_dim_intlist(-2, false, of), a.narrow(-1, 1, n), b)
            };
            let mut loss = (&u * gu.to_kind(of)).sum(of);
            if !only_u {
                loss = loss + (&res * gres.to_kind(of)).sum(of) + (&post * gpost.to_kind(of)).sum(of);
            }
            loss.backward();
            [u, res, post]
                .into_iter()
                .map(|t| t.detach())
                // A parameter that reached no used output has no gradient: zeros, as the
                // fused function returns.
                .chain(x.iter().map(|t| if t.grad().defined() { t.grad() } else { t.zeros_like() }))
                .map(|t| t.to_kind(Kind::Double))
                .collect()
        };
        let (fused, reference) = (run(true), run(false));
        let names = ["u", "res", "post", "dH", "dγ", "dβ", "dW_a", "dw_b", "dA_static", "dB_static", "ds_a", "ds_b"];
        for ((a, b), name) in fused.iter().zip(&reference).zip(names) {
            assert_eq!(a.size(), b.size(), "{name}");
            let err = (a - b).abs().max().double_value(&[]) / b.abs().max().double_value(&[]).max(1.0);
            assert!(err < tol, "{isa:?}, n = {n}, D = {d}, only u: {only_u}, {kind:?}: {name} off by {err:e}");
        }
    }
}

/// Uniform values in ±1.7 from a seeded generator of their own: the tests run in parallel
/// threads that share libtorch's, so `manual_seed` + `randn` would not fix the inputs.
fn uniform(shape: &[i64], seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v: Vec<f64> = (0..shape.iter().product::<i64>()).map(|_| rng.gen_range(-1.7..1.7)).collect();
    Tensor::from_slice(&v).reshape(shape)
}

fn norm_project_matches(d: i64, k: i64, scale: f64, offset: f64, isa: setting::KernelIsa) {
    for (kind, tol) in [(Kind::Double, 1e-11), (Kind::Float, 2e-5)] {
        // 45 rows: an odd number in each of the two parallel tasks (the backward takes rows in pairs).
        let inputs = [
            (uniform(&[3, 5, 3, d], 1) * scale + offset).to_kind(kind),
            uniform(&[d], 2).to_kind(kind),
            uniform(&[d], 3).to_kind(kind),
            uniform(&[d, k], 4).to_kind(kind),
        ];
        let g = uniform(&[3, 5, 3, k], 5);
        // The fused kernel in `kind`; the reference, LayerNorm then matmul, in fp64 on the same
        // values (an fp32 reference has errors of the size checked here when the rows' mean is
        // 100 times their spread).
        let run = |fused: bool| -> Vec<Tensor> {
            let of = if fused { kind } else { Kind::Double };
            let xs: Vec<Tensor> = inputs.iter().map(|t| t.to_kind(of).detach().set_requires_grad(true)).collect();
            let z = if fused {
                kernels::norm_project(&xs[0], &xs[1], &xs[2], &xs[3], NORM_EPS).unwrap()
            } else {
                xs[0].layer_norm([d], Some(&xs[1]), Some(&xs[2]), NORM_EPS, false).matmul(&xs[3])
            };
            (&z * g.to_kind(of)).sum(of).backward();
            std::iter::once(z.detach()).chain(xs.iter().map(|x| x.grad())).map(|t| t.to_kind(Kind::Double)).collect()
        };
        let (fused, reference) = (run(true), run(false));
        for (i, (a, b)) in fused.iter().zip(&reference).enumerate() {
            assert_eq!(a.size(), b.size(), "output {i}");
            let err = (a - b).abs().max().double_value(&[]) / b.abs().max().double_value(&[]).max(1.0);
            assert!(
                err < tol,
                "{isa:?}, D = {d}, K = {k}, rows {scale}·U(±1.7) + {offset}, {kind:?}: output {i} (0 = z, \
                 then dx, dγ, dβ, dW) off by {err:e}"
            );
        }
    }
}
