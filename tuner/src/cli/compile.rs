//! `fp4tune compile`: compile (or, with `--emit`, render) a family's variants.

use super::ATypeArg;
use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use fp4tune::compile::{Compiler, Origin};
use fp4tune::moe::config::GroupedConfig;
use fp4tune::moe::{MoeOp, MoeShape};
use fp4tune::problem::AType;
use fp4tune::shapes::ShapeFile;
use fp4tune::template::{self, Arch, Family, GemmConfig, KernelSource};
use std::path::PathBuf;

/// Which kernels `compile` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CompileOps {
    /// The GEMM kernels.
    Gemm,
    /// The grouped MoE kernels of the routed layers of the shape file (or of the embedded GLM-5
    /// TP8 set).
    Moe,
    All,
}

/// Which configurations `compile` takes.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CompileSet {
    Space,
    Seeds,
    Representative,
    /// The first racing pools `fp4tune tune` screens for the shapes (the file's sets, or the
    /// embedded GLM-5 TP8 set), and the first screens of its grouped phase: compile them on a
    /// machine without a GPU to start a tuning campaign with a warm cubin cache.
    Pools,
}

#[derive(clap::Args, Debug)]
pub struct CompileArgs {
    /// Target architecture: sm_90a (Hopper family) or sm_120a (native NVFP4 family).
    #[arg(long, value_parser = super::parse_arch)]
    pub arch: Arch,
    /// Only variants that can run at least one shape of this shape set; the grouped MoE kernels
    /// of its sets' routed layers (without it: of the embedded GLM-5 TP8 layer).
    #[arg(long)]
    pub shapes: Option<PathBuf>,
    /// Which kernels: the GEMM kernels, the grouped MoE kernels, or both.
    #[arg(long, value_enum, default_value = "all")]
    pub ops: CompileOps,
    /// Activation type(s) to compile.
    #[arg(long, value_enum, default_value = "all")]
    pub a_type: ATypeArg,
    /// Cubin cache folder (default: $FP4TUNE_CACHE, else $XDG_CACHE_HOME/fp4tune/cubin, else
    /// ~/.cache/fp4tune/cubin).
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// Which configurations: the whole search space, the family's seeds (default + measured
    /// seeds), its representative configurations, or the racing pools of a tune of the shapes
    /// (and the first screens of its grouped phase).
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

/// An activation type in words, for messages.
fn activations(t: AType) -> &'static str {
    match t {
        AType::Nvfp4 => "W4A4 (nvfp4 activations)",
        AType::Bf16 => "W4A16 (bf16 activations)",
    }
}

/// One kernel variant `compile` takes: a GEMM or a grouped MoE configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Variant {
    Gemm(GemmConfig),
    Grouped(GroupedConfig),
}

impl Variant {
    fn name(&self) -> String {
        match self {
            Variant::Gemm(c) => c.name(),
            Variant::Grouped(c) => c.name(),
        }
    }
    fn kernel_name(&self) -> String {
        match self {
            Variant::Gemm(c) => c.kernel_name(),
            Variant::Grouped(c) => c.kernel_name(),
        }
    }
    fn source(&self) -> Result<KernelSource> {
        match self {
            Variant::Gemm(c) => c.render().with_context(|| format!("rendering {c}")),
            Variant::Grouped(c) => Ok(c.source()),
        }
    }
    /// Dynamic shared memory of a launch (the stages).
    fn smem_bytes(&self) -> u32 {
        match self {
            Variant::Gemm(c) => c.smem_bytes(),
            Variant::Grouped(c) => c.smem_bytes(),
        }
    }
}

/// The activation types `family`'s grouped MoE kernels compute (sm120: W4A4 only).
fn grouped_a_types(family: Family) -> Vec<AType> {
    match family {
        Family::Sm90 => vec![AType::Nvfp4, AType::Bf16],
        Family::Sm120 => vec![AType::Nvfp4],
    }
}

