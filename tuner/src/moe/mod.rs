//! The grouped MoE layer: all routed experts of one step in one launch per projection.
//!
//! An engine hands over the router's `topk_ids [B, top_k]` and `topk_weights [B, top_k]`, the
//! activations `X [B, hidden]` and the stacked NVFP4 expert weights (ModelOpt layout per expert,
//! their codes put once at load into the order the family's grouped kernels read: `order`).
//! Four kernels (`templates/moe/`) run on one stream without a host round trip:
//!
//! 1. `moe_align` (`schedule`): the stable expert-sorted routed rows, their inverse, and one tile
//!    list per BLOCK_M (8, 16, 32, 64, 128).
//! 2. `gate_up` (`config`, `MoeOp::GateUp`): gathers `X[token]` per routed row, multiplies by the
//!    expert's fused `[gate; up]` weight and writes `H = SiLU(gate) * up` from the epilogue.
//! 3. `down` (`MoeOp::Down`): `H` rows times the expert's down weight, one output row per routed
//!    row (sorted order).
//! 4. `moe_finalize`: each token's rows weighted by the router and summed in slot order
//!    (deterministic, no atomics).
//!
//! Activations are bf16 (W4A16) or NVFP4 (W4A4: X quantized with a static input scale, and the
//! gate_up epilogue writes H in NVFP4 too, for down). Family sm90 runs both on the H200 by exact
//! dequantization; family sm120 (`sm120`) runs W4A4 on the native block-scaled MMA and is
//! verified without a GPU.
//!
//! `reference` is the CPU model every GPU result is checked against; `epilogue` mirrors the
//! grouped epilogue's element positions and NVFP4 quantization of H lane by lane; `tiled` mirrors
//! the tiled kernel's row maps (interleaved gate / up stage rows, accumulator positions); `wgmma`
//! holds the wgmma kernel's configurations and mirrors its operand layouts; `order` is the order
//! of the weight codes each family's grouped kernels read (and the kernel that puts a layer's
//! codes into it once at load); `seeds`
//! lists the configurations that won H200 campaigns, which every grouped screen measures.

pub mod config;
pub mod defaults;
pub mod epilogue;
pub mod order;
pub mod reference;
pub mod schedule;
pub mod seeds;
pub mod sm120;
pub mod space;
pub mod templates;
pub mod tiled;
pub mod wgmma;

pub use config::{GroupedConfig, MoeOp};
pub use schedule::{list_tiles, max_tiles, RouteSchedule, TILE_BLOCK_M};

use serde::{Deserialize, Serialize};
use std::fmt;

/// The shapes of one MoE layer on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MoeShape {
    /// Model width (K of gate_up, N of down).
    pub hidden: u32,
    /// Expert intermediate size on this GPU (gate_up has N = 2 * inter, down has K = inter).
    pub inter: u32,
    /// Experts on this GPU (E_local).
    pub experts: u32,
    /// Experts per token.
    pub top_k: u32,
}

impl MoeShape {
    /// GLM-5 at TP8: 256 experts of 512 x 6144 and 6144 x 256 on every GPU, top-8.
    pub const GLM5_TP8: MoeShape = MoeShape { hidden: 6144, inter: 256, experts: 256, top_k: 8 };
    /// GLM-5 at EP8: 32 whole experts (4096 x 6144 and 6144 x 2048) per GPU, top-8 of 256.
    pub const GLM5_EP8: MoeShape = MoeShape { hidden: 6144, inter: 2048, experts: 32, top_k: 8 };

    /// The routed-expert layer of a shape set: (shape, experts of the whole model), or `None`
    /// when the set has no routed gate_up and down pair that fits together.
    pub fn from_set(set: &crate::shapes::ShapeSet) -> Option<(MoeShape, u32)> {
        use crate::shapes::Op;
        let gu = set.shape(Op::RoutedGateUp)?;
        let dn = set.shape(Op::RoutedDown)?;
        let shape = MoeShape {
            hidden: gu.k,
            inter: gu.n / 2,
            experts: gu.count_per_layer,
            top_k: set.routing.experts_per_token,
        };
        let fits = gu.n % 2 == 0
            && dn.n == gu.k
            && dn.k == gu.n / 2
            && shape.experts > 0
            && shape.top_k > 0;
        fits.then_some((shape, set.routing.routed_experts))
    }

    /// (N, K) of one expert's weight for `op`.
    pub fn nk(&self, op: MoeOp) -> (u32, u32) {
        match op {
            MoeOp::GateUp => (2 * self.inter, self.hidden),
            MoeOp::Down => (self.hidden, self.inter),
        }
    }

    /// NVFP4 bytes of one expert's weight for `op` (codes and 128-row-padded swizzled scales).
    pub fn expert_bytes(&self, op: MoeOp) -> u64 {
        let (n, k) = self.nk(op);
        let codes = n as u64 * k as u64 / 2;
        let sf = crate::format::swizzle::swizzled_len(n as usize, (k / 16) as usize) as u64;
        codes + sf
    }
}

impl fmt::Display for MoeShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "hidden {} inter {} experts {} top_k {}",
            self.hidden, self.inter, self.experts, self.top_k
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_glm5_sets_give_the_tp8_and_ep8_layers() {
        let file = crate::shapes::ShapeFile::glm5().unwrap();
        let (tp8, total) = MoeShape::from_set(file.set("tp8").unwrap()).unwrap();
        assert_eq!((tp8, total), (MoeShape::GLM5_TP8, 256));
        let (ep8, _) = MoeShape::from_set(file.set("ep8").unwrap()).unwrap();
        assert_eq!(ep8, MoeShape::GLM5_EP8);
        assert_eq!(tp8.expert_bytes(MoeOp::GateUp), 512 * 3072 + 512 * 384);
    }
}
