//! The check's result: what was compared, each entry's outcome, why a check could not run, the
//! exit status (a pure function of the result, [`exit_status`]) and its markdown and JSON forms.
//!
//! The JSON ([`CheckReport`], schema [`CHECK_SCHEMA_VERSION`]) keeps every new sample, so a saved
//! result serves as the baseline of a later check (`fp4tune check --baseline check.json`).
//! Version 2 added the grouped MoE entries ([`CheckReport::grouped`]); version 1 results (GEMM
//! entries only) are still read.

use super::rule::{Baseline, Comparison, RuleConfig, Verdict};
use crate::bench::Summary;
use crate::gpu::DeviceInfo;
use crate::moe::GroupedConfig;
use crate::table::{DeviceIdentity, Method, MoeKey, TableKey};
use crate::template::{Family, GemmConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Version of the check result format this fp4tune writes.
pub const CHECK_SCHEMA_VERSION: u32 = 2;
/// Versions this fp4tune reads.
pub const CHECK_SCHEMA_VERSIONS_READ: &[u32] = &[1, 2];

/// Why a whole check cannot run (exit 2). The first one found is the one-line reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Blocker {
    /// No CUDA driver or device (the reason the driver gave).
    NoGpu(String),
    /// The GPU is not the one the table (or the baseline) was measured on.
    OtherGpu(String),
    /// The GPU has no fp4tune kernel family.
    NoFamily(String),
    /// The table's template hashes differ from this build's sources: its kernels are not the
    /// ones compiled here, so the runtime would not use its entries (re-tune).
    StaleTemplates(String),
    /// The baseline cannot be used (unreadable, another schema, another table).
    Baseline(String),
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocker::NoGpu(why) => write!(f, "no GPU: {why}"),
            Blocker::OtherGpu(why) => write!(f, "another GPU model: {why}"),
            Blocker::NoFamily(why) => write!(f, "no kernel family for this GPU: {why}"),
            Blocker::StaleTemplates(why) => write!(f, "stale template hashes: {why}"),
            Blocker::Baseline(why) => write!(f, "unusable baseline: {why}"),
        }
    }
}

/// How one entry's check ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EntryStatus {
    /// Verified and timed; the rule's verdict is in `EntryCheck::comparison`.
    Compared(Verdict),
    /// The kernel ran and failed: wrong answer, launch error, hang. A finding (exit 1).
    Failed(String),
    /// The kernel could not be built or loaded here (illegal, compile error, resource limit), or
    /// the baseline has no time for the entry: the entry could not be checked (exit 2).
    Missing(String),
}

/// One table entry's check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryCheck {
    pub key: TableKey,
    pub method: Method,
    /// The entry's kernel (for `DequantCublasBf16`, the fused fallback that was verified too).
    pub config: GemmConfig,
    /// The baseline's median (when there is a baseline for the entry).
    pub old_median_us: Option<f64>,
    /// The new time (summary of `samples`).
    pub new: Option<Summary>,
    /// Every new sample (microseconds per launch).
    #[serde(default)]
    pub samples: Vec<f64>,
    /// The family default, timed interleaved with the entry (context: the speed of this GPU now).
    pub default: Option<Summary>,
    pub comparison: Option<Comparison>,
    pub status: EntryStatus,
}

impl EntryCheck {
    /// "sm90_w4a16_..." or "dequant_cublas_bf16 (fallback sm90_...)".
    pub fn kernel(&self) -> String {
        match self.method {
            Method::Fused => self.config.name(),
            m => format!("{} (fallback {})", m.label(), self.config.name()),
        }
    }

    /// This entry's new samples as the baseline of a later check.
    pub fn as_baseline(&self) -> Option<Baseline> {
        (!self.samples.is_empty()).then(|| Baseline::Samples(self.samples.clone()))
    }
}

/// One grouped MoE entry's check: its kernel verified and timed on the routed step the entry
/// records (`check::grouped`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupedCheck {
    pub key: MoeKey,
    pub config: GroupedConfig,
    /// The seed of the entry's routing, which the new times were measured on.
    pub routing_seed: u64,
    /// The baseline's median (when there is a baseline for the entry).
    pub old_median_us: Option<f64>,
    /// The new time (summary of `samples`).
    pub new: Option<Summary>,
    /// Every new sample (microseconds per launch).
    #[serde(default)]
    pub samples: Vec<f64>,
    pub comparison: Option<Comparison>,
    pub status: EntryStatus,
}

