//! The grouped MoE layer at run time: `moe_align`, the grouped `gate_up` and `down` kernels chosen
//! per token count, and `moe_finalize`, launched on the caller's stream with no allocation and no
//! synchronization. W4A16 reads bf16 X; W4A4 (`MoeArgs::w4a4`) reads X as NVFP4 (the caller's, or
//! quantized into the workspace by the activation quantizer first), and its gate_up writes H as
//! NVFP4 too, which down reads. A layer's weight codes are put once at load into the layout the
//! family's grouped kernels read (`order_weights`, `MoeOps::prepare_weights`: `moe::order`).
//!
//! Scratch memory (the routed-row schedule, `H` in bf16 and NVFP4, the quantized X, the per-row
//! outputs) lives in a [`MoeWorkspace`] the caller creates once per stream, sized at creation for a
//! maximum token count: launches on different streams, each with its own workspace, never share
//! scratch (two micro-batches on two streams stay correct). `bench` and `tune` launch through the
//! same code.

use super::error::RuntimeError;
use crate::compile::Compiler;
use crate::gpu::moe_params::{
    MoeAlignChunkParams, MoeAlignParams, MoeAlignQuantizeParams, MoeFinalizeParams,
    MoeGroupedParams, MoeGroupedSm120Params, MoeOrderParams,
};
use crate::gpu::params::QuantizeParams;
use crate::gpu::raw::RawStream;
use crate::gpu::{DeviceBuf, Gpu, Kernel, LaunchDims};
use crate::moe::order::{op_code, order_source, CodeStack, WeightOrder, ORDER_THREADS};
use crate::moe::templates::{
    align_chunks, align_source, finalize_source, AlignForm, AlignKernel, ALIGN_THREADS,
    FINALIZE_GROUPED_SLOTS, FINALIZE_SINGLE_SLOT, FINALIZE_THREADS,
};
use crate::moe::{list_tiles, GroupedConfig, MoeOp, MoeShape, TILE_BLOCK_M};
use crate::problem::AType;
use crate::template::{quantize, Family};

/// A grouped kernel, loaded.
#[derive(Debug)]
pub struct GroupedKernel {
    pub config: GroupedConfig,
    kernel: Kernel,
}

impl GroupedKernel {
    /// Compile (or take from the cache) and load `config`'s kernel.
    pub fn load(
        gpu: &Gpu,
        compiler: &Compiler,
        config: GroupedConfig,
    ) -> Result<Self, RuntimeError> {
        let compiled = compiler
            .compile(&config.source())
            .map_err(|error| RuntimeError::Compile { config: config.name(), error })?;
        Self::from_compiled(gpu, config, &compiled)
    }

    /// Load `config`'s compiled kernel; one that spills registers is refused (a candidate that
    /// is not worth timing).
    pub fn from_compiled(
        gpu: &Gpu,
        config: GroupedConfig,
        compiled: &crate::compile::CompiledKernel,
    ) -> Result<Self, RuntimeError> {
        let k = Self::from_compiled_with_spills(gpu, config, compiled)?;
        match k.spills(compiled)? {
            Some(why) => Err(RuntimeError::Render { config: config.name(), reason: why }),
            None => Ok(k),
        }
    }

    /// Why this loaded kernel spills registers to local memory, or `None`: ptxas's report of
    /// its compile, or where the compile left none, the loaded function's local memory (the
    /// grouped kernels use none).
    pub fn spills(
        &self,
        compiled: &crate::compile::CompiledKernel,
    ) -> Result<Option<String>, RuntimeError> {
        if compiled.spills() {
            return Ok(Some("the kernel spills registers to local memory".into()));
        }
        if compiled.stats.is_none() {
            let local = self.kernel.local_bytes()?;
            if local > 0 {
                return Ok(Some(format!(
                    "the kernel uses {local} bytes of local memory per thread (register spills; \
                     its compile left no ptxas report)"
                )));
            }
        }
        Ok(None)
    }

    /// Load `config`'s compiled kernel whether or not it spills (a table's choice: correct
    /// either way).
    pub fn from_compiled_with_spills(
        gpu: &Gpu,
        config: GroupedConfig,
        compiled: &crate::compile::CompiledKernel,
    ) -> Result<Self, RuntimeError> {
        Ok(Self { config, kernel: gpu.load(compiled, config.smem_bytes())? })
    }
}

