//! NVRTC through cudarc: source -> CUBIN (and PTX on request), keeping the log on success and failure.

use super::loader::{load_nvrtc, NvrtcNotFound};
use cudarc::nvrtc::{result, sys};
use std::ffi::{c_char, c_int, CString};

/// A failed NVRTC call; a compile failure keeps the options and the full log.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NvrtcError {
    #[error(transparent)]
    NotFound(#[from] NvrtcNotFound),
    #[error("NVRTC failed to compile {name} with options {options:?}:\n{log}")]
    Compile { name: String, options: Vec<String>, log: String },
    #[error("NVRTC call {call} failed for {name}: {code:?}")]
    Api { name: String, call: &'static str, code: sys::nvrtcResult },
    #[error("source of {0} contains a NUL byte")]
    NulInSource(String),
}

/// What NVRTC produced for one program.
#[derive(Debug, Clone)]
pub struct NvrtcOutput {
    pub cubin: Vec<u8>,
    /// Compiler and ptxas messages (ptxas `-v` statistics among them).
    pub log: String,
}

/// NVRTC's (major, minor) version.
pub fn version() -> Result<(i32, i32), NvrtcError> {
    load_nvrtc()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); both pointers are valid for writes.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    r.result().map_err(|e| NvrtcError::Api {
        name: "-".into(),
        call: "nvrtcVersion",
        code: e.0,
    })?;
    Ok((major, minor))
}

/// One NVRTC build: its (major, minor) version and the release and compiler build it writes into
/// every PTX header (`Cuda compilation tools, release 13.0, V13.0.88`, `Compiler Build ID:
/// CL-36424714`). Builds of one minor version (13.0.48, 13.0.88) carry different ptxas, which
/// may compile one source to different code (registers, spills), so compiled kernels are keyed
/// and reported by the build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvrtcBuild {
    pub version: (i32, i32),
    /// `13.0.88`, when the PTX header says.
    pub release: Option<String>,
    /// `CL-36424714`, when the PTX header says.
    pub build_id: Option<String>,
}

impl std::fmt::Display for NvrtcBuild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.release {
            Some(r) => write!(f, "{r}")?,
            None => write!(f, "{}.{}", self.version.0, self.version.1)?,
        }
        match &self.build_id {
            Some(b) => write!(f, " ({b})"),
            None => Ok(()),
        }
    }
}

/// The loaded NVRTC's build: its version, and the release and build of the header of an empty
/// kernel's PTX (absent parts stay `None`: the key then holds the version alone). Asked once per
/// process.
pub fn build() -> Result<NvrtcBuild, NvrtcError> {
    static BUILD: std::sync::OnceLock<Result<NvrtcBuild, NvrtcError>> = std::sync::OnceLock::new();
    BUILD
        .get_or_init(|| {
            let version = version()?;
            let (release, build_id) = match empty_kernel_ptx() {
                Ok(ptx) => parse_ptx_header(&ptx),
                Err(_) => (None, None),
            };
            Ok(NvrtcBuild { version, release, build_id })
        })
        .clone()
}

fn empty_kernel_ptx() -> Result<String, NvrtcError> {
    let name = "fp4tune_nvrtc_build";
    let (program, _) = compile(
        name,
        "extern \"C\" __global__ void fp4tune_nvrtc_build() {}",
        &["--gpu-architecture=compute_80".to_string()],
    )?;
    // SAFETY: the program compiled; `program` destroys it only when dropped.
    let ptx = unsafe { result::get_ptx(program.0) }.map_err(api(name, "nvrtcGetPTX"))?;
    Ok(c_chars_to_string(&ptx))
}

/// (release, build id) from a PTX header's comment lines `// Cuda compilation tools, release
/// 13.0, V13.0.88` and `// Compiler Build ID: CL-36424714`.
pub fn parse_ptx_header(ptx: &str) -> (Option<String>, Option<String>) {
    let mut release = None;
    let mut build_id = None;
    for line in ptx.lines().take_while(|l| l.starts_with("//") || l.trim().is_empty()) {
        let line = line.trim_start_matches('/').trim();
        if let Some(rest) = line.strip_prefix("Compiler Build ID:") {
            build_id = Some(rest.trim().to_string()).filter(|s| !s.is_empty());
        } else if line.starts_with("Cuda compilation tools") {
            release = line
                .rsplit(", ")
                .next()
                .and_then(|v| v.strip_prefix('V'))
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty());
        }
    }
    (release, build_id)
}

