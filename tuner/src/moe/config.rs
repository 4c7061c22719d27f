//! One grouped kernel variant (`templates/moe/sm90.cuh`): its parameters, the constraints that
//! make it legal for a shape, its instantiation unit and its launch, and the search space as data.

use super::MoeShape;
use crate::template::{Arch, KernelSource};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The two grouped projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MoeOp {
    /// Gathered X rows times the fused [gate; up] weight, SiLU(gate) * up in the epilogue.
    GateUp,
    /// H rows (sorted order) times the down weight, one output row per routed row.
    Down,
}

impl MoeOp {
    pub const ALL: [MoeOp; 2] = [MoeOp::GateUp, MoeOp::Down];

    pub fn as_str(self) -> &'static str {
        match self {
            MoeOp::GateUp => "moe_gate_up",
            MoeOp::Down => "moe_down",
        }
    }

    /// The template's `OP_*` constant.
    fn template_op(self) -> &'static str {
        match self {
            MoeOp::GateUp => "fp4tune::moe::OP_GATE_UP",
            MoeOp::Down => "fp4tune::moe::OP_DOWN",
        }
    }
}

impl fmt::Display for MoeOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A grouped kernel configuration (W4A16, family sm90). The vocabulary of `GemmConfig`'s global
/// weight pipeline, plus how the CTAs walk the tile schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GroupedConfig {
    pub op: MoeOp,
    /// Routed rows per tile (8, 16 or 32): picks moe_align's tile list.
    pub block_m: u32,
    /// Weight rows per CTA (gate_up: half gate, half up rows).
    pub block_n: u32,
    /// K per pass (a multiple of 128 * warps_k, at least 256).
    pub block_k: u32,
    pub warps_n: u32,
    pub warps_k: u32,
    /// Chunks (128 k) in flight per warp.
    pub depth: u32,
    /// K slices over a (1, 1, split_k) cluster, 1..8.
    pub split_k: u32,
    /// CTAs per SM the kernel is compiled for.
    pub min_ctas: u32,
    /// 0: one CTA per tile; w > 0: a persistent walk with about w CTAs per SM.
    pub walk: u32,
}

/// Why a configuration cannot run a shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{config}: {reason}")]
pub struct IllegalConfig {
    pub config: String,
    pub reason: String,
}

impl GroupedConfig {
    pub fn threads(&self) -> u32 {
        32 * self.warps_n * self.warps_k
    }

    fn p_tiles(&self) -> u32 {
        self.block_n / self.warps_n / 16
    }

    fn q_tiles(&self) -> u32 {
        self.block_m / 8
    }

    /// fp32 accumulators per lane (one set).
    fn acc(&self) -> u32 {
        self.p_tiles() * self.q_tiles() * 4
    }

    fn acc_sets(&self) -> u32 {
        match self.p_tiles() * self.q_tiles() {
            x if x >= 4 => 1,
            x if x >= 2 => 2,
            _ => 4,
        }
    }

    /// The register cap per lane of `min_ctas` CTAs (templates/sm90/direct.cuh REGISTER_CAP).
    fn register_cap(&self) -> u32 {
        (65536 / (self.threads() * self.min_ctas) / 8 * 8).min(255)
    }

    /// Registers of one ring entry (weights + bf16 activations of one chunk).
    fn ring_entry_regs(&self) -> u32 {
        self.p_tiles() * 10 + self.q_tiles() * 16
    }

    /// Dynamic shared memory: the split-K slots (DirectConfig::SMEM_BYTES with A_GLOBAL).
    pub fn smem_bytes(&self) -> u32 {
        let slots = self.split_k.max(1) * self.warps_k;
        let slot_bytes = if slots > 1 { slots * self.warps_n * 32 * self.acc() * 4 } else { 0 };
        slot_bytes.max(16)
    }

