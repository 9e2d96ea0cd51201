// One decode step of one sequence in one persistent kernel: decode_persistent.h says what and why.
#include "decode_persistent.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "block_ops.h"

namespace {

typedef __nv_bfloat16 bf16;

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kMaxChunks = 64;          // attention chunks per head (each >= kMinKeysPerChunk keys)
constexpr int kMinKeysPerChunk = 16;
constexpr size_t kMaxRoundBytes = 64 << 10;  // one of the two weight buffers in shared memory
constexpr int kBarrierWords = 16;       // the grid barrier's count and generation, padded

// ----------------------------------------------------------------------------
// Small helpers

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
template <typename E> __device__ __forceinline__ E from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float v) { return __float2bfloat16_rn(v); }

// Elements of E in 16 bytes, the unit of every weight and cache load.
template <typename E> constexpr int epc() { return 16 / (int)sizeof(E); }

// 16 bytes of E as floats.
__device__ __forceinline__ void unpack16(uint4 v, bf16 *, float *f) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void unpack16(uint4 v, float *, float *f) {
    f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block in a fixed order; every thread gets it. red: kWarps floats of shared memory.
__device__ float block_sum(float v, float *red) {
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; w++) s += red[w];
    __syncthreads();
    return s;
}

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ unsigned load_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Every block arrives, the last one opens the next generation. The count returns to zero, so the
// barrier serves step after step from one zeroed workspace. Writes before it (any thread of any
// block) are visible after it to loads that bypass L1 (__ldcg), which is how data made in this
// kernel is read.
__device__ void grid_barrier(unsigned *bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *count = bar, *generation = bar + 1;
        const unsigned gen = load_acquire(generation);
        __threadfence();
        if (atomicAdd(count, 1u) == gridDim.x - 1) {
            atomicExch(count, 0u);
            __threadfence();
            atomicAdd(generation, 1u);
        } else {
            while (load_acquire(generation) == gen) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait_all_but_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

// ----------------------------------------------------------------------------
// Products: y[n] = W[n, :] . xs for this block's rows n of W, streamed through shared memory

// This block's contiguous rows [r0, r1) of a product with N rows of K, in rounds of rows_per_round
// rows (one round fills one of the two buffers).
template <typename E>
struct Rows {
    const E *W;
    int K, r0, r1, rows_per_round, rounds;
};

template <typename E>
__device__ Rows<E> block_rows(const void *W, int N, int K, size_t round_bytes) {
    Rows<E> r;
    r.W = (const E *)W;
    r.K = K;
    r.r0 = (int)((long long)blockIdx.x * N / gridDim.x);
    r.r1 = (int)((long long)(blockIdx.x + 1) * N / gridDim.x);
    r.rows_per_round = (int)(round_bytes / ((size_t)K * sizeof(E)));
    r.rounds = (r.r1 - r.r0 + r.rows_per_round - 1) / r.rows_per_round;
    return r;
}

// Starts copying round `round` (if there is one) into buf; always commits one cp.async group, so
// every thread's group count stays in step.
template <typename E>
__device__ void stage(const Rows<E> &r, int round, E *buf) {
    if (round < r.rounds) {
        const int ra = r.r0 + round * r.rows_per_round, rb = min(r.r1, ra + r.rows_per_round);
        const char *src = (const char *)(r.W + (size_t)ra * r.K);  // rows are contiguous in W
        const size_t bytes = (size_t)(rb - ra) * r.K * sizeof(E);
        for (size_t o = threadIdx.x * (size_t)16; o < bytes; o += kThreads * (size_t)16)
            cp_async16((char *)buf + o, src + o);
    }
    cp_commit();
}

// The first two rounds, issued before the grid barrier the product waits behind.
template <typename E>
__device__ void prefetch(const Rows<E> &r, E *const bufs[2]) {
    stage(r, 0, bufs[0]);
    stage(r, 1, bufs[1]);
}

template <typename E>
__device__ __forceinline__ float dot16(const E *w, const float *x) {
    float f[epc<E>()];
    unpack16(*reinterpret_cast<const uint4 *>(w), (E *)nullptr, f);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < epc<E>(); i++) s += f[i] * x[i];
    return s;
}

// Runs the product over every round (the first two already staged by prefetch), calling
// epilogue(n, dot) once per row. A round of R >= 8 rows gives each warp whole rows; fewer rows get
// 8 / R warps each, their partial sums added in warp order. Deterministic either way.
template <typename E, typename Epilogue>
__device__ void run_product(const Rows<E> &r, E *const bufs[2], const float *xs, float *red, Epilogue epilogue) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int chunks = r.K / epc<E>();  // 16-byte chunks per row
    for (int i = 0; i < r.rounds; i++) {
        cp_wait_all_but_one();
        __syncthreads();
        const E *buf = bufs[i & 1];
        const int ra = r.r0 + i * r.rows_per_round, R = min(r.r1, ra + r.rows_per_round) - ra;
        if (R >= kWarps) {
            for (int row = warp; row < R; row += kWarps) {
                const E *w = buf + (size_t)row * r.K;
                float acc = 0.0f;
                for (int c = lane; c < chunks; c += 32) acc += dot16(w + c * epc<E>(), xs + c * epc<E>());
                acc = warp_sum(acc);
                if (lane == 0) epilogue(ra + row, acc);
            }
        } else {
            const int G = kWarps / R, row = warp / G, part = warp % G;
            float acc = 0.0f;
            if (row < R) {
                const E *w = buf + (size_t)row * r.K;
                for (int c = part * 32 + lane; c < chunks; c += 32 * G)
                    acc += dot16(w + c * epc<E>(), xs + c * epc<E>());
            }
            acc = warp_sum(acc);
            if (lane == 0) red[warp] = acc;
            __syncthreads();
            if ((int)threadIdx.x < R) {
                float s = 0.0f;
                for (int p = 0; p < G; p++) s += red[threadIdx.x * G + p];
                epilogue(ra + (int)threadIdx.x, s);
            }
        }
        __syncthreads();  // the buffer and red are free again
        stage(r, i + 2, bufs[i & 1]);
    }
}

