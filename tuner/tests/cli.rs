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

/// `compile --emit DIR` writes the rendered source of each chosen configuration, byte for byte
/// what the library renders, without NVRTC.
#[test]
fn compile_emit_writes_the_rendered_sources() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("emit");
    let (ok, err) = run(
        &fp4tune(),
        &["compile", "--arch", "sm_90a", "--configs", "seeds", "--emit", out.to_str().unwrap()],
        dir.path(),
    );
    assert!(ok, "{err}");
    let mut expected = 0;
    for a_type in [fp4tune::problem::AType::Bf16, fp4tune::problem::AType::Nvfp4] {
        let family = fp4tune::template::Family::Sm90;
        let mut configs = vec![fp4tune::template::default_config(family, a_type)];
        configs.extend(fp4tune::template::measured_seeds(family, a_type));
        for c in configs {
            let written = std::fs::read_to_string(out.join(format!("{}.cu", c.kernel_name())))
                .unwrap_or_else(|e| panic!("{}: {e}", c.kernel_name()));
            assert_eq!(written, c.render().unwrap().code);
            expected += 1;
        }
    }
    assert!(std::fs::read_dir(&out).unwrap().count() <= expected);
}
