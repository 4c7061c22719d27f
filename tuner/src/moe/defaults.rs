//! The family defaults of a grouped layer that no table has entries for: per op and token bucket
//! one configuration legal for the layer's shape, so that the grouped layer runs on any layer
//! and GPU of a kernel family before it is tuned (a tune measures the space and is faster).
//!
//! A bucket's configuration starts from a template chosen by the routed rows per expert, `B x
//! top_k / experts_total` for a layer of `experts_total` routed experts in the whole model (all
//! of them local under tensor parallelism; an expert-parallel GPU holds `experts` of them, and
//! routes each of its experts as many rows as any other GPU does). Family sm90's templates are the
//! picks of the H200 tune of the GLM-5 TP8 layer (`results/nvidia-h200.ron`, W4A16 and W4A4),
//! whose B = 1..4096 are 1/32..128 rows per expert. Family sm120 has no measurement: its template
//! follows the space's rules (the smallest tile list that holds most experts' rows, K split over
//! CTAs while the step has fewer tiles than SMs). An sm90 down template of a step that touches
//! few experts, or of a K longer than one pass, is adapted to it ([`fit_down_template`]: narrower
//! tiles, the K in one pass over more warps, a deeper ring), and so is a W4A16 gate_up template
//! of a step with fewer CTAs than SMs ([`fit_gate_up_template`]: 16-row tiles, a deeper warp
//! ring at more CTAs per SM). Where a template is not legal for the
//! shape (its K passes, ring depth or tiles do not fit), the default is the configuration of the
//! shape's search space nearest to it ([`distance`]), so a default is always a member of the
//! space a tune would measure.

use super::config::GroupedConfig;
use super::seeds::R;
use super::space::search_space_for;
use super::{MoeOp, MoeShape};
use crate::problem::AType;
use crate::template::Family;

/// The token buckets the defaults are chosen for (a launch takes the nearest in log scale, as it
/// does among a table's buckets).
pub const DEFAULT_BUCKETS: [u32; 12] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096];

/// Every (op, bucket, configuration) of the family defaults of `shape` with activations
/// `a_type`, in a model of `experts_total` routed experts (`shape.experts` when every expert is
/// local), on a GPU of `sm_count` SMs; the error of [`super::space::check_layer`] (one line
/// naming the projection and what the family's kernels take) when a projection has no legal one,
/// or of an `experts_total` below the layer's local experts.
pub fn default_routes(
    family: Family,
    a_type: AType,
    shape: &MoeShape,
    experts_total: u32,
    sm_count: u32,
) -> Result<Vec<(MoeOp, u32, GroupedConfig)>, String> {
    check_experts_total(shape, experts_total)?;
    super::space::check_layer(family, a_type, shape)?;
    let mut out = Vec::with_capacity(2 * DEFAULT_BUCKETS.len());
    for op in MoeOp::ALL {
        let space = search_space_for(family, a_type, op, shape);
        let streamed = space.iter().any(|c| !c.tiled);
        for tokens in DEFAULT_BUCKETS {
            let routed = Routed::new(shape, experts_total, tokens);
            let t = template(family, a_type, op, shape, &routed, sm_count, streamed);
            out.push((op, tokens, nearest(&t, &space)));
        }
    }
    Ok(out)
}

/// An error naming the layer when `experts_total` (the model's routed experts) is below its
/// local experts.
pub fn check_experts_total(shape: &MoeShape, experts_total: u32) -> Result<(), String> {
    if experts_total < shape.experts {
        return Err(format!(
            "{shape}: the model's routed experts ({experts_total}) are fewer than the layer's \
             {} local experts",
            shape.experts
        ));
    }
    Ok(())
}

/// What a uniform routing of `tokens` brings one GPU's experts on average.
struct Routed {
    /// Routed rows of one local expert (`tokens x top_k / experts_total`).
    per_expert: f64,
    /// Routed rows of all local experts, rounded up (`tokens x top_k` when all are local).
    local: u64,
    /// Local experts expected to get at least one row (Poisson: `experts x (1 - e^-per_expert)`).
    active: f64,
}

