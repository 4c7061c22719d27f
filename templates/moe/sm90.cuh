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
// Where the weights wait between their load and their decode (GroupedConfig::WARP_RING):
// - the register ring: DEPTH chunks of weights and activations in each lane's registers;
// - the warp ring: the weights of DEPTH chunks in the warp's own shared memory, filled by the
//   lanes' cp.async copies (each lane copies exactly the bytes it later reads, so nothing but
//   cp.async.wait_group orders them: no barrier), DEPTH - 1 chunks in flight; the activations stay
//   in a register ring of DEPTH entries. The registers the weights leave free buy occupancy.
// - the warp ring with the activations (A_SMEM, bf16): each stage also holds the lanes' bf16
//   runs of the chunk, copied through L1 by the same cp.async group as its weights (rows past
//   the tile's zero-filled) and read back by the lane that copied them, so no activation ring is
//   held in registers (16 registers per stage and n8 tile); a stage keeps its scale words once
//   per pair of lanes that share them. Deeper rings at more CTAs per SM.
// - the same ring running on across tiles (A_SMEM and FLOW): chunk c of the CTA's walk waits in
//   stage c % DEPTH whatever tile it belongs to, so DEPTH need not divide a tile's chunks and the
//   issue side may run several tiles ahead; each tile's info for its epilogue is read by the
//   consumer when the tile starts. A short K (2 chunks per warp and tile) keeps up to DEPTH - 1
//   chunks in flight across the walk's tiles instead of one.
//
// Launch contract (moe::GroupedConfig in Rust): grid (ceil(N / BLOCK_N), grid_y, SPLIT_K), THREADS
// threads, SMEM_BYTES of dynamic shared memory, cluster (1, 1, SPLIT_K) when SPLIT_K > 1.
#pragma once
#include "moe/epilogue.cuh"
#include "moe/layout.cuh"
#include "moe/params.cuh"
#include "sm90/direct.cuh"

