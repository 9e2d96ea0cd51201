// The logits of a few rows on Hopper (logits_rows.h): x resident, W streamed through a ring of TMA
// slices by a producer warp, one wgmma warpgroup multiplying, one block an SM, persistent over W's
// 64-row tiles.
//
// Shared memory of a block, 1024-byte aligned (the 128-byte swizzle's period):
//   x_tiles  x's RB rows as K/64 slices of RB rows x 64 k (RB x 128 bytes each), loaded once
//   ring     STAGES slots of one W slice each: 64 rows x 64 k, 8 KB
//   row_best greedy: the block's best rank key (rank_key.cuh) of each row, then its ticket
//   barriers x_full (x landed), full[STAGES] (a slot's slice landed: TMA's bytes), empty[STAGES]
//            (a slot's slice multiplied: one arrival per multiplying warp)
// The ring's i-th slice (the block's tiles in order, each tile's K/64 slices in order) goes to slot
// i % STAGES; its (i / STAGES)-th use, so the producer waits on empty's phase (i / STAGES - 1) & 1
// before refilling it and the warpgroup on full's phase (i / STAGES) & 1 before multiplying it.
#include <stdint.h>
#include <stdlib.h>

#include "gemm_rows.h"  // gemm_rows_available
#include "greedy_pick.cuh"
#include "kernel_util.h"
#include "logits_rows.h"
#include "pdl.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace {

constexpr int BK = 64;                          // k per slice: one 128-byte swizzled row of bf16
constexpr int BF = 64;                          // W rows (logits columns) a tile: wgmma's M
constexpr int MMA_THREADS = 128;                // one warpgroup multiplies
constexpr int THREADS = MMA_THREADS + 32;       // and one warp loads
constexpr int W_SLICE = BF * BK * 2;
constexpr int MIN_STAGES = 4, MAX_STAGES = 16;  // 32-128 KB of W in flight an SM

// Shared memory of a block for RB rows of K and STAGES ring slots, the alignment slack included.
constexpr size_t smem_bytes(int K, int rb, int stages) {
    const size_t slices = (K + BK - 1) / BK;
    return 1024 + slices * rb * BK * 2 + (size_t)stages * W_SLICE +
           (rb + 1 + 1 + 2 * (size_t)stages) * sizeof(uint64_t);
}

// ----------------------------------------------------------------------------
// Greedy decoding's pick (logits_rows.h's LogitsGreedy)
//
// Each multiplying thread keeps the largest logit of each of its 2 J rows over the block's tiles and
// its first column (best[j][e & 1] for row 8 j + 2 (lane % 4) + (e & 1): one float compare a
// value, as a thread meets a row's columns in increasing order). At the end, as rank keys
// (rank_key.cuh), the 8 lanes that share a row meet by shuffles, the 4 warps in shared memory, and
// greedy_publish (greedy_pick.cuh) takes the block's bests to the grid's. Called by the 128
// multiplying threads (the producer warp has returned), so its barriers are named.
struct RowBest {
    float logit;
    int id;  // -1: none yet
};

template <int J>
__device__ void greedy_finish(const RowBest (&best)[J][2], const LogitsGreedy &greedy, unsigned long long *row_best,
                              int M, int tid) {
    constexpr int RB = 8 * J;
    const int lane = tid % 32;
    auto barrier = [] { asm volatile("bar.sync 1, %0;" ::"n"(MMA_THREADS) : "memory"); };
    for (int r = tid; r < RB; r += MMA_THREADS) row_best[r] = 0ull;
    barrier();
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int p = 0; p < 2; p++) {
            const RowBest r = best[j][p];
            unsigned long long b = r.id < 0 ? 0ull : rank_key(float_key(r.logit), r.id);
#pragma unroll
            for (int o = 4; o < 32; o *= 2) b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
            if (lane < 4 && b) atomicMax(&row_best[8 * j + 2 * lane + p], b);
        }
    barrier();
    greedy_publish(greedy, row_best, reinterpret_cast<unsigned *>(row_best + RB), 0, M, tid, MMA_THREADS, barrier);
}

// ----------------------------------------------------------------------------
// The kernel
//
// Block b owns tiles b, b + gridDim.x, ... (the grid is at most the tiles: every block has one):
// logits columns f0 = 64 tile.. of all M rows. Accumulator tile j of a thread (wgmma.cuh's layout,
// A = W: its rows are y's columns) holds columns fa = f0 + 16 warp + lane / 4 and fa + 8, rows
// t = 8 j + 2 (lane % 4) and t + 1: acc[j] = {(fa, t), (fa, t+1), (fa+8, t), (fa+8, t+1)}.

