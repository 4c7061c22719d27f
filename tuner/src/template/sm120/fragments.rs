//! CPU model of the SM120 block-scaled MMA and a mirror of the SM120 template's index math.
//!
//! Part 1, the instruction (PTX ISA, `mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale
//! .scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3`): for each lane and register, which A (row, k),
//! B (k, col), C/D (row, col) and scale (row or column, k-block) element it holds, and
//! [`execute_mma`], which runs one MMA from the 32 lanes' registers exactly as that table says.
//!
//! Part 2, the template (`templates/sm120/load.cuh`, `gemm.cuh`, `epilogue.cuh`): which global byte
//! each cp.async copies to which shared byte, which shared row each lane hands to ldmatrix, which
//! scale word each lane loads and with which selector, and where each accumulator lands in Y.
//! [`simulate_gemm`] runs a whole problem through that index math and the instruction model, so a
//! layout mistake in the template (mirrored here) shows up as a wrong product in a CPU test.
//! The formulas in [`IndexMath::TEMPLATE`] must stay identical to the `.cuh` ones.

use super::Sm120Layout;
use crate::template::GemmConfig;

// ---------------------------------------------------------------------------------------------
// Part 1: the instruction.

/// Lanes of a warp.
pub const LANES: usize = 32;

/// (row, k) of nibble `nib` (0..8, low nibble first) of A register `reg` (0..4) of `lane`.
pub fn a_element(lane: u32, reg: u32, nib: u32) -> (u32, u32) {
    let row = lane / 4 + 8 * (reg & 1);
    let k = (lane % 4) * 8 + nib + 32 * (reg >> 1);
    (row, k)
}

/// (k, col) of nibble `nib` of B register `reg` (0..2) of `lane`.
pub fn b_element(lane: u32, reg: u32, nib: u32) -> (u32, u32) {
    ((lane % 4) * 8 + nib + 32 * reg, lane / 4)
}

/// (row, col) of C/D register `i` (0..4) of `lane`.
pub fn c_element(lane: u32, i: u32) -> (u32, u32) {
    (lane / 4 + 8 * (i >> 1), 2 * (lane % 4) + (i & 1))
}

/// Row of SF_A whose scale word the MMA reads from `lane` under thread-id-a `tid_a`, if any.
/// Byte b of that word scales k in [16 b, 16 b + 16) (scale_vec::4X, byte-id 0).
pub fn sfa_row(lane: u32, tid_a: u32) -> Option<u32> {
    let t = lane % 4;
    (t / 2 == tid_a).then_some(lane / 4 + 8 * (t % 2))
}

/// Column of SF_B whose scale word the MMA reads from `lane` under thread-id-b `tid_b`, if any.
pub fn sfb_col(lane: u32, tid_b: u32) -> Option<u32> {
    (lane % 4 == tid_b).then_some(lane / 4)
}

/// Value of an E2M1 code (bit 3 sign): `format::e2m1_decode`, exact in f64.
pub fn e2m1_value(code: u8) -> f64 {
    crate::format::e2m1_decode(code) as f64
}

/// Value of a UE4M3 scale (E4M3 without sign: bias 7, subnormals, 0x7F is NaN).
pub fn ue4m3_value(bits: u8) -> f64 {
    crate::format::e4m3_decode(bits & 0x7f) as f64
}

/// The registers of one warp for one MMA, indexed by lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmaOperands {
    pub a: [[u32; 4]; LANES],
    pub b: [[u32; 2]; LANES],
    pub sfa: [u32; LANES],
    pub sfb: [u32; LANES],
    pub tid_a: u32,
    pub tid_b: u32,
}

