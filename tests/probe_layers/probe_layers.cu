// SCRATCH session 66 (probe, reverted after its commit): batch-1 decode's products, twelve layers of
// them, chained by PDL'd kernels (as the engine chains them) against one persistent kernel whose
// activations carry their stage's tag (the stage probe's "ll" form): what the tagged handoff saves
// once the stages stream real weights (docs/PERF.md, "Session 66").
//
// A layer is GPT-2 124M's four products at one row, bf16 weights, fp32 activations:
//   qkv 768 -> 2304, the attention projection 768 -> 768 (on qkv's first 768 outputs, standing in
//   for the attention), fc 768 -> 3072, the MLP projection 3072 -> 768; each y = tanh(W x).
// 48 dependent stages, 170 MB of weights (distinct per layer: L2 holds none of them a step later).
// A block owns a slice of each product's rows (a block an SM); its slice of W arrives by one bulk
// copy (TMA) into shared memory:
//   pdl  48 kernels in a graph; each issues its copy, releases its dependents, then waits
//        (griddepcontrol.wait) and reads its input from global memory.
//   ll   one cooperative kernel; R slots of shared memory hold the next stages' slices (a copy is
//        issued as soon as a slot frees, R - 1 stages ahead); a stage's input words {tag, value}
//        are polled by the block (each word once) into shared memory, one barrier, then the rows.
// Both compute the same sums in the same order: their last vectors must agree to the bit.
// Prints µs per step (48 stages): medians over 21 replays of a graph of 10 steps.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#define CK(x)                                                                                       \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

constexpr int C = 768, LAYERS = 12, STAGES = 4 * LAYERS, THREADS = 256, WARPS = THREADS / 32;
constexpr int R = 5;                 // ll: weight slots
constexpr int SLOT = 37 * 1024;      // bytes: the largest slice at 132 blocks is 36,864
constexpr int XS = 4 * C;            // floats: the largest input

struct Stage {
    int N, K;
    long long w_off;    // elements into W
    long long act_off;  // elements into the activations (this stage's output)
};
struct Plan {
    Stage st[STAGES];
};

// kind 0 qkv, 1 the attention projection, 2 fc, 3 the MLP projection (after a 2 only)
static void stage_shape(int kind, int *N, int *K) {
    *N = kind == 0 ? 3 * C : kind == 2 ? 4 * C : C;
    *K = kind == 3 ? 4 * C : C;
}

__device__ __forceinline__ void block_rows(int N, int *r0, int *r1) {
    const int per = (N + gridDim.x - 1) / gridDim.x;
    *r0 = min(N, (int)blockIdx.x * per), *r1 = min(N, *r0 + per);
}

// ---------------------------------------------------------------------------------------------
// mbarriers and the bulk copy
__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}
// The block's slice of stage s's W into dst (thread 0 only); an empty slice still completes the phase.
__device__ __forceinline__ void load_slice(void *dst, const __nv_bfloat16 *W, const Stage &st, uint64_t *bar) {
    int r0, r1;
    block_rows(st.N, &r0, &r1);
    const uint32_t bytes = (uint32_t)(r1 - r0) * st.K * 2;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
    if (bytes)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                smem_addr(dst)),
            "l"(W + st.w_off + (long long)r0 * st.K), "r"(bytes), "r"(smem_addr(bar))
            : "memory");
}

// ---------------------------------------------------------------------------------------------
// A stage's rows [r0, r1): 8 bf16 weights and 8 inputs a lane a step, K in lane-strided chunks of
// 256 (K 768 or 3072, unrolled); the same code for both forms, so the same bits.
// Warp w takes rows r0 + w + 8 j, j < RPW, together: x's vectors read once for all of them, two
// sums a row (even and odd chunks) so that no chain of FMAs is longer than half of K / 32.
template <int K, int RPW, typename Store>
__device__ __forceinline__ void stage_rows_k(const __nv_bfloat16 *ws, const float *xs, int r0, int r1, Store store) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float s[RPW][2];
    const __nv_bfloat16 *w[RPW];
#pragma unroll
    for (int j = 0; j < RPW; j++) {
        const int r = min(r0 + warp + WARPS * j, r1 - 1);  // past r1: a copy of the last row, not stored
        w[j] = ws + (size_t)(r - r0) * K;
        s[j][0] = s[j][1] = 0.f;
    }
