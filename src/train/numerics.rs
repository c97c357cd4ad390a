//! What a run's numbers depend on besides its config and its inputs: the libtorch it runs on, the
//! device, the CPU threads of libtorch's kernels, the processes of a data-parallel run, and which
//! fused kernels ran in which instruction set. Each changes the order in which sums are taken, and
//! a training run amplifies the last bits of one step into visibly different losses a few hundred
//! steps later (one seed of `mudd-char` on 1 and on 2 threads: 600 steps end 0.008 nats apart,
//! two thirds of the seeds' standard deviation; `bench/threads-bits.txt`). A resumed run is the
//! uninterrupted one bit for bit only when all of these are as they were.
//!
//! So a new run records them in `<run>/numerics.yaml` ([`Record`]), and a resume compares: where
//! one differs, the resume goes on (a run may move to another machine) but says so on stderr,
//! naming each, and the record lists the resume with its changes. A run made before the record
//! existed has none, and nothing is compared.

use crate::run_dir::{atomic_write, RunDir};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tch::Device;

/// The record's file name in a run directory.
pub const NUMERICS_FILE: &str = "numerics.yaml";

/// The settings a run's numbers depend on, as one process has them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Numerics {
    /// The torch version of the loaded libtorch.
    pub torch: String,
    /// The device the run steps on (`cpu`, `cuda:0`).
    pub device: String,
    /// libtorch's intra-op threads (its CPU kernels split their sums over them).
    pub cpu_threads: i64,
    /// Processes of a data-parallel run (1 without one).
    pub processes: usize,
    /// `PLEXUS_FUSED_KERNELS` as this process reads it (`1`, the default; `0`, `avx2`, `baseline`,
    /// `cuda-host`).
    pub fused_kernels: String,
    /// The instruction set of the fused CPU kernels' loops (which follows libtorch's own).
    pub kernel_isa: String,
    /// `ATEN_CPU_CAPABILITY` where it is set (it lowers libtorch's CPU kernels' vector width).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aten_cpu_capability: Option<String>,
}

impl Numerics {
    /// This process's settings, for a run on `device` over `processes` processes.
    pub fn here(device: Device, processes: usize) -> Numerics {
        use crate::native::setting;
        Numerics {
            torch: crate::device::torch_version(),
            device: match device {
                Device::Cuda(i) => format!("cuda:{i}"),
                other => format!("{other:?}").to_lowercase(),
            },
            cpu_threads: tch::get_num_threads().into(),
            processes,
            fused_kernels: setting::fused_kernels_setting().name().into(),
            kernel_isa: setting::kernel_isa().name().into(),
            aten_cpu_capability: std::env::var("ATEN_CPU_CAPABILITY").ok(),
        }
    }

    /// Each setting in which `now` differs from `self`, as `name: was → now`, in the record's
    /// order (a setting absent from one side reads `unset`).
    pub fn changes(&self, now: &Numerics) -> Vec<String> {
        let fields = |n: &Numerics| match serde_yaml::to_value(n) {
            Ok(serde_yaml::Value::Mapping(m)) => m,
            _ => unreachable!("a struct of plain fields serialises to a mapping"),
        };
        let (was, is) = (fields(self), fields(now));
        let text = |v: Option<&serde_yaml::Value>| match v {
            None => "unset".to_string(),
            Some(serde_yaml::Value::String(s)) => s.clone(),
            Some(v) => serde_yaml::to_string(v).unwrap_or_default().trim_end().to_string(),
        };
        let mut keys: Vec<&serde_yaml::Value> = was.keys().collect();
        keys.extend(is.keys().filter(|k| !was.contains_key(*k)));
        keys.into_iter()
            .filter(|k| was.get(*k) != is.get(*k))
            .map(|k| format!("{}: {} → {}", text(Some(k)), text(was.get(k)), text(is.get(k))))
            .collect()
    }
}

/// A resume under settings other than the run's start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// The checkpoint's optimizer updates, where the resumed process took over.
    pub step: u64,
    /// What differed from [`Record::started`], as `name: was → now`.
    pub changed: Vec<String>,
}

/// `numerics.yaml`: the settings of the process that started the run, and the resumes that ran
/// under others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub started: Numerics,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resumed: Vec<Resume>,
}

const HEADER: &str = "# What this run's numbers depend on besides its config and inputs, as the process that started it \
                      had them (written by plexus).\n# A resume under other settings continues the run, but not bit for \
                      bit as an uninterrupted run would: each such resume is listed under `resumed`.\n";

fn write(dir: &RunDir, record: &Record) -> Result<()> {
    let text = format!("{HEADER}{}", serde_yaml::to_string(record).context("numerics.yaml")?);
    atomic_write(&dir.file(NUMERICS_FILE), text.as_bytes())
}

/// The run's record, if it has one.
pub fn read(dir: &RunDir) -> Result<Option<Record>> {
    let path = dir.file(NUMERICS_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let text = crate::input_file::read_text(&path, crate::input_file::MAX_CONFIG_BYTES, "a run's numerics.yaml")?;
    let record = serde_yaml::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(record))
}

/// A new run records `now` as its start.
pub fn started(dir: &RunDir, now: &Numerics) -> Result<()> {
    write(dir, &Record { started: now.clone(), resumed: Vec::new() })
}

/// A resume from the checkpoint at `step` under `now`: where a setting differs from the run's
/// start, says so on stderr and adds the resume to the record. Returns the changes (none for a
/// run without a record).
pub fn resumed(dir: &RunDir, step: u64, now: &Numerics) -> Result<Vec<String>> {
    let Some(mut record) = read(dir)? else { return Ok(Vec::new()) };
    let changed = record.started.changes(now);
    if !changed.is_empty() {
        eprintln!(
            "warning: {} resumes at step {step} with {} other than when it started ({}): it continues, but not bit \
             for bit as the uninterrupted run would (recorded in {NUMERICS_FILE})",
            dir.path.display(),
            if changed.len() == 1 { "one setting" } else { "settings" },
            changed.join("; ")
        );
        record.resumed.push(Resume { step, changed: changed.clone() });
        write(dir, &record)?;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(threads: i64) -> Numerics {
        Numerics {
            torch: "2.11.0".into(),
            device: "cpu".into(),
            cpu_threads: threads,
            processes: 1,
            fused_kernels: "1".into(),
            kernel_isa: "avx2".into(),
            aten_cpu_capability: None,
        }
    }

    /// A resume on other settings is recorded with each change; one on the same settings adds
    /// nothing; a run without a record compares nothing.
    #[test]
    fn a_resume_records_what_changed_and_only_then() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::new(tmp.path());
        assert_eq!(resumed(&dir, 5, &cpu(2)).unwrap(), Vec::<String>::new(), "no record: nothing to compare");
        started(&dir, &cpu(1)).unwrap();
        assert!(resumed(&dir, 5, &cpu(1)).unwrap().is_empty());
        assert!(read(&dir).unwrap().unwrap().resumed.is_empty());
        let mut other = cpu(2);
        other.aten_cpu_capability = Some("avx512".into());
        let changed = resumed(&dir, 6, &other).unwrap();
        assert_eq!(changed, ["cpu_threads: 1 → 2", "aten_cpu_capability: unset → avx512"]);
        let record = read(&dir).unwrap().unwrap();
        assert_eq!(record.started, cpu(1));
        assert_eq!(record.resumed, [Resume { step: 6, changed }]);
    }
}
