// Micro-benchmark of the device sampler, not a test (make test does not run it):
//   make build/gpu/tests/bench_sampling && build/gpu/tests/bench_sampling [B]
//
// sample_on_device (kernels/sampling.cu: each row split over S blocks, the last block of a row
// merging their candidates) at GPT-2's vocabulary, V = 50257, for B = 1, 8 and 64: greedy, top-k 40
// and top-k 256 (temperature 1, top_p 0.9), against the kernel it replaced: one 1024-thread block
// per row doing an argmax, a four-pass radix select over the whole row, a gather, a rank sort and
// the nucleus. That baseline is kept only here, as of commit f1d256f; this file is C, so it is
// compiled at run time with NVRTC (libnvrtc, opened with dlopen; without it the baseline column
// reads "-").
//
// Every case is validated before it is timed: both kernels' picks against the host sampler's
// (src/sampler.c) for the same draws; an expf ulp may flip a rare pick, more is a bug. Timing: each
// sample is one CUDA-graph launch of 20 back-to-back calls, 5 warm-up launches, then 25 launches
// back to back with an event between each two (no host gaps inside or between samples), median of
// the 25. The logits are not rotated: they sit in L2, as they do in a decode step, right after the
// LM head's matmul writes them.
//
// Prediction, H200, written before any measurement:
//   bytes: the logits once (201 KB a row: 0.2 MB at B = 1, 12.9 MB at B = 64), plus the candidates
//   written and read back through L2 (S x k x 8 B a row: 10 KB at k = 40, 31 KB at k = 256);
//   the old kernel reads each row 7 times at top-k (argmax, four histogram passes, gather twice).
//   new: B = 1 and 8: greedy ~3 us, top-k 40 ~6 us, top-k 256 ~9 us (latency: one chunk load,
//        two or three radix passes per selection, the fence and counter, a 256-term sequential
//        sum); B = 64 (1024 blocks, one wave): greedy ~5 us, top-k 40 ~8 us, top-k 256 ~12 us.
//   old: greedy ~5 us, top-k ~70 us at every B (one SM per row, so B is free until B > #SMs).
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if GPT2_CUDA
#include <cuda_runtime.h>
#include <nvrtc.h>

#include "sampler.h"
#include "sampling.h"

static void check(cudaError_t e, const char *call, int line) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "bench_sampling.c:%d: %s: %s\n", line, call, cudaGetErrorString(e));
    exit(1);
}
#define CK(x) check((x), #x, __LINE__)

enum { V = 50257, MAX_B = 64, NREP = 20, NSAMPLE = 25, NWARM = 5, OLD_THREADS = 1024 };

// ----------------------------------------------------------------------------
// The baseline: the previous sampler's kernel (kernels/sampling.cu at f1d256f), unchanged but for
// the constant it took from sampling.h and C linkage for the lookup by name.

