//! The C ABI of the runtime dispatcher (`libfp4tune.so`, declared in `include/fp4tune.h`).
//!
//! Every exported function returns an `fp4tune_status` (0 = success) except the accessors named
//! otherwise; on failure the calling thread's [`fp4tune_last_error`] message says what went
//! wrong. Panics never cross the boundary (`catch_unwind` around every body: a panic becomes
//! `FP4TUNE_ERR_PANIC`). A dispatcher may be shared by threads; `fp4tune_close` must be called
//! once, after every other call on it returned.

use crate::problem::AType;
use crate::runtime::{Dispatcher, GemmArgs, Options, RuntimeError};
use crate::table::MismatchPolicy;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

/// Version of this ABI; bumped on any incompatible change of the header.
pub const ABI_VERSION: u32 = 3;

/// Status codes (`enum fp4tune_status` in the header).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    InvalidArgument = 1,
    Table = 2,
    Device = 3,
    Compile = 4,
    Launch = 5,
    NoKernel = 6,
    Panic = 7,
}

/// `(header name, value)` of every status, checked against the header by a test.
pub const STATUS_NAMES: &[(&str, Status)] = &[
    ("FP4TUNE_OK", Status::Ok),
    ("FP4TUNE_ERR_INVALID_ARGUMENT", Status::InvalidArgument),
    ("FP4TUNE_ERR_TABLE", Status::Table),
    ("FP4TUNE_ERR_DEVICE", Status::Device),
    ("FP4TUNE_ERR_COMPILE", Status::Compile),
    ("FP4TUNE_ERR_LAUNCH", Status::Launch),
    ("FP4TUNE_ERR_NO_KERNEL", Status::NoKernel),
    ("FP4TUNE_ERR_PANIC", Status::Panic),
];

/// `enum fp4tune_a_type`.
pub const A_NVFP4: c_int = 0;
pub const A_BF16: c_int = 1;
/// `enum fp4tune_policy`.
pub const POLICY_WARN: c_int = 0;
pub const POLICY_ERROR: c_int = 1;
pub const POLICY_IGNORE: c_int = 2;

/// Every exported function with its parameter count: the test `header_matches_the_exports`
/// compares this list with `include/fp4tune.h` and with the functions defined in this file.
pub const EXPORTS: &[(&str, usize)] = &[
    ("fp4tune_abi_version", 0),
    ("fp4tune_last_error", 0),
    ("fp4tune_open", 3),
    ("fp4tune_open_ex", 6),
    ("fp4tune_gemm", 12),
    ("fp4tune_gemm_workspace_create", 3),
    ("fp4tune_gemm_workspace_destroy", 1),
    ("fp4tune_gemm_workspace_bytes", 1),
    ("fp4tune_gemm_ws", 13),
    ("fp4tune_route", 7),
    ("fp4tune_report", 3),
    ("fp4tune_synchronize", 2),
    ("fp4tune_close", 1),
    ("fp4tune_scale_bytes", 2),
    ("fp4tune_moe_workspace_create", 8),
    ("fp4tune_moe_workspace_destroy", 1),
    ("fp4tune_moe_layer", 4),
    ("fp4tune_moe_align", 4),
    ("fp4tune_moe_gate_up", 4),
    ("fp4tune_moe_down", 4),
    ("fp4tune_moe_route", 9),
    ("fp4tune_moe_prepare_weights", 7),
    ("fp4tune_moe_restore_weights", 7),
    ("fp4tune_moe_forget_weights", 6),
];

/// The opaque handle (`fp4tune_dispatcher` in C).
#[derive(Debug)]
pub struct Fp4tuneDispatcher {
    inner: Dispatcher,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // `try_with`: a call from a thread-exit destructor, after this thread's storage is gone,
    // must not panic inside an `extern "C"` function (that aborts the process).
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = c);
}

type Failure = (Status, String);

/// Run `body`, turning errors and panics into a status and the thread's last error.
fn guard(body: impl FnOnce() -> Result<(), Failure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => Status::Ok as c_int,
        Ok(Err((status, message))) => {
            set_error(&message);
            status as c_int
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_error(&format!("internal error (panic) in fp4tune: {what}"));
            Status::Panic as c_int
        }
    }
}

