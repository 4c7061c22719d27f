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
//! Grouped MoE entries ([`grouped`]) are verified and timed alone on the routed step each entry
//! records, in the checking process (the grouped benchmark has no worker protocol), after the
//! GEMM entries, and compared with their baselines by the same rule.
//!
//! The pieces without a GPU are pure and tested on the CPU: [`preflight`] (why a check cannot
//! run at all), [`assess`] and [`assess_grouped`] (one entry's outcome from its measurement),
//! [`report::exit_status`] (0 no regression, 1 regression or failed kernel, 2 cannot check) and
//! the report's markdown and JSON. [`run`] drives the worker on a GPU; [`delay`] builds the
//! deliberately slowed kernel of `--inject-delay` and measures it.
//!
//! Dependencies: `check` sits above `tune` (it uses the measuring worker and the log reader).

pub mod baseline;
pub mod delay;
pub mod grouped;
pub mod report;
pub mod rule;
pub mod run;

#[cfg(test)]
mod evidence_tests;

pub use baseline::Baselines;
pub use report::{exit_status, Blocker, CheckReport, EntryCheck, EntryStatus, Exit, GroupedCheck};
pub use rule::{compare, Baseline, Comparison, RuleConfig, SummaryBaseline, Verdict};

use crate::bench::Summary;
use crate::gpu::DeviceInfo;
use crate::table::{Entry, Mismatch, MoeEntry, Table};
use crate::template::Family;
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
/// family for the GPU, stale template hashes of a kernel family (this build's sources differ
/// from the table's). Template hashes are compared even without a GPU. A stale grouped MoE hash
/// is not a blocker: it makes only the grouped entries not checked ([`grouped_split`]).
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
            if let Err(e) = crate::runtime::family_for(d) {
                out.push(Blocker::NoFamily(e.to_string()));
            }
        }
    }
    let stale: Vec<String> = table
        .template_mismatches()
        .iter()
        .filter(|m| !matches!(m, Mismatch::MoeTemplateHash { .. }))
        .map(|m| match m {
            Mismatch::TemplateHash { family, table, current } => format!(
                "{family} table {}, current {}",
                crate::template::short_hash(table, 12),
                crate::template::short_hash(current, 12)
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

/// What the rule and the outcomes make of one entry's measurement.
struct Judged {
    old_median_us: Option<f64>,
    new: Option<Summary>,
    samples: Vec<f64>,
    comparison: Option<Comparison>,
    status: EntryStatus,
}

/// A failed kernel (the entry's or its fallback's) is [`EntryStatus::Failed`], one that could not
/// be built or loaded or a key without baseline is [`EntryStatus::Missing`], otherwise the rule's
/// verdict.
fn judge(
    outcome: &Outcome,
    fallback: Option<&Outcome>,
    baseline: Option<&Baseline>,
    rule: &RuleConfig,
) -> Judged {
    let old_median_us = baseline.and_then(|b| b.median().ok());
    let (new, samples) = match outcome {
        Outcome::Timed { time, samples } => (Some(*time), samples.clone()),
        _ => (None, Vec::new()),
    };
    let mut comparison = None;
    let fallback_failure = fallback.and_then(failure_of).map(|s| match s {
        EntryStatus::Failed(why) => EntryStatus::Failed(format!("fallback kernel: {why}")),
        EntryStatus::Missing(why) => EntryStatus::Missing(format!("fallback kernel: {why}")),
        other => other,
    });
    let status = if let Some(s) = failure_of(outcome) {
        s
    } else if let Some(s @ EntryStatus::Failed(_)) = fallback_failure {
        s
    } else {
        match baseline {
            None => EntryStatus::Missing("the baseline has no time for this key".into()),
            Some(b) => match compare(b, &samples, rule) {
                Ok(c) => {
                    comparison = Some(c);
                    match fallback_failure {
                        Some(s) => s,
                        None => EntryStatus::Compared(c.verdict),
                    }
                }
                Err(e) => EntryStatus::Missing(format!("cannot compare: {e}")),
            },
        }
    };
    Judged { old_median_us, new, samples, comparison, status }
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
    let j = judge(&m.outcome, m.fallback.as_ref(), baseline, rule);
    EntryCheck {
        key: entry.key.clone(),
        method: entry.method,
        config: entry.config,
        old_median_us: j.old_median_us,
        new: j.new,
        samples: j.samples,
        default: timed(&m.default),
        comparison: j.comparison,
        status: j.status,
    }
}

/// One grouped entry's check from its outcome (`grouped::measure`) and baseline, as [`assess`].
pub fn assess_grouped(
    entry: &MoeEntry,
    baseline: Option<&Baseline>,
    outcome: &Outcome,
    rule: &RuleConfig,
) -> GroupedCheck {
    let j = judge(outcome, None, baseline, rule);
    GroupedCheck {
        key: entry.key,
        config: entry.config,
        routing_seed: entry.routing_seed,
        old_median_us: j.old_median_us,
        new: j.new,
        samples: j.samples,
        comparison: j.comparison,
        status: j.status,
    }
}

/// The grouped entries of `table` this version measures, and the rest with why not (the
/// report's `not_checked`): none when the grouped kernels' template hash differs from the
/// table's (the runtime does not use those entries; they are re-tuned, not checked).
pub fn grouped_split(table: &Table) -> (Vec<MoeEntry>, Vec<String>) {
    let mut measured = Vec::new();
    let mut not = Vec::new();
    let stale = table.template_mismatches().into_iter().find_map(|m| match m {
        Mismatch::MoeTemplateHash { table, current } => Some(format!(
            "the grouped kernels' templates differ from the table's (moe_template_hash {}, \
             current {}): re-tune the grouped entries",
            table.as_deref().map_or("none", |t| crate::template::short_hash(t, 12)),
            crate::template::short_hash(&current, 12)
        )),
        _ => None,
    });
    for e in &table.moe {
        if let Some(why) = &stale {
            not.push(format!("{}: {why}", e.key));
            continue;
        }
        match grouped::measurable(&e.key) {
            Ok(()) => measured.push(e.clone()),
            Err(why) => not.push(format!("{}: {why}", e.key)),
        }
    }
    (measured, not)
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

/// Assemble the report; grouped entries this version cannot measure are listed as not checked.
pub fn report(
    setup: &Setup<'_>,
    device: Option<DeviceInfo>,
    blockers: Vec<Blocker>,
    entries: Vec<EntryCheck>,
    grouped: Vec<GroupedCheck>,
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
        grouped,
        not_checked: grouped_split(setup.table).1,
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
    fn report_frames_the_check() {
        let t = sample();
        let b = baseline::from_table(&t, "t.ron");
        let setup = Setup {
            table: &t,
            origin: "t.ron",
            baselines: &b,
            rule: RuleConfig::default(),
            timing_policy: "p".into(),
        };
        let r = report(&setup, None, vec![Blocker::NoGpu("none".into())], vec![], vec![]);
        assert_eq!(exit_status(&r).code, 2);
        assert!(r.not_checked.is_empty());
        assert_eq!(r.template_hashes.len(), 1);
        assert_eq!(r.notes.len(), 1);
    }

    /// The committed table's grouped entries are all measured (none listed as not checked); one
    /// of a family the grouped measurement does not run is listed with why. A grouped entry is
    /// judged like a GEMM entry: slower beyond the threshold is a regression, a wrong result a
    /// failure, a kernel that does not build here missing.
    #[test]
    fn grouped_entries_are_measured_and_judged_by_the_rule() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
        let mut t = crate::table::Table::load(&root.join("nvidia-h200.ron")).unwrap();
        // The grouped templates as this build has them (whether the committed table is current
        // is the table tests' business).
        t.moe_template_hash = Some(crate::moe::templates::template_hash());
        let (measured, not) = grouped_split(&t);
        assert_eq!((measured.len(), not.len()), (t.moe.len(), 0));
        // Stale grouped templates: no grouped entry is measured, the GEMM entries still are.
        let mut stale = t.clone();
        stale.moe_template_hash = Some("0123456789abcdef".into());
        let (measured, not) = grouped_split(&stale);
        assert!(measured.is_empty() && not.len() == t.moe.len());
        assert!(not[0].contains("moe_template_hash 0123456789ab"), "{}", not[0]);
        let h200 = crate::table::tests_support::device("NVIDIA H200", (9, 0), 132);
        assert!(preflight(&stale, Ok(&h200), None).is_empty());
        let mut other = t.moe[0].clone();
        other.key.family = Family::Sm120;
        other.key.a_type = crate::problem::AType::Bf16;
        t.moe.push(other);
        let (measured, not) = grouped_split(&t);
        assert_eq!(measured.len(), t.moe.len() - 1);
        assert!(
            matches!(&not[..], [w] if w.contains("sm120") && w.contains("sm120 W4A4 kernels")),
            "{not:?}"
        );
        let b = baseline::from_table(&t, "t.ron");
        let rule = RuleConfig::default();
        let e = &t.moe[5];
        let same = |f: f64| timed(&[e.median_us * f; 11]);
        let ok = assess_grouped(e, b.get_moe(&e.key), &same(1.0), &rule);
        assert_eq!(ok.status, EntryStatus::Compared(Verdict::Within));
        assert_eq!((ok.key, ok.config, ok.routing_seed), (e.key, e.config, e.routing_seed));
        assert_eq!(ok.samples.len(), 11);
        let slow = assess_grouped(e, b.get_moe(&e.key), &same(1.2), &rule);
        assert_eq!(slow.status, EntryStatus::Compared(Verdict::Regression));
        let wrong = Outcome::WrongAnswer { reason: "wrong result: sorted row 3".into() };
        let w = assess_grouped(e, b.get_moe(&e.key), &wrong, &rule);
        assert!(matches!(w.status, EntryStatus::Failed(ref r) if r.contains("sorted row 3")));
        let missing = Outcome::CompileError { log: "ptxas".into() };
        let m = assess_grouped(e, b.get_moe(&e.key), &missing, &rule);
        assert!(matches!(m.status, EntryStatus::Missing(ref r) if r.contains("compile")));
        let none = assess_grouped(e, None, &same(1.0), &rule);
        assert!(matches!(none.status, EntryStatus::Missing(ref r) if r.contains("baseline")));
        let setup =
            Setup { table: &t, origin: "t.ron", baselines: &b, rule, timing_policy: "p".into() };
        let r = report(&setup, None, vec![], vec![], vec![ok, slow]);
        let exit = exit_status(&r);
        assert_eq!(exit.code, 1, "{exit:?}");
        assert!(exit.reason.starts_with("1 of 2 entries regressed"), "{exit:?}");
        assert_eq!(r.not_checked.len(), 1);
    }
}
