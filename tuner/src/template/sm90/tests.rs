//! CPU tests of the family: checks, shared-memory formula, layout mirrors, exact dequantization,
//! search space and rendering.

use super::*;
use crate::format::{e2m1_decode, e4m3_decode};
use crate::problem::{AType, GemmProblem};
use crate::template::{Family, GemmConfig, Pipeline};
use std::collections::HashSet;

/// The global swizzled scale offset (`format::swizzle::swizzled_offset`) in the mirrors' u32s.
pub(super) fn swizzled_sf_offset(row: u32, kb: u32, ksf_pad: u32) -> u32 {
    crate::format::swizzle::swizzled_offset(row as usize, kb as usize, ksf_pad as usize) as u32
}

/// m16n64k128, 4 warps along N, 4 stages, swap-AB (the first representative configuration).
fn cfg(a_type: AType) -> GemmConfig {
    representative_configs(a_type)[0]
}

fn reject(c: GemmConfig, needle: &str) {
    let e = check(&c).expect_err("config must be rejected");
    assert!(e.reason.contains(needle), "expected `{needle}` in `{}`", e.reason);
}

#[test]
fn constraint_checks_reject_illegal_configs_with_a_message() {
    assert!(check(&cfg(AType::Bf16)).is_ok());
    assert!(check(&default_config(AType::Bf16)).is_ok());
    assert!(check(&default_config(AType::Nvfp4)).is_ok());
    reject(GemmConfig { block_k: 96, ..cfg(AType::Bf16) }, "block_k 96");
    reject(GemmConfig { warps_n: 8, warps_m: 8, warps_k: 4, ..cfg(AType::Bf16) }, "threads");
    // 64 weights over 8 warps = 8 rows: not a multiple of 16 under swap_ab.
    reject(GemmConfig { warps_n: 8, ..cfg(AType::Bf16) }, "multiple of 16");
    // 16 tokens over 4 warps = 4: not a multiple of 8.
    reject(GemmConfig { warps_m: 4, warps_n: 1, ..cfg(AType::Bf16) }, "multiple of 8");
    reject(GemmConfig { warps_k: 4, ..cfg(AType::Bf16) }, "multiple of 64");
    reject(
        GemmConfig {
            block_k: 256,
            warps_k: 1,
            block_m: 128,
            block_n: 256,
            swap_ab: false,
            warps_m: 2,
            warps_n: 4,
            stages: 8,
            ..cfg(AType::Bf16)
        },
        "shared memory",
    );
    reject(
        GemmConfig {
            block_m: 128,
            block_n: 256,
            swap_ab: false,
            warps_m: 1,
            warps_n: 1,
            ..cfg(AType::Bf16)
        },
        "accumulators",
    );
    reject(GemmConfig { stages: 1, ..cfg(AType::Bf16) }, "stages");
    reject(GemmConfig { split_k: 0, ..cfg(AType::Bf16) }, "split_k");
    reject(GemmConfig { family: Family::Sm120, ..cfg(AType::Bf16) }, "family");
}

#[test]
fn problem_checks() {
    let c = GemmConfig { split_k: 8, ..cfg(AType::Bf16) };
    assert!(c.check_problem(&GemmProblem::new(1, 4096, 6144, AType::Bf16)).is_ok());
    let e = c.check_problem(&GemmProblem::new(1, 4096, 6100, AType::Bf16)).unwrap_err();
    assert!(e.reason.contains("multiple of block_k"), "{e}");
    let e = c.check_problem(&GemmProblem::new(1, 4100, 6144, AType::Bf16)).unwrap_err();
    assert!(e.reason.contains("multiple of 8"), "{e}");
    let e = c.check_problem(&GemmProblem::new(1, 4096, 512, AType::Bf16)).unwrap_err();
    assert!(e.reason.contains("exceeds"), "{e}");
    let e = c.check_problem(&GemmProblem::new(1, 4096, 6144, AType::Nvfp4)).unwrap_err();
    assert!(e.reason.contains("built for"), "{e}");
}

