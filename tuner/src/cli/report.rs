//! `fp4tune report`: SVG figures from tables, measurement logs and bench CSVs (no GPU).

use anyhow::{bail, Result};
use fp4tune::plot::figures::{self, BenchFile};
use fp4tune::search::StrategyKind;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Folder for the SVG files.
    #[arg(long)]
    pub out: PathBuf,
    /// Dispatch tables (repeat the flag or separate with commas): their entries join the
    /// time-vs-M figures.
    #[arg(long, value_delimiter = ',')]
    pub table: Vec<PathBuf>,
    /// Measurement logs (.jsonl or .jsonl.gz): one best-so-far figure each.
    #[arg(long, value_delimiter = ',')]
    pub log: Vec<PathBuf>,
    /// Benchmark CSVs: bench-<a_type>.csv (time vs M per shape) or bench-moe.csv and its peers
    /// (the MoE decode step per B).
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    pub bench: Vec<PathBuf>,
    /// Strategies replayed on each log (exhaustive, random, model; comma separated).
    #[arg(long, default_value = "model,random", value_delimiter = ',')]
    pub strategy: Vec<String>,
    /// Evaluation budget of the replayed strategies, as a fraction of each key's logged candidates.
    #[arg(long, default_value_t = 0.2)]
    pub budget: f64,
}

pub fn run(a: ReportArgs) -> Result<()> {
    if a.table.is_empty() && a.log.is_empty() && a.bench.is_empty() {
        bail!("nothing to plot: give --table, --log or --bench");
    }
    if !(a.budget > 0.0 && a.budget <= 1.0) {
        bail!("--budget {} is not in (0, 1]", a.budget);
    }
    // each input once (a file given twice would draw its points twice)
    let inputs: Vec<&PathBuf> = a.bench.iter().chain(&a.log).chain(&a.table).collect();
    for (i, x) in inputs.iter().enumerate() {
        for y in &inputs[i + 1..] {
            if fp4tune::fsio::same_file(x, y)? {
                bail!("{} and {} are the same file, given twice", x.display(), y.display());
            }
        }
    }
    let mut gemm = Vec::new();
    let mut moe = Vec::new();
    // (set, op) -> (layer, file): one figure per set and op, so one layer per set and op
    let mut layers = std::collections::BTreeMap::new();
    for p in &a.bench {
        match figures::read_bench(p)? {
            BenchFile::Gemm(rows) if !rows.is_empty() => gemm.extend(rows),
            BenchFile::Moe(rows) if !rows.is_empty() => {
                for r in &rows {
                    let layer = (r.n, r.k, r.experts, r.top_k);
                    let (first, from) = layers
                        .entry((r.set.clone(), r.op.clone()))
                        .or_insert_with(|| (layer, p.clone()));
                    if *first != layer {
                        bail!(
                            "{} and {}: both hold {} of set {} for different layers (N {} K {} \
                             {} experts top-{} against N {} K {} {} experts top-{}): one \
                             figure per set and op; give them to separate reports",
                            from.display(),
                            p.display(),
                            r.op,
                            r.set,
                            first.0,
                            first.1,
                            first.2,
                            first.3,
                            r.n,
                            r.k,
                            r.experts,
                            r.top_k
                        );
                    }
                }
                moe.extend(rows)
            }
            _ => bail!("{}: holds no rows (a header alone): nothing of it to plot", p.display()),
        }
    }
    let tables: Vec<(fp4tune::table::Table, String)> = a
        .table
        .iter()
        .map(|t| Ok((fp4tune::table::Table::load(t)?, t.display().to_string())))
        .collect::<Result<_>>()?;
    let refs: Vec<(&fp4tune::table::Table, &str)> =
        tables.iter().map(|(t, o)| (t, o.as_str())).collect();
    let mut charts = figures::gemm_time_vs_m(&gemm, &refs);
    charts.extend(figures::moe_step(&moe));
    let kinds: Vec<StrategyKind> =
        a.strategy.iter().map(|s| StrategyKind::parse(s)).collect::<Result<_, _>>()?;
    let mut log_figures: Vec<(String, &PathBuf)> = Vec::new();
    for l in &a.log {
        // the log's errors name it
        let records = fp4tune::tune::log::read(l)?;
        let chart = figures::search_curves(&records, &kinds, a.budget, &l.display().to_string())?;
        if let Some((_, other)) = log_figures.iter().find(|(f, _)| *f == chart.file) {
            bail!(
                "{} and {} both make the figure {} (logs of the same name): give them to \
                 separate reports",
                other.display(),
                l.display(),
                chart.file
            );
        }
        log_figures.push((chart.file.clone(), l));
        charts.push(chart);
    }
    // Charts without data (a shape with rows that carry no time) are skipped, not drawn blank.
    charts.retain(|c| c.series.iter().any(|s| !s.points.is_empty()));
    if charts.is_empty() {
        bail!("nothing to plot: the tables, logs and CSVs given hold no timed rows");
    }
    // A figure is never written over an input (a CSV, log or table kept in --out).
    for c in &charts {
        let out = a.out.join(&c.file);
        for input in a.bench.iter().chain(&a.log).chain(&a.table) {
            if fp4tune::fsio::same_file(&out, input)? {
                bail!(
                    "--out {}: the figure {} would replace the input {}",
                    a.out.display(),
                    c.file,
                    input.display()
                );
            }
        }
    }
    let files = fp4tune::plot::write_all(&charts, &a.out)?;
    for f in &files {
        outln!("wrote {}", f.display())?;
    }
    Ok(())
}
