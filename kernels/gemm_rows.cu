// Products of a few rows on Hopper (gemm_rows.h): W's tile by TMA before the PDL wait, x's rows by
// TMA after it, one wgmma warpgroup with W as the A operand, K split over a cluster's blocks where
// the tile does not fit; and the LayerNorms around them (Mode, below).
//
// Shared memory of a block, 1024-byte aligned (the 128-byte swizzle's period), for its part of K:
//   w_tiles  its K/64/ks slices of W's 64 rows x 64 k (8 KB each), as TMA lands them under the swizzle
//   x_tiles  the same slices of x's RB rows x 64 k (RB x 128 bytes each)
//   inbox    K split (ks > 1): the cluster's partial sums of this block's CW = 64 / ks columns, fp32,
//            [RB rows][ks ranks x CW columns], each rank's pushed there by that rank
//   lnsm     a mode with a LayerNorm: its row statistics, lnsm_row(mode) RB floats
//   barriers one for all of W (before the wait), one for all of x (after it): each is one copy of
//            all the block's slices (tma.cuh's tensor_map_slices), which lands x sooner than a copy
//            a slice with the MMAs started as each landed (docs/PERF.md, "Session 25")
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "cluster.cuh"
#include "fold_stats.cuh"
#include "gemm_rows.h"
#include "kernel_util.h"
#include "pdl.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace {

constexpr int BK = 64;          // k per slice: one 128-byte swizzled row of bf16
constexpr int BF = 64;          // W rows (output columns) a block: wgmma's M
constexpr int THREADS = 128;    // one warpgroup
constexpr int W_SLICE = BF * BK * 2;
constexpr int MAX_SPLIT = 8;    // the most blocks K splits over: the portable cluster size
constexpr int PSTR = BF + 4;    // a row of the inbox: 64 partial sums, padded against bank conflicts
constexpr int MAX_LN_BLOCKS = 16;  // the LayerNorm epilogue's largest cluster (a non-portable size)
constexpr int FOLD_PAIRS = 16;     // ROWS_FOLDED: a thread's slice statistics held in registers (fold_stats.cuh)

// What a product does besides y = epilogue(x W^T + b):
//   ROWS_PLAIN   nothing
//   ROWS_LN      the attention projection (a residual add, K whole): ln = LayerNorm(y's new rows) *
//                gamma + beta over the N columns of the cluster's blocks, and each row's mean
//   ROWS_STATS   the MLP projection (a residual add): what the next qkv needs to fold its LayerNorm
//                in, ln = bf16(gamma * (y - shift)) with a row's shift near its mean (ROWS_LN's),
//                and each CW-column slice's mean and M2 (sum of squared deviations) of y's new rows
//   ROWS_FOLDED  qkv on that ln (bias, fp32): y = rstd (acc - (mean - shift) s) + b', the row's mean
//                and rstd combined from the slices' pairs
// The folded form (docs/DESIGN.md): with s_n = sum_k W_nk gamma_k and b' = W beta + b,
//   W LayerNorm(x) + b = rstd (W (gamma (x - c)) - (mean - c) s) + b'  for any c.
// c = 0 would round x's mean into every bf16 element of the product's input: a row whose mean is
// 1000 times its spread would keep no digit of it. Shifted by a value near the mean, the input is
// as small as the normalised row, and mean - c is small.
enum Mode { ROWS_PLAIN, ROWS_LN, ROWS_STATS, ROWS_FOLDED };

// Floats of lnsm a row (LnSmem below): ROWS_LN's also receive every block's statistics.
constexpr int lnsm_row(Mode mode) { return mode == ROWS_PLAIN ? 0 : mode == ROWS_LN ? 10 + 2 * MAX_LN_BLOCKS : 10; }

// K's slices a block multiplies when K splits over ks blocks.
constexpr int part_slices(int K, int ks) { return ((K + BK - 1) / BK + ks - 1) / ks; }

// Shared memory of a block for K over ks blocks and RB rows in a mode, the alignment slack included.
constexpr size_t smem_bytes(int K, int rb, int ks, Mode mode = ROWS_PLAIN) {
    const size_t slices = part_slices(K, ks);
    return 1024 + slices * (W_SLICE + (size_t)rb * BK * 2) + (ks > 1 ? (size_t)rb * PSTR * sizeof(float) : 0) +
           (size_t)rb * lnsm_row(mode) * sizeof(float) + 2 * sizeof(uint64_t);
}

// Where the epilogue writes (matmul_lt.h's table): y [M, N] rows ldy apart, bias [N] of y's type
// (ROWS_FOLDED: fp32 b'); the modes' own vectors, [M] by row and [N] by column, fp32:
struct Out {
    void *y;
    long long ldy;
    const void *bias;
    const float *gamma, *beta;  // LN: gamma, beta; STATS: gamma (of the LayerNorm the next product folds)
    bf16 *ln;                   // LN, STATS: [M, N], rows N apart
    float *mean;                // LN: each row's mean (NULL: not written)
    const float *shift;         // STATS, FOLDED: each row's shift
    float2 *stats;              // STATS writes [M, N / CW], FOLDED reads [M, slices]: (mean, M2)
    int slices;                 // FOLDED
    const float *s;             // FOLDED: s_n = sum_k W_nk gamma_k
};

