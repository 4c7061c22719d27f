//! `fp4tune tune`: a tuning campaign on this GPU (or several, or a shard of a cluster's), with
//! progress bars, and its dispatch table.

use super::ATypeArg;
use anyhow::{bail, Context, Result};
use fp4tune::shapes::ShapeFile;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct TuneArgs {
    /// Shape file (default: the embedded GLM-5 file).
    #[arg(long)]
    pub shapes: Option<PathBuf>,
    /// Shape set of the file (default: tp8).
    #[arg(long, visible_alias = "sets", default_value = fp4tune::shapes::DEFAULT_SET)]
    pub set: String,
    /// Only shapes whose name contains one of these (e.g. routed), comma separated.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Largest token bucket to tune (buckets come from the shape set).
    #[arg(long, default_value_t = 8192)]
    pub max_m: u32,
    /// Tune only these token buckets (comma separated) instead of the shape set's.
    #[arg(long, value_delimiter = ',')]
    pub buckets: Vec<u32>,
    /// Activation type (default: w4a16 on SM90, w4a4 on SM120, whose family is W4A4 only).
    #[arg(long, value_enum)]
    pub a_type: Option<ATypeArg>,
    /// This process's slice of the campaign: i/n (0 <= i < n), or auto for the batch
    /// scheduler's array index and count (Slurm: SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT
    /// and SLURM_ARRAY_TASK_MIN; a Kubernetes indexed Job: JOB_COMPLETION_INDEX with the count
    /// in FP4TUNE_SHARD_COUNT). Keys are dealt by predicted cost; the shard writes
    /// <sku>-<a_type>.shard-i-of-n.jsonl, a manifest and a partial table <sku>.shard-i-of-n.ron
    /// under --out, which `fp4tune merge` combines.
    #[arg(long, value_parser = fp4tune::tune::shard::ShardArg::parse)]
    pub shard: Option<fp4tune::tune::shard::ShardArg>,
    /// GPUs to tune on at once: all, or device ordinals (0,1,3). One worker process per GPU,
    /// keys dealt by predicted cost, one log and one table; GPUs of different models are
    /// refused. Default: the one GPU of --device.
    #[arg(long, value_parser = fp4tune::tune::gpus::GpuSelection::parse, conflicts_with = "device")]
    pub gpus: Option<fp4tune::tune::gpus::GpuSelection>,
    /// Folder for the measurement log and the dispatch table.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Search strategy per key: race (default: a pool from the previous bucket's fastest, the
    /// seeds and the cost model's ranking, screened with a short timing policy, refined around
    /// the fastest, the finalists timed under the full policy), exhaustive, random or model
    /// (model-guided, every candidate under the full policy).
    #[arg(long, default_value = "race")]
    pub strategy: String,
    /// Evaluations per key as a fraction of its legal configurations (race: the pool; model and
    /// random: every evaluation; default 0.06 for race, 0.1 otherwise).
    #[arg(long)]
    pub budget: Option<f64>,
    /// Wall-time budget of the GEMM keys (race only), e.g. 90s, 3m (at most a week): decode
    /// buckets go first and keys that would overrun their share get smaller pools (the table
    /// names them).
    #[arg(long, value_parser = parse_duration)]
    pub time_budget: Option<std::time::Duration>,
    /// A candidate that runs longer than this many seconds is recorded as a hang.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// The GPU of a one-GPU campaign (device ordinal; --gpus for several).
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Also measure the dequantize-then-cuBLAS path (W expanded to bf16, then cuBLAS BF16)
    /// on buckets with M >= this; an entry takes it where it beats every fused kernel by the
    /// default margin. 0 turns it off.
    #[arg(long, default_value_t = 128)]
    pub composite_min_m: u32,
    /// Skip the grouped MoE phase (by default the set's routed expert layer is tuned as grouped
    /// gate_up and down kernels per token count B after the GEMM keys; on sm120 W4A4 only).
    #[arg(long, conflicts_with = "moe_only")]
    pub no_moe: bool,
    /// Only the grouped MoE phase: its entries replace those of the table at the output path
    /// (kept otherwise), or form a new table.
    #[arg(long)]
    pub moe_only: bool,
    /// Token buckets B of the grouped phase, comma separated (default 1, 2, 4, ..., 1024 and 4096).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    pub moe_buckets: Vec<u32>,
}

