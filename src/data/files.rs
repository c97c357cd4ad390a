//! Helpers shared by the file-backed datasets ([`super::cifar`], [`super::idx`], [`super::text`]):
//! where their data root is, the cache of decoded/tokenised arrays, stable hashes and seeds, and
//! the seeded sample caps.
//!
//! # The cache
//!
//! Decoding 60,000 JPEGs or tokenising a corpus is done once; the result is written to a cache
//! file that later loads read back. The cache directory is `<root>/.plexus-cache/` when the data
//! root is writable (a root whose permission bits say read-only is never written, even by root),
//! else `$XDG_CACHE_HOME/plexus/data`, else `~/.cache/plexus/data`. A cache file is named after a
//! stable hash of what it holds (e.g. the canonical folder path) and stores its whole key, which
//! also records the version of the source (file count, sizes, modification times): a collision or
//! a stale entry is detected, rebuilt and replaced in place. Files are written to a temporary
//! file and renamed into place, so a crash or two concurrent runs never leave a half-written
//! entry. Failing to write the cache is not an error (the data is simply decoded again next time).

use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Checks a folder option of a dataset: an absolute path, or a path relative to the data root
/// without `..` (`example` is shown in the error, e.g. `fashion-mnist`).
pub fn folder_option(key: &str, v: &str, example: &str) -> Result<(), crate::config::OptionError> {
    let p = Path::new(v);
    if v.is_empty() || (!p.is_absolute() && p.components().any(|c| matches!(c, std::path::Component::ParentDir))) {
        return Err(crate::config::OptionError::new(
            key,
            v,
            format!("a folder relative to the data root (no `..`), e.g. `{example}`, or an absolute path"),
        ));
    }
    Ok(())
}

/// Where a dataset's files are: the configured `root` (resolved with [`super::data_root`] at
/// load time: the config's `root`, else `PLEXUS_DATA`, else the default root), or a root pinned by a program ([`super::parse_at`]) that
/// the environment does not override.
#[derive(Debug, Clone, PartialEq)]
pub enum Root {
    Configured(Option<PathBuf>),
    Pinned(PathBuf),
}

impl Root {
    /// `pinned` if a program gave one, else the section's `root` option.
    pub fn new(pinned: Option<&Path>, configured: Option<PathBuf>) -> Root {
        match pinned {
            Some(p) => Root::Pinned(p.to_path_buf()),
            None => Root::Configured(configured),
        }
    }

    /// The directory: a pinned root as given, a configured one through [`super::data_root`].
    pub fn resolve(&self) -> PathBuf {
        match self {
            Root::Configured(c) => super::data_root(c.as_deref()),
            Root::Pinned(p) => p.clone(),
        }
    }
}

/// 64-bit FNV-1a: a hash that is the same on every platform and Rust release (for cache names).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64's finaliser: mixes a seed with stream numbers into a well-spread 64-bit seed.
pub fn mix_seed(seed: u64, streams: &[u64]) -> u64 {
    let mut z = seed ^ 0x5851_f42d_4c95_7f2d;
    for &s in streams {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15).wrapping_add(s);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
    }
    z
}

/// An RNG that is a pure function of `(seed, streams)`.
pub fn rng_for(seed: u64, streams: &[u64]) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(mix_seed(seed, streams))
}

/// The samples kept by a cap of `cap` out of `n`: the first `cap` of a permutation drawn from
/// `(seed, tag)`, in increasing order; all of them when there is no cap or `cap ≥ n`.
pub fn capped_indices(n: usize, cap: Option<usize>, seed: u64, tag: u64) -> Vec<usize> {
    match cap {
        Some(c) if c < n => {
            let mut idx: Vec<usize> = (0..n).collect();
            idx.shuffle(&mut rng_for(seed, &[0xCA9, tag]));
            idx.truncate(c);
            idx.sort_unstable();
            idx
        }
        _ => (0..n).collect(),
    }
}

/// `path` as a run's `resolved.yaml` names a data file: absolute (links resolved where it can
/// be), so that a reader in another folder finds it.
pub fn absolute(path: &Path) -> String {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()).display().to_string()
}

/// The rows a capped split keeps, for a run's `resolved.yaml`: `all` (every row, in file order)
/// or the list of their indices in the file, in the order they are used.
pub fn rows_yaml(rows: Option<Vec<i64>>) -> serde_yaml::Value {
    match rows {
        None => "all".into(),
        Some(r) => r.into_iter().map(serde_yaml::Value::from).collect(),
    }
}

/// The cache directory for datasets under `root` (see the module docs). Creates it.
///
/// A data root whose permissions say read-only (no write bit; e.g. a shared, read-only dataset
/// folder) is never written to, even by a user such as root whom the permissions do not stop.
pub fn cache_dir(root: &Path) -> Option<PathBuf> {
    let local = root.join(".plexus-cache");
    let root_writable = std::fs::metadata(root).is_ok_and(|m| !m.permissions().readonly());
    let local_writable = std::fs::metadata(&local).is_ok_and(|m| m.is_dir() && !m.permissions().readonly());
    if (local_writable || (root_writable && !local.exists())) && writable_dir(&local) {
        return Some(local);
    }
    let home = match std::env::var_os("XDG_CACHE_HOME") {
        Some(x) if !x.is_empty() => PathBuf::from(x).join("plexus").join("data"),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache").join("plexus").join("data"),
    };
    writable_dir(&home).then_some(home)
}

