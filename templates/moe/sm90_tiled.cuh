// The tiled grouped SM90 kernel: prefill-sized grouped projections on the cp.async GEMM pipeline.
//
// When every expert has tens of routed rows or more, the grouped kernel of moe/sm90.cuh decodes
// each weight once per tile of at most 32 rows in every warp that reads it, and the decode's
// integer work dominates. This kernel is the SM90 GEMM of sm90/gemm.cuh with the tokens on the
// MMA's 16-row side (no swap: P = routed rows, Q = weight rows): both operands go through the
// CTA's cp.async stages, and a warp decodes its weight fragments once per stage for all its
// WARP_P routed rows. It runs on the routed-row schedule of moe_align: CTA (x, y) computes n-tile
// x of tile y of its tile list (one tile = up to BLOCK_M rows of one expert, BLOCK_M 16 to 128); CTAs past the tile
// count exit at once, so empty experts cost nothing.
//
// The loads are sm90/load.cuh's (the weight codes' from the grouped layout, moe/code_copy.cuh),
// with two row maps:
// - the activations: stage row r is routed row tl.y + r; gate_up gathers X[sorted_ids[..] / top_k]
//   (rows at or past the tile's count are not copied: their accumulator rows are never stored);
// - the weights: OP_GATE_UP interleaves the CTA's BLOCK_N weight rows as gate / up pairs, stage row
//   2j = gate row (n0 / 2 + j), row 2j + 1 = up row (I + n0 / 2 + j), so accumulator elements
//   (e, e + 1) of a lane (Q columns 2t, 2t + 1) are gate and up of one H column and the epilogue
//   writes H = SiLU(gate) * up from registers. OP_DOWN: stage row r = weight row n0 + r.
//   Scales go word by word (4-byte copies) into the stage layout warp_mma_stage reads
//   (sm90::sf_word), since the interleaved rows do not keep the global 128-row blocks.
//
// W4A16 only (bf16 activations), one K slice per CTA (no split-K: prefill has tiles to spare).
//
// The K-tail form (K_TAIL, names with `kt`) runs any K that is a multiple of 16 (the NVFP4 block):
// stages of 64 k, ceil(K / 64) of them, the last one partial, with the copies of sm90/load.cuh's
// K-tail form (sm90::TailCopyPlan: 8-byte copies of codes, scale words, zero-fill past K).
//
// Launch contract (moe::GroupedConfig with `tiled` in Rust): grid (ceil(N / BLOCK_N), max_tiles,
// 1), THREADS threads, SMEM_BYTES of dynamic shared memory, no cluster.
#pragma once
#include "moe/code_copy.cuh"
#include "moe/epilogue.cuh"
#include "moe/params.cuh"
#include "sm90/config.cuh"
#include "sm90/direct.cuh"
#include "sm90/load.cuh"
#include "sm90/mma.cuh"

namespace fp4tune {
namespace moe {

// The tiled kernel's configuration: the tile, warps and stages of the SM90 GEMM (no swap, bf16
// activations, one K slice, no K warps) and the CTAs per SM it is compiled for.
template <int BLOCK_M_, int BLOCK_N_, int BLOCK_K_, int WARPS_M_, int WARPS_N_, int STAGES_, int MIN_CTAS_,
          bool K_TAIL_>
struct TiledConfig
    : sm90::Sm90Config<BLOCK_M_, BLOCK_N_, BLOCK_K_, WARPS_M_, WARPS_N_, 1, STAGES_, 1, false, false, K_TAIL_> {
    using Gemm = sm90::Sm90Config<BLOCK_M_, BLOCK_N_, BLOCK_K_, WARPS_M_, WARPS_N_, 1, STAGES_, 1, false, false, K_TAIL_>;
    static constexpr int MIN_CTAS = MIN_CTAS_;
    static constexpr bool W_ORDERED = true;  // the layer's weight codes are in the decode order
    static_assert(BLOCK_M_ == 16 || BLOCK_M_ == 32 || BLOCK_M_ == 64 || BLOCK_M_ == 128,
                  "BLOCK_M is one of moe_align's tile lists of at least one m16 tile (16, 32, 64, 128)");
    static_assert(MIN_CTAS >= 1 && MIN_CTAS <= 16 && Gemm::THREADS * MIN_CTAS <= 2048,
                  "MIN_CTAS CTAs of THREADS threads must fit in one SM (2048 threads)");
    static_assert(MIN_CTAS * (Gemm::SMEM_BYTES + 1024) <= 233472,
                  "MIN_CTAS CTAs' cp.async stages over the 228 KiB of an SM");
};

template <class Cfg, int OP>
struct GroupedTiled {
    static_assert(!Cfg::SWAP_AB && !Cfg::A_FP4 && Cfg::WARPS_K == 1 && Cfg::SPLIT_K == 1,
                  "the tiled grouped kernel: routed rows on the 16-row side, bf16 activations, one K slice");
    static constexpr int BK = Cfg::BLOCK_K;
    static constexpr int CODE_BYTES = Cfg::K_TAIL ? 8 : 16;  // bytes per copy of codes
    static constexpr int W_UNITS = BK / 2 / CODE_BYTES;        // copies of codes per weight row and stage
    static constexpr int A_UNITS = BK / 8;                      // 16-byte units of bf16 per activation row and stage
    // A tile's copies of every stage: sm90::CopyPlan, or in the K-tail form the plan that zero-fills
    // past K (UNITS copies per row, UNIT_K k each).
    template <int COUNT, int BYTES, int UNITS, int UNIT_K>
    using Plan = typename sm90::Select<Cfg::K_TAIL, sm90::TailCopyPlan<COUNT, Cfg::THREADS, BYTES, UNITS, UNIT_K>,
                                       sm90::CopyPlan<COUNT, Cfg::THREADS, BYTES>>::type;
    static constexpr int G = Cfg::SF_GROUPS;

