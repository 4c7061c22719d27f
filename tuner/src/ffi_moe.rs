//! The C ABI of the grouped MoE layer (a child of `ffi.rs`): the per-stream workspace and the
//! layer's operations (`fp4tune_moe_*`), with the same status and error conventions.

use super::*;

/// The opaque per-stream scratch of the grouped MoE operations (`fp4tune_moe_workspace` in C).
#[derive(Debug)]
pub struct Fp4tuneMoeWorkspace {
    inner: crate::runtime::moe::MoeWorkspace,
}

fn moe_shape(
    hidden: i32,
    inter: i32,
    experts: i32,
    top_k: i32,
) -> Result<crate::moe::MoeShape, Failure> {
    if hidden <= 0 || inter <= 0 || experts <= 0 || top_k <= 0 {
        return Err(invalid(format!(
            "MoE layer hidden {hidden}, inter {inter}, experts {experts}, top_k {top_k}: all must be positive"
        )));
    }
    Ok(crate::moe::MoeShape {
        hidden: hidden as u32,
        inter: inter as u32,
        experts: experts as u32,
        top_k: top_k as u32,
    })
}

/// The model's routed experts of a C call: `experts_total`, or the layer's local experts for 0
/// (every expert on this GPU).
fn experts_total_of(shape: &crate::moe::MoeShape, experts_total: i32) -> Result<u32, Failure> {
    match experts_total {
        0 => Ok(shape.experts),
        t if t < 0 => {
            Err(invalid(format!("experts_total {t} must be positive (or 0: every expert local)")))
        }
        t => {
            crate::moe::defaults::check_experts_total(shape, t as u32).map_err(invalid)?;
            Ok(t as u32)
        }
    }
}

/// Create a workspace for one stream's grouped MoE launches of the layer (hidden, inter per GPU,
/// local experts, top_k) of a model of `experts_total` routed experts (0: every expert local)
/// with up to `max_tokens` tokens; the first workspace of a layer the table has no grouped
/// entries for builds its family defaults for that routing. Use one workspace per stream.
///
/// # Safety
/// `d` must be a live handle; `out` valid for one write.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_moe_workspace_create(
    d: *const Fp4tuneDispatcher,
    hidden: i32,
    inter: i32,
    experts: i32,
    top_k: i32,
    experts_total: i32,
    max_tokens: i32,
    out: *mut *mut Fp4tuneMoeWorkspace,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        // SAFETY: `out` is valid for one write per the contract.
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: live handle per the contract.
        let d = unsafe { handle(d)? };
        let shape = moe_shape(hidden, inter, experts, top_k)?;
        let total = experts_total_of(&shape, experts_total)?;
        if max_tokens <= 0 {
            return Err(invalid(format!("max_tokens {max_tokens} must be positive")));
        }
        let ws = d
            .moe()
            .and_then(|m| m.workspace(shape, total, max_tokens as u32))
            .map_err(|e| fail(e, false))?;
        // SAFETY: as above.
        unsafe { *out = Box::into_raw(Box::new(Fp4tuneMoeWorkspace { inner: ws })) };
        Ok(())
    })
}

/// Free a workspace (after the launches that use it completed). NULL is ignored.
///
/// # Safety
/// `ws` must be NULL or a live workspace, destroyed at most once.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_moe_workspace_destroy(ws: *mut Fp4tuneMoeWorkspace) {
    let _ = guard(|| {
        if !ws.is_null() {
            // SAFETY: `ws` came from Box::into_raw in fp4tune_moe_workspace_create.
            drop(unsafe { Box::from_raw(ws) });
        }
        Ok(())
    });
}

/// Which grouped operation `moe_call` launches.
#[derive(Clone, Copy)]
enum MoeCall {
    Layer,
    Align,
    GateUp,
    Down,
}

