// The grouped wgmma kernel: prefill-sized grouped projections on Hopper's warpgroup MMA.
//
// The tiled kernel of moe/sm90_tiled.cuh runs mma.sync, and at prefill sizes its warps spend
// their issue slots on fragment loads and the bf16 pairing of the activations. Here the
// activations never enter registers: the tile's routed rows are wgmma's B operand (N = BLOCK_M
// rows, read by the hardware from the cp.async stages in the 128-byte swizzle), and the weights
// are its A operand in registers: each warp decodes its weight rows of a k16 step (E2M1 codes
// times the block scale, exactly as nvfp4.cuh does) straight into the A fragments. A CTA has one
// or two warpgroups; each owns MT (1 or 2) m64 tiles of 64 weight rows, all multiplied by the
// same B tile, and the warpgroups share the activation stages. Schedule as the tiled kernel: CTA
// (x, y) computes n-tile x of tile y of moe_align's list for BLOCK_M (one tile = up to BLOCK_M
// routed rows of one expert); CTAs past the tile count exit at once.
//
// K order: the A fragment's k pair (2t, 2t + 1) of a k16 step is elements 2t and 2t + 1 of a code
// word (in the decode order, nvfp4.cuh), the real k pair (8c + 2t, 8c + 2t + 1); the B tile holds
// the activations in their real k order, so no permutation is needed on either side. One k16 step is one 16-k scale block: each fragment
// register is multiplied by its row's block scale of that step.
//
// Weight rows (A rows): m64 tile m of warpgroup wg is rows (wg * MT + m) * 64 .. + 63 of the CTA's
// BLOCK_N, and warp w of the warpgroup holds its rows 16w .. 16w + 15. OP_GATE_UP interleaves
// each 16 as the streamed kernel does: rows g (0..7) are gate rows (n0 + r16) / 2 + g (r16 the
// first of the 16) and rows g + 8 the matching up rows, so accumulator elements e and e + 2 of a
// lane are gate and up of one H column and moe/epilogue.cuh writes SiLU(gate) * up. OP_DOWN: row
// r is weight row n0 + r.
//
// Pipeline: STAGES cp.async stages, STAGES - 2 in flight, refilled once the wgmmas of two stages
// back have completed (wgmma.wait_group 1, then the CTA barrier). Within a stage, the wgmmas of
// a k16 step run while the warp decodes the next step's fragments into the other of two
// fragment buffers (wait_group 1 before each decode frees the buffer of two steps back).
//
// W4A16 only (bf16 activations), one K slice per CTA, one tile per CTA.
//
// Launch contract (moe::GroupedConfig with `tiled` and `wgmma` in Rust): grid (ceil(N / BLOCK_N),
// max_tiles, 1), THREADS threads, SMEM_BYTES of dynamic shared memory, no cluster; sm_90a.
#pragma once
#include "common/nvfp4.cuh"
#include "moe/code_copy.cuh"
#include "moe/epilogue.cuh"
#include "moe/params.cuh"
#include "moe/wgmma.cuh"
#include "sm90/config.cuh"
#include "sm90/load.cuh"

namespace fp4tune {
namespace moe {

__host__ __device__ constexpr int align1024(int x) { return (x + 1023) / 1024 * 1024; }

// The wgmma kernel's configuration; moe/wgmma.rs (Rust) mirrors the shared-memory formula.
template <int BLOCK_M_, int BLOCK_N_, int BLOCK_K_, int WARPS_N_, int STAGES_, int MIN_CTAS_>
struct WgmmaConfig {
    static constexpr int BLOCK_M = BLOCK_M_;  // routed rows per tile: wgmma's N
    static constexpr int BLOCK_N = BLOCK_N_;  // weight rows per CTA: 64 per m64 tile
    static constexpr int BLOCK_K = BLOCK_K_;  // k per stage
    static constexpr int WARPS_N = WARPS_N_;  // 4 per warpgroup
    static constexpr int STAGES = STAGES_;
    static constexpr int MIN_CTAS = MIN_CTAS_;
    static constexpr int WARPGROUPS = WARPS_N / 4;
    static constexpr int THREADS = 32 * WARPS_N;
    static constexpr int MT = BLOCK_N / (64 * WARPGROUPS);  // m64 tiles per warpgroup (same B)
    static constexpr int STEPS = BLOCK_K / 16;    // k16 steps (and scale blocks) per stage
    static constexpr int W_UNITS = BLOCK_K / 32;  // 16-byte units of codes per weight row and stage
    static constexpr int A_UNITS = BLOCK_K / 8;   // 16-byte units of bf16 per routed row and stage
    static constexpr int SF_WORDS = BLOCK_K / 64;  // 4-byte scale words per weight row and stage
    // One stage: the B tile (BLOCK_K / 64 atom columns of BLOCK_M x 128 bytes, 1024-aligned), the
    // weight codes (BLOCK_N x BLOCK_K / 2), the scale words (SF_WORDS x BLOCK_N).
    static constexpr int B_BYTES = BLOCK_M * BLOCK_K * 2;
    static constexpr int OFF_W = B_BYTES;
    static constexpr int OFF_W_SF = OFF_W + BLOCK_N * BLOCK_K / 2;
    static constexpr int STAGE_BYTES = align1024(OFF_W_SF + BLOCK_N * SF_WORDS * 4);
    // + 1024: the dynamic shared memory is aligned up to the 1024 bytes of a swizzle atom
    static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024;

