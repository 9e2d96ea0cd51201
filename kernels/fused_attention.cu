// Fused causal attention over the KV cache (issue 5): see fused_attention.h for the contract.
//
// Four kernels:
//   attn_prefill_mma   bf16, HS % 8 == 0 (T > 4). Flash-attention 2 on tensor cores: S = Q K^T and
//                      O += P V with mma.sync m16n8k16 (fp32 accumulators); the S accumulators are
//                      re-packed in registers as the A operand of P V (the layouts coincide), so P
//                      never touches shared memory. Online softmax in exp2 with the scale folded
//                      into one FFMA; only tiles that cross the diagonal are masked. K and V tiles of
//                      64 keys are double-buffered through cp.async. Three shapes: 128 queries per
//                      block, 4 warps of 32 rows (each K or V fragment feeds two mma's), where the
//                      grid fills two blocks per SM (B = 8, T = 1024: 96 -> 59 us); else 64 queries,
//                      warps of 16 rows in two groups of 4 (four from 512 keys) that take alternate
//                      key tiles, each on its own named barrier, and merge their (max, sum, acc) at
//                      the end, dividing the longest block's chain. The longest query tiles are
//                      launched first. On sm_90a with HS = 64 both products run on wgmma instead
//                      (wgmma.cuh), a warpgroup's 64 rows at a time, K and V read by the tensor
//                      cores straight from their 128-byte-swizzled tiles: 11-18% faster; there K and
//                      V come by TMA wherever every key is on one side of the split (KvMaps).
//   attn_prefill_simt  fp32 (and bf16 with HS % 8 != 0), T > 4: the same tiling on fp32 FMAs.
//                      128 threads hold a 4 (or 2) x 8 score micro-tile each; Q and K sit
//                      transposed in shared memory so every inner-loop read is conflict-free.
//   attn_decode1       T = 1 (generation), flash-decoding: the grid is (splits, NH, B), each block
//                      a chunk of one head's cache. No shared-memory staging: 16 quarter-warp
//                      streams per block read K and V rows straight into registers, each with its
//                      own online softmax; they merge at the end (a warp's four by shuffles, then
//                      the four warps through shared memory). Through fused_attention_qkv
//                      (batched decode on the cuBLASLt route) q and the new key and value come
//                      from the qkv product and the new row is stored into the cache on the way.
//   attn_decode        T = 2..4 (and T = 1 with unaligned rows): the same split, 64-key tiles
//                      staged in shared memory (16-byte cp.async, double-buffered).
// A split block writes its partial (max, sum, acc) to the workspace; the last block of a head to
// finish (a counter per head) merges: out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s.
// No second launch. On sm_90 and later attn_decode1's splits of a head form one cluster and merge
// in its first block's shared memory instead (no workspace, fence or counter). Causal tiles are
// never loaded: a query tile starting at q0 reads keys < pos + q0 + (its size) only. Every query
// sees key 0, so a softmax that has seen tile 0 has a finite maximum; where a stream may start on
// keys a query cannot see (a decode chunk past pos + t, the second warp group of a prefill block),
// -inf maxima are kept out of the exponents explicitly.
#include "cluster.cuh"
#include "fused_attention.h"
#include "kernel_util.h"  // device_attr, unpack16
#include "mma.cuh"
#include "pdl.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

namespace {

typedef __nv_bfloat16 bf16;

constexpr int kThreads = 128;  // every kernel here: 4 warps
constexpr int kDecodeKT = 64;  // keys per decode tile
constexpr int kDecodeTQ = 4;   // decode kernel takes T <= 4 queries

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
template <typename E> __device__ __forceinline__ E from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float v) { return __float2bfloat16_rn(v); }

// 4 consecutive elements as a float4 (16-byte fp32 or 8-byte bf16 load).
__device__ __forceinline__ float4 load4(const float *p) { return __ldg(reinterpret_cast<const float4 *>(p)); }
__device__ __forceinline__ float4 load4(const bf16 *p) {
    uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xffff0000u));
}

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

// rows x cols of E, contiguous in global and shared memory alike, through 16-byte cp.async;
// rows past rows_valid zero-filled. No index arithmetic beyond a multiply.
template <typename E>
__device__ __forceinline__ void load_flat(E *dst, const E *src, int rows, int rows_valid, int cols) {
    constexpr int VW = 16 / sizeof(E);
    const int nv = cols / VW, n = rows * nv, nvalid = rows_valid * nv;
    for (int u = threadIdx.x; u < n; u += kThreads) {
        const bool ok = u < nvalid;
        cp_async16(dst + u * VW, ok ? src + (size_t)u * VW : src, ok ? 16 : 0);
    }
}

// The new tokens' rows, for kernels that read them in either layout: q [B*T] rows ldq apart, head h
// at column h*HS; their keys and values in the cache already (k_new = NULL), or at k_new / v_new
// (rows ldq apart, same columns: the qkv product, fused_attention_qkv), and then the kernel also
// stores them into the cache.
template <typename E> struct NewRows {
    const E *q, *k_new, *v_new;
    long long ldq;
};

// ----------------------------------------------------------------------------
// Decode: flash-decoding over chunks of the cache

// Workspace: split counters (the last block of a head to finish merges it), then the partials.
constexpr size_t kCounterBytes = 65536;
constexpr int kMaxCounters = (int)(kCounterBytes / sizeof(unsigned));

// Element d of one query's merged output from its splits' partials, at(s, i) = element i of split
// s's (m, l, acc[HS]) (a query that sees no key of a chunk has m = -inf, l = 0, acc = 0 there):
//   out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s, M finite (split 0 holds key 0).
template <typename At> __device__ __forceinline__ float merge_splits(int splits, int d, At at) {
    float M = -INFINITY;
    for (int sp = 0; sp < splits; sp++) M = fmaxf(M, at(sp, 0));
    float num = 0.f, den = 0.f;
    for (int sp = 0; sp < splits; sp++) {
        const float w = exp2f(at(sp, 0) - M);
        den = fmaf(w, at(sp, 1), den);
        num = fmaf(w, at(sp, 2 + d), num);
    }
    return num / den;
}

// The end of a split block: its partial (res = unnormalised sum p.v [T][HS], ms / ls = max and sum
// per query, all in shared memory and visible) goes to pb = this head's partials [T][splits][2 + HS];
// the last of the head's blocks to arrive (counter) merges all splits into out (this head's columns
// of row b*T) and leaves the counter at zero.
template <typename E>
__device__ __forceinline__ void finish_split(float *pb, unsigned *counter, E *outh, int T, int HS, int C, int split,
                                             int splits, const float *res, const float *ms, const float *ls) {
    const int tid = threadIdx.x;
    const size_t prow = (size_t)HS + 2;
    for (int i = tid; i < T * HS; i += kThreads) {
        const int t = i / HS, d = i - t * HS;
        pb[((size_t)t * splits + split) * prow + 2 + d] = res[i];
    }
    if (tid < T) {
        pb[((size_t)tid * splits + split) * prow] = ms[tid];
        pb[((size_t)tid * splits + split) * prow + 1] = ls[tid];
    }
    __shared__ unsigned ticket;
    __threadfence();
    __syncthreads();
    if (tid == 0) ticket = atomicAdd(counter, 1u);
    __syncthreads();
    if (ticket != (unsigned)splits - 1) return;
    __threadfence();
    for (int i = tid; i < T * HS; i += kThreads) {
        const int t = i / HS, d = i - t * HS;
        const float *p = pb + (size_t)t * splits * prow;
        const float o = merge_splits(splits, d, [&](int sp, int j) { return __ldcg(p + sp * prow + j); });
        outh[(size_t)t * C + d] = from_f<E>(o);
    }
    if (tid == 0) *counter = 0;
}

// T = 1, HS a multiple of 16 bytes: no shared-memory staging. The block's 16 quarter-warps are 16
// independent flash-decoding streams: quarter s takes keys k0 + 16u + s of each 16U-key step, its
// 8 lanes hold 16-byte column chunks sub, sub + 8, ... of q, of the key and value rows (loaded
// straight into registers, U keys' K and V in flight per lane) and of acc. q.k is a 3-step shuffle
// within the quarter; the running max and sum are per stream, so no barrier until the 16 streams
// merge at the end. QIT = 16-byte chunks per lane (HS / (8 * 16 / sizeof(E)), rounded up).
// With nr.k_new (fused_attention_qkv) the key and value at pos come from the qkv product, and the
// block whose chunk holds pos also stores them into the cache: no other block reads that row.
// In a decode graph (pos_device given) the first U keys of each stream are loaded before the PDL
// wait, all but the one at pos: the rows before pos were written by earlier steps, which have
// completed (a graph launch follows the work before it in stream order), so their DRAM latency
// overlaps the previous kernel's tail; only q and the row at pos come from that kernel. Outside a
// graph a chain of early-launched kernels could reach back into the previous step, so there the
// loads wait.
// CL (sm_90 on): a head's split blocks are one cluster along x, and they merge in block 0's shared
// memory. No workspace, fence or ticket: the merge of 2-9 splits through global memory cost batch 1
// ~10% of a step at long caches (docs/PERF.md, "Session 13"). Every block arrives on the cluster
// barrier at the start ("started"; block 0 has initialised its mbarrier by then), and the others
// wait on that phase before they send, so block 0 is running when their partials land. Each sends
// its partial as 8-byte st_async whose bytes count on block 0's mbarrier; block 0's threads arrive
// on it (their own row), wait for the bytes thread 0 expects, arrive on the cluster barrier
// ("received", which the senders wait on before they leave) and merge. The partials by plain
// remote stores and a cluster barrier (whose release waits for them) took ~1 us more at 16
// splits, a batch-1 step at 1024 keys 4.5% longer (docs/PERF.md, "Session 44").
// The blocks past the cache leave at once, which the barrier allows (kernels/cluster.cuh).
constexpr int kMaxClusterSplits = 16;  // the largest (non-portable) cluster on sm_90
// Shared memory a decode block holds beyond its own (dynamic, unused). It caps how many blocks share
// an SM with a batch-64 qkv block (145 KB) at the 70% split: three (one of the cluster kernel, with
// its table), as when the block staged all 16 streams' sums. H200, batch 64 after 16 tokens, with the
// blocks' own 1.3 KB plus 0 / 2 / 3 / 4.4 KB (six / four / three / two beside qkv): 225k / 232k /
// 238k / 234k tokens/s. All resident early, the kernel ran 0.8 us shorter, but its early cache loads
// slowed the LayerNorm before qkv and the boundaries around it more (docs/PERF.md, "Session 46").
constexpr size_t kDecodeHold = 3072;
template <typename E, int QIT, bool CL>
__global__ void __launch_bounds__(kThreads) attn_decode1(NewRows<E> nr, E *__restrict__ kc, E *__restrict__ vc,
                                                         E *__restrict__ out, unsigned *__restrict__ counters,
                                                         float *__restrict__ part, int pos,
                                                         const int *__restrict__ pos_device, int NH, int HS,
                                                         int max_seq, int chunk, float scale_log2) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();  // kernels/pdl.cuh: the next kernel's weights start streaming now
    __shared__ __align__(8) uint64_t partials_in;  // CL, block 0: the other splits' partials, by their bytes
    if constexpr (CL) {
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            mbar_init(&partials_in, kThreads);
            mbar_fence_init();  // before the arrive below: another block may send once it has waited
        }
        cluster_arrive_relaxed();  // "started"
    }
    // A decode graph's position (the grid was laid out for the bound): copied before the step's
    // first kernel, so it may be read before the wait.
    if (pos_device) pos = *pos_device;
    // The chunks that hold a key; the blocks past them leave now (a decode graph's grid covers the
    // longest cache, and its empty blocks used to join the merge: docs/PERF.md, "Session 8").
    const int splits = (pos + chunk) / chunk;
    if ((int)blockIdx.x >= splits) return;
    constexpr int VW = 16 / sizeof(E);
    constexpr int U = QIT >= 4 ? 1 : 4 / QIT;  // 4 chunks of K and 4 of V in flight per lane
    constexpr int NS = 16;                     // streams per block
    constexpr int NW = kThreads / 32;          // warps per block, 4 streams each
    constexpr int kMl = QIT * 8 * VW;          // a lane's columns, 8 lanes
    __shared__ __align__(16) float sm_acc[NW][kMl];
    __shared__ float sm_m[NW], sm_l[NW], res[kMl], ms[1], ls[1];
    // CL, block 0: the splits' partials, a row each: acc at [0, HS), then the max and the sum at kMl.
    __shared__ __align__(16) float table[CL ? kMaxClusterSplits : 1][CL ? kMl + 4 : 1];
    static_assert(kMl <= kThreads, "one output dimension a thread");

    const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, sub = lane & 7, stream = tid >> 3;
    const int NV = HS / VW, C = NH * HS, L = pos + 1;
    const int kbeg = split * chunk, kend = min(kbeg + chunk, L);
    const size_t bh = (size_t)b * NH + h;
    const E *kb = kc + bh * max_seq * HS;
    const E *vb = vc + bh * max_seq * HS;
    const E *knew = nr.k_new ? nr.k_new + (size_t)b * nr.ldq + h * HS : nullptr;
    const E *vnew = nr.k_new ? nr.v_new + (size_t)b * nr.ldq + h * HS : nullptr;

    // This lane's chunks of the key and value rows of one key into slot u (zero past kend).
    uint4 kraw[U][QIT], vraw[U][QIT];
    auto load_key = [&](int u, int key) {
        const bool fresh = knew && key == pos;
        const E *krow = fresh ? knew : kb + (size_t)key * HS, *vrow = fresh ? vnew : vb + (size_t)key * HS;
#pragma unroll
        for (int it = 0; it < QIT; it++) {
            const int v = sub + it * 8;
            if (key < kend && v < NV) {
                kraw[u][it] = __ldg(reinterpret_cast<const uint4 *>(krow + v * VW));
                vraw[u][it] = __ldg(reinterpret_cast<const uint4 *>(vrow + v * VW));
            } else {
                kraw[u][it] = make_uint4(0, 0, 0, 0);
                vraw[u][it] = make_uint4(0, 0, 0, 0);
            }
        }
    };
    const bool early = pos_device != nullptr;