/// D = (A x SF_A) * (B x SF_B) + C for one m16n8k64 MMA, from the lanes' registers per the PTX
/// fragment tables above; `c` and the result are indexed [lane][register]. Sums in f64.
pub fn execute_mma(ops: &MmaOperands, c: &[[f64; 4]; LANES]) -> [[f64; 4]; LANES] {
    let mut a = [[0u8; 64]; 16];
    let mut b = [[0u8; 8]; 64];
    let mut sfa = [[0u8; 4]; 16];
    let mut sfb = [[0u8; 4]; 8];
    for lane in 0..LANES as u32 {
        let l = lane as usize;
        for reg in 0..4 {
            for nib in 0..8 {
                let (r, k) = a_element(lane, reg, nib);
                a[r as usize][k as usize] = ((ops.a[l][reg as usize] >> (4 * nib)) & 15) as u8;
            }
        }
        for reg in 0..2 {
            for nib in 0..8 {
                let (k, col) = b_element(lane, reg, nib);
                b[k as usize][col as usize] = ((ops.b[l][reg as usize] >> (4 * nib)) & 15) as u8;
            }
        }
        if let Some(r) = sfa_row(lane, ops.tid_a) {
            sfa[r as usize] = ops.sfa[l].to_le_bytes();
        }
        if let Some(col) = sfb_col(lane, ops.tid_b) {
            sfb[col as usize] = ops.sfb[l].to_le_bytes();
        }
    }
    let mut d = *c;
    for (lane, dl) in d.iter_mut().enumerate() {
        for (i, di) in dl.iter_mut().enumerate() {
            let (r, col) = c_element(lane as u32, i as u32);
            let (r, col) = (r as usize, col as usize);
            for k in 0..64 {
                *di += e2m1_value(a[r][k])
                    * ue4m3_value(sfa[r][k / 16])
                    * e2m1_value(b[k][col])
                    * ue4m3_value(sfb[col][k / 16]);
            }
        }
    }
    d
}

// ---------------------------------------------------------------------------------------------
// Part 2: the template's index math.

/// Byte offset of scale (row, kb) in the swizzled 128x4 layout (`common/params.cuh`):
/// `format::swizzle::swizzled_offset` in the index math's u32s.
pub fn swizzled_sf_offset(row: u32, kb: u32, ksf_pad: u32) -> u32 {
    crate::format::swizzle::swizzled_offset(row as usize, kb as usize, ksf_pad as usize) as u32
}

/// log2 of the code rows sharing one 128-byte line (`Config::ROWS_PER_LINE_LOG2`).
pub fn rows_per_line_log2(l: &Sm120Layout) -> u32 {
    match l.row_chunks {
        2 => 2,
        4 => 1,
        _ => 0,
    }
}

/// `swizzle_chunk`: physical 16-byte chunk of logical chunk `chunk` in tile row `row`.
pub fn swizzle_chunk(l: &Sm120Layout, row: u32, chunk: u32) -> u32 {
    chunk ^ ((row >> rows_per_line_log2(l)) & (l.row_chunks - 1))
}

/// `code_offset`: byte of (row, logical chunk) inside a code tile.
pub fn code_offset(l: &Sm120Layout, row: u32, chunk: u32) -> u32 {
    row * l.row_bytes + swizzle_chunk(l, row, chunk) * 16
}

/// `a_frag_offset`: ldmatrix.x4 row address (relative to the P code tile) of `lane`.
pub fn a_frag_offset(l: &Sm120Layout, warp_p0: u32, mp: u32, step: u32, lane: u32) -> u32 {
    let row = warp_p0 + mp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    let chunk = 2 * step + (lane >> 4);
    code_offset(l, row, chunk)
}

/// `b_frag_offset`: ldmatrix row address (relative to the Q code tile) for tiles mq, mq + 1.
pub fn b_frag_offset(l: &Sm120Layout, warp_q0: u32, mq: u32, step: u32, lane: u32) -> u32 {
    let row = warp_q0 + (mq + (lane >> 4)) * 8 + (lane & 7);
    let chunk = 2 * step + ((lane >> 3) & 1);
    code_offset(l, row, chunk)
}

/// `sfa_row` of the template: tile row whose SF_A word `lane` loads for MMA tile `mp` (lanes 2, 3
/// of a quad duplicate lanes 0, 1, so either thread-id-a reads the same words).
pub fn tmpl_sfa_row(_l: &Sm120Layout, warp_p0: u32, mp: u32, lane: u32) -> u32 {
    warp_p0 + mp * 16 + (lane >> 2) + (lane & 1) * 8
}

/// `sfb_row` of the template: tile row (MMA column) whose SF_B word `lane` loads for tile group `group`.
pub fn tmpl_sfb_row(l: &Sm120Layout, warp_q0: u32, group: u32, lane: u32) -> u32 {
    let tile = (4 * group + (lane & 3)).min(l.mma_q - 1);
    warp_q0 + tile * 8 + (lane >> 2)
}

/// Selectors of MMA tile (mp, mq): (thread-id-a, thread-id-b) and the indices of its scale words
/// (`compute_stage`: one SF_A word per m16 tile with thread-id-a 0, one SF_B word per four n8 tiles
/// with thread-id-b mq % 4).
pub fn selectors(mp: u32, mq: u32) -> (u32, u32, usize, usize) {
    (0, mq & 3, mp as usize, (mq >> 2) as usize)
}

