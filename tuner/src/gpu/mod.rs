//! The only module that calls cudarc or any CUDA library: loading, NVRTC, the driver, cuBLAS(Lt).
//!
//! Everything above this layer sees safe types and typed errors.

pub mod loader;
pub mod nvrtc;
