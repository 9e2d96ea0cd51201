// SCRATCH session 63 probe (not built by the Makefile; written without a GPU, for session 64's first call):
// a persistent gemm_tiles for the 8 x 1024 forward's 8,192 rows, BIAS only (bf16 y = x W^T + b), against
// cuBLASLt, for GPT-2 124M's four product shapes (docs/PERF.md, next step 8, counts the bytes and waves):
//   - a block loops over 128 x BN tiles (a static schedule: unit = first + i * stride, row tiles fastest,
//     so the blocks running at once share W's column tile);
//   - the ring's phases run on across tiles (g counts the block's slices), so the producer fills the
//     next tile's stages while the consumers finish this one's epilogue, staged in shared memory of its
//     own (not the ring, as gemm_tiles.cu's is);
//   - MC: clusters of two blocks on neighbouring row tiles of one column tile, each loading half of W's
//     BN rows for both (multicast): W's share of the L2 traffic halves. A stage is free when both
//     blocks' consumers are done with it: each consumer warp arrives on both blocks' empty barrier.
//   - PP ("ping-pong"): the two consumer warpgroups take alternate tiles, 128 rows each, so that one's
//     epilogue overlaps the other's MMAs (without PP both multiply each tile, 64 rows each, and both
//     stop their MMAs for its epilogue).
// Build and run: scratch/s64a.sh.
#include <algorithm>
#include <cuda_bf16.h>
#include <functional>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string>
#include <type_traits>
#include <string.h>
#include <vector>

#include "cluster.cuh"
#include "kernel_util.h"
#include "matmul_lt.h"
#include "reference_kernels.h"
#include "tma.cuh"
#include "wgmma.cuh"

#define WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#define WGMMA_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#include "probe_wgmma_wide2.inc"  // wgmma_ss<128>, wgmma_ss<256>

#define CK(...)                                                                                           \
    do {                                                                                                  \
        cudaError_t e_ = (__VA_ARGS__);                                                                   \
        if (e_ != cudaSuccess) {                                                                          \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #__VA_ARGS__, cudaGetErrorString(e_)); \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

constexpr int BM = 128, BK = 64, THREADS = 384;

__device__ __forceinline__ void regs_producer() { asm volatile("setmaxnreg.dec.sync.aligned.u32 88;\n"); }
__device__ __forceinline__ void regs_consumer() { asm volatile("setmaxnreg.inc.sync.aligned.u32 208;\n"); }
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The box at (k, row) into the same offset of every block of the cluster in mask, each block's barrier at
// bar's offset counting the bytes.
__device__ __forceinline__ void tma_load_mc(void *dst, const CUtensorMap *map, int k, int row, uint64_t *bar,
                                            uint16_t mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(smem_addr(bar)), "h"(mask)
        : "memory");
}
__device__ __forceinline__ void mbar_arrive_rank(uint64_t *bar, int rank) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_map(bar, rank))
                 : "memory");
}

// EPI: 0 the warpgroup's rows staged at once, 1 64 rows at a time, 2 no staging (bf16x2 stores from registers),
// 3 staged swizzled (128-byte rows of 64 columns a box) and out by TMA stores, not waited for until the next tile
// One test of the barrier's phase (mbar_wait without the loop).
__device__ __forceinline__ bool mbar_try(uint64_t *bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
    return done != 0;
}
__device__ __forceinline__ uint64_t policy_evict_first() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
__device__ __forceinline__ uint64_t policy_evict_last() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
__device__ __forceinline__ void tma_load_hint(void *dst, const CUtensorMap *map, int k, int row, uint64_t *bar,
                                              uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(smem_addr(bar)), "l"(policy)
        : "memory");
}
// One 64-column box of a staged tile out by TMA (its own bulk group), with an L2 policy or without.
template <bool HINTED>
__device__ __forceinline__ void tma_store_box(const CUtensorMap *map, const void *src, int col, int row, uint64_t policy) {
    if (HINTED)
        asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%1, %2}], [%3], %4;\n"
                     "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row),
                     "r"(smem_addr(src)), "l"(policy)
                     : "memory");
    else
        asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                     "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row),
                     "r"(smem_addr(src))
                     : "memory");
}

// The LayerNorm fold's inputs (gemm_tiles.cu's): each row's nparts (sum, M2) parts and the copy's shift c,
// the columns' s = W gamma; the bias is b'.
struct FoldArgs {
    const float2 *parts;
    const float *shift, *s;
    int nparts;
};

template <int BN, int STAGES, bool PP, int EPI = 0> struct Layout {
    static constexpr int X_BYTES = BM * BK * 2, W_BYTES = BN * BK * 2, STAGE = X_BYTES + W_BYTES;
    static constexpr int LD = BN + 8;  // staged bf16 rows: 16 bytes past a multiple of 128, no bank conflicts
    static constexpr int ROWS = PP ? 128 : 64;      // a warpgroup's rows of a tile
    static constexpr int STAGED = EPI == 0 ? ROWS : EPI == 1 ? 64 : 0;  // rows staged at once (EPI 4: no stores)
    static constexpr int EPI_BYTES = EPI >= 5 || EPI == 3 ? ROWS * BN * 2 : STAGED * LD * 2;  // a warpgroup's staging
    static constexpr size_t FOLD_BYTES = 2 * (2 * BM + 2 * BN) * 4;  // FOLD: two tiles' rstd, (mean - c) rstd, b', s
    static constexpr size_t RING = (size_t)STAGES * STAGE, SMEM = 1024 + RING + 2 * EPI_BYTES + 256 + FOLD_BYTES;
    static_assert(STAGE % 1024 == 0 && X_BYTES % 1024 == 0 && (BN / 2 * 128) % 1024 == 0, "swizzle atoms");
    static_assert(SMEM <= 227 * 1024, "shared memory");
    static_assert(EPI_BYTES % 1024 == 0 || (EPI != 3 && EPI < 5), "swizzle atoms");
};

// HINT: L2 eviction hints, bit 0 evict_first on y's TMA stores, bit 1 evict_last on x's loads, bit 2 on W's
// FDIAG (FOLD, diagnostics for session 65): 1 no statistics computed and no waits (the vectors as the
// warps left them once), 2 computed but the consumers do not wait for them (racy), 3 the statistics
// warps' waits back off with nanosleep (correct), 4 no statistics warps: each consumer quad takes its row's
// statistics from the parts it loaded at the tile's start, and the tile's b' and s go through shared memory
// (correct)
template <int BN, int STAGES, bool MC, bool PP, bool MCAST, int EPI, bool RES, bool KK_OUTER, bool ACC2, int HINT,
          int SPLIT, bool FOLD, int FDIAG>
