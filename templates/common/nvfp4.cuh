// Exact NVFP4 decoding to bf16 in registers, shared by every family that dequantizes.
//
// E2M1 codes are placed bit-for-bit into a bf16: the 3 magnitude bits (e1 e0 m) become bf16 bits
// 8..6 (the two lowest exponent bits and the top mantissa bit) and the sign bit becomes bit 15.
// For e >= 1 that bf16 is 2^(e-127) * (1 + m/2) and for e == 0 the bf16 subnormal 2^-126 * m/2; the
// E2M1 values are 2^(e-1) * (1 + m/2) and m/2: the raw bf16 is exactly value * 2^-126 for all 16
// codes. The block scale is prepared as s * 2^119 (a normal bf16 for every finite E4M3 s, at most
// 448 * 2^119 < 2^128), so one mul.rn.bf16x2 gives value * s * 2^-7 exactly (at most 6 significant
// bits, magnitude in [2^-17, 21]: always a normal bf16). The 2^-7 per FP4 operand is undone in the
// fp32 epilogue together with alpha (a power of two: exact), never folded into the operands.
#pragma once
#include "common/ptx.cuh"

namespace fp4tune {
namespace nvfp4 {

// log2 of the factor every dequantized FP4 operand carries; the epilogue multiplies by 2^-this.
constexpr int OPERAND_LOG2 = -7;
// 2^119 as an fp32 bit pattern (biased exponent 246).
constexpr uint32_t SCALE_BIAS_F32_BITS = 0x7B000000u;
// The bits of a bf16x2 that raw E2M1 codes occupy: magnitude on 8..6, sign on 15 (and + 16).
constexpr uint32_t RAW_BF16X2 = 0x81C081C0u;

// Two E2M1 codes of a 32-bit word of 8 codes (nibble i = element i, element 0 in the low nibble)
// as raw bf16x2: nibble S -> lower half, nibble S + 4 -> upper half, each value * 2^-126.
// One mask, one multiply, one mask: x = codes S and S + 4 alone (S >= 2 reads the word shifted by 8
// bits, which the compiler shares between the two pairs), and x * (2^(6-4s) + 2^(12-4s)) with
// s = S % 2 adds two copies of x that never overlap (so no carries): the first puts the magnitude
// bits (e1 e0 m) on bf16 bits 8..6, the second the sign on bit 15 (and 24..22, 31 for S + 4). In the
// sm_90a SASS this is one instruction per pair fewer than shifting the sign and the magnitude
// separately, and the multiply issues to the FMA pipe instead of the integer pipe.
template <int S>
__device__ __forceinline__ uint32_t e2m1_pair_raw(uint32_t w) {
    static_assert(S >= 0 && S < 4, "nibble pair index is 0..3");
    const uint32_t src = S >= 2 ? w >> 8 : w;
    const uint32_t x = src & (S % 2 == 0 ? 0x000F000Fu : 0x00F000F0u);
    return (x * (S % 2 == 0 ? 0x1040u : 0x0104u)) & RAW_BF16X2;
}

// One E4M3 scale (fp32 value s) -> bf16x2 (s * 2^119, s * 2^119).
__device__ __forceinline__ uint32_t prepared_scale_dup(float s) {
    const float v = s * __uint_as_float(SCALE_BIAS_F32_BITS);
    return ptx::cvt_bf16x2_f32(v, v);
}

// Two E4M3 scales (byte 0 = first block, byte 1 = second) -> prepared bf16x2 duplicates.
__device__ __forceinline__ void e4m3x2_prepared(uint16_t sf2, uint32_t& s0, uint32_t& s1) {
    const uint32_t h2 = ptx::cvt_f16x2_e4m3x2(sf2);
    s0 = prepared_scale_dup(ptx::f16_lo_to_f32(h2));
    s1 = prepared_scale_dup(ptx::f16_hi_to_f32(h2));
}

// One E4M3 scale byte -> prepared bf16x2 duplicate.
__device__ __forceinline__ uint32_t e4m3_prepared(uint8_t sf) {
    const uint32_t h2 = ptx::cvt_f16x2_e4m3x2(static_cast<uint16_t>(sf));
    return prepared_scale_dup(ptx::f16_lo_to_f32(h2));
}

// The 4 dequantized bf16x2 registers of one word of 8 codes under one prepared scale:
// r[s] = (element s, element s + 4) * scale * 2^-7.
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t scale, uint32_t (&r)[4]) {
    r[0] = ptx::mul_bf16x2(e2m1_pair_raw<0>(w), scale);
    r[1] = ptx::mul_bf16x2(e2m1_pair_raw<1>(w), scale);
    r[2] = ptx::mul_bf16x2(e2m1_pair_raw<2>(w), scale);
    r[3] = ptx::mul_bf16x2(e2m1_pair_raw<3>(w), scale);
}

// The decode order of a layer's weight codes (moe::order in Rust; the grouped sm90 kernels read
// it): the 32 bits of every word of 8 codes permuted so that pair 1 (elements 1 and 5) sits on the
// raw bf16x2 bit positions (mask only), pairs 0 and 2 on them rotated left by 22 and 3 bits, and
// pair 3 on the bits left (mask 0x001B001B), from where one multiply by 2^3 + 2^8 + 2^14 makes
// copies that never overlap (so no carries) and land on the raw positions. The rotations are
// those that also let the wgmma kernel's lanes take elements (2t, 2t + 1) with one rotation and
// one masked multiply (moe/sm90_wgmma.cuh LanePick).
constexpr uint32_t ORDER_PAIR3_MASK = 0x001B001Bu;
constexpr uint32_t ORDER_PAIR3_MUL = 0x4108u;
constexpr int ORDER_ROTATION[3] = {22, 0, 3};  // pairs 0, 1, 2: left rotation of the raw positions

// Raw bf16x2 pair S of a word in the decode order (the integer part of dequant_word_ordered).
template <int S>
__device__ __forceinline__ uint32_t ordered_pair_raw(uint32_t w) {
    static_assert(S >= 0 && S < 4, "nibble pair index is 0..3");
    if constexpr (S == 3) {
        return ((w & ORDER_PAIR3_MASK) * ORDER_PAIR3_MUL) & RAW_BF16X2;
    } else if constexpr (ORDER_ROTATION[S] == 0) {
        return w & RAW_BF16X2;
    } else {
        return __funnelshift_r(w, w, ORDER_ROTATION[S]) & RAW_BF16X2;
    }
}

// dequant_word for a word in the decode order: the same r[s] = (element s, element s + 4) with 8
// integer instructions per word instead of 13.
__device__ __forceinline__ void dequant_word_ordered(uint32_t w, uint32_t scale, uint32_t (&r)[4]) {
    r[0] = ptx::mul_bf16x2(ordered_pair_raw<0>(w), scale);
    r[1] = ptx::mul_bf16x2(ordered_pair_raw<1>(w), scale);
    r[2] = ptx::mul_bf16x2(ordered_pair_raw<2>(w), scale);
    r[3] = ptx::mul_bf16x2(ordered_pair_raw<3>(w), scale);
}

// A weight word in the ModelOpt order (ORDERED false) or the decode order (true).
template <bool ORDERED>
__device__ __forceinline__ void dequant_weight_word(uint32_t w, uint32_t scale, uint32_t (&r)[4]) {
    if constexpr (ORDERED) {
        dequant_word_ordered(w, scale, r);
    } else {
        dequant_word(w, scale, r);
    }
}

// The same pairing for 8 bf16 values held as 4 words (w0 = elements 0,1 ... w3 = elements 6,7):
// r[s] = (element s, element s + 4).
__device__ __forceinline__ void pair_bf16x8(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3,
                                            uint32_t (&r)[4]) {
    r[0] = ptx::prmt(w0, w2, 0x5410u);
    r[1] = ptx::prmt(w0, w2, 0x7632u);
    r[2] = ptx::prmt(w1, w3, 0x5410u);
    r[3] = ptx::prmt(w1, w3, 0x7632u);
}

}  // namespace nvfp4
}  // namespace fp4tune