static const char *kBaselineSource =
    "#include <cub/block/block_reduce.cuh>\n"
    "#include <cub/block/block_scan.cuh>\n"
    "\n"
    "constexpr int kMaxDeviceTopK = 256;\n"
    "\n"
    "constexpr int kThreads = 1024;\n"
    "\n"
    "// Order-preserving map of a float to uint32: larger float -> larger key.\n"
    "__device__ __forceinline__ unsigned int float_key(float f) {\n"
    "    unsigned int u = __float_as_uint(f);\n"
    "    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);\n"
    "}\n"
    "\n"
    "struct ArgMax {\n"
    "    float value;\n"
    "    int index;\n"
    "};\n"
    "\n"
    "struct ArgMaxOp {\n"
    "    __device__ __forceinline__ ArgMax operator()(const ArgMax &a, const ArgMax &b) const {\n"
    "        if (a.value != b.value) return a.value > b.value ? a : b;\n"
    "        return a.index < b.index ? a : b;  // the first maximum, as the host's strict '>' scan\n"
    "    }\n"
    "};\n"
    "\n"
    "extern \"C\" __global__ void __launch_bounds__(kThreads)\n"
    "    sample_kernel(const float *__restrict__ logits, int V, long long stride, float temperature, int top_k,\n"
    "                  float top_p, const float *__restrict__ uniforms, int *__restrict__ next) {\n"
    "    using Reduce = cub::BlockReduce<ArgMax, kThreads>;\n"
    "    using Scan = cub::BlockScan<int, kThreads>;\n"
    "    __shared__ union {\n"
    "        typename Reduce::TempStorage reduce;\n"
    "        typename Scan::TempStorage scan;\n"
    "    } tmp;\n"
    "    __shared__ unsigned int histogram[256];\n"
    "    __shared__ float cand_prob[kMaxDeviceTopK], sorted_prob[kMaxDeviceTopK];\n"
    "    __shared__ int cand_id[kMaxDeviceTopK], sorted_id[kMaxDeviceTopK];\n"
    "    __shared__ int n_cand;\n"
    "    __shared__ ArgMax best;\n"
    "    __shared__ unsigned int prefix_key;\n"
    "    __shared__ int remaining;\n"
    "\n"
    "    const float *row = logits + (long long)blockIdx.x * stride;\n"
    "    const int tid = threadIdx.x;\n"
    "\n"
    "    // --- the largest logit (and, for greedy, the answer)\n"
    "    ArgMax local = {-INFINITY, V};\n"
    "    for (int i = tid; i < V; i += kThreads) local = ArgMaxOp()(local, ArgMax{row[i], i});\n"
    "    ArgMax m = Reduce(tmp.reduce).Reduce(local, ArgMaxOp());\n"
    "    if (tid == 0) best = m;\n"
    "    __syncthreads();\n"
    "    if (temperature <= 0.0f) {\n"
    "        if (tid == 0) next[blockIdx.x] = best.index;\n"
    "        return;\n"
    "    }\n"
    "\n"
    "    // --- radix select: the key of the k-th largest logit, and how many equal to it are needed\n"
    "    if (tid == 0) prefix_key = 0, remaining = top_k;\n"
    "    unsigned int mask = 0;\n"
    "    for (int shift = 24; shift >= 0; shift -= 8) {\n"
    "        for (int b = tid; b < 256; b += kThreads) histogram[b] = 0;\n"
    "        __syncthreads();\n"
    "        unsigned int prefix = prefix_key;\n"
    "        // Logits crowd into a few digit values (the top digit is sign and exponent), so the lanes\n"
    "        // of a warp that share a bin add once, through their leader: 32x fewer colliding atomics.\n"
    "        for (int base = 0; base < V; base += kThreads) {\n"
    "            const int i = base + tid;\n"
    "            unsigned int key = i < V ? float_key(row[i]) : 0u;\n"
    "            unsigned int bin = i < V && (key & mask) == prefix ? (key >> shift) & 255u : 256u;\n"
    "            unsigned int peers = __match_any_sync(0xffffffffu, bin);\n"
    "            if (bin < 256u && (tid & 31) == __ffs(peers) - 1) atomicAdd(&histogram[bin], __popc(peers));\n"
    "        }\n"
    "        __syncthreads();\n"
    "        if (tid == 0) {\n"
    "            int need = remaining, digit = 255;\n"
    "            while (digit > 0 && (int)histogram[digit] < need) need -= histogram[digit--];\n"
    "            prefix_key = prefix | ((unsigned int)digit << shift);\n"
    "            remaining = need;  // elements of this digit still to take\n"
    "        }\n"
    "        mask |= 255u << shift;\n"
    "        __syncthreads();\n"
    "    }\n"
    "    const unsigned int threshold = prefix_key;\n"
    "    const int take_equal = remaining;\n"
    "\n"
    "    // --- gather: every key above the threshold, and the lowest-id take_equal keys equal to it.\n"
    "    // Contiguous chunks per thread keep ids ascending through the scan.\n"
    "    if (tid == 0) n_cand = 0;\n"
    "    __syncthreads();\n"
    "    const int chunk = (V + kThreads - 1) / kThreads;\n"
    "    const int lo = min(V, tid * chunk), hi = min(V, lo + chunk);\n"
    "    int n_equal = 0;\n"
    "    for (int i = lo; i < hi; i++) {\n"
    "        unsigned int key = float_key(row[i]);\n"
    "        if (key > threshold) cand_id[atomicAdd(&n_cand, 1)] = i;\n"
    "        n_equal += key == threshold;\n"
    "    }\n"
    "    int equal_before;\n"
    "    Scan(tmp.scan).ExclusiveSum(n_equal, equal_before);\n"
    "    __syncthreads();  // n_cand complete: the keys above the threshold\n"
    "    const int n_above = n_cand;\n"
    "    for (int i = lo; i < hi && equal_before < take_equal; i++)\n"
    "        if (float_key(row[i]) == threshold) cand_id[n_above + equal_before++] = i;\n"
    "    __syncthreads();\n"
    "\n"
    "    // --- probabilities, then rank by (p desc, id asc) among the k candidates\n"
    "    const int k = top_k;\n"
    "    const float max_logit = best.value;\n"
    "    for (int c = tid; c < k; c += kThreads) cand_prob[c] = expf((row[cand_id[c]] - max_logit) / temperature);\n"
    "    __syncthreads();\n"
    "    for (int c = tid; c < k; c += kThreads) {\n"
    "        float p = cand_prob[c];\n"
    "        int id = cand_id[c], rank = 0;\n"
    "        for (int j = 0; j < k; j++) rank += cand_prob[j] > p || (cand_prob[j] == p && cand_id[j] < id);\n"
    "        sorted_prob[rank] = p;\n"
    "        sorted_id[rank] = id;\n"
    "    }\n"
    "    __syncthreads();\n"
    "\n"
    "    // --- nucleus and the pick: sequential float sums, in the host's order\n"
    "    if (tid == 0) {\n"
    "        float sum = 0.0f;\n"
    "        for (int i = 0; i < k; i++) sum += sorted_prob[i];\n"
    "        float kept = 0.0f;\n"
    "        int n = 0;\n"
    "        while (n < k) {\n"
    "            kept += sorted_prob[n++];\n"
    "            if (kept >= top_p * sum) break;\n"
    "        }\n"
    "        float r = uniforms[blockIdx.x] * kept, acc = 0.0f;\n"
    "        int pick = sorted_id[n - 1];\n"
    "        for (int i = 0; i < n; i++) {\n"
    "            acc += sorted_prob[i];\n"
    "            if (r < acc) {\n"
    "                pick = sorted_id[i];\n"
    "                break;\n"
    "            }\n"
    "        }\n"
    "        next[blockIdx.x] = pick;\n"
    "    }\n"
    "}\n"    ;

