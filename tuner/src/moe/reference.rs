//! The CPU reference of the grouped MoE layer, built from the same NVFP4 decoders as the
//! per-expert reference GEMM: per routed row, f32 dot products of dequantized weights with the
//! activations (bf16, or NVFP4 block-scaled values for W4A4), alpha last; gate_up applies
//! SiLU(gate) * up in f32; finalize is the exact mirror of the kernel (fma in slot order, then
//! bf16). [`Nvfp4Rows::quantize`] is what the W4A4 layer makes of bf16 rows (X before gate_up, H
//! in gate_up's epilogue): the activation quantizer of `format`, scales in the swizzled layout.

use super::schedule::{RouteSchedule, SplitMix64};
use crate::format::e2m1::e2m1_decode;
use crate::format::e4m3::e4m3_decode;
use crate::format::swizzle::{
    fill_padding_columns, padded_scale_cols, swizzled_len, swizzled_offset,
};
use crate::format::FormatError;
use half::bf16;

/// What [`ExpertWeights::random`] writes into the padding scale columns: E4M3 NaN.
pub use crate::format::PADDING_SCALE;

/// Stacked NVFP4 expert weights in the kernels' layout: per expert `[n, k/2]` codes (ModelOpt
/// nibble order), then its swizzled scales; one alpha per expert.
#[derive(Debug, Clone)]
pub struct ExpertWeights {
    pub n: usize,
    pub k: usize,
    pub experts: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
    pub alpha: Vec<f32>,
}

impl ExpertWeights {
    /// Random codes, scales in [2^-2, 2^2) (no NaN), alpha a power of two times 1..2. The
    /// swizzled buffer's padding columns (K / 16 rounded up to 4) of every row hold
    /// [`PADDING_SCALE`] (an E4M3 NaN): a kernel that lets them into a product fails verification.
    pub fn random(n: usize, k: usize, experts: usize, seed: u64) -> ExpertWeights {
        let mut rng = SplitMix64(seed);
        let code_bytes = n * k / 2;
        let sf_bytes = swizzled_len(n, k / 16);
        let mut codes = vec![0u8; code_bytes * experts];
        for chunk in codes.chunks_mut(8) {
            let v = rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        let mut scales = vec![0u8; sf_bytes * experts];
        for b in scales.iter_mut() {
            *b = 0x28 + rng.below(0x20) as u8;
        }
        for expert in scales.chunks_mut(sf_bytes) {
            fill_padding_columns(expert, n, k / 16, PADDING_SCALE);
        }
        let alpha = (0..experts).map(|_| (1.0 + rng.below(8) as f32 / 8.0) / 64.0).collect();
        ExpertWeights { n, k, experts, codes, scales, alpha }
    }

    pub fn code_bytes(&self) -> usize {
        self.n * self.k / 2
    }

    pub fn scale_bytes(&self) -> usize {
        swizzled_len(self.n, self.k / 16)
    }

    /// Row `row` of expert `e`, dequantized (without alpha).
    pub fn dequant_row(&self, e: usize, row: usize, out: &mut [f32]) {
        let codes = &self.codes[e * self.code_bytes() + row * self.k / 2..][..self.k / 2];
        let scales = &self.scales[e * self.scale_bytes()..][..self.scale_bytes()];
        let ksf_pad = padded_scale_cols(self.k / 16);
        for kb in 0..self.k / 16 {
            let s = e4m3_decode(scales[swizzled_offset(row, kb, ksf_pad)]);
            for j in 0..8 {
                let byte = codes[kb * 8 + j];
                out[kb * 16 + 2 * j] = e2m1_decode(byte & 15) * s;
                out[kb * 16 + 2 * j + 1] = e2m1_decode(byte >> 4) * s;
            }
        }
    }

    /// alpha * dot(deq(W[e][row]), a) in f32.
    fn dot(&self, e: usize, row: usize, a: &[f32], alpha: f32, scratch: &mut [f32]) -> f32 {
        self.dequant_row(e, row, scratch);
        let acc: f32 = scratch.iter().zip(a).map(|(w, x)| w * x).sum();
        acc * alpha
    }
}

/// NVFP4 activation rows in the kernels' layout: codes `[rows, k/2]` (element 2j in the low
/// nibble) and UE4M3 scales in the swizzled 128x4 layout (rows padded to 128), with their input
/// scale (the activation global scale).
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Rows {
    pub rows: usize,
    pub k: usize,
    pub codes: Vec<u8>,
    pub sf: Vec<u8>,
    pub scale: f32,
}

impl Nvfp4Rows {
    /// bf16 rows `[rows, k]` quantized with the static input scale `scale`: bit for bit the GPU
    /// activation quantizer (`common/quantize.cuh`) and the W4A4 gate_up epilogue's H.
    pub fn quantize(x: &[bf16], rows: usize, k: usize, scale: f32) -> Result<Self, FormatError> {
        let q = crate::format::quantize_activations(x, rows, k, scale)?;
        let sf = q.scales_swizzled();
        Ok(Nvfp4Rows { rows, k, codes: q.codes, sf, scale })
    }

