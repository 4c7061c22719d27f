//! The dequantize-then-cuBLAS method (`table::Method::DequantCublasBf16`): fp4tune's kernel
//! (`templates/composite/dequant.cuh`) expands NVFP4 W (and NVFP4 A) into a bf16 workspace, then
//! cuBLAS BF16 computes Y with alpha, both on the caller's stream. Shared by the runtime (table
//! entries that chose it) and the benchmark and tuner (which measure it next to fused kernels).

use crate::compile::{CompileError, Compiler};
use crate::gpu::blas::CublasBf16;
use crate::gpu::raw::RawStream;
use crate::gpu::{Gpu, GpuError, Kernel};
use crate::problem::{AType, GemmProblem};
use crate::template::{Arch, KernelSource, LaunchDims};
use std::sync::Mutex;

/// The expansion kernel's name.
pub const KERNEL: &str = "fp4tune_dequant_bf16";
const THREADS: u32 = 256;

/// Errors setting the method up.
#[derive(Debug, thiserror::Error)]
pub enum CompositeError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error("the dequantization kernel source: {0}")]
    Source(String),
    #[error("{0}: the composite path needs K to be a multiple of 16 (one scale per 16 elements)")]
    Unsupported(GemmProblem),
}

/// The instantiation unit of the expansion kernel for `arch`.
pub fn source(arch: Arch) -> Result<KernelSource, String> {
    KernelSource::from_unit(KERNEL.to_string(), arch, "#include \"composite/dequant.cuh\"\n")
}

/// bf16 elements of workspace one GEMM needs: W (N x K), plus A (M x K) for NVFP4 activations.
pub fn workspace_elems(p: &GemmProblem) -> usize {
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    n * k + if p.a_type == AType::Nvfp4 { m * k } else { 0 }
}

/// Device addresses of one GEMM's operands, in the layout of ARCHITECTURE.md "Data layout".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Operands {
    pub a: u64,
    pub a_sf: u64,
    pub w: u64,
    pub w_sf: u64,
    pub y: u64,
    pub alpha: f32,
}

/// The expansion kernel and a cuBLAS handle (its stream is set per launch, under the lock).
#[derive(Debug)]
pub struct DequantGemm {
    dequant: Kernel,
    blas: Mutex<CublasBf16>,
}

impl DequantGemm {
    /// Compile (or take from `compiler`'s cache) the kernel for `gpu`'s architecture, load it,
    /// and create the cuBLAS handle.
    pub fn new(gpu: &Gpu, compiler: &Compiler) -> Result<Self, CompositeError> {
        let (major, minor) = gpu.info().compute_capability;
        let arch = Arch::for_compute_capability(major, minor).unwrap_or(Arch::Sm90a);
        let compiled = compiler.compile(&source(arch).map_err(CompositeError::Source)?)?;
        Ok(Self { dequant: gpu.load(&compiled, 0)?, blas: Mutex::new(CublasBf16::new(gpu)?) })
    }

    /// Expand `rows` x `k` NVFP4 codes + swizzled scales into bf16 at `out`, on `stream`.
    ///
    /// # Safety
    /// `codes` must hold rows * k / 2 bytes, `sf` the swizzled scales of rows (padded to 128) x
    /// k / 16 (padded to 4), `out` rows * k bf16, all alive until the work on `stream` completes;
    /// k a multiple of 16; `stream` 0 or a live stream of `gpu`'s primary context.
    #[allow(clippy::too_many_arguments)]
    unsafe fn expand(
        &self,
        gpu: &Gpu,
        codes: u64,
        sf: u64,
        out: u64,
        rows: u64,
        k: u64,
        stream: RawStream,
    ) -> Result<(), GpuError> {
        let threads = rows * (k / 8);
        let blocks =
            u32::try_from(threads.div_ceil(THREADS as u64)).map_err(|_| GpuError::Kernel {
                kernel: KERNEL.into(),
                message: format!("{threads} threads exceed one grid"),
            })?;
        let dims = LaunchDims { grid: (blocks, 1, 1), block: (THREADS, 1, 1), smem_bytes: 0 };
        // SAFETY: the kernel takes (codes, sf, out, rows, k), all 64-bit; sizes and stream per the
        // contract above.
        unsafe {
            gpu.launch_u64s_on_stream(&self.dequant, dims, &[codes, sf, out, rows, k], stream)
        }
    }

