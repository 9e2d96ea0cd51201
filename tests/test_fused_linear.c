// Tests of the fused linear kernels (issue 5) against fp64 host references on fresh random data
// every run (the seed is printed): kernels/fused_ln_linear.h (LayerNorm + Linear + GELU, plain
// and QKV-into-cache outputs, strided rows), kernels/linear_residual.h, and gemm_rows.h's LayerNorm
// fold (run_fold_case).
//
// Every kernel path (GEMV, tensor-core and cluster GEMVs (bf16), tiled XS / S / L, auto) on
// awkward shapes (K = 96, 97, 100, 768; N = 77, 300; M = 1, 3, 17, 130), both dtypes, and three
// kinds of rows: N(0, 1)-ish, offset (mean 100, std 1: one-pass variance and W.x - mean*s cancel
// badly there) and outliers (two channels of +-300..500, one of them inside the first tile that
// sets the tiled kernels' shift, like GPT-2's residual stream; in rows 0, 2, 4, ... a third at
// x[0], the GEMVs' shift). Outputs are poisoned (NaN) first; every element must be written and
// nothing outside the output (cache slots of other positions, row padding) touched.
//
// Tolerances, rel_l2 = |out - ref| / |ref| over the whole output:
//   fp32                              1e-5 against the exact LayerNorm + Linear in fp64
//   bf16, kernel check                1e-3 against a reference that rounds what the kernel rounds
//                                     (W; the tiled kernels' tensor-core operand gamma * (x - c), c
//                                     the kernel's shift; the tensor-core and cluster GEMVs' normalised x; the
//                                     output when bf16, plus one output ulp, 2^-8, for values that
//                                     round the other way)
//   bf16, against exact LayerNorm     1e-2 (the operand rounding itself, reported for reference)
//   linear_residual                   1e-5 fp32, 1e-4 bf16 (operands are bf16 in memory already)
// plus a per-element bound (max |err| <= 50 * tol * rms(ref)) that catches a single bad element.
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "common.h"

#if GPT2_CUDA
#include <cuda_runtime.h>

#include "fused_ln_linear.h"
#include "gemm_rows.h"
#include "gemm_tiles.h"
#include "linear_residual.h"

// ----------------------------------------------------------------------------
// Random data

static uint64_t rng_state;
static uint64_t rng_next(void) {  // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_uniform(void) { return (rng_next() >> 11) * (1.0 / 9007199254740992.0); }
static double rng_normal(void) {
    double u = rng_uniform(), v = rng_uniform();
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static float round_bf16(float v) { return bf16_to_float(float_to_bf16(v)); }

enum { DATA_NORMAL, DATA_OFFSET, DATA_OUTLIER };
static const char *data_name[] = {"normal", "offset", "outliers"};

static void fill_x(float *x, int M, int K, int kind) {
    for (int m = 0; m < M; m++) {
        double mu = 0.3 * rng_normal(), sd = 0.5 + rng_uniform();
        if (kind == DATA_OFFSET) mu = 100.0 + rng_normal(), sd = 1.0;
        for (int k = 0; k < K; k++) x[(size_t)m * K + k] = (float)(mu + sd * rng_normal());
        if (kind == DATA_OUTLIER) {
            x[(size_t)m * K + (5 % K)] = (float)((rng_uniform() < 0.5 ? -1 : 1) * (300 + 200 * rng_uniform()));
            x[(size_t)m * K + K / 2] = (float)((rng_uniform() < 0.5 ? -1 : 1) * (300 + 200 * rng_uniform()));
            if (m % 2 == 0) x[(size_t)m * K] = (float)((rng_uniform() < 0.5 ? -1 : 1) * (300 + 200 * rng_uniform()));
        }
    }
}

static double gelu_ref(double v) { return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }

// ----------------------------------------------------------------------------
// Device helpers

static int cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        printf("FAIL cuda: %s: %s\n", what, cudaGetErrorString(e));
        test_failures++;
        return 0;
    }
    return 1;
}

static void *dev_upload(const void *h, size_t bytes) {
    void *d = NULL;
    if (!cuda_ok(cudaMalloc(&d, bytes ? bytes : 1), "cudaMalloc")) exit(1);
    if (h) cuda_ok(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "upload");
    return d;
}

// W in the kernel's dtype on the device; the host copy is rounded to what the kernel reads.
static void *upload_matrix(float *w, size_t n, DType dt) {
    if (dt == DTYPE_F32) return dev_upload(w, n * 4);
    uint16_t *b = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        b[i] = float_to_bf16(w[i]);
        w[i] = bf16_to_float(b[i]);
    }
    void *d = dev_upload(b, n * 2);
    free(b);
    return d;
}

// Device output (dtype dt, n elements) as floats; NaN (poison) stays NaN.
static float *download(const void *d, size_t n, DType dt) {
    float *h = xmalloc(n * sizeof(float));
    if (dt == DTYPE_F32) {
        cuda_ok(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost), "download");
    } else {
        uint16_t *b = xmalloc(n * 2);
        cuda_ok(cudaMemcpy(b, d, n * 2, cudaMemcpyDeviceToHost), "download");
        for (size_t i = 0; i < n; i++) h[i] = bf16_to_float(b[i]);
        free(b);
    }
    return h;
}

typedef struct {
    double rel_l2, max_rel;  // max_rel: max |err| / rms(ref)
    long long unwritten;     // NaN where a value was expected
} Cmp;

static Cmp compare(const float *out, const double *ref, size_t n) {
    double num = 0, den = 0, maxe = 0;
    long long bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i])) continue;  // not an output element
        if (!isfinite(out[i])) {
            bad++;
            continue;
        }
        double d = out[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
        if (fabs(d) > maxe) maxe = fabs(d);
    }
    Cmp c;
    c.rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    c.max_rel = maxe / (den > 0 ? sqrt(den / (double)n) : 1.0);
    c.unwritten = bad;
    return c;
}

static const char *path_name(LinearPath p) {
    switch (p) {
    case LINEAR_PATH_GEMV: return "gemv";
    case LINEAR_PATH_TILED_XS: return "tiled_xs";
    case LINEAR_PATH_TILED_S: return "tiled_s";
    case LINEAR_PATH_TILED_L: return "tiled_l";
    case LINEAR_PATH_GEMV_TC: return "gemv_tc";
    case LINEAR_PATH_CLUSTER: return "cluster";
    case LINEAR_PATH_SKINNY: return "skinny";
    case LINEAR_PATH_ROWS: return "rows";
    case LINEAR_PATH_ROWS_F32: return "rows_f32";
    default: return "auto";
    }
}

// 1 when the device has thread-block clusters (sm_90 and later): the cluster GEMV runs there.
static int has_clusters;

// How a path rounds the bf16 operand (kernels/linear_kernels.cuh, auto_path for AUTO):
//   0 none (FMA GEMV: fp32 x times bf16 W), 1 tiled (gamma * (x - c) rounded), 2 tensor-core and
//   cluster GEMVs and gemm_rows_ln (the normalised x rounded); auto_rows: AUTO takes gemm_rows_ln.
static int path_rounding(LinearPath p, int M, DType wt, int K, int auto_rows) {
    if (wt != DTYPE_BF16) return 0;
    if (p == LINEAR_PATH_AUTO && auto_rows) return 2;
    if (p == LINEAR_PATH_AUTO) {
        if (has_clusters && M > 4 && M <= 32 && K <= 2048) return 2;
        p = M <= 8 ? LINEAR_PATH_GEMV : (M <= 16 && K <= 2048) ? LINEAR_PATH_GEMV_TC : M <= 16 ? LINEAR_PATH_GEMV : LINEAR_PATH_TILED_S;
    }
    if (p == LINEAR_PATH_GEMV) return 0;
    return p == LINEAR_PATH_GEMV_TC || p == LINEAR_PATH_CLUSTER || p == LINEAR_PATH_ROWS ? 2 : 1;
}

// ----------------------------------------------------------------------------
// fused_ln_linear