impl GroupedCheck {
    /// This entry's new samples as the baseline of a later check.
    pub fn as_baseline(&self) -> Option<Baseline> {
        (!self.samples.is_empty()).then(|| Baseline::Samples(self.samples.clone()))
    }
}

/// The whole check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    pub schema_version: u32,
    /// The table checked (its path as given).
    pub table: String,
    /// The GPU the table was measured on.
    pub table_device: DeviceIdentity,
    /// The GPU of this check (none when there is no GPU).
    pub device: Option<DeviceInfo>,
    /// This build's template hashes.
    pub template_hashes: BTreeMap<Family, String>,
    /// The new times' timing policy, in words.
    pub timing_policy: String,
    /// What the new times were compared with, in words.
    pub baseline: String,
    pub rule: RuleConfig,
    /// Why the check could not run (empty when it ran).
    pub blockers: Vec<Blocker>,
    pub entries: Vec<EntryCheck>,
    /// The grouped MoE entries.
    #[serde(default)]
    pub grouped: Vec<GroupedCheck>,
    /// Table entries this version cannot measure, with why (grouped entries of a family or
    /// activation type the grouped measurement does not run).
    pub not_checked: Vec<String>,
    /// Anything else a reader should know (e.g. an assumed sample count).
    pub notes: Vec<String>,
    pub date: String,
}

/// What the process should exit with, and the one-line reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// 0 no regression, 1 regression or failed kernel, 2 cannot check.
    pub code: u8,
    pub reason: String,
}

/// The exit status of a check, by precedence:
/// 1. a [`Blocker`] (no GPU, another GPU model, no family, stale template hashes, unusable
///    baseline): 2, with the first blocker as the reason;
/// 2. any entry (GEMM or grouped) with [`Verdict::Regression`] or [`EntryStatus::Failed`]: 1,
///    naming them (a definite finding is reported even if other entries could not be checked);
/// 3. any entry [`EntryStatus::Missing`] (kernel not built or loaded here, no baseline time), or
///    no entry checked at all: 2;
/// 4. otherwise 0.
pub fn exit_status(report: &CheckReport) -> Exit {
    if let Some(b) = report.blockers.first() {
        let more = match report.blockers.len() {
            1 => String::new(),
            n => format!(" (and {} more reason{})", n - 1, if n > 2 { "s" } else { "" }),
        };
        return Exit { code: 2, reason: format!("cannot check: {b}{more}") };
    }
    let mut findings = Vec::new();
    let mut missing = Vec::new();
    let statuses = report
        .entries
        .iter()
        .map(|e| (e.key.to_string(), &e.status, &e.comparison))
        .chain(report.grouped.iter().map(|g| (g.key.to_string(), &g.status, &g.comparison)));
    let total = report.entries.len() + report.grouped.len();
    for (key, status, comparison) in statuses {
        match (status, comparison) {
            (EntryStatus::Compared(Verdict::Regression), Some(c)) => findings.push(format!(
                "{key} {:.2} -> {:.2} us (x{:.3} [{:.3}, {:.3}])",
                c.old_median, c.new_median, c.ratio, c.lo, c.hi
            )),
            (EntryStatus::Compared(Verdict::Regression), None) => {
                findings.push(format!("{key} regressed"))
            }
            (EntryStatus::Failed(why), _) => findings.push(format!("{key} failed: {why}")),
            (EntryStatus::Missing(why), _) => missing.push(format!("{key}: {why}")),
            _ => {}
        }
    }
    if !findings.is_empty() {
        return Exit {
            code: 1,
            reason: format!(
                "{} of {total} entries regressed or failed: {}",
                findings.len(),
                findings.join("; ")
            ),
        };
    }
    if !missing.is_empty() {
        return Exit {
            code: 2,
            reason: format!(
                "cannot check {} of {total} entries: {}",
                missing.len(),
                missing.join("; ")
            ),
        };
    }
    if total == 0 {
        return Exit { code: 2, reason: "cannot check: the table has no entry to check".into() };
    }
    Exit {
        code: 0,
        reason: format!(
            "no regression: {total} entries within {:.1}% at {:.0}% confidence",
            report.rule.threshold * 100.0,
            report.rule.confidence * 100.0
        ),
    }
}

