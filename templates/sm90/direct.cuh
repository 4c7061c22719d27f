// The register-streamed SM90 kernel for small M: weights go from HBM straight into registers.
//
// Decode-sized GEMMs (M <= 16) read every weight byte exactly once and do almost no math per byte;
// the cp.async pipeline of gemm.cuh spends its time on the round trip through shared memory and on
// one __syncthreads per stage. Here every warp owns 16 * P_TILES weight rows and a K slice, and
// keeps DEPTH chunks (128 k each, 16 * P_TILES rows x 64 bytes of codes + their scales) in flight
// in its own registers: a ring that is refilled right after each chunk is consumed, with no barrier
// at all. Only the activations (tiny, read by every weight tile) go through shared memory: the CTA
// copies its (BLOCK_M, BLOCK_K) slice once per pass (one pass when BLOCK_K = K / SPLIT_K).
//
// Roles are those of swap_ab (config.cuh): weights on the m16n8k16's 16-row side (P), tokens on
// its 8-wide side (Q); the K permutation is layout.cuh's with CHUNK = 128, so lane t = lane % 4 reads
// one 16-byte run of codes per weight row and chunk, straight from the ModelOpt layout.
//
// A_GLOBAL (Pipeline::Global): the activations skip shared memory too. Every lane loads its own
// 32-k run of each token row for each chunk into the same register ring as the weights (rows past
// M are clamped to M - 1: their columns are never stored), so there is no slice, no pass barrier and
// no wait before the first chunk; shared memory only holds the split-K partials. With WARPS_N = 1
// the slice was never shared between warps anyway (each warp owns its own K range).
//
// Launch contract (GemmConfig::launch_dims): grid (ceil(N / BLOCK_N), ceil(M / BLOCK_M), SPLIT_K),
// THREADS threads, SMEM_BYTES of dynamic shared memory; split-K as in gemm.cuh (cluster for
// SPLIT_K <= 8, workspace + counters above).
#pragma once
#include "common/nvfp4.cuh"
#include "common/params.cuh"
#include "common/ptx.cuh"
#include "sm90/config.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/layout.cuh"

namespace fp4tune {
namespace sm90 {

// SMEM_RING = false: the ring is DEPTH WeightChunks in registers (1..8 chunk tiles).
// SMEM_RING = true: the ring is DEPTH stages of this warp's private shared memory, filled by the
// lane's own cp.async copies (each lane copies exactly the bytes it later reads, so no barrier is
// needed: cp.async.wait_group per thread suffices); deep prefetch without registers, and a rolled
// main loop (small code: the kernel runs once per warp, so instruction-cache misses are not
// amortized).
template <int BLOCK_M_, int BLOCK_N_, int BLOCK_K_, int WARPS_N_, int WARPS_K_, int DEPTH_, int SPLIT_K_, bool A_FP4_,
          bool SMEM_RING_ = false, bool A_GLOBAL_ = false, int MIN_CTAS_ = 1>
struct DirectConfig {
    static constexpr int BLOCK_M = BLOCK_M_;  // tokens per CTA (Q side)
    static constexpr int BLOCK_N = BLOCK_N_;  // weight rows per CTA (P side)
    static constexpr int BLOCK_K = BLOCK_K_;  // k per pass: the activation slice in shared memory
    static constexpr int WARPS_M = 1;
    static constexpr int WARPS_N = WARPS_N_;
    static constexpr int WARPS_K = WARPS_K_;
    static constexpr int DEPTH = DEPTH_;  // chunks in flight per warp
    static constexpr bool SMEM_RING = SMEM_RING_;
    static constexpr bool A_GLOBAL = A_GLOBAL_;  // activations in the register ring, no slice
    // CTAs per SM the kernel is compiled for (__launch_bounds__ of the instantiation unit).
    static constexpr int MIN_CTAS = MIN_CTAS_;
    static constexpr int SPLIT_K = SPLIT_K_;
    static constexpr bool SWAP_AB = true;
    static constexpr bool A_FP4 = A_FP4_;
    // Weight codes in the ModelOpt order (the GEMM's); the grouped configuration reads the decode
    // order (nvfp4.cuh) and says so.
    static constexpr bool W_ORDERED = false;

    static constexpr int WARPS_MN = WARPS_N;
    static constexpr int WARPS = WARPS_N * WARPS_K;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int REGISTER_CAP = cmin(65536 / (THREADS * MIN_CTAS) / 8 * 8, 255);  // per lane
    static constexpr int WARP_P = BLOCK_N / WARPS_N;
    static constexpr int P_TILES = WARP_P / 16;
    static constexpr int Q_TILES = BLOCK_M / 8;
    static constexpr int ACC = P_TILES * Q_TILES * 4;
    static constexpr int ACC_SETS = P_TILES * Q_TILES >= 4 ? 1 : (P_TILES * Q_TILES >= 2 ? 2 : 4);
    static constexpr int K_PER_WARP = BLOCK_K / WARPS_K;  // per pass
    static constexpr int CHUNKS = K_PER_WARP / 128;       // per warp per pass

