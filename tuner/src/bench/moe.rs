//! The grouped MoE layer measured like the GEMM kernels: every candidate verified against the CPU
//! reference (`moe::reference`) before it is timed, cold L2 by rotating weight copies, CUDA-graph
//! replay, interleaved samples, medians with intervals. Shared by `fp4tune bench --moe` and the
//! grouped phase of `fp4tune tune`.
//!
//! W4A4 steps ([`StepData::new_for`] with NVFP4 activations) carry X quantized on the CPU with a
//! static input scale, the input scale of H and the alphas that include them. A W4A4 gate_up
//! candidate is checked on its bf16 H (against the reference on the NVFP4 X) and on its NVFP4 H
//! (bit for bit the activation quantizer applied to its own bf16 H, every routed row); a W4A4 down
//! candidate against the reference on the NVFP4 H the GPU holds; the layer also checks the X it
//! quantized on the GPU byte for byte.

use super::floors::Floors;
use super::moe_weights::{copies_for, LayerWeights};
use super::policy::TimingPolicy;
use super::stats::Summary;
use super::timer::{measure, LaunchFn};
use crate::compile::{Compiler, PtxasStats};
use crate::gpu::{DeviceBuf, Gpu, GpuError};
use crate::moe::reference::{self, Activations, ExpertWeights, Nvfp4Rows};
use crate::moe::schedule::{draw_routing, RouteSchedule, Routing, SplitMix64, TILE_BLOCK_M};
use crate::moe::templates::AlignForm;
use crate::moe::{GroupedConfig, MoeOp, MoeShape};
use crate::problem::AType;
use crate::runtime::moe::{
    GroupedKernel, MoeArgs, MoeKernels, MoeLauncher, MoeWorkspace, WorkspaceLayout,
};
use crate::runtime::RuntimeError;
use half::bf16;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Errors of a grouped measurement (a failed candidate is not one: it is data).
#[derive(Debug, thiserror::Error)]
pub enum MoeBenchError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Floor(#[from] super::floors::FloorError),
    #[error("moe_align on the GPU disagrees with the CPU schedule ({0})")]
    Schedule(String),
    #[error("moe_finalize on the GPU disagrees with the CPU reference in {0} elements")]
    Finalize(usize),
    #[error("the layer's quantized X differs from the CPU quantizer: {0}")]
    QuantizedX(String),
    #[error("preparing the W4A4 step: {0}")]
    Format(#[from] crate::format::FormatError),
    #[error("no verified {0} candidate: {1}")]
    NoCandidate(MoeOp, String),
    /// No grouped kernel of the device's family takes the layer (`moe::space::check_layer`).
    #[error("{0}")]
    NoKernel(String),
}

/// One routed decode or prefill step: a shape, B tokens, a routing draw.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MoeStep {
    pub shape: MoeShape,
    /// Experts of the whole model (ids are drawn from 0..experts_total; this GPU holds
    /// `expert_begin .. expert_begin + shape.experts`).
    pub experts_total: u32,
    pub expert_begin: i32,
    pub tokens: u32,
    pub routing: Routing,
    pub seed: u64,
}

impl MoeStep {
    pub fn ids(&self) -> Vec<i32> {
        draw_routing(self.seed, self.tokens, self.shape.top_k, self.experts_total, self.routing)
    }
}

/// The outcome of one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    Timed(Summary),
    Failed(String),
}

/// One measured candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub config: GroupedConfig,
    pub outcome: Outcome,
    /// What ptxas reported for its kernel on this machine (registers, spills), where it compiled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptxas: Option<PtxasStats>,
}

impl Measured {
    pub fn median(&self) -> Option<f64> {
        match &self.outcome {
            Outcome::Timed(s) => Some(s.median),
            Outcome::Failed(_) => None,
        }
    }
}

/// Bytes a W4A16 projection must move at least: the active experts' NVFP4 weights, the
/// activation rows in and the bf16 rows out.
pub fn roofline_bytes(shape: &MoeShape, op: MoeOp, s: &RouteSchedule, tokens: u32) -> u64 {
    roofline_bytes_for(shape, op, AType::Bf16, s, tokens)
}

