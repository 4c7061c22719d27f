//! Search strategies behind one ask/tell interface: exhaustive, seeded random, and model-guided
//! (cost-model pre-ranking, then neighbourhoods of the best measured configuration), each under
//! a budget of evaluations and/or wall time.

use super::model::CostModel;
use super::space::Grid;
use super::SearchError;
use crate::problem::GemmProblem;
use crate::template::GemmConfig;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// How much a strategy may spend. Every limit given applies; none given means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Budget {
    /// At most this many evaluations.
    pub max_evals: Option<usize>,
    /// At most this fraction of the candidates (rounded up, at least one).
    pub max_fraction: Option<f64>,
    /// Stop proposing after this much wall time since the strategy was made.
    pub max_wall: Option<Duration>,
}

impl Budget {
    pub fn unlimited() -> Self {
        Self::default()
    }
    pub fn evals(n: usize) -> Self {
        Self { max_evals: Some(n), ..Self::default() }
    }
    pub fn fraction(f: f64) -> Self {
        Self { max_fraction: Some(f), ..Self::default() }
    }

    /// The evaluation limit for a space of `candidates` configurations.
    pub fn limit(&self, candidates: usize) -> usize {
        let mut n = candidates;
        if let Some(e) = self.max_evals {
            n = n.min(e);
        }
        if let Some(f) = self.max_fraction {
            n = n.min(((f.max(0.0) * candidates as f64).ceil() as usize).max(1));
        }
        n
    }
}

/// Ask/tell search: the driver (the tuner, or the simulator) asks for the next configuration,
/// evaluates it and tells the result (`None`: failed or not measured).
pub trait Strategy: Send {
    fn name(&self) -> &str;
    /// The next configuration to evaluate; `None` when the budget or the candidates are spent.
    /// Never returns the same configuration twice.
    fn next(&mut self) -> Option<GemmConfig>;
    /// The median time of a configuration returned by `next`, or `None` if it failed.
    fn observe(&mut self, config: GemmConfig, median_us: Option<f64>);
}

/// Which strategy to build.
#[derive(Debug, Clone, PartialEq)]
pub enum StrategyKind {
    Exhaustive,
    Random { seed: u64 },
    Model { model: CostModel, options: ModelGuidedOptions },
}

impl StrategyKind {
    /// "exhaustive", "random" (seed 0) or "model" (H200 model); the CLI may replace the seed or
    /// the device afterwards.
    pub fn parse(s: &str) -> Result<Self, SearchError> {
        match s {
            "exhaustive" => Ok(StrategyKind::Exhaustive),
            "random" => Ok(StrategyKind::Random { seed: 0 }),
            "model" => Ok(StrategyKind::Model {
                model: CostModel::new(super::model::DeviceModel::h200()),
                options: ModelGuidedOptions::default(),
            }),
            other => Err(SearchError::UnknownStrategy(other.into())),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            StrategyKind::Exhaustive => "exhaustive",
            StrategyKind::Random { .. } => "random",
            StrategyKind::Model { .. } => "model",
        }
    }

    /// A strategy over `candidates` (the legal configurations of `problem`).
    pub fn build(
        &self,
        candidates: Vec<GemmConfig>,
        problem: &GemmProblem,
        budget: Budget,
    ) -> Box<dyn Strategy> {
        match self {
            StrategyKind::Exhaustive => Box::new(Exhaustive::new(candidates, budget)),
            StrategyKind::Random { seed } => Box::new(RandomSearch::new(candidates, budget, *seed)),
            StrategyKind::Model { model, options } => {
                Box::new(ModelGuided::new(candidates, problem, model, budget, *options))
            }
        }
    }
}

/// Shared bookkeeping: the evaluation limit and the wall clock.
#[derive(Debug, Clone)]
struct Spend {
    limit: usize,
    used: usize,
    deadline: Option<Instant>,
}

