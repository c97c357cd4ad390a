//! Data-parallel training on PyTorch's own distributed engine (c10d: Gloo on CPUs, NCCL on GPUs,
//! through [`crate::native::process_group::ProcessGroup`]).
//!
//! Semantics (what makes a config give the same run whatever the number of processes):
//! * the config's batch is the **global** batch: every rank draws the same global batch `i` (a pure
//!   function of `(seed, i)`) and keeps its contiguous slice `r` of `B / world` examples;
//! * parameters are broadcast from rank 0 at start; after backward the gradients are summed over
//!   the ranks in flat buckets and divided by the world size (the mean of the slices' mean losses
//!   is the global mean loss, so this is the global gradient); losses that sum over the batch
//!   (the LNN case study) are summed, not averaged;
//! * clipping then sees identical, global gradients on every rank; so does AdamW;
//! * rank 0 alone evaluates, saves C, writes logs and checkpoints (atomically, as always); every
//!   rank resumes from the same checkpoint.
//!
//! Launching: `plexus train CONFIG --nproc N` starts N processes on this machine; or set the
//! variables `torchrun` and `srun` set (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT`), e.g. `torchrun --no-python --nproc_per_node 8 plexus train CONFIG`. Each rank
//! trains on `cuda:LOCAL_RANK` when the config asks for a GPU.
//!
//! Gradients are reduced after backward, not overlapped with it: tch exposes no per-parameter
//! gradient hooks, which DDP's overlap relies on.

use crate::native::{process_group::Backend, process_group::ProcessGroup};
use anyhow::{bail, Context, Result};
use std::time::Duration;
use tch::{Device, Tensor};

/// Default time a rank waits for the others (rendezvous and every collective) before failing.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Gradient buckets: about this many bytes per all-reduce (DDP's default is 25 MiB).
pub const BUCKET_BYTES: i64 = 25 << 20;

/// Where this process sits in a data-parallel run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistInfo {
    pub rank: usize,
    pub world_size: usize,
    /// The GPU index on this machine (`LOCAL_RANK`).
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub timeout: Duration,
}

impl DistInfo {
    /// From `torchrun`'s variables; `None` when `WORLD_SIZE` is unset (a single-process run).
    /// A set but malformed variable is an error naming it.
    pub fn from_env(timeout: Duration) -> Result<Option<DistInfo>> {
        Self::from_vars(|k| std::env::var(k).ok(), timeout)
    }

    /// [`DistInfo::from_env`] over any variable lookup (for tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>, timeout: Duration) -> Result<Option<DistInfo>> {
        let Some(world) = var("WORLD_SIZE") else { return Ok(None) };
        let num = |key: &str, default: Option<usize>| -> Result<usize> {
            match var(key) {
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .map_err(|_| anyhow::anyhow!("environment variable {key}={v:?}: expected a non-negative integer")),
                None => default.with_context(|| {
                    format!("WORLD_SIZE={world} is set but {key} is not (set both, as torchrun does)")
                }),
            }
        };
        let world_size = num("WORLD_SIZE", None)?;
        if world_size == 0 {
            bail!("environment variable WORLD_SIZE=0: expected at least 1 process");
        }
        let rank = num("RANK", None)?;
        if rank >= world_size {
            bail!("environment variable RANK={rank}: expected 0..{world_size} (WORLD_SIZE={world_size})");
        }
        let local_rank = num("LOCAL_RANK", Some(rank))?;
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let port = num("MASTER_PORT", Some(29500))?;
        let master_port = u16::try_from(port)
            .ok()
            .filter(|p| *p > 0)
            .with_context(|| format!("environment variable MASTER_PORT={port}: expected a port in 1..=65535"))?;
        Ok(Some(DistInfo { rank, world_size, local_rank, master_addr, master_port, timeout }))
    }

    /// Whether this process writes the run (rank 0), given its place in a run (`None`: the only
    /// process).
    pub fn is_main(info: Option<&DistInfo>) -> bool {
        info.is_none_or(|d| d.rank == 0)
    }

    /// The device of this rank for a resolved config device: `cuda:LOCAL_RANK` for a GPU run, on a
    /// machine with `cuda_devices` GPUs. More ranks than GPUs (`--nproc 2` on a one-GPU machine)
    /// is an error that says so, not CUDA's "invalid device ordinal" from deep inside a tensor copy.
    pub fn device(&self, configured: Device, cuda_devices: usize) -> Result<Device> {
        match configured {
            Device::Cuda(_) if self.local_rank >= cuda_devices => bail!(
                "rank {} of {}: LOCAL_RANK {} would train on cuda:{}, but this machine has {cuda_devices} CUDA \
                 device(s): start at most {cuda_devices} process(es) per machine (--nproc {cuda_devices}), one per GPU",
                self.rank,
                self.world_size,
                self.local_rank,
                self.local_rank
            ),
            Device::Cuda(_) => Ok(Device::Cuda(self.local_rank)),
            d => Ok(d),
        }
    }
}

