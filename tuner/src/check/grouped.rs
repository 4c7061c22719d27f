//! A table's grouped MoE entries on the GPU: each entry's kernel verified against the CPU
//! reference (`moe::reference`, on sampled routed rows) and timed on the routed step its entry
//! was tuned on, through the grouped benchmark (`bench::moe`: weights rotated for cold L2, the
//! GPU schedule checked against the CPU one first), then timed alone under the check's timing
//! policy on rotated weight copies (every sample kept): `fp4tune check` compares the samples with
//! the entry's recorded time by the rule, `fp4tune selftest` uses the verification only.
//!
//! The step of an entry ([`step_of`]): its layer shape and token count B, and the uniform routing
//! drawn from its recorded seed over the model's experts the tuner drew it over
//! (`MoeEntry::routed_experts`: 256 for a GLM-5 EP8 entry of 32 local experts, so about one slot
//! in eight is local), this GPU holding the first `MoeKey::experts` of them (expert_begin 0), as
//! the tuner does. Entries that share a step share its operands; down runs on
//! the H written by the step's gate_up entry (or, when the table has none, by the first
//! configuration of the gate_up space).
//!
//! The measurement runs in the calling process (the grouped benchmark has no worker protocol):
//! a kernel that faults is that entry's failure, and entries after it fail with the context error.

use crate::bench::moe::{measure_op, MoeStep, Outcome as MoeOutcome, StepData};
use crate::bench::timer::{measure as time_launches, LaunchFn};
use crate::bench::{Summary, TimingPolicy};
use crate::compile::Compiler;
use crate::gpu::{Gpu, GpuError};
use crate::moe::schedule::Routing;
use crate::moe::space::search_space_for;
use crate::moe::{GroupedConfig, MoeOp};
use crate::problem::AType;
use crate::runtime::moe::{GroupedKernel, MoeKernels, MoeLauncher};
use crate::runtime::RuntimeError;
use crate::table::{MoeEntry, MoeKey};
use crate::template::Family;
use crate::tune::log::Outcome;

/// The routed step `e` was tuned on (module docs).
pub fn step_of(e: &MoeEntry) -> MoeStep {
    MoeStep {
        shape: e.key.shape(),
        experts_total: e.routed_experts(),
        expert_begin: 0,
        tokens: e.key.tokens,
        routing: Routing::Uniform,
        seed: e.routing_seed,
    }
}

/// Whether the grouped measurement runs `key`'s kernels (family sm90, W4A16 or W4A4; family
/// sm120, W4A4); `Err` says why not. Whether the GPU at hand runs the key's family is the
/// check's preflight.
pub fn measurable(key: &MoeKey) -> Result<(), String> {
    match (key.family, key.a_type) {
        (Family::Sm90, _) | (Family::Sm120, AType::Nvfp4) => Ok(()),
        _ => Err(format!(
            "the grouped measurement runs sm90 kernels and sm120 W4A4 kernels, this entry is {} {}",
            key.family, key.a_type
        )),
    }
}

/// A grouped benchmark failure as a check outcome: compile and load failures are kernels that
/// could not be built here, a launch or timing failure or a wrong result is a failed kernel.
fn outcome_of_failure(why: &str) -> Outcome {
    if let Some(log) = why.strip_prefix("compile: ") {
        Outcome::CompileError { log: log.to_string() }
    } else if let Some(reason) = why.strip_prefix("load: ") {
        Outcome::ResourceLimit { reason: reason.to_string() }
    } else if why.starts_with("launch: ") || why.starts_with("timing: ") {
        Outcome::LaunchError { reason: why.to_string() }
    } else {
        Outcome::WrongAnswer { reason: why.to_string() }
    }
}

