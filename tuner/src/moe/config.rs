//! One grouped kernel variant: its parameters, the constraints that make it legal for a shape,
//! its instantiation unit and its launch (the space of them: `super::space`). Family sm90
//! (`templates/moe/sm90.cuh`, the register-streamed kernel over exactly dequantized NVFP4; W4A16
//! and W4A4; with `tiled`, `templates/moe/sm90_tiled.cuh`, the cp.async GEMM pipeline for
//! prefill-sized steps, W4A16) and family sm120 (`templates/moe/sm120.cuh`, the native
//! block-scaled MMA; W4A4, `super::sm120`) share the vocabulary; the activation type and the
//! family are data.

use super::MoeShape;
use crate::problem::AType;
use crate::template::{Family, GemmConfig, KernelSource};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The two grouped projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MoeOp {
    /// Gathered X rows times the fused [gate; up] weight, SiLU(gate) * up in the epilogue.
    GateUp,
    /// H rows (sorted order) times the down weight, one output row per routed row.
    Down,
}

impl MoeOp {
    pub const ALL: [MoeOp; 2] = [MoeOp::GateUp, MoeOp::Down];

    pub fn as_str(self) -> &'static str {
        match self {
            MoeOp::GateUp => "moe_gate_up",
            MoeOp::Down => "moe_down",
        }
    }

    /// The template's `OP_*` constant.
    pub(crate) fn template_op(self) -> &'static str {
        match self {
            MoeOp::GateUp => "fp4tune::moe::OP_GATE_UP",
            MoeOp::Down => "fp4tune::moe::OP_DOWN",
        }
    }
}

impl fmt::Display for MoeOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A grouped kernel configuration. Family sm90: the vocabulary of `GemmConfig`'s global weight
/// pipeline, with the weights in the register ring or in the warp ring (`warp_ring`); family
/// sm120: the cp.async pipeline of the SM120 GEMM (`depth` is its stage count, `split_k` CTAs
/// along K summed through the workspace, `min_ctas` 1). Both: how the CTAs walk the tile schedule, and the activation type (bf16:
/// W4A16; NVFP4: W4A4, where gate_up also writes H as NVFP4 for down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupedConfig {
    pub op: MoeOp,
    /// Routed rows per tile (8, 16 or 32): picks moe_align's tile list.
    pub block_m: u32,
    /// Weight rows per CTA (gate_up: half gate, half up rows).
    pub block_n: u32,
    /// K per pass (a multiple of 128 * warps_k, at least 256).
    pub block_k: u32,
    pub warps_n: u32,
    pub warps_k: u32,
    /// Register ring: chunks (128 k) in flight per warp. Warp ring: its stages (depth - 1 chunks
    /// in flight).
    pub depth: u32,
    /// K slices: sm90 over a (1, 1, split_k) cluster, 1..8; sm120 over grid z, 1, 2 or 4.
    pub split_k: u32,
    /// CTAs per SM the kernel is compiled for.
    pub min_ctas: u32,
    /// 0: one CTA per tile; w > 0: a persistent walk with about w CTAs per SM.
    pub walk: u32,
    /// Kernel family (absent in files written before it: sm90).
    #[serde(default = "sm90", skip_serializing_if = "is_sm90")]
    pub family: Family,
    /// Activation type (absent in files written before it: bf16).
    #[serde(default = "bf16", skip_serializing_if = "is_bf16")]
    pub a_type: AType,
    /// Family sm90: the weights wait in each warp's own shared-memory ring of `depth` stages,
    /// filled by the lanes' cp.async copies, instead of in registers; the activations stay in
    /// the register ring. Frees the weights' registers for occupancy. Named `p<depth>` instead
    /// of `d<depth>`. Absent (false) in files written before it; false for sm120.
    #[serde(default, skip_serializing_if = "is_false")]
    pub warp_ring: bool,
    /// Family sm90, W4A16: the tiled kernel (`templates/moe/sm90_tiled.cuh`). Routed rows on the
    /// MMA's 16-row side and both operands through `depth` cp.async stages of the CTA, so a warp
    /// decodes each weight once per stage for all its rows: the kernel for prefill-sized steps.
    /// Its tile is an SM90 GEMM tile ([`GroupedConfig::tile_gemm`]): `warps_m` x `warps_n`
    /// warps, `warps_k` and `split_k` 1, one tile per CTA (walk 0). Named `t<depth>`. Absent
    /// (false) in files written before it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub tiled: bool,
    /// Tiled kernel: warps along the routed rows (1 for the streamed kernels; absent in files
    /// written before it).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub warps_m: u32,
    /// Family sm90, W4A16, with `tiled`: the wgmma kernel (`templates/moe/sm90_wgmma.cuh`,
    /// [`super::wgmma`]). The routed rows are Hopper wgmma's N, read by the hardware from the
    /// cp.async stages; 64 weight rows per warpgroup are decoded into its register A operand.
    /// Named `wg<depth>`. Absent (false) in files written before it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub wgmma: bool,
    /// The K-tail form of the sm90 tiled kernel (with `tiled`, not `wgmma`) and of the sm120
    /// kernel, for a K that is a multiple of 16 but not of their 64-k stages (e.g. the down
    /// projection of GLM-4.5-Air's 1408-wide experts over 8 GPUs, K = 176): 8-byte copies of codes
    /// and a last stage zero-filled past K. Named `kt<depth>`. Absent (false) in files written
    /// before it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub k_tail: bool,
    /// Family sm90, W4A16, with `warp_ring`: the activations ride in the warp ring too (each
    /// stage holds the lanes' bf16 runs of its chunk, copied with its weights), so no activation
    /// ring is held in registers (16 per stage and n8 tile): deeper rings at more CTAs per SM.
    /// Named `pa<depth>`. Absent (false) in files written before it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub a_smem: bool,
    /// Family sm90, with `a_smem`: the warp ring runs on across the walk's tiles (chunk c of a
    /// CTA's walk waits in stage c % depth), so `depth` need not divide a tile's chunks per warp
    /// and up to depth - 1 chunks stay in flight across tiles: a short K (the down projection's 2
    /// chunks per warp) gets deeper rings. Named `pf<depth>`. Absent (false) in files written
    /// before it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub flow: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn one() -> u32 {
    1
}

