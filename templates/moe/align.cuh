// moe_align: the router's topk_ids -> the routed-row schedule of params.cuh, in one CTA (or, for
// long routings, the chunked form below), with no host synchronization (capturable in a CUDA
// graph).
//
// Rounds take ids [1024 r, 1024 r + 1024), one per thread; inside a warp __match_any_sync groups
// the lanes of one expert (their rank: the lanes below them), and one leader lane per (warp,
// expert) stands for the group. Pass 1 counts rows per local expert (shared atomics: counts do not
// depend on order), then 16 warps scan the counts and the five tile counts per
// expert at once (offsets and the tile lists' starts) and write offsets and tile lists. Pass 2
// places the ids stably: the leaders record their group's size per (warp, expert) and set the
// warp's bit in the expert's warp mask; an id's position is the expert's cursor, plus the groups
// of the same expert in lower warps (the mask's lower bits), plus its rank; the last warp's leader
// moves the cursor by the round's rows. So the position of an id depends only on the ids before
// it: the same input gives the same output, always. A round with one pass of ids (up to 1024,
// every decode step) loads each id once and waits at five barriers; in longer routings pass 2
// loads the next round's ids while it places the current one.
//
// Long routings (prefill) take the chunked form instead (moe_align_count, moe_align_scan,
// moe_align_place below): the rounds become chunks of ALIGN_THREADS ids, one CTA each, so R ids
// cost two launches of R / 1024 CTAs around a one-CTA scan, not R / 1024 rounds of one CTA. Chunk c places its ids
// from offsets[e] + the rows of expert e in chunks before c, which is moe_align's cursor at round
// c: both forms write the same schedule, bit for bit.
//
// A W4A4 layer given bf16 X also quantizes X before gate_up: moe_align_quantize does both in one
// launch (the two are independent; a decode step's two short kernels then overlap their
// latencies instead of running one after the other).
//
// Launch contract (runtime::moe): moe_align grid (1); moe_align_count and moe_align_place grid
// (ceil(tokens * top_k / ALIGN_THREADS)), moe_align_scan grid (1), in that order on one stream;
// moe_align_quantize grid (quant_ctas + 1); ALIGN_THREADS threads, no dynamic shared memory;
// experts <= ALIGN_MAX_EXPERTS.
#pragma once
#include "common/quantize.cuh"
#include "moe/params.cuh"

