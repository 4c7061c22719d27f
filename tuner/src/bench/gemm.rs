//! GEMM candidates on the GPU: random NVFP4 problems with their CPU reference, operand copies
//! rotated past the L2, verification of every candidate before it is timed, and timing.
//!
//! Verification bound (asserted element by element): a correct kernel differs from the f32
//! reference only by the f32 summation order and the final bf16 rounding, so
//! `|y - ref| <= 2^-8 |ref| + 1.01 * 2 K 2^-24 * alpha * ||a_i|| ||w_j||`
//! (half a bf16 ulp, plus twice the worst-case f32 summation error with the sum of |a_k w_k|
//! bounded by Cauchy-Schwarz). Layout or scale mistakes produce errors of the order of |ref|.

use super::policy::{rotation_copies, TimingPolicy};
use super::timer::{measure, LaunchFn, Samples};
use crate::compile::CompiledKernel;
use crate::format::{
    quantize_activations, quantize_weight, reference_gemm, GemmA, Nvfp4Matrix, ReferenceOutput,
};
use crate::gpu::{DeviceBuf, GemmParams, Gpu, GpuError, Kernel};
use crate::problem::{AType, GemmProblem};
use crate::template::GemmConfig;
use half::bf16;
use rand::{Rng, SeedableRng};

/// A problem instance on the host: operands in the device layout and the CPU reference.
#[derive(Debug, Clone)]
pub struct HostProblem {
    pub problem: GemmProblem,
    pub w: Nvfp4Matrix,
    pub a_bf16: Vec<bf16>,
    /// W4A4 only: the activations quantized with a static input scale.
    pub a_fp4: Option<Nvfp4Matrix>,
    pub reference: ReferenceOutput,
    /// Per element tolerance (see the module docs).
    pub tolerance: Vec<f32>,
}

impl HostProblem {
    /// Random weights ~ U(-1, 1) with a few outliers per row (so block scales vary), random
    /// activations ~ U(-2, 2); deterministic in `seed`.
    pub fn random(problem: GemmProblem, seed: u64) -> Result<Self, crate::format::FormatError> {
        let (m, n, k) = (problem.m as usize, problem.n as usize, problem.k as usize);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut wf: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        for _ in 0..(n * k / 64).max(1) {
            let i = rng.random_range(0..n * k);
            wf[i] *= rng.random_range(4.0f32..64.0);
        }
        let w = quantize_weight(&wf, n, k)?;
        let a_bf16: Vec<bf16> =
            (0..m * k).map(|_| bf16::from_f32(rng.random_range(-2.0f32..2.0))).collect();
        let a_fp4 = match problem.a_type {
            AType::Nvfp4 => {
                let amax = a_bf16.iter().fold(0f32, |acc, v| acc.max(v.to_f32().abs()));
                Some(quantize_activations(&a_bf16, m, k, amax / (6.0 * 448.0))?)
            }
            AType::Bf16 => None,
        };
        let reference = match &a_fp4 {
            Some(a) => reference_gemm(GemmA::Nvfp4(a), &w)?,
            None => reference_gemm(GemmA::Bf16 { data: &a_bf16, rows: m, cols: k }, &w)?,
        };
        let norms = |v: &[f32], rows: usize| -> Vec<f64> {
            (0..rows)
                .map(|r| {
                    v[r * k..(r + 1) * k].iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt()
                })
                .collect()
        };
        let wn = norms(&w.dequantize_block_scaled(), n);
        let an = match &a_fp4 {
            Some(a) => norms(&a.dequantize_block_scaled(), m),
            None => norms(&a_bf16.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), m),
        };
        let sum_err = 1.01 * 2.0 * k as f64 * 2f64.powi(-24) * reference.alpha as f64;
        let tolerance = (0..m * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                (2f64.powi(-8) * reference.y_f32[i].abs() as f64 + sum_err * an[r] * wn[c] + 1e-30)
                    as f32
            })
            .collect();
        Ok(Self { problem, w, a_bf16, a_fp4, reference, tolerance })
    }

    /// Compare a GPU result (bf16 bits, `[M, N]`) with the reference; `Err` names the worst element.
    pub fn check(&self, y: &[u16]) -> Result<(), String> {
        let n = self.problem.n as usize;
        let mut worst: Option<(usize, f32, f32)> = None;
        let mut bad = 0usize;
        for (i, (&bits, (&r, &tol))) in
            y.iter().zip(self.reference.y_f32.iter().zip(&self.tolerance)).enumerate()
        {
            let v = bf16::from_bits(bits).to_f32();
            let err = (v - r).abs();
            // NaN errors count as failures.
            if err.is_nan() || err > tol {
                bad += 1;
                if worst.is_none_or(|(_, e, t)| err / tol > e / t || err.is_nan()) {
                    worst = Some((i, err, tol));
                }
            }
        }
        match worst {
            None => Ok(()),
            Some((i, err, tol)) => Err(format!(
                "wrong answer: {bad} of {} elements outside the bound; worst at (m={}, n={}): got {}, \
                 expected {} (|err| {err:.3e} > tol {tol:.3e})",
                y.len(),
                i / n,
                i % n,
                bf16::from_bits(y[i]).to_f32(),
                self.reference.y_f32[i]
            )),
        }
    }
}

/// Device copies of one problem's operands, rotated across launches to keep the L2 cold.
#[derive(Debug)]
pub struct DeviceProblem {
    pub problem: GemmProblem,
    pub alpha: f32,
    pub copies: usize,
    w: DeviceBuf<u8>,
    w_sf: DeviceBuf<u8>,
    a: DeviceBuf<u8>,
    a_sf: DeviceBuf<u8>,
    strides: [u64; 4],
    pub y: DeviceBuf<u16>,
    workspace: DeviceBuf<f32>,
    counters: DeviceBuf<u32>,
}

