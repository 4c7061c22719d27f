// Where does a small-M register-streamed GEMM spend its time? (H200 probe, nvcc -O3 -arch=sm_90a
// -I templates -std=c++17 scripts/probes/direct_probe.cu). Times, cold L2 under CUDA-graph replay:
//   real   the production kernel (templates/sm90/direct.cuh) on random NVFP4 weights, M = 1
//   load0  the same grid and register ring, loads only, in the kernel's access pattern
//          (per warp instruction: 8 weight rows x 64 bytes of the ModelOpt layout)
//   load1  the same bytes, ring and grid, each warp instruction reading 512 contiguous bytes
//   floor  a plain read kernel (read_kernel below) over the same bytes, best of three grids
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#define FP4TUNE_HAVE_STDINT
#include "sm90/direct.cuh"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

using namespace fp4tune;

// Loads only: warp w owns 16 rows x the CTA's K slice / WARPS_K; DEPTH chunks in flight.
template <int PATTERN, int DEPTH, int WARPS_K, int SPLIT>
__global__ void __launch_bounds__(32 * WARPS_K) load_only(const uint8_t* w, const uint8_t* sf, int n, int k, unsigned* out) {
    const int lane = threadIdx.x & 31, wk = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    const int kslice = k / SPLIT, kw = kslice / WARPS_K;
    const int kbeg = blockIdx.z * kslice + wk * kw;
    const int chunks = kw / 128;
    unsigned acc = 0;
    uint4 ring[DEPTH][2];
    uint16_t rs[DEPTH][2];
    auto addr = [&](int c, int h) -> const uint8_t* {
        const int k0 = kbeg + c * 128;
        if (PATTERN == 0) return w + (size_t)(row0 + g + 8 * h) * (k / 2) + k0 / 2 + 16 * t;
        // contiguous: chunk (row tile, k0) is one 1 KB block
        return w + ((size_t)blockIdx.x * (k / 128) + k0 / 128) * 1024 + h * 512 + lane * 16;
    };
    const uint32_t ksf_pad = k / 16;
    auto saddr = [&](int c, int h) -> const uint8_t* {
        const int k0 = kbeg + c * 128;
        return sf + swizzled_sf_offset(row0 + g + 8 * h, k0 / 16 + 2 * t, ksf_pad);
    };
#pragma unroll
    for (int d = 0; d < DEPTH; ++d)
        if (d < chunks)
#pragma unroll
            for (int h = 0; h < 2; ++h) { ring[d][h] = ptx::ldg_stream_v4(addr(d, h)); rs[d][h] = ptx::ldg_u16(saddr(d, h)); }
    for (int base = 0; base < chunks; base += DEPTH) {
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
            const int c = base + d;
            if (c >= chunks) break;
#pragma unroll
            for (int h = 0; h < 2; ++h) acc ^= ring[d][h].x ^ ring[d][h].y ^ ring[d][h].z ^ ring[d][h].w ^ rs[d][h];
            if (c + DEPTH < chunks)
#pragma unroll
                for (int h = 0; h < 2; ++h) { ring[d][h] = ptx::ldg_stream_v4(addr(c + DEPTH, h)); rs[d][h] = ptx::ldg_u16(saddr(c + DEPTH, h)); }
        }
    }
    if (acc == 0x12345678u) out[0] = acc;
}

