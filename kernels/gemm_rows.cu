// Products of a few rows on Hopper (gemm_rows.h): W's tile by TMA before the PDL wait (gemm_rows_ln
// past 32 rows: after its loads of x), x's rows by TMA after it, one wgmma warpgroup with W as the
// A operand, K split over a cluster's blocks where the tile does not fit. gemm_rows_ln: x's rows
// fp32, normalised by the blocks themselves into the same x tiles (LayerNorm + Linear in one kernel),
// shared over a cluster along the columns. gemm_rows_fold: x's tiles are the residual product's bf16
// copy (TMA, as gemm_rows), and the second warpgroup takes the fp32 rows' statistics for the epilogue.
//
// Shared memory of a block, 1024-byte aligned (the 128-byte swizzle's period), for its part of K:
//   w_tiles  its K/64/ks slices of W's 64 rows x 64 k (8 KB each), as TMA lands them under the swizzle
//   x_tiles  the same slices of x's RB rows x 64 k (RB x 128 bytes each)
//   inbox    K split (ks > 1): the cluster's partial sums of this block's CW = 64 / ks columns, fp32,
//            [ks ranks x CW columns][RB rows, padded], each rank's pushed there by that rank
//   barriers one for all of W (before the wait; gemm_rows_ln past 32 rows after its loads of x), one
//            for all of x (after it): each is one copy of
//            all the block's slices (tma.cuh's tensor_map_slices), which lands x sooner than a copy
//            a slice with the MMAs started as each landed (docs/PERF.md, "Session 25"); gemm_rows_ln
//            in a cluster counts its rows on x's instead (its threads' arrivals and the other
//            blocks' st_async bytes); a K split's inbox has a third, counted the same way, and
//            gemm_rows_fold's statistics take that third slot (it never splits K)
//   stats    gemm_rows_fold: (mean, rstd) of the tile's RB rows
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "cluster.cuh"
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
// A column of the inbox: RB partial sums, padded by 16 bytes so that 8 threads' 16-byte reads of as
// many columns fall in distinct banks.
constexpr int inbox_stride(int rb) { return rb + 4; }

// K's slices a block multiplies when K splits over ks blocks.
constexpr int part_slices(int K, int ks) { return ((K + BK - 1) / BK + ks - 1) / ks; }

// Where x's tiles come from: bf16 x by TMA (gemm_rows), fp32 x normalised by the block
// (gemm_rows_ln), or the residual product's bf16 copy by TMA with the fp32 rows' statistics beside
// the MMAs (gemm_rows_fold).
enum Src { SRC_X, SRC_LN, SRC_FOLD };

// Shared memory of a block for K over ks blocks and RB rows, the alignment slack included.
constexpr size_t smem_bytes(int K, int rb, int ks, int src = SRC_X) {
    const size_t slices = part_slices(K, ks);
    return 1024 + slices * (W_SLICE + (size_t)rb * BK * 2) +
           (ks > 1 ? (size_t)BF * inbox_stride(rb) * sizeof(float) : 0) +
           3 * sizeof(uint64_t) + (src == SRC_FOLD ? (size_t)rb * 2 * sizeof(float) : 0);
}

// Where the epilogue writes (matmul_lt.h's table): y [M, N] rows ldy apart, bias [N] of y's type
// (gemm_rows_ln and gemm_rows_fold: fp32, the folded b' = W beta + b, or NULL). The LayerNorm fold
// (gemm_rows.h): the residual product's copy of its new rows, bf16 copy_gamma (y - shift) [M, N]
// (NULL: none); gemm_rows_fold's fold_s = W gamma [N], its copy's shift, and where the rows' means go.
struct Out {
    void *y;
    long long ldy;
    const void *bias;
    bf16 *copy;
    const float *copy_gamma;
    const float *shift;  // [M], or NULL: 0
    const float *fold_s;
    float *mean_out;     // [M], or NULL
};

// gemm_rows_ln's input: x fp32 [M, K] rows ldx apart, the LayerNorm's gamma [K]; w_after_x: W's
// copy issued after the block's loads of x, not before the PDL wait (pick_w_after_x).
struct LnIn {
    const float *x;
    long long ldx;
    const float *gamma;
    int w_after_x;
};

// gemm_rows_ln: a lane holds float4 i of a row at k = 4 (32 i + lane), VPL of them (2, 6, 8 or 10:
// rows of K <= 128 VPL, so K <= 1280, GPT-2 774M's C). gemm_rows_fold holds its statistics' rows the
// same way to K = 1024: its 32-row tile at 774M's K needs 246 KB of shared memory.
constexpr int LN_MAX_K = 1280, FOLD_MAX_K = 1024;
constexpr float LN_EPS = 1e-5f;
constexpr int ln_vpl(int K) { return K <= 256 ? 2 : K <= 768 ? 6 : K <= 1024 ? 8 : 10; }

// f(std::integral_constant<int, VPL>) for K's VPL, K <= MAX_K: the one place the run-time K picks an
// instantiation.
template <int MAX_K, typename F> auto with_vpl(int K, F &&f) {
    static_assert(MAX_K <= LN_MAX_K, "a lane holds at most 10 float4s of a row");
    if constexpr (MAX_K > 1024)
        if (ln_vpl(K) == 10) return f(std::integral_constant<int, 10>{});
    switch (ln_vpl(K)) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 6: return f(std::integral_constant<int, 6>{});
    default: return f(std::integral_constant<int, 8>{});
    }
}
constexpr int LN_THREADS = 2 * THREADS;  // gemm_rows_ln's block: two warpgroups stage, the first multiplies
constexpr int LN_WARPS = LN_THREADS / 32;

// ----------------------------------------------------------------------------
// Rows of fp32 x in registers and their statistics (gemm_rows_ln's staging, gemm_rows_fold's
// statistics): a warp holds RR whole rows, lane's float4 i of a row at k = 4 (32 i + lane), VPL of
// them, so one L2 round trip brings all RR; lanes past the row and rows past M hold zeros.