impl Spend {
    fn new(budget: &Budget, candidates: usize) -> Self {
        Self {
            limit: budget.limit(candidates),
            used: 0,
            deadline: budget.max_wall.map(|w| Instant::now() + w),
        }
    }
    fn exhausted(&self) -> bool {
        self.used >= self.limit || self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

fn dedup(mut candidates: Vec<GemmConfig>) -> Vec<GemmConfig> {
    let mut seen = std::collections::HashSet::new();
    candidates.retain(|c| seen.insert(*c));
    candidates
}

/// Every candidate in the given order.
#[derive(Debug, Clone)]
pub struct Exhaustive {
    order: Vec<GemmConfig>,
    pos: usize,
    spend: Spend,
}

impl Exhaustive {
    pub fn new(candidates: Vec<GemmConfig>, budget: Budget) -> Self {
        let order = dedup(candidates);
        let spend = Spend::new(&budget, order.len());
        Self { order, pos: 0, spend }
    }
}

impl Strategy for Exhaustive {
    fn name(&self) -> &str {
        "exhaustive"
    }
    fn next(&mut self) -> Option<GemmConfig> {
        if self.spend.exhausted() {
            return None;
        }
        let c = self.order.get(self.pos).copied()?;
        self.pos += 1;
        self.spend.used += 1;
        Some(c)
    }
    fn observe(&mut self, _config: GemmConfig, _median_us: Option<f64>) {}
}

/// Candidates in a seeded random order (reproducible for a seed).
#[derive(Debug, Clone)]
pub struct RandomSearch {
    inner: Exhaustive,
}

impl RandomSearch {
    pub fn new(candidates: Vec<GemmConfig>, budget: Budget, seed: u64) -> Self {
        let mut order = dedup(candidates);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        order.shuffle(&mut rng);
        Self { inner: Exhaustive::new(order, budget) }
    }
}

impl Strategy for RandomSearch {
    fn name(&self) -> &str {
        "random"
    }
    fn next(&mut self) -> Option<GemmConfig> {
        self.inner.next()
    }
    fn observe(&mut self, _config: GemmConfig, _median_us: Option<f64>) {}
}

/// Tuning knobs of [`ModelGuided`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ModelGuidedOptions {
    /// Top-ranked candidates measured before any neighbourhood search.
    pub initial: usize,
    /// Largest neighbourhood radius (index distance in the value lists) explored around the best.
    pub radius: u32,
    /// How many of the best measured configurations have their neighbourhoods explored.
    pub beam: usize,
}

impl Default for ModelGuidedOptions {
    fn default() -> Self {
        Self { initial: 8, radius: 2, beam: 3 }
    }
}

/// Model-guided search: measure `initial` top-ranked candidates (diversified: no two one step
/// apart), then repeatedly the best-ranked unmeasured neighbour (radius 1, then 2) of the `beam`
/// best measured configurations; when no neighbour is left, continue down the model ranking.
#[derive(Debug, Clone)]
pub struct ModelGuided {
    /// Candidates in model order (fastest predicted first).
    ranked: Vec<GemmConfig>,
    predicted: Vec<f64>,
    grid: Grid,
    index: std::collections::HashMap<GemmConfig, usize>,
    proposed: Vec<bool>,
    /// Measured (rank index, median) pairs.
    measured: Vec<(usize, f64)>,
    /// The initial picks (rank indices) and how many were proposed.
    initial: Vec<usize>,
    initial_pos: usize,
    cursor: usize,
    options: ModelGuidedOptions,
    spend: Spend,
}

impl ModelGuided {
    pub fn new(
        candidates: Vec<GemmConfig>,
        problem: &GemmProblem,
        model: &CostModel,
        budget: Budget,
        options: ModelGuidedOptions,
    ) -> Self {
        let ranked_pairs = model.rank(&dedup(candidates), problem);
        let ranked: Vec<GemmConfig> = ranked_pairs.iter().map(|r| r.0).collect();
        let predicted = ranked_pairs.iter().map(|r| r.1).collect();
        let grid = Grid::of(&ranked);
        let index = ranked.iter().enumerate().map(|(i, c)| (*c, i)).collect();
        let spend = Spend::new(&budget, ranked.len());
        let mut initial = Self::diverse_top(&grid, ranked.len(), options.initial);
        Self::cover_pipelines(&ranked_pairs, &mut initial);
        Self {
            proposed: vec![false; ranked.len()],
            initial,
            initial_pos: 0,
            ranked,
            predicted,
            grid,
            index,
            measured: Vec::new(),
            cursor: 0,
            options,
            spend,
        }
    }

    /// The `n` initial picks: walking down the ranking (within the top `max(4n, 64)`), skip a
    /// candidate one step from an earlier pick (the neighbourhood phase reaches those), so the
    /// picks cover several regions of near-tied predictions; fill up with the top ranks.
    fn diverse_top(grid: &Grid, len: usize, n: usize) -> Vec<usize> {
        let n = n.min(len);
        let window = (4 * n).max(64).min(len);
        let mut picks: Vec<usize> = Vec::with_capacity(n);
        for i in 0..window {
            if picks.len() == n {
                break;
            }
            let near = grid.neighbours(i, 1);
            if !picks.iter().any(|p| near.contains(p)) {
                picks.push(i);
            }
        }
        let mut i = 0;
        while picks.len() < n {
            if !picks.contains(&i) {
                picks.push(i);
            }
            i += 1;
        }
        picks
    }

