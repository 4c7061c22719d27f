//! Tests of the sm120 grouped kernels: their index math on the CPU fragment model against the
//! reference (and mistakes in it caught), their space, and every variant compiling for sm_120a.

use super::*;
use crate::moe::schedule::{draw_routing, Routing, SplitMix64};

/// Random operand; scales with exponents 5..=9 (2^-2..2^2) so that every f64 sum is exact
/// and results compare bit for bit whatever the summation order.
fn random_matrix(rng: &mut SplitMix64, rows: u32, k: u32) -> Nvfp4Matrix {
    let codes = (0..rows * k).map(|_| rng.below(16) as u8).collect();
    let scales =
        (0..rows * k / 16).map(|_| (((5 + rng.below(5)) << 3) | rng.below(8)) as u8).collect();
    Nvfp4Matrix { rows, k, codes, scales }
}

fn grouped(op: MoeOp, block_m: u32, block_n: u32, block_k: u32, wn: u32, wk: u32) -> GroupedConfig {
    GroupedConfig {
        op,
        block_m,
        block_n,
        block_k,
        warps_n: wn,
        warps_k: wk,
        depth: 2,
        split_k: 1,
        min_ctas: 1,
        walk: 0,
        family: Family::Sm120,
        a_type: AType::Nvfp4,
        warp_ring: false,
        tiled: false,
        warps_m: 1,
        wgmma: false,
        k_tail: false,
        a_smem: false,
        flow: false,
    }
}

struct Case {
    shape: MoeShape,
    tokens: u32,
    routing: Routing,
    seed: u64,
}

fn operands(c: &Case, op: MoeOp, rows: u32) -> GroupedOperands {
    let mut rng = SplitMix64(c.seed);
    let (n, k) = c.shape.nk(op);
    let experts = (0..c.shape.experts).map(|_| random_matrix(&mut rng, n, k)).collect();
    // gate_up reads token rows; a broken gather may read up to the routed rows
    let act_rows = if op == MoeOp::GateUp { c.tokens.max(rows) } else { rows };
    GroupedOperands { experts, acts: random_matrix(&mut rng, act_rows, k) }
}

/// The simulation with room for `split_tiles` tiles of partials, and the reference.
fn run_split(
    c: &Case,
    cfg: &GroupedConfig,
    math: &GroupedMath,
    split_tiles: u32,
) -> (Simulated, Vec<f64>) {
    let ids = draw_routing(c.seed, c.tokens, c.shape.top_k, c.shape.experts, c.routing);
    let s = RouteSchedule::build(&ids, 0, c.shape.experts);
    let ops = operands(c, cfg.op, s.rows());
    let sim = simulate(cfg, &s, c.shape.top_k, &ops, math, split_tiles);
    (sim, reference(&s, c.shape.top_k, cfg.op, &ops))
}

fn run(c: &Case, cfg: &GroupedConfig, math: &GroupedMath) -> (Simulated, Vec<f64>) {
    run_split(c, cfg, math, 1 << 12)
}