    /// Chunks per tile of one warp for K = `k`.
    fn chunks_per_tile(&self, k: u32) -> u32 {
        (k / self.block_k / self.split_k) * (self.block_k / self.warps_k / 128)
    }

    /// Constraints of the configuration (mirroring the template's static_asserts and run-time
    /// guards) for one shape.
    pub fn check(&self, shape: &MoeShape) -> Result<(), IllegalConfig> {
        let err = |reason: String| Err(IllegalConfig { config: self.name(), reason });
        let (n, k) = shape.nk(self.op);
        if ![8, 16, 32].contains(&self.block_m) {
            return err("block_m must be 8, 16 or 32 (moe_align's tile lists)".into());
        }
        if self.warps_n == 0 || self.warps_k == 0 || self.block_n % self.warps_n != 0 {
            return err("block_n must split evenly over warps_n".into());
        }
        let warp_p = self.block_n / self.warps_n;
        if warp_p % 16 != 0 || !(1..=4).contains(&self.p_tiles()) {
            return err("block_n / warps_n must be 16, 32, 48 or 64 weight rows per warp".into());
        }
        if self.threads() > 1024 {
            return err(format!("{} threads per CTA (at most 1024)", self.threads()));
        }
        if self.block_k < 256 || self.block_k % (128 * self.warps_k) != 0 {
            return err("block_k must be at least 256 and a multiple of 128 * warps_k".into());
        }
        if !(1..=8).contains(&self.depth) {
            return err("depth must be 1..8".into());
        }
        if !(1..=8).contains(&self.split_k) {
            return err("split_k must be 1..8 (a cluster)".into());
        }
        if !(1..=16).contains(&self.min_ctas) || self.threads() * self.min_ctas > 2048 {
            return err("min_ctas CTAs must fit in one SM (2048 threads)".into());
        }
        if self.walk > 16 {
            return err("walk is at most 16 CTAs per SM".into());
        }
        let cap = self.register_cap();
        if self.ring_entry_regs() * self.depth > 112.min(cap.saturating_sub(64)) {
            return err(format!(
                "the register ring ({} registers) is over its budget (112, and 64 below the cap of {cap})",
                self.ring_entry_regs() * self.depth
            ));
        }
        // The whole register file of a lane: ring, accumulator sets, row pointers (64-bit) and
        // about 48 registers of indices, tile state and the epilogue.
        let estimate = self.ring_entry_regs() * self.depth
            + self.acc() * self.acc_sets()
            + 8 * self.p_tiles()
            + 4 * self.q_tiles()
            + 48;
        if estimate > cap {
            return err(format!("about {estimate} registers per lane, over the cap of {cap}"));
        }
        if self.acc() * self.acc_sets() > 128 {
            return err("accumulators over the register budget".into());
        }
        if self.smem_bytes() > 232_448 {
            return err("split-K slots over the shared-memory limit".into());
        }
        if n % 16 != 0 || (self.op == MoeOp::GateUp && (n / 2) % 8 != 0) {
            return err(format!("N = {n} must be a multiple of 16"));
        }
        if k % self.block_k != 0 || (k / self.block_k) % self.split_k != 0 {
            return err(format!("K = {k} must split into whole block_k passes per K slice"));
        }
        let cpt = self.chunks_per_tile(k);
        if cpt < self.depth || cpt % self.depth != 0 {
            return err(format!(
                "{cpt} chunks per warp and tile must be a multiple of depth {}",
                self.depth
            ));
        }
        if shape.experts == 0 || shape.experts > super::schedule::MAX_EXPERTS {
            return err(format!(
                "{} local experts (moe_align takes 1..{})",
                shape.experts,
                super::schedule::MAX_EXPERTS
            ));
        }
        Ok(())
    }

    /// A stable, human-readable name; the kernel symbol is derived from it.
    pub fn name(&self) -> String {
        format!(
            "{}_m{}n{}k{}_w{}x{}_d{}_s{}_o{}_walk{}",
            self.op,
            self.block_m,
            self.block_n,
            self.block_k,
            self.warps_n,
            self.warps_k,
            self.depth,
            self.split_k,
            self.min_ctas,
            self.walk
        )
    }

