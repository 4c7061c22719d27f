//! Racing, the default search of a campaign: per key, a pool of candidates is screened with a
//! short timing policy in one interleaved batch, and only the fastest of them (the finalists, plus
//! the anchors every key times) get the full policy whose median and interval the table records.
//!
//! The pool of a key is its neighbouring bucket's fastest screened configurations (the best
//! configuration moves slowly with M), then the seeds, then the cost model's ranking taken
//! round-robin over the weight pipelines it cannot rule out (the analytic model ranks the
//! streamed pipelines poorly against each other, not within one). Its size is a fraction of the
//! key's legal configurations, capped by what screening the key may cost (predicted from the
//! model's best time: slow kernels are screened fewer at a time). The same functions build the
//! pools of a campaign and of its offline replay (`fp4tune simulate --strategy race`) and walk
//! their screening rounds ([`screen_rounds`]), so the replay measures the strategy that ships.

use crate::bench::policy::rotation_copies;
use crate::bench::timer::MAX_ROTATION_LAUNCHES;
use crate::bench::TimingPolicy;
use crate::problem::GemmProblem;
use crate::search::space::Grid;
use crate::search::{competitive_pipelines, CostModel};
use crate::template::{GemmConfig, Pipeline};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// The racing knobs (recorded in the table's campaign block).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RaceOptions {
    /// Pool size as a fraction of the key's legal configurations.
    pub pool_fraction: f64,
    /// Smallest pool (when the key has that many legal configurations).
    pub min_pool: usize,
    /// Screening time one key may cost, seconds (caps the pool of slow keys).
    pub key_seconds: f64,
    /// Candidates that go on from screening to the full policy.
    pub finalists: usize,
    /// Fastest screened configurations of the previous bucket that join the next bucket's pool.
    pub carry: usize,
    /// After the pool is screened, the unscreened neighbours (one value step apart) of this many
    /// fastest screened configurations are screened too, at most `refine_max` of them per round,
    /// for up to `refine_rounds` rounds (a round that does not improve the fastest ends it).
    pub refine_top: usize,
    pub refine_max: usize,
    pub refine_rounds: usize,
    /// Screening samples per candidate (the campaign's screening policy; the replay takes this
    /// many of the logged samples).
    pub screen_samples: usize,
}

impl Default for RaceOptions {
    fn default() -> Self {
        Self {
            pool_fraction: 0.06,
            min_pool: 64,
            key_seconds: 1.5,
            finalists: 6,
            carry: 24,
            refine_top: 3,
            refine_max: 48,
            refine_rounds: 4,
            screen_samples: 5,
        }
    }
}

impl RaceOptions {
    /// The options in words (the table's campaign block).
    pub fn describe(&self) -> String {
        format!(
            "pool {:.0}% of each key's legal configurations (at least {}, at most {:.1} s of \
             predicted screening), {} refinement rounds of at most {} around the {} fastest, {} \
             finalists, {} carried to the next bucket, {} screening samples",
            100.0 * self.pool_fraction,
            self.min_pool,
            self.key_seconds,
            self.refine_rounds,
            self.refine_max,
            self.refine_top,
            self.finalists,
            self.carry,
            self.screen_samples
        ) + &format!(
            "; a key whose previous bucket ran dequantize-then-cuBLAS >= {COMPOSITE_LEAD}x faster \
             than its fastest fused kernel screens only the {} carried and the anchors, no \
             refinement, 2 finalists",
            self.carry
        )
    }
}

/// A key is raced lean ([`lean`]) when the previous bucket of its weight shape ran the
/// dequantize-then-cuBLAS path at least this much faster than its fastest fused kernel: the
/// composite path's lead grows with M, so the entry takes it, and the fused search only has to
/// name a correct, reasonable fallback.
pub const COMPOSITE_LEAD: f64 = 1.5;

