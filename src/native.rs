//! The native layer, `plexus-native` (the workspace crate in `native/`): the libtorch calls tch does
//! not expose and plexus' CPU and CUDA kernels, in C++ behind a safe Rust API (its crate docs list
//! what is there). Its modules are re-exported here by name, so that the rest of plexus reaches an
//! item by its module's path (`crate::native::choice::stream_read`); nothing in plexus touches FFI.
pub use plexus_native::{
    choice, composite, cuda, cuda_graph, kernels, kineto, optim, process_group, profile, setting, NativeError,
    BUILT_WITH_CUDA, NCCL_MISSING,
};
