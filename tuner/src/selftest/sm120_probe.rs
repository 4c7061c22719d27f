//! The SM120 MMA probe: one warp runs the family's block-scaled FP4 instruction
//! (`mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X`, through the
//! wrapper the kernels use, `templates/sm120/mma.cuh`) on registers built from the CPU fragment
//! model (`template::sm120::fragments`) and writes back every lane's accumulators, which must equal
//! the model's [`execute_mma`] bit for bit.
//!
//! Runs: every (thread-id-a, thread-id-b) selector pair (2 x 4) at every k of the 64: 512 MMAs.
//! In run (a, b, t) every A row and every B column holds one nonzero E2M1 code, at k = t (one-hot
//! along k), so each output is a single product: a fragment that holds (row, k) or (k, col)
//! somewhere else than the model says turns it into 0 or into another row's value. Scales are
//! distinct powers of two per row (column) and 16-k block, so a scale read for the wrong row or
//! from the wrong byte of its word changes the product; and the lanes a selector does not choose
//! hold other scales than the chosen ones (the kernels' lanes 2, 3 duplicate lanes 0, 1; here they
//! differ), so a selector served from the wrong lanes changes it too. Every product is a power of
//! two times a product of two E2M1 values, exact in f32.
//!
//! The source is generated here (it includes the family's `mma.cuh`; nothing under `templates/`
//! is added, so no template hash changes). Without a GPU the probe is compiled for `sm_120a` and
//! its SASS must hold one `OMMA.SF` per selector pair.

use super::probe::{exponent, ue4m3_pow2, Probe, RunLabel, NONZERO_E2M1};
use crate::template::sm120::fragments::{
    a_element, b_element, c_element, execute_mma, MmaOperands, LANES,
};
use crate::template::sm120::report::OMMA_SF_NVFP4;
use crate::template::{Arch, Family, KernelSource};

/// The probe kernel's symbol.
pub const KERNEL: &str = "fp4tune_selftest_sm120_mma";
/// k positions of one m16n8k64 MMA: one run per k and selector pair.
pub const K: u32 = 64;
/// 32-bit input words per lane and run: a0..a3, b0, b1, the SF_A word, the SF_B word.
pub const WORDS_PER_LANE: usize = 8;

/// SF_A exponent of `row` (0..16), k-block `kb` (0..4), held by the lanes of selector half `h`
/// (thread-id-a `h` reads them): offsets 2 kb + 9 h are 8 distinct values mod 18.
pub fn sfa_exponent(h: u32, row: u32, kb: u32) -> i32 {
    exponent(row, 2 * kb + 9 * h)
}

/// SF_B exponent of column `col` (0..8), k-block `kb`, held by the lane with lane % 4 == `j`
/// (thread-id-b `j` reads it): offsets 4 j + kb are 16 distinct values.
pub fn sfb_exponent(j: u32, col: u32, kb: u32) -> i32 {
    exponent(col, 4 * j + kb)
}

/// The nonzero code of A row `row` in run k = `t`.
pub fn code_a(row: u32, t: u32) -> u8 {
    NONZERO_E2M1[((row + t) % 14) as usize]
}

/// The nonzero code of B column `col` in run k = `t`.
pub fn code_b(col: u32, t: u32) -> u8 {
    NONZERO_E2M1[((2 * col + t + 5) % 14) as usize]
}