typedef struct {
    int M, N, K;
    DType wt, yt;
    Activation act;
    int data;
    LinearPath path;
    // QKV mode (qkv_T > 0): N = 3 * nh * hs = 3K; qkv_pos_dev: the position from device memory
    int qkv_T, qkv_pos, qkv_nh, qkv_max_seq, qkv_pos_dev;
    // strided rows (plain mode): x rows ldx apart (>= K), y rows ldy apart (>= N)
    int ldx, ldy;
    // greedy decoding's pick (plain fp32 mode, no GELU; greedy_pick.h): 1 taken, 2 taken with W row 5
    // copied to rows N / 2 and N - 1 and the three given the largest bias (exact ties: row 5 wins);
    // each then again with ids_only (the same ids, y not written)
    int greedy;
} LnCase;

// The kernels' shift for a row (tiled bf16): mean of the first min(K, 32) values, summed as 8
// quads of 4 then a butterfly over the 8 lanes (linear_kernels.cuh ln_shift).
static float kernel_shift(const float *x, int K) {
    float s[8];
    for (int q = 0; q < 8; q++) {
        float v[4];
        for (int e = 0; e < 4; e++) v[e] = (4 * q + e < K) ? x[4 * q + e] : 0.0f;
        s[q] = ((v[0] + v[1]) + v[2]) + v[3];
    }
    float sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    return sum / (float)(K < 32 ? K : 32);
}

