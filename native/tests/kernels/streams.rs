//! The multi-stream read and write: the fused CPU kernels (every instruction set the machine runs)
//! and the CUDA kernels' host build (`native/src/streams.cu`) against the composite versions.

use plexus_native::choice::{self, stream_read, stream_write};
use plexus_native::composite::{stream_read_composite, stream_write_composite};
use plexus_native::{kernels, setting};
use tch::{Device, Kind, Tensor};

/// Every input gradient of `<f(inputs), g>`, with the value.
fn value_and_grads(f: impl Fn(&[Tensor]) -> Tensor, inputs: &[Tensor], g: &Tensor) -> Vec<Tensor> {
    let xs: Vec<Tensor> = inputs.iter().map(|t| t.detach().set_requires_grad(true)).collect();
    let y = f(&xs);
    (&y * g).sum(y.kind()).backward();
    std::iter::once(y.detach()).chain(xs.iter().map(|x| x.grad())).collect()
}

/// The error model of both ops. The read `u = Σᵢ preᵢ Hᵢ` and the write `H' = res H + post ⊗ o`
/// are multilinear, so each output and each input gradient is a sum of K products of the inputs
/// (and the output gradient). Summed in any order, such a sum in unit roundoff u is within
/// γ_K = K u / (1 − K u) of the sum of the terms' magnitudes (Higham, *Accuracy and Stability of
/// Numerical Algorithms*, §3.1), and that magnitude is the same computation on |inputs| and |g|.
/// Two computations in different orders, as a kernel and the composite are, differ elementwise
/// by at most 2 γ_K Σ|terms|: this checks that, and says by how much of the bound they differ.
fn assert_within_error_model(got: &[Tensor], want: &[Tensor], magnitude: &[Tensor], terms: i64, what: &str) {
    for (i, ((a, b), m)) in got.iter().zip(want).zip(magnitude).enumerate() {
        assert_eq!(a.size(), b.size(), "{what}: output {i}");
        let u = match b.kind() {
            Kind::Double => f64::EPSILON / 2.0,
            Kind::Float => f64::from(f32::EPSILON) / 2.0,
            kind => panic!("{what}: no unit roundoff for {kind:?}"),
        };
        // One more product than terms: the products' own roundings.
        let k = (terms + 1) as f64;
        let gamma = k * u / (1.0 - k * u);
        let bound = m.to_kind(Kind::Double).abs() * (2.0 * gamma) + f64::from(f32::MIN_POSITIVE);
        let ratio = ((a.to_kind(Kind::Double) - b.to_kind(Kind::Double)).abs() / bound).max().double_value(&[]);
        assert!(
            ratio <= 1.0,
            "{what}: output {i} (0 = value, then the inputs' gradients) off by {ratio:.3} of its bound 2γ_K Σ|terms| \
             (K = {terms})"
        );
    }
}

/// [`value_and_grads`] on the inputs' and the output gradient's magnitudes: each element's
/// Σ|terms| for the ops here, which are multilinear.
fn magnitudes(f: impl Fn(&[Tensor]) -> Tensor, inputs: &[Tensor], g: &Tensor) -> Vec<Tensor> {
    let abs: Vec<Tensor> = inputs.iter().map(|t| t.abs()).collect();
    value_and_grads(f, &abs, &g.abs())
}

/// The fused CPU stream kernels against their composite versions, fp64 and fp32, static
/// (`[n]`, `[n, n]`) and per-token mixing: the value and the gradient of every input, with
/// D = 13 and 37 (one and four chunks of the kernels' 8 lanes, and a tail), n = 2, 4, 8 (the
/// one-pass kernels) and 3, 5 (the generic loops), and each instruction set the machine runs
/// (baseline, and AVX2 + FMA where the CPU has it).
#[test]
fn fused_stream_read_and_write_match_the_composite_versions() {
    for isa in setting::kernel_isas() {
        for d in [13i64, 37] {
            setting::with_kernel_isa(isa, || fused_stream_ops_match(d, isa));
        }
    }
}

