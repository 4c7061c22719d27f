//! The SM80/SM90 family: NVFP4 dequantized exactly to bf16 in registers, bf16 `mma.sync` m16n8k16.
//!
//! This module owns the Rust half of `templates/sm90/`: the constraints of a configuration (the same
//! limits the template's `Sm90Config` asserts), its shared-memory size, the instantiation unit, the
//! search space and a generic default. It also mirrors the template's index maps (the K permutation
//! of the MMA fragments and the shared-memory swizzles) so that they can be tested without a GPU.
//!
//! Four weight pipelines ([`Pipeline`]): `CpAsync` (`gemm.cuh`, `Sm90Config`, any M) and the three
//! streamed ones of `direct.cuh` (`DirectConfig`, swap-AB, decode-sized M): `Registers` (a per-warp
//! register ring, `stages` = ring depth 1..8), `WarpRing` (a per-warp shared-memory ring 2..16
//! deep) and `Global` (the register ring holds the activations too). For `Registers` and
//! `WarpRing`, `block_k` is the activation slice a CTA keeps in shared memory per pass (one pass
//! when `block_k = K / split_k`); for `Global` it only orders the chunks. Split-K <= 8 is reduced
//! with one cluster barrier into rank 0 (workspace + counters above 8, as for `CpAsync`), and
//! `min_ctas` compiles a streamed kernel for that many CTAs per SM.
//!
//! Launch contract (see `templates/sm90/gemm.cuh`): grid `(ceil(N/block_n), ceil(M/block_m),
//! split_k)`, `threads()` threads, `smem_bytes()` of dynamic shared memory (opt-in above 48 KiB);
//! with `split_k > 1` a workspace of `split_k*M*N` floats and one zeroed u32 counter per output tile
//! (index `m_tile * n_tiles + n_tile`), left zeroed by the kernel.

use super::{ConstraintError, Family, GemmConfig, Pipeline};
use crate::problem::{AType, GemmProblem};

/// Opt-in dynamic shared memory per block on H100/H200 (227 KiB).
pub const MAX_SMEM_BYTES: u32 = 232_448;
/// Most fp32 accumulators one lane may hold before register spills become likely.
pub const MAX_ACC_PER_LANE: u32 = 128;

/// Quantities derived from a configuration, named as in `templates/sm90/config.cuh`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Derived {
    /// Rows on the MMA's 16-row side (weights under swap_ab, else tokens) and on its 8-wide side.
    pub p_rows: u32,
    pub q_rows: u32,
    pub warps_p: u32,
    pub warps_q: u32,
    pub warp_p: u32,
    pub warp_q: u32,
    pub p_tiles: u32,
    pub q_tiles: u32,
    /// fp32 accumulators per lane (one set).
    pub acc: u32,
    /// Independent accumulator sets (small warp tiles rotate k-steps over them to break the MMA
    /// dependency chain; `Sm90Config::ACC_SETS`).
    pub acc_sets: u32,
    pub k_per_warp: u32,
    /// K per fragment chunk: 128, or 64 when a warp's K slice of a stage is 64 wide.
    pub chunk: u32,
}

impl Derived {
    pub fn of(c: &GemmConfig) -> Derived {
        let (p_rows, q_rows) = c.pq_rows();
        let (warps_p, warps_q) = c.pq_warps();
        let warp_p = p_rows / warps_p.max(1);
        let warp_q = q_rows / warps_q.max(1);
        let k_per_warp = c.block_k / c.warps_k.max(1);
        Derived {
            p_rows,
            q_rows,
            warps_p,
            warps_q,
            warp_p,
            warp_q,
            p_tiles: warp_p / 16,
            q_tiles: warp_q / 8,
            acc: (warp_p / 16) * (warp_q / 8) * 4,
            acc_sets: match (warp_p / 16) * (warp_q / 8) {
                0 | 1 => 4,
                2 | 3 => 2,
                _ => 1,
            },
            k_per_warp,
            chunk: if k_per_warp >= 128 { 128 } else { 64 },
        }
    }
}

fn align128(x: u32) -> u32 {
    x.div_ceil(128) * 128
}

/// Bytes of one pipeline stage: W codes, W scales, A (codes or bf16), A scales; each region
/// 128-byte aligned (`Sm90Config::STAGE_BYTES`).
pub fn stage_bytes(c: &GemmConfig) -> u32 {
    let (bm, bn, bk) = (c.block_m, c.block_n, c.block_k);
    let w = align128(bn * bk / 2) + align128(bn * bk / 16);
    let a = match c.a_type {
        AType::Nvfp4 => align128(bm * bk / 2) + align128(bm * bk / 16),
        AType::Bf16 => align128(bm * bk * 2),
    };
    w + a
}

/// Dynamic shared memory of one CTA (`Sm90Config::SMEM_BYTES`): the pipeline, or the in-CTA
/// split-K reduction buffer if larger.
pub fn smem_bytes(c: &GemmConfig) -> u32 {
    let d = Derived::of(c);
    if c.pipeline.is_direct() {
        // `DirectConfig::SMEM_BYTES`: the slice, then one reduction slot per (cluster rank, warp
        // along K) for split_k <= 8; above, epilogue.cuh's in-CTA buffer reuses offset 0.
        let tile = c.warps_n * 32 * d.acc * 4;
        let slots = if c.split_k <= MAX_CLUSTER_SPLIT { c.split_k * c.warps_k } else { 0 };
        let slot_bytes = if slots > 1 { slots * tile } else { 0 };
        let red =
            if c.split_k > MAX_CLUSTER_SPLIT { c.warps_k.saturating_sub(1) * tile } else { 0 };
        let main = if c.pipeline == Pipeline::WarpRing {
            let stage = d.p_tiles * 2 * (512 + 128);
            align128(slice_bytes(c) + slot_bytes) + c.threads() / 32 * c.stages * stage
        } else {
            slice_bytes(c) + slot_bytes
        };
        return main.max(red).max(16);
    }
    let pipe = c.stages * stage_bytes(c);
    let red = c.warps_k.saturating_sub(1) * c.warps_m * c.warps_n * 32 * d.acc * 4;
    let cluster_red = if cluster_split(c) { c.warps_m * c.warps_n * 32 * d.acc * 4 } else { 0 };
    pipe.max(red).max(cluster_red).max(16)
}

/// Bytes of the activation slice of a register-streamed kernel (`DirectConfig::SLICE_BYTES`):
/// (block_m, block_k) codes + scales or bf16; none for `Pipeline::Global`.
pub fn slice_bytes(c: &GemmConfig) -> u32 {
    if c.pipeline == Pipeline::Global {
        return 0;
    }
    let (bm, bk) = (c.block_m, c.block_k);
    match c.a_type {
        AType::Nvfp4 => align128(bm * bk / 2) + align128(bm * bk / 16),
        AType::Bf16 => align128(bm * bk * 2),
    }
}

/// Largest weight-row tiles (m16) per warp and chunk tiles in a warp's register ring of a
/// register-streamed kernel (`DirectConfig`): P_TILES <= 4, P_TILES * DEPTH <= 8.
pub const MAX_DIRECT_P_TILES: u32 = 4;
pub const MAX_DIRECT_RING_TILES: u32 = 8;

/// Register budget (32-bit registers per lane) of the ring of a `Pipeline::Global` kernel
/// (`DirectConfig::RING_ENTRY_REGS * DEPTH`): at most 112, and 64 below the kernel's register
/// cap (`GemmConfig::register_cap`; the rest holds accumulators, pointers and the dequantized
/// fragments).
pub fn max_global_ring_registers(c: &GemmConfig) -> u32 {
    c.register_cap().saturating_sub(64).min(112)
}

