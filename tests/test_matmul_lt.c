// Tests of kernels/matmul_lt.h, the cuBLASLt products with their epilogue, against the same products
// through the reference table's separate steps (matmul_lt_unfused: cublasGemmEx into fp32, then
// bias_add, gelu_forward or residual_add_bias) on the same device inputs, fresh random data every
// run (the seed is printed; GPT2_TEST_SEED repeats one).
//
// Every epilogue in fp32 and bf16 at M in {5, 17, 64, 100, 1024, 4097} and GPT-2's shapes (qkv
// 768 -> 2304, projections 768 -> 768 and 3072 -> 768, fc 768 -> 3072, logits 768 -> 50257) plus
// awkward ones (K = 100, N = 1000), every other M with large-magnitude data (x ~ 300, residual ~ 500,
// bias ~ 10); then buffers off their 256-byte alignment (a layer's weights inside one allocation
// for odd widths), the plan cache (a repeated call builds no plan; more shapes than it holds evict
// the least recently used, and an evicted shape comes back right), calls captured in a CUDA graph
// (their plans built inside the capture, as a decode graph's first step builds them) replayed
// after their memset nodes became kernels (graph_memsets.h, tested first on nodes of every kind),
// the timing of large products' candidates (tuning), and bad arguments; the logits' shape also
// with padded output rows (ldy > N: only the N columns written).
//
// Tolerance: rel_l2 = |lt - unfused| / |unfused| over the output <= 1e-5 fp32, 1e-2 bf16 (both sides
// multiply the same bf16 operands in fp32 and add the same bias, bf16 values, widened on the unfused
// side; bf16 outputs round once; cuBLASLt's GELU epilogue, whichever GELU it is, stays within half
// a bf16 ulp of the tanh form), plus max |err| <= 50 *
// tol * rms(unfused) against a single bad element. Outputs are poisoned (NaN) first: every element
// must be written. The residual epilogue is judged on what it added (y - r0; r0 itself would hide
// errors), allowing for the fp32 rounding of r0 + delta on each side.
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "common.h"

#if GPT2_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gemm_rows.h"
#include "gemm_tiles.h"
#include "graph_memsets.h"
#include "logits_rows.h"
#include "matmul_lt.h"

static MatmulLt *lt;
static cublasHandle_t cublas;
static cudaStream_t stream;
static int small;  // GPT2_TEST_SMALL: fewer and smaller cases (compute-sanitizer runs)

static const char *epilogue_name[] = {"none", "bias", "bias+residual", "bias+gelu"};

// ----------------------------------------------------------------------------
// Data and device buffers

static uint64_t seed;
// Uniform in [-scale, scale): an LCG's top 24 bits (fast enough for the 38 M weights of the logits).
static void fill(float *a, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        a[i] = (float)(scale * ((double)(seed >> 40) / 8388608.0 - 1.0));
    }
}

static int cuda_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    printf("FAIL cuda: %s: %s\n", what, cudaGetErrorString(e));
    test_failures++;
    return 0;
}

// A device buffer of `bytes` starting `offset` bytes past a 256-byte boundary; *base is what to free.
static void *dev_buf(size_t bytes, size_t offset, void **base) {
    if (!cuda_ok(cudaMalloc(base, bytes + offset + 1), "cudaMalloc")) exit(1);
    return (char *)*base + offset;
}

// n floats from the host into p as dt (bf16: rounded to nearest even), in stream order. A copy
// from pageable memory has read its source when it returns, so b can go at once.
static void upload(void *p, const float *h, size_t n, DType dt) {
    if (dt == DTYPE_F32) {
        cuda_ok(cudaMemcpyAsync(p, h, n * sizeof(float), cudaMemcpyHostToDevice, stream), "upload");
        return;
    }
    uint16_t *b = xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) b[i] = float_to_bf16(h[i]);
    cuda_ok(cudaMemcpyAsync(p, b, n * sizeof(uint16_t), cudaMemcpyHostToDevice, stream), "upload");
    free(b);
}

// After the stream is synchronized: the work that wrote p is done.
static float *download(const void *p, size_t n, DType dt) {
    float *h = xmalloc(n * sizeof(float));
    if (dt == DTYPE_F32) {
        cuda_ok(cudaMemcpy(h, p, n * sizeof(float), cudaMemcpyDeviceToHost), "download");
        return h;
    }
    uint16_t *b = xmalloc(n * sizeof(uint16_t));
    cuda_ok(cudaMemcpy(b, p, n * sizeof(uint16_t), cudaMemcpyDeviceToHost), "download");
    for (size_t i = 0; i < n; i++) h[i] = bf16_to_float(b[i]);
    free(b);
    return h;
}

typedef struct {
    double rel_l2, max_rel;  // max_rel: max |err| / rms(ref)
    long long unwritten;     // non-finite outputs (the poison left in place)
} Cmp;

static Cmp compare(const float *out, const float *ref, size_t n) {
    double num = 0, den = 0, maxe = 0;
    long long bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) {
            bad++;
            continue;
        }
        const double d = (double)out[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
        if (fabs(d) > maxe) maxe = fabs(d);
    }
    Cmp c = {den > 0 ? sqrt(num / den) : sqrt(num), maxe / (den > 0 ? sqrt(den / (double)n) : 1.0), bad};
    return c;
}

// ----------------------------------------------------------------------------
// One product both ways

typedef struct {
    MatmulLtEpilogue epilogue;
    DType dt;
    int M, N, K;
    int big;        // large-magnitude data
    size_t offset;  // W, x, bias and y this many bytes past their 256-byte boundary
    int pad;        // matmul_lt's y rows N + pad apart
} Case;

// Device inputs and outputs of a case, and the host copies they were made from.
typedef struct {
    void *base[7];
    void *x, *W, *y_lt, *y_ref;
    void *bias_lt;  // y's type (matmul_lt.h)
    float *bias, *scratch;  // bias: bias_lt's values in fp32, for the unfused steps
    float *h_r0;  // the residual's starting value (BIAS_RESIDUAL), host
} Bufs;

// Set: run_case and test_graph send their product through gemm_rows_ex with this many rows a block
// and K split over rows_ks blocks (kernels/gemm_rows.h) instead of matmul_lt.
static int rows_rb, rows_ks;
// Set: they go through gemm_tiles (kernels/gemm_tiles.h) instead.
static int use_tiles;

static DType out_type(const Case *c) { return matmul_lt_ytype(c->epilogue, c->dt); }
static size_t ldy(const Case *c) { return (size_t)c->N + c->pad; }

static void bufs_create(Bufs *b, const Case *c) {
    const size_t M = c->M, N = c->N, K = c->K, es = dtype_size(c->dt), ys = dtype_size(out_type(c));
    memset(b, 0, sizeof(*b));
    float *hx = xmalloc(M * K * sizeof(float)), *hw = xmalloc(N * K * sizeof(float));
    float *hb = xmalloc(N * sizeof(float));
    fill(hx, M * K, c->big ? 300.0 : 1.0);
    fill(hw, N * K, 1.7 / sqrt((double)K));  // x W^T about as large as x
    fill(hb, N, c->big ? 10.0 : 0.1);
    if (out_type(c) == DTYPE_BF16)  // the values bias_lt will hold
        for (size_t i = 0; i < N; i++) hb[i] = bf16_to_float(float_to_bf16(hb[i]));
    b->x = dev_buf(M * K * es, c->offset, &b->base[0]);
    b->W = dev_buf(N * K * es, c->offset, &b->base[1]);
    b->bias = dev_buf(N * sizeof(float), c->offset, &b->base[2]);
    b->y_lt = dev_buf(M * ldy(c) * ys, c->offset, &b->base[3]);
    b->y_ref = dev_buf(M * N * ys, c->offset, &b->base[4]);
    b->scratch = dev_buf(M * N * sizeof(float), 0, &b->base[5]);
    b->bias_lt = dev_buf(N * ys, c->offset, &b->base[6]);
    upload(b->x, hx, M * K, c->dt);
    upload(b->W, hw, N * K, c->dt);
    upload(b->bias, hb, N, DTYPE_F32);
    upload(b->bias_lt, hb, N, out_type(c));
    free(hx), free(hw), free(hb);
    if (c->epilogue == MATMUL_LT_BIAS_RESIDUAL) {
        b->h_r0 = xmalloc(M * N * sizeof(float));
        fill(b->h_r0, M * N, c->big ? 500.0 : 1.0);
    }
}

