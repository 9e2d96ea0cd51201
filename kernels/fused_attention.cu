// Fused causal attention over the KV cache (issue 5): see fused_attention.h for the contract.
//
// Three kernels and a merge:
//   attn_prefill_mma   bf16, HS % 8 == 0. Flash-attention 2 on tensor cores: 4 warps x 16 queries,
//                      keys in tiles of 64 double-buffered through cp.async; S = Q K^T and O += P V
//                      with mma.sync m16n8k16 (fp32 accumulators). The S accumulators are re-packed
//                      in registers as the A operand of P V (their layouts coincide), so P never
//                      touches shared memory. Online softmax in exp2 with the scale folded in.
//   attn_prefill_simt  fp32 (and bf16 with odd HS): the same tiling on fp32 FMAs. 128 threads hold
//                      a 4 x 8 (or 4 x 4) score micro-tile each; Q and K sit transposed in shared
//                      memory so every inner-loop read is a conflict-free float4.
//   attn_decode        T <= 4 (generation): flash-decoding. The grid is (splits, NH, B); each block
//                      streams its chunk of one head's cache in 64-key tiles (16-byte cp.async,
//                      8 lanes per key for q.k, key groups for p.v) and writes its partial
//                      (max, sum, acc) to the workspace, or the output directly when unsplit.
//   attn_decode_merge  out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s.
// Causal tiles are never loaded: a query tile starting at q0 reads keys < pos + q0 + 64 only.
// Every softmax starts from key 0, which every query sees, so running maxima are finite after the
// first tile and no -inf - -inf arises in the prefill kernels; decode chunks can be fully masked
// for some query (chunk past pos + t), handled explicitly.
#include "fused_attention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

typedef __nv_bfloat16 bf16;

constexpr int kThreads = 128;  // every kernel here: 4 warps
constexpr int kDecodeKT = 64;  // keys per decode tile
constexpr int kDecodeTQ = 4;   // decode kernel takes T <= 4 queries
constexpr int kBM = 64;        // queries per prefill block

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
template <typename E> __device__ __forceinline__ E from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float v) { return __float2bfloat16_rn(v); }

// 16 bytes of E as floats (4 fp32 or 8 bf16).
__device__ __forceinline__ void unpack16(const float *p, float *f) {
    float4 v = *reinterpret_cast<const float4 *>(p);
    f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
}
__device__ __forceinline__ void unpack16(const bf16 *p, float *f) {
    uint4 v = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// 4 consecutive elements as a float4 (16-byte fp32 or 8-byte bf16 load).
__device__ __forceinline__ float4 load4(const float *p) { return __ldg(reinterpret_cast<const float4 *>(p)); }
__device__ __forceinline__ float4 load4(const bf16 *p) {
    uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xffff0000u));
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// rows x cols of E from global (row stride src_stride) into shared (row stride dst_stride), rows at
// or past rows_valid as zeros. vec: cols % (16 / sizeof(E)) == 0 and 16-byte aligned rows, through
// cp.async (the caller commits and waits); else element by element, zero-padding up to dst_stride.
template <typename E>
__device__ __forceinline__ void load_rows(E *dst, int dst_stride, const E *src, int src_stride, int rows,
                                          int rows_valid, int cols, bool vec) {
    constexpr int VW = 16 / sizeof(E);
    if (vec) {
        const int nv = cols / VW;
        for (int u = threadIdx.x; u < rows * nv; u += kThreads) {
            const int r = u / nv, c = u - r * nv;
            const bool ok = r < rows_valid;
            cp_async16(dst + r * dst_stride + c * VW, ok ? src + (size_t)r * src_stride + c * VW : src, ok ? 16 : 0);
        }
    } else {
        for (int u = threadIdx.x; u < rows * dst_stride; u += kThreads) {
            const int r = u / dst_stride, c = u - r * dst_stride;
            dst[u] = (r < rows_valid && c < cols) ? src[(size_t)r * src_stride + c] : from_f<E>(0.f);
        }
    }
}

// ----------------------------------------------------------------------------
// Decode: flash-decoding over chunks of the cache

// Shared-memory layout of attn_decode, shared by host and device.
struct DecodeSmem {
    int hsp;          // HS rounded up to 16 bytes of E
    size_t kv;        // K and V tiles, or (after the loop) the key-group partial sums
    size_t q;         // offset of q (fp32, [TQ][hsp])
    size_t s;         // offset of the scores / probabilities (fp32, [TQ][KT])
    size_t stats;     // offset of max, sum, rescale per query
    size_t total;
};