__global__ void read_kernel(const uint4* __restrict__ p, size_t n, unsigned* out) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldg(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

#define REAL(NAME, BM, BN, BK, WN, WK, D, SK, CLUSTER)                                                  \
    using Cfg_##NAME = sm90::DirectConfig<BM, BN, BK, WN, WK, D, SK, false>;                          \
    extern "C" __global__ void __launch_bounds__(Cfg_##NAME::THREADS) CLUSTER NAME(const GemmParams p) { \
        sm90::gemm_direct<Cfg_##NAME>(p);                                                              \
    }
REAL(tp8_a, 8, 16, 2048, 1, 4, 4, 3, __cluster_dims__(1, 1, 3))
REAL(tp8_b, 8, 16, 1024, 1, 4, 2, 6, __cluster_dims__(1, 1, 6))
REAL(tp8_c, 8, 16, 768, 1, 2, 2, 8, __cluster_dims__(1, 1, 8))
REAL(tp8_d, 8, 16, 512, 1, 4, 1, 12, )
REAL(ep_a, 8, 16, 2048, 1, 8, 2, 1, )
REAL(ep_b, 8, 16, 3072, 1, 4, 4, 2, __cluster_dims__(1, 1, 2))
REAL(ep_c, 8, 16, 6144, 1, 8, 4, 1, )
REAL(ep_d, 8, 16, 1536, 1, 4, 2, 4, __cluster_dims__(1, 1, 4))
// no split, no cluster: 16 warps along K of one 6144-k pass would need 96 KB; use k2048 x 3 passes
using Cfg_tp8_e = sm90::DirectConfig<8, 16, 6144, 1, 16, 2, 1, false>;
using Cfg_ep_e = sm90::DirectConfig<8, 32, 2048, 1, 8, 2, 1, false>;

// Ablations of gemm_direct (same pieces, parts switched off): MODE 0 = as production,
// 1 = no dequant/MMA (weights xor-folded into the accumulators), 2 = no activation slice (no
// cp.async, no barrier; B fragments read from uninitialized shared memory), 3 = no K reduction
// (every warp stores its partial tile straight to y), 4 = 1 + 3.
template <class Cfg, int MODE>
__device__ __forceinline__ void gemm_ablate(const GemmParams& p) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wk = warp / Cfg::WARPS_MN, wmn = warp % Cfg::WARPS_MN, p0 = wmn * Cfg::WARP_P;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * Cfg::BLOCK_N, m0 = blockIdx.y * Cfg::BLOCK_M;
    const int rows = min(Cfg::BLOCK_M, p.m - m0);
    const int nkb = p.k / Cfg::BLOCK_K;
    const int kb_begin = (int)(((long long)blockIdx.z * nkb) / Cfg::SPLIT_K);
    const int kb_end = (int)(((long long)(blockIdx.z + 1) * nkb) / Cfg::SPLIT_K);
    const int n_chunks = (kb_end - kb_begin) * Cfg::CHUNKS;
    const uint32_t smem_base = ptx::opaque(ptx::smem_addr(smem));
    const uint8_t* code_row[Cfg::P_TILES][2];
    const uint8_t* sf_row[Cfg::P_TILES][2];
    const uint32_t ksf_pad = (uint32_t)(((p.k / 16) + 3) / 4 * 4);
    for (int i = 0; i < Cfg::P_TILES; ++i)
        for (int h = 0; h < 2; ++h) {
            const int row = min(n0 + p0 + 16 * i + 8 * h + g, p.n - 1);
            code_row[i][h] = p.w + (size_t)row * (p.k / 2) + 16 * t;
            sf_row[i][h] = p.w_sf + swizzled_sf_offset((uint32_t)row, 2 * t, ksf_pad);
        }
    auto chunk_k = [&](int c) { return (kb_begin + c / Cfg::CHUNKS) * Cfg::BLOCK_K + wk * Cfg::K_PER_WARP + (c % Cfg::CHUNKS) * 128; };
    if (MODE != 2) sm90::copy_activation_slice<Cfg>(p, smem_base, m0, rows, kb_begin, tid);
    sm90::WeightChunk<Cfg> ring[Cfg::DEPTH];
#pragma unroll
    for (int d = 0; d < Cfg::DEPTH; ++d)
        if (d < n_chunks) ring[d].load(code_row, sf_row, chunk_k(d));
    float acc[Cfg::ACC_SETS][Cfg::P_TILES][Cfg::Q_TILES][4];
    for (int a = 0; a < Cfg::ACC_SETS; ++a) for (int i = 0; i < Cfg::P_TILES; ++i) for (int q = 0; q < Cfg::Q_TILES; ++q) for (int e = 0; e < 4; ++e) acc[a][i][q][e] = 0.0f;
    uint32_t a_off[Cfg::Q_TILES][4];
    sm90::bf16_run_offsets<Cfg>(lane, a_off);
    if (MODE != 2) { ptx::cp_async_wait<0>(); __syncthreads(); }
#pragma unroll 1
    for (int base = 0; base < n_chunks; base += Cfg::DEPTH) {
#pragma unroll
        for (int d = 0; d < Cfg::DEPTH; ++d) {
            const int c = base + d;
            if (c >= n_chunks) break;
            const int cc = c % Cfg::CHUNKS;
            if (MODE == 1 || MODE == 4) {
                acc[0][0][0][0] += __uint_as_float((ring[d].code[0][0].x ^ ring[d].code[0][1].w ^ ring[d].sf[0][0]) & 0x3fffffff);
            } else {
                sm90::chunk_mma<Cfg>(ring[d], sm90::SliceActivations<Cfg>{smem, wk * Cfg::K_PER_WARP + cc * 128, a_off},
                                     lane, acc);
            }
            if (c + Cfg::DEPTH < n_chunks) ring[d].load(code_row, sf_row, chunk_k(c + Cfg::DEPTH));
        }
    }
    for (int a = 1; a < Cfg::ACC_SETS; ++a) for (int i = 0; i < Cfg::P_TILES; ++i) for (int q = 0; q < Cfg::Q_TILES; ++q) for (int e = 0; e < 4; ++e) acc[0][i][q][e] += acc[a][i][q][e];
    if (MODE == 3 || MODE == 4) {
        sm90::for_each_output<Cfg>(m0, n0, p0, 0, lane, p.m, p.n, [&](int i, int q, int e, int m, int n) {
            p.y[(size_t)m * p.n + n] = float_to_bf16_bits(acc[0][i][q][e]);
        });
    } else {
        sm90::direct_epilogue<Cfg>(p, smem, acc[0], m0, n0, p0, wk, wmn, lane, tid);
    }
}
#define ABL(NAME, CFG, MODE, CLUSTER) \
    extern "C" __global__ void __launch_bounds__(CFG::THREADS) CLUSTER NAME(const GemmParams p) { gemm_ablate<CFG, MODE>(p); }
