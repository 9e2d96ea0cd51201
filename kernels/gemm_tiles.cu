// Products of a prompt's many rows on Hopper (gemm_tiles.h): a block a 128 x BN tile of y over all of K,
// one producer thread streaming K slices of W and x by TMA into a ring of stages, two wgmma consumer
// warpgroups of 64 rows each, the epilogue staged through shared memory.
//
// A block's 384 threads:
//   warp 0, thread 0   the producer: W's first STAGES slices before the PDL wait (weights), x's after
//                      it, then each slice as the consumers free its stage; the residual's old tile
//   warp 1             the epilogue's column vectors (bias, s, gamma) before the wait, the copy's
//                      shifts c after it
//   warps 2-3          gemm_tiles_fold: each row's parts merged into (rstd, (mean - c) rstd)
//   warps 4-11         two consumer warpgroups: wgmma over the ring, then the epilogue
// The producer warpgroup gives its registers to the consumers (setmaxnreg).
//
// Shared memory, 1024-byte aligned (the 128-byte swizzle's period):
//   ring     STAGES x (x's 128 rows + W's BN rows) x 64 k, bf16 under the swizzle; once every MMA is
//            done, the epilogue's staging (each warpgroup's 64 x BN values, padded rows)
//   old      RESIDUAL: y's old fp32 tile [128][BN], by TMA during the K loop
//   vectors  bias, s, gamma [BN] fp32; the copy's shifts [128]
//   tail     the barriers; FOLD: the rows' rstd and (mean - c) rstd
#include <stdint.h>

#include "gemm_tiles.h"
#include "kernel_util.h"
#include "pdl.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace {

constexpr int BM = 128, BK = 64, THREADS = 384;

// GELU with tanh.approx (one MUFU op, ~2^-11 relative error) instead of tanhf's ~25 instructions: the
// output is bf16, and tanhf cost ~1.5 us of fc's epilogue at 1024 rows (docs/PERF.md, "Session 60").
__device__ __forceinline__ float gelu_fast(float x) {
    const float u = 0.7978845608028654f * fmaf(0.044715f * x, x * x, x);
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
    return 0.5f * x * (1.0f + t);
}

// setmaxnreg is sm_90a's: compiled for any other target the kernel traps (it runs only on compute
// capability 9.0 from an sm_90a build, gemm_tiles_available).
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SETMAXNREG_ASM(...) __trap()
#else
#define SETMAXNREG_ASM(...) asm volatile(__VA_ARGS__)
#endif
// The producer warpgroup keeps 80 registers a thread (the statistics' warps hold two rows' 16 parts),
// the consumers take the rest: 128 x 80 + 256 x 208 = 63,488 of 65,536.
__device__ __forceinline__ void regs_producer() { SETMAXNREG_ASM("setmaxnreg.dec.sync.aligned.u32 80;\n"); }
__device__ __forceinline__ void regs_consumer() { SETMAXNREG_ASM("setmaxnreg.inc.sync.aligned.u32 208;\n"); }
#undef SETMAXNREG_ASM
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

struct Args {
    void *y;
    long long ldy;
    const void *bias;  // bf16 for BIAS and GELU, fp32 for RESIDUAL and the fold's b'
    // COPY
    bf16 *copy;
    const float *gamma;
    float *parts;
    // FOLD
    const float *parts_in;
    int nparts;
    const float *s;
    float *mean_out;
    const float *shift;  // COPY: the copy's c; FOLD: the c the copy was made with
    int M, N, K;
};