fn is_one(x: &u32) -> bool {
    *x == 1
}

fn sm90() -> Family {
    Family::Sm90
}

fn is_sm90(f: &Family) -> bool {
    *f == Family::Sm90
}

fn bf16() -> AType {
    AType::Bf16
}

fn is_bf16(a: &AType) -> bool {
    *a == AType::Bf16
}

/// Why a configuration cannot run a shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{config}: {reason}")]
pub struct IllegalConfig {
    pub config: String,
    pub reason: String,
}

/// What differs between the grouped instantiation units ([`GroupedConfig::unit`]).
pub(crate) struct UnitParts<'a> {
    /// The template header the unit includes (under `templates/`).
    pub header: &'a str,
    /// The configuration type the kernel is instantiated with.
    pub cfg: String,
    /// Where Rust computes the shared memory, and the template file, named in the asserts.
    pub rust_side: &'a str,
    pub template_side: &'a str,
    /// `__launch_bounds__(...)` and any attribute after it (a cluster).
    pub launch: String,
    /// The kernel struct whose `<Cfg, OP>::run` the kernel calls.
    pub runner: &'a str,
    /// The kernel's one parameter (a struct of `fp4tune::moe`).
    pub params: &'a str,
}

/// A streamed kernel's parameters, in this order: (op, activations, [block_m, block_n, block_k],
/// [warps_n, warps_k], (warp_ring, a_smem, flow), depth, split_k, min_ctas, walk).
pub type StreamedRow = (MoeOp, AType, [u32; 3], [u32; 2], (bool, bool, bool), u32, u32, u32, u32);

impl GroupedConfig {
    /// A streamed kernel's configuration of `family` (not tiled, one warp along the routed rows,
    /// no K tail) from its parameters.
    pub fn streamed(family: Family, row: StreamedRow) -> GroupedConfig {
        let (
            op,
            a_type,
            [block_m, block_n, block_k],
            [warps_n, warps_k],
            ring,
            depth,
            split_k,
            min_ctas,
            walk,
        ) = row;
        let (warp_ring, a_smem, flow) = ring;
        GroupedConfig {
            op,
            block_m,
            block_n,
            block_k,
            warps_n,
            warps_k,
            depth,
            split_k,
            min_ctas,
            walk,
            family,
            a_type,
            warp_ring,
            tiled: false,
            warps_m: 1,
            wgmma: false,
            k_tail: false,
            a_smem,
            flow,
        }
    }

