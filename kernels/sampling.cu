// Sampling on the device: the next token of each sequence is chosen where the logits are, so a
// decode step sends only B token ids back to the host instead of B x V logits (12.9 MB at B = 64).
//
// One block per sequence makes the same choice as the host sampler (src/sampler.c) for the same
// uniform draw u:
//   greedy (temperature 0): the first index of the largest logit;
//   otherwise: p_i = exp((l_i - max) / T); keep the top k by (p desc, id asc); the smallest prefix
//   whose float sum reaches top_p of the kept sum; pick where u * prefix_sum falls.
// The k-th largest logit is found by a radix select over the logits' order-preserving 32-bit keys
// (four 8-bit digits, a shared-memory histogram each): four passes over the row instead of a sort.
// Ties at the threshold are broken by lower id, as the host does.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "sampling.h"

namespace {

constexpr int kThreads = 1024;

// Order-preserving map of a float to uint32: larger float -> larger key.
__device__ __forceinline__ unsigned int float_key(float f) {
    unsigned int u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct ArgMax {
    float value;
    int index;
};

struct ArgMaxOp {
    __device__ __forceinline__ ArgMax operator()(const ArgMax &a, const ArgMax &b) const {
        if (a.value != b.value) return a.value > b.value ? a : b;
        return a.index < b.index ? a : b;  // the first maximum, as the host's strict '>' scan
    }
};

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float *__restrict__ logits, int V, long long stride, float temperature, int top_k,
                  float top_p, const float *__restrict__ uniforms, int *__restrict__ next) {
    using Reduce = cub::BlockReduce<ArgMax, kThreads>;
    using Scan = cub::BlockScan<int, kThreads>;
    __shared__ union {
        typename Reduce::TempStorage reduce;
        typename Scan::TempStorage scan;
    } tmp;
    __shared__ unsigned int histogram[256];
    __shared__ float cand_prob[kMaxDeviceTopK], sorted_prob[kMaxDeviceTopK];
    __shared__ int cand_id[kMaxDeviceTopK], sorted_id[kMaxDeviceTopK];
    __shared__ int n_cand;
    __shared__ ArgMax best;
    __shared__ unsigned int prefix_key;
    __shared__ int remaining;

    const float *row = logits + (long long)blockIdx.x * stride;
    const int tid = threadIdx.x;

    // --- the largest logit (and, for greedy, the answer)
    ArgMax local = {-INFINITY, V};
    for (int i = tid; i < V; i += kThreads) local = ArgMaxOp()(local, ArgMax{row[i], i});
    ArgMax m = Reduce(tmp.reduce).Reduce(local, ArgMaxOp());
    if (tid == 0) best = m;
    __syncthreads();
    if (temperature <= 0.0f) {
        if (tid == 0) next[blockIdx.x] = best.index;
        return;
    }

    // --- radix select: the key of the k-th largest logit, and how many equal to it are needed
    if (tid == 0) prefix_key = 0, remaining = top_k;
    unsigned int mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += kThreads) histogram[b] = 0;
        __syncthreads();
        unsigned int prefix = prefix_key;
        // Logits crowd into a few digit values (the top digit is sign and exponent), so the lanes
        // of a warp that share a bin add once, through their leader: 32x fewer colliding atomics.
        for (int base = 0; base < V; base += kThreads) {
            const int i = base + tid;
            unsigned int key = i < V ? float_key(row[i]) : 0u;
            unsigned int bin = i < V && (key & mask) == prefix ? (key >> shift) & 255u : 256u;
            unsigned int peers = __match_any_sync(0xffffffffu, bin);
            if (bin < 256u && (tid & 31) == __ffs(peers) - 1) atomicAdd(&histogram[bin], __popc(peers));
        }
        __syncthreads();
        if (tid == 0) {
            int need = remaining, digit = 255;
            while (digit > 0 && (int)histogram[digit] < need) need -= histogram[digit--];
            prefix_key = prefix | ((unsigned int)digit << shift);
            remaining = need;  // elements of this digit still to take
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    const unsigned int threshold = prefix_key;
    const int take_equal = remaining;

    // --- gather: every key above the threshold, and the lowest-id take_equal keys equal to it.
    // Contiguous chunks per thread keep ids ascending through the scan.
    if (tid == 0) n_cand = 0;
    __syncthreads();
    const int chunk = (V + kThreads - 1) / kThreads;
    const int lo = min(V, tid * chunk), hi = min(V, lo + chunk);
    int n_equal = 0;
    for (int i = lo; i < hi; i++) {
        unsigned int key = float_key(row[i]);
        if (key > threshold) cand_id[atomicAdd(&n_cand, 1)] = i;
        n_equal += key == threshold;
    }
    int equal_before;
    Scan(tmp.scan).ExclusiveSum(n_equal, equal_before);
    __syncthreads();  // n_cand complete: the keys above the threshold
    const int n_above = n_cand;
    for (int i = lo; i < hi && equal_before < take_equal; i++)
        if (float_key(row[i]) == threshold) cand_id[n_above + equal_before++] = i;
    __syncthreads();

    // --- probabilities, then rank by (p desc, id asc) among the k candidates
    const int k = top_k;
    const float max_logit = best.value;
    for (int c = tid; c < k; c += kThreads) cand_prob[c] = expf((row[cand_id[c]] - max_logit) / temperature);
    __syncthreads();
    for (int c = tid; c < k; c += kThreads) {
        float p = cand_prob[c];
        int id = cand_id[c], rank = 0;
        for (int j = 0; j < k; j++) rank += cand_prob[j] > p || (cand_prob[j] == p && cand_id[j] < id);
        sorted_prob[rank] = p;
        sorted_id[rank] = id;
    }
    __syncthreads();

    // --- nucleus and the pick: sequential float sums, in the host's order
    if (tid == 0) {
        float sum = 0.0f;
        for (int i = 0; i < k; i++) sum += sorted_prob[i];
        float kept = 0.0f;
        int n = 0;
        while (n < k) {
            kept += sorted_prob[n++];
            if (kept >= top_p * sum) break;
        }
        float r = uniforms[blockIdx.x] * kept, acc = 0.0f;
        int pick = sorted_id[n - 1];
        for (int i = 0; i < n; i++) {
            acc += sorted_prob[i];
            if (r < acc) {
                pick = sorted_id[i];
                break;
            }
        }
        next[blockIdx.x] = pick;
    }
}

}  // namespace

extern "C" int device_sampling_supported(float temperature, int top_k, int vocab_size) {
    return temperature <= 0.0f || (top_k >= 1 && top_k <= kMaxDeviceTopK && top_k < vocab_size);
}

extern "C" cudaError_t sample_on_device(const float *logits, int vocab_size, long long row_stride, int B,
                                        float temperature, int top_k, float top_p, const float *uniforms,
                                        int *next, cudaStream_t stream) {
    sample_kernel<<<B, kThreads, 0, stream>>>(logits, vocab_size, row_stride, temperature, top_k, top_p, uniforms,
                                              next);
    return cudaGetLastError();
}