/// Shared memory the SM reserves per resident CTA on top of its dynamic shared memory.
pub const SMEM_RESERVED_PER_CTA: u32 = 1024;
/// Shared memory per SM (228 KiB) that `min_ctas` CTAs share.
pub const SMEM_PER_SM: u32 = 233_472;

/// Registers per lane of a kernel's register ring (`DirectConfig`): per chunk, 10 per m16 weight
/// tile (two 16-byte code runs and their scales), and with `Pipeline::Global` also 16 (bf16 run)
/// or 5 (NVFP4) per n8 token tile; 0 for the pipelines that prefetch into shared memory.
pub fn ring_registers(c: &GemmConfig) -> u32 {
    let per_token_tile = match (c.pipeline, c.a_type) {
        (Pipeline::Registers, _) => 0,
        (Pipeline::Global, AType::Nvfp4) => 5,
        (Pipeline::Global, AType::Bf16) => 16,
        (Pipeline::CpAsync | Pipeline::WarpRing, _) => return 0,
    };
    let d = Derived::of(c);
    c.stages * (d.p_tiles * 10 + d.q_tiles * per_token_tile)
}

/// Largest split_k reduced inside a thread-block cluster (portable cluster size).
pub const MAX_CLUSTER_SPLIT: u32 = 8;

/// Whether split-K is reduced through distributed shared memory of a (1, 1, split_k) cluster
/// (`Sm90Config::CLUSTER_SPLIT`): no workspace, no counters. Larger split_k use the global
/// workspace and tile counters.
pub fn cluster_split(c: &GemmConfig) -> bool {
    c.split_k > 1 && c.split_k <= MAX_CLUSTER_SPLIT
}

/// Constraints of the configuration alone; the template's static_asserts are the same.
pub fn check(c: &GemmConfig) -> Result<(), ConstraintError> {
    let err = |msg: String| Err(c.violation(msg));
    if c.family != Family::Sm90 {
        return err(format!("family {} is not sm90", c.family));
    }
    if c.warps_m == 0 || c.warps_n == 0 || c.warps_k == 0 {
        return err("warp counts must be at least 1".into());
    }
    if c.block_m == 0 || c.block_n == 0 {
        return err("block_m and block_n must be positive".into());
    }
    let threads = c.threads();
    if !(32..=1024).contains(&threads) {
        return err(format!("{threads} threads per CTA, the limit is 32..=1024"));
    }
    if c.pipeline.is_direct() {
        return check_direct(c);
    }
    if c.min_ctas != 1 {
        return err(format!(
            "min_ctas {} is for the streamed pipelines; the cp.async kernel is compiled for 1 CTA per SM",
            c.min_ctas
        ));
    }
    if ![64, 128, 256].contains(&c.block_k) {
        return err(format!("block_k {} must be 64, 128 or 256", c.block_k));
    }
    let d = Derived::of(c);
    if c.block_k % c.warps_k != 0 || d.k_per_warp % 64 != 0 {
        return err(format!(
            "block_k / warps_k = {} / {} must be a multiple of 64",
            c.block_k, c.warps_k
        ));
    }
    if d.k_per_warp % d.chunk != 0 {
        return err(format!(
            "block_k / warps_k = {} above 128 must be a multiple of 128",
            d.k_per_warp
        ));
    }
    let (p_name, q_name) = if c.swap_ab { ("block_n", "block_m") } else { ("block_m", "block_n") };
    if d.p_rows % d.warps_p != 0 || d.warp_p % 16 != 0 {
        return err(format!(
            "{p_name} / warps = {} / {} must be a multiple of 16 (the MMA's 16-row side{})",
            d.p_rows,
            d.warps_p,
            if c.swap_ab { ", weights under swap_ab" } else { "" }
        ));
    }
    if d.q_rows % d.warps_q != 0 || d.warp_q % 8 != 0 {
        return err(format!(
            "{q_name} / warps = {} / {} must be a multiple of 8 (the MMA's 8-wide side)",
            d.q_rows, d.warps_q
        ));
    }
    if d.acc > MAX_ACC_PER_LANE {
        return err(format!(
            "{} fp32 accumulators per lane (warp tile {}x{}), at most {MAX_ACC_PER_LANE}",
            d.acc, d.warp_p, d.warp_q
        ));
    }
    if !(2..=8).contains(&c.stages) {
        return err(format!("stages {} must be 2..=8", c.stages));
    }
    if !(1..=64).contains(&c.split_k) {
        return err(format!("split_k {} must be 1..=64", c.split_k));
    }
    let smem = smem_bytes(c);
    if smem > MAX_SMEM_BYTES {
        return err(format!("{smem} bytes of shared memory, the SM90 limit is {MAX_SMEM_BYTES}"));
    }
    Ok(())
}

/// Constraints of a register-streamed configuration (`templates/sm90/direct.cuh`, `DirectConfig`).
fn check_direct(c: &GemmConfig) -> Result<(), ConstraintError> {
    let err = |msg: String| Err(c.violation(msg));
    if !c.swap_ab || c.warps_m != 1 {
        return err(format!("the {:?} pipeline is swap_ab only, with warps_m = 1", c.pipeline));
    }
    if ![8, 16, 32].contains(&c.block_m) {
        return err(format!(
            "block_m {} must be 8, 16 or 32 with the {:?} pipeline",
            c.block_m, c.pipeline
        ));
    }
    let d = Derived::of(c);
    if c.block_n % c.warps_n != 0 || d.warp_p % 16 != 0 || d.p_tiles > MAX_DIRECT_P_TILES {
        return err(format!(
            "block_n / warps_n = {} / {} must be 16..{} weight rows per warp, a multiple of 16",
            c.block_n,
            c.warps_n,
            16 * MAX_DIRECT_P_TILES
        ));
    }
    if c.warps_k > 16 {
        return err(format!("warps_k {} must be at most 16", c.warps_k));
    }
    if c.block_k < 256 || c.block_k % (128 * c.warps_k) != 0 {
        return err(format!(
            "block_k {} must be at least 256 and a multiple of 128 * warps_k = {}",
            c.block_k,
            128 * c.warps_k
        ));
    }
    if c.pipeline == Pipeline::WarpRing {
        if !(2..=16).contains(&c.stages) {
            return err(format!("warp ring depth {} must be 2..=16 stages", c.stages));
        }
    } else if !(1..=8).contains(&c.stages) {
        return err(format!("ring depth {} must be 1..=8 chunks", c.stages));
    } else if c.pipeline == Pipeline::Global {
        let regs = ring_registers(c);
        let budget = max_global_ring_registers(c);
        if regs > budget {
            return err(format!(
                "ring of {} chunks holds {regs} registers per lane (weights and activations), at most {budget} \
                 with {} threads and {} CTAs per SM",
                c.stages,
                c.threads(),
                c.min_ctas
            ));
        }
    } else if d.p_tiles * c.stages > MAX_DIRECT_RING_TILES {
        return err(format!(
            "{} m16 tiles x ring depth {} exceeds the register budget of {MAX_DIRECT_RING_TILES} chunk tiles",
            d.p_tiles, c.stages
        ));
    }
    if d.acc_sets * d.acc > MAX_ACC_PER_LANE {
        return err(format!(
            "{} accumulators per lane, at most {MAX_ACC_PER_LANE}",
            d.acc_sets * d.acc
        ));
    }
    if !(1..=64).contains(&c.split_k) {
        return err(format!("split_k {} must be 1..=64", c.split_k));
    }
    let smem = smem_bytes(c);
    if smem > MAX_SMEM_BYTES {
        return err(format!("{smem} bytes of shared memory, the SM90 limit is {MAX_SMEM_BYTES}"));
    }
    check_occupancy(c, smem)
}

