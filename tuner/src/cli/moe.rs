//! `fp4tune bench --moe`: the grouped MoE layer of each chosen shape set, every candidate verified
//! then timed, against the roofline, the read floor and the peers of `--peers` (a CSV written by
//! scripts/moe_peers.py on the same machine just before), written as bench-moe.csv and .md.

use super::bench::{BenchArgs, PipelineArg};
use anyhow::{bail, Context, Result};
use fp4tune::bench::moe::{run_moe_bench_for, MoeBenchPlan, MoeProgress};
use fp4tune::bench::{moe_report, report, TimingPolicy};
use fp4tune::moe::MoeShape;
use fp4tune::problem::AType;
use fp4tune::shapes::ShapeFile;
use fp4tune::template::Family;

/// Token counts of a MoE benchmark without `--m`: decode 1..256 and two prefill sizes.
pub const DEFAULT_TOKENS: &[u32] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096];

pub fn run(a: BenchArgs) -> Result<()> {
    if let Some(csv) = &a.render {
        return render(csv, &a.out);
    }
    let file = match &a.shapes {
        Some(p) => ShapeFile::load(p)?,
        None => ShapeFile::glm5()?,
    };
    let mut sets = Vec::new();
    let mut experts_total = 0;
    for name in &a.sets {
        let set = file.set(name).with_context(|| {
            format!(
                "shape set `{name}` not in the shape file (it has: {})",
                file.set_names().join(", ")
            )
        })?;
        let Some((shape, total)) = MoeShape::from_set(set) else {
            bail!("shape set `{name}` has no routed gate_up / down pair for a MoE layer");
        };
        if experts_total != 0 && total != experts_total {
            bail!("shape sets of different models ({experts_total} and {total} routed experts)");
        }
        experts_total = total;
        sets.push((name.clone(), shape, 0));
    }
    let peers = match &a.peers {
        Some(p) => {
            let text = fp4tune::fsio::read_input(p)
                .with_context(|| format!("reading peers {}", p.display()))?;
            moe_report::parse_csv(&text, &p.display().to_string()).map_err(anyhow::Error::msg)?
        }
        None => Vec::new(),
    };
    // The tables are read before the GPU is opened: a missing or malformed one is named first.
    let tables: Vec<_> = a
        .tables
        .iter()
        .map(|p| fp4tune::table::Table::load(p).map(|t| (p.clone(), t)))
        .collect::<Result<_, _>>()?;
    let gpu = fp4tune::gpu::Gpu::open(a.device)?;
    let info = gpu.info().clone();
    let family = fp4tune::runtime::family_for(&info)?;
    // sm120 grouped kernels are W4A4 (the native block-scaled MMA); sm90 runs both.
    let a_types: Vec<AType> = a
        .a_type
        .map_or_else(|| vec![fp4tune::template::family_a_type(family)], |t| t.types())
        .into_iter()
        .filter(|t| family == Family::Sm90 || *t == AType::Nvfp4)
        .collect();
    if a_types.is_empty() {
        bail!("{}: the {family} grouped MoE kernels are W4A4 (use --a-type w4a4)", info.name);
    }
    // The grouped kernels' weights wait in the register ring (`global`) or the warp ring.
    let warp_ring = match a.pipeline {
        PipelineArg::All => None,
        PipelineArg::Global => Some(false),
        PipelineArg::WarpRing => Some(true),
        other => bail!(
            "--pipeline {other:?}: the grouped kernels keep their weights in the register ring \
             (global) or the warp ring (warp-ring)"
        ),
    };
    let compiler = crate::default_compiler()?;
    // The grouped entries of the given tables are measured besides the spread of the space.
    let mut extra = Vec::new();
    for e in tables.iter().flat_map(|(_, t)| &t.moe) {
        if !extra.contains(&e.config) {
            extra.push(e.config);
        }
    }
    // The per-expert loop peer launches through the runtime dispatcher of the given tables
    // (none with --no-peers).
    let expert_loop = if a.no_peers {
        None
    } else {
        let dispatcher = fp4tune::bench::moe::moe_loop::open_dispatcher(&tables, a.device)?;
        let line = format!("per-expert loop peer: {}\n", dispatcher.report());
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        Some(std::sync::Arc::new(dispatcher))
    };
    let plan = MoeBenchPlan {
        sets,
        experts_total,
        tokens: if a.m.is_empty() { DEFAULT_TOKENS.to_vec() } else { a.m.clone() },
        policy: if a.quick { TimingPolicy::quick() } else { TimingPolicy::default() },
        max_candidates: a.max_candidates,
        warp_ring,
        extra,
        expert_loop,
    };
    let started = std::time::Instant::now();
    // Progress on standard error, best effort: a closed stream must not stop the benchmark.
    use std::io::Write as _;
    let mut rows = Vec::new();
    let mut screens = Vec::new();
    for &a_type in &a_types {
        let (r, logs) = run_moe_bench_for(&gpu, &compiler, &plan, a_type, |p| match p {
            MoeProgress::Step { set, tokens, active_experts } => {
                let _ = writeln!(
                    std::io::stderr(),
                    "[{:>6.1}s] {set} B={tokens}: {active_experts} active experts",
                    started.elapsed().as_secs_f64()
                );
            }
            MoeProgress::Op { op, verified, failed, best } => {
                let _ = writeln!(
                    std::io::stderr(),
                    "          {op}: {verified} verified, {failed} failed{}",
                    best.map_or(String::new(), |(c, us)| format!(", best {us:.2} us {c}"))
                );
            }
        })?;
        rows.extend(r);
        screens.push((a_type, logs));
    }
    crate::warn_cache(&compiler);
    let provenance = format!(
        "Command: `{}`\n\nDevice: {} (compute capability {}.{}, {} SMs, driver {}.{}), NVRTC {}; timing: {}; \
         grouped template hash {}; {}.\n\nRoofline: the bytes each projection must move (active experts' NVFP4 \
         weights and scales, activation rows in, bf16 rows out) over the read bandwidth measured in this run; \
         read floor: a cold read of the same byte count measured in this run. Every candidate was verified \
         against the CPU reference before it was timed; the layer row is align + gate_up + down + finalize \
         (its roofline is the two projections' sum). fp4tune_loop is fp4tune's per-expert loop: one \
         GEMM per active expert through the runtime dispatcher ({}), all experts in one CUDA graph, \
         weights rotated like the grouped candidates, activations already gathered per expert (no \
         gather, SiLU or weighted sum), verified against the same CPU reference first.\n",
        std::env::args().collect::<Vec<_>>().join(" "),
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.sm_count,
        info.driver_version.0,
        info.driver_version.1,
        compiler.nvrtc_build(),
        plan.policy.describe(),
        fp4tune::moe::templates::family_template_hash(family),
        report::utc_now(),
        if a.tables.is_empty() {
            "no table: the family defaults".to_string()
        } else {
            let names = a.tables.iter().map(|t| t.display().to_string()).collect::<Vec<_>>();
            if tables.iter().all(|(_, t)| t.entries.is_empty()) {
                format!("{}: no GEMM entries, so the family defaults", names.join(" + "))
            } else {
                names.join(" + ")
            }
        },
    );
    let md = moe_report::markdown(
        &format!(
            "fp4tune grouped MoE benchmark ({family}, {})",
            a_types.iter().map(|t| t.as_str().to_uppercase()).collect::<Vec<_>>().join(" + ")
        ),
        &provenance,
        &rows,
        &peers,
    );
    fp4tune::fsio::create_dir(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut all = rows.clone();
    all.extend(peers);
    let stem = a.out.join("bench-moe");
    // The report, its CSV and every screened candidate (one file per activation type), replaced
    // together.
    let mut files =
        vec![(stem.with_extension("csv"), moe_report::csv(&all)), (stem.with_extension("md"), md)];
    for (a_type, logs) in &screens {
        files.push((
            a.out.join(format!("bench-moe-{}-screen.csv", a_type.as_str())),
            moe_report::screen_csv(a_type.as_str(), logs),
        ));
    }
    let refs: Vec<(&std::path::Path, &[u8])> =
        files.iter().map(|(p, t)| (p.as_path(), t.as_bytes())).collect();
    fp4tune::fsio::write_atomic_all(&refs)
        .with_context(|| format!("writing the benchmark's reports into {}", a.out.display()))?;
    let written: Vec<&std::path::PathBuf> = files.iter().map(|(p, _)| p).collect();
    let md = &files[1].1;
    outln!("{md}")?;
    let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    outln!("wrote {}", names.join(", "))
}

/// `--render`: bench-moe.md at `out` rendered again from `csv` (a bench-moe.csv), with the title
/// and provenance lines of the report already there.
fn render(csv: &std::path::Path, out: &std::path::Path) -> Result<()> {
    let text =
        fp4tune::fsio::read_input(csv).with_context(|| format!("reading {}", csv.display()))?;
    let rows =
        moe_report::parse_csv(&text, &csv.display().to_string()).map_err(anyhow::Error::msg)?;
    let md_path = out.join("bench-moe.md");
    if !rows.iter().any(|r| r.implementation.starts_with("fp4tune_")) {
        bail!(
            "{}: holds no fp4tune rows: nothing to render, {} left as it was",
            csv.display(),
            md_path.display()
        );
    }
    let old = fp4tune::fsio::read_input(&md_path).with_context(|| {
        format!("reading {} (its provenance lines are kept)", md_path.display())
    })?;
    let head = old.split("\n## ").next().unwrap_or("");
    let Some((title, provenance)) = head.strip_prefix("# ").and_then(|h| h.split_once("\n\n"))
    else {
        bail!("{}: no `# title` line followed by provenance lines", md_path.display());
    };
    let peers: Vec<_> = rows
        .iter()
        .filter(|r| {
            !r.implementation.starts_with("fp4tune_")
                && !moe_report::FIXED_KERNEL_ROWS.contains(&r.implementation.as_str())
        })
        .cloned()
        .collect();
    let md = moe_report::markdown(title, provenance.trim_end(), &rows, &peers);
    fp4tune::fsio::write_atomic(&md_path, md.as_bytes())
        .with_context(|| format!("writing {}", md_path.display()))?;
    outln!("rendered {} from {}", md_path.display(), csv.display())
}

/// The grouped phase's activation type on `info`'s kernel family (sm120: W4A4 only, the native
/// block-scaled MMA; sm90 defaults to W4A16), or one line, naming where the layer comes from
/// (`origin`: the shape file and set), saying why the family's grouped kernels cannot run `shape`
/// (checked before anything is measured).
pub fn phase_a_type(
    shape: &MoeShape,
    a_type: Option<AType>,
    info: &fp4tune::gpu::DeviceInfo,
    origin: &str,
) -> Result<AType> {
    let family = fp4tune::runtime::family_for(info)?;
    let a_type = match (family, a_type) {
        (Family::Sm120, Some(AType::Bf16)) => {
            bail!("{}: the sm120 grouped MoE kernels are W4A4 (use --a-type w4a4)", info.name)
        }
        (Family::Sm120, _) => AType::Nvfp4,
        (_, a) => a.unwrap_or(AType::Bf16),
    };
    if let Err(e) = fp4tune::moe::space::check_layer(family, a_type, shape) {
        bail!("{origin}: grouped MoE phase: {e}");
    }
    Ok(a_type)
}

/// The grouped phase of `fp4tune tune`: tune the layer, then write its entries into `table` (the
/// GEMM campaign's), else into the table already at the output path, else into a new table; the
/// screened candidates (failures included) are appended to `<sku>-moe.jsonl`.
pub fn tune_phase(
    (shape, origin): (MoeShape, &str),
    experts_total: u32,
    a_type: Option<AType>,
    buckets: &[u32],
    device: usize,
    out: &std::path::Path,
    table: Option<fp4tune::table::Table>,
) -> Result<()> {
    use fp4tune::bench::floors::Floors;
    use fp4tune::runtime::moe::{MoeKernels, MoeLauncher};
    use fp4tune::table::{DeviceIdentity, Table, Toolchain};
    use fp4tune::tune::moe::{tune_moe, MoeTuneEvent, MoeTuneSpec};
    let gpu = fp4tune::gpu::Gpu::open(device)?;
    let info = gpu.info().clone();
    let a_type = phase_a_type(&shape, a_type, &info, origin)?;
    let compiler = crate::default_compiler()?;
    let spec = MoeTuneSpec::for_layer(shape, a_type, experts_total, buckets, info.sm_count);
    let started = std::time::Instant::now();
    let read_gbps = Floors::new(&gpu, &compiler)?.read_bandwidth(&spec.policy, 2 << 30)?;
    let kernels = MoeKernels::load(&gpu, &compiler)?;
    let launcher = MoeLauncher { gpu: &gpu, kernels: &kernels };
    // How many of its first screens' kernels the cubin cache holds (compiled ahead in the GEMM
    // keys' background, by `compile --configs pools`, or by an earlier run).
    let mut names = std::collections::HashSet::new();
    let distinct: Vec<_> =
        fp4tune::tune::moe::first_pools(fp4tune::runtime::family_for(&info)?, &spec)
            .iter()
            .map(|c| c.source())
            .filter(|s| names.insert(s.kernel_name.clone()))
            .collect();
    let cached = if compiler.cache_readable() {
        format!(
            "{} of the {} kernels of its first screens in the cubin cache",
            compiler.count_cached(&distinct),
            distinct.len()
        )
    } else {
        "no cubin cache in use".to_string()
    };
    // Progress lines before the entries are saved are best effort: one that cannot be written
    // (a closed standard output) must not stop the measuring; the last line reports the error.
    let _ = outln!(
        "grouped MoE phase: {shape}, buckets {:?}, read bandwidth {read_gbps:.0} GB/s, {cached}",
        spec.buckets
    );
    let (entries, logs) = tune_moe(&gpu, &compiler, &launcher, &spec, read_gbps, &|e| match e {
        MoeTuneEvent::Key { .. } => {}
        MoeTuneEvent::Chosen { entry, screened, failed, spilled } => {
            let failed = failed_phrase(failed, spilled);
            let _ = outln!(
            "[{:>6.1}s] {}: {screened} screened ({failed}), {} {:.2} us (skewed {:.2} us), {:.0}% of roofline",
            started.elapsed().as_secs_f64(),
            entry.key,
            entry.config,
            entry.median_us,
            entry.skewed_us,
            100.0 * entry.roofline_fraction
        );
        }
    })?;
    crate::warn_cache(&compiler);
    let slug = fp4tune::tune::run::sku_slug(&info.name);
    let path = out.join(format!("{slug}.ron"));
    let mut table = match table {
        Some(t) => t,
        None if path.exists() => Table::load(&path)?,
        None => Table::new(
            DeviceIdentity {
                name: info.name.clone(),
                compute_capability: info.compute_capability,
                sm_count: info.sm_count,
            },
            Toolchain { nvrtc: compiler.nvrtc_version(), driver: info.driver_version },
            spec.policy.describe(),
        ),
    };
    if table.device.name != info.name {
        bail!(
            "{} was measured on {}, this GPU is {}",
            path.display(),
            table.device.name,
            info.name
        );
    }
    let keys: std::collections::HashSet<_> = entries.iter().map(|e| e.key).collect();
    table.moe.retain(|e| !keys.contains(&e.key));
    // the table records one grouped template hash (that of its entries' family, this device's):
    // entries kept from a tune with other templates take this build's hash, so say which ones
    // they are
    let now = table.current_moe_template_hash();
    let stale_kept =
        table.moe_templates_stale().then(|| {
            format!(
            "{}: {} grouped entries kept from a tune with other grouped templates ({}) now carry \
             this build's hash; re-tune them too if those templates' kernels differ",
            path.display(),
            table.moe.len(),
            table.moe_template_hash.as_deref().map_or("none recorded", |h| h.get(..16).unwrap_or(h))
        )
        });
    table.moe.extend(entries);
    table.moe_template_hash = (!table.moe.is_empty()).then_some(now);
    table.save(&path)?;
    // the screens of earlier grouped tunes into this folder (another activation type, other
    // buckets) stay in the log: this tune's lines follow theirs
    let log_path = out.join(format!("{slug}-moe.jsonl"));
    let mut jsonl = match fp4tune::fsio::read_input(&log_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", log_path.display())),
    };
    if !jsonl.is_empty() && !jsonl.ends_with('\n') {
        jsonl.push('\n');
    }
    let at = fp4tune::bench::report::unix_now();
    jsonl.push_str(&fp4tune::tune::moe::log_lines(
        &logs,
        (&info.name, info.compute_capability),
        &compiler.nvrtc_build().to_string(),
        at,
    )?);
    fp4tune::fsio::write_atomic(&log_path, jsonl.as_bytes())
        .with_context(|| format!("writing {}", log_path.display()))?;
    if let Some(w) = stale_kept {
        warnln!("{w}");
    }
    outln!(
        "grouped MoE phase: {} entries in {:.1} s; wrote {} and {}",
        keys.len(),
        started.elapsed().as_secs_f64(),
        path.display(),
        log_path.display()
    )
}

/// "2 failed", "2 failed: spilling kernels", "3 failed, 2 of them spilling kernels": how many
/// of a key's screened candidates failed, and how many of those because their kernel spills.
fn failed_phrase(failed: usize, spilled: usize) -> String {
    match spilled {
        0 => format!("{failed} failed"),
        s if s == failed => format!("{failed} failed: spilling kernels"),
        s => format!("{failed} failed, {s} of them spilling kernels"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn failed_phrase_says_how_many_failures_spill() {
        assert_eq!(super::failed_phrase(0, 0), "0 failed");
        assert_eq!(super::failed_phrase(2, 0), "2 failed");
        assert_eq!(super::failed_phrase(2, 2), "2 failed: spilling kernels");
        assert_eq!(super::failed_phrase(3, 2), "3 failed, 2 of them spilling kernels");
    }
}
