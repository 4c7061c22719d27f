//! `fp4tune check`: the CI gate on kernel timings.
//!
//! A check re-verifies each GEMM entry of a dispatch table against the CPU reference and re-times
//! it, interleaved with the family default, on the current GPU under the benchmark's timing
//! policy (through the tuner's measuring worker, `tune::worker`: the same verification and
//! timing code as `fp4tune tune`, in a child process a crashing kernel cannot take down). Each
//! entry's new samples are compared with its baseline by a noise-aware rule ([`rule`]: a seeded
//! bootstrap interval on the ratio of medians new/old, a regression only when the whole
//! interval lies above `1 + threshold`). Baselines ([`baseline`]) come from the table itself
//! (median, interval and sample count), a saved check result or a measurement log.
//!
//! The pieces without a GPU are pure and tested on the CPU: [`preflight`] (why a check cannot
//! run at all), [`assess`] (one entry's outcome from its measurement), [`report::exit_status`]
//! (0 no regression, 1 regression or failed kernel, 2 cannot check) and the report's markdown
//! and JSON. [`run`] drives the worker on a GPU. Grouped MoE entries are listed as not checked
//! yet.
//!
//! Dependencies: `check` sits above `tune` (it uses the measuring worker and the log reader).

pub mod baseline;
pub mod report;
pub mod rule;
pub mod run;

#[cfg(test)]
mod evidence_tests;

pub use baseline::Baselines;
pub use report::{exit_status, Blocker, CheckReport, EntryCheck, EntryStatus, Exit};
pub use rule::{compare, Baseline, Comparison, RuleConfig, SummaryBaseline, Verdict};

use crate::bench::Summary;
use crate::gpu::DeviceInfo;
use crate::table::{Entry, Mismatch, Table};
use crate::template::{Arch, Family};
use crate::tune::log::Outcome;

/// What the GPU side measured for one entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// The entry's own time: its fused kernel, or the dequantize-then-cuBLAS path; or why there
    /// is none.
    pub outcome: Outcome,
    /// Dequantize-then-cuBLAS entries: the fused fallback kernel, verified and timed too.
    pub fallback: Option<Outcome>,
    /// The family default, timed interleaved with the entry's fused kernel.
    pub default: Option<Outcome>,
}

/// Why the check of `table` cannot run at all, in the order they are reported: no GPU (`device`
/// is the driver's reason), another GPU model than the table's or the baseline's, no kernel
/// family for the GPU, stale template hashes (this build's sources differ from the table's).
/// Template hashes are compared even without a GPU.
pub fn preflight(
    table: &Table,
    device: Result<&DeviceInfo, &str>,
    baseline_device: Option<&str>,
) -> Vec<Blocker> {
    let mut out = Vec::new();
    match device {
        Err(why) => out.push(Blocker::NoGpu(why.to_string())),
        Ok(d) => {
            let t = &table.device;
            if t.name != d.name
                || t.compute_capability != d.compute_capability
                || t.sm_count != d.sm_count
            {
                out.push(Blocker::OtherGpu(format!(
                    "the table was measured on {} (SM {}.{}, {} SMs), this GPU is {} (SM {}.{}, {} SMs)",
                    t.name,
                    t.compute_capability.0,
                    t.compute_capability.1,
                    t.sm_count,
                    d.name,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    d.sm_count
                )));
            }
            if let Some(b) = baseline_device.filter(|b| *b != d.name && *b != t.name) {
                out.push(Blocker::OtherGpu(format!(
                    "the baseline was measured on {b}, this GPU is {}",
                    d.name
                )));
            }
            let (ma, mi) = d.compute_capability;
            if Arch::for_compute_capability(ma, mi).is_none() {
                out.push(Blocker::NoFamily(format!(
                    "{} (SM {ma}.{mi}) has no fp4tune kernel family (supported: 9.0, 12.0)",
                    d.name
                )));
            }
        }
    }
    let stale: Vec<String> = table
        .template_mismatches()
        .iter()
        .map(|m| match m {
            Mismatch::TemplateHash { family, table, current } => format!(
                "{family} table {}, current {}",
                &table[..table.len().min(12)],
                &current[..current.len().min(12)]
            ),
            other => other.to_string(),
        })
        .collect();
    if !stale.is_empty() {
        out.push(Blocker::StaleTemplates(format!(
            "{} (the table's kernels are not this build's: re-tune, or check with the build the \
             table was made with)",
            stale.join("; ")
        )));
    }
    out
}

