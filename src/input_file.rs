//! Every file plexus reads whole as text (configs, RL configs, sweep specs and records, the files of
//! a run that `report`, `plot` and `sweep` read back) goes through here: only regular files are
//! opened, and nothing is read past a stated limit. `/dev/zero`, `/dev/urandom`, a FIFO or a link
//! to one would otherwise grow a buffer without bound (or block on open), and a huge file would be
//! read before anything said it was too big.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// The largest config, RL config or sweep spec (they are a few hundred bytes).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The largest small record of a run or sweep read back whole (`summary.json`, `analysis.json`,
/// `sweep.json`, a matrix CSV): far above what plexus writes.
pub const MAX_RECORD_BYTES: u64 = 256 << 20;

/// Opens `path` for reading if it is a regular file (after following links); a directory, device,
/// FIFO or socket is refused with its kind named, without blocking (a FIFO is opened non-blocking
/// and then checked, so a writer swapped in between cannot make it hang either).
pub fn open_regular(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let kind = file.metadata().with_context(|| format!("cannot read {}", path.display()))?.file_type();
    if !kind.is_file() {
        bail!("{} is {}, not a regular file", path.display(), kind_name(&kind));
    }
    Ok(file)
}

/// What a non-regular file is, for messages ("a directory", "a character device (like /dev/zero)").
pub fn kind_name(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// The bytes of the regular file `path`, refused once it holds more than `limit` bytes (at most
/// `limit + 1` are ever read). `what` names the file in the error ("a sweep spec").
pub fn read_bounded(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > limit {
        bail!("{} is larger than the {limit} bytes {what} may have", path.display());
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text; invalid UTF-8 is an error naming the byte offset.
pub fn read_text(path: &Path, limit: u64, what: &str) -> Result<String> {
    String::from_utf8(read_bounded(path, limit, what)?).map_err(|e| {
        anyhow::anyhow!(
            "{} is not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// A JSON record of a run or sweep (`summary.json`, `sweep.json`, …): [`read_text`] within
/// [`MAX_RECORD_BYTES`], then parsed as `T`; `what` names it in both errors ("a run summary").
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    let text = read_text(path, MAX_RECORD_BYTES, what)?;
    serde_json::from_str(&text).with_context(|| format!("{} is not {what} (damaged?)", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn devices_fifos_and_directories_are_refused_at_once_and_large_files_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let t = Instant::now();
        let e = read_text(Path::new("/dev/zero"), 1024, "a config").unwrap_err().to_string();
        assert!(e.contains("/dev/zero is a character device"), "{e}");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_text(&fifo, 1024, "a config").unwrap_err().to_string();
        assert!(e.contains("is a FIFO"), "{e}");
        let link = dir.path().join("link.yaml");
        std::os::unix::fs::symlink("/dev/urandom", &link).unwrap();
        let e = read_text(&link, 1024, "a config").unwrap_err().to_string();
        assert!(e.contains("link.yaml is a character device"), "{e}");
        let e = read_text(dir.path(), 1024, "a config").unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());

        let big = dir.path().join("big.yaml");
        std::fs::write(&big, vec![b'a'; 1025]).unwrap();
        let e = read_text(&big, 1024, "a config").unwrap_err().to_string();
        assert!(e.contains("larger than the 1024 bytes a config may have"), "{e}");
        std::fs::write(&big, vec![b'a'; 1024]).unwrap();
        assert_eq!(read_text(&big, 1024, "a config").unwrap().len(), 1024);
        std::fs::write(&big, b"ok\xff").unwrap();
        let e = read_text(&big, 1024, "a config").unwrap_err().to_string();
        assert!(e.contains("invalid byte at offset 2"), "{e}");
    }
}
