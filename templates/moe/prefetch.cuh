// moe_prefetch: the weights of a decode step's routed experts asked into L2 before the projections
// read them. The layer launches it on its workspace's side stream, forked from the caller's stream
// before moe_align and joined after moe_finalize, so it runs beside the layer's own kernels and
// nothing but the end of the layer waits for it. It reads topk_ids itself (not the schedule), so
// it starts together with moe_align, while the SMs and DRAM are otherwise idle. It only asks: no
// byte it touches is written, so the layer's results do not depend on it.
//
// CTA (i, r, s) takes routed id i (nothing when its expert is not local, or an earlier id has the
// same expert: each expert's bytes are asked for once), region r (0: gate_up codes, 1: gate_up
// scales, 2: down codes, 3: down scales; nothing for a region whose bit in `regions` is clear) and
// segment s of PREFETCH_SEGMENT bytes of that expert's bytes in the region. BULK 0: every thread
// asks for lines of PREFETCH_LINE bytes (prefetch.global.L2); BULK 1: one thread asks for the
// whole segment (cp.async.bulk.prefetch.L2, sm_90 and later).
//
// Launch contract (runtime::moe): grid (routed ids, PREFETCH_REGIONS, segments of the largest
// region asked for), PREFETCH_THREADS threads, no shared memory; every region's base 16-byte
// aligned, its bytes per expert a multiple of 16.
#pragma once
#include "common/types.cuh"

namespace fp4tune {
namespace moe {

constexpr int PREFETCH_THREADS = 128;
constexpr int PREFETCH_REGIONS = 4;
constexpr int PREFETCH_SEGMENT = 64 * 1024;
constexpr int PREFETCH_LINE = 128;

// Mirrored by gpu::MoePrefetchParams.
struct PrefetchParams {
    const int32_t* topk_ids;                    // [tokens, top_k], global expert ids
    const uint8_t* base[PREFETCH_REGIONS];      // expert 0's bytes of each region
    long long per_expert[PREFETCH_REGIONS];     // bytes of one expert in each region
    int routed;                                 // tokens * top_k
    int expert_begin;                           // global id of local expert 0
    int experts;                                // local experts
    int regions;                                // bit r: region r is asked for
};

// Element r of a parameter array, selected without indexing it (a dynamic index would copy the
// parameter block to local memory).
template <typename T>
__device__ __forceinline__ T pick_region(const T (&v)[PREFETCH_REGIONS], int r) {
    return r == 0 ? v[0] : r == 1 ? v[1] : r == 2 ? v[2] : v[3];
}

template <int BULK>
__device__ __forceinline__ void moe_prefetch(const PrefetchParams& p) {
    const int i = blockIdx.x;
    const int r = blockIdx.y;
    const long long offset = static_cast<long long>(blockIdx.z) * PREFETCH_SEGMENT;
    const long long per_expert = pick_region(p.per_expert, r);
    if (i >= p.routed || !((p.regions >> r) & 1) || offset >= per_expert) return;
    const int id = p.topk_ids[i];
    const long long e = static_cast<long long>(id) - p.expert_begin;
    if (e < 0 || e >= p.experts) return;
    int seen = 0;
    for (int j = threadIdx.x; j < i; j += PREFETCH_THREADS) seen |= p.topk_ids[j] == id;
    if (__syncthreads_or(seen)) return;
    const long long left = per_expert - offset;
    const int bytes = static_cast<int>(left < PREFETCH_SEGMENT ? left : PREFETCH_SEGMENT);
    const uint8_t* at = pick_region(p.base, r) + e * per_expert + offset;
    if (BULK) {
        if (threadIdx.x == 0)
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at), "r"(bytes & ~15) : "memory");
    } else {
        for (int b = threadIdx.x * PREFETCH_LINE; b < bytes; b += PREFETCH_THREADS * PREFETCH_LINE)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(at + b));
    }
}

}  // namespace moe
}  // namespace fp4tune