fn failure_of(outcome: &Outcome) -> Option<EntryStatus> {
    match outcome {
        Outcome::Timed { .. } | Outcome::Screened { .. } => None,
        Outcome::WrongAnswer { reason } => Some(EntryStatus::Failed(reason.clone())),
        Outcome::LaunchError { reason } => Some(EntryStatus::Failed(reason.clone())),
        Outcome::Timeout { seconds } => {
            Some(EntryStatus::Failed(format!("no answer within {seconds:.0} s (hang)")))
        }
        Outcome::Illegal { reason } => Some(EntryStatus::Missing(format!("illegal: {reason}"))),
        Outcome::CompileError { log } => {
            Some(EntryStatus::Missing(format!("compile error: {log}")))
        }
        Outcome::ResourceLimit { reason } => Some(EntryStatus::Missing(reason.clone())),
    }
}

fn timed(o: &Option<Outcome>) -> Option<Summary> {
    match o {
        Some(Outcome::Timed { time, .. }) => Some(*time),
        _ => None,
    }
}

/// One entry's check from its measurement and baseline (pure): a failed kernel (the entry's or
/// its fallback's) is [`EntryStatus::Failed`], one that could not be built or loaded or a key
/// without baseline is [`EntryStatus::Missing`], otherwise the rule's verdict.
pub fn assess(
    entry: &Entry,
    baseline: Option<&Baseline>,
    m: &Measurement,
    rule: &RuleConfig,
) -> EntryCheck {
    let old_median_us = baseline.and_then(|b| b.median().ok());
    let (new, samples) = match &m.outcome {
        Outcome::Timed { time, samples } => (Some(*time), samples.clone()),
        _ => (None, Vec::new()),
    };
    let mut check = EntryCheck {
        key: entry.key.clone(),
        method: entry.method,
        config: entry.config,
        old_median_us,
        new,
        samples,
        default: timed(&m.default),
        comparison: None,
        status: EntryStatus::Missing(String::new()),
    };
    let fallback_failure = m.fallback.as_ref().and_then(failure_of).map(|s| match s {
        EntryStatus::Failed(why) => EntryStatus::Failed(format!("fallback kernel: {why}")),
        EntryStatus::Missing(why) => EntryStatus::Missing(format!("fallback kernel: {why}")),
        other => other,
    });
    check.status = if let Some(s) = failure_of(&m.outcome) {
        s
    } else if let Some(s @ EntryStatus::Failed(_)) = fallback_failure {
        s
    } else {
        match baseline {
            None => EntryStatus::Missing("the baseline has no time for this key".into()),
            Some(b) => match compare(b, &check.samples, rule) {
                Ok(c) => {
                    check.comparison = Some(c);
                    match fallback_failure {
                        Some(s) => s,
                        None => EntryStatus::Compared(c.verdict),
                    }
                }
                Err(e) => EntryStatus::Missing(format!("cannot compare: {e}")),
            },
        }
    };
    check
}

/// The report's frame: everything but the entries and blockers.
#[derive(Debug, Clone)]
pub struct Setup<'a> {
    pub table: &'a Table,
    pub origin: &'a str,
    pub baselines: &'a Baselines,
    pub rule: RuleConfig,
    pub timing_policy: String,
}

