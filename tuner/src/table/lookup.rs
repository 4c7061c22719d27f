//! Lookup with a fixed fallback order: exact -> nearest bucket -> common configuration -> default.

use super::check::TableCheck;
use super::schema::{Method, Table};
use crate::problem::{AType, GemmProblem};
use crate::template::{fallback_configs, Family, GemmConfig};
use std::collections::{BTreeSet, HashMap};
use std::fmt;

/// Why a lookup could not use an entry of the table's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// No entry for this (op, family, a_type, N, K).
    Shape,
    /// The table has entries for the family, but a device or template mismatch disabled them.
    FamilyDisabled,
    /// Entries of this shape exist but none of their configurations is legal for this M.
    NotLegal { reason: String },
}

/// How the configuration of a lookup was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fallback {
    /// The entry at exactly this M.
    Exact,
    /// The entry of the same shape at another token bucket (the normal case between buckets).
    NearestBucket { bucket: u32 },
    /// The table's most common winner of the same (op, family, a_type).
    Common { missing: Missing },
    /// The family's default configuration.
    Default { missing: Missing },
}

impl Fallback {
    /// Whether the caller should warn: the table had nothing for this shape.
    pub fn is_degraded(&self) -> bool {
        matches!(self, Fallback::Common { .. } | Fallback::Default { .. })
    }
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Missing::Shape => f.write_str("no table entry for this shape"),
            Missing::FamilyDisabled => f.write_str(
                "the table's entries for this family are disabled (device or template mismatch)",
            ),
            Missing::NotLegal { reason } => {
                write!(f, "no entry of this shape is legal here ({reason})")
            }
        }
    }
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fallback::Exact => f.write_str("exact"),
            Fallback::NearestBucket { bucket } => write!(f, "nearest bucket M={bucket}"),
            Fallback::Common { missing } => {
                write!(f, "{missing}; using the table's most common configuration")
            }
            Fallback::Default { missing } => write!(f, "{missing}; using the family default"),
        }
    }
}

/// The answer of a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub config: GemmConfig,
    /// The entry's method (exact and nearest-bucket routes); `Fused` for common and default ones.
    pub method: Method,
    pub fallback: Fallback,
}

impl Resolved {
    /// A warning naming what was missing, for degraded lookups; `None` otherwise.
    pub fn warning(&self, op: &str, problem: &GemmProblem) -> Option<String> {
        self.fallback.is_degraded().then(|| {
            format!("{op} {} {problem}: {} {}", self.config.family, self.fallback, self.config)
        })
    }
}

/// Not even the family default can run the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} {family} {problem}: no legal configuration (the family default says: {reason})")]
pub struct LookupError {
    pub op: String,
    pub family: Family,
    pub problem: GemmProblem,
    pub reason: String,
}

/// (op, family, a_type): the scope of a common configuration.
type OpKey = (String, Family, AType);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ShapeKey {
    op: String,
    family: Family,
    a_type: AType,
    n: u32,
    k: u32,
    experts: Option<u32>,
}

/// A shape's token bucket with its winner and method.
pub type Bucket = (u32, GemmConfig, Method);

/// An index over a table for lookups (built once; lookups take `&self`).
#[derive(Debug, Clone, Default)]
pub struct Lookup {
    /// Buckets of each shape, ascending, with their winners and methods.
    shapes: HashMap<ShapeKey, Vec<Bucket>>,
    /// Winners of each (op, family, a_type), most robust first.
    common: HashMap<OpKey, Vec<GemmConfig>>,
    disabled: BTreeSet<Family>,
}

