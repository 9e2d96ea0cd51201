// The many-row GEMM on Hopper (gemm_sm90.h): TMA, mbarriers, wgmma, one producer and two consumer
// warpgroups, persistent blocks, PDL.
//
// A block owns tiles blockIdx.x, blockIdx.x + gridDim.x, ... of y (BM x BN each, m fastest so that
// the blocks in flight share W's columns; x stays in L2). Three warpgroups:
//   producer   one thread walks the block's tiles and their K in 64-wide steps, and for each step
//              waits until its stage of the ring is free (`empty`), tells the stage's `full`
//              barrier how many bytes will arrive, and issues two TMA loads (x's BM x 64 slice and
//              W's BN x 64), which land under the 128-byte swizzle that wgmma reads;
//   consumers  wait for a stage (`full`), issue its four k16 wgmmas, and once the previous step's
//              MMAs are done hand that stage back (`empty`: one arrival per consumer warp). With
//              BM = 128 consumer c takes rows 64c.., all BN columns; with BM = 64 both take the 64
//              rows and columns BN/2 apart. After a tile's last step they run the epilogue from
//              their accumulators while the producer is already filling the next tile's stages.
// The ring carries on across a block's tiles, so one `it` counter (steps issued or consumed so far)
// names the stage (it % STAGES) and the phase each barrier is in ((it / STAGES) & 1).
//
// PDL: W's first stages are requested before pdl_wait() (no kernel writes the weights), x's after
// it, so a chain of these kernels overlaps each one's first weight loads with the previous one's
// tail. The epilogue reads the residual and the bias after the wait as well.
#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "gemm_sm90.h"
#include "kernel_util.h"
#include "pdl.cuh"
#include "wgmma.cuh"