    // ---- shared memory: the activation slice of one pass, then (after the main loop) the
    // reduction buffers of the epilogue, which reuse the same bytes.
    static constexpr int A_BYTES = A_GLOBAL ? 0 : align128(A_FP4 ? BLOCK_M * BLOCK_K / 2 : BLOCK_M * BLOCK_K * 2);
    static constexpr int A_SF_BYTES = A_FP4 && !A_GLOBAL ? align128(BLOCK_M * BLOCK_K / 16) : 0;
    static constexpr int OFF_A_SF = A_BYTES;
    static constexpr int SLICE_BYTES = A_BYTES + A_SF_BYTES;
    // SPLIT_K <= 8 (direct_epilogue): every warp of every CTA of the (1, 1, SPLIT_K) cluster parks
    // its partial tile in a slot of CTA rank 0, behind the slice (warps finish at different times,
    // so the slots must not overlap the activations), one barrier, then rank 0 sums the slots.
    // SPLIT_K > 8: epilogue.cuh (in-CTA buffer at offset 0 after a barrier, then the workspace).
    static constexpr bool CLUSTER_SPLIT = SPLIT_K > 1 && SPLIT_K <= 8;
    static constexpr int CLUSTER_SIZE = CLUSTER_SPLIT ? SPLIT_K : 1;
    static constexpr int SLOTS = SPLIT_K <= 8 ? CLUSTER_SIZE * WARPS_K : 0;
    static constexpr int OFF_SLOTS = SLICE_BYTES;
    static constexpr int SLOT_BYTES = SLOTS > 1 ? SLOTS * WARPS_MN * 32 * ACC * 4 : 0;
    static constexpr int RED_BYTES = SPLIT_K > 8 ? (WARPS_K - 1) * WARPS_MN * 32 * ACC * 4 : 0;
    static constexpr int CLUSTER_RED_BYTES = 0;  // (epilogue.cuh's cluster path is not used)
    // Per-warp ring (SMEM_RING): per stage, per m16 tile and row half, 32 lanes x 16 bytes of codes,
    // then 32 lanes x 4 bytes of scale words.
    static constexpr int RING_STAGE_BYTES = SMEM_RING ? P_TILES * 2 * (512 + 128) : 0;
    static constexpr int OFF_RING = align128(SLICE_BYTES + SLOT_BYTES);
    static constexpr int RING_BYTES = WARPS * DEPTH * RING_STAGE_BYTES;
    // Registers of one ring entry (A_GLOBAL): per m16 tile 2 x (4 code words + 1 scale half-word
    // pair), per n8 tile the lane's 32-k run (16 words of bf16, or 4 code words + 1 scale word).
    static constexpr int RING_ENTRY_REGS = P_TILES * 10 + (A_GLOBAL ? Q_TILES * (A_FP4 ? 5 : 16) : 0);
    static constexpr int SMEM_BYTES = cmax(cmax(SMEM_RING ? OFF_RING + RING_BYTES : SLICE_BYTES + SLOT_BYTES, RED_BYTES), 16);

    // ---- limits (sm90.rs `check` enforces the same before anything is compiled)
    static_assert(THREADS >= 32 && THREADS <= 1024, "threads per CTA must be 32..1024");
    static_assert(BLOCK_M == 8 || BLOCK_M == 16 || BLOCK_M == 32, "register-streamed kernels take BLOCK_M 8, 16 or 32");
    static_assert(BLOCK_N % WARPS_N == 0 && WARP_P % 16 == 0 && P_TILES <= 4,
                  "BLOCK_N / WARPS_N must be 16, 32, 48 or 64 weight rows per warp");
    static_assert(BLOCK_K >= 256 && BLOCK_K % (128 * WARPS_K) == 0,
                  "BLOCK_K must be at least 256 and a multiple of 128 * WARPS_K");
    static_assert(DEPTH >= 1 && DEPTH <= (SMEM_RING ? 16 : 8), "DEPTH (chunks in flight per warp) must be 1..8 (registers) or 2..16 (shared)");
    static_assert(!SMEM_RING || DEPTH >= 2, "a shared-memory ring needs at least 2 stages");
    static_assert(WARPS_K <= 16, "at most 16 warps along K");
    static_assert(SMEM_RING || A_GLOBAL || P_TILES * DEPTH <= 8, "P_TILES * DEPTH over the register budget of the ring (<= 8 chunk tiles)");
    static_assert(!(SMEM_RING && A_GLOBAL), "the activations go through either a register ring or a shared slice, not a warp ring");
    static_assert(!A_GLOBAL || RING_ENTRY_REGS * DEPTH <= cmin(112, REGISTER_CAP - 64),
                  "weights + activations in the register ring over its budget (112 registers per lane, and 64 "
                  "below the register cap of MIN_CTAS CTAs of THREADS threads)");
    static_assert(MIN_CTAS >= 1 && MIN_CTAS <= 16 && THREADS * MIN_CTAS <= 2048,
                  "MIN_CTAS CTAs of THREADS threads must fit in one SM (2048 threads)");
    static_assert(MIN_CTAS == 1 || MIN_CTAS * (SMEM_BYTES + 1024) <= 233472,
                  "MIN_CTAS CTAs' shared memory over the 228 KiB of an SM");
    static_assert(MIN_CTAS == 1 || SMEM_RING || A_GLOBAL || REGISTER_CAP >= 64 + 10 * P_TILES * DEPTH,
                  "register cap of MIN_CTAS CTAs under 64 + the register ring");
    static_assert(ACC_SETS * ACC <= 128, "accumulators over the register budget");
    static_assert(SPLIT_K >= 1 && SPLIT_K <= 64, "SPLIT_K must be 1..64");
    static_assert(SMEM_BYTES <= 232448, "activation slice over the 227 KiB shared-memory limit of SM90");
};

// Physical 16-byte unit of logical unit u of row r of an NVFP4 activation slice (>= 8 units per
// row): lanes (g, t) of one 8-lane phase read unit 4c + t of rows 2j, 2j + 1; the XOR puts the two
// rows in different halves of the 128 bytes of banks.
__device__ __forceinline__ int direct_code_unit_swizzle(int r, int u) {
    return u ^ (((r & 1) << 2) | (((r >> 1) & 1) << 1));
}

// Chunk c of a warp -> its first k, walked forward one chunk at a time: chunk c is chunk c % CHUNKS
// of pass c / CHUNKS, at k = (kb_begin + c / CHUNKS) * BLOCK_K + wk * K_PER_WARP + (c % CHUNKS) * 128.
// The main loops keep one cursor per role (issue, consume) instead of dividing by CHUNKS per chunk.
template <class Cfg>
struct ChunkCursor {
    int k;   // first k of the chunk
    int cc;  // its index inside the pass (c % CHUNKS)

