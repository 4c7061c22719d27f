//! The order of a layer's weight codes that the grouped kernels read.
//!
//! Engines load expert weights in the ModelOpt layout (nibble i of each little-endian 32-bit word
//! is element i, element 0 in the low nibble). The sm90 family's grouped kernels decode codes to
//! bf16 in registers and read the *decode order*: every word's 32 bits permuted so that pair `s`
//! (elements `s` and `s + 4`, one bf16x2 register) sits on the raw bf16x2 bit positions rotated
//! left by 22, 0 and 3 bits for `s` = 0, 1, 2, and pair 3 on the bits left, from where one
//! multiply moves it there (`templates/common/nvfp4.cuh` `dequant_word_ordered`: 8 integer instructions
//! per word of 8 codes instead of 13). The family sm120 MMA reads ModelOpt codes as they are.
//!
//! A layer's codes are put into the order once at load (`templates/moe/order.cuh`, launched by
//! the runtime's `prepare_weights`); benchmarks upload them ordered on the CPU (`apply`). This is
//! the one table both use; the tests mirror the device decodes of the ordered words.

use crate::template::{Arch, Family, KernelSource};

/// How a family's grouped kernels read a layer's weight codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightOrder {
    /// The ModelOpt layout, as loaded (family sm120).
    ModelOpt,
    /// The decode order (family sm90).
    Decode,
}

impl WeightOrder {
    pub fn of(family: Family) -> Self {
        match family {
            Family::Sm90 => WeightOrder::Decode,
            Family::Sm120 => WeightOrder::ModelOpt,
        }
    }
}

/// Where bit n of a ModelOpt word goes in the decode order: pair s at the raw bf16x2 positions
/// (6, 7, 8, 15, 22, 23, 24, 31: magnitude bits e1 e0 m and the sign of element s, then of
/// element s + 4) rotated left by 22, 0 and 3 for s = 0, 1, 2; pair 3 on the bits of 0x001B001B,
/// placed so that one multiply by 2^3 + 2^8 + 2^14 lands them on the raw positions. Of the
/// orders with three rotations and one multiply, these rotations also give the wgmma kernel's lane
/// t its elements 2t (one rotation) and 2t + 1 (one masked multiply).
pub const DECODE_ORDER: [u8; 32] = [
    28, 29, 30, 5, 6, 7, 8, 15, 9, 10, 11, 18, 3, 4, 0, 1, 12, 13, 14, 21, 22, 23, 24, 31, 25, 26,
    27, 2, 19, 20, 16, 17,
];

/// Left rotation of the raw positions that holds pair s = 0, 1, 2 (nvfp4.cuh ORDER_ROTATION).
pub const ORDER_ROTATION: [u32; 3] = [22, 0, 3];
/// Pair 3's bits and the multiplier that lands them on the raw positions (nvfp4.cuh).
pub const ORDER_PAIR3_MASK: u32 = 0x001B_001B;
pub const ORDER_PAIR3_MUL: u32 = 0x4108;

/// The inverse permutation (decode order back to ModelOpt).
pub fn restore_order() -> [u8; 32] {
    let mut back = [0u8; 32];
    for (n, &d) in DECODE_ORDER.iter().enumerate() {
        back[d as usize] = n as u8;
    }
    back
}

fn permute(w: u32, dst: &[u8; 32]) -> u32 {
    (0..32).fold(0, |o, n| o | (((w >> n) & 1) << dst[n]))
}

/// One ModelOpt word in the decode order.
pub fn decode_order_word(w: u32) -> u32 {
    permute(w, &DECODE_ORDER)
}

