//! The dequantize-then-cuBLAS path, measured next to the fused kernels: W (and NVFP4 A) expanded
//! to bf16 by our kernel (`templates/bench/dequant.cuh`), then cuBLAS BF16 with alpha. What
//! serving stacks do for large token counts (vLLM runs AWQ this way from 256 tokens); it tells
//! where a fused mma.sync kernel stops paying off. Not (yet) a dispatch-table entry: the runtime
//! launches fused kernels only.

use super::gemm::{DeviceProblem, HostProblem};
use super::timer::{measure, Samples};
use super::TimingPolicy;
use crate::compile::{CompileError, Compiler};
use crate::gpu::blas::CublasBf16;
use crate::gpu::{DeviceBuf, Gpu, GpuError, Kernel};
use crate::problem::{AType, GemmProblem};
use crate::template::{Arch, KernelSource, LaunchDims};
use half::bf16;

/// The report name of the path.
pub const NAME: &str = "dequant_cublas_bf16";

/// Errors while setting the path up.
#[derive(Debug, thiserror::Error)]
pub enum CompositeError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error("{0}")]
    Source(String),
    #[error("{0}: NVFP4 needs K to be a multiple of 16 (one scale per 16 elements)")]
    Unsupported(GemmProblem),
}

/// The dequantization kernel and cuBLAS, set up once per benchmark run.
#[derive(Debug)]
pub struct Composite<'g> {
    gpu: &'g Gpu,
    dequant: Kernel,
    blas: CublasBf16,
}

/// The bf16 scratch operands of one problem.
#[derive(Debug)]
pub struct Scratch {
    problem: GemmProblem,
    /// W as bf16 [N, K].
    w16: DeviceBuf<u16>,
    /// NVFP4 activations as bf16 [M, K] (W4A4 only).
    a16: Option<DeviceBuf<u16>>,
}

impl<'g> Composite<'g> {
    pub fn new(gpu: &'g Gpu, compiler: &Compiler) -> Result<Self, CompositeError> {
        let (major, minor) = gpu.info().compute_capability;
        let arch = Arch::for_compute_capability(major, minor).unwrap_or(Arch::Sm90a);
        let src = KernelSource::from_unit(
            "fp4tune_dequant_bf16".to_string(),
            arch,
            "#include \"bench/dequant.cuh\"\n",
        )
        .map_err(CompositeError::Source)?;
        let compiled = compiler.compile(&src)?;
        Ok(Self { gpu, dequant: gpu.load(&compiled, 0)?, blas: CublasBf16::new(gpu)? })
    }

    /// Scratch operands for `problem`.
    pub fn scratch(&self, problem: GemmProblem) -> Result<Scratch, CompositeError> {
        if problem.k % 16 != 0 {
            return Err(CompositeError::Unsupported(problem));
        }
        let (m, n, k) = (problem.m as usize, problem.n as usize, problem.k as usize);
        let a16 = match problem.a_type {
            AType::Nvfp4 => Some(self.gpu.alloc_zeros::<u16>(m * k)?),
            AType::Bf16 => None,
        };
        Ok(Scratch { problem, w16: self.gpu.alloc_zeros::<u16>(n * k)?, a16 })
    }

    /// Expand `rows` x `k` NVFP4 codes + swizzled scales at `codes` / `sf` into `out` (bf16).
    ///
    /// # Safety
    /// `codes` must hold rows * k / 2 bytes, `sf` the swizzled scales of rows (padded to 128) x
    /// k / 16 (padded to 4), `out` rows * k bf16; k a multiple of 16 (`scratch` checks it).
    unsafe fn expand(
        &self,
        k: u64,
        codes: u64,
        sf: u64,
        out: u64,
        rows: u64,
    ) -> Result<(), GpuError> {
        let threads = rows * (k / 16);
        let blocks = u32::try_from(threads.div_ceil(256)).map_err(|_| GpuError::Kernel {
            kernel: "fp4tune_dequant_bf16".into(),
            message: format!("{threads} scale blocks exceed one grid"),
        })?;
        let dims = LaunchDims { grid: (blocks, 1, 1), block: (256, 1, 1), smem_bytes: 0 };
        // SAFETY: the kernel takes (codes, sf, out, rows, k), all 64-bit; sizes per the contract.
        unsafe { self.gpu.launch_u64s(&self.dequant, dims, &[codes, sf, out, rows, k]) }
    }