template <int BN, int STAGES, int EPI> struct Layout {
    static constexpr bool RESID = EPI == MATMUL_LT_BIAS_RESIDUAL;
    static constexpr int STAGE = (BM + BN) * BK * 2;
    // staged rows: fp32 4 floats past a multiple of 32 (a thread a row reads 16-byte vectors without
    // conflicts), bf16 8 past (the accumulators' 4-byte writes)
    static constexpr int LD = RESID ? BN + 4 : BN + 8, ESZ = RESID ? 4 : 2, EPI_BYTES = 64 * LD * ESZ;
    static constexpr size_t RING = STAGES * STAGE > 2 * EPI_BYTES ? (size_t)STAGES * STAGE : 2 * EPI_BYTES;
    static constexpr size_t OLD = RESID ? (size_t)BM * BN * 4 : 0;
    static constexpr size_t VEC = (3 * BN + BM) * 4;
    static constexpr size_t TAIL = 256 + 2 * BM * 4;
    static constexpr size_t SMEM = 1024 + RING + OLD + VEC + TAIL;
    static_assert(RING % 1024 == 0 && OLD % 128 == 0 && VEC % 8 == 0, "alignment");
    static_assert((2 * STAGES + 2) * 8 <= 256, "barriers");
};

// y's tile (m0, n0) of BN columns; FOLD: LayerNorm folded (MATMUL_LT_BIAS or _GELU); COPY: the
// residual product's copy and parts (MATMUL_LT_BIAS_RESIDUAL).
template <int BN, int STAGES, int EPI, bool FOLD, bool COPY>
__global__ void __launch_bounds__(THREADS, 1)
    tiles_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap x_tail_map,
                 const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap old_map,
                 const __grid_constant__ CUtensorMap old_tail_map, Args a) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    typedef Layout<BN, STAGES, EPI> L;
    constexpr bool RESID = L::RESID;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    float *old = reinterpret_cast<float *>(smem + L::RING);
    float *vec_bias = reinterpret_cast<float *>(smem + L::RING + L::OLD), *vec_s = vec_bias + BN,
          *vec_g = vec_s + BN, *vec_c = vec_g + BN;
    unsigned char *tail = smem + L::RING + L::OLD + L::VEC;
    uint64_t *full = reinterpret_cast<uint64_t *>(tail), *empty = full + STAGES, *epi_bar = empty + STAGES,
             *old_bar = epi_bar + 1;
    float *row_a = reinterpret_cast<float *>(tail + 256), *row_b = row_a + BM;

    const int M = a.M, N = a.N, K = a.K, k_steps = K / BK;
    const int m_tiles = (M + BM - 1) / BM, m0 = blockIdx.x % m_tiles * BM, n0 = blockIdx.x / m_tiles * BN;
    const int tid = threadIdx.x;
    pdl_launch_dependents();  // kernels/pdl.cuh: the next grid may be scheduled (it waits for this one)
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 8);  // 8 consumer warps
        mbar_init(epi_bar, 32 + (FOLD ? 64 : 0));
        mbar_init(old_bar, 1);
        mbar_fence_init();
    }
    __syncthreads();

    // ---- the producer warpgroup
    if (tid < 128) {
        regs_producer();
        if (tid == 0) {
            auto xt = [&](int s) { return smem + s * L::STAGE; };
            auto wt = [&](int s) { return smem + s * L::STAGE + BM * BK * 2; };
            // A row tile past M reads only its rows (the tail maps' boxes): boxes mostly past the
            // tensor's end took the MLP projection 18.1 us at 900 rows against 11.2 at 896 (docs/PERF.md,
            // "Session 60"). The stage's rows past them keep stale values, whose output rows are not stored.
            const int rows = min(BM, M - m0);
            const CUtensorMap *xm = rows < BM ? &x_tail_map : &x_map, *om = rows < BM ? &old_tail_map : &old_map;
            const uint32_t stage_bytes = (BN + rows) * BK * 2;
            tma_prefetch_map(xm), tma_prefetch_map(&w_map);
            const int ahead = min(k_steps, STAGES);
            for (int k = 0; k < ahead; k++) {
                mbar_arrive_expect_tx(&full[k], stage_bytes);
                tma_load(wt(k), &w_map, k * BK, n0, &full[k]);
            }
            pdl_wait();  // x (and y's old rows) come from the kernels before
            for (int k = 0; k < ahead; k++) tma_load(xt(k), xm, k * BK, m0, &full[k]);
            if (RESID) {
                mbar_arrive_expect_tx(old_bar, rows * BN * 4);
                tma_load(old, om, n0, m0, old_bar);
            }
            for (int k = ahead; k < k_steps; k++) {
                const int s = k % STAGES;
                mbar_wait(&empty[s], (k / STAGES - 1) & 1);  // the consumers are done with slice k - STAGES
                mbar_arrive_expect_tx(&full[s], stage_bytes);
                tma_load(wt(s), &w_map, k * BK, n0, &full[s]);
                tma_load(xt(s), xm, k * BK, m0, &full[s]);
            }
        } else if (tid >= 32 && tid < 64) {
            for (int i = tid - 32; i < BN; i += 32) {
                vec_bias[i] = RESID || FOLD ? static_cast<const float *>(a.bias)[n0 + i]
                                            : to_f32(static_cast<const bf16 *>(a.bias)[n0 + i]);
                if (FOLD) vec_s[i] = a.s[n0 + i];
                if (COPY) vec_g[i] = a.gamma[n0 + i];
            }
            pdl_wait();  // the shifts come from the kernels before
            if (COPY)
                for (int r = tid - 32; r < BM; r += 32) vec_c[r] = a.shift && m0 + r < M ? a.shift[m0 + r] : 0.f;
            mbar_arrive(epi_bar);
        } else if (FOLD && tid >= 64) {
            pdl_wait();  // the parts come from the residual product before
            // Rows tid - 64 and tid: every load of both issued before the first use, one round trip.
            const float cnt = (float)K / a.nparts;
            float2 v[2][GEMM_TILES_MAX_PARTS];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = m0 + tid - 64 + 64 * h;
                const float2 *p = reinterpret_cast<const float2 *>(a.parts_in) + (size_t)row * a.nparts;
#pragma unroll
                for (int j = 0; j < GEMM_TILES_MAX_PARTS; j++)
                    v[h][j] = row < M && j < a.nparts ? p[j] : make_float2(0.f, 0.f);
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = tid - 64 + 64 * h, row = m0 + r;
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < GEMM_TILES_MAX_PARTS; j++) sum += v[h][j].x;
                const float mean = sum / K;
                float m2 = 0.f;  // Chan: the parts' M2 and their means' spread
#pragma unroll
                for (int j = 0; j < GEMM_TILES_MAX_PARTS; j++) {
                    const float d = v[h][j].x / cnt - mean;
                    if (j < a.nparts) m2 += v[h][j].y + cnt * d * d;
                }
                const float rstd = rsqrtf(m2 / K + 1e-5f), c = a.shift && row < M ? a.shift[row] : 0.f;
                row_a[r] = rstd;
                row_b[r] = (mean - c) * rstd;
                if (a.mean_out && n0 == 0 && row < M) a.mean_out[row] = mean;
            }
            mbar_arrive(epi_bar);
        } else {
            pdl_wait();  // every thread waits (pdl.cuh's contract)
        }
        return;
    }

    // ---- the consumers: 64 rows each, K slice by slice
    regs_consumer();
    pdl_wait();
    const int c = tid / 128 - 1, warp = tid / 32 % 4, lane = tid % 32, t = tid % 128;
    float acc[BN / 8][4];
