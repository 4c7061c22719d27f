//! fp4tune: autotuning of NVFP4 block-scaled GEMM kernels (library half; the CLI lives in main.rs).

pub mod bench;
pub mod check;
pub mod compile;
pub mod error;
pub mod ffi;
pub mod format;
pub mod fsio;
pub mod gpu;
pub mod moe;
pub mod plot;
pub mod problem;
pub mod runtime;
pub mod search;
pub mod selftest;
pub mod shapes;
pub mod table;
pub mod template;
pub mod tune;

pub use error::{Error, Result};