namespace fp4tune {
namespace moe {

// The grouped kernel's configuration. The tile, its warps, the chunk walk and the split-K slots
// are those of the register-streamed GEMM (sm90::DirectConfig with its activations in registers,
// A_GLOBAL); the ring (its depth, where the weights wait, the register and shared-memory budgets
// of MIN_CTAS CTAs per SM) is the grouped kernel's own and is checked here. The base is
// instantiated with a ring of depth 1 for one CTA per SM, so that only these checks apply.
template <int BLOCK_M_, int BLOCK_N_, int BLOCK_K_, int WARPS_N_, int WARPS_K_, int DEPTH_, int SPLIT_K_, bool A_FP4_,
          bool WARP_RING_, int MIN_CTAS_, bool A_SMEM_ = false, bool FLOW_ = false>
struct GroupedConfig
    : sm90::DirectConfig<BLOCK_M_, BLOCK_N_, BLOCK_K_, WARPS_N_, WARPS_K_, 1, SPLIT_K_, A_FP4_, false, true, 1> {
    using Tile = sm90::DirectConfig<BLOCK_M_, BLOCK_N_, BLOCK_K_, WARPS_N_, WARPS_K_, 1, SPLIT_K_, A_FP4_, false, true, 1>;
    static constexpr int DEPTH = DEPTH_;
    static constexpr bool WARP_RING = WARP_RING_;
    static constexpr int MIN_CTAS = MIN_CTAS_;
    static constexpr bool A_SMEM = A_SMEM_;
    static constexpr bool FLOW = FLOW_;
    static constexpr bool W_ORDERED = true;  // the layer's weight codes are in the decode order
    static constexpr int REGISTER_CAP = sm90::cmin(65536 / (Tile::THREADS * MIN_CTAS) / 8 * 8, 255);  // per lane
    // Registers of the register ring: DEPTH entries of the weights (register ring only: per m16
    // tile 2 x (4 code words + 1 scale half-word pair)) and the activations (per n8 tile the
    // lane's 32-k run: 16 words of bf16, or 4 code words + 1 scale word).
    static constexpr int RING_REGS =
        ((WARP_RING ? 0 : Tile::P_TILES * 10) + (A_SMEM ? 0 : Tile::Q_TILES * (A_FP4_ ? 5 : 16))) * DEPTH;
    // The warp ring (sm90::WarpRing's layout): per stage, per m16 tile and row half, 32 lanes x 16
    // bytes of codes, then 32 lanes x 4 bytes of scale words; behind the split-K slots. With
    // A_SMEM (GroupedRing's layout): the codes, 16 scale words per m16 tile and row half, then per
    // n8 tile 4 x 32 lanes x 16 bytes of bf16 activations.
    static constexpr int RING_STAGE_BYTES =
        !WARP_RING ? 0
                   : (A_SMEM ? Tile::P_TILES * 2 * (512 + 64) + Tile::Q_TILES * 4 * 512 : Tile::P_TILES * 2 * (512 + 128));
    static constexpr int OFF_RING = sm90::align128(Tile::SLOT_BYTES);
    static constexpr int RING_BYTES = Tile::WARPS * DEPTH * RING_STAGE_BYTES;
    static constexpr int SMEM_BYTES = sm90::cmax(WARP_RING ? OFF_RING + RING_BYTES : Tile::SLOT_BYTES, 16);

    static_assert(!A_SMEM || (WARP_RING && !A_FP4_),
                  "the activations ride in the warp ring (A_SMEM) with bf16 activations only");
    static_assert(!FLOW || A_SMEM, "the ring runs on across tiles (FLOW) with the activations in it (A_SMEM)");
    static_assert(DEPTH >= (WARP_RING ? 2 : 1) && DEPTH <= 8,
                  "DEPTH must be 1..8 chunks (register ring) or 2..8 stages (warp ring)");
    static_assert(MIN_CTAS >= 1 && MIN_CTAS <= 16 && Tile::THREADS * MIN_CTAS <= 2048,
                  "MIN_CTAS CTAs of THREADS threads must fit in one SM (2048 threads)");
    static_assert(RING_REGS <= sm90::cmin(112, REGISTER_CAP - 64),
                  "the register ring over its budget (112 registers per lane, and 64 below the register cap of "
                  "MIN_CTAS CTAs of THREADS threads)");
    static_assert(MIN_CTAS * (SMEM_BYTES + 1024) <= 233472,
                  "MIN_CTAS CTAs' shared memory (ring and split-K slots) over the 228 KiB of an SM");
};

// The codes of a row's chunk at k0 (a multiple of 128) in the grouped layout (moe/layout.cuh):
// one 1 KB block per chunk, so a lane's pointer at k = 0 moves by a block per chunk.
__device__ __forceinline__ int chunk_codes(int k0) { return (k0 >> 7) * CODE_BLOCK_BYTES; }

// sm90::WeightChunk::load and sm90::WarpRing::issue (direct.cuh, the GEMM's ModelOpt rows) with the
// codes of the grouped layout: the same lane bytes and scales, the codes' chunk step a block.
template <class Cfg>
__device__ __forceinline__ void load_weights(sm90::WeightChunk<Cfg>& wc, const uint8_t* const (&code_row)[Cfg::P_TILES][2],
                                             const uint8_t* const (&sf_row)[Cfg::P_TILES][2], int k0) {
#pragma unroll
    for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) wc.code[i][h] = ptx::ldg_stream_v4(code_row[i][h] + chunk_codes(k0));
#pragma unroll
    for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) wc.sf[i][h] = ptx::ldg_u16(sf_row[i][h] + (k0 >> 6) * 512);
}

template <class Cfg>
__device__ __forceinline__ void issue_weights(const sm90::WarpRing<Cfg>& ring,
                                              const uint8_t* const (&code_row)[Cfg::P_TILES][2],
                                              const uint8_t* const (&sf_word_row)[Cfg::P_TILES][2], int k0, int slot,
                                              int lane) {
#pragma unroll
    for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) ptx::cp_async_cg_16(ring.code_at(slot, i, h), code_row[i][h] + chunk_codes(k0), 16u);
#pragma unroll
    for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            ptx::cp_async_ca_4(ring.sf_at(slot, i, h, lane), sf_word_row[i][h] + (k0 >> 6) * 512, 4u);
}

