// Dequantization of an NVFP4 matrix (ModelOpt codes + swizzled UE4M3 block scales) to a bf16
// matrix: the first half of the dequantize-then-cuBLAS method (table::Method::DequantCublasBf16,
// tuner/src/runtime/composite.rs), which the runtime launches where the tuner measured it faster
// than every fused kernel (large M). out[r, k] = e2m1(code) * e4m3(scale of block k / 16), exact
// in bf16 (a product of a 2-bit and a 4-bit significand, magnitude 2^-10 .. 2688); the global
// scale (alpha) is left to the GEMM. Outside every family's template hash (a table's hash check
// is about its fused kernels).
#pragma once
#include "common/nvfp4.cuh"
#include "common/params.cuh"
#include "common/ptx.cuh"

// 2^7 in both halves of a bf16x2: undoes nvfp4::OPERAND_LOG2 (exact, a power of two).
constexpr uint32_t FP4TUNE_DEQUANT_UNDO_BF16X2 = 0x43004300u;

// One thread per 32-bit word of codes (8 elements): 4 bytes in, one 16-byte store out, so a warp
// reads 128 contiguous bytes and writes 512 (every load and store instruction coalesced; a
// version with one thread per 64 elements wrote 16 bytes every 128 and measured slower).
// Per word: the fused kernels' pair extraction and bf16 multiply by the prepared scale
// (nvfp4.cuh), one multiply by 2^7, and 4 byte permutes from (element s, element s + 4) pairs back
// to row order.
extern "C" __global__ void __launch_bounds__(256)
    fp4tune_dequant_bf16(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ sf,
                         uint16_t* __restrict__ out, uint64_t rows, uint64_t k) {
    using namespace fp4tune;
    const uint64_t words = k / 8;  // code words per row (k is a multiple of 16)
    const uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * words) return;
    const uint32_t r = static_cast<uint32_t>(i / words);
    const uint32_t w = static_cast<uint32_t>(i % words);
    const uint32_t ksf_pad = static_cast<uint32_t>((k / 16 + 3) / 4 * 4);
    const uint32_t code = reinterpret_cast<const uint32_t*>(codes)[i];  // rows are k/2 bytes: word i
    const uint8_t s_code = sf[swizzled_sf_offset(r, w / 2, ksf_pad)];
    const uint32_t scale = nvfp4::e4m3_prepared(s_code);
    uint32_t p[4];
    nvfp4::dequant_word(code, scale, p);
#pragma unroll
    for (int s = 0; s < 4; ++s) p[s] = ptx::mul_bf16x2(p[s], FP4TUNE_DEQUANT_UNDO_BF16X2);
    // p[s] = (element s, element s + 4) of the word: back to (2j, 2j + 1) pairs.
    reinterpret_cast<uint4*>(out)[i] = make_uint4(ptx::prmt(p[0], p[1], 0x5410u), ptx::prmt(p[2], p[3], 0x5410u),
                                                  ptx::prmt(p[0], p[1], 0x7632u), ptx::prmt(p[2], p[3], 0x7632u));
}