/// # Safety
/// As the exported functions that call it.
unsafe fn moe_call(
    d: *const Fp4tuneDispatcher,
    ws: *mut Fp4tuneMoeWorkspace,
    args: *const crate::runtime::moe::MoeArgs,
    stream: u64,
    call: MoeCall,
) -> c_int {
    guard(|| {
        // SAFETY: live handle per the contract.
        let d = unsafe { handle(d)? };
        if ws.is_null() || args.is_null() {
            return Err(invalid("workspace or args is NULL"));
        }
        // SAFETY: live workspace and args per the contract (read only).
        let (ws, args) = unsafe { (&(*ws).inner, *args) };
        if args.tokens == 0 {
            return Err(invalid("tokens must be positive"));
        }
        let m = d.moe().map_err(|e| fail(e, false))?;
        // SAFETY: buffer, workspace and stream contract forwarded from the caller.
        unsafe {
            match call {
                MoeCall::Layer => m.layer(&args, ws, stream),
                MoeCall::Align => m.align(&args, ws, stream),
                MoeCall::GateUp => m.gate_up(&args, ws, stream),
                MoeCall::Down => m.down(&args, ws, stream),
            }
        }
        .map_err(|e| fail(e, true))
    })
}

/// The whole routed-expert layer on `stream`: align, gate_up (SiLU(gate) * up), down and the
/// router-weighted sum into `args->y`. No allocation, no synchronization (capturable).
///
/// # Safety
/// `d` and `ws` live; `args` valid; its buffers device memory of the documented sizes, alive until
/// the work completes; `ws` used by no other stream meanwhile; `stream` 0 or a live stream.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_moe_layer(
    d: *const Fp4tuneDispatcher,
    ws: *mut Fp4tuneMoeWorkspace,
    args: *const crate::runtime::moe::MoeArgs,
    stream: u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { moe_call(d, ws, args, stream, MoeCall::Layer) }
}

/// moe_align alone (the routed-row schedule of `args->topk_ids` into the workspace).
///
/// # Safety
/// As `fp4tune_moe_layer`.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_moe_align(
    d: *const Fp4tuneDispatcher,
    ws: *mut Fp4tuneMoeWorkspace,
    args: *const crate::runtime::moe::MoeArgs,
    stream: u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { moe_call(d, ws, args, stream, MoeCall::Align) }
}

/// gate_up alone over the workspace's schedule (after `fp4tune_moe_align` on the same stream).
///
/// # Safety
/// As `fp4tune_moe_layer`.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_moe_gate_up(
    d: *const Fp4tuneDispatcher,
    ws: *mut Fp4tuneMoeWorkspace,
    args: *const crate::runtime::moe::MoeArgs,
    stream: u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { moe_call(d, ws, args, stream, MoeCall::GateUp) }
}

/// down and the router-weighted sum into `args->y` (after `fp4tune_moe_gate_up`).
///
/// # Safety
/// As `fp4tune_moe_layer`.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_moe_down(
    d: *const Fp4tuneDispatcher,
    ws: *mut Fp4tuneMoeWorkspace,
    args: *const crate::runtime::moe::MoeArgs,
    stream: u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { moe_call(d, ws, args, stream, MoeCall::Down) }
}

/// Which call on a layer's prepared weight codes `weights_call` makes.
#[derive(Clone, Copy)]
enum WeightsCall {
    Prepare,
    Restore,
    Forget,
}

/// The projection a C `projection` names: `FP4TUNE_MOE_W13` (0, gate_up) or `FP4TUNE_MOE_W2`
/// (1, down).
fn projection(p: u32) -> Result<crate::moe::MoeOp, Failure> {
    match p {
        0 => Ok(crate::moe::MoeOp::GateUp),
        1 => Ok(crate::moe::MoeOp::Down),
        _ => Err(invalid(format!("projection {p}: FP4TUNE_MOE_W13 (0) or FP4TUNE_MOE_W2 (1)"))),
    }
}

/// Prepare, restore or forget one projection's weight codes of a layer
/// (`MoeOps::prepare_weights`, `restore_weights`, `forget_weights`; forget enqueues nothing on
/// `stream`).
///
/// # Safety
/// As the exported functions that call it.
#[allow(clippy::too_many_arguments)]
unsafe fn weights_call(
    d: *const Fp4tuneDispatcher,
    hidden: i32,
    inter: i32,
    experts: i32,
    which: u32,
    codes: u64,
    stream: u64,
    call: WeightsCall,
) -> c_int {
    guard(|| {
        // SAFETY: live handle per the contract.
        let d = unsafe { handle(d)? };
        // (top_k does not shape the weights)
        let shape = moe_shape(hidden, inter, experts, 1)?;
        let op = projection(which)?;
        let m = d.moe().map_err(|e| fail(e, false))?;
        // SAFETY: buffer and stream contract forwarded from the caller.
        unsafe {
            match call {
                WeightsCall::Prepare => m.prepare_weights(&shape, op, codes, stream),
                WeightsCall::Restore => m.restore_weights(&shape, op, codes, stream),
                WeightsCall::Forget => m.forget_weights(&shape, op, codes),
            }
        }
        .map_err(|e| fail(e, true))
    })
}

