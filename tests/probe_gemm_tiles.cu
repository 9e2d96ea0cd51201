// Session 32 probe, not built by the Makefile (reverted): a many-row Hopper GEMM whose tiles fill the SMs,
// against matmul_lt (cuBLASLt). Build on the device against build/gpu objects (docs/PERF.md, "Session 32").
#include <algorithm>
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "kernel_util.h"
#include "matmul_lt.h"
#include "pdl.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

#define WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#define WGMMA_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#include "probe_wgmma_wide.inc"

#define CK(...)                                                                              \
    do {                                                                                     \
        cudaError_t e_ = (__VA_ARGS__);                                                              \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #__VA_ARGS__, cudaGetErrorString(e_)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

__device__ __forceinline__ void regs_shrink40() { asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n"); }
__device__ __forceinline__ void regs_grow232() { asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n"); }

struct Out {
    void *y;
    const void *bias;
    int ldy;
};

constexpr int BM = 128, BK = 64;

template <int EPI, int BN> struct Stage;
template <int BN, int STAGES, int EPI> struct Cfg {
    static constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE = A_BYTES + B_BYTES;
    // the stages, the barriers (1 KB kept), the two consumers' epilogue tiles
    static constexpr size_t SMEM = 1024 + (size_t)STAGES * STAGE + 1024 + 2 * Stage<EPI, BN>::BYTES;
};

// The epilogue through shared memory: a consumer warpgroup writes its 64 x BN tile there (bias and
// GELU applied; fp32 for the residual products, else bf16) in the accumulators' layout, then reads
// it back row-major so that every global access is a 16-byte vector of whole rows (the residual
// read with it): stored straight from the accumulators, each warp's store covers eight rows x 16
// bytes, half a sector each.
template <int EPI, int BN> struct Stage {
    static constexpr bool F32 = EPI == MATMUL_LT_BIAS_RESIDUAL;
    static constexpr int ESZ = F32 ? 4 : 2;
    static constexpr int LD = F32 ? BN + 8 : BN + 8;  // elements a staged row: conflict-free writes
    static constexpr int BYTES = 64 * LD * ESZ;         // one consumer's
};
template <int EPI, int BN>
__device__ __forceinline__ void epilogue(const Out &o, const float (&acc)[BN / 8][4], unsigned char *stage, int c,
                                         int warp, int lane, int m0, int n0, int M, int N) {
    typedef Stage<EPI, BN> S;
    const int rl = 16 * warp + lane / 4, cl = 2 * (lane % 4);  // this thread's rows rl, rl + 8 of the 64
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");  // the last tile's reads are done
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        const int col = n0 + cl + 8 * j;
        float2 bias = make_float2(0.f, 0.f);
        if (col < N) {
            if (S::F32) bias = *reinterpret_cast<const float2 *>((const float *)o.bias + col);
            else bias = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>((const bf16 *)o.bias + col));
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float2 v = make_float2(acc[j][2 * h] + bias.x, acc[j][2 * h + 1] + bias.y);
            if (EPI == MATMUL_LT_BIAS_GELU) v = make_float2(gelu_tanh(v.x), gelu_tanh(v.y));
            const int at = (rl + 8 * h) * S::LD + cl + 8 * j;
            if (S::F32) *reinterpret_cast<float2 *>((float *)stage + at) = v;
            else *reinterpret_cast<__nv_bfloat162 *>((bf16 *)stage + at) = __floats2bfloat162_rn(v.x, v.y);
        }
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
    constexpr int EPV = 16 / S::ESZ, CPR = BN / EPV, PER = 64 * CPR / 128;  // vectors a thread
    static_assert(64 * CPR % 128 == 0, "whole vectors a thread");
    const int t = threadIdx.x % 128;
    if constexpr (S::F32) {
        // The residual's loads all issued before any store: a store may alias a later load, so
        // interleaved each load would wait out the last store's round trip.
        constexpr int B = PER < 8 ? PER : 8;
#pragma unroll
        for (int i0 = 0; i0 < PER; i0 += B) {
            float4 y[B];
#pragma unroll
            for (int b = 0; b < B; b++) {
                const int i = t + 128 * (i0 + b), r = i / CPR, col = n0 + (i % CPR) * EPV;
                y[b] = i0 + b < PER && m0 + r < M && col < N ? *reinterpret_cast<const float4 *>((const float *)o.y + (size_t)(m0 + r) * o.ldy + col)
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int b = 0; b < B; b++) {
                const int i = t + 128 * (i0 + b), r = i / CPR, cc = (i % CPR) * EPV, col = n0 + cc;
                if (i0 + b >= PER || m0 + r >= M || col >= N) continue;
                const float4 a = *reinterpret_cast<const float4 *>((const float *)stage + r * S::LD + cc);
                *reinterpret_cast<float4 *>((float *)o.y + (size_t)(m0 + r) * o.ldy + col) =
                    make_float4(y[b].x + a.x, y[b].y + a.y, y[b].z + a.z, y[b].w + a.w);
            }
        }
    } else {
#pragma unroll 4
        for (int i = t; i < 64 * CPR; i += 128) {
            const int r = i / CPR, cc = (i % CPR) * EPV, row = m0 + r, col = n0 + cc;
            if (row >= M || col >= N) continue;  // N a multiple of 8 per vector
            *reinterpret_cast<uint4 *>((bf16 *)o.y + (size_t)row * o.ldy + col) =
                *reinterpret_cast<const uint4 *>((const bf16 *)stage + r * S::LD + cc);
        }
    }
}

template <int BN, int STAGES, int EPI, int MODE>
__global__ void __launch_bounds__(384, 1)
    gemm_tiles_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map, Out out,
                      int M, int N, int K) {
    typedef Cfg<BN, STAGES, EPI> C;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + STAGES * C::STAGE), *empty = full + STAGES;
    const int m_tiles = (M + BM - 1) / BM, tiles = m_tiles * ((N + BN - 1) / BN), k_steps = K / BK;
    auto xt = [&](int s) { return smem + s * C::STAGE; };
    auto wt = [&](int s) { return smem + s * C::STAGE + C::A_BYTES; };
    pdl_launch_dependents();
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 8);
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        regs_shrink40();
        if (threadIdx.x != 0) {
            pdl_wait();
            return;
        }
        tma_prefetch_map(&x_map), tma_prefetch_map(&w_map);
        const int first = blockIdx.x, ahead = std::min(k_steps, STAGES);
        for (int k = 0; k < ahead; k++) {
            mbar_arrive_expect_tx(&full[k], C::STAGE);
            tma_load(wt(k), &w_map, k * BK, (first / m_tiles) * BN, &full[k]);
        }
        pdl_wait();
        for (int k = 0; k < ahead; k++) tma_load(xt(k), &x_map, k * BK, (first % m_tiles) * BM, &full[k]);
        int it = 0;
        for (int u = first; u < tiles; u += gridDim.x)
            for (int k = 0; k < k_steps; k++, it++) {
                if (it < ahead) continue;
                const int s = it % STAGES;
                mbar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);
                if (MODE == 2) {
                    mbar_arrive(&full[s]);
                    continue;
                }
                mbar_arrive_expect_tx(&full[s], C::STAGE);
                tma_load(wt(s), &w_map, k * BK, (u / m_tiles) * BN, &full[s]);
                tma_load(xt(s), &x_map, k * BK, (u % m_tiles) * BM, &full[s]);
            }
        return;
    }
    regs_grow232();
    pdl_wait();
    const int c = threadIdx.x / 128 - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    float acc[BN / 8][4];
    int it = 0;
    for (int u = blockIdx.x; u < tiles; u += gridDim.x) {
#pragma unroll
        for (int j = 0; j < BN / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        for (int k = 0; k < k_steps; k++, it++) {
            const int s = it % STAGES;
            mbar_wait(&full[s], (it / STAGES) & 1);
            const uint64_t xd = wgmma_desc_sw128(xt(s) + c * 64 * 128), wd = wgmma_desc_sw128(wt(s));
            wgmma_fence();
            if (MODE != 1) {
#pragma unroll
                for (int kk = 0; kk < 4; kk++) wgmma_ss<BN>(acc, xd + 2 * kk, wd + 2 * kk);
            }
            wgmma_commit();
            wgmma_wait<1>();
            if (k > 0 && lane == 0) mbar_arrive(&empty[(it - 1) % STAGES]);
        }
        wgmma_wait<0>();
        wgmma_hold(acc);
        if (lane == 0) mbar_arrive(&empty[(it - 1) % STAGES]);
        epilogue<EPI, BN>(out, acc, smem + STAGES * C::STAGE + 1024 + c * Stage<EPI, BN>::BYTES, c, warp, lane,
                          (u % m_tiles) * BM + 64 * c, (u / m_tiles) * BN, M, N);
    }
}

