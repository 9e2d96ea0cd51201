// kernels/fused_attention.cu against a host fp64 reference (explicit softmax over the masked
// scores), on fresh random data every run (the seed is printed), over awkward shapes: T = 1..5
// (decode, incl. a split chunk that holds no key of query 0), prefill with pos > 0, max_seq not a
// multiple of any tile, HS = 20..128, NH = 1..25, B = 1..64, scores of +-hundreds (a softmax
// without a running max overflows there), no / too small workspace. Every one-token decode case and
// every bf16 prefill case also runs through fused_attention_qkv (q, k, v read from the qkv product's
// rows), which must match fused_attention bit for bit and fill the cache as the split does. On a
// Hopper GPU the bf16 prefill cases of HS = 64 run on wgmma and then again on mma.sync.
//
// Tolerances (rel_l2 = |out - ref| / |ref| over the whole output):
//   fp32  1e-5; 2e-4 for the large-magnitude cases, where q.k ~ 300 carries an fp32 rounding of
//         ~1e-4 absolute into every exponent (any fp32 implementation, the cuBLAS one included).
//   bf16  1e-2 against a reference fed the same bf16-rounded q, k, v: the rest is the output's own
//         bf16 rounding (2^-9) and P rounded to bf16 before P.V on the tensor cores.
// The cache past pos + T is NaN and the output is NaN-poisoned, with a poisoned guard after it:
// reading an unfilled position, leaving an element unwritten or writing past the end all fail.
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if GPT2_CUDA
#include <cuda_runtime_api.h>

#include "fused_attention.h"

