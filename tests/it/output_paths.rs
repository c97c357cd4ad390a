//! Writers own only what they create: every output path a verb takes (`bench --csv`, `--trace`,
//! `--out`; `sweep --slurm`, `--out`; `report --out`; `plot --out`; `train --out`; `analyze
//! --correlate`'s CSV and its TensorBoard file) is checked before any work. A symbolic link, a
//! directory where a file goes (a file where a folder goes), a FIFO or a character device is
//! refused with an error naming the path and what it is, and is left as it was, with nothing
//! written beside it. A table printed into a pipe closed early ends the verb quietly.

use crate::common;

use common::{plexus, text};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A 4-step H-ACN on a 3-layer linear network (the fastest run there is).
const TINY: &str = "name: tiny\ndevice: cpu\nmodel: {kind: lnn, depth: 3}\ntopology: {kind: hacn}\n\
data: {kind: whitened_regression, dim: 8, samples: 16, rank: 4}\ntrain: {lr: 0.05, steps: 4}\n";

/// The odd things an output path can be, made under `dir/name`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Odd {
    /// A symbolic link to a regular file (whose bytes must stay).
    LinkToFile,
    /// An empty directory (for a file output) — or a regular file (for a folder output).
    WrongKind,
    Fifo,
    /// A character device: a copy of /dev/null made with mknod where the test may (root), else
    /// /dev/null itself (which a process without root could not replace anyway).
    CharDevice,
}

const ODD: [Odd; 4] = [Odd::LinkToFile, Odd::WrongKind, Odd::Fifo, Odd::CharDevice];

/// What `path` is, in the words the error uses, and a fingerprint that must not change.
fn describe(path: &Path) -> (String, String) {
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let t = m.file_type();
    if t.is_symlink() {
        let target = std::fs::read_link(path).unwrap();
        let bytes = std::fs::read(path).unwrap_or_default();
        ("a symbolic link".into(), format!("link to {} holding {:?}", target.display(), bytes))
    } else if t.is_dir() {
        let entries = std::fs::read_dir(path).unwrap().count();
        ("a directory".into(), format!("directory of {entries} entries"))
    } else if t.is_fifo() {
        ("a FIFO".into(), "fifo".into())
    } else if t.is_char_device() {
        use std::os::unix::fs::MetadataExt;
        ("a character device".into(), format!("char device {}", m.rdev()))
    } else {
        ("a regular file".into(), format!("file of {:?}", std::fs::read(path).unwrap()))
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

/// Makes the odd `kind` at `dir/name` (a folder output when `folder`) and returns its path.
fn make(dir: &Path, name: &str, kind: Odd, folder: bool) -> PathBuf {
    let path = dir.join(name);
    match kind {
        Odd::LinkToFile => {
            std::fs::write(dir.join(format!("{name}.target")), b"keep me\n").unwrap();
            std::os::unix::fs::symlink(format!("{name}.target"), &path).unwrap();
        }
        Odd::WrongKind if folder => std::fs::write(&path, b"not a folder\n").unwrap(),
        Odd::WrongKind => std::fs::create_dir(&path).unwrap(),
        Odd::Fifo => mkfifo(&path),
        Odd::CharDevice => {
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path; /dev/null's device number (1, 3).
            let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0;
            if !made {
                return PathBuf::from("/dev/null");
            }
        }
    }
    path
}

/// The names in `dir`, sorted (what "nothing beside it" compares).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// A scratch folder with the tiny config and two finished tiny runs (`runs/a`, `runs/b`).
fn setup() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("tiny.yaml"), TINY).unwrap();
    for (run, seed) in [("a", "0"), ("b", "1")] {
        let o = plexus(
            &["train", "tiny.yaml", "--out", &format!("runs/{run}"), "--set", &format!("seed={seed}"), "--quiet"],
            tmp.path(),
        );
        assert!(o.status.success(), "{:?}", text(&o));
    }
    tmp
}

/// Runs `args` (`{}` stands for the odd path, `{case}` for its folder) against each odd kind in a
/// fresh folder `case-…/` and checks the refusal: a non-zero exit, an error naming the path and what
/// it is, the path as it was, nothing new beside it, and (`absent`) paths that must not have been
/// created.
fn refuses(t: &Path, label: &str, args: &[&str], folder: bool, absent: &[&str]) {
    for kind in ODD {
        let case = t.join(format!("case-{label}-{kind:?}"));
        std::fs::create_dir(&case).unwrap();
        refused(t, &format!("{label} {kind:?}"), args, &case, "odd", kind, folder, absent);
    }
}

