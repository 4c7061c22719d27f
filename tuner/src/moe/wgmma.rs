//! The grouped wgmma kernel (`templates/moe/sm90_wgmma.cuh`): its configurations, limits and
//! shared memory, and CPU mirrors of its index maps. A tiled configuration ([`GroupedConfig::tiled`])
//! with [`GroupedConfig::wgmma`]: the routed rows are Hopper wgmma's N (its B operand, read from
//! the cp.async stages in the 128-byte swizzle), 64 weight rows per warpgroup are its A operand,
//! decoded from NVFP4 straight into registers. The tests check the layouts against what the
//! hardware reads (the swizzle and descriptor steps), that the weight fragment loads are free of
//! bank conflicts, and that every output element of a grid is written once from its weight rows
//! (the lanes' decode of the weight codes is mirrored in `order`).

use super::config::{GroupedConfig, IllegalConfig, UnitParts};
use super::{MoeOp, MoeShape};
use crate::problem::AType;
use crate::template::Family;

/// Routed rows per tile (wgmma's N).
pub const BLOCK_M: [u32; 3] = [32, 64, 128];

/// Shared memory of one configuration (templates/moe/sm90_wgmma.cuh `WgmmaConfig::SMEM_BYTES`):
/// per stage the B tile (block_m x block_k bf16), the codes (block_n x block_k / 2) and the scale
/// words (block_n x block_k / 64), rounded to 1024 bytes; plus 1024 to align the base. Saturating:
/// a configuration read from a file may hold any sizes.
pub fn smem_bytes(c: &GroupedConfig) -> u32 {
    let (m, n, k) = (u64::from(c.block_m), u64::from(c.block_n), u64::from(c.block_k));
    let stage = (m * k * 2 + n * k / 2 + n * (k / 64) * 4).div_ceil(1024) * 1024;
    let total = u64::from(c.depth).saturating_mul(stage).saturating_add(1024);
    u32::try_from(total).unwrap_or(u32::MAX)
}

/// m64 tiles per warpgroup (1 or 2 for a legal configuration).
fn m64_tiles(c: &GroupedConfig) -> u32 {
    c.block_n / (16 * c.warps_n.max(1))
}

/// Registers per lane the kernel needs: the accumulators (block_m / 2 per m64 tile), per m64
/// tile two steps' A fragments (2 x 4), the code words and scales of two steps of the lane's two
/// rows (2 x (4 + 2)), the copy plans (a 64-bit pointer and an offset per copy) and about 40 of
/// indices and addresses. Configurations over the cap spill (checked by compiling every one).
fn register_estimate(c: &GroupedConfig) -> u32 {
    let threads = c.threads().max(1);
    let copies = (c.block_m * c.block_k / 8 + c.block_n * c.block_k / 32).div_ceil(threads)
        + (c.block_n * c.block_k / 64).div_ceil(threads);
    m64_tiles(c) * (c.block_m / 2 + 8 + 12) + 3 * copies + 40
}

