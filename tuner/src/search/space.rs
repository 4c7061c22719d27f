//! Search spaces as data: named parameters with value lists, a default configuration and typed
//! constraints; enumeration, counting and pruning reports before anything is compiled.

use super::SearchError;
use crate::problem::{AType, GemmProblem};
use crate::template::{self, Family, GemmConfig, Pipeline};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::sync::OnceLock;

/// One tunable parameter of [`GemmConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Param {
    BlockM,
    BlockN,
    BlockK,
    WarpsM,
    WarpsN,
    WarpsK,
    Stages,
    SplitK,
    /// 0 = false, 1 = true.
    SwapAb,
    /// The index in [`crate::template::Pipeline::ALL`] (0 = cp.async stages, 1 = register ring,
    /// 2 = warp ring, 3 = global, 4 = the cp.async K-tail form).
    Pipeline,
    /// CTAs per SM the kernel is compiled for.
    MinCtas,
}

impl Param {
    /// Every parameter, in the order of [`SearchSpace::params`] and of enumeration (last fastest).
    pub const ALL: [Param; 11] = [
        Param::Pipeline,
        Param::SwapAb,
        Param::BlockM,
        Param::BlockN,
        Param::BlockK,
        Param::WarpsM,
        Param::WarpsN,
        Param::WarpsK,
        Param::Stages,
        Param::SplitK,
        Param::MinCtas,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Param::BlockM => "block_m",
            Param::BlockN => "block_n",
            Param::BlockK => "block_k",
            Param::WarpsM => "warps_m",
            Param::WarpsN => "warps_n",
            Param::WarpsK => "warps_k",
            Param::Stages => "stages",
            Param::SplitK => "split_k",
            Param::SwapAb => "swap_ab",
            Param::Pipeline => "pipeline",
            Param::MinCtas => "min_ctas",
        }
    }

    /// The parameter's value in a configuration (`swap_ab` as 0/1).
    pub fn get(self, c: &GemmConfig) -> u32 {
        match self {
            Param::BlockM => c.block_m,
            Param::BlockN => c.block_n,
            Param::BlockK => c.block_k,
            Param::WarpsM => c.warps_m,
            Param::WarpsN => c.warps_n,
            Param::WarpsK => c.warps_k,
            Param::Stages => c.stages,
            Param::SplitK => c.split_k,
            Param::SwapAb => c.swap_ab as u32,
            Param::Pipeline => {
                Pipeline::ALL.iter().position(|&p| p == c.pipeline).unwrap_or(0) as u32
            }
            Param::MinCtas => c.min_ctas,
        }
    }

    pub fn set(self, c: &mut GemmConfig, v: u32) {
        match self {
            Param::BlockM => c.block_m = v,
            Param::BlockN => c.block_n = v,
            Param::BlockK => c.block_k = v,
            Param::WarpsM => c.warps_m = v,
            Param::WarpsN => c.warps_n = v,
            Param::WarpsK => c.warps_k = v,
            Param::Stages => c.stages = v,
            Param::SplitK => c.split_k = v,
            Param::SwapAb => c.swap_ab = v != 0,
            Param::Pipeline => {
                c.pipeline = Pipeline::ALL.get(v as usize).copied().unwrap_or(Pipeline::CpAsync)
            }
            Param::MinCtas => c.min_ctas = v,
        }
    }
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A parameter and its admissible values (ascending, unique).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamValues {
    pub param: Param,
    pub values: Vec<u32>,
}

/// A predicate over a configuration (and the problem, for problem-level constraints).
pub type ConstraintFn = fn(&GemmConfig, Option<&GemmProblem>) -> Result<(), String>;