#[test]
fn the_grouped_index_math_reproduces_the_reference_on_the_fragment_model() {
    // small layers: gate_up N = 2 inter (96: the last n tile runs past the weight), K = hidden
    let gu = MoeShape { hidden: 256, inter: 48, experts: 6, top_k: 3 };
    let dn = MoeShape { hidden: 96, inter: 256, experts: 6, top_k: 2 };
    let cases = [
        (
            Case { shape: gu, tokens: 5, routing: Routing::Uniform, seed: 1 },
            grouped(MoeOp::GateUp, 8, 32, 128, 1, 1),
        ),
        (
            Case { shape: gu, tokens: 11, routing: Routing::Skewed, seed: 2 },
            grouped(MoeOp::GateUp, 16, 64, 64, 2, 1),
        ),
        (
            Case { shape: gu, tokens: 7, routing: Routing::Uniform, seed: 3 },
            grouped(MoeOp::GateUp, 8, 64, 256, 1, 2),
        ),
        (
            Case { shape: gu, tokens: 13, routing: Routing::Skewed, seed: 4 },
            grouped(MoeOp::GateUp, 32, 128, 128, 2, 2),
        ),
        (
            Case { shape: dn, tokens: 6, routing: Routing::Uniform, seed: 5 },
            grouped(MoeOp::Down, 8, 32, 128, 2, 1),
        ),
        (
            Case { shape: dn, tokens: 9, routing: Routing::Skewed, seed: 6 },
            grouped(MoeOp::Down, 16, 64, 256, 4, 2),
        ),
        (
            Case { shape: dn, tokens: 4, routing: Routing::Uniform, seed: 7 },
            grouped(MoeOp::Down, 32, 16, 64, 1, 1),
        ),
        // a K of three 64-k stages, fewer than the space's 8 (Qwen3-235B's down over 8 GPUs)
        (
            Case {
                shape: MoeShape { hidden: 96, inter: 192, experts: 5, top_k: 2 },
                tokens: 7,
                routing: Routing::Skewed,
                seed: 8,
            },
            GroupedConfig { depth: 8, ..grouped(MoeOp::Down, 16, 32, 64, 2, 1) },
        ),
        // the K-tail form: K = 176 (GLM-4.5-Air's down over 8 GPUs: two 64-k tiles and one of
        // 48, whose copies read only below K) and a gate_up K of 208 split over 2 CTAs (k-tiles
        // 0-1 and 2-3, the partial last one in the second)
        (
            Case {
                shape: MoeShape { hidden: 96, inter: 176, experts: 5, top_k: 2 },
                tokens: 6,
                routing: Routing::Uniform,
                seed: 9,
            },
            GroupedConfig { depth: 3, k_tail: true, ..grouped(MoeOp::Down, 8, 32, 64, 2, 1) },
        ),
        (
            Case {
                shape: MoeShape { hidden: 208, inter: 48, experts: 5, top_k: 2 },
                tokens: 3,
                routing: Routing::Skewed,
                seed: 10,
            },
            GroupedConfig {
                depth: 3,
                k_tail: true,
                split_k: 2,
                ..grouped(MoeOp::GateUp, 8, 32, 64, 1, 1)
            },
        ),
    ];
    for (case, cfg) in &cases {
        cfg.check(&case.shape).unwrap_or_else(|e| panic!("{e}"));
        let (sim, want) = run(case, cfg, &GroupedMath::TEMPLATE);
        assert!(sim.writes.iter().all(|&w| w == 1), "{cfg}: an output written twice or never");
        assert_eq!(sim.values, want, "{cfg} on {}", case.shape);
        assert_eq!(sim.partial_writes > 0, cfg.split_k > 1, "{cfg}: partials where K is split");
    }
}

