//! Helpers shared by topologies: connectivity of stream-based rules, option parsing.

use tch::{Kind, Tensor};

/// Effective connectivity of a *stream* topology `s_j = f_j(s_{j-1}) + Σ_{i<j} w[i][j] · s_i`
/// (`s_0 = x0`, unit `j` reads `s_{j-1}`, the readout reads `s_L`).
///
/// Writing every stream as a combination of unit outputs, `s_j = Σ_i M[i][j] h_i` with
/// `M[:, j] = e_j + Σ_{i<j} w[i][j] M[:, i]`, gives `C[i][k] = M[i][k-1]` for `k = 1..=L+1`.
///
/// `w`: `(L+1) × (L+1)` row-major, only `i < j` entries are read. Returns `[(L+2), (L+2)]` f64.
pub fn stream_connectivity(w: &[Vec<f64>]) -> Tensor {
    let n = w.len(); // L + 1 stream nodes
    let mut m = vec![vec![0.0f64; n]; n];
    for j in 0..n {
        m[j][j] = 1.0;
        for i in 0..j {
            if w[i][j] != 0.0 {
                for row in m.iter_mut() {
                    row[j] += w[i][j] * row[i];
                }
            }
        }
    }
    let size = n + 1;
    let mut c = vec![0.0f64; size * size];
    for k in 1..size {
        for i in 0..k {
            c[i * size + k] = m[i][k - 1];
        }
    }
    Tensor::from_slice(&c).view([size as i64, size as i64])
}

/// A 2-D f64 CPU tensor as nested vectors.
pub fn to_rows(t: &Tensor) -> Vec<Vec<f64>> {
    let t = t
        .to_kind(Kind::Double)
        .to_device(tch::Device::Cpu)
        .contiguous();
    let (r, c) = (t.size()[0] as usize, t.size()[1] as usize);
    let flat = Vec::<f64>::try_from(t.view([-1])).expect("f64 tensor");
    (0..r).map(|i| flat[i * c..(i + 1) * c].to_vec()).collect()
}

/// Parses a shortcut written `i:j` (identity from the output of node i added to the output of
/// node j), checking `0 ≤ i < j ≤ L`.
pub fn parse_edge(s: &str, depth: usize) -> Result<(usize, usize), String> {
    let allowed = format!("an edge `i:j` with integers 0 ≤ i < j ≤ {depth} (the depth)");
    let (a, b) = s.split_once(':').ok_or_else(|| allowed.clone())?;
    let i: usize = a.trim().parse().map_err(|_| allowed.clone())?;
    let j: usize = b.trim().parse().map_err(|_| allowed.clone())?;
    if i < j && j <= depth {
        Ok((i, j))
    } else {
        Err(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_weights_give_all_ones() {
        let l = 3;
        let mut w = vec![vec![0.0; l + 1]; l + 1];
        for j in 1..=l {
            w[j - 1][j] = 1.0;
        }
        let c = to_rows(&stream_connectivity(&w));
        for (i, row) in c.iter().enumerate() {
            for (k, v) in row.iter().enumerate().skip(1) {
                assert_eq!(*v, if i < k { 1.0 } else { 0.0 }, "C[{i}][{k}]");
            }
        }
    }

    #[test]
    fn edges_are_checked() {
        assert_eq!(parse_edge("0:2", 3), Ok((0, 2)));
        assert!(parse_edge("0:5", 3).is_err());
        assert!(parse_edge("2:1", 3).is_err());
        assert!(parse_edge("a:b", 3).is_err());
    }
}
