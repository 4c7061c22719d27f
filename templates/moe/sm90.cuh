// The grouped SM90 kernel: one launch streams the weights of every active expert of one projection.
//
// The kernel is the register-streamed kernel of sm90/direct.cuh with its activations in the
// register ring (Pipeline::Global: every lane loads its own 32-k runs of its token rows, so a
// gather costs nothing extra), placed on the routed-row schedule of moe_align: CTA (x, y, z) takes
// n-tile x of tiles y, y + gridDim.y, ... of its tile list (one tile = up to BLOCK_M rows of one
// expert) and K slice z (split-K over a (1, 1, SPLIT_K) cluster, summed in slot order by rank 0).
// gridDim.y below the tile count is a persistent walk of the schedule; at or above it, one tile
// per CTA (CTAs past the count exit at once). Empty experts have no tile, so they cost nothing.
//
// OP_GATE_UP: the CTA's BLOCK_N weight rows are BLOCK_N / 2 gate rows and the matching up rows,
// interleaved by MMA row half: in m16 tile i of a warp, rows g (h = 0) are gate rows j and rows
// g + 8 (h = 1) up rows I + j of the same output column j = (n0 + p0 + 16 i) / 2 + g. So accumulator
// elements e and e + 2 of a lane are gate and up of one (row, column): the epilogue writes
// H = SiLU(gate) * up straight from registers.
// OP_DOWN: plain rows (n = n0 + p0 + 16 i + 8 h + g), output Y_rows in sorted order.
//
// Launch contract (moe::GroupedConfig in Rust): grid (ceil(N / BLOCK_N), grid_y, SPLIT_K), THREADS
// threads, SMEM_BYTES of dynamic shared memory, cluster (1, 1, SPLIT_K) when SPLIT_K > 1.
#pragma once
#include "moe/epilogue.cuh"
#include "moe/params.cuh"
#include "sm90/direct.cuh"

namespace fp4tune {
namespace moe {

template <class Cfg, int OP>
struct Grouped {
    static_assert(Cfg::A_GLOBAL, "the grouped kernel keeps its activations in the register ring");
    static_assert(Cfg::SPLIT_K <= 8, "grouped split-K reduces through a cluster (SPLIT_K <= 8)");
    static_assert(OP != OP_GATE_UP || Cfg::BLOCK_N % 16 == 0, "gate_up tiles hold whole gate/up row pairs");
    // W4A4 gate_up also writes H as NVFP4 (the down projection's W4A4 input).
    static constexpr bool QUANT_H = OP == OP_GATE_UP && Cfg::A_FP4;
    static_assert(!QUANT_H || Cfg::P_TILES % 2 == 0, "W4A4 gate_up quantizes 16-column blocks of H: 32 weight rows per warp");
    static constexpr int ACC = Cfg::ACC;

    // The lane's pointers of one tile at k = 0: its weight rows (clamped as in gemm_direct) and its
    // activation rows (src[q]: the A row of token column 8q + g, clamped to the tile's last row).
    struct TilePointers {
        const uint8_t* code_row[Cfg::P_TILES][2];
        const uint8_t* sf_row[Cfg::P_TILES][2];
        const uint8_t* a_row[Cfg::Q_TILES];
        const uint8_t* a_sf_row[Cfg::Q_TILES];