    /// A tiled kernel's configuration (sm90, W4A16, one K slice and one tile per CTA): tile
    /// `[block_m, block_n, block_k]`, `[warps_m, warps_n]` warps, `depth` stages, `min_ctas` CTAs
    /// per SM. The wgmma kernel's are these with `wgmma` set (`moe::wgmma::config`).
    pub fn tiled(
        op: MoeOp,
        [block_m, block_n, block_k]: [u32; 3],
        [warps_m, warps_n]: [u32; 2],
        depth: u32,
        min_ctas: u32,
    ) -> GroupedConfig {
        GroupedConfig {
            op,
            block_m,
            block_n,
            block_k,
            warps_n,
            warps_k: 1,
            depth,
            split_k: 1,
            min_ctas,
            walk: 0,
            family: Family::Sm90,
            a_type: AType::Bf16,
            warp_ring: false,
            tiled: true,
            warps_m,
            wgmma: false,
            k_tail: false,
            a_smem: false,
            flow: false,
        }
    }

    /// Threads per CTA (saturating: a configuration read from a file may hold any counts; `check`
    /// refuses it then).
    pub fn threads(&self) -> u32 {
        32u32.saturating_mul(self.warps_m).saturating_mul(self.warps_n).saturating_mul(self.warps_k)
    }

    /// The tiled kernel's tile as the SM90 GEMM's cp.async configuration it is built on (no swap:
    /// routed rows are the GEMM's M): its limits, shared memory and registers are the GEMM's.
    pub fn tile_gemm(&self) -> GemmConfig {
        // the GEMM tile for one CTA per SM (the GEMM's cp.async rule); the grouped kernel's CTAs
        // per SM are its own (`min_ctas`, its launch bounds, checked by `check`)
        GemmConfig {
            min_ctas: 1,
            ..GemmConfig::cp_async(
                self.family,
                self.a_type,
                [self.block_m, self.block_n, self.block_k],
                [self.warps_m, self.warps_n, self.warps_k],
                self.depth,
                self.split_k,
                false,
            )
        }
    }

    fn p_tiles(&self) -> u32 {
        self.block_n / self.warps_n / 16
    }

    fn q_tiles(&self) -> u32 {
        self.block_m / 8
    }

    /// fp32 accumulators per lane (one set).
    fn acc(&self) -> u32 {
        self.p_tiles() * self.q_tiles() * 4
    }

    fn acc_sets(&self) -> u32 {
        match self.p_tiles() * self.q_tiles() {
            x if x >= 4 => 1,
            x if x >= 2 => 2,
            _ => 4,
        }
    }

    /// The register cap per lane of `min_ctas` CTAs (templates/sm90/direct.cuh REGISTER_CAP,
    /// `__launch_bounds__` of every sm90 grouped kernel).
    pub(super) fn register_cap(&self) -> u32 {
        (65536 / (self.threads() * self.min_ctas) / 8 * 8).min(255)
    }

    /// Registers of one weight chunk of a lane: per m16 tile, 2 x (4 code words + a scale
    /// half-word pair).
    fn weight_chunk_regs(&self) -> u32 {
        self.p_tiles() * 10
    }

    /// Registers of the register ring: `depth` entries of the weights (register ring only) and
    /// the activations of one chunk (bf16: 16 words per n8 tile; NVFP4: 4 code words and a scale
    /// half-word pair). templates/moe/sm90.cuh GroupedConfig::RING_REGS.
    fn ring_regs(&self) -> u32 {
        let per_q = if self.a_type == AType::Nvfp4 { 5 } else { 16 };
        let weights = if self.warp_ring { 0 } else { self.weight_chunk_regs() };
        let activations = if self.a_smem { 0 } else { self.q_tiles() * per_q };
        (weights + activations) * self.depth
    }

