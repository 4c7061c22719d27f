//! Rendering tests: every figure kind drawn into a temporary folder, the SVG files checked for
//! their series names.

use super::figures::{
    gemm_time_vs_m, moe_step, parse_bench_csv, read_bench, search_curves, BenchFile,
};
use super::{write_all, Chart, PlotError, Series, Style};
use crate::bench::moe::MoeRow;
use crate::search::StrategyKind;
use std::path::Path;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

const BENCH: &str = "\
shape,N,K,M,a_type,impl,median_us,lo_us,hi_us,roofline_us,read_floor_us,x_roofline,x_read_floor,bytes,GBps,samples,verified
tp8_routed_gate_up,512,6144,1,w4a16,sm90_w4a16_m8n16k2048_w1x1x8_p8_sk3_swap,3.472,3.465,3.479,0.402,1.831,8.64,1.90,1782784,513,25,ok
tp8_routed_gate_up,512,6144,1,w4a16,sm90_w4a16_m8n16k1024_w1x1x4_p8_sk6_swap,3.600,3.5,3.7,0.402,1.831,8.64,1.90,1782784,513,25,ok
tp8_routed_gate_up,512,6144,1,w4a16,cublas_bf16,6.6,6.5,6.7,0.402,1.831,1,1,1,1,25,-
tp8_routed_gate_up,512,6144,1,w4a16,cublaslt_fp8,6.7,6.6,6.8,0.402,1.831,1,1,1,1,25,-
tp8_routed_gate_up,512,6144,16,w4a16,sm90_w4a16_m8n16k2048_w1x1x8_p8_sk3_swap,4.2,4.1,4.3,0.45,1.9,1,1,1,1,25,ok
tp8_routed_gate_up,512,6144,16,w4a16,cublas_bf16,7.0,6.9,7.1,0.45,1.9,1,1,1,1,25,-
tp8_routed_gate_up,512,6144,16,w4a16,cublaslt_fp8,7.2,7.1,7.3,0.45,1.9,1,1,1,1,25,-
tp8_routed_down,6144,256,1,w4a16,sm90_w4a16_m8n16k256_w1x1x2_p4_sk1_swap,2.3,2.2,2.4,0.2,1.6,1,1,1,1,25,ok
tp8_routed_down,6144,256,1,w4a16,cublas_bf16,3.3,3.2,3.4,0.2,1.6,1,1,1,1,25,-
";

fn moe_row(set: &str, op: &str, imp: &str, b: u32, us: f64) -> MoeRow {
    MoeRow {
        set: set.into(),
        op: op.into(),
        n: 512,
        k: 6144,
        experts: 256,
        top_k: 8,
        tokens: b,
        active_experts: b.min(256),
        implementation: imp.into(),
        config: "c".into(),
        median_us: us,
        lo_us: us * 0.99,
        hi_us: us * 1.01,
        roofline_us: if op == "moe_layer" { us / 3.0 } else { 0.0 },
        read_floor_us: if op == "moe_layer" { us / 2.0 } else { 0.0 },
        verified: 3,
        failed: 0,
    }
}

#[test]
fn gemm_figures_render_with_floors_roofline_peers_and_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let rows = parse_bench_csv(BENCH, "bench.csv").unwrap();
    let table = crate::table::tests_support::sample();
    let charts = gemm_time_vs_m(&rows, &[(&table, "results/x.ron")]);
    let files = write_all(&charts, dir.path()).unwrap();
    let gate_up = dir.path().join("time-vs-m-n512-k6144-w4a16.svg");
    assert!(files.contains(&gate_up), "{files:?}");
    let svg = read(&gate_up);
    assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
    for name in
        ["fp4tune best", "table x.ron", "cublas_bf16", "cublaslt_fp8", "read floor", "roofline"]
    {
        assert!(svg.contains(name), "{name} missing");
    }
    // The best verified kernel per M: 3.472 at M = 1, not the slower 3.6.
    let best = &charts.iter().find(|c| c.file.contains("n512-k6144")).unwrap().series[0];
    assert_eq!(best.name, "fp4tune best");
    assert_eq!(best.points, vec![(1.0, 3.472), (16.0, 4.2)]);
    assert!(dir.path().join("time-vs-m-n6144-k256-w4a16.svg").exists());
}