fn fused_stream_ops_match(d: i64, isa: setting::KernelIsa) {
    tch::manual_seed(2);
    // n = 2, 4, 8: the one-pass kernels; 3, 5: the generic loops.
    let cases = [2i64, 3, 4, 5, 8].into_iter().flat_map(|n| [(n, Kind::Double), (n, Kind::Float)]);
    for (n, kind) in cases {
        let opts = (kind, Device::Cpu);
        let (h, o) = (Tensor::randn([2, 5, n, d], opts), Tensor::randn([2, 5, d], opts));
        let (g_read, g_write) = (Tensor::randn([2, 5, d], opts), Tensor::randn([2, 5, n, d], opts));
        for per_token in [false, true] {
            let lead: &[i64] = if per_token { &[2, 5] } else { &[] };
            let shape = |tail: &[i64]| -> Vec<i64> { lead.iter().chain(tail).copied().collect() };
            let pre = Tensor::randn(shape(&[n]), opts);
            let res = Tensor::randn(shape(&[n, n]), opts);
            let post = Tensor::randn(shape(&[n]), opts);
            assert!(choice::fused_streams_take_all(&[&h, &res, &post, &o]));
            let read_in = [h.copy(), pre.copy()];
            let write_in = [h.copy(), res.copy(), post.copy(), o.copy()];
            // The longest sum in each op: a shared weight's gradient, over every token and D.
            let terms = 10 * d * (n + 1);
            let read_mag = magnitudes(|x| stream_read_composite(&x[0], &x[1]), &read_in, &g_read);
            let write_mag = magnitudes(|x| stream_write_composite(&x[0], &x[1], &x[2], &x[3]), &write_in, &g_write);
            let pairs = [
                (
                    "read",
                    value_and_grads(|x| stream_read(&x[0], &x[1], None), &read_in, &g_read),
                    value_and_grads(|x| stream_read_composite(&x[0], &x[1]), &read_in, &g_read),
                    read_mag,
                ),
                (
                    "write",
                    value_and_grads(|x| stream_write(&x[0], &x[1], &x[2], &x[3], None), &write_in, &g_write),
                    value_and_grads(|x| stream_write_composite(&x[0], &x[1], &x[2], &x[3]), &write_in, &g_write),
                    write_mag,
                ),
            ];
            for (op, fused_out, composite_out, magnitude) in &pairs {
                let what = format!("{isa:?}, D = {d}, n = {n}, {kind:?}, per-token {per_token}, {op}");
                assert_within_error_model(fused_out, composite_out, magnitude, terms, &what);
            }
        }
    }
}

/// The CUDA stream kernels' arithmetic (`native/src/streams.cu`, its per-token functions run on
/// the CPU, a token's block as 1, 7, 16 or 128 threads, more than D = 13 among them) against the
/// composite versions' autograd: every n the kernels take, per-token and shared weights, fp64
/// and fp32, D = 13 and 200: the value and every
/// input's gradient (the per-token weight gradients summed over the tokens for shared weights,
/// as the autograd functions do); and the read's backward adding into a gradient cell.
#[test]
fn the_cuda_stream_kernels_arithmetic_matches_the_composite_versions() {
    tch::manual_seed(4);
    let cases = [(13i64, Kind::Double, 1), (13, Kind::Double, 16), (200, Kind::Double, 7), (200, Kind::Float, 128)];
    for n in 1..=kernels::CUDA_KERNELS_MAX_STREAMS as i64 {
        for (d, kind, threads) in cases {
            let opts = (kind, Device::Cpu);
            let m = 6;
            // The longest sum in each op: a shared weight's gradient, over every token and D.
            let terms = m * d * (n + 1);
            let (h, o) = (Tensor::randn([m, n, d], opts), Tensor::randn([m, d], opts));
            let (gu, g) = (Tensor::randn([m, d], opts), Tensor::randn([m, n, d], opts));
            for per_token in [false, true] {
                let lead: &[i64] = if per_token { &[m] } else { &[] };
                let shape = |tail: &[i64]| -> Vec<i64> { lead.iter().chain(tail).copied().collect() };
                let (pre, res, post) = (
                    Tensor::randn(shape(&[n]), opts),
                    Tensor::randn(shape(&[n, n]), opts),
                    Tensor::randn(shape(&[n]), opts),
                );
                let summed = |t: &Tensor| if per_token { t.shallow_clone() } else { t.sum_dim_intlist(0, false, kind) };
                let read = kernels::streams_host(&h, &[&pre], &gu, threads, None).unwrap();
                // Added into a gradient already there (a stream's gradient cell): the bits of
                // gH₀ + gH (no fused multiply-add), the rest as without.
                let gh0 = Tensor::randn([m, n, d], opts);
                let added = kernels::streams_host(&h, &[&pre], &gu, threads, Some(&gh0)).unwrap();
                assert!(added[1].equal(&(&gh0 + &read[1])), "n = {n}, D = {d}, {kind:?}: gH added to gH₀");
                assert!(added[0].equal(&read[0]) && added[2].equal(&read[2]), "n = {n}: the rest as without");
                let want = value_and_grads(|x| stream_read_composite(&x[0], &x[1]), &[h.copy(), pre.copy()], &gu);
                let got = [read[0].shallow_clone(), read[1].shallow_clone(), summed(&read[2]).view_as(&pre)];
                let write = kernels::streams_host(&h, &[&res, &post, &o], &g, threads, None).unwrap();
                let want_w = value_and_grads(
                    |x| stream_write_composite(&x[0], &x[1], &x[2], &x[3]),
                    &[h.copy(), res.copy(), post.copy(), o.copy()],
                    &g,
                );
                let gres = write[3].narrow(1, 0, n * n).reshape([m, n, n]);
                let gpost = write[3].narrow(1, n * n, n);
                let got_w = [
                    write[0].shallow_clone(),
                    write[1].shallow_clone(),
                    summed(&gres).view_as(&res),
                    summed(&gpost).view_as(&post),
                    write[2].shallow_clone(),
                ];
                let mag = magnitudes(|x| stream_read_composite(&x[0], &x[1]), &[h.copy(), pre.copy()], &gu);
                let mag_w = magnitudes(
                    |x| stream_write_composite(&x[0], &x[1], &x[2], &x[3]),
                    &[h.copy(), res.copy(), post.copy(), o.copy()],
                    &g,
                );
                for (op, got, want, mag) in [("read", &got[..], &want, &mag), ("write", &got_w[..], &want_w, &mag_w)] {
                    let what = format!("n = {n}, D = {d}, {kind:?}, {threads} threads, per-token {per_token}, {op}");
                    assert_within_error_model(got, want, mag, terms, &what);
                }
            }
        }
    }
}