    __device__ __forceinline__ void next() {
        if (++cc == Cfg::CHUNKS) {
            cc = 0;
            k += Cfg::BLOCK_K - (Cfg::CHUNKS - 1) * 128;
        } else {
            k += 128;
        }
    }
};

// One chunk of the warp's weights, as loaded: rows g and g + 8 of every m16 tile, the lane's 16
// bytes of codes (32 k) and its two scale bytes (blocks 2t, 2t + 1 of the chunk).
template <class Cfg>
struct WeightChunk {
    uint4 code[Cfg::P_TILES][2];
    uint16_t sf[Cfg::P_TILES][2];

    // code_row / sf_row: this lane's pointers at k = 0; k0: the chunk's first k (multiple of 128).
    __device__ __forceinline__ void load(const uint8_t* const (&code_row)[Cfg::P_TILES][2],
                                         const uint8_t* const (&sf_row)[Cfg::P_TILES][2], int k0) {
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) code[i][h] = ptx::ldg_stream_v4(code_row[i][h] + (k0 >> 1));
        // Scale block k0/16 + 2t sits in 128x4 tile column (k0/16 + 2t)/4 = k0/64 + t/2: +512 bytes
        // per 64 k (sf_row already holds the t part).
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) sf[i][h] = ptx::ldg_u16(sf_row[i][h] + (k0 >> 6) * 512);
    }
};

// One chunk of the activations, as loaded (A_GLOBAL): for each n8 tile q, the lane's 32-k run of
// token row 8q + g (k [32t, 32t + 32) of the chunk, the same run its weight codes cover): 64 bytes
// of bf16, or 16 bytes of codes and the two scale bytes of blocks 2t, 2t + 1.
template <class Cfg>
struct ActivationChunk {
    static constexpr int VECS = Cfg::A_FP4 ? 1 : 4;  // 16-byte loads per token row
    uint4 v[Cfg::Q_TILES][VECS];
    uint16_t sf[Cfg::A_FP4 ? Cfg::Q_TILES : 1];

    // row / sf_row: the lane's pointers at k = 0 (as WeightChunk); k0: the chunk's first k.
    __device__ __forceinline__ void load(const uint8_t* const (&row)[Cfg::Q_TILES],
                                         const uint8_t* const (&sf_row)[Cfg::Q_TILES], int k0) {
#pragma unroll
        for (int q = 0; q < Cfg::Q_TILES; ++q) {
            if constexpr (Cfg::A_FP4) {
                v[q][0] = ptx::ldg_v4(row[q] + (k0 >> 1));
                sf[q] = ptx::ldg_u16(sf_row[q] + (k0 >> 6) * 512);
            } else {
#pragma unroll
                for (int w = 0; w < VECS; ++w) v[q][w] = ptx::ldg_v4(row[q] + k0 * 2 + 16 * w);
            }
        }
    }
};

// Where chunk_mma finds the activations of a chunk. SliceActivations: the CTA's shared slice at
// pass-local k kp; RingActivations: an ActivationChunk of the register ring.
template <class Cfg>
struct SliceActivations {
    const uint8_t* slice;
    int kp;
    const uint32_t (&off)[Cfg::Q_TILES][4];  // bf16: bf16_run_offsets

    // bf16: word w (8 k) of the lane's run in token row 8q + g.
    __device__ __forceinline__ uint4 bf16(int q, int w) const {
        // k_local = kp + 32t + 8w: unit kp/8 + 4t + w of token row 8q + g (bf16_run_offsets)
        return *reinterpret_cast<const uint4*>(slice + kp * 2 + off[q][w]);
    }
    // NVFP4: the lane's 16 bytes of codes and 2 scale bytes of token row 8q + g.
    __device__ __forceinline__ void fp4(int q, int lane, uint4& code, uint16_t& s2) const {
        const int g = lane >> 2;
        const int t = lane & 3;
        const int r = 8 * q + g;
        code = *reinterpret_cast<const uint4*>(slice + r * (Cfg::BLOCK_K / 2) +
                                               direct_code_unit_swizzle(r, kp / 32 + t) * 16);
        s2 = *reinterpret_cast<const uint16_t*>(slice + Cfg::OFF_A_SF +
                                                ((kp / 64 + (t >> 1)) * Cfg::BLOCK_M + r) * 4 + 2 * (t & 1));
    }
};

template <class Cfg>
struct RingActivations {
    const ActivationChunk<Cfg>& chunk;

    __device__ __forceinline__ uint4 bf16(int q, int w) const { return chunk.v[q][w]; }
    __device__ __forceinline__ void fp4(int q, int, uint4& code, uint16_t& s2) const {
        code = chunk.v[q][0];
        s2 = chunk.sf[q];
    }
};

