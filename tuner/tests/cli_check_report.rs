//! `fp4tune check` and `fp4tune report` from the command line, without a GPU: check's exit
//! status 2 with a one-line reason (and its reports), report's SVG files for the committed results.

mod common;

use common::fp4tune;
use std::path::{Path, PathBuf};
use std::process::Command;

fn results() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../results")
}

#[test]
fn check_without_a_gpu_exits_2_with_a_one_line_reason_and_writes_its_reports() {
    if fp4tune::gpu::loader::driver_present() {
        eprintln!("a CUDA driver is present: the no-GPU exit is not what this machine gives");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(fp4tune())
        .args(["check", "--table"])
        .arg(results().join("nvidia-h200.ron"))
        .arg("--out")
        .arg(dir.path())
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the binary runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(last.starts_with("fp4tune check: exit 2: cannot check: no GPU: "), "{err}");
    let md = std::fs::read_to_string(dir.path().join("check.md")).unwrap();
    assert!(md.starts_with("# fp4tune check: CANNOT CHECK (exit 2)"), "{md}");
    let json = std::fs::read_to_string(dir.path().join("check.json")).unwrap();
    assert!(json.contains("\"NoGpu\""), "{json}");
}

#[test]
fn check_on_an_unreadable_table_or_a_bad_baseline_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(fp4tune())
        .args(["check", "--table", "missing.ron", "--out"])
        .arg(dir.path())
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("missing.ron"), "{err}");
    let out = Command::new(fp4tune())
        .args(["check", "--table"])
        .arg(results().join("nvidia-h200.ron"))
        .args(["--baseline", "notes.txt", "--out"])
        .arg(dir.path())
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let md = std::fs::read_to_string(dir.path().join("check.md")).unwrap();
    assert!(md.contains("unusable baseline: notes.txt: unknown baseline kind"), "{md}");
}

#[test]
fn report_renders_the_committed_results() {
    let dir = tempfile::tempdir().unwrap();
    let r = results();
    let out = Command::new(fp4tune())
        .arg("report")
        .arg("--out")
        .arg(dir.path())
        .arg("--table")
        .arg(r.join("nvidia-h200.ron"))
        .arg("--log")
        .arg(r.join("h200/nvidia-h200-w4a16.jsonl.gz"))
        .arg("--bench")
        .arg(r.join("h200/bench-w4a16.csv"))
        .arg(r.join("h200/bench-w4a16-prefill.csv"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let svg = std::fs::read_to_string(dir.path().join("time-vs-m-n512-k6144-w4a16.svg")).unwrap();
    for name in ["fp4tune best", "table nvidia-h200.ron", "cublas_bf16", "read floor", "roofline"] {
        assert!(svg.contains(name), "{name} missing");
    }
    let svg = std::fs::read_to_string(dir.path().join("search-nvidia-h200-w4a16.svg")).unwrap();
    assert!(svg.contains("model") && svg.contains("log order"));
    let out = Command::new(fp4tune()).args(["report", "--out"]).arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to plot"));
    // a benchmark CSV of a header alone, beside a table: refused, the figures kept
    let header = dir.path().join("header.csv");
    let bench = std::fs::read_to_string(r.join("h200/bench-w4a16.csv")).unwrap();
    std::fs::write(&header, format!("{}\n", bench.lines().next().unwrap())).unwrap();
    let before = std::fs::read(dir.path().join("time-vs-m-n512-k6144-w4a16.svg")).unwrap();
    let out = Command::new(fp4tune())
        .arg("report")
        .arg("--out")
        .arg(dir.path())
        .arg("--table")
        .arg(r.join("nvidia-h200.ron"))
        .arg("--bench")
        .arg(&header)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("header.csv: holds no rows"), "{err}");
    assert_eq!(std::fs::read(dir.path().join("time-vs-m-n512-k6144-w4a16.svg")).unwrap(), before);
}
