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
//   top-k:  the chunk's k best by (logit desc, id asc), in id order. The k best of the row are
//           among them: a logit beaten by k others in its own chunk is beaten by k in the row.
// The last of a row's blocks to finish (a counter per row, left at zero for the next call or
// graph replay) merges the S partials: for greedy the best of S; for top-k the k best of the S*k
// candidates, then the probabilities, the rank by (p desc, id asc), the nucleus and the pick.
// The chunk and merge selections cost about V/S and S*k key visits, so S ~ sqrt(V/k) balances
// them (32 blocks at k = 40 and for greedy, 15 at k = 256), with S*B kept to about one wave at
// large batch. Workspace, per row: the counter and room for 32 x 256 candidates (64 KB), the same
// for every call, so one zeroed workspace serves every batch and vocabulary.
//
// Selection is a radix select over the logits' order-preserving 32-bit keys, held in shared
// memory: four 8-bit digits at most, one histogram pass each, stopping early once a digit takes
// its whole bin (usually after two or three). Ties at the threshold go to the lower position,
// and positions are in id order in both selections, so the lower id wins: the tie order of the
// host's final (p desc, id asc) sort.
//
// The nucleus sums are sequential float adds in the host's order (one thread), so the kept mass
// and the pick match the host's to the bit; only expf may differ by an ulp from the host's.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>
#include <cmath>

#include "pdl.cuh"
#include "sampling.h"

namespace {

constexpr int kThreads = 256;  // one histogram bin per thread in the radix select
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSplits = 32;                                     // blocks per row
constexpr int kMaxChunk = DEVICE_SAMPLING_MAX_VOCAB / kMaxSplits;  // logits per block: 32 KB of keys
constexpr int kMaxCandidates = kMaxSplits * kMaxDeviceTopK;        // the merge's keys: 32 KB
constexpr int kMaxBlocks = 1024;  // S x B: about one wave of 256-thread blocks on an H100 or H200
static_assert(kThreads == 256, "the radix select gives each thread one of 256 digit bins");
static_assert(kMaxDeviceTopK <= kThreads, "the pick ranks one candidate per thread");
static_assert(kMaxSplits <= 32, "the greedy merge takes one partial per lane of a warp");

// ----------------------------------------------------------------------------
// Keys and the end of a block's share

// Order-preserving map of a float to uint32: larger float -> larger key. -0 becomes +0 first, so
// equal logits have equal keys (the host compares floats).
__device__ __forceinline__ unsigned float_key(float f) {
    const unsigned u = __float_as_uint(f + 0.0f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_float(unsigned key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Called by every thread once its writes to the row's workspace are done. True in the last of the
// row's `splits` blocks to arrive, which then sees all their writes (read them with __ldcg); that
// block also sets the counter back to zero for the next call.
__device__ bool last_to_arrive(unsigned *counter, int splits, unsigned *ticket) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) *ticket = atomicAdd(counter, 1u);
    __syncthreads();
    if (*ticket != (unsigned)splits - 1) return false;
    __threadfence();
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
                  uint2 *__restrict__ ws, long long ws_row, int *__restrict__ next) {
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
        if (tid == 0) next[b] = part.id;
    }
}

// ----------------------------------------------------------------------------
// Top-k: radix select and gather over keys in shared memory

using Scan = cub::BlockScan<int, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;

struct SelectShared {
    typename Scan::TempStorage scan;
    unsigned hist[256];  // zero between passes: each pass's reader clears its bin
    int warp_above[kWarps], warp_equal[kWarps];
    unsigned prefix;
    int need, exact;
};

// The k largest of keys[0, n): those whose bits under mask exceed prefix, and the first
// take_equal (lowest positions) whose bits under mask equal it.
struct Selection {
    unsigned prefix, mask;
    int take_equal;
};

__device__ Selection radix_select(const unsigned *keys, int n, int k, SelectShared &sh) {
    const int tid = threadIdx.x;
    if (n <= k) return Selection{0u, 0u, n};
    Selection sel = {0u, 0u, k};
    for (int shift = 24; shift >= 0; shift -= 8) {
        // Logits crowd into a few digit values (the top digit is sign and exponent), so the lanes
        // of a warp that share a bin add once, through their leader: fewer colliding atomics.
        for (int base = 0; base < n; base += kThreads) {
            const int i = base + tid;
            const unsigned key = i < n ? keys[i] : 0u;
            const unsigned bin = i < n && (key & sel.mask) == sel.prefix ? (key >> shift) & 255u : 256u;
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (bin < 256u && (tid & 31) == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], (unsigned)__popc(peers));
        }
        __syncthreads();
        // Thread t holds digit 255 - t: an inclusive scan counts the keys at this digit or above.
        const int digit = 255 - tid;
        const int count = (int)sh.hist[digit];
        sh.hist[digit] = 0;
        int at_or_above;
        Scan(sh.scan).InclusiveSum(count, at_or_above);
        const int above = at_or_above - count;
        if (above < sel.take_equal && sel.take_equal <= at_or_above) {
            sh.prefix = sel.prefix | (unsigned)digit << shift;
            sh.need = sel.take_equal - above;
            sh.exact = at_or_above == sel.take_equal;  // the whole bin is taken: no finer digit needed
        }
        __syncthreads();
        sel = Selection{sh.prefix, sel.mask | 255u << shift, sh.need};
        if (sh.exact) break;
    }
    return sel;
}

