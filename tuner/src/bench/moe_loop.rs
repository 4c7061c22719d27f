//! fp4tune's own per-expert loop, the peer `fp4tune_loop` of the grouped kernels in
//! `fp4tune bench --moe`: what an engine without a grouped kernel runs. Per projection, one GEMM
//! per active expert through the runtime dispatcher ([`Dispatcher::gemm_in`], the dispatch
//! table's GEMM entry for the expert's N x K at M = its routed rows, with a workspace of the
//! stream's own), all experts of the step captured in one CUDA graph and timed like the grouped
//! candidates: weight copies rotated for cold L2, graph replay, interleaved samples.
//!
//! The loop's activations are the step's routed rows already in expert-sorted order (gate_up: the
//! rows of `X` gathered per expert; down: a bf16 `H`), so it times the GEMMs alone: no gather, no
//! SiLU, no router-weighted sum. W4A16 (bf16 activations). Before it is timed, every expert's
//! output is checked on the step's sampled rows against the CPU reference of the grouped
//! kernels: the expert's dequantized NVFP4 weight rows (`moe::reference::ExpertWeights`), f32 dot
//! products, alpha last, compared with `moe::reference::matches`.

use super::{roofline_bytes, MoeBenchError, MoeRow, StepData};
use crate::bench::floors::Floors;
use crate::bench::stats::Summary;
use crate::bench::timer::{measure, LaunchFn};
use crate::bench::TimingPolicy;
use crate::gpu::{DeviceBuf, Gpu, GpuError};
use crate::moe::reference::{self, ExpertWeights};
use crate::moe::schedule::{RouteSchedule, SplitMix64};
use crate::moe::MoeOp;
use crate::problem::AType;
use crate::runtime::{Dispatcher, GemmArgs, Options, Route, RuntimeError};
use crate::table::Table;
use half::bf16;
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// The `impl` column of the loop's rows.
pub const IMPL: &str = "fp4tune_loop";

/// The dispatcher the loop launches through: the GEMM entries of `tables` merged
/// ([`merge_gemm_entries`]; their grouped entries are not loaded), or the family defaults when
/// there is no table or no table has a GEMM entry (a `tune --moe-only` table). Device `device`,
/// the default CUBIN cache and mismatch policy (an entry the device or the templates disable runs
/// its fallback, which the rows' configuration names).
pub fn open_dispatcher(
    tables: &[(PathBuf, Table)],
    device: usize,
) -> Result<Dispatcher, RuntimeError> {
    let options = Options { device, ..Options::default() };
    if tables.is_empty() {
        return Dispatcher::open_untuned(&options);
    }
    let Some(merged) = merge_gemm_entries(tables)? else {
        return Dispatcher::open_untuned(&options);
    };
    let names: Vec<String> = tables.iter().map(|(p, _)| p.display().to_string()).collect();
    Dispatcher::open_with(Some((&merged, Path::new(&names.join("+")))), &options)
}

/// One table holding the GEMM entries of every table (the first's identity, toolchain and
/// policy; a key that an earlier table has is taken from the earlier one), without grouped
/// entries; `None` when no table has a GEMM entry. Tables of other devices or other template
/// sources are refused: one identity and one template hash per family must describe every entry.
pub fn merge_gemm_entries(tables: &[(PathBuf, Table)]) -> Result<Option<Table>, RuntimeError> {
    let Some(((first_path, first), rest)) = tables.split_first() else {
        return Err(RuntimeError::InvalidArgument("no dispatch table to merge".into()));
    };
    let mut merged = first.clone();
    merged.moe.clear();
    merged.moe_template_hash = None;
    for (path, t) in rest {
        let refuse = |what: String| {
            Err(RuntimeError::InvalidArgument(format!(
                "{} and {} cannot be merged: {what}",
                first_path.display(),
                path.display()
            )))
        };
        if t.device != first.device {
            return refuse(format!("measured on {:?} and {:?}", first.device, t.device));
        }
        for (family, hash) in &t.template_hashes {
            match merged.template_hashes.get(family) {
                Some(h) if h != hash => {
                    return refuse(format!("{family} entries of other template sources"))
                }
                Some(_) => {}
                None => {
                    merged.template_hashes.insert(*family, hash.clone());
                }
            }
        }
        for e in &t.entries {
            if !merged.entries.iter().any(|m| m.key == e.key) {
                merged.entries.push(e.clone());
            }
        }
    }
    if merged.entries.is_empty() {
        return Ok(None);
    }
    let origin: Vec<String> = tables.iter().map(|(p, _)| p.display().to_string()).collect();
    merged.validate(&origin.join(" + "))?;
    Ok(Some(merged))
}

