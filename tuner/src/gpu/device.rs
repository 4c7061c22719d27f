//! One CUDA device: context, stream, device facts, buffers, modules, launches, events and graphs.

use super::loader;
use cudarc::driver::sys::{CUdevice_attribute as Attr, CUfunction_attribute as FnAttr};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Errors of the device layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    #[error(
        "no CUDA driver (libcuda.so) on this machine: GPU work needs an NVIDIA GPU and driver"
    )]
    NoDriver,
    #[error("no CUDA device {ordinal}: {count} device(s) visible")]
    NoDevice { ordinal: usize, count: i32 },
    #[error("CUDA driver call `{call}` failed: {err}")]
    Driver { call: &'static str, err: DriverError },
    #[error("kernel {kernel}: {message}")]
    Kernel { kernel: String, message: String },
    #[error("cuBLAS call `{call}` failed: {message}")]
    Blas { call: &'static str, message: String },
}

pub(crate) fn drv(call: &'static str) -> impl Fn(DriverError) -> GpuError {
    move |err| GpuError::Driver { call, err }
}

/// Identity and limits of a device, recorded with every measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub l2_bytes: u64,
    pub total_mem: u64,
    pub max_smem_per_block_optin: u32,
    /// CUDA driver API version, e.g. (13, 0).
    pub driver_version: (i32, i32),
    pub sm_clock_mhz: u32,
    pub mem_clock_mhz: u32,
    pub mem_bus_bits: u32,
}

/// A device buffer of `T` with its raw address available for parameter blocks.
#[derive(Debug)]
pub struct DeviceBuf<T> {
    slice: CudaSlice<T>,
    ptr: u64,
}

impl<T> DeviceBuf<T> {
    /// Device address of the first element.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.slice.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
    pub fn bytes(&self) -> usize {
        self.slice.num_bytes()
    }
}

/// A kernel loaded into the device's context, with its dynamic shared memory opted in.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub name: String,
    func: CudaFunction,
}

impl Kernel {
    /// The loaded function (for `gpu::raw`).
    pub(super) fn function(&self) -> &CudaFunction {
        &self.func
    }

    /// Local memory per thread the loaded function uses, as the driver reports it (register
    /// spills and stack; 0 for a kernel that keeps everything in registers and shared memory).
    pub fn local_bytes(&self) -> Result<u32, GpuError> {
        let b = self
            .func
            .get_attribute(FnAttr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
            .map_err(drv("cuFuncGetAttribute"))?;
        Ok(b.max(0) as u32)
    }
}

/// An open device with one stream that all work of this handle goes to.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
}

/// How many CUDA devices the driver reports (0 without a driver).
pub fn device_count() -> Result<usize, GpuError> {
    if !loader::driver_present() {
        return Ok(0);
    }
    let n = CudaContext::device_count().map_err(drv("cuDeviceGetCount"))?;
    Ok(n.max(0) as usize)
}

