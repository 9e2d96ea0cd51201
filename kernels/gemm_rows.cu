// Products of a few rows on Hopper (gemm_rows.h): W's tile by TMA before the PDL wait, x's rows by
// TMA after it, one wgmma warpgroup with W as the A operand, K split over a cluster's blocks where
// the tile does not fit; and the residual product that also writes the next LayerNorm's output.
//
// Shared memory of a block, 1024-byte aligned (the 128-byte swizzle's period), for its part of K:
//   w_tiles  its K/64/ks slices of W's 64 rows x 64 k (8 KB each), as TMA lands them under the swizzle
//   x_tiles  the same slices of x's RB rows x 64 k (RB x 128 bytes each)
//   partial  K split (ks > 1): its partial sums of the 64 x RB tile, fp32, for the cluster to add
//   lnsm     LN (the LayerNorm in the residual epilogue): its row statistics, 8 RB floats
//   barriers one for all of W (before the wait), one per x slice (each thread waits on the slice
//            it multiplies next, so the MMAs start while later slices are still in flight)
#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "cluster.cuh"
#include "gemm_rows.h"
#include "kernel_util.h"
#include "pdl.cuh"
#include "wgmma.cuh"

namespace {

constexpr int BK = 64;          // k per slice: one 128-byte swizzled row of bf16
constexpr int BF = 64;          // W rows (output columns) a block: wgmma's M
constexpr int THREADS = 128;    // one warpgroup
constexpr int W_SLICE = BF * BK * 2;
constexpr int MAX_SPLIT = 8;    // the most blocks K splits over: the portable cluster size
constexpr int PSTR = BF + 4;    // a row of partial sums: 64 columns, padded against bank conflicts
constexpr int MAX_LN_BLOCKS = 16;  // the LayerNorm epilogue's largest cluster (a non-portable size)

// K's slices a block multiplies when K splits over ks blocks.
constexpr int part_slices(int K, int ks) { return ((K + BK - 1) / BK + ks - 1) / ks; }

// Shared memory of a block for K over ks blocks and RB rows, the alignment slack included; ln: the
// LayerNorm's row statistics (8 floats a row: below).
constexpr size_t smem_bytes(int K, int rb, int ks, bool ln = false) {
    const size_t slices = part_slices(K, ks);
    return 1024 + slices * (W_SLICE + (size_t)rb * BK * 2) + (ks > 1 ? (size_t)rb * PSTR * sizeof(float) : 0) +
           (ln ? (size_t)rb * 8 * sizeof(float) : 0) + (1 + slices) * sizeof(uint64_t);
}

// Where the epilogue writes (matmul_lt.h's table): y [M, N] rows ldy apart, bias [N] of y's type;
// with the LayerNorm, ln [M, N] (bf16, rows N apart) = LayerNorm(y's new rows) * gamma + beta.
struct Out {
    void *y;
    long long ldy;
    const void *bias;
    const float *gamma, *beta;
    bf16 *ln;
};

// ----------------------------------------------------------------------------
// mbarriers and TMA (PTX, sm_90a)

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SM90_ASM(...) __trap()
#else
#define SM90_ASM(...) asm volatile(__VA_ARGS__)
#endif

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, int arrivals) {
    SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA's completions) and to the cluster.
__device__ __forceinline__ void mbar_fence_init() { SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// This thread's arrival, announcing `bytes` of TMA traffic the phase must also wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Returns once the barrier's first phase (parity 0) has completed.
__device__ __forceinline__ void mbar_wait0(uint64_t *bar) {
    uint32_t done = 0;
    do {
        SM90_ASM("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar))
                 : "memory");
    } while (!done);
}
// The box of `map` at (k, row) into shared memory; its bytes count against `bar`.
__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, int k, int row, uint64_t *bar) {
    SM90_ASM("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
                 "r"(smem_addr(dst)),
             "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(smem_addr(bar))
             : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map) {
    SM90_ASM("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

#undef SM90_ASM

// ----------------------------------------------------------------------------
// The LayerNorm of the new rows (LN: the attention projection, whose output fc reads normalised)
//
// The cluster's blocks hold all N columns of RB rows, 64 each. Exact two-level statistics: each
// block takes its mean and M2 = sum (v - mean)^2 over its 64 columns (two passes over registers),
// and the blocks' pairs combine (Chan et al.: with equal counts, the mean of the means, and
// M2 = sum M2_b + 64 sum (mean_b - mean)^2). No sum of raw squares, so a row whose mean is large
// against its spread keeps its variance.
// Shared memory (8 RB floats): red [4 warps][RB], stats [RB] (mean_b, M2_b: read by the whole
// cluster), row [RB] (mean, rstd).

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

// ln's rows r0.. from v (the new rows' values, as above; 0 past M) and gamma, beta at the thread's
// columns fa, fa + 8. Every thread of the cluster calls it; it ends with the cluster's barrier.
template <int RB>
__device__ __forceinline__ void layernorm_rows(const float (&v)[RB / 2], const float (&gamma)[2],
                                               const float (&beta)[2], bf16 *ln, float *lnsm, int r0, int fa, int M,
                                               int N, int warp, int lane, int tid) {
    float *red = lnsm;
    float2 *stats = reinterpret_cast<float2 *>(lnsm + 4 * RB), *row = stats + RB;
    const float sum = block_row_sum<RB>(v, red, warp, lane, tid);
    if (tid < RB) row[tid].x = sum / BF;
    __syncthreads();
    float d[RB / 2];
#pragma unroll
    for (int i = 0; i < RB / 2; i++) {
        const float c = v[i] - row[8 * (i / 4) + 2 * (lane % 4) + (i & 1)].x;
        d[i] = c * c;
    }
    const float m2 = block_row_sum<RB>(d, red, warp, lane, tid);
    if (tid < RB) stats[tid] = make_float2(row[tid].x, m2);
    cluster_arrive();  // release: stats are visible to the cluster
    cluster_wait();
    if (tid < RB) {  // each block's pair loaded once, all loads in flight together
        const int blocks = N / BF;  // the cluster's
        float2 pair[MAX_LN_BLOCKS];
        float mean = 0.0f, M2 = 0.0f;
#pragma unroll
        for (int b = 0; b < MAX_LN_BLOCKS; b++)
            if (b < blocks) pair[b] = ld_cluster2(cluster_map(&stats[tid], b));
#pragma unroll
        for (int b = 0; b < MAX_LN_BLOCKS; b++)
            if (b < blocks) mean += pair[b].x;
        mean /= blocks;
#pragma unroll
        for (int b = 0; b < MAX_LN_BLOCKS; b++)
            if (b < blocks) {
                const float mb = pair[b].x - mean;
                M2 += pair[b].y + BF * mb * mb;
            }
        row[tid] = make_float2(mean, rsqrtf(M2 / N + 1e-5f));  // biased variance, as GPT-2's
    }
    cluster_arrive();  // this block has read the others' stats
    __syncthreads();
#pragma unroll
    for (int i = 0; i < RB / 2; i++) {
        const int lr = 8 * (i / 4) + 2 * (lane % 4) + (i & 1), t = r0 + lr, h = (i >> 1) & 1;
        if (t < M)
            ln[(size_t)t * N + fa + 8 * h] = from_f32<bf16>((v[i] - row[lr].x) * row[lr].y * gamma[h] + beta[h]);
    }
    cluster_wait();  // no block leaves while another reads its stats
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
// With K whole (KS = 1) a thread finishes the values its accumulators hold. With K split, each block
// stores its partial tile into its shared memory, and after a cluster barrier block kp sums columns
// f0 + kp CW.. (CW = 64 / KS) over the cluster's blocks in rank order (the same bits every run):
// thread tid finishes column f0 + kp CW + tid % CW at rows r0 + tid / CW + (128 / CW) i.
// KS is a template argument, not a kernel argument: with the cluster code in the kernel and KS = 1
// picked at run time, every product ran 0.4-1.7 us slower (docs/PERF.md, "Session 22").
// LN (the residual epilogue, K whole): the N / 64 column blocks of a row block are one cluster,
// and after the residual add they write ln (layernorm_rows above).

template <int RB, int EPI, int KS, bool LN>
__global__ void __launch_bounds__(THREADS, 1)
    rows_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map, Out out, int M,
                int N, int K) {
    static_assert(!LN || (EPI == MATMUL_LT_BIAS_RESIDUAL && KS == 1), "the LayerNorm follows a residual add");
    constexpr bool residual = EPI == MATMUL_LT_BIAS_RESIDUAL;
    typedef typename std::conditional<residual || EPI == MATMUL_LT_NONE, float, bf16>::type YT;
    constexpr bool split = KS > 1;
    constexpr int J = RB / 8, CW = BF / KS;  // CW: split, the columns of the tile this block finishes
    constexpr int NV = split ? RB * CW / THREADS : RB / 2;  // the values a thread finishes
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const int per = part_slices(K, KS), kp = blockIdx.x % KS;
    const int s0 = kp * per, slices = max(0, min(per, (K + BK - 1) / BK - s0));  // this block's slices
    unsigned char *w_tiles = smem, *x_tiles = smem + (size_t)per * W_SLICE;
    float *partial = reinterpret_cast<float *>(x_tiles + (size_t)per * RB * BK * 2);  // [RB][PSTR] when split
    float *lnsm = partial + (split ? RB * PSTR : 0);                                      // [8 RB] with LN
    uint64_t *w_full = reinterpret_cast<uint64_t *>(lnsm + (LN ? 8 * RB : 0)), *x_full = w_full + 1;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int f0 = blockIdx.x / KS * BF, r0 = blockIdx.y * RB;

    pdl_launch_dependents();
    if (tid == 0) {
        mbar_init(w_full, 1);
        for (int s = 0; s < slices; s++) mbar_init(&x_full[s], 1);
        mbar_fence_init();
        tma_prefetch_map(&w_map), tma_prefetch_map(&x_map);
        mbar_arrive_expect_tx(w_full, slices * W_SLICE);  // the weights: nothing earlier in the step writes them
        for (int s = 0; s < slices; s++) tma_load(w_tiles + (size_t)s * W_SLICE, &w_map, (s0 + s) * BK, f0, w_full);
    }
    // The values this thread finishes, the i-th at (row_of(i), col_of(i)).
    const int fa = f0 + 16 * warp + lane / 4;
    auto row_of = [&](int i) {
        return split ? r0 + tid / CW + i * (THREADS / CW) : r0 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
    };
    auto col_of = [&](int i) { return split ? f0 + kp * CW + tid % CW : fa + 8 * ((i >> 1) & 1); };
    float bias[2] = {0.0f, 0.0f};  // at col_of(0) and col_of(2)
    if (EPI != MATMUL_LT_NONE)
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (col_of(2 * h) < N) bias[h] = to_f32(static_cast<const YT *>(out.bias)[col_of(2 * h)]);
    float gamma[2] = {0.0f, 0.0f}, beta[2] = {0.0f, 0.0f};
    if constexpr (LN)
#pragma unroll
        for (int h = 0; h < 2; h++) gamma[h] = out.gamma[fa + 8 * h], beta[h] = out.beta[fa + 8 * h];
    __syncthreads();  // the barriers are initialised
    pdl_wait();

    if (tid == 0)
        for (int s = 0; s < slices; s++) {
            mbar_arrive_expect_tx(&x_full[s], RB * BK * 2);
            tma_load(x_tiles + (size_t)s * RB * BK * 2, &x_map, (s0 + s) * BK, r0, &x_full[s]);
        }
    // The residual's old values, read while x lands (after the wait: the previous kernel writes them).
    float res[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int t = row_of(i), f = col_of(i);
        res[i] = residual && t < M && f < N ? static_cast<const float *>(out.y)[t * out.ldy + f] : 0.0f;
    }

    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    mbar_wait0(w_full);
    for (int s = 0; s < slices; s++) {  // each slice's MMAs a group, issued as the slice lands
        mbar_wait0(&x_full[s]);
        const uint64_t wd = wgmma_desc_sw128(w_tiles + (size_t)s * W_SLICE);
        const uint64_t xd = wgmma_desc_sw128(x_tiles + (size_t)s * RB * BK * 2);
        wgmma_hold(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) wgmma_ss<RB>(acc, wd + 2 * kk, xd + 2 * kk);  // +32 bytes a k16
        wgmma_commit();
        wgmma_hold(acc);
    }
    wgmma_wait<0>();
    wgmma_hold(acc);

    if constexpr (split) {  // this block's partial tile, [row][column], for the cluster to sum
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                partial[(8 * j + 2 * (lane % 4) + (e & 1)) * PSTR + 16 * warp + lane / 4 + 8 * (e >> 1)] = acc[j][e];
        cluster_arrive();  // release: the partial tiles are visible to the cluster's acquire
        cluster_wait();
    }
    float fin[NV];  // LN: the new rows' values (0 past M)
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int t = row_of(i), f = col_of(i);
        fin[i] = 0.0f;
        if (t >= M || f >= N) continue;
        float v = 0.0f;
        if constexpr (split) {
            const float *p = &partial[(t - r0) * PSTR + f - f0];
#pragma unroll
            for (int r = 0; r < KS; r++) v += ld_cluster(cluster_map(p, r));
        } else {
            v = acc[i / 4][i % 4];
        }
        v += bias[(i >> 1) & 1];
        if (EPI == MATMUL_LT_BIAS_GELU) v = gelu_tanh(v);
        if (residual) v += res[i];
        static_cast<YT *>(out.y)[t * out.ldy + f] = from_f32<YT>(v);
        fin[i] = v;
    }
    if constexpr (LN) layernorm_rows<RB>(fin, gamma, beta, out.ln, lnsm, r0, fa, M, N, warp, lane, tid);
    if constexpr (split) {  // no block leaves while the others read its partial tile
        cluster_arrive();
        cluster_wait();
    }
}

// ----------------------------------------------------------------------------
// Host side: tile choice, tensor maps, launch

// cuTensorMapEncodeTiled from the driver through the runtime (no -lcuda); NULL when unavailable.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    static bool tried;
    if (!tried) {
        tried = true;
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
        cudaGetLastError();
    }
    return fn;
}

// A bf16 [rows, K] row-major matrix read in boxes of box_rows x 64 under the 128-byte swizzle
// (rows and k past the end read as zeros).
bool tensor_map(CUtensorMap *map, const void *p, int rows, int K, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)K * 2};
    const cuuint32_t box[2] = {BK, (cuuint32_t)box_rows}, elem_strides[2] = {1, 1};
    return encode && encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(p), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The kernel's shared memory allowed up to smem (per instantiation: the largest so far), and, with
// the LayerNorm, clusters past the portable 8 blocks.
template <int RB, int EPI, int KS, bool LN> cudaError_t allow(size_t smem) {
    static size_t smem_set;
    if (smem <= smem_set) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(rows_kernel<RB, EPI, KS, LN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e == cudaSuccess && LN)
        e = cudaFuncSetAttribute(rows_kernel<RB, EPI, KS, LN>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e == cudaSuccess) smem_set = smem;
    return e;
}

template <int RB, int EPI, int KS, bool LN = false>
cudaError_t launch(const Out &out, const void *x, const void *W, int M, int N, int K, cudaStream_t stream) {
    CUtensorMap x_map, w_map;
    if (!tensor_map(&x_map, x, M, K, RB) || !tensor_map(&w_map, W, N, K, BF)) return cudaErrorInvalidValue;
    const size_t smem = smem_bytes(K, RB, KS, LN);
    const cudaError_t e = allow<RB, EPI, KS, LN>(smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((N + BF - 1) / BF * KS, (M + RB - 1) / RB);
    return launch_pdl_cluster(rows_kernel<RB, EPI, KS, LN>, grid, dim3(THREADS), smem, LN ? grid.x : KS, stream,
                              x_map, w_map, out, M, N, K);
}

template <int RB, int EPI>
cudaError_t launch_split(int ks, const Out &out, const void *x, const void *W, int M, int N, int K,
                         cudaStream_t stream) {
    switch (ks) {
    case 1: return launch<RB, EPI, 1>(out, x, W, M, N, K, stream);
    case 2: return launch<RB, EPI, 2>(out, x, W, M, N, K, stream);
    case 4: return launch<RB, EPI, 4>(out, x, W, M, N, K, stream);
    default: return launch<RB, EPI, 8>(out, x, W, M, N, K, stream);
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

// The blocks K splits over: the fewest whose part of the W tile fits. Splitting a K that fits whole
// only lost (docs/PERF.md, "Session 22": the cluster barrier and the partial tiles' adds cost more
// than the shorter MMAs save, 0.5-1.5 us at GPT-2's K = 768). GPT2_ROWS_SPLIT=1|2|4|8 forces one
// where it fits.
int pick_split(int K, int rb) {
    static int forced = -1;
    const int f = env_knob("GPT2_ROWS_SPLIT", &forced);
    if ((f == 1 || f == 2 || f == 4 || f == 8) && fits(K, rb, f)) return f;
    int ks = 1;
    while (ks < MAX_SPLIT && !fits(K, rb, ks)) ks *= 2;
    return ks;
}

// Rows a block: 16 to 16 rows, 32 to 32, and past 32 rows 32 where K is whole (two row blocks at
// 64: half of x's bytes after the wait, for twice the W reads before it) but 64 where K splits (a
// split tile's partial sums and cluster barrier cost the same for 64 rows as for 32). Measured in
// docs/PERF.md, "Session 21" and "Session 22": at 48-64 rows, K whole, 64 a block is within 2% for
// qkv and fc and 14-20% slower for the projection, 16 a block 1.6x slower for fc; the MLP projection
// (K = 3072 over 4 blocks) 4.71 / 5.04 us at 48 / 64 rows with 64 a block, 5.18 / 5.42 with 32.
// GPT2_ROWS_TILE=16|32|64 forces one.
int pick_rows(int M, int K) {
    static int forced = -1;
    const int rb = env_knob("GPT2_ROWS_TILE", &forced);
    if (rb == 16 || rb == 32 || rb == 64) return rb;
    if (M <= 16) return 16;
    return M <= 32 || fits(K, 32, 1) ? 32 : 64;
}

// 1 when clusters of `blocks` blocks of the LayerNorm kernel with RB rows and K fit on the device
// (asked of the driver once per size and shared memory: the engine asks at every product).
template <int RB> bool ln_cluster_fits(int blocks, int K) {
    static size_t yes[17], no[17];  // [blocks]: the most shared memory seen to fit, the least seen not to
    const size_t smem = smem_bytes(K, RB, 1, true);
    if (blocks < 1 || blocks > MAX_LN_BLOCKS) return false;
    if (smem <= yes[blocks]) return true;
    if (no[blocks] && smem >= no[blocks]) return false;
    const void *kernel = reinterpret_cast<const void *>(rows_kernel<RB, MATMUL_LT_BIAS_RESIDUAL, 1, true>);
    const bool ok = allow<RB, MATMUL_LT_BIAS_RESIDUAL, 1, true>(smem) == cudaSuccess &&
                    cluster_fits(kernel, blocks, THREADS, smem);
    (ok ? yes : no)[blocks] = smem;
    return ok;
}

// The LayerNorm kernel's shapes: N whole 64-column blocks, at most 16 of them (the largest cluster,
// a non-portable size), K whole in shared memory, and such a cluster fits on the device.
bool ln_fits(int N, int K, int rb) {
    if (N % BF || N / BF > MAX_LN_BLOCKS ||
        smem_bytes(K, rb, 1, true) > (size_t)device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(0))
        return false;
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
// "Session 22").
constexpr int ONE_WAVE_PAST = 32;

extern "C" int gemm_rows_takes(int M, int N, int K) {
    if (!gemm_rows_available() || M < 0 || M > 64 || N <= 0 || K <= 0 || K % 8) return 0;
    const int rb = pick_rows(M, K), ks = pick_split(K, rb);
    if (!fits(K, rb, ks)) return 0;
    const long long blocks = (long long)(N + BF - 1) / BF * ((M + rb - 1) / rb) * ks;
    return M <= ONE_WAVE_PAST || blocks <= device_attr<cudaDevAttrMultiProcessorCount>(0);
}

extern "C" cudaError_t gemm_rows_ex(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                                    const void *bias, int M, int N, int K, int rb, int ks, cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || ldy < N || !y || !x || !W || (epilogue != MATMUL_LT_NONE && !bias) ||
        epilogue < MATMUL_LT_NONE || epilogue > MATMUL_LT_BIAS_GELU || (rb && rb != 16 && rb != 32 && rb != 64) ||
        (ks && ks != 1 && ks != 2 && ks != 4 && ks != 8))
        return cudaErrorInvalidValue;
    if (!rb) rb = pick_rows(M, K);
    if (!gemm_rows_available() || M > 64 || K % 8 || (uintptr_t)x % 16 || (uintptr_t)W % 16)
        return cudaErrorNotSupported;
    if (!ks) ks = pick_split(K, rb);
    if (!fits(K, rb, ks)) return cudaErrorNotSupported;
    if (M == 0) return cudaSuccess;
    const Out out = {y, ldy, bias, NULL, NULL, NULL};
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

extern "C" int gemm_rows_ln_takes(int M, int N, int K) {
    static int off = -1;  // GPT2_ROWS_LN=0
    if (off < 0) off = getenv("GPT2_ROWS_LN") && strcmp(getenv("GPT2_ROWS_LN"), "0") == 0;
    return !off && gemm_rows_available() && M >= 0 && M <= 64 && N > 0 && K > 0 && K % 8 == 0 &&
           ln_fits(N, K, pick_rows(M, K));
}

extern "C" cudaError_t gemm_rows_residual_ln(float *y, const void *x, const void *W, const float *bias,
                                             const float *gamma, const float *beta, void *ln, int M, int N, int K,
                                             int rb, cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || !y || !x || !W || !bias || !gamma || !beta || !ln ||
        (rb && rb != 16 && rb != 32 && rb != 64))
        return cudaErrorInvalidValue;
    if (!rb) rb = pick_rows(M, K);
    if (!gemm_rows_available() || M > 64 || K % 8 || (uintptr_t)x % 16 || (uintptr_t)W % 16 || !ln_fits(N, K, rb))
        return cudaErrorNotSupported;
    if (M == 0) return cudaSuccess;
    const Out out = {y, N, bias, gamma, beta, static_cast<bf16 *>(ln)};
    switch (rb) {
    case 16: return launch<16, MATMUL_LT_BIAS_RESIDUAL, 1, true>(out, x, W, M, N, K, stream);
    case 32: return launch<32, MATMUL_LT_BIAS_RESIDUAL, 1, true>(out, x, W, M, N, K, stream);
    default: return launch<64, MATMUL_LT_BIAS_RESIDUAL, 1, true>(out, x, W, M, N, K, stream);
    }
}
