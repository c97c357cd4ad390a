//! Pre-tokenised corpora: `plexus tokenize` (streamed, multi-threaded, deterministic) and
//! `data.kind: tokens` (memory-mapped nanoGPT `train.bin` / `val.bin`). Everything runs on text
//! generated here, so no data root is needed.

use crate::common;

use plexus::data::text::{gpt2_encode, Tokenizer};
use plexus::data::tokenize::{self, TokenizeOptions, GPT2_EOT};
use plexus::data::{self, Batch, DataSource};
use std::path::{Path, PathBuf};
use tch::Kind;

fn yaml(s: &str) -> serde_yaml::Mapping {
    serde_yaml::from_str(s).unwrap()
}

/// Seeded pseudo-random English-like text: lines of 3–12 words with punctuation, blank lines,
/// indentation and some non-ASCII, so that chunk boundaries meet every kind of line break.
fn generated_text(lines: usize, seed: u64) -> String {
    const WORDS: [&str; 24] = [
        "the", "river", "ran", "quietly", "past", "old", "stone", "houses", "and", "children", "watched", "boats",
        "drift", "slowly", "towards", "sea", "while", "café", "naïve", "1984", "don't", "it's", "(maybe)", "—",
    ];
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = |n: u64| {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let mut s = String::new();
    for _ in 0..lines {
        match next(10) {
            0 => s.push('\n'),
            1 => s.push_str("    "),
            2 => s.push_str("  \n"),
            _ => {}
        }
        let n = 3 + next(10);
        for w in 0..n {
            if w > 0 {
                s.push(' ');
            }
            s.push_str(WORDS[next(WORDS.len() as u64) as usize]);
        }
        s.push_str([".", ",", "!", "?", ":", ""][next(6) as usize]);
        s.push('\n');
    }
    s
}

fn opts(encoding: Tokenizer, threads: usize, chunk_bytes: usize) -> TokenizeOptions {
    TokenizeOptions { encoding, val_fraction: 0.1, threads, chunk_bytes, progress: false }
}

fn read_tokens(path: &Path) -> Vec<u16> {
    std::fs::read(path).unwrap().chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

fn longs(t: &tch::Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.reshape([-1])).unwrap()
}

fn load(root: &Path, options: &str) -> Box<dyn DataSource> {
    let spec = data::parse_at("tokens", root, &yaml(options)).unwrap_or_else(|e| panic!("{e:?}"));
    spec.load().unwrap_or_else(|e| panic!("{e:#}"))
}

fn load_err(root: &Path, options: &str) -> String {
    match data::parse_at("tokens", root, &yaml(options)).unwrap().load() {
        Ok(_) => panic!("expected {options} to fail to load"),
        Err(e) => format!("{e:#}"),
    }
}

fn same(a: &Batch, b: &Batch) -> bool {
    a.input.equal(&b.input) && a.target.equal(&b.target)
}

/// Writes `text` to `<root>/corpus.txt` and tokenises it into `<root>/<dir>`.
fn corpus(root: &Path, dir: &str, text: &str, o: &TokenizeOptions) -> PathBuf {
    let file = root.join("corpus.txt");
    std::fs::write(&file, text).unwrap();
    tokenize::tokenize(std::slice::from_ref(&file), &root.join(dir), o).unwrap();
    file
}

/// The whole pipeline: text → tokenize (many small chunks on several threads) → tokens loader →
/// batches that decode back to windows of the text, and evaluation that starts at the split.
#[test]
fn tokenized_text_round_trips_through_the_tokens_loader() {
    let tmp = tempfile::tempdir().unwrap();
    let text = generated_text(400, 1);
    corpus(tmp.path(), "tok", &text, &opts(Tokenizer::Gpt2, 3, 97));
    let mut stream = gpt2_encode(&text);
    stream.push(GPT2_EOT);
    let n_val = (stream.len() as f64 * 0.1).round() as usize;
    let n_train = stream.len() - n_val;
    assert_eq!(read_tokens(&tmp.path().join("tok/train.bin")), &stream[..n_train], "train.bin = the head");
    assert_eq!(read_tokens(&tmp.path().join("tok/val.bin")), &stream[n_train..], "val.bin = the tail");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("tok/meta.json")).unwrap()).unwrap();
    assert_eq!(meta["encoding"], "gpt2");
    assert_eq!(meta["vocab"], 50257);
    assert_eq!(
        (meta["train_tokens"].as_u64(), meta["val_tokens"].as_u64()),
        (Some(n_train as u64), Some(n_val as u64))
    );

    let src = load(tmp.path(), "{dir: tok, seq_len: 16, batch_size: 4, eval_batches: 2, seed: 3}");
    assert_eq!(src.batches_per_epoch(), ((n_train - 1) / (4 * 16)) as u64);
    let bpe = tiktoken_rs::r50k_base_singleton();
    let train_text: String = bpe.decode(&stream[..n_train].iter().map(|&t| t as u32).collect::<Vec<_>>()).unwrap();
    for i in [0u64, 1, 1000] {
        let b = src.train_batch(i).unwrap();
        assert_eq!((b.input.size(), b.input.kind(), b.target.kind()), (vec![4, 16], Kind::Int64, Kind::Int64));
        assert!(b.input.narrow(1, 1, 15).equal(&b.target.narrow(1, 0, 15)), "target = input shifted by one");
        for r in 0..4 {
            let mut window: Vec<u16> = longs(&b.input.get(r)).into_iter().map(|t| t as u16).collect();
            window.push(*longs(&b.target.get(r)).last().unwrap() as u16);
            assert!(stream[..n_train].windows(17).any(|w| w == window.as_slice()), "batch {i} row {r}: a train window");
            // Decoded, a window is a piece of the training text (BPE tokens are whole UTF-8 here).
            if let Ok(s) = bpe.decode(&window.iter().map(|&t| t as u32).collect::<Vec<_>>()) {
                assert!(train_text.contains(&s), "batch {i} row {r} decodes to {s:?}, not in the text");
            }
        }
    }
    let ev = src.eval_batches();
    assert_eq!(ev.len(), 2);
    assert_eq!(longs(&ev[0].input.get(0)), stream[n_train..n_train + 16].iter().map(|&t| t as i64).collect::<Vec<_>>());
    let end = longs(&ev[1].target.get(3));
    assert_eq!(
        end,
        stream[stream.len() - 16..].iter().map(|&t| t as i64).collect::<Vec<_>>(),
        "the last window ends the file"
    );
}

