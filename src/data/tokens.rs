//! `tokens`: pre-tokenised corpora in nanoGPT's format, read window by window, for corpora that do
//! not fit in memory (OpenWebText: ~9 B GPT-2 tokens, 18 GB).
//!
//! Layout: `<root>/<dir>/train.bin` and `<root>/<dir>/val.bin`, each a flat array of token ids as
//! **uint16 little-endian** (what nanoGPT's `prepare.py` scripts write with `np.memmap(...,
//! dtype=np.uint16)`), so existing nanoGPT data works as is; `plexus tokenize` writes the same
//! (see [`super::tokenize`]). A training batch reads only its windows (positional reads, through
//! the page cache that every rank of a multi-GPU run shares); the small validation split is read
//! whole. The files are not memory-mapped: a mapped file truncated under a run kills it with
//! SIGBUS, where a short read is an error naming the file. An optional `meta.json` next to them (written by `plexus
//! tokenize`) is checked against `vocab` when present.
//!
//! Batches (as nanoGPT's `get_batch`): training batch `index` is `batch_size` windows of
//! `seq_len + 1` tokens of `train.bin` whose starts are drawn uniformly by an RNG seeded with
//! `(seed, index)`, so it is a pure function of the two; evaluation is `eval_batches` fixed
//! batches of windows evenly spaced over `val.bin`. Inputs are `[B, T]` int64 tokens (T =
//! `seq_len`), the target is the same window shifted by one token, `[B, T]` int64.
//!
//! Token ids must be `< vocab` (the model's output dimension). A full scan of 18 GB at every load
//! would cost minutes, so the load checks a spread sample of each file (the first and last
//! blocks and blocks evenly spaced between them), and every batch checks the windows it copies:
//! no out-of-range id ever reaches the embedding (where it would be an opaque index error, or on
//! the GPU an asynchronous device assert). A bad id is an error naming the file, the token offset
//! and the value.
//!
//! Options: `root`, `dir` (required; relative to the data root, e.g. `owt`), `seq_len` (default
//! 1024), `batch_size` (default 12), `vocab` (default: the vocabulary in the folder's `meta.json`,
//! written by `plexus tokenize`, padded up to a multiple of 64 as nanoGPT pads GPT-2's 50,257 to
//! 50,304 — 256 for `--encoding char`; without a `meta.json`, 50304), `eval_batches` (default 20),
//! `seed`. A `vocab` that the tokens' vocabulary does not fit, or that is larger than it padded
//! (a char corpus in a 50,304-token model), is an error naming both.

use super::files::{rng_for, Root};
use super::{check_ranges, Batch, DataEntry, DataInfo, DataSource, DataSpec, Task, MAX_BATCH};
use crate::config::{parse_options, required, OptionError};
use anyhow::{anyhow, bail, Context};
use rand::Rng;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use tch::Tensor;

pub const TOKENS: DataEntry = DataEntry {
    name: "tokens",
    about: "pre-tokenised uint16 train.bin/val.bin (nanoGPT's format, `plexus tokenize`), read window by window",
    parse,
};

/// Bytes per token id in the files.
pub const TOKEN_BYTES: usize = 2;
/// Tokens per block of the load-time spot check, and the number of blocks.
const CHECK_BLOCK: usize = 1 << 16;
const CHECK_BLOCKS: usize = 256;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    root: Option<PathBuf>,
    /// Required.
    #[serde(deserialize_with = "crate::config::present")]
    dir: Option<PathBuf>,
    seq_len: usize,
    batch_size: usize,
    /// `None`: from `meta.json`, else [`super::text::GPT2_PADDED_VOCAB`].
    vocab: Option<usize>,
    eval_batches: usize,
    seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options { root: None, dir: None, seq_len: 1024, batch_size: 12, vocab: None, eval_batches: 20, seed: 0 }
    }
}

#[derive(Debug)]
struct Spec {
    root: Root,
    /// The folder under the root holding `train.bin` and `val.bin`.
    dir: PathBuf,
    o: Options,
    /// The model's vocabulary: `vocab`, else `meta.json`'s padded, else GPT-2's padded.
    vocab: usize,
}

