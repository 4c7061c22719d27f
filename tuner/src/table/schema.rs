//! The table's persisted types, reading (validated by `validate.rs`), and stable pretty writing.

use crate::fsio::write_atomic;
use crate::moe::{GroupedConfig, MoeOp, MoeShape};
use crate::problem::{AType, GemmProblem};
use crate::template::{Family, GemmConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Version of the table format this fp4tune writes. Version 2 added `Entry::method`, version 3
/// the grouped MoE entries (`Table::moe`, `Table::moe_template_hash`), version 4 the campaign
/// block (`Table::campaign`), version 5 the model's expert count of a grouped entry's routing
/// (`MoeEntry::experts_total`).
pub const TABLE_SCHEMA_VERSION: u32 = 5;
/// Versions this fp4tune reads (a version 1 table has only fused entries, versions 1 and 2 no
/// grouped entries, versions 1 to 3 no campaign block, versions 3 and 4 grouped entries without
/// `experts_total`); others are refused.
pub const TABLE_SCHEMA_VERSIONS_READ: &[u32] = &[1, 2, 3, 4, 5];

/// How the tuning campaign behind a table ran (version 4): what it cost and how it searched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Campaign {
    /// Wall time of the whole `fp4tune tune` command, of its GEMM keys and of its grouped phase.
    pub wall_s: f64,
    pub gemm_wall_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_wall_s: Option<f64>,
    /// `cold` (no kernel of the search was in the cubin cache), `warm` (all were), `partial`, or
    /// `not counted` (a model or random search, whose workers compile as they pick),
    /// with the counts.
    pub cache: String,
    pub kernels_cached: usize,
    pub kernels_compiled: usize,
    /// Candidates evaluated under the screening policy and under the full policy (this run).
    pub screened: usize,
    pub timed: usize,
    /// Search strategy and its budget, in words.
    pub strategy: String,
    pub budget: String,
    /// The `--time-budget` given, and the keys whose search it cut short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_budget_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub short_keys: Vec<TableKey>,
    /// The device ordinals of a campaign run on several GPUs of one host (absent: one GPU).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<usize>,
    /// The shards (`i/n`) whose keys the table holds, for a shard's partial table or tables
    /// merged from shards (absent: the whole campaign in one run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<String>,
}

impl Campaign {
    /// The cache label of a campaign that found `cached` kernels and compiled `compiled`.
    pub fn cache_label(cached: usize, compiled: usize) -> &'static str {
        match (cached, compiled) {
            // a campaign whose workers compile as their strategy asks (model, random): no count
            (0, 0) => "not counted",
            (_, 0) => "warm",
            (0, _) => "cold",
            _ => "partial",
        }
    }
}

/// One weight matrix per launch.
pub const OP_GEMM: &str = "gemm";
/// All experts of a MoE layer in one launch (planned; see the module docs).
pub const OP_GROUPED_GEMM: &str = "grouped_gemm";
/// Operations this version understands; a table naming another one is refused.
pub const KNOWN_OPS: &[&str] = &[OP_GEMM, OP_GROUPED_GEMM];

/// The GPU a table was measured on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceIdentity {
    pub name: String,
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
}

/// Compiler and driver versions at measurement time (informational; kernels are recompiled).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Toolchain {
    pub nvrtc: (i32, i32),
    pub driver: (i32, i32),
}

/// What an entry is about: one operation on one weight shape at one token bucket, plus the optional
/// `experts` (grouped MoE; `None` for plain GEMMs). The tuner's measurement records use the same
/// key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableKey {
    /// [`OP_GEMM`] or [`OP_GROUPED_GEMM`].
    pub op: String,
    pub family: Family,
    pub a_type: AType,
    pub n: u32,
    pub k: u32,
    /// Token bucket: the M the configuration was measured at (per expert for grouped ops).
    pub m: u32,
    /// Experts of the layer on this GPU, for grouped ops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<u32>,
}

