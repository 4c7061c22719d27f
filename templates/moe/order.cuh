// moe_order: a layer's weight codes put into the decode order the grouped sm90 kernels read
// (nvfp4.cuh), or back into the ModelOpt order, in place: bit n of every 32-bit word moves to bit
// Perm::DST[n]. The instantiation unit defines Perm from Rust's table (moe::order), so the
// permutation has one source; the device decode of the ordered words is mirrored on the CPU there.
//
// Launch contract (runtime::moe): any grid of ORDER_THREADS threads (a grid-stride loop over the
// words), no shared memory; `words` 4-byte aligned, each word read and written by one thread.
#pragma once
#include "common/types.cuh"

namespace fp4tune {
namespace moe {

constexpr int ORDER_THREADS = 256;

struct OrderParams {
    uint32_t* words;
    unsigned long long count;
};

template <class Perm>
__device__ __forceinline__ void moe_order(const OrderParams& p) {
    const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * ORDER_THREADS;
    for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * ORDER_THREADS + threadIdx.x;
         i < p.count; i += stride) {
        const uint32_t w = p.words[i];
        uint32_t o = 0;
#pragma unroll
        for (int n = 0; n < 32; ++n) o |= ((w >> n) & 1u) << Perm::DST[n];
        p.words[i] = o;
    }
}

}  // namespace moe
}  // namespace fp4tune