/// Training batch `i` is a pure function of `(seed, i)`: the same from two loads, in any order;
/// another index or seed gives other windows.
#[test]
fn batches_are_a_function_of_seed_and_index() {
    let tmp = tempfile::tempdir().unwrap();
    corpus(tmp.path(), "tok", &generated_text(300, 2), &opts(Tokenizer::Char, 2, 1 << 20));
    let o = "{dir: tok, seq_len: 32, batch_size: 8, vocab: 256, eval_batches: 1, seed: 7}";
    let (a, b) = (load(tmp.path(), o), load(tmp.path(), o));
    let forward: Vec<Batch> = (0..5).map(|i| a.train_batch(i).unwrap()).collect();
    for i in (0..5).rev() {
        assert!(same(&forward[i as usize], &b.train_batch(i).unwrap()), "batch {i} differs between loads");
    }
    assert!(!forward[0].input.equal(&forward[1].input));
    let other = load(tmp.path(), "{dir: tok, seq_len: 32, batch_size: 8, vocab: 256, eval_batches: 1, seed: 8}");
    assert!(!forward[0].input.equal(&other.train_batch(0).unwrap().input), "the seed changes the windows");
    assert!(same(&a.eval_batches()[0], &other.eval_batches()[0]), "evaluation does not depend on the seed");
}