/// A joined data-parallel group.
pub struct Dist {
    pub info: DistInfo,
    group: ProcessGroup,
}

impl Dist {
    /// Joins the group: Gloo for CPU training, NCCL for CUDA.
    pub fn join(info: DistInfo, device: Device) -> Result<Dist> {
        let backend = if device.is_cuda() { Backend::Nccl } else { Backend::Gloo };
        let group =
            ProcessGroup::new(backend, &info.master_addr, info.master_port, info.rank, info.world_size, info.timeout)
                .with_context(|| {
                format!(
                    "rank {} of {}: joining the process group at {}:{} ({backend:?})",
                    info.rank, info.world_size, info.master_addr, info.master_port
                )
            })?;
        Ok(Dist { info, group })
    }

    /// Rank 0's values of `params` on every rank.
    pub fn broadcast_parameters(&self, params: &mut [Tensor]) -> Result<()> {
        tch::no_grad(|| params.iter_mut().try_for_each(|p| self.group.broadcast(p, 0)))
            .with_context(|| format!("rank {}: broadcasting the parameters from rank 0", self.info.rank))
    }

    /// Sums the gradients of `params` over the ranks in buckets of about [`BUCKET_BYTES`] (one
    /// collective each), then multiplies them by `scale` (`1/world` for mean losses).
    pub fn reduce_gradients(&self, params: &[Tensor], scale: f64) -> Result<()> {
        let mut grads: Vec<Tensor> = params.iter().map(|p| p.grad()).filter(|g| g.defined()).collect();
        let mut start = 0;
        while start < grads.len() {
            let (mut end, mut bytes) = (start, 0i64);
            let kind = grads[start].kind();
            while end < grads.len() && grads[end].kind() == kind && (end == start || bytes < BUCKET_BYTES) {
                bytes += grads[end].numel() as i64 * grads[end].kind().elt_size_in_bytes() as i64;
                end += 1;
            }
            self.group
                .all_reduce_sum_many(&mut grads[start..end])
                .with_context(|| format!("rank {}: all-reducing the gradients", self.info.rank))?;
            start = end;
        }
        if scale != 1.0 {
            tch::no_grad(|| {
                for g in &grads {
                    let _ = g.shallow_clone().g_mul_scalar_(scale);
                }
            });
        }
        Ok(())
    }

    /// Sums `t` over the ranks, in place.
    pub fn all_reduce_sum(&self, t: &mut Tensor) -> Result<()> {
        self.group.all_reduce_sum(t).with_context(|| format!("rank {}: all-reduce", self.info.rank))
    }

    /// Waits for every rank.
    pub fn barrier(&self) -> Result<()> {
        self.group.barrier().with_context(|| format!("rank {}: barrier", self.info.rank))
    }
}

/// The slice of a global batch `[B, ..]` that `rank` of `world` trains on: rows
/// `rank·B/world .. (rank+1)·B/world`. `B` must be a multiple of `world`.
pub fn shard(t: &Tensor, rank: usize, world: usize) -> Tensor {
    let per = t.size()[0] / world as i64;
    t.narrow(0, rank as i64 * per, per)
}

/// Set by [`launch`] in the environment of its ranks.
pub const LAUNCHED_VAR: &str = "PLEXUS_LAUNCHED";

/// This process's rank when [`launch`] started it (`None` otherwise: a single process, or ranks
/// started by torchrun or Slurm).
pub fn launched_rank() -> Option<usize> {
    std::env::var_os(LAUNCHED_VAR)?;
    std::env::var("RANK").ok()?.parse().ok()
}

