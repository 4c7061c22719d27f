//! The analytic cost model that pre-ranks a search space: roofline (bytes over a bandwidth that
//! grows with the bytes in flight, FLOPs over the tensor peak), occupancy, wave quantization,
//! split-K and a launch floor, over a generic [`DeviceModel`] (the one performance model of the
//! crate; the per-GPU data sheets are in `sheets.rs`, the decode-step roofline in `roofline.rs`).
//! Units: microseconds, GB/s, TFLOP/s, bytes.
//!
//! Memory time follows Little's law: a kernel keeps `in_flight` bytes requested, each request
//! takes `latency_us`, so it streams at most `in_flight / latency` and at most the device
//! bandwidth; the two limits are joined smoothly (`smoothness`). The coefficients are fitted to
//! the measured read floor of the H200 ([`H200_READ_FLOOR`]): a small kernel with few CTAs in
//! flight reaches a fraction of the bandwidth (1.77 MB: 0.83 TB/s with 132 CTAs, 0.98 with 264).

use crate::gpu::DeviceInfo;
use crate::problem::{AType, GemmProblem};
use crate::template::{Family, GemmConfig, Pipeline};
use serde::{Deserialize, Serialize};

/// Coefficients of the memory-streaming model (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StreamFit {
    /// Latency of one request under load; also the time to the first byte.
    pub latency_us: f64,
    /// Exponent p of the smooth minimum `(peak^-p + (inflight/latency)^-p)^(-1/p)`.
    pub smoothness: f64,
    /// Cost of each extra round (wave) of CTAs: launch of the round and pipeline refill.
    pub round_overhead_us: f64,
    /// Bytes in flight per 512-thread block of the read-floor probe (the calibration point).
    pub probe_inflight_bytes: f64,
    /// Streaming asymptote as a multiple of `DeviceModel::bandwidth_gbs` (the smooth minimum
    /// stays below its asymptote, so this is usually a little above 1).
    pub asymptote: f64,
}

/// One measurement of the read-floor probe (`read_floor.cu`: 512-thread blocks streaming bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadFloorPoint {
    pub bytes: f64,
    pub blocks: u32,
    pub us: f64,
}

/// The H200 read floor measured by `fp4tune floors` (MB, 512-thread blocks, microseconds).
pub const H200_READ_FLOOR: [(f64, u32, f64); 40] = [
    (0.885, 132, 1.55),
    (0.885, 264, 1.58),
    (0.885, 528, 1.60),
    (0.885, 1056, 1.60),
    (0.885, 2112, 2.00),
    (1.770, 132, 2.12),
    (1.770, 264, 1.81),
    (1.770, 528, 1.81),
    (1.770, 1056, 1.82),
    (1.770, 2112, 2.15),
    (3.540, 132, 3.04),
    (3.540, 264, 2.48),
    (3.540, 528, 2.24),
    (3.540, 1056, 2.24),
    (3.540, 2112, 2.73),
    (7.080, 132, 4.61),
    (7.080, 264, 3.65),
    (7.080, 528, 3.28),
    (7.080, 1056, 3.17),
    (7.080, 2112, 3.38),
    (14.160, 132, 7.52),
    (14.160, 264, 5.54),
    (14.160, 528, 4.91),
    (14.160, 1056, 4.80),
    (14.160, 2112, 4.80),
    (28.300, 132, 13.63),
    (28.300, 264, 9.45),
    (28.300, 528, 8.27),
    (28.300, 1056, 8.23),
    (28.300, 2112, 8.24),
    (113.000, 132, 48.31),
    (113.000, 264, 31.74),
    (113.000, 528, 27.72),
    (113.000, 1056, 27.78),
    (113.000, 2112, 28.04),
    (453.000, 132, 186.45),
    (453.000, 264, 119.99),
    (453.000, 528, 104.29),
    (453.000, 1056, 103.98),
    (453.000, 2112, 104.15),
];

