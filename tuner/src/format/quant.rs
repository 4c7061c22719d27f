//! NVFP4 quantization: [`Nvfp4Matrix`], ModelOpt-compatible weight quantization and activation
//! quantization with a static input scale (the CPU twin of `templates/common/quantize.cuh`).
//!
//! K (the row length) must be a multiple of 16; other lengths are rejected, never padded.

use super::e2m1::{e2m1_decode, e2m1_encode};
use super::e4m3::{e4m3_decode, e4m3_encode, E4M3_MAX, E4M3_MIN_SUBNORMAL};
use super::pack::nibble_at;
use super::swizzle::swizzle_scales;
use super::FormatError;
use half::bf16;
use rayon::prelude::*;

/// Elements per block scale.
pub const BLOCK: usize = 16;

/// An NVFP4 matrix `[rows, cols]` (cols = K, the reduction dimension) in the checkpoint layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Matrix {
    pub rows: usize,
    /// K; a multiple of 16.
    pub cols: usize,
    /// E2M1 codes `[rows, K/2]`, element 2j in the low nibble.
    pub codes: Vec<u8>,
    /// E4M3 block scales, row-major `[rows, K/16]` (not swizzled).
    pub scales: Vec<u8>,
    /// The fp32 global scale (`weight_scale_2` for weights, `input_scale` for activations).
    pub global_scale: f32,
}

impl Nvfp4Matrix {
    /// Build from parts, checking the buffer sizes.
    pub fn new(
        rows: usize,
        cols: usize,
        codes: Vec<u8>,
        scales: Vec<u8>,
        global_scale: f32,
    ) -> Result<Self, FormatError> {
        check_k(cols, "NVFP4 matrix")?;
        if codes.len() != rows * cols / 2 {
            return Err(FormatError::Shape {
                what: "NVFP4 codes".into(),
                problem: format!("{} bytes for [{rows}, {cols}/2]", codes.len()),
            });
        }
        if scales.len() != rows * cols / BLOCK {
            return Err(FormatError::Shape {
                what: "NVFP4 block scales".into(),
                problem: format!("{} bytes for [{rows}, {cols}/16]", scales.len()),
            });
        }
        Ok(Self { rows, cols, codes, scales, global_scale })
    }

    /// K/16.
    pub fn scale_cols(&self) -> usize {
        self.cols / BLOCK
    }

    /// The 4-bit code of element (`r`, `c`).
    pub fn code(&self, r: usize, c: usize) -> u8 {
        nibble_at(&self.codes[r * self.cols / 2..(r + 1) * self.cols / 2], c)
    }

    /// Block-scaled values `e2m1(q) * f32(scale)`, `[rows, K]` row-major, global scale NOT
    /// applied. Every such product is exact in f32 (at most 6 significant bits), so this is what
    /// a GEMM kernel multiplies before applying alpha in the epilogue.
    pub fn dequantize_block_scaled(&self) -> Vec<f32> {
        let k = self.cols;
        let mut out = vec![0f32; self.rows * k];
        if k == 0 {
            return out;
        }
        out.par_chunks_mut(k).enumerate().for_each(|(r, row)| {
            let codes = &self.codes[r * k / 2..(r + 1) * k / 2];
            let scales = &self.scales[r * k / BLOCK..(r + 1) * k / BLOCK];
            for (b, blk) in row.chunks_exact_mut(BLOCK).enumerate() {
                let sf = e4m3_decode(scales[b]);
                for (j, v) in blk.iter_mut().enumerate() {
                    *v = e2m1_decode(nibble_at(codes, b * BLOCK + j)) * sf;
                }
            }
        });
        out
    }

    /// Full dequantization `(e2m1(q) * f32(scale)) * global_scale`, `[rows, K]` row-major (the
    /// product in brackets is exact, the last multiplication rounds once).
    pub fn dequantize(&self) -> Vec<f32> {
        let g = self.global_scale;
        let mut v = self.dequantize_block_scaled();
        v.par_iter_mut().for_each(|x| *x *= g);
        v
    }

    /// The block scales in the swizzled 128x4 device layout (rows padded to 128, scale columns
    /// to 4, padding zero).
    pub fn scales_swizzled(&self) -> Vec<u8> {
        swizzle_scales(&self.scales, self.rows, self.scale_cols())
            .expect("Nvfp4Matrix invariant: scales hold rows * K/16 bytes")
    }
}