/// The constraints of a wgmma configuration (after the shape's, which `GroupedConfig::check`
/// applies first); `k` is the projection's K.
pub fn check(c: &GroupedConfig, k: u32) -> Result<(), IllegalConfig> {
    let err = |reason: String| Err(IllegalConfig { config: c.name(), reason });
    if c.family != Family::Sm90 {
        return err("the wgmma kernel is a kernel of family sm90 (sm_90a)".into());
    }
    if c.a_type != AType::Bf16 {
        return err("the wgmma kernel takes bf16 activations (W4A16)".into());
    }
    if c.warp_ring {
        return err(
            "the wgmma kernel has no warp ring (its weights go through the CTA's stages)".into()
        );
    }
    if !BLOCK_M.contains(&c.block_m) {
        return err("block_m (wgmma's N) must be 32, 64 or 128".into());
    }
    if (c.warps_m, c.warps_k) != (1, 1) || (c.warps_n != 4 && c.warps_n != 8) {
        return err("one or two warpgroups along N: warps 1 x 4 x 1 or 1 x 8 x 1".into());
    }
    if c.block_n % (16 * c.warps_n) != 0 || !(1..=2).contains(&m64_tiles(c)) {
        return err(format!(
            "block_n must be one or two m64 tiles of 64 weight rows per warpgroup: {} or {}",
            16 * c.warps_n,
            32 * c.warps_n
        ));
    }
    if c.split_k != 1 || c.walk != 0 {
        return err(
            "the wgmma kernel has one K slice (split_k 1) and one tile per CTA (walk 0)".into()
        );
    }
    if c.block_k != 64 && c.block_k != 128 {
        return err("block_k must be 64 or 128 (one or two 64-k swizzle atoms)".into());
    }
    if !(3..=8).contains(&c.depth) {
        return err("the wgmma kernel has 3..8 stages (depth)".into());
    }
    if !(1..=16).contains(&c.min_ctas) || c.threads().saturating_mul(c.min_ctas) > 2048 {
        return err("min_ctas CTAs must fit in one SM (2048 threads)".into());
    }
    let cap = c.register_cap();
    let need = register_estimate(c);
    if need > cap {
        return err(format!("about {need} registers per lane, over the cap of {cap}"));
    }
    let smem = u64::from(smem_bytes(c));
    if smem > 232_448 || u64::from(c.min_ctas) * (smem + 1024) > 233_472 {
        return err(format!(
            "{smem} bytes of shared memory for {} CTAs per SM: over the 228 KiB of an SM",
            c.min_ctas
        ));
    }
    if k == 0 || k % c.block_k != 0 {
        return err(format!("K = {k} must be a positive multiple of block_k"));
    }
    Ok(())
}

/// The instantiation unit's parts (`GroupedConfig::unit` writes it).
pub(super) fn unit_parts(c: &GroupedConfig) -> UnitParts<'static> {
    UnitParts {
        header: "moe/sm90_wgmma.cuh",
        cfg: format!(
            "fp4tune::moe::WgmmaConfig<{}, {}, {}, {}, {}, {}>",
            c.block_m, c.block_n, c.block_k, c.warps_n, c.depth, c.min_ctas
        ),
        rust_side: "moe/wgmma.rs smem_bytes",
        template_side: "moe/sm90_wgmma.cuh",
        launch: format!("__launch_bounds__({}, {})", c.threads(), c.min_ctas),
        runner: "GroupedWgmma",
        params: "GroupedParams",
    }
}

/// The wgmma configurations (W4A16): tiles of 32 to 128 routed rows; 64 to 256 weight rows as
/// one or two warpgroups of one or two m64 tiles (more weight rows per CTA read the tile's
/// activations fewer times); 64 k per stage in 4 stages, or 128 k in 3; two CTAs per SM where
/// they fit.
pub fn space(op: MoeOp, shape: &MoeShape) -> Vec<GroupedConfig> {
    let mut out = Vec::new();
    for block_m in BLOCK_M {
        for (block_n, warps_n) in [(64, 4), (128, 4), (128, 8), (256, 8)] {
            for (block_k, depth) in [(64, 4), (128, 3)] {
                for min_ctas in [2, 1] {
                    let c = config(op, [block_m, block_n, block_k], warps_n, depth, min_ctas);
                    if c.check(shape).is_ok() {
                        out.push(c);
                        break; // the most CTAs per SM that fit
                    }
                }
            }
        }
    }
    out
}

/// A wgmma configuration of tile (block_m, block_n, block_k).
pub fn config(
    op: MoeOp,
    [block_m, block_n, block_k]: [u32; 3],
    warps_n: u32,
    depth: u32,
    min_ctas: u32,
) -> GroupedConfig {
    GroupedConfig {
        wgmma: true,
        ..GroupedConfig::tiled(op, [block_m, block_n, block_k], [1, warps_n], depth, min_ctas)
    }
}

/// Byte offset of (row `r`, 16-byte unit `u` of its k) in a B tile of `rows` rows
/// (templates/moe/wgmma.cuh `b_offset`): 64-k atom columns of `rows` x 128 bytes, unit `u % 8` of
/// row `r` at unit `(u % 8) ^ (r % 8)`.
pub fn b_offset(rows: u32, r: u32, u: u32) -> u32 {
    (u >> 3) * rows * 128 + r * 128 + (((u & 7) ^ (r & 7)) << 4)
}

/// The 16-byte unit of code unit `u` of weight row `r` (templates/moe/sm90_wgmma.cuh
/// `code_unit`), `units` = block_k / 32 per row.
pub fn code_unit(units: u32, r: u32, u: u32) -> u32 {
    if units == 2 {
        u ^ ((r >> 2) & 1)
    } else {
        u ^ ((r >> 1) & 3)
    }
}

