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
    fill_padding_columns, quantize_activations, quantize_weight, reference_gemm, GemmA,
    Nvfp4Matrix, ReferenceOutput, PADDING_SCALE,
};
use crate::gpu::{DeviceBuf, GemmParams, Gpu, GpuError, Kernel};
use crate::problem::{AType, GemmProblem};
use crate::template::GemmConfig;
use crate::template::LaunchDims;
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
        let tolerance = {
            use rayon::prelude::*;
            let y = &reference.y_f32;
            (0..m * n)
                .into_par_iter()
                .map(|i| {
                    let (r, c) = (i / n, i % n);
                    (2f64.powi(-8) * y[i].abs() as f64 + sum_err * an[r] * wn[c] + 1e-30) as f32
                })
                .collect()
        };
        Ok(Self { problem, w, a_bf16, a_fp4, reference, tolerance })
    }

    /// Compare a GPU result (bf16 bits, `[M, N]`) with the reference; `Err` names the worst element.
    pub fn check(&self, y: &[u16]) -> Result<(), String> {
        use rayon::prelude::*;
        let n = self.problem.n as usize;
        if y.len() != self.reference.y_f32.len() {
            return Err(format!(
                "wrong output size: {} elements, expected {}",
                y.len(),
                self.reference.y_f32.len()
            ));
        }
        // Per chunk: elements outside the bound and the worst one (largest err / tol, NaN first).
        // The worse of two failures: a NaN before a number, then the larger err / tol, then the
        // first element (deterministic whatever the chunking).
        let worse = |a: Option<(usize, f32, f32)>, b: Option<(usize, f32, f32)>| match (a, b) {
            (Some(x), Some(y)) => {
                let key = |(i, e, t): (usize, f32, f32)| {
                    (e.is_nan(), if e.is_nan() { 0.0 } else { e / t }, usize::MAX - i)
                };
                let (kx, ky) = (key(x), key(y));
                let x_first = kx.0.cmp(&ky.0).then(kx.1.total_cmp(&ky.1)).then(kx.2.cmp(&ky.2));
                Some(if x_first.is_ge() { x } else { y })
            }
            (x, None) => x,
            (None, y) => y,
        };
        const CHUNK: usize = 1 << 16;
        let (bad, worst) = y
            .par_chunks(CHUNK)
            .enumerate()
            .map(|(ci, ys)| {
                let base = ci * CHUNK;
                let mut bad = 0usize;
                let mut worst: Option<(usize, f32, f32)> = None;
                for (j, &bits) in ys.iter().enumerate() {
                    let i = base + j;
                    let (r, tol) = (self.reference.y_f32[i], self.tolerance[i]);
                    let err = (bf16::from_bits(bits).to_f32() - r).abs();
                    // NaN errors count as failures.
                    if err.is_nan() || err > tol {
                        bad += 1;
                        worst = worse(worst, Some((i, err, tol)));
                    }
                }
                (bad, worst)
            })
            .reduce(|| (0, None), |a, b| (a.0 + b.0, worse(a.1, b.1)));
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
    /// The rotation requirement the copies were made for (`TimingPolicy::l2_multiple`).
    pub l2_multiple: f64,
    w: DeviceBuf<u8>,
    w_sf: DeviceBuf<u8>,
    a: DeviceBuf<u8>,
    a_sf: DeviceBuf<u8>,
    strides: [u64; 4],
    pub y: DeviceBuf<u16>,
    workspace: DeviceBuf<f32>,
    counters: DeviceBuf<u32>,
    /// Verification on the GPU (see [`OutputCheck`]); `None`: the output is copied back and
    /// checked on the CPU.
    check: Option<OutputCheck>,
}

/// The reference and bounds of one problem on the GPU, and the kernel that checks an output
/// against them (`templates/bench/check.cuh`): verification without copying large outputs back.
/// A failure is then re-checked on the CPU for its message.
#[derive(Debug)]
pub struct OutputCheck {
    kernel: Kernel,
    reference: DeviceBuf<f32>,
    tolerance: DeviceBuf<f32>,
    y2: DeviceBuf<u16>,
    stats: DeviceBuf<u64>,
}

impl OutputCheck {
    fn new(
        gpu: &Gpu,
        compiler: &crate::compile::Compiler,
        host: &HostProblem,
    ) -> Result<Self, String> {
        let (ma, mi) = gpu.info().compute_capability;
        let arch = crate::template::Arch::for_compute_capability(ma, mi)
            .unwrap_or(crate::template::Arch::Sm90a);
        let name = "fp4tune_check_output";
        let src = crate::template::KernelSource::from_unit(
            name.into(),
            arch,
            "#include \"bench/check.cuh\"\n",
        )?;
        let k = compiler.compile(&src).map_err(|e| e.to_string())?;
        let g = |e: GpuError| e.to_string();
        Ok(Self {
            kernel: gpu.load(&k, 0).map_err(g)?,
            reference: gpu.upload(&host.reference.y_f32).map_err(g)?,
            tolerance: gpu.upload(&host.tolerance).map_err(g)?,
            y2: gpu.alloc_zeros::<u16>(host.tolerance.len()).map_err(g)?,
            stats: gpu.alloc_zeros::<u64>(4).map_err(g)?,
        })
    }

