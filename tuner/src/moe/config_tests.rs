//! Tests of the grouped configuration: its rules and their messages, names, kernel sources and
//! grids, and the sm90 grouped kernels compiling for sm_90a without spills.

use super::*;
use crate::moe::space::{distinct_kernels, search_space, search_space_for};
use crate::moe::templates::{
    align_source, finalize_source, AlignKernel, FINALIZE_GROUPED_SLOTS, FINALIZE_SINGLE_SLOT,
};
use crate::template::Arch;

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
        family: Family::Sm90,
        a_type: AType::Bf16,
        warp_ring: false,
        tiled: false,
        warps_m: 1,
        wgmma: false,
        k_tail: false,
        a_smem: false,
        flow: false,
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
    // the warp ring: 2..8 stages of shared memory per warp, sm90 only
    let ring = GroupedConfig { warp_ring: true, ..good };
    ring.check(&shape).unwrap();
    let e = GroupedConfig { depth: 1, ..ring }.check(&shape).unwrap_err();
    assert!(e.reason.contains("2..8 stages"), "{e}");
    let sm120 = GroupedConfig { family: Family::Sm120, a_type: AType::Nvfp4, ..ring };
    assert!(sm120.check(&shape).unwrap_err().reason.contains("family sm90"));
    // 8 warps x 6 stages x 4 m16 tiles x 2 row halves x 640 bytes: over an SM
    let big = GroupedConfig { block_n: 512, warps_n: 8, depth: 6, ..ring };
    assert_eq!(big.smem_bytes(), 8 * 6 * 4 * 2 * 640);
    let e = big.check(&shape).unwrap_err();
    assert!(e.reason.contains("228 KiB"), "{e}");
    let many = MoeShape { experts: 100_000, ..shape };
    assert!(good.check(&many).unwrap_err().reason.contains("local experts"));
}

#[test]
fn w4a4_rules_say_why() {
    let shape = MoeShape::GLM5_TP8;
    let good = GroupedConfig {
        op: MoeOp::GateUp,
        block_m: 8,
        block_n: 64,
        block_k: 6144,
        warps_n: 2,
        warps_k: 4,
        depth: 2,
        split_k: 1,
        min_ctas: 1,
        walk: 0,
        family: Family::Sm90,
        a_type: AType::Nvfp4,
        warp_ring: false,
        tiled: false,
        warps_m: 1,
        wgmma: false,
        k_tail: false,
        a_smem: false,
        flow: false,
    };
    good.check(&shape).unwrap();
    // 16 weight rows per warp hold 8 columns of H: half a quantization block
    let e = GroupedConfig { block_n: 32, ..good }.check(&shape).unwrap_err();
    assert!(e.reason.contains("16-column blocks"), "{e}");
    GroupedConfig { block_n: 32, a_type: AType::Bf16, ..good }.check(&shape).unwrap();
    GroupedConfig { op: MoeOp::Down, block_k: 256, block_n: 32, warps_k: 1, ..good }
        .check(&shape)
        .unwrap();
    let odd = MoeShape { inter: 264, ..shape };
    let e = good.check(&odd).unwrap_err();
    assert!(e.reason.contains("multiple of 16"), "{e}");
    // NVFP4 activations take fewer ring registers: a deeper ring fits
    let deep = GroupedConfig { depth: 4, ..good };
    deep.check(&shape).unwrap();
    GroupedConfig { a_type: AType::Bf16, ..deep }.check(&shape).unwrap_err();
}

#[test]
fn w4a16_names_are_unchanged_and_old_files_read_as_sm90_w4a16() {
    let c = search_space(MoeOp::Down, &MoeShape::GLM5_TP8)
        .into_iter()
        .find(|c| c.block_n == 128 && c.warps_n == 4 && c.depth == 2 && c.walk == 2)
        .unwrap();
    assert!(c.name().starts_with("moe_down_m"), "{}", c.name());
    assert!(c.kernel_name().starts_with("fp4tune_sm90_moe_down_m"), "{}", c.kernel_name());
    let ron = ron::to_string(&c).unwrap();
    assert!(!ron.contains("family") && !ron.contains("a_type"), "{ron}");
    let old = "(op: Down, block_m: 8, block_n: 128, block_k: 256, warps_n: 4, warps_k: 1, \
                   depth: 2, split_k: 1, min_ctas: 1, walk: 2)";
    let read: GroupedConfig = ron::from_str(old).unwrap();
    assert_eq!((read.family, read.a_type), (Family::Sm90, AType::Bf16));
    let w4a4 = GroupedConfig { a_type: AType::Nvfp4, ..read };
    assert_eq!(w4a4.name(), "moe_down_w4a4_m8n128k256_w4x1_d2_s1_o1_walk2");
    assert_eq!(ron::from_str::<GroupedConfig>(&ron::to_string(&w4a4).unwrap()).unwrap(), w4a4);
    assert_ne!(w4a4.kernel_name(), read.kernel_name());
    assert!(w4a4.source().code.contains("GroupedConfig<8, 128, 256, 4, 1, 2, 1, true, false, 1>"));
}