#pragma unroll(K / 256 > 4 ? 4 : K / 256)
    for (int c = 0; c < K / 256; c++) {
        const int k = 256 * c + 8 * lane;
        const float4 x0 = *reinterpret_cast<const float4 *>(xs + k);
        const float4 x1 = *reinterpret_cast<const float4 *>(xs + k + 4);
#pragma unroll
        for (int j = 0; j < RPW; j++) {
            const uint4 wv = *reinterpret_cast<const uint4 *>(w[j] + k);
            const __nv_bfloat162 *w2 = reinterpret_cast<const __nv_bfloat162 *>(&wv);
            const float2 a = __bfloat1622float2(w2[0]), b = __bfloat1622float2(w2[1]);
            const float2 cc = __bfloat1622float2(w2[2]), d = __bfloat1622float2(w2[3]);
            float &t = s[j][c & 1];
            t = fmaf(a.x, x0.x, t), t = fmaf(a.y, x0.y, t), t = fmaf(b.x, x0.z, t), t = fmaf(b.y, x0.w, t);
            t = fmaf(cc.x, x1.x, t), t = fmaf(cc.y, x1.y, t), t = fmaf(d.x, x1.z, t), t = fmaf(d.y, x1.w, t);
        }
    }
    float v[RPW];
#pragma unroll
    for (int j = 0; j < RPW; j++) v[j] = s[j][0] + s[j][1];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int j = 0; j < RPW; j++) v[j] += __shfl_xor_sync(0xffffffffu, v[j], o);
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < RPW; j++)
            if (r0 + warp + WARPS * j < r1) store(r0 + warp + WARPS * j, tanhf(v[j]));
}
template <int K, typename Store>
__device__ __forceinline__ void stage_rows_rpw(const __nv_bfloat16 *ws, const float *xs, int r0, int r1,
                                               Store store) {
    const int rpw = (r1 - r0 + WARPS - 1) / WARPS;
    if (rpw <= 0 || threadIdx.x / 32 >= r1 - r0) return;
    if (rpw == 1) stage_rows_k<K, 1>(ws, xs, r0, r1, store);
    else if (rpw == 2) stage_rows_k<K, 2>(ws, xs, r0, r1, store);
    else if (rpw == 3) stage_rows_k<K, 3>(ws, xs, r0, r1, store);
    else __trap();
}
template <typename Store>
__device__ __forceinline__ void stage_rows(const __nv_bfloat16 *ws, const float *xs, int K, int r0, int r1,
                                           Store store) {
    if (K == C) stage_rows_rpw<C>(ws, xs, r0, r1, store);
    else stage_rows_rpw<4 * C>(ws, xs, r0, r1, store);
}

// ---------------------------------------------------------------------------------------------
// pdl: stage s, a kernel. Input: y0 (s == 0) or the previous stage's output, plain floats.
__global__ void __launch_bounds__(THREADS) one_stage(const __nv_bfloat16 *W, const float *y0, float *acts, Plan plan,
                                                     int s) {
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *ws = reinterpret_cast<__nv_bfloat16 *>(smem);
    float *xs = reinterpret_cast<float *>(smem + SLOT);
    __shared__ __align__(8) uint64_t bar;
    const Stage st = plan.st[s];
    if (threadIdx.x == 0) {
        mbar_init(&bar);
        mbar_fence_init();
        load_slice(ws, W, st, &bar);
    }
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const float *in = s == 0 ? y0 : acts + plan.st[s - 1].act_off;
    for (int k = threadIdx.x; k < st.K; k += THREADS) xs[k] = __ldcg(in + k);
    __syncthreads();  // also: the barrier's init before anyone waits on it
    mbar_wait(&bar, 0);
    int r0, r1;
    block_rows(st.N, &r0, &r1);
    float *out = acts + st.act_off;
    stage_rows(ws, xs, st.K, r0, r1, [&](int r, float v) { out[r] = v; });
}

