//! The noise-aware comparison rule of `fp4tune check`: is a kernel slower now than in its
//! baseline, beyond noise?
//!
//! Both sides are sets of per-launch times (microseconds) of one kernel. The statistic is the
//! ratio of medians new / old. Its uncertainty comes from a seeded percentile bootstrap: each of
//! `resamples` rounds draws both sample sets with replacement (each at its own size) and takes the
//! ratio of the two medians; the interval is the central `confidence` part of those ratios. The
//! verdict is
//!
//! - [`Verdict::Regression`] only when the **whole** interval lies above `1 + threshold`,
//! - [`Verdict::Faster`] when the whole interval lies below `1 - threshold` (informational),
//! - [`Verdict::Within`] otherwise: no change beyond the threshold can be told from noise.
//!
//! So a real slowdown of exactly the threshold is flagged about half of the time, a clear one
//! (twice the threshold at this noise level) nearly always, and noise almost never: see the
//! evidence tests on the committed H200 samples (`check::evidence_tests`).
//!
//! # A baseline given as (median, interval, n)
//!
//! Dispatch tables keep each entry's median and its 95% order-statistic interval
//! ([`crate::bench::Summary`]: ranks `n/2 -/+ 1.96 sqrt(n)/2`), not the samples, and `n` comes
//! from the table's timing policy. Such a baseline ([`Baseline::Summary`]) is expanded into `n`
//! pseudo-samples that reproduce it exactly: the sample at the median rank is the median, those
//! at the interval's two ranks are `lo` and `hi`, and the others lie on the straight lines
//! through these three points (ranks below the median on the lower line, above it on the upper
//! one, extrapolated to the ends and kept positive). That assumes a locally uniform density
//! around the median, which is what the order-statistic interval measures; the bootstrap then
//! runs on the pseudo-samples exactly as on recorded ones. [`Baseline::pseudo_samples`] gives
//! them; `Summary::of(pseudo_samples)` returns the same median, lo and hi (tested).

use crate::bench::Summary;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The rule's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RuleConfig {
    /// Relative slowdown tolerated, e.g. 0.05 for 5%.
    pub threshold: f64,
    /// Two-sided confidence of the interval on the ratio, e.g. 0.95.
    pub confidence: f64,
    /// Bootstrap rounds.
    pub resamples: usize,
    /// Seed of the bootstrap (the same inputs always give the same interval).
    pub seed: u64,
}

impl Default for RuleConfig {
    fn default() -> Self {
        Self { threshold: 0.05, confidence: 0.95, resamples: 2000, seed: 0xF4_C4EC }
    }
}

impl RuleConfig {
    /// The rule's parameters in words, for reports.
    pub fn describe(&self) -> String {
        format!(
            "ratio of medians new/old, {:.0}% seeded percentile bootstrap interval ({} resamples, \
             seed {:#x}); regression only when the whole interval lies above {:.3}",
            self.confidence * 100.0,
            self.resamples,
            self.seed,
            1.0 + self.threshold
        )
    }
}

/// A baseline's time as a table records it: median, its 95% order-statistic interval and the
/// number of samples behind them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SummaryBaseline {
    pub median: f64,
    pub lo: f64,
    pub hi: f64,
    pub n: usize,
}

/// The old side of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Baseline {
    /// Recorded per-launch samples (a measurement log or a saved check result).
    Samples(Vec<f64>),
    /// Median, interval and sample count only (a dispatch table); see the module docs.
    Summary(SummaryBaseline),
}

/// What the rule decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// The whole interval lies above `1 + threshold`.
    Regression,
    /// The whole interval lies below `1 - threshold`.
    Faster,
    /// Anything else.
    Within,
}

impl Verdict {
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Regression => "regression",
            Verdict::Faster => "faster",
            Verdict::Within => "within threshold",
        }
    }
}

/// One comparison: both medians, the ratio new/old, its interval and the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub old_median: f64,
    pub new_median: f64,
    pub ratio: f64,
    /// The `confidence` interval of the ratio.
    pub lo: f64,
    pub hi: f64,
    pub verdict: Verdict,
    pub old_n: usize,
    pub new_n: usize,
}

/// Inputs the rule refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuleError {
    #[error("no {0} samples")]
    Empty(&'static str),
    #[error("{side} sample {value} is not a positive finite time")]
    BadSample { side: &'static str, value: f64 },
    #[error(
        "baseline summary (median {median}, interval {lo}..{hi}, n {n}) is not a positive interval \
         around its median with n in 1..={max}",
        max = super::baseline::MAX_POLICY_SAMPLES
    )]
    BadSummary { median: f64, lo: f64, hi: f64, n: usize },
    #[error("{0}")]
    BadConfig(String),
}

impl Baseline {
    /// The baseline's samples: the recorded ones, or the pseudo-samples of a summary (module docs).
    pub fn pseudo_samples(&self) -> Result<Cow<'_, [f64]>, RuleError> {
        match self {
            Baseline::Samples(s) => {
                check_samples(s, "baseline")?;
                Ok(Cow::Borrowed(s))
            }
            Baseline::Summary(b) => expand_summary(b).map(Cow::Owned),
        }
    }

    /// The baseline's median.
    pub fn median(&self) -> Result<f64, RuleError> {
        Ok(median(&mut self.pseudo_samples()?.into_owned()))
    }
}

