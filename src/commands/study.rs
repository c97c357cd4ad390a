//! `plexus sweep` (then its report) and `plexus report`: a study's tables, figures and verdicts,
//! written all or nothing.

use super::config_files;
pub use crate::study::sweep::SweepRequest;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// `plexus sweep SPEC|CONFIG... [--grid K=V1,V2] [--seeds 0,1,2] [--set K=V] [--out DIR]
/// [--jobs N | --gpus all] [--slurm FILE] [--only RUN] [--dry-run]`, or `--resume DIR`: the
/// sweep ([`crate::study::sweep`]), then, when it trained the whole grid, its report.
pub fn sweep(r: &SweepRequest) -> Result<()> {
    // A folder among the inputs stands for its configs.
    let mut inputs = Vec::new();
    for p in &r.inputs {
        if p.is_dir() {
            inputs.extend(config_files(std::slice::from_ref(p))?);
        } else {
            inputs.push(p.clone());
        }
    }
    let Some(out) = crate::study::sweep::sweep(r, &inputs)? else {
        return Ok(());
    };
    // The runs are done whatever the report makes of them.
    if let Err(e) = report(std::slice::from_ref(&out), &[], &Default::default(), "md", None) {
        eprintln!("report: {e:#} (the runs are finished; see `plexus report --help`)");
    }
    Ok(())
}

/// `plexus report PATH... --spec SPEC... --format verdicts`: every claim of the studies, one row
/// each. One spec for all the paths (one study), or one spec per path, in order (a study each,
/// named by its spec's file stem).
fn report_verdicts(
    paths: &[PathBuf],
    specs: &[PathBuf],
    options: &crate::study::ReportOptions,
    out: Option<&Path>,
) -> Result<()> {
    let pairs: Vec<(Vec<PathBuf>, &PathBuf)> = match specs {
        [] => bail!("--format verdicts needs the studies' specs (--spec SPEC.yaml, one per path or one for all)"),
        [one] => vec![(paths.to_vec(), one)],
        many if many.len() == paths.len() => paths.iter().map(|p| vec![p.clone()]).zip(many).collect(),
        many => bail!(
            "--format verdicts takes one --spec for all the paths or one per path, in order: {} path(s), {} spec(s)",
            paths.len(),
            many.len()
        ),
    };
    let mut studies = Vec::new();
    if let Some(b) = &options.baseline {
        bail!("--baseline {b}: --format verdicts prints the claims only, which compare their own arms (leave it out)");
    }
    for (paths, spec_path) in pairs {
        let mut spec = crate::study::spec::SweepSpec::from_file(spec_path)?;
        // The verdicts read no table: a baseline the spec's tables use is no concern of theirs.
        spec.report.baseline = None;
        let r = crate::study::build(&paths, options, Some(&spec))
            .with_context(|| format!("the study of {}", spec_path.display()))?;
        let name =
            spec_path.file_stem().map_or_else(|| spec_path.display().to_string(), |s| s.to_string_lossy().into());
        studies.push((name, r.claims));
    }
    let table = crate::report::study::verdicts(&studies);
    print!("{table}");
    if let Some(out) = out {
        let written = crate::run_dir::write_all_or_nothing(out, |dir| {
            crate::run_dir::atomic_write(&dir.join("verdicts.md"), table.as_bytes())?;
            Ok(vec![dir.join("verdicts.md")])
        })?;
        eprintln!("report: {}", written[0].display());
    }
    Ok(())
}

