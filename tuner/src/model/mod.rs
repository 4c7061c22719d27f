//! Analytic performance model: predicts a kernel configuration's time on a GEMM problem on a given
//! GPU (to pre-rank candidates before measuring), and the roofline of one MoE decode step.
//!
//! # What the model assumes (all times in seconds)
//!
//! For a configuration `c` on problem `p` on SKU `s`:
//! - **Grid**: `ctas = ceil(N / block_n) * ceil(M / block_m) * split_k`.
//! - **Occupancy**: CTAs per SM = min(shared memory per SM / (smem + the driver's per-block
//!   reserve), threads per SM / threads, registers per SM / (threads * registers per thread),
//!   hardware block limit). Registers default to [`DEFAULT_REGS_PER_THREAD`] when the compile
//!   statistics are not given. Zero CTAs per SM is an error.
//! - **Waves**: `ceil(ctas / (sms * ctas_per_sm))`; the last partial wave costs a full one
//!   (wave quantization).
//! - **Memory**: DRAM bytes = the problem's unique bytes (W codes + scales, A, bf16 Y) plus, with
//!   split-K, the fp32 partials written and read once (`2 * split_k * M * N * 4`). Every CTA also
//!   loads its own tiles, which after the first touch come from L2: `ctas * (min(block_m, M) +
//!   min(block_n, N)) * K / split_k` elements (zero-filled rows past M or N cost nothing), at the SKU's L2 bandwidth (assumed 4x DRAM on SM120, 2.5x on the
//!   H200). The bandwidth a grid can
//!   draw is capped by Little's law: resident CTAs * bytes in flight per CTA (`stages - 1` stages)
//!   / DRAM latency. Memory time = max(DRAM bytes / drawable bandwidth, L2 bytes / L2 bandwidth).
//! - **Compute**: MMA work is counted on padded tiles (`2 * ceil(M/bm)*bm * ceil(N/bn)*bn * K`):
//!   a 1-token row in a 16-row tile costs the full tile. One SM runs at `tensor_peak / sms` when it
//!   holds at least 4 warps (one per tensor-core sub-partition), proportionally less with fewer.
//!   Compute time = waves * (CTAs per SM in a wave * FLOPs per CTA) / per-SM rate.
//! - **Fixed costs**: one launch floor (graph replay), one DRAM latency to fill the pipeline, and
//!   half of one more with split-K (the last CTA reads the partials, mostly from L2, after the
//!   others finished).
//! - **Total** = launch + fill + max(memory, compute) + split-K tail. Memory and compute overlap
//!   perfectly; there is no modelling of bank conflicts, instruction issue or tail effects inside a
//!   CTA. The model ranks candidates; it does not replace measuring them.
//!
//! Peaks are the measured ones where we have them (FP4 1.43 PFLOP/s via cuBLASLt on the PRO 6000,
//! bf16 790 TFLOP/s and 4.27 TB/s on the H200); see [`sku`].

pub mod sku;

use crate::problem::{AType, GemmProblem};
use crate::template::{ConstraintError, GemmConfig};
pub use sku::Sku;

/// Registers per thread assumed when compile statistics are not available.
pub const DEFAULT_REGS_PER_THREAD: u32 = 128;
/// Tensor-core sub-partitions per SM: warps needed to keep every tensor unit busy.
pub const TENSOR_UNITS_PER_SM: u32 = 4;

/// Why the model cannot predict a configuration on a SKU.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
    #[error("{config} belongs to the {family} family, {sku} runs {sku_family}")]
    WrongFamily { config: String, family: String, sku: String, sku_family: String },
    #[error("{config}: no CTA fits on an SM of {sku} ({reason})")]
    NoOccupancy { config: String, sku: String, reason: String },
}