// This warp's shared-memory ring (SMEM_RING): stage slot holds, per m16 tile i and row half h, the
// 16-byte code runs of the 32 lanes ([i][h][lane], conflict-free LDS.128) and their scale words.
template <class Cfg>
struct WarpRing {
    uint32_t base;  // shared address of stage 0 of this warp's ring, plus this lane's offsets

    __device__ __forceinline__ void init(uint32_t smem_base, int warp, int lane) {
        base = smem_base + Cfg::OFF_RING + warp * Cfg::DEPTH * Cfg::RING_STAGE_BYTES + lane * 16;
    }
    __device__ __forceinline__ uint32_t code_at(int slot, int i, int h) const {
        return base + slot * Cfg::RING_STAGE_BYTES + (i * 2 + h) * 512;
    }
    __device__ __forceinline__ uint32_t sf_at(int slot, int i, int h, int lane) const {
        // scale words start after the codes; the lane's word is at + lane * 4 (base has + lane * 16)
        return base - static_cast<uint32_t>(lane) * 12u + slot * Cfg::RING_STAGE_BYTES + Cfg::P_TILES * 2 * 512 +
               (i * 2 + h) * 128;
    }

    // cp.async of chunk k0 into slot: code_row as WeightChunk::load; sf_word_row points at the
    // 4-byte scale word that holds the lane's two scale bytes (k = 0).
    __device__ __forceinline__ void issue(const uint8_t* const (&code_row)[Cfg::P_TILES][2],
                                          const uint8_t* const (&sf_word_row)[Cfg::P_TILES][2], int k0, int slot,
                                          int lane) const {
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) ptx::cp_async_cg_16(code_at(slot, i, h), code_row[i][h] + (k0 >> 1), 16u);
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                ptx::cp_async_ca_4(sf_at(slot, i, h, lane), sf_word_row[i][h] + (k0 >> 6) * 512, 4u);
    }

    // The lane's own bytes of slot, as a WeightChunk (t = lane % 4 selects the scale half-word).
    __device__ __forceinline__ void read(WeightChunk<Cfg>& wc, int slot, int lane) const {
        const int t = lane & 3;
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                wc.code[i][h] = ptx::lds_v4(code_at(slot, i, h));
                wc.sf[i][h] = static_cast<uint16_t>(ptx::lds_u32(sf_at(slot, i, h, lane)) >> (16 * (t & 1)));
            }
    }
};

// Copies (cp.async) of the activation slice of pass kb: rows m0 .. m0 + rows - 1, k in
// [kb * BLOCK_K, (kb + 1) * BLOCK_K). Rows >= rows are not copied (their columns are never stored).
template <class Cfg>
__device__ __forceinline__ void copy_activation_slice(const GemmParams& p, uint32_t smem_base, int m0, int rows,
                                                      int kb, int tid) {
    const int k0 = kb * Cfg::BLOCK_K;
    if constexpr (Cfg::A_FP4) {
        constexpr int UNITS = Cfg::BLOCK_K / 32;  // 16-byte units of codes per row
        const int row_bytes = p.k / 2;
        for (int i = tid; i < rows * UNITS; i += Cfg::THREADS) {
            const int r = i / UNITS;
            const int u = i % UNITS;
            const uint8_t* src = p.a + static_cast<size_t>(m0 + r) * row_bytes + k0 / 2 + u * 16;
            ptx::cp_async_cg_16(smem_base + r * (Cfg::BLOCK_K / 2) + direct_code_unit_swizzle(r, u) * 16, src, 16u);
        }
        constexpr int GROUPS = Cfg::BLOCK_K / 64;  // 32-bit scale words per row
        const uint32_t ksf_pad = static_cast<uint32_t>(p.k / 16);
        for (int i = tid; i < rows * GROUPS; i += Cfg::THREADS) {
            const int r = i / GROUPS;
            const int gw = i % GROUPS;
            const uint8_t* src = p.a_sf + swizzled_sf_offset(m0 + r, k0 / 16 + 4 * gw, ksf_pad);
            ptx::cp_async_ca_4(smem_base + Cfg::OFF_A_SF + (gw * Cfg::BLOCK_M + r) * 4, src, 4u);
        }
    } else {
        constexpr int UNITS = Cfg::BLOCK_K / 8;  // 16-byte units of bf16 per row
        for (int i = tid; i < rows * UNITS; i += Cfg::THREADS) {
            const int r = i / UNITS;
            const int u = i % UNITS;
            const uint8_t* src = p.a + (static_cast<size_t>(m0 + r) * p.k + k0 + u * 8) * 2;
            ptx::cp_async_cg_16(smem_base + r * (Cfg::BLOCK_K * 2) + bf16_unit_swizzle(r, u) * 16, src, 16u);
        }
    }
    ptx::cp_async_commit();
}

// The warp's 8 k-steps over one chunk: weights from the ring entry, activations from the slice at
// pass-local k kp. Step j = 2w + jj of word w goes to accumulator set j % ACC_SETS.
// bf16 activations: byte offset in the slice of word w (8 k) of the lane's run in token row 8q + g,
// at pass-local k = 0. The run of chunk kp starts kp * 2 bytes later: bf16_unit_swizzle(r, u) with
// u = kp/8 + 4t + w only XORs the two low bits of u with ((t >> 1) << 1) | (r & 1), and kp/8 is a
// multiple of 16, so the swizzle does not depend on kp and is computed once per kernel.
template <class Cfg>
__device__ __forceinline__ void bf16_run_offsets(int lane, uint32_t (&off)[Cfg::Q_TILES][4]) {
    const int g = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int q = 0; q < Cfg::Q_TILES; ++q) {
        const int r = 8 * q + g;
        const int x = ((t >> 1) << 1) | (r & 1);
#pragma unroll
        for (int w = 0; w < 4; ++w) off[q][w] = r * (Cfg::BLOCK_K * 2) + (4 * t + (w ^ x)) * 16;
    }
}

