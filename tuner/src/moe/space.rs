//! The grouped search space as data: per family, activation type, op and layer shape, every
//! legal combination of the value lists below (`GroupedConfig::check` prunes it), and the distinct
//! kernels of a space.

use super::config::{GroupedConfig, MoeOp};
use super::MoeShape;
use crate::problem::AType;
use crate::template::Family;

/// The grouped search space of family sm90 with bf16 activations (W4A16) for one op and shape.
pub fn search_space(op: MoeOp, shape: &MoeShape) -> Vec<GroupedConfig> {
    search_space_for(Family::Sm90, AType::Bf16, op, shape)
}

/// A family's representative grouped configurations of one activation type and op on `shape`
/// (`fp4tune compile --configs representative`): the first measured seed legal for the shape,
/// else the space's first configuration; sm120 gate_up also its first configuration split along
/// K. Empty where the family has no grouped kernels of `a_type`.
pub fn representative(
    family: Family,
    a_type: AType,
    op: MoeOp,
    shape: &MoeShape,
) -> Vec<GroupedConfig> {
    let space = search_space_for(family, a_type, op, shape);
    let first = super::seeds::measured_seeds(family, a_type, op)
        .into_iter()
        .find(|c| c.check(shape).is_ok())
        .or_else(|| space.iter().find(|c| c.split_k == 1).copied());
    let mut out: Vec<GroupedConfig> = first.into_iter().collect();
    if family == Family::Sm120 {
        out.extend(space.iter().find(|c| c.split_k > 1).copied());
    }
    out
}