fn short(h: &str) -> &str {
    crate::template::short_hash(h, 16)
}

impl CheckReport {
    /// Markdown for a CI job summary: the verdict first, then every entry.
    pub fn to_markdown(&self) -> String {
        let exit = exit_status(self);
        let mut md = String::new();
        let icon = match exit.code {
            0 => "PASS",
            1 => "FAIL",
            _ => "CANNOT CHECK",
        };
        let _ = writeln!(md, "# fp4tune check: {icon} (exit {})\n", exit.code);
        let _ = writeln!(md, "{}\n", exit.reason);
        let _ = writeln!(md, "- Table: `{}` (measured on {})", self.table, self.table_device.name);
        match &self.device {
            Some(d) => {
                let _ = writeln!(
                    md,
                    "- This GPU: {} (SM {}.{}, {} SMs, driver {}.{})",
                    d.name,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    d.sm_count,
                    d.driver_version.0,
                    d.driver_version.1
                );
            }
            None => md.push_str("- This GPU: none\n"),
        }
        let hashes: Vec<String> =
            self.template_hashes.iter().map(|(f, h)| format!("{f} `{}`", short(h))).collect();
        let _ = writeln!(md, "- Templates: {}", hashes.join(", "));
        let _ = writeln!(md, "- Baseline: {}", self.baseline);
        let _ = writeln!(md, "- Rule: {}", self.rule.describe());
        let _ = writeln!(md, "- Timing policy: {}", self.timing_policy);
        let _ = writeln!(md, "- Date: {}", self.date);
        for n in &self.notes {
            let _ = writeln!(md, "- Note: {n}");
        }
        if !self.blockers.is_empty() {
            let _ = writeln!(md, "\n## Why the check could not run\n");
            for b in &self.blockers {
                let _ = writeln!(md, "- {b}");
            }
        }
        if !self.entries.is_empty() {
            let _ = writeln!(
                md,
                "\n## Entries\n\n| key | kernel | old us | new us [95% CI] | ratio new/old [{:.0}% CI] | default us | result |\n|---|---|---|---|---|---|---|",
                self.rule.confidence * 100.0
            );
            for e in &self.entries {
                let (old, new, ratio, result) =
                    cells(e.old_median_us, e.new, e.comparison, &e.status);
                let default = e.default.map_or("-".into(), |s| format!("{:.3}", s.median));
                let _ = writeln!(
                    md,
                    "| {} | `{}` | {old} | {new} | {ratio} | {default} | {result} |",
                    e.key,
                    e.kernel()
                );
            }
        }
        if !self.grouped.is_empty() {
            let _ = writeln!(
                md,
                "\n## Grouped MoE entries\n\nEach kernel verified and timed alone on the routing its entry records.\n\n| key | kernel | routing seed | old us | new us [95% CI] | ratio new/old [{:.0}% CI] | result |\n|---|---|---|---|---|---|---|",
                self.rule.confidence * 100.0
            );
            for g in &self.grouped {
                let (old, new, ratio, result) =
                    cells(g.old_median_us, g.new, g.comparison, &g.status);
                let _ = writeln!(
                    md,
                    "| {} | `{}` | {} | {old} | {new} | {ratio} | {result} |",
                    g.key,
                    g.config.name(),
                    g.routing_seed
                );
            }
        }
        if !self.not_checked.is_empty() {
            let _ = writeln!(
                md,
                "\n## Not checked\n\nEntries this version cannot measure ({}):\n",
                self.not_checked.len()
            );
            for k in &self.not_checked {
                let _ = writeln!(md, "- {k}");
            }
        }
        md
    }

    /// Write the report as JSON, atomically.
    pub fn write_json(&self, path: &Path) -> Result<(), CheckFileError> {
        let text = self.to_json_string().map_err(|e| CheckFileError::Io {
            path: path.to_path_buf(),
            error: std::io::Error::other(e),
        })?;
        crate::fsio::write_atomic(path, text.as_bytes())
            .map_err(|error| CheckFileError::Io { path: path.to_path_buf(), error })
    }