    // The weight row behind stage row r of the CTA whose first row is n0 (n0 even), or -1 past N.
    __device__ __forceinline__ static int weight_row(const GroupedParams& p, int n0, int r) {
        if constexpr (OP == OP_GATE_UP) {
            const int half = p.n / 2;
            const int j = (n0 + r) >> 1;
            return j < half ? j + (r & 1) * half : -1;
        } else {
            return n0 + r < p.n ? n0 + r : -1;
        }
    }

    __device__ __forceinline__ static void run(const GroupedParams& p) {
        if constexpr (Cfg::K_TAIL) {
            if (p.k % 16 != 0 || p.k <= 0 || (p.n & 15) != 0 || p.n <= 0) return;
        } else {
            if (p.k % BK != 0 || (p.n & 15) != 0 || p.n <= 0) return;
        }
        if (static_cast<int>(blockIdx.y) >= *p.tile_count) return;
        const int4 tl = reinterpret_cast<const int4*>(p.tiles)[blockIdx.y];
        const int expert = tl.x;
        const int row0 = tl.y;
        const int rows = tl.z;

        extern __shared__ __align__(128) uint8_t smem[];
        const int tid = threadIdx.x;
        const int lane = tid & 31;
        const int warp = tid >> 5;
        const int wm = warp % Cfg::WARPS_M;
        const int wn = warp / Cfg::WARPS_M;
        const int p0 = wm * Cfg::WARP_P;  // the warp's first routed row of the tile
        const int q0 = wn * Cfg::WARP_Q;  // its first stage weight row
        const int n0 = blockIdx.x * Cfg::BLOCK_N;

        const int k = p.k;
        const uint32_t ksf_pad = static_cast<uint32_t>(((k / 16) + 3) / 4 * 4);
        const uint8_t* w = p.w + static_cast<size_t>(expert) * p.n * (k / 2);
        const uint8_t* w_sf = p.w_sf + static_cast<size_t>(expert) * ((p.n + 127) / 128 * 128) * ksf_pad;

        // This thread's copies of every stage, planned once (sm90/load.cuh CopyPlan, or TailCopyPlan;
        // the codes from the grouped layout, moe/code_copy.cuh).
        CodeCopyPlan<Cfg::BLOCK_N * W_UNITS, Cfg::THREADS, CODE_BYTES> w_codes;
        Plan<Cfg::BLOCK_N * G, 4, 1, 64> w_scales;  // K-tail form: G == 1, one word (64 k) per row
        Plan<Cfg::BLOCK_M * A_UNITS, 16, A_UNITS, 8> a_rows;
        w_codes.plan(tid, w, k, [&](int i, int& rho, int& b0, uint32_t& dst) {
            const int r = i / W_UNITS;
            const int u = i % W_UNITS;
            const int row = weight_row(p, n0, r);
            rho = paired_row(OP, p.n, max(row, 0));
            b0 = u * CODE_BYTES;
            if constexpr (Cfg::K_TAIL) {
                dst = r * (BK / 2) + u * CODE_BYTES;  // two 16-byte units per row: no swizzle
            } else {
                dst = r * (BK / 2) + sm90::code_unit_swizzle<W_UNITS>(r, u) * 16;
            }
            return row >= 0;
        });
        w_scales.plan(tid, [&](int i, const uint8_t*& src, uint32_t& dst) {
            const int gw = i / Cfg::BLOCK_N;
            const int r = i % Cfg::BLOCK_N;
            const int row = weight_row(p, n0, r);
            src = w_sf + swizzled_sf_offset(static_cast<uint32_t>(max(row, 0)), 4 * gw, ksf_pad);
            dst = Cfg::OFF_W_SF + sm90::sf_word<Cfg::BLOCK_N, G>(r, gw) * 4;
            return row >= 0;
        });
        a_rows.plan(tid, [&](int i, const uint8_t*& src, uint32_t& dst) {
            const int r = i / A_UNITS;
            const int u = i % A_UNITS;
            const int sorted = row0 + min(r, max(rows, 1) - 1);
            const int source = OP == OP_GATE_UP ? p.sorted_ids[sorted] / p.top_k : sorted;
            src = p.a + (static_cast<size_t>(source) * k + u * 8) * 2;
            dst = Cfg::OFF_A + r * (BK * 2) + sm90::bf16_unit_swizzle(r, u) * 16;
            return r < rows;
        });
        const uint32_t smem_base = ptx::opaque(ptx::smem_addr(smem));
        const auto issue = [&](int s, int kb) {
            const uint32_t stage = smem_base + s * Cfg::STAGE_BYTES;
            const int k_left = k - kb * BK;  // k left before K (the K-tail form cuts the stage there)
            w_codes.issue(stage, kb * (BK / 2));
            w_scales.issue(stage, static_cast<size_t>(kb) * G * 512, k_left);  // k-block kb = 4G scale columns
            a_rows.issue(stage, static_cast<size_t>(kb) * BK * 2, k_left);
        };

        float acc[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4];
        sm90::zero_accumulators<Cfg>(acc);

        // The pipeline of sm90/gemm.cuh: STAGES - 1 k-blocks in flight; wait for stage it,
        // refill the slot consumed at it - 1, compute stage it.
        const int iters = Cfg::K_TAIL ? (k + BK - 1) / BK : k / BK;
#pragma unroll
        for (int s = 0; s < Cfg::STAGES - 1; ++s) {
            if (s < iters) issue(s, s);
            ptx::cp_async_commit();
        }
#pragma unroll 1
        for (int it = 0; it < iters; ++it) {
            ptx::cp_async_wait<Cfg::STAGES - 2>();
            __syncthreads();
            const int next = it + Cfg::STAGES - 1;
            if (next < iters) issue(next % Cfg::STAGES, next);
            ptx::cp_async_commit();
            const uint8_t* st = smem + (it % Cfg::STAGES) * Cfg::STAGE_BYTES;
            sm90::warp_mma_stage<Cfg>(st + Cfg::OFF_A, nullptr, st, st + Cfg::OFF_W_SF, p0, q0, 0, lane, acc);
        }
        ptx::cp_async_wait<0>();
        sm90::fold_accumulators<Cfg>(acc);

        epilogue(p, acc[0], expert, row0, rows, n0 + q0, p0, lane);
    }

