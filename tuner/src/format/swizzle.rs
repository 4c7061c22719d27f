//! The swizzled "128x4" scale-factor layout the block-scaled kernels read, and conversions from and
//! to the plain row-major `[rows, K/16]` layout of checkpoints.
//!
//! Rows are padded to a multiple of 128 and scale columns to a multiple of 4 (padding bytes are
//! zero). Each 128x4 tile is 512 contiguous bytes; within it, the scale of row `m`, column `k` sits
//! at `(m % 32) * 16 + ((m / 32) % 4) * 4 + k % 4`, so the four scales of one row for one K=64 step
//! form one aligned 32-bit word.

use super::FormatError;

/// Rows of the swizzled buffer: `rows` rounded up to 128.
pub fn padded_rows(rows: usize) -> usize {
    rows.div_ceil(128) * 128
}

/// Scale columns of the swizzled buffer: `scale_cols` (= K/16) rounded up to 4.
pub fn padded_scale_cols(scale_cols: usize) -> usize {
    scale_cols.div_ceil(4) * 4
}

/// Bytes of the swizzled scale buffer of a `rows x scale_cols` scale matrix.
pub fn swizzled_len(rows: usize, scale_cols: usize) -> usize {
    padded_rows(rows) * padded_scale_cols(scale_cols)
}

/// Byte offset of the scale of (`row`, scale column `kb`); `ksf_pad` = K/16 rounded up to 4.
/// Same formula as `fp4tune::swizzled_sf_offset` in `templates/common/params.cuh`.
#[inline]
pub fn swizzled_offset(row: usize, kb: usize, ksf_pad: usize) -> usize {
    ((row / 128) * (ksf_pad / 4) + kb / 4) * 512 + (row % 32) * 16 + ((row / 32) % 4) * 4 + kb % 4
}

/// What tests and benchmarks write into the padding scale columns of their random operands: E4M3
/// NaN ([`fill_padding_columns`]).
pub const PADDING_SCALE: u8 = 0x7F;

/// Write `byte` into the padding scale columns (`scale_cols` .. rounded up to 4) of the `rows`
/// real rows of a swizzled buffer. Tests and benchmarks write E4M3 NaN there: a kernel that lets
/// a padding scale into a product (a K that 64 does not divide) fails verification.
pub fn fill_padding_columns(swizzled: &mut [u8], rows: usize, scale_cols: usize, byte: u8) {
    let ksf_pad = padded_scale_cols(scale_cols);
    for row in 0..rows {
        for kb in scale_cols..ksf_pad {
            swizzled[swizzled_offset(row, kb, ksf_pad)] = byte;
        }
    }
}

/// Row-major `[rows, scale_cols]` scales -> swizzled buffer of `swizzled_len` bytes.
///
/// Errors if `scales.len() != rows * scale_cols`.
pub fn swizzle_scales(
    scales: &[u8],
    rows: usize,
    scale_cols: usize,
) -> Result<Vec<u8>, FormatError> {
    if scales.len() != rows * scale_cols {
        return Err(FormatError::Shape {
            what: "row-major scales".into(),
            problem: format!("{} bytes for {rows} x {scale_cols}", scales.len()),
        });
    }
    let ksf_pad = padded_scale_cols(scale_cols);
    let mut out = vec![0u8; swizzled_len(rows, scale_cols)];
    for r in 0..rows {
        for c in 0..scale_cols {
            out[swizzled_offset(r, c, ksf_pad)] = scales[r * scale_cols + c];
        }
    }
    Ok(out)
}

