// Data movement of the SM120 family: global -> shared (cp.async, zero-filled beyond the last row)
// and shared -> MMA fragments (ldmatrix for codes, 32-bit loads for scale words). Every index
// formula here is mirrored in tuner/src/template/sm120/fragments.rs and tested there against the
// PTX fragment model; the pure ones (constexpr) are evaluated at compile time against the mirror's
// values over every layout of the space (template/sm120/index_tests.rs), so the two cannot drift.
#pragma once
#include "common/types.cuh"
#include "common/params.cuh"
#include "sm120/config.cuh"
#include "sm120/ptx.cuh"

namespace fp4tune {
namespace sm120 {

// Physical 16-byte chunk of logical chunk `chunk` (32 e2m1 codes) in tile row `row`.
template <class Cfg>
__host__ __device__ __forceinline__ constexpr int swizzle_chunk(int row, int chunk) {
    return chunk ^ ((row >> Cfg::ROWS_PER_LINE_LOG2) & (Cfg::ROW_CHUNKS - 1));
}

// Byte offset of (row, logical chunk) inside a code tile (TILE, ROW_BYTES).
template <class Cfg>
__host__ __device__ __forceinline__ constexpr int code_offset(int row, int chunk) {
    return row * Cfg::ROW_BYTES + swizzle_chunk<Cfg>(row, chunk) * 16;
}

// Copy the codes of k-tile `kt` for rows [row0, row0 + TILE) into a (TILE, ROW_BYTES) tile.
// codes: [rows, K/2] bytes row-major. Rows >= `rows` are zero-filled.
template <class Cfg, int TILE>
__device__ __forceinline__ void load_codes(uint32_t dst, const uint8_t* codes, int rows, int row0,
                                           int k, int kt) {
    constexpr int CHUNKS = TILE * Cfg::ROW_CHUNKS;
    constexpr int ITERS = (CHUNKS + Cfg::THREADS - 1) / Cfg::THREADS;
    const int row_pitch = k / 2;
#pragma unroll
    for (int j = 0; j < ITERS; ++j) {
        const int i = j * Cfg::THREADS + static_cast<int>(threadIdx.x);
        if (CHUNKS % Cfg::THREADS == 0 || i < CHUNKS) {
            const int r = i / Cfg::ROW_CHUNKS;
            const int c = i % Cfg::ROW_CHUNKS;
            const int grow = row0 + r;
            const bool valid = grow < rows;
            const uint8_t* src = codes + static_cast<uint64_t>(valid ? grow : 0) * row_pitch +
                                 kt * Cfg::ROW_BYTES + c * 16;
            cp_async_16(dst + code_offset<Cfg>(r, c), src, valid);
        }
    }
}

// Copy the scale words of k-tile `kt` into a (K_STEPS, TILE) array of u32: word (s, r) holds the
// four UE4M3 scales of row row0 + r for k in [kt * BLOCK_K + 64 s, + 64), one aligned 32-bit word
// of the swizzled 128x4 layout. Rows >= `rows` are zero-filled.
template <class Cfg, int TILE>
__device__ __forceinline__ void load_scales(uint32_t dst, const uint8_t* sf, int rows, int row0,
                                            int ksf_pad, int kt) {
    constexpr int WORDS = Cfg::K_STEPS * TILE;
    constexpr int ITERS = (WORDS + Cfg::THREADS - 1) / Cfg::THREADS;
#pragma unroll
    for (int j = 0; j < ITERS; ++j) {
        const int i = j * Cfg::THREADS + static_cast<int>(threadIdx.x);
        if (WORDS % Cfg::THREADS == 0 || i < WORDS) {
            const int s = i / TILE;
            const int r = i % TILE;
            const int grow = row0 + r;
            const bool valid = grow < rows;
            const uint32_t kb = static_cast<uint32_t>(kt * (Cfg::BLOCK_K / 16) + 4 * s);
            const uint8_t* src =
                sf + swizzled_sf_offset(static_cast<uint32_t>(valid ? grow : 0), kb,
                                        static_cast<uint32_t>(ksf_pad));
            cp_async_4(dst + 4 * i, src, valid);
        }
    }
}

// cp.async of `bytes` (at most CP) of global memory, zero-filling the rest of the CP-byte copy.
// No byte is read when `bytes` is 0 (copies wholly past K or past the tile).
template <int CP>
__device__ __forceinline__ void cp_async_part(uint32_t dst, const void* src, int bytes) {
    static_assert(CP == 8 || CP == 4, "the K-tail form copies 8-byte runs of codes and 4-byte scale words");
    if constexpr (CP == 8) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
    }
}

// cp.async of k-tile kt of TILE rows (tile row r = global row row_of(r), -1: zero-fill) into a
// (TILE, ROW_BYTES) code tile and a (K_STEPS, TILE) array of scale words: the placement of
// load_codes and load_scales (code_offset; word s * TILE + r holds the four scales of the row for
// k in [kt * BLOCK_K + 64 s, + 64), one aligned word of the swizzled layout) with a row map. The
// K-tail form (a K that is a multiple of 16 but not of BLOCK_K: rows of codes only 8-byte
// aligned) copies codes in 8-byte halves (half `h` of a row holds k [kt * BLOCK_K + 16 h, + 16)),
// and each copy of codes or scales reads only its bytes below K while cp.async zero-fills the
// rest (its CPU mirror: `moe::tiled::tail_copy_bytes`): zero codes under zero scales add exact zeros,
// and the swizzled scales' padding columns are never read.
template <class Cfg, int TILE, bool K_TAIL, class RowOf>
__device__ __forceinline__ void load_rows(uint32_t code_dst, uint32_t sf_dst, const uint8_t* codes,
                                          const uint8_t* sf, RowOf row_of, int k, int ksf_pad, int kt) {
    constexpr int CP = K_TAIL ? 8 : 16;                       // bytes per copy of codes
    constexpr int UNITS = Cfg::ROW_CHUNKS * (16 / CP);        // copies of codes per row and k-tile
    constexpr int CHUNKS = TILE * UNITS;
    constexpr int ITERS = (CHUNKS + Cfg::THREADS - 1) / Cfg::THREADS;
    const int k0 = kt * Cfg::BLOCK_K;
#pragma unroll
    for (int j = 0; j < ITERS; ++j) {
        const int i = j * Cfg::THREADS + static_cast<int>(threadIdx.x);
        if (CHUNKS % Cfg::THREADS == 0 || i < CHUNKS) {
            const int r = i / UNITS;
            const int c = i % UNITS;
            const int row = row_of(r);
            const bool valid = row >= 0;
            const uint8_t* src = codes + static_cast<uint64_t>(valid ? row : 0) * (k / 2) + kt * Cfg::ROW_BYTES + c * CP;
            const uint32_t dst = code_dst + code_offset<Cfg>(r, c * CP / 16) + (c * CP) % 16;
            if constexpr (K_TAIL) {
                cp_async_part<8>(dst, src, valid ? min(max((k - k0 - 16 * c) / 2, 0), 8) : 0);
            } else {
                cp_async_16(dst, src, valid);
            }
        }
    }
    constexpr int WORDS = Cfg::K_STEPS * TILE;
    constexpr int WORD_ITERS = (WORDS + Cfg::THREADS - 1) / Cfg::THREADS;
#pragma unroll
    for (int j = 0; j < WORD_ITERS; ++j) {
        const int i = j * Cfg::THREADS + static_cast<int>(threadIdx.x);
        if (WORDS % Cfg::THREADS == 0 || i < WORDS) {
            const int s = i / TILE;
            const int r = i % TILE;
            const int row = row_of(r);
            const bool valid = row >= 0;
            const uint32_t kb = static_cast<uint32_t>(kt * (Cfg::BLOCK_K / 16) + 4 * s);
            const uint8_t* src =
                sf + swizzled_sf_offset(static_cast<uint32_t>(valid ? row : 0), kb, static_cast<uint32_t>(ksf_pad));
            if constexpr (K_TAIL) {
                cp_async_part<4>(sf_dst + 4 * i, src, valid ? min(max((k - k0 - 64 * s) / 16, 0), 4) : 0);
            } else {
                cp_async_4(sf_dst + 4 * i, src, valid);
            }
        }
    }
}

// ldmatrix.x4 row address of lane `lane` for the A fragment (P side) of MMA tile `mp`, k-step `step`:
// matrices (rows 0-7, chunk 2s), (rows 8-15, chunk 2s), (rows 0-7, chunk 2s+1), (rows 8-15, chunk 2s+1)
// land in a0..a3.
template <class Cfg>
__host__ __device__ __forceinline__ constexpr int a_frag_offset(int warp_p0, int mp, int step, int lane) {
    const int row = warp_p0 + mp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int chunk = 2 * step + (lane >> 4);
    return code_offset<Cfg>(row, chunk);
}

// ldmatrix row address for the B fragments (Q side) of MMA tiles mq (lanes 0-15) and mq+1
// (lanes 16-31): matrices (mq, chunk 2s), (mq, chunk 2s+1), (mq+1, 2s), (mq+1, 2s+1) -> b[mq][0..1],
// b[mq+1][0..1]. With .x2 only lanes 0-15 are used.
template <class Cfg>
__host__ __device__ __forceinline__ constexpr int b_frag_offset(int warp_q0, int mq, int step, int lane) {
    const int row = warp_q0 + (mq + (lane >> 4)) * 8 + (lane & 7);
    const int chunk = 2 * step + ((lane >> 3) & 1);
    return code_offset<Cfg>(row, chunk);
}

// Tile row whose SF_A word this lane holds for MMA tile `mp`: even lanes row g, odd lanes row g + 8,
// lanes 2 and 3 of each quad duplicating lanes 0 and 1. The MMA is issued with thread-id-a 0 (lanes
// 0 and 1, the convention CUTLASS uses); the duplicate makes thread-id-a 1 read the same words, so
// the kernel does not depend on the order of lanes 2 and 3, which only the PTX figure documents.
template <class Cfg>
__host__ __device__ __forceinline__ constexpr int sfa_row(int warp_p0, int mp, int lane) {
    return warp_p0 + mp * 16 + (lane >> 2) + (lane & 1) * 8;
}

// Tile row (column of the MMA) whose SF_B word this lane holds for MMA tiles 4*group .. 4*group+3:
// the lane with lane % 4 == j serves tile 4*group + j (thread-id-b j), column g.
template <class Cfg>
__host__ __device__ __forceinline__ constexpr int sfb_row(int warp_q0, int group, int lane) {
    int tile = 4 * group + (lane & 3);
    tile = tile < Cfg::MMA_Q ? tile : Cfg::MMA_Q - 1;
    return warp_q0 + tile * 8 + (lane >> 2);
}

}  // namespace sm120
}  // namespace fp4tune
