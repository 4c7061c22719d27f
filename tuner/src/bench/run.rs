//! One benchmark run: floors, then for every (shape, M) our verified candidates and the peers,
//! all under one timing policy, into report rows. The CLI only parses flags and prints.

use super::composite::{self, Composite};
use super::floors::{FloorError, Floors};
use super::gemm::{time_candidates, verify, Candidate, DeviceProblem, HostProblem};
use super::peers::time_peers;
use super::policy::TimingPolicy;
use super::report::Row;
use super::stats::Summary;
use crate::compile::Compiler;
use crate::gpu::blas::CublasBf16;
use crate::gpu::{Gpu, GpuError};
use crate::problem::{AType, GemmProblem};
use crate::template::GemmConfig;
use std::collections::HashMap;

/// Token counts a benchmark measures when none are given.
pub const DEFAULT_MS: [u32; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];
/// Candidates of each problem re-timed under the reported policy after screening.
pub const DEFAULT_REFINE: usize = 8;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    /// (label, N, K) of every distinct weight shape, e.g. ("tp8_routed_gate_up", 512, 6144).
    pub shapes: Vec<(String, u32, u32)>,
    pub ms: Vec<u32>,
    pub a_type: AType,
    /// Candidate configurations; each (shape, M) runs those legal for it.
    pub configs: Vec<GemmConfig>,
    pub peers: bool,
    /// The reported (second-phase) policy.
    pub policy: TimingPolicy,
    /// Two-phase timing: every verified candidate is first screened under `screen_policy`, then
    /// the `refine` fastest are re-timed under `policy` (interleaved with the peers' run).
    /// `refine == 0` times every candidate under `policy`.
    pub refine: usize,
    pub screen_policy: TimingPolicy,
    /// Per problem, only the `max_candidates` legal configurations the analytic cost model ranks
    /// fastest (plus the family default) are compiled and measured; 0 = all of them.
    pub max_candidates: usize,
}

/// The `max` best-ranked configurations of `ranked` (model order), shared evenly between the weight
/// pipelines the model cannot rule out (`search::competitive_pipelines`; a pipeline with fewer
/// candidates leaves its share to the others): the analytic model does not see each pipeline's
/// instruction and barrier costs, so a plain top-`max` could leave a whole pipeline unmeasured
/// at decode sizes, while at M = 1024 it rightly predicts the streamed kernels 2x slower.
pub fn top_per_pipeline(ranked: &[(GemmConfig, f64)], max: usize) -> Vec<GemmConfig> {
    let pipelines = crate::search::competitive_pipelines(ranked);
    let mut out: Vec<GemmConfig> = Vec::with_capacity(max);
    let mut remaining = pipelines.len();
    let mut budget = max;
    // Smallest groups first, so their unused share goes to the larger ones.
    let mut groups: Vec<Vec<GemmConfig>> = pipelines
        .iter()
        .map(|pl| ranked.iter().filter(|(c, _)| c.pipeline == *pl).map(|(c, _)| *c).collect())
        .collect();
    groups.sort_by_key(|g| g.len());
    for g in groups {
        let share = budget / remaining.max(1);
        let take = share.min(g.len());
        out.extend(g.into_iter().take(take));
        budget -= take;
        remaining -= 1;
    }
    out
}

/// A candidate that did not produce a timing, and why (compile error, resource limit, wrong
/// answer, launch failure): data, not a crash.
#[derive(Debug, Clone)]
pub struct Failure {
    pub shape: String,
    pub m: u32,
    pub config: String,
    pub reason: String,
}

/// Progress events for the CLI's progress bars.
#[derive(Debug, Clone)]
pub enum Event {
    Floors(String),
    Problem {
        index: usize,
        total: usize,
        label: String,
        candidates: usize,
    },
    /// A problem finished: its report rows (so a caller can write reports incrementally).
    ProblemDone {
        rows: Vec<Row>,
        screen_rows: Vec<Row>,
        failures: Vec<Failure>,
    },
}