    /// Dynamic shared memory: sm90, the split-K slots, then the warp ring when there is one
    /// (templates/moe/sm90.cuh GroupedConfig::SMEM_BYTES); sm120, the cp.async stages
    /// (sm120::Config::SMEM_BYTES).
    pub fn smem_bytes(&self) -> u32 {
        if self.family == Family::Sm120 {
            return super::sm120::layout(self).map_or(u32::MAX, |l| l.smem_bytes);
        }
        if self.wgmma {
            return super::wgmma::smem_bytes(self);
        }
        if self.tiled {
            return self.tile_gemm().smem_bytes();
        }
        let slots = self.split_k.max(1) * self.warps_k;
        let slot_bytes = if slots > 1 { slots * self.warps_n * 32 * self.acc() * 4 } else { 0 };
        if !self.warp_ring {
            return slot_bytes.max(16);
        }
        // per warp and stage: per m16 tile and row half, 32 lanes x (16 bytes of codes + a
        // 4-byte scale word); with the activations, the scale words once per lane pair and per
        // n8 tile 32 lanes x 64 bytes of bf16
        let stage = if self.a_smem {
            self.p_tiles() * 2 * (512 + 64) + self.q_tiles() * 4 * 512
        } else {
            self.p_tiles() * 2 * (512 + 128)
        };
        let warps = self.warps_n * self.warps_k;
        (slot_bytes.div_ceil(128) * 128 + warps * self.depth * stage).max(16)
    }

    /// Chunks per tile of one warp for K = `k`.
    fn chunks_per_tile(&self, k: u32) -> u32 {
        (k / self.block_k / self.split_k) * (self.block_k / self.warps_k / 128)
    }