pub fn run(args: TuneArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let TuneArgs {
        shapes,
        set,
        only,
        max_m,
        buckets: only_buckets,
        a_type,
        shard,
        gpus,
        out,
        strategy,
        budget,
        time_budget,
        timeout,
        device,
        composite_min_m,
        no_moe,
        moe_only,
        moe_buckets,
    } = args;
    let a_type = a_type.map(|a| a.single("tune")).transpose()?;
    let racing = strategy == "race";
    let strategy_name = strategy.clone();
    let strategy = if racing {
        fp4tune::search::StrategyKind::parse("model")?
    } else {
        fp4tune::search::StrategyKind::parse(&strategy).map_err(|_| {
            anyhow::anyhow!(
                "unknown strategy {strategy:?} (expected race, exhaustive, random or model)"
            )
        })?
    };
    if let Some(b) = budget {
        if !(b > 0.0 && b <= 1.0) {
            bail!("--budget {b}: expected a fraction of the legal configurations in (0, 1]");
        }
    }
    if time_budget.is_some() && !racing {
        bail!("--time-budget needs --strategy race");
    }
    let race = racing.then(|| {
        let mut r = fp4tune::tune::run::RaceSpec::default();
        if let Some(b) = budget {
            r.options.pool_fraction = b;
        }
        r
    });
    let budget = budget.unwrap_or(0.1);
    let composite_min_m = (composite_min_m > 0).then_some(composite_min_m);
    use fp4tune::bench::TimingPolicy;
    use fp4tune::tune::gpus::GpuSelection;
    use fp4tune::tune::policy;
    use fp4tune::tune::run::{self, Shard, TuneSpec};
    use fp4tune::tune::select::SelectRules;
    let file = match &shapes {
        Some(p) => ShapeFile::load(p)?,
        None => ShapeFile::glm5()?,
    };
    let origin =
        shapes.as_ref().map_or("<embedded GLM-5>".to_string(), |p| p.display().to_string());
    let set = file.into_set(&set, &origin)?;
    let mut dims: Vec<(u32, u32)> = Vec::new();
    for s in &set.shapes {
        if (only.is_empty() || only.iter().any(|o| s.name.contains(o.as_str())))
            && !dims.contains(&(s.n, s.k))
        {
            dims.push((s.n, s.k));
        }
    }
    if dims.is_empty() {
        bail!("no shapes of set `{}` match --only {only:?}", set.name);
    }
    let moe_layer = fp4tune::moe::MoeShape::from_set(&set);
    // where the grouped layer comes from (its errors name it), and the campaign's first GPU
    let layer = format!("{origin}, set {}", set.name);
    let first_gpu = match &gpus {
        Some(GpuSelection::List(v)) => v.first().copied().unwrap_or(device),
        _ => device,
    };
    if moe_only {
        let Some((shape, total)) = moe_layer else {
            bail!("shape set `{}` has no routed expert layer to tune", set.name);
        };
        return super::moe::tune_phase(
            (shape, &layer),
            total,
            a_type,
            &moe_buckets,
            first_gpu,
            &out,
            None,
        );
    }
    if only_buckets.contains(&0) {
        bail!("--buckets: a token bucket must be at least 1");
    }
    let from = if only_buckets.is_empty() { &set.token_buckets } else { &only_buckets };
    let mut buckets: Vec<u32> = from.iter().copied().filter(|m| *m <= max_m).collect();
    buckets.sort_unstable();
    buckets.dedup();
    if buckets.is_empty() {
        if only_buckets.is_empty() {
            bail!("no token bucket of set `{}` is <= --max-m {max_m}", set.name);
        }
        bail!("--buckets: none of {only_buckets:?} is <= --max-m {max_m}");
    }
    let seeds = policy::seeds(&dims, &buckets, a_type);
    let exhaustive = matches!(strategy, fp4tune::search::StrategyKind::Exhaustive);
    let shard = match shard {
        Some(s) => s.resolve()?,
        None => Shard::all(),
    };
    // The grouped phase runs after the GEMM keys: a layer the device's grouped kernels cannot
    // run is said now, not after minutes of GEMM measurements.
    // Its first screens are known now: they compile in the background of the GEMM keys.
    let mut ahead = Vec::new();
    if let Some((shape, total)) = moe_layer.filter(|_| !no_moe && shard.index == 0) {
        let info = fp4tune::gpu::Gpu::open(first_gpu)?.info().clone();
        let moe_a_type = super::moe::phase_a_type(&shape, a_type, &info, &layer)
            .map_err(|e| anyhow::anyhow!("{e} (--no-moe tunes the GEMM keys alone)"))?;
        if racing {
            let family = fp4tune::runtime::family_for(&info)?;
            let phase = fp4tune::tune::moe::MoeTuneSpec::for_layer(
                shape,
                moe_a_type,
                total,
                &moe_buckets,
                info.sm_count,
            );
            ahead = fp4tune::tune::moe::first_pools(family, &phase)
                .iter()
                .map(|c| c.source())
                .collect();
        }
    }
    let selection = gpus.unwrap_or(GpuSelection::List(vec![device]));
    let spec = TuneSpec {
        shapes: dims,
        buckets,
        a_type,
        policy: TimingPolicy::quick(),
        shard,
        out_dir: out.clone(),
        exe: std::env::current_exe().context("locating the fp4tune executable for workers")?,
        device,
        candidate_timeout: std::time::Duration::from_secs(timeout),
        planner: policy::planner_factory(strategy, seeds, budget),
        batch: policy::WORKER_BATCH,
        precompile: exhaustive,
        composite_min_m,
        race,
        time_budget,
        ahead,
    };
    let compiler = crate::default_compiler()?;
    // Bars on a terminal; otherwise (CI logs, nohup, batch jobs) one plain line per finished key.
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mp = if tty {
        indicatif::MultiProgress::new()
    } else {
        indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::hidden())
    };
    let say = |line: String| {
        if tty {
            let _ = mp.println(line);
        } else {
            progress_line(format_args!("{line}"));
        }
    };
    let multi = !matches!(&selection, GpuSelection::List(v) if v.len() == 1);
    let progress = Progress::new(&mp, multi);
    let output = fp4tune::tune::gpus::run(&spec, &selection, &compiler, &|gpu, e| {
        progress.event(gpu, e, &say)
    })?;
    progress.finish();
    crate::warn_cache(&compiler);
    let fp4tune::tune::gpus::GpusOutput { output, gpus: ran_on } = output;
    for g in ran_on.iter().filter(|g| g.failure.is_some()) {
        warnln!(
            "GPU {} failed after {} keys: {}",
            g.ordinal,
            g.keys_done,
            g.failure.as_deref().unwrap_or_default()
        );
    }
    let (mut table, sel) =
        fp4tune::tune::emit::dispatch_table(&output.records, &SelectRules::default())?;
    let stats = &output.stats;
    table.campaign = Some(fp4tune::table::Campaign {
        wall_s: started.elapsed().as_secs_f64(),
        gemm_wall_s: output.wall.as_secs_f64(),
        moe_wall_s: None,
        cache: fp4tune::table::Campaign::cache_label(
            stats.cache.cached + stats.refined_cache.cached,
            stats.cache.compiled + stats.refined_cache.compiled,
        )
        .into(),
        kernels_cached: stats.cache.cached + stats.refined_cache.cached,
        kernels_compiled: stats.cache.compiled + stats.refined_cache.compiled,
        screened: stats.screened,
        timed: stats.timed,
        strategy: strategy_name,
        budget: match &spec.race {
            Some(r) => r.options.describe(),
            None => format!("{:.0}% of each key's legal configurations", 100.0 * budget),
        },
        time_budget_s: time_budget.map(|d| d.as_secs_f64()),
        short_keys: stats.short_keys.clone(),
        gpus: if ran_on.len() > 1 {
            ran_on.iter().map(|g| g.ordinal).collect()
        } else {
            Vec::new()
        },
        shards: if shard.count > 1 { vec![shard.to_string()] } else { Vec::new() },
    });
    // The table is saved before anything is printed (a closed standard output must not lose it).
    let path = out.join(run::table_file_name(&output.device, shard));
    table.save(&path)?;
    let printed = print_summary(&output, &sel, &path);
    // A summary that could not be printed (`| head`) does not stop the grouped phase: its error
    // is returned once that phase has saved its entries too.
    // The grouped phase runs on the campaign's first GPU, and of a sharded campaign on shard 0
    // only (merge takes its entries from that shard's table).
    let device = ran_on.first().map_or(device, |g| g.ordinal);
    let moe = match moe_layer {
        Some((shape, total)) if !no_moe && shard.index == 0 => {
            let t = std::time::Instant::now();
            // The campaign's activation type (sm120 campaigns are W4A4).
            let a_type = a_type.or_else(|| output.records.first().map(|r| r.key.a_type));
            super::moe::tune_phase(
                (shape, &layer),
                total,
                a_type,
                &moe_buckets,
                device,
                &out,
                Some(table),
            )
            .and_then(|()| {
                // The campaign block gets the grouped phase's time and the whole wall time.
                let mut t2 = fp4tune::table::Table::load(&path)?;
                if let Some(c) = t2.campaign.as_mut() {
                    c.moe_wall_s = Some(t.elapsed().as_secs_f64());
                    c.wall_s = started.elapsed().as_secs_f64();
                }
                t2.save(&path)?;
                Ok(())
            })
        }
        _ => Ok(()),
    };
    let total = started.elapsed().as_secs_f64();
    progress_line(format_args!("fp4tune tune: {total:.1} s wall in all"));
    moe.and(printed)
}

