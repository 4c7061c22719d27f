//! One grouped MoE benchmark run (`fp4tune bench --moe`): the plan, the report rows, and per
//! set and token count the grouped space of both ops verified and timed, the whole layer with the
//! best of each, align and finalize alone, and the per-expert loop peer (a child of `moe.rs`).

use super::*;

/// What `fp4tune bench --moe` measures.
#[derive(Debug, Clone)]
pub struct MoeBenchPlan {
    /// (label, shape, expert_begin) per layer shape, e.g. ("tp8", GLM5_TP8, 0).
    pub sets: Vec<(String, MoeShape, i32)>,
    pub experts_total: u32,
    pub tokens: Vec<u32>,
    pub policy: TimingPolicy,
    /// At most this many candidates per op and step (0: the whole space), taken evenly.
    pub max_candidates: usize,
    /// Family sm90: only configurations with the weights in the warp ring (`Some(true)`) or in
    /// the register ring (`Some(false)`); `None`: both.
    pub warp_ring: Option<bool>,
    /// Configurations measured besides the spread and the measured seeds (`moe::seeds`; e.g. the
    /// grouped entries of the tables the loop peer uses): each joins the candidates of every op
    /// and step it is legal for.
    pub extra: Vec<GroupedConfig>,
    /// The dispatcher whose GEMM routes the per-expert loop peer `fp4tune_loop` launches
    /// ([`moe_loop`]); `None`: no loop peer.
    pub expert_loop: Option<std::sync::Arc<crate::runtime::Dispatcher>>,
}

impl MoeBenchPlan {
    /// Whether the plan's pipeline filter keeps `c`.
    pub fn keeps(&self, c: &GroupedConfig) -> bool {
        self.warp_ring.is_none_or(|r| c.warp_ring == r)
    }
}

/// One row of the report (columns of `bench-moe.csv`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeRow {
    pub set: String,
    pub op: String,
    pub n: u32,
    pub k: u32,
    pub experts: u32,
    pub top_k: u32,
    pub tokens: u32,
    pub active_experts: u32,
    /// `fp4tune_grouped`, `fp4tune_layer`, a fixed kernel's row
    /// (`moe_report::FIXED_KERNEL_ROWS`), or a peer's name.
    pub implementation: String,
    pub config: String,
    pub median_us: f64,
    pub lo_us: f64,
    pub hi_us: f64,
    pub roofline_us: f64,
    pub read_floor_us: f64,
    pub verified: usize,
    pub failed: usize,
}

/// Progress of a benchmark run, for the caller to show (the library never prints).
#[derive(Debug, Clone)]
pub enum MoeProgress {
    Step { set: String, tokens: u32, active_experts: u32 },
    Op { op: MoeOp, verified: usize, failed: usize, best: Option<(GroupedConfig, f64)> },
}

/// An evenly spaced subset of `space` of at most `max` configurations (all when max is 0).
pub fn spread(space: Vec<GroupedConfig>, max: usize) -> Vec<GroupedConfig> {
    if max == 0 || space.len() <= max {
        return space;
    }
    (0..max).map(|i| space[i * space.len() / max]).collect()
}

/// Whether `c` runs as itself on `step`: an sm120 kernel split along K whose tiles overflow the
/// workspace's partials runs as its split_k 1 form.
pub fn runs_as_itself(c: &GroupedConfig, shape: &MoeShape, step: &RouteSchedule) -> bool {
    c.split_k == 1
        || c.family != crate::template::Family::Sm120
        || crate::moe::sm120::splits_on(c, shape, step)
}

