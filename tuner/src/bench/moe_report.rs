//! The grouped MoE benchmark report: `bench-moe.csv` (one row per measured implementation) and
//! `bench-moe.md` (per set and projection: fp4tune against the roofline, the read floor and the
//! peers measured in the same run).

use super::moe::{MoeRow, OpLog, Outcome};
use crate::moe::templates::{ALIGN_CHUNKED_MIN_IDS, ALIGN_THREADS};

/// The `impl` names of the fixed kernels' rows: moe_align in its one-CTA and chunked forms,
/// moe_finalize, and (W4A4 with bf16 X) the quantization of X alone and launched with the
/// one-CTA routing (timed alone beside each layer; not peers).
pub const FIXED_KERNEL_ROWS: [&str; 5] =
    ["moe_align", "moe_align_chunked", "moe_finalize", "moe_quantize_x", "moe_align_quantize_x"];
/// Column titles of those rows in the report.
const FIXED_KERNEL_COLUMNS: [&str; 5] = [
    "moe_align one CTA us",
    "moe_align chunked us",
    "moe_finalize us",
    "quantize X us",
    "moe_align + quantize X in one launch us",
];
use std::collections::BTreeMap;
use std::fmt::Write;

/// The CSV header: the benchmark's result columns first (op .. read_floor_us), then context.
pub const CSV_HEADER: &str = "op,N,K,experts,top_k,B,impl,median_us,lo_us,hi_us,roofline_us,read_floor_us,set,active_experts,config,verified,failed";

pub fn csv(rows: &[MoeRow]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{},{},{},{},{}",
            r.op,
            r.n,
            r.k,
            r.experts,
            r.top_k,
            r.tokens,
            r.implementation,
            r.median_us,
            r.lo_us,
            r.hi_us,
            r.roofline_us,
            r.read_floor_us,
            r.set,
            r.active_experts,
            one_field(&r.config),
            r.verified,
            r.failed
        );
    }
    out
}

/// `text` as one CSV field: commas and line breaks (of a failure's message) become `;`.
fn one_field(text: &str) -> String {
    text.chars().map(|c| if c == ',' || c == '\n' || c == '\r' { ';' } else { c }).collect()
}

/// The prefix of the configuration column of a row whose implementation could not run the step;
/// its three times are NaN.
pub const FAILED_ROW: &str = "failed: ";

/// The header of `bench-moe-<a_type>-screen.csv`: every candidate a grouped screen measured.
pub const SCREEN_CSV_HEADER: &str =
    "set,op,a_type,B,impl,median_us,lo_us,hi_us,outcome,registers,spill_stores,spill_loads";

/// Every candidate of the screens (`logs`) with its time, or its failure (commas and line breaks
/// of the message replaced, so a row stays one CSV record).
pub fn screen_csv(a_type: &str, logs: &[OpLog]) -> String {
    let mut out = String::from(SCREEN_CSV_HEADER);
    out.push('\n');
    for (set, tokens, op, measured) in logs {
        for m in measured {
            let lead = format!("{set},{},{a_type},{tokens},{}", op.as_str(), m.config.name());
            // ptxas on this machine (empty where the kernel did not compile)
            let ptxas = m.ptxas.map_or(",,".to_string(), |p| {
                format!("{},{},{}", p.registers, p.spill_stores, p.spill_loads)
            });
            let _ = match &m.outcome {
                Outcome::Timed(s) => {
                    writeln!(out, "{lead},{:.3},{:.3},{:.3},ok,{ptxas}", s.median, s.lo, s.hi)
                }
                Outcome::Failed(why) => writeln!(out, "{lead},,,,{},{ptxas}", one_field(why)),
            };
        }
    }
    out
}

