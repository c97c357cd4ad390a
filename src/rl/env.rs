//! A vectorised, deterministic 2-D point-mass maze for goal-reaching (the goal-conditioned RL
//! experiments of ANCRe §5.3, after the point-maze tasks of Eysenbach et al. 2022 and Wang et al.
//! 2025, written in Rust so that it needs no simulator).
//!
//! State: the position `s ∈ [0, 1]²`. Action: `a ∈ [-1, 1]²` (clamped), moving by `max_step · a`.
//! Walls are open axis-aligned rectangles; a move is resolved one axis at a time (x, then y) and
//! clipped where it would enter a wall, so the point slides along a wall and never enters one; the
//! arena `[0, 1]²` bounds it too. Dynamics are deterministic. An episode lasts `episode_length`
//! steps; the reward is 1 while `‖s − g‖₂ ≤ goal_radius`, else 0 (the episode does not stop at the
//! goal). Start and goal are drawn uniformly from the free space (rejection sampling) at every
//! reset, from a per-environment random stream seeded by its seed: environment `i` of a
//! [`VecEnv`] behaves exactly like a one-environment `VecEnv` with the same seed.
//!
//! Everything here runs on the host on `Vec<f32>`s (`[N, 2]` row-major): one call steps all `N`
//! environments.

use super::RlRng;
use rand::{Rng, SeedableRng};

/// An open axis-aligned rectangle `(x0, y0) – (x1, y1)` the point may not enter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Wall {
    pub x0: f32,
    pub y0: f32,
    pub x1: f32,
    pub y1: f32,
}

impl Wall {
    /// Whether `(x, y)` lies strictly inside.
    pub fn contains(&self, x: f32, y: f32) -> bool {
        x > self.x0 && x < self.x1 && y > self.y0 && y < self.y1
    }

    /// Whether the segment from `a` to `b` passes through the wall's interior (Liang–Barsky
    /// clipping of the segment against the rectangle; touching a face does not count).
    pub fn crosses(&self, a: [f32; 2], b: [f32; 2]) -> bool {
        let d = [b[0] - a[0], b[1] - a[1]];
        let (mut t0, mut t1) = (0.0f32, 1.0f32);
        for (p, q) in [(-d[0], a[0] - self.x0), (d[0], self.x1 - a[0]), (-d[1], a[1] - self.y0), (d[1], self.y1 - a[1])]
        {
            if p == 0.0 {
                if q <= 0.0 {
                    return false;
                }
            } else {
                let r = q / p;
                if p < 0.0 {
                    t0 = t0.max(r);
                } else {
                    t1 = t1.min(r);
                }
            }
        }
        t0 < t1
    }
}

/// Whether a wall stands on the straight line from `a` to `b`.
pub fn sight_blocked(walls: &[Wall], a: [f32; 2], b: [f32; 2]) -> bool {
    walls.iter().any(|w| w.crosses(a, b))
}

/// The maze layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// No walls: the unit square.
    Open,
    /// A U-maze: a wall from the left edge to `x = 0.7` across the middle (`0.4 < y < 0.6`), so
    /// that the lower-left and upper-left corners are connected only around its right end.
    U,
    /// A serpentine: three walls, alternately from the left and the right edge, leave four
    /// corridors joined at alternate ends, so that going from the bottom corridor to the top one
    /// takes three turns. The straight line to the goal is blocked on most tasks (about 7 in 10).
    Serpentine,
}

impl Layout {
    /// The layout's walls, as rectangles in the unit square (none in the open room).
    pub fn walls(self) -> Vec<Wall> {
        match self {
            Layout::Open => Vec::new(),
            Layout::U => vec![Wall { x0: 0.0, y0: 0.4, x1: 0.7, y1: 0.6 }],
            Layout::Serpentine => vec![
                Wall { x0: 0.0, y0: 0.2, x1: 0.75, y1: 0.26 },
                Wall { x0: 0.25, y0: 0.47, x1: 1.0, y1: 0.53 },
                Wall { x0: 0.0, y0: 0.74, x1: 0.75, y1: 0.8 },
            ],
        }
    }
}

/// The environment's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvSpec {
    pub layout: Layout,
    /// Largest move per step (per axis), in units of the arena side.
    pub max_step: f32,
    /// Reward radius ε around the goal.
    pub goal_radius: f32,
    /// Steps per episode.
    pub episode_length: usize,
}

/// What one step returns, for all `N` environments.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOut {
    /// Positions after the step, `[N, 2]`.
    pub obs: Vec<f32>,
    /// Reward (1 within `goal_radius` of the goal, else 0), `[N]`.
    pub reward: Vec<f32>,
    /// Whether the episode ended with this step (then every environment has been reset, and
    /// `obs` holds the last positions of the finished episode, not the new starts).
    pub done: bool,
}