// Keeps the run offsets in registers for the whole main loop (the compiler would otherwise recompute
// them from the lane index before every chunk).
template <class Cfg>
__device__ __forceinline__ void opaque_offsets(uint32_t (&off)[Cfg::Q_TILES][4]) {
#pragma unroll
    for (int q = 0; q < Cfg::Q_TILES; ++q)
#pragma unroll
        for (int w = 0; w < 4; ++w) off[q][w] = ptx::opaque(off[q][w]);
}

template <class Cfg, class Activations>
__device__ __forceinline__ void chunk_mma(const WeightChunk<Cfg>& wc, const Activations& act, int lane,
                                          float (&acc)[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4]) {
    uint32_t wscale[Cfg::P_TILES][2][2];
#pragma unroll
    for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) nvfp4::e4m3x2_prepared(wc.sf[i][h], wscale[i][h][0], wscale[i][h][1]);

    // NVFP4 activations: the lane's 16 bytes of codes and 2 scale bytes per token row, once per chunk.
    uint4 acode[Cfg::A_FP4 ? Cfg::Q_TILES : 1];
    uint32_t ascale[Cfg::A_FP4 ? Cfg::Q_TILES : 1][2];
    if constexpr (Cfg::A_FP4) {
#pragma unroll
        for (int q = 0; q < Cfg::Q_TILES; ++q) {
            uint16_t s2;
            act.fp4(q, lane, acode[q], s2);
            nvfp4::e4m3x2_prepared(s2, ascale[q][0], ascale[q][1]);
        }
    }

#pragma unroll
    for (int w = 0; w < 4; ++w) {
        uint32_t pr[Cfg::P_TILES][2][4];
        uint32_t qr[Cfg::Q_TILES][4];
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i) {
            const uint32_t c0[4] = {wc.code[i][0].x, wc.code[i][0].y, wc.code[i][0].z, wc.code[i][0].w};
            const uint32_t c1[4] = {wc.code[i][1].x, wc.code[i][1].y, wc.code[i][1].z, wc.code[i][1].w};
            nvfp4::dequant_weight_word<Cfg::W_ORDERED>(c0[w], wscale[i][0][w >> 1], pr[i][0]);
            nvfp4::dequant_weight_word<Cfg::W_ORDERED>(c1[w], wscale[i][1][w >> 1], pr[i][1]);
        }
#pragma unroll
        for (int q = 0; q < Cfg::Q_TILES; ++q) {
            if constexpr (Cfg::A_FP4) {
                const uint32_t a[4] = {acode[q].x, acode[q].y, acode[q].z, acode[q].w};
                nvfp4::dequant_word(a[w], ascale[q][w >> 1], qr[q]);
            } else {
                const uint4 v = act.bf16(q, w);
                nvfp4::pair_bf16x8(v.x, v.y, v.z, v.w, qr[q]);
            }
        }
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
            const int set = (2 * w + jj) % Cfg::ACC_SETS;
#pragma unroll
            for (int i = 0; i < Cfg::P_TILES; ++i) {
                const uint32_t a[4] = {pr[i][0][2 * jj], pr[i][1][2 * jj], pr[i][0][2 * jj + 1], pr[i][1][2 * jj + 1]};
#pragma unroll
                for (int q = 0; q < Cfg::Q_TILES; ++q) {
                    const uint32_t b[2] = {qr[q][2 * jj], qr[q][2 * jj + 1]};
                    ptx::SM80_16x8x16_F32BF16BF16F32_TN::fma(acc[set][i][q], a, b);
                }
            }
        }
    }
}

template <class Cfg>
__device__ __forceinline__ void zero_accumulators(float (&acc)[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4]) {
#pragma unroll
    for (int a = 0; a < Cfg::ACC_SETS; ++a)
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int q = 0; q < Cfg::Q_TILES; ++q)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[a][i][q][e] = 0.0f;
}

// Sets 1.. added into set 0, in order.
template <class Cfg>
__device__ __forceinline__ void fold_accumulators(float (&acc)[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4]) {
#pragma unroll
    for (int a = 1; a < Cfg::ACC_SETS; ++a)
#pragma unroll
        for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
            for (int q = 0; q < Cfg::Q_TILES; ++q)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[0][i][q][e] += acc[a][i][q][e];
}