#[test]
fn moe_step_figure_renders_from_a_bench_moe_csv() {
    let dir = tempfile::tempdir().unwrap();
    let rows = vec![
        moe_row("tp8", "moe_layer", "fp4tune_layer", 1, 20.0),
        moe_row("tp8", "moe_layer", "fp4tune_layer", 8, 40.0),
        moe_row("tp8", "moe_layer", "torch_grouped_mm_bf16", 1, 80.0),
        moe_row("tp8", "moe_layer", "torch_grouped_mm_bf16", 8, 120.0),
        moe_row("tp8", "moe_gate_up", "fp4tune_grouped", 1, 12.0),
        moe_row("tp8", "moe_gate_up", "fp4tune_grouped", 8, 24.0),
    ];
    let csv_path = dir.path().join("bench-moe.csv");
    std::fs::write(&csv_path, crate::bench::moe_report::csv(&rows)).unwrap();
    let BenchFile::Moe(back) = read_bench(&csv_path).unwrap() else { panic!("not a MoE CSV") };
    // a byte-order mark in front (a spreadsheet's save) reads the same, GEMM CSVs too
    let bom = dir.path().join("bom.csv");
    std::fs::write(&bom, format!("\u{feff}{}", crate::bench::moe_report::csv(&rows))).unwrap();
    let BenchFile::Moe(same) = read_bench(&bom).unwrap() else { panic!("not a MoE CSV") };
    assert_eq!(same.len(), back.len());
    std::fs::write(&bom, format!("\u{feff}{BENCH}")).unwrap();
    let BenchFile::Gemm(g) = read_bench(&bom).unwrap() else { panic!("not a GEMM CSV") };
    assert_eq!(g.len(), parse_bench_csv(BENCH, "bench.csv").unwrap().len());
    let charts = moe_step(&back);
    assert_eq!(charts.len(), 2);
    let files = write_all(&charts, &dir.path().join("fig")).unwrap();
    let layer = dir.path().join("fig/moe-tp8-moe-layer.svg");
    assert!(files.contains(&layer), "{files:?}");
    let svg = read(&layer);
    assert!(svg.contains("the whole decode step"));
    for name in ["fp4tune_layer", "torch_grouped_mm_bf16", "roofline", "read floor"] {
        assert!(svg.contains(name), "{name} missing");
    }
    let svg = read(&dir.path().join("fig/moe-tp8-moe-gate-up.svg"));
    assert!(svg.contains("fp4tune_grouped") && !svg.contains("roofline"));
}

#[test]
fn search_figure_renders_per_strategy_and_log_order() {
    let dir = tempfile::tempdir().unwrap();
    let log =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/h200/nvidia-h200-w4a16.jsonl.gz");
    let records = crate::tune::log::read(&log).unwrap();
    let kinds: Vec<StrategyKind> =
        ["model", "random"].iter().map(|s| StrategyKind::parse(s).unwrap()).collect();
    let chart = search_curves(&records, &kinds, 1.0, &log.display().to_string()).unwrap();
    assert_eq!(chart.file, "search-nvidia-h200-w4a16.svg");
    let names: Vec<&str> = chart.series.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["model", "random", "log order"]);
    for s in &chart.series {
        // Relative to the best in the log: >= 1, and it reaches 1 with the whole budget.
        assert!(s.points.iter().all(|p| p.1 >= 1.0 - 1e-12), "{}", s.name);
        assert!(
            (s.points.last().unwrap().1 - 1.0).abs() < 1e-9,
            "{}: {:?}",
            s.name,
            s.points.last()
        );
        // Best so far never gets worse.
        assert!(s.points.windows(2).all(|w| w[1].1 <= w[0].1 + 1e-12), "{}", s.name);
    }
    let files = write_all(&[chart], dir.path()).unwrap();
    let svg = read(&files[0]);
    for name in ["model", "random", "log order", "best found / best in the log"] {
        assert!(svg.contains(name), "{name} missing");
    }
}

#[test]
fn an_empty_figure_is_an_error_not_a_blank_file() {
    let chart = Chart {
        file: "x.svg".into(),
        title: "nothing".into(),
        x_label: "x".into(),
        y_label: "y".into(),
        log_x: true,
        log_y: true,
        series: vec![Series { name: "s".into(), points: vec![(0.0, 1.0)], style: Style::Line }],
    };
    let dir = tempfile::tempdir().unwrap();
    let e = write_all(&[chart], dir.path()).unwrap_err();
    assert!(matches!(e, PlotError::Empty(ref t) if t == "nothing"), "{e}");
    assert!(!dir.path().join("x.svg").exists());
}

/// A write error names the file and its OS error once (not chained again as the source).
#[test]
fn io_errors_name_the_file_and_the_os_error_once() {
    let e = super::PlotError::Io {
        path: "/x/y.svg".into(),
        error: std::io::Error::from(std::io::ErrorKind::IsADirectory),
    };
    assert!(std::error::Error::source(&e).is_none());
    assert!(e.to_string().starts_with("/x/y.svg: "), "{e}");
}

/// Without a benchmark's roofline the chart draws the one the table's fractions imply, except
/// where a fraction sits at the table's bound (an sm120 cap: a bound, not the roofline).
#[test]
fn table_roofline_skips_capped_fractions() {
    let mut table = crate::table::tests_support::sample();
    let gemm: Vec<usize> = (0..table.entries.len())
        .filter(|&i| table.entries[i].key.op == crate::table::OP_GEMM)
        .collect();
    assert!(gemm.len() >= 2, "the sample table has {} GEMM entries", gemm.len());
    for &i in &gemm {
        table.entries[i].roofline_fraction = 0.5;
    }
    let capped = table.entries[gemm[0]].key.clone();
    table.entries[gemm[0]].roofline_fraction = crate::table::MAX_ROOFLINE_FRACTION;
    let charts = gemm_time_vs_m(&[], &[(&table, "t.ron")]);
    let mut drawn = 0;
    for c in &charts {
        for s in c.series.iter().filter(|s| s.name == "roofline (table)") {
            for &(m, us) in &s.points {
                let e = table.entries.iter().find(|e| {
                    e.key.op == crate::table::OP_GEMM
                        && e.key.m as f64 == m
                        && c.file.contains(&format!("n{}-k{}", e.key.n, e.key.k))
                });
                let e = e.unwrap_or_else(|| panic!("{} has a point at m = {m}", c.file));
                assert_ne!(e.key, capped, "the capped entry is drawn in {}", c.file);
                assert!((us - e.median_us * 0.5).abs() < 1e-9);
                drawn += 1;
            }
        }
    }
    assert_eq!(drawn, gemm.len() - 1);
}