    /// The saved form of the report (what [`CheckReport::read_json`] reads).
    pub fn to_json_string(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    /// Read a saved check result (for `--baseline`); refuses other schema versions.
    pub fn read_json(path: &Path) -> Result<CheckReport, CheckFileError> {
        let text = crate::fsio::read_input(path)
            .map_err(|error| CheckFileError::Io { path: path.to_path_buf(), error })?;
        #[derive(Deserialize)]
        struct Probe {
            schema_version: u32,
        }
        let bad = |message: String| CheckFileError::Parse { path: path.to_path_buf(), message };
        let probe: Probe = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if !CHECK_SCHEMA_VERSIONS_READ.contains(&probe.schema_version) {
            return Err(bad(format!(
                "check result schema version {}, this fp4tune reads {}",
                probe.schema_version,
                CHECK_SCHEMA_VERSIONS_READ
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(" and ")
            )));
        }
        serde_json::from_str(&text).map_err(|e| bad(e.to_string()))
    }
}

/// The old, new, ratio and result cells of an entry's row.
fn cells(
    old: Option<f64>,
    new: Option<Summary>,
    comparison: Option<Comparison>,
    status: &EntryStatus,
) -> (String, String, String, String) {
    let old = old.map_or("-".into(), |v| format!("{v:.3}"));
    let new = new.map_or("-".into(), |s| format!("{:.3} [{:.3}, {:.3}]", s.median, s.lo, s.hi));
    let ratio =
        comparison.map_or("-".into(), |c| format!("{:.3} [{:.3}, {:.3}]", c.ratio, c.lo, c.hi));
    let result = match status {
        EntryStatus::Compared(Verdict::Regression) => "**REGRESSION**".to_string(),
        EntryStatus::Compared(v) => v.label().to_string(),
        EntryStatus::Failed(why) => format!("**FAILED**: {}", one_line(why)),
        EntryStatus::Missing(why) => format!("not checked: {}", one_line(why)),
    };
    (old, new, ratio, result)
}

fn one_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("").replace('|', "/");
    if line.len() > 160 {
        format!("{}...", &line[..line.char_indices().nth(157).map_or(line.len(), |(i, _)| i)])
    } else {
        line
    }
}

/// Reading or writing a check result file.
#[derive(Debug, thiserror::Error)]
pub enum CheckFileError {
    /// The OS error is in the message and deliberately not a `source` (a report of the whole
    /// chain would print it twice).
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{}: not a check result: {message}", path.display())]
    Parse { path: PathBuf, message: String },
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::check::rule::{compare, SummaryBaseline};
    use crate::problem::AType;

    pub(crate) fn report(entries: Vec<EntryCheck>, blockers: Vec<Blocker>) -> CheckReport {
        CheckReport {
            schema_version: CHECK_SCHEMA_VERSION,
            table: "results/nvidia-h200.ron".into(),
            table_device: DeviceIdentity {
                name: "NVIDIA H200".into(),
                compute_capability: (9, 0),
                sm_count: 132,
            },
            device: None,
            template_hashes: BTreeMap::new(),
            timing_policy: "p".into(),
            baseline: "b".into(),
            rule: RuleConfig::default(),
            blockers,
            entries,
            grouped: vec![],
            not_checked: vec![],
            notes: vec![],
            date: "d".into(),
        }
    }

    pub(crate) fn entry(m: u32, old: f64, new: f64) -> EntryCheck {
        let samples: Vec<f64> =
            (0..25).map(|i| new * (1.0 + 0.002 * ((i % 5) as f64 - 2.0))).collect();
        let baseline = Baseline::Summary(SummaryBaseline {
            median: old,
            lo: old * 0.997,
            hi: old * 1.003,
            n: 11,
        });
        let c = compare(&baseline, &samples, &RuleConfig::default()).unwrap();
        EntryCheck {
            key: TableKey::gemm(Family::Sm90, AType::Bf16, 512, 6144, m),
            method: Method::Fused,
            config: crate::template::default_config(Family::Sm90, AType::Bf16),
            old_median_us: Some(old),
            new: Summary::of(&samples),
            samples,
            default: None,
            comparison: Some(c),
            status: EntryStatus::Compared(c.verdict),
        }
    }

    #[test]
    fn exit_0_when_every_entry_is_within_the_threshold() {
        let r = report(vec![entry(1, 3.5, 3.52), entry(2, 3.5, 3.4)], vec![]);
        let e = exit_status(&r);
        assert_eq!(e.code, 0, "{e:?}");
        assert!(e.reason.starts_with("no regression: 2 entries"), "{e:?}");
    }

