//! The only module that calls cudarc or any CUDA library: loading, NVRTC, the driver, cuBLAS(Lt).
//!
//! Everything above this layer sees safe types and typed errors. It depends on nothing else in
//! the crate: it loads CUBIN bytes (`KernelImage`) with its own launch dimensions (`LaunchDims`).

pub mod blas;
pub mod device;
pub mod loader;
pub mod moe_params;
pub mod nvrtc;
pub mod params;
pub mod raw;

pub use device::{DeviceBuf, DeviceInfo, Gpu, GpuError, Graph, Kernel, KernelImage, LaunchDims};
pub use params::GemmParams;