        __device__ __forceinline__ void point(const GroupedParams& p, int expert, const int (&src)[Cfg::Q_TILES],
                                              int p0, int lane) {
            const int g = lane >> 2;
            const int t = lane & 3;
            const int n0 = blockIdx.x * Cfg::BLOCK_N;
            const uint32_t ksf_pad = static_cast<uint32_t>(((p.k / 16) + 3) / 4 * 4);
            const size_t w_stride = static_cast<size_t>(p.n) * (p.k / 2);
            const size_t sf_stride = static_cast<size_t>((p.n + 127) / 128 * 128) * ksf_pad;
            const uint8_t* w = p.w + expert * w_stride;
            const uint8_t* w_sf = p.w_sf + expert * sf_stride;
#pragma unroll
            for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    int row;
                    if constexpr (OP == OP_GATE_UP) {
                        const int half = p.n / 2;
                        row = min((n0 + p0 + 16 * i) / 2 + g, half - 1) + h * half;
                    } else {
                        row = min(n0 + p0 + 16 * i + 8 * h + g, p.n - 1);
                    }
                    code_row[i][h] = ptx::opaque_ptr(w + static_cast<size_t>(row) * (p.k / 2) + 16 * t);
                    sf_row[i][h] =
                        ptx::opaque_ptr(w_sf + swizzled_sf_offset(static_cast<uint32_t>(row), 2 * t, ksf_pad));
                }
#pragma unroll
            for (int q = 0; q < Cfg::Q_TILES; ++q) {
                if constexpr (Cfg::A_FP4) {
                    // codes and scales of the source row (a token row: its scale offset follows the
                    // swizzle of the token's row; or a sorted row of H)
                    a_row[q] = ptx::opaque_ptr(p.a + static_cast<size_t>(src[q]) * (p.k / 2) + 16 * t);
                    a_sf_row[q] = ptx::opaque_ptr(
                        p.a_sf + swizzled_sf_offset(static_cast<uint32_t>(src[q]), 2 * t, ksf_pad));
                } else {
                    a_row[q] = ptx::opaque_ptr(p.a + (static_cast<size_t>(src[q]) * p.k + 32 * t) * 2);
                    a_sf_row[q] = nullptr;
                }
            }
        }
    };

    // The A rows of tile tl for this lane: token rows (gate_up, through the sorted ids) or sorted rows.
    __device__ __forceinline__ static void sources(const GroupedParams& p, const int4& tl, int lane,
                                                   int (&src)[Cfg::Q_TILES]) {
        const int g = lane >> 2;
#pragma unroll
        for (int q = 0; q < Cfg::Q_TILES; ++q) {
            const int r = tl.y + min(8 * q + g, max(tl.z, 1) - 1);
            src[q] = OP == OP_GATE_UP ? p.sorted_ids[r] / p.top_k : r;
        }
    }