    /// Constraints of the configuration (mirroring the template's static_asserts and run-time
    /// guards) for one shape.
    pub fn check(&self, shape: &MoeShape) -> Result<(), IllegalConfig> {
        let err = |reason: String| Err(IllegalConfig { config: self.name(), reason });
        let (n, k) = shape.nk(self.op);
        if !super::TILE_BLOCK_M.contains(&self.block_m) {
            return err("block_m must be 8, 16, 32, 64 or 128 (moe_align's tile lists)".into());
        }
        if self.warps_n == 0 || self.warps_k == 0 || self.block_n % self.warps_n != 0 {
            return err("block_n must split evenly over warps_n".into());
        }
        if self.walk > 16 {
            return err("walk is at most 16 CTAs per SM".into());
        }
        if n % 16 != 0 || (self.op == MoeOp::GateUp && (n / 2) % 8 != 0) {
            return err(format!("N = {n} must be a multiple of 16"));
        }
        if self.a_type == AType::Nvfp4 && self.op == MoeOp::GateUp && (n / 2) % 16 != 0 {
            return err(format!(
                "W4A4 gate_up writes H as NVFP4 blocks of 16: the intermediate size {} must be a \
                 multiple of 16",
                n / 2
            ));
        }
        if shape.experts == 0 || shape.experts > super::schedule::MAX_EXPERTS {
            return err(format!(
                "{} local experts (moe_align takes 1..{})",
                shape.experts,
                super::schedule::MAX_EXPERTS
            ));
        }
        if !self.tiled && self.warps_m != 1 {
            return err(
                "the streamed kernels have one warp along the routed rows (warps_m 1)".into()
            );
        }
        if self.wgmma && !self.tiled {
            return err("the wgmma kernel is a tiled kernel (tiled true)".into());
        }
        if self.k_tail && self.family != Family::Sm120 && (!self.tiled || self.wgmma) {
            return err(
                "the K-tail form is a form of the sm90 tiled kernel (tiled true, wgmma false) or \
                 of the sm120 kernel"
                    .into(),
            );
        }
        if self.a_smem && (!self.warp_ring || self.a_type != AType::Bf16) {
            return err(
                "the activations ride in the warp ring (a_smem) of a W4A16 kernel only (warp_ring, bf16)"
                    .into(),
            );
        }
        if self.flow && !self.a_smem {
            return err(
                "the ring runs on across tiles (flow) with the activations in it (a_smem)".into()
            );
        }
        if self.family == Family::Sm120 {
            if self.warp_ring {
                return err("the warp ring is a weight pipeline of family sm90".into());
            }
            if self.tiled {
                return err("the tiled kernel is a kernel of family sm90".into());
            }
            return super::sm120::check(self, shape)
                .map_err(|reason| IllegalConfig { config: self.name(), reason });
        }
        if self.wgmma {
            return super::wgmma::check(self, k);
        }
        if self.tiled {
            return self.check_tiled(k);
        }
        if self.block_m > 32 {
            return err(
                "the streamed kernels take tiles of 8, 16 or 32 routed rows (block_m)".into()
            );
        }
        let warp_p = self.block_n / self.warps_n;
        if warp_p % 16 != 0 || !(1..=4).contains(&self.p_tiles()) {
            return err("block_n / warps_n must be 16, 32, 48 or 64 weight rows per warp".into());
        }
        if self.a_type == AType::Nvfp4 && self.op == MoeOp::GateUp && self.p_tiles() % 2 != 0 {
            return err(
                "W4A4 gate_up quantizes 16-column blocks of H, two m16 tiles of one warp: \
                 block_n / warps_n must be 32 or 64"
                    .into(),
            );
        }
        if self.threads() > 1024 {
            return err(format!("{} threads per CTA (at most 1024)", self.threads()));
        }
        if self.block_k < 256 || self.block_k % (128 * self.warps_k) != 0 {
            return err("block_k must be at least 256 and a multiple of 128 * warps_k".into());
        }
        if self.warp_ring && !(2..=8).contains(&self.depth) {
            return err("a warp ring has 2..8 stages (depth)".into());
        }
        if !(1..=8).contains(&self.depth) {
            return err("depth must be 1..8".into());
        }
        if !(1..=8).contains(&self.split_k) {
            return err("split_k must be 1..8 (a cluster)".into());
        }
        if !(1..=16).contains(&self.min_ctas) || self.threads() * self.min_ctas > 2048 {
            return err("min_ctas CTAs must fit in one SM (2048 threads)".into());
        }
        let cap = self.register_cap();
        if self.ring_regs() > 112.min(cap.saturating_sub(64)) {
            return err(format!(
                "the register ring ({} registers) is over its budget (112, and 64 below the cap of {cap})",
                self.ring_regs()
            ));
        }
        // The whole register file of a lane: ring (warp ring: the activations only; the chunk
        // read from shared memory is decoded as it is read), accumulator sets, row pointers
        // (64-bit; W4A4 has a scale pointer per activation row too), about 48 registers of
        // indices, tile state and the epilogue, and for W4A4 gate_up the H values its NVFP4
        // epilogue quantizes (the ring of the next tile is in flight meanwhile); with the
        // activations in the warp ring, the chunk of them read from shared memory.
        let w4a4 = self.a_type == AType::Nvfp4;
        let estimate = self.ring_regs()
            + if self.a_smem { 16 * self.q_tiles() } else { 0 }
            + self.acc() * self.acc_sets()
            + 8 * self.p_tiles()
            + 4 * self.q_tiles() * if w4a4 { 2 } else { 1 }
            + 48
            + if w4a4 && self.op == MoeOp::GateUp { self.acc() } else { 0 };
        if estimate > cap {
            return err(format!("about {estimate} registers per lane, over the cap of {cap}"));
        }
        if self.acc() * self.acc_sets() > 128 {
            return err("accumulators over the register budget".into());
        }
        let smem = u64::from(self.smem_bytes());
        if smem > 232_448 || u64::from(self.min_ctas) * (smem + 1024) > 233_472 {
            return err(format!(
                "{} bytes of shared memory (split-K slots and warp ring) for {} CTAs per SM: over \
                 the 228 KiB of an SM",
                self.smem_bytes(),
                self.min_ctas
            ));
        }
        if k % self.block_k != 0 || (k / self.block_k) % self.split_k != 0 {
            return err(format!("K = {k} must split into whole block_k passes per K slice"));
        }
        let cpt = self.chunks_per_tile(k);
        if !self.flow && (cpt < self.depth || cpt % self.depth != 0) {
            return err(format!(
                "{cpt} chunks per warp and tile must be a multiple of depth {}",
                self.depth
            ));
        }
        Ok(())
    }