/// The model's breakdown of one prediction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    pub ctas: u32,
    pub ctas_per_sm: u32,
    pub waves: u32,
    pub dram_bytes: f64,
    pub l2_bytes: f64,
    /// DRAM bandwidth the grid can draw (peak or the Little's-law cap).
    pub drawable_bw: f64,
    pub padded_flops: f64,
    pub t_launch: f64,
    pub t_fill: f64,
    pub t_memory: f64,
    pub t_compute: f64,
    pub t_split_k: f64,
    pub total_s: f64,
}

impl Prediction {
    /// Whether memory (rather than compute) sets the time.
    pub fn memory_bound(&self) -> bool {
        self.t_memory >= self.t_compute
    }
}

/// Bytes of `rows` rows of K elements of an operand of type `t` (NVFP4: codes + UE4M3 scales).
fn operand_bytes(t: AType, rows: f64, k: f64) -> f64 {
    match t {
        AType::Nvfp4 => rows * k * (0.5 + 1.0 / 16.0),
        AType::Bf16 => rows * k * 2.0,
    }
}

/// Predict the time of `cfg` on `p` on `sku`. `regs_per_thread` comes from the compile statistics
/// when known (else [`DEFAULT_REGS_PER_THREAD`]).
pub fn predict(
    sku: &Sku,
    cfg: &GemmConfig,
    p: &GemmProblem,
    regs_per_thread: Option<u32>,
) -> Result<Prediction, ModelError> {
    if cfg.family != sku.family {
        return Err(ModelError::WrongFamily {
            config: cfg.name(),
            family: cfg.family.to_string(),
            sku: sku.name.to_string(),
            sku_family: sku.family.to_string(),
        });
    }
    cfg.check_problem(p)?;
    let no_fit = |reason: String| ModelError::NoOccupancy {
        config: cfg.name(),
        sku: sku.name.to_string(),
        reason,
    };
    let smem = cfg.smem_bytes();
    if smem > sku.smem_per_block {
        return Err(no_fit(format!("{smem} B shared memory, {} per block", sku.smem_per_block)));
    }
    let threads = cfg.threads();
    let regs = regs_per_thread.unwrap_or(DEFAULT_REGS_PER_THREAD).max(1);
    let by_smem = sku.smem_per_sm / (smem + sku.smem_reserved_per_block);
    let by_threads = sku.max_threads_per_sm / threads.max(1);
    let by_regs = sku.regs_per_sm / (threads.max(1) * regs);
    let ctas_per_sm = by_smem.min(by_threads).min(by_regs).min(sku.max_blocks_per_sm);
    if ctas_per_sm == 0 {
        return Err(no_fit(format!(
            "limits: shared memory {by_smem}, threads {by_threads}, registers {by_regs}"
        )));
    }

    let (m, n, k) = (p.m as f64, p.n as f64, p.k as f64);
    let (tiles_m, tiles_n) = (p.m.div_ceil(cfg.block_m), p.n.div_ceil(cfg.block_n));
    let ctas = tiles_m * tiles_n * cfg.split_k;
    let slots = sku.sms * ctas_per_sm;
    let waves = ctas.div_ceil(slots);
    let resident = ctas.min(slots) as f64;

    // Memory.
    let split = cfg.split_k as f64;
    let partials = if cfg.split_k > 1 { 2.0 * split * m * n * 4.0 } else { 0.0 };
    let dram_bytes = p.min_bytes() as f64 + partials;
    let k_per_cta = k / split;
    // Rows past M or N are zero-filled by the kernel, not read: count only real rows.
    let (rows_a, rows_w) = (cfg.block_m.min(p.m) as f64, cfg.block_n.min(p.n) as f64);
    let cta_tile_bytes =
        operand_bytes(p.a_type, rows_a, k_per_cta) + operand_bytes(AType::Nvfp4, rows_w, k_per_cta);
    let l2_bytes = ctas as f64 * cta_tile_bytes;
    let stage_bytes = operand_bytes(p.a_type, rows_a, cfg.block_k as f64)
        + operand_bytes(AType::Nvfp4, rows_w, cfg.block_k as f64);
    let in_flight = resident * (cfg.stages.saturating_sub(1).max(1) as f64) * stage_bytes;
    let drawable_bw = sku.dram_bw.min(in_flight / sku.dram_latency_s);
    let t_memory = (dram_bytes / drawable_bw).max(l2_bytes / sku.l2_bw);

    // Compute.
    let padded_flops = 2.0 * (tiles_m * cfg.block_m) as f64 * (tiles_n * cfg.block_n) as f64 * k;
    let cta_flops = 2.0 * cfg.block_m as f64 * cfg.block_n as f64 * k_per_cta;
    let per_sm_in_wave = ctas_per_sm.min(ctas.div_ceil(sku.sms));
    let warps_per_sm = per_sm_in_wave * (threads / 32);
    let util = (warps_per_sm as f64 / TENSOR_UNITS_PER_SM as f64).min(1.0);
    let per_sm_rate = sku.tensor_peak / sku.sms as f64 * util;
    let t_compute = waves as f64 * per_sm_in_wave as f64 * cta_flops / per_sm_rate;

    let t_launch = sku.launch_floor_s;
    let t_fill = sku.dram_latency_s;
    let t_split_k = if cfg.split_k > 1 { 0.5 * sku.dram_latency_s } else { 0.0 };
    Ok(Prediction {
        ctas,
        ctas_per_sm,
        waves,
        dram_bytes,
        l2_bytes,
        drawable_bw,
        padded_flops,
        t_launch,
        t_fill,
        t_memory,
        t_compute,
        t_split_k,
        total_s: t_launch + t_fill + t_memory.max(t_compute) + t_split_k,
    })
}

