//! The grouped kernels of family sm120 (`templates/moe/sm120.cuh`): W4A4 gate_up and down on the
//! native block-scaled MMA (`mma.sync.aligned.m16n8k64 ... kind::mxf4nvf4.block_scale`, SASS
//! `OMMA.SF`), on the same `moe_align` schedule as the sm90 kernels. Verified without a GPU: every
//! variant compiles for `sm_120a` with the expected OMMA.SF count and no local memory
//! ([`inspect_variants`], `results/sm120-moe-variants.md`), and the kernel's row maps, staging,
//! fragments and epilogue are run on the CPU through the fragment model of
//! [`crate::template::sm120::fragments`] ([`simulate`]) against the grouped reference.
//!
//! A configuration is a [`GroupedConfig`] of family sm120: `block_m` routed rows per tile (the
//! MMA's 8-wide side, one warp along it), `block_n` weight rows per CTA over `warps_n` warps,
//! `block_k` per cp.async stage over `warps_k` warps (summed in warp order), `depth` stages,
//! `split_k` CTAs along K (gate_up; their partials summed in order by the last to arrive, in the
//! stream's workspace: [`split_tiles`]), `min_ctas` 1, and the walk.

use super::config::{GroupedConfig, MoeOp, UnitParts};
use super::epilogue::{down_position, gate_up_position};
use super::schedule::{RouteSchedule, TILE_BLOCK_M};
use super::tiled::{tail_copy_bytes, TailCopies};
use super::MoeShape;
use crate::compile::{sass, Compiler};
use crate::problem::AType;
use crate::template::sm120::fragments::{
    self, a_frag_offset, b_frag_offset, code_offset, execute_mma, ldmatrix, selectors,
    tmpl_sfa_row, tmpl_sfb_row, warp_position, MmaOperands, Nvfp4Matrix, LANES,
};
use crate::template::sm120::report::{counts_line, OMMA_SF_NVFP4};
use crate::template::sm120::{self as gemm, Sm120Layout, SMEM_LIMIT};
use crate::template::{Family, GemmConfig};
use rayon::prelude::*;

/// The SM120 GEMM configuration whose pipeline and MMA step a grouped configuration runs:
/// swap-AB (weights on the 16-row side), one warp along the routed rows, `split_k` CTAs along K.
pub fn gemm_config(c: &GroupedConfig) -> GemmConfig {
    gemm::config(c.block_m, c.block_n, c.block_k, 1, c.warps_n, c.warps_k, c.depth, c.split_k, true)
}

/// The layout (`sm120::Config`) of a grouped configuration; `None` when its sizes do not form one.
pub fn layout(c: &GroupedConfig) -> Option<Sm120Layout> {
    Sm120Layout::of(&gemm_config(c))
}

/// Static shared memory of the kernel: the source rows of the current tile and, split along K,
/// the "last CTA" flag (ptxas allocates it in 128-byte units).
pub fn static_smem_bytes(c: &GroupedConfig) -> u32 {
    (4 * (c.block_m + u32::from(c.split_k > 1))).div_ceil(128) * 128
}

// ---------------------------------------------------------------------------------------------
// Split-K across CTAs: the partials and arrival counters in the stream's workspace.

/// split_k values of the space (gate_up only).
pub const SPLITS: [u32; 3] = [1, 2, 4];
/// Routed-row slots (tiles x block_m) the workspace's partials hold at the largest split: a
/// schedule of more tiles runs unsplit (the kernel checks its tile count against
/// [`split_tiles`]), so decode steps split and the workspace stays small.
pub const SPLIT_ROW_SLOTS: u32 = 128;

/// Floats of the workspace's split-K partials for a layer: [`SPLIT_ROW_SLOTS`] rows of the
/// largest split over gate_up's N padded to the widest weight tile (128).
pub fn split_partial_floats(shape: &MoeShape) -> usize {
    let (n, _) = shape.nk(MoeOp::GateUp);
    SPLIT_ROW_SLOTS as usize * SPLITS[SPLITS.len() - 1] as usize * n.div_ceil(128) as usize * 128
}

/// Arrival counters (u32) of the workspace: one per (tile, n-tile) of every tile the partials
/// can hold (a slot holds at least 2 x 32 x 8 floats, so 1 counter per 256 floats is enough).
pub fn split_counter_words(shape: &MoeShape) -> usize {
    split_partial_floats(shape).div_ceil(256)
}