fn status_of(e: &RuntimeError, launching: bool) -> Status {
    match e {
        RuntimeError::Table(_) => Status::Table,
        RuntimeError::Gpu(_) if launching => Status::Launch,
        RuntimeError::Gpu(_) | RuntimeError::UnsupportedDevice { .. } => Status::Device,
        RuntimeError::Compiler { .. }
        | RuntimeError::Render { .. }
        | RuntimeError::Compile { .. } => Status::Compile,
        RuntimeError::Lookup(_) | RuntimeError::NotLoaded(_) => Status::NoKernel,
        RuntimeError::Composite(_) => Status::Launch,
        RuntimeError::InvalidArgument(_) => Status::InvalidArgument,
        RuntimeError::WorkspaceDuringCapture { .. } => Status::Launch,
        RuntimeError::WorkspaceTooSmall { .. } | RuntimeError::ForeignWorkspace => {
            Status::InvalidArgument
        }
    }
}

fn fail(e: RuntimeError, launching: bool) -> Failure {
    (status_of(&e, launching), e.to_string())
}

fn invalid(message: impl Into<String>) -> Failure {
    (Status::InvalidArgument, message.into())
}

/// # Safety
/// `s` must be NULL or a NUL-terminated string.
unsafe fn opt_str(s: *const c_char, what: &str) -> Result<Option<String>, Failure> {
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and NUL-terminated per the contract.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str().map(|s| Some(s.to_string())).map_err(|_| invalid(format!("{what} is not UTF-8")))
}

fn a_type(v: c_int) -> Result<AType, Failure> {
    match v {
        A_NVFP4 => Ok(AType::Nvfp4),
        A_BF16 => Ok(AType::Bf16),
        _ => Err(invalid(format!(
            "a_type {v} is neither FP4TUNE_A_NVFP4 (0) nor FP4TUNE_A_BF16 (1)"
        ))),
    }
}

fn dims(m: i32, n: i32, k: i32) -> Result<(u32, u32, u32), Failure> {
    if m <= 0 || n <= 0 || k <= 0 {
        return Err(invalid(format!("M={m} N={n} K={k} must be positive")));
    }
    Ok((m as u32, n as u32, k as u32))
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn prefix_within(text: &str, max: usize) -> &str {
    let mut n = text.len().min(max);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    &text[..n]
}

/// Copy `text` into `buf` (at most `len` bytes, always NUL-terminated when `len > 0`; a text
/// longer than `len - 1` bytes is cut at a character boundary, so what is written stays UTF-8).
///
/// # Safety
/// `buf` must be NULL (then `len` must be 0) or valid for `len` bytes of writes.
unsafe fn write_str(text: &str, buf: *mut c_char, len: usize) -> Result<(), Failure> {
    if buf.is_null() || len == 0 {
        return Err(invalid("output buffer is NULL or empty"));
    }
    let text = prefix_within(text, len - 1);
    let n = text.len();
    // SAFETY: `buf` holds `len` > n bytes per the contract; source and destination do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr() as *const c_char, buf, n);
        *buf.add(n) = 0;
    }
    Ok(())
}

/// # Safety
/// `d` must be NULL or a handle from `fp4tune_open*` that was not closed.
unsafe fn handle<'a>(d: *const Fp4tuneDispatcher) -> Result<&'a Dispatcher, Failure> {
    // SAFETY: per the contract, a non-null `d` points to a live handle.
    unsafe { d.as_ref() }.map(|h| &h.inner).ok_or_else(|| invalid("dispatcher handle is NULL"))
}

/// The ABI version this library implements ([`ABI_VERSION`]).
#[no_mangle]
pub extern "C" fn fp4tune_abi_version() -> u32 {
    ABI_VERSION
}

/// The message of the most recent failed call on this thread ("" if none). The pointer stays
/// valid until the next failing fp4tune call on this thread.
#[no_mangle]
pub extern "C" fn fp4tune_last_error() -> *const c_char {
    // At thread exit, after this thread's storage is gone: "" (a static, always valid).
    LAST_ERROR.try_with(|e| e.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}

/// Open `device` with the table at `table_path` (NULL: no table, family defaults), default
/// options (cubin cache `$FP4TUNE_CACHE` or `~/.cache/fp4tune/cubin`, mismatch policy warn).
///
/// # Safety
/// `table_path` must be NULL or a NUL-terminated string; `out` must be valid for one write.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_open(
    table_path: *const c_char,
    device: c_int,
    out: *mut *mut Fp4tuneDispatcher,
) -> c_int {
    // SAFETY: forwarded contract (a NULL cache dir is allowed).
    unsafe { fp4tune_open_ex(table_path, device, std::ptr::null(), POLICY_WARN, 0, out) }
}

