//! Benchmark reports: one CSV row per (shape, M, implementation) and a markdown summary.

use super::composite::NAME as COMPOSITE;
use super::stats::Summary;
use crate::gpu::DeviceInfo;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One measured implementation on one problem.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub shape: String,
    pub n: u32,
    pub k: u32,
    pub m: u32,
    pub a_type: String,
    /// Our kernel configuration name, or the peer's name.
    pub implementation: String,
    pub time: Summary,
    /// max(bytes / measured bandwidth, FLOPs / tensor peak) for NVFP4 bytes.
    pub roofline_us: f64,
    /// Cold read floor of the NVFP4 weight + activation bytes, measured in this run.
    pub read_floor_us: f64,
    pub bytes: u64,
    /// Verification result against the CPU reference ("ok", or the reason it failed; peers: "-").
    pub verified: String,
}

/// Everything a report states about how and where it was measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Provenance {
    pub command: String,
    pub device: DeviceInfo,
    pub nvrtc_version: (i32, i32),
    /// The NVRTC build (`compile::Compiler::nvrtc_build`), e.g. `13.0.88 (CL-36424714)`.
    #[serde(default)]
    pub nvrtc_build: String,
    pub timing_policy: String,
    pub bandwidth_gbps: f64,
    pub launch_floor_us: f64,
    pub tensor_peak_tflops: f64,
    pub template_hash: String,
    pub date: String,
}

pub const CSV_HEADER: &str = "shape,N,K,M,a_type,impl,median_us,lo_us,hi_us,roofline_us,read_floor_us,x_roofline,x_read_floor,bytes,GBps,samples,verified";

pub fn csv(rows: &[Row]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.2},{:.2},{},{:.0},{},{}",
            r.shape,
            r.n,
            r.k,
            r.m,
            r.a_type,
            r.implementation,
            r.time.median,
            r.time.lo,
            r.time.hi,
            r.roofline_us,
            r.read_floor_us,
            r.time.median / r.roofline_us,
            r.time.median / r.read_floor_us,
            r.bytes,
            r.bytes as f64 / (r.time.median * 1e3),
            r.time.n,
            r.verified.replace(',', ";")
        );
    }
    out
}

/// Markdown: provenance, then per (shape, M) the best of our kernels against the peers.
pub fn markdown(title: &str, prov: &Provenance, rows: &[Row], peers: &[&str]) -> String {
    let mut md = String::new();
    let d = &prov.device;
    let _ = writeln!(md, "# {title}\n");
    let _ = writeln!(
        md,
        "Measured on **{}** (SM {}.{}, {} SMs, L2 {} MiB, driver {}.{}, NVRTC {}), {}.\n",
        d.name,
        d.compute_capability.0,
        d.compute_capability.1,
        d.sm_count,
        d.l2_bytes >> 20,
        d.driver_version.0,
        d.driver_version.1,
        if prov.nvrtc_build.is_empty() {
            format!("{}.{}", prov.nvrtc_version.0, prov.nvrtc_version.1)
        } else {
            prov.nvrtc_build.clone()
        },
        prov.date
    );
    let _ = writeln!(md, "Command:\n\n```\n{}\n```\n", prov.command);
    let _ = writeln!(md, "- Timing policy: {}", prov.timing_policy);
    let _ = writeln!(
        md,
        "- Measured read bandwidth: {:.0} GB/s; launch floor (empty kernel, same policy): {:.2} us",
        prov.bandwidth_gbps, prov.launch_floor_us
    );
    let _ = writeln!(md, "- Roofline: NVFP4 bytes / measured bandwidth vs 2MNK / {:.0} TFLOP/s ({}); read floor: one kernel streaming the same bytes cold, best grid, this run", prov.tensor_peak_tflops, crate::search::DeviceModel::data_path_peak_label(&prov.device.name, prov.device.compute_capability));
    let _ = writeln!(md, "- Template source hash: `{}`", prov.template_hash);
    let _ = writeln!(
        md,
        "- Every fp4tune kernel was verified against the CPU reference before it was timed.\n"
    );
    let mut header = String::from(
        "| shape | N x K | M | best fp4tune kernel | us [95% CI] | x read floor | x roofline |",
    );
    let mut sep = String::from("|---|---|---|---|---|---|---|");
    for p in peers {
        let _ = write!(header, " {p} us | speedup vs {p} |");
        sep.push_str("---|---|");
    }
    // The dequantize-then-cuBLAS path (bench::composite): its time and its ratio to cuBLAS BF16.
    let composite = rows.iter().any(|r| r.implementation == COMPOSITE);
    if composite {
        let _ = write!(header, " {COMPOSITE} us | x cublas_bf16 time |");
        sep.push_str("---|---|");
    }
    let _ = writeln!(md, "{header}\n{sep}");
    let mut keys: Vec<(String, u32, u32, u32)> =
        rows.iter().map(|r| (r.shape.clone(), r.n, r.k, r.m)).collect();
    keys.dedup();
    for (shape, n, k, m) in keys {
        let of = |r: &&Row| r.shape == shape && r.m == m && r.n == n && r.k == k;
        let ours = rows
            .iter()
            .filter(of)
            .filter(|r| {
                !peers.contains(&r.implementation.as_str()) && r.implementation != COMPOSITE
            })
            .min_by(|a, b| a.time.median.total_cmp(&b.time.median));
        let Some(best) = ours else { continue };
        let _ = write!(
            md,
            "| {shape} | {n} x {k} | {m} | `{}` | {:.2} [{:.2}, {:.2}] | {:.2} | {:.2} |",
            best.implementation,
            best.time.median,
            best.time.lo,
            best.time.hi,
            best.time.median / best.read_floor_us,
            best.time.median / best.roofline_us
        );
        for p in peers {
            match rows.iter().filter(of).find(|r| r.implementation == *p) {
                Some(pr) => {
                    let _ = write!(
                        md,
                        " {:.2} | {:.2}x |",
                        pr.time.median,
                        pr.time.median / best.time.median
                    );
                }
                None => md.push_str(" - | - |"),
            }
        }
        if composite {
            let find = |name: &str| rows.iter().filter(of).find(|r| r.implementation == name);
            match (find(COMPOSITE), find("cublas_bf16")) {
                (Some(c), Some(b)) => {
                    let _ = write!(
                        md,
                        " {:.2} | {:.2}x |",
                        c.time.median,
                        c.time.median / b.time.median
                    );
                }
                (Some(c), None) => {
                    let _ = write!(md, " {:.2} | - |", c.time.median);
                }
                _ => md.push_str(" - | - |"),
            }
        }
        md.push('\n');
    }
    md
}

