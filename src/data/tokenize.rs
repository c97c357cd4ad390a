//! `plexus tokenize`: text files → `train.bin` / `val.bin` (uint16 little-endian token ids,
//! nanoGPT's format, read by `data.kind: tokens`, see [`super::tokens`]) and `meta.json`.
//!
//! Corpora of tens of gigabytes are tokenised in a stream: each input file is read in windows
//! (positioned reads) and cut into chunks of about `chunk_bytes`, chunks are encoded on `threads`
//! threads in rounds and written in order, so memory stays at a few chunks per thread whatever the
//! corpus size. An input that shrinks, grows or is rewritten while it is read is an error naming
//! it, and nothing is written.
//!
//! **Determinism.** The chunk boundaries depend on the text only (never on the thread count), and
//! for `gpt2` they are placed where GPT-2's pre-tokeniser splits anyway: right after a newline
//! that sits between two printable ASCII characters (`x\ny`). There the regex of r50k_base makes
//! `\n` a piece of its own in the whole text as in the chunk (a longer whitespace run before a
//! non-space is split so that its last character stands alone; the run here is just `\n`), and BPE
//! never merges across pieces, so the tokens of the chunks concatenated are the tokens of the whole
//! file: outputs are byte-identical for any thread count and chunk size. A file with no such line
//! break is one chunk. `char` (byte-level) chunks are cut anywhere.
//!
//! **Documents.** With `gpt2` each file is a document: `<|endoftext|>` (50256) follows its tokens,
//! as nanoGPT's OpenWebText preparation appends it to each document. `char` has no such token.
//!
//! **Split.** The first `1 − val_fraction` of all tokens (in file order) go to `train.bin`, the rest
//! to `val.bin` (as the `text` dataset splits). All three files are written atomically (temporary
//! file, then rename), so an interrupted run leaves any previous output intact.

use super::text::{Tokenizer, BYTE_VOCAB, GPT2_VOCAB};
use crate::run_dir::{atomic_write, atomic_write_with};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// GPT-2's `<|endoftext|>`, written after each file's tokens with the `gpt2` encoding.
pub const GPT2_EOT: u16 = 50256;

#[derive(Debug, Clone)]
pub struct TokenizeOptions {
    pub encoding: Tokenizer,
    /// The tail of the token stream that becomes `val.bin`, in `[0, 1)`.
    pub val_fraction: f64,
    /// Encoding threads (≥ 1).
    pub threads: usize,
    /// Target chunk size in bytes (the unit of parallel work; does not change the output).
    pub chunk_bytes: usize,
    /// Show a progress bar over the input bytes (on stderr).
    pub progress: bool,
}

impl Default for TokenizeOptions {
    fn default() -> Self {
        TokenizeOptions {
            encoding: Tokenizer::Gpt2,
            val_fraction: 0.0005,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            chunk_bytes: 1 << 20,
            progress: false,
        }
    }
}

/// What [`tokenize`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizeReport {
    pub train_tokens: u64,
    pub val_tokens: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// The vocabulary size of the token ids an encoding writes.
pub fn vocab(encoding: Tokenizer) -> usize {
    match encoding {
        Tokenizer::Char => BYTE_VOCAB,
        Tokenizer::Gpt2 => GPT2_VOCAB,
    }
}

fn encoding_name(encoding: Tokenizer) -> &'static str {
    match encoding {
        Tokenizer::Char => "char",
        Tokenizer::Gpt2 => "gpt2",
    }
}