/// [`fp4tune_open`] with options: `cache_dir` (NULL: default), `policy` (`FP4TUNE_POLICY_*`),
/// `max_m` (workspace sized for M up to this at open; 0: 8192).
///
/// # Safety
/// `table_path` and `cache_dir` must be NULL or NUL-terminated strings; `out` must be valid for
/// one write.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_open_ex(
    table_path: *const c_char,
    device: c_int,
    cache_dir: *const c_char,
    policy: c_int,
    max_m: u32,
    out: *mut *mut Fp4tuneDispatcher,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(invalid("`out` is NULL"));
        }
        // SAFETY: `out` is non-null and valid for a write per the contract.
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: NULL or NUL-terminated per the contract.
        let table = unsafe { opt_str(table_path, "table_path")? };
        // SAFETY: as above.
        let cache = unsafe { opt_str(cache_dir, "cache_dir")? };
        let device =
            usize::try_from(device).map_err(|_| invalid(format!("device {device} < 0")))?;
        let policy = match policy {
            POLICY_WARN => MismatchPolicy::Warn,
            POLICY_ERROR => MismatchPolicy::Error,
            POLICY_IGNORE => MismatchPolicy::Ignore,
            p => {
                return Err(invalid(format!(
                    "policy {p} is not one of FP4TUNE_POLICY_WARN/ERROR/IGNORE"
                )))
            }
        };
        let defaults = Options::default();
        let options = Options {
            device,
            cache_dir: cache.map(PathBuf::from),
            policy,
            max_m: if max_m == 0 { defaults.max_m } else { max_m },
        };
        let inner = match table {
            Some(path) => Dispatcher::open(path, &options),
            None => Dispatcher::open_untuned(&options),
        }
        .map_err(|e| fail(e, false))?;
        let handle = Box::into_raw(Box::new(Fp4tuneDispatcher { inner }));
        // SAFETY: as above.
        unsafe { *out = handle };
        Ok(())
    })
}

/// Y[M, N] (bf16) = alpha * A[M, K] * W[N, K]^T with the table's kernel, launched on `stream`
/// (a `CUstream`/`cudaStream_t` as an integer; 0 = the legacy default stream). Pointers are
/// device addresses in the device's primary context (what `cudaMalloc` and PyTorch give).
/// `a_sf` may be 0 for `FP4TUNE_A_BF16`. Asynchronous like any kernel launch. Split-K kernels and
/// dequantize-then-cuBLAS entries use the dispatcher's own workspace: call this from one stream;
/// streams whose launches may overlap use [`fp4tune_gemm_ws`] with a workspace each.
///
/// # Safety
/// `d` must be a live handle; the buffers must hold the data layout's sizes for (m, n, k) and stay
/// alive until the launch completes; `stream` must be 0 or a live stream of that context; launches
/// through this function that use the workspace do not overlap on the GPU.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_gemm(
    d: *const Fp4tuneDispatcher,
    a: u64,
    a_sf: u64,
    w: u64,
    w_sf: u64,
    y: u64,
    m: i32,
    n: i32,
    k: i32,
    a_type_: c_int,
    alpha: f32,
    stream: u64,
) -> c_int {
    guard(|| {
        // SAFETY: live handle per the contract.
        let d = unsafe { handle(d)? };
        let (m, n, k) = dims(m, n, k)?;
        let args = GemmArgs { a, a_sf, w, w_sf, y, m, n, k, a_type: a_type(a_type_)?, alpha };
        // SAFETY: buffer and stream contract forwarded from the caller.
        unsafe { d.gemm(&args, stream) }.map(|_| ()).map_err(|e| fail(e, true))
    })
}

/// The opaque per-stream scratch of GEMM launches (`fp4tune_gemm_workspace` in C).
#[derive(Debug)]
pub struct Fp4tuneGemmWorkspace {
    inner: crate::runtime::GemmWorkspace,
}