__global__ void __launch_bounds__(THREADS, 1)
    persist_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                   const __grid_constant__ CUtensorMap y_map, bf16 *y, float *yres,
                   const float *bias, int M, int N, int K, FoldArgs fa) {
    typedef Layout<BN, STAGES, PP, EPI> L;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    bf16 *staging = reinterpret_cast<bf16 *>(smem + L::RING);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + L::RING + 2 * L::EPI_BYTES), *empty = full + STAGES,
             *order = empty + STAGES, *stat_full = order + 2, *stat_empty = stat_full + 2;
    // FOLD, tile i's (buffer i % 2): rows' rstd and (mean - c) rstd, the columns' b' and s
    float *fold_v = reinterpret_cast<float *>(smem + L::RING + 2 * L::EPI_BYTES + 256);
    auto fold_buf = [&](int b) { return fold_v + b * (2 * BM + 2 * BN); };
    const int tid = threadIdx.x, k_steps = K / BK, m_tiles = M / BM, n_tiles = N / BN;
    // A unit is a tile, or (MC) the pair of tiles on row tiles 2 p and 2 p + 1 of one column tile.
    const int rank = MC ? (int)(blockIdx.x % 2) : 0, unit0 = MC ? blockIdx.x / 2 : blockIdx.x;
    const int unit_rows = MC ? m_tiles / 2 : m_tiles, units = unit_rows * n_tiles,
              stride = MC ? gridDim.x / 2 : gridDim.x;
    auto m_of = [&](int u) { return (MC ? 2 * (u % unit_rows) + rank : u % unit_rows) * BM; };
    auto n_of = [&](int u) { return u / unit_rows * BN; };
    if (tid == 0) {
        // a slice's consumer warps (PP: one warpgroup's), and as many of the other block's (MC)
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], (PP ? 4 : 8) * (MC ? 2 : 1));
        mbar_init(&order[0], 1), mbar_init(&order[1], 1);
        for (int b = 0; b < 2; b++) mbar_init(&stat_full[b], 64), mbar_init(&stat_empty[b], 8);
        mbar_fence_init();
    }
    __syncthreads();
    if (MC) cluster_arrive(), cluster_wait();  // the other block's barriers exist before anything signals them

    if (tid < 128) {
        regs_producer();
        if (tid == 0) {
            tma_prefetch_map(&x_map), tma_prefetch_map(&w_map);
            int g = 0;  // the block's slices so far
            for (int u = unit0; u < units; u += stride) {
                const int m0 = m_of(u), n0 = n_of(u);
                for (int k = 0; k < k_steps; k++, g++) {
                    const int s = g % STAGES;
                    if (g >= STAGES) mbar_wait(&empty[s], (g / STAGES - 1) & 1);  // both blocks done with g - STAGES
                    mbar_arrive_expect_tx(&full[s], L::STAGE);  // x, and W whole (MC: a half from each block)
                    unsigned char *st = smem + s * L::STAGE;
                    if (HINT & 2)
                        tma_load_hint(st, &x_map, k * BK, m0, &full[s], policy_evict_last());
                    else
                        tma_load(st, &x_map, k * BK, m0, &full[s]);
                    if (MC && MCAST)
                        tma_load_mc(st + L::X_BYTES + rank * (BN / 2) * 128, &w_map, k * BK, n0 + rank * (BN / 2),
                                    &full[s], 3);
                    else if (HINT & 4)
                        tma_load_hint(st + L::X_BYTES, &w_map, k * BK, n0, &full[s], policy_evict_last());
                    else
                        tma_load(st + L::X_BYTES, &w_map, k * BK, n0, &full[s]);
                }
            }
        }
        if (FOLD && FDIAG == 4) {
            // the consumers take their own statistics
        } else if (FOLD && FDIAG == 1 && tid >= 64) {
            for (int b = 0; b < 2; b++)
                for (int j = tid - 64; j < 2 * BM + 2 * BN; j += 64) fold_buf(b)[j] = j < BM ? 1.f : 0.f;
        } else if (FOLD && tid >= 64) {
            // Warps 2-3, a tile ahead of the consumers: its rows' statistics from their parts (Chan, as
            // gemm_tiles.cu), and its columns' b' and s, into buffer i % 2.
            const int r = tid - 64;
            const float cnt = (float)K / fa.nparts, inv_cnt = 1.f / cnt, inv_k = 1.f / K;
            for (int i = 0;; i++) {
                const int u = unit0 + i * stride;
                if (u >= units) break;
                const int m0 = m_of(u), n0 = n_of(u), b = i % 2;
                if (i >= 2 && FDIAG == 3) {
                    while (!mbar_try(&stat_empty[b], (i / 2 - 1) & 1)) __nanosleep(256);
                } else if (i >= 2) {
                    mbar_wait(&stat_empty[b], (i / 2 - 1) & 1);
                }
                float *fb = fold_buf(b);
                for (int h = 0; h < 2; h++) {
                    const int row = m0 + r + 64 * h;
                    const float2 *pp = fa.parts + (size_t)row * fa.nparts;
                    float2 v[16];
#pragma unroll
                    for (int j = 0; j < 16; j++) v[j] = j < fa.nparts ? pp[j] : make_float2(0.f, 0.f);
                    float sum = 0.f;
#pragma unroll
                    for (int j = 0; j < 16; j++) sum += v[j].x;
                    const float mean = sum * inv_k;
                    float m2 = 0.f;
#pragma unroll
                    for (int j = 0; j < 16; j++) {
                        const float d = fmaf(-cnt, mean, v[j].x);
                        if (j < fa.nparts) m2 += fmaf(d * d, inv_cnt, v[j].y);
                    }
                    const float rstd = rsqrtf(m2 * inv_k + 1e-5f);
                    fb[r + 64 * h] = rstd;
                    fb[BM + r + 64 * h] = (mean - fa.shift[row]) * rstd;
                }
                for (int j = r; j < BN; j += 64) fb[2 * BM + j] = bias[n0 + j], fb[2 * BM + BN + j] = fa.s[n0 + j];
                mbar_arrive(&stat_full[b]);
            }
        }
        __syncwarp();  // warp 0 whole again before the cluster barrier (.aligned)
    } else {
        regs_consumer();
        const int c = tid / 128 - 1, warp = tid / 32 % 4, lane = tid % 32, t = tid % 128;
        const int rl = 16 * warp + lane / 4, cl = 2 * (lane % 4);
        bf16 *stage_c = staging + c * (L::EPI_BYTES / 2);  // a warpgroup's staging (EPI 3: on a 1 KiB atom)
        auto release = [&](int s) {
            if (lane == 0) {
                mbar_arrive(&empty[s]);
                if (MC) mbar_arrive_rank(&empty[s], rank ^ 1);
            }
        };
        // acc[h]: rows 64 h.. of the warpgroup's rows (64 c.. of the tile, or PP all 128 of its own tiles)
        constexpr int H = PP ? 2 : 1;
        if constexpr (ACC2) {
            // Two accumulators, alternating tiles: tile i + 1's first slice is issued into the other one before
            // tile i's epilogue (TMA stores), so the tensor pipe has work while its accumulator is staged.
            static_assert(!PP && EPI == 3, "ACC2: both warpgroups on each tile, TMA stores");
            float acc[2][BN / 8][4];
            unsigned char *stage_b = reinterpret_cast<unsigned char *>(stage_c);
            const int r0 = 64 * c;
            auto issue = [&](auto P, int g) {  // slice g into acc[P]: wait for it, MMAs, commit
                const int s = g % STAGES;
                mbar_wait(&full[s], (g / STAGES) & 1);
                const uint64_t wd = wgmma_desc_sw128(smem + s * L::STAGE + L::X_BYTES);
                const uint64_t xd = wgmma_desc_sw128(smem + s * L::STAGE + r0 * 128);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++) wgmma_ss<BN>(acc[P.value], xd + 2 * kk, wd + 2 * kk);
                wgmma_commit();
            };
            auto zero = [&](auto P) {
#pragma unroll
                for (int j = 0; j < BN / 8; j++)
                    acc[P.value][j][0] = acc[P.value][j][1] = acc[P.value][j][2] = acc[P.value][j][3] = 0.f;
            };
            // Tile i in acc[P], its slice 0 already issued: its other slices (the last left in flight).
            auto rest = [&](auto P, int i) {
                int g = i * k_steps + 1;
                for (int k = 1; k < k_steps; k++, g++) {
                    issue(P, g);
                    wgmma_wait<1>();
                    release((g - 1) % STAGES);
                }
            };
            // Tile i's epilogue from acc[P] (its MMAs done): staged swizzled, out by TMA stores.
            auto epilogue = [&](auto P, int i) {
                const int u = unit0 + i * stride, m0 = m_of(u), n0 = n_of(u);
                wgmma_hold(acc[P.value]);
                release(((i + 1) * k_steps - 1) % STAGES);
                if (t == 0) tma_store_wait_read();  // the last tile's stores have read the staging
                named_barrier(1 + c, 128);
#pragma unroll
                for (int j = 0; j < BN / 8; j++) {
                    const float2 b = *reinterpret_cast<const float2 *>(bias + n0 + cl + 8 * j);
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int r = rl + 8 * e;
                        *reinterpret_cast<__nv_bfloat162 *>(stage_b + (j / 8) * (L::ROWS * 128) + r * 128 +
                                                            (((j % 8) ^ (r % 8)) * 16) + cl * 2) =
                            __floats2bfloat162_rn(acc[P.value][j][2 * e] + b.x, acc[P.value][j][2 * e + 1] + b.y);
                    }
                }
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                named_barrier(1 + c, 128);
                if (t == 0) {
#pragma unroll
                    for (int bx = 0; bx < BN / 64; bx++)
                        asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                                     ::"l"(reinterpret_cast<uint64_t>(&y_map)), "r"(n0 + 64 * bx), "r"(m0 + r0),
                                     "r"(smem_addr(stage_b + bx * L::ROWS * 128))
                                     : "memory");
                    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                }
            };
            // Tile i with a tile after it: that tile's slice 0 into the other accumulator before the epilogue,
            // so that the tensor pipe works while acc[P] is staged; straight-line, so that ptxas can tell
            // which group is still in flight (a branch around the issue made it serialise every wgmma).
            auto with_next = [&](auto P, int i) {
                constexpr int Q = 1 - P.value;
                rest(P, i);
                zero(std::integral_constant<int, Q>());
                issue(std::integral_constant<int, Q>(), (i + 1) * k_steps);
                wgmma_wait<1>();
                epilogue(P, i);
            };
            auto last = [&](auto P, int i) {
                rest(P, i);
                wgmma_wait<0>();
                epilogue(P, i);
            };
            auto has = [&](int i) { return unit0 + i * stride < units; };
            if (has(0)) {
                const std::integral_constant<int, 0> P0;
                const std::integral_constant<int, 1> P1;
                zero(P0);
                issue(P0, 0);
                for (int i = 0;; i += 2) {
                    if (!has(i + 1)) {
                        last(P0, i);
                        break;
                    }
                    with_next(P0, i);
                    if (!has(i + 2)) {
                        last(P1, i + 1);
                        break;
                    }
                    with_next(P1, i + 1);
                }
            }
        } else {
        // The block's i-th unit is its warpgroup (i % 2)'s (PP) or both's; its slices are g = i k_steps...
        int pend_m = -1, pend_n = 0;  // EPI 6: the staged tile not yet stored (t == 0's)
        for (int i = PP ? c : 0;; i += PP ? 2 : 1) {
            const int u = unit0 + i * stride;
            if (u >= units) break;
            const int m0 = m_of(u), n0 = n_of(u), r0 = PP ? 0 : 64 * c;  // the warpgroup's first row of the tile
            float2 bias_j[BN / 8];  // the tile's bias, loaded before the mainloop: off the epilogue's path
#pragma unroll
            for (int j = 0; j < BN / 8; j++) bias_j[j] = *reinterpret_cast<const float2 *>(bias + n0 + cl + 8 * j);
            // FOLD, FDIAG 4: the consumers' own statistics (a quad of lanes a row, four parts each) and the tile's
            // b' and s (a column or two a thread), loaded now and used in the epilogue
            float2 fv[2][4] = {};
            float fshift[2] = {0.f, 0.f}, fbv[2] = {0.f, 0.f}, fsv[2] = {0.f, 0.f};
            if constexpr (FOLD && FDIAG == 4) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int row = m0 + (PP ? 0 : 64 * c) + rl + 8 * e;
#pragma unroll
                    for (int q = 0; q < 4; q++) fv[e][q] = fa.parts[(size_t)row * fa.nparts + 4 * (lane % 4) + q];
                    fshift[e] = fa.shift[row];
                }
#pragma unroll
                for (int h2 = 0; h2 < 2; h2++) {
                    const int col = t + 128 * h2;
                    if (col < BN) fbv[h2] = bias[n0 + col], fsv[h2] = fa.s[n0 + col];
                }
            }
            // PP: a warpgroup waits on slice g only once slice g - STAGES's phase of full[] has completed (else
            // the parity test would pass on an older phase): the other warpgroup has waited on every slice of
            // the tile before (order[c], one arrival after each of its tiles' last wait).
            if (PP && i > 0) mbar_wait(&order[c], ((i - 1) / 2) & 1);
            float acc[H][BN / 8][4];
