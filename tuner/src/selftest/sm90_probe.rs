//! The SM90 MMA probe. The family has no FP4 tensor-core instruction: its kernels decode NVFP4
//! to bf16 in registers (`templates/common/nvfp4.cuh`) and feed `mma.sync.aligned.m16n8k16
//! .row.col.f32.bf16.bf16.f32` (`common/ptx.cuh`), each lane decoding the run of k the K
//! permutation gives it (`sm90/layout.cuh: k_local`, mirrored by `template::sm90::k_local`). One
//! warp of the probe does exactly what `sm90/mma.cuh` does for one chunk of CH = 64 or 128 k (the
//! template's `RowChunk::load` and `word` for A rows g and g + 8 and B row g, then the MMAs of
//! each word's two steps), from global memory instead of a shared-memory stage, and writes the
//! raw accumulators (every decoded operand carries 2^-7, `nvfp4::OPERAND_LOG2`).
//!
//! The CPU mirror: accumulator (row, col) = the sum over the chunk's steps j and MMA positions p
//! of A(row, k_local(CH, j, p)) * B(col, k_local(CH, j, p)) * 2^-14, the outputs placed by the
//! m16n8 C/D fragment (`fragments::c_element`, the same for m16n8k16 and m16n8k64).
//!
//! Runs: both chunk widths at every k (64 + 128 runs). In run (CH, t) every A row and B row holds
//! one nonzero E2M1 code, at k = t, so each accumulator is one product: a lane that decodes
//! the wrong k, a fragment register in the wrong row, or A and B fragments that disagree on
//! which k a position is turn it into 0 or into another row's value. Scales are distinct powers
//! of two per row and 16-k block (2^-9 .. 2^8, subnormal UE4M3 included), so the scale of the
//! wrong block or row changes the product; every product is exact in bf16 and f32.

use super::probe::{exponent, ue4m3_pow2, Probe, RunLabel, NONZERO_E2M1};
use crate::template::sm120::fragments::{c_element, e2m1_value, ue4m3_value};
use crate::template::sm90::k_local;
use crate::template::{Arch, Family, KernelSource};

/// The probe kernel's symbol.
pub const KERNEL: &str = "fp4tune_selftest_sm90_mma";
/// The chunk widths of the family (`Sm90Config::CHUNK`), in probe order.
pub const CHUNKS: [u32; 2] = [64, 128];
/// The bf16 MMA in the SASS of sm_90a.
pub const HMMA_BF16: &str = "HMMA.16816.F32.BF16";

/// Bytes of one run of chunk width `ch`: A codes (16 x ch/2), A scales (16 x ch/16), B codes
/// (8 x ch/2), B scales (8 x ch/16), each row-major.
pub fn run_bytes(ch: u32) -> usize {
    (16 * ch / 2 + 16 * ch / 16 + 8 * ch / 2 + 8 * ch / 16) as usize
}

/// One operand of a run: `rows` x `ch` E2M1 codes and a UE4M3 scale per 16 k.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    pub rows: u32,
    pub ch: u32,
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
}

impl Operand {
    /// Value of (row, k): E2M1 code times its block scale (exact).
    pub fn value(&self, row: u32, k: u32) -> f64 {
        e2m1_value(self.codes[(row * self.ch + k) as usize])
            * ue4m3_value(self.scales[(row * (self.ch / 16) + k / 16) as usize])
    }

    /// Codes packed two per byte, element 2j in the low nibble, then the scales (the device
    /// layout of a row-major NVFP4 matrix with plain, unswizzled scales).
    fn bytes(&self, out: &mut Vec<u8>) {
        out.extend(self.codes.chunks(2).map(|p| (p[0] & 15) | ((p[1] & 15) << 4)));
        out.extend(&self.scales);
    }
}

