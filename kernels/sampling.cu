// Sampling on the device: the next token of each sequence is chosen where the logits are, so a
// decode step sends only B token ids back to the host instead of B x V logits (12.9 MB at B = 64).
//
// The choice is the host sampler's (src/sampler.c) for the same uniform draw u:
//   greedy (temperature 0): the first index of the largest logit;
//   otherwise: p_i = exp((l_i - max) / T); keep the top k by (p desc, id asc); the smallest prefix
//   whose float sum reaches top_p of the kept sum; pick where u * prefix_sum falls.
//
// Layout: one block reading a 200 KB row several times is latency-bound on one SM (top-k 40 cost
// ~70 us more than greedy in an H200 decode step), so each row is split over S blocks (grid S x B,
// 256 threads), block s owning the contiguous chunk [s*C, (s+1)*C). Each block reads its chunk
// once and writes its candidates to the workspace:
//   greedy: the chunk's (largest logit, lowest index);
//   top-k:  the chunk's k best by (logit desc, id asc). The k best of the row are among them: a
//           logit beaten by k others in its own chunk is beaten by k in the row.
// The last of a row's blocks to finish (a counter per row, left at zero for the next call or
// graph replay) merges the S partials: for greedy the best of S; for top-k the k best of the S*k
// candidates, then the probabilities, the rank by (p desc, id asc), the nucleus and the pick.
// The chunk and merge selections cost about V/S and S*k key visits, so S ~ sqrt(V/k) balances
// them (32 blocks at k = 40 and for greedy, 15 at k = 256), with S*B kept to about one wave at
// large batch. Workspace, per row: the counter and room for 32 x 256 candidates (64 KB), the same
// for every call, so one zeroed workspace serves every batch and vocabulary.
//
// Selection is a radix select over 64-bit rank keys, the logit's order-preserving key above the
// complement of its id, so that the order is (logit desc, id asc) with no two keys equal: tied
// logits go to the lower id (the tie order of the host's final (p desc, id asc) sort) without a
// pass of their own. Each thread holds its keys in registers (up to 32): one histogram pass per
// 8-bit digit, scanned by one warp, two block barriers a pass, stopping once a digit's bin is
// taken whole (usually within the logit's four digits); then one shared-memory atomic a warp
// hands out the selected keys' slots. That is 1.6-2.1x faster than keys in shared memory, a block
// scan per digit and a gather in id order (docs/PERF.md, "Session 20").
//
// The nucleus sums are sequential float adds in the host's order (one thread), so the kept mass
// and the pick match the host's to the bit; only expf may differ by an ulp from the host's.
#include <cuda/atomic>

#include <algorithm>
#include <climits>
#include <cmath>

#include "pdl.cuh"
#include "rank_key.cuh"
#include "sampling.h"

