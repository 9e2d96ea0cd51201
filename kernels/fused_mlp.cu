// The MLP sub-block of a few rows in one kernel: what and why in fused_mlp.h. The row staging, the
// LayerNorm and the dot products are the decode GEMV's (kernels/linear_kernels.cuh).
#include "fused_mlp.h"

#include "linear_kernels.cuh"

namespace {

using lin::bf16;

constexpr int THREADS = lin::GEMV_THREADS;  // normalize_rows and block_sum_rows work in blocks of this size
constexpr int WARPS = THREADS / 32;
constexpr int FIN_COLS = 32;                // output columns a finishing block sums
constexpr int FIN_GROUPS = THREADS / FIN_COLS;  // threads sharing a column, each over every FIN_GROUPS-th block

// How the hidden units split: HB a block (a multiple of 8, so the 16-byte chunks of both
// matrices' slices start aligned), nb blocks, at most one per SM; KP: C rounded up to the dot
// products' lane stride (32 lanes x 16 bytes), as the GEMV does.
struct Plan {
    int HB, KP, nb;
    int smem;
};

// Shared memory of one block, in this order: fcw's rows [HB][KP], fcprojw's columns [C][HB] (both
// in W's dtype), then fp32: x [MT][KP], gamma [KP], LayerNorm scratch [WARPS + 3][MT], b' [HB],
// hidden [MT][HB], the finishers' sums [FIN_GROUPS][MT][FIN_COLS].
template <typename WT>
__host__ __device__ constexpr int smem_bytes(int MT, int C, int HB, int KP) {
    return (HB * KP + C * HB) * (int)sizeof(WT) +
           (MT * KP + KP + (WARPS + 3) * MT + HB + MT * HB + FIN_GROUPS * MT * FIN_COLS) * 4;
}

template <typename WT>
bool make_plan(int C, int H, int MT, const lin::DeviceInfo &d, Plan *p) {
    constexpr int CH = 32 * (16 / sizeof(WT));
    if (C <= 0 || H <= 0 || C % 8 || H % 8) return false;
    const int per_sm = (H + d.sms - 1) / d.sms;
    p->HB = (per_sm + 7) / 8 * 8;
    p->nb = (H + p->HB - 1) / p->HB;
    p->KP = (C + CH - 1) / CH * CH;
    p->smem = smem_bytes<WT>(MT, C, p->HB, p->KP);
    return p->smem <= d.smem_optin;
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// counters[0]: blocks arrived this call; counters[1]: finishers past their wait. Both back at zero
// when the kernel ends. partial: [nb][M][C].
template <typename WT, int MT>
__global__ void __launch_bounds__(THREADS, 2)
mlp_kernel(float *__restrict__ x, int M, int C, int H, int HB, int KP, const float *__restrict__ gamma,
           const WT *__restrict__ fcw, const float *__restrict__ fcb, const WT *__restrict__ projw,
           const float *__restrict__ projb, float *__restrict__ partial, unsigned *__restrict__ counters) {
    constexpr int VEC = 16 / sizeof(WT), CH = 32 * VEC;
    static_assert(THREADS % FIN_COLS == 0, "finisher groups");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    WT *wf = reinterpret_cast<WT *>(smem_raw);
    WT *wp = wf + HB * KP;
    float *xs = reinterpret_cast<float *>(wp + C * HB);
    float *gs = xs + MT * KP;
    float *scratch = gs + KP;
    float *fb = scratch + (WARPS + 3) * MT;
    float *hs = fb + HB;
    float *fin = hs + MT * HB;
    __shared__ unsigned ticket;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int nb = (int)gridDim.x, u0 = (int)blockIdx.x * HB;  // this block's first hidden unit

    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();
    // --- 1. this block's weights, before the previous kernel has finished ---
    const int fc_chunks = KP / VEC, proj_chunks = HB / VEC;  // 16-byte chunks a row
    for (int i = tid; i < HB * fc_chunks; i += THREADS) {
        const int u = i / fc_chunks, k = (i - u * fc_chunks) * VEC;
        const bool ok = u0 + u < H && k < C;
        cp_async16(wf + u * KP + k, ok ? fcw + (size_t)(u0 + u) * C + k : fcw, ok ? 16 : 0);
    }
    for (int i = tid; i < C * proj_chunks; i += THREADS) {
        const int n = i / proj_chunks, u = (i - n * proj_chunks) * VEC;
        const bool ok = u0 + u < H;
        cp_async16(wp + n * HB + u, ok ? projw + (size_t)n * H + u0 + u : projw, ok ? 16 : 0);
    }
    cp_async_commit();
    for (int k = tid; k < KP; k += THREADS) gs[k] = k < C ? __ldg(gamma + k) : 0.0f;
    for (int u = tid; u < HB; u += THREADS) fb[u] = u0 + u < H ? __ldg(fcb + u0 + u) : 0.0f;

    // --- 2. the rows of x, normalised ---
    pdl_wait();
    for (int i = tid; i < MT * KP; i += THREADS) {
        const int m = i / KP, k = i - m * KP;
        xs[m * KP + lin::xs_pos<WT, float>(k)] = (m < M && k < C) ? x[(size_t)m * C + k] : 0.0f;
    }
    __syncthreads();
    lin::normalize_rows<WT, MT>(xs, gs, scratch, C, KP, tid);
    cp_async_wait<0>();
    __syncthreads();

    // --- 3. the hidden units: warp w takes units w, w + WARPS, ..., lanes split K ---
    for (int u = warp; u < HB; u += WARPS) {
        float acc[MT][1];
#pragma unroll
        for (int m = 0; m < MT; m++) acc[m][0] = 0.0f;
        for (int k = lane * VEC; k < KP; k += CH) {
            const uint4 w[1] = {*reinterpret_cast<const uint4 *>(wf + u * KP + k)};
            lin::gemv_fma<WT, float, MT, 1>(acc, w, xs, KP, k);
        }
#pragma unroll
        for (int m = 0; m < MT; m++) {
            float v = acc[m][0];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) hs[m * HB + u] = u0 + u < H ? lin::gelu_tanh(v + fb[u]) : 0.0f;
        }
    }
    __syncthreads();

    // --- 4. this block's share of the projection, every output column ---
    float *mine = partial + (size_t)blockIdx.x * M * C;
    for (int n = tid; n < C; n += THREADS) {
        float acc[MT];
#pragma unroll
        for (int m = 0; m < MT; m++) acc[m] = 0.0f;
        for (int u = 0; u < HB; u += VEC) {
            float w[VEC];
            lin::unpack16<WT>(*reinterpret_cast<const uint4 *>(wp + n * HB + u), w);
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[m] = fmaf(w[e], hs[m * HB + u + e], acc[m]);
        }
#pragma unroll
        for (int m = 0; m < MT; m++)
            if (m < M) mine[(size_t)m * C + n] = acc[m];
    }

    // --- 5. arrival: the last `finishers` blocks to arrive each finish slices of FIN_COLS columns ---
    __syncthreads();  // the block's partials are all written
    if (tid == 0) {
        __threadfence();  // ... and visible to whoever reads them after the count
        ticket = atomicAdd(&counters[0], 1u);
    }
    __syncthreads();
    const int slices = (C + FIN_COLS - 1) / FIN_COLS, finishers = min(slices, nb);
    const int rank = nb - 1 - (int)ticket;  // 0: the last block to arrive
    if (rank >= finishers) return;
    // The first slice's residual and bias, read while the other blocks finish.
    const int col = tid % FIN_COLS, grp = tid / FIN_COLS;
    const int n0 = rank * FIN_COLS + col;
    float x_old[MT], bias0 = 0.0f;
#pragma unroll
    for (int m = 0; m < MT; m++) x_old[m] = (grp == 0 && m < M && n0 < C) ? x[(size_t)m * C + n0] : 0.0f;
    if (grp == 0 && n0 < C && projb) bias0 = __ldg(projb + n0);
    if (tid == 0) {
        // Every block that has not arrived yet is running: this one waits on no block it keeps out
        // of an SM. A bound far past any real wait turns a bug into an error, not a hang.
        for (long long spin = 0; ld_acquire(&counters[0]) < (unsigned)nb; spin++) {
            __nanosleep(64);
            if (spin > (1LL << 26)) __trap();
        }
        if (atomicAdd(&counters[1], 1u) == (unsigned)finishers - 1) {  // every finisher is past the wait
            atomicExch(&counters[0], 0u);
            atomicExch(&counters[1], 0u);
        }
    }
    __syncthreads();

    // --- 6. finish: sum the partials in block order (group g takes blocks g, g + FIN_GROUPS, ...,
    // then the groups add in order), add the bias, add into x ---
    for (int s = rank; s < slices; s += finishers) {
        const int n = s * FIN_COLS + col;
        float sum[MT];
#pragma unroll
        for (int m = 0; m < MT; m++) sum[m] = 0.0f;
        if (n < C) {
#pragma unroll 16
            for (int j = grp; j < nb; j += FIN_GROUPS)
#pragma unroll
                for (int m = 0; m < MT; m++)
                    if (m < M) sum[m] += __ldcg(partial + ((size_t)j * M + m) * C + n);
        }
#pragma unroll
        for (int m = 0; m < MT; m++) fin[(grp * MT + m) * FIN_COLS + col] = sum[m];
        __syncthreads();
        if (grp == 0 && n < C) {
            const float b = s == rank ? bias0 : (projb ? __ldg(projb + n) : 0.0f);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (m >= M) continue;
                float t = fin[m * FIN_COLS + col];
#pragma unroll
                for (int g = 1; g < FIN_GROUPS; g++) t += fin[(g * MT + m) * FIN_COLS + col];
                const float old = s == rank ? x_old[m] : x[(size_t)m * C + n];
                x[(size_t)m * C + n] = old + (t + b);
            }
        }
        __syncthreads();  // fin is rewritten by the next slice
    }
}

