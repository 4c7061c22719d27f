//! The dispatch table (`results/<sku>.ron`): schema, validation, device checks, lookup with fallback.
//!
//! A table is what a tuning run hands to serving code: for every (operation, kernel family,
//! activation type, N, K, token bucket) the configuration that won, with its median time, its
//! confidence interval, its roofline fraction and the runners-up that tied with it. It records the
//! device, the toolchain, the template-source hash of every family and the timing policy, so a
//! table made on another GPU or with other kernel sources is detected at load time
//! ([`Table::check_against`]).
//!
//! # Format (schema version 5)
//!
//! ```text
//! (
//!     schema_version: 5,
//!     device: (name: "NVIDIA H200", compute_capability: (9, 0), sm_count: 132),
//!     toolchain: (nvrtc: (13, 0), driver: (13, 0)),
//!     template_hashes: {Sm90: "3f1c..."},
//!     timing_policy: "graph-replay cold-L2 x4 ...",
//!     entries: [
//!         (
//!             key: (op: "gemm", family: Sm90, a_type: Bf16, n: 512, k: 6144, m: 1),
//!             config: (family: Sm90, a_type: Bf16, block_m: 16, ..., pipeline: WarpRing),
//!             median_us: 3.1, interval_us: (3.0, 3.2), roofline_fraction: 0.41,
//!             runners_up: [(config: (...), median_us: 3.15)],
//!         ),
//!         (
//!             key: (op: "gemm", family: Sm90, a_type: Bf16, n: 512, k: 6144, m: 1024),
//!             method: DequantCublasBf16,
//!             config: (...), median_us: 17.0, ...
//!         ),
//!     ],
//! )
//! ```
//!
//! `method` (version 2) is `Fused` when absent: the entry launches `config`. `DequantCublasBf16`
//! means the tuner measured the composite path (W expanded to bf16 by fp4tune's kernel, then
//! cuBLAS BF16) faster than every fused kernel; the entry's times are the composite's, and
//! `config` is the best fused kernel, which the runtime launches when cuBLAS cannot be loaded.
//! Version 1 tables (no `method`) are read as all-fused; a reader that knows only version 1
//! refuses version 2 by its `schema_version`.
//!
//! `pipeline` (`CpAsync`, `Registers`, `WarpRing`, `Global`, and `KTail`, the cp.async ring's
//! K-tail form) and `min_ctas` are optional in the configuration: a table without them reads as
//! `CpAsync` with `min_ctas: 1`; a reader older than the fields would
//! ignore them, but such a table also carries a template hash the old reader does not have, so
//! [`Table::check_against`] flags it before anything is launched. An illegal value (a `min_ctas`
//! out of range, a streamed pipeline in an sm120 entry) is a validation error naming the entry.
//!
//! # Lookup order ([`Lookup::resolve`])
//!
//! 1. exact: an entry of the same (op, family, a_type, N, K) at bucket M;
//! 2. nearest bucket of the same shape: the smallest bucket >= M, else the largest (then the
//!    remaining buckets, larger ones first ascending, then smaller ones descending, until one is
//!    legal for the problem);
//! 3. the table's common configuration: among the winners of the same (op, family, a_type), the one
//!    that wins most entries (ties: most runner-up appearances, then the smallest configuration in
//!    `GemmConfig`'s order), the first in that ranking that is legal for the problem;
//! 4. the family default ([`crate::template::fallback_configs`]: up to
//!    [`crate::template::DECODE_DEFAULT_MAX_M`] rows the decode defaults first, more rows the
//!    prefill defaults, then the generic configuration, on sm120 its 64-k stage form, and its
//!    K-tail form; the first legal for the problem).
//!
//! Steps 3 and 4 come with a [`Fallback`] that says what was missing (the shape, or a family
//! disabled by a device/template mismatch, or no legal entry), so the caller can warn.
//!
//! # Grouped MoE entries (schema version 3)
//!
//! The grouped MoE layer has its own section, `moe: [(key: (op: GateUp, family: Sm90, a_type:
//! Bf16, n: 512, k: 6144, experts: 256, top_k: 8, tokens: 64), config: (op: GateUp, block_m: 8,
//! ...), median_us, interval_us, skewed_us, routing_seed, roofline_fraction, experts_total:
//! Some(256)), ...]`, next to
//! `moe_template_hash` (the grouped kernels' template hash). A [`MoeKey`] is one projection of
//! one layer shape (per-expert N and K, local experts, top_k) at one token count B; its
//! [`MoeEntry`] holds the [`crate::moe::GroupedConfig`] the tuner chose and its times on the
//! uniform routing of `routing_seed` (drawn over `experts_total` experts of the model, version 5;
//! absent: every expert local) and on the skewed guard draw. Versions 1 and 2 cannot hold the
//! section (a file that says otherwise is refused); the runtime picks, per step, the entry
//! whose B is nearest in log scale. The `"grouped_gemm"` op of [`TableKey`] (a grouped GEMM with
//! a per-expert M and a `GemmConfig`) is a reserved key form that no tuner writes.

