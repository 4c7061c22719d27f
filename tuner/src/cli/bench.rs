//! `fp4tune bench`: one benchmark run against floors and peers, written as CSV and markdown.

use super::ATypeArg;
use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use fp4tune::shapes::ShapeFile;
use fp4tune::template::{self, Pipeline};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ConfigsArg {
    Space,
    /// The family defaults a shape outside the table falls back to: the decode defaults (the
    /// runtime's first choice up to M = 64), the prefill defaults (above it), the generic
    /// configuration, on sm120 its 64-k stage form, and its K-tail form.
    Default,
}

/// Which weight pipelines of the search space a bench run measures.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PipelineArg {
    All,
    /// cp.async shared-memory stages (`s<stages>` in kernel names).
    CpAsync,
    /// Weights streamed into registers (`r<depth>` in kernel names).
    Registers,
    /// Weights streamed into warp rings, per-warp shared-memory rings (`p<depth>` in kernel names).
    WarpRing,
    /// Weights and activations streamed into registers (`g<depth>` in kernel names).
    Global,
    /// Every streamed pipeline (registers, warp rings, global).
    Direct,
    /// The cp.async stages' K-tail form, for a K that 64 does not divide (`kt<stages>`).
    KTail,
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
            PipelineArg::KTail => p == Pipeline::KTail,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Shape file (default: the embedded GLM-5 file).
    #[arg(long)]
    pub shapes: Option<PathBuf>,
    /// Sets of the shape file to run, comma separated.
    #[arg(long = "set", visible_alias = "sets", default_value = "tp8", value_delimiter = ',')]
    pub sets: Vec<String>,
    /// Only shapes whose name contains one of these (e.g. routed), comma separated.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Token counts M, comma separated (default: 1,2,4,8,16,32,64,128,256,512,1024).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    pub m: Vec<u32>,
    /// Activation type (default: the family's own, w4a16 on sm90, w4a4 on sm120).
    #[arg(long, value_enum)]
    pub a_type: Option<ATypeArg>,
    /// Which configurations: the whole search space, or only the family defaults.
    #[arg(long, value_enum, default_value = "space")]
    pub configs: ConfigsArg,
    /// Only configurations of this weight pipeline.
    #[arg(long, value_enum, default_value = "all")]
    pub pipeline: PipelineArg,
    /// Skip the peers: cuBLAS / cuBLASLt (GEMM), the per-expert loop (`--moe`).
    #[arg(long)]
    pub no_peers: bool,
    /// Fewer samples per candidate.
    #[arg(long)]
    pub quick: bool,
    /// Per problem, measure only this many configurations, the fastest by the analytic cost
    /// model (0 = all legal ones).
    #[arg(long, default_value_t = 400)]
    pub max_candidates: usize,
    /// Report folder; writes bench-<a_type>.csv and .md there.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Benchmark the grouped MoE layer of each set (align, gate_up, down, finalize) instead of
    /// single GEMMs; writes bench-moe.csv and .md (`--m` are then token counts B).
    #[arg(long)]
    pub moe: bool,
    /// With --moe: a CSV of peers measured in the same session (scripts/moe_peers.py).
    #[arg(long)]
    pub peers: Option<PathBuf>,
    /// With --moe: dispatch tables whose GEMM entries the per-expert loop peer (`fp4tune_loop`,
    /// one GEMM per active expert) launches, comma separated and merged (e.g.
    /// results/nvidia-h200.ron,results/nvidia-h200-ep8.ron); without one, or when none has a GEMM
    /// entry (a `tune --moe-only` table), it runs the family defaults. Their grouped entries join
    /// the grouped candidates.
    #[arg(long = "table", value_delimiter = ',')]
    pub tables: Vec<PathBuf>,
    /// With --moe: measure nothing, re-render bench-moe.md at --out from this bench-moe.csv,
    /// keeping the title and provenance lines of the bench-moe.md already there (no GPU needed).
    #[arg(
        long,
        requires = "moe",
        conflicts_with_all = [
            "shapes", "sets", "only", "m", "a_type", "configs", "pipeline", "peers", "tables",
            "no_peers", "quick", "max_candidates", "device"
        ]
    )]
    pub render: Option<PathBuf>,
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

