/* fp4tune: the C ABI of the NVFP4 GEMM runtime dispatcher (libfp4tune.so).
 *
 * Open a dispatch table (results/<sku>.ron) once at start-up: the dispatcher opens the device's
 * primary context (the one the CUDA runtime and PyTorch use), checks the table against the device,
 * compiles or loads from its cubin cache every kernel the table names, and loads them. Then launch
 * GEMMs by shape on your device pointers and stream; the launch path does no allocation, no
 * compilation and no synchronization.
 *
 *   Y[M, N] (bf16) = alpha * A[M, K] * W[N, K]^T
 *
 * Device data layout (see ARCHITECTURE.md, "Data layout"):
 *   w     [N, K/2] bytes, element 2j in the low nibble (ModelOpt NVFP4 layout)
 *   w_sf  UE4M3 block scales (one per 16 K elements) in the swizzled 128x4 layout:
 *         rows padded to 128, scale columns (K/16) padded to 4; byte offset of (row r, column c):
 *         ((r/128)*(Kp/4) + c/4)*512 + (r%32)*16 + ((r/32)%4)*4 + c%4,  Kp = K/16 rounded up to 4
 *   a     FP4TUNE_A_BF16: bf16 [M, K] row-major; FP4TUNE_A_NVFP4: [M, K/2] codes like w
 *   a_sf  FP4TUNE_A_NVFP4: swizzled scales like w_sf (rows padded to 128); FP4TUNE_A_BF16: unused (0)
 *   y     bf16 [M, N] row-major
 *   alpha weight_scale_2 (W4A16) or input_scale * weight_scale_2 (W4A4), applied last in fp32
 *
 * Errors: every function returning int returns an fp4tune_status; on failure
 * fp4tune_last_error() holds a message for the calling thread. Thread safety: a dispatcher may be
 * used by several threads at once; close it once, after all other calls returned. A call that
 * touches the device makes the device's primary context current on the calling thread and leaves
 * it current (the context cudaSetDevice(device) selects): a thread that drives several devices
 * selects its device again after calling into another device's dispatcher. The void calls
 * (fp4tune_close, the workspace destroys) report nothing: call fp4tune_synchronize first to see
 * an asynchronous kernel error.
 *
 * Streams: split-K kernels and dequantize-then-cuBLAS entries need scratch memory. Give every
 * stream that launches GEMMs a workspace of its own (fp4tune_gemm_workspace_create, sized at
 * creation) and launch with fp4tune_gemm_ws: launches on different streams then never share
 * scratch (two micro-batches on two streams stay correct), and a launch allocates and synchronizes
 * nothing (capturable in a CUDA graph). fp4tune_gemm uses the dispatcher's own workspace and is
 * meant for callers on a single stream.
 *
 * Build against it: cc app.c -I include -L target/release -lfp4tune (and -Wl,-rpath,...).
 */
#ifndef FP4TUNE_H
#define FP4TUNE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FP4TUNE_API __attribute__((visibility("default")))
#else
#define FP4TUNE_API
#endif

#define FP4TUNE_ABI_VERSION 3

typedef enum fp4tune_status {
    FP4TUNE_OK = 0,
    FP4TUNE_ERR_INVALID_ARGUMENT = 1, /* NULL or misaligned pointer, bad shape, unknown enum value */
    FP4TUNE_ERR_TABLE = 2,            /* table unreadable, malformed, or not matching (policy error) */
    FP4TUNE_ERR_DEVICE = 3,           /* no driver/device, unsupported compute capability */
    FP4TUNE_ERR_COMPILE = 4,          /* NVRTC missing, cache folder unusable, a kernel failed to build */
    FP4TUNE_ERR_LAUNCH = 5,           /* the driver refused the launch, or an asynchronous kernel error */
    FP4TUNE_ERR_NO_KERNEL = 6,        /* no legal kernel for this shape, not even the default */
    FP4TUNE_ERR_PANIC = 7             /* internal error; the message says where */
} fp4tune_status;

typedef enum fp4tune_a_type {
    FP4TUNE_A_NVFP4 = 0, /* W4A4: activations NVFP4 (codes + swizzled scales) */
    FP4TUNE_A_BF16 = 1   /* W4A16: activations bf16 */
} fp4tune_a_type;