__host__ __device__ inline DecodeSmem decode_smem(int HS, int esize) {
    DecodeSmem L;
    const int vw = 16 / esize;
    L.hsp = (HS + vw - 1) / vw * vw;
    size_t kv = 2 * (size_t)kDecodeKT * L.hsp * esize;
    size_t red = (size_t)kThreads * kDecodeTQ * vw * sizeof(float);
    L.kv = 0;
    L.q = (kv > red ? kv : red);
    L.s = L.q + (size_t)kDecodeTQ * L.hsp * sizeof(float);
    L.stats = L.s + (size_t)kDecodeTQ * kDecodeKT * sizeof(float);
    L.total = L.stats + 3 * kDecodeTQ * sizeof(float);
    return L;
}

template <typename E, int TQ>
__global__ void __launch_bounds__(kThreads) attn_decode(const E *__restrict__ q, const E *__restrict__ kc,
                                                        const E *__restrict__ vc, E *__restrict__ out,
                                                        float *__restrict__ part, int T, int pos, int NH, int HS,
                                                        int max_seq, int chunk, int splits, float scale_log2,
                                                        int vec) {
    constexpr int VW = 16 / sizeof(E);
    constexpr int KT = kDecodeKT;
    extern __shared__ __align__(16) unsigned char smem[];
    const DecodeSmem lay = decode_smem(HS, sizeof(E));
    const int HSP = lay.hsp, NV = HSP / VW;
    E *Ks = reinterpret_cast<E *>(smem);
    E *Vs = Ks + KT * HSP;
    float *red = reinterpret_cast<float *>(smem);
    float *qs = reinterpret_cast<float *>(smem + lay.q);
    float *S = reinterpret_cast<float *>(smem + lay.s);
    float *m_s = reinterpret_cast<float *>(smem + lay.stats), *l_s = m_s + TQ, *a_s = l_s + TQ;

    const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int C = NH * HS, L = pos + T;
    const int kbeg = split * chunk, kend = min(kbeg + chunk, L);
    const size_t bh = (size_t)b * NH + h;
    const E *kb = kc + bh * max_seq * HS;
    const E *vb = vc + bh * max_seq * HS;

    for (int i = tid; i < TQ * HSP; i += kThreads) {
        const int t = i / HSP, d = i - t * HSP;
        qs[i] = (t < T && d < HS) ? to_f(q[((size_t)b * T + t) * C + h * HS + d]) : 0.f;
    }
    if (tid < TQ) { m_s[tid] = -INFINITY; l_s[tid] = 0.f; }

    // p.v mapping: thread = (key group g, 16-byte column c); KG groups stride over the tile's keys.
    const int c = tid % NV, g = tid / NV, KG = kThreads / NV;
    float acc[TQ][VW];
#pragma unroll
    for (int t = 0; t < TQ; t++)
#pragma unroll
        for (int e = 0; e < VW; e++) acc[t][e] = 0.f;
    // q.k mapping: a quarter-warp per key, lane `sub` takes 16-byte columns sub, sub + 8, ...
    constexpr int QIT = 128 / VW / 8;  // columns per lane at HS = 128
    const int quarter = lane >> 3, sub = lane & 7;
    float qr[TQ][QIT][VW];

    for (int k0 = kbeg; k0 < kend; k0 += KT) {
        const int rows = min(KT, kend - k0);
        __syncthreads();  // the last tile's readers are done (and q / stats are initialised)
        load_rows(Ks, HSP, kb + (size_t)k0 * HS, HS, KT, rows, HS, vec != 0);
        load_rows(Vs, HSP, vb + (size_t)k0 * HS, HS, KT, rows, HS, vec != 0);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();

        if (k0 == kbeg) {  // this lane's q columns, once (qs is visible after the barrier above)
#pragma unroll
            for (int t = 0; t < TQ; t++)
#pragma unroll
                for (int it = 0; it < QIT; it++)
#pragma unroll
                    for (int e = 0; e < VW; e++) {
                        const int v = sub + it * 8;
                        qr[t][it][e] = v < NV ? qs[t * HSP + v * VW + e] : 0.f;
                    }
        }
        // Scores: 8 lanes per key (a quarter-warp reads one 16-byte-aligned row: conflict-free).
        {
            for (int j = warp * 4 + quarter; j < KT; j += 16) {
                float dot[TQ];
#pragma unroll
                for (int t = 0; t < TQ; t++) dot[t] = 0.f;
#pragma unroll
                for (int it = 0; it < QIT; it++) {
                    const int v = sub + it * 8;
                    if (v >= NV) break;
                    float kf[VW];
                    unpack16(Ks + j * HSP + v * VW, kf);
#pragma unroll
                    for (int t = 0; t < TQ; t++)
#pragma unroll
                        for (int e = 0; e < VW; e++) dot[t] = fmaf(qr[t][it][e], kf[e], dot[t]);
                }
#pragma unroll
                for (int t = 0; t < TQ; t++) {
                    dot[t] += __shfl_xor_sync(0xffffffffu, dot[t], 4);
                    dot[t] += __shfl_xor_sync(0xffffffffu, dot[t], 2);
                    dot[t] += __shfl_xor_sync(0xffffffffu, dot[t], 1);
                }
                if (sub == 0) {
                    const int key = k0 + j;
#pragma unroll
                    for (int t = 0; t < TQ; t++)
                        if (t < T) S[t * KT + j] = (key < kend && key <= pos + t) ? dot[t] * scale_log2 : -INFINITY;
                }
            }
        }
        __syncthreads();

        // Online softmax: warp t owns query t. A chunk can hold no key of query t (all past pos + t).
        if (warp < T) {
            const int t = warp;
            const float s0 = S[t * KT + lane], s1 = S[t * KT + lane + 32];
            float mx = fmaxf(s0, s1);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_old = m_s[t];
            const float m_new = fmaxf(m_old, mx);
            const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
            const float p0 = exp2f(s0 - m_use), p1 = exp2f(s1 - m_use);
            S[t * KT + lane] = p0;
            S[t * KT + lane + 32] = p1;
            float sum = p0 + p1;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) {
                const float alpha = exp2f(m_old - m_use);
                m_s[t] = m_new;
                l_s[t] = l_s[t] * alpha + sum;
                a_s[t] = alpha;
            }
        }
        __syncthreads();

        if (g < KG) {
#pragma unroll
            for (int t = 0; t < TQ; t++) {
                const float alpha = t < T ? a_s[t] : 0.f;
#pragma unroll
                for (int e = 0; e < VW; e++) acc[t][e] *= alpha;
            }
            for (int j = g; j < rows; j += KG) {
                float vf[VW];
                unpack16(Vs + j * HSP + c * VW, vf);
#pragma unroll
                for (int t = 0; t < TQ; t++) {
                    if (t >= T) break;
                    const float p = S[t * KT + j];
#pragma unroll
                    for (int e = 0; e < VW; e++) acc[t][e] = fmaf(p, vf[e], acc[t][e]);
                }
            }
        }
    }

    // Sum the key groups, then write the output (one split) or this split's partial.
    __syncthreads();
    if (g < KG) {
#pragma unroll
        for (int t = 0; t < TQ; t++)
#pragma unroll
            for (int e = 0; e < VW; e++) red[(g * TQ + t) * HSP + c * VW + e] = acc[t][e];
    }
    __syncthreads();
    const size_t prow = (size_t)HS + 2;
    for (int i = tid; i < T * HS; i += kThreads) {
        const int t = i / HS, d = i - t * HS;
        float s = 0.f;
        for (int gg = 0; gg < KG; gg++) s += red[(gg * TQ + t) * HSP + d];
        if (splits == 1) {
            out[((size_t)b * T + t) * C + h * HS + d] = from_f<E>(s / l_s[t]);
        } else {
            part[((bh * T + t) * splits + split) * prow + 2 + d] = s;
        }
    }
    if (splits > 1 && tid < T) {
        float *p = part + ((bh * T + tid) * splits + split) * prow;
        p[0] = m_s[tid];
        p[1] = l_s[tid];
    }
}

