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

/// Compile `code` (named `name` in diagnostics) to a CUBIN for the architecture in `options`.
pub fn compile_cubin(
    name: &str,
    code: &str,
    options: &[String],
) -> Result<NvrtcOutput, NvrtcError> {
    load_nvrtc()?;
    let src = CString::new(code).map_err(|_| NvrtcError::NulInSource(name.to_string()))?;
    let cname = CString::new(name).map_err(|_| NvrtcError::NulInSource(name.to_string()))?;
    let api = |call: &'static str| {
        move |e: result::NvrtcError| NvrtcError::Api { name: name.to_string(), call, code: e.0 }
    };
    let prog = result::create_program(&src, Some(&cname)).map_err(api("nvrtcCreateProgram"))?;
    let guard = Program(prog);
    // SAFETY: `prog` was created above and is destroyed only by `guard`'s drop.
    let compiled = unsafe { result::compile_program(guard.0, options) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(guard.0) }.map_err(api("nvrtcGetProgramLog"))?;
    let log = c_chars_to_string(&log);
    if compiled.is_err() {
        return Err(NvrtcError::Compile { name: name.to_string(), options: options.to_vec(), log });
    }
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
