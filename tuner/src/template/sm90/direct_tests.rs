use super::tests::{conflict_degree, swizzled_sf_offset};
use super::*;
use crate::problem::AType;
use crate::template::GemmConfig;

/// Mirror of `direct.cuh: direct_code_unit_swizzle`.
fn direct_code_unit_swizzle(r: u32, u: u32) -> u32 {
    u ^ (((r & 1) << 2) | (((r >> 1) & 1) << 1))
}

/// Mirror of `direct.cuh: bf16_run_offsets` (byte offset of word w of lane (g, t)'s run in
/// token row r at pass-local k = 0, for a slice of `block_k` bf16 per row).
fn bf16_run_offset(block_k: u32, r: u32, t: u32, w: u32) -> u32 {
    let x = ((t >> 1) << 1) | (r & 1);
    r * block_k * 2 + (4 * t + (w ^ x)) * 16
}

/// The precomputed activation offsets of the streamed kernels equal the swizzled unit of
/// `bf16_unit_swizzle` at every chunk (the swizzle does not depend on the chunk), and those
/// loads are free of bank conflicts.
#[test]
fn bf16_run_offsets_match_the_swizzle_and_do_not_conflict() {
    for block_k in [256u32, 512, 3072] {
        for kp in (0..block_k).step_by(128) {
            for r in 0..16 {
                for t in 0..4 {
                    for w in 0..4 {
                        let u = kp / 8 + 4 * t + w;
                        let want = r * block_k * 2 + bf16_unit_swizzle(r, u) * 16;
                        assert_eq!(kp * 2 + bf16_run_offset(block_k, r, t, w), want);
                    }
                }
            }
            for w in 0..4 {
                let addrs: Vec<u32> = (0..32)
                    .map(|lane| kp * 2 + bf16_run_offset(block_k, lane / 4, lane % 4, w))
                    .collect();
                assert_eq!(conflict_degree(&addrs, 16), 1, "block_k {block_k} kp {kp} w {w}");
            }
        }
    }
}

/// NVFP4 activation slices (W4A4): lane (g, t) reads unit kp/32 + t of token row g; the
/// swizzle is a permutation of each row's units and keeps the 16-byte loads conflict-free.
#[test]
fn fp4_activation_slice_loads_do_not_conflict() {
    for block_k in [256u32, 1024] {
        let units = block_k / 32;
        for r in 0..16 {
            let mut seen: Vec<u32> = (0..units).map(|u| direct_code_unit_swizzle(r, u)).collect();
            seen.sort();
            assert_eq!(seen, (0..units).collect::<Vec<_>>());
        }
        for kp in (0..block_k).step_by(128) {
            let addrs: Vec<u32> = (0..32)
                .map(|lane| {
                    let (g, t) = (lane / 4, lane % 4);
                    g * (block_k / 2) + direct_code_unit_swizzle(g, kp / 32 + t) * 16
                })
                .collect();
            assert_eq!(conflict_degree(&addrs, 16), 1, "block_k {block_k} kp {kp}");
        }
    }
}

/// The weight scales: the register ring reads 2 bytes at swizzled_sf_offset(row, k0/16 + 2t);
/// the warp ring copies the 4-byte word at swizzled_sf_offset(row, 4 * (t / 2)) + k0 * 8 and
/// keeps half t % 2 of it. Both name the lane's blocks 2t and 2t + 1 of every chunk.
#[test]
fn weight_scale_addressing_of_both_rings_names_the_lane_blocks() {
    for k in [256u32, 2048, 6144] {
        let ksf_pad = (k / 16).div_ceil(4) * 4;
        for row in [0u32, 5, 31, 32, 127, 128, 300] {
            for k0 in (0..k).step_by(128) {
                for t in 0..4 {
                    let b = k0 / 16 + 2 * t;
                    let reg = swizzled_sf_offset(row, 2 * t, ksf_pad) + (k0 / 64) * 512;
                    assert_eq!(reg, swizzled_sf_offset(row, b, ksf_pad));
                    assert_eq!(reg + 1, swizzled_sf_offset(row, b + 1, ksf_pad));
                    let word = swizzled_sf_offset(row, 4 * (t / 2), ksf_pad) + (k0 / 64) * 512;
                    assert_eq!(word % 4, 0);
                    assert_eq!(word + 2 * (t % 2), swizzled_sf_offset(row, b, ksf_pad));
                }
            }
        }
    }
}

