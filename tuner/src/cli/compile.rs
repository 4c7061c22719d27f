//! `fp4tune compile`: compile (or, with `--emit`, render) a family's variants.

use super::ATypeArg;
use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use fp4tune::compile::{Compiler, Origin};
use fp4tune::shapes::ShapeFile;
use fp4tune::template::{self, Arch, Family, GemmConfig};
use std::path::PathBuf;

/// Which configurations `compile` takes.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CompileSet {
    Space,
    Seeds,
    Representative,
}

#[derive(clap::Args, Debug)]
pub struct CompileArgs {
    /// Target architecture: sm_90a (Hopper family) or sm_120a (native NVFP4 family).
    #[arg(long, value_parser = super::parse_arch)]
    pub arch: Arch,
    /// Only variants that can run at least one shape of this shape set.
    #[arg(long)]
    pub shapes: Option<PathBuf>,
    /// Activation type(s) to compile.
    #[arg(long, value_enum, default_value = "all")]
    pub a_type: ATypeArg,
    /// Cubin cache folder (default: $FP4TUNE_CACHE or ~/.cache/fp4tune/cubin).
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// Which configurations: the whole search space, the family's seeds (default + measured
    /// seeds) or its representative configurations.
    #[arg(long, value_enum, default_value = "space")]
    pub configs: CompileSet,
    /// Only the configurations with these names or kernel names (comma separated, e.g.
    /// sm90_w4a16_m8n16k1024_w1x1x4_g2_sk6_swap_o4).
    #[arg(long, value_delimiter = ',')]
    pub names: Vec<String>,
    /// Write each rendered kernel source to DIR/<kernel name>.cu instead of compiling (no
    /// NVRTC needed).
    #[arg(long, value_name = "DIR")]
    pub emit: Option<PathBuf>,
}

pub fn run(args: CompileArgs) -> Result<()> {
    let CompileArgs { arch, shapes, a_type, cache, configs: set, names, emit } = args;
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
        return outln!("{} kernel sources written to {}", sources.len(), dir.display());
    }
    let compiler =
        Compiler::new(Some(cache.unwrap_or_else(fp4tune::compile::cache::DiskCache::default_dir)))?;
    let t0 = std::time::Instant::now();
    let results = compiler.compile_many(&sources);
    let wall = t0.elapsed().as_secs_f64();
    outln!(
        "{:<52} {:>5} {:>7} {:>9} {:>10} {:>6}",
        "kernel",
        "regs",
        "spills",
        "smem_B",
        "compile_ms",
        "from"
    )?;
    let mut failed = 0;
    for (cfg, r) in configs.iter().zip(&results) {
        match r {
            Ok(k) => {
                let s = k.stats.unwrap_or_default();
                outln!(
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
                )?;
            }
            Err(e) => {
                failed += 1;
                outln!(
                    "{:<52} FAILED: {}",
                    cfg.name(),
                    e.to_string().lines().next().unwrap_or("")
                )?;
                use std::io::Write as _;
                let _ = writeln!(std::io::stderr().lock(), "{e}");
            }
        }
    }
    let (maj, min) = compiler.nvrtc_version();
    outln!(
        "{} variants for {arch}, {failed} failed, {wall:.1} s wall (NVRTC {maj}.{min}, cache {})",
        configs.len(),
        compiler.cache_dir().map(|d| d.display().to_string()).unwrap_or_default()
    )?;
    if failed > 0 {
        bail!("{failed} of {} variants failed to compile", configs.len());
    }
    Ok(())
}