/// The loop's GEMMs of one step: per active local expert (expert, first sorted row, rows).
pub fn expert_slices(s: &RouteSchedule) -> Vec<(usize, usize, usize)> {
    s.offsets
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[1] > w[0])
        .map(|(e, w)| (e, w[0] as usize, (w[1] - w[0]) as usize))
        .collect()
}

/// The configuration column of a loop row: each distinct route with how many experts took it,
/// most first (ties in route order); `;` separated (the CSV is comma separated).
pub fn describe_routes(routes: &[Route]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for r in routes {
        let text = r.to_string();
        match counts.iter_mut().find(|(t, _)| *t == text) {
            Some((_, n)) => *n += 1,
            None => counts.push((text, 1)),
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    let parts: Vec<String> = counts.iter().map(|(t, n)| format!("{n} x {t}")).collect();
    parts.join("; ").replace(',', ";")
}

/// The activation rows and output of one projection of the loop, on the host and the GPU.
struct OpData<'d> {
    op: MoeOp,
    weights: &'d ExpertWeights,
    /// `[rows, k]` bf16 in expert-sorted order.
    a_host: Vec<bf16>,
    a: DeviceBuf<u16>,
    y: DeviceBuf<u16>,
}

impl<'d> OpData<'d> {
    fn new(gpu: &Gpu, d: &'d StepData, op: MoeOp) -> Result<Self, GpuError> {
        let s = &d.schedule;
        let rows = s.rows() as usize;
        let top_k = d.step.shape.top_k as usize;
        let (weights, a_host) = match op {
            MoeOp::GateUp => {
                let k = d.weights.w13.k;
                let mut a = Vec::with_capacity(rows * k);
                for &id in &s.sorted_ids {
                    let token = id as usize / top_k;
                    a.extend_from_slice(&d.x_host[token * k..][..k]);
                }
                (&d.weights.w13, a)
            }
            MoeOp::Down => {
                let mut rng = SplitMix64(d.step.seed ^ 0x100b);
                let a = (0..rows * d.weights.w2.k)
                    .map(|_| bf16::from_f32(rng.below(2001) as f32 / 1000.0 - 1.0))
                    .collect();
                (&d.weights.w2, a)
            }
        };
        let bits: Vec<u16> = a_host.iter().map(|v| v.to_bits()).collect();
        Ok(OpData {
            op,
            weights,
            a: gpu.upload(&bits)?,
            y: gpu.alloc_zeros::<u16>(rows * weights.n)?,
            a_host,
        })
    }

    /// The GEMM of each active expert on weight copy `c` (codes and scales at `w`, `w_sf`).
    fn args(&self, d: &StepData, w: u64, w_sf: u64) -> Vec<GemmArgs> {
        let (n, k) = (self.weights.n, self.weights.k);
        expert_slices(&d.schedule)
            .into_iter()
            .map(|(e, first, rows)| GemmArgs {
                a: self.a.ptr() + (first * k * 2) as u64,
                a_sf: 0,
                w: w + (e * self.weights.code_bytes()) as u64,
                w_sf: w_sf + (e * self.weights.scale_bytes()) as u64,
                y: self.y.ptr() + (first * n * 2) as u64,
                m: rows as u32,
                n: n as u32,
                k: k as u32,
                a_type: AType::Bf16,
                alpha: self.weights.alpha[e],
            })
            .collect()
    }

    /// `None` when the GPU's output matches the reference on every sampled row.
    fn verify(&self, d: &StepData, y: &[u16]) -> Option<String> {
        let (n, k) = (self.weights.n, self.weights.k);
        let s = &d.schedule;
        d.sample_rows().par_iter().find_map_any(|&r| {
            let e = s.expert_of_row(r) as usize;
            let a = &self.a_host[r as usize * k..][..k];
            let mut w = vec![0f32; k];
            let want: Vec<f32> = (0..n)
                .map(|j| {
                    self.weights.dequant_row(e, j, &mut w);
                    let dot: f32 = w.iter().zip(a).map(|(w, x)| w * x.to_f32()).sum();
                    dot * self.weights.alpha[e]
                })
                .collect();
            let row_max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            want.iter().enumerate().find_map(|(j, &v)| {
                let got = bf16::from_bits(y[r as usize * n + j]);
                (!reference::matches(got, v, row_max)).then(|| {
                    format!(
                        "wrong result: {} sorted row {r} (expert {e}), column {j}: {} instead of {v}",
                        self.op,
                        got.to_f32()
                    )
                })
            })
        })
    }
}

/// One projection of the loop on step `d`: the routes, then one run verified against the
/// reference, then the timing. `Err(reason)` is a failed peer (data, not an error of the run).
fn run_op(
    gpu: &Gpu,
    dispatcher: &Dispatcher,
    policy: &TimingPolicy,
    d: &StepData,
    op: MoeOp,
) -> Result<Result<(Summary, String), String>, MoeBenchError> {
    let o = OpData::new(gpu, d, op)?;
    let copies = match op {
        MoeOp::GateUp => d.copies13,
        MoeOp::Down => d.copies2,
    };
    // Per weight copy: the launches of every active expert.
    // the per-expert GEMMs read the codes in the ModelOpt order (a copy of them that does not
    // fit on the device fails this peer, not the run)
    let per_copy: Result<Vec<Vec<GemmArgs>>, GpuError> = (0..copies)
        .map(|c| {
            let a = d.args(c, c);
            let codes = d.weights.modelopt_codes_at(gpu, op, c)?;
            Ok(match op {
                MoeOp::GateUp => o.args(d, codes, a.w13_sf),
                MoeOp::Down => o.args(d, codes, a.w2_sf),
            })
        })
        .collect();
    let per_copy = match per_copy {
        Ok(p) => p,
        Err(e) => return Ok(Err(format!("the ModelOpt-order copy of the weights: {e}"))),
    };
    let max_rows = expert_slices(&d.schedule).iter().map(|s| s.2).max().unwrap_or(1);
    let ws = dispatcher.gemm_workspace(max_rows as u32)?;
    let routes: Vec<Route> = match per_copy[0]
        .iter()
        .map(|g| dispatcher.route(g.m, g.n, g.k, g.a_type))
        .collect::<Result<_, _>>()
    {
        Ok(r) => r,
        Err(e) => return Ok(Err(format!("route: {e}"))),
    };
    let stream = gpu.own_stream();
    let launch = |c: usize| -> Result<(), RuntimeError> {
        for g in &per_copy[c % copies] {
            // SAFETY: the step's weight copy `c`, the loop's activation and output buffers and
            // `ws` are live device buffers of this context of the layout's sizes for each
            // expert's (rows, n, k) (slices of the sorted rows, the expert's block of the stacked
            // weights), alive for this function; the Gpu's own stream, the only one using `ws`.
            unsafe { dispatcher.gemm_in(g, &ws, stream) }?;
        }
        Ok(())
    };
    if let Err(e) = launch(0).map_err(|e| e.to_string()).and_then(|_| {
        // SAFETY: the Gpu's own stream.
        unsafe { dispatcher.synchronize(stream) }.map_err(|e| e.to_string())
    }) {
        return Ok(Err(format!("launch: {e}")));
    }
    if let Some(why) = o.verify(d, &gpu.download(&o.y)?) {
        return Ok(Err(why));
    }
    let f: LaunchFn<'_> = Box::new(|i| {
        launch(i).map_err(|e| match e {
            RuntimeError::Gpu(g) => g,
            other => GpuError::Kernel { kernel: IMPL.into(), message: other.to_string() },
        })
    });
    let timed = measure(gpu, policy, copies, vec![f]).pop().expect("one candidate");
    Ok(match timed.map(|s| Summary::of(&s.us)) {
        Ok(Some(sum)) => Ok((sum, describe_routes(&routes))),
        Ok(None) => Err("no samples".into()),
        Err(e) => Err(format!("timing: {e}")),
    })
}