/// The evolving part of a [`VecEnv`] (checkpoints).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EnvState {
    pub pos: Vec<f32>,
    pub goal: Vec<f32>,
    pub t: usize,
    pub rngs: Vec<RlRng>,
}

/// `N` maze environments stepped together, each with its own random stream.
pub struct VecEnv {
    pub spec: EnvSpec,
    walls: Vec<Wall>,
    rngs: Vec<RlRng>,
    /// Positions `[N, 2]`.
    pos: Vec<f32>,
    /// Goals `[N, 2]`.
    goal: Vec<f32>,
    /// Steps taken in the current episode.
    t: usize,
}

impl VecEnv {
    /// One environment per seed, each reset once.
    pub fn new(spec: EnvSpec, seeds: &[u64]) -> Self {
        let walls = spec.layout.walls();
        let n = seeds.len();
        let mut env = Self {
            spec,
            walls,
            rngs: seeds.iter().map(|&s| RlRng::seed_from_u64(s)).collect(),
            pos: vec![0.0; 2 * n],
            goal: vec![0.0; 2 * n],
            t: 0,
        };
        env.reset();
        env
    }

    /// Seeds `base, base+1, …` for `n` environments.
    pub fn seeds(base: u64, n: usize) -> Vec<u64> {
        (0..n as u64).map(|i| base.wrapping_mul(1_000_003).wrapping_add(i)).collect()
    }

    /// The number of environments stepped together.
    pub fn num_envs(&self) -> usize {
        self.rngs.len()
    }

    /// Current positions `[N, 2]`.
    pub fn obs(&self) -> &[f32] {
        &self.pos
    }

    /// Current goals `[N, 2]`.
    pub fn goals(&self) -> &[f32] {
        &self.goal
    }

    /// Steps taken in the current episode.
    pub fn t(&self) -> usize {
        self.t
    }

    /// Whether `(x, y)` is in the arena and outside every wall.
    pub fn is_free(&self, x: f32, y: f32) -> bool {
        (0.0..=1.0).contains(&x) && (0.0..=1.0).contains(&y) && !self.walls.iter().any(|w| w.contains(x, y))
    }

    fn sample_free(walls: &[Wall], rng: &mut RlRng) -> [f32; 2] {
        loop {
            let (x, y) = (rng.gen::<f32>(), rng.gen::<f32>());
            if !walls.iter().any(|w| w.contains(x, y)) {
                return [x, y];
            }
        }
    }

    /// New starts and goals for every environment; returns the positions `[N, 2]`.
    pub fn reset(&mut self) -> &[f32] {
        for (i, rng) in self.rngs.iter_mut().enumerate() {
            let s = Self::sample_free(&self.walls, rng);
            let g = Self::sample_free(&self.walls, rng);
            self.pos[2 * i..2 * i + 2].copy_from_slice(&s);
            self.goal[2 * i..2 * i + 2].copy_from_slice(&g);
        }
        self.t = 0;
        &self.pos
    }

    /// Everything that evolves: positions, goals, the episode clock and every environment's random
    /// stream (for checkpoints).
    pub fn state(&self) -> EnvState {
        EnvState { pos: self.pos.clone(), goal: self.goal.clone(), t: self.t, rngs: self.rngs.clone() }
    }

    /// Restores [`VecEnv::state`]; an error if it is for another number of environments.
    pub fn restore(&mut self, s: EnvState) -> anyhow::Result<()> {
        let n = self.num_envs();
        anyhow::ensure!(
            s.rngs.len() == n && s.pos.len() == 2 * n && s.goal.len() == 2 * n,
            "the saved environment state is for {} environments, this run has {n}",
            s.rngs.len()
        );
        (self.pos, self.goal, self.t, self.rngs) = (s.pos, s.goal, s.t, s.rngs);
        Ok(())
    }

    /// Sets the positions and goals (`[N, 2]` each) and restarts the episode clock, for tests and
    /// fixed evaluation tasks.
    pub fn set_state(&mut self, pos: &[f32], goal: &[f32]) {
        assert_eq!((pos.len(), goal.len()), (self.pos.len(), self.goal.len()), "positions and goals are [N, 2]");
        self.pos.copy_from_slice(pos);
        self.goal.copy_from_slice(goal);
        self.t = 0;
    }

