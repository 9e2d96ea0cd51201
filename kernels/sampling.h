// Sampling on the device (sampling.cu): the same choice as src/sampler.c's sampler_pick for the
// same uniform draw, so only token ids leave the GPU during decode.
#pragma once

#include <cuda_runtime.h>

// Top-k sizes the device sampler handles; others (and top_k 0: all tokens) sample on the host.
#define DEVICE_SAMPLING_MAX_TOP_K 256

#ifdef __cplusplus
constexpr int kMaxDeviceTopK = DEVICE_SAMPLING_MAX_TOP_K;
extern "C" {
#endif

// 1 when sample_on_device can make this choice: greedy, or top_k in 1..DEVICE_SAMPLING_MAX_TOP_K
// and below the vocabulary size.
int device_sampling_supported(float temperature, int top_k, int vocab_size);

// next[b] (device) from logits[b * row_stride + i], i < vocab_size (device, fp32), with
// uniforms[b] (device) in [0, 1). Enqueued on stream; returns the launch's error.
cudaError_t sample_on_device(const float *logits, int vocab_size, long long row_stride, int B, float temperature,
                             int top_k, float top_p, const float *uniforms, int *next, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
