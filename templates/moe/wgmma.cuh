// Hopper's warpgroup MMA (wgmma) for the grouped wgmma kernel (moe/sm90_wgmma.cuh): the
// instruction with its A operand in registers, its fences, and the shared-memory layout and
// descriptor of its B operand. tuner/src/moe/wgmma.rs mirrors the layout functions and tests them.
//
// wgmma.mma_async.m64nNk16 (bf16 in, fp32 accumulators) multiplies a 64 x 16 A held in the
// registers of the 4 warps of a warpgroup by a 16 x N B read from shared memory by the hardware:
// - A: warp w of the warpgroup holds rows 16w .. 16w + 15 in the m16n8k16 A fragment of mma.sync
//   (a0 = row g, k 2t and 2t + 1; a1 = row g + 8, the same k; a2, a3 = k 2t + 8, 2t + 9).
// - D: warp w holds rows 16w + g and 16w + g + 8 of every n8 column block j: d[4j + e] = row
//   g + 8 (e / 2), column 8j + 2t + e % 2 (the m16n8 C fragment of mma.sync, repeated along N).
// - B: N rows of 16 k, K-major (each row's k contiguous), in the 128-byte swizzle: rows of 64 k
//   (128 bytes) in atoms of 8 rows (1024 bytes), the 16-byte unit c of row r stored at unit
//   c ^ (r % 8); a k16 step inside the atom starts 32 bytes further on.
// The instruction is asynchronous: the A registers and the accumulators must not be touched until
// wgmma.wait_group says its group is done (ptxas keeps their registers alive until then).
#pragma once
#include "common/types.cuh"

namespace fp4tune {
namespace wgmma {

// The 16-byte unit of (row r, 16-byte unit u of the row's k) in a B tile of ROWS rows:
// u / 8 picks the 64-k atom column (ROWS x 128 bytes each), u % 8 the unit inside the row.
template <int ROWS>
__host__ __device__ constexpr int b_offset(int r, int u) {
    return (u >> 3) * ROWS * 128 + r * 128 + (((u & 7) ^ (r & 7)) << 4);
}

// The descriptor of a K-major, 128-byte-swizzled B operand at shared address addr (1024-aligned
// atom, plus 32 bytes per k16 step): start address, leading byte offset 16 (unused by the
// swizzled K-major layout), stride byte offset 1024 (one 8-row atom), swizzle mode 1 (128 B).
__device__ __forceinline__ uint64_t b_descriptor(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(16 >> 4) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}

// Orders the warp's earlier register writes (the A fragments) before the wgmma that reads them.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most N of the warp's committed wgmma groups are still running.
template <int N>
__device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Makes the generic proxy's shared-memory writes (cp.async, st.shared) visible to the async proxy
// that wgmma reads B through.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Pins a register's value at this point of the instruction order: the compiler can move neither
// its computation below (an A fragment defined between wgmmas makes ptxas serialize them) nor
// its reads above (an accumulator read before the wait that completes it).
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }

// D (fp32, N / 2 per lane) += A (bf16, registers) * B (bf16, descriptor); one instruction per N,
// its operand lists spelled out.
template <int N>
struct Mma;

template <>
struct Mma<32> {
    __device__ __forceinline__ static void run(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
            "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1)
            : "memory");
    }
};

template <>
struct Mma<64> {
    __device__ __forceinline__ static void run(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
            "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1)
            : "memory");
    }
};

template <>
struct Mma<128> {
    __device__ __forceinline__ static void run(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
            "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1)
            : "memory");
    }
};

}  // namespace wgmma
}  // namespace fp4tune