// ---------------------------------------------------------------------------------------------
// ll: every stage in one kernel; words {tag, value}, tags gen * STAGES + s + 1 (distinct across launches)
__device__ __forceinline__ void st_ll(unsigned long long *p, float v, unsigned tag) {
    const unsigned long long w = ((unsigned long long)tag << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ unsigned long long ld_ll(const unsigned long long *p) {
    unsigned long long w;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
    return w;
}

// MODE 0: as described; 1: the rows do not wait for their weights (copies still issued; timing only);
// 2: no copies after the first R, no waits (the stages without the weight stream; timing only);
// 3: as 0 without the proxy fence before a copy; 4: as 3, the copies issued by the block's last thread
// (whose warp has no row in the 6-row stages) instead of thread 0
template <int MODE>
__global__ void __launch_bounds__(THREADS) persistent_ll(const __nv_bfloat16 *W, const float *y0,
                                                         unsigned long long *lls, Plan plan, int *done, int *gen) {
    extern __shared__ __align__(128) unsigned char smem[];
    float *xs = reinterpret_cast<float *>(smem + R * SLOT);  // [2][XS], by the stage's parity
    __shared__ __align__(8) uint64_t bars[R];
    __shared__ Stage plan_s[STAGES];  // indexed by the stage: shared memory, not the parameter space
    const unsigned base = (unsigned)gen[0] * STAGES;
    for (int i = threadIdx.x; i < STAGES; i += THREADS) plan_s[i] = plan.st[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int j = 0; j < R; j++) mbar_init(&bars[j]);
        mbar_fence_init();
        for (int s = 0; s < R; s++) load_slice(smem + s * SLOT, W, plan_s[s], &bars[s]);
    }
    for (int s = 0; s < STAGES; s++) {
        const Stage st = plan_s[s];
        float *x = xs + (s & 1) * XS;
        if (s == 0) {
            for (int k = threadIdx.x; k < st.K; k += THREADS) x[k] = __ldcg(y0 + k);
        } else {  // thread t polls words t, t + 256, ... (at most 12)
            const unsigned long long *in = lls + plan_s[s - 1].act_off;
            const unsigned tag = base + s;
            unsigned long long w[XS / THREADS];
            const int n = st.K / THREADS;
#pragma unroll
            for (int i = 0; i < XS / THREADS; i++)
                if (i < n) w[i] = ld_ll(in + threadIdx.x + THREADS * i);
            for (;;) {
                bool ready = true;
#pragma unroll
                for (int i = 0; i < XS / THREADS; i++) ready = ready && (i >= n || (unsigned)(w[i] >> 32) == tag);
                if (ready) break;
#pragma unroll
                for (int i = 0; i < XS / THREADS; i++)
                    if (i < n && (unsigned)(w[i] >> 32) != tag) w[i] = ld_ll(in + threadIdx.x + THREADS * i);
            }
#pragma unroll
            for (int i = 0; i < XS / THREADS; i++)
                if (i < n) x[threadIdx.x + THREADS * i] = __uint_as_float((unsigned)w[i]);
        }
        __syncthreads();  // x in; and every warp is past stage s - 1's rows: its slot is free
        if (MODE != 2 && threadIdx.x == (MODE == 4 ? THREADS - 1 : 0) && s >= 1 && s - 1 + R < STAGES) {
            if (MODE < 3) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            load_slice(smem + ((s - 1) % R) * SLOT, W, plan_s[s - 1 + R], &bars[(s - 1) % R]);
        }
        if (MODE == 0 || (MODE == 2 && s < R)) mbar_wait(&bars[s % R], (s / R) & 1);
        int r0, r1;
        block_rows(st.N, &r0, &r1);
        unsigned long long *out = lls + st.act_off;
        const unsigned tag = base + s + 1;
        stage_rows(reinterpret_cast<const __nv_bfloat16 *>(smem + (s % R) * SLOT), x, st.K, r0, r1,
                   [&](int r, float v) { st_ll(out + r, v, tag); });
    }
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(done, 1) == ((int)(base / STAGES) + 1) * (int)gridDim.x - 1) gen[0] += 1;
}