static void run_ln_case(const LnCase *c) {
    const int M = c->M, N = c->N, K = c->K;
    const int ldx = c->ldx ? c->ldx : K;
    const int qkv = c->qkv_T > 0;
    const int ldy = qkv ? N : (c->ldy ? c->ldy : N);
    char name[256];
    snprintf(name, sizeof name, "fused_ln_linear %s->%s %s M=%d N=%d K=%d %s %s%s%s%s", dtype_name(c->wt),
             dtype_name(c->yt), path_name(c->path), M, N, K, c->act == ACT_GELU ? "gelu" : "none",
             data_name[c->data], qkv ? (c->qkv_pos_dev ? " qkv pos_device" : " qkv") : "",
             (ldx != K || ldy != N) ? " strided" : "", c->greedy ? (c->greedy == 2 ? " greedy ties" : " greedy") : "");

    float *x = xcalloc((size_t)M * ldx, sizeof(float));
    float *xr = xmalloc((size_t)M * K * sizeof(float));
    fill_x(xr, M, K, c->data);
    for (int m = 0; m < M; m++) memcpy(x + (size_t)m * ldx, xr + (size_t)m * K, (size_t)K * sizeof(float));
    float *gamma = xmalloc(K * sizeof(float)), *beta = xmalloc(K * sizeof(float));
    for (int k = 0; k < K; k++) gamma[k] = (float)(1.0 + 0.2 * rng_normal()), beta[k] = (float)(0.1 * rng_normal());
    float *W = xmalloc((size_t)N * K * sizeof(float));
    for (size_t i = 0; i < (size_t)N * K; i++) W[i] = (float)(rng_normal() / sqrt((double)K));
    float *bias = xmalloc(N * sizeof(float));
    for (int n = 0; n < N; n++) bias[n] = (float)(0.1 * rng_normal());
    if (c->greedy == 2) {
        const int dup[2] = {N / 2, N - 1};
        bias[5] = 50.0f;
        for (int i = 0; i < 2; i++) {
            memcpy(W + (size_t)dup[i] * K, W + 5 * (size_t)K, (size_t)K * sizeof(float));
            bias[dup[i]] = bias[5];
        }
    }

    void *dW = upload_matrix(W, (size_t)N * K, c->wt);  // W now holds what the kernel reads
    // Folded vectors from the rounded W, in fp64, handed over as fp32 (as ln_fold.cu does).
    float *s = xmalloc(N * sizeof(float)), *b2 = xmalloc(N * sizeof(float));
    for (int n = 0; n < N; n++) {
        double ss = 0, bb = 0;
        for (int k = 0; k < K; k++) ss += (double)W[(size_t)n * K + k] * gamma[k], bb += (double)W[(size_t)n * K + k] * beta[k];
        s[n] = (float)ss;
        b2[n] = (float)(bb + bias[n]);
    }
    float *dx = dev_upload(x, (size_t)M * ldx * 4);
    float *dg = dev_upload(gamma, K * 4), *ds = dev_upload(s, N * 4), *db = dev_upload(b2, N * 4);

    // References: exact LayerNorm (fp64 from the fp32 x) and the kernel-rounding one.
    // AUTO takes gemm_rows_ln where it can (fused_ln_linear.cu): bf16 W and y, plain output.
    const int auto_rows = !qkv && !c->greedy && c->wt == DTYPE_BF16 && c->yt == DTYPE_BF16 && ldx % 4 == 0 &&
                          gemm_rows_ln_takes(M, N, K);
    const int emulate = path_rounding(c->path, M, c->wt, K, auto_rows);
    double *ref_exact = xmalloc((size_t)M * N * sizeof(double)), *ref_kern = xmalloc((size_t)M * N * sizeof(double));
    double *xn = xmalloc(K * sizeof(double)), *a = xmalloc(K * sizeof(double));
    for (int m = 0; m < M; m++) {
        const float *row = xr + (size_t)m * K;
        double mean = 0, var = 0;
        for (int k = 0; k < K; k++) mean += row[k];
        mean /= K;
        for (int k = 0; k < K; k++) var += (row[k] - mean) * (row[k] - mean);
        var /= K;
        const double rstd = 1.0 / sqrt(var + 1e-5);
        const float sh = kernel_shift(row, K);
        for (int k = 0; k < K; k++) {
            xn[k] = (row[k] - mean) * rstd * gamma[k] + beta[k];
            a[k] = emulate == 2 ? round_bf16((float)((row[k] - mean) * rstd * gamma[k])) : round_bf16((row[k] - sh) * gamma[k]);
        }
        const double dmean = mean - sh;
        for (int n = 0; n < N; n++) {
            const float *w = W + (size_t)n * K;
            double e1 = bias[n], e2 = 0;
            for (int k = 0; k < K; k++) e1 += w[k] * xn[k], e2 += w[k] * a[k];
            e2 = emulate == 2 ? e2 + b2[n] : rstd * (e2 - dmean * s[n]) + b2[n];
            if (c->act == ACT_GELU) e1 = gelu_ref(e1), e2 = gelu_ref(e2);
            if (c->yt == DTYPE_BF16) e1 = round_bf16((float)e1), e2 = round_bf16((float)e2);
            ref_exact[(size_t)m * N + n] = e1;
            ref_kern[(size_t)m * N + n] = emulate ? e2 : e1;
        }
    }

    const size_t ysz = dtype_size(c->yt);
    int rc;
    Cmp ck, ce;
    int outside_ok = 1;
    float *yh = NULL;
    int picks_ok = 1;
    if (!qkv) {
        const size_t ny = (size_t)M * ldy;
        void *dy = dev_upload(NULL, ny * ysz);
        cuda_ok(cudaMemset(dy, 0xff, ny * ysz), "poison");
        // Greedy's workspace: next [M] (poisoned), then best [M] and the ticket (zeroed).
        const size_t best_at = ((size_t)M * 4 + 7) / 8 * 8;
        char *dws = c->greedy ? dev_upload(NULL, best_at + (size_t)(M + 1) * 8) : NULL;
        LogitsGreedy greedy = {0};
        if (dws) {
            greedy = (LogitsGreedy){(int *)dws, (unsigned long long *)(dws + best_at), NULL, 0, NULL};
            greedy.ticket = (unsigned *)(greedy.best + M);
            cuda_ok(cudaMemset(dws, 0xff, (size_t)M * 4), "poison");
            cuda_ok(cudaMemset(greedy.best, 0, (size_t)(M + 1) * 8), "zero");
        }
        rc = fused_ln_linear_ex(dx, ldx, dg, dW, c->wt, ds, db, dy, ldy, c->yt, M, N, K, c->act, NULL,
                                dws ? &greedy : NULL, c->path, 0);
        cuda_ok(cudaDeviceSynchronize(), name);
        float *yfull = download(dy, ny, c->yt);
        yh = xmalloc((size_t)M * N * sizeof(float));
        for (int m = 0; m < M; m++) {
            memcpy(yh + (size_t)m * N, yfull + (size_t)m * ldy, (size_t)N * sizeof(float));
            for (int n = N; n < ldy; n++) outside_ok &= isnan(yfull[(size_t)m * ldy + n]);
        }
        if (dws) {  // each row's first maximum of what was written; best and the ticket left zero
            int *next = xmalloc((size_t)M * sizeof(int));
            unsigned long long *ws = xmalloc((size_t)(M + 1) * 8);
            cuda_ok(cudaMemcpy(next, greedy.next, (size_t)M * 4, cudaMemcpyDeviceToHost), "download");
            cuda_ok(cudaMemcpy(ws, greedy.best, (size_t)(M + 1) * 8, cudaMemcpyDeviceToHost), "download");
            for (int m = 0; m < M; m++) {
                int first = 0;
                for (int n = 1; n < N; n++) first = yh[(size_t)m * N + n] > yh[(size_t)m * N + first] ? n : first;
                picks_ok &= next[m] == first && (c->greedy != 2 || first == 5);
            }
            for (int i = 0; i <= M; i++) picks_ok &= ws[i] == 0;
            // Again asking only for the ids (a decode step's call), twice: the same ids, y left as it was.
            LogitsGreedy ids_only = greedy;
            ids_only.ids_only = 1;
            ids_only.next_copy = dev_upload(NULL, (size_t)M * 4);
            cuda_ok(cudaMemset(dy, 0xff, ny * ysz), "poison");
            cuda_ok(cudaMemset(dws, 0xff, (size_t)M * 4), "poison");
            cuda_ok(cudaMemset(ids_only.next_copy, 0xff, (size_t)M * 4), "poison");
            const int rc2 = fused_ln_linear_ex(dx, ldx, dg, dW, c->wt, ds, db, dy, ldy, c->yt, M, N, K, c->act, NULL,
                                               &ids_only, c->path, 0);
            cuda_ok(cudaDeviceSynchronize(), name);
            float *y2 = download(dy, ny, c->yt);
            int *again = xmalloc((size_t)M * sizeof(int)), *copied = xmalloc((size_t)M * sizeof(int));
            cuda_ok(cudaMemcpy(again, greedy.next, (size_t)M * 4, cudaMemcpyDeviceToHost), "download");
            cuda_ok(cudaMemcpy(copied, ids_only.next_copy, (size_t)M * 4, cudaMemcpyDeviceToHost), "download");
            cuda_ok(cudaMemcpy(ws, greedy.best, (size_t)(M + 1) * 8, cudaMemcpyDeviceToHost), "download");
            picks_ok &= rc2 == 0;
            for (size_t i = 0; i < ny; i++) picks_ok &= isnan(y2[i]);
            for (int m = 0; m < M; m++) picks_ok &= again[m] == next[m] && copied[m] == next[m];
            for (int i = 0; i <= M; i++) picks_ok &= ws[i] == 0;
            if (!picks_ok) printf("  %s: row 0 picked %d, with ids only %d\n", name, next[0], again[0]);
            free(next), free(ws), free(y2), free(again), free(copied);
            cudaFree(ids_only.next_copy);
        }
        free(yfull);
        cudaFree(dy), cudaFree(dws);
    } else {
        const int T = c->qkv_T, B = M / T, pos = c->qkv_pos, nh = c->qkv_nh, hs = K / nh, ms = c->qkv_max_seq;
        const size_t ncache = (size_t)B * nh * ms * hs;
        void *dq = dev_upload(NULL, (size_t)M * K * ysz), *dk = dev_upload(NULL, ncache * ysz),
             *dv = dev_upload(NULL, ncache * ysz);
        cuda_ok(cudaMemset(dq, 0xff, (size_t)M * K * ysz), "poison");
        cuda_ok(cudaMemset(dk, 0xff, ncache * ysz), "poison");
        cuda_ok(cudaMemset(dv, 0xff, ncache * ysz), "poison");
        QKVDest dst = {dq, dk, dv, T, pos, nh, hs, ms, NULL};
        int *dpos = NULL;
        if (c->qkv_pos_dev) {  // the host's pos is only the bound; the kernel reads the real one
            dpos = dev_upload(&pos, sizeof pos);
            dst.pos = ms - T;
            dst.pos_device = dpos;
        }
        rc = fused_ln_linear_ex(dx, ldx, dg, dW, c->wt, ds, db, NULL, 0, c->yt, M, N, K, c->act, &dst, NULL, c->path,
                                0);
        cuda_ok(cudaDeviceSynchronize(), name);
        float *qh = download(dq, (size_t)M * K, c->yt), *kh = download(dk, ncache, c->yt),
              *vh = download(dv, ncache, c->yt);
        yh = xmalloc((size_t)M * N * sizeof(float));
        for (int m = 0; m < M; m++) {
            const int b = m / T, t = m % T;
            for (int n = 0; n < N; n++) {
                const int which = n / K, cc = n % K, h = cc / hs, d = cc % hs;
                const size_t ci = (((size_t)b * nh + h) * ms + pos + t) * hs + d;
                yh[(size_t)m * N + n] = which == 0 ? qh[(size_t)m * K + cc] : which == 1 ? kh[ci] : vh[ci];
            }
        }
        for (size_t i = 0; i < ncache; i++) {  // positions outside pos..pos+T-1 untouched
            const int p = (int)((i / hs) % ms);
            if (p < pos || p >= pos + T) outside_ok &= isnan(kh[i]) && isnan(vh[i]);
        }
        free(qh), free(kh), free(vh);
        cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dpos);
    }
    ck = compare(yh, ref_kern, (size_t)M * N);
    ce = compare(yh, ref_exact, (size_t)M * N);
    // A bf16 output near a rounding boundary may round either way against the reference: the
    // fp32 sums and the GELU (tanhf) differ from the fp64 reference's in the last bits, and one ulp
    // is up to 2^-8 of the value. Over a handful of outputs (M = 2, N = 10) a few such elements
    // are most of the norm (H100, 2 runs in 6: rel_l2 1.3e-3, 3.3e-3 with GELU), so bf16 outputs
    // are allowed one ulp each on top: 2^-8.
    const double tol = c->wt == DTYPE_F32 ? 1e-5 : c->yt == DTYPE_BF16 ? 1e-3 + 0.00390625 : 1e-3;
    const double tol_exact = c->wt == DTYPE_F32 ? 1e-5 : 1e-2;
    CHECK(rc == 0 && ck.unwritten == 0 && outside_ok && picks_ok && ck.rel_l2 <= tol && ck.max_rel <= 50 * tol &&
              ce.rel_l2 <= tol_exact,
          name,
          "rc=%d unwritten=%lld outside_ok=%d picks_ok=%d rel_l2=%.3g (tol %.2g) max_rel=%.3g exact_rel_l2=%.3g "
          "(tol %.0e)",
          rc, ck.unwritten, outside_ok, picks_ok, ck.rel_l2, tol, ck.max_rel, ce.rel_l2, tol_exact);
    if (getenv("GPT2_TEST_VERBOSE"))
        printf("  %s: rel_l2 %.3g max_rel %.3g exact %.3g\n", name, ck.rel_l2, ck.max_rel, ce.rel_l2);

    free(x), free(xr), free(gamma), free(beta), free(W), free(bias), free(s), free(b2);
    free(ref_exact), free(ref_kern), free(xn), free(a), free(yh);
    cudaFree(dW), cudaFree(dx), cudaFree(dg), cudaFree(ds), cudaFree(db);
}

// ----------------------------------------------------------------------------
// linear_residual

