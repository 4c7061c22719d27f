// The SM120 block-scaled FP4 tensor-core instruction (SASS: OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X).
#pragma once
#include "common/types.cuh"

namespace fp4tune {
namespace sm120 {

// D[16x8] (f32) = (A[16x64] (e2m1) x SF_A) * (B[64x8] (e2m1) x SF_B) + C, one UE4M3 scale per 16 K.
// Fragments (g = lane / 4, t = lane % 4), 8 e2m1 codes per register, lowest k in the low nibble:
//   a0: row g, k 8t..8t+7   a1: row g+8, same k   a2: row g, k+32   a3: row g+8, k+32
//   b0: col g, k 8t..8t+7   b1: col g, k+32
//   c0, c1: row g, cols 2t, 2t+1   c2, c3: row g+8, same cols
// Scale words hold the 4 scales of one row (column) for the 64-wide step, byte i for k in [16i, 16i+16).
// TID_A = 0 reads SF_A from lanes with lane % 4 == 0 (row g) and 1 (row g+8); TID_A = 1 from lanes
// 2 (row g) and 3 (row g+8). TID_B = j reads SF_B of column g from the lane with lane % 4 == j.
// byte-id must be 0 with scale_vec::4X. The tuner's CPU model is tuner/src/template/sm120/fragments.rs.
struct SM120_16x8x64_F32E2M1E2M1F32_UE4M3_4X {
    template <int TID_A, int TID_B>
    __device__ __forceinline__ static void fma(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2], uint32_t sfa, uint32_t sfb) {
        static_assert(TID_A == 0 || TID_A == 1, "thread-id-a is 0 or 1 for m16n8k64");
        static_assert(TID_B >= 0 && TID_B <= 3, "thread-id-b is 0..3 for m16n8k64");
        asm volatile(
            "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X"
            ".f32.e2m1.e2m1.f32.ue4m3 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, "
            "%10, {%11, %12}, %13, {%14, %15};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(sfa), "n"(0),
              "n"(TID_A), "r"(sfb), "n"(0), "n"(TID_B));
    }
};

}  // namespace sm120
}  // namespace fp4tune