    /// Make sure every weight pipeline the model cannot rule out (`competitive_pipelines`) has its
    /// 2 best-ranked configurations among the initial picks: the analytic model does not see the per-pipeline instruction and
    /// barrier costs (measured on the H200: the streamed pipelines win decode shapes the model
    /// ranks below the cp.async ones), so each pipeline gets measured before the neighbourhood
    /// phase chooses where to look.
    fn cover_pipelines(ranked: &[(GemmConfig, f64)], picks: &mut Vec<usize>) {
        let pipelines = super::model::competitive_pipelines(ranked);
        if pipelines.len() < 2 {
            return;
        }
        for pl in pipelines {
            let have = picks.iter().filter(|&&i| ranked[i].0.pipeline == pl).count();
            let missing = 2usize.saturating_sub(have);
            let extra: Vec<usize> = (0..ranked.len())
                .filter(|&i| ranked[i].0.pipeline == pl && !picks.contains(&i))
                .take(missing)
                .collect();
            picks.extend(extra);
        }
    }

    /// The model's predicted time of a candidate.
    pub fn predicted_us(&self, c: &GemmConfig) -> Option<f64> {
        self.index.get(c).map(|&i| self.predicted[i])
    }

    fn next_index(&mut self) -> Option<usize> {
        while self.initial_pos < self.initial.len() {
            let i = self.initial[self.initial_pos];
            self.initial_pos += 1;
            if !self.proposed[i] {
                return Some(i);
            }
        }
        if !self.measured.is_empty() {
            let mut best: Vec<(usize, f64)> = self.measured.clone();
            best.sort_by(|a, b| a.1.total_cmp(&b.1));
            for d in 1..=self.options.radius {
                for &(i, _) in best.iter().take(self.options.beam.max(1)) {
                    // Neighbours in rank order: the index is the model rank.
                    let pick =
                        self.grid.neighbours(i, d).into_iter().filter(|&j| !self.proposed[j]).min();
                    if pick.is_some() {
                        return pick;
                    }
                }
            }
        }
        while self.cursor < self.ranked.len() {
            let i = self.cursor;
            self.cursor += 1;
            if !self.proposed[i] {
                return Some(i);
            }
        }
        None
    }
}

impl Strategy for ModelGuided {
    fn name(&self) -> &str {
        "model"
    }
    fn next(&mut self) -> Option<GemmConfig> {
        if self.spend.exhausted() {
            return None;
        }
        let i = self.next_index()?;
        self.proposed[i] = true;
        self.spend.used += 1;
        Some(self.ranked[i])
    }
    fn observe(&mut self, config: GemmConfig, median_us: Option<f64>) {
        if let (Some(&i), Some(t)) = (self.index.get(&config), median_us) {
            if t.is_finite() {
                self.measured.push((i, t));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::AType;
    use crate::search::model::DeviceModel;
    use crate::search::space::tests::toy_space;
    use std::collections::HashSet;

    fn problem() -> GemmProblem {
        GemmProblem::new(4, 512, 6144, AType::Bf16)
    }

    fn kinds() -> Vec<StrategyKind> {
        vec![
            StrategyKind::Exhaustive,
            StrategyKind::Random { seed: 7 },
            StrategyKind::Model {
                model: CostModel::new(DeviceModel::h200()),
                options: ModelGuidedOptions::default(),
            },
        ]
    }

    /// Drive a strategy with a synthetic cost; returns the proposals.
    fn drive(s: &mut dyn Strategy, cost: impl Fn(&GemmConfig) -> Option<f64>) -> Vec<GemmConfig> {
        let mut out = Vec::new();
        while let Some(c) = s.next() {
            s.observe(c, cost(&c));
            out.push(c);
            assert!(out.len() < 1_000_000, "runaway strategy");
        }
        out
    }

    #[test]
    fn model_guided_measures_every_pipeline_early() {
        use crate::template::{self, Family, Pipeline};
        let p = GemmProblem::new(1, 512, 6144, AType::Bf16);
        let legal: Vec<GemmConfig> = template::search_space(Family::Sm90, AType::Bf16)
            .into_iter()
            .filter(|c| c.check_problem(&p).is_ok())
            .collect();
        let model = CostModel::new(DeviceModel::h200());
        let mut s =
            ModelGuided::new(legal, &p, &model, Budget::evals(14), ModelGuidedOptions::default());
        let first = drive(&mut s, |_| Some(1.0));
        // every pipeline that takes K = 6144 (the K-tail form takes only a K 64 does not divide)
        for pl in Pipeline::ALL.into_iter().filter(|p| *p != Pipeline::KTail) {
            let n = first.iter().filter(|c| c.pipeline == pl).count();
            assert!(n >= 2, "{pl:?}: {n} of {first:?}");
        }
        // At M = 1024 the model predicts the streamed kernels 2x slower: no forced picks.
        let p = GemmProblem::new(1024, 4096, 6144, AType::Bf16);
        let legal: Vec<GemmConfig> = template::search_space(Family::Sm90, AType::Bf16)
            .into_iter()
            .filter(|c| c.check_problem(&p).is_ok())
            .collect();
        let mut s =
            ModelGuided::new(legal, &p, &model, Budget::evals(8), ModelGuidedOptions::default());
        let first = drive(&mut s, |_| Some(1.0));
        assert!(first.iter().all(|c| c.pipeline == Pipeline::CpAsync), "{first:?}");
    }

    #[test]
    fn budgets_are_respected_and_proposals_are_unique_and_legal() {
        let space = toy_space();
        let p = problem();
        let legal = space.legal_for(&p);
        assert!(legal.len() > 100);
        let m = CostModel::new(DeviceModel::h200());
        for kind in kinds() {
            for budget in [Budget::evals(17), Budget::fraction(0.1), Budget::unlimited()] {
                let mut s = kind.build(legal.clone(), &p, budget);
                // Configurations with block_n = 32 fail: failures count against the budget too.
                let got = drive(s.as_mut(), |c| (c.block_n != 32).then(|| m.estimate(c, &p).us));
                assert_eq!(got.len(), budget.limit(legal.len()), "{} {budget:?}", kind.name());
                let unique: HashSet<_> = got.iter().collect();
                assert_eq!(unique.len(), got.len(), "{} proposed a config twice", kind.name());
                for c in &got {
                    assert!(
                        space.check(c, Some(&p)).is_ok(),
                        "{} proposed illegal {c}",
                        kind.name()
                    );
                }
            }
        }
    }

    #[test]
    fn wall_time_budget_stops_proposals() {
        let p = problem();
        let legal = toy_space().legal_for(&p);
        for kind in kinds() {
            let budget = Budget { max_wall: Some(Duration::ZERO), ..Budget::default() };
            let mut s = kind.build(legal.clone(), &p, budget);
            assert!(s.next().is_none(), "{}", kind.name());
        }
    }

    #[test]
    fn exhaustive_enumerates_everything_legal_in_order() {
        let p = problem();
        let legal = toy_space().legal_for(&p);
        let mut s = Exhaustive::new(legal.clone(), Budget::unlimited());
        assert_eq!(drive(&mut s, |_| None), legal);
    }

    #[test]
    fn random_is_reproducible_for_a_seed_and_differs_across_seeds() {
        let p = problem();
        let legal = toy_space().legal_for(&p);
        let run =
            |seed| drive(&mut RandomSearch::new(legal.clone(), Budget::evals(50), seed), |_| None);
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
        let all = drive(&mut RandomSearch::new(legal.clone(), Budget::unlimited(), 9), |_| None);
        let a: HashSet<_> = all.iter().collect();
        let b: HashSet<_> = legal.iter().collect();
        assert_eq!(a, b);
        assert_ne!(all, legal, "shuffled");
    }

    #[test]
    fn model_guided_starts_with_the_model_ranking_then_climbs() {
        let p = problem();
        let legal = toy_space().legal_for(&p);
        let m = CostModel::new(DeviceModel::h200());
        let ranked = m.rank(&legal, &p);
        let options = ModelGuidedOptions { initial: 5, radius: 1, beam: 1 };
        let mut s = ModelGuided::new(legal.clone(), &p, &m, Budget::evals(12), options);
        let got = drive(&mut s, |c| Some(m.estimate(c, &p).us));
        let grid = Grid::of(&ranked.iter().map(|r| r.0).collect::<Vec<_>>());
        let pos = |c: &GemmConfig| ranked.iter().position(|r| r.0 == *c).unwrap();
        // The initial picks: the model's favourite first, then near the top of the ranking, no
        // two of them one step apart.
        assert_eq!(got[0], ranked[0].0);
        for (a, x) in got[..5].iter().enumerate() {
            assert!(pos(x) < 64, "{x} ranks {}", pos(x));
            for y in &got[..a] {
                assert!(!grid.neighbours(pos(y), 1).contains(&pos(x)), "{x} next to {y}");
            }
        }
        // After the initial phase every proposal is a one-step neighbour of a measured config.
        for (k, c) in got.iter().enumerate().skip(5) {
            let before: Vec<usize> = got[..k].iter().map(pos).collect();
            let near = before.iter().any(|&i| grid.neighbours(i, 1).contains(&pos(c)));
            let next_in_rank = pos(c) == (0..ranked.len()).find(|i| !before.contains(i)).unwrap();
            assert!(near || next_in_rank, "{c} came from nowhere");
        }
    }

    #[test]
    fn parse_kinds() {
        assert_eq!(StrategyKind::parse("random").unwrap().name(), "random");
        assert_eq!(StrategyKind::parse("model").unwrap().name(), "model");
        assert!(StrategyKind::parse("annealing").is_err());
    }
}