// ----------------------------------------------------------------------------
// Vectors in shared memory

// xs[0..n) = v[0..n) from global memory written earlier in this kernel.
__device__ void load_vector(float *xs, const float *v, int n) {
    for (int i = threadIdx.x; i < n; i += kThreads) xs[i] = __ldcg(v + i);
    __syncthreads();
}

// LayerNorm of xs[0..C) in place: exact two-pass statistics of the row, as the reference's.
__device__ void layernorm_inplace(float *xs, int C, const float *gamma, const float *beta, float *red) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < C; i += kThreads) s += xs[i];
    const float mean = block_sum(s, red) / C;
    float q = 0.0f;
    for (int i = threadIdx.x; i < C; i += kThreads) q += (xs[i] - mean) * (xs[i] - mean);
    const float rstd = rsqrtf(block_sum(q, red) / C + 1e-5f);
    for (int i = threadIdx.x; i < C; i += kThreads) xs[i] = (xs[i] - mean) * rstd * gamma[i] + beta[i];
    __syncthreads();
}

// ----------------------------------------------------------------------------
// Attention of the one new query over cache[0..pos], flash-decoding over the block's warps

struct Workspace {
    unsigned *barrier;    // [kBarrierWords]
    unsigned *head_done;  // [NH]: warps of the head that have written their partial
    float *q, *atty, *h;  // [C], [C], [4C]
    float *partials;      // [NH][kMaxChunks][HS + 2]: acc[HS], max, sum
};

__device__ Workspace carve(void *base, int C, int NH) {
    Workspace w;
    w.barrier = (unsigned *)base;
    w.head_done = w.barrier + kBarrierWords;
    float *f = (float *)(w.head_done + ((NH + 3) / 4) * 4);
    w.q = f;
    w.atty = f + C;
    w.h = f + 2 * C;
    w.partials = f + 6 * C;
    return w;
}

