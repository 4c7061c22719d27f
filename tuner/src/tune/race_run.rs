//! Racing's side of a campaign (see `tune::race`): one key with the time budget shared out over
//! the keys left, its pool, refinement rounds and finals, reusing what the log holds.

use super::{Campaign, Event, Outcome, RaceSpec, TuneError};
use crate::problem::GemmProblem;
use crate::table::TableKey;
use crate::template::GemmConfig;
use crate::tune::race::{self, RaceOptions, Round};
use std::collections::HashMap;
use std::time::Instant;

/// What racing one key found: configurations screened, timed under the full policy, and the
/// fastest full-policy time.
struct KeyResult {
    screened: usize,
    timed: usize,
    best: Option<(GemmConfig, f64)>,
}

/// What is known of a key's configurations, from the log and from this run.
#[derive(Default)]
struct Known {
    /// Screening median per measured configuration (a full-policy timing counts too; `None`:
    /// measured without a time).
    screen: HashMap<GemmConfig, Option<f64>>,
    /// Full-policy median per timed configuration.
    full: HashMap<GemmConfig, f64>,
}

impl Known {
    /// Takes in one measurement of `c`: the first screening time and the first full-policy median
    /// known of a configuration stay (a time fills one measured without).
    fn note(&mut self, c: GemmConfig, o: &Outcome) {
        let t = o.screen_us();
        let e = self.screen.entry(c).or_insert(t);
        if e.is_none() {
            *e = t;
        }
        if let Outcome::Timed { time, .. } = o {
            self.full.entry(c).or_insert(time.median);
        }
    }
}

impl Campaign<'_> {
    /// One key by racing (see `tune::race`): the pool (the previous bucket's fastest, the
    /// anchors, the model's ranking) screened, refinement rounds around the fastest, the
    /// finalists and anchors under the full policy. Measurements already in the log are reused.
    fn race_key(
        &mut self,
        space: &[GemmConfig],
        model: &crate::search::CostModel,
        race_spec: &RaceSpec,
        opts: &RaceOptions,
        key: &TableKey,
    ) -> Result<KeyResult, TuneError> {
        let spec = self.spec;
        let problem = GemmProblem::new(key.m, key.n, key.k, key.a_type);
        let legal = Self::legal(space, key);
        let anchors = crate::tune::race_replay::anchors(key);
        let shape = (key.n, key.k);
        let carry = self.carry.get(&shape).cloned().unwrap_or_default();
        let previous = self.previous_best.get(&shape).copied();
        let mut known = Known::default();
        for (c, o) in self.previous_of(key) {
            known.note(c, &o);
        }
        let pool = race::pool(&legal, &problem, model, &anchors, &carry, previous, opts);
        let rounds = race::screen_rounds(&legal, &pool, opts, |round, configs| {
            self.screen_round(key, race_spec, round, configs, &mut known)
        })?;
        let finals = race::finalists(&rounds.screened, &anchors, opts);
        let todo: Vec<GemmConfig> =
            finals.iter().copied().filter(|c| !known.full.contains_key(c)).collect();
        for (c, o) in self.run_batch(key, &todo, &spec.policy, false)? {
            known.note(c, &o);
        }
        self.carry.insert(shape, race::carry_out(&rounds.screened, opts.carry));
        let best = finals
            .iter()
            .filter_map(|c| known.full.get(c).map(|t| (*c, *t)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        if let Some((_, us)) = best {
            self.previous_best.insert(shape, (key.m, us));
        }
        Ok(KeyResult { screened: rounds.in_play.len(), timed: known.full.len(), best })
    }

    /// The screening times of one round of a key's configurations, one per configuration: what
    /// `known` holds is reused, the rest is screened by the worker (a refinement round's kernels,
    /// which the pools compiled in the background do not hold, compiled first on all cores so
    /// the campaign counts what the cache lacked). A configuration measured without a time is
    /// known as such and not screened again.
    fn screen_round(
        &mut self,
        key: &TableKey,
        race_spec: &RaceSpec,
        round: Round,
        configs: &[GemmConfig],
        known: &mut Known,
    ) -> Result<Vec<Option<f64>>, TuneError> {
        let todo: Vec<GemmConfig> =
            configs.iter().copied().filter(|c| !known.screen.contains_key(c)).collect();
        if let Round::Refinement(_) = round {
            let sources: Vec<_> = todo.iter().filter_map(|c| c.render().ok()).collect();
            self.stats.refined_cache += self.compiler.precompile(&sources);
        }
        for (c, o) in self.run_batch(key, &todo, &race_spec.screen, true)? {
            known.note(c, &o);
        }
        for c in todo {
            known.screen.entry(c).or_insert(None);
        }
        Ok(configs.iter().map(|c| known.screen.get(c).copied().flatten()).collect())
    }

    /// One key by racing, then its dequantize-then-cuBLAS measurement, with the campaign's
    /// time budget shared out over this GPU's `keys_left` keys (this one included); `index` and
    /// `total` are the key's place among this GPU's keys.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn race_one(
        &mut self,
        space: &[GemmConfig],
        model: &crate::search::CostModel,
        race_spec: &RaceSpec,
        key: &TableKey,
        (index, total, keys_left): (usize, usize, usize),
        t0: Instant,
    ) -> Result<(), TuneError> {
        let (spec, progress) = (self.spec, self.progress);
        let mut opts = race_spec.options;
        let mut short = false;
        if let Some(budget) = spec.time_budget {
            let left = budget.saturating_sub(t0.elapsed()).as_secs_f64();
            // Screening is about half of a key's time (finals, set-up and the composite
            // pass take the rest).
            let share = 0.5 * left / keys_left.max(1) as f64;
            if share < opts.key_seconds {
                opts.key_seconds = share.max(0.0);
                opts.refine_rounds = opts.refine_rounds.min(1);
                short = true;
            }
        }
        let shape = (key.n, key.k);
        if race::is_lean(
            self.previous_best.get(&shape).copied(),
            self.previous_composite.get(&shape).copied(),
        ) {
            opts = race::lean(&opts);
        }
        progress(Event::Key { index, total, key: key.clone(), candidates: 0, done_before: 0 });
        let KeyResult { screened, timed, best } =
            self.race_key(space, model, race_spec, &opts, key)?;
        // The dequantize-then-cuBLAS path while the worker still holds the key's operands
        // (or its time from the log, when a resumed run measured it before).
        let logged = self
            .previous
            .iter()
            .rev()
            .find(|r| {
                r.key == *key && !r.method.is_fused() && r.template_hash == self.template_hash
            })
            .map(|r| r.outcome.median_us());
        let composite_us = match (logged, spec.composite_min_m, best) {
            (Some(us), _, _) => us,
            (None, Some(min_m), Some((fallback, _))) if key.m >= min_m && key.k % 16 == 0 => {
                self.composite_key(key, fallback)?
            }
            _ => None,
        };
        match composite_us {
            Some(us) => self.previous_composite.insert(shape, (key.m, us)),
            None => self.previous_composite.remove(&shape),
        };
        if short {
            self.stats.short_keys.push(key.clone());
        }
        progress(Event::KeyDone {
            index,
            total,
            key: key.clone(),
            screened,
            timed,
            best,
            elapsed: t0.elapsed(),
            short,
        });
        Ok(())
    }
}