#pragma unroll
    for (int j = 0; j < BN / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int k = 0; k < k_steps; k++) {
        const int s = k % STAGES;
        mbar_wait(&full[s], (k / STAGES) & 1);
        const uint64_t xd = wgmma_desc_sw128(smem + s * L::STAGE + c * 64 * 128),
                       wd = wgmma_desc_sw128(smem + s * L::STAGE + BM * BK * 2);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_ss<BN>(acc, xd + 2 * kk, wd + 2 * kk);
        wgmma_commit();
        wgmma_wait<1>();  // slice k - 1's MMAs are done: its stage is free where a later slice needs it
        if (k > 0 && k - 1 + STAGES < k_steps && lane == 0) mbar_arrive(&empty[(k - 1) % STAGES]);
    }
    wgmma_wait<0>();
    wgmma_hold(acc);
    named_barrier(3, 256);    // both warpgroups' MMAs are done with the ring: it becomes the staging
    mbar_wait(epi_bar, 0);    // the vectors (and the fold's row statistics)

    // ---- the epilogue: values in place, staged, then out as whole-row 16-byte vectors. Every shared
    // read of a phase comes before its first store: a store may alias a later read, so interleaved
    // each read would wait out the store before it.
    unsigned char *stage = smem + c * L::EPI_BYTES;
    const int rl = 16 * warp + lane / 4, cl = 2 * (lane % 4), mr0 = m0 + 64 * c;
    float ra[2] = {1.f, 1.f}, rb[2] = {0.f, 0.f};
    if (FOLD)