// SPLIT_K <= 8: one barrier for the whole K reduction. Warp (z, wk, wmn) stores its partial tile
// into slot z * WARPS_K + wk of CTA rank 0 (its own shared memory, or DSMEM across the cluster);
// after the barrier every thread of rank 0 adds slots 0, 1, ... of its output elements in order
// (deterministic), scales and stores. SPLIT_K > 8 goes through epilogue.cuh.
template <class Cfg>
__device__ __forceinline__ void direct_epilogue(const GemmParams& p, uint8_t* smem,
                                                float (&acc)[Cfg::P_TILES][Cfg::Q_TILES][4], int m0, int n0,
                                                int p0, int wk, int wmn, int lane, int tid) {
    if constexpr (Cfg::SPLIT_K > 8) {
        epilogue<Cfg>(p, smem, acc, m0, n0, p0, 0, wk, wmn, lane, tid);
    } else {
        constexpr int ACC = Cfg::ACC;
        float* flat = &acc[0][0][0];
        if constexpr (Cfg::SLOTS > 1) {
            const int slot = (Cfg::CLUSTER_SPLIT ? static_cast<int>(blockIdx.z) : 0) * Cfg::WARPS_K + wk;
            float* slots = reinterpret_cast<float*>(smem + Cfg::OFF_SLOTS);
            const int mine = (slot * Cfg::WARPS_MN + wmn) * ACC * 32 + lane;
            if constexpr (Cfg::CLUSTER_SPLIT) {
                const uint32_t remote = ptx::mapa_shared(ptx::smem_addr(slots + mine), 0);
#pragma unroll
                for (int e = 0; e < ACC; ++e) ptx::st_shared_cluster_f32(remote + e * 32 * 4, flat[e]);
                ptx::cluster_sync();
                if (blockIdx.z != 0) return;
            } else {
#pragma unroll
                for (int e = 0; e < ACC; ++e) slots[mine + e * 32] = flat[e];
                __syncthreads();
            }
        }
        constexpr int FP4_OPERANDS = Cfg::A_FP4 ? 2 : 1;
        const float out_scale =
            p.alpha * __uint_as_float(static_cast<uint32_t>(127 - nvfp4::OPERAND_LOG2 * FP4_OPERANDS) << 23);
        if constexpr (Cfg::SLOTS > 1) {
            // Every thread of rank 0 sums whole output elements over the slots, in slot order
            // (deterministic): element j of a slot is (warp wmn, accumulator ef, lane l), the
            // same for all slots, so consecutive threads read consecutive words (no bank
            // conflicts) and the slot loads of one element are independent.
            constexpr int J = Cfg::WARPS_MN * ACC * 32;  // floats per slot
            const float* slots = reinterpret_cast<const float*>(smem + Cfg::OFF_SLOTS);
            for (int j = tid; j < J; j += Cfg::THREADS) {
                float sum = 0.0f;
#pragma unroll 8
                for (int s = 0; s < Cfg::SLOTS; ++s) sum += slots[s * J + j];
                const int l = j & 31;
                const int ef = (j >> 5) % ACC;
                const int w = (j >> 5) / ACC;
                int m, n;
                acc_coords<Cfg>(w * Cfg::WARP_P, 0, l, (ef >> 2) / Cfg::Q_TILES, (ef >> 2) % Cfg::Q_TILES, ef & 3, m,
                                n);
                m += m0;
                n += n0;
                if (m < p.m && n < p.n) p.y[static_cast<size_t>(m) * p.n + n] = float_to_bf16_bits(sum * out_scale);
            }
            return;
        }
        for_each_output<Cfg>(m0, n0, p0, 0, lane, p.m, p.n, [&](int i, int q, int e, int m, int n) {
            p.y[static_cast<size_t>(m) * p.n + n] = float_to_bf16_bits(acc[i][q][e] * out_scale);
        });
    }
}

// The SMEM_RING main loop and epilogue: chunk c waits for its own cp.async group (no barrier),
// reads the lane's bytes, refills the slot consumed one iteration earlier, and computes.
template <class Cfg>
__device__ __forceinline__ void direct_main_loop_smem_ring(const GemmParams& p, uint8_t* smem, uint32_t smem_base,
                                                           const uint8_t* const (&code_row)[Cfg::P_TILES][2], int m0,
                                                           int rows, int kb_begin, int n_chunks, ChunkCursor<Cfg> first,
                                                           int wk, int warp, int lane, int tid) {
    const int g = lane >> 2;
    const int t = lane & 3;
    const int wmn = warp % Cfg::WARPS_MN;
    const int p0 = wmn * Cfg::WARP_P;
    const int n0 = blockIdx.x * Cfg::BLOCK_N;
    const uint32_t ksf_pad = static_cast<uint32_t>(((p.k / 16) + 3) / 4 * 4);
    const uint8_t* sf_word_row[Cfg::P_TILES][2];
#pragma unroll
    for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = min(n0 + p0 + 16 * i + 8 * h + g, p.n - 1);
            // blocks 2t, 2t + 1 of a chunk live in scale word (2t) / 4 = t / 2 of the 128x4 tile column
            sf_word_row[i][h] =
                ptx::opaque_ptr(p.w_sf + swizzled_sf_offset(static_cast<uint32_t>(row), 4 * (t >> 1), ksf_pad));
        }
    WarpRing<Cfg> ring;
    ring.init(smem_base, warp, lane);
    ring.base = ptx::opaque(ring.base);
    ChunkCursor<Cfg> ahead = first;  // the next chunk to issue
#pragma unroll
    for (int d = 0; d < Cfg::DEPTH - 1; ++d) {
        if (d < n_chunks) ring.issue(code_row, sf_word_row, ahead.k, d, lane);
        ahead.next();
        ptx::cp_async_commit();
    }

    float acc[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4];
    zero_accumulators<Cfg>(acc);
    uint32_t a_off[Cfg::Q_TILES][4];
    bf16_run_offsets<Cfg>(lane, a_off);
    opaque_offsets<Cfg>(a_off);

    // The activation slice is the oldest group: done once at most DEPTH - 1 ring groups are pending.
    ptx::cp_async_wait<Cfg::DEPTH - 1>();
    __syncthreads();

    int cc = 0;    // c % CHUNKS
    int pass = 0;  // c / CHUNKS
    int slot = 0;  // c % DEPTH: the slot to read; the slot read one iteration ago is refilled