/// The campaign's progress: on a terminal a campaign bar and, with several GPUs, a bar per GPU
/// (with one GPU, a bar of the key's candidates); otherwise one line per finished key, prefixed
/// by its GPU when there are several (`[gpu 1] [12/56] ...`).
struct Progress<'a> {
    mp: &'a indicatif::MultiProgress,
    multi: bool,
    keys_bar: indicatif::ProgressBar,
    cand_bar: Option<indicatif::ProgressBar>,
    gpu_bars: std::cell::RefCell<std::collections::BTreeMap<usize, indicatif::ProgressBar>>,
    counts: std::cell::RefCell<std::collections::BTreeMap<&'static str, usize>>,
    /// Keys finished in the campaign, and its keys (the GPUs' assignments summed).
    done: std::cell::Cell<usize>,
    total: std::cell::Cell<usize>,
}

fn bar_style(template: &str) -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template(template)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
}

impl<'a> Progress<'a> {
    fn new(mp: &'a indicatif::MultiProgress, multi: bool) -> Self {
        let keys_bar = mp.add(indicatif::ProgressBar::new(0));
        keys_bar.set_style(bar_style("keys       [{bar:30}] {pos}/{len} {msg} (eta {eta})"));
        let cand_bar = (!multi).then(|| {
            let b = mp.add(indicatif::ProgressBar::new(0));
            b.set_style(bar_style("candidates {pos} {msg}"));
            b
        });
        Self {
            mp,
            multi,
            keys_bar,
            cand_bar,
            gpu_bars: Default::default(),
            counts: Default::default(),
            done: Default::default(),
            total: Default::default(),
        }
    }