fn parse(opts: &serde_yaml::Mapping, pinned: Option<&Path>) -> Result<Box<dyn DataSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let dir = required(o.dir.clone(), "dir")?;
    if dir.as_os_str().is_empty() {
        return Err(OptionError::new(
            "dir",
            dir.display(),
            "a folder holding train.bin and val.bin, relative to the data root (e.g. owt) or absolute",
        ));
    }
    check_ranges(&[("seq_len", o.seq_len, 1, 1 << 20), ("batch_size", o.batch_size, 1, MAX_BATCH)])?;
    if let Some(v) = o.vocab.filter(|v| !(2..=1 << 16).contains(v)) {
        return Err(OptionError::new(
            "vocab",
            v,
            "an integer in 2..=65536 (uint16 token ids; 50304 for GPT-2, 256 for the char encoding)",
        ));
    }
    check_ranges(&[("eval_batches", o.eval_batches, 0, 1 << 20)])?;
    let root = Root::new(pinned, o.root.clone());
    // The tokens' own vocabulary, where `plexus tokenize` recorded it: the default, and a check.
    let meta = tokens_meta(&root.resolve().join(&dir).join("meta.json"))
        .map_err(|e| OptionError::new("dir", dir.display(), e))?;
    let vocab = match (o.vocab, &meta) {
        (None, Some((v, _))) => padded(*v),
        (None, None) => super::text::GPT2_PADDED_VOCAB,
        (Some(v), Some((m, enc))) if v < *m || v > padded(*m) => {
            return Err(OptionError::new(
                "vocab",
                v,
                format!(
                    "the vocabulary of the tokens in {}: {m} ({enc}, meta.json), padded at most to {}; leave vocab out \
                     to take it from meta.json",
                    dir.display(),
                    padded(*m)
                ),
            ))
        }
        (Some(v), _) => v,
    };
    // The resolved vocabulary in the options too, so that a spec shows what it builds.
    let o = Options { vocab: Some(vocab), ..o };
    Ok(Box::new(Spec { root, dir, o, vocab }))
}

/// `v` rounded up to a multiple of 64 (nanoGPT's padding of GPT-2's 50,257 to 50,304), at most
/// 65,536 (what uint16 token ids can index).
fn padded(v: usize) -> usize {
    (v.div_ceil(64) * 64).min(1 << 16)
}

/// The largest `meta.json` read (plexus tokenize writes about a hundred bytes).
const MAX_META_BYTES: u64 = 64 << 10;

/// The vocabulary and encoding recorded in a tokens folder's `meta.json` (`None`: no such file),
/// read once, when a run starts, and pinned in the run ([`crate::pins`]: a run's readers use its
/// copy). A `meta.json` that is there must be a regular file of JSON whose `vocab` is an integer
/// in 2..=65536 (uint16 token ids); the error, a sentence for the option's "allowed" text, names
/// the file and what is wrong with it.
fn tokens_meta(path: &Path) -> Result<Option<(usize, String)>, String> {
    let served = crate::pins::input("data.meta", || {
        if std::fs::symlink_metadata(path).is_err() {
            return Ok(crate::pins::Found { path: path.to_path_buf(), step: None, bytes: None });
        }
        let bytes = crate::input_file::read_bounded(path, MAX_META_BYTES, "a tokens meta.json")
            .map_err(|e| format!("a folder whose meta.json is readable ({e:#})"))?;
        Ok(crate::pins::Found { path: path.to_path_buf(), step: None, bytes: Some(bytes) })
    })?;
    let Some(bytes) = served.bytes else { return Ok(None) };
    let bad = |what: String| {
        format!("a folder whose meta.json (written by plexus tokenize) says its vocabulary: {}: {what}", path.display())
    };
    let meta: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON ({e})")))?;
    let vocab = meta.get("vocab").ok_or_else(|| bad("no `vocab`".into()))?;
    let v = vocab
        .as_u64()
        .filter(|v| (2..=1 << 16).contains(v))
        .ok_or_else(|| bad(format!("`vocab` is {vocab}, not an integer in 2..=65536 (uint16 token ids)")))?;
    let encoding = meta.get("encoding").and_then(|e| e.as_str()).unwrap_or("unknown encoding").to_string();
    Ok(Some((v as usize, encoding)))
}

