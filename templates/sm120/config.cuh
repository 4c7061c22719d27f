// SM120 kernel configuration: every tile size, warp layout and shared-memory offset of one variant,
// derived from the template parameters and guarded by messaged static_asserts. The Rust mirror is
// tuner/src/template/sm120/mod.rs (smem_bytes, check) and its instantiation asserts SMEM_BYTES agrees.
#pragma once
#include "common/types.cuh"
#include "common/params.cuh"

namespace fp4tune {
namespace sm120 {

// Naming: P is the operand on the MMA's 16-row side, Q the operand on its 8-column side.
//   swap_ab == false: P = A (tokens, BLOCK_M rows), Q = W (weights, BLOCK_N rows)
//   swap_ab == true:  P = W (weights, BLOCK_N rows), Q = A (tokens, BLOCK_M rows)
// Both operands share one storage format (codes [rows, K/2], swizzled UE4M3 scales), so a single
// mainloop serves both; only the pointers and the epilogue's (p, q) -> (m, n) mapping differ.
template <int BLOCK_M_, int BLOCK_N_, int BLOCK_K_, int WARPS_M_, int WARPS_N_, int WARPS_K_,
          int STAGES_, int SPLIT_K_, bool SWAP_AB_>
struct Config {
    static constexpr int BLOCK_M = BLOCK_M_;
    static constexpr int BLOCK_N = BLOCK_N_;
    static constexpr int BLOCK_K = BLOCK_K_;
    static constexpr int WARPS_M = WARPS_M_;
    static constexpr int WARPS_N = WARPS_N_;
    static constexpr int WARPS_K = WARPS_K_;
    static constexpr int STAGES = STAGES_;
    static constexpr int SPLIT_K = SPLIT_K_;
    static constexpr bool SWAP_AB = SWAP_AB_;

    static constexpr int TILE_P = SWAP_AB ? BLOCK_N : BLOCK_M;
    static constexpr int TILE_Q = SWAP_AB ? BLOCK_M : BLOCK_N;
    static constexpr int WARPS_P = SWAP_AB ? WARPS_N : WARPS_M;
    static constexpr int WARPS_Q = SWAP_AB ? WARPS_M : WARPS_N;
    static constexpr int WARPS = WARPS_M * WARPS_N * WARPS_K;
    static constexpr int THREADS = 32 * WARPS;

    // Warp tile (WARP_P, WARP_Q) and its m16n8 MMA tiles.
    static constexpr int WARP_P = TILE_P / WARPS_P;
    static constexpr int WARP_Q = TILE_Q / WARPS_Q;
    static constexpr int MMA_P = WARP_P / 16;
    static constexpr int MMA_Q = WARP_Q / 8;
    // 64-wide MMA k-steps per stage, and per k-warp (in-CTA split of K).
    static constexpr int K_STEPS = BLOCK_K / 64;
    static constexpr int K_STEPS_PER_WARP = K_STEPS / WARPS_K;

    // Shared-memory code tiles: (rows, BLOCK_K/2 bytes), 16-byte chunks XOR-swizzled per row so that
    // the eight row addresses of one ldmatrix 8x16B matrix hit eight distinct bank groups.
    static constexpr int ROW_BYTES = BLOCK_K / 2;
    static constexpr int ROW_CHUNKS = ROW_BYTES / 16;
    static constexpr int ROWS_PER_LINE_LOG2 = ROW_CHUNKS == 2 ? 2 : (ROW_CHUNKS == 4 ? 1 : 0);

    // One stage: [P codes (TILE_P, ROW_BYTES)] [Q codes (TILE_Q, ROW_BYTES)]
    //            [P scales (K_STEPS, TILE_P) u32] [Q scales (K_STEPS, TILE_Q) u32]
    static constexpr int P_CODE_BYTES = TILE_P * ROW_BYTES;
    static constexpr int Q_CODE_BYTES = TILE_Q * ROW_BYTES;
    static constexpr int P_SF_BYTES = K_STEPS * TILE_P * 4;
    static constexpr int Q_SF_BYTES = K_STEPS * TILE_Q * 4;
    static constexpr int Q_CODE_OFFSET = P_CODE_BYTES;
    static constexpr int P_SF_OFFSET = Q_CODE_OFFSET + Q_CODE_BYTES;
    static constexpr int Q_SF_OFFSET = P_SF_OFFSET + P_SF_BYTES;
    static constexpr int STAGE_BYTES = Q_SF_OFFSET + Q_SF_BYTES;
    static constexpr int PIPE_BYTES = STAGES * STAGE_BYTES;
    // In-CTA split-K reduction buffer (reuses the pipeline after the mainloop).
    static constexpr int RED_BYTES = (WARPS_K - 1) * TILE_P * TILE_Q * 4;
    // One word for the split-K "last CTA" broadcast, after everything else.
    static constexpr int FLAG_OFFSET = PIPE_BYTES > RED_BYTES ? PIPE_BYTES : RED_BYTES;
    static constexpr int SMEM_BYTES = FLAG_OFFSET + 16;
    static constexpr int SMEM_LIMIT = 101376;

    static_assert(BLOCK_K == 64 || BLOCK_K == 128 || BLOCK_K == 256, "BLOCK_K must be 64, 128 or 256");
    static_assert(WARPS_M >= 1 && WARPS_N >= 1 && WARPS_K >= 1, "warp counts must be positive");
    static_assert(THREADS <= 1024, "more than 1024 threads per CTA");
    static_assert(K_STEPS % WARPS_K == 0, "BLOCK_K / 64 must be a multiple of WARPS_K");
    static_assert(TILE_P % (16 * WARPS_P) == 0, "the 16-row side tile must give each warp a multiple of 16 rows");
    static_assert(TILE_Q % (8 * WARPS_Q) == 0, "the 8-column side tile must give each warp a multiple of 8 columns");
    static_assert(TILE_P <= 128 && (128 % TILE_P) == 0, "TILE_P must divide 128 (scale rows are padded to 128)");
    static_assert(TILE_Q <= 128 && (128 % TILE_Q) == 0, "TILE_Q must divide 128 (scale rows are padded to 128)");
    static_assert(MMA_P * MMA_Q <= 32, "more than 32 MMA tiles per warp: accumulators would spill");
    static_assert(STAGES >= 2, "the cp.async pipeline needs at least 2 stages");
    static_assert(SPLIT_K >= 1, "SPLIT_K must be at least 1");
    static_assert(STAGE_BYTES % 16 == 0, "stage size must keep 16-byte alignment");
    static_assert(SMEM_BYTES <= SMEM_LIMIT, "shared memory exceeds the 101,376 bytes an SM120 block may use");
};

}  // namespace sm120
}  // namespace fp4tune