    fn prefix(&self, gpu: usize) -> String {
        if self.multi {
            format!("[gpu {gpu}] ")
        } else {
            String::new()
        }
    }

    fn gpu_bar(&self, gpu: usize) -> Option<indicatif::ProgressBar> {
        if !self.multi {
            return None;
        }
        let mut bars = self.gpu_bars.borrow_mut();
        Some(
            bars.entry(gpu)
                .or_insert_with(|| {
                    let b = self.mp.add(indicatif::ProgressBar::new(0));
                    b.set_style(bar_style(&format!(
                        "gpu {gpu:<6} [{{bar:30}}] {{pos}}/{{len}} {{msg}}"
                    )));
                    b
                })
                .clone(),
        )
    }

    fn event(&self, gpu: usize, e: fp4tune::tune::run::Event, say: &dyn Fn(String)) {
        use fp4tune::tune::run::Event;
        let p = self.prefix(gpu);
        let key_text = |k: &fp4tune::table::TableKey| format!("N={} K={} M={}", k.n, k.k, k.m);
        match e {
            Event::Device(d) => say(format!(
                "{p}device: {} (cc {}.{}, {} SMs)",
                d.name, d.compute_capability.0, d.compute_capability.1, d.sm_count
            )),
            Event::Compiling(n) => self.keys_bar.set_message(format!("compiling {n} kernels")),
            Event::Assigned { keys, predicted_s } => {
                self.total.set(self.total.get() + keys);
                self.keys_bar.set_length(self.total.get() as u64);
                if self.multi {
                    if let Some(b) = self.gpu_bar(gpu) {
                        b.set_length(keys as u64);
                    }
                    say(format!("{p}{keys} keys, {predicted_s:.0} s of predicted screening"));
                }
            }
            Event::Key { index, total, key, candidates: _, done_before } => {
                if let Some(b) = self.gpu_bar(gpu) {
                    b.set_length(total as u64);
                    b.set_position(index as u64);
                    b.set_message(key_text(&key));
                } else {
                    self.keys_bar.set_message(key_text(&key));
                }
                if let Some(c) = &self.cand_bar {
                    c.set_position(done_before as u64);
                }
                self.counts.borrow_mut().clear();
            }
            Event::Result { outcome, .. } => {
                if let Some(c) = &self.cand_bar {
                    c.inc(1);
                    *self.counts.borrow_mut().entry(outcome).or_default() += 1;
                    c.set_message(format!("{:?}", self.counts.borrow()));
                }
            }
            Event::KeyDone { index, key, screened, timed, best, elapsed, short, .. } => {
                self.done.set(self.done.get() + 1);
                let (done, total) = (self.done.get(), self.total.get().max(self.done.get()));
                self.keys_bar.set_position(done as u64);
                if let Some(b) = self.gpu_bar(gpu) {
                    b.set_position(index as u64 + 1);
                }
                let eta = elapsed.as_secs_f64() / done as f64 * (total - done) as f64;
                let best = best.map_or("no verified kernel".to_string(), |(c, us)| {
                    format!("{} {us:.2} us", c.name())
                });
                say(format!(
                    "{p}[{done}/{total}] {}: {screened} screened, {timed} timed, best {best}{}, {:.1} s elapsed, eta {eta:.0} s",
                    key_text(&key),
                    if short { " (pool cut by --time-budget)" } else { "" },
                    elapsed.as_secs_f64()
                ));
            }
            Event::Precompiled(c) => say(format!(
                "cubin cache: {} kernels of the first pools found, {} compiled in the background",
                c.cached, c.compiled
            )),
            Event::Composite { key, outcome, median_us } => {
                self.keys_bar.set_message(format!("{}: dequant + cuBLAS", key_text(&key)));
                match median_us {
                    Some(t) => say(format!("{p}{}: dequant_cublas_bf16 {t:.2} us", key_text(&key))),
                    None => say(format!("{p}{}: dequant_cublas_bf16 {outcome}", key_text(&key))),
                }
            }
            Event::WorkerRestart(why) => {
                say(format!("{p}worker restarted: {}", why.chars().take(200).collect::<String>()))
            }
            Event::GpuFailed { reason, keys_left } => say(format!(
                "{p}GPU failed, {keys_left} keys left to the other GPUs: {}",
                reason.chars().take(200).collect::<String>()
            )),
            Event::Adopted { keys } => say(format!("{p}takes over {keys} keys of a failed GPU")),
            Event::TornTail(torn) => self.keys_bar.suspend(|| warnln!("{torn}")),
        }
    }

