// Matrix products through cuBLAS, the reference path's Linear layers and attention products.
// Operands in the compute dtype, results and accumulation in fp32 (CUBLAS_COMPUTE_32F): for fp32
// that is true fp32 (the handle's math mode is CUBLAS_DEFAULT_MATH, so no TF32), for bf16 the
// tensor cores with fp32 accumulation. The output stays fp32 so that the bias, GELU and residual
// add round once, at the end.
#include "reference_kernels.h"

static cudaDataType_t cuda_type(DType dt) { return dt == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// y[M, N] = x[M, K] W[N, K]^T in row-major terms is, column-major, y^T (N x M) = W^T x^T:
// A = W (K x N column-major, transposed), B = x (K x M column-major); y's rows ldy apart.
cublasStatus_t matmul_nt(cublasHandle_t h, float *y, int ldy, const void *x, const void *W, int M, int N, int K,
                         DType dt) {
    const float one = 1.0f, zero = 0.0f;
    cudaDataType_t t = cuda_type(dt);
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W, t, K, x, t, K, &zero, y, CUDA_R_32F, ldy,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t matmul_strided_batched(cublasHandle_t h, cublasOperation_t opA, cublasOperation_t opB, int m, int n,
                                      int k, const void *A, int lda, long long strideA, const void *B, int ldb,
                                      long long strideB, float *C, int ldc, long long strideC, int batch, DType dt) {
    const float one = 1.0f, zero = 0.0f;
    cudaDataType_t t = cuda_type(dt);
    return cublasGemmStridedBatchedEx(h, opA, opB, m, n, k, &one, A, t, lda, strideA, B, t, ldb, strideB, &zero, C,
                                      CUDA_R_32F, ldc, strideC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