/// Swizzled buffer -> row-major `[rows, scale_cols]` scales (padding dropped).
///
/// Errors if `swizzled.len() != swizzled_len(rows, scale_cols)`.
pub fn unswizzle_scales(
    swizzled: &[u8],
    rows: usize,
    scale_cols: usize,
) -> Result<Vec<u8>, FormatError> {
    if swizzled.len() != swizzled_len(rows, scale_cols) {
        return Err(FormatError::Shape {
            what: "swizzled scales".into(),
            problem: format!(
                "{} bytes for {rows} x {scale_cols} (want {})",
                swizzled.len(),
                swizzled_len(rows, scale_cols)
            ),
        });
    }
    let ksf_pad = padded_scale_cols(scale_cols);
    let mut out = vec![0u8; rows * scale_cols];
    for r in 0..rows {
        for c in 0..scale_cols {
            out[r * scale_cols + c] = swizzled[swizzled_offset(r, c, ksf_pad)];
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The torch recipe (vLLM / FlashInfer `swizzle_blockscale`): pad to (Mp, Kp), then
    /// `view(Mt, 4, 32, Kt, 4).permute(0, 3, 2, 1, 4).contiguous()`. Computed here as an explicit
    /// strided gather, independent of the closed-form offset.
    fn torch_style(padded: &[u8], mp: usize, kp: usize) -> Vec<u8> {
        let (mt, kt) = (mp / 128, kp / 4);
        // Input view dims (Mt, 4, 32, Kt, 4), row-major strides.
        let dims_in = [mt, 4, 32, kt, 4];
        let mut strides_in = [0usize; 5];
        let mut s = 1;
        for d in (0..5).rev() {
            strides_in[d] = s;
            s *= dims_in[d];
        }
        let perm = [0usize, 3, 2, 1, 4];
        let dims_out: Vec<usize> = perm.iter().map(|&p| dims_in[p]).collect();
        let mut out = Vec::with_capacity(padded.len());
        let mut idx = [0usize; 5];
        loop {
            let src: usize = (0..5).map(|d| idx[d] * strides_in[perm[d]]).sum();
            out.push(padded[src]);
            // Increment the output multi-index, last dim fastest.
            let mut d = 5;
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < dims_out[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }

    #[test]
    fn matches_torch_view_permute() {
        for (rows, cols) in [(128, 4), (256, 8), (200, 7), (1, 1), (130, 12), (384, 5)] {
            let scales: Vec<u8> = (0..rows * cols).map(|i| (i * 37 % 251) as u8 + 1).collect();
            let (mp, kp) = (padded_rows(rows), padded_scale_cols(cols));
            let mut padded = vec![0u8; mp * kp];
            for r in 0..rows {
                padded[r * kp..r * kp + cols].copy_from_slice(&scales[r * cols..(r + 1) * cols]);
            }
            let want = torch_style(&padded, mp, kp);
            let got = swizzle_scales(&scales, rows, cols).unwrap();
            assert_eq!(got, want, "rows {rows} cols {cols}");
            assert_eq!(unswizzle_scales(&got, rows, cols).unwrap(), scales);
        }
        assert!(swizzle_scales(&[1, 2, 3], 2, 2).is_err());
        assert!(unswizzle_scales(&[0; 511], 1, 1).is_err());
    }

    #[test]
    fn offsets_are_a_bijection_and_rows_form_words() {
        let (rows, kp) = (256, 8);
        let mut seen = vec![false; rows * kp];
        for r in 0..rows {
            for k in 0..kp {
                let o = swizzled_offset(r, k, kp);
                assert!(!seen[o], "offset {o} hit twice");
                seen[o] = true;
            }
            // Four scales of one row for one K=64 step: one aligned 32-bit word.
            let o = swizzled_offset(r, 4, kp);
            assert_eq!(o % 4, 0);
            assert_eq!(swizzled_offset(r, 7, kp), o + 3);
        }
        assert_eq!(swizzled_offset(1, 0, 4), 16);
        assert_eq!(swizzled_offset(32, 0, 4), 4);
        assert_eq!(swizzled_offset(128, 0, 4), 512);
        assert_eq!(swizzled_offset(0, 4, 8), 512);
        assert_eq!(swizzled_offset(128, 0, 8), 1024);
    }
}
