//! Tests of the fused decode layer: its routing mirror against moe_align's schedule, its
//! configuration checks, and its kernels compiling for sm_90a without spills.

use super::*;
use crate::compile::Compiler;
use crate::moe::schedule::{draw_routing, Routing, SplitMix64};
use crate::moe::RouteSchedule;

/// The kernel's routing gives moe_align's sorted rows, inverse and 8-row tile list, for
/// uniform, skewed, shared-expert and expert-parallel routings, top_k 1 to 8, up to 64 ids,
/// and router outputs with repeated or out-of-range ids.
#[test]
fn the_layer_routing_is_moe_aligns_schedule() {
    let mut rng = SplitMix64(11);
    let mut cases = 0;
    for (experts_total, top_k) in [(256u32, 8u32), (32, 8), (128, 1), (64, 4), (8, 2)] {
        for form in [Routing::Uniform, Routing::Skewed, Routing::SharedLast] {
            for tokens in 1..=(LAYER_MAX_IDS / top_k) {
                let mut ids = draw_routing(rng.next_u64(), tokens, top_k, experts_total, form);
                if rng.below(4) == 0 {
                    // repeated ids and ids of no expert at all
                    let i = rng.below(ids.len() as u32) as usize;
                    ids[i] = ids[0];
                    let j = rng.below(ids.len() as u32) as usize;
                    ids[j] = if rng.below(2) == 0 { -1 } else { experts_total as i32 + 5 };
                }
                // the whole range, and one GPU's share of an eight-way expert split
                let share = (experts_total / 8).max(1);
                for (begin, experts) in [(0, experts_total), ((share * 3) as i32, share)] {
                    let want = RouteSchedule::build(&ids, begin, experts);
                    let got = routing(&ids, top_k, begin, experts);
                    assert_eq!(got.flat, want.sorted_ids, "{tokens} x {top_k}, {form:?}");
                    assert_eq!(got.pos, want.inverse, "{tokens} x {top_k}, {form:?}");
                    let list: Vec<_> =
                        want.tiles[0].iter().map(|t| (t.expert, t.first_row, t.rows)).collect();
                    assert_eq!(got.tiles, list, "{tokens} x {top_k}, {form:?}, {ids:?}");
                    for t in 0..tokens as usize {
                        let n = (0..top_k as usize)
                            .filter(|&s| want.inverse[t * top_k as usize + s] >= 0)
                            .count() as u32;
                        assert_eq!(got.local[t], n);
                    }
                    cases += 1;
                }
            }
        }
    }
    assert!(cases > 200, "{cases}");
}

#[test]
fn the_glm5_layers_take_the_fused_form_up_to_64_routed_ids() {
    for shape in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8] {
        let c = LayerConfig::default_for(&shape).expect("a fused form");
        c.check(&shape).unwrap();
        assert_eq!(c.threads(), 128);
        assert_eq!(c.grid(132), (1, 132 * c.min_ctas(), 1));
        assert!(LayerConfig::takes(&shape, 1) && LayerConfig::takes(&shape, 8));
        assert!(!LayerConfig::takes(&shape, 9) && !LayerConfig::takes(&shape, 0));
    }
    let c = LayerConfig::default_for(&MoeShape::GLM5_TP8).unwrap();
    assert_eq!(
        c.name(),
        "moe_layer_gate_up_m8n16k512_w1x4_pa4_s1_o4__down_m8n192k256_w4x1_p3_s1_o4"
    );
    assert_eq!(LayerConfig::candidates(&MoeShape::GLM5_TP8).len(), 4);
    assert!(c.kernel_name().starts_with("fp4tune_sm90_moe_layer_"));
    let unit = c.instantiation();
    assert!(unit.contains("#include \"moe/layer.cuh\""), "{unit}");
    assert!(
        unit.contains("fp4tune::moe::DecodeLayer<fp4tune::moe::GroupedConfig<8, 16, 512"),
        "{unit}"
    );
    assert!(unit.contains("sizeof(fp4tune::moe::LayerParams) == 128"), "{unit}");
    // top-1 routings take up to 64 tokens; a hidden size 512 does not divide takes none
    let top1 = MoeShape { top_k: 1, ..MoeShape::GLM5_TP8 };
    assert!(LayerConfig::takes(&top1, 64) && !LayerConfig::takes(&top1, 65));
    assert!(LayerConfig::default_for(&MoeShape { hidden: 2880, ..MoeShape::GLM5_TP8 }).is_none());
    assert_eq!(counter_words(6144), 1 + 2 * 64 + 64 * 96);
}

/// What the checks refuse: tiles of other forms, CTA sizes that differ, narrow down blocks.
#[test]
fn the_layer_check_refuses_tiles_it_cannot_run() {
    let shape = MoeShape::GLM5_TP8;
    let good = LayerConfig::default_for(&shape).unwrap();
    let reason = |c: LayerConfig| c.check(&shape).unwrap_err().reason;
    let no_pa = GroupedConfig { a_smem: false, depth: 2, ..good.gate_up };
    assert!(
        reason(LayerConfig { gate_up: no_pa, ..good }).contains("warp ring with the activations")
    );
    let register_down = GroupedConfig { warp_ring: false, block_n: 64, ..good.down };
    let r = reason(LayerConfig { down: register_down, ..good });
    assert!(r.contains("warp ring of weights"), "{r}");
    let wide = GroupedConfig { block_n: 96, warps_n: 2, ..good.down };
    assert!(reason(LayerConfig { down: wide, ..good }).contains("one CTA size"));
    let m16 = GroupedConfig { block_m: 16, min_ctas: 2, ..good.gate_up };
    let r = reason(LayerConfig { gate_up: m16, ..good });
    assert!(r.contains("8 routed rows"), "{r}");
    let swapped = LayerConfig { gate_up: good.down, down: good.gate_up };
    assert!(swapped.check(&shape).is_err());
    let w4a4 = GroupedConfig { a_type: AType::Nvfp4, ..good.down };
    assert!(reason(LayerConfig { down: w4a4, ..good }).contains("W4A16"));
}

/// The fused kernels the GLM-5 layers screen compile for sm_90a and neither spill nor touch a
/// stack frame (NVRTC, as every grouped kernel the tunes compile).
#[test]
fn the_fused_layer_kernels_compile_without_spills() {
    let compiler = Compiler::with_default_cache().unwrap_or_else(|e| panic!("{e}"));
    for c in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8].iter().flat_map(LayerConfig::candidates) {
        let k = compiler.compile(&c.source()).unwrap_or_else(|e| panic!("{c}: {e}"));
        let stats = k.stats.as_ref().expect("ptxas reports the kernel");
        assert_eq!((stats.spill_stores, stats.spill_loads), (0, 0), "{c}: {stats:?}");
        assert!(stats.registers <= 65536 / (c.threads() * c.min_ctas()), "{c}: {stats:?}");
        assert!(stats.static_smem <= STATIC_SMEM, "{c}: {stats:?}");
        // and the stand-alone kernels of its four-launch pair (the bits it is checked against)
        let (gate_up, down) = c.four_launch_pair();
        for g in [gate_up, down] {
            let k = compiler.compile(&g.source()).unwrap_or_else(|e| panic!("{g}: {e}"));
            assert!(!k.spills(), "{g}: {:?}", k.stats);
        }
    }
}
