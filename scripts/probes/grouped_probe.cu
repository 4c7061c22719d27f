// Where does the grouped gate_up decode pick spend its time: in its reads or in its instructions?
// (H200 probe, from the repository root: nvcc -O3 -std=c++17 scripts/probes/grouped_probe.cu -o grouped_probe
// -lnvrtc -lcuda && ./grouped_probe [B ...], default B = 8 64; the kernels, grouped_probe_kernels.cu, are
// compiled at run time with NVRTC for the device, -I templates, as the product compiles its kernels;
// ./grouped_probe ep8 [B ...] takes the EP8 layer: the 32 local experts of N 4096 x K 6144.)
// GLM-5 TP8 gate_up (256 experts of N 512 x K 6144), B tokens routed top-8 uniformly (distinct
// experts per token, seed 1000 + B), bf16 activations, one tile per CTA over the 8-row tile list
// built on the host as moe_align builds it. Per B, the median per launch over 11 graph replays of
// 10 launches that alternate between two copies of all 256 experts' weights (906 MB, 18x the
// L2), after 2 warm-up replays:
//   pick     the TP8 table's pick moe_gate_up_m8n32k512_w1x4_pa3_s1_o4 (templates/moe/sm90.cuh, the
//            production kernel; random weight words: its time does not depend on their values)
//   load     the same grid, tile walk and warp ring (every cp.async of codes, scales and
//            activation runs, every wait_group and shared-memory read of the pick), with the
//            decode, the MMAs and the epilogue replaced by an XOR of the words read
//   contig   load, with each warp's chunk of codes read from one contiguous 2 KB block (the same
//            bytes per expert in another layout: each warp instruction reads 512 contiguous bytes)
//   pick, contiguous codes  the pick (decode, MMAs, epilogue) reading its codes from those blocks
//            (its results are not the layer's: the codes are other bytes; its time is the layout's)
//   d4, d6   load with a ring of 4 stages at 3 CTAs per SM and 6 at 2 (about the same shared
//            memory per SM, more chunks in flight per warp)
//   floor    the routed experts' codes and scales read once, one CTA row per expert, 16-byte
//            streaming loads, 8 in flight per thread
// ./grouped_probe bulk [ep8] [B ...] times, beside pick, the contiguous-codes load and floor, the
// bulk-copy kernels of grouped_probe_kernels.cu (cp.async.bulk onto mbarriers; their scales laid
// out per row group, the same bytes as the swizzled ones):
//   bulk1..5      a producer lane per CTA filling a CTA ring, consumer warps that only read it
//                 (the loads alone; rows per CTA, k per stage, stages and CTAs per SM vary)
//   bulk_pick*    the pick's decode, MMAs and epilogue fed by such a CTA ring (stages, CTAs per SM)
//   warp_bulk*    the pick's own warp rings, each filled by its warp's bulk copies
// and checks the H of bulk_pick43, warp_bulk33 and warp_bulk34 against the pick's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <cuda.h>
#include <nvrtc.h>
#include <fstream>
#include <sstream>
#include <string>

