//! The grouped MoE layer at run time: `moe_align`, the grouped `gate_up` and `down` kernels chosen
//! per token count, and `moe_finalize`, launched on the caller's stream with no allocation and no
//! synchronization. W4A16 reads bf16 X; W4A4 (`MoeArgs::w4a4`) reads X as NVFP4 (the caller's, or
//! quantized into the workspace by the activation quantizer first), and its gate_up writes H as
//! NVFP4 too, which down reads.
//!
//! Scratch memory (the routed-row schedule, `H` in bf16 and NVFP4, the quantized X, the per-row
//! outputs) lives in a [`MoeWorkspace`] the caller creates once per stream, sized at creation for a
//! maximum token count: launches on different streams, each with its own workspace, never share
//! scratch (two micro-batches on two streams stay correct). `bench` and `tune` launch through the
//! same code.

use super::error::RuntimeError;
use crate::compile::Compiler;
use crate::gpu::moe_params::{MoeAlignParams, MoeFinalizeParams, MoeGroupedParams};
use crate::gpu::params::QuantizeParams;
use crate::gpu::raw::RawStream;
use crate::gpu::{DeviceBuf, Gpu, Kernel, LaunchDims};
use crate::moe::config::{
    align_source, finalize_source, ALIGN_THREADS, FINALIZE_GROUPED_SLOTS, FINALIZE_THREADS,
};
use crate::moe::{max_tiles, GroupedConfig, MoeOp, MoeShape, TILE_BLOCK_M};
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

    /// Load `config`'s compiled kernel; one that spills registers is refused.
    pub fn from_compiled(
        gpu: &Gpu,
        config: GroupedConfig,
        compiled: &crate::compile::CompiledKernel,
    ) -> Result<Self, RuntimeError> {
        if compiled.stats.as_ref().is_some_and(|s| s.spills()) {
            return Err(RuntimeError::Render {
                config: config.name(),
                reason: "the kernel spills registers to local memory".into(),
            });
        }
        Ok(Self { config, kernel: gpu.load(compiled, config.smem_bytes())? })
    }
}

/// The fixed kernels of the layer (routing, the activation quantizer of W4A4, finalize).
#[derive(Debug)]
pub struct MoeKernels {
    /// The device's kernel family: the grouped kernels a launcher runs must be of it.
    pub family: Family,
    align: Kernel,
    quantize: Kernel,
    /// The finalize kernel that reads a token's slots in groups (`FINALIZE_GROUPED_SLOTS`), and
    /// the one that reads one slot at a time.
    finalize_grouped: Kernel,
    finalize_single: Kernel,
    /// CTAs of `finalize_grouped` that one SM holds at its register count.
    finalize_grouped_ctas: u32,
}

impl MoeKernels {
    pub fn load(gpu: &Gpu, compiler: &Compiler) -> Result<Self, RuntimeError> {
        let compile = |src: crate::template::KernelSource| {
            compiler
                .compile(&src)
                .map_err(|error| RuntimeError::Compile { config: src.kernel_name.clone(), error })
        };
        let load = |src| -> Result<Kernel, RuntimeError> { Ok(gpu.load(&*compile(src)?, 0)?) };
        let family = crate::runtime::family_for(gpu.info())?;
        let arch = family.arch();
        let quantizer = quantize::render(arch).map_err(|e| RuntimeError::Render {
            config: quantize::QUANTIZE_KERNEL.into(),
            reason: e.to_string(),
        })?;
        let grouped = compile(finalize_source(arch, FINALIZE_GROUPED_SLOTS))?;
        // ptxas reports the registers (no report: assume the cap of one CTA per SM's threads)
        let registers = grouped.stats.map_or(255, |s| s.registers);
        Ok(Self {
            family,
            align: load(align_source(arch))?,
            quantize: load(quantizer)?,
            finalize_grouped: gpu.load(&*grouped, 0)?,
            finalize_single: load(finalize_source(arch, 1))?,
            finalize_grouped_ctas: finalize_ctas_per_sm(registers, gpu.sm_limits()?),
        })
    }
}

/// CTAs of a finalize kernel (FINALIZE_THREADS threads, `registers` per thread, no shared
/// memory) that one SM holds, given the SM's (threads, registers); registers are allocated per
/// thread in multiples of 8.
fn finalize_ctas_per_sm(registers: u32, (sm_threads, sm_registers): (u32, u32)) -> u32 {
    let per_cta = FINALIZE_THREADS * registers.max(1).next_multiple_of(8);
    (sm_registers / per_cta).min(sm_threads / FINALIZE_THREADS).max(1)
}