    /// The tiled kernel's constraints (after the shape's): the SM90 GEMM's limits of its tile,
    /// then what the grouped schedule and epilogue need.
    fn check_tiled(&self, k: u32) -> Result<(), IllegalConfig> {
        let err = |reason: String| Err(IllegalConfig { config: self.name(), reason });
        if self.a_type != AType::Bf16 {
            return err("the tiled kernel takes bf16 activations (W4A16)".into());
        }
        if self.warp_ring {
            return err(
                "the tiled kernel has no warp ring (its weights go through the CTA's stages)"
                    .into(),
            );
        }
        if self.warps_k != 1 || self.split_k != 1 || self.walk != 0 {
            return err("the tiled kernel has one K slice per CTA (warps_k 1, split_k 1) and one tile per CTA (walk 0)".into());
        }
        // the GEMM's limits (threads, shared memory) for one CTA per SM; MIN_CTAS CTAs of the
        // grouped kernel (its launch bounds) must fit an SM's threads and shared memory together
        if let Err(e) = self.tile_gemm().check() {
            return err(e.reason);
        }
        if !(1..=16).contains(&self.min_ctas)
            || self.threads() * self.min_ctas > 2048
            || self.min_ctas * (self.smem_bytes() + 1024) > 233_472
        {
            return err(format!(
                "{} CTAs of {} threads and {} bytes of stages do not fit in one SM",
                self.min_ctas,
                self.threads(),
                self.smem_bytes()
            ));
        }
        if self.block_m < 16 {
            return err("block_m must be 16, 32, 64 or 128 (moe_align's tile lists of at least one m16 tile)".into());
        }
        self.check_k(k).map_err(|reason| IllegalConfig { config: self.name(), reason })?;
        // H columns come in gate / up pairs of stage rows: whole pairs per CTA
        if self.op == MoeOp::GateUp && self.block_n % 2 != 0 {
            return err("gate_up tiles hold whole gate / up row pairs".into());
        }
        Ok(())
    }

    /// K of the tiled and sm120 kernels: a multiple of block_k, or in the K-tail form stages of
    /// 64 k over any K of whole NVFP4 blocks (16).
    pub(crate) fn check_k(&self, k: u32) -> Result<(), String> {
        if !self.k_tail {
            return match k % self.block_k {
                0 => Ok(()),
                _ => Err(format!("K = {k} must be a multiple of block_k = {}", self.block_k)),
            };
        }
        if self.block_k != 64 {
            return Err("the K-tail form has stages of 64 k (block_k 64)".into());
        }
        match k % 16 {
            0 => Ok(()),
            _ => Err(format!("K = {k} must be a multiple of 16 (the NVFP4 block)")),
        }
    }