/// A typed constraint with a name (reported in pruning reports) and a message saying what it
/// requires. Constraints that need the problem are skipped when pruning without one.
#[derive(Debug, Clone)]
pub enum Constraint {
    /// The family's `GemmConfig::check` (tile divisibility, threads, shared memory).
    FamilyCheck,
    /// Membership in the family's published search space (`template::search_space`), which prunes
    /// the cross product of the value lists further by the family's own rules. Admits everything
    /// in a space made with [`SearchSpace::new`] (it has no member list).
    FamilySpace,
    /// The family's `GemmConfig::check_problem` (divisibility of the problem, grid limits).
    FamilyProblem,
    /// At most this many threads per CTA.
    ThreadsAtMost(u32),
    /// Warps must split the tile evenly: block_m % warps_m, block_n % warps_n, block_k % warps_k.
    WarpsDivideTile,
    /// Heuristic: no token tile larger than M rounded up to a power of two (or the smallest
    /// block_m of the space): a bigger one covers the same rows with more padding.
    TileCoversM,
    /// Heuristic: every split of K keeps at least this many K elements.
    MinKPerSplit(u32),
    /// Heuristic: split-K only when the grid without it fills fewer than `waves` waves of
    /// `sm_count` CTAs (with more output tiles the split only adds reduction traffic).
    SplitKOnlyForSmallGrids { sm_count: u32, waves: f64 },
    /// Any other rule.
    Custom { name: &'static str, message: &'static str, needs_problem: bool, test: ConstraintFn },
}

impl Constraint {
    pub fn name(&self) -> &str {
        match self {
            Constraint::FamilyCheck => "family_check",
            Constraint::FamilySpace => "family_space",
            Constraint::FamilyProblem => "family_problem",
            Constraint::ThreadsAtMost(_) => "threads_at_most",
            Constraint::WarpsDivideTile => "warps_divide_tile",
            Constraint::TileCoversM => "tile_covers_m",
            Constraint::MinKPerSplit(_) => "min_k_per_split",
            Constraint::SplitKOnlyForSmallGrids { .. } => "split_k_only_for_small_grids",
            Constraint::Custom { name, .. } => name,
        }
    }

    /// What the constraint requires, in words.
    pub fn message(&self) -> String {
        match self {
            Constraint::FamilyCheck => "the family's configuration check passes".into(),
            Constraint::FamilySpace => "the family's search space lists the configuration".into(),
            Constraint::FamilyProblem => "the family's problem check passes".into(),
            Constraint::ThreadsAtMost(n) => format!("at most {n} threads per CTA"),
            Constraint::WarpsDivideTile => "warps split block_m, block_n and block_k evenly".into(),
            Constraint::TileCoversM => {
                "block_m at most max(next power of two of M, smallest block_m)".into()
            }
            Constraint::MinKPerSplit(k) => format!("at least {k} K elements per split"),
            Constraint::SplitKOnlyForSmallGrids { sm_count, waves } => {
                format!("split_k > 1 only when output tiles < {waves} x {sm_count}")
            }
            Constraint::Custom { message, .. } => (*message).into(),
        }
    }

    pub fn needs_problem(&self) -> bool {
        match self {
            Constraint::FamilyCheck
            | Constraint::FamilySpace
            | Constraint::ThreadsAtMost(_)
            | Constraint::WarpsDivideTile => false,
            Constraint::FamilyProblem
            | Constraint::TileCoversM
            | Constraint::MinKPerSplit(_)
            | Constraint::SplitKOnlyForSmallGrids { .. } => true,
            Constraint::Custom { needs_problem, .. } => *needs_problem,
        }
    }