/// Tokenises `files` (in order) into `out/train.bin`, `out/val.bin` and `out/meta.json`.
pub fn tokenize(files: &[PathBuf], out: &Path, opts: &TokenizeOptions) -> Result<TokenizeReport> {
    let started = Instant::now();
    if files.is_empty() {
        bail!("tokenize: no input files given");
    }
    if !(opts.val_fraction.is_finite() && (0.0..1.0).contains(&opts.val_fraction)) {
        bail!(
            "--val-fraction {}: expected a fraction in [0, 1) (the tail of the tokens that validates)",
            opts.val_fraction
        );
    }
    if opts.threads == 0 {
        bail!("--threads 0: expected at least 1");
    }
    let mut sizes = Vec::with_capacity(files.len());
    let mut seen: Vec<(PathBuf, &PathBuf)> = Vec::new();
    for f in files {
        let meta = std::fs::metadata(f).map_err(|e| anyhow!("cannot read the input {}: {e}", f.display()))?;
        if !meta.is_file() {
            bail!("the input {} is not a file (give text files)", f.display());
        }
        // The same text twice would be trained on twice, and would leak into val.bin's tail.
        let canonical = std::fs::canonicalize(f).unwrap_or_else(|_| f.clone());
        if let Some((_, first)) = seen.iter().find(|(c, _)| *c == canonical) {
            bail!("the input {} is given twice (also as {}): give each file once", f.display(), first.display());
        }
        seen.push((canonical, f));
        sizes.push(meta.len());
    }
    let total: u64 = sizes.iter().sum();
    let bar = if opts.progress {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "tokenize {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} ({msg})",
            )
            .expect("a valid template"),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };

    // One tokenize per folder at a time; holding the lock, the temporary files in it are what a
    // killed run left behind.
    let _lock = crate::run_dir::lock_dir(out, "token folder", "write into another --out")?;
    remove_leftovers(out)?;
    let (train_path, val_path) = (out.join("train.bin"), out.join("val.bin"));
    let (mut n_train, mut n_val) = (0u64, 0u64);
    atomic_write_with(&train_path, |tmp| {
        let file = std::fs::OpenOptions::new().read(true).write(true).truncate(true).open(tmp)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 22, file);
        let mut n = 0u64;
        for f in files {
            bar.set_message(f.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default());
            n += encode_file(f, opts, &mut w, &bar)?;
        }
        let mut file = w.into_inner().map_err(|e| e.into_error())?;
        if n < 2 {
            bail!(
                "the input{} ({total} bytes) gave {n} token{}: nothing to train on (a token stream needs at least \
                 seq_len + 1 tokens); nothing was written",
                if files.len() == 1 {
                    format!(" {}", files[0].display())
                } else {
                    format!("s ({} files)", files.len())
                },
                if n == 1 { "" } else { "s" }
            );
        }
        n_val = (n as f64 * opts.val_fraction).round() as u64;
        n_train = n - n_val;
        // The tail (small: a fraction of a percent for real corpora) becomes val.bin.
        let mut tail = Vec::with_capacity((2 * n_val) as usize);
        file.seek(SeekFrom::Start(2 * n_train))?;
        file.read_to_end(&mut tail)?;
        atomic_write(&val_path, &tail)?;
        file.set_len(2 * n_train)?;
        Ok(())
    })?;
    bar.finish_and_clear();

    let sources: Vec<serde_json::Value> = files
        .iter()
        .zip(&sizes)
        .map(|(f, &bytes)| serde_json::json!({"path": super::files::canonical(f), "bytes": bytes}))
        .collect();
    let mut meta = serde_json::json!({
        "format": "uint16 little-endian token ids (nanoGPT's train.bin / val.bin)",
        "encoding": encoding_name(opts.encoding),
        "vocab": vocab(opts.encoding),
        "train_tokens": n_train,
        "val_tokens": n_val,
        "val_fraction": opts.val_fraction,
        "sources": sources,
    });
    if opts.encoding == Tokenizer::Gpt2 {
        meta["tokenizer"] = "tiktoken r50k_base".into();
        meta["eot_after_each_file"] = GPT2_EOT.into();
    }
    let text = serde_json::to_string_pretty(&meta)? + "\n";
    atomic_write(&out.join("meta.json"), text.as_bytes())?;
    Ok(TokenizeReport {
        train_tokens: n_train,
        val_tokens: n_val,
        bytes: total,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Removes the temporary files (`.tmp-*`) directly in `out`: those of a killed `plexus tokenize`
/// (call it holding the folder's lock).
fn remove_leftovers(out: &Path) -> Result<()> {
    for e in std::fs::read_dir(out).with_context(|| format!("listing {}", out.display()))? {
        let e = e.with_context(|| format!("listing {}", out.display()))?;
        if e.file_name().to_string_lossy().starts_with(".tmp-") && e.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::remove_file(e.path()).with_context(|| format!("removing the leftover {}", e.path().display()))?;
        }
    }
    Ok(())
}

/// Encodes one file into `w` (uint16 LE); returns the number of tokens written.
///
/// The file is read with positioned reads (`pread`), a window of a few chunks per thread at a time:
/// memory stays bounded, and a file truncated while it is read is an error naming it (a
/// memory-mapped file that shrinks kills the process with SIGBUS instead). The chunk boundaries
/// are those of the whole file: a window's last chunk, which may end anywhere, is carried over to
/// the next window, and a window without a boundary grows until it has one.
fn encode_file(path: &Path, opts: &TokenizeOptions, w: &mut impl Write, bar: &indicatif::ProgressBar) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let file = crate::input_file::open_regular(path).map_err(|e| anyhow!("the input: {e:#}"))?;
    let meta = file.metadata().with_context(|| format!("cannot read the input {}", path.display()))?;
    let (len, modified) = (meta.len(), meta.modified().ok());
    let changed = |at: u64| {
        let now = std::fs::metadata(path).map(|m| m.len().to_string()).unwrap_or_else(|_| "gone".into());
        anyhow!(
            "the input {} changed while it was read: it had {len} bytes when tokenize started, {} now (read up \
             to byte {at}); nothing was written: tokenize it again once nothing writes to it",
            path.display(),
            now
        )
    };
    let round = 4 * opts.threads;
    let window = round.saturating_mul(opts.chunk_bytes.max(1)) as u64;
    // `buf` holds the bytes [start, start + buf.len()) of the file, beginning at a chunk boundary.
    let (mut buf, mut start, mut want) = (Vec::<u8>::new(), 0u64, window);
    let mut written = 0u64;
    let mut out: Vec<u8> = Vec::new();
    loop {
        let have = buf.len();
        let target = want.min(len - start) as usize;
        if target > have {
            buf.resize(target, 0);
            file.read_exact_at(&mut buf[have..], start + have as u64).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => changed(start + have as u64),
                _ => anyhow!("cannot read the input {}: {e}", path.display()),
            })?;
        }
        let eof = start + buf.len() as u64 == len;
        let mut bounds = chunk_bounds(&buf, opts.chunk_bytes, opts.encoding);
        if !eof {
            bounds.pop(); // ends at the window's end, not at a boundary of the file
            if bounds.len() < 2 {
                want = want.saturating_mul(2);
                continue;
            }
        }
        // Rounds of a few chunks per thread: threads take chunks in turn, the round is written in order.
        for group in bounds.windows(2).collect::<Vec<_>>().chunks(round) {
            let results: Vec<OnceLock<Result<Vec<u16>>>> = (0..group.len()).map(|_| OnceLock::new()).collect();
            let next = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..opts.threads.min(group.len()) {
                    s.spawn(|| loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(b) = group.get(i) else { break };
                        let offset = start as usize + b[0];
                        let _ = results[i].set(encode_chunk(&buf[b[0]..b[1]], offset, path, opts.encoding));
                    });
                }
            });
            for (r, b) in results.into_iter().zip(group) {
                let tokens = r.into_inner().expect("every chunk of the round was encoded")?;
                out.clear();
                out.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
                w.write_all(&out)?;
                written += tokens.len() as u64;
                bar.inc((b[1] - b[0]) as u64);
            }
        }
        if eof {
            break;
        }
        let kept = *bounds.last().expect("at least two bounds");
        buf.drain(..kept);
        start += kept as u64;
        want = window.max(buf.len() as u64 + 1);
    }
    // Grown, or rewritten in place: what was read may mix two versions of the file.
    match std::fs::metadata(path) {
        Ok(m) if m.len() == len && m.modified().ok() == modified => {}
        _ => return Err(changed(len)),
    }
    if opts.encoding == Tokenizer::Gpt2 {
        w.write_all(&GPT2_EOT.to_le_bytes())?;
        written += 1;
    }
    Ok(written)
}

