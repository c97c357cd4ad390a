//! What a run reads from outside its directory, pinned when the run starts.
//!
//! A config may name files outside the run that can change under it: a C to start `graph` from
//! (`topology.init: {file: C.csv}`), another run's saved C (`{from: RUN}`, whose "last saved step"
//! moves while that run trains), a tokens folder's `meta.json` (the vocabulary), the dataset's
//! files. Each is read once, when the run starts, and pinned in the run:
//!
//! - small inputs (a C, a `meta.json`) are **copied** into `<run>/inputs/`, and every reader of the
//!   run afterwards (`--resume`, `connectivity`, `plot`, `analyze`, `fd`, `parity/load.py`) parses
//!   its config against the copy, never against the file the config names;
//! - large ones (the dataset's files) are **recorded by content** (SHA-256 and size), and a reader
//!   that reads them again refuses to go on when they differ, naming the file and both hashes;
//! - an input that was *absent* when the run started (no `meta.json`) is pinned as absent.
//!
//! The record is `<run>/inputs.yaml` ([`Manifest`]): for each input its config key, the path as
//! read, the step it stands for (another run's C), its size and SHA-256, and its copy. A run made
//! before inputs were pinned has no record, and its readers read the inputs as the config names
//! them (as they always did).
//!
//! Parsing goes through [`scope`]: a config's parse (the experiment's) runs in a
//! scope that either records what [`input`] reads (a new run: [`Scope::Take`]) or serves it from a
//! run's record (a run's config: [`Scope::Run`]). Outside a scope, [`input`] simply reads.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::path::{Path, PathBuf};

/// The record's file name in a run directory.
pub const MANIFEST_FILE: &str = "inputs.yaml";
/// The folder of the copies in a run directory.
pub const COPIES_DIR: &str = "inputs";
/// The largest input that is copied into the run (C matrices and `meta.json` are a few KB).
pub const MAX_COPY_BYTES: u64 = 16 << 20;

/// One pinned input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    /// The config key that names it (`topology.init`, `data.meta`), or `data.files[N]` for the
    /// dataset's files.
    pub key: String,
    /// The file as it was read (absolute).
    pub source: String,
    /// Another run's saved C: the step read (the last saved one when the config gave none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Absent when the run started (pinned as absent: it stays so for the run's readers).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub absent: bool,
    /// Size in bytes and SHA-256 (hex) of its content.
    #[serde(default)]
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// Its copy in the run, relative to the run directory (`inputs/topology.init.csv`); none for
    /// inputs recorded by content only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<String>,
}

/// What a run pinned: `inputs.yaml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub inputs: Vec<Pin>,
}

/// `path` made absolute, links resolved where it can be (the record's `source`).
fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).or_else(|_| std::path::absolute(path)).unwrap_or_else(|_| path.to_path_buf())
}

/// The SHA-256 of `bytes`, as lowercase hex.
pub fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// The SHA-256 and size of the file at `path`, read in 1 MiB blocks (a dataset's files are large).
pub fn sha256_file(path: &Path) -> Result<(String, u64)> {
    use std::io::Read;
    let mut f = crate::input_file::open_regular(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((format!("{:x}", hasher.finalize()), total))
}

/// An input as found by the code that reads it: the file, the step it stands for, and its bytes
/// (`None`: the file is not there, which the reader accepts).
pub struct Found {
    pub path: PathBuf,
    pub step: Option<u64>,
    pub bytes: Option<Vec<u8>>,
}

/// How a parse reads its inputs.
pub enum Scope {
    /// A new run's config: read them, and record what was read (for [`write`]).
    Take,
    /// A run's config: from the run's record (the copies in `dir`, hash-checked).
    Run { dir: PathBuf, manifest: Manifest },
}

struct Active {
    scope: Scope,
    taken: Vec<Taken>,
}

thread_local! {
    static ACTIVE: RefCell<Option<Active>> = const { RefCell::new(None) };
}

/// Runs `parse` with its [`input`]s read as `scope` says; returns its result and, for
/// [`Scope::Take`], the inputs it read (with their bytes, for [`write`]). Scopes do not nest: a
/// parse inside a parse reads through the outer one.
pub fn scope<T>(scope: Scope, parse: impl FnOnce() -> T) -> (T, Vec<Taken>) {
    let outer = ACTIVE.with(|a| a.borrow().is_some());
    if outer {
        return (parse(), Vec::new());
    }
    ACTIVE.with(|a| *a.borrow_mut() = Some(Active { scope, taken: Vec::new() }));
    // Cleared even when `parse` panics, so that a later parse on this thread is not served by it.
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            ACTIVE.with(|a| *a.borrow_mut() = None);
        }
    }
    let guard = Clear;
    let out = parse();
    let taken = ACTIVE.with(|a| a.borrow_mut().take().map(|a| a.taken).unwrap_or_default());
    drop(guard);
    (out, taken)
}