template <typename E>
__global__ void __launch_bounds__(kThreads) attn_decode_merge(const float *__restrict__ part, E *__restrict__ out,
                                                              int T, int NH, int HS, int splits) {
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const size_t prow = (size_t)HS + 2;
    const float *p = part + ((((size_t)b * NH + h) * T + t) * splits) * prow;
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, p[s * prow]);  // finite: split 0 holds key 0
    for (int d = threadIdx.x; d < HS; d += kThreads) {
        float num = 0.f, den = 0.f;
        for (int s = 0; s < splits; s++) {
            const float w = exp2f(p[s * prow] - M);
            den = fmaf(w, p[s * prow + 1], den);
            num = fmaf(w, p[s * prow + 2 + d], num);
        }
        out[((size_t)b * T + t) * NH * HS + h * HS + d] = from_f<E>(num / den);
    }
}

// ----------------------------------------------------------------------------
// Prefill on fp32 FMAs

template <int HSP, int BN> struct SimtSmem {
    static constexpr int QS = kBM + 4;  // Qt row stride: float4-aligned, rows land on different banks
    static constexpr int KS = BN + 4;
    static constexpr size_t floats = (size_t)HSP * QS + (size_t)HSP * KS + (size_t)BN * HSP + (size_t)BN * QS;
    static constexpr size_t bytes = floats * sizeof(float);
};

