// The GPU side of ./gpt2 bench (see bench_gpu.h): device facts, copy bandwidth, event timing, and
// the --kernels micro-benchmarks.
//
// --kernels puts each fused kernel beside the unfused ops the reference path runs in its place
// (kernels/ops_reference.cu), on the same inputs:
//   ln_linear_gelu   fused_ln_linear(ACT_GELU)  vs  layernorm_forward -> cuBLAS (matmul_nt, fp32 out)
//                                                    -> bias_add -> gelu_forward
//   linear_residual  linear_residual            vs  cuBLAS (matmul_nt) -> residual_add_bias
//   attention        fused_attention            vs  cuBLAS strided-batched Q K^T -> softmax_causal
//                                                    -> cuBLAS P V -> heads_to_rows
// Every case is validated first (rel_l2 of the fused output against the unfused one, fp32 <= 1e-4,
// bf16 <= 1e-2). Timing: the calls are captured into a CUDA graph (so launch gaps stay out), the
// graph replayed between two events after warm-up replays, and the median replay divided by the
// calls in it. The matmul cases rotate through enough copies of the weights to cover 256 MiB, more
// than any L2, so M = 1 reads W from memory as a decode step does; attention's caches are not
// rotated (one layer's cache, as in a step).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "bench_gpu.h"
#include "cuda_check.h"
#include "fused_attention.h"
#include "fused_ln_linear.h"
#include "kernel_util.h"
#include "linear_residual.h"
#include "reference_kernels.h"

// ----------------------------------------------------------------------------
// Device, bandwidth, timer

extern "C" int bench_gpu_device(char *name, size_t name_len, double *mem_gib, Error *err) {
    cudaDeviceProp p;
    CUDA_TRY(cudaGetDeviceProperties(&p, 0));
    snprintf(name, name_len, "%s", p.name);
    *mem_gib = p.totalGlobalMem / 1073741824.0;
    return 0;
}

static double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

