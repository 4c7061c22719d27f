//! A tuning campaign: keys from a shape set, candidates from a planner, evaluation in a
//! replaceable worker process, every result appended to the log as it arrives, resume from the
//! log, sharding, and selection at the end.

use super::log::{self, Outcome, Record, LOG_SCHEMA_VERSION};
use super::planner::PlannerFactory;
use super::race::{self, RaceOptions};
use super::worker::{Reply, Request, WorkerError, WorkerHandle};
use crate::bench::TimingPolicy;
use crate::compile::{Compiler, Precompiled};
use crate::gpu::DeviceInfo;
use crate::problem::{AType, GemmProblem};
use crate::table::Method;
use crate::table::TableKey;
use crate::template::{self, Family, GemmConfig};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use super::shard::Shard;

/// Everything a campaign needs.
pub struct TuneSpec {
    /// (N, K) weight shapes (deduplicated) and the token buckets to tune each at.
    pub shapes: Vec<(u32, u32)>,
    pub buckets: Vec<u32>,
    /// Activation type; `None` picks W4A16 where the family has it (SM90), else W4A4 (SM120).
    pub a_type: Option<AType>,
    pub policy: TimingPolicy,
    pub shard: Shard,
    /// Folder of the log; the file is `<sku>-<a_type>.jsonl` (see [`log_file_name`]).
    pub out_dir: PathBuf,
    /// The fp4tune executable to start workers from, and the device ordinal (of a one-GPU
    /// campaign: [`run`]; `gpus::run` takes the GPUs to use).
    pub exe: PathBuf,
    pub device: usize,
    /// A candidate (verification or its timing batch) that takes longer than this is a hang.
    pub candidate_timeout: Duration,
    pub planner: PlannerFactory,
    /// Candidates sent to the worker per request.
    pub batch: usize,
    /// Compile every configuration any key may need before measuring (worth it when the planner
    /// is exhaustive; budgeted planners let the worker compile each batch in parallel instead).
    pub precompile: bool,
    /// Measure the dequantize-then-cuBLAS path on every key with M >= this (after its fused
    /// candidates; `None`: never). Its record names the key's best fused kernel as the fallback.
    pub composite_min_m: Option<u32>,
    /// Racing instead of `planner` (see `tune::race`): keys in increasing M (decode first), each
    /// one's pool screened under `RaceSpec::screen`, its finalists under `policy`.
    pub race: Option<RaceSpec>,
    /// Wall-time budget of the whole campaign (racing only): keys that would overrun their share
    /// get smaller pools and are named in the result ([`TuneOutput::short_keys`]).
    pub time_budget: Option<Duration>,
    /// Kernels of the phase after the campaign (the grouped phase's first screens,
    /// `tune::moe::first_pools`), compiled into the cubin cache in the background after the
    /// racing pools while the GPUs measure.
    pub ahead: Vec<crate::template::KernelSource>,
}

/// How a racing campaign screens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RaceSpec {
    pub options: RaceOptions,
    pub screen: TimingPolicy,
}

impl Default for RaceSpec {
    fn default() -> Self {
        let options = RaceOptions::default();
        Self {
            screen: TimingPolicy { samples: options.screen_samples, ..TimingPolicy::screen() },
            options,
        }
    }
}