/// Byte offsets of one workspace's regions (each 256-byte aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceLayout {
    pub max_tokens: u32,
    pub max_tiles: u32,
    pub offsets: usize,
    pub sorted_ids: usize,
    pub inverse: usize,
    pub tiles: usize,
    pub tile_count: usize,
    pub h: usize,
    pub y_rows: usize,
    /// W4A4: X quantized by the layer (codes `[tokens, hidden/2]`, swizzled scales).
    pub x_codes: usize,
    pub x_sf: usize,
    /// W4A4: H as NVFP4 (codes `[rows, inter/2]`, swizzled scales over the sorted rows).
    pub h_codes: usize,
    pub h_sf: usize,
    pub bytes: usize,
}

impl WorkspaceLayout {
    pub fn new(shape: &MoeShape, max_tokens: u32) -> Self {
        let align = |x: usize| x.div_ceil(256) * 256;
        let rows = max_tokens as usize * shape.top_k as usize;
        let max_tiles = max_tiles(max_tokens, shape.top_k, shape.experts);
        let mut at = 0usize;
        let mut region = |bytes: usize| {
            let start = at;
            at = align(at + bytes.max(1));
            start
        };
        let offsets = region((shape.experts as usize + 1) * 4);
        let sorted_ids = region(rows * 4);
        let inverse = region(rows * 4);
        let tiles = region(TILE_BLOCK_M.len() * max_tiles as usize * 16);
        let tile_count = region(TILE_BLOCK_M.len() * 4);
        let h = region(rows * shape.inter as usize * 2);
        let y_rows = region(rows * shape.hidden as usize * 2);
        let (tokens, hidden, inter) =
            (max_tokens as usize, shape.hidden as usize, shape.inter as usize);
        let x_codes = region(tokens * hidden / 2);
        let x_sf = region(crate::format::swizzled_len(tokens, hidden / 16));
        let h_codes = region(rows * inter / 2);
        let h_sf = region(crate::format::swizzled_len(rows, inter / 16));
        WorkspaceLayout {
            max_tokens,
            max_tiles,
            offsets,
            sorted_ids,
            inverse,
            tiles,
            tile_count,
            h,
            y_rows,
            x_codes,
            x_sf,
            h_codes,
            h_sf,
            bytes: at,
        }
    }
}

/// Scratch memory of one stream's MoE launches.
#[derive(Debug)]
pub struct MoeWorkspace {
    pub shape: MoeShape,
    pub layout: WorkspaceLayout,
    buf: DeviceBuf<u8>,
}

impl MoeWorkspace {
    pub fn new(gpu: &Gpu, shape: MoeShape, max_tokens: u32) -> Result<Self, RuntimeError> {
        if max_tokens == 0 {
            return Err(RuntimeError::InvalidArgument(
                "a MoE workspace needs max_tokens >= 1".into(),
            ));
        }
        let layout = WorkspaceLayout::new(&shape, max_tokens);
        let buf = gpu.alloc_zeros::<u8>(layout.bytes)?;
        // The zeroing runs on the dispatcher's own stream: finish it before the caller's stream
        // can launch into the workspace.
        gpu.synchronize()?;
        Ok(Self { shape, layout, buf })
    }

    /// The whole scratch buffer (for verification downloads).
    pub fn buffer(&self) -> &DeviceBuf<u8> {
        &self.buf
    }

    fn at(&self, offset: usize) -> u64 {
        self.buf.ptr() + offset as u64
    }

    /// Device address of the sorted-order `H` rows (`[rows, inter]` bf16).
    pub fn h(&self) -> u64 {
        self.at(self.layout.h)
    }

    /// Device address of the per-row down outputs (`[rows, hidden]` bf16, sorted order).
    pub fn y_rows(&self) -> u64 {
        self.at(self.layout.y_rows)
    }

    /// Device addresses of X quantized by a W4A4 layer (codes, swizzled scales).
    pub fn x_fp4(&self) -> (u64, u64) {
        (self.at(self.layout.x_codes), self.at(self.layout.x_sf))
    }

    /// Device addresses of H as NVFP4 (codes `[rows, inter/2]`, swizzled scales), W4A4.
    pub fn h_fp4(&self) -> (u64, u64) {
        (self.at(self.layout.h_codes), self.at(self.layout.h_sf))
    }