#pragma unroll
    for (int u = 0; u < U; u++)
        if (early) load_key(u, kbeg + u * NS + stream == pos ? kend : kbeg + u * NS + stream);
    pdl_wait();  // q and the row at pos come from the kernel before
#pragma unroll
    for (int u = 0; u < U; u++)
        if (!early || kbeg + u * NS + stream == pos) load_key(u, kbeg + u * NS + stream);
    if (knew && kbeg <= pos && pos < kend && tid < NV) {
        const size_t at = (size_t)pos * HS + tid * VW;
        *reinterpret_cast<uint4 *>(kc + bh * max_seq * HS + at) = *reinterpret_cast<const uint4 *>(knew + tid * VW);
        *reinterpret_cast<uint4 *>(vc + bh * max_seq * HS + at) = *reinterpret_cast<const uint4 *>(vnew + tid * VW);
    }

    float qr[QIT][VW], acc[QIT][VW];
#pragma unroll
    for (int it = 0; it < QIT; it++) {
        const int v = sub + it * 8;
        if (v < NV) unpack16(nr.q + (size_t)b * nr.ldq + h * HS + v * VW, qr[it]);
#pragma unroll
        for (int e = 0; e < VW; e++) {
            qr[it][e] = v < NV ? qr[it][e] * scale_log2 : 0.f;
            acc[it][e] = 0.f;
        }
    }
    float m = -INFINITY, l = 0.f;

    for (int k0 = kbeg; k0 < kend; k0 += NS * U) {
        if (k0 > kbeg)  // the first batch is in flight since before the wait
#pragma unroll
            for (int u = 0; u < U; u++) load_key(u, k0 + u * NS + stream);
        float sc[U];
        float mx = -INFINITY;
#pragma unroll
        for (int u = 0; u < U; u++) {
            float dot = 0.f;
#pragma unroll
            for (int it = 0; it < QIT; it++) {
                float kf[VW];
                unpack16(reinterpret_cast<const E *>(&kraw[u][it]), kf);
#pragma unroll
                for (int e = 0; e < VW; e++) dot = fmaf(qr[it][e], kf[e], dot);
            }
            dot += __shfl_xor_sync(0xffffffffu, dot, 4);
            dot += __shfl_xor_sync(0xffffffffu, dot, 2);
            dot += __shfl_xor_sync(0xffffffffu, dot, 1);
            sc[u] = (k0 + u * NS + stream < kend) ? dot : -INFINITY;
            mx = fmaxf(mx, sc[u]);
        }
        const float m_new = fmaxf(m, mx);
        if (m_new != -INFINITY) {  // the same in the quarter's 8 lanes
            const float alpha = exp2f(m - m_new);
            l *= alpha;
#pragma unroll
            for (int it = 0; it < QIT; it++)
#pragma unroll
                for (int e = 0; e < VW; e++) acc[it][e] *= alpha;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float p = exp2f(sc[u] - m_new);
                l += p;
#pragma unroll
                for (int it = 0; it < QIT; it++) {
                    float vf[VW];
                    unpack16(reinterpret_cast<const E *>(&vraw[u][it]), vf);
#pragma unroll
                    for (int e = 0; e < VW; e++) acc[it][e] = fmaf(p, vf[e], acc[it][e]);
                }
            }
            m = m_new;
        }
    }

    trace_mark(TRACE_PHASE + 0);  // TRACE=1 builds (kernel_trace.cuh): this block's keys are done
    // Merge the 16 streams: first a warp's four by shuffles (lanes sub, sub + 8, sub + 16 and sub + 24
    // hold the same columns), then the four warps through shared memory: one barrier and four
    // partials a thread to merge, where all 16 streams through shared memory took sixteen (batch 1
    // +0.7-1.3%: docs/PERF.md, "Session 46"). A stream with no key has m = -inf and weight 0; so may a
    // whole warp's four (a chunk of fewer than 16 keys), whose weights are then 0 by hand, not
    // 2^(-inf + inf).
    const int warp = tid >> 5;
    float mw = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
    mw = fmaxf(mw, __shfl_xor_sync(0xffffffffu, mw, 16));
    const float sw = mw == -INFINITY ? 0.f : exp2f(m - mw);
    l *= sw;
    l += __shfl_xor_sync(0xffffffffu, l, 8);
    l += __shfl_xor_sync(0xffffffffu, l, 16);
#pragma unroll
    for (int it = 0; it < QIT; it++) {
        const int v = sub + it * 8;
#pragma unroll
        for (int e = 0; e < VW; e++) {
            float a = acc[it][e] * sw;
            a += __shfl_xor_sync(0xffffffffu, a, 8);
            a += __shfl_xor_sync(0xffffffffu, a, 16);
            if (lane < 8 && v < NV) sm_acc[warp][v * VW + e] = a;
        }
    }
    if (lane == 0) {
        sm_m[warp] = mw;
        sm_l[warp] = l;
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w2 = 0; w2 < NW; w2++) M = fmaxf(M, sm_m[w2]);
    // M is finite: every block still here holds a key.
    float w[NW], den = 0.f;
#pragma unroll
    for (int w2 = 0; w2 < NW; w2++) {
        w[w2] = exp2f(sm_m[w2] - M);
        den = fmaf(w[w2], sm_l[w2], den);
    }
    // The block's partial, dimension d = tid: the output itself when it is the only split; else row
    // `split` of block 0's table (CL), or res for finish_split.
    E *outh = out + (size_t)b * C + h * HS;
    const int d = tid;
    float num = 0.f;
    if (d < HS)
#pragma unroll
        for (int w2 = 0; w2 < NW; w2++) num = fmaf(w[w2], sm_acc[w2][d], num);
    trace_mark(TRACE_PHASE + 1);  // TRACE=1 builds: the block's streams are merged
    if (splits == 1) {
        if (d < HS) outh[d] = from_f<E>(num / den);
        return;
    }
    if constexpr (CL) {
        if (split == 0) {
            if (d < HS) table[0][d] = num;
            if (tid == 0) {
                table[0][kMl] = M;
                table[0][kMl + 1] = den;
                mbar_arrive_expect_tx(&partials_in, (uint32_t)(splits - 1) * (HS + 2) * (uint32_t)sizeof(float));
            } else {
                mbar_arrive(&partials_in);  // release: row 0's values
            }
            // "Started" (long complete): compute-sanitizer's racecheck lets the other blocks run up
            // to their next cluster barrier only while this one waits on one; spinning on the
            // mbarrier alone, it waited forever.
            cluster_wait();
            mbar_wait_cluster(&partials_in, 0);  // row 0 and rows 1 .. splits - 1
            trace_mark(TRACE_PHASE + 2);         // every split's partial has landed
            cluster_arrive_relaxed();            // "received": the senders may leave
            if (d < HS)
                outh[d] = from_f<E>(merge_splits(
                    splits, d, [&](int sp, int j) { return j < 2 ? table[sp][kMl + j] : table[sp][j - 2]; }));
            return;
        }
        // Dimensions d and d + 1 (HS is even) from two lanes into one 8-byte store.
        const float next = __shfl_down_sync(0xffffffffu, num, 1);
        cluster_wait();  // "started": block 0 is running and its mbarrier initialised
        const uint32_t bar = cluster_map(&partials_in, 0);
        if (d < HS && d % 2 == 0)
            st_async(cluster_map(&table[split][d], 0), make_uint2(__float_as_uint(num), __float_as_uint(next)), bar);
        if (tid == 0)
            st_async(cluster_map(&table[split][kMl], 0), make_uint2(__float_as_uint(M), __float_as_uint(den)), bar);
        // A block leaves only once its distributed shared-memory operations are complete (CUDA
        // programming guide): once block 0 has counted every byte.
        cluster_arrive_relaxed();
        cluster_wait();
        return;
    }
    if (d < HS) res[d] = num;
    if (tid == 0) { ms[0] = M; ls[0] = den; }
    __syncthreads();
    finish_split(part + bh * splits * ((size_t)HS + 2), counters + bh, outh, 1, HS, C, split, splits, res, ms, ls);
}

// Shared-memory layout of attn_decode, shared by host and device. Two K/V stages (the next tile's
// cp.async in flight while this one is used) when they fit in 32 KB, so that 6 or more blocks still
// share a multiprocessor; else one.
struct DecodeSmem {
    int hsp;          // HS rounded up to 16 bytes of E
    int stages;       // K/V tile buffers: 2 (double-buffered) or 1
    size_t tile;      // elements of one K (or V) tile
    size_t q;         // offset of q (fp32, [TQ][hsp]); before it the K/V tiles, or (after the
                      // loop) the key-group partial sums
    size_t s;         // offset of the scores / probabilities (fp32, [TQ][KT])
    size_t stats;     // offset of max, sum, rescale per query
    size_t res;       // offset of the block's unnormalised output (fp32, [TQ][hsp])
    size_t total;
};

