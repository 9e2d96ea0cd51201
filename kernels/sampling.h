// Sampling on the device (sampling.cu): the same choice as src/sampler.c's sampler_pick for the
// same uniform draw, so only token ids leave the GPU during decode.
#pragma once

#include <stddef.h>

#include <cuda_runtime.h>

// Top-k sizes the device sampler handles; others (and top_k 0: all tokens) sample on the host.
#define DEVICE_SAMPLING_MAX_TOP_K 256
// Vocabularies the device sampler handles: a row's share per block and the candidates it merges
// must fit shared memory (sampling.cu). 262,144 covers the largest vocabularies in use.
#define DEVICE_SAMPLING_MAX_VOCAB 262144

#ifdef __cplusplus
constexpr int kMaxDeviceTopK = DEVICE_SAMPLING_MAX_TOP_K;
extern "C" {
#endif

// 1 when sample_on_device can make this choice: vocab_size in 1..DEVICE_SAMPLING_MAX_VOCAB, and
// greedy, or top_k in 1..DEVICE_SAMPLING_MAX_TOP_K and below the vocabulary size.
int device_sampling_supported(float temperature, int top_k, int vocab_size);

// Bytes of device workspace sample_on_device needs for up to max_batch rows of vocab_size logits
// (0 for a vocabulary it does not handle). Allocate it once and zero it once: each call leaves it as
// it found it (counters at zero), whatever its batch and vocabulary, so calls may be captured into
// a CUDA graph and replayed. One call at a time per workspace.
size_t sampling_workspace_size(int max_batch, int vocab_size);

// next[b] (device), and next_copy[b] too unless it is NULL, from logits[b * row_stride + i],
// i < vocab_size (device, fp32), with uniforms[b] in [0, 1), b < B (device, or mapped host memory:
// read before the kernel waits on the one before it). workspace: at least sampling_workspace_size(B, vocab_size)
// bytes, zeroed once. Enqueued on stream (with programmatic dependent launch where the device has
// it: see pdl.cuh); returns the launch's error, or cudaErrorInvalidValue for unsupported settings
// or a workspace too small.
cudaError_t sample_on_device(const float *logits, int vocab_size, long long row_stride, int B, float temperature,
                             int top_k, float top_p, const float *uniforms, int *next, int *next_copy,
                             void *workspace, size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
