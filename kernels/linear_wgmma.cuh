// The tiled kernel on Hopper's warpgroup MMA (sm_90a, bf16): linear_kernels.cuh's tc_kernel with its
// products on wgmma (wgmma.cuh) and launched programmatically dependent (pdl.cuh), for many rows
// (prefill, the forward of all positions). Included by linear_kernels.cuh, inside namespace lin.
//
// A block owns a BM x BN output tile, BM = 64 WGS rows (one warpgroup each) by BN = 64 NB
// columns, and walks K in steps of 64:
//   - W's [BN][64] slice of a step is stored under the 128-byte swizzle (wgmma.cuh), 128-byte rows
//     of one output column each, and read by the tensor cores through a descriptor (K-major B);
//   - x's [BM][64] slice is staged plainly (row stride 72: conflict-free fragment loads) and each
//     warp builds its m16k16 A fragments in registers: bf16 rows by ldmatrix, or with the LayerNorm
//     folded in from the fp32 rows, as gamma (x - c) rounded to bf16 while the same values feed the
//     row statistics (the folded form and the shift c of fused_ln_linear.h, exactly as tc_kernel);
//   - a warpgroup multiplies its 64 rows by the NB 64-column tiles: 4 NB wgmma.m64n64k16 a step;
//   - S stages of cp.async: W's slices of the first S - 1 steps are requested before pdl_wait()
//     (nothing in the step writes weights), x's after it;
//   - the epilogue is the shared one (epi_store2) straight from the accumulators, whose layout is
//     mma.sync's: plain (bias, GELU, bf16 or fp32), QKV into the cache, or the residual add.
// Each step waits for its own products before the next (wgmma_wait<0>), so a stage is free once
// every warpgroup has passed the next step's barrier; other warpgroups and blocks on the SM fill
// the tensor cores meanwhile.
//
// Included by linear_kernels.cuh after its kernels and device facts (Epilogue, epi_store2,
// DeviceInfo, allow_smem), whose dispatch (launch_linear) calls launch_wg.
#pragma once

#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "wgmma.cuh"

namespace lin {

// A stage's bytes: W's [64 nb][64] bf16 slice (swizzled, a multiple of 1024), x's [64 wgs][72]
// rows (fp32 with the LayerNorm, else bf16) and gamma's 64 values, rounded up to 1024.
__host__ __device__ constexpr int wg_stage_bytes(int wgs, int nb, bool ln) {
    return (64 * nb * 128 + 64 * wgs * 72 * (ln ? 4 : 2) + (ln ? 256 : 0) + 1023) / 1024 * 1024;
}
// Stages: as many as fit 227 KB (an SM's shared memory on sm_90) up to six, which keeps four steps
// of loads in flight behind the step being multiplied. Plans need four (wg_plan).
__host__ __device__ constexpr int wg_stages(int wgs, int nb, bool ln) {
    return (227 * 1024 - 1024) / wg_stage_bytes(wgs, nb, ln) < 6 ? (227 * 1024 - 1024) / wg_stage_bytes(wgs, nb, ln)
                                                                  : 6;
}

// Shapes and shared memory of a block of WGS warpgroups over NB 64-column tiles.
template <int WGS, int NB, bool LN>
struct WgTile {
    static constexpr int THREADS = 128 * WGS, BM = 64 * WGS, BN = 64 * NB, BK = 64;
    static constexpr int S = wg_stages(WGS, NB, LN);
    static constexpr int XLD = BK + 8;                       // x's staged row stride, in elements
    static constexpr int W_BYTES = BN * BK * 2;
    static constexpr int X_BYTES = BM * XLD * (LN ? 4 : 2);
    static constexpr int STAGE = wg_stage_bytes(WGS, NB, LN);
    static constexpr int CLD = BN + 8;                       // the epilogue's staged rows, in floats
    static constexpr int SMEM = S * STAGE + 1024;            // + room to align the first stage to 1024 bytes
    static_assert(S >= 3 && BM * CLD * 4 + 8 * BM <= S * STAGE, "the stages and the epilogue's staging fit");
};

// One operand's 16-byte chunks of a K step, as a thread issues them: chunk i of the thread is row
// r0 + i * RSTEP, column chunk c (the same for every i: the block's threads are a multiple of the
// chunks a row), so its source is src + i * RSTEP * ld + k and its place in shared memory dst +
// i * RSTEP * row bytes; `rows` marks the chunks whose row exists.
template <int CHUNKS>
struct WgLoads {
    const char *src;
    long long stride;  // bytes between chunk i and i + 1 in global memory
    uint32_t dst;      // byte offset of chunk 0 in a stage
    int dstep;         // bytes between chunk i and i + 1 in shared memory
    int k_elem;        // the chunk's first column, in elements
    uint32_t rows;     // bit i: chunk i's row exists