// A residual product's result out = r0 + x W^T + b (M x K times N x K) checked by its added part,
// out - r0, against fp64 (r0 would hide errors in the sum); *tol: base_tol plus the fp32 add's one
// rounding of |r0| relative to |x W^T + b|.
static Cmp residual_delta(const float *out, const float *r0, const float *x, const float *W, const float *b, int M,
                          int N, int K, double base_tol, double *tol) {
    double *ref = xcalloc((size_t)M * N, sizeof(double));
    float *delta = xcalloc((size_t)M * N, sizeof(float));  // calloc: GCC's -Wmaybe-uninitialized otherwise
    double rr = 0, rd = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const size_t i = (size_t)m * N + n;
            double acc = b[n];
            for (int k = 0; k < K; k++) acc += (double)x[(size_t)m * K + k] * W[(size_t)n * K + k];
            ref[i] = acc;
            delta[i] = (float)((double)out[i] - r0[i]);
            rr += (double)r0[i] * r0[i], rd += acc * acc;
        }
    const Cmp cm = compare(delta, ref, (size_t)M * N);
    *tol = base_tol + 1.2e-7 * sqrt(rr / (rd > 0 ? rd : 1));
    free(ref), free(delta);
    return cm;
}

static void run_res_case(int M, int N, int K, DType dt, LinearPath path, int big) {
    char name[160];
    snprintf(name, sizeof name, "linear_residual %s %s M=%d N=%d K=%d%s", dtype_name(dt), path_name(path), M, N, K,
             big ? " large-magnitude" : "");
    float *x = xmalloc((size_t)M * K * sizeof(float)), *W = xmalloc((size_t)N * K * sizeof(float));
    float *b = xmalloc(N * sizeof(float)), *r0 = xmalloc((size_t)M * N * sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)(rng_normal() * (big ? 300.0 : 1.0));
    for (size_t i = 0; i < (size_t)N * K; i++) W[i] = (float)(rng_normal() / sqrt((double)K));
    for (int n = 0; n < N; n++) b[n] = (float)(0.1 * rng_normal());
    for (size_t i = 0; i < (size_t)M * N; i++) r0[i] = (float)(rng_normal() * (big ? 500.0 : 1.0));
    void *dx = upload_matrix(x, (size_t)M * K, dt), *dW = upload_matrix(W, (size_t)N * K, dt);
    float *db = dev_upload(b, N * 4), *dr = dev_upload(r0, (size_t)M * N * 4);
    int rc = linear_residual_ex(dx, dW, dt, db, dr, M, N, K, path, 0);
    cuda_ok(cudaDeviceSynchronize(), name);
    float *out = download(dr, (size_t)M * N, DTYPE_F32);
    double tol;
    const Cmp cm = residual_delta(out, r0, x, W, b, M, N, K, dt == DTYPE_F32 ? 1e-5 : 1e-4, &tol);
    CHECK(rc == 0 && cm.unwritten == 0 && cm.rel_l2 <= tol && cm.max_rel <= 50 * tol, name,
          "rc=%d unwritten=%lld rel_l2=%.3g (tol %.2g) max_rel=%.3g", rc, cm.unwritten, cm.rel_l2, tol, cm.max_rel);
    if (getenv("GPT2_TEST_VERBOSE")) printf("  %s: rel_l2 %.3g max_rel %.3g\n", name, cm.rel_l2, cm.max_rel);
    free(x), free(W), free(b), free(r0), free(out);
    cudaFree(dx), cudaFree(dW), cudaFree(db), cudaFree(dr);
}

// ----------------------------------------------------------------------------
// The LayerNorm fold (gemm_rows.h): a residual product writing the copy, then the folded product