/// One refusal of [`refuses`], with the odd `kind` made at `dir/name`; undone afterwards.
#[allow(clippy::too_many_arguments)]
fn refused(t: &Path, label: &str, args: &[&str], dir: &Path, name: &str, kind: Odd, folder: bool, absent: &[&str]) {
    let odd = make(dir, name, kind, folder);
    let before = (describe(&odd), names(dir));
    let odd_s = odd.display().to_string();
    let args: Vec<String> =
        args.iter().map(|a| a.replace("{}", &odd_s).replace("{case}", dir.to_str().unwrap())).collect();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = plexus(&argv, t);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{label}: plexus {args:?} succeeded:\n{out}{err}");
    assert!(!err.contains("panicked"), "{label}: {err}");
    // The path as given, or as the verb names it under the folder it was given (runs/a/…).
    let (what, named) = (&before.0 .0, odd.strip_prefix(t).unwrap_or(&odd).display().to_string());
    assert!(err.contains(&format!("{named} is {what}")), "{label}: the error does not say `{named} is {what}`:\n{err}");
    assert!(!out.contains("Chrome trace") && !out.contains("job array"), "{label}: a success line:\n{out}");
    assert_eq!((describe(&odd), names(dir)), before, "{label}: the path or its folder changed");
    for a in absent {
        assert!(!t.join(a).exists(), "{label}: {a} was created");
    }
    if odd != Path::new("/dev/null") {
        if odd.is_dir() && !odd.is_symlink() {
            std::fs::remove_dir(&odd).unwrap();
        } else {
            std::fs::remove_file(&odd).unwrap();
        }
        let _ = std::fs::remove_file(dir.join(format!("{name}.target")));
    }
}

