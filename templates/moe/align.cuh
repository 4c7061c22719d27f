// moe_align: the router's topk_ids -> the routed-row schedule of params.cuh, in one CTA, with no
// host synchronization (capturable in a CUDA graph).
//
// Pass 1 counts rows per local expert (shared atomics: counts do not depend on order), prefix-sums
// them into offsets and writes the three tile lists. Pass 2 places the flat ids stably: round r
// takes ids [1024 r, 1024 r + 1024), one per thread; inside a warp __match_any_sync ranks the
// lanes of one expert, a (warp, expert) table prefix-summed over the 32 warps ranks the warps, and
// each expert's cursor moves by the round's total. So the position of an id depends only on the
// ids before it: the same input gives the same output, always.
//
// Launch contract (runtime::moe): grid (1), ALIGN_THREADS threads, no dynamic shared memory;
// experts <= ALIGN_MAX_EXPERTS.
#pragma once
#include "moe/params.cuh"

namespace fp4tune {
namespace moe {

constexpr int ALIGN_THREADS = 1024;
constexpr int ALIGN_WARPS = ALIGN_THREADS / 32;
constexpr int ALIGN_MAX_EXPERTS = 512;

// Local index of the expert of flat id i, or -1 (another GPU's expert, or an id out of range).
__device__ __forceinline__ int local_expert(const AlignParams& p, int i) {
    const long long e = static_cast<long long>(p.topk_ids[i]) - p.expert_begin;
    return e >= 0 && e < p.experts ? static_cast<int>(e) : -1;
}

// Exclusive prefix sum of a[0 .. n) in place by one warp (n <= 32 * 16 here); returns the total.
__device__ __forceinline__ int warp_exclusive_scan(int32_t* a, int n, int lane) {
    const int per = (n + 31) / 32;
    const int b = min(lane * per, n);
    const int e = min(b + per, n);
    int s = 0;
    for (int i = b; i < e; ++i) s += a[i];
    int incl = s;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += v;
    }
    int run = incl - s;
    for (int i = b; i < e; ++i) {
        const int v = a[i];
        a[i] = run;
        run += v;
    }
    return __shfl_sync(0xffffffffu, incl, 31);
}

__device__ __forceinline__ void moe_align(const AlignParams& p) {
    __shared__ int32_t count[ALIGN_MAX_EXPERTS];    // rows per expert, then each round's rows
    __shared__ int32_t cursor[ALIGN_MAX_EXPERTS];   // next sorted position of each expert
    __shared__ int32_t tile_first[TILE_LISTS][ALIGN_MAX_EXPERTS];
    __shared__ uint16_t rank_table[ALIGN_WARPS][ALIGN_MAX_EXPERTS];  // (warp, expert) -> rows, then prefix
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int E = p.experts;
    const int R = p.tokens * p.top_k;
    if (E <= 0 || E > ALIGN_MAX_EXPERTS) return;

    // ---- pass 1: counts, offsets, tile lists
    for (int e = tid; e < E; e += ALIGN_THREADS) count[e] = 0;
    __syncthreads();
    for (int i = tid; i < R; i += ALIGN_THREADS) {
        const int e = local_expert(p, i);
        if (e >= 0) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    for (int e = tid; e < E; e += ALIGN_THREADS) {
        cursor[e] = count[e];
#pragma unroll
        for (int l = 0; l < TILE_LISTS; ++l) tile_first[l][e] = (count[e] + (8 << l) - 1) / (8 << l);
    }
    __syncthreads();
    if (warp == 0) {
        const int total = warp_exclusive_scan(cursor, E, lane);
        if (lane == 0) p.offsets[E] = total;
    } else if (warp <= TILE_LISTS) {
        const int total = warp_exclusive_scan(tile_first[warp - 1], E, lane);
        if (lane == 0) p.tile_count[warp - 1] = total;
    }
    __syncthreads();
    for (int e = tid; e < E; e += ALIGN_THREADS) p.offsets[e] = cursor[e];
    for (int x = tid; x < TILE_LISTS * E; x += ALIGN_THREADS) {
        const int l = x / E;
        const int e = x % E;
        const int bm = 8 << l;
        const int c = count[e];
        int4* out = reinterpret_cast<int4*>(p.tiles) + static_cast<size_t>(l) * p.max_tiles + tile_first[l][e];
        for (int j = 0; j * bm < c; ++j) out[j] = make_int4(e, cursor[e] + j * bm, min(bm, c - j * bm), 0);
    }
    __syncthreads();

    // ---- pass 2: stable placement, 1024 ids per round
    for (int r0 = 0; r0 < R; r0 += ALIGN_THREADS) {
        const int i = r0 + tid;
        const int e = i < R ? local_expert(p, i) : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, e);
        const int rank = __popc(peers & ((1u << lane) - 1u));
        for (int x = tid; x < ALIGN_WARPS * E; x += ALIGN_THREADS) rank_table[x / E][x % E] = 0;
        __syncthreads();
        if (e >= 0 && rank == 0) rank_table[warp][e] = static_cast<uint16_t>(__popc(peers));
        __syncthreads();
        for (int x = tid; x < E; x += ALIGN_THREADS) {
            int run = 0;
            for (int w = 0; w < ALIGN_WARPS; ++w) {
                const int v = rank_table[w][x];
                rank_table[w][x] = static_cast<uint16_t>(run);
                run += v;
            }
            count[x] = run;
        }
        __syncthreads();
        if (e >= 0) {
            const int pos = cursor[e] + rank_table[warp][e] + rank;
            p.sorted_ids[pos] = i;
            p.inverse[i] = pos;
        } else if (i < R) {
            p.inverse[i] = -1;
        }
        __syncthreads();
        for (int x = tid; x < E; x += ALIGN_THREADS) cursor[x] += count[x];
        __syncthreads();
    }
}

}  // namespace moe
}  // namespace fp4tune
