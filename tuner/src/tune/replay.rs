//! Replay (offline simulation) of a search strategy against a full measurement log: the strategy asks, the log
//! answers, and the report gives best-found regret against evaluations spent, per key and
//! aggregated.

use super::log::{LogContents, LogError, Outcome, Record};
use crate::problem::GemmProblem;
use crate::search::{Budget, SearchError, SearchSpace, Strategy, StrategyKind};
use crate::table::TableKey;
use crate::template::GemmConfig;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

/// Why a log cannot be replayed, or a budget is meaningless. Every record error names the file
/// and line.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("{}: no records to replay", path.display())]
    Empty { path: std::path::PathBuf },
    #[error(
        "{}:{line}: a record from {found}, but line {first_line} is from {expected}: a simulation \
         replays one GPU model's measurements (as merge, it refuses mixed logs); split the log by \
         device",
        path.display()
    )]
    Device {
        path: std::path::PathBuf,
        line: usize,
        found: String,
        first_line: usize,
        expected: String,
    },
    #[error(
        "{}:{line}: a {family} record made with templates {found}, but line {first_line} used \
         {expected}: a simulation compares measurements of one template version; keep one \
         version's records (filter by `template_hash`) or re-tune",
        path.display()
    )]
    Templates {
        path: std::path::PathBuf,
        line: usize,
        family: String,
        found: String,
        first_line: usize,
        expected: String,
    },
    #[error("{}:{line}: cannot be replayed: {reason}", path.display())]
    Record { path: std::path::PathBuf, line: usize, reason: String },
    #[error("budget {value}: {reason}")]
    Budget { value: f64, reason: &'static str },
}

/// The evaluation budget of a simulation as a fraction of each key's logged candidates: in
/// (0, 1]. Zero, negative, above one or not a number is refused (not taken as one evaluation).
pub fn budget_fraction(value: f64) -> Result<Budget, ReplayError> {
    if !value.is_finite() {
        return Err(ReplayError::Budget { value, reason: "must be a number in (0, 1]" });
    }
    if value <= 0.0 {
        return Err(ReplayError::Budget {
            value,
            reason: "must be above 0 (a fraction of each key's logged candidates, up to 1)",
        });
    }
    if value > 1.0 {
        return Err(ReplayError::Budget {
            value,
            reason: "must be at most 1 (all of each key's logged candidates)",
        });
    }
    Ok(Budget::fraction(value))
}

/// Check that `records` (from `path`, at `lines`) can be replayed together: one GPU model, one
/// template version per family, and every timed record plausible (a finite median of at least
/// [`crate::table::MIN_PLAUSIBLE_US`], inside its interval; [`super::log::check_record`]).
pub fn validate(
    records: &[Record],
    lines: &[usize],
    path: &std::path::Path,
) -> Result<(), ReplayError> {
    let line_of = |i: usize| lines.get(i).copied().unwrap_or(i + 1);
    let id = |r: &Record| {
        format!("{} (cc {}.{})", r.device, r.compute_capability.0, r.compute_capability.1)
    };
    let mut hashes: HashMap<crate::template::Family, (usize, &str)> = HashMap::new();
    for (i, r) in records.iter().enumerate() {
        let line = line_of(i);
        if id(r) != id(&records[0]) {
            return Err(ReplayError::Device {
                path: path.to_path_buf(),
                line,
                found: id(r),
                first_line: line_of(0),
                expected: id(&records[0]),
            });
        }
        let (first_line, expected) =
            *hashes.entry(r.key.family).or_insert((line, r.template_hash.as_str()));
        if expected != r.template_hash {
            return Err(ReplayError::Templates {
                path: path.to_path_buf(),
                line,
                family: r.key.family.to_string(),
                found: r.template_hash.chars().take(16).collect(),
                first_line,
                expected: expected.chars().take(16).collect(),
            });
        }
        super::log::check_record(r).map_err(|reason| ReplayError::Record {
            path: path.to_path_buf(),
            line,
            reason,
        })?;
    }
    Ok(())
}