// y to its starting value: the residual, or NaN (every byte 0xff) where the product overwrites it.
// stride: y's rows' (N for y_ref, ldy for y_lt; the residual cases have no padding).
static void bufs_reset(const Bufs *b, const Case *c, void *y, size_t stride) {
    const size_t n = (size_t)c->M * stride;
    if (b->h_r0) upload(y, b->h_r0, n, DTYPE_F32);
    else cuda_ok(cudaMemsetAsync(y, 0xff, n * dtype_size(out_type(c)), stream), "poison");
}

static void bufs_free(Bufs *b) {
    for (int i = 0; i < 7; i++) cudaFree(b->base[i]);
    free(b->h_r0);
}

static cublasStatus_t run_lt(const Case *c, const Bufs *b, void *y) {
    if (use_tiles) {
        const cudaError_t e = gemm_tiles(c->epilogue, y, (long long)ldy(c), b->x, b->W, b->bias_lt, c->M, c->N, c->K,
                                         stream);
        if (e != cudaSuccess) printf("  gemm_tiles: %s\n", cudaGetErrorString(e));
        return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
    }
    if (rows_rb) {
        const cudaError_t e = gemm_rows_ex(c->epilogue, y, (long long)ldy(c), b->x, b->W,
                                           c->epilogue == MATMUL_LT_NONE ? NULL : b->bias_lt, c->M, c->N, c->K,
                                           rows_rb, rows_ks, stream);
        if (e != cudaSuccess) printf("  gemm_rows: %s\n", cudaGetErrorString(e));
        return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return matmul_lt(lt, c->epilogue, y, (long long)ldy(c), b->x, b->W, c->dt,
                     c->epilogue == MATMUL_LT_NONE ? NULL : b->bias_lt, c->M, c->N, c->K, b->scratch, stream);
}

static cublasStatus_t run_unfused(const Case *c, const Bufs *b) {
    return matmul_lt_unfused(cublas, c->epilogue, b->y_ref, b->x, b->W, c->dt,
                             c->epilogue == MATMUL_LT_NONE ? NULL : b->bias, c->M, c->N, c->K, b->scratch, stream);
}

// The unfused result, downloaded (the residual's delta for BIAS_RESIDUAL).
static float *unfused_result(const Case *c, const Bufs *b, cublasStatus_t *st) {
    bufs_reset(b, c, b->y_ref, c->N);
    *st = run_unfused(c, b);
    cuda_ok(cudaStreamSynchronize(stream), "unfused");
    float *ref = download(b->y_ref, (size_t)c->M * c->N, out_type(c));
    if (b->h_r0)
        for (size_t i = 0; i < (size_t)c->M * c->N; i++) ref[i] -= b->h_r0[i];
    return ref;
}

// Judges out (downloaded from y_lt; made a delta here for BIAS_RESIDUAL) against ref.
static int judge(const char *name, const Case *c, const Bufs *b, float *out, const float *ref) {
    const size_t n = (size_t)c->M * c->N;
    double tol = c->dt == DTYPE_F32 ? 1e-5 : 1e-2;
    if (b->h_r0) {  // both sides round r0 + delta in fp32 once or twice
        double rr = 0, rd = 0;
        for (size_t i = 0; i < n; i++) {
            out[i] -= b->h_r0[i];
            rr += (double)b->h_r0[i] * b->h_r0[i], rd += (double)ref[i] * ref[i];
        }
        tol += 2.4e-7 * sqrt(rr / (rd > 0 ? rd : 1));
    }
    Cmp cm = compare(out, ref, n);
    int ok = cm.unwritten == 0 && cm.rel_l2 <= tol && cm.max_rel <= 50 * tol;
    CHECK(ok, name, "unwritten=%lld rel_l2=%.3g (tol %.2g) max_rel=%.3g", cm.unwritten, cm.rel_l2, tol, cm.max_rel);
    if (getenv("GPT2_TEST_VERBOSE")) printf("  %s: rel_l2 %.3g max_rel %.3g\n", name, cm.rel_l2, cm.max_rel);
    return ok;
}

static void case_name(char *name, size_t len, const Case *c, const char *what) {
    char route[32] = "matmul_lt";
    if (use_tiles) snprintf(route, sizeof(route), "gemm_tiles");
    else if (rows_rb && rows_ks) snprintf(route, sizeof(route), "gemm_rows rb %d ks %d", rows_rb, rows_ks);
    else if (rows_rb) snprintf(route, sizeof(route), "gemm_rows rb %d", rows_rb);
    snprintf(name, len, "%s %s %s M=%d N=%d K=%d%s%s%s", route, dtype_name(c->dt), epilogue_name[c->epilogue], c->M,
             c->N, c->K, c->big ? " large-magnitude" : "", c->offset ? " misaligned" : "", what);
}

static void run_case(const Case *c, const char *what) {
    char name[200];
    case_name(name, sizeof(name), c, what);
    Bufs b;
    bufs_create(&b, c);
    cublasStatus_t st_ref;
    float *ref = unfused_result(c, &b, &st_ref);
    bufs_reset(&b, c, b.y_lt, ldy(c));
    cublasStatus_t st = run_lt(c, &b, b.y_lt);
    cuda_ok(cudaStreamSynchronize(stream), name);
    if (st != CUBLAS_STATUS_SUCCESS || st_ref != CUBLAS_STATUS_SUCCESS) {
        CHECK(0, name, "matmul_lt: %s, unfused: %s", cublasGetStatusName(st), cublasGetStatusName(st_ref));
    } else {
        float *out = download(b.y_lt, (size_t)c->M * ldy(c), out_type(c));
        size_t pad_written = 0;  // the padding must keep its poison
        for (size_t m = 0; m < (size_t)c->M; m++) {
            for (size_t j = c->N; j < ldy(c); j++) pad_written += !isnan(out[m * ldy(c) + j]);
            memmove(out + m * c->N, out + m * ldy(c), c->N * sizeof(float));
        }
        if (c->pad) CHECK(pad_written == 0, name, "%zu elements of the row padding were written", pad_written);
        judge(name, c, &b, out, ref);
        free(out);
    }
    free(ref);
    bufs_free(&b);
}

// ----------------------------------------------------------------------------
// The plan cache, graphs, errors

// One small fp32 NONE product of M rows through matmul_lt; its status.
static cublasStatus_t small_product(float *y, const float *x, const float *W, int M) {
    return matmul_lt(lt, MATMUL_LT_NONE, y, 32, x, W, DTYPE_F32, NULL, M, 32, 16, NULL, stream);
}

static void test_cache(void) {
    const int rows = 2 * MATMUL_LT_PLANS + 1;  // a shape no other check uses
    void *bx, *bw, *by;
    float *x = dev_buf((size_t)rows * 16 * sizeof(float), 0, &bx), *W = dev_buf(32 * 16 * sizeof(float), 0, &bw);
    float *y = dev_buf((size_t)rows * 32 * sizeof(float), 0, &by);
    cuda_ok(cudaMemsetAsync(x, 0, (size_t)rows * 16 * sizeof(float), stream), "memset");
    cuda_ok(cudaMemsetAsync(W, 0, 32 * 16 * sizeof(float), stream), "memset");

    MatmulLtStats a, b;
    cublasStatus_t s1 = small_product(y, x, W, rows);
    matmul_lt_stats(lt, &a);
    cublasStatus_t s2 = small_product(y, x, W, rows);
    matmul_lt_stats(lt, &b);
    CHECK(s1 == CUBLAS_STATUS_SUCCESS && s2 == CUBLAS_STATUS_SUCCESS && b.calls == a.calls + 1 &&
              b.heuristic_queries == a.heuristic_queries,
          "matmul_lt cache: a repeated call builds no plan", "status %s %s, calls %lld -> %lld, queries %lld -> %lld",
          cublasGetStatusName(s1), cublasGetStatusName(s2), a.calls, b.calls, a.heuristic_queries,
          b.heuristic_queries);

    // A product, then as many new shapes as the cache holds (it stays full), then the product
    // again: its plan was the least recently used, so it is built anew, and computes the same.
    Case c = {MATMUL_LT_BIAS, DTYPE_BF16, 3, 1000, 100, 0, 0, 0};
    run_case(&c, " before eviction");
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (int m = 1; m <= MATMUL_LT_PLANS && st == CUBLAS_STATUS_SUCCESS; m++) st = small_product(y, x, W, m);
    matmul_lt_stats(lt, &a);
    run_case(&c, " after eviction");
    matmul_lt_stats(lt, &b);
    CHECK(st == CUBLAS_STATUS_SUCCESS && a.plans == MATMUL_LT_PLANS && b.plans == MATMUL_LT_PLANS &&
              b.heuristic_queries == a.heuristic_queries + 1,
          "matmul_lt cache: the least recently used plan is evicted",
          "status %s, plans %d %d (capacity %d), queries %lld -> %lld", cublasGetStatusName(st), a.plans, b.plans,
          MATMUL_LT_PLANS, a.heuristic_queries, b.heuristic_queries);
    cudaFree(bx), cudaFree(bw), cudaFree(by);
}

// Nodes of graph of this type; memsets only of at most small_bytes in one row (0: any).
static int count_nodes(cudaGraph_t graph, enum cudaGraphNodeType type, size_t small_bytes) {
    size_t n = 0;
    if (cudaGraphGetNodes(graph, NULL, &n) != cudaSuccess) return -1;
    cudaGraphNode_t nodes[64];
    if (n > 64 || cudaGraphGetNodes(graph, nodes, &n) != cudaSuccess) return -1;
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        enum cudaGraphNodeType t;
        struct cudaMemsetParams m;
        if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess) return -1;
        if (t != type) continue;
        if (type == cudaGraphNodeTypeMemset && small_bytes &&
            (cudaGraphMemsetNodeGetParams(nodes[i], &m) != cudaSuccess || m.height != 1 ||
             m.width * m.elementSize > small_bytes))
            continue;
        count++;
    }
    return count;
}