/// The candidates of one grouped screen of (family, a_type, op) on `step`'s shape: an even
/// spread of at most `max` streamed configurations of the space (0: all); every tiled one when
/// the step has at least `TILED_MIN_ROWS_PER_EXPERT` routed rows per active expert (the wgmma
/// ones from `WGMMA_MIN_ROWS_PER_EXPERT`), or at every size when no streamed configuration
/// (that `keep` keeps) takes the shape, e.g. a K that is a multiple of 16 but not of 128 (sm120
/// kernels split along K only where the step's tiles fit the workspace's partials); then the
/// measured seeds (`moe::seeds`) and `extra`, each once, where legal for the shape; `keep`
/// filters all of them. From `TILED_ONLY_ROWS_PER_EXPERT` rows per expert on, only the tiled
/// configurations (of the space and of `extra`) are measured.
pub fn screen_candidates(
    (family, a_type, op): (crate::template::Family, AType, MoeOp),
    step: &RouteSchedule,
    shape: &MoeShape,
    max: usize,
    extra: &[GroupedConfig],
    keep: impl Fn(&GroupedConfig) -> bool,
) -> Vec<GroupedConfig> {
    let mut space = crate::moe::space::search_space_for(family, a_type, op, shape);
    // not screened twice (nor recorded for a step where it does not split)
    let splits_here = |c: &GroupedConfig| runs_as_itself(c, shape, step);
    space.retain(|c| keep(c) && splits_here(c));
    let (tiled, streamed): (Vec<_>, Vec<_>) = space.into_iter().partition(|c| c.tiled);
    let rows_per_expert = step.rows() / step.active_experts().max(1);
    // A projection no streamed configuration takes (e.g. K a multiple of 64 or of 16 only): the tiled
    // ones at every size.
    let tiled_at_any_size = streamed.is_empty();
    let wgmma_ok =
        tiled_at_any_size || rows_per_expert >= crate::moe::space::WGMMA_MIN_ROWS_PER_EXPERT;
    let tiled: Vec<_> = tiled.into_iter().filter(|c| !c.wgmma || wgmma_ok).collect();
    let tiled_only =
        rows_per_expert >= crate::moe::space::TILED_ONLY_ROWS_PER_EXPERT && !tiled.is_empty();
    let mut space = if tiled_only { Vec::new() } else { spread(streamed, max) };
    if tiled_at_any_size || rows_per_expert >= crate::moe::space::TILED_MIN_ROWS_PER_EXPERT {
        space.extend(tiled);
    }
    let seeds = crate::moe::seeds::measured_seeds(family, a_type, op);
    for c in seeds.iter().chain(extra) {
        let fits = (c.op, c.family, c.a_type) == (op, family, a_type)
            && keep(c)
            && splits_here(c)
            && (c.tiled || !tiled_only);
        if fits && c.check(shape).is_ok() && !space.contains(c) {
            space.push(*c);
        }
    }
    space
}

/// The implementation name of the benchmark's rows of the family default (`moe::defaults`: what a
/// layer the table has no entries for runs), W4A4's with the `_w4a4` suffix.
pub const DEFAULT_IMPL: &str = "fp4tune_default";

/// The family defaults of one layer (`moe::defaults`): what a dispatcher whose table has no
/// entries for the layer launches, built once and picked per token count by the runtime's route.
#[derive(Debug, Clone)]
pub struct FamilyDefaults {
    /// `None` where the family has no kernel for the layer.
    routes: Option<crate::runtime::MoeRouteTable>,
    shape: MoeShape,
    experts_total: u32,
    a_type: AType,
}

impl FamilyDefaults {
    /// The defaults of `shape` in a model of `experts_total` routed experts with activations
    /// `a_type`, on a GPU of `family` with `sm_count` SMs.
    pub fn new(
        family: crate::template::Family,
        a_type: AType,
        (shape, experts_total): (&MoeShape, u32),
        sm_count: u32,
    ) -> Self {
        let routes = crate::runtime::MoeRouteTable::of_defaults(
            family,
            a_type,
            shape,
            experts_total,
            sm_count,
        )
        .ok();
        FamilyDefaults { routes, shape: *shape, experts_total, a_type }
    }

    /// The default of `op` at `tokens`, `None` where the family has no kernel for the layer.
    pub fn at(&self, op: MoeOp, tokens: u32) -> Option<GroupedConfig> {
        let routes = self.routes.as_ref()?;
        let r = routes.route(&self.shape, self.experts_total, self.a_type, tokens).ok()?;
        [r.gate_up, r.down].into_iter().find(|x| x.op == op).map(|x| x.config)
    }
}

/// `screen` with a layer's family default (`FamilyDefaults::at`, filtered by the caller) added
/// where it lacks it, whatever the screen's size rules: a screen measures what the runtime runs.
pub fn with_default(
    mut screen: Vec<GroupedConfig>,
    default: Option<GroupedConfig>,
) -> Vec<GroupedConfig> {
    if let Some(c) = default.filter(|c| !screen.contains(c)) {
        screen.push(c);
    }
    screen
}

/// Every candidate measured for one (set, tokens, op).
pub type OpLog = (String, u32, MoeOp, Vec<Measured>);

