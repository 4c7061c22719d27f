// Epilogue of the SM120 family: in-CTA reduction over k-warps, deterministic split-K across CTAs
// (fp32 partials in workspace[split][M][N], one arrival counter per output tile, the last CTA sums
// the splits in order and resets the counter), alpha, bf16 store of rows inside (M, N) only.
#pragma once
#include "common/types.cuh"
#include "common/params.cuh"
#include "sm120/config.cuh"
#include "sm120/ptx.cuh"

namespace fp4tune {
namespace sm120 {

// The split-K arrival of one CTA (thread 0 only, after a barrier behind every thread's partial
// stores and fence): a release fence, the arrival on `counter`, and for the last of `splits`
// CTAs an acquire fence and the counter's reset (nobody else touches it in this launch). Whether
// this CTA is the last.
__device__ __forceinline__ bool split_arrive(uint32_t* counter, uint32_t splits) {
    fence_gpu();
    const uint32_t arrived = atomic_add_u32(counter, 1u);
    const bool last = arrived == splits - 1;
    if (last) {
        fence_gpu();
        st_u32_relaxed(counter, 0u);
    }
    return last;
}

template <class Cfg>
struct Epilogue {
    using Acc = float[Cfg::MMA_P][Cfg::MMA_Q][4];
    static constexpr int PER_WARP = Cfg::MMA_P * Cfg::MMA_Q * 4 * 32;

    // Warps with wk > 0 hand their partial sums to the wk == 0 warp of the same (p, q) position,
    // which adds them in wk order. Reuses the pipeline's shared memory (call after the mainloop).
    __device__ __forceinline__ static void reduce_k_warps(Acc& acc, uint8_t* smem, int warp_pq, int wk,
                                                          int lane) {
        if constexpr (Cfg::WARPS_K > 1) {
            float* red = reinterpret_cast<float*>(smem);
            if (wk > 0) {
                float* dst = red + ((wk - 1) * Cfg::WARPS_P * Cfg::WARPS_Q + warp_pq) * PER_WARP;
#pragma unroll
                for (int mp = 0; mp < Cfg::MMA_P; ++mp)
#pragma unroll
                    for (int mq = 0; mq < Cfg::MMA_Q; ++mq)
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            dst[((mp * Cfg::MMA_Q + mq) * 4 + i) * 32 + lane] = acc[mp][mq][i];
            }
            __syncthreads();
            if (wk == 0) {
#pragma unroll 1
                for (int kk = 1; kk < Cfg::WARPS_K; ++kk) {
                    const float* src = red + ((kk - 1) * Cfg::WARPS_P * Cfg::WARPS_Q + warp_pq) * PER_WARP;
#pragma unroll
                    for (int mp = 0; mp < Cfg::MMA_P; ++mp)
#pragma unroll
                        for (int mq = 0; mq < Cfg::MMA_Q; ++mq)
#pragma unroll
                            for (int i = 0; i < 4; ++i)
                                acc[mp][mq][i] += src[((mp * Cfg::MMA_Q + mq) * 4 + i) * 32 + lane];
                }
            }
        }
    }

    // (m, n) of accumulator element i of MMA tile (mp, mq) held by `lane`.
    __host__ __device__ __forceinline__ static constexpr void coords(int tile_p0, int tile_q0, int warp_p0,
                                                                     int warp_q0, int mp, int mq, int i, int lane,
                                                                     int& m, int& n) {
        const int pp = tile_p0 + warp_p0 + mp * 16 + (lane >> 2) + (i >> 1) * 8;
        const int qq = tile_q0 + warp_q0 + mq * 8 + (lane & 3) * 2 + (i & 1);
        m = Cfg::SWAP_AB ? qq : pp;
        n = Cfg::SWAP_AB ? pp : qq;
    }

    // Only warps with wk == 0 call this, but every thread of the CTA must reach it when SPLIT_K > 1
    // (it synchronizes); `active` says whether this thread holds output.
    __device__ __forceinline__ static void store(const GemmParams& p, Acc& acc, uint8_t* smem, bool active,
                                                 int tile_p0, int tile_q0, int warp_p0, int warp_q0,
                                                 int lane) {
        const int M = p.m;
        const int N = p.n;
        if constexpr (Cfg::SPLIT_K == 1) {
            if (!active) return;
#pragma unroll
            for (int mp = 0; mp < Cfg::MMA_P; ++mp)
#pragma unroll
                for (int mq = 0; mq < Cfg::MMA_Q; ++mq)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        int m, n;
                        coords(tile_p0, tile_q0, warp_p0, warp_q0, mp, mq, i, lane, m, n);
                        if (!Cfg::SWAP_AB && (i & 1) == 0 && (N & 1) == 0) {
                            // n is even here: store the pair (n, n + 1) as one 32-bit word.
                            if (m < M && n < N) {
                                const uint32_t lo = float_to_bf16_bits(p.alpha * acc[mp][mq][i]);
                                const uint32_t hi = float_to_bf16_bits(p.alpha * acc[mp][mq][i + 1]);
                                *reinterpret_cast<uint32_t*>(p.y + static_cast<uint64_t>(m) * N + n) =
                                    lo | (hi << 16);
                            }
                            continue;
                        }
                        if (!Cfg::SWAP_AB && (i & 1) == 1 && (N & 1) == 0) continue;
                        if (m < M && n < N)
                            p.y[static_cast<uint64_t>(m) * N + n] = float_to_bf16_bits(p.alpha * acc[mp][mq][i]);
                    }
        } else {
            const uint64_t plane = static_cast<uint64_t>(M) * N;
            if (active) {
                float* ws = p.workspace + blockIdx.z * plane;
#pragma unroll
                for (int mp = 0; mp < Cfg::MMA_P; ++mp)
#pragma unroll
                    for (int mq = 0; mq < Cfg::MMA_Q; ++mq)
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            int m, n;
                            coords(tile_p0, tile_q0, warp_p0, warp_q0, mp, mq, i, lane, m, n);
                            if (m < M && n < N) ws[static_cast<uint64_t>(m) * N + n] = acc[mp][mq][i];
                        }
            }
            fence_gpu();
            __syncthreads();
            uint32_t* flag = reinterpret_cast<uint32_t*>(smem + Cfg::FLAG_OFFSET);
            if (threadIdx.x == 0)
                *flag = split_arrive(p.counters + blockIdx.y * gridDim.x + blockIdx.x, Cfg::SPLIT_K) ? 1u : 0u;
            __syncthreads();
            if (*flag == 0u || !active) return;
            fence_gpu();
#pragma unroll
            for (int mp = 0; mp < Cfg::MMA_P; ++mp)
#pragma unroll
                for (int mq = 0; mq < Cfg::MMA_Q; ++mq)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        int m, n;
                        coords(tile_p0, tile_q0, warp_p0, warp_q0, mp, mq, i, lane, m, n);
                        if (m < M && n < N) {
                            const float* src = p.workspace + static_cast<uint64_t>(m) * N + n;
                            float sum = 0.0f;
#pragma unroll 1
                            for (int s = 0; s < Cfg::SPLIT_K; ++s) sum += ld_cg_f32(src + s * plane);
                            p.y[static_cast<uint64_t>(m) * N + n] = float_to_bf16_bits(p.alpha * sum);
                        }
                    }
        }
    }
};

}  // namespace sm120
}  // namespace fp4tune