// ----------------------------------------------------------------------------
// Row statistics (the modes with a LayerNorm)
//
// Exact two-level statistics: each block (or slice of a block) takes its mean and M2 = sum (v -
// mean)^2 over its columns (two passes over registers), and the pairs combine (Chan et al.: the
// mean of the means, and M2 = sum M2_b + n_b sum (mean_b - mean)^2). No sum of raw squares, so a
// row whose mean is large against its spread keeps its variance.
// Shared memory (lnsm_row(mode) RB floats): red [4 warps][RB], bmean [RB], stats [RB] (this block's
// (mean, M2)), row [RB] (ROWS_LN: mean, rstd; ROWS_FOLDED: mean - shift, rstd), and for ROWS_LN
// inbox [MAX_LN_BLOCKS][RB] (every block's stats, pushed there by that block).
struct LnSmem {
    float *red, *bmean;
    float2 *stats, *row, *inbox;
    template <int RB> __device__ static LnSmem at(float *lnsm) {
        return {lnsm, lnsm + 4 * RB, reinterpret_cast<float2 *>(lnsm + 6 * RB), reinterpret_cast<float2 *>(lnsm + 8 * RB),
                reinterpret_cast<float2 *>(lnsm + 10 * RB)};
    }
};

// Each of RB rows' sum over the block's 64 columns of v, laid out as the accumulators (v[4 j + e]
// at row 8 j + 2 (lane % 4) + (e & 1)); thread tid < RB gets row tid's.
template <int RB>
__device__ __forceinline__ float block_row_sum(const float (&v)[RB / 2], float *red, int warp, int lane, int tid) {
#pragma unroll
    for (int j = 0; j < RB / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float x = v[4 * j + h] + v[4 * j + h + 2];  // its columns fa and fa + 8
            x += __shfl_xor_sync(0xffffffffu, x, 4);   // over the warp's 8 column pairs
            x += __shfl_xor_sync(0xffffffffu, x, 8);
            x += __shfl_xor_sync(0xffffffffu, x, 16);
            if (lane < 4) red[warp * RB + 8 * j + 2 * lane + h] = x;
        }
    __syncthreads();
    const float sum = tid < RB ? red[tid] + red[RB + tid] + red[2 * RB + tid] + red[3 * RB + tid] : 0.0f;
    __syncthreads();  // red is used again
    return sum;
}

// Each of RB rows' (mean, M2) over the block's 64 columns of v (laid out as block_row_sum's); thread
// tid < RB gets row tid's.
template <int RB>
__device__ __forceinline__ float2 block_row_stats(const float (&v)[RB / 2], const LnSmem &sm, int warp, int lane,
                                                  int tid) {
    const float sum = block_row_sum<RB>(v, sm.red, warp, lane, tid);
    if (tid < RB) sm.bmean[tid] = sum / BF;
    __syncthreads();
    float d[RB / 2];
#pragma unroll
    for (int i = 0; i < RB / 2; i++) {
        const float c = v[i] - sm.bmean[8 * (i / 4) + 2 * (lane % 4) + (i & 1)];
        d[i] = c * c;
    }
    const float m2 = block_row_sum<RB>(d, sm.red, warp, lane, tid);
    return make_float2(tid < RB ? sm.bmean[tid] : 0.0f, m2);
}

// ROWS_LN: ln's rows r0.. from v (the new rows' values, as above; 0 past M) and gamma, beta at the
// thread's columns fa, fa + 8. The cluster's blocks hold all N columns of RB rows, 64 each. Each
// block pushes its rows' (mean, M2) into every block's inbox (the kernel's "started" barrier phase
// has completed), then one cluster barrier, and each block merges the pairs from its own shared
// memory: no block reads another's, so none waits for the others before it leaves.
template <int RB>
__device__ __forceinline__ void layernorm_rows(const float (&v)[RB / 2], const float (&gamma)[2],
                                               const float (&beta)[2], const Out &out, float *lnsm, int r0, int fa,
                                               int M, int N, int warp, int lane, int tid) {
    const LnSmem sm = LnSmem::at<RB>(lnsm);
    const int blocks = N / BF, rank = blockIdx.x;  // the cluster spans grid.x
    const float2 own = block_row_stats<RB>(v, sm, warp, lane, tid);
    if (tid < RB) sm.stats[tid] = own;
    __syncthreads();
    for (int i = tid; i < blocks * RB; i += THREADS) {  // pair (rank, row i % RB) into block i / RB
        const int to = i / RB, r = i % RB;
        st_cluster(cluster_map(&sm.inbox[rank * RB + r], to), sm.stats[r]);
    }
    cluster_arrive();  // release: the pushes are visible after the wait
    cluster_wait();
    if (tid < RB) {
        float2 pair[MAX_LN_BLOCKS];
        float mean = 0.0f, M2 = 0.0f;
#pragma unroll
        for (int b = 0; b < MAX_LN_BLOCKS; b++)
            if (b < blocks) pair[b] = sm.inbox[b * RB + tid], mean += pair[b].x;
        mean /= blocks;
#pragma unroll
        for (int b = 0; b < MAX_LN_BLOCKS; b++)
            if (b < blocks) {
                const float mb = pair[b].x - mean;
                M2 += pair[b].y + BF * mb * mb;
            }
        sm.row[tid] = make_float2(mean, rsqrtf(M2 / N + 1e-5f));  // biased variance, as GPT-2's
        if (out.mean && rank == 0 && r0 + tid < M) out.mean[r0 + tid] = mean;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < RB / 2; i++) {
        const int lr = 8 * (i / 4) + 2 * (lane % 4) + (i & 1), t = r0 + lr, h = (i >> 1) & 1;
        if (t < M)
            out.ln[(size_t)t * N + fa + 8 * h] =
                from_f32<bf16>((v[i] - sm.row[lr].x) * sm.row[lr].y * gamma[h] + beta[h]);
    }
}