impl Routed {
    fn new(shape: &MoeShape, experts_total: u32, tokens: u32) -> Self {
        let total = u64::from(experts_total.max(1));
        let rows = u64::from(tokens) * u64::from(shape.top_k);
        let per_expert = rows as f64 / total as f64;
        Routed {
            per_expert,
            local: (rows * u64::from(shape.experts)).div_ceil(total),
            active: f64::from(shape.experts) * -(-per_expert).exp_m1(),
        }
    }
}

/// The configuration a bucket starts from (not necessarily legal for `shape`); `streamed`: the
/// layer's space for `op` has streamed kernels (its K is one they take).
fn template(
    family: Family,
    a_type: AType,
    op: MoeOp,
    shape: &MoeShape,
    routed: &Routed,
    sm_count: u32,
    streamed: bool,
) -> GroupedConfig {
    match family {
        Family::Sm90 => {
            let t = sm90_template(a_type, op, routed.per_expert);
            let t = fit_down_template(t, shape, routed, sm_count, streamed);
            fit_gate_up_template(t, shape, routed, sm_count, streamed)
        }
        Family::Sm120 => sm120_template(op, shape, routed, sm_count),
    }
}

/// A streamed down template of a decode step (8-row tiles) adapted to a layer whose step touches
/// few experts or has a long K. The sm90 rows come from a layer whose step touches many experts
/// with a K of one pass (GLM-5 TP8 down: 8 experts at B = 1, 48 tiles of 128 rows each, K = 256);
/// a layer of few experts per step (Mixtral over 8 GPUs: 2 of 8 at B = 1; GLM-5 EP8: about 2 of
/// its 32 at B = 2) would run 50-200 CTAs of 128 rows over a K of 1792 or 2048. So:
/// - half the rows per CTA at 16 rows per warp, until the CTAs of the expected active experts
///   are at least twice the SMs or the tile has 32 rows;
/// - where the layer has streamed kernels (`streamed`), even 64-row tiles would give fewer CTAs
///   than twice the SMs and the K takes more than one pass of the template: the whole K in one
///   pass, over 2 warps along K where an SM would hold fewer than about 6 warps (the down
///   spaces' most; each warp keeps whole chunks of 128 k, at least 4), and for W4A16 the warp
///   ring that runs on across tiles with the activations in it (`pf`, 4 stages at 2 CTAs per SM,
///   the persistent walk; where 4 stages divide a warp's chunks the space has the `pa` form
///   instead and the nearest is `pf5`): the form of the fastest Mixtral TP8 down kernel at B = 1
///   (`m8n32k1792_w2x2_pf4_s1_o2_walk4`) and of the H200 EP8 table's W4A16 down picks at B = 1
///   and 2;
/// - a register ring of two stages where the K takes more than one pass of the template (W4A4
///   also where it is then taken whole: one stage leaves a warp without a load in flight while
///   it computes).
///
/// A layer whose K no streamed kernel takes gets the tiled configuration nearest to the narrowed
/// template (Qwen3-235B TP8 down at B = 1: 64-row instead of 128-row tiles, 1.01x faster).
/// Measured on an H100 without a table (`results/h100/grouped-defaults.md`) and on an H200
/// (`results/h200/bench-moe-recheck.md`).
fn fit_down_template(
    t: GroupedConfig,
    shape: &MoeShape,
    routed: &Routed,
    sm_count: u32,
    streamed: bool,
) -> GroupedConfig {
    if t.op != MoeOp::Down || t.tiled || t.block_m != 8 {
        return t;
    }
    let (n, k) = shape.nk(t.op);
    let sms = f64::from(sm_count);
    let ctas = |block_n: u32| routed.active * f64::from(n.div_ceil(block_n));
    let mut c = t;
    while c.block_n > 32 && ctas(c.block_n) < 2.0 * sms {
        c.block_n /= 2;
        c.warps_n = c.block_n / 16;
    }
    let passes = k > c.block_k;
    if streamed && passes && c.block_n == 32 && ctas(64) < 2.0 * sms {
        c.block_k = k;
        let warps_per_sm = ctas(c.block_n) * f64::from(c.warps_n * c.warps_k) / sms;
        if warps_per_sm < 6.0 && c.warps_k == 1 && k % 256 == 0 && k / 2 >= 4 * 128 {
            c.warps_k = 2;
        }
        if c.a_type == AType::Bf16 {
            (c.warp_ring, c.a_smem, c.flow) = super::seeds::PF;
            (c.depth, c.min_ctas, c.walk) = (4, 2, 4);
        }
    }
    if !c.warp_ring && c.depth == 1 && passes {
        c.depth = 2;
    }
    c
}

