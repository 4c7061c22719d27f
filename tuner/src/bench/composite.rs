//! The dequantize-then-cuBLAS method measured next to the fused kernels: W (and NVFP4 A) expanded
//! to bf16 by our kernel, then cuBLAS BF16 with alpha (`runtime::composite`, the same code the
//! runtime launches for table entries with `Method::DequantCublasBf16`). What serving stacks do
//! for large token counts (vLLM runs AWQ this way from 256 tokens); the tuner records it per key
//! and the table takes it where it beats every fused kernel.

use super::gemm::{DeviceProblem, HostProblem};
use super::timer::{measure, Samples};
use super::TimingPolicy;
use crate::compile::Compiler;
use crate::gpu::{DeviceBuf, Gpu, GpuError};
use crate::problem::GemmProblem;
pub use crate::runtime::composite::CompositeError;
use crate::runtime::composite::{workspace_elems, DequantGemm, Operands};
use half::bf16;

/// The report name of the path.
pub const NAME: &str = "dequant_cublas_bf16";

/// The dequantization kernel and cuBLAS, set up once per benchmark run or tuning worker.
#[derive(Debug)]
pub struct Composite<'g> {
    gpu: &'g Gpu,
    method: DequantGemm,
}

/// The bf16 workspace of one problem.
#[derive(Debug)]
pub struct Scratch {
    problem: GemmProblem,
    /// W as bf16 [N, K], then (W4A4) A as bf16 [M, K].
    workspace: DeviceBuf<u16>,
}

impl<'g> Composite<'g> {
    pub fn new(gpu: &'g Gpu, compiler: &Compiler) -> Result<Self, CompositeError> {
        Ok(Self { gpu, method: DequantGemm::new(gpu, compiler)? })
    }

    /// The workspace for `problem`.
    pub fn scratch(&self, problem: GemmProblem) -> Result<Scratch, CompositeError> {
        if problem.k % 16 != 0 {
            return Err(CompositeError::Unsupported(problem));
        }
        Ok(Scratch { problem, workspace: self.gpu.alloc_zeros::<u16>(workspace_elems(&problem))? })
    }

    /// Dequantize operand copy `c` of `dp` into `s` and run cuBLAS into `dp.y`, on the Gpu's stream.
    pub fn launch(&self, s: &Scratch, dp: &DeviceProblem, c: usize) -> Result<(), GpuError> {
        let p = dp.params(c);
        let ops = Operands { a: p.a, a_sf: p.a_sf, w: p.w, w_sf: p.w_sf, y: p.y, alpha: p.alpha };
        // SAFETY: `dp` holds the operands of `s.problem` in the data layout, the workspace is
        // sized for it by `scratch`, and both live on this Gpu's own stream, which orders the
        // launches of one benchmark.
        unsafe {
            self.method.launch(self.gpu, &s.problem, &ops, s.workspace.ptr(), self.gpu.own_stream())
        }
        .map_err(|e| match e {
            CompositeError::Gpu(g) => g,
            other => GpuError::Kernel { kernel: NAME.into(), message: other.to_string() },
        })
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
        let n_k = s.problem.n as usize * s.problem.k as usize;
        let w16 = self.gpu.download(&s.workspace)?;
        let w16 = &w16[..n_k];
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
        measure(self.gpu, policy, dp.copies, vec![Box::new(move |i| self.launch(s, dp, i))])
            .pop()
            .expect("one candidate")
    }
}

#[cfg(test)]
mod gpu_tests {
    use super::*;
    use crate::problem::AType;

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