/// Create a workspace for one stream's GEMM launches through [`fp4tune_gemm_ws`], sized for
/// every route of the table up to `max_m` (0: the dispatcher's `max_m`). Create one per stream
/// whose launches may run at the same time as others'; allocates and waits for the allocation,
/// so create it before any capture.
///
/// # Safety
/// `d` must be a live handle; `out` valid for one write.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_gemm_workspace_create(
    d: *const Fp4tuneDispatcher,
    max_m: u32,
    out: *mut *mut Fp4tuneGemmWorkspace,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(invalid("`out` is NULL"));
        }
        // SAFETY: `out` is valid for one write per the contract.
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: live handle per the contract.
        let d = unsafe { handle(d)? };
        let max_m = if max_m == 0 { d.report().max_m } else { max_m };
        let ws = d.gemm_workspace(max_m).map_err(|e| fail(e, false))?;
        // SAFETY: as above.
        unsafe { *out = Box::into_raw(Box::new(Fp4tuneGemmWorkspace { inner: ws })) };
        Ok(())
    })
}

/// Free a GEMM workspace after the launches that use it completed. NULL is ignored.
///
/// # Safety
/// `ws` must be NULL or a live workspace, destroyed at most once.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_gemm_workspace_destroy(ws: *mut Fp4tuneGemmWorkspace) {
    let _ = guard(|| {
        if !ws.is_null() {
            // SAFETY: `ws` came from Box::into_raw in fp4tune_gemm_workspace_create.
            drop(unsafe { Box::from_raw(ws) });
        }
        Ok(())
    });
}

/// Device bytes a GEMM workspace occupies (0 for NULL).
///
/// # Safety
/// `ws` must be NULL or a live workspace.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_gemm_workspace_bytes(ws: *const Fp4tuneGemmWorkspace) -> usize {
    // SAFETY: NULL or a live workspace per the contract.
    unsafe { ws.as_ref() }.map_or(0, |w| w.inner.bytes())
}

/// [`fp4tune_gemm`] with `ws` as the scratch of split-K kernels and dequantize-then-cuBLAS
/// entries: launches on different streams, each with its own workspace, never share scratch.
/// No allocation, no synchronization (capturable). A launch that needs more than `ws` holds
/// returns `FP4TUNE_ERR_INVALID_ARGUMENT` before anything is enqueued.
///
/// # Safety
/// As [`fp4tune_gemm`]; `ws` a live workspace of `d`, used by no other stream until this launch
/// completes.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_gemm_ws(
    d: *const Fp4tuneDispatcher,
    ws: *mut Fp4tuneGemmWorkspace,
    a: u64,
    a_sf: u64,
    w: u64,
    w_sf: u64,
    y: u64,
    m: i32,
    n: i32,
    k: i32,
    a_type_: c_int,
    alpha: f32,
    stream: u64,
) -> c_int {
    guard(|| {
        // SAFETY: live handle per the contract.
        let d = unsafe { handle(d)? };
        // SAFETY: NULL or a live workspace per the contract (read only).
        let ws = unsafe { ws.as_ref() }.ok_or_else(|| invalid("workspace is NULL"))?;
        let (m, n, k) = dims(m, n, k)?;
        let args = GemmArgs { a, a_sf, w, w_sf, y, m, n, k, a_type: a_type(a_type_)?, alpha };
        // SAFETY: buffer, workspace and stream contract forwarded from the caller.
        unsafe { d.gemm_in(&args, &ws.inner, stream) }.map(|_| ()).map_err(|e| fail(e, true))
    })
}

/// Write the configuration a GEMM of this shape would launch, and why, into `buf` (e.g.
/// `sm90_w4a16_m16n64k128_w1x4x1_s4_sk1_swap (nearest bucket M=16)`, or
/// `dequant_cublas_bf16 (exact)` for an entry that chose the composite path), truncated to `len`.
///
/// # Safety
/// `d` must be a live handle; `buf` must be valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_route(
    d: *const Fp4tuneDispatcher,
    m: i32,
    n: i32,
    k: i32,
    a_type_: c_int,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: live handle per the contract.
        let d = unsafe { handle(d)? };
        let (m, n, k) = dims(m, n, k)?;
        let r = d.route(m, n, k, a_type(a_type_)?).map_err(|e| fail(e, false))?;
        // SAFETY: forwarded buffer contract.
        unsafe { write_str(&r.to_string(), buf, len) }
    })
}

