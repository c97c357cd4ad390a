//! mHC's Sinkhorn: the fused CPU loops (every instruction set the machine runs), the CUDA
//! kernels' host build (`native/src/sinkhorn.cu`) and the composite log-domain graph.

use crate::{all_finite, max_diff, values};
use plexus_native::choice::sinkhorn;
use plexus_native::{composite, kernels, setting};
use tch::{Kind, Tensor};

#[test]
fn sinkhorn_is_doubly_stochastic() {
    // Logits of the size mHC produces (α = 0.01 scales the projection; b = 0): 20 iterations
    // reach fp32 accuracy. (Far larger logits, N(0, 2²), need ~200 iterations for 1e-5 rows.)
    tch::manual_seed(0);
    let m = sinkhorn(&(Tensor::randn([1000, 4, 4], (Kind::Float, tch::Device::Cpu)) * 0.5), 20);
    let rows = (m.sum_dim_intlist(-1, false, Kind::Float) - 1.0).abs().max().double_value(&[]);
    let cols = (m.sum_dim_intlist(-2, false, Kind::Float) - 1.0).abs().max().double_value(&[]);
    assert!(rows < 1e-5 && cols < 1e-5, "rows {rows:e}, cols {cols:e}");
}

/// The log-domain iteration in fp64, written out here as the reference of the fused kernel.
fn sinkhorn_f64(logits: &Tensor, iters: usize) -> Tensor {
    let mut l = logits.shallow_clone();
    for _ in 0..iters {
        l = l.log_softmax(-1, Kind::Double).log_softmax(-2, Kind::Double);
    }
    l.exp()
}

/// Value and gradient of `<sinkhorn(L), G>` with respect to `L`.
fn value_and_grad(f: impl Fn(&Tensor) -> Tensor, logits: &Tensor, g: &Tensor) -> (Tensor, Tensor) {
    let l = logits.detach().set_requires_grad(true);
    let p = f(&l);
    (&p * g).sum(p.kind()).backward();
    (f(&l).detach(), l.grad())
}

/// The fused kernel (CPU, fp32 and fp64) against the log-domain autograd graph: forward and
/// the gradient of the logits, with every instruction set the machine has, on token counts
/// that are not a multiple of the vector width (2, 4 or 8 tokens) or of the generic loops'
/// block of 16; n = 2, 4 (mHC's default) and 8 run the register-resident loops, n = 3 the
/// generic ones; 1, 7 and 20 iterations.
#[test]
fn the_fused_sinkhorn_matches_the_log_domain_graph() {
    for isa in setting::kernel_isas() {
        setting::with_kernel_isa(isa, fused_sinkhorn_matches_the_log_domain_graph);
    }
}

fn fused_sinkhorn_matches_the_log_domain_graph() {
    tch::manual_seed(1);
    for (n, iters, tokens) in [(4, 20, 37), (3, 1, 5), (4, 7, 16), (2, 20, 9), (8, 20, 11), (4, 1, 3)] {
        let logits = Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu)) * 1.5;
        let g = Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu));
        assert!(kernels::sinkhorn_fits(n as usize, iters));
        let (p_ref, g_ref) = value_and_grad(|l| sinkhorn_f64(l, iters), &logits, &g);
        let (p64, g64) = value_and_grad(|l| kernels::sinkhorn_fused(l, iters).unwrap(), &logits, &g);
        assert_eq!(p64.kind(), Kind::Double);
        let (dp, dg) = (max_diff(&p64, &p_ref), max_diff(&g64, &g_ref));
        let isa = setting::kernel_isa().name();
        assert!(dp < 1e-13 && dg < 1e-12, "{isa} fp64 n={n} iters={iters}: value {dp:e}, grad {dg:e}");
        let (l32, g32) = (logits.to_kind(Kind::Float), g.to_kind(Kind::Float));
        let (p_f, g_f) = value_and_grad(|l| sinkhorn(l, iters), &l32, &g32);
        let (p_c, g_c) = value_and_grad(|l| composite::sinkhorn_composite(l, iters), &l32, &g32);
        for (what, fused, comp) in [("value", &p_f, &p_c), ("grad", &g_f, &g_c)] {
            let (to_ref, comp_to_ref) = (
                max_diff(fused, if what == "value" { &p_ref } else { &g_ref }),
                max_diff(comp, if what == "value" { &p_ref } else { &g_ref }),
            );
            assert!(
                to_ref < 2e-5,
                "{isa} fp32 n={n} iters={iters} {what}: fused {to_ref:e} from fp64 (composite {comp_to_ref:e})"
            );
        }
    }
}