/// Pool places of a lean key beyond the carried configurations (the anchors come right after
/// them in a pool).
const LEAN_ANCHOR_ROOM: usize = 8;

/// The options of a lean key: the pool is the previous bucket's fastest (`carry`) and the
/// anchors, no refinement, two finalists (plus the family default).
pub fn lean(opts: &RaceOptions) -> RaceOptions {
    RaceOptions {
        pool_fraction: 0.0,
        min_pool: opts.carry + LEAN_ANCHOR_ROOM,
        refine_rounds: 0,
        finalists: opts.finalists.min(2),
        ..*opts
    }
}

/// Whether a key is raced lean: `fused` is the previous bucket's (M, fastest fused full-policy
/// time) and `composite` its (M, dequantize-then-cuBLAS time), both of the key's weight shape.
pub fn is_lean(fused: Option<(u32, f64)>, composite: Option<(u32, f64)>) -> bool {
    match (fused, composite) {
        (Some((fm, f)), Some((cm, c))) => fm == cm && c > 0.0 && c * COMPOSITE_LEAD <= f,
        _ => false,
    }
}

/// Best-ranked configurations of every weight pipeline in every pool.
pub const PER_PIPELINE: usize = 8;

/// Fixed cost of screening one candidate besides its launches (verification round trips, graph
/// capture), microseconds.
const SCREEN_OVERHEAD_US: f64 = 1500.0;
/// Launches of a screened candidate: verification (2), graph probe, warm-up and samples.
const SCREEN_LAUNCHES: f64 = 12.0;

/// The pool size of a key with `legal` configurations whose best kernel is expected to take
/// `best_us` on operands rotated over `copies` copies ([`rotation_of`]).
pub fn pool_size(legal: usize, best_us: f64, copies: usize, opts: &RaceOptions) -> usize {
    let by_fraction = ((opts.pool_fraction * legal as f64).ceil() as usize).max(opts.min_pool);
    let by_time = (opts.key_seconds * 1e6 / screen_candidate_us(best_us, copies)).floor() as usize;
    by_fraction.min(by_time.max(opts.min_pool / 2).max(opts.finalists)).min(legal)
}

/// What racing one key is predicted to cost, microseconds: its pool and one refinement round
/// screened, its finalists timed under the full policy (counted as [`FULL_OVER_SCREEN`]
/// screenings each). Only the ratios between keys matter: this balances keys over GPUs and shards.
pub fn predicted_key_us(legal: usize, best_us: f64, copies: usize, opts: &RaceOptions) -> f64 {
    let screened = pool_size(legal, best_us, copies, opts) + opts.refine_max.min(legal);
    (screened as f64 + FULL_OVER_SCREEN * opts.finalists as f64)
        * screen_candidate_us(best_us, copies)
}

/// What screening one candidate whose kernel takes `best_us` costs, microseconds, on operands
/// rotated over `copies` copies: the fixed cost and launches, plus the time by which walking the
/// whole rotation in every warm-up and sample replay (`bench::timer::launches_per_graph`)
/// exceeds the screening policy's sample length (a 3.5 us GLM-5 TP8 expert GEMM rotates over 142
/// copies: about 500 us per replay where 50 us would fill a sample).
pub fn screen_candidate_us(best_us: f64, copies: usize) -> f64 {
    let screen = TimingPolicy::screen();
    let best = best_us.max(0.0);
    let walk = copies.min(MAX_ROTATION_LAUNCHES) as f64 * best;
    // a graph without the rotation: the sample's length, or two launches of a long kernel
    let filled = screen.min_sample_us.max(2.0 * best);
    let replays = (screen.warmup_replays + screen.samples) as f64;
    SCREEN_OVERHEAD_US + SCREEN_LAUNCHES * best + replays * (walk - filled).max(0.0)
}