/// Run the plan: per set and token count, verify and time the grouped space of both ops, the
/// whole layer with the best of each, align and finalize alone, and the read floor of each op's
/// bytes; read bandwidth measured once for the rooflines.
pub fn run_moe_bench(
    gpu: &Gpu,
    compiler: &Compiler,
    plan: &MoeBenchPlan,
    progress: impl FnMut(MoeProgress),
) -> Result<(Vec<MoeRow>, Vec<OpLog>), MoeBenchError> {
    run_moe_bench_for(gpu, compiler, plan, AType::Bf16, progress)
}

/// [`run_moe_bench`] for activations of `a_type` (family sm90): W4A4 rows name their
/// implementation `fp4tune_grouped_w4a4` and `fp4tune_layer_w4a4` (the layer includes the
/// quantization of X).
pub fn run_moe_bench_for(
    gpu: &Gpu,
    compiler: &Compiler,
    plan: &MoeBenchPlan,
    a_type: AType,
    mut progress: impl FnMut(MoeProgress),
) -> Result<(Vec<MoeRow>, Vec<OpLog>), MoeBenchError> {
    let suffix = if a_type == AType::Nvfp4 { "_w4a4" } else { "" };
    // The device's kernel family (sm120: W4A4 only, on the native block-scaled MMA).
    let family = crate::runtime::family_for(gpu.info())?;
    for (_, shape, _) in &plan.sets {
        crate::moe::space::check_layer(family, a_type, shape).map_err(MoeBenchError::NoKernel)?;
        // the pipeline filter (`--pipeline`) must leave a configuration of each projection
        for op in MoeOp::ALL {
            let space = crate::moe::space::search_space_for(family, a_type, op, shape);
            if !space.iter().any(|c| plan.keeps(c)) {
                let (n, k) = shape.nk(op);
                return Err(MoeBenchError::NoKernel(format!(
                    "the pipeline filter leaves no {family} {a_type} configuration of {op} \
                     (N = {n}, K = {k}) of {shape}"
                )));
            }
        }
    }
    let floors = Floors::new(gpu, compiler)?;
    let read_gbps = floors.read_bandwidth(&plan.policy, 2 << 30)?;
    let kernels = MoeKernels::load(gpu, compiler)?;
    let launcher = MoeLauncher { gpu, kernels: &kernels };
    let mut rows = Vec::new();
    let mut logs = Vec::new();
    for (label, shape, begin) in &plan.sets {
        let step = |tokens: u32| MoeStep {
            shape: *shape,
            experts_total: plan.experts_total,
            expert_begin: *begin,
            tokens,
            routing: Routing::Uniform,
            seed: 1000 + tokens as u64,
        };
        let layer = (shape, plan.experts_total);
        let defaults = FamilyDefaults::new(family, a_type, layer, gpu.info().sm_count);
        // One upload of the set's weights, with the copies its sparsest step needs.
        let steps = plan.tokens.iter().map(|&t| step(t));
        let weights = Arc::new(LayerWeights::for_steps(gpu, *shape, steps, &plan.policy)?);
        for &tokens in &plan.tokens {
            let d =
                StepData::with_weights(gpu, step(tokens), a_type, &plan.policy, weights.clone())?;
            if d.schedule.rows() == 0 {
                continue;
            }
            progress(MoeProgress::Step {
                set: label.clone(),
                tokens,
                active_experts: d.schedule.active_experts(),
            });
            d.check_schedule(gpu, &launcher)?;
            let mut chosen: Vec<GroupedKernel> = Vec::new();
            for op in MoeOp::ALL {
                let screen = screen_candidates(
                    (family, a_type, op),
                    &d.schedule,
                    shape,
                    plan.max_candidates,
                    &plan.extra,
                    |c| plan.keeps(c),
                );
                // the family default the runtime launches for a layer outside the table
                let default = defaults.at(op, tokens).filter(|c| plan.keeps(c));
                let space = with_default(screen, default);
                let measured = measure_op(
                    gpu,
                    compiler,
                    &plan.policy,
                    &launcher,
                    &d,
                    op,
                    &space,
                    chosen.first(),
                )?;
                let verified = measured.iter().filter(|m| m.median().is_some()).count();
                let failed = measured.len() - verified;
                let top = best(&measured).cloned();
                progress(MoeProgress::Op {
                    op,
                    verified,
                    failed,
                    best: top.as_ref().map(|m| (m.config, m.median().unwrap())),
                });
                let top = top
                    .ok_or_else(|| MoeBenchError::NoCandidate(op, format!("{label} B={tokens}")))?;
                let Outcome::Timed(t) = top.outcome else { unreachable!("best() is timed") };
                let bytes = roofline_bytes_for(shape, op, a_type, &d.schedule, tokens);
                let (n, k) = shape.nk(op);
                rows.push(MoeRow {
                    set: label.clone(),
                    op: op.as_str().into(),
                    n,
                    k,
                    experts: shape.experts,
                    top_k: shape.top_k,
                    tokens,
                    active_experts: d.schedule.active_experts(),
                    implementation: format!("fp4tune_grouped{suffix}"),
                    config: top.config.name(),
                    median_us: t.median,
                    lo_us: t.lo,
                    hi_us: t.hi,
                    roofline_us: bytes as f64 / (read_gbps * 1e3),
                    read_floor_us: floors.read_floor(&plan.policy, bytes)?.time.median,
                    verified,
                    failed,
                });
                let default_time = default.and_then(|c| {
                    let m = measured.iter().find(|m| m.config == c)?;
                    match m.outcome {
                        Outcome::Timed(t) => Some((c, t)),
                        _ => None,
                    }
                });
                if let Some((c, t)) = default_time {
                    let row = rows.last().expect("pushed above").clone();
                    rows.push(MoeRow {
                        implementation: format!("{DEFAULT_IMPL}{suffix}"),
                        config: c.name(),
                        median_us: t.median,
                        lo_us: t.lo,
                        hi_us: t.hi,
                        ..row
                    });
                }
                chosen.push(GroupedKernel::load(gpu, compiler, top.config)?);
                logs.push((label.clone(), tokens, op, measured));
            }
            let layer = measure_layer(gpu, &plan.policy, &launcher, &d, &chosen[0], &chosen[1])?;
            let both: u64 = MoeOp::ALL
                .iter()
                .map(|&op| roofline_bytes_for(shape, op, a_type, &d.schedule, tokens))
                .sum();
            let layer_name = format!("fp4tune_layer{suffix}");
            // the fixed kernels' rows under the names the report knows them by
            let [align, chunked, finalize, quantize, fused] =
                crate::bench::moe_report::FIXED_KERNEL_ROWS;
            let fixed = [
                (layer_name.as_str(), Some(layer.layer), both as f64 / (read_gbps * 1e3)),
                (align, Some(layer.align_one_cta), 0.0),
                (chunked, Some(layer.align_chunked), 0.0),
                (finalize, Some(layer.finalize), 0.0),
                (quantize, layer.quantize_x, 0.0),
                (fused, layer.align_quantize_x, 0.0),
            ];
            for (name, t, roof) in fixed.into_iter().filter_map(|(n, t, r)| Some((n, t?, r))) {
                rows.push(MoeRow {
                    set: label.clone(),
                    op: "moe_layer".into(),
                    n: shape.hidden,
                    k: shape.inter,
                    experts: shape.experts,
                    top_k: shape.top_k,
                    tokens,
                    active_experts: d.schedule.active_experts(),
                    implementation: name.into(),
                    config: if name == layer_name {
                        format!("{} + {}", chosen[0].config, chosen[1].config)
                    } else {
                        String::new()
                    },
                    median_us: t.median,
                    lo_us: t.lo,
                    hi_us: t.hi,
                    roofline_us: roof,
                    read_floor_us: 0.0,
                    verified: 1,
                    failed: 0,
                });
            }
            // The per-expert loop launches the table's W4A16 GEMMs: a peer of the W4A16 layer.
            if let Some(dispatcher) = plan.expert_loop.as_ref().filter(|_| a_type == AType::Bf16) {
                let peer =
                    moe_loop::rows(gpu, dispatcher, &plan.policy, &d, label, read_gbps, &floors);
                rows.extend(peer?);
            }
        }
    }
    Ok((rows, logs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::schedule::{draw_routing, Routing};
    use crate::template::Family;

    fn schedule(tokens: u32) -> RouteSchedule {
        let shape = MoeShape::GLM5_TP8;
        let ids = draw_routing(7, tokens, shape.top_k, shape.experts, Routing::Uniform);
        RouteSchedule::build(&ids, 0, shape.experts)
    }

    /// Decode steps screen the streamed spread and the seeds; prefill-sized steps add every tiled
    /// configuration (the wgmma ones from 16 rows per expert); from 32 rows per expert only the
    /// tiled ones (and tiled extras) are left.
    #[test]
    fn screens_take_the_tiled_kernels_by_rows_per_expert() {
        let shape = MoeShape::GLM5_TP8;
        let key = (Family::Sm90, AType::Bf16, MoeOp::GateUp);
        let space = crate::moe::space::search_space(MoeOp::GateUp, &shape);
        let tiled_space = space.iter().filter(|c| c.tiled).count();
        let wgmma_space = space.iter().filter(|c| c.wgmma).count();
        assert!(wgmma_space >= 12);
        let decode = screen_candidates(key, &schedule(8), &shape, 48, &[], |_| true);
        assert!(decode.iter().all(|c| !c.tiled) && decode.len() >= 48);
        // 8 routed rows per expert: the mma.sync tiled kernels, not the wgmma ones
        let mid = screen_candidates(key, &schedule(256), &shape, 48, &[], |_| true);
        assert_eq!(mid.iter().filter(|c| c.tiled).count(), tiled_space - wgmma_space);
        assert!(mid.iter().all(|c| !c.wgmma));
        assert!(mid.iter().filter(|c| !c.tiled).count() >= 48);
        // 16: the wgmma ones too
        let wide = screen_candidates(key, &schedule(512), &shape, 48, &[], |_| true);
        assert_eq!(wide.iter().filter(|c| c.tiled).count(), tiled_space);
        let streamed_extra = decode[0];
        let prefill =
            screen_candidates(key, &schedule(4096), &shape, 48, &[streamed_extra], |_| true);
        assert_eq!(prefill.len(), tiled_space);
        assert!(prefill.iter().all(|c| c.tiled));
        // W4A4 has no tiled kernel: its prefill screens keep the streamed ones
        let w4a4 = (Family::Sm90, AType::Nvfp4, MoeOp::GateUp);
        let fp4 = screen_candidates(w4a4, &schedule(4096), &shape, 48, &[], |_| true);
        assert!(fp4.len() >= 48 && fp4.iter().all(|c| !c.tiled));
    }

    /// sm120 gate_up kernels split along K are screened where they split (decode steps whose
    /// tiles fit the workspace's partials), not at larger steps where they would run as their
    /// split_k 1 form.
    #[test]
    fn sm120_screens_split_kernels_where_they_split() {
        let shape = MoeShape::GLM5_TP8;
        let key = (Family::Sm120, AType::Nvfp4, MoeOp::GateUp);
        let space =
            crate::moe::space::search_space_for(Family::Sm120, AType::Nvfp4, MoeOp::GateUp, &shape);
        // the previous bucket's pick, split along K, is not carried where it would not split
        let carried = *space.iter().find(|c| c.split_k == 4).unwrap();
        let splits = |tokens| {
            let step = schedule(tokens);
            let screened = screen_candidates(key, &step, &shape, 0, &[carried], |_| true);
            assert!(screened
                .iter()
                .all(|c| c.split_k == 1 || crate::moe::sm120::splits_on(c, &shape, &step)));
            screened.iter().filter(|c| c.split_k > 1).count()
        };
        assert_eq!(splits(1), space.iter().filter(|c| c.split_k > 1).count());
        assert!(splits(4) > 0 && splits(4) < splits(1));
        assert_eq!(splits(64), 0);
    }

    /// A down projection whose K no streamed kernel takes (Qwen3-235B over 8 GPUs: K = 192)
    /// screens the tiled and wgmma kernels at every size, decode included; its gate_up (K =
    /// 4096) keeps the rules above.
    #[test]
    fn a_k_without_streamed_kernels_screens_the_tiled_ones_at_every_size() {
        let shape = MoeShape { hidden: 4096, inter: 192, experts: 128, top_k: 8 };
        let down = (Family::Sm90, AType::Bf16, MoeOp::Down);
        let space = crate::moe::space::search_space(MoeOp::Down, &shape);
        assert!(space.iter().all(|c| c.tiled) && space.iter().any(|c| c.wgmma));
        for tokens in [1, 8, 64, 4096] {
            let ids = draw_routing(7, tokens, shape.top_k, shape.experts, Routing::Uniform);
            let step = RouteSchedule::build(&ids, 0, shape.experts);
            let screen = screen_candidates(down, &step, &shape, 48, &[], |_| true);
            assert_eq!(screen.len(), space.len(), "B = {tokens}");
            let gate_up = (Family::Sm90, AType::Bf16, MoeOp::GateUp);
            let screen = screen_candidates(gate_up, &step, &shape, 48, &[], |_| true);
            assert!(screen.iter().any(|c| !c.tiled) || tokens == 4096, "B = {tokens}");
        }
    }
}