__host__ __device__ inline DecodeSmem decode_smem(int HS, int esize) {
    DecodeSmem L;
    const int vw = 16 / esize;
    L.hsp = (HS + vw - 1) / vw * vw;
    L.tile = (size_t)kDecodeKT * L.hsp;
    L.stages = 4 * L.tile * esize <= 32 * 1024 ? 2 : 1;
    const size_t kv = 2 * L.stages * L.tile * esize;
    const size_t red = (size_t)kThreads * kDecodeTQ * vw * sizeof(float);
    L.q = (kv > red ? kv : red);
    L.s = L.q + (size_t)kDecodeTQ * L.hsp * sizeof(float);
    L.stats = L.s + (size_t)kDecodeTQ * kDecodeKT * sizeof(float);
    L.res = L.stats + 4 * kDecodeTQ * sizeof(float);
    L.total = L.res + (size_t)kDecodeTQ * L.hsp * sizeof(float);
    return L;
}

template <typename E, int TQ>
__global__ void __launch_bounds__(kThreads) attn_decode(const E *__restrict__ q, const E *__restrict__ kc,
                                                        const E *__restrict__ vc, E *__restrict__ out,
                                                        unsigned *__restrict__ counters, float *__restrict__ part,
                                                        int T, int pos, const int *__restrict__ pos_device, int NH,
                                                        int HS, int max_seq, int chunk, float scale_log2, int vec) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();  // kernels/pdl.cuh: the next kernel's weights start streaming now
    pdl_wait();               // q and the new key/value row come from the kernel before
    if (pos_device) pos = *pos_device;  // a decode graph's position; the grid was laid out for the bound
    const int splits = (pos + T + chunk - 1) / chunk;  // the chunks that hold a key (attn_decode1)
    if ((int)blockIdx.x >= splits) return;
    constexpr int VW = 16 / sizeof(E);
    constexpr int KT = kDecodeKT;
    extern __shared__ __align__(16) unsigned char smem[];
    const DecodeSmem lay = decode_smem(HS, sizeof(E));
    const int HSP = lay.hsp, NV = HSP / VW;
    E *Kbuf = reinterpret_cast<E *>(smem);  // [stages][KT][HSP], then V the same
    E *Vbuf = Kbuf + lay.stages * lay.tile;
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

    auto load_tile = [&](int k0, int buf) {
        const int rows = min(KT, kend - k0);
        if (vec) {  // HSP == HS: the tile is one contiguous run in both memories
            load_flat(Kbuf + buf * lay.tile, kb + (size_t)k0 * HS, KT, rows, HS);
            load_flat(Vbuf + buf * lay.tile, vb + (size_t)k0 * HS, KT, rows, HS);
        } else {
            load_rows(Kbuf + buf * lay.tile, HSP, kb + (size_t)k0 * HS, HS, KT, rows, HS, false);
            load_rows(Vbuf + buf * lay.tile, HSP, vb + (size_t)k0 * HS, HS, KT, rows, HS, false);
        }
        cp_async_commit();
    };
    load_tile(kbeg, 0);
    for (int k0 = kbeg; k0 < kend; k0 += KT) {
        const int rows = min(KT, kend - k0);
        const int cur = lay.stages == 2 ? ((k0 - kbeg) / KT) & 1 : 0;
        if (lay.stages == 2 && k0 + KT < kend) {
            load_tile(k0 + KT, cur ^ 1);  // its buffer was last read before the previous barrier
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // tile k0 (and q / stats at the start) visible to all
        const E *Ks = Kbuf + cur * lay.tile, *Vs = Vbuf + cur * lay.tile;

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
            __syncwarp();  // every lane has read m_s[t] before lane 0 rewrites it
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
        __syncthreads();  // done with this tile's buffer and S
        if (lay.stages == 1 && k0 + KT < kend) load_tile(k0 + KT, 0);
    }

    // Sum the key groups, then write the output (one split) or this split's partial; the last
    // split of this head to finish merges them all (counters are left at zero for the next call).
    if (g < KG) {
#pragma unroll
        for (int t = 0; t < TQ; t++)
#pragma unroll
            for (int e = 0; e < VW; e++) red[(g * TQ + t) * HSP + c * VW + e] = acc[t][e];
    }
    __syncthreads();
    float *res = reinterpret_cast<float *>(smem + lay.res);
    E *outh = out + (size_t)b * T * C + h * HS;
    for (int i = tid; i < T * HS; i += kThreads) {
        const int t = i / HS, d = i - t * HS;
        float s = 0.f;
        for (int gg = 0; gg < KG; gg++) s += red[(gg * TQ + t) * HSP + d];
        if (splits == 1) outh[(size_t)t * C + d] = from_f<E>(s / l_s[t]);
        else res[i] = s;
    }
    if (splits == 1) return;
    __syncthreads();
    finish_split(part + bh * T * splits * ((size_t)HS + 2), counters + bh, outh, T, HS, C, split, splits, res, m_s,
                 l_s);
}

// ----------------------------------------------------------------------------
// Prefill on fp32 FMAs