impl Lookup {
    /// Index `table`, skipping the families `check` disabled. `None` gives a lookup that always
    /// answers with family defaults (serving without a tuned table).
    pub fn new(table: Option<&Table>, check: &TableCheck) -> Self {
        let mut shapes: HashMap<ShapeKey, Vec<Bucket>> = HashMap::new();
        let mut score: HashMap<OpKey, HashMap<GemmConfig, (u32, u32)>> = HashMap::new();
        for e in table.map(|t| t.entries.as_slice()).unwrap_or_default() {
            let k = &e.key;
            if check.disabled.contains(&k.family) {
                continue;
            }
            let sk = ShapeKey {
                op: k.op.clone(),
                family: k.family,
                a_type: k.a_type,
                n: k.n,
                k: k.k,
                experts: k.experts,
            };
            shapes.entry(sk).or_default().push((k.m, e.config, e.method));
            let s = score.entry((k.op.clone(), k.family, k.a_type)).or_default();
            s.entry(e.config).or_default().0 += 1;
            for r in &e.runners_up {
                s.entry(r.config).or_default().1 += 1;
            }
        }
        for v in shapes.values_mut() {
            v.sort_by_key(|(m, _, _)| *m);
        }
        let common = score
            .into_iter()
            .map(|(key, s)| {
                // Only winners are candidates (a runner-up may never have won anything); runner-up
                // appearances break ties between winners.
                let mut ranked: Vec<(GemmConfig, (u32, u32))> =
                    s.into_iter().filter(|(_, (wins, _))| *wins > 0).collect();
                ranked.sort_by(|(ca, (wa, ra)), (cb, (wb, rb))| {
                    wb.cmp(wa).then(rb.cmp(ra)).then(ca.cmp(cb))
                });
                (key, ranked.into_iter().map(|(c, _)| c).collect())
            })
            .collect();
        Self { shapes, common, disabled: check.disabled.clone() }
    }

    /// The configuration for `problem` with `op` on `family`, by the order in the module docs.
    pub fn resolve(
        &self,
        op: &str,
        family: Family,
        problem: &GemmProblem,
        experts: Option<u32>,
    ) -> Result<Resolved, LookupError> {
        self.resolve_among(op, family, problem, experts, |_| true)
    }

    /// [`Lookup::resolve`] whose last step takes the first legal family default that `loaded`
    /// admits (a runtime drops a default that does not build, with a warning), else the first
    /// legal one, which the caller then cannot launch.
    pub fn resolve_among(
        &self,
        op: &str,
        family: Family,
        problem: &GemmProblem,
        experts: Option<u32>,
        loaded: impl Fn(&GemmConfig) -> bool,
    ) -> Result<Resolved, LookupError> {
        let key = ShapeKey {
            op: op.to_string(),
            family,
            a_type: problem.a_type,
            n: problem.n,
            k: problem.k,
            experts,
        };
        let mut missing =
            if self.disabled.contains(&family) { Missing::FamilyDisabled } else { Missing::Shape };
        if let Some(buckets) = self.shapes.get(&key) {
            let first = buckets.partition_point(|(m, _, _)| *m < problem.m);
            // Smallest bucket >= M, then larger ones ascending, then smaller ones descending.
            let order = (first..buckets.len()).chain((0..first).rev());
            let mut last_err = String::new();
            for i in order {
                let (bucket, config, method) = buckets[i];
                match config.check_problem(problem) {
                    Ok(()) => {
                        let fallback = if bucket == problem.m {
                            Fallback::Exact
                        } else {
                            Fallback::NearestBucket { bucket }
                        };
                        return Ok(Resolved { config, method, fallback });
                    }
                    Err(e) => last_err = e.to_string(),
                }
            }
            missing = Missing::NotLegal { reason: last_err };
        }
        let ranked = self.common.get(&(op.to_string(), family, problem.a_type));
        if let Some(config) =
            ranked.into_iter().flatten().find(|c| c.check_problem(problem).is_ok())
        {
            return Ok(Resolved {
                config: *config,
                method: Method::Fused,
                fallback: Fallback::Common { missing },
            });
        }
        let defaults = fallback_configs(family, problem.a_type, problem.m, problem.n, problem.k);
        let legal = || defaults.iter().filter(|c| c.check_problem(problem).is_ok());
        match legal().find(|c| loaded(c)).or_else(|| legal().next()) {
            Some(&config) => Ok(Resolved {
                config,
                method: Method::Fused,
                fallback: Fallback::Default { missing },
            }),
            None => Err(LookupError {
                op: op.to_string(),
                family,
                problem: *problem,
                // the reason of the most permissive default (the K-tail form, where it exists)
                reason: defaults
                    .last()
                    .and_then(|c| c.check_problem(problem).err())
                    .map_or_else(String::new, |e| e.to_string()),
            }),
        }
    }