/// Floats of one tile's partials: every n-tile's `split_k` slots of `block_n x block_m`.
fn split_tile_floats(c: &GroupedConfig, shape: &MoeShape) -> usize {
    let (n, _) = shape.nk(c.op);
    n.div_ceil(c.block_n) as usize * (c.split_k * c.block_n * c.block_m) as usize
}

/// Tiles whose partials and counters fit in `floats` and `counters` for kernel `c` (the kernel's
/// `split_tiles`; 0 for kernels without split-K).
pub fn split_tiles(c: &GroupedConfig, shape: &MoeShape, floats: usize, counters: usize) -> u32 {
    if c.split_k <= 1 {
        return 0;
    }
    let (n, _) = shape.nk(c.op);
    let by_floats = floats / split_tile_floats(c, shape);
    let by_counters = counters / n.div_ceil(c.block_n) as usize;
    by_floats.min(by_counters).min(i32::MAX as usize) as u32
}

/// [`split_tiles`] of a stream's workspace for `shape` (its split-K regions' sizes).
pub fn split_room(c: &GroupedConfig, shape: &MoeShape) -> u32 {
    split_tiles(c, shape, split_partial_floats(shape), split_counter_words(shape))
}

/// Whether kernel `c` splits K on schedule `s` (its tile list fits the workspace's partials);
/// otherwise it runs as its `split_k` 1 form.
pub fn splits_on(c: &GroupedConfig, shape: &MoeShape, s: &RouteSchedule) -> bool {
    let Some(list) = TILE_BLOCK_M.iter().position(|&b| b == c.block_m) else {
        return false;
    };
    c.split_k > 1 && s.tiles[list].len() <= split_room(c, shape) as usize
}

/// Index in a partial slot of accumulator register `(mp, mq, i)` of `lane` of the `wk == 0` warp
/// at `warp_pq` (`GroupedSm120::slot_element`).
pub fn split_element(l: &Sm120Layout, warp_pq: u32, mp: u32, mq: u32, i: u32, lane: u32) -> u32 {
    (((warp_pq * l.mma_p + mp) * l.mma_q + mq) * 4 + i) * 32 + lane
}

/// Float index of slot `z` of tile `tile`, n-tile `bx` (grid x `gx`) in the partials (the kernel's
/// `slots + z * SLOT_FLOATS`), and the counter index of that (tile, n-tile).
pub fn split_slot(c: &GroupedConfig, gx: u32, tile: u32, bx: u32, z: u32) -> (usize, usize) {
    let cell = tile as usize * gx as usize + bx as usize;
    let slot = (c.block_n * c.block_m) as usize;
    ((cell * c.split_k as usize + z as usize) * slot, cell)
}

/// The k-tiles `[begin, end)` of split `z` of `split` over `k_tiles` (the kernel's
/// `z * k_tiles / SPLIT_K`).
pub fn split_k_tiles(k_tiles: u32, split: u32, z: u32) -> (u32, u32) {
    (z * k_tiles / split, (z + 1) * k_tiles / split)
}

/// The family's rules for one shape (beyond the common ones of [`GroupedConfig::check`]).
pub fn check(c: &GroupedConfig, shape: &MoeShape) -> Result<(), String> {
    let (_, k) = shape.nk(c.op);
    if c.a_type != AType::Nvfp4 {
        return Err(format!(
            "the sm120 grouped kernels are W4A4 only (NVFP4 activations), not {}",
            c.a_type
        ));
    }
    if c.min_ctas != 1 {
        return Err("sm120 grouped kernels are compiled for one CTA per SM (min_ctas 1)".into());
    }
    if !SPLITS.contains(&c.split_k) {
        return Err(format!("split_k {} is not one of {SPLITS:?}", c.split_k));
    }
    if c.split_k > 1 && c.op != MoeOp::GateUp {
        return Err("split-K across CTAs is gate_up's (down's N gives it CTAs enough)".into());
    }
    gemm::check(&gemm_config(c)).map_err(|e| e.reason)?;
    let l = layout(c).ok_or("sizes overflow")?;
    if l.smem_bytes + static_smem_bytes(c) > SMEM_LIMIT {
        return Err(format!(
            "{} bytes of shared memory (stages and the tile's source rows), the SM120 limit is \
             {SMEM_LIMIT}",
            l.smem_bytes + static_smem_bytes(c)
        ));
    }
    if c.op == MoeOp::GateUp && l.mma_p % 2 != 0 {
        return Err("gate_up quantizes 16-column blocks of H, two m16 tiles of one warp: \
                    block_n / warps_n must be a multiple of 32"
            .into());
    }
    c.check_k(k)?;
    let k_tiles = k.div_ceil(c.block_k);
    if k_tiles < c.split_k {
        return Err(format!(
            "K = {k} gives {k_tiles} k-tiles of {}, fewer than split_k = {}",
            c.block_k, c.split_k
        ));
    }
    Ok(())
}