/// The fixed kernels of the layer (routing, the activation quantizer of W4A4, finalize, the
/// weight order).
#[derive(Debug)]
pub struct MoeKernels {
    /// The device's kernel family: the grouped kernels a launcher runs must be of it.
    pub family: Family,
    /// The kernels that put weight codes into the grouped layout and back (moe::order).
    order: Kernel,
    order_back: Kernel,
    /// The routing kernels: the one-CTA form, then the chunked form's count, scan and place.
    align: Kernel,
    align_count: Kernel,
    align_scan: Kernel,
    align_place: Kernel,
    quantize: Kernel,
    /// The one-CTA routing kernel and the quantization of X in one launch (W4A4 given bf16 X).
    align_quantize: Kernel,
    /// The finalize kernel that reads a token's slots in groups (`FINALIZE_GROUPED_SLOTS`), and
    /// the one that reads one slot at a time.
    finalize_grouped: Kernel,
    finalize_single: Kernel,
    /// The largest grid of `finalize_grouped` that runs in one wave (its CTAs per SM at its
    /// register count, times the SMs); larger grids take `finalize_single`.
    finalize_grouped_wave: u32,
}

impl MoeKernels {
    pub fn load(gpu: &Gpu, compiler: &Compiler) -> Result<Self, RuntimeError> {
        let family = crate::runtime::family_for(gpu.info())?;
        let arch = family.arch();
        let quantizer = quantize::render(arch).map_err(|e| RuntimeError::Render {
            config: quantize::QUANTIZE_KERNEL.into(),
            reason: e.to_string(),
        })?;
        // The ten fixed kernels compile (or come from the cache) on all cores at once.
        let sources = [
            align_source(arch, AlignKernel::OneCta),
            align_source(arch, AlignKernel::Count),
            align_source(arch, AlignKernel::Scan),
            align_source(arch, AlignKernel::Place),
            quantizer,
            finalize_source(arch, FINALIZE_GROUPED_SLOTS),
            finalize_source(arch, FINALIZE_SINGLE_SLOT),
            order_source(arch, false),
            order_source(arch, true),
            align_source(arch, AlignKernel::OneCtaQuantize),
        ];
        let mut compiled = Vec::with_capacity(sources.len());
        for (src, r) in sources.iter().zip(compiler.compile_many(&sources)) {
            compiled.push(r.map_err(|error| RuntimeError::Compile {
                config: src.kernel_name.clone(),
                error,
            })?);
        }
        let load = |i: usize| -> Result<Kernel, RuntimeError> { Ok(gpu.load(&*compiled[i], 0)?) };
        // ptxas reports the registers (no report: assume the cap of one CTA per SM's threads)
        let registers = compiled[5].stats.as_ref().map_or(255, |s| s.registers);
        Ok(Self {
            family,
            align: load(0)?,
            align_count: load(1)?,
            align_scan: load(2)?,
            align_place: load(3)?,
            quantize: load(4)?,
            finalize_grouped: load(5)?,
            finalize_single: load(6)?,
            order: load(7)?,
            order_back: load(8)?,
            align_quantize: load(9)?,
            finalize_grouped_wave: finalize_ctas_per_sm(registers, gpu.sm_limits()?)
                * gpu.info().sm_count,
        })
    }
}

/// The order kernels' scratch: a copy of up to this many bytes of codes (at least one expert).
pub const ORDER_SCRATCH_BYTES: u64 = 64 << 20;

/// `Ok` for a projection's codes the order kernels take: a stack the grouped layout takes
/// (`CodeStack::check`) at a non-null 16-byte aligned address, a positive multiple of 16 bytes
/// that does not wrap the address space; returns the end of its range.
pub fn check_codes(codes: u64, stack: CodeStack) -> Result<u64, RuntimeError> {
    stack.check().map_err(RuntimeError::InvalidArgument)?;
    let bytes = stack.bytes();
    if codes == 0
        || codes % 16 != 0
        || bytes == 0
        || bytes % 16 != 0
        || codes.checked_add(bytes).is_none()
    {
        return Err(RuntimeError::InvalidArgument(format!(
            "weight codes at {codes:#x}, {bytes} bytes: need a non-null 16-byte aligned address \
             and a positive multiple of 16 bytes"
        )));
    }
    Ok(codes + bytes)
}