// graph_memsets_to_kernels on memsets of 1-, 2- and 4-byte elements, each copied on by a memcpy
// node that depends on it, beside a two-row memset and one of 8 KiB that must stay memsets: three
// kernel nodes, each copy now after a kernel, and every byte as the memsets would have left it.
static void test_graph_memsets(void) {
    const char *name = "graph_memsets_to_kernels: small memsets become kernels, edges kept";
    enum { BYTES = 8192 };
    const struct {
        unsigned value, elem_size, width;
    } small_sets[3] = {{0x5a, 1, 7}, {0xbeef, 2, 5}, {0xdeadbeef, 4, 3}};
    unsigned char *buf = NULL, host[BYTES];
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    int ok = cuda_ok(cudaMalloc((void **)&buf, 8 * BYTES), "cudaMalloc") &&
             cuda_ok(cudaMemset(buf, 0, 8 * BYTES), "cudaMemset") && cuda_ok(cudaGraphCreate(&graph, 0), "graph");
    cudaGraphNode_t copies[3];
    for (int i = 0; ok && i < 3; i++) {  // small memset i at buf + i * BYTES, copied to buf + (3 + i) * BYTES
        cudaGraphNode_t set;
        const struct cudaMemsetParams m = {buf + i * BYTES, 0, small_sets[i].value, small_sets[i].elem_size,
                                           small_sets[i].width, 1};
        ok = cuda_ok(cudaGraphAddMemsetNode(&set, graph, NULL, 0, &m), "memset node") &&
             cuda_ok(cudaGraphAddMemcpyNode1D(&copies[i], graph, &set, 1, buf + (3 + i) * BYTES, buf + i * BYTES, 64,
                                              cudaMemcpyDeviceToDevice),
                     "memcpy node");
    }
    const struct cudaMemsetParams two_rows = {buf + 6 * BYTES, 64, 0x11, 1, 16, 2},
                                  large = {buf + 7 * BYTES, 0, 0x22, 1, BYTES, 1};
    cudaGraphNode_t unused;
    int replaced = 0;
    ok = ok && cuda_ok(cudaGraphAddMemsetNode(&unused, graph, NULL, 0, &two_rows), "memset node") &&
         cuda_ok(cudaGraphAddMemsetNode(&unused, graph, NULL, 0, &large), "memset node") &&
         cuda_ok(graph_memsets_to_kernels(graph, &replaced), "graph_memsets_to_kernels");
    const int memsets = ok ? count_nodes(graph, cudaGraphNodeTypeMemset, 0) : -1,
              kernels = ok ? count_nodes(graph, cudaGraphNodeTypeKernel, 0) : -1;
    int after_kernel = 0;
    for (int i = 0; ok && i < 3; i++) {
        cudaGraphNode_t dep;
        size_t nd = 1;
        enum cudaGraphNodeType t;
        after_kernel += cudaGraphNodeGetDependencies(copies[i], &dep, NULL, &nd) == cudaSuccess && nd == 1 &&
                        cudaGraphNodeGetType(dep, &t) == cudaSuccess && t == cudaGraphNodeTypeKernel;
    }
    ok = ok && cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate") &&
         cuda_ok(cudaGraphLaunch(exec, stream), "launch") && cuda_ok(cudaStreamSynchronize(stream), name);
    int wrong = 0;
    for (int i = 0; ok && i < 8; i++) {
        if (!cuda_ok(cudaMemcpy(host, buf + i * BYTES, BYTES, cudaMemcpyDeviceToHost), "download")) break;
        for (int j = 0; j < BYTES; j++) {
            unsigned char want = 0;
            const int set = i < 6 ? i % 3 : -1;
            if (set >= 0 && (i < 3 || j < 64) && j < (int)(small_sets[set].elem_size * small_sets[set].width))
                want = (unsigned char)(small_sets[set].value >> (8 * (j % small_sets[set].elem_size)));
            if (i == 6) want = (j % 64) < 16 && j < 128 ? 0x11 : 0;
            if (i == 7) want = 0x22;
            wrong += host[j] != want;
        }
    }
    CHECK(ok && replaced == 3 && memsets == 2 && kernels == 3 && after_kernel == 3 && wrong == 0, name,
          "replaced %d (want 3), memset nodes left %d (2), kernel nodes %d (3), copies after a kernel %d (3), "
          "wrong bytes %d",
          replaced, memsets, kernels, after_kernel, wrong);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaFree(buf);
}

// The product captured in a CUDA graph with its plan built inside the capture, replayed, against
// the same call made eagerly afterwards (the plan now cached): the same bits. Then both against
// the unfused steps.
static void test_graph(Case c) {
    char name[200];
    case_name(name, sizeof(name), &c, " graph replay");
    Bufs b;
    bufs_create(&b, &c);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cublasStatus_t st = CUBLAS_STATUS_NOT_INITIALIZED;
    int memsets = -1, fills = 0;
    if (cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture")) {
        st = run_lt(&c, &b, b.y_lt);
        if (cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture") &&
            cuda_ok(graph_memsets_to_kernels(graph, &fills), "graph_memsets_to_kernels")) {
            memsets = count_nodes(graph, cudaGraphNodeTypeMemset, GRAPH_MEMSET_KERNEL_MAX_BYTES);
            cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
        }
    }
    const size_t n = (size_t)c.M * c.N;
    float *replayed = NULL, *eager = NULL;
    if (exec && st == CUBLAS_STATUS_SUCCESS) {
        bufs_reset(&b, &c, b.y_lt, c.N);
        cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
        cuda_ok(cudaStreamSynchronize(stream), name);
        replayed = download(b.y_lt, n, out_type(&c));
        bufs_reset(&b, &c, b.y_lt, c.N);
        st = run_lt(&c, &b, b.y_lt);
        cuda_ok(cudaStreamSynchronize(stream), name);
        eager = download(b.y_lt, n, out_type(&c));
    }
    if (!replayed || st != CUBLAS_STATUS_SUCCESS) {
        CHECK(0, name, "capture or call failed: %s", cublasGetStatusName(st));
    } else {
        size_t differ = 0;
        for (size_t i = 0; i < n; i++) differ += memcmp(&replayed[i], &eager[i], sizeof(float)) != 0;
        CHECK(differ == 0 && memsets == 0, name,
              "%zu of %zu elements differ between the replay and the eager call; %d small memset nodes left "
              "(%d became kernels)", differ, n, memsets, fills);
        cublasStatus_t st_ref;
        float *ref = unfused_result(&c, &b, &st_ref);
        case_name(name, sizeof(name), &c, " graph replay vs unfused");
        judge(name, &c, &b, replayed, ref);
        free(ref);
    }
    free(replayed), free(eager);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    bufs_free(&b);
}