/// Read a measurement log for `fp4tune simulate` and [`validate`] it; an empty log is an error.
/// The torn last line of a killed run, if any, comes back in [`LogContents::torn_tail`] for the
/// caller to warn about.
pub fn load_log(path: &std::path::Path) -> Result<LogContents, ReplayError> {
    let contents = super::log::read_log(path)?;
    if contents.records.is_empty() {
        return Err(ReplayError::Empty { path: path.to_path_buf() });
    }
    validate(&contents.records, &contents.lines, path)?;
    Ok(contents)
}

/// Fractions of the exhaustive evaluation count at which regret is reported.
pub const FRACTIONS: [f64; 3] = [0.05, 0.10, 0.20];
/// Regret counted as "found": within 3% of the exhaustive best.
pub const NEAR: f64 = 0.03;

/// What the strategy of one key chooses from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Candidates {
    /// The legal configurations of the family's current space for the key's problem.
    Space,
    /// The configurations the log holds for the key (except those recorded as illegal).
    Logged,
}

/// What a strategy factory is told about one key.
#[derive(Debug, Clone)]
pub struct SimKey<'a> {
    pub key: &'a TableKey,
    pub problem: GemmProblem,
    /// Configurations the log evaluated for the key (sorted, illegal ones left out).
    pub logged: &'a [GemmConfig],
}

/// The simulation of one key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyReport {
    pub key: TableKey,
    /// Configurations the exhaustive run evaluated (the log's, illegal ones left out).
    pub exhaustive_evals: usize,
    pub exhaustive_best_us: f64,
    pub exhaustive_best: GemmConfig,
    /// Evaluations the strategy spent.
    pub evals: usize,
    /// Proposals the log had no time for (missing or failed).
    pub untimed: usize,
    /// Best time found after each evaluation.
    pub curve: Vec<Option<f64>>,
    pub found_best: Option<GemmConfig>,
    /// Regret (best found / exhaustive best - 1; infinite when nothing was timed yet) after
    /// [`FRACTIONS`] of `exhaustive_evals` evaluations.
    pub regret_at: [f64; 3],
    /// Evaluations until the regret first fell to [`NEAR`] or below.
    pub evals_to_near: Option<usize>,
}

impl KeyReport {
    /// Regret after `evals` evaluations (the final state if the strategy stopped earlier).
    pub fn regret_after(&self, evals: usize) -> f64 {
        let i = evals.min(self.curve.len());
        match i.checked_sub(1).and_then(|i| self.curve[i]) {
            Some(t) => t / self.exhaustive_best_us - 1.0,
            None => f64::INFINITY,
        }
    }

    pub fn final_regret(&self) -> f64 {
        self.regret_after(self.curve.len())
    }
}

/// Aggregates over keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    pub keys: usize,
    pub mean_regret_at: [f64; 3],
    pub max_regret_at: [f64; 3],
    /// Keys within [`NEAR`] at 20% of the evaluations (the acceptance target).
    pub near_at_20: usize,
    /// Keys that got within [`NEAR`] at all, and the mean/max fraction of the exhaustive
    /// evaluations they needed.
    pub reached_near: usize,
    pub mean_fraction_to_near: Option<f64>,
    pub max_fraction_to_near: Option<f64>,
    pub mean_evals_to_near: Option<f64>,
    pub max_evals_to_near: Option<usize>,
}

/// The simulation of one strategy over every key of a log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimulationReport {
    pub strategy: String,
    pub budget: Budget,
    pub keys: Vec<KeyReport>,
    /// Keys not simulated, with the reason (no timed record, no strategy).
    pub skipped: Vec<(TableKey, String)>,
    pub aggregate: Aggregate,
}

fn key_name(k: &TableKey) -> String {
    format!("{} {} {} N={} K={} M={}", k.op, k.family, k.a_type, k.n, k.k, k.m)
}

fn fmt_regret(r: f64) -> String {
    if r.is_finite() {
        format!("{:.1}%", 100.0 * r)
    } else {
        "none".into()
    }
}