#pragma unroll
            for (int h = 0; h < H; h++)
#pragma unroll
                for (int j = 0; j < BN / 8; j++) acc[h][j][0] = acc[h][j][1] = acc[h][j][2] = acc[h][j][3] = 0.f;
            int g = i * k_steps;
            for (int k = 0; k < k_steps; k++, g++) {
                const int s = g % STAGES;
                mbar_wait(&full[s], (g / STAGES) & 1);
                const uint64_t wd = wgmma_desc_sw128(smem + s * L::STAGE + L::X_BYTES);
                wgmma_fence();
                if constexpr (KK_OUTER) {  // the two accumulators' wgmmas alternate (independent neighbours)
#pragma unroll
                    for (int kk = 0; kk < 4; kk++)
#pragma unroll
                        for (int h = 0; h < H; h++)
                            wgmma_ss<BN>(acc[h], wgmma_desc_sw128(smem + s * L::STAGE + (r0 + 64 * h) * 128) + 2 * kk,
                                         wd + 2 * kk);
                } else {
#pragma unroll
                    for (int h = 0; h < H; h++) {
                        const uint64_t xd = wgmma_desc_sw128(smem + s * L::STAGE + (r0 + 64 * h) * 128);
#pragma unroll
                        for (int kk = 0; kk < 4; kk++) wgmma_ss<BN>(acc[h], xd + 2 * kk, wd + 2 * kk);
                    }
                }
                wgmma_commit();
                if (EPI == 6 && t == 0 && pend_m >= 0 && k < BN / 64 * SPLIT) {  // box k: columns k / SPLIT, rows k % SPLIT
                    constexpr int BR = L::ROWS / SPLIT;
                    const int bx = k / SPLIT, br = k % SPLIT;
                    tma_store_box<(HINT & 1) != 0>(&y_map,
                                                   reinterpret_cast<unsigned char *>(stage_c) + (bx * L::ROWS + br * BR) * 128,
                                                   pend_n + 64 * bx, pend_m + br * BR, (HINT & 1) ? policy_evict_first() : 0);
                    if (k == BN / 64 * SPLIT - 1) pend_m = -1;
                }
                wgmma_wait<1>();  // slice g - 1's MMAs are done: its stage is free
                if (k > 0) release((g - 1) % STAGES);
            }
            if (PP && t == 0) mbar_arrive(&order[c ^ 1]);
            wgmma_wait<0>();
