use super::*;
use crate::moe::space::check_layer;

const SM90_SMS: u32 = 132;
const SM120_SMS: u32 = 188;

/// Routed layers of other models over 8 GPUs (hidden, inter per GPU, experts, top_k) and the
/// model's routed experts, besides GLM-5's two.
fn layers() -> Vec<(&'static str, MoeShape, u32)> {
    let s = |hidden, inter, experts, top_k| MoeShape { hidden, inter, experts, top_k };
    let tp = |name, shape: MoeShape| (name, shape, shape.experts);
    vec![
        tp("glm5-tp8", MoeShape::GLM5_TP8),
        ("glm5-ep8", MoeShape::GLM5_EP8, 256),
        tp("deepseek-v3-tp8", s(7168, 256, 256, 8)),
        tp("qwen3-235b-tp8", s(4096, 192, 128, 8)),
        tp("qwen3-30b-a3b-tp8", s(2048, 96, 128, 8)),
        tp("qwen3-next-tp8", s(2048, 64, 512, 10)),
        tp("glm-4.5-air-tp8", s(4096, 176, 128, 8)),
        tp("mixtral-tp8", s(4096, 1792, 8, 2)),
        ("mixtral-ep8", s(4096, 14336, 1, 2), 8),
    ]
}

fn families() -> [(Family, AType, u32); 3] {
    [
        (Family::Sm90, AType::Bf16, SM90_SMS),
        (Family::Sm90, AType::Nvfp4, SM90_SMS),
        (Family::Sm120, AType::Nvfp4, SM120_SMS),
    ]
}

/// On the layer they were tuned on, the sm90 defaults are the committed H200 table's grouped
/// entries at every bucket, both activation types and ops.
#[test]
fn the_glm5_tp8_defaults_are_the_h200_tables_picks() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/nvidia-h200.ron");
    let table = crate::table::Table::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut compared = 0;
    for a_type in [AType::Bf16, AType::Nvfp4] {
        let defaults =
            default_routes(Family::Sm90, a_type, &MoeShape::GLM5_TP8, 256, SM90_SMS).unwrap();
        for e in table.moe.iter().filter(|e| e.key.a_type == a_type) {
            assert_eq!(e.key.shape(), MoeShape::GLM5_TP8);
            let d = defaults
                .iter()
                .find(|(op, b, _)| *op == e.key.op && *b == e.key.tokens)
                .unwrap_or_else(|| panic!("no default at {} B = {}", e.key.op, e.key.tokens));
            assert_eq!(d.2, e.config, "{a_type} {} B = {}", e.key.op, e.key.tokens);
            compared += 1;
        }
    }
    assert_eq!(compared, 2 * 2 * DEFAULT_BUCKETS.len());
}

/// Every layer a family's kernels run has a default at every bucket of both ops, each a member
/// of the layer's search space (legal, and what a tune would measure); a layer they cannot run
/// is refused with `check_layer`'s line.
#[test]
fn every_layer_a_family_runs_has_legal_defaults_at_every_bucket() {
    let mut layers_with_defaults = 0;
    for (family, a_type, sms) in families() {
        for (name, shape, total) in layers() {
            let r = default_routes(family, a_type, &shape, total, sms);
            match check_layer(family, a_type, &shape) {
                Err(why) => assert_eq!(r, Err(why), "{name} {family} {a_type}"),
                Ok(()) => {
                    let r = r.unwrap_or_else(|e| panic!("{name} {family} {a_type}: {e}"));
                    assert_eq!(r.len(), 2 * DEFAULT_BUCKETS.len());
                    for (op, b, c) in &r {
                        let space = search_space_for(family, a_type, *op, &shape);
                        assert!(space.contains(c), "{name} {family} {a_type} {op} B = {b}: {c}");
                        assert_eq!((c.op, c.family, c.a_type), (*op, family, a_type));
                    }
                    for op in MoeOp::ALL {
                        let buckets: Vec<u32> =
                            r.iter().filter(|x| x.0 == op).map(|x| x.1).collect();
                        assert_eq!(buckets, DEFAULT_BUCKETS, "{name} {op}");
                    }
                    layers_with_defaults += 1;
                }
            }
        }
    }
    // every layer runs on W4A16 sm90 and W4A4 sm120; W4A4 sm90 needs K a multiple of 128
    assert!(layers_with_defaults >= 2 * layers().len() + 3, "{layers_with_defaults}");
}