/// The H200 read floor as points.
pub fn h200_read_floor() -> Vec<ReadFloorPoint> {
    H200_READ_FLOOR
        .iter()
        .map(|&(mb, blocks, us)| ReadFloorPoint { bytes: mb * 1e6, blocks, us })
        .collect()
}

/// What the cost model needs to know about a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceModel {
    pub name: String,
    pub sm_count: u32,
    /// Sustained DRAM read bandwidth, GB/s.
    pub bandwidth_gbs: f64,
    /// Dense tensor peak of the MMA data path the family uses, TFLOP/s.
    pub tensor_tflops: f64,
    pub smem_per_sm_bytes: u32,
    pub max_threads_per_sm: u32,
    pub max_ctas_per_sm: u32,
    pub regs_per_sm: u32,
    /// Cost of one launch inside a CUDA graph (an empty kernel), microseconds.
    pub launch_floor_us: f64,
    /// L2 size, bytes (what cold-L2 timing rotates past; not used by the estimate).
    #[serde(default)]
    pub l2_bytes: u64,
    /// L2-to-SM bandwidth, GB/s (re-reads of tiles shared by several CTAs, split-K partials).
    pub l2_bandwidth_gbs: f64,
    /// Integer/FP32 ALU throughput, tera-operations per second (dequantization on Hopper).
    pub alu_tops: f64,
    pub stream: StreamFit,
}

/// Fitted to [`H200_READ_FLOOR`] by [`StreamFit::fit`] (a test checks the two agree).
pub(super) const H200_STREAM: StreamFit = StreamFit {
    latency_us: 0.5,
    smoothness: 2.5,
    round_overhead_us: 0.15,
    probe_inflight_bytes: 9216.0,
    asymptote: 1.025,
};

impl DeviceModel {
    /// A model from the facts the driver reports plus measured bandwidth, tensor peak and launch
    /// floor. Per-SM limits come from the compute capability; the streaming coefficients start
    /// as the H200's (refit with [`StreamFit::fit`] on the device's own read floor when known).
    pub fn from_device_info(
        info: &DeviceInfo,
        bandwidth_gbs: f64,
        tensor_tflops: f64,
        launch_floor_us: f64,
    ) -> Self {
        let (smem_kib, threads, ctas) = match info.compute_capability {
            (9, 0) => (228, 2048, 32),
            (8, 0) => (164, 2048, 32),
            (10, _) => (228, 2048, 32),
            (12, _) | (8, 6) | (8, 9) => (100, 1536, 32),
            _ => (100, 1536, 16),
        };
        let lanes_tops = info.sm_count as f64 * 128.0 * info.sm_clock_mhz.max(1) as f64 * 1e-6;
        Self {
            name: info.name.clone(),
            sm_count: info.sm_count.max(1),
            bandwidth_gbs,
            tensor_tflops,
            smem_per_sm_bytes: smem_kib * 1024,
            max_threads_per_sm: threads,
            max_ctas_per_sm: ctas,
            regs_per_sm: 65536,
            launch_floor_us,
            l2_bytes: info.l2_bytes,
            l2_bandwidth_gbs: 2.5 * bandwidth_gbs,
            alu_tops: lanes_tops,
            stream: H200_STREAM,
        }
    }

    pub fn with_stream(mut self, stream: StreamFit) -> Self {
        self.stream = stream;
        self
    }

    /// Streaming bandwidth (bytes per microsecond) with `inflight` bytes requested at a time.
    pub fn stream_bandwidth(&self, inflight: f64) -> f64 {
        let peak = self.bandwidth_gbs * self.stream.asymptote * 1e3;
        let little = inflight.max(1.0) / self.stream.latency_us.max(1e-6);
        let p = self.stream.smoothness;
        (peak.powf(-p) + little.powf(-p)).powf(-1.0 / p)
    }