/// The gate_up kernel whose H the down entries of `step` read: the step's gate_up entry, else the
/// first configuration of the gate_up space.
fn gate_up_for(
    moe: &[MoeEntry],
    step: &MoeStep,
    family: Family,
    a_type: AType,
) -> Option<GroupedConfig> {
    moe.iter()
        .find(|e| {
            e.key.op == MoeOp::GateUp
                && (e.key.family, e.key.a_type) == (family, a_type)
                && step_of(e) == *step
        })
        .map(|e| e.config)
        .or_else(|| search_space_for(family, a_type, MoeOp::GateUp, &step.shape).first().copied())
}

/// The policy of the verification run (what `bench::moe::measure_op` times after verifying):
/// one short sample, no rotation beyond two copies; its time is not what a check compares.
pub fn verify_policy() -> TimingPolicy {
    TimingPolicy {
        samples: 1,
        min_sample_us: 1.0,
        max_launches: 8,
        warmup_replays: 0,
        l2_multiple: 0.0,
        interleaved: true,
    }
}

/// Verify every entry of `moe`, then, with `timing`, time the verified ones under it; one outcome
/// per entry, in order: `Timed` with every sample (without `timing`: the verification run's
/// time and no samples), or why not. `on_entry(i, outcome)` is called as each entry is done.
/// Entries [`measurable`] refuses get `Outcome::Illegal` with the reason.
pub fn measure(
    gpu: &Gpu,
    compiler: &Compiler,
    moe: &[MoeEntry],
    timing: Option<&TimingPolicy>,
    on_entry: &mut dyn FnMut(usize, &Outcome),
) -> Vec<Outcome> {
    let mut out: Vec<Option<Outcome>> = vec![None; moe.len()];
    let mut done = |i: usize, o: Outcome, out: &mut Vec<Option<Outcome>>| {
        on_entry(i, &o);
        out[i] = Some(o);
    };
    for (i, e) in moe.iter().enumerate() {
        if let Err(why) = measurable(&e.key) {
            done(i, Outcome::Illegal { reason: why }, &mut out);
        }
    }
    let kernels = match MoeKernels::load(gpu, compiler) {
        Ok(k) => k,
        Err(e) => {
            let why = format!("the routing and finalize kernels: {e}");
            for i in 0..moe.len() {
                if out[i].is_none() {
                    done(i, Outcome::LaunchError { reason: why.clone() }, &mut out);
                }
            }
            return out.into_iter().map(|o| o.expect("set above")).collect();
        }
    };
    let launcher = MoeLauncher { gpu, kernels: &kernels };
    // Steps in table order, each once.
    let mut steps: Vec<MoeStep> = Vec::new();
    for (i, e) in moe.iter().enumerate() {
        if out[i].is_none() && !steps.contains(&step_of(e)) {
            steps.push(step_of(e));
        }
    }
    for step in steps {
        let members: Vec<usize> =
            (0..moe.len()).filter(|&i| out[i].is_none() && step_of(&moe[i]) == step).collect();
        let results = measure_step(gpu, compiler, &launcher, moe, &step, &members, timing);
        for (i, o) in members.into_iter().zip(results) {
            done(i, o, &mut out);
        }
    }
    out.into_iter().map(|o| o.expect("every entry measured")).collect()
}