/// Put one projection's weight codes of a layer (`projection` 0 = w13, 1 = w2: every local
/// expert's codes, no scales, at device address `codes`) into the layout the grouped kernels
/// read, in place, once after loading; returns once they are in place (`stream` runs the work).
/// Grouped launches refuse codes that were not prepared for their projection and shape, GEMM
/// launches on sm90 codes that were (sm120 reads them as loaded); overlapping a prepared range
/// and a capturing stream are refused.
///
/// # Safety
/// `d` live; `codes` the projection's codes on the device, not used by other work until the
/// call returns; `stream` 0 or a live stream.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_moe_prepare_weights(
    d: *const Fp4tuneDispatcher,
    hidden: i32,
    inter: i32,
    experts: i32,
    projection: u32,
    codes: u64,
    stream: u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        weights_call(d, hidden, inter, experts, projection, codes, stream, WeightsCall::Prepare)
    }
}

/// Put codes prepared by `fp4tune_moe_prepare_weights` (same shape, projection and address)
/// back into the ModelOpt layout, in place (for `fp4tune_gemm`); returns once done.
///
/// # Safety
/// As `fp4tune_moe_prepare_weights`; no grouped launch reading them may be pending.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_moe_restore_weights(
    d: *const Fp4tuneDispatcher,
    hidden: i32,
    inter: i32,
    experts: i32,
    projection: u32,
    codes: u64,
    stream: u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        weights_call(d, hidden, inter, experts, projection, codes, stream, WeightsCall::Restore)
    }
}

/// Forget codes prepared by `fp4tune_moe_prepare_weights` (same shape, projection and address)
/// without touching them: before their memory is freed or overwritten with other data.
///
/// # Safety
/// `d` live.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_moe_forget_weights(
    d: *const Fp4tuneDispatcher,
    hidden: i32,
    inter: i32,
    experts: i32,
    projection: u32,
    codes: u64,
) -> c_int {
    // SAFETY: forwarded contract (no stream is touched).
    unsafe { weights_call(d, hidden, inter, experts, projection, codes, 0, WeightsCall::Forget) }
}

