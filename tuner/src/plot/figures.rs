//! The figures of `fp4tune report`, as data: inputs in, [`Chart`]s out (no drawing here).

use super::{slug, Chart, PlotError, Series, Style};
use crate::bench::moe::MoeRow;
use crate::search::{Budget, StrategyKind};
use crate::table::{Method, Table, OP_GEMM};
use crate::tune::log::{Outcome, Record};
use crate::tune::replay::{simulate_kind, Candidates};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// One row of a GEMM benchmark CSV (`bench-<a_type>.csv`, header `bench::report::CSV_HEADER`).
#[derive(Debug, Clone, PartialEq)]
pub struct BenchPoint {
    pub shape: String,
    pub n: u32,
    pub k: u32,
    pub m: u32,
    pub a_type: String,
    /// An fp4tune kernel's name (`sm90_...`), a peer's, or `dequant_cublas_bf16`.
    pub implementation: String,
    pub median_us: f64,
    pub roofline_us: f64,
    pub read_floor_us: f64,
    /// "ok" for verified fp4tune kernels, "-" for peers.
    pub verified: String,
}

impl BenchPoint {
    /// Whether this row is one of fp4tune's fused kernels (named after its family).
    pub fn is_fp4tune_kernel(&self) -> bool {
        self.implementation.starts_with("sm90_") || self.implementation.starts_with("sm120_")
    }
}

/// A benchmark CSV: GEMM rows or grouped MoE rows, told apart by the header.
#[derive(Debug, Clone, PartialEq)]
pub enum BenchFile {
    Gemm(Vec<BenchPoint>),
    Moe(Vec<MoeRow>),
}

/// Parse the rows of a GEMM benchmark CSV by its header's column names.
pub fn parse_bench_csv(text: &str, origin: &str) -> Result<Vec<BenchPoint>, PlotError> {
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = match lines.next() {
        Some((_, h)) => h.split(',').map(str::trim).collect(),
        None => return Err(PlotError::Input(format!("{origin}: empty CSV"))),
    };
    if let Some(twice) = header.iter().enumerate().find(|(i, h)| header[..*i].contains(h)) {
        return Err(PlotError::Input(format!(
            "{origin}:1: the column `{}` is named twice",
            twice.1
        )));
    }
    let col = |name: &str| {
        header.iter().position(|h| *h == name).ok_or_else(|| {
            PlotError::Input(format!("{origin}: no column `{name}` (not a bench CSV)"))
        })
    };
    let [shape, n, k, m, a_type, imp, median, roof, floor] =
        ["shape", "N", "K", "M", "a_type", "impl", "median_us", "roofline_us", "read_floor_us"]
            .map(col);
    let (shape, n, k, m, a_type, imp, median, roof, floor) =
        (shape?, n?, k?, m?, a_type?, imp?, median?, roof?, floor?);
    let verified = header.iter().position(|h| *h == "verified");
    let mut out = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = || PlotError::Input(format!("{origin}:{}: not a bench row: {line}", i + 1));
        let get = |c: usize| f.get(c).copied().ok_or_else(bad);
        // times are 0 (not measured) or within what a report shows
        let num = |c: usize| {
            let s = get(c)?;
            s.parse::<f64>().ok().filter(|v| crate::table::reportable_time(*v)).ok_or_else(|| {
                PlotError::Input(format!(
                    "{origin}:{}: `{s}` is not a time in microseconds (0, or 0.001 to 1e9): {line}",
                    i + 1
                ))
            })
        };
        if f.len() != header.len() {
            return Err(PlotError::Input(format!(
                "{origin}:{}: {} fields for {} columns: {line}",
                i + 1,
                f.len(),
                header.len()
            )));
        }
        // sizes are positive: a row of N, K or M 0 is no measurement
        let int = |c: usize| {
            let v = get(c)?.parse::<u32>().map_err(|_| bad())?;
            if v == 0 {
                return Err(PlotError::Input(format!(
                    "{origin}:{}: {} is 0: {line}",
                    i + 1,
                    header[c]
                )));
            }
            Ok(v)
        };
        out.push(BenchPoint {
            shape: get(shape)?.to_string(),
            n: int(n)?,
            k: int(k)?,
            m: int(m)?,
            a_type: get(a_type)?.to_string(),
            implementation: get(imp)?.to_string(),
            median_us: num(median)?,
            roofline_us: num(roof)?,
            read_floor_us: num(floor)?,
            verified: match verified {
                Some(c) => get(c)?.to_string(),
                None => "ok".into(),
            },
        });
    }
    Ok(out)
}