    fn finish(&self) {
        self.keys_bar.finish_and_clear();
        if let Some(c) = &self.cand_bar {
            c.finish_and_clear();
        }
        for b in self.gpu_bars.borrow().values() {
            b.finish_and_clear();
        }
    }
}

/// A progress line on standard error (a closed one is ignored: progress must not stop the run).
fn progress_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}

/// A duration such as `300`, `90s`, `5m` or `1h` (seconds without a unit).
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("`{s}`: expected e.g. 300, 90s, 5m"))?;
    let scale = match unit {
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (s, m or h)")),
    };
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("`{s}`: expected a positive duration"));
    }
    // a week at most: longer is a typo, and past ~5.8e11 years no Duration holds it
    const MAX_SECS: f64 = 7.0 * 24.0 * 3600.0;
    if v * scale > MAX_SECS {
        return Err(format!("`{s}`: at most a week (7 x 24 h)"));
    }
    Ok(std::time::Duration::from_secs_f64(v * scale))
}

/// The campaign's summary after its table was saved at `path`.
fn print_summary(
    output: &fp4tune::tune::run::TuneOutput,
    sel: &fp4tune::tune::select::Selection,
    path: &std::path::Path,
) -> Result<()> {
    outln!(
        "{} on {}: {} new records ({} in the log {}), {:.1} s wall",
        output.family,
        output.device.name,
        output.new_records,
        output.records.len(),
        output.log_path.display(),
        output.wall.as_secs_f64()
    )?;
    print_selection(&output.records, sel)?;
    outln!("wrote the dispatch table {}", path.display())
}

