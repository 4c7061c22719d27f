// The SM80/SM90 NVFP4 GEMM: Y[M, N] (bf16) = alpha * deq(A)[M, K] * deq(W)[N, K]^T.
// Umbrella header of the family: the instantiation unit includes this file only.
//
// Launch contract (GemmConfig::launch_dims in Rust):
//   grid  = (ceil(N / BLOCK_N), ceil(M / BLOCK_M), SPLIT_K), block = (THREADS, 1, 1)
//   dynamic shared memory = Cfg::SMEM_BYTES (set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
//   when above 48 KiB).
//   1 < SPLIT_K <= 8: the kernel carries __cluster_dims__(1, 1, SPLIT_K) (a plain cuLaunchKernel
//   works); workspace and counters are not used.
//   SPLIT_K > 8: p.workspace holds SPLIT_K * M * N floats (no initialization needed) and p.counters
//   one u32 per output tile, index m_tile * ceil(N / BLOCK_N) + n_tile, zero before the launch; the
//   kernel leaves them zero. Launches that share counters must not overlap.
#pragma once
#include "common/params.cuh"
#include "common/ptx.cuh"
#include "sm90/config.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/load.cuh"
#include "sm90/mma.cuh"

namespace fp4tune {
namespace sm90 {

template <class Cfg>
__device__ __forceinline__ void gemm(const GemmParams& p) {
    // ---- preconditions (sm90.rs check_problem enforces them before a launch; a kernel that sees
    // them violated writes nothing): K % BLOCK_K == 0 (so every row of codes is 16-byte aligned and
    // K/16 needs no scale padding; the K-tail form: K % 16 == 0), N % 8 == 0 (2-wide output
    // stores), M, N, K > 0.
    if constexpr (Cfg::K_TAIL) {
        if (p.k % 16 != 0 || p.k <= 0 || (p.n & 7) != 0 || p.m <= 0 || p.n <= 0) return;
    } else {
        if (p.k % Cfg::BLOCK_K != 0 || (p.n & 7) != 0 || p.m <= 0 || p.n <= 0) return;
    }

    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wk = warp / Cfg::WARPS_MN;  // K slice of this warp
    const int wmn = warp % Cfg::WARPS_MN;
    const int wm = wmn % Cfg::WARPS_M;
    const int wn = wmn / Cfg::WARPS_M;
    const int wp = Cfg::SWAP_AB ? wn : wm;
    const int wq = Cfg::SWAP_AB ? wm : wn;
    const int p0 = wp * Cfg::WARP_P;  // warp tile: (WARP_P, WARP_Q) of the CTA's (P_ROWS, Q_ROWS)
    const int q0 = wq * Cfg::WARP_Q;

    const int n0 = blockIdx.x * Cfg::BLOCK_N;  // CTA tile: Y[m0 .. m0+BLOCK_M, n0 .. n0+BLOCK_N]
    const int m0 = blockIdx.y * Cfg::BLOCK_M;
    const int nkb = Cfg::K_TAIL ? (p.k + Cfg::BLOCK_K - 1) / Cfg::BLOCK_K : p.k / Cfg::BLOCK_K;
    const int kb_begin = static_cast<int>((static_cast<long long>(blockIdx.z) * nkb) / Cfg::SPLIT_K);
    const int kb_end = static_cast<int>((static_cast<long long>(blockIdx.z + 1) * nkb) / Cfg::SPLIT_K);
    const int iters = kb_end - kb_begin;

    // (WARP_P, WARP_Q) as m16n8 C fragments, ACC_SETS independent copies (config.cuh)
    float acc[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4];
#pragma unroll
    for (int a = 0; a < Cfg::ACC_SETS; ++a)
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int q = 0; q < Cfg::Q_TILES; ++q)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[a][i][q][e] = 0.0f;

    StageLoader<Cfg> loader;  // this thread's copies of every stage, planned once
    loader.init(p, n0, m0, tid);
    const uint32_t smem_base = ptx::opaque(ptx::smem_addr(smem));

    // ---- prologue: STAGES - 1 k-blocks in flight
#pragma unroll
    for (int s = 0; s < Cfg::STAGES - 1; ++s) {
        if (s < iters)
            loader.issue(smem_base + s * Cfg::STAGE_BYTES, kb_begin + s, p.k - (kb_begin + s) * Cfg::BLOCK_K);
        ptx::cp_async_commit();
    }

    // ---- main loop: wait for stage it, refill the slot consumed at it - 1, compute stage it
#pragma unroll 1
    for (int it = 0; it < iters; ++it) {
        ptx::cp_async_wait<Cfg::STAGES - 2>();
        __syncthreads();
        const int next = it + Cfg::STAGES - 1;
        if (next < iters)
            loader.issue(smem_base + (next % Cfg::STAGES) * Cfg::STAGE_BYTES, kb_begin + next,
                         p.k - (kb_begin + next) * Cfg::BLOCK_K);
        ptx::cp_async_commit();

        const uint8_t* st = smem + (it % Cfg::STAGES) * Cfg::STAGE_BYTES;
        const uint8_t* w_tile = st;  // (BLOCK_N, BLOCK_K/2) codes
        const uint8_t* w_sf = st + Cfg::OFF_W_SF;
        const uint8_t* a_tile = st + Cfg::OFF_A;  // (BLOCK_M, BLOCK_K/2) codes or (BLOCK_M, BLOCK_K) bf16
        const uint8_t* a_sf = st + Cfg::OFF_A_SF;
        if constexpr (Cfg::SWAP_AB) {
            warp_mma_stage<Cfg>(w_tile, w_sf, a_tile, a_sf, p0, q0, wk, lane, acc);
        } else {
            warp_mma_stage<Cfg>(a_tile, a_sf, w_tile, w_sf, p0, q0, wk, lane, acc);
        }
    }

    // Fold the accumulator sets in fixed order (deterministic).
#pragma unroll
    for (int a = 1; a < Cfg::ACC_SETS; ++a)
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int q = 0; q < Cfg::Q_TILES; ++q)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[0][i][q][e] += acc[a][i][q][e];

    epilogue<Cfg>(p, smem, acc[0], m0, n0, p0, q0, wk, wmn, lane, tid);
}

}  // namespace sm90
}  // namespace fp4tune
