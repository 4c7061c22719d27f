//! Peer GEMMs timed under the same policy as our kernels: cuBLAS BF16 on dequantized weights and
//! cuBLASLt FP8 (E4M3, per-tensor scales), on rotated operand copies.

use super::policy::{rotation_copies, TimingPolicy};
use super::timer::{measure, LaunchFn, Samples};
use crate::gpu::blas::{CublasBf16, CublasLtFp8};
use crate::gpu::{DeviceBuf, Gpu, GpuError};
use crate::problem::GemmProblem;
use rand::{Rng, SeedableRng};

/// The peers we compare against, by report name.
pub const PEERS: [&str; 2] = ["cublas_bf16", "cublaslt_fp8"];

/// Random but finite operands: bf16 in [-1, 1) and E4M3 codes with magnitude <= 2.
fn random_bf16(n: usize, rng: &mut rand::rngs::StdRng) -> Vec<u16> {
    (0..n).map(|_| half::bf16::from_f32(rng.random_range(-1.0f32..1.0)).to_bits()).collect()
}
fn random_e4m3(n: usize, rng: &mut rand::rngs::StdRng) -> Vec<u8> {
    // Exponent field <= 7 keeps |x| < 2 and never produces the NaN code 0x7F/0xFF.
    (0..n).map(|_| rng.random::<u8>() & 0xBF).collect()
}

/// One peer's outcome: its name and its samples (or why it could not be timed).
pub type PeerResult = (&'static str, Result<Samples, GpuError>);

/// Time both peers on `p` (interleaved); returns (name, samples) in [`PEERS`] order.
pub fn time_peers(
    gpu: &Gpu,
    policy: &TimingPolicy,
    p: &GemmProblem,
) -> Result<Vec<PeerResult>, GpuError> {
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed ^ (m * 31 + n * 7 + k) as u64);
    // BF16: weights dominate; rotate weight and activation copies together.
    let bf16_bytes = (n * k + m * k) as u64 * 2;
    let copies = rotation_copies(bf16_bytes, gpu.info().l2_bytes, policy.l2_multiple);
    let w16 = gpu.upload(&random_bf16(n * k * copies, &mut rng))?;
    let a16 = gpu.upload(&random_bf16(m * k * copies, &mut rng))?;
    let y = gpu.alloc_zeros::<u16>(m * n)?;
    let fp8_bytes = (n * k + m * k) as u64;
    let copies8 = rotation_copies(fp8_bytes, gpu.info().l2_bytes, policy.l2_multiple);
    let w8 = gpu.upload(&random_e4m3(n * k * copies8, &mut rng))?;
    let a8 = gpu.upload(&random_e4m3(m * k * copies8, &mut rng))?;
    let sa: DeviceBuf<f32> = gpu.upload(&[0.5f32])?;
    let sw: DeviceBuf<f32> = gpu.upload(&[0.25f32])?;
    let cublas = CublasBf16::new(gpu)?;
    let lt = CublasLtFp8::new(gpu, m as u64, n as u64, k as u64, &sa, &sw)?;
    let (pw16, pa16, pw8, pa8, py) = (w16.ptr(), a16.ptr(), w8.ptr(), a8.ptr(), y.ptr());
    let bf16: LaunchFn<'_> = Box::new(|i| {
        let c = (i % copies) as u64;
        // SAFETY: copy `c` of each operand lies inside its buffer; y holds m*n bf16.
        unsafe {
            cublas.gemm(
                m as i32,
                n as i32,
                k as i32,
                1.0,
                pa16 + c * (m * k * 2) as u64,
                pw16 + c * (n * k * 2) as u64,
                py,
            )
        }
    });
    let fp8: LaunchFn<'_> = Box::new(|i| {
        let c = (i % copies8) as u64;
        // SAFETY: as above, with 1-byte elements.
        unsafe { lt.gemm(pa8 + c * (m * k) as u64, pw8 + c * (n * k) as u64, py) }
    });
    // every graph walks the longer of the two rotations (the shorter one wraps within it)
    let r = measure(gpu, policy, copies.max(copies8), vec![bf16, fp8]);
    Ok(PEERS.iter().copied().zip(r).collect())
}
