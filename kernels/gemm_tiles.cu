// Products of a prompt's many rows on Hopper (gemm_tiles.h): a block a 128 x BN tile of y over all of K
// (or a pair of blocks, each over half of K: KS = 2, a 128 x 2 BN tile whose columns the two finish
// half each, or a 128 x BN tile whose rows they finish half each: BY_ROWS), one producer thread
// streaming K slices of W and x by TMA into a ring of stages, two wgmma consumer warpgroups of 64 rows
// each, the epilogue staged through shared memory.
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
//   ring     STAGES x (x's 128 rows + W's WN rows) x 64 k, bf16 under the swizzle; once every MMA
//            is done, the epilogue's staging (each warpgroup's 64 x BN values, padded rows)
//   old      RESIDUAL: y's old fp32 tile [128][BN] (BY_ROWS: the block's 64 rows of it), by TMA during the
//            K loop
//   inbox    KS = 2: the other block's partial sums of this block's BN columns (BY_ROWS: of its 64 rows)
//   vectors  bias, s, gamma [BN] fp32; the copy's shifts [128]
//   tail     the barriers; FOLD: the rows' rstd and (mean - c) rstd
#include <stdint.h>

#include "cluster.cuh"
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
// The producer warpgroup keeps 88 registers a thread (the statistics' warps hold two rows' 16 parts;
// with 80 they spilled), the consumers take the rest: 128 x 88 + 256 x 208 = 64,512 of 65,536.
__device__ __forceinline__ void regs_producer() { SETMAXNREG_ASM("setmaxnreg.dec.sync.aligned.u32 88;\n"); }
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

// BN: a block's output columns; KS: the blocks of a cluster that split K, each multiplying WN columns of
// W over its 1/KS of K: KS BN, or BN where they split the finish BY_ROWS (see the kernel).
template <int BN, int KS, bool BY_ROWS, int STAGES, int EPI> struct Layout {
    static constexpr bool RESID = EPI == MATMUL_LT_BIAS_RESIDUAL;
    static constexpr int WN = BY_ROWS ? BN : KS * BN;
    static constexpr int STAGE = (BM + WN) * BK * 2;
    // staged rows: fp32 4 floats past a multiple of 32, bf16 8 past (the accumulators' writes and the
    // rows' 16-byte reads spread over the banks)
    static constexpr int LD = RESID ? BN + 4 : BN + 8, ESZ = RESID ? 4 : 2, EPI_BYTES = 64 * LD * ESZ;
    static constexpr size_t RING = STAGES * STAGE > 2 * EPI_BYTES ? (size_t)STAGES * STAGE : 2 * EPI_BYTES;
    static constexpr size_t OLD = RESID ? (size_t)BM * BN * 4 : 0;
    // a sending thread's BN / 8 float4: every consumer thread's, or BY_ROWS one warpgroup's
    static constexpr size_t INBOX = KS > 1 ? (size_t)(BY_ROWS ? 128 : 256) * BN / 8 * 16 : 0;
    static constexpr size_t VEC = (3 * BN + BM) * 4;
    static constexpr size_t TAIL = 256 + 2 * BM * 4;
    static constexpr size_t SMEM = 1024 + RING + OLD + INBOX + VEC + TAIL;
    static_assert(RING % 1024 == 0 && OLD % 128 == 0 && INBOX % 16 == 0 && VEC % 8 == 0, "alignment");
    static_assert((2 * STAGES + 3) * 8 <= 256, "barriers");
    static_assert(SMEM <= 227 * 1024, "shared memory");
    static_assert(KS == 1 || KS == 2, "a block or a pair");
};