/// Write the start-up report (device, kernels compiled / from cache, start-up time, warnings) and
/// the shapes that fell back so far into `buf`, truncated to `len`.
///
/// # Safety
/// `d` must be a live handle; `buf` must be valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_report(
    d: *const Fp4tuneDispatcher,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: live handle per the contract.
        let d = unsafe { handle(d)? };
        let mut text = d.report().to_string();
        for f in d.fallbacks() {
            text.push_str(&format!("\n  fallback: {f}"));
        }
        // SAFETY: forwarded buffer contract.
        unsafe { write_str(&text, buf, len) }
    })
}

/// Wait for `stream` (0 = legacy default stream); reports asynchronous kernel errors.
///
/// # Safety
/// `d` must be a live handle; `stream` must be 0 or a live stream of the device's primary context.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_synchronize(d: *const Fp4tuneDispatcher, stream: u64) -> c_int {
    guard(|| {
        // SAFETY: live handle per the contract.
        let d = unsafe { handle(d)? };
        // SAFETY: forwarded stream contract.
        unsafe { d.synchronize(stream) }.map_err(|e| fail(e, true))
    })
}

/// Wait for the device, unload the kernels and free the handle. NULL is ignored.
///
/// # Safety
/// `d` must be NULL or a live handle from `fp4tune_open*`, closed at most once, with no other call
/// on it in flight.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_close(d: *mut Fp4tuneDispatcher) {
    let _ = guard(|| {
        if !d.is_null() {
            // SAFETY: `d` came from Box::into_raw in fp4tune_open_ex and is freed once.
            drop(unsafe { Box::from_raw(d) });
        }
        Ok(())
    });
}

/// Bytes of a swizzled scale buffer for `rows` x `k` NVFP4 values (rows padded to 128, K/16
/// padded to 4): what a caller allocates for W or A scales. 0 for invalid sizes.
#[no_mangle]
pub extern "C" fn fp4tune_scale_bytes(rows: i32, k: i32) -> usize {
    if rows <= 0 || k <= 0 || k % 16 != 0 {
        return 0;
    }
    crate::format::swizzle::swizzled_len(rows as usize, (k / 16) as usize)
}