// A warp takes chunk c of head h: LPK = HS / epc lanes hold one key's row (epc dimensions each),
// 32 / LPK keys go at once, each lane group with its own online softmax (exp2, the scale and
// log2(e) folded into q); the groups merge by shuffles, the partial goes to the workspace, and the
// head's last warp merges all its partials into atty.
template <typename E>
__device__ void attention_phase(const DecodePersistentArgs &a, const GpuLayer &ly, int pos, const Workspace &ws) {
    constexpr int EPC = epc<E>();
    const int HS = a.HS, LPK = HS / EPC, KPI = 32 / LPK;
    const int lane = threadIdx.x % 32, grp = lane / LPK, sub = lane % LPK;
    const int L = pos + 1, warps = gridDim.x * kWarps;
    int chunks = min(min(kMaxChunks, max(1, warps / a.NH)), (L + kMinKeysPerChunk - 1) / kMinKeysPerChunk);
    const int len = (L + chunks - 1) / chunks;
    chunks = (L + len - 1) / len;  // every chunk holds at least one key
    const float scale = rsqrtf((float)HS) * 1.4426950408889634f;
    const E *kc = (const E *)ly.k_cache, *vc = (const E *)ly.v_cache;
    for (int task = blockIdx.x * kWarps + threadIdx.x / 32; task < a.NH * chunks; task += warps) {
        const int h = task / chunks, c = task % chunks;
        const int k0 = c * len, k1 = min(L, k0 + len);
        float q[EPC], acc[EPC];
#pragma unroll
        for (int i = 0; i < EPC; i++) q[i] = __ldcg(ws.q + h * HS + sub * EPC + i) * scale, acc[i] = 0.0f;
        float m = -INFINITY, l = 0.0f;
        const size_t head = (size_t)h * a.max_seq;
        // The whole warp walks the chunk in steps of KPI keys (the shuffles need every lane); a
        // group whose key is past the chunk's end takes no part in that step.
        for (int kb = k0; kb < k1; kb += KPI) {
            const int k = kb + grp;
            const bool valid = k < k1;
            float kf[EPC] = {}, vf[EPC] = {};
            if (valid) {
                unpack16(__ldcg(reinterpret_cast<const uint4 *>(kc + (head + k) * HS + sub * EPC)), (E *)nullptr, kf);
                unpack16(__ldcg(reinterpret_cast<const uint4 *>(vc + (head + k) * HS + sub * EPC)), (E *)nullptr, vf);
            }
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < EPC; i++) s += q[i] * kf[i];
            for (int o = LPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (!valid) continue;
            const float mn = fmaxf(m, s), corr = exp2f(m - mn), p = exp2f(s - mn);
            l = l * corr + p;
#pragma unroll
            for (int i = 0; i < EPC; i++) acc[i] = acc[i] * corr + p * vf[i];
            m = mn;
        }
        for (int o = LPK; o < 32; o <<= 1) {  // merge the lane groups (a group may have seen no key)
            const float mo = __shfl_xor_sync(0xffffffffu, m, o), lo = __shfl_xor_sync(0xffffffffu, l, o);
            const float mn = fmaxf(m, mo);
            const float ca = m == -INFINITY ? 0.0f : exp2f(m - mn), cb = mo == -INFINITY ? 0.0f : exp2f(mo - mn);
#pragma unroll
            for (int i = 0; i < EPC; i++) acc[i] = acc[i] * ca + __shfl_xor_sync(0xffffffffu, acc[i], o) * cb;
            l = l * ca + lo * cb;
            m = mn;
        }
        float *part = ws.partials + ((size_t)h * kMaxChunks + c) * (HS + 2);
        if (grp == 0) {
#pragma unroll
            for (int i = 0; i < EPC; i++) __stcg(part + sub * EPC + i, acc[i]);
            if (sub == 0) __stcg(part + HS, m), __stcg(part + HS + 1, l);
        }
        __threadfence();
        __syncwarp();
        unsigned done = 0;
        if (lane == 0) done = atomicAdd(ws.head_done + h, 1u);
        done = __shfl_sync(0xffffffffu, done, 0);
        if (done != (unsigned)chunks - 1) continue;
        __threadfence();  // the last of the head: every partial is written
        const float *parts = ws.partials + (size_t)h * kMaxChunks * (HS + 2);
        float M = -INFINITY;
        for (int j = 0; j < chunks; j++) M = fmaxf(M, __ldcg(parts + (size_t)j * (HS + 2) + HS));
        float denom = 0.0f;
        for (int j = 0; j < chunks; j++)
            denom += exp2f(__ldcg(parts + (size_t)j * (HS + 2) + HS) - M) * __ldcg(parts + (size_t)j * (HS + 2) + HS + 1);
        for (int d = lane; d < HS; d += 32) {
            float num = 0.0f;
            for (int j = 0; j < chunks; j++)
                num += exp2f(__ldcg(parts + (size_t)j * (HS + 2) + HS) - M) * __ldcg(parts + (size_t)j * (HS + 2) + d);
            __stcg(ws.atty + h * HS + d, num / denom);
        }
        if (lane == 0) atomicExch(ws.head_done + h, 0u);  // ready for the next layer
    }
}