/// Assemble the report (grouped MoE entries listed as not checked yet).
pub fn report(
    setup: &Setup<'_>,
    device: Option<DeviceInfo>,
    blockers: Vec<Blocker>,
    entries: Vec<EntryCheck>,
) -> CheckReport {
    let families = [Family::Sm90, Family::Sm120];
    CheckReport {
        schema_version: report::CHECK_SCHEMA_VERSION,
        table: setup.origin.to_string(),
        table_device: setup.table.device.clone(),
        device,
        template_hashes: families
            .iter()
            .filter(|f| setup.table.template_hashes.contains_key(f))
            .map(|f| (*f, crate::template::family_template_hash(*f)))
            .collect(),
        timing_policy: setup.timing_policy.clone(),
        baseline: setup.baselines.description.clone(),
        rule: setup.rule,
        blockers,
        entries,
        not_checked: setup.table.moe.iter().map(|e| e.key.to_string()).collect(),
        notes: setup.baselines.notes.clone(),
        date: crate::bench::report::utc_now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests_support::{device, sample};

    fn timed(us: &[f64]) -> Outcome {
        Outcome::Timed { time: Summary::of(us).unwrap(), samples: us.to_vec() }
    }

    #[test]
    fn preflight_without_a_gpu_names_the_driver_reason() {
        let t = sample();
        let b = preflight(&t, Err("no CUDA driver (libcuda.so) on this machine"), None);
        assert_eq!(b, vec![Blocker::NoGpu("no CUDA driver (libcuda.so) on this machine".into())]);
    }

    #[test]
    fn preflight_refuses_another_gpu_model_and_stale_templates() {
        let t = sample();
        assert!(preflight(&t, Ok(&device("NVIDIA H200", (9, 0), 132)), None).is_empty());
        let h100 = device("NVIDIA H100 80GB HBM3", (9, 0), 132);
        let b = preflight(&t, Ok(&h100), None);
        assert!(matches!(&b[..], [Blocker::OtherGpu(w)] if w.contains("H100")), "{b:?}");
        let b = preflight(&t, Ok(&device("NVIDIA H200", (9, 0), 132)), Some("NVIDIA B200"));
        assert!(matches!(&b[..], [Blocker::OtherGpu(w)] if w.contains("baseline")), "{b:?}");
        let b = preflight(&t, Ok(&device("NVIDIA A100", (8, 0), 108)), None);
        assert!(b.iter().any(|x| matches!(x, Blocker::NoFamily(_))), "{b:?}");
        let mut stale = sample();
        stale.template_hashes.insert(Family::Sm90, "0123456789abcdef".into());
        let b = preflight(&stale, Ok(&device("NVIDIA H200", (9, 0), 132)), None);
        assert!(
            matches!(&b[..], [Blocker::StaleTemplates(w)] if w.contains("sm90 table 0123456789ab")),
            "{b:?}"
        );
    }

    #[test]
    fn assess_maps_outcomes_to_statuses() {
        let t = sample();
        let e = &t.entries[1];
        let base = Baseline::Samples(vec![e.median_us; 11]);
        let rule = RuleConfig::default();
        let m =
            |o: Outcome| Measurement { outcome: o, fallback: None, default: Some(timed(&[9.0])) };
        let same = assess(e, Some(&base), &m(timed(&[e.median_us; 5])), &rule);
        assert_eq!(same.status, EntryStatus::Compared(Verdict::Within));
        assert_eq!(same.default.unwrap().median, 9.0);
        let slow = assess(e, Some(&base), &m(timed(&[e.median_us * 1.2; 5])), &rule);
        assert_eq!(slow.status, EntryStatus::Compared(Verdict::Regression));
        let wrong =
            assess(e, Some(&base), &m(Outcome::WrongAnswer { reason: "bad".into() }), &rule);
        assert_eq!(wrong.status, EntryStatus::Failed("bad".into()));
        let hang = assess(e, Some(&base), &m(Outcome::Timeout { seconds: 300.0 }), &rule);
        assert!(matches!(hang.status, EntryStatus::Failed(ref w) if w.contains("hang")));
        let missing =
            assess(e, Some(&base), &m(Outcome::CompileError { log: "ptxas".into() }), &rule);
        assert!(matches!(missing.status, EntryStatus::Missing(ref w) if w.contains("compile")));
        let no_base = assess(e, None, &m(timed(&[1.0])), &rule);
        assert!(matches!(no_base.status, EntryStatus::Missing(ref w) if w.contains("baseline")));
        // A composite entry whose fallback kernel is wrong fails even when the composite is fast.
        let composite = Measurement {
            outcome: timed(&[e.median_us; 5]),
            fallback: Some(Outcome::WrongAnswer { reason: "bad".into() }),
            default: None,
        };
        let c = assess(e, Some(&base), &composite, &rule);
        assert_eq!(c.status, EntryStatus::Failed("fallback kernel: bad".into()));
    }

    #[test]
    fn report_lists_grouped_entries_as_not_checked() {
        let t = sample();
        let b = baseline::from_table(&t, "t.ron");
        let setup = Setup {
            table: &t,
            origin: "t.ron",
            baselines: &b,
            rule: RuleConfig::default(),
            timing_policy: "p".into(),
        };
        let r = report(&setup, None, vec![Blocker::NoGpu("none".into())], vec![]);
        assert_eq!(exit_status(&r).code, 2);
        assert!(r.not_checked.is_empty());
        assert_eq!(r.template_hashes.len(), 1);
        assert_eq!(r.notes.len(), 1);
    }
}
