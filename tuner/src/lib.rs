//! fp4tune: autotuning of NVFP4 block-scaled GEMM kernels (library half; the CLI lives in main.rs).

pub mod bench;
pub mod compile;
pub mod error;
pub mod format;
pub mod gpu;
pub mod model;
pub mod problem;
pub mod shapes;
pub mod template;

pub use error::{Error, Result};
