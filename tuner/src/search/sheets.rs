//! Per-GPU data sheets: the [`DeviceModel`] of each GPU the cost model knows without measuring it
//! (the one set of device numbers in the crate; units as in [`DeviceModel`]: GB/s, TFLOP/s,
//! microseconds, bytes). On a GPU at hand, `DeviceModel::from_device_info` replaces them with what
//! the driver reports and what `fp4tune floors` measured.

use super::model::{DeviceModel, H200_STREAM};

/// Dense FP4 (block-scaled `mma ... kind::mxf4nvf4`) over dense bf16 (fp32 accumulate) tensor
/// throughput of an SM120 GPU the data sheets do not name: 4 on the RTX PRO 6000's published
/// rates; GeForce cards, whose bf16 with fp32 accumulate runs at half rate, have 8, so for them
/// the roofline's compute side is at most 2x too slow.
pub const SM120_FP4_PER_BF16: f64 = 4.0;

impl DeviceModel {
    /// NVIDIA H200 (SM90), measured: 4.27 TB/s read bandwidth, ~790 TFLOP/s bf16 dense (989 by
    /// spec), 132 SMs, 60 MiB L2, 228 KiB shared memory per SM, 0.66 us launch floor in a CUDA
    /// graph; the streaming coefficients are fitted to its measured read floor. L2 bandwidth and
    /// ALU rate are estimates (about 2.5x DRAM; 132 SMs x 128 lanes x 1.98 GHz).
    pub fn h200() -> Self {
        Self {
            name: "NVIDIA H200".into(),
            sm_count: 132,
            bandwidth_gbs: 4270.0,
            tensor_tflops: 790.0,
            smem_per_sm_bytes: 228 * 1024,
            max_threads_per_sm: 2048,
            max_ctas_per_sm: 32,
            regs_per_sm: 65536,
            launch_floor_us: 0.66,
            l2_bytes: 60 << 20,
            l2_bandwidth_gbs: 10_000.0,
            alu_tops: 33.5,
            stream: H200_STREAM,
        }
    }

    /// RTX PRO 6000 Blackwell Workstation Edition (SM120): 188 SMs, GDDR7 1792 GB/s, 128 MiB L2,
    /// ~2 PFLOP/s dense FP4 by spec and 1.43 PFLOP/s measured through cuBLASLt (used as the
    /// reachable peak). What the model-guided search pre-ranks SM120 variants with before any
    /// SM120 measurement exists. Assumed, not measured: L2 bandwidth 4x DRAM, a 1 us launch
    /// floor, the ALU rate scaled from the H200 by SM count, the H200's streaming coefficients.
    pub fn rtx_pro_6000_ws() -> Self {
        let h200 = Self::h200();
        Self {
            name: "RTX PRO 6000 Blackwell Workstation".into(),
            sm_count: 188,
            bandwidth_gbs: 1792.0,
            tensor_tflops: 1430.0,
            smem_per_sm_bytes: 102_400,
            max_threads_per_sm: 1536,
            max_ctas_per_sm: 24,
            regs_per_sm: 65_536,
            launch_floor_us: 1.0,
            l2_bytes: 128 << 20,
            l2_bandwidth_gbs: 4.0 * 1792.0,
            alu_tops: h200.alu_tops * 188.0 / 132.0,
            stream: H200_STREAM,
        }
    }

    /// RTX PRO 6000 Blackwell Server Edition: the workstation card with 1597 GB/s.
    pub fn rtx_pro_6000_server() -> Self {
        Self {
            name: "RTX PRO 6000 Blackwell Server".into(),
            bandwidth_gbs: 1597.0,
            ..Self::rtx_pro_6000_ws()
        }
    }

    /// GeForce RTX 5090: 170 SMs, 1792 GB/s, 96 MiB L2; FP4 peak and ALU rate scaled from the
    /// PRO 6000 by SM count (same SM, similar clocks; an assumption until measured).
    pub fn rtx_5090() -> Self {
        let pro = Self::rtx_pro_6000_ws();
        Self {
            name: "GeForce RTX 5090".into(),
            sm_count: 170,
            tensor_tflops: pro.tensor_tflops * 170.0 / 188.0,
            l2_bytes: 96 << 20,
            alu_tops: Self::h200().alu_tops * 170.0 / 132.0,
            ..pro
        }
    }

    /// The tensor peak of the data path (TFLOP/s), which a roofline divides 2MNK by: the sm90
    /// kernels run bf16 MMAs (W4A16, and W4A4 by exact emulation), so there it is the
    /// `bf16_measured` cuBLAS peak; the sm120 kernels run the native FP4 MMA, so there it is the
    /// data sheet's FP4 peak of a GPU the sheets name, else [`SM120_FP4_PER_BF16`] x the measured
    /// bf16 peak, and never below the measured bf16 peak (a roofline at the bf16 rate would let a
    /// native FP4 kernel measure faster than its roofline). [`Self::data_path_peak_label`] says
    /// which.
    pub fn data_path_peak_tflops(
        device_name: &str,
        compute_capability: (u32, u32),
        bf16_measured: f64,
    ) -> f64 {
        if !Self::fp4_data_path(compute_capability) {
            return bf16_measured;
        }
        match Self::data_sheet(device_name) {
            Some(sheet) => sheet.tensor_tflops.max(bf16_measured),
            None => SM120_FP4_PER_BF16 * bf16_measured,
        }
    }