// ROWS_STATS: each row's (mean, M2) over the CW = 64 / KS columns this block finished, as pair
// f0 / CW + kp of the row. v: the values as the kernel's fin (0 past M); K split, a row's CW
// columns are CW adjacent lanes of one warp.
template <int RB, int KS, int NV>
__device__ __forceinline__ void slice_stats(const float (&v)[NV], const Out &out, float *lnsm, int r0, int f0, int kp,
                                            int M, int N, int warp, int lane, int tid) {
    constexpr int CW = BF / KS;
    const int slices = N / CW, slice = f0 / CW + kp;
    if constexpr (KS == 1) {
        const float2 st = block_row_stats<RB>(v, LnSmem::at<RB>(lnsm), warp, lane, tid);
        if (tid < RB && r0 + tid < M) out.stats[(size_t)(r0 + tid) * slices + slice] = st;
    } else {  // the NV rows' shuffle trees level by level, so that their latencies overlap
        float mean[NV], m2[NV];
#pragma unroll
        for (int i = 0; i < NV; i++) mean[i] = v[i];
#pragma unroll
        for (int o = 1; o < CW; o *= 2)
#pragma unroll
            for (int i = 0; i < NV; i++) mean[i] += __shfl_xor_sync(0xffffffffu, mean[i], o);
#pragma unroll
        for (int i = 0; i < NV; i++) mean[i] /= CW, m2[i] = (v[i] - mean[i]) * (v[i] - mean[i]);
#pragma unroll
        for (int o = 1; o < CW; o *= 2)
#pragma unroll
            for (int i = 0; i < NV; i++) m2[i] += __shfl_xor_sync(0xffffffffu, m2[i], o);
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int t = r0 + tid / CW + i * (THREADS / CW);
            if (tid % CW == 0 && t < M) out.stats[(size_t)t * slices + slice] = make_float2(mean[i], m2[i]);
        }
    }
}

// ----------------------------------------------------------------------------
// The kernel
//
// Blocks KS bx .. KS bx + KS - 1 (one cluster) own columns f0 = 64 bx.. and rows r0 = RB by.., and
// block kp of them multiplies K's slices kp per.. (per = part_slices(K, KS)).
// Accumulator tile j of a thread (wgmma.cuh's layout, A = W: its rows are y's columns) holds
// columns fa = f0 + 16 warp + lane / 4 and fa + 8, rows t = r0 + 8 j + 2 (lane % 4) and t + 1:
// acc[j] = {(fa, t), (fa, t+1), (fa+8, t), (fa+8, t+1)}.
//
// With K whole (KS = 1) a thread finishes the values its accumulators hold. With K split, block kp
// finishes columns f0 + kp CW.. (CW = 64 / KS): every block pushes the part of its partial tile
// that block q finishes into q's inbox (distributed shared memory), then one cluster barrier, and
// block kp sums the KS partials of each of its values from its own inbox in rank order (the same
// bits every run): thread tid finishes column f0 + kp CW + tid % CW at rows r0 + tid / CW +
// (128 / CW) i. Pushed rather than pulled: with the pulls after the barrier, the loads' round
// trip sat on the path and a second barrier kept each block alive until the others had read it.
// A block may only store into another once that one has started: each block arrives (relaxed) on
// a "started" phase first thing and waits on it before its first remote store.
// KS is a template argument, not a kernel argument: with the cluster code in the kernel and KS = 1
// picked at run time, every product ran 0.4-1.7 us slower (docs/PERF.md, "Session 22").
// ROWS_LN (K whole): the N / 64 column blocks of a row block are one cluster, and after the
// residual add they write ln (layernorm_rows above). ROWS_STATS and ROWS_FOLDED: Mode.