/// Rows of a CSV in the format above (peers written by scripts/moe_peers.py); lines that do not
/// parse are returned as errors naming their line.
pub fn parse_csv(text: &str, origin: &str) -> Result<Vec<MoeRow>, String> {
    // the columns are read by position: a file with other columns (renamed, reordered) is refused
    let header = text.lines().next().unwrap_or("").trim_start_matches('\u{feff}').trim_end();
    if header != CSV_HEADER {
        return Err(format!(
            "{origin}:1: not a bench-moe CSV: its header must be `{CSV_HEADER}`, found `{header}`"
        ));
    }
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if i == 0 || line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let bad = || format!("{origin}:{}: not a bench-moe row: {line}", i + 1);
        if f.len() != 17 {
            return Err(bad());
        }
        let op = f[0].trim();
        if !crate::moe::MoeOp::ALL.iter().any(|o| o.as_str() == op) && op != "moe_layer" {
            return Err(format!(
                "{origin}:{}: op `{op}` is none of moe_gate_up, moe_down, moe_layer: {line}",
                i + 1
            ));
        }
        let u = |s: &str| s.trim().parse::<u32>().map_err(|_| bad());
        // times are 0 (not measured) or within what a report shows; the three times of a row of
        // an implementation that failed on the step (FAILED_ROW) are NaN
        let failed_row = f[14].starts_with(FAILED_ROW);
        let x = |s: &str, may_fail: bool| {
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| {
                    if may_fail && failed_row {
                        v.is_nan()
                    } else {
                        crate::table::reportable_time(*v)
                    }
                })
                .ok_or_else(|| {
                    format!(
                        "{origin}:{}: `{}` is not a time in microseconds (0, or 0.001 to 1e9): {line}",
                        i + 1,
                        s.trim()
                    )
                })
        };
        rows.push(MoeRow {
            op: f[0].into(),
            n: u(f[1])?,
            k: u(f[2])?,
            experts: u(f[3])?,
            top_k: u(f[4])?,
            tokens: u(f[5])?,
            implementation: f[6].into(),
            median_us: x(f[7], true)?,
            lo_us: x(f[8], true)?,
            hi_us: x(f[9], true)?,
            roofline_us: x(f[10], false)?,
            read_floor_us: x(f[11], false)?,
            set: f[12].into(),
            active_experts: u(f[13])?,
            config: f[14].into(),
            verified: u(f[15])? as usize,
            failed: u(f[16])? as usize,
        });
        let r = rows.last().expect("pushed above");
        let sizes =
            [("N", r.n), ("K", r.k), ("experts", r.experts), ("top_k", r.top_k), ("B", r.tokens)];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{origin}:{}: {name} is 0: {line}", i + 1));
        }
        let measured = [r.median_us, r.lo_us, r.hi_us].iter().all(|t| *t > 0.0);
        if measured && !(r.lo_us <= r.median_us && r.median_us <= r.hi_us) {
            return Err(format!(
                "{origin}:{}: the median {} us is outside its interval [{}, {}]: {line}",
                i + 1,
                r.median_us,
                r.lo_us,
                r.hi_us
            ));
        }
    }
    Ok(rows)
}

