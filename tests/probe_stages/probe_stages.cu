// SCRATCH session 65, extended in session 66 (probe, reverted after its commit): what one dependent
// all-to-all stage costs, the floor under batch-1 decode's ~60 stages a step (docs/PERF.md, "Session 66").
//
// A stage is a 768 x 768 GEMV on one vector: y_s = tanh(W y_{s-1}), every output needing every
// input, as qkv, the attention projection, fc and the MLP projection each do. Rows are split over the
// blocks, a warp a row; W's rows of a block sit in its shared memory (a megakernel would have them
// there before the stage's input arrives, as the engine's kernels load weights before the PDL wait).
// Five ways to chain 60 stages, each over 132, 66 and 33 blocks:
//   persistent  one cooperative kernel; a stage waits for the last one's arrivals on a counter in
//               global memory (red.release.gpu by each block's thread 0, polled by ld.acquire.gpu)
//   flags       the same kernel with a flag a block instead of one counter (st.release.gpu of the
//               stages it has done; thread t of each block polls block t's flag): no atomics on one
//               address
//   pdl         60 kernels in a graph, programmatic dependent launch (W's rows loaded, then
//               griddepcontrol.wait), as the engine chains its kernels
//   plain       the same 60 kernels in a graph without PDL
//   ll          (session 66) one cooperative kernel whose values carry their stage's tag in the same 8-byte
//               word (NCCL's low-latency protocol): a warp polls its inputs themselves; no fence, no flag
// and, as diagnostics, the persistent kernel without its waits (the stages' own work with their block
// barrier and release arrival), and without those too (the GEMV rows alone).
// Session 66: tanh(W y) without session 65's / 8, so that y keeps its size over 60 stages (with it
// y_60 underflowed to zero and the bit check compared zeros).
// Every form computes the same sums in the same order: the last vectors must agree to the bit.
// Prints µs per stage (medians over 21 replays of a graph of 10 launches).
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

constexpr int C = 768, STAGES = 60, THREADS = 256, WARPS = THREADS / 32, MAX_ROWS = 24;

// ---------------------------------------------------------------------------------------------
// One stage's work for a block: rows [r0, r1) of y_out = tanh(W y_in / 8), a warp a row, W's rows in
// shared memory (ws: row r - r0 at ws + (r - r0) * C).
__device__ __forceinline__ void stage_rows(const float *ws, const float *y_in, float *y_out, int r0, int r1) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float x[C / 32];
#pragma unroll
    for (int i = 0; i < C / 32; i++) x[i] = __ldcg(y_in + lane + 32 * i);  // L2: written this launch
    for (int r = r0 + warp; r < r1; r += WARPS) {
        const float *w = ws + (size_t)(r - r0) * C;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < C / 32; i++) s = fmaf(w[lane + 32 * i], x[i], s);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) y_out[r] = tanhf(s);
    }
}

// ll: the stage's input and output carry their own readiness (NCCL's low-latency protocol): each
// value is a 64-bit word {tag, float}, stored in one relaxed 8-byte store, so a reader that sees the
// tag sees the value; no fence, no flag, no block barrier. Every warp polls the 768 inputs it needs.
__device__ __forceinline__ void st_ll(unsigned long long *p, float v, unsigned tag) {
    const unsigned long long w = ((unsigned long long)tag << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ unsigned long long ld_ll(const unsigned long long *p) {
    unsigned long long w;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
    return w;
}

// in_tag 0: the input is plain floats (y_0, written before the launch). The block polls: thread t
// waits for words t, t + 256, t + 512 and puts their values in shared memory (xs, double-buffered by
// the stage's parity so that one barrier a stage suffices); then a warp a row, as stage_rows.
__device__ __forceinline__ void stage_rows_ll(const float *ws, float *xs, const float *y0,
                                              const unsigned long long *y_in, unsigned in_tag,
                                              unsigned long long *y_out, unsigned out_tag, int r0, int r1) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    constexpr int PER = C / THREADS;
    if (in_tag == 0) {
#pragma unroll
        for (int i = 0; i < PER; i++) xs[threadIdx.x + THREADS * i] = __ldcg(y0 + threadIdx.x + THREADS * i);
    } else {
        unsigned long long w[PER];
#pragma unroll
        for (int i = 0; i < PER; i++) w[i] = ld_ll(y_in + threadIdx.x + THREADS * i);
        for (;;) {
            bool ready = true;
#pragma unroll
            for (int i = 0; i < PER; i++) ready = ready && (unsigned)(w[i] >> 32) == in_tag;
            if (ready) break;
#pragma unroll
            for (int i = 0; i < PER; i++)
                if ((unsigned)(w[i] >> 32) != in_tag) w[i] = ld_ll(y_in + threadIdx.x + THREADS * i);
        }
#pragma unroll
        for (int i = 0; i < PER; i++) xs[threadIdx.x + THREADS * i] = __uint_as_float((unsigned)w[i]);
    }
    __syncthreads();
    for (int r = r0 + warp; r < r1; r += WARPS) {
        const float *w = ws + (size_t)(r - r0) * C;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < C / 32; i++) s = fmaf(w[lane + 32 * i], xs[lane + 32 * i], s);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) st_ll(y_out + r, tanhf(s), out_tag);
    }
}

