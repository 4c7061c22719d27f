//! Tuning policy: which configurations every key measures first (the seeds), how a key's search
//! strategy is driven (its step), and how many candidates one worker request carries.

use super::planner::{Planner, PlannerFactory};
use crate::problem::{AType, GemmProblem};
use crate::search::{Budget, CostModel, DeviceModel, StrategyKind};
use crate::template::{self, Family, GemmConfig};

/// Strategy proposals per batch after the seeds (adaptive strategies want small batches).
pub const STRATEGY_STEP: usize = 16;
/// Candidates per request to the worker (`TuneSpec::batch`).
pub const WORKER_BATCH: usize = 256;

/// Configurations every key measures (where legal) so the geomean default is chosen among
/// configurations timed everywhere: the family defaults, the families' measured seeds
/// (`template::measured_seeds`) and the analytic model's two favourites of every key (ranked with
/// the H200 data sheet: no device has been measured when the seeds are chosen).
pub fn common_configs(dims: &[(u32, u32)], buckets: &[u32], a_type: AType) -> Vec<GemmConfig> {
    let model = CostModel::new(DeviceModel::h200());
    let mut out = Vec::new();
    for family in [Family::Sm90, Family::Sm120] {
        let space = template::search_space(family, a_type);
        if space.is_empty() {
            continue;
        }
        out.push(template::default_config(family, a_type));
        out.extend(template::measured_seeds(family, a_type));
        for &(n, k) in dims {
            for &m in buckets {
                let p = GemmProblem::new(m, n, k, a_type);
                let legal: Vec<GemmConfig> =
                    space.iter().copied().filter(|c| c.check_problem(&p).is_ok()).collect();
                out.extend(model.rank(&legal, &p).into_iter().take(2).map(|(c, _)| c));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// [`common_configs`] of every activation type a campaign tunes (`None`: both).
pub fn seeds(dims: &[(u32, u32)], buckets: &[u32], a_type: Option<AType>) -> Vec<GemmConfig> {
    let mut out = Vec::new();
    for t in [AType::Bf16, AType::Nvfp4] {
        if a_type.is_none_or(|x| x == t) {
            out.extend(common_configs(dims, buckets, t));
        }
    }
    out
}

/// The planner of every key: exhaustive, or the seeds legal for the key followed by `strategy`
/// within `budget` (a fraction of the key's legal configurations), `STRATEGY_STEP` proposals per
/// batch. The model-guided strategy ranks with the cost model of the GPU at hand, built from what
/// the campaign measured on it just now.
pub fn planner_factory(
    strategy: StrategyKind,
    seeds: Vec<GemmConfig>,
    budget: f64,
) -> PlannerFactory {
    Box::new(move |key, legal, info, ctx| -> Planner {
        let p = GemmProblem::new(key.m, key.n, key.k, key.a_type);
        let kind = match &strategy {
            StrategyKind::Exhaustive => return Planner::exhaustive(legal),
            StrategyKind::Model { options, .. } => StrategyKind::Model {
                model: CostModel::new(DeviceModel::from_device_info(
                    info,
                    ctx.bandwidth_gbps,
                    ctx.tensor_peak_tflops,
                    ctx.launch_floor_us,
                )),
                options: *options,
            },
            other => other.clone(),
        };
        let first: Vec<_> =
            seeds.iter().filter(|c| c.family == key.family && legal.contains(c)).copied().collect();
        let s = kind.build(legal, &p, Budget::fraction(budget));
        Planner::new(first, s, STRATEGY_STEP)
    })
}