/// The entries `members` (indices into `moe`) of one step: gate_up ones first, then down ones on
/// the H of the step's gate_up kernel.
fn measure_step(
    gpu: &Gpu,
    compiler: &Compiler,
    launcher: &MoeLauncher<'_>,
    moe: &[MoeEntry],
    step: &MoeStep,
    members: &[usize],
    timing: Option<&TimingPolicy>,
) -> Vec<Outcome> {
    let whole = |why: String| vec![Outcome::LaunchError { reason: why }; members.len()];
    let verification = verify_policy();
    // Weight copies for the timing policy's cold L2 (two for verification alone). A step with a
    // W4A4 entry carries NVFP4 activations too (its W4A16 entries run on the same step).
    let a_type = if members.iter().any(|&i| moe[i].key.a_type == AType::Nvfp4) {
        AType::Nvfp4
    } else {
        AType::Bf16
    };
    let d = match StepData::new_for(gpu, *step, a_type, timing.unwrap_or(&verification)) {
        Ok(d) => d,
        Err(e) => return whole(format!("setting up the routed step: {e}")),
    };
    if d.schedule.rows() == 0 {
        return vec![
            Outcome::Illegal { reason: "the recorded routing gives no rows".into() };
            members.len()
        ];
    }
    if let Err(e) = d.check_schedule(gpu, launcher) {
        return whole(e.to_string());
    }
    let mut gate_up: std::collections::HashMap<AType, Result<GroupedKernel, String>> =
        std::collections::HashMap::new();
    let mut results = vec![None; members.len()];
    for op in MoeOp::ALL {
        for (slot, &i) in members.iter().enumerate() {
            let e = &moe[i];
            if e.key.op != op {
                continue;
            }
            let input = if op == MoeOp::Down {
                let k = gate_up.entry(e.key.a_type).or_insert_with(|| {
                    let config = gate_up_for(moe, step, e.key.family, e.key.a_type)
                        .ok_or_else(|| "no gate_up configuration for this shape".to_string())?;
                    GroupedKernel::load(gpu, compiler, config).map_err(|e| {
                        format!("the gate_up kernel {} that writes H: {e}", config.name())
                    })
                });
                match k {
                    Ok(k) => Some(&*k),
                    Err(why) => {
                        results[slot] = Some(Outcome::LaunchError { reason: why.clone() });
                        continue;
                    }
                }
            } else {
                None
            };
            let measured =
                measure_op(gpu, compiler, &verification, launcher, &d, op, &[e.config], input);
            results[slot] = Some(match measured.map(|mut m| m.pop()) {
                Ok(Some(m)) => match (m.outcome, timing) {
                    (MoeOutcome::Timed(time), None) => Outcome::Timed { time, samples: Vec::new() },
                    // Verified: H (for down) is the gate_up kernel's, as when it was verified.
                    (MoeOutcome::Timed(_), Some(policy)) => {
                        match time_entry(gpu, compiler, launcher, &d, op, e.config, policy) {
                            Ok(samples) => match Summary::of(&samples) {
                                Some(time) => Outcome::Timed { time, samples },
                                None => Outcome::LaunchError { reason: "no samples".into() },
                            },
                            Err(why) => Outcome::LaunchError { reason: why },
                        }
                    }
                    (MoeOutcome::Failed(why), _) => outcome_of_failure(&why),
                },
                Ok(None) => Outcome::LaunchError { reason: "not measured".into() },
                Err(e) => Outcome::LaunchError { reason: e.to_string() },
            });
        }
    }
    results.into_iter().map(|o| o.expect("every member is gate_up or down")).collect()
}