pub fn run(a: BenchArgs) -> Result<()> {
    use fp4tune::bench::{report, run, TimingPolicy};
    if a.moe {
        return super::moe::run(a);
    }
    if a.peers.is_some() {
        bail!("--peers is for --moe runs");
    }
    if !a.tables.is_empty() {
        bail!("--table is for --moe runs (the per-expert loop peer)");
    }
    let a_type = a.a_type.map(|t| t.single("bench")).transpose()?;
    let file = match &a.shapes {
        Some(p) => ShapeFile::load(p)?,
        None => ShapeFile::glm5()?,
    };
    let shapes = select_shapes(&file, &a.sets, &a.only)?;
    let gpu = fp4tune::gpu::Gpu::open(a.device)?;
    let info = gpu.info().clone();
    let family = fp4tune::runtime::family_for(&info)?;
    let a_type = a_type.unwrap_or(template::family_a_type(family));
    let mut configs = match a.configs {
        ConfigsArg::Space => template::search_space(family, a_type),
        ConfigsArg::Default => template::family_defaults(family, a_type),
    };
    configs.retain(|c| c.check().is_ok());
    if configs.is_empty() {
        bail!(
            "{}: the {family} family has no {a_type} configuration (its kernels are {})",
            info.name,
            template::family_a_type(family)
        );
    }
    configs.retain(|c| a.pipeline.admits(c.pipeline));
    if configs.is_empty() {
        bail!(
            "no {} configuration of the {family} family uses the {:?} pipeline",
            a_type,
            a.pipeline
        );
    }
    let compiler = crate::default_compiler()?;
    let spec = run::BenchSpec {
        shapes,
        ms: if a.m.is_empty() { run::DEFAULT_MS.to_vec() } else { a.m.clone() },
        a_type,
        configs,
        peers: !a.no_peers,
        policy: if a.quick { TimingPolicy::quick() } else { TimingPolicy::default() },
        refine: run::DEFAULT_REFINE,
        max_candidates: a.max_candidates,
        screen_policy: TimingPolicy::screen(),
    };
    let bar = indicatif::ProgressBar::new((spec.shapes.len() * spec.ms.len()) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} {msg} (eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    fp4tune::fsio::create_dir(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
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
            let _ = fp4tune::fsio::write_atomic(
                &stem.with_extension("csv"),
                report::csv(&p.0).as_bytes(),
            );
            let _ = fp4tune::fsio::write_atomic(
                &a.out.join(format!("bench-{}-screen.csv", a_type)),
                report::csv(&p.1).as_bytes(),
            );
        }
    })?;
    bar.finish_and_clear();
    crate::warn_cache(&compiler);
    let prov = report::Provenance {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        device: info,
        nvrtc_version: compiler.nvrtc_version(),
        nvrtc_build: compiler.nvrtc_build().to_string(),
        timing_policy: spec.policy.describe(),
        bandwidth_gbps: out.bandwidth_gbps,
        launch_floor_us: out.launch_floor_us,
        tensor_peak_tflops: out.tensor_peak_tflops,
        template_hash: template::family_template_hash(family),
        date: report::utc_now(),
    };
    let peers: Vec<&str> = if spec.peers { fp4tune::bench::peers::PEERS.to_vec() } else { vec![] };
    let mut md = report::markdown(
        &format!("fp4tune {family} benchmark ({})", a_type),
        &prov,
        &out.rows,
        &peers,
    );
    md.push_str(&report::failures_markdown(&out.failures));
    let (csv, screen) = (report::csv(&out.rows), report::csv(&out.screen_rows));
    fp4tune::fsio::write_atomic_all(&[
        (&stem.with_extension("csv"), csv.as_bytes()),
        (&a.out.join(format!("bench-{}-screen.csv", a_type)), screen.as_bytes()),
        (&stem.with_extension("md"), md.as_bytes()),
    ])
    .with_context(|| format!("writing the benchmark's reports into {}", a.out.display()))?;
    outln!("{md}")?;
    outln!(
        "wrote {} and {}",
        stem.with_extension("csv").display(),
        stem.with_extension("md").display()
    )
}