/// Run (CH = `ch`, k = `t`): A (16 rows) and B (8 rows) one-hot at k = t, with the probe's
/// codes and power-of-two scales (offsets 2 kb for A and 2 kb + 1 for B: distinct per row and
/// block).
pub fn operands(ch: u32, t: u32) -> (Operand, Operand) {
    let make = |rows: u32, code: &dyn Fn(u32) -> u8, offset: u32| {
        let mut codes = vec![0u8; (rows * ch) as usize];
        for r in 0..rows {
            codes[(r * ch + t) as usize] = code(r);
        }
        let scales = (0..rows * ch / 16)
            .map(|i| ue4m3_pow2(exponent(i / (ch / 16), 2 * (i % (ch / 16)) + offset)))
            .collect();
        Operand { rows, ch, codes, scales }
    };
    let a = make(16, &|r| NONZERO_E2M1[((r + t) % 14) as usize], 0);
    let b = make(8, &|c| NONZERO_E2M1[((2 * c + t + 5) % 14) as usize], 1);
    (a, b)
}

/// The CPU mirror of one run: accumulator `reg` of `lane`, as in the module docs.
pub fn mirror(a: &Operand, b: &Operand) -> [[f64; 4]; 32] {
    let ch = a.ch;
    std::array::from_fn(|lane| {
        std::array::from_fn(|reg| {
            let (row, col) = c_element(lane as u32, reg as u32);
            let mut sum = 0.0;
            for j in 0..ch / 16 {
                for p in 0..16 {
                    let k = k_local(ch, j, p);
                    sum += a.value(row, k) * b.value(col, k);
                }
            }
            sum * 2f64.powi(-14)
        })
    })
}