pub fn run(args: CompileArgs) -> Result<()> {
    let CompileArgs { arch, shapes, ops, a_type, cache, configs: set, names, emit } = args;
    let family = Family::for_arch(arch);
    let file = shapes.as_deref().map(ShapeFile::load).transpose()?;
    let requested = a_type.types();
    let (gemm, grouped) = (ops != CompileOps::Moe, ops != CompileOps::Gemm);
    // The activation types this family computes with the kernels asked for: `all` takes those, a
    // single missing one is an error that says what the family does compute.
    let supported: Vec<AType> = [AType::Nvfp4, AType::Bf16]
        .into_iter()
        .filter(|t| {
            (gemm && !template::search_space(family, *t).is_empty())
                || (grouped && grouped_a_types(family).contains(t))
        })
        .collect();
    let family_computes = || {
        let kinds: Vec<&str> = supported.iter().map(|t| activations(*t)).collect();
        format!("{family} computes {} only", kinds.join(" and "))
    };
    if !requested.iter().any(|t| supported.contains(t)) {
        let wanted: Vec<&str> = requested.iter().map(|t| activations(*t)).collect();
        bail!("no {family} kernel computes {}: {}", wanted.join(" or "), family_computes());
    }
    // The shape sets: the file's, or the embedded GLM-5 set `fp4tune tune` takes by default.
    let sets = match &file {
        Some(f) => f.sets.clone(),
        None => {
            vec![ShapeFile::glm5()?.into_set(fp4tune::shapes::DEFAULT_SET, "<embedded GLM-5>")?]
        }
    };
    let layers: Vec<(MoeShape, u32)> = sets.iter().filter_map(MoeShape::from_set).collect();
    if ops == CompileOps::Moe && layers.is_empty() {
        let origin = shapes.as_ref().map_or("<embedded GLM-5>".into(), |p| p.display().to_string());
        bail!("no set of {origin} has a routed expert layer (routed gate_up and down shapes) for the grouped kernels");
    }
    let mut variants: Vec<Variant> = Vec::new();
    for t in requested.iter().copied().filter(|t| supported.contains(t)) {
        if gemm {
            variants.extend(gemm_configs(family, t, set, &sets));
        }
        if grouped && grouped_a_types(family).contains(&t) {
            for &(shape, total) in &layers {
                variants.extend(grouped_configs(family, t, set, shape, total));
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    variants.retain(|c| seen.insert(*c));
    // Each filter in turn, with what it left, so an empty result names the filter that emptied it.
    let a_type_name = a_type.to_possible_value().map_or("?".into(), |v| v.get_name().to_string());
    let mut filters = vec![(format!("activations: {a_type_name}"), variants.len())];
    if !names.is_empty() {
        let named = |n: &String, c: &Variant| *n == c.name() || *n == c.kernel_name();
        let unknown: Vec<&str> = names
            .iter()
            .filter(|n| !variants.iter().any(|c| named(n, c)))
            .map(String::as_str)
            .collect();
        variants.retain(|c| names.iter().any(|n| named(n, c)));
        // a list that names some variants and misses others is a typo, not a filter
        if !variants.is_empty() && !unknown.is_empty() {
            bail!(
                "--names: no {family} variant of these filters is named {} (configuration or kernel names; --emit prints them)",
                unknown.join(", ")
            );
        }
        filters.push((format!("--names {}", names.join(",")), variants.len()));
    }
    if let (Some(file), Some(path)) = (&file, &shapes) {
        // Keep GEMM variants that can run at least one (shape, bucket) of the file (the grouped
        // ones come from its layers).
        variants.retain(|v| match v {
            Variant::Gemm(c) => file
                .sets
                .iter()
                .any(|set| set.problems(c.a_type).any(|(_, p)| c.check_problem(&p).is_ok())),
            Variant::Grouped(_) => true,
        });
        filters.push((format!("--shapes {}", path.display()), variants.len()));
    }
    if variants.is_empty() {
        let all: Vec<&str> = filters.iter().map(|(f, _)| f.as_str()).collect();
        let emptied = filters.iter().position(|(_, n)| *n == 0).unwrap_or(0);
        let left = if emptied == 0 {
            let set = set.to_possible_value().map_or("?".into(), |v| v.get_name().to_string());
            format!("its --configs {set} list is empty")
        } else {
            format!(
                "{} left none of the {} {}",
                filters[emptied].0,
                filters[emptied - 1].1,
                if filters[emptied - 1].1 == 1 { "variant" } else { "variants" }
            )
        };
        let partial = if supported.len() < requested.len() {
            format!("; {}", family_computes())
        } else {
            String::new()
        };
        bail!("no {family} kernel fits these filters ({}): {left}{partial}", all.join(", "));
    }
    let sources = variants.iter().map(Variant::source).collect::<Result<Vec<_>>>()?;
    if let Some(dir) = emit {
        fp4tune::fsio::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // grouped variants that differ only in how they walk the schedule share a kernel; every
        // source is written, or (a full disk, a folder in the way) none is replaced
        let mut names = std::collections::HashSet::new();
        let files: Vec<(std::path::PathBuf, &[u8])> = sources
            .iter()
            .filter(|src| names.insert(src.kernel_name.clone()))
            .map(|src| (dir.join(format!("{}.cu", src.kernel_name)), src.code.as_bytes()))
            .collect();
        let refs: Vec<(&std::path::Path, &[u8])> =
            files.iter().map(|(p, b)| (p.as_path(), *b)).collect();
        fp4tune::fsio::write_atomic_all(&refs)
            .with_context(|| format!("writing the kernel sources into {}", dir.display()))?;
        return outln!("{} kernel sources written to {}", files.len(), dir.display());
    }
    let compiler =
        Compiler::new(Some(cache.unwrap_or_else(fp4tune::compile::cache::DiskCache::default_dir)))?;
    crate::warn_cache(&compiler);
    let t0 = std::time::Instant::now();
    let results = compiler.compile_many(&sources);
    let wall = t0.elapsed().as_secs_f64();
    crate::warn_cache(&compiler);
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
    for (v, r) in variants.iter().zip(&results) {
        match r {
            Ok(k) => {
                let s = k.stats.unwrap_or_default();
                outln!(
                    "{:<52} {:>5} {:>7} {:>9} {:>10.1} {:>6}",
                    v.name(),
                    s.registers,
                    s.spill_stores + s.spill_loads,
                    s.static_smem + v.smem_bytes(),
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
                outln!("{:<52} FAILED: {}", v.name(), e.to_string().lines().next().unwrap_or(""))?;
                use std::io::Write as _;
                let _ = writeln!(std::io::stderr().lock(), "{e}");
            }
        }
    }
    outln!(
        "{} variants for {arch}, {failed} failed, {wall:.1} s wall (NVRTC {}, cache {})",
        variants.len(),
        compiler.nvrtc_build(),
        match (compiler.cache_dir(), compiler.cache_warning()) {
            (Some(d), None) => d.display().to_string(),
            (Some(d), Some(_)) if compiler.cache_readable() => format!("{} read only", d.display()),
            (Some(d), Some(_)) => format!("{} not used", d.display()),
            (None, _) => "none".to_string(),
        }
    )?;
    if failed > 0 {
        bail!("{failed} of {} variants failed to compile", variants.len());
    }
    Ok(())
}

/// The GEMM configurations of `set` for activations `t` (the pools: of `sets`, the shape file's
/// or the embedded GLM-5 TP8 set).
fn gemm_configs(
    family: Family,
    t: AType,
    set: CompileSet,
    sets: &[fp4tune::shapes::ShapeSet],
) -> Vec<Variant> {
    let configs: Vec<GemmConfig> = match set {
        CompileSet::Space => template::search_space(family, t),
        CompileSet::Seeds => {
            let mut v = vec![template::default_config(family, t)];
            v.extend(template::measured_seeds(family, t));
            v
        }
        CompileSet::Representative => template::representative_configs(family, t),
        CompileSet::Pools => {
            let device = match family {
                Family::Sm90 => "NVIDIA H200",
                Family::Sm120 => "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            };
            let model = fp4tune::tune::race_replay::race_model(device);
            let opts = fp4tune::tune::race::RaceOptions::default();
            let space = template::search_space(family, t);
            let mut out = Vec::new();
            for set in sets {
                for (_, p) in set.problems(t) {
                    let legal: Vec<GemmConfig> =
                        space.iter().copied().filter(|c| c.check_problem(&p).is_ok()).collect();
                    let key = fp4tune::table::TableKey::gemm(family, t, p.n, p.k, p.m);
                    let anchors = fp4tune::tune::race_replay::anchors(&key);
                    out.extend(fp4tune::tune::race::pool(
                        &legal,
                        &p,
                        &model,
                        &anchors,
                        &[],
                        None,
                        &opts,
                    ));
                }
            }
            out
        }
    };
    configs.into_iter().map(Variant::Gemm).collect()
}

/// The grouped MoE configurations of `set` for the routed layer `shape` (`total` routed experts
/// in the model) with activations `t`.
fn grouped_configs(
    family: Family,
    t: AType,
    set: CompileSet,
    shape: MoeShape,
    total: u32,
) -> Vec<Variant> {
    let per_op = |f: &dyn Fn(MoeOp) -> Vec<GroupedConfig>| -> Vec<GroupedConfig> {
        MoeOp::ALL.into_iter().flat_map(f).collect()
    };
    let configs = match set {
        CompileSet::Space => {
            per_op(&|op| fp4tune::moe::space::search_space_for(family, t, op, &shape))
        }
        CompileSet::Seeds => per_op(&|op| {
            let mut v = fp4tune::moe::seeds::measured_seeds(family, t, op);
            v.retain(|c| c.check(&shape).is_ok());
            v
        }),
        CompileSet::Representative => {
            per_op(&|op| fp4tune::moe::space::representative(family, t, op, &shape))
        }
        CompileSet::Pools => {
            // no GPU here: the SMs of the family's data-sheet GPU, on which the screens' family
            // defaults depend (a GPU of other SMs may screen another default of a few buckets)
            let sms = match family {
                Family::Sm90 => fp4tune::search::DeviceModel::h200().sm_count,
                Family::Sm120 => fp4tune::search::DeviceModel::rtx_pro_6000_ws().sm_count,
            };
            let spec = fp4tune::tune::moe::MoeTuneSpec::for_layer(shape, t, total, &[], sms);
            fp4tune::tune::moe::first_pools(family, &spec)
        }
    };
    configs.into_iter().map(Variant::Grouped).collect()
}
