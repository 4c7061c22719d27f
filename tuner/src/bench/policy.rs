//! The timing policy: how candidates are timed, recorded with every number it produced.

use serde::{Deserialize, Serialize};

/// How a measurement was taken; `describe()` is the line every report carries.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimingPolicy {
    /// Operand copies are rotated so their total exceeds this multiple of the L2 size.
    pub l2_multiple: f64,
    /// Launches captured in one CUDA graph; a sample is one replay divided by this count
    /// (chosen per candidate to reach `min_sample_us`, at most `max_launches`, and at least the
    /// operand copies of the rotation: `timer::launches_per_graph`).
    pub min_sample_us: f64,
    pub max_launches: usize,
    /// Samples kept per candidate (all of them are reported).
    pub samples: usize,
    /// Graph replays before sampling starts.
    pub warmup_replays: usize,
    /// Candidates are sampled round-robin (interleaved), not one after the other.
    pub interleaved: bool,
}

impl Default for TimingPolicy {
    fn default() -> Self {
        Self {
            l2_multiple: 4.0,
            min_sample_us: 200.0,
            max_launches: 200,
            samples: 25,
            warmup_replays: 3,
            interleaved: true,
        }
    }
}

impl TimingPolicy {
    /// A faster policy for tuning sweeps (fewer samples).
    pub fn quick() -> Self {
        Self { samples: 11, min_sample_us: 100.0, warmup_replays: 2, ..Self::default() }
    }

    /// The screening policy of a benchmark's first phase (`BenchSpec::screen_policy`): few,
    /// short samples, enough to rank candidates before the fastest are timed under `default()`.
    pub fn screen() -> Self {
        Self { samples: 5, min_sample_us: 50.0, warmup_replays: 1, ..Self::default() }
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        format!(
            "cold L2 (operands rotated over > {}x L2, every graph replay walks all copies), \
             CUDA-graph replay of back-to-back launches (>= {} us per sample, <= {} launches \
             unless the rotation needs more), {} warm-up replays, {} samples per candidate, {}, \
             median with 95% order-statistic interval",
            self.l2_multiple,
            self.min_sample_us,
            self.max_launches,
            self.warmup_replays,
            self.samples,
            if self.interleaved { "candidates interleaved" } else { "candidates in sequence" }
        )
    }
}

/// How many operand copies to rotate through so that `copies * bytes_per_copy` exceeds
/// `l2_multiple * l2_bytes` (at least 2).
pub fn rotation_copies(bytes_per_copy: u64, l2_bytes: u64, l2_multiple: f64) -> usize {
    let need = (l2_multiple * l2_bytes as f64) / bytes_per_copy.max(1) as f64;
    (need.floor() as usize + 1).max(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_exceeds_the_l2_multiple() {
        let l2 = 60 << 20;
        for bytes in [1u64 << 10, 900_000, 1_800_000, 14_200_000, 500_000_000] {
            let c = rotation_copies(bytes, l2, 4.0) as u64;
            assert!(c * bytes > 4 * l2 || c == 2, "{bytes}: {c}");
            assert!(c >= 2);
        }
        assert_eq!(rotation_copies(1 << 30, l2, 4.0), 2);
    }
}