/// Split along K: every split's k-tiles (5 k-tiles over 2 and 4 CTAs: uneven shares), the
/// partial slots of every warp and register, and the ordered sum reproduce the reference; with
/// fewer partial tiles than the schedule's tiles the kernel runs unsplit and still does.
#[test]
fn split_k_partials_and_their_ordered_sum_reproduce_the_reference() {
    let gu = MoeShape { hidden: 320, inter: 48, experts: 6, top_k: 3 };
    let configs = [
        GroupedConfig { split_k: 2, ..grouped(MoeOp::GateUp, 8, 32, 64, 1, 1) },
        GroupedConfig { split_k: 4, ..grouped(MoeOp::GateUp, 8, 64, 64, 2, 1) },
        GroupedConfig { split_k: 2, ..grouped(MoeOp::GateUp, 16, 64, 128, 1, 2) },
        GroupedConfig { split_k: 4, walk: 2, ..grouped(MoeOp::GateUp, 16, 128, 64, 2, 1) },
    ];
    for (i, cfg) in configs.iter().enumerate() {
        let case = Case {
            shape: if cfg.block_k == 128 { MoeShape { hidden: 640, ..gu } } else { gu },
            tokens: 3 + 2 * i as u32,
            routing: if i % 2 == 0 { Routing::Uniform } else { Routing::Skewed },
            seed: 20 + i as u64,
        };
        cfg.check(&case.shape).unwrap_or_else(|e| panic!("{e}"));
        let ids = draw_routing(case.seed, case.tokens, gu.top_k, gu.experts, case.routing);
        let s = RouteSchedule::build(&ids, 0, gu.experts);
        let list = TILE_BLOCK_M.iter().position(|&b| b == cfg.block_m).unwrap();
        let tiles = s.tiles[list].len() as u32;
        assert!(tiles >= 2, "{cfg}: {tiles} tiles");
        let gx = case.shape.nk(cfg.op).0.div_ceil(cfg.block_n);
        for split_tiles in [tiles, tiles + 3, tiles - 1, 0] {
            let (sim, want) = run_split(&case, cfg, &GroupedMath::TEMPLATE, split_tiles);
            assert!(sim.writes.iter().all(|&w| w == 1), "{cfg}: an output written twice or never");
            assert_eq!(sim.values, want, "{cfg}, room for {split_tiles} of {tiles} tiles");
            // split exactly when the partials hold every tile: then every slot of every (tile,
            // n-tile, split) is stored once
            let slots = (tiles * gx * cfg.split_k * cfg.block_n * cfg.block_m) as usize;
            let want_writes = if tiles <= split_tiles { slots } else { 0 };
            assert_eq!(sim.partial_writes, want_writes, "{cfg}, room for {split_tiles}");
        }
    }
}

