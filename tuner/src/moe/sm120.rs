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
//! `split_k` and `min_ctas` 1, and the walk.

use super::config::{GroupedConfig, MoeOp, UnitParts};
use super::epilogue::{down_position, gate_up_position};
use super::schedule::{RouteSchedule, TILE_BLOCK_M};
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
/// swap-AB (weights on the 16-row side), one warp along the routed rows, no split across CTAs.
pub fn gemm_config(c: &GroupedConfig) -> GemmConfig {
    gemm::config(c.block_m, c.block_n, c.block_k, 1, c.warps_n, c.warps_k, c.depth, 1, true)
}

/// The layout (`sm120::Config`) of a grouped configuration; `None` when its sizes do not form one.
pub fn layout(c: &GroupedConfig) -> Option<Sm120Layout> {
    Sm120Layout::of(&gemm_config(c))
}

/// Static shared memory of the kernel: the source rows of the current tile (ptxas allocates it
/// in 128-byte units).
pub fn static_smem_bytes(c: &GroupedConfig) -> u32 {
    (4 * c.block_m).div_ceil(128) * 128
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
    if c.split_k != 1 || c.min_ctas != 1 {
        return Err("sm120 grouped kernels reduce K inside the CTA (split_k 1) and are compiled \
                    for one CTA per SM (min_ctas 1)"
            .into());
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
    c.check_k(k)
}

/// The instantiation unit: the template, the configuration, the shared memory and threads Rust
/// computed (asserted by the template), and the `extern "C"` kernel.
pub fn instantiation(c: &GroupedConfig) -> String {
    c.unit(UnitParts {
        header: "moe/sm120.cuh",
        cfg: format!(
            "fp4tune::sm120::Config<{}, {}, {}, 1, {}, {}, {}, 1, true>",
            c.block_m, c.block_n, c.block_k, c.warps_n, c.warps_k, c.depth
        ),
        rust_side: "moe/sm120.rs",
        template_side: "sm120/config.cuh",
        launch: format!("__launch_bounds__({})", c.threads()),
        runner: if c.k_tail { "GroupedSm120Tail" } else { "GroupedSm120" },
    })
}

/// The sm120 grouped search space for one op and shape: routed rows per tile 8, 16, 32; weight
/// tiles of 32 to 128 rows over 1 to 8 warps (gate_up: 32 rows per warp at least); K per stage
/// 128 (6 stages) or 256 (4 stages) over 1 or 2 warps, or for a K that stages of 128 cannot
/// split (a multiple of 64 only, e.g. K = 192) 64 (8 stages, one warp along K), in the K-tail form
/// where 64 does not divide K either (a multiple of 16, e.g. K = 176); one CTA per tile or a
/// persistent walk.
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
        for &(block_n, warps_n) in tiles {
            for &(block_k, stages) in stages {
                for warps_k in [1, 2] {
                    for walk in [0, 2] {
                        let c = GroupedConfig {
                            op,
                            block_m,
                            block_n,
                            block_k,
                            warps_n,
                            warps_k,
                            depth: stages,
                            split_k: 1,
                            min_ctas: 1,
                            walk,
                            family: Family::Sm120,
                            a_type: AType::Nvfp4,
                            warp_ring: false,
                            tiled: false,
                            warps_m: 1,
                            wgmma: false,
                            k_tail,
                            a_smem: false,
                            flow: false,
                        };
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
/// gate of column j at j, up at I + j), and how often each was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulated {
    pub n: u32,
    pub values: Vec<f64>,
    pub writes: Vec<u32>,
}

/// Run one grouped projection through the kernel's index math and the MMA model: every CTA (n
/// tile) and every tile of the schedule's list for `block_m`, every k-tile staged by the row maps
/// (codes at `code_offset`, scale word s * TILE + r), every warp's ldmatrix / scale loads /
/// selectors and MMAs as the SM120 GEMM's `compute_stage`, the k-warps summed in order, and the
/// epilogue's element positions (`moe::epilogue`).
pub fn simulate(
    c: &GroupedConfig,
    s: &RouteSchedule,
    top_k: u32,
    ops: &GroupedOperands,
    math: &GroupedMath,
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
        for i in 0..tile * l.row_chunks {
            let (r, ch) = (i / l.row_chunks, i % l.row_chunks);
            let at = (code_dst + code_offset(&l, r, ch)) as usize;
            match row_of(r) {
                Some((row, _)) => {
                    let src = (row * (k / 2) + kt * l.row_bytes + ch * 16) as usize;
                    smem[at..at + 16].copy_from_slice(&codes[src..src + 16]);
                }
                None => smem[at..at + 16].fill(0),
            }
        }
        for i in 0..l.k_steps * tile {
            let (st, r) = (i / tile, i % tile);
            let at = (sf_dst + 4 * i) as usize;
            match row_of(r) {
                Some((_, sf_row)) => {
                    let kb = kt * (c.block_k / 16) + 4 * st;
                    let src = fragments::swizzled_sf_offset(sf_row, kb, ksf_pad) as usize;
                    smem[at..at + 4].copy_from_slice(&sf[src..src + 4]);
                }
                None => smem[at..at + 4].fill(0),
            }
        }
    };
    for bx in 0..n.div_ceil(c.block_n) {
        let n0 = bx * c.block_n;
        for tile in &s.tiles[list] {
            let (w_codes, w_sf) = &images[tile.expert as usize];
            let p_row = |r: u32| (math.weight_row)(c.op, n, n0, r).map(|row| (row, row));
            let q_row = |r: u32| {
                (math.source_row)(c.op, &s.sorted_ids, top_k, tile.first_row, tile.rows, r)
                    .map(|row| (row, (math.scale_row)(row, tile.first_row + r)))
            };
            let mut acc = vec![[[0.0f64; 4]; LANES]; (warps * l.mma_p * l.mma_q) as usize];
            for kt in 0..k / c.block_k {
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
                    compute_stage(&l, &smem, wp * l.warp_p, wq * l.warp_q, wk, &mut acc[base..]);
                }
            }
            // k-warps summed into the wk = 0 warp in wk order, then the epilogue's positions
            for warp in 0..warps {
                let (wp, wq, wk) = warp_position(&l, warp);
                if wk != 0 {
                    continue;
                }
                let pw0 = n0 + wp * l.warp_p;
                let qw0 = wq * l.warp_q;
                let total = |t: u32, lane: usize, e: usize| -> f64 {
                    let mut sum = acc[(warp * l.mma_p * l.mma_q + t) as usize][lane][e];
                    for kk in 1..c.warps_k {
                        let wi = kk * l.warps_p * l.warps_q + wp * l.warps_q + wq;
                        sum += acc[(wi * l.mma_p * l.mma_q + t) as usize][lane][e];
                    }
                    sum
                };
                for i in 0..l.mma_p {
                    for q in 0..l.mma_q {
                        let t = i * l.mma_q + q;
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
                                            put(m, col, total(t, lane as usize, e as usize));
                                            let up = total(t, lane as usize, e as usize + 2);
                                            put(m, n / 2 + col, up);
                                        }
                                    }
                                }
                                MoeOp::Down => {
                                    for e in 0..4 {
                                        let (m, col) = down_position(pw0, qw0, i, q, e, lane);
                                        put(m, col, total(t, lane as usize, e as usize));
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
    pub local_memory: bool,
    /// MMAs of one k-tile (MMA tiles per warp x k-steps per warp): the main loop's body.
    pub expected_mma_per_k_tile: u32,
}

impl GroupedVariant {
    /// Native block-scaled MMA in the expected count, no spills, no local memory, static shared
    /// memory within what `check` budgets.
    pub fn is_clean(&self) -> bool {
        self.omma_sf > 0
            && self.omma == self.omma_sf
            && self.omma_sf as u32 == self.expected_mma_per_k_tile
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
         per warp x 64-wide k-steps per warp of one k-tile (the main loop's body). `smem B` is the \
         dynamic shared memory (the cp.async stages), `static B` the static shared memory ptxas \
         reports (the tile's source rows).\n\n"
    ));
    out.push_str(&counts_line(results.len(), clean, ok.iter().map(|v| v.registers)));
    out.push_str(
        "\n| variant | kernel | threads | smem B | static B | regs | spill B | OMMA.SF | expected | local mem |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for v in &ok {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            v.config.name(),
            v.config.kernel_name(),
            v.threads,
            v.smem_bytes,
            v.static_smem,
            v.registers,
            v.spill_bytes,
            v.omma_sf,
            v.expected_mma_per_k_tile,
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