/// The same input gives byte-identical train.bin, val.bin and meta.json whatever the thread count
/// and chunk size, and the chunked tokens are exactly the tokens of the whole text.
#[test]
fn tokenize_is_deterministic_across_threads_and_chunk_sizes() {
    let tmp = tempfile::tempdir().unwrap();
    let (f1, f2) = (tmp.path().join("a.txt"), tmp.path().join("b.txt"));
    let (t1, t2) = (generated_text(500, 3), generated_text(200, 4));
    std::fs::write(&f1, &t1).unwrap();
    std::fs::write(&f2, &t2).unwrap();
    let files = [f1, f2];
    for encoding in [Tokenizer::Gpt2, Tokenizer::Char] {
        let mut outputs = Vec::new();
        for (threads, chunk) in [(1, usize::MAX), (1, 64), (2, 64), (4, 64), (3, 1000), (1, 1)] {
            let out = tmp.path().join(format!("{encoding:?}-{threads}-{chunk}"));
            tokenize::tokenize(&files, &out, &opts(encoding, threads, chunk)).unwrap();
            let read = |f: &str| std::fs::read(out.join(f)).unwrap();
            outputs.push(((threads, chunk), [read("train.bin"), read("val.bin"), read("meta.json")]));
        }
        for (case, o) in &outputs[1..] {
            assert!(o == &outputs[0].1, "{encoding:?}: threads/chunk {case:?} differ from one thread, one chunk");
        }
        let expected: Vec<u16> = match encoding {
            Tokenizer::Gpt2 => [gpt2_encode(&t1), vec![GPT2_EOT], gpt2_encode(&t2), vec![GPT2_EOT]].concat(),
            Tokenizer::Char => t1.bytes().chain(t2.bytes()).map(u16::from).collect(),
        };
        let [train, val, _] = &outputs[0].1;
        let all: Vec<u16> = train
            .iter()
            .chain(val)
            .copied()
            .collect::<Vec<u8>>()
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(all, expected, "{encoding:?}: tokens of the whole files, in order");
    }
}

/// An input truncated while it is tokenised is an error naming it, and nothing is written (the
/// input was memory-mapped: a truncation killed the process with SIGBUS and no message). The file
/// is cut once the first tokens reach the disk, so the reader is mid-file.
#[test]
fn an_input_truncated_while_it_is_read_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("big.txt");
    let text = generated_text(20_000, 5).repeat(20);
    assert!(text.len() > 12 << 20, "{} bytes", text.len());
    std::fs::write(&input, &text).unwrap();
    let out = tmp.path().join("tk");
    let job = {
        let (input, out) = (input.clone(), out.clone());
        std::thread::spawn(move || tokenize::tokenize(&[input], &out, &opts(Tokenizer::Gpt2, 1, 1 << 16)))
    };
    let started = std::time::Instant::now();
    loop {
        let writing =
            std::fs::read_dir(&out).into_iter().flatten().flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with(".tmp-") && e.metadata().is_ok_and(|m| m.len() > 0)
            });
        if writing {
            std::fs::OpenOptions::new().write(true).open(&input).unwrap().set_len(1000).unwrap();
            break;
        }
        assert!(!job.is_finished(), "tokenize finished before the first tokens were flushed");
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let e = format!("{:#}", job.join().unwrap().unwrap_err());
    assert!(e.contains("big.txt changed while it was read") && e.contains("1000 now"), "{e}");
    assert!(!out.join("train.bin").exists() && !out.join("val.bin").exists(), "nothing is written");
}

#[test]
fn tokenize_errors_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.txt");
    std::fs::write(&bad, [b'a', b'\n', b'b', 0xff, b'c']).unwrap();
    let e = format!(
        "{:#}",
        tokenize::tokenize(std::slice::from_ref(&bad), &tmp.path().join("o"), &opts(Tokenizer::Gpt2, 2, 1))
            .unwrap_err()
    );
    assert!(e.contains("bad.txt") && e.contains("byte offset 3"), "{e}");
    assert!(!tmp.path().join("o/train.bin").exists(), "nothing is left behind");
    // Char reads any bytes.
    tokenize::tokenize(std::slice::from_ref(&bad), &tmp.path().join("o"), &opts(Tokenizer::Char, 2, 1)).unwrap();
    let missing = tmp.path().join("nope.txt");
    let e = format!(
        "{:#}",
        tokenize::tokenize(&[missing], &tmp.path().join("o"), &opts(Tokenizer::Char, 1, 1)).unwrap_err()
    );
    assert!(e.contains("nope.txt"), "{e}");
}

