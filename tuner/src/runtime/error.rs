//! Errors of the runtime dispatcher.

use crate::compile::CompileError;
use crate::gpu::GpuError;
use crate::table::{LookupError, TableError};
use std::path::PathBuf;

/// A device pointer the kernels cannot take: null, or not `align`-byte aligned (`rule` says what
/// the launch needs, appended to the message). One check for every launch path's arguments.
pub(crate) fn check_pointer(
    name: &str,
    ptr: u64,
    align: u64,
    rule: &str,
) -> Result<(), RuntimeError> {
    if ptr == 0 {
        return Err(RuntimeError::InvalidArgument(format!("null device pointer `{name}`")));
    }
    if ptr % align != 0 {
        return Err(RuntimeError::InvalidArgument(format!(
            "device pointer `{name}` ({ptr:#x}) is not {align}-byte aligned: {rule}"
        )));
    }
    Ok(())
}

/// Everything that can fail opening a dispatcher or launching through it.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Table(#[from] TableError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("device {name:?} has compute capability {}.{}: fp4tune has kernel families for 9.0 (sm90) and 12.0 (sm120)",
        compute_capability.0, compute_capability.1)]
    UnsupportedDevice { name: String, compute_capability: (u32, u32) },
    #[error("setting up the kernel compiler (cubin cache {}): {error}",
        cache_dir.as_ref().map_or("none".to_string(), |d| d.display().to_string()))]
    Compiler { cache_dir: Option<PathBuf>, error: CompileError },
    #[error("rendering kernel {config}: {reason}")]
    Render { config: String, reason: String },
    #[error("compiling kernel {config}: {error}")]
    Compile { config: String, error: CompileError },
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error(transparent)]
    Composite(#[from] super::composite::CompositeError),
    #[error(
        "a workspace (split-K or dequantize-then-cuBLAS) must grow to {needed_bytes} bytes (has {have_bytes}) \
         while the stream is being captured into a CUDA graph; launch this shape once before capturing, or \
         launch with a workspace sized at creation (`Dispatcher::gemm_in`, `fp4tune_gemm_ws`)"
    )]
    WorkspaceDuringCapture { needed_bytes: usize, have_bytes: usize },
    #[error(
        "{problem} needs {needed}; the workspace holds {have} (sized for max_m {max_m}): \
         create the stream's workspace with a larger max_m (only the table's shapes are planned)"
    )]
    WorkspaceTooSmall { problem: String, needed: String, have: String, max_m: u32 },
    #[error(
        "the workspace was created by another dispatcher: create one per dispatcher and stream"
    )]
    ForeignWorkspace,
    #[error("internal error: configuration {0} was chosen but not loaded")]
    NotLoaded(String),
}
