//! The CPU mirror of `templates/moe/epilogue.cuh`, the store of one warp's grouped tile shared by
//! the sm90 and sm120 grouped kernels: which output element each lane's accumulator becomes
//! ([`gate_up_position`], [`down_position`]) and, for the W4A4 gate_up, the NVFP4 quantization of
//! H across the lanes of a warp ([`store_h_nvfp4`]: the warp-shuffle reductions of each 16-column
//! block, the packing of the codes, which lane stores which bytes). The tests run whole grids of
//! CTAs through it and compare with the activation quantizer of `format` (what the kernel must
//! produce bit for bit) and check that every element is written exactly once.

use crate::format::swizzle::{padded_scale_cols, swizzled_offset};
use crate::format::{e2m1_encode, e4m3_decode, e4m3_encode};

/// Lanes of a warp.
pub const LANES: usize = 32;

/// gate_up: (tile-local row, H column) of accumulator elements `e` (gate) and `e + 2` (up) of m16
/// tile `i`, n8 tile `q` of `lane` (`e` 0 or 1) in the warp whose first weight row is `pw0` and
/// first tile-local row `qw0`.
pub fn gate_up_position(pw0: u32, qw0: u32, i: u32, q: u32, e: u32, lane: u32) -> (u32, u32) {
    let (g, t) = (lane >> 2, lane & 3);
    (qw0 + 8 * q + 2 * t + e, pw0 / 2 + 8 * i + g)
}

/// down: (tile-local row, output column) of accumulator element `e` (0..4) of m16 tile `i`, n8
/// tile `q` of `lane`.
pub fn down_position(pw0: u32, qw0: u32, i: u32, q: u32, e: u32, lane: u32) -> (u32, u32) {
    let (g, t) = (lane >> 2, lane & 3);
    (qw0 + 8 * q + 2 * t + (e & 1), pw0 + 16 * i + 8 * (e >> 1) + g)
}

/// Where `store_h_nvfp4` writes: H as NVFP4 codes `[rows, inter/2]` and swizzled scales (sorted
/// rows padded to 128), with a count of the writes of every 8-byte code group and scale byte.
#[derive(Debug, Clone)]
pub struct HOut {
    pub inter: usize,
    pub h_scale: f32,
    pub codes: Vec<u8>,
    pub sf: Vec<u8>,
    pub code_writes: Vec<u32>,
    pub sf_writes: Vec<u32>,
}

impl HOut {
    /// Buffers for `rows` routed rows, filled with `fill` (bytes no one writes keep it).
    pub fn new(rows: usize, inter: usize, h_scale: f32, fill: u8) -> Self {
        let sf_len = crate::format::swizzled_len(rows, inter / 16);
        HOut {
            inter,
            h_scale,
            codes: vec![fill; rows * inter / 2],
            sf: vec![fill; sf_len],
            code_writes: vec![0; rows * inter / 16],
            sf_writes: vec![0; sf_len],
        }
    }
}

/// `store_h_nvfp4` for one warp: `h[lane][(i * q_tiles + q) * 2 + e]` is the lane's bf16-rounded H
/// value of column `c0 + 8 i + g`, tile-local row `qw0 + 8 q + 2 t + e`; tile rows from `rows` on
/// and columns from `inter` on are computed but not stored. Every lane runs the same arithmetic as
/// the kernel; the shuffles are exchanges between the lane arrays.
#[allow(clippy::too_many_arguments)]
pub fn store_h_nvfp4(
    p_tiles: usize,
    q_tiles: usize,
    h: &[Vec<f32>; LANES],
    row0: usize,
    rows: usize,
    c0: usize,
    qw0: usize,
    out: &mut HOut,
) {
    store_blocks(&G_BITS, p_tiles, q_tiles, h, row0, rows, c0, qw0, out)
}

/// The lane-index bits a block's reduction runs over (`__shfl_xor_sync` distances): g = lane / 4.
const G_BITS: [usize; 3] = [4, 8, 16];