/// The instantiation unit: the template, the configuration, the shared memory and threads Rust
/// computed (asserted by the template), and the `extern "C"` kernel.
pub fn instantiation(c: &GroupedConfig) -> String {
    let mut unit = c.unit(UnitParts {
        header: "moe/sm120.cuh",
        cfg: gemm::config_type(&gemm_config(c)),
        rust_side: "moe/sm120.rs",
        template_side: "sm120/config.cuh",
        launch: format!("__launch_bounds__({})", c.threads()),
        runner: if c.k_tail { "GroupedSm120Tail" } else { "GroupedSm120" },
        params: "GroupedSm120Params",
    });
    // NVRTC has no offsetof: the grouped block's size places `partials` (the two pointers and
    // the int follow it in order), the whole size the rest
    type Params = crate::gpu::moe_params::MoeGroupedSm120Params;
    unit.push_str(&format!(
        "static_assert(sizeof(fp4tune::moe::GroupedParams) == {} && sizeof(fp4tune::moe::GroupedSm120Params) == {}, \"gpu::MoeGroupedSm120Params (Rust) and templates/moe/sm120.cuh disagree on the parameters\");\n",
        std::mem::offset_of!(Params, partials),
        std::mem::size_of::<Params>(),
    ));
    unit
}

/// The sm120 grouped search space for one op and shape: routed rows per tile 8, 16, 32; weight
/// tiles of 32 to 128 rows over 1 to 8 warps (gate_up: 32 rows per warp at least); K per stage
/// 128 (6 stages) or 256 (4 stages) over 1 or 2 warps, or for a K that stages of 128 cannot
/// split (a multiple of 64 only, e.g. K = 192) 64 (8 stages, one warp along K), in the K-tail form
/// where 64 does not divide K either (a multiple of 16, e.g. K = 176), never more stages than a
/// CTA has k-tiles (at least 2: a short K such as TP8 down's 256 keeps its shared memory small,
/// so more CTAs fit on an SM); gate_up's tiles of 8 and 16 rows also over 2 or 4 CTAs along K;
/// one CTA per tile or a persistent walk.
pub fn search_space(op: MoeOp, shape: &MoeShape) -> Vec<GroupedConfig> {
    let tiles: &[(u32, u32)] = match op {
        MoeOp::GateUp => &[(32, 1), (64, 1), (64, 2), (128, 2), (128, 4)],
        MoeOp::Down => &[(32, 1), (32, 2), (64, 4), (128, 4), (128, 8)],
    };
    let (_, k) = shape.nk(op);
    let stages: &[(u32, u32)] = if k % 128 != 0 { &[(64, 8)] } else { &[(128, 6), (256, 4)] };
    let k_tail = k % 64 != 0;
    let mut out = Vec::new();
    for block_m in [8, 16, 32] {
        // split-K for the decode tiles of gate_up (long K, few CTAs at a handful of tokens)
        let splits: &[u32] = if op == MoeOp::GateUp && block_m <= 16 { &SPLITS } else { &[1] };
        for &(block_n, warps_n) in tiles {
            for &(block_k, stages) in stages {
                for warps_k in [1, 2] {
                    for (&split_k, walk) in
                        splits.iter().flat_map(|s| [0, 2].into_iter().map(move |w| (s, w)))
                    {
                        let depth = stages.min((k.div_ceil(block_k) / split_k).max(2));
                        let row = (
                            op,
                            AType::Nvfp4,
                            [block_m, block_n, block_k],
                            [warps_n, warps_k],
                            super::seeds::R,
                            depth,
                            split_k,
                            1,
                            walk,
                        );
                        let c =
                            GroupedConfig { k_tail, ..GroupedConfig::streamed(Family::Sm120, row) };
                        if c.check(shape).is_ok() {
                            out.push(c);
                        }
                    }
                }
            }
        }
    }
    out
}

/// The distinct kernels (walks share one) of the sm120 grouped spaces of both ops for `shapes`.
pub fn distinct_kernels(shapes: &[MoeShape]) -> Vec<GroupedConfig> {
    super::space::distinct_kernels(shapes, search_space)
}

