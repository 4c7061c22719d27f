//! The CPU reference GEMM `Y[M, N] = alpha * deq(A)[M, K] * deq(W)[N, K]^T` (f32 accumulation,
//! bf16 output) that every GPU kernel's result is compared against.
//!
//! `deq` is the block-scaled value `e2m1 * f32(scale)` (exact in f32); the global scales are
//! folded into `alpha` and applied once at the end, like the kernels' epilogue:
//! W4A4: `alpha = input_scale * weight_scale_2`; W4A16: `alpha = weight_scale_2`, with A the bf16
//! activations widened to f32.

use super::quant::Nvfp4Matrix;
use super::FormatError;
use half::bf16;
use rayon::prelude::*;

/// The left operand of the reference GEMM.
#[derive(Debug, Clone, Copy)]
pub enum GemmA<'a> {
    /// W4A4: NVFP4 activations (its `global_scale` is the input scale).
    Nvfp4(&'a Nvfp4Matrix),
    /// W4A16: bf16 activations `[rows, cols]` row-major.
    Bf16 { data: &'a [bf16], rows: usize, cols: usize },
}

/// Result of the reference GEMM.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceOutput {
    pub m: usize,
    pub n: usize,
    /// The alpha used (f32 product of the global scales).
    pub alpha: f32,
    /// `alpha * acc` in f32, before the rounding to bf16; `[M, N]` row-major. GPU results differ
    /// from it only by the f32 summation order (compare with a tolerance).
    pub y_f32: Vec<f32>,
    /// `y_f32` rounded to bf16 (nearest even), `[M, N]` row-major.
    pub y_bf16: Vec<bf16>,
}

/// Reference GEMM of A (NVFP4 or bf16) against NVFP4 weights `w` (`[N, K]`).
pub fn reference_gemm(a: GemmA<'_>, w: &Nvfp4Matrix) -> Result<ReferenceOutput, FormatError> {
    let (m, k, alpha, a_f32) = match a {
        GemmA::Nvfp4(a) => {
            (a.rows, a.cols, a.global_scale * w.global_scale, a.dequantize_block_scaled())
        }
        GemmA::Bf16 { data, rows, cols } => {
            if data.len() != rows * cols {
                return Err(FormatError::Shape {
                    what: "bf16 activations".into(),
                    problem: format!("{} elements for [{rows}, {cols}]", data.len()),
                });
            }
            (rows, cols, w.global_scale, data.par_iter().map(|x| x.to_f32()).collect())
        }
    };
    if k != w.cols {
        return Err(FormatError::Shape {
            what: "reference GEMM".into(),
            problem: format!("A has K = {k}, W has K = {}", w.cols),
        });
    }
    let n = w.rows;
    let w_f32 = w.dequantize_block_scaled();
    let y_f32 = gemm_nt_f32(&a_f32, &w_f32, m, n, k, alpha)?;
    let y_bf16 = y_f32.par_iter().map(|&v| bf16::from_f32(v)).collect();
    Ok(ReferenceOutput { m, n, alpha, y_f32, y_bf16 })
}

/// Rows of A per parallel task.
const MB: usize = 64;
/// K per cache tile.
const KC: usize = 256;
/// Micro-kernel block: rows of A (broadcast) by rows of W (the contiguous vector dimension).
const MR: usize = 8;
const NR: usize = 32;
/// W panels per cache group.
const G: usize = 8;