/// `min_ctas` (CTAs per SM the kernel is compiled for) of a streamed kernel: 1..=16, at most 64
/// warps per SM, their shared memory fits in one SM, and above 1 the register cap leaves 64
/// registers per lane beside a register ring.
fn check_occupancy(c: &GemmConfig, smem: u32) -> Result<(), ConstraintError> {
    let err = |msg: String| Err(c.violation(msg));
    if !(1..=16).contains(&c.min_ctas) {
        return err(format!("min_ctas {} must be 1..=16", c.min_ctas));
    }
    if c.min_ctas == 1 {
        return Ok(());
    }
    if c.threads() * c.min_ctas > 2048 {
        return err(format!(
            "{} CTAs of {} threads exceed the 2048 threads of an SM",
            c.min_ctas,
            c.threads()
        ));
    }
    let per_sm = c.min_ctas * (smem + SMEM_RESERVED_PER_CTA);
    if per_sm > SMEM_PER_SM {
        return err(format!(
            "{} CTAs need {per_sm} bytes of shared memory, an SM has {SMEM_PER_SM}",
            c.min_ctas
        ));
    }
    let ring = ring_registers(c);
    let cap = c.register_cap();
    if cap < 64 + ring {
        return err(format!(
            "{} CTAs of {} threads leave {cap} registers per lane, under 64 + {ring} of register ring",
            c.min_ctas,
            c.threads()
        ));
    }
    Ok(())
}

/// Constraints of running `c` on `p` (after `check` and the a_type match done by the caller).
pub fn check_problem(c: &GemmConfig, p: &GemmProblem) -> Result<(), ConstraintError> {
    let err = |msg: String| Err(c.violation(msg));
    if p.k % c.block_k != 0 {
        return err(format!("K = {} is not a multiple of block_k = {}", p.k, c.block_k));
    }
    if p.n % 8 != 0 {
        return err(format!("N = {} is not a multiple of 8", p.n));
    }
    let k_blocks = p.k / c.block_k;
    if c.split_k > k_blocks {
        return err(format!(
            "split_k = {} exceeds the {k_blocks} k-blocks of K = {}",
            c.split_k, p.k
        ));
    }
    if p.m.div_ceil(c.block_m) > 65_535 {
        return err(format!("M = {} needs more than 65535 CTAs along grid y", p.m));
    }
    let limit = i32::MAX as u32;
    if p.m > limit || p.n > limit || p.k > limit {
        return err(format!("{p}: dimensions must fit in i32"));
    }
    Ok(())
}

/// The instantiation unit: the template, the configuration, a cross-check of the shared-memory
/// size computed here, and the `extern "C"` kernel.
pub fn instantiation(c: &GemmConfig) -> String {
    let threads = c.threads();
    let smem = smem_bytes(c);
    let cluster = if cluster_split(c) {
        format!(" __cluster_dims__(1, 1, {})", c.split_k)
    } else {
        String::new()
    };
    let fp4 = c.a_type == AType::Nvfp4;
    // (header, configuration type, the header that defines it, entry function)
    let (header, cfg, cfg_file, entry) = if c.pipeline.is_direct() {
        (
            "sm90/direct.cuh",
            format!(
                "DirectConfig<{}, {}, {}, {}, {}, {}, {}, {fp4}, {}, {}, {}>",
                c.block_m,
                c.block_n,
                c.block_k,
                c.warps_n,
                c.warps_k,
                c.stages,
                c.split_k,
                c.pipeline == Pipeline::WarpRing,
                c.pipeline == Pipeline::Global,
                c.min_ctas
            ),
            "templates/sm90/direct.cuh",
            "gemm_direct",
        )
    } else {
        (
            "sm90/gemm.cuh",
            format!(
                "Sm90Config<{}, {}, {}, {}, {}, {}, {}, {}, {}, {fp4}>",
                c.block_m,
                c.block_n,
                c.block_k,
                c.warps_m,
                c.warps_n,
                c.warps_k,
                c.stages,
                c.split_k,
                c.swap_ab
            ),
            "templates/sm90/config.cuh",
            "gemm",
        )
    };
    format!(
        "// fp4tune SM90 kernel {name}\n\
         #include \"{header}\"\n\
         using Cfg = fp4tune::sm90::{cfg};\n\
         static_assert(Cfg::SMEM_BYTES == {smem}, \"Rust (template/sm90.rs smem_bytes) and {cfg_file} disagree on shared memory\");\n\
         static_assert(Cfg::THREADS == {threads}, \"Rust and {cfg_file} disagree on threads\");\n\
         extern \"C\" __global__ void __launch_bounds__({threads}, {min_ctas}){cluster} {kernel}(const fp4tune::GemmParams p) {{\n\
         \x20   fp4tune::sm90::{entry}<Cfg>(p);\n\
         }}\n",
        name = c.name(),
        kernel = c.kernel_name(),
        min_ctas = c.min_ctas,
    )
}

/// A generic configuration, like a library would ship without tuning: 128x128 tiles, 8 warps,
/// BLOCK_K 64, 4 stages, no split-K.
pub fn default_config(a_type: AType) -> GemmConfig {
    GemmConfig {
        family: Family::Sm90,
        a_type,
        block_m: 128,
        block_n: 128,
        block_k: 64,
        warps_m: 2,
        warps_n: 4,
        warps_k: 1,
        stages: 4,
        split_k: 1,
        swap_ab: false,
        pipeline: Pipeline::CpAsync,
        min_ctas: 1,
    }
}

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
                                        let c = GemmConfig {
                                            family: Family::Sm90,
                                            a_type,
                                            block_m,
                                            block_n,
                                            block_k,
                                            warps_m,
                                            warps_n,
                                            warps_k,
                                            stages,
                                            split_k,
                                            swap_ab,
                                            pipeline: Pipeline::CpAsync,
                                            min_ctas: 1,
                                        };
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

// ---- mirrors of templates/sm90/layout.cuh ------------------------------------------------------

/// The K permutation (`layout.cuh: k_local`): real k (within a chunk of `ch` = 64 or 128) of MMA
/// position `p` (0..16) at step `j` (0..ch/16). Lane t = (p % 8) / 2 owns k in [t*ch/4, (t+1)*ch/4).
pub fn k_local(ch: u32, j: u32, p: u32) -> u32 {
    ((p % 8) / 2) * (ch / 4) + 8 * (j / 2) + 2 * (j % 2) + p / 8 + 4 * (p % 2)
}

/// Physical 16-byte unit of logical unit `u` of row `r` in a packed-code tile of `units` units per
/// row (`layout.cuh: code_unit_swizzle`).
pub fn code_unit_swizzle(units: u32, r: u32, u: u32) -> u32 {
    match units {
        8 => u ^ (((r & 1) << 2) | (((r >> 1) & 1) << 1)),
        4 => u ^ (((r >> 1) & 1) << 1),
        _ => u,
    }
}

/// Physical 16-byte unit of logical unit `u` of row `r` in a bf16 tile (`layout.cuh: bf16_unit_swizzle`).
pub fn bf16_unit_swizzle(r: u32, u: u32) -> u32 {
    u ^ ((((u >> 3) & 1) << 1) | (r & 1))
}