    __device__ __forceinline__ void issue(unsigned char *stage, long long k_bytes, bool k_ok) const {
#pragma unroll
        for (int i = 0; i < CHUNKS; i++) {
            const bool ok = k_ok && (rows >> i & 1);
            cp_async16(stage + dst + i * dstep, ok ? src + i * stride + k_bytes : src, ok ? 16 : 0);
        }
    }
};

template <int WGS, int NB, bool LN>
__global__ void __launch_bounds__(128 * WGS, 1)
wg_kernel(const void *__restrict__ x_, long long ldx, const float *__restrict__ gamma, const bf16 *__restrict__ W,
          int M, int N, int K, Epilogue e) {
    using T = WgTile<WGS, NB, LN>;
    constexpr int S = T::S;
    using X = typename std::conditional<LN, float, bf16>::type;
    constexpr int XCPR = 64 * (int)sizeof(X) / 16;  // x's 16-byte chunks a row of a step
    constexpr int WCH = T::BN * 8 / T::THREADS, XCH = T::BM * XCPR / T::THREADS;
    pdl_launch_dependents();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (uint32_t)__cvta_generic_to_shared(smem_raw) % 1024) % 1024);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
    const int row0 = 16 * warp;  // the warp's 16 rows of the tile (warpgroup warp / 4 has 64 of them)
    const int m0 = blockIdx.y * T::BM, n0 = blockIdx.x * T::BN, KT = (K + T::BK - 1) / T::BK;

    // --- the loads' addresses, once: W's rows under the swizzle, x's rows plain ---
    WgLoads<WCH> wl;
    {
        const int r = tid / 8, c = tid % 8;  // rows r + i * THREADS / 8: the same r % 8, so the same swizzle
        wl.src = reinterpret_cast<const char *>(W + (size_t)min(n0 + r, N - 1) * K + 8 * c);
        wl.stride = (long long)(T::THREADS / 8) * K * 2;
        wl.dst = (uint32_t)(r * 128 + 16 * (c ^ (r % 8)));
        wl.dstep = T::THREADS / 8 * 128;
        wl.k_elem = 8 * c;
        wl.rows = 0;
#pragma unroll
        for (int i = 0; i < WCH; i++) wl.rows |= (uint32_t)(n0 + r + i * (T::THREADS / 8) < N) << i;
    }
    WgLoads<XCH> xl;
    {
        const int r = tid / XCPR, c = tid % XCPR, epc = 16 / (int)sizeof(X);
        xl.src = reinterpret_cast<const char *>(reinterpret_cast<const X *>(x_) + (size_t)min(m0 + r, M - 1) * ldx +
                                                epc * c);
        xl.stride = (long long)(T::THREADS / XCPR) * ldx * (long long)sizeof(X);
        xl.dst = (uint32_t)(T::W_BYTES + (r * T::XLD + epc * c) * (int)sizeof(X));
        xl.dstep = T::THREADS / XCPR * T::XLD * (int)sizeof(X);
        xl.k_elem = epc * c;
        xl.rows = 0;
#pragma unroll
        for (int i = 0; i < XCH; i++) xl.rows |= (uint32_t)(m0 + r + i * (T::THREADS / XCPR) < M) << i;
    }
    auto stage = [&](int t) { return smem + (t % S) * T::STAGE; };
    auto load_w = [&](int t) {
        const int k0 = t * T::BK;
        wl.issue(stage(t), 2LL * k0, k0 + wl.k_elem < K);
        if constexpr (LN) {
            if (tid < 16) {
                const int k = k0 + 4 * tid;
                cp_async16(stage(t) + T::W_BYTES + T::X_BYTES + 16 * tid, k < K ? gamma + k : gamma, k < K ? 16 : 0);
            }
        }
    };
    auto load_x = [&](int t) {
        const int k0 = t * T::BK;
        xl.issue(stage(t), (long long)sizeof(X) * k0, k0 + xl.k_elem < K);
    };

    // Groups: W's slices of steps 0..S-2, then x's, then one group a step (steps S-1..).