/// Warp position (wp, wq, wk) of warp `warp` (`gemm`: wq fastest, then wp, then wk).
pub fn warp_position(l: &Sm120Layout, warp: u32) -> (u32, u32, u32) {
    (warp / l.warps_q % l.warps_p, warp % l.warps_q, warp / (l.warps_q * l.warps_p))
}

/// Packs E2M1 codes two per byte: element 2j in the low nibble (ModelOpt / device layout).
pub fn pack_low_first(even: u8, odd: u8) -> u8 {
    (even & 15) | ((odd & 15) << 4)
}

/// The index functions a simulation uses; [`IndexMath::TEMPLATE`] is what the kernel does. Tests
/// substitute broken variants to show that the simulation catches layout mistakes.
#[derive(Debug, Clone, Copy)]
pub struct IndexMath {
    /// Packing of the activation and weight codes (the device layout is low nibble first for
    /// both). The same nibble swap on both operands would be invisible in the product (it permutes
    /// k inside one scale block on both sides), so a mistake can only show on one of them.
    pub pack_a: fn(u8, u8) -> u8,
    pub pack_w: fn(u8, u8) -> u8,
    pub a_frag: fn(&Sm120Layout, u32, u32, u32, u32) -> u32,
    pub b_frag: fn(&Sm120Layout, u32, u32, u32, u32) -> u32,
    pub sfa_row: fn(&Sm120Layout, u32, u32, u32) -> u32,
    pub sfb_row: fn(&Sm120Layout, u32, u32, u32) -> u32,
    pub selectors: fn(u32, u32) -> (u32, u32, usize, usize),
}

impl IndexMath {
    pub const TEMPLATE: IndexMath = IndexMath {
        pack_a: pack_low_first,
        pack_w: pack_low_first,
        a_frag: a_frag_offset,
        b_frag: b_frag_offset,
        sfa_row: tmpl_sfa_row,
        sfb_row: tmpl_sfb_row,
        selectors,
    };
}

/// ldmatrix (.b16, not transposed) of `num` 8x16-byte matrices: lane 8j + i supplies the address
/// of row i of matrix j; lane l receives in register j the little-endian word (l % 4) of row
/// (l / 4) of matrix j.
pub fn ldmatrix(smem: &[u8], addrs: &[u32; LANES], num: usize) -> [[u32; 4]; LANES] {
    let mut out = [[0u32; 4]; LANES];
    for (lane, regs) in out.iter_mut().enumerate() {
        for (j, reg) in regs.iter_mut().enumerate().take(num) {
            let at = (addrs[8 * j + lane / 4] + 4 * (lane as u32 % 4)) as usize;
            *reg = u32::from_le_bytes([smem[at], smem[at + 1], smem[at + 2], smem[at + 3]]);
        }
    }
    out
}

fn lds_u32(smem: &[u8], at: u32) -> u32 {
    let at = at as usize;
    u32::from_le_bytes([smem[at], smem[at + 1], smem[at + 2], smem[at + 3]])
}

/// One NVFP4 operand in logical form: codes[row][k] (E2M1, 0..16) and scales[row][k / 16] (UE4M3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nvfp4Matrix {
    pub rows: u32,
    pub k: u32,
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
}

impl Nvfp4Matrix {
    pub fn code(&self, row: u32, k: u32) -> u8 {
        self.codes[(row * self.k + k) as usize]
    }
    pub fn scale(&self, row: u32, kb: u32) -> u8 {
        self.scales[(row * (self.k / 16) + kb) as usize]
    }
    pub fn value(&self, row: u32, k: u32) -> f64 {
        e2m1_value(self.code(row, k)) * ue4m3_value(self.scale(row, k / 16))
    }

    /// Device layout: codes [rows, K/2] packed by `pack`, scales swizzled 128x4 (rows padded to 128,
    /// scale columns to 4; padding bytes hold `pad`).
    pub fn device(&self, pack: fn(u8, u8) -> u8, pad: u8) -> (Vec<u8>, Vec<u8>) {
        let mut codes = vec![0u8; (self.rows * self.k / 2) as usize];
        for r in 0..self.rows {
            for j in 0..self.k / 2 {
                codes[(r * self.k / 2 + j) as usize] =
                    pack(self.code(r, 2 * j), self.code(r, 2 * j + 1));
            }
        }
        let ksf = self.k / 16;
        let ksf_pad = ksf.div_ceil(4) * 4;
        let rows_pad = self.rows.div_ceil(128) * 128;
        let mut sf = vec![pad; (rows_pad * ksf_pad) as usize];
        for r in 0..self.rows {
            for kb in 0..ksf {
                sf[swizzled_sf_offset(r, kb, ksf_pad) as usize] = self.scale(r, kb);
            }
        }
        (codes, sf)
    }
}

