// Activation quantizer: bf16 [M, K] -> NVFP4 codes [M, K/2] + swizzled UE4M3 scales, static input
// scale. Bit-identical to the CPU quantizer fp4tune::format::quant::quantize_activation_block
// (Rust); every step below is the same single IEEE fp32 operation, in the same order:
//   1. amax = max |x_i| over the 16 values of a block, from +0, NaN ignored (max.f32)
//   2. t = amax / 6.0f; t = t / input_scale     (two IEEE divisions; NVRTC's default -prec-div)
//   3. sf = e4m3_encode(t)                      (RNE, saturating at 448, NaN -> 0x7F)
//   4. d = f32(sf) * input_scale
//   5. f32(sf) == 0 ? every code 0 : code_i = e2m1_encode(x_i / d)
// No fast-math: compiled without --use_fast_math, and there is no multiply-add to contract.
// e4m3_encode and e2m1_encode repeat the integer / comparison code of format/e4m3.rs and
// format/e2m1.rs line by line.
#pragma once
#include "common/params.cuh"

namespace fp4tune {

// The single (by-value) kernel argument; mirrored by template::quantize::QuantizeParams in Rust.
//   x      bf16 [M, K] row-major, 16-byte aligned (K % 16 == 0)
//   codes  [M, K/2] bytes, element 2j in the low nibble, 8-byte aligned
//   sf     swizzled 128x4 layout: round_up(M, 128) * round_up(K/16, 4) bytes, every byte written
//          (padding rows and scale columns get 0)
struct QuantizeParams {
    const uint16_t* x;
    uint8_t* codes;
    uint8_t* sf;
    int m;
    int k;
    float input_scale;
};

// Nearest E4M3 byte of x, ties to even, |x| > 448 (inf included) -> +-448, NaN -> 0x7F.
__device__ __forceinline__ uint32_t e4m3_encode(float x) {
    const uint32_t bits = __float_as_uint(x);
    const uint32_t sign = (bits >> 24) & 0x80u;
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return 0x7fu;
    if (abs > 0x43e00000u) return sign | 0x7eu;
    const int exp = static_cast<int>(abs >> 23);
    if (exp >= 121) {
        const uint32_t t = abs - (120u << 23);
        return sign | ((t + 0x7ffffu + ((t >> 20) & 1u)) >> 20);
    }
    if (exp == 0) return sign;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(141 - exp);
    if (shift >= 25u) return sign;
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q += 1u;
    return sign | q;
}

// Value of an E4M3 byte (exact).
__device__ __forceinline__ float e4m3_decode(uint32_t c) {
    const uint32_t e = (c >> 3) & 15u;
    const uint32_t m = c & 7u;
    const uint32_t sign = (c & 0x80u) << 24;
    if (e == 15u && m == 7u) return __uint_as_float(0x7fc00000u);
    if (e == 0u) return __uint_as_float(__float_as_uint(static_cast<float>(m) * 0.001953125f) | sign);
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

// Nearest E2M1 code of x, ties to even, saturating at 6; sign = (x < 0); NaN -> 7.
__device__ __forceinline__ uint32_t e2m1_encode(float x) {
    const uint32_t sign = x < 0.0f ? 8u : 0u;
    const float a = __uint_as_float(__float_as_uint(x) & 0x7fffffffu);
    uint32_t mag;
    if (a <= 0.25f) mag = 0u;
    else if (a < 0.75f) mag = 1u;
    else if (a <= 1.25f) mag = 2u;
    else if (a < 1.75f) mag = 3u;
    else if (a <= 2.5f) mag = 4u;
    else if (a < 3.5f) mag = 5u;
    else if (a <= 5.0f) mag = 6u;
    else mag = 7u;
    return sign | mag;
}

// max.f32 returns the non-NaN operand when one is NaN, like Rust's f32::max.
__device__ __forceinline__ float max_nan_ignoring(float a, float b) {
    float r;
    asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// One thread per (row, scale column) of the PADDED scale matrix: round_up(M, 128) rows by
// round_up(K/16, 4) columns, row-major over the grid. Threads inside [M, K/16] quantize their
// 16 values; the others write a zero scale byte.
template <int THREADS>
__device__ __forceinline__ void quantize_bf16_nvfp4(const QuantizeParams& p) {
    const uint32_t ksf = static_cast<uint32_t>(p.k) >> 4;
    const uint32_t ksf_pad = (ksf + 3u) & ~3u;
    const uint32_t m_pad = (static_cast<uint32_t>(p.m) + 127u) & ~127u;
    const uint64_t idx = static_cast<uint64_t>(blockIdx.x) * THREADS + threadIdx.x;
    if (ksf_pad == 0u || idx >= static_cast<uint64_t>(m_pad) * ksf_pad) return;
    const uint32_t row = static_cast<uint32_t>(idx / ksf_pad);
    const uint32_t kb = static_cast<uint32_t>(idx % ksf_pad);
    const uint32_t sf_off = swizzled_sf_offset(row, kb, ksf_pad);
    if (row >= static_cast<uint32_t>(p.m) || kb >= ksf) {
        p.sf[sf_off] = 0;
        return;
    }
    // (16,) bf16: two 16-byte loads; element 2j is the low half of 32-bit word j.
    const uint64_t base = static_cast<uint64_t>(row) * static_cast<uint32_t>(p.k) + kb * 16u;
    const uint4* src = reinterpret_cast<const uint4*>(p.x + base);
    const uint4 v0 = src[0];
    const uint4 v1 = src[1];
    const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    float x[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        x[2 * j] = bf16_bits_to_float(static_cast<uint16_t>(w[j] & 0xffffu));
        x[2 * j + 1] = bf16_bits_to_float(static_cast<uint16_t>(w[j] >> 16));
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = max_nan_ignoring(amax, __uint_as_float(__float_as_uint(x[i]) & 0x7fffffffu));
    float t = amax / 6.0f;
    t = t / p.input_scale;
    const uint32_t sf = e4m3_encode(t);
    const float sff = e4m3_decode(sf);
    uint32_t lo = 0u, hi = 0u;
    if (sff != 0.0f) {
        const float d = sff * p.input_scale;
#pragma unroll
        for (int i = 0; i < 8; ++i) lo |= e2m1_encode(x[i] / d) << (4 * i);
#pragma unroll
        for (int i = 0; i < 8; ++i) hi |= e2m1_encode(x[8 + i] / d) << (4 * i);
    }
    // (8,) bytes of codes: one 64-bit store.
    *reinterpret_cast<uint2*>(p.codes + base / 2) = make_uint2(lo, hi);
    p.sf[sf_off] = static_cast<uint8_t>(sf);
}

}  // namespace fp4tune
