// Global -> shared copies of one pipeline stage (cp.async, all threads of the CTA cooperate).
// Rows beyond the problem (>= M or >= N) are not copied at all: their shared-memory rows keep stale
// bytes, which only ever reach accumulator rows/columns of outputs >= M or >= N, never stored
// (output (m, n) depends on row m of A and row n of W only). This saves the copy instructions of
// the padding tokens, 7 of 8 rows at M = 1.
//
// The K-tail form (Cfg::K_TAIL: stages of 64 k, K any multiple of 16): rows of codes are then only
// 8-byte aligned (K / 2 bytes), so codes go in 8-byte copies (16 k each) and scales word by word
// (4 bytes, 4 columns); every copy of a stage gets as many source bytes as lie below K and
// cp.async zero-fills the rest (codes, activations, and the scale word's columns at or past K / 16:
// the swizzled buffer's padding columns are never read, whatever they hold). Zero codes under zero
// scales against zero activations add exact zeros.
#pragma once
#include "common/params.cuh"
#include "common/ptx.cuh"
#include "sm90/layout.cuh"

namespace fp4tune {
namespace sm90 {

template <bool C, class T, class F>
struct Select {
    using type = T;
};
template <class T, class F>
struct Select<false, T, F> {
    using type = F;
};

// The copies one thread issues for one tile of every stage, planned once before the main loop:
// per copy a source pointer at k-block 0, a destination offset inside the stage and a predicate.
// A stage then costs one add per copy (kb * the tile's k-block stride) and the cp.async itself.
// COUNT copies of BYTES (16: cp.async.cg, 4: cp.async.ca) over THREADS threads, copy i -> thread i % THREADS.
template <int COUNT, int THREADS, int BYTES>
struct CopyPlan {
    static constexpr int IT = (COUNT + THREADS - 1) / THREADS;
    const uint8_t* src[IT];
    uint32_t dst[IT];
    bool ok[IT];

    // f(i, src, dst) -> bool: fill copy i; returns whether the row exists.
    template <class F>
    __device__ __forceinline__ void plan(int tid, F f) {
#pragma unroll
        for (int it = 0; it < IT; ++it) {
            const int i = it * THREADS + tid;
            ok[it] = (COUNT % THREADS == 0 || i < COUNT) && f(i < COUNT ? i : 0, src[it], dst[it]);
        }
    }