#define CU(x)                                                                           \
    do {                                                                                \
        CUresult r = (x);                                                               \
        if (r != CUDA_SUCCESS) {                                                        \
            const char* m = nullptr;                                                    \
            cuGetErrorString(r, &m);                                                    \
            printf("CUDA driver %s at line %d\n", m ? m : "?", __LINE__);               \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#define CK(x)                                                                           \
    do {                                                                                \
        cudaError_t e = (x);                                                            \
        if (e != cudaSuccess) {                                                         \
            printf("CUDA %s at line %d\n", cudaGetErrorString(e), __LINE__);            \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)


// templates/moe/params.cuh GroupedParams, field for field.
struct GroupedParams {
    const uint8_t* a;
    const uint8_t* a_sf;
    const uint8_t* w;
    const uint8_t* w_sf;
    const float* alpha;
    uint16_t* y;
    const int32_t* sorted_ids;
    const int32_t* tiles;
    const int32_t* tile_count;
    uint8_t* h_codes;
    uint8_t* h_sf;
    float h_scale;
    int n;
    int k;
    int top_k;
};

// grouped_probe_kernels.cu for this device with NVRTC (the product's options), loaded as a module.
static CUmodule load_kernels() {
    std::ifstream f("scripts/probes/grouped_probe_kernels.cu");
    if (!f) {
        printf("scripts/probes/grouped_probe_kernels.cu: not found (run from the repository root)\n");
        exit(1);
    }
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string src = ss.str();
    int dev, major, minor;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    const std::string arch = "--gpu-architecture=sm_" + std::to_string(major * 10 + minor) + "a";
    const char* opts[] = {arch.c_str(), "-Itemplates", "--std=c++17", "--device-int128", "-DNDEBUG"};
    nvrtcProgram prog;
    nvrtcCreateProgram(&prog, src.c_str(), "grouped_probe_kernels.cu", 0, nullptr, nullptr);
    const nvrtcResult r = nvrtcCompileProgram(prog, 5, opts);
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, &log[0]);
    if (r != NVRTC_SUCCESS) {
        printf("NVRTC: %s\n%s\n", nvrtcGetErrorString(r), log.c_str());
        exit(1);
    }
    size_t bytes = 0;
    nvrtcGetCUBINSize(prog, &bytes);
    std::vector<char> cubin(bytes);
    nvrtcGetCUBIN(prog, cubin.data());
    nvrtcDestroyProgram(&prog);
    CUmodule m;
    CU(cuModuleLoadData(&m, cubin.data()));
    return m;
}

template <class Launch>
static float time_graph(cudaStream_t s, Launch launch) {
    constexpr int LAUNCHES = 10, SAMPLES = 11;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < LAUNCHES; ++l) launch(l & 1, s);
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 2; ++i) CK(cudaGraphLaunch(exec, s));
    std::vector<float> us;
    for (int i = 0; i < SAMPLES; ++i) {
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(exec, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        us.push_back(ms * 1000.0f / LAUNCHES);
    }
    std::sort(us.begin(), us.end());
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return us[SAMPLES / 2];
}

int main(int argc, char** argv) {
    std::vector<int> bs;
    bool ep8 = false, bulk = false;
    for (int i = 1; i < argc; ++i) {
        if (std::string(argv[i]) == "ep8") {
            ep8 = true;
        } else if (std::string(argv[i]) == "bulk") {
            bulk = true;
        } else {
            bs.push_back(atoi(argv[i]));
        }
    }
    if (bs.empty()) bs = {8, 64};
    // TP8: all 256 experts, gate_up 512 x 6144; ep8: the 32 local experts 0..31 of the 256 the
    // router picks from, gate_up 4096 x 6144
    constexpr int E_GLOBAL = 256, TOP_K = 8, K = 6144;
    const int E = ep8 ? 32 : 256, N = ep8 ? 4096 : 512, I = N / 2;
    const size_t w_stride = static_cast<size_t>(N) * (K / 2);
    const size_t ksf_pad = (K / 16 + 3) / 4 * 4;
    const size_t sf_stride = static_cast<size_t>((N + 127) / 128 * 128) * ksf_pad;
    uint8_t *w[2], *sf[2];
    for (int c = 0; c < 2; ++c) {
        CK(cudaMalloc(&w[c], w_stride * E));
        CK(cudaMalloc(&sf[c], sf_stride * E));
        std::vector<uint8_t> hw(w_stride * E), hs(sf_stride * E);
        std::mt19937 rng(7 + c);
        for (auto& x : hw) x = static_cast<uint8_t>(rng());
        for (auto& x : hs) x = static_cast<uint8_t>(0x30 + rng() % 16);  // finite E4M3 scales around 1
        CK(cudaMemcpy(w[c], hw.data(), hw.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(sf[c], hs.data(), hs.size(), cudaMemcpyHostToDevice));
    }
    // the same scales laid out per row group (the bulk kernels' copies): per expert, row group T
    // (paired rows 16T ..) at T * 16 * K/16, in it per 128-k block b 16 rows x 8 bytes at b * 128
    uint8_t* sfg[2];
    for (int c = 0; c < 2; ++c) {
        std::vector<uint8_t> hs(sf_stride * E), hg(w_stride / 8 * E);
        CK(cudaMemcpy(hs.data(), sf[c], hs.size(), cudaMemcpyDeviceToHost));
        const int kb16 = K / 16;
        for (int e = 0; e < E; ++e)
            for (int rho = 0; rho < N; ++rho) {
                const int h = (rho >> 3) & 1, row = (rho >> 4) * 8 + (rho & 7) + h * I;
                for (int b = 0; b < kb16; ++b) {
                    const size_t sw = ((static_cast<size_t>(row) >> 7) * (ksf_pad >> 2) + (b >> 2)) * 512 +
                                      (row & 31) * 16 + ((row >> 5) & 3) * 4 + (b & 3);
                    hg[static_cast<size_t>(e) * N * kb16 + static_cast<size_t>(rho >> 4) * 16 * kb16 + (b >> 3) * 128 +
                       (rho & 15) * 8 + (b & 7)] = hs[e * sf_stride + sw];
                }
            }
        CK(cudaMalloc(&sfg[c], hg.size()));
        CK(cudaMemcpy(sfg[c], hg.data(), hg.size(), cudaMemcpyHostToDevice));
    }
    float* alpha;
    CK(cudaMalloc(&alpha, E * sizeof(float)));
    std::vector<float> ha(E, 1.0f);
    CK(cudaMemcpy(alpha, ha.data(), E * sizeof(float), cudaMemcpyHostToDevice));
    unsigned* out;
    CK(cudaMalloc(&out, 16));
    CU(cuInit(0));
    CUmodule mod = load_kernels();
    // the kernels on the pick's grid, in the order of the report's columns, with the entry of
    // probe_cfg that holds their dynamic shared memory
    struct GridKernel {
        const char* name;
        int smem_entry;
        CUfunction f;
    } grid_kernels[] = {{"pick", 3, nullptr},        {"load_only", 3, nullptr}, {"load_contig", 3, nullptr},
                        {"pick_contig", 3, nullptr}, {"load_d4", 4, nullptr},   {"load_d6", 5, nullptr}};
    constexpr int GRID_KERNELS = sizeof(grid_kernels) / sizeof(grid_kernels[0]);
    int cfg[6];
    {
        CUdeviceptr g;
        size_t gb;
        CU(cuModuleGetGlobal(&g, &gb, mod, "probe_cfg"));
        CU(cuMemcpyDtoH(cfg, g, sizeof(cfg)));
    }
    for (GridKernel& k : grid_kernels) {
        CU(cuModuleGetFunction(&k.f, mod, k.name));
        CU(cuFuncSetAttribute(k.f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, cfg[k.smem_entry]));
    }
    // bulk1..5 (loads alone), then the pick fed by the bulk ring (4 stages at 3 CTAs per SM, 3 at 3, 6 at 2)
    // and the pick's warp ring filled by bulk copies (3 stages at 3 CTAs per SM, 4 at 3, 3 at 4 with unpadded rows)
    constexpr int BULK = 11;
    const char* bulk_names[BULK] = {"bulk1",       "bulk2",       "bulk3",       "bulk4",       "bulk5",      "bulk_pick43",
                                    "bulk_pick33", "bulk_pick62", "warp_bulk33", "warp_bulk43", "warp_bulk34"};
    int bcfg[BULK][3];
    CUfunction f_bulk[BULK];
    {
        CUdeviceptr g;
        size_t gb;
        CU(cuModuleGetGlobal(&g, &gb, mod, "bulk_cfg"));
        CU(cuMemcpyDtoH(bcfg, g, 5 * sizeof(bcfg[0])));
        CU(cuModuleGetGlobal(&g, &gb, mod, "bulk_pick_cfg"));
        CU(cuMemcpyDtoH(bcfg[5], g, 3 * sizeof(bcfg[0])));
        CU(cuModuleGetGlobal(&g, &gb, mod, "warp_bulk_cfg"));
        CU(cuMemcpyDtoH(bcfg[8], g, 3 * sizeof(bcfg[0])));
    }
    for (int v = 0; v < BULK; ++v) {
        const std::string name = bulk_names[v];
        CU(cuModuleGetFunction(&f_bulk[v], mod, name.c_str()));
        CU(cuFuncSetAttribute(f_bulk[v], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bcfg[v][2]));
        int regs = 0, ctas = 0;
        CU(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, f_bulk[v]));
        CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, f_bulk[v], bcfg[v][0], bcfg[v][2]));
        if (bulk)
            printf("%s: %d threads, %d weight rows per CTA, %d bytes of shared memory, %d registers, %d CTAs per SM\n",
                   bulk_names[v], bcfg[v][0], bcfg[v][1], bcfg[v][2], regs, ctas);
    }
    CUfunction f_floor;
    CU(cuModuleGetFunction(&f_floor, mod, "floor_read"));
    const int threads = cfg[0], smem = cfg[3], block_n = cfg[2];
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    printf("kernel m8n32k512_w1x4_pa3_s1_o4: %d threads, %d bytes of shared memory, %d CTAs per SM\n", threads, smem,
           cfg[1]);
    for (int B : bs) {
        // routing: distinct experts per token, then the expert-sorted flat ids and the 8-row tiles
        std::mt19937 rng(1000 + B);
        std::vector<std::vector<int>> rows(E);
        for (int t = 0; t < B; ++t) {
            std::vector<int> pool(E_GLOBAL);
            for (int e = 0; e < E_GLOBAL; ++e) pool[e] = e;
            for (int sl = 0; sl < TOP_K; ++sl) {
                const int j = sl + static_cast<int>(rng() % (E_GLOBAL - sl));
                std::swap(pool[sl], pool[j]);
                if (pool[sl] < E) rows[pool[sl]].push_back(t * TOP_K + sl);
            }
        }
        std::vector<int> sorted, tiles, active;
        for (int e = 0; e < E; ++e) {
            std::sort(rows[e].begin(), rows[e].end());
            const int first = static_cast<int>(sorted.size());
            for (size_t r0 = 0; r0 < rows[e].size(); r0 += 8)
                tiles.insert(tiles.end(), {e, first + static_cast<int>(r0),
                                           std::min(8, static_cast<int>(rows[e].size() - r0)), 0});
            sorted.insert(sorted.end(), rows[e].begin(), rows[e].end());
            if (!rows[e].empty()) active.push_back(e);
        }
        const int ntiles = static_cast<int>(tiles.size() / 4);
        int *d_sorted, *d_tiles, *d_count, *d_active;
        uint16_t *x, *y;
        CK(cudaMalloc(&d_sorted, sorted.size() * 4));
        CK(cudaMalloc(&d_tiles, tiles.size() * 4));
        CK(cudaMalloc(&d_count, 4));
        CK(cudaMalloc(&d_active, active.size() * 4));
        CK(cudaMalloc(&x, static_cast<size_t>(B) * K * 2));
        CK(cudaMalloc(&y, sorted.size() * I * 2));
        CK(cudaMemset(x, 0x3c, static_cast<size_t>(B) * K * 2));
        CK(cudaMemcpy(d_sorted, sorted.data(), sorted.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_tiles, tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_count, &ntiles, 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_active, active.data(), active.size() * 4, cudaMemcpyHostToDevice));
        GroupedParams p[2] = {};
        for (int c = 0; c < 2; ++c) {
            p[c].a = reinterpret_cast<const uint8_t*>(x);
            p[c].w = w[c];
            p[c].w_sf = sf[c];
            p[c].alpha = alpha;
            p[c].y = y;
            p[c].sorted_ids = d_sorted;
            p[c].tiles = d_tiles;
            p[c].tile_count = d_count;
            p[c].n = N;
            p[c].k = K;
            p[c].top_k = TOP_K;
        }
        const unsigned gx = N / block_n, gy = static_cast<unsigned>(ntiles);
        float t[GRID_KERNELS] = {};
        for (int v = 0; v < GRID_KERNELS; ++v)
            if (!bulk || v == 0 || v == 2) t[v] = time_graph(s, [&](int c, cudaStream_t st) {
                void* args[] = {&p[c], &out};
                CU(cuLaunchKernel(grid_kernels[v].f, gx, gy, 1, threads, 1, 1, cfg[grid_kernels[v].smem_entry],
                                  reinterpret_cast<CUstream>(st), args, nullptr));
            });
        size_t ws = w_stride, ss = sf_stride;
        const float t_floor = time_graph(s, [&](int c, cudaStream_t st) {
            void* args[] = {&w[c], &sf[c], &d_active, &ws, &ss, &out};
            CU(cuLaunchKernel(f_floor, 64, static_cast<unsigned>(active.size()), 1, 256, 1, 1, 0,
                              reinterpret_cast<CUstream>(st), args, nullptr));
        });
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        const double mb = active.size() * static_cast<double>(w_stride + sf_stride) / 1e6;
        if (bulk) {
            printf("%s B = %d: %zu active experts, %d tiles, %.1f MB of weights | pick %.2f us | load, contiguous codes %.2f us | "
                   "floor %.2f us (%.0f GB/s)",
                   ep8 ? "EP8" : "TP8", B, active.size(), ntiles, mb, t[0], t[2], t_floor, mb * 1e3 / t_floor);
            for (int v = 0; v < BULK; ++v) {
                const float tb = time_graph(s, [&](int c, cudaStream_t st) {
                    void* args[] = {&p[c], &sfg[c], &out};
                    CU(cuLaunchKernel(f_bulk[v], N / bcfg[v][1], gy, 1, bcfg[v][0], 1, 1, bcfg[v][2],
                                      reinterpret_cast<CUstream>(st), args, nullptr));
                });
                printf(" | %s %.2f us", bulk_names[v], tb);
            }
            // the pick and the bulk-fed picks on weight copy 0: the same H within the summation order
            const size_t ny = sorted.size() * I;
            std::vector<uint16_t> y0(ny), y1(ny);
            {
                void* args[] = {&p[0], &out};
                CK(cudaMemset(y, 0, ny * 2));
                CU(cuLaunchKernel(grid_kernels[0].f, gx, gy, 1, threads, 1, 1, cfg[3], reinterpret_cast<CUstream>(s), args,
                                  nullptr));
                CK(cudaStreamSynchronize(s));
                CK(cudaMemcpy(y0.data(), y, ny * 2, cudaMemcpyDeviceToHost));
            }
            for (int v : {5, 8, 10}) {
                void* bargs[] = {&p[0], &sfg[0], &out};
                CK(cudaMemset(y, 0, ny * 2));
                CU(cuLaunchKernel(f_bulk[v], N / bcfg[v][1], gy, 1, bcfg[v][0], 1, 1, bcfg[v][2], reinterpret_cast<CUstream>(s),
                                  bargs, nullptr));
                CK(cudaStreamSynchronize(s));
                CK(cudaMemcpy(y1.data(), y, ny * 2, cudaMemcpyDeviceToHost));
                size_t off = 0;
                double worst = 0;
                for (size_t i = 0; i < ny; ++i) {
                    const uint32_t ua = static_cast<uint32_t>(y0[i]) << 16, ub = static_cast<uint32_t>(y1[i]) << 16;
                    float fa, fb;
                    memcpy(&fa, &ua, 4);
                    memcpy(&fb, &ub, 4);
                    const double d = std::fabs(static_cast<double>(fa) - fb) / (std::fabs(static_cast<double>(fa)) + 1e-3);
                    worst = std::max(worst, d);
                    if (!(d <= 2e-2)) ++off;
                }
                printf(" | %s against the pick: %zu of %zu H elements off by > 2%% (worst %.3g)", bulk_names[v], off, ny, worst);
            }
            printf("\n");
            CK(cudaGetLastError());
            CK(cudaStreamSynchronize(s));
        } else
        printf("%s B = %d: %zu active experts, %d tiles, %.1f MB of weights | pick %.2f us | load %.2f us | load, "
               "contiguous codes %.2f us | pick, contiguous codes %.2f us | load, 4 stages at 3 CTAs per SM %.2f us | load, 6 stages at 2 %.2f us | "
               "floor %.2f us (%.0f GB/s)\n",
               ep8 ? "EP8" : "TP8", B, active.size(), ntiles, mb, t[0], t[1], t[2], t[3], t[4], t[5], t_floor, mb * 1e3 / t_floor);
        CK(cudaFree(d_sorted));
        CK(cudaFree(d_tiles));
        CK(cudaFree(d_count));
        CK(cudaFree(d_active));
        CK(cudaFree(x));
        CK(cudaFree(y));
    }
    return 0;
}
