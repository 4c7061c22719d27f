// The kernels of grouped_probe.cu, compiled at run time with NVRTC (-I templates), as the product
// compiles its kernels: the pick's instantiation, its loads alone, and the read floor.
#include "moe/sm90.cuh"

using namespace fp4tune;
using Cfg = moe::GroupedConfig<8, 32, 512, 1, 4, 3, 1, false, true, 4, true>;
using G = moe::Grouped<Cfg, moe::OP_GATE_UP>;


// (out unused: every kernel on the pick's grid takes the same arguments)
extern "C" __global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_CTAS) pick(const moe::GroupedParams p, unsigned*) {
    G::run(p);
}

// The pick's A_SMEM walk (Grouped::run) without its arithmetic, for ring configuration C; with
// CONTIG the weight codes of a warp's chunk are read from one contiguous 2 KB block instead (chunk c
// of warp wk of n-tile x of an expert at ((x * WARPS_K + wk) * chunks + c) * 2 KB: the same bytes
// per expert, each warp instruction reading 512 contiguous bytes).
template <class C, bool CONTIG, bool MATH = false>
__device__ __forceinline__ void load_walk(const moe::GroupedParams& p, unsigned* out) {
    using W = moe::Grouped<C, moe::OP_GATE_UP>;
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wk = warp / C::WARPS_MN, wmn = warp % C::WARPS_MN;
    typename W::Walk walk;
    if (!walk.begin(p, wk, wmn, lane)) return;
    moe::GroupedRing<C> ring;
    ring.init(ptx::smem_addr(smem), warp);
    ring.base = ptx::opaque(ring.base);
    const size_t w_stride = static_cast<size_t>(p.n) * (p.k / 2);
    auto issue = [&](int slot) {
        if (CONTIG) {
            // the ring's own copies, the codes' row pointers moved onto the contiguous block (the
            // ring adds the chunk's block of the grouped layout, moe::chunk_codes, to them);
            // scales and activations as in the pick
            const uint8_t* blk = p.w + walk.it.x * w_stride +
                                 ((static_cast<size_t>(blockIdx.x) * C::WARPS_K + wk) * walk.cpt + walk.ic) * 2048 -
                                 moe::chunk_codes(walk.ahead.k);
            const uint8_t* code[C::P_TILES][2];
#pragma unroll
            for (int i = 0; i < C::P_TILES; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) code[i][h] = blk + (i * 2 + h) * 512 + lane * 16;
            ring.issue(code, walk.ptr.sf_row, walk.ptr.a_row, walk.it.z, walk.ahead.k, slot, lane);
        } else {
            ring.issue(walk.ptr.code_row, walk.ptr.sf_row, walk.ptr.a_row, walk.it.z, walk.ahead.k, slot, lane);
        }
    };
#pragma unroll
    for (int d = 0; d < C::DEPTH - 1; ++d) {
        issue(d);
        ptx::cp_async_commit();
        walk.issued();
    }
    unsigned acc = 0;
    float facc[C::ACC_SETS][C::P_TILES][C::Q_TILES][4];
    int4 ct = walk.it;
#pragma unroll 1
    for (int cy = blockIdx.y; cy < walk.count; cy += walk.step) {
        if (MATH) sm90::zero_accumulators<C>(facc);
#pragma unroll 1
        for (int base = 0; base < walk.cpt; base += C::DEPTH) {
#pragma unroll
            for (int d = 0; d < C::DEPTH; ++d) {
                const int refill = d == 0 ? C::DEPTH - 1 : d - 1;
                ptx::cp_async_wait<C::DEPTH - 2>();
                sm90::WeightChunk<C> wc;
                sm90::ActivationChunk<C> ac;
                ring.read(wc, ac, d, lane);
                walk.turn(p, lane);
                if (walk.issuing) {
                    issue(refill);
                    walk.issued();
                }
                ptx::cp_async_commit();
                if (MATH) {
                    sm90::chunk_mma<C>(wc, sm90::RingActivations<C>{ac}, lane, facc);
                } else {
#pragma unroll
                    for (int i = 0; i < C::P_TILES; ++i)
#pragma unroll
                        for (int h = 0; h < 2; ++h)
                            acc ^= wc.code[i][h].x ^ wc.code[i][h].y ^ wc.code[i][h].z ^ wc.code[i][h].w ^ wc.sf[i][h];
#pragma unroll
                    for (int q = 0; q < C::Q_TILES; ++q)
#pragma unroll
                        for (int w = 0; w < 4; ++w) acc ^= ac.v[q][w].x ^ ac.v[q][w].y ^ ac.v[q][w].z ^ ac.v[q][w].w;
                }
            }
        }
        if (MATH) {
            sm90::fold_accumulators<C>(facc);
            W::epilogue(p, smem, facc[0], ct.x, ct.y, ct.z, blockIdx.x * C::BLOCK_N, walk.p0, wk, wmn, lane, tid);
            ct = walk.pending;
        }
    }
    ptx::cp_async_wait<0>();
    if (acc == 0x9e3779b9u) out[0] = acc;
}