/// The kernel's partial slots (`slot_element`, `split_slot`) and counters, mirrored: for every
/// split configuration of the GLM-5 spaces, the wk == 0 warps' registers fill a slot exactly
/// once, the slots of `split_tiles` tiles are disjoint and inside the workspace's partials, the
/// counters inside its counters, and a decode step's tiles fit (B = 1 at every split, B = 2 and
/// 4 at the smaller ones).
#[test]
fn split_k_slots_cover_the_tile_once_and_fit_the_workspace() {
    for shape in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8] {
        let floats = split_partial_floats(&shape);
        let words = split_counter_words(&shape);
        let space = search_space(MoeOp::GateUp, &shape);
        let split: Vec<_> = space.iter().filter(|c| c.split_k > 1).collect();
        assert!(split.len() >= 20, "{shape}: {} split configurations", split.len());
        assert!(space.iter().all(|c| c.split_k == 1 || c.block_m <= 16));
        assert!(search_space(MoeOp::Down, &shape).iter().all(|c| c.split_k == 1));
        for c in split {
            let l = layout(c).unwrap();
            let slot = (c.block_n * c.block_m) as usize;
            let mut seen = vec![false; slot];
            for warp_pq in 0..l.warps_p * l.warps_q {
                for mp in 0..l.mma_p {
                    for mq in 0..l.mma_q {
                        for i in 0..4 {
                            for lane in 0..32 {
                                let e = split_element(&l, warp_pq, mp, mq, i, lane) as usize;
                                assert!(e < slot && !seen[e], "{c}: element {e}");
                                seen[e] = true;
                            }
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&s| s), "{c}: a slot element no register writes");
            let (n, _) = shape.nk(c.op);
            let gx = n.div_ceil(c.block_n);
            let cap = split_tiles(c, &shape, floats, words);
            let mut slots = std::collections::HashSet::new();
            for tile in 0..cap {
                for bx in 0..gx {
                    for z in 0..c.split_k {
                        let (at, counter) = split_slot(c, gx, tile, bx, z);
                        assert!(at + slot <= floats && counter < words, "{c}: tile {tile}");
                        assert!(at % slot == 0 && slots.insert(at), "{c}: slot {at} twice");
                    }
                }
            }
            // room for 512 routed-row slots (128 at split 4) whatever the tile's width: a step of
            // `tokens` has at most tokens x top_k tiles, so B = 1 always splits, B = 2 up to 32
            // row slots per tile, B = 4 up to 16
            assert_eq!(cap * c.split_k * c.block_m, SPLIT_ROW_SLOTS * 4, "{c}");
            for (tokens, slots) in [(1, 64), (2, 32), (4, 16)] {
                let ids = tokens * shape.top_k;
                assert!(c.split_k * c.block_m > slots || ids <= cap, "{c}: {ids} ids, room {cap}");
            }
        }
        // a kernel without split-K has no partials
        let one = space.iter().find(|c| c.split_k == 1).unwrap();
        assert_eq!(split_tiles(one, &shape, floats, words), 0);
    }
    // the k-tiles of the splits: contiguous, in order, every one once
    for (k_tiles, split) in [(5, 2), (5, 4), (48, 4), (4, 4), (24, 2)] {
        let mut next = 0;
        for z in 0..split {
            let (b, e) = split_k_tiles(k_tiles, split, z);
            assert!(b == next && e > b, "{k_tiles} over {split}: split {z} is {b}..{e}");
            next = e;
        }
        assert_eq!(next, k_tiles);
    }
}

#[test]
fn grouped_index_mistakes_are_caught() {
    let shape = MoeShape { hidden: 128, inter: 32, experts: 4, top_k: 2 };
    let case = Case { shape, tokens: 9, routing: Routing::Uniform, seed: 11 };
    let cfg = grouped(MoeOp::GateUp, 8, 64, 128, 2, 1);
    let wrong = |math: GroupedMath| {
        let (sim, want) = run(&case, &cfg, &math);
        sim.values != want || sim.writes.iter().any(|&w| w != 1)
    };
    let t = GroupedMath::TEMPLATE;
    assert!(!wrong(t));
    // gate and up rows not interleaved (plain weight rows, as down reads them)
    assert!(wrong(GroupedMath { weight_row: |_, n, n0, r| (n0 + r < n).then_some(n0 + r), ..t }));
    // gate_up reading the sorted row instead of its token (no gather)
    assert!(wrong(GroupedMath {
        source_row: |_, _, _, first, rows, r| (r < rows).then_some(first + r),
        ..t
    }));
    // activation scales of the sorted row instead of the token's row
    assert!(wrong(GroupedMath { scale_row: |_, sorted| sorted, ..t }));
    // rows past the tile not zero-filled but clamped: harmless only if never stored
    assert!(!wrong(GroupedMath {
        source_row: |op, ids, top_k, first, rows, r| source_row(
            op,
            ids,
            top_k,
            first,
            rows,
            r.min(rows - 1)
        ),
        ..t
    }));
}

#[test]
fn the_sm120_space_is_legal_w4a4_and_fits_shared_memory() {
    for shape in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8] {
        for op in MoeOp::ALL {
            let space = search_space(op, &shape);
            assert!(space.len() >= 40, "{op} {shape}: {}", space.len());
            for c in &space {
                c.check(&shape).unwrap();
                assert_eq!((c.family, c.a_type, c.min_ctas), (Family::Sm120, AType::Nvfp4, 1));
                assert!(SPLITS.contains(&c.split_k), "{c}");
                // no stage a CTA's k-tiles cannot fill
                let (_, k) = shape.nk(op);
                assert!(c.depth <= (k.div_ceil(c.block_k) / c.split_k).max(2), "{c}");
                assert!(c.smem_bytes() + static_smem_bytes(c) <= SMEM_LIMIT);
                assert!(c.source().code.contains("GroupedSm120<Cfg"), "{c}");
                assert_eq!(c.source().arch, crate::template::Arch::Sm120a);
            }
        }
    }
    // TP8 down (K = 256: one or two k-tiles) runs two stages; gate_up (K = 6144) the full rings
    assert!(search_space(MoeOp::Down, &MoeShape::GLM5_TP8).iter().all(|c| c.depth == 2));
    assert!(search_space(MoeOp::GateUp, &MoeShape::GLM5_TP8)
        .iter()
        .any(|c| c.depth == 6 && c.split_k == 4));
    let base = search_space(MoeOp::GateUp, &MoeShape::GLM5_TP8)[0];
    let e = GroupedConfig { a_type: AType::Bf16, ..base }.check(&MoeShape::GLM5_TP8).unwrap_err();
    assert!(e.reason.contains("W4A4 only"), "{e}");
    let e = GroupedConfig { split_k: 3, ..base }.check(&MoeShape::GLM5_TP8).unwrap_err();
    assert!(e.reason.contains("split_k 3 is not one of"), "{e}");
    let down = search_space(MoeOp::Down, &MoeShape::GLM5_TP8)[0];
    let e = GroupedConfig { split_k: 2, ..down }.check(&MoeShape::GLM5_TP8).unwrap_err();
    assert!(e.reason.contains("gate_up's"), "{e}");
    // K = 6144 in stages of 256: 24 k-tiles; a K of 128 in stages of 128 has one, fewer than 2
    let small = MoeShape { hidden: 128, ..MoeShape::GLM5_TP8 };
    let one_tile = GroupedConfig { split_k: 2, block_k: 128, depth: 6, warps_k: 1, ..base };
    let e = one_tile.check(&small).unwrap_err();
    assert!(e.reason.contains("fewer than split_k"), "{e}");
    let e =
        GroupedConfig { block_n: 16, warps_n: 1, ..base }.check(&MoeShape::GLM5_TP8).unwrap_err();
    assert!(e.reason.contains("multiple of 32"), "{e}");
    let e = GroupedConfig { depth: 8, block_k: 256, block_n: 128, warps_n: 4, block_m: 32, ..base }
        .check(&MoeShape::GLM5_TP8)
        .unwrap_err();
    assert!(e.reason.contains("shared memory"), "{e}");
}

