//! `fp4tune selftest` from the command line without a GPU: both MMA probes compile (compile-only
//! PASS lines on standard output), then exit 2 with a one-line reason on standard error; an
//! unreadable table is exit 2 naming the file.

mod common;

use common::fp4tune;
use std::process::Command;

#[test]
fn selftest_without_a_gpu_compiles_the_probes_and_exits_2() {
    if fp4tune::gpu::loader::driver_present() {
        eprintln!("a CUDA driver is present: the no-GPU exit is not what this machine gives");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(fp4tune())
        .arg("selftest")
        .env("FP4TUNE_CACHE", dir.path())
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stdout}{err}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].starts_with("PASS sm120 MMA probe"), "{stdout}");
    assert!(lines[0].contains("compiled for sm_120a: 8 x OMMA.SF"), "{stdout}");
    assert!(lines[0].ends_with("(compile only: the probe did not run)"), "{stdout}");
    assert!(lines[1].starts_with("PASS sm90 MMA probe"), "{stdout}");
    let last = err.lines().last().unwrap_or("");
    assert!(last.starts_with("fp4tune selftest: exit 2: cannot run: no GPU: "), "{err}");
}

#[test]
fn selftest_with_an_unreadable_table_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(fp4tune())
        .args(["selftest", "--table"])
        .arg(dir.path())
        .output()
        .expect("the binary runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    let line = err.lines().last().unwrap_or("");
    assert!(line.starts_with("fp4tune selftest: exit 2: cannot run: "), "{err}");
    assert!(line.contains(&dir.path().display().to_string()), "{err}");
}
