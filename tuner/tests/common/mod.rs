//! What the command-line tests share: the binary, running it, and the shape of a clean error.

#![allow(dead_code)] // each test crate uses its own part

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fp4tune binary of this build.
pub fn fp4tune() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fp4tune"))
}

/// Run and return (success, stderr).
pub fn run(exe: &Path, args: &[&str], cwd: &Path) -> (bool, String) {
    let out = Command::new(exe)
        .args(args)
        .current_dir(cwd)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A failure whose standard error is one `error: ` message holding every one of `must_contain`,
/// never a panic.
pub fn assert_clean_error(ok: bool, err: &str, must_contain: &[&str]) {
    assert!(!ok, "expected a failure, stderr: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for m in must_contain {
        assert!(err.contains(m), "`{m}` missing from: {err}");
    }
}

/// One log record (JSON, no newline) for bucket `m` of the committed table's first key, on the
/// table's device or on `device`.
pub fn record_line(m: u32, device: Option<&str>) -> String {
    let table = fp4tune::table::Table::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/nvidia-h200.ron"),
    )
    .unwrap();
    let e = &table.entries[0];
    let hash = table.template_hashes.values().next().unwrap().clone();
    let time = fp4tune::bench::Summary { n: 1, median: 3.0, lo: 2.9, hi: 3.1, min: 2.9, max: 3.1 };
    let r = fp4tune::tune::log::Record {
        schema_version: fp4tune::tune::log::LOG_SCHEMA_VERSION,
        key: fp4tune::table::TableKey { m, ..e.key.clone() },
        method: fp4tune::table::Method::Fused,
        config: e.config,
        outcome: fp4tune::tune::log::Outcome::Timed { time, samples: vec![3.0] },
        device: device.map_or(table.device.name.clone(), str::to_string),
        compute_capability: table.device.compute_capability,
        template_hash: hash,
        at: 0,
        context: None,
    };
    serde_json::to_string(&r).unwrap()
}