/// Edge shapes through the fused kernels: one stream (n = 1) and no tokens at all (M = 0),
/// static and per-token, forward and backward, against the composite versions.
#[test]
fn fused_stream_ops_take_one_stream_and_no_tokens() {
    for isa in setting::kernel_isas() {
        setting::with_kernel_isa(isa, fused_stream_ops_edge_shapes);
    }
}

fn fused_stream_ops_edge_shapes() {
    let opts = (Kind::Double, Device::Cpu);
    for (m, n, per_token) in [(6i64, 1i64, true), (6, 1, false), (0, 4, true), (0, 4, false)] {
        let lead: &[i64] = if per_token { &[m] } else { &[] };
        let shape = |tail: &[i64]| -> Vec<i64> { lead.iter().chain(tail).copied().collect() };
        let inputs = [
            Tensor::randn([m, n, 5], opts),
            Tensor::randn(shape(&[n, n]), opts),
            Tensor::randn(shape(&[n]), opts),
            Tensor::randn([m, 5], opts),
        ];
        let g = Tensor::randn([m, n, 5], opts);
        let fused = value_and_grads(|x| stream_write(&x[0], &x[1], &x[2], &x[3], None), &inputs, &g);
        let composite = value_and_grads(|x| stream_write_composite(&x[0], &x[1], &x[2], &x[3]), &inputs, &g);
        for (i, (a, b)) in fused.iter().zip(&composite).enumerate() {
            assert_eq!(a.size(), b.size(), "m = {m}, n = {n}: output {i}");
            if a.numel() > 0 {
                let err = (a - b).abs().max().double_value(&[]);
                assert!(err < 1e-12, "m = {m}, n = {n}, per-token {per_token}: output {i} off by {err:e}");
            }
        }
        let gu = Tensor::randn([m, 5], opts);
        let read = value_and_grads(|x| stream_read(&x[0], &x[1], None), &[inputs[0].copy(), inputs[2].copy()], &gu);
        let read_ref =
            value_and_grads(|x| stream_read_composite(&x[0], &x[1]), &[inputs[0].copy(), inputs[2].copy()], &gu);
        for (a, b) in read.iter().zip(&read_ref) {
            assert_eq!(a.size(), b.size());
            assert!(a.numel() == 0 || (a - b).abs().max().double_value(&[]) < 1e-12);
        }
    }
}