impl DataSpec for Spec {
    fn kind(&self) -> &'static str {
        "tokens"
    }
    fn info(&self) -> DataInfo {
        DataInfo { input_shape: vec![self.o.seq_len], output_dim: self.vocab, task: Task::LanguageModel }
    }
    fn load(&self) -> anyhow::Result<Box<dyn DataSource>> {
        let dir = self.root.resolve().join(&self.dir);
        let need = self.o.seq_len + 1;
        let train = TokenFile::open(&dir.join("train.bin"), need, self.vocab, false)?;
        // The validation split is small (nanoGPT's: 0.05 %): checked whole, so evaluation never fails.
        let val = match self.o.eval_batches {
            0 => None,
            _ => Some(TokenFile::open(&dir.join("val.bin"), need, self.vocab, true)?),
        };
        Ok(Box::new(TokenSource {
            train,
            val,
            seq_len: self.o.seq_len,
            batch: self.o.batch_size,
            eval_batches: self.o.eval_batches,
            seed: self.o.seed,
        }))
    }
}

/// One file of uint16 little-endian token ids, read with positional reads (`pread`): a training
/// batch reads only its windows. Not memory-mapped: a file truncated while mapped kills the
/// process with SIGBUS (re-running nanoGPT's `prepare.py` over a folder in use does it), where a
/// read that comes up short is an error naming the file. `resident` holds the whole file when it
/// was read whole at open (the validation split: checked whole, so evaluation cannot fail later).
struct TokenFile {
    path: PathBuf,
    file: std::fs::File,
    /// Token ids in the file when it was opened.
    tokens: usize,
    vocab: usize,
    resident: Option<Vec<u16>>,
}

impl TokenFile {
    /// Opens `path`, checks its length (even, at least `need` tokens) and its ids: all of them
    /// when `full` (then kept in memory), else a spread sample.
    fn open(path: &Path, need: usize, vocab: usize, full: bool) -> anyhow::Result<TokenFile> {
        use std::os::unix::fs::OpenOptionsExt;
        // Non-blocking, so that a FIFO is refused below instead of waiting for a writer.
        let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(|e| {
            let dir = path.parent().unwrap_or(Path::new("."));
            anyhow!(
                "token file not found: cannot open {} ({e}). A `tokens` dataset is a folder with train.bin and \
                 val.bin (uint16 little-endian token ids, nanoGPT's format): write one from text files with \
                 `plexus tokenize FILE... --out {}`, or copy nanoGPT's data/<name>/ (e.g. openwebtext's prepare.py \
                 output) there; a relative `dir` is read under the data root (data.root, else PLEXUS_DATA)",
                path.display(),
                dir.display()
            )
        })?;
        let meta = file.metadata().with_context(|| format!("reading {}", path.display()))?;
        if !meta.is_file() {
            bail!(
                "{} is {}, not a token file: a `tokens` dataset folder holds train.bin and val.bin as regular \
                 files of uint16 little-endian token ids",
                path.display(),
                crate::input_file::kind_name(&meta.file_type())
            );
        }
        let bytes = meta.len() as usize;
        if !bytes.is_multiple_of(TOKEN_BYTES) {
            bail!(
                "{}: {bytes} bytes, an odd length: a token file holds 2-byte (uint16 little-endian) token ids, so its \
                 length is even; the file is truncated or not a token file",
                path.display()
            );
        }
        let tokens = bytes / TOKEN_BYTES;
        if tokens < need {
            bail!(
                "{}: {tokens} tokens, fewer than seq_len + 1 = {need} (one window); use more text or a shorter seq_len",
                path.display()
            );
        }
        let mut f = TokenFile { path: path.to_path_buf(), file, tokens, vocab, resident: None };
        if full {
            let all = f.read(0, tokens)?;
            f.resident = Some(all);
        } else {
            f.spot_check()?;
        }
        Ok(f)
    }

    fn len(&self) -> usize {
        self.tokens
    }