    /// Y = alpha * deq(A) * deq(W)^T for `p`: W expanded into `workspace`, A too when it is NVFP4
    /// (after W), then cuBLAS BF16 with cuBLAS's default workspace; everything on `stream`.
    ///
    /// # Safety
    /// The operands must be device buffers of `gpu`'s primary context in the data layout for `p`,
    /// `workspace` must hold [`workspace_elems`]`(p)` bf16, all alive until the work on `stream`
    /// completes, and nothing else may use `workspace` until then; `stream` must be 0 or a live
    /// stream of that context.
    pub unsafe fn launch(
        &self,
        gpu: &Gpu,
        p: &GemmProblem,
        ops: &Operands,
        workspace: u64,
        stream: RawStream,
    ) -> Result<(), CompositeError> {
        // SAFETY: forwarded contract.
        unsafe { self.launch_with(gpu, p, ops, workspace, None, stream) }
    }

    /// [`DequantGemm::launch`] with `blas_workspace` (device address, bytes) as cuBLAS's
    /// workspace instead of its default one: scratch of a stream's own (the runtime's
    /// per-stream workspaces), and no allocation by cuBLAS while the stream is captured.
    ///
    /// # Safety
    /// As [`DequantGemm::launch`]; `blas_workspace`, when given, must be a 256-byte aligned device
    /// buffer of that many bytes, alive until the work on `stream` completes and used by nothing
    /// else until then.
    pub unsafe fn launch_with(
        &self,
        gpu: &Gpu,
        p: &GemmProblem,
        ops: &Operands,
        workspace: u64,
        blas_workspace: Option<(u64, usize)>,
        stream: RawStream,
    ) -> Result<(), CompositeError> {
        if p.k % 16 != 0 {
            return Err(CompositeError::Unsupported(*p));
        }
        let (m, n, k) = (p.m as u64, p.n as u64, p.k as u64);
        let w16 = workspace;
        // SAFETY: forwarded contract: W's buffers for (n, k), the workspace's first n*k bf16.
        unsafe { self.expand(gpu, ops.w, ops.w_sf, w16, n, k, stream)? };
        let a = match p.a_type {
            AType::Nvfp4 => {
                let a16 = workspace + n * k * 2;
                // SAFETY: A's buffers for (m, k), the next m*k bf16 of the workspace.
                unsafe { self.expand(gpu, ops.a, ops.a_sf, a16, m, k, stream)? };
                a16
            }
            AType::Bf16 => ops.a,
        };
        let blas = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: stream per the contract; the lock keeps set_stream, set_workspace (set_stream
        // restores cuBLAS's default workspace) and gemm together; the bf16 operands hold m*k, n*k
        // and Y m*n elements and the cuBLAS workspace its bytes, per the contract.
        unsafe {
            blas.set_stream(stream)?;
            if let Some((ptr, bytes)) = blas_workspace {
                blas.set_workspace(ptr, bytes)?;
            }
            blas.gemm(p.m as i32, p.n as i32, p.k as i32, ops.alpha, a, w16, ops.y)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Compiler;

    /// The expansion kernel compiles with NVRTC for both families' architectures, without spills.
    #[test]
    fn dequant_kernel_compiles() {
        let dir = tempfile::tempdir().unwrap();
        let compiler =
            Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
        for arch in [Arch::Sm90a, Arch::Sm120a] {
            let k = compiler
                .compile(&source(arch).unwrap())
                .unwrap_or_else(|e| panic!("{arch:?}: {e}"));
            let stats = k.stats.unwrap_or_else(|| {
                panic!(
                    "{arch:?}: no ptxas statistics in the NVRTC log ({:?}):\n{}",
                    k.origin, k.log
                )
            });
            assert!(!stats.spills(), "{stats:?}");
        }
    }

    #[test]
    fn workspace_holds_w_and_nvfp4_activations() {
        assert_eq!(workspace_elems(&GemmProblem::new(8, 512, 6144, AType::Bf16)), 512 * 6144);
        assert_eq!(
            workspace_elems(&GemmProblem::new(8, 512, 6144, AType::Nvfp4)),
            512 * 6144 + 8 * 6144
        );
    }
}