impl DeviceProblem {
    /// Upload `copies` (>= rotation requirement) copies of the operands, and workspace for the
    /// largest split-K among `configs`.
    pub fn upload(
        gpu: &Gpu,
        host: &HostProblem,
        policy: &TimingPolicy,
        configs: &[GemmConfig],
    ) -> Result<Self, GpuError> {
        let p = host.problem;
        let w_codes = &host.w.codes;
        let w_sf = host.w.scales_swizzled();
        let (a_bytes, a_sf): (Vec<u8>, Vec<u8>) = match &host.a_fp4 {
            Some(a) => (a.codes.clone(), a.scales_swizzled()),
            None => (
                host.a_bf16.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
                vec![0u8; 16],
            ),
        };
        let per_copy = (w_codes.len() + w_sf.len() + a_bytes.len() + a_sf.len()) as u64;
        let copies = rotation_copies(per_copy, gpu.info().l2_bytes, policy.l2_multiple);
        let rep = |v: &[u8]| -> Vec<u8> {
            let mut out = Vec::with_capacity(v.len() * copies);
            for _ in 0..copies {
                out.extend_from_slice(v);
            }
            out
        };
        let ws = configs.iter().map(|c| c.workspace_floats(&p)).max().unwrap_or(0);
        let ctr = configs.iter().map(|c| c.counter_words(&p)).max().unwrap_or(0);
        Ok(Self {
            problem: p,
            alpha: host.reference.alpha,
            copies,
            w: gpu.upload(&rep(w_codes))?,
            w_sf: gpu.upload(&rep(&w_sf))?,
            a: gpu.upload(&rep(&a_bytes))?,
            a_sf: gpu.upload(&rep(&a_sf))?,
            strides: [
                w_codes.len() as u64,
                w_sf.len() as u64,
                a_bytes.len() as u64,
                a_sf.len() as u64,
            ],
            y: gpu.alloc_zeros::<u16>((p.m * p.n) as usize)?,
            workspace: gpu.alloc_zeros::<f32>(ws.max(1))?,
            counters: gpu.alloc_zeros::<u32>(ctr.max(1))?,
        })
    }

    /// The parameter block for operand copy `c`.
    pub fn params(&self, c: usize) -> GemmParams {
        let c = (c % self.copies) as u64;
        GemmParams {
            a: self.a.ptr() + c * self.strides[2],
            a_sf: self.a_sf.ptr() + c * self.strides[3],
            w: self.w.ptr() + c * self.strides[0],
            w_sf: self.w_sf.ptr() + c * self.strides[1],
            y: self.y.ptr(),
            workspace: self.workspace.ptr(),
            counters: self.counters.ptr(),
            m: self.problem.m as i32,
            n: self.problem.n as i32,
            k: self.problem.k as i32,
            alpha: self.alpha,
        }
    }
}

/// A candidate ready to run: configuration plus its loaded kernel.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub config: GemmConfig,
    pub kernel: Kernel,
}

impl Candidate {
    pub fn load(
        gpu: &Gpu,
        config: GemmConfig,
        compiled: &CompiledKernel,
    ) -> Result<Self, GpuError> {
        Ok(Self { config, kernel: gpu.load(compiled, config.smem_bytes())? })
    }

    /// Launch on operand copy `c` of `dp`.
    pub fn launch(&self, gpu: &Gpu, dp: &DeviceProblem, c: usize) -> Result<(), GpuError> {
        let dims = self.config.launch_dims(&dp.problem);
        let params = dp.params(c);
        // SAFETY: `dp` was uploaded with workspace and counters sized for this config (its
        // `upload` took the config list), operand buffers match the problem, and `dp` outlives
        // the launch (callers synchronize before dropping it).
        unsafe { gpu.launch(&self.kernel, dims, &params) }
    }
}

/// Run `cand` once on copy 0 with a poisoned output and compare with the reference.
pub fn verify(
    gpu: &Gpu,
    host: &HostProblem,
    dp: &mut DeviceProblem,
    cand: &Candidate,
) -> Result<Result<(), String>, GpuError> {
    if let Err(e) = cand.config.check_problem(&dp.problem) {
        return Ok(Err(e.to_string()));
    }
    // 0xFFFF is a bf16 NaN: any output the kernel fails to write is caught.
    let poison = vec![0xFFFFu16; dp.y.len()];
    dp.y = gpu.upload(&poison)?;
    cand.launch(gpu, dp, 0)?;
    gpu.synchronize()?;
    let y = gpu.download(&dp.y)?;
    // Run twice more: split-K counters must have been reset and results must be deterministic.
    cand.launch(gpu, dp, 0)?;
    gpu.synchronize()?;
    let y2 = gpu.download(&dp.y)?;
    if y != y2 {
        return Ok(Err("non-deterministic: two runs on the same operands differ".into()));
    }
    Ok(host.check(&y))
}

/// Time verified candidates on `dp` (interleaved).
pub fn time_candidates(
    gpu: &Gpu,
    policy: &TimingPolicy,
    dp: &DeviceProblem,
    cands: &[&Candidate],
) -> Vec<Result<Samples, GpuError>> {
    let fs: Vec<LaunchFn<'_>> = cands
        .iter()
        .map(|c| Box::new(move |i: usize| c.launch(gpu, dp, i)) as LaunchFn<'_>)
        .collect();
    measure(gpu, policy, fs)
}
