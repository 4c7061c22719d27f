//! Seed configurations of the family: representative ones and measured ones.

use super::default_config;
use crate::problem::AType;
use crate::template::{Family, GemmConfig, Pipeline};

/// Representative configurations (small-M streaming, mid-M, large-M), compiled by the NVRTC tests
/// and emitted by `fp4tune compile --configs representative --emit DIR`.
pub fn representative_configs(a_type: AType) -> Vec<GemmConfig> {
    let base = GemmConfig {
        family: Family::Sm90,
        a_type,
        block_m: 16,
        block_n: 64,
        block_k: 128,
        warps_m: 1,
        warps_n: 4,
        warps_k: 1,
        stages: 4,
        split_k: 1,
        swap_ab: true,
        pipeline: Pipeline::CpAsync,
        min_ctas: 1,
    };
    vec![
        base,
        GemmConfig {
            block_m: 8,
            block_n: 32,
            block_k: 256,
            warps_n: 2,
            warps_k: 2,
            stages: 2,
            split_k: 4,
            ..base
        },
        GemmConfig {
            block_m: 16,
            block_n: 128,
            block_k: 128,
            warps_n: 4,
            stages: 4,
            split_k: 3,
            ..base
        },
        GemmConfig {
            block_m: 64,
            block_n: 128,
            block_k: 64,
            warps_m: 2,
            warps_n: 2,
            stages: 6,
            ..base
        },
        GemmConfig {
            block_m: 64,
            block_n: 128,
            block_k: 128,
            warps_m: 2,
            warps_n: 2,
            stages: 3,
            swap_ab: false,
            ..base
        },
        GemmConfig {
            block_m: 8,
            block_n: 64,
            block_k: 128,
            warps_n: 4,
            stages: 4,
            split_k: 12,
            ..base
        },
        GemmConfig {
            block_m: 32,
            block_n: 64,
            block_k: 64,
            warps_m: 2,
            warps_n: 2,
            stages: 4,
            split_k: 2,
            swap_ab: false,
            ..base
        },
        default_config(a_type),
        GemmConfig {
            block_m: 128,
            block_n: 256,
            block_k: 64,
            warps_m: 2,
            warps_n: 4,
            stages: 4,
            swap_ab: false,
            ..base
        },
    ]
}

/// Seeds for the tuner: the fastest configurations measured on an H200 (W4A16, CUDA-graph replay,
/// weights rotated through more than 4x L2) for the GLM-5 expert shapes, over every weight
/// pipeline. Every tuning run measures them on every key where they are legal; the search space
/// must contain them (a test checks).
pub fn measured_winners(a_type: AType) -> Vec<GemmConfig> {
    let c = |block_m, block_n, block_k, warps_m, warps_n, warps_k, stages, split_k, swap_ab| {
        GemmConfig::cp_async(
            Family::Sm90,
            a_type,
            [block_m, block_n, block_k],
            [warps_m, warps_n, warps_k],
            stages,
            split_k,
            swap_ab,
        )
    };
    // The streamed pipelines: swap-AB, one warp along M.
    let d = |block_m, block_n, block_k, warps_n, warps_k, stages, split_k, pipeline| GemmConfig {
        pipeline,
        ..c(block_m, block_n, block_k, 1, warps_n, warps_k, stages, split_k, true)
    };
    vec![
        c(8, 32, 256, 1, 2, 2, 4, 2, true),
        c(16, 32, 256, 1, 2, 2, 6, 2, true),
        c(8, 16, 256, 1, 1, 2, 8, 6, true),
        c(16, 32, 256, 1, 2, 2, 6, 6, true),
        c(8, 64, 256, 1, 4, 2, 4, 1, true),
        c(16, 64, 128, 1, 4, 1, 4, 1, true),
        c(64, 128, 128, 1, 4, 1, 3, 1, false),
        d(8, 32, 1024, 2, 2, 4, 6, Pipeline::WarpRing),
        d(8, 16, 2048, 1, 4, 4, 3, Pipeline::Registers),
        d(8, 32, 256, 2, 2, 1, 1, Pipeline::Registers),
        d(8, 16, 3072, 1, 8, 8, 2, Pipeline::WarpRing),
        d(8, 16, 512, 1, 4, 1, 1, Pipeline::Registers),
        d(8, 32, 6144, 2, 8, 4, 1, Pipeline::WarpRing),
        d(8, 16, 2048, 1, 4, 8, 1, Pipeline::WarpRing),
        d(16, 32, 2048, 2, 4, 8, 3, Pipeline::WarpRing),
        GemmConfig { min_ctas: 4, ..d(8, 16, 1024, 1, 4, 2, 6, Pipeline::Global) },
        GemmConfig { min_ctas: 2, ..d(8, 16, 1024, 1, 4, 2, 6, Pipeline::Global) },
        GemmConfig { min_ctas: 2, ..d(8, 16, 3072, 1, 8, 4, 2, Pipeline::WarpRing) },
        d(8, 32, 6144, 1, 8, 4, 1, Pipeline::WarpRing),
        d(8, 16, 1024, 1, 4, 2, 1, Pipeline::Global),
    ]
}