#pragma unroll
            for (int h = 0; h < H; h++) wgmma_hold(acc[h]);
            release((g - 1) % STAGES);
            // the epilogue: + bias, bf16, then staged and out as whole-row 16-byte vectors (EPI 0, 1) or out
            // as each thread's bf16 pairs (EPI 2)
            if constexpr (RES) {  // yres += acc + bias, fp32 pairs read and written from registers (32-byte rows)
                // Session 65: every read of y before the first store (a store may alias a later read, so
                // interleaved each read waited out a round trip to memory)
                auto py = [&](int j, int h, int e) {
                    return reinterpret_cast<float2 *>(yres + (size_t)(m0 + r0 + 64 * h + rl + 8 * e) * N + n0 + cl +
                                                      8 * j);
                };
#pragma unroll
                for (int j = 0; j < BN / 8; j++)
#pragma unroll
                    for (int h = 0; h < H; h++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const float2 o = *py(j, h, e);
                            acc[h][j][2 * e] = o.x + (acc[h][j][2 * e] + bias_j[j].x);
                            acc[h][j][2 * e + 1] = o.y + (acc[h][j][2 * e + 1] + bias_j[j].y);
                        }
#pragma unroll
                for (int j = 0; j < BN / 8; j++)
#pragma unroll
                    for (int h = 0; h < H; h++)
#pragma unroll
                        for (int e = 0; e < 2; e++) *py(j, h, e) = make_float2(acc[h][j][2 * e], acc[h][j][2 * e + 1]);
            } else if constexpr (EPI == 3 || EPI == 5 || EPI == 6) {
                unsigned char *stage_b = reinterpret_cast<unsigned char *>(stage_c);
                float ra[2] = {1.f, 1.f}, rb[2] = {0.f, 0.f};
                const float *fb = fold_buf(FDIAG == 4 ? c : i % 2);
                if constexpr (FOLD && FDIAG == 4) {
                    // this warpgroup's copy of the vectors (its last reads of them were before the staging's barrier)
                    float *fw = fold_buf(c);
#pragma unroll
                    for (int h2 = 0; h2 < 2; h2++)
                        if (t + 128 * h2 < BN) fw[2 * BM + t + 128 * h2] = fbv[h2], fw[2 * BM + BN + t + 128 * h2] = fsv[h2];
                    const float cnt = (float)K / fa.nparts, inv_cnt = 1.f / cnt, inv_k = 1.f / K;
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float sum = (fv[e][0].x + fv[e][1].x) + (fv[e][2].x + fv[e][3].x);
                        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                        const float mean = sum * inv_k;
                        float m2 = 0.f;
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            const float d = fmaf(-cnt, mean, fv[e][q].x);
                            m2 += fmaf(d * d, inv_cnt, fv[e][q].y);
                        }
                        m2 += __shfl_xor_sync(0xffffffffu, m2, 1);
                        m2 += __shfl_xor_sync(0xffffffffu, m2, 2);
                        ra[e] = rsqrtf(m2 * inv_k + 1e-5f);
                        rb[e] = (mean - fshift[e]) * ra[e];
                    }
                }
                if (t == 0) tma_store_wait_read();  // the last tile's stores have read the staging
                named_barrier(1 + c, 128);
                if constexpr (FOLD && FDIAG != 4) {
                    if (FDIAG == 0 || FDIAG == 3) mbar_wait(&stat_full[i % 2], (i / 2) & 1);
#pragma unroll
                    for (int e = 0; e < 2; e++) ra[e] = fb[r0 + rl + 8 * e], rb[e] = fb[BM + r0 + rl + 8 * e];
                }
                // Session 65: every shared read before the first staging store (RW_SPLIT), as gemm_tiles.cu's
                // epilogue: a store may alias a later read, so interleaved each read waits out the store before it.
#pragma unroll
                for (int j = 0; j < BN / 8; j++) {
                    const float2 b = FOLD ? *reinterpret_cast<const float2 *>(fb + 2 * BM + cl + 8 * j) : bias_j[j];
                    const float2 sv = FOLD ? *reinterpret_cast<const float2 *>(fb + 2 * BM + BN + cl + 8 * j)
                                           : make_float2(0.f, 0.f);
#pragma unroll
                    for (int h = 0; h < H; h++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            if (FOLD) {  // rstd (W copy) - (mean - c) rstd s + b'
                                acc[h][j][2 * e] = fmaf(ra[e], acc[h][j][2 * e], fmaf(-rb[e], sv.x, b.x));
                                acc[h][j][2 * e + 1] = fmaf(ra[e], acc[h][j][2 * e + 1], fmaf(-rb[e], sv.y, b.y));
                            } else {
                                acc[h][j][2 * e] += b.x, acc[h][j][2 * e + 1] += b.y;
                            }
                        }
                }
#pragma unroll
                for (int j = 0; j < BN / 8; j++)
#pragma unroll
                    for (int h = 0; h < H; h++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int r = 64 * h + rl + 8 * e;  // box j / 8, 16-byte chunk j % 8 of row r, swizzled
                            *reinterpret_cast<__nv_bfloat162 *>(stage_b + (j / 8) * (L::ROWS * 128) + r * 128 +
                                                                (((j % 8) ^ (r % 8)) * 16) + cl * 2) =
                                __floats2bfloat162_rn(acc[h][j][2 * e], acc[h][j][2 * e + 1]);
                        }
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                if (FOLD) {
                    __syncwarp();
                    if (lane == 0 && FDIAG != 1 && FDIAG != 4) mbar_arrive(&stat_empty[i % 2]);  // done with tile i's
                }
                named_barrier(1 + c, 128);
                if (EPI == 3 && t == 0) {
#pragma unroll
                    for (int bx = 0; bx < BN / 64; bx++)
                        tma_store_box<(HINT & 1) != 0>(&y_map, stage_b + bx * L::ROWS * 128, n0 + 64 * bx, m0 + r0,
                                                       (HINT & 1) ? policy_evict_first() : 0);
                }
                if (EPI == 6) pend_m = m0 + r0, pend_n = n0;  // out box by box under the next tile's slices
            } else if constexpr (EPI == 4) {  // diagnostic: no stores (a store the values never take keeps them live)
#pragma unroll
                for (int j = 0; j < BN / 8; j++)
#pragma unroll
                    for (int h = 0; h < H; h++)
                        if (acc[h][j][0] + acc[h][j][1] + acc[h][j][2] + acc[h][j][3] == 1234567.f)
                            y[(size_t)(m0 + r0 + 64 * h + rl) * N + n0 + cl + 8 * j] = __float2bfloat16(acc[h][j][0]);
            } else if constexpr (EPI == 2) {
#pragma unroll
                for (int j = 0; j < BN / 8; j++) {
                    const float2 b = bias_j[j];
#pragma unroll
                    for (int h = 0; h < H; h++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            *reinterpret_cast<__nv_bfloat162 *>(y + (size_t)(m0 + r0 + 64 * h + rl + 8 * e) * N + n0 +
                                                                cl + 8 * j) =
                                __floats2bfloat162_rn(acc[h][j][2 * e] + b.x, acc[h][j][2 * e + 1] + b.y);
                }
            } else {
                constexpr int PASSES = EPI == 1 ? H : 1;
#pragma unroll
                for (int p = 0; p < PASSES; p++) {
#pragma unroll
                    for (int j = 0; j < BN / 8; j++) {
                        const float2 b = bias_j[j];
#pragma unroll
                        for (int h = 0; h < H; h++) {
                            if (EPI == 1 && h != p) continue;
                            const int hr = EPI == 1 ? 0 : 64 * h;
#pragma unroll
                            for (int e = 0; e < 2; e++)
                                *reinterpret_cast<__nv_bfloat162 *>(stage_c + (hr + rl + 8 * e) * L::LD + cl + 8 * j) =
                                    __floats2bfloat162_rn(acc[h][j][2 * e] + b.x, acc[h][j][2 * e + 1] + b.y);
                        }
                    }
                    named_barrier(1 + c, 128);
                    constexpr int CPR = BN / 8;
                    const int pr = EPI == 1 ? 64 * p : 0;
#pragma unroll 4
                    for (int q = t; q < L::STAGED * CPR; q += 128) {
                        const int r = q / CPR, cc = q % CPR * 8;
                        *reinterpret_cast<uint4 *>(y + (size_t)(m0 + r0 + pr + r) * N + n0 + cc) =
                            *reinterpret_cast<const uint4 *>(stage_c + r * L::LD + cc);
                    }
                    named_barrier(1 + c, 128);  // the staging read before the next pass or tile writes it
                }
            }
        }
        if (EPI == 6 && t == 0 && pend_m >= 0)  // the last tile's boxes
            for (int k = 0; k < BN / 64 * SPLIT; k++) {
                constexpr int BR = L::ROWS / SPLIT;
                const int bx = k / SPLIT, br = k % SPLIT;
                tma_store_box<(HINT & 1) != 0>(&y_map,
                                               reinterpret_cast<unsigned char *>(stage_c) + (bx * L::ROWS + br * BR) * 128,
                                               pend_n + 64 * bx, pend_m + br * BR, (HINT & 1) ? policy_evict_first() : 0);
            }
        }
    }
    if ((EPI == 3 || EPI == 6) && tid % 128 == 0 && tid >= 128) tma_store_wait_read();  // the staging stays until read
    if (MC) cluster_arrive(), cluster_wait();  // no block leaves while the other may still signal its barriers
}