// ---------------------------------------------------------------------------------------------
// The kernel's index math on the CPU.

/// `sm120::load_rows`' K-tail copies: codes in 8-byte halves of 16 k, scales in words of 64 k.
const CODE_HALVES: TailCopies = TailCopies { bytes: 8, units: 2, unit_k: 16 };
const SCALE_WORDS: TailCopies = TailCopies { bytes: 4, units: 1, unit_k: 64 };

/// `sm120_weight_row`: the weight row of P-tile row `r` of the CTA whose first weight row is
/// `n0` (`None`: past the weight, zero-filled). gate_up interleaves gate and up rows by MMA row half.
pub fn weight_row(op: MoeOp, n: u32, n0: u32, r: u32) -> Option<u32> {
    match op {
        MoeOp::GateUp => {
            let half = n / 2;
            let col = (n0 + r - (r & 15)) / 2 + (r & 7);
            (col < half).then_some(col + ((r >> 3) & 1) * half)
        }
        MoeOp::Down => (n0 + r < n).then_some(n0 + r),
    }
}

/// `sm120_source_row`: the activation row of Q-tile row `r` of the tile of sorted rows `first ..
/// first + rows` (gate_up: the token of the sorted row; down: the sorted row).
pub fn source_row(
    op: MoeOp,
    sorted_ids: &[i32],
    top_k: u32,
    first: u32,
    rows: u32,
    r: u32,
) -> Option<u32> {
    (r < rows).then(|| match op {
        MoeOp::GateUp => sorted_ids[(first + r) as usize] as u32 / top_k,
        MoeOp::Down => first + r,
    })
}

/// [`source_row`]'s signature: (op, sorted ids, top_k, first sorted row, rows, tile row).
pub type SourceRowFn = fn(MoeOp, &[i32], u32, u32, u32, u32) -> Option<u32>;

/// The index functions a simulation uses; [`GroupedMath::TEMPLATE`] is what the kernel does.
/// Tests substitute broken variants to show that the simulation catches mistakes.
#[derive(Debug, Clone, Copy)]
pub struct GroupedMath {
    pub weight_row: fn(MoeOp, u32, u32, u32) -> Option<u32>,
    pub source_row: SourceRowFn,
    /// The row whose scale words are staged for an activation tile row, from the row its codes
    /// come from and its sorted row (the kernel: the codes' row).
    pub scale_row: fn(u32, u32) -> u32,
}

impl GroupedMath {
    pub const TEMPLATE: GroupedMath =
        GroupedMath { weight_row, source_row, scale_row: |codes_row, _| codes_row };
}

/// Stacked expert weights and activation rows in logical form (one [`Nvfp4Matrix`] each), and
/// their device images (codes, swizzled scales with garbage in the padding).
#[derive(Debug, Clone)]
pub struct GroupedOperands {
    pub experts: Vec<Nvfp4Matrix>,
    /// gate_up: X `[tokens, K]`; down: H `[routed rows, K]`.
    pub acts: Nvfp4Matrix,
}

/// The pre-activation outputs of every routed row: `[rows, N]` in weight-row order (gate_up:
/// gate of column j at j, up at I + j), how often each was written, and how many split-K
/// partials were stored (0 when the projection ran unsplit).
#[derive(Debug, Clone, PartialEq)]
pub struct Simulated {
    pub n: u32,
    pub values: Vec<f64>,
    pub writes: Vec<u32>,
    pub partial_writes: usize,
}

