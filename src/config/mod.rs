//! The run configuration: one YAML schema for the whole run, strict parsing (unknown keys are
//! rejected), value validation, and `--set key=value` overrides that go through the same checks.
//!
//! `model`, `topology` and `data` are "kind sections": a `kind` that picks an entry of the
//! corresponding registry plus that entry's own options, which the entry parses and validates
//! itself (so adding a topology never touches this file).

mod error;
mod overrides;

pub(crate) use error::{clean_serde_message, serde_key};
pub use error::{locate_key, show_number, ConfigError, OptionError};
pub use overrides::{join as join_overrides, Override, OverrideError};

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The whole run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Run name; the default run directory is `runs/<name>`.
    pub name: String,
    /// Seeds model initialisation and everything random in training.
    #[serde(default)]
    pub seed: u64,
    /// `auto` (CUDA if available, else CPU), `cpu`, `cuda` or `cuda:N`.
    #[serde(default = "default_device")]
    pub device: String,
    #[serde(default)]
    pub precision: Precision,
    /// Let fp32 matmuls use TF32 tensor cores (Ampere and later GPUs): faster, 10-bit mantissa
    /// inputs. Off by default, so that fp32 runs match their PyTorch references.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tf32: bool,
    pub model: KindSection,
    pub topology: KindSection,
    pub data: KindSection,
    #[serde(default)]
    pub train: TrainConfig,
    #[serde(default)]
    pub log: LogConfig,
    /// DDPM options of diffusion backbones (`model.kind: dit`); defaults when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diffusion: Option<DiffusionConfig>,
}

fn default_device() -> String {
    "auto".into()
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in fp32.
    #[default]
    Fp32,
    /// fp32 master weights, bf16 compute; norms, softmax and loss in fp32.
    Bf16,
}

impl Precision {
    /// The dtype that matmuls run in.
    pub fn compute_kind(self) -> tch::Kind {
        match self {
            Precision::Fp32 => tch::Kind::Float,
            Precision::Bf16 => tch::Kind::BFloat16,
        }
    }
}

/// `diffusion:` config section (DDPM training of `model.kind: dit`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiffusionConfig {
    /// Probability that a training label is replaced by the null class (classifier-free guidance).
    pub label_dropout: f64,
}

impl Default for DiffusionConfig {
    fn default() -> Self {
        DiffusionConfig { label_dropout: 0.1 }
    }
}

/// `kind` selects a registry entry; every other key is that entry's option.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KindSection {
    pub kind: String,
    #[serde(flatten)]
    pub options: serde_yaml::Mapping,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// Plain full-batch gradient descent, `p ← p − lr·∇p` (the LNN case study).
    #[default]
    Gd,
    /// AdamW (decoupled weight decay).
    Adamw,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// The learning rate stays at `lr` (after warm-up).
    #[default]
    Constant,
    /// Linear warm-up, then cosine decay to `min_lr_ratio · lr` at the last step.
    Cosine,
}

/// `train.cuda_graphs`: whether the training step is captured once as a CUDA graph and replayed.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CudaGraphs {
    /// On for a CUDA device when the step can be captured (static shapes, one process); otherwise
    /// eager, with the reason printed once.
    #[default]
    Auto,
    /// As `auto`, but a run that cannot capture its step stops with the reason (and a config
    /// without a CUDA device is an error).
    On,
    /// Eager steps.
    Off,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    pub optimizer: Optimizer,
    /// Peak learning rate, > 0.
    pub lr: f64,
    /// Number of optimizer steps, ≥ 1.
    pub steps: u64,
    /// Decoupled weight decay (AdamW), ≥ 0, applied to the `decay` group only: ≥2-D weights
    /// except position embeddings; never to norms, biases or topology parameters.
    pub weight_decay: f64,
    /// AdamW β₁, β₂.
    pub betas: [f64; 2],
    pub eps: f64,
    pub schedule: Schedule,
    /// Linear warm-up steps (from lr/warmup to lr).
    pub warmup_steps: u64,
    /// Final learning rate of the cosine schedule, as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Clip the global gradient norm to this value (none if absent).
    pub clip_grad_norm: Option<f64>,
    /// Micro-batches accumulated per optimizer step (the loss is averaged over them).
    pub accumulation: u64,
    /// Learning-rate multiplier of the topology's own parameters (ANCRe logits, H-ACN a, …).
    pub topology_lr_mult: f64,
    /// Weight-decay the topology's own parameters like the backbone's weights (at `weight_decay`),
    /// as epfml's DenseFormer code decays its DWA weights; by default they are never decayed.
    pub topology_decay: bool,
    /// Keep an exponential moving average of the parameters with this decay (e.g. 0.9999, as DiT),
    /// updated after every step, checkpointed, and written as `checkpoints/final_ema.safetensors`;
    /// `plexus sample` and `plexus fd` use it when present. None: no average.
    pub ema: Option<f64>,
    /// Capture the step as a CUDA graph and replay it (`auto`, `on`, `off`; see [`CudaGraphs`]).
    pub cuda_graphs: CudaGraphs,
    /// How each lengthening of the run scheduled the updates it added, oldest first (written by
    /// `plexus train --resume RUN --set train.steps=N --extend RULE`; see [`Extension`]). Empty
    /// for a run trained as first planned, and then absent from `config.yaml`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<Extension>,
}

