// Verification of a GEMM candidate's output on the GPU against the CPU reference (its values and
// per-element bounds uploaded once per problem), so large outputs need not be copied back: counts
// the elements outside their bound (NaN counts) and the elements that differ between two runs,
// and keeps the worst element (largest |err| / bound, NaN first, then the lowest index).
#pragma once
#include "common/types.cuh"

// stats[0]: elements outside the bound; stats[1]: elements that differ from y2;
// stats[2]: the worst element as (score bits << 32) | (0xFFFFFFFF - index), an atomicMax key.
extern "C" __global__ void __launch_bounds__(256) fp4tune_check_output(
    const uint16_t* __restrict__ y, const uint16_t* __restrict__ y2,
    const float* __restrict__ ref, const float* __restrict__ tol, uint64_t n,
    unsigned long long* stats) {
    unsigned long long bad = 0, diff = 0, worst = 0;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint16_t bits = y[i];
        const float v = __uint_as_float((uint32_t)bits << 16);
        const float e = fabsf(v - ref[i]);
        diff += bits != y2[i];
        // `!(e <= t)` is true for NaN errors.
        if (!(e <= tol[i])) {
            ++bad;
            const float score = (e != e) ? __int_as_float(0x7f800000) : e / tol[i];
            const unsigned long long key =
                ((unsigned long long)__float_as_uint(score) << 32) | (0xFFFFFFFFull - (uint32_t)i);
            worst = key > worst ? key : worst;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        bad += __shfl_xor_sync(0xFFFFFFFFu, bad, o);
        diff += __shfl_xor_sync(0xFFFFFFFFu, diff, o);
        const unsigned long long w = __shfl_xor_sync(0xFFFFFFFFu, worst, o);
        worst = w > worst ? w : worst;
    }
    if ((threadIdx.x & 31) == 0) {
        if (bad) atomicAdd(&stats[0], bad);
        if (diff) atomicAdd(&stats[1], diff);
        if (worst) atomicMax(&stats[2], worst);
    }
}