template <typename WT, int MT>
cudaError_t launch_mt(float *x, int M, int C, int H, const float *gamma, const void *fcw, const float *fcb,
                      const void *projw, const float *projb, float *partial, unsigned *counters,
                      const lin::DeviceInfo &d, cudaStream_t stream) {
    Plan p;
    if (!make_plan<WT>(C, H, MT, d, &p)) return cudaErrorInvalidValue;
    auto kern = mlp_kernel<WT, MT>;
    static int done[16];
    cudaError_t err = lin::allow_smem(kern, p.smem, done);
    if (err != cudaSuccess) return err;
    return launch_pdl(kern, dim3(p.nb), dim3(THREADS), p.smem, stream, x, M, C, H, p.HB, p.KP, gamma,
                      static_cast<const WT *>(fcw), fcb, static_cast<const WT *>(projw), projb, partial, counters);
}

template <typename WT>
cudaError_t launch(float *x, int M, int C, int H, const float *gamma, const void *fcw, const float *fcb,
                   const void *projw, const float *projb, float *partial, unsigned *counters,
                   const lin::DeviceInfo &d, cudaStream_t stream) {
    if (M == 1) return launch_mt<WT, 1>(x, M, C, H, gamma, fcw, fcb, projw, projb, partial, counters, d, stream);
    if (M == 2) return launch_mt<WT, 2>(x, M, C, H, gamma, fcw, fcb, projw, projb, partial, counters, d, stream);
    return launch_mt<WT, 4>(x, M, C, H, gamma, fcw, fcb, projw, projb, partial, counters, d, stream);
}

