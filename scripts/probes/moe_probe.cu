// The grouped MoE kernels of templates/moe/ on one GLM-5 TP8 layer (256 experts, top-8, hidden
// 6144, expert intermediate 256 per GPU), outside the Rust harness: every kernel checked against a
// CPU reference, then timed under CUDA-graph replay with cold L2 (the launches of one graph rotate
// over weight copies whose touched bytes exceed 4x L2). Build and run on a GPU:
//   nvcc -O3 -arch=sm_90a -std=c++17 -Xcompiler -fopenmp -I templates scripts/probes/moe_probe.cu -o moe_probe
//   ./moe_probe [B,B,...] [weight copies] [variant name filter] [once]
// With `once`, each selected variant is launched once (verified, not timed): for Nsight Compute.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#define FP4TUNE_HAVE_STDINT
#include "moe/align.cuh"
#include "moe/finalize.cuh"
#include "moe/sm90.cuh"

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            printf("CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);         \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

using namespace fp4tune;

__global__ void __launch_bounds__(1024) k_align(const moe::AlignParams p) { moe::moe_align(p); }
__global__ void __launch_bounds__(256) k_finalize(const moe::FinalizeParams p) { moe::moe_finalize(p); }

template <class Cfg, int OP>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_CTAS) k_grouped(const moe::GroupedParams p) {
    moe::Grouped<Cfg, OP>::run(p);
}