// ----------------------------------------------------------------------------
// The step

template <typename E>
__global__ void __launch_bounds__(kThreads, 1) decode_persistent_kernel(DecodePersistentArgs a, size_t round_bytes) {
    extern __shared__ uint4 smem[];
    const int C = a.C;
    float *xs = (float *)smem;  // [4C]: the product's input vector
    float *red = xs + 4 * C;    // [2 * kWarps]
    E *const bufs[2] = {(E *)(red + 2 * kWarps), (E *)((char *)(red + 2 * kWarps) + round_bytes)};
    const Workspace ws = carve(a.workspace, C, a.NH);
    const int pos = a.pos_device ? *a.pos_device : a.pos;
    const int token = *a.token;

    Rows<E> rows = block_rows<E>(a.layers[0].qkvw, 3 * C, C, round_bytes);
    prefetch(rows, bufs);
    // The embedding, computed by every block for its own LayerNorm; block 0 keeps it as x.
    const E *wte = (const E *)a.wte, *wpe = (const E *)a.wpe;
    for (int i = threadIdx.x; i < C; i += kThreads) {
        xs[i] = to_f(wte[(size_t)token * C + i]) + to_f(wpe[(size_t)pos * C + i]);
        if (blockIdx.x == 0) __stcg(a.x + i, xs[i]);
    }
    __syncthreads();

    for (int l = 0; l < a.L; l++) {
        const GpuLayer &ly = a.layers[l];
        // P1: qkv = ln1(x) W^T + b; q to the workspace, k and v into the cache at pos.
        if (l > 0) load_vector(xs, a.x, C);
        layernorm_inplace(xs, C, ly.ln1w, ly.ln1b, red);
        E *kc = (E *)ly.k_cache, *vc = (E *)ly.v_cache;
        run_product(rows, bufs, xs, red, [&](int n, float v) {
            v += ly.qkvb[n];
            if (n < C) {
                __stcg(ws.q + n, v);
            } else {
                const int c = n % C, h = c / a.HS, d = c % a.HS;
                E *cache = n < 2 * C ? kc : vc;
                cache[((size_t)h * a.max_seq + pos) * a.HS + d] = from_f<E>(v);
            }
        });
        rows = block_rows<E>(ly.attprojw, C, C, round_bytes);
        prefetch(rows, bufs);
        grid_barrier(ws.barrier);
        // P2: attention
        attention_phase<E>(a, ly, pos, ws);
        grid_barrier(ws.barrier);
        // P3: x += atty W_proj^T + b
        load_vector(xs, ws.atty, C);
        run_product(rows, bufs, xs, red, [&](int n, float v) { __stcg(a.x + n, __ldcg(a.x + n) + v + ly.attprojb[n]); });
        rows = block_rows<E>(ly.fcw, 4 * C, C, round_bytes);
        prefetch(rows, bufs);
        grid_barrier(ws.barrier);
        // P4: h = gelu(ln2(x) W_fc^T + b)
        load_vector(xs, a.x, C);
        layernorm_inplace(xs, C, ly.ln2w, ly.ln2b, red);
        run_product(rows, bufs, xs, red, [&](int n, float v) { __stcg(ws.h + n, gelu_tanh(v + ly.fcb[n])); });
        rows = block_rows<E>(ly.fcprojw, C, 4 * C, round_bytes);
        prefetch(rows, bufs);
        grid_barrier(ws.barrier);
        // P5: x += h W_fcproj^T + b
        load_vector(xs, ws.h, 4 * C);
        run_product(rows, bufs, xs, red, [&](int n, float v) { __stcg(a.x + n, __ldcg(a.x + n) + v + ly.fcprojb[n]); });
        rows = l + 1 < a.L ? block_rows<E>(a.layers[l + 1].qkvw, 3 * C, C, round_bytes)
                           : block_rows<E>(a.wte, a.V, C, round_bytes);
        prefetch(rows, bufs);
        grid_barrier(ws.barrier);
    }
    // logits = lnf(x) wte[:V]^T
    load_vector(xs, a.x, C);
    layernorm_inplace(xs, C, a.lnfw, a.lnfb, red);
    run_product(rows, bufs, xs, red, [&](int n, float v) { a.logits[n] = v; });
    asm volatile("cp.async.wait_all;\n" ::);
}