impl TableKey {
    /// A plain GEMM key.
    pub fn gemm(family: Family, a_type: AType, n: u32, k: u32, m: u32) -> Self {
        Self { op: OP_GEMM.into(), family, a_type, n, k, m, experts: None }
    }

    pub fn problem(&self) -> GemmProblem {
        GemmProblem::new(self.m, self.n, self.k, self.a_type)
    }
}

impl fmt::Display for TableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} N={} K={} M={}",
            self.op, self.family, self.a_type, self.n, self.k, self.m
        )?;
        if let Some(e) = self.experts {
            write!(f, " E={e}")?;
        }
        Ok(())
    }
}

/// A configuration that tied with the winner (inside the tie band).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerUp {
    pub config: GemmConfig,
    pub median_us: f64,
}

/// How an entry computes its GEMM.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub enum Method {
    /// One fused fp4tune kernel: `Entry::config`.
    #[default]
    Fused,
    /// W (and NVFP4 activations) expanded to bf16 by fp4tune's kernel into a runtime workspace,
    /// then cuBLAS BF16 with alpha (large M, where cuBLAS's kernels beat a fused mma.sync
    /// kernel). `Entry::config` stays the best fused kernel measured for the key: the fallback
    /// when cuBLAS cannot be loaded.
    DequantCublasBf16,
}

impl Method {
    pub fn is_fused(&self) -> bool {
        *self == Method::Fused
    }

    /// The name reports and routes use ("dequant_cublas_bf16" for the composite path).
    pub fn label(&self) -> &'static str {
        match self {
            Method::Fused => "fused",
            Method::DequantCublasBf16 => "dequant_cublas_bf16",
        }
    }
}

/// The selected configuration of one key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub key: TableKey,
    /// `Fused` unless the composite path measured faster (omitted from the file when `Fused`).
    #[serde(default, skip_serializing_if = "Method::is_fused")]
    pub method: Method,
    pub config: GemmConfig,
    /// Median time per launch, microseconds.
    pub median_us: f64,
    /// Confidence interval of the median (lo, hi), microseconds.
    pub interval_us: (f64, f64),
    /// Achieved fraction of the binding roofline limit (memory or compute), 0..=1 nominally.
    pub roofline_fraction: f64,
    /// Configurations within the tie band, fastest first.
    #[serde(default)]
    pub runners_up: Vec<RunnerUp>,
}

/// What a grouped MoE entry is about: one projection of one layer shape at one token bucket B
/// (the step's tokens, not rows per expert).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeKey {
    pub op: MoeOp,
    pub family: Family,
    pub a_type: AType,
    /// N and K of one expert's weight for `op`.
    pub n: u32,
    pub k: u32,
    /// Experts on this GPU (E_local).
    pub experts: u32,
    pub top_k: u32,
    /// Token bucket B.
    pub tokens: u32,
}

impl MoeKey {
    /// The layer shape the key belongs to.
    pub fn shape(&self) -> MoeShape {
        let (hidden, inter) = match self.op {
            MoeOp::GateUp => (self.k, self.n / 2),
            MoeOp::Down => (self.n, self.k),
        };
        MoeShape { hidden, inter, experts: self.experts, top_k: self.top_k }
    }
}

impl fmt::Display for MoeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} N={} K={} E={} top_k={} B={}",
            self.op,
            self.family,
            self.a_type,
            self.n,
            self.k,
            self.experts,
            self.top_k,
            self.tokens
        )
    }
}