template <int RB, int EPI, int KS, Mode MODE>
__global__ void __launch_bounds__(THREADS, 1)
    rows_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map, Out out, int M,
                int N, int K) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    static_assert(MODE != ROWS_LN || (EPI == MATMUL_LT_BIAS_RESIDUAL && KS == 1), "the LayerNorm follows a residual add");
    static_assert(MODE != ROWS_STATS || EPI == MATMUL_LT_BIAS_RESIDUAL, "the statistics follow a residual add");
    static_assert(MODE != ROWS_FOLDED || EPI == MATMUL_LT_BIAS, "the folded LayerNorm feeds a bias epilogue");
    constexpr bool residual = EPI == MATMUL_LT_BIAS_RESIDUAL, ln_out = MODE == ROWS_LN || MODE == ROWS_STATS;
    typedef typename std::conditional<residual || EPI == MATMUL_LT_NONE, float, bf16>::type YT;
    typedef typename std::conditional<MODE == ROWS_FOLDED, float, YT>::type BT;  // the bias's type
    constexpr bool split = KS > 1;
    constexpr int J = RB / 8, CW = BF / KS;  // CW: split, the columns of the tile this block finishes
    constexpr int NV = split ? RB * CW / THREADS : RB / 2;  // the values a thread finishes
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const int per = part_slices(K, KS), kp = blockIdx.x % KS;
    const int s0 = kp * per, slices = max(0, min(per, (K + BK - 1) / BK - s0));  // this block's slices
    unsigned char *w_tiles = smem, *x_tiles = smem + (size_t)per * W_SLICE;
    float *inbox = reinterpret_cast<float *>(x_tiles + (size_t)per * RB * BK * 2);  // [RB][PSTR] when split
    float *lnsm = inbox + (split ? RB * PSTR : 0);  // [lnsm_row(MODE) RB]
    uint64_t *w_full = reinterpret_cast<uint64_t *>(lnsm + lnsm_row(MODE) * RB), *x_full = w_full + 1;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int f0 = blockIdx.x / KS * BF, r0 = blockIdx.y * RB;

    pdl_launch_dependents();
    constexpr bool clustered = split || MODE == ROWS_LN;
    if constexpr (clustered) cluster_arrive_relaxed();  // "started": before any block stores into another
    if (tid == 0) {  // a box is `per` slices from s0, those past K read as zeros (and counted)
        mbar_init(w_full, 1);
        mbar_init(x_full, 1);
        mbar_fence_init();
        tma_prefetch_map(&w_map), tma_prefetch_map(&x_map);
        mbar_arrive_expect_tx(w_full, slices ? per * W_SLICE : 0);  // nothing earlier in the step writes W
        if (slices) tma_load_slices(w_tiles, &w_map, s0, f0, w_full);
    }
    // The values this thread finishes, the i-th at (row_of(i), col_of(i)).
    const int fa = f0 + 16 * warp + lane / 4;
    auto row_of = [&](int i) {
        return split ? r0 + tid / CW + i * (THREADS / CW) : r0 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
    };
    auto col_of = [&](int i) { return split ? f0 + kp * CW + tid % CW : fa + 8 * ((i >> 1) & 1); };
    // By column, at col_of(0) and col_of(2) (the same column when K splits):
    float bias[2] = {0.0f, 0.0f}, gamma[2] = {0.0f, 0.0f}, beta[2] = {0.0f, 0.0f}, fold_s[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int f = col_of(2 * h);
        if (f >= N) continue;
        if (EPI != MATMUL_LT_NONE) bias[h] = to_f32(static_cast<const BT *>(out.bias)[f]);
        if (ln_out) gamma[h] = out.gamma[f];
        if (MODE == ROWS_LN) beta[h] = out.beta[f];
        if (MODE == ROWS_FOLDED) fold_s[h] = out.s[f];
    }
    __syncthreads();  // the barriers are initialised
    pdl_wait();

    if (tid == 0) {
        mbar_arrive_expect_tx(x_full, slices ? per * RB * BK * 2 : 0);
        if (slices) tma_load_slices(x_tiles, &x_map, s0, r0, x_full);
    }
    // The residual's old values and the rows' shifts, read while x lands (after the wait: earlier
    // kernels of the step write them); the folded LayerNorm's row statistics.
    float res[NV], shift[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int t = row_of(i), f = col_of(i);
        res[i] = residual && t < M && f < N ? static_cast<const float *>(out.y)[t * out.ldy + f] : 0.0f;
        shift[i] = MODE == ROWS_STATS && t < M ? out.shift[t] : 0.0f;
    }
    const FoldStats fold_stats = {out.stats, out.slices, out.shift};  // ROWS_FOLDED (fold_stats.cuh)
    FoldLoad<FOLD_PAIRS> fold;
    if constexpr (MODE == ROWS_FOLDED) fold = fold_load<RB, THREADS, FOLD_PAIRS>(fold_stats, r0, M, tid);

    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    mbar_wait(w_full, 0);
    trace_mark(TRACE_PHASE + 0);  // TRACE=1 builds (kernel_trace.cuh): W has landed
    mbar_wait(x_full, 0);
    trace_mark(TRACE_PHASE + 1);  // x has landed
    for (int s = 0; s < slices; s++) {  // each slice's MMAs a group
        wgmma_slice_ss<RB>(acc, w_tiles + (size_t)s * W_SLICE, x_tiles + (size_t)s * RB * BK * 2);
        wgmma_hold(acc);
    }
    if constexpr (MODE == ROWS_FOLDED)  // under the MMAs
        fold_finish<RB, THREADS, FOLD_PAIRS>(fold_stats, fold, LnSmem::at<RB>(lnsm).row, r0, M, K, tid);
    wgmma_wait<0>();
    wgmma_hold(acc);
    trace_mark(TRACE_PHASE + 2);  // the MMAs are done
    if constexpr (MODE == ROWS_FOLDED) __syncthreads();  // the rows' statistics are in lnsm

    if constexpr (clustered) cluster_wait();  // every block of the cluster has started
    if constexpr (split) {  // value (row, column c) of this block's partial tile to block c / CW's inbox
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = 16 * warp + lane / 4 + 8 * (e >> 1), q = c / CW;
                float *to = &inbox[(8 * j + 2 * (lane % 4) + (e & 1)) * PSTR + kp * CW + c % CW];
                if (q == kp) *to = acc[j][e];
                else st_cluster(cluster_map(to, q), acc[j][e]);
            }
        cluster_arrive();  // release: the pushes are visible after the wait
        cluster_wait();
    }
    trace_mark(TRACE_PHASE + 3);  // the epilogue starts (K split: the partial sums have arrived)
    float fin[NV];  // the new rows' values (0 past M), for the LayerNorms
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int t = row_of(i), f = col_of(i), h = split ? 0 : (i >> 1) & 1;
        fin[i] = 0.0f;
        if (t >= M || f >= N) continue;
        float v = 0.0f;
        if constexpr (split) {
            const float *p = &inbox[(t - r0) * PSTR + f - f0 - kp * CW];  // rank 0's partial of (t, f)
#pragma unroll
            for (int r = 0; r < KS; r++) v += p[r * CW];
        } else {
            v = acc[i / 4][i % 4];
        }
        if constexpr (MODE == ROWS_FOLDED) {
            const float2 row = LnSmem::at<RB>(lnsm).row[t - r0];  // (mean - shift, rstd)
            v = row.y * (v - row.x * fold_s[h]);
        }
        v += bias[h];
        if (EPI == MATMUL_LT_BIAS_GELU) v = gelu_tanh(v);
        if (residual) v += res[i];
        static_cast<YT *>(out.y)[t * out.ldy + f] = from_f32<YT>(v);
        if constexpr (MODE == ROWS_STATS) out.ln[(size_t)t * N + f] = from_f32<bf16>(gamma[h] * (v - shift[i]));
        fin[i] = v;
    }
    if constexpr (MODE == ROWS_LN) layernorm_rows<RB>(fin, gamma, beta, out, lnsm, r0, fa, M, N, warp, lane, tid);
    if constexpr (MODE == ROWS_STATS) slice_stats<RB, KS>(fin, out, lnsm, r0, f0, kp, M, N, warp, lane, tid);
}

