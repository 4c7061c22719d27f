//! Roofline of one MoE decode step's routed-expert GEMMs on one GPU (bytes over the data sheet's
//! bandwidth, FLOPs over its tensor peak; microseconds): the floor every tuned kernel is compared
//! against.

use super::model::DeviceModel;
use crate::problem::AType;
use crate::template::Family;

/// Bytes of `rows` rows of K elements of an operand of type `t` (NVFP4: codes + UE4M3 scales).
fn operand_bytes(t: AType, rows: f64, k: f64) -> f64 {
    match t {
        AType::Nvfp4 => rows * k * (0.5 + 1.0 / 16.0),
        AType::Bf16 => rows * k * 2.0,
    }
}

/// The MoE part of a model that the decode roofline needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeModel {
    pub name: &'static str,
    /// Layers with routed experts.
    pub moe_layers: u32,
    pub routed_experts: u32,
    pub experts_per_token: u32,
    pub hidden: u32,
    pub moe_intermediate: u32,
}

/// GLM-5 (and GLM-5.1): 78 layers of which the first 3 are dense, 256 routed experts, top-8,
/// hidden 6144, expert intermediate 2048 (the MTP layer is not counted).
pub const GLM5: MoeModel = MoeModel {
    name: "GLM-5",
    moe_layers: 75,
    routed_experts: 256,
    experts_per_token: 8,
    hidden: 6144,
    moe_intermediate: 2048,
};

/// Roofline of the routed-expert GEMMs of one decode step on one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeRoofline {
    pub batch: u32,
    pub tp: u32,
    /// Expected experts with at least one token under uniform top-k routing.
    pub active_experts: f64,
    /// Token rows per active expert on average.
    pub rows_per_active_expert: f64,
    /// Per MoE layer on this GPU: bytes and FLOPs of the gate_up and down GEMMs of active experts.
    pub gate_up_bytes: f64,
    pub down_bytes: f64,
    pub flops_per_layer: f64,
    /// max(bytes / bandwidth, FLOPs / peak) of each projection, per layer, microseconds.
    pub gate_up_us: f64,
    pub down_us: f64,
    pub per_layer_us: f64,
    /// All MoE layers of one decode step, microseconds.
    pub per_step_us: f64,
}

/// Roofline of one decode step's routed-expert GEMMs with `batch` sequences at `tp`-way tensor
/// parallelism inside each expert (every GPU holds a 1/tp slice of all experts), uniform routing,
/// activations of type `a_type` (NVFP4 on SM120, bf16 on the SM90 path). Counts only the experts
/// that received tokens; weights dominate, activations and bf16 outputs are included.
pub fn moe_decode_roofline(
    model: &MoeModel,
    device: &DeviceModel,
    batch: u32,
    tp: u32,
    a_type: AType,
) -> DecodeRoofline {
    let e = model.routed_experts as f64;
    let kk = model.experts_per_token as f64;
    let tp = tp.max(1);
    let active = if batch == 0 { 0.0 } else { e * (1.0 - (1.0 - kk / e).powi(batch as i32)) };
    let rows = batch as f64 * kk; // routed token rows, all experts together
    let h = model.hidden as f64;
    let i_tp = model.moe_intermediate as f64 / tp as f64;
    // gate_up: W [2 I/tp, H], A [rows, H], Y [rows, 2 I/tp]; down: W [H, I/tp], A [rows, I/tp], Y [rows, H].
    let gate_up_bytes = active * operand_bytes(AType::Nvfp4, 2.0 * i_tp, h)
        + operand_bytes(a_type, rows, h)
        + rows * 2.0 * i_tp * 2.0;
    let down_bytes = active * operand_bytes(AType::Nvfp4, h, i_tp)
        + operand_bytes(a_type, rows, i_tp)
        + rows * h * 2.0;
    let gate_up_flops = 2.0 * rows * 2.0 * i_tp * h;
    let down_flops = 2.0 * rows * h * i_tp;
    let roof = |bytes: f64, flops: f64| {
        (bytes / (device.bandwidth_gbs * 1e3)).max(flops / (device.tensor_tflops * 1e6))
    };
    let gate_up_us = roof(gate_up_bytes, gate_up_flops);
    let down_us = roof(down_bytes, down_flops);
    let per_layer_us = gate_up_us + down_us;
    DecodeRoofline {
        batch,
        tp,
        active_experts: active,
        rows_per_active_expert: if active > 0.0 { rows / active } else { 0.0 },
        gate_up_bytes,
        down_bytes,
        flops_per_layer: gate_up_flops + down_flops,
        gate_up_us,
        down_us,
        per_layer_us,
        per_step_us: per_layer_us * model.moe_layers as f64,
    }
}

/// GLM-5 at TP8 with the family's activation type (NVFP4 on SM120, bf16 on SM90).
pub fn glm5_decode_roofline(device: &DeviceModel, family: Family, batch: u32) -> DecodeRoofline {
    let a_type = match family {
        Family::Sm120 => AType::Nvfp4,
        Family::Sm90 => AType::Bf16,
    };
    moe_decode_roofline(&GLM5, device, batch, 8, a_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glm5_decode_roofline_matches_hand_numbers() {
        let (h200, pro) = (DeviceModel::h200(), DeviceModel::rtx_pro_6000_ws());
        let server = DeviceModel::rtx_pro_6000_server();
        // B = 1: exactly 8 experts active, one row each.
        let r = glm5_decode_roofline(&h200, Family::Sm90, 1);
        assert!((r.active_experts - 8.0).abs() < 1e-9);
        assert!((r.rows_per_active_expert - 1.0).abs() < 1e-9);
        // NVFP4 roofline on the H200 by hand: gate_up at B = 1 is 3.3 us, at B = 64 92 us,
        // down at B = 64 47 us.
        assert!((r.gate_up_us - 3.3).abs() < 0.2, "{}", r.gate_up_us);
        let r64 = glm5_decode_roofline(&h200, Family::Sm90, 64);
        assert!((r64.active_experts - 222.5).abs() < 0.5, "{}", r64.active_experts);
        assert!((r64.gate_up_us - 92.0).abs() < 3.0, "{}", r64.gate_up_us);
        assert!((r64.down_us - 47.0).abs() < 3.0, "{}", r64.down_us);
        // All experts active streams ~679 MB per layer, ~0.4 ms on a PRO 6000.
        let all = glm5_decode_roofline(&pro, Family::Sm120, 256);
        assert!(all.active_experts > 255.9);
        let w: f64 = 256.0 * (512.0 * 6144.0 + 6144.0 * 256.0) * (0.5 + 1.0 / 16.0);
        assert!((w / 1e6 - 679.5).abs() < 1.0);
        assert!(all.gate_up_bytes + all.down_bytes >= w);
        assert!(all.per_layer_us > 370.0 && all.per_layer_us < 450.0, "{}", all.per_layer_us);
        // Monotonic in the batch, and the Server Edition is slower than the Workstation.
        let mut last = 0.0;
        for b in [1, 2, 4, 8, 16, 32, 64, 128, 256] {
            let s = glm5_decode_roofline(&pro, Family::Sm120, b).per_step_us;
            assert!(s > last);
            last = s;
        }
        assert!(
            glm5_decode_roofline(&server, Family::Sm120, 64).per_step_us
                > glm5_decode_roofline(&pro, Family::Sm120, 64).per_step_us
        );
        assert_eq!(glm5_decode_roofline(&pro, Family::Sm120, 0).per_step_us, 0.0);
    }
}