ABL(tp8_a0, Cfg_tp8_a, 0, __cluster_dims__(1, 1, 3))
ABL(tp8_a1, Cfg_tp8_a, 1, __cluster_dims__(1, 1, 3))
ABL(tp8_a2, Cfg_tp8_a, 2, __cluster_dims__(1, 1, 3))
ABL(tp8_a3, Cfg_tp8_a, 3, __cluster_dims__(1, 1, 3))
ABL(tp8_a4, Cfg_tp8_a, 4, __cluster_dims__(1, 1, 3))
ABL(tp8_e0, Cfg_tp8_e, 0, )
ABL(tp8_e1, Cfg_tp8_e, 1, )
ABL(tp8_e2, Cfg_tp8_e, 2, )
ABL(tp8_e3, Cfg_tp8_e, 3, )
ABL(ep_a0, Cfg_ep_a, 0, )
ABL(ep_a1, Cfg_ep_a, 1, )
ABL(ep_a2, Cfg_ep_a, 2, )
ABL(ep_a3, Cfg_ep_a, 3, )
ABL(ep_e0, Cfg_ep_e, 0, )
ABL(ep_e1, Cfg_ep_e, 1, )

struct Bufs { std::vector<uint8_t*> w, sf, a; int copies; };

template <class F>
float time_graph(int copies, F launch) {
    cudaStream_t st; CK(cudaStreamCreate(&st));
    cudaGraph_t g; cudaGraphExec_t ge; int reps = std::max(copies, 100);
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int r = 0; r < reps; r++) launch(r % copies, st);
    CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    std::vector<float> ts;
    for (int i = 0; i < 9; i++) {
        CK(cudaEventRecord(a, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
        float ms; CK(cudaEventElapsedTime(&ms, a, b)); ts.push_back(ms * 1000.f / reps);
    }
    std::sort(ts.begin() + 1, ts.end());
    CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g)); CK(cudaStreamDestroy(st));
    return ts[1 + (ts.size() - 1) / 2];
}

template <class Cfg>
float time_real(void (*kern)(const GemmParams), Bufs& b, int n, int k, uint16_t* y, float* ws, uint32_t* cnt) {
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES));
    dim3 grid((n + Cfg::BLOCK_N - 1) / Cfg::BLOCK_N, 1, Cfg::SPLIT_K);
    return time_graph(b.copies, [&](int i, cudaStream_t st) {
        GemmParams p{b.a[i], nullptr, b.w[i], b.sf[i], y, ws, cnt, 1, n, k, 1.0f};
        kern<<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, st>>>(p);
    });
}