impl Gpu {
    /// Open device `ordinal`. Fails cleanly (no panic) when there is no driver or device.
    pub fn open(ordinal: usize) -> Result<Self, GpuError> {
        if !loader::driver_present() {
            return Err(GpuError::NoDriver);
        }
        let count = CudaContext::device_count().map_err(drv("cuDeviceGetCount"))?;
        if ordinal as i32 >= count {
            return Err(GpuError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("cuCtxCreate"))?;
        // One stream, no cross-stream tracking: no hidden events around our launches.
        // SAFETY: this handle uses a single stream, so cudarc's per-buffer event tracking (which
        // orders work across streams) is not needed; nothing else shares this context's buffers.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let attr = |a: Attr| ctx.attribute(a).map_err(drv("cuDeviceGetAttribute"));
        let (major, minor) = ctx.compute_capability().map_err(drv("cuDeviceGetAttribute"))?;
        let mut driver_version = 0i32;
        // SAFETY: the driver is loaded (checked above); the pointer is valid for one write.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(drv("cuDriverGetVersion"))?;
        let info = DeviceInfo {
            name: ctx.name().map_err(drv("cuDeviceGetName"))?,
            compute_capability: (major as u32, minor as u32),
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
            total_mem: ctx.total_mem().map_err(drv("cuDeviceTotalMem"))? as u64,
            max_smem_per_block_optin: attr(
                Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )? as u32,
            driver_version: (driver_version / 1000, (driver_version % 1000) / 10),
            sm_clock_mhz: attr(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? as u32 / 1000,
            mem_clock_mhz: attr(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)? as u32 / 1000,
            mem_bus_bits: attr(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)? as u32,
        };
        Ok(Self { ctx, stream, info })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The threads and the 32-bit registers one SM holds (the occupancy limits), from the driver.
    pub fn sm_limits(&self) -> Result<(u32, u32), GpuError> {
        let attr = |a: Attr| self.ctx.attribute(a).map_err(drv("cuDeviceGetAttribute"));
        Ok((
            attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)? as u32,
            attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)? as u32,
        ))
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's primary context (for `gpu::raw`).
    pub(super) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<DeviceBuf<T>, GpuError> {
        let slice = self.stream.alloc_zeros::<T>(n.max(1)).map_err(drv("cuMemAlloc"))?;
        Ok(self.wrap(slice))
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<DeviceBuf<T>, GpuError> {
        let slice = self.stream.clone_htod(host).map_err(drv("cuMemcpyHtoD"))?;
        Ok(self.wrap(slice))
    }

    /// `copies` back-to-back copies of `host` in one buffer: one upload, then device-to-device
    /// copies (operand rotation for cold-L2 timing).
    pub fn upload_repeated<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        host: &[T],
        copies: usize,
    ) -> Result<DeviceBuf<T>, GpuError> {
        let n = host.len();
        let mut all =
            self.stream.alloc_zeros::<T>((n * copies).max(1)).map_err(drv("cuMemAlloc"))?;
        if n > 0 {
            self.stream.memcpy_htod(host, &mut all.slice_mut(0..n)).map_err(drv("cuMemcpyHtoD"))?;
            for c in 1..copies {
                let (first, mut rest) = all.split_at_mut(n);
                let mut dst = rest.slice_mut((c - 1) * n..c * n);
                self.stream.memcpy_dtod(&first, &mut dst).map_err(drv("cuMemcpyDtoD"))?;
            }
        }
        Ok(self.wrap(all))
    }

    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        buf: &DeviceBuf<T>,
    ) -> Result<Vec<T>, GpuError> {
        self.stream.clone_dtoh(&buf.slice).map_err(drv("cuMemcpyDtoH"))
    }

    /// Fill a buffer with zeros (asynchronously, on the stream).
    pub fn zero<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        buf: &mut DeviceBuf<T>,
    ) -> Result<(), GpuError> {
        self.stream.memset_zeros(&mut buf.slice).map_err(drv("cuMemsetD8Async"))
    }

    /// Copy `src` into the start of `dst` (device to device, on the stream).
    pub fn copy<T: DeviceRepr>(
        &self,
        src: &DeviceBuf<T>,
        dst: &mut DeviceBuf<T>,
    ) -> Result<(), GpuError> {
        let n = src.len().min(dst.len());
        self.stream
            .memcpy_dtod(&src.slice.slice(0..n), &mut dst.slice.slice_mut(0..n))
            .map_err(drv("cuMemcpyDtoD"))
    }

    /// Fill every byte of a buffer with `byte` (asynchronously, on the stream): 0xFF makes every
    /// bf16 a NaN, the poison that shows an output element a kernel failed to write.
    pub fn fill_bytes<T: DeviceRepr>(
        &self,
        buf: &mut DeviceBuf<T>,
        byte: u8,
    ) -> Result<(), GpuError> {
        self.fill_range(buf, 0..buf.bytes(), byte)
    }

