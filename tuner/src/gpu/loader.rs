//! Finding and loading the CUDA shared libraries (NVRTC, the driver) before cudarc touches them.
//!
//! cudarc loads libraries by name through the system loader and panics when none is found. We
//! look first in the places a CUDA user expects (`FP4TUNE_NVRTC`, `CUDA_HOME`, `CUDA_PATH`,
//! `/usr/local/cuda*`, the `nvidia-cuda-nvrtc` Python wheel in a project-local `.cuda/` folder or in
//! Python's `sys.path`), load the library by full path, and only then let cudarc resolve the same
//! soname, so it binds to the already-loaded copy. A missing library is an error that says how to
//! install one, never a panic.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// NVRTC could not be found or loaded.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "NVRTC (libnvrtc.so) not found: {detail}; searched: {searched}; fix: install the CUDA toolkit and set CUDA_HOME, \
     or `python3 -m pip install --target .cuda nvidia-cuda-nvrtc` in the repository (found automatically), \
     or point FP4TUNE_NVRTC at libnvrtc.so.*"
)]
pub struct NvrtcNotFound {
    pub detail: String,
    pub searched: String,
}

/// Where NVRTC was loaded from.
#[derive(Debug, Clone)]
pub struct LoadedLib {
    /// Full path when we found it ourselves; `None` when the system loader found it by name.
    pub path: Option<PathBuf>,
}

const NVRTC_NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR"] {
        if let Some(v) = std::env::var_os(var) {
            let base = PathBuf::from(v);
            dirs.push(base.join("lib64"));
            dirs.push(base.join("lib"));
            dirs.push(base.join("targets/x86_64-linux/lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    if let Ok(rd) = std::fs::read_dir("/usr/local") {
        let mut v: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("cuda-")))
            .map(|p| p.join("lib64"))
            .collect();
        v.sort();
        v.reverse(); // newest first
        dirs.extend(v);
    }
    for r in cuda_wheel_roots() {
        dirs.extend(wheel_lib_dirs(&r));
    }
    dirs
}

/// Folders that may hold NVIDIA's CUDA wheels installed with `pip --target` (what
/// `scripts/cuda-tools.sh` and .ci/run create), in search order: `FP4TUNE_CUDA_WHEELS`, `.cuda/`
/// from the working directory upwards, next to the executable and above it, and in the source
/// tree this binary was built from (a development build whose target folder lives elsewhere,
/// e.g. CARGO_TARGET_DIR; absent on other machines, then harmless).
pub fn cuda_wheel_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    if let Some(v) = std::env::var_os("FP4TUNE_CUDA_WHEELS") {
        roots.push(PathBuf::from(v));
    }
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(|a| a.join(".cuda")));
    }
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(|a| a.join(".cuda")));
    }
    roots.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cuda"));
    roots
}

/// `nvidia/cu13/lib` (CUDA 13 wheels) and `nvidia/cuda_nvrtc/lib` (CUDA 12 wheels) under `root`.
fn wheel_lib_dirs(root: &Path) -> Vec<PathBuf> {
    vec![root.join("nvidia/cu13/lib"), root.join("nvidia/cuda_nvrtc/lib")]
}

fn python_sys_path() -> Vec<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys\nfor p in sys.path: print(p)"])
        .stderr(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// Load NVRTC once per process; later calls return the same result.
pub fn load_nvrtc() -> Result<&'static LoadedLib, NvrtcNotFound> {
    static LOADED: OnceLock<Result<LoadedLib, NvrtcNotFound>> = OnceLock::new();
    LOADED.get_or_init(find_and_load_nvrtc).as_ref().map_err(Clone::clone)
}

