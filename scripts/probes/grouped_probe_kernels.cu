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


// ---- Bulk copies into a per-CTA ring (the "bulk" columns; ./grouped_probe bulk ...) ----
// One producer lane issues, per stage of KC k, cp.async.bulk copies of the CTA's BN paired weight
// rows (BN / 16 row groups: KC * 8 contiguous bytes of codes each, in the grouped layout), of their
// scales laid out per row group like the codes (KC contiguous bytes per row group and stage: a
// layout the prepare step could write; the swizzled layout puts 8 of a row group's scale bytes in
// each 32-byte sector) and of each routed row's activations (KC * 2 contiguous bytes per row), all
// completing on the stage's mbarrier; CONSUMERS warps wait for it, read the whole stage from shared
// memory (an XOR of every word) and release it. One tile per CTA, the CTA's rows over the whole K.
__device__ __forceinline__ void mbar_init(uint32_t a, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t a, uint32_t tx) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(tx) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t a) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(a), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t mbar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(mbar)
                 : "memory");
}

template <int BN, int KC, int STAGES, int CONSUMERS, int MINCTAS>
struct Bulk {
    static constexpr int GROUPS = BN / 16, BLOCK_N = BN, KCH = KC, NSTAGE = STAGES, CONS = CONSUMERS;
    static constexpr int MIN_CTAS = MINCTAS;
    static constexpr int CODE_BYTES = BN * KC / 2;
    static constexpr int SF_BYTES = BN * KC / 16;
    static constexpr int X_BYTES = 8 * KC * 2;
    static constexpr int STAGE_BYTES = CODE_BYTES + SF_BYTES + X_BYTES;
    static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 2 * STAGES * 8;
    static constexpr int THREADS = (CONSUMERS + 1) * 32;
};