/// `plexus train … --nproc N`: runs this same command in N processes on this machine, as torchrun
/// would (RANK = LOCAL_RANK = r, WORLD_SIZE = N, rendezvous on a free loopback port, each with
/// 1/N of the CPU threads unless OMP_NUM_THREADS is set). If one rank fails the others are
/// stopped, and the error names it; rank 0 speaks for the group (the others print their error
/// three seconds later, so an error that every rank meets is printed once: see `main.rs`). The ranks
/// die with the launcher (`PR_SET_PDEATHSIG`): a launcher killed by SIGTERM, SIGKILL or a closed
/// terminal leaves no rank training; the run resumes from its last checkpoint.
pub fn launch(nproc: usize) -> Result<()> {
    // One process per GPU or core is the point; a typo of 65535 must not fork 65535 processes.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let gpus = tch::Cuda::device_count().max(0) as usize;
    let most = (2 * cores).max(gpus).max(8);
    if nproc > most {
        bail!(
            "--nproc {nproc}: at most {most} processes on this machine ({cores} CPU cores, {gpus} CUDA devices): \
             data parallelism runs one process per GPU, or per core on the CPU"
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port for the rendezvous")?
        .port();
    let exe = std::env::current_exe().context("locating the plexus binary")?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let threads = (std::thread::available_parallelism().map_or(1, |n| n.get()) / nproc).max(1);
    let mut children = Vec::new();
    for rank in 0..nproc {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(&args)
            .env("WORLD_SIZE", nproc.to_string())
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env(LAUNCHED_VAR, "1");
        stop_with_parent(&mut cmd);
        if std::env::var_os("OMP_NUM_THREADS").is_none() {
            cmd.env("OMP_NUM_THREADS", threads.to_string());
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                for c in &mut children {
                    let _ = c.kill();
                }
                return Err(e).with_context(|| format!("starting rank {rank} ({})", exe.display()));
            }
        }
    }
    let mut done = vec![false; nproc];
    while done.iter().any(|d| !d) {
        for (rank, child) in children.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            if let Some(status) = child.try_wait()? {
                done[rank] = true;
                if !status.success() {
                    for c in &mut children {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    bail!(
                        "rank {rank} of {nproc} failed ({status}); the other ranks were stopped (see its error above)"
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Has the child started by `cmd` receive SIGTERM when this process dies, however it dies.
pub fn stop_with_parent(cmd: &mut std::process::Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: between fork and exec the closure calls only async-signal-safe functions
        // (prctl, getppid, raise) and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher died before the prctl took effect.
                if libc::getppid() != parent {
                    libc::raise(libc::SIGTERM);
                }
                Ok(())
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn torchrun_variables_are_read_and_checked() {
        let t = DEFAULT_TIMEOUT;
        assert_eq!(DistInfo::from_vars(vars(&[]), t).unwrap(), None);
        let d = DistInfo::from_vars(
            vars(&[
                ("WORLD_SIZE", "8"),
                ("RANK", "5"),
                ("LOCAL_RANK", "1"),
                ("MASTER_ADDR", "node0"),
                ("MASTER_PORT", "1234"),
            ]),
            t,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (d.rank, d.world_size, d.local_rank, d.master_addr.as_str(), d.master_port),
            (5, 8, 1, "node0", 1234)
        );
        assert_eq!(d.device(Device::Cuda(0), 2).unwrap(), Device::Cuda(1));
        assert_eq!(d.device(Device::Cpu, 0).unwrap(), Device::Cpu);
        // LOCAL_RANK 1 on a one-GPU machine (`--nproc 2` there): an error naming the cause and the fix.
        let e = d.device(Device::Cuda(0), 1).unwrap_err().to_string();
        assert!(
            e.contains("rank 5 of 8") && e.contains("cuda:1") && e.contains("1 CUDA device") && e.contains("--nproc 1"),
            "{e}"
        );
        for (bad, key) in [
            (vec![("WORLD_SIZE", "two"), ("RANK", "0")], "WORLD_SIZE"),
            (vec![("WORLD_SIZE", "0"), ("RANK", "0")], "WORLD_SIZE=0"),
            (vec![("WORLD_SIZE", "2"), ("RANK", "2")], "RANK=2"),
            (vec![("WORLD_SIZE", "2")], "RANK"),
            (vec![("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "70000")], "MASTER_PORT=70000"),
        ] {
            let e = DistInfo::from_vars(vars(&bad), t).unwrap_err().to_string();
            assert!(e.contains(key), "{bad:?}: {e}");
        }
    }

    #[test]
    fn shards_tile_the_global_batch() {
        let t = Tensor::arange(12, (tch::Kind::Int64, Device::Cpu)).view([6, 2]);
        let parts: Vec<Tensor> = (0..3).map(|r| shard(&t, r, 3)).collect();
        assert!(Tensor::cat(&parts, 0).equal(&t));
        assert_eq!(parts[1].size(), vec![2, 2]);
    }
}