fn writable_dir(dir: &Path) -> bool {
    std::fs::create_dir_all(dir).is_ok() && tempfile::NamedTempFile::new_in(dir).is_ok()
}

const CACHE_MAGIC: &[u8; 8] = b"PLXCACHE";

/// The cache file for the data named by `identity` (e.g. a folder's path) under `root`'s cache
/// directory (not necessarily existing). The entry's full key, which also says which version of
/// the data it holds (sizes, modification times), is checked by [`read_cache`]; a new version
/// replaces the old one in the same file.
pub fn cache_path(root: &Path, prefix: &str, identity: &str) -> Option<PathBuf> {
    cache_dir(root).map(|d| d.join(format!("{prefix}-{:016x}.bin", stable_hash(identity.as_bytes()))))
}

/// Reads a cache entry written by [`write_cache`] for exactly this `key`; `None` if it is absent,
/// written for another key, or damaged (wrong length).
pub fn read_cache(path: &Path, key: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut f = std::io::BufReader::new(std::fs::File::open(path).ok()?);
    let file_len = f.get_ref().metadata().ok()?.len();
    let mut word = [0u8; 8];
    f.read_exact(&mut word).ok()?;
    if &word != CACHE_MAGIC {
        return None;
    }
    f.read_exact(&mut word).ok()?;
    let klen = u64::from_le_bytes(word);
    if klen != key.len() as u64 {
        return None;
    }
    let mut stored_key = vec![0u8; key.len()];
    f.read_exact(&mut stored_key).ok()?;
    if stored_key != key.as_bytes() {
        return None;
    }
    f.read_exact(&mut word).ok()?;
    let plen = u64::from_le_bytes(word);
    if file_len != 24 + klen + plen {
        return None;
    }
    let mut payload = vec![0u8; usize::try_from(plen).ok()?];
    f.read_exact(&mut payload).ok()?;
    Some(payload)
}

/// Writes a cache entry atomically (temporary file in the same directory, then rename). Errors
/// are reported on stderr and otherwise ignored: the cache is an optimisation.
pub fn write_cache(path: &Path, key: &str, payload: &[u8]) {
    let result = (|| -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        {
            let mut w = std::io::BufWriter::new(tmp.as_file_mut());
            w.write_all(CACHE_MAGIC)?;
            w.write_all(&(key.len() as u64).to_le_bytes())?;
            w.write_all(key.as_bytes())?;
            w.write_all(&(payload.len() as u64).to_le_bytes())?;
            w.write_all(payload)?;
            w.flush()?;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o644))?;
        }
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    })();
    if let Err(e) = result {
        eprintln!(
            "plexus: could not write the data cache {}: {e} (the data will be decoded again next time)",
            path.display()
        );
    }
}

/// A path made absolute (and symlinks resolved when possible), for cache keys.
pub fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| std::env::current_dir().map(|d| d.join(path)).unwrap_or_else(|_| path.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_round_trips_and_rejects_other_keys() {
        let dir = tempfile::tempdir().unwrap();
        let p = cache_path(dir.path(), "t", "key-a").unwrap();
        assert!(p.starts_with(dir.path().join(".plexus-cache")));
        assert_eq!(read_cache(&p, "key-a"), None);
        write_cache(&p, "key-a", &[1, 2, 3]);
        assert_eq!(read_cache(&p, "key-a"), Some(vec![1, 2, 3]));
        assert_eq!(read_cache(&p, "key-b"), None);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes.pop();
        std::fs::write(&p, bytes).unwrap();
        assert_eq!(read_cache(&p, "key-a"), None, "a truncated entry is not used");
    }

    #[cfg(unix)]
    #[test]
    fn read_only_roots_are_left_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ro");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o555)).unwrap();
        let d = cache_dir(&root);
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(!root.join(".plexus-cache").exists());
        assert!(d.as_ref().is_none_or(|d| !d.starts_with(&root)), "{d:?}");
    }

    #[test]
    fn caps_are_seeded_sorted_subsets() {
        let a = capped_indices(100, Some(10), 3, 1);
        assert_eq!(a, capped_indices(100, Some(10), 3, 1));
        assert_ne!(a, capped_indices(100, Some(10), 4, 1));
        assert!(a.windows(2).all(|w| w[0] < w[1]) && a.len() == 10);
        assert_eq!(capped_indices(5, Some(10), 3, 1), vec![0, 1, 2, 3, 4]);
        assert_eq!(capped_indices(5, None, 3, 1).len(), 5);
    }
}
