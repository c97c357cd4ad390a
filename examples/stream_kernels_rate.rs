//! Micro-benchmark of the fused CPU kernels of the multi-stream topologies
//! (`native/src/stream_kernels.cpp`) against the composite libtorch code they replace, one unit at
//! a time: the stream read and write, Sinkhorn–Knopp, Hyper-Connections' LayerNorm + projection,
//! mHC's RMS + projection and Hyper-Connections' whole pre-unit step (`hyper_pre`: the norm, the
//! projection, the tanh-scaled weights and the read), forward alone and forward + backward; the
//! fused ones with the row loops of every instruction set the CPU runs (baseline x86-64, AVX2 + FMA,
//! AVX-512; the same for the RMS projection, which has no per-set loops).
//!
//! ```sh
//! cargo run --release --example stream_kernels_rate -- [TOKENS] [STREAMS] [WIDTH]   # default 2048 4 128
//! ```
//!
//! Each figure is the 25th percentile of 25 timed calls after 3 warm-up calls, in ms; the fused and
//! the composite version of one operation alternate in rounds so that the machine's drift falls on
//! both (a shared VM drifts by ±15 % between runs). The backward is driven by `<y, g>` for a fixed
//! random `g`, the same for both versions.

use plexus::native;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// The tensors flattened into one vector (the harness takes one output; the multi-output
/// operation's two versions pay the same copy).
fn flat_cat(ts: &[Tensor]) -> Tensor {
    Tensor::cat(&ts.iter().map(|t| t.reshape([-1])).collect::<Vec<_>>(), 0)
}

/// The 25th percentile of the wall time of `f`, in ms.
fn time(f: &dyn Fn()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut v: Vec<f64> = (0..25)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 4]
}

/// Forward alone, and forward + backward of `<f(inputs), g>` into fresh leaves.
fn forward_and_backward(f: &dyn Fn(&[Tensor]) -> Tensor, inputs: &[Tensor], g: &Tensor) -> (f64, f64) {
    let leaves: Vec<Tensor> = inputs.iter().map(|t| t.detach().set_requires_grad(true)).collect();
    let fwd = time(&|| {
        let _ = tch::no_grad(|| f(inputs));
    });
    let both = time(&|| {
        for x in &leaves {
            let mut grad = x.grad();
            if grad.defined() {
                let _ = grad.zero_();
            }
        }
        (f(&leaves) * g).sum(Kind::Float).backward();
    });
    (fwd, both)
}