/// What the learning rate does over the updates a lengthened run adds, for a schedule that
/// depends on the run's length (cosine): the choice `--extend` makes, recorded in the run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ExtendRule {
    /// Continue at the learning rate of the run's last update (no jump).
    Hold,
    /// A new cosine cycle over the added updates: back to the peak `lr` (no warm-up), down to
    /// the floor at the new end (a warm restart, as SGDR's).
    Restart,
    /// The schedule planned again over the new length, as if it had been planned so from the
    /// start: the learning rate jumps up to where the longer cosine is at that update.
    Stretch,
}

impl ExtendRule {
    /// Every rule, as `--extend` spells them.
    pub const ALL: [ExtendRule; 3] = [ExtendRule::Hold, ExtendRule::Restart, ExtendRule::Stretch];

    /// The rule's name (`hold`, `restart`, `stretch`).
    pub fn name(self) -> &'static str {
        match self {
            ExtendRule::Hold => "hold",
            ExtendRule::Restart => "restart",
            ExtendRule::Stretch => "stretch",
        }
    }
}

impl std::fmt::Display for ExtendRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ExtendRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ExtendRule::ALL.into_iter().find(|r| r.name() == s).ok_or_else(|| {
            format!(
                "`{s}` is not a rule for the added updates: hold (continue at the last learning rate), restart (a new \
                 cosine cycle over them) or stretch (the schedule planned again over the new length)"
            )
        })
    }
}

/// One lengthening of a run (`train.extensions`): from update `at` on, the run that had been
/// planned for `from_steps` updates follows `rule` up to its new end (the next lengthening's
/// `from_steps`, or `train.steps`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Extension {
    /// The first update the rule schedules: the step of the checkpoint the lengthened run
    /// continued from.
    pub at: u64,
    /// `train.steps` before this lengthening.
    pub from_steps: u64,
    pub rule: ExtendRule,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            optimizer: Optimizer::Gd,
            lr: 1e-3,
            steps: 1000,
            weight_decay: 0.0,
            betas: [0.9, 0.999],
            eps: 1e-8,
            schedule: Schedule::Constant,
            warmup_steps: 0,
            min_lr_ratio: 0.0,
            clip_grad_norm: None,
            accumulation: 1,
            topology_lr_mult: 1.0,
            topology_decay: false,
            ema: None,
            cuda_graphs: CudaGraphs::Auto,
            extensions: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Write a `metrics.csv` row every this many steps (and always at step 0 and the last step).
    pub every: u64,
    /// Save the connectivity matrix C every this many steps (0 = only at the end).
    pub connectivity_every: u64,
    /// Evaluate on the held-out set every this many steps (0 = only at the end).
    pub eval_every: u64,
    /// Write a resumable checkpoint every this many steps (0 = only at the end).
    pub checkpoint_every: u64,
    /// How many step checkpoints to keep (the newest; ≥ 1).
    pub keep_checkpoints: usize,
    /// Also write TensorBoard event files in `<run>/tensorboard/`: every metrics row and
    /// evaluation as scalars, C as an image, the config as text.
    pub tensorboard: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            every: 10,
            connectivity_every: 0,
            eval_every: 0,
            checkpoint_every: 0,
            keep_checkpoints: 2,
            tensorboard: true,
        }
    }
}

/// A config together with where it came from, for error messages.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    /// Path of the YAML file, or a pseudo-path such as `<embedded:lnn/fig2b/k3-0to2.yaml>`.
    pub file: PathBuf,
    /// The YAML text as read (before overrides), used to find line numbers.
    pub source: String,
    /// The `--set key=value` overrides applied on top of the file: an error under one of their
    /// keys is reported as coming from the override, not from a line of the file.
    pub overrides: Vec<Override>,
}

impl LoadedConfig {
    /// Turns an option error found under `prefix` into a config error for this file.
    pub fn error(&self, prefix: &str, e: OptionError) -> ConfigError {
        locate_error(&self.file, &self.source, &self.overrides, prefix, e)
    }
}

/// An option error found under `prefix` of a document parsed from `source` (the file's text) with
/// `overrides`, as a config error: the file and line, or the `--set` that gave the value.
pub fn locate_error(file: &Path, source: &str, overrides: &[Override], prefix: &str, e: OptionError) -> ConfigError {
    let mut err = e.in_file(file, Some(source), prefix);
    if let Some(ov) = override_of(overrides, &err.key) {
        err.file = PathBuf::from(format!("{} (--set {ov})", file.display()));
        err.line = None;
        err.value = err.value.map(|v| as_written(&v, ov.written()));
    } else {
        err.value = err.value.map(|v| as_written(&v, source));
    }
    err
}

/// `value` (a number as an error shows it) as `text` wrote it, where it is an integer literal
/// past 64 bits that [`widen_big_integers`] read as the float nearest it (`1e20` →
/// `99999999999999999999`); else `value` itself.
fn as_written(value: &str, text: &str) -> String {
    let Ok(v) = value.parse::<f64>() else { return value.to_string() };
    if v.abs() < 2f64.powi(63) {
        return value.to_string();
    }
    text.split(|c: char| c.is_whitespace() || ",:[]{}'\"#".contains(c))
        .find(|w| {
            let digits = w.strip_prefix(['-', '+']).unwrap_or(w);
            digits.len() >= 20 && digits.chars().all(|c| c.is_ascii_digit()) && w.parse::<f64>().ok() == Some(v)
        })
        .map_or_else(|| value.to_string(), str::to_string)
}

/// The last override that set `key`, a key above it or a key below it.
fn override_of<'a>(overrides: &'a [Override], key: &str) -> Option<&'a Override> {
    overrides.iter().rev().find(|ov| ov.touches(key))
}

