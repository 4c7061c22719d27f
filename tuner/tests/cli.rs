//! The command line on bad input: every failure names the file (or what is missing) and exits
//! non-zero with one clear message, never a panic.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fp4tune() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fp4tune"))
}

/// Run and return (success, stderr).
fn run(exe: &Path, args: &[&str], cwd: &Path) -> (bool, String) {
    let out = Command::new(exe)
        .args(args)
        .current_dir(cwd)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn assert_clean_error(ok: bool, err: &str, must_contain: &[&str]) {
    assert!(!ok, "expected a failure, stderr: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for m in must_contain {
        assert!(err.contains(m), "`{m}` missing from: {err}");
    }
}

#[test]
fn malformed_shape_file_table_and_config_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.ron");
    std::fs::write(&bad, "(schema_version: 1, model: ").unwrap();
    let b = bad.to_str().unwrap();
    let (ok, err) = run(&fp4tune(), &["tune", "--shapes", b], dir.path());
    assert_clean_error(ok, &err, &["bad.ron"]);
    let (ok, err) = run(&fp4tune(), &["bench", "--shapes", b], dir.path());
    assert_clean_error(ok, &err, &["bad.ron"]);
    let (ok, err) = run(&fp4tune(), &["table", "--check", b], dir.path());
    assert_clean_error(ok, &err, &["bad.ron"]);
    let (ok, err) = run(
        &fp4tune(),
        &["shapes", "--from-config", "missing-config.json", "--tp", "8"],
        dir.path(),
    );
    assert_clean_error(ok, &err, &["missing-config.json"]);
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, r#"{"model_type": "not_a_moe"}"#).unwrap();
    let (ok, err) = run(
        &fp4tune(),
        &["shapes", "--from-config", cfg.to_str().unwrap(), "--tp", "8"],
        dir.path(),
    );
    assert_clean_error(ok, &err, &["config.json", "not_a_moe"]);
    let (ok, err) = run(&fp4tune(), &["merge", "nope.jsonl", "--out", "m.jsonl"], dir.path());
    assert_clean_error(ok, &err, &["nope.jsonl"]);
}

#[test]
fn a_missing_nvrtc_says_what_it_looked_for_and_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/libnvrtc.so.13");
    let out = Command::new(fp4tune())
        .args(["compile", "--arch", "sm_120a"])
        .current_dir(dir.path())
        .env("FP4TUNE_NVRTC", &missing)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_clean_error(
        out.status.success(),
        &err,
        &["NVRTC", "FP4TUNE_NVRTC", "no/libnvrtc.so.13", "fix:", "nvidia-cuda-nvrtc"],
    );
}

#[test]
fn gpu_commands_without_a_gpu_fail_cleanly() {
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("SKIPPED: this machine has an NVIDIA GPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for args in [&["floors"][..], &["bench", "--m", "1"][..], &["tune", "--max-m", "1"][..]] {
        let (ok, err) = run(&fp4tune(), args, dir.path());
        assert_clean_error(ok, &err, &["CUDA driver"]);
    }
}