template <int RB, int STAGES>
__global__ void __launch_bounds__(THREADS, 1)
    logits_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map, float *y,
                  long long ldy, LogitsGreedy greedy, int M, int N, int K) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    constexpr int J = RB / 8;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const int slices = (K + BK - 1) / BK, tiles = (N + BF - 1) / BF;
    const int my_tiles = (tiles - 1 - blockIdx.x) / gridDim.x + 1;
    const int items = my_tiles * slices;  // the ring's slices, over the block's tiles
    unsigned char *x_tiles = smem, *ring = smem + (size_t)slices * RB * BK * 2;
    unsigned long long *row_best =
        reinterpret_cast<unsigned long long *>(ring + (size_t)STAGES * W_SLICE);  // [RB], then the ticket
    uint64_t *x_full = reinterpret_cast<uint64_t *>(row_best + RB + 1), *full = x_full + 1, *empty = full + STAGES;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    pdl_launch_dependents();
    if (tid == 0) {
        mbar_init(x_full, 1);
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], MMA_THREADS / 32);
        mbar_fence_init();
    }
    __syncthreads();  // the barriers are initialised

    if (warp == MMA_THREADS / 32) {  // the producer
        if (lane == 0) {
            tma_prefetch_map(&w_map), tma_prefetch_map(&x_map);
            for (int i = 0; i < items; i++) {
                const int slot = i % STAGES, use = i / STAGES;
                if (use > 0) mbar_wait(&empty[slot], (use - 1) & 1);
                const int tile = blockIdx.x + (i / slices) * gridDim.x, s = i % slices;
                mbar_arrive_expect_tx(&full[slot], W_SLICE);
                tma_load(ring + (size_t)slot * W_SLICE, &w_map, s * BK, tile * BF, &full[slot]);
                if (i == min(items, STAGES) - 1) {  // the ring is full: now x (written by the step)
                    pdl_wait();
                    mbar_arrive_expect_tx(x_full, slices * RB * BK * 2);
                    for (int k = 0; k < slices; k++)
                        tma_load(x_tiles + (size_t)k * RB * BK * 2, &x_map, k * BK, 0, x_full);
                }
            }
        }
        return;
    }

    pdl_wait();
    RowBest best[J][2];  // greedy: the largest logit of rows 8 j + 2 (lane % 4) and the next, and its column
#pragma unroll
    for (int j = 0; j < J; j++) best[j][0] = best[j][1] = RowBest{-INFINITY, -1};
    mbar_wait(x_full, 0);
    const int fa_in_tile = 16 * warp + lane / 4;
    for (int i = 0, n = 0; n < my_tiles; n++) {
        const int f0 = (blockIdx.x + n * gridDim.x) * BF;
        // Two accumulator sets, a slice's k16 MMAs alternately into each (wgmma_slice_ss2): a slot is
        // freed only when its slice's MMAs are done, and at 64 rows one chain of four held each
        // slot's cycle long enough to slow W's stream (docs/PERF.md, "Session 52").
        WgmmaTile<RB, 2> tile;
        tile.zero();
        // Each slice's MMAs a group, issued as the slice lands. Unrolled as the compiler chooses: it waits
        // every slice, and by 1 or by 2 the step was even (docs/PERF.md, "Session 57").
        for (int s = 0; s < slices; s++, i++) {
            const int slot = i % STAGES;
            mbar_wait(&full[slot], (i / STAGES) & 1);
            tile.slice(ring + (size_t)slot * W_SLICE, x_tiles + (size_t)s * RB * BK * 2);
            wgmma_wait<1>();  // the previous slice's MMAs are done: its slot is free
            tile.hold();
            if (s > 0 && lane == 0) mbar_arrive(&empty[(i - 1) % STAGES]);
        }
        wgmma_wait<0>();
        tile.hold();
        if (lane == 0) mbar_arrive(&empty[(i - 1) % STAGES]);
        tile.sum();
        const auto &acc = tile.d;
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int t = 8 * j + 2 * (lane % 4) + (e & 1), h = e >> 1, f = f0 + fa_in_tile + 8 * h;
                if (t >= M || f >= N) continue;
                const float v = acc[j][e];
                if (!greedy.ids_only) y[t * ldy + f] = v;
                if (greedy.next && v > best[j][e & 1].logit) best[j][e & 1] = RowBest{v, f};
            }
    }
    if (greedy.next) greedy_finish<J>(best, greedy, row_best, M, tid);
}