// ---- host NVFP4 ------------------------------------------------------------------------------
static float e2m1(uint8_t c) {
    static const float m[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    return (c & 8) ? -m[c & 7] : m[c & 7];
}
static float e4m3(uint8_t b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
    return s ? -v : v;
}
static uint32_t sf_off(uint32_t row, uint32_t kb, uint32_t ksf_pad) {
    return ((row >> 7) * (ksf_pad >> 2) + (kb >> 2)) * 512u + (row & 31u) * 16u + ((row >> 5) & 3u) * 4u + (kb & 3u);
}
static float bf(uint16_t b) {
    uint32_t u = uint32_t(b) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t to_bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return uint16_t(u >> 16);
}

struct Weights {
    int E, N, K;
    size_t code_bytes, sf_bytes;  // per expert
    std::vector<uint8_t> code, sf;
    std::vector<float> alpha;
    Weights(int E_, int N_, int K_, std::mt19937& rng) : E(E_), N(N_), K(K_) {
        code_bytes = size_t(N) * K / 2;
        sf_bytes = size_t((N + 127) / 128 * 128) * ((K / 16 + 3) / 4 * 4);
        code.resize(code_bytes * E);
        sf.resize(sf_bytes * E);
        for (auto& b : code) b = uint8_t(rng());
        for (auto& b : sf) b = uint8_t(0x28 + rng() % 0x20);
        alpha.resize(E);
        for (auto& a : alpha) a = std::ldexp(1.0f, -6) * (1.0f + (rng() % 8) / 8.0f);
    }
    // Row n of expert e dequantized (without alpha).
    void row(int e, int n, std::vector<float>& out) const {
        static float f4[16], f8[256];
        static bool init = false;
        if (!init) {
            for (int i = 0; i < 16; ++i) f4[i] = e2m1(uint8_t(i));
            for (int i = 0; i < 256; ++i) f8[i] = e4m3(uint8_t(i));
            init = true;
        }
        out.resize(K);
        const uint32_t ksf_pad = (K / 16 + 3) / 4 * 4;
        const uint8_t* c = &code[e * code_bytes + size_t(n) * (K / 2)];
        for (int kb = 0; kb < K / 16; ++kb) {
            const float s = f8[sf[e * sf_bytes + sf_off(n, kb, ksf_pad)]];
            for (int j = 0; j < 8; ++j) {
                const uint8_t byte = c[kb * 8 + j];
                out[kb * 16 + 2 * j] = f4[byte & 15] * s;
                out[kb * 16 + 2 * j + 1] = f4[byte >> 4] * s;
            }
        }
    }
};

struct DevWeights {
    uint8_t *code, *sf;
    float* alpha;
    int copies;
    size_t code_total, sf_total;
    DevWeights(const Weights& w, int copies_) : copies(copies_) {
        code_total = w.code.size();
        sf_total = w.sf.size();
        CK(cudaMalloc(&code, code_total * copies));
        CK(cudaMalloc(&sf, sf_total * copies));
        CK(cudaMalloc(&alpha, w.alpha.size() * 4));
        CK(cudaMemcpy(code, w.code.data(), code_total, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(sf, w.sf.data(), sf_total, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(alpha, w.alpha.data(), w.alpha.size() * 4, cudaMemcpyHostToDevice));
        for (int c = 1; c < copies; ++c) {
            CK(cudaMemcpy(code + code_total * c, code, code_total, cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy(sf + sf_total * c, sf, sf_total, cudaMemcpyDeviceToDevice));
        }
    }
};

// ---- configurations ---------------------------------------------------------------------------
// DirectConfig<BLOCK_M, BLOCK_N, BLOCK_K, WARPS_N, WARPS_K, DEPTH, SPLIT_K, A_FP4, SMEM_RING, A_GLOBAL, MIN_CTAS>
template <int BM, int BN, int BK, int WN, int WK, int D, int S, int MC = 1>
using G = sm90::DirectConfig<BM, BN, BK, WN, WK, D, S, false, false, true, MC>;

struct Variant {
    const char* name;
    int op, block_m, block_n, threads, smem, split;
    void (*kernel)(const moe::GroupedParams);
};

template <class Cfg, int OP>
Variant make(const char* name) {
    return Variant{name, OP, Cfg::BLOCK_M, Cfg::BLOCK_N, Cfg::THREADS, Cfg::SMEM_BYTES, Cfg::SPLIT_K,
                   k_grouped<Cfg, OP>};
}

static std::vector<Variant> variants() {
    return {
        make<G<8, 32, 6144, 1, 8, 3, 1>, moe::OP_GATE_UP>("gu_m8_n32_k8_d3"),
        make<G<8, 32, 512, 1, 4, 2, 1>, moe::OP_GATE_UP>("gu_m8_n32_k4_bk512_d2"),
        make<G<8, 128, 256, 4, 1, 2, 1, 2>, moe::OP_DOWN>("dn_m8_n128_w4_d2_o2"),
        make<G<8, 16, 6144, 1, 8, 3, 1>, moe::OP_GATE_UP>("gu_m8_n16_k8_d3"),
        make<G<8, 32, 6144, 1, 16, 1, 1>, moe::OP_GATE_UP>("gu_m8_n32_k16_d1"),
        make<G<8, 32, 3072, 1, 8, 3, 2>, moe::OP_GATE_UP>("gu_m8_n32_k8_d3_s2"),
        make<G<8, 64, 6144, 2, 8, 1, 1>, moe::OP_GATE_UP>("gu_m8_n64_w2k8_d1"),
        make<G<16, 32, 6144, 1, 8, 1, 1>, moe::OP_GATE_UP>("gu_m16_n32_k8_d1"),
        make<G<16, 32, 6144, 1, 16, 1, 1>, moe::OP_GATE_UP>("gu_m16_n32_k16_d1"),
        make<G<8, 128, 256, 4, 1, 2, 2>, moe::OP_GATE_UP>("gu_m8_n128_w4_d2_s2"),
        make<G<8, 64, 256, 4, 1, 2, 1>, moe::OP_DOWN>("dn_m8_n64_w4_d2"),
        make<G<8, 64, 256, 4, 1, 2, 1, 4>, moe::OP_DOWN>("dn_m8_n64_w4_d2_o4"),
        make<G<8, 128, 256, 4, 1, 2, 1>, moe::OP_DOWN>("dn_m8_n128_w4_d2"),
        make<G<8, 128, 256, 8, 1, 2, 1>, moe::OP_DOWN>("dn_m8_n128_w8_d2"),
        make<G<8, 32, 256, 2, 1, 2, 1>, moe::OP_DOWN>("dn_m8_n32_w2_d2"),
        make<G<8, 64, 256, 2, 2, 1, 1>, moe::OP_DOWN>("dn_m8_n64_w2k2_d1"),
        make<G<16, 64, 256, 4, 1, 2, 1>, moe::OP_DOWN>("dn_m16_n64_w4_d2"),
        make<G<8, 256, 256, 8, 1, 2, 1>, moe::OP_DOWN>("dn_m8_n256_w8_d2"),
    };
}

static cudaError_t launch(const Variant& v, const moe::GroupedParams& p, int grid_x, int grid_y, cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid_x, grid_y, v.split);
    cfg.blockDim = dim3(v.threads);
    cfg.dynamicSmemBytes = v.smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    int na = 0;
    if (v.split > 1) {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 1;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = v.split;
        na = 1;
    }
    cfg.attrs = attr;
    cfg.numAttrs = na;
    return cudaLaunchKernelEx(&cfg, v.kernel, p);
}

// ---- routing ------------------------------------------------------------------------------------
static std::vector<int32_t> route(int B, int E, int topk, int mode, std::mt19937& rng) {
    std::vector<int32_t> ids(B * topk);
    for (int t = 0; t < B; ++t) {
        std::vector<int> perm(E);
        for (int e = 0; e < E; ++e) perm[e] = e;
        if (mode == 0) {
            std::shuffle(perm.begin(), perm.end(), rng);
        } else {  // skew: experts 0..2 first, then a few random
            std::shuffle(perm.begin() + 3, perm.end(), rng);
        }
        for (int s = 0; s < topk; ++s) ids[t * topk + s] = perm[s];
    }
    return ids;
}

struct Sched {
    int max_tiles, R;
    int32_t *ids, *offsets, *sorted, *inverse, *tiles, *count;
    Sched(int B, int topk, int E) {
        R = B * topk;
        max_tiles = std::min(E, R) + R / 8;
        CK(cudaMalloc(&ids, R * 4));
        CK(cudaMalloc(&offsets, (E + 1) * 4));
        CK(cudaMalloc(&sorted, R * 4));
        CK(cudaMalloc(&inverse, R * 4));
        CK(cudaMalloc(&tiles, moe::TILE_LISTS * max_tiles * 16));
        CK(cudaMalloc(&count, moe::TILE_LISTS * 4));
    }
    moe::AlignParams align(int B, int topk, int E) const {
        return moe::AlignParams{ids, offsets, sorted, inverse, tiles, count, B, topk, 0, E, max_tiles};
    }
    const int32_t* list(int bm) const { return tiles + moe::tile_list_of(bm) * max_tiles * 4; }
    const int32_t* cnt(int bm) const { return count + moe::tile_list_of(bm); }
};

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Time f(i) for i in 0..L-1 captured in one graph; returns median us per launch over reps replays.
template <class F>
static void time_graph(int L, F f, float& med, float& lo, float& hi) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < L; ++i) f(i, s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ge, s));
    std::vector<float> ts;
    for (int r = 0; r < 25; ++r) {
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        ts.push_back(ms * 1000.0f / L);
    }
    std::sort(ts.begin(), ts.end());
    med = ts[ts.size() / 2];
    lo = ts[ts.size() / 4];
    hi = ts[ts.size() * 3 / 4];
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(s));
}