    #[test]
    fn exit_1_names_each_regressed_entry_with_old_new_ratio_and_interval() {
        let r = report(vec![entry(1, 3.5, 3.52), entry(4, 3.5, 3.9)], vec![]);
        let e = exit_status(&r);
        assert_eq!(e.code, 1, "{e:?}");
        assert!(e.reason.contains("M=4 3.50 -> 3.90 us (x1.1"), "{e:?}");
        assert!(!e.reason.contains("M=1 "), "{e:?}");
        assert!(!e.reason.contains('\n'));
        // A kernel that fails verification is a finding too, even next to an unchecked entry.
        let mut failed = entry(8, 3.5, 3.5);
        failed.status = EntryStatus::Failed("wrong answer: 3 of 512 elements".into());
        let mut missing = entry(16, 3.5, 3.5);
        missing.status = EntryStatus::Missing("compile error".into());
        let e = exit_status(&report(vec![failed, missing], vec![]));
        assert_eq!(e.code, 1, "{e:?}");
        assert!(e.reason.contains("M=8 failed: wrong answer"), "{e:?}");
    }

    #[test]
    fn exit_2_without_a_gpu_with_its_reason() {
        let r = report(
            vec![],
            vec![Blocker::NoGpu(
                "no CUDA driver (libcuda.so) on this machine: GPU work needs an NVIDIA GPU and driver"
                    .into(),
            )],
        );
        let e = exit_status(&r);
        assert_eq!(e.code, 2);
        assert!(e.reason.starts_with("cannot check: no GPU: no CUDA driver"), "{e:?}");
        assert!(!e.reason.contains('\n'));
    }

    #[test]
    fn exit_2_on_another_gpu_model_or_stale_templates_even_with_results() {
        let other = report(
            vec![entry(1, 3.5, 5.0)],
            vec![Blocker::OtherGpu(
                "table was measured on \"NVIDIA H200\", this device is \"NVIDIA H100 80GB HBM3\""
                    .into(),
            )],
        );
        let e = exit_status(&other);
        assert_eq!(e.code, 2);
        assert!(e.reason.contains("another GPU model"), "{e:?}");
        let stale = report(
            vec![],
            vec![
                Blocker::StaleTemplates(
                    "Sm90 table d983d3582b30, current 0123456789ab: re-tune".into(),
                ),
                Blocker::NoGpu("x".into()),
            ],
        );
        let e = exit_status(&stale);
        assert_eq!(e.code, 2);
        assert!(e.reason.contains("stale template hashes") && e.reason.contains("1 more reason"));
    }

    #[test]
    fn exit_2_on_missing_kernels_or_nothing_to_check() {
        let mut missing = entry(1, 3.5, 3.5);
        missing.status = EntryStatus::Missing("compile error: ptxas".into());
        let e = exit_status(&report(vec![entry(2, 3.5, 3.5), missing], vec![]));
        assert_eq!(e.code, 2, "{e:?}");
        assert!(e.reason.contains("cannot check 1 of 2 entries"), "{e:?}");
        assert_eq!(exit_status(&report(vec![], vec![])).code, 2);
    }

    /// A grouped entry of the committed table's shape (gate_up, B = `tokens`) compared as
    /// `entry` compares a GEMM one.
    pub(crate) fn grouped(tokens: u32, old: f64, new: f64) -> GroupedCheck {
        let e = entry(tokens, old, new);
        let shape = crate::moe::MoeShape::GLM5_TP8;
        let op = crate::moe::MoeOp::GateUp;
        let (n, k) = shape.nk(op);
        GroupedCheck {
            key: MoeKey {
                op,
                family: Family::Sm90,
                a_type: AType::Bf16,
                n,
                k,
                experts: shape.experts,
                top_k: shape.top_k,
                tokens,
            },
            config: crate::moe::space::search_space(op, &shape)[0],
            routing_seed: 0x5EED_0000 + tokens as u64,
            old_median_us: e.old_median_us,
            new: e.new,
            samples: e.samples,
            comparison: e.comparison,
            status: e.status,
        }
    }