/// The operand copies a timing of `problem` rotates over on a GPU of `l2_bytes` of L2 (as
/// `bench::gemm::DeviceProblem` uploads them: weights, scales and activations per copy).
pub fn rotation_of(problem: &GemmProblem, l2_bytes: u64) -> usize {
    let (m, n) = (problem.m as u64, problem.n as u64);
    let per_copy = problem.min_bytes().saturating_sub(m * n * 2);
    rotation_copies(per_copy, l2_bytes, TimingPolicy::default().l2_multiple)
}

/// A full-policy timing costs about this many screenings (more samples, the same set-up).
pub const FULL_OVER_SCREEN: f64 = 4.0;

/// The time a key's best kernel is expected to take: the model's best prediction, or the
/// previous bucket's measured best scaled by the token ratio when that is larger (the model is
/// optimistic on large problems).
pub fn expected_us(model_best_us: f64, previous: Option<(u32, f64)>, m: u32) -> f64 {
    let scaled = previous.map_or(0.0, |(pm, us)| us * m as f64 / pm.max(1) as f64);
    model_best_us.max(scaled)
}

/// The pool of one key: `carry` (the previous bucket's fastest, legal here), `seeds`, the
/// [`PER_PIPELINE`] best-ranked of every weight pipeline, then the model's ranking of `legal`
/// round-robin over its competitive pipelines, up to [`pool_size`]
/// (with `previous`, the previous bucket's M and measured best, in the expected time).
/// Deterministic in its inputs.
pub fn pool(
    legal: &[GemmConfig],
    problem: &GemmProblem,
    model: &CostModel,
    seeds: &[GemmConfig],
    carry: &[GemmConfig],
    previous: Option<(u32, f64)>,
    opts: &RaceOptions,
) -> Vec<GemmConfig> {
    let ranked = model.rank(legal, problem);
    let best_us = expected_us(ranked.first().map_or(0.0, |r| r.1), previous, problem.m);
    let copies = rotation_of(problem, model.device.l2_bytes);
    let size = pool_size(legal.len(), best_us, copies, opts);
    let allowed: HashSet<GemmConfig> = legal.iter().copied().collect();
    let mut out = Vec::with_capacity(size);
    let mut seen = HashSet::new();
    let mut push = |c: GemmConfig, out: &mut Vec<GemmConfig>| {
        if out.len() < size && allowed.contains(&c) && seen.insert(c) {
            out.push(c);
        }
    };
    for c in carry.iter().chain(seeds) {
        push(*c, &mut out);
    }
    // Every weight pipeline's best-ranked few, competitive or not: the model misjudges whole
    // pipelines, and refinement only walks within reach of what was screened.
    for pl in Pipeline::ALL {
        for (c, _) in ranked.iter().filter(|r| r.0.pipeline == pl).take(PER_PIPELINE) {
            push(*c, &mut out);
        }
    }
    let pipelines = competitive_pipelines(&ranked);
    let mut lanes: Vec<std::collections::VecDeque<GemmConfig>> = pipelines
        .iter()
        .map(|pl| ranked.iter().filter(|r| r.0.pipeline == *pl).map(|r| r.0).collect())
        .collect();
    while out.len() < size && lanes.iter().any(|l| !l.is_empty()) {
        for lane in lanes.iter_mut() {
            if let Some(c) = lane.pop_front() {
                push(c, &mut out);
            }
        }
    }
    // Fewer competitive candidates than the pool: the rest of the ranking.
    for (c, _) in &ranked {
        if out.len() >= size {
            break;
        }
        push(*c, &mut out);
    }
    out
}