/// Read a benchmark CSV, GEMM (`shape,N,K,M,...`) or grouped MoE (`op,N,K,experts,...`).
pub fn read_bench(path: &Path) -> Result<BenchFile, PlotError> {
    let text = crate::fsio::read_input(path)
        .map_err(|source| PlotError::Io { path: path.to_path_buf(), error: source })?;
    let origin = path.display().to_string();
    // a byte-order mark (a CSV saved by a spreadsheet) is not part of the header
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    if text.starts_with("op,") {
        crate::bench::moe_report::parse_csv(text, &origin)
            .map(BenchFile::Moe)
            .map_err(PlotError::Input)
    } else {
        parse_bench_csv(text, &origin).map(BenchFile::Gemm)
    }
}

fn series(name: impl Into<String>, points: &BTreeMap<u32, f64>, style: Style) -> Series {
    Series {
        name: name.into(),
        points: points.iter().map(|(x, y)| (*x as f64, *y)).collect(),
        style,
    }
}

/// Times by M (or by B).
type ByX = BTreeMap<u32, f64>;

#[derive(Default)]
struct GemmGroup {
    labels: BTreeSet<String>,
    best: BTreeMap<u32, f64>,
    /// Peers and the composite method, by name (first occurrence per M).
    others: BTreeMap<String, BTreeMap<u32, f64>>,
    /// Per table (by file name): fused entries, dequantize-then-cuBLAS entries.
    tables: BTreeMap<String, (ByX, ByX)>,
    table_roofline: BTreeMap<u32, f64>,
    read_floor: BTreeMap<u32, f64>,
    roofline: BTreeMap<u32, f64>,
}