impl std::fmt::Debug for TuneSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TuneSpec")
            .field("shapes", &self.shapes)
            .field("buckets", &self.buckets)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    Log(#[from] log::LogError),
    #[error(transparent)]
    Compile(#[from] crate::compile::CompileError),
    #[error(transparent)]
    Manifest(#[from] super::shard::ManifestError),
    /// GPUs of different models among those asked for (their timings are not comparable).
    #[error("{0}")]
    MixedModels(String),
    /// Every GPU of a several-GPU campaign failed before its keys were done.
    #[error("{0}")]
    AllGpusFailed(String),
    #[error("{0}")]
    Other(String),
}

/// Progress events for the CLI.
#[derive(Debug, Clone)]
pub enum Event {
    Device(DeviceInfo),
    Compiling(usize),
    Key {
        index: usize,
        total: usize,
        key: TableKey,
        candidates: usize,
        done_before: usize,
    },
    Result {
        key: TableKey,
        config: GemmConfig,
        outcome: &'static str,
    },
    /// The dequantize-then-cuBLAS path on a key: its outcome label and median.
    Composite {
        key: TableKey,
        outcome: &'static str,
        median_us: Option<f64>,
    },
    WorkerRestart(String),
    /// A key is finished: candidates screened and timed under the full policy (in the log,
    /// earlier runs' included), the fastest full-policy result, the campaign's elapsed time, and
    /// whether the time budget cut its pool.
    KeyDone {
        index: usize,
        total: usize,
        key: TableKey,
        screened: usize,
        timed: usize,
        best: Option<(GemmConfig, f64)>,
        elapsed: Duration,
        short: bool,
    },
    /// Kernels of the racing pools compiled into the cubin cache in the background.
    Precompiled(Precompiled),
    /// The log being resumed ended in a torn record (a killed run's last line, no newline): it
    /// is not read, its candidate is measured again.
    TornTail(log::TornTail),
    /// The keys a GPU starts with (several-GPU campaigns, `gpus::run`): how many, and their
    /// predicted cost.
    Assigned {
        keys: usize,
        predicted_s: f64,
    },
    /// The GPU's worker could not be brought back: its in-flight candidate is recorded as
    /// failed and its `keys_left` go to the other GPUs.
    GpuFailed {
        reason: String,
        keys_left: usize,
    },
    /// The GPU takes over `keys` keys a failed GPU left.
    Adopted {
        keys: usize,
    },
}

#[derive(Debug)]
pub struct TuneOutput {
    pub device: DeviceInfo,
    pub log_path: PathBuf,
    pub bandwidth_gbps: f64,
    pub tensor_peak_tflops: f64,
    pub family: Family,
    pub template_hash: String,
    /// Records of this device in the log after the run (earlier runs' included).
    pub records: Vec<Record>,
    pub new_records: usize,
    pub wall: Duration,
    /// What the campaign spent, for the table's campaign block.
    pub stats: CampaignStats,
}

/// What a campaign spent (new measurements of this run; the log may hold earlier ones).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CampaignStats {
    /// Candidates evaluated under the screening policy, and under the full policy.
    pub screened: usize,
    pub timed: usize,
    /// The racing pools' kernels found in, and compiled into, the cubin cache.
    pub cache: Precompiled,
    /// The same for the kernels of refinement rounds (known only once screening ran).
    pub refined_cache: Precompiled,
    /// Keys whose pool the time budget cut.
    pub short_keys: Vec<TableKey>,
}

/// A file-name-safe identifier of a GPU model: "NVIDIA H200" -> "nvidia-h200".
pub fn sku_slug(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect();
    while s.contains("--") {
        s = s.replace("--", "-");
    }
    s.trim_matches('-').to_string()
}

/// The log file of a campaign on `device` for `a_type`.
pub fn log_file_name(device: &DeviceInfo, a_type: AType) -> String {
    format!("{}-{}.jsonl", sku_slug(&device.name), a_type)
}

/// The log file of `shard` of a campaign: [`log_file_name`] for the whole campaign,
/// `<sku>-<a_type>.shard-i-of-n.jsonl` for a shard (shards sharing a folder never collide).
pub fn shard_log_file_name(device: &DeviceInfo, a_type: AType, shard: Shard) -> String {
    shard.file_name(&format!("{}-{}", sku_slug(&device.name), a_type), "jsonl")
}

/// The dispatch table of `shard` of a campaign on `device`: `<sku>.ron`, or
/// `<sku>.shard-i-of-n.ron` for a shard (a partial table; `fp4tune merge` makes the whole one).
pub fn table_file_name(device: &DeviceInfo, shard: Shard) -> String {
    shard.file_name(&sku_slug(&device.name), "ron")
}

/// The random operands of a key (fused candidates and the composite path see the same ones).
fn operand_seed(key: &TableKey) -> u64 {
    0xF4F4 ^ ((key.m as u64) << 40) ^ ((key.n as u64) << 20) ^ key.k as u64
}

/// The outcome recorded for the candidate in flight when the worker stopped answering.
fn worker_failure(e: WorkerError) -> Outcome {
    match e {
        WorkerError::Timeout(seconds) => Outcome::Timeout { seconds },
        e => Outcome::LaunchError { reason: format!("worker died: {e}") },
    }
}

struct Session {
    worker: Option<WorkerHandle>,
    exe: PathBuf,
    device: usize,
}

/// A worker opened on device `device`, and what the device is.
fn hello(exe: &std::path::Path, device: usize) -> Result<(WorkerHandle, DeviceInfo), TuneError> {
    let mut w = WorkerHandle::spawn(exe, &[])?;
    w.send(&Request::Hello { device })?;
    match w.recv(Duration::from_secs(120))? {
        Reply::Device(d) => Ok((w, d)),
        Reply::Fatal(e) => Err(WorkerError::Fatal(e).into()),
        other => Err(TuneError::Other(format!("unexpected worker reply {other:?}"))),
    }
}

/// Ask for the floors (read bandwidth, tensor peak, launch floor), measured under `policy`.
fn send_floors(w: &mut WorkerHandle, policy: TimingPolicy) -> Result<(), TuneError> {
    Ok(w.send(&Request::Floors { policy })?)
}

/// The floors asked for by [`send_floors`].
fn recv_floors(w: &mut WorkerHandle) -> Result<(f64, f64, f64), TuneError> {
    match w.recv(Duration::from_secs(120))? {
        Reply::Floors { bandwidth_gbps, tensor_peak_tflops, launch_floor_us } => {
            Ok((bandwidth_gbps, tensor_peak_tflops, launch_floor_us))
        }
        Reply::Fatal(e) => Err(WorkerError::Fatal(e).into()),
        other => Err(TuneError::Other(format!("unexpected worker reply {other:?}"))),
    }
}

impl Session {
    fn worker(&mut self) -> Result<&mut WorkerHandle, TuneError> {
        if self.worker.is_none() {
            self.worker = Some(hello(&self.exe, self.device)?.0);
        }
        Ok(self.worker.as_mut().expect("just set"))
    }

    fn restart(&mut self) {
        if let Some(w) = self.worker.take() {
            w.kill();
        }
    }
}

/// The family of the device and the activation type to tune (the family's own when not given).
fn family_and_a_type(spec: &TuneSpec, info: &DeviceInfo) -> Result<(Family, AType), TuneError> {
    let family = crate::runtime::family_for(info).map_err(|e| TuneError::Other(e.to_string()))?;
    let a_type = spec.a_type.unwrap_or(template::family_a_type(family));
    Ok((family, a_type))
}

/// Every key of the campaign (all shards), sorted.
fn campaign_keys(spec: &TuneSpec, family: Family, a_type: AType) -> Vec<TableKey> {
    let mut keys = Vec::new();
    for &(n, k) in &spec.shapes {
        for &m in &spec.buckets {
            keys.push(TableKey::gemm(family, a_type, n, k, m));
        }
    }
    keys.sort();
    keys.dedup();
    keys
}

/// This shard's keys, in key order: the shard's bin of the campaign's keys dealt by predicted
/// cost over the shards (`assign::distribute`, the same on every shard).
fn shard_keys(
    spec: &TuneSpec,
    all: &[TableKey],
    space: &[GemmConfig],
    device_name: &str,
) -> Vec<TableKey> {
    if spec.shard.count <= 1 {
        return all.to_vec();
    }
    let model = super::assign::model_for(device_name);
    let costs =
        super::assign::key_costs(all, space, &model, spec.race.as_ref().map(|r| &r.options));
    super::assign::distribute(all, &costs, spec.shard.count as usize)
        .swap_remove(spec.shard.index as usize)
        .keys
}

/// The campaign's state while it measures: the worker session, the log writer, what the log
/// already holds, and what every record is stamped with.
struct Campaign<'a> {
    spec: &'a TuneSpec,
    compiler: &'a Compiler,
    progress: &'a dyn Fn(Event),
    session: Session,
    /// The log every GPU's campaign appends to.
    sink: &'a gpus::Sink,
    info: DeviceInfo,
    template_hash: String,
    context: log::Context,
    /// Records read from the log at start (resume).
    previous: Vec<Record>,
    /// Fused candidates already measured, per key.
    done: HashSet<(TableKey, GemmConfig)>,
    new_records: usize,
    stats: CampaignStats,
    /// Per weight shape (N, K): the previous bucket's fastest screened configurations.
    carry: std::collections::HashMap<(u32, u32), Vec<GemmConfig>>,
    /// Per weight shape: the previous bucket's M and its best full-policy time.
    previous_best: std::collections::HashMap<(u32, u32), (u32, f64)>,
    /// Per weight shape: the previous bucket's M and its dequantize-then-cuBLAS time.
    previous_composite: std::collections::HashMap<(u32, u32), (u32, f64)>,
}

