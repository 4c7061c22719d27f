//! The family's search space (the pruned member lists of the weight pipelines).

use super::*;
use crate::problem::AType;
use crate::template::{Family, GemmConfig, Pipeline};

/// The pruned search space (about 2.4k configurations per activation type); every configuration
/// passes `check`, and the measured winners (`measured_winners`) are in it.
///
/// Enumerated: block_m {8, 16, 32, 64} (swap_ab) or {16, 32, 64, 128}; block_n 16..256; block_k
/// {64, 128, 256}; warps per dimension {1, 2, 4, 8} (warps_k {1, 2, 4}); stages {2, 3, 4, 6, 8};
/// split_k {1, 2, 3, 4, 6, 8, 12, 16}. Kept (see `keep`): 2..8 warps; 256..2048 k in flight per CTA,
/// more than 512 only while the weight bytes in flight stay <= 32 KiB. swap_ab: block_k >= 128, at
/// least 512 k in flight, 16..32 weights per warp (64 for block_m >= 32), split_k > 4 only for narrow
/// tiles, > 8 (global workspace reduction) only for block_m <= 16 and block_n <= 64. Otherwise:
/// block_m >= 32, block_n >= 64, >= 4 warps, >= 4 MMAs per k-step and <= 64 accumulators per
/// lane (no spills), no in-CTA split-K, split_k <= 4 and only for block_m <= 64.
pub fn search_space(a_type: AType) -> Vec<GemmConfig> {
    let mut out = Vec::new();
    let warp_counts = [1u32, 2, 4, 8];
    for swap_ab in [true, false] {
        let block_ms: &[u32] = if swap_ab { &[8, 16, 32, 64] } else { &[16, 32, 64, 128] };
        for &block_m in block_ms {
            for block_n in [16u32, 32, 64, 128, 256] {
                for block_k in [64u32, 128, 256] {
                    for warps_m in warp_counts {
                        for warps_n in warp_counts {
                            for warps_k in [1u32, 2, 4] {
                                for stages in [2u32, 3, 4, 6, 8] {
                                    for split_k in [1u32, 2, 3, 4, 6, 8, 12, 16] {
                                        let c = GemmConfig::cp_async(
                                            Family::Sm90,
                                            a_type,
                                            [block_m, block_n, block_k],
                                            [warps_m, warps_n, warps_k],
                                            stages,
                                            split_k,
                                            swap_ab,
                                        );
                                        if keep(&c) {
                                            out.push(c);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out.extend(direct_space(a_type));
    out.extend(warp_ring_space(a_type));
    out.extend(global_space(a_type));
    out.extend(k_tail_space(a_type));
    out
}

/// The K-tail configurations (`Pipeline::KTail`: cp.async stages of 64 k in one warp, the last
/// one cut at K). Only a K that 64 does not divide takes them (`check_problem`), so they never
/// compete with the whole-stage kernels; such a K is short in practice (an expert's intermediate
/// size split 8 ways: 96, 176, 352), a few stages per CTA.
///
/// Enumerated: swap_ab with block_m {8, 16, 32} (decode) or block_m {32, 64, 128}; block_n
/// {32, 64, 128}; warps_m {1, 2}, warps_n {1, 2, 4}; stages {2, 3}; split_k {1, 2}. Kept: 2..8
/// warps and at most 64 accumulators per lane.
pub fn k_tail_space(a_type: AType) -> Vec<GemmConfig> {
    let mut out = Vec::new();
    for swap_ab in [true, false] {
        let block_ms: &[u32] = if swap_ab { &[8, 16, 32] } else { &[32, 64, 128] };
        for &block_m in block_ms {
            for block_n in [32u32, 64, 128] {
                for warps_m in [1u32, 2] {
                    for warps_n in [1u32, 2, 4] {
                        for stages in [2u32, 3] {
                            for split_k in [1u32, 2] {
                                let c = GemmConfig {
                                    pipeline: Pipeline::KTail,
                                    ..GemmConfig::cp_async(
                                        Family::Sm90,
                                        a_type,
                                        [block_m, block_n, 64],
                                        [warps_m, warps_n, 1],
                                        stages,
                                        split_k,
                                        swap_ab,
                                    )
                                };
                                let d = Derived::of(&c);
                                if (2..=8).contains(&(warps_m * warps_n))
                                    && d.acc_sets * d.acc <= 64
                                    && check(&c).is_ok()
                                {
                                    out.push(c);
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

/// The register-streamed configurations of the search space (`Pipeline::Registers`, small M).
///
/// Enumerated: block_m {8, 16}; 16 or 32 weight rows per warp, warps_n {1, 2}; warps_k {1, 2, 4,
/// 8, 16}; block_k (one pass = the CTA's K slice when block_k = K / split_k) {256, 512, 768, 1024,
/// 1536, 2048, 3072, 6144}; ring depth {1, 2, 4}; split_k {1, 2, 3, 4, 6, 8, 12, 16}. Kept: 4..16
/// warps; 1..8 chunks (128 k) per warp and pass; ring depth = min(chunks per pass, 4), or 2 with
/// 4 or more chunks; at most 100 KiB of activation slice; split_k > 8 (workspace reduction) only
/// with block_n <= 64 and block_k <= 512. Many short warps win at decode sizes: the critical path
/// after the last weight byte arrives is one or two chunks of dequantization and one barrier.
pub fn direct_space(a_type: AType) -> Vec<GemmConfig> {
    let values = StreamedValues {
        warps_k: &[1, 2, 4, 8, 16],
        block_k: &[256, 512, 768, 1024, 1536, 2048, 3072, 6144],
        stages: &[1, 2, 4],
        split_k: &[1, 2, 3, 4, 6, 8, 12, 16],
        min_ctas: &[1, 2, 4],
    };
    streamed_space(a_type, Pipeline::Registers, &values, |c| {
        let chunks_per_pass = c.block_k / (128 * c.warps_k);
        (1..=8).contains(&chunks_per_pass)
            && (c.stages == chunks_per_pass.min(4) || (c.stages == 2 && chunks_per_pass >= 4))
            && (c.split_k <= MAX_CLUSTER_SPLIT || (c.block_n <= 64 && c.block_k <= 512))
    })
}

/// Value lists of a streamed-pipeline space (block_m {8, 16}, 16 or 32 weight rows per warp and
/// warps_n {1, 2} are common to all three).
struct StreamedValues {
    warps_k: &'static [u32],
    block_k: &'static [u32],
    stages: &'static [u32],
    split_k: &'static [u32],
    /// CTAs per SM the kernels are compiled for; above 1 only up to 32 warps per SM.
    min_ctas: &'static [u32],
}

/// Every swap-AB configuration of `pipeline` over `values` that passes `check`, has 4..16 warps,
/// at most 100 KiB of activation slice, and passes `keep`.
fn streamed_space(
    a_type: AType,
    pipeline: Pipeline,
    values: &StreamedValues,
    keep: impl Fn(&GemmConfig) -> bool,
) -> Vec<GemmConfig> {
    let mut out = Vec::new();
    for block_m in [8u32, 16] {
        for rows_per_warp in [16u32, 32] {
            for warps_n in [1u32, 2] {
                for &warps_k in values.warps_k {
                    for &block_k in values.block_k {
                        for &stages in values.stages {
                            for (&split_k, &min_ctas) in values
                                .split_k
                                .iter()
                                .flat_map(|s| values.min_ctas.iter().map(move |o| (s, o)))
                            {
                                let c = GemmConfig {
                                    family: Family::Sm90,
                                    a_type,
                                    block_m,
                                    block_n: rows_per_warp * warps_n,
                                    block_k,
                                    warps_m: 1,
                                    warps_n,
                                    warps_k,
                                    stages,
                                    split_k,
                                    swap_ab: true,
                                    pipeline,
                                    min_ctas,
                                };
                                if check(&c).is_ok()
                                    && (4..=16).contains(&(warps_n * warps_k))
                                    && (min_ctas == 1 || warps_n * warps_k * min_ctas <= 32)
                                    && slice_bytes(&c) <= 100 * 1024
                                    && keep(&c)
                                {
                                    out.push(c);
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

/// The warp-ring configurations of the search space (`Pipeline::WarpRing`, small M): the
/// register-streamed kernel with each warp's prefetch ring in its own shared memory.
///
/// Enumerated: block_m {8, 16}; 16 or 32 weight rows per warp, warps_n {1, 2}; warps_k {1, 2, 4,
/// 8}; block_k {256, 512, 1024, 2048, 3072, 6144}; ring depth {4, 8}; split_k {1, 2, 3, 4, 6, 8}.
/// Kept: 4..16 warps; 2..24 chunks per warp and pass; at most 100 KiB of activation slice and 200
/// KiB of shared memory in all.
pub fn warp_ring_space(a_type: AType) -> Vec<GemmConfig> {
    let values = StreamedValues {
        warps_k: &[1, 2, 4, 8],
        block_k: &[256, 512, 1024, 2048, 3072, 6144],
        stages: &[4, 8],
        split_k: &[1, 2, 3, 4, 6, 8],
        min_ctas: &[1, 2],
    };
    streamed_space(a_type, Pipeline::WarpRing, &values, |c| {
        (2..=24).contains(&(c.block_k / (128 * c.warps_k))) && smem_bytes(c) <= 200 * 1024
    })
}

/// The global-pipeline configurations of the search space (`Pipeline::Global`, small M): the
/// register-streamed kernel with the activations in the register ring too.
///
/// Enumerated: block_m {8, 16}; 16 or 32 weight rows per warp, warps_n {1, 2}; warps_k {1, 2, 4,
/// 8, 16}; block_k {256, 512, 1024, 2048, 3072, 6144}; ring depth {1, 2, 4, 6}; split_k {1, 2, 3,
/// 4, 6, 8, 12, 16}. Kept: 4..16 warps; 1..24 chunks per warp and pass (passes cost nothing here:
/// block_k only orders the chunks); a ring no deeper than a pass, at least 2 deep with 4 or more
/// chunks per pass, within the register budget; split_k > 8 as for the register pipeline.
pub fn global_space(a_type: AType) -> Vec<GemmConfig> {
    let values = StreamedValues {
        warps_k: &[1, 2, 4, 8, 16],
        block_k: &[256, 512, 1024, 2048, 3072, 6144],
        stages: &[1, 2, 4, 6],
        split_k: &[1, 2, 3, 4, 6, 8, 12, 16],
        min_ctas: &[1, 2, 4],
    };
    streamed_space(a_type, Pipeline::Global, &values, |c| {
        let chunks_per_pass = c.block_k / (128 * c.warps_k);
        (1..=24).contains(&chunks_per_pass)
            && c.stages <= chunks_per_pass
            && (c.stages >= 2 || chunks_per_pass < 4)
            && (c.split_k <= MAX_CLUSTER_SPLIT || (c.block_n <= 64 && c.block_k <= 512))
    })
}

/// Pruning rules of `search_space` (beyond legality).
fn keep(c: &GemmConfig) -> bool {
    if check(c).is_err() {
        return false;
    }
    let d = Derived::of(c);
    let warps = c.warps_m * c.warps_n * c.warps_k;
    let in_flight = c.stages * c.block_k;
    let mmas_per_step = d.p_tiles * d.q_tiles;
    // Weight bytes in flight per CTA: small-M kernels are bound by bytes in flight, so tiles with
    // few weight rows get deeper pipelines (up to 2048 k), larger ones 256..512 k.
    let w_bytes_in_flight = c.block_n * in_flight / 2;
    let common = (2..=8).contains(&warps)
        && (256..=2048).contains(&in_flight)
        && (in_flight <= 512 || w_bytes_in_flight <= 32 * 1024);
    if c.swap_ab {
        // Small M: one warp row of tokens (two at block_m 64), 16..64 weights per warp, in-CTA
        // split-K for deep K slices, split-K over CTAs for few output tiles.
        common
            && c.block_k >= 128
            && in_flight >= 512
            && (c.warps_k <= 2 || c.block_n <= 32)
            && (c.warps_m == 1 || c.block_m == 64)
            && d.warp_p <= if c.block_m <= 16 { 32 } else { 64 }
            && (c.split_k <= 4 || (c.block_m <= 32 && c.block_n <= 128))
            && (c.split_k <= MAX_CLUSTER_SPLIT || (c.block_m <= 16 && c.block_n <= 64))
            // Wider token tiles (32, 64) need less K splitting: there are more output tiles.
            && (c.block_m <= 16 || (c.split_k <= 4 && c.warps_k == 1))
            && (c.block_m <= 32 || c.split_k <= 2)
    } else {
        // Larger M: at least 64x64 per CTA and 4 MMAs per k-step per warp, no in-CTA split-K,
        // split-K only up to 4 for block_m <= 64.
        common
            && warps >= 4
            && in_flight <= 512
            && d.acc <= 64
            && c.block_m >= 32
            && c.block_n >= 64
            && mmas_per_step >= 4
            && c.warps_k == 1
            && (c.split_k == 1 || (c.block_m <= 64 && c.split_k <= 4))
    }
}