/// The largest config file accepted (configs are a few hundred bytes; this bounds the parse).
pub const MAX_CONFIG_BYTES: usize = crate::input_file::MAX_CONFIG_BYTES as usize;
/// The deepest nesting of mappings and sequences accepted (configs use about 4).
pub const MAX_CONFIG_DEPTH: usize = 64;

/// The text of a config file (or RL config, or sweep spec): a regular file of at most
/// [`MAX_CONFIG_BYTES`] bytes of UTF-8, refused before more is read (`/dev/zero`, a FIFO, a huge
/// file). The error says what a config file must be, for [`ConfigError::allowed`].
pub fn read_config_text(path: &Path) -> Result<String, String> {
    crate::input_file::read_text(path, crate::input_file::MAX_CONFIG_BYTES, "a config file")
        .map_err(|e| format!("a readable config file: {e:#}"))
}

/// Reads, overrides and validates a config file.
pub fn load_file(path: &Path, overrides: &[Override]) -> Result<LoadedConfig, ConfigError> {
    let fail = |allowed: String| ConfigError {
        file: path.to_path_buf(),
        key: String::new(),
        value: None,
        allowed,
        line: None,
    };
    let source = read_config_text(path).map_err(fail)?;
    load_str(&source, path, overrides)
}

/// The nesting depth of YAML text, estimated without parsing: flow brackets (`[`, `{`) outside
/// quotes and comments, plus block indentation levels and `- ` sequence entries. Returns the
/// 1-based line where `limit` is first exceeded.
fn too_deep(text: &str, limit: usize) -> Option<usize> {
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let indent = line.len() - t.len();
        if flow == 0 {
            while indents.last().is_some_and(|&i| i >= indent) {
                indents.pop();
            }
            indents.push(indent);
        }
        // `- - - x`: each dash opens a sequence inside the previous one.
        let dashes = t.split_inclusive(' ').take_while(|w| *w == "- " || *w == "-").count();
        let (mut quote, mut prev) = (None::<char>, ' ');
        let mut deepest = flow;
        for c in t.chars() {
            match (quote, c) {
                (Some(q), _) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') if prev == ' ' => break,
                (None, '[' | '{') => {
                    flow += 1;
                    deepest = deepest.max(flow);
                }
                (None, ']' | '}') => flow = flow.saturating_sub(1),
                _ => {}
            }
            prev = c;
        }
        if indents.len() + dashes + deepest > limit {
            return Some(n + 1);
        }
    }
    None
}

/// `text` with every plain integer literal too long for 64 bits (20 digits or more, outside quotes
/// and comments) written as a float (`99999999999999999999` → `99999999999999999999.0`, read as
/// 1e20); `None` when it has none (the text is then parsed as it is).
pub(crate) fn widen_big_integers(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 8);
    let (mut changed, mut quote, mut comment) = (false, None::<char>, false);
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String, changed: &mut bool| {
        let digits = token.strip_prefix(['-', '+']).unwrap_or(token);
        if digits.len() >= 20 && digits.chars().all(|c| c.is_ascii_digit()) {
            token.push_str(".0");
            *changed = true;
        }
        out.push_str(token);
        token.clear();
    };
    for c in text.chars() {
        match (quote, comment, c) {
            (_, true, '\n') => {
                comment = false;
                out.push(c);
            }
            (_, true, _) => out.push(c),
            (Some(q), _, _) => {
                if c == q {
                    quote = None;
                }
                out.push(c);
            }
            (None, _, '"' | '\'') if token.is_empty() => {
                quote = Some(c);
                out.push(c);
            }
            (None, _, '#') if token.is_empty() => {
                comment = true;
                out.push(c);
            }
            (None, _, c) if c.is_whitespace() || ",:[]{}".contains(c) => {
                flush(&mut token, &mut out, &mut changed);
                out.push(c);
            }
            _ => token.push(c),
        }
    }
    flush(&mut token, &mut out, &mut changed);
    changed.then_some(out)
}

/// Rejects YAML tags (`!foo value`): the schema has no use for them, and ignoring one would
/// silently drop what its author meant. Returns the key path of the first tagged value.
fn find_tag(v: &serde_yaml::Value, path: &str) -> Option<(String, String)> {
    use serde_yaml::Value as V;
    match v {
        V::Tagged(t) => Some((path.to_string(), t.tag.to_string())),
        V::Mapping(m) => m.iter().find_map(|(k, v)| {
            let name = k.as_str().map(str::to_string).unwrap_or_else(|| scalar_text(k).unwrap_or_default());
            find_tag(k, path)
                .or_else(|| find_tag(v, &if path.is_empty() { name.clone() } else { format!("{path}.{name}") }))
        }),
        V::Sequence(s) => s.iter().enumerate().find_map(|(i, v)| find_tag(v, &format!("{path}[{i}]"))),
        _ => None,
    }
}

/// Parses YAML text as a config (`file` is only used in messages).
pub fn load_str(source: &str, file: &Path, overrides: &[Override]) -> Result<LoadedConfig, ConfigError> {
    let (config, source) = parse_document::<Config>(source, file, overrides)?;
    let loaded = LoadedConfig { config, file: file.to_path_buf(), source, overrides: overrides.to_vec() };
    loaded.config.validate().map_err(|e| loaded.error("", e))?;
    Ok(loaded)
}