#[test]
fn direct_space_is_legal_and_sized() {
    for a_type in [AType::Bf16, AType::Nvfp4] {
        let space = direct_space(a_type);
        eprintln!("{a_type}: {} register-streamed configurations", space.len());
        assert!(space.len() > 200 && space.len() < 2500, "{}", space.len());
        for c in &space {
            check(c).unwrap();
            assert!(c.name().contains(&format!("_r{}_", c.stages)), "{c}");
        }
        let ring = warp_ring_space(a_type);
        eprintln!("{a_type}: {} warp-ring configurations", ring.len());
        assert!(ring.len() > 100 && ring.len() < 1500, "{}", ring.len());
        for c in &ring {
            check(c).unwrap();
            assert!(c.name().contains(&format!("_p{}_", c.stages)), "{c}");
        }
        let global = global_space(a_type);
        eprintln!("{a_type}: {} global configurations", global.len());
        assert!(global.len() > 200 && global.len() < 2500, "{}", global.len());
        for c in space.iter().chain(&ring).chain(&global) {
            check(c).unwrap();
            // Occupancy variants: named _o<n>, at most 32 warps per SM.
            assert_eq!(c.name().ends_with(&format!("_o{}", c.min_ctas)), c.min_ctas > 1, "{c}");
            assert!(c.min_ctas == 1 || c.threads() / 32 * c.min_ctas <= 32, "{c}");
        }
        assert!(global.iter().any(|c| c.min_ctas == 4));
    }
}

/// The deepest ring of every warp-tile size of the global pipeline, both activation types,
/// compiles for sm_90a without spills or local memory, and touches neither cp.async nor
/// shared memory in its main loop (only split-K partials may go through shared memory).
#[test]
fn nvrtc_compiles_global_pipeline_kernels_without_spills() {
    use crate::compile::sass;
    let mut configs: Vec<GemmConfig> = Vec::new();
    for a_type in [AType::Bf16, AType::Nvfp4] {
        let space = global_space(a_type);
        for (bm, bn, wn) in [(8, 16, 1), (16, 32, 1), (8, 64, 2), (16, 32, 2)] {
            // The deepest ring with 8 warps and with 16 (the tighter register budget).
            for warps in [8, 16] {
                let deepest = space
                    .iter()
                    .filter(|c| {
                        c.block_m == bm
                            && c.block_n == bn
                            && c.warps_n == wn
                            && c.warps_n * c.warps_k == warps
                            && c.split_k == 1
                    })
                    .max_by_key(|c| (c.stages, c.block_k));
                configs.extend(deepest);
            }
        }
    }
    assert_eq!(configs.len(), 16, "{configs:?}");
    compile_without_spills(&configs, |c, text| {
        assert_eq!(sass::count_opcode(text, "LDGSTS"), 0, "{c}: cp.async");
        if c.warps_k == 1 {
            assert_eq!(sass::count_opcode(text, "LDS"), 0, "{c}: shared loads");
        }
    });
}

/// A sample of register-streamed kernels of both activation types, at every ring depth and
/// warp-tile size, compiles for sm_90a without spills or local memory, with the bf16 HMMA and
/// without cp.async for the weights (only the activation slice uses LDGSTS).
#[test]
fn nvrtc_compiles_register_streamed_kernels_without_spills() {
    let mut configs = Vec::new();
    for a_type in [AType::Bf16, AType::Nvfp4] {
        let space = direct_space(a_type);
        for (bm, bn, wn, depth) in [(8, 16, 1, 4), (16, 32, 1, 4), (8, 64, 2, 2), (16, 32, 2, 1)] {
            if let Some(c) = space.iter().find(|c| {
                c.block_m == bm && c.block_n == bn && c.warps_n == wn && c.stages == depth
            }) {
                configs.push(*c);
            }
        }
    }
    for a_type in [AType::Bf16, AType::Nvfp4] {
        let ring = warp_ring_space(a_type);
        configs.extend(ring.iter().find(|c| c.block_m == 8 && c.block_n == 16 && c.stages == 8));
        configs.extend(ring.iter().find(|c| c.block_m == 16 && c.block_n == 64 && c.stages == 4));
    }
    assert!(configs.len() >= 10, "{configs:?}");
    compile_without_spills(&configs, |_, _| {});
}

/// Compiles `configs` for sm_90a and checks each: ptxas statistics without spills, and (when
/// cuobjdump is there) SASS with the bf16 HMMA, no local memory, and `more`.
fn compile_without_spills(configs: &[GemmConfig], more: impl Fn(&GemmConfig, &str)) {
    use crate::compile::{sass, Compiler};
    let dir = tempfile::tempdir().unwrap();
    let compiler = Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
    let sources: Vec<_> = configs.iter().map(|c| c.render().unwrap()).collect();
    for (c, res) in configs.iter().zip(compiler.compile_many(&sources)) {
        let k = res.unwrap_or_else(|e| panic!("{c}: {e}"));
        let stats = k.stats.unwrap_or_else(|| panic!("{c}: no ptxas statistics"));
        eprintln!("{c}: {stats:?}");
        assert!(!stats.spills(), "{c} spills: {stats:?}");
        match sass::dump_sass(&k.kernel_name, &k.cubin) {
            Ok(text) => {
                assert!(sass::count_opcode(&text, "HMMA.16816.F32.BF16") > 0, "{c}: no HMMA");
                assert!(!sass::uses_local_memory(&text), "{c}: local memory");
                more(c, &text);
            }
            Err(sass::SassError::NotFound { .. }) => {
                eprintln!("cuobjdump not found: SASS check skipped")
            }
            Err(e) => panic!("{e}"),
        }
    }
}