/// An input as a parse is given it: its bytes (`None`: absent) and the step it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub bytes: Option<Vec<u8>>,
    pub step: Option<u64>,
}

/// What a new run's parse read: the record of an input, and the bytes to copy into the run.
#[derive(Clone, PartialEq, Eq)]
pub struct Taken {
    pub pin: Pin,
    pub bytes: Option<Vec<u8>>,
}

impl std::fmt::Debug for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Taken").field("pin", &self.pin).finish_non_exhaustive()
    }
}

/// The input named by the config key `key`: `find` locates and reads it (a new run's parse, or a
/// parse outside any scope), or, in a run's scope, the run's pinned copy (`find` is not called),
/// checked against the hash the run recorded. The error is a sentence for the option's "allowed"
/// text.
pub fn input(key: &str, find: impl FnOnce() -> Result<Found, String>) -> Result<Served, String> {
    let pinned = ACTIVE.with(|a| match a.borrow().as_ref().map(|a| &a.scope) {
        Some(Scope::Run { dir, manifest }) => Some(pinned_copy(dir, manifest, key)),
        _ => None,
    });
    if let Some(p) = pinned {
        return p;
    }
    let found = find()?;
    ACTIVE.with(|a| {
        if let Some(active) = a.borrow_mut().as_mut() {
            let (bytes, sha256) = match &found.bytes {
                Some(b) => (b.len() as u64, self::sha256(b)),
                None => (0, String::new()),
            };
            let pin = Pin {
                key: key.into(),
                source: absolute(&found.path).display().to_string(),
                step: found.step,
                absent: found.bytes.is_none(),
                bytes,
                sha256,
                copy: None,
            };
            active.taken.push(Taken { pin, bytes: found.bytes.clone() });
        }
    });
    Ok(Served { bytes: found.bytes, step: found.step })
}

/// The pinned copy of `key` in the run `dir`, hash-checked.
fn pinned_copy(dir: &Path, manifest: &Manifest, key: &str) -> Result<Served, String> {
    let record = dir.join(MANIFEST_FILE);
    let Some(pin) = manifest.inputs.iter().find(|p| p.key == key) else {
        return Err(format!(
            "an input the run pinned when it started, but {} records none for `{key}`",
            record.display()
        ));
    };
    if pin.absent {
        return Ok(Served { bytes: None, step: pin.step });
    }
    let Some(copy) = &pin.copy else {
        return Err(format!("a copy of `{key}` in the run, but {} records only its hash", record.display()));
    };
    let path = dir.join(copy);
    let bytes = crate::input_file::read_bounded(&path, MAX_COPY_BYTES, "a pinned input")
        .map_err(|e| format!("the run's pinned copy of `{key}` ({e:#})"))?;
    let now = sha256(&bytes);
    if now != pin.sha256 {
        return Err(format!(
            "the run's pinned copy of `{key}` as the run recorded it: {} has SHA-256 {now}, but {} records {} (read \
             from {} when the run started); the copy was changed",
            path.display(),
            record.display(),
            pin.sha256,
            pin.source
        ));
    }
    Ok(Served { bytes: Some(bytes), step: pin.step })
}