// The counters, then the partials 256 bytes in.
constexpr size_t kCounterBytes = 256;

}  // namespace

extern "C" int fused_mlp_fits(DType wtype, int C, int H) {
    lin::DeviceInfo d;
    if (lin::device_info(&d)) return 0;
    Plan p;
    if (wtype == DTYPE_BF16) return make_plan<bf16>(C, H, FUSED_MLP_MAX_ROWS, d, &p);
    if (wtype == DTYPE_F32) return make_plan<float>(C, H, FUSED_MLP_MAX_ROWS, d, &p);
    return 0;
}

extern "C" size_t fused_mlp_workspace_size(int max_rows, int C, int H) {
    lin::DeviceInfo d;
    if (max_rows <= 0 || C <= 0 || H <= 0 || lin::device_info(&d)) return 0;
    const size_t per_sm = ((size_t)H + d.sms - 1) / d.sms, hb = (per_sm + 7) / 8 * 8, nb = (H + hb - 1) / hb;
    return kCounterBytes + nb * (size_t)max_rows * C * sizeof(float);
}

extern "C" int fused_mlp(float *x, int M, int C, int H, const float *ln_gamma, const void *fcw, const float *b_folded,
                         const void *fcprojw, const float *fcprojb, DType wtype, void *workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
    if (M < 0 || M > FUSED_MLP_MAX_ROWS || !x || !ln_gamma || !fcw || !b_folded || !fcprojw || !workspace)
        return cudaErrorInvalidValue;
    if (wtype != DTYPE_F32 && wtype != DTYPE_BF16) return cudaErrorInvalidValue;
    if (!fused_mlp_fits(wtype, C, H)) return cudaErrorInvalidValue;
    if (M == 0) return cudaSuccess;
    if (workspace_bytes < fused_mlp_workspace_size(M, C, H)) return cudaErrorInvalidValue;
    lin::DeviceInfo d;
    const int derr = lin::device_info(&d);
    if (derr) return derr;
    unsigned *counters = static_cast<unsigned *>(workspace);
    float *partial = reinterpret_cast<float *>(static_cast<char *>(workspace) + kCounterBytes);
    if (wtype == DTYPE_BF16)
        return (int)launch<bf16>(x, M, C, H, ln_gamma, fcw, b_folded, fcprojw, fcprojb, partial, counters, d, stream);
    return (int)launch<float>(x, M, C, H, ln_gamma, fcw, b_folded, fcprojw, fcprojb, partial, counters, d, stream);
}