/// Write the grouped kernels the layer launches for `tokens`, per activation type the device runs
/// it with, and why (`Dispatcher::moe_route`): "w4a16: gate_up <config> (<why>); down <config>
/// (<why>)", where why is `exact`, the nearest bucket between two tuned ones, or the nearest
/// bucket outside the tuned range, whether the entries were tuned with other grouped templates,
/// and whether they are the family defaults (a layer the table has no entries for, chosen for a
/// model of `experts_total` routed experts, 0: every expert local); several activation types are
/// separated by " | ". Truncated to `len`. A layer the family's kernels cannot run is an error
/// whose message says why.
///
/// # Safety
/// `d` must be a live handle; `buf` valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn fp4tune_moe_route(
    d: *const Fp4tuneDispatcher,
    hidden: i32,
    inter: i32,
    experts: i32,
    top_k: i32,
    experts_total: i32,
    tokens: i32,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: live handle per the contract.
        let d = unsafe { handle(d)? };
        let shape = moe_shape(hidden, inter, experts, top_k)?;
        let total = experts_total_of(&shape, experts_total)?;
        if tokens <= 0 {
            return Err(invalid(format!("tokens {tokens} must be positive")));
        }
        let mut routes = Vec::new();
        let mut first_error = None;
        for a in [crate::problem::AType::Bf16, crate::problem::AType::Nvfp4] {
            match d.moe_route(&shape, total, a, tokens as u32) {
                Ok(r) => routes.push(r.to_string()),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if routes.is_empty() {
            if let Some(e) = first_error {
                return Err(fail(e, false));
            }
        }
        // SAFETY: forwarded buffer contract.
        unsafe { write_str(&routes.join(" | "), buf, len) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C projection constants (FP4TUNE_MOE_W13, FP4TUNE_MOE_W2 in include/fp4tune.h) name
    /// gate_up and down; anything else is an invalid argument that names both.
    #[test]
    fn projections_are_w13_and_w2() {
        assert_eq!(projection(0).unwrap(), crate::moe::MoeOp::GateUp);
        assert_eq!(projection(1).unwrap(), crate::moe::MoeOp::Down);
        let (status, message) = projection(2).unwrap_err();
        assert_eq!(status, Status::InvalidArgument);
        assert!(message.contains("FP4TUNE_MOE_W13 (0)") && message.contains("FP4TUNE_MOE_W2 (1)"));
        let header = include_str!("../../include/fp4tune.h");
        assert!(
            header.contains("#define FP4TUNE_MOE_W13 0u")
                && header.contains("#define FP4TUNE_MOE_W2 1u")
        );
    }

    #[test]
    fn moe_calls_refuse_null_handles_and_bad_sizes_and_scale_bytes_are_padded() {
        assert_eq!(fp4tune_scale_bytes(512, 6144), 512 * 384);
        assert_eq!(fp4tune_scale_bytes(1, 64), 128 * 4);
        assert_eq!(fp4tune_scale_bytes(8, 24), 0);
        let args = crate::runtime::moe::MoeArgs {
            x: 0,
            topk_ids: 0,
            topk_weights: 0,
            w13: 0,
            w13_sf: 0,
            alpha13: 0,
            w2: 0,
            w2_sf: 0,
            alpha2: 0,
            y: 0,
            tokens: 1,
            expert_begin: 0,
            w4a4: 1,
            x_scale: 1.0,
            h_scale: 1.0,
            reserved: 0,
            x_fp4: 0,
            x_sf: 0,
        };
        // SAFETY: NULL handles are refused before anything is dereferenced.
        let s = unsafe { fp4tune_moe_layer(std::ptr::null(), std::ptr::null_mut(), &args, 0) };
        assert_eq!(s, Status::InvalidArgument as c_int);
        // SAFETY: as above.
        unsafe {
            for s in [
                fp4tune_moe_prepare_weights(std::ptr::null(), 6144, 256, 256, 0, 4096, 0),
                fp4tune_moe_restore_weights(std::ptr::null(), 6144, 256, 256, 1, 4096, 0),
                fp4tune_moe_forget_weights(std::ptr::null(), 6144, 256, 256, 0, 4096),
            ] {
                assert_eq!(s, Status::InvalidArgument as c_int);
            }
        }
        let mut ws: *mut Fp4tuneMoeWorkspace = std::ptr::null_mut();
        // SAFETY: as above; `ws` is a valid out pointer.
        let s = unsafe {
            fp4tune_moe_workspace_create(std::ptr::null(), 6144, 256, 256, 8, 0, 64, &mut ws)
        };
        assert_eq!(s, Status::InvalidArgument as c_int);
        assert!(ws.is_null());
        let mut buf = [0 as c_char; 64];
        // SAFETY: as above; `buf` is valid for its length.
        let s = unsafe {
            fp4tune_moe_route(std::ptr::null(), 6144, 256, 256, 8, 0, 1, buf.as_mut_ptr(), 64)
        };
        assert_eq!(s, Status::InvalidArgument as c_int);
        // SAFETY: NULL is ignored.
        unsafe { fp4tune_moe_workspace_destroy(std::ptr::null_mut()) };
    }

    /// `experts_total` 0 is the layer's local experts; a negative count or one below them is
    /// refused with a line naming it.
    #[test]
    fn experts_total_zero_means_every_expert_local() {
        let ep8 = crate::moe::MoeShape::GLM5_EP8;
        assert_eq!(experts_total_of(&ep8, 0).unwrap(), 32);
        assert_eq!(experts_total_of(&ep8, 256).unwrap(), 256);
        let (status, e) = experts_total_of(&ep8, -1).unwrap_err();
        assert_eq!(status, Status::InvalidArgument);
        assert!(e.contains("experts_total -1 must be positive"), "{e}");
        let (_, e) = experts_total_of(&ep8, 16).unwrap_err();
        assert!(e.contains("(16) are fewer than the layer's 32 local experts"), "{e}");
    }
}
