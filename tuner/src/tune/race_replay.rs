//! Racing replayed over an exhaustive measurement log (`fp4tune simulate --strategy race`): per
//! shape, buckets in increasing M, each key's pool built and its screening rounds walked exactly
//! as a campaign does (the previous bucket's carry, the seeds, the model's ranking; the same
//! refinement rounds and stop rule), screened with the first samples of the logged full-policy
//! measurements, its finalists judged by their logged medians. The pick is compared with the
//! log's best.

use super::log::{Outcome, Record};
use super::race::{self, RaceOptions, Round};
use crate::problem::GemmProblem;
use crate::search::{CostModel, DeviceModel};
use crate::table::TableKey;
use crate::template::{self, GemmConfig};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;

/// A pick counts as the best when within this much of the exhaustive best.
pub const RACE_TARGET: f64 = 0.02;

/// One key of the replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RaceKeyReport {
    pub key: TableKey,
    /// Configurations timed in the log (the exhaustive run).
    pub logged: usize,
    /// Screened configurations (pool and refinement) and how many of them the log holds a time for.
    pub pool: usize,
    pub pool_timed: usize,
    pub finalists: usize,
    pub best: GemmConfig,
    pub best_us: f64,
    pub pick: Option<GemmConfig>,
    pub pick_us: f64,
    /// pick / best - 1 (infinite when nothing was picked).
    pub regret: f64,
    /// The best configuration was in the pool.
    pub best_in_pool: bool,
}

/// The replay of a log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RaceReplay {
    pub options: RaceOptions,
    pub keys: Vec<RaceKeyReport>,
}

impl RaceReplay {
    pub fn max_regret(&self) -> f64 {
        self.keys.iter().map(|k| k.regret).fold(0.0, f64::max)
    }

    /// Geometric mean of (1 + regret), minus one.
    pub fn geomean_regret(&self) -> f64 {
        if self.keys.is_empty() {
            return f64::INFINITY;
        }
        let s: f64 = self.keys.iter().map(|k| (1.0 + k.regret).ln()).sum();
        (s / self.keys.len() as f64).exp() - 1.0
    }

    pub fn within_target(&self) -> usize {
        self.keys.iter().filter(|k| k.regret <= RACE_TARGET).count()
    }

    /// Screened evaluations over the exhaustive ones.
    pub fn evaluation_fraction(&self) -> f64 {
        let pool: usize = self.keys.iter().map(|k| k.pool).sum();
        let logged: usize = self.keys.iter().map(|k| k.logged).sum();
        pool as f64 / logged.max(1) as f64
    }

    pub fn to_markdown(&self) -> String {
        let o = &self.options;
        let mut s = format!(
            "## Racing replay, {} keys\n\nOptions: pool {:.0}% of the legal configurations (at least {}, \
             capped at {:.1} s of predicted screening per key), the neighbours of the {} fastest screened \
             (at most {}) screened next, {} finalists, {} carried to the next \
             bucket, screening on the first {} samples of each logged measurement.\n\n\
             Within {:.0}% of the exhaustive best: {} of {} keys; max regret {:.2}%, geomean regret \
             {:.2}%; screened {} of {} logged evaluations ({:.1}%).\n\n",
            self.keys.len(),
            100.0 * o.pool_fraction,
            o.min_pool,
            o.key_seconds,
            o.refine_top,
            o.refine_max,
            o.finalists,
            o.carry,
            o.screen_samples,
            100.0 * RACE_TARGET,
            self.within_target(),
            self.keys.len(),
            100.0 * self.max_regret(),
            100.0 * self.geomean_regret(),
            self.keys.iter().map(|k| k.pool).sum::<usize>(),
            self.keys.iter().map(|k| k.logged).sum::<usize>(),
            100.0 * self.evaluation_fraction(),
        );
        s.push_str(
            "| key | logged | pool | finalists | best us | best config | pick us | pick config | regret | best in pool |\n|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for k in &self.keys {
            s.push_str(&format!(
                "| {} {} {} N={} K={} M={} | {} | {} | {} | {:.2} | {} | {:.2} | {} | {:.2}% | {} |\n",
                k.key.op,
                k.key.family,
                k.key.a_type,
                k.key.n,
                k.key.k,
                k.key.m,
                k.logged,
                k.pool,
                k.finalists,
                k.best_us,
                k.best.name(),
                k.pick_us,
                k.pick.map_or("-".into(), |c| c.name()),
                100.0 * k.regret,
                if k.best_in_pool { "yes" } else { "no" }
            ));
        }
        s
    }
}

/// The cost model a campaign on `device` ranks its pools with: the device's data sheet, or the
/// H200's when it has none (what the replay of a log uses too).
pub fn race_model(device: &str) -> CostModel {
    CostModel::new(DeviceModel::data_sheet(device).unwrap_or_else(DeviceModel::h200))
}

/// The anchors of a key's family: its default and measured seed configurations (timed with the
/// full policy on every key, so the table's default is chosen among configurations timed
/// everywhere), also the start of every pool.
pub fn anchors(key: &TableKey) -> Vec<GemmConfig> {
    let mut v = vec![template::default_config(key.family, key.a_type)];
    v.extend(template::measured_seeds(key.family, key.a_type));
    v.dedup();
    v
}

