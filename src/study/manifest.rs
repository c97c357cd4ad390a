//! A sweep folder's record (`sweep.json`: the spec as resolved and the runs it plans) and the
//! registration each of its runs carries (`study.json`: which spec, at which commit, under which
//! claims the run was made).

use super::claims;
use super::spec::{PlannedRun, SweepSpec};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file in a sweep folder that records its spec and runs.
pub const MANIFEST: &str = "sweep.json";

/// A sweep folder's record: the spec as resolved (absolute config paths, flags merged) and the
/// runs it plans, each in `<folder>/<name>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub spec: SweepSpec,
    pub runs: Vec<PlannedRun>,
    /// Which spec, at which commit, with which claims the sweep was started ([`Registration`]);
    /// absent in sweeps of plexus before 2026-11-28.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration: Option<Registration>,
}

/// What a study's runs were made under, recorded by the sweep in each run it trains
/// (`study.json`): the spec file, the git commit that last changed it (and whether the working
/// tree held changes to it besides), and the fingerprint of its claims
/// ([`claims::claims_fingerprint`]). `plexus report` reads it back as the config keys
/// `study.claims` and `study.spec_commit`, so a run made under other claims than the report's is
/// named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    pub spec: Option<PathBuf>,
    /// `git log -1 --format=%H -- SPEC`, where the spec is in a git checkout.
    pub spec_commit: Option<String>,
    /// The spec file differed from that commit when the sweep started.
    pub spec_modified: bool,
    pub claims: String,
}

/// The file in a run directory that records its study's [`Registration`].
pub const REGISTRATION_FILE: &str = "study.json";

impl Registration {
    /// The registration of a sweep of `spec` (the file it was read from, if any).
    pub fn of(spec: &SweepSpec, file: Option<&Path>) -> Self {
        let git = |args: &[&str], dir: &Path| -> Option<String> {
            let o = std::process::Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
            o.status.success().then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let (commit, modified) = match file.and_then(|f| Some((f.parent()?, f.file_name()?))) {
            Some((dir, name)) => {
                let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
                let name = name.to_string_lossy();
                let commit = git(&["log", "-1", "--format=%H", "--", &name], dir).filter(|c| !c.is_empty());
                let status = git(&["status", "--porcelain", "--", &name], dir);
                (commit.clone(), commit.is_none() || status.is_some_and(|s| !s.is_empty()))
            }
            None => (None, false),
        };
        Registration {
            spec: file.map(Path::to_path_buf),
            spec_commit: commit,
            spec_modified: modified,
            claims: claims::claims_fingerprint(&spec.claims),
        }
    }
}

impl Manifest {
    /// The record of the sweep folder `dir` (its `sweep.json`).
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(MANIFEST);
        crate::input_file::read_json(&path, "a sweep record")
    }

    /// Writes `dir/sweep.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        crate::run_dir::atomic_write(&dir.join(MANIFEST), serde_json::to_string_pretty(self)?.as_bytes())
    }
}