// RM query rows per thread (16 RM per block): 4 for throughput, 2 when blocks are few (small B*T).
template <int HSP, int BN, int RM> struct SimtSmem {
    static constexpr int BM = 16 * RM;
    static constexpr int QS = BM + 4;  // Qt row stride: RM-float aligned, rows land on different banks
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

// RM consecutive floats (16 or 8 bytes) from / to shared memory.
template <int RM> __device__ __forceinline__ void ld_rm(const float *p, float (&v)[RM]) {
    if constexpr (RM == 4) {
        const float4 a = *reinterpret_cast<const float4 *>(p);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    } else {
        const float2 a = *reinterpret_cast<const float2 *>(p);
        v[0] = a.x; v[1] = a.y;
    }
}
template <int RM> __device__ __forceinline__ void st_rm(float *p, const float (&v)[RM]) {
    if constexpr (RM == 4) *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
    else *reinterpret_cast<float2 *>(p) = make_float2(v[0], v[1]);
}

template <typename E, int HSP, int BN, int RM>
__global__ void __launch_bounds__(kThreads) attn_prefill_simt(const E *__restrict__ q, const E *__restrict__ kc,
                                                              const E *__restrict__ vc, E *__restrict__ out, int T,
                                                              int pos, int NH, int HS, int max_seq, float scale_log2,
                                                              int vec4) {
    typedef SimtSmem<HSP, BN, RM> Lay;
    constexpr int BM = Lay::BM, QS = Lay::QS, KS = Lay::KS, NJ = BN / 32, ND = HSP / 32;
    extern __shared__ __align__(16) unsigned char smem[];
    float *Qt = reinterpret_cast<float *>(smem);  // [HSP][QS]
    float *Kt = Qt + HSP * QS;                     // [HSP][KS]
    float *Vs = Kt + HSP * KS;                     // [BN][HSP]
    float *Pt = Vs + BN * HSP;                     // [BN][QS]

    const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BM;  // the longest query tiles start first
    const int h = blockIdx.y, b = blockIdx.z;
    const int C = NH * HS, L = pos + T;
    const size_t bh = (size_t)b * NH + h;
    const E *qb = q + ((size_t)b * T + q0) * C + h * HS;
    const E *kb = kc + bh * max_seq * HS;
    const E *vb = vc + bh * max_seq * HS;

    load_transposed(Qt, QS, qb, C, BM, min(BM, T - q0), HS, HSP, vec4 != 0);

    float m[RM], l[RM], acc[RM][ND * 4];
#pragma unroll
    for (int i = 0; i < RM; i++) {
        m[i] = -INFINITY;
        l[i] = 0.f;
#pragma unroll
        for (int d = 0; d < ND * 4; d++) acc[i][d] = 0.f;
    }

    const int kmax = min(L, pos + q0 + BM);
    const int ntiles = (kmax + BN - 1) / BN;
    for (int it = 0; it < ntiles; it++) {
        const int k0 = it * BN, rows = min(BN, L - k0);
        __syncthreads();
        load_transposed(Kt, KS, kb + (size_t)k0 * HS, HS, BN, rows, HS, HSP, vec4 != 0);
        load_rowmajor(Vs, vb + (size_t)k0 * HS, HS, BN, rows, HS, HSP, vec4 != 0);
        __syncthreads();

        // s[i][g*4+e]: query ty*RM+i, key g*32 + tx*4 + e
        float s[RM][NJ * 4];
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < NJ * 4; j++) s[i][j] = 0.f;
#pragma unroll 8
        for (int d = 0; d < HSP; d++) {
            float av[RM];
            ld_rm<RM>(Qt + d * QS + ty * RM, av);
#pragma unroll
            for (int g = 0; g < NJ; g++) {
                const float4 k4 = *reinterpret_cast<const float4 *>(Kt + d * KS + g * 32 + tx * 4);
                const float kv[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
                for (int i = 0; i < RM; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[i][g * 4 + e] = fmaf(av[i], kv[e], s[i][g * 4 + e]);
            }
        }

        const bool need_mask = (k0 + BN - 1 > pos + q0) || (k0 + BN > L);
#pragma unroll
        for (int i = 0; i < RM; i++) {
            const int qpos = pos + q0 + ty * RM + i;
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
            float pj[RM];
#pragma unroll
            for (int i = 0; i < RM; i++) pj[i] = s[i][j];
            st_rm<RM>(Pt + key * QS + ty * RM, pj);
        }
        __syncthreads();

#pragma unroll 4
        for (int j = 0; j < BN; j++) {
            float pv[RM];
            ld_rm<RM>(Pt + j * QS + ty * RM, pv);
#pragma unroll
            for (int k = 0; k < ND; k++) {
                const float4 v4 = *reinterpret_cast<const float4 *>(Vs + j * HSP + k * 32 + tx * 4);
                const float vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
                for (int i = 0; i < RM; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[i][k * 4 + e] = fmaf(pv[i], vv[e], acc[i][k * 4 + e]);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < RM; i++) {
        float lt = l[i];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        lt += __shfl_xor_sync(0xffffffffu, lt, 4);
        const float inv = 1.f / lt;
        const int row = q0 + ty * RM + i;
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

// 2^x in one MUFU op (flush-to-zero, ~2 ulp): the bf16 path rounds P to 8 bits anyway, where
// exp2f's denormal handling costs four more instructions per score.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// Block geometry. A warp owns MI m-blocks of 16 query rows: with MI = 2 every K or V fragment read
// from shared memory feeds two mma's (half the ldmatrix traffic per FLOP) and each warp has two
// independent softmax chains; HS > 64 keeps MI = 1 for registers. QW warps stack along the queries
// (BM = 16 MI QW per block); G groups of QW warps take alternate 64-key tiles of the block (each
// group double-buffers its tiles through cp.async and syncs on its own named barrier) and merge their
// (max, sum, acc) at the end, which divides the longest block's serial chain by G.
// WG (sm_90a, HS = 64): each four warps of a group are a warpgroup whose 64 rows multiply on wgmma,
// K and V straight from their tiles in shared memory (no ldmatrix), so MI = 1 and QW is a multiple
// of 4; the tiles then hold 128-byte rows under the 128-byte swizzle instead of padded rows.
template <int HSP, int MI, int QW, int G, bool WG> struct MmaCfg {
    static_assert(G <= 4, "named barriers 1 to 4");
    static_assert(!WG || (HSP == 64 && MI == 1 && QW % 4 == 0), "wgmma: 64-row warpgroups of HS = 64");
    static constexpr int BM = 16 * MI * QW;  // queries per block
    static constexpr int GT = 32 * QW;       // threads per group
    static constexpr int THREADS = GT * G;
    // blocks per SM the registers allow: <= 255 a thread; wgmma's 128 (16 warps an SM) spill nothing
    static constexpr int MINB = WG ? 512 / THREADS : THREADS <= 128 ? 2 : 1;
    static constexpr int ST = HSP + 8;  // Q's rows: 16 bytes of padding, so ldmatrix rows hit distinct banks
    static constexpr int KST = WG ? HSP : ST;  // K's and V's rows
    static constexpr int STAGES = HSP <= 64 ? 2 : 1;  // per group; 1 keeps HS = 128 under 99 KB (sm_86)
    static constexpr size_t ktile = (size_t)64 * KST;  // elements of one 64-key K or V tile
    static constexpr size_t group = 2 * STAGES * ktile;  // a group's K and V buffers
    static constexpr size_t qtile = WG ? (BM * ST + 511) / 512 * 512 : BM * ST;  // the swizzled tiles 1024-byte aligned
    static constexpr size_t align = WG ? 1024 : 1;  // of the dynamic shared memory's start, with the slack
    static constexpr int BARS = WG ? G * STAGES : 0;  // TMA's K and V tiles: a barrier a group's buffer
    // Q, then each group's buffers, then the barriers
    static constexpr size_t bytes = (qtile + G * group) * sizeof(bf16) + BARS * sizeof(uint64_t) + align - 1;
    // a group's exchange (per thread: MI x (2 maxima, 2 sums, the accumulators)) fits in its buffers
    static constexpr int XV = MI * (4 + HSP / 2);
    static_assert(G == 1 || (size_t)XV * GT * sizeof(float) <= group * sizeof(bf16), "xch");
};

// Named barrier 1 + g for the NTHR threads of group g of G (0 is __syncthreads). Immediate ids: with
// a register id the compiler reserves all 16 barriers; one group needs no switch (ncu: a jump table
// in every tile of the loop; docs/PERF.md, Session 17).
template <int NTHR, int G> __device__ __forceinline__ void group_barrier(int g) {
    if constexpr (G == 1) {
        asm volatile("bar.sync 1, %0;\n" ::"n"(NTHR) : "memory");
        return;
    }
    switch (g) {
    case 0: asm volatile("bar.sync 1, %0;\n" ::"n"(NTHR) : "memory"); break;
    case 1: asm volatile("bar.sync 2, %0;\n" ::"n"(NTHR) : "memory"); break;
    case 2: asm volatile("bar.sync 3, %0;\n" ::"n"(NTHR) : "memory"); break;
    default: asm volatile("bar.sync 4, %0;\n" ::"n"(NTHR) : "memory"); break;
    }
}

// Where the rows a prefill block reads live: rows [0, split) at `old` (row stride old_stride), rows
// from split on at `fresh` (row stride fresh_stride, counted from split). Keys before pos are in the
// cache; the new tokens' keys are in the cache too (split = all), or still in the qkv product's rows
// (fused_attention_qkv: split = pos). Queries are all fresh (split = 0).
struct RowSrc {
    const bf16 *old, *fresh;
    int old_stride, fresh_stride, split;
    __device__ __forceinline__ const bf16 *row(int r) const {
        return r < split ? old + (size_t)r * old_stride : fresh + (size_t)(r - split) * fresh_stride;
    }
};

// Where 16-byte chunk c of row t of a tile of row stride ST starts: plain rows, or (SW) 64-element
// rows under the 128-byte swizzle that wgmma reads (wgmma.cuh).
template <int ST, bool SW> __device__ __forceinline__ int tile_at(int t, int c) {
    static_assert(!SW || ST == 64, "swizzled rows are 128 bytes");
    return SW ? t * 64 + ((c ^ (t & 7)) << 3) : t * ST + c * 8;
}

// ROWS rows of HS bf16 from src's rows r0.. into shared rows of stride ST (SW: swizzled) through
// 16-byte cp.async by NTHR threads (index i0), rows past rows_valid zero-filled, columns past HS
// untouched.
template <int HSP, int ST, bool SW, int ROWS, int NTHR>
__device__ __forceinline__ void load_tile(bf16 *dst, const RowSrc &src, int r0, int rows_valid, int HS, int i0) {
    constexpr int CPR = HSP / 8;  // 16-byte chunks per padded row (4, 8, 12, 16)
    if constexpr (NTHR % CPR == 0) {
        // A thread keeps one column chunk c and takes rows t0, t0 + RS, ...
        constexpr int RS = NTHR / CPR;
        static_assert(ROWS % RS == 0 || RS % ROWS == 0, "tile split");
        const int c = i0 % CPR, t0 = i0 / CPR;
        if (c * 8 >= HS || t0 >= ROWS) return;  // the padding columns were zeroed once
        if (rows_valid == ROWS && (r0 + ROWS <= src.split || r0 >= src.split)) {
            // The common tile: every row there, all on one side of the split, so evenly spaced: one
            // address computed, not a select, a product and a bound a chunk (ncu: the loads were
            // ~170 of ~490 warp instructions per tile of the wgmma kernel; docs/PERF.md, Session 16).
            const bf16 *p = src.row(r0 + t0) + c * 8;
            const size_t step = (size_t)RS * (r0 < src.split ? src.old_stride : src.fresh_stride);
#pragma unroll
            for (int i = 0; i < (ROWS + RS - 1) / RS; i++)
                cp_async16(dst + tile_at<ST, SW>(t0 + i * RS, c), p + i * step, 16);
            return;
        }
        // A valid address for the zero-filled rows, taken here only (above it cost every tile a
        // select and a product: docs/PERF.md, Session 17).
        const bf16 *any = src.row(r0);
#pragma unroll
        for (int i = 0; i < (ROWS + RS - 1) / RS; i++) {
            const int t = t0 + i * RS;
            const bool ok = t < rows_valid;
            cp_async16(dst + tile_at<ST, SW>(t, c), ok ? src.row(r0 + t) + c * 8 : any, ok ? 16 : 0);
        }
    } else {
        static_assert(ROWS * CPR % NTHR == 0, "tile split");
        const bf16 *any = src.row(r0);
#pragma unroll
        for (int i = 0; i < ROWS * CPR / NTHR; i++) {
            const int u = i0 + i * NTHR, t = u / CPR, c = u % CPR;
            if (c * 8 < HS) {
                const bool ok = t < rows_valid;
                cp_async16(dst + tile_at<ST, SW>(t, c), ok ? src.row(r0 + t) + c * 8 : any, ok ? 16 : 0);
            }
        }
    }
}

// One 64-key tile (Kb, Vb in shared memory) against a warp's MI x 16 query rows, in three steps:
// S = Q K^T, the online softmax of S, O += P V. The accumulators of S are P's A fragment (the
// layouts coincide), so P never touches shared memory. qp = pos + the warp's first row + lane / 4:
// this thread's rows are qp + 16 mi and qp + 16 mi + 8.

// S = Q K^T on mma.sync.
template <int HSP, int MI>
__device__ __forceinline__ void scores_mma(float (&s)[MI][8][4], const bf16 *Kb, const uint32_t (&qf)[MI][HSP / 16][4],
                                           int lane) {
    constexpr int ST = HSP + 8;
#pragma unroll
    for (int n = 0; n < 8; n++) {
#pragma unroll
        for (int mi = 0; mi < MI; mi++) s[mi][n][0] = s[mi][n][1] = s[mi][n][2] = s[mi][n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HSP / 32; kk++) {
            uint32_t kf[4];
            ldmatrix_x4(kf, Kb + (n * 8 + (lane & 7)) * ST + kk * 32 + (lane >> 3) * 8);
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                mma_bf16_16816(s[mi][n], qf[mi][2 * kk], kf[0], kf[1]);
                mma_bf16_16816(s[mi][n], qf[mi][2 * kk + 1], kf[2], kf[3]);
            }
        }
    }
}

// The online softmax of one tile's scores: s becomes P (unnormalised), m and l the running maxima
// and sums, al the factors the accumulators must be scaled by. MASK for the tiles that cross the
// diagonal, a separate copy of the code so that the others carry no masking instructions.
template <int MI, bool MASK>
__device__ __forceinline__ void softmax_tile(float (&s)[MI][8][4], float (&m)[MI][2], float (&l)[MI][2],
                                             float (&al)[MI][2], int lane, int k0, int qp, float scale_log2) {
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
        if (MASK) {  // keys past L meet rows past T only (row r < T sees keys <= pos + r < L): never stored
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (k0 + n * 8 + 2 * (lane & 3) + (e & 1) > qp + mi * 16 + (e < 2 ? 0 : 8)) s[mi][n][e] = -INFINITY;
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < 8; n++) {
            mx0 = fmaxf(mx0, fmaxf(s[mi][n][0], s[mi][n][1]));
            mx1 = fmaxf(mx1, fmaxf(s[mi][n][2], s[mi][n][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        // A row can see no key in this group's tiles so far (a group past the diagonal): keep -inf
        // out of the exponents. m is in raw score units, so p = 2^(s scale - m scale) is one FFMA.
        const float mn0 = fmaxf(m[mi][0], mx0), mn1 = fmaxf(m[mi][1], mx1);
        const float ms0 = mn0 == -INFINITY ? 0.f : mn0 * scale_log2;
        const float ms1 = mn1 == -INFINITY ? 0.f : mn1 * scale_log2;
        al[mi][0] = fast_exp2(fmaf(m[mi][0], scale_log2, -ms0));
        al[mi][1] = fast_exp2(fmaf(m[mi][1], scale_log2, -ms1));
        m[mi][0] = mn0;
        m[mi][1] = mn1;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int n = 0; n < 8; n++) {
            s[mi][n][0] = fast_exp2(fmaf(s[mi][n][0], scale_log2, -ms0));
            s[mi][n][1] = fast_exp2(fmaf(s[mi][n][1], scale_log2, -ms0));
            s[mi][n][2] = fast_exp2(fmaf(s[mi][n][2], scale_log2, -ms1));
            s[mi][n][3] = fast_exp2(fmaf(s[mi][n][3], scale_log2, -ms1));
            rs0 += s[mi][n][0] + s[mi][n][1];
            rs1 += s[mi][n][2] + s[mi][n][3];
        }
        l[mi][0] = l[mi][0] * al[mi][0] + rs0;
        l[mi][1] = l[mi][1] * al[mi][1] + rs1;
    }
}

template <int MI, int NO>
__device__ __forceinline__ void rescale(float (&o)[MI][NO][4], const float (&al)[MI][2]) {
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int n = 0; n < NO; n++) {
            o[mi][n][0] *= al[mi][0];
            o[mi][n][1] *= al[mi][0];
            o[mi][n][2] *= al[mi][1];
            o[mi][n][3] *= al[mi][1];
        }
}

// P in bf16 as the A fragments of keys 16 kc .. 16 kc + 15: the accumulators of key blocks 2 kc
// and 2 kc + 1.
__device__ __forceinline__ void pack_p(uint32_t (&a)[4], const float (&s)[8][4], int kc) {
    a[0] = pack_bf16(s[2 * kc][0], s[2 * kc][1]);
    a[1] = pack_bf16(s[2 * kc][2], s[2 * kc][3]);
    a[2] = pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]);
    a[3] = pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3]);
}

// The two products on wgmma (HS = 64), each issued as one committed group; the caller waits. The K
// tile is read K-major (key n's row holds its 64 dimensions, 16 per MMA), the V tile N-major (key
// k's row holds the 64 output columns; 16 keys per MMA).
__device__ __forceinline__ void scores_wgmma(float (&s)[8][4], const bf16 *Kb, const uint32_t (&qf)[4][4]) {
    const uint64_t kd = wgmma_desc_sw128(Kb);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_m64n64k16<0>(s, qf[kk], kd + 2 * kk, kk > 0);
    wgmma_commit();
}
__device__ __forceinline__ void pv_wgmma(float (&o)[8][4], uint32_t (&p)[4][4], const bf16 *Vb) {
    const uint64_t vd = wgmma_desc_sw128(Vb);
    wgmma_hold(p);
    wgmma_hold(o);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < 4; kc++) wgmma_m64n64k16<1>(o, p[kc], vd + 128 * kc, true);
    wgmma_commit();
}

// The three steps in a row, on mma.sync or (WG) wgmma. Issuing tile j's S before tile j - 1's P V
// to overlap the softmax with the tensor cores (flash-attention 3's order) measured slower: 16.4
// against 12.9 us at B = 1, T = 1024 (docs/PERF.md, "Session 15").
template <int HSP, int MI, bool MASK, bool WG>
__device__ __forceinline__ void attend_tile(const bf16 *Kb, const bf16 *Vb, const uint32_t (&qf)[MI][HSP / 16][4],
                                            float (&o)[MI][HSP / 8][4], float (&m)[MI][2], float (&l)[MI][2],
                                            int lane, int k0, int qp, float scale_log2) {
    constexpr int ST = HSP + 8;
    float s[MI][8][4], al[MI][2];
    if constexpr (WG) {
        scores_wgmma(s[0], Kb, qf[0]);
        wgmma_wait<0>();
        wgmma_hold(s[0]);
    } else {
        scores_mma<HSP, MI>(s, Kb, qf, lane);
    }
    softmax_tile<MI, MASK>(s, m, l, al, lane, k0, qp, scale_log2);
    rescale(o, al);
    if constexpr (WG) {
        uint32_t p[4][4];
#pragma unroll
        for (int kc = 0; kc < 4; kc++) pack_p(p[kc], s[0], kc);
        pv_wgmma(o[0], p, Vb);
        wgmma_wait<0>();
        wgmma_hold(o[0]);
    } else {
#pragma unroll
        for (int kc = 0; kc < 4; kc++) {
            uint32_t a[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++) pack_p(a[mi], s[mi], kc);
#pragma unroll
            for (int nd = 0; nd < HSP / 16; nd++) {
                uint32_t vf[4];
                ldmatrix_x4_trans(vf,
                                  Vb + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ST + nd * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    mma_bf16_16816(o[mi][2 * nd], a[mi], vf[0], vf[1]);
                    mma_bf16_16816(o[mi][2 * nd + 1], a[mi], vf[2], vf[3]);
                }
            }
        }
    }
}

// K and V by TMA (the wgmma kernel where every key it reads sits on one side of the split: a prompt's
// keys all in the qkv product's rows, or all in the cache): one 4-D map each (tma.cuh's
// tensor_map_rows4) whose box is one 64-key tile of one head, keys past the end read as zeros. A
// tile is then two copies issued by one thread and one barrier wait, not 64 x 8 cp.async over the
// group's threads with their addresses, a wait and a proxy fence: ncu had counted the loads at a
// quarter of the kernel's instructions (docs/PERF.md, "Session 17"). H200, bench_fused_attention,
// us: B = 8, T = 1024 53.2 -> 44.8; B = 1, T = 1024 10.7 -> 10.1; B = 1, T = 512 6.5 -> 6.1
// ("Session 41"). Through the qkv product (pos = 0) a block's own keys and values, whole tiles there,
// go into the cache by two bulk copies from the same buffers, not store_own's 16-byte stores: the
// engine's attention 59.0 -> 53.1 us a layer in the 8 x 1024 forward, 12.0 -> 11.4 at 1 x 1024.
struct KvMaps {
    CUtensorMap k, v;
    CUtensorMap k_cache, v_cache;  // the qkv route: where the block's own keys and values go (head_first = 1)
    int head_first;  // 1: the head is the maps' first index after the column (the qkv rows), 0: the key (the cache)
};

// The grid is (NH, B, query tiles), the z index reversed: blocks start in index order, so the
// longest (last) query tiles of every head go first and the short ones fill the tail.
template <int HSP, int MI, int QW, int G, bool WG, bool TMA>
__global__ void __launch_bounds__(MmaCfg<HSP, MI, QW, G, WG>::THREADS, MmaCfg<HSP, MI, QW, G, WG>::MINB)
    attn_prefill_mma(NewRows<bf16> nr, bf16 *__restrict__ kc, bf16 *__restrict__ vc, bf16 *__restrict__ out, int T,
                     int pos, int NH, int HS, int max_seq, float scale_log2, const __grid_constant__ KvMaps maps) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    typedef MmaCfg<HSP, MI, QW, G, WG> Cfg;
    constexpr int BN = 64, BM = Cfg::BM, GT = Cfg::GT, ST = Cfg::ST, KST = Cfg::KST, NK = HSP / 16, NO = HSP / 8;
    constexpr int STAGES = Cfg::STAGES;
    static_assert(!TMA || (WG && STAGES == 2), "TMA tiles: the wgmma kernel's two buffers a group");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // Q [BM][ST], then per group: K [STAGES][64][KST], V the same; from a 1024-byte boundary for wgmma;
    // then (WG) a barrier per group and buffer
    unsigned char *smem = smem_raw + ((Cfg::align - __cvta_generic_to_shared(smem_raw) % Cfg::align) % Cfg::align);
    bf16 *Qs = reinterpret_cast<bf16 *>(smem);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int grp = warp / QW, wq = warp % QW, gtid = tid % GT;
    bf16 *Kg = Qs + Cfg::qtile + grp * Cfg::group;
    bf16 *Vg = Kg + STAGES * Cfg::ktile;
    uint64_t *kv_full = reinterpret_cast<uint64_t *>(Qs + Cfg::qtile + G * Cfg::group);  // TMA: [G][STAGES]
    const int h = blockIdx.x, b = blockIdx.y;
    const int q0 = (gridDim.z - 1 - blockIdx.z) * BM;
    const int C = NH * HS, L = pos + T;
    const size_t bh = (size_t)b * NH + h, row0 = (size_t)b * T;  // the sequence's first new row
    const RowSrc qs = {nr.q, nr.q + row0 * nr.ldq + h * HS, 0, (int)nr.ldq, 0};
    const int split = nr.k_new ? pos : L;
    const RowSrc ks = {kc + bh * max_seq * HS, nr.k_new ? nr.k_new + row0 * nr.ldq + h * HS : kc, HS, (int)nr.ldq,
                       split};
    const RowSrc vs = {vc + bh * max_seq * HS, nr.k_new ? nr.v_new + row0 * nr.ldq + h * HS : vc, HS, (int)nr.ldq,
                       split};

    if (!WG && HS < HSP) {  // padding columns of every buffer: zero once, cp.async never writes them
        const bf16 z = __float2bfloat16_rn(0.f);
        for (int u = tid; u < (int)(Cfg::bytes / sizeof(bf16) / ST) * (HSP - HS); u += Cfg::THREADS) {
            const int r = u / (HSP - HS), c = HS + u % (HSP - HS);
            Qs[r * ST + c] = z;
        }
    }
    if constexpr (TMA) {
        if (tid == 0) {
            for (int i = 0; i < Cfg::BARS; i++) mbar_init(&kv_full[i], 1);
            mbar_fence_init();
            tma_prefetch_map(&maps.k), tma_prefetch_map(&maps.v);
        }
        __syncthreads();  // the barriers are initialised
    }
    kv_full += grp * STAGES;  // the group's
    pdl_launch_dependents();  // kernels/pdl.cuh: the next grid (a cuBLASLt GEMM: not PDL'd) may be scheduled
    pdl_wait();               // q, k, v come from the kernel before
    load_tile<HSP, ST, false, BM, Cfg::THREADS>(Qs, qs, q0, min(BM, T - q0), HS, tid);
    cp_async_commit();

    const int kmax = min(L, pos + q0 + BM);
    const int ntiles = (kmax + BN - 1) / BN;
    const int nt = (ntiles - grp + G - 1) / G;  // this group's tiles: grp, grp + G, ...
    auto load_kv = [&](int j) {                 // the group's j-th tile
        const int k0 = (grp + G * j) * BN, buf = j % STAGES;
        if constexpr (TMA) {
            if (gtid == 0) {
                const int c1 = maps.head_first ? h : k0, c2 = maps.head_first ? k0 : h;
                tma_store_wait_read();  // the bulk copies of the block's own rows have read the buffer
                mbar_arrive_expect_tx(&kv_full[buf], 2 * Cfg::ktile * sizeof(bf16));
                tma_load_4d(Kg + buf * Cfg::ktile, &maps.k, c1, c2, b, &kv_full[buf]);
                tma_load_4d(Vg + buf * Cfg::ktile, &maps.v, c1, c2, b, &kv_full[buf]);
            }
        } else {
            const int rows = min(BN, L - k0);
            load_tile<HSP, KST, WG, 64, GT>(Kg + buf * Cfg::ktile, ks, k0, rows, HS, gtid);
            load_tile<HSP, KST, WG, 64, GT>(Vg + buf * Cfg::ktile, vs, k0, rows, HS, gtid);
            cp_async_commit();
        }
    };
    if (nt > 0) load_kv(0);
    // fused_attention_qkv: the block's own new keys and values [pos + q0, pos + q0 + BM) go into the
    // cache from the shared tiles that hold them (its last one or two), so every new row is stored
    // once, by the block whose queries sit at the same positions, and costs no extra global reads.
    const int own_lo = pos + q0, own_hi = min(L, pos + q0 + BM);
    auto store_own = [&](const bf16 *Kb, const bf16 *Vb, int k0) {
        const int lo = max(k0, own_lo), hi = min(k0 + BN, own_hi), cpr = HS / 8;
        for (int u = gtid; u < (hi - lo) * cpr; u += GT) {
            const int r = lo + u / cpr, c = u % cpr, in = tile_at<KST, WG>(r - k0, c);
            const size_t at = (bh * max_seq + r) * HS + c * 8;
            *reinterpret_cast<uint4 *>(kc + at) = *reinterpret_cast<const uint4 *>(Kb + in);
            *reinterpret_cast<uint4 *>(vc + at) = *reinterpret_cast<const uint4 *>(Vb + in);
        }
    };
    if (nt > 0 && !TMA) cp_async_wait<1>(); else cp_async_wait<0>();  // Q landed (this thread's part)
    __syncthreads();                                            // ... and everyone's, padding too

    const int wr0 = q0 + wq * 16 * MI;  // the warp's first query row (of the sequence)
    uint32_t qf[MI][NK][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int kk = 0; kk < NK; kk++)
            ldmatrix_x4(qf[mi][kk], Qs + ((wr0 - q0) + mi * 16 + (lane & 15)) * ST + kk * 16 + (lane >> 4) * 8);

    float o[MI][NO][4], m[MI][2], l[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
#pragma unroll
        for (int n = 0; n < NO; n++) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.f;
        m[mi][0] = m[mi][1] = -INFINITY;
        l[mi][0] = l[mi][1] = 0.f;
    }

    // Which tiles need the mask, and which none of the rows can see: decided per warp, or per
    // warpgroup for wgmma (its four warps issue the same MMAs).
    constexpr int DR = WG ? 64 : 16 * MI;
    const int dr0 = WG ? q0 + wq / 4 * 64 : wr0;
    for (int j = 0; j < nt; j++) {
        const int buf = j % STAGES;
        if constexpr (TMA) {
            mbar_wait(&kv_full[buf], (j / STAGES) & 1);  // tile j
        } else {
            cp_async_wait<0>();                // tile j (this thread's part)
            if (WG) fence_proxy_async_smem();  // ... visible to wgmma
        }
        group_barrier<GT, G>(grp);  // everyone's; and the group is done with tile j - 1's buffer
        if (STAGES == 2 && j + 1 < nt) load_kv(j + 1);
        const bf16 *Kb = Kg + buf * Cfg::ktile, *Vb = Vg + buf * Cfg::ktile;
        const int k0 = (grp + G * j) * BN;
        if (nr.k_new && k0 + BN > own_lo) {
            if constexpr (TMA) {  // at pos = 0 the block's own rows are whole tiles: out by bulk copies
                if (gtid == 0) tma_store_4d(&maps.k_cache, Kb, k0, h, b), tma_store_4d(&maps.v_cache, Vb, k0, h, b);
            } else {
                store_own(Kb, Vb, k0);
            }
        }
        if (k0 + BN - 1 <= pos + dr0)  // below the diagonal for every row
            attend_tile<HSP, MI, false, WG>(Kb, Vb, qf, o, m, l, lane, k0, 0, scale_log2);
        else if (k0 <= pos + dr0 + DR - 1)  // else no row sees a key of the tile
            attend_tile<HSP, MI, true, WG>(Kb, Vb, qf, o, m, l, lane, k0, pos + wr0 + (lane >> 2), scale_log2);
        if (STAGES == 1) {
            group_barrier<GT, G>(grp);  // the group is done with the buffer
            if (j + 1 < nt) load_kv(j + 1);
        }
    }

    if (TMA && gtid == 0) tma_store_wait_read();  // the own rows' buffers are free for the exchange, and to exit
    if constexpr (G > 1) {
        // Groups 1.. hand their state to the same thread of group 0 (same rows and columns) through
        // their own buffers, laid out [value][thread] so that a group's stores hit distinct banks.
        group_barrier<GT, G>(grp);  // the group's warps are done with its buffers
        if (grp > 0) {
            float *x = reinterpret_cast<float *>(Kg);
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                float *xm = x + mi * (4 + 4 * NO) * GT;
                xm[0 * GT + gtid] = m[mi][0];
                xm[1 * GT + gtid] = m[mi][1];
                xm[2 * GT + gtid] = l[mi][0];
                xm[3 * GT + gtid] = l[mi][1];
#pragma unroll
                for (int n = 0; n < NO; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) xm[(4 + n * 4 + e) * GT + gtid] = o[mi][n][e];
            }
        }
        __syncthreads();
        if (grp > 0) return;
#pragma unroll
        for (int g = 1; g < G; g++) {
            const float *x = reinterpret_cast<const float *>(Qs + Cfg::qtile + g * Cfg::group);
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                const float *xm = x + mi * (4 + 4 * NO) * GT;
                const float n0 = xm[0 * GT + gtid], n1 = xm[1 * GT + gtid];
                const float M0 = fmaxf(m[mi][0], n0), M1 = fmaxf(m[mi][1], n1);  // finite: group 0 holds key 0
                const float fa0 = fast_exp2((m[mi][0] - M0) * scale_log2), fb0 = fast_exp2((n0 - M0) * scale_log2);
                const float fa1 = fast_exp2((m[mi][1] - M1) * scale_log2), fb1 = fast_exp2((n1 - M1) * scale_log2);
                m[mi][0] = M0;
                m[mi][1] = M1;
                l[mi][0] = l[mi][0] * fa0 + xm[2 * GT + gtid] * fb0;
                l[mi][1] = l[mi][1] * fa1 + xm[3 * GT + gtid] * fb1;
#pragma unroll
                for (int n = 0; n < NO; n++) {
                    o[mi][n][0] = o[mi][n][0] * fa0 + xm[(4 + n * 4 + 0) * GT + gtid] * fb0;
                    o[mi][n][1] = o[mi][n][1] * fa0 + xm[(4 + n * 4 + 1) * GT + gtid] * fb0;
                    o[mi][n][2] = o[mi][n][2] * fa1 + xm[(4 + n * 4 + 2) * GT + gtid] * fb1;
                    o[mi][n][3] = o[mi][n][3] * fa1 + xm[(4 + n * 4 + 3) * GT + gtid] * fb1;
                }
            }
        }
    }