// A context created with GPT2_LT_TUNE set to `value` (NULL: unset), the variable then restored.
static MatmulLt *context_with_tune(const char *value, Error *err) {
    const char *saved = getenv("GPT2_LT_TUNE");
    char *copy = saved ? strdup(saved) : NULL;
    if (value) setenv("GPT2_LT_TUNE", value, 1);
    else unsetenv("GPT2_LT_TUNE");
    MatmulLt *ctx = matmul_lt_create((size_t)32 << 20, err);
    if (copy) setenv("GPT2_LT_TUNE", copy, 1);
    else unsetenv("GPT2_LT_TUNE");
    free(copy);
    return ctx;
}

// Tuning (matmul_lt.h): by default the first call of a large product times the heuristic's
// candidates and keeps one, and the result is right (the residual epilogue's candidates must leave
// the residual alone: run_case judges what one call added); a second call does not tune again; a
// plan built inside a stream capture is not tuned. GPT2_LT_TUNE=0 tunes nothing.
static void test_tuning(void) {
    if (small) {
        test_skip("matmul_lt tuning", "GPT2_TEST_SMALL: products of ~20 GFLOP, each timed eight ways");
        return;
    }
    const Case cases[] = {{MATMUL_LT_BIAS_RESIDUAL, DTYPE_BF16, 4099, 768, 3072, 1, 0, 0},
                          {MATMUL_LT_BIAS_GELU, DTYPE_BF16, 4099, 3072, 768, 0, 0, 0},
                          {MATMUL_LT_NONE, DTYPE_F32, 4099, 1000, 1024, 0, 0, 0}};
    MatmulLtStats a, b, c;
    MatmulLt *const shared = lt;  // run_case and test_graph call through `lt`
    Error err = {0};
    MatmulLt *untuned = context_with_tune("0", &err), *tuned = untuned ? context_with_tune(NULL, &err) : NULL;
    if (!tuned) {
        CHECK(0, "matmul_lt tuning", "matmul_lt_create failed: %s", err.msg);
        matmul_lt_free(untuned);
        return;
    }

    lt = untuned;
    run_case(&cases[1], " with GPT2_LT_TUNE=0");
    matmul_lt_stats(lt, &a);
    CHECK(a.tunings == 0 && a.tuned_plans == 0, "matmul_lt tuning: none with GPT2_LT_TUNE=0",
          "%lld tunings, %d tuned plans", a.tunings, a.tuned_plans);

    lt = tuned;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char name[200];
        case_name(name, sizeof(name), &cases[i], " tuned on its first call");
        matmul_lt_stats(lt, &a);
        run_case(&cases[i], " tuned");
        matmul_lt_stats(lt, &b);
        run_case(&cases[i], " tuned, second call");
        matmul_lt_stats(lt, &c);
        CHECK(b.tunings == a.tunings + 1 && b.tuned_plans == a.tuned_plans + 1 && c.tunings == b.tunings &&
                  c.heuristic_queries == b.heuristic_queries,
              name, "tunings %lld -> %lld -> %lld, tuned plans %d -> %d, queries %lld -> %lld", a.tunings, b.tunings,
              c.tunings, a.tuned_plans, b.tuned_plans, b.heuristic_queries, c.heuristic_queries);
    }
    Case captured = {MATMUL_LT_BIAS_RESIDUAL, DTYPE_BF16, 4101, 768, 3072, 0, 0, 0};
    matmul_lt_stats(lt, &a);
    test_graph(captured);
    matmul_lt_stats(lt, &b);
    CHECK(b.tunings == a.tunings && b.heuristic_queries == a.heuristic_queries + 1,
          "matmul_lt tuning: none for a plan built inside a capture", "tunings %lld -> %lld, queries %lld -> %lld",
          a.tunings, b.tunings, a.heuristic_queries, b.heuristic_queries);
    lt = shared;
    matmul_lt_free(tuned);
    matmul_lt_free(untuned);
}

// Bad arguments come back as CUBLAS_STATUS_INVALID_VALUE with nothing launched; M = 0 does nothing.
static void test_bad_args(void) {
    void *base;
    float *d = dev_buf(4096, 0, &base);
    const cublasStatus_t inv = CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t e[8] = {
        matmul_lt(lt, MATMUL_LT_BIAS, d, 4, d, d, DTYPE_F32, NULL, 4, 4, 4, NULL, stream),       // no bias
        matmul_lt(lt, MATMUL_LT_NONE, d, 3, d, d, DTYPE_BF16, NULL, 4, 4, 4, NULL, stream),      // ldy < N
        matmul_lt(lt, MATMUL_LT_BIAS_GELU, d, 4, d, d, DTYPE_F32, d, 4, 4, 4, NULL, stream),     // fp32: no scratch
        matmul_lt(lt, MATMUL_LT_NONE, d, 4, d, d, (DType)7, NULL, 4, 4, 4, NULL, stream),
        matmul_lt(lt, MATMUL_LT_NONE, d, 4, d, d, DTYPE_F32, NULL, 4, 0, 4, NULL, stream),
        matmul_lt_unfused(cublas, MATMUL_LT_BIAS_RESIDUAL, d, d, d, DTYPE_F32, d, 4, 4, 4, NULL, stream),
        matmul_lt(lt, MATMUL_LT_BIAS_GELU, d, 8, d, d, DTYPE_F32, d, 4, 4, 4, d + 64, stream),  // fp32: ldy != N
        matmul_lt(lt, MATMUL_LT_NONE, d, 4, d, d, DTYPE_F32, NULL, 0, 4, 4, NULL, stream),       // M = 0
    };
    CHECK(e[0] == inv && e[1] == inv && e[2] == inv && e[3] == inv && e[4] == inv && e[5] == inv && e[6] == inv &&
              e[7] == CUBLAS_STATUS_SUCCESS,
          "matmul_lt bad arguments", "got %d %d %d %d %d %d %d %d", e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]);
    cudaFree(base);

    if (getenv("GPT2_NO_OOM_TEST")) {  // compute-sanitizer counts the failed allocation as an error
        test_skip("matmul_lt_create out of memory", "GPT2_NO_OOM_TEST is set");
        return;
    }
    Error err = {0};
    MatmulLt *huge = matmul_lt_create((size_t)1 << 50, &err);
    CHECK(!huge && strstr(err.msg, "the cuBLASLt workspace"), "matmul_lt_create out of memory",
          "got %s: '%s'", huge ? "a context" : "NULL", err.msg);
    matmul_lt_free(huge);
}

// ----------------------------------------------------------------------------
// gemm_tiles (kernels/gemm_tiles.h): GPT-2 124M's layer products at a prompt's many rows on Hopper

// A product's shape and epilogue.
typedef struct {
    MatmulLtEpilogue epilogue;
    int N, K;
} Product;

