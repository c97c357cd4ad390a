//! TensorBoard event files: what a run logs (scalars, the connectivity matrix as an image, the
//! resolved config as text) in `<run>/tensorboard/`, so that `tensorboard --logdir runs/` shows
//! runs live and side by side, and `wandb sync` uploads them.
//!
//! The format is TensorFlow's event file, written here (the crates that write it pin old `image`
//! and `protobuf` releases): a sequence of records, each `u64` length (little-endian), the masked
//! CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data; each record's data is an
//! `Event` protocol buffer (tensorflow/core/util/event.proto, summary.proto), encoded with prost.
//! The first event names the format version (`brain.Event:2`).
//!
//! Every process that trains a run writes a file of its own (`events.out.tfevents.<unix
//! time>.<nanoseconds>.<host>.<pid>.plexus`) and flushes after every event, so a killed run leaves readable files
//! (TensorBoard ignores a truncated last record). A resumed run opens its file with a session
//! start at the resumed step: TensorBoard then drops what earlier files logged at that step and
//! after (the rows a killed run wrote past its last checkpoint), so no step appears twice.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The folder of a run's event files.
pub const DIR: &str = "tensorboard";

/// The protocol buffers of the event format (only the fields plexus writes; field numbers as in
/// TensorFlow's .proto files).
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Event {
        #[prost(double, tag = "1")]
        pub wall_time: f64,
        #[prost(int64, tag = "2")]
        pub step: i64,
        #[prost(oneof = "What", tags = "3, 5, 7")]
        pub what: Option<What>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum What {
        #[prost(string, tag = "3")]
        FileVersion(String),
        #[prost(message, tag = "5")]
        Summary(Summary),
        #[prost(message, tag = "7")]
        SessionLog(SessionLog),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SessionLog {
        /// 1 = START.
        #[prost(int32, tag = "1")]
        pub status: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Summary {
        #[prost(message, repeated, tag = "1")]
        pub value: Vec<Value>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Value {
        #[prost(string, tag = "1")]
        pub tag: String,
        #[prost(message, optional, tag = "9")]
        pub metadata: Option<SummaryMetadata>,
        #[prost(oneof = "Kind", tags = "2, 4, 8")]
        pub kind: Option<Kind>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(float, tag = "2")]
        SimpleValue(f32),
        #[prost(message, tag = "4")]
        Image(Image),
        #[prost(message, tag = "8")]
        Tensor(TensorProto),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Image {
        #[prost(int32, tag = "1")]
        pub height: i32,
        #[prost(int32, tag = "2")]
        pub width: i32,
        /// 1 = grayscale, 3 = RGB.
        #[prost(int32, tag = "3")]
        pub colorspace: i32,
        #[prost(bytes = "vec", tag = "4")]
        pub encoded_image_string: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SummaryMetadata {
        #[prost(message, optional, tag = "1")]
        pub plugin_data: Option<PluginData>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PluginData {
        #[prost(string, tag = "1")]
        pub plugin_name: String,
        /// The plugin's own serialized message (the hparams plugin's `HParamsPluginData`).
        #[prost(bytes = "vec", tag = "2")]
        pub content: Vec<u8>,
    }

    /// tensorboard/plugins/hparams/plugin_data.proto (the session start and end; not the
    /// experiment, which TensorBoard infers from the sessions).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HParamsPluginData {
        #[prost(int32, tag = "1")]
        pub version: i32,
        #[prost(oneof = "HParamsData", tags = "3, 4")]
        pub data: Option<HParamsData>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum HParamsData {
        #[prost(message, tag = "3")]
        SessionStartInfo(SessionStartInfo),
        #[prost(message, tag = "4")]
        SessionEndInfo(SessionEndInfo),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SessionStartInfo {
        #[prost(map = "string, message", tag = "1")]
        pub hparams: std::collections::HashMap<String, ProtoValue>,
        #[prost(string, tag = "4")]
        pub group_name: String,
        #[prost(double, tag = "5")]
        pub start_time_secs: f64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SessionEndInfo {
        /// 1 = STATUS_SUCCESS.
        #[prost(int32, tag = "1")]
        pub status: i32,
        #[prost(double, tag = "2")]
        pub end_time_secs: f64,
    }

    /// google.protobuf.Value (the kinds plexus writes).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProtoValue {
        #[prost(oneof = "ProtoKind", tags = "2, 3, 4")]
        pub kind: Option<ProtoKind>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum ProtoKind {
        #[prost(double, tag = "2")]
        Number(f64),
        #[prost(string, tag = "3")]
        Text(String),
        #[prost(bool, tag = "4")]
        Bool(bool),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorProto {
        /// 1 = DT_FLOAT, 7 = DT_STRING.
        #[prost(int32, tag = "1")]
        pub dtype: i32,
        #[prost(message, optional, tag = "2")]
        pub tensor_shape: Option<TensorShape>,
        #[prost(float, repeated, tag = "5")]
        pub float_val: Vec<f32>,
        #[prost(bytes = "vec", repeated, tag = "8")]
        pub string_val: Vec<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorShape {}
}

/// The CRC of the record format: CRC-32C, rotated and offset ("masked") so that a CRC of data
/// that holds CRCs is not a trivial function of them.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One event file of a run, written by one process.
pub struct EventWriter {
    file: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
}

impl EventWriter {
    /// Creates this process's event file in `<run>/tensorboard/`; `start` is the first step this
    /// process logs (0, or the step a resumed run continues from), marked as a session start so
    /// that TensorBoard drops what earlier files logged from that step on.
    pub fn create(run: &Path, start: u64) -> Result<Self> {
        let dir = run.join(DIR);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut w = Self::open_new(&dir)?;
        w.event(start, proto::What::SessionLog(proto::SessionLog { status: 1 }))?;
        Ok(w)
    }

    /// Writes what `write` logs into `<run>/tensorboard/<name>` (a name with `tfevents` in it),
    /// replacing that file as a whole (written aside, then renamed: TensorBoard never reads half
    /// of it, and running again shows each point once). No session start: what training files
    /// logged stays. For what is computed after training (`plexus analyze`).
    pub fn replace(run: &Path, name: &str, write: impl FnOnce(&mut EventWriter) -> Result<()>) -> Result<PathBuf> {
        anyhow::ensure!(name.contains("tfevents"), "an event file's name holds `tfevents`, not {name}");
        let dir = run.join(DIR);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let fin = dir.join(name);
        crate::run_dir::check_output_file(&fin, "the analysis' event file")?;
        let w = Self::open_new(&dir)?;
        let tmp = w.path.clone();
        // The file written aside is removed if anything fails: no stray event file (TensorBoard
        // would read it as another run's) survives a failed analysis.
        let result = (|| -> Result<()> {
            let mut w = w;
            write(&mut w)?;
            w.file.flush().with_context(|| format!("writing {}", fin.display()))?;
            drop(w);
            std::fs::rename(&tmp, &fin).with_context(|| format!("writing {}", fin.display()))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map(|()| fin)
    }

    /// A new event file of this process in `dir`, its version event written.
    fn open_new(dir: &Path) -> Result<Self> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let host: String = host.trim().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        // Files are read in name order: the time to the nanosecond orders a process's files, and
        // so a resumed run's after the killed one's, even within one second.
        let name = format!(
            "events.out.tfevents.{}.{:09}.{}.{}.plexus",
            now.as_secs(),
            now.subsec_nanos(),
            host,
            std::process::id()
        );
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let mut w = EventWriter { file: std::io::BufWriter::new(file), path };
        w.event(0, proto::What::FileVersion("brain.Event:2".into()))?;
        Ok(w)
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn event(&mut self, step: u64, what: proto::What) -> Result<()> {
        use prost::Message;
        let wall_time =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let data = proto::Event { wall_time, step: step as i64, what: Some(what) }.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        let mut record = Vec::with_capacity(data.len() + 16);
        record.extend_from_slice(&len);
        record.extend_from_slice(&masked_crc(&len).to_le_bytes());
        record.extend_from_slice(&data);
        record.extend_from_slice(&masked_crc(&data).to_le_bytes());
        // One write of the whole record, then a flush: a reader never sees half an event except
        // the last one of a killed process.
        self.file
            .write_all(&record)
            .and_then(|_| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }

    fn summary(&mut self, step: u64, value: Vec<proto::Value>) -> Result<()> {
        self.event(step, proto::What::Summary(proto::Summary { value }))
    }

    /// Scalars at `step`, as `(tag, value)`: `train/loss`, `eval/accuracy`, … (non-finite values
    /// are written as they are; TensorBoard shows them).
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> Result<()> {
        let value = values
            .iter()
            .map(|(tag, v)| proto::Value {
                tag: tag.to_string(),
                metadata: None,
                kind: Some(proto::Kind::SimpleValue(*v as f32)),
            })
            .collect();
        self.summary(step, value)
    }

    /// A text at `step` (TensorBoard's text plugin renders it as markdown).
    pub fn text(&mut self, step: u64, tag: &str, text: &str) -> Result<()> {
        let value = proto::Value {
            tag: tag.to_string(),
            metadata: Some(proto::SummaryMetadata {
                plugin_data: Some(proto::PluginData { plugin_name: "text".into(), content: Vec::new() }),
            }),
            kind: Some(proto::Kind::Tensor(proto::TensorProto {
                dtype: 7,
                tensor_shape: Some(proto::TensorShape {}),
                float_val: Vec::new(),
                string_val: vec![text.as_bytes().to_vec()],
            })),
        };
        self.summary(step, vec![value])
    }

    /// A run's hyperparameters for TensorBoard's HPARAMS dashboard, which lists runs by them (a
    /// sweep's grid point): a session start with `hparams` (numbers where they parse as numbers,
    /// `true`/`false` as booleans, else text) and `group` (runs of one group differ by seed only),
    /// and its end (finished).
    pub fn hparams(&mut self, hparams: &[(String, String)], group: &str) -> Result<()> {
        use prost::Message;
        let value = |v: &str| proto::ProtoValue {
            kind: Some(match (v.parse::<f64>(), v) {
                (Ok(x), _) if x.is_finite() => proto::ProtoKind::Number(x),
                (_, "true") => proto::ProtoKind::Bool(true),
                (_, "false") => proto::ProtoKind::Bool(false),
                _ => proto::ProtoKind::Text(v.to_string()),
            }),
        };
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let start = proto::HParamsData::SessionStartInfo(proto::SessionStartInfo {
            hparams: hparams.iter().map(|(k, v)| (k.clone(), value(v))).collect(),
            group_name: group.to_string(),
            start_time_secs: now,
        });
        let end = proto::HParamsData::SessionEndInfo(proto::SessionEndInfo { status: 1, end_time_secs: now });
        for (tag, data) in [("_hparams_/session_start_info", start), ("_hparams_/session_end_info", end)] {
            let content = proto::HParamsPluginData { version: 0, data: Some(data) }.encode_to_vec();
            let value = proto::Value {
                tag: tag.into(),
                metadata: Some(proto::SummaryMetadata {
                    plugin_data: Some(proto::PluginData { plugin_name: "hparams".into(), content }),
                }),
                // The hparams plugin's summaries carry a null float tensor (as TensorBoard's own
                // writer's): the data is in the metadata.
                kind: Some(proto::Kind::Tensor(proto::TensorProto {
                    dtype: 1,
                    tensor_shape: Some(proto::TensorShape {}),
                    float_val: vec![0.0],
                    string_val: Vec::new(),
                })),
            };
            self.summary(0, vec![value])?;
        }
        Ok(())
    }

    /// A matrix `m` at `step` as a grayscale image, black = the smallest entry, white = the
    /// largest, each entry a `cell`×`cell` square (C of a 10-unit network is 12×12 entries: too
    /// small to see one pixel each).
    pub fn matrix_image(&mut self, step: u64, tag: &str, m: &ndarray::Array2<f64>, cell: u32) -> Result<()> {
        let (rows, cols) = (m.nrows() as u32, m.ncols() as u32);
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let finite = m.iter().copied().filter(|v| v.is_finite());
        let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
        let span = if hi > lo { hi - lo } else { 1.0 };
        let img = image::GrayImage::from_fn(cols * cell, rows * cell, |x, y| {
            let v = m[[(y / cell) as usize, (x / cell) as usize]];
            let g = if v.is_finite() { ((v - lo) / span * 255.0).round().clamp(0.0, 255.0) as u8 } else { 0 };
            image::Luma([g])
        });
        let mut png = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).context("encoding a PNG")?;
        let value = proto::Value {
            tag: tag.to_string(),
            metadata: None,
            kind: Some(proto::Kind::Image(proto::Image {
                height: (rows * cell) as i32,
                width: (cols * cell) as i32,
                colorspace: 1,
                encoded_image_string: png,
            })),
        };
        self.summary(step, vec![value])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C's check value (of "123456789": 0xe3069283), and the mask of the record format:
    /// rotate right by 15, add 0xa282ead8 (crc32c("") = 0 masks to the constant itself).
    #[test]
    fn the_masked_crc_is_tensorflows() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b""), 0xa282_ead8);
        assert_eq!(masked_crc(b"123456789"), 0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8));
    }

    #[test]
    fn records_frame_their_events() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path(), 0).unwrap();
        w.scalars(3, &[("train/loss", 0.5)]).unwrap();
        let bytes = std::fs::read(w.path()).unwrap();
        // Walk the records: each length and data CRC must check.
        let (mut at, mut n) = (0usize, 0);
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            assert_eq!(u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()), masked_crc(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            assert_eq!(u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap()), masked_crc(data));
            at += 16 + len;
            n += 1;
        }
        assert_eq!(n, 3, "version, session start, one summary");
    }
}
