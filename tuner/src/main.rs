//! The `fp4tune` command line: argument parsing, progress display and printing only.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use fp4tune::compile::{Compiler, Origin};
use fp4tune::problem::AType;
use fp4tune::template::{self, Arch, Family};
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
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ATypeArg {
    W4a4,
    W4a16,
    All,
}

impl ATypeArg {
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

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Compile { arch, shapes, a_type, cache } => {
            cmd_compile(arch, shapes, a_type, cache)
        }
    }
}

fn cmd_compile(
    arch: Arch,
    shapes: Option<PathBuf>,
    a_type: ATypeArg,
    cache: Option<PathBuf>,
) -> Result<()> {
    let family = Family::for_arch(arch);
    let _ = shapes;
    let configs: Vec<_> =
        a_type.types().into_iter().flat_map(|t| template::search_space(family, t)).collect();
    if configs.is_empty() {
        bail!("the {family} family has no variants for {a_type:?}");
    }
    let sources = configs
        .iter()
        .map(|c| c.render().with_context(|| format!("rendering {c}")))
        .collect::<Result<Vec<_>>>()?;
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