// emit(out, i) for each selected position i, out = its place among the selected in position
// order. Each warp walks a contiguous span 32 keys at a time; ballots rank within the warp.
template <typename Emit>
__device__ void gather(const unsigned *keys, int n, Selection sel, SelectShared &sh, Emit emit) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int span = (n + kThreads - 1) / kThreads * 32;
    const int lo = min(n, warp * span), hi = min(n, lo + span);
    const unsigned lanes_below = (1u << lane) - 1;
    int above = 0, equal = 0;
    for (int base = lo; base < hi; base += 32) {
        const int i = base + lane;
        const unsigned bits = i < hi ? keys[i] & sel.mask : 0u;
        above += __popc(__ballot_sync(0xffffffffu, i < hi && bits > sel.prefix));
        equal += __popc(__ballot_sync(0xffffffffu, i < hi && bits == sel.prefix));
    }
    if (lane == 0) sh.warp_above[warp] = above, sh.warp_equal[warp] = equal;
    __syncthreads();
    int out = 0, equal_before = 0;
    for (int w = 0; w < warp; w++) out += sh.warp_above[w], equal_before += sh.warp_equal[w];
    out += min(equal_before, sel.take_equal);
    for (int base = lo; base < hi; base += 32) {
        const int i = base + lane;
        const unsigned bits = i < hi ? keys[i] & sel.mask : 0u;
        const bool is_equal = i < hi && bits == sel.prefix;
        const unsigned equal_lanes = __ballot_sync(0xffffffffu, is_equal);
        const bool take = (i < hi && bits > sel.prefix) ||
                          (is_equal && equal_before + __popc(equal_lanes & lanes_below) < sel.take_equal);
        const unsigned took = __ballot_sync(0xffffffffu, take);
        if (take) emit(out + __popc(took & lanes_below), i);
        out += __popc(took);
        equal_before += __popc(equal_lanes);
    }
}

// ----------------------------------------------------------------------------
// Top-k: probabilities, rank, nucleus and the pick

struct PickShared {
    unsigned key[kMaxDeviceTopK];
    int id[kMaxDeviceTopK];
    unsigned long long order[kMaxDeviceTopK];  // (p bits, ~id): larger comes first
    float prob[kMaxDeviceTopK];                // by rank, then its prefix sums
    int ranked_id[kMaxDeviceTopK];
    unsigned max_key;  // zero before the merge
};