// ----------------------------------------------------------------------------
// Host side: tile choice, tensor maps, launch

// The kernel's shared memory allowed up to smem (per instantiation: the largest so far), and, with
// ROWS_LN, clusters past the portable 8 blocks.
template <int RB, int EPI, int KS, Mode MODE> cudaError_t allow(size_t smem) {
    static size_t smem_set;
    if (smem <= smem_set) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(rows_kernel<RB, EPI, KS, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e == cudaSuccess && MODE == ROWS_LN)
        e = cudaFuncSetAttribute(rows_kernel<RB, EPI, KS, MODE>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e == cudaSuccess) smem_set = smem;
    return e;
}

template <int RB, int EPI, int KS, Mode MODE = ROWS_PLAIN>
cudaError_t launch(const Out &out, const void *x, const void *W, int M, int N, int K, cudaStream_t stream) {
    CUtensorMap x_map, w_map;
    const int per = part_slices(K, KS);
    if (!tensor_map_slices(&x_map, x, M, K, K, RB, per) || !tensor_map_slices(&w_map, W, N, K, K, BF, per))
        return cudaErrorInvalidValue;
    const size_t smem = smem_bytes(K, RB, KS, MODE);
    const cudaError_t e = allow<RB, EPI, KS, MODE>(smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((N + BF - 1) / BF * KS, (M + RB - 1) / RB);
    return launch_pdl_cluster(rows_kernel<RB, EPI, KS, MODE>, grid, dim3(THREADS), smem,
                              MODE == ROWS_LN ? grid.x : KS, stream, x_map, w_map, out, M, N, K);
}

template <int RB, int EPI, Mode MODE>
cudaError_t launch_split(int ks, const Out &out, const void *x, const void *W, int M, int N, int K,
                         cudaStream_t stream) {
    switch (ks) {
    case 1: return launch<RB, EPI, 1, MODE>(out, x, W, M, N, K, stream);
    case 2: return launch<RB, EPI, 2, MODE>(out, x, W, M, N, K, stream);
    case 4: return launch<RB, EPI, 4, MODE>(out, x, W, M, N, K, stream);
    default: return launch<RB, EPI, 8, MODE>(out, x, W, M, N, K, stream);
    }
}

template <int EPI, Mode MODE = ROWS_PLAIN>
cudaError_t launch_rows(int rb, int ks, const Out &out, const void *x, const void *W, int M, int N, int K,
                        cudaStream_t stream) {
    switch (rb) {
    case 16: return launch_split<16, EPI, MODE>(ks, out, x, W, M, N, K, stream);
    case 32: return launch_split<32, EPI, MODE>(ks, out, x, W, M, N, K, stream);
    default: return launch_split<64, EPI, MODE>(ks, out, x, W, M, N, K, stream);
    }
}

// A knob read once from the environment (the engine asks at every product): its value, or 0.
int env_knob(const char *name, int *cache) {
    if (*cache < 0) *cache = getenv(name) ? atoi(getenv(name)) : 0;
    return *cache;
}

bool fits(int K, int rb, int ks, Mode mode = ROWS_PLAIN) {
    return smem_bytes(K, rb, ks, mode) <= (size_t)device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(0);
}

// The blocks K splits over: the fewest whose part of the W tile fits. Splitting a K that fits whole
// only lost (docs/PERF.md, "Session 22": the cluster barrier and the partial tiles' adds cost more
// than the shorter MMAs save, 0.5-1.5 us at GPT-2's K = 768). GPT2_ROWS_SPLIT=1|2|4|8 forces one
// where it fits.
int pick_split(int K, int rb, Mode mode = ROWS_PLAIN) {
    static int forced = -1;
    const int f = env_knob("GPT2_ROWS_SPLIT", &forced);
    if ((f == 1 || f == 2 || f == 4 || f == 8) && fits(K, rb, f, mode)) return f;
    int ks = 1;
    while (ks < MAX_SPLIT && !fits(K, rb, ks, mode)) ks *= 2;
    return ks;
}

// 1 when the grid for M rows of N columns, rb rows a block and K over ks blocks is one wave of
// blocks (one an SM).
bool one_wave(int M, int N, int rb, int ks) {
    const long long blocks = (long long)(N + BF - 1) / BF * ((M + rb - 1) / rb) * ks;
    return blocks <= device_attr<cudaDevAttrMultiProcessorCount>(0);
}

// Rows a block: 16 to 16 rows, 32 to 32, and past 32 rows 32 where K is whole (two row blocks at
// 64: half of x's bytes after the wait, for twice the W reads before it) but 64 where K splits (a
// split tile's partial sums and cluster barrier cost the same for 64 rows as for 32). Measured in
// docs/PERF.md, "Session 21" and "Session 22": at 48-64 rows, K whole, 64 a block is within 2% for
// qkv and fc and 14-20% slower for the projection, 16 a block 1.6x slower for fc; the MLP projection
// (K = 3072 over 4 blocks) 4.71 / 5.04 us at 48 / 64 rows with 64 a block, 5.18 / 5.42 with 32.
// With the LayerNorm statistics in its epilogue (stats: per-value work that 64 rows a block
// doubles) 32 a block ran batched decode 2.5% faster at 48-64 rows ("Session 23").
// The modes with a LayerNorm's per-row work (statistics, their exchange across a cluster, the
// fold's merge: work that grows with a block's rows, after a short K loop) take 16 rows a block
// past 16 rows too, wherever that grid is still one wave: the attention projection with LN2 at
// every batch, the folded qkv to 48 rows and the MLP projection's statistics to 32 on GPT-2 124M
// (batched decode +2-4% at 24-64 rows, "Session 29"; the plain fc gained nothing so: -1 to -3% at
// 32-48 rows).
// Past 64 rows (a prompt's products) 64 a block where 32 would take more than one wave: the wave
// rule below then still lets 124M's products take gemm_rows to 128 rows and its attention
// projection to 704 (docs/PERF.md, "Session 31").
// GPT2_ROWS_TILE=16|32|64 forces one.
int pick_rows(int M, int N, int K, Mode mode = ROWS_PLAIN) {
    static int forced = -1;
    const int rb = env_knob("GPT2_ROWS_TILE", &forced);
    if (rb == 16 || rb == 32 || rb == 64) return rb;
    if (M <= 16) return 16;
    if (mode != ROWS_PLAIN) {
        const int ks = pick_split(K, 16, mode);
        if (fits(K, 16, ks, mode) && one_wave(M, N, 16, ks)) return 16;
    }
    if (M > 64) {
        const int ks32 = pick_split(K, 32, mode), ks64 = pick_split(K, 64, mode);
        if (!one_wave(M, N, 32, ks32) && fits(K, 64, ks64, mode)) return 64;
    }
    return M <= 32 || mode == ROWS_STATS || fits(K, 32, 1) ? 32 : 64;
}

// 1 when clusters of `blocks` blocks of the LayerNorm kernel with RB rows and K fit on the device
// (asked of the driver once per size and shared memory: the engine asks at every product).
template <int RB> bool ln_cluster_fits(int blocks, int K) {
    static size_t yes[17], no[17];  // [blocks]: the most shared memory seen to fit, the least seen not to
    const size_t smem = smem_bytes(K, RB, 1, ROWS_LN);
    if (blocks < 1 || blocks > MAX_LN_BLOCKS) return false;
    if (smem <= yes[blocks]) return true;
    if (no[blocks] && smem >= no[blocks]) return false;
    const void *kernel = reinterpret_cast<const void *>(rows_kernel<RB, MATMUL_LT_BIAS_RESIDUAL, 1, ROWS_LN>);
    const bool ok = allow<RB, MATMUL_LT_BIAS_RESIDUAL, 1, ROWS_LN>(smem) == cudaSuccess &&
                    cluster_fits(kernel, blocks, THREADS, smem);
    (ok ? yes : no)[blocks] = smem;
    return ok;
}

// The LayerNorm kernel's shapes: N whole 64-column blocks, at most 16 of them (the largest cluster,
// a non-portable size), K whole in shared memory, and such a cluster fits on the device.
bool ln_fits(int N, int K, int rb) {
    if (N % BF || N / BF > MAX_LN_BLOCKS || !fits(K, rb, 1, ROWS_LN)) return false;
    switch (rb) {
    case 16: return ln_cluster_fits<16>(N / BF, K);
    case 32: return ln_cluster_fits<32>(N / BF, K);
    default: return ln_cluster_fits<64>(N / BF, K);
    }
}

}  // namespace