/// Replay racing with `opts` over the fused timed records of `records` (an exhaustive log).
pub fn replay(records: &[Record], opts: &RaceOptions) -> RaceReplay {
    // Per key: full median and screening estimate per configuration (first record wins).
    // Failed candidates stay in (they take a pool slot and give no time); illegal ones do not.
    let mut per_key: BTreeMap<TableKey, HashMap<GemmConfig, Option<(f64, f64)>>> = BTreeMap::new();
    let mut device = String::new();
    for r in records.iter().filter(|r| r.method.is_fused()) {
        device.clone_from(&r.device);
        let times = per_key.entry(r.key.clone()).or_default();
        let t = match &r.outcome {
            Outcome::Illegal { .. } => continue,
            Outcome::Timed { time, samples } => Some((
                time.median,
                race::screen_estimate(samples, time.median, opts.screen_samples),
            )),
            _ => None,
        };
        let e = times.entry(r.config).or_insert(t);
        if e.is_none() {
            *e = t;
        }
    }
    let model = race_model(&device);
    // Shapes in key order, buckets in increasing M (the key order sorts M last).
    let mut keys = Vec::new();
    let mut carry: Vec<GemmConfig> = Vec::new();
    let mut previous: Option<(u32, f64)> = None;
    let mut shape: Option<TableKey> = None;
    for (key, times) in &per_key {
        let same_shape = shape.as_ref().is_some_and(|s| {
            (&s.op, s.family, s.a_type, s.n, s.k, s.experts)
                == (&key.op, key.family, key.a_type, key.n, key.k, key.experts)
        });
        if !same_shape {
            carry.clear();
            previous = None;
            shape = Some(key.clone());
        }
        let Some((best, best_us)) = times
            .iter()
            .filter_map(|(c, t)| t.map(|t| (*c, t.0)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
        else {
            continue;
        };
        let problem = GemmProblem::new(key.m, key.n, key.k, key.a_type);
        let mut legal: Vec<GemmConfig> = times.keys().copied().collect();
        legal.sort();
        let anchors = anchors(key);
        let pool = race::pool(&legal, &problem, &model, &anchors, &carry, previous, opts);
        let logged = |_: Round, round: &[GemmConfig]| -> Result<_, Infallible> {
            Ok(round.iter().map(|c| times.get(c).copied().flatten().map(|t| t.1)).collect())
        };
        let Ok(rounds) = race::screen_rounds(&legal, &pool, opts, logged);
        let finals = race::finalists(&rounds.screened, &anchors, opts);
        let pick = finals
            .iter()
            .filter_map(|c| times.get(c).copied().flatten().map(|t| (*c, t.0)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        carry = race::carry_out(&rounds.screened, opts.carry);
        previous = pick.map(|p| (key.m, p.1));
        keys.push(RaceKeyReport {
            key: key.clone(),
            logged: times.values().filter(|t| t.is_some()).count(),
            pool: rounds.in_play.len(),
            pool_timed: rounds.screened.len(),
            finalists: finals.len(),
            best,
            best_us,
            pick: pick.map(|p| p.0),
            pick_us: pick.map_or(f64::INFINITY, |p| p.1),
            regret: pick.map_or(f64::INFINITY, |p| p.1 / best_us - 1.0),
            best_in_pool: rounds.in_play.contains(&best),
        });
    }
    RaceReplay { options: *opts, keys }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(name: &str) -> Vec<Record> {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/h200").join(name);
        super::super::log::read(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The shipped racing options against every committed exhaustive H200 log: each key's pick
    /// within 2% of the exhaustive best, geomean regret at most 1% (the replay in
    /// `results/h200/simulation-race.md`).
    #[test]
    fn shipped_racing_finds_the_exhaustive_best_on_the_committed_logs() {
        let opts = RaceOptions::default();
        let mut all = Vec::new();
        for log in [
            "exhaustive-tp8-gate-up-w4a16.jsonl.gz",
            "exhaustive-tp8-down-w4a16.jsonl.gz",
            "exhaustive-tp8-m64-w4a16.jsonl.gz",
        ] {
            let r = replay(&committed(log), &opts);
            assert!(!r.keys.is_empty(), "{log}");
            for k in &r.keys {
                assert!(
                    k.regret <= RACE_TARGET,
                    "{log}: {} regret {:.2}%",
                    k.key,
                    100.0 * k.regret
                );
                assert!(k.pool < k.logged, "{log}: {} screened everything", k.key);
            }
            all.extend(r.keys);
        }
        let total = RaceReplay { options: opts, keys: all };
        assert!(total.keys.len() >= 19, "{}", total.keys.len());
        assert!(total.geomean_regret() <= 0.01, "{}", total.geomean_regret());
    }

    /// Screening uses the first samples of a logged measurement: a key whose best configuration
    /// screens slow (its first samples are outliers) is missed when the finalists are too few.
    #[test]
    fn screening_noise_can_cost_a_key_and_more_finalists_recover_it() {
        let records = committed("exhaustive-tp8-down-w4a16.jsonl.gz");
        let key = records.iter().find(|r| r.key.m == 16).unwrap().key.clone();
        let mut one: Vec<Record> = records.into_iter().filter(|r| r.key == key).collect();
        // Slow the first samples of the exhaustive best only.
        let best = replay(&one, &RaceOptions::default()).keys[0].best;
        for r in one.iter_mut().filter(|r| r.config == best) {
            if let Outcome::Timed { samples, .. } = &mut r.outcome {
                for s in samples.iter_mut().take(5) {
                    *s *= 3.0;
                }
            }
        }
        let few = RaceOptions { finalists: 1, ..RaceOptions::default() };
        assert!(replay(&one, &few).keys[0].regret > 0.0);
        assert!(replay(&one, &RaceOptions::default()).keys[0].regret <= RACE_TARGET);
    }
}
