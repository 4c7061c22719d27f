//! The SM120 family: native block-scaled FP4 `mma.sync` m16n8k64 (W4A4 only), its constraints, its
//! shared-memory budget, its instantiation unit and its search space.
//!
//! The template lives in `templates/sm120/` (`gemm.cuh` is the umbrella). Its `Config` struct derives
//! the same quantities as [`Sm120Layout`] and checks them with messaged `static_assert`s; the
//! instantiation unit asserts that the template's `SMEM_BYTES` equals [`smem_bytes`], so the two
//! can never drift apart silently.
//!
//! Vocabulary: P is the operand on the MMA's 16-row side and Q the one on its 8-column side. Without
//! swap-AB, P = A (tokens, `block_m` rows) and Q = W (weights, `block_n` rows); with swap-AB (small M)
//! P = W and Q = A, i.e. the kernel computes Y^T = W * A^T.
//!
//! [`fragments`] is the CPU model of the block-scaled MMA fragments the index math is tested
//! against; [`report`] compiles every variant for `sm_120a` and checks its SASS; `index_tests`
//! compiles the template's constexpr index functions against the mirror's values of every layout.

pub mod fragments;
#[cfg(test)]
pub(crate) mod index_tests;
pub mod report;

use super::{ConstraintError, Family, GemmConfig, Pipeline};
use crate::problem::{AType, GemmProblem};

/// Shared memory one SM120 block may use (opt-in maximum), in bytes.
pub const SMEM_LIMIT: u32 = 101_376;
/// Largest number of m16n8 MMA tiles one warp may own (4 f32 accumulators each).
pub const MAX_MMA_TILES_PER_WARP: u32 = 32;

/// Every derived size of one configuration, mirroring `fp4tune::sm120::Config` in
/// `templates/sm120/config.cuh`. Only meaningful for a configuration that passes [`check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sm120Layout {
    /// Rows of the CTA tile on the MMA's 16-row side (P) and 8-column side (Q).
    pub tile_p: u32,
    pub tile_q: u32,
    /// Warps along P and along Q.
    pub warps_p: u32,
    pub warps_q: u32,
    /// Warp tile and its m16n8 MMA tiles.
    pub warp_p: u32,
    pub warp_q: u32,
    pub mma_p: u32,
    pub mma_q: u32,
    /// 64-wide k-steps per stage and per k-warp.
    pub k_steps: u32,
    pub k_steps_per_warp: u32,
    /// Bytes of one code row in shared memory (block_k / 2) and its 16-byte chunks.
    pub row_bytes: u32,
    pub row_chunks: u32,
    /// Offsets inside one stage: P codes at 0, then Q codes, P scale words, Q scale words.
    pub q_code_offset: u32,
    pub p_sf_offset: u32,
    pub q_sf_offset: u32,
    pub stage_bytes: u32,
    pub pipe_bytes: u32,
    /// In-CTA split-K reduction buffer (reuses the pipeline's memory).
    pub red_bytes: u32,
    /// Offset of the split-K "last CTA" flag word.
    pub flag_offset: u32,
    /// Dynamic shared memory of one CTA.
    pub smem_bytes: u32,
}

impl Sm120Layout {
    /// Derive the layout; `None` when a division by a zero warp count or an overflow would occur.
    pub fn of(c: &GemmConfig) -> Option<Self> {
        let (tile_p, tile_q) = c.pq_rows();
        let (warps_p, warps_q) = c.pq_warps();
        let warp_p = tile_p.checked_div(warps_p)?;
        let warp_q = tile_q.checked_div(warps_q)?;
        let k_steps = c.block_k / 64;
        let k_steps_per_warp = k_steps.checked_div(c.warps_k)?;
        let row_bytes = c.block_k / 2;
        let row_chunks = row_bytes / 16;
        let p_code = tile_p.checked_mul(row_bytes)?;
        let q_code = tile_q.checked_mul(row_bytes)?;
        let p_sf = k_steps.checked_mul(tile_p)?.checked_mul(4)?;
        let q_sf = k_steps.checked_mul(tile_q)?.checked_mul(4)?;
        let q_code_offset = p_code;
        let p_sf_offset = q_code_offset.checked_add(q_code)?;
        let q_sf_offset = p_sf_offset.checked_add(p_sf)?;
        let stage_bytes = q_sf_offset.checked_add(q_sf)?;
        let pipe_bytes = c.stages.checked_mul(stage_bytes)?;
        let red_bytes =
            c.warps_k.saturating_sub(1).checked_mul(tile_p)?.checked_mul(tile_q)?.checked_mul(4)?;
        let flag_offset = pipe_bytes.max(red_bytes);
        Some(Self {
            tile_p,
            tile_q,
            warps_p,
            warps_q,
            warp_p,
            warp_q,
            mma_p: warp_p / 16,
            mma_q: warp_q / 8,
            k_steps,
            k_steps_per_warp,
            row_bytes,
            row_chunks,
            q_code_offset,
            p_sf_offset,
            q_sf_offset,
            stage_bytes,
            pipe_bytes,
            red_bytes,
            flag_offset,
            smem_bytes: flag_offset.checked_add(16)?,
        })
    }
}