    /// The kernel symbol (the walk is a launch parameter, not part of the code).
    pub fn kernel_name(&self) -> String {
        format!(
            "fp4tune_sm90_{}_m{}n{}k{}_w{}x{}_d{}_s{}_o{}",
            self.op,
            self.block_m,
            self.block_n,
            self.block_k,
            self.warps_n,
            self.warps_k,
            self.depth,
            self.split_k,
            self.min_ctas
        )
    }

    /// The instantiation unit: the template, the configuration, cross-checks of what Rust
    /// computes, and the `extern "C"` kernel.
    pub fn instantiation(&self) -> String {
        let threads = self.threads();
        let cluster = if self.split_k > 1 {
            format!(" __cluster_dims__(1, 1, {})", self.split_k)
        } else {
            String::new()
        };
        format!(
            "// fp4tune grouped MoE kernel {name}\n\
             #include \"moe/sm90.cuh\"\n\
             using Cfg = fp4tune::sm90::DirectConfig<{bm}, {bn}, {bk}, {wn}, {wk}, {d}, {s}, false, false, true, {mc}>;\n\
             static_assert(Cfg::SMEM_BYTES == {smem}, \"Rust (moe/config.rs smem_bytes) and templates/sm90/direct.cuh disagree on shared memory\");\n\
             static_assert(Cfg::THREADS == {threads}, \"Rust and templates/sm90/direct.cuh disagree on threads\");\n\
             extern \"C\" __global__ void __launch_bounds__({threads}, {mc}){cluster} {kernel}(const fp4tune::moe::GroupedParams p) {{\n\
             \x20   fp4tune::moe::Grouped<Cfg, {op}>::run(p);\n\
             }}\n",
            name = self.name(),
            bm = self.block_m,
            bn = self.block_n,
            bk = self.block_k,
            wn = self.warps_n,
            wk = self.warps_k,
            d = self.depth,
            s = self.split_k,
            mc = self.min_ctas,
            smem = self.smem_bytes(),
            kernel = self.kernel_name(),
            op = self.op.template_op(),
        )
    }

    pub fn source(&self) -> KernelSource {
        KernelSource::from_unit(self.kernel_name(), Arch::Sm90a, &self.instantiation())
            .expect("the grouped templates are embedded")
    }

    /// Grid (x, y, z) for a schedule of at most `max_tiles` tiles on `sm_count` SMs.
    pub fn grid(&self, shape: &MoeShape, max_tiles: u32, sm_count: u32) -> (u32, u32, u32) {
        let (n, _) = shape.nk(self.op);
        let gx = n.div_ceil(self.block_n);
        let gy = if self.walk == 0 {
            max_tiles
        } else {
            (self.walk * sm_count / (gx * self.split_k)).clamp(1, max_tiles)
        };
        (gx, gy.max(1), self.split_k)
    }
}