/// The selected grouped kernel of one key, with its time on the uniform routing of the tuning
/// run and on its skewed guard draw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeEntry {
    pub key: MoeKey,
    pub config: GroupedConfig,
    pub median_us: f64,
    pub interval_us: (f64, f64),
    /// Median on the skewed routing draw (all tokens to experts 0..2 plus uniform picks).
    pub skewed_us: f64,
    /// Seed of the uniform routing draw (`moe::schedule::draw_routing`); the skewed draw used
    /// seed + 1.
    pub routing_seed: u64,
    /// Roofline time (the bytes the projection must move over the measured read bandwidth)
    /// divided by the median.
    pub roofline_fraction: f64,
    /// Routed experts of the whole model the routing was drawn over (ids 0..experts_total, of
    /// which this GPU holds 0..experts): 256 for a GLM-5 EP8 entry of 32 local experts. Absent
    /// (tables before version 5): `key.experts`, every expert local.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts_total: Option<u32>,
}

impl MoeEntry {
    /// The model's routed experts of this entry's routing (`experts_total`, or every expert
    /// local).
    pub fn routed_experts(&self) -> u32 {
        self.experts_total.unwrap_or(self.key.experts)
    }
}

/// A dispatch table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    pub schema_version: u32,
    pub device: DeviceIdentity,
    pub toolchain: Toolchain,
    /// `template::family_template_hash` of every family the entries use.
    pub template_hashes: BTreeMap<Family, String>,
    /// The timing policy the medians were measured under, in words.
    pub timing_policy: String,
    pub entries: Vec<Entry>,
    /// Hash of the grouped kernels' templates of the entries' family
    /// (`moe::templates::family_template_hash`, `Table::current_moe_template_hash`) when `moe` is
    /// not empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_template_hash: Option<String>,
    /// Grouped MoE entries (version 3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moe: Vec<MoeEntry>,
    /// The campaign that measured the entries (version 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub campaign: Option<Campaign>,
}

/// Everything that can go wrong reading, checking or writing a table. `origin` names the file.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The OS error is in the message and deliberately not a `source`: a report of the whole
    /// chain (`{:#}`) would print it twice.
    #[error("{}: cannot read the dispatch table: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    /// As `Read`: the OS error is in the message, not a `source`.
    #[error("{}: cannot write the dispatch table: {error}", path.display())]
    Write { path: PathBuf, error: std::io::Error },
    #[error("{origin}:{line}:{column}: malformed dispatch table (RON): {message}")]
    Syntax { origin: String, line: usize, column: usize, message: String },
    #[error(
        "{origin}: unsupported dispatch-table schema_version {found} (this fp4tune reads schema_version {}); \
         re-run the tuning or use a matching fp4tune",
        TABLE_SCHEMA_VERSIONS_READ.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" and ")
    )]
    SchemaVersion { origin: String, found: u32 },
    #[error("{origin}: the dispatch table has no entries")]
    Empty { origin: String },
    #[error(
        "{origin}: this is a shape file (model and shape sets), not a dispatch table: pass it as \
         --shapes; tables are what `fp4tune tune` writes (e.g. results/nvidia-h200.ron)"
    )]
    ShapeFile { origin: String },
    #[error("{origin}: {at}: {reason}")]
    Invalid { origin: String, at: String, reason: String },
    #[error("{origin}: the table does not match this device or these kernel sources: {}",
        mismatches.iter().map(|m| m.to_string()).collect::<Vec<_>>().join("; "))]
    Mismatch { origin: String, mismatches: Vec<super::Mismatch> },
}

/// Only the version, read first so a table of another schema gets a version error, not a field error.
#[derive(Deserialize)]
#[serde(rename = "Table")]
struct VersionProbe {
    schema_version: u32,
}

impl Table {
    /// An empty table for `device` (entries are added by the tuner's selection step).
    pub fn new(device: DeviceIdentity, toolchain: Toolchain, timing_policy: String) -> Self {
        Self {
            schema_version: TABLE_SCHEMA_VERSION,
            device,
            toolchain,
            template_hashes: BTreeMap::new(),
            timing_policy,
            entries: Vec::new(),
            moe_template_hash: None,
            moe: Vec::new(),
            campaign: None,
        }
    }

