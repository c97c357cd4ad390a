//! The composite libtorch code of the operations plexus' kernels fuse: what runs where no kernel
//! applies (or under `PLEXUS_FUSED_KERNELS=0`), the same values; the tests hold the kernels to it.

use tch::{Kind, Tensor};

/// `stream_read` in libtorch operators: `pre [.., 1, n] @ H [.., n, D]`, one (batched) matmul
/// that reads H once, instead of `(pre ⊗ 1) * H` (an `[.., n, D]` temporary, forward and
/// backward) and a sum.
pub fn stream_read_composite(h: &Tensor, pre: &Tensor) -> Tensor {
    pre.unsqueeze(-2).matmul(h).squeeze_dim(-2)
}

/// `stream_write` in libtorch operators: `resᵀ H` as a (batched) matmul with the rank-1 term
/// fused into one addcmul (`post [.., n, 1]` times `o [.., 1, D]` added to the `[.., n, D]` matmul
/// output), not a materialised outer product and a separate add. (A `baddbmm` with the outer
/// product as a k = 1 bmm measured slower on CPU: its batch operands are stride-0 expansions for
/// static mixing.)
pub fn stream_write_composite(h: &Tensor, res: &Tensor, post: &Tensor, o: &Tensor) -> Tensor {
    res.transpose(-1, -2).matmul(h).addcmul(&post.unsqueeze(-1), &o.unsqueeze(-2))
}

/// `sinkhorn` in libtorch operators, in the log domain: normalising the rows of `exp(L)` is a
/// softmax over each row of `L`, so each half-iteration is one `log_softmax` — one kernel forward
/// and one backward — where a sum and a division take two forward and about five backward. On a
/// GPU, where these `[.., n, n]` tensors are tiny and every kernel is a launch, that matters when
/// the CUDA kernel cannot run.
///
/// The kernels iterate on `exp(L − rowmax)` instead, where a column whose every entry underflows
/// is 0 and stays 0 (a log-domain iteration would spread it to 1/n): such columns are found once
/// (`exp(L − rowmax)` summing to 0 over the column) and held at `−10³⁰` after every column
/// normalisation, so that they carry no mass into the row sums and end at exactly 0. Composite,
/// CPU kernel and CUDA kernel then give the same matrix and gradient on saturated logits too
/// (tested), at one more kernel per iteration (an addition, whose backward is free).
pub fn sinkhorn_composite(logits: &Tensor, iters: usize) -> Tensor {
    let mut l = logits.to_kind(Kind::Float);
    let dead = tch::no_grad(|| {
        let x = (&l - l.amax([-1i64], true)).exp();
        x.sum_dim_intlist(-2, true, Kind::Float).eq(0.0).to_kind(Kind::Float) * -1e30
    });
    for _ in 0..iters {
        l = l.log_softmax(-1, Kind::Float).log_softmax(-2, Kind::Float) + &dead;
    }
    l.exp()
}