    /// The pipeline in names: `d` (register ring; sm120: cp.async stages), `p` (warp ring), `pa`
    /// (with the activations), `pf` (running on across tiles), `t`
    /// (the tiled kernel's cp.async stages), `kt` (those of its K-tail form) or `wg` (the wgmma
    /// kernel's).
    fn ring_label(&self) -> &'static str {
        if self.wgmma {
            "wg"
        } else if self.k_tail {
            "kt"
        } else if self.tiled {
            "t"
        } else if self.flow {
            "pf"
        } else if self.a_smem {
            "pa"
        } else if self.warp_ring {
            "p"
        } else {
            "d"
        }
    }

    /// The warp layout in names: `<warps_n>x<warps_k>` (streamed kernels), or
    /// `<warps_m>x<warps_n>x1` (the tiled kernel, the GEMM's order).
    fn warps_label(&self) -> String {
        if self.tiled {
            format!("{}x{}x{}", self.warps_m, self.warps_n, self.warps_k)
        } else {
            format!("{}x{}", self.warps_n, self.warps_k)
        }
    }

    /// `w4a4` after the op for NVFP4 activations (W4A16 names carry no activation tag).
    fn tag(&self) -> &'static str {
        if self.a_type == AType::Nvfp4 {
            "_w4a4"
        } else {
            ""
        }
    }

    /// A stable, human-readable name; the kernel symbol is derived from it. Family sm90 names
    /// start with the op, sm120 names with `sm120_`.
    pub fn name(&self) -> String {
        format!(
            "{}{}{}_m{}n{}k{}_w{}_{}{}_s{}_o{}_walk{}",
            if self.family == Family::Sm120 { "sm120_" } else { "" },
            self.op,
            self.tag(),
            self.block_m,
            self.block_n,
            self.block_k,
            self.warps_label(),
            self.ring_label(),
            self.depth,
            self.split_k,
            self.min_ctas,
            self.walk
        )
    }

    /// The kernel symbol (the walk is a launch parameter, not part of the code).
    pub fn kernel_name(&self) -> String {
        format!(
            "fp4tune_{}_{}{}_m{}n{}k{}_w{}_{}{}_s{}_o{}",
            self.family.as_str(),
            self.op,
            self.tag(),
            self.block_m,
            self.block_n,
            self.block_k,
            self.warps_label(),
            self.ring_label(),
            self.depth,
            self.split_k,
            self.min_ctas
        )
    }

    /// The instantiation unit: the template, the configuration, cross-checks of what Rust
    /// computes, and the `extern "C"` kernel.
    pub fn instantiation(&self) -> String {
        if self.family == Family::Sm120 {
            return super::sm120::instantiation(self);
        }
        if self.wgmma {
            return self.unit(super::wgmma::unit_parts(self));
        }
        if self.tiled {
            return self.tiled_instantiation();
        }
        let cluster = if self.split_k > 1 {
            format!(" __cluster_dims__(1, 1, {})", self.split_k)
        } else {
            String::new()
        };
        self.unit(UnitParts {
            header: "moe/sm90.cuh",
            cfg: format!(
                "fp4tune::moe::GroupedConfig<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}{}>",
                self.block_m,
                self.block_n,
                self.block_k,
                self.warps_n,
                self.warps_k,
                self.depth,
                self.split_k,
                self.a_type == AType::Nvfp4,
                self.warp_ring,
                self.min_ctas,
                if self.flow {
                    ", true, true"
                } else if self.a_smem {
                    ", true"
                } else {
                    ""
                }
            ),
            rust_side: "moe/config.rs smem_bytes",
            template_side: "moe/sm90.cuh",
            launch: format!("__launch_bounds__({}, {}){cluster}", self.threads(), self.min_ctas),
            runner: "Grouped",
            params: "GroupedParams",
        })
    }

    /// The tiled kernel's instantiation unit (`templates/moe/sm90_tiled.cuh`).
    fn tiled_instantiation(&self) -> String {
        self.unit(UnitParts {
            header: "moe/sm90_tiled.cuh",
            cfg: format!(
                "fp4tune::moe::TiledConfig<{}, {}, {}, {}, {}, {}, {}, {}>",
                self.block_m,
                self.block_n,
                self.block_k,
                self.warps_m,
                self.warps_n,
                self.depth,
                self.min_ctas,
                self.k_tail
            ),
            rust_side: "moe/config.rs smem_bytes",
            template_side: "moe/sm90_tiled.cuh",
            launch: format!("__launch_bounds__({}, {})", self.threads(), self.min_ctas),
            runner: "GroupedTiled",
            params: "GroupedParams",
        })
    }

    /// One grouped instantiation unit (every family's): the header, the configuration, the
    /// messaged asserts that Rust and the template agree on shared memory and threads, and the
    /// `extern "C"` kernel that runs `fp4tune::moe::<runner><Cfg, OP>`. Configurations that differ
    /// only in how they walk the schedule (a launch parameter) get the same unit: one kernel,
    /// compiled and cached once.
    pub(crate) fn unit(&self, u: UnitParts<'_>) -> String {
        format!(
            "// fp4tune grouped MoE kernel {kernel}\n\
             #include \"{header}\"\n\
             using Cfg = {cfg};\n\
             static_assert(Cfg::SMEM_BYTES == {smem}, \"Rust ({rust}) and templates/{template} disagree on shared memory\");\n\
             static_assert(Cfg::THREADS == {threads}, \"Rust and templates/{template} disagree on threads\");\n\
             extern \"C\" __global__ void {launch} {kernel}(const fp4tune::moe::{params} p) {{\n\
             \x20   fp4tune::moe::{runner}<Cfg, {op}>::run(p);\n\
             }}\n",
            header = u.header,
            cfg = u.cfg,
            smem = self.smem_bytes(),
            rust = u.rust_side,
            template = u.template_side,
            threads = self.threads(),
            launch = u.launch,
            kernel = self.kernel_name(),
            runner = u.runner,
            params = u.params,
            op = self.op.template_op(),
        )
    }

    pub fn source(&self) -> KernelSource {
        KernelSource::from_unit(self.kernel_name(), self.family.arch(), &self.instantiation())
            .expect("the grouped templates are embedded")
    }

    /// Grid (x, y, z) for a tile list of at most `max_tiles` tiles (the bound of the kernel's own
    /// list, `moe::list_tiles`) on `sm_count` SMs: one CTA row per tile, or (walk) a persistent
    /// grid clamped to it.
    pub fn grid(&self, shape: &MoeShape, max_tiles: u32, sm_count: u32) -> (u32, u32, u32) {
        let (n, _) = shape.nk(self.op);
        let gx = n.div_ceil(self.block_n);
        let gy = if self.walk == 0 {
            max_tiles
        } else {
            (self.walk * sm_count / (gx * self.split_k)).clamp(1, max_tiles)
        };
        (gx, gy.max(1), self.split_k)
    }
}

impl fmt::Display for GroupedConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