// From the row's k candidates in pk.key / pk.id (visible to all threads): next = the pick.
__device__ void pick(PickShared &pk, int k, float temperature, float top_p, float u, int *next) {
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
    }
    __syncthreads();
    if (c != 0) return;
    // The host's three loops (total, nucleus, pick) add the same terms from zero in the same
    // order: one pass of prefix sums serves all three, and as they never decrease, the first
    // prefix to reach a bound is a binary search.
    float *prefix = pk.prob, sum = 0.0f;
#pragma unroll 8
    for (int i = 0; i < k; i++) {
        sum += prefix[i];
        prefix[i] = sum;
    }
    const float nucleus = top_p * sum;
    int lo = 0, hi = k;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (prefix[mid] >= nucleus) hi = mid;
        else lo = mid + 1;
    }
    const int kept = lo < k ? lo + 1 : k;
    const float r = u * prefix[kept - 1];
    lo = 0, hi = kept;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (r < prefix[mid]) hi = mid;
        else lo = mid + 1;
    }
    *next = pk.ranked_id[lo < kept ? lo : kept - 1];  // rounding left r at the very top
}

// Row workspace: [counter | candidates]: block s writes its chunk's per_chunk = min(k, C) best at
// s * per_chunk (the last chunk may have fewer), so the row's candidates are contiguous, in id order.
__global__ void __launch_bounds__(kThreads)
    top_k_kernel(const float *__restrict__ logits, int V, long long stride, int chunk, int splits, float temperature,
                 int top_k, float top_p, const float *__restrict__ uniforms, uint2 *__restrict__ ws, long long ws_row,
                 int *__restrict__ next) {
    extern __shared__ unsigned keys[];  // the chunk's keys, then the row's candidates'
    __shared__ SelectShared sh;
    __shared__ PickShared pk;
    __shared__ unsigned ticket;
    TRACE_KERNEL_EXIT;  // kernels/kernel_trace.cuh: the exit stamp of TRACE=1 builds
    pdl_launch_dependents();
    pdl_wait();
    const int b = blockIdx.y, s = blockIdx.x, tid = threadIdx.x;
    const float *row = logits + b * stride;
    uint2 *row_ws = ws + b * ws_row, *cand = row_ws + 1;
    const int lo = s * chunk, n = min(chunk, V - lo), per_chunk = min(top_k, chunk);

    sh.hist[tid] = 0;
    if (tid == 0) pk.max_key = 0;
#pragma unroll 4
    for (int i = tid; i < n; i += kThreads) keys[i] = float_key(row[lo + i]);
    __syncthreads();

    // --- this chunk's best
    Selection sel = radix_select(keys, n, top_k, sh);
    gather(keys, n, sel, sh, [&](int out, int i) { cand[s * per_chunk + out] = make_uint2(keys[i], lo + i); });
    if (!last_to_arrive(&row_ws[0].x, splits, &ticket)) return;

    // --- the last block: the row's best among all chunks' candidates, then the pick
    const int n_cand = (splits - 1) * per_chunk + min(top_k, V - (splits - 1) * chunk);
    for (int i = tid; i < n_cand; i += kThreads) keys[i] = __ldcg(&cand[i]).x;
    __syncthreads();
    sel = radix_select(keys, n_cand, top_k, sh);
    gather(keys, n_cand, sel, sh, [&](int out, int i) {
        pk.key[out] = keys[i];
        pk.id[out] = (int)__ldcg(&cand[i]).y;
    });
    __syncthreads();
    pick(pk, top_k, temperature, top_p, uniforms[b], &next[b]);
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
                                        int *next, void *workspace, size_t workspace_bytes, cudaStream_t stream) {
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
                          kRowEntries, next);
    const size_t smem = (size_t)std::max(chunk, splits * std::min(top_k, chunk)) * sizeof(unsigned);
    return launch_pdl(top_k_kernel, grid, block, smem, stream, logits, V, row_stride, chunk, splits, temperature,
                      top_k, top_p, uniforms, ws, kRowEntries, next);
}
