//! Physical floors measured in the same run as the kernels: launch floor, read bandwidth, and the
//! cold read floor of a given byte count (the best any kernel reading those bytes once can do).

use super::policy::{rotation_copies, TimingPolicy};
use super::stats::Summary;
use super::timer::{measure, LaunchFn};
use crate::compile::Compiler;
use crate::gpu::{DeviceBuf, Gpu, GpuError, Kernel};
use crate::template::{KernelSource, LaunchDims};
use serde::{Deserialize, Serialize};

/// Errors while measuring floors.
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Compile(#[from] crate::compile::CompileError),
    #[error("{0}")]
    Other(String),
}

/// One read-floor measurement.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ReadFloor {
    pub bytes: u64,
    /// Best grid (CTAs of 256 threads).
    pub blocks: u32,
    pub time: Summary,
}

impl ReadFloor {
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / (self.time.median * 1e3)
    }
}

/// The floor kernels, loaded once.
#[derive(Debug)]
pub struct Floors<'g> {
    gpu: &'g Gpu,
    empty: Kernel,
    read: Kernel,
    sink: DeviceBuf<u32>,
}

impl<'g> Floors<'g> {
    pub fn new(gpu: &'g Gpu, compiler: &Compiler) -> Result<Self, FloorError> {
        let arch = crate::runtime::family_for(gpu.info())
            .map_err(|e| FloorError::Other(e.to_string()))?
            .arch();
        let load = |name: &str| -> Result<Kernel, FloorError> {
            let src =
                KernelSource::from_unit(name.to_string(), arch, "#include \"bench/floors.cuh\"\n")
                    .map_err(FloorError::Other)?;
            let k = compiler.compile(&src)?;
            Ok(gpu.load(&k, 0)?)
        };
        Ok(Self {
            gpu,
            empty: load("fp4tune_empty_kernel")?,
            read: load("fp4tune_read_floor")?,
            sink: gpu.alloc_zeros::<u32>(4)?,
        })
    }

    /// Per-launch time of an empty kernel with `blocks` CTAs of 256 threads under `policy`.
    pub fn launch_floor(&self, policy: &TimingPolicy, blocks: u32) -> Result<Summary, FloorError> {
        let dims = LaunchDims { grid: (blocks, 1, 1), block: (256, 1, 1), smem_bytes: 0 };
        let sink = self.sink.ptr();
        let f: LaunchFn<'_> = Box::new(move |_| {
            // SAFETY: the empty kernel only reads its pointer argument.
            unsafe { self.gpu.launch_u64s(&self.empty, dims, &[sink]) }
        });
        let s = measure(self.gpu, policy, 1, vec![f]).pop().expect("one candidate")?;
        Ok(Summary::of(&s.us).expect("samples"))
    }

    /// Cold read floor of `bytes`: copies rotated over more than `policy.l2_multiple` x L2,
    /// best of several grids (all grids interleaved).
    pub fn read_floor(&self, policy: &TimingPolicy, bytes: u64) -> Result<ReadFloor, FloorError> {
        let bytes = bytes.div_ceil(16) * 16;
        let copies = rotation_copies(bytes, self.gpu.info().l2_bytes, policy.l2_multiple).min(4096);
        let buf = self.gpu.alloc_zeros::<u8>((bytes as usize) * copies)?;
        let sms = self.gpu.info().sm_count;
        let grids: Vec<u32> = [1u32, 2, 4, 8, 16].iter().map(|m| m * sms).collect();
        let n16 = bytes / 16;
        let sink = self.sink.ptr();
        let base = buf.ptr();
        let fs: Vec<LaunchFn<'_>> = grids
            .iter()
            .map(|&g| {
                let dims = LaunchDims { grid: (g, 1, 1), block: (256, 1, 1), smem_bytes: 0 };
                let read = &self.read;
                let gpu = self.gpu;
                Box::new(move |i: usize| {
                    let src = base + (i % copies) as u64 * bytes;
                    // SAFETY: src..src+bytes lies inside `buf` (copies * bytes long), which
                    // outlives the measurement; the sink holds 4 words.
                    unsafe { gpu.launch_u64s(read, dims, &[src, n16, sink]) }
                }) as LaunchFn<'_>
            })
            .collect();
        let results = measure(self.gpu, policy, copies, fs);
        let mut best: Option<ReadFloor> = None;
        for (g, r) in grids.iter().zip(results) {
            let s = Summary::of(&r?.us).expect("samples");
            if best.is_none_or(|b| s.median < b.time.median) {
                best = Some(ReadFloor { bytes, blocks: *g, time: s });
            }
        }
        drop(buf);
        Ok(best.expect("at least one grid"))
    }

    /// Streaming read bandwidth in GB/s over a buffer of `bytes` (use >= 1 GiB).
    pub fn read_bandwidth(&self, policy: &TimingPolicy, bytes: u64) -> Result<f64, FloorError> {
        Ok(self.read_floor(policy, bytes)?.gbps())
    }
}