    /// Device address of the inverse map (`[tokens * top_k]` i32).
    pub fn inverse(&self) -> u64 {
        self.at(self.layout.inverse)
    }

    /// Device address of the offsets (`[experts + 1]` i32).
    pub fn offsets(&self) -> u64 {
        self.at(self.layout.offsets)
    }

    /// Device address of the sorted ids (`[tokens * top_k]` i32).
    pub fn sorted_ids(&self) -> u64 {
        self.at(self.layout.sorted_ids)
    }

    /// Device address of tile list `list` and of its count.
    pub fn tiles(&self, list: usize) -> (u64, u64) {
        (
            self.at(self.layout.tiles + list * self.layout.max_tiles as usize * 16),
            self.at(self.layout.tile_count + list * 4),
        )
    }
}

/// Device addresses of one MoE layer call (see ARCHITECTURE.md "Data layout" per expert); also
/// the C ABI's `fp4tune_moe_args` (include/fp4tune.h), field for field. The fields after
/// `expert_begin` extend the struct for W4A4: all zero is the W4A16 layer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MoeArgs {
    /// bf16 `[tokens, hidden]`, 16-byte aligned (W4A4 with `x_fp4` set: unused, may be 0).
    pub x: u64,
    /// i32 `[tokens, top_k]` global expert ids.
    pub topk_ids: u64,
    /// f32 `[tokens, top_k]` router weights.
    pub topk_weights: u64,
    /// gate_up weights `[experts][2 inter, hidden/2]`, scales one swizzled block per expert,
    /// alphas f32 `[experts]` (W4A16: weight_scale_2; W4A4: x_scale * weight_scale_2).
    pub w13: u64,
    pub w13_sf: u64,
    pub alpha13: u64,
    /// down weights `[experts][hidden, inter/2]`, scales, alphas (W4A4: h_scale *
    /// weight_scale_2).
    pub w2: u64,
    pub w2_sf: u64,
    pub alpha2: u64,
    /// bf16 `[tokens, hidden]` output, 16-byte aligned.
    pub y: u64,
    pub tokens: u32,
    /// Global id of local expert 0 (expert parallelism), 0 otherwise.
    pub expert_begin: i32,
    /// Nonzero: W4A4 (NVFP4 activations for both projections); 0: W4A16 (bf16 activations, the
    /// fields below unused).
    pub w4a4: u32,
    /// W4A4: the input scale of X (gate_up's activation global scale) `x` is quantized with
    /// when `x_fp4` is 0.
    pub x_scale: f32,
    /// W4A4: the input scale of H (down's activation global scale) gate_up quantizes H with.
    pub h_scale: f32,
    /// Must be 0.
    pub reserved: u32,
    /// W4A4: X already in NVFP4, codes `[tokens, hidden/2]` (16-byte aligned) and swizzled
    /// scales (`fp4tune_scale_bytes(tokens, hidden)` bytes, 4-byte aligned); 0: the layer
    /// quantizes `x` into the workspace first.
    pub x_fp4: u64,
    pub x_sf: u64,
}

impl MoeArgs {
    /// The activation type the call asks for.
    pub fn a_type(&self) -> AType {
        if self.w4a4 != 0 {
            AType::Nvfp4
        } else {
            AType::Bf16
        }
    }

    /// Whether a W4A4 call hands over bf16 X for the layer to quantize.
    pub fn quantizes_x(&self) -> bool {
        self.w4a4 != 0 && self.x_fp4 == 0
    }

    /// Null pointers, alignment, scales and sizes against `ws`.
    pub fn validate(&self, ws: &MoeWorkspace) -> Result<(), RuntimeError> {
        self.check(ws.layout.max_tokens)
    }