/// The K-tail form (`Pipeline::KTail`): the 64-k, one-warp-along-K members of the cp.async space,
/// legal exactly for a K that is a multiple of 16 and not of 64, where no other sm90 kernel is;
/// split-K counts the partial last stage.
#[test]
fn k_tail_form_takes_exactly_the_k_no_whole_stage_kernel_takes() {
    for a_type in [AType::Bf16, AType::Nvfp4] {
        let space = search_space(a_type);
        let tail: Vec<&GemmConfig> =
            space.iter().filter(|c| c.pipeline == Pipeline::KTail).collect();
        assert!((50..=400).contains(&tail.len()), "{a_type}: {} K-tail configurations", tail.len());
        assert!(tail.iter().any(|c| c.swap_ab) && tail.iter().any(|c| !c.swap_ab));
        for c in &tail {
            assert!(c.name().contains("_kt"), "{c}");
        }
        for (n, k) in [(2048, 96), (4096, 176), (48, 208), (4096, 16), (512, 6160)] {
            for m in [1, 8, 130] {
                let p = GemmProblem::new(m, n, k, a_type);
                let legal: Vec<_> = space.iter().filter(|c| c.check_problem(&p).is_ok()).collect();
                assert!(!legal.is_empty(), "{p}: no legal configuration");
                assert!(legal.iter().all(|c| c.pipeline == Pipeline::KTail), "{p}");
            }
        }
        for (n, k) in [(512, 6144), (6144, 256), (16, 64)] {
            let p = GemmProblem::new(1, n, k, a_type);
            assert!(tail.iter().all(|c| c.check_problem(&p).is_err()), "{p}");
        }
        let p = GemmProblem::new(1, 2048, 88, a_type);
        let e = tail[0].check_problem(&p).unwrap_err();
        assert!(e.reason.contains("K-tail") && e.reason.contains("multiple of 16"), "{e}");
        assert!(space.iter().all(|c| c.check_problem(&p).is_err()), "{p}");
    }
    // the K-tail form has stages of 64 k in one warp
    let c = GemmConfig { pipeline: Pipeline::KTail, ..cfg(AType::Bf16) };
    reject(GemmConfig { block_k: 128, ..c }, "K-tail");
    reject(GemmConfig { block_k: 64, warps_k: 2, ..c }, "K-tail");
}

#[test]
fn smem_formula_matches_hand_computed_values() {
    // W4A16, swap 16x64x128, 4 stages: W codes 64*64 = 4096, W scales 64*8 = 512,
    // A bf16 16*128*2 = 4096 -> 8704 per stage.
    let c = cfg(AType::Bf16);
    assert_eq!(stage_bytes(&c), 8704);
    assert_eq!(smem_bytes(&c), 4 * 8704);
    // W4A4: A codes 16*64 = 1024, A scales 16*8 = 128 -> 4096 + 512 + 1024 + 128 = 5760.
    assert_eq!(stage_bytes(&cfg(AType::Nvfp4)), 5760);
    // Regions are 128-byte aligned: block_n 16, block_k 64: W scales 16*4 = 64 -> 128.
    let c = GemmConfig { block_n: 16, block_k: 64, warps_n: 1, ..cfg(AType::Nvfp4) };
    // W codes 16*32 = 512, W sf 64 -> 128, A codes 16*32 = 512, A sf 64 -> 128.
    assert_eq!(stage_bytes(&c), 512 + 128 + 512 + 128);
    // The reduction buffer wins when it is larger than the pipeline.
    let c = GemmConfig { block_k: 256, warps_k: 4, warps_n: 1, stages: 2, ..cfg(AType::Nvfp4) };
    let d = Derived::of(&c);
    assert_eq!(d.acc, 4 * 2 * 4);
    assert_eq!(smem_bytes(&c), (2 * stage_bytes(&c)).max(3 * 32 * 32 * 4));
    // Default: 128x128x64 bf16: W 4096 + 512, A 16384 -> 20992 per stage, 4 stages.
    assert_eq!(smem_bytes(&default_config(AType::Bf16)), 4 * 20992);
}