template <class B>
__device__ __forceinline__ void bulk_walk(const moe::GroupedParams& p, const uint8_t* sf_grouped, unsigned* out) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (static_cast<int>(blockIdx.y) >= __ldg(p.tile_count)) return;
    const int4 t = reinterpret_cast<const int4*>(p.tiles)[blockIdx.y];  // expert, first row, rows
    const uint32_t base = ptx::smem_addr(smem);
    const uint32_t full = base + B::NSTAGE * B::STAGE_BYTES, empty = full + B::NSTAGE * 8;
    if (threadIdx.x == 0) {
        for (int s = 0; s < B::NSTAGE; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, B::CONS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int chunks = p.k / B::KCH;
    if (warp == B::CONS) {
        if (lane != 0) return;
        const size_t row_bytes = p.k / 2;
        const uint8_t* codes = p.w + static_cast<size_t>(t.x) * p.n * row_bytes +
                               static_cast<size_t>(blockIdx.x) * B::GROUPS * 16 * row_bytes;
        const uint8_t* sf = sf_grouped + static_cast<size_t>(t.x) * p.n * (p.k / 16) +
                            static_cast<size_t>(blockIdx.x) * B::GROUPS * 16 * (p.k / 16);
        const int rows = t.z;
        const uint8_t* xrow[8];
#pragma unroll
        for (int r = 0; r < 8; ++r)
            xrow[r] = r < rows ? p.a + static_cast<size_t>(__ldg(p.sorted_ids + t.y + r) / p.top_k) * p.k * 2 : nullptr;
        const uint32_t tx = B::CODE_BYTES + B::SF_BYTES + rows * B::KCH * 2;
        for (int c = 0; c < chunks; ++c) {
            const int s = c % B::NSTAGE;
            if (c >= B::NSTAGE) mbar_wait(empty + 8 * s, ((c / B::NSTAGE) - 1) & 1);
            const uint32_t st = base + s * B::STAGE_BYTES, bar = full + 8 * s;
            mbar_expect_tx(bar, tx);
            for (int g = 0; g < B::GROUPS; ++g) {
                bulk_copy(st + g * (B::KCH * 8), codes + g * 16 * row_bytes + static_cast<size_t>(c) * B::KCH * 8,
                          B::KCH * 8, bar);
                bulk_copy(st + B::CODE_BYTES + g * B::KCH, sf + g * 16 * (p.k / 16) + static_cast<size_t>(c) * B::KCH,
                          B::KCH, bar);
            }
#pragma unroll
            for (int r = 0; r < 8; ++r)
                if (r < rows)
                    bulk_copy(st + B::CODE_BYTES + B::SF_BYTES + r * B::KCH * 2, xrow[r] + static_cast<size_t>(c) * B::KCH * 2,
                          B::KCH * 2, bar);
        }
        return;
    }
    unsigned acc = 0;
    const int words = (B::CODE_BYTES + B::SF_BYTES + t.z * B::KCH * 2) / 16;
    for (int c = 0; c < chunks; ++c) {
        const int s = c % B::NSTAGE;
        mbar_wait(full + 8 * s, (c / B::NSTAGE) & 1);
        const uint32_t st = base + s * B::STAGE_BYTES;
        for (int i = warp * 32 + lane; i < words; i += B::CONS * 32) {
            const uint4 v = ptx::lds_v4(st + i * 16);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * s);
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}

// The variants: weight rows per CTA, k per stage, stages, consumer warps, CTAs per SM.
using B1 = Bulk<32, 512, 4, 4, 3>;
using B2 = Bulk<64, 512, 4, 4, 2>;
using B3 = Bulk<32, 256, 8, 4, 3>;
using B4 = Bulk<128, 256, 4, 4, 2>;
using B5 = Bulk<64, 256, 5, 2, 3>;
// per variant: threads, weight rows per CTA, dynamic shared memory
extern "C" __device__ const int bulk_cfg[5][3] = {{B1::THREADS, B1::BLOCK_N, B1::SMEM_BYTES},
                                                  {B2::THREADS, B2::BLOCK_N, B2::SMEM_BYTES},
                                                  {B3::THREADS, B3::BLOCK_N, B3::SMEM_BYTES},
                                                  {B4::THREADS, B4::BLOCK_N, B4::SMEM_BYTES},
                                                  {B5::THREADS, B5::BLOCK_N, B5::SMEM_BYTES}};
#define BULK_KERNEL(name, B) \
    extern "C" __global__ void __launch_bounds__(B::THREADS, B::MIN_CTAS) name(const moe::GroupedParams p, const uint8_t* sf, unsigned* out) { \
        bulk_walk<B>(p, sf, out); \
    }
BULK_KERNEL(bulk1, B1)
BULK_KERNEL(bulk2, B2)
BULK_KERNEL(bulk3, B3)
BULK_KERNEL(bulk4, B4)
BULK_KERNEL(bulk5, B5)

// The pick (its decode, MMAs and epilogue: Cfg's chunk_mma and Grouped::epilogue) fed by such a
// ring: Cfg's 32 weight rows over its 4 warps along K, one 128-k block per warp and stage of 512 k,
// STAGES stages behind the epilogue's split-K slots; the stage's codes as the grouped layout holds
// them (a lane reads the 16 bytes its own cp.async would have copied), the scales per row group
// and 128-k block as [row][8 bytes], the activation rows 16 bytes apart from one another in bank
// (a row every KC * 2 + 16 bytes). Its results are not the layer's (the scales are other bytes);
// its time is that of such a kernel.
// One warp's chunk from stage st of bulk copies: the 16 bytes of codes its lane reads in its
// block of each row group (at code_at + i * code_group), the lane's scale half-word in the row
// group's [row][8 bytes] scales (at sf_at + i * sf_group), its activation runs of the tile's 8
// rows (at x_at, x_row apart); k0 is the warp's first k in the stage.
__device__ __forceinline__ void read_bulk_chunk(sm90::WeightChunk<Cfg>& wc, sm90::ActivationChunk<Cfg>& ac, uint32_t st,
                                                int code_group, int code_at, int sf_at, int sf_group, int x_at,
                                                int x_row, int k0, int lane) {
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            wc.code[i][h] = ptx::lds_v4(st + i * code_group + code_at + h * 512 + lane * 16);
            const uint32_t word = ptx::lds_u32(st + sf_at + i * sf_group + k0 + (8 * h + g) * 8 + (tq >> 1) * 4);
            wc.sf[i][h] = static_cast<uint16_t>(word >> (16 * (tq & 1)));
        }
#pragma unroll
    for (int w = 0; w < 4; ++w) ac.v[0][w] = ptx::lds_v4(st + x_at + g * x_row + (k0 + 32 * tq + 8 * w) * 2);
}

template <int STAGES, int MINCTAS>
struct BulkPick {
    static constexpr int KC = Cfg::BLOCK_K, NSTAGE = STAGES, MIN_CTAS = MINCTAS;
    static constexpr int CODE_BYTES = Cfg::BLOCK_N * KC / 2;
    static constexpr int SF_BYTES = Cfg::BLOCK_N * KC / 16;
    static constexpr int X_ROW = KC * 2 + 16;
    static constexpr int STAGE_BYTES = CODE_BYTES + SF_BYTES + 8 * X_ROW;
    static constexpr int OFF = Cfg::OFF_RING;
    static constexpr int SMEM_BYTES = OFF + STAGES * STAGE_BYTES + 2 * STAGES * 8;
    static constexpr int THREADS = Cfg::THREADS + 32;
    static_assert(Cfg::BLOCK_M == 8 && Cfg::WARPS_N == 1 && Cfg::WARPS_K * 128 == KC, "one 128-k block per warp and stage");
};

template <class BP>
__device__ __forceinline__ void bulk_pick(const moe::GroupedParams& p, const uint8_t* sf_grouped) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (static_cast<int>(blockIdx.y) >= __ldg(p.tile_count)) return;
    const int4 t = reinterpret_cast<const int4*>(p.tiles)[blockIdx.y];
    const uint32_t base = ptx::smem_addr(smem) + BP::OFF;
    const uint32_t full = base + BP::NSTAGE * BP::STAGE_BYTES, empty = full + BP::NSTAGE * 8;
    if (tid == 0) {
        for (int s = 0; s < BP::NSTAGE; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, Cfg::WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int chunks = p.k / BP::KC;
    if (warp == Cfg::WARPS) {
        if (lane == 0) {
            const size_t row_bytes = p.k / 2;
            const uint8_t* codes = p.w + static_cast<size_t>(t.x) * p.n * row_bytes +
                                   static_cast<size_t>(blockIdx.x) * Cfg::BLOCK_N * row_bytes;
            const uint8_t* sf = sf_grouped + static_cast<size_t>(t.x) * p.n * (p.k / 16) +
                                static_cast<size_t>(blockIdx.x) * Cfg::BLOCK_N * (p.k / 16);
            const int rows = t.z;
            const uint8_t* xrow[8];
#pragma unroll
            for (int r = 0; r < 8; ++r)
                xrow[r] = r < rows ? p.a + static_cast<size_t>(__ldg(p.sorted_ids + t.y + r) / p.top_k) * p.k * 2 : nullptr;
            const uint32_t tx = BP::CODE_BYTES + BP::SF_BYTES + rows * BP::KC * 2;
            for (int c = 0; c < chunks; ++c) {
                const int s = c % BP::NSTAGE;
                if (c >= BP::NSTAGE) mbar_wait(empty + 8 * s, ((c / BP::NSTAGE) - 1) & 1);
                const uint32_t st = base + s * BP::STAGE_BYTES, bar = full + 8 * s;
                mbar_expect_tx(bar, tx);
#pragma unroll
                for (int g = 0; g < Cfg::P_TILES; ++g) {
                    bulk_copy(st + g * (BP::KC * 8), codes + g * 16 * row_bytes + static_cast<size_t>(c) * BP::KC * 8,
                              BP::KC * 8, bar);
                    bulk_copy(st + BP::CODE_BYTES + g * BP::KC, sf + g * 16 * (p.k / 16) + static_cast<size_t>(c) * BP::KC,
                              BP::KC, bar);
                }
#pragma unroll
                for (int r = 0; r < 8; ++r)
                    if (r < rows)
                        bulk_copy(st + BP::CODE_BYTES + BP::SF_BYTES + r * BP::X_ROW,
                                  xrow[r] + static_cast<size_t>(c) * BP::KC * 2, BP::KC * 2, bar);
            }
        }
        __syncthreads();  // the epilogue's two barriers (split-K slots written, slots read)
        __syncthreads();
        return;
    }
    const int wk = warp;
    float acc[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4];
    sm90::zero_accumulators<Cfg>(acc);
#pragma unroll 1
    for (int c = 0; c < chunks; ++c) {
        const int s = c % BP::NSTAGE;
        mbar_wait(full + 8 * s, (c / BP::NSTAGE) & 1);
        const uint32_t st = base + s * BP::STAGE_BYTES;
        sm90::WeightChunk<Cfg> wc;
        sm90::ActivationChunk<Cfg> ac;
        read_bulk_chunk(wc, ac, st, BP::KC * 8, wk * 1024, BP::CODE_BYTES, BP::KC, BP::CODE_BYTES + BP::SF_BYTES,
                        BP::X_ROW, wk * 128, lane);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * s);
        sm90::chunk_mma<Cfg>(wc, sm90::RingActivations<Cfg>{ac}, lane, acc);
    }
    sm90::fold_accumulators<Cfg>(acc);
    G::epilogue(p, smem, acc[0], t.x, t.y, t.z, blockIdx.x * Cfg::BLOCK_N, 0, wk, 0, lane, tid);
}

using P43 = BulkPick<4, 3>;
using P33 = BulkPick<3, 3>;
using P62 = BulkPick<6, 2>;
extern "C" __device__ const int bulk_pick_cfg[3][3] = {{P43::THREADS, Cfg::BLOCK_N, P43::SMEM_BYTES},
                                                       {P33::THREADS, Cfg::BLOCK_N, P33::SMEM_BYTES},
                                                       {P62::THREADS, Cfg::BLOCK_N, P62::SMEM_BYTES}};
#define BULK_PICK_KERNEL(name, BP) \
    extern "C" __global__ void __launch_bounds__(BP::THREADS, BP::MIN_CTAS) name(const moe::GroupedParams p, const uint8_t* sf, unsigned*) { \
        bulk_pick<BP>(p, sf); \
    }
BULK_PICK_KERNEL(bulk_pick43, P43)
BULK_PICK_KERNEL(bulk_pick33, P33)
BULK_PICK_KERNEL(bulk_pick62, P62)

// The pick's own warp ring (each warp its stages, no CTA barrier), filled by bulk copies instead
// of the lanes' cp.async: lane 0 of each warp copies its chunk (the 1 KB block of each of its 2
// row groups, their 128 bytes of scales, each routed row's 256 bytes of activations) onto the
// stage's mbarrier; the warp waits on it, reads the stage as bulk_pick does, and its lane 0 then
// refills the stage read one chunk earlier with the chunk STAGES - 1 ahead.
template <int STAGES, int MINCTAS, int X_PAD>
struct WarpBulk {
    static constexpr int NSTAGE = STAGES, MIN_CTAS = MINCTAS;
    static constexpr int CODE_BYTES = Cfg::P_TILES * 1024;
    static constexpr int SF_BYTES = Cfg::P_TILES * 128;
    static constexpr int X_ROW = 256 + X_PAD;  // X_PAD 16: rows 16 bytes apart in bank
    static constexpr int STAGE_BYTES = CODE_BYTES + SF_BYTES + 8 * X_ROW;
    static constexpr int OFF = Cfg::OFF_RING;
    static constexpr int SMEM_BYTES = OFF + Cfg::WARPS * STAGES * (STAGE_BYTES + 8);
    static constexpr int THREADS = Cfg::THREADS;
};

template <class WB>
__device__ __forceinline__ void warp_bulk(const moe::GroupedParams& p, const uint8_t* sf_grouped) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (static_cast<int>(blockIdx.y) >= __ldg(p.tile_count)) return;
    const int4 t = reinterpret_cast<const int4*>(p.tiles)[blockIdx.y];
    const int wk = warp;
    const uint32_t base = ptx::smem_addr(smem) + WB::OFF + warp * WB::NSTAGE * WB::STAGE_BYTES;
    const uint32_t full = ptx::smem_addr(smem) + WB::OFF + Cfg::WARPS * WB::NSTAGE * WB::STAGE_BYTES + warp * WB::NSTAGE * 8;
    const int chunks = p.k / Cfg::BLOCK_K;  // this warp's 128-k blocks: wk, wk + 4, ...
    const size_t row_bytes = p.k / 2;
    const uint8_t* codes = p.w + static_cast<size_t>(t.x) * p.n * row_bytes + static_cast<size_t>(blockIdx.x) * Cfg::BLOCK_N * row_bytes;
    const uint8_t* sf = sf_grouped + static_cast<size_t>(t.x) * p.n * (p.k / 16) +
                        static_cast<size_t>(blockIdx.x) * Cfg::BLOCK_N * (p.k / 16);
    const int rows = t.z;
    const uint8_t* xrow = lane < rows ? p.a + static_cast<size_t>(__ldg(p.sorted_ids + t.y + lane) / p.top_k) * p.k * 2 : nullptr;
    const uint32_t tx = WB::CODE_BYTES + WB::SF_BYTES + rows * 256;
    if (lane == 0) {
        for (int s = 0; s < WB::NSTAGE; ++s) mbar_init(full + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    // lane 0 issues the chunk; lanes 1 .. rows - 1 their own activation row
    const auto issue = [&](int c, int s) {
        const int kb = c * Cfg::WARPS_K + wk;
        const uint32_t st = base + s * WB::STAGE_BYTES, bar = full + 8 * s;
        if (lane == 0) {
            mbar_expect_tx(bar, tx);
#pragma unroll
            for (int i = 0; i < Cfg::P_TILES; ++i) {
                bulk_copy(st + i * 1024, codes + i * 16 * row_bytes + static_cast<size_t>(kb) * 1024, 1024, bar);
                bulk_copy(st + WB::CODE_BYTES + i * 128, sf + i * 16 * (p.k / 16) + static_cast<size_t>(kb) * 128, 128, bar);
            }
        }
        __syncwarp();
        if (lane < rows) bulk_copy(st + WB::CODE_BYTES + WB::SF_BYTES + lane * WB::X_ROW, xrow + static_cast<size_t>(kb) * 256, 256, bar);
    };
#pragma unroll
    for (int d = 0; d < WB::NSTAGE - 1; ++d) issue(d, d);
    float acc[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4];
    sm90::zero_accumulators<Cfg>(acc);
#pragma unroll 1
    for (int c = 0; c < chunks; ++c) {
        const int s = c % WB::NSTAGE;
        mbar_wait(full + 8 * s, (c / WB::NSTAGE) & 1);
        const uint32_t st = base + s * WB::STAGE_BYTES;
        sm90::WeightChunk<Cfg> wc;
        sm90::ActivationChunk<Cfg> ac;
        read_bulk_chunk(wc, ac, st, 1024, 0, WB::CODE_BYTES, 128, WB::CODE_BYTES + WB::SF_BYTES, WB::X_ROW, 0, lane);
        if (c + WB::NSTAGE - 1 < chunks) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            issue(c + WB::NSTAGE - 1, (c + WB::NSTAGE - 1) % WB::NSTAGE);
        }
        sm90::chunk_mma<Cfg>(wc, sm90::RingActivations<Cfg>{ac}, lane, acc);
    }
    sm90::fold_accumulators<Cfg>(acc);
    G::epilogue(p, smem, acc[0], t.x, t.y, t.z, blockIdx.x * Cfg::BLOCK_N, 0, wk, 0, lane, tid);
}

using W33 = WarpBulk<3, 3, 16>;
using W43 = WarpBulk<4, 3, 16>;
using W34 = WarpBulk<3, 4, 0>;
extern "C" __device__ const int warp_bulk_cfg[3][3] = {{W33::THREADS, Cfg::BLOCK_N, W33::SMEM_BYTES},
                                                       {W43::THREADS, Cfg::BLOCK_N, W43::SMEM_BYTES},
                                                       {W34::THREADS, Cfg::BLOCK_N, W34::SMEM_BYTES}};
#define WARP_BULK_KERNEL(name, WB) \
    extern "C" __global__ void __launch_bounds__(WB::THREADS, WB::MIN_CTAS) name(const moe::GroupedParams p, const uint8_t* sf, unsigned*) { \
        warp_bulk<WB>(p, sf); \
    }
WARP_BULK_KERNEL(warp_bulk33, W33)
WARP_BULK_KERNEL(warp_bulk43, W43)
WARP_BULK_KERNEL(warp_bulk34, W34)