    /// Time to stream `bytes` with `ctas` CTAs of `inflight_per_cta` bytes in flight each, at
    /// most `slots` of them resident at once (excluding launch and first-byte latency). CTAs
    /// retire and are replaced at different times, so the bytes in flight are those of the
    /// resident CTAs, capped by the bytes there are.
    fn stream_us(&self, bytes: f64, ctas: u64, slots: u64, inflight_per_cta: f64) -> f64 {
        if ctas == 0 || bytes <= 0.0 {
            return 0.0;
        }
        let inflight = (ctas.min(slots) as f64 * inflight_per_cta).min(bytes);
        bytes / self.stream_bandwidth(inflight)
    }

    /// The model's time for the read-floor probe (`blocks` blocks of 512 threads).
    pub fn probe_us(&self, bytes: f64, blocks: u32) -> f64 {
        let per_sm = (self.max_threads_per_sm / 512).max(1) as u64;
        let slots = self.sm_count as u64 * per_sm;
        let rounds = (blocks as u64).div_ceil(slots);
        self.launch_floor_us
            + self.stream.latency_us
            + self.stream_us(bytes, blocks as u64, slots, self.stream.probe_inflight_bytes)
            + self.stream.round_overhead_us * rounds.saturating_sub(1) as f64
    }
}

impl StreamFit {
    /// Least-squares fit (in log time) of the streaming coefficients to read-floor
    /// measurements, by grid search; bandwidth, SM count and launch floor come from `device`.
    /// Returns the fit and its RMS relative error.
    pub fn fit(device: &DeviceModel, points: &[ReadFloorPoint]) -> (StreamFit, f64) {
        let mut best = (device.stream, f64::INFINITY);
        let mut d = device.clone();
        for li in 6..=24 {
            for fk in 2..=40 {
                for hi in 0..=10 {
                    for (p, ai) in [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0]
                        .into_iter()
                        .flat_map(|p| (0..=4).map(move |ai| (p, ai)))
                    {
                        d.stream = StreamFit {
                            latency_us: li as f64 * 0.05,
                            smoothness: p,
                            round_overhead_us: hi as f64 * 0.05,
                            probe_inflight_bytes: fk as f64 * 1024.0,
                            asymptote: 1.0 + ai as f64 * 0.025,
                        };
                        let err: f64 = points
                            .iter()
                            .map(|q| (d.probe_us(q.bytes, q.blocks) / q.us).ln().powi(2))
                            .sum();
                        if err < best.1 {
                            best = (d.stream, err);
                        }
                    }
                }
            }
        }
        let rms = (best.1 / points.len().max(1) as f64).sqrt();
        (best.0, rms)
    }
}

/// What limits a configuration according to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bound {
    Memory,
    L2,
    Compute,
}

/// The model's estimate for one configuration on one problem.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Predicted time per launch; infinite when the configuration cannot be resident at all.
    pub us: f64,
    pub ctas: u64,
    pub ctas_per_sm: u32,
    /// Waves of CTAs (ceil(ctas / (SMs x CTAs per SM))).
    pub rounds: u64,
    pub memory_us: f64,
    pub l2_us: f64,
    /// Tensor-core time plus (Hopper) dequantization time.
    pub compute_us: f64,
    pub bound: Bound,
}

/// Operations per dequantized NVFP4 element on the bf16 data path (nibble unpack, scale multiply).
const DEQUANT_OPS_PER_ELEMENT: f64 = 2.0;
/// Resident warps per SM needed to reach the tensor/ALU peak.
const WARPS_FOR_PEAK: f64 = 8.0;

/// The analytic cost model over a [`DeviceModel`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    pub device: DeviceModel,
}

impl CostModel {
    pub fn new(device: DeviceModel) -> Self {
        Self { device }
    }

    /// A rough register count per thread: fp32 accumulators of the warp tile plus fragments.
    pub fn estimated_registers(c: &GemmConfig) -> u32 {
        let wm = c.warps_m.max(1);
        let wn = c.warps_n.max(1);
        let acc = (c.block_m / wm).max(1) * (c.block_n / wn).max(1) / 32;
        // A register-streamed kernel also holds its ring (weights, and activations for `Global`).
        let ring = crate::template::sm90::ring_registers(c);
        (48 + acc + acc / 4 + ring).min(c.register_cap())
    }