    /// Read, parse and validate the table at `path` (see [`Table::validate`]).
    pub fn load(path: &Path) -> Result<Table, TableError> {
        let text = crate::fsio::read_input(path)
            .map_err(|error| TableError::Read { path: path.to_path_buf(), error })?;
        // A byte-order mark (editors on Windows write one) is not part of the RON text.
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        Table::from_ron_str(text, &path.display().to_string())
    }

    /// Parse and validate a table; `origin` (a path or a label) names it in errors.
    pub fn from_ron_str(text: &str, origin: &str) -> Result<Table, TableError> {
        let ron_err = |e: ron::error::SpannedError| TableError::Syntax {
            origin: origin.to_string(),
            line: e.span.start.line,
            column: e.span.start.col,
            message: e.code.to_string().replace("struct `VersionProbe`", "the table"),
        };
        if text.trim().is_empty() {
            return Err(TableError::Syntax {
                origin: origin.to_string(),
                line: 1,
                column: 1,
                message: "the file is empty".into(),
            });
        }
        // A shape file is the file most often passed where a table belongs.
        #[derive(Deserialize)]
        struct ShapeFileProbe {
            #[allow(dead_code)]
            model: serde::de::IgnoredAny,
            #[allow(dead_code)]
            sets: serde::de::IgnoredAny,
        }
        if ron::Options::default().from_str::<ShapeFileProbe>(text).is_ok() {
            return Err(TableError::ShapeFile { origin: origin.to_string() });
        }
        // Unknown fields are ignored by the probe; a truncated file fails here with its position.
        let probe: VersionProbe = ron::Options::default().from_str(text).map_err(ron_err)?;
        if !TABLE_SCHEMA_VERSIONS_READ.contains(&probe.schema_version) {
            return Err(TableError::SchemaVersion {
                origin: origin.to_string(),
                found: probe.schema_version,
            });
        }
        let mut table: Table = ron::Options::default().from_str(text).map_err(ron_err)?;
        // Version 1 has no `method` (every entry fused, the serde default); held as version 2.
        if probe.schema_version == 1 {
            if let Some(e) = table.entries.iter().find(|e| !e.method.is_fused()) {
                return Err(TableError::Invalid {
                    origin: origin.to_string(),
                    at: format!("entry {}", e.key),
                    reason: "`method` needs schema_version 2 (this file says 1)".into(),
                });
            }
        }
        if probe.schema_version < 3 && !table.moe.is_empty() {
            return Err(TableError::Invalid {
                origin: origin.to_string(),
                at: "moe".into(),
                reason: format!(
                    "grouped entries need schema_version 3 (this file says {})",
                    probe.schema_version
                ),
            });
        }
        if probe.schema_version < 4 && table.campaign.is_some() {
            return Err(TableError::Invalid {
                origin: origin.to_string(),
                at: "campaign".into(),
                reason: format!(
                    "the campaign block needs schema_version 4 (this file says {})",
                    probe.schema_version
                ),
            });
        }
        if probe.schema_version < 5 {
            if let Some(e) = table.moe.iter().find(|e| e.experts_total.is_some()) {
                return Err(TableError::Invalid {
                    origin: origin.to_string(),
                    at: format!("moe entry {}", e.key),
                    reason: format!(
                        "`experts_total` needs schema_version 5 (this file says {})",
                        probe.schema_version
                    ),
                });
            }
        }
        table.schema_version = TABLE_SCHEMA_VERSION;
        table.validate(origin)?;
        Ok(table)
    }