    /// `Err(reason)` when the constraint rejects `c`. Problem-level constraints admit every
    /// configuration when `p` is `None`.
    fn admits(
        &self,
        space: &SearchSpace,
        c: &GemmConfig,
        p: Option<&GemmProblem>,
    ) -> Result<(), String> {
        let need = |b: bool, why: String| if b { Ok(()) } else { Err(why) };
        match (self, p) {
            (Constraint::FamilyCheck, _) => c.check().map_err(|e| e.reason),
            (Constraint::FamilySpace, _) => match &space.members {
                Some(m) => need(m.contains(c), "not in the family's search space".into()),
                None => Ok(()),
            },
            (Constraint::ThreadsAtMost(n), _) => {
                need(c.threads() <= *n, format!("{} threads > {n}", c.threads()))
            }
            (Constraint::WarpsDivideTile, _) => need(
                c.warps_m > 0
                    && c.warps_n > 0
                    && c.warps_k > 0
                    && c.block_m % c.warps_m == 0
                    && c.block_n % c.warps_n == 0
                    && c.block_k % c.warps_k == 0,
                "warps do not divide the tile".into(),
            ),
            (Constraint::Custom { needs_problem: false, test, .. }, _) => test(c, p),
            (_, None) => Ok(()),
            (Constraint::FamilyProblem, Some(p)) => c.check_problem(p).map_err(|e| e.reason),
            (Constraint::TileCoversM, Some(p)) => {
                let smallest = space.values(Param::BlockM).first().copied().unwrap_or(1);
                let cap = p.m.next_power_of_two().max(smallest);
                need(c.block_m <= cap, format!("block_m {} > {cap} for M = {}", c.block_m, p.m))
            }
            (Constraint::MinKPerSplit(k), Some(p)) => {
                let per = p.k / c.split_k.max(1);
                need(per >= *k, format!("K / split_k = {per} < {k}"))
            }
            (Constraint::SplitKOnlyForSmallGrids { sm_count, waves }, Some(p)) => {
                let tiles =
                    p.n.div_ceil(c.block_n.max(1)) as f64 * p.m.div_ceil(c.block_m.max(1)) as f64;
                need(
                    c.split_k <= 1 || tiles < waves * *sm_count as f64,
                    format!("split_k {} with {tiles} output tiles", c.split_k),
                )
            }
            (Constraint::Custom { test, .. }, Some(p)) => test(c, Some(p)),
        }
    }
}

/// Why a configuration is not in a space, naming the first constraint that rejects it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{config}: constraint {constraint}: {reason}")]
pub struct Violation {
    pub config: String,
    pub constraint: String,
    pub reason: String,
}

/// How many configurations each constraint removed, in the order the constraints are applied
/// (each configuration is counted against the first constraint that rejects it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PruneReport {
    pub family: Family,
    pub a_type: AType,
    pub problem: Option<GemmProblem>,
    /// Size of the cross product of the value lists.
    pub raw: u64,
    pub removed: Vec<Removal>,
    pub remaining: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Removal {
    pub constraint: String,
    pub message: String,
    pub removed: u64,
    /// One rejected configuration and the reason, for the reader.
    pub example: Option<String>,
}

impl PruneReport {
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let what = match &self.problem {
            Some(p) => format!("{} {} on {p}", self.family, self.a_type),
            None => format!("{} {}", self.family, self.a_type),
        };
        let _ = writeln!(s, "Search space {what}: {} raw, {} remain\n", self.raw, self.remaining);
        let _ = writeln!(s, "| constraint | requires | removed | example |\n|---|---|---|---|");
        for r in &self.removed {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                r.constraint,
                r.message,
                r.removed,
                r.example.as_deref().unwrap_or("")
            );
        }
        s
    }
}

#[derive(Debug, Clone)]
struct Enumerated {
    configs: Vec<GemmConfig>,
    /// Per constraint (same order as `constraints`): configs removed, first example.
    removed: Vec<(u64, Option<String>)>,
    raw: u64,
}

/// A family's search space for one activation type.
#[derive(Debug, Clone)]
pub struct SearchSpace {
    family: Family,
    a_type: AType,
    params: Vec<ParamValues>,
    default: GemmConfig,
    constraints: Vec<Constraint>,
    members: Option<HashSet<GemmConfig>>,
    cache: OnceLock<Enumerated>,
}

impl SearchSpace {
    /// A space from explicit value lists (one entry per [`Param`], any order) and a default.
    /// Constraints start as `[FamilyCheck, FamilyProblem]`.
    pub fn new(
        family: Family,
        a_type: AType,
        params: Vec<ParamValues>,
        default: GemmConfig,
    ) -> Result<Self, SearchError> {
        let mut ordered = Vec::with_capacity(Param::ALL.len());
        for param in Param::ALL {
            let mut found = params.iter().filter(|p| p.param == param);
            let pv = found.next().ok_or(SearchError::MissingParam(param.name()))?;
            if found.next().is_some() {
                return Err(SearchError::DuplicateParam(param.name()));
            }
            let values: Vec<u32> =
                pv.values.iter().copied().collect::<BTreeSet<_>>().into_iter().collect();
            if values.is_empty() {
                return Err(SearchError::EmptyParam(param.name()));
            }
            ordered.push(ParamValues { param, values });
        }
        Ok(Self {
            family,
            a_type,
            params: ordered,
            default: GemmConfig { family, a_type, ..default },
            constraints: vec![Constraint::FamilyCheck, Constraint::FamilyProblem],
            members: None,
            cache: OnceLock::new(),
        })
    }

