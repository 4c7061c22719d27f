// The grouped SM120 kernel (W4A4): the gate_up / down projections of every active expert in one
// launch on the native block-scaled MMA (mma.sync m16n8k64 kind::mxf4nvf4, SASS OMMA.SF), on the
// routed-row schedule of moe_align.
//
// The SM120 GEMM's cp.async pipeline and MMA step (sm120/gemm.cuh: Config with swap-AB, weights on
// the MMA's 16-row side P, routed rows on its 8-wide side Q; compute_stage; the k-warp reduction of
// sm120/epilogue.cuh) placed on the tile schedule: CTA (x, y, z) takes n-tile x of tiles y,
// y + gridDim.y, ... of its tile list (one tile = up to BLOCK_M rows of one expert; gridDim.y below
// the tile count is a persistent walk), the whole K of each tile (or split z of it, below), split
// over WARPS_K warps and summed in warp order (deterministic). Only the rows of a stage differ
// from the GEMM:
//   P (weights of the tile's expert): tile row r is weight row sm120_weight_row<OP>(r). gate_up
//     interleaves gate and up rows by MMA row half (r = 16 i + 8 h + g: gate row (n0 + 16 i) / 2 + g
//     for h = 0, the up row I rows later for h = 1), so accumulator elements e and e + 2 are gate and
//     up of one H column and the epilogue (moe/epilogue.cuh) writes SiLU(gate) * up from registers.
//   Q (NVFP4 activations): tile row r is the token of sorted row first + r (gate_up: a gather of
//     X's codes and of the scale words of the token's row in X's swizzled layout) or sorted row
//     first + r of H (down); rows past the tile are zero-filled.
// gate_up writes H as bf16 and as NVFP4 (h_scale) for down; down writes Y_rows.
//
// The K-tail form (K_TAIL, GroupedSm120Tail, names with `kt`) runs any K that is a multiple of 16
// (the NVFP4 block) in ceil(K / BLOCK_K) k-tiles with sm120/load.cuh's K-tail copies
// (sm120::load_rows): zero codes under zero scales add exact zeros, and the swizzled scales'
// padding columns are never read.
//
// Split-K across CTAs (Cfg::SPLIT_K > 1, gate_up): CTA z of a tile's SPLIT_K CTAs takes k-tiles
// [z * k_tiles / SPLIT_K, (z + 1) * k_tiles / SPLIT_K), writes its k-warp-reduced accumulators to
// the tile's partial slot z (partials[((tile * gridDim.x + x) * SPLIT_K + z) * BLOCK_N * BLOCK_M + e],
// e = the accumulator register's index over the wk == 0 warps, lane fastest), and the last of the
// SPLIT_K CTAs to arrive (one arrival counter per (tile, n-tile), reset by it) sums slots 0 ..
// SPLIT_K - 1 in order and runs the epilogue: deterministic, no waiting, no cluster. The partials
// hold split_tiles tiles (the launcher's share of the stream's workspace); a schedule of more tiles
// runs unsplit (each CTA takes whole tiles, the z planes one after the other), so any routing stays
// correct and the workspace stays sized for decode. Bit for bit the same run to run; whether a
// step splits (and so the order of its sums) depends on the step's tile count. Mirrored by
// moe::sm120::split_* in Rust.
//
// Launch contract (moe::GroupedConfig, family sm120): one GroupedSm120Params, grid (ceil(N /
// BLOCK_N), grid_y, SPLIT_K), THREADS threads, SMEM_BYTES of dynamic shared memory (plus BLOCK_M
// words of static shared memory, one more with SPLIT_K > 1).
#pragma once
#include "moe/epilogue.cuh"
#include "moe/params.cuh"
#include "sm120/gemm.cuh"

