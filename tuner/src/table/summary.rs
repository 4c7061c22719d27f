//! A human summary of a table (what `fp4tune table --check FILE` prints).

use super::schema::Table;
use std::collections::BTreeMap;
use std::fmt::Write;

/// What one shape's line says of its entries (in bucket order): the buckets, the number of
/// distinct configurations, the fastest and the slowest median.
struct Span {
    buckets: String,
    configs: usize,
    lo: f64,
    hi: f64,
}

impl Span {
    fn of<C: Ord>(entries: impl Iterator<Item = (u32, C, f64)>) -> Self {
        let (mut buckets, mut configs) = (Vec::new(), Vec::new());
        let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
        for (bucket, config, median) in entries {
            buckets.push(bucket.to_string());
            configs.push(config);
            lo = lo.min(median);
            hi = hi.max(median);
        }
        configs.sort();
        configs.dedup();
        Span { buckets: buckets.join(", "), configs: configs.len(), lo, hi }
    }
}

/// Device, toolchain, policy, template hashes, then one line per shape: its buckets, the number of
/// distinct winning configurations, and the median time range.
pub fn summary(table: &Table) -> String {
    let mut out = String::new();
    let d = &table.device;
    let _ = writeln!(
        out,
        "device: {} (compute capability {}.{}, {} SMs)",
        d.name, d.compute_capability.0, d.compute_capability.1, d.sm_count
    );
    let t = &table.toolchain;
    let _ = writeln!(
        out,
        "toolchain: NVRTC {}.{}, driver {}.{}",
        t.nvrtc.0, t.nvrtc.1, t.driver.0, t.driver.1
    );
    let _ = writeln!(out, "timing policy: {}", table.timing_policy);
    for (family, hash) in &table.template_hashes {
        let _ = writeln!(out, "templates {family}: {}", crate::template::short_hash(hash, 16));
    }
    type Shape = (String, String, String, u32, u32, Option<u32>);
    let mut shapes: BTreeMap<Shape, Vec<&super::Entry>> = BTreeMap::new();
    for e in &table.entries {
        let k = &e.key;
        let shape = (k.op.clone(), k.family.to_string(), k.a_type.to_string(), k.n, k.k, k.experts);
        shapes.entry(shape).or_default().push(e);
    }
    let _ = writeln!(out, "entries: {} over {} shapes", table.entries.len(), shapes.len());
    for ((op, family, a_type, n, k, experts), mut entries) in shapes {
        entries.sort_by_key(|e| e.key.m);
        let s = Span::of(entries.iter().map(|e| (e.key.m, e.config, e.median_us)));
        let e = experts.map(|e| format!(" E={e}")).unwrap_or_default();
        let composite: Vec<String> =
            entries.iter().filter(|e| !e.method.is_fused()).map(|e| e.key.m.to_string()).collect();
        let composite = if composite.is_empty() {
            String::new()
        } else {
            format!(", dequantize-then-cuBLAS at M = {}", composite.join(", "))
        };
        let _ = writeln!(
            out,
            "  {op} {family} {a_type} N={n} K={k}{e}: {} entries, buckets [{}], {} distinct configs, median {:.2}..{:.2} us{composite}",
            entries.len(),
            s.buckets,
            s.configs,
            s.lo,
            s.hi,
        );
    }
    if !table.moe.is_empty() {
        let hash = table.moe_template_hash.as_deref().unwrap_or("");
        type Layer = (String, String, String, u32, u32, u32, u32);
        let mut layers: BTreeMap<Layer, Vec<&super::MoeEntry>> = BTreeMap::new();
        for e in &table.moe {
            let k = &e.key;
            let layer = (
                k.op.to_string(),
                k.family.to_string(),
                k.a_type.to_string(),
                k.n,
                k.k,
                k.experts,
                k.top_k,
            );
            layers.entry(layer).or_default().push(e);
        }
        let _ = writeln!(
            out,
            "grouped entries: {} over {} projections, templates {}",
            table.moe.len(),
            layers.len(),
            crate::template::short_hash(hash, 16)
        );
        for ((op, family, a_type, n, k, experts, top_k), mut entries) in layers {
            entries.sort_by_key(|e| e.key.tokens);
            let s = Span::of(entries.iter().map(|e| (e.key.tokens, e.config, e.median_us)));
            let _ = writeln!(
                out,
                "  {op} {family} {a_type} N={n} K={k} E={experts} top_k={top_k}: {} entries, B [{}], {} distinct configs, median {:.2}..{:.2} us",
                entries.len(),
                s.buckets,
                s.configs,
                s.lo,
                s.hi,
            );
        }
    }
    if let Some(c) = &table.campaign {
        let _ = writeln!(
            out,
            "campaign: {:.1} s wall ({:.1} s GEMM keys{}), cubin cache {}, {} screened, {} timed, strategy {}",
            c.wall_s,
            c.gemm_wall_s,
            c.moe_wall_s.map(|s| format!(", {s:.1} s grouped")).unwrap_or_default(),
            c.cache,
            c.screened,
            c.timed,
            c.strategy
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::schema::tests::sample;

    #[test]
    fn summary_lists_device_shapes_and_buckets() {
        let s = summary(&sample());
        assert!(s.starts_with("device: NVIDIA H200 (compute capability 9.0, 132 SMs)"), "{s}");
        assert!(s.contains("entries: 4 over 2 shapes"), "{s}");
        assert!(s.contains("gemm sm90 w4a16 N=512 K=6144: 3 entries, buckets [1, 16, 256]"), "{s}");
        assert!(s.contains("N=6144 K=256: 1 entries, buckets [1]"), "{s}");
        assert!(s.contains("median 3.25..9.00 us"), "{s}");
        assert!(!s.contains("grouped entries"), "{s}");
    }

    #[test]
    fn summary_lists_grouped_projections_and_the_campaign() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
        let t = Table::load(&root.join("h200/tune-default/nvidia-h200.ron")).unwrap();
        let s = summary(&t);
        assert!(s.contains("grouped entries: 24 over 2 projections"), "{s}");
        assert!(
            s.contains("moe_gate_up sm90 w4a16 N=512 K=6144 E=256 top_k=8: 12 entries, B [1, 2, 4"),
            "{s}"
        );
        assert!(s.contains("campaign: ") && s.contains("strategy race"), "{s}");
    }
}