template <int RR, int VPL>
__device__ __forceinline__ void load_rows(float4 (&v)[RR][VPL], const LnIn &in, int t0, int M, int K, int lane) {
#pragma unroll
    for (int j = 0; j < RR; j++) {
        const int t = t0 + j;
        const float4 *row = reinterpret_cast<const float4 *>(in.x + (long long)min(t, M - 1) * in.ldx);
#pragma unroll
        for (int i = 0; i < VPL; i++)
            v[j][i] = t < M && 32 * i + lane < K / 4 ? row[32 * i + lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// The counts of row_stats's tree (below): they depend on K and the lane only (the lanes past the row
// hold none), so a kernel takes them before its wait. Taken after it they cost batch 1 3%, and with
// IEEE reciprocals (a slow-path branch in this straight-line code) 3.4% more (docs/PERF.md,
// "Session 58").
struct RowTree {
    float inv_n;               // 1 / this lane's count of values (0: none)
    float na[5], nb[5], c[5];  // per level l (partner lane ^ 16 >> l): the two groups' counts, 1 / (na nb (na + nb))
};
template <int VPL> __device__ __forceinline__ RowTree row_tree(int K, int lane) {
    RowTree t;
    int cnt = 0;  // this lane's float4s inside the row
#pragma unroll
    for (int i = 0; i < VPL; i++) cnt += 32 * i + lane < K / 4;
    float n = 4.0f * cnt;
    t.inv_n = cnt ? __fdividef(1.0f, n) : 0.0f;
#pragma unroll
    for (int l = 0; l < 5; l++) {
        t.na[l] = n;
        t.nb[l] = __shfl_xor_sync(0xffffffffu, n, 16 >> l);
        const float p = t.na[l] * t.nb[l] * (t.na[l] + t.nb[l]);
        t.c[l] = p > 0.0f ? __fdividef(1.0f, p) : 0.0f;
        n += t.nb[l];
    }
    return t;
}

// Each row's mean, and rstd = 1 / sqrt(var + eps), in one shuffle tree. A lane takes its own values'
// sum S and centred sum of squares Q (two passes in registers: exact), then the butterfly merges
// lanes' (S, Q) pairwise by Chan's rule: for groups a and b of n_a and n_b values,
//   Q = Q_a + Q_b + d^2 / (n_a n_b (n_a + n_b)),   d = n_b S_a - n_a S_b,
// as stable as two passes over the row. Two trees, the mean's then the squares', were the warp's
// dependent path: one tree shortens it. d's products are rounded apart (no FMA) so that the two
// partners' d are exact negatives and every lane ends with the same statistics; the mean is the same
// butterfly sum as a plain tree's, to the bit.
template <int RR, int VPL>
__device__ __forceinline__ void row_stats(const float4 (&v)[RR][VPL], float (&mean)[RR], float (&rstd)[RR], int K,
                                          int lane, const RowTree &t) {
    float s[RR], q[RR];
#pragma unroll
    for (int j = 0; j < RR; j++) {
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < VPL; i++) a += (v[j][i].x + v[j][i].y) + (v[j][i].z + v[j][i].w);
        const float m_lane = a * t.inv_n;
        float b = 0.0f;
#pragma unroll
        for (int i = 0; i < VPL; i++) {
            const float m = 32 * i + lane < K / 4 ? m_lane : 0.0f;  // the lanes past the row hold zeros
            const float dx = v[j][i].x - m, dy = v[j][i].y - m, dz = v[j][i].z - m, dw = v[j][i].w - m;
            b += (dx * dx + dy * dy) + (dz * dz + dw * dw);
        }
        s[j] = a;
        q[j] = b;
    }
#pragma unroll
    for (int l = 0; l < 5; l++) {
#pragma unroll
        for (int j = 0; j < RR; j++) {
            const float s_b = __shfl_xor_sync(0xffffffffu, s[j], 16 >> l);
            const float q_b = __shfl_xor_sync(0xffffffffu, q[j], 16 >> l);
            const float d = __fmul_rn(t.nb[l], s[j]) - __fmul_rn(t.na[l], s_b);
            q[j] = fmaf(d * t.c[l], d, q[j] + q_b);
            s[j] += s_b;
        }
    }
    const float inv_k = 1.0f / K;
#pragma unroll
    for (int j = 0; j < RR; j++) {
        mean[j] = s[j] * inv_k;
        rstd[j] = rsqrtf(q[j] * inv_k + LN_EPS);
    }
}

// ----------------------------------------------------------------------------
// gemm_rows_ln's LayerNorm: x's RB rows into the x tiles as wgmma reads them
//
// The block's two warpgroups stage (LN_THREADS: the second one only stages, then leaves the MMAs to
// the first). In a cluster of CN blocks along the columns (the same rows, CN column tiles) block q
// stages the tile's rows q RB / CN.. and stores each into all CN blocks' tiles: its own by plain
// stores, the others by st_async, whose bytes count on their x_full (`bar`), so a block waits on its
// own barrier for its tile, with no cluster fence or barrier (docs/PERF.md, "Session 38").
// The 8 warps take RB / CN / 8 rows each (where RB / CN < 8, the first RB / CN warps one each), up
// to four at a time (load_rows, row_stats), then gamma (x - mean) rstd rounded to bf16 and stored
// under the 128-byte swizzle (16-byte chunk c of row t at chunk c ^ (t % 8)), rows past M as zeros.
// beta is not applied: it is in the bias (b' = W beta + b, ln_fold.cu's vectors), so the product is
// W (LayerNorm(x) - beta) + b' = W LayerNorm(x) + b.
// Straight-line code, the lanes past the row masked by selects: a warp runs this with little to
// hide its latencies but its rows' independent chains and the scheduler's other warp; a branch a
// value (the first version) cost ~3 us, and one warpgroup taking 32 rows in two rounds ~2.7 us
// more than 16 rows in one (docs/PERF.md, "Session 34").
// Each lane pushes its 8-byte halves as they are: staging only the rows inside M (the rest zeroed
// before the wait), or whole 16-byte chunks after a lane-pair shuffle, cut the pushes to an eighth
// or a half: the kernel alone was even, batch 1-16 decode lost 1-3% (docs/PERF.md, "Session 56").

// after_loads() is called once, as soon as the warp's first round of loads is issued.
template <int RB, int VPL, int CN, typename AfterLoads>
__device__ __forceinline__ void stage_ln_rows(unsigned char *x_tiles, uint64_t *bar, const LnIn &in,
                                              const float4 (&g)[VPL], const RowTree &tree, int r0, int M, int K,
                                              int rank, int warp, int lane, AfterLoads after_loads) {
    constexpr int RBB = RB / CN;  // the tile's rows this block stages: rank RBB..
    constexpr int RPW = RBB > LN_WARPS ? RBB / LN_WARPS : 1, RR = RPW < 4 ? RPW : 4;  // rows a warp, a round
    if (warp * RPW >= RBB) return after_loads();
    uint32_t tile_in[CN], bar_in[CN];  // CN > 1: x_tiles and bar in each block (shared::cluster addresses)
#pragma unroll
    for (int q = 0; q < CN; q++) {
        tile_in[q] = CN > 1 ? cluster_map(x_tiles, q) : 0;
        bar_in[q] = CN > 1 ? cluster_map(bar, q) : 0;
    }
    const int nq = K / 4;  // float4s a row
    // Lane's float4 i lands in k slice 2 i + lane / 16, 16-byte chunk (lane % 16) / 2, half lane % 2.
    unsigned char *lane_at = x_tiles + (lane / 16) * RB * BK * 2 + (lane & 1) * 8;
    const int chunk = (lane % 16) / 2;
#pragma unroll 1
    for (int rr = 0; rr < RPW; rr += RR) {
        float4 v[RR][VPL];
        load_rows<RR, VPL>(v, in, r0 + rank * RBB + warp * RPW + rr, M, K, lane);
        if (rr == 0) after_loads();
        float mean[RR], rstd[RR];
        row_stats<RR, VPL>(v, mean, rstd, K, lane, tree);
#pragma unroll
        for (int j = 0; j < RR; j++) {
            const int t = rank * RBB + warp * RPW + rr + j;  // the tile's row
            unsigned char *at = lane_at + t * 128 + ((chunk ^ (t & 7)) << 4);
            const float r = rstd[j], sh = -mean[j] * r;  // (x - mean) rstd = x rstd + sh
#pragma unroll
            for (int i = 0; i < VPL; i++) {
                const float4 x = v[j][i], gi = g[i];
                const __nv_bfloat162 lo = __floats2bfloat162_rn(gi.x * fmaf(x.x, r, sh), gi.y * fmaf(x.y, r, sh));
                const __nv_bfloat162 hi = __floats2bfloat162_rn(gi.z * fmaf(x.z, r, sh), gi.w * fmaf(x.w, r, sh));
                const uint2 v2 =
                    make_uint2(*reinterpret_cast<const uint32_t *>(&lo), *reinterpret_cast<const uint32_t *>(&hi));
                unsigned char *to = at + (size_t)i * 2 * RB * BK * 2;
                if (32 * i + lane < nq) {
                    *reinterpret_cast<uint2 *>(to) = v2;
#pragma unroll
                    for (int q = 0; q < CN; q++)
                        if (q != rank) st_async(tile_in[q] + (uint32_t)(to - x_tiles), v2, bar_in[q]);
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// gemm_rows_fold's statistics: (mean, rstd) of the tile's RB rows into every block's stats[]
//
// The second warpgroup's 4 warps, while the first multiplies. In a cluster of CN blocks along the
// columns block q takes rows q RB / CN.. (a warp RB / CN / 4 of them, or one) and hands each row's
// pair to all CN blocks: its own by a plain store, the others by st_async counted on their st_full,
// as gemm_rows_ln shares its staged rows. The loads go out before the wait for every block of the
// cluster to have started (a remote store needs that), so the wait hides behind them (docs/PERF.md,
// "Session 49": issued after it, the statistics sat longer on the path).
template <int RB, int VPL, int CN>
__device__ __forceinline__ void fold_stats(float2 *stats, uint64_t *st_full, const LnIn &in, const RowTree &tree,
                                           int r0, int M, int K, int rank, int w, int lane) {
    constexpr int RBB = RB / CN, RPW = RBB >= 4 ? RBB / 4 : 1, RR = RPW < 4 ? RPW : 4;  // rows a warp, a round
    if (w * RPW >= RBB) {
        if (CN > 1) cluster_wait();
        return;
    }
#pragma unroll 1
    for (int rr = 0; rr < RPW; rr += RR) {
        float4 v[RR][VPL];
        load_rows<RR, VPL>(v, in, r0 + rank * RBB + w * RPW + rr, M, K, lane);
        float mean[RR], rstd[RR];
        row_stats<RR, VPL>(v, mean, rstd, K, lane, tree);
        if (CN > 1 && rr == 0) cluster_wait();  // every block has started
#pragma unroll
        for (int j = 0; j < RR; j++) {
            const int t = rank * RBB + w * RPW + rr + j;  // the tile's row
            if (lane == rank) stats[t] = make_float2(mean[j], rstd[j]);
            else if (lane < CN)
                st_async(cluster_map(&stats[t], lane), make_uint2(__float_as_uint(mean[j]), __float_as_uint(rstd[j])),
                         cluster_map(st_full, lane));
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
// that block q finishes into q's inbox (distributed shared memory, column-major), and block kp sums
// the KS partials of each of its values from its own inbox in rank order (the same bits every
// run): thread tid finishes column f0 + kp CW + tid % CW at NV consecutive rows from
// r0 + NV (tid / CW). A push is four consecutive rows of a column, one 16-byte st_async: lanes
// 2i and 2i + 1 hold rows t, t + 1 and t + 2, t + 3 of the same columns, so one shuffle each way
// gives the even lane tile j's four rows and the odd lane tile j + 1's. Pushed rather than pulled:
// with the pulls after the barrier, the loads' round trip sat on the path and a second barrier
// kept each block alive until the others had read it.
// A block may only store into another once that one has started: each block arrives (relaxed) on
// a "started" phase first thing and waits on it before its first remote store.
// KS is a template argument, not a kernel argument: with the cluster code in the kernel and KS = 1
// picked at run time, every product ran 0.4-1.7 us slower (docs/PERF.md, "Session 22").
//
// gemm_rows_fold (SRC_FOLD): the first warpgroup multiplies the copy's tiles as gemm_rows does; the
// second takes the statistics (fold_stats) and leaves; the epilogue waits for them on st_full and
// finishes y = rstd (acc - (mean - c) s) + b' (gemm_rows.h), block 0 of the columns writing the
// means. The residual epilogue with out.copy also stores bf16 gamma' (y - c), after y's stores; its
// c is read with the residual (a load issued after the stores waited for them: docs/PERF.md,
// "Session 49").

template <int RB, int EPI, int KS, int SRC, int VPL = 1, int CN = 1>
__global__ void __launch_bounds__(SRC != SRC_X ? LN_THREADS : THREADS, 1)
    rows_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map, LnIn ln, Out out,
                int M, int N, int K) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    constexpr bool LN = SRC == SRC_LN, FOLD = SRC == SRC_FOLD;
    constexpr bool residual = EPI == MATMUL_LT_BIAS_RESIDUAL;
    typedef typename std::conditional<residual || EPI == MATMUL_LT_NONE, float, bf16>::type YT;
    typedef typename std::conditional<LN || FOLD, float, YT>::type BT;  // the bias's type
    constexpr bool split = KS > 1;
    static_assert(SRC == SRC_X || (!split && (EPI == MATMUL_LT_BIAS || EPI == MATMUL_LT_BIAS_GELU)),
                  "gemm_rows_ln's and gemm_rows_fold's cases");
    static_assert(CN == 1 || SRC != SRC_X, "a cluster along the columns shares gemm_rows_ln's staging only");
    constexpr int J = RB / 8, CW = BF / KS;  // CW: split, the columns of the tile this block finishes
    constexpr int NV = split ? RB * CW / THREADS : RB / 2;  // the values a thread finishes
    static_assert(!split || J % 2 == 0, "a K split's pushes pair the accumulator tiles");
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const int per = part_slices(K, KS), kp = blockIdx.x % KS;
    const int s0 = kp * per, slices = max(0, min(per, (K + BK - 1) / BK - s0));  // this block's slices
    unsigned char *w_tiles = smem, *x_tiles = smem + (size_t)per * W_SLICE;
    constexpr int ISTR = inbox_stride(RB);
    float *inbox = reinterpret_cast<float *>(x_tiles + (size_t)per * RB * BK * 2);  // [BF][ISTR] when split
    uint64_t *w_full = reinterpret_cast<uint64_t *>(inbox + (split ? BF * ISTR : 0)), *x_full = w_full + 1;
    uint64_t *in_full = w_full + 2;  // K split: the inbox's values, the other ranks' by their bytes
    uint64_t *st_full = w_full + 2;  // gemm_rows_fold (K whole): the statistics, the other ranks' by their bytes
    float2 *stats = reinterpret_cast<float2 *>(w_full + 3);  // gemm_rows_fold: [RB]
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int f0 = blockIdx.x / KS * BF, r0 = blockIdx.y * RB;

    pdl_launch_dependents();
    auto load_w = [&] {  // thread 0: a box is `per` slices from s0, those past K read as zeros (and counted)
        mbar_arrive_expect_tx(w_full, slices ? per * W_SLICE : 0);
        if (slices) tma_load_slices(w_tiles, &w_map, s0, f0, w_full);
    };
    const bool w_after_x = LN && ln.w_after_x;
    if (tid == 0) {
        mbar_init(w_full, 1);
        mbar_init(x_full, LN && CN > 1 ? LN_THREADS : 1);
        if (split) mbar_init(in_full, THREADS);
        if (FOLD) mbar_init(st_full, 1 + THREADS);  // thread 0's expect, the second warpgroup's arrivals
        mbar_fence_init();
        tma_prefetch_map(&w_map);
        if (!LN) tma_prefetch_map(&x_map);
        if (!w_after_x) load_w();  // nothing earlier in the step writes W
    }
    // "Started": the barriers are initialised (fence.mbarrier_init orders that before the relaxed
    // arrive), so another block may store into this one once it has waited on this phase.
    if constexpr (split || CN > 1) cluster_arrive_relaxed();
    auto load_w_after_x = [&] {
        if (w_after_x && tid == 0) load_w();
    };
    // The values this thread finishes, the i-th at (row_of(i), col_of(i)).
    const int fa = f0 + 16 * warp + lane / 4;
    auto row_of = [&](int i) { return split ? r0 + tid / CW * NV + i : r0 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1); };
    auto col_of = [&](int i) { return split ? f0 + kp * CW + tid % CW : fa + 8 * ((i >> 1) & 1); };
    float bias[2] = {0.0f, 0.0f};  // at col_of(0) and col_of(2) (the same column when K splits)
    if (EPI != MATMUL_LT_NONE && out.bias)
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (col_of(2 * h) < N) bias[h] = to_f32(static_cast<const BT *>(out.bias)[col_of(2 * h)]);
    float fold_s[2] = {0.0f, 0.0f}, copy_gamma[2] = {0.0f, 0.0f};  // s, the copy's gamma at col_of(0), col_of(2)
#pragma unroll
    for (int h = 0; h < 2; h++)
        if (col_of(2 * h) < N) {
            if (FOLD) fold_s[h] = out.fold_s[col_of(2 * h)];
            if (residual && out.copy) copy_gamma[h] = out.copy_gamma[col_of(2 * h)];
        }
    float4 gamma[VPL];  // LN: gamma at this lane's float4s of a row (a weight: before the wait)
    if constexpr (LN)
#pragma unroll
        for (int i = 0; i < VPL; i++)
            gamma[i] = 32 * i + lane < K / 4 ? reinterpret_cast<const float4 *>(ln.gamma)[32 * i + lane]
                                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const RowTree tree = LN || FOLD ? row_tree<VPL>(K, lane) : RowTree{};  // the statistics' counts
    __syncthreads();  // the barriers are initialised
    pdl_wait();

    if constexpr (LN && CN == 1) {
        stage_ln_rows<RB, VPL, 1>(x_tiles, x_full, ln, gamma, tree, r0, M, K, 0, warp, lane, load_w_after_x);
        fence_proxy_async_smem();  // the generic proxy's stores, before the wgmmas read them
        __syncthreads();
        if (warp >= THREADS / 32) return;  // the second warpgroup only stages
    } else if constexpr (LN) {  // each block of the cluster stages RB / CN rows into every block's tile
        cluster_wait();         // every block has started
        stage_ln_rows<RB, VPL, CN>(x_tiles, x_full, ln, gamma, tree, r0, M, K, (int)(blockIdx.x % CN), warp,
                                    lane, load_w_after_x);
        // x_full's phase: every thread's arrival (release: its own rows' plain stores) and the other
        // ranks' rows, RB / CN of K bf16 each, by their bytes.
        if (tid == 0) mbar_arrive_expect_tx(x_full, (CN - 1) * (RB / CN) * K * (uint32_t)sizeof(bf16));
        else mbar_arrive(x_full);
        if (warp >= THREADS / 32) return;
        mbar_wait_cluster(x_full, 0);
        fence_proxy_async_smem();  // the generic proxy's stores (st_async's too), before the wgmmas read them
    } else {
        if (tid == 0) {
            mbar_arrive_expect_tx(x_full, slices ? per * RB * BK * 2 : 0);
            if (slices) tma_load_slices(x_tiles, &x_map, s0, r0, x_full);
            // The other ranks' statistics, RB / CN rows of them, by their bytes.
            if (FOLD) mbar_arrive_expect_tx(st_full, (CN - 1) * (RB / CN) * (uint32_t)sizeof(float2));
        }
        if constexpr (FOLD) {
            if (warp >= THREADS / 32) {  // the second warpgroup: the statistics, then it leaves
                fold_stats<RB, VPL, CN>(stats, st_full, ln, tree, r0, M, K, (int)(blockIdx.x % CN),
                                        warp - THREADS / 32, lane);
                mbar_arrive(st_full);
                return;
            }
            if constexpr (CN > 1) cluster_wait();  // the "started" phase, as every thread of the cluster
        }
    }
    // The residual's old values and the rows' shifts c, read while x lands (after the wait: earlier
    // kernels of the step write them).
    const bool shifted = (FOLD || (residual && out.copy)) && out.shift;
    float res[NV], row_c[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int t = row_of(i), f = col_of(i);
        res[i] = residual && t < M && f < N ? static_cast<const float *>(out.y)[t * out.ldy + f] : 0.0f;
        row_c[i] = shifted && t < M ? out.shift[t] : 0.0f;
    }

    // At 32 and 64 rows a tile, two accumulator sets, a slice's k16 MMAs alternately into each
    // (wgmma_slice_ss2): there the n32 / n64 MMAs' chain of latencies, not the tensor cores' rate,
    // is on the product's path (decode B = 32-64 +0.1-0.6% in A/B); at 16 rows one chain (two: B = 8
    // -0.3%; docs/PERF.md, "Session 53").
    WgmmaTile<RB, RB >= 32 ? 2 : 1> tile;
    tile.zero();
    mbar_wait(w_full, 0);
    trace_mark(TRACE_PHASE + 0);  // TRACE=1 builds (kernel_trace.cuh): W has landed
    if (!LN) mbar_wait(x_full, 0);
    trace_mark(TRACE_PHASE + 1);  // x has landed
    // All of W and x have landed, so every slice's MMAs go in one committed group: one fence before, one
    // commit after (a group a slice cost decode B = 16 0.6%, and made ptxas inject waits into the 16-row
    // split tiles). Unrolled by 2: decode B = 1 +1.5%, B = 8-16 +0.6-0.8% against the compiler's choice
    // (by 4); by 3 or 6 even, by 1 -3.5% (docs/PERF.md, "Session 57").
    tile.hold();
    wgmma_fence();
#pragma unroll 2
    for (int s = 0; s < slices; s++)
        tile.slice_in_group(w_tiles + (size_t)s * W_SLICE, x_tiles + (size_t)s * RB * BK * 2);
    wgmma_commit();
    wgmma_wait<0>();
    tile.hold();
    tile.sum();
    const auto &acc = tile.d;
    trace_mark(TRACE_PHASE + 2);  // the MMAs are done

    if constexpr (split) {
        cluster_wait();  // every block of the cluster has started
        // Rows (t..t+3, column c) of this block's partial tile to block c / CW's inbox, at column
        // kp CW + c % CW: to another block as an st_async counted on that block's in_full, to its
        // own by a plain store and this thread's arrival (release) on its own in_full. Thread 0's
        // arrival expects the other ranks' bytes, so the wait returns once every value is in.
        const bool even = lane % 2 == 0;
#pragma unroll
        for (int h = 0; h < 2; h++) {  // columns c and c + 8 (e = 2 h, 2 h + 1)
            const int c = 16 * warp + lane / 4 + 8 * h, q = c / CW;
            float *column = &inbox[(kp * CW + c % CW) * ISTR];
            const uint32_t remote = q == kp ? 0 : cluster_map(column, q), bar = q == kp ? 0 : cluster_map(in_full, q);
#pragma unroll
            for (int j = 0; j < J; j += 2) {
                const float s0 = even ? acc[j + 1][2 * h] : acc[j][2 * h];  // the pair the partner lane pushes
                const float s1 = even ? acc[j + 1][2 * h + 1] : acc[j][2 * h + 1];
                const float p0 = __shfl_xor_sync(0xffffffffu, s0, 1), p1 = __shfl_xor_sync(0xffffffffu, s1, 1);
                const float4 v = even ? make_float4(acc[j][2 * h], acc[j][2 * h + 1], p0, p1)
                                      : make_float4(p0, p1, acc[j + 1][2 * h], acc[j + 1][2 * h + 1]);
                const int t = even ? 8 * j + 2 * (lane % 4) : 8 * (j + 1) + 2 * (lane % 4 - 1);  // v's first row
                if (q == kp) *reinterpret_cast<float4 *>(column + t) = v;
                else st_async(remote + 4 * t, v, bar);
            }
        }
        if (tid == 0) mbar_arrive_expect_tx(in_full, (KS - 1) * RB * CW * (uint32_t)sizeof(float));
        else mbar_arrive(in_full);
        mbar_wait_cluster(in_full, 0);
    }
    if constexpr (FOLD) mbar_wait_cluster(st_full, 0);  // every row's statistics
    trace_mark(TRACE_PHASE + 3);  // the epilogue starts (K split: the partial sums have arrived)
    // Every value first, then the stores: with each value's chain inside its own bounds check, the
    // chains ran one after another (a GELU's ~150 cycles each, ~1.2 us for 16 values a thread with
    // one warp a scheduler to hide them; docs/PERF.md, "Session 37").
    float v[NV];
    if constexpr (split) {  // rows and columns past M and N are still inside the tile and the inbox
        constexpr int VW = NV % 4 == 0 ? 4 : 1;  // floats a read: 16 bytes where the rows allow
        const float *p = &inbox[(col_of(0) - f0 - kp * CW) * ISTR + row_of(0) - r0];  // rank 0's partial of value 0
#pragma unroll
        for (int i = 0; i < NV; i++) v[i] = 0.0f;
#pragma unroll
        for (int r = 0; r < KS; r++) {
            const float *pr = p + r * CW * ISTR;  // rank r's
#pragma unroll
            for (int i = 0; i < NV; i += VW) {
                if constexpr (VW == 4) {
                    const float4 w = *reinterpret_cast<const float4 *>(pr + i);
                    v[i] += w.x, v[i + 1] += w.y, v[i + 2] += w.z, v[i + 3] += w.w;
                } else {
                    v[i] += pr[i];
                }
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < NV; i++) v[i] = acc[i / 4][i % 4];
    }
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int t = row_of(i), h = split ? 0 : (i >> 1) & 1;
        if constexpr (FOLD) {  // W (gamma (x - mean)) = W copy - (mean - c) s, times rstd
            const float2 st = stats[t - r0];
            v[i] = st.y * (v[i] - (st.x - row_c[i]) * fold_s[h]);
        }
        v[i] += bias[h];
        if (EPI == MATMUL_LT_BIAS_GELU) v[i] = gelu_tanh(v[i]);
        if (residual) v[i] += res[i];
    }
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int t = row_of(i), f = col_of(i);
        if (t < M && f < N) static_cast<YT *>(out.y)[t * out.ldy + f] = from_f32<YT>(v[i]);
    }
    if (residual && out.copy)  // the next LayerNorm's copy of the new rows, N apart
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int t = row_of(i), f = col_of(i);
            if (t < M && f < N)
                out.copy[t * N + f] = __float2bfloat16((v[i] - row_c[i]) * copy_gamma[split ? 0 : (i >> 1) & 1]);
        }
    if (FOLD && out.mean_out && blockIdx.x == 0 && tid < RB && r0 + tid < M) out.mean_out[r0 + tid] = stats[tid].x;
}

// ----------------------------------------------------------------------------
// Host side: tile choice, tensor maps, launch

// The kernel's shared memory allowed up to smem (per instantiation: the largest so far).
template <int RB, int EPI, int KS, int SRC, int VPL, int CN> cudaError_t allow(size_t smem) {
    static size_t smem_set;
    if (smem <= smem_set) return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(rows_kernel<RB, EPI, KS, SRC, VPL, CN>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess) smem_set = smem;
    return e;
}

// x's map is for bf16 x (gemm_rows; gemm_rows_fold's copy); gemm_rows_ln's x comes in ln and its map
// is left empty.
template <int RB, int EPI, int KS, int SRC, int VPL = 1, int CN = 1>
cudaError_t launch(const Out &out, const void *x, const LnIn &ln, const void *W, int M, int N, int K,
                   cudaStream_t stream) {
    CUtensorMap x_map = {}, w_map;
    const int per = part_slices(K, KS);
    if ((SRC != SRC_LN && !tensor_map_slices(&x_map, x, M, K, K, RB, per)) ||
        !tensor_map_slices(&w_map, W, N, K, K, BF, per))
        return cudaErrorInvalidValue;
    const size_t smem = smem_bytes(K, RB, KS, SRC);
    const cudaError_t e = allow<RB, EPI, KS, SRC, VPL, CN>(smem);
    if (e != cudaSuccess) return e;
    const dim3 grid(((N + BF - 1) / BF + CN - 1) / CN * CN * KS, (M + RB - 1) / RB);
    return launch_pdl_cluster(rows_kernel<RB, EPI, KS, SRC, VPL, CN>, grid, dim3(SRC != SRC_X ? LN_THREADS : THREADS),
                              smem, KS * CN, stream, x_map, w_map, ln, out, M, N, K);
}

template <int RB, int EPI>
cudaError_t launch_split(int ks, const Out &out, const void *x, const void *W, int M, int N, int K,
                         cudaStream_t stream) {
    const LnIn none = {};
    switch (ks) {
    case 1: return launch<RB, EPI, 1, SRC_X>(out, x, none, W, M, N, K, stream);
    case 2: return launch<RB, EPI, 2, SRC_X>(out, x, none, W, M, N, K, stream);
    case 4: return launch<RB, EPI, 4, SRC_X>(out, x, none, W, M, N, K, stream);
    default: return launch<RB, EPI, 8, SRC_X>(out, x, none, W, M, N, K, stream);
    }
}

template <int EPI>
cudaError_t launch_rows(int rb, int ks, const Out &out, const void *x, const void *W, int M, int N, int K,
                        cudaStream_t stream) {
    switch (rb) {
    case 16: return launch_split<16, EPI>(ks, out, x, W, M, N, K, stream);
    case 32: return launch_split<32, EPI>(ks, out, x, W, M, N, K, stream);
    default: return launch_split<64, EPI>(ks, out, x, W, M, N, K, stream);
    }
}

// A knob read once from the environment (the engine asks at every product): its value, or 0.
int env_knob(const char *name, int *cache) {
    if (*cache < 0) *cache = getenv(name) ? atoi(getenv(name)) : 0;
    return *cache;
}

bool fits(int K, int rb, int ks) {
    return smem_bytes(K, rb, ks) <= (size_t)device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(0);
}

// The blocks of the grid for M rows of N columns, rb rows a block and K over ks blocks.
long long grid_blocks(int M, int N, int rb, int ks) { return (long long)(N + BF - 1) / BF * ((M + rb - 1) / rb) * ks; }

// 1 when that grid is one wave of blocks (one an SM).
bool one_wave(int M, int N, int rb, int ks) {
    return grid_blocks(M, N, rb, ks) <= device_attr<cudaDevAttrMultiProcessorCount>(0);
}

// The blocks K splits over: the fewest whose part of the W tile fits, and with 32 or 64 rows a
// block twice that where the grid still takes at most 3/4 of the SMs. There a tile's MMAs are the
// block's longest phase, and more blocks shorten it for one more rank's 16-byte pushes; past 3/4
// the next kernel's blocks find no SMs to become resident on before the release. On an H200
// (docs/PERF.md, "Session 55"): 124M's MLP projection over 8 blocks rather than 4 (96 blocks) took
// decode B = 24-64 +1.0-2.1%, and its attention projection over 2 rather than whole (24-48 blocks)
// B = 24-48 +2.2-3.0% more, B = 64 +0.5%; on 355M the rule gave B = 32-64 +1-5%, where its MLP
// projection over 8 (128 blocks of 132) lost 7-8%. With 16 rows a block (B = 1-16) both 124M
// splits lost 1-4%. "Session 22" had measured splitting a whole K as a loss, before the exchange's
// pushes were 16 bytes. GPT2_ROWS_SPLIT=1|2|4|8 forces one where it fits.
int pick_split(int M, int N, int K, int rb) {
    static int forced = -1;
    const int f = env_knob("GPT2_ROWS_SPLIT", &forced);
    if ((f == 1 || f == 2 || f == 4 || f == 8) && fits(K, rb, f)) return f;
    int ks = 1;
    while (ks < MAX_SPLIT && !fits(K, rb, ks)) ks *= 2;
    const long long sms = device_attr<cudaDevAttrMultiProcessorCount>(0);
    if (rb >= 32 && ks < MAX_SPLIT && fits(K, rb, 2 * ks) && 4 * grid_blocks(M, N, rb, 2 * ks) <= 3 * sms) ks *= 2;
    return ks;
}

// Rows a block: 16 to 16 rows, 32 to 32, and past 32 rows 32 where K is whole (two row blocks at
// 64: half of x's bytes after the wait, for twice the W reads before it) but 64 where K splits (a
// split tile's exchange costs the same for 64 rows as for 32). Measured in
// docs/PERF.md, "Session 21" and "Session 22": at 48-64 rows, K whole, 64 a block is within 2% for
// qkv and fc and 14-20% slower for the projection, 16 a block 1.6x slower for fc; the MLP projection
// (K = 3072 over 4 blocks) 4.71 / 5.04 us at 48 / 64 rows with 64 a block, 5.18 / 5.42 with 32.
// 16 a block past 16 rows, where that grid is still one wave, gained fc nothing (-1 to -3% at 32-48
// rows, "Session 29").
// Past 64 rows (a prompt's products) 64 a block where 32 would take more than one wave: the wave
// rule below then still lets 124M's products take gemm_rows to 128 rows and its attention
// projection to 704 (docs/PERF.md, "Session 31").
// GPT2_ROWS_TILE=16|32|64 forces one.
int pick_rows(int M, int N, int K) {
    static int forced = -1;
    const int rb = env_knob("GPT2_ROWS_TILE", &forced);
    if (rb == 16 || rb == 32 || rb == 64) return rb;
    if (M <= 16) return 16;
    if (M > 64) {
        const int ks32 = pick_split(M, N, K, 32), ks64 = pick_split(M, N, K, 64);
        if (!one_wave(M, N, 32, ks32) && fits(K, 64, ks64)) return 64;
    }
    return M <= 32 || fits(K, 32, 1) ? 32 : 64;
}

// gemm_rows_ln's rows a block: 16, or 32 past 16 rows (four rows a warp of the two warpgroups).
int pick_ln_rows(int M) { return M <= 16 ? 16 : 32; }

// gemm_rows_ln's W before the PDL wait, or after the block's loads of x: after past 32 rows. There
// the grid has two row tiles (each W tile read by two blocks) over 96-128 of the SMs, so a call's
// blocks become resident mostly as the previous kernel's leave and W's copy, issued first, only
// delays x's loads behind its bytes (the rows staged ~3.6 us after the release, against ~2.3 with
// W after them). On an H200, 1024 -> 4096 at 48 / 64 rows 7.09 / 7.29 -> 6.62 / 6.57 us, 768 -> 3072
// 4.93 / 5.13 -> 4.79 / 4.82; at 32 rows (one row tile, 48-64 blocks, resident early) 1024 -> 4096
// went 5.21 -> 5.82 (docs/PERF.md, "Session 37").
int pick_w_after_x(int M) { return M > 32; }

// gemm_rows_ln's cluster along the columns: CN blocks side by side, each normalising RB / CN of the
// rows into all CN blocks' x tiles, so that each row is read from L2 and normalised once per CN
// column blocks (fp32 rows: at 64 rows of K = 768 the 96 blocks of one block a cluster read 9.4 MB
// of them). CN = 4 where the grid's clusters of 4 all fit on the device at once, else 2 where those
// do, else 1; at 1-16 rows of K <= 768 at most 2. Since the staged rows go by st_async (no cluster
// fence or barrier after them) a cluster pays at every row count. On an H200 (docs/PERF.md,
// "Session 38"), us with CN = 1 / 2 / 4: 768 -> 3072 at 1 / 2 / 16 rows 2.82 / 2.84 / 2.99, 3.07 /
// 2.85 / 3.02, 3.57 / 3.15 / 3.29; 1024 -> 4096 at 1 / 2 / 16 rows 3.98 / 3.56 / 3.48, 4.40 / 3.60 /
// 3.56, 4.98 / 4.16 / 3.80; past 16 rows 768 -> 3072 at 32 / 64 rows 5.77 / 6.57 us -> 5.29 / 5.84
// with 4 ("Session 35"). In the engine (124M) 2 at 1-16 rows against none: decode B = 1 +2.0%,
// B = 2-16 +2.8-4.6% (355M's 4 at one row: B = 1 +5.3%).
// GPT2_LN_CLUSTER=2|4 forces that cluster where it fits (else none), any other non-zero value none.
bool ln_cluster4_pays(int M, int K) { return M > 16 || K > 768; }

// 1 when the grid's clusters of CN blocks along the columns (gemm_rows_ln's, gemm_rows_fold's) all
// fit on the device at once.
template <int RB, int EPI, int SRC, int VPL, int CN>
bool clusters_fit(int M, int N, int K) {
    if (CN == 1) return true;
    const size_t smem = smem_bytes(K, RB, 1, SRC);
    if (allow<RB, EPI, 1, SRC, VPL, CN>(smem) != cudaSuccess) return false;
    static size_t asked_smem;
    static int clusters;
    if (asked_smem != smem) {
        clusters = max_active_clusters(reinterpret_cast<const void *>(rows_kernel<RB, EPI, 1, SRC, VPL, CN>), CN,
                                       LN_THREADS, smem);
        asked_smem = smem;
    }
    return (long long)((N + BF - 1) / BF + CN - 1) / CN * ((M + RB - 1) / RB) <= clusters;
}

template <int EPI, int VPL, int RB>
cudaError_t launch_ln_cn(const Out &out, const LnIn &ln, const void *W, int M, int N, int K, cudaStream_t stream) {
    static int forced = -1;
    const int cn = env_knob("GPT2_LN_CLUSTER", &forced);
    if ((cn == 4 || (cn == 0 && ln_cluster4_pays(M, K))) && clusters_fit<RB, EPI, SRC_LN, VPL, 4>(M, N, K))
        return launch<RB, EPI, 1, SRC_LN, VPL, 4>(out, NULL, ln, W, M, N, K, stream);
    if ((cn == 2 || cn == 0) && clusters_fit<RB, EPI, SRC_LN, VPL, 2>(M, N, K))
        return launch<RB, EPI, 1, SRC_LN, VPL, 2>(out, NULL, ln, W, M, N, K, stream);
    return launch<RB, EPI, 1, SRC_LN, VPL, 1>(out, NULL, ln, W, M, N, K, stream);
}

template <int EPI, int VPL>
cudaError_t launch_ln_rows(int rb, const Out &out, const LnIn &ln, const void *W, int M, int N, int K,
                           cudaStream_t stream) {
    return rb == 16 ? launch_ln_cn<EPI, VPL, 16>(out, ln, W, M, N, K, stream)
                    : launch_ln_cn<EPI, VPL, 32>(out, ln, W, M, N, K, stream);
}

template <int EPI>
cudaError_t launch_ln(int rb, const Out &out, const LnIn &ln, const void *W, int M, int N, int K, cudaStream_t stream) {
    return with_vpl<LN_MAX_K>(
        K, [&](auto vpl) { return launch_ln_rows<EPI, vpl.value>(rb, out, ln, W, M, N, K, stream); });
}

// gemm_rows_fold's tile and cluster: 32 rows a block (64 lost 14-25% at 64 rows), and clusters of 8
// blocks along the columns where the grid's all fit on the device at once, else of 4, else it does
// not take the product. On an H200 at decode B = 64 (124M), against the LayerNorm kernel and
// gemm_rows: 8 +4.5% (B = 32 +6.8%), 4 +1.8-4%, 2 and 1 lost (docs/PERF.md, "Session 49": a block's
// statistics are RB / CN rows, each read from L2 once per CN column blocks). The cluster is asked
// of the GELU instantiation for both epilogues (the same shared memory and threads).
constexpr int FOLD_ROWS = 32;

bool fold_fits(int K) {
    return smem_bytes(K, FOLD_ROWS, 1, SRC_FOLD) <= (size_t)device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(0);
}

template <int VPL> int fold_cluster_vpl(int M, int N, int K) {
    if (clusters_fit<FOLD_ROWS, MATMUL_LT_BIAS_GELU, SRC_FOLD, VPL, 8>(M, N, K)) return 8;
    if (clusters_fit<FOLD_ROWS, MATMUL_LT_BIAS_GELU, SRC_FOLD, VPL, 4>(M, N, K)) return 4;
    return 0;
}

int fold_cluster(int M, int N, int K) {
    return with_vpl<FOLD_MAX_K>(K, [&](auto vpl) { return fold_cluster_vpl<vpl.value>(M, N, K); });
}

template <int EPI, int VPL>
cudaError_t launch_fold_vpl(int cn, const Out &out, const void *copy, const LnIn &x, const void *W, int M, int N,
                            int K, cudaStream_t stream) {
    return cn == 8 ? launch<FOLD_ROWS, EPI, 1, SRC_FOLD, VPL, 8>(out, copy, x, W, M, N, K, stream)
                   : launch<FOLD_ROWS, EPI, 1, SRC_FOLD, VPL, 4>(out, copy, x, W, M, N, K, stream);
}

template <int EPI>
cudaError_t launch_fold(int cn, const Out &out, const void *copy, const LnIn &x, const void *W, int M, int N, int K,
                        cudaStream_t stream) {
    return with_vpl<FOLD_MAX_K>(
        K, [&](auto vpl) { return launch_fold_vpl<EPI, vpl.value>(cn, out, copy, x, W, M, N, K, stream); });
}

}  // namespace

extern "C" int gemm_rows_available(void) {
    static int off = -1;
    if (off < 0) off = env_off("GPT2_GEMM_ROWS");
    return !off && tma_wgmma_runs();
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
    const int rb = pick_rows(M, N, K), ks = pick_split(M, N, K, rb);
    return fits(K, rb, ks) && wave_rule(M, N, rb, ks);
}

// gemm_rows_ex, and with the LayerNorm fold's copy (the residual epilogue): gemm_rows_residual_copy.
static cudaError_t run_rows(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                            const void *bias, int M, int N, int K, int rb, int ks, const GemmRowsCopy *copy,
                            cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || ldy < N || !y || !x || !W || (epilogue != MATMUL_LT_NONE && !bias) ||
        epilogue < MATMUL_LT_NONE || epilogue > MATMUL_LT_BIAS_GELU || (rb && rb != 16 && rb != 32 && rb != 64) ||
        (ks && ks != 1 && ks != 2 && ks != 4 && ks != 8))
        return cudaErrorInvalidValue;
    if (!rb) rb = pick_rows(M, N, K);
    if (!gemm_rows_available() || M > GEMM_ROWS_MAX_ROWS || K % BK || (uintptr_t)x % 16 || (uintptr_t)W % 16)
        return cudaErrorNotSupported;
    if (!ks) ks = pick_split(M, N, K, rb);
    if (!fits(K, rb, ks)) return cudaErrorNotSupported;
    if (M == 0) return cudaSuccess;
    Out out = {};
    out.y = y, out.ldy = ldy, out.bias = bias;
    if (copy) out.copy = static_cast<bf16 *>(copy->copy), out.copy_gamma = copy->gamma, out.shift = copy->shift;
    switch (epilogue) {
    case MATMUL_LT_NONE: return launch_rows<MATMUL_LT_NONE>(rb, ks, out, x, W, M, N, K, stream);
    case MATMUL_LT_BIAS: return launch_rows<MATMUL_LT_BIAS>(rb, ks, out, x, W, M, N, K, stream);
    case MATMUL_LT_BIAS_RESIDUAL: return launch_rows<MATMUL_LT_BIAS_RESIDUAL>(rb, ks, out, x, W, M, N, K, stream);
    default: return launch_rows<MATMUL_LT_BIAS_GELU>(rb, ks, out, x, W, M, N, K, stream);
    }
}

extern "C" cudaError_t gemm_rows_ex(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                                    const void *bias, int M, int N, int K, int rb, int ks, cudaStream_t stream) {
    return run_rows(epilogue, y, ldy, x, W, bias, M, N, K, rb, ks, NULL, stream);
}

extern "C" cudaError_t gemm_rows(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                                 const void *bias, int M, int N, int K, cudaStream_t stream) {
    return gemm_rows_ex(epilogue, y, ldy, x, W, bias, M, N, K, 0, 0, stream);
}

extern "C" int gemm_rows_ln_takes(int M, int N, int K) {
    return gemm_rows_available() && M >= 0 && M <= GEMM_ROWS_LN_MAX_ROWS && N > 0 && K > 0 && K % BK == 0 &&
           K <= LN_MAX_K && fits(K, pick_ln_rows(M), 1);
}

extern "C" cudaError_t gemm_rows_ln(MatmulLtEpilogue epilogue, void *y, long long ldy, const float *x, long long ldx,
                                    const float *gamma, const void *W, const float *b_folded, int M, int N, int K,
                                    cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || ldy < N || ldx < K || !y || !x || !gamma || !W ||
        (epilogue != MATMUL_LT_BIAS && epilogue != MATMUL_LT_BIAS_GELU))
        return cudaErrorInvalidValue;
    if (!gemm_rows_ln_takes(M, N, K) || ldx % 4 || (uintptr_t)x % 16 || (uintptr_t)gamma % 16 || (uintptr_t)W % 16)
        return cudaErrorNotSupported;
    if (M == 0) return cudaSuccess;
    Out out = {};
    out.y = y, out.ldy = ldy, out.bias = b_folded;
    const LnIn ln = {x, ldx, gamma, pick_w_after_x(M)};
    const int rb = pick_ln_rows(M);
    return epilogue == MATMUL_LT_BIAS ? launch_ln<MATMUL_LT_BIAS>(rb, out, ln, W, M, N, K, stream)
                                      : launch_ln<MATMUL_LT_BIAS_GELU>(rb, out, ln, W, M, N, K, stream);
}

// ----------------------------------------------------------------------------
// The LayerNorm fold (gemm_rows.h)

extern "C" cudaError_t gemm_rows_residual_copy(float *y, long long ldy, const void *x, const void *W, const void *bias,
                                               int M, int N, int K, const GemmRowsCopy *copy, cudaStream_t stream) {
    if (!copy || !copy->copy || !copy->gamma) return cudaErrorInvalidValue;
    return run_rows(MATMUL_LT_BIAS_RESIDUAL, y, ldy, x, W, bias, M, N, K, 0, 0, copy, stream);
}

extern "C" int gemm_rows_fold_takes(int M, int N, int K) {
    return gemm_rows_available() && M >= 0 && M <= GEMM_ROWS_FOLD_MAX_ROWS && N > 0 && K > 0 && K % BK == 0 &&
           K <= FOLD_MAX_K && fold_fits(K) && fold_cluster(M, N, K) > 0;
}

extern "C" cudaError_t gemm_rows_fold(MatmulLtEpilogue epilogue, void *y, long long ldy, const GemmRowsFold *in,
                                      const void *W, const float *s, const float *b_folded, int M, int N, int K,
                                      cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || ldy < N || !y || !in || !in->x || in->ldx < K || !in->copy || !s || !W ||
        (in->shift && in->shift == in->mean_out) || (epilogue != MATMUL_LT_BIAS && epilogue != MATMUL_LT_BIAS_GELU))
        return cudaErrorInvalidValue;
    if (!gemm_rows_fold_takes(M, N, K) || in->ldx % 4 || (uintptr_t)in->x % 16 || (uintptr_t)in->copy % 16 ||
        (uintptr_t)W % 16)
        return cudaErrorNotSupported;
    if (M == 0) return cudaSuccess;
    Out out = {};
    out.y = y, out.ldy = ldy, out.bias = b_folded, out.fold_s = s, out.shift = in->shift, out.mean_out = in->mean_out;
    const LnIn x = {in->x, in->ldx, NULL, 0};
    const int cn = fold_cluster(M, N, K);
    return epilogue == MATMUL_LT_BIAS ? launch_fold<MATMUL_LT_BIAS>(cn, out, in->copy, x, W, M, N, K, stream)
                                      : launch_fold<MATMUL_LT_BIAS_GELU>(cn, out, in->copy, x, W, M, N, K, stream);
}