#[derive(Debug, Clone)]
pub struct BenchOutput {
    pub rows: Vec<Row>,
    /// First-phase (screening) rows of every verified candidate.
    pub screen_rows: Vec<Row>,
    pub failures: Vec<Failure>,
    pub bandwidth_gbps: f64,
    pub launch_floor_us: f64,
    pub tensor_peak_tflops: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Floor(#[from] FloorError),
    #[error("building the problem {0}: {1}")]
    Problem(String, String),
}

/// Measured bf16 tensor throughput (TFLOP/s): best of a few cuBLAS 8192^3 GEMMs.
pub fn tensor_peak_tflops(gpu: &Gpu) -> Result<f64, GpuError> {
    let n = 8192usize;
    let a = gpu.alloc_zeros::<u16>(n * n)?;
    let b = gpu.alloc_zeros::<u16>(n * n)?;
    let c = gpu.alloc_zeros::<u16>(n * n)?;
    let blas = CublasBf16::new(gpu)?;
    let mut best = f64::INFINITY;
    for _ in 0..6 {
        // SAFETY: three n*n bf16 buffers, as the call requires.
        let ms = gpu.time_ms(|| unsafe {
            blas.gemm(n as i32, n as i32, n as i32, 1.0, a.ptr(), b.ptr(), c.ptr())
        })?;
        best = best.min(ms as f64);
    }
    Ok(2.0 * (n as f64).powi(3) / (best * 1e-3) / 1e12)
}

/// The tensor peak of the data path of this GPU's family (TFLOP/s): the measured bf16 peak through
/// [`crate::search::DeviceModel::data_path_peak_tflops`] (an FP4 peak on sm120).
pub fn data_path_peak_tflops(gpu: &Gpu) -> Result<f64, GpuError> {
    let info = gpu.info();
    Ok(crate::search::DeviceModel::data_path_peak_tflops(
        &info.name,
        info.compute_capability,
        tensor_peak_tflops(gpu)?,
    ))
}

/// The physical floors of the run: the floor kernels, the launch floor, the read bandwidth and the
/// tensor peak, measured under the run's policy.
struct RunFloors<'g> {
    floors: Floors<'g>,
    launch_floor: f64,
    bandwidth: f64,
    peak: f64,
    /// Cold read floors by byte count, measured once each.
    read_floors: HashMap<u64, f64>,
}

impl<'g> RunFloors<'g> {
    fn measure(
        gpu: &'g Gpu,
        compiler: &Compiler,
        policy: &TimingPolicy,
    ) -> Result<Self, BenchError> {
        let floors = Floors::new(gpu, compiler)?;
        let launch_floor = floors.launch_floor(policy, gpu.info().sm_count)?.median;
        let bandwidth = floors.read_bandwidth(policy, 1 << 30)?;
        let peak = data_path_peak_tflops(gpu)?;
        Ok(Self { floors, launch_floor, bandwidth, peak, read_floors: HashMap::new() })
    }

    fn read_floor(&mut self, policy: &TimingPolicy, bytes: u64) -> Result<f64, BenchError> {
        if let Some(v) = self.read_floors.get(&bytes) {
            return Ok(*v);
        }
        let v = self.floors.read_floor(policy, bytes)?.time.median;
        self.read_floors.insert(bytes, v);
        Ok(v)
    }
}