// Each of GPT-2 124M's four products (test_rows's first four) with the epilogue it runs, at rows that
// fill 2, 3, 4, 5, 7 and 8 row tiles (the last partly past M at 200, 300, 480, 513, 769 and 1000; at
// 200, 256, 300, 480 and 512 the sets whose projections' pairs finish 64 rows each: at 300 the second
// block's rows all past M, at 200 and 480 some; at 200 and 256 qkv and fc 48 wide), large magnitudes at
// odd row counts, padded y rows once, a graph replay; then what it refuses and which rows it takes.
static void test_tiles(void) {
    static const Product shapes[] = {
        {MATMUL_LT_BIAS, 2304, 768}, {MATMUL_LT_BIAS_RESIDUAL, 768, 768},
        {MATMUL_LT_BIAS_GELU, 3072, 768}, {MATMUL_LT_BIAS_RESIDUAL, 768, 3072},
    };
    const int Ms[] = {769, 1000, 1024, 513, 300, 512, 480, 200, 256};
    use_tiles = 1;
    for (size_t si = 0; si < 4; si++)
        for (int mi = 0; mi < 9; mi++) {
            if (small && mi != 1 && mi != 4 && mi != 7) continue;
            const int pad = si == 0 && mi == 2 ? 8 : 0;
            Case c = {shapes[si].epilogue, DTYPE_BF16, Ms[mi], shapes[si].N, shapes[si].K, mi % 2, 0, pad};
            run_case(&c, pad ? " ldy 2312" : "");
        }
    test_graph((Case){MATMUL_LT_BIAS_RESIDUAL, DTYPE_BF16, 1000, 768, 3072, 0, 0, 0});
    test_graph((Case){MATMUL_LT_BIAS_RESIDUAL, DTYPE_BF16, 300, 768, 768, 0, 0, 0});
    use_tiles = 0;

    // A shape or an epilogue of another product, too many rows, a misaligned x or an ldy that breaks
    // y's 16-byte rows: not supported; no bias: invalid. Taken: two or more row tiles whose blocks fill
    // 2/5 to one wave, in 48 blocks a row tile where those fit in one, else 32, else 16 (qkv's blocks
    // are not clusters: one an SM).
    void *base;
    char *d = dev_buf(1 << 24, 0, &base);
    const cudaError_t e[] = {
        gemm_tiles(MATMUL_LT_BIAS_GELU, d, 2304, d, d, d, 1024, 2304, 768, stream),
        gemm_tiles(MATMUL_LT_BIAS, d, 1024, d, d, d, 1024, 1024, 1024, stream),
        gemm_tiles(MATMUL_LT_BIAS, d, 2304, d, d, d, GEMM_TILES_MAX_ROWS + 1, 2304, 768, stream),
        gemm_tiles(MATMUL_LT_BIAS, d, 2304, d + 4, d, d, 1024, 2304, 768, stream),
        gemm_tiles(MATMUL_LT_BIAS, d, 2308, d, d, d, 1024, 2304, 768, stream),
        gemm_tiles(MATMUL_LT_BIAS, d, 2304, d, d, NULL, 1024, 2304, 768, stream),
    };
    int sms = 0;
    cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
    const int Mt[] = {128, 129, 256, 300, 512, 513, 1024};
    int takes_ok = 1;
    char takes[128] = "";
    for (int i = 0; i < 7; i++) {
        const int row_tiles = (Mt[i] + 127) / 128,
                  blocks = 48 * row_tiles <= sms   ? 48 * row_tiles
                           : 32 * row_tiles <= sms ? 32 * row_tiles
                                                   : 16 * row_tiles;
        const int taken = gemm_tiles_takes(Mt[i], 2304, 768);
        takes_ok &= taken == (row_tiles >= 2 && blocks <= sms && 5 * blocks >= 2 * sms);
        snprintf(takes + strlen(takes), sizeof takes - strlen(takes), " %d:%d", Mt[i], taken);
    }
    CHECK(e[0] == cudaErrorNotSupported && e[1] == cudaErrorNotSupported && e[2] == cudaErrorNotSupported &&
              e[3] == cudaErrorNotSupported && e[4] == cudaErrorNotSupported && e[5] == cudaErrorInvalidValue &&
              takes_ok && !gemm_tiles_takes(1024, 2304, 1024) &&
              gemm_tiles_parts(768) == 16 && gemm_tiles_parts(2304) == 0,
          "gemm_tiles refuses what it cannot run",
          "got %d %d %d %d %d %d; rows:taken%s on %d SMs", e[0], e[1], e[2], e[3], e[4], e[5], takes, sms);
    cudaFree(base);
}

// ----------------------------------------------------------------------------
// gemm_rows (kernels/gemm_rows.h): the same products of a few rows on Hopper