/// Markdown: one table per (set, op) with a row per B: fp4tune's time, interval, x roofline,
/// x read floor, and each peer's time and fp4tune's speed-up over it.
pub fn markdown(title: &str, provenance: &str, rows: &[MoeRow], peers: &[MoeRow]) -> String {
    let mut md = format!("# {title}\n\n{provenance}\n");
    // fp4tune's per-expert loop and the family default (what a layer outside the table runs),
    // measured in the same run, are peer columns too.
    let default_w4a4 = format!("{}_w4a4", super::moe::DEFAULT_IMPL);
    let is_own_peer = |r: &&MoeRow| {
        r.implementation == super::moe::moe_loop::IMPL
            || r.implementation == super::moe::DEFAULT_IMPL
            || r.implementation == default_w4a4
    };
    let peers: Vec<MoeRow> = peers.iter().chain(rows.iter().filter(is_own_peer)).cloned().collect();
    let peers = &peers[..];
    // One table per (set, op, activation type): W4A16 rows are `fp4tune_grouped` /
    // `fp4tune_layer`, W4A4 rows carry the `_w4a4` suffix.
    let mut groups: BTreeMap<(String, String, &str), Vec<&MoeRow>> = BTreeMap::new();
    for r in rows.iter() {
        let a_type = match r.implementation.as_str() {
            "fp4tune_grouped" | "fp4tune_layer" => "",
            "fp4tune_grouped_w4a4" | "fp4tune_layer_w4a4" => " w4a4",
            _ => continue,
        };
        groups.entry((r.set.clone(), r.op.clone(), a_type)).or_default().push(r);
    }
    let peer_names: Vec<String> = {
        let mut v: Vec<String> = peers.iter().map(|p| p.implementation.clone()).collect();
        v.sort();
        v.dedup();
        v
    };
    for ((set, op, a_type), list) in groups {
        let first = list[0];
        let _ = writeln!(
            md,
            "\n## {set} {op}{a_type} (N {} x K {}, {} experts, top-{})\n",
            first.n, first.k, first.experts, first.top_k
        );
        // fp4tune's per-expert loop runs W4A16 GEMMs: no peer of a W4A4 layer; each activation
        // type's family default is a peer of its own rows only.
        let peer_names: Vec<&String> = peer_names
            .iter()
            .filter(|p| match a_type.is_empty() {
                true => **p != default_w4a4,
                false => {
                    p.as_str() != super::moe::moe_loop::IMPL
                        && p.as_str() != super::moe::DEFAULT_IMPL
                }
            })
            .collect();
        let mut head =
            String::from("| B | active | fp4tune us (95% CI) | x roofline | x read floor |");
        let mut rule = String::from("|---|---|---|---|---|");
        for p in &peer_names {
            let _ = write!(head, " {p} us (fp4tune x faster) |");
            rule.push_str("---|");
        }
        head.push_str(" configuration (verified / failed) |");
        rule.push_str("---|");
        let _ = writeln!(md, "{head}\n{rule}");
        for r in list {
            let floor = if r.read_floor_us > 0.0 {
                format!("{:.2}", r.median_us / r.read_floor_us)
            } else {
                "-".into()
            };
            let roof = if r.roofline_us > 0.0 {
                format!("{:.2}", r.median_us / r.roofline_us)
            } else {
                "-".into()
            };
            let mut line = format!(
                "| {} | {} | {:.2} ({:.2}-{:.2}) | {roof} | {floor} |",
                r.tokens, r.active_experts, r.median_us, r.lo_us, r.hi_us
            );
            for p in &peer_names {
                match peers.iter().find(|x| {
                    &x.implementation == *p
                        && x.set == r.set
                        && x.op == r.op
                        && x.tokens == r.tokens
                }) {
                    // a peer that could not run the step (its reason is in the CSV's config)
                    Some(x) if !x.median_us.is_finite() => line.push_str(" failed |"),
                    Some(x) => {
                        let _ = write!(
                            line,
                            " {:.1} ({:.2}x) |",
                            x.median_us,
                            x.median_us / r.median_us
                        );
                    }
                    None => line.push_str(" - |"),
                }
            }
            let _ = write!(line, " `{}` ({} / {}) |", r.config, r.verified, r.failed);
            let _ = writeln!(md, "{line}");
        }
    }
    let fixed: Vec<&MoeRow> =
        rows.iter().filter(|r| FIXED_KERNEL_ROWS.contains(&r.implementation.as_str())).collect();
    if !fixed.is_empty() {
        // the columns of the kernels this run timed (the quantization of X: W4A4 runs)
        let columns: Vec<usize> = (0..FIXED_KERNEL_ROWS.len())
            .filter(|&c| fixed.iter().any(|r| r.implementation == FIXED_KERNEL_ROWS[c]))
            .collect();
        // the sentence on the one launch where a size of this run took it
        let quantizes = columns.contains(&4);
        let titles: String =
            columns.iter().map(|&c| format!(" {} |", FIXED_KERNEL_COLUMNS[c])).collect();
        let _ = writeln!(
            md,
            "\n## Routing and finalize kernels alone\n\nmoe_align in both forms (one CTA in rounds of \
             {threads} ids; chunked: three launches of one CTA per {threads} ids); the layer takes the \
             chunked form from {min} routed ids (tokens x top_k){fused}.\n\n\
             | set | B |{titles}\n|---|---|{rules}",
            threads = ALIGN_THREADS,
            min = ALIGN_CHUNKED_MIN_IDS,
            fused = if quantizes {
                "; with bf16 X to quantize it launches the one-CTA form and the quantization of X \
                 as one kernel where that kernel's CTAs fit in one wave"
            } else {
                ""
            },
            rules = "---|".repeat(columns.len()),
        );
        let mut keys: Vec<(String, u32)> =
            fixed.iter().map(|r| (r.set.clone(), r.tokens)).collect();
        keys.dedup();
        for (set, b) in keys {
            let mut line = format!("| {set} | {b} |");
            for &c in &columns {
                let cell = fixed
                    .iter()
                    .find(|r| {
                        r.set == set && r.tokens == b && r.implementation == FIXED_KERNEL_ROWS[c]
                    })
                    .map_or("-".to_string(), |r| format!("{:.2}", r.median_us));
                let _ = write!(line, " {cell} |");
            }
            let _ = writeln!(md, "{line}");
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn screen_csv_has_one_record_per_candidate_and_keeps_failures_on_one_line() {
        use crate::bench::moe::Measured;
        use crate::moe::{MoeOp, MoeShape};
        let space = crate::moe::space::search_space(MoeOp::Down, &MoeShape::GLM5_TP8);
        let s = crate::bench::Summary { n: 5, median: 4.5, lo: 4.25, hi: 4.75, min: 4.0, max: 5.0 };
        let logs = vec![(
            "tp8".to_string(),
            64,
            MoeOp::Down,
            vec![
                Measured {
                    config: space[0],
                    outcome: Outcome::Timed(s),
                    ptxas: Some(crate::compile::PtxasStats { registers: 96, ..Default::default() }),
                },
                Measured {
                    config: space[1],
                    outcome: Outcome::Failed("a, b\nc".into()),
                    ptxas: None,
                },
            ],
        )];
        let text = screen_csv("w4a16", &logs);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0], SCREEN_CSV_HEADER);
        let n = SCREEN_CSV_HEADER.split(',').count();
        assert!(lines.iter().all(|l| l.split(',').count() == n), "{text}");
        assert_eq!(
            lines[1],
            format!("tp8,moe_down,w4a16,64,{},4.500,4.250,4.750,ok,96,0,0", space[0].name())
        );
        assert!(lines[2].ends_with(",,,,a; b;c,,,"), "{}", lines[2]);
    }

    fn row(implementation: &str, tokens: u32, median: f64) -> MoeRow {
        MoeRow {
            set: "tp8".into(),
            op: "moe_gate_up".into(),
            n: 512,
            k: 6144,
            experts: 256,
            top_k: 8,
            tokens,
            active_experts: 8,
            implementation: implementation.into(),
            config: "c".into(),
            median_us: median,
            lo_us: median * 0.99,
            hi_us: median * 1.01,
            roofline_us: 3.3,
            read_floor_us: 6.0,
            verified: 10,
            failed: 1,
        }
    }

    #[test]
    fn csv_round_trips_and_has_the_result_columns_first() {
        let rows = vec![row("fp4tune_grouped", 1, 8.5), row("torch_grouped_mm_bf16", 1, 37.8)];
        let text = csv(&rows);
        assert!(text.starts_with(
            "op,N,K,experts,top_k,B,impl,median_us,lo_us,hi_us,roofline_us,read_floor_us"
        ));
        let back = parse_csv(&text, "x.csv").unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].implementation, "torch_grouped_mm_bf16");
        assert_eq!(back[0].median_us, 8.5);
        let err = parse_csv(&format!("{CSV_HEADER}\nmoe_gate_up,1,2\n"), "p.csv").unwrap_err();
        assert!(err.starts_with("p.csv:2:"), "{err}");
        // another header (columns renamed or reordered) is refused: they are read by position
        let swapped = text.replacen("median_us,lo_us,hi_us", "hi_us,lo_us,median_us", 1);
        let err = parse_csv(&swapped, "s.csv").unwrap_err();
        assert!(err.starts_with("s.csv:1: not a bench-moe CSV"), "{err}");
        assert!(parse_csv("h\n", "h.csv").unwrap_err().contains("found `h`"));
        // a negative or non-finite time is refused with its line
        for bad in ["-8.5", "NaN"] {
            let text = csv(&rows).replacen("8.500", bad, 1);
            let err = parse_csv(&text, "q.csv").unwrap_err();
            assert!(err.starts_with("q.csv:2:") && err.contains("not a time"), "{bad}: {err}");
        }
        // a peer that failed on the step: NaN times, its reason (commas and all) in one field,
        // read back and rendered as failed
        let mut failed = row("fp4tune_loop", 1, f64::NAN);
        (failed.lo_us, failed.hi_us) = (f64::NAN, f64::NAN);
        failed.config = format!("{FAILED_ROW}route: no legal configuration, K = 176");
        let text = csv(&[rows[0].clone(), failed]);
        let back = parse_csv(&text, "f.csv").unwrap();
        assert!(back[1].median_us.is_nan() && back[1].config.ends_with("configuration; K = 176"));
        let md = markdown("t", "p", &back, &[]);
        let line = md.lines().find(|l| l.starts_with("| 1 | 8 | 8.50 ")).unwrap();
        assert!(line.contains("| failed |") && !line.contains("NaN"), "{md}");
        let roof = text.replacen("3.300,6.000,tp8,8,failed", "NaN,6.000,tp8,8,failed", 1);
        assert_ne!(roof, text);
        // a failed row with a time is refused (it would render as a timed peer)
        let timed = text.replacen("NaN,NaN,NaN", "8.000,NaN,NaN", 1);
        assert_ne!(timed, text);
        assert!(parse_csv(&timed, "h.csv").unwrap_err().contains("not a time"), "{timed}");
        assert!(parse_csv(&roof, "g.csv").unwrap_err().contains("not a time"), "{roof}");
        // rows no benchmark writes: an unknown op, a size of 0, a median outside its interval,
        // a field more
        let good = csv(&rows);
        let line2 = good.lines().nth(1).unwrap().to_string();
        let with = |l: String| format!("{CSV_HEADER}\n{l}\n");
        let cases = [
            (line2.replacen("moe_gate_up", "moe_bogus", 1), "op `moe_bogus`"),
            (line2.replacen(",8,", ",0,", 1), "top_k is 0"),
            (line2.replacen("8.500,", "99.000,", 1), "outside its interval"),
            (format!("{line2},extra"), "not a bench-moe row"),
        ];
        for (l, want) in cases {
            assert_ne!(l, line2);
            let err = parse_csv(&with(l), "r.csv").unwrap_err();
            assert!(err.starts_with("r.csv:2:") && err.contains(want), "{want}: {err}");
        }
    }

    #[test]
    fn the_per_expert_loop_rows_are_a_peer_column() {
        let rows = [row("fp4tune_grouped", 1, 8.25), row("fp4tune_loop", 1, 33.0)];
        let md = markdown("t", "p", &rows, &[]);
        assert!(md.contains(" fp4tune_loop us (fp4tune x faster) |"), "{md}");
        assert!(md.contains("| 1 | 8 | 8.25 (8.17-8.33) | 2.50 | 1.38 | 33.0 (4.00x) |"), "{md}");
    }

    /// The family default's rows are a peer column of their activation type's tables only.
    #[test]
    fn the_family_default_rows_are_a_peer_column_of_their_activation_type() {
        let rows = [
            row("fp4tune_grouped", 1, 8.25),
            row("fp4tune_default", 1, 9.9),
            row("fp4tune_grouped_w4a4", 1, 11.0),
            row("fp4tune_default_w4a4", 1, 13.2),
        ];
        let md = markdown("t", "p", &rows, &[]);
        let (w4a16, w4a4) = md.split_once("## tp8 moe_gate_up w4a4 (").expect("a W4A4 table");
        assert!(w4a16.contains("| 1 | 8 | 8.25 (8.17-8.33) | 2.50 | 1.38 | 9.9 (1.20x) |"), "{md}");
        assert!(!w4a16.contains("fp4tune_default_w4a4"), "{md}");
        assert!(w4a4.contains(" fp4tune_default_w4a4 us (fp4tune x faster) |"), "{md}");
        assert!(w4a4.contains(" 13.2 (1.20x) |") && !w4a4.contains("fp4tune_default us"), "{md}");
    }

    #[test]
    fn w4a4_rows_get_their_own_tables_without_the_w4a16_loop_peer() {
        let rows = [
            row("fp4tune_grouped", 1, 8.25),
            row("fp4tune_grouped_w4a4", 1, 11.0),
            row("fp4tune_loop", 1, 33.0),
        ];
        let md = markdown("t", "p", &rows, &[row("torch_grouped_mm_bf16", 1, 37.8)]);
        let (w4a16, w4a4) = md.split_once("## tp8 moe_gate_up w4a4 (").expect("a W4A4 table");
        assert!(w4a16.contains("## tp8 moe_gate_up (N 512 x K 6144"), "{md}");
        assert!(w4a16.contains("| 1 | 8 | 8.25 (8.17-8.33) | 2.50 | 1.38 | 33.0 (4.00x) | 37.8"));
        assert!(!w4a4.contains("fp4tune_loop"), "{md}");
        assert!(
            w4a4.contains("| 1 | 8 | 11.00 (10.89-11.11) | 3.33 | 1.83 | 37.8 (3.44x) |"),
            "{md}"
        );
    }

    #[test]
    fn markdown_shows_ratios_against_roofline_floor_and_peers() {
        let md = markdown(
            "t",
            "p",
            &[row("fp4tune_grouped", 1, 8.25)],
            &[row("torch_grouped_mm_bf16", 1, 37.8)],
        );
        assert!(md.contains("| 1 | 8 | 8.25 (8.17-8.33) | 2.50 | 1.38 | 37.8 (4.58x) |"), "{md}");
    }
    #[test]
    fn fixed_kernels_get_a_column_each_and_the_quantization_of_x_only_when_timed() {
        let w4a16 = [row("moe_align", 1, 3.0), row("moe_align_chunked", 1, 5.0)];
        let md = markdown("t", "p", &w4a16, &[]);
        assert!(md.contains("| set | B | moe_align one CTA us | moe_align chunked us |\n"), "{md}");
        assert!(md.contains("| tp8 | 1 | 3.00 | 5.00 |"), "{md}");
        assert!(!md.contains("quantize"), "{md}");
        let mut w4a4 = w4a16.to_vec();
        w4a4.extend([
            row("moe_finalize", 1, 2.0),
            row("moe_quantize_x", 1, 2.5),
            row("moe_align_quantize_x", 1, 3.25),
            row("moe_quantize_x", 2, 2.75),
        ]);
        let md = markdown("t", "p", &w4a4, &[]);
        assert!(
            md.contains(" quantize X us | moe_align + quantize X in one launch us |\n"),
            "{md}"
        );
        assert!(md.contains("as one kernel where"), "{md}");
        assert!(md.contains("| tp8 | 1 | 3.00 | 5.00 | 2.00 | 2.50 | 3.25 |"), "{md}");
        // a size without the one launch (prefill) shows a dash there
        assert!(md.contains("| tp8 | 2 | - | - | - | 2.75 | - |"), "{md}");
        // a run of prefill sizes only: the quantizer's column, not the one launch's sentence
        let md = markdown("t", "p", &[row("moe_quantize_x", 2, 2.75)], &[]);
        assert!(md.contains("| quantize X us |") && !md.contains("as one kernel"), "{md}");
    }
}