/// A further screening round of a key: the legal, not yet screened configurations one value step
/// from its `opts.refine_top` fastest screened ones and from the fastest of each weight pipeline,
/// then two steps (fastest first, then the grid's order), at most `opts.refine_max`.
pub fn refine(
    legal: &[GemmConfig],
    screened: &[(GemmConfig, f64)],
    opts: &RaceOptions,
) -> Vec<GemmConfig> {
    let grid = Grid::of(legal);
    let index: std::collections::HashMap<GemmConfig, usize> =
        legal.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let done: HashSet<GemmConfig> = screened.iter().map(|s| s.0).collect();
    let mut out = Vec::new();
    // Around the fastest overall, and around the fastest of every weight pipeline (one
    // pipeline's best region is often out of reach of another's).
    let mut top = carry_out(screened, opts.refine_top);
    for pl in Pipeline::ALL {
        let of: Vec<(GemmConfig, f64)> =
            screened.iter().filter(|s| s.0.pipeline == pl).copied().collect();
        for c in carry_out(&of, 1) {
            if !top.contains(&c) {
                top.push(c);
            }
        }
    }
    for d in 1..=2 {
        for c in &top {
            let Some(&i) = index.get(c) else { continue };
            for j in grid.neighbours(i, d) {
                let n = legal[j];
                if out.len() < opts.refine_max && !done.contains(&n) && !out.contains(&n) {
                    out.push(n);
                }
            }
        }
    }
    out
}

/// An anchor other than the first (the family default, timed on every key) joins the finals only
/// when its screening time is within this factor of the fastest.
pub const ANCHOR_FACTOR: f64 = 1.25;

/// The options of a key whose pool has `pool` candidates: refinement rounds at most half
/// the pool each (at least 16), so slow keys stay cheap.
pub fn for_pool(opts: &RaceOptions, pool: usize) -> RaceOptions {
    RaceOptions { refine_max: opts.refine_max.min((pool / 2).max(16)), ..*opts }
}

/// A round of a key's screening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// The key's pool.
    Pool,
    /// The n-th refinement round (from 1).
    Refinement(usize),
}

/// What a key's screening rounds put in play.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rounds {
    /// Every configuration screened: the pool, then each refinement round's new ones.
    pub in_play: Vec<GemmConfig>,
    /// The configurations of `in_play` that have a screening time, in the same order.
    pub screened: Vec<(GemmConfig, f64)>,
}

impl Rounds {
    /// Puts `round` in play with its screening `times` (one per configuration, in order).
    fn add(&mut self, round: &[GemmConfig], times: &[Option<f64>]) {
        debug_assert_eq!(round.len(), times.len(), "one screening time per configuration");
        self.in_play.extend_from_slice(round);
        self.screened.extend(round.iter().zip(times).filter_map(|(c, t)| t.map(|t| (*c, t))));
    }
}

/// The screening rounds of one key: its `pool`, then up to `opts.refine_rounds` refinement
/// rounds ([`refine`] over `legal`, sized by [`for_pool`]), each of configurations not yet in
/// play. The rounds end at the first refinement round that does not improve the [`fastest`]
/// screening time, or when a round has nothing new to screen.
///
/// `screen` gives the screening time of every configuration of a round, one per configuration
/// in order (`None`: no time, e.g. the candidate failed). The rounds see only what they screened
/// themselves, so a campaign that reuses logged times walks the same rounds as the one that
/// measured them. The first error of `screen` ends the rounds and is returned.
pub fn screen_rounds<E>(
    legal: &[GemmConfig],
    pool: &[GemmConfig],
    opts: &RaceOptions,
    mut screen: impl FnMut(Round, &[GemmConfig]) -> Result<Vec<Option<f64>>, E>,
) -> Result<Rounds, E> {
    let opts = &for_pool(opts, pool.len());
    let mut rounds = Rounds::default();
    rounds.add(pool, &screen(Round::Pool, pool)?);
    for n in 1..=opts.refine_rounds {
        let round: Vec<GemmConfig> = refine(legal, &rounds.screened, opts)
            .into_iter()
            .filter(|c| !rounds.in_play.contains(c))
            .collect();
        if round.is_empty() {
            break;
        }
        let before = fastest(&rounds.screened);
        rounds.add(&round, &screen(Round::Refinement(n), &round)?);
        if fastest(&rounds.screened) >= before {
            break;
        }
    }
    Ok(rounds)
}