    // C fragment element e of (m16 tile i, n8 tile q): routed row p0 + 16 i + g + 8 (e / 2), stage
    // weight row q0 + 8 q + 2 t + e % 2. gate_up: elements (e, e + 1), e even, are gate and up of H
    // column (qn0 + 8 q + 2 t) / 2 (qn0 = n0 + q0, even); down: output columns qn0 + 8 q + 2 t + (0, 1).
    __device__ __forceinline__ static void epilogue(const GroupedParams& p,
                                                    const float (&acc)[Cfg::P_TILES][Cfg::Q_TILES][4], int expert,
                                                    int row0, int rows, int qn0, int p0, int lane) {
        const int g = lane >> 2;
        const int t = lane & 3;
        const float out_scale = p.alpha[expert] * __uint_as_float(static_cast<uint32_t>(127 - nvfp4::OPERAND_LOG2) << 23);
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = p0 + 16 * i + 8 * h + g;
                if (m >= rows) continue;
                const size_t r = static_cast<size_t>(row0 + m);
#pragma unroll
                for (int q = 0; q < Cfg::Q_TILES; ++q) {
                    const float v0 = acc[i][q][2 * h] * out_scale;
                    const float v1 = acc[i][q][2 * h + 1] * out_scale;
                    const int c = qn0 + 8 * q + 2 * t;
                    if constexpr (OP == OP_GATE_UP) {
                        const int half = p.n / 2;
                        if (c / 2 < half) p.y[r * half + c / 2] = float_to_bf16_bits(silu(v0) * v1);
                    } else if (c + 1 < p.n) {
                        const uint32_t pair = static_cast<uint32_t>(float_to_bf16_bits(v0)) |
                                              (static_cast<uint32_t>(float_to_bf16_bits(v1)) << 16);
                        *reinterpret_cast<uint32_t*>(p.y + r * p.n + c) = pair;
                    }
                }
            }
    }
};

}  // namespace moe
}  // namespace fp4tune
