//! The grouped phase of a tuning campaign: per projection and token bucket B, screen the grouped
//! search space (an even spread of it, the measured seeds `moe::seeds` legal for the shape, the
//! family default that the runtime runs for the layer without a table, a finalist whenever it
//! screens fastest, and the previous bucket's pick: the space holds thousands of
//! configurations, a screen tens) on a
//! uniform routing drawn from a recorded seed, give the finalists the full timing policy on that routing and on a skewed draw, and keep
//! the fastest finalist unless it collapses under skew (slower than `SKEW_GUARD` x the best
//! skewed time, then the next one).

use crate::bench::moe::{
    measure_op, roofline_bytes_for, runs_as_itself, screen_candidates, with_default,
    FamilyDefaults, Measured, MoeBenchError, MoeStep, Outcome, StepData,
};
use crate::bench::moe_weights::LayerWeights;
use crate::bench::TimingPolicy;
use crate::compile::Compiler;
use crate::gpu::Gpu;
use crate::moe::config::GroupedConfig;
use crate::moe::schedule::{RouteSchedule, Routing};
use crate::moe::{MoeOp, MoeShape};
use crate::problem::AType;
use crate::runtime::moe::{GroupedKernel, MoeLauncher};
use crate::table::{MoeEntry, MoeKey};
use crate::template::Family;
use std::sync::Arc;

/// A finalist may be at most this much slower than the best finalist on the skewed draw.
pub const SKEW_GUARD: f64 = 1.25;
/// Token buckets B tuned by default (decode, then prefill chunks).
pub const DEFAULT_BUCKETS: &[u32] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096];
/// Candidates screened per (op, B) by default, evenly over the space.
pub const DEFAULT_SCREEN: usize = 48;
/// Finalists that get the full policy and the skewed draw.
pub const FINALISTS: usize = 3;

/// What to tune.
#[derive(Debug, Clone)]
pub struct MoeTuneSpec {
    pub shape: MoeShape,
    /// Activation type of the layer (bf16: W4A16; NVFP4: W4A4, gate_up also writing H as NVFP4).
    pub a_type: AType,
    pub experts_total: u32,
    pub expert_begin: i32,
    pub buckets: Vec<u32>,
    /// SMs of the GPU the tune runs on (the family defaults screened depend on them).
    pub sm_count: u32,
    pub screen: usize,
    pub screen_policy: TimingPolicy,
    pub policy: TimingPolicy,
}

impl MoeTuneSpec {
    /// What `fp4tune tune` tunes for a layer on a GPU of `sm_count` SMs: every bucket of
    /// `buckets` (the default ones when empty), the default screen, the screen and quick timing
    /// policies.
    pub fn for_layer(
        shape: MoeShape,
        a_type: AType,
        experts_total: u32,
        buckets: &[u32],
        sm_count: u32,
    ) -> Self {
        MoeTuneSpec {
            shape,
            a_type,
            experts_total,
            expert_begin: 0,
            buckets: if buckets.is_empty() { DEFAULT_BUCKETS.to_vec() } else { buckets.to_vec() },
            sm_count,
            screen: DEFAULT_SCREEN,
            screen_policy: TimingPolicy::screen(),
            policy: TimingPolicy::quick(),
        }
    }

    /// Bucket `tokens`'s two routings: the uniform draw (its seed recorded in the entry) and the
    /// skewed draw (seed + 1).
    fn draws(&self, tokens: u32) -> [MoeStep; 2] {
        let seed = routing_seed(tokens);
        let step = |routing, seed| MoeStep {
            shape: self.shape,
            experts_total: self.experts_total,
            expert_begin: self.expert_begin,
            tokens,
            routing,
            seed,
        };
        [step(Routing::Uniform, seed), step(Routing::Skewed, seed + 1)]
    }

    /// The layer's family defaults on the tune's GPU (built once per tune).
    fn defaults(&self, family: Family) -> FamilyDefaults {
        FamilyDefaults::new(family, self.a_type, (&self.shape, self.experts_total), self.sm_count)
    }