/// One arithmetic (`native/src/sinkhorn.cu`): the fused CPU loops — the register-resident ones
/// (n = 2, 4, 8) and the block loops (any other n) — and the CUDA kernels' host build give the
/// same bits, value and gradient, fp32 and fp64, for every n the kernels take, on token counts
/// that leave partial vectors and blocks. Exact in the baseline build, where neither side can
/// fuse a multiply-add. The wider instruction sets contract the backward's dot products
/// ⟨g, y⟩ into FMAs: the same value, and a gradient that differs by at most one rounding of
/// each of a line's n products per normalisation, 2·iters·n·u·max|g| in all (u the unit
/// roundoff; the walk back does not amplify it, its steps scale by line sums of a
/// doubly-stochastic matrix).
#[test]
fn the_cpu_loops_and_the_cuda_kernels_run_one_sinkhorn() {
    tch::manual_seed(3);
    for isa in setting::kernel_isas() {
        for n in 1..=kernels::CUDA_KERNELS_MAX_STREAMS as i64 {
            for (iters, tokens) in [(20, 37), (3, 5)] {
                for (kind, u) in [(Kind::Float, f64::from(f32::EPSILON) / 2.0), (Kind::Double, f64::EPSILON / 2.0)] {
                    let logits = (Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu)) * 1.5).to_kind(kind);
                    let g = Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu)).to_kind(kind);
                    let (p_cpu, g_cpu) = setting::with_kernel_isa(isa, || {
                        value_and_grad(|l| kernels::sinkhorn_fused(l, iters).unwrap(), &logits, &g)
                    });
                    let (p_k, g_k) = kernels::sinkhorn_cuda_host(&logits, Some(&g), iters).unwrap();
                    let (dp, dg) = (max_diff(&p_cpu, &p_k), max_diff(&g_cpu, &g_k.unwrap()));
                    let what = format!("{} n={n} iters={iters} {kind:?}", isa.name());
                    assert_eq!(dp, 0.0, "{what}: the values differ by {dp:e}");
                    let fma_bound = (2 * iters) as f64 * n as f64 * u * max_diff(&g, &g.zeros_like());
                    let bound = if isa == setting::KernelIsa::Baseline { 0.0 } else { fma_bound };
                    assert!(dg <= bound, "{what}: the gradients differ by {dg:e} (allowed {bound:e})");
                }
            }
        }
    }
}

/// No tokens (an empty batch slice): both loops return empty values and gradients.
#[test]
fn the_fused_sinkhorn_takes_zero_tokens() {
    for isa in setting::kernel_isas() {
        for n in [4, 3] {
            let logits = Tensor::zeros([0, n, n], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
            let p = setting::with_kernel_isa(isa, || kernels::sinkhorn_fused(&logits, 20).unwrap());
            assert_eq!(p.size(), [0, n, n]);
            p.sum(Kind::Float).backward();
            assert_eq!(logits.grad().size(), [0, n, n], "{} n = {n}", isa.name());
        }
    }
}

/// Logits far below their row's maximum underflow in `exp`: the fused kernel keeps such lines
/// at 0 rather than dividing 0 by 0, and its gradient stays finite.
#[test]
fn the_fused_sinkhorn_stays_finite_on_extreme_logits() {
    let logits = Tensor::from_slice(&[0.0f32, -200.0, 0.0, -300.0]).view([1, 2, 2]).set_requires_grad(true);
    let p = kernels::sinkhorn_fused(&logits, 20).unwrap();
    p.sum(Kind::Float).backward();
    let (pv, gv) = (values(&p), values(&logits.grad()));
    assert!(pv.iter().chain(&gv).all(|v| v.is_finite()), "P {pv:?}, dL {gv:?}");
    assert_eq!(pv, vec![0.5, 0.0, 0.5, 0.0], "column 1 underflowed entirely and stays 0");
}

/// The CUDA kernels' arithmetic (`native/src/sinkhorn.cu`, its per-token functions run on the
/// CPU) against the log-domain graph in fp64: every n the kernels take, 1, 7 and 20 iterations,
/// value and gradient, in fp64 (where only the order of operations differs) and in fp32 (the
/// kernels' precision on the GPU). The backward walks back from the final matrix by the saved
/// line sums rather than keeping every iterate, which this checks to fp64 rounding.
#[test]
fn the_cuda_sinkhorn_arithmetic_matches_the_log_domain_graph() {
    tch::manual_seed(2);
    for n in 1..=kernels::CUDA_KERNELS_MAX_STREAMS as i64 {
        for (iters, tokens) in [(20, 37), (7, 5), (1, 3)] {
            let logits = Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu)) * 1.5;
            let g = Tensor::randn([tokens, n, n], (Kind::Double, tch::Device::Cpu));
            let (p_ref, g_ref) = value_and_grad(|l| sinkhorn_f64(l, iters), &logits, &g);
            let (p64, g64) = kernels::sinkhorn_cuda_host(&logits, Some(&g), iters).unwrap();
            let (dp, dg) = (max_diff(&p64, &p_ref), max_diff(&g64.unwrap(), &g_ref));
            assert!(dp < 1e-13 && dg < 1e-11, "fp64 n={n} iters={iters}: value {dp:e}, grad {dg:e}");
            let (p32, g32) =
                kernels::sinkhorn_cuda_host(&logits.to_kind(Kind::Float), Some(&g.to_kind(Kind::Float)), iters)
                    .unwrap();
            let (dp, dg) = (max_diff(&p32, &p_ref), max_diff(&g32.unwrap(), &g_ref));
            assert!(dp < 2e-5 && dg < 2e-5, "fp32 n={n} iters={iters}: value {dp:e}, grad {dg:e}");
        }
    }
    let empty = Tensor::zeros([0, 4, 4], (Kind::Float, tch::Device::Cpu));
    let (p, gl) = kernels::sinkhorn_cuda_host(&empty, Some(&empty), 20).unwrap();
    assert_eq!((p.size(), gl.unwrap().size()), (vec![0, 4, 4], vec![0, 4, 4]));
    assert!(kernels::sinkhorn_cuda_host(&Tensor::zeros([2, 9, 9], (Kind::Float, tch::Device::Cpu)), None, 20)
        .is_err_and(|e| e.to_string().contains("1 ≤ n ≤ 8")));
}