// Every row tile and split of K at batched-decode row counts (a row block partly past M, one row, a
// multiple of 8 and not), GPT-2's layer products, an N whose last column block is partial, a K with
// fewer slices than a cluster has blocks, a misaligned output; GPT-2's layer products at a short
// prompt's rows (past 64: several row blocks of 32 or 64); the logits' width once; a graph replay;
// and the MLP's two products chained in a graph by PDL, the second reading what the first wrote.
static void test_rows(void) {
    static const Product shapes[] = {
        {MATMUL_LT_BIAS, 2304, 768},          // qkv
        {MATMUL_LT_BIAS_RESIDUAL, 768, 768},  // attention projection
        {MATMUL_LT_BIAS_GELU, 3072, 768},     // fc
        {MATMUL_LT_BIAS_RESIDUAL, 768, 3072}, // MLP projection: its part of K fits from 4 blocks on
        {MATMUL_LT_BIAS, 1000, 128},
        {MATMUL_LT_NONE, 200, 64},            // 1 slice: blocks with none past a split of 1
        {MATMUL_LT_BIAS_RESIDUAL, 72, 192},   // 3 slices: blocks with none past a split of 2
    };
    const int Ms[] = {1, 5, 8, 17, 32, 33, 64}, rbs[] = {16, 32, 64}, kss[] = {1, 2, 4, 8};
    for (int ri = 0; ri < 3; ri++)
        for (int ki = 0; ki < 4; ki++) {
            rows_rb = rbs[ri], rows_ks = kss[ki];
            for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
                for (int mi = 0; mi < 7; mi++) {
                    if (shapes[si].K == 3072 && rows_ks < 4) continue;  // does not fit (refused below)
                    if (rows_ks > 1 && (mi == 1 || mi == 2 || mi == 4)) continue;
                    if (small && (mi % 3 || si > 4)) continue;
                    Case c = {shapes[si].epilogue, DTYPE_BF16, Ms[mi], shapes[si].N, shapes[si].K, mi % 2, 0, 0};
                    run_case(&c, "");
                }
        }
    const int prompt_rows[] = {65, 128, 200};
    for (int rb = 32; rb <= 64; rb *= 2)
        for (size_t si = 0; si < 4; si++)
            for (int mi = 0; mi < 3; mi++) {
                if (small && (mi != 1 || rb == 32)) continue;
                rows_rb = rb, rows_ks = 0;  // K's split as gemm_rows picks it
                Case c = {shapes[si].epilogue, DTYPE_BF16, prompt_rows[mi], shapes[si].N, shapes[si].K, mi % 2, 0, 0};
                run_case(&c, "");
            }
    rows_rb = 32, rows_ks = 0;
    Case misaligned = {MATMUL_LT_BIAS_GELU, DTYPE_BF16, 24, 1000, 128, 0, 16, 3};  // y rows 1003 apart
    run_case(&misaligned, "");
    if (!small) {
        Case logits = {MATMUL_LT_NONE, DTYPE_BF16, 9, 50257, 768, 1, 0, 47};
        run_case(&logits, " ldy 50304");
    }
    test_graph((Case){MATMUL_LT_BIAS_RESIDUAL, DTYPE_BF16, 40, 384, 256, 0, 0, 0});
    rows_ks = 4;
    test_graph((Case){MATMUL_LT_BIAS_RESIDUAL, DTYPE_BF16, 64, 768, 3072, 0, 0, 0});

    // What gemm_rows refuses: K not a multiple of 64 (its copies bring whole 64-column slices), a K
    // whose eighth does not fit, a split whose part does not (the MLP projection's K whole), a split
    // that is not a power of two to 8, more than GEMM_ROWS_MAX_ROWS rows, a misaligned x, no bias;
    // nothing is launched.
    void *base;
    uint16_t *d = dev_buf(1 << 20, 0, &base);
    const cudaError_t e[7] = {
        gemm_rows(MATMUL_LT_NONE, d, 64, d, d, NULL, 8, 64, 104, stream),
        gemm_rows(MATMUL_LT_NONE, d, 64, d, d, NULL, 8, 64, 16384, stream),
        gemm_rows_ex(MATMUL_LT_NONE, d, 64, d, d, NULL, 8, 64, 3072, 16, 1, stream),
        gemm_rows_ex(MATMUL_LT_NONE, d, 64, d, d, NULL, 8, 64, 768, 16, 3, stream),
        gemm_rows(MATMUL_LT_NONE, d, 64, d, d, NULL, GEMM_ROWS_MAX_ROWS + 1, 64, 64, stream),
        gemm_rows(MATMUL_LT_NONE, d, 64, d + 4, d, NULL, 8, 64, 64, stream),
        gemm_rows(MATMUL_LT_BIAS, d, 64, d, d, NULL, 8, 64, 64, stream),  // no bias
    };
    CHECK(e[0] == cudaErrorNotSupported && e[1] == cudaErrorNotSupported && e[2] == cudaErrorNotSupported &&
              e[3] == cudaErrorInvalidValue && e[4] == cudaErrorNotSupported && e[5] == cudaErrorNotSupported &&
              e[6] == cudaErrorInvalidValue && !gemm_rows_takes(8, 64, 16384) && !gemm_rows_takes(8, 64, 104) &&
              gemm_rows_takes(64, 768, 3072),
          "gemm_rows refuses what it cannot run", "got %d %d %d %d %d %d %d", e[0], e[1], e[2], e[3], e[4], e[5],
          e[6]);
    cudaFree(base);

    // The engine's routing: past 32 rows only a grid of one wave (a block an SM) takes gemm_rows;
    // past 64, with 64 rows a block where 32 would not fit one wave.
    int sms = 0;
    cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
    const int wide = 64 * (sms + 1);  // sms + 1 column blocks at K = 64, 32 rows a block past 16 rows
    CHECK(gemm_rows_takes(32, wide, 64) && !gemm_rows_takes(64, wide, 64) && gemm_rows_takes(64, 64 * (sms / 2), 64),
          "gemm_rows_takes: one wave of blocks past 32 rows", "%d SMs: got %d %d %d", sms,
          gemm_rows_takes(32, wide, 64), gemm_rows_takes(64, wide, 64), gemm_rows_takes(64, 64 * (sms / 2), 64));
    const int half = 64 * (sms / 2);  // at 128 rows: 64 a block, two row blocks, one wave; not at 129
    CHECK(gemm_rows_takes(128, half, 768) && !gemm_rows_takes(129, half, 768) && !gemm_rows_takes(128, half + 64, 768),
          "gemm_rows_takes: one wave of blocks past 64 rows, 64 rows a block", "%d SMs: got %d %d %d", sms,
          gemm_rows_takes(128, half, 768), gemm_rows_takes(129, half, 768), gemm_rows_takes(128, half + 64, 768));

    // fc then the MLP projection in one graph, as a decode step runs them (the second with K split):
    // h = gelu(x W1^T + b1), y += h W2^T + b2, with h poisoned (NaN) by a memset node before the first
    // product on every replay. A second product that read h before its wait would see NaN.
    const int M = 48, C = 768, H = 3072;
    void *bb[9];
    uint16_t *x = dev_buf((size_t)M * C * 2, 0, &bb[0]), *W1 = dev_buf((size_t)H * C * 2, 0, &bb[1]);
    uint16_t *W2 = dev_buf((size_t)C * H * 2, 0, &bb[2]), *h = dev_buf((size_t)M * H * 2, 0, &bb[3]);
    uint16_t *b1 = dev_buf(H * 2, 0, &bb[4]);
    float *b2 = dev_buf(C * 4, 0, &bb[5]), *y = dev_buf((size_t)M * C * 4, 0, &bb[6]);
    float *b1f = dev_buf(H * 4, 0, &bb[7]), *scratch = dev_buf((size_t)M * H * 4, 0, &bb[8]);  // unfused side
    float *hx = xmalloc((size_t)M * C * 4), *hw = xmalloc((size_t)H * C * 4), *hb = xmalloc(H * 4);
    fill(hx, (size_t)M * C, 1.0), upload(x, hx, (size_t)M * C, DTYPE_BF16);
    fill(hw, (size_t)H * C, 0.06), upload(W1, hw, (size_t)H * C, DTYPE_BF16);
    fill(hw, (size_t)C * H, 0.03), upload(W2, hw, (size_t)C * H, DTYPE_BF16);
    fill(hb, H, 0.1);
    for (int i = 0; i < H; i++) hb[i] = bf16_to_float(float_to_bf16(hb[i]));  // b1's values, exactly, in fp32
    upload(b1, hb, H, DTYPE_BF16), upload(b1f, hb, H, DTYPE_F32), upload(b2, hb, C, DTYPE_F32);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e1 = cudaErrorUnknown, e2 = cudaErrorUnknown;
    if (cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture")) {
        cuda_ok(cudaMemsetAsync(h, 0xff, (size_t)M * H * 2, stream), "poison");
        e1 = gemm_rows(MATMUL_LT_BIAS_GELU, h, H, x, W1, b1, M, H, C, stream);
        e2 = gemm_rows(MATMUL_LT_BIAS_RESIDUAL, y, C, h, W2, b2, M, C, H, stream);
        if (cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture"))
            cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    }
    float *got = NULL, *want = NULL;
    if (exec && e1 == cudaSuccess && e2 == cudaSuccess) {
        cuda_ok(cudaMemsetAsync(y, 0, (size_t)M * C * 4, stream), "memset");
        for (int i = 0; i < 3; i++) cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");  // y = 3 (h W2^T + b2)
        cuda_ok(cudaStreamSynchronize(stream), "replays");
        got = download(y, (size_t)M * C, DTYPE_F32);
        // The same through the unfused steps, eagerly, three times.
        cuda_ok(cudaMemsetAsync(y, 0, (size_t)M * C * 4, stream), "memset");
        cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
        for (int i = 0; i < 3 && st == CUBLAS_STATUS_SUCCESS; i++) {
            st = matmul_lt_unfused(cublas, MATMUL_LT_BIAS_GELU, h, x, W1, DTYPE_BF16, b1f, M, H, C, scratch, stream);
            if (st == CUBLAS_STATUS_SUCCESS)
                st = matmul_lt_unfused(cublas, MATMUL_LT_BIAS_RESIDUAL, y, h, W2, DTYPE_BF16, b2, M, C, H, scratch,
                                       stream);
        }
        cuda_ok(cudaStreamSynchronize(stream), "unfused");
        if (st == CUBLAS_STATUS_SUCCESS) want = download(y, (size_t)M * C, DTYPE_F32);
        else free(got), got = NULL;
    }
    if (!got) {
        CHECK(0, "gemm_rows PDL chain in a graph", "capture, launch or the unfused side failed: %s, %s",
              cudaGetErrorString(e1), cudaGetErrorString(e2));
    } else {
        Cmp cm = compare(got, want, (size_t)M * C);
        CHECK(cm.unwritten == 0 && cm.rel_l2 <= 1e-2 && cm.max_rel <= 0.5, "gemm_rows PDL chain in a graph",
              "unwritten=%lld rel_l2=%.3g max_rel=%.3g", cm.unwritten, cm.rel_l2, cm.max_rel);
    }
    free(got), free(want), free(hx), free(hw), free(hb);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    for (int i = 0; i < 9; i++) cudaFree(bb[i]);
    rows_rb = rows_ks = 0;
}

// logits_rows (the persistent few-row logits product) against the unfused product (cublasGemmEx
// into fp32) of the same bf16 operands: rows 1-64 (every row tile, rows past M), the logits' N =
// 50257 (a ragged last tile) and other widths of K = 768-1600, x's rows strided (a prompt's last
// rows) and y's rows padded (the engine's 50304: the padding must stay untouched), large-magnitude
// x. Tolerance: rel_l2 <= 1e-5 and max_rel <= 1e-4 (fp32 out, the same bf16 operands, only the
// order of the fp32 adds differs). Every call also takes the greedy pick, which must be each row's
// first largest logit as written, exactly, and must leave its workspace zero; and again with
// ids_only, which must pick the same ids and leave y as it was.

// The greedy workspace after a call: 0 when every best and the ticket are back to zero.
static int greedy_ws_dirty(const unsigned long long *best, int M) {
    unsigned long long h[65];
    cuda_ok(cudaMemcpy(h, best, (size_t)(M + 1) * 8, cudaMemcpyDeviceToHost), "greedy workspace");
    unsigned ticket;
    memcpy(&ticket, &h[M], sizeof(ticket));
    int dirty = ticket != 0;
    for (int i = 0; i < M; i++) dirty += h[i] != 0;
    return dirty;
}

// Rows of the pick that differ from the first largest of each of M rows of N (rows N apart).
static int greedy_wrong(const int *next, const float *logits, int M, int N) {
    int wrong = 0;
    for (int t = 0; t < M; t++) {
        const float *r = logits + (size_t)t * N;
        int best = 0;
        for (int f = 1; f < N; f++)
            if (r[f] > r[best]) best = f;
        wrong += next[t] != best;
    }
    return wrong;
}

static void test_logits_rows(void) {
    static const struct {
        int M, N, K, ldx_rows, pad, big;  // x's rows ldx_rows * K apart
    } cases[] = {
        {64, 50257, 768, 1, 47, 0}, {5, 50257, 768, 3, 47, 1}, {1, 50257, 768, 1, 0, 0},
        {17, 3000, 1024, 1, 0, 1},  {33, 640, 1280, 2, 5, 0},  {32, 2000, 1600, 1, 0, 0},
        {16, 4100, 104, 1, 0, 0},
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int M = cases[ci].M, N = cases[ci].N, K = cases[ci].K;
        const int ldy = N + cases[ci].pad, ldx = K * cases[ci].ldx_rows;
        if (small && (ci % 3 || N > 5000)) continue;
        char name[200];
        snprintf(name, sizeof(name), "logits_rows M=%d N=%d K=%d ldx %d ldy %d%s", M, N, K, ldx, ldy,
                 cases[ci].big ? ", x ~ 300" : "");
        if (!logits_rows_takes(M, K)) {
            CHECK(0, name, "logits_rows_takes refuses a shape it must take");
            continue;
        }
        void *bb[6];
        int *next = dev_buf((size_t)(M + 130) * 8, 0, &bb[5]);
        cuda_ok(cudaMemsetAsync(next, 0, (size_t)(M + 130) * 8, stream), "greedy workspace");
        const LogitsGreedy greedy = {next, (unsigned long long *)(next + 64), (unsigned *)(next + 64 + 2 * M), 0, NULL};
        int *copy = next + 64 + 2 * M + 4;  // [M]: the ids' second copy (a decode step's next tokens)
        uint16_t *x = dev_buf((size_t)M * ldx * 2, 0, &bb[0]), *xc = dev_buf((size_t)M * K * 2, 0, &bb[1]);
        uint16_t *W = dev_buf((size_t)N * K * 2, 0, &bb[2]);
        float *y = dev_buf((size_t)M * ldy * 4, 0, &bb[3]), *y_ref = dev_buf((size_t)M * N * 4, 0, &bb[4]);
        float *hx = xmalloc((size_t)M * K * 4), *hW = xmalloc((size_t)N * K * 4);
        fill(hW, (size_t)N * K, 1.7 / sqrt((double)K)), upload(W, hW, (size_t)N * K, DTYPE_BF16);
        fill(hx, (size_t)M * K, cases[ci].big ? 300.0 : 1.0), upload(xc, hx, (size_t)M * K, DTYPE_BF16);
        cuda_ok(cudaMemcpy2DAsync(x, (size_t)ldx * 2, xc, (size_t)K * 2, (size_t)K * 2, M, cudaMemcpyDeviceToDevice,
                                  stream), "strided x");
        cuda_ok(cudaMemsetAsync(y, 0xff, (size_t)M * ldy * 4, stream), "poison");
        const cudaError_t e = logits_rows(y, ldy, x, ldx, W, M, N, K, &greedy, stream);
        const cublasStatus_t st =
            matmul_lt_unfused(cublas, MATMUL_LT_NONE, y_ref, xc, W, DTYPE_BF16, NULL, M, N, K, NULL, stream);
        cuda_ok(cudaStreamSynchronize(stream), name);
        if (e != cudaSuccess || st != CUBLAS_STATUS_SUCCESS) {
            CHECK(0, name, "logits_rows %s, unfused %s", cudaGetErrorString(e), cublasGetStatusName(st));
        } else {
            float *got = download(y, (size_t)M * ldy, DTYPE_F32), *want = download(y_ref, (size_t)M * N, DTYPE_F32);
            long long padding_written = 0;
            for (int t = 0; t < M; t++) {
                for (int f = N; f < ldy; f++) padding_written += !isnan(got[(size_t)t * ldy + f]);
                memmove(got + (size_t)t * N, got + (size_t)t * ldy, (size_t)N * 4);
            }
            const Cmp c = compare(got, want, (size_t)M * N);
            const double tol = 1e-5, tol_max = 1e-4;
            int hnext[64], again[64], copied[64];
            cuda_ok(cudaMemcpy(hnext, next, (size_t)M * sizeof(int), cudaMemcpyDeviceToHost), "greedy ids");
            const int wrong = greedy_wrong(hnext, got, M, N), dirty = greedy_ws_dirty(greedy.best, M);
            // Again asking only for the ids (a decode step's call), twice: the same ids, y left as it was.
            LogitsGreedy ids_only = greedy;
            ids_only.ids_only = 1;
            ids_only.next_copy = copy;
            cuda_ok(cudaMemsetAsync(next, 0xff, (size_t)M * sizeof(int), stream), "poison");
            cuda_ok(cudaMemsetAsync(copy, 0xff, (size_t)M * sizeof(int), stream), "poison");
            cuda_ok(cudaMemsetAsync(y, 0xff, (size_t)M * ldy * 4, stream), "poison");
            const cudaError_t e2 = logits_rows(y, ldy, x, ldx, W, M, N, K, &ids_only, stream);
            cuda_ok(cudaStreamSynchronize(stream), name);
            float *y2 = download(y, (size_t)M * ldy, DTYPE_F32);
            cuda_ok(cudaMemcpy(again, next, (size_t)M * sizeof(int), cudaMemcpyDeviceToHost), "greedy ids");
            cuda_ok(cudaMemcpy(copied, copy, (size_t)M * sizeof(int), cudaMemcpyDeviceToHost), "greedy ids");
            long long y_written = 0, ids_differ = 0;
            for (size_t i = 0; i < (size_t)M * ldy; i++) y_written += !isnan(y2[i]);
            for (int t = 0; t < M; t++) ids_differ += again[t] != hnext[t] || copied[t] != hnext[t];
            const int dirty2 = greedy_ws_dirty(greedy.best, M);
            CHECK(c.unwritten == 0 && padding_written == 0 && c.rel_l2 <= tol && c.max_rel <= tol_max && !wrong &&
                      !dirty && e2 == cudaSuccess && y_written == 0 && ids_differ == 0 && !dirty2,
                  name,
                  "unwritten %lld, padding written %lld, rel_l2 %.3g (tol %.0e), max_rel %.3g (tol %.0e), "
                  "greedy ids wrong %d, workspace left dirty %d; ids only: %s, y written %lld, ids differ %lld, "
                  "workspace left dirty %d",
                  c.unwritten, padding_written, c.rel_l2, tol, c.max_rel, tol_max, wrong, dirty,
                  cudaGetErrorString(e2), y_written, ids_differ, dirty2);
            free(got), free(want), free(y2);
        }
        free(hx), free(hW);
        for (int i = 0; i < 6; i++) cudaFree(bb[i]);
    }
    // What it refuses, launching nothing: no rows or more than 64, K not a multiple of 8, x's rows
    // off 16 bytes, ldy < N, a greedy pick without its workspace.
    void *base;
    float *d = dev_buf(1 << 22, 0, &base);
    const LogitsGreedy no_best = {(int *)d, NULL, (unsigned *)d, 0, NULL};
    const cudaError_t e[6] = {
        logits_rows(d, 64, d, 64, d, 0, 64, 64, NULL, stream),
        logits_rows(d, 64, d, 64, d, 65, 64, 64, NULL, stream),
        logits_rows(d, 64, d, 68, d, 4, 64, 68, NULL, stream),
        logits_rows(d, 64, d, 68, d, 4, 64, 64, NULL, stream),
        logits_rows(d, 60, d, 64, d, 4, 64, 64, NULL, stream),
        logits_rows(d, 64, d, 64, d, 4, 64, 64, &no_best, stream),
    };
    CHECK(e[0] == cudaErrorInvalidValue && e[1] == cudaErrorNotSupported && e[2] == cudaErrorNotSupported &&
              e[3] == cudaErrorNotSupported && e[4] == cudaErrorInvalidValue && e[5] == cudaErrorInvalidValue &&
              !logits_rows_takes(65, 768) && !logits_rows_takes(64, 1600) && logits_rows_takes(32, 1600),
          "logits_rows: refuses what it cannot run", "got %d %d %d %d %d %d, takes %d %d %d", e[0], e[1], e[2], e[3],
          e[4], e[5], logits_rows_takes(65, 768), logits_rows_takes(64, 1600), logits_rows_takes(32, 1600));
    cudaFree(base);
}

// The greedy pick's ties: W's rows 7, 1500 and 2999 equal (and the rest zero), so row 0 of x, which
// meets them positively, has three equal largest logits (the pick must be 7, the first, as the host
// sampler's), and row 1, which meets them negatively, has 2997 equal zeros (the pick must be 0).
// Called three times on one workspace, as graph replays do.
static void test_logits_rows_greedy_ties(void) {
    const int M = 2, N = 3000, K = 64;
    void *bb[4];
    uint16_t *x = dev_buf((size_t)M * K * 2, 0, &bb[0]), *W = dev_buf((size_t)N * K * 2, 0, &bb[1]);
    float *y = dev_buf((size_t)M * N * 4, 0, &bb[2]);
    int *ws = dev_buf(512, 0, &bb[3]);
    float *hx = xmalloc((size_t)M * K * 4), *hW = calloc((size_t)N * K, 4);
    for (int k = 0; k < K; k++)
        hx[k] = 0.5f, hx[K + k] = -0.5f, hW[7 * K + k] = hW[1500 * K + k] = hW[2999 * K + k] = 0.25f;
    upload(x, hx, (size_t)M * K, DTYPE_BF16), upload(W, hW, (size_t)N * K, DTYPE_BF16);
    cuda_ok(cudaMemsetAsync(ws, 0, 512, stream), "greedy workspace");
    const LogitsGreedy greedy = {ws, (unsigned long long *)(ws + 64), (unsigned *)(ws + 64 + 2 * M), 0, NULL};
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 3 && e == cudaSuccess; i++) e = logits_rows(y, N, x, K, W, M, N, K, &greedy, stream);
    cuda_ok(cudaStreamSynchronize(stream), "greedy ties");
    int next[2] = {-1, -1};
    cuda_ok(cudaMemcpy(next, ws, sizeof(next), cudaMemcpyDeviceToHost), "greedy ids");
    const int dirty = greedy_ws_dirty(greedy.best, M);
    CHECK(e == cudaSuccess && next[0] == 7 && next[1] == 0 && !dirty, "logits_rows greedy: ties go to the lowest id",
          "%s, picks %d %d (want 7 0), workspace left dirty %d", cudaGetErrorString(e), next[0], next[1], dirty);
    free(hx), free(hW);
    for (int i = 0; i < 4; i++) cudaFree(bb[i]);
}