extern "C" int bench_gpu_copy_bandwidth(size_t bytes, int runs, double *gbps, Error *err) {
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = -1;
    std::vector<double> ms;
    if (gpu_alloc(&a, bytes, "the bandwidth test", err) || gpu_alloc(&b, bytes, "the bandwidth test", err)) goto done;
#define TRY(call)                                                                 \
    do {                                                                          \
        cudaError_t e_ = (call);                                                  \
        if (e_ != cudaSuccess) {                                                  \
            cuda_fail(err, e_, #call, __FILE__, __LINE__);                        \
            goto done;                                                            \
        }                                                                         \
    } while (0)
    TRY(cudaMemset(a, 1, bytes));
    TRY(cudaEventCreate(&e0));
    TRY(cudaEventCreate(&e1));
    TRY(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));  // warm-up
    for (int r = 0; r < runs; r++) {
        TRY(cudaEventRecord(e0, 0));
        TRY(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
        TRY(cudaEventRecord(e1, 0));
        TRY(cudaEventSynchronize(e1));
        float t;
        TRY(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
#undef TRY
    *gbps = 2.0 * bytes / (median_of(ms) * 1e-3) / 1e9;
    rc = 0;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    return rc;
}

struct BenchTimer {
    cudaEvent_t start, stop;
};

extern "C" BenchTimer *bench_timer_create(Error *err) {
    BenchTimer *t = (BenchTimer *)xcalloc(1, sizeof(BenchTimer));
    cudaError_t e = cudaEventCreate(&t->start);
    if (e == cudaSuccess) e = cudaEventCreate(&t->stop);
    if (e != cudaSuccess) {
        cuda_fail(err, e, "cudaEventCreate", __FILE__, __LINE__);
        free(t);
        return NULL;
    }
    return t;
}

extern "C" int bench_timer_start(BenchTimer *t, Error *err) {
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaEventRecord(t->start, 0));
    return 0;
}

extern "C" int bench_timer_stop(BenchTimer *t, double *ms, Error *err) {
    CUDA_TRY(cudaDeviceSynchronize());
    CUDA_TRY(cudaEventRecord(t->stop, 0));
    CUDA_TRY(cudaEventSynchronize(t->stop));
    float f;
    CUDA_TRY(cudaEventElapsedTime(&f, t->start, t->stop));
    *ms = f;
    return 0;
}

extern "C" void bench_timer_free(BenchTimer *t) {
    if (!t) return;
    cudaEventDestroy(t->start);
    cudaEventDestroy(t->stop);
    free(t);
}

// ----------------------------------------------------------------------------
// --kernels: shared pieces

namespace {

// Uniform values offset + scale * [-1, 1) from a hash of (seed, index): any size, no host traffic.
template <typename E>
__global__ void fill_kernel(E *p, size_t n, uint64_t seed, float offset, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u = (float)((z >> 40) * (1.0 / 8388608.0) - 1.0);
        p[i] = from_f32<E>(offset + scale * u);
    }
}

int fill(void *p, size_t n, DType dt, uint64_t seed, float offset, float scale, cudaStream_t st, Error *err) {
    DISPATCH_DTYPE(dt, E, fill_kernel<E><<<grid_for(n, 256), 256, 0, st>>>((E *)p, n, seed, offset, scale));
    CUDA_TRY(cudaGetLastError());
    return 0;
}

// ||a - b|| / ||b|| over n elements of dtype dt (device buffers); a NaN or Inf in a gives Inf.
// With base (same dtype) both are taken relative to it: (a - base) against (b - base).
int rel_l2_dev(const void *a, const void *b, const void *base, size_t n, DType dt, double *out, Error *err) {
    size_t es = dtype_size(dt);
    std::vector<char> ha(n * es), hb(n * es), hbase(base ? n * es : 0);
    CUDA_TRY(cudaMemcpy(ha.data(), a, n * es, cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(hb.data(), b, n * es, cudaMemcpyDeviceToHost));
    if (base) CUDA_TRY(cudaMemcpy(hbase.data(), base, n * es, cudaMemcpyDeviceToHost));
    auto get = [&](const std::vector<char> &v, size_t i) -> double {
        return dt == DTYPE_BF16 ? bf16_to_float(((const uint16_t *)v.data())[i]) : ((const float *)v.data())[i];
    };
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        double x = get(ha, i), y = get(hb, i), z = base ? get(hbase, i) : 0.0;
        if (!isfinite(x)) {
            *out = INFINITY;
            return 0;
        }
        d2 += (x - y) * (x - y);
        r2 += (y - z) * (y - z);
    }
    *out = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
    return 0;
}

// What every case shares, released however bench_gpu_kernels returns (it is passed by reference only).
struct Ctx {
    cudaStream_t st = NULL;
    cublasHandle_t cublas = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    void *cublas_ws = NULL;
    int quick = 0;
    ~Ctx() {
        if (cublas) cublasDestroy(cublas);
        if (cublas_ws) cudaFree(cublas_ws);
        if (e0) cudaEventDestroy(e0);
        if (e1) cudaEventDestroy(e1);
        if (st) cudaStreamDestroy(st);
    }
};

// A captured graph and its executable, destroyed however time_graph returns.
struct Graph {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    ~Graph() {
        if (exec) cudaGraphExecDestroy(exec);
        if (graph) cudaGraphDestroy(graph);
    }
};

// Median microseconds per call of op(i), i = 0..ncalls-1, captured as one graph.
template <typename Op>
int time_graph(Ctx &c, int ncalls, Op op, double *us, Error *err) {
    for (int i = 0; i < ncalls; i++)  // eager first: lazy initialisation stays out of the capture
        if (op(i)) return -1;
    CUDA_TRY(cudaStreamSynchronize(c.st));
    Graph g;
    CUDA_TRY(cudaStreamBeginCapture(c.st, cudaStreamCaptureModeThreadLocal));
    int rc = 0;
    for (int i = 0; i < ncalls && rc == 0; i++) rc = op(i);
    cudaError_t ce = cudaStreamEndCapture(c.st, &g.graph);
    if (rc) return -1;
    CUDA_TRY(ce);
    CUDA_TRY(cudaGraphInstantiate(&g.exec, g.graph, 0));
    int warm = 3, samples = c.quick ? 7 : 15;
    std::vector<double> t;
    for (int s = 0; s < warm + samples; s++) {
        CUDA_TRY(cudaEventRecord(c.e0, c.st));
        CUDA_TRY(cudaGraphLaunch(g.exec, c.st));
        CUDA_TRY(cudaEventRecord(c.e1, c.st));
        CUDA_TRY(cudaEventSynchronize(c.e1));
        float ms;
        CUDA_TRY(cudaEventElapsedTime(&ms, c.e0, c.e1));
        if (s >= warm) t.push_back(ms * 1e3 / ncalls);
    }
    *us = median_of(t);
    return 0;
}

// Device buffers freed at the end of a case, whatever happens.
struct Buffers {
    std::vector<void *> p;
    void *get(size_t bytes, Error *err) {
        void *q = NULL;
        if (gpu_alloc(&q, bytes, "a --kernels buffer", err)) return NULL;
        p.push_back(q);
        return q;
    }
    ~Buffers() {
        for (void *q : p) cudaFree(q);
    }
};

#define GET(ptr, type, bytes)                               \
    do {                                                    \
        if (!(ptr = (type)buf.get((bytes), err))) return -1; \
    } while (0)

// ----------------------------------------------------------------------------
// Linear layers: LayerNorm + Linear + GELU, Linear + residual

int bench_linear(Ctx &c, int op, DType dt, int M, int K, int N, BenchKernelRow *r, Error *err) {
    const int gelu = op == 0;
    const size_t es = dtype_size(dt), wbytes = (size_t)N * K * es;
    int copies = (int)std::min<size_t>(64, std::max<size_t>(1, (((size_t)256 << 20) + wbytes - 1) / wbytes));
    Buffers buf;
    std::vector<void *> W(copies);
    std::vector<float *> s(copies), bf(copies);
    float *x32, *gamma, *beta, *bias, *scratch, *res0 = NULL, *res_f = NULL, *res_u = NULL;
    void *xdt = NULL, *ln = NULL, *y_f = NULL, *y_u = NULL;
    GET(x32, float *, (size_t)M * K * 4);
    GET(gamma, float *, K * 4);
    GET(beta, float *, K * 4);
    GET(bias, float *, N * 4);
    GET(scratch, float *, (size_t)M * N * 4);
    if (fill(x32, (size_t)M * K, DTYPE_F32, 1, 0.3f, 2.0f, c.st, err) ||
        fill(gamma, K, DTYPE_F32, 2, 1.0f, 0.2f, c.st, err) || fill(beta, K, DTYPE_F32, 3, 0.0f, 0.2f, c.st, err) ||
        fill(bias, N, DTYPE_F32, 4, 0.0f, 0.2f, c.st, err))
        return -1;
    for (int i = 0; i < copies; i++) {
        GET(W[i], void *, wbytes);
        if (fill(W[i], (size_t)N * K, dt, 100 + i, 0.0f, 0.05f, c.st, err)) return -1;
    }
    if (gelu) {
        GET(ln, void *, (size_t)M * K * es);
        GET(y_f, void *, (size_t)M * N * es);
        GET(y_u, void *, (size_t)M * N * es);
        for (int i = 0; i < copies; i++) {
            GET(s[i], float *, N * 4);
            GET(bf[i], float *, N * 4);
            CUDA_TRY(ln_fold(s[i], bf[i], W[i], gamma, beta, bias, N, K, dt, c.st));
        }
    } else {
        GET(xdt, void *, (size_t)M * K * es);
        GET(res0, float *, (size_t)M * N * 4);
        GET(res_f, float *, (size_t)M * N * 4);
        GET(res_u, float *, (size_t)M * N * 4);
        if (fill(xdt, (size_t)M * K, dt, 5, 0.0f, 1.0f, c.st, err) ||
            fill(res0, (size_t)M * N, DTYPE_F32, 6, 0.0f, 1.0f, c.st, err))
            return -1;
        CUDA_TRY(cudaMemcpyAsync(res_f, res0, (size_t)M * N * 4, cudaMemcpyDeviceToDevice, c.st));
        CUDA_TRY(cudaMemcpyAsync(res_u, res0, (size_t)M * N * 4, cudaMemcpyDeviceToDevice, c.st));
    }

    auto fused = [&](int i) -> int {
        int w = i % copies;
        if (gelu)
            CUDA_TRY((cudaError_t)fused_ln_linear(x32, gamma, W[w], dt, s[w], bf[w], y_f, dt, M, N, K, ACT_GELU, NULL,
                                                  c.st));
        else CUDA_TRY((cudaError_t)linear_residual(xdt, W[w], dt, bias, res_f, M, N, K, c.st));
        return 0;
    };
    auto unfused = [&](int i) -> int {
        int w = i % copies;
        if (gelu) {
            CUDA_TRY(layernorm_forward(ln, x32, gamma, beta, M, K, dt, c.st));
            CUBLAS_TRY(matmul_nt(c.cublas, scratch, N, ln, W[w], M, N, K, dt));
            CUDA_TRY(bias_add(scratch, bias, M, N, c.st));
            CUDA_TRY(gelu_forward(y_u, scratch, (size_t)M * N, dt, c.st));
        } else {
            CUBLAS_TRY(matmul_nt(c.cublas, scratch, N, xdt, W[w], M, N, K, dt));
            CUDA_TRY(residual_add_bias(res_u, scratch, bias, M, N, c.st));
        }
        return 0;
    };

    // Validate on fresh outputs (poisoned, so an unwritten element shows), then time.
    if (gelu) {
        CUDA_TRY(cudaMemsetAsync(y_f, 0xff, (size_t)M * N * es, c.st));
        CUDA_TRY(cudaMemsetAsync(y_u, 0xff, (size_t)M * N * es, c.st));
    }
    if (fused(0) || unfused(0)) return -1;
    CUDA_TRY(cudaStreamSynchronize(c.st));
    CUDA_TRY(cudaGetLastError());
    if (gelu) {
        if (rel_l2_dev(y_f, y_u, NULL, (size_t)M * N, dt, &r->rel_l2, err)) return -1;
    } else {
        // Compare what each added to the residual: (res_f - res0) against (res_u - res0).
        if (rel_l2_dev(res_f, res_u, res0, (size_t)M * N, DTYPE_F32, &r->rel_l2, err)) return -1;
    }
    r->tol = dt == DTYPE_BF16 ? 1e-2 : 1e-4;
    r->ok = r->rel_l2 <= r->tol;
    if (r->ok) {
        int ncalls = std::max(copies, 8);
        if (time_graph(c, ncalls, fused, &r->fused_us, err) || time_graph(c, ncalls, unfused, &r->unfused_us, err))
            return -1;
        double bytes = (double)wbytes + N * 4.0 * (gelu ? 3 : 1) +
                       (gelu ? (double)M * K * 4 + (double)M * N * es : (double)M * K * es + 2.0 * M * N * 4);
        r->fused_gbps = bytes / (r->fused_us * 1e-6) / 1e9;
        r->fused_tflops = 2.0 * M * N * K / (r->fused_us * 1e-6) / 1e12;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Attention over the cache: B sequences of T new queries at positions L - T .. L - 1

int bench_attention(Ctx &c, DType dt, int B, int T, int L, BenchKernelRow *r, Error *err) {
    const int NH = 12, HS = 64, C = NH * HS, max_seq = 1024, pos = L - T, BNH = B * NH;
    const size_t es = dtype_size(dt), M = (size_t)B * T, kv = (size_t)BNH * max_seq * HS;
    Buffers buf;
    void *q_rows, *q_heads, *k, *v, *out_f, *out_u, *probs, *ws;
    float *att, *scratch;
    GET(q_rows, void *, M * C * es);
    GET(q_heads, void *, M * C * es);
    GET(k, void *, kv * es);
    GET(v, void *, kv * es);
    GET(out_f, void *, M * C * es);
    GET(out_u, void *, M * C * es);
    GET(att, float *, (size_t)BNH * T * L * 4);
    GET(scratch, float *, M * C * 4);
    if (dt == DTYPE_F32) probs = att;
    else GET(probs, void *, (size_t)BNH * T * L * es);
    size_t ws_bytes = fused_attention_workspace_size(B, NH, HS, max_seq);
    GET(ws, void *, ws_bytes);
    CUDA_TRY(cudaMemsetAsync(ws, 0, ws_bytes, c.st));
    // Scores of a realistic spread: q, k ~ U(-1, 1) * 0.8 gives q.k / 8 of std ~ 0.5.
    if (fill(k, kv, dt, 11, 0.0f, 0.8f, c.st, err) || fill(v, kv, dt, 12, 0.0f, 1.0f, c.st, err) ||
        fill(q_rows, M * C, dt, 13, 0.0f, 0.8f, c.st, err))
        return -1;
    // The reference's q layout [B, NH, T, HS] from the same values: one strided copy per (b, h).
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            CUDA_TRY(cudaMemcpy2DAsync((char *)q_heads + (((size_t)b * NH + h) * T) * HS * es, HS * es,
                                       (const char *)q_rows + ((size_t)b * T * C + h * HS) * es, C * es, HS * es, T,
                                       cudaMemcpyDeviceToDevice, c.st));

    const float scale = 1.0f / sqrtf((float)HS);
    const long long cache_stride = (long long)max_seq * HS;
    auto fused = [&](int) -> int {
        CUDA_TRY((cudaError_t)fused_attention(q_rows, k, v, out_f, dt, B, T, pos, NULL, NH, HS, max_seq, ws, ws_bytes, c.st));
        return 0;
    };
    auto unfused = [&](int) -> int {  // ops_reference.cu's ref_attention, step for step
        CUBLAS_TRY(matmul_strided_batched(c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, L, T, HS, k, HS, cache_stride, q_heads,
                                          HS, (long long)T * HS, att, L, (long long)T * L, BNH, dt));
        CUDA_TRY(softmax_causal(probs, att, BNH, T, L, pos, scale, dt, c.st));
        CUBLAS_TRY(matmul_strided_batched(c.cublas, CUBLAS_OP_N, CUBLAS_OP_N, HS, T, L, v, HS, cache_stride, probs, L,
                                          (long long)T * L, scratch, HS, (long long)T * HS, BNH, dt));
        CUDA_TRY(heads_to_rows(out_u, scratch, B, T, NH, HS, dt, c.st));
        return 0;
    };
    CUDA_TRY(cudaMemsetAsync(out_f, 0xff, M * C * es, c.st));
    CUDA_TRY(cudaMemsetAsync(out_u, 0xff, M * C * es, c.st));
    if (fused(0) || unfused(0)) return -1;
    CUDA_TRY(cudaStreamSynchronize(c.st));
    CUDA_TRY(cudaGetLastError());
    if (rel_l2_dev(out_f, out_u, NULL, M * C, dt, &r->rel_l2, err)) return -1;
    r->tol = dt == DTYPE_BF16 ? 1e-2 : 1e-4;
    r->ok = r->rel_l2 <= r->tol;
    if (r->ok) {
        if (time_graph(c, 10, fused, &r->fused_us, err) || time_graph(c, 10, unfused, &r->unfused_us, err)) return -1;
        double pairs = 0;  // query-key pairs the causal mask keeps
        for (int t = 0; t < T; t++) pairs += pos + t + 1;
        pairs *= BNH;
        double bytes = (2.0 * M * C + 2.0 * BNH * L * HS) * es;
        r->fused_gbps = bytes / (r->fused_us * 1e-6) / 1e9;
        r->fused_tflops = 4.0 * HS * pairs / (r->fused_us * 1e-6) / 1e12;
    }
    return 0;
}

}  // namespace

// ----------------------------------------------------------------------------

extern "C" int bench_gpu_kernels(int quick, BenchKernelRow **rows_out, int *nrows, Error *err) {
    Ctx c;
    c.quick = quick;
    CUDA_TRY(cudaSetDevice(0));
    CUDA_TRY(cudaStreamCreateWithFlags(&c.st, cudaStreamNonBlocking));
    CUDA_TRY(cudaEventCreate(&c.e0));
    CUDA_TRY(cudaEventCreate(&c.e1));
    CUBLAS_TRY(cublasCreate(&c.cublas));
    CUBLAS_TRY(cublasSetStream(c.cublas, c.st));
    CUBLAS_TRY(cublasSetMathMode(c.cublas, CUBLAS_DEFAULT_MATH));  // fp32 stays fp32, as in the engine
    // A workspace of our own, so that cuBLAS allocates nothing while a graph is being captured.
    if (gpu_alloc(&c.cublas_ws, (size_t)64 << 20, "the cuBLAS workspace", err)) return -1;
    CUBLAS_TRY(cublasSetWorkspace(c.cublas, c.cublas_ws, (size_t)64 << 20));

    struct Case {
        int kind;  // 0 ln_linear_gelu, 1 linear_residual, 2 attention
        int a, b, d;  // M K N, or B T L
    };
    std::vector<Case> cases;
    const int Ms_full[] = {1, 16, 64, 512, 4096}, Ms_quick[] = {1, 64, 4096};
    const int *Ms = quick ? Ms_quick : Ms_full, nM = quick ? 3 : 5;
    const int lin[2][2] = {{768, 3072}, {1024, 4096}};       // LN + Linear + GELU: K -> N
    const int proj[2][2] = {{768, 768}, {3072, 768}};        // Linear + residual (124M's projections)
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < nM; i++) cases.push_back({0, Ms[i], lin[s][0], lin[s][1]});
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < nM; i++) cases.push_back({1, Ms[i], proj[s][0], proj[s][1]});
    cases.push_back({2, 1, 1024, 1024});
    cases.push_back({2, 8, 1024, 1024});
    const int dB_full[] = {1, 8, 64}, dL_full[] = {64, 272, 1024}, dB_quick[] = {1, 64}, dL_quick[] = {272, 1024};
    for (int i = 0; i < (quick ? 2 : 3); i++)
        for (int j = 0; j < (quick ? 2 : 3); j++)
            cases.push_back({2, quick ? dB_quick[i] : dB_full[i], 1, quick ? dL_quick[j] : dL_full[j]});

    const DType dts[2] = {DTYPE_F32, DTYPE_BF16};
    int n = (int)cases.size() * 2, k = 0;
    BenchKernelRow *rows = (BenchKernelRow *)xcalloc((size_t)n, sizeof(BenchKernelRow));
    int rc = 0;
    for (int di = 0; di < 2 && rc == 0; di++)
        for (size_t i = 0; i < cases.size() && rc == 0; i++, k++) {
            const Case &cs = cases[i];
            BenchKernelRow *r = &rows[k];
            r->dtype = dts[di];
            if (cs.kind < 2) {
                snprintf(r->op, sizeof(r->op), "%s", cs.kind == 0 ? "ln_linear_gelu" : "linear_residual");
                snprintf(r->shape, sizeof(r->shape), "M=%d K=%d N=%d", cs.a, cs.b, cs.d);
                r->M = cs.a, r->K = cs.b, r->N = cs.d;
            } else {
                snprintf(r->op, sizeof(r->op), "attention");
                snprintf(r->shape, sizeof(r->shape), "%s B=%d T=%d L=%d", cs.b > 1 ? "prefill" : "decode", cs.a, cs.b,
                         cs.d);
                r->B = cs.a, r->T = cs.b, r->L = cs.d;
            }
            fprintf(stderr, "bench --kernels [%d/%d] %s %s %s\n", k + 1, n, r->op, dtype_name(r->dtype), r->shape);
            rc = cs.kind < 2 ? bench_linear(c, cs.kind, dts[di], cs.a, cs.b, cs.d, r, err)
                             : bench_attention(c, dts[di], cs.a, cs.b, cs.d, r, err);
        }
    if (rc) {
        free(rows);
        return -1;
    }
    *rows_out = rows;
    *nrows = k;
    return 0;
}