/// The warp's registers of run (`tid_a`, `tid_b`, k = `t`), placed by the fragment model.
pub fn operands(tid_a: u32, tid_b: u32, t: u32) -> MmaOperands {
    let mut ops = MmaOperands {
        a: [[0; 4]; LANES],
        b: [[0; 2]; LANES],
        sfa: [0; LANES],
        sfb: [0; LANES],
        tid_a,
        tid_b,
    };
    for lane in 0..LANES as u32 {
        let l = lane as usize;
        for reg in 0..4 {
            for nib in 0..8 {
                let (row, k) = a_element(lane, reg, nib);
                if k == t {
                    ops.a[l][reg as usize] |= (code_a(row, t) as u32) << (4 * nib);
                }
            }
        }
        for reg in 0..2 {
            for nib in 0..8 {
                let (k, col) = b_element(lane, reg, nib);
                if k == t {
                    ops.b[l][reg as usize] |= (code_b(col, t) as u32) << (4 * nib);
                }
            }
        }
        // The row a lane serves under thread-id-a (lane % 4) / 2 (`fragments::sfa_row`), and the
        // column it serves under thread-id-b lane % 4 (`fragments::sfb_col`).
        let q = lane % 4;
        let row = lane / 4 + 8 * (q % 2);
        ops.sfa[l] = u32::from_le_bytes(std::array::from_fn(|kb| {
            ue4m3_pow2(sfa_exponent(q / 2, row, kb as u32))
        }));
        ops.sfb[l] = u32::from_le_bytes(std::array::from_fn(|kb| {
            ue4m3_pow2(sfb_exponent(q, lane / 4, kb as u32))
        }));
    }
    ops
}

/// The instantiation unit of the probe kernel: `probe_pair<A, B>` runs the MMA with selectors
/// (A, B) on each of its runs; the kernel calls it for the 8 pairs in order 4 A + B.
pub fn unit() -> String {
    let calls: String = (0..8)
        .map(|p| {
            format!(
                "    probe_pair<{}, {}>(in + {p} * words_in, out + {p} * words_out, runs, lane);\n",
                p / 4,
                p % 4
            )
        })
        .collect();
    format!(
        "// fp4tune selftest: the SM120 block-scaled MMA probe (one warp; tuner/src/selftest/sm120_probe.rs)\n\
         #include \"sm120/mma.cuh\"\n\
         \n\
         using Mma = fp4tune::sm120::SM120_16x8x64_F32E2M1E2M1F32_UE4M3_4X;\n\
         \n\
         // Per run and lane: {WORDS_PER_LANE} words in (a0..a3, b0, b1, SF_A, SF_B), 4 floats out (d0..d3).\n\
         template <int TID_A, int TID_B>\n\
         __device__ __forceinline__ void probe_pair(const uint32_t* in, float* out, int runs, int lane) {{\n\
         #pragma unroll 1\n\
         \x20   for (int r = 0; r < runs; ++r) {{\n\
         \x20       const uint32_t* w = in + (r * 32 + lane) * {WORDS_PER_LANE};\n\
         \x20       const uint32_t a[4] = {{w[0], w[1], w[2], w[3]}};\n\
         \x20       const uint32_t b[2] = {{w[4], w[5]}};\n\
         \x20       float d[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};\n\
         \x20       Mma::fma<TID_A, TID_B>(d, a, b, w[6], w[7]);\n\
         \x20       float* o = out + (r * 32 + lane) * 4;\n\
         \x20       o[0] = d[0];\n\
         \x20       o[1] = d[1];\n\
         \x20       o[2] = d[2];\n\
         \x20       o[3] = d[3];\n\
         \x20   }}\n\
         }}\n\
         \n\
         extern \"C\" __global__ void __launch_bounds__(32) {KERNEL}(const uint32_t* in, float* out, unsigned long long runs_per_pair) {{\n\
         \x20   const int lane = threadIdx.x;\n\
         \x20   const int runs = (int)runs_per_pair;\n\
         \x20   const long long words_in = (long long)runs * 32 * {WORDS_PER_LANE};\n\
         \x20   const long long words_out = (long long)runs * 32 * 4;\n\
         {calls}\
         }}\n"
    )
}