fn check_k(k: usize, what: &str) -> Result<(), FormatError> {
    if k % BLOCK != 0 {
        return Err(FormatError::KNotMultipleOf16 { what: what.into(), k });
    }
    Ok(())
}

fn check_len(len: usize, rows: usize, cols: usize, what: &str) -> Result<(), FormatError> {
    if len != rows * cols {
        return Err(FormatError::Shape {
            what: what.into(),
            problem: format!("{len} elements for [{rows}, {cols}]"),
        });
    }
    Ok(())
}

/// `amax(W) / (6 * 448)` in f32, the ModelOpt `weight_scale_2`.
pub fn weight_global_scale(amax: f32) -> f32 {
    amax / (6.0 * E4M3_MAX)
}

/// ModelOpt NVFP4 weight quantization of an f32 (usually bf16-valued) `[rows, cols]` matrix.
///
/// In f32, exactly as ModelOpt's `NVFP4QTensor.quantize`:
/// 1. `s2 = amax(|W|) / 2688`;
/// 2. per 16-block: `s = block_amax / (6 * s2)`; `s == 0` -> 1; `s = max(s, 2^-9)`;
///    `sf = e4m3_rne(s)`;
/// 3. `q = e2m1_rne_sat(w / (f32(sf) * s2))`.
///
/// An all-zero matrix gets `s2 = 0`, scales 1.0 and zero codes. Non-finite input is an error.
pub fn quantize_weight(w: &[f32], rows: usize, cols: usize) -> Result<Nvfp4Matrix, FormatError> {
    check_k(cols, "weight")?;
    check_len(w.len(), rows, cols, "weight")?;
    if let Some(i) = w.iter().position(|x| !x.is_finite()) {
        return Err(FormatError::NonFinite { what: "weight".into(), index: i, value: w[i] });
    }
    let amax = w.par_iter().fold(|| 0f32, |m, x| m.max(x.abs())).reduce(|| 0f32, f32::max);
    let s2 = weight_global_scale(amax);
    let ksf = cols / BLOCK;
    let mut codes = vec![0u8; rows * cols / 2];
    let mut scales = vec![0u8; rows * ksf];
    if amax == 0.0 {
        scales.fill(e4m3_encode(1.0));
        return Nvfp4Matrix::new(rows, cols, codes, scales, 0.0);
    }
    if cols > 0 {
        codes
            .par_chunks_mut(cols / 2)
            .zip(scales.par_chunks_mut(ksf))
            .zip(w.par_chunks(cols))
            .for_each(|((crow, srow), wrow)| {
                for (b, blk) in wrow.chunks_exact(BLOCK).enumerate() {
                    let bamax = blk.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let mut s = bamax / (6.0 * s2);
                    if s == 0.0 {
                        s = 1.0;
                    }
                    let s = s.max(E4M3_MIN_SUBNORMAL);
                    let sf = e4m3_encode(s);
                    srow[b] = sf;
                    let denom = e4m3_decode(sf) * s2;
                    for j in 0..BLOCK / 2 {
                        let lo = e2m1_encode(blk[2 * j] / denom);
                        let hi = e2m1_encode(blk[2 * j + 1] / denom);
                        crow[b * BLOCK / 2 + j] = lo | (hi << 4);
                    }
                }
            });
    }
    Nvfp4Matrix::new(rows, cols, codes, scales, s2)
}

/// [`quantize_weight`] of a bf16 matrix (values widened to f32 exactly, as torch does).
pub fn quantize_weight_bf16(
    w: &[bf16],
    rows: usize,
    cols: usize,
) -> Result<Nvfp4Matrix, FormatError> {
    let f: Vec<f32> = w.par_iter().map(|x| x.to_f32()).collect();
    quantize_weight(&f, rows, cols)
}