#[test]
fn k_permutation_is_a_bijection_and_matches_the_register_data_path() {
    for ch in [64u32, 128] {
        let steps = ch / 16;
        let mut seen = HashSet::new();
        for j in 0..steps {
            for p in 0..16 {
                let k = k_local(ch, j, p);
                assert!(k < ch);
                assert!(seen.insert(k), "k {k} twice (ch {ch})");
            }
        }
        assert_eq!(seen.len() as u32, ch);
        // Simulate what a lane's registers hold: lane t's run starts at t*ch/4; word w covers
        // elements 8w..8w+8 of the run; r[s] = (element s, element s+4); step 2w+jj takes
        // lo = r[2jj] at positions (2t, 2t+1) and hi = r[2jj+1] at (2t+8, 2t+9). A (rows g and
        // g+8) and B (column g) fragments both hold exactly these positions for lane t.
        for lane in 0..32u32 {
            let t = lane % 4;
            for w in 0..ch / 32 {
                for jj in 0..2 {
                    let j = 2 * w + jj;
                    let reg = |s: u32| -> [u32; 2] {
                        let run = t * ch / 4 + 8 * w;
                        [run + s, run + s + 4]
                    };
                    let lo = reg(2 * jj);
                    let hi = reg(2 * jj + 1);
                    // A fragment: a0/a1 = positions 2t, 2t+1 (rows g, g+8), a2/a3 = 2t+8, 2t+9.
                    // B fragment: b0 = rows 2t, 2t+1, b1 = rows 2t+8, 2t+9 of column g.
                    for e in 0..2 {
                        assert_eq!(lo[e as usize], k_local(ch, j, 2 * t + e));
                        assert_eq!(hi[e as usize], k_local(ch, j, 2 * t + 8 + e));
                    }
                    // The lane only touches its own run, so its 16 (or 8) code bytes suffice.
                    for k in lo.iter().chain(hi.iter()) {
                        assert_eq!(k / (ch / 4), t);
                    }
                }
            }
        }
    }
}

/// Worst bank-conflict degree of one warp-wide shared load: lanes are served in phases of
/// 128 bytes (8 lanes for 16-byte loads, 16 for 8-byte loads); within a phase, count distinct
/// 4-byte words per bank.
pub(super) fn conflict_degree(addrs: &[u32], bytes: u32) -> usize {
    let per_phase = (128 / bytes) as usize;
    let mut worst = 1;
    for phase in addrs.chunks(per_phase) {
        let mut banks: Vec<HashSet<u32>> = vec![HashSet::new(); 32];
        for &a in phase {
            for w in 0..bytes / 4 {
                let word = a / 4 + w;
                banks[(word % 32) as usize].insert(word);
            }
        }
        worst = worst.max(banks.iter().map(|b| b.len()).max().unwrap());
    }
    worst
}