/// Candidates of every (M, N, K): the legal configurations, capped to the model's best per
/// pipeline (plus the family default) when `spec.max_candidates` is set.
fn plan_candidates(
    spec: &BenchSpec,
    model: &crate::search::CostModel,
) -> HashMap<(u32, u32, u32), Vec<GemmConfig>> {
    let mut plan = HashMap::new();
    for (_, n, k) in &spec.shapes {
        for &m in &spec.ms {
            let p = GemmProblem::new(m, *n, *k, spec.a_type);
            let legal: Vec<GemmConfig> =
                spec.configs.iter().copied().filter(|c| c.check_problem(&p).is_ok()).collect();
            let chosen = if spec.max_candidates > 0 && legal.len() > spec.max_candidates {
                let mut top = top_per_pipeline(&model.rank(&legal, &p), spec.max_candidates);
                if let Some(d) = spec
                    .configs
                    .first()
                    .map(|c| crate::template::default_config(c.family, c.a_type))
                {
                    if legal.contains(&d) && !top.contains(&d) {
                        top.push(d);
                    }
                }
                top
            } else {
                legal
            };
            plan.insert((m, *n, *k), chosen);
        }
    }
    plan
}

type CompiledMap = HashMap<
    String,
    Result<std::sync::Arc<crate::compile::CompiledKernel>, crate::compile::CompileError>,
>;

/// One parallel compile of the union of every problem's candidates (configurations that do not
/// render are skipped: they fail `check`), by configuration name.
fn compile_union(
    compiler: &Compiler,
    plan: &HashMap<(u32, u32, u32), Vec<GemmConfig>>,
    progress: &dyn Fn(Event),
) -> CompiledMap {
    let mut union: Vec<GemmConfig> = plan.values().flatten().copied().collect();
    union.sort();
    union.dedup();
    progress(Event::Floors(format!("compiling {} kernels", union.len())));
    let (names, sources): (Vec<String>, Vec<_>) =
        union.iter().filter_map(|c| c.render().ok().map(|s| (c.name(), s))).unzip();
    names.into_iter().zip(compiler.compile_many(&sources)).collect()
}

/// What a run has collected so far.
#[derive(Default)]
struct Collected {
    rows: Vec<Row>,
    screen_rows: Vec<Row>,
    failures: Vec<Failure>,
}

/// Everything one problem's measurement needs from the run.
struct RunContext<'a, 'g> {
    gpu: &'g Gpu,
    spec: &'a BenchSpec,
    compiled: &'a CompiledMap,
    dequant_path: Option<&'a Result<Composite<'g>, composite::CompositeError>>,
}