    /// Dequantize operand copy `c` of `dp` into `s` and run cuBLAS into `dp.y`.
    pub fn launch(&self, s: &Scratch, dp: &DeviceProblem, c: usize) -> Result<(), GpuError> {
        let p = dp.params(c);
        let (m, n, k) = (s.problem.m, s.problem.n, s.problem.k);
        // SAFETY: `dp` holds the operands of `s.problem` in the layout `expand` expects and the
        // scratch buffers of `s` are sized for it.
        unsafe {
            self.expand(k as u64, p.w, p.w_sf, s.w16.ptr(), n as u64)?;
            let a = match &s.a16 {
                Some(a16) => {
                    self.expand(k as u64, p.a, p.a_sf, a16.ptr(), m as u64)?;
                    a16.ptr()
                }
                None => p.a,
            };
            self.blas.gemm(m as i32, n as i32, k as i32, p.alpha, a, s.w16.ptr(), p.y)
        }
    }

    /// Run once on copy 0: the expanded weights must equal the CPU's dequantization bit for bit,
    /// and the output must pass the reference check of every fused kernel.
    pub fn verify(
        &self,
        s: &Scratch,
        host: &HostProblem,
        dp: &mut DeviceProblem,
    ) -> Result<Result<(), String>, GpuError> {
        dp.y = self.gpu.upload(&vec![0xFFFFu16; dp.y.len()])?;
        self.launch(s, dp, 0)?;
        self.gpu.synchronize()?;
        let w16 = self.gpu.download(&s.w16)?;
        let want = host.w.dequantize_block_scaled();
        if let Some(i) =
            w16.iter().zip(&want).position(|(g, w)| bf16::from_bits(*g) != bf16::from_f32(*w))
        {
            let k = s.problem.k as usize;
            return Ok(Err(format!(
                "dequantized W differs at (n={}, k={}): {} vs {}",
                i / k,
                i % k,
                bf16::from_bits(w16[i]),
                want[i]
            )));
        }
        Ok(host.check(&self.gpu.download(&dp.y)?))
    }

    /// Time the path on `dp` under `policy` (the same rotation as the fused kernels).
    pub fn time(
        &self,
        s: &Scratch,
        policy: &TimingPolicy,
        dp: &DeviceProblem,
    ) -> Result<Samples, GpuError> {
        measure(self.gpu, policy, vec![Box::new(move |i| self.launch(s, dp, i))])
            .pop()
            .expect("one candidate")
    }
}

#[cfg(test)]
mod tests {
    use crate::compile::Compiler;
    use crate::template::{Arch, KernelSource};

    /// The dequantization kernel compiles with NVRTC for both families' archs, without spills.
    #[test]
    fn dequant_kernel_compiles() {
        let dir = tempfile::tempdir().unwrap();
        let compiler =
            Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
        for arch in [Arch::Sm90a, Arch::Sm120a] {
            let src = KernelSource::from_unit(
                "fp4tune_dequant_bf16".into(),
                arch,
                "#include \"bench/dequant.cuh\"\n",
            )
            .unwrap();
            let k = compiler.compile(&src).unwrap_or_else(|e| panic!("{arch:?}: {e}"));
            let stats = k.stats.unwrap_or_else(|| panic!("no ptxas statistics"));
            assert!(!stats.spills(), "{stats:?}");
        }
    }
}

#[cfg(test)]
mod gpu_tests {
    use super::*;

    /// Both activation types, awkward and GLM-5 shapes: W expanded bit for bit, Y within the
    /// reference bound.
    #[test]
    #[cfg_attr(
        not(feature = "gpu"),
        ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
    )]
    fn dequant_then_cublas_matches_the_reference() {
        let gpu = Gpu::open(0).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let compiler = Compiler::new(Some(dir.path().to_path_buf())).unwrap();
        let c = Composite::new(&gpu, &compiler).unwrap();
        for (m, n, k, a) in
            [(7, 48, 256, AType::Bf16), (3, 512, 6144, AType::Bf16), (33, 200, 512, AType::Nvfp4)]
        {
            let p = GemmProblem::new(m, n, k, a);
            let host = HostProblem::random(p, 7).unwrap();
            let mut dp = DeviceProblem::upload(&gpu, &host, &TimingPolicy::default(), &[]).unwrap();
            let s = c.scratch(p).unwrap();
            c.verify(&s, &host, &mut dp).unwrap().unwrap_or_else(|e| panic!("{p}: {e}"));
        }
    }
}