#[test]
fn report_flags_spills_and_wrong_mma_counts() {
    let c = search_space(MoeOp::Down, &MoeShape::GLM5_TP8)[0];
    let l = layout(&c).unwrap();
    let good = GroupedVariant {
        config: c,
        registers: 100,
        spill_bytes: 0,
        smem_bytes: c.smem_bytes(),
        static_smem: 128,
        threads: c.threads(),
        omma_sf: (l.mma_p * l.mma_q * l.k_steps_per_warp) as usize,
        omma: (l.mma_p * l.mma_q * l.k_steps_per_warp) as usize,
        atomics: 0,
        local_memory: false,
        expected_mma_per_k_tile: l.mma_p * l.mma_q * l.k_steps_per_warp,
    };
    assert!(good.is_clean());
    assert!(!GroupedVariant { spill_bytes: 8, ..good.clone() }.is_clean());
    assert!(!GroupedVariant { omma_sf: 0, omma: 0, ..good.clone() }.is_clean());
    assert!(!GroupedVariant { omma: good.omma + 1, ..good.clone() }.is_clean());
    assert!(!GroupedVariant { local_memory: true, ..good.clone() }.is_clean());
    assert!(!GroupedVariant { static_smem: 4096, ..good.clone() }.is_clean());
    // the split-K counter: only and always where K is split
    assert!(!GroupedVariant { atomics: 1, ..good.clone() }.is_clean());
    let split = search_space(MoeOp::GateUp, &MoeShape::GLM5_TP8)
        .into_iter()
        .find(|c| c.split_k > 1)
        .unwrap();
    let ls = layout(&split).unwrap();
    let mma = (ls.mma_p * ls.mma_q * ls.k_steps_per_warp) as usize;
    let split_good = GroupedVariant {
        config: split,
        smem_bytes: split.smem_bytes(),
        threads: split.threads(),
        omma_sf: mma,
        omma: mma,
        expected_mma_per_k_tile: mma as u32,
        atomics: 1,
        ..good.clone()
    };
    assert!(split_good.is_clean());
    assert!(!GroupedVariant { atomics: 0, ..split_good }.is_clean());
    let report = variant_report(&[Ok(good.clone()), Err("x: broken".into())], "NVRTC 13.0");
    assert!(report.contains("2 variants: 1 compiled, 1 clean"), "{report}");
    assert!(report.contains(&format!("| {} | {} |", c.name(), c.kernel_name())), "{report}");
    assert!(report.contains("- x: broken"), "{report}");
}