/// Missing files, odd lengths, too-short files and ids beyond the vocabulary are errors naming
/// the file (and the offset, for a bad id) and what to do.
#[test]
fn token_file_errors_say_what_is_wrong_and_where() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let e = load_err(root, "{dir: owt}");
    assert!(e.contains(&root.join("owt/train.bin").display().to_string()) && e.contains("plexus tokenize"), "{e}");

    let dir = root.join("t");
    std::fs::create_dir(&dir).unwrap();
    let write = |name: &str, tokens: &[u16]| {
        std::fs::write(dir.join(name), tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>()).unwrap()
    };
    write("train.bin", &[1; 100]);
    let e = load_err(root, "{dir: t, seq_len: 8}");
    assert!(e.contains("val.bin") && e.contains("plexus tokenize"), "{e}");
    load(root, "{dir: t, seq_len: 8, eval_batches: 0}"); // no val.bin needed without evaluation
                                                         // An absolute `dir` is read where it says, whatever the data root.
    load(
        Path::new("/nonexistent-root"),
        &format!("{{dir: {}, seq_len: 8, eval_batches: 0}}", root.join("t").display()),
    );

    write("val.bin", &[2; 5]);
    let e = load_err(root, "{dir: t, seq_len: 8}");
    assert!(e.contains("val.bin") && e.contains("5 tokens") && e.contains("seq_len + 1 = 9"), "{e}");
    let e = load_err(root, "{dir: t, seq_len: 100}");
    assert!(e.contains("train.bin") && e.contains("100 tokens"), "{e}");

    std::fs::write(dir.join("val.bin"), [0u8; 21]).unwrap();
    let e = load_err(root, "{dir: t, seq_len: 8}");
    assert!(e.contains("val.bin") && e.contains("21 bytes") && e.contains("odd"), "{e}");

    let mut tokens = vec![3u16; 100];
    tokens[77] = 300;
    write("val.bin", &[2; 50]);
    write("train.bin", &tokens);
    let e = load_err(root, "{dir: t, seq_len: 8, vocab: 256}");
    assert!(
        e.contains("train.bin") && e.contains("token 300") && e.contains("token offset 77") && e.contains("256"),
        "{e}"
    );
    load(root, "{dir: t, seq_len: 8, vocab: 301}");

    std::fs::write(dir.join("meta.json"), r#"{"encoding": "gpt2", "vocab": 50257}"#).unwrap();
    let e = format!("{:?}", data::parse_at("tokens", root, &yaml("{dir: t, seq_len: 8, vocab: 301}")).unwrap_err());
    assert!(e.contains("meta.json") && e.contains("50257") && e.contains("vocab"), "{e}");

    for (o, key) in [
        ("{dir: ''}", "dir"),
        ("{dir: t, vocab: 70000}", "vocab"),
        ("{dir: t, seq_len: 0}", "seq_len"),
        ("{dir: t, batch: 3}", "batch"),
    ] {
        let e = data::parse_at("tokens", root, &yaml(o)).unwrap_err();
        assert!(format!("{e:?}").contains(key), "{o}: {e:?}");
    }
}

/// A few steps of a tiny GPT on tokenised text, through the trainer: the loss falls.
#[test]
fn a_tiny_gpt_trains_on_tokenized_text() {
    let tmp = tempfile::tempdir().unwrap();
    corpus(tmp.path(), "tok", &generated_text(300, 5), &opts(Tokenizer::Gpt2, 2, 1 << 20));
    let data = "{kind: tokens, dir: tok, seq_len: 16, batch_size: 8, eval_batches: 2}";
    let cfg = format!(
        "name: tokens-gpt\nseed: 0\ndevice: cpu\nmodel: {{kind: gpt, width: 32, depth: 2, heads: 2}}\ntopology: {{kind: residual}}\n\
         data: {data}\ntrain: {{optimizer: adamw, lr: 0.01, steps: 30}}\nlog: {{every: 1, eval_every: 30}}\n"
    );
    let mut exp = plexus::experiment::Experiment::from_str(&cfg, "<test>", &[]).unwrap_or_else(|e| panic!("{e}"));
    // Read from the temporary root whatever PLEXUS_DATA says.
    let mut options = yaml(data);
    options.remove("kind");
    exp.data = data::parse_at("tokens", tmp.path(), &options).unwrap();
    let run = plexus::run_dir::RunDir::create(&tmp.path().join("run")).unwrap();
    let s = plexus::train::train(&exp, &run, &Default::default()).unwrap();
    assert!(s.initial_loss > 9.0, "starts near ln(50304) ≈ 10.8: {}", s.initial_loss);
    assert!(s.final_loss < 0.6 * s.initial_loss, "{} → {}", s.initial_loss, s.final_loss);
    assert!(s.eval.as_ref().is_some_and(|e| e.loss < 0.7 * s.initial_loss), "{:?}", s.eval);
}

