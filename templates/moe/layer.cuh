// The fused decode layer (family sm90, bf16 activations): the routing, gate_up, down and the
// router-weighted sum of a small decode step (tokens * top_k <= LAYER_MAX_IDS routed ids) in one
// launch, so that the down projection's weights stream while gate_up still runs and no launch
// boundary or routing pass stands between them.
//
// Every CTA builds the step's schedule in shared memory from topk_ids (LayerRouting: the sorted
// rows of moe_align's stable counting sort, its inverse, and the 8-row tile list; the CPU mirror
// is moe::layer::routing), then takes work items from a counter until none is left:
//   items [0, tiles * NB1):  gate_up of tile i / NB1, weight rows block i % NB1 (the gate_up
//                            configuration's tile: its warp ring with the activations, GU::DEPTH
//                            stages), H into the sorted rows as the grouped gate_up writes it;
//                            then done[tile] += 1.
//   items from tiles * NB1:  down of tile j / NB2, output columns block j % NB2 (the down
//                            configuration's warp ring of weights): its first DN::DEPTH - 1 chunks
//                            of weights are copied at once, then the CTA waits until done[tile] ==
//                            NB1 and reads H (through L2), computes and writes Y_rows; each of its rows
//                            then counts one arrival for its token and column block, and the CTA
//                            whose arrival completes a token's local slots writes that token's
//                            columns of Y, summed in slot order (moe/finalize.cuh's sum: the bits
//                            of moe_finalize).
// Every gate_up item precedes every down item, so a CTA only waits for items that running CTAs
// have taken: no deadlock whatever the residency. Every counter is zeroed by the last to use it
// (a tile's last down block zeroes its two counts, the last arrival of a token and block its
// count, the CTA drawing the launch's last ticket the item counter), so each launch (a graph
// replay too) finds them zero. Tokens with no local slot get Y = 0.
//
// The per-row arithmetic is the grouped kernels' (Grouped<Cfg, OP>: TilePointers, chunk_mma,
// epilogue), chunk for chunk: the layer's H, Y_rows and Y are bit for bit those of align + the two
// grouped kernels of the same configurations + finalize.
//
// Launch contract (moe::layer::LayerConfig in Rust): grid (1, CTAs, 1), GU::THREADS threads,
// SMEM_BYTES of dynamic shared memory; counters: LayerParams::counters, layer_counter_words(hidden)
// int32 words, zero before the first launch.
#pragma once
#include "moe/finalize.cuh"
#include "moe/sm90.cuh"

