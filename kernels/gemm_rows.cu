// Products of a few rows on Hopper (gemm_rows.h): W's tile by TMA before the PDL wait, x's rows by
// TMA after it, one wgmma warpgroup with W as the A operand, K split over a cluster's blocks.
//
// Shared memory of a block, 1024-byte aligned (the 128-byte swizzle's period), for its part of K:
//   w_tiles  its K/64/ks slices of W's 64 rows x 64 k (8 KB each), as TMA lands them under the swizzle
//   x_tiles  the same slices of x's RB rows x 64 k (RB x 128 bytes each)
//   partial  K split (ks > 1): its partial sums of the 64 x RB tile, fp32, for the cluster to add
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
constexpr int PSTR = BF + 4;    // a row of partial sums: 64 columns, padded so the stores below miss no bank

// K's slices a block multiplies when K splits over ks blocks.
constexpr int part_slices(int K, int ks) { return ((K + BK - 1) / BK + ks - 1) / ks; }

// Shared memory of a block for K over ks blocks and RB rows, the alignment slack included.
constexpr size_t smem_bytes(int K, int rb, int ks) {
    const size_t slices = part_slices(K, ks);
    return 1024 + slices * (W_SLICE + (size_t)rb * BK * 2) + (ks > 1 ? (size_t)rb * PSTR * sizeof(float) : 0) +
           (1 + slices) * sizeof(uint64_t);
}

// Where the epilogue writes (matmul_lt.h's table): y [M, N] rows ldy apart, bias [N] of y's type.
struct Out {
    void *y;
    long long ldy;
    const void *bias;
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

template <int RB, int EPI, int KS>
__global__ void __launch_bounds__(THREADS, 1)
    rows_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map, Out out, int M,
                int N, int K) {
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
    uint64_t *w_full = reinterpret_cast<uint64_t *>(partial + (split ? RB * PSTR : 0)), *x_full = w_full + 1;
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
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int t = row_of(i), f = col_of(i);
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
    }
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

template <int RB, int EPI, int KS>
cudaError_t launch(const Out &out, const void *x, const void *W, int M, int N, int K, cudaStream_t stream) {
    CUtensorMap x_map, w_map;
    if (!tensor_map(&x_map, x, M, K, RB) || !tensor_map(&w_map, W, N, K, BF)) return cudaErrorInvalidValue;
    const size_t smem = smem_bytes(K, RB, KS);
    static size_t smem_set;  // per instantiation: the largest dynamic shared memory allowed so far
    if (smem > smem_set) {
        const cudaError_t e = cudaFuncSetAttribute(rows_kernel<RB, EPI, KS>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        smem_set = smem;
    }
    const dim3 grid((N + BF - 1) / BF * KS, (M + RB - 1) / RB);
    return launch_pdl_cluster(rows_kernel<RB, EPI, KS>, grid, dim3(THREADS), smem, KS, stream, x_map, w_map, out, M,
                              N, K);
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

extern "C" int gemm_rows_takes(int M, int N, int K) {
    return gemm_rows_available() && M >= 0 && M <= 64 && N > 0 && K > 0 && K % 8 == 0 &&
           fits(K, pick_rows(M, K), MAX_SPLIT);
}

extern "C" cudaError_t gemm_rows_ex(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                                    const void *bias, int M, int N, int K, int rb, int ks, cudaStream_t stream) {
    if (M < 0 || N <= 0 || K <= 0 || ldy < N || !y || !x || !W || (epilogue != MATMUL_LT_NONE && !bias) ||
        epilogue < MATMUL_LT_NONE || epilogue > MATMUL_LT_BIAS_GELU || (rb && rb != 16 && rb != 32 && rb != 64) ||
        (ks && ks != 1 && ks != 2 && ks != 4 && ks != 8))
        return cudaErrorInvalidValue;
    if (!rb) rb = pick_rows(M, K);
    if (!gemm_rows_available() || M > 64 || K % 8 || (uintptr_t)x % 16 || (uintptr_t)W % 16) return cudaErrorNotSupported;
    if (!ks) ks = pick_split(K, rb);
    if (!fits(K, rb, ks)) return cudaErrorNotSupported;
    if (M == 0) return cudaSuccess;
    const Out out = {y, ldy, bias};
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