// Shared memory a launch needs for its round size.
size_t smem_bytes(int C, size_t round_bytes) { return (4 * (size_t)C + 2 * kWarps) * sizeof(float) + 2 * round_bytes; }

// The round size for this device: up to kMaxRoundBytes each of two buffers, within the opt-in
// shared memory; 0 when not even the widest row (fcproj's K = 4C) fits.
size_t round_bytes_for(int C, DType dtype, int dev) {
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return 0;
    const size_t fixed = smem_bytes(C, 0), row = 4 * (size_t)C * dtype_size(dtype);
    if ((size_t)optin < fixed + 2 * row) return 0;
    size_t r = ((size_t)optin - fixed) / 2;
    if (r > kMaxRoundBytes) r = kMaxRoundBytes;
    return r / 16 * 16;
}

}  // namespace

// ----------------------------------------------------------------------------
// Host API

extern "C" size_t decode_persistent_workspace_size(int C, int NH, int HS, int max_seq) {
    (void)max_seq;
    return kBarrierWords * sizeof(unsigned) + (size_t)((NH + 3) / 4) * 4 * sizeof(unsigned) +
           (6 * (size_t)C + (size_t)NH * kMaxChunks * (HS + 2)) * sizeof(float);
}

extern "C" int decode_persistent_supported(int C, int HS, DType dtype) {
    const int es = (int)dtype_size(dtype), per16 = 16 / es;
    if (HS <= 0 || C <= 0 || C % per16 || HS % per16) return 0;
    const int lanes_per_key = HS / per16;
    if (lanes_per_key > 32 || (lanes_per_key & (lanes_per_key - 1))) return 0;
    int dev = 0, coop = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess || !coop)
        return 0;
    return round_bytes_for(C, dtype, dev) > 0;
}

template <typename E>
static cudaError_t launch(const DecodePersistentArgs *a, int dev, cudaStream_t stream) {
    const size_t round = round_bytes_for(a->C, a->dtype, dev), smem = smem_bytes(a->C, round);
    auto kern = decode_persistent_kernel<E>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    int sms = 0, per_sm = 0;
    if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
    if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, kThreads, smem)) != cudaSuccess) return e;
    if (per_sm < 1) return cudaErrorInvalidConfiguration;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)sms);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, *a, round);
}

extern "C" cudaError_t decode_persistent(const DecodePersistentArgs *a, cudaStream_t stream) {
    if (!a || !a->layers || !a->token || !a->x || !a->logits || !a->workspace || a->L < 1 || a->NH < 1 ||
        a->C != a->NH * a->HS || a->pos < 0 || a->pos >= a->max_seq || !decode_persistent_supported(a->C, a->HS, a->dtype))
        return cudaErrorInvalidValue;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    return a->dtype == DTYPE_BF16 ? launch<bf16>(a, dev, stream) : launch<float>(a, dev, stream);
}
