//! Run directories and atomic file writes.
//!
//! Layout: `config.yaml` (resolved), `metrics.csv`, `summary.json`, `connectivity/`,
//! `checkpoints/`, `figures/`. Every file is written to a temporary file in the same directory and
//! renamed into place, so a crash leaves either the old file or the new one, never half of one.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` atomically (temp file in the same directory, fsync, rename).
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(bytes).with_context(|| format!("writing {}", path.display()))?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

/// Runs `write` on a temporary path in `path`'s directory, then renames it to `path`. For writers
/// that want a path (libtorch's safetensors saver).
pub fn atomic_write_with(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    // Keep the extension: some writers pick the format from it (tch: `.safetensors`).
    let suffix = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    let tmp = tempfile::Builder::new().prefix(".tmp-").suffix(&suffix).tempfile_in(dir)?.into_temp_path();
    write(&tmp)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    tmp.persist(path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

/// A run directory that exists on disk.
#[derive(Debug, Clone)]
pub struct RunDir {
    pub path: PathBuf,
}

impl RunDir {
    /// Creates the directory (and `figures/`); an existing run there is overwritten file by file.
    pub fn create(path: &Path) -> Result<Self> {
        std::fs::create_dir_all(path.join("figures"))
            .with_context(|| format!("creating run directory {}", path.display()))?;
        Ok(Self { path: path.to_path_buf() })
    }

    pub fn open(path: &Path) -> Result<Self> {
        anyhow::ensure!(
            path.join("config.yaml").is_file(),
            "{} is not a plexus run directory (no config.yaml)",
            path.display()
        );
        Ok(Self { path: path.to_path_buf() })
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

/// A square matrix as CSV: a header row `node,0,1,…` and the node index as first column
/// (row = source, column = target for connectivity matrices).
pub fn matrix_csv(m: &tch::Tensor) -> String {
    let rows = crate::topology::common::to_rows(m);
    let mut out = String::from("node");
    for j in 0..rows.first().map_or(0, |r| r.len()) {
        out.push_str(&format!(",{j}"));
    }
    out.push('\n');
    for (i, r) in rows.iter().enumerate() {
        out.push_str(&i.to_string());
        for v in r {
            out.push_str(&format!(",{v}"));
        }
        out.push('\n');
    }
    out
}