#pragma unroll
        for (int h = 0; h < 2; h++) ra[h] = row_a[64 * c + rl + 8 * h], rb[h] = row_b[64 * c + rl + 8 * h];
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        const float2 bias = *reinterpret_cast<const float2 *>(vec_bias + cl + 8 * j);
        const float2 sv = FOLD ? *reinterpret_cast<const float2 *>(vec_s + cl + 8 * j) : make_float2(0.f, 0.f);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float v0 = acc[j][2 * h], v1 = acc[j][2 * h + 1];
            if (FOLD) {
                v0 = fmaf(ra[h], v0, fmaf(-rb[h], sv.x, bias.x));
                v1 = fmaf(ra[h], v1, fmaf(-rb[h], sv.y, bias.y));
            } else {
                v0 += bias.x, v1 += bias.y;
            }
            if (EPI == MATMUL_LT_BIAS_GELU) v0 = gelu_fast(v0), v1 = gelu_fast(v1);
            acc[j][2 * h] = v0, acc[j][2 * h + 1] = v1;
        }
    }
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int at = (rl + 8 * h) * L::LD + cl + 8 * j;
            const float v0 = acc[j][2 * h], v1 = acc[j][2 * h + 1];
            if (RESID) *reinterpret_cast<float2 *>((float *)stage + at) = make_float2(v0, v1);
            else *reinterpret_cast<__nv_bfloat162 *>((bf16 *)stage + at) = __floats2bfloat162_rn(v0, v1);
        }
    named_barrier(1 + c, 128);

    if constexpr (RESID) {
        // y += the staged values, from the old tile; COPY also stages the new rows for their statistics.
        constexpr int CPR = BN / 4, PER = 64 * CPR / 128;
        static_assert(64 * CPR % 128 == 0, "whole vectors a thread");
        float *y = static_cast<float *>(a.y);
        mbar_wait(old_bar, 0);  // landed during the K loop
        float4 nv[PER], gm[PER];
        float cr[PER];
#pragma unroll
        for (int b = 0; b < PER; b++) {
            const int i = t + 128 * b, r = i / CPR, cc = i % CPR * 4;
            const float4 d = *reinterpret_cast<const float4 *>((const float *)stage + r * L::LD + cc),
                         o = *reinterpret_cast<const float4 *>(old + (64 * c + r) * BN + cc);
            nv[b] = make_float4(o.x + d.x, o.y + d.y, o.z + d.z, o.w + d.w);
            if (COPY) gm[b] = *reinterpret_cast<const float4 *>(vec_g + cc), cr[b] = vec_c[64 * c + r];
        }
#pragma unroll
        for (int b = 0; b < PER; b++) {
            const int i = t + 128 * b, r = i / CPR, cc = i % CPR * 4, row = mr0 + r;
            const float4 v = nv[b];
            if (row < M) *reinterpret_cast<float4 *>(y + (size_t)row * a.ldy + n0 + cc) = v;
            if (COPY) {
                *reinterpret_cast<float4 *>((float *)stage + r * L::LD + cc) = v;
                const __nv_bfloat162 lo = __floats2bfloat162_rn(gm[b].x * (v.x - cr[b]), gm[b].y * (v.y - cr[b])),
                                     hi = __floats2bfloat162_rn(gm[b].z * (v.z - cr[b]), gm[b].w * (v.w - cr[b]));
                const uint2 pk = {*reinterpret_cast<const uint32_t *>(&lo), *reinterpret_cast<const uint32_t *>(&hi)};
                if (row < M) *reinterpret_cast<uint2 *>(a.copy + (size_t)row * N + n0 + cc) = pk;
            }
        }
        if constexpr (COPY) {  // a thread a row: the sum of its BN new values, then M2 about their mean
            named_barrier(1 + c, 128);
            if (t < 64 && mr0 + t < M) {
                const float *v = (const float *)stage + t * L::LD;
                float4 q[CPR];
                float sum = 0.f;
#pragma unroll
                for (int i = 0; i < CPR; i++) {
                    q[i] = *reinterpret_cast<const float4 *>(v + 4 * i);
                    sum += (q[i].x + q[i].y) + (q[i].z + q[i].w);
                }
                const float mean = sum / BN;
                float m2 = 0.f;
#pragma unroll
                for (int i = 0; i < CPR; i++) {
                    const float d0 = q[i].x - mean, d1 = q[i].y - mean, d2 = q[i].z - mean, d3 = q[i].w - mean;
                    m2 += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
                }
                reinterpret_cast<float2 *>(a.parts)[(size_t)(mr0 + t) * (N / BN) + n0 / BN] = make_float2(sum, m2);
            }
        }
    } else {
        constexpr int CPR = BN / 8;
        bf16 *y = static_cast<bf16 *>(a.y);
#pragma unroll 4
        for (int i = t; i < 64 * CPR; i += 128) {
            const int r = i / CPR, cc = i % CPR * 8, row = mr0 + r;
            if (row < M)
                *reinterpret_cast<uint4 *>(y + (size_t)row * a.ldy + n0 + cc) =
                    *reinterpret_cast<const uint4 *>((const bf16 *)stage + r * L::LD + cc);
        }
    }
}