/// Per weight shape (N, K, A type): time per launch vs M, log-log. Series: `fp4tune best` (the
/// fastest verified fp4tune kernel of the benchmark rows at each M), `table <file>` (the table's
/// entries; dequantize-then-cuBLAS entries as markers of their own), each peer and
/// `dequant_cublas_bf16`, then the `read floor` and the `roofline` (from the benchmark; without
/// one, the roofline implied by the table's roofline fractions).
pub fn gemm_time_vs_m(points: &[BenchPoint], tables: &[(&Table, &str)]) -> Vec<Chart> {
    let mut groups: BTreeMap<(String, u32, u32), GemmGroup> = BTreeMap::new();
    for p in points.iter().filter(|p| p.median_us > 0.0) {
        let g = groups.entry((p.a_type.clone(), p.n, p.k)).or_default();
        g.labels.insert(p.shape.clone());
        if p.is_fp4tune_kernel() {
            if p.verified == "ok" {
                let b = g.best.entry(p.m).or_insert(f64::INFINITY);
                *b = b.min(p.median_us);
            }
        } else {
            g.others.entry(p.implementation.clone()).or_default().entry(p.m).or_insert(p.median_us);
        }
        if p.read_floor_us > 0.0 {
            g.read_floor.entry(p.m).or_insert(p.read_floor_us);
        }
        if p.roofline_us > 0.0 {
            g.roofline.entry(p.m).or_insert(p.roofline_us);
        }
    }
    for (t, origin) in tables {
        let name = Path::new(origin)
            .file_name()
            .map_or(origin.to_string(), |f| f.to_string_lossy().into());
        for e in t.entries.iter().filter(|e| e.key.op == OP_GEMM) {
            let g =
                groups.entry((e.key.a_type.as_str().to_string(), e.key.n, e.key.k)).or_default();
            let per = g.tables.entry(name.clone()).or_default();
            match e.method {
                Method::Fused => per.0.insert(e.key.m, e.median_us),
                _ => per.1.insert(e.key.m, e.median_us),
            };
            // A fraction at the table's bound is a cap (sm120, a peak from a data sheet), not the
            // roofline's value: no point is drawn for it.
            if e.roofline_fraction > 0.0
                && e.roofline_fraction < crate::table::MAX_ROOFLINE_FRACTION
            {
                g.table_roofline.insert(e.key.m, e.median_us * e.roofline_fraction);
            }
        }
    }
    groups
        .into_iter()
        .map(|((a_type, n, k), g)| {
            let mut s = Vec::new();
            if !g.best.is_empty() {
                s.push(series("fp4tune best", &g.best, Style::Line));
            }
            for (name, (fused, composite)) in &g.tables {
                if !fused.is_empty() {
                    s.push(series(format!("table {name}"), fused, Style::Line));
                }
                if !composite.is_empty() {
                    s.push(series(
                        format!("table {name}: dequant_cublas_bf16"),
                        composite,
                        Style::Points,
                    ));
                }
            }
            for (name, pts) in &g.others {
                s.push(series(name.clone(), pts, Style::Line));
            }
            if !g.read_floor.is_empty() {
                s.push(series("read floor", &g.read_floor, Style::Floor));
            }
            if !g.roofline.is_empty() {
                s.push(series("roofline", &g.roofline, Style::Floor));
            } else if !g.table_roofline.is_empty() {
                s.push(series("roofline (table)", &g.table_roofline, Style::Floor));
            }
            let labels: Vec<String> = g.labels.into_iter().collect();
            let name = if labels.is_empty() { "gemm".to_string() } else { labels.join(", ") };
            Chart {
                file: format!("time-vs-m-n{n}-k{k}-{}.svg", slug(&a_type)),
                title: format!("{name} (N {n} x K {k}, {a_type}): time per launch vs M"),
                x_label: "M (tokens)".into(),
                y_label: "us per launch".into(),
                log_x: true,
                log_y: true,
                series: s,
            }
        })
        .collect()
}

/// Per shape set and op of a grouped MoE benchmark (`bench-moe.csv`, peers CSVs in the same
/// format): time vs the step's token count B, log-log, one series per implementation (fp4tune's
/// grouped kernel or whole layer, the routing and finalize kernels, the peers), plus the op's
/// roofline and read floor where the rows have them. One figure per (set, op), as in
/// `bench-moe.md`: `moe_gate_up`, `moe_down`, and `moe_layer` (the whole decode step).
pub fn moe_step(rows: &[MoeRow]) -> Vec<Chart> {
    let mut groups: BTreeMap<(String, String), Vec<&MoeRow>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.median_us > 0.0) {
        groups.entry((r.set.clone(), r.op.clone())).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|((set, op), list)| {
            let mut measured: BTreeMap<String, ByX> = BTreeMap::new();
            let (mut roof, mut floor) = (ByX::new(), ByX::new());
            for r in &list {
                measured
                    .entry(r.implementation.clone())
                    .or_default()
                    .entry(r.tokens)
                    .or_insert(r.median_us);
                if r.roofline_us > 0.0 {
                    roof.entry(r.tokens).or_insert(r.roofline_us);
                }
                if r.read_floor_us > 0.0 {
                    floor.entry(r.tokens).or_insert(r.read_floor_us);
                }
            }
            // fp4tune's own rows first, then the peers.
            let mut names: Vec<&String> = measured.keys().collect();
            names.sort_by_key(|n| {
                (!(n.starts_with("fp4tune") || n.starts_with("moe_")), n.to_string())
            });
            let mut s: Vec<Series> =
                names.iter().map(|n| series(n.as_str(), &measured[*n], Style::Line)).collect();
            if !roof.is_empty() {
                s.push(series("roofline", &roof, Style::Floor));
            }
            if !floor.is_empty() {
                s.push(series("read floor", &floor, Style::Floor));
            }
            let first = list[0];
            let title = if op == "moe_layer" {
                format!(
                    "{set} grouped MoE, the whole decode step per B ({} experts, top-{})",
                    first.experts, first.top_k
                )
            } else {
                format!(
                    "{set} grouped MoE, {op} per B (N {} x K {}, {} experts, top-{})",
                    first.n, first.k, first.experts, first.top_k
                )
            };
            Chart {
                file: format!("moe-{}-{}.svg", slug(&set), slug(&op)),
                title,
                x_label: "B (tokens in the step)".into(),
                y_label: "us".into(),
                log_x: true,
                log_y: true,
                series: s,
            }
        })
        .collect()
}

