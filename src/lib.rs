//! plexus: a research framework on libtorch for studying how the layers of deep networks connect
//! across depth.
//!
//! A model is `stem → depth stack of L units → readout head` ([`model`]); a [`topology`] decides
//! what each unit and the readout read. Configs ([`config`]) are resolved against the registries
//! into an [`experiment::Experiment`], which [`train`] runs into a run directory ([`run_dir`]).

pub mod analysis;
pub mod bench;
pub mod cli;
pub mod commands;
pub mod config;
pub mod data;
pub mod device;
pub mod diffusion;
pub mod dist;
pub mod doctor;
pub mod experiment;
pub mod fd;
pub mod host;
pub mod input_file;
pub mod kinds;
pub mod malloc;
pub mod model;
pub mod native;
pub mod parity;
pub mod pins;
pub mod plot;
pub mod report;
pub mod rl;
pub mod run_dir;
pub mod sets;
pub mod study;
pub mod task;
pub mod tensorboard;
pub mod topology;
/// libtorch's errors in words (the native crate's module, re-exported).
pub use plexus_native::torch_panic;
pub mod train;
