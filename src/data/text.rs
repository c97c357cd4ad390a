//! `text`: a plain-text corpus for next-token prediction, read from `<root>/<file>`.
//!
//! Tokenisers:
//! - `char`: **byte-level**. Every byte of the file is a token, so the vocabulary is the 256
//!   byte values whatever the file holds (for ASCII text such as tinyshakespeare this is the
//!   character level). It is byte-level, rather than the sorted set of characters in the file, so
//!   that [`DataInfo`] (vocabulary size = `output_dim` = 256) is known without reading the file.
//! - `gpt2`: GPT-2's byte-pair encoding (tiktoken's `r50k_base`, 50,257 tokens, via
//!   `tiktoken-rs`; special tokens such as `<|endoftext|>` in the text are encoded as ordinary
//!   text). `output_dim` is 50,304, the vocabulary padded to a multiple of 64 as nanoGPT does
//!   (faster matmuls; the 47 extra logits are never targets and learn to stay low).
//!
//! The token array is computed once: for `gpt2` it is cached (`u16` per token) under the cache
//! directory of [`super::files`], keyed by the file's path, size and modification time and the
//! tokeniser, and written atomically; for `char` the file's bytes are the tokens, so there is
//! nothing to cache.
//!
//! Splits: the first `1 − val_fraction` of the tokens train, the rest validate. Training batch
//! `index` is `batch_size` windows of `seq_len + 1` tokens starting at offsets drawn uniformly
//! from the training split by an RNG seeded with `(seed, index)`; evaluation is `eval_batches`
//! fixed batches of windows evenly spaced over the validation split. Inputs are `[B, T]` int64
//! tokens and the target is the same window shifted by one token.
//!
//! Options: `root`, `file` (required; relative to the root, e.g. `text/tinyshakespeare.txt`),
//! `tokenizer` (`char` | `gpt2`, default `char`), `seq_len` (default 128), `batch_size` (default
//! 16), `val_fraction` (default 0.1), `eval_batches` (default 8), `seed`.

use super::files::{cache_path, canonical, rng_for, write_cache, Root};
use super::{check_ranges, Batch, DataEntry, DataInfo, DataSource, DataSpec, Task, MAX_BATCH};
use crate::config::{parse_options, required, OptionError};
use anyhow::{anyhow, bail};
use rand::Rng;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use tch::Tensor;

pub const TEXT: DataEntry = DataEntry {
    name: "text",
    about: "a plain-text corpus for language modelling, byte-level (`char`) or GPT-2 BPE tokens",
    parse,
};

/// GPT-2's vocabulary (r50k_base) and the padded output dimension used for it.
pub const GPT2_VOCAB: usize = 50257;
pub const GPT2_PADDED_VOCAB: usize = 50304;
/// The byte-level vocabulary of the `char` tokeniser.
pub const BYTE_VOCAB: usize = 256;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tokenizer {
    /// Byte-level: one token per byte, vocabulary 256.
    #[default]
    Char,
    /// GPT-2 BPE (r50k_base).
    Gpt2,
}

impl Tokenizer {
    /// The vocabulary a model of this tokenizer's tokens predicts over: 256 bytes, or GPT-2's 50257
    /// tokens padded to 50304 (a multiple of 64).
    pub fn output_dim(self) -> usize {
        match self {
            Tokenizer::Char => BYTE_VOCAB,
            Tokenizer::Gpt2 => GPT2_PADDED_VOCAB,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    root: Option<PathBuf>,
    /// Required.
    #[serde(deserialize_with = "crate::config::present")]
    file: Option<PathBuf>,
    tokenizer: Tokenizer,
    seq_len: usize,
    batch_size: usize,
    val_fraction: f64,
    eval_batches: usize,
    seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            root: None,
            file: None,
            tokenizer: Tokenizer::Char,
            seq_len: 128,
            batch_size: 16,
            val_fraction: 0.1,
            eval_batches: 8,
            seed: 0,
        }
    }
}

#[derive(Debug)]
struct Spec {
    root: Root,
    file: PathBuf,
    tokenizer: Tokenizer,
    seq_len: usize,
    batch_size: usize,
    val_fraction: f64,
    eval_batches: usize,
    seed: u64,
}

fn parse(opts: &serde_yaml::Mapping, pinned: Option<&Path>) -> Result<Box<dyn DataSpec>, OptionError> {
    let o: Options = parse_options(opts)?;
    let file = required(o.file, "file")?;
    if file.as_os_str().is_empty() {
        return Err(OptionError::new(
            "file",
            "",
            "a text file, relative to the data root (e.g. text/tinyshakespeare.txt)",
        ));
    }
    check_ranges(&[("seq_len", o.seq_len, 1, 1 << 20), ("batch_size", o.batch_size, 1, MAX_BATCH)])?;
    if !(o.val_fraction.is_finite() && (0.0..1.0).contains(&o.val_fraction)) {
        return Err(OptionError::new("val_fraction", o.val_fraction, "a fraction in [0, 1) (the tail that validates)"));
    }
    check_ranges(&[("eval_batches", o.eval_batches, 0, 1 << 20)])?;
    Ok(Box::new(Spec {
        root: Root::new(pinned, o.root),
        file,
        tokenizer: o.tokenizer,
        seq_len: o.seq_len,
        batch_size: o.batch_size,
        val_fraction: o.val_fraction,
        eval_batches: o.eval_batches,
        seed: o.seed,
    }))
}