/// The 16-row block of the CTA's A rows that warp `warp` holds in its m64 tile `m`
/// (templates/moe/sm90_wgmma.cuh: rows (warpgroup * MT + m) * 64 + 16 (warp % 4) ..).
pub fn row_block(block_n: u32, warps_n: u32, warp: u32, m: u32) -> u32 {
    let mt = block_n / (16 * warps_n);
    ((warp / 4) * mt + m) * 4 + warp % 4
}

/// The weight row behind A row `r` of the CTA whose first weight row is `n0`, for a projection of
/// `n` weight rows (gate_up: n = 2I; rows g of each 16 are gate rows, rows g + 8 the matching up
/// rows); `None` past the weight.
pub fn weight_row(op: MoeOp, n: u32, n0: u32, r: u32) -> Option<u32> {
    match op {
        MoeOp::GateUp => {
            let half = n / 2;
            let j = (n0 + (r & !15)) / 2 + (r & 7);
            (j < half).then_some(j + ((r >> 3) & 1) * half)
        }
        MoeOp::Down => (n0 + r < n).then_some(n0 + r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The B layout is the hardware's 128-byte swizzle (within each 1024-byte atom, address bits
    /// 4..6 XOR bits 7..9 of the unswizzled row-major offset), a bijection onto the tile, and the
    /// descriptor steps of the kernel (atom column `s / 4` at rows x 128 bytes, 32 bytes per k16
    /// step inside it) start at row 0's unit of that step's first k.
    #[test]
    fn b_tiles_are_the_128_byte_swizzle_and_descriptor_steps_start_at_their_k() {
        for rows in BLOCK_M {
            for block_k in [64, 128] {
                let units = block_k / 8;
                let mut seen = vec![false; (rows * block_k * 2 / 16) as usize];
                for r in 0..rows {
                    for u in 0..units {
                        let off = b_offset(rows, r, u);
                        let plain = (u >> 3) * rows * 128 + r * 128 + ((u & 7) << 4);
                        let swizzled = plain ^ (((plain >> 7) & 7) << 4);
                        assert_eq!(off, swizzled, "rows {rows} r {r} u {u}");
                        assert!(!std::mem::replace(&mut seen[(off / 16) as usize], true));
                    }
                }
                assert!(seen.iter().all(|&s| s));
                // What the hardware reads for k16 step s: from the descriptor's start (atom
                // column s / 4, plus 32 bytes per step inside it), row r at r * 128 bytes (8 rows
                // per 1024-byte stride), 16-byte unit c of the step's 32 bytes, then the 128-byte
                // swizzle (address bits 4..6 XOR bits 7..9): the unit the copies wrote there.
                for s in 0..block_k / 16 {
                    let start = (s >> 2) * rows * 128 + (s & 3) * 32;
                    for r in 0..rows {
                        for c in 0..2 {
                            let a = start + r * 128 + c * 16;
                            let read = a ^ (((a >> 7) & 7) << 4);
                            assert_eq!(
                                read,
                                b_offset(rows, r, 2 * s + c),
                                "rows {rows} step {s} r {r} c {c}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A warp's fragment loads (16 bytes of rows g and g + 8 of its 16 rows, the same unit for
    /// the 4 lanes of a row) touch every bank at most once per row half, and the code units of a
    /// row are a permutation.
    #[test]
    fn weight_fragment_loads_are_free_of_bank_conflicts() {
        for units in [2u32, 4] {
            let row_bytes = units * 16;
            for warp in 0..8u32 {
                for h in 0..2 {
                    for u in 0..units {
                        let mut banks = HashMap::new();
                        for g in 0..8 {
                            let r = 16 * warp + 8 * h + g;
                            let off = r * row_bytes + code_unit(units, r, u) * 16;
                            for b in 0..4 {
                                let bank = (off / 4 + b) % 32;
                                assert!(
                                    banks.insert(bank, r).is_none(),
                                    "units {units} r {r} u {u}"
                                );
                            }
                        }
                    }
                }
            }
            for r in 0..64 {
                let mut us: Vec<u32> = (0..units).map(|u| code_unit(units, r, u)).collect();
                us.sort();
                assert_eq!(us, (0..units).collect::<Vec<_>>());
            }
        }
    }

    /// Every output element of a grid of CTAs is written once, from its weight rows: warp w holds
    /// the 16-row block b = row_block(w, m) of each of its m64 tiles m (a bijection onto the
    /// CTA's blocks); accumulator element e of lane (g, t), n8 block j is A row 16b + g + 8 (e / 2);
    /// gate_up pairs e and e + 2 (gate and up) into H column (n0 + 16b) / 2 + g, down writes
    /// column n0 + 16b + g + 8 (e / 2) (templates/moe/epilogue.cuh store_tile, one m16 tile).
    #[test]
    fn every_output_element_comes_once_from_its_weight_rows() {
        for (op, n) in
            [(MoeOp::GateUp, 512), (MoeOp::GateUp, 208), (MoeOp::Down, 6144), (MoeOp::Down, 400)]
        {
            for (block_n, warps_n) in [(64u32, 4u32), (128, 4), (128, 8), (256, 8)] {
                let mt = block_n / (16 * warps_n);
                let mut blocks: Vec<u32> = (0..warps_n)
                    .flat_map(|w| (0..mt).map(move |m| row_block(block_n, warps_n, w, m)))
                    .collect();
                blocks.sort();
                assert_eq!(
                    blocks,
                    (0..block_n / 16).collect::<Vec<_>>(),
                    "block_n {block_n} warps_n {warps_n}"
                );
                let mut written: HashMap<(u32, u32), u32> = HashMap::new();
                for n0 in (0..n).step_by(block_n as usize) {
                    for b in blocks.iter().copied() {
                        for lane in 0..32 {
                            let (g, t) = (lane >> 2, lane & 3);
                            for j in 0..4u32 {
                                for e in 0..2 {
                                    let m = 8 * j + 2 * t + e;
                                    let r_gate = 16 * b + g;
                                    let r_up = r_gate + 8;
                                    match op {
                                        MoeOp::GateUp => {
                                            let col = (n0 + 16 * b) / 2 + g;
                                            if col >= n / 2 {
                                                assert_eq!(weight_row(op, n, n0, r_gate), None);
                                                continue;
                                            }
                                            assert_eq!(weight_row(op, n, n0, r_gate), Some(col));
                                            assert_eq!(
                                                weight_row(op, n, n0, r_up),
                                                Some(n / 2 + col)
                                            );
                                            *written.entry((m, col)).or_default() += 1;
                                        }
                                        MoeOp::Down => {
                                            for (r, col) in [
                                                (r_gate, n0 + 16 * b + g),
                                                (r_up, n0 + 16 * b + g + 8),
                                            ] {
                                                if col < n {
                                                    assert_eq!(weight_row(op, n, n0, r), Some(col));
                                                    *written.entry((m, col)).or_default() += 1;
                                                } else {
                                                    assert_eq!(weight_row(op, n, n0, r), None);
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                let cols = if op == MoeOp::GateUp { n / 2 } else { n };
                assert_eq!(written.len() as u32, 32 * cols, "{op} n {n} block_n {block_n}");
                assert!(written.values().all(|&x| x == 1));
            }
        }
    }

    /// Every distinct wgmma kernel of both GLM-5 layers compiles for sm_90a (NVRTC, no GPU
    /// needed) without spills and without ptxas serializing its wgmmas (the pipeline of the
    /// kernel depends on them running asynchronously); when cuobjdump is there, the SASS has the
    /// HGMMA and no local memory.
    #[test]
    fn every_wgmma_kernel_compiles_for_sm90_without_spills_or_serialized_wgmmas() {
        use crate::compile::{sass, Compiler};
        let dir = tempfile::tempdir().unwrap();
        let compiler =
            Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
        let configs =
            super::super::space::distinct_kernels(&[MoeShape::GLM5_TP8, MoeShape::GLM5_EP8], space);
        let sources: Vec<_> = configs.iter().map(|c| c.source()).collect();
        let mut problems = Vec::new();
        for (c, r) in configs.iter().zip(compiler.compile_many(&sources)) {
            let k = match r {
                Ok(k) => k,
                Err(e) => {
                    problems.push(format!("{c}: {e}"));
                    continue;
                }
            };
            let Some(stats) = k.stats.as_ref() else {
                problems.push(format!("{c}: no ptxas statistics in the NVRTC log:\n{}", k.log));
                continue;
            };
            if stats.spills() {
                problems.push(format!("{c}: {stats:?}"));
            }
            if k.log.contains("serialized") {
                problems.push(format!("{c}: ptxas serializes its wgmmas:\n{}", k.log));
            }
            if let Ok(text) = sass::dump_sass(&k.kernel_name, &k.cubin) {
                if sass::uses_local_memory(&text) || sass::count_opcode(&text, "HGMMA") == 0 {
                    problems.push(format!("{c}: local memory or no HGMMA in the SASS"));
                }
            }
        }
        assert!(configs.len() >= 40, "{} kernels", configs.len());
        assert!(
            problems.is_empty(),
            "{} of {}:\n{}",
            problems.len(),
            configs.len(),
            problems.join("\n")
        );
    }

    #[test]
    fn the_space_is_legal_for_both_glm5_layers_and_refuses_what_the_kernel_cannot_run() {
        for shape in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8] {
            for op in MoeOp::ALL {
                let space = space(op, &shape);
                assert!(space.len() >= 12, "{op}: {} configurations", space.len());
                for c in &space {
                    c.check(&shape).unwrap();
                    assert!(c.name().contains("_wg"), "{}", c.name());
                }
            }
        }
        let shape = MoeShape::GLM5_TP8;
        let c = config(MoeOp::GateUp, [128, 64, 64], 4, 4, 2);
        assert_eq!(c.name(), "moe_gate_up_m128n64k64_w1x4x1_wg4_s1_o2_walk0");
        assert_eq!(smem_bytes(&c), 4 * 19 * 1024 + 1024);
        let src = c.source().code;
        assert!(src.contains("WgmmaConfig<128, 64, 64, 4, 4, 2>"), "{src}");
        assert!(src.contains("GroupedWgmma<Cfg, fp4tune::moe::OP_GATE_UP>"));
        let why = |x: GroupedConfig| x.check(&shape).unwrap_err().reason;
        assert!(why(GroupedConfig { a_type: AType::Nvfp4, ..c }).contains("bf16"));
        assert!(why(GroupedConfig { block_m: 16, ..c }).contains("block_m"));
        assert!(why(GroupedConfig { block_n: 256, ..c }).contains("block_n"));
        assert!(why(GroupedConfig { block_n: 96, ..c }).contains("block_n"));
        assert!(why(GroupedConfig { warps_n: 2, ..c }).contains("warps"));
        assert!(why(GroupedConfig { warps_n: 16, block_n: 256, ..c }).contains("warps"));
        assert!(why(GroupedConfig { split_k: 2, ..c }).contains("one K slice"));
        assert!(why(GroupedConfig { depth: 2, ..c }).contains("stages"));
        let deep =
            GroupedConfig { depth: 8, block_k: 128, block_n: 128, warps_n: 8, min_ctas: 1, ..c };
        let two_tiles = GroupedConfig { block_n: 128, block_k: 128, depth: 3, ..c };
        assert!(why(two_tiles).contains("registers"), "two m64 tiles of 128 k at 2 CTAs per SM");
        assert!(why(deep).contains("shared memory"));
        assert!(why(GroupedConfig { family: Family::Sm120, ..c }).contains("family sm90"));
        // the wgmma checks alone (also reached without the shape's checks first)
        let own = |x: GroupedConfig, k: u32| check(&x, k).unwrap_err().reason;
        assert!(own(GroupedConfig { family: Family::Sm120, ..c }, 6144)
            .contains("wgmma kernel is a kernel of family sm90"));
        assert!(own(c, 0).contains("positive multiple of block_k"));
        assert!(own(c, 6144 + 32).contains("positive multiple of block_k"));
        check(&c, 6144).unwrap();
        assert!(why(GroupedConfig { tiled: false, ..c }).contains("tiled"));
        let ron = ron::to_string(&c).unwrap();
        assert!(ron.contains("wgmma:true"), "{ron}");
        assert_eq!(ron::from_str::<GroupedConfig>(&ron).unwrap(), c);
        // sizes from a file saturate instead of wrapping
        let huge = GroupedConfig { block_m: u32::MAX, depth: u32::MAX, ..c };
        assert_eq!(smem_bytes(&huge), u32::MAX);
    }
}