namespace fp4tune {
namespace moe {

constexpr int ALIGN_THREADS = 1024;
constexpr int ALIGN_WARPS = ALIGN_THREADS / 32;
constexpr int ALIGN_MAX_EXPERTS = 512;
constexpr int ALIGN_V = 1 + TILE_LISTS;                   // scanned per expert: rows, tiles per list
constexpr int ALIGN_SCAN_WARPS = ALIGN_MAX_EXPERTS / 32;  // one expert per thread of these warps

// The chunked form's parameters: moe_align's, plus per (chunk, local expert) the chunk's rows
// (written by moe_align_count), then the rows of that expert in the chunks before it (by
// moe_align_scan). Mirrored by gpu::MoeAlignChunkParams.
struct AlignChunkParams {
    AlignParams p;
    int32_t* base;  // [ceil(tokens * top_k / ALIGN_THREADS)][experts]
};

// Local index of the expert of flat id i, or -1 (another GPU's expert, or an id out of range).
__device__ __forceinline__ int local_expert(const AlignParams& p, int i) {
    const long long e = static_cast<long long>(p.topk_ids[i]) - p.expert_begin;
    return e >= 0 && e < p.experts ? static_cast<int>(e) : -1;
}

__device__ __forceinline__ bool is_leader(unsigned peers, int lane) {
    return lane == __ffs(peers) - 1;
}

// One round's groups (the lanes of a warp with the same local expert): the leader lane of each
// records its rows and sets the warp's bit in the expert's mask; returns whether this lane leads.
__device__ __forceinline__ bool record_group(int e, unsigned peers, int lane, int warp,
                                             uint16_t (*group_rows)[ALIGN_MAX_EXPERTS], uint32_t* warp_mask) {
    const bool leader = e >= 0 && is_leader(peers, lane);
    if (leader) {
        group_rows[warp][e] = static_cast<uint16_t>(__popc(peers));
        atomicOr(&warp_mask[e], 1u << warp);
    }
    return leader;
}

// The rows of expert e's groups in the round's warps below `warp` (`mask`: the expert's warps).
__device__ __forceinline__ int rows_below(uint32_t mask, const uint16_t (*group_rows)[ALIGN_MAX_EXPERTS], int e,
                                          int warp) {
    int below = 0;
    for (uint32_t b = mask & ((1u << warp) - 1u); b != 0; b &= b - 1) below += group_rows[__ffs(b) - 1][e];
    return below;
}

// The offsets and the tile lists from the rows per expert in `count`: thread e of the first
// ALIGN_SCAN_WARPS warps scans (rows, tiles of each list) of expert e; cursor[e] = offsets[e].
// Called by every thread of the CTA; returns after a barrier.
__device__ __forceinline__ void write_schedule(const AlignParams& p, const int32_t* count, int32_t* cursor,
                                               int32_t (*warp_total)[ALIGN_V]) {
    constexpr int V = ALIGN_V;
    constexpr int SCAN_WARPS = ALIGN_SCAN_WARPS;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int E = p.experts;
    int v[V];
    int incl[V];
    const bool scans = warp < SCAN_WARPS;
    if (scans) {
        const int c = tid < E ? count[tid] : 0;
        v[0] = c;
#pragma unroll
        for (int l = 0; l < TILE_LISTS; ++l) v[1 + l] = (c + (8 << l) - 1) / (8 << l);
#pragma unroll
        for (int j = 0; j < V; ++j) incl[j] = v[j];
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
#pragma unroll
            for (int j = 0; j < V; ++j) {
                const int x = __shfl_up_sync(0xffffffffu, incl[j], d);
                if (lane >= d) incl[j] += x;
            }
        }
        if (lane == 31) {
#pragma unroll
            for (int j = 0; j < V; ++j) warp_total[warp][j] = incl[j];
        }
    }
    __syncthreads();
    if (scans && tid < E) {
        int excl[V];
#pragma unroll
        for (int j = 0; j < V; ++j) excl[j] = incl[j] - v[j];
        for (int w = 0; w < warp; ++w) {
#pragma unroll
            for (int j = 0; j < V; ++j) excl[j] += warp_total[w][j];
        }
        const int e = tid;
        const int c = v[0];
        cursor[e] = excl[0];
        p.offsets[e] = excl[0];
#pragma unroll
        for (int l = 0; l < TILE_LISTS; ++l) {
            const int bm = 8 << l;
            int4* out = reinterpret_cast<int4*>(p.tiles) + static_cast<size_t>(l) * p.max_tiles + excl[1 + l];
            for (int j = 0; j < v[1 + l]; ++j) out[j] = make_int4(e, excl[0] + j * bm, min(bm, c - j * bm), 0);
        }
        if (e == E - 1) {
            p.offsets[E] = excl[0] + c;
#pragma unroll
            for (int l = 0; l < TILE_LISTS; ++l) p.tile_count[l] = excl[1 + l] + v[1 + l];
        }
    }
    __syncthreads();
}

__device__ __forceinline__ void moe_align(const AlignParams& p) {
    __shared__ int32_t count[ALIGN_MAX_EXPERTS];          // rows per expert
    __shared__ int32_t cursor[ALIGN_MAX_EXPERTS];         // next sorted position of each expert
    __shared__ uint32_t warp_mask[ALIGN_MAX_EXPERTS];     // warps of the round holding the expert
    __shared__ uint16_t group_rows[ALIGN_WARPS][ALIGN_MAX_EXPERTS];  // valid where warp_mask says
    __shared__ int32_t warp_total[ALIGN_SCAN_WARPS][ALIGN_V];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int E = p.experts;
    const int R = p.tokens * p.top_k;
    if (E <= 0 || E > ALIGN_MAX_EXPERTS) return;

    // round 0's id and group, kept for both passes
    const int e0 = tid < R ? local_expert(p, tid) : -1;
    const unsigned peers0 = __match_any_sync(0xffffffffu, e0);
    for (int e = tid; e < E; e += ALIGN_THREADS) {
        count[e] = 0;
        warp_mask[e] = 0;
    }
    __syncthreads();

    // ---- pass 1: rows per expert (round 0 by its leaders; later rounds one atomic per id, whose
    // loads the unrolled loop keeps in flight together)
    if (e0 >= 0 && is_leader(peers0, lane)) atomicAdd(&count[e0], __popc(peers0));
#pragma unroll 4
    for (int i = ALIGN_THREADS + tid; i < R; i += ALIGN_THREADS) {
        const int e = local_expert(p, i);
        if (e >= 0) atomicAdd(&count[e], 1);
    }
    __syncthreads();

    // ---- offsets and tile lists
    write_schedule(p, count, cursor, warp_total);

    // ---- pass 2: stable placement (the next round's id in flight meanwhile)
    int e_next = e0;
    for (int r0 = 0; r0 < R; r0 += ALIGN_THREADS) {
        const int i = r0 + tid;
        const int e = e_next;
        const int i_next = i + ALIGN_THREADS;
        e_next = i_next < R ? local_expert(p, i_next) : -1;
        const unsigned peers = r0 == 0 ? peers0 : __match_any_sync(0xffffffffu, e);
        const bool leader = record_group(e, peers, lane, warp, group_rows, warp_mask);
        __syncthreads();
        int below = 0;
        bool last = false;
        if (e >= 0) {
            const uint32_t m = warp_mask[e];
            last = (m >> warp) == 1u;
            below = rows_below(m, group_rows, e, warp);
            const int pos = cursor[e] + below + __popc(peers & ((1u << lane) - 1u));
            p.sorted_ids[pos] = i;
            p.inverse[i] = pos;
        } else if (i < R) {
            p.inverse[i] = -1;
        }
        if (r0 + ALIGN_THREADS < R) {
            // the next round starts from moved cursors and empty masks
            __syncthreads();
            if (leader && last) {
                cursor[e] += below + __popc(peers);
                warp_mask[e] = 0;
            }
            __syncthreads();
        }
    }
}

// ---- the chunked form: chunk c is ids [c * ALIGN_THREADS, + ALIGN_THREADS), one per thread of
// CTA c (moe_align's round c)

// Rows per local expert of the CTA's chunk -> base[chunk][e].
__device__ __forceinline__ void moe_align_count(const AlignChunkParams& q) {
    const AlignParams& p = q.p;
    __shared__ int32_t count[ALIGN_MAX_EXPERTS];
    const int tid = threadIdx.x;
    const int E = p.experts;
    const int R = p.tokens * p.top_k;
    if (E <= 0 || E > ALIGN_MAX_EXPERTS) return;
    const int i = static_cast<int>(blockIdx.x) * ALIGN_THREADS + tid;
    const int e = i < R ? local_expert(p, i) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    for (int x = tid; x < E; x += ALIGN_THREADS) count[x] = 0;
    __syncthreads();
    if (e >= 0 && is_leader(peers, tid & 31)) atomicAdd(&count[e], __popc(peers));
    __syncthreads();
    int32_t* out = q.base + static_cast<size_t>(blockIdx.x) * E;
    for (int x = tid; x < E; x += ALIGN_THREADS) out[x] = count[x];
}

// One CTA: thread e turns column e of base into the rows of expert e in the chunks before each
// chunk (exclusive prefix over the chunks, loads in batches of 8 in flight), then the offsets
// and tile lists from the column totals, as moe_align writes them.
__device__ __forceinline__ void moe_align_scan(const AlignChunkParams& q) {
    constexpr int BATCH = 8;
    const AlignParams& p = q.p;
    __shared__ int32_t count[ALIGN_MAX_EXPERTS];
    __shared__ int32_t cursor[ALIGN_MAX_EXPERTS];
    __shared__ int32_t warp_total[ALIGN_SCAN_WARPS][ALIGN_V];
    const int tid = threadIdx.x;
    const int E = p.experts;
    const int R = p.tokens * p.top_k;
    if (E <= 0 || E > ALIGN_MAX_EXPERTS) return;
    const int chunks = (R + ALIGN_THREADS - 1) / ALIGN_THREADS;
    if (tid < E) {
        int32_t* column = q.base + tid;
        int run = 0;
        for (int c0 = 0; c0 < chunks; c0 += BATCH) {
            int x[BATCH];
#pragma unroll
            for (int j = 0; j < BATCH; ++j) x[j] = c0 + j < chunks ? column[static_cast<size_t>(c0 + j) * E] : 0;
#pragma unroll
            for (int j = 0; j < BATCH; ++j) {
                if (c0 + j < chunks) column[static_cast<size_t>(c0 + j) * E] = run;
                run += x[j];
            }
        }
        count[tid] = run;
    }
    __syncthreads();
    write_schedule(p, count, cursor, warp_total);
}

// The CTA's chunk placed: an id's position is offsets[e] + base[chunk][e] (moe_align's cursor at
// this round) + the groups of its expert in lower warps + its rank in its warp's group.
__device__ __forceinline__ void moe_align_place(const AlignChunkParams& q) {
    const AlignParams& p = q.p;
    __shared__ uint32_t warp_mask[ALIGN_MAX_EXPERTS];
    __shared__ uint16_t group_rows[ALIGN_WARPS][ALIGN_MAX_EXPERTS];  // valid where warp_mask says
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int E = p.experts;
    const int R = p.tokens * p.top_k;
    if (E <= 0 || E > ALIGN_MAX_EXPERTS) return;
    const int i = static_cast<int>(blockIdx.x) * ALIGN_THREADS + tid;
    const int e = i < R ? local_expert(p, i) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    for (int x = tid; x < E; x += ALIGN_THREADS) warp_mask[x] = 0;
    const int start = e >= 0 ? p.offsets[e] + q.base[static_cast<size_t>(blockIdx.x) * E + e] : 0;
    __syncthreads();
    record_group(e, peers, lane, warp, group_rows, warp_mask);
    __syncthreads();
    if (e >= 0) {
        const int pos = start + rows_below(warp_mask[e], group_rows, e, warp) + __popc(peers & ((1u << lane) - 1u));
        p.sorted_ids[pos] = i;
        p.inverse[i] = pos;
    } else if (i < R) {
        p.inverse[i] = -1;
    }
}

// ---- moe_align and the quantization of X in one launch

// The one-CTA routing parameters, X's quantizer parameters and the quantizer's CTAs: CTAs
// 0 .. quant_ctas - 1 quantize X exactly as the quantizer kernel does (its thread index over the
// padded scale matrix, here with ALIGN_THREADS threads per CTA: the same elements, the same
// bytes), CTA quant_ctas runs moe_align. Mirrored by gpu::MoeAlignQuantizeParams.
struct AlignQuantizeParams {
    AlignParams align;
    QuantizeParams quant;
    int quant_ctas;
};

__device__ __forceinline__ void moe_align_quantize(const AlignQuantizeParams& p) {
    if (static_cast<int>(blockIdx.x) == p.quant_ctas) {
        moe_align(p.align);
    } else {
        quantize_bf16_nvfp4<ALIGN_THREADS>(p.quant);
    }
}

}  // namespace moe
}  // namespace fp4tune