typedef enum fp4tune_policy {
    FP4TUNE_POLICY_WARN = 0,  /* mismatching table parts warn and fall back to family defaults */
    FP4TUNE_POLICY_ERROR = 1, /* any device/template mismatch fails the open */
    FP4TUNE_POLICY_IGNORE = 2 /* warn, but use every entry anyway */
} fp4tune_policy;

typedef struct Fp4tuneDispatcher fp4tune_dispatcher;

/* FP4TUNE_ABI_VERSION of the library actually loaded. */
FP4TUNE_API uint32_t fp4tune_abi_version(void);

/* Message of the most recent failed call on this thread ("" if none); valid until the next
 * failing call on this thread. */
FP4TUNE_API const char* fp4tune_last_error(void);

/* Open CUDA device `device` with the table at `table_path` (NULL: no table, family defaults for
 * every shape). Cubin cache: $FP4TUNE_CACHE, else $XDG_CACHE_HOME/fp4tune/cubin, else
 * ~/.cache/fp4tune/cubin (created if missing; one this process cannot write is only read).
 * Mismatch policy: warn. On success *out is the handle; on failure *out is NULL. */
FP4TUNE_API int fp4tune_open(const char* table_path, int device, fp4tune_dispatcher** out);

/* fp4tune_open with options: cache_dir (NULL: default), policy (fp4tune_policy), max_m (the
 * dispatcher's own workspace, the one fp4tune_gemm uses, is sized at open for M up to this; 0: 8192;
 * larger M grows it on first use; also the default max_m of fp4tune_gemm_workspace_create). */
FP4TUNE_API int fp4tune_open_ex(const char* table_path, int device, const char* cache_dir,
                                int policy, uint32_t max_m, fp4tune_dispatcher** out);

/* Launch Y = alpha * A * W^T with the table's kernel for (m, n, k, a_type) on `stream` (a
 * CUstream / cudaStream_t as an integer, 0 = legacy default stream). Pointers are device addresses
 * (cast with (uint64_t)(uintptr_t)ptr). Asynchronous; `a_sf` may be 0 for FP4TUNE_A_BF16.
 * Scratch: the dispatcher's own workspace, for one stream (e.g. the default stream): launches of
 * split-K or dequantize-then-cuBLAS entries through fp4tune_gemm must not overlap on the GPU; a
 * launch that needs more than it holds grows it (waits for the device; refused during capture).
 * Callers on several streams use fp4tune_gemm_ws.
 * Alignment (checked; a misaligned pointer returns FP4TUNE_ERR_INVALID_ARGUMENT before any launch,
 * as it would fault the kernel): `a` and `w` 16-byte aligned (16-byte cp.async loads); `w_sf`,
 * `a_sf` (FP4TUNE_A_NVFP4) and `y` 4-byte aligned. cudaMalloc'd buffers (256-byte aligned) qualify;
 * views into them (a row offset, a slice of a stacked tensor) must keep these alignments.
 * Scale buffers are read in the swizzled layout padded to 128 rows (and K/16 to 4 columns):
 * allocate w_sf with fp4tune_scale_bytes(n, k) bytes and a_sf with fp4tune_scale_bytes(m, k). */
FP4TUNE_API int fp4tune_gemm(const fp4tune_dispatcher* d, uint64_t a, uint64_t a_sf, uint64_t w,
                             uint64_t w_sf, uint64_t y, int32_t m, int32_t n, int32_t k,
                             int a_type, float alpha, uint64_t stream);

/* Scratch memory of one stream's GEMM launches: split-K partial sums and counters, the bf16
 * expansion and the cuBLAS workspace of dequantize-then-cuBLAS entries, in one device buffer
 * sized at creation for every route of the table with M up to max_m (0: the max_m of
 * fp4tune_open_ex). Create it before capturing (it allocates and waits for the allocation); use it
 * from one stream at a time; destroy it after its launches completed (before or after closing
 * the dispatcher). On failure *out is NULL. */