/// 32-bit word of scale group `g` (4 scales, 64 k) of row `r` in a stage's scale tile of `rows`
/// rows and `groups` groups (`layout.cuh: sf_word`).
pub fn sf_word(rows: u32, groups: u32, r: u32, g: u32) -> u32 {
    if rows % 128 == 0 {
        ((r >> 7) * groups + g) * 128 + (r & 31) * 4 + ((r >> 5) & 3)
    } else {
        g * rows + r
    }
}

/// Byte offset of scale (row, kb) in the global swizzled 128x4 layout (`params.cuh`).
pub fn swizzled_sf_offset(row: u32, kb: u32, ksf_pad: u32) -> u32 {
    ((row >> 7) * (ksf_pad >> 2) + (kb >> 2)) * 512
        + (row & 31) * 16
        + ((row >> 5) & 3) * 4
        + (kb & 3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// m16n64k128, 4 warps along N, 4 stages, swap-AB (the first representative configuration).
    fn cfg(a_type: AType) -> GemmConfig {
        representative_configs(a_type)[0]
    }

    fn reject(c: GemmConfig, needle: &str) {
        let e = check(&c).expect_err("config must be rejected");
        assert!(e.reason.contains(needle), "expected `{needle}` in `{}`", e.reason);
    }

    #[test]
    fn constraint_checks_reject_illegal_configs_with_a_message() {
        assert!(check(&cfg(AType::Bf16)).is_ok());
        assert!(check(&default_config(AType::Bf16)).is_ok());
        assert!(check(&default_config(AType::Nvfp4)).is_ok());
        reject(GemmConfig { block_k: 96, ..cfg(AType::Bf16) }, "block_k 96");
        reject(GemmConfig { warps_n: 8, warps_m: 8, warps_k: 4, ..cfg(AType::Bf16) }, "threads");
        // 64 weights over 8 warps = 8 rows: not a multiple of 16 under swap_ab.
        reject(GemmConfig { warps_n: 8, ..cfg(AType::Bf16) }, "multiple of 16");
        // 16 tokens over 4 warps = 4: not a multiple of 8.
        reject(GemmConfig { warps_m: 4, warps_n: 1, ..cfg(AType::Bf16) }, "multiple of 8");
        reject(GemmConfig { warps_k: 4, ..cfg(AType::Bf16) }, "multiple of 64");
        reject(
            GemmConfig {
                block_k: 256,
                warps_k: 1,
                block_m: 128,
                block_n: 256,
                swap_ab: false,
                warps_m: 2,
                warps_n: 4,
                stages: 8,
                ..cfg(AType::Bf16)
            },
            "shared memory",
        );
        reject(
            GemmConfig {
                block_m: 128,
                block_n: 256,
                swap_ab: false,
                warps_m: 1,
                warps_n: 1,
                ..cfg(AType::Bf16)
            },
            "accumulators",
        );
        reject(GemmConfig { stages: 1, ..cfg(AType::Bf16) }, "stages");
        reject(GemmConfig { split_k: 0, ..cfg(AType::Bf16) }, "split_k");
        reject(GemmConfig { family: Family::Sm120, ..cfg(AType::Bf16) }, "family");
    }

    #[test]
    fn problem_checks() {
        let c = GemmConfig { split_k: 8, ..cfg(AType::Bf16) };
        assert!(c.check_problem(&GemmProblem::new(1, 4096, 6144, AType::Bf16)).is_ok());
        let e = c.check_problem(&GemmProblem::new(1, 4096, 6100, AType::Bf16)).unwrap_err();
        assert!(e.reason.contains("multiple of block_k"), "{e}");
        let e = c.check_problem(&GemmProblem::new(1, 4100, 6144, AType::Bf16)).unwrap_err();
        assert!(e.reason.contains("multiple of 8"), "{e}");
        let e = c.check_problem(&GemmProblem::new(1, 4096, 512, AType::Bf16)).unwrap_err();
        assert!(e.reason.contains("exceeds"), "{e}");
        let e = c.check_problem(&GemmProblem::new(1, 4096, 6144, AType::Nvfp4)).unwrap_err();
        assert!(e.reason.contains("built for"), "{e}");
    }

    #[test]
    fn smem_formula_matches_hand_computed_values() {
        // W4A16, swap 16x64x128, 4 stages: W codes 64*64 = 4096, W scales 64*8 = 512,
        // A bf16 16*128*2 = 4096 -> 8704 per stage.
        let c = cfg(AType::Bf16);
        assert_eq!(stage_bytes(&c), 8704);
        assert_eq!(smem_bytes(&c), 4 * 8704);
        // W4A4: A codes 16*64 = 1024, A scales 16*8 = 128 -> 4096 + 512 + 1024 + 128 = 5760.
        assert_eq!(stage_bytes(&cfg(AType::Nvfp4)), 5760);
        // Regions are 128-byte aligned: block_n 16, block_k 64: W scales 16*4 = 64 -> 128.
        let c = GemmConfig { block_n: 16, block_k: 64, warps_n: 1, ..cfg(AType::Nvfp4) };
        // W codes 16*32 = 512, W sf 64 -> 128, A codes 16*32 = 512, A sf 64 -> 128.
        assert_eq!(stage_bytes(&c), 512 + 128 + 512 + 128);
        // The reduction buffer wins when it is larger than the pipeline.
        let c = GemmConfig { block_k: 256, warps_k: 4, warps_n: 1, stages: 2, ..cfg(AType::Nvfp4) };
        let d = Derived::of(&c);
        assert_eq!(d.acc, 4 * 2 * 4);
        assert_eq!(smem_bytes(&c), (2 * stage_bytes(&c)).max(3 * 32 * 32 * 4));
        // Default: 128x128x64 bf16: W 4096 + 512, A 16384 -> 20992 per stage, 4 stages.
        assert_eq!(smem_bytes(&default_config(AType::Bf16)), 4 * 20992);
    }

    #[test]
    fn k_permutation_is_a_bijection_and_matches_the_register_data_path() {
        for ch in [64u32, 128] {
            let steps = ch / 16;
            let mut seen = HashSet::new();
            for j in 0..steps {
                for p in 0..16 {
                    let k = k_local(ch, j, p);
                    assert!(k < ch);
                    assert!(seen.insert(k), "k {k} twice (ch {ch})");
                }
            }
            assert_eq!(seen.len() as u32, ch);
            // Simulate what a lane's registers hold: lane t's run starts at t*ch/4; word w covers
            // elements 8w..8w+8 of the run; r[s] = (element s, element s+4); step 2w+jj takes
            // lo = r[2jj] at positions (2t, 2t+1) and hi = r[2jj+1] at (2t+8, 2t+9). A (rows g and
            // g+8) and B (column g) fragments both hold exactly these positions for lane t.
            for lane in 0..32u32 {
                let t = lane % 4;
                for w in 0..ch / 32 {
                    for jj in 0..2 {
                        let j = 2 * w + jj;
                        let reg = |s: u32| -> [u32; 2] {
                            let run = t * ch / 4 + 8 * w;
                            [run + s, run + s + 4]
                        };
                        let lo = reg(2 * jj);
                        let hi = reg(2 * jj + 1);
                        // A fragment: a0/a1 = positions 2t, 2t+1 (rows g, g+8), a2/a3 = 2t+8, 2t+9.
                        // B fragment: b0 = rows 2t, 2t+1, b1 = rows 2t+8, 2t+9 of column g.
                        for e in 0..2 {
                            assert_eq!(lo[e as usize], k_local(ch, j, 2 * t + e));
                            assert_eq!(hi[e as usize], k_local(ch, j, 2 * t + 8 + e));
                        }
                        // The lane only touches its own run, so its 16 (or 8) code bytes suffice.
                        for k in lo.iter().chain(hi.iter()) {
                            assert_eq!(k / (ch / 4), t);
                        }
                    }
                }
            }
        }
    }

    /// Worst bank-conflict degree of one warp-wide shared load: lanes are served in phases of
    /// 128 bytes (8 lanes for 16-byte loads, 16 for 8-byte loads); within a phase, count distinct
    /// 4-byte words per bank.
    pub(super) fn conflict_degree(addrs: &[u32], bytes: u32) -> usize {
        let per_phase = (128 / bytes) as usize;
        let mut worst = 1;
        for phase in addrs.chunks(per_phase) {
            let mut banks: Vec<HashSet<u32>> = vec![HashSet::new(); 32];
            for &a in phase {
                for w in 0..bytes / 4 {
                    let word = a / 4 + w;
                    banks[(word % 32) as usize].insert(word);
                }
            }
            worst = worst.max(banks.iter().map(|b| b.len()).max().unwrap());
        }
        worst
    }

    #[test]
    fn fragment_loads_are_free_of_bank_conflicts() {
        // Packed codes: rows of block_k/2 bytes; chunk 128 -> 16-byte loads at unit 4c + t;
        // chunk 64 -> 8-byte loads at half t%2 of unit 2c + t/2. Warp rows start at multiples of 8.
        for block_k in [64u32, 128, 256] {
            let units = block_k / 32;
            for ch in [64u32, 128] {
                if ch > block_k {
                    continue;
                }
                for c in 0..block_k / ch {
                    for row0 in [0u32, 8, 16, 24] {
                        let addrs: Vec<u32> = (0..32u32)
                            .map(|lane| {
                                let (g, t) = (lane / 4, lane % 4);
                                let r = row0 + g;
                                if ch == 128 {
                                    r * block_k / 2 + code_unit_swizzle(units, r, 4 * c + t) * 16
                                } else {
                                    r * block_k / 2
                                        + code_unit_swizzle(units, r, 2 * c + t / 2) * 16
                                        + (t % 2) * 8
                                }
                            })
                            .collect();
                        let bytes = if ch == 128 { 16 } else { 8 };
                        assert_eq!(
                            conflict_degree(&addrs, bytes),
                            1,
                            "codes block_k {block_k} chunk {ch} c {c} row0 {row0}"
                        );
                    }
                }
            }
        }
        // bf16: rows of 2*block_k bytes; word w of lane t in chunk c is unit ch/8*c + ch/32*t + w.
        for block_k in [64u32, 128, 256] {
            for ch in [64u32, 128] {
                if ch > block_k {
                    continue;
                }
                for c in 0..block_k / ch {
                    for w in 0..ch / 32 {
                        for row0 in [0u32, 8] {
                            let addrs: Vec<u32> = (0..32u32)
                                .map(|lane| {
                                    let (g, t) = (lane / 4, lane % 4);
                                    let r = row0 + g;
                                    let u = ch / 8 * c + ch / 32 * t + w;
                                    r * block_k * 2 + bf16_unit_swizzle(r, u) * 16
                                })
                                .collect();
                            assert_eq!(
                                conflict_degree(&addrs, 16),
                                1,
                                "bf16 block_k {block_k} chunk {ch} c {c} w {w}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn swizzles_are_permutations_within_a_row() {
        for units in [2u32, 4, 8] {
            for r in 0..16 {
                let s: HashSet<u32> = (0..units).map(|u| code_unit_swizzle(units, r, u)).collect();
                assert_eq!(s.len() as u32, units);
                assert!(s.iter().all(|&u| u < units));
            }
        }
        for units in [8u32, 16, 32] {
            for r in 0..16 {
                let s: HashSet<u32> = (0..units).map(|u| bf16_unit_swizzle(r, u)).collect();
                assert_eq!(s.len() as u32, units);
                assert!(s.iter().all(|&u| u < units));
            }
        }
    }

    #[test]
    fn tiled_scale_words_match_the_global_swizzled_layout() {
        // For a 128-aligned row block the stage copies G contiguous 512-byte blocks per 128 rows;
        // sf_word must address, in that copy, the word the global layout holds for (row, group).
        let (k, rows, groups) = (1024u32, 256u32, 2u32);
        let ksf_pad = k / 16;
        for kb in 0..k / (64 * groups) {
            for r in 0..rows {
                for g in 0..groups {
                    let global = swizzled_sf_offset(r, 4 * (kb * groups + g), ksf_pad);
                    // copy of tile rt: global bytes [((rt)*(ksf_pad/4) + kb*G)*512, + G*512)
                    let rt = r / 128;
                    let copy_base = (rt * (ksf_pad / 4) + kb * groups) * 512;
                    let smem = rt * groups * 512 + (global - copy_base);
                    assert_eq!(smem, sf_word(rows, groups, r, g) * 4, "row {r} group {g} kb {kb}");
                }
            }
        }
        let s: HashSet<u32> =
            (0..48).flat_map(|r| (0..2).map(move |g| sf_word(48, 2, r, g))).collect();
        assert_eq!(s.len(), 96);
    }

    // ---- exactness of the bf16 data path (nvfp4.cuh), emulated on the CPU ----

    fn bf16_to_f32(b: u16) -> f32 {
        f32::from_bits((b as u32) << 16)
    }
    fn f32_to_bf16_rne(f: f32) -> u16 {
        let b = f.to_bits();
        let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1));
        (r >> 16) as u16
    }
    fn e2m1(c: u32) -> f32 {
        let mag = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(c & 7) as usize];
        if c & 8 != 0 {
            -mag
        } else {
            mag
        }
    }
    fn e4m3(b: u8) -> f32 {
        let (e, m) = ((b >> 3) & 15, b & 7);
        if e == 0 {
            (m as f32) * 2f32.powi(-9)
        } else {
            (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7)
        }
    }
    /// `e2m1_pair_raw<S>` of nvfp4.cuh: mask, multiply (two copies that never overlap), mask.
    fn pair_raw(w: u32, s: u32) -> u32 {
        let src = if s >= 2 { w >> 8 } else { w };
        let (mask, mul) = if s % 2 == 0 { (0x000F_000F, 0x1040) } else { (0x00F0_00F0, 0x0104) };
        (src & mask).wrapping_mul(mul) & 0x81C0_81C0
    }

    /// The bit placement `pair_raw` must produce, written out: sign to bit 15, (e1 e0 m) to bits
    /// 8..6 of each half.
    fn pair_raw_by_bits(w: u32, s: u32) -> u32 {
        let half = |code: u32| ((code & 8) << 12) | ((code & 7) << 6);
        half((w >> (4 * s)) & 15) | (half((w >> (4 * s + 16)) & 15) << 16)
    }

    #[test]
    fn pair_extraction_places_every_code_pair_exactly() {
        // Every 16-bit pattern in each half (the other half random), all four pairs.
        let mut x = 0x9E37_79B9u32;
        for lo in 0..=0xFFFFu32 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            for w in [lo | (x << 16), (lo << 16) | (x >> 16)] {
                for s in 0..4 {
                    assert_eq!(pair_raw(w, s), pair_raw_by_bits(w, s), "word {w:#010x} pair {s}");
                }
            }
        }
    }

    #[test]
    fn dequantization_is_exact_for_every_code_and_scale() {
        for sf in 0u8..=0x7E {
            let s = e4m3(sf);
            let prepared = f32_to_bf16_rne(s * 2f32.powi(119));
            assert_eq!(bf16_to_f32(prepared), s * 2f32.powi(119), "scale {sf:#x} not exact");
            for w in [0x7654_3210u32, 0xFEDC_BA98] {
                for sel in 0..4 {
                    let raw = pair_raw(w, sel);
                    for half in 0..2 {
                        let code = (w >> (4 * (sel + 4 * half))) & 15;
                        let x = bf16_to_f32((raw >> (16 * half)) as u16);
                        assert_eq!(x, e2m1(code) * 2f32.powi(-126), "code {code}");
                        // bf16 x bf16 is exact in f32; the bf16 rounding of the product must be too.
                        let prod = bf16_to_f32(f32_to_bf16_rne(x * bf16_to_f32(prepared)));
                        assert_eq!(
                            prod,
                            e2m1(code) * s * 2f32.powi(-7),
                            "code {code} scale {sf:#x}"
                        );
                    }
                }
            }
        }
    }

    // ---- search space and rendering ----

    #[test]
    fn search_space_is_legal_rich_and_renders() {
        for a_type in [AType::Bf16, AType::Nvfp4] {
            let space = search_space(a_type);
            assert!((300..=8000).contains(&space.len()), "{} configs for {a_type}", space.len());
            let names: HashSet<String> = space.iter().map(|c| c.name()).collect();
            assert_eq!(names.len(), space.len(), "duplicate configurations");
            assert!(space.iter().any(|c| c.swap_ab && c.block_m <= 16 && c.split_k > 1));
            assert!(space.iter().any(|c| !c.swap_ab && c.block_m == 128 && c.block_n >= 128));
            assert!(space.iter().any(|c| c.warps_k > 1));
            for w in measured_winners(a_type) {
                assert!(space.contains(&w), "measured winner {w} missing from the space");
            }
            for c in &space {
                assert!(check(c).is_ok(), "{c}");
                let src = c.render().unwrap_or_else(|e| panic!("{c}: {e}"));
                assert!(src.code.contains(&format!("Cfg::SMEM_BYTES == {}", smem_bytes(c))));
                assert!(src.code.contains(&c.kernel_name()));
                assert!(!src.code.contains("#include"), "includes left in {c}");
            }
        }
    }

    #[test]
    fn instantiation_names_kernel_and_config() {
        let c = cfg(AType::Nvfp4);
        let u = instantiation(&c);
        assert!(u.contains("#include \"sm90/gemm.cuh\""));
        assert!(u.contains("Sm90Config<16, 64, 128, 1, 4, 1, 4, 1, true, true>"), "{u}");
        assert!(u.contains(&format!("void __launch_bounds__(128, 1) {}(", c.kernel_name())));
    }
}

/// Representative configurations (small-M streaming, mid-M, large-M), used by the dump test and
/// by hand-run compile checks.
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

/// The fastest configurations measured on an H200 (2026-11-29, W4A16, CUDA-graph replay, weights
/// rotated through > 4x L2) by the family's author, with (shape, microseconds, cuBLAS BF16 on the
/// same run). Seeds for the tuner; the search space must contain them.
///
/// | config | shape M x N x K | us | cuBLAS BF16 us |
/// |---|---|---|---|
/// | m8n32k256 w1x2x2 s4 sk2 swap | 1 x 4096 x 6144 | 8.26 | 16.4 |
/// | m16n32k256 w1x2x2 s6 sk2 swap | 16 x 4096 x 6144 | 10.1 | 17.5 |
/// | m8n16k256 w1x1x2 s8 sk6 swap | 1 x 512 x 6144 | 4.70 | 7.29 |
/// | m16n32k256 w1x2x2 s6 sk6 swap | 16 x 512 x 6144 | 5.29 | 7.59 |
/// | m8n64k256 w1x4x2 s4 sk1 swap | 4 x 6144 x 256 | 2.81 | 3.58 |
/// | m16n64k128 w1x4x1 s4 sk1 swap | 16 x 6144 x 256 | 2.93 | 3.60 |
/// | m64n128k128 w1x4x1 s3 sk1 | 1024 x 4096 x 6144 | 189 | 65 |
///
/// Register-streamed (`r`) and warp-ring (`p`) kernels, same policy, 2026-11-29 (bench runs of
/// `--pipeline registers|warp-ring`, results/h200/bench-w4a16.md has the final run):
///
/// | config | shape M x N x K | us |
/// |---|---|---|
/// | m8n32k1024 w1x2x2 p4 sk6 | 1 x 512 x 6144 | 3.81 |
/// | m8n16k2048 w1x1x4 r4 sk3 | 1 x 512 x 6144 | 3.91 |
/// | m8n32k256 w1x2x2 r1 sk1 | 1 x 6144 x 256 | 2.32 |
/// | m8n16k3072 w1x1x8 p8 sk2 | 1 x 1024 x 6144 | 4.36 |
/// | m8n16k512 w1x1x4 r1 sk1 | 1 x 6144 x 512 | 2.62 |
/// | m8n32k6144 w1x2x8 p4 sk1 | 1 x 4096 x 6144 | 7.83 |
/// | m8n16k2048 w1x1x4 p8 sk1 | 1 x 6144 x 2048 | 5.25 |
/// | m16n32k2048 w1x2x4 p8 sk3 | 16 x 1024 x 6144 | 5.68 |
///
/// Global-pipeline (`g`) and occupancy (`_o<n>`) winners, same policy, 2026-11-29
/// (results/h200/bench-w4a16.md of that day):
///
/// | config | shape M x N x K | us |
/// |---|---|---|
/// | m8n16k1024 w1x1x4 g2 sk6 o4 | 1 x 512 x 6144 | 3.52 |
/// | m8n16k1024 w1x1x4 g2 sk6 o2 | 4 x 512 x 6144 | 3.57 |
/// | m8n16k3072 w1x1x8 p4 sk2 o2 | 1 x 1024 x 6144 | 4.01 |
/// | m8n32k6144 w1x1x8 p4 sk1 | 1 x 4096 x 6144 | 7.67 |
/// | m8n16k1024 w1x1x4 g2 sk1 | 1 x 6144 x 2048 | 4.96 |
pub fn measured_winners(a_type: AType) -> Vec<GemmConfig> {
    let c = |block_m, block_n, block_k, warps_m, warps_n, warps_k, stages, split_k, swap_ab| {
        GemmConfig {
            family: Family::Sm90,
            a_type,
            block_m,
            block_n,
            block_k,
            warps_m,
            warps_n,
            warps_k,
            stages,
            split_k,
            swap_ab,
            pipeline: Pipeline::CpAsync,
            min_ctas: 1,
        }
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

#[cfg(test)]
mod dump {
    use super::*;

    /// Deep-pipeline small-M W4A16 configurations (TP8- and EP-like N) for hand-run sweeps.
    fn small_m_sweep() -> Vec<GemmConfig> {
        let mut out = Vec::new();
        for block_m in [8u32, 16] {
            for (block_n, warps_ks, splits, stages) in [
                (16u32, &[2u32, 4][..], &[2u32, 3, 4, 6, 8][..], &[4u32, 6, 8][..]),
                (32, &[2, 4], &[2, 3, 4, 6, 8], &[4, 6, 8]),
                (64, &[1, 2], &[1, 2, 3, 4], &[3, 4, 6]),
                (128, &[1, 2], &[1, 2, 3, 4], &[3, 4]),
            ] {
                for &warps_k in warps_ks {
                    for &split_k in splits {
                        for &st in stages {
                            let warps_n = (block_n / 16).min(4);
                            let c = GemmConfig {
                                family: Family::Sm90,
                                a_type: AType::Bf16,
                                block_m,
                                block_n,
                                block_k: 256,
                                warps_m: 1,
                                warps_n,
                                warps_k,
                                stages: st,
                                split_k,
                                swap_ab: true,
                                pipeline: Pipeline::CpAsync,
                                min_ctas: 1,
                            };
                            if check(&c).is_ok() {
                                out.push(c);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// `FP4TUNE_SM90_DUMP=dir cargo test --lib sm90::dump -- --ignored` writes the rendered sources
    /// of the representative configurations (file = kernel name + `.cu`) for NVRTC checks by hand.
    #[test]
    #[ignore]
    fn dump_rendered_sources() {
        let dir = std::env::var("FP4TUNE_SM90_DUMP").expect("set FP4TUNE_SM90_DUMP");
        std::fs::create_dir_all(&dir).unwrap();
        // FP4TUNE_SM90_DUMP_SAMPLE=n adds an even sample of n small-M (swap_ab, block_m <= 16) and
        // n/4 large-M (block_m >= 64, no swap) W4A16 configurations of the search space.
        let sample: usize = std::env::var("FP4TUNE_SM90_DUMP_SAMPLE")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut configs = Vec::new();
        for a_type in [AType::Bf16, AType::Nvfp4] {
            configs.extend(representative_configs(a_type));
        }
        if std::env::var("FP4TUNE_SM90_DUMP_WINNERS").is_ok() {
            configs.clear();
            configs.extend(measured_winners(AType::Bf16));
            configs.extend(measured_winners(AType::Nvfp4));
        }
        if std::env::var("FP4TUNE_SM90_DUMP_SWEEP").is_ok() {
            configs.extend(small_m_sweep());
        }
        if sample > 0 {
            let space = search_space(AType::Bf16);
            let small: Vec<_> = space.iter().filter(|c| c.swap_ab && c.block_m <= 16).collect();
            let large: Vec<_> = space.iter().filter(|c| !c.swap_ab && c.block_m >= 64).collect();
            for (group, n) in [(small, sample), (large, sample / 4)] {
                let step = (group.len() / n.max(1)).max(1);
                configs.extend(group.iter().step_by(step).map(|c| **c));
            }
        }
        // FP4TUNE_SM90_DUMP_NAMES=a,b: exactly these configurations of either space.
        if let Ok(names) = std::env::var("FP4TUNE_SM90_DUMP_NAMES") {
            let names: Vec<&str> = names.split(',').collect();
            configs = [AType::Bf16, AType::Nvfp4]
                .iter()
                .flat_map(|&a| search_space(a))
                .filter(|c| names.contains(&c.name().as_str()))
                .collect();
        }
        for c in configs {
            let src = c.render().unwrap();
            std::fs::write(format!("{dir}/{}.cu", c.kernel_name()), src.code).unwrap();
        }
    }
}

#[cfg(test)]
mod nvrtc_tests {
    use super::*;
    use crate::compile::{sass, Compiler};

    /// NVRTC (sm_90a) compiles the measured winners and the representative configurations of both
    /// activation types; the winners spill nothing; a small-M kernel's SASS uses the bf16 HMMA and
    /// LDGSTS (cp.async) and no local memory.
    #[test]
    fn nvrtc_compiles_sample_configs_without_spills() {
        let dir = tempfile::tempdir().unwrap();
        let compiler =
            Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
        let mut configs = Vec::new();
        for a_type in [AType::Bf16, AType::Nvfp4] {
            configs.extend(measured_winners(a_type));
            configs.extend(representative_configs(a_type).into_iter().take(3));
        }
        let sources: Vec<_> = configs.iter().map(|c| c.render().unwrap()).collect();
        let winners: Vec<_> =
            [AType::Bf16, AType::Nvfp4].iter().flat_map(|&a| measured_winners(a)).collect();
        for (c, res) in configs.iter().zip(compiler.compile_many(&sources)) {
            let k = res.unwrap_or_else(|e| panic!("{c}: {e}"));
            let stats = k.stats.unwrap_or_else(|| panic!("{c}: no ptxas statistics"));
            assert!(stats.registers > 0 && stats.registers <= 255, "{c}: {stats:?}");
            if winners.contains(c) {
                assert!(!stats.spills(), "{c} spills: {stats:?}");
            }
        }
        let small = measured_winners(AType::Bf16)[0];
        let k = compiler.compile(&small.render().unwrap()).unwrap();
        match sass::dump_sass(&k.kernel_name, &k.cubin) {
            Ok(text) => {
                assert!(sass::count_opcode(&text, "HMMA.16816.F32.BF16") > 0, "no bf16 HMMA");
                assert!(sass::count_opcode(&text, "LDGSTS") > 0, "no cp.async");
                assert!(!sass::uses_local_memory(&text), "local memory in {small}");
            }
            // cuobjdump is optional on developer machines; the ptxas statistics above still ran.
            Err(sass::SassError::NotFound { .. }) => {
                eprintln!("cuobjdump not found: SASS check skipped")
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[cfg(test)]
mod direct_tests {
    use super::tests::conflict_degree;
    use super::*;

    /// Mirror of `direct.cuh: direct_code_unit_swizzle`.
    fn direct_code_unit_swizzle(r: u32, u: u32) -> u32 {
        u ^ (((r & 1) << 2) | (((r >> 1) & 1) << 1))
    }

    /// Mirror of `direct.cuh: bf16_run_offsets` (byte offset of word w of lane (g, t)'s run in
    /// token row r at pass-local k = 0, for a slice of `block_k` bf16 per row).
    fn bf16_run_offset(block_k: u32, r: u32, t: u32, w: u32) -> u32 {
        let x = ((t >> 1) << 1) | (r & 1);
        r * block_k * 2 + (4 * t + (w ^ x)) * 16
    }

    /// The precomputed activation offsets of the streamed kernels equal the swizzled unit of
    /// `bf16_unit_swizzle` at every chunk (the swizzle does not depend on the chunk), and those
    /// loads are free of bank conflicts.
    #[test]
    fn bf16_run_offsets_match_the_swizzle_and_do_not_conflict() {
        for block_k in [256u32, 512, 3072] {
            for kp in (0..block_k).step_by(128) {
                for r in 0..16 {
                    for t in 0..4 {
                        for w in 0..4 {
                            let u = kp / 8 + 4 * t + w;
                            let want = r * block_k * 2 + bf16_unit_swizzle(r, u) * 16;
                            assert_eq!(kp * 2 + bf16_run_offset(block_k, r, t, w), want);
                        }
                    }
                }
                for w in 0..4 {
                    let addrs: Vec<u32> = (0..32)
                        .map(|lane| kp * 2 + bf16_run_offset(block_k, lane / 4, lane % 4, w))
                        .collect();
                    assert_eq!(conflict_degree(&addrs, 16), 1, "block_k {block_k} kp {kp} w {w}");
                }
            }
        }
    }

    /// NVFP4 activation slices (W4A4): lane (g, t) reads unit kp/32 + t of token row g; the
    /// swizzle is a permutation of each row's units and keeps the 16-byte loads conflict-free.
    #[test]
    fn fp4_activation_slice_loads_do_not_conflict() {
        for block_k in [256u32, 1024] {
            let units = block_k / 32;
            for r in 0..16 {
                let mut seen: Vec<u32> =
                    (0..units).map(|u| direct_code_unit_swizzle(r, u)).collect();
                seen.sort();
                assert_eq!(seen, (0..units).collect::<Vec<_>>());
            }
            for kp in (0..block_k).step_by(128) {
                let addrs: Vec<u32> = (0..32)
                    .map(|lane| {
                        let (g, t) = (lane / 4, lane % 4);
                        g * (block_k / 2) + direct_code_unit_swizzle(g, kp / 32 + t) * 16
                    })
                    .collect();
                assert_eq!(conflict_degree(&addrs, 16), 1, "block_k {block_k} kp {kp}");
            }
        }
    }

    /// The weight scales: the register ring reads 2 bytes at swizzled_sf_offset(row, k0/16 + 2t);
    /// the warp ring copies the 4-byte word at swizzled_sf_offset(row, 4 * (t / 2)) + k0 * 8 and
    /// keeps half t % 2 of it. Both name the lane's blocks 2t and 2t + 1 of every chunk.
    #[test]
    fn weight_scale_addressing_of_both_rings_names_the_lane_blocks() {
        for k in [256u32, 2048, 6144] {
            let ksf_pad = (k / 16).div_ceil(4) * 4;
            for row in [0u32, 5, 31, 32, 127, 128, 300] {
                for k0 in (0..k).step_by(128) {
                    for t in 0..4 {
                        let b = k0 / 16 + 2 * t;
                        let reg = swizzled_sf_offset(row, 2 * t, ksf_pad) + (k0 / 64) * 512;
                        assert_eq!(reg, swizzled_sf_offset(row, b, ksf_pad));
                        assert_eq!(reg + 1, swizzled_sf_offset(row, b + 1, ksf_pad));
                        let word = swizzled_sf_offset(row, 4 * (t / 2), ksf_pad) + (k0 / 64) * 512;
                        assert_eq!(word % 4, 0);
                        assert_eq!(word + 2 * (t % 2), swizzled_sf_offset(row, b, ksf_pad));
                    }
                }
            }
        }
    }

    #[test]
    fn direct_space_is_legal_and_sized() {
        for a_type in [AType::Bf16, AType::Nvfp4] {
            let space = direct_space(a_type);
            eprintln!("{a_type}: {} register-streamed configurations", space.len());
            assert!(space.len() > 200 && space.len() < 2500, "{}", space.len());
            for c in &space {
                check(c).unwrap();
                assert!(c.name().contains(&format!("_r{}_", c.stages)), "{c}");
            }
            let ring = warp_ring_space(a_type);
            eprintln!("{a_type}: {} warp-ring configurations", ring.len());
            assert!(ring.len() > 100 && ring.len() < 1500, "{}", ring.len());
            for c in &ring {
                check(c).unwrap();
                assert!(c.name().contains(&format!("_p{}_", c.stages)), "{c}");
            }
            let global = global_space(a_type);
            eprintln!("{a_type}: {} global configurations", global.len());
            assert!(global.len() > 200 && global.len() < 2500, "{}", global.len());
            for c in space.iter().chain(&ring).chain(&global) {
                check(c).unwrap();
                // Occupancy variants: named _o<n>, at most 32 warps per SM.
                assert_eq!(c.name().ends_with(&format!("_o{}", c.min_ctas)), c.min_ctas > 1, "{c}");
                assert!(c.min_ctas == 1 || c.threads() / 32 * c.min_ctas <= 32, "{c}");
            }
            assert!(global.iter().any(|c| c.min_ctas == 4));
        }
    }

    /// The deepest ring of every warp-tile size of the global pipeline, both activation types,
    /// compiles for sm_90a without spills or local memory, and touches neither cp.async nor
    /// shared memory in its main loop (only split-K partials may go through shared memory).
    #[test]
    fn nvrtc_compiles_global_pipeline_kernels_without_spills() {
        use crate::compile::sass;
        let mut configs: Vec<GemmConfig> = Vec::new();
        for a_type in [AType::Bf16, AType::Nvfp4] {
            let space = global_space(a_type);
            for (bm, bn, wn) in [(8, 16, 1), (16, 32, 1), (8, 64, 2), (16, 32, 2)] {
                // The deepest ring with 8 warps and with 16 (the tighter register budget).
                for warps in [8, 16] {
                    let deepest = space
                        .iter()
                        .filter(|c| {
                            c.block_m == bm
                                && c.block_n == bn
                                && c.warps_n == wn
                                && c.warps_n * c.warps_k == warps
                                && c.split_k == 1
                        })
                        .max_by_key(|c| (c.stages, c.block_k));
                    configs.extend(deepest);
                }
            }
        }
        assert_eq!(configs.len(), 16, "{configs:?}");
        compile_without_spills(&configs, |c, text| {
            assert_eq!(sass::count_opcode(text, "LDGSTS"), 0, "{c}: cp.async");
            if c.warps_k == 1 {
                assert_eq!(sass::count_opcode(text, "LDS"), 0, "{c}: shared loads");
            }
        });
    }

    /// A sample of register-streamed kernels of both activation types, at every ring depth and
    /// warp-tile size, compiles for sm_90a without spills or local memory, with the bf16 HMMA and
    /// without cp.async for the weights (only the activation slice uses LDGSTS).
    #[test]
    fn nvrtc_compiles_register_streamed_kernels_without_spills() {
        let mut configs = Vec::new();
        for a_type in [AType::Bf16, AType::Nvfp4] {
            let space = direct_space(a_type);
            for (bm, bn, wn, depth) in
                [(8, 16, 1, 4), (16, 32, 1, 4), (8, 64, 2, 2), (16, 32, 2, 1)]
            {
                if let Some(c) = space.iter().find(|c| {
                    c.block_m == bm && c.block_n == bn && c.warps_n == wn && c.stages == depth
                }) {
                    configs.push(*c);
                }
            }
        }
        for a_type in [AType::Bf16, AType::Nvfp4] {
            let ring = warp_ring_space(a_type);
            configs
                .extend(ring.iter().find(|c| c.block_m == 8 && c.block_n == 16 && c.stages == 8));
            configs
                .extend(ring.iter().find(|c| c.block_m == 16 && c.block_n == 64 && c.stages == 4));
        }
        assert!(configs.len() >= 10, "{configs:?}");
        compile_without_spills(&configs, |_, _| {});
    }

    /// Compiles `configs` for sm_90a and checks each: ptxas statistics without spills, and (when
    /// cuobjdump is there) SASS with the bf16 HMMA, no local memory, and `more`.
    fn compile_without_spills(configs: &[GemmConfig], more: impl Fn(&GemmConfig, &str)) {
        use crate::compile::{sass, Compiler};
        let dir = tempfile::tempdir().unwrap();
        let compiler =
            Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
        let sources: Vec<_> = configs.iter().map(|c| c.render().unwrap()).collect();
        for (c, res) in configs.iter().zip(compiler.compile_many(&sources)) {
            let k = res.unwrap_or_else(|e| panic!("{c}: {e}"));
            let stats = k.stats.unwrap_or_else(|| panic!("{c}: no ptxas statistics"));
            eprintln!("{c}: {stats:?}");
            assert!(!stats.spills(), "{c} spills: {stats:?}");
            match sass::dump_sass(&k.kernel_name, &k.cubin) {
                Ok(text) => {
                    assert!(sass::count_opcode(&text, "HMMA.16816.F32.BF16") > 0, "{c}: no HMMA");
                    assert!(!sass::uses_local_memory(&text), "{c}: local memory");
                    more(c, &text);
                }
                Err(sass::SassError::NotFound { .. }) => {
                    eprintln!("cuobjdump not found: SASS check skipped")
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}