// The baseline compiled for this GPU, or NULL (and why, on stderr).
static cudaKernel_t baseline_kernel(void) {
    const char *names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"};
    void *lib = NULL;
    for (int i = 0; i < 3 && !lib; i++) lib = dlopen(names[i], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "baseline skipped: no libnvrtc (%s)\n", dlerror());
        return NULL;
    }
    __typeof__(&nvrtcCreateProgram) create = (__typeof__(create))dlsym(lib, "nvrtcCreateProgram");
    __typeof__(&nvrtcCompileProgram) compile = (__typeof__(compile))dlsym(lib, "nvrtcCompileProgram");
    __typeof__(&nvrtcGetProgramLogSize) log_size = (__typeof__(log_size))dlsym(lib, "nvrtcGetProgramLogSize");
    __typeof__(&nvrtcGetProgramLog) get_log = (__typeof__(get_log))dlsym(lib, "nvrtcGetProgramLog");
    __typeof__(&nvrtcGetCUBINSize) cubin_size = (__typeof__(cubin_size))dlsym(lib, "nvrtcGetCUBINSize");
    __typeof__(&nvrtcGetCUBIN) get_cubin = (__typeof__(get_cubin))dlsym(lib, "nvrtcGetCUBIN");
    __typeof__(&nvrtcDestroyProgram) destroy = (__typeof__(destroy))dlsym(lib, "nvrtcDestroyProgram");
    if (!create || !compile || !log_size || !get_log || !cubin_size || !get_cubin || !destroy) {
        fprintf(stderr, "baseline skipped: libnvrtc lacks a function this needs\n");
        return NULL;
    }
    int dev = 0;
    struct cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    const char *cuda_home = getenv("CUDA_HOME") ? getenv("CUDA_HOME") : "/usr/local/cuda";
    char arch[64], inc[512], inc_cccl[512];
    snprintf(arch, sizeof(arch), "--gpu-architecture=sm_%d%d", prop.major, prop.minor);
    snprintf(inc, sizeof(inc), "-I%s/include", cuda_home);
    snprintf(inc_cccl, sizeof(inc_cccl), "-I%s/include/cccl", cuda_home);
    const char *opts[] = {arch, "-std=c++17", inc, inc_cccl};
    nvrtcProgram prog;
    cudaKernel_t kernel = NULL;
    if (create(&prog, kBaselineSource, "baseline_sampling.cu", 0, NULL, NULL) != NVRTC_SUCCESS) {
        fprintf(stderr, "baseline skipped: nvrtcCreateProgram failed\n");
        return NULL;
    }
    if (compile(prog, 4, opts) == NVRTC_SUCCESS) {
        size_t n = 0;
        cubin_size(prog, &n);
        char *cubin = malloc(n);
        get_cubin(prog, cubin);
        cudaLibrary_t library;
        CK(cudaLibraryLoadData(&library, cubin, NULL, NULL, 0, NULL, NULL, 0));
        CK(cudaLibraryGetKernel(&kernel, library, "sample_kernel"));
        free(cubin);
    } else {
        size_t n = 0;
        log_size(prog, &n);
        char *log = malloc(n + 1);
        get_log(prog, log);
        fprintf(stderr, "baseline skipped: NVRTC failed (CUDA_HOME=%s):\n%s\n", cuda_home, log);
        free(log);
    }
    destroy(&prog);
    return kernel;
}