// dst[d][r] = src[r][d] as fp32 for r < rows, d < HSP; zeros past rows_valid or cols.
template <typename E>
__device__ __forceinline__ void load_transposed(float *dst, int dst_stride, const E *src, int src_stride, int rows,
                                                int rows_valid, int cols, int HSP, bool vec4) {
    if (vec4) {
        for (int u = threadIdx.x; u < rows * (HSP / 4); u += kThreads) {
            const int r = u % rows, d = (u / rows) * 4;
            float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < rows_valid && d < cols) x = load4(src + (size_t)r * src_stride + d);
            dst[(d + 0) * dst_stride + r] = x.x;
            dst[(d + 1) * dst_stride + r] = x.y;
            dst[(d + 2) * dst_stride + r] = x.z;
            dst[(d + 3) * dst_stride + r] = x.w;
        }
    } else {
        for (int u = threadIdx.x; u < rows * HSP; u += kThreads) {
            const int r = u % rows, d = u / rows;
            dst[d * dst_stride + r] = (r < rows_valid && d < cols) ? to_f(src[(size_t)r * src_stride + d]) : 0.f;
        }
    }
}

// dst[r][d] = src[r][d] as fp32, row stride HSP, zeros past rows_valid or cols.
template <typename E>
__device__ __forceinline__ void load_rowmajor(float *dst, const E *src, int src_stride, int rows, int rows_valid,
                                              int cols, int HSP, bool vec4) {
    if (vec4) {
        const int nv = HSP / 4;
        for (int u = threadIdx.x; u < rows * nv; u += kThreads) {
            const int r = u / nv, d = (u - r * nv) * 4;
            float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < rows_valid && d < cols) x = load4(src + (size_t)r * src_stride + d);
            *reinterpret_cast<float4 *>(dst + r * HSP + d) = x;
        }
    } else {
        for (int u = threadIdx.x; u < rows * HSP; u += kThreads) {
            const int r = u / HSP, d = u - r * HSP;
            dst[u] = (r < rows_valid && d < cols) ? to_f(src[(size_t)r * src_stride + d]) : 0.f;
        }
    }
}