// Every product through matmul_lt (against the unfused ops), its plan cache, graphs, tuning and bad
// arguments; then gemm_rows and logits_rows where they run.
static void test_products(void) {
    static const Product shapes[] = {
        {MATMUL_LT_NONE, 50257, 768},          // the logits
        {MATMUL_LT_NONE, 1000, 100},
        {MATMUL_LT_BIAS, 2304, 768},           // qkv
        {MATMUL_LT_BIAS, 1000, 3072},
        {MATMUL_LT_BIAS_RESIDUAL, 768, 768},   // attention projection
        {MATMUL_LT_BIAS_RESIDUAL, 768, 3072},  // MLP projection
        {MATMUL_LT_BIAS_RESIDUAL, 1000, 100},
        {MATMUL_LT_BIAS_GELU, 3072, 768},      // fc
        {MATMUL_LT_BIAS_GELU, 1000, 100},
    };
    const int Ms[] = {5, 17, 64, 100, 1024, 4097};
    for (int dt = 0; dt < 2; dt++)
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
            for (int mi = 0; mi < 6; mi++) {
                if (small && (Ms[mi] > 100 || shapes[si].N > 3072)) continue;
                Case c = {shapes[si].epilogue, (DType)dt, Ms[mi], shapes[si].N, shapes[si].K, mi % 2, 0, 0};
                run_case(&c, "");
                // The logits as the engine computes them: rows padded to a multiple of 64.
                c.pad = shapes[si].N == 50257 ? 47 : 0;
                if (c.pad && Ms[mi] <= 100) run_case(&c, " ldy 50304");
            }
    // Off their alignment: W, x, bias and y 4 bytes past a 256-byte boundary.
    for (int dt = 0; dt < 2; dt++)
        for (int ep = MATMUL_LT_NONE; ep <= MATMUL_LT_BIAS_GELU; ep++) {
            Case c = {(MatmulLtEpilogue)ep, (DType)dt, 33, 1000, 100, 0, 4, 0};
            run_case(&c, "");
        }
    test_cache();
    test_graph_memsets();
    for (int dt = 0; dt < 2; dt++)
        for (int ep = MATMUL_LT_NONE; ep <= MATMUL_LT_BIAS_GELU; ep++)
            test_graph((Case){(MatmulLtEpilogue)ep, (DType)dt, 77 + ep, 384, 256, 0, 0, 0});
    if (!small)  // GPT-2's qkv at 8192 rows, whose algorithms zero their workspace by a memset (H200)
        test_graph((Case){MATMUL_LT_BIAS, DTYPE_BF16, 8192, 2304, 768, 0, 0, 0});
    test_tuning();
    test_bad_args();
    if (gemm_rows_available())
        test_rows(), test_logits_rows(), test_logits_rows_greedy_ties();
    else test_skip("gemm_rows and logits_rows", "not an sm_90 device with an sm_90a build");
}