// The residual product y = x0 + a Wp^T + bp (a: M x Kp, Wp: K x Kp) writing copy = gamma (y - c),
// then gemm_rows_fold of the LayerNorm of y into W (N x K). shift: c = each row's mean of x0 (the
// engine's c: the mean measured before the residual add), else none (0). graph: the two calls
// captured in a CUDA graph (their PDL chain as the engine's decode graphs run it). Checked:
//   y        against fp64 (the residual add's rounding allowed, as run_res_case)
//   copy     bit for bit against bf16(gamma (y - c)) of the y the kernel wrote
//   means    against fp64 means of that y: |err| <= 1e-5 rms(row)
//   output   against the fold in fp64 from the kernel's copy and y (the kernel check: 1e-3 plus an
//            output ulp), and against LayerNorm(y) W^T + b exactly (1e-2, the copy's rounding)
// Outputs and the means past M poisoned first; every element must be written, nothing past M.
// tiles: through gemm_tiles (a prompt's many rows: the statistics from the residual product's parts),
// else gemm_rows.
static void run_fold_case(int M, int Kp, int K, int N, Activation act, int data, int shift, int graph, int tiles) {
    char name[200];
    snprintf(name, sizeof name, "ln fold%s M=%d %d->%d then %d->%d %s %s%s%s", tiles ? " gemm_tiles" : "", M, Kp, K,
             K, N, act == ACT_GELU ? "gelu" : "bias", data_name[data], shift ? " shifted" : "", graph ? " graph" : "");
    float *x0 = xmalloc((size_t)M * K * sizeof(float)), *a = xmalloc((size_t)M * Kp * sizeof(float));
    float *Wp = xmalloc((size_t)K * Kp * sizeof(float)), *bp = xmalloc(K * sizeof(float));
    float *W = xmalloc((size_t)N * K * sizeof(float)), *bias = xmalloc(N * sizeof(float));
    float *gamma = xmalloc(K * sizeof(float)), *beta = xmalloc(K * sizeof(float)), *c = xcalloc(M, sizeof(float));
    fill_x(x0, M, K, data);
    for (size_t i = 0; i < (size_t)M * Kp; i++) a[i] = (float)rng_normal();
    for (size_t i = 0; i < (size_t)K * Kp; i++) Wp[i] = (float)(rng_normal() / sqrt((double)Kp));
    for (size_t i = 0; i < (size_t)N * K; i++) W[i] = (float)(rng_normal() / sqrt((double)K));
    for (int k = 0; k < K; k++) {
        bp[k] = (float)(0.1 * rng_normal());
        gamma[k] = (float)(1.0 + 0.2 * rng_normal()), beta[k] = (float)(0.1 * rng_normal());
    }
    for (int n = 0; n < N; n++) bias[n] = (float)(0.1 * rng_normal());
    for (int m = 0; m < M && shift; m++) {
        double sum = 0;
        for (int k = 0; k < K; k++) sum += x0[(size_t)m * K + k];
        c[m] = (float)(sum / K);
    }
    void *da = upload_matrix(a, (size_t)M * Kp, DTYPE_BF16), *dWp = upload_matrix(Wp, (size_t)K * Kp, DTYPE_BF16);
    void *dW = upload_matrix(W, (size_t)N * K, DTYPE_BF16);
    float *s = xmalloc(N * sizeof(float)), *b2 = xmalloc(N * sizeof(float));  // ln_fold.cu's, from the rounded W
    for (int n = 0; n < N; n++) {
        double ss = 0, bb = 0;
        for (int k = 0; k < K; k++)
            ss += (double)W[(size_t)n * K + k] * gamma[k], bb += (double)W[(size_t)n * K + k] * beta[k];
        s[n] = (float)ss, b2[n] = (float)(bb + bias[n]);
    }
    float *dy = dev_upload(x0, (size_t)M * K * 4), *dbp = dev_upload(bp, K * 4), *dg = dev_upload(gamma, K * 4);
    float *dc = dev_upload(c, M * 4), *ds = dev_upload(s, N * 4), *db = dev_upload(b2, N * 4);
    void *dcopy = dev_upload(NULL, (size_t)M * K * 2), *dout = dev_upload(NULL, (size_t)M * N * 2);
    float *dmean = dev_upload(NULL, (M + 8) * 4), *dparts = dev_upload(NULL, (size_t)M * GEMM_TILES_MAX_PARTS * 2 * 4);
    cuda_ok(cudaMemset(dcopy, 0xff, (size_t)M * K * 2), "poison");
    cuda_ok(cudaMemset(dout, 0xff, (size_t)M * N * 2), "poison");
    cuda_ok(cudaMemset(dmean, 0xff, (M + 8) * 4), "poison");

    cudaStream_t stream;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    const GemmRowsCopy copy = {dcopy, dg, shift ? dc : NULL};
    const GemmRowsFold in = {dy, K, dcopy, shift ? dc : NULL, dmean};
    const MatmulLtEpilogue epi = act == ACT_GELU ? MATMUL_LT_BIAS_GELU : MATMUL_LT_BIAS;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (graph) cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    const GemmTilesCopy tcopy = {dcopy, dg, shift ? dc : NULL, dparts};
    const GemmTilesFold tin = {dcopy, dparts, gemm_tiles_parts(K), shift ? dc : NULL, dmean};
    const cudaError_t e1 = tiles ? gemm_tiles_residual_copy(dy, K, da, dWp, dbp, M, K, Kp, &tcopy, stream)
                                 : gemm_rows_residual_copy(dy, K, da, dWp, dbp, M, K, Kp, &copy, stream);
    const cudaError_t e2 = tiles ? gemm_tiles_fold(epi, dout, N, &tin, dW, ds, db, M, N, K, stream)
                                 : gemm_rows_fold(epi, dout, N, &in, dW, ds, db, M, N, K, stream);
    if (graph) {
        cuda_ok(cudaStreamEndCapture(stream, &g), "end capture");
        if (g && cuda_ok(cudaGraphInstantiate(&ge, g, 0), "instantiate"))
            cuda_ok(cudaGraphLaunch(ge, stream), "launch");
    }
    cuda_ok(cudaStreamSynchronize(stream), name);
    float *y = download(dy, (size_t)M * K, DTYPE_F32), *cp = download(dcopy, (size_t)M * K, DTYPE_BF16);
    float *out = download(dout, (size_t)M * N, DTYPE_BF16), *mean = download(dmean, M + 8, DTYPE_F32);

    // The residual product, as run_res_case's.
    double tol_y;
    const Cmp cy = residual_delta(y, x0, a, Wp, bp, M, K, Kp, 1e-4, &tol_y);
    // The copy bit for bit, the means, then the folded product from them.
    long long copy_bad = 0, mean_bad = 0;
    for (size_t i = 0; i < (size_t)M * K; i++) {
        const int m = (int)(i / K), k = (int)(i % K);
        copy_bad += !(cp[i] == round_bf16((y[i] - c[m]) * gamma[k]));
    }
    for (int m = 0; m < M + 8; m++) {
        if (m >= M) {
            mean_bad += !isnan(mean[m]);
            continue;
        }
        double mu = 0, sq = 0;
        for (int k = 0; k < K; k++)
            mu += y[(size_t)m * K + k], sq += (double)y[(size_t)m * K + k] * y[(size_t)m * K + k];
        mu /= K;
        mean_bad += !(fabs(mean[m] - mu) <= 1e-5 * sqrt(sq / K));
    }
    double *ref = xmalloc((size_t)M * N * sizeof(double)), *ref_exact = xmalloc((size_t)M * N * sizeof(double));
    for (int m = 0; m < M; m++) {
        const float *row = y + (size_t)m * K, *crow = cp + (size_t)m * K;
        double mu = 0, var = 0;
        for (int k = 0; k < K; k++) mu += row[k];
        mu /= K;
        for (int k = 0; k < K; k++) var += (row[k] - mu) * (row[k] - mu);
        const double rstd = 1.0 / sqrt(var / K + 1e-5);
        for (int n = 0; n < N; n++) {
            const float *w = W + (size_t)n * K;
            double e1 = bias[n], e2 = 0;
            for (int k = 0; k < K; k++)
                e1 += w[k] * ((row[k] - mu) * rstd * gamma[k] + beta[k]), e2 += w[k] * (double)crow[k];
            e2 = rstd * (e2 - (mu - c[m]) * s[n]) + b2[n];
            if (act == ACT_GELU) e1 = gelu_ref(e1), e2 = gelu_ref(e2);
            ref_exact[(size_t)m * N + n] = round_bf16((float)e1);
            ref[(size_t)m * N + n] = round_bf16((float)e2);
        }
    }
    const Cmp ck = compare(out, ref, (size_t)M * N), ce = compare(out, ref_exact, (size_t)M * N);
    const double tol = 1e-3 + 0.00390625;
    CHECK(e1 == cudaSuccess && e2 == cudaSuccess && (!graph || ge) && cy.unwritten == 0 && cy.rel_l2 <= tol_y &&
              cy.max_rel <= 50 * tol_y && copy_bad == 0 && mean_bad == 0 && ck.unwritten == 0 && ck.rel_l2 <= tol &&
              ck.max_rel <= 50 * tol && ce.rel_l2 <= 1e-2,
          name,
          "rc %d %d; y rel_l2 %.3g (tol %.2g); copy %lld wrong; means %lld wrong; out unwritten %lld rel_l2 %.3g "
          "(tol %.2g) max_rel %.3g exact_rel_l2 %.3g (tol 1e-2)",
          (int)e1, (int)e2, cy.rel_l2, tol_y, copy_bad, mean_bad, ck.unwritten, ck.rel_l2, tol, ck.max_rel, ce.rel_l2);
    if (getenv("GPT2_TEST_VERBOSE")) printf("  %s: rel_l2 %.3g exact %.3g\n", name, ck.rel_l2, ce.rel_l2);
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    cudaStreamDestroy(stream);
    free(x0), free(a), free(Wp), free(bp), free(W), free(bias), free(gamma), free(beta), free(c), free(s), free(b2);
    free(y), free(cp), free(out), free(mean), free(ref), free(ref_exact);
    cudaFree(da), cudaFree(dWp), cudaFree(dW), cudaFree(dy), cudaFree(dbp), cudaFree(dg), cudaFree(dc), cudaFree(ds);
    cudaFree(db), cudaFree(dcopy), cudaFree(dout), cudaFree(dmean), cudaFree(dparts);
}

// What the fold refuses: its c and its means in one buffer (blocks would read the c that block 0 of
// the columns overwrites), an epilogue other than bias (+ GELU), no copy; past 64 rows or K = 1024.
static void test_fold_refuses(void) {
    float *d = dev_upload(NULL, 1 << 20);
    const GemmRowsFold same = {d, 768, d, d + 4096, d + 4096}, ok = {d, 768, d, d + 4096, d + 8192};
    const GemmRowsFold wide = {d, 1088, d, d + 4096, d + 8192};
    const GemmRowsCopy none = {NULL, d, NULL};
    const cudaError_t e[] = {
        gemm_rows_fold(MATMUL_LT_BIAS, d, 2304, &same, d, d, d, 32, 2304, 768, 0),
        gemm_rows_fold(MATMUL_LT_BIAS_RESIDUAL, d, 2304, &ok, d, d, d, 32, 2304, 768, 0),
        gemm_rows_residual_copy(d, 768, d, d, d, 32, 768, 768, &none, 0),
        gemm_rows_fold(MATMUL_LT_BIAS, d, 64, &ok, d, d, d, 65, 64, 768, 0),
        gemm_rows_fold(MATMUL_LT_BIAS, d, 64, &wide, d, d, d, 32, 64, 1088, 0),
    };
    CHECK(e[0] == cudaErrorInvalidValue && e[1] == cudaErrorInvalidValue && e[2] == cudaErrorInvalidValue &&
              e[3] == cudaErrorNotSupported && e[4] == cudaErrorNotSupported && !gemm_rows_fold_takes(65, 64, 768) &&
              !gemm_rows_fold_takes(32, 64, 1088) && gemm_rows_fold_takes(64, 3072, 768),
          "ln fold refuses what it cannot run", "got %d %d %d %d %d", e[0], e[1], e[2], e[3], e[4]);
    // gemm_tiles's: no parts, parts of no columns, c and means in one buffer, the residual epilogue, no
    // copy's parts (invalid); a product it does not run (not supported).
    const GemmTilesFold tok = {d, d + 4096, 16, d + 8192, d + 12288}, tnone = {d, NULL, 16, NULL, NULL};
    const GemmTilesFold tzero = {d, d + 4096, 0, NULL, NULL}, tsame = {d, d + 4096, 16, d + 8192, d + 8192};
    const GemmTilesCopy tnoparts = {d, d, NULL, NULL};
    const cudaError_t t[] = {
        gemm_tiles_fold(MATMUL_LT_BIAS, d, 2304, &tnone, d, d, d, 1024, 2304, 768, 0),
        gemm_tiles_fold(MATMUL_LT_BIAS, d, 2304, &tzero, d, d, d, 1024, 2304, 768, 0),
        gemm_tiles_fold(MATMUL_LT_BIAS, d, 2304, &tsame, d, d, d, 1024, 2304, 768, 0),
        gemm_tiles_fold(MATMUL_LT_BIAS_RESIDUAL, d, 2304, &tok, d, d, d, 1024, 2304, 768, 0),
        gemm_tiles_residual_copy(d, 768, d, d, d, 1024, 768, 768, &tnoparts, 0),
        gemm_tiles_fold(MATMUL_LT_BIAS, d, 4096, &tok, d, d, d, 1024, 4096, 1024, 0),
    };
    CHECK(t[0] == cudaErrorInvalidValue && t[1] == cudaErrorInvalidValue && t[2] == cudaErrorInvalidValue &&
              t[3] == cudaErrorInvalidValue && t[4] == cudaErrorInvalidValue && t[5] == cudaErrorNotSupported,
          "gemm_tiles's fold refuses what it cannot run", "got %d %d %d %d %d %d", t[0], t[1], t[2], t[3], t[4],
          t[5]);
    cudaFree(d);
}