impl DataSpec for Spec {
    fn kind(&self) -> &'static str {
        "text"
    }
    fn info(&self) -> DataInfo {
        DataInfo { input_shape: vec![self.seq_len], output_dim: self.tokenizer.output_dim(), task: Task::LanguageModel }
    }
    fn load(&self) -> anyhow::Result<Box<dyn DataSource>> {
        let root = self.root.resolve();
        let path = root.join(&self.file);
        let (tokens, token_file) = read_tokens(&path, self.tokenizer, &root)?;
        let n = tokens.len();
        let n_val = (n as f64 * self.val_fraction).round() as usize;
        let n_train = n - n_val;
        let need = self.seq_len + 1;
        if n_train < need {
            bail!(
                "{}: the training split has {n_train} tokens, fewer than seq_len + 1 = {need}; use a longer text or a \
                 shorter seq_len",
                path.display()
            );
        }
        if self.eval_batches > 0 && n_val > 0 && n_val < need {
            bail!(
                "{}: the validation split (val_fraction {}) has {n_val} tokens, fewer than seq_len + 1 = {need}",
                path.display(),
                self.val_fraction
            );
        }
        Ok(Box::new(TextSource {
            tokens,
            n_train,
            seq_len: self.seq_len,
            batch: self.batch_size,
            eval_batches: if n_val == 0 { 0 } else { self.eval_batches },
            seed: self.seed,
            token_file,
            file: path,
        }))
    }
}

fn not_found(path: &Path) -> anyhow::Error {
    anyhow!(
        "text corpus not found: looked for {}. Any plain UTF-8 text file works (tinyshakespeare: \
         https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt; public-domain \
         books: https://www.gutenberg.org); put it under the data root and give `file` relative to it; {}",
        path.display(),
        super::how_to_point_at("text")
    )
}

/// The tokens of the file at `path` (the `gpt2` ones cached under `cache_root`'s cache directory).
pub fn tokenize_file(path: &Path, tokenizer: Tokenizer, cache_root: &Path) -> anyhow::Result<Vec<u16>> {
    read_tokens(path, tokenizer, cache_root).map(|(tokens, _)| tokens)
}

/// Where a run's `resolved.yaml` says its tokens can be read back: the text's own bytes (`char`),
/// or the `gpt2` tokens in plexus' cache with the key that names its contents (a reader need not
/// have tiktoken); `None` where the tokens could not be cached.
#[derive(Debug, Clone)]
enum TokenFile {
    Bytes(PathBuf),
    Cache { path: PathBuf, key: String },
}

/// [`tokenize_file`], with the file its tokens can be read back from.
fn read_tokens(path: &Path, tokenizer: Tokenizer, cache_root: &Path) -> anyhow::Result<(Vec<u16>, Option<TokenFile>)> {
    if !path.is_file() {
        return Err(not_found(path));
    }
    let read = || std::fs::read(path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()));
    match tokenizer {
        Tokenizer::Char => {
            Ok((read()?.into_iter().map(u16::from).collect(), Some(TokenFile::Bytes(path.to_path_buf()))))
        }
        Tokenizer::Gpt2 => {
            let meta = std::fs::metadata(path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            let identity = format!("text v1\n{}\nr50k_base", canonical(path).display());
            let key = format!("{identity}\n{} bytes, mtime {mtime} ns", meta.len());
            let cache = cache_path(cache_root, "text-gpt2", &identity);
            let cached = |cache: Option<PathBuf>| {
                cache.filter(|p| p.is_file()).map(|path| TokenFile::Cache { path, key: key.clone() })
            };
            if let Some(payload) = cache.as_deref().and_then(|p| super::files::read_cache(p, &key)) {
                if payload.len().is_multiple_of(2) {
                    let tokens = payload.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
                    return Ok((tokens, cached(cache)));
                }
            }
            let bytes = read()?;
            let text = std::str::from_utf8(&bytes).map_err(|e| {
                anyhow!(
                    "{}: not UTF-8 text (invalid byte at byte offset {}); the gpt2 tokenizer needs UTF-8, the char \
                     tokenizer reads any bytes",
                    path.display(),
                    e.valid_up_to()
                )
            })?;
            let tokens = gpt2_encode(text);
            if let Some(p) = &cache {
                let payload: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
                write_cache(p, &key, &payload);
            }
            Ok((tokens, cached(cache)))
        }
    }
}