namespace {

constexpr int kThreads = 256;  // each clears one of the radix select's 256 digit bins
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSplits = 32;                                     // blocks per row
constexpr int kMaxChunk = DEVICE_SAMPLING_MAX_VOCAB / kMaxSplits;  // logits per block
constexpr int kMaxCandidates = kMaxSplits * kMaxDeviceTopK;        // the merge's keys
constexpr int kMaxPerThread = 32;  // rank keys a thread holds in registers: one bit each in a mask
constexpr int kMaxBlocks = 1024;  // S x B: about one wave of 256-thread blocks on an H100 or H200
static_assert(kThreads == 256, "each thread clears one of the radix select's 256 digit bins");
static_assert(kMaxDeviceTopK <= kThreads, "the pick ranks one candidate per thread");
static_assert(kMaxSplits <= 32, "the greedy merge takes one partial per lane of a warp");
static_assert(kMaxChunk <= kMaxPerThread * kThreads && kMaxCandidates <= kMaxPerThread * kThreads,
              "a chunk and the merge's candidates fit the threads' registers");

// ----------------------------------------------------------------------------
// The end of a block's share (keys: rank_key.cuh)

// Called by every thread once its writes to the row's workspace are done. True in the last of the
// row's `splits` blocks to arrive, which then sees all their writes (read them with __ldcg); that
// block also sets the counter back to zero for the next call. The barrier orders the block's
// writes before thread 0's increment, whose release publishes them and whose acquire, in the last
// block, makes the others' visible to the threads after the second barrier (CUTLASS's semaphore
// pattern; 0.3 us faster than a fence in every thread).
__device__ bool last_to_arrive(unsigned *counter, int splits, unsigned *ticket) {
    __syncthreads();
    if (threadIdx.x == 0)
        *ticket = cuda::atomic_ref<unsigned, cuda::thread_scope_device>(*counter).fetch_add(1u, cuda::memory_order_acq_rel);
    __syncthreads();
    if (*ticket != (unsigned)splits - 1) return false;
    if (threadIdx.x == 0) *counter = 0;
    return true;
}

// ----------------------------------------------------------------------------
// Greedy

struct Best {
    unsigned key;
    int id;
};

__device__ __forceinline__ Best better(Best a, Best b) {
    if (a.key != b.key) return a.key > b.key ? a : b;
    return a.id < b.id ? a : b;  // the first maximum, as the host's strict '>' scan
}

__device__ __forceinline__ Best warp_best(Best v) {
    for (int o = 16; o > 0; o >>= 1)
        v = better(v, Best{__shfl_xor_sync(0xffffffffu, v.key, o), __shfl_xor_sync(0xffffffffu, v.id, o)});
    return v;
}

// Row workspace: [counter | the S blocks' (key, id)].
__global__ void __launch_bounds__(kThreads)
    greedy_kernel(const float *__restrict__ logits, int V, long long stride, int chunk, int splits,
                  uint2 *__restrict__ ws, long long ws_row, int *__restrict__ next, int *__restrict__ next_copy) {
    __shared__ Best warp_part[kWarps];
    __shared__ unsigned ticket;
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();
    pdl_wait();
    const int b = blockIdx.y, s = blockIdx.x, tid = threadIdx.x;
    const float *row = logits + b * stride;
    uint2 *row_ws = ws + b * ws_row;
    const int lo = s * chunk, hi = min(V, lo + chunk);

    Best best = {0u, INT_MAX};
#pragma unroll 4
    for (int i = lo + tid; i < hi; i += kThreads) best = better(best, Best{float_key(row[i]), i});
    best = warp_best(best);
    if ((tid & 31) == 0) warp_part[tid >> 5] = best;
    __syncthreads();
    if (tid < 32) {
        best = warp_best(tid < kWarps ? warp_part[tid] : Best{0u, INT_MAX});
        if (tid == 0) row_ws[1 + s] = make_uint2(best.key, (unsigned)best.id);
    }
    if (!last_to_arrive(&row_ws[0].x, splits, &ticket)) return;
    if (tid < 32) {
        Best part = {0u, INT_MAX};
        if (tid < splits) {
            const uint2 c = __ldcg(&row_ws[1 + tid]);
            part = Best{c.x, (int)c.y};
        }
        part = warp_best(part);
        if (tid == 0) {
            next[b] = part.id;
            if (next_copy) next_copy[b] = part.id;
        }
    }
}

// ----------------------------------------------------------------------------
// Top-k: radix select over rank keys held in registers

// Candidates are rank keys (rank_key.cuh).

// The selected rank keys: those whose bits under mask are at least prefix.
struct Selection {
    unsigned long long prefix, mask;
};

struct SelectShared {
    alignas(16) unsigned hist[256];  // zero between passes: the scanning warp clears each bin it reads
    unsigned long long prefix;
    int need, exact;
    unsigned taken;  // the gather's next free slot; zero once a selection returns
};

// Warp 0, after a histogram pass at `shift`: the digit whose bin holds the need-th largest of the
// keys still in play (lane l scans digits 255 - 8l down to 248 - 8l), clearing every bin.
__device__ void find_digit(Selection sel, int need, int shift, SelectShared &sh) {
    const int lane = threadIdx.x & 31;
    // Two 16-byte loads and stores a lane: bins 248 - 8l .. 255 - 8l, count[i] = digit 255 - 8l - i.
    uint4 *bins = reinterpret_cast<uint4 *>(sh.hist) + 2 * (31 - lane);
    const uint4 low = bins[0], high = bins[1];
    bins[0] = bins[1] = make_uint4(0u, 0u, 0u, 0u);
    const unsigned count[8] = {high.w, high.z, high.y, high.x, low.w, low.z, low.y, low.x};
    unsigned total = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) total += count[i];
    unsigned above = total;  // inclusive scan over the lanes, then exclusive
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned t = __shfl_up_sync(0xffffffffu, above, o);
        if (lane >= o) above += t;
    }
    above -= total;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (above < (unsigned)need && (unsigned)need <= above + count[i]) {
            sh.prefix = sel.prefix | (unsigned long long)(255 - 8 * lane - i) << shift;
            sh.need = need - (int)above;
            sh.exact = above + count[i] == (unsigned)need;  // the whole bin is taken: no finer digit needed
        }
        above += count[i];
    }
}