    /// What a bucket screens for `op` at `tokens`: the screen of its uniform draw's `schedule`
    /// (`bench::moe::screen_candidates`) with `extra` (the previous bucket's pick), then the
    /// family default of the layer at `tokens` (what the runtime runs without a table) where the
    /// screen lacks it, whatever the screen's size rules (the benchmark measures it the same way;
    /// an sm120 default split along K only where this step's tiles split).
    fn screen_of(
        &self,
        (family, defaults): (Family, &FamilyDefaults),
        (schedule, tokens): (&RouteSchedule, u32),
        op: MoeOp,
        extra: &[GroupedConfig],
    ) -> Vec<GroupedConfig> {
        let screen = screen_candidates(
            (family, self.a_type, op),
            schedule,
            &self.shape,
            self.screen,
            extra,
            |_| true,
        );
        let default = defaults.at(op, tokens).filter(|c| runs_as_itself(c, &self.shape, schedule));
        with_default(screen, default)
    }
}

/// The candidates the tune screens first, over its buckets and both ops: each bucket's screen of
/// its uniform draw's schedule without the previous bucket's pick (which the GPU decides), each
/// configuration once, in bucket order. Known before anything is measured, so their kernels can
/// compile ahead: in the background of the GEMM keys (`fp4tune tune`) or on a machine without a
/// GPU (`fp4tune compile --configs pools`).
pub fn first_pools(family: Family, spec: &MoeTuneSpec) -> Vec<GroupedConfig> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    let defaults = spec.defaults(family);
    for &tokens in &spec.buckets {
        // the tune's schedules of the bucket's two draws; it skips a bucket where one is empty
        let [uniform, skewed] = spec
            .draws(tokens)
            .map(|step| RouteSchedule::build(&step.ids(), spec.expert_begin, spec.shape.experts));
        if uniform.rows() == 0 || skewed.rows() == 0 {
            continue;
        }
        for op in MoeOp::ALL {
            let screen = spec.screen_of((family, &defaults), (&uniform, tokens), op, &[]);
            out.extend(screen.into_iter().filter(|c| seen.insert(*c)));
        }
    }
    out
}

/// Progress for the caller to show.
#[derive(Debug, Clone)]
pub enum MoeTuneEvent {
    Key {
        index: usize,
        total: usize,
        key: MoeKey,
    },
    /// A key's entry; `failed` of its `screened` candidates failed, `spilled` of them because
    /// their kernel spills registers to local memory (ptxas's report on this machine).
    Chosen {
        entry: MoeEntry,
        screened: usize,
        failed: usize,
        spilled: usize,
    },
}

/// The routing seed of bucket B (recorded in the entry).
pub fn routing_seed(tokens: u32) -> u64 {
    0x5EED_0000 + tokens as u64
}

fn timed(m: &Measured) -> Option<crate::bench::Summary> {
    match &m.outcome {
        Outcome::Timed(s) => Some(*s),
        Outcome::Failed(_) => None,
    }
}

/// Every candidate screened for one key (failures included).
pub type KeyLog = (MoeKey, Vec<Measured>);

/// Schema of the lines of a grouped tune's log (`<sku>-moe.jsonl`). Version 2 adds the version,
/// the device, the grouped template hash and the time to the key and candidate that the lines
/// without a `schema_version` (version 1) hold; version 3 the NVRTC build that compiled the
/// candidates (`compile::Compiler::nvrtc_build`: its registers and spills are that build's).
pub const MOE_LOG_SCHEMA_VERSION: u32 = 3;

/// One line of a grouped tune's log: a screened candidate of one key (its configuration and its
/// time or failure), with the device and the templates (`moe::templates::family_template_hash` of
/// the key's family) it was measured with, and when (Unix seconds). Logs of several tunes of the
/// same keys in one folder follow each other; the hash and the time tell their lines apart.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MoeLogRecord<'a> {
    pub schema_version: u32,
    pub key: &'a MoeKey,
    pub candidate: &'a Measured,
    pub device: &'a str,
    pub compute_capability: (u32, u32),
    pub template_hash: String,
    /// The NVRTC build, e.g. `13.0.88 (CL-36424714)`.
    pub nvrtc: &'a str,
    pub at: u64,
}