// This warp's ring of weights and activations (GroupedConfig::A_SMEM): stage slot holds the code
// runs [i][h][lane] (16 bytes), the scale words [i][h][g][t / 2] (the lanes t and t ^ 1 read the
// same word; the even one copies it), then the bf16 runs [q][w][lane] (16 bytes): every LDS.128
// of the warp reads 512 contiguous bytes.
template <class Cfg>
struct GroupedRing {
    static constexpr int OFF_SF = Cfg::P_TILES * 2 * 512;
    static constexpr int OFF_A = OFF_SF + Cfg::P_TILES * 2 * 64;
    uint32_t base;  // shared address of stage 0 of this warp's ring

    __device__ __forceinline__ void init(uint32_t smem_base, int warp) {
        base = smem_base + Cfg::OFF_RING + warp * Cfg::DEPTH * Cfg::RING_STAGE_BYTES;
    }
    __device__ __forceinline__ uint32_t code_at(int slot, int i, int h, int lane) const {
        return base + slot * Cfg::RING_STAGE_BYTES + ((i * 2 + h) * 32 + lane) * 16;
    }
    __device__ __forceinline__ uint32_t sf_at(int slot, int i, int h, int lane) const {
        return base + slot * Cfg::RING_STAGE_BYTES + OFF_SF + ((i * 2 + h) * 16 + (lane >> 1)) * 4;
    }
    __device__ __forceinline__ uint32_t a_at(int slot, int q, int w, int lane) const {
        return base + slot * Cfg::RING_STAGE_BYTES + OFF_A + ((q * 4 + w) * 32 + lane) * 16;
    }

    // cp.async.ca, 16 bytes: through L1, where the activation rows that the CTAs of one tile on
    // an SM share (and the register ring's ld.global.nc finds) stay; src_bytes = 0 zero-fills.
    __device__ __forceinline__ static void copy_ca_16(uint32_t dst, const void* src, uint32_t src_bytes) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                     : "memory");
    }

    // cp.async of chunk k0 into slot: the weights as sm90::WarpRing::issue (sf_word_row: the
    // 4-byte scale word that holds the lane's two scale bytes), the activations as
    // sm90::ActivationChunk::load (bf16 runs) for the tile's rows (rows of them); the lanes of
    // the rows past them zero-fill theirs (their products are never stored) instead of copying
    // the clamped row again: copies from one global address into many shared ones are not merged
    // the way one load's lanes are.
    __device__ __forceinline__ void issue(const uint8_t* const (&code_row)[Cfg::P_TILES][2],
                                          const uint8_t* const (&sf_word_row)[Cfg::P_TILES][2],
                                          const uint8_t* const (&a_row)[Cfg::Q_TILES], int rows, int k0, int slot,
                                          int lane) const {
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                ptx::cp_async_cg_16(code_at(slot, i, h, lane), code_row[i][h] + chunk_codes(k0), 16u);
        if ((lane & 1) == 0) {
#pragma unroll
            for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    ptx::cp_async_ca_4(sf_at(slot, i, h, lane), sf_word_row[i][h] + (k0 >> 6) * 512, 4u);
        }
#pragma unroll
        for (int q = 0; q < Cfg::Q_TILES; ++q) {
            const uint32_t bytes = 8 * q + (lane >> 2) < rows ? 16u : 0u;
#pragma unroll
            for (int w = 0; w < 4; ++w)
                copy_ca_16(a_at(slot, q, w, lane), a_row[q] + k0 * 2 + 16 * w, bytes);
        }
    }

    // The lane's own bytes of slot (t = lane % 4 selects the scale half-word).
    __device__ __forceinline__ void read(sm90::WeightChunk<Cfg>& wc, sm90::ActivationChunk<Cfg>& ac, int slot,
                                         int lane) const {
        const int t = lane & 3;
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                wc.code[i][h] = ptx::lds_v4(code_at(slot, i, h, lane));
                wc.sf[i][h] = static_cast<uint16_t>(ptx::lds_u32(sf_at(slot, i, h, lane)) >> (16 * (t & 1)));
            }
#pragma unroll
        for (int q = 0; q < Cfg::Q_TILES; ++q)