// ----------------------------------------------------------------------------
// The residual products (prepared in session 64 for session 65, never run): y fp32 += x W^T + b, persistent,
// 128 x BN tiles over two consumer warpgroups of 64 rows. y's old tile comes by TMA (fp32 boxes of 32
// columns, 128-byte swizzle) into one of two buffers, loaded by its own producer thread (warp 1) a tile ahead;
// the consumers add their sums into it in place and store it back by TMA, each warpgroup its 64 rows; a
// buffer is free once the stores out of it have read it (checked at the next tile's epilogue).
template <int BN, int STAGES> struct ResLayout {
    static constexpr int X_BYTES = BM * BK * 2, W_BYTES = BN * BK * 2, STAGE = X_BYTES + W_BYTES;
    static constexpr int OLD = BM * BN * 4;  // one buffer: BN / 32 boxes of 128 rows x 128 bytes
    static constexpr size_t RING = (size_t)STAGES * STAGE, SMEM = 1024 + RING + 2 * OLD + 256;
    static_assert(STAGE % 1024 == 0 && OLD % 1024 == 0 && BN % 32 == 0, "swizzle atoms, whole boxes");
    static_assert(SMEM <= 227 * 1024, "shared memory");
};

template <int BN, int STAGES>
__global__ void __launch_bounds__(THREADS, 1)
    resid_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                 const __grid_constant__ CUtensorMap old_map, const __grid_constant__ CUtensorMap out_map,
                 const float *bias, int M, int N, int K) {
    typedef ResLayout<BN, STAGES> L;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char *old = smem + L::RING;  // buffer b at old + b * L::OLD
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + L::RING + 2 * L::OLD), *empty = full + STAGES,
             *old_full = empty + STAGES, *old_empty = old_full + 2;
    const int tid = threadIdx.x, k_steps = K / BK, m_tiles = M / BM, units = m_tiles * (N / BN);
    const int unit0 = blockIdx.x, stride = gridDim.x;
    auto m_of = [&](int u) { return u % m_tiles * BM; };
    auto n_of = [&](int u) { return u / m_tiles * BN; };
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 8);
        for (int b = 0; b < 2; b++) mbar_init(&old_full[b], 1), mbar_init(&old_empty[b], 2);
        mbar_fence_init();
    }
    __syncthreads();
    if (tid < 128) {
        regs_producer();
        if (tid == 0) {  // the K slices
            tma_prefetch_map(&x_map), tma_prefetch_map(&w_map);
            int g = 0;
            for (int u = unit0; u < units; u += stride)
                for (int k = 0; k < k_steps; k++, g++) {
                    const int s = g % STAGES;
                    if (g >= STAGES) mbar_wait(&empty[s], (g / STAGES - 1) & 1);
                    mbar_arrive_expect_tx(&full[s], L::STAGE);
                    unsigned char *st = smem + s * L::STAGE;
                    tma_load(st, &x_map, k * BK, m_of(u), &full[s]);
                    tma_load(st + L::X_BYTES, &w_map, k * BK, n_of(u), &full[s]);
                }
        } else if (tid == 32) {  // y's old tiles, a tile ahead
            tma_prefetch_map(&old_map);
            for (int i = 0;; i++) {
                const int u = unit0 + i * stride, b = i % 2;
                if (u >= units) break;
                if (i >= 2) mbar_wait(&old_empty[b], (i / 2 - 1) & 1);
                mbar_arrive_expect_tx(&old_full[b], L::OLD);
#pragma unroll
                for (int bx = 0; bx < BN / 32; bx++)
                    tma_load(old + b * L::OLD + bx * BM * 128, &old_map, n_of(u) + 32 * bx, m_of(u), &old_full[b]);
            }
        }
        return;
    }
    regs_consumer();
    const int c = tid / 128 - 1, warp = tid / 32 % 4, lane = tid % 32, t = tid % 128;
    const int rl = 16 * warp + lane / 4, cl = 2 * (lane % 4), r0 = 64 * c;
    for (int i = 0;; i++) {
        const int u = unit0 + i * stride, b = i % 2;
        if (u >= units) break;
        const int m0 = m_of(u), n0 = n_of(u);
        float2 bias_j[BN / 8];
#pragma unroll
        for (int j = 0; j < BN / 8; j++) bias_j[j] = *reinterpret_cast<const float2 *>(bias + n0 + cl + 8 * j);
        float acc[BN / 8][4];
#pragma unroll
        for (int j = 0; j < BN / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        int g = i * k_steps;
        for (int k = 0; k < k_steps; k++, g++) {
            const int s = g % STAGES;
            mbar_wait(&full[s], (g / STAGES) & 1);
            const uint64_t wd = wgmma_desc_sw128(smem + s * L::STAGE + L::X_BYTES),
                           xd = wgmma_desc_sw128(smem + s * L::STAGE + r0 * 128);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wgmma_ss<BN>(acc, xd + 2 * kk, wd + 2 * kk);
            wgmma_commit();
            wgmma_wait<1>();
            if (k > 0 && lane == 0) mbar_arrive(&empty[(g - 1) % STAGES]);
        }
        wgmma_wait<0>();
        wgmma_hold(acc);
        if (lane == 0) mbar_arrive(&empty[(g - 1) % STAGES]);
        if (t == 0 && i > 0) {  // the last tile's stores have read its buffer: the old-tile producer may refill it
            tma_store_wait_read();
            mbar_arrive(&old_empty[(i - 1) % 2]);
        }
        mbar_wait(&old_full[b], (i / 2) & 1);
        unsigned char *ob = old + b * L::OLD;
        // Session 65: all reads of the old tile before the first store back (a store may alias a later read)
        auto at = [&](int j, int e) {
            const int r = r0 + rl + 8 * e, col = cl + 8 * j, cw = col % 32;
            return reinterpret_cast<float2 *>(ob + (col / 32) * BM * 128 + r * 128 + (((cw / 4) ^ (r % 8)) * 16) +
                                              (cw % 4) * 4);
        };
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float2 o = *at(j, e);
                acc[j][2 * e] = o.x + (acc[j][2 * e] + bias_j[j].x), acc[j][2 * e + 1] = o.y + (acc[j][2 * e + 1] + bias_j[j].y);
            }
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) *at(j, e) = make_float2(acc[j][2 * e], acc[j][2 * e + 1]);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_barrier(1 + c, 128);
        if (t == 0) {
#pragma unroll
            for (int bx = 0; bx < BN / 32; bx++)
                tma_store_box<false>(&out_map, ob + bx * BM * 128 + r0 * 128, n0 + 32 * bx, m0 + r0, 0);
        }
    }
    if (t == 0) tma_store_wait_read();
}

