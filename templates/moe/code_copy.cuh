// The tiled and wgmma kernels' copies of weight codes from the grouped layout (moe/layout.cuh)
// into their cp.async stages.
#pragma once
#include "common/ptx.cuh"
#include "moe/layout.cuh"
#include "sm90/load.cuh"

namespace fp4tune {
namespace moe {

// A tile's copies of weight codes from the grouped layout into cp.async stages (the tiled and
// wgmma kernels): COUNT copies of BYTES bytes (16, or 8 in the K-tail form) per stage, copy i
// filling `dst` from bytes [stage byte + b0, + BYTES) of one paired row.
//
// A stage lies wholly in the rows' whole blocks or wholly in their tail (stages of 64 k never
// cross a 128-k block; the kernels take stages of 128 and 256 k only for a K that 128 divides).
// In the blocks, byte b of a row sits at blocks(b) = (b / 64) * 1024 + b % 64 past its first
// byte, and blocks(stage byte + b0) = blocks(stage byte) + blocks(b0) (b0 < 64 - stage byte % 64,
// or both multiples of 64): each copy's address is its own pointer plus one offset per stage,
// as in sm90::CopyPlan. In the tail (the last (K/2) % 64 bytes of each row, rows one after
// another) it is the copy's pointer plus its own distance to the tail plus the stage's bytes past
// the blocks. Bytes at or past the row's end (K-tail form) are zero-filled.
template <int COUNT, int THREADS, int BYTES>
struct CodeCopyPlan {
    static_assert(BYTES == 16 || BYTES == 8, "cp.async copies of codes are 16 or 8 bytes");
    static constexpr int IT = (COUNT + THREADS - 1) / THREADS;
    const uint8_t* src[IT];  // the copy's bytes in stage 0
    int tail[IT];            // from src to its row's tail, less the tail's first byte (full)
    uint32_t dst[IT];
    int b0[BYTES == 8 ? IT : 1];  // K-tail form: the copy's first byte in the stage
    bool ok[IT];
    int full;       // bytes of each row in whole blocks
    int row_bytes;  // K / 2

    __device__ __forceinline__ static int blocks(int b) { return ((b >> 6) << 10) + (b & 63); }

    // f(i, rho, b0, dst) -> bool: copy i reads paired row rho from byte b0 of each stage into
    // dst; returns whether the row exists.
    template <class F>
    __device__ __forceinline__ void plan(int tid, const uint8_t* expert_codes, int k, F f) {
        row_bytes = k / 2;
        full = row_bytes & ~(CODE_BLOCK_ROW_BYTES - 1);
#pragma unroll
        for (int it = 0; it < IT; ++it) {
            const int i = it * THREADS + tid;
            int rho = 0, first = 0;
            ok[it] = (COUNT % THREADS == 0 || i < COUNT) && f(i < COUNT ? i : 0, rho, first, dst[it]);
            rho = ok[it] ? rho : 0;
            const int r16 = rho & 15;
            src[it] = expert_codes + code_group(rho, row_bytes) + r16 * CODE_BLOCK_ROW_BYTES + blocks(first);
            tail[it] = full * CODE_GROUP_ROWS + r16 * (row_bytes - full) + first -
                       (r16 * CODE_BLOCK_ROW_BYTES + blocks(first));
            if constexpr (BYTES == 8) b0[it] = first;
        }
    }

    // The copies of the stage whose first byte of each row is stage_byte; live false: every copy
    // has size 0 (the wgmma kernel copies past its last stage instead of branching around them).
    __device__ __forceinline__ void issue(uint32_t stage_addr, int stage_byte, bool live = true) const {
        const bool in_blocks = stage_byte < full;
        const int step = in_blocks ? blocks(stage_byte) : stage_byte - full;
#pragma unroll
        for (int it = 0; it < IT; ++it) {
            if (!ok[it]) continue;
            const uint8_t* s = src[it] + step + (in_blocks ? 0 : tail[it]);
            if constexpr (BYTES == 16) {
                ptx::cp_async_cg_16(stage_addr + dst[it], s, live ? 16u : 0u);
            } else {
                const bool in = live && stage_byte + b0[it] < row_bytes;
                sm90::cp_async_ca_8(stage_addr + dst[it], in ? s : src[it], in ? 8u : 0u);
            }
        }
    }
};

}  // namespace moe
}  // namespace fp4tune