/// One (shape, M): verify every candidate, screen and time the verified ones (then the peers and
/// the dequantize-then-cuBLAS path, verified like our kernels), into `out`.
fn measure_problem(
    ctx: &RunContext<'_, '_>,
    floors: &mut RunFloors<'_>,
    (label, n, k, m): (&str, u32, u32, u32),
    legal: &[GemmConfig],
    out: &mut Collected,
) -> Result<(), BenchError> {
    let (gpu, spec, policy) = (ctx.gpu, ctx.spec, &ctx.spec.policy);
    let p = GemmProblem::new(m, n, k, spec.a_type);
    let fail =
        |config: String, reason: String| Failure { shape: label.to_string(), m, config, reason };
    let host = HostProblem::random(p, 0xF4 ^ ((m as u64) << 32) ^ ((n as u64) << 16) ^ k as u64)
        .map_err(|e| BenchError::Problem(p.to_string(), e.to_string()))?;
    let mut dp = DeviceProblem::upload(gpu, &host, policy, legal)?;
    let mut verified: Vec<Candidate> = Vec::new();
    for c in legal {
        let compiled = match ctx.compiled.get(&c.name()) {
            Some(Ok(k)) => k,
            Some(Err(e)) => {
                out.failures.push(fail(c.name(), format!("compile error: {e}")));
                continue;
            }
            None => continue,
        };
        let cand = match Candidate::load(gpu, *c, compiled) {
            Ok(x) => x,
            Err(e) => {
                out.failures.push(fail(c.name(), format!("load: {e}")));
                continue;
            }
        };
        match verify(gpu, &host, &mut dp, &cand)? {
            Ok(()) => verified.push(cand),
            Err(why) => out.failures.push(fail(c.name(), why)),
        }
    }
    let bytes = p.min_bytes();
    let read_floor = floors.read_floor(policy, bytes)?;
    let roofline = (bytes as f64 / (floors.bandwidth * 1e3)).max(p.flops() / (floors.peak * 1e6));
    let mk_row = |imp: String, s: Summary, verified: &str| Row {
        shape: label.to_string(),
        n,
        k,
        m,
        a_type: spec.a_type.to_string(),
        implementation: imp,
        time: s,
        roofline_us: roofline,
        read_floor_us: read_floor,
        bytes,
        verified: verified.to_string(),
    };
    let mut refs: Vec<&Candidate> = verified.iter().collect();
    if spec.refine > 0 && refs.len() > spec.refine {
        let mut screened: Vec<(f64, &Candidate)> = Vec::new();
        for chunk in refs.chunks(64) {
            for (c, r) in chunk.iter().zip(time_candidates(gpu, &spec.screen_policy, &dp, chunk)) {
                match r {
                    Ok(s) => {
                        let sum = Summary::of(&s.us).expect("samples");
                        out.screen_rows.push(mk_row(c.config.name(), sum, "ok"));
                        screened.push((sum.median, *c));
                    }
                    Err(e) => out.failures.push(fail(c.config.name(), format!("timing: {e}"))),
                }
            }
        }
        screened.sort_by(|a, b| a.0.total_cmp(&b.0));
        refs = screened.into_iter().take(spec.refine).map(|(_, c)| c).collect();
    }
    for (c, r) in refs.iter().zip(time_candidates(gpu, policy, &dp, &refs)) {
        match r {
            Ok(s) => {
                out.rows.push(mk_row(c.config.name(), Summary::of(&s.us).expect("samples"), "ok"))
            }
            Err(e) => out.failures.push(fail(c.config.name(), format!("timing: {e}"))),
        }
    }
    if spec.peers {
        for (name, r) in time_peers(gpu, policy, &p)? {
            match r {
                Ok(s) => out.rows.push(mk_row(
                    name.to_string(),
                    Summary::of(&s.us).expect("samples"),
                    "-",
                )),
                Err(e) => out.failures.push(fail(name.to_string(), format!("peer: {e}"))),
            }
        }
    }
    if let Some(setup) = ctx.dequant_path {
        // The dequantize-then-cuBLAS path, verified like our kernels.
        let name = composite::NAME.to_string();
        let scratch = setup
            .as_ref()
            .map_err(|e| e.to_string())
            .and_then(|comp| comp.scratch(p).map(|s| (comp, s)).map_err(|e| e.to_string()));
        match scratch {
            Ok((comp, s)) => match comp.verify(&s, &host, &mut dp)? {
                Ok(()) => match comp.time(&s, policy, &dp) {
                    Ok(t) => {
                        out.rows.push(mk_row(name, Summary::of(&t.us).expect("samples"), "ok"))
                    }
                    Err(e) => out.failures.push(fail(name, format!("timing: {e}"))),
                },
                Err(why) => out.failures.push(fail(name, why)),
            },
            Err(e) => out.failures.push(fail(name, format!("setup: {e}"))),
        }
    }
    Ok(())
}