#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
        float l0 = l[mi][0], l1 = l[mi][1];
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float i0 = 1.f / l0, i1 = 1.f / l1;
        const int r0 = wr0 + mi * 16 + (lane >> 2), r1 = r0 + 8;
#pragma unroll
        for (int n = 0; n < NO; n++) {
            const int col = n * 8 + 2 * (lane & 3);
            if (col >= HS) continue;
            if (r0 < T)
                *reinterpret_cast<__nv_bfloat162 *>(out + ((size_t)b * T + r0) * C + h * HS + col) =
                    __floats2bfloat162_rn(o[mi][n][0] * i0, o[mi][n][1] * i0);
            if (r1 < T)
                *reinterpret_cast<__nv_bfloat162 *>(out + ((size_t)b * T + r1) * C + h * HS + col) =
                    __floats2bfloat162_rn(o[mi][n][2] * i1, o[mi][n][3] * i1);
        }
    }
}

// ----------------------------------------------------------------------------
// Host side

int sm_count() { return device_attr<cudaDevAttrMultiProcessorCount>(108); }
int smem_optin() { return device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(99 * 1024); }

template <typename K> cudaError_t allow_smem(K kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)bytes);
}

// Resident blocks per multiprocessor of a decode kernel (cached per kernel and shared memory).
template <typename K> int blocks_per_sm(K kernel, size_t smem) {
    struct Entry {
        const void *fn;
        size_t smem;
        int n;
    };
    static Entry cache[16];
    static int ncache = 0;
    const void *fn = reinterpret_cast<const void *>(kernel);
    for (int i = 0; i < ncache; i++)
        if (cache[i].fn == fn && cache[i].smem == smem) return cache[i].n;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem) != cudaSuccess || n <= 0) {
        cudaGetLastError();
        return 4;
    }
    if (ncache < 16) cache[ncache++] = Entry{fn, smem, n};
    return n;
}