/// Chunk boundaries `[0, …, len]` of `bytes`: each chunk is at least `target` bytes (but the last),
/// ending where the encoding's tokens cannot straddle it (see the module docs).
pub fn chunk_bounds(bytes: &[u8], target: usize, encoding: Tokenizer) -> Vec<usize> {
    let target = target.max(1);
    let mut bounds = vec![0];
    let mut pos = 0;
    while pos < bytes.len() {
        let mut cut = pos.saturating_add(target).min(bytes.len());
        if encoding == Tokenizer::Gpt2 {
            // The first `x\ny` at or after the target, cut after the newline.
            while cut < bytes.len()
                && !(cut >= 2
                    && bytes[cut - 1] == b'\n'
                    && bytes[cut].is_ascii_graphic()
                    && bytes[cut - 2].is_ascii_graphic())
            {
                cut += 1;
            }
        }
        bounds.push(cut);
        pos = cut;
    }
    bounds
}

/// The tokens of one chunk starting at byte `offset` of `path` (for error messages).
fn encode_chunk(chunk: &[u8], offset: usize, path: &Path, encoding: Tokenizer) -> Result<Vec<u16>> {
    match encoding {
        Tokenizer::Char => Ok(chunk.iter().map(|&b| u16::from(b)).collect()),
        Tokenizer::Gpt2 => {
            let text = std::str::from_utf8(chunk).map_err(|e| {
                anyhow!(
                    "{}: not UTF-8 text (invalid byte at byte offset {}); the gpt2 encoding needs UTF-8, --encoding \
                     char reads any bytes",
                    path.display(),
                    offset + e.valid_up_to()
                )
            })?;
            Ok(super::text::gpt2_encode(text))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_chunks_cut_after_a_newline_between_printable_characters() {
        let text = b"ab\n\ncd\nef  \ngh\nij";
        let b = chunk_bounds(text, 1, Tokenizer::Gpt2);
        assert_eq!(b, vec![0, 7, 15, text.len()]);
        assert_eq!(chunk_bounds(text, 100, Tokenizer::Gpt2), vec![0, text.len()]);
        assert_eq!(chunk_bounds(b"abcde", 2, Tokenizer::Char), vec![0, 2, 4, 5]);
        assert_eq!(chunk_bounds(b"", 2, Tokenizer::Gpt2), vec![0]);
    }
}