/// GPT-2 BPE tokens of `text` (special tokens are not recognised).
pub fn gpt2_encode(text: &str) -> Vec<u16> {
    let bpe = tiktoken_rs::r50k_base_singleton();
    bpe.encode_ordinary(text).into_iter().map(|t| u16::try_from(t).expect("r50k_base tokens are below 50257")).collect()
}

struct TextSource {
    tokens: Vec<u16>,
    /// Tokens `[0, n_train)` train, `[n_train, len)` validate.
    n_train: usize,
    seq_len: usize,
    batch: usize,
    eval_batches: usize,
    seed: u64,
    token_file: Option<TokenFile>,
    /// The text file the tokens come from.
    file: PathBuf,
}

impl TextSource {
    /// The starts of the held-out windows in the token array: `eval_batches · batch` windows
    /// spread evenly over the validation split, the same at every evaluation.
    fn eval_starts(&self) -> Vec<usize> {
        let windows = self.eval_batches * self.batch;
        if windows == 0 {
            return Vec::new();
        }
        let val_len = self.tokens.len() - self.n_train;
        let last = (val_len - self.seq_len - 1) as u128;
        (0..windows)
            .map(|i| self.n_train + if windows == 1 { 0 } else { (i as u128 * last / (windows as u128 - 1)) as usize })
            .collect()
    }

    /// Input `[B, T]` and target (shifted by one) from windows of `T + 1` tokens at `starts`.
    fn windows(&self, starts: impl Iterator<Item = usize>) -> Batch {
        let t = self.seq_len;
        let mut data: Vec<i64> = Vec::with_capacity(self.batch * (t + 1));
        let mut rows = 0;
        for s in starts {
            data.extend(self.tokens[s..s + t + 1].iter().map(|&x| x as i64));
            rows += 1;
        }
        let all = Tensor::from_slice(&data).reshape([rows, t as i64 + 1]);
        Batch { input: all.narrow(1, 0, t as i64).contiguous(), target: all.narrow(1, 1, t as i64).contiguous() }
    }
}

impl DataSource for TextSource {
    fn files(&self) -> Vec<PathBuf> {
        vec![self.file.clone()]
    }

    fn train_batch(&self, index: u64) -> anyhow::Result<Batch> {
        let mut rng = rng_for(self.seed, &[0x7E47, index]);
        let last = self.n_train - self.seq_len - 1;
        let starts: Vec<usize> = (0..self.batch).map(|_| rng.gen_range(0..=last)).collect();
        Ok(self.windows(starts.into_iter()))
    }
    fn batches_per_epoch(&self) -> u64 {
        ((self.n_train - 1) / (self.batch * self.seq_len)).max(1) as u64
    }
    fn eval_batches(&self) -> Vec<Batch> {
        self.eval_starts().chunks(self.batch).map(|starts| self.windows(starts.iter().copied())).collect()
    }
    /// `{kind: text-bytes | text-cache, file, [key], seq_len, batch_size, starts}`: window `i` is
    /// tokens `starts[i] .. starts[i] + seq_len` of the file's token array (input) and one further
    /// on (target). `text-bytes`: every byte of `file` is a token; `text-cache`: the tokens are
    /// plexus' cache of them (u16, little-endian, after the cache's header; `key` names them).
    fn eval_record(&self) -> Option<serde_yaml::Mapping> {
        let mut m = serde_yaml::Mapping::new();
        match self.token_file.as_ref()? {
            TokenFile::Bytes(path) => {
                m.insert("kind".into(), "text-bytes".into());
                m.insert("file".into(), super::files::absolute(path).into());
            }
            TokenFile::Cache { path, key } => {
                m.insert("kind".into(), "text-cache".into());
                m.insert("file".into(), super::files::absolute(path).into());
                m.insert("key".into(), key.clone().into());
            }
        }
        m.insert("seq_len".into(), (self.seq_len as u64).into());
        m.insert("batch_size".into(), (self.batch as u64).into());
        m.insert("starts".into(), self.eval_starts().into_iter().map(|s| serde_yaml::Value::from(s as u64)).collect());
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_shift_by_one_and_eval_spans_the_validation_split() {
        let src = TextSource {
            tokens: (0..100u16).collect(),
            n_train: 80,
            seq_len: 4,
            batch: 3,
            eval_batches: 2,
            seed: 1,
            token_file: None,
            file: PathBuf::from("corpus.txt"),
        };
        let b = src.train_batch(5).unwrap();
        assert_eq!(b.input.size(), vec![3, 4]);
        assert!(b.target.equal(&(&b.input + 1)));
        assert!(Vec::<i64>::try_from(b.target.reshape([-1])).unwrap().iter().all(|&t| t < 80));
        let ev = src.eval_batches();
        assert_eq!(ev.len(), 2);
        let first = Vec::<i64>::try_from(ev[0].input.reshape([-1])).unwrap();
        let last = Vec::<i64>::try_from(ev[1].target.reshape([-1])).unwrap();
        assert_eq!(first[0], 80);
        assert_eq!(*last.last().unwrap(), 99);
    }
}