/// A W4A16 streamed gate_up template of a decode step (8-row tiles of 32 weight rows) adapted to
/// a layer with streamed kernels (`streamed`) whose step gives fewer CTAs than SMs: where the
/// expected active experts' n-tiles of 32 rows would leave a fifth of the SMs without one, 16
/// weight rows per CTA, 4 warps along K of one chunk per pass each, a warp ring of 4 stages with the activations in it at 4 CTAs per SM
/// (`m8n16k512_w1x4_pa4_s1_o4_walk2`). The sm90 rows come from GLM-5 TP8 (N = 512: about 126
/// CTAs at B = 1 on 132 SMs); Qwen3-235B over 8 GPUs (N = 384, 8 of 128 experts) would run about
/// 93, Qwen3-Next (N = 128, 10 of 512) about 40. That kernel was the fastest measured at B = 1
/// on Qwen3-235B, Qwen3-30B-A3B and GLM-4.5-Air TP8 (`results/h100/grouped-defaults.md`); the
/// H100 tunes of Qwen3-Next and DeepSeek-V3 TP8 (`results/h100/heldout-*`) pick 16-row tiles
/// there too. On a K whose passes of 512 do not come in multiples of 4 per warp (a hidden size
/// of 5120 or 1536), the nearest member of the space has fewer stages: on GLM-4.5 TP8 (hidden
/// 5120) at B = 1 that kernel (`pa2`) was the fastest measured (hidden 1536 unmeasured).
fn fit_gate_up_template(
    t: GroupedConfig,
    shape: &MoeShape,
    routed: &Routed,
    sm_count: u32,
    streamed: bool,
) -> GroupedConfig {
    let streamed_32 = !t.tiled && t.block_m == 8 && t.block_n == 32 && t.warps_n == 1;
    if !streamed || t.op != MoeOp::GateUp || t.a_type != AType::Bf16 || !streamed_32 {
        return t;
    }
    let (n, _) = shape.nk(t.op);
    if routed.active * f64::from(n.div_ceil(32)) >= 0.8 * f64::from(sm_count) {
        return t;
    }
    let (warp_ring, a_smem, flow) = super::seeds::PA;
    GroupedConfig {
        block_n: 16,
        block_k: 512,
        warps_k: 4,
        depth: 4,
        min_ctas: 4,
        walk: 2,
        warp_ring,
        a_smem,
        flow,
        ..t
    }
}

/// The kernel form of a template row: weights in the register ring (`R`), the warp ring (`P`),
/// the warp ring with the activations (`PA`); the tiled kernel (`T`), its wgmma form (`W`).
#[derive(Clone, Copy, PartialEq)]
enum Form {
    R,
    P,
    Pa,
    T,
    W,
}

/// (GLM-5 TP8 B, [block_m, block_n, block_k], [warps_n, warps_k], form, depth, min_ctas, walk):
/// the H200 table's pick at that B (split_k 1 throughout).
type Row = (u32, [u32; 3], [u32; 2], Form, u32, u32, u32);

#[rustfmt::skip]
const SM90_W4A16_GATE_UP: &[Row] = &[
    (1, [8, 32, 1024], [1, 8], Form::Pa, 3, 2, 0),
    (2, [8, 32, 1024], [1, 4], Form::Pa, 3, 2, 0),
    (4, [8, 32, 512], [1, 4], Form::Pa, 3, 4, 0),
    (256, [16, 256, 128], [8, 1], Form::T, 3, 1, 0),
    (512, [32, 64, 128], [2, 1], Form::T, 4, 1, 0),
    (4096, [128, 256, 64], [8, 1], Form::W, 4, 1, 0),
];