/// Dynamic shared memory of one CTA (`u32::MAX` for a configuration whose sizes overflow).
pub fn smem_bytes(c: &GemmConfig) -> u32 {
    Sm120Layout::of(c).map_or(u32::MAX, |l| l.smem_bytes)
}

/// Constraints of the configuration alone; the same rules as the template's static_asserts.
pub fn check(c: &GemmConfig) -> Result<(), ConstraintError> {
    if c.family != Family::Sm120 {
        return Err(c.violation("not an sm120 configuration"));
    }
    if c.pipeline.is_direct() {
        return Err(c.violation(format!(
            "the sm120 family has only the cp.async pipeline (and its K-tail form), not {:?} \
             (the streamed pipelines are sm90 kernels)",
            c.pipeline
        )));
    }
    if c.pipeline == Pipeline::KTail && c.block_k != 64 {
        return Err(
            c.violation(format!("the K-tail form has k-tiles of 64 (block_k {})", c.block_k))
        );
    }
    if c.min_ctas != 1 {
        return Err(c.violation(format!(
            "min_ctas {} is an sm90 streamed-pipeline parameter; sm120 kernels are compiled for 1 CTA per SM",
            c.min_ctas
        )));
    }
    if c.a_type != AType::Nvfp4 {
        return Err(c.violation(format!(
            "the sm120 family is W4A4 only: a_type must be {} (NVFP4 activations), got {}; \
             W4A16 (bf16 activations) runs on the sm90 family",
            AType::Nvfp4,
            c.a_type
        )));
    }
    if !matches!(c.block_k, 64 | 128 | 256) {
        return Err(c.violation(format!("block_k {} is not 64, 128 or 256", c.block_k)));
    }
    if c.warps_m == 0 || c.warps_n == 0 || c.warps_k == 0 {
        return Err(c.violation("warp counts must be positive"));
    }
    let warps = c.warps_m as u64 * c.warps_n as u64 * c.warps_k as u64;
    if warps * 32 > 1024 {
        return Err(c.violation(format!("{} threads per CTA, at most 1024", warps * 32)));
    }
    if !(2..=8).contains(&c.stages) {
        return Err(c.violation(format!("stages {} outside 2..=8", c.stages)));
    }
    if !(1..=32).contains(&c.split_k) {
        return Err(c.violation(format!("split_k {} outside 1..=32", c.split_k)));
    }
    let l = Sm120Layout::of(c).ok_or_else(|| c.violation("sizes overflow"))?;
    if l.k_steps % c.warps_k != 0 {
        return Err(c.violation(format!(
            "block_k / 64 = {} k-steps cannot be split over warps_k = {}",
            l.k_steps, c.warps_k
        )));
    }
    let (p_name, q_name) = if c.swap_ab { ("block_n", "block_m") } else { ("block_m", "block_n") };
    for (name, tile, min) in [(p_name, l.tile_p, 16), (q_name, l.tile_q, 8)] {
        if !tile.is_power_of_two() || tile < min || tile > 128 {
            return Err(c.violation(format!(
                "{name} = {tile} must be a power of two in {min}..=128 (it sits on the MMA's \
                 {}-wide side; scale rows are padded to 128)",
                if min == 16 { 16 } else { 8 }
            )));
        }
    }
    if l.tile_p % (16 * l.warps_p) != 0 {
        return Err(c.violation(format!(
            "{p_name} = {} over {} warps leaves fewer than 16 rows (or a non-multiple of 16) per warp",
            l.tile_p, l.warps_p
        )));
    }
    if l.tile_q % (8 * l.warps_q) != 0 {
        return Err(c.violation(format!(
            "{q_name} = {} over {} warps leaves fewer than 8 columns (or a non-multiple of 8) per warp",
            l.tile_q, l.warps_q
        )));
    }
    if l.mma_p * l.mma_q > MAX_MMA_TILES_PER_WARP {
        return Err(c.violation(format!(
            "{} MMA tiles per warp, at most {MAX_MMA_TILES_PER_WARP} (accumulators would spill)",
            l.mma_p * l.mma_q
        )));
    }
    if l.smem_bytes > SMEM_LIMIT {
        return Err(c.violation(format!(
            "{} bytes of shared memory, the SM120 limit is {SMEM_LIMIT}",
            l.smem_bytes
        )));
    }
    Ok(())
}