    static_assert(BLOCK_M == 32 || BLOCK_M == 64 || BLOCK_M == 128,
                  "BLOCK_M is wgmma's N: one of moe_align's tile lists of 32, 64 or 128 rows");
    static_assert(WARPS_N == 4 || WARPS_N == 8, "one or two warpgroups");
    static_assert(BLOCK_N % (64 * WARPGROUPS) == 0 && (MT == 1 || MT == 2),
                  "BLOCK_N is one or two m64 tiles of 64 weight rows per warpgroup");
    static_assert(BLOCK_K == 64 || BLOCK_K == 128, "BLOCK_K is one or two 64-k swizzle atoms");
    static_assert(STEPS % 2 == 0, "the two fragment buffers alternate by step parity across stages");
    static_assert(STAGES >= 3 && STAGES <= 8, "STAGES must be 3..8 (STAGES - 2 in flight)");
    static_assert(MIN_CTAS >= 1 && THREADS * MIN_CTAS <= 2048,
                  "MIN_CTAS CTAs of THREADS threads must fit in one SM (2048 threads)");
    static_assert(SMEM_BYTES <= 232448, "dynamic shared memory over the 227 KiB opt-in limit of SM90");
    static_assert(MIN_CTAS * (SMEM_BYTES + 1024) <= 233472, "MIN_CTAS CTAs' stages over the 228 KiB of an SM");
};

// The 16-byte unit of code unit u of weight row r in a stage: the XOR keeps a warp's fragment
// loads (rows g and g + 8 of its 16, one unit each) on distinct banks.
template <int UNITS>
__host__ __device__ constexpr int code_unit(int r, int u) {
    return UNITS == 2 ? u ^ ((r >> 2) & 1) : u ^ ((r >> 1) & 3);
}

template <class Cfg, int OP>
struct GroupedWgmma {
    static constexpr int BK = Cfg::BLOCK_K;
    static constexpr int STEPS = Cfg::STEPS;
    static constexpr int ACC = Cfg::BLOCK_M / 2;  // fp32 accumulators per lane

    // The weight row behind A row r of the CTA whose first weight row is n0, or -1 past N.
    __device__ __forceinline__ static int weight_row(const GroupedParams& p, int n0, int r) {
        if constexpr (OP == OP_GATE_UP) {
            const int half = p.n / 2;
            const int j = (n0 + (r & ~15)) / 2 + (r & 7);
            return j < half ? j + ((r >> 3) & 1) * half : -1;
        } else {
            return n0 + r < p.n ? n0 + r : -1;
        }
    }

    // Elements 2t and 2t + 1 (t = lane % 4) of a weight word in the decode order (nvfp4.cuh) as
    // raw bf16x2, low half first. Element 2t belongs to pair 0 or 2, a rotation of the raw
    // positions: rotated right by lo_rot it sits on the low half's raw bits. Element 2t + 1
    // belongs to pair 1 (t even: on the raw positions) or pair 3 (t odd): masked to its 4 bits
    // and multiplied by shifts that never overlap, it lands on the high half's raw bits. The
    // lane's constants are registers, so all lanes run the same 5 integer instructions.
    struct LanePick {
        uint32_t lo_rot, hi_mask, hi_mul;

        static_assert(nvfp4::ORDER_ROTATION[1] == 0, "LanePick takes pair 1 on the raw positions (mask only)");