/// Reference: Y[m][n] = sum_k deq(A)[m][k] * deq(W)[n][k] (no alpha).
pub fn reference_gemm(a: &Nvfp4Matrix, w: &Nvfp4Matrix) -> Vec<f64> {
    let mut y = vec![0.0; (a.rows * w.rows) as usize];
    for m in 0..a.rows {
        for n in 0..w.rows {
            y[(m * w.rows + n) as usize] = (0..a.k).map(|k| a.value(m, k) * w.value(n, k)).sum();
        }
    }
    y
}

/// Run the whole GEMM through the template's index math and the MMA model: every CTA of the grid,
/// every k-tile staged into a shared-memory image by the cp.async placement, every warp's
/// ldmatrix / scale loads and MMAs, the k-warp reduction, split-K in split order, and the
/// epilogue's (p, q) -> (m, n) mapping with its bounds. Returns Y [M][N] (no alpha) and whether any
/// element was written twice or any in-range element never (both are bugs).
pub fn simulate_gemm(
    cfg: &GemmConfig,
    a: &Nvfp4Matrix,
    w: &Nvfp4Matrix,
    math: &IndexMath,
) -> (Vec<f64>, bool) {
    let l = Sm120Layout::of(cfg).expect("simulate_gemm needs a legal configuration");
    let (m, n, k) = (a.rows, w.rows, a.k);
    // Garbage in the padding of the scale buffers must not matter.
    let (a_codes, a_sf) = a.device(math.pack_a, 0x5a);
    let (w_codes, w_sf) = w.device(math.pack_w, 0x5a);
    let (p_codes, p_sf, p_rows, q_codes, q_sf, q_rows) = if cfg.swap_ab {
        (&w_codes, &w_sf, n, &a_codes, &a_sf, m)
    } else {
        (&a_codes, &a_sf, m, &w_codes, &w_sf, n)
    };
    let ksf_pad = (k / 16).div_ceil(4) * 4;
    let k_tiles = k / cfg.block_k;
    let mut y = vec![0.0f64; (m * n) as usize];
    let mut writes = vec![0u32; (m * n) as usize];
    let warps = cfg.warps_m * cfg.warps_n * cfg.warps_k;

    for by in 0..m.div_ceil(cfg.block_m) {
        for bx in 0..n.div_ceil(cfg.block_n) {
            let (tile_m0, tile_n0) = (by * cfg.block_m, bx * cfg.block_n);
            let (tile_p0, tile_q0) =
                if cfg.swap_ab { (tile_n0, tile_m0) } else { (tile_m0, tile_n0) };
            // Partials of every split, [split][warp][mp][mq][lane][i].
            let mut splits = Vec::new();
            for split in 0..cfg.split_k {
                let kt_begin = split * k_tiles / cfg.split_k;
                let kt_end = (split + 1) * k_tiles / cfg.split_k;
                let mut acc = vec![[[0.0f64; 4]; LANES]; (warps * l.mma_p * l.mma_q) as usize];
                for kt in kt_begin..kt_end {
                    let mut smem = vec![0u8; l.stage_bytes as usize];
                    stage_codes(&l, &mut smem, 0, p_codes, p_rows, tile_p0, l.tile_p, k, kt);
                    stage_codes(
                        &l,
                        &mut smem,
                        l.q_code_offset,
                        q_codes,
                        q_rows,
                        tile_q0,
                        l.tile_q,
                        k,
                        kt,
                    );
                    stage_scales(
                        &l,
                        cfg,
                        &mut smem,
                        l.p_sf_offset,
                        p_sf,
                        p_rows,
                        tile_p0,
                        l.tile_p,
                        ksf_pad,
                        kt,
                    );
                    stage_scales(
                        &l,
                        cfg,
                        &mut smem,
                        l.q_sf_offset,
                        q_sf,
                        q_rows,
                        tile_q0,
                        l.tile_q,
                        ksf_pad,
                        kt,
                    );
                    for warp in 0..warps {
                        let (wp, wq, wk) = warp_position(&l, warp);
                        let base = (warp * l.mma_p * l.mma_q) as usize;
                        compute_step(
                            &l,
                            &smem,
                            math,
                            wp * l.warp_p,
                            wq * l.warp_q,
                            wk,
                            &mut acc[base..],
                        );
                    }
                }
                splits.push(acc);
            }
            // Epilogue: per split, k-warps summed in wk order into the wk == 0 warp; then splits
            // summed in split order.
            for warp in 0..warps {
                let (wp, wq, wk) = warp_position(&l, warp);
                if wk != 0 {
                    continue;
                }
                for mp in 0..l.mma_p {
                    for mq in 0..l.mma_q {
                        for lane in 0..LANES as u32 {
                            for i in 0..4 {
                                let mut total = 0.0;
                                for acc in &splits {
                                    let mut s = 0.0;
                                    for kk in 0..cfg.warps_k {
                                        let wi = kk * l.warps_p * l.warps_q + wp * l.warps_q + wq;
                                        s += acc
                                            [(wi * l.mma_p * l.mma_q + mp * l.mma_q + mq) as usize]
                                            [lane as usize]
                                            [i as usize];
                                    }
                                    total += s;
                                }
                                let (mm, nn) = epilogue_coords(
                                    cfg,
                                    tile_p0,
                                    tile_q0,
                                    wp * l.warp_p,
                                    wq * l.warp_q,
                                    mp,
                                    mq,
                                    i,
                                    lane,
                                );
                                if mm < m && nn < n {
                                    y[(mm * n + nn) as usize] = total;
                                    writes[(mm * n + nn) as usize] += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let bad_writes = writes.iter().any(|&c| c != 1);
    (y, bad_writes)
}

/// `Epilogue::coords`: (m, n) of accumulator `i` of MMA tile (mp, mq) of `lane`.
#[allow(clippy::too_many_arguments)]
pub fn epilogue_coords(
    cfg: &GemmConfig,
    tile_p0: u32,
    tile_q0: u32,
    warp_p0: u32,
    warp_q0: u32,
    mp: u32,
    mq: u32,
    i: u32,
    lane: u32,
) -> (u32, u32) {
    let pp = tile_p0 + warp_p0 + mp * 16 + (lane >> 2) + (i >> 1) * 8;
    let qq = tile_q0 + warp_q0 + mq * 8 + (lane & 3) * 2 + (i & 1);
    if cfg.swap_ab {
        (qq, pp)
    } else {
        (pp, qq)
    }
}

/// `load_codes`: thread-chunk i copies row i / ROW_CHUNKS, chunk i % ROW_CHUNKS; zero-fill past `rows`.
#[allow(clippy::too_many_arguments)]
fn stage_codes(
    l: &Sm120Layout,
    smem: &mut [u8],
    dst: u32,
    codes: &[u8],
    rows: u32,
    row0: u32,
    tile: u32,
    k: u32,
    kt: u32,
) {
    for i in 0..tile * l.row_chunks {
        let (r, c) = (i / l.row_chunks, i % l.row_chunks);
        let grow = row0 + r;
        let at = (dst + code_offset(l, r, c)) as usize;
        if grow < rows {
            let src = (grow * (k / 2) + kt * l.row_bytes + c * 16) as usize;
            smem[at..at + 16].copy_from_slice(&codes[src..src + 16]);
        } else {
            smem[at..at + 16].fill(0);
        }
    }
}

/// `load_scales`: word i holds step i / TILE, row i % TILE; zero-fill past `rows`.
#[allow(clippy::too_many_arguments)]
fn stage_scales(
    l: &Sm120Layout,
    cfg: &GemmConfig,
    smem: &mut [u8],
    dst: u32,
    sf: &[u8],
    rows: u32,
    row0: u32,
    tile: u32,
    ksf_pad: u32,
    kt: u32,
) {
    for i in 0..l.k_steps * tile {
        let (s, r) = (i / tile, i % tile);
        let grow = row0 + r;
        let at = (dst + 4 * i) as usize;
        if grow < rows {
            let kb = kt * (cfg.block_k / 16) + 4 * s;
            let src = swizzled_sf_offset(grow, kb, ksf_pad) as usize;
            smem[at..at + 4].copy_from_slice(&sf[src..src + 4]);
        } else {
            smem[at..at + 4].fill(0);
        }
    }
}

/// `compute_stage` for one warp: its k-steps of the staged tile, accumulating into
/// acc[mp * MMA_Q + mq][lane][i].
fn compute_step(
    l: &Sm120Layout,
    smem: &[u8],
    math: &IndexMath,
    warp_p0: u32,
    warp_q0: u32,
    wk: u32,
    acc: &mut [[[f64; 4]; LANES]],
) {
    for i in 0..l.k_steps_per_warp {
        let step = wk * l.k_steps_per_warp + i;
        let a: Vec<[[u32; 4]; LANES]> = (0..l.mma_p)
            .map(|mp| {
                let addrs =
                    std::array::from_fn(|lane| (math.a_frag)(l, warp_p0, mp, step, lane as u32));
                ldmatrix(smem, &addrs, 4)
            })
            .collect();
        let mut b = vec![[[0u32; 2]; LANES]; l.mma_q as usize];
        for mq in (0..l.mma_q).step_by(2) {
            let addrs: [u32; LANES] = std::array::from_fn(|lane| {
                l.q_code_offset + (math.b_frag)(l, warp_q0, mq, step, lane as u32)
            });
            let two = mq + 1 < l.mma_q;
            // With .x2 the addresses of lanes 16..31 are computed but never read.
            let r = ldmatrix(smem, &addrs, if two { 4 } else { 2 });
            for lane in 0..LANES {
                b[mq as usize][lane] = [r[lane][0], r[lane][1]];
                if two {
                    b[mq as usize + 1][lane] = [r[lane][2], r[lane][3]];
                }
            }
        }
        let sfa: Vec<[u32; LANES]> = (0..l.mma_p)
            .map(|w| {
                std::array::from_fn(|lane| {
                    let row = (math.sfa_row)(l, warp_p0, w, lane as u32);
                    lds_u32(smem, l.p_sf_offset + 4 * (step * l.tile_p + row))
                })
            })
            .collect();
        let sfb: Vec<[u32; LANES]> = (0..l.mma_q.div_ceil(4))
            .map(|w| {
                std::array::from_fn(|lane| {
                    let row = (math.sfb_row)(l, warp_q0, w, lane as u32);
                    lds_u32(smem, l.q_sf_offset + 4 * (step * l.tile_q + row))
                })
            })
            .collect();
        for mp in 0..l.mma_p {
            for mq in 0..l.mma_q {
                let (tid_a, tid_b, wa, wb) = (math.selectors)(mp, mq);
                let ops = MmaOperands {
                    a: a[mp as usize],
                    b: b[mq as usize],
                    sfa: sfa[wa],
                    sfb: sfb[wb],
                    tid_a,
                    tid_b,
                };
                let t = (mp * l.mma_q + mq) as usize;
                acc[t] = execute_mma(&ops, &acc[t]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::sm120;

    /// splitmix64: deterministic test data without depending on an RNG crate's API.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Random operand; scales have exponents 5..=9 (2^-2..2^2) so that every f64 sum is exact and
    /// results compare bit for bit whatever the summation order.
    fn random_matrix(rng: &mut Rng, rows: u32, k: u32) -> Nvfp4Matrix {
        let codes = (0..rows * k).map(|_| rng.below(16) as u8).collect();
        let scales =
            (0..rows * k / 16).map(|_| (((5 + rng.below(5)) << 3) | rng.below(8)) as u8).collect();
        Nvfp4Matrix { rows, k, codes, scales }
    }

    fn cfg(
        block_m: u32,
        block_n: u32,
        block_k: u32,
        warps: (u32, u32, u32),
        split_k: u32,
        swap_ab: bool,
    ) -> GemmConfig {
        sm120::config(block_m, block_n, block_k, warps.0, warps.1, warps.2, 2, split_k, swap_ab)
    }

    fn max_abs_diff(x: &[f64], y: &[f64]) -> f64 {
        x.iter().zip(y).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max)
    }

    #[test]
    fn fragment_tables_cover_each_element_exactly_once() {
        let mut a = [[0u32; 64]; 16];
        let mut b = [[0u32; 8]; 64];
        let mut c = [[0u32; 8]; 16];
        for lane in 0..32 {
            for reg in 0..4 {
                for nib in 0..8 {
                    let (r, k) = a_element(lane, reg, nib);
                    a[r as usize][k as usize] += 1;
                }
                let (r, col) = c_element(lane, reg);
                c[r as usize][col as usize] += 1;
            }
            for reg in 0..2 {
                for nib in 0..8 {
                    let (k, col) = b_element(lane, reg, nib);
                    b[k as usize][col as usize] += 1;
                }
            }
        }
        assert!(a.iter().flatten().all(|&x| x == 1));
        assert!(b.iter().flatten().all(|&x| x == 1));
        assert!(c.iter().flatten().all(|&x| x == 1));
        // Scales: every selector value reads each row (column) from exactly one lane.
        for tid in 0..2 {
            let mut rows: Vec<u32> = (0..32).filter_map(|l| sfa_row(l, tid)).collect();
            rows.sort();
            assert_eq!(rows, (0..16).collect::<Vec<_>>());
        }
        for tid in 0..4 {
            let mut cols: Vec<u32> = (0..32).filter_map(|l| sfb_col(l, tid)).collect();
            cols.sort();
            assert_eq!(cols, (0..8).collect::<Vec<_>>());
        }
        // Spot checks from the PTX table: lane 5 (g 1, t 1) holds A row 9, k 40..47 in a3.
        assert_eq!(a_element(5, 3, 0), (9, 40));
        assert_eq!(b_element(30, 1, 7), (32 + 16 + 7, 7));
        assert_eq!(c_element(7, 3), (9, 7));
        assert_eq!((sfa_row(6, 1), sfa_row(7, 1), sfa_row(6, 0)), (Some(1), Some(9), None));
    }

    #[test]
    fn scale_decoding() {
        assert_eq!(ue4m3_value(0x38), 1.0);
        assert_eq!(ue4m3_value(0x7e), 448.0);
        assert_eq!(ue4m3_value(0x01), 2f64.powi(-9));
        assert!(ue4m3_value(0x7f).is_nan());
        assert_eq!(e2m1_value(7), 6.0);
        assert_eq!(e2m1_value(0xb), -1.5);
    }

    #[test]
    fn swizzle_spreads_ldmatrix_rows_over_all_bank_groups() {
        for block_k in [64, 128, 256] {
            let c = cfg(16, 64, block_k, (1, 4, 1), 1, true);
            let l = Sm120Layout::of(&c).unwrap();
            for row0 in (0..64).step_by(8) {
                for chunk in 0..l.row_chunks {
                    let mut groups: Vec<u32> =
                        (0..8).map(|r| code_offset(&l, row0 + r, chunk) / 16 % 8).collect();
                    groups.sort();
                    groups.dedup();
                    assert_eq!(groups.len(), 8, "block_k {block_k} rows {row0}.. chunk {chunk}");
                }
            }
        }
    }

    /// One m16n8k64 MMA from the template's loads: registers gathered with ldmatrix from a staged
    /// tile and executed by the model equal the direct product.
    #[test]
    fn single_mma_from_template_loads_matches_reference() {
        let mut rng = Rng(7);
        let a = random_matrix(&mut rng, 16, 64);
        let w = random_matrix(&mut rng, 8, 64);
        let c = cfg(16, 8, 64, (1, 1, 1), 1, false);
        let (y, bad) = simulate_gemm(&c, &a, &w, &IndexMath::TEMPLATE);
        assert!(!bad);
        assert_eq!(y, reference_gemm(&a, &w));
    }

    #[test]
    fn template_index_math_reproduces_the_gemm_for_many_configs() {
        let mut rng = Rng(42);
        // (M, N, K) with ragged edges; configs covering swap / no swap, several MMA tiles per warp
        // (selectors 0..3 and 0..1), warps along every axis, split-K and every block_k.
        let cases = [
            (cfg(16, 64, 256, (1, 4, 1), 1, true), (5, 96, 512)),
            (cfg(8, 32, 128, (1, 2, 2), 2, true), (3, 40, 512)),
            (cfg(32, 64, 128, (1, 2, 1), 3, true), (37, 64, 384)),
            (cfg(16, 128, 256, (1, 4, 2), 1, true), (16, 136, 256)),
            (cfg(64, 64, 128, (2, 2, 1), 1, false), (70, 72, 256)),
            (cfg(32, 64, 64, (1, 2, 1), 2, false), (33, 64, 256)),
            (cfg(16, 64, 256, (1, 1, 4), 1, true), (9, 64, 256)),
        ];
        for (c, (m, n, k)) in cases {
            assert!(sm120::check(&c).is_ok(), "{c}: {:?}", sm120::check(&c));
            let a = random_matrix(&mut rng, m, k);
            let w = random_matrix(&mut rng, n, k);
            let (y, bad) = simulate_gemm(&c, &a, &w, &IndexMath::TEMPLATE);
            assert!(!bad, "{c}: an output element was written twice or never");
            let r = reference_gemm(&a, &w);
            assert_eq!(max_abs_diff(&y, &r), 0.0, "{c} on M={m} N={n} K={k}");
        }
    }

    fn wrong(math: IndexMath) -> f64 {
        let mut rng = Rng(3);
        let c = cfg(16, 64, 128, (1, 1, 1), 1, true); // 4 x 2 MMA tiles: both selectors used
        let a = random_matrix(&mut rng, 16, 256);
        let w = random_matrix(&mut rng, 64, 256);
        let (y, _) = simulate_gemm(&c, &a, &w, &math);
        max_abs_diff(&y, &reference_gemm(&a, &w))
    }

    #[test]
    fn layout_mistakes_are_caught() {
        let t = IndexMath::TEMPLATE;
        assert_eq!(wrong(t), 0.0);
        // Weights with element 2j in the high nibble instead of the low one.
        let high_first = |e: u8, o: u8| (o & 15) | ((e & 15) << 4);
        assert!(wrong(IndexMath { pack_w: high_first, ..t }) > 0.0);
        // ... on both operands it is a common permutation of k inside a scale block: harmless.
        assert_eq!(wrong(IndexMath { pack_w: high_first, pack_a: high_first, ..t }), 0.0);
        // k-halves of the A fragment swapped (a0/a1 from k 32..63, a2/a3 from k 0..31).
        fn a_swapped(l: &Sm120Layout, p0: u32, mp: u32, step: u32, lane: u32) -> u32 {
            let row = p0 + mp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            code_offset(l, row, 2 * step + 1 - (lane >> 4))
        }
        assert!(wrong(IndexMath { a_frag: a_swapped, ..t }) > 0.0);
        // Rows 8..15 of the A fragment taken from rows 0..7.
        fn a_rows(l: &Sm120Layout, p0: u32, mp: u32, step: u32, lane: u32) -> u32 {
            code_offset(l, p0 + mp * 16 + (lane & 7), 2 * step + (lane >> 4))
        }
        assert!(wrong(IndexMath { a_frag: a_rows, ..t }) > 0.0);
        // k-halves of the B fragment swapped.
        fn b_swapped(l: &Sm120Layout, q0: u32, mq: u32, step: u32, lane: u32) -> u32 {
            let row = q0 + (mq + (lane >> 4)) * 8 + (lane & 7);
            code_offset(l, row, 2 * step + 1 - ((lane >> 3) & 1))
        }
        assert!(wrong(IndexMath { b_frag: b_swapped, ..t }) > 0.0);
        // thread-id-b always 0: n8 tile 1 uses tile 0's scales.
        let selb0 = |mp: u32, mq: u32| (0, 0, mp as usize, (mq >> 2) as usize);
        assert!(wrong(IndexMath { selectors: selb0, ..t }) > 0.0);
        // One SF_A word shared by two m16 tiles without switching thread-id-a.
        let sfa_shared = |_mp: u32, mq: u32| (0, mq & 3, 0, (mq >> 2) as usize);
        assert!(wrong(IndexMath { selectors: sfa_shared, ..t }) > 0.0);
        // thread-id-a 1 reads lanes 2, 3, which duplicate lanes 0, 1: the same result, so the
        // kernel does not depend on the lane order behind thread-id-a 1.
        let tida1 = |mp: u32, mq: u32| (1, mq & 3, mp as usize, (mq >> 2) as usize);
        assert_eq!(wrong(IndexMath { selectors: tida1, ..t }), 0.0);
        // SF_A row g + 8 taken from row g.
        fn sfa_no8(_l: &Sm120Layout, p0: u32, mp: u32, lane: u32) -> u32 {
            p0 + mp * 16 + (lane >> 2)
        }
        assert!(wrong(IndexMath { sfa_row: sfa_no8, ..t }) > 0.0);
        // SF_A of the wrong m16 tile.
        fn sfa_tile0(_l: &Sm120Layout, p0: u32, _mp: u32, lane: u32) -> u32 {
            p0 + (lane >> 2) + (lane & 1) * 8
        }
        assert!(wrong(IndexMath { sfa_row: sfa_tile0, ..t }) > 0.0);
        // SF_B tile per lane % 4 reversed.
        fn sfb_rev(l: &Sm120Layout, q0: u32, group: u32, lane: u32) -> u32 {
            let tile = (4 * group + 3 - (lane & 3)).min(l.mma_q - 1);
            q0 + tile * 8 + (lane >> 2)
        }
        // With MMA_Q = 2 the reversed order changes which lanes serve tiles 0/1 -> caught.
        assert!(wrong(IndexMath { sfb_row: sfb_rev, ..t }) > 0.0);
    }
}