/// Quantize one block of 16 activations (already widened from bf16) with a static input scale.
/// Returns the E4M3 scale byte and the 16 codes (one per byte, not packed).
///
/// This is the bit-exact contract shared with the GPU quantizer (`quantize.cuh`); every step is
/// one IEEE f32 operation with round-to-nearest-even, no FMA contraction:
/// 1. `amax = max(|x_i|)` over the 16 values, starting from +0 and ignoring NaN (`fmaxf`; the
///    order does not matter);
/// 2. `t = amax / 6.0`, then `t = t / input_scale` (two divisions, in this order);
/// 3. `sf = e4m3_encode(t)` (RNE, saturating at 448, see [`e4m3_encode`]);
/// 4. `d = f32(sf) * input_scale`;
/// 5. if `f32(sf) == 0` every code is 0, else `code_i = e2m1_encode(x_i / d)`.
pub fn quantize_activation_block(x: &[f32; BLOCK], input_scale: f32) -> (u8, [u8; BLOCK]) {
    let mut amax = 0f32;
    for v in x {
        amax = amax.max(v.abs());
    }
    let t = amax / 6.0;
    let t = t / input_scale;
    let sf = e4m3_encode(t);
    let sff = e4m3_decode(sf);
    let mut codes = [0u8; BLOCK];
    if sff != 0.0 {
        let d = sff * input_scale;
        for (c, v) in codes.iter_mut().zip(x) {
            *c = e2m1_encode(v / d);
        }
    }
    (sf, codes)
}

/// Activation quantization of bf16 rows `[rows, cols]` with a static `input_scale` (the
/// checkpoint's `input_scale`, = calibrated amax / 2688); see [`quantize_activation_block`] for
/// the exact arithmetic. The result's `global_scale` is `input_scale`.
pub fn quantize_activations(
    x: &[bf16],
    rows: usize,
    cols: usize,
    input_scale: f32,
) -> Result<Nvfp4Matrix, FormatError> {
    check_k(cols, "activations")?;
    check_len(x.len(), rows, cols, "activations")?;
    if !(input_scale.is_finite() && input_scale > 0.0) {
        return Err(FormatError::BadInputScale { value: input_scale });
    }
    let ksf = cols / BLOCK;
    let mut codes = vec![0u8; rows * cols / 2];
    let mut scales = vec![0u8; rows * ksf];
    if cols > 0 {
        codes
            .par_chunks_mut(cols / 2)
            .zip(scales.par_chunks_mut(ksf))
            .zip(x.par_chunks(cols))
            .for_each(|((crow, srow), xrow)| {
                for (b, blk) in xrow.chunks_exact(BLOCK).enumerate() {
                    let mut f = [0f32; BLOCK];
                    for (d, s) in f.iter_mut().zip(blk) {
                        *d = s.to_f32();
                    }
                    let (sf, c) = quantize_activation_block(&f, input_scale);
                    srow[b] = sf;
                    for j in 0..BLOCK / 2 {
                        crow[b * BLOCK / 2 + j] = c[2 * j] | (c[2 * j + 1] << 4);
                    }
                }
            });
    }
    Nvfp4Matrix::new(rows, cols, codes, scales, input_scale)
}

#[cfg(test)]
mod tests {
    use super::super::pack::unpack_nibbles;
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    #[test]
    fn hand_computed_weight_row() {
        // amax = 2.625 = 2688 * 2^-10, so s2 = 2^-10 exactly.
        let mut w = vec![0f32; 64];
        // Block 0: scale 2.625 / (6 * 2^-10) = 448 -> 0x7e; q = w / 0.4375.
        w[0] = 2.625; // q = 6 -> code 7
        w[1] = 1.3; // q = 2.971 -> 3 -> code 5
        w[2] = -0.7; // q = -1.6 -> -1.5 -> code 0xb
        w[3] = 1.09375; // q = 2.5 (tie) -> 2 -> code 4
        w[4] = 2.1875; // q = 5 (tie) -> 4 -> code 6
        w[5] = -0.109375; // q = -0.25 (tie) -> -0 -> code 8
                          // Block 1: amax 0.21875 -> 37.33 -> e4m3 36 (0x61); q = w / (36 * 2^-10).
        w[16] = 0.21875; // q = 6.22 -> saturates to 6 -> code 7
        w[17] = 0.1; // q = 2.844 -> 3 -> code 5
        w[18] = -0.05; // q = -1.422 -> -1.5 -> code 0xb
                       // Block 2: all zero -> scale 1.0 (0x38), codes 0.
                       // Block 3: amax 1e-6 -> 1.7e-4, clamped to 2^-9 (0x01); q = 1e-6 * 2^19 = 0.524 -> 0.5.
        w[48] = 1e-6;
        let m = quantize_weight(&w, 1, 64).unwrap();
        assert_eq!(m.global_scale, 1.0 / 1024.0);
        assert_eq!(m.scales, vec![0x7e, 0x61, 0x38, 0x01]);
        let c = unpack_nibbles(&m.codes);
        assert_eq!(&c[0..7], &[7, 5, 0xb, 4, 6, 8, 0]);
        assert_eq!(&c[16..20], &[7, 5, 0xb, 0]);
        assert!(c[32..48].iter().all(|&x| x == 0));
        assert_eq!(c[48], 1);
        let d = m.dequantize();
        assert_eq!(d[0], 2.625);
        assert_eq!(d[1], 3.0 * 0.4375);
        assert_eq!(d[16], 6.0 * 36.0 / 1024.0);
        assert_eq!(d[48], 0.5 / 512.0 / 1024.0);
    }

