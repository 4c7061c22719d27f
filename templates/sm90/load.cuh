// Global -> shared copies of one pipeline stage (cp.async, all threads of the CTA cooperate).
// Rows beyond the problem (>= M or >= N) are not copied at all: their shared-memory rows keep stale
// bytes, which only ever reach accumulator rows/columns of outputs >= M or >= N, never stored
// (output (m, n) depends on row m of A and row n of W only). This saves the copy instructions of
// the padding tokens, 7 of 8 rows at M = 1.
#pragma once
#include "common/params.cuh"
#include "common/ptx.cuh"
#include "sm90/layout.cuh"

namespace fp4tune {
namespace sm90 {

// Runs f(i) for i in [tid, COUNT) step THREADS, fully unrolled.
template <int COUNT, int THREADS, class F>
__device__ __forceinline__ void for_each_thread(int tid, F f) {
#pragma unroll
    for (int it = 0; it < (COUNT + THREADS - 1) / THREADS; ++it) {
        const int i = it * THREADS + tid;
        if (COUNT % THREADS == 0 || i < COUNT) f(i);
    }
}

// NVFP4 operand (weights, or W4A4 activations): codes (ROWS, BLOCK_K/2 bytes) and scales
// (ROWS, BLOCK_K/16) of k-block kb, rows row0 .. row0 + ROWS - 1 of a tensor with `rows` rows.
template <class Cfg, int ROWS>
__device__ __forceinline__ void load_fp4_stage(uint8_t* s_codes, uint8_t* s_sf, const uint8_t* g_codes,
                                               const uint8_t* g_sf, int row0, int rows, int k, int kb,
                                               int tid) {
    constexpr int BK = Cfg::BLOCK_K;
    constexpr int UNITS = BK / 32;  // 16-byte units per row
    constexpr int G = Cfg::SF_GROUPS;
    const int row_bytes = k / 2;
    const int ksf_pad = k / 16;  // K % 64 == 0: no scale-column padding
    const uint32_t s_codes_addr = ptx::smem_addr(s_codes);
    const uint32_t s_sf_addr = ptx::smem_addr(s_sf);

    for_each_thread<ROWS * UNITS, Cfg::THREADS>(tid, [&](int i) {
        const int r = i / UNITS;
        const int u = i % UNITS;
        const bool ok = row0 + r < rows;
        const uint8_t* src = g_codes + static_cast<size_t>(row0 + r) * row_bytes + kb * (BK / 2) + u * 16;
        const uint32_t dst = s_codes_addr + r * (BK / 2) + code_unit_swizzle<UNITS>(r, u) * 16;
        if (ok) ptx::cp_async_cg_16(dst, src, 16u);
    });

    if constexpr (ROWS % 128 == 0) {
        // Whole 128x4 blocks: for each 128-row tile the G blocks of this k-block are contiguous.
        constexpr int PER_TILE = G * 32;  // 16-byte units per 128-row tile
        for_each_thread<(ROWS / 128) * PER_TILE, Cfg::THREADS>(tid, [&](int i) {
            const int rt = i / PER_TILE;
            const int rem = i % PER_TILE;
            const bool ok = row0 + rt * 128 < rows;  // tiles past the padded rows do not exist
            const size_t blk = static_cast<size_t>((row0 >> 7) + rt) * (ksf_pad >> 2) + kb * G;
            if (ok) ptx::cp_async_cg_16(s_sf_addr + rt * PER_TILE * 16 + rem * 16, g_sf + blk * 512 + rem * 16, 16u);
        });
    } else {
        for_each_thread<ROWS * G, Cfg::THREADS>(tid, [&](int i) {
            const int g = i / ROWS;
            const int r = i % ROWS;
            const bool ok = row0 + r < rows;
            const uint8_t* src = g_sf + swizzled_sf_offset(row0 + r, 4 * (kb * G + g), ksf_pad);
            if (ok) ptx::cp_async_ca_4(s_sf_addr + sf_word<ROWS, G>(r, g) * 4, src, 4u);
        });
    }
}

// bf16 operand (W4A16 activations): (ROWS, BLOCK_K) bf16 of k-block kb.
template <class Cfg, int ROWS>
__device__ __forceinline__ void load_bf16_stage(uint8_t* s_tile, const uint8_t* g_a, int row0, int rows, int k,
                                                int kb, int tid) {
    constexpr int BK = Cfg::BLOCK_K;
    constexpr int UNITS = BK / 8;
    const uint32_t s_addr = ptx::smem_addr(s_tile);
    for_each_thread<ROWS * UNITS, Cfg::THREADS>(tid, [&](int i) {
        const int r = i / UNITS;
        const int u = i % UNITS;
        const bool ok = row0 + r < rows;
        const uint8_t* src = g_a + (static_cast<size_t>(row0 + r) * k + kb * BK + u * 8) * 2;
        if (ok) ptx::cp_async_cg_16(s_addr + r * (BK * 2) + bf16_unit_swizzle(r, u) * 16, src, 16u);
    });
}

// One stage: W (BLOCK_N rows) and A (BLOCK_M rows) of k-block kb into the stage at `stage`.
template <class Cfg>
__device__ __forceinline__ void load_stage(uint8_t* stage, const GemmParams& p, int n0, int m0, int kb, int tid) {
    load_fp4_stage<Cfg, Cfg::BLOCK_N>(stage, stage + Cfg::OFF_W_SF, p.w, p.w_sf, n0, p.n, p.k, kb, tid);
    if constexpr (Cfg::A_FP4) {
        load_fp4_stage<Cfg, Cfg::BLOCK_M>(stage + Cfg::OFF_A, stage + Cfg::OFF_A_SF, p.a, p.a_sf, m0, p.m, p.k,
                                          kb, tid);
    } else {
        load_bf16_stage<Cfg, Cfg::BLOCK_M>(stage + Cfg::OFF_A, p.a, m0, p.m, p.k, kb, tid);
    }
}

}  // namespace sm90
}  // namespace fp4tune
