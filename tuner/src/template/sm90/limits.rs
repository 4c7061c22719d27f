//! Limits of the SM90 family and the checks of a configuration (the same limits the
//! template's `Sm90Config` / `DirectConfig` static_asserts enforce), its shared-memory size and
//! register-ring budget.

use crate::problem::{AType, GemmProblem};
use crate::template::{ConstraintError, Family, GemmConfig, Pipeline};

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
    x.div_ceil(128).saturating_mul(128)
}

/// Bytes of one pipeline stage: W codes, W scales, A (codes or bf16), A scales; each region
/// 128-byte aligned (`Sm90Config::STAGE_BYTES`).
pub fn stage_bytes(c: &GemmConfig) -> u32 {
    let (bm, bn, bk) = (c.block_m, c.block_n, c.block_k);
    let (wk, ak) = (bn.saturating_mul(bk), bm.saturating_mul(bk));
    let w = align128(wk / 2).saturating_add(align128(wk / 16));
    let a = match c.a_type {
        AType::Nvfp4 => align128(ak / 2).saturating_add(align128(ak / 16)),
        AType::Bf16 => align128(ak.saturating_mul(2)),
    };
    w.saturating_add(a)
}

/// Dynamic shared memory of one CTA (`Sm90Config::SMEM_BYTES`): the pipeline, or the in-CTA
/// split-K reduction buffer if larger. Computed in u64 and saturated at `u32::MAX`, so that no
/// configuration (a hostile table entry included) wraps into a small, legal-looking size.
pub fn smem_bytes(c: &GemmConfig) -> u32 {
    let d = Derived::of(c);
    let w = |x: u32| x as u64;
    let bytes = if c.pipeline.is_direct() {
        // `DirectConfig::SMEM_BYTES`: the slice, then one reduction slot per (cluster rank, warp
        // along K) for split_k <= 8; above, epilogue.cuh's in-CTA buffer reuses offset 0.
        let tile = w(c.warps_n) * 32 * w(d.acc) * 4;
        let slots = if c.split_k <= MAX_CLUSTER_SPLIT { w(c.split_k) * w(c.warps_k) } else { 0 };
        let slot_bytes = if slots > 1 { slots * tile } else { 0 };
        let red =
            if c.split_k > MAX_CLUSTER_SPLIT { w(c.warps_k.saturating_sub(1)) * tile } else { 0 };
        let main = if c.pipeline == Pipeline::WarpRing {
            let stage = w(d.p_tiles) * 2 * (512 + 128);
            (w(slice_bytes(c)) + slot_bytes).div_ceil(128) * 128
                + w(c.threads() / 32) * w(c.stages) * stage
        } else {
            w(slice_bytes(c)) + slot_bytes
        };
        main.max(red).max(16)
    } else {
        let pipe = w(c.stages) * w(stage_bytes(c));
        let warps = w(c.warps_m) * w(c.warps_n);
        let red = w(c.warps_k.saturating_sub(1)) * warps * 32 * w(d.acc) * 4;
        let cluster_red = if cluster_split(c) { warps * 32 * w(d.acc) * 4 } else { 0 };
        pipe.max(red).max(cluster_red).max(16)
    };
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// Bytes of the activation slice of a register-streamed kernel (`DirectConfig::SLICE_BYTES`):
/// (block_m, block_k) codes + scales or bf16; none for `Pipeline::Global`.
pub fn slice_bytes(c: &GemmConfig) -> u32 {
    if c.pipeline == Pipeline::Global {
        return 0;
    }
    let ak = c.block_m.saturating_mul(c.block_k);
    match c.a_type {
        AType::Nvfp4 => align128(ak / 2).saturating_add(align128(ak / 16)),
        AType::Bf16 => align128(ak.saturating_mul(2)),
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
        (Pipeline::CpAsync | Pipeline::KTail | Pipeline::WarpRing, _) => return 0,
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
    if c.pipeline == Pipeline::KTail && (c.block_k != 64 || c.warps_k != 1) {
        return err(format!(
            "the K-tail form has stages of 64 k in one warp (block_k {}, warps_k {})",
            c.block_k, c.warps_k
        ));
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
    if c.pipeline == Pipeline::KTail {
        if p.k % 16 != 0 || p.k % 64 == 0 {
            return err(format!(
                "K = {} is not for the K-tail form (a multiple of 16 that 64 does not divide)",
                p.k
            ));
        }
    } else if p.k % c.block_k != 0 {
        return err(format!("K = {} is not a multiple of block_k = {}", p.k, c.block_k));
    }
    if p.n % 8 != 0 {
        return err(format!("N = {} is not a multiple of 8", p.n));
    }
    let k_blocks = p.k.div_ceil(c.block_k);
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