impl SimulationReport {
    /// Whether every key is within [`NEAR`] of its exhaustive best after 20% of the evaluations.
    pub fn meets_target(&self) -> bool {
        !self.keys.is_empty() && self.aggregate.near_at_20 == self.keys.len()
    }

    pub fn to_markdown(&self) -> String {
        let a = &self.aggregate;
        let mut s = String::new();
        let _ = writeln!(s, "## Simulation: strategy {}, {} keys\n", self.strategy, a.keys);
        let _ = writeln!(s, "| regret | at 5% | at 10% | at 20% |\n|---|---|---|---|");
        let row = |v: &[f64; 3]| v.map(fmt_regret).join(" | ");
        let _ = writeln!(s, "| mean | {} |", row(&a.mean_regret_at));
        let _ = writeln!(s, "| max | {} |", row(&a.max_regret_at));
        let _ = writeln!(
            s,
            "\nWithin {:.0}% at 20% of the evaluations: {} of {} keys{}.",
            NEAR * 100.0,
            a.near_at_20,
            a.keys,
            if self.meets_target() { " (target met)" } else { "" }
        );
        let frac = |f: Option<f64>| f.map_or("-".into(), |f| format!("{:.1}%", 100.0 * f));
        let _ = writeln!(
            s,
            "Reached {:.0}%: {} keys; evaluations needed: mean {} ({} of exhaustive), max {} ({}).\n",
            NEAR * 100.0,
            a.reached_near,
            a.mean_evals_to_near.map_or("-".into(), |e| format!("{e:.1}")),
            frac(a.mean_fraction_to_near),
            a.max_evals_to_near.map_or("-".into(), |e| e.to_string()),
            frac(a.max_fraction_to_near),
        );
        let _ = writeln!(
            s,
            "| key | exhaustive evals | best us | best config | evals | untimed | found us | \
             regret 5% | 10% | 20% | evals to {:.0}% |\n|---|---|---|---|---|---|---|---|---|---|---|",
            NEAR * 100.0
        );
        for k in &self.keys {
            let found = k.curve.last().copied().flatten();
            let _ = writeln!(
                s,
                "| {} | {} | {:.2} | {} | {} | {} | {} | {} | {} |",
                key_name(&k.key),
                k.exhaustive_evals,
                k.exhaustive_best_us,
                k.exhaustive_best,
                k.evals,
                k.untimed,
                found.map_or("-".into(), |t| format!("{t:.2}")),
                k.regret_at.map(fmt_regret).join(" | "),
                k.evals_to_near.map_or("-".into(), |e| e.to_string()),
            );
        }
        for (k, why) in &self.skipped {
            let _ = writeln!(s, "\nSkipped {}: {why}", key_name(k));
        }
        s
    }
}

/// One key's log: time per configuration (best median over repeated records; `None` for
/// failures) and the configurations only ever recorded as illegal.
#[derive(Default)]
struct KeyLog {
    times: HashMap<GemmConfig, Option<f64>>,
    evaluated: HashSet<GemmConfig>,
}