/// `plexus report PATH... [--spec SPEC…] [--by K,…] [--metric M,…] [--baseline K=V] [--curves …]
/// [--format md|csv|latex|summary|verdicts] [--out DIR]`.
pub fn report(
    paths: &[PathBuf],
    specs: &[PathBuf],
    options: &crate::study::ReportOptions,
    format: &str,
    out: Option<&Path>,
) -> Result<()> {
    // Where the report goes, checked before anything is read: a folder (or a new path). Without
    // --out only the default markdown report writes `<folder>/report/`: a table printed in another
    // format (`--format latex` for a paper) leaves the folder as it is.
    let out = out.map(Path::to_path_buf).or_else(|| match paths {
        [one] if format == "md" && one.is_dir() && !one.join("config.yaml").is_file() => Some(one.join("report")),
        _ => None,
    });
    if let Some(out) = &out {
        crate::run_dir::check_output_dir(out, "the report folder")?;
    }
    if format == "verdicts" {
        return report_verdicts(paths, specs, options, out.as_deref());
    }
    if specs.len() > 1 {
        bail!("--spec is given {} times: several specs (one per path) go with --format verdicts only", specs.len());
    }
    let spec = specs.first().map(|p| crate::study::spec::SweepSpec::from_file(p)).transpose()?;
    let r = crate::study::build(paths, options, spec.as_ref())?;
    let md = crate::report::study::markdown(&r);
    let runs_csv = crate::report::study::runs_csv(&r)?;
    let summary = crate::report::study::summary(&r);
    let csv = crate::report::study::csv(&r)?;
    let tex = crate::report::study::latex(&r);
    print!(
        "{}",
        match format {
            "csv" => &csv,
            "latex" => &tex,
            "summary" => &summary,
            _ => &md,
        }
    );
    if let Some(out) = out {
        write_report(&out, &r, options, [&md, &csv, &tex, &runs_csv])?;
    }
    Ok(())
}

/// Writes the report folder `out` all or nothing — the tables (`md`, `csv`, `tex`, `runs_csv`,
/// and the curves' CSV), each curve's band over seeds and each claim's figure, at the width and in
/// the formats the flags or the spec's `report:` section give — and says what it wrote.
fn write_report(
    out: &Path,
    r: &crate::study::StudyReport,
    options: &crate::study::ReportOptions,
    [md, csv, tex, runs_csv]: [&String; 4],
) -> Result<()> {
    // The figures' width and formats: the flags, else the spec's `report:` section.
    let style = crate::plot::Style::parse(
        r.formats.as_deref().unwrap_or("png,svg,pdf"),
        r.width.as_deref().unwrap_or("double"),
    )?;
    // A sweep's own report/ (written by the sweep with its spec's settings) replaced by a
    // report of other settings: said, so that it is not lost by surprise.
    if options != &crate::study::ReportOptions::default() && out.join("report.md").is_file() {
        eprintln!(
            "report: replacing {} with this report's settings (give --out DIR to keep both)",
            out.join("report.md").display()
        );
    }
    // All or nothing: the tables and figures are written aside and moved in once all are.
    let tables = ["report.md", "report.csv", "report.tex", "runs.csv", "runs.curves.csv"];
    let curves_csv = crate::study::curves_csv(r)?;
    let written = crate::run_dir::write_all_or_nothing(out, |dir| {
        let mut files = Vec::new();
        for (name, text) in tables.iter().zip([md, csv, tex, runs_csv, &curves_csv]) {
            crate::run_dir::atomic_write(&dir.join(name), text.as_bytes())?;
            files.push(dir.join(name));
        }
        files.extend(crate::plot::write_all(&crate::plot::study::band_curves(r)?, &style, dir)?);
        files.extend(crate::plot::write_all(&crate::plot::study::claim_figures(r)?, &style, dir)?);
        Ok(files)
    })?;
    let figures = &written[tables.len()..];
    // The formats written, as the figures' extensions say (`--formats`).
    let mut kinds: Vec<String> = Vec::new();
    for f in figures {
        let ext = f.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
        if !kinds.contains(&ext) {
            kinds.push(ext);
        }
    }
    let claims = figures.iter().any(|f| f.file_name().is_some_and(|n| n.to_string_lossy().starts_with("claim-")));
    let stems = if claims { "curve-*, claim-*" } else { "curve-*" };
    eprintln!(
        "report: {} ({}){}",
        out.display(),
        tables.join(", "),
        if figures.is_empty() {
            String::new()
        } else {
            format!(", {} figure files ({stems}: {})", figures.len(), kinds.join(", "))
        }
    );
    Ok(())
}