// ---------------------------------------------------------------------------------------------
// Host
static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <typename F> static float time_steps(F step, cudaStream_t st, int reps) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < reps; i++) step();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int i = 0; i < 24; i++) {
        CK(cudaEventRecord(a, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (i >= 3) t.push_back(ms * 1000.f / reps);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return median(t);
}

int main(int argc, char **argv) {
    // argv: [once] [pattern]: once for compute-sanitizer (one step of each, no timing); the pattern of
    // kinds a layer repeats (default 0123; 1111, 0000, 2222, 2323 time one kind or the MLP alone)
    const bool once = argc > 1 && !strcmp(argv[1], "once");
    const char *pattern = argc > 1 + once ? argv[1 + once] : "0123";
    const int plen = (int)strlen(pattern);
    for (int i = 0; i < plen; i++)
        if (pattern[i] < '0' || pattern[i] > '3' || (pattern[i] == '3' && pattern[(i + plen - 1) % plen] != '2')) {
            fprintf(stderr, "pattern %s: kinds 0-3, a 3 only after a 2\n", pattern);
            return 1;
        }
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    Plan plan;
    long long w_total = 0, act_total = 0;
    for (int s = 0; s < STAGES; s++) {
        int N, K;
        stage_shape(pattern[s % plen] - '0', &N, &K);
        plan.st[s] = {N, K, w_total, act_total};
        const long long per = (N + sms - 1) / sms;
        if (per * K * 2 > SLOT) {
            fprintf(stderr, "stage %d: a slice of %lld bytes exceeds the slot\n", s, per * K * 2);
            return 1;
        }
        w_total += (long long)N * K, act_total += N;
    }
    std::vector<__nv_bfloat16> hw(w_total);
    srand(1);
    for (int s = 0; s < STAGES; s++) {  // uniform in +-sqrt(6 / K): gain ~sqrt(2) a stage before tanh
        const float a = sqrtf(6.f / plan.st[s].K);
        for (long long i = 0; i < (long long)plan.st[s].N * plan.st[s].K; i++)
            hw[plan.st[s].w_off + i] = __float2bfloat16(((float)rand() / RAND_MAX * 2.f - 1.f) * a);
    }
    std::vector<float> hy(C);
    for (auto &e : hy) e = (float)rand() / RAND_MAX * 2.f - 1.f;
    __nv_bfloat16 *W;
    float *y0, *acts;
    unsigned long long *lls;
    int *done, *gen;
    CK(cudaMalloc(&W, w_total * 2));
    CK(cudaMalloc(&y0, C * 4));
    CK(cudaMalloc(&acts, act_total * 4));
    CK(cudaMalloc(&lls, act_total * 8));
    CK(cudaMalloc(&done, 4));
    CK(cudaMalloc(&gen, 4));
    CK(cudaMemcpy(W, hw.data(), w_total * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(y0, hy.data(), C * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(lls, 0, act_total * 8));
    CK(cudaMemset(done, 0, 4));
    CK(cudaMemset(gen, 0, 4));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t smem_pdl = SLOT + XS * 4, smem_ll = (size_t)R * SLOT + 2 * XS * 4;
    CK(cudaFuncSetAttribute(one_stage, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_pdl));
    CK(cudaFuncSetAttribute(persistent_ll<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_ll));
    CK(cudaFuncSetAttribute(persistent_ll<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_ll));
    CK(cudaFuncSetAttribute(persistent_ll<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_ll));
    CK(cudaFuncSetAttribute(persistent_ll<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_ll));
    CK(cudaFuncSetAttribute(persistent_ll<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_ll));
    const int grid = sms;
    auto step_pdl = [&]() {
        for (int s = 0; s < STAGES; s++) {
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute attr;
            attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr.val.programmaticStreamSerializationAllowed = 1;
            cfg.gridDim = dim3(grid), cfg.blockDim = dim3(THREADS), cfg.dynamicSmemBytes = smem_pdl, cfg.stream = st;
            cfg.attrs = &attr, cfg.numAttrs = 1;
            CK(cudaLaunchKernelEx(&cfg, one_stage, (const __nv_bfloat16 *)W, (const float *)y0, acts, plan, s));
        }
    };
    auto step_ll_mode = [&](int mode) {
        void *args[] = {&W, &y0, &lls, &plan, &done, &gen};
        void *const forms[] = {(void *)persistent_ll<0>, (void *)persistent_ll<1>, (void *)persistent_ll<2>,
                               (void *)persistent_ll<3>, (void *)persistent_ll<4>};
        void *f = forms[mode];
        CK(cudaLaunchCooperativeKernel(f, dim3(grid), dim3(THREADS), args, smem_ll, st));
    };
    auto step_ll = [&]() { step_ll_mode(0); };
    const long long last = plan.st[STAGES - 1].act_off;
    std::vector<float> a(C), b(C);
    std::vector<unsigned long long> words(C);
    CK(cudaMemset(acts, 0, act_total * 4));
    step_pdl();
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(a.data(), acts + last, C * 4, cudaMemcpyDeviceToHost));
    step_ll();
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(words.data(), lls + last, C * 8, cudaMemcpyDeviceToHost));
    for (int i = 0; i < C; i++) {
        const unsigned lo = (unsigned)words[i];
        memcpy(&b[i], &lo, 4);
    }
    double norm = 0;
    for (float v : a) norm += (double)v * v;
    const bool same = !memcmp(a.data(), b.data(), C * 4);
    printf("pattern %s x %d (%d stages, %.0f MB of bf16 weights), %d blocks\n", pattern, STAGES / plen, STAGES,
           w_total * 2 / 1e6, grid);
    printf("pdl and ll agree to the bit: %s (|y_last| %.3f)\n", same ? "yes" : "NO", sqrt(norm));
    if (!same) return 2;
    if (once) return 0;
    const float tp = time_steps(step_pdl, st, 10), tl = time_steps(step_ll, st, 10);
    const float t1 = time_steps([&]() { step_ll_mode(1); }, st, 10), t2 = time_steps([&]() { step_ll_mode(2); }, st, 10);
    printf("  us a step: pdl %.1f (%.2f a stage)   ll %.1f (%.2f a stage)   weights at 4.2 TB/s: %.1f\n", tp,
           tp / STAGES, tl, tl / STAGES, w_total * 2 / 4.2e6);
    printf("  ll, rows not waiting for their weights %.1f (%.2f a stage); without the stream %.1f (%.2f)\n", t1,
           t1 / STAGES, t2, t2 / STAGES);
    const float t3 = time_steps([&]() { step_ll_mode(3); }, st, 10), t4 = time_steps([&]() { step_ll_mode(4); }, st, 10);
    printf("  ll without the proxy fence %.1f (%.2f a stage); and the copies from the last thread %.1f (%.2f)\n", t3,
           t3 / STAGES, t4, t4 / STAGES);
    return 0;
}