fn main() {
    let args: Vec<i64> =
        std::env::args().skip(1).map(|a| a.parse().expect("TOKENS STREAMS WIDTH as integers")).collect();
    let (m, n, d) =
        (args.first().copied().unwrap_or(2048), args.get(1).copied().unwrap_or(4), args.get(2).copied().unwrap_or(128));
    let o = (Kind::Float, Device::Cpu);
    println!(
        "{m} tokens × {n} streams × width {d}, fp32, {} threads; ms, 25th percentile of 25 calls",
        tch::get_num_threads()
    );
    let h = Tensor::randn([m, n, d], o);
    let (pre, res, post, out) =
        (Tensor::randn([m, n], o), Tensor::randn([m, n, n], o), Tensor::randn([m, n], o), Tensor::randn([m, d], o));
    let logits = Tensor::randn([m, n, n], o) * 0.5;
    let (gamma, beta, w) = (Tensor::randn([d], o), Tensor::randn([d], o), Tensor::randn([d, n + 2], o) * 0.1);
    type Op<'a> = (&'a str, Box<dyn Fn(&[Tensor]) -> Tensor>, Box<dyn Fn(&[Tensor]) -> Tensor>, Vec<Tensor>, Vec<i64>);
    let ops: Vec<Op> = vec![
        (
            "stream read",
            Box::new(|x| native::kernels::stream_read_fused(&x[0], &x[1], None).unwrap()),
            Box::new(|x| native::composite::stream_read_composite(&x[0], &x[1])),
            vec![h.copy(), pre],
            vec![m, d],
        ),
        (
            "stream write",
            Box::new(|x| native::kernels::stream_write_fused(&x[0], &x[1], &x[2], &x[3], None).unwrap()),
            Box::new(|x| native::composite::stream_write_composite(&x[0], &x[1], &x[2], &x[3])),
            vec![h.copy(), res, post, out],
            vec![m, n, d],
        ),
        (
            "sinkhorn (20 iterations)",
            Box::new(|x| native::kernels::sinkhorn_fused(&x[0], 20).unwrap()),
            Box::new(|x| native::composite::sinkhorn_composite(&x[0], 20)),
            vec![logits],
            vec![m, n, n],
        ),
        (
            "layernorm + projection",
            Box::new(|x| native::kernels::norm_project(&x[0], &x[1], &x[2], &x[3], 1e-5).unwrap()),
            Box::new(|x| x[0].layer_norm([x[0].size()[2]], Some(&x[1]), Some(&x[2]), 1e-5, false).matmul(&x[3])),
            vec![h.copy(), gamma, beta, w],
            vec![m, n, n + 2],
        ),
        (
            "rms + projection (mHC)",
            Box::new(|x| native::kernels::rms_project(&x[0], &x[1], x[0].kind()).unwrap()),
            Box::new(|x| {
                let nd = x[0].size()[1] as f64;
                x[0].matmul(&x[1]) / (x[0].norm_scalaropt_dim(2.0, [-1i64], true) / nd.sqrt())
            }),
            vec![h.reshape([m, n * d]), Tensor::randn([n * d, n * n + 2 * n], o) * 0.02],
            vec![m, n * n + 2 * n],
        ),
        (
            "HC pre (norm, proj, read)",
            Box::new(|x| {
                let params: &[Tensor; 8] = x[1..].try_into().unwrap();
                let p = native::kernels::HyperPreParams::from_slice(params, 1e-5);
                let (u, res, post) = native::kernels::hyper_pre(&x[0], &p).unwrap();
                flat_cat(&[u, res, post])
            }),
            Box::new(|x| {
                let normed = x[0].layer_norm([x[0].size()[2]], Some(&x[1]), Some(&x[2]), 1e-5, false);
                let a = &x[5] + normed.matmul(&x[3]).tanh() * &x[7];
                let b = &x[6] + normed.matmul(&x[4]).tanh() * &x[8];
                let n = x[0].size()[1];
                let parts = a.split_with_sizes([1, n], -1);
                let u = native::composite::stream_read_composite(&x[0], &parts[0].squeeze_dim(-1).contiguous());
                flat_cat(&[u, parts[1].contiguous(), b])
            }),
            // h and Hyper-Connections' eight pre-step parameters (γ, β, W_a, w_b, A_static, B_static,
            // s_a, s_b).
            vec![
                h.copy(),
                Tensor::randn([d], o),
                Tensor::randn([d], o),
                Tensor::randn([d, n + 1], o) * 0.1,
                Tensor::randn([d], o) * 0.1,
                Tensor::randn([n, n + 1], o),
                Tensor::randn([n], o),
                Tensor::from(0.3f32),
                Tensor::from(0.2f32),
            ],
            vec![m * d + m * n * n + m * n],
        ),
    ];
    // The fused kernels with the row loops of every instruction set the CPU runs (widest first),
    // and the composite code (Sinkhorn's and the RMS projection's loops are the same in every
    // fused column where they have no per-set copy).
    let mut isas = native::setting::kernel_isas();
    isas.reverse();
    let names: Vec<&str> = isas.iter().map(|i| i.name()).chain(["composite"]).collect();
    let cols = names.len();
    let header: String = names.iter().map(|n| format!(" {n:>9}")).collect();
    println!(
        "fused kernels with the row loops of each instruction set (the default: {})",
        native::setting::kernel_isa().name()
    );
    println!("{:<26}{header}  {header}", "operation");
    println!("{:<26} {:^w$}   {:^w$}", "", "forward", "forward + backward", w = 10 * cols - 1);
    for (name, fused, composite, inputs, out_shape) in &ops {
        let g = Tensor::randn(out_shape.as_slice(), o);
        let mut variants: Vec<Box<dyn Fn() -> (f64, f64) + '_>> = isas
            .iter()
            .map(|&isa| {
                let g = &g;
                Box::new(move || {
                    native::setting::with_kernel_isa(isa, || forward_and_backward(fused.as_ref(), inputs, g))
                }) as Box<dyn Fn() -> (f64, f64)>
            })
            .collect();
        variants.push(Box::new(|| forward_and_backward(composite.as_ref(), inputs, &g)));
        let mut best = vec![(f64::INFINITY, f64::INFINITY); cols];
        for _ in 0..3 {
            for (b, v) in best.iter_mut().zip(&variants) {
                let (f, fb) = v();
                *b = (b.0.min(f), b.1.min(fb));
            }
        }
        let fwd: String = best.iter().map(|b| format!(" {:>9.3}", b.0)).collect();
        let both: String = best.iter().map(|b| format!(" {:>9.3}", b.1)).collect();
        println!("{name:<26}{fwd}  {both}");
    }
}