    /// Stable, pretty RON: entries sorted by key, one key and one configuration per line. Parses
    /// back with [`Table::from_ron_str`] to an equal table (entries sorted).
    pub fn to_ron_string(&self) -> String {
        use std::fmt::Write;
        fn one<T: Serialize>(value: &T) -> String {
            let inline = ron::ser::PrettyConfig::new()
                .new_line("")
                .indentor("")
                .separator(" ")
                .compact_arrays(true)
                .compact_structs(true)
                .compact_maps(true);
            // Plain structs, strings, numbers and maps with enum keys: serialization cannot fail.
            ron::ser::to_string_pretty(value, inline).unwrap_or_default()
        }
        let mut entries: Vec<&Entry> = self.entries.iter().collect();
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        let mut out = String::new();
        let _ = writeln!(out, "(");
        let _ = writeln!(out, "    schema_version: {},", self.schema_version);
        let _ = writeln!(out, "    device: {},", one(&self.device));
        let _ = writeln!(out, "    toolchain: {},", one(&self.toolchain));
        let _ = writeln!(out, "    template_hashes: {},", one(&self.template_hashes));
        let _ = writeln!(out, "    timing_policy: {},", one(&self.timing_policy));
        let _ = writeln!(out, "    entries: [");
        for e in entries {
            let _ = writeln!(out, "        (");
            let _ = writeln!(out, "            key: {},", one(&e.key));
            if !e.method.is_fused() {
                let _ = writeln!(out, "            method: {},", one(&e.method));
            }
            let _ = writeln!(out, "            config: {},", one(&e.config));
            let _ = writeln!(out, "            median_us: {},", one(&e.median_us));
            let _ = writeln!(out, "            interval_us: {},", one(&e.interval_us));
            let _ = writeln!(out, "            roofline_fraction: {},", one(&e.roofline_fraction));
            if e.runners_up.is_empty() {
                let _ = writeln!(out, "            runners_up: [],");
            } else {
                let _ = writeln!(out, "            runners_up: [");
                for r in &e.runners_up {
                    let _ = writeln!(out, "                {},", one(r));
                }
                let _ = writeln!(out, "            ],");
            }
            let _ = writeln!(out, "        ),");
        }
        let _ = writeln!(out, "    ],");
        if let Some(h) = &self.moe_template_hash {
            let _ = writeln!(out, "    moe_template_hash: Some({}),", one(h));
        }
        if !self.moe.is_empty() {
            let mut moe: Vec<&MoeEntry> = self.moe.iter().collect();
            moe.sort_by_key(|e| e.key);
            let _ = writeln!(out, "    moe: [");
            for e in moe {
                let _ = writeln!(out, "        {},", one(e));
            }
            let _ = writeln!(out, "    ],");
        }
        if let Some(c) = &self.campaign {
            let _ = writeln!(out, "    campaign: Some({}),", one(c));
        }
        let _ = writeln!(out, ")");
        out
    }

