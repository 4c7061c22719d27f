// Sm90Config: every derived constant of one SM90 kernel variant, with its limits asserted.
// tuner/src/template/sm90.rs mirrors these formulas (smem_bytes, check) and the instantiation
// asserts that both sides agree on SMEM_BYTES.
#pragma once
#include "common/types.cuh"

namespace fp4tune {
namespace sm90 {

__host__ __device__ constexpr int align128(int x) { return (x + 127) / 128 * 128; }
__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }

template <int BLOCK_M_, int BLOCK_N_, int BLOCK_K_, int WARPS_M_, int WARPS_N_, int WARPS_K_, int STAGES_,
          int SPLIT_K_, bool SWAP_AB_, bool A_FP4_, bool K_TAIL_ = false>
struct Sm90Config {
    // ---- the configuration (tuner vocabulary)
    static constexpr int BLOCK_M = BLOCK_M_;  // tokens per CTA
    static constexpr int BLOCK_N = BLOCK_N_;  // weight rows per CTA
    static constexpr int BLOCK_K = BLOCK_K_;  // K per pipeline stage
    static constexpr int WARPS_M = WARPS_M_;
    static constexpr int WARPS_N = WARPS_N_;
    static constexpr int WARPS_K = WARPS_K_;
    static constexpr int STAGES = STAGES_;
    static constexpr int SPLIT_K = SPLIT_K_;
    static constexpr bool SWAP_AB = SWAP_AB_;
    static constexpr bool A_FP4 = A_FP4_;  // W4A4 (A is NVFP4) or W4A16 (A is bf16)
    // The K-tail form (Pipeline::KTail, names with `kt`): any K that is a multiple of 16 (the NVFP4
    // block) in stages of 64 k, ceil(K / 64) of them, the last one cut at K (sm90/load.cuh).
    static constexpr bool K_TAIL = K_TAIL_;
    // Weight codes in the ModelOpt order (the GEMM's); the tiled grouped configuration reads the
    // decode order (nvfp4.cuh) and says so.
    static constexpr bool W_ORDERED = false;

    static constexpr int WARPS_MN = WARPS_M * WARPS_N;
    static constexpr int WARPS = WARPS_MN * WARPS_K;
    static constexpr int THREADS = 32 * WARPS;

    // ---- MMA roles. P = the m16n8k16's 16-row side (its A operand), Q = its 8-wide side (B).
    // swap_ab: P = weights, Q = tokens, accumulators hold Y^T. Otherwise P = tokens, Q = weights.
    static constexpr int P_ROWS = SWAP_AB ? BLOCK_N : BLOCK_M;
    static constexpr int Q_ROWS = SWAP_AB ? BLOCK_M : BLOCK_N;
    static constexpr int WARPS_P = SWAP_AB ? WARPS_N : WARPS_M;
    static constexpr int WARPS_Q = SWAP_AB ? WARPS_M : WARPS_N;
    static constexpr int WARP_P = P_ROWS / WARPS_P;  // P rows of one warp tile
    static constexpr int WARP_Q = Q_ROWS / WARPS_Q;  // Q rows of one warp tile
    static constexpr int P_TILES = WARP_P / 16;      // m16 tiles per warp
    static constexpr int Q_TILES = WARP_Q / 8;       // n8 tiles per warp
    static constexpr bool P_FP4 = SWAP_AB ? true : A_FP4;
    static constexpr bool Q_FP4 = SWAP_AB ? A_FP4 : true;
    static constexpr int ACC = P_TILES * Q_TILES * 4;  // fp32 accumulators per lane (one set)
    // Independent accumulator sets: consecutive k-steps of small warp tiles go to different sets so
    // that the MMAs do not form one serial dependency chain; summed in fixed order after the loop.
    static constexpr int ACC_SETS = P_TILES * Q_TILES >= 4 ? 1 : (P_TILES * Q_TILES >= 2 ? 2 : 4);

    // ---- K inside a stage. Each warp of the WARPS_K group owns K_PER_WARP consecutive k of every
    // stage, cut into chunks of CHUNK (128, or 64 when the slice is 64 wide). Within a chunk lane
    // t = lane % 4 owns the CHUNK/4 consecutive k starting at t * CHUNK/4 (layout.cuh: k_local).
    static constexpr int K_PER_WARP = BLOCK_K / WARPS_K;
    static constexpr int CHUNK = K_PER_WARP >= 128 ? 128 : 64;
    static constexpr int CHUNKS = K_PER_WARP / CHUNK;  // per warp per stage
    static constexpr int WORDS = CHUNK / 32;           // 32-bit words of codes per lane, row and chunk
    static constexpr int SF_GROUPS = BLOCK_K / 64;     // 32-bit scale words per row per stage

