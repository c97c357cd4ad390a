//! [`InMemory`]: a labelled set held in memory (MNIST family, CIFAR-10, synthetic images), its
//! seeded epoch permutations ([`epoch_permutation`], also used by the streamed image folder), and
//! residency on the training device.

use super::{Batch, DataSource, InputTransform};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tch::{Device, Kind, Tensor};

/// A labelled set held in memory: every epoch is a fresh permutation drawn from `(seed, epoch)`,
/// cut into `batch`-sized batches (the incomplete tail is dropped).
pub struct InMemory {
    /// Raw inputs `[n, ..]` (uint8 pixels for image datasets) and labels `[n]`.
    pub x: Tensor,
    pub y: Tensor,
    /// Held-out `(inputs, labels)`.
    pub eval: (Tensor, Tensor),
    pub batch: usize,
    pub seed: u64,
    /// Raw input → model input, on the device.
    pub transform: InputTransform,
    /// The held-out rows as the dataset's files number them ([`DataSource::eval_record`], less the
    /// batch size, which is added here); `None` where they are not recorded.
    pub eval_rows: Option<serde_yaml::Mapping>,
    /// The dataset's files the arrays were read from ([`DataSource::files`]).
    pub files: Vec<std::path::PathBuf>,
}

/// The permutation of `n` samples for `epoch`, a pure function of `(seed, epoch)`.
pub fn epoch_permutation(n: usize, seed: u64, epoch: u64) -> Vec<i64> {
    let mut idx: Vec<i64> = (0..n as i64).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ epoch);
    idx.shuffle(&mut rng);
    idx
}

impl DataSource for InMemory {
    fn train_batch(&self, index: u64) -> anyhow::Result<Batch> {
        let n = self.x.size()[0] as usize;
        let per_epoch = self.batches_per_epoch();
        let (epoch, b) = (index / per_epoch, (index % per_epoch) as usize);
        let perm = epoch_permutation(n, self.seed, epoch);
        let sel = Tensor::from_slice(&perm[b * self.batch..(b + 1) * self.batch]);
        // Resident on a GPU: the indices go over asynchronously from pinned memory and the
        // gather runs there.
        let dev = self.x.device();
        let sel = if dev.is_cuda() { crate::native::process_group::pin_memory(&sel)? } else { sel };
        let sel = sel.to_device_(self.x.device(), Kind::Int64, true, false);
        Ok(Batch { input: self.x.index_select(0, &sel), target: self.y.index_select(0, &sel) })
    }
    fn input_transform(&self) -> InputTransform {
        self.transform.clone()
    }
    fn files(&self) -> Vec<std::path::PathBuf> {
        self.files.clone()
    }

    fn eval_record(&self) -> Option<serde_yaml::Mapping> {
        let mut m = self.eval_rows.clone()?;
        m.insert("batch_size".into(), (self.batch as u64).into());
        Some(m)
    }
    fn make_resident(&mut self, device: Device) -> bool {
        let to = |t: &Tensor| t.to_device(device);
        (self.x, self.y) = (to(&self.x), to(&self.y));
        self.eval = (to(&self.eval.0), to(&self.eval.1));
        true
    }
    fn batches_per_epoch(&self) -> u64 {
        (self.x.size()[0] as usize / self.batch).max(1) as u64
    }
    fn eval_batches(&self) -> Vec<Batch> {
        let n = self.eval.0.size()[0];
        let b = self.batch as i64;
        (0..n)
            .step_by(self.batch)
            .map(|s| {
                let len = b.min(n - s);
                Batch { input: self.eval.0.narrow(0, s, len), target: self.eval.1.narrow(0, s, len) }
            })
            .collect()
    }
}