extern "C" int gemm_rows_available(void) {
#if GPT2_SM90A
    static int off = -1;  // GPT2_GEMM_ROWS=0
    if (off < 0) off = getenv("GPT2_GEMM_ROWS") && strcmp(getenv("GPT2_GEMM_ROWS"), "0") == 0;
    return !off && device_attr<cudaDevAttrComputeCapabilityMajor>(0) == 9 &&
           device_attr<cudaDevAttrComputeCapabilityMinor>(-1) == 0 && encode_tiled() != NULL;
#else
    return 0;
#endif
}

// Past 32 rows the engine leaves a product to cuBLASLt where gemm_rows's grid would take more than
// one wave of blocks (one an SM): only the first wave loads its W before the wait, and cuBLASLt's
// larger tiles read W once. GPT-2 774M and 1558M at 48-64 rows ran 6-15% faster so, 124M and 355M
// the same (its grids fit); at 17-32 rows gemm_rows wins even over several waves (docs/PERF.md,
// "Session 22"). The same rule holds for a prompt's rows: with every product of 124M's prompts on
// gemm_rows regardless, 160 tokens took 9% longer and 1024 twice as long ("Session 31").
constexpr int ONE_WAVE_PAST = 32;

static bool wave_rule(int M, int N, int rb, int ks) { return M <= ONE_WAVE_PAST || one_wave(M, N, rb, ks); }