    /// The value lists of a set of configurations (each parameter: the union of its values).
    pub fn value_lists(configs: &[GemmConfig]) -> Vec<ParamValues> {
        Param::ALL
            .iter()
            .map(|&param| ParamValues {
                param,
                values: configs
                    .iter()
                    .map(|c| param.get(c))
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
            })
            .collect()
    }

    /// A space whose value lists are those of `configs` and that admits exactly `configs`
    /// (through [`Constraint::FamilySpace`]) among the configurations passing the family check.
    pub fn from_configs(
        family: Family,
        a_type: AType,
        configs: &[GemmConfig],
        default: GemmConfig,
    ) -> Result<Self, SearchError> {
        if configs.is_empty() {
            return Err(SearchError::EmptySpace { family, a_type });
        }
        let mut s = Self::new(family, a_type, Self::value_lists(configs), default)?;
        s.members = Some(configs.iter().map(|c| GemmConfig { family, a_type, ..*c }).collect());
        s.constraints =
            vec![Constraint::FamilyCheck, Constraint::FamilySpace, Constraint::FamilyProblem];
        Ok(s)
    }

    /// The family's space: value lists derived from `template::search_space`, the family's
    /// default, and constraints `[FamilyCheck, FamilySpace, FamilyProblem]`.
    pub fn for_family(family: Family, a_type: AType) -> Result<Self, SearchError> {
        let configs = template::search_space(family, a_type);
        Self::from_configs(family, a_type, &configs, template::default_config(family, a_type))
    }

    /// Append a constraint (applied after the existing ones).
    pub fn with_constraint(mut self, c: Constraint) -> Self {
        self.constraints.push(c);
        self.cache = OnceLock::new();
        self
    }

    /// Append the heuristic pruning constraints (`TileCoversM`, `MinKPerSplit(64)`,
    /// `SplitKOnlyForSmallGrids` for a device of `sm_count` SMs and 2 waves). They may remove the
    /// optimum in rare cases; the family's own constraints never do.
    pub fn with_heuristics(self, sm_count: u32) -> Self {
        self.with_constraint(Constraint::TileCoversM)
            .with_constraint(Constraint::MinKPerSplit(64))
            .with_constraint(Constraint::SplitKOnlyForSmallGrids { sm_count, waves: 2.0 })
    }

    pub fn family(&self) -> Family {
        self.family
    }
    pub fn a_type(&self) -> AType {
        self.a_type
    }
    pub fn params(&self) -> &[ParamValues] {
        &self.params
    }
    pub fn constraints(&self) -> &[Constraint] {
        &self.constraints
    }
    pub fn default_config(&self) -> GemmConfig {
        self.default
    }

    /// The value list of one parameter.
    pub fn values(&self, param: Param) -> &[u32] {
        let i = Param::ALL.iter().position(|&p| p == param).unwrap_or(0);
        &self.params[i].values
    }

    /// Size of the cross product of the value lists.
    pub fn raw_count(&self) -> u64 {
        self.params.iter().map(|p| p.values.len() as u64).product()
    }

    /// Number of configurations that pass every configuration-level constraint.
    pub fn count(&self) -> usize {
        self.enumerated().configs.len()
    }

    /// Every configuration that passes every configuration-level constraint, in odometer order
    /// of [`Param::ALL`] (last parameter fastest).
    pub fn enumerate(&self) -> &[GemmConfig] {
        &self.enumerated().configs
    }

    /// The configurations that can run `p` (every constraint).
    pub fn legal_for(&self, p: &GemmProblem) -> Vec<GemmConfig> {
        self.enumerate().iter().filter(|c| self.check(c, Some(p)).is_ok()).copied().collect()
    }