/// Parses YAML text into any strict schema `T` (a `deny_unknown_fields` struct) with the checks
/// and messages of [`load_str`]: size and nesting bounds, BOM, no tags, `--set` overrides, and
/// errors naming the file, key, value, line and what is allowed. Returns `T` and the source text
/// (without BOM) for locating later validation errors ([`locate_error`]). Used by `Config` and by
/// the `plexus rl` schema (`rl/config.rs`).
pub fn parse_document<T: serde::de::DeserializeOwned>(
    source: &str,
    file: &Path,
    overrides: &[Override],
) -> Result<(T, String), ConfigError> {
    let err = |key: String, value: Option<String>, allowed: String, line: Option<usize>| ConfigError {
        file: file.to_path_buf(),
        key,
        value,
        allowed,
        line,
    };
    // A UTF-8 byte-order mark (some editors write one) is not content.
    let source = source.strip_prefix('\u{feff}').unwrap_or(source);
    if source.len() > MAX_CONFIG_BYTES {
        return Err(err(String::new(), None, format!("a config of at most {MAX_CONFIG_BYTES} bytes"), None));
    }
    if let Some(line) = too_deep(source, MAX_CONFIG_DEPTH) {
        let allowed = format!("mappings and lists nested at most {MAX_CONFIG_DEPTH} deep");
        return Err(err(String::new(), None, allowed, Some(line)));
    }
    // An integer past 64 bits (YAML allows it, serde_yaml's values do not hold it) is read as the
    // float nearest it, so that the option it sets refuses it with its own range ("an integer in
    // 1..=4"), not with the width of a machine word.
    let widened = widen_big_integers(source);
    let mut doc: serde_yaml::Value = serde_yaml::from_str(widened.as_deref().unwrap_or(source)).map_err(|e| {
        let line = e.location().map(|l| l.line());
        let msg = clean_serde_message(&e.to_string());
        // An integer past 64 bits: YAML allows it, serde_yaml's values do not hold it.
        if let Some((key, rest)) = msg.split_once(": invalid type: integer `") {
            if let Some((value, _)) = rest.split_once("` as ") {
                let allowed = "an integer from -9223372036854775808 to 18446744073709551615 (64 bits)".to_string();
                return err(key.to_string(), Some(value.to_string()), allowed, line);
            }
        }
        err(String::new(), None, format!("not valid YAML: {msg}"), line)
    })?;
    if let Some((key, tag)) = find_tag(&doc, "") {
        let line = locate_key(source, &key);
        return Err(err(
            key,
            Some(tag),
            "a plain value: YAML tags (`!name`) are not part of the config schema".into(),
            line,
        ));
    }
    for ov in overrides {
        apply_override(&mut doc, ov).map_err(|(key, allowed)| ConfigError {
            file: PathBuf::from(format!("{} (--set {ov})", file.display())),
            key,
            value: None,
            allowed,
            line: None,
        })?;
    }
    let config: T = serde_path_to_error::deserialize(doc.clone()).map_err(|e| {
        let key = serde_key(&e.path().to_string(), &e.inner().to_string());
        let value = lookup(&doc, &key).and_then(scalar_text);
        let written = override_of(overrides, &key).map_or(source, |ov| ov.written());
        let value = value.map(|v| as_written(&v, written));
        match override_of(overrides, &key) {
            Some(ov) => ConfigError {
                file: PathBuf::from(format!("{} (--set {ov})", file.display())),
                key,
                value,
                allowed: clean_serde_message(&e.inner().to_string()),
                line: None,
            },
            None => {
                let line = locate_key(source, &key).or_else(|| e.inner().location().map(|l| l.line()));
                err(key, value, clean_serde_message(&e.inner().to_string()), line)
            }
        }
    })?;
    Ok((config, source.to_string()))
}

/// Checks the AdamW settings every schema's `train` section has (training runs, RL runs): `lr` > 0,
/// `weight_decay` ≥ 0, `betas` in [0, 1), `eps` > 0, all finite.
pub fn check_optimizer(lr: f64, weight_decay: f64, betas: [f64; 2], eps: f64) -> Result<(), OptionError> {
    if !(lr.is_finite() && lr > 0.0) {
        return Err(OptionError::new("train.lr", lr, "a finite learning rate > 0"));
    }
    if !(weight_decay.is_finite() && weight_decay >= 0.0) {
        return Err(OptionError::new("train.weight_decay", weight_decay, "a finite value ≥ 0"));
    }
    for (i, b) in betas.iter().enumerate() {
        if !(0.0..1.0).contains(b) {
            return Err(OptionError::new(format!("train.betas[{i}]"), b, "a value in [0, 1)"));
        }
    }
    if !(eps.is_finite() && eps > 0.0) {
        return Err(OptionError::new("train.eps", eps, "a finite value > 0"));
    }
    Ok(())
}

/// Checks the `name` (it names the run directory) and `device` keys every schema has (training
/// runs, RL runs).
pub fn check_name_and_device(name: &str, device: &str) -> Result<(), OptionError> {
    let name_ok = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !name.starts_with('.');
    if !name_ok {
        return Err(OptionError::new(
            "name",
            name,
            "a non-empty run name of letters, digits, '-', '_' or '.' (it names the run directory)",
        ));
    }
    crate::device::parse_device(device).map_err(|allowed| OptionError::new("device", device, allowed))?;
    Ok(())
}

impl Config {
    /// The `device` key as a request (`auto`, `cpu`, `cuda:N`); checked when the config was loaded.
    pub fn device_request(&self) -> crate::device::DeviceRequest {
        crate::device::parse_device(&self.device).unwrap_or(crate::device::DeviceRequest::Auto)
    }