    /// Row `r` block-scaled (e2m1 * e4m3, without the input scale: that is part of alpha).
    pub fn dequant_row(&self, r: usize) -> Vec<f32> {
        let ksf_pad = padded_scale_cols(self.k / 16);
        let codes = &self.codes[r * self.k / 2..][..self.k / 2];
        let mut out = vec![0f32; self.k];
        for kb in 0..self.k / 16 {
            let s = e4m3_decode(self.sf[swizzled_offset(r, kb, ksf_pad)]);
            for j in 0..8 {
                let byte = codes[kb * 8 + j];
                out[kb * 16 + 2 * j] = e2m1_decode(byte & 15) * s;
                out[kb * 16 + 2 * j + 1] = e2m1_decode(byte >> 4) * s;
            }
        }
        out
    }

    /// The first place where `codes` / `sf` (a kernel's output in the same layout) differ from
    /// these rows, over every code byte and every scale byte of a real row and scale column; the
    /// padding of the scale layout is not compared (the kernels do not write it).
    pub fn first_difference(&self, codes: &[u8], sf: &[u8]) -> Option<String> {
        let ksf = self.k / 16;
        let ksf_pad = padded_scale_cols(ksf);
        for r in 0..self.rows {
            for kb in 0..ksf {
                let o = swizzled_offset(r, kb, ksf_pad);
                if sf.get(o) != Some(&self.sf[o]) {
                    return Some(format!(
                        "row {r}, scale block {kb}: scale {:?} instead of {:#04x}",
                        sf.get(o),
                        self.sf[o]
                    ));
                }
            }
            let row = r * self.k / 2..(r + 1) * self.k / 2;
            if let Some(j) = (row.clone()).find(|&i| codes.get(i) != Some(&self.codes[i])) {
                let c = 2 * (j - row.start);
                return Some(format!(
                    "row {r}, elements {c}..{}: codes {:?} instead of {:#04x}",
                    c + 1,
                    codes.get(j),
                    self.codes[j]
                ));
            }
        }
        None
    }
}

/// The activations a projection reads: bf16 rows `[rows, k]`, or NVFP4 rows (W4A4).
#[derive(Debug, Clone, Copy)]
pub enum Activations<'a> {
    Bf16 { x: &'a [bf16], k: usize },
    Nvfp4(&'a Nvfp4Rows),
}

impl Activations<'_> {
    /// Row `r` as the kernel multiplies it (bf16 widened, or NVFP4 block-scaled values).
    pub fn row(&self, r: usize) -> Vec<f32> {
        match self {
            Activations::Bf16 { x, k } => x[r * k..][..*k].iter().map(|v| v.to_f32()).collect(),
            Activations::Nvfp4(q) => q.dequant_row(r),
        }
    }
}

/// x / (1 + e^-x), as the kernel computes it.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// H row of sorted row `r` (f32, before rounding): SiLU(gate) * up of the expert of `r` on
/// `X[token]` (`x`: `[tokens, hidden]`); `alpha[e]` is the expert's scale (W4A4: input scale times
/// weight_scale_2).
pub fn gate_up_row(
    w: &ExpertWeights,
    alpha: &[f32],
    s: &RouteSchedule,
    top_k: usize,
    x: &Activations<'_>,
    r: u32,
) -> Vec<f32> {
    let e = s.expert_of_row(r) as usize;
    let token = s.sorted_ids[r as usize] as usize / top_k;
    let xr = x.row(token);
    let inter = w.n / 2;
    let mut scratch = vec![0f32; w.k];
    (0..inter)
        .map(|j| {
            let g = w.dot(e, j, &xr, alpha[e], &mut scratch);
            let u = w.dot(e, inter + j, &xr, alpha[e], &mut scratch);
            silu(g) * u
        })
        .collect()
}

/// Output row of sorted row `r` of the down projection (f32) on `H` (sorted rows `[rows, inter]`).
pub fn down_row(
    w: &ExpertWeights,
    alpha: &[f32],
    s: &RouteSchedule,
    h: &Activations<'_>,
    r: u32,
) -> Vec<f32> {
    let e = s.expert_of_row(r) as usize;
    let hr = h.row(r as usize);
    let mut scratch = vec![0f32; w.k];
    (0..w.n).map(|n| w.dot(e, n, &hr, alpha[e], &mut scratch)).collect()
}

/// `Y [tokens, n]` from the routed rows, exactly as moe_finalize computes it.
pub fn finalize(
    rows: &[bf16],
    n: usize,
    weights: &[f32],
    inverse: &[i32],
    top_k: usize,
) -> Vec<bf16> {
    let tokens = inverse.len() / top_k;
    let mut y = vec![bf16::ZERO; tokens * n];
    for t in 0..tokens {
        for c in 0..n {
            let mut acc = 0f32;
            for s in 0..top_k {
                let pos = inverse[t * top_k + s];
                if pos >= 0 {
                    acc = weights[t * top_k + s].mul_add(rows[pos as usize * n + c].to_f32(), acc);
                }
            }
            y[t * n + c] = bf16::from_f32(acc);
        }
    }
    y
}

/// Whether a GPU value matches the reference: within 2% of it plus 0.2% of the row's largest
/// magnitude (the f32 summation order and the bf16 rounding of the output differ).
pub fn matches(got: bf16, want: f32, row_max: f32) -> bool {
    let g = got.to_f32();
    g.is_finite() && (g - want).abs() <= 0.02 * want.abs() + 2e-3 * row_max
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::schedule::{draw_routing, Routing};

    #[test]
    fn dequantized_rows_follow_the_nibble_order_and_the_swizzled_scales() {
        let mut w = ExpertWeights::random(128, 64, 2, 1);
        // expert 1, row 5: codes 0x21 (k0 = 0.5, k1 = 1.0), scale block 0 = 2.0 (E4M3 0x40)
        let cb = w.code_bytes();
        w.codes[cb + 5 * 32] = 0x21;
        let sb = w.scale_bytes();
        w.scales[sb + swizzled_offset(5, 0, 4)] = 0x40;
        let mut row = vec![0f32; 64];
        w.dequant_row(1, 5, &mut row);
        assert_eq!(row[0], 1.0);
        assert_eq!(row[1], 2.0);
    }

    /// A K of 176 leaves one padding scale column (11 of 12): it holds NaN in every row, and
    /// the dequantized rows, which read only the 11 real columns, are finite.
    #[test]
    fn random_weights_poison_the_padding_scale_columns_only() {
        let w = ExpertWeights::random(40, 176, 2, 9);
        let mut row = vec![0f32; 176];
        for e in 0..2 {
            let sf = &w.scales[e * w.scale_bytes()..][..w.scale_bytes()];
            for r in 0..40 {
                for kb in 0..12 {
                    let poisoned = sf[swizzled_offset(r, kb, 12)] == PADDING_SCALE;
                    assert_eq!(poisoned, kb == 11, "expert {e} row {r} column {kb}");
                }
                w.dequant_row(e, r, &mut row);
                assert!(row.iter().all(|v| v.is_finite()), "expert {e} row {r}");
            }
        }
    }

    #[test]
    fn nvfp4_rows_are_the_activation_quantizer_in_the_swizzled_layout() {
        let (rows, k) = (5, 96);
        let x: Vec<bf16> =
            (0..rows * k).map(|i| bf16::from_f32(((i * 37) % 29) as f32 / 7.0 - 2.0)).collect();
        let q = Nvfp4Rows::quantize(&x, rows, k, 0.01).unwrap();
        let plain = crate::format::quantize_activations(&x, rows, k, 0.01).unwrap();
        let deq = plain.dequantize_block_scaled();
        for r in 0..rows {
            assert_eq!(q.dequant_row(r), deq[r * k..(r + 1) * k]);
        }
        // 128 padded rows x 8 scale columns (6 padded to 8)
        assert_eq!(q.sf.len(), 128 * 8);
        assert_eq!(q.first_difference(&q.codes, &q.sf), None);
        let mut sf = q.sf.clone();
        sf[swizzled_offset(100, 7, 8)] = 0x55; // padding: not compared
        assert_eq!(q.first_difference(&q.codes, &sf), None);
        sf[swizzled_offset(4, 5, 8)] ^= 1;
        assert!(q.first_difference(&q.codes, &sf).unwrap().contains("row 4, scale block 5"));
        let mut codes = q.codes.clone();
        codes[3 * 48 + 10] ^= 0x10;
        assert!(q.first_difference(&codes, &q.sf).unwrap().contains("row 3, elements 20..21"));
        assert!(q.first_difference(&codes[..10], &q.sf).is_some());
    }

    #[test]
    fn w4a4_gate_up_multiplies_the_block_scaled_activations() {
        let k = 64;
        let w = ExpertWeights::random(32, k, 2, 9);
        let ids = [1, 0, 0, 1];
        let s = RouteSchedule::build(&ids, 0, 2);
        let x: Vec<bf16> = (0..2 * k).map(|i| bf16::from_f32((i % 11) as f32 - 5.0)).collect();
        let q = Nvfp4Rows::quantize(&x, 2, k, 0.004).unwrap();
        let alpha: Vec<f32> = w.alpha.iter().map(|a| a * 0.004).collect();
        let h = gate_up_row(&w, &alpha, &s, 2, &Activations::Nvfp4(&q), 3);
        // sorted row 3 is flat id 3: token 1, expert 1
        assert_eq!((s.sorted_ids[3], s.expert_of_row(3)), (3, 1));
        let xr = q.dequant_row(1);
        let mut g = vec![0f32; k];
        let mut u = vec![0f32; k];
        w.dequant_row(1, 2, &mut g);
        w.dequant_row(1, 16 + 2, &mut u);
        let dot = |a: &[f32]| a.iter().zip(&xr).map(|(p, q)| p * q).sum::<f32>() * alpha[1];
        assert_eq!(h[2], silu(dot(&g)) * dot(&u));
        // the block-scaled values approximate X / input scale
        for (j, v) in xr.iter().enumerate() {
            let want = x[k + j].to_f32();
            assert!((v * 0.004 - want).abs() <= 0.25 * want.abs() + 0.1, "{j}: {v} for {want}");
        }
    }

    #[test]
    fn gate_up_is_silu_of_gate_times_up_and_finalize_sums_in_slot_order() {
        let shape_k = 64;
        let w = ExpertWeights::random(32, shape_k, 4, 3);
        let ids = draw_routing(5, 3, 2, 4, Routing::Uniform);
        let s = RouteSchedule::build(&ids, 0, 4);
        let x: Vec<bf16> = (0..3 * shape_k).map(|i| bf16::from_f32((i % 7) as f32 - 3.0)).collect();
        let h = gate_up_row(&w, &w.alpha, &s, 2, &Activations::Bf16 { x: &x, k: shape_k }, 0);
        // by hand for row 0, column 3
        let e = s.expert_of_row(0) as usize;
        let t = s.sorted_ids[0] as usize / 2;
        let mut g = vec![0f32; shape_k];
        let mut u = vec![0f32; shape_k];
        w.dequant_row(e, 3, &mut g);
        w.dequant_row(e, 16 + 3, &mut u);
        let gd: f32 =
            g.iter().zip(&x[t * shape_k..]).map(|(a, b)| a * b.to_f32()).sum::<f32>() * w.alpha[e];
        let ud: f32 =
            u.iter().zip(&x[t * shape_k..]).map(|(a, b)| a * b.to_f32()).sum::<f32>() * w.alpha[e];
        assert_eq!(h[3], silu(gd) * ud);
        // finalize: token 0's two rows weighted 0.25 and 0.5
        let rows: Vec<bf16> = (0..6 * 8).map(|i| bf16::from_f32(i as f32)).collect();
        let y = finalize(&rows, 8, &[0.25, 0.5, 1.0, 1.0, 1.0, 1.0], &s.inverse, 2);
        let p0 = s.inverse[0] as usize;
        let p1 = s.inverse[1] as usize;
        assert_eq!(y[0].to_f32(), 0.5f32.mul_add((p1 * 8) as f32, 0.25 * (p0 * 8) as f32));
    }
}
