// SM120 NVFP4 GEMM (W4A4): Y[M, N] = alpha * deq(A)[M, K] * deq(W)[N, K]^T on the native block-scaled
// mma.sync m16n8k64 (umbrella header: include this one). Multi-stage cp.async pipeline, optional
// swap-AB (weights on the MMA's 16-row side for small M), in-CTA split over k-warps and deterministic
// split-K across CTAs (grid.z).
#pragma once
#include "common/types.cuh"
#include "common/params.cuh"
#include "sm120/config.cuh"
#include "sm120/ptx.cuh"
#include "sm120/mma.cuh"
#include "sm120/load.cuh"
#include "sm120/epilogue.cuh"

namespace fp4tune {
namespace sm120 {

using Mma = SM120_16x8x64_F32E2M1E2M1F32_UE4M3_4X;

// Selectors must be immediates: the switch folds away once the caller's loops are unrolled.
// thread-id-a is always 0 here (see sfa_row); thread-id-b j picks the SF_B word of MMA tile
// 4 * group + j from lane % 4 == j, so one 32-bit load serves four n8 tiles.
__device__ __forceinline__ void mma_sel(int tid_a, int tid_b, float (&d)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2], uint32_t sfa, uint32_t sfb) {
    switch (tid_a * 4 + tid_b) {
        case 0: Mma::fma<0, 0>(d, a, b, sfa, sfb); break;
        case 1: Mma::fma<0, 1>(d, a, b, sfa, sfb); break;
        case 2: Mma::fma<0, 2>(d, a, b, sfa, sfb); break;
        case 3: Mma::fma<0, 3>(d, a, b, sfa, sfb); break;
        case 4: Mma::fma<1, 0>(d, a, b, sfa, sfb); break;
        case 5: Mma::fma<1, 1>(d, a, b, sfa, sfb); break;
        case 6: Mma::fma<1, 2>(d, a, b, sfa, sfb); break;
        default: Mma::fma<1, 3>(d, a, b, sfa, sfb); break;
    }
}

// One k-tile (one stage) of MMAs for this warp: K_STEPS_PER_WARP steps of 64, each loading
// MMA_P A fragments (16 x 64), MMA_Q B fragments (64 x 8) and the scale words, then issuing
// MMA_P x MMA_Q block-scaled MMAs.
template <class Cfg>
__device__ __forceinline__ void compute_stage(float (&acc)[Cfg::MMA_P][Cfg::MMA_Q][4], uint32_t stage,
                                              int warp_p0, int warp_q0, int wk, int lane) {
    constexpr int SFB_WORDS = (Cfg::MMA_Q + 3) / 4;
#pragma unroll
    for (int i = 0; i < Cfg::K_STEPS_PER_WARP; ++i) {
        const int step = wk * Cfg::K_STEPS_PER_WARP + i;
        uint32_t a[Cfg::MMA_P][4];
        uint32_t b[Cfg::MMA_Q][2];
        uint32_t sfa[Cfg::MMA_P];
        uint32_t sfb[SFB_WORDS];
#pragma unroll
        for (int mp = 0; mp < Cfg::MMA_P; ++mp)
            ldmatrix_x4(a[mp], stage + a_frag_offset<Cfg>(warp_p0, mp, step, lane));
#pragma unroll
        for (int mq = 0; mq < Cfg::MMA_Q; mq += 2) {
            const uint32_t addr = stage + Cfg::Q_CODE_OFFSET + b_frag_offset<Cfg>(warp_q0, mq, step, lane);
            if (mq + 1 < Cfg::MMA_Q) {
                uint32_t r[4];
                ldmatrix_x4(r, addr);
                b[mq][0] = r[0];
                b[mq][1] = r[1];
                b[mq + 1][0] = r[2];
                b[mq + 1][1] = r[3];
            } else {
                ldmatrix_x2(b[mq], addr);
            }
        }
#pragma unroll
        for (int mp = 0; mp < Cfg::MMA_P; ++mp)
            sfa[mp] = lds_u32(stage + Cfg::P_SF_OFFSET + 4 * (step * Cfg::TILE_P + sfa_row<Cfg>(warp_p0, mp, lane)));
#pragma unroll
        for (int w = 0; w < SFB_WORDS; ++w)
            sfb[w] = lds_u32(stage + Cfg::Q_SF_OFFSET + 4 * (step * Cfg::TILE_Q + sfb_row<Cfg>(warp_q0, w, lane)));
#pragma unroll
        for (int mp = 0; mp < Cfg::MMA_P; ++mp)
#pragma unroll
            for (int mq = 0; mq < Cfg::MMA_Q; ++mq)
                mma_sel(0, mq & 3, acc[mp][mq], a[mp], b[mq], sfa[mp], sfb[mq >> 2]);
    }
}

// Grid (ceil(N / BLOCK_N), ceil(M / BLOCK_M), SPLIT_K), THREADS threads, SMEM_BYTES dynamic shared memory.
// Preconditions (checked by the host, GemmConfig::check_problem): K % BLOCK_K == 0,
// K / BLOCK_K >= SPLIT_K, scale buffers padded to 128 rows; with SPLIT_K > 1 a workspace of
// SPLIT_K * M * N floats and zeroed counters, one per (N tile, M tile). The K-tail form
// (K_TAIL, Pipeline::KTail, names with `kt`): K % 16 == 0, ceil(K / BLOCK_K) k-tiles, the last one
// cut at K by load_rows' K-tail copies (a kernel that sees K otherwise writes nothing).
template <class Cfg, bool K_TAIL = false>
__device__ __forceinline__ void gemm(const GemmParams& p) {
    if constexpr (K_TAIL) {
        if (p.k % 16 != 0 || p.k <= 0) return;
    }
    extern __shared__ __align__(128) uint8_t smem[];
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int wq = warp % Cfg::WARPS_Q;
    const int wp = (warp / Cfg::WARPS_Q) % Cfg::WARPS_P;
    const int wk = warp / (Cfg::WARPS_Q * Cfg::WARPS_P);
    const int warp_p0 = wp * Cfg::WARP_P;  // warp tile (WARP_P, WARP_Q) inside the CTA tile
    const int warp_q0 = wq * Cfg::WARP_Q;

    const int tile_m0 = static_cast<int>(blockIdx.y) * Cfg::BLOCK_M;
    const int tile_n0 = static_cast<int>(blockIdx.x) * Cfg::BLOCK_N;
    // P operand: (TILE_P, K) codes + scales; Q operand: (TILE_Q, K).
    const uint8_t* p_codes = Cfg::SWAP_AB ? p.w : p.a;
    const uint8_t* p_sf = Cfg::SWAP_AB ? p.w_sf : p.a_sf;
    const uint8_t* q_codes = Cfg::SWAP_AB ? p.a : p.w;
    const uint8_t* q_sf = Cfg::SWAP_AB ? p.a_sf : p.w_sf;
    const int p_rows = Cfg::SWAP_AB ? p.n : p.m;
    const int q_rows = Cfg::SWAP_AB ? p.m : p.n;
    const int tile_p0 = Cfg::SWAP_AB ? tile_n0 : tile_m0;
    const int tile_q0 = Cfg::SWAP_AB ? tile_m0 : tile_n0;
    const int ksf_pad = ((p.k / 16 + 3) / 4) * 4;

    const int k_tiles = K_TAIL ? (p.k + Cfg::BLOCK_K - 1) / Cfg::BLOCK_K : p.k / Cfg::BLOCK_K;
    const int kt_begin = static_cast<int>(blockIdx.z) * k_tiles / Cfg::SPLIT_K;
    const int kt_end = (static_cast<int>(blockIdx.z) + 1) * k_tiles / Cfg::SPLIT_K;
    const int n_tiles = kt_end - kt_begin;
    const uint32_t smem0 = smem_addr(smem);

    auto load_stage = [&](int slot, int kt) {
        const uint32_t st = smem0 + slot * Cfg::STAGE_BYTES;
        if constexpr (K_TAIL) {
            const auto p_row = [p_rows, tile_p0](int r) { return tile_p0 + r < p_rows ? tile_p0 + r : -1; };
            const auto q_row = [q_rows, tile_q0](int r) { return tile_q0 + r < q_rows ? tile_q0 + r : -1; };
            load_rows<Cfg, Cfg::TILE_P, true>(st, st + Cfg::P_SF_OFFSET, p_codes, p_sf, p_row, p.k, ksf_pad, kt);
            load_rows<Cfg, Cfg::TILE_Q, true>(st + Cfg::Q_CODE_OFFSET, st + Cfg::Q_SF_OFFSET, q_codes, q_sf, q_row, p.k,
                                              ksf_pad, kt);
        } else {
            load_codes<Cfg, Cfg::TILE_P>(st, p_codes, p_rows, tile_p0, p.k, kt);
            load_codes<Cfg, Cfg::TILE_Q>(st + Cfg::Q_CODE_OFFSET, q_codes, q_rows, tile_q0, p.k, kt);
            load_scales<Cfg, Cfg::TILE_P>(st + Cfg::P_SF_OFFSET, p_sf, p_rows, tile_p0, ksf_pad, kt);
            load_scales<Cfg, Cfg::TILE_Q>(st + Cfg::Q_SF_OFFSET, q_sf, q_rows, tile_q0, ksf_pad, kt);
        }
    };

    float acc[Cfg::MMA_P][Cfg::MMA_Q][4];
#pragma unroll
    for (int mp = 0; mp < Cfg::MMA_P; ++mp)
#pragma unroll
        for (int mq = 0; mq < Cfg::MMA_Q; ++mq)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mp][mq][i] = 0.0f;

#pragma unroll
    for (int s = 0; s < Cfg::STAGES - 1; ++s) {
        if (s < n_tiles) load_stage(s, kt_begin + s);
        cp_async_commit();
    }
    // Slots rotate instead of `% STAGES` (cheaper for non-power-of-two depths).
    int read_slot = 0;
    int write_slot = Cfg::STAGES - 1;
#pragma unroll 1
    for (int it = 0; it < n_tiles; ++it) {
        cp_async_wait<Cfg::STAGES - 2>();
        __syncthreads();  // tile `it` landed for everyone; the slot of tile it - 1 is free again
        if (it + Cfg::STAGES - 1 < n_tiles) load_stage(write_slot, kt_begin + it + Cfg::STAGES - 1);
        cp_async_commit();
        compute_stage<Cfg>(acc, smem0 + read_slot * Cfg::STAGE_BYTES, warp_p0, warp_q0, wk, lane);
        read_slot = read_slot == Cfg::STAGES - 1 ? 0 : read_slot + 1;
        write_slot = write_slot == Cfg::STAGES - 1 ? 0 : write_slot + 1;
    }
    cp_async_wait<0>();
    __syncthreads();

    Epilogue<Cfg>::reduce_k_warps(acc, smem, wp * Cfg::WARPS_Q + wq, wk, lane);
    Epilogue<Cfg>::store(p, acc, smem, wk == 0, tile_p0, tile_q0, warp_p0, warp_q0, lane);
}

}  // namespace sm120
}  // namespace fp4tune