/// The grid of grouped kernel `c` for `tokens` tokens of `shape`: grid y is the bound of the
/// kernel's own tile list, not the workspace's capacity (the 8-row list's: a one-tile-per-CTA
/// kernel of 64-row tiles at B = 4096 would otherwise launch 8x the CTAs it can use, the rest only
/// to read tile_count and exit). Refused when it passes CUDA's 65535 rows of CTAs (a call of more
/// tokens than a one-tile-per-CTA kernel of small tiles can take in one launch).
pub fn grouped_grid(
    c: &GroupedConfig,
    shape: &MoeShape,
    tokens: u32,
    sm_count: u32,
) -> Result<(u32, u32, u32), RuntimeError> {
    const MAX_GRID_Y: u32 = 65_535;
    let bound = list_tiles(tokens, shape.top_k, shape.experts, c.block_m);
    let grid = c.grid(shape, bound, sm_count);
    if grid.1 > MAX_GRID_Y {
        return Err(RuntimeError::InvalidArgument(format!(
            "{c}: {tokens} tokens x top_k {} over {} experts need {} rows of CTAs, past CUDA's \
             {MAX_GRID_Y}; launch fewer tokens per call",
            shape.top_k, shape.experts, grid.1
        )));
    }
    Ok(grid)
}

/// CTAs of a finalize kernel (FINALIZE_THREADS threads, `registers` per thread, no shared
/// memory) that one SM holds, given the SM's (threads, registers); registers are allocated per
/// thread in multiples of 8.
fn finalize_ctas_per_sm(registers: u32, (sm_threads, sm_registers): (u32, u32)) -> u32 {
    let per_cta = FINALIZE_THREADS * registers.max(1).next_multiple_of(8);
    (sm_registers / per_cta).min(sm_threads / FINALIZE_THREADS).max(1)
}

#[path = "moe_args.rs"]
mod args;
pub use args::{max_tokens_of, MoeArgs, MoeWorkspace, WorkspaceLayout};
#[path = "moe_routes.rs"]
mod routes;
pub use routes::{nearest_bucket, MoeOps, MoeRoutes, MoeRuntime};

/// The routing kernels' parameters for `args` over `ws` (tile lists from list 0).
fn align_params(args: &MoeArgs, ws: &MoeWorkspace) -> MoeAlignParams {
    let (tiles, count) = ws.tiles(0);
    MoeAlignParams {
        topk_ids: args.topk_ids,
        offsets: ws.offsets(),
        sorted_ids: ws.sorted_ids(),
        inverse: ws.inverse(),
        tiles,
        tile_count: count,
        tokens: args.tokens as i32,
        top_k: ws.shape.top_k as i32,
        expert_begin: args.expert_begin,
        experts: ws.shape.experts as i32,
        max_tiles: ws.layout.max_tiles as i32,
    }
}

/// The quantizer's parameters and launch shape for X of `args` into `ws`'s X regions.
fn quantize_x_params(
    args: &MoeArgs,
    ws: &MoeWorkspace,
) -> Result<(QuantizeParams, LaunchDims), RuntimeError> {
    let (codes, sf) = ws.x_fp4();
    let p = QuantizeParams {
        x: args.x,
        codes,
        sf,
        m: args.tokens as i32,
        k: ws.shape.hidden as i32,
        input_scale: args.x_scale,
    };
    let dims = quantize::launch_dims(args.tokens as usize, ws.shape.hidden as usize)
        .map_err(|e| RuntimeError::InvalidArgument(format!("quantizing X of the layer: {e}")))?;
    Ok((p, dims))
}

/// Launches of the layer's kernels on a raw stream (the caller's or the Gpu's own).
#[derive(Debug, Clone, Copy)]
pub struct MoeLauncher<'a> {
    pub gpu: &'a Gpu,
    pub kernels: &'a MoeKernels,
}