/// The log lines of a tune's screens, one JSON object per candidate, each line ending in a
/// newline; `device` and `compute_capability` name the GPU, `nvrtc` the NVRTC build that compiled
/// the candidates, `at` the time of the tune.
pub fn log_lines(
    logs: &[KeyLog],
    (device, compute_capability): (&str, (u32, u32)),
    nvrtc: &str,
    at: u64,
) -> Result<String, serde_json::Error> {
    let mut out = String::new();
    // one hash per family (the keys of a tune share one): hashing the templates is not per key
    let mut hashes: Vec<(crate::template::Family, String)> = Vec::new();
    for (key, measured) in logs {
        let template_hash = match hashes.iter().find(|(f, _)| *f == key.family) {
            Some((_, h)) => h.clone(),
            None => {
                let h = crate::moe::templates::family_template_hash(key.family);
                hashes.push((key.family, h.clone()));
                h
            }
        };
        for candidate in measured {
            out += &serde_json::to_string(&MoeLogRecord {
                schema_version: MOE_LOG_SCHEMA_VERSION,
                key,
                candidate,
                device,
                compute_capability,
                template_hash: template_hash.clone(),
                nvrtc,
                at,
            })?;
            out.push('\n');
        }
    }
    Ok(out)
}

/// Tune every (op, bucket); returns the entries and every screened candidate (failures included).
pub fn tune_moe(
    gpu: &Gpu,
    compiler: &Compiler,
    launcher: &MoeLauncher<'_>,
    spec: &MoeTuneSpec,
    read_gbps: f64,
    progress: &dyn Fn(MoeTuneEvent),
) -> Result<(Vec<MoeEntry>, Vec<KeyLog>), MoeBenchError> {
    // The device's kernel family (sm120: W4A4 only, on the native block-scaled MMA).
    let family = crate::runtime::family_for(gpu.info())?;
    let mut entries = Vec::new();
    let mut logs = Vec::new();
    // The previous bucket's pick per op, screened again at the next bucket.
    let mut carried: [Option<GroupedConfig>; 2] = [None, None];
    let defaults = spec.defaults(family);
    let total = spec.buckets.len() * 2;
    // One upload of the layer's weights for every step, with the rotation copies the step that
    // touches the fewest experts needs.
    let steps = spec.buckets.iter().flat_map(|&b| spec.draws(b));
    let weights = Arc::new(LayerWeights::for_steps(gpu, spec.shape, steps, &spec.policy)?);
    for (bi, &tokens) in spec.buckets.iter().enumerate() {
        let [uniform, skewed] = spec.draws(tokens);
        let seed = uniform.seed;
        let data = |s| StepData::with_weights(gpu, s, spec.a_type, &spec.policy, weights.clone());
        let uniform = data(uniform)?;
        let skewed = data(skewed)?;
        if uniform.schedule.rows() == 0 || skewed.schedule.rows() == 0 {
            continue;
        }
        uniform.check_schedule(gpu, launcher)?;
        let mut chosen: Vec<GroupedKernel> = Vec::new();
        for (oi, op) in MoeOp::ALL.into_iter().enumerate() {
            let (n, k) = spec.shape.nk(op);
            let key = MoeKey {
                op,
                family,
                a_type: spec.a_type,
                n,
                k,
                experts: spec.shape.experts,
                top_k: spec.shape.top_k,
                tokens,
            };
            progress(MoeTuneEvent::Key { index: bi * 2 + oi, total, key });
            let extra: Vec<_> = carried[oi].into_iter().collect();
            let space =
                spec.screen_of((family, &defaults), (&uniform.schedule, tokens), op, &extra);
            let screened = measure_op(
                gpu,
                compiler,
                &spec.screen_policy,
                launcher,
                &uniform,
                op,
                &space,
                chosen.first(),
            )?;
            let mut ranked: Vec<&Measured> =
                screened.iter().filter(|m| m.median().is_some()).collect();
            ranked.sort_by(|a, b| a.median().unwrap().total_cmp(&b.median().unwrap()));
            let finalists: Vec<_> = ranked.iter().take(FINALISTS).map(|m| m.config).collect();
            if finalists.is_empty() {
                return Err(MoeBenchError::NoCandidate(
                    op,
                    format!("{key}: every candidate failed"),
                ));
            }
            let full = measure_op(
                gpu,
                compiler,
                &spec.policy,
                launcher,
                &uniform,
                op,
                &finalists,
                chosen.first(),
            )?;
            let skew = measure_op(
                gpu,
                compiler,
                &spec.policy,
                launcher,
                &skewed,
                op,
                &finalists,
                chosen.first(),
            )?;
            let best_skew = skew.iter().filter_map(|m| m.median()).fold(f64::INFINITY, f64::min);
            let mut order: Vec<usize> =
                (0..full.len()).filter(|&i| full[i].median().is_some()).collect();
            order.sort_by(|&a, &b| full[a].median().unwrap().total_cmp(&full[b].median().unwrap()));
            let pick = order
                .iter()
                .copied()
                .find(|&i| skew[i].median().is_some_and(|s| s <= SKEW_GUARD * best_skew))
                .or(order.first().copied())
                .ok_or_else(|| {
                    MoeBenchError::NoCandidate(op, format!("{key}: no finalist verified"))
                })?;
            let t = timed(&full[pick]).expect("picked a timed finalist");
            let bytes = roofline_bytes_for(&spec.shape, op, spec.a_type, &uniform.schedule, tokens);
            let entry = MoeEntry {
                key,
                config: full[pick].config,
                median_us: t.median,
                interval_us: (t.lo, t.hi),
                skewed_us: skew[pick].median().unwrap_or(t.median),
                routing_seed: seed,
                roofline_fraction: bytes as f64 / (read_gbps * 1e3) / t.median,
                experts_total: Some(spec.experts_total),
            };
            let failed: Vec<_> = screened.iter().filter(|m| m.median().is_none()).collect();
            let spilled = failed.iter().filter(|m| m.ptxas.is_some_and(|p| p.spills())).count();
            progress(MoeTuneEvent::Chosen {
                entry: entry.clone(),
                screened: screened.len(),
                failed: failed.len(),
                spilled,
            });
            carried[oi] = Some(entry.config);
            chosen.push(GroupedKernel::load(gpu, compiler, entry.config)?);
            entries.push(entry);
            logs.push((key, screened));
        }
    }
    Ok((entries, logs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::moe::{Measured, Outcome};

    /// Every screened candidate becomes one line that carries the schema version, the key, the
    /// candidate, the device, the key's family's grouped template hash and the time.
    #[test]
    fn log_lines_carry_version_device_templates_and_time() {
        let shape = MoeShape { hidden: 6144, inter: 256, experts: 256, top_k: 8 };
        let configs =
            crate::moe::space::search_space_for(Family::Sm90, AType::Bf16, MoeOp::Down, &shape);
        let (n, k) = shape.nk(MoeOp::Down);
        let key = MoeKey {
            op: MoeOp::Down,
            family: Family::Sm90,
            a_type: AType::Bf16,
            n,
            k,
            experts: 256,
            top_k: 8,
            tokens: 64,
        };
        let measured = vec![
            Measured {
                config: configs[0],
                outcome: Outcome::Failed("refused at load: spills".into()),
                ptxas: Some(crate::compile::PtxasStats {
                    registers: 128,
                    spill_stores: 8,
                    spill_loads: 20,
                    ..Default::default()
                }),
            },
            Measured {
                config: configs[1],
                outcome: Outcome::Failed("did not verify".into()),
                ptxas: None,
            },
        ];
        let text = log_lines(
            &[(key, measured.clone())],
            ("NVIDIA H200", (9, 0)),
            "13.0.88 (CL-1)",
            1_764_800_000,
        )
        .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(text.ends_with('\n'));
        for (line, m) in lines.iter().zip(&measured) {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["schema_version"], MOE_LOG_SCHEMA_VERSION);
            assert_eq!(v["device"], "NVIDIA H200");
            assert_eq!(v["compute_capability"], serde_json::json!([9, 0]));
            assert_eq!(v["at"], 1_764_800_000u64);
            assert_eq!(v["nvrtc"], "13.0.88 (CL-1)");
            assert_eq!(
                v["template_hash"],
                crate::moe::templates::family_template_hash(Family::Sm90)
            );
            let back: MoeKey = serde_json::from_value(v["key"].clone()).unwrap();
            assert_eq!(back, key);
            let cand: Measured = serde_json::from_value(v["candidate"].clone()).unwrap();
            assert_eq!(&cand, m);
            assert_eq!(v["candidate"].get("ptxas").is_some(), m.ptxas.is_some());
        }
        // a line of a log written before candidates carried their ptxas statistics still reads
        let mut old: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        old["candidate"].as_object_mut().unwrap().remove("ptxas");
        let cand: Measured = serde_json::from_value(old["candidate"].clone()).unwrap();
        assert_eq!(cand, Measured { ptxas: None, ..measured[0].clone() });
        assert_eq!(log_lines(&[], ("x", (9, 0)), "13.0", 0).unwrap(), "");
        // the GEMM log readers (report, merge, simulate, check) name a grouped log for what it is
        let e =
            crate::tune::log::parse_log(text.as_bytes(), std::path::Path::new("h200-moe.jsonl"))
                .unwrap_err()
                .to_string();
        assert!(e.contains("h200-moe.jsonl:1") && e.contains("grouped MoE tune's log"), "{e}");
    }

    /// The first pools are each bucket's screen of its uniform draw without a carried pick, each
    /// configuration once and legal for the layer: on the GLM-5 TP8 layer the streamed spread and
    /// seeds of both ops, the family default of every bucket, the tiled and wgmma configurations
    /// from the sizes that screen them; sm120 W4A4 its own kernels.
    #[test]
    fn first_pools_hold_every_screen_of_the_uniform_draws() {
        let spec = MoeTuneSpec::for_layer(MoeShape::GLM5_TP8, AType::Bf16, 256, &[], 132);
        let pools = first_pools(Family::Sm90, &spec);
        let distinct: std::collections::HashSet<_> = pools.iter().collect();
        assert_eq!(distinct.len(), pools.len(), "each configuration once");
        let defaults = spec.defaults(Family::Sm90);
        for &tokens in &spec.buckets {
            let [uniform, _] = spec.draws(tokens);
            let schedule =
                RouteSchedule::build(&uniform.ids(), spec.expert_begin, spec.shape.experts);
            for op in MoeOp::ALL {
                // what the tune screens, spelled out: the space's spread, its tiled kernels by
                // size, the seeds (no carried pick)
                let screen = screen_candidates(
                    (Family::Sm90, AType::Bf16, op),
                    &schedule,
                    &spec.shape,
                    DEFAULT_SCREEN,
                    &[],
                    |_| true,
                );
                assert!(!screen.is_empty());
                for c in screen {
                    assert!(distinct.contains(&c), "B = {tokens}: {c} missing");
                }
                // and the family default the runtime runs for the layer without a table
                let d = defaults.at(op, tokens).unwrap();
                assert!(distinct.contains(&d), "B = {tokens}: default {d} missing");
            }
        }
        assert!(pools.iter().all(|c| c.check(&spec.shape).is_ok()));
        for op in MoeOp::ALL {
            assert!(pools.iter().any(|c| c.op == op && !c.tiled));
            assert!(pools.iter().any(|c| c.op == op && c.tiled && !c.wgmma));
            assert!(pools.iter().any(|c| c.op == op && c.wgmma));
        }
        // a layer unlike GLM-5 TP8 (Mixtral over 8 GPUs): its defaults, fitted to its few
        // experts per step, are not all in the plain screens; the pools hold every one
        let mixtral = MoeShape { hidden: 4096, inter: 1792, experts: 8, top_k: 2 };
        let spec = MoeTuneSpec::for_layer(mixtral, AType::Bf16, 8, &[1, 2, 4, 8, 16, 64], 132);
        let pools = first_pools(Family::Sm90, &spec);
        let defaults = spec.defaults(Family::Sm90);
        let mut added = 0;
        for &tokens in &spec.buckets {
            let [uniform, _] = spec.draws(tokens);
            let schedule = RouteSchedule::build(&uniform.ids(), 0, mixtral.experts);
            for op in MoeOp::ALL {
                let d = defaults.at(op, tokens).unwrap();
                assert!(pools.contains(&d), "Mixtral B = {tokens}: default {d} missing");
                let plain = (Family::Sm90, AType::Bf16, op);
                let screen =
                    screen_candidates(plain, &schedule, &mixtral, DEFAULT_SCREEN, &[], |_| true);
                added += usize::from(!screen.contains(&d));
            }
        }
        assert!(added > 0);
        // decode buckets only: no tiled kernels
        let decode = MoeTuneSpec::for_layer(MoeShape::GLM5_TP8, AType::Bf16, 256, &[1, 8], 132);
        assert!(first_pools(Family::Sm90, &decode).iter().all(|c| !c.tiled));
        let w4a4 = MoeTuneSpec::for_layer(MoeShape::GLM5_TP8, AType::Nvfp4, 256, &[1, 64], 188);
        let sm120 = first_pools(Family::Sm120, &w4a4);
        assert!(!sm120.is_empty());
        assert!(sm120.iter().all(|c| c.family == Family::Sm120 && c.a_type == AType::Nvfp4));
    }
}