// The k largest of the n rank keys spread over the block, thread t holding rk[j] for position
// t + j * kThreads (those at n and past it are ignored): exactly min(k, n) of them are selected.
// One pass per 8-bit digit from the top, each a histogram of the keys still in play and a scan by
// one warp; it stops once a digit's bin is taken whole, usually within the logit's key.
template <int KPT>
__device__ Selection radix_select(const unsigned long long (&rk)[KPT], int n, int k, SelectShared &sh) {
    const int tid = threadIdx.x;
    Selection sel = {0ull, 0ull};
    if (n <= k) return sel;
    int need = k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        // Plain atomics: lanes of a warp that share a bin (logits crowd into a few values of the top
        // digit, sign and exponent) cost the hardware a replay each, which is still 1.35-1.5x
        // faster than grouping them first with __match_any_sync (docs/PERF.md, "Session 20").
#pragma unroll
        for (int j = 0; j < KPT; j++)
            if (tid + j * kThreads < n && (rk[j] & sel.mask) == sel.prefix)
                atomicAdd(&sh.hist[(unsigned)(rk[j] >> shift) & 255u], 1u);
        __syncthreads();
        if (tid < 32) find_digit(sel, need, shift, sh);
        __syncthreads();
        sel = Selection{sh.prefix, sel.mask | 255ull << shift};
        need = sh.need;
        if (sh.exact) break;
    }
    return sel;
}

// emit(slot, j) for each selected rk[j] of this thread, slots 0.. in no particular order: one
// shared-memory atomic a warp. Call with sh.taken at zero; it leaves it at zero for the next.
template <int KPT, typename Emit>
__device__ void gather(const unsigned long long (&rk)[KPT], int n, Selection sel, SelectShared &sh, Emit emit) {
    const int tid = threadIdx.x, lane = tid & 31;
    unsigned mine = 0;
#pragma unroll
    for (int j = 0; j < KPT; j++)
        if (tid + j * kThreads < n && (rk[j] & sel.mask) >= sel.prefix) mine |= 1u << j;
    const unsigned count = __popc(mine);
    unsigned end = count;  // inclusive scan over the warp
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned t = __shfl_up_sync(0xffffffffu, end, o);
        if (lane >= o) end += t;
    }
    unsigned base = 0;
    if (lane == 31 && end) base = atomicAdd(&sh.taken, end);
    unsigned slot = __shfl_sync(0xffffffffu, base, 31) + end - count;
#pragma unroll
    for (int j = 0; j < KPT; j++)
        if (mine >> j & 1u) emit((int)slot++, j);
    __syncthreads();
    if (tid == 0) sh.taken = 0;  // read by no one until the next gather, after a barrier
}

// ----------------------------------------------------------------------------
// Top-k: probabilities, rank, nucleus and the pick

struct PickShared {
    unsigned key[kMaxDeviceTopK];
    int id[kMaxDeviceTopK];
    unsigned long long order[kMaxDeviceTopK];  // (p bits, ~id): larger comes first
    alignas(16) float prob[kMaxDeviceTopK];    // by rank, then its prefix sums
    int ranked_id[kMaxDeviceTopK];
    unsigned max_key;  // zero before the merge
};

// Called by one warp: the first i < n with pred(prefix[i]), or n - 1 if there is none.
template <typename Pred>
__device__ int first_index(const float *prefix, int n, Pred pred) {
    const int lane = threadIdx.x & 31;
    for (int base = 0; base < n; base += 32) {
        const unsigned hit = __ballot_sync(0xffffffffu, base + lane < n && pred(prefix[base + lane]));
        if (hit) return base + __ffs(hit) - 1;
    }
    return n - 1;
}