/// The ranks (0-based) of the 95% order-statistic interval of `n` samples, as
/// [`crate::bench::Summary::of`] picks them.
fn interval_ranks(n: usize) -> (usize, usize) {
    let half = 1.96 * (n as f64).sqrt() / 2.0;
    let j = ((n as f64 / 2.0 - half).floor().max(1.0) as usize).min(n) - 1;
    let k = ((n as f64 / 2.0 + half).ceil() as usize).clamp(1, n) - 1;
    (j, k)
}

fn expand_summary(b: &SummaryBaseline) -> Result<Vec<f64>, RuleError> {
    let ok = (1..=super::baseline::MAX_POLICY_SAMPLES).contains(&b.n)
        && [b.median, b.lo, b.hi].iter().all(|v| v.is_finite() && *v > 0.0)
        && b.lo <= b.median
        && b.median <= b.hi;
    if !ok {
        return Err(RuleError::BadSummary { median: b.median, lo: b.lo, hi: b.hi, n: b.n });
    }
    let (j, k) = interval_ranks(b.n);
    let mid = (b.n as f64 - 1.0) / 2.0;
    let below = if mid > j as f64 { (b.median - b.lo) / (mid - j as f64) } else { 0.0 };
    let above = if (k as f64) > mid { (b.hi - b.median) / (k as f64 - mid) } else { 0.0 };
    let floor = b.lo.min(b.median) * 1e-3;
    let mut s: Vec<f64> = (0..b.n)
        .map(|r| {
            let d = r as f64 - mid;
            let v = if d <= 0.0 { b.median + d * below } else { b.median + d * above };
            v.max(floor)
        })
        .collect();
    // Even n: the two middle samples average to the median whatever the two slopes (n = 2 has
    // them at the interval's ranks already).
    if b.n % 2 == 0 && b.n >= 4 {
        let h = 0.5 * below.min(above);
        s[b.n / 2 - 1] = (b.median - h).max(floor);
        s[b.n / 2] = b.median + h;
    }
    Ok(s)
}

fn check_samples(s: &[f64], side: &'static str) -> Result<(), RuleError> {
    if s.is_empty() {
        return Err(RuleError::Empty(side));
    }
    match s.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
        Some(&value) => Err(RuleError::BadSample { side, value }),
        None => Ok(()),
    }
}

