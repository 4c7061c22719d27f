//! `fp4tune check --inject-delay`: a deliberately slowed build of one entry's kernel fails the
//! check and is the one entry named (the evidence that the gate catches a slow kernel), on the
//! GPU the committed table was measured on (`gpu` feature). Without a GPU: a selector that names
//! no fused entry is exit 2 with the reason, before any GPU work.

mod common;

use common::fp4tune;
use std::path::{Path, PathBuf};
use std::process::Command;

fn table() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/nvidia-h200.ron")
}

fn check(delay: &str, out: &Path) -> (Option<i32>, String) {
    let o = Command::new(fp4tune())
        .args(["check", "--quick", "--table"])
        .arg(table())
        .args(["--inject-delay", delay, "--out"])
        .arg(out)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the binary runs");
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn a_selector_without_a_fused_entry_is_exit_2_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    for (delay, why) in [
        ("512x6144:1024=20", "takes the dequant_cublas_bf16 path"),
        ("512x6144:3=20", "no entry of the table has this key"),
        ("99=20", "entry 99 of a table of 22 entries"),
    ] {
        let (code, err) = check(delay, dir.path());
        assert_eq!(code, Some(2), "{delay}: {err}");
        let last = err.lines().last().unwrap_or("");
        assert!(last.starts_with("fp4tune check: exit 2: cannot check: --inject-delay: "), "{err}");
        assert!(last.contains(why), "{delay}: {err}");
    }
    let o = Command::new(fp4tune())
        .args(["check", "--table"])
        .arg(table())
        .args(["--inject-delay", "16=0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "a delay of 0 is refused by the argument parser");
    assert!(String::from_utf8_lossy(&o.stderr).contains("the delay is 1..=1000000 microseconds"));
}

/// The evidence run: the A/A check of the committed table with the M = 16 gate_up entry's
/// kernel slowed by 20 us per thread exits 1, and that entry is the only one named.
#[test]
#[cfg_attr(
    not(feature = "gpu"),
    ignore = "GPU test: run with --features gpu on the GPU of results/nvidia-h200.ron (an H200)"
)]
fn a_slowed_kernel_fails_the_check_and_is_the_one_named() {
    let gpu =
        fp4tune::gpu::Gpu::open(0).unwrap_or_else(|e| panic!("the gpu feature is on but: {e}"));
    if gpu.info().name != "NVIDIA H200" {
        eprintln!(
            "SKIPPED: results/nvidia-h200.ron was measured on an NVIDIA H200, this GPU is {}",
            gpu.info().name
        );
        return;
    }
    drop(gpu);
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = check("512x6144:16=20", dir.path());
    let last = err.lines().last().unwrap_or("");
    assert_eq!(code, Some(1), "{err}");
    assert!(last.starts_with("fp4tune check: exit 1: 1 of "), "{err}");
    assert!(last.contains("regressed or failed: gemm sm90 w4a16 N=512 K=6144 M=16 "), "{err}");
    let json = std::fs::read_to_string(dir.path().join("check.json")).unwrap();
    assert!(json.contains("_delay20us"), "the report says which kernel was measured");
    let md = std::fs::read_to_string(dir.path().join("check.md")).unwrap();
    let regressions: Vec<&str> = md.lines().filter(|l| l.contains("**REGRESSION**")).collect();
    assert_eq!(regressions.len(), 1, "{md}");
    assert!(regressions[0].starts_with("| gemm sm90 w4a16 N=512 K=6144 M=16 |"), "{md}");
}