int main(void) {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        char why[200];
        snprintf(why, sizeof(why), "no GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        test_skip("test_matmul_lt", why);
        return 0;
    }
    const char *seed_env = getenv("GPT2_TEST_SEED");
    seed = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("# test_matmul_lt seed %llu (GPT2_TEST_SEED to repeat)\n", (unsigned long long)seed);
    small = getenv("GPT2_TEST_SMALL") != NULL;

    Error err = {0};
    // Non-blocking, as the engine's: inputs are filled in stream order (upload, bufs_reset), and
    // results read after a stream synchronization.
    if (!cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream") ||
        cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(cublas, stream) != CUBLAS_STATUS_SUCCESS ||
        !(lt = matmul_lt_create((size_t)32 << 20, &err))) {
        CHECK(0, "matmul_lt setup", "stream, cuBLAS or matmul_lt_create failed: %s", err.msg);
        return test_exit_code();
    }
    // GPT2_TEST_ONLY=gemm_tiles: its cases alone (compute-sanitizer's racecheck runs unfiltered: filtered to
    // one kernel it faults in the others, docs/PERF.md "Session 32").
    const char *only = getenv("GPT2_TEST_ONLY");
    if (!only || strcmp(only, "gemm_tiles")) test_products();
    if (gemm_tiles_available()) test_tiles();
    else test_skip("gemm_tiles", "not an sm_90 device with an sm_90a build");

    matmul_lt_free(lt);
    cublasDestroy(cublas);
    cudaStreamDestroy(stream);
    return test_exit_code();
}

#else

int main(void) {
    test_skip("test_matmul_lt", "no GPU (built without CUDA)");
    return 0;
}

#endif
