//! Scripted stand-ins for `fp4tune worker` in tests (no GPU needed): the Python prelude every
//! script starts with (`send` one protocol message, `device_info(name)` the `Device` answer of an
//! H200 named `name`) and the install of a script as an executable worker.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const PRELUDE: &str = r#"#!/usr/bin/env python3
import json, os, sys, time
def send(x):
    sys.stdout.write(json.dumps(x) + "\n"); sys.stdout.flush()
def device_info(name):
    return {"Device": {"name": name, "compute_capability": [9, 0], "sm_count": 132,
            "l2_bytes": 62914560, "total_mem": 1, "max_smem_per_block_optin": 232448,
            "driver_version": [13, 0], "sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "mem_bus_bits": 6016}}
"#;

/// Write the prelude and `body` as the executable `dir/fake-worker` and return its path.
pub fn install(dir: &Path, body: &str) -> PathBuf {
    let exe = dir.join("fake-worker");
    std::fs::write(&exe, format!("{PRELUDE}{body}")).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}