impl Campaign<'_> {
    /// A measurement as a log record of this device, template version and context, appended.
    fn append(
        &mut self,
        key: &TableKey,
        method: Method,
        config: GemmConfig,
        outcome: Outcome,
    ) -> Result<(), TuneError> {
        let record = Record {
            schema_version: LOG_SCHEMA_VERSION,
            key: key.clone(),
            method,
            config,
            outcome,
            device: self.info.name.clone(),
            compute_capability: self.info.compute_capability,
            template_hash: self.template_hash.clone(),
            at: crate::bench::report::unix_now(),
            context: Some(self.context.clone()),
        };
        self.sink.append(record)?;
        self.new_records += 1;
        Ok(())
    }

    /// Append one fused outcome and mark its candidate done.
    fn record(
        &mut self,
        key: &TableKey,
        config: GemmConfig,
        outcome: Outcome,
        todo: &mut Vec<GemmConfig>,
    ) -> Result<(), TuneError> {
        self.append(key, Method::Fused, config, outcome)?;
        self.done.insert((key.clone(), config));
        todo.retain(|c| *c != config);
        Ok(())
    }

    /// Evaluate `configs` of `key` under `policy` in the worker, each outcome appended to the log
    /// as it arrives (a timing under the screening policy as [`Outcome::Screened`]). A worker
    /// that dies or hangs costs the candidate in flight (recorded as its failure), then comes
    /// back for the rest. Returns every outcome of this call.
    fn run_batch(
        &mut self,
        key: &TableKey,
        configs: &[GemmConfig],
        policy: &TimingPolicy,
        screening: bool,
    ) -> Result<Vec<(GemmConfig, Outcome)>, TuneError> {
        let (spec, progress) = (self.spec, self.progress);
        let problem = GemmProblem::new(key.m, key.n, key.k, key.a_type);
        let mut todo = configs.to_vec();
        let mut out = Vec::new();
        while !todo.is_empty() {
            let req = Request::Evaluate {
                problem,
                configs: todo.clone(),
                policy: *policy,
                seed: operand_seed(key),
            };
            let mut running: Option<GemmConfig> = None;
            let outcome_of_failure;
            self.session.worker()?.send(&req)?;
            loop {
                match self.session.worker()?.recv(spec.candidate_timeout) {
                    Ok(Reply::Running { config }) => running = Some(config),
                    Ok(Reply::Result { config, outcome }) => {
                        let outcome = if screening { outcome.screened() } else { outcome };
                        let label = outcome.label();
                        if screening {
                            self.stats.screened += 1;
                        } else {
                            self.stats.timed += 1;
                        }
                        self.record(key, config, outcome.clone(), &mut todo)?;
                        out.push((config, outcome));
                        progress(Event::Result { key: key.clone(), config, outcome: label });
                    }
                    Ok(Reply::Done) => {
                        outcome_of_failure = None;
                        break;
                    }
                    Ok(Reply::Fatal(e)) => {
                        outcome_of_failure = Some(Outcome::LaunchError { reason: e });
                        break;
                    }
                    Ok(Reply::Device(_) | Reply::Devices(_) | Reply::Floors { .. }) => {}
                    Err(e) => {
                        outcome_of_failure = Some(worker_failure(e));
                        break;
                    }
                }
            }
            match outcome_of_failure {
                // Anything the worker did not answer for (should not happen) is dropped from
                // this key rather than retried forever.
                None => todo.clear(),
                Some(outcome) => {
                    progress(Event::WorkerRestart(format!("{outcome:?}")));
                    self.session.restart();
                    // Blame the candidate in flight; the rest of the batch is retried.
                    let blamed =
                        running.filter(|c| todo.contains(c)).or_else(|| todo.first().copied());
                    if let Some(c) = blamed {
                        self.record(key, c, outcome.clone(), &mut todo)?;
                        out.push((c, outcome));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The legal configurations of `key` in `space`.
    fn legal(space: &[GemmConfig], key: &TableKey) -> Vec<GemmConfig> {
        let problem = GemmProblem::new(key.m, key.n, key.k, key.a_type);
        space.iter().copied().filter(|c| c.check_problem(&problem).is_ok()).collect()
    }

    /// Records of `key` this run may reuse (same templates, fused).
    fn previous_of(&self, key: &TableKey) -> Vec<(GemmConfig, Outcome)> {
        self.previous
            .iter()
            .filter(|r| {
                r.key == *key && r.template_hash == self.template_hash && r.method.is_fused()
            })
            .map(|r| (r.config, r.outcome.clone()))
            .collect()
    }

    /// One key: its planner's batches, results already in the log told to the planner without
    /// re-measuring, the rest evaluated by the worker.
    fn tune_key(
        &mut self,
        space: &[GemmConfig],
        index: usize,
        total: usize,
        key: &TableKey,
    ) -> Result<(), TuneError> {
        let (spec, progress) = (self.spec, self.progress);
        let legal = Self::legal(space, key);
        let done_before = legal.iter().filter(|c| self.done.contains(&(key.clone(), **c))).count();
        progress(Event::Key {
            index,
            total,
            key: key.clone(),
            candidates: legal.len(),
            done_before,
        });
        let mut planner = (spec.planner)(key, legal, &self.info, &self.context);
        let known: std::collections::HashMap<GemmConfig, Option<f64>> =
            self.previous_of(key).into_iter().map(|(c, o)| (c, o.median_us())).collect();
        loop {
            let batch = planner.next_batch(spec.batch);
            if batch.is_empty() {
                return Ok(());
            }
            let mut todo = Vec::new();
            for c in batch {
                match known.get(&c) {
                    Some(t) => planner.observe(&c, *t),
                    None if self.done.contains(&(key.clone(), c)) => planner.observe(&c, None),
                    None => todo.push(c),
                }
            }
            let asked = todo.clone();
            for (c, outcome) in self.run_batch(key, &todo, &spec.policy, false)? {
                planner.observe(&c, outcome.median_us());
            }
            // Candidates the worker never answered for.
            for c in asked.iter().filter(|c| !self.done.contains(&(key.clone(), **c))) {
                planner.observe(c, None);
            }
        }
    }

    /// The dequantize-then-cuBLAS path on the keys with M >= `min_m` that have a fused winner
    /// and no composite record yet, each with that winner as its fallback.
    fn composite_pass(&mut self, keys: &[TableKey], min_m: u32) -> Result<(), TuneError> {
        // What the log held at the start and what every GPU appended since.
        let records: Vec<Record> = self
            .previous
            .iter()
            .cloned()
            .chain(self.sink.records())
            .filter(|r| r.template_hash == self.template_hash)
            .collect();
        let fused = super::select::timed_table(&records);
        let measured: HashSet<TableKey> =
            records.iter().filter(|r| !r.method.is_fused()).map(|r| r.key.clone()).collect();
        for key in keys.iter().filter(|k| k.m >= min_m && k.k % 16 == 0 && !measured.contains(k)) {
            // The fallback: the key's fastest fused kernel (no fused kernel ran: nothing to fall
            // back to, and nothing to compare with).
            let Some(fallback) = fused.get(key).and_then(|per| {
                per.iter().min_by(|a, b| a.1.median.total_cmp(&b.1.median)).map(|(c, _)| *c)
            }) else {
                continue;
            };
            self.composite_key(key, fallback)?;
        }
        Ok(())
    }

    /// The dequantize-then-cuBLAS path on one key, `fallback` (its fastest fused kernel) named
    /// as the entry's fallback; its full-policy median when it was timed.
    fn composite_key(
        &mut self,
        key: &TableKey,
        fallback: GemmConfig,
    ) -> Result<Option<f64>, TuneError> {
        let (spec, progress) = (self.spec, self.progress);
        let problem = GemmProblem::new(key.m, key.n, key.k, key.a_type);
        self.session.worker()?.send(&Request::Composite {
            problem,
            fallback,
            policy: spec.policy,
            seed: operand_seed(key),
        })?;
        let mut outcome = None;
        let mut failure = None;
        loop {
            match self.session.worker()?.recv(spec.candidate_timeout) {
                Ok(Reply::Result { outcome: o, .. }) => outcome = Some(o),
                Ok(Reply::Done) => break,
                Ok(Reply::Fatal(e)) => {
                    failure = Some(Outcome::LaunchError { reason: e });
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    failure = Some(worker_failure(e));
                    break;
                }
            }
        }
        if let Some(f) = &failure {
            progress(Event::WorkerRestart(format!("{f:?}")));
            self.session.restart();
        }
        let Some(outcome) = failure.or(outcome) else { return Ok(None) };
        let median_us = outcome.median_us();
        progress(Event::Composite { key: key.clone(), outcome: outcome.label(), median_us });
        self.append(key, Method::DequantCublasBf16, fallback, outcome)?;
        Ok(median_us)
    }
}

/// The cost model racing ranks pools with: the device's data sheet when it has one (what the
/// replay of its logs uses), else the driver's facts and the floors measured at the start.
fn race_model_for(info: &DeviceInfo, ctx: &log::Context) -> crate::search::CostModel {
    use crate::search::{CostModel, DeviceModel};
    CostModel::new(DeviceModel::data_sheet(&info.name).unwrap_or_else(|| {
        DeviceModel::from_device_info(
            info,
            ctx.bandwidth_gbps,
            ctx.tensor_peak_tflops,
            ctx.launch_floor_us,
        )
    }))
}

/// A campaign on the one GPU `spec.device`: [`gpus::run`] with that GPU (see there for the
/// phases).
pub fn run(
    spec: &TuneSpec,
    compiler: &Compiler,
    progress: &dyn Fn(Event),
) -> Result<TuneOutput, TuneError> {
    gpus::run(spec, &gpus::GpuSelection::List(vec![spec.device]), compiler, &|_, e| progress(e))
        .map(|o| o.output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::planner::Planner;

    #[test]
    fn sku_slugs() {
        assert_eq!(sku_slug("NVIDIA H200"), "nvidia-h200");
        assert_eq!(
            sku_slug("NVIDIA RTX PRO 6000 Blackwell Server Edition"),
            "nvidia-rtx-pro-6000-blackwell-server-edition"
        );
    }

    /// Over all shards every key of the campaign is tuned exactly once, and a shard's keys are
    /// the same whoever computes them.
    #[test]
    fn shards_cover_every_key_exactly_once() {
        let space = template::search_space(Family::Sm90, AType::Bf16);
        let mk = |shard: Shard| TuneSpec {
            shapes: vec![(512, 6144), (6144, 256), (6144, 2048), (4096, 6144)],
            buckets: vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
            a_type: Some(AType::Bf16),
            policy: TimingPolicy::quick(),
            shard,
            out_dir: PathBuf::new(),
            exe: PathBuf::new(),
            device: 0,
            candidate_timeout: Duration::from_secs(1),
            planner: Box::new(|_, legal, _, _| Planner::exhaustive(legal)),
            batch: 1,
            precompile: false,
            composite_min_m: None,
            race: Some(RaceSpec::default()),
            time_budget: None,
            ahead: Vec::new(),
        };
        let all = campaign_keys(&mk(Shard::all()), Family::Sm90, AType::Bf16);
        assert_eq!(all.len(), 56);
        assert_eq!(shard_keys(&mk(Shard::all()), &all, &space, "NVIDIA H200"), all);
        for count in [2, 3, 8] {
            let mut seen: Vec<TableKey> = Vec::new();
            for index in 0..count {
                let spec = mk(Shard { index, count });
                let mine = shard_keys(&spec, &all, &space, "NVIDIA H200");
                assert_eq!(mine, shard_keys(&spec, &all, &space, "NVIDIA H200"));
                assert!(!mine.is_empty(), "{index}/{count}");
                seen.extend(mine);
            }
            seen.sort();
            assert_eq!(seen, all, "{count} shards");
        }
    }
}

/// Racing's side of the campaign (its keys in order, one key's rounds).
#[path = "race_run.rs"]
mod racing;

/// The campaign's engine: one worker per GPU, one log, keys dealt by predicted cost.
#[path = "gpus.rs"]
pub mod gpus;

#[cfg(all(test, unix))]
#[path = "run_tests.rs"]
mod fake_worker_tests;