/// Bytes a projection of activation type `a_type` must move at least: the active experts'
/// NVFP4 weights, the activation rows in (bf16, or NVFP4 codes and scales) and the rows out
/// (W4A4 gate_up: H in bf16 and in NVFP4).
pub fn roofline_bytes_for(
    shape: &MoeShape,
    op: MoeOp,
    a_type: AType,
    s: &RouteSchedule,
    tokens: u32,
) -> u64 {
    let rows = s.rows() as u64;
    let act = s.active_experts() as u64 * shape.expert_bytes(op);
    let (hidden, inter, tokens) = (shape.hidden as u64, shape.inter as u64, tokens as u64);
    // NVFP4 rows of n values: n/2 code bytes and n/16 scale bytes
    let fp4 = |rows: u64, n: u64| rows * (n / 2 + n / 16);
    match (op, a_type) {
        (MoeOp::GateUp, AType::Bf16) => act + tokens * hidden * 2 + rows * inter * 2,
        (MoeOp::Down, AType::Bf16) => act + rows * inter * 2 + rows * hidden * 2,
        (MoeOp::GateUp, AType::Nvfp4) => {
            act + fp4(tokens, hidden) + rows * inter * 2 + fp4(rows, inter)
        }
        (MoeOp::Down, AType::Nvfp4) => act + fp4(rows, inter) + rows * hidden * 2,
    }
}

/// The W4A4 side of a step: X quantized on the CPU with its input scale, H's input scale, the
/// alphas that include the input scales, on the host and on the GPU.
#[derive(Debug)]
pub struct W4a4Inputs {
    pub x_q: Nvfp4Rows,
    pub h_scale: f32,
    pub alpha13: Vec<f32>,
    pub alpha2: Vec<f32>,
    x_codes: DeviceBuf<u8>,
    x_sf: DeviceBuf<u8>,
    d_alpha13: DeviceBuf<f32>,
    d_alpha2: DeviceBuf<f32>,
}

/// Everything one step needs on the GPU: weight copies for cold L2, activations, routing,
/// a workspace, and the CPU side (weights, schedule) for verification.
#[derive(Debug)]
pub struct StepData {
    pub step: MoeStep,
    pub schedule: RouteSchedule,
    /// The layer's weights (shared by the steps of a run).
    pub weights: Arc<LayerWeights>,
    x_host: Vec<bf16>,
    weights_host: Vec<f32>,
    /// Rotation copies this step's timed launches cycle through (at most the uploaded ones).
    pub copies13: usize,
    pub copies2: usize,
    x: DeviceBuf<u16>,
    ids: DeviceBuf<i32>,
    topk_weights: DeviceBuf<f32>,
    y: DeviceBuf<u16>,
    pub ws: MoeWorkspace,
    /// Present when the step was built for NVFP4 activations.
    pub w4a4: Option<W4a4Inputs>,
}

impl StepData {
    /// A W4A16 step (bf16 activations).
    pub fn new(gpu: &Gpu, step: MoeStep, policy: &TimingPolicy) -> Result<Self, MoeBenchError> {
        Self::new_for(gpu, step, AType::Bf16, policy)
    }

    /// A step for activations of `a_type` (W4A4 steps can run W4A16 candidates too), with its
    /// own upload of the layer's weights.
    pub fn new_for(
        gpu: &Gpu,
        step: MoeStep,
        a_type: AType,
        policy: &TimingPolicy,
    ) -> Result<Self, MoeBenchError> {
        let schedule = RouteSchedule::build(&step.ids(), step.expert_begin, step.shape.experts);
        let copies = copies_for(gpu, &step.shape, &schedule, policy);
        let weights = Arc::new(LayerWeights::new(gpu, step.shape, copies)?);
        Self::with_weights(gpu, step, a_type, policy, weights)
    }