    /// Validate, then write atomically (temporary file + rename), creating the folder.
    pub fn save(&self, path: &Path) -> Result<(), TableError> {
        self.validate(&path.display().to_string())?;
        let io = |error| TableError::Write { path: path.to_path_buf(), error };
        crate::fsio::create_parent_dir(path).map_err(io)?;
        write_atomic(path, self.to_ron_string().as_bytes()).map_err(io)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::template::{default_config, search_space};

    /// A small legal table: (N=512, K=6144) at buckets 1, 16, 256 and (N=6144, K=256) at 1.
    pub(crate) fn sample() -> Table {
        let space = search_space(Family::Sm90, AType::Bf16);
        let c0 = default_config(Family::Sm90, AType::Bf16);
        let c1 = *space.iter().find(|c| **c != c0).unwrap_or(&c0);
        let mut t = Table::new(
            DeviceIdentity {
                name: "NVIDIA H200".into(),
                compute_capability: (9, 0),
                sm_count: 132,
            },
            Toolchain { nvrtc: (13, 0), driver: (13, 0) },
            "graph replay, cold L2 (4x rotation), interleaved, median of 50".into(),
        );
        t.template_hashes.insert(Family::Sm90, crate::template::family_template_hash(Family::Sm90));
        let entry = |n, k, m, c: GemmConfig, us: f64| Entry {
            key: TableKey::gemm(Family::Sm90, AType::Bf16, n, k, m),
            method: Method::Fused,
            config: c,
            median_us: us,
            interval_us: (us * 0.98, us * 1.02),
            roofline_fraction: 0.25,
            runners_up: vec![RunnerUp { config: c0, median_us: us * 1.01 }],
        };
        t.entries = vec![
            entry(512, 6144, 16, c1, 4.5),
            entry(512, 6144, 1, c1, 3.25),
            entry(512, 6144, 256, c0, 9.0),
            entry(6144, 256, 1, c1, 2.0),
        ];
        t
    }

    pub(crate) fn err(text: &str) -> String {
        Table::from_ron_str(text, "results/h200.ron").unwrap_err().to_string()
    }

    /// Tables written before `GemmConfig::pipeline` existed read as the cp.async kernels they ran;
    /// a streamed-pipeline entry round-trips.
    #[test]
    fn pipeline_field_defaults_to_cp_async_and_round_trips() {
        use crate::template::Pipeline;
        let mut t = sample();
        let streamed = search_space(Family::Sm90, AType::Bf16)
            .into_iter()
            .find(|c| c.pipeline == Pipeline::WarpRing)
            .unwrap();
        t.entries[0].config = streamed;
        let key = t.entries[0].key.clone();
        let text = t.to_ron_string();
        assert!(text.contains("pipeline: WarpRing"), "{text}");
        let back = Table::from_ron_str(&text, "mem").unwrap();
        let e = back.entries.iter().find(|e| e.key == key).unwrap();
        assert_eq!(e.config, streamed);
        // A table written before the field: the sample (cp.async only) without it.
        let old = sample().to_ron_string().replace(", pipeline: CpAsync", "");
        assert!(!old.contains("pipeline"), "{old}");
        let back = Table::from_ron_str(&old, "old").unwrap();
        assert!(back.entries.iter().all(|e| e.config.pipeline == Pipeline::CpAsync));
    }

    /// A shape file given where a table belongs is named as one, not as a missing field.
    #[test]
    fn a_shape_file_is_not_a_table() {
        let shapes = include_str!("../../../shapes/glm5.ron");
        let e = err(shapes);
        assert!(
            e.contains("results/h200.ron: this is a shape file") && e.contains("--shapes"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    /// The OS error of a failed read or write is printed once, also when the CLI
    /// prints the whole error chain (`{:#}`), and the message names the file.
    #[test]
    fn os_errors_are_printed_once() {
        let dir = tempfile::tempdir().unwrap();
        let read = Table::load(dir.path()).unwrap_err();
        let text = format!("{:#}", anyhow::Error::from(read));
        assert_eq!(text.matches("is a folder").count(), 1, "{text}");
        assert!(
            text.starts_with(&format!(
                "{}: cannot read the dispatch table: ",
                dir.path().display()
            )),
            "{text}"
        );
        let missing = Table::check_file(&dir.path().join("none.ron"), Default::default());
        let text = format!("{:#}", anyhow::Error::from(missing.unwrap_err()));
        assert_eq!(text.matches("os error").count(), 1, "{text}");
        // Writing under a regular file: the folder cannot be created.
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let out = file.join("t.ron");
        let text = format!("{:#}", anyhow::Error::from(sample().save(&out).unwrap_err()));
        let blocked = format!("{} exists and is not a folder", file.display());
        assert_eq!(text.matches(&blocked).count(), 1, "{text}");
        assert!(
            text.starts_with(&format!("{}: cannot write the dispatch table: ", out.display())),
            "{text}"
        );
    }

    /// A UTF-8 byte-order mark before the table is read as `Table::check_file` reads it.
    #[test]
    fn load_accepts_a_utf8_byte_order_mark() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bom.ron");
        let t = sample();
        std::fs::write(&p, format!("\u{feff}{}", t.to_ron_string())).unwrap();
        let plain = Table::from_ron_str(&t.to_ron_string(), "mem").unwrap();
        assert_eq!(Table::load(&p).unwrap(), plain);
        // Only a leading mark: one inside the text is still a syntax error naming the file.
        std::fs::write(&p, format!("\u{feff}\u{feff}{}", t.to_ron_string())).unwrap();
        let e = Table::load(&p).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:1:", p.display())), "{e}");
    }

    #[test]
    fn round_trip_is_stable_and_sorted() {
        let t = sample();
        let text = t.to_ron_string();
        let back = Table::from_ron_str(&text, "mem").unwrap();
        let mut sorted = t.clone();
        sorted.entries.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(back, sorted);
        assert_eq!(back.to_ron_string(), text, "writing is stable");
        assert!(!text.contains("experts"), "absent optional key fields are not written:\n{text}");
        // Through the file system, atomically, creating the folder.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results/h200.ron");
        t.save(&path).unwrap();
        assert_eq!(Table::load(&path).unwrap(), sorted);
    }

    #[test]
    fn grouped_entries_fit_the_same_format() {
        let mut t = sample();
        let mut e = t.entries[0].clone();
        e.key.op = OP_GROUPED_GEMM.into();
        e.key.experts = Some(256);
        t.entries.push(e);
        let back = Table::from_ron_str(&t.to_ron_string(), "mem").unwrap();
        assert!(back.entries.iter().any(|e| e.key.experts == Some(256)));
        // A grouped entry without its expert count is refused.
        let mut bad = t.clone();
        bad.entries.last_mut().unwrap().key.experts = None;
        let e = bad.validate("x").unwrap_err().to_string();
        assert!(e.contains("experts"), "{e}");
    }

    #[test]
    fn truncated_table_names_file_line_and_column() {
        let text = sample().to_ron_string();
        let cut = &text[..text.len() * 2 / 3];
        let e = err(cut);
        assert!(e.starts_with("results/h200.ron:"), "{e}");
        assert!(e.contains("malformed dispatch table"), "{e}");
        let line: usize = e.split(':').nth(1).unwrap().parse().unwrap();
        assert!(line > 5, "points into the file: {e}");
        assert!(err("")
            .contains("results/h200.ron:1:1: malformed dispatch table (RON): the file is empty"));
        assert!(err(" \n").contains("the file is empty"));
        // no internal names in the message of a file that is not a table at all
        assert!(!err("[1, 2]").contains("VersionProbe"), "{}", err("[1, 2]"));
    }

    /// A misspelled field is an error naming it, not a field silently dropped (a renamed `moe`
    /// section would drop every grouped entry, a renamed `method` turn an entry into a fused one).
    #[test]
    fn misspelled_fields_are_refused_not_dropped() {
        let text = with_moe().to_ron_string();
        assert!(Table::from_ron_str(&text, "t.ron").is_ok());
        for (from, to) in [
            ("moe: [", "mo: ["),
            ("runners_up: [", "runners_upx: ["),
            ("stages: ", "stagesx: "),
            ("top_k: ", "topk: "),
            ("sm_count: ", "sms: "),
        ] {
            assert!(text.contains(from), "{from}");
            let e = err(&text.replacen(from, to, 1));
            let field = to.split(':').next().unwrap();
            assert!(e.contains(&format!("Unexpected field named `{field}`")), "{from}: {e}");
        }
    }

    #[test]
    fn unknown_schema_version_is_refused_clearly() {
        let text = sample().to_ron_string().replace("schema_version: 5,", "schema_version: 7,");
        let e = err(&text);
        assert!(e.contains("unsupported dispatch-table schema_version 7"), "{e}");
        assert!(e.contains("reads schema_version 1 and 2"), "{e}");
        // A newer schema with fields we do not know still gets the version error, not a field error.
        let text = text.replace("entries: [", "new_field: 3, entries: [");
        assert!(err(&text).contains("schema_version 7"));
    }

    /// Version 1 tables (no `method`) read as all-fused; a composite entry round-trips and is
    /// written only where it is not `Fused`.
    #[test]
    fn version_1_reads_as_fused_and_methods_round_trip() {
        let v1 = sample().to_ron_string().replace("schema_version: 5,", "schema_version: 1,");
        let t = Table::from_ron_str(&v1, "old.ron").unwrap();
        assert_eq!(t.schema_version, TABLE_SCHEMA_VERSION);
        assert!(t.entries.iter().all(|e| e.method == Method::Fused));
        let mut t = sample();
        t.entries[2].method = Method::DequantCublasBf16;
        let text = t.to_ron_string();
        assert_eq!(text.matches("method: DequantCublasBf16").count(), 1, "{text}");
        assert!(!text.contains("method: Fused"), "{text}");
        let back = Table::from_ron_str(&text, "t.ron").unwrap();
        let m256 = back.entries.iter().find(|e| e.key.m == 256).unwrap();
        assert_eq!(m256.method, Method::DequantCublasBf16);
        // An unknown method is a syntax error naming the file; a method in a version 1 file is
        // refused.
        let e = err(&text.replace("DequantCublasBf16", "Magic"));
        assert!(e.contains("results/h200.ron"), "{e}");
        let e = err(&text.replace("schema_version: 5,", "schema_version: 1,"));
        assert!(e.contains("needs schema_version 2"), "{e}");
    }

    pub(crate) fn with_moe() -> Table {
        let mut t = sample();
        let shape = MoeShape::GLM5_TP8;
        let config = crate::moe::space::search_space(MoeOp::Down, &shape)[0];
        t.moe_template_hash = Some(crate::moe::templates::template_hash());
        t.moe.push(MoeEntry {
            key: MoeKey {
                op: MoeOp::Down,
                family: Family::Sm90,
                a_type: AType::Bf16,
                n: 6144,
                k: 256,
                experts: 256,
                top_k: 8,
                tokens: 64,
            },
            config,
            median_us: 80.0,
            interval_us: (79.0, 81.0),
            skewed_us: 70.0,
            routing_seed: 7,
            roofline_fraction: 0.58,
            experts_total: Some(256),
        });
        t
    }

    #[test]
    fn the_campaign_block_round_trips_and_needs_version_4() {
        let mut t = sample();
        t.campaign = Some(Campaign {
            wall_s: 181.5,
            gemm_wall_s: 120.25,
            moe_wall_s: Some(61.25),
            cache: Campaign::cache_label(0, 812).into(),
            kernels_cached: 0,
            kernels_compiled: 812,
            screened: 9000,
            timed: 700,
            strategy: "race".into(),
            budget: "pool 8%".into(),
            time_budget_s: Some(300.0),
            short_keys: vec![t.entries[0].key.clone()],
            gpus: vec![0, 1],
            shards: vec!["3/8".into()],
        });
        let text = t.to_ron_string();
        let back = Table::from_ron_str(&text, "t.ron").unwrap();
        assert_eq!(back.campaign, t.campaign);
        // A one-GPU campaign's block has neither field; older tables read without them.
        let mut c = t.campaign.clone().unwrap();
        (c.gpus, c.shards) = (Vec::new(), Vec::new());
        t.campaign = Some(c);
        let plain = t.to_ron_string();
        assert!(!plain.contains("gpus") && !plain.contains("shards"), "{plain}");
        assert_eq!(Table::from_ron_str(&plain, "t.ron").unwrap().campaign, t.campaign);
        assert_eq!(Campaign::cache_label(812, 0), "warm");
        assert_eq!(Campaign::cache_label(0, 40), "cold");
        assert_eq!(Campaign::cache_label(0, 0), "not counted");
        assert_eq!(Campaign::cache_label(3, 2), "partial");
        let old = text.replace("schema_version: 5", "schema_version: 3");
        let e = Table::from_ron_str(&old, "old.ron").unwrap_err().to_string();
        assert!(e.contains("old.ron") && e.contains("campaign"), "{e}");
    }
}