/// Rank configurations for a problem by predicted time (fastest first); configurations the model
/// cannot place are dropped. Ties keep the input order.
pub fn rank<'a>(
    sku: &Sku,
    p: &GemmProblem,
    configs: impl IntoIterator<Item = &'a GemmConfig>,
) -> Vec<(GemmConfig, Prediction)> {
    let mut out: Vec<_> = configs
        .into_iter()
        .filter_map(|c| predict(sku, c, p, None).ok().map(|x| (*c, x)))
        .collect();
    out.sort_by(|a, b| a.1.total_s.total_cmp(&b.1.total_s));
    out
}

/// The MoE part of a model that the decode roofline needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeModel {
    pub name: &'static str,
    /// Layers with routed experts.
    pub moe_layers: u32,
    pub routed_experts: u32,
    pub experts_per_token: u32,
    pub hidden: u32,
    pub moe_intermediate: u32,
}

/// GLM-5 (and GLM-5.1): 78 layers of which the first 3 are dense, 256 routed experts, top-8,
/// hidden 6144, expert intermediate 2048 (the MTP layer is not counted).
pub const GLM5: MoeModel = MoeModel {
    name: "GLM-5",
    moe_layers: 75,
    routed_experts: 256,
    experts_per_token: 8,
    hidden: 6144,
    moe_intermediate: 2048,
};

/// Roofline of the routed-expert GEMMs of one decode step on one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeRoofline {
    pub batch: u32,
    pub tp: u32,
    /// Expected experts with at least one token under uniform top-k routing.
    pub active_experts: f64,
    /// Token rows per active expert on average.
    pub rows_per_active_expert: f64,
    /// Per MoE layer on this GPU: bytes and FLOPs of the gate_up and down GEMMs of active experts.
    pub gate_up_bytes: f64,
    pub down_bytes: f64,
    pub flops_per_layer: f64,
    /// max(bytes / bandwidth, FLOPs / peak) of each projection, per layer.
    pub gate_up_s: f64,
    pub down_s: f64,
    pub per_layer_s: f64,
    /// All MoE layers of one decode step.
    pub per_step_s: f64,
}

