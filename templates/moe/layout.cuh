// The grouped layout: where the sm90 grouped kernels find a layer's weight codes.
//
// Per expert (N weight rows of K/2 bytes; N % 16 == 0, K % 16 == 0) the rows are taken in the
// pairing order of the kernels' m16 tiles: paired row rho = 16 T + 8 h + g is, for gate_up
// (N = 2I), gate row 8T + g (h = 0) or up row I + 8T + g (h = 1), so that an m16 tile's row halves
// are a gate row and its up row; for down, row rho. Row group T (paired rows 16T .. 16T + 15)
// takes the 16 * K/2 bytes at T * 8K. In it, bytes [64c, 64c + 64) of its 16 rows (128 k, chunk
// c < K / 128) are one 1 KB block at c * 1024, paired row rho at (rho % 16) * 64: for an m16 tile
// that is [row half h][lane g * 4 + t][16 bytes], the order in which a warp's 16-byte copies of
// (tile, h) read it, 512 contiguous bytes per copy instruction. The rest of each row (the last
// (K/2) % 64 bytes when 128 does not divide K) follows the blocks, the group's rows one after
// another. Every 32-bit word is in the decode order (common/nvfp4.cuh).
//
// The runtime puts a layer's codes into this layout once at load (moe/order.cuh); moe::order
// (Rust) mirrors these maps and checks them.
#pragma once
#include "common/types.cuh"
#include "moe/params.cuh"

namespace fp4tune {
namespace moe {

constexpr int CODE_GROUP_ROWS = 16;     // paired rows per row group
constexpr int CODE_BLOCK_BYTES = 1024;  // one block: 16 rows x 64 bytes (128 k)
constexpr int CODE_BLOCK_ROW_BYTES = 64;

// The paired row of weight row `row` of an expert with n rows (OP_GATE_UP: gate rows 0 .. n/2,
// up rows n/2 .. n).
__host__ __device__ __forceinline__ int paired_row(int op, int n, int row) {
    if (op != OP_GATE_UP) return row;
    const int half = n / 2;
    const int h = row >= half ? 1 : 0;
    const int j = row - h * half;
    return (j >> 3) * 16 + h * 8 + (j & 7);
}

// The byte offset, from the start of the row group of paired row rho, of byte b of that row
// (row_bytes = K/2 per row).
__host__ __device__ __forceinline__ uint32_t code_in_group(int rho16, int b, int row_bytes) {
    const int full = row_bytes & ~(CODE_BLOCK_ROW_BYTES - 1);  // bytes of each row in whole blocks
    return b < full ? static_cast<uint32_t>((b >> 6) * CODE_BLOCK_BYTES + rho16 * CODE_BLOCK_ROW_BYTES + (b & 63))
                    : static_cast<uint32_t>(full * CODE_GROUP_ROWS + rho16 * (row_bytes - full) + (b - full));
}

// The byte offset in its expert's codes of the row group of paired row rho.
__host__ __device__ __forceinline__ size_t code_group(int rho, int row_bytes) {
    return static_cast<size_t>(rho >> 4) * CODE_GROUP_ROWS * static_cast<size_t>(row_bytes);
}

// The byte offset in its expert's codes of byte b of paired row rho.
__host__ __device__ __forceinline__ size_t code_offset(int rho, int b, int row_bytes) {
    return code_group(rho, row_bytes) + code_in_group(rho & 15, b, row_bytes);
}

}  // namespace moe
}  // namespace fp4tune