// ----------------------------------------------------------------------------
// Host

// An fp32 [rows, N] matrix, rows ld floats apart, read in unswizzled boxes of box_cols x box_rows (the
// residual's old tile; rows past `rows` read as zeros).
bool tensor_map_f32(CUtensorMap *map, const void *p, int rows, int N, long long ld, int box_cols, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
    const cuuint64_t dims[2] = {(cuuint64_t)N, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * 4};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows}, elem_strides[2] = {1, 1};
    return encode && encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<void *>(p), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The kernel's shared memory allowed (per instantiation, once).
template <int BN, int STAGES, int EPI, bool FOLD, bool COPY> cudaError_t allow() {
    static bool done;
    if (done) return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(tiles_kernel<BN, STAGES, EPI, FOLD, COPY>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)Layout<BN, STAGES, EPI>::SMEM);
    done = e == cudaSuccess;
    return e;
}

// x: the bf16 rows multiplied (the fold's copy).
template <int BN, int STAGES, int EPI, bool FOLD, bool COPY>
cudaError_t launch(const Args &a, const void *x, const void *W, cudaStream_t stream) {
    typedef Layout<BN, STAGES, EPI> L;
    const int tail = a.M % BM ? a.M % BM : BM;  // the last row tile's rows
    CUtensorMap x_map, x_tail_map, w_map, old_map = {}, old_tail_map = {};
    if (!tensor_map(&x_map, x, a.M, a.K, a.K, BM) || !tensor_map(&x_tail_map, x, a.M, a.K, a.K, tail) ||
        !tensor_map(&w_map, W, a.N, a.K, a.K, BN) ||
        (L::RESID && (!tensor_map_f32(&old_map, a.y, a.M, a.N, a.ldy, BN, BM) ||
                      !tensor_map_f32(&old_tail_map, a.y, a.M, a.N, a.ldy, BN, tail))))
        return cudaErrorInvalidValue;
    const cudaError_t e = allow<BN, STAGES, EPI, FOLD, COPY>();
    if (e != cudaSuccess) return e;
    const int tiles = (a.M + BM - 1) / BM * (a.N / BN);
    return launch_pdl(tiles_kernel<BN, STAGES, EPI, FOLD, COPY>, dim3(tiles), dim3(THREADS), L::SMEM, stream, x_map,
                      x_tail_map, w_map, old_map, old_tail_map, a);
}

