// Dequantization of an NVFP4 matrix (ModelOpt codes + swizzled UE4M3 block scales) to a bf16
// matrix, for the dequantize-then-cuBLAS path the benchmark measures next to the fused kernels
// (tuner/src/bench/composite.rs). out[r, k] = e2m1(code) * e4m3(scale of block k / 16): exact in
// bf16 (a product of a 2-bit and a 4-bit significand, magnitude 2^-10 .. 2688); the global scale
// (alpha) is left to the GEMM.
#pragma once
#include "common/params.cuh"
#include "common/ptx.cuh"

// E2M1 code (sign, e1 e0, m) -> fp32: m/2 for e = 0, 2^(e-1) * (1 + m/2) otherwise.
__device__ __forceinline__ float fp4tune_e2m1_to_f32(uint32_t code) {
    const uint32_t e = (code >> 1) & 3u;
    const uint32_t m = code & 1u;
    const float mag = e == 0 ? 0.5f * static_cast<float>(m) : __uint_as_float(((e + 126u) << 23) | (m << 22));
    return (code & 8u) ? -mag : mag;
}

// One thread per 16-element scale block: 8 bytes of codes in, 32 bytes of bf16 out, consecutive
// threads on consecutive blocks of a row (coalesced). rows x k codes, k a multiple of 16.
extern "C" __global__ void __launch_bounds__(256)
    fp4tune_dequant_bf16(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ sf,
                         uint16_t* __restrict__ out, uint64_t rows, uint64_t k) {
    const uint64_t blocks_per_row = k / 16;
    const uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * blocks_per_row) return;
    const uint32_t r = static_cast<uint32_t>(i / blocks_per_row);
    const uint32_t kb = static_cast<uint32_t>(i % blocks_per_row);
    const uint32_t ksf_pad = static_cast<uint32_t>((blocks_per_row + 3) / 4 * 4);
    const uint2 c = *reinterpret_cast<const uint2*>(codes + static_cast<uint64_t>(r) * (k / 2) + kb * 8u);
    const uint8_t s_code = sf[fp4tune::swizzled_sf_offset(r, kb, ksf_pad)];
    const float s = fp4tune::ptx::f16_lo_to_f32(fp4tune::ptx::cvt_f16x2_e4m3x2(static_cast<uint16_t>(s_code)));
    uint32_t words[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const uint32_t src = j < 4 ? c.x : c.y;
        const uint32_t lo = (src >> (8 * (j & 3))) & 0xFu;        // element 2j: low nibble
        const uint32_t hi = (src >> (8 * (j & 3) + 4)) & 0xFu;    // element 2j + 1
        // Exact products: truncating the fp32 to its upper half is the bf16 value.
        const uint32_t b0 = __float_as_uint(fp4tune_e2m1_to_f32(lo) * s) >> 16;
        const uint32_t b1 = __float_as_uint(fp4tune_e2m1_to_f32(hi) * s) >> 16;
        words[j] = b0 | (b1 << 16);
    }
    uint4* dst = reinterpret_cast<uint4*>(out + static_cast<uint64_t>(r) * k + kb * 16u);
    dst[0] = make_uint4(words[0], words[1], words[2], words[3]);
    dst[1] = make_uint4(words[4], words[5], words[6], words[7]);
}