    /// Whether `c` is in the space (and runs `p`, when given); names the first failing constraint.
    pub fn check(&self, c: &GemmConfig, p: Option<&GemmProblem>) -> Result<(), Violation> {
        if c.family != self.family || c.a_type != self.a_type {
            return Err(Violation {
                config: c.name(),
                constraint: "space".into(),
                reason: format!("space is {} {}", self.family, self.a_type),
            });
        }
        for (param, pv) in Param::ALL.iter().zip(&self.params) {
            if !pv.values.contains(&param.get(c)) {
                return Err(Violation {
                    config: c.name(),
                    constraint: "value_lists".into(),
                    reason: format!("{} = {} is not in {:?}", param, param.get(c), pv.values),
                });
            }
        }
        for k in &self.constraints {
            k.admits(self, c, p).map_err(|reason| Violation {
                config: c.name(),
                constraint: k.name().into(),
                reason,
            })?;
        }
        Ok(())
    }

    /// How many configurations each constraint removes, with or without a problem.
    pub fn prune_report(&self, p: Option<&GemmProblem>) -> PruneReport {
        let e = self.enumerated();
        let mut removed: Vec<(u64, Option<String>)> = e.removed.clone();
        let mut remaining = e.configs.len() as u64;
        if let Some(p) = p {
            for c in &e.configs {
                for (i, k) in self.constraints.iter().enumerate() {
                    if !k.needs_problem() {
                        continue;
                    }
                    if let Err(reason) = k.admits(self, c, Some(p)) {
                        removed[i].0 += 1;
                        removed[i].1.get_or_insert_with(|| format!("{}: {reason}", c.name()));
                        remaining -= 1;
                        break;
                    }
                }
            }
        }
        PruneReport {
            family: self.family,
            a_type: self.a_type,
            problem: p.copied(),
            raw: e.raw,
            removed: self
                .constraints
                .iter()
                .zip(removed)
                .map(|(k, (n, example))| Removal {
                    constraint: k.name().into(),
                    message: k.message(),
                    removed: n,
                    example,
                })
                .collect(),
            remaining,
        }
    }

    fn enumerated(&self) -> &Enumerated {
        self.cache.get_or_init(|| {
            let mut removed = vec![(0u64, None); self.constraints.len()];
            let mut configs = Vec::new();
            let mut idx = vec![0usize; self.params.len()];
            let raw = self.raw_count();
            for _ in 0..raw {
                let mut c = self.default;
                for (pv, &i) in self.params.iter().zip(&idx) {
                    pv.param.set(&mut c, pv.values[i]);
                }
                let mut ok = true;
                for (slot, k) in removed.iter_mut().zip(&self.constraints) {
                    if k.needs_problem() {
                        continue;
                    }
                    if let Err(reason) = k.admits(self, &c, None) {
                        slot.0 += 1;
                        slot.1.get_or_insert_with(|| format!("{}: {reason}", c.name()));
                        ok = false;
                        break;
                    }
                }
                if ok {
                    configs.push(c);
                }
                // Odometer step, last parameter fastest.
                for d in (0..idx.len()).rev() {
                    idx[d] += 1;
                    if idx[d] < self.params[d].values.len() {
                        break;
                    }
                    idx[d] = 0;
                }
            }
            Enumerated { configs, removed, raw }
        })
    }
}

/// Value indices of one configuration, one per parameter of [`Param::ALL`].
type Coords = [u8; Param::ALL.len()];

/// Positions of configurations in the value lists of a space, for neighbourhoods: two
/// configurations are neighbours at distance d when their value indices differ by d in total
/// (one parameter one step apart is distance 1).
#[derive(Debug, Clone)]
pub struct Grid {
    params: Vec<ParamValues>,
    index: HashMap<Coords, usize>,
    coords: Vec<Coords>,
}