// y's tile (m0, n0) of BN columns; FOLD: LayerNorm folded (MATMUL_LT_BIAS or _GELU); COPY: the
// residual product's copy and parts (MATMUL_LT_BIAS_RESIDUAL).
// KS = 2: K split over a cluster of two blocks, which multiply the same 128 x 2 BN tile over one half
// of K each, then exchange halves of their partial sums (st_async into the other's inbox), so that
// each finishes BN columns: against a whole-K 128 x BN tile a block reads x for half of K, not all of
// it (the MLP projection's x is 3/4 of what its blocks read from L2). BY_ROWS: the pair multiplies a
// 128 x BN tile, and the block of rank r finishes its rows 64 r.. (its warpgroup r's): twice the blocks
// of a whole-K tile, for prompts whose row tiles are too few to fill the device.
template <int BN, int KS, bool BY_ROWS, int STAGES, int EPI, bool FOLD, bool COPY>
__global__ void __launch_bounds__(THREADS, 1)
    tiles_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap x_tail_map,
                 const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap old_map,
                 const __grid_constant__ CUtensorMap old_tail_map, Args a) {
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    typedef Layout<BN, KS, BY_ROWS, STAGES, EPI> L;
    constexpr bool RESID = L::RESID;
    constexpr int WN = L::WN;  // W's rows a block multiplies
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    float *old = reinterpret_cast<float *>(smem + L::RING);
    float4 *inbox = reinterpret_cast<float4 *>(smem + L::RING + L::OLD);
    float *vec_bias = reinterpret_cast<float *>(smem + L::RING + L::OLD + L::INBOX), *vec_s = vec_bias + BN,
          *vec_g = vec_s + BN, *vec_c = vec_g + BN;
    unsigned char *tail = smem + L::RING + L::OLD + L::INBOX + L::VEC;
    uint64_t *full = reinterpret_cast<uint64_t *>(tail), *empty = full + STAGES, *epi_bar = empty + STAGES,
             *old_bar = epi_bar + 1, *inbox_bar = old_bar + 1;
    float *row_a = reinterpret_cast<float *>(tail + 256), *row_b = row_a + BM;

    // A cluster's blocks are consecutive: rank r takes K slices [r k_steps, (r + 1) k_steps) of W's
    // rows [nw, nw + WN) and finishes y's columns [n0, n0 + BN) (BY_ROWS: of the tile's rows 64 r..).
    const int M = a.M, N = a.N, K = a.K, k_steps = K / BK / KS, rank = blockIdx.x % KS, k0 = rank * k_steps * BK;
    const int m_tiles = (M + BM - 1) / BM, m0 = blockIdx.x / KS % m_tiles * BM, nw = blockIdx.x / KS / m_tiles * WN,
              n0 = BY_ROWS ? nw : nw + rank * BN;
    const int tid = threadIdx.x;
    pdl_launch_dependents();  // kernels/pdl.cuh: the next grid may be scheduled (it waits for this one)
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 8);  // 8 consumer warps
        mbar_init(epi_bar, 32 + (FOLD ? 64 : 0));
        mbar_init(old_bar, 1);
        if (KS > 1) mbar_init(inbox_bar, 1);
        mbar_fence_init();
        if (KS > 1) mbar_arrive_expect_tx(inbox_bar, L::INBOX);  // the other block's partial sums
    }
    __syncthreads();
    // "Started": the barriers are initialised, so the other block may store into this one once it has
    // waited on this phase (cluster.cuh).
    if constexpr (KS > 1) cluster_arrive_relaxed();

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
            const CUtensorMap *xm = rows < BM ? &x_tail_map : &x_map;
            const uint32_t stage_bytes = (WN + rows) * BK * 2;
            tma_prefetch_map(xm), tma_prefetch_map(&w_map);
            const int ahead = min(k_steps, STAGES);
            for (int k = 0; k < ahead; k++) {
                mbar_arrive_expect_tx(&full[k], stage_bytes);
                tma_load(wt(k), &w_map, k0 + k * BK, nw, &full[k]);
            }
            pdl_wait();  // x (and y's old rows) come from the kernels before
            for (int k = 0; k < ahead; k++) tma_load(xt(k), xm, k0 + k * BK, m0, &full[k]);
            if (RESID) {  // the rows this block finishes (BY_ROWS: maybe none, past M)
                constexpr int OM = BY_ROWS ? 64 : BM;
                const int o0 = BY_ROWS ? 64 * rank : 0, orows = max(0, min(OM, M - m0 - o0));
                mbar_arrive_expect_tx(old_bar, orows * BN * 4);
                if (orows > 0) tma_load(old + o0 * BN, orows < OM ? &old_tail_map : &old_map, n0, m0 + o0, old_bar);
            }
            for (int k = ahead; k < k_steps; k++) {
                const int s = k % STAGES;
                mbar_wait(&empty[s], (k / STAGES - 1) & 1);  // the consumers are done with slice k - STAGES
                mbar_arrive_expect_tx(&full[s], stage_bytes);
                tma_load(wt(s), &w_map, k0 + k * BK, nw, &full[s]);
                tma_load(xt(s), xm, k0 + k * BK, m0, &full[s]);
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
            // Rows tid - 64 and tid: every load of both (parts and shifts) issued before the first use, one
            // round trip. A row past M reads row M - 1's (its results are not used).
            const float cnt = (float)K / a.nparts, inv_cnt = 1.f / cnt, inv_k = 1.f / K;
            float2 v[2][GEMM_TILES_MAX_PARTS];
            float c[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = min(m0 + tid - 64 + 64 * h, M - 1);
                const float2 *p = reinterpret_cast<const float2 *>(a.parts_in) + (size_t)row * a.nparts;
#pragma unroll
                for (int j = 0; j < GEMM_TILES_MAX_PARTS; j++) v[h][j] = j < a.nparts ? p[j] : make_float2(0.f, 0.f);
                c[h] = a.shift ? a.shift[row] : 0.f;
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = tid - 64 + 64 * h, row = m0 + r;
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < GEMM_TILES_MAX_PARTS; j++) sum += v[h][j].x;
                const float mean = sum * inv_k;
                // Chan: the parts' M2 and their means' spread, cnt (sum_j / cnt - mean)^2 as (sum_j - cnt mean)^2
                // / cnt. No division: their slow path (taken for zero sums, as the rows past M had) made the last
                // row tile's statistics 2-4 us late (docs/PERF.md, "Session 62").
                float m2 = 0.f;
#pragma unroll
                for (int j = 0; j < GEMM_TILES_MAX_PARTS; j++) {
                    const float d = fmaf(-cnt, mean, v[h][j].x);
                    if (j < a.nparts) m2 += fmaf(d * d, inv_cnt, v[h][j].y);
                }
                const float rstd = rsqrtf(m2 * inv_k + 1e-5f);
                row_a[r] = rstd;
                row_b[r] = (mean - c[h]) * rstd;
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
    float part[WN / 8][4];  // this block's partial sums over its K slices
#pragma unroll
    for (int j = 0; j < WN / 8; j++) part[j][0] = part[j][1] = part[j][2] = part[j][3] = 0.f;
    for (int k = 0; k < k_steps; k++) {
        const int s = k % STAGES;
        mbar_wait(&full[s], (k / STAGES) & 1);
        const uint64_t xd = wgmma_desc_sw128(smem + s * L::STAGE + c * 64 * 128),
                       wd = wgmma_desc_sw128(smem + s * L::STAGE + BM * BK * 2);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_ss<WN>(part, xd + 2 * kk, wd + 2 * kk);
        wgmma_commit();
        wgmma_wait<1>();  // slice k - 1's MMAs are done: its stage is free where a later slice needs it
        if (k > 0 && k - 1 + STAGES < k_steps && lane == 0) mbar_arrive(&empty[(k - 1) % STAGES]);
    }
    wgmma_wait<0>();
    wgmma_hold(part);
    // acc: y's BN columns of this thread, over all of K
    float acc[BN / 8][4];
    if constexpr (KS == 1) {
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] = part[j][e];
    } else if constexpr (BY_ROWS) {
        // Warpgroup c holds rows 64 c.. of both blocks' partial sums: the block of rank c finishes them,
        // the other warpgroup sends its sums there (fragment order, as below) and is done. Both wait on
        // the cluster barrier, as every consumer does below (under compute-sanitizer's racecheck a
        // consumer that arrived and never waited held the senders there).
        cluster_wait();  // the other block has started: its inbox barrier is initialised
        if (c != rank) {
            const uint32_t to = cluster_map(inbox, rank ^ 1), bar = cluster_map(inbox_bar, rank ^ 1);
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
                st_async(to + (uint32_t)(j * 128 + t) * 16, make_float4(part[j][0], part[j][1], part[j][2], part[j][3]),
                         bar);
            named_barrier(3, 256);  // done with the ring (the other warpgroup's staging)
            return;
        }
        mbar_wait_cluster(inbox_bar, 0);
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const float4 q = inbox[j * 128 + t];
            acc[j][0] = part[j][0] + q.x, acc[j][1] = part[j][1] + q.y;
            acc[j][2] = part[j][2] + q.z, acc[j][3] = part[j][3] + q.w;
        }
    } else {
        // The other block's columns of this thread's partial sums to its inbox, in fragment order (a
        // thread's float4s 16 bytes apart, without conflicts), then its sums of this block's columns in.
        cluster_wait();  // the other block has started: its inbox barrier is initialised
        const int ct = tid - 128;
        const uint32_t to = cluster_map(inbox, rank ^ 1), bar = cluster_map(inbox_bar, rank ^ 1);
        // part[j][e] of the upper (hi) or lower half of the columns (selects, not an indexed register
        // array, which would spill)
        auto partial = [&](int j, int e, bool hi) { return hi ? part[j + BN / 8][e] : part[j][e]; };
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
            st_async(to + (uint32_t)(j * 256 + ct) * 16,
                     make_float4(partial(j, 0, !rank), partial(j, 1, !rank), partial(j, 2, !rank),
                                 partial(j, 3, !rank)),
                     bar);
        mbar_wait_cluster(inbox_bar, 0);
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const float4 q = inbox[j * 256 + ct];
            acc[j][0] = partial(j, 0, rank) + q.x, acc[j][1] = partial(j, 1, rank) + q.y;
            acc[j][2] = partial(j, 2, rank) + q.z, acc[j][3] = partial(j, 3, rank) + q.w;
        }
    }
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
        // y += the staged values, from the old tile. A quad of lanes a row: thread t takes rows q and
        // q + 32 (q = t / 4), float4 columns u, u + 4, ... (u = t % 4), so that COPY's statistics of a
        // row are a quad's shuffles, not a second staging pass after a barrier: the copy's cost over the
        // plain product at 1024 rows 0.84 -> 0.47 us in the MLP projection, 0.84 -> 0.72 in the
        // attention projection (docs/PERF.md, "Session 61").
        constexpr int V = BN / 16;  // float4s a thread a row
        static_assert(BN % 16 == 0, "whole float4s a lane");
        float *y = static_cast<float *>(a.y);
        const int q = t / 4, u = t % 4;
        mbar_wait(old_bar, 0);  // landed during the K loop
        float4 nv[2][V];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int v = 0; v < V; v++) {
                const int r = q + 32 * h, cc = 4 * (u + 4 * v);
                const float4 d = *reinterpret_cast<const float4 *>((const float *)stage + r * L::LD + cc),
                             o = *reinterpret_cast<const float4 *>(old + (64 * c + r) * BN + cc);
                nv[h][v] = make_float4(o.x + d.x, o.y + d.y, o.z + d.z, o.w + d.w);
            }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = q + 32 * h, row = mr0 + r;
            if (row < M)