/// `store_h_nvfp4` with the shuffle distances of its reductions as a parameter (tests substitute
/// wrong ones).
#[allow(clippy::too_many_arguments)]
fn store_blocks(
    reduce: &[usize; 3],
    p_tiles: usize,
    q_tiles: usize,
    h: &[Vec<f32>; LANES],
    row0: usize,
    rows: usize,
    c0: usize,
    qw0: usize,
    out: &mut HOut,
) {
    assert!(p_tiles % 2 == 0, "a 16-column block of H is two m16 tiles of one warp");
    let inter = out.inter;
    let ksf_pad = padded_scale_cols(inter / 16);
    let at = |i: usize, q: usize, e: usize| (i * q_tiles + q) * 2 + e;
    for j in 0..p_tiles / 2 {
        for q in 0..q_tiles {
            for e in 0..2 {
                let x0: [f32; LANES] = std::array::from_fn(|l| h[l][at(2 * j, q, e)]);
                let x1: [f32; LANES] = std::array::from_fn(|l| h[l][at(2 * j + 1, q, e)]);
                let mut amax: [f32; LANES] =
                    std::array::from_fn(|l| 0f32.max(x0[l].abs()).max(x1[l].abs()));
                for &d in reduce {
                    amax = std::array::from_fn(|l| amax[l].max(amax[l ^ d]));
                }
                let mut sf = [0u8; LANES];
                let mut w0 = [0u32; LANES];
                let mut w1 = [0u32; LANES];
                for l in 0..LANES {
                    let s = amax[l] / 6.0;
                    let s = s / out.h_scale;
                    sf[l] = e4m3_encode(s);
                    let sff = e4m3_decode(sf[l]);
                    if sff != 0.0 {
                        let dq = sff * out.h_scale;
                        let g = l >> 2;
                        w0[l] = (e2m1_encode(x0[l] / dq) as u32) << (4 * g);
                        w1[l] = (e2m1_encode(x1[l] / dq) as u32) << (4 * g);
                    }
                }
                for &d in reduce {
                    w0 = std::array::from_fn(|l| w0[l] | w0[l ^ d]);
                    w1 = std::array::from_fn(|l| w1[l] | w1[l ^ d]);
                }
                for l in 0..LANES {
                    let (g, t) = (l >> 2, l & 3);
                    let m = qw0 + 8 * q + 2 * t + e;
                    let col = c0 + 16 * j;
                    if g == 0 && m < rows && col < inter {
                        let r = row0 + m;
                        let o = r * inter / 2 + col / 2;
                        out.codes[o..o + 4].copy_from_slice(&w0[l].to_le_bytes());
                        out.codes[o + 4..o + 8].copy_from_slice(&w1[l].to_le_bytes());
                        out.code_writes[o / 8] += 1;
                        let so = swizzled_offset(r, col / 16, ksf_pad);
                        out.sf[so] = sf[l];
                        out.sf_writes[so] += 1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::reference::Nvfp4Rows;
    use crate::moe::schedule::{draw_routing, RouteSchedule, Routing, SplitMix64, TILE_BLOCK_M};
    use half::bf16;

    /// H values with every path of the quantizer: random, zero blocks, tiny (scale 0), huge
    /// (scale saturates), exact E2M1 ties, NaN and infinities.
    fn h_values(rows: usize, inter: usize, seed: u64) -> Vec<bf16> {
        let mut rng = SplitMix64(seed);
        let mut h = Vec::with_capacity(rows * inter);
        for r in 0..rows {
            for c in 0..inter {
                let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
                let v = match (r * inter + c) / 16 % 7 {
                    0 => rng.below(4001) as f32 / 1000.0 - 2.0,
                    1 => 0.0,
                    2 => sign * 1e-30,
                    3 => sign * 1e6 * (1 + rng.below(9)) as f32,
                    4 => sign * [3.0, 0.125, 0.375, 0.625, 0.875, 1.25, 1.75, 2.5][c % 8],
                    5 => match c % 16 {
                        3 => f32::INFINITY,
                        9 => f32::NAN,
                        _ => sign * rng.below(1000) as f32,
                    },
                    _ => sign * 2f32.powi(rng.below(30) as i32 - 15),
                };
                h.push(bf16::from_f32(v));
            }
        }
        h
    }

    /// Run every CTA and warp of a gate_up grid (block_n weight rows over warps_n warps, tiles of
    /// block_m rows of `schedule`) through the epilogue mirror on the H of `h`; rows of a tile past
    /// its row count hold junk, as in the kernel (clamped rows).
    #[allow(clippy::too_many_arguments)]
    fn run_grid(
        reduce: &[usize; 3],
        h: &[bf16],
        inter: usize,
        schedule: &RouteSchedule,
        block_m: u32,
        block_n: u32,
        warps_n: u32,
        h_scale: f32,
    ) -> HOut {
        let rows = schedule.rows() as usize;
        let list = TILE_BLOCK_M.iter().position(|&b| b == block_m).unwrap();
        let p_tiles = (block_n / warps_n / 16) as usize;
        let q_tiles = (block_m / 8) as usize;
        let mut out = HOut::new(rows, inter, h_scale, 0xA5);
        for bx in 0..(2 * inter as u32).div_ceil(block_n) {
            for wmn in 0..warps_n {
                let pw0 = bx * block_n + wmn * (block_n / warps_n);
                for tile in &schedule.tiles[list] {
                    let lanes: [Vec<f32>; LANES] = std::array::from_fn(|lane| {
                        let mut v = vec![0f32; p_tiles * q_tiles * 2];
                        for i in 0..p_tiles {
                            for q in 0..q_tiles {
                                for e in 0..2 {
                                    let (m, col) = gate_up_position(
                                        pw0,
                                        0,
                                        i as u32,
                                        q as u32,
                                        e as u32,
                                        lane as u32,
                                    );
                                    let (m, col) = (m as usize, col as usize);
                                    v[(i * q_tiles + q) * 2 + e] =
                                        if m < tile.rows as usize && col < inter {
                                            h[(tile.first_row as usize + m) * inter + col].to_f32()
                                        } else {
                                            f32::NAN
                                        };
                                }
                            }
                        }
                        v
                    });
                    store_blocks(
                        reduce,
                        p_tiles,
                        q_tiles,
                        &lanes,
                        tile.first_row as usize,
                        tile.rows as usize,
                        pw0 as usize / 2,
                        0,
                        &mut out,
                    );
                }
            }
        }
        out
    }

    #[test]
    fn the_epilogue_quantizes_h_like_the_activation_quantizer_writing_each_byte_once() {
        for (inter, block_m, block_n, warps_n, tokens, routing) in [
            (256usize, 8u32, 32u32, 1u32, 5u32, Routing::Uniform),
            (256, 16, 64, 2, 40, Routing::Skewed),
            (256, 32, 64, 1, 64, Routing::Uniform),
            (2048, 8, 128, 2, 3, Routing::Skewed),
            (96, 16, 128, 2, 33, Routing::Uniform), // warps past inter; 6 scale columns (padded)
        ] {
            let ids = draw_routing(tokens as u64, tokens, 8, 64, routing);
            let s = RouteSchedule::build(&ids, 0, 64);
            let rows = s.rows() as usize;
            let h = h_values(rows, inter, inter as u64 + tokens as u64);
            let h_scale = 0.37;
            let out = run_grid(&G_BITS, &h, inter, &s, block_m, block_n, warps_n, h_scale);
            let want = Nvfp4Rows::quantize(&h, rows, inter, h_scale).unwrap();
            let case = format!("inter {inter} block_m {block_m} block_n {block_n} B {tokens}");
            assert_eq!(want.first_difference(&out.codes, &out.sf), None, "{case}");
            assert!(out.code_writes.iter().all(|&w| w == 1), "{case}: code groups");
            // every real scale byte once, no padding byte at all
            let ksf_pad = padded_scale_cols(inter / 16);
            for r in 0..crate::format::padded_rows(rows) {
                for kb in 0..ksf_pad {
                    let o = swizzled_offset(r, kb, ksf_pad);
                    let real = r < rows && kb < inter / 16;
                    assert_eq!(out.sf_writes[o], real as u32, "{case}: row {r} block {kb}");
                }
            }
        }
    }

    #[test]
    fn epilogue_mistakes_are_caught() {
        let (inter, tokens) = (128usize, 9u32);
        let ids = draw_routing(2, tokens, 8, 16, Routing::Uniform);
        let s = RouteSchedule::build(&ids, 0, 16);
        let rows = s.rows() as usize;
        let h = h_values(rows, inter, 3);
        let want = Nvfp4Rows::quantize(&h, rows, inter, 0.5).unwrap();
        let good = run_grid(&G_BITS, &h, inter, &s, 8, 64, 1, 0.5);
        assert_eq!(want.first_difference(&good.codes, &good.sf), None);
        // another input scale gives other bytes
        let other = run_grid(&G_BITS, &h, inter, &s, 8, 64, 1, 0.25);
        assert!(want.first_difference(&other.codes, &other.sf).is_some());
        // reducing over t (other rows) instead of one of g's bits mixes rows into a block
        let rows_mixed = run_grid(&[1, 8, 16], &h, inter, &s, 8, 64, 1, 0.5);
        assert!(want.first_difference(&rows_mixed.codes, &rows_mixed.sf).is_some());
        // a reduction that misses a g bit sees half a block
        let half_block = run_grid(&[4, 8, 8], &h, inter, &s, 8, 64, 1, 0.5);
        assert!(want.first_difference(&half_block.codes, &half_block.sf).is_some());
    }

    #[test]
    fn every_output_element_has_one_lane() {
        // one warp of 2 x 2 tiles: gate_up covers 16 columns x 16 rows, down 32 x 16, once each
        let mut gu = [[0u32; 16]; 16];
        let mut dn = [[0u32; 32]; 16];
        for lane in 0..32 {
            for i in 0..2 {
                for q in 0..2 {
                    for e in 0..2 {
                        let (m, c) = gate_up_position(64, 0, i, q, e, lane);
                        gu[m as usize][c as usize - 32] += 1;
                    }
                    for e in 0..4 {
                        let (m, n) = down_position(64, 0, i, q, e, lane);
                        dn[m as usize][n as usize - 64] += 1;
                    }
                }
            }
        }
        assert!(gu.iter().flatten().all(|&x| x == 1));
        assert!(dn.iter().flatten().all(|&x| x == 1));
    }
}