#pragma unroll
    for (int t = 0; t < S - 1; t++) {
        if (t < KT) load_w(t);
        cp_async_commit();
    }
    pdl_wait();
#pragma unroll
    for (int t = 0; t < S - 1; t++) {
        if (t < KT) load_x(t);
        cp_async_commit();
    }

    float acc[NB][8][4];
#pragma unroll
    for (int j = 0; j < NB; j++)
#pragma unroll
        for (int t = 0; t < 8; t++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[j][t][q] = 0.0f;
    float c[2] = {0.0f, 0.0f}, s1[2] = {0.0f, 0.0f}, s2[2] = {0.0f, 0.0f};  // LN: rows gid, gid + 8

    // The warp's A fragments of step t's four k16 steps, from its staged rows.
    auto build_a = [&](int t, uint32_t(&a)[4][4]) {
        const unsigned char *st = stage(t);
        if constexpr (LN) {
            const float *xs = reinterpret_cast<const float *>(st + T::W_BYTES) + (row0 + gid) * T::XLD;
            const float *gs = reinterpret_cast<const float *>(st + T::W_BYTES + T::X_BYTES);
            if (t == 0) {
                // The shift: the mean of the row's first min(K, 32) values, summed as tc_kernel's
                // LnRows does (quads of 4, then pairs of quads): tests emulate the bf16 rounding.
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float q[8];
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const float4 v = *reinterpret_cast<const float4 *>(xs + 8 * h * T::XLD + 4 * i);
                        q[i] = ((v.x + v.y) + v.z) + v.w;  // zero past K (zero-filled)
                    }
                    c[h] = (((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7]))) / (float)min(K, 32);
                }
            }
            const int k0 = t * T::BK;
            const bool tail = k0 + T::BK > K;
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int k = 16 * kk + 8 * half + 2 * tig;
                    const float2 g = *reinterpret_cast<const float2 *>(gs + k);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const float2 v = *reinterpret_cast<const float2 *>(xs + 8 * h * T::XLD + k);
                        float d0 = v.x - c[h], d1 = v.y - c[h];
                        if (tail) {
                            if (k0 + k >= K) d0 = 0.0f;
                            if (k0 + k + 1 >= K) d1 = 0.0f;
                        }
                        s1[h] += d0;
                        s1[h] += d1;
                        s2[h] = fmaf(d0, d0, s2[h]);
                        s2[h] = fmaf(d1, d1, s2[h]);
                        a[kk][h + 2 * half] = pack_bf16x2(d0 * g.x, d1 * g.y);
                    }
                }
        } else {
            const bf16 *xs = reinterpret_cast<const bf16 *>(st + T::W_BYTES);
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                ldmatrix_x4(a[kk], xs + (row0 + lane % 16) * T::XLD + 16 * kk + (lane / 16) * 8);
        }
    };

    // Step t: its products go out on a (built before), then, while the tensor cores run them, the
    // next step's operands are waited for and its fragments built into a_next. Step t - 1's
    // products are complete in every warpgroup after the barrier, so its stage takes step
    // t + S - 1's loads and its fragments (a_next) are free.
    auto step = [&](int t, uint32_t(&a)[4][4], uint32_t(&a_next)[4][4]) {
        const uint64_t desc = wgmma_desc_sw128(stage(t));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {  // a k16 step: 32 bytes on; 64 columns: 64 rows of 128 bytes
            if constexpr (NB == 3) {
                wgmma_m64n192k16(reinterpret_cast<float(&)[24][4]>(acc[0]), a[kk], desc + 2 * kk);
            } else if constexpr (NB % 2 == 0) {
#pragma unroll
                for (int j = 0; j < NB; j += 2)
                    wgmma_m64n128k16(reinterpret_cast<float(&)[16][4]>(acc[j]), a[kk],
                                     desc + (uint64_t)(j * 64 * 128 >> 4) + 2 * kk);
            } else {
                wgmma_m64n64k16<0>(acc[0], a[kk], desc + 2 * kk, true);
            }
        }
        wgmma_commit();
        wgmma_wait<1>();
        cp_async_wait<S - 3>();    // step t + 1 landed (this thread's part)
        fence_proxy_async_smem();  // W's slices, written by cp.async, are read by the tensor cores
        __syncthreads();
        if (t + S - 1 < KT) load_w(t + S - 1), load_x(t + S - 1);
        cp_async_commit();
        if (t + 1 < KT) build_a(t + 1, a_next);
    };

    uint32_t a0[4][4], a1[4][4];
    cp_async_wait<S - 2>();  // step 0 landed
    fence_proxy_async_smem();
    __syncthreads();
    build_a(0, a0);
    for (int t = 0; t < KT; t += 2) {
        step(t, a0, a1);
        if (t + 1 < KT) step(t + 1, a1, a0);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < NB; j++) wgmma_hold(acc[j]);
    cp_async_wait<0>();  // the last groups are empty; none may be left in flight at exit
    __syncthreads();     // every warpgroup is done with the stages: the epilogue's staging goes over them

    // --- epilogue: the accumulators (and LN's row statistics) through shared memory, then the block
    // stores rows of column pairs with one inlined copy of the shared epilogue ---
    float *Cs = reinterpret_cast<float *>(smem), *row_dmean = Cs + T::BM * T::CLD, *row_rstd = row_dmean + T::BM;