/// The loop's rows of step `d` (set `label`), one per projection, with the same roofline and read
/// floor as the grouped rows; a failed projection is a row with no time (NaN) whose
/// configuration column says why.
pub fn rows(
    gpu: &Gpu,
    dispatcher: &Dispatcher,
    policy: &TimingPolicy,
    d: &StepData,
    label: &str,
    read_gbps: f64,
    floors: &Floors<'_>,
) -> Result<Vec<MoeRow>, MoeBenchError> {
    let shape = d.step.shape;
    let tokens = d.step.tokens;
    let mut out = Vec::with_capacity(2);
    for op in MoeOp::ALL {
        let bytes = roofline_bytes(&shape, op, &d.schedule, tokens);
        let (n, k) = shape.nk(op);
        let (t, config, verified) = match run_op(gpu, dispatcher, policy, d, op)? {
            Ok((t, config)) => ((t.median, t.lo, t.hi), config, 1),
            Err(why) => (
                (f64::NAN, f64::NAN, f64::NAN),
                format!("{}{why}", crate::bench::moe_report::FAILED_ROW),
                0,
            ),
        };
        out.push(MoeRow {
            set: label.to_string(),
            op: op.as_str().into(),
            n,
            k,
            experts: shape.experts,
            top_k: shape.top_k,
            tokens,
            active_experts: d.schedule.active_experts(),
            implementation: IMPL.into(),
            config: config.replace(',', ";"),
            median_us: t.0,
            lo_us: t.1,
            hi_us: t.2,
            roofline_us: bytes as f64 / (read_gbps * 1e3),
            read_floor_us: floors.read_floor(policy, bytes)?.time.median,
            verified,
            failed: 1 - verified,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::schedule::{draw_routing, Routing};
    use crate::runtime::RouteKind;
    use crate::table::Method;
    use crate::template::{default_config, Family};

    fn committed(name: &str) -> (PathBuf, Table) {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results").join(name);
        let t = Table::load(&p).unwrap_or_else(|e| panic!("{e}"));
        (p, t)
    }

    #[test]
    fn the_tp8_and_ep8_tables_merge_into_one_gemm_table() {
        let (tp8, ep8) = (committed("nvidia-h200.ron"), committed("nvidia-h200-ep8.ron"));
        let merged = merge_gemm_entries(&[tp8.clone(), ep8.clone()]).unwrap().unwrap();
        assert!(merged.moe.is_empty() && merged.moe_template_hash.is_none());
        for e in tp8.1.entries.iter().chain(&ep8.1.entries) {
            let m = merged.entries.iter().find(|m| m.key == e.key).unwrap();
            assert_eq!(m.config, e.config, "{}", e.key);
        }
        let distinct = |t: &Table| {
            t.entries
                .iter()
                .map(|e| (e.key.n, e.key.k))
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        };
        assert!(distinct(&merged) > distinct(&tp8.1));
        // A key the first table has is taken from it.
        let again = merge_gemm_entries(&[tp8.clone(), tp8.clone()]).unwrap().unwrap();
        assert_eq!(again.entries, tp8.1.entries);
        // One table alone: its GEMM entries.
        let alone = merge_gemm_entries(std::slice::from_ref(&tp8)).unwrap().unwrap();
        assert_eq!(alone.entries, tp8.1.entries);
        assert!(merge_gemm_entries(&[]).is_err());
    }

    #[test]
    fn tables_of_grouped_entries_alone_leave_the_loop_its_defaults() {
        // what `fp4tune tune --moe-only` writes: grouped entries, no GEMM entry
        let mut moe_only = committed("nvidia-h200.ron");
        moe_only.0 = "moe-only.ron".into();
        moe_only.1.entries.clear();
        moe_only.1.template_hashes.clear();
        assert!(!moe_only.1.moe.is_empty());
        moe_only.1.validate("moe-only.ron").unwrap();
        assert!(merge_gemm_entries(std::slice::from_ref(&moe_only)).unwrap().is_none());
        // beside a table with GEMM entries, those are the merged table's
        let tp8 = committed("nvidia-h200.ron");
        let merged = merge_gemm_entries(&[moe_only.clone(), tp8.clone()]).unwrap().unwrap();
        assert_eq!(merged.entries, tp8.1.entries);
        assert_eq!(merged.template_hashes, tp8.1.template_hashes);
        assert!(merged.moe.is_empty());
    }

    #[test]
    fn tables_of_other_devices_or_templates_are_not_merged() {
        let tp8 = committed("nvidia-h200.ron");
        let mut other = tp8.clone();
        other.0 = "other.ron".into();
        other.1.device.name = "NVIDIA H100".into();
        let e = merge_gemm_entries(&[tp8.clone(), other]).unwrap_err().to_string();
        assert!(e.contains("other.ron") && e.contains("cannot be merged"), "{e}");
        let mut stale = tp8.clone();
        for h in stale.1.template_hashes.values_mut() {
            *h = "0".repeat(64);
        }
        let e = merge_gemm_entries(&[tp8, stale]).unwrap_err().to_string();
        assert!(e.contains("other template sources"), "{e}");
    }

    #[test]
    fn one_gemm_per_active_expert_over_its_sorted_rows() {
        let ids = draw_routing(7, 5, 8, 256, Routing::Uniform);
        let s = RouteSchedule::build(&ids, 0, 256);
        let slices = expert_slices(&s);
        assert_eq!(slices.len(), s.active_experts() as usize);
        assert_eq!(slices.iter().map(|x| x.2).sum::<usize>(), 40);
        let mut next = 0;
        for &(e, first, rows) in &slices {
            assert_eq!(first, next, "contiguous, in expert order");
            assert!(rows > 0);
            assert!((first..first + rows).all(|r| s.expert_of_row(r as u32) as usize == e));
            next = first + rows;
        }
        // Expert parallelism: experts of other GPUs have no GEMM.
        let local = RouteSchedule::build(&ids, 32, 32);
        let slices = expert_slices(&local);
        assert_eq!(slices.iter().map(|x| x.2).sum::<usize>(), local.rows() as usize);
        assert!(slices.iter().all(|x| x.0 < 32));
    }

    #[test]
    fn the_configuration_column_counts_routes_without_commas() {
        let c = default_config(Family::Sm90, AType::Bf16);
        let exact = Route { config: c, method: Method::Fused, kind: RouteKind::Exact };
        let near = Route { kind: RouteKind::NearestBucket { bucket: 16 }, ..exact };
        let text = describe_routes(&[near, exact, near, near]);
        assert_eq!(text, format!("3 x {c} (nearest bucket M=16); 1 x {c} (exact)"));
        assert!(!text.contains(','));
        let composite = Route { method: Method::DequantCublasBf16, ..exact };
        assert_eq!(describe_routes(&[composite]), "1 x dequant_cublas_bf16 (exact)");
    }
}

#[cfg(test)]
mod gpu_tests {
    //! The loop on a GPU (`--features gpu`): verified against the reference and timed.

    use super::*;
    use crate::bench::moe::{MoeStep, StepData};
    use crate::moe::schedule::Routing;
    use crate::moe::MoeShape;

    /// Both projections of TP8 steps with 1, 8 and 64 tokens through the committed H200 table's
    /// GEMM entries: verified, timed, and a row per projection with the routes taken.
    #[test]
    #[cfg_attr(
        not(feature = "gpu"),
        ignore = "GPU test: run with --features gpu on a machine with a CUDA GPU"
    )]
    fn the_per_expert_loop_is_verified_and_timed() {
        let gpu = Gpu::open(0).unwrap();
        let table = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/nvidia-h200.ron");
        let loaded = Table::load(&table).unwrap();
        let dispatcher = open_dispatcher(&[(table, loaded)], 0).unwrap();
        let compiler = crate::compile::Compiler::with_default_cache().unwrap();
        let floors = Floors::new(&gpu, &compiler).unwrap();
        let policy = TimingPolicy {
            samples: 3,
            min_sample_us: 50.0,
            max_launches: 16,
            warmup_replays: 1,
            ..TimingPolicy::default()
        };
        for tokens in [1, 8, 64] {
            let step = MoeStep {
                shape: MoeShape::GLM5_TP8,
                experts_total: 256,
                expert_begin: 0,
                tokens,
                routing: Routing::Uniform,
                seed: 1000 + tokens as u64,
            };
            let d = StepData::new(&gpu, step, &policy).unwrap();
            let rows = rows(&gpu, &dispatcher, &policy, &d, "tp8", 4000.0, &floors).unwrap();
            assert_eq!(rows.len(), 2);
            for r in &rows {
                assert_eq!((r.verified, r.failed), (1, 0), "B={tokens}: {r:?}");
                assert!(r.median_us > 0.0 && r.lo_us <= r.median_us && r.median_us <= r.hi_us);
                let launches: usize = r
                    .config
                    .split("; ")
                    .map(|p| p.split(" x ").next().unwrap().parse::<usize>().unwrap())
                    .sum();
                assert_eq!(launches, d.schedule.active_experts() as usize, "{}", r.config);
            }
        }
    }
}