/// More routed rows per expert never take a smaller tile list (the defaults grow with the step),
/// and the sm90 W4A16 defaults go from the streamed kernels to the tiled ones as the H200 picks
/// do (from 8 rows per expert) and to wgmma at the largest bucket.
#[test]
fn defaults_grow_with_the_rows_per_expert() {
    for (family, a_type, sms) in families() {
        for (name, shape, total) in layers() {
            let Ok(r) = default_routes(family, a_type, &shape, total, sms) else { continue };
            for op in MoeOp::ALL {
                let ms: Vec<u32> = r.iter().filter(|x| x.0 == op).map(|x| x.2.block_m).collect();
                assert!(
                    ms.windows(2).all(|w| w[0] <= w[1]),
                    "{name} {family} {a_type} {op} {ms:?}"
                );
            }
        }
    }
    let (_, qwen, total) = layers()[4];
    let r = default_routes(Family::Sm90, AType::Bf16, &qwen, total, SM90_SMS).unwrap();
    let at = |op, b| r.iter().find(|x| x.0 == op && x.1 == b).unwrap().2;
    // Qwen3-30B-A3B: 128 experts, top-8: B / 16 rows per expert
    assert!(!at(MoeOp::GateUp, 64).tiled && at(MoeOp::GateUp, 64).block_m == 8);
    assert!(at(MoeOp::GateUp, 128).tiled, "{}", at(MoeOp::GateUp, 128));
    assert!(at(MoeOp::GateUp, 4096).wgmma, "{}", at(MoeOp::GateUp, 4096));
}

/// sm120 gate_up splits K while the step's tiles are fewer than the SMs: GLM-5 TP8 at B = 1 has
/// 8 experts x 8 tiles of 64 weight rows (4 CTAs each on 188 SMs), at B = 2 16 x 8 (2 each), and
/// from B = 32 every expert's 8 tiles (no split).
#[test]
fn sm120_gate_up_splits_k_for_the_few_tiles_of_a_small_step() {
    let r =
        default_routes(Family::Sm120, AType::Nvfp4, &MoeShape::GLM5_TP8, 256, SM120_SMS).unwrap();
    let split = |b| r.iter().find(|x| x.0 == MoeOp::GateUp && x.1 == b).unwrap().2.split_k;
    assert_eq!((split(1), split(2), split(4), split(32), split(256)), (4, 2, 1, 1, 1));
    assert!(r.iter().filter(|x| x.0 == MoeOp::Down).all(|x| x.2.split_k == 1));
    // Qwen3-Next (K = 2048: 4 k-tiles of 128 per slice of 4, fewer than the template's 6 stages)
    // keeps its 4 slices at B = 1, in a ring as deep as a slice's k-tiles
    let (_, next, total) = layers()[5];
    let r = default_routes(Family::Sm120, AType::Nvfp4, &next, total, SM120_SMS).unwrap();
    let c = r.iter().find(|x| x.0 == MoeOp::GateUp && x.1 == 1).unwrap().2;
    assert_eq!((c.split_k, c.depth), (4, 4), "{c}");
}