/// Run one grouped projection through the kernel's index math and the MMA model: every CTA (n
/// tile) and every tile of the schedule's list for `block_m`, every k-tile staged by the row maps
/// (codes at `code_offset`, scale word s * TILE + r; in the K-tail form, ceil(K / 64) k-tiles
/// whose copies read only their bytes below K), every warp's ldmatrix / scale loads /
/// selectors and MMAs as the SM120 GEMM's `compute_stage`, the k-warps summed in order, and the
/// epilogue's element positions (`moe::epilogue`). Split along K (`split_k` > 1 and at most
/// `split_tiles` tiles): each split's k-tiles, its k-warp sums stored at the partial slot
/// positions of the kernel ([`split_slot`], [`split_element`]; a position written twice panics),
/// and the slots summed in order; more tiles run unsplit, as the kernel does.
pub fn simulate(
    c: &GroupedConfig,
    s: &RouteSchedule,
    top_k: u32,
    ops: &GroupedOperands,
    math: &GroupedMath,
    split_tiles: u32,
) -> Simulated {
    let l = layout(c).expect("simulate needs a legal configuration");
    let n = ops.experts[0].rows;
    let k = ops.acts.k;
    let ksf_pad = (k / 16).div_ceil(4) * 4;
    let pack = fragments::pack_low_first;
    let images: Vec<(Vec<u8>, Vec<u8>)> =
        ops.experts.iter().map(|w| w.device(pack, 0x5a)).collect();
    let (a_codes, a_sf) = ops.acts.device(pack, 0x5a);
    let rows = s.rows();
    let mut out = Simulated {
        n,
        values: vec![0.0; (rows * n) as usize],
        writes: vec![0; (rows * n) as usize],
        partial_writes: 0,
    };
    let list = TILE_BLOCK_M.iter().position(|&b| b == c.block_m).expect("a tile list");
    let warps = c.warps_n * c.warps_k;
    let stage = |smem: &mut [u8],
                 code_dst: u32,
                 sf_dst: u32,
                 tile: u32,
                 codes: &[u8],
                 sf: &[u8],
                 row_of: &dyn Fn(u32) -> Option<(u32, u32)>,
                 kt: u32| {
        // k left in this k-tile before K: the K-tail form's copies read only their bytes below
        // K and zero-fill the rest (`sm120::load_rows`; a K that k-tiles divide reads them all)
        let k_left = i64::from(k) - i64::from(kt * c.block_k);
        for i in 0..tile * l.row_chunks {
            let (r, ch) = (i / l.row_chunks, i % l.row_chunks);
            let at = (code_dst + code_offset(&l, r, ch)) as usize;
            smem[at..at + 16].fill(0);
            if let Some((row, _)) = row_of(r) {
                for half in 0..2 {
                    let bytes = tail_copy_bytes(k_left, 32 * ch + 16 * half, CODE_HALVES) as usize;
                    let src = (row * (k / 2) + kt * l.row_bytes + ch * 16 + 8 * half) as usize;
                    let at = at + 8 * half as usize;
                    if bytes > 0 {
                        smem[at..at + bytes].copy_from_slice(&codes[src..src + bytes]);
                    }
                }
            }
        }
        for i in 0..l.k_steps * tile {
            let (st, r) = (i / tile, i % tile);
            let at = (sf_dst + 4 * i) as usize;
            smem[at..at + 4].fill(0);
            if let Some((_, sf_row)) = row_of(r) {
                let kb = kt * (c.block_k / 16) + 4 * st;
                let src = fragments::swizzled_sf_offset(sf_row, kb, ksf_pad) as usize;
                let bytes = tail_copy_bytes(k_left, 64 * st, SCALE_WORDS) as usize;
                if bytes > 0 {
                    smem[at..at + bytes].copy_from_slice(&sf[src..src + bytes]);
                }
            }
        }
    };
    let gx = n.div_ceil(c.block_n);
    let tiles = &s.tiles[list];
    let split = c.split_k > 1 && tiles.len() as u32 <= split_tiles;
    let splits = if split { c.split_k } else { 1 };
    let k_tiles = k.div_ceil(c.block_k);
    let slot_floats = (c.block_n * c.block_m) as usize;
    let mut partials =
        vec![None::<f64>; split_tiles as usize * gx as usize * c.split_k as usize * slot_floats];
    // (wk == 0 warp, MMA tile, lane, element) -> value, per wk == 0 warp position warp_pq
    let wk0 = (l.warps_p * l.warps_q) as usize;
    let tile_regs = (l.mma_p * l.mma_q) as usize;
    for bx in 0..gx {
        let n0 = bx * c.block_n;
        for (ti, tile) in tiles.iter().enumerate() {
            let (w_codes, w_sf) = &images[tile.expert as usize];
            let p_row = |r: u32| (math.weight_row)(c.op, n, n0, r).map(|row| (row, row));
            let q_row = |r: u32| {
                (math.source_row)(c.op, &s.sorted_ids, top_k, tile.first_row, tile.rows, r)
                    .map(|row| (row, (math.scale_row)(row, tile.first_row + r)))
            };
            let mut total = vec![[[0.0f64; 4]; LANES]; wk0 * tile_regs];
            for z in 0..splits {
                let (kb, ke) = if split { split_k_tiles(k_tiles, splits, z) } else { (0, k_tiles) };
                let mut acc = vec![[[0.0f64; 4]; LANES]; (warps * l.mma_p * l.mma_q) as usize];
                for kt in kb..ke {
                    let mut smem = vec![0u8; l.stage_bytes as usize];
                    stage(&mut smem, 0, l.p_sf_offset, l.tile_p, w_codes, w_sf, &p_row, kt);
                    stage(
                        &mut smem,
                        l.q_code_offset,
                        l.q_sf_offset,
                        l.tile_q,
                        &a_codes,
                        &a_sf,
                        &q_row,
                        kt,
                    );
                    for warp in 0..warps {
                        let (wp, wq, wk) = warp_position(&l, warp);
                        let base = (warp * l.mma_p * l.mma_q) as usize;
                        compute_stage(
                            &l,
                            &smem,
                            wp * l.warp_p,
                            wq * l.warp_q,
                            wk,
                            &mut acc[base..],
                        );
                    }
                }
                // k-warps summed into the wk = 0 warp in wk order (sm120::Epilogue::reduce_k_warps)
                for warp in 0..warps {
                    let (wp, wq, wk) = warp_position(&l, warp);
                    if wk != 0 {
                        continue;
                    }
                    let warp_pq = wp * l.warps_q + wq;
                    for t in 0..tile_regs {
                        let (mp, mq) = (t as u32 / l.mma_q, t as u32 % l.mma_q);
                        for lane in 0..LANES {
                            for e in 0..4 {
                                let mut sum = acc[warp as usize * tile_regs + t][lane][e];
                                for kk in 1..c.warps_k {
                                    let wi = kk * l.warps_p * l.warps_q + warp_pq;
                                    sum += acc[wi as usize * tile_regs + t][lane][e];
                                }
                                if split {
                                    let (slot, _) = split_slot(c, gx, ti as u32, bx, z);
                                    let at = slot
                                        + split_element(&l, warp_pq, mp, mq, e as u32, lane as u32)
                                            as usize;
                                    assert!(
                                        partials[at].is_none(),
                                        "{c}: partial {at} written twice"
                                    );
                                    partials[at] = Some(sum);
                                    out.partial_writes += 1;
                                } else {
                                    total[warp_pq as usize * tile_regs + t][lane][e] = sum;
                                }
                            }
                        }
                    }
                }
            }
            if split {
                // the tile's last CTA: slots 0 .. split_k - 1 summed in order
                for warp_pq in 0..wk0 as u32 {
                    for t in 0..tile_regs {
                        let (mp, mq) = (t as u32 / l.mma_q, t as u32 % l.mma_q);
                        let regs = &mut total[warp_pq as usize * tile_regs + t];
                        for (lane, lane_regs) in regs.iter_mut().enumerate() {
                            for (e, value) in lane_regs.iter_mut().enumerate() {
                                let mut sum = 0.0;
                                for z in 0..splits {
                                    let (slot, _) = split_slot(c, gx, ti as u32, bx, z);
                                    let at = slot
                                        + split_element(&l, warp_pq, mp, mq, e as u32, lane as u32)
                                            as usize;
                                    sum += partials[at].expect("every split wrote its slot");
                                }
                                *value = sum;
                            }
                        }
                    }
                }
            }
            // the epilogue's positions
            for warp_pq in 0..wk0 as u32 {
                let (wp, wq) = (warp_pq / l.warps_q, warp_pq % l.warps_q);
                let pw0 = n0 + wp * l.warp_p;
                let qw0 = wq * l.warp_q;
                for i in 0..l.mma_p {
                    for q in 0..l.mma_q {
                        let t = (i * l.mma_q + q) as usize;
                        let total = |lane: usize, e: usize| {
                            total[warp_pq as usize * tile_regs + t][lane][e]
                        };
                        for lane in 0..LANES as u32 {
                            let mut put = |m: u32, col: u32, v: f64| {
                                if m < tile.rows && col < n {
                                    let at = ((tile.first_row + m) * n + col) as usize;
                                    out.values[at] = v;
                                    out.writes[at] += 1;
                                }
                            };
                            match c.op {
                                MoeOp::GateUp => {
                                    for e in 0..2 {
                                        let (m, col) = gate_up_position(pw0, qw0, i, q, e, lane);
                                        if col < n / 2 {
                                            put(m, col, total(lane as usize, e as usize));
                                            let up = total(lane as usize, e as usize + 2);
                                            put(m, n / 2 + col, up);
                                        }
                                    }
                                }
                                MoeOp::Down => {
                                    for e in 0..4 {
                                        let (m, col) = down_position(pw0, qw0, i, q, e, lane);
                                        put(m, col, total(lane as usize, e as usize));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// `sm120::compute_stage` for one warp over a staged tile (the GEMM's fragment loads, selectors
/// and MMAs, through the model of `template::sm120::fragments`).
fn compute_stage(
    l: &Sm120Layout,
    smem: &[u8],
    warp_p0: u32,
    warp_q0: u32,
    wk: u32,
    acc: &mut [[[f64; 4]; LANES]],
) {
    let lds = |at: u32| {
        let at = at as usize;
        u32::from_le_bytes([smem[at], smem[at + 1], smem[at + 2], smem[at + 3]])
    };
    for i in 0..l.k_steps_per_warp {
        let step = wk * l.k_steps_per_warp + i;
        let a: Vec<[[u32; 4]; LANES]> = (0..l.mma_p)
            .map(|mp| {
                let addrs =
                    std::array::from_fn(|lane| a_frag_offset(l, warp_p0, mp, step, lane as u32));
                ldmatrix(smem, &addrs, 4)
            })
            .collect();
        let mut b = vec![[[0u32; 2]; LANES]; l.mma_q as usize];
        for mq in (0..l.mma_q).step_by(2) {
            let addrs: [u32; LANES] = std::array::from_fn(|lane| {
                l.q_code_offset + b_frag_offset(l, warp_q0, mq, step, lane as u32)
            });
            let two = mq + 1 < l.mma_q;
            let r = ldmatrix(smem, &addrs, if two { 4 } else { 2 });
            for lane in 0..LANES {
                b[mq as usize][lane] = [r[lane][0], r[lane][1]];
                if two {
                    b[mq as usize + 1][lane] = [r[lane][2], r[lane][3]];
                }
            }
        }
        let sfa: Vec<[u32; LANES]> = (0..l.mma_p)
            .map(|mp| {
                std::array::from_fn(|lane| {
                    let row = tmpl_sfa_row(l, warp_p0, mp, lane as u32);
                    lds(l.p_sf_offset + 4 * (step * l.tile_p + row))
                })
            })
            .collect();
        let sfb: Vec<[u32; LANES]> = (0..l.mma_q.div_ceil(4))
            .map(|g| {
                std::array::from_fn(|lane| {
                    let row = tmpl_sfb_row(l, warp_q0, g, lane as u32);
                    lds(l.q_sf_offset + 4 * (step * l.tile_q + row))
                })
            })
            .collect();
        for mp in 0..l.mma_p {
            for mq in 0..l.mma_q {
                let (tid_a, tid_b, wa, wb) = selectors(mp, mq);
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

/// The grouped projection computed directly: every routed row's dot products with every weight
/// row of its expert (gate_up on the row's token), exact in f64 for the operands of the tests.
pub fn reference(s: &RouteSchedule, top_k: u32, op: MoeOp, ops: &GroupedOperands) -> Vec<f64> {
    let n = ops.experts[0].rows;
    let k = ops.acts.k;
    let mut out = vec![0.0; (s.rows() * n) as usize];
    for r in 0..s.rows() {
        let w = &ops.experts[s.expert_of_row(r) as usize];
        let src = match op {
            MoeOp::GateUp => s.sorted_ids[r as usize] as u32 / top_k,
            MoeOp::Down => r,
        };
        for row in 0..n {
            out[(r * n + row) as usize] =
                (0..k).map(|kk| w.value(row, kk) * ops.acts.value(src, kk)).sum();
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Compile-time evidence.

/// What one compiled grouped sm120 variant uses, read from ptxas and from its SASS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupedVariant {
    pub config: GroupedConfig,
    pub registers: u32,
    /// Spill stores + spill loads reported by ptxas, in bytes.
    pub spill_bytes: u32,
    /// Dynamic shared memory (the template's SMEM_BYTES, asserted equal to Rust's) and the static
    /// shared memory ptxas reports.
    pub smem_bytes: u32,
    pub static_smem: u32,
    pub threads: u32,
    /// `OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X` instructions, and any OMMA.
    pub omma_sf: usize,
    pub omma: usize,
    /// `ATOMG` instructions: the split-K arrival counter (one in a kernel split along K, none
    /// otherwise).
    pub atomics: usize,
    pub local_memory: bool,
    /// MMAs of one k-tile (MMA tiles per warp x k-steps per warp): the main loop's body.
    pub expected_mma_per_k_tile: u32,
}

impl GroupedVariant {
    /// Native block-scaled MMA in the expected count, the split-K arrival counter exactly where
    /// K is split, no spills, no local memory, static shared memory within what `check` budgets.
    pub fn is_clean(&self) -> bool {
        self.omma_sf > 0
            && self.omma == self.omma_sf
            && self.omma_sf as u32 == self.expected_mma_per_k_tile
            && (self.atomics > 0) == (self.config.split_k > 1)
            && self.spill_bytes == 0
            && !self.local_memory
            && self.static_smem <= static_smem_bytes(&self.config)
    }
}

/// Render, compile (in parallel, through `compiler`'s caches) and inspect every configuration;
/// failures come back as messages naming the variant.
pub fn inspect_variants(
    compiler: &Compiler,
    configs: &[GroupedConfig],
) -> Vec<Result<GroupedVariant, String>> {
    configs
        .par_iter()
        .map(|c| {
            let kernel = compiler.compile(&c.source()).map_err(|e| format!("{c}: {e}"))?;
            let stats = kernel.stats.ok_or_else(|| format!("{c}: no ptxas statistics"))?;
            let text = sass::dump_sass(&kernel.kernel_name, &kernel.cubin)
                .map_err(|e| format!("{c}: {e}"))?;
            let l = layout(c).ok_or_else(|| format!("{c}: no layout"))?;
            Ok(GroupedVariant {
                config: *c,
                registers: stats.registers,
                spill_bytes: stats.spill_stores + stats.spill_loads,
                smem_bytes: c.smem_bytes(),
                static_smem: stats.static_smem,
                threads: c.threads(),
                omma_sf: sass::count_opcode(&text, OMMA_SF_NVFP4),
                omma: sass::count_opcode(&text, "OMMA"),
                atomics: sass::count_opcode(&text, "ATOMG"),
                local_memory: sass::uses_local_memory(&text),
                expected_mma_per_k_tile: l.mma_p * l.mma_q * l.k_steps_per_warp,
            })
        })
        .collect()
}

/// Markdown report (`results/sm120-moe-variants.md`): a summary, one row per variant, failures.
pub fn variant_report(results: &[Result<GroupedVariant, String>], toolchain: &str) -> String {
    let ok: Vec<&GroupedVariant> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let clean = ok.iter().filter(|v| v.is_clean()).count();
    let mut out = String::new();
    out.push_str("# SM120 grouped MoE variants: registers, shared memory, MMAs\n\n");
    out.push_str(&format!(
        "Every distinct kernel of the sm120 grouped space (`moe::sm120::search_space`, gate_up and \
         down, W4A4, the GLM-5 TP8 and EP8 layers and the down projections of Qwen3-235B-A22B \
         and GLM-4.5-Air over 8 GPUs, K = 192 and K = 176, the latter in the K-tail form `kt`) \
         compiled for sm_120a ({toolchain}); SASS read \
         with cuobjdump. `OMMA.SF` counts `{OMMA_SF_NVFP4}` instructions; `expected` is MMA tiles \
         per warp x 64-wide k-steps per warp of one k-tile (the main loop's body); `ATOMG` counts \
         the split-K arrival counter's atomics (kernels split along K, `s2` and `s4`, have one; \
         the others none). `smem B` is the dynamic shared memory (the cp.async stages), `static \
         B` the static shared memory ptxas reports (the tile's source rows and, split along K, \
         the last-CTA flag).\n\n"
    ));
    out.push_str(&counts_line(results.len(), clean, ok.iter().map(|v| v.registers)));
    out.push_str(
        "\n| variant | kernel | threads | smem B | static B | regs | spill B | OMMA.SF | expected | ATOMG | local mem |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for v in &ok {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            v.config.name(),
            v.config.kernel_name(),
            v.threads,
            v.smem_bytes,
            v.static_smem,
            v.registers,
            v.spill_bytes,
            v.omma_sf,
            v.expected_mma_per_k_tile,
            v.atomics,
            if v.local_memory { "yes" } else { "no" }
        ));
    }
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    if !failures.is_empty() {
        out.push_str("\n## Failures\n\n");
        for e in failures {
            out.push_str(&format!("- {}\n", e.lines().next().unwrap_or_default()));
        }
    }
    out
}

#[cfg(test)]
#[path = "sm120_tests.rs"]
mod tests;