// The loads of the pick (3 stages, 4 CTAs per SM), of deeper rings at fewer CTAs per SM (about the
// same shared memory per SM: 4 stages at 3, 6 at 2), and of the pick with contiguous code blocks.
using C4 = moe::GroupedConfig<8, 32, 512, 1, 4, 4, 1, false, true, 3, true>;
using C6 = moe::GroupedConfig<8, 32, 512, 1, 4, 6, 1, false, true, 2, true>;
// What the host needs: the pick's threads, CTAs per SM and weight rows per CTA, then the dynamic
// shared memory of the pick (and the loads of its ring), of C4 and of C6.
extern "C" __device__ const int probe_cfg[6] = {Cfg::THREADS, Cfg::MIN_CTAS, Cfg::BLOCK_N,
                                                Cfg::SMEM_BYTES, C4::SMEM_BYTES, C6::SMEM_BYTES};
extern "C" __global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_CTAS) load_only(const moe::GroupedParams p, unsigned* out) {
    load_walk<Cfg, false>(p, out);
}
extern "C" __global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_CTAS) load_contig(const moe::GroupedParams p, unsigned* out) {
    load_walk<Cfg, true>(p, out);
}
// The pick itself (decode, MMAs, epilogue) reading its codes from the contiguous blocks: its
// results are not the layer's (the codes are other bytes), its time is that of such a layout.
extern "C" __global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_CTAS) pick_contig(const moe::GroupedParams p, unsigned* out) {
    load_walk<Cfg, true, true>(p, out);
}
extern "C" __global__ void __launch_bounds__(C4::THREADS, C4::MIN_CTAS) load_d4(const moe::GroupedParams p, unsigned* out) {
    load_walk<C4, false>(p, out);
}
extern "C" __global__ void __launch_bounds__(C6::THREADS, C6::MIN_CTAS) load_d6(const moe::GroupedParams p, unsigned* out) {
    load_walk<C6, false>(p, out);
}

// One CTA row per routed expert: its codes, then its scales, 16-byte streaming loads.
extern "C" __global__ void __launch_bounds__(256) floor_read(const uint8_t* w, const uint8_t* sf, const int* experts,
                                                  size_t w_stride, size_t sf_stride, unsigned* out) {
    const int e = experts[blockIdx.y];
    unsigned acc = 0;
    for (int part = 0; part < 2; ++part) {
        const uint4* base = reinterpret_cast<const uint4*>(part == 0 ? w + e * w_stride : sf + e * sf_stride);
        const size_t n = (part == 0 ? w_stride : sf_stride) / 16;
        const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
        size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
        for (; i + 7 * step < n; i += 8 * step) {
            uint4 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) v[u] = ptx::ldg_stream_v4(base + i + u * step);
#pragma unroll
            for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
        for (; i < n; i += step) {
            const uint4 v = ptx::ldg_stream_v4(base + i);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}