impl MoeLauncher<'_> {
    /// moe_align of `args.topk_ids` into `ws`, in the form the layer takes for its routed ids
    /// (`AlignForm::for_ids`).
    ///
    /// # Safety
    /// `args.topk_ids` must hold `tokens * top_k` i32 on this device, `ws` be this device's, and
    /// both stay alive until the work on `stream` completes; `stream` 0 or a live stream of the
    /// device's primary context.
    pub unsafe fn align(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        let form = AlignForm::for_ids(args.tokens * ws.shape.top_k);
        // SAFETY: the caller's contract.
        unsafe { self.align_as(form, args, ws, stream) }
    }

    /// moe_align in the given form (both write the same schedule; `bench` times both).
    ///
    /// # Safety
    /// As `align`.
    pub unsafe fn align_as(
        &self,
        form: AlignForm,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        let p = align_params(args, ws);
        let dims =
            |ctas| LaunchDims { grid: (ctas, 1, 1), block: (ALIGN_THREADS, 1, 1), smem_bytes: 0 };
        // The workspace regions are sized for max_tokens >= tokens (MoeArgs::validate), max_tiles
        // and the chunks of max_tokens' ids; the chunked form's launches run in order on the one
        // stream.
        match form {
            AlignForm::OneCta => {
                // SAFETY: the one-CTA kernel takes one MoeAlignParams; ids and workspace per the
                // contract above.
                unsafe {
                    self.gpu.launch_params_on_stream(&self.kernels.align, dims(1), &p, stream)
                }?
            }
            AlignForm::Chunked => {
                let q = MoeAlignChunkParams { align: p, base: ws.chunk_base() };
                let chunks = align_chunks(args.tokens * ws.shape.top_k);
                for (kernel, ctas) in [
                    (&self.kernels.align_count, chunks),
                    (&self.kernels.align_scan, 1),
                    (&self.kernels.align_place, chunks),
                ] {
                    // SAFETY: the chunked kernels take one MoeAlignChunkParams, whose base region
                    // holds `chunks` rows of the experts; ids and workspace per the contract above.
                    unsafe { self.gpu.launch_params_on_stream(kernel, dims(ctas), &q, stream) }?;
                }
            }
        }
        Ok(())
    }

    /// W4A4: `args.x` quantized with `args.x_scale` into the workspace's X codes and scales
    /// (the activation quantizer of `template::quantize`, bit for bit the CPU one).
    ///
    /// # Safety
    /// As `align`; `args.x` must hold `tokens * hidden` bf16 on this device.
    pub unsafe fn quantize_x(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        let (p, dims) = quantize_x_params(args, ws)?;
        // SAFETY: the quantizer takes one QuantizeParams; x holds tokens * hidden bf16 (contract
        // above), the workspace's X regions hold max_tokens >= tokens rows (MoeArgs::validate).
        unsafe { self.gpu.launch_params_on_stream(&self.kernels.quantize, dims, &p, stream) }?;
        Ok(())
    }

    /// The one launch of `align` and `quantize_x` for `args` (`align_quantize_x`): W4A4 with bf16
    /// X, a routing of the one-CTA form, and every CTA of the launch in one wave at one CTA per SM
    /// (1024 threads at 46-48 registers each take more than half of an SM's 64 Ki registers, so
    /// no CTA waits for another); `None` otherwise (prefill: two launches).
    fn fused_launch(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
    ) -> Option<(MoeAlignQuantizeParams, LaunchDims)> {
        if !args.quantizes_x()
            || AlignForm::for_ids(args.tokens * ws.shape.top_k) != AlignForm::OneCta
        {
            return None;
        }
        let (quant, _) = quantize_x_params(args, ws).ok()?;
        // the quantizer's threads (one per padded scale byte) in CTAs of ALIGN_THREADS
        let threads = quantize::sf_bytes(args.tokens as usize, ws.shape.hidden as usize) as u64;
        let quant_ctas = threads.div_ceil(ALIGN_THREADS as u64);
        if quant_ctas >= self.gpu.info().sm_count as u64 {
            return None;
        }
        let p = MoeAlignQuantizeParams {
            align: align_params(args, ws),
            quant,
            quant_ctas: quant_ctas as i32,
        };
        let grid = (quant_ctas as u32 + 1, 1, 1);
        Some((p, LaunchDims { grid, block: (ALIGN_THREADS, 1, 1), smem_bytes: 0 }))
    }

    /// The quantizer's CTAs when `align` and `quantize_x` of `args` run as one launch
    /// (`fused_launch` says when), else `None`.
    pub fn fused_quantize_ctas(&self, args: &MoeArgs, ws: &MoeWorkspace) -> Option<u32> {
        self.fused_launch(args, ws).map(|(p, _)| p.quant_ctas as u32)
    }

    /// `align` in its one-CTA form and `quantize_x` in one launch: the quantizer's CTAs, with
    /// `ALIGN_THREADS` threads each, and one more CTA that routes. Writes what the two write.
    /// Refused where `fused_quantize_ctas` says no.
    ///
    /// # Safety
    /// As `quantize_x`.
    pub unsafe fn align_quantize_x(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        let launch = self.fused_launch(args, ws).ok_or_else(|| {
            RuntimeError::InvalidArgument(format!(
                "routing and quantizing X of {} tokens in one launch: needs W4A4 with bf16 X, \
                 the one-CTA routing and at most one wave of CTAs",
                args.tokens
            ))
        })?;
        // SAFETY: forwarded (see the function's contract).
        unsafe { self.launch_fused(launch, stream) }
    }

    /// Launch what `fused_launch` prepared.
    ///
    /// # Safety
    /// As `quantize_x`, for the arguments `fused_launch` was given.
    unsafe fn launch_fused(
        &self,
        (p, dims): (MoeAlignQuantizeParams, LaunchDims),
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        // SAFETY: the kernel takes one MoeAlignQuantizeParams; ids, X and workspace as for
        // `align` and `quantize_x` (contract above).
        unsafe {
            self.gpu.launch_params_on_stream(&self.kernels.align_quantize, dims, &p, stream)
        }?;
        Ok(())
    }

    /// One grouped projection with `kernel` over the schedule in `ws` (written by `align` for
    /// the same tokens). W4A4: gate_up reads `args.x_fp4` / `args.x_sf`, or the X `quantize_x`
    /// wrote into `ws` when they are 0, and writes H in bf16 and NVFP4; down reads the NVFP4 H.
    ///
    /// # Safety
    /// As `align`; the weights, alphas and (gate_up) X must be this device's buffers of the
    /// layer's shapes for `ws.shape.experts` experts.
    pub unsafe fn grouped(
        &self,
        kernel: &GroupedKernel,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        let c = &kernel.config;
        let shape = &ws.shape;
        let (n, k) = shape.nk(c.op);
        let family = self.kernels.family;
        if c.a_type != args.a_type() || c.family != family {
            return Err(RuntimeError::InvalidArgument(format!(
                "{c}: a {} {} kernel cannot run a {} call on this device (family {family})",
                c.family,
                c.a_type,
                args.a_type()
            )));
        }
        let list = TILE_BLOCK_M.iter().position(|&b| b == c.block_m).ok_or_else(|| {
            RuntimeError::InvalidArgument(format!("{c}: block_m has no tile list"))
        })?;
        let (tiles, tile_count) = ws.tiles(list);
        let (h_codes, h_sf) = ws.h_fp4();
        let x_fp4 = if args.x_fp4 != 0 { (args.x_fp4, args.x_sf) } else { ws.x_fp4() };
        let w4a4 = c.a_type == AType::Nvfp4;
        let ((a, a_sf), w, w_sf, alpha, y) = match c.op {
            MoeOp::GateUp => (
                if w4a4 { x_fp4 } else { (args.x, 0) },
                args.w13,
                args.w13_sf,
                args.alpha13,
                ws.h(),
            ),
            MoeOp::Down => (
                if w4a4 { (h_codes, h_sf) } else { (ws.h(), 0) },
                args.w2,
                args.w2_sf,
                args.alpha2,
                ws.y_rows(),
            ),
        };
        let writes_h_fp4 = w4a4 && c.op == MoeOp::GateUp;
        let p = MoeGroupedParams {
            a,
            a_sf,
            w,
            w_sf,
            alpha,
            y,
            sorted_ids: ws.sorted_ids(),
            tiles,
            tile_count,
            h_codes: if writes_h_fp4 { h_codes } else { 0 },
            h_sf: if writes_h_fp4 { h_sf } else { 0 },
            h_scale: if writes_h_fp4 { args.h_scale } else { 0.0 },
            n: n as i32,
            k: k as i32,
            top_k: shape.top_k as i32,
        };
        let dims = LaunchDims {
            grid: grouped_grid(c, shape, args.tokens, self.gpu.info().sm_count)?,
            block: (c.threads(), 1, 1),
            smem_bytes: c.smem_bytes(),
        };
        match family {
            Family::Sm90 => {
                // SAFETY: an sm90 grouped kernel takes one MoeGroupedParams; grid y <= its list's
                // bound <= max_tiles of `tokens` <= the workspace's capacity; the workspace's H
                // and X regions hold its max_tokens; the caller's buffers per the contract above.
                unsafe { self.gpu.launch_params_on_stream(&kernel.kernel, dims, &p, stream) }?
            }
            Family::Sm120 => {
                let (partials, counters, floats, words) = ws.split();
                let p = MoeGroupedSm120Params {
                    grouped: p,
                    partials,
                    counters,
                    split_tiles: crate::moe::sm120::split_tiles(c, shape, floats, words) as i32,
                };
                // SAFETY: as above, with one MoeGroupedSm120Params; the kernel's partials and
                // counters of at most split_tiles tiles lie inside the workspace's split-K
                // regions (moe::sm120::split_tiles), whose counters are zero between launches.
                unsafe { self.gpu.launch_params_on_stream(&kernel.kernel, dims, &p, stream) }?
            }
        }
        Ok(())
    }

    /// moe_finalize: `args.y` from the per-row outputs in `ws`.
    ///
    /// # Safety
    /// As `grouped`; `args.topk_weights` holds `tokens * top_k` f32 and `args.y` `tokens * hidden`
    /// bf16.
    pub unsafe fn finalize(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        let n = ws.shape.hidden;
        let p = MoeFinalizeParams {
            rows: ws.y_rows(),
            weights: args.topk_weights,
            inverse: ws.inverse(),
            y: args.y,
            tokens: args.tokens as i32,
            top_k: ws.shape.top_k as i32,
            n: n as i32,
        };
        let grid = (args.tokens, n.div_ceil(FINALIZE_THREADS * 8), 1);
        let dims = LaunchDims { grid, block: (FINALIZE_THREADS, 1, 1), smem_bytes: 0 };
        // the grouped kernel when its grid fits in one wave of it, else the one-slot kernel
        let kernel = if grid.0 * grid.1 <= self.kernels.finalize_grouped_wave {
            &self.kernels.finalize_grouped
        } else {
            &self.kernels.finalize_single
        };
        // SAFETY: the finalize kernels take one MoeFinalizeParams; hidden % 8 == 0 (checked when
        // the layer was built), buffers per the contract above.
        unsafe { self.gpu.launch_params_on_stream(kernel, dims, &p, stream) }?;
        Ok(())
    }

    /// One projection's stacked expert codes (`stack` at `codes`) into the layout this family's
    /// grouped kernels read (`back` false) or back into the ModelOpt layout (`back` true), in
    /// place, on `stream`, through a scratch copy of up to `ORDER_SCRATCH_BYTES` (at least one
    /// expert) that lives for the call: it returns once `stream` has finished the work. Nothing to
    /// do for a family that reads the ModelOpt layout.
    ///
    /// # Safety
    /// `codes` must be `stack.bytes()` bytes of this device, alive and not read or written by
    /// other work until the call returns; `stream` 0 or a live stream of the device's primary
    /// context, not capturing.
    pub unsafe fn order_weights(
        &self,
        codes: u64,
        stack: CodeStack,
        back: bool,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        check_codes(codes, stack)?;
        if WeightOrder::of(self.kernels.family) == WeightOrder::ModelOpt {
            return Ok(());
        }
        let expert = stack.expert_bytes();
        let per_pass =
            (ORDER_SCRATCH_BYTES / expert).clamp(1, u64::from(stack.experts).min(65_535));
        let scratch = self.gpu.alloc_zeros::<u8>((per_pass * expert) as usize)?;
        // the allocation's zero fill runs on the Gpu's own stream: done before `stream` copies
        self.gpu.synchronize()?;
        let units = u64::from(stack.n) * u64::from(stack.k) / 16; // 8-byte units per expert
        let ctas = units.div_ceil(u64::from(ORDER_THREADS)).min(1024) as u32;
        let kernel = if back { &self.kernels.order_back } else { &self.kernels.order };
        let mut first = 0u64;
        while first < u64::from(stack.experts) {
            let count = per_pass.min(u64::from(stack.experts) - first);
            let at = codes + first * expert;
            let dims = LaunchDims {
                grid: (ctas, count as u32, 1),
                block: (ORDER_THREADS, 1, 1),
                smem_bytes: 0,
            };
            let p = MoeOrderParams {
                src: scratch.ptr(),
                dst: at,
                n: stack.n as i32,
                k: stack.k as i32,
                op: op_code(stack.op),
            };
            // SAFETY: the scratch holds `count` experts; `at` is `count` experts of the caller's
            // codes (the contract above); the order kernels take one MoeOrderParams and touch
            // experts [0, grid y) of src and dst, one 8-byte unit per thread.
            unsafe {
                self.gpu.copy_on_stream(scratch.ptr(), at, count * expert, stream)?;
                self.gpu.launch_params_on_stream(kernel, dims, &p, stream)?;
            }
            first += count;
        }
        // SAFETY: the stream per the contract above; the scratch is freed after its last use.
        unsafe { self.gpu.synchronize_stream(stream) }?;
        drop(scratch);
        Ok(())
    }

    /// What `layer` refuses before it enqueues anything: the arguments against `ws`, and either
    /// projection's grid.
    pub fn check_layer(
        &self,
        gate_up: &GroupedKernel,
        down: &GroupedKernel,
        args: &MoeArgs,
        ws: &MoeWorkspace,
    ) -> Result<(), RuntimeError> {
        args.validate(ws)?;
        for k in [gate_up, down] {
            grouped_grid(&k.config, &ws.shape, args.tokens, self.gpu.info().sm_count)?;
        }
        Ok(())
    }

    /// The whole layer: align, (W4A4 with bf16 X) the quantization of X, gate_up, down,
    /// finalize, in order on `stream`; align and the quantization of X in one launch where
    /// `fused_launch` allows it.
    ///
    /// # Safety
    /// As `grouped` and `finalize`.
    pub unsafe fn layer(
        &self,
        gate_up: &GroupedKernel,
        down: &GroupedKernel,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        self.check_layer(gate_up, down, args, ws)?;
        // SAFETY: forwarded (see the function's contract).
        unsafe { self.enqueue_layer(gate_up, down, args, ws, stream) }
    }

    /// [`MoeLauncher::layer`] for arguments that passed [`MoeLauncher::check_layer`] (a caller
    /// that must act between the check and the first launch).
    ///
    /// # Safety
    /// As `layer`.
    pub(in crate::runtime) unsafe fn enqueue_layer(
        &self,
        gate_up: &GroupedKernel,
        down: &GroupedKernel,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        // SAFETY: forwarded (see the function's contract).
        unsafe {
            if let Some(launch) = self.fused_launch(args, ws) {
                self.launch_fused(launch, stream)?;
            } else {
                self.align(args, ws, stream)?;
                if args.quantizes_x() {
                    self.quantize_x(args, ws, stream)?;
                }
            }
            self.grouped(gate_up, args, ws, stream)?;
            self.grouped(down, args, ws, stream)?;
            self.finalize(args, ws, stream)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_grids_stay_within_the_grid_y_limit() {
        let shape = MoeShape::GLM5_TP8;
        let one_tile = GroupedConfig::tiled(MoeOp::GateUp, [16, 64, 128], [1, 2], 2, 1);
        let small = GroupedConfig { block_m: 8, ..one_tile };
        // 8-row tiles: 256 + tokens rows of CTAs at top_k 8
        assert_eq!(grouped_grid(&small, &shape, 65_279, 132).unwrap().1, 65_535);
        let e = grouped_grid(&small, &shape, 65_280, 132).unwrap_err().to_string();
        assert!(e.contains("65536 rows of CTAs") && e.contains("65535"), "{e}");
        // 16-row tiles take twice the tokens; a persistent walk is clamped to the SMs
        assert!(grouped_grid(&one_tile, &shape, 65_536, 132).is_ok());
        let walk = GroupedConfig { walk: 2, ..small };
        assert!(grouped_grid(&walk, &shape, 1 << 20, 132).unwrap().1 <= 2 * 132);
    }

    #[test]
    fn finalize_ctas_per_sm_follow_registers_and_threads() {
        // H200 (2048 threads, 64 Ki registers per SM) and SM120 (1536 threads)
        let (h200, sm120) = ((2048, 65_536), (1536, 65_536));
        assert_eq!(finalize_ctas_per_sm(60, h200), 4);
        assert_eq!(finalize_ctas_per_sm(64, h200), 4);
        assert_eq!(finalize_ctas_per_sm(40, h200), 6);
        assert_eq!(finalize_ctas_per_sm(32, h200), 8);
        assert_eq!(finalize_ctas_per_sm(32, sm120), 6);
        assert_eq!(finalize_ctas_per_sm(60, sm120), 4);
        assert_eq!(finalize_ctas_per_sm(255, h200), 1);
        assert_eq!(finalize_ctas_per_sm(0, h200), 8);
    }
}