/// The end-of-campaign summary: per key the winner, its time, roofline fraction and speedup over
/// the default configuration.
pub fn print_selection(
    records: &[fp4tune::tune::log::Record],
    sel: &fp4tune::tune::select::Selection,
) -> Result<()> {
    let ctx = records.iter().find_map(|r| r.context.clone());
    if let Some(d) = sel.default {
        outln!(
            "default configuration (best geomean over all keys): {d} ({:.2} us geomean)",
            sel.default_geomean_us
        )?;
    }
    outln!(
        "{:>6} {:>6} {:>6}  {:<52} {:>9} {:>9} {:>10} {:>7}",
        "N",
        "K",
        "M",
        "winner",
        "us",
        "roofline",
        "vs default",
        "timed"
    )?;
    let mut log_sum = 0.0;
    for c in &sel.choices {
        let p = fp4tune::problem::GemmProblem::new(c.key.m, c.key.n, c.key.k, c.key.a_type);
        let roof = ctx
            .as_ref()
            .map_or(f64::NAN, |x| 100.0 * fp4tune::tune::emit::roofline_us(&p, x) / c.time.median);
        log_sum += c.speedup_over_default().ln();
        let winner = match (c.method, c.fused_time) {
            (fp4tune::table::Method::Fused, _) => c.config.name(),
            (m, Some(f)) => format!("{} (fused {:.2} us)", m.label(), f.median),
            (m, None) => m.label().to_string(),
        };
        outln!(
            "{:>6} {:>6} {:>6}  {:<52} {:>9.2} {:>8.0}% {:>9.2}x {:>7}",
            c.key.n,
            c.key.k,
            c.key.m,
            winner,
            c.time.median,
            roof,
            c.speedup_over_default(),
            c.timed
        )?;
    }
    if !sel.choices.is_empty() {
        outln!("geomean speedup of the tuned choice over the default configuration: {:.3}x over {} entries", (log_sum / sel.choices.len() as f64).exp(), sel.choices.len())?;
    }
    Ok(())
}