#pragma unroll
                for (int v = 0; v < V; v++)
                    *reinterpret_cast<float4 *>(y + (size_t)row * a.ldy + n0 + 4 * (u + 4 * v)) = nv[h][v];
            if constexpr (COPY) {
                // The copy gamma (y - c), and the row's sum and M2 about its mean over these BN columns.
                const float cr = vec_c[64 * c + r];
                float sum = 0.f;
#pragma unroll
                for (int v = 0; v < V; v++) {
                    const float4 x = nv[h][v], g = *reinterpret_cast<const float4 *>(vec_g + 4 * (u + 4 * v));
                    sum += (x.x + x.y) + (x.z + x.w);
                    const __nv_bfloat162 lo = __floats2bfloat162_rn(g.x * (x.x - cr), g.y * (x.y - cr)),
                                         hi = __floats2bfloat162_rn(g.z * (x.z - cr), g.w * (x.w - cr));
                    const uint2 pk = {*reinterpret_cast<const uint32_t *>(&lo),
                                      *reinterpret_cast<const uint32_t *>(&hi)};
                    if (row < M) *reinterpret_cast<uint2 *>(a.copy + (size_t)row * N + n0 + 4 * (u + 4 * v)) = pk;
                }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                const float mean = sum / BN;
                float m2 = 0.f;
#pragma unroll
                for (int v = 0; v < V; v++) {
                    const float4 x = nv[h][v];
                    const float d0 = x.x - mean, d1 = x.y - mean, d2 = x.z - mean, d3 = x.w - mean;
                    m2 += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
                }
                m2 += __shfl_xor_sync(0xffffffffu, m2, 1);
                m2 += __shfl_xor_sync(0xffffffffu, m2, 2);
                if (u == 0 && row < M)
                    reinterpret_cast<float2 *>(a.parts)[(size_t)row * (N / BN) + n0 / BN] = make_float2(sum, m2);
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
template <int BN, int KS, bool BY_ROWS, int STAGES, int EPI, bool FOLD, bool COPY> cudaError_t allow() {
    static bool done;
    if (done) return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(tiles_kernel<BN, KS, BY_ROWS, STAGES, EPI, FOLD, COPY>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)Layout<BN, KS, BY_ROWS, STAGES, EPI>::SMEM);
    done = e == cudaSuccess;
    return e;
}