namespace {

constexpr int BK = 64;              // K per stage: one 128-byte swizzled row of bf16
constexpr int THREADS = 384;        // producer + two consumer warpgroups
constexpr int CONSUMER_WARPS = 8;   // arrivals that free a stage

// CLUSTER_ blocks (1 or 2) along M share W's tile: each loads 1 / CLUSTER_ of its rows and TMA
// multicasts them to both, which halves the W traffic out of L2 (the limit for these shapes: a
// 128 x 256 step moves 48 KB for 2 M MACs, and L2 feeds the SMs ~5.5 TB/s on an H200).
template <int BM_, int BN_, int STAGES_, int BLOCKS_PER_SM_, int CLUSTER_ = 1> struct Tile {
    static constexpr int BM = BM_, BN = BN_, STAGES = STAGES_, BLOCKS_PER_SM = BLOCKS_PER_SM_, CLUSTER = CLUSTER_;
    static constexpr int WN = BM == 128 ? BN : BN / 2;  // a consumer warpgroup's columns
    static constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
    // The stages 1024-byte aligned (the swizzle's period), then the barriers.
    static constexpr size_t SMEM = 1024 + (size_t)STAGES * STAGE_BYTES + 2 * STAGES * sizeof(uint64_t);
};

// Where the epilogue writes (gemm_sm90.h's table): y [M, N] rows ldy apart, bias [N].
struct Out {
    void *y;
    long long ldy;
    const void *bias;
    int pairs;  // y's and the bias's two-column accesses may be 8- (fp32) or 4-byte (bf16) vector ones
};

// ----------------------------------------------------------------------------
// mbarriers, TMA and register counts (PTX, sm_90)

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SM90_ASM(...) __trap()
#else
#define SM90_ASM(...) asm volatile(__VA_ARGS__)
#endif

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, int arrivals) {
    SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA's completions) and the other threads.
__device__ __forceinline__ void mbar_fence_init() { SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// One arrival on the barrier at bar's offset in block `rank` of the cluster (this one included).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *bar, uint32_t rank) {
    SM90_ASM("{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
             "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
             "r"(rank)
             : "memory");
}
// Every thread of the cluster that has not exited (__syncthreads across its blocks).
__device__ __forceinline__ void cluster_sync() {
    SM90_ASM("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Returns once the barrier's phase of this parity has completed (a fresh barrier counts its phase
// before the first, parity 1, as complete: a producer waits on parity 1 first and goes straight on).
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity) {
    uint32_t done = 0;
    do {
        SM90_ASM("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
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
// The same box into the same offset of every block in `mask` of the cluster, counted against the
// barrier at bar's offset in each.
__device__ __forceinline__ void tma_load_multicast(void *dst, const CUtensorMap *map, int k, int row, uint64_t *bar,
                                                   uint16_t mask) {
    SM90_ASM("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
             " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
             "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(smem_addr(bar)), "h"(mask)
             : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map) {
    SM90_ASM("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The producer needs few registers and the consumers' accumulators many: move them over (per
// warpgroup, all its threads together). Only where one block fills an SM's register file.
template <int N> __device__ __forceinline__ void regs_shrink() {
    SM90_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void regs_grow() {
    SM90_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

#undef SM90_ASM

// ----------------------------------------------------------------------------
// The epilogue, from a consumer warpgroup's accumulators: bias, GELU, the residual, the stores.
//
// Accumulator tile j of a thread holds rows r0 and r0 + 8, columns col0 + 8j and + 1 (wgmma.cuh).
// The tiles go in chunks (CHUNK of them) whose bias and residual loads are all issued before any store: the
// compiler must assume a store may alias a later load, so loads between stores would each wait out
// an L2 round trip (ncu: in a block of one tile that was most of its time).

__device__ __forceinline__ float2 load_pair(const float *p, bool two, bool vec) {
    if (two && vec) return *reinterpret_cast<const float2 *>(p);
    return make_float2(p[0], two ? p[1] : 0.0f);
}
__device__ __forceinline__ float2 load_pair(const bf16 *p, bool two, bool vec) {
    if (two && vec) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
    return make_float2(__bfloat162float(p[0]), two ? __bfloat162float(p[1]) : 0.0f);
}
__device__ __forceinline__ void store_pair(float *p, float2 v, bool two, bool vec) {
    if (two && vec) {
        *reinterpret_cast<float2 *>(p) = v;
    } else {
        p[0] = v.x;
        if (two) p[1] = v.y;
    }
}
__device__ __forceinline__ void store_pair(bf16 *p, float2 v, bool two, bool vec) {
    if (two && vec) {
        *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(v.x, v.y);
    } else {
        p[0] = __float2bfloat16_rn(v.x);
        if (two) p[1] = __float2bfloat16_rn(v.y);
    }
}

template <int EPI, int CHUNK, int J>
__device__ __forceinline__ void epilogue(const Out &o, const float (&acc)[J][4], int r0, int col0, int M, int N) {
    constexpr bool residual = EPI == MATMUL_LT_BIAS_RESIDUAL;
    typedef typename std::conditional<residual, float, bf16>::type BiasT;  // y's type (matmul_lt.h)
    typedef typename std::conditional<residual || EPI == MATMUL_LT_NONE, float, bf16>::type YT;
#pragma unroll
    for (int j0 = 0; j0 < J; j0 += CHUNK) {
        float2 bias[CHUNK], res[CHUNK][2];
#pragma unroll
        for (int jj = 0; jj < CHUNK && j0 + jj < J; jj++) {
            const int col = col0 + 8 * (j0 + jj);
            bias[jj] = res[jj][0] = res[jj][1] = make_float2(0.0f, 0.0f);
            if (col >= N) continue;
            if (EPI != MATMUL_LT_NONE) bias[jj] = load_pair((const BiasT *)o.bias + col, col + 1 < N, o.pairs);
#pragma unroll
            for (int h = 0; h < 2; h++)
                if (residual && r0 + 8 * h < M)
                    res[jj][h] = load_pair((const float *)o.y + (r0 + 8 * h) * o.ldy + col, col + 1 < N, o.pairs);
        }
#pragma unroll
        for (int jj = 0; jj < CHUNK && j0 + jj < J; jj++) {
            const int col = col0 + 8 * (j0 + jj);
            if (col >= N) continue;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (r0 + 8 * h >= M) continue;
                float2 v = make_float2(acc[j0 + jj][2 * h] + bias[jj].x, acc[j0 + jj][2 * h + 1] + bias[jj].y);
                if (EPI == MATMUL_LT_BIAS_GELU) v = make_float2(gelu_tanh(v.x), gelu_tanh(v.y));
                if (residual) v = make_float2(res[jj][h].x + v.x, res[jj][h].y + v.y);
                store_pair((YT *)o.y + (r0 + 8 * h) * o.ldy + col, v, col + 1 < N, o.pairs);
            }
        }
    }
}

// ----------------------------------------------------------------------------
// The kernel

template <class TL, int EPI>
__global__ void __launch_bounds__(THREADS, TL::BLOCKS_PER_SM)
    gemm_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map, Out out, int M,
                int N, int K) {
    constexpr int CL = TL::CLUSTER, W_ROWS = TL::BN / CL;  // W rows each block of a cluster loads
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + TL::STAGES * TL::STAGE_BYTES), *empty = full + TL::STAGES;
    // Work comes in units of CL tiles stacked along M (one per block of the cluster; `rank` is this
    // block's), m fastest.
    const int m_tiles = (M + TL::BM - 1) / TL::BM, m_units = (m_tiles + CL - 1) / CL;
    const int units = m_units * ((N + TL::BN - 1) / TL::BN), rank = blockIdx.x % CL;
    const int k_steps = (K + BK - 1) / BK;
    auto tile_m0 = [&](int u) { return ((u % m_units) * CL + rank) * TL::BM; };  // rows past M read as zeros
    auto tile_n0 = [&](int u) { return (u / m_units) * TL::BN; };
    auto x_tile = [&](int s) { return smem + s * TL::STAGE_BYTES; };
    auto w_tile = [&](int s) { return smem + s * TL::STAGE_BYTES + TL::A_BYTES; };
    pdl_launch_dependents();
    if (threadIdx.x == 0) {
        for (int s = 0; s < TL::STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], CONSUMER_WARPS * CL);
        mbar_fence_init();
    }
    if (CL > 1) cluster_sync();  // the other block's barriers are ready before anything lands in them
    else __syncthreads();

    if (threadIdx.x < 128) {  // the producer warpgroup: one thread issues every load
        if (TL::BLOCKS_PER_SM == 1) regs_shrink<40>();
        if (threadIdx.x != 0) {
            pdl_wait();
            return;
        }
        tma_prefetch_map(&x_map), tma_prefetch_map(&w_map);
        // This block's share of a step's W tile, into every block of the cluster.
        auto load_w = [&](int s, int k, int n0) {
            unsigned char *dst = w_tile(s) + rank * W_ROWS * 128;
            if (CL > 1) tma_load_multicast(dst, &w_map, k * BK, n0 + rank * W_ROWS, &full[s], (1 << CL) - 1);
            else tma_load(dst, &w_map, k * BK, n0, &full[s]);
        };
        const int first = blockIdx.x / CL;
        const int ahead = k_steps < TL::STAGES ? k_steps : TL::STAGES;  // the first tile's steps issued early
        for (int k = 0; k < ahead; k++) {
            mbar_arrive_expect_tx(&full[k], TL::STAGE_BYTES);
            load_w(k, k, tile_n0(first));
        }
        pdl_wait();
        for (int k = 0; k < ahead; k++) tma_load(x_tile(k), &x_map, k * BK, tile_m0(first), &full[k]);
        int it = 0;
        for (int u = first; u < units; u += gridDim.x / CL) {
            for (int k = 0; k < k_steps; k++, it++) {
                if (it < ahead) continue;
                const int s = it % TL::STAGES;
                mbar_wait(&empty[s], ((it / TL::STAGES) & 1) ^ 1);  // freed by every block it loads into
                mbar_arrive_expect_tx(&full[s], TL::STAGE_BYTES);
                load_w(s, k, tile_n0(u));
                tma_load(x_tile(s), &x_map, k * BK, tile_m0(u), &full[s]);
            }
        }
        return;
    }

    // A consumer warpgroup.
    if (TL::BLOCKS_PER_SM == 1) regs_grow<232>();
    pdl_wait();
    const int c = threadIdx.x / 128 - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int x_off = TL::BM == 128 ? c * 64 * 128 : 0, w_off = TL::BM == 128 ? 0 : c * TL::WN * 128;
    // A stage is free once every consumer warp of every block it was loaded into is done with it.
    auto release = [&](int s) {
        if (lane != 0) return;
#pragma unroll
        for (int q = 0; q < CL; q++) mbar_arrive_cluster(&empty[s], q);
    };
    float acc[TL::WN / 8][4];
    int it = 0;
    for (int u = blockIdx.x / CL; u < units; u += gridDim.x / CL) {
#pragma unroll
        for (int j = 0; j < TL::WN / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        for (int k = 0; k < k_steps; k++, it++) {
            const int s = it % TL::STAGES;
            mbar_wait(&full[s], (it / TL::STAGES) & 1);
            const uint64_t xd = wgmma_desc_sw128(x_tile(s) + x_off), wd = wgmma_desc_sw128(w_tile(s) + w_off);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) wgmma_ss<TL::WN>(acc, xd + 2 * kk, wd + 2 * kk);  // +32 bytes a k16
            wgmma_commit();
            wgmma_wait<1>();  // the previous step's MMAs are done: its stage can be refilled
            if (k > 0) release((it - 1) % TL::STAGES);
        }
        wgmma_wait<0>();
        wgmma_hold(acc);
        release((it - 1) % TL::STAGES);

        const int r0 = tile_m0(u) + (TL::BM == 128 ? 64 * c : 0) + 16 * warp + lane / 4;
        const int col0 = tile_n0(u) + (TL::BM == 128 ? 0 : TL::WN * c) + 2 * (lane % 4);
        epilogue<EPI, TL::BLOCKS_PER_SM == 1 ? 8 : 4>(out, acc, r0, col0, M, N);  // 4: within 80 registers
    }
    if (CL > 1) cluster_sync();  // no block leaves while the other may still arrive on its barriers
}

// ----------------------------------------------------------------------------
// Host side: tile shapes, tensor maps, launch

// The tile shapes. How fast each runs is measured in docs/PERF.md ("Session 18"); the picker's model
// below is fitted to those measurements.
typedef Tile<128, 256, 4, 1> T128x256;
typedef Tile<128, 192, 5, 1> T128x192;
typedef Tile<128, 128, 6, 1> T128x128;
typedef Tile<64, 256, 5, 1> T64x256;
typedef Tile<64, 192, 6, 1> T64x192;
typedef Tile<64, 128, 4, 2> T64x128;
typedef Tile<128, 256, 4, 1, 2> T128x256c2;
typedef Tile<128, 192, 5, 1, 2> T128x192c2;
typedef Tile<128, 128, 6, 1, 2> T128x128c2;

struct TileShape {
    int bm, bn, blocks_per_sm, cluster;
};
const TileShape shapes[] = {{128, 256, 1, 1}, {128, 192, 1, 1}, {128, 128, 1, 1}, {64, 256, 1, 1}, {64, 192, 1, 1},
                            {64, 128, 2, 1},  {128, 256, 1, 2}, {128, 192, 1, 2}, {128, 128, 1, 2}};
constexpr int NSHAPES = sizeof(shapes) / sizeof(shapes[0]);

// The shape whose busiest SM finishes first: ceil(tiles / slots) rounds of blocks_per_sm tiles
// sharing an SM, each bound by its MMAs (~7 TFLOP/s an SM) or by the bytes its stages bring in
// (~50 GB/s a block measured; W's halved by a cluster's multicast), plus ~2 us to fill and drain.
// GPT2_GEMM_TILE=BMxBN[c2] forces one.
int pick_shape(int M, int N, int K) {
    const char *env = getenv("GPT2_GEMM_TILE");
    int bm = 0, bn = 0;
    if (env && sscanf(env, "%dx%d", &bm, &bn) == 2)
        for (int i = 0; i < NSHAPES; i++)
            if (shapes[i].bm == bm && shapes[i].bn == bn && shapes[i].cluster == (strstr(env, "c2") ? 2 : 1))
                return i;
    const int sms = device_attr<cudaDevAttrMultiProcessorCount>(132);
    int best = 0;
    double best_us = 1e30;
    for (int i = 0; i < NSHAPES; i++) {
        const TileShape &sh = shapes[i];
        const long long units = (long long)((M + sh.bm * sh.cluster - 1) / (sh.bm * sh.cluster)) * ((N + sh.bn - 1) / sh.bn);
        const long long tiles = units * sh.cluster, slots = (long long)sms * sh.blocks_per_sm;
        const double rounds = (double)((tiles + slots - 1) / slots);
        const double mma_us = 2.0 * sh.bm * sh.bn * K / 7e6;
        const double load_us = (K + BK - 1) / BK * (sh.bm + sh.bn / sh.cluster) * 128.0 / 50e3;
        const double us = rounds * sh.blocks_per_sm * (mma_us > load_us ? mma_us : load_us) + 2.0;
        if (us < best_us) best_us = us, best = i;
    }
    return best;
}

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
// (rows and K past the end read as zeros).
bool tensor_map(CUtensorMap *map, const void *p, int rows, int K, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)K * 2};
    const cuuint32_t box[2] = {BK, (cuuint32_t)box_rows}, elem_strides[2] = {1, 1};
    return encode && encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(p), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <class TL, int EPI>
cudaError_t launch(const Out &out, const void *x, const void *W, int M, int N, int K, cudaStream_t stream) {
    CUtensorMap x_map, w_map;
    if (!tensor_map(&x_map, x, M, K, TL::BM) || !tensor_map(&w_map, W, N, K, TL::BN / TL::CLUSTER))
        return cudaErrorInvalidValue;
    static int cluster_slots;  // per instantiation: clusters that fit the device at once (0: not asked yet)
    if (!cluster_slots) {
        cudaError_t e = cudaFuncSetAttribute(gemm_kernel<TL, EPI>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)TL::SMEM);
        cluster_slots = device_attr<cudaDevAttrMultiProcessorCount>(132) * TL::BLOCKS_PER_SM;
        if (e == cudaSuccess && TL::CLUSTER > 1) {
            cudaLaunchAttribute attr;
            attr.id = cudaLaunchAttributeClusterDimension;
            attr.val.clusterDim.x = TL::CLUSTER, attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(TL::CLUSTER * 64), cfg.blockDim = dim3(THREADS), cfg.dynamicSmemBytes = TL::SMEM;
            cfg.attrs = &attr, cfg.numAttrs = 1;
            e = cudaOccupancyMaxActiveClusters(&cluster_slots, gemm_kernel<TL, EPI>, &cfg);
        }
        if (e != cudaSuccess || cluster_slots < 1) {
            cluster_slots = 0;
            return e != cudaSuccess ? e : cudaErrorNotSupported;
        }
    }
    const long long units = (long long)((M + TL::BM * TL::CLUSTER - 1) / (TL::BM * TL::CLUSTER)) *
                            ((N + TL::BN - 1) / TL::BN);
    const unsigned grid = (unsigned)(units < cluster_slots ? units : cluster_slots) * TL::CLUSTER;
    return launch_pdl_cluster(gemm_kernel<TL, EPI>, dim3(grid), dim3(THREADS), TL::SMEM, TL::CLUSTER, stream, x_map,
                              w_map, out, M, N, K);
}

template <int EPI>
cudaError_t launch_shape(int shape, const Out &out, const void *x, const void *W, int M, int N, int K,
                         cudaStream_t stream) {
    switch (shape) {
    case 0: return launch<T128x256, EPI>(out, x, W, M, N, K, stream);
    case 1: return launch<T128x192, EPI>(out, x, W, M, N, K, stream);
    case 2: return launch<T128x128, EPI>(out, x, W, M, N, K, stream);
    case 3: return launch<T64x256, EPI>(out, x, W, M, N, K, stream);
    case 4: return launch<T64x192, EPI>(out, x, W, M, N, K, stream);
    case 5: return launch<T64x128, EPI>(out, x, W, M, N, K, stream);
    case 6: return launch<T128x256c2, EPI>(out, x, W, M, N, K, stream);
    case 7: return launch<T128x192c2, EPI>(out, x, W, M, N, K, stream);
    default: return launch<T128x128c2, EPI>(out, x, W, M, N, K, stream);
    }
}

}  // namespace

extern "C" int gemm_sm90_available(void) {
#if GPT2_SM90A
    const char *env = getenv("GPT2_GEMM");
    return device_attr<cudaDevAttrComputeCapabilityMajor>(0) == 9 &&
           device_attr<cudaDevAttrComputeCapabilityMinor>(-1) == 0 && !(env && strcmp(env, "cublaslt") == 0) &&
           encode_tiled() != NULL;
#else
    return 0;
#endif
}

extern "C" cudaError_t gemm_sm90(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                                 const void *bias, int M, int N, int K, cudaStream_t stream) {
    if (!gemm_sm90_available()) return cudaErrorNotSupported;
    const bool fp32_y = epilogue == MATMUL_LT_NONE || epilogue == MATMUL_LT_BIAS_RESIDUAL;
    if (M < 0 || N <= 0 || K <= 0 || K % 8 || ldy < N || !y || !x || !W || (epilogue != MATMUL_LT_NONE && !bias) ||
        (uintptr_t)x % 16 || (uintptr_t)W % 16 || (uintptr_t)y % (fp32_y ? 4 : 2) || epilogue < MATMUL_LT_NONE ||
        epilogue > MATMUL_LT_BIAS_GELU)
        return cudaErrorInvalidValue;
    if (M == 0) return cudaSuccess;
    const size_t pair_bytes = fp32_y ? 8 : 4;  // the bias has y's type
    const Out out = {y, ldy, bias,
                     ldy % 2 == 0 && (uintptr_t)y % pair_bytes == 0 && (uintptr_t)bias % pair_bytes == 0};
    const int shape = pick_shape(M, N, K);
    switch (epilogue) {
    case MATMUL_LT_NONE: return launch_shape<MATMUL_LT_NONE>(shape, out, x, W, M, N, K, stream);
    case MATMUL_LT_BIAS: return launch_shape<MATMUL_LT_BIAS>(shape, out, x, W, M, N, K, stream);
    case MATMUL_LT_BIAS_RESIDUAL: return launch_shape<MATMUL_LT_BIAS_RESIDUAL>(shape, out, x, W, M, N, K, stream);
    default: return launch_shape<MATMUL_LT_BIAS_GELU>(shape, out, x, W, M, N, K, stream);
    }
}