template <int PATTERN, int DEPTH, int WARPS_K, int SPLIT>
float time_load(Bufs& b, int n, int k, unsigned* out) {
    dim3 grid(n / 16, 1, SPLIT);
    return time_graph(b.copies, [&](int i, cudaStream_t st) {
        load_only<PATTERN, DEPTH, WARPS_K, SPLIT><<<grid, 32 * WARPS_K, 0, st>>>(b.w[i], b.sf[i], n, k, out);
    });
}

int main() {
    uint16_t* y; float* ws; uint32_t* cnt; unsigned* out;
    CK(cudaMalloc(&y, 1 << 20)); CK(cudaMalloc(&ws, 64 << 20)); CK(cudaMalloc(&cnt, 1 << 20)); CK(cudaMalloc(&out, 4));
    CK(cudaMemset(cnt, 0, 1 << 20));
    for (int shape = 0; shape < 2; shape++) {
        const int n = shape == 0 ? 512 : 4096, k = 6144;
        const size_t wb = (size_t)n * k / 2, sfb = (size_t)((n + 127) / 128 * 128) * (k / 16), ab = (size_t)k * 2;
        Bufs b; b.copies = std::max(2, (int)(300e6 / (wb + sfb)) + 1);
        for (int i = 0; i < b.copies; i++) {
            uint8_t *w, *s, *a;
            CK(cudaMalloc(&w, wb)); CK(cudaMalloc(&s, sfb)); CK(cudaMalloc(&a, ab));
            CK(cudaMemset(w, 0x35, wb)); CK(cudaMemset(s, 0x38, sfb)); CK(cudaMemset(a, 0x3f, ab));
            b.w.push_back(w); b.sf.push_back(s); b.a.push_back(a);
        }
        printf("shape N=%d K=%d: %.2f MB codes + %.2f MB scales, %d rotating copies\n", n, k, wb / 1e6, sfb / 1e6, b.copies);
        if (shape == 0) {
            printf("real tp8_a m8n16k2048 w1x1x4 r4 sk3 : %.2f us\n", time_real<Cfg_tp8_a>(tp8_a, b, n, k, y, ws, cnt));
            printf("ablate tp8_a: prod %.2f | no-mma %.2f | no-slice %.2f | no-reduce %.2f | no-mma+no-reduce %.2f us\n",
                   time_real<Cfg_tp8_a>(tp8_a0, b, n, k, y, ws, cnt), time_real<Cfg_tp8_a>(tp8_a1, b, n, k, y, ws, cnt),
                   time_real<Cfg_tp8_a>(tp8_a2, b, n, k, y, ws, cnt), time_real<Cfg_tp8_a>(tp8_a3, b, n, k, y, ws, cnt),
                   time_real<Cfg_tp8_a>(tp8_a4, b, n, k, y, ws, cnt));
            printf("ablate tp8_e m8n16k6144 w1x1x16 r2 sk1: prod %.2f | no-mma %.2f | no-slice %.2f | no-reduce %.2f us\n",
                   time_real<Cfg_tp8_e>(tp8_e0, b, n, k, y, ws, cnt), time_real<Cfg_tp8_e>(tp8_e1, b, n, k, y, ws, cnt),
                   time_real<Cfg_tp8_e>(tp8_e2, b, n, k, y, ws, cnt), time_real<Cfg_tp8_e>(tp8_e3, b, n, k, y, ws, cnt));
            printf("real tp8_b m8n16k1024 w1x1x4 r2 sk6 : %.2f us\n", time_real<Cfg_tp8_b>(tp8_b, b, n, k, y, ws, cnt));
            printf("real tp8_c m8n16k768 w1x1x2 r2 sk8  : %.2f us\n", time_real<Cfg_tp8_c>(tp8_c, b, n, k, y, ws, cnt));
            printf("real tp8_d m8n16k512 w1x1x4 r1 sk12 : %.2f us\n", time_real<Cfg_tp8_d>(tp8_d, b, n, k, y, ws, cnt));
            printf("load0 d4 wk4 sk3 : %.2f us   load1: %.2f us\n", time_load<0, 4, 4, 3>(b, n, k, out), time_load<1, 4, 4, 3>(b, n, k, out));
            printf("load0 d2 wk4 sk6 : %.2f us   load1: %.2f us\n", time_load<0, 2, 4, 6>(b, n, k, out), time_load<1, 2, 4, 6>(b, n, k, out));
            printf("load0 d1 wk4 sk12: %.2f us   load1: %.2f us\n", time_load<0, 1, 4, 12>(b, n, k, out), time_load<1, 1, 4, 12>(b, n, k, out));
            printf("load0 d1 wk8 sk6 : %.2f us   load1: %.2f us\n", time_load<0, 1, 8, 6>(b, n, k, out), time_load<1, 1, 8, 6>(b, n, k, out));
            printf("load0 d2 wk8 sk3 : %.2f us   load1: %.2f us\n", time_load<0, 2, 8, 3>(b, n, k, out), time_load<1, 2, 8, 3>(b, n, k, out));
            printf("load0 d1 wk16 sk3: %.2f us   load1: %.2f us\n", time_load<0, 1, 16, 3>(b, n, k, out), time_load<1, 1, 16, 3>(b, n, k, out));
        } else {
            printf("real ep_a m8n16k2048 w1x1x8 r2 sk1 : %.2f us\n", time_real<Cfg_ep_a>(ep_a, b, n, k, y, ws, cnt));
            printf("ablate ep_a: prod %.2f | no-mma %.2f | no-slice %.2f | no-reduce %.2f us\n",
                   time_real<Cfg_ep_a>(ep_a0, b, n, k, y, ws, cnt), time_real<Cfg_ep_a>(ep_a1, b, n, k, y, ws, cnt),
                   time_real<Cfg_ep_a>(ep_a2, b, n, k, y, ws, cnt), time_real<Cfg_ep_a>(ep_a3, b, n, k, y, ws, cnt));
            printf("ablate ep_e m8n32k2048 w1x1x8 r2 sk1: prod %.2f | no-mma %.2f us\n",
                   time_real<Cfg_ep_e>(ep_e0, b, n, k, y, ws, cnt), time_real<Cfg_ep_e>(ep_e1, b, n, k, y, ws, cnt));
            printf("real ep_b m8n16k3072 w1x1x4 r4 sk2 : %.2f us\n", time_real<Cfg_ep_b>(ep_b, b, n, k, y, ws, cnt));
            printf("real ep_c m8n16k6144 w1x1x8 r4 sk1 : %.2f us\n", time_real<Cfg_ep_c>(ep_c, b, n, k, y, ws, cnt));
            printf("real ep_d m8n16k1536 w1x1x4 r2 sk4 : %.2f us\n", time_real<Cfg_ep_d>(ep_d, b, n, k, y, ws, cnt));
            printf("load0 d4 wk8 sk1 : %.2f us   load1: %.2f us\n", time_load<0, 4, 8, 1>(b, n, k, out), time_load<1, 4, 8, 1>(b, n, k, out));
            printf("load0 d8 wk8 sk1 : %.2f us   load1: %.2f us\n", time_load<0, 8, 8, 1>(b, n, k, out), time_load<1, 8, 8, 1>(b, n, k, out));
            printf("load0 d4 wk4 sk2 : %.2f us   load1: %.2f us\n", time_load<0, 4, 4, 2>(b, n, k, out), time_load<1, 4, 4, 2>(b, n, k, out));
            printf("load0 d2 wk4 sk4 : %.2f us   load1: %.2f us\n", time_load<0, 2, 4, 4>(b, n, k, out), time_load<1, 2, 4, 4>(b, n, k, out));
            printf("load0 d4 wk16 sk1: %.2f us   load1: %.2f us\n", time_load<0, 4, 16, 1>(b, n, k, out), time_load<1, 4, 16, 1>(b, n, k, out));
            printf("load0 d2 wk16 sk2: %.2f us   load1: %.2f us\n", time_load<0, 2, 16, 2>(b, n, k, out), time_load<1, 2, 16, 2>(b, n, k, out));
        }
        // Read floor of the same bytes (codes + scales), best of a few grids.
        const size_t nbytes = (wb + sfb) / 16 * 16;
        float best = 1e9f;
        for (int blocks : {264, 528, 1056}) {
            float t = time_graph(b.copies, [&](int i, cudaStream_t st) { read_kernel<<<blocks, 512, 0, st>>>((const uint4*)b.w[i], (wb) / 16, out); });
            best = std::min(best, t);
        }
        printf("floor (codes only, best grid): %.2f us\n", best);
        for (int i = 0; i < b.copies; i++) { cudaFree(b.w[i]); cudaFree(b.sf[i]); cudaFree(b.a[i]); }
    }
    return 0;
}