#[test]
fn the_tokenize_command_writes_a_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a.txt"), generated_text(100, 6)).unwrap();
    let o = common::plexus(&["tokenize", "a.txt", "--out", "tok", "--encoding", "char", "--threads", "2"], tmp.path());
    let (out, err) = common::text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("train.bin") && out.contains("val.bin"), "{out}");
    for f in ["train.bin", "val.bin", "meta.json"] {
        assert!(tmp.path().join("tok").join(f).is_file(), "{f}");
    }
    let o = common::plexus(&["tokenize", "a.txt", "--out", "tok", "--encoding", "bpe"], tmp.path());
    assert!(!o.status.success() && common::text(&o).1.contains("gpt2"), "{:?}", common::text(&o));
}

/// A training shard truncated in place during a run (as re-running a prepare script over the
/// folder does) is an error naming the file at the next batch, not SIGBUS; so is one that grew.
/// A `train.bin` that is a directory is named as such.
#[test]
fn a_shard_that_changes_under_a_run_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let dir = root.join("t");
    std::fs::create_dir(&dir).unwrap();
    let tokens: Vec<u8> = (0..4000u16).map(|t| t % 50).flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(dir.join("train.bin"), &tokens).unwrap();
    let src = load(root, "{dir: t, seq_len: 16, batch_size: 4, vocab: 50, eval_batches: 0}");
    let first = src.train_batch(0).unwrap();
    assert_eq!(first.input.size(), vec![4, 16]);
    // Truncated in place (same inode), as `open(..., "w")` does.
    std::fs::OpenOptions::new().write(true).open(dir.join("train.bin")).unwrap().set_len(100).unwrap();
    let e = format!("{:#}", src.train_batch(1).unwrap_err());
    let path = dir.join("train.bin").display().to_string();
    assert!(e.contains(&path) && e.contains("changed while this run read it") && e.contains("100 now"), "{e}");
    // Longer than at open: also a rewrite.
    std::fs::write(dir.join("train.bin"), [tokens.clone(), tokens].concat()).unwrap();
    let e = format!("{:#}", src.train_batch(2).unwrap_err());
    assert!(e.contains(&path) && e.contains("changed"), "{e}");

    std::fs::remove_file(dir.join("train.bin")).unwrap();
    std::fs::create_dir(dir.join("train.bin")).unwrap();
    let e = load_err(root, "{dir: t, seq_len: 16, eval_batches: 0}");
    assert!(e.contains(&path) && e.contains("is a directory, not a token file"), "{e}");
    // A link to a device, and a FIFO (refused at once, not waited on), say what they are.
    std::fs::remove_dir(dir.join("train.bin")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("train.bin")).unwrap();
    let e = load_err(root, "{dir: t, seq_len: 16, eval_batches: 0}");
    assert!(e.contains(&path) && e.contains("is a character device, not a token file"), "{e}");
    std::fs::remove_file(dir.join("train.bin")).unwrap();
    let c = std::ffi::CString::new(dir.join("train.bin").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = load_err(root, "{dir: t, seq_len: 16, eval_batches: 0}");
    assert!(e.contains(&path) && e.contains("is a FIFO (named pipe), not a token file"), "{e}");
}

/// Text that gives no tokens is an error and writes nothing; a killed tokenize's temporary files
/// are removed by the next run into the folder, and two runs into one folder cannot overlap.
#[test]
fn tokenize_refuses_empty_input_and_cleans_what_a_killed_run_left() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let out = tmp.path().join("o");
    let e = format!(
        "{:#}",
        tokenize::tokenize(std::slice::from_ref(&empty), &out, &opts(Tokenizer::Char, 1, 1)).unwrap_err()
    );
    assert!(e.contains("empty.txt") && e.contains("0 tokens") && e.contains("nothing was written"), "{e}");
    for f in ["train.bin", "val.bin", "meta.json"] {
        assert!(!out.join(f).exists(), "{f} was written");
    }
    // What `kill -9` during the encoding leaves: the temporary train.bin.
    let leftover = out.join(".tmp-Ab12Cd.bin");
    std::fs::write(&leftover, [0u8; 64]).unwrap();
    let text = tmp.path().join("a.txt");
    std::fs::write(&text, "some text to tokenise\n".repeat(20)).unwrap();
    tokenize::tokenize(std::slice::from_ref(&text), &out, &opts(Tokenizer::Char, 1, 1)).unwrap();
    assert!(!leftover.exists(), "the leftover temporary file was removed");
    let names: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.starts_with(".tmp-")), "{names:?}");
    // A second tokenize into the folder while one holds it is refused, naming the holder.
    let _held = plexus::run_dir::lock_dir(&out, "token folder", "x").unwrap();
    let e = std::process::Command::new(env!("CARGO_BIN_EXE_plexus"))
        .args(["tokenize", text.to_str().unwrap(), "--out", out.to_str().unwrap(), "--encoding", "char"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&e.stderr);
    assert_eq!(e.status.code(), Some(1), "{err}");
    assert!(err.contains("token folder") && err.contains("in use by another plexus process"), "{err}");
}