// The split counters of a workspace must start at zero; kernels leave them so. Zero them on the
// first call that sees a workspace (callers are asked to, too: see the header).
cudaError_t ensure_counters_zeroed(void *ws, cudaStream_t stream) {
    static const void *seen[64];
    static int nseen = 0;
    for (int i = 0; i < nseen; i++)
        if (seen[i] == ws) return cudaSuccess;
    cudaError_t e = cudaMemsetAsync(ws, 0, kCounterBytes, stream);
    if (e == cudaSuccess && nseen < 64) seen[nseen++] = ws;
    return e;
}

// The most splits of a head whose partials the workspace holds (1: none) for bh heads of T queries.
long long workspace_splits(long long bh, int T, int HS, const void *ws, size_t ws_bytes) {
    if (!ws || ws_bytes <= kCounterBytes || bh > kMaxCounters) return 1;
    const size_t per_split = (size_t)bh * T * (HS + 2) * sizeof(float);
    return (long long)((ws_bytes - kCounterBytes) / per_split);
}

// Keys per block (a multiple of 64) for heads of L keys, with at most max_splits blocks a head: the
// split count whose cost(splits, tiles per block, tiles of a head) is least (the first of equals).
struct Split {
    int chunk, splits;
};
template <typename Cost> Split choose_split(int L, long long max_splits, Cost cost) {
    const int ntiles = (L + kDecodeKT - 1) / kDecodeKT;
    if (max_splits > ntiles) max_splits = ntiles;
    if (max_splits < 1) max_splits = 1;
    Split best = {ntiles * kDecodeKT, 1};
    double best_cost = -1;
    for (long long sp = 1; sp <= max_splits; sp++) {
        const int per_block = (int)((ntiles + sp - 1) / sp), splits = (ntiles + per_block - 1) / per_block;
        const double c = cost(splits, per_block, ntiles);
        if (best_cost < 0 || c < best_cost) best = {per_block * kDecodeKT, splits}, best_cost = c;
    }
    return best;
}

// attn_decode's cost: waves x (tiles per block + 1), the +1 for a block's fixed costs (q, the partial,
// the merge), for bh heads and blocks_per_sm_ blocks an SM.
Split split_waves(long long bh, int L, int blocks_per_sm_, long long max_splits) {
    const long long slots = (long long)blocks_per_sm_ * sm_count();
    return choose_split(L, max_splits, [&](int splits, int per_block, int) {
        return (double)((bh * splits + slots - 1) / slots) * (per_block + 1);
    });
}

// attn_decode1's cost, in tile latencies, is the larger of two bounds for bh heads:
//   its chain: waves x (tiles per block + 6 for a block's fixed costs: its start, q, the partial, the
//              merge in its cluster);
//   DRAM: every head's tiles streamed by the resident blocks, 0.4 of a tile a latency each once
//         bandwidth is the limit (more blocks resident, more bytes in flight);
// with one block an SM fewer than fit, for the neighbouring kernels' early-launched blocks. Fitted to
// the engine's decode on an H200 at 1-128 sequences of 272-1024 keys, every split count forced
// (docs/PERF.md, "Session 43"): within 3.8% of the best count everywhere, where waves x (tiles + 1)
// lost up to 18% (64 sequences of 1024 keys: one block a head, against two).
Split split_streams(long long bh, int L, int blocks_per_sm_, long long max_splits) {
    const double slots = (double)(blocks_per_sm_ > 1 ? blocks_per_sm_ - 1 : 1) * sm_count();
    return choose_split(L, max_splits, [&](int splits, int per_block, int ntiles) {
        const double blocks = (double)bh * splits;
        const double chain = ceil(blocks / slots) * (per_block + 6);
        const double dram = (double)bh * ntiles / (fmin(blocks, slots) * 0.4);
        return fmax(chain, dram);
    });
}

