// Shared -> registers -> tensor cores: fragments of one stage and the warp's MMAs over it.
// Every fragment register holds two bf16 at MMA positions (2t + 8h, 2t + 8h + 1) of one row; which
// real k they are is the permutation of layout.cuh (k_local), identical for both operands.
#pragma once
#include "common/nvfp4.cuh"
#include "common/ptx.cuh"
#include "sm90/layout.cuh"

namespace fp4tune {
namespace sm90 {

// One row's operand data for one chunk, before the per-word expansion into bf16x2 registers.
// FP4: the lane's CHUNK/8 code bytes (WORDS words) and the prepared scales of its 1 or 2 blocks,
// in the ModelOpt order or (ORDERED, weights of the grouped kernels) the decode order.
// bf16: nothing is cached (the 16 bytes of each word are loaded when the word is expanded).
template <class Cfg, bool FP4, int ROWS, bool ORDERED = false>
struct RowChunk {
    static constexpr int WORDS = Cfg::WORDS;
    uint32_t code[FP4 ? WORDS : 1];
    uint32_t scale[FP4 ? 2 : 1];
    const uint8_t* bf16_row;  // bf16: the row of the stage tile
    int row;

    // tile: stage tile base (codes or bf16); sf: stage scale tile; r: tile row; c: chunk in stage; t: lane % 4.
    __device__ __forceinline__ void load(const uint8_t* tile, const uint8_t* sf, int r, int c, int t) {
        row = r;
        if constexpr (FP4) {
            constexpr int UNITS = Cfg::BLOCK_K / 32;
            const uint8_t* row_base = tile + r * (Cfg::BLOCK_K / 2);
            if constexpr (Cfg::CHUNK == 128) {
                // bytes [64c + 16t, +16): unit 4c + t
                const uint4 v = *reinterpret_cast<const uint4*>(row_base + code_unit_swizzle<UNITS>(r, 4 * c + t) * 16);
                code[0] = v.x;
                code[1] = v.y;
                code[2] = v.z;
                code[3] = v.w;
                // blocks 8c + 2t, 8c + 2t + 1: scale word 2c + t/2, bytes 2(t%2), 2(t%2) + 1
                const uint16_t s2 = *reinterpret_cast<const uint16_t*>(
                    sf + sf_word<ROWS, Cfg::SF_GROUPS>(r, 2 * c + (t >> 1)) * 4 + 2 * (t & 1));
                nvfp4::e4m3x2_prepared(s2, scale[0], scale[1]);
            } else {
                // bytes [32c + 8t, +8): half (t%2) of unit 2c + t/2
                const uint2 v = *reinterpret_cast<const uint2*>(
                    row_base + code_unit_swizzle<UNITS>(r, 2 * c + (t >> 1)) * 16 + (t & 1) * 8);
                code[0] = v.x;
                code[1] = v.y;
                // block 4c + t: scale word c, byte t
                const uint8_t s1 = sf[sf_word<ROWS, Cfg::SF_GROUPS>(r, c) * 4 + t];
                scale[0] = nvfp4::e4m3_prepared(s1);
                scale[1] = scale[0];
            }
        } else {
            bf16_row = tile + r * (Cfg::BLOCK_K * 2);
        }
    }

    // r[s] = (element s, element s + 4) of word w of the lane's run (8 k), as bf16x2.
    __device__ __forceinline__ void word(int w, int c, int t, uint32_t (&r)[4]) const {
        if constexpr (FP4) {
            nvfp4::dequant_weight_word<ORDERED>(code[w], scale[WORDS == 4 ? (w >> 1) : 0], r);
        } else {
            // k_local = CHUNK*c + CHUNK/4*t + 8w: unit CHUNK/8*c + CHUNK/32*t + w
            const int u = (Cfg::CHUNK / 8) * c + (Cfg::CHUNK / 32) * t + w;
            const uint4 v = *reinterpret_cast<const uint4*>(bf16_row + bf16_unit_swizzle(row, u) * 16);
            nvfp4::pair_bf16x8(v.x, v.y, v.z, v.w, r);
        }
    }
};

// The warp's MMAs over one stage. p_tile/q_tile (+ scale tiles) are the stage tiles of the P
// (16-row) and Q (8-wide) operands; p0/q0 the warp's first row in each; wk its K slice.
// acc[a][i][q][e]: accumulator set a (k-step j goes to set j % ACC_SETS), P-tile i, Q-tile q,
// C-fragment element e.
template <class Cfg>
__device__ __forceinline__ void warp_mma_stage(const uint8_t* p_tile, const uint8_t* p_sf, const uint8_t* q_tile,
                                               const uint8_t* q_sf, int p0, int q0, int wk, int lane,
                                               float (&acc)[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4]) {
    const int g = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int cc = 0; cc < Cfg::CHUNKS; ++cc) {
        const int c = wk * Cfg::CHUNKS + cc;  // chunk index within the stage
        // rows g and g + 8 of each m16 tile, row g of each n8 tile; the weights' side (P with
        // swap_ab) reads the order Cfg::W_ORDERED says
        RowChunk<Cfg, Cfg::P_FP4, Cfg::P_ROWS, Cfg::W_ORDERED && Cfg::SWAP_AB> prow[Cfg::P_TILES][2];
        RowChunk<Cfg, Cfg::Q_FP4, Cfg::Q_ROWS, Cfg::W_ORDERED && !Cfg::SWAP_AB> qrow[Cfg::Q_TILES];
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i) {
            prow[i][0].load(p_tile, p_sf, p0 + 16 * i + g, c, t);
            prow[i][1].load(p_tile, p_sf, p0 + 16 * i + 8 + g, c, t);
        }
#pragma unroll
        for (int q = 0; q < Cfg::Q_TILES; ++q) qrow[q].load(q_tile, q_sf, q0 + 8 * q + g, c, t);

#pragma unroll
        for (int w = 0; w < Cfg::WORDS; ++w) {
            uint32_t pr[Cfg::P_TILES][2][4];
            uint32_t qr[Cfg::Q_TILES][4];
#pragma unroll
            for (int i = 0; i < Cfg::P_TILES; ++i) {
                prow[i][0].word(w, c, t, pr[i][0]);
                prow[i][1].word(w, c, t, pr[i][1]);
            }
#pragma unroll
            for (int q = 0; q < Cfg::Q_TILES; ++q) qrow[q].word(w, c, t, qr[q]);
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {  // step j = 2w + jj: lo = r[2jj], hi = r[2jj + 1]
                constexpr int SETS = Cfg::ACC_SETS;
                const int set = (cc * Cfg::WORDS * 2 + 2 * w + jj) % SETS;
#pragma unroll
                for (int i = 0; i < Cfg::P_TILES; ++i) {
                    const uint32_t a[4] = {pr[i][0][2 * jj], pr[i][1][2 * jj], pr[i][0][2 * jj + 1],
                                           pr[i][1][2 * jj + 1]};
#pragma unroll
                    for (int q = 0; q < Cfg::Q_TILES; ++q) {
                        const uint32_t b[2] = {qr[q][2 * jj], qr[q][2 * jj + 1]};
                        ptx::SM80_16x8x16_F32BF16BF16F32_TN::fma(acc[set][i][q], a, b);
                    }
                }
            }
        }
    }
}

}  // namespace sm90
}  // namespace fp4tune