static uint64_t rng_state;
static double urand(void) {  // uniform in [-1, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

typedef struct {
    int B, T, pos, NH, HS, max_seq;
    double amp;  // q and k uniform in [-amp, amp): amp 30 gives scores of +-hundreds
    int ws;      // 1 full workspace, 0 none, 2 a workspace too small for the preferred split
    int dev_pos; // 1: the position comes from device memory (a decode graph), the split laid out for S - T
} Case;

#define GUARD 256  // poisoned elements after the output

// The kernel choice a case runs under, part of its name: "" the defaults; "merge=0" / "merge=8" how
// one-token decode merges its splits (GPT2_ATTN_CLUSTER, kernels/fused_attention.cu: by default
// inside a cluster of up to 16 blocks on sm_90 and later, else through the workspace; 0 through the
// workspace, 8 clusters of up to 8, the portable size); "wgmma=0" the bf16 prefill on mma.sync where
// it would run on wgmma (GPT2_ATTN_WGMMA: HS = 64 on compute capability 9.0).
static const char *setting = "";

// fused_attention_qkv on the same case (decode of one token, bf16 prefill): q, k, v of the new tokens
// packed as the qkv product's rows [B*T, 3C], the cache holding only the prefix (the new positions
// NaN), the same workspace size and device position. Must give the output fused_attention gave (bit
// for bit: the same kernel over the same values), twice (the split counters left at zero), and leave
// the cache exactly as the split would have (hk, hv: the new positions filled, the rest untouched).
static void check_qkv(const Case *c, DType dt, const void *hq, const void *hk, const void *hv, const void *hout,
                      size_t ws_bytes, int host_pos) {
    const int B = c->B, T = c->T, pos = c->pos, NH = c->NH, HS = c->HS, S = c->max_seq, C = NH * HS;
    const size_t nq = (size_t)B * T * C, nkv = (size_t)B * NH * S * HS, es = dtype_size(dt);
    char name[200];
    snprintf(name, sizeof name, "fused_attention_qkv %s B=%d T=%d pos=%d NH=%d HS=%d max_seq=%d%s%s%s%s%s",
             dtype_name(dt), B, T, pos, NH, HS, S, c->amp > 1 ? " large" : "",
             c->ws == 0 ? " no-ws" : c->ws == 2 ? " small-ws" : "", c->dev_pos ? " device-pos" : "",
             *setting ? " " : "", setting);
    char *qkv = xmalloc(nq * 3 * es), *k0 = xmalloc(nkv * es), *v0 = xmalloc(nkv * es);
    memcpy(k0, hk, nkv * es);
    memcpy(v0, hv, nkv * es);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const size_t row = ((size_t)b * T + t) * 3 * C, at = (((size_t)b * NH + h) * S + pos + t) * HS;
                memcpy(qkv + (row + h * HS) * es, (const char *)hq + (((size_t)b * T + t) * C + h * HS) * es, HS * es);
                memcpy(qkv + (row + C + h * HS) * es, k0 + at * es, HS * es);
                memcpy(qkv + (row + 2 * C + h * HS) * es, v0 + at * es, HS * es);
                memset(k0 + at * es, 0xff, HS * es);  // NaN: the call must write it
                memset(v0 + at * es, 0xff, HS * es);
            }
    void *dqkv = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dws = NULL;
    int *dpos = NULL;
    int ok = cudaMalloc(&dqkv, nq * 3 * es) == cudaSuccess && cudaMalloc(&dk, nkv * es) == cudaSuccess &&
             cudaMalloc(&dv, nkv * es) == cudaSuccess && cudaMalloc(&dout, (nq + GUARD) * es) == cudaSuccess &&
             (ws_bytes == 0 || (cudaMalloc(&dws, ws_bytes) == cudaSuccess &&
                                cudaMemset(dws, 0, ws_bytes) == cudaSuccess)) &&
             (!c->dev_pos || (cudaMalloc((void **)&dpos, sizeof(int)) == cudaSuccess &&
                              cudaMemcpy(dpos, &pos, sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess)) &&
             cudaMemcpy(dqkv, qkv, nq * 3 * es, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(dk, k0, nkv * es, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(dv, v0, nkv * es, cudaMemcpyHostToDevice) == cudaSuccess;
    int rc = -1;
    for (int call = 0; ok && call < 2 && rc <= 0; call++)
        rc = cudaMemset(dout, 0xff, (nq + GUARD) * es) == cudaSuccess
                 ? fused_attention_qkv(dqkv, dk, dv, dout, dt, B, T, host_pos, dpos, NH, HS, S, dws, ws_bytes, 0)
                 : -1;
    const cudaError_t se = cudaDeviceSynchronize();
    char *out = xmalloc((nq + GUARD) * es);
    if (!ok || rc != 0 || se != cudaSuccess || cudaMemcpy(out, dout, (nq + GUARD) * es, cudaMemcpyDeviceToHost) ||
        cudaMemcpy(k0, dk, nkv * es, cudaMemcpyDeviceToHost) || cudaMemcpy(v0, dv, nkv * es, cudaMemcpyDeviceToHost)) {
        CHECK(0, name, "setup %d, fused_attention_qkv returned %d, sync %s", ok, rc, cudaGetErrorString(se));
    } else {
        size_t out_differ = 0, cache_differ = 0;
        for (size_t i = 0; i < nq + GUARD; i++)
            out_differ += memcmp(out + i * es, (const char *)hout + i * es, es) != 0;
        for (size_t i = 0; i < nkv; i++)
            cache_differ += (memcmp(k0 + i * es, (const char *)hk + i * es, es) != 0) +
                            (memcmp(v0 + i * es, (const char *)hv + i * es, es) != 0);
        CHECK(out_differ == 0 && cache_differ == 0, name,
              "%zu of %zu outputs differ from fused_attention's, %zu cache elements from the split's", out_differ, nq,
              cache_differ);
    }
    cudaFree(dqkv), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dws), cudaFree(dpos);
    cudaGetLastError();
    free(qkv), free(k0), free(v0), free(out);
}

static int run_case(const Case *c, DType dt) {
    const int B = c->B, T = c->T, pos = c->pos, NH = c->NH, HS = c->HS, S = c->max_seq, L = pos + T;
    const int C = NH * HS;
    const size_t nq = (size_t)B * T * C, nkv = (size_t)B * NH * S * HS;
    const size_t es = dtype_size(dt);
    char name[200];
    snprintf(name, sizeof name, "fused_attention %s B=%d T=%d pos=%d NH=%d HS=%d max_seq=%d%s%s%s%s", dtype_name(dt),
             B, T, pos, NH, HS, S, c->amp > 1 ? " large" : "", c->ws == 0 ? " no-ws" : c->ws == 2 ? " small-ws" : "",
             *setting ? " " : "", setting);

    float *q = xmalloc(nq * sizeof(float)), *k = xmalloc(nkv * sizeof(float)), *v = xmalloc(nkv * sizeof(float));
    for (size_t i = 0; i < nq; i++) q[i] = (float)(c->amp * urand());
    for (size_t bh = 0; bh < (size_t)B * NH; bh++)
        for (int p = 0; p < S; p++)
            for (int d = 0; d < HS; d++) {
                size_t i = (bh * S + p) * HS + d;
                k[i] = p < L ? (float)(c->amp * urand()) : NAN;  // never to be read
                v[i] = p < L ? (float)urand() : NAN;
            }
    // Device copies in the compute dtype; the reference sees exactly the values uploaded.
    void *hq = xmalloc(nq * es), *hk = xmalloc(nkv * es), *hv = xmalloc(nkv * es);
    if (dt == DTYPE_BF16) {
        uint16_t *a = hq, *b = hk, *d = hv;
        for (size_t i = 0; i < nq; i++) { a[i] = float_to_bf16(q[i]); q[i] = bf16_to_float(a[i]); }
        for (size_t i = 0; i < nkv; i++) {
            b[i] = float_to_bf16(k[i]); k[i] = bf16_to_float(b[i]);
            d[i] = float_to_bf16(v[i]); v[i] = bf16_to_float(d[i]);
        }
    } else {
        memcpy(hq, q, nq * es); memcpy(hk, k, nkv * es); memcpy(hv, v, nkv * es);
    }

    void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dws = NULL;
    int *dpos = NULL;
    const int host_pos = c->dev_pos ? S - T : pos;  // with a device position, only the bound
    size_t ws_bytes = fused_attention_workspace_size(B, NH, HS, S);
    if (c->ws == 0) ws_bytes = 0;
    if (c->ws == 2) ws_bytes = (size_t)B * NH * T * (HS + 2) * sizeof(float) * 3;  // room for 3 splits
    int ok = cudaMalloc(&dq, nq * es) == cudaSuccess && cudaMalloc(&dk, nkv * es) == cudaSuccess &&
             cudaMalloc(&dv, nkv * es) == cudaSuccess && cudaMalloc(&dout, (nq + GUARD) * es) == cudaSuccess &&
             (ws_bytes == 0 || cudaMalloc(&dws, ws_bytes) == cudaSuccess) &&
             (!c->dev_pos || (cudaMalloc((void **)&dpos, sizeof(int)) == cudaSuccess &&
                              cudaMemcpy(dpos, &pos, sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess));
    ok = ok && cudaMemcpy(dq, hq, nq * es, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dk, hk, nkv * es, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dv, hv, nkv * es, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemset(dout, 0xff, (nq + GUARD) * es) == cudaSuccess &&            // NaN in fp32 and bf16
         (ws_bytes == 0 || cudaMemset(dws, 0, ws_bytes) == cudaSuccess);  // zeroed once, as the header asks
    if (!ok) {
        CHECK(0, name, "CUDA setup: %s", cudaGetErrorString(cudaGetLastError()));
        goto done;
    }
    // Twice: the second call checks that the first left the workspace's split counters at zero.
    int rc = fused_attention(dq, dk, dv, dout, dt, B, T, host_pos, dpos, NH, HS, S, dws, ws_bytes, 0);
    if (rc == 0 && cudaMemsetAsync(dout, 0xff, (nq + GUARD) * es, 0) == cudaSuccess)
        rc = fused_attention(dq, dk, dv, dout, dt, B, T, host_pos, dpos, NH, HS, S, dws, ws_bytes, 0);
    cudaError_t se = cudaDeviceSynchronize();
    if (rc != 0 || se != cudaSuccess) {
        CHECK(0, name, "fused_attention returned %d (%s), sync %s", rc, cudaGetErrorString((cudaError_t)rc),
              cudaGetErrorString(se));
        goto done;
    }
    void *hout = xmalloc((nq + GUARD) * es);
    cudaMemcpy(hout, dout, (nq + GUARD) * es, cudaMemcpyDeviceToHost);

    // fp64 reference and the comparison, row by row.
    double err2 = 0, ref2 = 0;
    size_t unwritten = 0, guard_hit = 0;
    double *sc = xmalloc((size_t)L * sizeof(double)), *acc = xmalloc((size_t)HS * sizeof(double));
    const double scale = 1.0 / sqrt((double)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *kb = k + ((size_t)b * NH + h) * S * HS, *vb = v + ((size_t)b * NH + h) * S * HS;
            for (int t = 0; t < T; t++) {
                const float *qr = q + ((size_t)b * T + t) * C + h * HS;
                const int n = pos + t + 1;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < n; j++) {
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += (double)qr[d] * kb[(size_t)j * HS + d];
                    sc[j] = s * scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int d = 0; d < HS; d++) acc[d] = 0;
                for (int j = 0; j < n; j++) {
                    double p = exp(sc[j] - mx);
                    sum += p;
                    for (int d = 0; d < HS; d++) acc[d] += p * vb[(size_t)j * HS + d];
                }
                for (int d = 0; d < HS; d++) {
                    size_t i = ((size_t)b * T + t) * C + h * HS + d;
                    double r = acc[d] / sum;
                    double o = dt == DTYPE_BF16 ? bf16_to_float(((uint16_t *)hout)[i]) : ((float *)hout)[i];
                    if (!isfinite(o)) unwritten++;
                    err2 += (o - r) * (o - r);
                    ref2 += r * r;
                }
            }
        }
    for (size_t i = nq; i < nq + GUARD; i++) {
        double o = dt == DTYPE_BF16 ? bf16_to_float(((uint16_t *)hout)[i]) : ((float *)hout)[i];
        if (!isnan(o)) guard_hit++;
    }
    double rel = sqrt(err2 / (ref2 > 0 ? ref2 : 1));
    double tol = dt == DTYPE_BF16 ? 1e-2 : (c->amp > 1 ? 2e-4 : 1e-5);
    CHECK(unwritten == 0 && guard_hit == 0 && rel <= tol, name,
          "rel_l2 %.3g (tol %.0e), %zu outputs not finite, %zu written past the end", rel, tol, unwritten, guard_hit);
    if (unwritten == 0 && guard_hit == 0 && rel <= tol) printf("  %s: rel_l2 %.3g\n", name, rel);
    if (fused_attention_takes_qkv(dt, T, HS)) check_qkv(c, dt, hq, hk, hv, hout, ws_bytes, host_pos);
    free(sc);
    free(acc);
    free(hout);
done:
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dws); cudaFree(dpos);
    cudaGetLastError();
    free(q); free(k); free(v); free(hq); free(hk); free(hv);
    return 0;
}

static void check_bad_args(void) {
    void *p = (void *)16;  // never dereferenced: the shape is refused first, or T = 0 does nothing
    int rc1 = fused_attention(p, p, p, p, DTYPE_F32, 1, 4, 10, NULL, 2, 64, 12, NULL, 0, 0);
    int rc2 = fused_attention(p, p, p, p, DTYPE_F32, 1, 1, 0, NULL, 2, 129, 12, NULL, 0, 0);
    int rc3 = fused_attention(p, p, p, p, DTYPE_BF16, 1, 0, 0, NULL, 2, 64, 12, NULL, 0, 0);
    CHECK(rc1 == cudaErrorInvalidValue && rc2 == cudaErrorInvalidValue && rc3 == 0, "fused_attention bad arguments",
          "pos+T > max_seq -> %d, HS=129 -> %d, T=0 -> %d", rc1, rc2, rc3);
    // The qkv entry point only takes what attn_decode1 and the tensor-core prefill run: T = 1 with
    // 16-byte rows, or bf16 with T > 4 and HS % 8 == 0 (no device position there).
    int *dp = (int *)16;
    int rq[6] = {fused_attention_qkv(p, p, p, p, DTYPE_F32, 1, 8, 0, NULL, 2, 64, 12, NULL, 0, 0),
                 fused_attention_qkv(p, p, p, p, DTYPE_BF16, 1, 4, 0, NULL, 2, 64, 12, NULL, 0, 0),
                 fused_attention_qkv(p, p, p, p, DTYPE_BF16, 1, 8, 0, NULL, 2, 20, 12, NULL, 0, 0),
                 fused_attention_qkv(p, p, p, p, DTYPE_BF16, 1, 8, 5, NULL, 2, 64, 12, NULL, 0, 0),
                 fused_attention_qkv(p, p, p, p, DTYPE_F32, 1, 1, 0, NULL, 2, 6, 12, NULL, 0, 0),
                 fused_attention_qkv(p, p, p, p, DTYPE_BF16, 1, 8, 0, dp, 2, 64, 12, NULL, 0, 0)};
    int all_refused = 1;
    for (int i = 0; i < 6; i++) all_refused &= rq[i] == cudaErrorInvalidValue;
    CHECK(all_refused, "fused_attention_qkv bad arguments",
          "fp32 T=8 -> %d, T=4 -> %d, HS=20 -> %d, pos+T > max_seq -> %d, fp32 T=1 HS=6 -> %d, prefill with a "
          "device position -> %d",
          rq[0], rq[1], rq[2], rq[3], rq[4], rq[5]);
}
#endif

int main(void) {
#if !GPT2_CUDA
    test_skip("fused_attention", "no GPU (CPU-only build)");
    return 0;
#else
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        char why[256];
        snprintf(why, sizeof why, "no GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        test_skip("fused_attention", why);
        return 0;
    }
    rng_state = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 20 ^ 0x2545F4914F6CDD1Dull;
    if (getenv("SEED")) rng_state = strtoull(getenv("SEED"), NULL, 0) | 1;
    printf("  seed 0x%llx (SEED=... to repeat)\n", (unsigned long long)rng_state);
    const int quick = getenv("GPT2_QUICK") != NULL;  // leaves out the two slowest references

    static const Case cases[] = {
        {1, 1, 0, 1, 64, 16, 1, 1, 0},          // one key
        {1, 1, 1023, 12, 64, 1024, 1, 1, 0},    // decode, B=1, long cache: 16 splits
        {2, 3, 77, 3, 40, 100, 1, 1, 0},        // T=3 decode, HS=40
        {3, 2, 63, 4, 32, 70, 1, 1, 0},         // split 1 holds key 64 only: masked for query 0
        {64, 1, 271, 12, 64, 300, 1, 1, 0},     // decode, B=64
        {2, 1, 300, 2, 128, 320, 1, 1, 0},      // decode HS=128: two (bf16) or four (fp32) chunks a lane
        {1, 1, 90, 3, 96, 128, 1, 1, 0},        // decode HS=96: lanes past the row's 12 bf16 chunks idle
        {2, 4, 40, 1, 48, 44, 1, 1, 0},         // T=4 (largest decode), NH=1, cache full
        {5, 130, 0, 3, 24, 135, 1, 1, 0},       // prefill HS=24 (bf16 tensor cores pad to 32)
        {2, 130, 61, 12, 64, 203, 1, 1, 0},     // prefill after a cached prefix
        {1, 200, 500, 25, 96, 777, 1, 1, 0},    // HS=96, NH=25
        {2, 5, 1000, 2, 128, 1100, 1, 1, 0},    // T=5 (smallest prefill), HS=128, long prefix
        {2, 67, 3, 5, 20, 90, 1, 1, 0},         // HS=20: element-wise loads
        {8, 130, 10, 25, 64, 150, 1, 1, 0},     // many blocks: the fp32 kernel's 64-query tiles
        {8, 130, 0, 30, 20, 140, 1, 1, 0},      // the same for the element-wise (odd HS) path
        {8, 300, 77, 12, 64, 400, 1, 1, 0},     // bf16 128-query blocks, the prefix off the 64-key tiles
        {1, 1, 2000, 2, 20, 2048, 1, 1, 0},     // decode HS=20, many splits
        {2, 100, 20, 2, 64, 130, 30, 1, 0},     // large scores, prefill
        {4, 1, 500, 12, 64, 512, 30, 1, 0},     // large scores, decode
        {2, 1, 700, 3, 64, 777, 1, 0, 0},       // no workspace: one block per head
        {2, 2, 700, 3, 64, 777, 1, 2, 0},       // workspace for 3 splits only
        {1, 300, 250, 4, 64, 600, 1, 1, 0},     // bf16 keys over four groups (>= 512 keys), uneven tiles
        {1, 520, 0, 3, 32, 600, 1, 1, 0},       // the same at HS=32
        {1, 130, 400, 2, 64, 600, 30, 1, 0},    // the same with large scores
        {1, 1024, 0, 12, 64, 1024, 1, 1, 0},    // GPT-2 124M prefill, full context
        {64, 1, 1023, 12, 64, 1024, 1, 1, 0},   // GPT-2 124M decode at B=64, full cache
        {1, 1, 37, 12, 64, 1024, 1, 1, 1},   // decode graph: position 37 from the device, split for 1023
        {8, 1, 500, 12, 64, 1024, 1, 1, 1},  // the same at B=8
        {2, 3, 77, 3, 40, 100, 1, 1, 1},     // T=3 with a device position
        {3, 1, 5, 4, 20, 64, 1, 1, 1},       // odd HS: the shared-memory decode kernel
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    for (int dt = 0; dt < 2; dt++)
        for (int i = 0; i < ncases; i++) {
            if (quick && (i == ncases - 5 || i == ncases - 6)) continue;
            run_case(&cases[i], (DType)dt);
        }
    // The one-token decode cases again under the other two merges.
    static const char *other_merges[] = {"0", "8"};
    for (int m = 0; m < 2; m++) {
        setting = m == 0 ? "merge=0" : "merge=8";
        setenv("GPT2_ATTN_CLUSTER", other_merges[m], 1);
        for (int dt = 0; dt < 2; dt++)
            for (int i = 0; i < ncases; i++)
                if (cases[i].T == 1) run_case(&cases[i], (DType)dt);
    }
    unsetenv("GPT2_ATTN_CLUSTER");
    // The bf16 prefill cases of HS = 64 again on mma.sync, which Ampere and Ada run (on other
    // devices the same kernel twice).
    setting = "wgmma=0";
    setenv("GPT2_ATTN_WGMMA", "0", 1);
    for (int i = 0; i < ncases; i++)
        if (cases[i].T > 4 && cases[i].HS == 64 && !(quick && (i == ncases - 5 || i == ncases - 6)))
            run_case(&cases[i], DTYPE_BF16);
    unsetenv("GPT2_ATTN_WGMMA");
    setting = "";
    check_bad_args();
    return test_exit_code();
#endif
}
