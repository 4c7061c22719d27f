//! A grouped layer's expert weights (gate_up and down, every expert of the GPU) on the host and
//! on the device, with the rotation copies that keep timed launches cold in L2. The weights are a
//! function of the layer's shape only, so every step of a run (each token count, each routing)
//! shares one upload: a step uses as many of the copies as its touched experts need.

use super::moe::MoeStep;
use super::policy::{rotation_copies, TimingPolicy};
use crate::gpu::{DeviceBuf, Gpu, GpuError};
use crate::moe::order::{self, WeightOrder};
use crate::moe::reference::ExpertWeights;
use crate::moe::schedule::RouteSchedule;
use crate::moe::{MoeOp, MoeShape};
use std::sync::OnceLock;

/// The seed every layer's random weights are drawn from (gate_up and down derive theirs).
pub const WEIGHT_SEED: u64 = 0x5EED_3EED;

/// Rotation copies of one projection's whole expert stack (bounds the device memory of a step
/// whose routing touches very few experts).
pub const MAX_COPIES: usize = 64;

/// Rotation copies (gate_up, down) a step needs: enough copies of the experts its schedule
/// touches to exceed the policy's multiple of L2.
pub fn copies_for(
    gpu: &Gpu,
    shape: &MoeShape,
    schedule: &RouteSchedule,
    policy: &TimingPolicy,
) -> (usize, usize) {
    let l2 = gpu.info().l2_bytes;
    let touched = |op| (schedule.active_experts().max(1) as u64) * shape.expert_bytes(op);
    let copies = |op| rotation_copies(touched(op), l2, policy.l2_multiple).clamp(1, MAX_COPIES);
    (copies(MoeOp::GateUp), copies(MoeOp::Down))
}

/// One layer's expert weights, host and device.
#[derive(Debug)]
pub struct LayerWeights {
    pub shape: MoeShape,
    /// Fused [gate; up] weights `[E, 2I, K/2]` and scales, one alpha per expert.
    pub w13: ExpertWeights,
    /// Down weights `[E, hidden, I/2]` and scales.
    pub w2: ExpertWeights,
    /// Codes and scales of every copy, one buffer each, copy c at c * (bytes of one copy).
    w13_codes: DeviceBuf<u8>,
    w13_sf: DeviceBuf<u8>,
    w2_codes: DeviceBuf<u8>,
    w2_sf: DeviceBuf<u8>,
    pub alpha13: DeviceBuf<f32>,
    pub alpha2: DeviceBuf<f32>,
    /// Copies uploaded (gate_up, down).
    pub copies: (usize, usize),
    /// The layout the device's grouped kernels read the codes in (`moe::order`): the copies above
    /// are uploaded in it.
    pub order: WeightOrder,
    /// The copies' codes in the ModelOpt layout, for the per-expert GEMMs of the loop peer when
    /// the grouped kernels read another layout (uploaded on first use).
    modelopt: OnceLock<(DeviceBuf<u8>, DeviceBuf<u8>)>,
}

impl LayerWeights {
    /// The shape's weights with `copies` (gate_up, down) rotation copies on the device.
    pub fn new(gpu: &Gpu, shape: MoeShape, copies: (usize, usize)) -> Result<Self, GpuError> {
        let (n13, k13) = shape.nk(MoeOp::GateUp);
        let (n2, k2) = shape.nk(MoeOp::Down);
        let e = shape.experts as usize;
        let w13 = ExpertWeights::random(n13 as usize, k13 as usize, e, WEIGHT_SEED ^ 0x13);
        let w2 = ExpertWeights::random(n2 as usize, k2 as usize, e, WEIGHT_SEED ^ 0x2);
        let copies = (copies.0.clamp(1, MAX_COPIES), copies.1.clamp(1, MAX_COPIES));
        // a device of no known family runs no grouped kernel: its order is moot
        let order =
            crate::runtime::family_for(gpu.info()).map_or(WeightOrder::ModelOpt, WeightOrder::of);
        let (n13, k13, n2, k2) = (n13 as usize, k13 as usize, n2 as usize, k2 as usize);
        Ok(LayerWeights {
            w13_codes: gpu.upload_repeated(
                &order::apply(order, MoeOp::GateUp, n13, k13, &w13.codes),
                copies.0,
            )?,
            w13_sf: gpu.upload_repeated(&w13.scales, copies.0)?,
            w2_codes: gpu
                .upload_repeated(&order::apply(order, MoeOp::Down, n2, k2, &w2.codes), copies.1)?,
            w2_sf: gpu.upload_repeated(&w2.scales, copies.1)?,
            alpha13: gpu.upload(&w13.alpha)?,
            alpha2: gpu.upload(&w2.alpha)?,
            shape,
            w13,
            w2,
            copies,
            order,
            modelopt: OnceLock::new(),
        })
    }

    /// Device address of op's codes in copy `c` in the ModelOpt order (what `fp4tune_gemm`
    /// reads); the scales are those of `w13_at` / `w2_at`.
    pub fn modelopt_codes_at(&self, gpu: &Gpu, op: MoeOp, c: usize) -> Result<u64, GpuError> {
        let (w13, w2) = match self.order {
            WeightOrder::ModelOpt => (&self.w13_codes, &self.w2_codes),
            WeightOrder::Grouped => {
                if self.modelopt.get().is_none() {
                    let bufs = (
                        gpu.upload_repeated(&self.w13.codes, self.copies.0)?,
                        gpu.upload_repeated(&self.w2.codes, self.copies.1)?,
                    );
                    // a concurrent first use uploads twice; either copy is the same bytes
                    let _ = self.modelopt.set(bufs);
                }
                let (a, b) = self.modelopt.get().expect("set above");
                (a, b)
            }
        };
        Ok(match op {
            MoeOp::GateUp => w13.ptr() + ((c % self.copies.0) * self.w13.codes.len()) as u64,
            MoeOp::Down => w2.ptr() + ((c % self.copies.1) * self.w2.codes.len()) as u64,
        })
    }

    /// The shape's weights with the rotation copies the sparsest of `steps` needs (one upload
    /// for all of them; each step uses as many copies as it needs itself).
    pub fn for_steps(
        gpu: &Gpu,
        shape: MoeShape,
        steps: impl IntoIterator<Item = MoeStep>,
        policy: &TimingPolicy,
    ) -> Result<Self, GpuError> {
        let mut copies = (1, 1);
        for s in steps {
            let schedule = RouteSchedule::build(&s.ids(), s.expert_begin, shape.experts);
            let c = copies_for(gpu, &shape, &schedule, policy);
            copies = (copies.0.max(c.0), copies.1.max(c.1));
        }
        Self::new(gpu, shape, copies)
    }

    /// Device addresses of gate_up's codes and scales in copy `c` (modulo the copies uploaded).
    pub fn w13_at(&self, c: usize) -> (u64, u64) {
        let c = c % self.copies.0;
        (
            self.w13_codes.ptr() + (c * self.w13.codes.len()) as u64,
            self.w13_sf.ptr() + (c * self.w13.scales.len()) as u64,
        )
    }

    /// Device addresses of down's codes and scales in copy `c` (modulo the copies uploaded).
    pub fn w2_at(&self, c: usize) -> (u64, u64) {
        let c = c % self.copies.1;
        (
            self.w2_codes.ptr() + (c * self.w2.codes.len()) as u64,
            self.w2_sf.ptr() + (c * self.w2.scales.len()) as u64,
        )
    }
}