#pragma unroll
            for (int w = 0; w < 4; ++w) ac.v[q][w] = ptx::lds_v4(a_at(slot, q, w, lane));
    }
};

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
                    // m16 tile i is paired rows rho0 .. rho0 + 15 (moe/layout.cuh; clamped to the
                    // last tile: its rows are never stored), the lane's row 8h + g of them
                    const int rho0 = min(n0 + p0 + 16 * i, p.n - CODE_GROUP_ROWS);
                    int row;
                    if constexpr (OP == OP_GATE_UP) {
                        row = rho0 / 2 + g + h * (p.n / 2);
                    } else {
                        row = rho0 + 8 * h + g;
                    }
                    code_row[i][h] = ptx::opaque_ptr(w + code_group(rho0, p.k / 2) + h * 512 + lane * 16);
                    // register ring: the lane's two scale bytes (blocks 2t, 2t + 1); warp ring: the
                    // 4-byte word that holds them (blocks 4 (t / 2) ..), which cp.async copies whole
                    sf_row[i][h] = ptx::opaque_ptr(w_sf + swizzled_sf_offset(static_cast<uint32_t>(row),
                                                                             Cfg::WARP_RING ? 4 * (t >> 1) : 2 * t,
                                                                             ksf_pad));
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
    // CPT chunks per warp (same K slice), and a chunk is requested as soon as its ring entry is
    // free, also when it belongs to the next tile, so a warp never waits for a tile to start. The
    // issue side runs at most one tile ahead (DEPTH <= CPT; with FLOW any number of tiles); the
    // tile after it (info and, for the gather, its token rows) is fetched one tile earlier still,
    // so a switch does not stall.
    struct Walk {
        const int4* tiles;
        int count;  // tiles in the list
        int step;   // gridDim.y
        int cpt;    // chunks per tile of this warp
        sm90::ChunkCursor<Cfg> first;  // this warp's first chunk of every tile
        int p0;

        // The issue side.
        int iy;         // the tile being issued
        int4 it;        // its info
        int4 it_next;   // the next tile's info
        int src_next[Cfg::Q_TILES];
        TilePointers ptr;
        sm90::ChunkCursor<Cfg> ahead;  // the next chunk to issue
        int ic;                        // chunks of tile iy issued
        bool issuing;
        int4 pending;  // the tile the issue side moved to (consumed next)

        // false: nothing for this CTA, or a configuration the Rust-side check refuses.
        __device__ __forceinline__ bool begin(const GroupedParams& p, int wk, int wmn, int lane) {
            if (p.k % Cfg::BLOCK_K != 0 || (p.n & 15) != 0 || p.n <= 0) return false;
            tiles = reinterpret_cast<const int4*>(p.tiles);
            step = gridDim.y;
            // The first tile is read together with the count (gridDim.y <= the list's capacity, so
            // the read is in bounds even past the count): one memory round trip before the weights.
            iy = blockIdx.y;
            it = tiles[iy];
            count = *p.tile_count;
            if (iy >= count) return false;
            it_next = iy + step < count ? tiles[iy + step] : it;
            const int nkb = p.k / Cfg::BLOCK_K;
            const int kb_begin = static_cast<int>((static_cast<long long>(blockIdx.z) * nkb) / Cfg::SPLIT_K);
            const int kb_end = static_cast<int>((static_cast<long long>(blockIdx.z + 1) * nkb) / Cfg::SPLIT_K);
            cpt = (kb_end - kb_begin) * Cfg::CHUNKS;
            if (!Cfg::FLOW && (cpt % Cfg::DEPTH != 0 || cpt < Cfg::DEPTH)) return false;
            first = sm90::ChunkCursor<Cfg>{kb_begin * Cfg::BLOCK_K + wk * Cfg::K_PER_WARP, 0};
            p0 = wmn * Cfg::WARP_P;
            int src[Cfg::Q_TILES];
            sources(p, it, lane, src);
            sources(p, it_next, lane, src_next);
            ptr.point(p, it.x, src, p0, lane);
            ahead = first;
            ic = 0;
            issuing = true;
            pending = it;
            return true;
        }

        // Before a chunk is issued: once tile iy is issued whole, move on to the next tile of the
        // walk (or stop issuing past the last one).
        __device__ __forceinline__ void turn(const GroupedParams& p, int lane) {
            if (!issuing || ic != cpt) return;
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

        __device__ __forceinline__ void issued() {
            ahead.next();
            ++ic;
        }
    };

    // One chunk of the warp ring with the activations (A_SMEM): wait for its group, read stage
    // slot, refill the stage read one chunk earlier with the walk's next chunk (an empty group
    // past the last tile), compute it.
    __device__ __forceinline__ static void ring_chunk(const GroupedParams& p, const GroupedRing<Cfg>& ring, Walk& walk,
                                                      int slot, int lane,
                                                      float (&acc)[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4]) {
        const int refill = slot == 0 ? Cfg::DEPTH - 1 : slot - 1;
        ptx::cp_async_wait<Cfg::DEPTH - 2>();
        sm90::WeightChunk<Cfg> wc;
        sm90::ActivationChunk<Cfg> ac;
        ring.read(wc, ac, slot, lane);
        walk.turn(p, lane);
        if (walk.issuing) {
            ring.issue(walk.ptr.code_row, walk.ptr.sf_row, walk.ptr.a_row, walk.it.z, walk.ahead.k, refill, lane);
            walk.issued();
        }
        ptx::cp_async_commit();
        sm90::chunk_mma<Cfg>(wc, sm90::RingActivations<Cfg>{ac}, lane, acc);
    }

    __device__ __forceinline__ static void run(const GroupedParams& p) {
        extern __shared__ __align__(128) uint8_t smem[];
        const int tid = threadIdx.x;
        const int lane = tid & 31;
        const int warp = tid >> 5;
        const int wk = warp / Cfg::WARPS_MN;
        const int wmn = warp % Cfg::WARPS_MN;
        Walk walk;
        if (!walk.begin(p, wk, wmn, lane)) return;
        float acc[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4];
        int4 ct = walk.it;  // the tile being consumed
        const auto finish_tile = [&]() {
            sm90::fold_accumulators<Cfg>(acc);
            epilogue(p, smem, acc[0], ct.x, ct.y, ct.z, blockIdx.x * Cfg::BLOCK_N, walk.p0, wk, wmn, lane, tid);
            ct = walk.pending;
        };
        if constexpr (Cfg::FLOW) {
            // Chunk c of the walk in stage c % DEPTH: the prologue issues DEPTH - 1 chunks (across
            // tiles when a tile has fewer), then every chunk waits for its group, is read, its
            // stage's predecessor is refilled with chunk c + DEPTH - 1, and it is computed. One
            // group is committed per chunk (empty ones past the last tile).
            GroupedRing<Cfg> ring;
            ring.init(ptx::smem_addr(smem), warp);
            ring.base = ptx::opaque(ring.base);
#pragma unroll
            for (int d = 0; d < Cfg::DEPTH - 1; ++d) {
                walk.turn(p, lane);
                if (walk.issuing) {
                    ring.issue(walk.ptr.code_row, walk.ptr.sf_row, walk.ptr.a_row, walk.it.z, walk.ahead.k, d, lane);
                    walk.issued();
                }
                ptx::cp_async_commit();
            }
            int slot = 0;
#pragma unroll 1
            for (int cy = blockIdx.y; cy < walk.count; cy += walk.step) {
                const int4 tile = walk.tiles[cy];  // for the epilogue; the issue side may be tiles ahead
                sm90::zero_accumulators<Cfg>(acc);
#pragma unroll 1
                for (int c = 0; c < walk.cpt; ++c) {
                    ring_chunk(p, ring, walk, slot, lane, acc);
                    slot = slot == Cfg::DEPTH - 1 ? 0 : slot + 1;
                }
                sm90::fold_accumulators<Cfg>(acc);
                epilogue(p, smem, acc[0], tile.x, tile.y, tile.z, blockIdx.x * Cfg::BLOCK_N, walk.p0, wk, wmn, lane,
                         tid);
            }
            ptx::cp_async_wait<0>();
        } else if constexpr (Cfg::A_SMEM) {
            // The warp ring's walk (below) with the activations in the same stages.
            GroupedRing<Cfg> ring;
            ring.init(ptx::smem_addr(smem), warp);
            ring.base = ptx::opaque(ring.base);
#pragma unroll
            for (int d = 0; d < Cfg::DEPTH - 1; ++d) {
                ring.issue(walk.ptr.code_row, walk.ptr.sf_row, walk.ptr.a_row, walk.it.z, walk.ahead.k, d, lane);
                ptx::cp_async_commit();
                walk.issued();
            }
#pragma unroll 1
            for (int cy = blockIdx.y; cy < walk.count; cy += walk.step) {
                sm90::zero_accumulators<Cfg>(acc);
#pragma unroll 1
                for (int base = 0; base < walk.cpt; base += Cfg::DEPTH) {
#pragma unroll
                    for (int d = 0; d < Cfg::DEPTH; ++d) ring_chunk(p, ring, walk, d, lane, acc);
                }
                finish_tile();
            }
            ptx::cp_async_wait<0>();
        } else if constexpr (Cfg::WARP_RING) {
            // Chunk c waits for its own cp.async group, reads its slot (c % DEPTH) into registers,
            // then chunk c + DEPTH - 1 is issued into the slot read one chunk earlier (weights by
            // cp.async, activations into that slot's register entry), then chunk c is computed.
            // One group is committed per chunk (empty ones past the last tile), so "chunk c has
            // landed" is always cp.async.wait_group DEPTH - 2.
            sm90::WarpRing<Cfg> ring;
            ring.init(ptx::smem_addr(smem), warp, lane);
            ring.base = ptx::opaque(ring.base);
            sm90::ActivationChunk<Cfg> aring[Cfg::DEPTH];
#pragma unroll
            for (int d = 0; d < Cfg::DEPTH - 1; ++d) {
                issue_weights<Cfg>(ring, walk.ptr.code_row, walk.ptr.sf_row, walk.ahead.k, d, lane);
                aring[d].load(walk.ptr.a_row, walk.ptr.a_sf_row, walk.ahead.k);
                ptx::cp_async_commit();
                walk.issued();
            }
#pragma unroll 1
            for (int cy = blockIdx.y; cy < walk.count; cy += walk.step) {
                sm90::zero_accumulators<Cfg>(acc);
#pragma unroll 1
                for (int base = 0; base < walk.cpt; base += Cfg::DEPTH) {
#pragma unroll
                    for (int d = 0; d < Cfg::DEPTH; ++d) {
                        const int refill = d == 0 ? Cfg::DEPTH - 1 : d - 1;
                        ptx::cp_async_wait<Cfg::DEPTH - 2>();
                        sm90::WeightChunk<Cfg> wc;
                        ring.read(wc, d, lane);
                        walk.turn(p, lane);
                        if (walk.issuing) {
                            issue_weights<Cfg>(ring, walk.ptr.code_row, walk.ptr.sf_row, walk.ahead.k, refill, lane);
                            aring[refill].load(walk.ptr.a_row, walk.ptr.a_sf_row, walk.ahead.k);
                            walk.issued();
                        }
                        ptx::cp_async_commit();
                        sm90::chunk_mma<Cfg>(wc, sm90::RingActivations<Cfg>{aring[d]}, lane, acc);
                    }
                }
                finish_tile();
            }
            ptx::cp_async_wait<0>();
        } else {
            // Chunk c + DEPTH goes into chunk c's ring entry as soon as chunk c is computed.
            sm90::WeightChunk<Cfg> ring[Cfg::DEPTH];
            sm90::ActivationChunk<Cfg> aring[Cfg::DEPTH];
#pragma unroll
            for (int d = 0; d < Cfg::DEPTH; ++d) {
                load_weights<Cfg>(ring[d], walk.ptr.code_row, walk.ptr.sf_row, walk.ahead.k);
                aring[d].load(walk.ptr.a_row, walk.ptr.a_sf_row, walk.ahead.k);
                walk.issued();
            }
#pragma unroll 1
            for (int cy = blockIdx.y; cy < walk.count; cy += walk.step) {
                sm90::zero_accumulators<Cfg>(acc);
#pragma unroll 1
                for (int base = 0; base < walk.cpt; base += Cfg::DEPTH) {
#pragma unroll
                    for (int d = 0; d < Cfg::DEPTH; ++d) {
                        sm90::chunk_mma<Cfg>(ring[d], sm90::RingActivations<Cfg>{aring[d]}, lane, acc);
                        walk.turn(p, lane);
                        if (walk.issuing) {
                            load_weights<Cfg>(ring[d], walk.ptr.code_row, walk.ptr.sf_row, walk.ahead.k);
                            aring[d].load(walk.ptr.a_row, walk.ptr.a_sf_row, walk.ahead.k);
                            walk.issued();
                        }
                    }
                }
                finish_tile();
            }
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
