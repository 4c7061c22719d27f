//! The weights a decode step asks into L2 beside its own kernels (templates/moe/prefetch.cuh):
//! which regions of the routed experts' bytes, by how many bytes the step can touch against the
//! device's L2.
//!
//! The layer forks the prefetch kernel onto its workspace's side stream before `moe_align` and
//! joins it after `moe_finalize` (`runtime::moe`). The kernel reads `topk_ids` itself, so the
//! weights stream in while `moe_align` runs and DRAM is otherwise idle; the projections then find
//! (part of) them in L2. It asks only where what the step can touch fits in a share of L2
//! (`L2_SHARE`): a larger ask would evict what it asked for before it is read, and it competes
//! with the projections' own reads.

use super::{MoeOp, MoeShape};

/// Threads of the prefetch kernel (templates/moe/prefetch.cuh `PREFETCH_THREADS`).
pub const PREFETCH_THREADS: u32 = 128;
/// Bytes one CTA asks for (`PREFETCH_SEGMENT`).
pub const PREFETCH_SEGMENT: u64 = 64 << 10;
/// Regions of an expert's weights, one bit each (the kernel's region index): gate_up codes,
/// gate_up scales, down codes, down scales.
pub const PREFETCH_REGIONS: usize = 4;
pub const GATE_UP: u32 = 0b0011;
pub const DOWN: u32 = 0b1100;
/// Denominator of the share of L2 a step's ask may fill (1 / L2_SHARE of it).
pub const L2_SHARE: u64 = 2;

/// Which regions a step asks for and how (`Auto`: the rule of `regions_for`; `Off`: none;
/// `Regions`: these, whatever the step's size; `bench` times the layer under each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefetch {
    Auto,
    Off,
    Regions { regions: u32, bulk: bool },
}

/// What one step asks for: the regions (bits), the form of the ask and the bytes at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchPlan {
    pub regions: u32,
    /// One bulk prefetch per CTA (`cp.async.bulk.prefetch.L2`) instead of line prefetches.
    pub bulk: bool,
    /// The most bytes the ask covers: every routed id on its own local expert.
    pub bytes: u64,
}

/// Bytes of one expert in each region (codes, then 128-row-padded swizzled scales; gate_up,
/// then down), as the layer's weight stacks hold them.
pub fn region_bytes(shape: &MoeShape) -> [u64; PREFETCH_REGIONS] {
    let mut out = [0; PREFETCH_REGIONS];
    for (i, op) in [MoeOp::GateUp, MoeOp::Down].into_iter().enumerate() {
        let (n, k) = shape.nk(op);
        out[2 * i] = n as u64 * k as u64 / 2;
        out[2 * i + 1] = crate::format::swizzle::swizzled_len(n as usize, (k / 16) as usize) as u64;
    }
    out
}

/// The most local experts a step of `tokens` tokens touches.
pub fn most_experts(shape: &MoeShape, tokens: u32) -> u64 {
    (tokens as u64 * shape.top_k as u64).min(shape.experts as u64)
}

/// The bytes of `regions` over the most experts a step of `tokens` touches.
pub fn ask_bytes(shape: &MoeShape, tokens: u32, regions: u32) -> u64 {
    let per = region_bytes(shape);
    let one: u64 = (0..PREFETCH_REGIONS).filter(|r| regions >> r & 1 == 1).map(|r| per[r]).sum();
    one * most_experts(shape, tokens)
}

/// The rule: both projections' weights where they fit in `l2_bytes / L2_SHARE`, else the down
/// projection's where those fit, else nothing.
pub fn regions_for(shape: &MoeShape, tokens: u32, l2_bytes: u64) -> u32 {
    let room = l2_bytes / L2_SHARE;
    [GATE_UP | DOWN, DOWN].into_iter().find(|&r| ask_bytes(shape, tokens, r) <= room).unwrap_or(0)
}

/// The plan of one step under `prefetch`, or `None` where it asks for nothing.
pub fn plan(
    prefetch: Prefetch,
    shape: &MoeShape,
    tokens: u32,
    l2_bytes: u64,
) -> Option<PrefetchPlan> {
    let (regions, bulk) = match prefetch {
        Prefetch::Off => return None,
        Prefetch::Auto => (regions_for(shape, tokens, l2_bytes), false),
        Prefetch::Regions { regions, bulk } => (regions & 0b1111, bulk),
    };
    (regions != 0 && tokens > 0).then(|| PrefetchPlan {
        regions,
        bulk,
        bytes: ask_bytes(shape, tokens, regions),
    })
}

