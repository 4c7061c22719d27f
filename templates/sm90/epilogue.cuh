// After the main loop: in-CTA K reduction (WARPS_K > 1), deterministic split-K reduction
// (SPLIT_K > 1), alpha and the FP4 power-of-two undo, bf16 conversion and predicated stores.
#pragma once
#include "common/nvfp4.cuh"
#include "common/params.cuh"
#include "common/ptx.cuh"

namespace fp4tune {
namespace sm90 {

// Output coordinates of accumulator element (i, q, e) of lane (g, t): P-row p0 + 16i + g + 8(e/2),
// Q-column q0 + 8q + 2t + e%2; P is N and Q is M under swap_ab, the other way round otherwise.
template <class Cfg>
__device__ __forceinline__ void acc_coords(int p0, int q0, int lane, int i, int q, int e, int& m, int& n) {
    const int pr = p0 + 16 * i + (lane >> 2) + 8 * (e >> 1);
    const int qc = q0 + 8 * q + 2 * (lane & 3) + (e & 1);
    if constexpr (Cfg::SWAP_AB) {
        n = pr;
        m = qc;
    } else {
        m = pr;
        n = qc;
    }
}

// f(m, n, e_first, count): count = 2 when elements e and e+1 are (m, n) and (m, n+1) (no swap:
// one 2-wide store), else 1. Only in-bounds elements are visited (N % 8 == 0 makes pairs whole).
template <class Cfg, class F>
__device__ __forceinline__ void for_each_output(int m0, int n0, int p0, int q0, int lane, int M, int N, F f) {
#pragma unroll
    for (int i = 0; i < Cfg::P_TILES; ++i) {
#pragma unroll
        for (int q = 0; q < Cfg::Q_TILES; ++q) {
#pragma unroll
            for (int e = 0; e < 4; e += (Cfg::SWAP_AB ? 1 : 2)) {
                int m, n;
                acc_coords<Cfg>(p0, q0, lane, i, q, e, m, n);
                m += m0;
                n += n0;
                if (m < M && n < N) f(i, q, e, m, n);
            }
        }
    }
}

template <class Cfg>
__device__ __forceinline__ void epilogue(const GemmParams& p, uint8_t* smem, float (&acc)[Cfg::P_TILES][Cfg::Q_TILES][4],
                                         int m0, int n0, int p0, int q0, int wk, int wmn, int lane, int tid) {
    constexpr int ACC = Cfg::ACC;
    float* flat = &acc[0][0][0];
    ptx::cp_async_wait<0>();

    // ---- in-CTA split-K: warps wk = 1.. park partials in shared memory, wk = 0 adds them in order.
    if constexpr (Cfg::WARPS_K > 1) {
        __syncthreads();  // every warp is done with the pipeline buffers
        float* red = reinterpret_cast<float*>(smem);
        if (wk > 0) {
            float* dst = red + ((wk - 1) * Cfg::WARPS_MN + wmn) * ACC * 32;
#pragma unroll
            for (int e = 0; e < ACC; ++e) dst[e * 32 + lane] = flat[e];
        }
        __syncthreads();
        if (wk == 0) {
#pragma unroll 1
            for (int kk = 1; kk < Cfg::WARPS_K; ++kk) {
                const float* src = red + ((kk - 1) * Cfg::WARPS_MN + wmn) * ACC * 32;
#pragma unroll
                for (int e = 0; e < ACC; ++e) flat[e] += src[e * 32 + lane];
            }
        }
    }

    // alpha times 2^7 per FP4 operand (nvfp4.cuh): exact power-of-two undo of the operand scaling.
    constexpr int FP4_OPERANDS = Cfg::A_FP4 ? 2 : 1;
    const float out_scale = p.alpha * __uint_as_float(static_cast<uint32_t>(127 - nvfp4::OPERAND_LOG2 * FP4_OPERANDS) << 23);
    const int M = p.m;
    const int N = p.n;

    if constexpr (Cfg::SPLIT_K == 1) {
        if (wk != 0) return;
        for_each_output<Cfg>(m0, n0, p0, q0, lane, M, N, [&](int i, int q, int e, int m, int n) {
            if constexpr (Cfg::SWAP_AB) {
                p.y[static_cast<size_t>(m) * N + n] = float_to_bf16_bits(acc[i][q][e] * out_scale);
            } else {
                const uint32_t v = ptx::cvt_bf16x2_f32(acc[i][q][e + 1] * out_scale, acc[i][q][e] * out_scale);
                *reinterpret_cast<uint32_t*>(p.y + static_cast<size_t>(m) * N + n) = v;
            }
        });
    } else if constexpr (Cfg::CLUSTER_SPLIT) {
        // ---- split-K inside a (1, 1, SPLIT_K) cluster: partials stay on chip. Every CTA parks its
        // tile in its own shared memory; rank 0 (blockIdx.z == 0) adds ranks 0..SPLIT_K-1 in order
        // through DSMEM (deterministic), the second cluster barrier keeps the others resident until then.
        __syncthreads();  // every warp is done with the pipeline / in-CTA reduction buffers
        float* park = reinterpret_cast<float*>(smem);
        if (wk == 0) {
#pragma unroll
            for (int e = 0; e < ACC; ++e) park[(wmn * ACC + e) * 32 + lane] = flat[e];
        }
        ptx::cluster_sync();
        if (blockIdx.z == 0 && wk == 0) {
            const uint32_t base = ptx::smem_addr(park) + (wmn * ACC * 32 + lane) * 4;
#pragma unroll
            for (int e = 0; e < ACC; ++e) flat[e] = 0.0f;
#pragma unroll 1
            for (int r = 0; r < Cfg::SPLIT_K; ++r) {
                const uint32_t remote = ptx::mapa_shared(base, r);
#pragma unroll
                for (int e = 0; e < ACC; ++e) flat[e] += ptx::ld_shared_cluster_f32(remote + e * 32 * 4);
            }
        }
        ptx::cluster_sync();
        if (blockIdx.z != 0 || wk != 0) return;
        for_each_output<Cfg>(m0, n0, p0, q0, lane, M, N, [&](int i, int q, int e, int m, int n) {
            if constexpr (Cfg::SWAP_AB) {
                p.y[static_cast<size_t>(m) * N + n] = float_to_bf16_bits(acc[i][q][e] * out_scale);
            } else {
                const uint32_t v = ptx::cvt_bf16x2_f32(acc[i][q][e + 1] * out_scale, acc[i][q][e] * out_scale);
                *reinterpret_cast<uint32_t*>(p.y + static_cast<size_t>(m) * N + n) = v;
            }
        });
    } else {
        // ---- split-K across CTAs: partial tile -> workspace[split][M][N]; the last CTA of the tile
        // (by an atomic ticket) sums splits 0..SPLIT_K-1 in order: the result is deterministic.
        const int split = blockIdx.z;
        float* ws = p.workspace;
        if (wk == 0) {
            for_each_output<Cfg>(m0, n0, p0, q0, lane, M, N, [&](int i, int q, int e, int m, int n) {
                float* dst = ws + (static_cast<size_t>(split) * M + m) * N + n;
                if constexpr (Cfg::SWAP_AB) {
                    __stcg(dst, acc[i][q][e]);
                } else {
                    __stcg(reinterpret_cast<float2*>(dst), make_float2(acc[i][q][e], acc[i][q][e + 1]));
                }
            });
        }
        __threadfence();
        __syncthreads();  // also: every warp is done with shared memory
        volatile int* flag = reinterpret_cast<volatile int*>(smem);
        uint32_t* counter = p.counters + (blockIdx.y * gridDim.x + blockIdx.x);
        if (tid == 0) {
            const uint32_t ticket = atomicAdd(counter, 1u);
            *flag = ticket == static_cast<uint32_t>(Cfg::SPLIT_K - 1) ? 1 : 0;
        }
        __syncthreads();
        if (*flag == 0) return;
        __threadfence();
        if (wk == 0) {
            for_each_output<Cfg>(m0, n0, p0, q0, lane, M, N, [&](int i, int q, int e, int m, int n) {
                const float* src = ws + static_cast<size_t>(m) * N + n;
                const size_t split_stride = static_cast<size_t>(M) * N;
                if constexpr (Cfg::SWAP_AB) {
                    float s = 0.0f;
#pragma unroll 4
                    for (int sk = 0; sk < Cfg::SPLIT_K; ++sk) s += __ldcg(src + sk * split_stride);
                    p.y[static_cast<size_t>(m) * N + n] = float_to_bf16_bits(s * out_scale);
                } else {
                    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 4
                    for (int sk = 0; sk < Cfg::SPLIT_K; ++sk) {
                        const float2 v = __ldcg(reinterpret_cast<const float2*>(src + sk * split_stride));
                        s0 += v.x;
                        s1 += v.y;
                    }
                    *reinterpret_cast<uint32_t*>(p.y + static_cast<size_t>(m) * N + n) =
                        ptx::cvt_bf16x2_f32(s1 * out_scale, s0 * out_scale);
                }
            });
        }
        if (tid == 0) *counter = 0u;  // leave the semaphore zeroed for the next launch
    }
}

}  // namespace sm90
}  // namespace fp4tune