/// Codes (little-endian words of 8) in `order`; `codes.len()` must be a multiple of 4.
pub fn apply(order: WeightOrder, codes: &[u8]) -> Vec<u8> {
    assert!(codes.len() % 4 == 0, "codes come in whole 32-bit words");
    match order {
        WeightOrder::ModelOpt => codes.to_vec(),
        WeightOrder::Decode => codes
            .chunks_exact(4)
            .flat_map(|c| {
                decode_order_word(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes()
            })
            .collect(),
    }
}

/// Threads per CTA of the order kernels (templates/moe/order.cuh).
pub const ORDER_THREADS: u32 = 256;

/// The kernel that puts codes into the decode order (`back` false) or back into the ModelOpt
/// order (`back` true), in place, for the device's `arch`.
pub fn order_source(arch: Arch, back: bool) -> KernelSource {
    let dst = if back { restore_order() } else { DECODE_ORDER };
    let name = if back { "fp4tune_moe_order_back" } else { "fp4tune_moe_order" };
    let table = dst.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
    KernelSource::from_unit(
        name.to_string(),
        arch,
        &format!(
            "#include \"moe/order.cuh\"\n\
             #include \"common/nvfp4.cuh\"\n\
             static_assert(fp4tune::nvfp4::ORDER_ROTATION[0] == {r0} && fp4tune::nvfp4::ORDER_ROTATION[1] == {r1} && fp4tune::nvfp4::ORDER_ROTATION[2] == {r2} && fp4tune::nvfp4::ORDER_PAIR3_MASK == {mask}u && fp4tune::nvfp4::ORDER_PAIR3_MUL == {mul}u, \"Rust (moe::order) and templates/common/nvfp4.cuh disagree on the decode order\");\n\
             static_assert(fp4tune::moe::ORDER_THREADS == {ORDER_THREADS}, \"Rust (moe::order::ORDER_THREADS) and templates/moe/order.cuh disagree on threads\");\n\
             static_assert(sizeof(fp4tune::moe::OrderParams) == {size}, \"gpu::MoeOrderParams (Rust) and the C struct disagree\");\n\
             struct Perm {{ static constexpr uint8_t DST[32] = {{{table}}}; }};\n\
             extern \"C\" __global__ void __launch_bounds__(fp4tune::moe::ORDER_THREADS) {name}(const fp4tune::moe::OrderParams p) {{\n\
             \x20   fp4tune::moe::moe_order<Perm>(p);\n\
             }}\n",
            size = std::mem::size_of::<crate::gpu::moe_params::MoeOrderParams>(),
            r0 = ORDER_ROTATION[0],
            r1 = ORDER_ROTATION[1],
            r2 = ORDER_ROTATION[2],
            mask = ORDER_PAIR3_MASK,
            mul = ORDER_PAIR3_MUL,
        ),
    )
    .expect("moe/order.cuh is embedded")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The natural decode's integer part (nvfp4.cuh `e2m1_pair_raw<S>`): pair S of a ModelOpt
    /// word as raw bf16x2.
    fn natural_pair(w: u32, s: u32) -> u32 {
        let src = if s >= 2 { w >> 8 } else { w };
        let x = src & if s % 2 == 0 { 0x000F_000F } else { 0x00F0_00F0 };
        x.wrapping_mul(if s % 2 == 0 { 0x1040 } else { 0x0104 }) & 0x81C0_81C0
    }

    /// nvfp4.cuh `ordered_pair_raw<S>` on a word in the decode order.
    fn ordered_pair(p: u32, s: u32) -> u32 {
        if s == 3 {
            (p & ORDER_PAIR3_MASK).wrapping_mul(ORDER_PAIR3_MUL) & 0x81C0_81C0
        } else {
            p.rotate_right(ORDER_ROTATION[s as usize]) & 0x81C0_81C0
        }
    }

    /// moe/sm90_wgmma.cuh `LanePick::raw` for lane t.
    fn lane_pick(p: u32, t: usize) -> u32 {
        let odd = t & 1 == 1;
        let lo_rot = (ORDER_ROTATION[if odd { 2 } else { 0 }] + 16 * (t as u32 >> 1)) % 32;
        let half = if t < 2 { 0x0000_FFFF } else { 0xFFFF_0000 };
        let hi_mask = if odd { ORDER_PAIR3_MASK } else { 0x81C0_81C0 } & half;
        let hi_mul = (if odd { ORDER_PAIR3_MUL } else { 1 }) << if t < 2 { 16 } else { 0 };
        assert_eq!(ORDER_ROTATION[1], 0, "pair 1 on the raw positions");
        let hi = (p & hi_mask).wrapping_mul(hi_mul) & 0x81C0_0000;
        (p.rotate_right(lo_rot) & 0x81C0) | hi
    }

    /// Raw bf16 bits of one E2M1 code (nvfp4.cuh: magnitude on 8..6, sign on 15).
    fn raw_code(c: u32) -> u32 {
        ((c & 7) << 6) | ((c >> 3) << 15)
    }

    fn words() -> impl Iterator<Item = u32> {
        let mut w = 0x9E37_79B9u32;
        (0..100_000).map(move |_| {
            w = w.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            w
        })
    }

    #[test]
    fn the_order_is_a_permutation_and_restores() {
        let mut sorted = DECODE_ORDER;
        sorted.sort_unstable();
        assert!(sorted.iter().enumerate().all(|(i, &p)| p as usize == i));
        let back = restore_order();
        for w in words().take(1000).chain([0, !0, 0x8000_0001]) {
            assert_eq!(permute(decode_order_word(w), &back), w, "{w:#x}");
        }
        let bytes: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
        assert_eq!(apply(WeightOrder::ModelOpt, &bytes), bytes);
        assert_ne!(apply(WeightOrder::Decode, &bytes), bytes);
    }

    /// The warp kernels' ordered decode (pairs (s, s + 4)) reads what the natural one does, and
    /// the natural one puts code i on its raw bf16 bits.
    #[test]
    fn the_ordered_word_decode_reads_what_the_natural_one_does() {
        for w in words() {
            let p = decode_order_word(w);
            for s in 0..4 {
                assert_eq!(ordered_pair(p, s), natural_pair(w, s), "{w:#x} pair {s}");
                let want =
                    raw_code((w >> (4 * s)) & 15) | (raw_code((w >> (4 * s + 16)) & 15) << 16);
                assert_eq!(natural_pair(w, s), want, "{w:#x} pair {s}");
            }
        }
    }

    /// The wgmma kernel's lane t takes elements 2t (low half) and 2t + 1 (high half) of an
    /// ordered word.
    #[test]
    fn the_wgmma_lane_pick_takes_the_lanes_two_codes() {
        for w in words() {
            let p = decode_order_word(w);
            for t in 0..4usize {
                let want =
                    raw_code((w >> (8 * t)) & 15) | (raw_code((w >> (8 * t + 4)) & 15) << 16);
                assert_eq!(lane_pick(p, t), want, "{w:#x} lane {t}");
            }
        }
    }

    /// Both order kernels compile for both families' architectures (the static_asserts tie the
    /// table above to nvfp4.cuh's decode constants and the parameter block to Rust's).
    #[test]
    fn the_order_kernels_compile_and_agree_with_nvfp4_cuh() {
        let dir = tempfile::tempdir().unwrap();
        let compiler = crate::compile::Compiler::new(Some(dir.path().to_path_buf()))
            .unwrap_or_else(|e| panic!("{e}"));
        for arch in [Family::Sm90.arch(), Family::Sm120.arch()] {
            for back in [false, true] {
                let src = order_source(arch, back);
                compiler.compile(&src).unwrap_or_else(|e| panic!("{}: {e}", src.kernel_name));
            }
        }
    }

    #[test]
    fn sm90_reads_the_decode_order_and_sm120_the_modelopt_one() {
        assert_eq!(WeightOrder::of(Family::Sm90), WeightOrder::Decode);
        assert_eq!(WeightOrder::of(Family::Sm120), WeightOrder::ModelOpt);
    }
}