template <typename E, int TQ>
cudaError_t launch_decode_tq(const E *q, const E *kc, const E *vc, E *out, int B, int T, int pos, const int *pos_device,
                             int NH, int HS, int max_seq, void *ws, size_t ws_bytes, cudaStream_t stream) {
    auto kern = attn_decode<E, TQ>;
    const DecodeSmem lay = decode_smem(HS, sizeof(E));
    cudaError_t e = allow_smem(kern, lay.total);
    if (e != cudaSuccess) return e;
    const long long bh = (long long)B * NH;
    const Split sp =
        split_waves(bh, pos + T, blocks_per_sm(kern, lay.total), workspace_splits(bh, T, HS, ws, ws_bytes));
    if (sp.splits > 1 && (e = ensure_counters_zeroed(ws, stream)) != cudaSuccess) return e;
    const bool vec = HS % (16 / sizeof(E)) == 0 && aligned16(kc) && aligned16(vc);
    const float scale_log2 = (float)(1.4426950408889634 / sqrt((double)HS));
    unsigned *counters = static_cast<unsigned *>(ws);
    float *part = sp.splits > 1 ? reinterpret_cast<float *>(static_cast<char *>(ws) + kCounterBytes) : nullptr;
    return launch_pdl(kern, dim3((unsigned)sp.splits, NH, B), dim3(kThreads), lay.total, stream, q, kc, vc, out,
                      counters, part, T, pos, pos_device, NH, HS, max_seq, sp.chunk, scale_log2, (int)vec);
}