/// The instantiation unit of the probe kernel.
pub fn unit() -> String {
    format!(
        "// fp4tune selftest: the SM90 MMA and NVFP4 decode probe (one warp; tuner/src/selftest/sm90_probe.rs)\n\
         #include \"common/nvfp4.cuh\"\n\
         #include \"common/ptx.cuh\"\n\
         \n\
         // One run: A (16 rows) and B (8 rows) of CH k, codes row-major (element 2j in the low nibble),\n\
         // one UE4M3 scale per 16 k row-major. As sm90/mma.cuh: lane (g, t) loads its CH/4 k of A rows\n\
         // g, g + 8 and B row g (RowChunk::load), word w of 8 codes serves steps 2w and 2w + 1 with\n\
         // lo = r[2jj] and hi = r[2jj + 1] (RowChunk::word, warp_mma_stage).\n\
         template <int CH>\n\
         __device__ __forceinline__ void probe_chunk(const uint8_t* in, float* out, int runs, int lane) {{\n\
         \x20   constexpr int WORDS = CH / 32;\n\
         \x20   constexpr int A_SF = 16 * CH / 2;\n\
         \x20   constexpr int B_CODES = A_SF + 16 * CH / 16;\n\
         \x20   constexpr int B_SF = B_CODES + 8 * CH / 2;\n\
         \x20   constexpr int RUN = B_SF + 8 * CH / 16;\n\
         \x20   const int g = lane >> 2;\n\
         \x20   const int t = lane & 3;\n\
         #pragma unroll 1\n\
         \x20   for (int r = 0; r < runs; ++r) {{\n\
         \x20       const uint8_t* run = in + (long long)r * RUN;\n\
         \x20       const uint8_t* rows[3] = {{run + g * (CH / 2), run + (g + 8) * (CH / 2), run + B_CODES + g * (CH / 2)}};\n\
         \x20       const uint8_t* sfs[3] = {{run + A_SF + g * (CH / 16), run + A_SF + (g + 8) * (CH / 16), run + B_SF + g * (CH / 16)}};\n\
         \x20       uint32_t code[3][WORDS];\n\
         \x20       uint32_t scale[3][2];\n\
         #pragma unroll\n\
         \x20       for (int i = 0; i < 3; ++i) {{\n\
         \x20           if constexpr (CH == 128) {{\n\
         \x20               const uint4 v = *reinterpret_cast<const uint4*>(rows[i] + 16 * t);\n\
         \x20               code[i][0] = v.x;\n\
         \x20               code[i][1] = v.y;\n\
         \x20               code[i][2] = v.z;\n\
         \x20               code[i][3] = v.w;\n\
         \x20               const uint16_t s2 = *reinterpret_cast<const uint16_t*>(sfs[i] + 2 * t);\n\
         \x20               fp4tune::nvfp4::e4m3x2_prepared(s2, scale[i][0], scale[i][1]);\n\
         \x20           }} else {{\n\
         \x20               const uint2 v = *reinterpret_cast<const uint2*>(rows[i] + 8 * t);\n\
         \x20               code[i][0] = v.x;\n\
         \x20               code[i][1] = v.y;\n\
         \x20               scale[i][0] = fp4tune::nvfp4::e4m3_prepared(sfs[i][t]);\n\
         \x20               scale[i][1] = scale[i][0];\n\
         \x20           }}\n\
         \x20       }}\n\
         \x20       float acc[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};\n\
         #pragma unroll\n\
         \x20       for (int w = 0; w < WORDS; ++w) {{\n\
         \x20           uint32_t pr[3][4];\n\
         #pragma unroll\n\
         \x20           for (int i = 0; i < 3; ++i) fp4tune::nvfp4::dequant_word(code[i][w], scale[i][WORDS == 4 ? (w >> 1) : 0], pr[i]);\n\
         #pragma unroll\n\
         \x20           for (int jj = 0; jj < 2; ++jj) {{\n\
         \x20               const uint32_t a[4] = {{pr[0][2 * jj], pr[1][2 * jj], pr[0][2 * jj + 1], pr[1][2 * jj + 1]}};\n\
         \x20               const uint32_t b[2] = {{pr[2][2 * jj], pr[2][2 * jj + 1]}};\n\
         \x20               fp4tune::ptx::SM80_16x8x16_F32BF16BF16F32_TN::fma(acc, a, b);\n\
         \x20           }}\n\
         \x20       }}\n\
         \x20       float* o = out + ((long long)r * 32 + lane) * 4;\n\
         \x20       o[0] = acc[0];\n\
         \x20       o[1] = acc[1];\n\
         \x20       o[2] = acc[2];\n\
         \x20       o[3] = acc[3];\n\
         \x20   }}\n\
         }}\n\
         \n\
         extern \"C\" __global__ void __launch_bounds__(32) {KERNEL}(const uint8_t* in, float* out, unsigned long long runs64, unsigned long long runs128) {{\n\
         \x20   const int lane = threadIdx.x;\n\
         \x20   probe_chunk<64>(in, out, (int)runs64, lane);\n\
         \x20   probe_chunk<128>(in + runs64 * {run64}, out + runs64 * 128, (int)runs128, lane);\n\
         }}\n",
        run64 = run_bytes(64)
    )
}