/// The probe: its source, the input of all 512 runs and the model's outputs.
pub fn probe() -> Probe {
    let mut input = Vec::with_capacity(8 * K as usize * LANES * WORDS_PER_LANE * 4);
    let mut expected = Vec::with_capacity(8 * K as usize * LANES * 4);
    let mut runs = Vec::with_capacity(8 * K as usize);
    for pair in 0..8u32 {
        let (tid_a, tid_b) = (pair / 4, pair % 4);
        for t in 0..K {
            let ops = operands(tid_a, tid_b, t);
            for lane in 0..LANES {
                let words = [
                    ops.a[lane][0],
                    ops.a[lane][1],
                    ops.a[lane][2],
                    ops.a[lane][3],
                    ops.b[lane][0],
                    ops.b[lane][1],
                    ops.sfa[lane],
                    ops.sfb[lane],
                ];
                input.extend(words.iter().flat_map(|w| w.to_le_bytes()));
            }
            let d = execute_mma(&ops, &[[0.0; 4]; LANES]);
            expected.extend(d.iter().flatten().map(|v| *v as f32));
            runs.push(RunLabel(format!("thread-id-a {tid_a}, thread-id-b {tid_b}, k {t}")));
        }
    }
    Probe {
        family: Family::Sm120,
        what: format!(
            "sm120 MMA probe (one warp, mma.sync m16n8k64 mxf4nvf4 block_scale 4X: {} selector \
             pairs x {K} one-hot k, power-of-two scales per row and 16-k block)",
            8
        ),
        source: KernelSource::from_unit(KERNEL.into(), Arch::Sm120a, &unit())
            .expect("the probe includes embedded templates only"),
        input,
        args: vec![K as u64],
        expected,
        runs,
        output_coords: |lane, reg| c_element(lane, reg),
        sass_opcode: OMMA_SF_NVFP4,
        sass_min: 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::sm120::fragments::{sfa_row, sfb_col, ue4m3_value};

    #[test]
    fn scales_are_distinct_powers_of_two_per_row_block_and_selector() {
        for e in -9..=8 {
            assert_eq!(ue4m3_value(ue4m3_pow2(e)), 2f64.powi(e), "2^{e}");
        }
        for h in 0..2 {
            for kb in 0..4 {
                let mut rows: Vec<i32> = (0..16).map(|r| sfa_exponent(h, r, kb)).collect();
                rows.sort();
                rows.dedup();
                assert_eq!(rows.len(), 16, "SF_A rows of half {h}, block {kb}");
            }
        }
        for row in 0..16 {
            let mut e: Vec<i32> =
                (0..2).flat_map(|h| (0..4).map(move |kb| sfa_exponent(h, row, kb))).collect();
            e.sort();
            e.dedup();
            assert_eq!(e.len(), 8, "SF_A of row {row} over halves and blocks");
        }
        for col in 0..8 {
            let mut e: Vec<i32> =
                (0..4).flat_map(|j| (0..4).map(move |kb| sfb_exponent(j, col, kb))).collect();
            e.sort();
            e.dedup();
            assert_eq!(e.len(), 16, "SF_B of column {col} over selectors and blocks");
        }
    }

    /// Each run holds exactly one nonzero code per A row and B column, at k = t, and the model's
    /// output is that one product with the scales the selectors pick.
    #[test]
    fn every_output_is_the_one_product_of_its_row_and_column() {
        for pair in 0..8u32 {
            let (tid_a, tid_b) = (pair / 4, pair % 4);
            for t in [0, 1, 15, 16, 31, 37, 48, 63] {
                let ops = operands(tid_a, tid_b, t);
                let mut nonzero = 0;
                for lane in 0..32u32 {
                    for reg in 0..4 {
                        for nib in 0..8 {
                            let code = (ops.a[lane as usize][reg as usize] >> (4 * nib)) & 15;
                            let (row, k) = a_element(lane, reg, nib);
                            assert_eq!(code != 0, k == t);
                            if code != 0 {
                                assert_eq!(code as u8, code_a(row, t));
                                nonzero += 1;
                            }
                        }
                    }
                    // The lanes a selector picks hold the scales of the row (column) it reads.
                    if let Some(row) = sfa_row(lane, tid_a) {
                        let byte = ops.sfa[lane as usize].to_le_bytes()[(t / 16) as usize];
                        assert_eq!(byte, ue4m3_pow2(sfa_exponent(tid_a, row, t / 16)));
                    }
                    if let Some(col) = sfb_col(lane, tid_b) {
                        let byte = ops.sfb[lane as usize].to_le_bytes()[(t / 16) as usize];
                        assert_eq!(byte, ue4m3_pow2(sfb_exponent(tid_b, col, t / 16)));
                    }
                }
                assert_eq!(nonzero, 16, "one code per A row");
                let d = execute_mma(&ops, &[[0.0; 4]; 32]);
                for lane in 0..32u32 {
                    for i in 0..4 {
                        let (row, col) = c_element(lane, i);
                        let want = e2m1(code_a(row, t))
                            * e2m1(code_b(col, t))
                            * 2f64.powi(
                                sfa_exponent(tid_a, row, t / 16) + sfb_exponent(tid_b, col, t / 16),
                            );
                        let got = d[lane as usize][i as usize];
                        assert_eq!(got, want, "pair {pair} k {t} lane {lane} d{i}");
                        assert!(got != 0.0 && (got as f32) as f64 == got, "exact in f32: {got}");
                    }
                }
            }
        }
    }

    fn e2m1(code: u8) -> f64 {
        crate::format::e2m1_decode(code) as f64
    }

    /// A selector swap, lanes 2, 3 taking the scales of lanes 0, 1 (what the kernels load), or
    /// a wrong scale byte changes the model's outputs: the probe can tell them apart.
    #[test]
    fn selector_and_scale_mistakes_change_the_outputs() {
        let p = probe();
        assert_eq!(p.runs.len(), 512);
        assert_eq!(p.expected.len(), 512 * 32 * 4);
        assert_eq!(p.input.len(), 512 * 32 * WORDS_PER_LANE * 4);
        let run = |ops: &MmaOperands| execute_mma(ops, &[[0.0; 4]; 32]);
        for (tid_a, tid_b, t) in [(0, 1, 5), (1, 3, 40), (0, 0, 63)] {
            let ops = operands(tid_a, tid_b, t);
            let good = run(&ops);
            let swapped = run(&MmaOperands { tid_a: 1 - tid_a, ..ops.clone() });
            assert_ne!(good, swapped, "thread-id-a {tid_a} vs {}", 1 - tid_a);
            let other_b = run(&MmaOperands { tid_b: (tid_b + 1) % 4, ..ops.clone() });
            assert_ne!(good, other_b);
            let mut duplicated = ops.clone();
            for lane in 0..32 {
                if lane % 4 >= 2 {
                    duplicated.sfa[lane] = ops.sfa[lane - 2];
                }
            }
            if tid_a == 1 {
                assert_ne!(good, run(&duplicated));
            }
            let mut byte = ops.clone();
            for w in byte.sfa.iter_mut() {
                *w = w.rotate_right(8);
            }
            assert_ne!(good, run(&byte));
        }
    }

    #[test]
    fn probe_source_calls_every_selector_pair_and_compiles_with_omma_sf() {
        let u = unit();
        for a in 0..2 {
            for b in 0..4 {
                assert!(u.contains(&format!("probe_pair<{a}, {b}>")), "{u}");
            }
        }
        let p = probe();
        assert!(p.source.code.contains("kind::mxf4nvf4.block_scale.scale_vec::4X"));
        assert!(!p.source.code.contains("#include"));
        // NVRTC is a requirement of the test suite (see compile::tests).
        let dir = tempfile::tempdir().unwrap();
        let compiler = crate::compile::Compiler::new(Some(dir.path().to_path_buf()))
            .unwrap_or_else(|e| panic!("{e}"));
        let r = super::super::probe::compile_only(&compiler, &p);
        assert!(matches!(r.status, super::super::Status::Pass), "{}", r.line());
        assert!(r.detail.starts_with("8 x OMMA.SF"), "{}", r.line());
    }
}
