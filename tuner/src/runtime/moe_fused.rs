//! The fused decode layer at run time (`moe::layer`): one launch for the routing, both
//! projections and the weighted sum of a step of at most `LAYER_MAX_IDS` routed ids (family
//! sm90, W4A16). Its counters live in the workspace (`MoeWorkspace::layer_counters`, zero
//! between launches: every launch leaves them zero), so streams with their own workspaces stay
//! apart as for the four-launch layer.

use super::*;
use crate::gpu::moe_params::MoeLayerParams;
use crate::moe::layer::LayerConfig;

/// A layer's fused kernel, loaded.
#[derive(Debug)]
pub struct FusedLayerKernel {
    pub config: LayerConfig,
    kernel: Kernel,
}

impl FusedLayerKernel {
    /// Load `config`'s compiled kernel; one that spills registers is refused (the layer then
    /// runs its four launches).
    pub fn from_compiled(
        gpu: &Gpu,
        config: LayerConfig,
        compiled: &crate::compile::CompiledKernel,
    ) -> Result<Self, RuntimeError> {
        if compiled.spills() {
            return Err(RuntimeError::Render {
                config: config.name(),
                reason: "the kernel spills registers to local memory".into(),
            });
        }
        Ok(Self { config, kernel: gpu.load(compiled, config.smem_bytes())? })
    }

    /// Compile (or take from the cache) and load `config`'s kernel.
    pub fn load(gpu: &Gpu, compiler: &Compiler, config: LayerConfig) -> Result<Self, RuntimeError> {
        let compiled = compiler
            .compile(&config.source())
            .map_err(|error| RuntimeError::Compile { config: config.name(), error })?;
        Self::from_compiled(gpu, config, &compiled)
    }
}

impl MoeLauncher<'_> {
    /// `Ok` when `kernel` runs this call fused: an sm90 device, W4A16, a step of at most
    /// `LAYER_MAX_IDS` routed ids, a shape the kernel's tiles take.
    pub fn check_fused(
        &self,
        kernel: &FusedLayerKernel,
        args: &MoeArgs,
        ws: &MoeWorkspace,
    ) -> Result<(), RuntimeError> {
        args.validate(ws)?;
        let c = &kernel.config;
        let refuse = |why: String| Err(RuntimeError::InvalidArgument(format!("{c}: {why}")));
        if self.kernels.family != Family::Sm90 || args.a_type() != AType::Bf16 {
            return refuse(format!(
                "the fused layer runs W4A16 on family sm90, not {} on {}",
                args.a_type(),
                self.kernels.family
            ));
        }
        if !LayerConfig::takes(&ws.shape, args.tokens) {
            return refuse(format!(
                "{} tokens x top_k {}: the fused layer takes at most {} routed ids",
                args.tokens,
                ws.shape.top_k,
                crate::moe::layer::LAYER_MAX_IDS
            ));
        }
        if let Err(e) = c.check(&ws.shape) {
            return refuse(e.reason);
        }
        Ok(())
    }

    /// The whole layer in one launch on `stream` (`check_fused` first): `args.y` and, in `ws`,
    /// H and the per-row outputs (sorted order) as the four-launch layer leaves them. The
    /// workspace's schedule (sorted ids, tile lists) is not written.
    ///
    /// # Safety
    /// As `layer`.
    pub unsafe fn fused_layer(
        &self,
        kernel: &FusedLayerKernel,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        self.check_fused(kernel, args, ws)?;
        let shape = &ws.shape;
        let p = MoeLayerParams {
            topk_ids: args.topk_ids,
            topk_weights: args.topk_weights,
            x: args.x,
            w13: args.w13,
            w13_sf: args.w13_sf,
            alpha13: args.alpha13,
            w2: args.w2,
            w2_sf: args.w2_sf,
            alpha2: args.alpha2,
            h: ws.h(),
            y_rows: ws.y_rows(),
            y: args.y,
            counters: ws.layer_counters(),
            tokens: args.tokens as i32,
            top_k: shape.top_k as i32,
            expert_begin: args.expert_begin,
            experts: shape.experts as i32,
            hidden: shape.hidden as i32,
            inter: shape.inter as i32,
        };
        let c = &kernel.config;
        let dims = LaunchDims {
            grid: c.grid(self.gpu.info().sm_count),
            block: (c.threads(), 1, 1),
            smem_bytes: c.smem_bytes(),
        };
        // SAFETY: the fused kernel takes one MoeLayerParams; at most LAYER_MAX_IDS routed rows
        // (checked), which the workspace's H and per-row regions hold (max_tokens >= tokens);
        // its counters region has counter_words(hidden) words, zero between launches; the
        // caller's buffers per the contract above.
        unsafe { self.gpu.launch_params_on_stream(&kernel.kernel, dims, &p, stream) }?;
        Ok(())
    }
}