/// The markdown section listing candidates that produced no timing (empty without failures).
pub fn failures_markdown(failures: &[super::run::Failure]) -> String {
    let mut md = String::new();
    if failures.is_empty() {
        return md;
    }
    let _ = write!(
        md,
        "\n## Candidates that did not produce a timing ({})\n\n| shape | M | config | reason |\n|---|---|---|---|\n",
        failures.len()
    );
    for f in failures {
        let _ = writeln!(
            md,
            "| {} | {} | `{}` | {} |",
            f.shape,
            f.m,
            f.config,
            f.reason.lines().next().unwrap_or("").replace('|', "/")
        );
    }
    md
}

/// Now in Unix seconds (0 if the clock is before 1970): report dates, and the `at` of the tune's
/// records and log lines.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Current UTC time as `YYYY-MM-DD HH:MM UTC` (no date crate needed for one line of a report).
pub fn utc_now() -> String {
    utc_date(unix_now())
}

/// `secs` since the Unix epoch as `YYYY-MM-DD HH:MM UTC`.
fn utc_date(secs: u64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(imp: &str, med: f64) -> Row {
        Row {
            shape: "tp8_gate_up".into(),
            n: 512,
            k: 6144,
            m: 1,
            a_type: "w4a16".into(),
            implementation: imp.into(),
            time: Summary {
                n: 3,
                median: med,
                lo: med * 0.9,
                hi: med * 1.1,
                min: med * 0.8,
                max: med * 1.2,
            },
            roofline_us: 0.5,
            read_floor_us: 2.0,
            bytes: 1_800_000,
            verified: "ok".into(),
        }
    }

    #[test]
    fn csv_has_the_required_columns_and_ratios() {
        let c = csv(&[row("cublas_bf16", 8.0)]);
        let mut lines = c.lines();
        let head = lines.next().unwrap();
        for col in [
            "shape",
            "N",
            "K",
            "M",
            "impl",
            "median_us",
            "lo_us",
            "hi_us",
            "roofline_us",
            "read_floor_us",
        ] {
            assert!(head.split(',').any(|h| h == col), "{col}");
        }
        let r = lines.next().unwrap();
        assert!(r.starts_with("tp8_gate_up,512,6144,1,w4a16,cublas_bf16,8.000,7.200,8.800,0.500,2.000,16.00,4.00,"), "{r}");
    }

    #[test]
    fn markdown_picks_our_best_and_computes_speedups() {
        let prov = Provenance {
            command: "fp4tune bench".into(),
            device: DeviceInfo {
                name: "X".into(),
                compute_capability: (9, 0),
                sm_count: 132,
                l2_bytes: 60 << 20,
                total_mem: 0,
                max_smem_per_block_optin: 0,
                driver_version: (13, 0),
                sm_clock_mhz: 0,
                mem_clock_mhz: 0,
                mem_bus_bits: 0,
            },
            nvrtc_version: (13, 0),
            nvrtc_build: "13.0.88 (CL-36424714)".into(),
            timing_policy: "p".into(),
            bandwidth_gbps: 4000.0,
            launch_floor_us: 0.7,
            tensor_peak_tflops: 790.0,
            template_hash: "h".into(),
            date: "d".into(),
        };
        let md = markdown(
            "t",
            &prov,
            &[row("a", 3.0), row("b", 2.0), row("cublas_bf16", 8.0)],
            &["cublas_bf16"],
        );
        assert!(md.contains("| `b` | 2.00 [1.80, 2.20] | 1.00 | 4.00 | 8.00 | 4.00x |"), "{md}");
        assert!(!md.contains(COMPOSITE), "no composite column without its rows: {md}");
        // The dequantize-then-cuBLAS path is not one of our fused kernels even when faster; its
        // column shows its time against cuBLAS BF16.
        let md = markdown(
            "t",
            &prov,
            &[row("a", 3.0), row(COMPOSITE, 1.0), row("cublas_bf16", 8.0)],
            &["cublas_bf16"],
        );
        assert!(md.contains(&format!(" {COMPOSITE} us | x cublas_bf16 time |")), "{md}");
        assert!(
            md.contains("| `a` | 3.00 [2.70, 3.30] | 1.50 | 6.00 | 8.00 | 2.67x | 1.00 | 0.12x |"),
            "{md}"
        );
    }

    #[test]
    fn dates_and_failure_sections() {
        assert_eq!(super::utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(super::utc_date(951_827_696), "2000-02-29 12:34 UTC");
        assert_eq!(super::failures_markdown(&[]), "");
        let f = crate::bench::run::Failure {
            shape: "tp8".into(),
            m: 1,
            config: "c".into(),
            reason: "a|b\nmore".into(),
        };
        assert!(super::failures_markdown(&[f]).contains("| tp8 | 1 | `c` | a/b |"));
    }
}
