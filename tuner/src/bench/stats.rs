//! Sample statistics: median and a distribution-free 95% confidence interval of the median.

use serde::{Deserialize, Serialize};

/// Summary of one candidate's samples (microseconds per launch).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    /// 95% confidence interval of the median from binomial order statistics.
    pub lo: f64,
    pub hi: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// `None` for no samples. NaNs are not allowed (they are a harness bug).
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.partial_cmp(b).expect("NaN sample"));
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { 0.5 * (s[n / 2 - 1] + s[n / 2]) };
        // Ranks j < k with P(X_(j) <= median <= X_(k)) >= 0.95 (normal approximation of the
        // binomial(n, 1/2)); for tiny n this widens to the full range.
        let half = 1.96 * (n as f64).sqrt() / 2.0;
        let j = ((n as f64 / 2.0 - half).floor().max(1.0) as usize).min(n) - 1;
        let k = ((n as f64 / 2.0 + half).ceil() as usize).clamp(1, n) - 1;
        Some(Summary { n, median, lo: s[j], hi: s[k], min: s[0], max: s[n - 1] })
    }

    /// Whether two candidates are indistinguishable: overlapping intervals or medians within
    /// `band` (relative, e.g. 0.02).
    pub fn ties_with(&self, other: &Summary, band: f64) -> bool {
        let overlap = self.lo <= other.hi && other.lo <= self.hi;
        let close = (self.median - other.median).abs() <= band * self.median.min(other.median);
        overlap || close
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_interval() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 5.0));
        assert!(s.lo <= s.median && s.median <= s.hi);
        let even = Summary::of(&[1.0, 2.0, 3.0, 10.0]).unwrap();
        assert_eq!(even.median, 2.5);
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn interval_narrows_with_more_samples_and_covers_the_median() {
        // 1..=100: the 95% interval of the median is about ranks 40..61.
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&v).unwrap();
        assert_eq!(s.median, 50.5);
        assert!((39.0..=42.0).contains(&s.lo), "{s:?}");
        assert!((59.0..=62.0).contains(&s.hi), "{s:?}");
        let few = Summary::of(&v[..10]).unwrap();
        assert!(few.hi - few.lo > 0.0);
        assert!(few.hi - few.lo > (s.hi - s.lo) / 10.0);
    }

    #[test]
    fn ties() {
        let a = Summary { n: 9, median: 10.0, lo: 9.8, hi: 10.2, min: 9.0, max: 11.0 };
        let b = Summary { n: 9, median: 10.5, lo: 10.3, hi: 10.7, min: 9.0, max: 11.0 };
        assert!(!a.ties_with(&b, 0.02));
        assert!(a.ties_with(&b, 0.06));
        let c = Summary { median: 10.1, lo: 10.0, hi: 10.3, ..b };
        assert!(a.ties_with(&c, 0.0));
    }
}
