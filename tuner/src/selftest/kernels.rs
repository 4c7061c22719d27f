//! The kernel checks of a self-test: every kernel of a dispatch table (or, without one, the
//! family's representative kernels and the grouped family defaults) run on the GPU against the
//! CPU reference, through the same verification as the tuner's (`bench::gemm::verify`: poisoned
//! output, two runs bit-identical, every element within the reference bound), the
//! dequantize-then-cuBLAS path of entries that take it (`bench::composite`), and the grouped MoE
//! entries (`check::grouped`, verification on sampled routed rows).
//!
//! [`plan`] is pure: which checks a table gives on a GPU of `family`, and the SKIP lines of what
//! this GPU cannot run.

use super::{one_line, CheckResult};
use crate::bench::composite::Composite;
use crate::bench::gemm::{verify, Candidate, DeviceProblem, HostProblem};
use crate::bench::TimingPolicy;
use crate::compile::Compiler;
use crate::gpu::{Gpu, GpuError};
use crate::moe::{MoeOp, MoeShape};
use crate::problem::{AType, GemmProblem};
use crate::table::{Method, MoeEntry, MoeKey, Table};
use crate::template::{representative_configs, Family, GemmConfig};
use std::collections::BTreeMap;

/// The problems the representative kernels are checked on without a table (M, N, K): a decode
/// step of the GLM-5 TP8 gate_up shape, and a ragged M on the TP8 down shape's transpose (the EP
/// down shape).
pub const DEFAULT_PROBLEMS: [(u32, u32, u32); 2] = [(1, 512, 6144), (33, 6144, 2048)];

/// The origin the grouped family defaults' lines name.
pub const DEFAULT_GROUPED: &str = "grouped family defaults";

/// The token counts the grouped family defaults are checked at without a table, on the GLM-5
/// TP8 layer: decode steps of 1 and 8 tokens (gate_up and down).
pub const DEFAULT_MOE_TOKENS: [u32; 2] = [1, 8];

/// The grouped family defaults (`moe::defaults`: what the runtime launches for a layer without
/// table entries) on a GPU of `sm_count` SMs, as grouped entries on the GLM-5 TP8 layer at
/// [`DEFAULT_MOE_TOKENS`], each step routed with the tuner's seed for its token count. They
/// carry no recorded time: a self-test only verifies them.
pub fn default_moe_entries(family: Family, sm_count: u32) -> Vec<MoeEntry> {
    let shape = MoeShape::GLM5_TP8;
    let mut out = Vec::new();
    for a_type in [AType::Bf16, AType::Nvfp4] {
        let defaults =
            crate::moe::defaults::default_routes(family, a_type, &shape, shape.experts, sm_count);
        let Ok(defaults) = defaults else {
            continue;
        };
        for tokens in DEFAULT_MOE_TOKENS {
            for op in MoeOp::ALL {
                let (n, k) = shape.nk(op);
                let key = MoeKey {
                    op,
                    family,
                    a_type,
                    n,
                    k,
                    experts: shape.experts,
                    top_k: shape.top_k,
                    tokens,
                };
                let at = defaults.iter().filter(|d| d.0 == op && d.1 == tokens);
                for &(_, _, config) in at {
                    out.push(MoeEntry {
                        key,
                        config,
                        median_us: 0.0,
                        interval_us: (0.0, 0.0),
                        skewed_us: 0.0,
                        routing_seed: crate::tune::moe::routing_seed(tokens),
                        roofline_fraction: 0.0,
                        experts_total: None,
                    });
                }
            }
        }
    }
    out
}

/// One check to run on the GPU.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelCheck {
    /// A fused kernel on one problem.
    Gemm { what: String, config: GemmConfig, problem: GemmProblem },
    /// The dequantize-then-cuBLAS path on one problem.
    Composite { what: String, problem: GemmProblem },
    /// Grouped MoE entries (verified together: entries of one routed step share its operands).
    Grouped { origin: String, entries: Vec<MoeEntry> },
}

/// What a self-test checks on a GPU of `family`, and the SKIP lines of what it cannot run.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub checks: Vec<KernelCheck>,
    pub skipped: Vec<CheckResult>,
}