    // The CTA walks tiles y0, y0 + gridDim.y, ... as one stream of chunks: every tile has the same
    // CPT chunks per warp (same K slice), and chunk c + DEPTH is requested as soon as chunk c is
    // consumed, also when it belongs to the next tile, so a warp never waits for a tile to start.
    // The issue side runs at most one tile ahead (DEPTH <= CPT); the tile after it (info and, for
    // the gather, its token rows) is fetched one tile earlier still, so a switch does not stall.
    __device__ __forceinline__ static void run(const GroupedParams& p) {
        extern __shared__ __align__(128) uint8_t smem[];
        if (p.k % Cfg::BLOCK_K != 0 || (p.n & 15) != 0 || p.n <= 0) return;
        const int tid = threadIdx.x;
        const int lane = tid & 31;
        const int warp = tid >> 5;
        const int wk = warp / Cfg::WARPS_MN;
        const int wmn = warp % Cfg::WARPS_MN;
        const int p0 = wmn * Cfg::WARP_P;
        const int4* tiles = reinterpret_cast<const int4*>(p.tiles);
        const int step = gridDim.y;
        // The first tile is read together with the count (gridDim.y <= the list's capacity, so the
        // read is in bounds even past the count): one memory round trip before the weights go out.
        int iy = blockIdx.y;  // the tile being issued
        int4 it = tiles[iy];
        const int count = *p.tile_count;
        if (iy >= count) return;
        int4 it_next = iy + step < count ? tiles[iy + step] : it;

        const int nkb = p.k / Cfg::BLOCK_K;
        const int kb_begin = static_cast<int>((static_cast<long long>(blockIdx.z) * nkb) / Cfg::SPLIT_K);
        const int kb_end = static_cast<int>((static_cast<long long>(blockIdx.z + 1) * nkb) / Cfg::SPLIT_K);
        const int cpt = (kb_end - kb_begin) * Cfg::CHUNKS;  // chunks per tile of this warp
        if (cpt % Cfg::DEPTH != 0 || cpt < Cfg::DEPTH) return;  // refused by the Rust-side check
        const sm90::ChunkCursor<Cfg> first{kb_begin * Cfg::BLOCK_K + wk * Cfg::K_PER_WARP, 0};

        int src[Cfg::Q_TILES];
        sources(p, it, lane, src);
        int src_next[Cfg::Q_TILES];
        sources(p, it_next, lane, src_next);
        TilePointers ptr;
        ptr.point(p, it.x, src, p0, lane);

        sm90::WeightChunk<Cfg> ring[Cfg::DEPTH];
        sm90::ActivationChunk<Cfg> aring[Cfg::DEPTH];
        sm90::ChunkCursor<Cfg> ahead = first;
        int ic = 0;  // chunks of tile iy issued
#pragma unroll
        for (int d = 0; d < Cfg::DEPTH; ++d) {
            ring[d].load(ptr.code_row, ptr.sf_row, ahead.k);
            aring[d].load(ptr.a_row, ptr.a_sf_row, ahead.k);
            ahead.next();
            ++ic;
        }
        bool issuing = true;
        int4 ct = it;     // the tile being consumed
        int4 pending = it;  // the tile the issue side moved to (consumed next)

        float acc[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4];
#pragma unroll 1
        for (int cy = blockIdx.y; cy < count; cy += step) {
            sm90::zero_accumulators<Cfg>(acc);
#pragma unroll 1
            for (int base = 0; base < cpt; base += Cfg::DEPTH) {
#pragma unroll
                for (int d = 0; d < Cfg::DEPTH; ++d) {
                    sm90::chunk_mma<Cfg>(ring[d], sm90::RingActivations<Cfg>{aring[d]}, lane, acc);
                    if (issuing && ic == cpt) {
                        // The issue side moves on to the next tile of the walk.
                        iy += step;
                        if (iy < count) {
                            it = it_next;
                            pending = it;
                            ptr.point(p, it.x, src_next, p0, lane);
                            if (iy + step < count) {
                                it_next = tiles[iy + step];
                                sources(p, it_next, lane, src_next);
                            }
                            ahead = first;
                            ic = 0;
                        } else {
                            issuing = false;
                        }
                    }
                    if (issuing) {
                        ring[d].load(ptr.code_row, ptr.sf_row, ahead.k);
                        aring[d].load(ptr.a_row, ptr.a_sf_row, ahead.k);
                        ahead.next();
                        ++ic;
                    }
                }
            }
            sm90::fold_accumulators<Cfg>(acc);
            epilogue(p, smem, acc[0], ct.x, ct.y, ct.z, blockIdx.x * Cfg::BLOCK_N, p0, wk, wmn, lane, tid);
            ct = pending;
        }
    }

    // Scale, activation and store of one output element pair or element (tile-local token m).
    __device__ __forceinline__ static void store(const GroupedParams& p, float out_scale, int row0, int rows, int m,
                                                 int n_or_col, float v0, float v1) {
        if (m >= rows) return;
        const size_t r = static_cast<size_t>(row0 + m);
        if constexpr (OP == OP_GATE_UP) {
            const int half = p.n / 2;
            if (n_or_col < half) p.y[r * half + n_or_col] = float_to_bf16_bits(silu(v0 * out_scale) * (v1 * out_scale));
        } else {
            if (n_or_col < p.n) p.y[r * p.n + n_or_col] = float_to_bf16_bits(v0 * out_scale);
        }
    }