/// The finalists of a screened key: the `opts.finalists` fastest by screening median (ties by
/// configuration order), then the first anchor (the family default) and every other anchor
/// within [`ANCHOR_FACTOR`] of the fastest, if screened correct and not among them.
pub fn finalists(
    screened: &[(GemmConfig, f64)],
    anchors: &[GemmConfig],
    opts: &RaceOptions,
) -> Vec<GemmConfig> {
    let mut out = carry_out(screened, opts.finalists);
    let fastest = fastest(screened);
    let time = |c: &GemmConfig| {
        screened.iter().find(|s| s.0 == *c && s.1.is_finite() && s.1 > 0.0).map(|s| s.1)
    };
    for (i, a) in anchors.iter().enumerate() {
        if !out.contains(a) && time(a).is_some_and(|t| i == 0 || t <= ANCHOR_FACTOR * fastest) {
            out.push(*a);
        }
    }
    out
}

/// The fastest screening median (infinite when none).
pub fn fastest(screened: &[(GemmConfig, f64)]) -> f64 {
    screened.iter().map(|s| s.1).filter(|t| t.is_finite() && *t > 0.0).fold(f64::INFINITY, f64::min)
}

/// The `n` fastest screened configurations (what the next bucket's pool starts with).
pub fn carry_out(screened: &[(GemmConfig, f64)], n: usize) -> Vec<GemmConfig> {
    let mut ranked: Vec<(GemmConfig, f64)> =
        screened.iter().filter(|(_, t)| t.is_finite() && *t > 0.0).copied().collect();
    ranked.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    ranked.into_iter().take(n).map(|r| r.0).collect()
}

