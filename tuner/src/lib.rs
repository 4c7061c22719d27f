//! fp4tune: autotuning of NVFP4 block-scaled GEMM kernels (library half; the CLI lives in main.rs).

pub mod error;

pub use error::{Error, Result};
