// The store of one warp's grouped tile, shared by the sm90 and sm120 grouped kernels: both hold
// weights on the MMA's 16-row side (P) and routed rows on its 8-wide side (Q), with the C layout
// c0, c1 = P row g, Q columns 2t, 2t+1 and c2, c3 = P row g + 8, the same columns (g = lane / 4,
// t = lane % 4).
//
// OP_GATE_UP: P rows g and g + 8 of m16 tile i are the gate and up rows of one H column (the
// kernels interleave them so), so elements e and e + 2 are gate and up of (row 2t + e of n8 tile q,
// column pw0 / 2 + 8 i + g): H = SiLU(gate) * up is written as bf16, and with QUANT_H also as NVFP4.
// OP_DOWN: P row pw0 + 16 i + 8 h + g is output column n of Y_rows.
//
// QUANT_H (W4A4 gate_up): a 16-column block of H is m16 tiles 2j and 2j + 1 of one warp, held by
// the 8 lanes of one t (g = 0..7, two values each) for every (q, e). Each block is quantized from
// its bf16-rounded values exactly as common/quantize.cuh does it (amax over the 16 by max.f32 from
// +0, NaN ignored; two divisions; e4m3_encode; d = f32(sf) * h_scale; e2m1_encode(x / d)): the
// amax and the two 8-code words are reduced over the lanes' g bits (xor 4, 8, 16; max and bitwise
// or are exact in any order), and the lane with g = 0 stores the block's 8 code bytes and its scale.
// Needs P_TILES even and pw0 / 2 a multiple of 16 (moe::GroupedConfig::check).
#pragma once
#include "common/quantize.cuh"
#include "moe/params.cuh"

namespace fp4tune {
namespace moe {

// x / (1 + e^-x) in fp32 (the CPU reference computes the same expression).
__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

// H as NVFP4: h[i][q][e] is the (bf16-rounded) H value of column c0 + 8 i + g, tile-local row
// qw0 + 8 q + 2 t + e; tile rows from `rows` on are computed but not stored.
template <int P_TILES, int Q_TILES>
__device__ __forceinline__ void store_h_nvfp4(const GroupedParams& p, const float (&h)[P_TILES][Q_TILES][2],
                                              int row0, int rows, int c0, int qw0, int lane) {
    static_assert(P_TILES % 2 == 0, "a 16-column block of H is two m16 tiles of one warp");
    const int g = lane >> 2;
    const int t = lane & 3;
    const int inter = p.n / 2;
    const uint32_t ksf_pad = static_cast<uint32_t>((inter / 16 + 3) / 4 * 4);
#pragma unroll
    for (int j = 0; j < P_TILES / 2; ++j)
#pragma unroll
        for (int q = 0; q < Q_TILES; ++q)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float x0 = h[2 * j][q][e];
                const float x1 = h[2 * j + 1][q][e];
                float amax = max_nan_ignoring(0.0f, __uint_as_float(__float_as_uint(x0) & 0x7fffffffu));
                amax = max_nan_ignoring(amax, __uint_as_float(__float_as_uint(x1) & 0x7fffffffu));
#pragma unroll
                for (int d = 4; d < 32; d <<= 1) amax = max_nan_ignoring(amax, __shfl_xor_sync(0xffffffffu, amax, d));
                float s = amax / 6.0f;
                s = s / p.h_scale;
                const uint32_t sf = e4m3_encode(s);
                const float sff = e4m3_decode(sf);
                uint32_t w0 = 0u, w1 = 0u;
                if (sff != 0.0f) {
                    const float dq = sff * p.h_scale;
                    w0 = e2m1_encode(x0 / dq) << (4 * g);
                    w1 = e2m1_encode(x1 / dq) << (4 * g);
                }
#pragma unroll
                for (int d = 4; d < 32; d <<= 1) {
                    w0 |= __shfl_xor_sync(0xffffffffu, w0, d);
                    w1 |= __shfl_xor_sync(0xffffffffu, w1, d);
                }
                const int m = qw0 + 8 * q + 2 * t + e;
                const int col = c0 + 16 * j;
                if (g == 0 && m < rows && col < inter) {
                    const size_t r = static_cast<size_t>(row0 + m);
                    *reinterpret_cast<uint2*>(p.h_codes + r * (inter / 2) + col / 2) = make_uint2(w0, w1);
                    p.h_sf[swizzled_sf_offset(static_cast<uint32_t>(r), static_cast<uint32_t>(col / 16), ksf_pad)] =
                        static_cast<uint8_t>(sf);
                }
            }
}

// Scale, activation and store of one warp's accumulators: pw0 is the warp's first weight row in N
// (the CTA's n0 plus the warp's offset), qw0 its first tile-local routed row, row0 / rows the tile's
// first sorted row and its row count.
template <int P_TILES, int Q_TILES, int OP, bool QUANT_H>
__device__ __forceinline__ void store_tile(const GroupedParams& p, float out_scale,
                                           const float (&acc)[P_TILES][Q_TILES][4], int row0, int rows, int pw0,
                                           int qw0, int lane) {
    static_assert(!QUANT_H || OP == OP_GATE_UP, "only gate_up writes H");
    const int g = lane >> 2;
    const int t = lane & 3;
    if constexpr (OP == OP_GATE_UP) {
        const int half = p.n / 2;
        float h[P_TILES][Q_TILES][2];
#pragma unroll
        for (int i = 0; i < P_TILES; ++i)
#pragma unroll
            for (int q = 0; q < Q_TILES; ++q)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int m = qw0 + 8 * q + 2 * t + e;
                    const int col = pw0 / 2 + 8 * i + g;
                    const uint16_t bits =
                        float_to_bf16_bits(silu(acc[i][q][e] * out_scale) * (acc[i][q][e + 2] * out_scale));
                    if (m < rows && col < half) p.y[static_cast<size_t>(row0 + m) * half + col] = bits;
                    h[i][q][e] = bf16_bits_to_float(bits);
                }
        if constexpr (QUANT_H) store_h_nvfp4<P_TILES, Q_TILES>(p, h, row0, rows, pw0 / 2, qw0, lane);
    } else {
#pragma unroll
        for (int i = 0; i < P_TILES; ++i)
#pragma unroll
            for (int q = 0; q < Q_TILES; ++q)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int m = qw0 + 8 * q + 2 * t + (e & 1);
                    const int n = pw0 + 16 * i + 8 * (e >> 1) + g;
                    if (m < rows && n < p.n)
                        p.y[static_cast<size_t>(row0 + m) * p.n + n] = float_to_bf16_bits(acc[i][q][e] * out_scale);
                }
    }
}

}  // namespace moe
}  // namespace fp4tune