template <int BN, int STAGES, int EPI, int MODE = 0>
cudaError_t launch(const Out &o, const void *x, const void *W, int M, int N, int K, int grid_cap, cudaStream_t st) {
    typedef Cfg<BN, STAGES, EPI> C;
    static CUtensorMap xm, wm;
    if (!tensor_map(&xm, x, M, K, K, BM) || !tensor_map(&wm, W, N, K, K, BN)) return cudaErrorInvalidValue;
    static bool set;
    if (!set) {
        set = true;
        CK(cudaFuncSetAttribute(gemm_tiles_kernel<BN, STAGES, EPI, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)C::SMEM));
    }
    const int tiles = ((M + BM - 1) / BM) * ((N + BN - 1) / BN);
    return launch_pdl(gemm_tiles_kernel<BN, STAGES, EPI, MODE>, dim3(std::min(tiles, grid_cap)), dim3(384), C::SMEM, st, xm,
                      wm, o, M, N, K);
}

// ----------------------------------------------------------------------------
static float frand() { return (float)rand() / RAND_MAX * 2.f - 1.f; }
static void *upload(const std::vector<float> &h, bool as_bf16) {
    void *d;
    if (as_bf16) {
        std::vector<bf16> b(h.size());
        for (size_t i = 0; i < h.size(); i++) b[i] = __float2bfloat16(h[i]);
        CK(cudaMalloc(&d, b.size() * 2));
        CK(cudaMemcpy(d, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    } else {
        CK(cudaMalloc(&d, h.size() * 4));
        CK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    }
    return d;
}
static std::vector<float> fetch(const void *d, size_t n, bool is_bf16) {
    std::vector<float> h(n);
    if (is_bf16) {
        std::vector<bf16> b(n);
        CK(cudaMemcpy(b.data(), d, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) h[i] = __bfloat162float(b[i]);
    } else {
        CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    }
    return h;
}

cudaStream_t st;
MatmulLt *lt;

template <typename F> float time_graph(F enqueue) {
    const int reps = 20;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < reps; i++) enqueue();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    std::vector<float> v;
    for (int r = 0; r < 15; r++) {
        cudaEventRecord(a, st);
        CK(cudaGraphLaunch(ge, st));
        cudaEventRecord(b, st);
        CK(cudaEventSynchronize(b));
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        if (r >= 3) v.push_back(ms * 1000.f / reps);
    }
    std::sort(v.begin(), v.end());
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    return v[v.size() / 2];
}

template <int BN, int STAGES, int EPI>
void probe(const char *name, int M, int N, int K, void *x, void *W, void *bias, void *y, const std::vector<float> &ref,
           int sms) {
    const bool fp32 = EPI == MATMUL_LT_BIAS_RESIDUAL;
    const size_t bytes = (size_t)M * N * (fp32 ? 4 : 2);
    Out o = {y, bias, N};
    CK(cudaMemset(y, 0, bytes));
    CK(launch<BN, STAGES, EPI>(o, x, W, M, N, K, sms, st));
    CK(cudaStreamSynchronize(st));
    std::vector<float> h = fetch(y, (size_t)M * N, !fp32);
    double e = 0, r = 0;
    for (size_t i = 0; i < h.size(); i++) e += (h[i] - ref[i]) * (h[i] - ref[i]), r += ref[i] * ref[i];
    const float us = time_graph([&] { CK(launch<BN, STAGES, EPI>(o, x, W, M, N, K, sms, st)); });
    const float us1 = time_graph([&] { CK(launch<BN, STAGES, EPI, 1>(o, x, W, M, N, K, sms, st)); });
    const float us2 = time_graph([&] { CK(launch<BN, STAGES, EPI, 2>(o, x, W, M, N, K, sms, st)); });
    printf("  %-7s M=%-5d BN=%-3d S=%d tiles %5d | %7.2f us %6.0f TFLOP/s | loads only %7.2f | MMAs only %7.2f | rel_l2 %.2e\n", name, M, BN, STAGES,
           ((M + 127) / 128) * ((N + BN - 1) / BN), us, 2.0 * M * N * K / us * 1e-6, us1, us2, sqrt(e / r));
}

template <int EPI> struct Shapes;

int main() {
    CK(cudaStreamCreate(&st));
    Error err;
    lt = matmul_lt_create(32u << 20, &err);
    int sms;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int Ms[] = {1024, 8192};
    struct P {
        const char *name;
        int N, K, epi;
    } ps[] = {{"qkv", 2304, 768, 1}, {"proj", 768, 768, 2}, {"fc", 3072, 768, 3}, {"fcproj", 768, 3072, 2}};
    for (int M : Ms)
        for (const P &p : ps) {
            std::vector<float> hx((size_t)M * p.K), hw((size_t)p.N * p.K), hb(p.N);
            for (auto &v : hx) v = frand();
            for (auto &v : hw) v = frand() * 0.03f;
            for (auto &v : hb) v = frand() * 0.1f;
            const bool fp32 = p.epi == MATMUL_LT_BIAS_RESIDUAL;
            void *x = upload(hx, true), *W = upload(hw, true), *bias = upload(hb, !fp32), *y;
            const size_t bytes = (size_t)M * p.N * (fp32 ? 4 : 2);
            CK(cudaMalloc(&y, bytes));
            CK(cudaMemset(y, 0, bytes));
            const MatmulLtEpilogue epi = (MatmulLtEpilogue)p.epi;
            if (matmul_lt(lt, epi, y, p.N, x, W, DTYPE_BF16, bias, M, p.N, p.K, NULL, st)) exit(2);
            CK(cudaStreamSynchronize(st));
            std::vector<float> ref = fetch(y, (size_t)M * p.N, !fp32);
            const float tl = time_graph([&] { matmul_lt(lt, epi, y, p.N, x, W, DTYPE_BF16, bias, M, p.N, p.K, NULL, st); });
            printf("%-7s M=%-5d cuBLASLt %7.2f us %6.0f TFLOP/s\n", p.name, M, tl, 2.0 * M * p.N * p.K / tl * 1e-6);
#define PR(BN, S, E) probe<BN, S, E>(p.name, M, p.N, p.K, x, W, bias, y, ref, sms)
            if (p.epi == 1) PR(144, 5, 1), PR(144, 4, 1), PR(144, 3, 1), PR(192, 4, 1);
            if (p.epi == 3) PR(192, 4, 3), PR(192, 3, 3), PR(192, 2, 3);
            if (p.epi == 2) PR(48, 8, 2), PR(48, 6, 2), PR(96, 6, 2), PR(128, 4, 2), PR(64, 7, 2);
            cudaFree(x), cudaFree(W), cudaFree(bias), cudaFree(y);
        }
    return 0;
}
