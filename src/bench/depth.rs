//! `plexus bench --compare` and `--depths`: several topologies (and depths) of one config,
//! measured with [`super::compare`] and [`super::bench`]; the depth sweep also writes `depth.csv`,
//! `growth.csv` and log-log figures of step time and memory against depth.

use crate::config::Override;
use crate::experiment::Experiment;
use crate::run_dir::atomic_write;
use anyhow::{Context, Result};
use std::path::Path;

/// `--set` overrides selecting a topology written `kind` or `kind+key=value+…`.
fn topology_overrides(entry: &str) -> Result<Vec<Override>> {
    let mut parts = entry.split('+');
    let kind = parts.next().unwrap_or_default();
    std::iter::once(format!("topology.kind={kind}"))
        .chain(parts.map(|p| format!("topology.{p}")))
        .map(|o| Override::parse(&o).with_context(|| format!("the topology `{entry}`: {o}")))
        .collect()
}

/// The paired overhead of each topology `entries` (`kind` or `kind+key=value+…`) over the first,
/// on `config` with `overrides`: printed, and appended to `csv` where given.
pub fn compare(
    config: &Path,
    overrides: &[Override],
    opts: &super::BenchOptions,
    entries: &[String],
    csv: Option<&Path>,
) -> Result<()> {
    let exps = entries
        .iter()
        .map(|t| {
            let ov: Vec<Override> = overrides.iter().cloned().chain(topology_overrides(t)?).collect();
            Ok((t.clone(), Experiment::from_file(config, &ov)?))
        })
        .collect::<Result<Vec<_>>>()?;
    let case = opts.case.clone().unwrap_or_else(|| exps[0].1.config().name.clone());
    eprintln!("{case}: {} topologies, {} paired rounds…", exps.len(), opts.steps);
    let rows = super::compare(&exps, opts)?;
    let text = super::table::print_compare(&case, &rows);
    if let Some(path) = csv {
        crate::report::append_csv(path, super::table::COMPARE_CSV_HEADER, &text)?;
    }
    Ok(())
}

/// Cost versus depth: every topology at every depth, `depth.csv`, log-log figures of step time and
/// step memory, and the fitted exponent k of `cost ∝ L^k` per topology; returns the figures drawn.
pub fn sweep(
    config: &Path,
    overrides: &[Override],
    opts: &super::BenchOptions,
    depths: &[usize],
    topologies: &[String],
    out: &Path,
) -> Result<Vec<crate::plot::Figure>> {
    use crate::plot::{topology_color, Dash, Series, Style};
    std::fs::create_dir_all(out).with_context(|| format!("creating the output directory {}", out.display()))?;
    let mut rows = Vec::new();
    for t in topologies {
        let kind = t.split('+').next().unwrap_or_default();
        for &l in depths {
            let mut ov = overrides.to_vec();
            ov.extend(topology_overrides(t)?);
            ov.push(Override::of("model.depth", l)?);
            let exp = Experiment::from_file(config, &ov)?;
            let o = super::BenchOptions { case: Some(format!("{t}@L{l}")), ..opts.clone() };
            eprintln!("bench {t} at depth {l}…");
            let row = super::bench(&exp, &o)?;
            super::table::print_bench(std::slice::from_ref(&row));
            rows.push((t.clone(), kind.to_string(), l, row));
        }
    }
    let mut csv = String::from(super::CSV_HEADER);
    csv.push('\n');
    for (_, _, _, r) in &rows {
        csv += &r.csv();
        csv.push('\n');
    }
    atomic_write(&out.join("depth.csv"), csv.as_bytes())?;
    let mut summary = String::from("topology,time_exponent,memory_exponent\n");
    println!("\n{:<24} {:>16} {:>18}", "topology", "time ∝ L^k, k =", "act. mem ∝ L^k, k =");
    let mut time_series = Vec::new();
    let mut mem_series = Vec::new();
    for (i, t) in topologies.iter().enumerate() {
        let mine: Vec<&(String, String, usize, super::BenchRow)> = rows.iter().filter(|r| &r.0 == t).collect();
        let time: Vec<(f64, f64)> = mine.iter().map(|r| (r.2 as f64, r.3.ms[0])).collect();
        let mem: Vec<(f64, f64)> = mine.iter().map(|r| (r.2 as f64, r.3.act_mem_mb)).collect();
        let (kt, km) = (super::growth_exponent(&time), super::growth_exponent(&mem));
        println!("{t:<24} {kt:>16.2} {km:>18.2}");
        summary += &format!("{t},{kt:.3},{km:.3}\n");
        let kind = mine.first().map(|r| r.1.clone()).unwrap_or_default();
        let variant = topologies[..i].iter().filter(|o| o.split('+').next() == Some(&kind)).count();
        let (color, dash) = (Some(topology_color(&kind, variant)), Dash::of_variant(variant));
        // The topology by its display name, its settings after it (`hacn+init.mu=0.25` →
        // `H-ACN, μ = 0.25`).
        let setting = |s: &str| match s.split_once('=') {
            Some((k, v)) => format!("{} = {v}", crate::study::names::key(&format!("topology.{k}"))),
            None => s.to_string(),
        };
        let settings: Vec<String> = t.split('+').skip(1).map(setting).collect();
        let name = std::iter::once(crate::plot::display_name(&kind)).chain(settings).collect::<Vec<_>>().join(", ");
        time_series.push(Series { label: format!("{name} (k = {kt:.2})"), points: time, color, band: None, dash });
        mem_series.push(Series { label: format!("{name} (k = {km:.2})"), points: mem, color, band: None, dash });
    }
    atomic_write(&out.join("growth.csv"), summary.as_bytes())?;
    let name = config.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let figures = depth_figures(&name, time_series, mem_series);
    let files = crate::plot::write_all(&figures, &Style::default(), out)?;
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "png")) {
        println!("figure: {}", f.display());
    }
    println!("csv: {}", out.join("depth.csv").display());
    Ok(figures)
}

/// `bench --depths`' two figures: step time and activation memory against depth, both axes log
/// (a growth law reads as a slope), one line per topology with its fitted exponent in the legend.
pub fn depth_figures(
    config: &str,
    time: Vec<crate::plot::Series>,
    memory: Vec<crate::plot::Series>,
) -> Vec<crate::plot::Figure> {
    use crate::plot::{Chart, Figure, Kind, LineChart};
    let chart = |title: String, y_label: &str, series| {
        Chart::LogLog(LineChart {
            title,
            x_label: "depth L (units)".into(),
            y_label: y_label.into(),
            log_y: true,
            series,
        })
    };
    vec![
        Figure {
            file: "depth_time".into(),
            kind: Kind::DepthTime,
            chart: chart(format!("Step time versus depth, {config}"), "time per training step (ms)", time),
        },
        Figure {
            file: "depth_memory".into(),
            kind: Kind::DepthMemory,
            chart: chart(
                format!("Activation memory held for backward versus depth, {config}"),
                "activation memory (MiB)",
                memory,
            ),
        },
    ]
}