// From the row's k candidates in pk.key / pk.id (visible to all threads): next = the pick.
__device__ void pick(PickShared &pk, int k, float temperature, float top_p, float u, int *next, int *next_copy) {
    const int c = threadIdx.x;
    const bool mine = c < k;
    const unsigned key = mine ? pk.key[c] : 0u;
    const unsigned warp_max = __reduce_max_sync(0xffffffffu, key);
    if ((c & 31) == 0) atomicMax(&pk.max_key, warp_max);
    __syncthreads();
    const float max_logit = key_float(pk.max_key);
    float p = 0.0f;
    int id = 0;
    unsigned long long order = 0;
    if (mine) {
        id = pk.id[c];
        p = expf((key_float(key) - max_logit) / temperature);
        order = (unsigned long long)__float_as_uint(p) << 32 | (0xffffffffu - (unsigned)id);
        pk.order[c] = order;
    }
    __syncthreads();
    if (mine) {
        int rank = 0;
        for (int j = 0; j < k; j++) rank += pk.order[j] > order;
        pk.prob[rank] = p;
        pk.ranked_id[rank] = id;
    } else if (c < (k + 3) / 4 * 4) {
        pk.prob[c] = 0.0f;  // the prefix sums below take whole float4s
    }
    __syncthreads();
    if (c >= 32) return;
    // The host's three loops (total, nucleus, pick) add the same terms from zero in the same
    // order: one sequential pass of prefix sums (lane 0, a float4 at a time, the next one loaded
    // ahead) serves all three, and as the sums never decrease, the first to reach a bound is found
    // by the warp, 32 at a time.
    float *prefix = pk.prob;
    if (c == 0) {
        float4 *quads = reinterpret_cast<float4 *>(prefix);
        const int nq = (k + 3) / 4;
        float sum = 0.0f;
        float4 ahead = quads[0];
        for (int q = 0; q < nq; q++) {
            float4 v = ahead;
            if (q + 1 < nq) ahead = quads[q + 1];
            v.x = sum += v.x;
            v.y = sum += v.y;
            v.z = sum += v.z;
            v.w = sum += v.w;
            quads[q] = v;
        }
    }
    __syncwarp();
    const float nucleus = top_p * prefix[k - 1];
    const int kept = 1 + first_index(prefix, k, [&](float sum) { return sum >= nucleus; });
    const float r = u * prefix[kept - 1];
    const int at = first_index(prefix, kept, [&](float sum) { return r < sum; });  // none: rounding left r at the top
    if (c == 0) {
        *next = pk.ranked_id[at];
        if (next_copy) *next_copy = pk.ranked_id[at];
    }
}

// Row workspace: [counter | candidates]: block s writes its chunk's per_chunk = min(k, C) best at
// s * per_chunk (the last chunk may have fewer), so the row's candidates are contiguous. KPT: rank
// keys a thread holds, enough for the chunk and for the merge's S * per_chunk candidates.
template <int KPT>
__global__ void __launch_bounds__(kThreads)
    top_k_kernel(const float *__restrict__ logits, int V, long long stride, int chunk, int splits, float temperature,
                 int top_k, float top_p, const float *__restrict__ uniforms, uint2 *__restrict__ ws, long long ws_row,
                 int *__restrict__ next, int *__restrict__ next_copy) {
    __shared__ SelectShared sh;
    __shared__ PickShared pk;
    __shared__ unsigned ticket;
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();
    // The draw before the wait: no kernel writes it, and it may be in host memory (a decode step's).
    const float u = uniforms[blockIdx.y];
    pdl_wait();
    const int b = blockIdx.y, s = blockIdx.x, tid = threadIdx.x;
    const float *row = logits + b * stride;
    uint2 *row_ws = ws + b * ws_row, *cand = row_ws + 1;
    const int lo = s * chunk, n = min(chunk, V - lo), per_chunk = min(top_k, chunk);

    sh.hist[tid] = 0;
    if (tid == 0) sh.taken = 0, pk.max_key = 0;
    unsigned long long rk[KPT];
#pragma unroll
    for (int j = 0; j < KPT; j++) {
        const int i = tid + j * kThreads;
        rk[j] = i < n ? rank_key(float_key(row[lo + i]), lo + i) : 0ull;
    }
    __syncthreads();

    // --- this chunk's best
    Selection sel = radix_select(rk, n, top_k, sh);
    gather(rk, n, sel, sh, [&](int slot, int j) {
        cand[s * per_chunk + slot] = make_uint2(rank_logit_key(rk[j]), (unsigned)rank_id(rk[j]));
    });
    if (!last_to_arrive(&row_ws[0].x, splits, &ticket)) return;

    // --- the last block: the row's best among all chunks' candidates, then the pick
    const int n_cand = (splits - 1) * per_chunk + min(top_k, V - (splits - 1) * chunk);
#pragma unroll
    for (int j = 0; j < KPT; j++) {
        const int i = tid + j * kThreads;
        if (i < n_cand) {
            const uint2 c = __ldcg(&cand[i]);
            rk[j] = rank_key(c.x, (int)c.y);
        }
    }
    sel = radix_select(rk, n_cand, top_k, sh);
    gather(rk, n_cand, sel, sh, [&](int slot, int j) {
        pk.key[slot] = rank_logit_key(rk[j]);
        pk.id[slot] = rank_id(rk[j]);
    });
    pick(pk, top_k, temperature, top_p, u, &next[b], next_copy ? &next_copy[b] : NULL);
}