    /// A step on weights already on the device (`weights.shape` must be the step's).
    pub fn with_weights(
        gpu: &Gpu,
        step: MoeStep,
        a_type: AType,
        policy: &TimingPolicy,
        weights: Arc<LayerWeights>,
    ) -> Result<Self, MoeBenchError> {
        let shape = step.shape;
        if weights.shape != shape {
            return Err(MoeBenchError::Schedule(format!(
                "a step of {shape} on the weights of {}",
                weights.shape
            )));
        }
        let ids = step.ids();
        let schedule = RouteSchedule::build(&ids, step.expert_begin, shape.experts);
        let (need13, need2) = copies_for(gpu, &shape, &schedule, policy);
        let copies13 = need13.min(weights.copies.0);
        let copies2 = need2.min(weights.copies.1);
        let mut rng = SplitMix64(step.seed ^ 0x77);
        let x_host: Vec<bf16> = (0..shape.hidden as usize * step.tokens as usize)
            .map(|_| bf16::from_f32(rng.below(2001) as f32 / 500.0 - 2.0))
            .collect();
        let weights_host: Vec<f32> =
            (0..ids.len()).map(|_| (1 + rng.below(100)) as f32 / 100.0).collect();
        let w4a4 = match a_type {
            AType::Bf16 => None,
            AType::Nvfp4 => {
                Some(W4a4Inputs::new(gpu, &step, &schedule, &weights.w13, &weights.w2, &x_host)?)
            }
        };
        Ok(StepData {
            x: gpu.upload(&x_host.iter().map(|v| v.to_bits()).collect::<Vec<u16>>())?,
            ids: gpu.upload(&ids)?,
            topk_weights: gpu.upload(&weights_host)?,
            y: gpu.alloc_zeros::<u16>(shape.hidden as usize * step.tokens as usize)?,
            ws: MoeWorkspace::new(gpu, shape, step.tokens)?,
            weights,
            step,
            schedule,
            x_host,
            weights_host,
            copies13,
            copies2,
            w4a4,
        })
    }

    /// The W4A16 launch arguments with weight copy `c13` of gate_up and `c2` of down.
    pub fn args(&self, c13: usize, c2: usize) -> MoeArgs {
        let (w13, w13_sf) = self.weights.w13_at(c13 % self.copies13);
        let (w2, w2_sf) = self.weights.w2_at(c2 % self.copies2);
        MoeArgs {
            x: self.x.ptr(),
            topk_ids: self.ids.ptr(),
            topk_weights: self.topk_weights.ptr(),
            w13,
            w13_sf,
            alpha13: self.weights.alpha13.ptr(),
            w2,
            w2_sf,
            alpha2: self.weights.alpha2.ptr(),
            y: self.y.ptr(),
            tokens: self.step.tokens,
            expert_begin: self.step.expert_begin,
            ..MoeArgs::default()
        }
    }

    /// The launch arguments for activations of `a_type`. W4A4: the alphas with the input scales,
    /// and X as the CPU quantized it (`quantize_x` false) or as bf16 for the layer to quantize.
    /// `None` for W4A4 on a step built without NVFP4 activations.
    pub fn args_for(
        &self,
        a_type: AType,
        c13: usize,
        c2: usize,
        quantize_x: bool,
    ) -> Option<MoeArgs> {
        let base = self.args(c13, c2);
        match a_type {
            AType::Bf16 => Some(base),
            AType::Nvfp4 => {
                let q = self.w4a4.as_ref()?;
                Some(MoeArgs {
                    alpha13: q.d_alpha13.ptr(),
                    alpha2: q.d_alpha2.ptr(),
                    w4a4: 1,
                    x_scale: q.x_q.scale,
                    h_scale: q.h_scale,
                    x_fp4: if quantize_x { 0 } else { q.x_codes.ptr() },
                    x_sf: if quantize_x { 0 } else { q.x_sf.ptr() },
                    ..base
                })
            }
        }
    }

    /// The output `Y [tokens, hidden]` of the last layer run.
    pub fn y(&self, gpu: &Gpu) -> Result<Vec<u16>, GpuError> {
        gpu.download(&self.y)
    }

    fn ws_host(&self, gpu: &Gpu) -> Result<Vec<u8>, GpuError> {
        gpu.download(self.ws.buffer())
    }