namespace fp4tune {
namespace moe {

constexpr int LAYER_MAX_IDS = 64;
// Counter words: the item counter, then per tile the gate_up blocks done and the down blocks
// done, then arrivals per (token, column block of LAYER_MIN_BLOCK_N or more).
constexpr int LAYER_MIN_BLOCK_N = 64;
constexpr int LAYER_DONE = 1;
constexpr int LAYER_DOWN_DONE = LAYER_DONE + LAYER_MAX_IDS;
constexpr int LAYER_ARRIVALS = LAYER_DOWN_DONE + LAYER_MAX_IDS;
__host__ __device__ constexpr int layer_counter_words(int hidden) {
    return LAYER_ARRIVALS + LAYER_MAX_IDS * ((hidden + LAYER_MIN_BLOCK_N - 1) / LAYER_MIN_BLOCK_N);
}

struct LayerParams {
    const int32_t* topk_ids;     // [tokens, top_k] global expert ids
    const float* topk_weights;   // [tokens, top_k]
    const uint8_t* x;            // bf16 [tokens, hidden]
    const uint8_t* w13;          // gate_up codes (grouped layout), [experts][2 inter, hidden / 2]
    const uint8_t* w13_sf;
    const float* alpha13;
    const uint8_t* w2;           // down codes, [experts][hidden, inter / 2]
    const uint8_t* w2_sf;
    const float* alpha2;
    uint16_t* h;                 // bf16 H [routed rows, inter], sorted order
    uint16_t* y_rows;            // bf16 [routed rows, hidden], sorted order
    uint16_t* y;                 // bf16 [tokens, hidden]
    int32_t* counters;           // layer_counter_words(hidden), zero between launches
    int tokens;
    int top_k;
    int expert_begin;  // global id of local expert 0
    int experts;       // local experts
    int hidden;
    int inter;
};

// The step's schedule, as moe_align writes it for LAYER_MAX_IDS ids or fewer: flat[r] the flat id
// (token * top_k + slot) of sorted row r, pos[f] the sorted row of flat id f (-1: not local),
// tiles[i] = (local expert, first sorted row, rows <= 8, 0) in expert order (moe_align's 8-row
// list), local[t] the local slots of token t.
struct LayerRouting {
    int32_t expert[LAYER_MAX_IDS];  // local expert of flat id f, -1 when not local or past the ids
    int32_t flat[LAYER_MAX_IDS];
    int32_t pos[LAYER_MAX_IDS];
    int32_t start[LAYER_MAX_IDS];  // sorted row r starts a tile
    int32_t local[LAYER_MAX_IDS];
    int4 tiles[LAYER_MAX_IDS];
    int32_t finishing[8];          // a down item's rows: the token it completes, or -1
    int rows;
    int tile_count;
    int item;
};

// 16 bytes through L2 only (data other CTAs of this launch wrote: H, Y_rows).
__device__ __forceinline__ uint4 ldcg_v4(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ int ld_acquire_gpu(const int32_t* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

template <class GU, class DN>
struct DecodeLayer {
    static constexpr int THREADS = GU::THREADS;
    static constexpr int MIN_CTAS = GU::MIN_CTAS < DN::MIN_CTAS ? GU::MIN_CTAS : DN::MIN_CTAS;
    static constexpr int SMEM_BYTES = GU::SMEM_BYTES > DN::SMEM_BYTES ? GU::SMEM_BYTES : DN::SMEM_BYTES;
    static_assert(GU::THREADS == DN::THREADS, "the two projections' tiles have one CTA size");
    static_assert(THREADS >= LAYER_MAX_IDS, "a thread per routed id builds the schedule");
    static_assert(GU::BLOCK_M == 8 && DN::BLOCK_M == 8, "the layer's tiles hold 8 routed rows");
    static_assert(GU::SPLIT_K == 1 && DN::SPLIT_K == 1, "no split-K cluster in the fused layer");
    static_assert(!GU::A_FP4 && !DN::A_FP4, "bf16 activations");
    static_assert(GU::A_SMEM && !GU::FLOW, "gate_up: the warp ring with the activations");
    static_assert(DN::WARP_RING && !DN::A_SMEM, "down: the warp ring of weights, copied before H is ready");
    static_assert(DN::BLOCK_N >= LAYER_MIN_BLOCK_N && DN::BLOCK_N % 8 == 0,
                  "down column blocks of LAYER_MIN_BLOCK_N or more (the arrival counters)");
    static_assert(MIN_CTAS * (SMEM_BYTES + static_cast<int>(sizeof(LayerRouting)) + 1024) <= 233472,
                  "MIN_CTAS CTAs' shared memory over the 228 KiB of an SM");

    using GateUp = Grouped<GU, OP_GATE_UP>;
    using Down = Grouped<DN, OP_DOWN>;

    // The schedule of the step (LayerRouting), built by every CTA; returns after a barrier.
    __device__ __forceinline__ static void route(const LayerParams& p, LayerRouting& r, int tid) {
        const int ids = p.tokens * p.top_k;
        if (tid < LAYER_MAX_IDS) {
            int e = -1;
            if (tid < ids) {
                const int le = p.topk_ids[tid] - p.expert_begin;
                e = le >= 0 && le < p.experts ? le : -1;
            }
            r.expert[tid] = e;
        }
        __syncthreads();
        // the sorted row of flat id tid: ids of smaller experts, then those of its expert before it
        int row = -1, in_expert = 0;
        if (tid < LAYER_MAX_IDS) {
            const int e = r.expert[tid];
            if (e >= 0) {
                int before = 0;
                for (int j = 0; j < LAYER_MAX_IDS; ++j) {
                    const int ej = r.expert[j];
                    before += ej >= 0 && ej < e;
                    in_expert += ej == e && j < tid;
                }
                row = before + in_expert;
                r.flat[row] = tid;
            }
            r.pos[tid] = row;
            if (tid < p.tokens) {
                int n = 0;
                for (int s = 0; s < p.top_k; ++s) n += r.expert[tid * p.top_k + s] >= 0;
                r.local[tid] = n;
            }
        }
        // a tile starts at every eighth row of an expert
        const int rows = __syncthreads_count(row >= 0);
        if (row >= 0) r.start[row] = in_expert % 8 == 0;
        __syncthreads();
        if (tid < rows && r.start[tid]) {
            int tile = 0;
            for (int q = 0; q < tid; ++q) tile += r.start[q];
            const int e = r.expert[r.flat[tid]];
            int n = 1;
            while (n < 8 && tid + n < rows && r.expert[r.flat[tid + n]] == e) ++n;
            r.tiles[tile] = make_int4(e, tid, n, 0);
        }
        const int tiles = __syncthreads_count(tid < rows && r.start[tid]);
        if (tid == 0) {
            r.rows = rows;
            r.tile_count = tiles;
        }
        __syncthreads();
    }

    // gate_up of one tile and weight rows block: the grouped gate_up's warp ring with the
    // activations, walked over one tile.
    __device__ __forceinline__ static void gate_up(const LayerParams& p, const LayerRouting& r, uint8_t* smem,
                                                   int4 tile, int block, int tid) {
        const int lane = tid & 31;
        const int warp = tid >> 5;
        const int wk = warp / GU::WARPS_MN;
        const int wmn = warp % GU::WARPS_MN;
        const GroupedParams gp{p.x,    nullptr, p.w13,   p.w13_sf, p.alpha13,  p.h,   r.flat, nullptr, nullptr,
                               nullptr, nullptr, 0.0f,   2 * p.inter, p.hidden, p.top_k};
        int src[GU::Q_TILES];
        GateUp::sources(gp, tile, lane, src);
        const int p0 = block * GU::BLOCK_N + wmn * GU::WARP_P;  // (grid x is 1: n0 = 0)
        typename GateUp::TilePointers ptr;
        ptr.point(gp, tile.x, src, p0, lane);
        GroupedRing<GU> ring;
        ring.init(ptx::smem_addr(smem), warp);
        ring.base = ptx::opaque(ring.base);
        const int cpt = p.hidden / GU::BLOCK_K * GU::CHUNKS;
        sm90::ChunkCursor<GU> ahead{wk * GU::K_PER_WARP, 0};
#pragma unroll
        for (int d = 0; d < GU::DEPTH - 1; ++d) {
            if (d < cpt) {
                ring.issue(ptr.code_row, ptr.sf_row, ptr.a_row, tile.z, ahead.k, d, lane);
                ahead.next();
            }
            ptx::cp_async_commit();
        }
        float acc[GU::ACC_SETS][GU::P_TILES][GU::Q_TILES][4];
        sm90::zero_accumulators<GU>(acc);
        int slot = 0;
#pragma unroll 1
        for (int c = 0; c < cpt; ++c) {
            const int refill = slot == 0 ? GU::DEPTH - 1 : slot - 1;
            ptx::cp_async_wait<GU::DEPTH - 2>();
            sm90::WeightChunk<GU> wc;
            sm90::ActivationChunk<GU> ac;
            ring.read(wc, ac, slot, lane);
            if (c + GU::DEPTH - 1 < cpt) {
                ring.issue(ptr.code_row, ptr.sf_row, ptr.a_row, tile.z, ahead.k, refill, lane);
                ahead.next();
            }
            ptx::cp_async_commit();
            sm90::chunk_mma<GU>(wc, sm90::RingActivations<GU>{ac}, lane, acc);
            slot = slot == GU::DEPTH - 1 ? 0 : slot + 1;
        }
        ptx::cp_async_wait<0>();
        sm90::fold_accumulators<GU>(acc);
        GateUp::epilogue(gp, smem, acc[0], tile.x, tile.y, tile.z, block * GU::BLOCK_N, wmn * GU::WARP_P, wk, wmn,
                         lane, tid);
    }

    // H of the lane's rows at chunk k0, through L2 (ActivationChunk's bf16 runs).
    __device__ __forceinline__ static void load_h(sm90::ActivationChunk<DN>& ac, const uint8_t* const (&row)[DN::Q_TILES],
                                                  int k0) {
#pragma unroll
        for (int q = 0; q < DN::Q_TILES; ++q)
#pragma unroll
            for (int w = 0; w < 4; ++w) ac.v[q][w] = ldcg_v4(row[q] + k0 * 2 + 16 * w);
    }

    // down of one tile and output columns block: the weights of its first DN::DEPTH - 1 chunks
    // are copied into the warp ring at once, then H is awaited (done[tile] == gate_up blocks),
    // then the ring runs on.
    __device__ __forceinline__ static void down(const LayerParams& p, const LayerRouting& r, uint8_t* smem, int4 tile,
                                                int tile_index, int block, int gate_up_blocks, int tid) {
        const int lane = tid & 31;
        const int warp = tid >> 5;
        const int wk = warp / DN::WARPS_MN;
        const int wmn = warp % DN::WARPS_MN;
        const GroupedParams dp{reinterpret_cast<const uint8_t*>(p.h), nullptr, p.w2, p.w2_sf, p.alpha2, p.y_rows,
                               r.flat, nullptr, nullptr, nullptr, nullptr, 0.0f, p.hidden, p.inter, p.top_k};
        int src[DN::Q_TILES];
        Down::sources(dp, tile, lane, src);
        typename Down::TilePointers ptr;
        ptr.point(dp, tile.x, src, block * DN::BLOCK_N + wmn * DN::WARP_P, lane);
        sm90::WarpRing<DN> ring;
        ring.init(ptx::smem_addr(smem), warp, lane);
        ring.base = ptx::opaque(ring.base);
        const int cpt = p.inter / DN::BLOCK_K * DN::CHUNKS;
        sm90::ChunkCursor<DN> wcur{wk * DN::K_PER_WARP, 0};
        sm90::ChunkCursor<DN> acur = wcur;
#pragma unroll
        for (int d = 0; d < DN::DEPTH - 1; ++d) {
            if (d < cpt) {
                issue_weights<DN>(ring, ptr.code_row, ptr.sf_row, wcur.k, d, lane);
                wcur.next();
            }
            ptx::cp_async_commit();
        }
        if (tid == 0) {
            // polled with a growing pause: the waiting CTAs' loads must not crowd the L2 that
            // the gate_up blocks stream through
            const int32_t* done = p.counters + LAYER_DONE + tile_index;
            unsigned pause = 128;
            while (ld_acquire_gpu(done) < gate_up_blocks) {
                __nanosleep(pause);
                pause = pause < 1024 ? 2 * pause : pause;
            }
        }
        __syncthreads();
        // H of the next chunk is loaded while the current one is computed (two buffers), or, for
        // tiles of 3 or more m16 tiles per warp (their registers), right before its chunk
        constexpr int H_BUFS = DN::P_TILES >= 3 ? 1 : 2;
        sm90::ActivationChunk<DN> h[H_BUFS];
        if constexpr (H_BUFS == 2) {
            load_h(h[0], ptr.a_row, acur.k);
            acur.next();
        }
        float acc[DN::ACC_SETS][DN::P_TILES][DN::Q_TILES][4];
        sm90::zero_accumulators<DN>(acc);
        int slot = 0;
#pragma unroll 1
        for (int c = 0; c < cpt; c += H_BUFS) {
#pragma unroll
            for (int e = 0; e < H_BUFS; ++e) {
                if (c + e < cpt) {
                    if (H_BUFS == 1 || c + e + 1 < cpt) {
                        load_h(h[H_BUFS == 1 ? 0 : e ^ 1], ptr.a_row, acur.k);
                        acur.next();
                    }
                    const int refill = slot == 0 ? DN::DEPTH - 1 : slot - 1;
                    ptx::cp_async_wait<DN::DEPTH - 2>();
                    sm90::WeightChunk<DN> wc;
                    ring.read(wc, slot, lane);
                    if (c + e + DN::DEPTH - 1 < cpt) {
                        issue_weights<DN>(ring, ptr.code_row, ptr.sf_row, wcur.k, refill, lane);
                        wcur.next();
                    }
                    ptx::cp_async_commit();
                    sm90::chunk_mma<DN>(wc, sm90::RingActivations<DN>{h[e]}, lane, acc);
                    slot = slot == DN::DEPTH - 1 ? 0 : slot + 1;
                }
            }
        }
        ptx::cp_async_wait<0>();
        sm90::fold_accumulators<DN>(acc);
        Down::epilogue(dp, smem, acc[0], tile.x, tile.y, tile.z, block * DN::BLOCK_N, wmn * DN::WARP_P, wk, wmn, lane,
                       tid);
    }

    // After a down item: each of its rows arrives for (token, block); the CTA whose arrival
    // completes a token's local slots writes the token's columns of the block.
    __device__ __forceinline__ static void arrive(const LayerParams& p, LayerRouting& r, int4 tile, int tile_index,
                                                  int block, int blocks, int tid) {
        __threadfence();
        __syncthreads();
        if (tid == 32) {
            // the tile's last down block: nobody waits for its gate_up count any more
            int32_t* down_done = p.counters + LAYER_DOWN_DONE + tile_index;
            if (atomicAdd(down_done, 1) == blocks - 1) {
                p.counters[LAYER_DONE + tile_index] = 0;
                *down_done = 0;
            }
        }
        if (tid < tile.z) {
            const int t = r.flat[tile.y + tid] / p.top_k;
            int32_t* count = p.counters + LAYER_ARRIVALS + t * blocks + block;
            const bool last = atomicAdd(count, 1) == r.local[t] - 1;
            if (last) {
                *count = 0;  // every slot of (t, block) has arrived: nobody else touches it this launch
                __threadfence();
            }
            r.finishing[tid] = last ? t : -1;
        }
        __syncthreads();
        constexpr int VECS = DN::BLOCK_N / 8;
        for (int i = tid; i < tile.z * VECS; i += THREADS) {
            const int t = r.finishing[i / VECS];
            const int c = block * DN::BLOCK_N + (i % VECS) * 8;
            if (t < 0 || c >= p.hidden) continue;
            float acc[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
            for (int s = 0; s < p.top_k; ++s) {
                const int row = r.pos[t * p.top_k + s];
                if (row < 0) continue;
                accumulate_slot(acc, p.topk_weights[t * p.top_k + s],
                                ldcg_v4(p.y_rows + static_cast<size_t>(row) * p.hidden + c));
            }
            *reinterpret_cast<uint4*>(p.y + static_cast<size_t>(t) * p.hidden + c) = pack_sum(acc);
        }
    }

    __device__ __forceinline__ static void run(const LayerParams& p) {
        extern __shared__ __align__(128) uint8_t smem[];
        __shared__ LayerRouting r;
        const int tid = threadIdx.x;
        if (p.tokens * p.top_k > LAYER_MAX_IDS || p.hidden % GU::BLOCK_K != 0 || p.inter % DN::BLOCK_K != 0 ||
            (p.hidden & 15) != 0 || (p.inter & 15) != 0)
            return;  // configurations the Rust-side check refuses
        route(p, r, tid);
        // tokens without a local slot: Y = 0 (moe_finalize's empty sum)
        if (blockIdx.y == 0)
            for (int i = tid; i < p.tokens * (p.hidden / 8); i += THREADS) {
                const int t = i / (p.hidden / 8);
                if (r.local[t] == 0)
                    *reinterpret_cast<uint4*>(p.y + static_cast<size_t>(t) * p.hidden + (i % (p.hidden / 8)) * 8) =
                        make_uint4(0u, 0u, 0u, 0u);
            }
        const int gate_up_blocks = (2 * p.inter + GU::BLOCK_N - 1) / GU::BLOCK_N;
        const int down_blocks = (p.hidden + DN::BLOCK_N - 1) / DN::BLOCK_N;
        const int gate_up_items = r.tile_count * gate_up_blocks;
        const int items = gate_up_items + r.tile_count * down_blocks;
#pragma unroll 1
        for (;;) {
            __syncthreads();  // the previous item's shared memory and r.item are free
            if (tid == 0) r.item = atomicAdd(p.counters, 1);
            __syncthreads();
            const int item = r.item;
            if (item >= items) break;
            if (item < gate_up_items) {
                const int ti = item / gate_up_blocks;
                gate_up(p, r, smem, r.tiles[ti], item % gate_up_blocks, tid);
                // H of this block is written: publish it
                __threadfence();
                __syncthreads();
                if (tid == 0) atomicAdd(p.counters + LAYER_DONE + ti, 1);
            } else {
                const int j = item - gate_up_items;
                const int ti = j / down_blocks;
                const int block = j % down_blocks;
                down(p, r, smem, r.tiles[ti], ti, block, gate_up_blocks, tid);
                arrive(p, r, r.tiles[ti], ti, block, down_blocks, tid);
            }
        }
        // Every CTA draws exactly one ticket past the items: the one that draws the launch's last
        // ticket comes after every other draw, so it zeroes the item counter for the next launch.
        if (tid == 0 && r.item == items + static_cast<int>(gridDim.y) - 1) p.counters[0] = 0;
    }
};

}  // namespace moe
}  // namespace fp4tune