    /// (elements outside the bound, elements differing from the previous run) of `y`.
    fn run(&mut self, gpu: &Gpu, y: &DeviceBuf<u16>) -> Result<(u64, u64), GpuError> {
        gpu.zero(&mut self.stats)?;
        let n = self.reference.len() as u64;
        let blocks = (gpu.info().sm_count * 8).max(1);
        let dims = LaunchDims { grid: (blocks, 1, 1), block: (256, 1, 1), smem_bytes: 0 };
        // SAFETY: y, y2, reference and tolerance all hold n elements (one problem's output);
        // stats holds 4 words; every buffer outlives the synchronize below.
        unsafe {
            gpu.launch_u64s(
                &self.kernel,
                dims,
                &[
                    y.ptr(),
                    self.y2.ptr(),
                    self.reference.ptr(),
                    self.tolerance.ptr(),
                    n,
                    self.stats.ptr(),
                ],
            )?;
        }
        let s = gpu.download(&self.stats)?;
        Ok((s[0], s[1]))
    }
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
        // E4M3 NaN in the padding scale columns (a K that 64 does not divide): a kernel that reads
        // them fails verification.
        let poisoned = |m: &Nvfp4Matrix| {
            let mut sf = m.scales_swizzled();
            fill_padding_columns(&mut sf, m.rows, m.scale_cols(), PADDING_SCALE);
            sf
        };
        let w_sf = poisoned(&host.w);
        let (a_bytes, a_sf): (Vec<u8>, Vec<u8>) = match &host.a_fp4 {
            Some(a) => (a.codes.clone(), poisoned(a)),
            None => (
                host.a_bf16.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
                vec![0u8; 16],
            ),
        };
        let per_copy = (w_codes.len() + w_sf.len() + a_bytes.len() + a_sf.len()) as u64;
        let copies = rotation_copies(per_copy, gpu.info().l2_bytes, policy.l2_multiple);
        let mut dp = Self {
            problem: p,
            alpha: host.reference.alpha,
            copies,
            l2_multiple: policy.l2_multiple,
            w: gpu.upload_repeated(w_codes, copies)?,
            w_sf: gpu.upload_repeated(&w_sf, copies)?,
            a: gpu.upload_repeated(&a_bytes, copies)?,
            a_sf: gpu.upload_repeated(&a_sf, copies)?,
            strides: [
                w_codes.len() as u64,
                w_sf.len() as u64,
                a_bytes.len() as u64,
                a_sf.len() as u64,
            ],
            y: gpu.alloc_zeros::<u16>((p.m * p.n) as usize)?,
            workspace: gpu.alloc_zeros::<f32>(1)?,
            counters: gpu.alloc_zeros::<u32>(1)?,
            check: None,
        };
        dp.ensure_scratch(gpu, configs)?;
        Ok(dp)
    }

    /// Verify candidates on the GPU from now on (the reference and bounds uploaded once). An
    /// error (the check kernel not compiling or loading, no memory for the reference) leaves
    /// verification on the CPU and is returned for the caller to report.
    pub fn check_on_gpu(
        &mut self,
        gpu: &Gpu,
        compiler: &crate::compile::Compiler,
        host: &HostProblem,
    ) -> Result<(), String> {
        self.check = Some(OutputCheck::new(gpu, compiler, host)?);
        Ok(())
    }

    /// Grow the split-K workspace and counters to what `configs` need on this problem (kept
    /// otherwise, so one upload serves every batch of a key).
    pub fn ensure_scratch(&mut self, gpu: &Gpu, configs: &[GemmConfig]) -> Result<(), GpuError> {
        let p = self.problem;
        let ws = configs.iter().map(|c| c.workspace_floats(&p)).max().unwrap_or(0).max(1);
        let ctr = configs.iter().map(|c| c.counter_words(&p)).max().unwrap_or(0).max(1);
        if ws > self.workspace.len() {
            self.workspace = gpu.alloc_zeros::<f32>(ws)?;
        }
        if ctr > self.counters.len() {
            self.counters = gpu.alloc_zeros::<u32>(ctr)?;
        }
        Ok(())
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
    if let Some(mut check) = dp.check.take() {
        let verdict = verify_on_gpu(gpu, host, dp, cand, &mut check);
        dp.check = Some(check);
        return verdict;
    }
    // 0xFFFF is a bf16 NaN: any output the kernel fails to write is caught.
    gpu.fill_bytes(&mut dp.y, 0xFF)?;
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

/// [`verify`] with the output checked on the GPU: run, keep the output, run again on a poisoned
/// buffer, compare both runs and the bounds on the GPU; only a failure copies the output back
/// (for the CPU's message).
fn verify_on_gpu(
    gpu: &Gpu,
    host: &HostProblem,
    dp: &mut DeviceProblem,
    cand: &Candidate,
    check: &mut OutputCheck,
) -> Result<Result<(), String>, GpuError> {
    gpu.fill_bytes(&mut dp.y, 0xFF)?;
    cand.launch(gpu, dp, 0)?;
    gpu.copy(&dp.y, &mut check.y2)?;
    gpu.fill_bytes(&mut dp.y, 0xFF)?;
    cand.launch(gpu, dp, 0)?;
    let (bad, diff) = check.run(gpu, &dp.y)?;
    if bad == 0 && diff == 0 {
        return Ok(Ok(()));
    }
    let y = gpu.download(&dp.y)?;
    Ok(match host.check(&y) {
        Err(why) => Err(why),
        Ok(()) if diff > 0 => Err(format!(
            "non-deterministic: two runs on the same operands differ in {diff} elements"
        )),
        Ok(()) => Err(format!("wrong answer: {bad} elements outside the bound on the GPU check")),
    })
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
    measure(gpu, policy, dp.copies, fs)
}