fn find_and_load_nvrtc() -> Result<LoadedLib, NvrtcNotFound> {
    let mut searched = Vec::new();
    let mut explicit: Vec<PathBuf> = Vec::new();
    // an empty variable counts as unset (as FP4TUNE_CACHE does)
    if let Some(p) = std::env::var_os("FP4TUNE_NVRTC").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        // An explicit choice that does not exist is an error, not a reason to pick another NVRTC.
        if !p.is_file() {
            return Err(NvrtcNotFound {
                detail: format!("FP4TUNE_NVRTC={} is not a file", p.display()),
                searched: p.display().to_string(),
            });
        }
        explicit.push(p);
    }
    let with_names = |d: PathBuf| NVRTC_NAMES.iter().map(move |n| d.join(n)).collect::<Vec<_>>();
    let from_dirs = candidate_dirs().into_iter().flat_map(with_names);
    // Python's sys.path is asked only when nothing closer was found (it starts an interpreter).
    let from_python = std::iter::once(())
        .flat_map(|()| python_sys_path())
        .flat_map(|r| wheel_lib_dirs(&r))
        .flat_map(with_names);
    let chosen = explicit.first().cloned();
    for path in explicit.into_iter().chain(from_dirs).chain(from_python) {
        // Report each folder once (the file names tried in it are NVRTC_NAMES).
        let shown = path.parent().map_or(path.display().to_string(), |d| d.display().to_string());
        if !searched.contains(&shown) {
            searched.push(shown);
        }
        if !path.is_file() {
            continue;
        }
        match preload(&path) {
            Ok(None) => return Ok(LoadedLib { path: Some(path) }),
            // FP4TUNE_NVRTC names the one to compile with: another bound instead is an error
            Ok(Some(other)) if chosen.as_ref() == Some(&path) => {
                return Err(NvrtcNotFound {
                    detail: format!("FP4TUNE_NVRTC={}: {other}", path.display()),
                    searched: searched.join(", "),
                })
            }
            // one found on the way: cudarc compiles with the one the system loader binds
            Ok(Some(_)) => return Ok(LoadedLib { path: None }),
            Err(e) => {
                return Err(NvrtcNotFound {
                    detail: format!("{} exists but could not be loaded: {e}", path.display()),
                    searched: searched.join(", "),
                })
            }
        }
    }
    // Last resort: the system loader (LD_LIBRARY_PATH, ldconfig), exactly as cudarc would.
    // SAFETY: probing only dlopens candidate names; no symbol of the library is called.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Ok(LoadedLib { path: None });
    }
    searched.push(format!(
        "the system loader (LD_LIBRARY_PATH, ldconfig); names tried: {}",
        NVRTC_NAMES.join(", ")
    ));
    Err(NvrtcNotFound {
        detail: "no libnvrtc in any searched location".into(),
        searched: searched.join(", "),
    })
}

/// dlopen `libnvrtc` (and its builtins library next to it, which it cannot find on its own when
/// it comes from a wheel) by full path and keep both loaded for the life of the process. Returns
/// `Some(why)` when cudarc's lookup by name binds another NVRTC version than this one; an error
/// when the library cannot be loaded or is not NVRTC.
fn preload(path: &Path) -> Result<Option<String>, String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    let dir = path.parent().unwrap_or(Path::new("."));
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut builtins: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n.starts_with("libnvrtc-builtins.so.") && !n.contains(".alt.")
                })
            })
            .collect();
        builtins.sort();
        for b in builtins {
            // SAFETY: loading a vendor library with no initialisers of concern; we never unload it.
            match unsafe { Library::open(Some(&b), RTLD_NOW | RTLD_GLOBAL) } {
                Ok(lib) => std::mem::forget(lib),
                Err(e) => return Err(format!("{}: {e}", b.display())),
            }
        }
    }
    // SAFETY: as above; the handle is leaked so cudarc's later dlopen by soname finds this copy.
    let lib =
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| e.to_string())?;
    // The library must be NVRTC: its version, asked through this handle.
    type VersionFn = unsafe extern "C" fn(*mut i32, *mut i32) -> i32;
    // SAFETY: `nvrtcVersion` has this signature in every NVRTC; the symbol is only called when
    // the library exports it.
    let ours = match unsafe { lib.get::<VersionFn>(b"nvrtcVersion\0") } {
        Ok(f) => {
            let (mut major, mut minor) = (0, 0);
            // SAFETY: both pointers are valid for writes.
            let r = unsafe { f(&mut major, &mut minor) };
            (r == 0).then_some((major, minor))
        }
        Err(_) => return Err("not NVRTC (it has no nvrtcVersion)".into()),
    };
    std::mem::forget(lib);
    // SAFETY: only checks that cudarc's own name-based lookup now resolves.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("loaded by path, but not visible under the names cudarc looks up".into());
    }
    // cudarc resolves NVRTC by name: another NVRTC found first by the system loader would
    // compile instead of this one.
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is present (checked above); both pointers are valid for writes.
    let bound = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    match ours {
        Some(v) if bound.result().is_ok() && v != (major, minor) => Ok(Some(format!(
            "this is NVRTC {}.{}, but the NVRTC the system loader finds first by name is \
             {major}.{minor} and would compile instead (put this library's folder first in \
             LD_LIBRARY_PATH)",
            v.0, v.1
        ))),
        _ => Ok(None),
    }
}

/// Whether a CUDA driver (libcuda.so) can be loaded; checked before any driver call, because
/// cudarc panics when it is missing.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: probing dlopens candidate names only.
    *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() })
}