#[rustfmt::skip]
const SM90_W4A16_DOWN: &[Row] = &[
    (1, [8, 128, 256], [4, 1], Form::R, 1, 2, 0),
    (2, [8, 128, 256], [4, 1], Form::R, 1, 4, 4),
    (4, [8, 128, 256], [2, 1], Form::R, 2, 4, 4),
    (256, [16, 128, 256], [2, 1], Form::P, 2, 3, 4),
    (1024, [32, 128, 64], [4, 1], Form::T, 4, 1, 0),
    (4096, [64, 128, 64], [4, 1], Form::T, 3, 3, 0),
];

#[rustfmt::skip]
const SM90_W4A4_GATE_UP: &[Row] = &[
    (1, [8, 32, 6144], [1, 8], Form::R, 2, 1, 2),
    (2, [8, 64, 6144], [2, 4], Form::P, 4, 1, 0),
    (4, [8, 64, 1024], [2, 4], Form::R, 1, 2, 2),
    (8, [8, 32, 6144], [1, 4], Form::P, 4, 1, 0),
    (512, [16, 64, 1024], [1, 4], Form::P, 4, 2, 2),
    (4096, [32, 64, 6144], [2, 4], Form::P, 4, 1, 2),
];

#[rustfmt::skip]
const SM90_W4A4_DOWN: &[Row] = &[
    (1, [8, 128, 256], [4, 1], Form::R, 1, 1, 0),
    (4, [8, 128, 256], [4, 1], Form::R, 2, 1, 4),
    (256, [16, 128, 256], [4, 1], Form::R, 1, 4, 0),
    (512, [16, 128, 256], [4, 1], Form::R, 2, 2, 4),
    (1024, [32, 128, 256], [4, 1], Form::R, 1, 2, 4),
];

/// The GLM-5 TP8 layer the sm90 rows were tuned on (256 experts, top-8: B / 32 rows per expert).
const ROWS_PER_TP8_TOKEN: f64 = 8.0 / 256.0;

/// The sm90 row whose rows per expert are the largest not above `rows` (the first row below
/// them all), as a configuration.
fn sm90_template(a_type: AType, op: MoeOp, rows: f64) -> GroupedConfig {
    let table = match (a_type, op) {
        (AType::Bf16, MoeOp::GateUp) => SM90_W4A16_GATE_UP,
        (AType::Bf16, MoeOp::Down) => SM90_W4A16_DOWN,
        (AType::Nvfp4, MoeOp::GateUp) => SM90_W4A4_GATE_UP,
        (AType::Nvfp4, MoeOp::Down) => SM90_W4A4_DOWN,
    };
    // a bucket between two rows takes the lower row until its rows per expert reach the next
    // (with a little slack: 1.5 rows per expert take the 2-row row)
    let row = table
        .iter()
        .rev()
        .find(|r| f64::from(r.0) * ROWS_PER_TP8_TOKEN <= rows * 1.01)
        .unwrap_or(&table[0]);
    let &(_, tile, [warps_n, warps_k], form, depth, min_ctas, walk) = row;
    let ring = match form {
        Form::T | Form::W => {
            let tiled = GroupedConfig::tiled(op, tile, [1, warps_n], depth, min_ctas);
            return GroupedConfig { wgmma: form == Form::W, ..tiled };
        }
        Form::R => R,
        Form::P => super::seeds::P,
        Form::Pa => super::seeds::PA,
    };
    let row = (op, a_type, tile, [warps_n, warps_k], ring, depth, 1, min_ctas, walk);
    GroupedConfig::streamed(Family::Sm90, row)
}