    /// Null pointers, alignment, scales and sizes for a workspace of `max_tokens` tokens.
    pub fn check(&self, max_tokens: u32) -> Result<(), RuntimeError> {
        let rule = "x, y, the weight codes and x_fp4 16-byte aligned, ids, router weights, scales \
                    and alphas 4-byte";
        let mut pointers = vec![
            ("topk_ids", self.topk_ids, 4),
            ("topk_weights", self.topk_weights, 4),
            ("w13", self.w13, 16),
            ("w13_sf", self.w13_sf, 4),
            ("alpha13", self.alpha13, 4),
            ("w2", self.w2, 16),
            ("w2_sf", self.w2_sf, 4),
            ("alpha2", self.alpha2, 4),
            ("y", self.y, 16),
        ];
        if self.w4a4 != 0 && self.x_fp4 != 0 {
            pointers.push(("x_fp4", self.x_fp4, 16));
            pointers.push(("x_sf", self.x_sf, 4));
        } else {
            pointers.push(("x", self.x, 16));
        }
        for (what, p, a) in pointers {
            super::error::check_pointer(what, p, a, rule)?;
        }
        if self.tokens == 0 || self.tokens > max_tokens {
            return Err(RuntimeError::InvalidArgument(format!(
                "{} tokens: the workspace holds 1..={max_tokens}",
                self.tokens
            )));
        }
        if self.reserved != 0 {
            return Err(RuntimeError::InvalidArgument("`reserved` must be 0".into()));
        }
        if self.w4a4 != 0 {
            let good = |s: f32| s.is_finite() && s > 0.0;
            if !good(self.h_scale) || (self.x_fp4 == 0 && !good(self.x_scale)) {
                return Err(RuntimeError::InvalidArgument(format!(
                    "W4A4 needs positive finite input scales: h_scale {}, x_scale {} (used when \
                     x_fp4 is 0)",
                    self.h_scale, self.x_scale
                )));
            }
            if (self.x_fp4 == 0) != (self.x_sf == 0) {
                return Err(RuntimeError::InvalidArgument(
                    "W4A4: x_fp4 and x_sf are given together (or both 0: x is quantized)".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Launches of the layer's kernels on a raw stream (the caller's or the Gpu's own).
#[derive(Debug, Clone, Copy)]
pub struct MoeLauncher<'a> {
    pub gpu: &'a Gpu,
    pub kernels: &'a MoeKernels,
}

impl MoeLauncher<'_> {
    /// moe_align of `args.topk_ids` into `ws`.
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
        let (tiles, count) = ws.tiles(0);
        let p = MoeAlignParams {
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
        };
        let dims = LaunchDims { grid: (1, 1, 1), block: (ALIGN_THREADS, 1, 1), smem_bytes: 0 };
        // SAFETY: the align kernel takes one MoeAlignParams; the workspace regions are sized for
        // max_tokens >= tokens (MoeArgs::validate) and max_tiles; ids per the contract above.
        unsafe { self.gpu.launch_params_on_stream(&self.kernels.align, dims, &p, stream) }?;
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
        let (tokens, hidden) = (args.tokens as usize, ws.shape.hidden as usize);
        let (codes, sf) = ws.x_fp4();
        let p = QuantizeParams {
            x: args.x,
            codes,
            sf,
            m: args.tokens as i32,
            k: ws.shape.hidden as i32,
            input_scale: args.x_scale,
        };
        let dims = quantize::launch_dims(tokens, hidden).map_err(|e| {
            RuntimeError::InvalidArgument(format!("quantizing X of the layer: {e}"))
        })?;
        // SAFETY: the quantizer takes one QuantizeParams; x holds tokens * hidden bf16 (contract
        // above), the workspace's X regions hold max_tokens >= tokens rows (MoeArgs::validate).
        unsafe { self.gpu.launch_params_on_stream(&self.kernels.quantize, dims, &p, stream) }?;
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
        let max_tiles = max_tiles(args.tokens, shape.top_k, shape.experts);
        let dims = LaunchDims {
            grid: c.grid(shape, max_tiles, self.gpu.info().sm_count),
            block: (c.threads(), 1, 1),
            smem_bytes: c.smem_bytes(),
        };
        // SAFETY: the grouped kernel takes one MoeGroupedParams; grid y <= max_tiles of `tokens`
        // <= the workspace's capacity; the workspace's H and X regions hold its max_tokens; the
        // caller's buffers per the contract above.
        unsafe { self.gpu.launch_params_on_stream(&kernel.kernel, dims, &p, stream) }?;
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
        let one_wave = self.kernels.finalize_grouped_ctas * self.gpu.info().sm_count;
        let kernel = if grid.0 * grid.1 <= one_wave {
            &self.kernels.finalize_grouped
        } else {
            &self.kernels.finalize_single
        };
        // SAFETY: the finalize kernels take one MoeFinalizeParams; hidden % 8 == 0 (checked when
        // the layer was built), buffers per the contract above.
        unsafe { self.gpu.launch_params_on_stream(kernel, dims, &p, stream) }?;
        Ok(())
    }

    /// The whole layer: align, (W4A4 with bf16 X) the quantization of X, gate_up, down,
    /// finalize, in order on `stream`.
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
        args.validate(ws)?;
        // SAFETY: forwarded (see the function's contract).
        unsafe {
            self.align(args, ws, stream)?;
            if args.quantizes_x() {
                self.quantize_x(args, ws, stream)?;
            }
            self.grouped(gate_up, args, ws, stream)?;
            self.grouped(down, args, ws, stream)?;
            self.finalize(args, ws, stream)
        }
    }
}

/// The kernels of one layer shape and activation type, chosen per token count: (bucket, index
/// into `kernels`) per op, buckets ascending; a token count takes the nearest bucket in log scale
/// (ties: the larger). Buckets that chose the same configuration share one loaded kernel.
#[derive(Debug)]
pub struct MoeRoutes {
    pub shape: MoeShape,
    pub a_type: AType,
    kernels: Vec<GroupedKernel>,
    gate_up: Vec<(u32, usize)>,
    down: Vec<(u32, usize)>,
}

impl MoeRoutes {
    /// Load every (op, bucket, config) of one shape and activation type: the distinct
    /// configurations compiled in parallel, each loaded once.
    pub fn load(
        gpu: &Gpu,
        compiler: &Compiler,
        shape: MoeShape,
        a_type: AType,
        choices: &[(MoeOp, u32, GroupedConfig)],
    ) -> Result<Self, RuntimeError> {
        if shape.hidden % 16 != 0 || shape.inter % 16 != 0 {
            return Err(RuntimeError::InvalidArgument(format!(
                "{shape}: hidden and inter must be multiples of 16"
            )));
        }
        let family = crate::runtime::family_for(gpu.info())?;
        let mut configs: Vec<GroupedConfig> = Vec::new();
        for (_, _, c) in choices {
            c.check(&shape)
                .map_err(|e| RuntimeError::Render { config: c.name(), reason: e.reason })?;
            if c.a_type != a_type || c.family != family {
                return Err(RuntimeError::Render {
                    config: c.name(),
                    reason: format!(
                        "a {} {} kernel in the {} {family} routes",
                        c.family, c.a_type, a_type
                    ),
                });
            }
            if !configs.contains(c) {
                configs.push(*c);
            }
        }
        let sources: Vec<_> = configs.iter().map(|c| c.source()).collect();
        let mut kernels = Vec::with_capacity(configs.len());
        for ((c, src), r) in configs.iter().zip(&sources).zip(compiler.compile_many(&sources)) {
            let compiled = r.map_err(|error| RuntimeError::Compile {
                config: src.kernel_name.clone(),
                error,
            })?;
            kernels.push(GroupedKernel::from_compiled(gpu, *c, &compiled)?);
        }
        let index =
            |c: &GroupedConfig| configs.iter().position(|x| x == c).expect("collected above");
        let mut routes =
            MoeRoutes { shape, a_type, kernels, gate_up: Vec::new(), down: Vec::new() };
        for (op, bucket, config) in choices {
            let k = index(config);
            match op {
                MoeOp::GateUp => routes.gate_up.push((*bucket, k)),
                MoeOp::Down => routes.down.push((*bucket, k)),
            }
        }
        routes.gate_up.sort_by_key(|(b, _)| *b);
        routes.down.sort_by_key(|(b, _)| *b);
        if routes.gate_up.is_empty() || routes.down.is_empty() {
            return Err(RuntimeError::InvalidArgument(format!(
                "{shape} ({a_type}): the table has no grouped gate_up or down entry"
            )));
        }
        Ok(routes)
    }

    /// The kernel for `tokens` of `op`.
    pub fn pick(&self, op: MoeOp, tokens: u32) -> &GroupedKernel {
        let list = match op {
            MoeOp::GateUp => &self.gate_up,
            MoeOp::Down => &self.down,
        };
        &self.kernels[list[nearest_bucket(list.iter().map(|(b, _)| *b), tokens)].1]
    }
}

/// Index of the bucket nearest to `tokens` in log scale (ties: the larger); `buckets` ascending,
/// not empty.
pub fn nearest_bucket(buckets: impl Iterator<Item = u32>, tokens: u32) -> usize {
    let t = (tokens.max(1) as f64).ln();
    let mut best = (f64::INFINITY, 0usize);
    for (i, b) in buckets.enumerate() {
        let d = ((b.max(1) as f64).ln() - t).abs();
        if d <= best.0 {
            best = (d, i);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn workspace_regions_are_aligned_disjoint_and_sized_for_max_tokens() {
        let shape = MoeShape::GLM5_TP8;
        let l = WorkspaceLayout::new(&shape, 256);
        let regions = [
            (l.offsets, 257 * 4),
            (l.sorted_ids, 2048 * 4),
            (l.inverse, 2048 * 4),
            (l.tiles, TILE_BLOCK_M.len() * l.max_tiles as usize * 16),
            (l.tile_count, TILE_BLOCK_M.len() * 4),
            (l.h, 2048 * 256 * 2),
            (l.y_rows, 2048 * 6144 * 2),
            (l.x_codes, 256 * 3072),
            (l.x_sf, 256 * 384),
            (l.h_codes, 2048 * 128),
            (l.h_sf, 2048 * 16),
        ];
        for w in regions.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{regions:?}");
        }
        assert!(regions.iter().all(|(o, _)| o % 256 == 0));
        assert!(l.h_sf + 2048 * 16 <= l.bytes);
        // scale regions are padded to 128 rows: 3 tokens still take 128 rows of X scales
        let small = WorkspaceLayout::new(&shape, 3);
        assert!(small.x_sf + 128 * 384 <= small.h_codes);
        assert_eq!(l.max_tiles, 256 + 256);
    }

    #[test]
    fn moe_args_have_the_layout_of_the_c_struct() {
        use std::mem::{offset_of, size_of};
        // the W4A16 fields keep their offsets; the W4A4 ones follow
        assert_eq!(size_of::<MoeArgs>(), 120);
        assert_eq!(offset_of!(MoeArgs, y), 72);
        assert_eq!(offset_of!(MoeArgs, tokens), 80);
        assert_eq!(offset_of!(MoeArgs, expert_begin), 84);
        assert_eq!(offset_of!(MoeArgs, w4a4), 88);
        assert_eq!(offset_of!(MoeArgs, x_scale), 92);
        assert_eq!(offset_of!(MoeArgs, h_scale), 96);
        assert_eq!(offset_of!(MoeArgs, reserved), 100);
        assert_eq!(offset_of!(MoeArgs, x_fp4), 104);
        assert_eq!(offset_of!(MoeArgs, x_sf), 112);
        let header = include_str!("../../../include/fp4tune.h");
        let body = &header[header.find("typedef struct fp4tune_moe_args {").unwrap()..];
        let body = &body[..body.find("} fp4tune_moe_args;").unwrap()];
        let fields: Vec<&str> = body
            .lines()
            .skip(1)
            .filter_map(|l| l.split(';').next()?.split_whitespace().last())
            .collect();
        assert_eq!(
            fields,
            [
                "x",
                "topk_ids",
                "topk_weights",
                "w13",
                "w13_sf",
                "alpha13",
                "w2",
                "w2_sf",
                "alpha2",
                "y",
                "tokens",
                "expert_begin",
                "w4a4",
                "x_scale",
                "h_scale",
                "reserved",
                "x_fp4",
                "x_sf"
            ]
        );
    }

    #[test]
    fn w4a4_arguments_need_their_scales_and_either_x_or_its_nvfp4_form() {
        let base = MoeArgs {
            x: 0x1000,
            topk_ids: 0x2000,
            topk_weights: 0x3000,
            w13: 0x4000,
            w13_sf: 0x5000,
            alpha13: 0x6000,
            w2: 0x7000,
            w2_sf: 0x8000,
            alpha2: 0x9000,
            y: 0xa000,
            tokens: 4,
            ..MoeArgs::default()
        };
        base.check(8).unwrap();
        assert_eq!((base.a_type(), base.quantizes_x()), (AType::Bf16, false));
        let err = |a: MoeArgs| a.check(8).unwrap_err().to_string();
        assert!(err(MoeArgs { tokens: 9, ..base }).contains("1..=8"));
        assert!(err(MoeArgs { reserved: 1, ..base }).contains("reserved"));
        let w4a4 = MoeArgs { w4a4: 1, x_scale: 0.01, h_scale: 0.5, ..base };
        w4a4.check(8).unwrap();
        assert_eq!((w4a4.a_type(), w4a4.quantizes_x()), (AType::Nvfp4, true));
        assert!(err(MoeArgs { h_scale: 0.0, ..w4a4 }).contains("h_scale"));
        assert!(err(MoeArgs { x_scale: f32::NAN, ..w4a4 }).contains("x_scale"));
        // X already quantized: x may be 0 and x_scale is not used; codes and scales together
        let given = MoeArgs { x: 0, x_scale: 0.0, x_fp4: 0xb000, x_sf: 0xc000, ..w4a4 };
        given.check(8).unwrap();
        assert!(!given.quantizes_x());
        assert!(err(MoeArgs { x_fp4: 0xb008, ..given }).contains("`x_fp4`"));
        assert!(err(MoeArgs { x_sf: 0, ..given }).contains("null device pointer `x_sf`"));
        assert!(err(MoeArgs { x_fp4: 0, x_scale: 0.01, x: 0x1000, ..given }).contains("together"));
        // W4A16 ignores the W4A4 fields but needs x
        assert!(err(MoeArgs { x: 0, ..base }).contains("`x`"));
    }

    #[test]
    fn token_counts_take_the_nearest_bucket_in_log_scale() {
        let b = [1u32, 8, 64, 256];
        let pick = |t| b[nearest_bucket(b.iter().copied(), t)];
        assert_eq!(pick(1), 1);
        assert_eq!(pick(2), 1);
        assert_eq!(pick(3), 8);
        assert_eq!(pick(8), 8);
        assert_eq!(pick(20), 8);
        assert_eq!(pick(23), 64);
        assert_eq!(pick(100), 64);
        assert_eq!(pick(4096), 256);
    }
}

/// The grouped layers of a dispatch table, loaded at open: every layer shape's routes and the
/// fixed kernels.
#[derive(Debug)]
pub struct MoeRuntime {
    kernels: MoeKernels,
    layers: Vec<MoeRoutes>,
}

impl MoeRuntime {
    /// Load the table's grouped entries (grouped by layer shape). A table whose grouped templates
    /// differ from this build's loads anyway (the kernels are rebuilt from this build's
    /// templates) with a warning pushed to `warnings`.
    pub fn load(
        gpu: &Gpu,
        compiler: &Compiler,
        table: &crate::table::Table,
        warnings: &mut Vec<String>,
    ) -> Result<Option<Self>, RuntimeError> {
        if table.moe.is_empty() {
            return Ok(None);
        }
        // The entries of this device's family (a table is measured on one device, so all of
        // them or none).
        let family = crate::runtime::family_for(gpu.info())?;
        if table.moe.iter().any(|e| e.key.family != family) {
            warnings.push(format!(
                "the table's grouped MoE entries are not all for the {family} family of {}: the \
                 grouped layer is not available",
                gpu.info().name
            ));
            return Ok(None);
        }
        let now = crate::moe::config::template_hash();
        if table.moe_template_hash.as_deref() != Some(now.as_str()) {
            warnings.push(
                "the grouped MoE entries were tuned with other kernel templates: their kernels are built from \
                 this build's templates, their recorded times may not hold (re-tune with `fp4tune tune --moe-only`)"
                    .into(),
            );
        }
        let mut layers_of: Vec<(MoeShape, AType)> = Vec::new();
        for e in &table.moe {
            let layer = (e.key.shape(), e.key.a_type);
            if !layers_of.contains(&layer) {
                layers_of.push(layer);
            }
        }
        let mut layers = Vec::with_capacity(layers_of.len());
        for (shape, a_type) in layers_of {
            let choices: Vec<_> = table
                .moe
                .iter()
                .filter(|e| e.key.shape() == shape && e.key.a_type == a_type)
                .map(|e| (e.key.op, e.key.tokens, e.config))
                .collect();
            layers.push(MoeRoutes::load(gpu, compiler, shape, a_type, &choices)?);
        }
        Ok(Some(MoeRuntime { kernels: MoeKernels::load(gpu, compiler)?, layers }))
    }

    /// The layer shapes the table has grouped entries for (each once).
    pub fn shapes(&self) -> Vec<MoeShape> {
        let mut out: Vec<MoeShape> = Vec::new();
        for l in &self.layers {
            if !out.contains(&l.shape) {
                out.push(l.shape);
            }
        }
        out
    }

    fn routes(&self, shape: &MoeShape, a_type: AType) -> Result<&MoeRoutes, RuntimeError> {
        self.layers.iter().find(|l| l.shape == *shape && l.a_type == a_type).ok_or_else(|| {
            RuntimeError::InvalidArgument(format!(
                "the table has no {a_type} grouped entries for the layer {shape} (it has: {})",
                self.layers
                    .iter()
                    .map(|l| format!("{} {}", l.a_type, l.shape))
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        })
    }
}

/// The grouped operations of an open dispatcher (`Dispatcher::moe`).
#[derive(Debug, Clone, Copy)]
pub struct MoeOps<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) runtime: &'a MoeRuntime,
}

impl MoeOps<'_> {
    fn launcher(&self) -> MoeLauncher<'_> {
        MoeLauncher { gpu: self.gpu, kernels: &self.runtime.kernels }
    }

    /// A workspace for one stream's launches of `shape` with up to `max_tokens` tokens (both
    /// activation types).
    pub fn workspace(
        &self,
        shape: MoeShape,
        max_tokens: u32,
    ) -> Result<MoeWorkspace, RuntimeError> {
        if !self.runtime.shapes().contains(&shape) {
            return Err(RuntimeError::InvalidArgument(format!(
                "the table has no grouped entries for the layer {shape} (it has: {})",
                self.runtime.shapes().iter().map(|s| s.to_string()).collect::<Vec<_>>().join("; ")
            )));
        }
        MoeWorkspace::new(self.gpu, shape, max_tokens)
    }

    /// The configurations the W4A16 layer launches for `tokens` (gate_up, down), no launch.
    pub fn route(
        &self,
        shape: &MoeShape,
        tokens: u32,
    ) -> Result<(GroupedConfig, GroupedConfig), RuntimeError> {
        self.route_for(shape, AType::Bf16, tokens)
    }

    /// The configurations the layer of activation type `a_type` launches for `tokens`.
    pub fn route_for(
        &self,
        shape: &MoeShape,
        a_type: AType,
        tokens: u32,
    ) -> Result<(GroupedConfig, GroupedConfig), RuntimeError> {
        let r = self.runtime.routes(shape, a_type)?;
        Ok((r.pick(MoeOp::GateUp, tokens).config, r.pick(MoeOp::Down, tokens).config))
    }

    /// The whole layer on `stream`: align, (W4A4 with bf16 X) the quantization of X, gate_up
    /// (SiLU(gate) * up into the workspace), down, and the router-weighted sum into `args.y`.
    /// No allocation, no synchronization.
    ///
    /// # Safety
    /// Every pointer of `args` must be a device buffer of this context of the documented size
    /// (`MoeArgs`) for `ws.shape` and `args.tokens`, alive until the work on `stream` completes;
    /// `ws` must not be used by launches on other streams meanwhile; `stream` 0 or a live stream
    /// of the device's primary context.
    pub unsafe fn layer(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        let r = self.runtime.routes(&ws.shape, args.a_type())?;
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe {
            self.launcher().layer(
                r.pick(MoeOp::GateUp, args.tokens),
                r.pick(MoeOp::Down, args.tokens),
                args,
                ws,
                stream,
            )
        }
    }

    /// moe_align alone: the routed-row schedule of `args.topk_ids` into `ws`.
    ///
    /// # Safety
    /// As `layer` (only `topk_ids` is read).
    pub unsafe fn align(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        if args.tokens == 0 || args.tokens > ws.layout.max_tokens || args.topk_ids == 0 {
            return Err(RuntimeError::InvalidArgument(format!(
                "{} tokens (the workspace holds 1..={}) with topk_ids {:#x}",
                args.tokens, ws.layout.max_tokens, args.topk_ids
            )));
        }
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe { self.launcher().align(args, ws, stream) }
    }

    /// gate_up alone over the schedule `align` wrote into `ws` for the same tokens: H (sorted
    /// order, `[rows, inter]` bf16; W4A4 also NVFP4) in the workspace (`MoeWorkspace::h`,
    /// `MoeWorkspace::h_fp4`). W4A4 with bf16 X quantizes X first.
    ///
    /// # Safety
    /// As `layer`; `align` ran on `ws` for these tokens earlier on `stream`.
    pub unsafe fn gate_up(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        args.validate(ws)?;
        let r = self.runtime.routes(&ws.shape, args.a_type())?;
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe {
            if args.quantizes_x() {
                self.launcher().quantize_x(args, ws, stream)?;
            }
            self.launcher().grouped(r.pick(MoeOp::GateUp, args.tokens), args, ws, stream)
        }
    }

    /// down and the router-weighted sum into `args.y`, from the H in `ws`.
    ///
    /// # Safety
    /// As `gate_up`; `gate_up` (or a caller's writes of H) happened on `ws` earlier on `stream`.
    pub unsafe fn down(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        args.validate(ws)?;
        let r = self.runtime.routes(&ws.shape, args.a_type())?;
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe {
            self.launcher().grouped(r.pick(MoeOp::Down, args.tokens), args, ws, stream)?;
            self.launcher().finalize(args, ws, stream)
        }
    }
}