    /// The common configurations of (op, family, a_type), most robust first.
    pub fn common(&self, op: &str, family: Family, a_type: AType) -> &[GemmConfig] {
        self.common.get(&(op.to_string(), family, a_type)).map(Vec::as_slice).unwrap_or_default()
    }

    /// Every (N, K) with entries for (op, family, a_type), with their buckets, winners and methods.
    pub fn shapes(
        &self,
        op: &str,
        family: Family,
        a_type: AType,
    ) -> impl Iterator<Item = ((u32, u32), &[Bucket])> + '_ {
        let op = op.to_string();
        self.shapes.iter().filter_map(move |(k, v)| {
            (k.op == op && k.family == family && k.a_type == a_type && k.experts.is_none())
                .then_some(((k.n, k.k), v.as_slice()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::schema::tests::sample;
    use crate::table::OP_GEMM;
    use crate::template::{
        decode_default_configs, default_config, default_configs, prefill_default_configs,
    };

    fn lookup() -> (Table, Lookup) {
        let t = sample();
        let l = Lookup::new(Some(&t), &TableCheck::clean());
        (t, l)
    }

    fn at(l: &Lookup, m: u32, n: u32, k: u32) -> Resolved {
        l.resolve(OP_GEMM, Family::Sm90, &GemmProblem::new(m, n, k, AType::Bf16), None).unwrap()
    }

    fn winner(t: &Table, n: u32, k: u32, m: u32) -> GemmConfig {
        t.entries.iter().find(|e| e.key.n == n && e.key.k == k && e.key.m == m).unwrap().config
    }

    #[test]
    fn exact_and_nearest_bucket() {
        let (t, l) = lookup();
        let r = at(&l, 16, 512, 6144);
        assert_eq!(r.fallback, Fallback::Exact);
        assert_eq!(r.config, winner(&t, 512, 6144, 16));
        // Between buckets: the smallest bucket >= M.
        assert_eq!(at(&l, 2, 512, 6144).fallback, Fallback::NearestBucket { bucket: 16 });
        assert_eq!(at(&l, 17, 512, 6144).fallback, Fallback::NearestBucket { bucket: 256 });
        assert_eq!(at(&l, 17, 512, 6144).config, winner(&t, 512, 6144, 256));
        // Above every bucket: the largest.
        assert_eq!(at(&l, 4096, 512, 6144).fallback, Fallback::NearestBucket { bucket: 256 });
        assert!(at(&l, 4096, 512, 6144)
            .warning(OP_GEMM, &GemmProblem::new(4096, 512, 6144, AType::Bf16))
            .is_none());
    }

    #[test]
    fn unknown_shape_takes_the_common_config_with_a_warning() {
        let (t, l) = lookup();
        // The sample's most frequent winner wins 3 of 4 entries.
        let common = winner(&t, 512, 6144, 1);
        assert_eq!(l.common(OP_GEMM, Family::Sm90, AType::Bf16)[0], common);
        let p = GemmProblem::new(8, 1024, 6144, AType::Bf16);
        let r = l.resolve(OP_GEMM, Family::Sm90, &p, None).unwrap();
        assert_eq!(r.fallback, Fallback::Common { missing: Missing::Shape });
        assert_eq!(r.config, common);
        let w = r.warning(OP_GEMM, &p).unwrap();
        assert!(w.contains("N=1024 K=6144") && w.contains("no table entry"), "{w}");
        // Another op has no common configuration in this table: the family default (at M = 8 and
        // K = 6144 the decode default of 256-k stages).
        let r = l.resolve(crate::table::OP_GROUPED_GEMM, Family::Sm90, &p, Some(8)).unwrap();
        assert_eq!(r.fallback, Fallback::Default { missing: Missing::Shape });
        assert_eq!(r.config, decode_default_configs(Family::Sm90, AType::Bf16)[1]);
    }

    #[test]
    fn disabled_family_and_no_table_use_the_default() {
        let t = sample();
        let mut check = TableCheck::clean();
        check.disabled.insert(Family::Sm90);
        let l = Lookup::new(Some(&t), &check);
        let r = at(&l, 16, 512, 6144);
        assert_eq!(r.fallback, Fallback::Default { missing: Missing::FamilyDisabled });
        assert_eq!(r.config, decode_default_configs(Family::Sm90, AType::Bf16)[1]);
        let r = at(&l, 65, 512, 6144);
        assert_eq!(r.fallback, Fallback::Default { missing: Missing::FamilyDisabled });
        // 2 x 4 tiles of 64 x 128: few CTAs, the 16-row tiles
        assert_eq!(r.config, prefill_default_configs(Family::Sm90, AType::Bf16)[1]);
        let none = Lookup::new(None, &TableCheck::clean());
        assert_eq!(at(&none, 1, 512, 6144).fallback, Fallback::Default { missing: Missing::Shape });
    }

    /// Without a table entry or a common configuration, M up to 64 takes the decode defaults in
    /// their order for the problem (a short K the 32-row tiles, one or two rows of a deep K the
    /// 1024-k warp ring, more rows the 256-k stages; the first whose stages divide K), larger M
    /// the prefill default where its stages divide K (W4A16), other K and M the generic default,
    /// a K that 64 does not divide its K-tail form; none splits K.
    #[test]
    fn small_m_outside_the_table_takes_the_decode_defaults_by_m_and_k() {
        let none = Lookup::new(None, &TableCheck::clean());
        for a_type in [AType::Bf16, AType::Nvfp4] {
            let decode = decode_default_configs(Family::Sm90, a_type);
            assert_eq!(decode.len(), 3, "{a_type}: every decode default is legal");
            let generic = default_config(Family::Sm90, a_type);
            let pick = |m: u32, n: u32, k: u32| {
                let p = GemmProblem::new(m, n, k, a_type);
                let r = none.resolve(OP_GEMM, Family::Sm90, &p, None).unwrap();
                assert_eq!(r.fallback, Fallback::Default { missing: Missing::Shape });
                assert_eq!(r.config.split_k, 1, "{p}: {}", r.config);
                r.config
            };
            assert_eq!(pick(1, 128, 2048), decode[0]);
            assert_eq!(pick(2, 512, 7168), decode[0]);
            assert_eq!(pick(2, 4096, 1792), decode[1], "1024 does not divide K");
            assert_eq!(pick(3, 512, 6144), decode[1]);
            assert_eq!(pick(64, 3584, 4096), decode[1]);
            assert_eq!(pick(1, 6144, 256), decode[2]);
            assert_eq!(pick(16, 2048, 384), decode[2]);
            assert_eq!(pick(40, 2048, 640), decode[2], "256 does not divide K");
            assert_eq!(pick(1, 2048, 64), generic);
            // above 64 rows (W4A16): the 64 x 128 tiles, or the 16-row ones where the former
            // make at most 64 CTAs
            let prefill = prefill_default_configs(Family::Sm90, a_type);
            let (wide, narrow) = match prefill[..] {
                [wide, narrow] => (wide, narrow),
                _ => (generic, generic),
            };
            assert_eq!(pick(65, 128, 2048), narrow);
            assert_eq!(pick(1024, 512, 6144), narrow, "16 x 4 = 64 CTAs");
            assert_eq!(pick(1025, 512, 6144), wide, "17 x 4 CTAs");
            assert_eq!(pick(128, 6144, 256), wide);
            assert_eq!(pick(4096, 6144, 256), wide);
            assert_eq!(pick(65, 2048, 192), generic, "128 does not divide K");
            assert_eq!(pick(1, 2048, 96).pipeline, crate::template::Pipeline::KTail);
        }
    }

    /// A family default the caller could not load gives way to the next legal one; with none
    /// loaded the first legal one is named (the caller reports it as not loaded).
    #[test]
    fn defaults_that_did_not_load_give_way_to_the_next() {
        let none = Lookup::new(None, &TableCheck::clean());
        let decode = decode_default_configs(Family::Sm90, AType::Bf16);
        let p = GemmProblem::new(1, 512, 6144, AType::Bf16);
        let among = |loaded: &dyn Fn(&GemmConfig) -> bool| {
            none.resolve_among(OP_GEMM, Family::Sm90, &p, None, loaded).unwrap().config
        };
        assert_eq!(among(&|_| true), decode[0]);
        assert_eq!(among(&|c| *c != decode[0]), decode[1]);
        assert_eq!(among(&|c| !decode.contains(c)), default_config(Family::Sm90, AType::Bf16));
        assert_eq!(among(&|_| false), decode[0]);
    }

    /// A shape outside the table whose K 64 does not divide: no whole-stage configuration runs
    /// it, the family default's K-tail form does; a K of no whole NVFP4 block has none.
    #[test]
    fn a_k_tail_shape_outside_the_table_takes_the_k_tail_default() {
        let (_, l) = lookup();
        let p = GemmProblem::new(8, 2048, 96, AType::Bf16);
        let r = l.resolve(OP_GEMM, Family::Sm90, &p, None).unwrap();
        assert_eq!(r.fallback, Fallback::Default { missing: Missing::Shape });
        assert_eq!(r.config, default_configs(Family::Sm90, AType::Bf16)[1]);
        assert_eq!(r.config.pipeline, crate::template::Pipeline::KTail);
        let p = GemmProblem::new(8, 2048, 88, AType::Bf16);
        let e = l.resolve(OP_GEMM, Family::Sm90, &p, None).unwrap_err();
        assert!(
            e.to_string().contains("no legal configuration") && e.reason.contains("K = 88"),
            "{e}"
        );
    }

    /// sm120 without a table: every K that is a multiple of 16 has a default, K = 192 (a
    /// multiple of 64, not of the generic tile's 256-k stages) the 64-k stage one, K = 176 the
    /// K-tail form.
    #[test]
    fn sm120_defaults_run_every_whole_block_k() {
        let (_, l) = lookup();
        let defaults = default_configs(Family::Sm120, AType::Nvfp4);
        assert_eq!(defaults.len(), 3);
        // sm90's generic configuration has 64-k stages already: the generic one and its K-tail form
        for a_type in [AType::Bf16, AType::Nvfp4] {
            let d = default_configs(Family::Sm90, a_type);
            assert_eq!(d.len(), 2);
            assert_eq!(d[0], default_config(Family::Sm90, a_type));
            let tail = crate::template::Pipeline::KTail;
            assert_eq!(d[1], GemmConfig { pipeline: tail, block_k: 64, warps_k: 1, ..d[0] });
        }
        for (k, which) in [(6144, 0), (256, 0), (192, 1), (1152, 1), (2880, 1), (176, 2), (16, 2)] {
            for m in [1, 8, 64, 1024] {
                let p = GemmProblem::new(m, 4096, k, AType::Nvfp4);
                let r = l.resolve(OP_GEMM, Family::Sm120, &p, None).unwrap();
                assert_eq!(r.config, defaults[which], "M {m} K {k}");
                assert_eq!(r.fallback, Fallback::Default { missing: Missing::Shape });
            }
        }
    }

    #[test]
    fn illegal_entries_are_skipped_in_order() {
        // Fabricated index (a table file could not hold an illegal config): bucket 16's winner
        // is built for the wrong A type, so it is illegal for every problem of this shape.
        let (t, mut l) = lookup();
        let key = ShapeKey {
            op: OP_GEMM.into(),
            family: Family::Sm90,
            a_type: AType::Bf16,
            n: 512,
            k: 6144,
            experts: None,
        };
        let mut bad = winner(&t, 512, 6144, 16);
        bad.a_type = AType::Nvfp4;
        for b in l.shapes.get_mut(&key).unwrap() {
            if b.0 == 16 {
                b.1 = bad;
            }
        }
        // M=2 would pick bucket 16; it is illegal, so the next larger bucket (256) answers.
        assert_eq!(at(&l, 2, 512, 6144).fallback, Fallback::NearestBucket { bucket: 256 });
        // With every bucket illegal the lookup falls through to the common configuration.
        for b in l.shapes.get_mut(&key).unwrap() {
            b.1 = bad;
        }
        let r = at(&l, 2, 512, 6144);
        assert!(
            matches!(r.fallback, Fallback::Common { missing: Missing::NotLegal { .. } }),
            "{r:?}"
        );
    }
}
