//! Keys dealt over GPUs (`tune --gpus`) and over shards (`tune --shard`), balanced by their
//! predicted tuning cost, keeping each weight shape's bucket chain together where possible.
//!
//! Racing warm-starts a bucket from the previous bucket of the same weight shape (its fastest
//! screened configurations and its measured best, `tune::race`), so the keys of one shape in
//! increasing M are a chain best tuned by one GPU. Whole chains go, most expensive first, to the
//! least loaded bin (longest-processing-time-first); when that leaves a bin more than
//! [`CHAIN_SLACK`] over the best possible balance, the chains are laid end to end and cut into
//! `bins` contiguous runs instead (at most `bins - 1` cuts; a run that starts inside a chain
//! starts without the carry, as the first bucket of a shape does). Deterministic in its inputs:
//! every shard of a cluster computes the same partition.

use crate::problem::GemmProblem;
use crate::search::{CostModel, DeviceModel};
use crate::table::TableKey;
use crate::template::GemmConfig;
use crate::tune::race::{self, RaceOptions};

/// The keys of one bin (a GPU or a shard), in the order they were given, and their predicted
/// cost in microseconds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Bin {
    pub keys: Vec<TableKey>,
    pub cost_us: f64,
}

/// The model keys are costed with: the GPU model's data sheet, else the H200's (the ratios
/// between keys are what matter; measured floors are not used, so every shard of a cluster
/// predicts the same costs).
pub fn model_for(device_name: &str) -> CostModel {
    CostModel::new(DeviceModel::data_sheet(device_name).unwrap_or_else(DeviceModel::h200))
}

/// The predicted cost of tuning each key (microseconds, in `keys`' order): racing's pool,
/// refinement and finals (`race::predicted_key_us`), or without racing every legal
/// configuration screened once (planners spend a fixed fraction of the legal configurations).
pub fn key_costs(
    keys: &[TableKey],
    space: &[GemmConfig],
    model: &CostModel,
    race: Option<&RaceOptions>,
) -> Vec<f64> {
    keys.iter()
        .map(|k| {
            let p = GemmProblem::new(k.m, k.n, k.k, k.a_type);
            let legal: Vec<GemmConfig> =
                space.iter().copied().filter(|c| c.check_problem(&p).is_ok()).collect();
            let best = legal.iter().map(|c| model.estimate(c, &p).us).fold(f64::INFINITY, f64::min);
            let best = if best.is_finite() { best } else { 0.0 };
            let copies = race::rotation_of(&p, model.device.l2_bytes);
            match race {
                Some(opts) => race::predicted_key_us(legal.len(), best, copies, opts),
                None => legal.len() as f64 * race::screen_candidate_us(best, copies),
            }
        })
        .collect()
}

/// The chain a key belongs to: its operation and weight shape.
fn chain_of(k: &TableKey) -> (String, crate::template::Family, crate::problem::AType, u32, u32) {
    (k.op.clone(), k.family, k.a_type, k.n, k.k)
}

/// How much more a bin may cost than the best contiguous split for whole chains to be kept.
pub const CHAIN_SLACK: f64 = 1.1;