/// Roofline of one decode step's routed-expert GEMMs with `batch` sequences at `tp`-way tensor
/// parallelism inside each expert (every GPU holds a 1/tp slice of all experts), uniform routing,
/// activations of type `a_type` (NVFP4 on SM120, bf16 on the SM90 path). Counts only the experts
/// that received tokens; weights dominate, activations and bf16 outputs are included.
pub fn moe_decode_roofline(
    model: &MoeModel,
    sku: &Sku,
    batch: u32,
    tp: u32,
    a_type: AType,
) -> DecodeRoofline {
    let e = model.routed_experts as f64;
    let kk = model.experts_per_token as f64;
    let tp = tp.max(1);
    let active = if batch == 0 { 0.0 } else { e * (1.0 - (1.0 - kk / e).powi(batch as i32)) };
    let rows = batch as f64 * kk; // routed token rows, all experts together
    let h = model.hidden as f64;
    let i_tp = model.moe_intermediate as f64 / tp as f64;
    // gate_up: W [2 I/tp, H], A [rows, H], Y [rows, 2 I/tp]; down: W [H, I/tp], A [rows, I/tp], Y [rows, H].
    let gate_up_bytes = active * operand_bytes(AType::Nvfp4, 2.0 * i_tp, h)
        + operand_bytes(a_type, rows, h)
        + rows * 2.0 * i_tp * 2.0;
    let down_bytes = active * operand_bytes(AType::Nvfp4, h, i_tp)
        + operand_bytes(a_type, rows, i_tp)
        + rows * h * 2.0;
    let gate_up_flops = 2.0 * rows * 2.0 * i_tp * h;
    let down_flops = 2.0 * rows * h * i_tp;
    let roof = |bytes: f64, flops: f64| (bytes / sku.dram_bw).max(flops / sku.tensor_peak);
    let gate_up_s = roof(gate_up_bytes, gate_up_flops);
    let down_s = roof(down_bytes, down_flops);
    let per_layer_s = gate_up_s + down_s;
    DecodeRoofline {
        batch,
        tp,
        active_experts: active,
        rows_per_active_expert: if active > 0.0 { rows / active } else { 0.0 },
        gate_up_bytes,
        down_bytes,
        flops_per_layer: gate_up_flops + down_flops,
        gate_up_s,
        down_s,
        per_layer_s,
        per_step_s: per_layer_s * model.moe_layers as f64,
    }
}

/// GLM-5 at TP8 with the SKU's native activation type (NVFP4 on SM120, bf16 on SM90).
pub fn glm5_decode_roofline(sku: &Sku, batch: u32) -> DecodeRoofline {
    let a_type = match sku.family {
        crate::template::Family::Sm120 => AType::Nvfp4,
        crate::template::Family::Sm90 => AType::Bf16,
    };
    moe_decode_roofline(&GLM5, sku, batch, 8, a_type)
}

#[cfg(test)]
mod tests {
    use super::sku::{H200, RTX_PRO_6000_SERVER, RTX_PRO_6000_WS};
    use super::*;
    use crate::template::sm120;

    fn cfg(
        bm: u32,
        bn: u32,
        bk: u32,
        warps: (u32, u32, u32),
        stages: u32,
        split: u32,
        swap: bool,
    ) -> GemmConfig {
        sm120::config(bm, bn, bk, warps.0, warps.1, warps.2, stages, split, swap)
    }

    fn t(c: &GemmConfig, m: u32, n: u32, k: u32) -> Prediction {
        predict(&RTX_PRO_6000_WS, c, &GemmProblem::new(m, n, k, AType::Nvfp4), None).unwrap()
    }