    #[test]
    fn grouped_entries_count_like_gemm_entries() {
        let mut r = report(vec![entry(1, 3.5, 3.52)], vec![]);
        r.grouped = vec![grouped(1, 9.0, 9.0), grouped(8, 39.0, 39.1)];
        let e = exit_status(&r);
        assert_eq!(e.code, 0, "{e:?}");
        assert!(e.reason.starts_with("no regression: 3 entries"), "{e:?}");
        r.grouped.push(grouped(64, 144.0, 170.0));
        let e = exit_status(&r);
        assert_eq!(e.code, 1, "{e:?}");
        assert!(e.reason.starts_with("1 of 4 entries regressed"), "{e:?}");
        assert!(
            e.reason
                .contains("gate_up sm90 w4a16 N=512 K=6144 E=256 top_k=8 B=64 144.00 -> 170.00 us"),
            "{e:?}"
        );
        let mut wrong = grouped(2, 13.0, 13.0);
        wrong.status = EntryStatus::Failed("wrong result: sorted row 3".into());
        r.grouped = vec![wrong];
        let e = exit_status(&r);
        assert!(e.code == 1 && e.reason.contains("B=2 failed: wrong result"), "{e:?}");
        let mut missing = grouped(2, 13.0, 13.0);
        missing.status = EntryStatus::Missing("compile error".into());
        r.grouped = vec![missing];
        let e = exit_status(&r);
        assert!(e.code == 2 && e.reason.contains("cannot check 1 of 2 entries"), "{e:?}");
        // Only grouped entries: checked all the same.
        let mut only = report(vec![], vec![]);
        only.grouped = vec![grouped(1, 9.0, 9.0)];
        assert_eq!(exit_status(&only).code, 0);
    }

    #[test]
    fn markdown_and_json_round_trip() {
        let mut r = report(vec![entry(1, 3.5, 3.52), entry(4, 3.5, 3.9)], vec![]);
        r.grouped = vec![grouped(1, 3.5, 3.52), grouped(16, 3.5, 3.9)];
        r.not_checked.push("gate_up sm120 w4a4 B=1: not measured".into());
        let md = r.to_markdown();
        assert!(md.starts_with("# fp4tune check: FAIL (exit 1)"), "{md}");
        assert!(md.contains("**REGRESSION**") && md.contains("within threshold"), "{md}");
        assert!(md.contains("## Grouped MoE entries"), "{md}");
        let row =
            md.lines().find(|l| l.starts_with("| moe_gate_up") && l.contains("B=16")).unwrap();
        assert!(
            row.contains("| 1592590352 | 3.500 |") && row.ends_with("| **REGRESSION** |"),
            "{row}"
        );
        assert!(md.contains("## Not checked") && md.contains("sm120 w4a4 B=1"), "{md}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("check.json");
        r.write_json(&p).unwrap();
        assert_eq!(CheckReport::read_json(&p).unwrap(), r);
        // A version 1 result (no grouped entries) is still read.
        let mut v1 = r.clone();
        v1.grouped.clear();
        v1.write_json(&p).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let text = text
            .replace("\"schema_version\": 2", "\"schema_version\": 1")
            .replace("\"grouped\": [],", "");
        assert!(!text.contains("grouped"), "{text}");
        std::fs::write(&p, &text).unwrap();
        assert_eq!(CheckReport::read_json(&p).unwrap(), CheckReport { schema_version: 1, ..v1 });
        let text = text.replace("\"schema_version\": 1", "\"schema_version\": 7");
        std::fs::write(&p, text).unwrap();
        let e = CheckReport::read_json(&p).unwrap_err().to_string();
        assert!(e.contains("schema version 7"), "{e}");
        // An OS error is printed once, also in a report of the whole chain (`{:#}`).
        let under_file = p.join("check.json");
        let e = anyhow::Error::from(CheckReport::read_json(&under_file).unwrap_err());
        let text = format!("{e:#}");
        assert_eq!(text.matches("os error").count(), 1, "{text}");
        assert!(text.starts_with(&under_file.display().to_string()), "{text}");
        let e = anyhow::Error::from(CheckReport::read_json(dir.path()).unwrap_err());
        let text = format!("{e:#}");
        assert_eq!(text.matches("is a folder").count(), 1, "{text}");
        assert!(text.starts_with(&dir.path().display().to_string()), "{text}");
    }
}