/// The screening estimate the replay takes from a logged full-policy measurement: the median of
/// its first `n` samples (in measurement order), or the recorded median when fewer were kept.
pub fn screen_estimate(samples: &[f64], median: f64, n: usize) -> f64 {
    if samples.len() < n || n == 0 {
        return median;
    }
    let mut s: Vec<f64> = samples[..n].to_vec();
    s.sort_by(f64::total_cmp);
    if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::AType;
    use crate::search::DeviceModel;
    use crate::template::{self, Family, Pipeline};

    fn legal(p: &GemmProblem) -> Vec<GemmConfig> {
        template::search_space(Family::Sm90, AType::Bf16)
            .into_iter()
            .filter(|c| c.check_problem(p).is_ok())
            .collect()
    }

    #[test]
    fn a_key_is_lean_only_after_a_clear_composite_lead_on_the_previous_bucket() {
        assert!(is_lean(Some((512, 30.0)), Some((512, 20.0))));
        assert!(!is_lean(Some((512, 29.0)), Some((512, 20.0))));
        // Measurements of different buckets, or one of them missing, say nothing.
        assert!(!is_lean(Some((512, 90.0)), Some((256, 20.0))));
        assert!(!is_lean(None, Some((512, 20.0))));
        assert!(!is_lean(Some((512, 90.0)), None));
        assert!(!is_lean(Some((512, 90.0)), Some((512, 0.0))));
        // A lean pool is the carried configurations and the anchors, without refinement.
        let model = CostModel::new(DeviceModel::h200());
        let opts = RaceOptions::default();
        let p = GemmProblem::new(4096, 3072, 6144, AType::Bf16);
        let l = legal(&p);
        let seeds = template::measured_seeds(Family::Sm90, AType::Bf16);
        let carry: Vec<GemmConfig> = l.iter().rev().take(opts.carry).copied().collect();
        let lean_opts = lean(&opts);
        let pool_lean = pool(&l, &p, &model, &seeds, &carry, None, &lean_opts);
        assert_eq!(pool_lean.len(), opts.carry + LEAN_ANCHOR_ROOM);
        assert_eq!(&pool_lean[..opts.carry], &carry[..]);
        let legal_seeds: Vec<GemmConfig> =
            seeds.iter().filter(|c| l.contains(c)).copied().collect();
        assert!(legal_seeds.iter().take(LEAN_ANCHOR_ROOM).all(|c| pool_lean.contains(c)));
        assert_eq!((lean_opts.refine_rounds, lean_opts.finalists), (0, 2));
        assert!(pool(&l, &p, &model, &seeds, &carry, None, &opts).len() > pool_lean.len());
    }

    #[test]
    fn pools_are_deterministic_distinct_legal_and_cover_pipelines() {
        let model = CostModel::new(DeviceModel::h200());
        let opts = RaceOptions::default();
        let p = GemmProblem::new(1, 512, 6144, AType::Bf16);
        let l = legal(&p);
        let seeds = template::measured_seeds(Family::Sm90, AType::Bf16);
        let a = pool(&l, &p, &model, &seeds, &[], None, &opts);
        let b = pool(&l, &p, &model, &seeds, &[], None, &opts);
        assert_eq!(a, b);
        assert_eq!(a.iter().collect::<HashSet<_>>().len(), a.len());
        assert!(a.iter().all(|c| c.check_problem(&p).is_ok()));
        assert!(a.len() >= opts.min_pool && a.len() < l.len(), "{} of {}", a.len(), l.len());
        // every pipeline that takes K = 6144 (the K-tail form takes only a K 64 does not divide)
        for pl in Pipeline::ALL.into_iter().filter(|p| *p != Pipeline::KTail) {
            assert!(a.iter().filter(|c| c.pipeline == pl).count() >= 4, "{pl:?}");
        }
        // Carried configurations come first; an illegal one is left out.
        let carry = vec![a[a.len() - 1], GemmConfig { block_m: 4096, ..a[0] }];
        let c = pool(&l, &p, &model, &seeds, &carry, None, &opts);
        // A measured previous bucket that predicts a slow key shrinks the pool.
        let slow = pool(&l, &p, &model, &seeds, &[], Some((1, 5000.0)), &opts);
        assert!(slow.len() < a.len(), "{} vs {}", slow.len(), a.len());
        assert_eq!(expected_us(3.0, Some((2, 10.0)), 4), 20.0);
        assert_eq!(expected_us(30.0, Some((2, 10.0)), 4), 30.0);
        assert_eq!(c[0], a[a.len() - 1]);
        assert!(!c.contains(&carry[1]));
    }

    #[test]
    fn slow_keys_get_smaller_pools() {
        let opts = RaceOptions::default();
        let fast = pool_size(4000, 3.0, 2, &opts);
        let slow = pool_size(4000, 2000.0, 2, &opts);
        assert_eq!(fast, 240);
        assert!(slow < fast / 3 && slow >= opts.min_pool / 2, "{slow}");
        assert_eq!(pool_size(10, 3.0, 2, &opts), 10);
    }

    /// Screening a small kernel walks its whole rotation in every warm-up and sample replay: a
    /// GLM-5 TP8 expert (1.8 MB per copy, 142 copies on a 60 MiB L2) costs several times what a
    /// sample-filling graph would, a kernel whose rotation fits in a sample nothing more, and a
    /// short time budget gets a smaller pool for it.
    #[test]
    fn screening_cost_counts_the_rotation_walk() {
        let l2 = 60u64 << 20;
        let tp8 = GemmProblem::new(1, 512, 6144, AType::Bf16);
        let copies = rotation_of(&tp8, l2);
        assert!((140..=145).contains(&copies), "{copies}");
        let walked = screen_candidate_us(3.5, copies);
        let filled = screen_candidate_us(3.5, 2);
        assert!(walked > 2.5 * filled, "{walked} vs {filled}");
        assert_eq!(screen_candidate_us(100.0, 2), SCREEN_OVERHEAD_US + SCREEN_LAUNCHES * 100.0);
        assert_eq!(screen_candidate_us(1.0, 40), SCREEN_OVERHEAD_US + SCREEN_LAUNCHES * 1.0);
        let tight = RaceOptions { key_seconds: 0.3, ..RaceOptions::default() };
        assert!(pool_size(4000, 3.5, copies, &tight) < pool_size(4000, 3.5, 2, &tight));
        let opts = RaceOptions::default();
        assert!(predicted_key_us(4000, 3.5, copies, &opts) > predicted_key_us(4000, 3.5, 2, &opts));
    }

    #[test]
    fn finalists_are_the_fastest_plus_anchors() {
        let opts = RaceOptions { finalists: 2, ..RaceOptions::default() };
        let base = template::default_config(Family::Sm90, AType::Bf16);
        let cs: Vec<GemmConfig> = (1..=5).map(|s| GemmConfig { split_k: s, ..base }).collect();
        let screened: Vec<(GemmConfig, f64)> =
            vec![(cs[0], 5.0), (cs[1], 2.0), (cs[2], f64::NAN), (cs[3], 3.0), (cs[4], 9.0)];
        assert_eq!(finalists(&screened, &[], &opts), vec![cs[1], cs[3]]);
        // The first anchor always joins; others only near the fastest; one that failed
        // screening never.
        assert_eq!(finalists(&screened, &[cs[4], cs[1], cs[2]], &opts), vec![cs[1], cs[3], cs[4]]);
        assert_eq!(finalists(&screened, &[cs[2], cs[4], cs[0]], &opts), vec![cs[1], cs[3]]);
        let near = vec![(cs[0], 2.4), (cs[1], 2.0), (cs[3], 3.0), (cs[4], 2.1)];
        assert_eq!(
            finalists(&near, &[cs[3], cs[0]], &RaceOptions { finalists: 1, ..opts }),
            vec![cs[1], cs[3], cs[0]]
        );
        assert_eq!(carry_out(&screened, 3), vec![cs[1], cs[3], cs[0]]);
    }

    #[test]
    fn refinement_screens_neighbours_of_the_fastest() {
        let p = GemmProblem::new(16, 6144, 256, AType::Bf16);
        let l = legal(&p);
        let opts = RaceOptions { refine_top: 1, refine_max: 1000, ..RaceOptions::default() };
        let screened = vec![(l[10], 1.0), (l[200], 2.0)];
        let r = refine(&l, &screened, &opts);
        assert!(!r.is_empty() && !r.contains(&l[10]) && !r.contains(&l[200]));
        let grid = Grid::of(&l);
        let near: Vec<GemmConfig> =
            [1, 2].iter().flat_map(|&d| grid.neighbours(10, d)).map(|j| l[j]).collect();
        assert!(r.iter().all(|c| near.contains(c)), "only neighbours of the fastest");
        assert_eq!(r[0], l[grid.neighbours(10, 1)[0]], "one step before two");
        let capped = refine(&l, &screened, &RaceOptions { refine_max: 2, ..opts });
        assert_eq!(capped, r[..2].to_vec());
    }

    /// A scripted screening over `l`: configuration i screens at `time(i)`; every round asked
    /// for is recorded.
    fn scripted(
        l: &[GemmConfig],
        time: impl Fn(usize) -> Option<f64>,
        asked: &mut Vec<(Round, Vec<GemmConfig>)>,
    ) -> Rounds {
        let opts = RaceOptions::default();
        let pool = &l[..40];
        let Ok(rounds) = screen_rounds(l, pool, &opts, |round, configs| {
            asked.push((round, configs.to_vec()));
            let index = |c: &GemmConfig| l.iter().position(|x| x == c).unwrap();
            Ok::<_, std::convert::Infallible>(configs.iter().map(|c| time(index(c))).collect())
        });
        rounds
    }

    #[test]
    fn screening_rounds_refine_while_they_improve_the_fastest() {
        let p = GemmProblem::new(16, 6144, 256, AType::Bf16);
        let l = legal(&p);
        // The fastest is in the pool: one refinement round, which does not improve it, ends them.
        let mut asked = Vec::new();
        let fails = |i: usize| (i % 7 != 3).then_some(1.0 + i as f64);
        let rounds = scripted(&l, fails, &mut asked);
        let kinds: Vec<Round> = asked.iter().map(|a| a.0).collect();
        assert_eq!(kinds, vec![Round::Pool, Round::Refinement(1)]);
        assert_eq!(asked[0].1, l[..40].to_vec());
        assert!(!asked[1].1.is_empty() && asked[1].1.iter().all(|c| !l[..40].contains(c)));
        let in_play: Vec<GemmConfig> = asked.iter().flat_map(|a| a.1.clone()).collect();
        assert_eq!(rounds.in_play, in_play);
        let position = |c: &GemmConfig| l.iter().position(|x| x == c).unwrap();
        let expected: Vec<(GemmConfig, f64)> =
            in_play.iter().filter_map(|c| fails(position(c)).map(|t| (*c, t))).collect();
        assert_eq!(rounds.screened, expected, "in play order, failures left out");
        // Later configurations faster: rounds go on while each improves the fastest, at most
        // `refine_rounds` of them, each of configurations not yet in play.
        let mut asked = Vec::new();
        let rounds = scripted(&l, |i| Some(1.0 / (1.0 + i as f64)), &mut asked);
        let opts = RaceOptions::default();
        assert!(asked.len() > 2 && asked.len() <= 1 + opts.refine_rounds, "{}", asked.len());
        let mut seen: Vec<(GemmConfig, f64)> = Vec::new();
        for (n, (round, configs)) in asked.iter().enumerate() {
            assert_eq!(*round, if n == 0 { Round::Pool } else { Round::Refinement(n) });
            assert!(configs.iter().all(|c| seen.iter().all(|s| s.0 != *c)));
            let before = fastest(&seen);
            seen.extend(configs.iter().map(|c| (*c, 1.0 / (1.0 + position(c) as f64))));
            if n > 0 && n + 1 < asked.len() {
                assert!(fastest(&seen) < before, "round {n} improved");
            }
        }
        assert_eq!(rounds.screened, seen);
    }

    #[test]
    fn screening_rounds_stop_at_the_first_error_and_without_refinement_rounds() {
        let p = GemmProblem::new(16, 6144, 256, AType::Bf16);
        let l = legal(&p);
        let mut asked = Vec::new();
        let opts = RaceOptions { refine_rounds: 0, ..RaceOptions::default() };
        let rounds = screen_rounds(&l, &l[..40], &opts, |round, configs| {
            asked.push(round);
            Ok::<_, ()>(vec![Some(1.0); configs.len()])
        });
        assert_eq!(asked, vec![Round::Pool]);
        assert_eq!(rounds.map(|r| r.in_play), Ok(l[..40].to_vec()));
        let mut asked = Vec::new();
        let failed = screen_rounds(&l, &l[..40], &RaceOptions::default(), |round, configs| {
            asked.push(round);
            match round {
                Round::Pool => Ok(vec![Some(1.0); configs.len()]),
                Round::Refinement(_) => Err("worker lost"),
            }
        });
        assert_eq!(failed, Err("worker lost"));
        assert_eq!(asked, vec![Round::Pool, Round::Refinement(1)]);
    }

    #[test]
    fn screen_estimate_takes_the_first_samples() {
        assert_eq!(screen_estimate(&[5.0, 1.0, 3.0, 100.0, 100.0], 4.0, 3), 3.0);
        assert_eq!(screen_estimate(&[5.0, 1.0, 3.0, 2.0], 4.0, 4), 2.5);
        assert_eq!(screen_estimate(&[5.0], 4.0, 3), 4.0);
    }
}