// The most blocks a head's cache splits into when they merge inside a cluster (kern: the CL
// kernel): on sm_90 and later 16 where a cluster of 16 of them fits (a non-portable size, allowed
// here), else 8 (the portable size); 0 before sm_90 (the workspace and a ticket). Batch 1 on an
// H200, 512 new tokens: 3,705 tokens/s through the workspace, 3,922 with 8, 4,114 with 16 (docs/
// PERF.md, "Session 13"). GPT2_ATTN_CLUSTER=0 turns the cluster merge off and =2..16 sets the
// limit, to measure one against another; read at every call (tests switch it).
template <typename K> int decode_cluster_splits(K kern) {
    if (device_attr<cudaDevAttrComputeCapabilityMajor>(8) < 9) return 0;
    struct Entry {
        const void *fn;
        int dev, limit;
    };
    static Entry known[32];  // per kernel and device (every instance of a template shares K)
    static int nknown = 0;
    int dev = 0, limit = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 8;
    for (int i = 0; i < nknown && !limit; i++)
        if (known[i].fn == reinterpret_cast<const void *>(kern) && known[i].dev == dev) limit = known[i].limit;
    if (!limit) {
        const bool ok = cudaFuncSetAttribute(reinterpret_cast<const void *>(kern),
                                             cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess &&
                        cluster_fits(reinterpret_cast<const void *>(kern), kMaxClusterSplits, kThreads, kDecodeHold);
        if (!ok) cudaGetLastError();
        limit = ok ? kMaxClusterSplits : 8;
        if (nknown < 32) known[nknown++] = Entry{reinterpret_cast<const void *>(kern), dev, limit};
    }
    const char *env = getenv("GPT2_ATTN_CLUSTER");
    if (!env || !*env) return limit;
    const int n = atoi(env);
    return n < 2 ? 0 : n > limit ? limit : n;
}

template <typename E, int QIT>
cudaError_t launch_decode1(const NewRows<E> &nr, E *kc, E *vc, E *out, int B, int pos, const int *pos_device, int NH,
                           int HS, int max_seq, void *ws, size_t ws_bytes, cudaStream_t stream) {
    auto kern = attn_decode1<E, QIT, false>;
    auto kern_cl = attn_decode1<E, QIT, true>;
    const long long bh = (long long)B * NH;
    const int cl_splits = decode_cluster_splits(kern_cl);
    const Split sp = split_streams(bh, pos + 1, blocks_per_sm(cl_splits ? kern_cl : kern, kDecodeHold),
                                   cl_splits ? cl_splits : workspace_splits(bh, 1, HS, ws, ws_bytes));
    const float scale_log2 = (float)(1.4426950408889634 / sqrt((double)HS));
    const dim3 grid((unsigned)sp.splits, NH, B);
    if (cl_splits && sp.splits > 1)
        return launch_pdl_cluster(kern_cl, grid, dim3(kThreads), kDecodeHold, (unsigned)sp.splits, stream, nr, kc, vc,
                                  out, (unsigned *)nullptr, (float *)nullptr, pos, pos_device, NH, HS, max_seq,
                                  sp.chunk, scale_log2);
    cudaError_t e;
    if (sp.splits > 1 && (e = ensure_counters_zeroed(ws, stream)) != cudaSuccess) return e;
    unsigned *counters = static_cast<unsigned *>(ws);
    float *part = sp.splits > 1 ? reinterpret_cast<float *>(static_cast<char *>(ws) + kCounterBytes) : nullptr;
    return launch_pdl(kern, grid, dim3(kThreads), kDecodeHold, stream, nr, kc, vc, out, counters, part, pos, pos_device,
                      NH, HS, max_seq, sp.chunk, scale_log2);
}

// attn_decode1 needs whole 16-byte chunks: HS and the row stride multiples of 16 bytes, every base
// 16-byte aligned.
template <typename E> bool decode1_ok(const NewRows<E> &nr, const void *kc, const void *vc, int HS) {
    constexpr int VW = 16 / sizeof(E);
    return HS % VW == 0 && nr.ldq % VW == 0 && aligned16(nr.q) && aligned16(kc) && aligned16(vc) &&
           (!nr.k_new || (aligned16(nr.k_new) && aligned16(nr.v_new)));
}

template <typename E>
cudaError_t launch_decode1_hs(const NewRows<E> &nr, E *kc, E *vc, E *out, int B, int pos, const int *pos_device,
                              int NH, int HS, int max_seq, void *ws, size_t ws_bytes, cudaStream_t stream) {
    const int nv = HS / (16 / (int)sizeof(E));  // 16-byte chunks per row: 8 lanes take 1, 2 or 4 each
    if (nv <= 8)
        return launch_decode1<E, 1>(nr, kc, vc, out, B, pos, pos_device, NH, HS, max_seq, ws, ws_bytes, stream);
    if constexpr (sizeof(E) == 4)  // bf16 rows of 128 hold 16 chunks at most
        if (nv > 16)
            return launch_decode1<E, 4>(nr, kc, vc, out, B, pos, pos_device, NH, HS, max_seq, ws, ws_bytes, stream);
    return launch_decode1<E, 2>(nr, kc, vc, out, B, pos, pos_device, NH, HS, max_seq, ws, ws_bytes, stream);
}

template <typename E>
cudaError_t launch_decode(const E *q, const E *kc, const E *vc, E *out, int B, int T, int pos, const int *pos_device,
                          int NH, int HS, int max_seq, void *ws, size_t ws_bytes, cudaStream_t stream) {
    // The cache is only read here (NewRows without k_new): attn_decode1's stores stay off.
    const NewRows<E> nr = {q, NULL, NULL, (long long)NH * HS};
    if (T == 1 && decode1_ok(nr, kc, vc, HS))
        return launch_decode1_hs(nr, const_cast<E *>(kc), const_cast<E *>(vc), out, B, pos, pos_device, NH, HS, max_seq,
                                 ws, ws_bytes, stream);
    if (T == 1)
        return launch_decode_tq<E, 1>(q, kc, vc, out, B, T, pos, pos_device, NH, HS, max_seq, ws, ws_bytes, stream);
    return launch_decode_tq<E, kDecodeTQ>(q, kc, vc, out, B, T, pos, pos_device, NH, HS, max_seq, ws, ws_bytes,
                                          stream);
}

template <typename E, int HSP, int BN, int RM>
cudaError_t launch_simt_rm(const E *q, const E *kc, const E *vc, E *out, int B, int T, int pos, int NH, int HS,
                           int max_seq, cudaStream_t stream) {
    auto kern = attn_prefill_simt<E, HSP, BN, RM>;
    typedef SimtSmem<HSP, BN, RM> Lay;
    cudaError_t e = allow_smem(kern, Lay::bytes);
    if (e != cudaSuccess) return e;
    const bool vec4 = HS % 4 == 0 && aligned16(q) && aligned16(kc) && aligned16(vc);
    const float scale_log2 = (float)(1.4426950408889634 / sqrt((double)HS));
    dim3 grid((T + Lay::BM - 1) / Lay::BM, NH, B);
    kern<<<grid, kThreads, Lay::bytes, stream>>>(q, kc, vc, out, T, pos, NH, HS, max_seq, scale_log2, vec4);
    return cudaGetLastError();
}

// 64-query blocks when they are enough to fill the GPU twice over, else 32-query blocks (twice the
// blocks). Predicted for B = 1, T = 1024: 153 -> ~80 us; measured: 153 us, unchanged. The longest
// block's chain is per key tile (loads, three barriers, the 64-key P.V loop), not per query row;
// splitting its keys (as the tensor-core kernel does) is what would shorten it.
template <typename E, int HSP, int BN>
cudaError_t launch_simt(const E *q, const E *kc, const E *vc, E *out, int B, int T, int pos, int NH, int HS,
                        int max_seq, cudaStream_t stream) {
    const long long blocks64 = (long long)((T + 63) / 64) * NH * B;
    if (blocks64 >= 2LL * sm_count())
        return launch_simt_rm<E, HSP, BN, 4>(q, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    return launch_simt_rm<E, HSP, BN, 2>(q, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
}

template <typename E>
cudaError_t launch_prefill_simt(const E *q, const E *kc, const E *vc, E *out, int B, int T, int pos, int NH, int HS,
                                int max_seq, cudaStream_t stream) {
    if (HS <= 32) return launch_simt<E, 32, 64>(q, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    if (HS <= 64) return launch_simt<E, 64, 64>(q, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    if (HS <= 96) return launch_simt<E, 96, 32>(q, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    return launch_simt<E, 128, 32>(q, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
}

// The wgmma kernel's K and V maps (KvMaps) where every key is on one side of the split: a prompt at
// position 0 through the qkv product (its rows [B T, 3C], head h's keys at column C + h HS), or keys
// all in the cache ([B][NH][max_seq][HS]); false elsewhere (a later prompt through the qkv product,
// whose tile at pos mixes both, takes cp.async).
bool kv_maps(KvMaps *maps, const NewRows<bf16> &nr, const bf16 *kc, const bf16 *vc, int B, int T, int pos, int NH,
             int HS, int max_seq) {
    if (HS != 64 || !encode_tiled() || (nr.k_new && pos != 0)) return false;
    const int keys_tile[3] = {64, 1, 1}, head_tile[3] = {1, 64, 1};
    const long long cache_dims[3] = {pos + T, NH, B},
                    cache_ld[3] = {HS, (long long)max_seq * HS, (long long)NH * max_seq * HS};
    if (nr.k_new) {  // read from the qkv rows; the block's own rows written into the cache
        const long long dims[3] = {NH, T, B}, ld[3] = {HS, nr.ldq, (long long)T * nr.ldq};
        maps->head_first = 1;
        return tensor_map_rows4(&maps->k, nr.k_new, dims, ld, head_tile) &&
               tensor_map_rows4(&maps->v, nr.v_new, dims, ld, head_tile) &&
               tensor_map_rows4(&maps->k_cache, kc, cache_dims, cache_ld, keys_tile) &&
               tensor_map_rows4(&maps->v_cache, vc, cache_dims, cache_ld, keys_tile);
    }
    maps->head_first = 0;
    return tensor_map_rows4(&maps->k, kc, cache_dims, cache_ld, keys_tile) &&
           tensor_map_rows4(&maps->v, vc, cache_dims, cache_ld, keys_tile);
}

template <int HSP, int MI, int QW, int G, bool WG = false>
cudaError_t launch_mma_cfg(const NewRows<bf16> &nr, bf16 *kc, bf16 *vc, bf16 *out, int B, int T, int pos, int NH,
                           int HS, int max_seq, cudaStream_t stream) {
    typedef MmaCfg<HSP, MI, QW, G, WG> Cfg;
    KvMaps maps = {};
    const bool tma = WG && kv_maps(&maps, nr, kc, vc, B, T, pos, NH, HS, max_seq);
    auto kern = tma ? attn_prefill_mma<HSP, MI, QW, G, WG, WG> : attn_prefill_mma<HSP, MI, QW, G, WG, false>;
    cudaError_t e = allow_smem(kern, Cfg::bytes);
    if (e != cudaSuccess) return e;
    const float scale_log2 = (float)(1.4426950408889634 / sqrt((double)HS));
    dim3 grid(NH, B, (T + Cfg::BM - 1) / Cfg::BM);
    return launch_pdl(kern, grid, dim3(Cfg::THREADS), Cfg::bytes, stream, nr, kc, vc, out, T, pos, NH, HS, max_seq,
                      scale_log2, maps);
}

// The wgmma prefill runs where its sm_90a code does: compute capability 9.0, from a build that has
// it (GPT2_SM90A, set by the Makefile from CUDA_ARCH), unless GPT2_ATTN_WGMMA=0 (read at every call,
// so that tests run both kernels).
bool wgmma_prefill_on() {
#if GPT2_SM90A
    return device_is_sm90() && !env_off("GPT2_ATTN_WGMMA");
#else
    return false;
#endif
}

// HS <= 64: 128-query blocks of 4 warps, 32 rows each (two blocks per SM), when there are enough of
// them for two per SM; else (and for HS > 64) 64-query blocks of 8 warps, 16 rows each, whose keys
// split over two groups: twice the blocks, each with half the longest chain. Measured on an H200
// (132 SMs), bench_fused_attention, us per call for B = 1 / B = 8 at T = 1024: the 128-query blocks
// 21.5 / 59.1 (B = 1 has 96 of them); the 64-query blocks 12.9 / 90.3; 64 queries as 2 warps of 32
// rows in four groups 15.5 / 102; 32 queries as 2 warps of 16 rows in four groups 19.7 / 135.
// From 512 keys (HS <= 64, where the shared memory fits: 157 KB at HS = 64, 87 at 32) the 64-query
// blocks take 16 warps in four groups instead, a quarter of the longest chain each: B = 1 at T = 512 /
// 768 / 1024 9.64 / 13.19 / 16.65 -> 8.72 / 11.70 / 14.58 us (docs/PERF.md, "Session 7").
// On wgmma (sm_90a, HS = 64) each warpgroup takes 64 rows of its own, at most 128 registers a thread
// (16 warps an SM, no spills): 128-query blocks of two warpgroups where the grid is large, else the
// same 64-query blocks over two or four groups. H200, us at T = 1024 / 512: B = 1 14.5 / 8.7 -> 12.9
// / 7.6; B = 8 73.3 / 24.5 (the 128-query mma.sync blocks) -> 60.5 / 20.3, where 64-query blocks of
// one warpgroup took 76.8 (three blocks an SM) / 21.5 (four); B = 8, T = 128 (two groups) 7.2 -> 5.2
// (docs/PERF.md, "Session 15").
template <int HSP>
cudaError_t launch_mma_hs(const NewRows<bf16> &nr, bf16 *kc, bf16 *vc, bf16 *out, int B, int T, int pos, int NH, int HS,
                          int max_seq, cudaStream_t stream) {
    const bool many = (long long)((T + 127) / 128) * NH * B >= 2LL * sm_count();
    if constexpr (HSP == 64) {
        if (HS == 64 && wgmma_prefill_on()) {
            if (many) return launch_mma_cfg<64, 1, 8, 1, true>(nr, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
            if (pos + T >= 8 * 64 && MmaCfg<64, 1, 4, 4, true>::bytes <= (size_t)smem_optin())
                return launch_mma_cfg<64, 1, 4, 4, true>(nr, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
            return launch_mma_cfg<64, 1, 4, 2, true>(nr, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
        }
    }
    if constexpr (HSP <= 64) {
        if (many) return launch_mma_cfg<HSP, 2, 4, 1>(nr, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
        if (pos + T >= 8 * 64 && MmaCfg<HSP, 1, 4, 4, false>::bytes <= (size_t)smem_optin())
            return launch_mma_cfg<HSP, 1, 4, 4>(nr, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    }
    return launch_mma_cfg<HSP, 1, 4, 2>(nr, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
}

// The tensor-core prefill needs 16-byte rows: HS % 8 == 0 and every base 16-byte aligned.
bool mma_prefill_ok(const NewRows<bf16> &nr, const void *kc, const void *vc, int HS) {
    return HS % 8 == 0 && nr.ldq % 8 == 0 && aligned16(nr.q) && aligned16(kc) && aligned16(vc) &&
           (!nr.k_new || (aligned16(nr.k_new) && aligned16(nr.v_new)));
}

cudaError_t launch_mma(const NewRows<bf16> &nr, bf16 *kc, bf16 *vc, bf16 *out, int B, int T, int pos, int NH, int HS,
                       int max_seq, cudaStream_t stream) {
    if (HS <= 32) return launch_mma_hs<32>(nr, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    if (HS <= 64) return launch_mma_hs<64>(nr, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    if (HS <= 96) return launch_mma_hs<96>(nr, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    return launch_mma_hs<128>(nr, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
}

}  // namespace

extern "C" size_t fused_attention_workspace_size(int B, int num_heads, int head_size, int max_seq) {
    if (B <= 0 || num_heads <= 0 || head_size <= 0 || max_seq <= 0) return 0;
    const size_t tiles = ((size_t)max_seq + kDecodeKT - 1) / kDecodeKT;
    return kCounterBytes + (size_t)B * num_heads * kDecodeTQ * tiles * (head_size + 2) * sizeof(float);
}

extern "C" int fused_attention(const void *q, const void *k_cache, const void *v_cache, void *out, DType dtype, int B,
                               int T, int pos, const int *pos_device, int num_heads, int head_size, int max_seq,
                               void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    const int NH = num_heads, HS = head_size;
    if (B < 0 || T < 0 || pos < 0 || NH <= 0 || HS <= 0 || HS > 128 || max_seq <= 0 || pos + T > max_seq ||
        (dtype != DTYPE_F32 && dtype != DTYPE_BF16) || B > 65535 || NH > 65535 || (pos_device && T > kDecodeTQ))
        return (int)cudaErrorInvalidValue;
    if (B == 0 || T == 0) return (int)cudaSuccess;
    if (!q || !k_cache || !v_cache || !out) return (int)cudaErrorInvalidValue;
    cudaError_t e;
    if (dtype == DTYPE_BF16) {
        const bf16 *qq = static_cast<const bf16 *>(q), *kk = static_cast<const bf16 *>(k_cache),
                   *vv = static_cast<const bf16 *>(v_cache);
        bf16 *oo = static_cast<bf16 *>(out);
        if (T <= kDecodeTQ) {
            e = launch_decode(qq, kk, vv, oo, B, T, pos, pos_device, NH, HS, max_seq, workspace, workspace_bytes,
                              stream);
        } else if (mma_prefill_ok(NewRows<bf16>{qq, NULL, NULL, (long long)NH * HS}, kk, vv, HS)) {
            // The cache is only read here (NewRows without k_new): the kernel's stores stay off.
            e = launch_mma(NewRows<bf16>{qq, NULL, NULL, (long long)NH * HS}, const_cast<bf16 *>(kk),
                           const_cast<bf16 *>(vv), oo, B, T, pos, NH, HS, max_seq, stream);
        } else {
            e = launch_prefill_simt(qq, kk, vv, oo, B, T, pos, NH, HS, max_seq, stream);
        }
    } else {
        const float *qq = static_cast<const float *>(q), *kk = static_cast<const float *>(k_cache),
                    *vv = static_cast<const float *>(v_cache);
        float *oo = static_cast<float *>(out);
        if (T <= kDecodeTQ)
            e = launch_decode(qq, kk, vv, oo, B, T, pos, pos_device, NH, HS, max_seq, workspace, workspace_bytes,
                              stream);
        else e = launch_prefill_simt(qq, kk, vv, oo, B, T, pos, NH, HS, max_seq, stream);
    }
    return (int)e;
}

extern "C" int fused_attention_takes_qkv(DType dtype, int T, int head_size) {
    if (head_size <= 0 || head_size > 128) return 0;
    if (T == 1) return (dtype == DTYPE_F32 || dtype == DTYPE_BF16) && head_size * dtype_size(dtype) % 16 == 0;
    return dtype == DTYPE_BF16 && T > kDecodeTQ && head_size % 8 == 0;
}

namespace {

template <typename E>
cudaError_t attention_qkv(const E *rows, E *kc, E *vc, E *out, int B, int T, int pos, const int *pos_device, int NH,
                          int HS, int max_seq, void *ws, size_t ws_bytes, cudaStream_t stream) {
    const long long C = (long long)NH * HS;
    const NewRows<E> nr = {rows, rows + C, rows + 2 * C, 3 * C};
    if (T == 1) {
        if (!decode1_ok(nr, kc, vc, HS)) return cudaErrorInvalidValue;
        return launch_decode1_hs(nr, kc, vc, out, B, pos, pos_device, NH, HS, max_seq, ws, ws_bytes, stream);
    }
    if constexpr (sizeof(E) == 2) {
        if (!mma_prefill_ok(nr, kc, vc, HS)) return cudaErrorInvalidValue;
        return launch_mma(nr, kc, vc, out, B, T, pos, NH, HS, max_seq, stream);
    }
    return cudaErrorInvalidValue;  // fused_attention_takes_qkv refused it already
}

}  // namespace

extern "C" int fused_attention_qkv(const void *qkv, void *k_cache, void *v_cache, void *out, DType dtype, int B, int T,
                                   int pos, const int *pos_device, int num_heads, int head_size, int max_seq,
                                   void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    const int NH = num_heads, HS = head_size;
    if (!fused_attention_takes_qkv(dtype, T, HS) || B < 0 || pos < 0 || NH <= 0 || max_seq <= 0 ||
        pos + T > max_seq || B > 65535 || NH > 65535 || (pos_device && T > kDecodeTQ))
        return (int)cudaErrorInvalidValue;
    if (B == 0) return (int)cudaSuccess;
    if (!qkv || !k_cache || !v_cache || !out) return (int)cudaErrorInvalidValue;
    if (dtype == DTYPE_BF16)
        return (int)attention_qkv(static_cast<const bf16 *>(qkv), static_cast<bf16 *>(k_cache),
                                  static_cast<bf16 *>(v_cache), static_cast<bf16 *>(out), B, T, pos, pos_device, NH, HS,
                                  max_seq, workspace, workspace_bytes, stream);
    return (int)attention_qkv(static_cast<const float *>(qkv), static_cast<float *>(k_cache),
                              static_cast<float *>(v_cache), static_cast<float *>(out), B, T, pos, pos_device, NH, HS,
                              max_seq, workspace, workspace_bytes, stream);
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
