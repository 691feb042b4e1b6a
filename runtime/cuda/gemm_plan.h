/* cuda/gemm_plan.h: what a float GEMM asks of cuBLASLt, decided on the host as plain C that CI tests
   on the CPU (tests/c/test_cuda_gemm_plan.c): the compute, scale and data types for a dtype and the
   f32 matmul precision, the operands' alignment, and the cache of heuristic answers keyed by the
   problem (device, dtype, compute type, layouts, batch strides, alignment). */
#ifndef KILN_CUDA_GEMM_PLAN_H
#define KILN_CUDA_GEMM_PLAN_H
#include <stddef.h>
#include <stdint.h>
#include "geometry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuBLAS's own numbers (cublasComputeType_t in cublas_api.h, cudaDataType_t in library_types.h),
   so that the plan needs no CUDA header; gemm.cu checks them against cuBLAS's at compile time. */
enum {
  KILN_BLAS_COMPUTE_32F = 68,
  KILN_BLAS_COMPUTE_64F = 70,
  KILN_BLAS_COMPUTE_32F_FAST_16BF = 75,
  KILN_BLAS_COMPUTE_32F_FAST_TF32 = 77,
  KILN_BLAS_R_32F = 0,
  KILN_BLAS_R_64F = 1,
  KILN_BLAS_R_16F = 2,
  KILN_BLAS_R_16BF = 14
};

/* The types of one GEMM. */
struct kiln_cuda_gemm_types {
  int compute;   /* KILN_BLAS_COMPUTE_*: how the products are formed and accumulated */
  int scale;     /* KILN_BLAS_R_*: alpha and beta (f32, or f64 for f64) */
  int data;      /* KILN_BLAS_R_*: A, B, C and D, all in out's dtype */
  int use_lt;    /* 1: cuBLASLt first; 0: cublasGemmStridedBatchedEx only (f64) */
};
/* The types for dtype under precision (KILN_MATMUL_*): f32 computes in exact f32 ("highest"), TF32
   ("high") or BF16 ("medium"); f16 and bf16 accumulate in f32 whatever the precision; f64 in f64,
   without cuBLASLt. -1 for a dtype cuBLAS does not multiply (integers) or an unknown precision. */
int kiln_cuda_gemm_types(int dtype, int precision, struct kiln_cuda_gemm_types *t);
/* "f32 (exact)", "f32 (TF32)", ...: for error messages. */
const char *kiln_cuda_gemm_compute_name(int compute);

/* cuBLASLt's matrix layouts of plan p (geometry.h): A, B and C (= D), each a column-major rows x cols
   matrix with leading dim ld, batch of them stride elements apart (0: one matrix for the whole
   batch; the stride is 0 as well when the batch is 1). A transposed operand is stored cols x rows of
   its op: A is m x k under op N, k x m under op T. */
struct kiln_cuda_lt_layout {
  int64_t rows, cols, ld, batch, stride;
};
void kiln_cuda_lt_layouts(const struct kiln_cuda_gemm_plan *p, struct kiln_cuda_lt_layout out[3]);

/* The largest power of two that divides address, at most 256 (0 gives 256): what cuBLASLt may assume
   of an operand (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES). Tensor views start anywhere. */
uint32_t kiln_cuda_gemm_alignment(uintptr_t address);

/* Everything cuBLASLt's heuristic answer depends on. Built with kiln_cuda_lt_key_build (which
   zeroes it whole), compared bytewise. */
struct kiln_cuda_lt_key {
  int32_t device, dtype, compute, scale, data;
  int32_t trans_a, trans_b;
  uint32_t align_a, align_b, align_c;   /* cuBLAS's A, B, and C = D */
  int64_t m, n, k, lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c, batch;
};
/* The key of plan p (cuBLAS's view: A is kiln's b, B is kiln's a) with types t on device, over the
   device addresses of cuBLAS's A, B and C. */
void kiln_cuda_lt_key_build(struct kiln_cuda_lt_key *key, int device, int dtype, const struct kiln_cuda_gemm_types *t,
                            const struct kiln_cuda_gemm_plan *p, uintptr_t a, uintptr_t b, uintptr_t c);

/* A small table of heuristic answers: the algorithm (cublasLtMatmulAlgo_t, 64 bytes, copied as they
   are) or "none" (cuBLASLt has no algorithm: the GEMM falls back to cublasGemmStridedBatchedEx).
   The least recently used entry makes room. Not locked: gemm.cu holds a mutex around it. */
enum { KILN_CUDA_LT_CACHE_ENTRIES = 128, KILN_CUDA_LT_ALGO_BYTES = 64 };
enum { KILN_CUDA_LT_MISS = 0, KILN_CUDA_LT_ALGO = 1, KILN_CUDA_LT_NONE = 2 };
struct kiln_cuda_lt_entry {
  struct kiln_cuda_lt_key key;
  uint64_t hash, used;   /* used: the cache's clock at the last lookup; 0 = empty slot */
  int state;             /* KILN_CUDA_LT_ALGO or KILN_CUDA_LT_NONE */
  uint64_t algo[KILN_CUDA_LT_ALGO_BYTES / 8];
};
struct kiln_cuda_lt_cache {
  uint64_t clock;
  int64_t hits, misses, evictions;
  struct kiln_cuda_lt_entry entries[KILN_CUDA_LT_CACHE_ENTRIES];
};
/* KILN_CUDA_LT_ALGO (algo filled), KILN_CUDA_LT_NONE, or KILN_CUDA_LT_MISS. A zeroed cache is empty. */
int kiln_cuda_lt_cache_find(struct kiln_cuda_lt_cache *c, const struct kiln_cuda_lt_key *key, void *algo);
/* Record the answer for key (algo: KILN_CUDA_LT_ALGO_BYTES, ignored for KILN_CUDA_LT_NONE),
   replacing the key's old answer or the least recently used entry. */
void kiln_cuda_lt_cache_put(struct kiln_cuda_lt_cache *c, const struct kiln_cuda_lt_key *key, int state,
                            const void *algo);
/* Entries in use. */
int kiln_cuda_lt_cache_count(const struct kiln_cuda_lt_cache *c);

#ifdef __cplusplus
}
#endif
#endif