    #[test]
    fn decode_gemm_is_memory_bound_and_near_bytes_over_bandwidth() {
        // EP gate_up expert 4096 x 6144 at M = 1: 14.2 MB of weights.
        let c = cfg(8, 64, 256, (1, 4, 1), 6, 1, true);
        let x = t(&c, 1, 4096, 6144);
        assert!(x.memory_bound());
        let floor = GemmProblem::new(1, 4096, 6144, AType::Nvfp4).min_bytes() as f64 / 1.792e12;
        assert!(x.total_s > floor, "{x:?}");
        assert!(x.total_s < floor + 4e-6, "{x:?} vs floor {floor}");
        // A token tile of 8 wastes less MMA than one of 16, and both are far below memory time.
        assert!(
            x.padded_flops
                < t(&cfg(16, 64, 256, (1, 4, 1), 6, 1, true), 1, 4096, 6144).padded_flops
        );
    }

    #[test]
    fn split_k_pays_off_when_the_grid_is_small() {
        // TP8 gate_up 512 x 6144, M = 1: 8 CTAs of 64 weight rows cannot draw the bandwidth.
        let one = t(&cfg(8, 64, 256, (1, 4, 1), 6, 1, true), 1, 512, 6144);
        let eight = t(&cfg(8, 64, 256, (1, 4, 1), 6, 8, true), 1, 512, 6144);
        assert_eq!((one.ctas, eight.ctas), (8, 64));
        assert!(one.drawable_bw < eight.drawable_bw);
        assert!(eight.total_s < one.total_s, "{eight:?} vs {one:?}");
        // With a large grid already, split-K only adds partial traffic and a tail.
        let big1 = t(&cfg(64, 128, 128, (2, 2, 1), 4, 1, false), 1024, 4096, 6144);
        let big4 = t(&cfg(64, 128, 128, (2, 2, 1), 4, 4, false), 1024, 4096, 6144);
        assert!(big4.total_s > big1.total_s);
    }

    #[test]
    fn large_gemm_is_compute_bound_at_the_measured_peak() {
        let c = cfg(128, 128, 128, (2, 2, 1), 3, 1, false);
        let x = t(&c, 8192, 8192, 8192);
        assert!(!x.memory_bound());
        let ideal = 2.0 * 8192f64.powi(3) / 1.43e15;
        assert!(x.total_s >= ideal && x.total_s < 1.2 * ideal, "{} vs {ideal}", x.total_s);
    }

    #[test]
    fn wave_quantization_shows_one_cta_past_a_full_wave() {
        let c = cfg(128, 128, 128, (2, 2, 1), 3, 1, false);
        let occ = t(&c, 128, 128, 8192).ctas_per_sm;
        let full = 188 * occ;
        let a = t(&c, 128, 128 * full, 8192);
        let b = t(&c, 128, 128 * (full + 1), 8192);
        assert_eq!((a.waves, b.waves), (1, 2));
        assert!(b.t_compute > 1.9 * a.t_compute, "{} vs {}", b.t_compute, a.t_compute);
    }

    #[test]
    fn bigger_problems_and_slower_memory_are_never_faster() {
        let c = sm120::default_config(AType::Nvfp4);
        let mut last = 0.0;
        // Once the grid draws full bandwidth, more weights or more tokens only cost more.
        for n in [4096, 8192, 16384, 32768] {
            let x = t(&c, 4, n, 6144).total_s;
            assert!(x > last, "N {n}: {x} <= {last}");
            last = x;
        }
        let mut last = 0.0;
        for m in [1, 16, 64, 256, 1024, 4096] {
            let x = t(&c, m, 4096, 6144).total_s;
            assert!(x > last, "M {m}: {x} <= {last}");
            last = x;
        }
        let p = GemmProblem::new(4, 4096, 6144, AType::Nvfp4);
        let ws = predict(&RTX_PRO_6000_WS, &c, &p, None).unwrap().total_s;
        let server = predict(&RTX_PRO_6000_SERVER, &c, &p, None).unwrap().total_s;
        assert!(server > ws);
        // Launch floor and fill bound even an empty-ish problem from below.
        assert!(t(&c, 1, 64, 256).total_s >= 2e-6);
    }

