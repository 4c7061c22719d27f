// moe_finalize: the router-weighted sum of each token's routed rows, in slot order (deterministic,
// no atomics): Y[t, c] = bf16(sum over s = 0 .. top_k - 1 of fma(weights[t, s], Y_rows[pos, c])),
// pos = inverse[t * top_k + s], slots with pos < 0 (experts of other GPUs) skipped.
//
// Launch contract (runtime::moe): grid (tokens, ceil(n / (FINALIZE_THREADS * 8))), FINALIZE_THREADS
// threads, n % 8 == 0, rows 16-byte aligned; each thread owns 8 consecutive columns.
#pragma once
#include "moe/params.cuh"

namespace fp4tune {
namespace moe {

constexpr int FINALIZE_THREADS = 256;

__device__ __forceinline__ void moe_finalize(const FinalizeParams& p) {
    const int t = blockIdx.x;
    const int c = (blockIdx.y * FINALIZE_THREADS + threadIdx.x) * 8;
    if (t >= p.tokens || c >= p.n) return;
    float acc[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
    for (int s = 0; s < p.top_k; ++s) {
        const int pos = p.inverse[t * p.top_k + s];
        if (pos < 0) continue;
        const float w = p.weights[t * p.top_k + s];
        const uint4 v = *reinterpret_cast<const uint4*>(p.rows + static_cast<size_t>(pos) * p.n + c);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            acc[2 * j] = __fmaf_rn(w, __uint_as_float(words[j] << 16), acc[2 * j]);
            acc[2 * j + 1] = __fmaf_rn(w, __uint_as_float(words[j] & 0xffff0000u), acc[2 * j + 1]);
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