/// The smallest bound on a segment's sum for which `x`, split greedily into contiguous segments
/// of at most that sum, needs at most `bins` segments (bisection; deterministic).
fn min_max_segment(x: &[f64], bins: usize) -> f64 {
    let segments = |t: f64| {
        let (mut n, mut acc) = (1usize, 0.0);
        for &v in x {
            if acc > 0.0 && acc + v > t * (1.0 + 1e-9) {
                n += 1;
                acc = 0.0;
            }
            acc += v;
        }
        n
    };
    let (mut lo, mut hi) = (x.iter().copied().fold(0.0, f64::max), x.iter().sum::<f64>());
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if segments(mid) <= bins {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// Deal `keys` (with `costs`, same order) into `bins` bins, balanced by cost, chains together
/// where that stays within [`CHAIN_SLACK`] of the best balance. Every key lands in exactly one bin; each bin keeps `keys`'
/// order. Deterministic.
pub fn distribute(keys: &[TableKey], costs: &[f64], bins: usize) -> Vec<Bin> {
    assert_eq!(keys.len(), costs.len(), "one cost per key");
    let bins = bins.max(1);
    let cost = |i: usize| if costs[i].is_finite() { costs[i].max(0.0) } else { 0.0 };
    // Chains: indices of one shape's keys, in increasing M.
    let mut chains: Vec<Vec<usize>> = Vec::new();
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| {
        chain_of(&keys[a]).cmp(&chain_of(&keys[b])).then(keys[a].m.cmp(&keys[b].m)).then(a.cmp(&b))
    });
    for i in order {
        match chains.last_mut() {
            Some(c) if chain_of(&keys[c[0]]) == chain_of(&keys[i]) => c.push(i),
            _ => chains.push(vec![i]),
        }
    }
    // Whole chains, most expensive first (ties: the chain's first key), each to the least
    // loaded bin (ties: the lowest bin).
    let chain_cost = |c: &Vec<usize>| c.iter().map(|&i| cost(i)).sum::<f64>();
    let mut whole: Vec<&Vec<usize>> = chains.iter().collect();
    whole.sort_by(|a, b| chain_cost(b).total_cmp(&chain_cost(a)).then(keys[a[0]].cmp(&keys[b[0]])));
    let mut load = vec![0.0f64; bins];
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); bins];
    for c in whole {
        let b = (0..bins).min_by(|&x, &y| load[x].total_cmp(&load[y]).then(x.cmp(&y))).unwrap_or(0);
        load[b] += chain_cost(c);
        members[b].extend(c.iter().copied());
    }
    // The best split of the chains laid end to end into `bins` contiguous runs: at most
    // `bins - 1` cuts, no bin over the smallest possible maximum. Taken when whole chains
    // would leave a bin more than `CHAIN_SLACK` over it.
    let seq: Vec<usize> = chains.concat();
    let bound = min_max_segment(&seq.iter().map(|&i| cost(i)).collect::<Vec<_>>(), bins);
    let worst = load.iter().copied().fold(0.0, f64::max);
    if worst > bound * CHAIN_SLACK {
        load = vec![0.0; bins];
        members = vec![Vec::new(); bins];
        let mut b = 0;
        for i in seq {
            if b + 1 < bins && !members[b].is_empty() && load[b] + cost(i) > bound * (1.0 + 1e-9) {
                b += 1;
            }
            load[b] += cost(i);
            members[b].push(i);
        }
    }
    members
        .into_iter()
        .zip(load)
        .map(|(mut m, cost_us)| {
            m.sort_unstable();
            Bin { keys: m.into_iter().map(|i| keys[i].clone()).collect(), cost_us }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::AType;
    use crate::template::{self, Family};

    fn keys(shapes: &[(u32, u32)], buckets: &[u32]) -> Vec<TableKey> {
        let mut v = Vec::new();
        for &(n, k) in shapes {
            for &m in buckets {
                v.push(TableKey::gemm(Family::Sm90, AType::Bf16, n, k, m));
            }
        }
        v.sort();
        v
    }

    const GLM5: &[(u32, u32)] = &[(512, 6144), (6144, 256), (6144, 2048), (4096, 6144)];
    const BUCKETS: &[u32] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];

    fn costs(keys: &[TableKey]) -> Vec<f64> {
        let space = template::search_space(Family::Sm90, AType::Bf16);
        key_costs(keys, &space, &model_for("NVIDIA H200"), Some(&RaceOptions::default()))
    }

    fn shape_runs(bin: &Bin) -> usize {
        let mut shapes: Vec<(u32, u32)> = bin.keys.iter().map(|k| (k.n, k.k)).collect();
        shapes.dedup();
        shapes.len()
    }

    #[test]
    fn every_key_lands_in_exactly_one_bin() {
        let ks = keys(GLM5, BUCKETS);
        let cs = costs(&ks);
        for bins in 1..=9 {
            let d = distribute(&ks, &cs, bins);
            assert_eq!(d.len(), bins);
            let mut all: Vec<TableKey> = d.iter().flat_map(|b| b.keys.clone()).collect();
            all.sort();
            assert_eq!(all, ks, "{bins} bins");
            let total: f64 = cs.iter().sum();
            let sum: f64 = d.iter().map(|b| b.cost_us).sum();
            assert!((sum - total).abs() < 1e-6 * total);
        }
    }

    /// Costs differ between keys (large M costs more per candidate, fewer candidates fit the
    /// screening budget), and the bins are balanced by cost, not by key count.
    #[test]
    fn bins_are_balanced_by_predicted_cost() {
        let ks = keys(GLM5, BUCKETS);
        let cs = costs(&ks);
        let min = cs.iter().copied().fold(f64::INFINITY, f64::min);
        let max = cs.iter().copied().fold(0.0, f64::max);
        assert!(max > 1.5 * min, "keys differ in predicted cost: {min} .. {max}");
        for bins in [2, 3, 4, 8] {
            let d = distribute(&ks, &cs, bins);
            let share = cs.iter().sum::<f64>() / bins as f64;
            let worst = d.iter().map(|b| b.cost_us).fold(0.0, f64::max);
            // Within the slack of a share plus one key (a key is never cut).
            assert!(worst <= CHAIN_SLACK * (share + max), "{bins} bins: {worst} vs share {share}");
        }
        // A cost-blind deal would put half the keys in each of two bins; with one key 10x the
        // others the balanced deal does not.
        let mut skewed = vec![1.0; 8];
        skewed[7] = 10.0;
        let small = keys(&[(512, 6144)], &[1, 2, 4, 8, 16, 32, 64, 128]);
        let d = distribute(&small, &skewed, 2);
        let counts: Vec<usize> = d.iter().map(|b| b.keys.len()).collect();
        assert_eq!(counts.iter().sum::<usize>(), 8);
        assert!(counts.contains(&1) || counts.contains(&2), "{counts:?}");
        assert!((d[0].cost_us - d[1].cost_us).abs() <= 3.0, "{d:?}");
        // Two chains of 8 and 2: whole chains would be 8 against 2, so the long one is cut.
        let two = keys(&[(512, 6144), (6144, 256)], &[1, 2, 4, 8, 16, 32, 64, 128]);
        let mut c = vec![1.0; 16];
        c[8..].iter_mut().for_each(|x| *x = 0.25);
        let d = distribute(&two, &c, 2);
        assert_eq!(d.iter().map(|b| b.cost_us).fold(0.0, f64::max), 5.0, "{d:?}");
    }

    #[test]
    fn chains_stay_together_where_they_fit() {
        let ks = keys(GLM5, BUCKETS);
        let cs = costs(&ks);
        // Four shapes on two or four GPUs: whole chains.
        for bins in [1, 2, 4] {
            let d = distribute(&ks, &cs, bins);
            let runs: usize = d.iter().map(shape_runs).sum();
            assert!(runs < 4 + bins, "{bins} bins: {runs} chain pieces");
        }
        let d = distribute(&ks, &cs, 2);
        for shape in GLM5 {
            let holders = d.iter().filter(|b| b.keys.iter().any(|k| (k.n, k.k) == *shape)).count();
            assert_eq!(holders, 1, "{shape:?} split over {holders} bins on 2 GPUs");
        }
        // Eight bins and four shapes: chains are cut, into contiguous runs of buckets.
        let d = distribute(&ks, &cs, 8);
        for b in &d {
            for shape in GLM5 {
                let ms: Vec<u32> =
                    b.keys.iter().filter(|k| (k.n, k.k) == *shape).map(|k| k.m).collect();
                if let (Some(lo), Some(hi)) = (ms.first(), ms.last()) {
                    let expected: Vec<u32> =
                        BUCKETS.iter().copied().filter(|m| m >= lo && m <= hi).collect();
                    assert_eq!(ms, expected, "{shape:?}: a run of consecutive buckets");
                }
            }
        }
    }

    #[test]
    fn deterministic_and_in_input_order() {
        let mut ks = keys(GLM5, BUCKETS);
        ks.sort_by(|a, b| a.m.cmp(&b.m).then(a.cmp(b)));
        let cs = costs(&ks);
        let a = distribute(&ks, &cs, 3);
        let b = distribute(&ks, &cs, 3);
        assert_eq!(a, b);
        for bin in &a {
            let pos: Vec<usize> =
                bin.keys.iter().map(|k| ks.iter().position(|x| x == k).unwrap()).collect();
            assert!(pos.windows(2).all(|w| w[0] < w[1]), "kept in the given order");
        }
        // More bins than keys: some bins are empty, none is lost.
        let few = keys(&[(512, 6144)], &[1, 2]);
        let d = distribute(&few, &[1.0, 1.0], 4);
        assert_eq!(d.iter().map(|b| b.keys.len()).sum::<usize>(), 2);
        assert_eq!(d.iter().filter(|b| b.keys.is_empty()).count(), 2);
    }
}
