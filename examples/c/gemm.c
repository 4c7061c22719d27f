/* C example: one W4A16 GEMM (a GLM-5 TP8 gate_up expert, N=512, K=6144) through libfp4tune, on two
 * streams at once (two micro-batches), each stream with its own workspace.
 *
 * Build (from the repository root, after `cargo build --release`; needs only the CUDA driver):
 *   cc examples/c/gemm.c -I include -L target/release -lfp4tune -l:libcuda.so.1 -Wl,-rpath,$PWD/target/release -o target/gemm_c && target/gemm_c [results/nvidia-h200.ron]
 *
 * The data is chosen so the exact answer is known without a quantizer: every weight of row j is
 * v_j in {0.5, 1, 1.5, 2} (E2M1 codes 1..4) with block scales 1.0, every activation of row i is
 * i+1, so Y[i][j] = alpha * (i+1) * v_j * K exactly (all values are exact in bf16).
 * Device memory and streams come from the CUDA driver API, declared here so no toolkit headers are
 * needed; fp4tune_open makes the device's primary context current, which these calls then use.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4tune.h"

typedef unsigned long long CUdeviceptr;
typedef struct CUstream_st* CUstream;
extern int cuStreamCreate(CUstream* stream, unsigned int flags);
extern int cuStreamDestroy_v2(CUstream stream);
extern int cuMemAlloc_v2(CUdeviceptr* p, size_t bytes);
extern int cuMemFree_v2(CUdeviceptr p);
extern int cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes);
extern int cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes);

#define CHECK_FP4(call)                                                              \
    do {                                                                             \
        int s_ = (call);                                                             \
        if (s_ != FP4TUNE_OK) {                                                      \
            fprintf(stderr, "%s failed (%d): %s\n", #call, s_, fp4tune_last_error()); \
            return 1;                                                                \
        }                                                                            \
    } while (0)
#define CHECK_CU(call)                                            \
    do {                                                          \
        int r_ = (call);                                          \
        if (r_ != 0) {                                            \
            fprintf(stderr, "%s failed: CUresult %d\n", #call, r_); \
            return 1;                                             \
        }                                                         \
    } while (0)

static float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

int main(int argc, char** argv) {
    const char* table = argc > 1 ? argv[1] : NULL; /* NULL: no table, family defaults */
    const int M = 4, N = 512, K = 6144;
    const float alphas[2] = {0.5f, 0.25f}; /* one GEMM per stream, into its own output */

    fp4tune_dispatcher* d = NULL;
    CHECK_FP4(fp4tune_open(table, 0, &d));
    char text[4096];
    CHECK_FP4(fp4tune_report(d, text, sizeof text));
    printf("%s\n", text);

    /* Host operands in the device layout. */
    size_t w_bytes = (size_t)N * K / 2;
    /* Scales in the swizzled layout, rows padded to 128 and K/16 to 4: the library says the size. */
    size_t sf_bytes = fp4tune_scale_bytes(N, K);
    uint8_t* w = malloc(w_bytes);
    uint8_t* w_sf = malloc(sf_bytes);
    uint16_t* a = malloc((size_t)M * K * 2);
    uint16_t* y = malloc((size_t)M * N * 2 * 2);
    for (int j = 0; j < N; ++j) {
        uint8_t code = (uint8_t)(1 + j % 4); /* 0.5, 1, 1.5, 2 */
        memset(w + (size_t)j * K / 2, code | (code << 4), K / 2);
    }
    memset(w_sf, 0x38, sf_bytes); /* E4M3 1.0 everywhere: the swizzle does not matter here */
    for (int i = 0; i < M; ++i) {
        float v = (float)(i + 1);
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        for (int kk = 0; kk < K; ++kk) a[(size_t)i * K + kk] = (uint16_t)(u >> 16);
    }

    CUdeviceptr dw, dsf, da, dy;
    CHECK_CU(cuMemAlloc_v2(&dw, w_bytes));
    CHECK_CU(cuMemAlloc_v2(&dsf, sf_bytes));
    CHECK_CU(cuMemAlloc_v2(&da, (size_t)M * K * 2));
    CHECK_CU(cuMemAlloc_v2(&dy, (size_t)M * N * 2 * 2));
    CHECK_CU(cuMemcpyHtoD_v2(dw, w, w_bytes));
    CHECK_CU(cuMemcpyHtoD_v2(dsf, w_sf, sf_bytes));
    CHECK_CU(cuMemcpyHtoD_v2(da, a, (size_t)M * K * 2));

    CHECK_FP4(fp4tune_route(d, M, N, K, FP4TUNE_A_BF16, text, sizeof text));
    printf("M=%d N=%d K=%d w4a16 -> %s\n", M, N, K, text);

    /* Two streams, a workspace each (sized for M up to 64 here; 0 would take the dispatcher's
     * max_m): the launches may run at the same time without sharing scratch memory. */
    CUstream streams[2];
    fp4tune_gemm_workspace* ws[2];
    for (int s = 0; s < 2; ++s) {
        CHECK_CU(cuStreamCreate(&streams[s], 0));
        CHECK_FP4(fp4tune_gemm_workspace_create(d, 64, &ws[s]));
    }
    printf("workspace per stream: %zu bytes\n", fp4tune_gemm_workspace_bytes(ws[0]));
    for (int s = 0; s < 2; ++s) {
        CUdeviceptr ys = dy + (CUdeviceptr)s * M * N * 2;
        CHECK_FP4(fp4tune_gemm_ws(d, ws[s], da, 0, dw, dsf, ys, M, N, K, FP4TUNE_A_BF16, alphas[s],
                                  (uint64_t)(uintptr_t)streams[s]));
    }
    for (int s = 0; s < 2; ++s) CHECK_FP4(fp4tune_synchronize(d, (uint64_t)(uintptr_t)streams[s]));
    CHECK_CU(cuMemcpyDtoH_v2(y, dy, (size_t)M * N * 2 * 2));

    int bad = 0;
    for (int s = 0; s < 2; ++s)
        for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j) {
                float want = alphas[s] * (float)(i + 1) * 0.5f * (float)(1 + j % 4) * (float)K;
                float got = bf16_to_float(y[((size_t)s * M + i) * N + j]);
                if (got != want && bad++ < 5)
                    printf("stream %d: y[%d][%d] = %g, expected %g\n", s, i, j, got, want);
            }
    printf("%s: %d of %d outputs wrong\n", bad ? "FAIL" : "PASS", bad, 2 * M * N);

    for (int s = 0; s < 2; ++s) {
        fp4tune_gemm_workspace_destroy(ws[s]); /* after its launches completed (synchronized) */
        cuStreamDestroy_v2(streams[s]);
    }

    cuMemFree_v2(dw);
    cuMemFree_v2(dsf);
    cuMemFree_v2(da);
    cuMemFree_v2(dy);
    free(w);
    free(w_sf);
    free(a);
    free(y);
    fp4tune_close(d);
    return bad ? 1 : 0;
}