    /// Whether this GPU's kernels run the native FP4 MMA (SM 12.x), whose peak is not bf16's.
    pub fn fp4_data_path(compute_capability: (u32, u32)) -> bool {
        compute_capability.0 == 12
    }

    /// What [`Self::data_path_peak_tflops`] is on this GPU, for reports.
    pub fn data_path_peak_label(device_name: &str, compute_capability: (u32, u32)) -> &'static str {
        if !Self::fp4_data_path(compute_capability) {
            "bf16 tensor peak of the data path, measured by cuBLAS"
        } else if Self::data_sheet(device_name).is_some() {
            "FP4 tensor peak of the data path, from fp4tune's data sheet of this GPU"
        } else {
            "FP4 tensor peak of the data path, assumed 4x the bf16 peak measured by cuBLAS"
        }
    }

    /// Every data sheet.
    pub fn data_sheets() -> Vec<Self> {
        vec![Self::h200(), Self::rtx_pro_6000_ws(), Self::rtx_pro_6000_server(), Self::rtx_5090()]
    }

    /// A data sheet by (case-insensitive) name fragment of the device name: "H200", "5090", "RTX
    /// PRO 6000 ... Server Edition", "RTX PRO 6000" (the Workstation Edition). The PRO 6000 Max-Q
    /// Workstation Edition has none: the same chip at lower clocks, whose peaks no sheet holds (so
    /// its roofline takes the measured bf16 peak's multiple, not the 600 W card's FP4 rate).
    pub fn data_sheet(device_name: &str) -> Option<Self> {
        let n = device_name.to_ascii_lowercase();
        if n.contains("h200") {
            Some(Self::h200())
        } else if n.contains("rtx 5090") {
            Some(Self::rtx_5090())
        } else if !n.contains("rtx pro 6000") || n.contains("max-q") {
            None
        } else if n.contains("server") {
            Some(Self::rtx_pro_6000_server())
        } else {
            Some(Self::rtx_pro_6000_ws())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sm90 rooflines take the measured bf16 peak; sm120 ones an FP4 peak: the sheet's for a GPU
    /// it names (never below the measured bf16), else 4x the measured bf16 peak.
    #[test]
    fn the_data_path_peak_is_the_family_mma_rate() {
        let peak = DeviceModel::data_path_peak_tflops;
        assert_eq!(peak("NVIDIA H200", (9, 0), 790.0), 790.0);
        assert_eq!(peak("NVIDIA H100 80GB HBM3", (9, 0), 700.0), 700.0);
        let pro = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition";
        assert_eq!(peak(pro, (12, 0), 400.0), 1430.0);
        assert_eq!(peak(pro, (12, 0), 2000.0), 2000.0);
        assert_eq!(peak("NVIDIA GeForce RTX 5080", (12, 0), 200.0), 800.0);
        let label = DeviceModel::data_path_peak_label;
        assert!(label("NVIDIA H200", (9, 0)).starts_with("bf16"));
        assert!(label(pro, (12, 0)).contains("data sheet"));
        assert!(label("NVIDIA GeForce RTX 5080", (12, 0)).contains("assumed 4x"));
    }

    #[test]
    fn data_sheets_hold_the_measured_and_published_numbers() {
        let h = DeviceModel::h200();
        assert_eq!((h.sm_count, h.bandwidth_gbs, h.launch_floor_us), (132, 4270.0, 0.66));
        assert_eq!(h.l2_bytes, 60 << 20);
        let server = DeviceModel::rtx_pro_6000_server();
        assert_eq!((server.sm_count, server.bandwidth_gbs), (188, 1597.0));
        let (fp4_5090, fp4_pro) =
            (DeviceModel::rtx_5090().tensor_tflops, DeviceModel::rtx_pro_6000_ws().tensor_tflops);
        assert!((fp4_5090 / fp4_pro - 170.0 / 188.0).abs() < 1e-12);
        let by = |n: &str| DeviceModel::data_sheet(n).map(|d| d.name);
        assert_eq!(by("NVIDIA RTX PRO 6000 Blackwell Server Edition"), Some(server.name));
        assert_eq!(by("NVIDIA GeForce RTX 5090"), Some("GeForce RTX 5090".into()));
        assert_eq!(by("NVIDIA H200"), Some("NVIDIA H200".into()));
        assert_eq!(by("A100"), None);
        let ws = Some(DeviceModel::rtx_pro_6000_ws().name);
        assert_eq!(by("NVIDIA RTX PRO 6000 Blackwell Workstation Edition"), ws);
        // Other cards whose names share a fragment with a sheet's take no sheet.
        assert_eq!(by("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"), None);
        assert_eq!(by("NVIDIA RTX PRO 4500 Blackwell Server Edition"), None);
        assert_eq!(by("NVIDIA RTX 6000 Ada Generation"), None);
        for d in DeviceModel::data_sheets() {
            assert!(d.bandwidth_gbs > 0.0 && d.tensor_tflops > 0.0, "{}", d.name);
        }
    }
}