        // lo: pair 0 (even t) or 2 (odd t), its element in the high half for t >= 2 (16 more).
        // hi: pair 1 (even t, on the raw positions) or pair 3's bits (odd t), the low half's element
        // for t < 2 (moved up 16 more by the multiplier), the high half's for t >= 2.
        __host__ __device__ static constexpr uint32_t lo_rot_of(int t) {
            return ((t & 1 ? nvfp4::ORDER_ROTATION[2] : nvfp4::ORDER_ROTATION[0]) + (t >> 1) * 16) % 32;
        }
        __host__ __device__ static constexpr uint32_t hi_mask_of(int t) {
            return (t & 1 ? nvfp4::ORDER_PAIR3_MASK : nvfp4::RAW_BF16X2) & (t < 2 ? 0x0000FFFFu : 0xFFFF0000u);
        }
        __host__ __device__ static constexpr uint32_t hi_mul_of(int t) {
            return (t & 1 ? nvfp4::ORDER_PAIR3_MUL : 1u) << (t < 2 ? 16 : 0);
        }

        // the lanes' constants, evaluated at compile time
        static constexpr uint32_t ROT0 = lo_rot_of(0), ROT1 = lo_rot_of(1), ROT2 = lo_rot_of(2), ROT3 = lo_rot_of(3);
        static constexpr uint32_t MASK0 = hi_mask_of(0), MASK1 = hi_mask_of(1), MASK2 = hi_mask_of(2),
                                  MASK3 = hi_mask_of(3);
        static constexpr uint32_t MUL0 = hi_mul_of(0), MUL1 = hi_mul_of(1), MUL2 = hi_mul_of(2), MUL3 = hi_mul_of(3);

        __device__ __forceinline__ explicit LanePick(int t)
            : lo_rot(t == 0 ? ROT0 : t == 1 ? ROT1 : t == 2 ? ROT2 : ROT3),
              hi_mask(t == 0 ? MASK0 : t == 1 ? MASK1 : t == 2 ? MASK2 : MASK3),
              hi_mul(t == 0 ? MUL0 : t == 1 ? MUL1 : t == 2 ? MUL2 : MUL3) {}

        __device__ __forceinline__ uint32_t raw(uint32_t w) const {
            constexpr uint32_t LO = nvfp4::RAW_BF16X2 & 0xFFFFu;
            const uint32_t lo = __funnelshift_r(w, w, lo_rot);
            const uint32_t hi = ((w & hi_mask) * hi_mul) & (nvfp4::RAW_BF16X2 & ~LO);
            return (lo & LO) | hi;
        }
    };

    // One stage's weight data of the lane's two rows (g and g + 8) of one m64 tile, two k16
    // steps at a time: the 16-byte code unit that holds both steps and their prepared scales.
    struct RowPair {
        uint32_t code[2][4];  // [row half][word]: steps 2u (words 0, 1) and 2u + 1 (words 2, 3)
        uint32_t scale[2][2];  // [row half][step 2u, 2u + 1]

        __device__ __forceinline__ void load(const uint8_t* st, int r0, int u) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r0 + 8 * h;
                const uint4 v = *reinterpret_cast<const uint4*>(st + Cfg::OFF_W + r * (BK / 2) +
                                                                code_unit<Cfg::W_UNITS>(r, u) * 16);
                code[h][0] = v.x;
                code[h][1] = v.y;
                code[h][2] = v.z;
                code[h][3] = v.w;
                // scale word u / 2 holds the blocks of steps 4 (u / 2) .. + 3: bytes 2 (u % 2), + 1
                const uint16_t sf2 = *reinterpret_cast<const uint16_t*>(
                    st + Cfg::OFF_W_SF + ((u >> 1) * Cfg::BLOCK_N + r) * 4 + 2 * (u & 1));
                nvfp4::e4m3x2_prepared(sf2, scale[h][0], scale[h][1]);
            }
        }