#[test]
fn every_writing_verb_refuses_odd_output_paths_and_leaves_them_as_they_were() {
    let tmp = setup();
    let t = tmp.path();
    let bench = ["bench", "tiny.yaml", "--steps", "1", "--warmup", "0"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> { bench.iter().chain(extra).copied().collect() };
    // Files.
    refuses(t, "bench-csv", &with(&["--csv", "{}"]), false, &[]);
    refuses(t, "bench-compare-csv", &with(&["--compare", "residual,hacn", "--csv", "{}"]), false, &[]);
    refuses(t, "bench-trace", &with(&["--profile", "--trace", "{}"]), false, &["runs/bench-profile"]);
    refuses(t, "sweep-slurm", &["sweep", "tiny.yaml", "--out", "sw", "--slurm", "{}"], false, &["sw"]);
    refuses(t, "sweep-slurm-dry", &["sweep", "tiny.yaml", "--out", "sw", "--slurm", "{}", "--dry-run"], false, &["sw"]);
    // Folders.
    refuses(t, "bench-depths-out", &with(&["--depths", "2", "--out", "{}"]), true, &[]);
    refuses(t, "sweep-out", &["sweep", "tiny.yaml", "--out", "{}", "--slurm", "{case}/job.sh"], true, &[]);
    refuses(t, "report-out", &["report", "runs", "--out", "{}"], true, &[]);
    refuses(t, "plot-out", &["plot", "runs/a", "--out", "{}"], true, &[]);
    refuses(t, "train-out", &["train", "tiny.yaml", "--out", "{}"], true, &[]);
    refuses(t, "demo-out", &["demo", "--figure", "lnn-fig2b", "--out", "{}"], true, &[]);
}

/// `analyze --correlate` writes `correlation.csv` beside the runs, and every analysis replaces its
/// TensorBoard event file: an odd path at either is refused before any work, and a failed analysis
/// leaves no event file of its own.
#[test]
fn analyze_refuses_odd_paths_for_its_csv_and_event_file_and_leaves_no_stray_event_file() {
    let tmp = setup();
    let t = tmp.path();
    let events = t.join("runs/a/tensorboard");
    assert!(events.is_dir(), "the tiny run logs TensorBoard events");
    let name = plexus::analysis::ANALYSIS_EVENTS;
    for kind in ODD {
        let args = ["analyze", "runs/a", "--repeats", "1"];
        refused(t, &format!("event file {kind:?}"), &args, &events, name, kind, false, &["runs/a/layerwise.csv"]);
        let args = ["analyze", "runs/a", "runs/b", "--repeats", "1", "--correlate"];
        let runs = t.join("runs");
        refused(t, &format!("correlation {kind:?}"), &args, &runs, "correlation.csv", kind, false, &[]);
    }
    let o = plexus(&["analyze", "runs/a", "--repeats", "1"], t);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(events.join(name).is_file());
}

/// The writes that succeed: `--trace` leaves the trace and no temporary file; `--formats pdf`
/// announces PDFs only; `--format verdicts --out DIR` writes DIR/verdicts.md; a report whose
/// folder cannot be written entirely leaves none of it.
#[test]
fn traces_reports_and_verdicts_are_written_whole_and_announced_as_written() {
    let tmp = setup();
    let t = tmp.path();
    let o = plexus(&["bench", "tiny.yaml", "--steps", "1", "--warmup", "0", "--profile", "--trace", "tr/t.json"], t);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("Chrome trace of the profiled step: tr/t.json"), "{out}");
    assert!(std::fs::read_to_string(t.join("tr/t.json")).unwrap().contains("traceEvents"));
    assert_eq!(names(&t.join("tr")), ["t.json"], "a temporary file was left beside the trace");
    let o = plexus(&["bench", "tiny.yaml", "--trace", "x.json"], t);
    assert!(!o.status.success() && text(&o).1.contains("--profile"), "{:?}", text(&o));

    let o = plexus(&["report", "runs", "--out", "pdf", "--formats", "pdf"], t);
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let line = err.lines().find(|l| l.starts_with("report: ")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains(".pdf") && !line.contains(".png") && !line.contains(".svg"), "{line}");
    assert!(names(&t.join("pdf")).iter().all(|n| !n.ends_with(".png") && !n.ends_with(".svg") && !n.starts_with('.')));

    // A report folder that cannot be completed (a figure's path is taken by a folder) is not
    // started: the existing folder keeps exactly what it held, and a new one is not created.
    std::fs::create_dir_all(t.join("taken/curve-loss.png")).unwrap();
    let o = plexus(&["report", "runs", "--out", "taken"], t);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("curve-loss.png is a directory"), "{err}");
    assert_eq!(names(&t.join("taken")), ["curve-loss.png"]);

    let repo = common::repo();
    let csv = repo.join("docs/claims/showcase-seeds.csv");
    let spec = repo.join("configs/studies/showcase-seeds.yaml");
    let o = plexus(
        &["report", csv.to_str().unwrap(), "--spec", spec.to_str().unwrap(), "--format", "verdicts", "--out", "v"],
        t,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(std::fs::read_to_string(t.join("v/verdicts.md")).unwrap(), out);
    assert!(err.contains("v/verdicts.md"), "{err}");
}

/// A table printed into a pipe whose reader has gone ends the verb as SIGPIPE ends a C program:
/// no panic message, status 0 (all was written before) or death by SIGPIPE (141 in a shell).
#[test]
fn a_table_printed_into_a_closed_pipe_ends_the_verb_quietly() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("tiny.yaml"), TINY).unwrap();
    let quiet = |args: &[&str], read_first: bool| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_plexus"))
            .args(args)
            .current_dir(tmp.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        if read_first {
            let mut line = String::new();
            std::io::BufReader::new(stdout).read_line(&mut line).unwrap();
            assert!(!line.is_empty(), "{args:?} printed nothing");
        } else {
            // The reader closed before the first line: the first print meets EPIPE.
            drop(stdout);
        }
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked") && !err.contains("failed printing"), "{args:?}: {err}");
        assert!(
            o.status.success() || o.status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {:?}, stderr: {err}",
            o.status
        );
        o.status
    };
    for read_first in [false, true] {
        quiet(&["list"], read_first);
        quiet(&["connectivity", "tiny.yaml"], read_first);
    }
    // The reader gone before anything was printed: nothing could be written, so SIGPIPE it is.
    assert_eq!(quiet(&["list"], false).signal(), Some(libc::SIGPIPE));
    // And through a shell, as a user types it.
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!("set -o pipefail; '{}' list | head -1", env!("CARGO_BIN_EXE_plexus")))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(matches!(o.status.code(), Some(0) | Some(141)) && !err.contains("panicked"), "{:?}: {err}", o.status);
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 1);
}