    /// CTAs of `c` resident per SM (0: does not fit), with `regs` registers per thread.
    pub fn ctas_per_sm(&self, c: &GemmConfig, regs: Option<u32>) -> u32 {
        let d = &self.device;
        let threads = c.threads().max(32);
        let by_threads = d.max_threads_per_sm / threads;
        let smem = c.smem_bytes();
        let by_smem = if smem == 0 { u32::MAX } else { d.smem_per_sm_bytes / (smem + 1024) };
        let regs = regs.unwrap_or_else(|| Self::estimated_registers(c)).div_ceil(8) * 8;
        let by_regs = d.regs_per_sm / (regs.max(1) * threads);
        by_threads.min(by_smem).min(by_regs).min(d.max_ctas_per_sm)
    }

    pub fn estimate(&self, c: &GemmConfig, p: &GemmProblem) -> Estimate {
        self.estimate_with(c, p, None)
    }

    /// Estimate with a known register count per thread (from ptxas), if any.
    pub fn estimate_with(&self, c: &GemmConfig, p: &GemmProblem, regs: Option<u32>) -> Estimate {
        let d = &self.device;
        let (m, n, k) = (p.m as f64, p.n as f64, p.k as f64);
        let (bm, bn, bk) = (c.block_m.max(1), c.block_n.max(1), c.block_k.max(1));
        let split = c.split_k.max(1);
        let tiles_n = p.n.div_ceil(bn) as u64;
        let tiles_m = p.m.div_ceil(bm) as u64;
        let ctas = tiles_n * tiles_m * split as u64;
        let occ = self.ctas_per_sm(c, regs);
        if occ == 0 || ctas == 0 {
            return Estimate {
                us: f64::INFINITY,
                ctas,
                ctas_per_sm: occ,
                rounds: 0,
                memory_us: f64::INFINITY,
                l2_us: 0.0,
                compute_us: 0.0,
                bound: Bound::Memory,
            };
        }
        let sms = d.sm_count.max(1) as u64;
        let slots = sms * occ as u64;
        let rounds = ctas.div_ceil(slots);
        let per_sm = (occ as u64).min(ctas.div_ceil(sms)) as f64;
        let k_split = (p.k.div_ceil(split)).div_ceil(bk) as f64 * bk as f64;

        // DRAM: every operand once; in flight: all stages but the one being consumed.
        let w_elem = 0.5 + 1.0 / 16.0;
        let a_elem = match p.a_type {
            AType::Nvfp4 => w_elem,
            AType::Bf16 => 2.0,
        };
        let dram = p.min_bytes() as f64;
        let stage = bk as f64 * (bn as f64 * w_elem + bm as f64 * a_elem);
        let inflight = match c.pipeline {
            Pipeline::CpAsync | Pipeline::KTail => (c.stages.max(2) - 1) as f64 * stage,
            // Every warp keeps `stages` chunks (128 k) of its weight rows in flight.
            Pipeline::Registers | Pipeline::WarpRing | Pipeline::Global => {
                c.stages as f64 * 128.0 * bn as f64 * c.warps_k.max(1) as f64 * w_elem
            }
        };
        let memory_us = d.stream_us(dram, ctas, slots, inflight);

        // L2: weight tiles re-read by every token tile, activations by every weight tile,
        // split-K partials written and read back.
        let w_bytes = n * k * w_elem;
        let a_bytes = m * k * a_elem;
        let partials = if split > 1 { 2.0 * split as f64 * m * n * 4.0 } else { 0.0 };
        let l2 = w_bytes * tiles_m as f64 + a_bytes * tiles_n as f64 + partials;
        let l2_us = l2 / (d.l2_bandwidth_gbs * 1e3);

        // Compute: padded tiles on the tensor cores, per SM, in rounds; Hopper dequantizes the
        // weight tile (and an NVFP4 activation tile) once per CTA.
        let warps = (c.threads() / 32) as f64;
        let eff = (per_sm * warps / WARPS_FOR_PEAK).min(1.0);
        let cta_flops = 2.0 * bm as f64 * bn as f64 * k_split;
        let peak_sm = d.tensor_tflops * 1e6 / sms as f64;
        let mut cta_us = cta_flops / peak_sm;
        if c.family == Family::Sm90 {
            let rows = bn as f64 + if p.a_type == AType::Nvfp4 { bm as f64 } else { 0.0 };
            let alu_sm = d.alu_tops * 1e6 / sms as f64;
            cta_us += rows * k_split * DEQUANT_OPS_PER_ELEMENT / alu_sm;
        }
        let compute_us = rounds as f64 * per_sm * cta_us / eff.max(1e-6);

        let (body, bound) = if memory_us >= l2_us && memory_us >= compute_us {
            (memory_us, Bound::Memory)
        } else if l2_us >= compute_us {
            (l2_us, Bound::L2)
        } else {
            (compute_us, Bound::Compute)
        };
        let split_tail = if split > 1 { 0.5 * d.stream.latency_us } else { 0.0 };
        let us = d.launch_floor_us
            + d.stream.latency_us
            + body
            + d.stream.round_overhead_us * (rounds - 1) as f64
            + split_tail;
        Estimate { us, ctas, ctas_per_sm: occ, rounds, memory_us, l2_us, compute_us, bound }
    }