template <typename E, int HSP, int BN>
__global__ void __launch_bounds__(kThreads) attn_prefill_simt(const E *__restrict__ q, const E *__restrict__ kc,
                                                              const E *__restrict__ vc, E *__restrict__ out, int T,
                                                              int pos, int NH, int HS, int max_seq, float scale_log2,
                                                              int vec4) {
    typedef SimtSmem<HSP, BN> Lay;
    constexpr int QS = Lay::QS, KS = Lay::KS, NJ = BN / 32, ND = HSP / 32;
    extern __shared__ __align__(16) unsigned char smem[];
    float *Qt = reinterpret_cast<float *>(smem);  // [HSP][QS]
    float *Kt = Qt + HSP * QS;                     // [HSP][KS]
    float *Vs = Kt + HSP * KS;                     // [BN][HSP]
    float *Pt = Vs + BN * HSP;                     // [BN][QS]

    const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kBM;  // the longest query tiles start first
    const int h = blockIdx.y, b = blockIdx.z;
    const int C = NH * HS, L = pos + T;
    const size_t bh = (size_t)b * NH + h;
    const E *qb = q + ((size_t)b * T + q0) * C + h * HS;
    const E *kb = kc + bh * max_seq * HS;
    const E *vb = vc + bh * max_seq * HS;

    load_transposed(Qt, QS, qb, C, kBM, min(kBM, T - q0), HS, HSP, vec4 != 0);

    float m[4], l[4], acc[4][ND * 4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY;
        l[i] = 0.f;
#pragma unroll
        for (int d = 0; d < ND * 4; d++) acc[i][d] = 0.f;
    }

    const int kmax = min(L, pos + q0 + kBM);
    const int ntiles = (kmax + BN - 1) / BN;
    for (int it = 0; it < ntiles; it++) {
        const int k0 = it * BN, rows = min(BN, L - k0);
        __syncthreads();
        load_transposed(Kt, KS, kb + (size_t)k0 * HS, HS, BN, rows, HS, HSP, vec4 != 0);
        load_rowmajor(Vs, vb + (size_t)k0 * HS, HS, BN, rows, HS, HSP, vec4 != 0);
        __syncthreads();

        // s[i][g*4+e]: query ty*4+i, key g*32 + tx*4 + e
        float s[4][NJ * 4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < NJ * 4; j++) s[i][j] = 0.f;
#pragma unroll 8
        for (int d = 0; d < HSP; d++) {
            const float4 a = *reinterpret_cast<const float4 *>(Qt + d * QS + ty * 4);
            const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int g = 0; g < NJ; g++) {
                const float4 k4 = *reinterpret_cast<const float4 *>(Kt + d * KS + g * 32 + tx * 4);
                const float kv[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[i][g * 4 + e] = fmaf(av[i], kv[e], s[i][g * 4 + e]);
            }
        }

        const bool need_mask = (k0 + BN - 1 > pos + q0) || (k0 + BN > L);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int qpos = pos + q0 + ty * 4 + i;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < NJ * 4; j++) {
                const int key = k0 + (j >> 2) * 32 + tx * 4 + (j & 3);
                float v = s[i][j] * scale_log2;
                if (need_mask && (key > qpos || key >= L)) v = -INFINITY;
                s[i][j] = v;
                mx = fmaxf(mx, v);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            const float m_new = fmaxf(m[i], mx);  // finite: tile 0 holds key 0
            const float alpha = exp2f(m[i] - m_new);
            float rs = 0.f;
#pragma unroll
            for (int j = 0; j < NJ * 4; j++) {
                s[i][j] = exp2f(s[i][j] - m_new);
                rs += s[i][j];
            }
            l[i] = l[i] * alpha + rs;  // this thread's keys only; summed over tx at the end
            m[i] = m_new;
#pragma unroll
            for (int d = 0; d < ND * 4; d++) acc[i][d] *= alpha;
        }
#pragma unroll
        for (int j = 0; j < NJ * 4; j++) {
            const int key = (j >> 2) * 32 + tx * 4 + (j & 3);
            *reinterpret_cast<float4 *>(Pt + key * QS + ty * 4) = make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
        }
        __syncthreads();

#pragma unroll 4
        for (int j = 0; j < BN; j++) {
            const float4 p4 = *reinterpret_cast<const float4 *>(Pt + j * QS + ty * 4);
            const float pv[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
            for (int k = 0; k < ND; k++) {
                const float4 v4 = *reinterpret_cast<const float4 *>(Vs + j * HSP + k * 32 + tx * 4);
                const float vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[i][k * 4 + e] = fmaf(pv[i], vv[e], acc[i][k * 4 + e]);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 4; i++) {
        float lt = l[i];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        lt += __shfl_xor_sync(0xffffffffu, lt, 4);
        const float inv = 1.f / lt;
        const int row = q0 + ty * 4 + i;
        if (row >= T) continue;
        E *o = out + ((size_t)b * T + row) * C + h * HS;
#pragma unroll
        for (int k = 0; k < ND; k++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int d = k * 32 + tx * 4 + e;
                if (d < HS) o[d] = from_f<E>(acc[i][k * 4 + e] * inv);
            }
    }
}

// ----------------------------------------------------------------------------
// Prefill on tensor cores (bf16)

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16 *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16 *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
// d += a (16x16, row) * b (16x8, col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

template <int HSP> struct MmaSmem {
    static constexpr int ST = HSP + 8;  // 16 bytes of padding per row: ldmatrix rows hit distinct banks
    static constexpr size_t bytes = (size_t)5 * 64 * ST * sizeof(bf16);  // Q, 2 x K, 2 x V
};

template <int HSP>
__global__ void __launch_bounds__(kThreads) attn_prefill_mma(const bf16 *__restrict__ q, const bf16 *__restrict__ kc,
                                                             const bf16 *__restrict__ vc, bf16 *__restrict__ out,
                                                             int T, int pos, int NH, int HS, int max_seq,
                                                             float scale_log2) {
    constexpr int BN = 64, ST = MmaSmem<HSP>::ST, NK = HSP / 16, NO = HSP / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(smem);  // [64][ST]
    bf16 *Ks = Qs + kBM * ST;                    // [2][BN][ST]
    bf16 *Vs = Ks + 2 * BN * ST;                 // [2][BN][ST]

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kBM;
    const int h = blockIdx.y, b = blockIdx.z;
    const int C = NH * HS, L = pos + T;
    const size_t bh = (size_t)b * NH + h;
    const bf16 *qb = q + ((size_t)b * T + q0) * C + h * HS;
    const bf16 *kb = kc + bh * max_seq * HS;
    const bf16 *vb = vc + bh * max_seq * HS;

    if (HS < HSP) {  // padding columns: zero once, cp.async never writes them
        const bf16 z = __float2bfloat16_rn(0.f);
        for (int u = tid; u < 5 * 64 * (HSP - HS); u += kThreads) {
            const int r = u / (HSP - HS), c = HS + u % (HSP - HS);
            Qs[r * ST + c] = z;
        }
    }
    load_rows(Qs, ST, qb, C, kBM, min(kBM, T - q0), HS, true);

    const int kmax = min(L, pos + q0 + kBM);
    const int ntiles = (kmax + BN - 1) / BN;
    auto load_kv = [&](int it) {
        const int k0 = it * BN, rows = min(BN, L - k0);
        load_rows(Ks + (it & 1) * BN * ST, ST, kb + (size_t)k0 * HS, HS, BN, rows, HS, true);
        load_rows(Vs + (it & 1) * BN * ST, ST, vb + (size_t)k0 * HS, HS, BN, rows, HS, true);
        cp_async_commit();
    };
    load_kv(0);

    uint32_t qf[NK][4];
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const int r0 = q0 + warp * 16 + (lane >> 2);  // this thread's rows: r0 and r0 + 8
    const int qpos0 = pos + r0, qpos1 = qpos0 + 8;

    for (int it = 0; it < ntiles; it++) {
        if (it + 1 < ntiles) {
            load_kv(it + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < NK; kk++)
                ldsm_x4(qf[kk], Qs + (warp * 16 + (lane & 15)) * ST + kk * 16 + (lane >> 4) * 8);
        }
        const bf16 *Kb = Ks + (it & 1) * BN * ST;
        const bf16 *Vb = Vs + (it & 1) * BN * ST;

        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HSP / 32; kk++) {
                uint32_t kf[4];
                ldsm_x4(kf, Kb + (n * 8 + (lane & 7)) * ST + kk * 32 + (lane >> 3) * 8);
                mma_bf16(s[n], qf[2 * kk], kf[0], kf[1]);
                mma_bf16(s[n], qf[2 * kk + 1], kf[2], kf[3]);
            }
        }

        const int k0 = it * BN;
        const bool need_mask = (k0 + BN - 1 > pos + q0) || (k0 + BN > L);
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[n][e] * scale_log2;
                if (need_mask) {
                    const int key = k0 + n * 8 + 2 * (lane & 3) + (e & 1);
                    if (key > (e < 2 ? qpos0 : qpos1) || key >= L) v = -INFINITY;
                }
                s[n][e] = v;
                if (e < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);  // finite: tile 0 holds key 0
        const float al0 = exp2f(m0 - mn0), al1 = exp2f(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int n = 0; n < 8; n++) {
            s[n][0] = exp2f(s[n][0] - mn0);
            s[n][1] = exp2f(s[n][1] - mn0);
            s[n][2] = exp2f(s[n][2] - mn1);
            s[n][3] = exp2f(s[n][3] - mn1);
            rs0 += s[n][0] + s[n][1];
            rs1 += s[n][2] + s[n][3];
        }
        l0 = l0 * al0 + rs0;
        l1 = l1 * al1 + rs1;
#pragma unroll
        for (int n = 0; n < NO; n++) {
            o[n][0] *= al0;
            o[n][1] *= al0;
            o[n][2] *= al1;
            o[n][3] *= al1;
        }

        // O += P V: the accumulators of key blocks 2kc, 2kc+1 are the A fragment of keys 16kc..16kc+15.
#pragma unroll
        for (int kc2 = 0; kc2 < 4; kc2++) {
            const uint32_t a[4] = {pack_bf16(s[2 * kc2][0], s[2 * kc2][1]), pack_bf16(s[2 * kc2][2], s[2 * kc2][3]),
                                   pack_bf16(s[2 * kc2 + 1][0], s[2 * kc2 + 1][1]),
                                   pack_bf16(s[2 * kc2 + 1][2], s[2 * kc2 + 1][3])};
#pragma unroll
            for (int nd = 0; nd < HSP / 16; nd++) {
                uint32_t vf[4];
                ldsm_x4_trans(vf, Vb + (kc2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ST + nd * 16 + (lane >> 4) * 8);
                mma_bf16(o[2 * nd], a, vf[0], vf[1]);
                mma_bf16(o[2 * nd + 1], a, vf[2], vf[3]);
            }
        }
        __syncthreads();  // this buffer is refilled two iterations on
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float i0 = 1.f / l0, i1 = 1.f / l1;
    const int r1 = r0 + 8;
#pragma unroll
    for (int n = 0; n < NO; n++) {
        const int col = n * 8 + 2 * (lane & 3);
        if (col >= HS) continue;
        if (r0 < T)
            *reinterpret_cast<__nv_bfloat162 *>(out + ((size_t)b * T + r0) * C + h * HS + col) =
                __floats2bfloat162_rn(o[n][0] * i0, o[n][1] * i0);
        if (r1 < T)
            *reinterpret_cast<__nv_bfloat162 *>(out + ((size_t)b * T + r1) * C + h * HS + col) =
                __floats2bfloat162_rn(o[n][2] * i1, o[n][3] * i1);
    }
}

// ----------------------------------------------------------------------------
// Host side

int sm_count() {
    static int cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 108;
    if (!cached[dev]) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 108;
        cached[dev] = n;
    }
    return cached[dev];
}

template <typename K> cudaError_t allow_smem(K kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)bytes);
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <typename E>
cudaError_t launch_decode(const E *q, const E *kc, const E *vc, E *out, int B, int T, int pos, int NH, int HS,
                          int max_seq, void *ws, size_t ws_bytes, cudaStream_t stream) {
    const int L = pos + T;
    const int ntiles = (L + kDecodeKT - 1) / kDecodeKT;
    const long long bh = (long long)B * NH;
    // Enough blocks for about 8 per multiprocessor, never below one tile per block.
    long long splits = (8LL * sm_count() + bh - 1) / bh;
    if (splits > ntiles) splits = ntiles;
    const size_t per_split = (size_t)bh * T * (HS + 2) * sizeof(float);
    if (splits > 1 && (size_t)splits * per_split > ws_bytes) splits = ws ? (long long)(ws_bytes / per_split) : 1;
    if (splits < 1) splits = 1;
    const int chunk_tiles = (int)((ntiles + splits - 1) / splits);
    const int chunk = chunk_tiles * kDecodeKT;
    splits = (ntiles + chunk_tiles - 1) / chunk_tiles;

    const DecodeSmem lay = decode_smem(HS, sizeof(E));
    const bool vec = HS % (16 / sizeof(E)) == 0 && aligned16(kc) && aligned16(vc);
    const float scale_log2 = (float)(1.4426950408889634 / sqrt((double)HS));
    float *part = static_cast<float *>(ws);
    dim3 grid((unsigned)splits, NH, B);
    cudaError_t e;
    if (T == 1) {
        auto kern = attn_decode<E, 1>;
        if ((e = allow_smem(kern, lay.total)) != cudaSuccess) return e;
        kern<<<grid, kThreads, lay.total, stream>>>(q, kc, vc, out, part, T, pos, NH, HS, max_seq, chunk, (int)splits,
                                                    scale_log2, vec);
    } else {
        auto kern = attn_decode<E, kDecodeTQ>;
        if ((e = allow_smem(kern, lay.total)) != cudaSuccess) return e;
        kern<<<grid, kThreads, lay.total, stream>>>(q, kc, vc, out, part, T, pos, NH, HS, max_seq, chunk, (int)splits,
                                                    scale_log2, vec);
    }
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if (splits > 1) {
        attn_decode_merge<E><<<dim3(T, NH, B), kThreads, 0, stream>>>(part, out, T, NH, HS, (int)splits);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    return cudaSuccess;
}

template <typename E, int HSP, int BN>
cudaError_t launch_simt(const E *q, const E *kc, const E *vc, E *out, int B, int T, int pos, int NH, int HS,
                        int max_seq, cudaStream_t stream) {
    auto kern = attn_prefill_simt<E, HSP, BN>;
    const size_t smem = SimtSmem<HSP, BN>::bytes;
    cudaError_t e = allow_smem(kern, smem);
    if (e != cudaSuccess) return e;
    const bool vec4 = HS % 4 == 0 && aligned16(q) && aligned16(kc) && aligned16(vc);
    const float scale_log2 = (float)(1.4426950408889634 / sqrt((double)HS));
    dim3 grid((T + kBM - 1) / kBM, NH, B);
    kern<<<grid, kThreads, smem, stream>>>(q, kc, vc, out, T, pos, NH, HS, max_seq, scale_log2, vec4);
    return cudaGetLastError();
}

template <typename E>
cudaError_t launch_prefill_simt(const E *q, const E *kc, const E *vc, E *out, int B, int T, int pos, int NH, int HS,
                                int max_seq, cudaStream_t stream) {
    if (HS <= 32) return launch_simt<E, 32, 64>(q, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    if (HS <= 64) return launch_simt<E, 64, 64>(q, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    if (HS <= 96) return launch_simt<E, 96, 32>(q, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    return launch_simt<E, 128, 32>(q, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
}

template <int HSP>
cudaError_t launch_mma(const bf16 *q, const bf16 *kc, const bf16 *vc, bf16 *out, int B, int T, int pos, int NH,
                       int HS, int max_seq, cudaStream_t stream) {
    auto kern = attn_prefill_mma<HSP>;
    const size_t smem = MmaSmem<HSP>::bytes;
    cudaError_t e = allow_smem(kern, smem);
    if (e != cudaSuccess) return e;
    const float scale_log2 = (float)(1.4426950408889634 / sqrt((double)HS));
    dim3 grid((T + kBM - 1) / kBM, NH, B);
    kern<<<grid, kThreads, smem, stream>>>(q, kc, vc, out, T, pos, NH, HS, max_seq, scale_log2);
    return cudaGetLastError();
}

}  // namespace

extern "C" size_t fused_attention_workspace_size(int B, int num_heads, int head_size, int max_seq) {
    if (B <= 0 || num_heads <= 0 || head_size <= 0 || max_seq <= 0) return 0;
    const size_t tiles = ((size_t)max_seq + kDecodeKT - 1) / kDecodeKT;
    return (size_t)B * num_heads * kDecodeTQ * tiles * (head_size + 2) * sizeof(float);
}

extern "C" int fused_attention(const void *q, const void *k_cache, const void *v_cache, void *out, DType dtype, int B,
                               int T, int pos, int num_heads, int head_size, int max_seq, void *workspace,
                               size_t workspace_bytes, cudaStream_t stream) {
    const int NH = num_heads, HS = head_size;
    if (B < 0 || T < 0 || pos < 0 || NH <= 0 || HS <= 0 || HS > 128 || max_seq <= 0 || pos + T > max_seq ||
        (dtype != DTYPE_F32 && dtype != DTYPE_BF16) || B > 65535 || NH > 65535)
        return (int)cudaErrorInvalidValue;
    if (B == 0 || T == 0) return (int)cudaSuccess;
    if (!q || !k_cache || !v_cache || !out) return (int)cudaErrorInvalidValue;
    cudaError_t e;
    if (dtype == DTYPE_BF16) {
        const bf16 *qq = static_cast<const bf16 *>(q), *kk = static_cast<const bf16 *>(k_cache),
                   *vv = static_cast<const bf16 *>(v_cache);
        bf16 *oo = static_cast<bf16 *>(out);
        if (T <= kDecodeTQ) {
            e = launch_decode(qq, kk, vv, oo, B, T, pos, NH, HS, max_seq, workspace, workspace_bytes, stream);
        } else if (HS % 8 == 0 && aligned16(q) && aligned16(k_cache) && aligned16(v_cache)) {
            if (HS <= 32) e = launch_mma<32>(qq, kk, vv, oo, B, T, pos, NH, HS, max_seq, stream);
            else if (HS <= 64) e = launch_mma<64>(qq, kk, vv, oo, B, T, pos, NH, HS, max_seq, stream);
            else if (HS <= 96) e = launch_mma<96>(qq, kk, vv, oo, B, T, pos, NH, HS, max_seq, stream);
            else e = launch_mma<128>(qq, kk, vv, oo, B, T, pos, NH, HS, max_seq, stream);
        } else {
            e = launch_prefill_simt(qq, kk, vv, oo, B, T, pos, NH, HS, max_seq, stream);
        }
    } else {
        const float *qq = static_cast<const float *>(q), *kk = static_cast<const float *>(k_cache),
                    *vv = static_cast<const float *>(v_cache);
        float *oo = static_cast<float *>(out);
        if (T <= kDecodeTQ) e = launch_decode(qq, kk, vv, oo, B, T, pos, NH, HS, max_seq, workspace, workspace_bytes, stream);
        else e = launch_prefill_simt(qq, kk, vv, oo, B, T, pos, NH, HS, max_seq, stream);
    }
    return (int)e;
}

// ----------------------------------------------------------------------------
// The unfused baseline's softmax, for tests/bench_fused_attention.c (a C file cannot hold a kernel).

namespace {
template <typename E>
__global__ void __launch_bounds__(kThreads) softmax_rows_baseline(E *__restrict__ probs, const float *__restrict__ s,
                                                                  int rows, int T, int Tk, int pos, float scale) {
    const int row = blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int n = pos + row % T + 1;
    const float *sr = s + (size_t)row * Tk;
    E *pr = probs + (size_t)row * Tk;
    float mx = -INFINITY, sum = 0.f;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, sr[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int j = lane; j < n; j += 32) sum += expf((sr[j] - mx) * scale);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = 1.f / sum;
    for (int j = lane; j < Tk; j += 32) pr[j] = from_f<E>(j < n ? expf((sr[j] - mx) * scale) * inv : 0.f);
}
}  // namespace

extern "C" int attention_softmax_baseline(void *probs, const float *scores, int rows, int T, int Tk, int pos,
                                          float scale, DType dtype, cudaStream_t stream) {
    if (rows <= 0) return 0;
    const unsigned blocks = (unsigned)((rows + kThreads / 32 - 1) / (kThreads / 32));
    if (dtype == DTYPE_BF16)
        softmax_rows_baseline<bf16><<<blocks, kThreads, 0, stream>>>(static_cast<bf16 *>(probs), scores, rows, T, Tk,
                                                                     pos, scale);
    else
        softmax_rows_baseline<float><<<blocks, kThreads, 0, stream>>>(static_cast<float *>(probs), scores, rows, T,
                                                                      Tk, pos, scale);
    return (int)cudaGetLastError();
}
