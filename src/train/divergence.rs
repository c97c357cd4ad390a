//! The divergence guard of both trainers (`plexus train`'s step, `plexus rl`'s updates): which
//! step or update first made one of the watched numbers non-finite, and which of them, recorded on
//! the device in place — no host read in the step, capturable in a CUDA graph — and read with
//! whatever else the trainer reads anyway (the train step's logging read, the RL loop's read per
//! rollout).

use tch::{Device, Kind, Tensor};

/// The first non-finite step (or update) and what went non-finite there, in the watched order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diverged {
    pub index: u64,
    pub what: Vec<&'static str>,
}

impl Diverged {
    /// The first watched number that went non-finite (a non-finite loss usually takes the
    /// gradient with it: the loss is what to name).
    pub fn first(&self) -> &'static str {
        self.what[0]
    }
}

/// Watches `names.len()` numbers each step; keeps the first step at which any is non-finite.
pub struct DivergenceGuard {
    names: &'static [&'static str],
    /// `[first non-finite index or −1, then per watched number 1 if it was non-finite there]`,
    /// int64 [1 + names.len()] on the device.
    record: Tensor,
    /// The index the next [`DivergenceGuard::record`] is at, 0-dim int64 on the device.
    index: Tensor,
}

impl DivergenceGuard {
    /// A guard of the numbers `names` (each as a message names it: "the loss"), on `device`.
    pub fn new(names: &'static [&'static str], device: Device) -> Self {
        let mut init = vec![-1i64];
        init.extend(std::iter::repeat_n(0, names.len()));
        let record = Tensor::from_slice(&init).to_device(device);
        Self { names, record, index: Tensor::zeros([], (Kind::Int64, device)) }
    }

    /// Sets the index of what is recorded next (a fill on the device, no copy from the host).
    pub fn at(&mut self, index: u64) {
        tch::no_grad(|| {
            let _ = self.index.fill_(index as i64);
        });
    }

    /// Records the watched numbers at the current index, in place: `values` holds them in the
    /// order of `names`, as 0-dim tensors or one [names.len()] tensor, any float dtype.
    pub fn record(&mut self, values: &[&Tensor]) {
        let flat: Vec<Tensor> = values.iter().map(|v| v.view([-1])).collect();
        self.record_rows(&Tensor::cat(&flat, 0).view([1, -1]));
    }

    /// Records several steps at once, in place: `rows` [steps, names.len()] holds the watched
    /// numbers of steps index, index + 1, … (the RL loop's updates of one rollout, recorded after
    /// it: one record per rollout, not per update).
    pub fn record_rows(&mut self, rows: &Tensor) {
        tch::no_grad(|| {
            let bad = rows.isfinite().logical_not();
            debug_assert_eq!(bad.size()[1], self.names.len() as i64);
            let bad_row = bad.any_dim(1, false);
            // The first row with a non-finite number (argmax takes the first of equal maxima).
            let first = bad_row.to_kind(Kind::Int64).argmax(0, false);
            let at = (&self.index + &first).where_scalarother(&bad_row.any(), -1i64).view([1]);
            let now = Tensor::cat(&[at, bad.index_select(0, &first.view([1])).view([-1]).to_kind(Kind::Int64)], 0);
            let seen = self.record.get(0).ge(0);
            let kept = self.record.where_self(&seen, &now);
            self.record.copy_(&kept);
        })
    }

    /// The record, to be read with other numbers in one read ([`DivergenceGuard::decode`] reads
    /// its values) or kept at a stable address (a CUDA graph's tensors).
    pub fn record_tensor(&self) -> &Tensor {
        &self.record
    }

    /// The index tensor (a CUDA graph's tensors).
    pub fn index_tensor(&self) -> &Tensor {
        &self.index
    }

    /// What the record's values (`1 + names.len()` of them, as read) say.
    pub fn decode(&self, v: &[f64]) -> Option<Diverged> {
        (v[0] >= 0.0).then(|| Diverged {
            index: v[0] as u64,
            what: self.names.iter().zip(&v[1..]).filter(|(_, b)| **b != 0.0).map(|(n, _)| *n).collect(),
        })
    }

    /// Reads the record (one host read).
    pub fn read(&self) -> Option<Diverged> {
        self.decode(&crate::host::values(&self.record.to_kind(Kind::Double)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: &[&str] = &["the loss", "the gradient"];

    fn scalar(v: f64) -> Tensor {
        Tensor::from(v)
    }

    /// The first non-finite index is kept, with what went non-finite there; later ones, and the
    /// finite steps around them, change nothing.
    #[test]
    fn the_guard_keeps_the_first_non_finite_step_and_what_it_was() {
        let mut g = DivergenceGuard::new(NAMES, Device::Cpu);
        for (i, (loss, grad)) in [(1.0, 2.0), (0.5, 1.0)].into_iter().enumerate() {
            g.at(i as u64);
            g.record(&[&scalar(loss), &scalar(grad)]);
        }
        assert_eq!(g.read(), None);
        g.at(7);
        g.record(&[&scalar(0.3), &scalar(f64::INFINITY)]);
        g.at(8);
        g.record(&[&scalar(f64::NAN), &scalar(f64::NAN)]);
        g.at(9);
        g.record(&[&scalar(0.1), &scalar(0.1)]);
        let d = g.read().unwrap();
        assert_eq!(d, Diverged { index: 7, what: vec!["the gradient"] });
        assert_eq!(d.first(), "the gradient");
    }

    /// One tensor of several numbers (the RL updates' statistics), fp32: every non-finite one
    /// named, in the watched order.
    #[test]
    fn the_guard_names_every_non_finite_number_of_a_vector() {
        const STATS: &[&str] = &["a", "b", "c"];
        let mut g = DivergenceGuard::new(STATS, Device::Cpu);
        g.at(3);
        g.record(&[&Tensor::from_slice(&[f32::NAN, 1.0, f32::NEG_INFINITY])]);
        assert_eq!(g.read(), Some(Diverged { index: 3, what: vec!["a", "c"] }));
        let v = crate::host::values(&g.record_tensor().to_kind(Kind::Double));
        assert_eq!(g.decode(&v), g.read());
    }

    /// Several steps at once: the first row with a non-finite number gives the index (the
    /// rows' start plus its position) and what went non-finite there; all finite rows change
    /// nothing.
    #[test]
    fn rows_of_several_steps_keep_the_first_non_finite_one() {
        const STATS: &[&str] = &["a", "b"];
        let mut g = DivergenceGuard::new(STATS, Device::Cpu);
        g.at(10);
        g.record_rows(&Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).view([2, 2]));
        assert_eq!(g.read(), None);
        g.at(12);
        g.record_rows(&Tensor::from_slice(&[1.0f32, 2.0, 3.0, f32::NAN, f32::INFINITY, f32::NAN]).view([3, 2]));
        assert_eq!(g.read(), Some(Diverged { index: 13, what: vec!["b"] }));
        g.at(20);
        g.record_rows(&Tensor::from_slice(&[f32::NAN, 1.0]).view([1, 2]));
        assert_eq!(g.read().unwrap().index, 13, "the first divergence is kept");
    }
}