impl fmt::Display for GroupedConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The grouped search space for one op and shape: every legal combination of the value lists
/// below (the space is data; `check` prunes it).
pub fn search_space(op: MoeOp, shape: &MoeShape) -> Vec<GroupedConfig> {
    let (_, k) = shape.nk(op);
    let mut out = Vec::new();
    // (block_n, warps_n) pairs, warps_k, split_k, depth, min_ctas and walk values per op.
    struct Lists {
        tiles: &'static [(u32, u32)],
        warps_k: &'static [u32],
        splits: &'static [u32],
        depths: &'static [u32],
        min_ctas: &'static [u32],
        walks: &'static [u32],
    }
    let lists = match op {
        // long K: many warps along K (in-CTA reduction), 1-2 K slices
        MoeOp::GateUp => Lists {
            tiles: &[(16, 1), (32, 1), (64, 2), (64, 4)],
            warps_k: &[4, 8, 16],
            splits: &[1, 2],
            depths: &[1, 2, 3],
            min_ctas: &[1, 2, 4],
            walks: &[0, 1, 2],
        },
        // short K: many weight rows per CTA, a persistent walk
        MoeOp::Down => Lists {
            tiles: &[(32, 2), (64, 4), (128, 4), (128, 8), (256, 8)],
            warps_k: &[1, 2],
            splits: &[1],
            depths: &[1, 2],
            min_ctas: &[1, 2, 4],
            walks: &[0, 2, 4],
        },
    };
    let Lists { tiles, warps_k, splits, depths, min_ctas, walks } = lists;
    for block_m in [8, 16, 32] {
        for &(block_n, warps_n) in tiles {
            for &wk in warps_k {
                for &split_k in splits {
                    // one pass per K slice when it fits, else the smallest legal pass
                    let slice = k / split_k;
                    for block_k in [slice, 128 * wk, 256 * wk] {
                        for &depth in depths {
                            for &mc in min_ctas {
                                for &walk in walks {
                                    let c = GroupedConfig {
                                        op,
                                        block_m,
                                        block_n,
                                        block_k,
                                        warps_n,
                                        warps_k: wk,
                                        depth,
                                        split_k,
                                        min_ctas: mc,
                                        walk,
                                    };
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
    out
}

/// The routing and finalize kernels (fixed code, one instantiation each).
pub fn align_source() -> KernelSource {
    KernelSource::from_unit(
        "fp4tune_moe_align".to_string(),
        Arch::Sm90a,
        "#include \"moe/align.cuh\"\n\
         extern \"C\" __global__ void __launch_bounds__(fp4tune::moe::ALIGN_THREADS) fp4tune_moe_align(const fp4tune::moe::AlignParams p) {\n\
         \x20   fp4tune::moe::moe_align(p);\n\
         }\n",
    )
    .expect("moe/align.cuh is embedded")
}

pub fn finalize_source() -> KernelSource {
    KernelSource::from_unit(
        "fp4tune_moe_finalize".to_string(),
        Arch::Sm90a,
        "#include \"moe/finalize.cuh\"\n\
         extern \"C\" __global__ void __launch_bounds__(fp4tune::moe::FINALIZE_THREADS) fp4tune_moe_finalize(const fp4tune::moe::FinalizeParams p) {\n\
         \x20   fp4tune::moe::moe_finalize(p);\n\
         }\n",
    )
    .expect("moe/finalize.cuh is embedded")
}

/// Hex SHA-256 of the templates the grouped kernels are built from (common/, sm90/, moe/).
pub fn template_hash() -> String {
    crate::template::template_tree_hash(&["common/", "sm90/", "moe/"])
}

/// Threads of the align and finalize kernels (templates/moe/align.cuh, finalize.cuh).
pub const ALIGN_THREADS: u32 = 1024;
pub const FINALIZE_THREADS: u32 = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_space_is_legal_and_covers_both_ops_of_both_glm5_shapes() {
        for shape in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8] {
            for op in MoeOp::ALL {
                let space = search_space(op, &shape);
                assert!(space.len() >= 20, "{op} {shape}: {} configurations", space.len());
                for c in &space {
                    c.check(&shape).unwrap();
                    assert_eq!(c.op, op);
                }
                for bm in [8, 16] {
                    assert!(space.iter().any(|c| c.block_m == bm), "{op}: no block_m {bm}");
                }
                assert!(space.iter().any(|c| c.walk > 0) && space.iter().any(|c| c.walk == 0));
            }
        }
    }

    #[test]
    fn illegal_configurations_say_why() {
        let shape = MoeShape::GLM5_TP8;
        let good = GroupedConfig {
            op: MoeOp::Down,
            block_m: 8,
            block_n: 128,
            block_k: 256,
            warps_n: 4,
            warps_k: 1,
            depth: 2,
            split_k: 1,
            min_ctas: 1,
            walk: 2,
        };
        good.check(&shape).unwrap();
        let e = GroupedConfig { depth: 3, ..good }.check(&shape).unwrap_err();
        assert!(e.reason.contains("multiple of depth"), "{e}");
        let e = GroupedConfig { block_m: 64, ..good }.check(&shape).unwrap_err();
        assert!(e.reason.contains("block_m"), "{e}");
        let e = GroupedConfig { block_k: 512, ..good }.check(&shape).unwrap_err();
        assert!(e.reason.contains("K = 256"), "{e}");
        let e = GroupedConfig { depth: 8, block_m: 32, ..good }.check(&shape).unwrap_err();
        assert!(e.reason.contains("register ring"), "{e}");
        let many = MoeShape { experts: 100_000, ..shape };
        assert!(good.check(&many).unwrap_err().reason.contains("local experts"));
    }

    #[test]
    fn names_and_sources_are_stable_and_distinct() {
        let shape = MoeShape::GLM5_TP8;
        let space = search_space(MoeOp::GateUp, &shape);
        let mut names: Vec<String> = space.iter().map(|c| c.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), space.len());
        let a = space[0].source();
        assert_eq!(a.hash(), space[0].source().hash());
        assert!(a.code.contains("Grouped<Cfg, fp4tune::moe::OP_GATE_UP>"));
        // the walk is a launch parameter: same kernel
        let other_walk = GroupedConfig { walk: space[0].walk + 1, ..space[0] };
        assert_eq!(other_walk.kernel_name(), space[0].kernel_name());
    }

    #[test]
    fn grids_cover_every_tile_or_walk_persistently() {
        let shape = MoeShape::GLM5_TP8;
        let c = GroupedConfig {
            op: MoeOp::GateUp,
            block_m: 8,
            block_n: 64,
            block_k: 6144,
            warps_n: 2,
            warps_k: 8,
            depth: 1,
            split_k: 1,
            min_ctas: 1,
            walk: 0,
        };
        assert_eq!(c.grid(&shape, 300, 132), (8, 300, 1));
        assert_eq!(GroupedConfig { walk: 2, ..c }.grid(&shape, 300, 132), (8, 33, 1));
        assert_eq!(GroupedConfig { walk: 2, ..c }.grid(&shape, 9, 132), (8, 9, 1));
    }

    /// Every grouped variant of the default space compiles for sm_90a without spills (NVRTC, no
    /// GPU needed); the SASS has the bf16 HMMA and no local memory when cuobjdump is there.
    #[test]
    fn nvrtc_compiles_grouped_kernels_without_spills() {
        use crate::compile::{sass, Compiler};
        let dir = tempfile::tempdir().unwrap();
        let compiler =
            Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
        let shape = MoeShape::GLM5_TP8;
        let mut sources = vec![align_source(), finalize_source()];
        for op in MoeOp::ALL {
            let space = search_space(op, &shape);
            // a spread of the space: every 13th kernel (distinct kernels only)
            let mut seen = std::collections::HashSet::new();
            for c in space.iter().step_by(13) {
                if seen.insert(c.kernel_name()) {
                    sources.push(c.source());
                }
            }
        }
        assert!(sources.len() >= 10);
        for (src, r) in sources.iter().zip(compiler.compile_many(&sources)) {
            let k = r.unwrap_or_else(|e| panic!("{}: {e}", src.kernel_name));
            let stats = k.stats.as_ref().expect("ptxas statistics");
            assert!(!stats.spills(), "{}: spills", src.kernel_name);
            if let Ok(text) = sass::dump_sass(&src.kernel_name, &k.cubin) {
                assert!(!sass::uses_local_memory(&text), "{}: local memory", src.kernel_name);
                if src.kernel_name.starts_with("fp4tune_sm90_") {
                    assert!(sass::count_opcode(&text, "HMMA") > 0, "{}: no HMMA", src.kernel_name);
                }
            }
        }
    }
}
