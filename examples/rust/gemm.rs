//! Rust example: open a dispatch table and run one W4A16 GEMM (a GLM-5 TP8 gate_up expert,
//! Y[M, 512] = X[M, 6144] * W[512, 6144]^T) through the runtime dispatcher, checked against the
//! CPU reference. The launch passes a workspace of its stream's own (`gemm_in`): a serving
//! engine creates one per stream, so launches on several streams never share scratch memory.
//!
//!     cargo run --release --example gemm -- [results/nvidia-h200.ron] [M]
//!
//! Without a table the dispatcher uses the family default for every shape.

use fp4tune::format::{quantize_weight, reference_gemm, GemmA};
use fp4tune::gpu::Gpu;
use fp4tune::problem::AType;
use fp4tune::runtime::{Dispatcher, GemmArgs, Options};
use half::bf16;
use rand::{Rng, SeedableRng};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let table = args.first().filter(|a| a.ends_with(".ron")).cloned();
    let m: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(4);
    let (n, k) = (512usize, 6144usize);

    let options = Options::default();
    let dispatcher = match &table {
        Some(path) => Dispatcher::open(path, &options)?,
        None => Dispatcher::open_untuned(&options)?,
    };
    println!("{}", dispatcher.report());

    // Random weights quantized the ModelOpt way, random bf16 activations, and the CPU reference.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let wf: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let w = quantize_weight(&wf, n, k)?;
    let a: Vec<bf16> = (0..m * k).map(|_| bf16::from_f32(rng.random_range(-2.0f32..2.0))).collect();
    let reference = reference_gemm(GemmA::Bf16 { data: &a, rows: m, cols: k }, &w)?;

    // Device buffers (same primary context as the dispatcher).
    let gpu = Gpu::open(options.device)?;
    let d_w = gpu.upload(&w.codes)?;
    let d_wsf = gpu.upload(&w.scales_swizzled())?;
    let d_a = gpu.upload(&a.iter().map(|x| x.to_bits()).collect::<Vec<u16>>())?;
    let d_y = gpu.alloc_zeros::<u16>(m * n)?;
    gpu.synchronize()?;

    let gemm = GemmArgs {
        a: d_a.ptr(),
        a_sf: 0,
        w: d_w.ptr(),
        w_sf: d_wsf.ptr(),
        y: d_y.ptr(),
        m: m as u32,
        n: n as u32,
        k: k as u32,
        a_type: AType::Bf16,
        alpha: w.global_scale,
    };
    // Scratch for this stream's launches (split-K, dequantize-then-cuBLAS), sized for M <= 1024.
    let workspace = dispatcher.gemm_workspace(1024.max(m as u32))?;
    println!("workspace: {} bytes for M <= {}", workspace.bytes(), workspace.max_m());
    // SAFETY: every buffer above is a live device allocation of the sizes the layout needs for
    // (m, n, k) and outlives the synchronization below; stream 0 is the legacy default stream,
    // the only one that uses `workspace`.
    let route = unsafe { dispatcher.gemm_in(&gemm, &workspace, 0) }?;
    // SAFETY: as above.
    unsafe { dispatcher.synchronize(0) }?;
    println!("M={m} N={n} K={k} w4a16: {} ({:?})", route.config, route.kind);

    let y = gpu.download(&d_y)?;
    let mut max_err = 0f32;
    let mut max_ref = 0f32;
    for (got, want) in y.iter().zip(&reference.y_f32) {
        max_err = max_err.max((bf16::from_bits(*got).to_f32() - want).abs());
        max_ref = max_ref.max(want.abs());
    }
    // bf16 output: half an ulp of the largest value plus f32 summation-order noise.
    let tolerance = max_ref * 2f32.powi(-8) + 1e-3 * max_ref;
    let pass = max_err <= tolerance;
    println!(
        "max |y - reference| = {max_err:.3e} (max |reference| {max_ref:.3e}, tolerance {tolerance:.3e}): {}",
        if pass { "PASS" } else { "FAIL" }
    );
    for f in dispatcher.fallbacks() {
        println!("fallback: {f}");
    }
    if !pass {
        anyhow::bail!("result outside the tolerance");
    }
    Ok(())
}