// How many of its blocks the device holds at once: whole clusters of KS in one GPC each.
template <int BN, int KS, bool BY_ROWS, int STAGES, int EPI, bool FOLD, bool COPY> int resident_blocks() {
    static int blocks = -1;
    const void *kernel = (const void *)tiles_kernel<BN, KS, BY_ROWS, STAGES, EPI, FOLD, COPY>;
    if (blocks < 0)
        blocks = allow<BN, KS, BY_ROWS, STAGES, EPI, FOLD, COPY>() != cudaSuccess ? 0
                 : KS == 1 ? device_attr<cudaDevAttrMultiProcessorCount>(0)
                           : KS * max_active_clusters(kernel, KS, THREADS, Layout<BN, KS, BY_ROWS, STAGES, EPI>::SMEM);
    return blocks;
}

// x: the bf16 rows multiplied (the fold's copy); blocks: block_count's.
template <int BN, int KS, bool BY_ROWS, int STAGES, int EPI, bool FOLD, bool COPY>
cudaError_t launch(const Args &a, const void *x, const void *W, long long blocks, cudaStream_t stream) {
    typedef Layout<BN, KS, BY_ROWS, STAGES, EPI> L;
    const int tail = a.M % BM ? a.M % BM : BM;  // the last row tile's rows
    // the residual's old rows a block finishes: 128, or BY_ROWS 64 (the last tile's part of them)
    const int old_rows = BY_ROWS ? 64 : BM, old_tail = BY_ROWS ? (tail % 64 ? tail % 64 : 64) : tail;
    CUtensorMap x_map, x_tail_map, w_map, old_map = {}, old_tail_map = {};
    if (!tensor_map(&x_map, x, a.M, a.K, a.K, BM) || !tensor_map(&x_tail_map, x, a.M, a.K, a.K, tail) ||
        !tensor_map(&w_map, W, a.N, a.K, a.K, L::WN) ||
        (L::RESID && (!tensor_map_f32(&old_map, a.y, a.M, a.N, a.ldy, BN, old_rows) ||
                      !tensor_map_f32(&old_tail_map, a.y, a.M, a.N, a.ldy, BN, old_tail))))
        return cudaErrorInvalidValue;
    const cudaError_t e = allow<BN, KS, BY_ROWS, STAGES, EPI, FOLD, COPY>();
    if (e != cudaSuccess) return e;
    return launch_pdl_cluster(tiles_kernel<BN, KS, BY_ROWS, STAGES, EPI, FOLD, COPY>, dim3((unsigned)blocks),
                              dim3(THREADS), L::SMEM, KS, stream, x_map, x_tail_map, w_map, old_map, old_tail_map, a);
}