/// Median of `v` (reordered in place); `v` is not empty.
fn median(v: &mut [f64]) -> f64 {
    let n = v.len();
    let (_, hi, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    let hi = *hi;
    if n % 2 == 1 {
        hi
    } else {
        let lo = v[..n / 2].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        0.5 * (lo + hi)
    }
}

/// Compare `new` samples with `baseline` under `cfg` (see the module docs).
pub fn compare(
    baseline: &Baseline,
    new: &[f64],
    cfg: &RuleConfig,
) -> Result<Comparison, RuleError> {
    if !(cfg.threshold >= 0.0 && cfg.threshold < 1.0) {
        return Err(RuleError::BadConfig(format!(
            "threshold {} is not in [0, 1) (0.05 is 5%)",
            cfg.threshold
        )));
    }
    if !(cfg.confidence > 0.0 && cfg.confidence < 1.0) {
        return Err(RuleError::BadConfig(format!(
            "confidence {} is not in (0, 1) (e.g. 0.95)",
            cfg.confidence
        )));
    }
    if cfg.resamples < 100 {
        return Err(RuleError::BadConfig(format!(
            "{} bootstrap resamples are too few for an interval (at least 100)",
            cfg.resamples
        )));
    }
    check_samples(new, "new")?;
    let old = baseline.pseudo_samples()?;
    let old_median = median(&mut old.to_vec());
    let new_median = median(&mut new.to_vec());
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let mut a = vec![0.0; old.len()];
    let mut b = vec![0.0; new.len()];
    let mut ratios: Vec<f64> = (0..cfg.resamples)
        .map(|_| {
            for x in a.iter_mut() {
                *x = old[rng.random_range(0..old.len())];
            }
            for x in b.iter_mut() {
                *x = new[rng.random_range(0..new.len())];
            }
            median(&mut b) / median(&mut a)
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let alpha = (1.0 - cfg.confidence) / 2.0;
    let at = |q: f64| {
        let i = (q * (ratios.len() - 1) as f64).round() as usize;
        ratios[i.min(ratios.len() - 1)]
    };
    let (lo, hi) = (at(alpha), at(1.0 - alpha));
    let verdict = if lo > 1.0 + cfg.threshold {
        Verdict::Regression
    } else if hi < 1.0 - cfg.threshold {
        Verdict::Faster
    } else {
        Verdict::Within
    };
    Ok(Comparison {
        old_median,
        new_median,
        ratio: new_median / old_median,
        lo,
        hi,
        verdict,
        old_n: old.len(),
        new_n: new.len(),
    })
}

/// A [`Summary`] as a table-style baseline of `n` samples.
pub fn summary_baseline(s: &Summary) -> Baseline {
    Baseline::Summary(SummaryBaseline { median: s.median, lo: s.lo, hi: s.hi, n: s.n })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noisy(center: f64, n: usize, seed: u64, spread: f64) -> Vec<f64> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| center * (1.0 + spread * (rng.random::<f64>() - 0.5))).collect()
    }

    #[test]
    fn pseudo_samples_reproduce_the_summary() {
        for n in [1usize, 2, 3, 5, 11, 24, 25, 100] {
            let s = Summary::of(&noisy(10.0, n, n as u64, 0.05)).unwrap();
            let b = summary_baseline(&s);
            let p = b.pseudo_samples().unwrap();
            assert_eq!(p.len(), n);
            let back = Summary::of(&p).unwrap();
            assert!((back.median - s.median).abs() < 1e-9, "n {n}: {back:?} vs {s:?}");
            assert!((back.lo - s.lo).abs() < 1e-9, "n {n}: {back:?} vs {s:?}");
            assert!((back.hi - s.hi).abs() < 1e-9, "n {n}: {back:?} vs {s:?}");
            assert!(p.iter().all(|v| *v > 0.0));
        }
    }

    #[test]
    fn verdicts_by_where_the_interval_lies() {
        let cfg = RuleConfig::default();
        let old = noisy(10.0, 25, 1, 0.01);
        let same =
            compare(&Baseline::Samples(old.clone()), &noisy(10.0, 25, 2, 0.01), &cfg).unwrap();
        assert_eq!(same.verdict, Verdict::Within, "{same:?}");
        assert!(same.lo <= 1.0 && 1.0 <= same.hi, "{same:?}");
        let slow =
            compare(&Baseline::Samples(old.clone()), &noisy(11.0, 25, 3, 0.01), &cfg).unwrap();
        assert_eq!(slow.verdict, Verdict::Regression, "{slow:?}");
        assert!((slow.ratio - 1.1).abs() < 0.01, "{slow:?}");
        assert!(slow.lo > 1.05 && slow.lo <= slow.ratio && slow.ratio <= slow.hi);
        let fast = compare(&Baseline::Samples(old), &noisy(9.0, 25, 4, 0.01), &cfg).unwrap();
        assert_eq!(fast.verdict, Verdict::Faster, "{fast:?}");
        // Deterministic: the same inputs give the same interval.
        let again =
            compare(&Baseline::Samples(noisy(10.0, 25, 1, 0.01)), &noisy(11.0, 25, 3, 0.01), &cfg)
                .unwrap();
        assert_eq!(again, slow);
    }

    #[test]
    fn wide_noise_is_not_a_regression() {
        // 10% slower but with +-30% noise on 5 samples: cannot be told from noise.
        let cfg = RuleConfig::default();
        let c = compare(&Baseline::Samples(noisy(10.0, 5, 5, 0.6)), &noisy(11.0, 5, 6, 0.6), &cfg)
            .unwrap();
        assert_eq!(c.verdict, Verdict::Within, "{c:?}");
    }

    #[test]
    fn summary_baselines_compare_like_samples() {
        let cfg = RuleConfig::default();
        let old = noisy(10.0, 11, 7, 0.01);
        let s = summary_baseline(&Summary::of(&old).unwrap());
        let slow = compare(&s, &noisy(11.0, 11, 8, 0.01), &cfg).unwrap();
        assert_eq!(slow.verdict, Verdict::Regression, "{slow:?}");
        let ok = compare(&s, &noisy(10.2, 11, 9, 0.01), &cfg).unwrap();
        assert_eq!(ok.verdict, Verdict::Within, "{ok:?}");
    }

    #[test]
    fn bad_inputs_are_errors() {
        let cfg = RuleConfig::default();
        let s = Baseline::Samples(vec![1.0, 2.0]);
        assert_eq!(compare(&s, &[], &cfg).unwrap_err(), RuleError::Empty("new"));
        assert!(matches!(
            compare(&s, &[1.0, f64::NAN], &cfg).unwrap_err(),
            RuleError::BadSample { side: "new", .. }
        ));
        assert!(matches!(
            compare(&Baseline::Samples(vec![0.0]), &[1.0], &cfg).unwrap_err(),
            RuleError::BadSample { side: "baseline", .. }
        ));
        let bad = Baseline::Summary(SummaryBaseline { median: 2.0, lo: 3.0, hi: 4.0, n: 11 });
        assert!(matches!(compare(&bad, &[1.0], &cfg).unwrap_err(), RuleError::BadSummary { .. }));
        for c in [
            RuleConfig { threshold: -0.1, ..cfg },
            RuleConfig { confidence: 1.0, ..cfg },
            RuleConfig { resamples: 10, ..cfg },
        ] {
            assert!(matches!(compare(&s, &[1.0], &c).unwrap_err(), RuleError::BadConfig(_)));
        }
    }
}