// GPT-2 124M's four layer products, each with the epilogue GPT-2 gives it, and its tile: 16 column
// tiles (one wave of 128 blocks at 1024 rows), stages measured at 1024 rows on an H200 (docs/PERF.md,
// "Session 60").
struct Shape {
    int N, K, BN, stages;
    MatmulLtEpilogue epilogue;
};
constexpr Shape kShapes[] = {
    {2304, 768, 144, 4, MATMUL_LT_BIAS},           // qkv
    {3072, 768, 192, 4, MATMUL_LT_BIAS_GELU},      // fc
    {768, 768, 48, 6, MATMUL_LT_BIAS_RESIDUAL},    // attention projection
    {768, 3072, 48, 8, MATMUL_LT_BIAS_RESIDUAL},   // MLP projection
};
constexpr int kShapeCount = sizeof(kShapes) / sizeof(kShapes[0]);

int find_shape(int N, int K) {
    for (int i = 0; i < kShapeCount; i++)
        if (kShapes[i].N == N && kShapes[i].K == K) return i;
    return -1;
}

// Shape i's kernel: plain, folded (qkv, fc) or with the copy (the projections).
cudaError_t run(int i, bool fold_or_copy, const Args &a, const void *x, const void *W, cudaStream_t stream) {
    switch (i) {
    case 0: return fold_or_copy ? launch<144, 4, MATMUL_LT_BIAS, true, false>(a, x, W, stream)
                                : launch<144, 4, MATMUL_LT_BIAS, false, false>(a, x, W, stream);
    case 1: return fold_or_copy ? launch<192, 4, MATMUL_LT_BIAS_GELU, true, false>(a, x, W, stream)
                                : launch<192, 4, MATMUL_LT_BIAS_GELU, false, false>(a, x, W, stream);
    case 2: return fold_or_copy ? launch<48, 6, MATMUL_LT_BIAS_RESIDUAL, false, true>(a, x, W, stream)
                                : launch<48, 6, MATMUL_LT_BIAS_RESIDUAL, false, false>(a, x, W, stream);
    default: return fold_or_copy ? launch<48, 8, MATMUL_LT_BIAS_RESIDUAL, false, true>(a, x, W, stream)
                                 : launch<48, 8, MATMUL_LT_BIAS_RESIDUAL, false, false>(a, x, W, stream);
    }
}

// The checks every entry point shares: cudaErrorInvalidValue for bad arguments, cudaErrorNotSupported
// for what it does not run; the shape's index in *shape.
cudaError_t check(MatmulLtEpilogue epilogue, const void *y, long long ldy, const void *x, const void *W,
                  const void *bias, int M, int N, int K, int *shape) {
    if (M < 0 || N <= 0 || K <= 0 || ldy < N || !y || !x || !W || !bias ||
        (epilogue != MATMUL_LT_BIAS && epilogue != MATMUL_LT_BIAS_GELU && epilogue != MATMUL_LT_BIAS_RESIDUAL))
        return cudaErrorInvalidValue;
    *shape = find_shape(N, K);
    const int vec = epilogue == MATMUL_LT_BIAS_RESIDUAL ? 4 : 8;  // elements in 16 bytes of y
    if (!gemm_tiles_available() || *shape < 0 || kShapes[*shape].epilogue != epilogue || M > GEMM_TILES_MAX_ROWS ||
        !aligned16(x) || !aligned16(W) || !aligned16(y) || ldy % vec)
        return cudaErrorNotSupported;
    return cudaSuccess;
}

}  // namespace

