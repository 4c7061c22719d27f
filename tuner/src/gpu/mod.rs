//! The only module that calls cudarc or any CUDA library: loading, NVRTC, the driver, cuBLAS(Lt).
//!
//! Everything above this layer sees safe types and typed errors.

pub mod blas;
pub mod device;
pub mod loader;
pub mod nvrtc;
pub mod params;
pub mod raw;

pub use device::{DeviceBuf, DeviceInfo, Gpu, GpuError, Graph, Kernel};
pub use params::GemmParams;
