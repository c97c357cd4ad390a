//! The heatmap panels of the connectivity figures: C itself, ANCRe's `log(p_ij / max_i p_ij)`, a
//! width rule's stream mixing per unit and MUDD's C per way.

use super::Heatmap;
use anyhow::Result;
use std::path::Path;

pub(super) fn node_labels(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            if i == 0 {
                "emb".into()
            } else if i + 1 == n {
                "out".into()
            } else {
                i.to_string()
            }
        })
        .collect()
}

/// C as a heatmap panel: rows = sources (embedding, units), columns = targets (units, readout);
/// the entries `absent` (i, j) of C that the wiring does not have drawn as no edge.
pub(super) fn c_panel(c: &crate::run_dir::Matrix, title: String, absent: &[(usize, usize)]) -> Heatmap {
    let n = c.nrows();
    let labels = node_labels(n);
    let values =
        ndarray::Array2::from_shape_fn((n - 1, n - 1), |(i, j)| if i < j + 1 { c[[i, j + 1]] } else { f64::NAN });
    let range = {
        let v = values.iter().filter(|v| v.is_finite());
        v.fold((0.0f64, 1.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)))
    };
    Heatmap {
        title,
        annotate: n <= 14,
        values,
        row_labels: labels[..n - 1].to_vec(),
        col_labels: labels[1..].to_vec(),
        x_label: "target node".into(),
        y_label: "source node".into(),
        colorbar_label: "connection strength C".into(),
        // Anchored at 0 and at least 1 (the identity shortcut), so "all ones" reads as full strength.
        range: Some(range),
        absent: absent.iter().filter(|&&(_, j)| j >= 1 && j < n).map(|&(i, j)| (i, j - 1)).collect(),
    }
}

/// ANCRe's `log(p_ij / max_i p_ij)` at step `s` as a heatmap panel: each state's coefficients
/// against the largest into the same target.
pub(super) fn ancre_panel(p: &crate::run_dir::Matrix, s: u64) -> Heatmap {
    let n = p.nrows();
    let mut values = ndarray::Array2::from_elem((n - 1, n - 1), f64::NAN);
    for j in 1..n {
        let max = (0..j).map(|i| p[[i, j]]).fold(f64::MIN, f64::max);
        for i in 0..j {
            values[[i, j - 1]] = (p[[i, j]] / max).ln();
        }
    }
    Heatmap {
        title: format!("step {s}"),
        annotate: n <= 14,
        values,
        row_labels: (0..n - 1).map(|i| format!("s{i}")).collect(),
        col_labels: (1..n).map(|j| format!("s{j}")).collect(),
        x_label: "target state j".into(),
        y_label: "source state i".into(),
        colorbar_label: "log(pᵢⱼ / maxᵢ pᵢⱼ)".into(),
        range: None,
        absent: Vec::new(),
    }
}

/// How many square `n × n` blocks (n = the columns, at least `min`) a matrix read from `file`
/// stacks, or an error that says what it should be (`shape`) and what it is.
fn square_blocks(m: &crate::run_dir::Matrix, file: &Path, min: usize, shape: &str) -> Result<usize> {
    let n = m.ncols();
    anyhow::ensure!(
        n >= min && m.nrows() > 0 && m.nrows().is_multiple_of(n),
        "{}: {shape}, this one is {}×{n} (a truncated file?)",
        file.display(),
        m.nrows()
    );
    Ok(m.nrows() / n)
}

/// A width rule's stream mixing `[L·n, n]` (see [`crate::topology::STREAM_MIXING_VIEWS`]) as one
/// `n × n` panel per unit: row s, column t = the weight of stream s in the new stream t. The first,
/// middle and last units are drawn (with C: four panels, one row of a page or two of a column);
/// every unit's is in the run's `params/` file.
pub(super) fn stream_panels(m: &crate::run_dir::Matrix, file: &Path) -> Result<Vec<Heatmap>> {
    let (n, units) = (m.ncols(), square_blocks(m, file, 1, "a stream mixing is L·n rows of n columns")?);
    let mut shown = vec![0, (units - 1) / 2, units - 1];
    shown.dedup();
    let streams: Vec<String> = (1..=n).map(|s| s.to_string()).collect();
    Ok(shown
        .into_iter()
        .map(|k| Heatmap {
            title: format!("unit {}", k + 1),
            annotate: n <= 4,
            values: m.slice(ndarray::s![k * n..(k + 1) * n, ..]).to_owned(),
            row_labels: streams.clone(),
            col_labels: streams.clone(),
            x_label: "to stream".into(),
            y_label: "from stream".into(),
            colorbar_label: "weight".into(),
            range: None,
            absent: Vec::new(),
        })
        .collect())
}

/// MUDD's C per way `[W·(L+2), L+2]` ([`crate::topology::mudd::WAYS_VIEW`]) as one C panel per
/// way, side by side on one colour scale: what each of the block's inputs (query, key, value,
/// residual) reads.
pub(super) fn way_panels(m: &crate::run_dir::Matrix, file: &Path) -> Result<Vec<Heatmap>> {
    let (n, ways) = (m.ncols(), square_blocks(m, file, 2, "C per way is W·(L+2) rows of L+2 columns")?);
    let names: &[&str] =
        if ways == crate::topology::mudd::WAYS.len() { &crate::topology::mudd::WAYS } else { &["block"] };
    let mut panels: Vec<Heatmap> = (0..ways)
        .map(|w| {
            let c = m.slice(ndarray::s![w * n..(w + 1) * n, ..]).to_owned();
            c_panel(&c, format!("{} input", names.get(w).copied().unwrap_or("way")), &[])
        })
        .collect();
    let range = panels.iter().filter_map(|p| p.range).fold((0.0f64, 1.0f64), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)));
    for p in &mut panels {
        p.range = Some(range);
    }
    Ok(panels)
}
