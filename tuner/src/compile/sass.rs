//! Reading SASS without a GPU: `cuobjdump --dump-sass` from the toolkit or the cuobjdump wheel.

use std::path::PathBuf;
use std::process::Command;

#[derive(Debug, Clone, thiserror::Error)]
pub enum SassError {
    #[error(
        "cuobjdump not found (searched {searched}); install the CUDA toolkit or \
         `python3 -m pip install --target .cuda nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`"
    )]
    NotFound { searched: String },
    #[error("cuobjdump failed on {kernel}: {message}")]
    Failed { kernel: String, message: String },
}

/// Folders that may hold cuobjdump and nvdisasm, in search order.
fn bin_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(PathBuf::from(v).join("bin"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/bin"));
    // the wheels where NVRTC's are looked for
    dirs.extend(crate::gpu::loader::cuda_wheel_roots().iter().map(|r| r.join("nvidia/cu13/bin")));
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs
}

/// The cuobjdump binary and the folder to put on PATH so it finds nvdisasm.
fn find_cuobjdump() -> Result<(PathBuf, PathBuf), SassError> {
    let dirs = bin_dirs();
    for d in &dirs {
        let exe = d.join("cuobjdump");
        if exe.is_file() && d.join("nvdisasm").is_file() {
            return Ok((exe, d.clone()));
        }
    }
    Err(SassError::NotFound {
        searched: dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
    })
}

/// Disassemble `cubin` (named `kernel` in messages) to SASS text.
pub fn dump_sass(kernel: &str, cubin: &[u8]) -> Result<String, SassError> {
    let (exe, dir) = find_cuobjdump()?;
    let fail = |message: String| SassError::Failed { kernel: kernel.to_string(), message };
    let tmp = tempfile_path(kernel);
    std::fs::write(&tmp, cubin).map_err(|e| fail(e.to_string()))?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![dir];
    paths.extend(std::env::split_paths(&path));
    let out = Command::new(&exe)
        .arg("--dump-sass")
        .arg(&tmp)
        .env("PATH", std::env::join_paths(paths).unwrap_or_default())
        .output();
    let _ = std::fs::remove_file(&tmp);
    let out = out.map_err(|e| fail(format!("running {}: {e}", exe.display())))?;
    if !out.status.success() {
        return Err(fail(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn tempfile_path(kernel: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "fp4tune-{}-{}-{}.cubin",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        kernel
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(64)
            .collect::<String>()
    ))
}

/// Number of SASS instructions whose opcode starts with `opcode` (e.g. "OMMA.SF", "HMMA").
pub fn count_opcode(sass: &str, opcode: &str) -> usize {
    sass.lines().filter_map(instruction).filter(|ins| ins.starts_with(opcode)).count()
}

/// Whether the SASS touches local memory (spills or stack arrays): STL / LDL instructions.
pub fn uses_local_memory(sass: &str) -> bool {
    sass.lines().filter_map(instruction).any(|ins| ins.starts_with("STL") || ins.starts_with("LDL"))
}

/// The instruction text of one SASS line (`/*0040*/  @P0 HMMA.16816... ;`), predicate removed.
fn instruction(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let rest = t.strip_prefix("/*")?;
    let (_, after) = rest.split_once("*/")?;
    let ins = after.trim_start();
    if ins.is_empty() || ins.starts_with("/*") {
        return None;
    }
    // Strip a predicate guard such as `@P0` or `@!PT`.
    let ins = match ins.strip_prefix('@') {
        Some(p) => p.split_once(' ').map(|(_, r)| r.trim_start()).unwrap_or(""),
        None => ins,
    };
    Some(ins)
}

/// Test support: compile `kernels` (label, source) with the default cubin cache and name each
/// whose ptxas report shows spills or whose SASS touches local memory (`<label> (<kernel>):
/// <ptxas stats>`). Sources that are one kernel are compiled and disassembled once.
#[cfg(test)]
pub(crate) fn kernels_with_local_memory(
    kernels: &[(String, crate::template::KernelSource)],
) -> Vec<String> {
    let compiler = crate::compile::Compiler::with_default_cache().unwrap_or_else(|e| panic!("{e}"));
    let sources: Vec<_> = kernels.iter().map(|(_, s)| s.clone()).collect();
    let mut local_of = std::collections::HashMap::new();
    let mut problems = Vec::new();
    for ((label, _), r) in kernels.iter().zip(compiler.compile_many(&sources)) {
        let k = r.unwrap_or_else(|e| panic!("{label}: {e}"));
        let local = *local_of.entry(k.key.clone()).or_insert_with(|| {
            let sass = dump_sass(&k.kernel_name, &k.cubin).unwrap_or_else(|e| panic!("{e}"));
            k.spills() || uses_local_memory(&sass)
        });
        if local {
            problems.push(format!("{label} ({}): {:?}", k.kernel_name, k.stats));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const SASS: &str = "        /*0040*/                   IMAD.WIDE.U32 R2, R5, 0x4, R2 ;  /* 0x0000000405027825 */
                                                                    /* 0x001fca00078e0002 */
        /*0050*/              @P0  OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X R4, R8, R12, R4, R20, R21, URZ ;
        /*0060*/                   STL [R1], R5 ;
        /*0070*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
";

    #[test]
    fn counts_opcodes_and_local_memory() {
        assert_eq!(count_opcode(SASS, "OMMA.SF"), 1);
        assert_eq!(count_opcode(SASS, "HMMA.16816.F32.BF16"), 1);
        assert_eq!(count_opcode(SASS, "LDG"), 0);
        assert!(uses_local_memory(SASS));
        assert!(!uses_local_memory("        /*0060*/   LDS R5, [R1] ;\n"));
    }
}