    // ---- shared memory of one stage: (rows, bytes) of each tile, each region 128-byte aligned
    static constexpr int W_CODE_BYTES = align128(BLOCK_N * BLOCK_K / 2);  // (BLOCK_N, BLOCK_K/2)
    static constexpr int W_SF_BYTES = align128(BLOCK_N * BLOCK_K / 16);   // (BLOCK_N, BLOCK_K/16)
    static constexpr int A_BYTES =
        align128(A_FP4 ? BLOCK_M * BLOCK_K / 2 : BLOCK_M * BLOCK_K * 2);  // (BLOCK_M, BLOCK_K/2 or 2*BLOCK_K)
    static constexpr int A_SF_BYTES = A_FP4 ? align128(BLOCK_M * BLOCK_K / 16) : 0;
    static constexpr int OFF_W_SF = W_CODE_BYTES;
    static constexpr int OFF_A = OFF_W_SF + W_SF_BYTES;
    static constexpr int OFF_A_SF = OFF_A + A_BYTES;
    static constexpr int STAGE_BYTES = OFF_A_SF + A_SF_BYTES;
    static constexpr int PIPE_BYTES = STAGES * STAGE_BYTES;
    // In-CTA split-K: warps wk > 0 park their accumulators here after the main loop.
    static constexpr int RED_BYTES = (WARPS_K - 1) * WARPS_MN * 32 * ACC * 4;
    // Split-K over CTAs: SPLIT_K <= 8 reduces through distributed shared memory of a thread-block
    // cluster (1, 1, SPLIT_K): each CTA parks its partial tile here, rank 0 sums them in order.
    // Larger SPLIT_K goes through the global workspace and tile counters.
    static constexpr bool CLUSTER_SPLIT = SPLIT_K > 1 && SPLIT_K <= 8;
    static constexpr int CLUSTER_RED_BYTES = CLUSTER_SPLIT ? WARPS_MN * 32 * ACC * 4 : 0;
    static constexpr int SMEM_BYTES = cmax(cmax(cmax(PIPE_BYTES, RED_BYTES), CLUSTER_RED_BYTES), 16);

    // ---- limits (sm90.rs `check` enforces the same before anything is compiled)
    static_assert(THREADS >= 32 && THREADS <= 1024, "threads per CTA must be 32..1024");
    static_assert(BLOCK_K == 64 || BLOCK_K == 128 || BLOCK_K == 256, "BLOCK_K must be 64, 128 or 256");
    static_assert(BLOCK_K % WARPS_K == 0 && K_PER_WARP % 64 == 0, "BLOCK_K / WARPS_K must be a multiple of 64");
    static_assert(K_PER_WARP % CHUNK == 0, "BLOCK_K / WARPS_K above 128 must be a multiple of 128");
    static_assert(P_ROWS % WARPS_P == 0 && WARP_P % 16 == 0,
                  "the 16-row MMA side (weights if SWAP_AB, else tokens) per warp must be a multiple of 16");
    static_assert(Q_ROWS % WARPS_Q == 0 && WARP_Q % 8 == 0,
                  "the 8-wide MMA side (tokens if SWAP_AB, else weights) per warp must be a multiple of 8");
    static_assert(ACC <= 128, "at most 128 fp32 accumulators per lane (register budget)");
    static_assert(ACC_SETS * ACC <= 128, "accumulator sets over the register budget");
    static_assert(STAGES >= 2 && STAGES <= 8, "STAGES must be 2..8");
    static_assert(SPLIT_K >= 1 && SPLIT_K <= 64, "SPLIT_K must be 1..64");
    static_assert(SMEM_BYTES <= 232448, "dynamic shared memory over the 227 KiB opt-in limit of SM90");
    static_assert(!K_TAIL || (BLOCK_K == 64 && WARPS_K == 1),
                  "the K-tail form has stages of 64 k in one warp: 32 bytes of codes and one scale word per row");
};

}  // namespace sm90
}  // namespace fp4tune
