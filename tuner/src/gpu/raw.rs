//! Launches on caller-provided raw CUDA streams (serving code's streams, e.g. PyTorch's current
//! stream) in the device's primary context, the context PyTorch and the CUDA runtime use, so
//! device pointers from either are valid here.

use super::device::{drv, Gpu, GpuError, Kernel, LaunchDims};
use super::params::GemmParams;
use cudarc::driver::{result, sys};
use std::ffi::c_void;

/// A raw `CUstream` handle as an integer (0 = the legacy default stream).
pub type RawStream = u64;

impl Gpu {
    /// Make the device's primary context current on the calling thread (a cheap check when it
    /// already is, which is the common case on a serving thread).
    pub fn bind_to_thread(&self) -> Result<(), GpuError> {
        self.context().bind_to_thread().map_err(drv("cuCtxSetCurrent"))
    }

    /// Launch `kernel` with one [`GemmParams`] on the raw stream `stream`. Makes the primary
    /// context current first; does nothing else (no allocation, no synchronization).
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of this device's primary context. `params` must describe
    /// device buffers of this context large enough for the launch `dims` (the GEMM contract in
    /// templates/common/params.cuh), alive until the work on `stream` completes, and `kernel` must
    /// have been loaded by this `Gpu` and take exactly one `GemmParams` by value.
    pub unsafe fn launch_on_stream(
        &self,
        kernel: &Kernel,
        dims: LaunchDims,
        params: &GemmParams,
        stream: RawStream,
    ) -> Result<(), GpuError> {
        let mut args = [params as *const GemmParams as *mut c_void];
        // SAFETY: `args` holds one pointer to a GemmParams that outlives the call; the rest is the
        // caller's contract above.
        unsafe { self.launch_raw(kernel, dims, &mut args, stream) }
    }

    /// `cuLaunchKernel` of `kernel` on `stream` with `args` (one pointer per kernel parameter),
    /// after making the primary context current.
    ///
    /// # Safety
    /// `args` must point at values matching the kernel's parameter list, alive for the call
    /// (cuLaunchKernel copies them before returning); the buffers they name must stay valid
    /// until the work completes; `stream` must be 0 or a live stream of the primary context.
    unsafe fn launch_raw(
        &self,
        kernel: &Kernel,
        dims: LaunchDims,
        args: &mut [*mut c_void],
        stream: RawStream,
    ) -> Result<(), GpuError> {
        self.bind_to_thread()?;
        // SAFETY: the function handle is alive (kept by `kernel`'s module); the arguments and
        // the stream per the contract above.
        unsafe {
            result::launch_kernel(
                kernel.function().cu_function(),
                dims.grid,
                dims.block,
                dims.smem_bytes,
                stream as sys::CUstream,
                args,
            )
        }
        .map_err(drv("cuLaunchKernel"))
    }

    /// The raw handle of this `Gpu`'s own stream (the one `launch`, `capture` and the benchmark use).
    pub fn own_stream(&self) -> RawStream {
        self.stream().cu_stream() as RawStream
    }

    /// Launch a kernel whose arguments are all 64-bit values on the raw stream `stream`.
    ///
    /// # Safety
    /// As [`Gpu::launch_u64s`] (the parameter list is exactly `args.len()` 64-bit values, pointers
    /// valid until the work completes), and `stream` must be 0 or a live stream of this device's
    /// primary context.
    pub unsafe fn launch_u64s_on_stream(
        &self,
        kernel: &Kernel,
        dims: LaunchDims,
        args: &[u64],
        stream: RawStream,
    ) -> Result<(), GpuError> {
        let mut ptrs: Vec<*mut c_void> =
            args.iter().map(|a| a as *const u64 as *mut c_void).collect();
        // SAFETY: `ptrs` points at the 64-bit values of `args`, which outlive the call; the rest
        // is the caller's contract above.
        unsafe { self.launch_raw(kernel, dims, &mut ptrs, stream) }
    }

    /// Launch `kernel` with one by-value parameter block `params` (any `#[repr(C)]` mirror of the
    /// kernel's single struct parameter) on the raw stream `stream`.
    ///
    /// # Safety
    /// The kernel must take exactly one `P` by value; the buffers `params` names must be device
    /// buffers of this context, large enough for what the kernel does at `dims`, and alive until
    /// the work on `stream` completes; `stream` must be 0 or a live stream of this device's
    /// primary context.
    pub unsafe fn launch_params_on_stream<P: cudarc::driver::DeviceRepr>(
        &self,
        kernel: &Kernel,
        dims: LaunchDims,
        params: &P,
        stream: RawStream,
    ) -> Result<(), GpuError> {
        let mut args = [params as *const P as *mut c_void];
        // SAFETY: `args` holds one pointer to a `P` that outlives the call; the rest is the
        // caller's contract above.
        unsafe { self.launch_raw(kernel, dims, &mut args, stream) }
    }

    /// Copy `bytes` bytes from device address `src` to `dst` on the raw stream `stream`
    /// (asynchronously).
    ///
    /// # Safety
    /// `src` and `dst` must be device memory of this context of `bytes` bytes each, not
    /// overlapping, alive until the copy completes; `stream` 0 or a live stream of the primary
    /// context.
    pub unsafe fn copy_on_stream(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        stream: RawStream,
    ) -> Result<(), GpuError> {
        self.bind_to_thread()?;
        // SAFETY: the context is current; addresses, size and stream per the contract above.
        unsafe {
            sys::cuMemcpyDtoDAsync_v2(
                dst as sys::CUdeviceptr,
                src as sys::CUdeviceptr,
                bytes as usize,
                stream as sys::CUstream,
            )
        }
        .result()
        .map_err(drv("cuMemcpyDtoDAsync"))
    }

    /// Block until all work on `stream` has finished (surfaces asynchronous launch errors).
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of this device's primary context.
    pub unsafe fn synchronize_stream(&self, stream: RawStream) -> Result<(), GpuError> {
        self.bind_to_thread()?;
        // SAFETY: the context is current; the stream handle is valid per the contract above.
        unsafe { sys::cuStreamSynchronize(stream as sys::CUstream) }
            .result()
            .map_err(drv("cuStreamSynchronize"))
    }

    /// Whether `stream` is being captured into a CUDA graph (then nothing may synchronize it).
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of this device's primary context.
    pub unsafe fn stream_is_capturing(&self, stream: RawStream) -> Result<bool, GpuError> {
        self.bind_to_thread()?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the context is current; `status` is valid for one write; stream per contract.
        unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut status) }
            .result()
            .map_err(drv("cuStreamIsCapturing"))?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Block until all work of the whole context (every stream, the caller's included) finished.
    pub fn synchronize_device(&self) -> Result<(), GpuError> {
        self.bind_to_thread()?;
        // SAFETY: the primary context is current on this thread.
        unsafe { sys::cuCtxSynchronize() }.result().map_err(drv("cuCtxSynchronize"))
    }
}
