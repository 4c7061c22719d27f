//! The campaign's engine, on one GPU or several of one host (`tune --gpus all|0,1,..`): one
//! worker process per GPU (each opened on its own device ordinal, replaced when a candidate
//! poisons its context), the keys dealt over the GPUs by predicted cost with each weight shape's
//! bucket chain kept on one GPU where it fits (`tune::assign`), one log and one table.
//!
//! The log: one [`Sink`] in the parent owns the log's [`log::Writer`] (and its lock file); every
//! GPU's campaign runs on a thread of its own and appends through it, one whole record per write
//! under a mutex, so the log is the same JSON-lines file a one-GPU run writes, its records
//! interleaved between GPUs. Resume after a kill reads that one log, as on one GPU: the keys are
//! dealt again the same way (deterministic) and each GPU re-walks its keys, measuring only what
//! the log lacks.
//!
//! Timings are compared only between GPUs of one model: GPUs of several models are refused. A
//! GPU whose worker cannot be brought back loses only the candidate in flight (recorded as
//! failed, as on one GPU); the keys it had left go to the GPUs still running, which take the
//! records it wrote for them into account. When every GPU failed the campaign is an error.

use super::*;
use std::collections::VecDeque;
use std::sync::{mpsc, Condvar, Mutex};

/// Which GPUs a campaign uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelection {
    /// Every GPU the driver reports.
    All,
    /// These device ordinals.
    List(Vec<usize>),
}

impl GpuSelection {
    /// `all`, or device ordinals separated by commas (`0,1,3`).
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.trim() == "all" {
            return Ok(Self::All);
        }
        let mut v: Vec<usize> = Vec::new();
        for part in s.split(',') {
            let o: usize = part.trim().parse().map_err(|_| {
                format!("--gpus `{s}`: `{part}` is not a device ordinal (expected all or e.g. 0,1)")
            })?;
            if v.contains(&o) {
                return Err(format!("--gpus `{s}`: GPU {o} is named twice"));
            }
            v.push(o);
        }
        Ok(Self::List(v))
    }
}

/// What one GPU did in a campaign.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRun {
    pub ordinal: usize,
    /// Keys it finished (taken over from a failed GPU included).
    pub keys_done: usize,
    /// The predicted cost of the keys it started with, seconds.
    pub predicted_s: f64,
    /// Why its worker could not be brought back, if it could not.
    pub failure: Option<String>,
}

/// A campaign's output and what each GPU did.
#[derive(Debug)]
pub struct GpusOutput {
    pub output: TuneOutput,
    pub gpus: Vec<GpuRun>,
}

/// The campaign's log: the one writer, shared by every GPU's campaign, and the records appended
/// through it in this run.
pub(super) struct Sink {
    inner: Mutex<(log::Writer, Vec<Record>)>,
}

impl Sink {
    fn lock(&self) -> std::sync::MutexGuard<'_, (log::Writer, Vec<Record>)> {
        // A GPU thread that panicked left whole records behind (one write each).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Append one record (one write of a whole line).
    pub(super) fn append(&self, r: Record) -> Result<(), log::LogError> {
        let mut g = self.lock();
        g.0.append(&r)?;
        g.1.push(r);
        Ok(())
    }

    /// The records appended in this run, by every GPU.
    pub(super) fn records(&self) -> Vec<Record> {
        self.lock().1.clone()
    }

    /// The fastest fused kernel of `key` timed under the full policy in this run with templates
    /// `hash` (read under the lock, nothing cloned but the answer).
    pub(super) fn best_timed(&self, key: &TableKey, hash: &str) -> Option<(GemmConfig, f64)> {
        best_timed(self.lock().1.iter(), key, hash)
    }
}