    /// Checks values that serde's types cannot express. Sections with a `kind` are checked by
    /// their registry entries (see experiment.rs).
    pub fn validate(&self) -> Result<(), OptionError> {
        check_name_and_device(&self.name, &self.device)?;
        let t = &self.train;
        check_optimizer(t.lr, t.weight_decay, t.betas, t.eps)?;
        if t.steps == 0 {
            return Err(OptionError::new("train.steps", t.steps, "an integer ≥ 1"));
        }
        if t.warmup_steps > t.steps {
            return Err(OptionError::new(
                "train.warmup_steps",
                t.warmup_steps,
                format!(
                    "at most train.steps = {} (a shorter run needs a shorter warm-up: --set train.warmup_steps=N)",
                    t.steps
                ),
            ));
        }
        if !(0.0..=1.0).contains(&t.min_lr_ratio) {
            return Err(OptionError::new("train.min_lr_ratio", t.min_lr_ratio, "a fraction in [0, 1]"));
        }
        if let Some(c) = t.clip_grad_norm {
            if !(c.is_finite() && c > 0.0) {
                return Err(OptionError::new("train.clip_grad_norm", c, "a finite norm > 0"));
            }
        }
        if t.accumulation == 0 {
            return Err(OptionError::new("train.accumulation", t.accumulation, "an integer ≥ 1"));
        }
        if !(t.topology_lr_mult.is_finite() && t.topology_lr_mult >= 0.0) {
            return Err(OptionError::new("train.topology_lr_mult", t.topology_lr_mult, "a finite multiplier ≥ 0"));
        }
        if let Some(d) = t.ema {
            if !(0.0..1.0).contains(&d) {
                return Err(OptionError::new("train.ema", d, "a decay in [0, 1), e.g. 0.9999"));
            }
        }
        if t.cuda_graphs == CudaGraphs::On && self.device_request() == crate::device::DeviceRequest::Cpu {
            return Err(OptionError::new(
                "train.cuda_graphs",
                "on",
                format!("auto or off with device: {} (CUDA graphs need a CUDA device)", self.device),
            ));
        }
        check_extensions(t)?;
        if self.log.keep_checkpoints == 0 {
            return Err(OptionError::new("log.keep_checkpoints", 0, "an integer ≥ 1"));
        }
        if self.log.every == 0 {
            return Err(OptionError::new("log.every", self.log.every, "an integer ≥ 1"));
        }
        Ok(())
    }

    /// The config as YAML, every default filled in (what a run directory's `config.yaml` holds).
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("a Config always serialises")
    }
}

/// `train.extensions` as plexus writes them: each lengthens the run (its `from_steps` below the
/// next one's, and below `train.steps`), starts at an update `1 ≤ at ≤ from_steps` no earlier than
/// the one before, and applies to a schedule that depends on the length (cosine).
fn check_extensions(t: &TrainConfig) -> Result<(), OptionError> {
    for (k, e) in t.extensions.iter().enumerate() {
        let key = |field: &str| format!("train.extensions[{k}].{field}");
        if t.schedule != Schedule::Cosine {
            return Err(OptionError::new(
                format!("train.extensions[{k}]"),
                format!("{{at: {}, from_steps: {}, rule: {}}}", e.at, e.from_steps, e.rule),
                "no extensions with `schedule: constant` (its learning rate does not depend on the run's length)",
            ));
        }
        let end = t.extensions.get(k + 1).map_or(t.steps, |next| next.from_steps);
        if !(1..end).contains(&e.from_steps) {
            return Err(OptionError::new(
                key("from_steps"),
                e.from_steps,
                format!("the run's length before this lengthening: an integer in 1..{end} (the length after it)"),
            ));
        }
        let earliest = if k == 0 { 1 } else { t.extensions[k - 1].at.max(1) };
        if !(earliest..=e.from_steps).contains(&e.at) {
            return Err(OptionError::new(
                key("at"),
                e.at,
                format!(
                    "the update the lengthening continued from: an integer in {earliest}..={} (no earlier than the \
                     previous lengthening's, at most the length before it)",
                    e.from_steps
                ),
            ));
        }
    }
    Ok(())
}

/// The key of a run's lengthenings ([`Extension`]): a resumed run that grows `train.steps` may
/// add one entry after those it holds (plexus writes it).
pub const EXTENSIONS_KEY: &str = "train.extensions";

/// The key of a `plexus train` run's length: a resumed run may grow it, not shrink it.
pub const RUN_LENGTH_KEY: &str = "train.steps";

/// The other keys of a `plexus train` config that a resumed run may change: the logging and
/// checkpoint intervals, whether the step is captured as a CUDA graph (which changes no number it
/// computes), and the device (a run started on a laptop may continue on a GPU; the continuation is
/// then not bit-identical to an uninterrupted run, as kernels and random streams differ by device,
/// and the resumed run says so). `precision` is not among them: it changes what every step
/// computes.
pub fn may_change_on_resume(key: &str) -> bool {
    key.starts_with("log.") || key == "train.cuda_graphs" || key == "device"
}

/// How a resumed run's config differs from the one it was trained with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResumeDiff {
    /// Keys that may change on resume and did (`train.steps` grown, `log.*`).
    pub allowed: Vec<String>,
    /// Keys whose change would make the resumed run train something else, with the old and new
    /// values as YAML text.
    pub refused: Vec<(String, String, String)>,
}