/// The checks of `table` (named `origin`) on a GPU of `family`, or without a table of the
/// family's representative kernels on [`DEFAULT_PROBLEMS`] and its grouped family defaults
/// ([`default_moe_entries`]) on a GPU of `sm_count` SMs.
pub fn plan(family: Family, sm_count: u32, table: Option<(&Table, &str)>) -> Plan {
    let mut checks = Vec::new();
    let mut skipped = Vec::new();
    let Some((table, origin)) = table else {
        for a_type in [AType::Bf16, AType::Nvfp4] {
            for config in representative_configs(family, a_type) {
                for (m, n, k) in DEFAULT_PROBLEMS {
                    let problem = GemmProblem::new(m, n, k, a_type);
                    if config.check_problem(&problem).is_ok() {
                        checks.push(KernelCheck::Gemm {
                            what: format!("representative kernel {config} on {problem}"),
                            config,
                            problem,
                        });
                    }
                }
            }
        }
        let entries = default_moe_entries(family, sm_count);
        if !entries.is_empty() {
            checks.push(KernelCheck::Grouped { origin: DEFAULT_GROUPED.into(), entries });
        }
        return Plan { checks, skipped };
    };
    let mut other: BTreeMap<Family, usize> = BTreeMap::new();
    for e in &table.entries {
        if e.key.family != family {
            *other.entry(e.key.family).or_default() += 1;
            continue;
        }
        let problem = e.key.problem();
        let kernel = match e.method {
            Method::Fused => "kernel",
            Method::DequantCublasBf16 => "fallback kernel",
        };
        checks.push(KernelCheck::Gemm {
            what: format!("{origin} {}: {kernel} {}", e.key, e.config),
            config: e.config,
            problem,
        });
        if e.method == Method::DequantCublasBf16 {
            checks.push(KernelCheck::Composite {
                what: format!("{origin} {}: {}", e.key, e.method.label()),
                problem,
            });
        }
    }
    let mut grouped = Vec::new();
    for e in &table.moe {
        if e.key.family != family {
            *other.entry(e.key.family).or_default() += 1;
        } else if let Err(why) = crate::check::grouped::measurable(&e.key) {
            skipped.push(CheckResult::skip(format!("{origin} {}", e.key), why));
        } else {
            grouped.push(e.clone());
        }
    }
    if !grouped.is_empty() {
        checks.push(KernelCheck::Grouped { origin: origin.to_string(), entries: grouped });
    }
    for (f, n) in other {
        skipped.push(CheckResult::skip(
            format!("{origin}: {n} entries of family {f}"),
            format!("this GPU runs family {family}"),
        ));
    }
    Plan { checks, skipped }
}

/// The operands of a GEMM check (fixed per problem: a failure reproduces).
fn operand_seed(p: &GemmProblem) -> u64 {
    0x5E1F_7E57 ^ ((p.m as u64) << 40) ^ ((p.n as u64) << 20) ^ p.k as u64
}

/// The timing policy of the self-test's measurements (`check::grouped::verify_policy`: nothing
/// here is timed for a report, but the operand upload takes its rotation).
pub fn verify_policy() -> TimingPolicy {
    crate::check::grouped::verify_policy()
}

