//! Episode replay with hindsight goals from the future of the same trajectory (Eysenbach et al.
//! 2022): a sample is `(s_t, a_t, g = s_{t+k})` with `P(k) ∝ γ^(k−1)`, `1 ≤ k ≤ T − t` (a
//! discounted, truncated geometric offset). Host-side `Vec<f32>`s; a ring of whole episodes.

use super::RlRng;
use rand::Rng;

pub struct Replay {
    /// Steps per episode `T`.
    len: usize,
    capacity: usize,
    /// States `[capacity, T + 1, 2]`: `s_0 … s_T` (`s_T` is the state after the last action).
    states: Vec<f32>,
    /// Actions `[capacity, T, 2]`.
    actions: Vec<f32>,
    /// Episodes stored (≤ capacity) and the next slot to write.
    stored: usize,
    next: usize,
}

/// A sampled batch, `[B, 2]` each, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub states: Vec<f32>,
    pub actions: Vec<f32>,
    pub goals: Vec<f32>,
}

impl Replay {
    /// Bytes of a buffer of `capacity` episodes of `episode_length` steps (`None` if it overflows).
    pub fn bytes(episode_length: usize, capacity: usize) -> Option<u64> {
        let per_episode = (episode_length as u64).checked_mul(4)?.checked_add(2)?;
        (capacity as u64).checked_mul(per_episode)?.checked_mul(std::mem::size_of::<f32>() as u64)
    }

    /// An empty buffer; an error, not an abort, when the memory cannot be had.
    pub fn new(episode_length: usize, capacity: usize) -> anyhow::Result<Self> {
        let zeros = |n: usize| -> anyhow::Result<Vec<f32>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|e| {
                anyhow::anyhow!(
                    "allocating the replay buffer ({capacity} episodes of {episode_length} steps, {n} floats): {e}"
                )
            })?;
            v.resize(n, 0.0);
            Ok(v)
        };
        Ok(Self {
            len: episode_length,
            capacity,
            states: zeros(capacity * (episode_length + 1) * 2)?,
            actions: zeros(capacity * episode_length * 2)?,
            stored: 0,
            next: 0,
        })
    }

    /// The number of episodes stored (at most the capacity; the oldest are overwritten).
    pub fn episodes(&self) -> usize {
        self.stored
    }

    /// Adds `N` episodes recorded in step order: `states` `[T + 1, N, 2]` (`s_0` first),
    /// `actions` `[T, N, 2]`.
    pub fn add_rollout(&mut self, states: &[f32], actions: &[f32], n: usize) {
        let t = self.len;
        assert_eq!((states.len(), actions.len()), ((t + 1) * n * 2, t * n * 2), "rollout shapes");
        for e in 0..n {
            let slot = self.next;
            for k in 0..=t {
                let dst = (slot * (t + 1) + k) * 2;
                self.states[dst..dst + 2].copy_from_slice(&states[(k * n + e) * 2..(k * n + e) * 2 + 2]);
            }
            for k in 0..t {
                let dst = (slot * t + k) * 2;
                self.actions[dst..dst + 2].copy_from_slice(&actions[(k * n + e) * 2..(k * n + e) * 2 + 2]);
            }
            self.next = (self.next + 1) % self.capacity;
            self.stored = (self.stored + 1).min(self.capacity);
        }
    }

    /// The stored episodes for a checkpoint: states `[capacity·(T+1)·2]`, actions
    /// `[capacity·T·2]` (f32, whole buffers), and `(stored, next)`.
    pub fn contents(&self) -> (&[f32], &[f32], usize, usize) {
        (&self.states, &self.actions, self.stored, self.next)
    }

    /// Restores [`Replay::contents`]; an error if the buffers are for another size.
    pub fn restore(&mut self, states: Vec<f32>, actions: Vec<f32>, stored: usize, next: usize) -> anyhow::Result<()> {
        anyhow::ensure!(
            states.len() == self.states.len()
                && actions.len() == self.actions.len()
                && stored <= self.capacity
                && next < self.capacity.max(1),
            "the saved replay buffer ({} state values, {stored} episodes) does not fit this run's ({} values, \
             capacity {})",
            states.len(),
            self.states.len(),
            self.capacity
        );
        (self.states, self.actions, self.stored, self.next) = (states, actions, stored, next);
        Ok(())
    }

    /// The offset `k ∈ 1..=n` with `P(k) ∝ γ^(k−1)` (inverse CDF of the truncated geometric).
    pub fn future_offset(u: f64, gamma: f64, n: usize) -> usize {
        if n <= 1 || gamma <= 0.0 {
            return 1;
        }
        if gamma >= 1.0 {
            return ((u * n as f64).floor() as usize + 1).min(n);
        }
        // F(k) = (1 − γ^k) / (1 − γ^n); the smallest k with F(k) > u.
        let k = ((1.0 - u * (1.0 - gamma.powi(n as i32))).ln() / gamma.ln()).floor() as usize + 1;
        k.clamp(1, n)
    }

    /// `b` samples: uniform episode and step, hindsight goal `γ`-discounted from the future.
    pub fn sample(&self, b: usize, gamma: f64, rng: &mut RlRng) -> Batch {
        assert!(self.stored > 0, "sampling from an empty replay buffer");
        let t_len = self.len;
        let mut out = Batch {
            states: Vec::with_capacity(2 * b),
            actions: Vec::with_capacity(2 * b),
            goals: Vec::with_capacity(2 * b),
        };
        for _ in 0..b {
            let e = rng.gen_range(0..self.stored);
            let t = rng.gen_range(0..t_len);
            let k = Self::future_offset(rng.gen::<f64>(), gamma, t_len - t);
            let s = (e * (t_len + 1) + t) * 2;
            let g = (e * (t_len + 1) + t + k) * 2;
            let a = (e * t_len + t) * 2;
            out.states.extend_from_slice(&self.states[s..s + 2]);
            out.actions.extend_from_slice(&self.actions[a..a + 2]);
            out.goals.extend_from_slice(&self.states[g..g + 2]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn future_offsets_follow_the_truncated_geometric() {
        let (gamma, n, draws) = (0.8f64, 5usize, 20_000);
        let mut counts = [0usize; 5];
        for i in 0..draws {
            let u = (i as f64 + 0.5) / draws as f64;
            counts[Replay::future_offset(u, gamma, n) - 1] += 1;
        }
        let z: f64 = (0..n).map(|k| gamma.powi(k as i32)).sum();
        for k in 0..n {
            let want = gamma.powi(k as i32) / z;
            let got = counts[k] as f64 / draws as f64;
            assert!((got - want).abs() < 1e-3, "k={}: {got} vs {want}", k + 1);
        }
        assert_eq!(Replay::future_offset(0.99, 0.0, 7), 1);
        assert_eq!(Replay::future_offset(0.99, 1.0, 7), 7);
    }
}