/// `alpha * A[M, K] * W[N, K]^T` with f32 accumulation, `[M, N]` row-major.
///
/// Both operands are first packed into K-major panels (MR rows of A, NR rows of W, zero-padded);
/// each task (MB rows of A) then runs an axpy-style micro-kernel (written so that the loop
/// vectorizer handles it at opt-level 2) over cache tiles of K. Every output is summed strictly
/// sequentially over k (`acc += a[k] * w[k]`, no FMA contraction, then `alpha * acc`), so the result
/// does not depend on the thread count or the tiling.
pub fn gemm_nt_f32(
    a: &[f32],
    w: &[f32],
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
) -> Result<Vec<f32>, FormatError> {
    if a.len() != m * k || w.len() != n * k {
        return Err(FormatError::Shape {
            what: "f32 GEMM operands".into(),
            problem: format!("A has {} elements, W {}, for M={m} N={n} K={k}", a.len(), w.len()),
        });
    }
    let mut y = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return Ok(y);
    }
    let ap = pack::<MR>(a, m, k);
    let wp = pack::<NR>(w, n, k);
    let w_panels = n.div_ceil(NR);
    y.par_chunks_mut(MB * n).enumerate().for_each(|(mt, yblk)| {
        let rows = yblk.len() / n;
        let p0 = mt * MB / MR;
        let a_panels = rows.div_ceil(MR);
        // c[(pj - g0) * a_panels + pi]: the output tile of W panel pj and A panel pi.
        let mut c = vec![[[0f32; NR]; MR]; a_panels * G];
        for g0 in (0..w_panels).step_by(G) {
            let g1 = (g0 + G).min(w_panels);
            c.iter_mut().for_each(|t| *t = [[0f32; NR]; MR]);
            for k0 in (0..k).step_by(KC) {
                let kc = KC.min(k - k0);
                for pj in g0..g1 {
                    let wpan = &wp[(pj * k + k0) * NR..(pj * k + k0 + kc) * NR];
                    let cg = &mut c[(pj - g0) * a_panels..(pj - g0 + 1) * a_panels];
                    for (pi, ct) in cg.iter_mut().enumerate() {
                        let a0 = (p0 + pi) * k + k0;
                        micro(&ap[a0 * MR..(a0 + kc) * MR], wpan, ct);
                    }
                }
            }
            for pj in g0..g1 {
                let cols = NR.min(n - pj * NR);
                for r in 0..rows {
                    let src = &c[(pj - g0) * a_panels + r / MR][r % MR][..cols];
                    let dst = &mut yblk[r * n + pj * NR..r * n + pj * NR + cols];
                    for (d, s) in dst.iter_mut().zip(src) {
                        *d = alpha * s;
                    }
                }
            }
        }
    });
    Ok(y)
}

/// `[rows, k]` row-major -> panels of R rows, each K-major (`[k][R]`), rows zero-padded to R.
fn pack<const R: usize>(x: &[f32], rows: usize, k: usize) -> Vec<f32> {
    let panels = rows.div_ceil(R);
    let mut out = vec![0f32; panels * k * R];
    if k == 0 {
        return out;
    }
    out.par_chunks_mut(k * R).enumerate().for_each(|(p, pan)| {
        for r in 0..R.min(rows - p * R) {
            let src = &x[(p * R + r) * k..(p * R + r + 1) * k];
            for (t, v) in src.iter().enumerate() {
                pan[t * R + r] = *v;
            }
        }
    });
    out
}