    /// The GPU schedule equals the CPU one (offsets, sorted ids, inverse, every tile list), for
    /// both routing forms and (W4A4 steps where the layer takes it) for the routing launched
    /// with the quantization of X, whose X must equal the CPU quantizer's byte for byte; the form
    /// the layer takes runs last, so its schedule stays in the workspace.
    pub fn check_schedule(
        &self,
        gpu: &Gpu,
        launcher: &MoeLauncher<'_>,
    ) -> Result<(), MoeBenchError> {
        let layer = AlignForm::for_ids(self.step.tokens * self.step.shape.top_k);
        let other = match layer {
            AlignForm::OneCta => AlignForm::Chunked,
            AlignForm::Chunked => AlignForm::OneCta,
        };
        let fused = self
            .args_for(AType::Nvfp4, 0, 0, true)
            .filter(|a| launcher.fused_quantize_ctas(a, &self.ws).is_some());
        if let Some(args) = fused {
            self.check_schedule_as(gpu, launcher, RoutingLaunch::WithQuantize(args))?;
        }
        for form in [other, layer] {
            self.check_schedule_as(gpu, launcher, RoutingLaunch::Form(form))?;
        }
        Ok(())
    }

    fn check_schedule_as(
        &self,
        gpu: &Gpu,
        launcher: &MoeLauncher<'_>,
        launch: RoutingLaunch,
    ) -> Result<(), MoeBenchError> {
        let l = &self.ws.layout;
        // poison: no schedule entry (nor X byte) a launch leaves unwritten can pass for the CPU's
        gpu.fill_range(self.ws.buffer(), l.offsets..l.h, 0x5a)?;
        let stream = gpu.own_stream();
        let form = match launch {
            RoutingLaunch::Form(form) => {
                // SAFETY: the ids and the workspace are this device's, sized for `tokens`.
                unsafe { launcher.align_as(form, &self.args(0, 0), &self.ws, stream) }?;
                format!("{form:?} form")
            }
            RoutingLaunch::WithQuantize(args) => {
                // X's codes and scales, which the layout keeps together before H's codes
                gpu.fill_range(self.ws.buffer(), l.x_codes..l.h_codes, 0x5a)?;
                // SAFETY: the ids, bf16 X and the workspace are this device's, sized for `tokens`.
                unsafe { launcher.align_quantize_x(&args, &self.ws, stream) }?;
                "routing with the quantization of X".to_string()
            }
        };
        gpu.synchronize()?;
        let host = self.ws_host(gpu)?;
        if let (RoutingLaunch::WithQuantize(_), Some(q)) = (launch, &self.w4a4) {
            check_quantized_x(&host, l, q)?;
        }
        let ints = |off: usize, n: usize| -> Vec<i32> {
            host[off..off + 4 * n]
                .chunks(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let s = &self.schedule;
        let e = self.step.shape.experts as usize;
        let r = (self.step.tokens * self.step.shape.top_k) as usize;
        let mismatch = |what: &str| Err(MoeBenchError::Schedule(format!("{form}: {what}")));
        if ints(l.offsets, e + 1) != s.offsets {
            return mismatch("offsets");
        }
        if ints(l.sorted_ids, s.rows() as usize) != s.sorted_ids {
            return mismatch("sorted ids");
        }
        if ints(l.inverse, r) != s.inverse {
            return mismatch("inverse");
        }
        for (list, tiles) in s.tiles.iter().enumerate() {
            if ints(l.tile_count + 4 * list, 1)[0] as usize != tiles.len() {
                return mismatch("tile count");
            }
            let got = ints(l.tiles + list * l.max_tiles as usize * 16, 4 * tiles.len());
            for (t, g) in tiles.iter().zip(got.chunks(4)) {
                if [t.expert as i32, t.first_row as i32, t.rows as i32] != g[..3] {
                    return mismatch(&format!("tile list of BLOCK_M {}", TILE_BLOCK_M[list]));
                }
            }
        }
        Ok(())
    }

    /// Sorted rows checked per candidate: all of them up to 48, else 48 spread over the range
    /// (first and last included).
    fn sample_rows(&self) -> Vec<u32> {
        let rows = self.schedule.rows();
        if rows <= 48 {
            return (0..rows).collect();
        }
        (0..48).map(|i| (i as u64 * (rows as u64 - 1) / 47) as u32).collect()
    }

    fn bf16_at(host: &[u8], off: usize, i: usize) -> bf16 {
        bf16::from_bits(u16::from_le_bytes([host[off + 2 * i], host[off + 2 * i + 1]]))
    }
}

impl W4a4Inputs {
    /// X quantized with its input scale amax(X) / (6 * 448) (the calibration rule of ModelOpt's
    /// `input_scale`), and H's input scale from the amax of reference H rows (up to 8 sampled
    /// rows; larger H values elsewhere saturate their block scale, as calibrated scales do).
    fn new(
        gpu: &Gpu,
        step: &MoeStep,
        schedule: &RouteSchedule,
        w13: &ExpertWeights,
        w2: &ExpertWeights,
        x_host: &[bf16],
    ) -> Result<Self, MoeBenchError> {
        let (tokens, hidden) = (step.tokens as usize, step.shape.hidden as usize);
        let amax = |v: &mut dyn Iterator<Item = f32>| v.fold(0f32, |a, x| a.max(x.abs()));
        let x_amax = amax(&mut x_host.iter().map(|v| v.to_f32()));
        let x_scale = if x_amax > 0.0 { crate::format::weight_global_scale(x_amax) } else { 1.0 };
        let x_q = Nvfp4Rows::quantize(x_host, tokens, hidden, x_scale)?;
        let alpha13: Vec<f32> = w13.alpha.iter().map(|a| x_scale * a).collect();
        let rows = schedule.rows();
        let probe: Vec<u32> = if rows <= 8 {
            (0..rows).collect()
        } else {
            (0..8).map(|i| (i as u64 * (rows as u64 - 1) / 7) as u32).collect()
        };
        let top_k = step.shape.top_k as usize;
        let h_amax = probe
            .par_iter()
            .map(|&r| {
                let h = reference::gate_up_row(
                    w13,
                    &alpha13,
                    schedule,
                    top_k,
                    &Activations::Nvfp4(&x_q),
                    r,
                );
                h.iter().fold(0f32, |a, v| a.max(bf16::from_f32(*v).to_f32().abs()))
            })
            .reduce(|| 0f32, f32::max);
        let h_scale = if h_amax > 0.0 { crate::format::weight_global_scale(h_amax) } else { 1.0 };
        let alpha2: Vec<f32> = w2.alpha.iter().map(|a| h_scale * a).collect();
        Ok(W4a4Inputs {
            x_codes: gpu.upload(&x_q.codes)?,
            x_sf: gpu.upload(&x_q.sf)?,
            d_alpha13: gpu.upload(&alpha13)?,
            d_alpha2: gpu.upload(&alpha2)?,
            x_q,
            h_scale,
            alpha13,
            alpha2,
        })
    }
}

/// The reference rows of one op for the sampled rows (computed once per step and op; down
/// takes the H the GPU holds).
struct Reference {
    rows: Vec<u32>,
    values: Vec<Vec<f32>>,
}

fn reference_rows(d: &StepData, op: MoeOp, a_type: AType, h_gpu: &Activations<'_>) -> Reference {
    let rows = d.sample_rows();
    let top_k = d.step.shape.top_k as usize;
    let hidden = d.step.shape.hidden as usize;
    let w4a4 = d.w4a4.as_ref().filter(|_| a_type == AType::Nvfp4);
    let (x, alpha13, alpha2) = match w4a4 {
        Some(q) => (Activations::Nvfp4(&q.x_q), &q.alpha13, &q.alpha2),
        None => (
            Activations::Bf16 { x: &d.x_host, k: hidden },
            &d.weights.w13.alpha,
            &d.weights.w2.alpha,
        ),
    };
    let values = rows
        .par_iter()
        .map(|&r| match op {
            MoeOp::GateUp => {
                reference::gate_up_row(&d.weights.w13, alpha13, &d.schedule, top_k, &x, r)
            }
            MoeOp::Down => reference::down_row(&d.weights.w2, alpha2, &d.schedule, h_gpu, r),
        })
        .collect();
    Reference { rows, values }
}

/// The bf16 H (sorted rows) in a downloaded workspace.
fn h_bf16(d: &StepData, host: &[u8]) -> Vec<bf16> {
    let n = d.schedule.rows() as usize * d.step.shape.inter as usize;
    (0..n).map(|i| StepData::bf16_at(host, d.ws.layout.h, i)).collect()
}

/// The NVFP4 H (codes and swizzled scales over the routed rows) in a downloaded workspace.
fn h_nvfp4(d: &StepData, host: &[u8], h_scale: f32) -> Nvfp4Rows {
    let (rows, inter) = (d.schedule.rows() as usize, d.step.shape.inter as usize);
    let l = &d.ws.layout;
    Nvfp4Rows {
        rows,
        k: inter,
        codes: host[l.h_codes..][..rows * inter / 2].to_vec(),
        sf: host[l.h_sf..][..crate::format::swizzled_len(rows, inter / 16)].to_vec(),
        scale: h_scale,
    }
}

/// Verify the op's output in the downloaded workspace against `reference`; `None` when it
/// matches. W4A4 gate_up: the NVFP4 H must also be the activation quantizer's output of the bf16
/// H, byte for byte over every routed row.
fn verify(
    d: &StepData,
    op: MoeOp,
    a_type: AType,
    host: &[u8],
    reference: &Reference,
) -> Option<String> {
    let shape = d.step.shape;
    let (off, width) = match op {
        MoeOp::GateUp => (d.ws.layout.h, shape.inter as usize),
        MoeOp::Down => (d.ws.layout.y_rows, shape.hidden as usize),
    };
    for (r, want) in reference.rows.iter().zip(&reference.values) {
        let row_max = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (j, w) in want.iter().enumerate() {
            let got = StepData::bf16_at(host, off, *r as usize * width + j);
            if !reference::matches(got, *w, row_max) {
                return Some(format!(
                    "wrong result: sorted row {r}, column {j}: {} instead of {w}",
                    got.to_f32()
                ));
            }
        }
    }
    if op == MoeOp::GateUp && a_type == AType::Nvfp4 {
        let Some(q) = d.w4a4.as_ref() else {
            return Some("the step was built without NVFP4 activations".into());
        };
        let rows = d.schedule.rows() as usize;
        let want = match Nvfp4Rows::quantize(&h_bf16(d, host), rows, width, q.h_scale) {
            Ok(w) => w,
            Err(e) => return Some(format!("quantizing the GPU's H on the CPU: {e}")),
        };
        let got = h_nvfp4(d, host, q.h_scale);
        if let Some(diff) = want.first_difference(&got.codes, &got.sf) {
            return Some(format!("H as NVFP4 differs from the quantized bf16 H: {diff}"));
        }
    }
    None
}

/// Measure `configs` of one op on one step: compile, verify each against the reference, then time
/// the verified ones interleaved under `policy` with weight copies rotated. Failures are data.
/// The activation type is the first configuration's; a configuration of another type, or a
/// W4A4 one on a step without NVFP4 activations, fails. `down_input`: for down, the gate_up
/// kernel (of the same activation type) that writes the H it reads.
#[allow(clippy::too_many_arguments)]
pub fn measure_op(
    gpu: &Gpu,
    compiler: &Compiler,
    policy: &TimingPolicy,
    launcher: &MoeLauncher<'_>,
    d: &StepData,
    op: MoeOp,
    configs: &[GroupedConfig],
    down_input: Option<&GroupedKernel>,
) -> Result<Vec<Measured>, MoeBenchError> {
    let measured = measure_op_samples(gpu, compiler, policy, launcher, d, op, configs, down_input)?;
    Ok(measured.into_iter().map(|(m, _)| m).collect())
}

/// [`measure_op`] with every timed candidate's samples (per-launch microseconds, in the order
/// taken; empty for failed candidates).
#[allow(clippy::too_many_arguments)]
pub fn measure_op_samples(
    gpu: &Gpu,
    compiler: &Compiler,
    policy: &TimingPolicy,
    launcher: &MoeLauncher<'_>,
    d: &StepData,
    op: MoeOp,
    configs: &[GroupedConfig],
    down_input: Option<&GroupedKernel>,
) -> Result<Vec<(Measured, Vec<f64>)>, MoeBenchError> {
    let Some(a_type) = configs.first().map(|c| c.a_type) else { return Ok(Vec::new()) };
    let failed = |c: &GroupedConfig, why: String| {
        (Measured { config: *c, outcome: Outcome::Failed(why), ptxas: None }, Vec::new())
    };
    let Some(args) = d.args_for(a_type, 0, 0, false) else {
        return Ok(configs
            .iter()
            .map(|c| failed(c, "the step was built without NVFP4 activations".into()))
            .collect());
    };
    let stream = gpu.own_stream();
    let input = match op {
        MoeOp::GateUp => None,
        MoeOp::Down => Some(down_input.filter(|k| k.config.a_type == a_type).ok_or_else(|| {
            MoeBenchError::NoCandidate(
                MoeOp::GateUp,
                format!("down needs a {a_type} gate_up kernel to produce H"),
            )
        })?),
    };
    // The schedule (and for down the H) in `ws`: the step's workspace for the reference and the
    // timing, a fresh zeroed one for each candidate's verification (so no candidate is judged on
    // what an earlier one wrote).
    let prepare = |ws: &MoeWorkspace| -> Result<(), MoeBenchError> {
        // SAFETY: the step's buffers and `ws` are this device's, sized for its tokens and
        // shape, alive for the whole function; the Gpu's own stream (so for every launch below).
        unsafe { launcher.align(&args, ws, stream) }?;
        if let Some(gu) = input {
            // SAFETY: as above.
            unsafe { launcher.grouped(gu, &args, ws, stream) }?;
        }
        Ok(())
    };
    prepare(&d.ws)?;
    gpu.synchronize()?;
    let host_in = if op == MoeOp::Down { d.ws_host(gpu)? } else { Vec::new() };
    let h_bf = if op == MoeOp::Down { h_bf16(d, &host_in) } else { Vec::new() };
    let h_fp4 = match (&d.w4a4, op) {
        (Some(q), MoeOp::Down) => Some(h_nvfp4(d, &host_in, q.h_scale)),
        _ => None,
    };
    let h_gpu = match (&h_fp4, a_type) {
        (Some(q), AType::Nvfp4) => Activations::Nvfp4(q),
        _ => Activations::Bf16 { x: &h_bf, k: d.step.shape.inter as usize },
    };
    let reference = reference_rows(d, op, a_type, &h_gpu);
    // Compile everything in parallel (cache hits are free), then load, run once and verify.
    let sources: Vec<_> = configs.iter().map(|c| c.source()).collect();
    let compiled = compiler.compile_many(&sources);
    let mut out: Vec<(Measured, Vec<f64>)> = Vec::with_capacity(configs.len());
    let mut ready: Vec<(usize, GroupedKernel)> = Vec::new();
    for (c, r) in configs.iter().zip(compiled) {
        if c.a_type != a_type {
            out.push(failed(c, format!("a {} candidate in a {a_type} measurement", c.a_type)));
            continue;
        }
        let k = match r {
            Err(e) => {
                out.push(failed(c, format!("compile: {e}")));
                continue;
            }
            Ok(k) => k,
        };
        // every record of this candidate from here on carries its ptxas statistics
        let failed = |c: &GroupedConfig, why: String| {
            let (m, samples) = failed(c, why);
            (Measured { ptxas: k.stats, ..m }, samples)
        };
        // A kernel that spills or does not load is a failed candidate, not an error of the run.
        let kernel = match GroupedKernel::from_compiled(gpu, *c, &k) {
            Ok(kernel) => kernel,
            Err(e) => {
                out.push(failed(c, format!("load: {e}")));
                continue;
            }
        };
        let ws = MoeWorkspace::new(gpu, d.step.shape, d.step.tokens)?;
        prepare(&ws)?;
        // SAFETY: as in `prepare`.
        let run = unsafe { launcher.grouped(&kernel, &args, &ws, stream) }
            .map_err(|e| e.to_string())
            .and_then(|_| gpu.synchronize().map_err(|e| e.to_string()));
        if let Err(e) = run {
            // A launch failure can poison the context: keep the record, run nothing more.
            out.push(failed(c, format!("launch: {e}")));
            return Ok(out);
        }
        let host = gpu.download(ws.buffer())?;
        // H as this activation type's gate_up writes it: bf16, and for W4A4 also NVFP4 codes (a
        // W4A16 gate_up leaves the codes region alone, which may hold an earlier W4A4 step's H
        // in the step's workspace and zeros in the fresh one).
        let same_input = op == MoeOp::GateUp || {
            let l = &d.ws.layout;
            let rows = d.schedule.rows() as usize;
            let inter = d.step.shape.inter as usize;
            let bf16_h = (l.h, rows * inter * 2);
            let regions = match a_type {
                AType::Nvfp4 => vec![bf16_h, (l.h_codes, rows * inter / 2)],
                AType::Bf16 => vec![bf16_h],
            };
            regions.iter().all(|&(o, n)| host[o..o + n] == host_in[o..o + n])
        };
        let verdict = if same_input {
            verify(d, op, a_type, &host, &reference)
        } else {
            Some("the gate_up kernel wrote another H than on the step's workspace".into())
        };
        match verdict {
            Some(why) => out.push(failed(c, why)),
            None => {
                ready.push((out.len(), kernel));
                out.push(failed(c, "not timed".into()));
            }
        }
    }
    // Time the verified kernels, interleaved, each launch on the next weight copy.
    let copies = match op {
        MoeOp::GateUp => d.copies13,
        MoeOp::Down => d.copies2,
    };
    let launches: Vec<LaunchFn<'_>> = ready
        .iter()
        .map(|(_, kernel)| {
            Box::new(move |i: usize| {
                let a = d.args_for(a_type, i % copies, i % copies, false).unwrap_or(args);
                // SAFETY: as above; copy i % copies lies inside the weight buffers.
                unsafe { launcher.grouped(kernel, &a, &d.ws, stream) }.map_err(|e| match e {
                    RuntimeError::Gpu(g) => g,
                    other => GpuError::Kernel {
                        kernel: kernel.config.name(),
                        message: other.to_string(),
                    },
                })
            }) as LaunchFn<'_>
        })
        .collect();
    let times = measure(gpu, policy, copies, launches);
    for ((slot, _), t) in ready.iter().zip(times) {
        let (m, samples) = &mut out[*slot];
        m.outcome = match t {
            Ok(s) => match Summary::of(&s.us) {
                Some(sum) => {
                    *samples = s.us;
                    Outcome::Timed(sum)
                }
                None => Outcome::Failed("no samples".into()),
            },
            Err(e) => Outcome::Failed(format!("timing: {e}")),
        };
    }
    Ok(out)
}

/// The fastest timed candidate.
pub fn best(measured: &[Measured]) -> Option<&Measured> {
    measured
        .iter()
        .filter(|m| m.median().is_some())
        .min_by(|a, b| a.median().unwrap().total_cmp(&b.median().unwrap()))
}

/// What writes the schedule in `StepData::check_schedule_as`: a routing form alone, or the
/// one-CTA routing with the quantization of X (these arguments: W4A4, bf16 X).
#[derive(Clone, Copy)]
enum RoutingLaunch {
    Form(AlignForm),
    WithQuantize(MoeArgs),
}

#[path = "moe_layer.rs"]
mod layer;
use layer::check_quantized_x;
pub use layer::{measure_layer, LayerTimes};

#[path = "moe_run.rs"]
mod run;
pub use run::{
    run_moe_bench, run_moe_bench_for, runs_as_itself, screen_candidates, spread, with_default,
    FamilyDefaults, MoeBenchPlan, MoeProgress, MoeRow, OpLog, DEFAULT_IMPL,
};

#[path = "moe_loop.rs"]
pub mod moe_loop;

#[cfg(test)]
#[path = "moe_gpu_tests.rs"]
mod gpu_tests;
