//! `fp4tune tune`: a tuning campaign on this GPU, with progress bars, and its dispatch table.

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
    /// Activation type (default: w4a16 on SM90, w4a4 on SM120, whose family is W4A4 only).
    #[arg(long, value_enum)]
    pub a_type: Option<ATypeArg>,
    /// This process's slice of the campaign, i/n (Slurm array index / count, ...).
    #[arg(long, value_parser = fp4tune::tune::run::Shard::parse)]
    pub shard: Option<fp4tune::tune::run::Shard>,
    /// Folder for the measurement log and the dispatch table.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Search strategy per key: exhaustive, random or model (analytic model pre-ranks, then
    /// the best and their neighbours are measured).
    #[arg(long, default_value = "model")]
    pub strategy: String,
    /// Evaluations per key as a fraction of its legal configurations (model/random).
    #[arg(long, default_value_t = 0.1)]
    pub budget: f64,
    /// A candidate that runs longer than this many seconds is recorded as a hang.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Also measure the dequantize-then-cuBLAS path (W expanded to bf16, then cuBLAS BF16)
    /// on buckets with M >= this; an entry takes it where it beats every fused kernel by the
    /// default margin. 0 turns it off.
    #[arg(long, default_value_t = 128)]
    pub composite_min_m: u32,
    /// Skip the grouped MoE phase (by default the set's routed expert layer is tuned as grouped
    /// gate_up and down kernels per token count B after the GEMM keys; sm90 only).
    #[arg(long, conflicts_with = "moe_only")]
    pub no_moe: bool,
    /// Only the grouped MoE phase: its entries replace those of the table at the output path
    /// (kept otherwise), or form a new table.
    #[arg(long)]
    pub moe_only: bool,
    /// Token buckets B of the grouped phase, comma separated (default 1,2,4,...,1024).
    #[arg(long, value_delimiter = ',')]
    pub moe_buckets: Vec<u32>,
}

pub fn run(args: TuneArgs) -> Result<()> {
    let TuneArgs {
        shapes,
        set,
        only,
        max_m,
        a_type,
        shard,
        out,
        strategy,
        budget,
        timeout,
        device,
        composite_min_m,
        no_moe,
        moe_only,
        moe_buckets,
    } = args;
    let a_type = a_type.map(|a| a.single("tune")).transpose()?;
    let strategy = fp4tune::search::StrategyKind::parse(&strategy)?;
    let composite_min_m = (composite_min_m > 0).then_some(composite_min_m);
    use fp4tune::bench::TimingPolicy;
    use fp4tune::tune::policy;
    use fp4tune::tune::run::{self, Event, Shard, TuneSpec};
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
    if moe_only {
        let Some((shape, total)) = moe_layer else {
            bail!("shape set `{}` has no routed expert layer to tune", set.name);
        };
        return super::moe::tune_phase(shape, total, &moe_buckets, device, &out, None);
    }
    let buckets: Vec<u32> = set.token_buckets.iter().copied().filter(|m| *m <= max_m).collect();
    if buckets.is_empty() {
        bail!("no token bucket of set `{}` is <= --max-m {max_m}", set.name);
    }
    let seeds = policy::seeds(&dims, &buckets, a_type);
    let exhaustive = matches!(strategy, fp4tune::search::StrategyKind::Exhaustive);
    let spec = TuneSpec {
        shapes: dims,
        buckets,
        a_type,
        policy: TimingPolicy::quick(),
        shard: shard.unwrap_or(Shard::all()),
        out_dir: out.clone(),
        exe: std::env::current_exe().context("locating the fp4tune executable for workers")?,
        device,
        candidate_timeout: std::time::Duration::from_secs(timeout),
        planner: policy::planner_factory(strategy, seeds, budget),
        batch: policy::WORKER_BATCH,
        precompile: exhaustive,
        composite_min_m,
    };
    let compiler = crate::default_compiler()?;
    let mp = indicatif::MultiProgress::new();
    let keys_bar = mp.add(indicatif::ProgressBar::new(0));
    keys_bar.set_style(
        indicatif::ProgressStyle::with_template(
            "keys       [{bar:30}] {pos}/{len} {msg} (eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let cand_bar = mp.add(indicatif::ProgressBar::new(0));
    cand_bar.set_style(
        indicatif::ProgressStyle::with_template("candidates [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let counts = std::cell::RefCell::new(std::collections::BTreeMap::<&'static str, usize>::new());
    let output = run::run(&spec, &compiler, &|e| match e {
        Event::Device(d) => keys_bar.println(format!(
            "device: {} (cc {}.{}, {} SMs)",
            d.name, d.compute_capability.0, d.compute_capability.1, d.sm_count
        )),
        Event::Compiling(n) => keys_bar.set_message(format!("compiling {n} kernels")),
        Event::Key { index, total, key, candidates, done_before } => {
            keys_bar.set_length(total as u64);
            keys_bar.set_position(index as u64);
            keys_bar.set_message(format!("N={} K={} M={}", key.n, key.k, key.m));
            cand_bar.set_length(candidates as u64);
            cand_bar.set_position(done_before as u64);
        }
        Event::Result { outcome, .. } => {
            cand_bar.inc(1);
            *counts.borrow_mut().entry(outcome).or_default() += 1;
            cand_bar.set_message(format!("{:?}", counts.borrow()));
        }
        Event::Composite { key, outcome, median_us } => {
            keys_bar.set_message(format!("N={} K={} M={}: dequant + cuBLAS", key.n, key.k, key.m));
            if let Some(t) = median_us {
                keys_bar.println(format!(
                    "N={} K={} M={}: dequant_cublas_bf16 {t:.2} us",
                    key.n, key.k, key.m
                ));
            } else {
                keys_bar.println(format!(
                    "N={} K={} M={}: dequant_cublas_bf16 {outcome}",
                    key.n, key.k, key.m
                ));
            }
        }
        Event::WorkerRestart(why) => keys_bar
            .println(format!("worker restarted: {}", why.chars().take(200).collect::<String>())),
        Event::TornTail(torn) => keys_bar.suspend(|| warnln!("{torn}")),
    })?;
    keys_bar.finish_and_clear();
    cand_bar.finish_and_clear();
    let (table, sel) =
        fp4tune::tune::emit::dispatch_table(&output.records, &SelectRules::default())?;
    // The table is saved before anything is printed (a closed standard output must not lose it).
    let path = out.join(format!("{}.ron", run::sku_slug(&output.device.name)));
    table.save(&path)?;
    let printed = print_summary(&output, &sel, &path);
    // A summary that could not be printed (`| head`) does not stop the grouped phase: its error
    // is returned once that phase has saved its entries too.
    let moe = match moe_layer {
        Some((shape, total)) if !no_moe && output.family == fp4tune::template::Family::Sm90 => {
            super::moe::tune_phase(shape, total, &moe_buckets, device, &out, Some(table))
        }
        _ => Ok(()),
    };
    moe.and(printed)
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