/// `c[i][j] += a[k][i] * w[k][j]` over the panel's k, in order.
#[inline(always)]
fn micro(a: &[f32], w: &[f32], c: &mut [[f32; NR]; MR]) {
    for (ak, wk) in a.chunks_exact(MR).zip(w.chunks_exact(NR)) {
        for (ci, &av) in c.iter_mut().zip(ak) {
            for (cv, wv) in ci.iter_mut().zip(wk) {
                *cv += av * wv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::quant::{quantize_activations, quantize_weight};
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn naive_f64(a: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
        let mut y = vec![0f64; m * n];
        let mut mag = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                for t in 0..k {
                    let p = a[i * k + t] as f64 * w[j * k + t] as f64;
                    y[i * n + j] += p;
                    mag[i * n + j] += p.abs();
                }
            }
        }
        (y, mag)
    }

    fn random_case(rng: &mut StdRng, m: usize, n: usize, k: usize) -> (Vec<bf16>, Nvfp4Matrix) {
        let x: Vec<bf16> =
            (0..m * k).map(|_| bf16::from_f32(rng.random_range(-4.0f32..4.0))).collect();
        let wf: Vec<f32> = (0..n * k).map(|_| rng.random_range(-0.1f32..0.1)).collect();
        (x, quantize_weight(&wf, n, k).unwrap())
    }

    #[test]
    fn matches_f64_naive_product() {
        let mut rng = StdRng::seed_from_u64(11);
        for (m, n, k) in [(1, 1, 16), (5, 7, 48), (67, 130, 272), (64, 64, 512), (9, 200, 1024)] {
            let (x, w) = random_case(&mut rng, m, n, k);
            let a = quantize_activations(&x, m, k, 4.0 / 2688.0).unwrap();
            let wd = w.dequantize_block_scaled();
            // W4A4
            let out = reference_gemm(GemmA::Nvfp4(&a), &w).unwrap();
            assert_eq!(out.alpha, a.global_scale * w.global_scale);
            let (y, mag) = naive_f64(&a.dequantize_block_scaled(), &wd, m, n, k);
            for i in 0..m * n {
                let want = y[i] * out.alpha as f64;
                let tol = mag[i] * out.alpha as f64 * 1e-6 + 1e-30;
                assert!((out.y_f32[i] as f64 - want).abs() <= tol, "W4A4 {m}x{n}x{k} [{i}]");
                assert_eq!(out.y_bf16[i], bf16::from_f32(out.y_f32[i]));
            }
            // W4A16
            let out = reference_gemm(GemmA::Bf16 { data: &x, rows: m, cols: k }, &w).unwrap();
            assert_eq!(out.alpha, w.global_scale);
            let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
            let (y, mag) = naive_f64(&xf, &wd, m, n, k);
            for i in 0..m * n {
                let want = y[i] * out.alpha as f64;
                let tol = mag[i] * out.alpha as f64 * 1e-6 + 1e-30;
                assert!((out.y_f32[i] as f64 - want).abs() <= tol, "W4A16 {m}x{n}x{k} [{i}]");
            }
        }
    }

    #[test]
    fn generic_f32_gemm_handles_ragged_shapes() {
        let mut rng = StdRng::seed_from_u64(12);
        for (m, n, k) in [(3, 5, 7), (65, 66, 259), (4, 4, 4), (0, 3, 8)] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let y = gemm_nt_f32(&a, &w, m, n, k, 0.5).unwrap();
            let (want, mag) = naive_f64(&a, &w, m, n, k);
            for i in 0..m * n {
                assert!((y[i] as f64 - 0.5 * want[i]).abs() <= mag[i] * 1e-6, "{m}x{n}x{k} [{i}]");
            }
        }
        assert!(gemm_nt_f32(&[0.0; 3], &[0.0; 4], 1, 1, 4, 1.0).is_err());
    }

    #[test]
    fn shape_mismatch_is_an_error() {
        let w = quantize_weight(&[0.5; 64], 2, 32).unwrap();
        let a = quantize_weight(&[0.5; 48], 1, 48).unwrap();
        let e = reference_gemm(GemmA::Nvfp4(&a), &w).unwrap_err().to_string();
        assert!(e.contains("K = 48"), "{e}");
        let x = [bf16::ONE; 31];
        assert!(reference_gemm(GemmA::Bf16 { data: &x, rows: 1, cols: 32 }, &w).is_err());
    }

    /// Timing of the size the GPU tests check (1024 x 6144 x 4096). Run with
    /// `cargo test --release -- --ignored reference_gemm_timing --nocapture`.
    #[test]
    #[ignore]
    fn reference_gemm_timing() {
        let (m, n, k) = (1024, 6144, 4096);
        let mut rng = StdRng::seed_from_u64(13);
        let (x, w) = random_case(&mut rng, m, n, k);
        let t = std::time::Instant::now();
        let a = quantize_activations(&x, m, k, 4.0 / 2688.0).unwrap();
        let tq = t.elapsed();
        let t = std::time::Instant::now();
        let out = reference_gemm(GemmA::Nvfp4(&a), &w).unwrap();
        let tg = t.elapsed();
        eprintln!(
            "quantize A {m}x{k}: {tq:?}; reference GEMM {m}x{n}x{k}: {tg:?} ({:.1} GFLOP/s, {} threads)",
            2.0 * (m * n * k) as f64 / tg.as_secs_f64() / 1e9,
            rayon::current_num_threads()
        );
        assert!(out.y_f32.iter().all(|v| v.is_finite()));
    }
}