/// The kernel's grid for `routed` ids under `plan`: (routed ids, regions, segments of the
/// largest region asked for).
pub fn grid(shape: &MoeShape, routed: u32, plan: &PrefetchPlan) -> (u32, u32, u32) {
    let per = region_bytes(shape);
    let most = (0..PREFETCH_REGIONS)
        .filter(|r| plan.regions >> r & 1 == 1)
        .map(|r| per[r])
        .max()
        .unwrap_or(0);
    (routed, PREFETCH_REGIONS as u32, most.div_ceil(PREFETCH_SEGMENT).max(1) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const L2_50MB: u64 = 50 << 20;

    #[test]
    fn region_bytes_add_up_to_the_experts_weights() {
        for shape in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8] {
            let r = region_bytes(&shape);
            assert_eq!(r[0] + r[1], shape.expert_bytes(MoeOp::GateUp));
            assert_eq!(r[2] + r[3], shape.expert_bytes(MoeOp::Down));
            assert!(r.iter().all(|b| b % 16 == 0), "{r:?}");
        }
        // GLM-5 TP8: 512 x 6144 and 6144 x 256
        let r = region_bytes(&MoeShape::GLM5_TP8);
        assert_eq!(r, [512 * 3072, 512 * 384, 6144 * 128, 6144 * 16]);
    }

    #[test]
    fn the_rule_asks_for_what_fits_in_its_share_of_l2() {
        let tp8 = MoeShape::GLM5_TP8;
        // B = 1: 8 experts, 14.2 + 7.1 MB of 25 MB
        assert_eq!(regions_for(&tp8, 1, L2_50MB), GATE_UP | DOWN);
        // B = 2: 16 experts, 28 + 14 MB: down only
        assert_eq!(regions_for(&tp8, 2, L2_50MB), DOWN);
        assert_eq!(regions_for(&tp8, 3, L2_50MB), DOWN);
        // B = 4: 32 experts' down 28 MB: nothing
        assert_eq!(regions_for(&tp8, 4, L2_50MB), 0);
        assert_eq!(regions_for(&tp8, 1024, L2_50MB), 0);
        // each choice is the largest that fits
        for tokens in 1..64 {
            let r = regions_for(&tp8, tokens, L2_50MB);
            assert!(ask_bytes(&tp8, tokens, r) <= L2_50MB / L2_SHARE);
            if r != GATE_UP | DOWN {
                assert!(ask_bytes(&tp8, tokens, GATE_UP | DOWN) > L2_50MB / L2_SHARE);
            }
        }
        // EP8: 32 experts of 14 MB (gate_up) and 7 MB (down): a step's 8 ids may all be local
        let ep8 = MoeShape::GLM5_EP8;
        assert_eq!(regions_for(&ep8, 1, L2_50MB), 0);
    }

    #[test]
    fn plans_follow_the_setting() {
        let tp8 = MoeShape::GLM5_TP8;
        assert_eq!(plan(Prefetch::Off, &tp8, 1, L2_50MB), None);
        let auto = plan(Prefetch::Auto, &tp8, 1, L2_50MB).unwrap();
        assert_eq!(
            (auto.regions, auto.bytes),
            (
                GATE_UP | DOWN,
                8 * tp8.expert_bytes(MoeOp::GateUp) + 8 * tp8.expert_bytes(MoeOp::Down)
            )
        );
        assert_eq!(plan(Prefetch::Auto, &tp8, 64, L2_50MB), None);
        let forced = plan(Prefetch::Regions { regions: DOWN, bulk: true }, &tp8, 64, L2_50MB);
        assert_eq!(forced.map(|p| (p.regions, p.bulk)), Some((DOWN, true)));
        assert_eq!(plan(Prefetch::Regions { regions: 0, bulk: false }, &tp8, 1, L2_50MB), None);
        assert_eq!(plan(Prefetch::Auto, &tp8, 0, L2_50MB), None);
    }

    #[test]
    fn the_grid_covers_the_largest_region_asked_for() {
        let tp8 = MoeShape::GLM5_TP8;
        let all = PrefetchPlan { regions: GATE_UP | DOWN, bulk: false, bytes: 0 };
        // gate_up codes: 1.5 MB = 24 segments of 64 KB
        assert_eq!(grid(&tp8, 8, &all), (8, 4, 24));
        let down = PrefetchPlan { regions: DOWN, ..all };
        assert_eq!(grid(&tp8, 16, &down), (16, 4, 12));
        // every byte of every region asked for lies in some segment
        for plan in [all, down] {
            let g = grid(&tp8, 1, &plan);
            for (r, bytes) in region_bytes(&tp8).into_iter().enumerate() {
                if plan.regions >> r & 1 == 1 {
                    assert!(g.2 as u64 * PREFETCH_SEGMENT >= bytes);
                }
            }
        }
    }

    /// Both forms compile for both families' architectures (NVRTC, no GPU), and their SASS asks
    /// L2 for lines or bulk ranges and reads nothing else than the ids (when cuobjdump is there).
    #[test]
    fn the_prefetch_kernels_compile_for_both_families() {
        use crate::compile::{sass, Compiler};
        use crate::moe::templates::prefetch_source;
        use crate::template::Arch;
        let dir = tempfile::tempdir().unwrap();
        let compiler =
            Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
        for arch in [Arch::Sm90a, Arch::Sm120a] {
            for bulk in [false, true] {
                let src = prefetch_source(arch, bulk);
                let k =
                    compiler.compile(&src).unwrap_or_else(|e| panic!("{}: {e}", src.kernel_name));
                if let Ok(text) = sass::dump_sass(&src.kernel_name, &k.cubin) {
                    assert!(!sass::uses_local_memory(&text), "{}: local memory", src.kernel_name);
                    assert_eq!(sass::count_opcode(&text, "STG"), 0, "{}: stores", src.kernel_name);
                    let asks = if bulk { "UBLKPF" } else { "CCTL" };
                    assert!(
                        sass::count_opcode(&text, asks) > 0,
                        "{}: no {asks}:\n{text}",
                        src.kernel_name
                    );
                }
            }
        }
    }
}