/// Saturated logits — a column whose every entry is ~200 below its row's maximum, so that it
/// underflows to 0 after the first row normalisation, and a row of equal logits beside rows with
/// one dominant entry — give the same matrix and the same gradient from the composite graph,
/// the fused CPU kernel and the CUDA kernels' arithmetic (n = 2, 3, 4).
#[test]
fn the_composite_and_the_kernels_agree_on_saturated_logits() {
    for n in [2i64, 3, 4] {
        let mut v = vec![0.0f32; (2 * n * n) as usize];
        for t in 0..2 {
            for i in 0..n {
                for j in 0..n {
                    let k = (t * n * n + i * n + j) as usize;
                    v[k] = if j == n - 1 {
                        -200.0 - i as f32
                    } else if t == 1 && i == 0 {
                        0.0
                    } else {
                        (i * j) as f32 * 0.3
                    };
                }
            }
        }
        let logits = Tensor::from_slice(&v).view([2, n, n]);
        let g = (Tensor::arange(2 * n * n, (Kind::Float, tch::Device::Cpu)) * 0.37).sin().view([2, n, n]);
        let (p_c, g_c) = value_and_grad(|l| composite::sinkhorn_composite(l, 20), &logits, &g);
        let (p_f, g_f) = value_and_grad(|l| kernels::sinkhorn_fused(l, 20).unwrap(), &logits, &g);
        let (p_k, g_k) = kernels::sinkhorn_cuda_host(&logits, Some(&g), 20).unwrap();
        let g_k = g_k.unwrap();
        let last_col = p_c.narrow(2, n - 1, 1);
        assert_eq!(max_diff(&last_col, &last_col.zeros_like()), 0.0, "n = {n}: the underflowed column stays 0");
        assert!([&p_c, &g_c].iter().all(|t| all_finite(t)), "n = {n}");
        for (what, a, b) in [
            ("fused value", &p_f, &p_c),
            ("fused grad", &g_f, &g_c),
            ("cuda value", &p_k, &p_c),
            ("cuda grad", &g_k, &g_c),
        ] {
            let err = max_diff(a, b);
            assert!(err < 1e-5, "n = {n}: {what} differs from the composite by {err:e}");
        }
    }
}

/// As the CPU kernel: an underflowed line stays 0 and the gradient stays finite.
#[test]
fn the_cuda_sinkhorn_arithmetic_stays_finite_on_extreme_logits() {
    let logits = Tensor::from_slice(&[0.0f32, -200.0, 0.0, -300.0]).view([1, 2, 2]);
    let (p, gl) = kernels::sinkhorn_cuda_host(&logits, Some(&logits.ones_like()), 20).unwrap();
    let (pv, gv) = (values(&p), values(&gl.unwrap()));
    assert!(gv.iter().all(|v| v.is_finite()), "dL {gv:?}");
    assert_eq!(pv, vec![0.5, 0.0, 0.5, 0.0], "column 1 underflowed entirely and stays 0");
}