#[test]
fn warp_ring_names_sources_and_files() {
    let c = search_space(MoeOp::Down, &MoeShape::GLM5_TP8)
        .into_iter()
        .find(|c| c.warp_ring && c.block_n == 64 && c.warps_n == 4 && c.walk == 2)
        .unwrap();
    assert!(c.name().contains("_w4x1_p2_s1_"), "{}", c.name());
    assert!(c.kernel_name().contains("_w4x1_p2_s1_"), "{}", c.kernel_name());
    let registers = GroupedConfig { warp_ring: false, ..c };
    assert_ne!(c.kernel_name(), registers.kernel_name());
    assert!(c
        .source()
        .code
        .contains(&format!("GroupedConfig<8, 64, 256, 4, 1, 2, 1, false, true, {}>", c.min_ctas)));
    // slots (none: one warp along K) then 4 warps x 2 stages x (1 m16 tile x 2 x 640 bytes)
    assert_eq!(c.smem_bytes(), 4 * 2 * 2 * 640);
    let ron = ron::to_string(&c).unwrap();
    assert!(ron.contains("warp_ring:true"), "{ron}");
    assert_eq!(ron::from_str::<GroupedConfig>(&ron).unwrap(), c);
    assert!(!ron::to_string(&registers).unwrap().contains("warp_ring"));
}

/// Counts read from a file can be anything: refused with a reason, never an overflow.
#[test]
fn huge_warp_counts_are_refused_not_overflowed() {
    let shape = MoeShape::GLM5_TP8;
    let c = search_space(MoeOp::Down, &shape)[0];
    for bad in [
        GroupedConfig { warps_m: u32::MAX, ..c },
        GroupedConfig { warps_k: 1 << 20, warps_n: 1 << 20, block_n: 1 << 20, ..c },
        GroupedConfig { warps_m: u32::MAX, tiled: true, ..c },
        GroupedConfig { warps_m: 2, family: Family::Sm120, a_type: AType::Nvfp4, ..c },
    ] {
        assert!(bad.check(&shape).is_err(), "{bad}");
    }
    assert_eq!(GroupedConfig { warps_m: u32::MAX, ..c }.threads(), u32::MAX);
}