/// The grouped search space of one family and activation type for one op and shape: every legal
/// combination of the value lists below (the space is data; `check` prunes it). Family sm120 has
/// W4A4 only (`super::sm120::search_space`); other combinations are empty.
pub fn search_space_for(
    family: Family,
    a_type: AType,
    op: MoeOp,
    shape: &MoeShape,
) -> Vec<GroupedConfig> {
    if family == Family::Sm120 {
        return if a_type == AType::Nvfp4 {
            super::sm120::search_space(op, shape)
        } else {
            Vec::new()
        };
    }
    let (_, k) = shape.nk(op);
    let mut out = Vec::new();
    // (block_n, warps_n) pairs, warps_k, split_k, register-ring depths, warp-ring stages
    // (bf16: also with the activations in the warp ring, `a_smem`), the stages of that ring when
    // it runs on across tiles (`flow`, taken where the depth does not divide a tile's chunks),
    // min_ctas and walk values per op.
    struct Lists {
        tiles: &'static [(u32, u32)],
        warps_k: &'static [u32],
        splits: &'static [u32],
        depths: &'static [u32],
        stages: &'static [u32],
        flow_stages: &'static [u32],
        min_ctas: &'static [u32],
        walks: &'static [u32],
    }
    let lists = match (op, a_type) {
        // long K: many warps along K (in-CTA reduction), 1-2 K slices
        (MoeOp::GateUp, AType::Bf16) => Lists {
            tiles: &[(16, 1), (32, 1), (64, 2), (64, 4)],
            warps_k: &[4, 8, 16],
            splits: &[1, 2],
            depths: &[1, 2, 3],
            stages: &[2, 3, 4],
            flow_stages: &[3, 4, 5],
            // 3 CTAs per SM: the register cap that fits 3- and 4-stage warp rings with their
            // activation register ring, which spill at 4
            min_ctas: &[1, 2, 3, 4],
            walks: &[0, 1, 2],
        },
        // W4A4: 32 or 64 weight rows per warp (whole 16-column blocks of H); NVFP4 activations
        // take a third of the ring's registers, so the ring can be deeper
        (MoeOp::GateUp, AType::Nvfp4) => Lists {
            tiles: &[(32, 1), (64, 2), (64, 1)],
            warps_k: &[4, 8],
            splits: &[1, 2],
            depths: &[1, 2, 4],
            stages: &[4],
            flow_stages: &[],
            min_ctas: &[1, 2, 4],
            walks: &[0, 2],
        },
        // short K: many weight rows per CTA (up to 64 per warp, fewer tiles per weight byte), a
        // persistent walk
        (MoeOp::Down, AType::Bf16) => Lists {
            tiles: &[(32, 2), (64, 4), (128, 2), (128, 4), (128, 8), (256, 4), (256, 8)],
            warps_k: &[1, 2],
            splits: &[1],
            depths: &[1, 2],
            stages: &[2],
            // rings across tiles: deeper than a short K's 2 chunks per warp and tile (TP8), or of
            // a depth that does not divide a longer K's chunks (EP8)
            flow_stages: &[3, 4, 5],
            min_ctas: &[1, 2, 3, 4],
            walks: &[0, 2, 4],
        },
        (MoeOp::Down, AType::Nvfp4) => Lists {
            tiles: &[(32, 2), (64, 4), (128, 4), (128, 8)],
            warps_k: &[1, 2],
            splits: &[1],
            depths: &[1, 2],
            stages: &[2],
            flow_stages: &[],
            min_ctas: &[1, 2, 4],
            walks: &[0, 2, 4],
        },
    };
    let Lists { tiles, warps_k, splits, depths, stages, flow_stages, min_ctas, walks } = lists;
    // (warp_ring, a_smem, flow, depth)
    let mut rings: Vec<(bool, bool, bool, u32)> =
        depths.iter().map(|&d| (false, false, false, d)).collect();
    rings.extend(stages.iter().map(|&d| (true, false, false, d)));
    if a_type == AType::Bf16 {
        rings.extend(stages.iter().map(|&d| (true, true, false, d)));
        rings.extend(flow_stages.iter().map(|&d| (true, true, true, d)));
    }
    for block_m in [8, 16, 32] {
        for &(block_n, warps_n) in tiles {
            for &wk in warps_k {
                for &split_k in splits {
                    // one pass per K slice when it fits, else the smallest legal pass (W4A4:
                    // passes of 256 k per warp)
                    let slice = k / split_k;
                    let passes: &[u32] = if a_type == AType::Nvfp4 {
                        &[slice, 256 * wk]
                    } else {
                        &[slice, 128 * wk, 256 * wk]
                    };
                    for &block_k in passes {
                        for &(warp_ring, a_smem, flow, depth) in &rings {
                            for &mc in min_ctas {
                                for &walk in walks {
                                    let row = (
                                        op,
                                        a_type,
                                        [block_m, block_n, block_k],
                                        [warps_n, wk],
                                        (warp_ring, a_smem, flow),
                                        depth,
                                        split_k,
                                        mc,
                                        walk,
                                    );
                                    let c = GroupedConfig::streamed(family, row);
                                    // a ring whose depth divides the tile's chunks runs the
                                    // same without flow
                                    let twin = GroupedConfig { flow: false, ..c };
                                    if flow && twin.check(shape).is_ok() {
                                        continue;
                                    }
                                    if c.check(shape).is_ok() && !out.contains(&c) {
                                        out.push(c);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if a_type == AType::Bf16 {
        out.extend(tiled_space(op, shape));
        out.extend(super::wgmma::space(op, shape));
    }
    out
}

/// K up to which the tiled kernel's space also has 64-k stages: a short K (the down projection
/// of an expert split over 8 GPUs) runs at most 4 stages of 128 per tile, and stages of 64 give
/// the pipeline more of them with fewer registers (on the H200 the GLM-5 TP8 down at B = 1024
/// went from 219.2 to 205.4 us with them: `results/h200/moe-targets.md`).
pub const TILED_K64_MAX_K: u32 = 512;

/// CTAs per SM the tiled kernel's 64 x 128 tile of four warps also comes compiled for with its
/// 64-k stages (not in the K-tail form, which spills there): at 1 (its launch bounds' default) it
/// holds 181-188 registers per thread and 2
/// CTAs (8 warps) per SM; capped for 3 CTAs, ptxas fits it in 168 registers without spilling
/// (sm_90a), and three CTAs' stages fit the SM's shared memory, for 12 warps per SM where the
/// short-K down projection at prefill sizes is bound by latency at 8.
pub const TILED_K64_MIN_CTAS: u32 = 3;

/// What the grouped kernels of a family and activation type take, for the message of a layer
/// they cannot run (the rules of `GroupedConfig::check` and the spaces' value lists; a test
/// probes them against the spaces over both projections' K).
fn kernel_rules(family: Family, a_type: AType) -> &'static str {
    match (family, a_type) {
        (Family::Sm90, AType::Bf16) => {
            "its tiled kernel takes K a multiple of 16 (its wgmma kernel a multiple of 64, its \
             streamed kernels a multiple of 128 times their warps along K, from 256) and N a \
             multiple of 16"
        }
        (Family::Sm90, AType::Nvfp4) => {
            "its streamed kernels take K a multiple of 128 times their warps along K, from 256 \
             (down: 1 or 2 warps, so a multiple of 128; gate_up: 4 or 8, so a multiple of 512), \
             N a multiple of 16 and gate_up's intermediate size a multiple of 16"
        }
        (Family::Sm120, AType::Nvfp4) => {
            "its kernels take K a multiple of 16 (in the K-tail form where 64 does not divide \
             it), N a multiple of 16 and gate_up's intermediate size a multiple of 16"
        }
        (Family::Sm120, AType::Bf16) => "family sm120 has no W4A16 grouped kernels (W4A4 only)",
    }
}

/// Whether both projections of `shape` have grouped kernels of `family` with activations
/// `a_type`; else one line naming the projection, its N and K, and what the kernels take. The
/// grouped tune and benchmark check it before they measure the layer.
pub fn check_layer(family: Family, a_type: AType, shape: &MoeShape) -> Result<(), String> {
    if shape.experts == 0 || shape.experts > super::schedule::MAX_EXPERTS || shape.top_k == 0 {
        return Err(format!(
            "{shape}: the grouped layer takes 1 to {} local experts and a top_k of at least 1",
            super::schedule::MAX_EXPERTS
        ));
    }
    for op in MoeOp::ALL {
        if search_space_for(family, a_type, op, shape).is_empty() {
            let (n, k) = shape.nk(op);
            return Err(format!(
                "no {family} {a_type} grouped kernel runs {op} of {shape} (N = {n}, K = {k}): {}",
                kernel_rules(family, a_type)
            ));
        }
    }
    Ok(())
}

/// Routed rows per active expert from which a grouped screen measures every tiled configuration
/// ([`GroupedConfig::tiled`]); below it their tiles of 16 or 32 rows are mostly empty.
pub const TILED_MIN_ROWS_PER_EXPERT: u32 = 4;
/// Routed rows per active expert from which a grouped screen measures the wgmma configurations
/// ([`GroupedConfig::wgmma`]) among the tiled ones: their tiles have 32 to 128 rows, mostly empty
/// below 16 rows per expert. On the H200 the best of them is still 1.39-1.51x slower than the
/// best other configuration at 32 and 64 rows per expert, even at 128 and faster only from 256
/// (EP8 W4A16, both ops, `results/h200/nvidia-h200-ep8-moe-w4a16-wgmma.jsonl.gz`); the screen
/// measures them from 16 on all the same, since where they overtake depends on the GPU and the
/// layer, and a screen that skipped them would never see it (they cost screen time only).
pub const WGMMA_MIN_ROWS_PER_EXPERT: u32 = 16;
/// Routed rows per active expert from which a grouped screen measures only tiled configurations:
/// there the streamed kernels, which decode every weight once per tile of at most 32 rows and
/// load the activations once per weight tile, are several times slower.
pub const TILED_ONLY_ROWS_PER_EXPERT: u32 = 32;

/// The tiled kernel's configurations (W4A16): routed-row tiles of 16 to 128 (one or two warps
/// along them), 64 to 256 weight rows over 2 to 8 warps along N, 128 k per stage in 3 or 4
/// stages or 256 k in 2 or 3, and 64 k per stage in 3 or 4 stages for a K of at most
/// `TILED_K64_MAX_K`; a K that stages of 128 cannot split (a multiple of 64 only, e.g. the down
/// projection of a 1536-wide expert over 8 GPUs, K = 192) gets only the 64-k stages, and a K that
/// 64 does not split (a multiple of 16, e.g. K = 176) only the 64-k stages in the K-tail form
/// (`GroupedConfig::k_tail`). The 64 x 128 tile of four warps with 64-k stages also comes compiled
/// for 3 CTAs per SM (`TILED_K64_MIN_CTAS`; not in the K-tail form).
fn tiled_space(op: MoeOp, shape: &MoeShape) -> Vec<GroupedConfig> {
    // (block_m, [(block_n, warps_m, warps_n)], [(block_k, stages)]); the 64- and 128-row tiles
    // keep to the combinations that compile without spills
    type Tiles = &'static [(u32, u32, u32)];
    type Stages = &'static [(u32, u32)];
    const K64: Stages = &[(64, 3), (64, 4)];
    let (_, k) = shape.nk(op);
    // stages of 128 and 256 k where they split K; 64-k stages where they do not, and besides
    // them up to TILED_K64_MAX_K (all lists but the last); a K that 64 does not split (a multiple
    // of 16) gets the 64-k stages in the K-tail form
    let long = k % 128 == 0;
    let k64 = !long || k <= TILED_K64_MAX_K;
    let k_tail = k % 64 != 0;
    const SMALL: Stages = &[(128, 3), (128, 4), (256, 2), (256, 3)];
    const K128: Stages = &[(128, 3), (128, 4)];
    let small_tiles: Tiles = &[(64, 1, 2), (128, 1, 4), (128, 1, 8), (256, 1, 8)];
    let lists: [(u32, Tiles, Stages, bool); 6] = [
        (16, small_tiles, SMALL, true),
        (32, small_tiles, SMALL, true),
        (64, &[(64, 1, 2), (128, 1, 4)], K128, true),
        (64, &[(128, 1, 8), (128, 2, 4)], &[(128, 3), (128, 4), (256, 2)], true),
        (128, &[(128, 1, 8), (128, 2, 4)], K128, true),
        (128, &[(128, 1, 8)], &[(256, 2)], false),
    ];
    let mut out = Vec::new();
    for (block_m, tiles, stages, takes_k64) in lists {
        let stages = stages.iter().filter(|_| long).chain(K64.iter().filter(|_| k64 && takes_k64));
        for &(block_n, warps_m, warps_n) in tiles {
            for &(block_k, depth) in stages.clone() {
                // (the K-tail form's copies of codes take more registers: at 3 CTAs per SM it spills)
                let occupancy: &[u32] = if !k_tail
                    && (block_m, block_n, warps_m * warps_n, block_k) == (64, 128, 4, 64)
                {
                    &[1, TILED_K64_MIN_CTAS]
                } else {
                    &[1]
                };
                for &min_ctas in occupancy {
                    let tile = [block_m, block_n, block_k];
                    let c = GroupedConfig {
                        k_tail,
                        ..GroupedConfig::tiled(op, tile, [warps_m, warps_n], depth, min_ctas)
                    };
                    if c.check(shape).is_ok() {
                        out.push(c);
                    }
                }
            }
        }
    }
    out
}

/// The distinct kernels of `space` (per op and shape) over both ops of `shapes`: configurations
/// that differ only in their walk share one kernel, kept once with walk 0.
pub fn distinct_kernels(
    shapes: &[MoeShape],
    space: impl Fn(MoeOp, &MoeShape) -> Vec<GroupedConfig>,
) -> Vec<GroupedConfig> {
    let mut out: Vec<GroupedConfig> = Vec::new();
    for shape in shapes {
        for op in MoeOp::ALL {
            for c in space(op, shape) {
                if !out.iter().any(|x| x.kernel_name() == c.kernel_name()) {
                    out.push(GroupedConfig { walk: 0, ..c });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-Next over 8 GPUs from its config.json: every expert on each GPU (TP), within
    /// moe_align's 512 local experts; the sm90 W4A16 kernels (the tiled ones for the down's K of
    /// 64) and the sm120 ones run it, the sm90 W4A4 emulation (streamed kernels only) is refused
    /// in one line naming the K.
    #[test]
    fn a_layer_from_a_config_is_checked_against_each_familys_kernels() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/qwen3-next-config.json");
        let config = crate::shapes::HfMoeConfig::load(&path).unwrap();
        let set = config.shape_set(crate::shapes::Parallelism::new(8, 1), &[1, 8]).unwrap();
        let (layer, total) = MoeShape::from_set(&set).unwrap();
        assert_eq!(
            (layer.experts, layer.top_k, layer.hidden, layer.inter, total),
            (512, 10, 2048, 64, 512)
        );
        use crate::problem::AType::{Bf16, Nvfp4};
        use crate::template::Family::{Sm120, Sm90};
        assert_eq!(check_layer(Sm90, Bf16, &layer), Ok(()));
        assert_eq!(check_layer(Sm120, Nvfp4, &layer), Ok(()));
        let e = check_layer(Sm90, Nvfp4, &layer).unwrap_err();
        assert!(e.contains("moe_down") && e.contains("K = 64") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn the_search_space_is_legal_and_covers_both_ops_of_both_glm5_shapes() {
        for shape in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8] {
            for op in MoeOp::ALL {
                let space = search_space(op, &shape);
                assert!(space.len() >= 20, "{op} {shape}: {} configurations", space.len());
                for c in &space {
                    c.check(&shape).unwrap();
                    assert_eq!((c.op, c.family, c.a_type), (op, Family::Sm90, AType::Bf16));
                }
                let w4a4 = search_space_for(Family::Sm90, AType::Nvfp4, op, &shape);
                assert!(w4a4.len() >= 20, "{op} {shape}: {} W4A4 configurations", w4a4.len());
                for c in &w4a4 {
                    c.check(&shape).unwrap();
                    assert_eq!((c.op, c.family, c.a_type), (op, Family::Sm90, AType::Nvfp4));
                    if op == MoeOp::GateUp {
                        assert_eq!(c.block_n / c.warps_n % 32, 0, "{c}: whole H blocks per warp");
                    }
                }
                assert!(w4a4.iter().any(|c| c.walk > 0) && w4a4.iter().any(|c| c.walk == 0));
                assert!(search_space_for(Family::Sm120, AType::Bf16, op, &shape).is_empty());
                for bm in [8, 16] {
                    assert!(space.iter().any(|c| c.block_m == bm), "{op}: no block_m {bm}");
                }
                assert!(space.iter().any(|c| c.walk > 0) && space.iter().any(|c| c.walk == 0));
                assert!(space.iter().any(|c| c.warp_ring) && space.iter().any(|c| !c.warp_ring));
                assert!(w4a4.iter().any(|c| c.warp_ring), "{op} {shape}: no W4A4 warp ring");
            }
        }
    }

    /// `check_layer`'s rules hold: layers whose down K is each multiple of 16 up to 1024 run
    /// exactly where the rules say (W4A16 on sm90: every one, through the tiled and wgmma
    /// kernels where K is a multiple of 64 but not of 128, through the tiled kernel's K-tail form
    /// alone where 64 does not split it; sm120: every one, in its K-tail form where 64 does not
    /// split it; sm90 W4A4: multiples of 128 from 256), and a K of 176 or 96 (GLM-4.5-Air,
    /// Qwen3-30B-A3B over 8 GPUs) is refused by sm90 W4A4 naming the projection and its N and K.
    #[test]
    fn check_layer_rules_match_the_spaces() {
        for k in (16..=1024).step_by(16) {
            let shape = MoeShape { hidden: 4096, inter: k, experts: 128, top_k: 8 };
            let streamed = k % 128 == 0 && k >= 256;
            for (family, a_type, runs) in [
                (Family::Sm90, AType::Bf16, true),
                (Family::Sm90, AType::Nvfp4, streamed),
                (Family::Sm120, AType::Nvfp4, true),
                (Family::Sm120, AType::Bf16, false),
            ] {
                let got = check_layer(family, a_type, &shape);
                assert_eq!(got.is_ok(), runs, "{family} {a_type} K = {k}: {got:?}");
            }
            let down = search_space(MoeOp::Down, &shape);
            assert_eq!(down.iter().any(|c| c.k_tail), k % 64 != 0, "K = {k}");
            let sm120 = search_space_for(Family::Sm120, AType::Nvfp4, MoeOp::Down, &shape);
            assert!(sm120
                .iter()
                .all(|c| c.k_tail == (k % 64 != 0) && (!c.k_tail || c.block_k == 64)));
            if k % 64 != 0 {
                assert!(
                    down.iter().all(|c| c.tiled && !c.wgmma && c.k_tail && c.block_k == 64),
                    "K = {k}: only the K-tail form takes it"
                );
            } else if !streamed {
                assert!(down.iter().all(|c| c.tiled), "K = {k}: a streamed kernel takes it");
                assert!(down.iter().any(|c| !c.wgmma) && down.iter().any(|c| c.wgmma), "K = {k}");
                assert!(down.iter().filter(|c| !c.wgmma).all(|c| c.block_k == 64 || k % 128 == 0));
            }
        }
        // gate_up's K (the hidden size): the W4A4 streamed kernels run 4 or 8 warps along it
        for (hidden, w4a4) in
            [(2048, true), (2304, false), (2560, true), (6400, false), (7168, true)]
        {
            let shape = MoeShape { hidden, inter: 256, experts: 64, top_k: 4 };
            assert!(check_layer(Family::Sm90, AType::Bf16, &shape).is_ok(), "K = {hidden}");
            assert!(check_layer(Family::Sm120, AType::Nvfp4, &shape).is_ok(), "K = {hidden}");
            let got = check_layer(Family::Sm90, AType::Nvfp4, &shape);
            assert_eq!(got.is_ok(), w4a4, "W4A4 gate_up K = {hidden}: {got:?}");
            if let Err(e) = got {
                assert!(e.contains("moe_gate_up") && e.contains("a multiple of 512"), "{e}");
            }
        }
        // experts past moe_align's range
        let many = MoeShape { experts: 600, ..MoeShape::GLM5_TP8 };
        let e = check_layer(Family::Sm90, AType::Bf16, &many).unwrap_err();
        assert!(e.contains("1 to 512 local experts"), "{e}");
        for (inter, hidden) in [(176, 4096), (96, 2048)] {
            let shape = MoeShape { hidden, inter, experts: 128, top_k: 8 };
            check_layer(Family::Sm90, AType::Bf16, &shape).unwrap();
            check_layer(Family::Sm120, AType::Nvfp4, &shape).unwrap();
            let e = check_layer(Family::Sm90, AType::Nvfp4, &shape).unwrap_err();
            assert!(
                e.contains(&format!("N = {hidden}, K = {inter}")) && e.contains("moe_down"),
                "{e}"
            );
            assert!(e.contains("a multiple of 128"), "{e}");
        }
        // the GLM-5 layers run everywhere; 64-k tiled stages only where K <= TILED_K64_MAX_K
        // (the TP8 down, K = 256), besides its 128- and 256-k ones
        for shape in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8] {
            for (family, a_type) in [
                (Family::Sm90, AType::Bf16),
                (Family::Sm90, AType::Nvfp4),
                (Family::Sm120, AType::Nvfp4),
            ] {
                check_layer(family, a_type, &shape).unwrap();
            }
            for op in MoeOp::ALL {
                let (_, k) = shape.nk(op);
                let tiled: Vec<_> =
                    search_space(op, &shape).into_iter().filter(|c| c.tiled && !c.wgmma).collect();
                let k64 = tiled.iter().filter(|c| c.block_k == 64).count();
                assert_eq!(k64 > 0, k <= TILED_K64_MAX_K, "{op} {shape}");
                // the 3-CTA form: only the 64 x 128 tile of four warps with 64-k stages
                let three: Vec<_> = tiled.iter().filter(|c| c.min_ctas != 1).collect();
                assert_eq!(three.len(), if k <= TILED_K64_MAX_K { 2 } else { 0 }, "{op} {shape}");
                for c in three {
                    assert_eq!(c.min_ctas, TILED_K64_MIN_CTAS);
                    assert_eq!((c.block_m, c.block_n, c.block_k, c.threads()), (64, 128, 64, 128));
                }
                assert!(tiled.iter().any(|c| c.block_k == 128), "{op} {shape}");
            }
        }
    }
}