#[path = "ffi_moe.rs"]
mod moe;
pub use moe::*;

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = include_str!("../../include/fp4tune.h");
    /// This file and its child with the grouped MoE calls.
    const THIS_FILE: &str = concat!(include_str!("ffi.rs"), include_str!("ffi_moe.rs"));

    /// Top-level comma count of a parameter list ("void" and "" are empty).
    fn param_count(params: &str) -> usize {
        let p = params.trim();
        if p.is_empty() || p == "void" {
            0
        } else {
            p.split(',').filter(|s| !s.trim().is_empty()).count()
        }
    }

    /// `FP4TUNE_API <ret> <name>(<params>);` declarations, possibly over several lines.
    fn header_functions() -> Vec<(String, usize)> {
        let mut out = Vec::new();
        let mut rest = HEADER;
        while let Some(i) = rest.find("FP4TUNE_API ") {
            let decl = &rest[i..];
            if decl.starts_with("FP4TUNE_API __") {
                rest = &rest[i + "FP4TUNE_API ".len()..]; // the macro's definition
                continue;
            }
            let end = decl.find(';').expect("declaration ends with ;");
            let decl = &decl[..end];
            rest = &rest[i + end..];
            let open = decl.find('(').expect("(");
            let close = decl.rfind(')').expect(")");
            let name = decl[..open].split_whitespace().last().unwrap().trim_start_matches('*');
            out.push((name.to_string(), param_count(&decl[open + 1..close])));
        }
        out
    }

    /// `extern "C" fn <name>(<params>)` definitions of this file and its child.
    fn rust_functions() -> Vec<(String, usize)> {
        let mut out = Vec::new();
        for (i, _) in THIS_FILE.match_indices("extern \"C\" fn ") {
            let decl = &THIS_FILE[i + "extern \"C\" fn ".len()..];
            let open = decl.find('(').unwrap();
            let close = decl.find(')').unwrap();
            let name = &decl[..open];
            if name.starts_with("fp4tune_") {
                out.push((name.to_string(), param_count(&decl[open + 1..close])));
            }
        }
        out
    }

    fn sorted(mut v: Vec<(String, usize)>) -> Vec<(String, usize)> {
        v.sort();
        v
    }

    #[test]
    fn header_matches_the_exports() {
        let listed = sorted(EXPORTS.iter().map(|(n, c)| (n.to_string(), *c)).collect());
        assert_eq!(sorted(header_functions()), listed, "include/fp4tune.h vs ffi::EXPORTS");
        assert_eq!(sorted(rust_functions()), listed, "extern \"C\" fns of ffi.rs vs ffi::EXPORTS");
    }

    #[test]
    fn header_constants_match() {
        let value = |name: &str| -> i64 {
            let i = HEADER.find(&format!("{name} =")).unwrap_or_else(|| panic!("{name} in header"));
            let rest = &HEADER[i + name.len() + 2..];
            rest.trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
        };
        for (name, status) in STATUS_NAMES {
            assert_eq!(value(name), *status as i64, "{name}");
        }
        assert_eq!(STATUS_NAMES.len(), Status::Panic as usize + 1);
        assert_eq!(value("FP4TUNE_A_NVFP4"), A_NVFP4 as i64);
        assert_eq!(value("FP4TUNE_A_BF16"), A_BF16 as i64);
        assert_eq!(value("FP4TUNE_POLICY_WARN"), POLICY_WARN as i64);
        assert_eq!(value("FP4TUNE_POLICY_ERROR"), POLICY_ERROR as i64);
        assert_eq!(value("FP4TUNE_POLICY_IGNORE"), POLICY_IGNORE as i64);
        assert!(HEADER.contains(&format!("#define FP4TUNE_ABI_VERSION {ABI_VERSION}")));
    }

    pub(super) fn last_error() -> String {
        // SAFETY: the pointer is a NUL-terminated string owned by this thread's slot.
        unsafe { CStr::from_ptr(fp4tune_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn bad_calls_return_a_status_and_a_message_without_a_gpu() {
        let mut d: *mut Fp4tuneDispatcher = std::ptr::null_mut();
        // SAFETY: valid NUL-terminated strings and a valid out pointer.
        let s = unsafe {
            fp4tune_open_ex(c"/nonexistent/h200.ron".as_ptr(), 0, std::ptr::null(), 9, 0, &mut d)
        };
        assert_eq!(s, Status::InvalidArgument as c_int);
        assert!(last_error().contains("policy 9"), "{}", last_error());
        assert!(d.is_null());
        // SAFETY: as above.
        let s = unsafe { fp4tune_open(c"/x.ron".as_ptr(), -1, &mut d) };
        assert_eq!(s, Status::InvalidArgument as c_int);
        // SAFETY: NULL out pointer is checked, not written.
        let s = unsafe { fp4tune_open(std::ptr::null(), 0, std::ptr::null_mut()) };
        assert_eq!(s, Status::InvalidArgument as c_int);
        // SAFETY: a NULL handle is refused before any use.
        let s =
            unsafe { fp4tune_gemm(std::ptr::null(), 1, 0, 2, 3, 4, 1, 512, 6144, A_BF16, 1.0, 0) };
        assert_eq!(s, Status::InvalidArgument as c_int);
        assert!(last_error().contains("NULL"), "{}", last_error());
        // SAFETY: NULL is ignored.
        unsafe { fp4tune_close(std::ptr::null_mut()) };
        assert_eq!(fp4tune_abi_version(), ABI_VERSION);
    }

    #[test]
    fn gemm_workspace_calls_refuse_null_handles_before_any_use() {
        let mut ws: *mut Fp4tuneGemmWorkspace = std::ptr::null_mut();
        // SAFETY: a NULL handle is refused before any use; `ws` is a valid out pointer.
        let s = unsafe { fp4tune_gemm_workspace_create(std::ptr::null(), 64, &mut ws) };
        assert_eq!(s, Status::InvalidArgument as c_int);
        assert!(ws.is_null());
        assert!(last_error().contains("NULL"), "{}", last_error());
        // SAFETY: a NULL out pointer is checked, not written.
        let s =
            unsafe { fp4tune_gemm_workspace_create(std::ptr::null(), 64, std::ptr::null_mut()) };
        assert_eq!(s, Status::InvalidArgument as c_int);
        assert!(last_error().contains("`out`"), "{}", last_error());
        // SAFETY: NULL handles are refused before anything is dereferenced.
        let s = unsafe {
            fp4tune_gemm_ws(
                std::ptr::null(),
                std::ptr::null_mut(),
                16,
                0,
                16,
                4,
                4,
                1,
                512,
                6144,
                A_BF16,
                1.0,
                0,
            )
        };
        assert_eq!(s, Status::InvalidArgument as c_int);
        // SAFETY: NULL is accepted by both.
        assert_eq!(unsafe { fp4tune_gemm_workspace_bytes(std::ptr::null()) }, 0);
        // SAFETY: as above.
        unsafe { fp4tune_gemm_workspace_destroy(std::ptr::null_mut()) };
    }

    /// A launch its workspace cannot hold, or a workspace of another dispatcher, is the
    /// caller's argument: the invalid-argument status with a message saying what to do.
    #[test]
    fn workspace_refusals_are_the_invalid_argument_status() {
        let (status, message) = fail(RuntimeError::ForeignWorkspace, true);
        assert_eq!(status, Status::InvalidArgument);
        assert!(message.contains("another dispatcher"), "{message}");
        let e = RuntimeError::WorkspaceTooSmall {
            problem: "M=200 N=512 K=6144 w4a16".into(),
            needed: "split-K 409600 f32".into(),
            have: "split-K 32768 f32".into(),
            max_m: 16,
        };
        let (status, message) = fail(e, true);
        assert_eq!(status, Status::InvalidArgument);
        assert!(message.contains("larger max_m"), "{message}");
    }

    #[test]
    fn a_missing_table_is_a_table_error_before_the_device_is_touched() {
        // The table is read before the device is opened, so this holds with and without a GPU.
        let mut d: *mut Fp4tuneDispatcher = std::ptr::null_mut();
        // SAFETY: valid strings and out pointer.
        let s = unsafe { fp4tune_open(c"/nonexistent/h200.ron".as_ptr(), 0, &mut d) };
        assert_eq!(s, Status::Table as c_int, "{}", last_error());
        assert!(last_error().contains("/nonexistent/h200.ron"), "{}", last_error());
    }

    /// The runtime's refusal of a call's arguments (a null or misaligned
    /// pointer, a bad size) is the invalid-argument status, also from a launching call.
    #[test]
    fn refused_arguments_are_the_invalid_argument_status() {
        let e = RuntimeError::InvalidArgument(
            "device pointer `a` (0x1008) is not 16-byte aligned".into(),
        );
        let (status, message) = fail(e, true);
        assert_eq!(status, Status::InvalidArgument);
        assert!(message.contains("16-byte aligned"), "{message}");
    }

    /// Text written into a caller's buffer is cut at a character boundary (what a caller
    /// decodes as UTF-8 stays valid) and always NUL-terminated.
    #[test]
    fn written_text_is_cut_at_a_character_boundary() {
        assert_eq!(prefix_within("abc", 10), "abc");
        assert_eq!(prefix_within("abc", 2), "ab");
        assert_eq!(prefix_within("x\u{b5}y", 2), "x");
        assert_eq!(prefix_within("x\u{b5}y", 3), "x\u{b5}");
        assert_eq!(prefix_within("\u{20ac}", 2), "");
        for len in 1..=6 {
            let mut buf = vec![0x7f as c_char; len];
            // SAFETY: `buf` holds `len` bytes.
            unsafe { write_str("a\u{20ac}b", buf.as_mut_ptr(), len) }.unwrap();
            // SAFETY: write_str NUL-terminated it inside `buf`.
            let got = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
            let got = got.to_str().expect("UTF-8");
            assert!("a\u{20ac}b".starts_with(got) && got.len() < len, "{len}: {got:?}");
        }
    }

    #[test]
    fn panics_become_a_status() {
        let s = guard(|| panic!("boom"));
        assert_eq!(s, Status::Panic as c_int);
        assert!(last_error().contains("boom"));
    }
}