// ----------------------------------------------------------------------------
// Cases

typedef struct {
    const char *name;
    float temperature;
    int top_k;
    float top_p;
} Setting;

typedef struct {
    Setting set;
    int B;
    float *logits, *u;  // device
    int *next;
    void *ws;
    size_t ws_bytes;
    cudaKernel_t baseline;
    cudaStream_t st;
} Case;

static void run_new(Case *c) {
    CK(sample_on_device(c->logits, V, V, c->B, c->set.temperature, c->set.top_k, c->set.top_p, c->u, c->next, NULL,
                        c->ws, c->ws_bytes, c->st));
}

static void run_old(Case *c) {
    int vocab = V;
    long long stride = V;
    void *args[] = {&c->logits, &vocab, &stride, &c->set.temperature, &c->set.top_k, &c->set.top_p, &c->u, &c->next};
    dim3 grid = {(unsigned)c->B, 1, 1}, block = {OLD_THREADS, 1, 1};
    CK(cudaLaunchKernel((const void *)c->baseline, grid, block, args, 0, c->st));
}

// Picks that differ from the host sampler's, after one call of op.
static int validate(Case *c, void (*op)(Case *), const float *logits, const float *u) {
    int next[MAX_B];
    CK(cudaMemset(c->next, 0xff, sizeof(next)));
    op(c);
    CK(cudaStreamSynchronize(c->st));
    CK(cudaMemcpy(next, c->next, c->B * sizeof(int), cudaMemcpyDeviceToHost));
    Sampler host;
    sampler_create(&host, V, c->set.temperature, c->set.top_k, c->set.top_p, 1);
    int bad = 0;
    for (int b = 0; b < c->B; b++) bad += next[b] != sampler_pick(&host, logits + (size_t)b * V, u[b]);
    sampler_free(&host);
    return bad;
}