// The fold through gemm_tiles at a prompt's rows: the attention projection into qkv at 300 rows (32
// blocks a row tile: the projection's pairs finish half the rows each) and at 513 (the last of 5 row
// tiles one row deep) on outlier channels with c, the MLP projection into fc at 200 (2 row tiles, fc
// 48 wide) and at 1024 on offset rows (mean 100) with c, in a graph.
static void test_tiles_fold(int small) {
    if (!gemm_tiles_available()) {
        test_skip("ln fold, gemm_tiles", "gemm_tiles needs an sm_90 device and an sm_90a build");
        return;
    }
    run_fold_case(300, 768, 768, 2304, ACT_NONE, DATA_OUTLIER, 1, 0, 1);
    run_fold_case(200, 3072, 768, 3072, ACT_GELU, DATA_OFFSET, 1, 1, 1);
    if (small) return;
    run_fold_case(513, 768, 768, 2304, ACT_NONE, DATA_OUTLIER, 1, 0, 1);
    run_fold_case(1024, 3072, 768, 3072, ACT_GELU, DATA_OFFSET, 1, 1, 1);
}

// Bad arguments come back as cudaErrorInvalidValue, nothing launched.
static void test_bad_args(void) {
    float *d = dev_upload(NULL, 4096);
    int e1 = fused_ln_linear(d, d, d, DTYPE_F32, d, d, d, DTYPE_F32, 1, 0, 8, ACT_NONE, NULL, 0);
    QKVDest bad = {d, d, d, 1, 0, 2, 4, 8, NULL};  // N = 10 != 3 * 8
    int e2 = fused_ln_linear(d, d, d, DTYPE_F32, d, d, NULL, DTYPE_F32, 1, 10, 8, ACT_NONE, &bad, 0);
    int e3 = linear_residual(d, d, (DType)7, d, d, 1, 8, 8, 0);
    int e4 = fused_ln_linear(d, d, d, DTYPE_F32, d, d, d, DTYPE_F32, 0, 8, 8, ACT_NONE, NULL, 0);  // M=0: nothing
    // The skinny kernel is a bf16 plain linear: not with a LayerNorm, not in fp32.
    int e5 = fused_ln_linear_ex(d, 8, d, d, DTYPE_BF16, d, d, d, 8, DTYPE_F32, 2, 8, 8, ACT_NONE, NULL,
                                NULL, LINEAR_PATH_SKINNY, 0);
    int e6 = linear_residual_ex(d, d, DTYPE_F32, d, d, 2, 8, 8, LINEAR_PATH_SKINNY, 0);
    // The cluster GEMV takes the LayerNorm ops only.
    int e7 = linear_residual_ex(d, d, DTYPE_BF16, d, d, 8, 8, 8, LINEAR_PATH_CLUSTER, 0);
    // Greedy's pick: the GEMV's fp32 output without GELU only.
    const LogitsGreedy g = {(int *)d, (unsigned long long *)d + 8, (unsigned *)d + 32, 0, NULL};
    int e8 = fused_ln_linear_ex(d, 8, d, d, DTYPE_BF16, d, d, d, 8, DTYPE_BF16, 2, 8, 8, ACT_NONE, NULL, &g,
                                LINEAR_PATH_GEMV, 0);
    int e9 = fused_ln_linear_ex(d, 8, d, d, DTYPE_BF16, d, d, d, 8, DTYPE_F32, 2, 8, 8, ACT_GELU, NULL, &g,
                                LINEAR_PATH_GEMV, 0);
    int e10 = fused_ln_linear_ex(d, 8, d, d, DTYPE_BF16, d, d, d, 8, DTYPE_F32, 2, 8, 8, ACT_NONE, NULL, &g,
                                 LINEAR_PATH_TILED_XS, 0);
    // gemm_rows_ln's path: bf16 W and y, plain output, the LayerNorm ops only; K a multiple of 64 to 1280.
    QKVDest qkv = {d, d, d, 1, 0, 2, 32, 8, NULL};
    int e11 = fused_ln_linear_ex(d, 64, d, d, DTYPE_BF16, d, d, d, 64, DTYPE_F32, 2, 64, 64, ACT_NONE, NULL, NULL,
                                 LINEAR_PATH_ROWS, 0);
    int e12 = fused_ln_linear_ex(d, 64, d, d, DTYPE_BF16, d, d, NULL, 0, DTYPE_BF16, 1, 192, 64, ACT_NONE, &qkv, NULL,
                                 LINEAR_PATH_ROWS, 0);
    int e13 = linear_residual_ex(d, d, DTYPE_BF16, d, d, 2, 64, 64, LINEAR_PATH_ROWS, 0);
    int e14 = fused_ln_linear_ex(d, 96, d, d, DTYPE_BF16, d, d, d, 64, DTYPE_BF16, 2, 64, 96, ACT_NONE, NULL, NULL,
                                 LINEAR_PATH_ROWS, 0);
    int e19 = fused_ln_linear_ex(d, 1344, d, d, DTYPE_BF16, d, d, d, 64, DTYPE_BF16, 2, 64, 1344, ACT_NONE, NULL,
                                 NULL, LINEAR_PATH_ROWS, 0);
    // The fp32 rows kernel: fp32 W, the LayerNorm ops only, K a multiple of 4 whose block fits.
    int e15 = fused_ln_linear_ex(d, 64, d, d, DTYPE_BF16, d, d, d, 64, DTYPE_F32, 2, 64, 64, ACT_NONE, NULL, NULL,
                                 LINEAR_PATH_ROWS_F32, 0);
    int e16 = fused_ln_linear_ex(d, 66, d, d, DTYPE_F32, d, d, d, 64, DTYPE_F32, 2, 64, 66, ACT_NONE, NULL, NULL,
                                 LINEAR_PATH_ROWS_F32, 0);
    int e17 = fused_ln_linear_ex(d, 4000, d, d, DTYPE_F32, d, d, d, 64, DTYPE_F32, 2, 64, 4000, ACT_NONE, NULL, NULL,
                                 LINEAR_PATH_ROWS_F32, 0);
    int e18 = linear_residual_ex(d, d, DTYPE_F32, d, d, 2, 64, 64, LINEAR_PATH_ROWS_F32, 0);
    CHECK(e1 == cudaErrorInvalidValue && e2 == cudaErrorInvalidValue && e3 == cudaErrorInvalidValue && e4 == 0 &&
              e5 == cudaErrorInvalidValue && e6 == cudaErrorInvalidValue && e7 == cudaErrorInvalidValue &&
              e8 == cudaErrorInvalidValue && e9 == cudaErrorInvalidValue && e10 == cudaErrorInvalidValue &&
              e11 == cudaErrorInvalidValue && e12 == cudaErrorInvalidValue && e13 == cudaErrorInvalidValue &&
              e14 == cudaErrorNotSupported && e15 == cudaErrorInvalidValue && e16 == cudaErrorInvalidValue &&
              e17 == cudaErrorInvalidValue && e18 == cudaErrorInvalidValue && e19 == cudaErrorNotSupported,
          "fused linear bad arguments", "got %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d", e1, e2, e3, e4,
          e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15, e16, e17, e18, e19);
    cudaFree(d);
}