mod check;
mod lookup;
mod schema;
mod summary;
mod validate;

pub use check::{Mismatch, MismatchPolicy, TableCheck};
pub use lookup::{Bucket, Fallback, Lookup, LookupError, Missing, Resolved};
pub use schema::{
    Campaign, DeviceIdentity, Entry, Method, MoeEntry, MoeKey, RunnerUp, Table, TableError,
    TableKey, Toolchain, KNOWN_OPS, OP_GEMM, OP_GROUPED_GEMM, TABLE_SCHEMA_VERSION,
    TABLE_SCHEMA_VERSIONS_READ,
};
pub use summary::summary;
pub use validate::{implausible_time, reportable_time, MAX_ROOFLINE_FRACTION, MIN_PLAUSIBLE_US};

/// Fixtures other modules' tests build on (a small legal table, fabricated devices).
#[cfg(test)]
pub(crate) mod tests_support {
    pub(crate) use super::check::tests::device;
    pub(crate) use super::schema::tests::sample;
}

#[cfg(test)]
mod committed_tables {
    //! The dispatch tables committed under results/ must stay loadable by this version.

    /// Every dispatch table under results/ (`*.ron`), loaded, with its path.
    fn committed() -> Vec<(std::path::PathBuf, super::Table)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "ron") {
                let t = super::Table::load(&p).unwrap_or_else(|err| panic!("{err}"));
                out.push((p, t));
            }
        }
        assert!(!out.is_empty(), "no dispatch table under {}", dir.display());
        out
    }

    #[test]
    fn committed_tables_load_and_validate() {
        for (p, t) in committed() {
            for (family, hash) in &t.template_hashes {
                if *hash != crate::template::family_template_hash(*family) {
                    eprintln!(
                        "note: {} was tuned with other {family} templates; the runtime falls back \
                         to defaults for it until it is re-tuned",
                        p.display()
                    );
                }
            }
        }
    }

    /// Every grouped kernel a committed table names compiles with this NVRTC without spilling and
    /// without touching local memory: tunes, benchmarks and the self-test refuse such a kernel,
    /// so a table that names one fails its own GPU checks. (A tune whose compile left no ptxas
    /// report judges a candidate by the loaded function's local memory; this checks the ptxas
    /// report and the SASS.) Needs NVRTC and cuobjdump (scripts/cuda-tools.sh).
    #[test]
    fn committed_grouped_entries_compile_without_local_memory() {
        let mut configs = Vec::new();
        for (_, t) in committed() {
            for m in &t.moe {
                if !configs.contains(&m.config) {
                    configs.push(m.config);
                }
            }
        }
        assert!(configs.len() >= 20, "{} grouped kernels in the committed tables", configs.len());
        let kernels: Vec<_> = configs.iter().map(|c| (c.to_string(), c.source())).collect();
        let problems = crate::compile::sass::kernels_with_local_memory(&kernels);
        assert!(
            problems.is_empty(),
            "committed grouped kernels with local memory:\n{}",
            problems.join("\n")
        );
    }
}