/// Constraints of running `c` on `p` beyond the configuration's own (which the caller checked).
pub fn check_problem(c: &GemmConfig, p: &GemmProblem) -> Result<(), ConstraintError> {
    if c.pipeline == Pipeline::KTail {
        if p.k % 16 != 0 || p.k % 64 == 0 {
            return Err(c.violation(format!(
                "K = {} is not for the K-tail form (a multiple of 16 that 64 does not divide)",
                p.k
            )));
        }
    } else if p.k % c.block_k != 0 {
        return Err(
            c.violation(format!("K = {} is not a multiple of block_k = {}", p.k, c.block_k))
        );
    }
    let k_tiles = p.k.div_ceil(c.block_k);
    if k_tiles < c.split_k {
        return Err(c.violation(format!(
            "K = {} gives {k_tiles} k-tiles of {}, fewer than split_k = {}",
            p.k, c.block_k, c.split_k
        )));
    }
    if p.m > i32::MAX as u32 || p.n > i32::MAX as u32 || p.k > i32::MAX as u32 {
        return Err(c.violation(format!("{p}: dimensions must fit in i32")));
    }
    let m_tiles = p.m.div_ceil(c.block_m);
    if m_tiles > 65_535 {
        return Err(c.violation(format!("{m_tiles} M tiles exceed gridDim.y = 65535")));
    }
    // Scale offsets are 32-bit in the kernel: rows padded to 128 times K/16 must fit.
    let rows = p.m.max(p.n).div_ceil(128) as u64 * 128;
    if rows * (p.k as u64 / 16).div_ceil(4) * 4 > u32::MAX as u64 {
        return Err(c.violation(format!("{p}: scale buffer exceeds 32-bit offsets")));
    }
    Ok(())
}

/// The template's configuration type of `c`: `fp4tune::sm120::Config<...>`.
pub fn config_type(c: &GemmConfig) -> String {
    format!("fp4tune::sm120::Config<{}>", c.template_args())
}

/// The instantiation unit: include the umbrella header, instantiate the config, assert the
/// shared-memory size Rust computed and define the `extern "C"` kernel.
pub fn instantiation(c: &GemmConfig) -> String {
    format!(
        "#include \"sm120/gemm.cuh\"\n\
         \n\
         using Cfg = {cfg};\n\
         static_assert(Cfg::SMEM_BYTES == {smem}, \"shared-memory size of the template differs from sm120.rs::smem_bytes\");\n\
         static_assert(Cfg::THREADS == {threads}, \"thread count of the template differs from GemmConfig::threads\");\n\
         {params}\n\
         \n\
         extern \"C\" __global__ void __launch_bounds__({threads}) {name}(const fp4tune::GemmParams p) {{\n\
         \x20   fp4tune::sm120::gemm<Cfg{tail}>(p);\n\
         }}\n",
        cfg = config_type(c),
        smem = smem_bytes(c),
        threads = c.threads(),
        name = c.kernel_name(),
        tail = if c.pipeline == Pipeline::KTail { ", true" } else { "" },
        params = crate::template::gemm_params_assert(),
    )
}

/// An SM120 W4A4 configuration (cp.async pipeline) from its tile values.
#[allow(clippy::too_many_arguments)]
pub(crate) fn config(
    block_m: u32,
    block_n: u32,
    block_k: u32,
    warps_m: u32,
    warps_n: u32,
    warps_k: u32,
    stages: u32,
    split_k: u32,
    swap_ab: bool,
) -> GemmConfig {
    GemmConfig::cp_async(
        Family::Sm120,
        AType::Nvfp4,
        [block_m, block_n, block_k],
        [warps_m, warps_n, warps_k],
        stages,
        split_k,
        swap_ab,
    )
}