int main(void) {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        char why[200];
        snprintf(why, sizeof why, "no GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        test_skip("test_fused_linear", why);
        return 0;
    }
    const char *seed_env = getenv("GPT2_TEST_SEED");
    rng_state = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("# test_fused_linear seed %llu (GPT2_TEST_SEED to repeat)\n", (unsigned long long)rng_state);
    // GPT2_TEST_SMALL: fewer and smaller cases, for runs under compute-sanitizer.
    const int small = getenv("GPT2_TEST_SMALL") != NULL;
    // GPT2_TEST_ONLY=gemm_tiles: its fold cases alone (compute-sanitizer's racecheck runs unfiltered:
    // filtered to one kernel it faults in the others, docs/PERF.md "Session 32").
    const char *only = getenv("GPT2_TEST_ONLY");
    if (only && !strcmp(only, "gemm_tiles")) {
        test_tiles_fold(small);
        return test_exit_code();
    }
    const int nshapes = small ? 4 : 9;
    int cc_major = 0;
    cuda_ok(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0), "compute capability");
    has_clusters = cc_major >= 9;
    if (!has_clusters) test_skip("fused linear, cluster path", "the device has no thread-block clusters (before sm_90)");

    // bf16 runs all seven paths (the last two are bf16 only; the cluster GEMV needs sm_90), fp32 the first five.
    const LinearPath paths[] = {LINEAR_PATH_GEMV, LINEAR_PATH_TILED_XS, LINEAR_PATH_TILED_S, LINEAR_PATH_TILED_L,
                                LINEAR_PATH_AUTO, LINEAR_PATH_GEMV_TC, LINEAR_PATH_CLUSTER};
    const int npaths_bf16 = has_clusters ? 7 : 6;
    // The last three: the decode GEMV at GPT-2's fc (one row, one group per warp), a W of three
    // groups of long rows (K split over all 8 warps of a block, uneven slices), and batch-8 decode.
    const int shapes[][3] = {{1, 300, 96},    {3, 77, 100},   {17, 300, 97},  {130, 300, 96}, {16, 1024, 768},
                             {64, 200, 768},  {1, 3072, 768}, {2, 10, 2000},  {8, 500, 768}};
    int ci = 0;
    for (int wt = 0; wt < 2; wt++)
        for (int p = 0; p < (wt ? npaths_bf16 : 5); p++)
            for (int si = 0; si < nshapes; si++, ci++) {
                LnCase c = {0};
                c.M = shapes[si][0], c.N = shapes[si][1], c.K = shapes[si][2];
                c.wt = (DType)wt;
                c.yt = (ci % 3 == 0) ? DTYPE_F32 : c.wt;
                c.act = (ci % 2) ? ACT_GELU : ACT_NONE;
                c.data = ci % 3;
                c.path = paths[p];
                run_ln_case(&c);
            }
    // Numerics: offset rows and outlier channels at GPT-2's width, every path, at one row (a decode
    // step's GEMV) and at 33.
    for (int wt = 0; wt < 2; wt++)
        for (int p = 0; p < (wt ? npaths_bf16 : 5); p++)
            for (int d = DATA_OFFSET; d <= DATA_OUTLIER; d++)
                for (int M = 1; M <= 33; M += 32) {
                    LnCase c = {0};
                    c.M = M, c.N = small ? 40 : 256, c.K = 768, c.wt = (DType)wt, c.yt = c.wt, c.act = ACT_GELU;
                    c.data = d, c.path = paths[p];
                    run_ln_case(&c);
                }
    // QKV into the cache: decode-like (B=2, 16 and 64, T=1) and prefill-like (B=2, T=65) steps.
    for (int wt = 0; wt < 2; wt++)
        for (int p = 0; p < 4; p++) {
            LnCase c = {0};
            c.qkv_pos_dev = p >= 2;
            c.K = 96, c.N = 288, c.qkv_nh = 3, c.wt = (DType)wt, c.yt = c.wt, c.act = ACT_NONE, c.data = DATA_OUTLIER;
            c.path = LINEAR_PATH_AUTO;
            if (p != 1) c.qkv_T = 1, c.M = p == 3 ? 64 : p ? 16 : 2, c.qkv_pos = 7, c.qkv_max_seq = 16;
            else c.qkv_T = 65, c.M = 130, c.qkv_pos = 3, c.qkv_max_seq = 80;
            run_ln_case(&c);
        }
    // Strided rows (the logits of each sequence's last token), fp32 logits.
    for (int wt = 0; wt < 2; wt++)
        for (int p = 0; p < 2; p++) {
            LnCase c = {0};
            c.M = p ? 40 : 4, c.N = 300, c.K = 96, c.ldx = 5 * 96, c.ldy = 307, c.wt = (DType)wt, c.yt = DTYPE_F32;
            c.act = ACT_NONE, c.data = DATA_NORMAL, c.path = LINEAR_PATH_AUTO;
            run_ln_case(&c);
        }
    // Greedy decoding's pick inside the GEMV: GPT-2 124M's logits at one row (two blocks an SM, six
    // rounds), strided rows with exact ties, 16 rows (NPW 2) and 20 (two launches of 16 and 4 rows,
    // one ticket), through the GEMV path and AUTO.
    const int gshapes[][5] = {{1, 50257, 768, 0, 0}, {3, 300, 96, 1, 0}, {16, 1000, 768, 1, 0}, {20, 77, 100, 1, 1}};
    for (int wt = 0; wt < 2; wt++)
        for (int gi = small ? 1 : 0; gi < 4; gi++) {  // {M, N, K, ties, AUTO}
            LnCase c = {0};
            c.M = gshapes[gi][0], c.N = gshapes[gi][1], c.K = gshapes[gi][2], c.greedy = 1 + gshapes[gi][3];
            if (gi == 1) c.ldx = 5 * c.K, c.ldy = c.N + 7;
            c.wt = (DType)wt, c.yt = DTYPE_F32, c.act = ACT_NONE, c.data = gi % 3;
            c.path = gshapes[gi][4] ? LINEAR_PATH_AUTO : LINEAR_PATH_GEMV;
            run_ln_case(&c);
        }

    // The last three: GPT-2's MLP projection at one row (K split over 4 warps), a few odd long rows,
    // and the projection at batch-8 decode; bf16 on the first six paths (the cluster GEMV takes the
    // LayerNorm ops only).
    const int rshapes[][3] = {{1, 300, 96},     {3, 77, 100},    {17, 300, 97},   {130, 300, 96}, {16, 768, 3072},
                              {200, 192, 768}, {1, 768, 3072}, {5, 13, 1000},  {8, 768, 3072}};
    for (int wt = 0; wt < 2; wt++)
        for (int p = 0; p < (wt ? 6 : 5); p++)
            for (int si = 0; si < nshapes; si++)
                run_res_case(rshapes[si][0], rshapes[si][1], rshapes[si][2], (DType)wt, paths[p], si == 2 || si == 5);
    // The cluster GEMV at batched-decode shapes: GPT-2 124M's qkv and fc at 64 and 40 rows (rows of
    // x broadcast through the cluster) and 5 rows of 1024-wide ones.
    if (has_clusters) {
        const int lshapes[][4] = {{64, 2304, 768, ACT_NONE}, {40, 3072, 768, ACT_GELU}, {5, 2304, 1024, ACT_NONE}};
        for (int si = small ? 2 : 0; si < 3; si++) {
            LnCase c = {0};
            c.M = lshapes[si][0], c.N = lshapes[si][1], c.K = lshapes[si][2], c.act = (Activation)lshapes[si][3];
            c.wt = DTYPE_BF16, c.yt = DTYPE_BF16, c.data = si == 0 ? DATA_OUTLIER : DATA_NORMAL;
            c.path = LINEAR_PATH_CLUSTER;
            run_ln_case(&c);
        }
    }
    // The skinny kernel (bf16 plain linear, W in shared memory before the PDL wait): GPT-2 124M's
    // projections at 64 rows (K split over a cluster of 8 where the device has clusters), rows that
    // half fill a row tile, K not a multiple of 8 (plain loads), more than 64 rows (row tiles), a
    // few rows of long ones, long rows of a one-tile N (a split of eight, the last slice short), and
    // batch-16 and batch-8 decode (16-row tiles).
    // The attention projection at 64 and 24 rows (K split eight ways) has two warps share the rows.
    const int sshapes[][3] = {{64, 768, 768}, {64, 768, 3072}, {33, 300, 97},   {130, 77, 100}, {5, 13, 1000},
                              {64, 9, 5000},  {16, 768, 3072}, {8, 768, 768},   {24, 768, 768}};
    for (int si = small ? 2 : 0; si < 9; si++)
        run_res_case(sshapes[si][0], sshapes[si][1], sshapes[si][2], DTYPE_BF16, LINEAR_PATH_SKINNY, si == 1);
    // gemm_rows_ln (Hopper): GPT-2 124M's qkv and fc at 1, 16 and 64 rows, 355M's fc (K = 1024) at
    // 17 and 33 rows (two row blocks), 774M's qkv and fc (K = 1280, ten float4s a lane) at 1 and 16
    // rows, K = 1088 (ten float4s, the last of most lanes past the row) at 9 and 24 rows (a 32-row
    // tile: at 1280 only 16 fit), a partial column block and short rows (one k slice), strided rows,
    // offset rows and outlier channels, GELU or not. The blocks share the rows' staging in clusters
    // of 2 or 4 along the columns (2 at 1-16 rows of K <= 768; 40 rows of N = 130, 3 and 5 of N = 100,
    // 9 of N = 200: grids padded to whole clusters); GPT2_LN_CLUSTER=1, 2 or 4 forces one size on
    // every case.
    if (gemm_rows_ln_takes(64, 4096, 1024)) {
        const int wshapes[][5] = {{1, 2304, 768, ACT_NONE, DATA_OUTLIER},  {16, 3072, 768, ACT_GELU, DATA_OFFSET},
                                  {64, 2304, 768, ACT_NONE, DATA_NORMAL},  {64, 3072, 768, ACT_GELU, DATA_OUTLIER},
                                  {17, 4096, 1024, ACT_GELU, DATA_NORMAL}, {33, 4096, 1024, ACT_NONE, DATA_OFFSET},
                                  {3, 100, 64, ACT_GELU, DATA_NORMAL},     {40, 130, 128, ACT_NONE, DATA_OUTLIER},
                                  {16, 4096, 1024, ACT_GELU, DATA_OUTLIER}, {5, 100, 832, ACT_NONE, DATA_OFFSET},
                                  {1, 3840, 1280, ACT_NONE, DATA_OUTLIER}, {16, 5120, 1280, ACT_GELU, DATA_OFFSET},
                                  {9, 200, 1088, ACT_GELU, DATA_NORMAL},   {24, 640, 1088, ACT_NONE, DATA_OUTLIER}};
        const int nw = (int)(sizeof(wshapes) / sizeof(wshapes[0]));
        for (int si = small ? 4 : 0; si < nw; si++)
            for (int strided = 0; strided < 2; strided++) {
                LnCase c = {0};
                c.M = wshapes[si][0], c.N = wshapes[si][1], c.K = wshapes[si][2], c.act = (Activation)wshapes[si][3];
                c.wt = DTYPE_BF16, c.yt = DTYPE_BF16, c.data = wshapes[si][4], c.path = LINEAR_PATH_ROWS;
                if (strided) c.ldx = 3 * c.K, c.ldy = c.N + 8;
                run_ln_case(&c);
            }
    } else {
        test_skip("fused linear, rows path", "gemm_rows_ln needs an sm_90 device and an sm_90a build");
    }
    // The LayerNorm fold (Hopper): GPT-2 124M's attention projection into fc and its MLP projection (K
    // split over a cluster) into qkv at 64 and 33 rows (odd: two row tiles, the second part empty);
    // 355M's width (K = 1024) at 17 rows; a partial column block in a padded cluster (N = 130) at 5
    // rows; rows of one k slice (K = 64: lanes past the row). Offset rows (mean 100) with c and
    // outlier channels; c = 0 on rows of mean ~0.3 (layer 0's copy); one chain in a CUDA graph.
    if (gemm_rows_fold_takes(64, 3072, 768)) {
        const int fshapes[][8] = {{64, 768, 768, 3072, ACT_GELU, DATA_OUTLIER, 1, 0},
                                  {33, 3072, 768, 2304, ACT_NONE, DATA_OFFSET, 1, 1},
                                  {17, 1024, 1024, 4096, ACT_GELU, DATA_NORMAL, 0, 0},
                                  {5, 192, 128, 130, ACT_NONE, DATA_OFFSET, 1, 0},
                                  {40, 64, 64, 200, ACT_GELU, DATA_NORMAL, 0, 1},
                                  {64, 3072, 768, 2304, ACT_NONE, DATA_NORMAL, 0, 1}};
        for (int si = small ? 3 : 0; si < 6; si++)
            run_fold_case(fshapes[si][0], fshapes[si][1], fshapes[si][2], fshapes[si][3], (Activation)fshapes[si][4],
                          fshapes[si][5], fshapes[si][6], fshapes[si][7], 0);
        test_fold_refuses();
    } else {
        test_skip("ln fold", "gemm_rows_fold needs an sm_90 device and an sm_90a build");
    }
    test_tiles_fold(small);
    // The fp32 rows kernel: GPT-2 124M's qkv and fc at 2, 16 and 64 rows and 355M's fc (K = 1024) at 32
    // and 33; each launch's tile of rows (16, 32, 64) with each block width (32, 24: on 132 SMs,
    // 24 from 32 rows where N < ~3200) and a partial last column block; K ending inside a chunk (W's
    // row padding then read as zeros) with the ring wrapping; more rows than a launch takes (slices of
    // 64); strided rows, offset rows and outlier channels, GELU or not. The small set (sanitizers)
    // starts at index 7.
    const int fshapes[][5] = {{2, 2304, 768, ACT_NONE, DATA_OUTLIER},  {16, 3072, 768, ACT_GELU, DATA_OFFSET},
                              {64, 3072, 768, ACT_GELU, DATA_OUTLIER}, {33, 4096, 1024, ACT_NONE, DATA_NORMAL},
                              {32, 4096, 1024, ACT_GELU, DATA_OUTLIER}, {20, 4100, 900, ACT_NONE, DATA_OFFSET},
                              {40, 4100, 900, ACT_GELU, DATA_OUTLIER},  {5, 77, 100, ACT_GELU, DATA_OFFSET},
                              {130, 300, 388, ACT_NONE, DATA_OUTLIER},  {40, 70, 120, ACT_GELU, DATA_NORMAL},
                              {24, 200, 264, ACT_GELU, DATA_OFFSET}};
    for (int si = small ? 7 : 0; si < 11; si++)
        for (int strided = 0; strided < 2; strided++) {
            LnCase c = {0};
            c.M = fshapes[si][0], c.N = fshapes[si][1], c.K = fshapes[si][2], c.act = (Activation)fshapes[si][3];
            c.wt = DTYPE_F32, c.yt = DTYPE_F32, c.data = fshapes[si][4];
            c.path = LINEAR_PATH_ROWS_F32;
            if (strided) c.ldx = 2 * c.K + 4, c.ldy = c.N + 3;
            run_ln_case(&c);
        }
    test_bad_args();
    return test_exit_code();
}

#else

int main(void) {
    test_skip("test_fused_linear", "no GPU (built without CUDA)");
    return 0;
}

#endif