namespace fp4tune {
namespace moe {

// The parameters of every sm120 grouped kernel: the grouped projection's and its split-K
// workspace (mirrored by gpu::MoeGroupedSm120Params; unused by kernels with SPLIT_K 1).
struct GroupedSm120Params {
    GroupedParams g;
    float* partials;     // [split_tiles][gridDim.x][SPLIT_K][BLOCK_N * BLOCK_M] fp32
    uint32_t* counters;  // [split_tiles][gridDim.x], zero between launches
    int split_tiles;     // tiles the partials hold
};

// An opaque copy of a register: values the loaders recompute from it are not hoisted out of the
// k-tile loop (the hoisted row-validity predicates of large tiles would otherwise spill).
__device__ __forceinline__ int sm120_opaque(int v) {
    int d;
    asm volatile("mov.b32 %0, %1;\n" : "=r"(d) : "r"(v));
    return d;
}

// blockIdx.z read where it is used: a value the compiler cannot keep live across the main loop
// (the split kernels' epilogue values would otherwise spill).
__device__ __forceinline__ int sm120_ctaid_z() {
    int z;
    asm volatile("mov.u32 %0, %%ctaid.z;\n" : "=r"(z));
    return z;
}

// Weight row of P-tile row r of the CTA whose first weight row is n0, or -1 past the weight
// (zero-filled). Mirrored by moe::sm120::weight_row in Rust (compared at compile time by
// the_grouped_index_math_is_its_cpu_mirror).
template <int OP>
__host__ __device__ __forceinline__ constexpr int sm120_weight_row(int n, int n0, int r) {
    if constexpr (OP == OP_GATE_UP) {
        const int half = n / 2;
        const int col = (n0 + r - (r & 15)) / 2 + (r & 7);
        return col < half ? col + ((r >> 3) & 1) * half : -1;
    } else {
        return n0 + r < n ? n0 + r : -1;
    }
}

// Activation row of Q-tile row r of the tile whose rows are sorted rows first .. first + rows - 1:
// the token (gate_up) or the sorted row (down); -1 past the tile (zero-filled). Mirrored by
// moe::sm120::source_row in Rust.
template <int OP>
__device__ __forceinline__ int sm120_source_row(const GroupedParams& p, int first, int rows, int r) {
    if (r >= rows) return -1;
    return OP == OP_GATE_UP ? p.sorted_ids[first + r] / p.top_k : first + r;
}

template <class Cfg, int OP, bool K_TAIL = false>
struct GroupedSm120 {
    static_assert(Cfg::SWAP_AB, "grouped kernels keep the weights on the MMA's 16-row side");
    static_assert(Cfg::WARPS_M == 1, "one warp along the routed rows of a tile");
    static constexpr bool QUANT_H = OP == OP_GATE_UP;
    static_assert(!QUANT_H || Cfg::MMA_P % 2 == 0, "gate_up quantizes 16-column blocks of H: 32 weight rows per warp");
    static constexpr bool SPLIT = Cfg::SPLIT_K > 1;
    static_assert(!SPLIT || OP == OP_GATE_UP, "split-K across CTAs is gate_up's (down's N gives CTAs enough)");
    // One partial slot: the accumulators of the wk == 0 warps (WARPS_P x WARPS_Q warps of MMA_P x
    // MMA_Q tiles of 4 x 32 floats) cover the CTA's tile exactly.
    static constexpr int SLOT_FLOATS = Cfg::BLOCK_N * Cfg::BLOCK_M;
    static_assert(Cfg::WARPS_P * Cfg::WARPS_Q * Cfg::MMA_P * Cfg::MMA_Q * 4 * 32 == SLOT_FLOATS,
                  "a partial slot is the wk == 0 warps' accumulators, one float each");

    // Index of accumulator register (mp, mq, i) of `lane` of the wk == 0 warp at warp_pq in a
    // partial slot (mirrored by moe::sm120::split_element; compared at compile time by
    // the_grouped_index_math_is_its_cpu_mirror).
    __host__ __device__ __forceinline__ static constexpr int slot_element(int warp_pq, int mp, int mq, int i,
                                                                          int lane) {
        return (((warp_pq * Cfg::MMA_P + mp) * Cfg::MMA_Q + mq) * 4 + i) * 32 + lane;
    }

