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
#[path = "schema_tests.rs"]
pub(crate) mod tests;