/// The vocabulary comes from the data: a char corpus (meta.json: 256) builds a 256-way model
/// without `vocab` in the config, a GPT-2 corpus (50,257) the padded 50,304; a config whose
/// `vocab` the tokens' vocabulary does not fit, or that is larger than it padded (a char corpus
/// in a 50,304-token model: 3.3 M parameters instead of 141 k), is an error naming both.
#[test]
fn the_vocabulary_comes_from_the_tokens_meta_json() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    corpus(root, "chars", &generated_text(400, 3), &opts(Tokenizer::Char, 1, 1 << 12));
    let info = |o: &str| data::parse_at("tokens", root, &yaml(o)).map(|s| s.info().output_dim);
    assert_eq!(info("{dir: chars, seq_len: 16}").unwrap(), 256);
    assert_eq!(info("{dir: chars, seq_len: 16, vocab: 256}").unwrap(), 256);
    let e = format!("{:?}", info("{dir: chars, seq_len: 16, vocab: 50304}").unwrap_err());
    assert!(e.contains("50304") && e.contains("256") && e.contains("char"), "{e}");
    std::fs::write(root.join("chars/meta.json"), r#"{"encoding": "gpt2", "vocab": 50257}"#).unwrap();
    assert_eq!(info("{dir: chars, seq_len: 16}").unwrap(), 50304);
    // No meta.json: GPT-2's padded vocabulary, as before.
    std::fs::remove_file(root.join("chars/meta.json")).unwrap();
    assert_eq!(info("{dir: chars, seq_len: 16}").unwrap(), 50304);
}

/// `meta.json` is read like every other input: a FIFO, a directory, text that is not JSON and a
/// vocabulary that is not an integer uint16 ids can index (a string, 65,537, 2⁶⁴−1) are refused at
/// once, naming meta.json and the range, instead of hanging or falling back to GPT-2's 50,304.
#[test]
fn a_meta_json_that_is_not_a_vocabulary_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    corpus(root, "chars", &generated_text(200, 4), &opts(Tokenizer::Char, 1, 1 << 12));
    let meta = root.join("chars/meta.json");
    let err = || {
        let e = data::parse_at("tokens", root, &yaml("{dir: chars, seq_len: 16}")).unwrap_err();
        format!("key {}: {}", e.key, e.allowed)
    };
    let t = std::time::Instant::now();
    std::fs::remove_file(&meta).unwrap();
    let c = std::ffi::CString::new(meta.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = err();
    assert!(e.contains("meta.json is a FIFO"), "{e}");
    assert!(t.elapsed() < std::time::Duration::from_secs(10), "{:?}", t.elapsed());
    std::fs::remove_file(&meta).unwrap();
    std::fs::create_dir(&meta).unwrap();
    assert!(err().contains("meta.json is a directory"), "{}", err());
    std::fs::remove_dir(&meta).unwrap();
    for (text, words) in [
        ("garbage", "not JSON"),
        (r#"{"vocab": "50257"}"#, "`vocab` is \"50257\", not an integer in 2..=65536"),
        (r#"{"vocab": 65537}"#, "`vocab` is 65537, not an integer in 2..=65536"),
        (r#"{"vocab": 18446744073709551615}"#, "not an integer in 2..=65536"),
        (r#"{"encoding": "char"}"#, "no `vocab`"),
    ] {
        std::fs::write(&meta, text).unwrap();
        let e = err();
        assert!(e.starts_with("key dir:") && e.contains("chars/meta.json") && e.contains(words), "{text}: {e}");
    }
    std::fs::write(&meta, r#"{"vocab": 65536, "encoding": "test"}"#).unwrap();
    let info = data::parse_at("tokens", root, &yaml("{dir: chars, seq_len: 16}")).unwrap().info();
    assert_eq!(info.output_dim, 65536);
}