impl ResumeDiff {
    /// Compares the config a run was trained with (`old`) with the one it is resumed with. Only
    /// `train.steps` (growing: the run is extended) and the logging intervals (`log.*`) may change.
    pub fn between(old: &Config, new: &Config) -> Self {
        let to_value = |c: &Config| serde_yaml::to_value(c).expect("a Config always serialises");
        Self::of_values(&to_value(old), &to_value(new), RUN_LENGTH_KEY, &may_change_on_resume)
    }

    /// The same for any two YAML documents: `length` (a number) may grow, keys for which
    /// `may_change` holds may change, every other change is refused.
    pub fn of_values(
        old: &serde_yaml::Value,
        new: &serde_yaml::Value,
        length: &str,
        may_change: &dyn Fn(&str) -> bool,
    ) -> Self {
        let mut changed = Vec::new();
        diff_values("", old, new, &mut changed);
        let get = |v: &'_ serde_yaml::Value, key: &str| key.split('.').try_fold(v, |v, k| v.get(k)).cloned();
        let at = |v: &serde_yaml::Value| get(v, length).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
        // The lengthenings plexus records: a resumed run may add one after those the run holds.
        let appended = |key: &str| {
            let list = |v| get(v, key).and_then(|v| v.as_sequence().cloned()).unwrap_or_default();
            let (a, b) = (list(old), list(new));
            // A config that names none continues with those the run holds (they are its record).
            let inherited = get(new, key).is_none();
            key == EXTENSIONS_KEY && (inherited || (b.len() == a.len() + 1 && b.starts_with(&a)))
        };
        let mut d = ResumeDiff::default();
        for (key, a, b) in changed {
            if may_change(&key) || (key == length && at(new) >= at(old)) || appended(&key) {
                d.allowed.push(key);
            } else {
                d.refused.push((key, a, b));
            }
        }
        d
    }
}

/// A YAML value on one line, for messages (`(absent)` for none).
pub fn yaml_text(v: Option<&serde_yaml::Value>) -> String {
    match v {
        None => "(absent)".into(),
        Some(v) => serde_yaml::to_string(v).map(|s| s.trim().replace('\n', " ")).unwrap_or_default(),
    }
}

/// The leaf keys where `a` and `b` differ (numbers compare by value: `1e-3` = `0.001`).
fn diff_values(prefix: &str, a: &serde_yaml::Value, b: &serde_yaml::Value, out: &mut Vec<(String, String, String)>) {
    use serde_yaml::Value as V;
    let join = |k: &str| if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
    match (a, b) {
        (V::Mapping(x), V::Mapping(y)) => {
            let mut keys: Vec<&V> = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))).collect();
            keys.dedup();
            for k in keys {
                let name = k.as_str().map(str::to_string).unwrap_or_else(|| yaml_text(Some(k)));
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => diff_values(&join(&name), va, vb, out),
                    (va, vb) => out.push((join(&name), yaml_text(va), yaml_text(vb))),
                }
            }
        }
        (V::Sequence(x), V::Sequence(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                diff_values(&format!("{prefix}[{i}]"), va, vb, out);
            }
        }
        (V::Number(x), V::Number(y)) if x.as_f64() == y.as_f64() => {}
        _ if a == b => {}
        _ => out.push((prefix.to_string(), yaml_text(Some(a)), yaml_text(Some(b)))),
    }
}

/// Applies one override to a YAML document: walks (and makes) the mappings of its key path and
/// sets the value; `null` removes the key, so that the schema's default applies. Err: (the key
/// that is not a mapping, what is allowed).
fn apply_override(doc: &mut serde_yaml::Value, ov: &Override) -> Result<(), (String, String)> {
    let (key, value) = (ov.key(), ov.value().clone());
    let mut node = doc;
    let segs: Vec<&str> = key.split('.').collect();
    for (i, seg) in segs.iter().enumerate() {
        let map = node
            .as_mapping_mut()
            .ok_or_else(|| (segs[..i].join("."), "a mapping (this key has no sub-keys to set)".to_string()))?;
        let k = serde_yaml::Value::String(seg.to_string());
        if i + 1 == segs.len() {
            // A variant switched by its `kind` (`topology.init.kind=half_layers` where the file
            // has `init: {kind: normal, mu: …}`): the old variant's options go with it, reset to
            // the new kind's defaults, and a line says which.
            if *seg == "kind" && map.get(&k).is_some_and(|old| *old != value) {
                let dropped: Vec<String> =
                    map.keys().filter_map(|x| x.as_str()).filter(|x| *x != "kind").map(String::from).collect();
                if !dropped.is_empty() {
                    map.retain(|x, _| x.as_str() == Some("kind"));
                    let section = segs[..i].join(".");
                    note_once(format!(
                        "--set {key}={}: {section} switches kind, so its other options ({}) go back to the new \
                         kind's defaults; --set them after this one where the new kind takes them",
                        ov.scalar().unwrap_or_default(),
                        dropped.iter().map(|d| format!("{section}.{d}")).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
            // `--set key=null` (or `~`) resets a key to its default: the key is removed, and the
            // schema's default applies (YAML's null is not a value of most options).
            if value.is_null() {
                map.remove(&k);
            } else {
                map.insert(k, value);
            }
            return Ok(());
        }
        node = map.entry(k).or_insert_with(|| serde_yaml::Value::Mapping(Default::default()));
    }
    unreachable!("the loop returns on the last segment")
}

/// Prints a note about how a config was read once per process (a sweep reads each config once
/// per run).
fn note_once(note: String) {
    static PRINTED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    if PRINTED.lock().map(|mut p| p.insert(note.clone())).unwrap_or(true) {
        eprintln!("note: {note}");
    }
}

fn lookup<'a>(doc: &'a serde_yaml::Value, key: &str) -> Option<&'a serde_yaml::Value> {
    let mut node = doc;
    for seg in key.split('.').filter(|s| !s.is_empty()) {
        let (name, idx) = match seg.find('[') {
            Some(i) => (&seg[..i], seg[i + 1..seg.len() - 1].parse::<usize>().ok()),
            None => (seg, None),
        };
        node = node.get(name)?;
        if let Some(i) = idx {
            node = node.get(i)?;
        }
    }
    Some(node)
}

/// A scalar YAML value as its text (`4`, `block`), for an error message; None for a mapping or sequence.
pub fn scalar_text(v: &serde_yaml::Value) -> Option<String> {
    match v {
        serde_yaml::Value::Mapping(_) | serde_yaml::Value::Sequence(_) => None,
        other => serde_yaml::to_string(other).ok().map(|s| s.trim().to_string()),
    }
}

/// Deserialises a kind section's options into an entry's own `Options` struct (which should be
/// `#[serde(deny_unknown_fields)]`), reporting the key path on failure.
///
/// An `Options` struct whose defaults come from its `impl Default` (`#[serde(default)]` on the
/// struct) marks a required option `Option<T>` with `#[serde(deserialize_with =
/// "crate::config::present")]` and takes it with [`required`], which fails as serde does for a
/// missing field.
pub fn parse_options<T: serde::de::DeserializeOwned>(options: &serde_yaml::Mapping) -> Result<T, OptionError> {
    let value = serde_yaml::Value::Mapping(options.clone());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let mut oe = OptionError::from_serde(e);
        if let Some(v) = lookup(&serde_yaml::Value::Mapping(options.clone()), &oe.key) {
            oe.value = scalar_text(v);
        }
        oe
    })
}

