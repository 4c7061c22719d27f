// moe_finalize: the router-weighted sum of each token's routed rows, in slot order (deterministic,
// no atomics): Y[t, c] = bf16(sum over s = 0 .. top_k - 1 of fma(weights[t, s], Y_rows[pos, c])),
// pos = inverse[t * top_k + s], slots with pos < 0 (experts of other GPUs) skipped.
//
// The slots are read in groups of SLOT_GROUP (positions, then the weights and rows of the slots
// whose expert is local), so a group's loads are in flight together; the sums keep slot order, so
// every SLOT_GROUP gives the same bits. SLOT_GROUP 8 holds a whole top-8 token's rows in flight
// (decode: one wave of CTAs); 1 needs half the registers, so twice the CTAs of a large grid share
// an SM.
//
// Launch contract (runtime::moe): grid (tokens, ceil(n / (FINALIZE_THREADS * 8))), FINALIZE_THREADS
// threads, n % 8 == 0, rows 16-byte aligned; each thread owns 8 consecutive columns.
#pragma once
#include "moe/params.cuh"

namespace fp4tune {
namespace moe {

constexpr int FINALIZE_THREADS = 256;

template <int SLOT_GROUP>
__device__ __forceinline__ void moe_finalize(const FinalizeParams& p) {
    static_assert(SLOT_GROUP >= 1 && SLOT_GROUP <= 8, "slot groups of 1 to 8");
    const int t = blockIdx.x;
    const int c = (blockIdx.y * FINALIZE_THREADS + threadIdx.x) * 8;
    if (t >= p.tokens || c >= p.n) return;
    float acc[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
    for (int s0 = 0; s0 < p.top_k; s0 += SLOT_GROUP) {
        int pos[SLOT_GROUP];
        float w[SLOT_GROUP];
        uint4 v[SLOT_GROUP];
#pragma unroll
        for (int s = 0; s < SLOT_GROUP; ++s) pos[s] = s0 + s < p.top_k ? p.inverse[t * p.top_k + s0 + s] : -1;
#pragma unroll
        for (int s = 0; s < SLOT_GROUP; ++s) {
            if (pos[s] < 0) continue;
            w[s] = p.weights[t * p.top_k + s0 + s];
            v[s] = *reinterpret_cast<const uint4*>(p.rows + static_cast<size_t>(pos[s]) * p.n + c);
        }
#pragma unroll
        for (int s = 0; s < SLOT_GROUP; ++s) {
            if (pos[s] < 0) continue;
            const uint32_t words[4] = {v[s].x, v[s].y, v[s].z, v[s].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc[2 * j] = __fmaf_rn(w[s], __uint_as_float(words[j] << 16), acc[2 * j]);
                acc[2 * j + 1] = __fmaf_rn(w[s], __uint_as_float(words[j] & 0xffff0000u), acc[2 * j + 1]);
            }
        }
    }
    uint32_t out[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
        out[j] = static_cast<uint32_t>(float_to_bf16_bits(acc[2 * j])) |
                 (static_cast<uint32_t>(float_to_bf16_bits(acc[2 * j + 1])) << 16);
    *reinterpret_cast<uint4*>(p.y + static_cast<size_t>(t) * p.n + c) = make_uint4(out[0], out[1], out[2], out[3]);
}

}  // namespace moe
}  // namespace fp4tune
