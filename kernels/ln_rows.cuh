// A few rows of fp32 x normalised by the blocks of a Hopper product into the bf16 x tiles its wgmmas
// read: the LayerNorm inside the product, with no LayerNorm kernel and no boundary before it.
// gemm_rows_ln (gemm_rows.cu: a layer's qkv and fc at 1-16 rows, shared over a cluster),
// gemm_rows_fold's statistics (gemm_rows.cu) and logits_rows_ln (logits_rows.cu: the final
// LayerNorm inside the logits) share it.
//
// A lane holds float4 i of a row at k = 4 (32 i + lane), VPL of them (2, 6 or 8: rows of
// K <= 128 VPL, so K <= 1024), so one L2 round trip brings a warp's rows whole; lanes past the row
// and rows past M hold zeros. The x tiles are K/64 slices of RB rows x 64 k (RB x 128 bytes each)
// under the 128-byte swizzle (16-byte chunk c of row t at chunk c ^ (t % 8)), as TMA would land
// bf16 x there.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "cluster.cuh"
#include "kernel_util.h"

namespace ln_rows {

constexpr int SLICE_K = 64;  // k per x tile: one 128-byte swizzled row of bf16
constexpr int MAX_K = 1024;
constexpr float EPS = 1e-5f;
constexpr int vpl(int K) { return K <= 256 ? 2 : K <= 768 ? 6 : 8; }

// f(std::integral_constant<int, VPL>) for K's VPL: the one place the run-time K picks an
// instantiation.
template <typename F> auto with_vpl(int K, F &&f) {
    switch (vpl(K)) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 6: return f(std::integral_constant<int, 6>{});
    default: return f(std::integral_constant<int, 8>{});
    }
}

// gamma at this lane's float4s of a row (a weight: load it before the PDL wait).
template <int VPL>
__device__ __forceinline__ void load_gamma(float4 (&g)[VPL], const float *gamma, int K, int lane) {
#pragma unroll
    for (int i = 0; i < VPL; i++)
        g[i] = 32 * i + lane < K / 4 ? reinterpret_cast<const float4 *>(gamma)[32 * i + lane]
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// Rows t0.. t0 + RR - 1 of x (fp32, rows ldx floats apart) into a warp's registers.
template <int RR, int VPL>
__device__ __forceinline__ void load_rows(float4 (&v)[RR][VPL], const float *x, long long ldx, int t0, int M, int K,
                                          int lane) {
#pragma unroll
    for (int j = 0; j < RR; j++) {
        const int t = t0 + j;
        const float4 *row = reinterpret_cast<const float4 *>(x + (long long)min(t, M - 1) * ldx);
#pragma unroll
        for (int i = 0; i < VPL; i++)
            v[j][i] = t < M && 32 * i + lane < K / 4 ? row[32 * i + lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// Exact two-pass statistics of each row, reduced by shuffles: its mean, and rstd = 1 / sqrt(var + eps).
template <int RR, int VPL>
__device__ __forceinline__ void row_stats(const float4 (&v)[RR][VPL], float (&mean)[RR], float (&rstd)[RR], int K,
                                          int lane) {
    const float inv_k = 1.0f / K;
#pragma unroll
    for (int j = 0; j < RR; j++) {
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < VPL; i++) a += (v[j][i].x + v[j][i].y) + (v[j][i].z + v[j][i].w);
        mean[j] = warp_sum(a) * inv_k;
    }
#pragma unroll
    for (int j = 0; j < RR; j++) {
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < VPL; i++) {
            const float m = 32 * i + lane < K / 4 ? mean[j] : 0.0f;  // the lanes past the row hold zeros
            const float dx = v[j][i].x - m, dy = v[j][i].y - m, dz = v[j][i].z - m, dw = v[j][i].w - m;
            a += (dx * dx + dy * dy) + (dz * dz + dw * dw);
        }
        rstd[j] = rsqrtf(warp_sum(a) * inv_k + EPS);
    }
}

// x's RB rows (from r0) into the x tiles as wgmma reads them, by WARPS warps (warp < WARPS). In a
// cluster of CN blocks along the columns (the same rows, CN column tiles) block `rank` stages the
// tile's rows rank RB / CN.. and stores each into all CN blocks' tiles: its own by plain stores, the
// others by st_async, whose bytes count on their `bar` (an mbarrier at the same offset in each), so
// a block waits on its own barrier for its tile, with no cluster fence or barrier (docs/PERF.md,
// "Session 38"). The warps take RB / CN / WARPS rows each (where fewer, the first RB / CN warps one
// each), up to four at a time (load_rows, row_stats), then gamma (x - mean) rstd rounded to bf16,
// rows past M as zeros. beta is not applied: the caller adds W beta (ln_fold.cu's vectors) in its
// epilogue, since W (LayerNorm(x) - beta) + W beta = W LayerNorm(x).
// Straight-line code, the lanes past the row masked by selects: a warp runs this with little to
// hide its latencies but its rows' independent chains and the scheduler's other warp; a branch a
// value (the first version) cost ~3 us, and one warpgroup taking 32 rows in two rounds ~2.7 us
// more than 16 rows in one (docs/PERF.md, "Session 34").
// Before the wgmmas read the tiles: fence_proxy_async_smem() (wgmma.cuh) and a barrier, or in a
// cluster the wait on `bar` and then the fence. after_loads() is called once, as soon as the warp's
// first round of loads is issued.
template <int RB, int VPL, int CN, int WARPS, typename AfterLoads>
__device__ __forceinline__ void stage(unsigned char *x_tiles, uint64_t *bar, const float *x, long long ldx,
                                      const float4 (&g)[VPL], int r0, int M, int K, int rank, int warp, int lane,
                                      AfterLoads after_loads) {
    constexpr int RBB = RB / CN;  // the tile's rows this block stages: rank RBB..
    constexpr int RPW = RBB > WARPS ? RBB / WARPS : 1, RR = RPW < 4 ? RPW : 4;  // rows a warp, a round
    if (warp * RPW >= RBB) return after_loads();
    uint32_t tile_in[CN], bar_in[CN];  // CN > 1: x_tiles and bar in each block (shared::cluster addresses)
#pragma unroll
    for (int q = 0; q < CN; q++) {
        tile_in[q] = CN > 1 ? cluster_map(x_tiles, q) : 0;
        bar_in[q] = CN > 1 ? cluster_map(bar, q) : 0;
    }
    const int nq = K / 4;  // float4s a row
    // Lane's float4 i lands in k slice 2 i + lane / 16, 16-byte chunk (lane % 16) / 2, half lane % 2.
    unsigned char *lane_at = x_tiles + (lane / 16) * RB * SLICE_K * 2 + (lane & 1) * 8;
    const int chunk = (lane % 16) / 2;
#pragma unroll 1
    for (int rr = 0; rr < RPW; rr += RR) {
        float4 v[RR][VPL];
        load_rows<RR, VPL>(v, x, ldx, r0 + rank * RBB + warp * RPW + rr, M, K, lane);
        if (rr == 0) after_loads();
        float mean[RR], rstd[RR];
        row_stats<RR, VPL>(v, mean, rstd, K, lane);
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
                unsigned char *to = at + (size_t)i * 2 * RB * SLICE_K * 2;
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

}  // namespace ln_rows