__device__ __forceinline__ void load_rows(float *ws, const float *W, int r0, int r1) {
    for (int i = threadIdx.x; i < (r1 - r0) * C; i += THREADS) ws[i] = W[(size_t)r0 * C + i];
    __syncthreads();
}

__device__ __forceinline__ void block_rows(int *r0, int *r1) {
    const int per = (C + gridDim.x - 1) / gridDim.x;
    *r0 = min(C, (int)blockIdx.x * per), *r1 = min(C, *r0 + per);
}

// ---------------------------------------------------------------------------------------------
// persistent: ys[s] for s = 1..STAGES from ys[0]; counts[s] counts the blocks done with stage s, and
// grows across launches (gen[0]: launches so far, read at the start, advanced by the last block out).
__device__ __forceinline__ int ld_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release(int *p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// WAIT false: a diagnostic, the stages' own work without any handoff (its results are not the chain's);
// ARRIVE false drops the barrier and the release arrival too: the GEMV rows alone.
template <bool WAIT, bool ARRIVE = true>
__global__ void __launch_bounds__(THREADS) persistent(const float *W, float *ys, int *counts, int *gen) {
    extern __shared__ float ws[];
    int r0, r1;
    block_rows(&r0, &r1);
    const int target = (gen[0] + 1) * (int)gridDim.x;
    load_rows(ws, W, r0, r1);
    for (int s = 1; s <= STAGES; s++) {
        if (WAIT && s > 1) {
            if (threadIdx.x == 0)
                while (ld_acquire(&counts[s - 1]) < target) {
                }
            __syncthreads();
        }
        stage_rows(ws, ys + (size_t)(s - 1) * C, ys + (size_t)s * C, r0, r1);
        if (!ARRIVE) continue;
        __syncthreads();  // the block's rows written before its arrival
        if (threadIdx.x == 0) red_release(&counts[s], 1);
    }
    if (threadIdx.x == 0 && atomicAdd(&counts[STAGES + 1], 1) == target - 1) gen[0] += 1;  // the last block out
}

// flags: flags[b] counts the stages block b has finished, over all launches (gen[0] launches so far)
__device__ __forceinline__ void st_release(int *p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__global__ void __launch_bounds__(THREADS) persistent_flags(const float *W, float *ys, int *flags, int *done,
                                                            int *gen) {
    extern __shared__ float ws[];
    int r0, r1;
    block_rows(&r0, &r1);
    const int base = gen[0] * STAGES;
    load_rows(ws, W, r0, r1);
    for (int s = 1; s <= STAGES; s++) {
        if (s > 1) {
            if (threadIdx.x < gridDim.x)
                while (ld_acquire(&flags[threadIdx.x]) < base + s - 1) {
                }
            __syncthreads();
        }
        stage_rows(ws, ys + (size_t)(s - 1) * C, ys + (size_t)s * C, r0, r1);
        __syncthreads();
        if (threadIdx.x == 0) st_release(&flags[blockIdx.x], base + s);
    }
    if (threadIdx.x == 0 && atomicAdd(done, 1) == (gen[0] + 1) * (int)gridDim.x - 1) gen[0] += 1;
}

// ll: y_s in lls[s - 1] as {tag, value} words, tags gen * STAGES + s (distinct across launches)
__global__ void __launch_bounds__(THREADS) persistent_ll(const float *W, const float *ys, unsigned long long *lls,
                                                         int *done, int *gen) {
    extern __shared__ float ws[];
    int r0, r1;
    block_rows(&r0, &r1);
    const unsigned base = (unsigned)gen[0] * STAGES;
    float *xs = ws + (size_t)(r1 - r0) * C;  // [2][C]
    load_rows(ws, W, r0, r1);
    for (int s = 1; s <= STAGES; s++)
        stage_rows_ll(ws, xs + (s & 1) * C, ys, s == 1 ? nullptr : lls + (size_t)(s - 2) * C, s == 1 ? 0u : base + s - 1, lls + (size_t)(s - 1) * C,
                      base + s, r0, r1);
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(done, 1) == ((int)base / STAGES + 1) * (int)gridDim.x - 1) gen[0] += 1;
}

// pdl / plain: stage s of the chain, a kernel.
template <bool PDL> __global__ void __launch_bounds__(THREADS) one_stage(const float *W, float *ys, int s) {
    extern __shared__ float ws[];
    int r0, r1;
    block_rows(&r0, &r1);
    if (PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    load_rows(ws, W, r0, r1);
    if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
    stage_rows(ws, ys + (size_t)(s - 1) * C, ys + (size_t)s * C, r0, r1);
}

// ---------------------------------------------------------------------------------------------
// Host
static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// A graph of `reps` launches of the chain, replayed 3 + 21 times; µs per stage.
template <typename F> static float time_chain(F launch_chain, cudaStream_t st, int reps) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < reps; i++) launch_chain();
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
        if (i >= 3) t.push_back(ms * 1000.f / (reps * STAGES));
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return median(t);
}