#[test]
fn tiled_configurations_are_gemm_tiles_with_their_own_names_sources_and_rules() {
    for shape in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8] {
        for op in MoeOp::ALL {
            let tiled: Vec<_> =
                search_space(op, &shape).into_iter().filter(|c| c.tiled && !c.wgmma).collect();
            assert!(tiled.len() >= 40, "{op} {shape}: {} tiled configurations", tiled.len());
            assert!(search_space_for(Family::Sm90, AType::Nvfp4, op, &shape)
                .iter()
                .all(|c| !c.tiled));
            for c in &tiled {
                let g = c.tile_gemm();
                g.check().unwrap();
                assert_eq!(c.smem_bytes(), g.smem_bytes());
                assert_eq!(c.threads(), g.threads());
                assert_eq!(c.grid(&shape, 77, 132), (shape.nk(op).0.div_ceil(c.block_n), 77, 1));
            }
        }
    }
    let c = search_space(MoeOp::GateUp, &MoeShape::GLM5_TP8)
        .into_iter()
        .find(|c| c.tiled && c.block_m == 32 && c.block_n == 128 && c.warps_n == 4 && c.depth == 3)
        .unwrap();
    assert_eq!(c.name(), "moe_gate_up_m32n128k128_w1x4x1_t3_s1_o1_walk0");
    let src = c.source().code;
    assert!(src.contains("TiledConfig<32, 128, 128, 1, 4, 3, 1, false>"), "{src}");
    assert!(src.contains("GroupedTiled<Cfg, fp4tune::moe::OP_GATE_UP>"));
    let streamed = GroupedConfig { tiled: false, depth: 1, block_k: 6144, warps_k: 4, ..c };
    assert_ne!(streamed.kernel_name(), c.kernel_name());
    let ron = ron::to_string(&c).unwrap();
    assert!(ron.contains("tiled:true") && !ron.contains("warps_m"), "{ron}");
    assert_eq!(ron::from_str::<GroupedConfig>(&ron).unwrap(), c);
    let wm = GroupedConfig { warps_m: 2, warps_n: 2, ..c };
    assert!(ron::to_string(&wm).unwrap().contains("warps_m:2"));
    assert_eq!(ron::from_str::<GroupedConfig>(&ron::to_string(&wm).unwrap()).unwrap(), wm);
    let shape = MoeShape::GLM5_TP8;
    let why = |x: GroupedConfig| x.check(&shape).unwrap_err().reason;
    assert!(why(GroupedConfig { a_type: AType::Nvfp4, ..c }).contains("bf16"));
    assert!(why(GroupedConfig { split_k: 2, ..c }).contains("one K slice"));
    assert!(why(GroupedConfig { walk: 2, ..c }).contains("walk 0"));
    assert!(why(GroupedConfig { warp_ring: true, ..c }).contains("warp ring"));
    assert!(why(GroupedConfig { family: Family::Sm120, ..c }).contains("family sm90"));
    let e = why(GroupedConfig { block_k: 512, ..c });
    assert!(e.contains("block_k"), "{e}");
    assert!(why(GroupedConfig { depth: 8, block_k: 256, block_n: 256, warps_n: 8, ..c })
        .contains("shared memory"));
    // streamed kernels keep one warp along the routed rows
    assert!(why(GroupedConfig { warps_m: 2, ..streamed }).contains("warps_m"));
    // CTAs per SM of a tiled kernel: its threads and stages must fit them all
    let e = why(GroupedConfig { min_ctas: 8, ..c });
    assert!(e.contains("8 CTAs") && e.contains("do not fit in one SM"), "{e}");
    let k64 = GroupedConfig { block_k: 64, depth: 4, block_m: 64, min_ctas: 3, ..c };
    k64.check(&shape).unwrap();
    assert_eq!(k64.name(), "moe_gate_up_m64n128k64_w1x4x1_t4_s1_o3_walk0");
    assert!(k64.source().code.contains("__launch_bounds__(128, 3)"));
    // the K-tail form: its own name and template flag, 64-k stages, any K of 16-k blocks
    let tail = GroupedConfig { k_tail: true, ..k64 };
    assert_eq!(tail.name(), "moe_gate_up_m64n128k64_w1x4x1_kt4_s1_o3_walk0");
    assert_ne!(tail.kernel_name(), k64.kernel_name());
    assert!(tail.source().code.contains("TiledConfig<64, 128, 64, 1, 4, 4, 3, true>"));
    let ron = ron::to_string(&tail).unwrap();
    assert!(ron.contains("k_tail:true"), "{ron}");
    assert!(!ron::to_string(&k64).unwrap().contains("k_tail"));
    let air = MoeShape { hidden: 4096, inter: 176, experts: 128, top_k: 8 };
    GroupedConfig { op: MoeOp::Down, ..tail }.check(&air).unwrap();
    let e = GroupedConfig { op: MoeOp::Down, ..k64 }.check(&air).unwrap_err().reason;
    assert!(e.contains("K = 176 must be a multiple of block_k"), "{e}");
    assert!(why(GroupedConfig { block_k: 128, min_ctas: 1, ..tail }).contains("stages of 64 k"));
    assert!(why(GroupedConfig { k_tail: true, ..streamed }).contains("form of the sm90 tiled"));
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
    assert_eq!(other_walk.source().hash(), a.hash(), "one unit, compiled once");
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
        family: Family::Sm90,
        a_type: AType::Bf16,
        warp_ring: false,
        tiled: false,
        warps_m: 1,
        wgmma: false,
        k_tail: false,
        a_smem: false,
        flow: false,
    };
    assert_eq!(c.grid(&shape, 300, 132), (8, 300, 1));
    assert_eq!(GroupedConfig { walk: 2, ..c }.grid(&shape, 300, 132), (8, 33, 1));
    assert_eq!(GroupedConfig { walk: 2, ..c }.grid(&shape, 9, 132), (8, 9, 1));
}