// GPT-2 124M's four layer products, each with the epilogue GPT-2 gives it, in three sets of tiles:
//   - 16 column tiles (one wave of 128 blocks at 1024 rows, 3/5 of one at 513), stages measured at 1024
//     rows on an H200; the MLP projection's K split over pairs of blocks (6 stages: the most its inbox
//     leaves room for) took it 11.9 to 11.1 us there, the attention projection's (K = 768) 5.0 to 5.9
//     (docs/PERF.md, "Session 61");
//   - 32 blocks a row tile, for 257-512 rows (3-4 row tiles): qkv and fc half as wide, the projections'
//     K split over pairs that finish half of the rows each (docs/PERF.md, "Session 62"); their stages
//     about as many as fit (fewer lost 5-8 us of the first token at 160-300 tokens, "Session 63");
//   - for 129-256 rows (2 row tiles) qkv and fc 48 wide (48 and 64 blocks a row tile; 6 and 10 stages
//     measured even with 8), the projections the 32-block set's (docs/PERF.md, "Session 63").
// A row's statistics come in parts of the residual products' BN columns, the same in every set.
struct Shape {
    int N, K, BN, ks;
    bool by_rows;
    int stages;
    MatmulLtEpilogue epilogue;
};
constexpr Shape kShapes[] = {
    {2304, 768, 48, 1, false, 8, MATMUL_LT_BIAS},          // qkv, 48 blocks a row tile
    {3072, 768, 48, 1, false, 8, MATMUL_LT_BIAS_GELU},     // fc, 64
    {2304, 768, 72, 1, false, 8, MATMUL_LT_BIAS},          // qkv, 32 blocks a row tile
    {3072, 768, 96, 1, false, 7, MATMUL_LT_BIAS_GELU},     // fc
    {768, 768, 48, 2, true, 6, MATMUL_LT_BIAS_RESIDUAL},   // attention projection
    {768, 3072, 48, 2, true, 7, MATMUL_LT_BIAS_RESIDUAL},  // MLP projection
    {2304, 768, 144, 1, false, 4, MATMUL_LT_BIAS},         // qkv, 16 blocks a row tile
    {3072, 768, 192, 1, false, 4, MATMUL_LT_BIAS_GELU},    // fc
    {768, 768, 48, 1, false, 6, MATMUL_LT_BIAS_RESIDUAL},  // attention projection
    {768, 3072, 48, 2, false, 6, MATMUL_LT_BIAS_RESIDUAL}, // MLP projection
};
constexpr int kShapeCount = sizeof(kShapes) / sizeof(kShapes[0]);