/// The run's record (`None`: a run made before inputs were pinned).
pub fn read(dir: &Path) -> Result<Option<Manifest>> {
    let path = dir.join(MANIFEST_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let text = crate::input_file::read_text(&path, crate::input_file::MAX_CONFIG_BYTES, "a run's inputs.yaml")?;
    let m: Manifest =
        serde_yaml::from_str(&text).with_context(|| format!("{}: not a record of pinned inputs", path.display()))?;
    Ok(Some(m))
}

/// The scope in which the config of the run in `dir` is parsed: its record, or (a run made before
/// inputs were pinned) [`Scope::Take`], which reads them as named.
pub fn of_run(dir: &Path) -> Result<Scope> {
    Ok(match read(dir)? {
        Some(manifest) => Scope::Run { dir: dir.to_path_buf(), manifest },
        None => Scope::Take,
    })
}

/// The file name of `key`'s copy: the key with anything but letters, digits, `.`, `-` and `_`
/// replaced, and the source's extension.
fn copy_name(key: &str, source: &str) -> String {
    let stem: String =
        key.chars().map(|c| if c.is_ascii_alphanumeric() || ".-_".contains(c) { c } else { '_' }).collect();
    match Path::new(source).extension().and_then(|e| e.to_str()) {
        Some(ext) if ext.chars().all(|c| c.is_ascii_alphanumeric()) => format!("{stem}.{ext}"),
        _ => stem,
    }
}

/// Writes what a new run read (`taken`, from [`scope`]) and `files` (the dataset's, hashed here)
/// into the run `dir`: the copies, then `inputs.yaml` (both atomically; the record last, so that a
/// record always has its copies). Nothing is written when there is nothing to pin.
pub fn write(dir: &Path, taken: &[Taken], files: &[(String, PathBuf)]) -> Result<Manifest> {
    let mut m = Manifest::default();
    for Taken { pin, bytes } in taken {
        let mut pin = pin.clone();
        if let Some(b) = bytes {
            if b.len() as u64 > MAX_COPY_BYTES {
                bail!(
                    "`{}`: {} is {} bytes; inputs copied into a run are at most {MAX_COPY_BYTES}",
                    pin.key,
                    pin.source,
                    b.len()
                );
            }
            let name = format!("{COPIES_DIR}/{}", copy_name(&pin.key, &pin.source));
            crate::run_dir::atomic_write(&dir.join(&name), b)?;
            pin.copy = Some(name);
        }
        m.inputs.push(pin);
    }
    for (key, path) in files {
        let (sha256, bytes) = sha256_file(path).with_context(|| format!("pinning `{key}`"))?;
        let source = absolute(path).display().to_string();
        m.inputs.push(Pin { key: key.clone(), source, step: None, absent: false, bytes, sha256, copy: None });
    }
    if !m.inputs.is_empty() {
        let text = format!(
            "# What this run read from outside its folder, pinned when it started (written by plexus train): copies \
             under inputs/, and the content hash of each input.\n# Every reader of the run uses the copies, and \
             refuses files that no longer match their hash.\n{}",
            serde_yaml::to_string(&m).context("inputs.yaml")?
        );
        crate::run_dir::atomic_write(&dir.join(MANIFEST_FILE), text.as_bytes())?;
    }
    Ok(m)
}

/// Checks the dataset's `files` (as its loader reads them now) against what the run in `dir`
/// recorded when it started: the same files, each of the same size and SHA-256. An error names
/// the file and both hashes. A run made before inputs were pinned records none, and nothing is
/// checked.
pub fn verify_files(dir: &Path, manifest: Option<&Manifest>, files: &[(String, PathBuf)]) -> Result<()> {
    let Some(m) = manifest else { return Ok(()) };
    let recorded: Vec<&Pin> = m.inputs.iter().filter(|p| p.key.starts_with(DATA_FILES)).collect();
    if recorded.len() != files.len() {
        bail!(
            "{}: the run started on {} data files, and its data now reads {}: the dataset changed since the run \
             started (its record: {})",
            dir.display(),
            recorded.len(),
            files.len(),
            dir.join(MANIFEST_FILE).display()
        );
    }
    for (pin, (key, path)) in recorded.iter().zip(files) {
        let (sha, bytes) = sha256_file(path).with_context(|| format!("checking `{key}` against the run's record"))?;
        if pin.key != *key || pin.sha256 != sha || pin.bytes != bytes {
            bail!(
                "{}: the data file {} has SHA-256 {sha} ({bytes} bytes), but the run started on {} with SHA-256 {} \
                 ({} bytes; recorded in {}): the dataset changed since the run started, and reading it would \
                 silently change what the run trains or measures. Restore the file, or start a new run",
                dir.display(),
                path.display(),
                pin.source,
                pin.sha256,
                pin.bytes,
                dir.join(MANIFEST_FILE).display()
            );
        }
    }
    Ok(())
}

/// The key prefix of the dataset's files in the record (`data.files[0]`, …).
pub const DATA_FILES: &str = "data.files";

/// The record keys of a dataset's `files`: `data.files[0]`, `data.files[1]`, ….
pub fn data_file_keys(files: &[PathBuf]) -> Vec<(String, PathBuf)> {
    files.iter().enumerate().map(|(i, p)| (format!("{DATA_FILES}[{i}]"), p.clone())).collect()
}