typedef struct Fp4tuneGemmWorkspace fp4tune_gemm_workspace;

FP4TUNE_API int fp4tune_gemm_workspace_create(const fp4tune_dispatcher* d, uint32_t max_m,
                                              fp4tune_gemm_workspace** out);

/* Free a GEMM workspace after its launches completed. NULL is ignored. */
FP4TUNE_API void fp4tune_gemm_workspace_destroy(fp4tune_gemm_workspace* ws);

/* Device bytes the workspace occupies (0 for NULL). */
FP4TUNE_API size_t fp4tune_gemm_workspace_bytes(const fp4tune_gemm_workspace* ws);

/* fp4tune_gemm with `ws` (a workspace of `d`) as the scratch: no allocation, no synchronization
 * (capturable; on sm90, codes prepared for the grouped layer are refused: preparing reorders
 * them). It reads the list of prepared
 * codes under a shared lock, which fp4tune_moe_prepare_weights and fp4tune_moe_restore_weights
 * hold exclusively while they run (load time), and a shape outside the table counts its fallback
 * launches under a short lock. A launch that
 * needs more than ws holds (M above its max_m on a split-K or
 * dequantize-then-cuBLAS route, or a shape outside the table whose fallback uses split-K), or a
 * workspace of another dispatcher, returns FP4TUNE_ERR_INVALID_ARGUMENT before anything is
 * enqueued. Same operands, alignment and sizes as fp4tune_gemm. */
FP4TUNE_API int fp4tune_gemm_ws(const fp4tune_dispatcher* d, fp4tune_gemm_workspace* ws,
                                uint64_t a, uint64_t a_sf, uint64_t w, uint64_t w_sf, uint64_t y,
                                int32_t m, int32_t n, int32_t k, int a_type, float alpha,
                                uint64_t stream);

/* Write the configuration this shape would launch and why (exact, nearest bucket, common,
 * default) into buf (NUL-terminated, truncated to len): a kernel name, or dequant_cublas_bf16 for
 * entries that chose the dequantize-then-cuBLAS path, e.g.
 * "sm90_w4a16_m16n64k128_w1x4x1_s4_sk1_swap (nearest bucket M=16)". Grouped MoE choices:
 * fp4tune_moe_route. */
FP4TUNE_API int fp4tune_route(const fp4tune_dispatcher* d, int32_t m, int32_t n, int32_t k,
                              int a_type, char* buf, size_t len);

/* Write the start-up report (kernels compiled / from cache, start-up time, warnings) and the
 * shapes that fell back so far into buf (NUL-terminated, truncated to len). */
FP4TUNE_API int fp4tune_report(const fp4tune_dispatcher* d, char* buf, size_t len);

/* Wait for `stream` (0 = legacy default stream); reports asynchronous kernel errors. */
FP4TUNE_API int fp4tune_synchronize(const fp4tune_dispatcher* d, uint64_t stream);

/* Wait for the device, unload the kernels, free the handle. NULL is ignored. */
FP4TUNE_API void fp4tune_close(fp4tune_dispatcher* d);

/* Bytes of a swizzled scale buffer for rows x k NVFP4 values (rows padded to 128, k/16 padded
 * to 4): allocate W and A scale buffers with this size. 0 for invalid sizes. */
FP4TUNE_API size_t fp4tune_scale_bytes(int32_t rows, int32_t k);

