//! The planner of one key of a non-racing campaign: a fixed list of configurations every key
//! measures, then its search strategy's proposals in batches, each result told back to it.

use super::log;
use crate::gpu::DeviceInfo;
use crate::search::{Budget, Exhaustive, Strategy};
use crate::table::TableKey;
use crate::template::GemmConfig;
use std::collections::HashSet;

/// Drives one key's search strategy (`search::Strategy`) in batches, after a fixed list of
/// configurations every key measures (so the geomean default is chosen among configurations
/// timed on all keys). The exhaustive campaign is `Planner::exhaustive`.
pub struct Planner {
    first: std::collections::VecDeque<GemmConfig>,
    strategy: Box<dyn Strategy>,
    /// At most this many strategy proposals per batch (adaptive strategies want small batches).
    step: usize,
    proposed: HashSet<GemmConfig>,
    from_strategy: HashSet<GemmConfig>,
    known: std::collections::HashMap<GemmConfig, Option<f64>>,
}

impl std::fmt::Debug for Planner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planner").field("strategy", &self.strategy.name()).finish()
    }
}

impl Planner {
    pub fn new(first: Vec<GemmConfig>, strategy: Box<dyn Strategy>, step: usize) -> Self {
        Self {
            first: first.into(),
            strategy,
            step: step.max(1),
            proposed: HashSet::new(),
            from_strategy: HashSet::new(),
            known: std::collections::HashMap::new(),
        }
    }

    /// Every legal configuration, in space order, as many per batch as asked for.
    pub fn exhaustive(legal: Vec<GemmConfig>) -> Self {
        Self::new(Vec::new(), Box::new(Exhaustive::new(legal, Budget::unlimited())), usize::MAX)
    }

    /// Up to `max` configurations not proposed before; empty when done.
    pub fn next_batch(&mut self, max: usize) -> Vec<GemmConfig> {
        let mut out = Vec::new();
        while out.len() < max {
            match self.first.pop_front() {
                Some(c) => {
                    if self.proposed.insert(c) {
                        out.push(c);
                    }
                }
                None => break,
            }
        }
        let mut from_strategy = 0;
        while out.len() < max && from_strategy < self.step {
            match self.strategy.next() {
                Some(c) => {
                    from_strategy += 1;
                    if self.proposed.insert(c) {
                        self.from_strategy.insert(c);
                        out.push(c);
                    } else if let Some(t) = self.known.get(&c) {
                        // Already measured as a common configuration: answer from that.
                        self.strategy.observe(c, *t);
                    } else {
                        // Common configuration still in flight: its result is forwarded later.
                        self.from_strategy.insert(c);
                    }
                }
                None => break,
            }
        }
        out
    }

    /// The outcome of a proposed configuration (median microseconds, or None if it failed).
    pub fn observe(&mut self, config: &GemmConfig, median_us: Option<f64>) {
        self.known.insert(*config, median_us);
        if self.from_strategy.remove(config) {
            self.strategy.observe(*config, median_us);
        }
    }
}

/// Builds the planner of one key from its legal configurations, the device and what was measured
/// on it at the start of the campaign.
pub type PlannerFactory =
    Box<dyn Fn(&TableKey, Vec<GemmConfig>, &DeviceInfo, &log::Context) -> Planner + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::AType;
    use crate::template::{self, Family};

    #[test]
    fn exhaustive_proposes_everything_once() {
        let space = template::search_space(Family::Sm90, AType::Bf16);
        let mut p = Planner::exhaustive(space.clone());
        let mut seen = Vec::new();
        loop {
            let b = p.next_batch(100);
            if b.is_empty() {
                break;
            }
            seen.extend(b);
        }
        assert_eq!(seen, space);
    }
}