/// The probe: its source, the input of all runs and the mirror's outputs.
pub fn probe() -> Probe {
    let mut input = Vec::new();
    let mut expected = Vec::new();
    let mut runs = Vec::new();
    for ch in CHUNKS {
        for t in 0..ch {
            let (a, b) = operands(ch, t);
            a.bytes(&mut input);
            b.bytes(&mut input);
            expected.extend(mirror(&a, &b).iter().flatten().map(|v| *v as f32));
            runs.push(RunLabel(format!("chunk {ch}, k {t}")));
        }
    }
    Probe {
        family: Family::Sm90,
        what: "sm90 MMA probe (one warp, NVFP4 decoded to bf16 + mma.sync m16n8k16 over the K \
               permutation, chunks 64 and 128 x every one-hot k, power-of-two scales per row \
               and 16-k block)"
            .into(),
        source: KernelSource::from_unit(KERNEL.into(), Arch::Sm90a, &unit())
            .expect("the probe includes embedded templates only"),
        input,
        args: CHUNKS.iter().map(|&ch| ch as u64).collect(),
        expected,
        runs,
        output_coords: |lane, reg| c_element(lane, reg),
        sass_opcode: HMMA_BF16,
        sass_min: 12,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn runs_are_one_hot_with_distinct_power_of_two_scales() {
        for ch in CHUNKS {
            for t in [0, 5, 15, 16, ch - 1] {
                let (a, b) = operands(ch, t);
                for (m, rows) in [(&a, 16), (&b, 8)] {
                    for r in 0..rows {
                        for k in 0..ch {
                            let code = m.codes[(r * ch + k) as usize];
                            assert_eq!(code != 0, k == t, "ch {ch} t {t} row {r} k {k}");
                        }
                        let mut e: Vec<u8> =
                            m.scales[(r * ch / 16) as usize..((r + 1) * ch / 16) as usize].to_vec();
                        e.sort();
                        e.dedup();
                        assert_eq!(e.len() as u32, ch / 16, "scales of row {r} per block");
                    }
                    for kb in 0..ch / 16 {
                        let mut e: Vec<u8> =
                            (0..rows).map(|r| m.scales[(r * ch / 16 + kb) as usize]).collect();
                        e.sort();
                        e.dedup();
                        assert_eq!(e.len() as u32, rows, "scales of block {kb} per row");
                    }
                }
            }
        }
    }

    /// The decoded operands are exact bf16 values (what the kernel's one bf16 multiply must
    /// produce), and the mirror over the K permutation is the chunk's GEMM: one nonzero product
    /// per accumulator, exact in f32.
    #[test]
    fn mirror_is_the_gemm_of_the_run_and_exact() {
        for ch in CHUNKS {
            for t in 0..ch {
                let (a, b) = operands(ch, t);
                for (m, rows) in [(&a, 16u32), (&b, 8)] {
                    for r in 0..rows {
                        let v = m.value(r, t) * 2f64.powi(-7);
                        assert_eq!(bf16::from_f64(v).to_f64(), v, "ch {ch} t {t} row {r}");
                    }
                }
                let d = mirror(&a, &b);
                for lane in 0..32u32 {
                    for reg in 0..4u32 {
                        let (row, col) = c_element(lane, reg);
                        let direct: f64 = (0..ch).map(|k| a.value(row, k) * b.value(col, k)).sum();
                        let got = d[lane as usize][reg as usize];
                        assert_eq!(got, direct * 2f64.powi(-14));
                        assert!(got != 0.0 && (got as f32) as f64 == got, "{got}");
                    }
                }
            }
        }
    }

    #[test]
    fn probe_bytes_follow_the_run_layout() {
        let p = probe();
        assert_eq!(p.runs.len(), 64 + 128);
        assert_eq!(p.input.len(), 64 * run_bytes(64) + 128 * run_bytes(128));
        assert_eq!(p.expected.len(), p.runs.len() * 128);
        // Run (64, 3): A row 0 holds its code at k 3 = the high nibble of byte 1.
        let (a, _) = operands(64, 3);
        let run3 = &p.input[3 * run_bytes(64)..];
        assert_eq!(run3[1] >> 4, a.codes[3]);
        assert_eq!(run3[1] & 15, 0);
        // Every 16-byte load of the kernel is aligned: runs and their B codes start at multiples of 16.
        for ch in CHUNKS {
            assert_eq!(run_bytes(ch) % 16, 0);
            assert_eq!((16 * ch / 2 + 16 * ch / 16) % 16, 0);
        }
    }

    #[test]
    fn probe_compiles_for_sm90a_with_the_bf16_mma() {
        let dir = tempfile::tempdir().unwrap();
        let compiler = crate::compile::Compiler::new(Some(dir.path().to_path_buf()))
            .unwrap_or_else(|e| panic!("{e}"));
        let r = super::super::probe::compile_only(&compiler, &probe());
        assert!(matches!(r.status, super::super::Status::Pass), "{}", r.line());
    }
}