extern "C" int gemm_rows_takes(int M, int N, int K) {
    if (!gemm_rows_available() || M < 0 || M > GEMM_ROWS_MAX_ROWS || N <= 0 || K <= 0 || K % BK) return 0;
    const int rb = pick_rows(M, N, K), ks = pick_split(K, rb);
    return fits(K, rb, ks) && wave_rule(M, N, rb, ks);
}

extern "C" cudaError_t gemm_rows_ex(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                                    const void *bias, int M, int N, int K, int rb, int ks, cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || ldy < N || !y || !x || !W || (epilogue != MATMUL_LT_NONE && !bias) ||
        epilogue < MATMUL_LT_NONE || epilogue > MATMUL_LT_BIAS_GELU || (rb && rb != 16 && rb != 32 && rb != 64) ||
        (ks && ks != 1 && ks != 2 && ks != 4 && ks != 8))
        return cudaErrorInvalidValue;
    if (!rb) rb = pick_rows(M, N, K);
    if (!gemm_rows_available() || M > GEMM_ROWS_MAX_ROWS || K % BK || (uintptr_t)x % 16 || (uintptr_t)W % 16)
        return cudaErrorNotSupported;
    if (!ks) ks = pick_split(K, rb);
    if (!fits(K, rb, ks)) return cudaErrorNotSupported;
    if (M == 0) return cudaSuccess;
    Out out = {};
    out.y = y, out.ldy = ldy, out.bias = bias;
    switch (epilogue) {
    case MATMUL_LT_NONE: return launch_rows<MATMUL_LT_NONE>(rb, ks, out, x, W, M, N, K, stream);
    case MATMUL_LT_BIAS: return launch_rows<MATMUL_LT_BIAS>(rb, ks, out, x, W, M, N, K, stream);
    case MATMUL_LT_BIAS_RESIDUAL: return launch_rows<MATMUL_LT_BIAS_RESIDUAL>(rb, ks, out, x, W, M, N, K, stream);
    default: return launch_rows<MATMUL_LT_BIAS_GELU>(rb, ks, out, x, W, M, N, K, stream);
    }
}

extern "C" cudaError_t gemm_rows(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                                 const void *bias, int M, int N, int K, cudaStream_t stream) {
    return gemm_rows_ex(epilogue, y, ldy, x, W, bias, M, N, K, 0, 0, stream);
}

// Past 64 rows the LayerNorm epilogue only at 16 rows a block (which pick_rows takes where that grid
// is one wave): on 124M's prompts it won at 128 rows (16 a block) and lost to the plain product and
// the LayerNorm kernel from 256 (32 or 64 a block), the cluster's exchange of the rows' statistics
// growing with them (docs/PERF.md, "Session 31").
extern "C" int gemm_rows_ln_takes(int M, int N, int K) {
    static int off = -1;  // GPT2_ROWS_LN=0
    if (off < 0) off = getenv("GPT2_ROWS_LN") && strcmp(getenv("GPT2_ROWS_LN"), "0") == 0;
    if (off || !gemm_rows_available() || M < 0 || M > GEMM_ROWS_MAX_ROWS || N <= 0 || K <= 0 || K % BK) return 0;
    const int rb = pick_rows(M, N, K, ROWS_LN);
    return ln_fits(N, K, rb) && (M <= 64 || rb == 16);
}

