//! plexus' integration tests, one binary: each file of this folder is a module named after what
//! it tests (its own doc comment says what). One binary links libtorch once, instead of once per
//! file (27 links in a CI build from nothing), and its tests share the cores as one pool, where
//! binaries run one after another each leave the cores idle at their tail.
//!
//! They share one process, so nothing here may depend on process-wide state another test
//! changes: libtorch's generator is only seeded and drawn from inside
//! `plexus::device::with_seed` (which holds the process's seed lock), no test sets an environment
//! variable of its own process (a child's, yes), and the panic hook of `broken_inputs` counts only
//! the panics of the threads it starts.
//!
//! `cargo test --release --test it` runs them (`scripts/test.sh` adds the slow tier); `-- MODULE::`
//! selects one module, e.g. `cargo test --release --test it -- graph::`.

mod common;

mod analysis;
mod backbones;
mod bench;
mod broken_inputs;
mod cli;
mod compose;
mod data;
mod defaults;
mod device_discipline;
mod dist;
mod dit;
mod docs;
mod figures;
mod function_length;
mod graph;
mod layers;
mod lnn_case_study;
mod load;
mod mudd;
mod native;
mod output_paths;
mod parity;
mod rl;
mod run_dirs;
mod study;
mod tensorboard;
mod tokens;
mod topologies;
mod train;