// The blocks of shape i's grid at M rows: one a tile, two a BY_ROWS tile.
long long block_count(int i, int M) {
    return (long long)(M + BM - 1) / BM * (kShapes[i].N / kShapes[i].BN) * (kShapes[i].by_rows ? 2 : 1);
}

constexpr bool parts_agree() {  // every residual product of an N splits its rows' statistics alike
    for (int i = 0; i < kShapeCount; i++)
        for (int j = 0; j < kShapeCount; j++)
            if (kShapes[i].epilogue == MATMUL_LT_BIAS_RESIDUAL && kShapes[j].epilogue == MATMUL_LT_BIAS_RESIDUAL &&
                kShapes[i].N == kShapes[j].N && kShapes[i].BN != kShapes[j].BN)
                return false;
    return true;
}
static_assert(parts_agree(), "a row's parts must not depend on the rows");

// A tile's kernels: plain, or folded (BIAS, GELU) or with the copy (RESIDUAL); the blocks of it the
// device holds at once (the variants differ in code, not in resources).
template <int I> struct Tiles {
    static constexpr Shape S = kShapes[I];
    static constexpr bool R = S.epilogue == MATMUL_LT_BIAS_RESIDUAL;
    static cudaError_t run(bool fold_or_copy, const Args &a, const void *x, const void *W, cudaStream_t stream) {
        const long long n = block_count(I, a.M);
        return fold_or_copy ? launch<S.BN, S.ks, S.by_rows, S.stages, S.epilogue, !R, R>(a, x, W, n, stream)
                            : launch<S.BN, S.ks, S.by_rows, S.stages, S.epilogue, false, false>(a, x, W, n, stream);
    }
    static int resident() { return resident_blocks<S.BN, S.ks, S.by_rows, S.stages, S.epilogue, false, false>(); }
};