/// The CI check of the grouped sm120 family: every distinct kernel of its space compiles for
/// sm_120a, uses the native block-scaled MMA exactly as often as its tile implies, and neither
/// spills nor touches local memory. Needs NVRTC and cuobjdump/nvdisasm (scripts/cuda-tools.sh).
/// `FP4TUNE_SM120_MOE_REPORT=<path>` writes the report.
#[test]
fn every_sm120_grouped_variant_compiles_with_omma_sf_and_no_spills() {
    let compiler = Compiler::with_default_cache().unwrap_or_else(|e| panic!("{e}"));
    // GLM-5 TP8 and EP8, a down K of 192 (Qwen3-235B over 8 GPUs: 64-k stages) and of 176
    // (GLM-4.5-Air over 8 GPUs: the K-tail form)
    let qwen = MoeShape { hidden: 4096, inter: 192, experts: 128, top_k: 8 };
    let air = MoeShape { hidden: 4096, inter: 176, experts: 128, top_k: 8 };
    let configs = distinct_kernels(&[MoeShape::GLM5_TP8, MoeShape::GLM5_EP8, qwen, air]);
    assert!(configs.len() >= 80, "{} kernels", configs.len());
    assert!(configs.iter().any(|c| c.block_k == 64), "no 64-k stage kernel");
    assert!(configs.iter().any(|c| c.k_tail), "no K-tail kernel");
    assert!(configs
        .iter()
        .filter(|c| c.k_tail)
        .all(|c| c.source().code.contains("GroupedSm120Tail<Cfg,")));
    let results = inspect_variants(&compiler, &configs);
    let mut problems = Vec::new();
    for (c, r) in configs.iter().zip(&results) {
        match r {
            Err(e) => problems.push(e.clone()),
            Ok(v) if !v.is_clean() => problems.push(format!("{c}: {v:?}")),
            Ok(_) => {}
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} variants failed:\n{}",
        problems.len(),
        configs.len(),
        problems.join("\n")
    );
    // a relative path is taken from the repository root (tests run in tuner/)
    if let Ok(path) = std::env::var("FP4TUNE_SM120_MOE_REPORT") {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
        let report = variant_report(&results, &format!("NVRTC {}", compiler.nvrtc_build()));
        crate::fsio::write_atomic(&path, report.as_bytes())
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}

/// The grouped kernel's own index math against its mirror, at compile time (as
/// `template::sm120::index_tests` does for the GEMM pieces under it): `sm120_weight_row` against
/// [`weight_row`] over every CTA's weight rows of each op's N, and `GroupedSm120::slot_element`
/// against [`split_element`] over each distinct warp layout's accumulators, for every distinct
/// kernel of the spaces above; a mirror that differs fails the compile naming the function.
#[test]
fn the_grouped_index_math_is_its_cpu_mirror() {
    use crate::template::sm120::index_tests::{compare, compile_checks};
    let qwen = MoeShape { hidden: 4096, inter: 192, experts: 128, top_k: 8 };
    let air = MoeShape { hidden: 4096, inter: 176, experts: 128, top_k: 8 };
    let loops = |v: &[(&str, String)]| -> Vec<String> {
        v.iter().map(|(x, n)| format!("int {x} = 0; {x} < {n}; ++{x}")).collect()
    };
    let render = |slot_off: u32| {
        let mut body = String::new();
        let (mut rows_seen, mut slots_seen) = (Vec::new(), Vec::new());
        for shape in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8, qwen, air] {
            for c in distinct_kernels(&[shape]) {
                let (n, _) = shape.nk(c.op);
                let ns = format!("k{}", rows_seen.len() + slots_seen.len());
                let cfg = gemm::config_type(&gemm_config(&c));
                let op = c.op.template_op();
                if !rows_seen.contains(&(c.op, n, c.block_n)) {
                    rows_seen.push((c.op, n, c.block_n));
                    let mut want = Vec::new();
                    for n0 in (0..n).step_by(c.block_n as usize) {
                        for r in 0..c.block_n {
                            want.push(weight_row(c.op, n, n0, r).map_or(-1, i64::from));
                        }
                    }
                    body.push_str(&format!("namespace {ns}r {{\n"));
                    body.push_str(&compare(
                        "weight_row",
                        &format!("{op}, N {n}, BLOCK_N {}: sm120_weight_row of templates/moe/sm120.cuh differs from moe::sm120::weight_row", c.block_n),
                        &want,
                        &[
                            format!("int n0 = 0; n0 < {n}; n0 += {}", c.block_n),
                            format!("int r = 0; r < {}; ++r", c.block_n),
                        ],
                        &format!("fp4tune::moe::sm120_weight_row<{op}>({n}, n0, r)"),
                    ));
                    body.push_str("}\n");
                }
                let l = layout(&c).expect("a kernel of the space has a layout");
                let key = (l.warps_p * l.warps_q, l.mma_p, l.mma_q, c.op);
                if !slots_seen.contains(&key) {
                    slots_seen.push(key);
                    let warps = l.warps_p * l.warps_q;
                    let mut want = Vec::new();
                    for w in 0..warps {
                        for mp in 0..l.mma_p {
                            for mq in 0..l.mma_q {
                                for i in 0..4 {
                                    for lane in 0..32 {
                                        want.push(split_element(&l, w, mp, mq, i, lane) + slot_off);
                                    }
                                }
                            }
                        }
                    }
                    let runner = if c.k_tail { "GroupedSm120Tail" } else { "GroupedSm120" };
                    body.push_str(&format!("namespace {ns}s {{\nusing Cfg = {cfg};\n"));
                    body.push_str(&compare(
                        "slot_element",
                        &format!("{cfg}: GroupedSm120::slot_element of templates/moe/sm120.cuh differs from moe::sm120::split_element"),
                        &want,
                        &loops(&[
                            ("w", warps.to_string()),
                            ("mp", "Cfg::MMA_P".into()),
                            ("mq", "Cfg::MMA_Q".into()),
                            ("e", "4".into()),
                            ("lane", "32".into()),
                        ]),
                        &format!("fp4tune::moe::{runner}<Cfg, {op}>::slot_element(w, mp, mq, e, lane)"),
                    ));
                    body.push_str("}\n");
                }
            }
        }
        assert!(rows_seen.len() >= 4 && slots_seen.len() >= 4, "{rows_seen:?} {slots_seen:?}");
        body
    };
    let check = |slot_off| {
        compile_checks("fp4tune_sm120_grouped_index_check", "moe/sm120.cuh", &render(slot_off))
    };
    check(0).unwrap_or_else(|e| panic!("{e}"));
    // a mirror one off fails, naming the function
    let e = check(1).expect_err("a mirror that differs must fail the compile");
    assert!(e.contains("slot_element of templates/moe/sm120.cuh differs"), "{e}");
    assert!(!e.contains("sm120_weight_row of"), "{e}");
}