    __device__ __forceinline__ static void run(const GroupedSm120Params& sp) {
        const GroupedParams& p = sp.g;
        extern __shared__ __align__(128) uint8_t smem[];
        // the tile's source rows, then (split-K) the "last CTA" flag
        __shared__ int32_t q_rows[Cfg::BLOCK_M + (SPLIT ? 1 : 0)];
        if constexpr (K_TAIL) {
            if (p.k % 16 != 0 || p.k <= 0 || (p.n & 15) != 0 || p.n <= 0) return;
        } else {
            if (p.k % Cfg::BLOCK_K != 0 || (p.n & 15) != 0 || p.n <= 0) return;
        }
        const int tid = static_cast<int>(threadIdx.x);
        const int lane = tid & 31;
        const int warp = tid >> 5;
        const int wq = warp % Cfg::WARPS_Q;
        const int wp = (warp / Cfg::WARPS_Q) % Cfg::WARPS_P;
        const int wk = warp / (Cfg::WARPS_Q * Cfg::WARPS_P);
        const int warp_p0 = wp * Cfg::WARP_P;
        const int warp_q0 = wq * Cfg::WARP_Q;
        const int n0 = static_cast<int>(blockIdx.x) * Cfg::BLOCK_N;
        const int ksf_pad = ((p.k / 16 + 3) / 4) * 4;
        const int k_tiles = K_TAIL ? (p.k + Cfg::BLOCK_K - 1) / Cfg::BLOCK_K : p.k / Cfg::BLOCK_K;
        const size_t w_stride = static_cast<size_t>(p.n) * (p.k / 2);
        const size_t sf_stride = static_cast<size_t>((p.n + 127) / 128 * 128) * ksf_pad;
        const int4* tiles = reinterpret_cast<const int4*>(p.tiles);
        const int count = *p.tile_count;
        const uint32_t smem0 = sm120::smem_addr(smem);
        const int n = p.n;
        // Split across the grid's z only while the partials hold every tile of the schedule (the
        // same answer in every CTA). Otherwise every CTA takes whole tiles: the grid's z planes
        // walk the tile list one after the other (tile y + z * gridDim.y, stepping by all of
        // them), so a persistent walk keeps all its CTAs and a one-tile-per-CTA grid's z > 0 CTAs
        // find no tile.
        const int z = static_cast<int>(blockIdx.z);
        const bool split = SPLIT && count <= sp.split_tiles;
        const int kt_begin = split ? z * k_tiles / Cfg::SPLIT_K : 0;
        const int kt_end = split ? (z + 1) * k_tiles / Cfg::SPLIT_K : k_tiles;
        const int kt_count = kt_end - kt_begin;
        const int cy_first = static_cast<int>(blockIdx.y) + (split ? 0 : z * static_cast<int>(gridDim.y));
        const int cy_step = static_cast<int>(gridDim.y) * (split ? 1 : static_cast<int>(gridDim.z));

#pragma unroll 1
        for (int cy = cy_first; cy < count; cy += cy_step) {
            const int4 tl = tiles[cy];  // (expert, first sorted row, rows, 0)
            const uint8_t* w = p.w + tl.x * w_stride;
            const uint8_t* w_sf = p.w_sf + tl.x * sf_stride;
            __syncthreads();  // the previous tile is done with q_rows and the shared stages
            if (tid < Cfg::BLOCK_M) q_rows[tid] = sm120_source_row<OP>(p, tl.y, tl.z, tid);
            __syncthreads();
            const int32_t* rows_of_tile = q_rows;
            const auto source_row = [rows_of_tile](int r) { return rows_of_tile[r]; };
            const auto load_stage = [&](int slot, int kt) {
                const uint32_t st = smem0 + slot * Cfg::STAGE_BYTES;
                const int n_here = sm120_opaque(n);
                const auto weight_row = [n_here, n0](int r) { return sm120_weight_row<OP>(n_here, n0, r); };
                sm120::load_rows<Cfg, Cfg::TILE_P, K_TAIL>(st, st + Cfg::P_SF_OFFSET, w, w_sf, weight_row, p.k, ksf_pad, kt);
                sm120::load_rows<Cfg, Cfg::TILE_Q, K_TAIL>(st + Cfg::Q_CODE_OFFSET, st + Cfg::Q_SF_OFFSET, p.a, p.a_sf,
                                                    source_row, p.k, ksf_pad, kt);
            };

            float acc[Cfg::MMA_P][Cfg::MMA_Q][4];
#pragma unroll
            for (int mp = 0; mp < Cfg::MMA_P; ++mp)
#pragma unroll
                for (int mq = 0; mq < Cfg::MMA_Q; ++mq)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[mp][mq][i] = 0.0f;

            const auto prologue_stage = [&](int s) {
                if (s < kt_count) load_stage(s, kt_begin + s);
                sm120::cp_async_commit();
            };
            if constexpr (SPLIT) {
                // a loop, not STAGES - 1 copies: a split's first k-tile is known at run time only,
                // and unrolled stages would each keep their own precomputed addresses (and spill)
#pragma unroll 1
                for (int s = 0; s < Cfg::STAGES - 1; ++s) prologue_stage(s);
            } else {
#pragma unroll
                for (int s = 0; s < Cfg::STAGES - 1; ++s) prologue_stage(s);
            }
            int read_slot = 0;
            int write_slot = Cfg::STAGES - 1;
#pragma unroll 1
            for (int it = 0; it < kt_count; ++it) {
                sm120::cp_async_wait<Cfg::STAGES - 2>();
                __syncthreads();  // k-tile `it` landed for everyone; the slot of it - 1 is free again
                if (it + Cfg::STAGES - 1 < kt_count) load_stage(write_slot, kt_begin + it + Cfg::STAGES - 1);
                sm120::cp_async_commit();
                sm120::compute_stage<Cfg>(acc, smem0 + read_slot * Cfg::STAGE_BYTES, warp_p0, warp_q0, wk, lane);
                read_slot = read_slot == Cfg::STAGES - 1 ? 0 : read_slot + 1;
                write_slot = write_slot == Cfg::STAGES - 1 ? 0 : write_slot + 1;
            }
            sm120::cp_async_wait<0>();
            __syncthreads();

            // opaque with split-K: the epilogue's lane and warp terms (the k-warp reduction's,
            // the partial slots' and the stores' addresses) are computed here, not kept across
            // the main loop, where they would spill
            const int warp_pq = SPLIT ? sm120_opaque(wp * Cfg::WARPS_Q + wq) : wp * Cfg::WARPS_Q + wq;
            const int lane_e = SPLIT ? sm120_opaque(lane) : lane;
            sm120::Epilogue<Cfg>::reduce_k_warps(acc, smem, warp_pq, wk, lane_e);
            if constexpr (SPLIT) {
                if (split) {
                    const int z = sm120_ctaid_z();
                    const size_t cell = static_cast<size_t>(cy) * gridDim.x + blockIdx.x;
                    float* slots = sp.partials + cell * Cfg::SPLIT_K * SLOT_FLOATS;
                    if (wk == 0) {
#pragma unroll
                        for (int mp = 0; mp < Cfg::MMA_P; ++mp)
#pragma unroll
                            for (int mq = 0; mq < Cfg::MMA_Q; ++mq)
#pragma unroll
                                for (int i = 0; i < 4; ++i)
                                    slots[z * SLOT_FLOATS + slot_element(warp_pq, mp, mq, i, lane_e)] = acc[mp][mq][i];
                    }
                    sm120::fence_gpu();
                    __syncthreads();
                    if (tid == 0) q_rows[Cfg::BLOCK_M] = sm120::split_arrive(sp.counters + cell, Cfg::SPLIT_K) ? 1 : 0;
                    __syncthreads();
                    if (q_rows[Cfg::BLOCK_M] == 0) continue;  // the tile's last CTA finishes it
                    sm120::fence_gpu();
                    if (wk == 0) {
#pragma unroll
                        for (int mp = 0; mp < Cfg::MMA_P; ++mp)
#pragma unroll
                            for (int mq = 0; mq < Cfg::MMA_Q; ++mq)
#pragma unroll
                                for (int i = 0; i < 4; ++i) {
                                    const float* src = slots + slot_element(warp_pq, mp, mq, i, lane_e);
                                    float sum = 0.0f;
#pragma unroll
                                    for (int s = 0; s < Cfg::SPLIT_K; ++s) sum += sm120::ld_cg_f32(src + s * SLOT_FLOATS);
                                    acc[mp][mq][i] = sum;
                                }
                    }
                }
            }
            const int pw0 = SPLIT ? sm120_opaque(n0 + warp_p0) : n0 + warp_p0;
            if (wk == 0)
                store_tile<Cfg::MMA_P, Cfg::MMA_Q, OP, QUANT_H>(p, p.alpha[tl.x], acc, tl.y, tl.z, pw0, warp_q0, lane_e);
        }
    }
};

// The K-tail form of the grouped SM120 kernel (an instantiation unit names its runner <Cfg, OP>).
template <class Cfg, int OP>
using GroupedSm120Tail = GroupedSm120<Cfg, OP, true>;

}  // namespace moe
}  // namespace fp4tune