/// An expert-parallel layer's defaults follow the rows per expert of the whole model's routing:
/// GLM-5 over 8 GPUs by experts (32 of 256 per GPU) routes each local expert B / 32 rows, as
/// tensor parallelism does, so its sm90 defaults start from the TP8 layer's picks at the same B
/// (on an H100 the EP8 step measured fastest with those kernels at B = 64 and 512,
/// `results/h100/bench-moe-untuned.md`); counted as if all 32 were the model's, they would
/// expect 8 times the rows and take larger tiles. An `experts_total` below the layer's experts
/// is refused.
#[test]
fn an_expert_parallel_layer_takes_the_rows_per_expert_of_the_whole_model() {
    let ep8 = MoeShape::GLM5_EP8;
    let at = |total, a_type, op, b| {
        let r = default_routes(Family::Sm90, a_type, &ep8, total, SM90_SMS).unwrap();
        r.into_iter().find(|x| x.0 == op && x.1 == b).unwrap().2
    };
    for (b, name) in [
        (64, "moe_gate_up_m8n32k512_w1x4_pa3_s1_o4_walk0"),
        (128, "moe_gate_up_m8n32k512_w1x4_pa3_s1_o4_walk0"),
        (512, "moe_gate_up_m32n64k128_w1x2x1_t4_s1_o1_walk0"),
    ] {
        assert_eq!(at(256, AType::Bf16, MoeOp::GateUp, b).name(), name, "B = {b}");
    }
    let local = at(32, AType::Bf16, MoeOp::GateUp, 64);
    assert!(local.tiled && local.block_m >= 16, "{local}");
    // every bucket: the TP8 template (for the down projection's long K and few active experts
    // adapted by `fit_down_template`), nearest in the EP8 layer's space
    for a_type in [AType::Bf16, AType::Nvfp4] {
        for op in MoeOp::ALL {
            let space = search_space_for(Family::Sm90, a_type, op, &ep8);
            for b in DEFAULT_BUCKETS {
                let tp8 = Routed::new(&MoeShape::GLM5_TP8, 256, b);
                let t = sm90_template(a_type, op, tp8.per_expert);
                let t = fit_down_template(t, &ep8, &Routed::new(&ep8, 256, b), SM90_SMS, true);
                assert_eq!(at(256, a_type, op, b), nearest(&t, &space), "{a_type} {op} B = {b}");
            }
        }
    }
    // sm120: 2 routed rows per expert at B = 64 fit 8-row tiles; 16 would take 32-row ones
    let sm120 = |total| {
        let r = default_routes(Family::Sm120, AType::Nvfp4, &ep8, total, SM120_SMS).unwrap();
        r.into_iter().find(|x| x.0 == MoeOp::Down && x.1 == 64).unwrap().2.block_m
    };
    assert_eq!((sm120(256), sm120(32)), (8, 32));
    let e = default_routes(Family::Sm90, AType::Bf16, &ep8, 31, SM90_SMS).unwrap_err();
    assert!(e.contains("(31) are fewer than the layer's 32 local experts"), "{e}");
}

/// A decode step that touches few experts gets narrower down tiles: Mixtral over 8 GPUs (2 of 8
/// experts at B = 1, N = 4096, K = 1792) 32-row CTAs instead of the GLM-5 TP8 row's 128 (about 57
/// CTAs on 132 SMs), GLM-5 EP8 at B = 4 64-row ones, each at 16 rows per warp; a tile's K of
/// more than one pass gets a register ring of two stages. Enough CTAs (GLM-5 TP8 at every B, EP8
/// from B = 8) or 16-row tiles (Mixtral at B = 64) keep the row as it is.
#[test]
fn a_step_of_few_experts_gets_narrower_down_tiles() {
    let down = |a_type, shape: &MoeShape, total, b| {
        let r = default_routes(Family::Sm90, a_type, shape, total, SM90_SMS).unwrap();
        r.into_iter().find(|x| x.0 == MoeOp::Down && x.1 == b).unwrap().2
    };
    let w4a16 = |shape: &MoeShape, total, b| down(AType::Bf16, shape, total, b);
    let mixtral = MoeShape { hidden: 4096, inter: 1792, experts: 8, top_k: 2 };
    // B = 1: 2 of 8 experts, 32-row tiles, the K of 1792 in one pass over 2 x 2 warps, the
    // flowing warp ring (the fastest measured Mixtral TP8 down kernel at B = 1)
    let c = w4a16(&mixtral, 8, 1);
    assert_eq!(c.name(), "moe_down_m8n32k1792_w2x2_pf4_s1_o2_walk4");
    // W4A4 keeps the register ring (the activations' codes do not ride in the warp ring)
    let c = down(AType::Nvfp4, &mixtral, 8, 1);
    assert_eq!((c.block_n, c.block_k, c.warps_k, c.warp_ring), (32, 1792, 2, false), "{c}");
    assert_eq!(w4a16(&mixtral, 8, 64).block_n, 128);
    let ep8 = MoeShape::GLM5_EP8;
    // B = 4: about 4 of 32 local experts, 64-row tiles in passes of 256 k, two register stages
    let c = w4a16(&ep8, 256, 4);
    assert_eq!(
        (c.block_n, c.warps_n, c.block_k, c.depth, c.warp_ring),
        (64, 4, 256, 2, false),
        "{c}"
    );
    // B = 1 and 2: about 1 and 2 experts, the whole K of 2048 per tile over split warps
    for b in [1, 2] {
        let c = w4a16(&ep8, 256, b);
        assert_eq!((c.block_n, c.block_k, c.warps_k, c.flow), (32, 2048, 2, true), "B = {b}: {c}");
    }
    assert_eq!(w4a16(&ep8, 256, 8).block_n, 128);
    // one expert per GPU (Mixtral over 8 GPUs by experts): K = 14336 split over the warps
    let one = MoeShape { hidden: 4096, inter: 14336, experts: 1, top_k: 2 };
    let c = w4a16(&one, 8, 8);
    assert_eq!((c.block_n, c.block_k, c.warps_k, c.flow), (32, 14336, 2, true), "{c}");
    for b in DEFAULT_BUCKETS {
        let tp8 = Routed::new(&MoeShape::GLM5_TP8, 256, b);
        for a_type in [AType::Bf16, AType::Nvfp4] {
            let t = sm90_template(a_type, MoeOp::Down, tp8.per_expert);
            let fitted = fit_down_template(t, &MoeShape::GLM5_TP8, &tp8, SM90_SMS, true);
            assert_eq!(fitted, t, "{a_type} B = {b}");
        }
    }
}