/* ---- Grouped MoE layer (routed experts of one step in one launch per projection) -------------
 * Layer shape: hidden (model width), inter (expert intermediate size on this GPU), experts (local
 * experts E), top_k. Weights per expert in the ModelOpt layout of fp4tune_gemm, stacked, their
 * codes prepared once after loading (fp4tune_moe_prepare_weights):
 *   w13 [E][2*inter, hidden/2] codes ([gate; up] fused), w13_sf E blocks of
 *       fp4tune_scale_bytes(2*inter, hidden), alpha13 float[E];
 *   w2  [E][hidden, inter/2] codes, w2_sf E blocks of fp4tune_scale_bytes(hidden, inter),
 *       alpha2 float[E].
 * x and y are bf16 [tokens, hidden] (16-byte aligned); topk_ids int32 [tokens, top_k] (global
 * expert ids; local experts are expert_begin .. expert_begin + E - 1, others are skipped);
 * topk_weights float [tokens, top_k]. All pointers are device addresses. Launches allocate and
 * synchronize nothing (capturable in a CUDA graph) and take no exclusive lock (a shared read of
 * the prepared weights' list, which preparing or restoring weights holds exclusively while it
 * runs, and a short lock of the workspace's record of its routing); scratch lives in a workspace:
 * use one workspace per stream. The shared expert can join as expert E with weight 1 in every row.
 * W4A16 (w4a4 = 0): alphas are weight_scale_2. W4A4 (w4a4 = 1): both projections take NVFP4
 * activations; alpha13 = x_scale * weight_scale_2 and alpha2 = h_scale * weight_scale_2 per
 * expert. X comes as x_fp4 / x_sf (codes [tokens, hidden/2] and fp4tune_scale_bytes(tokens,
 * hidden) swizzled scales), or, with x_fp4 = 0, as bf16 x that the layer quantizes with x_scale;
 * gate_up writes H in bf16 and quantized with h_scale for down. Zero-initialize the struct
 * ({0}): the fields after expert_begin are W4A4's and all zero means W4A16. */
typedef struct Fp4tuneMoeWorkspace fp4tune_moe_workspace;

typedef struct fp4tune_moe_args {
    uint64_t x;
    uint64_t topk_ids;
    uint64_t topk_weights;
    uint64_t w13;
    uint64_t w13_sf;
    uint64_t alpha13;
    uint64_t w2;
    uint64_t w2_sf;
    uint64_t alpha2;
    uint64_t y;
    uint32_t tokens;       /* 1 .. the workspace's max_tokens */
    int32_t expert_begin;  /* global id of local expert 0 (expert parallelism), else 0 */
    uint32_t w4a4;         /* 0: W4A16 (bf16 activations); 1: W4A4 (NVFP4 activations) */
    float x_scale;         /* W4A4: input scale of X (used when x_fp4 is 0) */
    float h_scale;         /* W4A4: input scale of H */
    uint32_t reserved;     /* 0 */
    uint64_t x_fp4;        /* W4A4: X codes (16-byte aligned), or 0 to quantize x */
    uint64_t x_sf;         /* W4A4: X swizzled scales (4-byte aligned), with x_fp4 */
} fp4tune_moe_args;

/* Put one projection's weight codes of a layer (projection FP4TUNE_MOE_W13: w13 of all local
 * experts, or FP4TUNE_MOE_W2: w2; codes only, at device address codes, 16-byte aligned; the
 * layer shape as for the workspace) into the layout this device's grouped kernels read, in place,
 * once after loading (not while the stream captures a graph). The work runs on stream through a
 * scratch copy of up to 64 MiB; the call returns once the codes are in place. Grouped launches
 * return FP4TUNE_ERR_INVALID_ARGUMENT for weight codes that were not prepared for their
 * projection and shape, fp4tune_gemm on sm90 for codes that were (sm90 reorders them; sm120
 * reads them as loaded), and so does preparing codes that overlap prepared ones. On sm90 prepared
 * codes serve the grouped layer only: fp4tune_moe_restore_weights (same shape, projection and
 * codes) puts them back for fp4tune_gemm; fp4tune_moe_forget_weights (same arguments) drops them from the dispatcher's list
 * without touching them: call one of the two before the memory is freed or reused. */
#define FP4TUNE_MOE_W13 0u
#define FP4TUNE_MOE_W2 1u
FP4TUNE_API int fp4tune_moe_prepare_weights(const fp4tune_dispatcher* d, int32_t hidden, int32_t inter,
                                            int32_t experts, uint32_t projection, uint64_t codes,
                                            uint64_t stream);
FP4TUNE_API int fp4tune_moe_restore_weights(const fp4tune_dispatcher* d, int32_t hidden, int32_t inter,
                                            int32_t experts, uint32_t projection, uint64_t codes,
                                            uint64_t stream);
FP4TUNE_API int fp4tune_moe_forget_weights(const fp4tune_dispatcher* d, int32_t hidden, int32_t inter,
                                           int32_t experts, uint32_t projection, uint64_t codes);