template <int I = 0>
cudaError_t run(int i, bool fold_or_copy, const Args &a, const void *x, const void *W, cudaStream_t stream) {
    if constexpr (I + 1 < kShapeCount)
        if (i != I) return run<I + 1>(i, fold_or_copy, a, x, W, stream);
    return Tiles<I>::run(fold_or_copy, a, x, W, stream);
}
template <int I = 0> int resident(int i) {
    if constexpr (I + 1 < kShapeCount)
        if (i != I) return resident<I + 1>(i);
    return Tiles<I>::resident();
}

// The tiles for M x N x K: the first set (in kShapes's order) whose blocks the device holds at once, else
// the last that has the shape; -1 for none.
int find_shape(int M, int N, int K) {
    int last = -1;
    for (int i = 0; i < kShapeCount; i++)
        if (kShapes[i].N == N && kShapes[i].K == K) {
            if (block_count(i, M) <= resident(i)) return i;
            last = i;
        }
    return last;
}

// The checks every entry point shares: cudaErrorInvalidValue for bad arguments, cudaErrorNotSupported
// for what it does not run; the shape's index in *shape.
cudaError_t check(MatmulLtEpilogue epilogue, const void *y, long long ldy, const void *x, const void *W,
                  const void *bias, int M, int N, int K, int *shape) {
    if (M < 0 || N <= 0 || K <= 0 || ldy < N || !y || !x || !W || !bias ||
        (epilogue != MATMUL_LT_BIAS && epilogue != MATMUL_LT_BIAS_GELU && epilogue != MATMUL_LT_BIAS_RESIDUAL))
        return cudaErrorInvalidValue;
    if (!gemm_tiles_available() || M > GEMM_TILES_MAX_ROWS) return cudaErrorNotSupported;
    *shape = find_shape(M, N, K);
    const int vec = epilogue == MATMUL_LT_BIAS_RESIDUAL ? 4 : 8;  // elements in 16 bytes of y
    if (*shape < 0 || kShapes[*shape].epilogue != epilogue || !aligned16(x) || !aligned16(W) || !aligned16(y) ||
        ldy % vec)
        return cudaErrorNotSupported;
    return cudaSuccess;
}

}  // namespace

extern "C" int gemm_tiles_available(void) {
    static int off = -1;
    if (off < 0) off = env_off("GPT2_GEMM_TILES");
    return !off && tma_wgmma_runs();
}

// Two or more row tiles whose blocks make 2/5 to one wave (of clusters that fit at once, for a K split):
// one tile a block, so its epilogue overlaps nothing but the next kernel's start; past a wave a block
// runs its tiles one after another and cuBLASLt's persistent kernels win (twice as fast at 8192 rows,
// docs/PERF.md "Session 60"). Below a wave the prompt still gains the LayerNorm kernels and the PDL'd
// boundaries: on an H200, 5 and 6 row tiles of the 16-column-tile set (80 and 96 blocks, 513-768 rows)
// took the first token -20 to -64 us, 4 of them (64 blocks) lost up to 22 us (docs/PERF.md, "Session
// 62"); 2 row tiles of the narrowest set (64-128 blocks, 129-256 rows) -29 to -52 us ("Session 63").
// One row tile is left to gemm_rows and cuBLASLt: taken, with the projections' pairs a quarter of a
// wave, 80-128 tokens lost 20-30 us (2-12 with qkv and fc 32 wide) and decode steps of 96-128 rows 2-4%
// ("Session 63").
extern "C" int gemm_tiles_takes(int M, int N, int K) {
    if (!gemm_tiles_available() || M <= BM || M > GEMM_TILES_MAX_ROWS) return 0;
    const int i = find_shape(M, N, K);
    if (i < 0) return 0;
    const long long b = block_count(i, M), sms = device_attr<cudaDevAttrMultiProcessorCount>(0);
    return b <= resident(i) && 5 * b >= 2 * sms;
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