/// The whole-K form splits the K over 2 warps only where each keeps whole chunks (K = 1408 is 11
/// chunks: one warp), and a layer without streamed kernels for the op (K = 2880, not a multiple
/// of 128) keeps the narrowed template's ring: its tiled default is the one nearest to it.
#[test]
fn the_whole_k_form_keeps_to_whole_chunks_and_streamed_layers() {
    let fit = |shape: &MoeShape, total, b, streamed| {
        let routed = Routed::new(shape, total, b);
        let t = sm90_template(AType::Bf16, MoeOp::Down, routed.per_expert);
        fit_down_template(t, shape, &routed, SM90_SMS, streamed)
    };
    let ep8 = MoeShape::GLM5_EP8;
    let c = fit(&ep8, 256, 1, true);
    assert_eq!((c.block_k, c.warps_k, c.flow), (2048, 2, true), "{c}");
    // 16 local of 128 experts, K = 1408 (GLM-4.5-Air's experts over 8 GPUs by experts)
    let k1408 = MoeShape { hidden: 4096, inter: 1408, experts: 16, top_k: 8 };
    let c = fit(&k1408, 128, 1, true);
    assert_eq!((c.block_k, c.warps_k, c.flow), (1408, 1, true), "{c}");
    // 16 local of 128 experts of 2880 x 2880 (gpt-oss's over 8 GPUs by experts): tiled only
    let k2880 = MoeShape { hidden: 2880, inter: 2880, experts: 16, top_k: 4 };
    let c = fit(&k2880, 128, 1, false);
    assert_eq!((c.block_k, c.warps_k, c.flow, c.depth), (256, 1, false, 2), "{c}");
    let space = search_space_for(Family::Sm90, AType::Bf16, MoeOp::Down, &k2880);
    assert!(space.iter().all(|c| c.tiled));
    let r = default_routes(Family::Sm90, AType::Bf16, &k2880, 128, SM90_SMS).unwrap();
    for (op, b, d) in r.into_iter().filter(|x| x.1 <= 8) {
        assert_eq!(d.depth, 3, "{op} B = {b}: {d}");
    }
}