/// An NVRTC API failure of `call` on the program `name`.
fn api<'a>(name: &'a str, call: &'static str) -> impl Fn(result::NvrtcError) -> NvrtcError + 'a {
    move |e| NvrtcError::Api { name: name.to_string(), call, code: e.0 }
}

/// Create and compile one program (`name` in diagnostics): the program, destroyed when dropped,
/// and its log; a failed compile is `NvrtcError::Compile` with the options and the full log.
fn compile(name: &str, code: &str, options: &[String]) -> Result<(Program, String), NvrtcError> {
    load_nvrtc()?;
    let src = CString::new(code).map_err(|_| NvrtcError::NulInSource(name.to_string()))?;
    let cname = CString::new(name).map_err(|_| NvrtcError::NulInSource(name.to_string()))?;
    let prog =
        result::create_program(&src, Some(&cname)).map_err(api(name, "nvrtcCreateProgram"))?;
    let guard = Program(prog);
    // SAFETY: `prog` was created above and is destroyed only by `guard`'s drop.
    let compiled = unsafe { result::compile_program(guard.0, options) };
    // SAFETY: as above.
    let log =
        unsafe { result::get_program_log(guard.0) }.map_err(api(name, "nvrtcGetProgramLog"))?;
    let log = c_chars_to_string(&log);
    if compiled.is_err() {
        return Err(NvrtcError::Compile { name: name.to_string(), options: options.to_vec(), log });
    }
    Ok((guard, log))
}

/// Compile `code` (named `name` in diagnostics) to a CUBIN for the architecture in `options`.
pub fn compile_cubin(
    name: &str,
    code: &str,
    options: &[String],
) -> Result<NvrtcOutput, NvrtcError> {
    let (guard, log) = compile(name, code, options)?;
    let api = |call| api(name, call);
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is valid for writes.
    unsafe { sys::nvrtcGetCUBINSize(guard.0, &mut size) }
        .result()
        .map_err(api("nvrtcGetCUBINSize"))?;
    if size == 0 {
        return Err(NvrtcError::Compile {
            name: name.to_string(),
            options: options.to_vec(),
            log: format!("{log}\n(no CUBIN produced: is --gpu-architecture a real sm_XX target?)"),
        });
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: the buffer holds exactly the size NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(guard.0, cubin.as_mut_ptr() as *mut c_char) }
        .result()
        .map_err(api("nvrtcGetCUBIN"))?;
    Ok(NvrtcOutput { cubin, log })
}

struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by create_program and is destroyed exactly once here.
        // A failure to destroy leaks a little host memory; drops never panic.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ptx_header_names_release_and_build() {
        let ptx = "//\n// Generated by NVIDIA NVVM Compiler\n//\n// Compiler Build ID: CL-36424714\n\
                   // Cuda compilation tools, release 13.0, V13.0.88\n// Based on NVVM 7.0.1\n//\n\n\
                   .version 9.0\n.target sm_80\n// Cuda compilation tools, release 1.0, V1.0.1\n";
        assert_eq!(
            parse_ptx_header(ptx),
            (Some("13.0.88".to_string()), Some("CL-36424714".to_string()))
        );
        assert_eq!(parse_ptx_header(".version 9.0\n"), (None, None));
        let b = NvrtcBuild {
            version: (13, 0),
            release: Some("13.0.88".into()),
            build_id: Some("CL-36424714".into()),
        };
        assert_eq!(b.to_string(), "13.0.88 (CL-36424714)");
        let bare = NvrtcBuild { version: (12, 4), release: None, build_id: None };
        assert_eq!(bare.to_string(), "12.4");
    }

    /// The NVRTC this machine loads (scripts/cuda-tools.sh installs one) reports its release,
    /// and the release begins with its version.
    #[test]
    fn the_loaded_nvrtc_reports_its_build() {
        let Ok(b) = build() else {
            eprintln!("SKIPPED: no NVRTC on this machine (scripts/cuda-tools.sh installs one)");
            return;
        };
        let release = b.release.as_deref().expect("a release in the PTX header");
        assert!(release.starts_with(&format!("{}.{}.", b.version.0, b.version.1)), "{b}");
        assert!(b.build_id.is_some(), "{b}");
    }
}