extern "C" int gemm_tiles_available(void) {
#if GPT2_SM90A
    static int off = -1;
    if (off < 0) off = env_off("GPT2_GEMM_TILES");
    return !off && device_is_sm90() && encode_tiled() != NULL;
#else
    return 0;
#endif
}

// Rows that make 3/4 to one wave of blocks: one tile a block, so its epilogue overlaps nothing but the
// next kernel's start; past a wave a block runs its tiles one after another and cuBLASLt's persistent
// kernels win (twice as fast at 8192 rows, docs/PERF.md "Session 60"), below 3/4 of the SMs are idle.
extern "C" int gemm_tiles_takes(int M, int N, int K) {
    const int i = find_shape(N, K);
    if (!gemm_tiles_available() || i < 0 || M <= 0 || M > GEMM_TILES_MAX_ROWS) return 0;
    const long long tiles = (long long)(M + BM - 1) / BM * (N / kShapes[i].BN);
    const long long sms = device_attr<cudaDevAttrMultiProcessorCount>(0);
    return tiles <= sms && 4 * tiles >= 3 * sms;
}

extern "C" int gemm_tiles_parts(int N) {
    for (int i = 0; i < kShapeCount; i++)
        if (kShapes[i].N == N && kShapes[i].epilogue == MATMUL_LT_BIAS_RESIDUAL) return N / kShapes[i].BN;
    return 0;
}

extern "C" cudaError_t gemm_tiles(MatmulLtEpilogue epilogue, void *y, long long ldy, const void *x, const void *W,
                                  const void *bias, int M, int N, int K, cudaStream_t stream) {
    int i;
    const cudaError_t e = check(epilogue, y, ldy, x, W, bias, M, N, K, &i);
    if (e != cudaSuccess || M == 0) return e;
    Args a = {};
    a.y = y, a.ldy = ldy, a.bias = bias, a.M = M, a.N = N, a.K = K;
    return run(i, false, a, x, W, stream);
}

extern "C" cudaError_t gemm_tiles_residual_copy(float *y, long long ldy, const void *x, const void *W,
                                                const float *bias, int M, int N, int K, const GemmTilesCopy *copy,
                                                cudaStream_t stream) {
    if (!copy || !copy->copy || !copy->gamma || !copy->parts) return cudaErrorInvalidValue;
    int i;
    const cudaError_t e = check(MATMUL_LT_BIAS_RESIDUAL, y, ldy, x, W, bias, M, N, K, &i);
    if (e != cudaSuccess || M == 0) return e;
    Args a = {};
    a.y = y, a.ldy = ldy, a.bias = bias, a.M = M, a.N = N, a.K = K;
    a.copy = static_cast<bf16 *>(copy->copy), a.gamma = copy->gamma, a.shift = copy->shift, a.parts = copy->parts;
    return run(i, true, a, x, W, stream);
}

extern "C" cudaError_t gemm_tiles_fold(MatmulLtEpilogue epilogue, void *y, long long ldy, const GemmTilesFold *in,
                                       const void *W, const float *s, const float *b_folded, int M, int N, int K,
                                       cudaStream_t stream) {
    if (!in || !in->copy || !in->parts || !s || in->nparts < 1 || in->nparts > GEMM_TILES_MAX_PARTS ||
        K % in->nparts || (in->shift && in->shift == in->mean_out) || epilogue == MATMUL_LT_BIAS_RESIDUAL)
        return cudaErrorInvalidValue;
    int i;
    const cudaError_t e = check(epilogue, y, ldy, in->copy, W, b_folded, M, N, K, &i);
    if (e != cudaSuccess || M == 0) return e;
    Args a = {};
    a.y = y, a.ldy = ldy, a.bias = b_folded, a.M = M, a.N = N, a.K = K;
    a.parts_in = in->parts, a.nparts = in->nparts, a.s = s, a.shift = in->shift, a.mean_out = in->mean_out;
    return run(i, true, a, in->copy, W, stream);
}