/// The sm120 template: the smallest tile list that holds most experts' routed rows, and for
/// gate_up's decode tiles K split over the fewest CTAs (1, 2 or 4) that give every SM one (the
/// long K of a few experts' tiles would leave SMs idle).
fn sm120_template(op: MoeOp, shape: &MoeShape, routed: &Routed, sm_count: u32) -> GroupedConfig {
    // the tile list whose tiles hold the routed rows of 9 in 10 experts (Poisson's 90th
    // percentile, about r + 1.3 sqrt(r)), so few experts' weights are read for two tiles
    let rows = routed.per_expert;
    let most = rows + 1.3 * rows.sqrt();
    let block_m = [8, 16].into_iter().find(|&m| most <= f64::from(m)).unwrap_or(32);
    let (block_n, warps_n) = match op {
        MoeOp::GateUp => (64, 2),
        MoeOp::Down => (128, 4),
    };
    let (n, k) = shape.nk(op);
    let (block_k, depth) = if k % 128 == 0 { (128, 6) } else { (64, 8) };
    // the local experts a step touches: at most one per routed row (at least one, as the
    // kernels' grid has)
    let active = routed.local.min(u64::from(shape.experts)).max(1) as u32;
    let tiles = active * n.div_ceil(block_n);
    let split_k = if op == MoeOp::GateUp && block_m <= 16 {
        [1, 2, 4].into_iter().find(|s| tiles * s >= sm_count).unwrap_or(4)
    } else {
        1
    };
    let row =
        (op, AType::Nvfp4, [block_m, block_n, block_k], [warps_n, 1], R, depth, split_k, 1, 0);
    GroupedConfig { k_tail: k % 64 != 0, ..GroupedConfig::streamed(Family::Sm120, row) }
}

/// How far `c` is from `t`: the kernel form first (a different pipeline or kernel outweighs
/// every size), then the routed rows per tile, the weight rows and warps per CTA, the K pass,
/// split-K, the ring's depth, the CTAs per SM, the ring stages in flight per SM and the walk.
pub fn distance(t: &GroupedConfig, c: &GroupedConfig) -> f64 {
    let log = |a: u32, b: u32| (f64::from(a.max(1)) / f64::from(b.max(1))).log2().abs();
    let flags = [
        (t.tiled, c.tiled),
        (t.wgmma, c.wgmma),
        (t.warp_ring, c.warp_ring),
        (t.a_smem, c.a_smem),
        (t.flow, c.flow),
        (t.k_tail, c.k_tail),
    ];
    let form = flags.iter().filter(|(a, b)| a != b).count() as f64;
    // sm90 streamed kernels: the ring stages in flight per SM (depth x CTAs per SM), so that a
    // depth the layer's K does not take is replaced by another at the same bytes in flight (3
    // stages at 4 CTAs -> 4 at 3, not 2 at 4); sm120's template depth is the space's largest,
    // which its rule for split-K outweighs
    let in_flight = if t.tiled || c.tiled || t.family != Family::Sm90 {
        0.0
    } else {
        10.0 * log(t.depth * t.min_ctas, c.depth * c.min_ctas)
    };
    1000.0 * form
        + 100.0 * log(t.block_m, c.block_m)
        + 20.0 * (log(t.block_n, c.block_n) + log(t.warps_n, c.warps_n) + log(t.warps_m, c.warps_m))
        + 10.0 * (log(t.warps_k, c.warps_k) + log(t.block_k, c.block_k) + log(t.split_k, c.split_k))
        + 3.0 * f64::from(t.depth.abs_diff(c.depth))
        + 2.0 * f64::from(t.min_ctas.abs_diff(c.min_ctas))
        + in_flight
        + 0.5 * f64::from(t.walk.abs_diff(c.walk))
}

/// `t` itself when `space` holds it, else the nearest member (the first of equals).
fn nearest(t: &GroupedConfig, space: &[GroupedConfig]) -> GroupedConfig {
    if space.contains(t) {
        return *t;
    }
    let mut best = (f64::INFINITY, space[0]);
    for c in space {
        let d = distance(t, c);
        if d < best.0 {
            best = (d, *c);
        }
    }
    best.1
}

#[cfg(test)]
#[path = "defaults_tests.rs"]
mod tests;