    /// The move from `(x, y)` by `(dx, dy)`: x first, then y, each clipped at the first wall face
    /// (or arena edge) it would cross.
    pub fn move_point(walls: &[Wall], x: f32, y: f32, dx: f32, dy: f32) -> (f32, f32) {
        let mut nx = (x + dx).clamp(0.0, 1.0);
        for w in walls {
            if y > w.y0 && y < w.y1 {
                if dx > 0.0 && x <= w.x0 && nx > w.x0 {
                    nx = w.x0;
                } else if dx < 0.0 && x >= w.x1 && nx < w.x1 {
                    nx = w.x1;
                }
            }
        }
        let mut ny = (y + dy).clamp(0.0, 1.0);
        for w in walls {
            if nx > w.x0 && nx < w.x1 {
                if dy > 0.0 && y <= w.y0 && ny > w.y0 {
                    ny = w.y0;
                } else if dy < 0.0 && y >= w.y1 && ny < w.y1 {
                    ny = w.y1;
                }
            }
        }
        (nx, ny)
    }

    /// Reward 1 within the goal radius.
    fn reward(&self, i: usize) -> f32 {
        let (dx, dy) = (self.pos[2 * i] - self.goal[2 * i], self.pos[2 * i + 1] - self.goal[2 * i + 1]);
        if (dx * dx + dy * dy).sqrt() <= self.spec.goal_radius {
            1.0
        } else {
            0.0
        }
    }

    /// Steps every environment. `actions`: `[N, 2]` in `[-1, 1]` (clamped; NaN counts as 0).
    /// At the end of an episode every environment is reset after its observation is recorded.
    pub fn step(&mut self, actions: &[f32]) -> StepOut {
        let n = self.num_envs();
        assert_eq!(actions.len(), 2 * n, "actions are [N, 2] = [{n}, 2]");
        let m = self.spec.max_step;
        let clean = |a: f32| if a.is_nan() { 0.0 } else { a.clamp(-1.0, 1.0) };
        for i in 0..n {
            let (dx, dy) = (m * clean(actions[2 * i]), m * clean(actions[2 * i + 1]));
            let (x, y) = Self::move_point(&self.walls, self.pos[2 * i], self.pos[2 * i + 1], dx, dy);
            self.pos[2 * i] = x;
            self.pos[2 * i + 1] = y;
        }
        let reward = (0..n).map(|i| self.reward(i)).collect();
        let obs = self.pos.clone();
        self.t += 1;
        let done = self.t >= self.spec.episode_length;
        if done {
            self.reset();
        }
        StepOut { obs, reward, done }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walls_block_and_the_point_slides_along_them() {
        let walls = Layout::U.walls();
        // Below the wall, moving up: stops at its lower face.
        assert_eq!(VecEnv::move_point(&walls, 0.3, 0.35, 0.0, 0.1), (0.3, 0.4));
        // Above it, moving down: stops at its upper face.
        assert_eq!(VecEnv::move_point(&walls, 0.3, 0.65, 0.0, -0.1), (0.3, 0.6));
        // Right of it, moving left: stops at its right face.
        assert_eq!(VecEnv::move_point(&walls, 0.75, 0.5, -0.1, 0.0), (0.7, 0.5));
        // Diagonal into the lower face: x moves on, y stops (sliding).
        let (x, y) = VecEnv::move_point(&walls, 0.3, 0.38, 0.05, 0.05);
        assert!((x - 0.35).abs() < 1e-6 && y == 0.4, "({x}, {y})");
        // Around the right end: free.
        let (x, y) = VecEnv::move_point(&walls, 0.75, 0.35, 0.0, 0.1);
        assert!((x - 0.75).abs() < 1e-6 && (y - 0.45).abs() < 1e-6);
        // The arena bounds.
        assert_eq!(VecEnv::move_point(&walls, 0.95, 0.02, 0.1, -0.1), (1.0, 0.0));
    }

    #[test]
    fn a_segment_crosses_a_wall_only_through_its_interior() {
        let w = Layout::U.walls()[0];
        assert!(w.crosses([0.3, 0.1], [0.3, 0.9]), "straight up through it");
        assert!(w.crosses([0.1, 0.1], [0.9, 0.9]), "diagonally through it");
        assert!(!w.crosses([0.8, 0.1], [0.8, 0.9]), "past its right end");
        assert!(!w.crosses([0.1, 0.1], [0.6, 0.35]), "below it");
        assert!(!w.crosses([0.1, 0.4], [0.9, 0.4]), "along its face");
        assert!(!w.crosses([0.75, 0.1], [0.9, 0.9]), "beside it, vertically");
        // The serpentine: bottom to top corridor is blocked anywhere; within a corridor it is not.
        let s = Layout::Serpentine.walls();
        assert!(sight_blocked(&s, [0.9, 0.1], [0.9, 0.9]) && sight_blocked(&s, [0.1, 0.1], [0.1, 0.9]));
        assert!(!sight_blocked(&s, [0.1, 0.6], [0.9, 0.7]));
    }
}