/// Time `config`'s kernel alone on step `d` under `policy`, each launch on the next weight copy
/// (as `bench::moe` times candidates); the per-launch microseconds.
#[allow(clippy::too_many_arguments)]
fn time_entry(
    gpu: &Gpu,
    compiler: &Compiler,
    launcher: &MoeLauncher<'_>,
    d: &StepData,
    op: MoeOp,
    config: GroupedConfig,
    policy: &TimingPolicy,
) -> Result<Vec<f64>, String> {
    let kernel = GroupedKernel::load(gpu, compiler, config).map_err(|e| e.to_string())?;
    let copies = match op {
        MoeOp::GateUp => d.copies13,
        MoeOp::Down => d.copies2,
    };
    let stream = gpu.own_stream();
    let kernel = &kernel;
    let Some(base) = d.args_for(config.a_type, 0, 0, false) else {
        return Err(format!("the step has no {} activations", config.a_type));
    };
    let launch: LaunchFn<'_> = Box::new(move |i: usize| {
        let args = d.args_for(config.a_type, i % copies, i % copies, false).unwrap_or(base);
        // SAFETY: the step's buffers and workspace are this device's, sized for its tokens and
        // shape, and outlive the measurement; copy i % copies lies inside the weight buffers;
        // the Gpu's own stream, which `measure` synchronizes.
        unsafe { launcher.grouped(kernel, &args, &d.ws, stream) }.map_err(|e| match e {
            RuntimeError::Gpu(g) => g,
            other => GpuError::Kernel { kernel: kernel.config.name(), message: other.to_string() },
        })
    });
    let mut timed = time_launches(gpu, policy, copies, vec![launch]);
    let samples = timed.pop().expect("one kernel timed").map_err(|e| format!("timing: {e}"))?;
    Ok(samples.us)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed() -> crate::table::Table {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
        crate::table::Table::load(&root.join("nvidia-h200.ron")).unwrap()
    }

    /// The committed EP8 table's entries redraw the routing they were tuned on: ids over GLM-5's
    /// 256 routed experts, of which this GPU holds 32, so about one routed row in eight is local.
    #[test]
    fn ep8_entries_route_over_the_models_experts() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
        let t = crate::table::Table::load(&root.join("nvidia-h200-ep8.ron")).unwrap();
        assert!(!t.moe.is_empty());
        for e in t.moe.iter().filter(|e| e.key.tokens >= 64) {
            let s = step_of(e);
            assert_eq!((s.experts_total, s.shape.experts), (256, 32), "{}", e.key);
            let schedule = crate::moe::RouteSchedule::build(&s.ids(), s.expert_begin, 32);
            let all = s.tokens * s.shape.top_k;
            let local = schedule.rows();
            assert!(local * 5 < all && local * 12 > all, "{}: {local} of {all} rows local", e.key);
        }
    }

    #[test]
    fn an_entrys_step_is_its_shape_tokens_and_seed() {
        let t = committed();
        let w4a16 = |e: &&MoeEntry| e.key.a_type == AType::Bf16;
        let e = t.moe.iter().filter(w4a16).find(|e| e.key.op == MoeOp::GateUp).unwrap();
        let s = step_of(e);
        assert_eq!(s.shape, e.key.shape());
        assert_eq!((s.tokens, s.seed, s.routing), (e.key.tokens, e.routing_seed, Routing::Uniform));
        assert_eq!((s.experts_total, s.expert_begin), (e.routed_experts(), 0));
        // an EP entry's routing is drawn over the model's experts, not only the local ones
        let ep = MoeEntry {
            key: MoeKey { experts: 32, ..e.key },
            experts_total: Some(256),
            ..e.clone()
        };
        assert_eq!((step_of(&ep).experts_total, step_of(&ep).shape.experts), (256, 32));
        let old = MoeEntry { experts_total: None, ..ep.clone() };
        assert_eq!(step_of(&old).experts_total, 32);
        assert!(measurable(&e.key).is_ok());
        let other = MoeKey { family: Family::Sm120, a_type: AType::Bf16, ..e.key };
        assert!(measurable(&other).unwrap_err().contains("this entry is sm120 w4a16"));
        assert!(measurable(&MoeKey { a_type: AType::Nvfp4, ..other }).is_ok());
        // Down reads the H of its step's gate_up entry; without one, of the gate_up space's first
        // kernel.
        let down = t
            .moe
            .iter()
            .filter(w4a16)
            .find(|d| d.key.op == MoeOp::Down && d.key.tokens == e.key.tokens)
            .unwrap();
        assert_eq!(step_of(down), s, "the committed table tunes both ops of a B on one routing");
        assert_eq!(gate_up_for(&t.moe, &s, Family::Sm90, AType::Bf16), Some(e.config));
        assert_eq!(
            gate_up_for(std::slice::from_ref(down), &s, Family::Sm90, AType::Bf16),
            crate::moe::space::search_space(MoeOp::GateUp, &s.shape).first().copied()
        );
        // A W4A4 down entry reads the H of a W4A4 gate_up kernel, never of the W4A16 entry.
        let w4a4 = gate_up_for(&t.moe, &s, Family::Sm90, AType::Nvfp4).unwrap();
        assert_eq!(
            (w4a4.op, w4a4.family, w4a4.a_type),
            (MoeOp::GateUp, Family::Sm90, AType::Nvfp4)
        );
    }

    #[test]
    fn grouped_failures_map_to_check_outcomes() {
        assert!(matches!(outcome_of_failure("compile: ptxas"), Outcome::CompileError { .. }));
        assert!(matches!(outcome_of_failure("load: spills"), Outcome::ResourceLimit { .. }));
        assert!(matches!(outcome_of_failure("launch: x"), Outcome::LaunchError { .. }));
        assert!(matches!(outcome_of_failure("timing: x"), Outcome::LaunchError { .. }));
        assert!(matches!(
            outcome_of_failure("wrong result: sorted row 3"),
            Outcome::WrongAnswer { .. }
        ));
    }

    /// On a family sm90 GPU: the committed table's W4A16 grouped entries at B = 1 and 8 verify on their
    /// recorded routings and are timed with every sample, and a routing the kernel was not
    /// given (a down entry without its step's gate_up) still runs on the gate_up space's first
    /// kernel's H.
    #[test]
    #[cfg_attr(
        not(feature = "gpu"),
        ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
    )]
    fn committed_grouped_entries_verify_and_time_on_the_gpu() {
        let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("the gpu feature is on but: {e}"));
        if gpu.info().compute_capability != (9, 0) {
            eprintln!("SKIPPED: the grouped kernels run on family sm90 (compute capability 9.0)");
            return;
        }
        let compiler = Compiler::with_default_cache().unwrap_or_else(|e| panic!("{e}"));
        let t = committed();
        // W4A4 first: its down leaves an NVFP4 H in the step's workspace, which the W4A16 down
        // entries of the same routing must not be judged on.
        let pick = |a_type: AType, tokens: &[u32]| -> Vec<MoeEntry> {
            t.moe
                .iter()
                .filter(|e| tokens.contains(&e.key.tokens) && e.key.a_type == a_type)
                .cloned()
                .collect()
        };
        let mut moe = pick(AType::Nvfp4, &[1]);
        moe.extend(pick(AType::Bf16, &[1, 8]));
        assert_eq!(moe.len(), 6);
        let w4a4_down = moe.iter().find(|e| e.key.op == MoeOp::Down).unwrap();
        assert!(
            moe.iter().any(|e| e.key.a_type == AType::Bf16
                && e.key.op == MoeOp::Down
                && e.routing_seed == w4a4_down.routing_seed),
            "one routing for both activation types at B = 1"
        );
        // A down entry alone in its step (another seed): H from the gate_up space's first kernel.
        let mut lone = moe
            .iter()
            .find(|e| e.key.op == MoeOp::Down && e.key.a_type == AType::Bf16)
            .unwrap()
            .clone();
        lone.routing_seed += 1000;
        moe.push(lone);
        let policy = TimingPolicy::quick();
        let mut seen = Vec::new();
        let out = measure(&gpu, &compiler, &moe, Some(&policy), &mut |i, _| seen.push(i));
        seen.sort();
        assert_eq!(seen, (0..moe.len()).collect::<Vec<_>>());
        for (e, o) in moe.iter().zip(&out) {
            match o {
                Outcome::Timed { samples, .. } => assert_eq!(samples.len(), policy.samples),
                other => panic!("{}: {other:?}", e.key),
            }
        }
        // Verification alone: the verification run's time, no samples.
        let out = measure(&gpu, &compiler, &moe[..1], None, &mut |_, _| {});
        assert!(matches!(&out[0], Outcome::Timed { samples, .. } if samples.is_empty()), "{out:?}");
    }
}