    /// An error naming the file if it changed size since it was opened (a rewrite under the run).
    fn check_unchanged(&self) -> anyhow::Result<()> {
        if self.resident.is_some() {
            return Ok(());
        }
        let now = self.file.metadata().with_context(|| format!("reading {}", self.path.display()))?.len();
        match now == (TOKEN_BYTES * self.tokens) as u64 {
            true => Ok(()),
            false => Err(self.changed(now)),
        }
    }

    fn changed(&self, now: u64) -> anyhow::Error {
        anyhow!(
            "{}: the file changed while this run read it ({} bytes when opened, {now} now): a token file must \
             not be rewritten during a run (re-running a prepare script or `plexus tokenize` over a folder in use \
             truncates it); write new tokens into another folder",
            self.path.display(),
            TOKEN_BYTES * self.tokens
        )
    }

    /// The ids in `[start, end)`, each checked `< vocab` (an error names the first that is not).
    /// A read that comes up short (the file was truncated) is an error naming the file; callers
    /// check the size once per batch ([`TokenFile::check_unchanged`]).
    fn read(&self, start: usize, end: usize) -> anyhow::Result<Vec<u16>> {
        let ids: Vec<u16> = match &self.resident {
            Some(all) => all[start..end].to_vec(),
            None => {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; TOKEN_BYTES * (end - start)];
                match self.file.read_exact_at(&mut buf, (TOKEN_BYTES * start) as u64) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        return Err(self.changed(self.file.metadata().map(|m| m.len()).unwrap_or(0)));
                    }
                    Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
                }
                buf.chunks_exact(TOKEN_BYTES).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
            }
        };
        match ids.iter().position(|&t| t as usize >= self.vocab) {
            None => Ok(ids),
            Some(k) => {
                let i = start + k;
                Err(anyhow!(
                    "{}: token {} at token offset {i} (byte offset {}) is not below the vocabulary size {} \
                     (data.vocab); the file was written with a larger vocabulary, or is not a uint16 token file",
                    self.path.display(),
                    ids[k],
                    TOKEN_BYTES * i,
                    self.vocab
                ))
            }
        }
    }

    /// The whole file when small, else `CHECK_BLOCKS` blocks spread evenly from start to end.
    fn spot_check(&self) -> anyhow::Result<()> {
        let n = self.len();
        if n <= CHECK_BLOCK * CHECK_BLOCKS {
            return self.read(0, n).map(drop);
        }
        let last = (n - CHECK_BLOCK) as u128;
        for b in 0..CHECK_BLOCKS {
            let start = (b as u128 * last / (CHECK_BLOCKS as u128 - 1)) as usize;
            self.read(start, start + CHECK_BLOCK)?;
        }
        Ok(())
    }

    /// Input `[B, T]` and target (shifted by one) from windows of `T + 1` tokens at `starts`.
    fn windows(&self, starts: &[usize], t: usize) -> anyhow::Result<Batch> {
        self.check_unchanged()?;
        let mut data: Vec<i64> = Vec::with_capacity(starts.len() * (t + 1));
        for &s in starts {
            data.extend(self.read(s, s + t + 1)?.into_iter().map(i64::from));
        }
        let all = Tensor::from_slice(&data).reshape([starts.len() as i64, t as i64 + 1]);
        Ok(Batch { input: all.narrow(1, 0, t as i64).contiguous(), target: all.narrow(1, 1, t as i64).contiguous() })
    }
}

struct TokenSource {
    train: TokenFile,
    /// `None` when `eval_batches` is 0 (val.bin is then not needed).
    val: Option<TokenFile>,
    seq_len: usize,
    batch: usize,
    eval_batches: usize,
    seed: u64,
}

impl TokenSource {
    /// Window starts of training batch `index`: uniform over `0..=len − T − 1`, from `(seed, index)`.
    fn train_starts(&self, index: u64) -> Vec<usize> {
        let mut rng = rng_for(self.seed, &[0x70C5, index]);
        let last = self.train.len() - self.seq_len - 1;
        (0..self.batch).map(|_| rng.gen_range(0..=last)).collect()
    }
}

