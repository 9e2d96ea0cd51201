// Launchers of the plain (unfused) op kernels, one .cu file each. They enqueue on `stream` and
// return the launch's error (cudaGetLastError), or cuBLAS's status for the matrix products.
// `void *` buffers hold the compute dtype `dt` (float or bf16); `float *` ones are always fp32.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gpu_engine.h"  // model.h, made C++-safe

// embedding.cu: x[b*T + t] = wte[tokens[b*T + t]] + wpe[pos + t], fp32 [M, C]; unless ln is NULL,
// also ln = LayerNorm(x) * ln_w + ln_b (dtype [M, C], as layernorm_forward's), in the same kernel.
// pos from *pos_device unless it is NULL; unless next_pos is NULL, *next_pos = pos + T (the next
// decode step's position).
cudaError_t embedding_forward(float *x, void *ln, const float *ln_w, const float *ln_b, const int *tokens,
                              const void *wte, const void *wpe, int M, int T, int pos, const int *pos_device,
                              int *next_pos, int C, DType dt, cudaStream_t stream);

// last_rows.cu: x[b] = x[b*T + T-1] and atty[b] = atty[b*T + T-1] for b < B, in place (T > 1): each
// sequence's last row to the front, for the rest of a prompt's last layer (gpu_engine.cu). x fp32
// [B*T, C], atty dtype [B*T, C].
cudaError_t last_rows_to_front(float *x, void *atty, int B, int T, int C, DType dt, cudaStream_t stream);

// layernorm.cu: out[r] = (x[r] - mean) * rstd * w + b for r < rows, eps 1e-5, fp32 in, dtype out
// [rows, C].
cudaError_t layernorm_forward(void *out, const float *x, const float *w, const float *b, int rows, int C,
                              DType dt, cudaStream_t stream);

// bias.cu: y[M, N] += b[N], fp32, in place.
cudaError_t bias_add(float *y, const float *b, int M, int N, cudaStream_t stream);

// gelu.cu: out = gelu_tanh(y), fp32 in, dtype out, n elements.
cudaError_t gelu_forward(void *out, const float *y, size_t n, DType dt, cudaStream_t stream);

// residual.cu: x[M, N] += y[M, N] + b[N], fp32.
cudaError_t residual_add_bias(float *x, const float *y, const float *b, int M, int N, cudaStream_t stream);

// attention_layout.cu: the rows <-> heads moves around the reference attention.
// qkv: fp32 [B*T, 3C] with bias. q -> [B, NH, T, HS] dtype; k, v -> the cache at positions pos + t.
cudaError_t qkv_to_heads(void *q, void *k_cache, void *v_cache, const float *qkv, int B, int T, int pos, int NH,
                         int HS, int max_seq, DType dt, cudaStream_t stream);
// qkv: dtype [B*T, 3C] with bias (the fused table's cuBLASLt product). q -> rows [B*T, C]; k, v as
// qkv_to_heads's (pos_device, when not NULL, holds the position on the device: a decode graph).
// dtype is fp32 or bf16 (the kernel only copies).
cudaError_t qkv_split(void *q, void *k_cache, void *v_cache, const void *qkv, int B, int T, int pos,
                      const int *pos_device, int NH, int HS, int max_seq, DType dt, cudaStream_t stream);
// y: fp32 [B, NH, T, HS] -> out: dtype [B*T, C] (heads side by side).
cudaError_t heads_to_rows(void *out, const float *y, int B, int T, int NH, int HS, DType dt, cudaStream_t stream);

// softmax.cu: att fp32 [BNH, T, Tk] scores q.k of query pos + t against keys 0..Tk-1;
// probs = softmax(scale * att) over keys <= pos + t, 0 beyond (causal), dtype, same shape
// (probs may be att itself when dt is fp32).
cudaError_t softmax_causal(void *probs, const float *att, int BNH, int T, int Tk, int pos, float scale, DType dt,
                           cudaStream_t stream);

// matmul_cublas.cu: y[M, N] (fp32, row stride ldy) = x[M, K] @ W[N, K]^T, x and W dtype, fp32
// accumulation.
cublasStatus_t matmul_nt(cublasHandle_t h, float *y, int ldy, const void *x, const void *W, int M, int N, int K,
                         DType dt);
// Column-major strided batched product C = op(A) op(B), A and B dtype, C fp32 (cuBLAS's terms).
cublasStatus_t matmul_strided_batched(cublasHandle_t h, cublasOperation_t opA, cublasOperation_t opB, int m, int n,
                                      int k, const void *A, int lda, long long strideA, const void *B, int ldb,
                                      long long strideB, float *C, int ldc, long long strideC, int batch, DType dt);

// convert.cu: n elements between storage types (fp32 <-> bf16, or a copy), on the device.
cudaError_t convert_dtype(void *dst, DType dst_t, const void *src, DType src_t, size_t n, cudaStream_t stream);

// ln_fold.cu: s[n] = sum_k W[n,k] w[k], b2[n] = sum_k W[n,k] beta[k] + (bias ? bias[n] : 0), fp32,
// W dtype [N, K]: LayerNorm's affine folded into the next Linear, for the fused kernels.
cudaError_t ln_fold(float *s, float *b2, const void *W, const float *w, const float *beta, const float *bias, int N,
                    int K, DType dt, cudaStream_t stream);