/// A W4A16 gate_up step with fewer CTAs than SMs gets 16-row tiles and a 4-stage warp ring at 4
/// CTAs per SM; GLM-5 TP8 (126 CTAs at B = 1), W4A4 and steps of more CTAs keep their template.
#[test]
fn a_gate_up_step_of_few_ctas_gets_16_row_tiles() {
    let gate_up = |a_type, shape: &MoeShape, b| {
        let r = default_routes(Family::Sm90, a_type, shape, shape.experts, SM90_SMS).unwrap();
        r.into_iter().find(|x| x.0 == MoeOp::GateUp && x.1 == b).unwrap().2
    };
    let qwen3_235b = MoeShape { hidden: 4096, inter: 192, experts: 128, top_k: 8 };
    let c = gate_up(AType::Bf16, &qwen3_235b, 1);
    assert_eq!(c.name(), "moe_gate_up_m8n16k512_w1x4_pa4_s1_o4_walk2");
    // B = 2: about 15 of 128 experts x 12 n-tiles of 32 rows, more CTAs than SMs
    assert_eq!(gate_up(AType::Bf16, &qwen3_235b, 2).block_n, 32);
    let qwen3_next = MoeShape { hidden: 2048, inter: 64, experts: 512, top_k: 10 };
    assert_eq!(gate_up(AType::Bf16, &qwen3_next, 2).block_n, 16);
    for b in DEFAULT_BUCKETS {
        let tp8 = Routed::new(&MoeShape::GLM5_TP8, 256, b);
        for a_type in [AType::Bf16, AType::Nvfp4] {
            let t = sm90_template(a_type, MoeOp::GateUp, tp8.per_expert);
            let fitted = fit_gate_up_template(t, &MoeShape::GLM5_TP8, &tp8, SM90_SMS, true);
            assert_eq!(fitted, t, "{a_type} B = {b}");
        }
    }
    // W4A4: no rule (unmeasured); a fitted W4A4 template would keep its 32 rows
    let routed = Routed::new(&qwen3_235b, 128, 1);
    let t = sm90_template(AType::Nvfp4, MoeOp::GateUp, routed.per_expert);
    assert_eq!(fit_gate_up_template(t, &qwen3_235b, &routed, SM90_SMS, true), t);
}

/// A ring depth the layer's K does not take is replaced at the same stages in flight per SM: the
/// GLM-5 gate_up row of 3 stages at 4 CTAs per SM (K = 6144: 12 chunks of 128 per warp) becomes
/// 4 stages at 3 CTAs on a K of 4096 (8 chunks), not 2 at 4.
#[test]
fn a_replaced_depth_keeps_the_stages_in_flight() {
    let shape = MoeShape { hidden: 4096, inter: 192, experts: 128, top_k: 8 };
    let r = default_routes(Family::Sm90, AType::Bf16, &shape, 128, SM90_SMS).unwrap();
    let c = r.into_iter().find(|x| x.0 == MoeOp::GateUp && x.1 == 8).unwrap().2;
    assert_eq!((c.a_smem, c.depth, c.min_ctas), (true, 4, 3), "{c}");
}

/// The nearest member of a space is the template itself when present, and a form change costs
/// more than any size change.
#[test]
fn the_distance_puts_the_kernel_form_first() {
    let space = search_space_for(Family::Sm90, AType::Bf16, MoeOp::GateUp, &MoeShape::GLM5_TP8);
    let t = space[0];
    assert_eq!(nearest(&t, &space), t);
    assert_eq!(distance(&t, &t), 0.0);
    let tiled = space.iter().find(|c| c.tiled).unwrap();
    let resized = space.iter().find(|c| !c.tiled && c.block_m == 32 && c.block_n != t.block_n);
    assert!(distance(&t, tiled) > distance(&t, resized.unwrap()));
}

/// Every distinct default kernel of the GLM-5 layers and of three other models' compiles with
/// this NVRTC without spills or local memory (ptxas report and SASS), for sm_90a and sm_120a:
/// a layer without a table never loads a spilling default. Needs NVRTC and cuobjdump
/// (scripts/cuda-tools.sh).
#[test]
fn default_kernels_compile_without_local_memory() {
    let mut configs: Vec<GroupedConfig> = Vec::new();
    for (family, a_type, sms) in families() {
        for (_, shape, total) in layers().into_iter().filter(|(n, _, _)| {
            [
                "glm5-tp8",
                "glm5-ep8",
                "deepseek-v3-tp8",
                "qwen3-30b-a3b-tp8",
                "mixtral-tp8",
                "mixtral-ep8",
            ]
            .contains(n)
        }) {
            let Ok(r) = default_routes(family, a_type, &shape, total, sms) else { continue };
            for (_, _, c) in r {
                // the walks share one kernel
                let c = GroupedConfig { walk: 0, ..c };
                if !configs.contains(&c) {
                    configs.push(c);
                }
            }
        }
    }
    let kernels: Vec<_> = configs.iter().map(|c| (c.to_string(), c.source())).collect();
    let problems = crate::compile::sass::kernels_with_local_memory(&kernels);
    assert!(problems.is_empty(), "default kernels with local memory:\n{}", problems.join("\n"));
}