// ----------------------------------------------------------------------------
// Host side: tile choice, tensor maps, launch

// Rows a block: x's M rows rounded up to a wgmma width.
int pick_rows(int M) { return M <= 16 ? 16 : M <= 32 ? 32 : 64; }

// The ring's slots: as many as fit beside x, to MAX_STAGES (0 where not even MIN_STAGES fit).
int pick_stages(int K, int rb) {
    const size_t optin = (size_t)device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(0);
    int stages = MAX_STAGES;
    while (stages >= MIN_STAGES && smem_bytes(K, rb, stages) > optin) stages /= 2;
    return stages >= MIN_STAGES ? stages : 0;
}

template <int RB, int STAGES>
cudaError_t launch(float *y, long long ldy, const void *x, long long ldx, const void *W, int M, int N, int K,
                   const LogitsGreedy &greedy, cudaStream_t stream) {
    CUtensorMap x_map, w_map;
    if (!tensor_map(&x_map, x, M, K, ldx, RB) || !tensor_map(&w_map, W, N, K, K, BF)) return cudaErrorInvalidValue;
    const size_t smem = smem_bytes(K, RB, STAGES);
    static size_t smem_set;  // per instantiation: the largest allowed so far
    if (smem > smem_set) {
        const cudaError_t e =
            cudaFuncSetAttribute(logits_kernel<RB, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        smem_set = smem;
    }
    const int tiles = (N + BF - 1) / BF, sms = device_attr<cudaDevAttrMultiProcessorCount>(1);
    return launch_pdl(logits_kernel<RB, STAGES>, dim3(tiles < sms ? tiles : sms), dim3(THREADS), smem, stream, x_map,
                      w_map, y, ldy, greedy, M, N, K);
}

template <int RB>
cudaError_t launch_stages(int stages, float *y, long long ldy, const void *x, long long ldx, const void *W, int M,
                          int N, int K, const LogitsGreedy &greedy, cudaStream_t stream) {
    switch (stages) {
    case 4: return launch<RB, 4>(y, ldy, x, ldx, W, M, N, K, greedy, stream);
    case 8: return launch<RB, 8>(y, ldy, x, ldx, W, M, N, K, greedy, stream);
    default: return launch<RB, 16>(y, ldy, x, ldx, W, M, N, K, greedy, stream);
    }
}

cudaError_t launch_rows(int rb, int stages, float *y, long long ldy, const void *x, long long ldx, const void *W,
                        int M, int N, int K, const LogitsGreedy &greedy, cudaStream_t stream) {
    switch (rb) {
    case 16: return launch_stages<16>(stages, y, ldy, x, ldx, W, M, N, K, greedy, stream);
    case 32: return launch_stages<32>(stages, y, ldy, x, ldx, W, M, N, K, greedy, stream);
    default: return launch_stages<64>(stages, y, ldy, x, ldx, W, M, N, K, greedy, stream);
    }
}

}  // namespace

extern "C" int logits_rows_takes(int M, int K) {
    static int off = -1;
    if (off < 0) off = env_off("GPT2_LOGITS_ROWS");
    return !off && gemm_rows_available() && M >= 1 && M <= 64 && K > 0 && K % 8 == 0 &&
           pick_stages(K, pick_rows(M)) > 0;
}

extern "C" cudaError_t logits_rows(float *y, long long ldy, const void *x, long long ldx, const void *W, int M, int N,
                                   int K, const LogitsGreedy *greedy, cudaStream_t stream) {
    if (M < 1 || N <= 0 || K <= 0 || ldy < N || ldx < K || !y || !x || !W ||
        (greedy && (!greedy->next || !greedy->best || !greedy->ticket)))
        return cudaErrorInvalidValue;
    if (!logits_rows_takes(M, K) || ldx % 8 || (uintptr_t)x % 16 || (uintptr_t)W % 16 ||
        (greedy && (uintptr_t)greedy->best % 8))
        return cudaErrorNotSupported;
    const int rb = pick_rows(M), stages = pick_stages(K, rb);
    const LogitsGreedy no_greedy = {};
    return launch_rows(rb, stages, y, ldy, x, ldx, W, M, N, K, greedy ? *greedy : no_greedy, stream);
}
