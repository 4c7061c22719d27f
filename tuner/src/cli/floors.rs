//! `fp4tune floors`: the device's physical floors.

use anyhow::Result;

#[derive(clap::Args, Debug)]
pub struct FloorsArgs {
    /// Byte counts for read floors (default: the GLM-5 expert weight sizes, 0.9 MB to 453 MB, then 1 and 4 GiB).
    #[arg(long, value_delimiter = ',')]
    pub bytes: Vec<u64>,
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

pub fn run(args: FloorsArgs) -> Result<()> {
    let FloorsArgs { bytes, device } = args;
    use fp4tune::bench::{floors::Floors, run::tensor_peak_tflops, TimingPolicy};
    use fp4tune::search::DeviceModel;
    let gpu = fp4tune::gpu::Gpu::open(device)?;
    let compiler = crate::default_compiler()?;
    let policy = TimingPolicy::default();
    let floors = Floors::new(&gpu, &compiler)?;
    let info = gpu.info();
    outln!(
        "{} (cc {}.{}, {} SMs, L2 {} MiB, {} MHz SM, {} MHz mem x {} bit)",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.sm_count,
        info.l2_bytes >> 20,
        info.sm_clock_mhz,
        info.mem_clock_mhz,
        info.mem_bus_bits
    )?;
    outln!("policy: {}", policy.describe())?;
    for blocks in [1, info.sm_count] {
        let s = floors.launch_floor(&policy, blocks)?;
        outln!("launch floor ({blocks} CTAs): {:.3} us [{:.3}, {:.3}]", s.median, s.lo, s.hi)?;
    }
    let bf16 = tensor_peak_tflops(&gpu)?;
    outln!("bf16 tensor peak (cuBLAS 8192^3, best of 6): {bf16:.0} TFLOP/s")?;
    let (name, cc) = (&info.name, info.compute_capability);
    if DeviceModel::fp4_data_path(cc) {
        outln!(
            "{}: {:.0} TFLOP/s",
            DeviceModel::data_path_peak_label(name, cc),
            DeviceModel::data_path_peak_tflops(name, cc, bf16)
        )?;
    }
    let sizes = if bytes.is_empty() {
        vec![
            885_000,
            1_770_000,
            3_540_000,
            7_080_000,
            14_160_000,
            28_300_000,
            113_000_000,
            453_000_000,
            1 << 30,
            4 << 30,
        ]
    } else {
        bytes
    };
    outln!(
        "{:>12} {:>7} {:>10} {:>10} {:>10} {:>8}",
        "bytes",
        "blocks",
        "median_us",
        "lo_us",
        "hi_us",
        "GB/s"
    )?;
    for b in sizes {
        let f = floors.read_floor(&policy, b)?;
        outln!(
            "{:>12} {:>7} {:>10.2} {:>10.2} {:>10.2} {:>8.0}",
            f.bytes,
            f.blocks,
            f.time.median,
            f.time.lo,
            f.time.hi,
            f.gbps()
        )?;
    }
    Ok(())
}