/// Replay `records`: for each key, build a strategy with `factory`, answer its proposals from the
/// log (a configuration missing from the log or failed is an evaluation without a time) and stop
/// at the strategy's end or at `budget` (evaluations or fraction of the key's logged
/// configurations; wall time is ignored here).
pub fn simulate<F>(records: &[Record], mut factory: F, budget: &Budget) -> SimulationReport
where
    F: FnMut(&SimKey) -> Result<Box<dyn Strategy>, SearchError>,
{
    let mut logs: BTreeMap<TableKey, KeyLog> = BTreeMap::new();
    // Strategies search fused kernels; composite records (whose config is a fallback) are not theirs.
    for r in records.iter().filter(|r| r.method.is_fused()) {
        let log = logs.entry(r.key.clone()).or_default();
        let e = log.times.entry(r.config).or_insert(None);
        if matches!(r.outcome, Outcome::Illegal { .. }) {
            continue;
        }
        log.evaluated.insert(r.config);
        // A time that cannot be real (zero, negative, not finite) counts as a failure here;
        // `load_log` refuses such logs outright.
        let t = r.outcome.median_us().filter(|t| t.is_finite() && *t > 0.0);
        *e = match (*e, t) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    let mut keys = Vec::new();
    let mut skipped = Vec::new();
    let mut strategy_name = String::new();
    for (key, log) in &logs {
        let mut logged: Vec<GemmConfig> = log.evaluated.iter().copied().collect();
        logged.sort();
        let best = log
            .times
            .iter()
            .filter_map(|(c, t)| t.map(|t| (*c, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let Some((best_config, best_us)) = best else {
            skipped.push((key.clone(), "no timed record".into()));
            continue;
        };
        let problem = GemmProblem::new(key.m, key.n, key.k, key.a_type);
        let sim_key = SimKey { key, problem, logged: &logged };
        let mut strategy = match factory(&sim_key) {
            Ok(s) => s,
            Err(e) => {
                skipped.push((key.clone(), e.to_string()));
                continue;
            }
        };
        strategy_name = strategy.name().to_string();
        let n = logged.len();
        let limit = Budget { max_wall: None, ..*budget }.limit(n);
        let mut curve: Vec<Option<f64>> = Vec::new();
        let mut found: Option<(GemmConfig, f64)> = None;
        let mut untimed = 0;
        while curve.len() < limit {
            let Some(c) = strategy.next() else { break };
            let t = log.times.get(&c).copied().flatten();
            if t.is_none() {
                untimed += 1;
            }
            strategy.observe(c, t);
            if let Some(t) = t {
                if found.is_none_or(|(_, b)| t < b) {
                    found = Some((c, t));
                }
            }
            curve.push(found.map(|f| f.1));
        }
        let mut report = KeyReport {
            key: key.clone(),
            exhaustive_evals: n,
            exhaustive_best_us: best_us,
            exhaustive_best: best_config,
            evals: curve.len(),
            untimed,
            curve,
            found_best: found.map(|f| f.0),
            regret_at: [0.0; 3],
            evals_to_near: None,
        };
        report.regret_at =
            FRACTIONS.map(|f| report.regret_after(((f * n as f64).ceil() as usize).max(1)));
        report.evals_to_near = (1..=report.curve.len()).find(|&i| report.regret_after(i) <= NEAR);
        keys.push(report);
    }
    let aggregate = aggregate(&keys);
    SimulationReport { strategy: strategy_name, budget: *budget, keys, skipped, aggregate }
}

fn aggregate(keys: &[KeyReport]) -> Aggregate {
    let n = keys.len();
    let mut mean = [0.0; 3];
    let mut max = [0.0f64; 3];
    for k in keys {
        for i in 0..3 {
            mean[i] += k.regret_at[i] / n.max(1) as f64;
            max[i] = max[i].max(k.regret_at[i]);
        }
    }
    let reached: Vec<(usize, f64)> = keys
        .iter()
        .filter_map(|k| k.evals_to_near.map(|e| (e, e as f64 / k.exhaustive_evals.max(1) as f64)))
        .collect();
    let r = reached.len();
    Aggregate {
        keys: n,
        mean_regret_at: if n == 0 { [f64::INFINITY; 3] } else { mean },
        max_regret_at: if n == 0 { [f64::INFINITY; 3] } else { max },
        near_at_20: keys.iter().filter(|k| k.regret_at[2] <= NEAR).count(),
        reached_near: r,
        mean_fraction_to_near: (r > 0).then(|| reached.iter().map(|x| x.1).sum::<f64>() / r as f64),
        max_fraction_to_near: reached.iter().map(|x| x.1).max_by(f64::total_cmp),
        mean_evals_to_near: (r > 0)
            .then(|| reached.iter().map(|x| x.0 as f64).sum::<f64>() / r as f64),
        max_evals_to_near: reached.iter().map(|x| x.0).max(),
    }
}

/// FNV-1a of a key's name: a stable per-key seed component.
fn key_hash(k: &TableKey) -> u64 {
    key_name(k)
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Simulate a [`StrategyKind`] choosing from `candidates` (random seeds are mixed with a hash of
/// each key, so keys get different orders but runs are reproducible).
pub fn simulate_kind(
    records: &[Record],
    kind: &StrategyKind,
    candidates: Candidates,
    budget: &Budget,
) -> SimulationReport {
    let mut spaces: HashMap<
        (crate::template::Family, crate::problem::AType),
        Result<SearchSpace, SearchError>,
    > = HashMap::new();
    let mut report = simulate(
        records,
        |k: &SimKey| {
            let list = match candidates {
                Candidates::Logged => k.logged.to_vec(),
                Candidates::Space => {
                    let space = spaces
                        .entry((k.key.family, k.key.a_type))
                        .or_insert_with(|| SearchSpace::for_family(k.key.family, k.key.a_type));
                    space.as_ref().map_err(Clone::clone)?.legal_for(&k.problem)
                }
            };
            let kind = match kind {
                StrategyKind::Random { seed } => {
                    StrategyKind::Random { seed: seed ^ key_hash(k.key) }
                }
                other => other.clone(),
            };
            Ok(kind.build(list, &k.problem, *budget))
        },
        budget,
    );
    report.strategy = kind.name().into();
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Summary;
    use crate::problem::AType;
    use crate::search::model::{CostModel, DeviceModel};
    use crate::search::space::tests::toy_space;
    use crate::search::strategy::ModelGuidedOptions;
    use crate::template::Family;
    use crate::tune::log::LOG_SCHEMA_VERSION;
    use rand::{Rng, SeedableRng};

    fn key(m: u32, n: u32, k: u32) -> TableKey {
        TableKey::gemm(Family::Sm90, AType::Bf16, n, k, m)
    }

    fn record(key: &TableKey, config: GemmConfig, t: Option<f64>) -> Record {
        Record {
            schema_version: LOG_SCHEMA_VERSION,
            method: crate::table::Method::Fused,
            key: key.clone(),
            config,
            outcome: match t {
                Some(t) => Outcome::Timed {
                    time: Summary { n: 1, median: t, lo: t, hi: t, min: t, max: t },
                    samples: vec![t],
                },
                None => Outcome::CompileError { log: "x".into() },
            },
            device: "synthetic".into(),
            compute_capability: (9, 0),
            template_hash: "h".into(),
            at: 0,
            context: None,
        }
    }

    #[test]
    fn regret_curve_of_a_known_log() {
        // Ten configurations with times 10, 9, ..., 1 in exhaustive order; the last is best.
        let k = key(4, 512, 6144);
        let p = GemmProblem::new(4, 512, 6144, AType::Bf16);
        let configs: Vec<GemmConfig> = toy_space().legal_for(&p).into_iter().take(10).collect();
        let mut records: Vec<Record> = configs
            .iter()
            .enumerate()
            .map(|(i, c)| record(&k, *c, Some(10.0 - i as f64)))
            .collect();
        // A failed config and a repeated measurement (the faster one counts).
        records[0] = record(&k, configs[0], None);
        records.push(record(&k, configs[1], Some(8.0)));
        let report = simulate(
            &records,
            |s: &SimKey| {
                Ok(StrategyKind::Exhaustive.build(
                    s.logged.to_vec(),
                    &s.problem,
                    Budget::unlimited(),
                ))
            },
            &Budget::unlimited(),
        );
        let r = &report.keys[0];
        assert_eq!(r.exhaustive_evals, 10);
        assert_eq!(r.exhaustive_best_us, 1.0);
        assert_eq!(r.exhaustive_best, configs[9]);
        assert_eq!(r.untimed, 1);
        // The logged order is sorted: map it back to times.
        let time = |c: &GemmConfig| {
            let i = configs.iter().position(|x| x == c).unwrap();
            match i {
                0 => None,
                1 => Some(8.0),
                i => Some(10.0 - i as f64),
            }
        };
        let mut sorted = configs.clone();
        sorted.sort();
        let mut best = f64::INFINITY;
        for (i, c) in sorted.iter().enumerate() {
            if let Some(t) = time(c) {
                best = best.min(t);
            }
            let want = if best.is_finite() { best - 1.0 } else { f64::INFINITY };
            assert_eq!(r.regret_after(i + 1), want, "after {}", i + 1);
        }
        // 5% and 10% of 10 evaluations round up to one; 20% to two.
        assert_eq!(r.regret_at[0], r.regret_after(1));
        assert_eq!(r.regret_at[2], r.regret_after(2));
        assert_eq!(r.final_regret(), 0.0);
        let first_best = sorted.iter().position(|c| *c == configs[9]).unwrap() + 1;
        assert_eq!(r.evals_to_near, Some(first_best));
        let md = report.to_markdown();
        assert!(md.contains("N=512 K=6144 M=4"), "{md}");
    }

    #[test]
    fn budget_caps_evaluations_and_missing_configs_count() {
        let k = key(4, 512, 6144);
        let p = GemmProblem::new(4, 512, 6144, AType::Bf16);
        let legal = toy_space().legal_for(&p);
        // Only every other legal config is in the log.
        let records: Vec<Record> =
            legal.iter().step_by(2).map(|c| record(&k, *c, Some(1.0 + c.block_n as f64))).collect();
        let n = records.len();
        let report = simulate(
            &records,
            |s: &SimKey| {
                Ok(StrategyKind::Exhaustive.build(legal.clone(), &s.problem, Budget::unlimited()))
            },
            &Budget::fraction(0.2),
        );
        let r = &report.keys[0];
        assert_eq!(r.evals, (0.2 * n as f64).ceil() as usize);
        assert!(r.untimed >= r.evals / 2 - 1, "{r:?}");
    }

    /// A synthetic log: the true time is the cost model of a *different* device (slower DRAM,
    /// higher latency, weaker tensor cores) plus 2% noise, so the H200 model used by the strategy
    /// ranks imperfectly.
    fn synthetic_log(seed: u64) -> Vec<Record> {
        let mut truth = DeviceModel::h200();
        truth.bandwidth_gbs *= 0.8;
        truth.stream.latency_us *= 1.4;
        truth.tensor_tflops *= 0.6;
        truth.l2_bandwidth_gbs *= 0.7;
        let truth = CostModel::new(truth);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let space = toy_space();
        let mut out = Vec::new();
        for (m, n, kk) in [(1, 512, 6144), (16, 4096, 6144), (256, 6144, 2048), (4, 6144, 256)] {
            let k = key(m, n, kk);
            let p = GemmProblem::new(m, n, kk, AType::Bf16);
            for c in space.legal_for(&p) {
                let t = truth.estimate(&c, &p).us * (1.0 + 0.02 * (rng.random::<f64>() - 0.5));
                // A few compile failures.
                let t = (rng.random::<f64>() > 0.03).then_some(t);
                out.push(record(&k, c, t));
            }
        }
        out
    }

    #[test]
    fn model_guided_finds_the_best_within_a_fifth_of_the_evaluations() {
        let records = synthetic_log(1);
        let model = StrategyKind::Model {
            model: CostModel::new(DeviceModel::h200()),
            options: ModelGuidedOptions::default(),
        };
        let budget = Budget::fraction(0.2);
        let r = simulate_kind(&records, &model, Candidates::Logged, &budget);
        assert_eq!(r.keys.len(), 4);
        assert!(r.meets_target(), "{}", r.to_markdown());
        let ex = simulate_kind(
            &records,
            &StrategyKind::Exhaustive,
            Candidates::Logged,
            &Budget::unlimited(),
        );
        assert!(ex.keys.iter().all(|k| k.final_regret() == 0.0));
        // Random with the same budget does worse on average than the model.
        let rnd =
            simulate_kind(&records, &StrategyKind::Random { seed: 1 }, Candidates::Logged, &budget);
        assert!(
            rnd.aggregate.mean_regret_at[0] > r.aggregate.mean_regret_at[0],
            "{}",
            rnd.to_markdown()
        );
        let md = r.to_markdown();
        assert!(md.contains("target met"), "{md}");
    }

    #[test]
    fn keys_without_times_are_skipped() {
        let k = key(4, 512, 6144);
        let c = toy_space().enumerate()[0];
        let records = vec![record(&k, c, None)];
        let r = simulate_kind(
            &records,
            &StrategyKind::Exhaustive,
            Candidates::Logged,
            &Budget::unlimited(),
        );
        assert!(r.keys.is_empty());
        assert_eq!(r.skipped.len(), 1);
        assert!(!r.meets_target());
    }

    #[test]
    fn budgets_outside_zero_to_one_are_refused() {
        for bad in [0.0, -0.5, f64::NAN, f64::INFINITY, 1.5] {
            let e = budget_fraction(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("budget {bad}: must be")), "{e}");
        }
        assert_eq!(budget_fraction(0.2).unwrap(), Budget::fraction(0.2));
        assert_eq!(budget_fraction(1.0).unwrap(), Budget::fraction(1.0));
    }

    /// simulate refuses what merge refuses (mixed GPU models or template versions) and records
    /// that cannot be measurements, naming the file and line; a zero median fed directly to
    /// `simulate` counts as a failure instead of turning every aggregate into "none".
    #[test]
    fn logs_are_validated_before_replay() {
        let k = key(4, 512, 6144);
        let p = GemmProblem::new(4, 512, 6144, AType::Bf16);
        let configs: Vec<GemmConfig> = toy_space().legal_for(&p).into_iter().take(3).collect();
        let good: Vec<Record> =
            configs.iter().enumerate().map(|(i, c)| record(&k, *c, Some(3.0 + i as f64))).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.jsonl");
        let save = |recs: &[Record]| {
            let text: String =
                recs.iter().map(|r| serde_json::to_string(r).unwrap() + "\n").collect();
            std::fs::write(&path, text).unwrap();
        };
        save(&good);
        assert_eq!(load_log(&path).unwrap().records.len(), 3);

        let mut mixed = good.clone();
        mixed[2].device = "NVIDIA H100".into();
        save(&mixed);
        let e = load_log(&path).unwrap_err().to_string();
        assert!(
            e.contains("sim.jsonl:3: a record from NVIDIA H100") && e.contains("line 1"),
            "{e}"
        );

        let mut mixed = good.clone();
        mixed[1].template_hash = "newer".into();
        save(&mixed);
        let e = load_log(&path).unwrap_err().to_string();
        assert!(e.contains("sim.jsonl:2: a sm90 record made with templates newer"), "{e}");

        let mut zero = good.clone();
        zero[1] = record(&k, configs[1], Some(0.0));
        save(&zero);
        let e = load_log(&path).unwrap_err().to_string();
        assert!(e.contains("sim.jsonl:2:") && e.contains("launch floor"), "{e}");
        let e = validate(&zero, &[5, 6, 7], &path).unwrap_err().to_string();
        assert!(e.contains("sim.jsonl:6: cannot be replayed"), "{e}");
        let mut negative = good.clone();
        negative[0] = record(&k, configs[0], Some(-1.0));
        let e = validate(&negative, &[], &path).unwrap_err().to_string();
        assert!(e.contains("sim.jsonl:1:"), "{e}");

        save(&[]);
        assert!(load_log(&path).unwrap_err().to_string().contains("no records"));

        let report = simulate_kind(
            &zero,
            &StrategyKind::Exhaustive,
            Candidates::Logged,
            &Budget::fraction(1.0),
        );
        assert_eq!(report.keys.len(), 1);
        assert!(report.keys[0].exhaustive_best_us >= 3.0, "{:?}", report.keys[0]);
        assert!(report.aggregate.mean_regret_at.iter().all(|r| r.is_finite() && *r >= 0.0));
    }
}