#pragma unroll
    for (int j = 0; j < NB; j++)
#pragma unroll
        for (int t = 0; t < 8; t++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                *reinterpret_cast<float2 *>(Cs + (row0 + gid + 8 * h) * T::CLD + 64 * j + 8 * t + 2 * tig) =
                    make_float2(acc[j][t][2 * h], acc[j][t][2 * h + 1]);
    if constexpr (LN) {
#pragma unroll
        for (int h = 0; h < 2; h++) {  // the quad's four threads hold the row's columns
#pragma unroll
            for (int o = 1; o < 4; o <<= 1) {
                s1[h] += __shfl_xor_sync(0xffffffffu, s1[h], o);
                s2[h] += __shfl_xor_sync(0xffffffffu, s2[h], o);
            }
            const float dm = s1[h] / K;
            if (tig == 0) {
                row_dmean[row0 + gid + 8 * h] = dm;
                row_rstd[row0 + gid + 8 * h] = 1.0f / sqrtf(fmaxf(s2[h] / K - dm * dm, 0.0f) + LN_EPS);
            }
        }
    }
    __syncthreads();
#pragma unroll 1
    for (int idx = tid; idx < T::BM * T::BN / 2; idx += T::THREADS) {
        const int r = idx / (T::BN / 2), cc = 2 * (idx % (T::BN / 2)), m = m0 + r, n = n0 + cc;
        if (m >= M || n >= N) continue;
        const float2 v = *reinterpret_cast<const float2 *>(Cs + r * T::CLD + cc);
        const float dm = LN ? row_dmean[r] : 0.0f, rs = LN ? row_rstd[r] : 1.0f;
        epi_store2(e, m, n, ln_apply(e, LN, n, v.x, dm, rs), n + 1 < N ? ln_apply(e, LN, n + 1, v.y, dm, rs) : 0.0f);
    }
}

// ----------------------------------------------------------------------------
// Host side.

// 1 where the kernel can run this product: compute capability 9.0 exactly (sm_90a code does not
// run on later GPUs) from a build with sm_90a code, whole 16-byte chunks of x's, W's and gamma's rows.
inline bool wg_ok(int K, long long ldx, const void *x, const void *W, const float *gamma, bool ln,
                  const DeviceInfo &d) {
#if GPT2_SM90A
    const long long xq = ln ? 4 : 8;  // elements of x a 16-byte chunk
    return d.cc == 90 && K % 8 == 0 && ldx % xq == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(W) % 16 == 0 && (!ln || reinterpret_cast<uintptr_t>(gamma) % 16 == 0);
#else
    (void)K, (void)ldx, (void)x, (void)W, (void)gamma, (void)ln, (void)d;
    return false;
#endif
}

