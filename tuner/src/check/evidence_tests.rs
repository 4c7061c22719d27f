//! Evidence that the check's rule works, on recorded sample sets: the committed H200 tune log
//! (`results/h200/nvidia-h200-w4a16.jsonl.gz`) keeps every candidate's 11 per-launch samples
//! (microseconds, cold L2, graph replay, interleaved). Two selections of sample sets:
//!
//! - `winners`: the samples of the kernel each entry of `results/nvidia-h200.ron` serves (22
//!   sets; what `fp4tune check` compares by default), and
//! - `broad`: every 10th timed record of the log (about 200 sets, noisy ones included: the
//!   spread max/min - 1 reaches 40% in a few of them).
//!
//! A trial draws two independent resamples (with replacement, 11 each) of one recorded set as
//! "old" and "new", optionally scales "new" by a factor, and asks the rule (default
//! configuration: 5% threshold, 95% confidence, 2,000 seeded bootstrap rounds) for a verdict.
//! The trials' own randomness is seeded too, so the rates below are exact and repeatable.

use super::rule::{compare, summary_baseline, Baseline, RuleConfig, Verdict};
use crate::bench::Summary;
use crate::table::Table;
use crate::tune::log::{self, Outcome};
use rand::{Rng, SeedableRng};
use std::path::Path;

fn results() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../results")
}

fn sample_sets() -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let table = Table::load(&results().join("nvidia-h200.ron")).unwrap();
    let records = log::read(&results().join("h200/nvidia-h200-w4a16.jsonl.gz")).unwrap();
    let samples = |o: &Outcome| match o {
        Outcome::Timed { samples, .. } if samples.len() >= 5 => Some(samples.clone()),
        _ => None,
    };
    let winners: Vec<Vec<f64>> = table
        .entries
        .iter()
        .filter_map(|e| {
            records
                .iter()
                .filter(|r| r.key == e.key && r.method == e.method && r.config == e.config)
                .filter_map(|r| samples(&r.outcome).map(|s| (r.at, s)))
                .max_by_key(|(at, _)| *at)
                .map(|(_, s)| s)
        })
        .collect();
    assert_eq!(winners.len(), table.entries.len(), "every committed entry has recorded samples");
    let broad: Vec<Vec<f64>> =
        records.iter().filter_map(|r| samples(&r.outcome)).step_by(10).collect();
    assert!(broad.len() >= 150, "{} sets", broad.len());
    (winners, broad)
}

fn resample(set: &[f64], rng: &mut rand::rngs::StdRng) -> Vec<f64> {
    (0..set.len()).map(|_| set[rng.random_range(0..set.len())]).collect()
}

/// How the old side is given to the rule in a trial.
#[derive(Clone, Copy, Debug)]
enum Old {
    Samples,
    /// As a dispatch table holds it: median, interval and n only.
    TableSummary,
}

/// The fraction of `trials_per_set` trials per set flagged as regressions when "new" is
/// `factor` times a resample of the same set "old" is a resample of.
fn flag_rate(
    sets: &[Vec<f64>],
    trials_per_set: usize,
    factor: f64,
    old: Old,
    cfg: &RuleConfig,
) -> f64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xE71D);
    let mut flagged = 0usize;
    let mut total = 0usize;
    for set in sets {
        for _ in 0..trials_per_set {
            let a = resample(set, &mut rng);
            let b: Vec<f64> = resample(set, &mut rng).iter().map(|x| x * factor).collect();
            let base = match old {
                Old::Samples => Baseline::Samples(a),
                Old::TableSummary => summary_baseline(&Summary::of(&a).unwrap()),
            };
            let c = compare(&base, &b, cfg).unwrap();
            flagged += (c.verdict == Verdict::Regression) as usize;
            total += 1;
        }
    }
    let rate = flagged as f64 / total as f64;
    eprintln!(
        "factor {factor}, {old:?}: {flagged} of {total} trials flagged ({:.1}%)",
        rate * 100.0
    );
    rate
}

/// A/A: two resamples of one recorded set are flagged no more often than the configured rate
/// (1 - confidence = 5%, plus 2% slack for the finite trial count), over 220 trials on the
/// served kernels and about 200 on the broad selection; with the samples or with the table's
/// summary as the baseline. With a threshold of 0 (any slowdown counts) the rule is a
/// one-sided 97.5% test on noise alone, so the same bound holds there too.
#[test]
fn aa_comparisons_flag_no_more_than_the_configured_rate() {
    let (winners, broad) = sample_sets();
    let cfg = RuleConfig::default();
    let allowed = (1.0 - cfg.confidence) + 0.02;
    for old in [Old::Samples, Old::TableSummary] {
        assert!(flag_rate(&winners, 10, 1.0, old, &cfg) <= allowed);
        assert!(flag_rate(&broad, 1, 1.0, old, &cfg) <= allowed);
    }
    let strict = RuleConfig { threshold: 0.0, ..cfg };
    assert!(flag_rate(&winners, 10, 1.0, Old::Samples, &strict) <= allowed);
    assert!(flag_rate(&broad, 1, 1.0, Old::Samples, &strict) <= allowed);
}

/// A 10% slowdown injected into the samples of the served kernels is flagged in >= 95% of
/// trials, with samples or with the table's summary as the baseline.
#[test]
fn ten_percent_slowdown_is_flagged_at_least_95_percent_of_the_time() {
    let (winners, broad) = sample_sets();
    let cfg = RuleConfig::default();
    for old in [Old::Samples, Old::TableSummary] {
        assert!(flag_rate(&winners, 10, 1.10, old, &cfg) >= 0.95);
    }
    // On the broad selection (noisier sets) too.
    assert!(flag_rate(&broad, 1, 1.10, Old::Samples, &cfg) >= 0.95);
}

/// A 2% slowdown under a 5% threshold passes (flagged in at most the configured rate of trials,
/// on the served kernels and on the broad, noisier selection).
#[test]
fn two_percent_change_passes_under_a_five_percent_threshold() {
    let (winners, broad) = sample_sets();
    let cfg = RuleConfig::default();
    assert!((cfg.threshold - 0.05).abs() < 1e-12);
    let allowed = 1.0 - cfg.confidence;
    for old in [Old::Samples, Old::TableSummary] {
        assert!(flag_rate(&winners, 10, 1.02, old, &cfg) <= allowed);
        assert!(flag_rate(&broad, 1, 1.02, old, &cfg) <= allowed);
    }
}