extern "C" cudaError_t gemm_rows_residual_ln(float *y, const void *x, const void *W, const float *bias,
                                             const float *gamma, const float *beta, void *ln, float *mean, int M,
                                             int N, int K, int rb, cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || !y || !x || !W || !bias || !gamma || !beta || !ln ||
        (rb && rb != 16 && rb != 32 && rb != 64))
        return cudaErrorInvalidValue;
    if (!rb) rb = pick_rows(M, N, K, ROWS_LN);
    if (!gemm_rows_available() || M > GEMM_ROWS_MAX_ROWS || K % BK || (uintptr_t)x % 16 || (uintptr_t)W % 16 ||
        !ln_fits(N, K, rb))
        return cudaErrorNotSupported;
    if (M == 0) return cudaSuccess;
    Out out = {};
    out.y = y, out.ldy = N, out.bias = bias, out.gamma = gamma, out.beta = beta, out.ln = static_cast<bf16 *>(ln);
    out.mean = mean;
    switch (rb) {
    case 16: return launch<16, MATMUL_LT_BIAS_RESIDUAL, 1, ROWS_LN>(out, x, W, M, N, K, stream);
    case 32: return launch<32, MATMUL_LT_BIAS_RESIDUAL, 1, ROWS_LN>(out, x, W, M, N, K, stream);
    default: return launch<64, MATMUL_LT_BIAS_RESIDUAL, 1, ROWS_LN>(out, x, W, M, N, K, stream);
    }
}

// ----------------------------------------------------------------------------
// ln1 folded into qkv: the MLP projection's statistics, then qkv's folded epilogue

// The rows a block and split of the MLP projection's statistics mode (pick_rows's, for it), where
// gemm_rows takes the product, the shape takes whole slices (N whole 64-column blocks), its lnsm
// fits too and its grid keeps the one-wave rule; false otherwise.
static bool stats_shape(int M, int N, int K, int *rb, int *ks) {
    if (!gemm_rows_takes(M, N, K) || N % BF) return false;
    *rb = pick_rows(M, N, K, ROWS_STATS), *ks = pick_split(K, *rb, ROWS_STATS);
    return fits(K, *rb, *ks, ROWS_STATS) && wave_rule(M, N, *rb, *ks);
}

extern "C" int gemm_rows_stats_slices(int M, int N, int K) {
    static int off = -1;  // GPT2_ROWS_LN1=0
    if (off < 0) off = getenv("GPT2_ROWS_LN1") && strcmp(getenv("GPT2_ROWS_LN1"), "0") == 0;
    int rb, ks;
    return !off && stats_shape(M, N, K, &rb, &ks) ? N / (BF / ks) : 0;
}

extern "C" cudaError_t gemm_rows_residual_stats(float *y, const void *x, const void *W, const float *bias,
                                                const float *gamma, const float *shift, void *ln, float *stats, int M,
                                                int N, int K, cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || !y || !x || !W || !bias || !gamma || !shift || !ln || !stats)
        return cudaErrorInvalidValue;
    int rb, ks;
    if (M > GEMM_ROWS_MAX_ROWS || (uintptr_t)x % 16 || (uintptr_t)W % 16 || (uintptr_t)stats % 8 ||
        !stats_shape(M, N, K, &rb, &ks))
        return cudaErrorNotSupported;
    if (M == 0) return cudaSuccess;
    Out out = {};
    out.y = y, out.ldy = N, out.bias = bias, out.gamma = gamma, out.ln = static_cast<bf16 *>(ln);
    out.shift = shift, out.stats = reinterpret_cast<float2 *>(stats);
    return launch_rows<MATMUL_LT_BIAS_RESIDUAL, ROWS_STATS>(rb, ks, out, x, W, M, N, K, stream);
}

extern "C" cudaError_t gemm_rows_ln_folded(void *y, long long ldy, const void *x, const void *W, const float *s,
                                           const float *bias, const float *stats, int slices, const float *shift,
                                           int M, int N, int K, int rb, cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || ldy < N || !y || !x || !W || !s || !bias || !stats || !shift || slices <= 0 ||
        K % slices || (rb && rb != 16 && rb != 32 && rb != 64))
        return cudaErrorInvalidValue;
    if (!rb) rb = pick_rows(M, N, K, ROWS_FOLDED);
    const int ks = pick_split(K, rb, ROWS_FOLDED);
    if (!gemm_rows_available() || M > GEMM_ROWS_MAX_ROWS || K % BK || (uintptr_t)x % 16 || (uintptr_t)W % 16 ||
        (uintptr_t)stats % 8 || !fits(K, rb, ks, ROWS_FOLDED))
        return cudaErrorNotSupported;
    if (M == 0) return cudaSuccess;
    Out out = {};
    out.y = y, out.ldy = ldy, out.bias = bias, out.shift = shift;
    out.stats = reinterpret_cast<float2 *>(const_cast<float *>(stats)), out.slices = slices, out.s = s;
    return launch_rows<MATMUL_LT_BIAS, ROWS_FOLDED>(rb, ks, out, x, W, M, N, K, stream);
}