#pragma unroll 1
    for (int c = 0; c < n_chunks; ++c) {
        if (cc == 0 && c > 0) {
            // Next pass: swap the activation slice (drains this thread's ring groups too).
            __syncthreads();
            copy_activation_slice<Cfg>(p, smem_base, m0, rows, kb_begin + pass, tid);
            ptx::cp_async_wait<0>();
            __syncthreads();
        } else {
            ptx::cp_async_wait<Cfg::DEPTH - 2>();  // groups 0 .. c of the ring have landed
        }
        WeightChunk<Cfg> wc;
        ring.read(wc, slot, lane);
        const int refill = slot == 0 ? Cfg::DEPTH - 1 : slot - 1;  // chunk c + DEPTH - 1 goes here
        if (c + Cfg::DEPTH - 1 < n_chunks) ring.issue(code_row, sf_word_row, ahead.k, refill, lane);
        ahead.next();
        ptx::cp_async_commit();
        chunk_mma<Cfg>(wc, SliceActivations<Cfg>{smem, wk * Cfg::K_PER_WARP + cc * 128, a_off}, lane, acc);
        slot = slot == Cfg::DEPTH - 1 ? 0 : slot + 1;
        if (++cc == Cfg::CHUNKS) {
            cc = 0;
            ++pass;
        }
    }

    fold_accumulators<Cfg>(acc);
    ptx::cp_async_wait<0>();
    direct_epilogue<Cfg>(p, smem, acc[0], m0, blockIdx.x * Cfg::BLOCK_N, p0, wk, wmn, lane, tid);
}

// The register-ring main loop (unrolled by DEPTH so that ring indices are static) and epilogue.
template <class Cfg>
__device__ __forceinline__ void direct_main_loop_registers(const GemmParams& p, uint8_t* smem, uint32_t smem_base,
                                                           const uint8_t* const (&code_row)[Cfg::P_TILES][2],
                                                           const uint8_t* const (&sf_row)[Cfg::P_TILES][2], int m0,
                                                           int rows, int kb_begin, int n_chunks, ChunkCursor<Cfg> first,
                                                           int wk, int wmn, int p0, int lane, int tid) {
    const int n0 = blockIdx.x * Cfg::BLOCK_N;
    WeightChunk<Cfg> ring[Cfg::DEPTH];
    ChunkCursor<Cfg> ahead = first;  // the next chunk to load
#pragma unroll
    for (int d = 0; d < Cfg::DEPTH; ++d) {
        if (d < n_chunks) ring[d].load(code_row, sf_row, ahead.k);
        ahead.next();
    }

    float acc[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4];
    zero_accumulators<Cfg>(acc);

    uint32_t a_off[Cfg::Q_TILES][4];
    bf16_run_offsets<Cfg>(lane, a_off);
    opaque_offsets<Cfg>(a_off);

    ptx::cp_async_wait<0>();
    __syncthreads();

    int cc = 0;    // c % CHUNKS
    int pass = 0;  // c / CHUNKS
#pragma unroll 1
    for (int base = 0; base < n_chunks; base += Cfg::DEPTH) {
#pragma unroll
        for (int d = 0; d < Cfg::DEPTH; ++d) {
            const int c = base + d;
            if (c >= n_chunks) break;
            if (cc == 0 && c > 0) {
                // Next pass (every warp of the CTA is here at the same c): swap the activation slice.
                __syncthreads();
                copy_activation_slice<Cfg>(p, smem_base, m0, rows, kb_begin + pass, tid);
                ptx::cp_async_wait<0>();
                __syncthreads();
            }
            chunk_mma<Cfg>(ring[d], SliceActivations<Cfg>{smem, wk * Cfg::K_PER_WARP + cc * 128, a_off}, lane, acc);
            if (c + Cfg::DEPTH < n_chunks) ring[d].load(code_row, sf_row, ahead.k);
            ahead.next();
            if (++cc == Cfg::CHUNKS) {
                cc = 0;
                ++pass;
            }
        }
    }

    fold_accumulators<Cfg>(acc);

    direct_epilogue<Cfg>(p, smem, acc[0], m0, n0, p0, wk, wmn, lane, tid);
}