/// The configuration used when nothing was tuned: swap-AB decode tile (16 tokens x 64 weight rows,
/// K 256 per stage, 4 warps along the weights, 6 stages; part of [`search_space`]). For W4A16 the same tile is returned with
/// `a_type` Bf16, which [`check`] rejects with a message (this family is W4A4 only).
pub fn default_config(a_type: AType) -> GemmConfig {
    GemmConfig { a_type, ..config(16, 64, 256, 1, 4, 1, 6, 1, true) }
}

/// The pruned search space. Decode (swap-AB): tokens 8/16/32 on the 8-wide side, weight tiles
/// 16..128, K tiles 128/256, 2 to 8 warps (along the weights and along K), a shallow and a deep
/// pipeline, split-K 1/2/4/8; and K tiles of 64 with one warp along K and split-K 1/2 (legal for
/// every K; for a K that 128 cannot split, a multiple of 64 such as K = 192, the down projection
/// of a 1536-wide expert over 8 GPUs, they are the only tiles, so such a K runs on the swap-AB
/// decode tiles at every M). Prefill (no swap): 64/128 square-ish tiles, 4 or 8 warps, 2 to 4
/// stages. Everything returned passes [`check`]; W4A16 gives an empty space.
pub fn search_space(a_type: AType) -> Vec<GemmConfig> {
    if a_type != AType::Nvfp4 {
        return Vec::new();
    }
    let mut out = Vec::new();
    // Decode / small M: swap-AB. Memory bound, so the pipeline is as deep as fits (up to 6).
    for block_m in [8, 16, 32] {
        for block_n in [16, 32, 64, 128] {
            for block_k in [64, 128, 256] {
                for (warps_n, warps_k) in [(1, 2), (2, 1), (2, 2), (4, 1), (4, 2)] {
                    if block_n / warps_n < 16 || (block_n >= 64 && warps_n == 1) {
                        continue;
                    }
                    for split_k in [1, 2, 4, 8] {
                        if block_k == 64 && (warps_k > 1 || split_k > 2) {
                            continue;
                        }
                        // Big weight tiles already give few CTAs per expert: split deeper
                        // only with narrow tiles.
                        if block_n == 128 && split_k > 4 {
                            continue;
                        }
                        let deepest = (2..=6).rev().map(|stages| {
                            config(
                                block_m, block_n, block_k, 1, warps_n, warps_k, stages, split_k,
                                true,
                            )
                        });
                        if let Some(c) = deepest.into_iter().find(|c| check(c).is_ok()) {
                            out.push(c);
                        }
                    }
                }
            }
        }
    }
    // Prefill / large M: no swap; compute bound, 2 to 4 stages.
    for (block_m, block_n) in [(64, 64), (64, 128), (128, 64), (128, 128)] {
        for block_k in [128, 256] {
            for (warps_m, warps_n) in [(2, 2), (2, 4), (4, 2)] {
                for stages in [2, 3, 4] {
                    out.push(config(
                        block_m, block_n, block_k, warps_m, warps_n, 1, stages, 1, false,
                    ));
                }
            }
        }
    }
    // The K-tail form (a K that 64 does not divide, which no other kernel takes): the 64-k
    // decode tiles above, and prefill tiles of 64 k.
    let mut tail: Vec<GemmConfig> = out
        .iter()
        .filter(|c| c.block_k == 64)
        .map(|c| GemmConfig { pipeline: Pipeline::KTail, ..*c })
        .collect();
    for (block_m, block_n) in [(64, 64), (64, 128), (128, 64), (128, 128)] {
        for (warps_m, warps_n) in [(2, 2), (2, 4), (4, 2)] {
            for stages in [2, 3] {
                let c = config(block_m, block_n, 64, warps_m, warps_n, 1, stages, 1, false);
                tail.push(GemmConfig { pipeline: Pipeline::KTail, ..c });
            }
        }
    }
    out.extend(tail);
    out.retain(|c| check(c).is_ok());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_pipelines_are_rejected() {
        for pl in Pipeline::ALL.into_iter().filter(|p| p.is_direct()) {
            let c = GemmConfig { pipeline: pl, ..default_config(AType::Nvfp4) };
            let e = check(&c).unwrap_err();
            assert!(e.reason.contains("only the cp.async pipeline"), "{e}");
        }
    }

    /// The K-tail form: k-tiles of 64, legal exactly for a K that is a multiple of 16 and not of
    /// 64 (where no whole-tile kernel is), split-K over the partial last tile too; instantiated
    /// as `gemm<Cfg, true>`.
    #[test]
    fn k_tail_form_takes_exactly_the_k_no_whole_tile_kernel_takes() {
        let space = search_space(AType::Nvfp4);
        let tail: Vec<&GemmConfig> =
            space.iter().filter(|c| c.pipeline == Pipeline::KTail).collect();
        assert!(
            tail.len() >= 20 && tail.iter().any(|c| c.swap_ab) && tail.iter().any(|c| !c.swap_ab)
        );
        assert!(tail.iter().all(|c| c.block_k == 64 && c.name().contains("_kt")));
        for (n, k) in [(2048, 96), (4096, 176), (64, 16)] {
            for m in [1, 8, 130] {
                let p = GemmProblem::new(m, n, k, AType::Nvfp4);
                let legal: Vec<_> = space.iter().filter(|c| check_problem(c, &p).is_ok()).collect();
                assert!(!legal.is_empty() && legal.iter().all(|c| c.pipeline == Pipeline::KTail));
            }
        }
        let whole = GemmProblem::new(1, 512, 6144, AType::Nvfp4);
        assert!(tail.iter().all(|c| check_problem(c, &whole).is_err()));
        let e = check_problem(tail[0], &GemmProblem::new(1, 2048, 88, AType::Nvfp4)).unwrap_err();
        assert!(e.reason.contains("K-tail"), "{e}");
        let unit = instantiation(tail[0]);
        assert!(unit.contains("fp4tune::sm120::gemm<Cfg, true>(p);"), "{unit}");
        let c = GemmConfig { pipeline: Pipeline::KTail, ..default_config(AType::Nvfp4) };
        assert!(check(&c).unwrap_err().reason.contains("k-tiles of 64"));
    }

    #[test]
    fn smem_of_default_decode_tile() {
        // (64 + 16) rows x 256 k: codes 80 * 128 B, scales 80 * 4 words * 4 B; 6 stages + flag.
        let c = default_config(AType::Nvfp4);
        let stage = 80 * 128 + 80 * 16;
        assert_eq!(smem_bytes(&c), 6 * stage + 16);
        assert!(check(&c).is_ok(), "{:?}", check(&c));
    }

    #[test]
    fn smem_counts_the_k_warp_reduction_buffer() {
        // 2 stages of a 128x128x128 tile = 2 * (256 * 64 + 256 * 8) = 36864 bytes, while the
        // reduction of warps_k = 2 needs 128 * 128 * 4 = 65536: the larger one wins.
        let c = config(128, 128, 128, 2, 2, 2, 2, 1, false);
        let l = Sm120Layout::of(&c).unwrap();
        assert_eq!(l.red_bytes, 65_536);
        assert_eq!(l.pipe_bytes, 2 * (256 * 64 + 256 * 8));
        assert_eq!(smem_bytes(&c), 65_536 + 16);
    }

    #[test]
    fn bf16_activations_are_rejected_with_a_message() {
        let mut c = default_config(AType::Nvfp4);
        c.a_type = AType::Bf16;
        let e = check(&c).unwrap_err();
        assert!(e.reason.contains("W4A4 only"), "{e}");
        let e = check(&default_config(AType::Bf16)).unwrap_err();
        assert!(e.reason.contains("W4A4 only"), "{e}");
        assert!(search_space(AType::Bf16).is_empty());
    }

    #[test]
    fn shared_memory_limit_is_enforced() {
        // 128 x 128 x 256, 4 stages: 4 * (256 * 128 + 256 * 16) = 147456 > 101376.
        let c = config(128, 128, 256, 2, 2, 1, 4, 1, false);
        let e = check(&c).unwrap_err();
        assert!(e.reason.contains("101376"), "{e}");
        // 3 stages fit? 3 * 36864 + 16 = 110608: still over. 2 stages fit.
        assert!(check(&config(128, 128, 256, 2, 2, 1, 3, 1, false)).is_err());
        assert!(check(&config(128, 128, 256, 2, 2, 1, 2, 1, false)).is_ok());
    }

    #[test]
    fn tile_and_warp_rules() {
        let ok = config(16, 64, 256, 1, 4, 1, 4, 1, true);
        assert!(check(&ok).is_ok());
        // 8 weight rows on the 16-row side.
        assert!(check(&GemmConfig { block_n: 8, warps_n: 1, ..ok }).is_err());
        // 64 weight rows over 8 warps: 8 rows per warp.
        assert!(check(&GemmConfig { warps_n: 8, ..ok }).is_err());
        // tokens 24: not a power of two.
        assert!(check(&GemmConfig { block_m: 24, ..ok }).is_err());
        // 4 k-steps over 3 k-warps.
        assert!(check(&GemmConfig { warps_k: 3, ..ok }).is_err());
        // block_k 512.
        assert!(check(&GemmConfig { block_k: 512, ..ok }).is_err());
        // zero warps must not panic.
        assert!(check(&GemmConfig { warps_m: 0, ..ok }).is_err());
        assert_eq!(smem_bytes(&GemmConfig { warps_m: 0, ..ok }), u32::MAX);
        // stages 1.
        assert!(check(&GemmConfig { stages: 1, ..ok }).is_err());
        // without swap, tokens are on the 16-row side: block_m 8 is illegal there.
        assert!(check(&config(8, 64, 256, 1, 4, 1, 4, 1, false)).is_err());
        // 128 x 128 on one warp: 8 x 16 = 128 MMA tiles.
        assert!(check(&config(128, 128, 64, 1, 1, 1, 2, 1, false)).is_err());
    }

    #[test]
    fn problem_rules() {
        let c = config(16, 64, 256, 1, 4, 1, 4, 4, true);
        let p = |m, n, k| GemmProblem::new(m, n, k, AType::Nvfp4);
        assert!(check_problem(&c, &p(1, 512, 6144)).is_ok());
        // TP8 down: K = 256 is one k-tile of 256, not enough for split_k 4.
        let e = check_problem(&c, &p(1, 6144, 256)).unwrap_err();
        assert!(e.reason.contains("split_k"), "{e}");
        assert!(check_problem(&c, &p(1, 512, 6000)).is_err());
        // Through GemmConfig::check_problem the a_type mismatch is caught too.
        assert!(c.check_problem(&GemmProblem::new(1, 512, 6144, AType::Bf16)).is_err());
    }

    #[test]
    fn search_space_is_pruned_and_covers_decode_and_prefill() {
        let space = search_space(AType::Nvfp4);
        let tail = space.iter().filter(|c| c.pipeline == Pipeline::KTail).count();
        assert!((50..=400).contains(&(space.len() - tail)), "{} configs", space.len() - tail);
        assert!(tail <= 100, "{tail} K-tail configs");
        let mut names: Vec<_> = space.iter().map(|c| c.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), space.len(), "duplicate configurations");
        assert!(space.iter().all(|c| check(c).is_ok()));
        // Decode: swap-AB with 8-token tiles, narrow weight tiles and split-K.
        assert!(space.iter().any(|c| c.swap_ab && c.block_m == 8 && c.block_n == 16));
        assert!(space.iter().any(|c| c.swap_ab && c.split_k == 8));
        assert!(space.iter().any(|c| c.swap_ab && c.block_n == 128));
        // Prefill: 128 x 128 tiles without swap.
        assert!(space.iter().any(|c| !c.swap_ab && c.block_m == 128 && c.block_n == 128));
        // A K that 128-k tiles cannot split (192) still has decode tiles, and only 64-k ones.
        let k192: Vec<_> = space
            .iter()
            .filter(|c| check_problem(c, &GemmProblem::new(4, 4096, 192, AType::Nvfp4)).is_ok())
            .collect();
        assert!(
            k192.len() >= 10 && k192.iter().all(|c| c.block_k == 64 && c.swap_ab),
            "{}",
            k192.len()
        );
        assert!(space.contains(&default_config(AType::Nvfp4)));
    }

    #[test]
    fn instantiation_names_kernel_and_asserts_smem() {
        let c = default_config(AType::Nvfp4);
        let unit = instantiation(&c);
        assert!(unit.starts_with("#include \"sm120/gemm.cuh\""));
        assert!(unit.contains("Config<16, 64, 256, 1, 4, 1, 6, 1, true>"), "{unit}");
        assert!(unit.contains(&format!("Cfg::SMEM_BYTES == {}", smem_bytes(&c))));
        assert!(unit.contains(&format!(
            "__launch_bounds__(128) {}(const fp4tune::GemmParams p)",
            c.kernel_name()
        )));
        let src = c.render().unwrap();
        assert!(src.code.contains("kind::mxf4nvf4.block_scale.scale_vec::4X"));
        assert!(!src.code.contains("#include"), "includes must be inlined");
    }
}