/// Every distinct W4A4 register-ring grouped kernel of both GLM-5 layers, and every third
/// warp-ring one, compiles for sm_90a (NVRTC, no GPU needed) without spills (a warp-ring
/// kernel may spill and is then refused at load), with a sane register count, the bf16 HMMA
/// and no local memory apart from spills in its SASS (when cuobjdump is there). Through the
/// default cubin cache: a second run only reads it.
#[test]
fn every_w4a4_grouped_kernel_compiles_for_sm90_without_spills() {
    use crate::compile::{sass, Compiler};
    let compiler = Compiler::with_default_cache().unwrap_or_else(|e| panic!("{e}"));
    let mut configs = distinct_kernels(&[MoeShape::GLM5_TP8, MoeShape::GLM5_EP8], |op, shape| {
        search_space_for(Family::Sm90, AType::Nvfp4, op, shape)
    });
    let mut rings = 0;
    configs.retain(|c| {
        rings += usize::from(c.warp_ring);
        !c.warp_ring || rings % 3 == 1
    });
    assert!(configs.iter().any(|c| c.warp_ring));
    assert!(configs.len() >= 100, "{} kernels", configs.len());
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
        let stats = k.stats.as_ref().unwrap_or_else(|| {
            panic!("{c}: no ptxas statistics in the NVRTC log ({:?}):\n{}", k.origin, k.log)
        });
        // A warp-ring kernel at its register cap may spill: the runtime refuses it at load
        // (a failed candidate); the register ring's budget rules spills out.
        let spills = stats.spills() && !c.warp_ring;
        if spills || stats.registers > c.register_cap() || stats.registers < 32 {
            problems.push(format!("{c}: {stats:?} (cap {})", c.register_cap()));
        }
        if let Ok(text) = sass::dump_sass(&k.kernel_name, &k.cubin) {
            let local = sass::uses_local_memory(&text) && !stats.spills();
            if local || sass::count_opcode(&text, "HMMA") == 0 {
                problems.push(format!("{c}: local memory or no HMMA in the SASS"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {}:\n{}",
        problems.len(),
        configs.len(),
        problems.join("\n")
    );
}

/// A spread of the grouped variants of the default space (streamed and tiled) compiles for
/// sm_90a without spills (NVRTC, no GPU needed); the SASS has the bf16 HMMA and no local
/// memory when cuobjdump is there.
#[test]
fn nvrtc_compiles_grouped_kernels_without_spills() {
    use crate::compile::{sass, Compiler};
    let dir = tempfile::tempdir().unwrap();
    let compiler = Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
    let shape = MoeShape::GLM5_TP8;
    // The fixed kernels for both families' architectures.
    let mut sources = Vec::new();
    for arch in [Arch::Sm90a, Arch::Sm120a] {
        sources.extend(AlignKernel::ALL.map(|k| align_source(arch, k)));
        sources.extend(
            [FINALIZE_GROUPED_SLOTS, FINALIZE_SINGLE_SLOT].map(|g| finalize_source(arch, g)),
        );
    }
    let mut warp_rings = std::collections::HashSet::new();
    for op in MoeOp::ALL {
        let space = search_space(op, &shape);
        // a spread of the space: every 23rd streamed kernel and every 5th tiled one
        // (distinct kernels only; the wgmma kernels have their own test in moe::wgmma)
        let mut seen = std::collections::HashSet::new();
        let (tiled, streamed): (Vec<&GroupedConfig>, Vec<_>) =
            space.iter().filter(|c| !c.wgmma).partition(|c| c.tiled);
        for c in streamed.into_iter().step_by(23).chain(tiled.into_iter().step_by(5)) {
            if seen.insert(c.kernel_name()) {
                sources.push(c.source());
                if c.warp_ring {
                    warp_rings.insert(c.kernel_name());
                }
            }
        }
    }
    // a down K of 192 (Qwen3-235B over 8 GPUs): the tiled kernel's 64-k stages, every 3rd
    let qwen = MoeShape { hidden: 4096, inter: 192, experts: 128, top_k: 8 };
    let k64: Vec<_> =
        search_space(MoeOp::Down, &qwen).into_iter().filter(|c| c.tiled && !c.wgmma).collect();
    assert!(!k64.is_empty() && k64.iter().all(|c| c.block_k == 64));
    sources.extend(k64.iter().step_by(3).map(|c| c.source()));
    // a down K of 176 (GLM-4.5-Air over 8 GPUs): every kernel of the tiled kernel's K-tail form
    let air = MoeShape { hidden: 4096, inter: 176, experts: 128, top_k: 8 };
    let tails = search_space(MoeOp::Down, &air);
    assert!(tails.len() >= 16 && tails.iter().all(|c| c.k_tail), "{}", tails.len());
    sources.extend(tails.iter().map(|c| c.source()));
    assert!(sources.len() >= 10);
    for (src, r) in sources.iter().zip(compiler.compile_many(&sources)) {
        let k = r.unwrap_or_else(|e| panic!("{}: {e}", src.kernel_name));
        let stats = k.stats.as_ref().unwrap_or_else(|| {
            panic!(
                "{}: no ptxas statistics in the NVRTC log ({:?}):\n{}",
                src.kernel_name, k.origin, k.log
            )
        });
        // A warp-ring kernel at its register cap may spill: the runtime refuses it at load
        // (a failed candidate); the register ring's budget rules spills out.
        let warp_ring = warp_rings.contains(&src.kernel_name);
        assert!(!stats.spills() || warp_ring, "{}: spills", src.kernel_name);
        if let Ok(text) = sass::dump_sass(&src.kernel_name, &k.cubin) {
            let local = sass::uses_local_memory(&text) && !stats.spills();
            assert!(!local, "{}: local memory", src.kernel_name);
            if src.kernel_name.starts_with("fp4tune_sm90_") {
                assert!(sass::count_opcode(&text, "HMMA") > 0, "{}: no HMMA", src.kernel_name);
            }
        }
    }
}

/// The activations in the warp ring (`a_smem`): their own name, the template's eleventh
/// argument, shared memory with the activation runs and halved scale words, no activation
/// registers, W4A16 warp rings only, and the measured seeds compile without spills.
#[test]
fn activations_in_the_warp_ring_are_named_checked_and_compile_without_spills() {
    use crate::compile::{sass, Compiler};
    let shape = MoeShape::GLM5_TP8;
    let c: GroupedConfig = ron::from_str(
        "(op: GateUp, block_m: 8, block_n: 32, block_k: 512, warps_n: 1, warps_k: 4, depth: 3, \
         split_k: 1, min_ctas: 4, walk: 0, warp_ring: true, a_smem: true)",
    )
    .unwrap();
    c.check(&shape).unwrap();
    assert_eq!(c.name(), "moe_gate_up_m8n32k512_w1x4_pa3_s1_o4_walk0");
    let registers_x = GroupedConfig { a_smem: false, ..c };
    assert_ne!(c.kernel_name(), registers_x.kernel_name());
    // 3 stages with the activations fit at 4 CTAs per SM; without them the register ring does not
    assert_eq!(c.ring_regs(), 0);
    assert_eq!(registers_x.ring_regs(), 48);
    // slots (4 warps along K x 8 floats x 32 lanes), then 4 warps x 3 stages x (2 m16 tiles x 2
    // x (512 + 64) bytes + 1 n8 tile x 2048 bytes)
    assert_eq!(c.smem_bytes(), 4096 + 4 * 3 * (2 * 2 * 576 + 2048));
    assert!(c
        .source()
        .code
        .contains("GroupedConfig<8, 32, 512, 1, 4, 3, 1, false, true, 4, true>"));
    assert!(registers_x
        .source()
        .code
        .contains("GroupedConfig<8, 32, 512, 1, 4, 3, 1, false, true, 4>"));
    let ron = ron::to_string(&c).unwrap();
    assert!(ron.contains("a_smem:true"), "{ron}");
    assert_eq!(ron::from_str::<GroupedConfig>(&ron).unwrap(), c);
    assert!(!ron::to_string(&registers_x).unwrap().contains("a_smem"));
    for bad in
        [GroupedConfig { warp_ring: false, ..c }, GroupedConfig { a_type: AType::Nvfp4, ..c }]
    {
        let e = bad.check(&shape).unwrap_err();
        assert!(e.reason.contains("a_smem"), "{}: {}", bad, e.reason);
    }
    // a fourth stage is over the shared memory of 4 CTAs
    let e = GroupedConfig { depth: 4, ..c }.check(&shape).unwrap_err();
    assert!(e.reason.contains("shared memory"), "{}", e.reason);
    // the space has them (W4A16 only), and the measured ones compile without spills
    for op in MoeOp::ALL {
        assert!(search_space(op, &shape).iter().any(|c| c.a_smem), "{op}");
        let w4a4 = search_space_for(Family::Sm90, AType::Nvfp4, op, &shape);
        assert!(!w4a4.iter().any(|c| c.a_smem), "{op}");
    }
    let seeds: Vec<_> = MoeOp::ALL
        .into_iter()
        .flat_map(|op| crate::moe::seeds::measured_seeds(Family::Sm90, AType::Bf16, op))
        .filter(|c| c.a_smem)
        .collect();
    assert!(seeds.len() >= 2);
    let dir = tempfile::tempdir().unwrap();
    let compiler = Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
    let sources: Vec<_> = seeds.iter().map(|c| c.source()).collect();
    for (src, r) in sources.iter().zip(compiler.compile_many(&sources)) {
        let k = r.unwrap_or_else(|e| panic!("{}: {e}", src.kernel_name));
        let stats = k.stats.as_ref().expect("ptxas statistics");
        assert!(!stats.spills(), "{}: spills", src.kernel_name);
        if let Ok(text) = sass::dump_sass(&src.kernel_name, &k.cubin) {
            assert!(!sass::uses_local_memory(&text), "{}: local memory", src.kernel_name);
            assert!(sass::count_opcode(&text, "LDGSTS") > 0, "{}: no cp.async", src.kernel_name);
        }
    }
}

/// The warp ring running on across tiles (`flow`): its own name and template argument, any depth
/// (a depth that does not divide a tile's chunks is refused without it), the activations in the
/// ring required, and in the space only where the same depth without it is illegal.
#[test]
fn a_ring_across_tiles_takes_any_depth_and_is_named() {
    let shape = MoeShape::GLM5_TP8;
    let c: GroupedConfig = ron::from_str(
        "(op: Down, block_m: 8, block_n: 128, block_k: 256, warps_n: 4, warps_k: 1, depth: 3, \
         split_k: 1, min_ctas: 4, walk: 4, warp_ring: true, a_smem: true, flow: true)",
    )
    .unwrap();
    c.check(&shape).unwrap();
    assert_eq!(c.name(), "moe_down_m8n128k256_w4x1_pf3_s1_o4_walk4");
    let pa = GroupedConfig { flow: false, ..c };
    assert_ne!(c.kernel_name(), pa.kernel_name());
    // 2 chunks per warp and tile at K = 256: a 3-stage ring only runs across tiles
    let e = pa.check(&shape).unwrap_err();
    assert!(e.reason.contains("multiple of depth 3"), "{}", e.reason);
    assert_eq!(c.smem_bytes(), pa.smem_bytes());
    assert!(c
        .source()
        .code
        .contains("GroupedConfig<8, 128, 256, 4, 1, 3, 1, false, true, 4, true, true>"));
    let ron = ron::to_string(&c).unwrap();
    assert!(ron.contains("flow:true"), "{ron}");
    assert_eq!(ron::from_str::<GroupedConfig>(&ron).unwrap(), c);
    assert!(!ron::to_string(&pa).unwrap().contains("flow"));
    let e = GroupedConfig { a_smem: false, ..c }.check(&shape).unwrap_err();
    assert!(e.reason.contains("flow"), "{}", e.reason);
    // a depth of 5 at 2 CTAs per SM: legal with flow, over the shared memory at 4
    GroupedConfig { depth: 5, min_ctas: 2, ..c }.check(&shape).unwrap();
    let e = GroupedConfig { depth: 5, ..c }.check(&shape).unwrap_err();
    assert!(e.reason.contains("shared memory"), "{}", e.reason);
    // the space holds flow rings, each one whose twin without flow is illegal
    for shape in [MoeShape::GLM5_TP8, MoeShape::GLM5_EP8] {
        let space = search_space(MoeOp::Down, &shape);
        let flows: Vec<_> = space.iter().filter(|c| c.flow).collect();
        assert!(!flows.is_empty());
        for f in flows {
            assert!(GroupedConfig { flow: false, ..*f }.check(&shape).is_err(), "{f}");
        }
        assert!(search_space(MoeOp::GateUp, &shape).iter().any(|c| c.flow));
        let w4a4 = search_space_for(Family::Sm90, AType::Nvfp4, MoeOp::Down, &shape);
        assert!(!w4a4.iter().any(|c| c.flow));
    }
}