static int ascending(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Median microseconds of one call: a graph of NREP calls, launched NSAMPLE times back to back
// with an event between each two, so that the GPU never waits for the host between samples.
static double time_us(Case *c, void (*op)(Case *)) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < NREP; i++) op(c);
    CK(cudaStreamEndCapture(c->st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t marks[NSAMPLE + 1];
    for (int s = 0; s <= NSAMPLE; s++) CK(cudaEventCreate(&marks[s]));
    for (int i = 0; i < NWARM; i++) CK(cudaGraphLaunch(exec, c->st));
    CK(cudaEventRecord(marks[0], c->st));
    for (int s = 1; s <= NSAMPLE; s++) {
        CK(cudaGraphLaunch(exec, c->st));
        CK(cudaEventRecord(marks[s], c->st));
    }
    CK(cudaEventSynchronize(marks[NSAMPLE]));
    double us[NSAMPLE];
    for (int s = 0; s < NSAMPLE; s++) {
        float ms;
        CK(cudaEventElapsedTime(&ms, marks[s], marks[s + 1]));
        us[s] = 1e3 * ms / NREP;
    }
    qsort(us, NSAMPLE, sizeof(double), ascending);
    for (int s = 0; s <= NSAMPLE; s++) CK(cudaEventDestroy(marks[s]));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return us[NSAMPLE / 2];
}

// Logits shaped roughly like a language model's: a bell of width ~3 (a sum of four uniforms).
static void fill_logits(float *logits, size_t n, uint64_t seed) {
    Sampler rng = {.rng_state = seed};
    for (size_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int j = 0; j < 4; j++) s += sampler_draw(&rng);
        logits[i] = 3.5f * (s - 2.0f);
    }
}
#endif

int main(int argc, char **argv) {
#if !GPT2_CUDA
    (void)argc, (void)argv;
    printf("bench_sampling: needs a GPU build (GPU=1)\n");
    return 0;
#else
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("bench_sampling: no GPU\n");
        return 0;
    }
    const int only_B = argc > 1 ? atoi(argv[1]) : 0;
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs; V = %d; us per call, median of %d graph launches of %d calls\n", prop.name,
           prop.multiProcessorCount, V, NSAMPLE, NREP);

    Case c = {.ws_bytes = sampling_workspace_size(MAX_B, V), .baseline = baseline_kernel()};
    float *logits = malloc((size_t)MAX_B * V * sizeof(float)), u[MAX_B];
    fill_logits(logits, (size_t)MAX_B * V, 42);
    Sampler draws = {.rng_state = 7};
    for (int b = 0; b < MAX_B; b++) u[b] = sampler_draw(&draws);
    CK(cudaMalloc((void **)&c.logits, (size_t)MAX_B * V * sizeof(float)));
    CK(cudaMalloc((void **)&c.u, sizeof(u)));
    CK(cudaMalloc((void **)&c.next, MAX_B * sizeof(int)));
    CK(cudaMalloc(&c.ws, c.ws_bytes));
    CK(cudaMemset(c.ws, 0, c.ws_bytes));  // once, as sampling.h asks
    CK(cudaMemcpy(c.logits, logits, (size_t)MAX_B * V * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.u, u, sizeof(u), cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&c.st, cudaStreamNonBlocking));

    const Setting settings[] = {
        {"greedy", 0.0f, 0, 1.0f}, {"top-k 40", 1.0f, 40, 0.9f}, {"top-k 256", 1.0f, 256, 0.9f}};
    const int batches[] = {1, 8, 64};
    for (int i = 0; i < 3; i++) {
        if (only_B && only_B != batches[i]) continue;
        for (int j = 0; j < 3; j++) {
            c.B = batches[i];
            c.set = settings[j];
            const int bad_new = validate(&c, run_new, logits, u);
            const int bad_old = c.baseline ? validate(&c, run_old, logits, u) : 0;
            const double t_new = time_us(&c, run_new), t_old = c.baseline ? time_us(&c, run_old) : 0.0;
            char old_col[32] = "      -", speedup[32] = "    -";
            if (c.baseline) {
                snprintf(old_col, sizeof(old_col), "%7.2f", t_old);
                snprintf(speedup, sizeof(speedup), "%5.1f", t_old / t_new);
            }
            printf("B=%-3d %-9s  new %7.2f us  old %s us  x%s | %6.0f GB/s of logits | host picks differ: new %d, "
                   "old %d of %d %s\n",
                   c.B, c.set.name, t_new, old_col, speedup, c.B * (double)V * sizeof(float) / (t_new * 1e3),
                   bad_new, bad_old, c.B, bad_new > 1 || bad_old > 1 ? "MISMATCH" : "ok");
            fflush(stdout);
        }
    }
    CK(cudaFree(c.logits));
    CK(cudaFree(c.u));
    CK(cudaFree(c.next));
    CK(cudaFree(c.ws));
    CK(cudaStreamDestroy(c.st));
    free(logits);
    return 0;
#endif
}
