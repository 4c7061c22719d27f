//! The `fp4tune` command line: argument parsing, progress display and printing only.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use fp4tune::compile::{Compiler, Origin};
use fp4tune::problem::AType;
use fp4tune::shapes::{self, ShapeFile};
use fp4tune::template::{self, Arch, Family, GemmConfig, Pipeline};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "fp4tune", version, about = "Autotune NVFP4 block-scaled GEMM kernels per GPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compile every variant of a family's search space and print registers, spills, shared memory.
    Compile {
        /// Target architecture: sm_90a (Hopper family) or sm_120a (native NVFP4 family).
        #[arg(long, value_parser = parse_arch)]
        arch: Arch,
        /// Only variants that can run at least one shape of this shape set.
        #[arg(long)]
        shapes: Option<PathBuf>,
        /// Activation type(s) to compile.
        #[arg(long, value_enum, default_value = "all")]
        a_type: ATypeArg,
        /// Cubin cache folder (default: $FP4TUNE_CACHE or ~/.cache/fp4tune/cubin).
        #[arg(long)]
        cache: Option<PathBuf>,
        /// Which configurations: the whole search space, the family's seeds (default + measured
        /// seeds) or its representative configurations.
        #[arg(long, value_enum, default_value = "space")]
        configs: CompileSet,
        /// Only the configurations with these names or kernel names (comma separated, e.g.
        /// sm90_w4a16_m8n16k1024_w1x1x4_g2_sk6_swap_o4).
        #[arg(long, value_delimiter = ',')]
        names: Vec<String>,
        /// Write each rendered kernel source to DIR/<kernel name>.cu instead of compiling (no
        /// NVRTC needed).
        #[arg(long, value_name = "DIR")]
        emit: Option<PathBuf>,
    },
    /// Benchmark the family's kernels on a shape set against floors and peers (needs a GPU).
    Bench(BenchArgs),
    /// Measure the device's physical floors: launch floor, read bandwidth, cold read floors, tensor peak.
    Floors {
        /// Byte counts for read floors (default: the GLM-5 expert sizes of measuring.md).
        #[arg(long, value_delimiter = ',')]
        bytes: Vec<u64>,
        #[arg(long, default_value_t = 0)]
        device: usize,
    },
    /// Tune: find the best kernel per (shape, token bucket) on this GPU and write its dispatch table.
    Tune(TuneArgs),
    /// Validate a dispatch table (schema, configurations, template hashes) and summarize it.
    Table {
        /// The table to check (results/<sku>.ron).
        #[arg(long)]
        check: PathBuf,
        /// Also check it against this CUDA device (compute capability, template hashes).
        #[arg(long)]
        device: Option<usize>,
    },
    /// Merge the logs of a sharded campaign (refuses other GPU models or template versions) and
    /// optionally write the dispatch table of the merged records.
    Merge {
        /// Logs to merge (one per shard).
        #[arg(required = true)]
        logs: Vec<PathBuf>,
        /// The merged log.
        #[arg(long)]
        out: PathBuf,
        /// Also write the dispatch table here (e.g. results/nvidia-h200.ron).
        #[arg(long)]
        table: Option<PathBuf>,
    },
    /// Replay a measurement log to compare search strategies offline (regret vs evaluations).
    Simulate {
        #[arg(long)]
        log: PathBuf,
        /// Strategies: exhaustive, random, model (comma separated).
        #[arg(long, default_value = "model,random", value_delimiter = ',')]
        strategy: Vec<String>,
        /// Evaluation budget per key as a fraction of the logged candidates.
        #[arg(long, default_value_t = 1.0)]
        budget: f64,
    },
    /// (internal) Measuring worker process driven by `fp4tune tune` over stdin/stdout.
    #[command(hide = true)]
    Worker,
    /// Print a shape set (RON) derived from a Hugging Face MoE config.json.
    Shapes {
        /// The model's config.json (GLM-5, DeepSeek-V3, Qwen3-MoE, Mixtral key names).
        #[arg(long)]
        from_config: PathBuf,
        /// Tensor-parallel degree (GPUs per replica).
        #[arg(long)]
        tp: u32,
        /// Expert-parallel degree (divides --tp); default 1.
        #[arg(long)]
        ep: Option<u32>,
    },
}

