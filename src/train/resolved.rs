//! `resolved.yaml`: every value a run derived from its config and its data, beside `config.yaml`
//! (which holds what was written): the model section with the shapes the data gave it
//! (`image_size`, `channels`, `num_classes`; `vocab_size`, `seq_len`; `input_dim`, `output_dim`),
//! the data's shapes and task, the input transform with its normalisation statistics, and the
//! held-out set as the dataset's files number it (rows, or token windows, in evaluation order, and
//! the batch size). With the run's `final.safetensors` it is all that `parity/load.py` needs to
//! build the PyTorch model and evaluate it as plexus did (docs/configs-and-runs.md, "Loading a run
//! into PyTorch").
//!
//! Its `model`, `topology` and `precision` form a parity case (parity/SPEC.md): the model section
//! is re-parsed against the data here, so it always builds the model the run trained.

use crate::data::{DataInfo, InputTransform, Task};
use crate::experiment::Experiment;
use anyhow::{Context, Result};
use serde_yaml::{Mapping, Value};

/// The file's name in a run directory.
pub const RESOLVED_FILE: &str = "resolved.yaml";

/// The `model` section with the shapes the data gives it added where the config left them out.
fn model_section(kind: &str, options: &Mapping, info: &DataInfo) -> Mapping {
    let mut m = Mapping::new();
    m.insert("kind".into(), kind.into());
    m.extend(options.iter().map(|(k, v)| (k.clone(), v.clone())));
    let n = |v: usize| Value::from(v as u64);
    let derived: Vec<(&str, Value)> = match (kind, info.input_shape.as_slice()) {
        ("mixer" | "vit" | "dit", &[c, s, _]) => {
            vec![("image_size", n(s)), ("channels", n(c)), ("num_classes", n(info.output_dim))]
        }
        ("gpt" | "llama", &[t]) => vec![("vocab_size", n(info.output_dim)), ("seq_len", n(t))],
        ("mlp", _) => vec![("input_dim", n(info.input_dim())), ("output_dim", n(info.output_dim))],
        _ => Vec::new(),
    };
    for (k, v) in derived {
        m.entry(k.into()).or_insert(v);
    }
    m
}

fn task_name(task: Task) -> &'static str {
    match task {
        Task::HalfSumSquares => "half_sum_squares",
        Task::Classification => "classification",
        Task::LanguageModel => "language_model",
        Task::Diffusion(_) => "diffusion",
    }
}

fn placeholder(k: usize) -> String {
    format!("flow-list-{k}-here")
}

/// `v` with every list of numbers replaced by a placeholder, and the list as YAML flow text
/// (`[120, 142, …]`) pushed to `flows`: thousands of rows on one line each would bury the rest.
fn flow_lists(v: Value, flows: &mut Vec<String>) -> Value {
    match v {
        Value::Sequence(items) if items.iter().all(Value::is_number) => {
            let text = items.iter().map(|i| serde_yaml::to_string(i).unwrap_or_default().trim().to_string());
            flows.push(format!("[{}]", text.collect::<Vec<_>>().join(", ")));
            Value::String(placeholder(flows.len() - 1))
        }
        Value::Sequence(items) => Value::Sequence(items.into_iter().map(|i| flow_lists(i, flows)).collect()),
        Value::Mapping(m) => Value::Mapping(m.into_iter().map(|(k, v)| (k, flow_lists(v, flows))).collect()),
        other => other,
    }
}

/// The text of `resolved.yaml` for `exp`, whose data gave `transform` and the held-out set
/// `eval` ([`crate::data::DataSource::eval_record`]).
pub fn resolved_yaml(exp: &Experiment, transform: &InputTransform, eval: Option<Mapping>) -> Result<String> {
    let cfg = exp.config();
    let info = exp.data.info();
    let model = model_section(exp.model.kind(), &cfg.model.options, &info);
    // The section must build the very model the run trained: parsed again against the data.
    let mut options = model.clone();
    options.remove("kind");
    crate::model::parse(exp.model.kind(), &options, &info)
        .map_err(|e| anyhow::anyhow!("{e:?}"))
        .context("resolved.yaml: the model section with the data's shapes does not parse")?;
    let mut topology = Mapping::new();
    topology.insert("kind".into(), cfg.topology.kind.clone().into());
    topology.extend(cfg.topology.options.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut data = Mapping::new();
    data.insert("kind".into(), cfg.data.kind.clone().into());
    data.insert("input_shape".into(), info.input_shape.iter().map(|&d| Value::from(d as u64)).collect());
    data.insert("output_dim".into(), (info.output_dim as u64).into());
    data.insert("task".into(), task_name(exp.task()).into());
    data.insert("transform".into(), transform.to_yaml());
    data.insert("eval".into(), eval.map_or(Value::Null, Value::Mapping));
    let mut doc = Mapping::new();
    doc.insert("name".into(), cfg.name.clone().into());
    doc.insert("seed".into(), cfg.seed.into());
    doc.insert("precision".into(), format!("{:?}", cfg.precision).to_lowercase().into());
    doc.insert("model".into(), Value::Mapping(model));
    doc.insert("topology".into(), Value::Mapping(topology));
    doc.insert("data".into(), Value::Mapping(data));
    let mut flows = Vec::new();
    let doc = flow_lists(Value::Mapping(doc), &mut flows);
    let mut body = serde_yaml::to_string(&doc).context("resolved.yaml")?;
    for (k, list) in flows.iter().enumerate() {
        body = body.replacen(&placeholder(k), list, 1);
    }
    Ok(format!(
        "# What plexus derived for this run from config.yaml and the data (written by plexus train; \
         config.yaml holds what was written).\n# data.transform: model input = (uint8 pixels / 255 - mean) / sd \
         in fp32 (kind: pixels), or the raw input (identity).\n# data.eval: the held-out set in evaluation \
         order (rows of the split's files, or token windows), batched by batch_size.\n# Load the run into \
         PyTorch: python parity/load.py RUN_DIR (docs/configs-and-runs.md).\n{body}"
    ))
}