/// The run, in phases: floors; candidates per problem (model-ranked when capped); one parallel
/// compile of their union; then each (shape, M) measured in turn, its rows reported as it ends.
pub fn run(
    gpu: &Gpu,
    compiler: &Compiler,
    spec: &BenchSpec,
    progress: &dyn Fn(Event),
) -> Result<BenchOutput, BenchError> {
    progress(Event::Floors("launch floor, read bandwidth, tensor peak".into()));
    let mut floors = RunFloors::measure(gpu, compiler, &spec.policy)?;
    let model = crate::search::CostModel::new(crate::search::DeviceModel::from_device_info(
        gpu.info(),
        floors.bandwidth,
        floors.peak,
        floors.launch_floor,
    ));
    let mut plan = plan_candidates(spec, &model);
    let compiled = compile_union(compiler, &plan, progress);
    // With the peers: the dequantize-then-cuBLAS path, set up once per run (kernel load, cuBLAS
    // handle); a failure to set it up is recorded per problem.
    let dequant_path = spec.peers.then(|| Composite::new(gpu, compiler));
    let ctx = RunContext { gpu, spec, compiled: &compiled, dequant_path: dequant_path.as_ref() };
    let mut out = Collected::default();
    let total = spec.shapes.len() * spec.ms.len();
    let mut index = 0;
    for (label, n, k) in &spec.shapes {
        for &m in &spec.ms {
            index += 1;
            let legal: Vec<GemmConfig> = plan.remove(&(m, *n, *k)).unwrap_or_default();
            let before = (out.rows.len(), out.screen_rows.len(), out.failures.len());
            progress(Event::Problem {
                index,
                total,
                label: format!("{label} M={m}"),
                candidates: legal.len(),
            });
            measure_problem(&ctx, &mut floors, (label, *n, *k, m), &legal, &mut out)?;
            progress(Event::ProblemDone {
                rows: out.rows[before.0..].to_vec(),
                screen_rows: out.screen_rows[before.1..].to_vec(),
                failures: out.failures[before.2..].to_vec(),
            });
        }
    }
    Ok(BenchOutput {
        rows: out.rows,
        screen_rows: out.screen_rows,
        failures: out.failures,
        bandwidth_gbps: floors.bandwidth,
        launch_floor_us: floors.launch_floor,
        tensor_peak_tflops: floors.peak,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::AType;
    use crate::template::{self, Family, Pipeline};

    #[test]
    fn candidate_cap_is_shared_between_pipelines() {
        // The pipelines that can share a problem: the K-tail form takes only a K that none of the
        // others takes.
        let space: Vec<GemmConfig> = template::search_space(Family::Sm90, AType::Bf16)
            .into_iter()
            .filter(|c| c.pipeline != Pipeline::KTail)
            .collect();
        // A ranking that puts every cp.async configuration first, the others within the model's
        // tie band (1.5x).
        let mut ranked: Vec<(GemmConfig, f64)> = space
            .iter()
            .map(|c| (*c, if c.pipeline == Pipeline::CpAsync { 1.0 } else { 1.2 }))
            .collect();
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
        let top = top_per_pipeline(&ranked, 120);
        assert_eq!(top.len(), 120);
        for pl in Pipeline::ALL.into_iter().filter(|p| *p != Pipeline::KTail) {
            assert_eq!(top.iter().filter(|c| c.pipeline == pl).count(), 30, "{pl:?}");
        }
        // Within a pipeline the model order is kept.
        let cp: Vec<_> = top.iter().filter(|c| c.pipeline == Pipeline::CpAsync).collect();
        let want: Vec<_> = ranked
            .iter()
            .map(|r| &r.0)
            .filter(|c| c.pipeline == Pipeline::CpAsync)
            .take(30)
            .collect();
        assert_eq!(cp, want);
        // A small group leaves its unused share to the others.
        let few: Vec<(GemmConfig, f64)> = ranked
            .iter()
            .filter(|(c, _)| c.pipeline != Pipeline::WarpRing)
            .cloned()
            .chain(ranked.iter().filter(|(c, _)| c.pipeline == Pipeline::WarpRing).take(5).cloned())
            .collect();
        let top = top_per_pipeline(&few, 90);
        assert_eq!(top.len(), 90);
        assert_eq!(top.iter().filter(|c| c.pipeline == Pipeline::WarpRing).count(), 5);
        // A pipeline predicted more than 1.5x slower than the best (the streamed kernels at
        // M = 1024) gets no share.
        let far: Vec<(GemmConfig, f64)> = ranked
            .iter()
            .map(|(c, us)| (*c, if c.pipeline == Pipeline::CpAsync { *us } else { 2.0 }))
            .collect();
        let top = top_per_pipeline(&far, 90);
        assert_eq!(top.len(), 90);
        assert!(top.iter().all(|c| c.pipeline == Pipeline::CpAsync));
    }
}