// An fp32 [rows, N] matrix in boxes of 32 columns (128 bytes) x box_rows under the 128-byte swizzle.
static bool tensor_map_f32_sw128(CUtensorMap *map, const void *p, int rows, int N, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
    const cuuint64_t dims[2] = {(cuuint64_t)N, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)N * 4};
    const cuuint32_t box[2] = {32, (cuuint32_t)box_rows}, elem_strides[2] = {1, 1};
    return encode && encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<void *>(p), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// ----------------------------------------------------------------------------
// Host

struct Variant {
    std::string name;
    std::function<void(cudaStream_t)> run;
};

// A launcher of persist_kernel<BN, STAGES, MC> for y = x W^T + b (M x N x K), maps built once; empty name
// when the shape does not divide.
template <int BN, int STAGES, bool MC, bool PP = false, bool MCAST = MC, bool CL = MC, int EPI = 0, bool RES = false,
          bool KK_OUTER = false, bool ACC2 = false, int HINT = 0, int SPLIT = 1, bool FOLD = false, int FDIAG = 0>
Variant make_variant(const void *x, const void *W, bf16 *y, const float *bias, int M, int N, int K, int sms,
                     float *yres = NULL, FoldArgs fa = FoldArgs{}) {
    typedef Layout<BN, STAGES, PP, EPI> L;
    Variant v;
    if (N % BN || M % (2 * BM) || K % BK) return v;
    CUtensorMap xm, wm, ym;
    if (!tensor_map(&xm, x, M, K, K, BM) || !tensor_map(&wm, W, N, K, K, MCAST ? BN / 2 : BN) ||
        !tensor_map(&ym, y, M, N, N, L::ROWS / SPLIT)) {
        fprintf(stderr, "tensor maps failed\n");
        exit(1);
    }
    auto kern = persist_kernel<BN, STAGES, MC, PP, MCAST, EPI, RES, KK_OUTER, ACC2, HINT, SPLIT, FOLD, FDIAG>;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)L::SMEM));
    const int tiles = M / BM * (N / BN);
    int grid = std::min(tiles, sms);
    if (CL) {
        const int clusters = max_active_clusters((const void *)kern, 2, THREADS, L::SMEM);
        if (clusters <= 0) return v;
        grid = 2 * std::min(tiles / 2, clusters);
    }
    char name[128];
    snprintf(name, sizeof name, "BN %3d, %d stages%s%s%s, %d blocks", BN, STAGES,
             MC ? (MCAST ? ", W multicast" : ", lockstep pairs, no multicast") : "", CL && !MC ? ", clusters of 2" : "",
             PP ? ", ping-pong" : "", grid);
    if (FOLD) snprintf(name + strlen(name), sizeof name - strlen(name), ", LayerNorm folded");
    if (FDIAG) snprintf(name + strlen(name), sizeof name - strlen(name), ", fold diag %d", FDIAG);
    if (SPLIT > 1) snprintf(name + strlen(name), sizeof name - strlen(name), ", boxes of %d rows", L::ROWS / SPLIT);
    if (HINT) snprintf(name + strlen(name), sizeof name - strlen(name), ", hints%s%s%s", HINT & 1 ? " y-first" : "",
                       HINT & 2 ? " x-last" : "", HINT & 4 ? " W-last" : "");
    if (ACC2) snprintf(name + strlen(name), sizeof name - strlen(name), ", two accumulators");
    if (KK_OUTER) snprintf(name + strlen(name), sizeof name - strlen(name), ", accumulators alternating");
    if (RES) snprintf(name + strlen(name), sizeof name - strlen(name), ", residual");
    else if (EPI) snprintf(name + strlen(name), sizeof name - strlen(name), ", epilogue %s", EPI == 1 ? "by 64 rows" : EPI == 2 ? "direct" : EPI == 3 ? "by TMA" : EPI == 4 ? "none (no stores)" : EPI == 5 ? "staged, no stores (no stores)" : "by TMA, a box a slice");
    v.name = name;
    v.run = [=](cudaStream_t st) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = CL ? 2 : 1, attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
        cfg.gridDim = dim3(grid), cfg.blockDim = dim3(THREADS), cfg.dynamicSmemBytes = L::SMEM, cfg.stream = st;
        cfg.attrs = &attr, cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, kern, xm, wm, ym, y, yres, bias, M, N, K, fa));
    };
    return v;
}

// A launcher of resid_kernel<BN, STAGES> for y (fp32) += x W^T + b.
template <int BN, int STAGES>
Variant make_resid(const void *x, const void *W, float *y, const float *bias, int M, int N, int K, int sms) {
    typedef ResLayout<BN, STAGES> L;
    Variant v;
    if (N % BN || M % BM || K % BK) return v;
    CUtensorMap xm, wm, om, sm;
    if (!tensor_map(&xm, x, M, K, K, BM) || !tensor_map(&wm, W, N, K, K, BN) ||
        !tensor_map_f32_sw128(&om, y, M, N, BM) || !tensor_map_f32_sw128(&sm, y, M, N, 64)) {
        fprintf(stderr, "tensor maps failed\n");
        exit(1);
    }
    auto kern = resid_kernel<BN, STAGES>;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)L::SMEM));
    const int grid = std::min(M / BM * (N / BN), sms);
    char name[128];
    snprintf(name, sizeof name, "residual by TMA, BN %d, %d stages, %d blocks", BN, STAGES, grid);
    v.name = name;
    v.run = [=](cudaStream_t st) { kern<<<grid, THREADS, L::SMEM, st>>>(xm, wm, om, sm, bias, M, N, K); CK(cudaGetLastError()); };
    return v;
}