        // The A fragment of step 2u + jj: a0 = row g, k (2t, 2t + 1) = elements 2t, 2t + 1 of
        // word 2jj; a1 = row g + 8; a2, a3 = k (2t + 8, 2t + 9) = those of word 2jj + 1.
        __device__ __forceinline__ void fragment(int jj, const LanePick& pick, uint32_t (&a)[4]) const {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                a[h] = ptx::mul_bf16x2(pick.raw(code[h][2 * jj]), scale[h][jj]);
                a[2 + h] = ptx::mul_bf16x2(pick.raw(code[h][2 * jj + 1]), scale[h][jj]);
            }
        }
    };

    // The copies of one plan (sm90/load.cuh CopyPlan) into the stage at shared address `stage`,
    // `off` bytes into the rows; `live` false: every copy has size 0.
    template <int BYTES, class Plan>
    __device__ __forceinline__ static void copy(const Plan& pl, uint32_t stage, size_t off, bool live) {
        const uint32_t bytes = live ? BYTES : 0u;
#pragma unroll
        for (int i = 0; i < Plan::IT; ++i) {
            if (!pl.ok[i]) continue;
            if constexpr (BYTES == 16) {
                ptx::cp_async_cg_16(stage + pl.dst[i], pl.src[i] + off, bytes);
            } else {
                ptx::cp_async_ca_4(stage + pl.dst[i], pl.src[i] + off, bytes);
            }
        }
    }

    __device__ __forceinline__ static void run(const GroupedParams& p) {
        if (p.k % BK != 0 || (p.n & 15) != 0 || p.n <= 0) return;
        if (static_cast<int>(blockIdx.y) >= *p.tile_count) return;
        const int4 tl = reinterpret_cast<const int4*>(p.tiles)[blockIdx.y];
        const int expert = tl.x;
        const int row0 = tl.y;
        const int rows = tl.z;

        extern __shared__ __align__(128) uint8_t smem_raw[];
        const uint32_t raw_addr = ptx::smem_addr(smem_raw);
        const uint32_t base = (raw_addr + 1023u) & ~1023u;
        const uint8_t* smem = smem_raw + (base - raw_addr);
        const int tid = threadIdx.x;
        const int lane = tid & 31;
        const int warp = tid >> 5;
        const int n0 = blockIdx.x * Cfg::BLOCK_N;
        const int k = p.k;
        const uint32_t ksf_pad = static_cast<uint32_t>(((k / 16) + 3) / 4 * 4);
        const uint8_t* w = p.w + static_cast<size_t>(expert) * p.n * (k / 2);
        const uint8_t* w_sf = p.w_sf + static_cast<size_t>(expert) * ((p.n + 127) / 128 * 128) * ksf_pad;

        // This thread's copies of every stage, planned once (sm90/load.cuh CopyPlan).
        sm90::CopyPlan<Cfg::BLOCK_M * Cfg::A_UNITS, Cfg::THREADS, 16> b_rows;
        CodeCopyPlan<Cfg::BLOCK_N * Cfg::W_UNITS, Cfg::THREADS, 16> w_codes;  // the grouped layout
        sm90::CopyPlan<Cfg::BLOCK_N * Cfg::SF_WORDS, Cfg::THREADS, 4> w_scales;
        b_rows.plan(tid, [&](int i, const uint8_t*& src, uint32_t& dst) {
            const int r = i / Cfg::A_UNITS;
            const int u = i % Cfg::A_UNITS;
            const int sorted = row0 + min(r, max(rows, 1) - 1);
            const int source = OP == OP_GATE_UP ? p.sorted_ids[sorted] / p.top_k : sorted;
            src = p.a + (static_cast<size_t>(source) * k + u * 8) * 2;
            dst = wgmma::b_offset<Cfg::BLOCK_M>(r, u);
            return r < rows;
        });
        w_codes.plan(tid, w, k, [&](int i, int& rho, int& b0, uint32_t& dst) {
            const int r = i / Cfg::W_UNITS;
            const int u = i % Cfg::W_UNITS;
            const int row = weight_row(p, n0, r);
            rho = paired_row(OP, p.n, max(row, 0));
            b0 = u * 16;
            dst = Cfg::OFF_W + r * (BK / 2) + code_unit<Cfg::W_UNITS>(r, u) * 16;
            return row >= 0;
        });
        w_scales.plan(tid, [&](int i, const uint8_t*& src, uint32_t& dst) {
            const int sw = i / Cfg::BLOCK_N;
            const int r = i % Cfg::BLOCK_N;
            const int row = weight_row(p, n0, r);
            src = w_sf + swizzled_sf_offset(static_cast<uint32_t>(max(row, 0)), 4 * sw, ksf_pad);
            dst = Cfg::OFF_W_SF + (sw * Cfg::BLOCK_N + r) * 4;
            return row >= 0;
        });
        const int iters = k / BK;
        // The copies of k-block kb into slot s; past the last k-block they copy nothing (size 0)
        // instead of being skipped: a branch around them would make ptxas serialize the wgmmas.
        const auto issue = [&](int s, int kb) {
            const uint32_t stage = base + s * Cfg::STAGE_BYTES;
            const bool live = kb < iters;
            const size_t kc = static_cast<size_t>(min(kb, iters - 1));
            copy<16>(b_rows, stage, kc * BK * 2, live);
            w_codes.issue(stage, static_cast<int>(kc) * (BK / 2), live);
            copy<4>(w_scales, stage, kc * Cfg::SF_WORDS * 512, live);  // 4 scale columns per word
        };

        // zeroed before the first wgmma; nothing but wgmmas touches them until the last wait
        float acc[Cfg::MT][ACC];
#pragma unroll
        for (int m = 0; m < Cfg::MT; ++m)
#pragma unroll
            for (int e = 0; e < ACC; ++e) {
                acc[m][e] = 0.0f;
                wgmma::fence_operand(acc[m][e]);
            }

        // m64 tile m of the warp's warpgroup holds A rows (warpgroup * MT + m) * 64 .. + 63; the
        // warp its 16 rows 16 (warp % 4) .. of each, the lane rows g and g + 8 of those.
        const int wg = warp >> 2;
        const int rw = 16 * (warp & 3) + (lane >> 2);
        const int t = lane & 3;
        const LanePick pick(t);
#pragma unroll
        for (int s = 0; s < Cfg::STAGES - 2; ++s) {
            issue(s, s);
            ptx::cp_async_commit();
        }
        // Stage it: once the wgmmas of stage it - 2 are done (this warp: wait_group 1; all warps:
        // the barrier) and stage it has landed, refill the slot of it - 2. Then per k16 step: wait
        // until the wgmmas of two steps back are done (their fragment buffer is this step's),
        // decode the step's fragments, and issue its wgmmas (one per m64 tile) as one group.
        uint32_t frag[2][Cfg::MT][4];
#pragma unroll 1
        for (int it = 0; it < iters; ++it) {
            wgmma::wait<1>();
            ptx::cp_async_wait<Cfg::STAGES - 3>();
            wgmma::fence_proxy_async();
            __syncthreads();
            issue((it + Cfg::STAGES - 2) % Cfg::STAGES, it + Cfg::STAGES - 2);
            ptx::cp_async_commit();
            const int slot = it % Cfg::STAGES;
            const uint8_t* st = smem + slot * Cfg::STAGE_BYTES;
            const uint32_t b = base + slot * Cfg::STAGE_BYTES;
            RowPair rp[Cfg::MT];
#pragma unroll
            for (int s = 0; s < STEPS; ++s) {
                uint32_t(&f)[Cfg::MT][4] = frag[s & 1];
                if (s % 2 == 0) {
#pragma unroll
                    for (int m = 0; m < Cfg::MT; ++m) rp[m].load(st, (wg * Cfg::MT + m) * 64 + rw, s / 2);
                }
                // every input of a wgmma is defined before its fence: ptxas serializes wgmmas
                // whose inputs other instructions define between them
                const uint64_t desc = wgmma::b_descriptor(b + (s >> 2) * Cfg::BLOCK_M * 128 + (s & 3) * 32);
                if (s > 0) wgmma::wait<1>();
#pragma unroll
                for (int m = 0; m < Cfg::MT; ++m) {
                    rp[m].fragment(s & 1, pick, f[m]);
#pragma unroll
                    for (int i = 0; i < 4; ++i) wgmma::fence_operand(f[m][i]);
                }
                wgmma::fence();
#pragma unroll
                for (int m = 0; m < Cfg::MT; ++m) wgmma::Mma<Cfg::BLOCK_M>::run(acc[m], f[m], desc);
                wgmma::commit();
            }
        }
        wgmma::wait<0>();
        ptx::cp_async_wait<0>();
#pragma unroll
        for (int m = 0; m < Cfg::MT; ++m)
#pragma unroll
            for (int e = 0; e < ACC; ++e) wgmma::fence_operand(acc[m][e]);

        const float out_scale =
            p.alpha[expert] * __uint_as_float(static_cast<uint32_t>(127 - nvfp4::OPERAND_LOG2) << 23);
#pragma unroll
        for (int m = 0; m < Cfg::MT; ++m)
            store_tile<1, Cfg::BLOCK_M / 8, OP, false>(
                p, out_scale, *reinterpret_cast<const float(*)[1][Cfg::BLOCK_M / 8][4]>(acc[m]), row0, rows,
                n0 + (wg * Cfg::MT + m) * 64 + 16 * (warp & 3), 0, lane);
    }
};

}  // namespace moe
}  // namespace fp4tune