/// The defaults for small M (up to [`crate::template::DECODE_DEFAULT_MAX_M`]) of a shape without a
/// table entry or a legal common configuration: 8-row swap-AB tiles of 16 or 32 weight rows, a
/// CTA's K split over its warps and no split-K (no workspace, so a shape outside the table always
/// fits), so that a narrow N still spreads over N / 16 CTAs where the generic default's 128-column
/// tiles give N / 128. Each is the split_k 1 form of a measured GEMM winner of the GLM-5 expert
/// shapes: [0] 1024-k warp-ring stages (N 512 x K 6144 at M = 1..8), [1] 256-k cp.async stages
/// (N 6144 x K 1536), [2] 32-row tiles of 128-k stages (N 6144 x K 256).
pub fn decode_defaults(a_type: AType) -> [GemmConfig; 3] {
    let swap = |block_n, block_k, warps_n, warps_k, stages, pipeline, min_ctas| GemmConfig {
        pipeline,
        min_ctas,
        ..GemmConfig::cp_async(
            Family::Sm90,
            a_type,
            [8, block_n, block_k],
            [1, warps_n, warps_k],
            stages,
            1,
            true,
        )
    };
    [
        swap(16, 1024, 1, 4, 8, Pipeline::WarpRing, 2),
        swap(16, 256, 1, 4, 3, Pipeline::CpAsync, 1),
        swap(32, 128, 2, 2, 4, Pipeline::CpAsync, 1),
    ]
}

/// The defaults above [`crate::template::DECODE_DEFAULT_MAX_M`] rows of a W4A16 shape without a
/// table entry or a legal common configuration, tried before the generic one, none splitting K:
/// [0] 64 x 128 tiles of 128-k cp.async stages, 4 warps along N; [1] 16-row swap-AB tiles of 64
/// weight rows and 128-k stages, for a grid the first leaves short of CTAs
/// ([`prefill_default_order`]). In the H200 and H100 tune logs of the GLM-5 and held-out expert
/// shapes (`results/h200/nvidia-h200-w4a16.jsonl.gz`, `nvidia-h200-ep8-w4a16.jsonl.gz`,
/// `exhaustive-tp8-down-w4a16.jsonl.gz`, `tune-default/`, `results/h100/heldout-*/`: 38 keys of
/// M = 128..8192 that measured [0] and the generic one) the generic 128 x 128 tiles of 64-k stages
/// take 1.14-3.31x the time of [0] (N 6144 x K 256 at M = 8192: 171.6 against 53.1 us), which is
/// the fastest of the configurations without split-K measured there at 20 of them. None for
/// W4A4, whose GEMMs at these M have not been measured.
pub fn prefill_defaults(a_type: AType) -> Vec<GemmConfig> {
    match a_type {
        AType::Bf16 => vec![
            GemmConfig::cp_async(Family::Sm90, a_type, [64, 128, 128], [1, 4, 1], 3, 1, false),
            GemmConfig::cp_async(Family::Sm90, a_type, [16, 64, 128], [1, 4, 1], 4, 1, true),
        ],
        AType::Nvfp4 => Vec::new(),
    }
}

/// CTAs of [`prefill_defaults`]' 64 x 128 grid up to which a problem tries the 16-row tiles first
/// (about half the SMs of an H100 or H200).
pub const PREFILL_FEW_CTAS: u32 = 64;

/// The order in which a problem of `m` rows and `n` columns tries the prefill defaults (indices
/// into [`prefill_defaults`]): the 16-row tiles first when the 64 x 128 tiles make at most
/// [`PREFILL_FEW_CTAS`] CTAs. In the same logs, at the 16 keys that measured both, this order
/// puts the faster first at every one: a grid of 8 to 64 CTAs (N = 512, M = 128..1024; N = 4096,
/// M = 128) took 18.8-49.0 us on the 16-row tiles against 51.7-52.2 us on the 64 x 128 ones, a
/// grid of 96 or more (N = 4096 and 6144) 1.15-3.35x longer on the 16-row tiles.
pub fn prefill_default_order(m: u32, n: u32) -> &'static [usize] {
    if m.div_ceil(64).saturating_mul(n.div_ceil(128)) <= PREFILL_FEW_CTAS {
        &[1, 0]
    } else {
        &[0, 1]
    }
}

/// The order in which a problem of `m` rows and depth `k` tries the decode defaults (indices into
/// [`decode_defaults`]; the first whose stages divide K runs), from their measurement on an H100
/// over the routed shapes of GLM-5, Qwen3-Next, Mixtral-8x7B and DeepSeek-V3 at M = 1..64
/// (results/h100/decode-defaults.md): a short K (up to 512) runs fastest on the 32-row tiles, one
/// or two rows of a deep K on the 1024-k warp ring, more rows on the 256-k stages.
pub fn decode_default_order(m: u32, k: u32) -> &'static [usize] {
    if k <= 512 {
        &[2, 1]
    } else if m <= 2 {
        &[0, 1, 2]
    } else {
        &[1, 2]
    }
}