impl Grid {
    /// A grid over `configs` with the value lists of `configs` themselves.
    pub fn of(configs: &[GemmConfig]) -> Self {
        let params = SearchSpace::value_lists(configs);
        let coords: Vec<Coords> = configs
            .iter()
            .map(|c| {
                let mut x: Coords = [0u8; Param::ALL.len()];
                for (slot, pv) in x.iter_mut().zip(&params) {
                    let v = pv.param.get(c);
                    *slot = pv.values.iter().position(|&w| w == v).unwrap_or(0) as u8;
                }
                x
            })
            .collect();
        let index = coords.iter().enumerate().map(|(i, x)| (*x, i)).collect();
        Self { params, index, coords }
    }

    /// Indices (into the configs the grid was built from) of the configurations at index
    /// distance exactly `d` (1 or 2) from configuration `i`.
    pub fn neighbours(&self, i: usize, d: u32) -> Vec<usize> {
        let Some(x) = self.coords.get(i) else { return Vec::new() };
        let mut out = Vec::new();
        let lens: Vec<i32> = self.params.iter().map(|p| p.values.len() as i32).collect();
        let step = |x: &Coords, a: usize, da: i32| -> Option<Coords> {
            let v = x[a] as i32 + da;
            (0..lens[a]).contains(&v).then(|| {
                let mut y = *x;
                y[a] = v as u8;
                y
            })
        };
        let push = |y: Option<Coords>, out: &mut Vec<usize>| {
            if let Some(j) = y.and_then(|y| self.index.get(&y)) {
                if !out.contains(j) {
                    out.push(*j);
                }
            }
        };
        for a in 0..Param::ALL.len() {
            for da in [-1, 1] {
                match d {
                    1 => push(step(x, a, da), &mut out),
                    2 => {
                        push(step(x, a, 2 * da), &mut out);
                        for b in a + 1..9 {
                            for db in [-1, 1] {
                                push(step(x, a, da).and_then(|y| step(&y, b, db)), &mut out);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// m16n64k128, 4 warps along N, 4 stages, swap-AB.
    pub(crate) fn base(a_type: AType) -> GemmConfig {
        crate::template::sm90::representative_configs(a_type)[0]
    }

    fn pv(param: Param, values: &[u32]) -> ParamValues {
        ParamValues { param, values: values.to_vec() }
    }

    /// A space independent of the families' own rules: generic constraints only.
    pub(crate) fn toy_space() -> SearchSpace {
        let params = vec![
            pv(Param::BlockM, &[8, 16, 32, 64, 128]),
            pv(Param::BlockN, &[16, 32, 64, 128]),
            pv(Param::BlockK, &[64, 128, 256]),
            pv(Param::WarpsM, &[1, 2]),
            pv(Param::WarpsN, &[1, 2, 4]),
            pv(Param::WarpsK, &[1, 2]),
            pv(Param::Stages, &[2, 4]),
            pv(Param::SplitK, &[1, 2, 4, 8]),
            pv(Param::SwapAb, &[0, 1]),
            pv(Param::Pipeline, &[0]),
            pv(Param::MinCtas, &[1]),
        ];
        let mut s = SearchSpace::new(Family::Sm90, AType::Bf16, params, base(AType::Bf16)).unwrap();
        s.constraints = vec![
            Constraint::ThreadsAtMost(256),
            Constraint::WarpsDivideTile,
            Constraint::Custom {
                name: "k_divides",
                message: "block_k divides K",
                needs_problem: true,
                test: |c, p| match p {
                    Some(p) if p.k % c.block_k != 0 => Err("K % block_k != 0".into()),
                    _ => Ok(()),
                },
            },
        ];
        s
    }

    #[test]
    fn counts_and_pruning_report_add_up() {
        let s = toy_space();
        assert_eq!(s.raw_count(), 5 * 4 * 3 * 2 * 3 * 2 * 2 * 4 * 2);
        // Threads = 32 * wm * wn * wk <= 256 removes only wm=2, wn=4, wk=2 (512 threads):
        // 1/12 of the warp combinations. Warps always divide these tiles.
        let r = s.prune_report(None);
        assert_eq!(r.removed[0].removed, s.raw_count() / 12);
        assert_eq!(r.removed[1].removed, 0);
        assert_eq!(r.remaining, s.count() as u64);
        assert_eq!(s.count() as u64, s.raw_count() - s.raw_count() / 12);
        assert!(s.enumerate().iter().all(|c| c.threads() <= 256));
        // With a problem, K = 192 keeps only block_k = 64.
        let p = GemmProblem::new(4, 512, 192, AType::Bf16);
        let r = s.prune_report(Some(&p));
        assert_eq!(r.removed[2].removed, s.count() as u64 * 2 / 3);
        assert_eq!(r.remaining, s.legal_for(&p).len() as u64);
        assert!(s.legal_for(&p).iter().all(|c| c.block_k == 64));
        let md = r.to_markdown();
        assert!(md.contains("| k_divides |") && md.contains("threads_at_most"), "{md}");
    }

    #[test]
    fn heuristics_prune_and_name_the_constraint() {
        let s = toy_space().with_heuristics(132);
        let p = GemmProblem::new(4, 512, 6144, AType::Bf16);
        let legal = s.legal_for(&p);
        assert!(legal.iter().all(|c| c.block_m <= 8), "M = 4 keeps the smallest token tile only");
        let mut big = base(AType::Bf16);
        big.block_m = 64;
        let v = s.check(&big, Some(&p)).unwrap_err();
        assert_eq!(v.constraint, "tile_covers_m");
        // Without the problem the configuration is in the space.
        assert!(s.check(&big, None).is_ok());
        let r = s.prune_report(Some(&p));
        let tile = r.removed.iter().find(|r| r.constraint == "tile_covers_m").unwrap();
        assert!(tile.removed > 0 && tile.example.is_some());
        // Value outside the lists.
        let mut odd = base(AType::Bf16);
        odd.block_n = 48;
        assert_eq!(s.check(&odd, None).unwrap_err().constraint, "value_lists");
    }

    #[test]
    fn family_space_is_enumerated_exactly() {
        for (family, a_type) in [(Family::Sm90, AType::Bf16), (Family::Sm90, AType::Nvfp4)] {
            let listed = template::search_space(family, a_type);
            let s = SearchSpace::for_family(family, a_type).unwrap();
            let got: HashSet<GemmConfig> = s.enumerate().iter().copied().collect();
            let want: HashSet<GemmConfig> =
                listed.iter().filter(|c| c.check().is_ok()).copied().collect();
            assert_eq!(got, want);
            assert!(s.raw_count() >= s.count() as u64);
            for pv in s.params() {
                assert!(!pv.values.is_empty());
                assert!(pv.values.windows(2).all(|w| w[0] < w[1]), "{pv:?}");
            }
        }
    }

    #[test]
    fn bad_value_lists_are_errors() {
        let mut params = SearchSpace::value_lists(&[base(AType::Bf16)]);
        params.pop();
        let e = SearchSpace::new(Family::Sm90, AType::Bf16, params, base(AType::Bf16)).unwrap_err();
        assert!(matches!(e, SearchError::MissingParam("min_ctas")), "{e}");
        let e = SearchSpace::from_configs(Family::Sm90, AType::Bf16, &[], base(AType::Bf16));
        assert!(matches!(e, Err(SearchError::EmptySpace { .. })));
    }

    #[test]
    fn grid_neighbours() {
        let s = toy_space();
        let configs = s.enumerate();
        let g = Grid::of(configs);
        let i = configs.iter().position(|c| *c == base(AType::Bf16)).unwrap();
        let n1 = g.neighbours(i, 1);
        assert!(!n1.is_empty());
        for &j in &n1 {
            let differ: Vec<Param> = Param::ALL
                .into_iter()
                .filter(|p| p.get(&configs[i]) != p.get(&configs[j]))
                .collect();
            assert_eq!(differ.len(), 1, "{} vs {}", configs[i], configs[j]);
        }
        // block_m 16 -> 8 and 32 are both one step away.
        let bm: BTreeSet<u32> =
            n1.iter().filter(|&&j| configs[j].block_m != 16).map(|&j| configs[j].block_m).collect();
        assert_eq!(bm, [8, 32].into_iter().collect());
        let n2 = g.neighbours(i, 2);
        assert!(n2.iter().all(|j| !n1.contains(j) && *j != i));
        assert!(n2.len() > n1.len());
    }
}
