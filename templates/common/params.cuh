// The kernel parameter block shared by every family (mirrored by gpu::GemmParams in Rust).
#pragma once
#include "common/types.cuh"

namespace fp4tune {

// Y[M, N] (bf16) = alpha * deq(A)[M, K] * deq(W)[N, K]^T.
// Layouts (identical for every family):
//   w      [N, K/2] bytes, element 2j in the low nibble (ModelOpt layout)
//   w_sf   UE4M3, swizzled 128x4 layout, rows padded to 128, scale columns (K/16) padded to 4
//   a      W4A4: [M, K/2] codes like w; W4A16: bf16 [M, K] row-major
//   a_sf   W4A4: swizzled scales like w_sf (rows padded to 128); W4A16: unused
//   y      bf16 [M, N] row-major
//   workspace  split-K partial sums, split_k * M * N floats (unused when split_k == 1)
//   counters   one u32 per output tile, zero before the launch and zero after it
struct GemmParams {
    const uint8_t* a;
    const uint8_t* a_sf;
    const uint8_t* w;
    const uint8_t* w_sf;
    uint16_t* y;
    float* workspace;
    uint32_t* counters;
    int m;
    int n;
    int k;
    float alpha;
};

// Byte offset of scale (row, kb) in the swizzled 128x4 layout; ksf_pad = K/16 rounded up to 4.
__device__ __forceinline__ uint32_t swizzled_sf_offset(uint32_t row, uint32_t kb, uint32_t ksf_pad) {
    return ((row >> 7) * (ksf_pad >> 2) + (kb >> 2)) * 512u + (row & 31u) * 16u +
           ((row >> 5) & 3u) * 4u + (kb & 3u);
}

}  // namespace fp4tune