int main(int argc, char **argv) {
    const bool once = argc > 1 && !strcmp(argv[1], "once");  // compute-sanitizer: one launch of each, no timing
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    std::vector<float> hw((size_t)C * C), hy(C);
    srand(1);
    for (auto &e : hw) e = ((float)rand() / RAND_MAX * 2.f - 1.f) * 0.1f;
    for (auto &e : hy) e = (float)rand() / RAND_MAX * 2.f - 1.f;
    float *W, *ys;
    int *counts, *gen, *flags, *done, *gen_flags, *ll_done, *ll_gen;
    unsigned long long *lls;
    CK(cudaMalloc(&W, hw.size() * 4));
    CK(cudaMalloc(&ys, (size_t)(STAGES + 1) * C * 4));
    CK(cudaMalloc(&counts, (STAGES + 2) * 4));
    CK(cudaMalloc(&gen, 4));
    CK(cudaMalloc(&flags, THREADS * 4));
    CK(cudaMalloc(&done, 4));
    CK(cudaMalloc(&gen_flags, 4));
    CK(cudaMalloc(&ll_done, 4));
    CK(cudaMalloc(&ll_gen, 4));
    CK(cudaMalloc(&lls, (size_t)STAGES * C * 8));
    CK(cudaMemcpy(W, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ys, hy.data(), C * 4, cudaMemcpyHostToDevice));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int grids[] = {sms, sms / 2, sms / 4};
    printf("%d stages of a %d x %d GEMV (tanh), a warp a row, W's rows in shared memory; us per stage\n", STAGES,
           C, C);
    for (int grid : grids) {
        const int rows = (C + grid - 1) / grid;
        if (rows > MAX_ROWS) continue;
        const size_t smem = (size_t)rows * C * 4;
        CK(cudaFuncSetAttribute(persistent<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CK(cudaFuncSetAttribute(persistent<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CK(cudaFuncSetAttribute(persistent<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CK(cudaFuncSetAttribute(persistent_ll, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem + 2 * C * 4)));
        CK(cudaFuncSetAttribute(persistent_flags, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CK(cudaFuncSetAttribute(one_stage<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CK(cudaFuncSetAttribute(one_stage<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CK(cudaMemset(counts, 0, (STAGES + 2) * 4));
        CK(cudaMemset(gen, 0, 4));
        CK(cudaMemset(flags, 0, THREADS * 4));
        CK(cudaMemset(done, 0, 4));
        CK(cudaMemset(gen_flags, 0, 4));
        CK(cudaMemset(ll_done, 0, 4));
        CK(cudaMemset(ll_gen, 0, 4));
        CK(cudaMemset(lls, 0, (size_t)STAGES * C * 8));
        auto run_persistent = [&]() {
            void *args[] = {&W, &ys, &counts, &gen};
            CK(cudaLaunchCooperativeKernel((void *)persistent<true>, dim3(grid), dim3(THREADS), args, smem, st));
        };
        auto run_no_wait = [&]() {  // reads ys while other blocks write it: timed only, never checked
            void *args[] = {&W, &ys, &counts, &gen};
            CK(cudaLaunchCooperativeKernel((void *)persistent<false>, dim3(grid), dim3(THREADS), args, smem, st));
        };
        auto run_rows_only = [&]() {  // the GEMV rows alone: no barrier, no arrival
            void *args[] = {&W, &ys, &counts, &gen};
            CK(cudaLaunchCooperativeKernel((void *)persistent<false, false>, dim3(grid), dim3(THREADS), args, smem,
                                           st));
        };
        auto run_ll = [&]() {
            void *args[] = {&W, &ys, &lls, &ll_done, &ll_gen};
            CK(cudaLaunchCooperativeKernel((void *)persistent_ll, dim3(grid), dim3(THREADS), args, smem + 2 * C * 4, st));
        };
        auto run_flags = [&]() {
            void *args[] = {&W, &ys, &flags, &done, &gen_flags};
            CK(cudaLaunchCooperativeKernel((void *)persistent_flags, dim3(grid), dim3(THREADS), args, smem, st));
        };
        auto run_chain = [&](bool pdl) {
            for (int s = 1; s <= STAGES; s++) {
                cudaLaunchConfig_t cfg = {};
                cudaLaunchAttribute attr;
                attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attr.val.programmaticStreamSerializationAllowed = 1;
                cfg.gridDim = dim3(grid), cfg.blockDim = dim3(THREADS), cfg.dynamicSmemBytes = smem, cfg.stream = st;
                cfg.attrs = &attr, cfg.numAttrs = pdl ? 1 : 0;
                if (pdl)
                    CK(cudaLaunchKernelEx(&cfg, one_stage<true>, (const float *)W, ys, s));
                else
                    CK(cudaLaunchKernelEx(&cfg, one_stage<false>, (const float *)W, ys, s));
            }
        };
        // the three forms' last vectors, bit for bit
        std::vector<float> last[5];
        for (int f = 0; f < 5; f++) {
            CK(cudaMemset(ys + C, 0, (size_t)STAGES * C * 4));
            last[f].resize(C);
            if (f == 4) {  // ll: the values are the low halves of the last stage's words
                run_ll();
                CK(cudaStreamSynchronize(st));
                std::vector<unsigned long long> words(C);
                CK(cudaMemcpy(words.data(), lls + (size_t)(STAGES - 1) * C, C * 8, cudaMemcpyDeviceToHost));
                for (int i = 0; i < C; i++) {
                    const unsigned lo = (unsigned)words[i];
                    memcpy(&last[f][i], &lo, 4);
                }
                continue;
            }
            if (f == 0) run_persistent();
            else if (f == 3) run_flags();
            else run_chain(f == 1);
            CK(cudaStreamSynchronize(st));
            CK(cudaMemcpy(last[f].data(), ys + (size_t)STAGES * C, C * 4, cudaMemcpyDeviceToHost));
        }
        bool same = true;
        for (int f = 1; f < 5; f++) same = same && !memcmp(last[0].data(), last[f].data(), C * 4);
        double norm = 0;
        for (float v : last[0]) norm += (double)v * v;
        printf("%3d blocks (%2d rows each): forms agree to the bit: %s (|y_60| %.3f)\n", grid, rows,
               same ? "yes" : "NO", sqrt(norm));
        if (!same) return 2;
        if (once) continue;
        const float tp = time_chain(run_persistent, st, 10), tf = time_chain(run_flags, st, 10);
        const float tpdl = time_chain([&]() { run_chain(true); }, st, 10);
        const float tplain = time_chain([&]() { run_chain(false); }, st, 10);
        const float tn = time_chain(run_no_wait, st, 10), tr = time_chain(run_rows_only, st, 10);
        const float tll = time_chain(run_ll, st, 10);
        printf("    persistent %.2f us   flags %.2f us   ll %.2f us   pdl %.2f us   plain %.2f us\n", tp, tf, tll, tpdl,
               tplain);
        printf("    no handoff: %.2f us with the barrier and arrival, %.2f us the rows alone\n", tn, tr);
    }
    return 0;
}