int main(int argc, char** argv) {
    const int E = 256, TOPK = 8, HID = 6144, I = 256;
    const int NGU = 2 * I, KGU = HID, NDN = HID, KDN = I;
    std::vector<int> Bs = {1, 8, 64, 256};
    if (argc > 1) {
        Bs.clear();
        for (char* t = strtok(argv[1], ","); t; t = strtok(nullptr, ",")) Bs.push_back(atoi(t));
    }
    const int copies = argc > 2 ? atoi(argv[2]) : 24;
    const char* filter = argc > 3 ? argv[3] : "";
    const bool once = argc > 4 && strcmp(argv[4], "once") == 0;
    std::mt19937 rng(7);
    Weights wgu(E, NGU, KGU, rng), wdn(E, NDN, KDN, rng);
    DevWeights dgu(wgu, copies), ddn(wdn, copies);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# device %s, %d SMs; weight copies %d (gate_up %.0f MB, down %.0f MB per copy)\n", prop.name,
           prop.multiProcessorCount, copies, (dgu.code_total + dgu.sf_total) / 1e6, (ddn.code_total + ddn.sf_total) / 1e6);
    auto vs = variants();
    for (auto& v : vs) CK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
    printf("op,variant,B,mode,grid_y,active,max_abs_err,max_ref,bad,median_us,q1_us,q3_us,roofline_us\n");

    for (int B : Bs) {
        for (int mode = 0; mode < 2; ++mode) {
            auto ids = route(B, E, TOPK, mode, rng);
            Sched sc(B, TOPK, E);
            CK(cudaMemcpy(sc.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
            k_align<<<1, 1024>>>(sc.align(B, TOPK, E));
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            // ---- check the schedule against a host stable counting sort
            std::vector<int32_t> off(E + 1), sorted(sc.R), inv(sc.R), cnt(3);
            CK(cudaMemcpy(off.data(), sc.offsets, off.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(sorted.data(), sc.sorted, sorted.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(inv.data(), sc.inverse, inv.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(cnt.data(), sc.count, 12, cudaMemcpyDeviceToHost));
            {
                std::vector<int> c(E, 0), hoff(E + 1, 0);
                for (int x : ids) c[x]++;
                for (int e = 0; e < E; ++e) hoff[e + 1] = hoff[e] + c[e];
                std::vector<int> cur(hoff.begin(), hoff.end() - 1), hs(sc.R);
                for (int i = 0; i < sc.R; ++i) hs[cur[ids[i]]++] = i;
                bool ok = hoff == std::vector<int>(off.begin(), off.end()) && hs == std::vector<int>(sorted.begin(), sorted.end());
                for (int i = 0; i < sc.R; ++i) ok = ok && sorted[inv[i]] == i;
                int active = 0;
                for (int e = 0; e < E; ++e) active += c[e] > 0;
                int t8 = 0;
                for (int e = 0; e < E; ++e) t8 += (c[e] + 7) / 8;
                ok = ok && cnt[0] == t8;
                printf("align,-,%d,%d,-,%d,-,-,%s,-,-,-,-\n", B, mode, active, ok ? "0" : "SCHEDULE_MISMATCH");
            }
            int active = 0;
            for (int e = 0; e < E; ++e) active += off[e + 1] > off[e];
            // X, H, Y_rows, Y
            std::vector<uint16_t> X(size_t(B) * HID);
            std::normal_distribution<float> nd(0.0f, 1.0f);
            for (auto& x : X) x = to_bf(nd(rng));
            std::vector<float> wts(B * TOPK);
            for (auto& w : wts) w = 0.05f + (rng() % 100) / 100.0f;
            uint16_t *dX, *dH, *dYr, *dY;
            float* dW;
            CK(cudaMalloc(&dX, X.size() * 2));
            CK(cudaMalloc(&dH, size_t(sc.R) * I * 2));
            CK(cudaMalloc(&dYr, size_t(sc.R) * HID * 2));
            CK(cudaMalloc(&dY, size_t(B) * HID * 2));
            CK(cudaMalloc(&dW, wts.size() * 4));
            CK(cudaMemcpy(dX, X.data(), X.size() * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dW, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
            const int check_rows = std::min(sc.R, 256);
            // reference H for the first check_rows sorted rows
            std::vector<float> href(size_t(check_rows) * I);
            {
                std::vector<float> warm;
                wgu.row(0, 0, warm);  // builds the decode tables before the parallel loop
#pragma omp parallel for schedule(dynamic)
                for (int r = 0; r < check_rows; ++r) {
                    std::vector<float> wr;
                    const int id = sorted[r], t = id / TOPK;
                    int e = 0;
                    while (off[e + 1] <= r) ++e;
                    for (int j = 0; j < I; ++j) {
                        double gsum = 0, usum = 0;
                        wgu.row(e, j, wr);
                        for (int k = 0; k < HID; ++k) gsum += double(wr[k]) * bf(X[size_t(t) * HID + k]);
                        wgu.row(e, I + j, wr);
                        for (int k = 0; k < HID; ++k) usum += double(wr[k]) * bf(X[size_t(t) * HID + k]);
                        const float gg = float(gsum) * wgu.alpha[e], uu = float(usum) * wgu.alpha[e];
                        href[size_t(r) * I + j] = gg / (1.0f + std::exp(-gg)) * uu;
                    }
                }
            }
            const double gu_bytes = double(active) * (wgu.code_bytes + size_t(NGU) * KGU / 16) + double(B) * HID * 2 + double(sc.R) * I * 2;
            const double dn_bytes = double(active) * (wdn.code_bytes + size_t(NDN) * KDN / 16) + double(sc.R) * I * 2 + double(B) * HID * 2;
            std::vector<uint16_t> Hgpu(size_t(sc.R) * I);
            for (auto& v : vs) {
                const bool gu = v.op == moe::OP_GATE_UP;
                if (!strstr(v.name, filter) && &v != &vs[0]) continue;  // vs[0] makes the H down reads
                const int N = gu ? NGU : NDN, K = gu ? KGU : KDN;
                const int gx = (N + v.block_n - 1) / v.block_n;
                int occ = 0;
                CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, v.kernel, v.threads, v.smem));
                for (int cap_mode = 0; cap_mode < 3; ++cap_mode) {
                    int gy = sc.max_tiles;
                    if (cap_mode > 0) {
                        // persistent: cap_mode waves of resident CTAs
                        gy = std::max(1, std::min(sc.max_tiles, cap_mode * occ * prop.multiProcessorCount / (gx * v.split)));
                        if (gy >= sc.max_tiles) continue;
                    }
                    const DevWeights& dw = gu ? dgu : ddn;
                    auto params = [&](int c) {
                        moe::GroupedParams p{};
                        p.a = reinterpret_cast<const uint8_t*>(gu ? dX : dH);
                        p.w = dw.code + dw.code_total * c;
                        p.w_sf = dw.sf + dw.sf_total * c;
                        p.alpha = dw.alpha;
                        p.y = gu ? dH : dYr;
                        p.sorted_ids = sc.sorted;
                        p.tiles = sc.list(v.block_m);
                        p.tile_count = sc.cnt(v.block_m);
                        p.n = N;
                        p.k = K;
                        p.top_k = TOPK;
                        return p;
                    };
                    if (!gu) {
                        // down runs on the gate_up output of the first gate_up variant
                        CK(cudaMemcpy(dH, Hgpu.data(), Hgpu.size() * 2, cudaMemcpyHostToDevice));
                    }
                    CK(cudaMemset(gu ? (void*)dH : (void*)dYr, 0xff, gu ? size_t(sc.R) * I * 2 : size_t(sc.R) * HID * 2));
                    CK(launch(v, params(0), gx, gy, 0));
                    CK(cudaGetLastError());
                    CK(cudaDeviceSynchronize());
                    // verify
                    double max_err = 0, max_ref = 0;
                    long bad = 0;
                    if (gu) {
                        std::vector<uint16_t> H(size_t(sc.R) * I);
                        CK(cudaMemcpy(H.data(), dH, H.size() * 2, cudaMemcpyDeviceToHost));
                        for (int r = 0; r < check_rows; ++r)
                            for (int j = 0; j < I; ++j) {
                                const double ref = href[size_t(r) * I + j], got = bf(H[size_t(r) * I + j]);
                                const double err = std::fabs(ref - got);
                                max_err = std::max(max_err, err);
                                max_ref = std::max(max_ref, std::fabs(ref));
                                if (!(err <= 1e-2 * std::fabs(ref) + 1e-3 * 1.0 + 0.02)) ++bad;
                            }
                        if (Hgpu.empty() || &v == &vs[0]) Hgpu = H;
                    } else {
                        std::vector<uint16_t> Yr(size_t(sc.R) * HID);
                        CK(cudaMemcpy(Yr.data(), dYr, Yr.size() * 2, cudaMemcpyDeviceToHost));
                        std::vector<float> wr;
                        for (int r = 0; r < check_rows; ++r) {
                            int e = 0;
                            while (off[e + 1] <= r) ++e;
                            for (int n = 0; n < HID; n += 7) {
                                wdn.row(e, n, wr);
                                double s = 0;
                                for (int k = 0; k < I; ++k) s += double(wr[k]) * bf(Hgpu[size_t(r) * I + k]);
                                const double ref = s * wdn.alpha[e], got = bf(Yr[size_t(r) * HID + n]);
                                const double err = std::fabs(ref - got);
                                max_err = std::max(max_err, err);
                                max_ref = std::max(max_ref, std::fabs(ref));
                                if (!(err <= 1e-2 * std::fabs(ref) + 0.02)) ++bad;
                            }
                        }
                    }
                    float med = 0, lo = 0, hi = 0;
                    const int L = copies;
                    if (!once) time_graph(L, [&](int i, cudaStream_t s) { CK(launch(v, params(i), gx, gy, s)); }, med, lo, hi);
                    printf("%s,%s,%d,%d,%d,%d,%.4g,%.4g,%ld,%.2f,%.2f,%.2f,%.2f\n", gu ? "gate_up" : "down", v.name, B, mode, gy,
                           active, max_err, max_ref, bad, med, lo, hi, (gu ? gu_bytes : dn_bytes) / 4.27e6);
                    fflush(stdout);
                }
            }
            // align and finalize alone
            {
                float med, lo, hi;
                time_graph(20, [&](int, cudaStream_t s) { k_align<<<1, 1024, 0, s>>>(sc.align(B, TOPK, E)); }, med, lo, hi);
                printf("align,moe_align,%d,%d,1,%d,-,-,0,%.2f,%.2f,%.2f,-\n", B, mode, active, med, lo, hi);
                moe::FinalizeParams fp{dYr, dW, sc.inverse, dY, B, TOPK, HID};
                dim3 fg(B, (HID + 256 * 8 - 1) / (256 * 8));
                time_graph(20, [&](int, cudaStream_t s) { k_finalize<<<fg, 256, 0, s>>>(fp); }, med, lo, hi);
                printf("finalize,moe_finalize,%d,%d,-,%d,-,-,0,%.2f,%.2f,%.2f,-\n", B, mode, active, med, lo, hi);
                // finalize check
                std::vector<uint16_t> Yr(size_t(sc.R) * HID), Y(size_t(B) * HID);
                CK(cudaMemcpy(Yr.data(), dYr, Yr.size() * 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(Y.data(), dY, Y.size() * 2, cudaMemcpyDeviceToHost));
                long bad = 0;
                for (int t = 0; t < B; ++t)
                    for (int c = 0; c < HID; ++c) {
                        float a = 0;
                        for (int s = 0; s < TOPK; ++s) {
                            const int pos = inv[t * TOPK + s];
                            if (pos >= 0) a = std::fma(wts[t * TOPK + s], bf(Yr[size_t(pos) * HID + c]), a);
                        }
                        if (to_bf(a) != Y[size_t(t) * HID + c]) ++bad;
                    }
                printf("finalize_check,-,%d,%d,-,-,-,-,%ld,-,-,-,-\n", B, mode, bad);
            }
            CK(cudaFree(dX));
            CK(cudaFree(dH));
            CK(cudaFree(dYr));
            CK(cudaFree(dY));
            CK(cudaFree(dW));
        }
    }
    return 0;
}