// The A_GLOBAL main loop (unrolled by DEPTH so that ring indices are static) and epilogue: weights
// and activations of chunk c + DEPTH are requested as soon as chunk c is consumed; nothing waits
// for anything but its own loads until the epilogue.
template <class Cfg>
__device__ __forceinline__ void direct_main_loop_global(const GemmParams& p, uint8_t* smem,
                                                        const uint8_t* const (&code_row)[Cfg::P_TILES][2],
                                                        const uint8_t* const (&sf_row)[Cfg::P_TILES][2],
                                                        const uint8_t* const (&a_row)[Cfg::Q_TILES],
                                                        const uint8_t* const (&a_sf_row)[Cfg::Q_TILES], int m0,
                                                        int n_chunks, ChunkCursor<Cfg> first, int wk, int wmn, int p0,
                                                        int lane, int tid) {
    WeightChunk<Cfg> ring[Cfg::DEPTH];
    ActivationChunk<Cfg> aring[Cfg::DEPTH];
    ChunkCursor<Cfg> ahead = first;  // the next chunk to load
#pragma unroll
    for (int d = 0; d < Cfg::DEPTH; ++d) {
        if (d < n_chunks) {
            ring[d].load(code_row, sf_row, ahead.k);
            aring[d].load(a_row, a_sf_row, ahead.k);
        }
        ahead.next();
    }

    float acc[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4];
    zero_accumulators<Cfg>(acc);

#pragma unroll 1
    for (int base = 0; base < n_chunks; base += Cfg::DEPTH) {
#pragma unroll
        for (int d = 0; d < Cfg::DEPTH; ++d) {
            const int c = base + d;
            if (c >= n_chunks) break;
            chunk_mma<Cfg>(ring[d], RingActivations<Cfg>{aring[d]}, lane, acc);
            if (c + Cfg::DEPTH < n_chunks) {
                ring[d].load(code_row, sf_row, ahead.k);
                aring[d].load(a_row, a_sf_row, ahead.k);
            }
            ahead.next();
        }
    }

    fold_accumulators<Cfg>(acc);
    direct_epilogue<Cfg>(p, smem, acc[0], m0, blockIdx.x * Cfg::BLOCK_N, p0, wk, wmn, lane, tid);
}

template <class Cfg>
__device__ __forceinline__ void gemm_direct(const GemmParams& p) {
    // Preconditions as in gemm.cuh (check_problem enforces them before a launch).
    if (p.k % Cfg::BLOCK_K != 0 || (p.n & 7) != 0 || p.m <= 0 || p.n <= 0) return;

    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wk = warp / Cfg::WARPS_MN;  // K slice of this warp inside each pass
    const int wmn = warp % Cfg::WARPS_MN;
    const int p0 = wmn * Cfg::WARP_P;  // first weight row of the warp inside the CTA tile
    const int g = lane >> 2;
    const int t = lane & 3;

    const int n0 = blockIdx.x * Cfg::BLOCK_N;
    const int m0 = blockIdx.y * Cfg::BLOCK_M;
    const int rows = min(Cfg::BLOCK_M, p.m - m0);  // token rows of this CTA
    const int nkb = p.k / Cfg::BLOCK_K;
    const int kb_begin = static_cast<int>((static_cast<long long>(blockIdx.z) * nkb) / Cfg::SPLIT_K);
    const int kb_end = static_cast<int>((static_cast<long long>(blockIdx.z + 1) * nkb) / Cfg::SPLIT_K);
    const int n_chunks = (kb_end - kb_begin) * Cfg::CHUNKS;  // this warp's chunks, pass-major
    const uint32_t smem_base = ptx::opaque(ptx::smem_addr(smem));

    // This lane's weight rows (clamped to N - 1: rows past N are loaded but never stored) at k = 0.
    const uint8_t* code_row[Cfg::P_TILES][2];
    const uint8_t* sf_row[Cfg::P_TILES][2];
    const uint32_t ksf_pad = static_cast<uint32_t>(((p.k / 16) + 3) / 4 * 4);
#pragma unroll
    for (int i = 0; i < Cfg::P_TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = min(n0 + p0 + 16 * i + 8 * h + g, p.n - 1);
            code_row[i][h] = ptx::opaque_ptr(p.w + static_cast<size_t>(row) * (p.k / 2) + 16 * t);
            sf_row[i][h] = ptx::opaque_ptr(p.w_sf + swizzled_sf_offset(static_cast<uint32_t>(row), 2 * t, ksf_pad));
        }
    // This warp's first chunk (chunk 0 of pass kb_begin).
    const ChunkCursor<Cfg> first{kb_begin * Cfg::BLOCK_K + wk * Cfg::K_PER_WARP, 0};

    if constexpr (Cfg::A_GLOBAL) {
        // This lane's token rows (clamped to M - 1: their columns are computed but never stored).
        const uint8_t* a_row[Cfg::Q_TILES];
        const uint8_t* a_sf_row[Cfg::Q_TILES];
#pragma unroll
        for (int q = 0; q < Cfg::Q_TILES; ++q) {
            const int r = min(m0 + 8 * q + g, p.m - 1);
            if constexpr (Cfg::A_FP4) {
                a_row[q] = ptx::opaque_ptr(p.a + static_cast<size_t>(r) * (p.k / 2) + 16 * t);
                a_sf_row[q] = ptx::opaque_ptr(p.a_sf + swizzled_sf_offset(static_cast<uint32_t>(r), 2 * t, ksf_pad));
            } else {
                a_row[q] = ptx::opaque_ptr(p.a + (static_cast<size_t>(r) * p.k + 32 * t) * 2);
                a_sf_row[q] = nullptr;
            }
        }
        direct_main_loop_global<Cfg>(p, smem, code_row, sf_row, a_row, a_sf_row, m0, n_chunks, first, wk, wmn, p0,
                                     lane, tid);
        return;
    }
    // Activations of the first pass (cp.async), then the weight ring; both are in flight together.
    copy_activation_slice<Cfg>(p, smem_base, m0, rows, kb_begin, tid);
    if constexpr (Cfg::SMEM_RING) {
        direct_main_loop_smem_ring<Cfg>(p, smem, smem_base, code_row, m0, rows, kb_begin, n_chunks, first, wk, warp,
                                        lane, tid);
    } else {
        direct_main_loop_registers<Cfg>(p, smem, smem_base, code_row, sf_row, m0, rows, kb_begin, n_chunks, first,
                                        wk, wmn, p0, lane, tid);
    }
}

}  // namespace sm90
}  // namespace fp4tune