    #[test]
    fn occupancy_and_family_errors() {
        let c = cfg(16, 64, 256, (1, 4, 1), 6, 1, true);
        // 69 KB of shared memory: one CTA per SM; registers 255 x 128 threads still fit.
        let p = GemmProblem::new(1, 4096, 6144, AType::Nvfp4);
        assert_eq!(predict(&RTX_PRO_6000_WS, &c, &p, None).unwrap().ctas_per_sm, 1);
        let small = cfg(16, 64, 256, (1, 4, 1), 2, 1, true);
        assert!(predict(&RTX_PRO_6000_WS, &small, &p, Some(64)).unwrap().ctas_per_sm >= 4);
        assert!(matches!(predict(&H200, &c, &p, None), Err(ModelError::WrongFamily { .. })));
        // K not a multiple of block_k is the configuration's constraint error.
        let bad = GemmProblem::new(1, 4096, 6000, AType::Nvfp4);
        assert!(matches!(
            predict(&RTX_PRO_6000_WS, &c, &bad, None),
            Err(ModelError::Constraint(_))
        ));
    }

    #[test]
    fn ranking_prefers_narrow_split_tiles_for_tp8_decode() {
        let space = sm120::search_space(AType::Nvfp4);
        let p = GemmProblem::new(1, 512, 6144, AType::Nvfp4);
        let ranked = rank(&RTX_PRO_6000_WS, &p, &space);
        assert!(ranked.len() > 50);
        let best = ranked[0].0;
        assert!(best.swap_ab && best.split_k > 1, "{best}");
        assert!(ranked.windows(2).all(|w| w[0].1.total_s <= w[1].1.total_s));
    }

    #[test]
    fn glm5_decode_roofline_matches_hand_numbers() {
        // B = 1: exactly 8 experts active, one row each.
        let r = glm5_decode_roofline(&H200, 1);
        assert!((r.active_experts - 8.0).abs() < 1e-9);
        assert!((r.rows_per_active_expert - 1.0).abs() < 1e-9);
        // measuring.md: NVFP4 roofline on the H200, gate_up at B = 1 is 3.3 us, at B = 64 92 us,
        // down at B = 64 47 us.
        assert!((r.gate_up_s * 1e6 - 3.3).abs() < 0.2, "{}", r.gate_up_s * 1e6);
        let r64 = glm5_decode_roofline(&H200, 64);
        assert!((r64.active_experts - 222.5).abs() < 0.5, "{}", r64.active_experts);
        assert!((r64.gate_up_s * 1e6 - 92.0).abs() < 3.0, "{}", r64.gate_up_s * 1e6);
        assert!((r64.down_s * 1e6 - 47.0).abs() < 3.0, "{}", r64.down_s * 1e6);
        // glm5-shapes.md: all experts active streams ~679 MB per layer, ~0.4 ms on a PRO 6000.
        let all = glm5_decode_roofline(&RTX_PRO_6000_WS, 256);
        assert!(all.active_experts > 255.9);
        let w: f64 = 256.0 * (512.0 * 6144.0 + 6144.0 * 256.0) * (0.5 + 1.0 / 16.0);
        assert!((w / 1e6 - 679.5).abs() < 1.0);
        assert!(all.gate_up_bytes + all.down_bytes >= w);
        assert!(all.per_layer_s > 0.37e-3 && all.per_layer_s < 0.45e-3, "{}", all.per_layer_s);
        // Monotonic in the batch, and the Server Edition is slower than the Workstation.
        let mut last = 0.0;
        for b in [1, 2, 4, 8, 16, 32, 64, 128, 256] {
            let s = glm5_decode_roofline(&RTX_PRO_6000_WS, b).per_step_s;
            assert!(s > last);
            last = s;
        }
        assert!(
            glm5_decode_roofline(&RTX_PRO_6000_SERVER, 64).per_step_s
                > glm5_decode_roofline(&RTX_PRO_6000_WS, 64).per_step_s
        );
        assert_eq!(glm5_decode_roofline(&RTX_PRO_6000_WS, 0).per_step_s, 0.0);
    }
}
