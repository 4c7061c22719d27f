//! The GPUs (SKUs) the analytic model knows: SM count, bandwidth, tensor peaks, on-chip limits.

use crate::template::Family;
use serde::Serialize;
use std::fmt;

/// One GPU model as the analytic model sees it. Rates are per second, sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sku {
    pub name: &'static str,
    /// The kernel family that runs on it.
    pub family: Family,
    pub sms: u32,
    /// DRAM read bandwidth the model assumes reachable by a large streaming kernel.
    pub dram_bw: f64,
    /// L2 bandwidth for tiles re-read by many CTAs (an assumption: not measured yet).
    pub l2_bw: f64,
    /// Dense tensor throughput of the data path the family uses (FP4 block-scaled MMA on SM120,
    /// bf16 MMA after exact dequantization on SM90), FLOP/s, as measured (not the marketing peak).
    pub tensor_peak: f64,
    /// The vendor's dense peak of the same path, for reference.
    pub tensor_peak_spec: f64,
    /// Shared memory per SM usable by resident CTAs, and the opt-in maximum of one CTA.
    pub smem_per_sm: u32,
    pub smem_per_block: u32,
    /// Shared memory the driver reserves per resident CTA.
    pub smem_reserved_per_block: u32,
    pub max_threads_per_sm: u32,
    pub max_blocks_per_sm: u32,
    pub regs_per_sm: u32,
    /// Per-launch cost inside a CUDA graph (the deployment-faithful mode).
    pub launch_floor_s: f64,
    /// Latency of a DRAM access seen by one CTA's pipeline (Little's law: bandwidth a grid can
    /// draw is its bytes in flight over this latency) and fixed ramp of a small kernel.
    pub dram_latency_s: f64,
}

impl fmt::Display for Sku {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// RTX PRO 6000 Blackwell Workstation Edition: 188 SMs, GDDR7 1792 GB/s, ~2 PFLOP/s dense FP4 by
/// spec, 1.43 PFLOP/s measured through cuBLASLt (used as the reachable peak).
pub const RTX_PRO_6000_WS: Sku = Sku {
    name: "RTX PRO 6000 Blackwell Workstation",
    family: Family::Sm120,
    sms: 188,
    dram_bw: 1.792e12,
    l2_bw: 4.0 * 1.792e12,
    tensor_peak: 1.43e15,
    tensor_peak_spec: 2.0e15,
    smem_per_sm: 102_400,
    smem_per_block: 101_376,
    smem_reserved_per_block: 1024,
    max_threads_per_sm: 1536,
    max_blocks_per_sm: 24,
    regs_per_sm: 65_536,
    launch_floor_s: 1.0e-6,
    dram_latency_s: 1.0e-6,
};

/// RTX PRO 6000 Blackwell Server Edition: as the workstation card with 1597 GB/s.
pub const RTX_PRO_6000_SERVER: Sku =
    Sku { name: "RTX PRO 6000 Blackwell Server", dram_bw: 1.597e12, ..RTX_PRO_6000_WS };

/// GeForce RTX 5090: 170 SMs, 1792 GB/s. FP4 peak scaled from the PRO 6000 by SM count (same SM,
/// similar clocks; an assumption until measured).
pub const RTX_5090: Sku = Sku {
    name: "GeForce RTX 5090",
    sms: 170,
    tensor_peak: 1.43e15 * 170.0 / 188.0,
    tensor_peak_spec: 2.0e15 * 170.0 / 188.0,
    ..RTX_PRO_6000_WS
};

/// H200 (SM90): 132 SMs, 4.27 TB/s measured read bandwidth, bf16 dense ~790 TFLOP/s measured
/// (989 by spec), launch floor 0.66 us in a CUDA graph; the small-read ramp is fitted to the
/// measured read floors (0.89 MB in 1.55 us ... 453 MB in 104 us: about 1.3 us + bytes / 4.36 TB/s).
pub const H200: Sku = Sku {
    name: "H200",
    family: Family::Sm90,
    sms: 132,
    dram_bw: 4.27e12,
    l2_bw: 2.5 * 4.27e12,
    tensor_peak: 7.9e14,
    tensor_peak_spec: 9.89e14,
    smem_per_sm: 233_472,
    smem_per_block: 232_448,
    smem_reserved_per_block: 1024,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 32,
    regs_per_sm: 65_536,
    launch_floor_s: 0.66e-6,
    dram_latency_s: 0.7e-6,
};

/// Every SKU the model knows.
pub const ALL: [Sku; 4] = [RTX_PRO_6000_WS, RTX_PRO_6000_SERVER, RTX_5090, H200];

/// A SKU by (case-insensitive) name fragment: "pro 6000 ws", "server", "5090", "h200".
pub fn by_name(name: &str) -> Option<Sku> {
    let n = name.to_ascii_lowercase();
    if n.contains("server") {
        return Some(RTX_PRO_6000_SERVER);
    }
    if n.contains("5090") {
        return Some(RTX_5090);
    }
    if n.contains("h200") {
        return Some(H200);
    }
    if n.contains("6000") {
        return Some(RTX_PRO_6000_WS);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skus_match_their_data_sheets() {
        assert_eq!(RTX_PRO_6000_SERVER.sms, 188);
        assert_eq!(RTX_PRO_6000_SERVER.dram_bw, 1.597e12);
        assert_eq!(RTX_5090.sms, 170);
        let (fp4_5090, fp4_pro) = (RTX_5090.tensor_peak, RTX_PRO_6000_WS.tensor_peak);
        assert!((fp4_5090 / fp4_pro - 170.0 / 188.0).abs() < 1e-12);
        assert_eq!(H200.family, Family::Sm90);
        assert_eq!(by_name("RTX PRO 6000 Blackwell Server Edition"), Some(RTX_PRO_6000_SERVER));
        assert_eq!(by_name("NVIDIA GeForce RTX 5090"), Some(RTX_5090));
        assert_eq!(by_name("NVIDIA H200"), Some(H200));
        assert_eq!(by_name("A100"), None);
        for s in ALL {
            assert!(s.smem_per_block <= s.smem_per_sm, "{s}");
        }
    }
}