/// Per-key best-so-far curves -> one curve: at each evaluation count, the geometric mean over
/// keys of (best so far / best in the log); keys that stopped earlier keep their final value,
/// keys with nothing timed yet are left out at that count. Thinned to about 2% steps in x.
fn mean_curve(curves: &[(Vec<Option<f64>>, f64)]) -> Vec<(f64, f64)> {
    let len = curves.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    let mut out = Vec::new();
    let mut last_x = 0.0f64;
    for i in 0..len {
        let x = (i + 1) as f64;
        if i + 1 != len && x < last_x * 1.02 {
            continue;
        }
        let logs: Vec<f64> = curves
            .iter()
            .filter_map(|(c, best)| {
                c.get(i.min(c.len().saturating_sub(1))).copied().flatten().map(|t| (t / best).ln())
            })
            .collect();
        if logs.is_empty() {
            continue;
        }
        last_x = x;
        out.push((x, (logs.iter().sum::<f64>() / logs.len() as f64).exp()));
    }
    out
}

/// A measurement log's search: for each strategy replayed offline over the logged candidates
/// (`tune::replay`, `budget` as a fraction of each key's logged candidates) and for the order
/// the log recorded (`log order`: the run as it happened), the geometric mean over keys of the
/// best time found so far relative to the best time in the log, against evaluations per key.
pub fn search_curves(
    records: &[Record],
    strategies: &[StrategyKind],
    budget: f64,
    name: &str,
) -> Result<Chart, PlotError> {
    // Fused records only: the composite path is not a search candidate.
    let fused: Vec<Record> = records.iter().filter(|r| r.method.is_fused()).cloned().collect();
    let mut best: HashMap<&crate::table::TableKey, f64> = HashMap::new();
    let mut order: BTreeMap<&crate::table::TableKey, Vec<Option<f64>>> = BTreeMap::new();
    for r in &fused {
        let t = match &r.outcome {
            Outcome::Timed { time, .. } => Some(time.median),
            _ => None,
        };
        if let Some(t) = t {
            let b = best.entry(&r.key).or_insert(f64::INFINITY);
            *b = b.min(t);
        }
        let c = order.entry(&r.key).or_default();
        let prev = c.last().copied().flatten();
        c.push(match (prev, t) {
            (Some(p), Some(t)) => Some(p.min(t)),
            (p, t) => p.or(t),
        });
    }
    if best.is_empty() {
        return Err(PlotError::Input(format!("{name}: no timed record to plot")));
    }
    let mut series_out = Vec::new();
    for kind in strategies {
        let report = simulate_kind(&fused, kind, Candidates::Logged, &Budget::fraction(budget));
        let curves: Vec<(Vec<Option<f64>>, f64)> = report
            .keys
            .iter()
            .filter_map(|k| best.get(&k.key).map(|b| (k.curve.clone(), *b)))
            .collect();
        series_out.push(Series {
            name: kind.name().to_string(),
            points: mean_curve(&curves),
            style: Style::Curve,
        });
    }
    let recorded: Vec<(Vec<Option<f64>>, f64)> =
        order.into_iter().filter_map(|(k, c)| best.get(k).map(|b| (c, *b))).collect();
    series_out.push(Series {
        name: "log order".into(),
        points: mean_curve(&recorded),
        style: Style::Curve,
    });
    let stem =
        Path::new(name).file_name().map_or(name.to_string(), |f| f.to_string_lossy().to_string());
    let stem = stem.trim_end_matches(".gz").trim_end_matches(".jsonl").to_string();
    Ok(Chart {
        file: format!("search-{}.svg", slug(&stem)),
        title: format!("{stem}: best so far vs evaluations"),
        x_label: format!(
            "evaluations per key (strategies replayed over {:.0}% of the logged candidates)",
            budget * 100.0
        ),
        y_label: format!("best found / best in the log (geomean, {} keys)", best.len()),
        log_x: true,
        log_y: false,
        series: series_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_bench_csv_parses_with_floors_roofline_and_peers() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/h200/bench-w4a16.csv");
        let BenchFile::Gemm(rows) = read_bench(&path).unwrap() else { panic!("not a GEMM CSV") };
        assert!(rows.iter().any(|r| r.is_fp4tune_kernel() && r.verified == "ok"));
        for peer in crate::bench::peers::PEERS {
            assert!(rows.iter().any(|r| r.implementation == peer), "{peer}");
        }
        let charts = gemm_time_vs_m(&rows, &[]);
        assert!(!charts.is_empty());
        for c in &charts {
            let names: Vec<&str> = c.series.iter().map(|s| s.name.as_str()).collect();
            for want in ["fp4tune best", "cublas_bf16", "cublaslt_fp8", "read floor", "roofline"] {
                assert!(names.contains(&want), "{}: {names:?}", c.file);
            }
        }
    }

    #[test]
    fn bad_csv_rows_name_their_line() {
        let e = parse_bench_csv(
            "shape,N,K,M,a_type,impl,median_us,roofline_us,read_floor_us\nx,1,2\n",
            "b.csv",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("b.csv:2:"), "{e}");
        let e = parse_bench_csv("a,b\n", "c.csv").unwrap_err().to_string();
        assert!(e.contains("no column `shape`"), "{e}");
        // a time that is no time is refused, not dropped from the figure
        for median in ["-3.4", "NaN", "inf"] {
            let text = format!(
                "shape,N,K,M,a_type,impl,median_us,roofline_us,read_floor_us\n\
                 s,512,6144,1,w4a16,fp4tune,{median},0.4,1.8\n"
            );
            let e = parse_bench_csv(&text, "d.csv").unwrap_err().to_string();
            assert!(e.starts_with("d.csv:2:") && e.contains("not a time"), "{median}: {e}");
        }
        // a size of 0, a field more, a column named twice
        let head = "shape,N,K,M,a_type,impl,median_us,roofline_us,read_floor_us";
        for (text, want) in [
            (format!("{head}\ns,0,6144,1,w4a16,f,3.0,0.4,1.8\n"), "d.csv:2: N is 0"),
            (format!("{head}\ns,512,6144,0,w4a16,f,3.0,0.4,1.8\n"), "d.csv:2: M is 0"),
            (format!("{head}\ns,512,6144,1,w4a16,f,3.0,0.4,1.8,9\n"), "d.csv:2: 10 fields"),
            (format!("{head},M\ns,512,6144,1,w4a16,f,3.0,0.4,1.8,1\n"), "`M` is named twice"),
        ] {
            let e = parse_bench_csv(&text, "d.csv").unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn mean_curve_is_a_geomean_that_keeps_final_values() {
        let curves = vec![(vec![None, Some(4.0), Some(2.0)], 2.0), (vec![Some(3.0)], 1.0)];
        let c = mean_curve(&curves);
        assert_eq!(c[0].0, 1.0);
        assert!((c[0].1 - 3.0).abs() < 1e-12);
        assert!((c[1].1 - (2.0f64 * 3.0).sqrt()).abs() < 1e-12);
        assert!((c[2].1 - 3.0f64.sqrt()).abs() < 1e-12);
    }
}