    /// Fill bytes `range` of a buffer with `byte` (asynchronously, on the stream). It writes
    /// through a shared reference, as a kernel launch on the buffer's address does.
    pub fn fill_range<T: DeviceRepr>(
        &self,
        buf: &DeviceBuf<T>,
        range: std::ops::Range<usize>,
        byte: u8,
    ) -> Result<(), GpuError> {
        if range.start > range.end || range.end > buf.bytes() {
            return Err(GpuError::Kernel {
                kernel: "cuMemsetD8Async".into(),
                message: format!("bytes {range:?} outside a buffer of {} bytes", buf.bytes()),
            });
        }
        if range.is_empty() {
            return Ok(());
        }
        // SAFETY: the range lies inside the live allocation owned by `buf` (checked above); the
        // stream orders the write before any later use of the buffer on it.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                buf.ptr + range.start as u64,
                byte,
                range.len(),
                self.stream.cu_stream(),
            )
        }
        .map_err(drv("cuMemsetD8Async"))
    }

    fn wrap<T>(&self, slice: CudaSlice<T>) -> DeviceBuf<T> {
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(&self.stream);
            ptr
        };
        DeviceBuf { slice, ptr }
    }

    /// Load a kernel image (CUBIN bytes and symbol name) and opt it into `smem_bytes` of dynamic
    /// shared memory.
    pub fn load<K: KernelImage + ?Sized>(
        &self,
        k: &K,
        smem_bytes: u32,
    ) -> Result<Kernel, GpuError> {
        let name = k.kernel_name();
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(k.cubin().to_vec()))
            .map_err(|e| GpuError::Kernel {
                kernel: name.to_string(),
                message: format!("loading the cubin: {e}"),
            })?;
        let func = module.load_function(name).map_err(|e| GpuError::Kernel {
            kernel: name.to_string(),
            message: format!("symbol not found in its cubin: {e}"),
        })?;
        if smem_bytes > 48 * 1024 {
            if smem_bytes > self.info.max_smem_per_block_optin {
                return Err(GpuError::Kernel {
                    kernel: name.to_string(),
                    message: format!(
                        "needs {smem_bytes} B of shared memory, the device allows {}",
                        self.info.max_smem_per_block_optin
                    ),
                });
            }
            func.set_attribute(
                FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem_bytes as i32,
            )
            .map_err(drv("cuFuncSetAttribute"))?;
        }
        Ok(Kernel { name: name.to_string(), func })
    }

    /// Launch `kernel` with one by-value parameter block.
    ///
    /// # Safety
    /// `params` must describe device buffers that are large enough for the launch `dims`
    /// (the GEMM contract in templates/common/params.cuh) and live until the work completes.
    pub unsafe fn launch<P: DeviceRepr>(
        &self,
        kernel: &Kernel,
        dims: LaunchDims,
        params: &P,
    ) -> Result<(), GpuError> {
        let cfg = launch_config(dims);
        let mut b = self.stream.launch_builder(&kernel.func);
        b.arg(params);
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(drv("cuLaunchKernel"))
    }

    /// Launch a kernel whose arguments are all 64-bit (pointers and sizes).
    ///
    /// # Safety
    /// The kernel's parameter list must be exactly `args.len()` 64-bit values, and any pointers
    /// among them must be valid for what the kernel does with them until the work completes.
    pub unsafe fn launch_u64s(
        &self,
        kernel: &Kernel,
        dims: LaunchDims,
        args: &[u64],
    ) -> Result<(), GpuError> {
        let cfg = launch_config(dims);
        let mut b = self.stream.launch_builder(&kernel.func);
        for a in args {
            b.arg(a);
        }
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(drv("cuLaunchKernel"))
    }

    /// Wait for all work on the stream; surfaces asynchronous launch errors (illegal address...).
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream.synchronize().map_err(drv("cuStreamSynchronize"))
    }

    /// Capture the launches `body` makes into a CUDA graph.
    pub fn capture(&self, body: impl FnOnce() -> Result<(), GpuError>) -> Result<Graph, GpuError> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("cuStreamBeginCapture"))?;
        let captured = body();
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(drv("cuStreamEndCapture"))?;
        captured?;
        let graph = graph.ok_or(GpuError::Kernel {
            kernel: "graph".into(),
            message: "stream capture produced no graph".into(),
        })?;
        graph.upload().map_err(drv("cuGraphUpload"))?;
        Ok(Graph { graph })
    }

    /// Device milliseconds between two events recorded around `body`'s work.
    pub fn time_ms(&self, body: impl FnOnce() -> Result<(), GpuError>) -> Result<f32, GpuError> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.stream.record_event(flags).map_err(drv("cuEventRecord"))?;
        body()?;
        let end = self.stream.record_event(flags).map_err(drv("cuEventRecord"))?;
        end.synchronize().map_err(drv("cuEventSynchronize"))?;
        start.elapsed_ms(&end).map_err(drv("cuEventElapsedTime"))
    }
}

/// An instantiated CUDA graph bound to the Gpu's stream.
pub struct Graph {
    graph: cudarc::driver::CudaGraph,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Graph")
    }
}

impl Graph {
    pub fn launch(&self) -> Result<(), GpuError> {
        self.graph.launch().map_err(drv("cuGraphLaunch"))
    }
}

/// cudarc's launch configuration of our launch dimensions.
/// A loadable kernel image: the CUBIN bytes and the kernel's symbol name. `gpu` takes bytes;
/// whoever compiled them (`compile::CompiledKernel`) implements this.
pub trait KernelImage {
    fn kernel_name(&self) -> &str;
    fn cubin(&self) -> &[u8];
}

impl<T: KernelImage + ?Sized> KernelImage for std::sync::Arc<T> {
    fn kernel_name(&self) -> &str {
        (**self).kernel_name()
    }
    fn cubin(&self) -> &[u8] {
        (**self).cubin()
    }
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem_bytes: u32,
}

fn launch_config(dims: LaunchDims) -> LaunchConfig {
    LaunchConfig { grid_dim: dims.grid, block_dim: dims.block, shared_mem_bytes: dims.smem_bytes }
}