impl DataSource for TokenSource {
    fn files(&self) -> Vec<PathBuf> {
        std::iter::once(&self.train).chain(&self.val).map(|f| f.path.clone()).collect()
    }

    /// A corrupt token id is an error naming file and offset; the trainer stops at this batch.
    fn train_batch(&self, index: u64) -> anyhow::Result<Batch> {
        self.train
            .windows(&self.train_starts(index), self.seq_len)
            .with_context(|| format!("tokens training batch {index}"))
    }
    /// Non-overlapping windows of `seq_len` (+1 target) tokens in train.bin, per batch.
    fn batches_per_epoch(&self) -> u64 {
        ((self.train.len() - 1) / (self.batch * self.seq_len)).max(1) as u64
    }
    fn eval_batches(&self) -> Vec<Batch> {
        let Some(val) = &self.val else { return Vec::new() };
        self.eval_starts()
            .chunks(self.batch)
            .enumerate()
            .map(|(b, starts)| {
                // In memory and checked whole at open: cannot fail.
                val.windows(starts, self.seq_len).unwrap_or_else(|e| panic!("tokens evaluation batch {b}: {e:#}"))
            })
            .collect()
    }
    /// `{kind: tokens, file: …/val.bin, seq_len, batch_size, starts}`: window `i` is the tokens
    /// `starts[i] .. starts[i] + seq_len` (input) and one further on (target); batches of
    /// `batch_size` consecutive windows.
    fn eval_record(&self) -> Option<serde_yaml::Mapping> {
        let val = self.val.as_ref()?;
        let mut m = serde_yaml::Mapping::new();
        m.insert("kind".into(), "tokens".into());
        m.insert("file".into(), super::files::absolute(&val.path).into());
        m.insert("seq_len".into(), (self.seq_len as u64).into());
        m.insert("batch_size".into(), (self.batch as u64).into());
        m.insert("starts".into(), self.eval_starts().into_iter().map(|s| serde_yaml::Value::from(s as u64)).collect());
        Some(m)
    }
}

impl TokenSource {
    /// The starts of the `eval_batches · batch` held-out windows in val.bin: spread evenly from its
    /// first token to its last full window, the same at every evaluation.
    fn eval_starts(&self) -> Vec<usize> {
        let Some(val) = &self.val else { return Vec::new() };
        let windows = self.eval_batches * self.batch;
        let last = (val.len() - self.seq_len - 1) as u128;
        (0..windows)
            .map(|i| if windows == 1 { 0 } else { (i as u128 * last / (windows as u128 - 1)) as usize })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `tokens`, unchecked (as a large file's unsampled regions are).
    fn unchecked(dir: &Path, tokens: &[u16], vocab: usize) -> TokenFile {
        let path = dir.join("train.bin");
        std::fs::write(&path, tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        TokenFile { path, file, tokens: tokens.len(), vocab, resident: None }
    }

    #[test]
    fn windows_check_every_id_they_copy() {
        let dir = tempfile::tempdir().unwrap();
        let mut tokens: Vec<u16> = (0..64).collect();
        tokens[40] = 1000;
        let f = unchecked(dir.path(), &tokens, 100);
        let b = f.windows(&[0, 10], 8).unwrap();
        assert_eq!(b.input.size(), vec![2, 8]);
        assert!(b.target.equal(&(&b.input + 1)));
        let Err(e) = f.windows(&[35], 8) else { panic!("token 1000 was not caught") };
        let e = format!("{e:#}");
        assert!(e.contains("train.bin") && e.contains("token 1000") && e.contains("token offset 40"), "{e}");
    }

    #[test]
    fn a_bad_id_in_a_training_batch_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut tokens = vec![1u16; 48];
        tokens[40] = 1000;
        let src = TokenSource {
            train: unchecked(dir.path(), &tokens, 100),
            val: None,
            seq_len: 47,
            batch: 1,
            eval_batches: 0,
            seed: 0,
        };
        let e = format!("{:#}", src.train_batch(0).unwrap_err());
        assert!(e.contains("training batch 0") && e.contains("token offset 40"), "{e}");
    }
}