static float frand() { return (float)rand() / RAND_MAX * 2.f - 1.f; }
static std::vector<bf16> rnd_bf16(size_t n, float scale) {
    std::vector<bf16> v(n);
    for (auto &e : v) e = __float2bfloat16(scale * frand());
    return v;
}
template <typename T> static T *upload(const std::vector<T> &h) {
    T *d;
    CK(cudaMalloc(&d, h.size() * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
static std::vector<float> download_bf16(const bf16 *d, size_t n) {
    std::vector<bf16> b(n);
    CK(cudaMemcpy(b.data(), d, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) h[i] = __bfloat162float(b[i]);
    return h;
}

// Median us of one launch, over 25 replays (3 dropped) of a graph of `reps` launches.
static float time_graph(const std::function<void(cudaStream_t)> &f, cudaStream_t st, int reps = 20) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < reps; i++) f(st);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> v;
    for (int r = 0; r < 25; r++) {
        CK(cudaEventRecord(a, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 3) v.push_back(ms * 1000.f / reps);
    }
    std::sort(v.begin(), v.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    const int M = argc > 1 ? atoi(argv[1]) : 8192;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    Error err;
    MatmulLt *lt = matmul_lt_create(32u << 20, &err);
    if (!lt) return 2;
    srand(1);
    struct { const char *name; int N, K; } shapes[] = {
        {"qkv", 2304, 768}, {"attention projection", 768, 768}, {"fc", 3072, 768}, {"MLP projection", 768, 3072}};
    const bool once = getenv("PROBE_ONCE") != NULL;  // one launch each, no timing (for ncu)
    const int only = argc > 2 ? atoi(argv[2]) : -1;     // one shape's index
    for (int si = 0; si < 4 && !getenv("PROBE_FOLD"); si++) {
        if (only >= 0 && si != only) continue;
        auto &sh = shapes[si];
        const int N = sh.N, K = sh.K;
        bf16 *x = upload(rnd_bf16((size_t)M * K, 1.f)), *W = upload(rnd_bf16((size_t)N * K, 0.04f));
        std::vector<bf16> b16 = rnd_bf16(N, 0.1f);
        std::vector<float> b32(N);
        for (int n = 0; n < N; n++) b32[n] = __bfloat162float(b16[n]);
        bf16 *bias16 = upload(b16), *y;
        float *bias32 = upload(b32);
        CK(cudaMalloc(&y, (size_t)M * N * 2));
        auto lt_run = [&](cudaStream_t s) {
            if (matmul_lt(lt, MATMUL_LT_BIAS, y, N, x, W, DTYPE_BF16, bias16, M, N, K, NULL, s)) {
                fprintf(stderr, "matmul_lt failed\n");
                exit(3);
            }
        };
        CK(cudaMemset(y, 0, (size_t)M * N * 2));
        lt_run(st);
        CK(cudaStreamSynchronize(st));
        const std::vector<float> ref = download_bf16(y, (size_t)M * N);
        const double flop = 2.0 * M * N * K;
        const float t_lt = once ? 1.f : time_graph(lt_run, st);
        printf("%s %d x %d x %d: cuBLASLt %.2f us (%.0f TFLOP/s)\n", sh.name, M, N, K, t_lt, flop / t_lt / 1e6);
        const Variant vs[] = {
            make_variant<192, 4, false, false, false, false, 4>(x, W, y, bias32, M, N, K, sms),
            make_variant<192, 4, false, false, false, false, 3>(x, W, y, bias32, M, N, K, sms),
            make_variant<192, 4, false, false, false, false, 6>(x, W, y, bias32, M, N, K, sms),
            make_variant<192, 4, false, false, false, false, 6, false, false, false, 0, 2>(x, W, y, bias32, M, N, K, sms),
            make_variant<192, 4, false, false, false, false, 6, false, false, false, 0, 4>(x, W, y, bias32, M, N, K, sms),
            make_variant<192, 4, true, false, true, true, 6, false, false, false, 0, 2>(x, W, y, bias32, M, N, K, sms),
            make_variant<128, 5, false, false, false, false, 6, false, false, false, 0, 2>(x, W, y, bias32, M, N, K, sms),
            make_variant<256, 3, false, false, false, false, 6, false, false, false, 0, 2>(x, W, y, bias32, M, N, K, sms),
        };
        for (const Variant &v : vs) {
            if (v.name.empty()) continue;
            CK(cudaMemset(y, 0xff, (size_t)M * N * 2));  // NaNs: every element must be written
            v.run(st);
            CK(cudaStreamSynchronize(st));
            const std::vector<float> out = download_bf16(y, (size_t)M * N);
            double e = 0, r = 0;
            for (size_t i = 0; i < out.size(); i++) {
                const double d = (double)out[i] - ref[i];
                e += d * d, r += (double)ref[i] * ref[i];
            }
            const double rel = sqrt(e / r);
            if (!(rel <= 1e-2) && v.name.find("no stores") == std::string::npos) {
                printf("  %-40s INVALID (rel_l2 %.3g against cuBLASLt)\n", v.name.c_str(), rel);
                continue;
            }
            const float t = once ? 1.f : time_graph(v.run, st);
            printf("  %-40s %8.2f us (%.0f TFLOP/s, %.2fx cuBLASLt)  rel_l2 %.1e\n", v.name.c_str(), t,
                   flop / t / 1e6, t_lt / t, rel);
        }
        CK(cudaFree(x));
        CK(cudaFree(W));
        CK(cudaFree(y));
        CK(cudaFree(bias16));
        CK(cudaFree(bias32));
    }
    // The residual products: yres (fp32) += x W^T + b, against cuBLASLt's BIAS_RESIDUAL (beta = 1).
    for (int si = 1; si < 4 && getenv("PROBE_RESIDUAL"); si += 2) {
        if (only >= 0 && si != only) continue;
        auto &sh = shapes[si];
        const int N = sh.N, K = sh.K;
        bf16 *x = upload(rnd_bf16((size_t)M * K, 1.f)), *W = upload(rnd_bf16((size_t)N * K, 0.04f)), *ybf;
        std::vector<float> b32(N), r0((size_t)M * N);
        for (auto &e : b32) e = 0.1f * frand();
        for (auto &e : r0) e = 4.f * frand();
        float *bias32 = upload(b32), *res0 = upload(r0), *yr;
        CK(cudaMalloc(&yr, (size_t)M * N * 4));
        CK(cudaMalloc(&ybf, (size_t)M * N * 2));
        auto lt_run = [&](cudaStream_t s) {
            if (matmul_lt(lt, MATMUL_LT_BIAS_RESIDUAL, yr, N, x, W, DTYPE_BF16, bias32, M, N, K, NULL, s)) {
                fprintf(stderr, "matmul_lt failed\n");
                exit(3);
            }
        };
        CK(cudaMemcpy(yr, res0, (size_t)M * N * 4, cudaMemcpyDeviceToDevice));
        lt_run(st);
        CK(cudaStreamSynchronize(st));
        std::vector<float> ref((size_t)M * N);
        CK(cudaMemcpy(ref.data(), yr, ref.size() * 4, cudaMemcpyDeviceToHost));
        const double flop = 2.0 * M * N * K;
        const float t_lt = once ? 1.f : time_graph(lt_run, st);
        printf("%s + residual %d x %d x %d: cuBLASLt %.2f us (%.0f TFLOP/s)\n", sh.name, M, N, K, t_lt, flop / t_lt / 1e6);
        const Variant vs[] = {
            make_resid<96, 4>(x, W, yr, bias32, M, N, K, sms),
            make_resid<128, 3>(x, W, yr, bias32, M, N, K, sms),
            make_variant<128, 4, false, true, false, false, 2, true>(x, W, ybf, bias32, M, N, K, sms, yr),
            make_variant<128, 4, true, true, true, true, 2, true>(x, W, ybf, bias32, M, N, K, sms, yr),
            make_variant<192, 4, false, false, false, false, 2, true>(x, W, ybf, bias32, M, N, K, sms, yr),
            make_variant<192, 4, true, false, true, true, 2, true>(x, W, ybf, bias32, M, N, K, sms, yr),
            make_variant<192, 5, false, false, false, false, 2, true>(x, W, ybf, bias32, M, N, K, sms, yr),
            make_variant<256, 3, false, false, false, false, 2, true>(x, W, ybf, bias32, M, N, K, sms, yr),
            make_variant<256, 3, true, false, true, true, 2, true>(x, W, ybf, bias32, M, N, K, sms, yr),
        };
        for (const Variant &v : vs) {
            if (v.name.empty()) continue;
            CK(cudaMemcpy(yr, res0, (size_t)M * N * 4, cudaMemcpyDeviceToDevice));
            v.run(st);
            CK(cudaStreamSynchronize(st));
            std::vector<float> out((size_t)M * N);
            CK(cudaMemcpy(out.data(), yr, out.size() * 4, cudaMemcpyDeviceToHost));
            double e = 0, r = 0;
            for (size_t i = 0; i < out.size(); i++) {
                const double d = (double)out[i] - ref[i];
                e += d * d, r += (double)ref[i] * ref[i];
            }
            const double rel = sqrt(e / r);
            if (!(rel <= 1e-4)) {
                printf("  %-40s INVALID (rel_l2 %.3g against cuBLASLt)\n", v.name.c_str(), rel);
                continue;
            }
            const float t = once ? 1.f : time_graph(v.run, st);
            printf("  %-40s %8.2f us (%.0f TFLOP/s, %.2fx cuBLASLt)  rel_l2 %.1e\n", v.name.c_str(), t,
                   flop / t / 1e6, t_lt / t, rel);
        }
        CK(cudaFree(x));
        CK(cudaFree(W));
        CK(cudaFree(ybf));
        CK(cudaFree(yr));
        CK(cudaFree(res0));
        CK(cudaFree(bias32));
    }
    // The LayerNorm fold (qkv and fc): ours with the statistics from the parts, against cuBLASLt + the
    // LayerNorm kernel (timed apart, then summed).
    for (int si = 0; si < 4 && getenv("PROBE_FOLD"); si += 2) {
        if (only >= 0 && si != only) continue;
        auto &sh = shapes[si];
        const int N = sh.N, K = sh.K, nparts = K / 48;
        std::vector<bf16> xh = rnd_bf16((size_t)M * K, 1.f);
        bf16 *x = upload(xh), *W = upload(rnd_bf16((size_t)N * K, 0.04f)), *y, *P;
        std::vector<float> b32(N), s32(N), c32(M), zero(N, 0.f);
        std::vector<float2> parts((size_t)M * nparts);
        const float cnt = (float)K / nparts;
        for (auto &e : b32) e = 0.1f * frand();
        for (auto &e : s32) e = frand();
        for (auto &e : c32) e = 0.2f * frand();
        for (auto &e : parts) e = make_float2(cnt * 0.3f * frand(), cnt * (1.f + 0.5f * frand()));
        float *bias32 = upload(b32), *s_d = upload(s32), *c_d = upload(c32), *zero_d = upload(zero);
        float2 *parts_d = upload(parts);
        CK(cudaMalloc(&y, (size_t)M * N * 2));
        CK(cudaMalloc(&P, (size_t)M * N * 2));
        // reference: P = copy W^T (bf16) by cuBLASLt, then rstd P - (mean - c) rstd s + b' here
        bf16 *zero16 = upload(rnd_bf16(N, 0.f));
        if (matmul_lt(lt, MATMUL_LT_BIAS, P, N, x, W, DTYPE_BF16, zero16, M, N, K, NULL, st)) exit(3);
        CK(cudaStreamSynchronize(st));
        const std::vector<float> Ph = download_bf16(P, (size_t)M * N);
        std::vector<float> ref((size_t)M * N);
        for (int m = 0; m < M; m++) {
            float sum = 0.f, m2 = 0.f;
            for (int j = 0; j < nparts; j++) sum += parts[(size_t)m * nparts + j].x;
            const float mean = sum / K;
            for (int j = 0; j < nparts; j++) {
                const float d = parts[(size_t)m * nparts + j].x - cnt * mean;
                m2 += d * d / cnt + parts[(size_t)m * nparts + j].y;
            }
            const float rstd = 1.f / sqrtf(m2 / K + 1e-5f), rb = (mean - c32[m]) * rstd;
            for (int n = 0; n < N; n++) ref[(size_t)m * N + n] = rstd * Ph[(size_t)m * N + n] - rb * s32[n] + b32[n];
        }
        // cuBLASLt + the LayerNorm kernel: the engine's route at 8,192 rows
        bf16 *b16 = upload(rnd_bf16(N, 0.1f)), *ln_out;
        float *xf, *lw = upload(std::vector<float>(K, 1.f)), *lb = upload(std::vector<float>(K, 0.f));
        CK(cudaMalloc(&xf, (size_t)M * K * 4));
        CK(cudaMalloc(&ln_out, (size_t)M * K * 2));
        CK(cudaMemset(xf, 0, (size_t)M * K * 4));
        auto lt_run = [&](cudaStream_t s) {
            if (matmul_lt(lt, MATMUL_LT_BIAS, y, N, x, W, DTYPE_BF16, b16, M, N, K, NULL, s)) exit(3);
        };
        auto ln_run = [&](cudaStream_t s) { CK(layernorm_forward(ln_out, xf, lw, lb, M, K, DTYPE_BF16, s)); };
        const float t_lt = time_graph(lt_run, st), t_ln = time_graph(ln_run, st);
        printf("%s, LayerNorm folded %d x %d x %d: cuBLASLt %.2f us + LayerNorm kernel %.2f us = %.2f us\n", sh.name, M,
               N, K, t_lt, t_ln, t_lt + t_ln);
        const FoldArgs fa = {parts_d, c_d, s_d, nparts};
        const Variant vs[] = {
            make_variant<192, 4, false, false, false, false, 6, false, false, false, 0, 4>(x, W, y, bias32, M, N, K, sms),
            make_variant<192, 4, false, false, false, false, 6, false, false, false, 0, 4, true>(x, W, y, bias32, M, N, K,
                                                                                                 sms, NULL, fa),
            make_variant<192, 4, false, false, false, false, 6, false, false, false, 0, 4, true, 1>(x, W, y, bias32, M, N,
                                                                                                    K, sms, NULL, fa),
            make_variant<192, 4, false, false, false, false, 6, false, false, false, 0, 4, true, 2>(x, W, y, bias32, M, N,
                                                                                                    K, sms, NULL, fa),
            make_variant<192, 4, false, false, false, false, 6, false, false, false, 0, 4, true, 3>(x, W, y, bias32, M, N,
                                                                                                    K, sms, NULL, fa),
            make_variant<192, 4, false, false, false, false, 6, false, false, false, 0, 4, true, 4>(x, W, y, bias32, M, N,
                                                                                                    K, sms, NULL, fa),
        };
        for (const Variant &v : vs) {
            if (v.name.empty()) continue;
            const bool folded = v.name.find("folded") != std::string::npos;
            CK(cudaMemset(y, 0xff, (size_t)M * N * 2));
            v.run(st);
            CK(cudaStreamSynchronize(st));
            const std::vector<float> out = download_bf16(y, (size_t)M * N);
            double e = 0, r = 0;
            for (size_t i = 0; i < out.size() && folded; i++) {
                const double d = (double)out[i] - ref[i];
                e += d * d, r += (double)ref[i] * ref[i];
            }
            const double rel = folded ? sqrt(e / r) : 0.0;
            if (!(rel <= 1e-2) && v.name.find("diag 1") == std::string::npos &&
                v.name.find("diag 2") == std::string::npos) {
                printf("  %-40s INVALID (rel_l2 %.3g against the fold's reference)\n", v.name.c_str(), rel);
                continue;
            }
            const float t = time_graph(v.run, st);
            printf("  %-40s %8.2f us (%.2fx cuBLASLt + LayerNorm)  rel_l2 %.1e%s\n", v.name.c_str(), t,
                   (t_lt + t_ln) / t, rel, folded ? "" : " (not checked: bias only)");
        }
        for (void *p : {(void *)x, (void *)W, (void *)y, (void *)P, (void *)bias32, (void *)s_d, (void *)c_d,
                        (void *)zero_d, (void *)parts_d, (void *)zero16, (void *)b16, (void *)xf, (void *)lw,
                        (void *)lb, (void *)ln_out})
            CK(cudaFree(p));
    }
    matmul_lt_free(lt);
    return 0;
}
