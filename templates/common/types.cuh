// Fixed-width integer and float helpers without any system header: the NVRTC wheel ships none.
#pragma once

// nvcc builds (probes in scripts/probes/) include <cstdint> and define FP4TUNE_HAVE_STDINT.
#ifndef FP4TUNE_HAVE_STDINT
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef signed char int8_t;
typedef int int32_t;
typedef long long int64_t;
#endif

namespace fp4tune {

// bf16 bits <-> float without cuda_bf16.h.
__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Round-to-nearest-even float -> bf16 bits (NaN kept quiet).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
    uint16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

}  // namespace fp4tune