    __device__ __forceinline__ void issue(uint32_t stage_addr, size_t kb_offset) const {
#pragma unroll
        for (int it = 0; it < IT; ++it) {
            if (ok[it]) {
                if constexpr (BYTES == 16) {
                    ptx::cp_async_cg_16(stage_addr + dst[it], src[it] + kb_offset, 16u);
                } else {
                    ptx::cp_async_ca_4(stage_addr + dst[it], src[it] + kb_offset, 4u);
                }
            }
        }
    }
    // Whole stages: the k left before K does not matter (the interface of TailCopyPlan).
    __device__ __forceinline__ void issue(uint32_t stage_addr, size_t kb_offset, int) const {
        issue(stage_addr, kb_offset);
    }
};

// cp.async.ca of 8 bytes, `src_bytes` of them read from global memory, the rest zero-filled.
__device__ __forceinline__ void cp_async_ca_8(uint32_t dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// The K-tail form's copies of one tile (CopyPlan plus each copy's first k inside the stage):
// COUNT copies of BYTES, copy i the (i % UNITS)-th of its row, each holding UNIT_K consecutive k.
// A stage with `k_left` k left before K reads, per copy, the bytes of its k below K and
// zero-fills the others.
template <int COUNT, int THREADS, int BYTES, int UNITS, int UNIT_K>
struct TailCopyPlan {
    static_assert(BYTES == 16 || BYTES == 8 || BYTES == 4, "cp.async copies 16, 8 or 4 bytes");
    static_assert(BYTES * 16 % UNIT_K == 0, "a copy's bytes per 16 k are whole (K is a multiple of 16)");
    static constexpr int IT = (COUNT + THREADS - 1) / THREADS;
    const uint8_t* src[IT];
    uint32_t dst[IT];
    bool ok[IT];
    int tid_;  // a copy's first k in the stage follows from its index: (i % UNITS) * UNIT_K

    // f(i, src, dst) -> bool: fill copy i; returns whether its row exists (as CopyPlan::plan).
    template <class F>
    __device__ __forceinline__ void plan(int tid, F f) {
#pragma unroll
        for (int it = 0; it < IT; ++it) {
            const int i = it * THREADS + tid;
            ok[it] = (COUNT % THREADS == 0 || i < COUNT) && f(i < COUNT ? i : 0, src[it], dst[it]);
        }
        tid_ = tid;
    }

    __device__ __forceinline__ void issue(uint32_t stage_addr, size_t kb_offset, int k_left) const {
#pragma unroll
        for (int it = 0; it < IT; ++it) {
            if (ok[it]) {
                const int kpos = ((it * THREADS + tid_) % UNITS) * UNIT_K;
                const int bytes = min(max((k_left - kpos) * BYTES / UNIT_K, 0), BYTES);
                if constexpr (BYTES == 16) {
                    ptx::cp_async_cg_16(stage_addr + dst[it], src[it] + kb_offset, static_cast<uint32_t>(bytes));
                } else if constexpr (BYTES == 8) {
                    cp_async_ca_8(stage_addr + dst[it], src[it] + kb_offset, static_cast<uint32_t>(bytes));
                } else {
                    ptx::cp_async_ca_4(stage_addr + dst[it], src[it] + kb_offset, static_cast<uint32_t>(bytes));
                }
            }
        }
    }
};

// NVFP4 operand (weights, or W4A4 activations): codes (ROWS, BLOCK_K/2 bytes) at stage offset
// OFF_CODES and scales (ROWS, BLOCK_K/16) at OFF_SF, rows row0 .. row0 + ROWS - 1 of a tensor
// with `rows` rows. The K-tail form copies 8 bytes of codes and one scale word per copy, into the
// same stage layout (sf_word).
template <class Cfg, int ROWS, int OFF_CODES, int OFF_SF>
struct Fp4TileLoader {
    static constexpr int BK = Cfg::BLOCK_K;
    static constexpr int UNITS = BK / 32;  // 16-byte units of codes per row
    static constexpr int G = Cfg::SF_GROUPS;
    static constexpr bool TILED = ROWS % 128 == 0;
    static constexpr int PER_TILE = G * 32;  // 16-byte units per 128-row scale tile
    static constexpr int TAIL_UNITS = BK / 16;  // K-tail form: 8-byte copies of codes per row
    typename Select<Cfg::K_TAIL, TailCopyPlan<ROWS * TAIL_UNITS, Cfg::THREADS, 8, TAIL_UNITS, 16>,
                    CopyPlan<ROWS * UNITS, Cfg::THREADS, 16>>::type codes;
    typename Select<Cfg::K_TAIL, TailCopyPlan<ROWS * G, Cfg::THREADS, 4, 1, 64>,
                    CopyPlan<TILED ? (ROWS / 128) * PER_TILE : ROWS * G, Cfg::THREADS, TILED ? 16 : 4>>::type sf;

    __device__ __forceinline__ void init(const uint8_t* g_codes, const uint8_t* g_sf, int row0, int rows, int k,
                                         int tid) {
        const int row_bytes = k / 2;
        if constexpr (Cfg::K_TAIL) {
            // G == 1: one scale word (64 k) per row; the swizzled scales' rows are padded to whole
            // words of 4 columns.
            const int ksf_pad = (k / 16 + 3) / 4 * 4;
            codes.plan(tid, [&](int i, const uint8_t*& src, uint32_t& dst) {
                const int r = i / TAIL_UNITS;
                const int u = i % TAIL_UNITS;
                src = g_codes + static_cast<size_t>(row0 + r) * row_bytes + u * 8;
                dst = OFF_CODES + r * (BK / 2) + code_unit_swizzle<UNITS>(r, u / 2) * 16 + (u % 2) * 8;
                return row0 + r < rows;
            });
            sf.plan(tid, [&](int i, const uint8_t*& src, uint32_t& dst) {
                src = g_sf + swizzled_sf_offset(row0 + i, 0, ksf_pad);
                dst = OFF_SF + sf_word<ROWS, G>(i, 0) * 4;
                return row0 + i < rows;
            });
            return;
        }
        const int ksf_pad = k / 16;  // K % 64 == 0: no scale-column padding
        codes.plan(tid, [&](int i, const uint8_t*& src, uint32_t& dst) {
            const int r = i / UNITS;
            const int u = i % UNITS;
            src = g_codes + static_cast<size_t>(row0 + r) * row_bytes + u * 16;
            dst = OFF_CODES + r * (BK / 2) + code_unit_swizzle<UNITS>(r, u) * 16;
            return row0 + r < rows;
        });
        if constexpr (TILED) {
            // Whole 128x4 blocks: for each 128-row tile the G blocks of a k-block are contiguous.
            sf.plan(tid, [&](int i, const uint8_t*& src, uint32_t& dst) {
                const int rt = i / PER_TILE;
                const int rem = i % PER_TILE;
                src = g_sf + static_cast<size_t>((row0 >> 7) + rt) * (ksf_pad >> 2) * 512 + rem * 16;
                dst = OFF_SF + rt * PER_TILE * 16 + rem * 16;
                return row0 + rt * 128 < rows;  // tiles past the padded rows do not exist
            });
        } else {
            sf.plan(tid, [&](int i, const uint8_t*& src, uint32_t& dst) {
                const int g = i / ROWS;
                const int r = i % ROWS;
                src = g_sf + swizzled_sf_offset(row0 + r, 4 * g, ksf_pad);
                dst = OFF_SF + sf_word<ROWS, G>(r, g) * 4;
                return row0 + r < rows;
            });
        }
    }

    // k_left: k of the tensor left before K from k-block kb on (read by the K-tail form only).
    __device__ __forceinline__ void issue(uint32_t stage_addr, int kb, int k_left) const {
        codes.issue(stage_addr, static_cast<size_t>(kb) * (BK / 2), k_left);
        sf.issue(stage_addr, static_cast<size_t>(kb) * G * 512, k_left);  // k-block kb = 4*G*kb scale columns
    }
};

// bf16 operand (W4A16 activations): (ROWS, BLOCK_K) bf16 at stage offset OFF. 16-byte copies
// (8 k): in the K-tail form (K a multiple of 16) each is wholly below K or wholly past it.
template <class Cfg, int ROWS, int OFF>
struct Bf16TileLoader {
    static constexpr int BK = Cfg::BLOCK_K;
    static constexpr int UNITS = BK / 8;
    typename Select<Cfg::K_TAIL, TailCopyPlan<ROWS * UNITS, Cfg::THREADS, 16, UNITS, 8>,
                    CopyPlan<ROWS * UNITS, Cfg::THREADS, 16>>::type tile;

    __device__ __forceinline__ void init(const uint8_t* g_a, int row0, int rows, int k, int tid) {
        tile.plan(tid, [&](int i, const uint8_t*& src, uint32_t& dst) {
            const int r = i / UNITS;
            const int u = i % UNITS;
            src = g_a + (static_cast<size_t>(row0 + r) * k + u * 8) * 2;
            dst = OFF + r * (BK * 2) + bf16_unit_swizzle(r, u) * 16;
            return row0 + r < rows;
        });
    }

    __device__ __forceinline__ void issue(uint32_t stage_addr, int kb, int k_left) const {
        tile.issue(stage_addr, static_cast<size_t>(kb) * BK * 2, k_left);
    }
};

// All copies of one stage: W (BLOCK_N rows) and A (BLOCK_M rows).
template <class Cfg>
struct StageLoader {
    Fp4TileLoader<Cfg, Cfg::BLOCK_N, 0, Cfg::OFF_W_SF> w;
    using ALoader = typename Select<Cfg::A_FP4, Fp4TileLoader<Cfg, Cfg::BLOCK_M, Cfg::OFF_A, Cfg::OFF_A_SF>,
                                    Bf16TileLoader<Cfg, Cfg::BLOCK_M, Cfg::OFF_A>>::type;
    ALoader a;

    __device__ __forceinline__ void init(const GemmParams& p, int n0, int m0, int tid) {
        w.init(p.w, p.w_sf, n0, p.n, p.k, tid);
        if constexpr (Cfg::A_FP4) {
            a.init(p.a, p.a_sf, m0, p.m, p.k, tid);
        } else {
            a.init(p.a, m0, p.m, p.k, tid);
        }
    }

    // Copies of k-block kb into the stage at shared address stage_addr; k_left = K - kb * BLOCK_K
    // (the K-tail form cuts the stage there).
    __device__ __forceinline__ void issue(uint32_t stage_addr, int kb, int k_left) const {
        w.issue(stage_addr, kb, k_left);
        a.issue(stage_addr, kb, k_left);
    }
};

}  // namespace sm90
}  // namespace fp4tune