/* A workspace for up to max_tokens tokens of the layer; max_tokens x top_k stays within INT32_MAX.
 * experts_total: the experts topk_ids range over, 0..experts_total (GLM-5: 256 routed experts;
 * 257 with its shared expert joined as one more), or 0 when every one of them is on this GPU
 * (experts_total = experts). A layer the table has no grouped entries for runs the family
 * defaults (one configuration per token bucket, legal for its shape, chosen for the rows per
 * expert a uniform routing over experts_total gives; tune it for its own): the first workspace
 * of such a layer builds them for every activation type the family runs it with (NVRTC, or the
 * cubin cache), so create it before capturing a graph; later workspaces of the layer, and routes
 * asked after its first workspace, must name the same experts_total. A layer the table has
 * keeps to its entries. A layer the family's kernels cannot run (its K or N) is refused with a
 * message saying what they take. Launches through `d` refuse a workspace of another dispatcher,
 * and a call of more tokens than a chosen kernel's grid of CTAs can take (65535 rows of tiles),
 * before anything is enqueued. On failure *out is NULL. */
FP4TUNE_API int fp4tune_moe_workspace_create(const fp4tune_dispatcher* d, int32_t hidden,
                                             int32_t inter, int32_t experts, int32_t top_k,
                                             int32_t experts_total, int32_t max_tokens,
                                             fp4tune_moe_workspace** out);

/* Free a workspace after its launches completed. NULL is ignored. */
FP4TUNE_API void fp4tune_moe_workspace_destroy(fp4tune_moe_workspace* ws);

/* The whole layer: align, gate_up with SiLU(gate) * up, down, router-weighted sum into y. */
FP4TUNE_API int fp4tune_moe_layer(const fp4tune_dispatcher* d, fp4tune_moe_workspace* ws,
                                  const fp4tune_moe_args* args, uint64_t stream);

/* The steps alone, in this order on one stream: the routed-row schedule of topk_ids; gate_up
 * (H in the workspace); down and the weighted sum into y. gate_up and down refuse a call whose
 * routing (topk_ids pointer, tokens, expert_begin) is not the one the workspace's last align
 * (alone or in fp4tune_moe_layer) was enqueued for: last in the order of these calls on the host,
 * captures into a CUDA graph included (replays of a graph are not seen). */
FP4TUNE_API int fp4tune_moe_align(const fp4tune_dispatcher* d, fp4tune_moe_workspace* ws,
                                  const fp4tune_moe_args* args, uint64_t stream);
FP4TUNE_API int fp4tune_moe_gate_up(const fp4tune_dispatcher* d, fp4tune_moe_workspace* ws,
                                    const fp4tune_moe_args* args, uint64_t stream);
FP4TUNE_API int fp4tune_moe_down(const fp4tune_dispatcher* d, fp4tune_moe_workspace* ws,
                                 const fp4tune_moe_args* args, uint64_t stream);

/* Write the grouped kernels the layer launches for `tokens` and why into buf (NUL-terminated,
 * truncated to len), per activation type the device runs the layer with, separated by " | ":
 *   w4a16: gate_up <config> (<why>); down <config> (<why>)
 * why: "exact" (a tuned bucket B), "nearest bucket B=8: 20 lies between B=8 and B=64, nearer in
 * log scale", or the nearest bucket below the smallest / above the largest tuned B; entries
 * tuned with other grouped templates say so, and so do the family defaults of a layer the table
 * has no entries for (chosen for experts_total as in fp4tune_moe_workspace_create; ask after the
 * layer's first workspace to see what its launches run). A layer the family's kernels cannot run,
 * or an experts_total other than the one its first workspace named, returns
 * FP4TUNE_ERR_INVALID_ARGUMENT and fp4tune_last_error() says why. */
FP4TUNE_API int fp4tune_moe_route(const fp4tune_dispatcher* d, int32_t hidden, int32_t inter,
                                  int32_t experts, int32_t top_k, int32_t experts_total,
                                  int32_t tokens, char* buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* FP4TUNE_H */
