// Thin wrappers, one per PTX instruction the kernels use (cp.async, mma.sync, shared loads, prmt).
// Names follow the instruction: shape, types and cache policy are part of the name.
#pragma once
#include "common/types.cuh"

namespace fp4tune {
namespace ptx {

// Shared-memory address (32-bit) of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// An opaque copy of a register: the compiler can no longer rematerialize the value (used for the
// shared-memory base, which it would otherwise recompute from SR_CgaCtaId before every cp.async).
__device__ __forceinline__ uint32_t opaque(uint32_t v) {
    uint32_t d;
    asm volatile("mov.b32 %0, %1;\n" : "=r"(d) : "r"(v));
    return d;
}

// The same for a pointer (per-lane row pointers that would otherwise be recomputed every chunk).
template <class T>
__device__ __forceinline__ const T* opaque_ptr(const T* v) {
    uint64_t d;
    asm volatile("mov.b64 %0, %1;\n" : "=l"(d) : "l"(reinterpret_cast<uint64_t>(v)));
    return reinterpret_cast<const T*>(d);
}

// cp.async.cg.shared.global, 16 bytes, L2 only. src_bytes = 0 zero-fills the destination (rows
// beyond M or N); the source address must still be a valid pointer, callers pass a clamped one.
__device__ __forceinline__ void cp_async_cg_16(uint32_t dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}

// cp.async.ca.shared.global, 4 bytes (scale words of row blocks that are not 128-aligned).
__device__ __forceinline__ void cp_async_ca_4(uint32_t dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ld.global.nc.L1::no_allocate.v4.u32: 16 bytes of read-only data streamed past L1 (weights that
// are read exactly once). volatile keeps the loads where they are written: they are prefetches.
__device__ __forceinline__ uint4 ldg_stream_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// ld.global.nc.v4.u32: 16 bytes of read-only data that other warps of the SM read too
// (activations: kept in L1). volatile, like ldg_stream_v4: these loads are prefetches.
__device__ __forceinline__ uint4 ldg_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// ld.global.nc.u16: two scale bytes of read-only data.
__device__ __forceinline__ uint16_t ldg_u16(const void* p) {
    uint16_t v;
    asm volatile("ld.global.nc.u16 %0, [%1];\n" : "=h"(v) : "l"(p));
    return v;
}

// Shared-memory loads are plain C++ loads through pointers into the dynamic shared array (the
// compiler sees the address space and the aliasing with cp.async/__syncthreads, and emits LDS.128 /
// LDS.64 / LDS / LDS.U16); no wrapper is needed for them.

// ld.shared.v4.u32 / ld.shared.u32 by shared-memory address (per-warp rings addressed as integers).
__device__ __forceinline__ uint4 lds_v4(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}
__device__ __forceinline__ uint32_t lds_u32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

// prmt.b32: byte permute of {b, a} (bytes 0-3 from a, 4-7 from b) by the 4 selector nibbles.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// mul.rn.bf16x2 (sm_90): exact whenever the product is representable, as in NVFP4 dequantization.
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// cvt.rn.bf16x2.f32: d = {hi -> upper half, lo -> lower half}.
__device__ __forceinline__ uint32_t cvt_bf16x2_f32(float hi, float lo) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// cvt.rn.f16x2.e4m3x2 (sm_89+): byte 0 of a -> lower f16, byte 1 -> upper f16. Exact.
__device__ __forceinline__ uint32_t cvt_f16x2_e4m3x2(uint16_t a) {
    uint32_t d;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(d) : "h"(a));
    return d;
}

// cvt.f32.f16 of the lower / upper half of an f16x2 register.
__device__ __forceinline__ float f16_lo_to_f32(uint32_t h2) {
    float f;
    asm("{ .reg .f16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.f32.f16 %0, lo; }\n" : "=f"(f) : "r"(h2));
    return f;
}
__device__ __forceinline__ float f16_hi_to_f32(uint32_t h2) {
    float f;
    asm("{ .reg .f16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.f32.f16 %0, hi; }\n" : "=f"(f) : "r"(h2));
    return f;
}

// Thread-block cluster barrier (all threads of every CTA of the cluster), release/acquire.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// mapa.shared::cluster: the address of the same shared variable in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t mapa_shared(uint32_t addr, uint32_t rank) {
    uint32_t d;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(addr), "r"(rank));
    return d;
}

// st.shared::cluster.f32 (distributed shared memory): a store into another CTA of the cluster.
__device__ __forceinline__ void st_shared_cluster_f32(uint32_t addr, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}

// ld.shared::cluster.f32 (distributed shared memory).
__device__ __forceinline__ float ld_shared_cluster_f32(uint32_t addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
    return v;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, accumulate in place.
// A fragment (16x16, row-major), lane (g = lane / 4, t = lane % 4):
//   a0 = (row g,   cols 2t, 2t+1)   a1 = (row g+8, cols 2t, 2t+1)
//   a2 = (row g,   cols 2t+8, 2t+9) a3 = (row g+8, cols 2t+8, 2t+9)
// B fragment (16x8, "col"): b0 = (col g, rows 2t, 2t+1), b1 = (col g, rows 2t+8, 2t+9).
// C/D: c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, cols 2t, 2t+1).
struct SM80_16x8x16_F32BF16BF16F32_TN {
    __device__ __forceinline__ static void fma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

}  // namespace ptx
}  // namespace fp4tune