// The tile: warpgroups (wgs: 64 rows each) and 64-column tiles (nb) of a block. Each SM takes
// ceil(blocks / SMs) blocks in turn, each costing its MMAs (BM x BN a k step) plus its operands'
// loads (BM + BN rows a k step, weighted 32): the least costly plan wins, the larger tile on a
// tie. GPT2_WG_TILE=wgs,nb forces one (measurements, tests), read at every call.
struct WgPlan {
    int wgs, nb;
};
inline WgPlan wg_plan(int M, int N, bool ln, const DeviceInfo &d) {
    const char *env = getenv("GPT2_WG_TILE");
    if (env && *env) {
        const int wgs = atoi(env), nb = strchr(env, ',') ? atoi(strchr(env, ',') + 1) : 0;
        if (wgs >= 1 && wgs <= 2 && nb >= 1 && nb <= 4 && wg_stages(wgs, nb, ln) >= 4) return {wgs, nb};
    }
    WgPlan best = {1, 1};
    long long best_cost = -1;
    for (int wgs = 2; wgs >= 1; wgs--)
        for (int nb = 4; nb >= 1; nb--) {
            if (wg_stages(wgs, nb, ln) < 4) continue;
            const int bm = 64 * wgs, bn = 64 * nb;
            const long long blocks = (long long)((M + bm - 1) / bm) * ((N + bn - 1) / bn);
            const long long cost = (blocks + d.sms - 1) / d.sms * ((long long)bm * bn + 32LL * (bm + bn));
            if (best_cost < 0 || cost < best_cost) best = {wgs, nb}, best_cost = cost;
        }
    return best;
}

template <int WGS, int NB, bool LN>
inline cudaError_t launch_wg_k(const void *x, long long ldx, const float *gamma, const bf16 *W, int M, int N, int K,
                               const Epilogue &e, const DeviceInfo &d, cudaStream_t stream) {
    using T = WgTile<WGS, NB, LN>;
    if (T::SMEM > d.smem_optin) return cudaErrorInvalidValue;
    auto kern = wg_kernel<WGS, NB, LN>;
    static int done[16];  // per instantiation and device
    cudaError_t err = allow_smem(kern, T::SMEM, done);
    if (err != cudaSuccess) return err;
    const dim3 grid((N + T::BN - 1) / T::BN, (M + T::BM - 1) / T::BM);
    if (grid.y > 65535) return cudaErrorInvalidValue;
    return launch_pdl(kern, grid, dim3(T::THREADS), T::SMEM, stream, x, ldx, gamma, W, M, N, K, e);
}

// Only the tiles with four stages or more are built (wg_plan picks no other).
template <int WGS, bool LN>
inline cudaError_t launch_wg_n(const void *x, long long ldx, const float *gamma, const bf16 *W, int M, int N, int K,
                               int nb, const Epilogue &e, const DeviceInfo &d, cudaStream_t stream) {
    switch (nb) {
    case 1: return launch_wg_k<WGS, 1, LN>(x, ldx, gamma, W, M, N, K, e, d, stream);
    case 2: return launch_wg_k<WGS, 2, LN>(x, ldx, gamma, W, M, N, K, e, d, stream);
    case 3:
        if constexpr (wg_stages(WGS, 3, LN) >= 4) return launch_wg_k<WGS, 3, LN>(x, ldx, gamma, W, M, N, K, e, d, stream);
        break;
    default:
        if constexpr (wg_stages(WGS, 4, LN) >= 4) return launch_wg_k<WGS, 4, LN>(x, ldx, gamma, W, M, N, K, e, d, stream);
        break;
    }
    return cudaErrorInvalidValue;
}

// Callers check wg_ok first.
template <bool LN>
inline cudaError_t launch_wg(const void *x, long long ldx, const float *gamma, const bf16 *W, int M, int N, int K,
                             const Epilogue &e, const DeviceInfo &d, cudaStream_t stream) {
    const WgPlan p = wg_plan(M, N, LN, d);
    if (p.wgs == 2) return launch_wg_n<2, LN>(x, ldx, gamma, W, M, N, K, p.nb, e, d, stream);
    return launch_wg_n<1, LN>(x, ldx, gamma, W, M, N, K, p.nb, e, d, stream);
}

}  // namespace lin