/// Run one GEMM or composite check: `Ok(Ok(detail))` passed, `Ok(Err(why))` failed, `Err` a CUDA
/// error (the context may be lost).
pub fn run_gemm(
    gpu: &Gpu,
    compiler: &Compiler,
    config: Option<GemmConfig>,
    problem: GemmProblem,
) -> Result<Result<String, String>, GpuError> {
    let host = match HostProblem::random(problem, operand_seed(&problem)) {
        Ok(h) => h,
        Err(e) => return Ok(Err(format!("building the problem: {e}"))),
    };
    let policy = verify_policy();
    let Some(config) = config else {
        let composite = Composite::new(gpu, compiler).and_then(|c| {
            let s = c.scratch(problem)?;
            Ok((c, s))
        });
        let (c, s) = match composite {
            Ok(x) => x,
            Err(e) => return Ok(Err(one_line(&e.to_string()))),
        };
        let mut dp = DeviceProblem::upload(gpu, &host, &policy, &[])?;
        return Ok(c
            .verify(&s, &host, &mut dp)?
            .map(|()| "W expanded bit for bit, Y within the reference bound".to_string()));
    };
    let source = match config.render() {
        Ok(s) => s,
        Err(e) => return Ok(Err(format!("illegal: {e}"))),
    };
    let compiled = match compiler.compile(&source) {
        Ok(k) => k,
        Err(e) => return Ok(Err(format!("compile error: {}", one_line(&e.to_string())))),
    };
    let candidate = match Candidate::load(gpu, config, &compiled) {
        Ok(c) => c,
        Err(e) => return Ok(Err(format!("load: {}", one_line(&e.to_string())))),
    };
    let mut dp = DeviceProblem::upload(gpu, &host, &policy, &[config])?;
    Ok(verify(gpu, &host, &mut dp, &candidate)?
        .map(|()| "within the CPU reference bound, two runs bit-identical".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(name: &str) -> Table {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
        Table::load(&root.join(name)).unwrap()
    }

    #[test]
    fn a_table_gives_every_entry_its_fallback_and_composite_and_the_grouped_entries() {
        let t = committed("nvidia-h200.ron");
        let p = plan(Family::Sm90, 132, Some((&t, "t.ron")));
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
        let gemm = p.checks.iter().filter(|c| matches!(c, KernelCheck::Gemm { .. })).count();
        let composite =
            p.checks.iter().filter(|c| matches!(c, KernelCheck::Composite { .. })).count();
        assert_eq!(gemm, t.entries.len());
        assert_eq!(
            composite,
            t.entries.iter().filter(|e| e.method == Method::DequantCublasBf16).count()
        );
        assert!(composite > 0, "the committed table has dequantize-then-cuBLAS entries");
        match p.checks.last() {
            Some(KernelCheck::Grouped { entries, .. }) => assert_eq!(entries, &t.moe),
            other => panic!("{other:?}"),
        }
        // Every GEMM check is the entry's own kernel on the entry's problem.
        for (c, e) in p
            .checks
            .iter()
            .filter_map(|c| match c {
                KernelCheck::Gemm { config, problem, what } => Some((config, problem, what)),
                _ => None,
            })
            .zip(&t.entries)
        {
            assert_eq!((c.0, c.1), (&e.config, &e.key.problem()));
            assert!(c.2.contains(&e.config.name()), "{}", c.2);
        }
    }

    #[test]
    fn entries_of_another_family_are_skipped_with_the_reason() {
        let t = committed("nvidia-h200.ron");
        let p = plan(Family::Sm120, 188, Some((&t, "t.ron")));
        assert!(p.checks.is_empty(), "{:?}", p.checks);
        assert_eq!(p.skipped.len(), 1, "{:?}", p.skipped);
        let line = p.skipped[0].line();
        assert!(
            line.starts_with("SKIP")
                && line
                    .contains(&format!("{} entries of family sm90", t.entries.len() + t.moe.len()))
                && line.contains("this GPU runs family sm120"),
            "{line}"
        );
    }

    #[test]
    fn without_a_table_the_representative_kernels_run_on_legal_problems() {
        for (family, sms) in [(Family::Sm90, 132), (Family::Sm120, 188)] {
            let p = plan(family, sms, None);
            assert!(!p.checks.is_empty(), "{family}");
            let (grouped, gemm): (Vec<_>, Vec<_>) =
                p.checks.iter().partition(|c| matches!(c, KernelCheck::Grouped { .. }));
            for c in &gemm {
                let KernelCheck::Gemm { config, problem, .. } = c else { panic!("{c:?}") };
                assert_eq!(config.family, family);
                assert!(config.check_problem(problem).is_ok(), "{config} on {problem}");
            }
            // the grouped layer: the runtime's family defaults, every entry legal on its layer and
            // measurable, both ops at every default token count and activation type the family
            // runs; on sm120 a gate_up kernel split along K that splits on its decode step
            let [KernelCheck::Grouped { origin, entries }] = grouped.as_slice() else {
                panic!("{family}: {grouped:?}")
            };
            assert_eq!(origin, DEFAULT_GROUPED);
            let a_types: &[AType] =
                if family == Family::Sm90 { &[AType::Bf16, AType::Nvfp4] } else { &[AType::Nvfp4] };
            for &a in a_types {
                for tokens in DEFAULT_MOE_TOKENS {
                    for op in MoeOp::ALL {
                        assert!(entries
                            .iter()
                            .any(|e| (e.key.a_type, e.key.tokens, e.key.op) == (a, tokens, op)));
                    }
                }
            }
            for e in entries {
                assert_eq!(
                    (e.key.family, e.config.family, e.config.a_type),
                    (family, family, e.key.a_type)
                );
                let shape = e.key.shape();
                let defaults = crate::moe::defaults::default_routes(
                    family,
                    e.key.a_type,
                    &shape,
                    shape.experts,
                    sms,
                )
                .unwrap();
                assert!(defaults.contains(&(e.key.op, e.key.tokens, e.config)), "{}", e.key);
                assert!(a_types.contains(&e.key.a_type), "{family}: {}", e.key);
                e.config.check(&e.key.shape()).unwrap_or_else(|x| panic!("{x}"));
                crate::check::grouped::measurable(&e.key).unwrap();
            }
            if family == Family::Sm120 {
                let split = entries.iter().find(|e| e.config.split_k > 1).expect("a split kernel");
                let step = crate::check::grouped::step_of(split);
                let ids = crate::moe::schedule::draw_routing(
                    step.seed,
                    step.tokens,
                    step.shape.top_k,
                    step.experts_total,
                    step.routing,
                );
                let s = crate::moe::RouteSchedule::build(&ids, 0, step.shape.experts);
                assert!(crate::moe::sm120::splits_on(&split.config, &step.shape, &s));
            }
            // Every representative kernel is checked on at least one problem.
            for a in [AType::Bf16, AType::Nvfp4] {
                for r in representative_configs(family, a) {
                    assert!(
                        p.checks
                            .iter()
                            .any(|c| matches!(c, KernelCheck::Gemm { config, .. } if *config == r)),
                        "{r} has no legal default problem"
                    );
                }
            }
        }
    }
}
