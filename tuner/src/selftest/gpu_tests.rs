//! GPU tests of the self-test (need a CUDA GPU of a supported family and NVRTC; `--features gpu`):
//! the MMA probe of the GPU's family is bit-exact, a model that disagrees with the hardware fails
//! it, and the whole self-test passes on the representative kernels and, on a family sm90 GPU,
//! on the committed H200 table (GEMM, dequantize-then-cuBLAS and grouped entries).

use super::*;

fn open() -> (Gpu, Family, Compiler) {
    let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("the gpu feature is on but: {e}"));
    let family = crate::runtime::family_for(gpu.info()).unwrap_or_else(|e| panic!("{e}"));
    let compiler = Compiler::with_default_cache().unwrap_or_else(|e| panic!("{e}"));
    (gpu, family, compiler)
}

#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn mma_probe_is_bit_exact_and_a_wrong_model_fails_it() {
    let (gpu, family, compiler) = open();
    let probe = probe_of(family);
    let r = probe::run_on(&gpu, &compiler, &probe).unwrap();
    assert_eq!(r.status, Status::Pass, "{}", r.line());
    // The same run against a model with one accumulator changed (run 17, lane 9, d3) fails
    // and names it.
    let mut wrong = probe.clone();
    wrong.expected[17 * 128 + 9 * 4 + 3] *= 2.0;
    let r = probe::run_on(&gpu, &compiler, &wrong).unwrap();
    assert_eq!(r.status, Status::Fail, "{}", r.line());
    assert!(r.detail.starts_with("1 of ") && r.detail.contains("lane 9 d3"), "{}", r.line());
}

#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
)]
fn selftest_passes_on_the_representative_kernels_and_the_committed_table() {
    let (gpu, family, compiler) = open();
    let mut lines = Vec::new();
    let r = run(&compiler, &Options { device: 0, table: None }, &mut |c| lines.push(c.line()));
    let e = exit_status(&r);
    assert_eq!(e.code, 0, "{e:?}\n{}", lines.join("\n"));
    // the probe, then a line per GEMM check and per grouped entry
    let expected: usize = kernels::plan(family, gpu.info().sm_count, None)
        .checks
        .iter()
        .map(|c| match c {
            kernels::KernelCheck::Grouped { entries, .. } => entries.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(r.checks.len(), 1 + expected);
    if family != Family::Sm90 {
        eprintln!("the committed table is of family sm90; this GPU runs {family}");
        return;
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/nvidia-h200.ron");
    let table = Table::load(&path).unwrap();
    let mut lines = Vec::new();
    let r = run(
        &compiler,
        &Options { device: 0, table: Some((&table, "nvidia-h200.ron")) },
        &mut |c| lines.push(c.line()),
    );
    let e = exit_status(&r);
    assert_eq!(e.code, 0, "{e:?}\n{}", lines.join("\n"));
    let composites =
        table.entries.iter().filter(|x| x.method == crate::table::Method::DequantCublasBf16);
    assert_eq!(r.checks.len(), 1 + table.entries.len() + composites.count() + table.moe.len());
    assert!(r.checks.iter().all(|c| c.status == Status::Pass), "{}", lines.join("\n"));
}