    #[test]
    fn hand_computed_activation_blocks() {
        let is = 1.0 / 256.0;
        let mut x = [0f32; 16];
        x[0] = 3.0; // amax 3 -> 3/6/2^-8 = 128 -> 0x70; d = 0.5; q = 6 -> code 7
        x[1] = 1.25; // q = 2.5 (tie) -> 2 -> code 4
        x[2] = -0.375; // q = -0.75 (tie) -> -1 -> code 0xa
        x[3] = 0.7; // q = 1.4 -> 1.5 -> code 3
        let (sf, c) = quantize_activation_block(&x, is);
        assert_eq!(sf, 0x70);
        assert_eq!(&c[..5], &[7, 4, 0xa, 3, 0]);
        // Over-range block: 20/6/2^-8 = 853 saturates to 448; d = 1.75; q = 11.4 -> 6.
        let mut y = [0f32; 16];
        y[0] = -20.0;
        y[1] = 2.0; // q = 1.143 -> 1 -> code 2
        let (sf, c) = quantize_activation_block(&y, is);
        assert_eq!((sf, c[0], c[1]), (0x7e, 0xf, 2));
        // A block whose scale rounds to zero: all codes 0.
        let mut z = [0f32; 16];
        z[0] = 1e-9;
        assert_eq!(quantize_activation_block(&z, is), (0, [0; 16]));
        // Through the matrix API with bf16 input (packed, global scale = input scale).
        let xb: Vec<bf16> = (0..32).map(|i| bf16::from_f32(x[i % 16])).collect();
        let m = quantize_activations(&xb, 1, 32, is).unwrap();
        assert_eq!(m.scales, vec![0x70, 0x70]);
        assert_eq!(m.codes[0], 7 | (4 << 4));
        assert_eq!(m.codes[1], 0xa | (3 << 4));
        assert_eq!(m.global_scale, is);
    }

    #[test]
    fn bad_input_is_rejected_with_context() {
        let e = quantize_weight(&[0.0; 24], 1, 24).unwrap_err().to_string();
        assert!(e.contains("24") && e.contains("16"), "{e}");
        assert!(quantize_weight(&[0.0; 31], 1, 32).is_err());
        let mut w = vec![0.5f32; 32];
        w[7] = f32::NAN;
        let e = quantize_weight(&w, 1, 32).unwrap_err().to_string();
        assert!(e.contains("index 7"), "{e}");
        let x = vec![bf16::ONE; 32];
        assert!(quantize_activations(&x, 1, 32, 0.0).is_err());
        assert!(quantize_activations(&x, 1, 32, f32::NAN).is_err());
        assert!(quantize_activations(&x, 2, 32, 1.0).is_err());
        assert!(Nvfp4Matrix::new(1, 32, vec![0; 16], vec![0; 3], 1.0).is_err());
    }

    #[test]
    fn zero_weight_is_defined() {
        let m = quantize_weight(&[0.0; 32], 1, 32).unwrap();
        assert_eq!(m.global_scale, 0.0);
        assert_eq!(m.scales, vec![0x38, 0x38]);
        assert!(m.dequantize().iter().all(|&v| v == 0.0));
    }