/// Deserialises a required option that is present (a `null` is the type error it always was); a
/// missing one is left `None` by the struct's `Default`, for [`required`].
pub fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// Serialises a required option (see [`present`]) as the word `required`, so that a backbone's
/// [`option_defaults`] names it as such rather than as unset.
pub fn mark_required<S: serde::Serializer, T>(_: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("required")
}

/// Every option of an options struct with its default, in declaration order (`plexus list`, the
/// backbone table of docs/configs-and-runs.md): a value, `required` (see [`mark_required`]), or
/// null where the default is derived (from the data, or from another option).
pub fn option_defaults<T: serde::Serialize + Default>() -> serde_yaml::Mapping {
    match serde_yaml::to_value(T::default()) {
        Ok(serde_yaml::Value::Mapping(m)) => m,
        other => unreachable!("an options struct serialises to a mapping, not {other:?}"),
    }
}

/// The value of a required option (see [`present`]); absent, the error serde gives for a missing
/// field (no key: it belongs to the section).
pub fn required<T>(value: Option<T>, field: &str) -> Result<T, OptionError> {
    value.ok_or_else(|| OptionError { key: String::new(), value: None, allowed: format!("missing field `{field}`") })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "name: t\nmodel:\n  kind: lnn\n  depth: 3\ntopology:\n  kind: plain\ndata:\n  kind: whitened_regression\ntrain:\n  lr: 0.1\n  steps: 5\n";

    fn load(src: &str, ov: &[&str]) -> Result<LoadedConfig, ConfigError> {
        let ov: Vec<Override> = ov.iter().map(|s| s.parse().unwrap()).collect();
        load_str(src, Path::new("t.yaml"), &ov)
    }

    #[test]
    fn good_config_loads_and_overrides_apply() {
        let c = load(GOOD, &["model.depth=4", "train.lr=0.5"]).unwrap().config;
        assert_eq!(c.model.options.get("depth").and_then(|v| v.as_u64()), Some(4));
        assert_eq!(c.train.lr, 0.5);
        assert_eq!(c.precision, Precision::Fp32);
    }

    #[test]
    fn unknown_key_names_file_key_and_line() {
        let e = load(&GOOD.replace("  lr: 0.1", "  lr: 0.1\n  lrr: 3"), &[]).unwrap_err();
        assert_eq!(e.key, "train.lrr");
        assert_eq!(e.line, Some(11));
        assert!(e.allowed.contains("unknown field `lrr`"), "{e}");
        assert!(e.to_string().contains("t.yaml"), "{e}");
    }

    /// `train.cuda_graphs`: auto (default), on, off; `on` on the CPU is refused with the device named
    /// and the values that would do; an unknown value lists the allowed ones.
    #[test]
    fn cuda_graphs_take_auto_on_off_and_on_needs_a_cuda_device() {
        assert_eq!(load(GOOD, &[]).unwrap().config.train.cuda_graphs, CudaGraphs::Auto);
        let c = load(GOOD, &["device=cuda", "train.cuda_graphs=on"]).unwrap().config;
        assert_eq!(c.train.cuda_graphs, CudaGraphs::On);
        assert_eq!(
            load(GOOD, &["device=cpu", "train.cuda_graphs=off"]).unwrap().config.train.cuda_graphs,
            CudaGraphs::Off
        );
        let e = load(GOOD, &["device=cpu", "train.cuda_graphs=on"]).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_deref()), ("train.cuda_graphs", Some("on")), "{e}");
        assert!(e.allowed.contains("device: cpu") && e.allowed.contains("auto or off"), "{e}");
        let e = load(GOOD, &["train.cuda_graphs=always"]).unwrap_err();
        assert!(e.allowed.contains("auto") && e.allowed.contains("off"), "{e}");
    }

    #[test]
    fn negative_lr_and_wrong_type_are_rejected() {
        let e = load(GOOD, &["train.lr=-1"]).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_deref()), ("train.lr", Some("-1")));
        let e = load(&GOOD.replace("steps: 5", "steps: many"), &[]).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_deref(), e.line), ("train.steps", Some("many"), Some(11)));
        let e = load(GOOD, &["precision=fp16"]).unwrap_err();
        assert!(e.allowed.contains("fp32") && e.allowed.contains("bf16"), "{e}");
    }

    #[test]
    fn flow_style_errors_have_a_line_and_set_errors_name_the_override() {
        let flow = "name: t\nmodel: {kind: lnn, depth: 0}\ntopology: {kind: plain}\ndata: {kind: whitened_regression}\ntrain: {lr: 0.1, steps: 5, lrr: 3}\n";
        let e = load(flow, &[]).unwrap_err();
        assert_eq!((e.key.as_str(), e.line), ("train.lrr", Some(5)), "{e}");
        let e = load(&flow.replace(", lrr: 3", "").replace("lr: 0.1", "lr: -0.1"), &[]).unwrap_err();
        assert_eq!((e.key.as_str(), e.line), ("train.lr", Some(5)), "{e}");
        // A value given by --set is reported as such, not at the file's line of that key.
        let e = load(GOOD, &["train.lr=-1"]).unwrap_err();
        assert_eq!(e.line, None, "{e}");
        assert!(e.to_string().contains("(--set train.lr=-1)"), "{e}");
        let e = load(GOOD, &["train.steps=lots"]).unwrap_err();
        assert_eq!((e.key.as_str(), e.line), ("train.steps", None), "{e}");
        assert!(e.to_string().contains("--set train.steps=lots"), "{e}");
        // The file's own bad value still gets its line.
        let e = load(&GOOD.replace("lr: 0.1", "lr: -0.1"), &["train.steps=7"]).unwrap_err();
        assert_eq!((e.key.as_str(), e.line), ("train.lr", Some(10)), "{e}");
        assert!(!e.to_string().contains("--set"), "{e}");
    }

    #[test]
    fn deep_or_huge_yaml_is_refused_before_parsing() {
        let t = std::time::Instant::now();
        let deep = format!("name: {}{}", "[".repeat(100_000), "]".repeat(100_000));
        let e = load(&deep, &[]).unwrap_err();
        assert!(e.allowed.contains("nested at most 64"), "{e}");
        assert_eq!(e.line, Some(1));
        let mut block = String::from("name: t\n");
        for d in 0..200 {
            block += &format!("{}k{d}:\n", " ".repeat(d));
        }
        let e = load(&block, &[]).unwrap_err();
        assert!(e.allowed.contains("nested at most"), "{e}");
        let big = format!("name: t\n#{}\n", "x".repeat(MAX_CONFIG_BYTES));
        assert!(load(&big, &[]).unwrap_err().allowed.contains("at most 1048576 bytes"));
        let e = Override::parse(&format!("model.depth={}", "[".repeat(100_000))).unwrap_err();
        assert!(e.allowed.contains("nested at most"), "{e}");
        // Milliseconds when bounded; seconds or a stack overflow when not. Generous, as the test
        // shares the machine with the rest of the suite.
        assert!(t.elapsed().as_secs_f64() < 10.0, "took {:?}", t.elapsed());
        // Shipped-config depth is far below the bound.
        assert!(load(GOOD, &[]).is_ok());
    }

    #[test]
    fn a_byte_order_mark_is_ignored_and_tags_are_rejected() {
        let c = load(&format!("\u{feff}{GOOD}"), &[]).unwrap().config;
        assert_eq!(c.name, "t");
        let e = load(&GOOD.replace("lr: 0.1", "lr: !custom 0.1"), &[]).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_deref(), e.line), ("train.lr", Some("!custom"), Some(10)), "{e}");
        let e = Override::parse("model.depth=!weird 3").unwrap_err();
        assert!(e.allowed.contains("tags"), "{e}");
    }

    #[test]
    fn resume_allows_longer_training_and_log_changes_only() {
        let old = load(GOOD, &[]).unwrap().config;
        let cfg = |ov: &[&str]| load(GOOD, ov).unwrap().config;
        let d = ResumeDiff::between(&old, &cfg(&["train.steps=9", "log.every=2", "log.eval_every=3"]));
        assert_eq!(d.allowed, vec!["train.steps", "log.every", "log.eval_every"]);
        assert!(d.refused.is_empty());
        assert_eq!(ResumeDiff::between(&old, &cfg(&["train.lr=1e-1"])), ResumeDiff::default(), "0.1 = 1e-1");
        let d = ResumeDiff::between(&old, &cfg(&["topology.kind=residual", "seed=3", "train.optimizer=adamw"]));
        let keys: Vec<&str> = d.refused.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(keys, vec!["seed", "topology.kind", "train.optimizer"]);
        assert_eq!(d.refused[1], ("topology.kind".into(), "plain".into(), "residual".into()));
        let d = ResumeDiff::between(&old, &cfg(&["train.steps=3", "model.width=7"]));
        let keys: Vec<&str> = d.refused.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(keys, vec!["model.width", "train.steps"], "shrinking steps and a new model option are refused");
    }
}
