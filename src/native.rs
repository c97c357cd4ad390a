//! The native layer, `plexus-native` (the workspace crate in `native/`): the libtorch calls tch does
//! not expose and plexus' CPU and CUDA kernels, in C++ behind a safe Rust API (its crate docs list
//! what is there). Re-exported here whole, so that the rest of plexus writes
//! `crate::native::stream_read`; nothing in plexus touches FFI.
pub use plexus_native::*;
