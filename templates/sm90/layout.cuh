// Index maps of the SM90 family: the K permutation of the MMA fragments and the shared-memory
// layouts (XOR swizzles) of each tile. tuner/src/template/sm90.rs mirrors every function here
// (k_local, code_unit_swizzle, bf16_unit_swizzle, sf_word) and tests bijectivity and bank conflicts.
#pragma once
#include "common/types.cuh"

namespace fp4tune {
namespace sm90 {

// ---- K permutation ------------------------------------------------------------------------
// A GEMM sums over k, so any fixed permutation of k applied to BOTH MMA operands is exact.
// m16n8k16 fragment positions (the 16 k of one MMA): lane t = lane % 4 holds positions
// {2t, 2t+1} (the "lo" register) and {2t+8, 2t+9} (the "hi" register), in the A and B fragment alike.
// Within a chunk of CH (128 or 64) k, step j (0 .. CH/16 - 1) maps position p to
//     k_local(CH, j, p) = (p%8/2) * CH/4 + 8 * (j/2) + 2 * (j%2) + p/8 + 4 * (p%2).
// So lane t only ever touches the CH/4 consecutive k at t*CH/4: one 16-byte (CH = 128) or 8-byte
// (CH = 64) run of packed codes per row, and whole 16-byte runs of bf16. Word w (8 k) of that run
// serves steps 2w and 2w+1; with r[s] = (element s, element s+4) of the word (nvfp4::dequant_word,
// nvfp4::pair_bf16x8), step 2w + jj uses lo = r[2jj] and hi = r[2jj+1].
__host__ __device__ constexpr int k_local(int ch, int j, int p) {
    return ((p % 8) / 2) * (ch / 4) + 8 * (j / 2) + 2 * (j % 2) + p / 8 + 4 * (p % 2);
}

// ---- packed-code tiles: (rows, BLOCK_K/2 bytes), UNITS = BLOCK_K/32 16-byte units per row -------
// Physical 16-byte unit of logical unit u of row r. The XOR keeps every fragment load of a warp
// (8 rows x 16 bytes, or 4 rows x 2 x 8 bytes) free of bank conflicts for every chunk.
template <int UNITS>
__device__ __forceinline__ int code_unit_swizzle(int r, int u) {
    if constexpr (UNITS == 8) {
        return u ^ (((r & 1) << 2) | (((r >> 1) & 1) << 1));
    } else if constexpr (UNITS == 4) {
        return u ^ (((r >> 1) & 1) << 1);
    } else {
        return u;
    }
}

// ---- bf16 tiles: (rows, 2*BLOCK_K bytes), BLOCK_K/8 16-byte units per row ------------------------
// Lane (g, t) reads unit CH/8*c + CH/32*t + w of rows g and g + 1 of a row pair: without the XOR
// the four t and both rows would collide on the same 4 banks.
__device__ __forceinline__ int bf16_unit_swizzle(int r, int u) {
    return u ^ ((((u >> 3) & 1) << 1) | (r & 1));
}

// ---- scale tiles: SF_GROUPS 32-bit words (4 UE4M3 = 64 k) per row ------------------------------
// ROWS % 128 == 0: the stage keeps the global 128x4 swizzled blocks verbatim (16-byte copies);
// otherwise word (r, g) sits at g * ROWS + r (4-byte copies).
template <int ROWS, int SF_GROUPS>
__device__ __forceinline__ int sf_word(int r, int g) {
    if constexpr (ROWS % 128 == 0) {
        return ((r >> 7) * SF_GROUPS + g) * 128 + (r & 31) * 4 + ((r >> 5) & 3);
    } else {
        return g * ROWS + r;
    }
}

}  // namespace sm90
}  // namespace fp4tune