    fn randn(rng: &mut StdRng) -> f32 {
        // Sum of uniforms: roughly normal, with occasional larger outliers mixed in.
        let s: f32 = (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum();
        if rng.random_range(0..64) == 0 {
            s * 20.0
        } else {
            s
        }
    }

    /// Each dequantized value is the nearest (up to ties) of the 16 values its block can
    /// represent, and the error obeys the format's bound: half a step of E2M1 at that magnitude
    /// (steps 0.5, 1, 2 below 2, 4, 6) in units of the block's scale, or the saturation distance.
    fn check_block_error(x: &[f32], deq: &[f32], unit: f64) {
        let cands: Vec<f64> = (0u8..16).map(|c| e2m1_decode(c) as f64 * unit).collect();
        for (&xv, &dv) in x.iter().zip(deq) {
            let (xv, dv) = (xv as f64, dv as f64);
            let err = (xv - dv).abs();
            let best = cands.iter().map(|c| (xv - c).abs()).fold(f64::INFINITY, f64::min);
            // Slack: the quantizer divides by the f32-rounded `f32(sf) * s2`, so right next to a
            // tie it may pick the other neighbour.
            assert!(err <= best + unit * 1e-5, "x {xv} deq {dv} best err {best} unit {unit}");
            let q = xv.abs() / unit;
            let bound = if q <= 2.0 {
                0.25
            } else if q <= 4.0 {
                0.5
            } else if q <= 6.0 {
                1.0
            } else {
                q - 6.0
            };
            assert!(err <= (bound + 1e-5) * unit, "x {xv} deq {dv} unit {unit}");
        }
    }

    #[test]
    fn weight_error_within_format_bound() {
        let mut rng = StdRng::seed_from_u64(1);
        let (rows, cols) = (33, 256);
        let w: Vec<f32> = (0..rows * cols).map(|_| randn(&mut rng) * 0.02).collect();
        let m = quantize_weight(&w, rows, cols).unwrap();
        let deq = m.dequantize();
        for r in 0..rows {
            for b in 0..cols / 16 {
                let o = r * cols + b * 16;
                let unit = e4m3_decode(m.scales[r * cols / 16 + b]) as f64 * m.global_scale as f64;
                check_block_error(&w[o..o + 16], &deq[o..o + 16], unit);
                // The block scale is the nearest E4M3 to amax / 6 in global units: so the
                // block's largest element lands within 1/16 relative of 6.
                let bamax = w[o..o + 16].iter().fold(0f32, |a, x| a.max(x.abs())) as f64;
                let q = bamax / unit;
                assert!((q - 6.0).abs() <= 6.0 / 15.0 + 1e-9, "block amax q {q}");
            }
        }
        let num: f64 = w.iter().zip(&deq).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let den: f64 = w.iter().map(|a| (*a as f64).powi(2)).sum();
        assert!((num / den).sqrt() < 0.12, "relative rms error {}", (num / den).sqrt());
    }

    #[test]
    fn activation_error_within_format_bound() {
        let mut rng = StdRng::seed_from_u64(2);
        let (rows, cols) = (17, 512);
        let x: Vec<bf16> = (0..rows * cols).map(|_| bf16::from_f32(randn(&mut rng))).collect();
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        // Calibrated on a fraction of the range: some blocks saturate their scale at 448.
        let amax = xf.iter().fold(0f32, |a, v| a.max(v.abs()));
        let input_scale = amax * 0.5 / 2688.0;
        let m = quantize_activations(&x, rows, cols, input_scale).unwrap();
        let deq = m.dequantize();
        let mut saturated = 0;
        for r in 0..rows {
            for b in 0..cols / 16 {
                let o = r * cols + b * 16;
                let sf = m.scales[r * cols / 16 + b];
                saturated += (sf == 0x7e) as usize;
                let unit = e4m3_decode(sf) as f64 * input_scale as f64;
                check_block_error(&xf[o..o + 16], &deq[o..o + 16], unit);
            }
        }
        assert!(saturated > 0, "the test should exercise scale saturation");
    }

    #[test]
    fn matrix_layout_accessors_agree() {
        let mut rng = StdRng::seed_from_u64(3);
        let w: Vec<f32> = (0..5 * 64).map(|_| randn(&mut rng)).collect();
        let m = quantize_weight(&w, 5, 64).unwrap();
        let deq = m.dequantize_block_scaled();
        for r in 0..5 {
            for c in 0..64 {
                let want = e2m1_decode(m.code(r, c)) * e4m3_decode(m.scales[r * 4 + c / 16]);
                assert_eq!(deq[r * 64 + c], want);
            }
        }
        let sw = m.scales_swizzled();
        assert_eq!(sw.len(), 128 * 4);
        assert_eq!(sw[16], m.scales[4], "row 1, column 0 sits at byte 16");
        assert_eq!(
            sw.iter().filter(|&&b| b != 0).count(),
            m.scales.iter().filter(|&&b| b != 0).count()
        );
    }
}