    __device__ __forceinline__ static void epilogue(const GroupedParams& p, uint8_t* smem,
                                                    float (&acc)[Cfg::P_TILES][Cfg::Q_TILES][4], int expert, int row0,
                                                    int rows, int n0, int p0, int wk, int wmn, int lane, int tid) {
        constexpr int FP4_OPERANDS = Cfg::A_FP4 ? 2 : 1;
        const float out_scale =
            p.alpha[expert] * __uint_as_float(static_cast<uint32_t>(127 - nvfp4::OPERAND_LOG2 * FP4_OPERANDS) << 23);
        if constexpr (Cfg::SLOTS > 1) {
            // Partials of every (cluster rank, wk) into slot z * WARPS_K + wk of rank 0, one barrier,
            // then rank 0 sums whole elements over the slots in slot order (deterministic).
            float* flat = &acc[0][0][0];
            const int slot = (Cfg::CLUSTER_SPLIT ? static_cast<int>(blockIdx.z) : 0) * Cfg::WARPS_K + wk;
            float* slots = reinterpret_cast<float*>(smem + Cfg::OFF_SLOTS);
            const int mine = (slot * Cfg::WARPS_MN + wmn) * ACC * 32 + lane;
            if constexpr (Cfg::CLUSTER_SPLIT) {
                const uint32_t remote = ptx::mapa_shared(ptx::smem_addr(slots + mine), 0);
#pragma unroll
                for (int e = 0; e < ACC; ++e) ptx::st_shared_cluster_f32(remote + e * 32 * 4, flat[e]);
                ptx::cluster_sync();
            } else {
#pragma unroll
                for (int e = 0; e < ACC; ++e) slots[mine + e * 32] = flat[e];
                __syncthreads();
            }
            if (!Cfg::CLUSTER_SPLIT || blockIdx.z == 0) {
                constexpr int J = Cfg::WARPS_MN * ACC * 32;  // floats per slot
                if constexpr (QUANT_H) {
                    // The H blocks span lanes: every element is summed over the slots (in slot
                    // order) into slot 0, then the wk = 0 warps store from the lane layout.
                    for (int j = tid; j < J; j += Cfg::THREADS) {
                        float s0 = 0.0f;
#pragma unroll 8
                        for (int s = 0; s < Cfg::SLOTS; ++s) s0 += slots[s * J + j];
                        slots[j] = s0;
                    }
                    __syncthreads();
                    if (wk == 0) {
#pragma unroll
                        for (int e = 0; e < ACC; ++e) flat[e] = slots[wmn * ACC * 32 + e * 32 + lane];
                        store_tile<Cfg::P_TILES, Cfg::Q_TILES, OP, QUANT_H>(p, out_scale, acc, row0, rows, n0 + p0, 0,
                                                                           lane);
                    }
                } else {
                    for (int j = tid; j < J; j += Cfg::THREADS) {
                        const int l = j & 31;
                        const int ef = (j >> 5) % ACC;
                        const int w = (j >> 5) / ACC;
                        // gate_up: element ef (row half 0, gate) carries its partner ef + 2 (up)
                        if (OP == OP_GATE_UP && (ef & 2) != 0) continue;
                        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 8
                        for (int s = 0; s < Cfg::SLOTS; ++s) {
                            s0 += slots[s * J + j];
                            if (OP == OP_GATE_UP) s1 += slots[s * J + j + 64];
                        }
                        const int i = (ef >> 2) / Cfg::Q_TILES;
                        const int q = (ef >> 2) % Cfg::Q_TILES;
                        const int e = ef & 3;
                        const int m = 8 * q + 2 * (l & 3) + (e & 1);
                        const int gl = l >> 2;
                        const int pw = w * Cfg::WARP_P + 16 * i;
                        if constexpr (OP == OP_GATE_UP) {
                            store(p, out_scale, row0, rows, m, (n0 + pw) / 2 + gl, s0, s1);
                        } else {
                            store(p, out_scale, row0, rows, m, n0 + pw + gl + 8 * (e >> 1), s0, 0.0f);
                        }
                    }
                }
            }
            // The slots are reused by the next tile of a persistent walk: nobody writes them
            // before rank 0 has read them.
            if constexpr (Cfg::CLUSTER_SPLIT) {
                ptx::cluster_sync();
            } else {
                __syncthreads();
            }
            return;
        }
        store_tile<Cfg::P_TILES, Cfg::Q_TILES, OP, QUANT_H>(p, out_scale, acc, row0, rows, n0 + p0, 0, lane);
    }
};

}  // namespace moe
}  // namespace fp4tune