// ----------------------------------------------------------------------------
// Host side

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Blocks per row of V logits (greedy counts as k = 1): sqrt(V/k) balances the chunk selections
// against the merge, at most kMaxSplits, about one wave for the whole batch, and every chunk
// within kMaxChunk and non-empty.
int row_splits(int V, int top_k, int B) {
    int s = std::min(kMaxSplits, (int)std::ceil(std::sqrt((double)V / top_k)));
    s = std::min(s, std::max(1, kMaxBlocks / B));
    s = std::max(s, ceil_div(V, kMaxChunk));
    return ceil_div(V, ceil_div(V, s));
}

// Workspace entries per row: the counter, then room for any call's candidates (at most S*k). The
// same for every vocabulary, so that counters stay where calls of any size left them, at zero.
constexpr long long kRowEntries = 1 + kMaxCandidates;

}  // namespace

extern "C" int device_sampling_supported(float temperature, int top_k, int vocab_size) {
    return vocab_size >= 1 && vocab_size <= DEVICE_SAMPLING_MAX_VOCAB &&
           (temperature <= 0.0f || (top_k >= 1 && top_k <= kMaxDeviceTopK && top_k < vocab_size));
}

extern "C" size_t sampling_workspace_size(int max_batch, int vocab_size) {
    if (max_batch < 1 || vocab_size < 1 || vocab_size > DEVICE_SAMPLING_MAX_VOCAB) return 0;
    return (size_t)max_batch * kRowEntries * sizeof(uint2);
}

extern "C" cudaError_t sample_on_device(const float *logits, int vocab_size, long long row_stride, int B,
                                        float temperature, int top_k, float top_p, const float *uniforms,
                                        int *next, int *next_copy, void *workspace, size_t workspace_bytes,
                                        cudaStream_t stream) {
    if (B < 1 || !workspace || !device_sampling_supported(temperature, top_k, vocab_size) ||
        workspace_bytes < sampling_workspace_size(B, vocab_size))
        return cudaErrorInvalidValue;
    const int V = vocab_size;
    const bool greedy = temperature <= 0.0f;
    const int splits = row_splits(V, greedy ? 1 : top_k, B), chunk = ceil_div(V, splits);
    const dim3 grid((unsigned)splits, (unsigned)B), block(kThreads);
    uint2 *ws = static_cast<uint2 *>(workspace);
    if (greedy)
        return launch_pdl(greedy_kernel, grid, block, 0, stream, logits, V, row_stride, chunk, splits, ws,
                          kRowEntries, next, next_copy);
    // Rank keys a thread holds: the larger of the chunk and the merge's candidates, over the block.
    const int per_thread = ceil_div(std::max(chunk, splits * std::min(top_k, chunk)), kThreads);
    auto kernel = per_thread <= 4 ? top_k_kernel<4> : per_thread <= 8 ? top_k_kernel<8>
                : per_thread <= 16 ? top_k_kernel<16> : top_k_kernel<kMaxPerThread>;
    return launch_pdl(kernel, grid, block, 0, stream, logits, V, row_stride, chunk, splits, temperature, top_k,
                      top_p, uniforms, ws, kRowEntries, next, next_copy);
}