#[test]
fn fragment_loads_are_free_of_bank_conflicts() {
    // Packed codes: rows of block_k/2 bytes; chunk 128 -> 16-byte loads at unit 4c + t;
    // chunk 64 -> 8-byte loads at half t%2 of unit 2c + t/2. Warp rows start at multiples of 8.
    for block_k in [64u32, 128, 256] {
        let units = block_k / 32;
        for ch in [64u32, 128] {
            if ch > block_k {
                continue;
            }
            for c in 0..block_k / ch {
                for row0 in [0u32, 8, 16, 24] {
                    let addrs: Vec<u32> = (0..32u32)
                        .map(|lane| {
                            let (g, t) = (lane / 4, lane % 4);
                            let r = row0 + g;
                            if ch == 128 {
                                r * block_k / 2 + code_unit_swizzle(units, r, 4 * c + t) * 16
                            } else {
                                r * block_k / 2
                                    + code_unit_swizzle(units, r, 2 * c + t / 2) * 16
                                    + (t % 2) * 8
                            }
                        })
                        .collect();
                    let bytes = if ch == 128 { 16 } else { 8 };
                    assert_eq!(
                        conflict_degree(&addrs, bytes),
                        1,
                        "codes block_k {block_k} chunk {ch} c {c} row0 {row0}"
                    );
                }
            }
        }
    }
    // bf16: rows of 2*block_k bytes; word w of lane t in chunk c is unit ch/8*c + ch/32*t + w.
    for block_k in [64u32, 128, 256] {
        for ch in [64u32, 128] {
            if ch > block_k {
                continue;
            }
            for c in 0..block_k / ch {
                for w in 0..ch / 32 {
                    for row0 in [0u32, 8] {
                        let addrs: Vec<u32> = (0..32u32)
                            .map(|lane| {
                                let (g, t) = (lane / 4, lane % 4);
                                let r = row0 + g;
                                let u = ch / 8 * c + ch / 32 * t + w;
                                r * block_k * 2 + bf16_unit_swizzle(r, u) * 16
                            })
                            .collect();
                        assert_eq!(
                            conflict_degree(&addrs, 16),
                            1,
                            "bf16 block_k {block_k} chunk {ch} c {c} w {w}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn swizzles_are_permutations_within_a_row() {
    for units in [2u32, 4, 8] {
        for r in 0..16 {
            let s: HashSet<u32> = (0..units).map(|u| code_unit_swizzle(units, r, u)).collect();
            assert_eq!(s.len() as u32, units);
            assert!(s.iter().all(|&u| u < units));
        }
    }
    for units in [8u32, 16, 32] {
        for r in 0..16 {
            let s: HashSet<u32> = (0..units).map(|u| bf16_unit_swizzle(r, u)).collect();
            assert_eq!(s.len() as u32, units);
            assert!(s.iter().all(|&u| u < units));
        }
    }
}

#[test]
fn tiled_scale_words_match_the_global_swizzled_layout() {
    // For a 128-aligned row block the stage copies G contiguous 512-byte blocks per 128 rows;
    // sf_word must address, in that copy, the word the global layout holds for (row, group).
    let (k, rows, groups) = (1024u32, 256u32, 2u32);
    let ksf_pad = k / 16;
    for kb in 0..k / (64 * groups) {
        for r in 0..rows {
            for g in 0..groups {
                let global = swizzled_sf_offset(r, 4 * (kb * groups + g), ksf_pad);
                // copy of tile rt: global bytes [((rt)*(ksf_pad/4) + kb*G)*512, + G*512)
                let rt = r / 128;
                let copy_base = (rt * (ksf_pad / 4) + kb * groups) * 512;
                let smem = rt * groups * 512 + (global - copy_base);
                assert_eq!(smem, sf_word(rows, groups, r, g) * 4, "row {r} group {g} kb {kb}");
            }
        }
    }
    let s: HashSet<u32> = (0..48).flat_map(|r| (0..2).map(move |g| sf_word(48, 2, r, g))).collect();
    assert_eq!(s.len(), 96);
}

// ---- exactness of the bf16 data path (nvfp4.cuh), emulated on the CPU ----

fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}
fn f32_to_bf16_rne(f: f32) -> u16 {
    let b = f.to_bits();
    let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1));
    (r >> 16) as u16
}
/// `e2m1_pair_raw<S>` of nvfp4.cuh: mask, multiply (two copies that never overlap), mask.
fn pair_raw(w: u32, s: u32) -> u32 {
    let src = if s >= 2 { w >> 8 } else { w };
    let (mask, mul) = if s % 2 == 0 { (0x000F_000F, 0x1040) } else { (0x00F0_00F0, 0x0104) };
    (src & mask).wrapping_mul(mul) & 0x81C0_81C0
}

/// The bit placement `pair_raw` must produce, written out: sign to bit 15, (e1 e0 m) to bits
/// 8..6 of each half.
fn pair_raw_by_bits(w: u32, s: u32) -> u32 {
    let half = |code: u32| ((code & 8) << 12) | ((code & 7) << 6);
    half((w >> (4 * s)) & 15) | (half((w >> (4 * s + 16)) & 15) << 16)
}

#[test]
fn pair_extraction_places_every_code_pair_exactly() {
    // Every 16-bit pattern in each half (the other half random), all four pairs.
    let mut x = 0x9E37_79B9u32;
    for lo in 0..=0xFFFFu32 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        for w in [lo | (x << 16), (lo << 16) | (x >> 16)] {
            for s in 0..4 {
                assert_eq!(pair_raw(w, s), pair_raw_by_bits(w, s), "word {w:#010x} pair {s}");
            }
        }
    }
}

#[test]
fn dequantization_is_exact_for_every_code_and_scale() {
    for sf in 0u8..=0x7E {
        let s = e4m3_decode(sf);
        let prepared = f32_to_bf16_rne(s * 2f32.powi(119));
        assert_eq!(bf16_to_f32(prepared), s * 2f32.powi(119), "scale {sf:#x} not exact");
        for w in [0x7654_3210u32, 0xFEDC_BA98] {
            for sel in 0..4 {
                let raw = pair_raw(w, sel);
                for half in 0..2 {
                    let code = (w >> (4 * (sel + 4 * half))) & 15;
                    let x = bf16_to_f32((raw >> (16 * half)) as u16);
                    assert_eq!(x, e2m1_decode(code as u8) * 2f32.powi(-126), "code {code}");
                    // bf16 x bf16 is exact in f32; the bf16 rounding of the product must be too.
                    let prod = bf16_to_f32(f32_to_bf16_rne(x * bf16_to_f32(prepared)));
                    assert_eq!(
                        prod,
                        e2m1_decode(code as u8) * s * 2f32.powi(-7),
                        "code {code} scale {sf:#x}"
                    );
                }
            }
        }
    }
}

// ---- search space and rendering ----

#[test]
fn search_space_is_legal_rich_and_renders() {
    for a_type in [AType::Bf16, AType::Nvfp4] {
        let space = search_space(a_type);
        assert!((300..=8000).contains(&space.len()), "{} configs for {a_type}", space.len());
        let names: HashSet<String> = space.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), space.len(), "duplicate configurations");
        assert!(space.iter().any(|c| c.swap_ab && c.block_m <= 16 && c.split_k > 1));
        assert!(space.iter().any(|c| !c.swap_ab && c.block_m == 128 && c.block_n >= 128));
        assert!(space.iter().any(|c| c.warps_k > 1));
        for w in measured_winners(a_type) {
            assert!(space.contains(&w), "measured winner {w} missing from the space");
        }
        // the decode defaults: legal members of the space (so the GPU suites verify them), no
        // split-K (a shape outside the table has no workspace of its own)
        for d in decode_defaults(a_type) {
            assert!(space.contains(&d), "decode default {d} missing from the space");
            assert_eq!((d.split_k, d.block_m, d.swap_ab), (1, 8, true), "{d}");
        }
        // the prefill defaults likewise (W4A16 only)
        let prefill = prefill_defaults(a_type);
        assert_eq!(prefill.len(), if a_type == AType::Bf16 { 2 } else { 0 });
        for d in prefill {
            assert!(space.contains(&d), "prefill default {d} missing from the space");
            assert_eq!(d.split_k, 1, "{d}");
        }
        for c in &space {
            assert!(check(c).is_ok(), "{c}");
            let src = c.render().unwrap_or_else(|e| panic!("{c}: {e}"));
            assert!(src.code.contains(&format!("Cfg::SMEM_BYTES == {}", smem_bytes(c))));
            assert!(src.code.contains(&c.kernel_name()));
            assert!(!src.code.contains("#include"), "includes left in {c}");
        }
    }
}

#[test]
fn instantiation_names_kernel_and_config() {
    let c = cfg(AType::Nvfp4);
    let u = instantiation(&c);
    assert!(u.contains("#include \"sm90/gemm.cuh\""));
    assert!(u.contains("Sm90Config<16, 64, 128, 1, 4, 1, 4, 1, true, true>"), "{u}");
    assert!(u.contains(&format!("void __launch_bounds__(128, 1) {}(", c.kernel_name())));
}
