// moe_order: a projection's weight codes put into the grouped layout the sm90 grouped kernels
// read (moe/layout.cuh: rows paired and in 16-row blocks of 128 k, every 32-bit word in the
// decode order of nvfp4.cuh), or back into the ModelOpt layout: bit n of every word moves to bit
// Perm::DST[n] and its 8-byte unit to its place in the other layout. The instantiation unit
// defines Perm from Rust's table (moe::order), so the permutation has one source; the device
// decode of the ordered words and the layout's maps are mirrored on the CPU there.
//
// Launch contract (runtime::moe): grid (any, experts, 1) of ORDER_THREADS threads (each CTA row y
// walks the 8-byte units of expert y), no shared memory; `src` and `dst` 8-byte aligned and
// distinct (src is a copy of the experts' codes, dst where they go), each unit read and written
// by one thread.
#pragma once
#include "common/types.cuh"
#include "moe/layout.cuh"

namespace fp4tune {
namespace moe {

constexpr int ORDER_THREADS = 256;

struct OrderParams {
    const uint8_t* src;
    uint8_t* dst;
    int n;   // weight rows per expert
    int k;   // k per row (a multiple of 16)
    int op;  // OP_GATE_UP (gate and up rows paired) or OP_DOWN
};

template <class Perm>
__device__ __forceinline__ uint32_t permute_bits(uint32_t w) {
    uint32_t o = 0;
#pragma unroll
    for (int n = 0; n < 32; ++n) o |= ((w >> n) & 1u) << Perm::DST[n];
    return o;
}

// BACK false: ModelOpt -> grouped layout; true: grouped -> ModelOpt (Perm is then the inverse).
template <class Perm, bool BACK>
__device__ __forceinline__ void moe_order(const OrderParams& p) {
    const int row_bytes = p.k / 2;
    const uint32_t row_units = static_cast<uint32_t>(row_bytes / 8);
    const uint32_t units = static_cast<uint32_t>(p.n) * row_units;
    const size_t expert = static_cast<size_t>(blockIdx.y) * static_cast<size_t>(p.n) * row_bytes;
    for (uint32_t i = blockIdx.x * ORDER_THREADS + threadIdx.x; i < units; i += gridDim.x * ORDER_THREADS) {
        const int row = static_cast<int>(i / row_units);
        const int b = static_cast<int>(i % row_units) * 8;
        const size_t plain = expert + static_cast<size_t>(row) * row_bytes + b;
        const size_t grouped = expert + code_offset(paired_row(p.op, p.n, row), b, row_bytes);
        const uint2 w = *reinterpret_cast<const uint2*>(p.src + (BACK ? grouped : plain));
        *reinterpret_cast<uint2*>(p.dst + (BACK ? plain : grouped)) =
            make_uint2(permute_bits<Perm>(w.x), permute_bits<Perm>(w.y));
    }
}

}  // namespace moe
}  // namespace fp4tune