    /// `configs` sorted by predicted time (fastest first; ties keep the input order).
    pub fn rank(&self, configs: &[GemmConfig], p: &GemmProblem) -> Vec<(GemmConfig, f64)> {
        let mut v: Vec<(GemmConfig, f64)> =
            configs.iter().map(|c| (*c, self.estimate(c, p).us)).collect();
        v.sort_by(|a, b| a.1.total_cmp(&b.1));
        v
    }
}

/// Predictions within this factor of the best one are ties the model cannot break (measured on
/// the H200: its top candidates of a decode shape measure 1.9-3x its prediction, whatever the
/// pipeline); a pipeline whose best prediction is further off is left out of the coverage rules.
pub const PIPELINE_COMPETITIVE_FACTOR: f64 = 1.5;

/// The weight pipelines of `ranked` (model order, predicted microseconds) whose best prediction is
/// within [`PIPELINE_COMPETITIVE_FACTOR`] of the overall best, in `Pipeline` order.
pub fn competitive_pipelines(ranked: &[(GemmConfig, f64)]) -> Vec<Pipeline> {
    let best = ranked.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
    let mut out: Vec<Pipeline> = ranked
        .iter()
        .filter(|(_, us)| *us <= best * PIPELINE_COMPETITIVE_FACTOR)
        .map(|(c, _)| c.pipeline)
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod sku_tests {
    use super::*;

    #[test]
    fn sku_models_rank_sm120_decode_variants() {
        use crate::problem::{AType, GemmProblem};
        use crate::template::{search_space, Family};
        let pro = DeviceModel::rtx_pro_6000_ws();
        assert_eq!(pro.sm_count, 188);
        assert!((pro.bandwidth_gbs - 1792.0).abs() < 1.0, "{}", pro.bandwidth_gbs);
        let space = search_space(Family::Sm120, AType::Nvfp4);
        let p = GemmProblem::new(1, 512, 6144, AType::Nvfp4);
        let legal: Vec<_> = space.into_iter().filter(|c| c.check_problem(&p).is_ok()).collect();
        let ranked = CostModel::new(pro).rank(&legal, &p);
        assert_eq!(ranked.len(), legal.len());
        // Decode on one weight matrix: the favourite swaps A and B and has many CTAs in flight.
        let (best, t) = ranked[0];
        assert!(best.swap_ab, "{best}");
        assert!(t > 0.0 && ranked.windows(2).all(|w| w[0].1 <= w[1].1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::space::tests::base;

    #[test]
    fn h200_stream_coefficients_are_the_fit_of_the_read_floor() {
        let d = DeviceModel::h200();
        let (fit, rms) = StreamFit::fit(&d, &h200_read_floor());
        eprintln!("read-floor fit rms {rms:.3}");
        for q in h200_read_floor() {
            eprintln!(
                "{:.3} MB {} blocks: {} us, model {:.2}",
                q.bytes / 1e6,
                q.blocks,
                q.us,
                d.probe_us(q.bytes, q.blocks)
            );
        }
        assert!(rms < 0.10, "rms {rms}");
        let same = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(
            same(fit.latency_us, d.stream.latency_us)
                && same(fit.smoothness, d.stream.smoothness)
                && same(fit.round_overhead_us, d.stream.round_overhead_us)
                && same(fit.probe_inflight_bytes, d.stream.probe_inflight_bytes)
                && same(fit.asymptote, d.stream.asymptote),
            "refit the constant H200_STREAM: {fit:?}"
        );
        // The small-kernel insight: 1.77 MB with 132 CTAs is slower than with 264.
        let t132 = d.probe_us(1.77e6, 132);
        let t264 = d.probe_us(1.77e6, 264);
        assert!(t132 > t264 * 1.05, "{t132} vs {t264}");
        // Large reads approach the bandwidth.
        let big = d.probe_us(453e6, 1056);
        assert!((big / 104.0 - 1.0).abs() < 0.10, "{big}");
    }

    #[test]
    fn bandwidth_grows_with_bytes_in_flight_and_saturates() {
        let d = DeviceModel::h200();
        let a = d.stream_bandwidth(64e3);
        let b = d.stream_bandwidth(512e3);
        let c = d.stream_bandwidth(64e6);
        assert!(a < b && b < c);
        let asymptote = d.bandwidth_gbs * d.stream.asymptote * 1e3;
        assert!(c <= asymptote && c > 0.95 * asymptote, "{c} vs {asymptote}");
    }

    fn cfg(bm: u32, bn: u32, bk: u32, wm: u32, wn: u32, stages: u32, split: u32) -> GemmConfig {
        GemmConfig {
            block_m: bm,
            block_n: bn,
            block_k: bk,
            warps_m: wm,
            warps_n: wn,
            warps_k: 1,
            stages,
            split_k: split,
            swap_ab: bm <= 32,
            ..base(AType::Bf16)
        }
    }

    #[test]
    fn one_cta_for_a_huge_problem_ranks_below_a_full_grid() {
        let m = CostModel::new(DeviceModel::h200());
        let p = GemmProblem::new(128, 128, 65536, AType::Bf16);
        let one = cfg(128, 128, 128, 2, 4, 4, 1);
        let many = cfg(64, 64, 128, 2, 2, 4, 16);
        let (e1, e2) = (m.estimate(&one, &p), m.estimate(&many, &p));
        assert_eq!(e1.ctas, 1);
        assert_eq!(e2.ctas, 64);
        assert!(e1.us > 4.0 * e2.us, "{e1:?} vs {e2:?}");
        let ranked = m.rank(&[one, many], &p);
        assert_eq!(ranked[0].0, many);
    }

    #[test]
    fn small_m_decode_prefers_many_ctas_and_stays_above_the_read_floor() {
        let m = CostModel::new(DeviceModel::h200());
        // TP8 gate_up expert at M = 1: 1.77 MB of weights.
        let p = GemmProblem::new(1, 512, 6144, AType::Bf16);
        let narrow = cfg(8, 128, 128, 1, 4, 4, 1); // 4 CTAs
        let wide = cfg(8, 16, 128, 1, 1, 4, 8); // 256 CTAs
        let (en, ew) = (m.estimate(&narrow, &p), m.estimate(&wide, &p));
        assert!(en.us > 2.0 * ew.us, "{en:?} vs {ew:?}");
        // Four CTAs leave 128 SMs idle: both the stream and the dequantization starve.
        assert!(en.memory_us > 3.0 * ew.memory_us, "{en:?} vs {ew:?}");
        // Never faster than the measured read floor of these bytes (1.81 us) by much.
        assert!(ew.us > 1.5, "{ew:?}");
        assert!(ew.us < 4.0, "{ew:?}");
    }

    #[test]
    fn large_m_is_compute_bound_and_prefers_big_tiles() {
        let m = CostModel::new(DeviceModel::h200());
        let p = GemmProblem::new(4096, 6144, 6144, AType::Bf16);
        let big = cfg(128, 128, 64, 2, 4, 4, 1);
        let tiny = cfg(16, 16, 64, 1, 1, 4, 1);
        let (eb, et) = (m.estimate(&big, &p), m.estimate(&tiny, &p));
        assert_eq!(eb.bound, Bound::Compute);
        assert!(et.us > eb.us, "{et:?} vs {eb:?}");
        // About 2*M*N*K / 790 TFLOP/s = 392 us, plus dequantization.
        assert!(eb.us > 392.0 && eb.us < 800.0, "{eb:?}");
    }

    #[test]
    fn model_from_device_info_uses_the_compute_capability() {
        let info = DeviceInfo {
            name: "NVIDIA RTX PRO 6000 Blackwell".into(),
            compute_capability: (12, 0),
            sm_count: 188,
            l2_bytes: 128 << 20,
            total_mem: 96 << 30,
            max_smem_per_block_optin: 101_376,
            driver_version: (13, 0),
            sm_clock_mhz: 2600,
            mem_clock_mhz: 14_000,
            mem_bus_bits: 512,
        };
        let d = DeviceModel::from_device_info(&info, 1600.0, 1430.0, 1.0);
        assert_eq!(
            (d.sm_count, d.max_threads_per_sm, d.smem_per_sm_bytes),
            (188, 1536, 100 * 1024)
        );
        assert!((d.alu_tops - 188.0 * 128.0 * 2.6e-3).abs() < 1e-6);
        // Same problem, slower memory: a memory-bound estimate grows.
        let p = GemmProblem::new(1, 4096, 6144, AType::Nvfp4);
        let c = GemmConfig {
            family: Family::Sm120,
            a_type: AType::Nvfp4,
            ..cfg(8, 64, 128, 1, 4, 4, 2)
        };
        let slow = CostModel::new(d).estimate(&c, &p);
        let fast = CostModel::new(DeviceModel::h200()).estimate(&c, &p);
        assert!(slow.memory_us > 2.0 * fast.memory_us, "{slow:?} vs {fast:?}");
    }

    #[test]
    fn occupancy_respects_threads_registers_and_shared_memory() {
        let mut d = DeviceModel::h200();
        d.max_threads_per_sm = 1024;
        d.smem_per_sm_bytes = u32::MAX / 2;
        let c = cfg(64, 64, 128, 2, 4, 4, 1); // 256 threads
        let m = CostModel::new(d.clone());
        assert_eq!(m.ctas_per_sm(&c, Some(32)), 4);
        assert_eq!(m.ctas_per_sm(&c, Some(128)), 2);
        assert_eq!(m.ctas_per_sm(&c, Some(255)), 1);
        // Room for exactly one CTA's shared memory (plus the 1 KiB reserved per CTA).
        let smem = c.smem_bytes();
        if smem > 0 {
            d.smem_per_sm_bytes = smem + 1024;
            assert_eq!(CostModel::new(d.clone()).ctas_per_sm(&c, Some(32)), 1);
            d.smem_per_sm_bytes = smem;
            assert_eq!(CostModel::new(d).ctas_per_sm(&c, Some(32)), 0);
            assert!(CostModel::new(DeviceModel { smem_per_sm_bytes: smem, ..DeviceModel::h200() })
                .estimate(&c, &GemmProblem::new(64, 64, 1024, AType::Bf16))
                .us
                .is_infinite());
        }
    }
}