/// The fastest fused kernel of `key` timed under the full policy among `records` with templates
/// `hash`.
fn best_timed<'a>(
    records: impl Iterator<Item = &'a Record>,
    key: &TableKey,
    hash: &str,
) -> Option<(GemmConfig, f64)> {
    records
        .filter(|r| &r.key == key && r.method.is_fused() && r.template_hash == hash)
        .filter_map(|r| r.outcome.median_us().map(|us| (r.config, us)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// The keys waiting for each GPU, those a failed GPU left, and how many GPUs still have work
/// (an idle GPU waits while another may still fail and leave keys).
struct Queues {
    own: Vec<VecDeque<(TableKey, bool)>>,
    orphans: VecDeque<TableKey>,
    busy: usize,
}

/// A GPU's next key: whether a failed GPU left it, how many keys the GPU has after it, and how
/// many keys it took over from failed GPUs just now.
struct Next {
    key: TableKey,
    adopted: bool,
    left: usize,
    taken_over: usize,
}

struct Dispatch {
    queues: Mutex<Queues>,
    wake: Condvar,
}

impl Dispatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// GPU `g`'s next key, or `None` when the campaign has nothing left for it. `busy` tracks
    /// whether `g` counts as having work.
    fn next(&self, g: usize, busy: &mut bool) -> Option<Next> {
        let mut q = self.lock();
        loop {
            if let Some((key, adopted)) = q.own[g].pop_front() {
                let left = q.own[g].len();
                return Some(Next { key, adopted, left, taken_over: 0 });
            }
            if let Some(first) = q.orphans.pop_front() {
                // The left keys of one weight shape, as a run of its chain.
                let shape = (first.n, first.k);
                let (mine, rest): (VecDeque<TableKey>, VecDeque<TableKey>) =
                    q.orphans.drain(..).partition(|k| (k.n, k.k) == shape);
                q.orphans = rest;
                q.own[g].extend(mine.into_iter().map(|k| (k, true)));
                if !*busy {
                    *busy = true;
                    q.busy += 1;
                }
                let left = q.own[g].len();
                return Some(Next { key: first, adopted: true, left, taken_over: left + 1 });
            }
            if *busy {
                *busy = false;
                q.busy -= 1;
                self.wake.notify_all();
            }
            if q.busy == 0 {
                return None;
            }
            q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Keys still queued for GPU `g` (only `g`'s own thread changes that queue).
    fn own_left(&self, g: usize) -> usize {
        self.lock().own[g].len()
    }

    /// GPU `g` failed on `current`: it and the keys `g` had left go to the others.
    fn fail(&self, g: usize, current: Option<TableKey>, busy: &mut bool) -> usize {
        let mut q = self.lock();
        let left: Vec<TableKey> =
            current.into_iter().chain(q.own[g].drain(..).map(|(k, _)| k)).collect();
        let n = left.len();
        q.orphans.extend(left);
        if *busy {
            *busy = false;
            q.busy -= 1;
        }
        self.wake.notify_all();
        n
    }
}

/// What one GPU's thread hands back.
struct GpuResult {
    stats: CampaignStats,
    new_records: usize,
    keys_done: usize,
    failure: Option<TuneError>,
}

/// The device ordinals of `sel` (`All`: as many as a first worker reports).
fn ordinals(spec: &TuneSpec, sel: &GpuSelection) -> Result<Vec<usize>, TuneError> {
    match sel {
        GpuSelection::List(v) if v.is_empty() => {
            Err(TuneError::Other("--gpus: no GPU named".into()))
        }
        GpuSelection::List(v) => Ok(v.clone()),
        GpuSelection::All => {
            let mut w = WorkerHandle::spawn(&spec.exe, &[])?;
            w.send(&Request::Devices)?;
            match w.recv(Duration::from_secs(120))? {
                Reply::Devices(0) => {
                    Err(TuneError::Other("--gpus all: the driver reports no GPU".into()))
                }
                Reply::Devices(n) => Ok((0..n).collect()),
                Reply::Fatal(e) => Err(WorkerError::Fatal(e).into()),
                other => Err(TuneError::Other(format!("unexpected worker reply {other:?}"))),
            }
        }
    }
}

/// One line naming every GPU's model when they are not all the same model.
fn refuse_mixed(infos: &[(usize, DeviceInfo)]) -> Result<(), TuneError> {
    let id = |d: &DeviceInfo| {
        format!("{} (cc {}.{})", d.name, d.compute_capability.0, d.compute_capability.1)
    };
    let mut models: Vec<(String, Vec<usize>)> = Vec::new();
    for (o, d) in infos {
        match models.iter_mut().find(|m| m.0 == id(d)) {
            Some(m) => m.1.push(*o),
            None => models.push((id(d), vec![*o])),
        }
    }
    if models.len() <= 1 {
        return Ok(());
    }
    let list = |v: &[usize]| v.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(",");
    let named: Vec<String> =
        models.iter().map(|(m, v)| format!("GPU {} is {m}", list(v))).collect();
    Err(TuneError::MixedModels(format!(
        "--gpus: GPUs of different models ({}): timings are compared only within one model; \
         tune one model at a time, e.g. --gpus {}",
        named.join(", "),
        list(&models[0].1)
    )))
}

/// The campaign on the GPUs of `sel`, in phases: a worker per GPU (its device, refused when the
/// models differ, and its floors); the family and the space; resume from the log; this shard's
/// keys (`spec.shard`), dealt over the GPUs by predicted cost; an optional parallel precompile
/// (racing: the pools compiled in the background while the GPUs measure); every GPU's keys on
/// its own thread (racing in increasing M, or the planner), a failed GPU's keys taken over by
/// the others; the composite pass on large-M keys (planner campaigns); the log's records of this
/// run's templates and activation type. `progress` gets every event with the GPU it is about,
/// on the calling thread.
pub fn run(
    spec: &TuneSpec,
    sel: &GpuSelection,
    compiler: &Compiler,
    progress: &dyn Fn(usize, Event),
) -> Result<GpusOutput, TuneError> {
    let t0 = Instant::now();
    let ordinals = ordinals(spec, sel)?;
    let mut workers = Vec::new();
    let mut infos = Vec::new();
    for &o in &ordinals {
        let (w, info) = hello(&spec.exe, o)?;
        workers.push(w);
        infos.push((o, info));
    }
    refuse_mixed(&infos)?;
    for (o, info) in &infos {
        progress(*o, Event::Device(info.clone()));
    }
    let first = ordinals[0];
    let info = infos[0].1.clone();
    // a GPU of no kernel family is refused before anything is measured on it
    let (family, a_type) = family_and_a_type(spec, &info)?;
    // Floors on every GPU at once (each worker measures its own).
    for w in workers.iter_mut() {
        send_floors(w, spec.policy)?;
    }
    let mut floors = Vec::new();
    for w in workers.iter_mut() {
        floors.push(recv_floors(w)?);
    }
    let log_path = spec.out_dir.join(shard_log_file_name(&info, a_type, spec.shard));
    let template_hash = template::family_template_hash(family);
    let contexts: Vec<log::Context> = floors
        .iter()
        .map(|&(bandwidth_gbps, tensor_peak_tflops, launch_floor_us)| log::Context {
            sm_count: info.sm_count,
            driver_version: info.driver_version,
            nvrtc_version: compiler.nvrtc_version(),
            nvrtc_build: Some(compiler.nvrtc_build().to_string()),
            bandwidth_gbps,
            tensor_peak_tflops,
            launch_floor_us,
            timing_policy: spec.policy.describe(),
        })
        .collect();
    let space = template::search_space(family, a_type);
    if space.is_empty() {
        return Err(TuneError::Other(format!("the {family} family has no {} variants", a_type)));
    }

    // Earlier records: must be from this GPU model and these templates. A torn last line is
    // reported, and cut off when the writer opens the log.
    let resumed = log::read_log_or_empty(&log_path)?;
    if let Some(torn) = resumed.torn_tail {
        progress(first, Event::TornTail(torn));
    }
    let previous = resumed.records;
    if let Some(r) = previous
        .iter()
        .find(|r| r.device != info.name || r.compute_capability != info.compute_capability)
    {
        return Err(TuneError::Other(format!(
            "{}: has records from {} (cc {}.{}); this GPU is {}: use another --log",
            log_path.display(),
            r.device,
            r.compute_capability.0,
            r.compute_capability.1,
            info.name
        )));
    }
    // Fused candidates already measured (composite records name a fallback config, not a run of it).
    let done: HashSet<(TableKey, GemmConfig)> = previous
        .iter()
        .filter(|r| r.template_hash == template_hash && r.method.is_fused())
        .map(|r| (r.key.clone(), r.config))
        .collect();

    let all_keys = campaign_keys(spec, family, a_type);
    let mut keys = shard_keys(spec, &all_keys, &space, &info.name);
    if spec.race.is_some() {
        // Decode first: a time budget cuts the large-M keys, and every shape's buckets come in
        // increasing M (each pool starts from the previous bucket's fastest).
        keys.sort_by(|a, b| a.m.cmp(&b.m).then(a.cmp(b)));
    }
    let manifest_path = crate::tune::shard::Manifest::path_of_log(&log_path);
    let mut manifest = (spec.shard.count > 1).then(|| crate::tune::shard::Manifest {
        schema_version: crate::tune::shard::MANIFEST_SCHEMA_VERSION,
        shard: spec.shard,
        device: info.name.clone(),
        compute_capability: info.compute_capability,
        template_hash: template_hash.clone(),
        campaign_keys: all_keys.clone(),
        keys: keys.clone(),
        finished: false,
        table: table_file_name(&info, spec.shard),
    });
    if let Some(m) = &manifest {
        m.save(&manifest_path)?;
    }
    // The keys over the GPUs, by predicted cost.
    let model = crate::tune::assign::model_for(&info.name);
    let costs = crate::tune::assign::key_costs(
        &keys,
        &space,
        &model,
        spec.race.as_ref().map(|r| &r.options),
    );
    let bins = crate::tune::assign::distribute(&keys, &costs, ordinals.len());
    for (o, b) in ordinals.iter().zip(&bins) {
        progress(*o, Event::Assigned { keys: b.keys.len(), predicted_s: b.cost_us * 1e-6 });
    }
    // What the campaign found in the cubin cache and compiled up front: everything any key may
    // need (exhaustive), or the racing pools (below); other strategies' workers compile the
    // candidates as they pick them, which nothing counts.
    let mut precompiled = Precompiled::default();
    if spec.precompile {
        // Everything any key may need, in parallel, into the disk cache (workers load from it).
        let needed: Vec<GemmConfig> = space
            .iter()
            .copied()
            .filter(|c| {
                keys.iter()
                    .any(|k| c.check_problem(&GemmProblem::new(k.m, k.n, k.k, k.a_type)).is_ok())
            })
            .collect();
        progress(first, Event::Compiling(needed.len()));
        let sources: Vec<_> = needed.iter().filter_map(|c| c.render().ok()).collect();
        precompiled = compiler.precompile(&sources);
    }
    // Racing: the pools without their carried part are known now, compiled into the cubin
    // cache in key order while the GPUs measure (a worker loads what is there, compiles the
    // rest itself). Whether the cache is cold or warm is decided before anything compiles.
    let distinct: Vec<crate::template::KernelSource> = match &spec.race {
        None => Vec::new(),
        Some(race_spec) => {
            let model = race_model_for(&info, &contexts[0]);
            let mut seen = HashSet::new();
            keys.iter()
                .flat_map(|k| {
                    let legal = Campaign::legal(&space, k);
                    let p = GemmProblem::new(k.m, k.n, k.k, k.a_type);
                    let anchors = crate::tune::race_replay::anchors(k);
                    race::pool(&legal, &p, &model, &anchors, &[], None, &race_spec.options)
                })
                .filter_map(|c| c.render().ok())
                .filter(|s| seen.insert(s.kernel_name.clone()))
                .collect()
        }
    };
    if !distinct.is_empty() {
        let cached = compiler.count_cached(&distinct);
        precompiled = Precompiled { cached, compiled: distinct.len() - cached.min(distinct.len()) };
    }
    // then, racing (other strategies' workers compile on demand: no competing with them), the
    // next phase's kernels (not counted: the phase reports its own); those not reached when the
    // campaign ends are compiled by their phase
    let mut background = distinct;
    if spec.race.is_some() {
        // a kernel listed twice is compiled once (`Compiler::precompile_until`, the disk cache)
        background.extend(spec.ahead.iter().cloned());
    }

    let sink = Sink { inner: Mutex::new((log::Writer::open(&log_path)?, Vec::new())) };
    let dispatch = Dispatch {
        queues: Mutex::new(Queues {
            own: bins.iter().map(|b| b.keys.iter().map(|k| (k.clone(), false)).collect()).collect(),
            orphans: VecDeque::new(),
            busy: ordinals.len(),
        }),
        wake: Condvar::new(),
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<(usize, Event)>();
    let results: Vec<GpuResult> = std::thread::scope(|scope| {
        if !background.is_empty() {
            let (stop, background) = (&stop, &background);
            scope.spawn(move || {
                // Near key order: a chunk of one kernel per core at a time (a refinement round's
                // compile on the same cores waits for one chunk at most); each kernel checks
                // `stop`, so a finished campaign stops it after the kernels being compiled.
                for chunk in background.chunks(rayon::current_num_threads()) {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let _ = compiler.precompile_until(chunk, stop);
                }
            });
        }
        // Set when the GPUs are done, or when one of their threads panicked (unwinding).
        let _stop = StopOnDrop(&stop);
        let handles: Vec<_> = workers
            .into_iter()
            .enumerate()
            .map(|(g, worker)| {
                let tx = tx.clone();
                let ordinal = ordinals[g];
                let (info, context) = (infos[g].1.clone(), contexts[g].clone());
                let (previous, done) = (previous.clone(), done.clone());
                let (space, sink, dispatch, template_hash) =
                    (&space, &sink, &dispatch, template_hash.clone());
                scope.spawn(move || {
                    let send = move |e: Event| {
                        let _ = tx.send((ordinal, e));
                    };
                    let campaign = Campaign {
                        spec,
                        compiler,
                        progress: &send,
                        session: Session {
                            worker: Some(worker),
                            exe: spec.exe.clone(),
                            device: ordinal,
                        },
                        sink,
                        info,
                        template_hash,
                        context,
                        previous,
                        done,
                        new_records: 0,
                        stats: CampaignStats::default(),
                        carry: std::collections::HashMap::new(),
                        previous_best: std::collections::HashMap::new(),
                        previous_composite: std::collections::HashMap::new(),
                    };
                    gpu_thread(campaign, g, space, dispatch, t0)
                })
            })
            .collect();
        drop(tx);
        // Every GPU's events, on the calling thread, until the last GPU is done.
        for (o, e) in rx {
            progress(o, e);
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Vec<GpuResult>>()
    });
    let mut stats = CampaignStats { cache: precompiled, ..CampaignStats::default() };
    let mut new_records = 0;
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    for ((r, o), b) in results.into_iter().zip(&ordinals).zip(&bins) {
        stats.screened += r.stats.screened;
        stats.timed += r.stats.timed;
        stats.refined_cache += r.stats.refined_cache;
        stats.short_keys.extend(r.stats.short_keys);
        new_records += r.new_records;
        runs.push(GpuRun {
            ordinal: *o,
            keys_done: r.keys_done,
            predicted_s: b.cost_us * 1e-6,
            failure: r.failure.as_ref().map(|e| e.to_string()),
        });
        if let Some(e) = r.failure {
            failures.push((*o, e));
        }
    }
    let left = dispatch.lock().orphans.len();
    if left > 0 || failures.len() == ordinals.len() {
        if ordinals.len() == 1 {
            if let Some((_, e)) = failures.pop() {
                return Err(e);
            }
        }
        let why: Vec<String> = failures.iter().map(|(o, e)| format!("GPU {o}: {e}")).collect();
        return Err(TuneError::AllGpusFailed(format!(
            "every GPU failed with {left} keys left ({}); the log {} keeps what was measured: \
             run again to resume",
            why.join("; "),
            log_path.display()
        )));
    }
    if spec.race.is_some() {
        progress(first, Event::Precompiled(stats.cache));
    }
    drop(sink);
    if let Some(m) = manifest.as_mut() {
        m.finished = true;
        m.save(&manifest_path)?;
    }
    let records: Vec<Record> = log::read_log_or_empty(&log_path)?
        .records
        .into_iter()
        .filter(|r| r.template_hash == template_hash && r.key.a_type == a_type)
        .collect();
    let (bandwidth_gbps, tensor_peak_tflops, _) = floors[0];
    Ok(GpusOutput {
        output: TuneOutput {
            device: info,
            log_path,
            bandwidth_gbps,
            tensor_peak_tflops,
            family,
            template_hash,
            records,
            new_records,
            wall: t0.elapsed(),
            stats,
        },
        gpus: runs,
    })
}

/// Sets its flag when dropped: on every way out of the scope that holds it, a panic included.
struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One GPU's share of the campaign: its keys, then keys failed GPUs left, until none is left
/// anywhere; a worker that cannot be brought back hands its keys on.
fn gpu_thread(
    mut c: Campaign<'_>,
    g: usize,
    space: &[GemmConfig],
    dispatch: &Dispatch,
    t0: Instant,
) -> GpuResult {
    let (spec, progress) = (c.spec, c.progress);
    let model = race_model_for(&c.info, &c.context);
    let mut busy = true;
    let mut finished: Vec<TableKey> = Vec::new();
    let mut failure = None;
    while let Some(Next { key, adopted, left, taken_over }) = dispatch.next(g, &mut busy) {
        if taken_over > 0 {
            progress(Event::Adopted { keys: taken_over });
        }
        if adopted {
            // What the failed GPU measured on this key counts as measured here too.
            let theirs: Vec<Record> =
                c.sink.records().into_iter().filter(|r| r.key == key).collect();
            for r in theirs {
                if r.template_hash == c.template_hash && r.method.is_fused() {
                    c.done.insert((r.key.clone(), r.config));
                }
                c.previous.push(r);
            }
        }
        let (index, total) = (finished.len(), finished.len() + 1 + left);
        let r = match &spec.race {
            Some(rs) => c.race_one(space, &model, rs, &key, (index, total, left + 1), t0),
            None => c.tune_key(space, index, total, &key).map(|()| {
                // The key's fastest fused kernel timed under the full policy so far (this run's
                // records and the log's).
                let best = [
                    c.sink.best_timed(&key, &c.template_hash),
                    best_timed(c.previous.iter(), &key, &c.template_hash),
                ]
                .into_iter()
                .flatten()
                .min_by(|a, b| a.1.total_cmp(&b.1));
                progress(Event::KeyDone {
                    index,
                    total,
                    key: key.clone(),
                    screened: 0,
                    timed: c.done.iter().filter(|(k, _)| *k == key).count(),
                    best,
                    elapsed: t0.elapsed(),
                    short: false,
                })
            }),
        };
        match r {
            Ok(()) => finished.push(key),
            Err(e) => {
                // Said before the keys are handed over, so no adoption is reported before the
                // failure it follows (only this GPU's thread changes its own queue).
                let keys_left = dispatch.own_left(g) + 1;
                progress(Event::GpuFailed { reason: e.to_string(), keys_left });
                let handed = dispatch.fail(g, Some(key), &mut busy);
                debug_assert_eq!(handed, keys_left);
                failure = Some(e);
                break;
            }
        }
    }
    if failure.is_none() {
        if let (Some(min_m), None) = (spec.composite_min_m, &spec.race) {
            if let Err(e) = c.composite_pass(&finished, min_m) {
                progress(Event::GpuFailed { reason: e.to_string(), keys_left: 0 });
                failure = Some(e);
            }
        }
    }
    c.session.restart();
    GpuResult { stats: c.stats, new_records: c.new_records, keys_done: finished.len(), failure }
}

#[cfg(all(test, unix))]
#[path = "gpus_tests.rs"]
mod fake_gpus_tests;