/// Which configurations `compile` takes.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum CompileSet {
    Space,
    Seeds,
    Representative,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ConfigsArg {
    Space,
    Default,
}

/// Which weight pipelines of the search space a bench run measures.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum PipelineArg {
    All,
    /// cp.async shared-memory stages (`s<stages>` in kernel names).
    CpAsync,
    /// Weights streamed into registers (`r<depth>` in kernel names).
    Registers,
    /// Weights streamed into per-warp shared-memory rings (`p<depth>` in kernel names).
    WarpRing,
    /// Weights and activations streamed into registers (`g<depth>` in kernel names).
    Global,
    /// Every streamed pipeline (registers, warp rings, global).
    Direct,
}

impl PipelineArg {
    fn admits(self, p: Pipeline) -> bool {
        match self {
            PipelineArg::All => true,
            PipelineArg::CpAsync => p == Pipeline::CpAsync,
            PipelineArg::Registers => p == Pipeline::Registers,
            PipelineArg::WarpRing => p == Pipeline::WarpRing,
            PipelineArg::Global => p == Pipeline::Global,
            PipelineArg::Direct => p.is_direct(),
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ATypeArg {
    W4a4,
    W4a16,
    All,
}

impl ATypeArg {
    /// The one activation type a measuring command runs (`all` is for `compile` only).
    fn single(self, command: &str) -> Result<AType> {
        match self {
            ATypeArg::W4a4 => Ok(AType::Nvfp4),
            ATypeArg::W4a16 => Ok(AType::Bf16),
            ATypeArg::All => {
                bail!("--a-type all is not supported by {command}: pick w4a4 or w4a16")
            }
        }
    }

    fn types(self) -> Vec<AType> {
        match self {
            ATypeArg::W4a4 => vec![AType::Nvfp4],
            ATypeArg::W4a16 => vec![AType::Bf16],
            ATypeArg::All => vec![AType::Nvfp4, AType::Bf16],
        }
    }
}

fn parse_arch(s: &str) -> Result<Arch, String> {
    Arch::parse(s).ok_or_else(|| format!("unknown architecture `{s}` (expected sm_90a or sm_120a)"))
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the whole context chain on one line; no backtrace noise for users.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Compile { arch, shapes, a_type, cache, configs, names, emit } => {
            cmd_compile(arch, shapes, a_type, cache, configs, &names, emit)
        }
        Command::Bench(args) => cmd_bench(args),
        Command::Floors { bytes, device } => cmd_floors(bytes, device),
        Command::Tune(args) => cmd_tune(args),
        Command::Table { check, device } => cmd_table_check(check, device),
        Command::Merge { logs, out, table } => cmd_merge(logs, out, table),
        Command::Simulate { log, strategy, budget } => cmd_simulate(log, strategy, budget),
        Command::Worker => {
            let compiler = Compiler::with_default_cache()?;
            fp4tune::tune::worker::serve(&compiler)
        }
        Command::Shapes { from_config, tp, ep } => {
            print!("{}", shapes::shapes_ron_from_config_file(&from_config, tp, ep.unwrap_or(1))?);
            Ok(())
        }
    }
}

fn cmd_compile(
    arch: Arch,
    shapes: Option<PathBuf>,
    a_type: ATypeArg,
    cache: Option<PathBuf>,
    set: CompileSet,
    names: &[String],
    emit: Option<PathBuf>,
) -> Result<()> {
    let family = Family::for_arch(arch);
    let file = shapes.as_deref().map(ShapeFile::load).transpose()?;
    let mut configs: Vec<GemmConfig> = Vec::new();
    for t in a_type.types() {
        if template::search_space(family, t).is_empty() {
            continue;
        }
        match set {
            CompileSet::Space => configs.extend(template::search_space(family, t)),
            CompileSet::Seeds => {
                configs.push(template::default_config(family, t));
                configs.extend(template::measured_seeds(family, t));
            }
            CompileSet::Representative => {
                configs.extend(template::representative_configs(family, t))
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    configs.retain(|c| seen.insert(*c));
    if !names.is_empty() {
        configs.retain(|c| names.iter().any(|n| *n == c.name() || *n == c.kernel_name()));
    }
    if let Some(file) = &file {
        // Keep variants that can run at least one (shape, bucket) of the file.
        configs.retain(|c| {
            file.sets
                .iter()
                .any(|set| set.problems(c.a_type).any(|(_, p)| c.check_problem(&p).is_ok()))
        });
    }
    if configs.is_empty() {
        bail!("the {family} family has no variants for {a_type:?}");
    }
    let sources = configs
        .iter()
        .map(|c| c.render().with_context(|| format!("rendering {c}")))
        .collect::<Result<Vec<_>>>()?;
    if let Some(dir) = emit {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (c, src) in configs.iter().zip(&sources) {
            let path = dir.join(format!("{}.cu", c.kernel_name()));
            std::fs::write(&path, &src.code)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        println!("{} kernel sources written to {}", sources.len(), dir.display());
        return Ok(());
    }
    let compiler =
        Compiler::new(Some(cache.unwrap_or_else(fp4tune::compile::cache::DiskCache::default_dir)))?;
    let t0 = std::time::Instant::now();
    let results = compiler.compile_many(&sources);
    let wall = t0.elapsed().as_secs_f64();
    println!(
        "{:<52} {:>5} {:>7} {:>9} {:>10} {:>6}",
        "kernel", "regs", "spills", "smem_B", "compile_ms", "from"
    );
    let mut failed = 0;
    for (cfg, r) in configs.iter().zip(&results) {
        match r {
            Ok(k) => {
                let s = k.stats.unwrap_or_default();
                println!(
                    "{:<52} {:>5} {:>7} {:>9} {:>10.1} {:>6}",
                    cfg.name(),
                    s.registers,
                    s.spill_stores + s.spill_loads,
                    s.static_smem + cfg.smem_bytes(),
                    k.compile_ms,
                    match k.origin {
                        Origin::Compiled => "nvrtc",
                        Origin::DiskCache => "disk",
                        Origin::MemoryCache => "memory",
                    }
                );
            }
            Err(e) => {
                failed += 1;
                println!(
                    "{:<52} FAILED: {}",
                    cfg.name(),
                    e.to_string().lines().next().unwrap_or("")
                );
                eprintln!("{e}");
            }
        }
    }
    let (maj, min) = compiler.nvrtc_version();
    println!(
        "{} variants for {arch}, {failed} failed, {wall:.1} s wall (NVRTC {maj}.{min}, cache {})",
        configs.len(),
        compiler.cache_dir().map(|d| d.display().to_string()).unwrap_or_default()
    );
    if failed > 0 {
        bail!("{failed} of {} variants failed to compile", configs.len());
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
struct TuneArgs {
    /// Shape file (default: the embedded GLM-5 file).
    #[arg(long)]
    shapes: Option<PathBuf>,
    /// Shape set of the file (default: tp8).
    #[arg(long, default_value = fp4tune::shapes::DEFAULT_SET)]
    set: String,
    /// Only shapes whose name contains one of these (e.g. routed), comma separated.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Largest token bucket to tune (buckets come from the shape set).
    #[arg(long, default_value_t = 8192)]
    max_m: u32,
    /// Activation type (default: w4a16 on SM90, w4a4 on SM120, whose family is W4A4 only).
    #[arg(long, value_enum)]
    a_type: Option<ATypeArg>,
    /// This process's slice of the campaign, i/n (Slurm array index / count, ...).
    #[arg(long, value_parser = fp4tune::tune::run::Shard::parse)]
    shard: Option<fp4tune::tune::run::Shard>,
    /// Folder for the measurement log and the dispatch table.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Search strategy per key: exhaustive, random or model (analytic model pre-ranks, then
    /// the best and their neighbours are measured).
    #[arg(long, default_value = "model")]
    strategy: String,
    /// Evaluations per key as a fraction of its legal configurations (model/random).
    #[arg(long, default_value_t = 0.1)]
    budget: f64,
    /// A candidate that runs longer than this many seconds is recorded as a hang.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Also measure the dequantize-then-cuBLAS path (W expanded to bf16, then cuBLAS BF16)
    /// on buckets with M >= this; an entry takes it where it beats every fused kernel by the
    /// default margin. 0 turns it off.
    #[arg(long, default_value_t = 128)]
    composite_min_m: u32,
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// Shape file (default: the embedded GLM-5 file).
    #[arg(long)]
    shapes: Option<PathBuf>,
    /// Sets of the shape file to run, comma separated.
    #[arg(long, default_value = "tp8", value_delimiter = ',')]
    sets: Vec<String>,
    /// Only shapes whose name contains one of these (e.g. routed), comma separated.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Token counts M, comma separated (default: 1,2,4,8,16,32,64,128,256,512,1024).
    #[arg(long, value_delimiter = ',')]
    m: Vec<u32>,
    /// Activation type.
    #[arg(long, value_enum, default_value = "w4a16")]
    a_type: ATypeArg,
    /// Which configurations: the whole search space, or only the family default.
    #[arg(long, value_enum, default_value = "space")]
    configs: ConfigsArg,
    /// Only configurations of this weight pipeline.
    #[arg(long, value_enum, default_value = "all")]
    pipeline: PipelineArg,
    /// Skip the cuBLAS / cuBLASLt peers.
    #[arg(long)]
    no_peers: bool,
    /// Fewer samples per candidate.
    #[arg(long)]
    quick: bool,
    /// Per problem, measure only this many configurations, the fastest by the analytic cost
    /// model (0 = all legal ones).
    #[arg(long, default_value_t = 400)]
    max_candidates: usize,
    /// Report folder; writes bench-<a_type>.csv and .md there.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

/// Distinct (label, N, K) weight shapes of the chosen sets.
fn select_shapes(
    file: &ShapeFile,
    sets: &[String],
    only: &[String],
) -> Result<Vec<(String, u32, u32)>> {
    let mut out: Vec<(String, u32, u32)> = Vec::new();
    for name in sets {
        let set = file.set(name).with_context(|| {
            format!(
                "shape set `{name}` not in the shape file (it has: {})",
                file.set_names().join(", ")
            )
        })?;
        for s in &set.shapes {
            if !only.is_empty() && !only.iter().any(|o| s.name.contains(o.as_str())) {
                continue;
            }
            if !out.iter().any(|(_, n, k)| *n == s.n && *k == s.k) {
                out.push((format!("{}_{}", set.name, s.name), s.n, s.k));
            }
        }
    }
    if out.is_empty() {
        bail!("no shapes selected (sets {sets:?}, only {only:?})");
    }
    Ok(out)
}

fn cmd_bench(a: BenchArgs) -> Result<()> {
    use fp4tune::bench::{report, run, TimingPolicy};
    let a_type = a.a_type.single("bench")?;
    let file = match &a.shapes {
        Some(p) => ShapeFile::load(p)?,
        None => ShapeFile::glm5()?,
    };
    let shapes = select_shapes(&file, &a.sets, &a.only)?;
    let gpu = fp4tune::gpu::Gpu::open(a.device)?;
    let info = gpu.info().clone();
    let arch = Arch::for_compute_capability(info.compute_capability.0, info.compute_capability.1)
        .with_context(|| {
        format!(
            "{} (compute capability {}.{}) has no fp4tune kernel family (supported: 9.0, 12.0)",
            info.name, info.compute_capability.0, info.compute_capability.1
        )
    })?;
    let family = Family::for_arch(arch);
    let mut configs = match a.configs {
        ConfigsArg::Space => template::search_space(family, a_type),
        ConfigsArg::Default => vec![template::default_config(family, a_type)],
    };
    configs.retain(|c| a.pipeline.admits(c.pipeline));
    if configs.is_empty() {
        bail!(
            "no {} configuration of the {family} family uses the {:?} pipeline",
            a_type,
            a.pipeline
        );
    }
    let compiler = Compiler::with_default_cache()?;
    let spec = run::BenchSpec {
        shapes,
        ms: if a.m.is_empty() {
            vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
        } else {
            a.m.clone()
        },
        a_type,
        configs,
        peers: !a.no_peers,
        policy: if a.quick { TimingPolicy::quick() } else { TimingPolicy::default() },
        refine: 8,
        max_candidates: a.max_candidates,
        screen_policy: TimingPolicy {
            samples: 5,
            min_sample_us: 50.0,
            warmup_replays: 1,
            ..TimingPolicy::default()
        },
    };
    let bar = indicatif::ProgressBar::new((spec.shapes.len() * spec.ms.len()) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} {msg} (eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let stem = a.out.join(format!("bench-{}", a_type));
    let partial = std::cell::RefCell::new((Vec::new(), Vec::new()));
    let out = run::run(&gpu, &compiler, &spec, &|e| match e {
        run::Event::Floors(what) => bar.set_message(what),
        run::Event::Problem { index, label, candidates, .. } => {
            bar.set_position(index as u64 - 1);
            bar.set_message(format!("{label}: {candidates} candidates"));
        }
        run::Event::ProblemDone { rows, screen_rows, .. } => {
            // Reports so far, so an interrupted run still leaves its finished problems behind.
            let mut p = partial.borrow_mut();
            p.0.extend(rows);
            p.1.extend(screen_rows);
            let _ = std::fs::write(stem.with_extension("csv"), report::csv(&p.0));
            let _ = std::fs::write(
                a.out.join(format!("bench-{}-screen.csv", a_type)),
                report::csv(&p.1),
            );
        }
    })?;
    bar.finish_and_clear();
    let prov = report::Provenance {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        device: info,
        nvrtc_version: compiler.nvrtc_version(),
        timing_policy: spec.policy.describe(),
        bandwidth_gbps: out.bandwidth_gbps,
        launch_floor_us: out.launch_floor_us,
        tensor_peak_tflops: out.tensor_peak_tflops,
        template_hash: template::family_template_hash(family),
        date: utc_now(),
    };
    let peers: Vec<&str> = if spec.peers { fp4tune::bench::peers::PEERS.to_vec() } else { vec![] };
    let mut md = report::markdown(
        &format!("fp4tune {family} benchmark ({})", a_type),
        &prov,
        &out.rows,
        &peers,
    );
    if !out.failures.is_empty() {
        md.push_str(&format!("\n## Candidates that did not produce a timing ({})\n\n| shape | M | config | reason |\n|---|---|---|---|\n", out.failures.len()));
        for f in &out.failures {
            md.push_str(&format!(
                "| {} | {} | `{}` | {} |\n",
                f.shape,
                f.m,
                f.config,
                f.reason.lines().next().unwrap_or("").replace('|', "/")
            ));
        }
    }
    std::fs::write(stem.with_extension("csv"), report::csv(&out.rows))?;
    std::fs::write(
        a.out.join(format!("bench-{}-screen.csv", a_type)),
        report::csv(&out.screen_rows),
    )?;
    std::fs::write(stem.with_extension("md"), &md)?;
    println!("{md}");
    println!(
        "wrote {} and {}",
        stem.with_extension("csv").display(),
        stem.with_extension("md").display()
    );
    Ok(())
}

/// Current UTC time as `YYYY-MM-DD HH:MM UTC` (no date crate needed for one line of a report).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mth = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if mth <= 2 { 1 } else { 0 };
    format!("{y:04}-{mth:02}-{d:02} {:02}:{:02} UTC", rem / 3600, (rem % 3600) / 60)
}

fn cmd_floors(bytes: Vec<u64>, device: usize) -> Result<()> {
    use fp4tune::bench::{floors::Floors, run::tensor_peak_tflops, TimingPolicy};
    let gpu = fp4tune::gpu::Gpu::open(device)?;
    let compiler = Compiler::with_default_cache()?;
    let policy = TimingPolicy::default();
    let floors = Floors::new(&gpu, &compiler)?;
    let info = gpu.info();
    println!(
        "{} (cc {}.{}, {} SMs, L2 {} MiB, {} MHz SM, {} MHz mem x {} bit)",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.sm_count,
        info.l2_bytes >> 20,
        info.sm_clock_mhz,
        info.mem_clock_mhz,
        info.mem_bus_bits
    );
    println!("policy: {}", policy.describe());
    for blocks in [1, info.sm_count] {
        let s = floors.launch_floor(&policy, blocks)?;
        println!("launch floor ({blocks} CTAs): {:.3} us [{:.3}, {:.3}]", s.median, s.lo, s.hi);
    }
    println!(
        "bf16 tensor peak (cuBLAS 8192^3, best of 6): {:.0} TFLOP/s",
        tensor_peak_tflops(&gpu)?
    );
    let sizes = if bytes.is_empty() {
        vec![
            885_000,
            1_770_000,
            3_540_000,
            7_080_000,
            14_160_000,
            28_300_000,
            113_000_000,
            453_000_000,
            1 << 30,
            4 << 30,
        ]
    } else {
        bytes
    };
    println!(
        "{:>12} {:>7} {:>10} {:>10} {:>10} {:>8}",
        "bytes", "blocks", "median_us", "lo_us", "hi_us", "GB/s"
    );
    for b in sizes {
        let f = floors.read_floor(&policy, b)?;
        println!(
            "{:>12} {:>7} {:>10.2} {:>10.2} {:>10.2} {:>8.0}",
            f.bytes,
            f.blocks,
            f.time.median,
            f.time.lo,
            f.time.hi,
            f.gbps()
        );
    }
    Ok(())
}

/// Configurations every key measures (where legal) so the geomean default is chosen among
/// configurations timed everywhere: the family defaults, the families' measured seeds
/// (`template::measured_seeds`) and the analytic model's two favourites of every key.
fn common_configs(dims: &[(u32, u32)], buckets: &[u32], a_type: AType) -> Vec<GemmConfig> {
    let model = fp4tune::search::CostModel::new(fp4tune::search::DeviceModel::h200());
    let mut out = Vec::new();
    for family in [Family::Sm90, Family::Sm120] {
        let space = template::search_space(family, a_type);
        if space.is_empty() {
            continue;
        }
        out.push(template::default_config(family, a_type));
        out.extend(template::measured_seeds(family, a_type));
        for &(n, k) in dims {
            for &m in buckets {
                let p = fp4tune::problem::GemmProblem::new(m, n, k, a_type);
                let legal: Vec<GemmConfig> =
                    space.iter().copied().filter(|c| c.check_problem(&p).is_ok()).collect();
                out.extend(model.rank(&legal, &p).into_iter().take(2).map(|(c, _)| c));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn cmd_tune(args: TuneArgs) -> Result<()> {
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
    } = args;
    let a_type = a_type.map(|a| a.single("tune")).transpose()?;
    let strategy = fp4tune::search::StrategyKind::parse(&strategy)?;
    let composite_min_m = (composite_min_m > 0).then_some(composite_min_m);
    use fp4tune::bench::TimingPolicy;
    use fp4tune::tune::run::{self, Event, Planner, Shard, TuneSpec};
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
    let buckets: Vec<u32> = set.token_buckets.iter().copied().filter(|m| *m <= max_m).collect();
    if buckets.is_empty() {
        bail!("no token bucket of set `{}` is <= --max-m {max_m}", set.name);
    }
    let mut common = Vec::new();
    for t in [AType::Bf16, AType::Nvfp4] {
        if a_type.is_none_or(|x| x == t) {
            common.extend(common_configs(&dims, &buckets, t));
        }
    }
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
        planner: {
            Box::new(move |key, legal, info, ctx| -> Planner {
                use fp4tune::search::{CostModel, DeviceModel, StrategyKind};
                let p = fp4tune::problem::GemmProblem::new(key.m, key.n, key.k, key.a_type);
                // The analytic model of the GPU at hand, from what was measured on it just now.
                let measured = || {
                    CostModel::new(DeviceModel::from_device_info(
                        info,
                        ctx.bandwidth_gbps,
                        ctx.tensor_peak_tflops,
                        ctx.launch_floor_us,
                    ))
                };
                match &strategy {
                    StrategyKind::Exhaustive => Planner::exhaustive(legal),
                    kind => {
                        let kind = match kind {
                            StrategyKind::Model { options, .. } => {
                                StrategyKind::Model { model: measured(), options: *options }
                            }
                            other => other.clone(),
                        };
                        let first: Vec<_> = common
                            .iter()
                            .filter(|c| c.family == key.family && legal.contains(c))
                            .copied()
                            .collect();
                        let s = kind.build(legal, &p, fp4tune::search::Budget::fraction(budget));

                        Planner::new(first, s, 16)
                    }
                }
            })
        },
        batch: 256,
        precompile: exhaustive,
        composite_min_m,
    };
    let compiler = Compiler::with_default_cache()?;
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
    })?;
    keys_bar.finish_and_clear();
    cand_bar.finish_and_clear();
    let (table, sel) =
        fp4tune::tune::emit::dispatch_table(&output.records, &SelectRules::default())?;
    println!(
        "{} on {}: {} new records ({} in the log {}), {:.1} s wall",
        output.family,
        output.device.name,
        output.new_records,
        output.records.len(),
        output.log_path.display(),
        output.wall.as_secs_f64()
    );
    print_selection(&output.records, &sel);
    let path = out.join(format!("{}.ron", run::sku_slug(&output.device.name)));
    table.save(&path)?;
    println!("wrote the dispatch table {}", path.display());
    Ok(())
}

/// The end-of-campaign summary: per key the winner, its time, roofline fraction and speedup over
/// the default configuration.
fn print_selection(records: &[fp4tune::tune::log::Record], sel: &fp4tune::tune::select::Selection) {
    let ctx = records.iter().find_map(|r| r.context.clone());
    if let Some(d) = sel.default {
        println!(
            "default configuration (best geomean over all keys): {d} ({:.2} us geomean)",
            sel.default_geomean_us
        );
    }
    println!(
        "{:>6} {:>6} {:>6}  {:<52} {:>9} {:>9} {:>10} {:>7}",
        "N", "K", "M", "winner", "us", "roofline", "vs default", "timed"
    );
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
        println!(
            "{:>6} {:>6} {:>6}  {:<52} {:>9.2} {:>8.0}% {:>9.2}x {:>7}",
            c.key.n,
            c.key.k,
            c.key.m,
            winner,
            c.time.median,
            roof,
            c.speedup_over_default(),
            c.timed
        );
    }
    if !sel.choices.is_empty() {
        println!("geomean speedup of the tuned choice over the default configuration: {:.3}x over {} entries", (log_sum / sel.choices.len() as f64).exp(), sel.choices.len());
    }
}

fn cmd_merge(logs: Vec<PathBuf>, out: PathBuf, table: Option<PathBuf>) -> Result<()> {
    use fp4tune::tune::select::SelectRules;
    let records = fp4tune::tune::merge::merge(&logs)?;
    fp4tune::tune::merge::write(&out, &records)?;
    println!("merged {} logs into {} ({} records)", logs.len(), out.display(), records.len());
    if let Some(path) = table {
        let (t, sel) = fp4tune::tune::emit::dispatch_table(&records, &SelectRules::default())?;
        print_selection(&records, &sel);
        t.save(&path)?;
        println!("wrote the dispatch table {}", path.display());
    }
    Ok(())
}

fn cmd_simulate(log: PathBuf, strategies: Vec<String>, budget: f64) -> Result<()> {
    use fp4tune::search::{Budget, StrategyKind};
    use fp4tune::tune::replay::{simulate_kind, Candidates};
    let records = fp4tune::tune::log::read(&log)?;
    if records.is_empty() {
        bail!("{}: no records", log.display());
    }
    for name in strategies {
        let kind = StrategyKind::parse(&name)?;
        let report = simulate_kind(&records, &kind, Candidates::Logged, &Budget::fraction(budget));
        println!("## {name}\n\n{}", report.to_markdown());
    }
    Ok(())
}

fn cmd_table_check(path: PathBuf, device: Option<usize>) -> Result<()> {
    let table = fp4tune::table::Table::load(&path)?;
    print!("{}", fp4tune::table::summary(&table));
    if let Some(ordinal) = device {
        let gpu = fp4tune::gpu::Gpu::open(ordinal)?;
        let report = table.check_against(
            gpu.info(),
            fp4tune::table::MismatchPolicy::Warn,
            &path.display().to_string(),
        )?;
        for w in report.warnings() {
            println!("warning: {w}");
        }
    }
    println!("{}: ok", path.display());
    Ok(())
}
