// The parameter blocks of the grouped MoE operations (mirrored by gpu::MoeAlignParams and
// gpu::GroupedParams in Rust) and the routed-row schedule they share.
//
// Routing (what an engine's router hands over): topk_ids [tokens, top_k] int32, global expert ids.
// moe_align turns it into, on the GPU and without a host round trip:
//   offsets    [experts + 1]        routed rows per local expert, prefix-summed (offsets[0] = 0)
//   sorted_ids [tokens * top_k]     flat ids (token * top_k + slot) grouped by local expert, in
//                                   increasing flat id inside each expert (a stable counting sort);
//                                   the first offsets[experts] entries are valid
//   inverse    [tokens * top_k]     the sorted position of each flat id, -1 when its expert is not
//                                   local (expert parallelism) or the id is out of range
//   tiles      [TILE_LISTS][max_tiles] one list per BLOCK_M (8 .. 128): int4 (expert, first sorted
//                                   row, rows, 0) per tile of at most BLOCK_M rows of one expert,
//                                   experts in order; empty experts have no tile
//   tile_count [TILE_LISTS]         tiles in each list
// max_tiles = min(experts, tokens * top_k) + tokens * top_k / 8 bounds every list (moe::max_tiles).
#pragma once
#include "common/types.cuh"

namespace fp4tune {
namespace moe {

// Tile lists: BLOCK_M = 8 << list (8, 16, 32 for the streamed kernels, up to 128 for the tiled one).
constexpr int TILE_LISTS = 5;

struct AlignParams {
    const int32_t* topk_ids;  // [tokens, top_k]
    int32_t* offsets;         // [experts + 1]
    int32_t* sorted_ids;      // [tokens * top_k]
    int32_t* inverse;         // [tokens * top_k]
    int32_t* tiles;           // [TILE_LISTS][max_tiles][4]
    int32_t* tile_count;      // [TILE_LISTS]
    int tokens;
    int top_k;
    int expert_begin;  // global id of local expert 0
    int experts;       // local experts (E_local)
    int max_tiles;
};

// One grouped projection over the routed rows of every local expert:
//   gate_up (OP_GATE_UP): row r of expert e reads X[sorted_ids[r] / top_k] (a gather), multiplies
//     by W[e] = [gate; up] ([N, K/2] codes, N = 2I) and writes H[r] = SiLU(gate) * up ([rows, I]).
//   down (OP_DOWN): row r reads A[r] (H in sorted order) and writes Y_rows[r] = A[r] * W[e]^T ([rows, N]).
// Per expert, w and w_sf hold one ModelOpt weight (the layout of GemmParams), one after the other:
// codes N * K/2 bytes, scales 128-row-padded N x (K/16 padded to 4) bytes; alpha[e] is its scale
// (weight_scale_2, or input_scale * weight_scale_2 with NVFP4 activations).
// Activations (W4A16): bf16 rows [tokens or rows, K]. W4A4: NVFP4 codes [tokens or rows, K/2] and
// their swizzled scales a_sf (rows padded to 128: token rows for gate_up, sorted rows for down);
// the W4A4 gate_up also writes H quantized with the input scale h_scale (the down projection's
// activation global scale) into h_codes [rows, I/2] and h_sf (swizzled, sorted rows padded to 128,
// I/16 padded to 4; only entries of routed rows and real scale columns are written), bit for bit
// what the activation quantizer (common/quantize.cuh) makes of the bf16 H.
struct GroupedParams {
    const uint8_t* a;     // bf16 [tokens or rows, K], or NVFP4 codes [tokens or rows, K/2]
    const uint8_t* a_sf;  // W4A4: swizzled scales of a (unused for bf16)
    const uint8_t* w;     // [experts][N, K/2]
    const uint8_t* w_sf;  // [experts][swizzled scales]
    const float* alpha;   // [experts]
    uint16_t* y;          // bf16: H [rows, N/2] (gate_up) or Y_rows [rows, N] (down), sorted order
    const int32_t* sorted_ids;
    const int32_t* tiles;       // this kernel's tile list (its BLOCK_M)
    const int32_t* tile_count;  // its count
    uint8_t* h_codes;           // W4A4 gate_up: H as NVFP4 codes [rows, N/4] (unused otherwise)
    uint8_t* h_sf;              // W4A4 gate_up: H's swizzled scales
    float h_scale;              // W4A4 gate_up: input scale of H
    int n;
    int k;
    int top_k;
};

// The router-weighted sum of each token's rows: Y[t] = sum over slots s (in order) of
// weights[t, s] * Y_rows[inverse[t * top_k + s]] (slots whose expert is not local add nothing).
struct FinalizeParams {
    const uint16_t* rows;    // bf16 Y_rows [routed rows, n]
    const float* weights;    // [tokens, top_k]
    const int32_t* inverse;  // [tokens * top_k]
    uint16_t* y;             // bf16 [tokens, n]
    int tokens;
    int top_k;
    int n;
};

constexpr int OP_GATE_UP = 0;
constexpr int OP_DOWN = 1;

}  // namespace moe
}  // namespace fp4tune
