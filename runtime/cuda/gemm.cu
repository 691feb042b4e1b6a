/* cuda/gemm.cu: KILN_OP_GEMM on CUDA: out[B,n,m] = alpha * a[B,n,k] @ b[B,k,m] + beta * out, batch
   strides possibly 0. Float dtypes go to cublasGemmStridedBatchedEx, row-major handled by swapping
   the operands (geometry.h); f32 is exact (CUBLAS_COMPUTE_32F, default math: no TF32), f64 computes
   in f64, f16 and bf16 in f32 as on the CPU. One cuBLAS handle and workspace per device, on the
   device's stream. Integer dtypes take a plain kernel with the CPU's wrap-around arithmetic. */
#include "common.h"
#include "elements.cuh"
#include "geometry.h"
#include <cublas_v2.h>
#include <pthread.h>

using namespace kiln_el;

enum { THREADS = 256 };

static int blas_check(cublasStatus_t s, const char *call) {
  if (s == CUBLAS_STATUS_SUCCESS) return KILN_OK;
  return cuda_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? KILN_ERR_MEMORY : KILN_ERR_DEVICE, "gemm: %s: %s (%s)", call,
                   cublasGetStatusString(s), cublasGetStatusName(s));
}

static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;

/* The device's cuBLAS handle, made on its first GEMM. */
static int blas_handle(struct cuda_device *dev, cublasHandle_t *out) {
  int rc = KILN_OK;
  pthread_mutex_lock(&handle_lock);
  if (!dev->blas) {
    cublasHandle_t h = NULL;
    void *ws = NULL;
    rc = blas_check(cublasCreate(&h), "cublasCreate");
    if (!rc) rc = blas_check(cublasSetStream(h, dev->stream), "cublasSetStream");
    if (!rc) rc = blas_check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    if (!rc) rc = cuda_check(cudaMalloc(&ws, KILN_CUBLAS_WORKSPACE_BYTES), "gemm", "cudaMalloc (cuBLAS workspace)");
    if (!rc) rc = blas_check(cublasSetWorkspace(h, ws, KILN_CUBLAS_WORKSPACE_BYTES), "cublasSetWorkspace");
    if (rc) {
      if (h) cublasDestroy(h);
      if (ws) cudaFree(ws);
    } else {
      dev->blas = h;
      dev->blas_workspace = ws;
    }
  }
  pthread_mutex_unlock(&handle_lock);
  *out = (cublasHandle_t)dev->blas;
  return rc;
}

/* The handle for other files' products (rnn.cu), on the device's stream. */
extern "C" int cuda_blas_handle(struct cuda_device *dev, void **handle) {
  cublasHandle_t h = NULL;
  int rc = blas_handle(dev, &h);
  *handle = (void *)h;
  return rc;
}

/* ---- integers: one thread per output element, in the CPU's arithmetic ---- */

struct int_gemm {
  const char *a, *b;
  char *out;
  int da, db, dout;
  int64_t n, m, k, numel;
  int64_t sa[3], sb[3], so[3];
  int64_t alpha, beta;
};

__global__ void gemm_integer_kernel(struct int_gemm g) {
  int ea = dtype_size(g.da), eb = dtype_size(g.db), eo = dtype_size(g.dout);
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < g.numel; t += stride) {
    int64_t j = t % g.m, i = (t / g.m) % g.n, bi = t / (g.m * g.n);
    uint64_t s = 0;
    for (int64_t p = 0; p < g.k; p++) {
      int64_t x = (int64_t)load_f64(g.a + (bi * g.sa[0] + i * g.sa[1] + p * g.sa[2]) * ea, g.da);
      int64_t y = (int64_t)load_f64(g.b + (bi * g.sb[0] + p * g.sb[1] + j * g.sb[2]) * eb, g.db);
      s += (uint64_t)x * (uint64_t)y;
    }
    char *o = g.out + (bi * g.so[0] + i * g.so[1] + j * g.so[2]) * eo;
    int64_t prev = g.beta ? (int64_t)load_f64(o, g.dout) : 0;
    store_f64(o, g.dout, (double)(int64_t)((uint64_t)g.alpha * s + (uint64_t)g.beta * (uint64_t)prev));
  }
}

static int gemm_integer(const struct kiln_call *c, struct cuda_device *dev) {
  const struct kiln_tensor *a = c->in[0], *b = c->in[1], *out = c->out;
  struct int_gemm g;
  g.a = (const char *)kiln_tensor_data(a);
  g.b = (const char *)kiln_tensor_data(b);
  g.out = (char *)kiln_tensor_data(out);
  g.da = a->dtype; g.db = b->dtype; g.dout = out->dtype;
  g.n = out->sizes[1]; g.m = out->sizes[2]; g.k = a->sizes[2]; g.numel = out->numel;
  for (int d = 0; d < 3; d++) {
    g.sa[d] = a->sizes[d] > 1 ? a->strides[d] : 0;
    g.sb[d] = b->sizes[d] > 1 ? b->strides[d] : 0;
    g.so[d] = out->strides[d];
  }
  g.alpha = (int64_t)c->scalar[0];
  g.beta = (int64_t)c->scalar[1];
  struct kiln_cuda_launch l = kiln_cuda_launch_1d(g.numel, THREADS, kiln_cuda_max_blocks(dev->sm_count, THREADS));
  gemm_integer_kernel<<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(g);
  return cuda_launched("gemm", "gemm_integer_kernel");
}

/* ---- floats: cuBLAS ---- */

/* A contiguous copy of t in dtype (a new tensor), through our own copy kernel. */
static struct kiln_tensor *contiguous_copy(const struct kiln_tensor *t, int dtype, int copy_data) {
  struct kiln_tensor *r = kiln_tensor_empty(t->ndim, t->sizes, dtype, t->device);
  if (!r || !copy_data) return r;
  struct kiln_call call;
  memset(&call, 0, sizeof call);
  call.op = KILN_OP_COPY;
  call.out = r;
  call.in[0] = t;
  call.nin = 1;
  if (cuda_copy(&call)) { kiln_tensor_release(r); return NULL; }
  return r;
}

/* k == 0: the product is empty, out = beta * out. */
static int scale_only(const struct kiln_call *c) {
  struct kiln_call call;
  memset(&call, 0, sizeof call);
  call.out = c->out;
  if (c->scalar[1] == 0) {
    call.op = KILN_OP_FILL;
    return cuda_fill(&call);
  }
  call.op = KILN_OP_MUL;
  call.in[0] = c->out;
  call.nin = 2;   /* in[1] NULL: the scalar */
  call.scalar[0] = c->scalar[1];
  call.ints[0] = c->out->dtype == KILN_F64 ? KILN_F64 : KILN_F32;
  call.nints = 2;
  return cuda_elementwise(&call);
}

extern "C" int cuda_gemm(const struct kiln_call *c) {
  struct kiln_tensor *out = c->out;
  const struct kiln_tensor *a = c->in[0], *b = c->in[1];
  struct cuda_device *dev = cuda_device_enter(out->device.index, "gemm");
  if (!dev) return kiln_error_code();
  if (out->numel == 0) return KILN_OK;
  if (!kiln_dtype_is_float(out->dtype)) return gemm_integer(c, dev);
  if (a->sizes[2] == 0) return scale_only(c);
  cudaDataType_t type;
  cublasComputeType_t compute;
  switch (out->dtype) {
  case KILN_F64: type = CUDA_R_64F; compute = CUBLAS_COMPUTE_64F; break;
  case KILN_F16: type = CUDA_R_16F; compute = CUBLAS_COMPUTE_32F; break;
  case KILN_BF16: type = CUDA_R_16BF; compute = CUBLAS_COMPUTE_32F; break;
  default: type = CUDA_R_32F; compute = CUBLAS_COMPUTE_32F; break;
  }
  struct kiln_cuda_gemm_plan p;
  if (kiln_cuda_gemm_plan(out, a, b, &p))
    return cuda_fail(KILN_ERR_UNSUPPORTED, "gemm: %s @ %s on %s: sizes beyond cuBLAS's 32-bit arguments",
                     kiln_shape_string(a), kiln_shape_string(b), kiln_device_name(out->device));
  cublasHandle_t h;
  if (blas_handle(dev, &h)) return kiln_error_code();
  /* Operands cuBLAS cannot read in place go through contiguous buffers. */
  struct kiln_tensor *A = p.copy_b ? contiguous_copy(a, out->dtype, 1) : NULL;
  struct kiln_tensor *Bm = p.copy_a ? contiguous_copy(b, out->dtype, 1) : NULL;
  struct kiln_tensor *C = p.copy_out ? contiguous_copy(out, out->dtype, c->scalar[1] != 0) : NULL;
  int rc = KILN_OK;
  if ((p.copy_b && !A) || (p.copy_a && !Bm) || (p.copy_out && !C)) rc = kiln_error_code();
  const struct kiln_tensor *ra = A ? A : a, *rb = Bm ? Bm : b;
  struct kiln_tensor *ro = C ? C : out;
  if (!rc && (A || Bm || C)) kiln_cuda_gemm_plan(ro, ra, rb, &p);
  if (!rc) {
    double alpha64 = c->scalar[0], beta64 = c->scalar[1];
    float alpha32 = (float)alpha64, beta32 = (float)beta64;
    const void *alpha = compute == CUBLAS_COMPUTE_64F ? (const void *)&alpha64 : (const void *)&alpha32;
    const void *beta = compute == CUBLAS_COMPUTE_64F ? (const void *)&beta64 : (const void *)&beta32;
    rc = blas_check(cublasGemmStridedBatchedEx(h, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                               (int)p.m, (int)p.n, (int)p.k, alpha, kiln_tensor_data(rb), type, (int)p.lda,
                                               (long long)p.stride_a, kiln_tensor_data(ra), type, (int)p.ldb,
                                               (long long)p.stride_b, beta, kiln_tensor_data(ro), type, (int)p.ldc,
                                               (long long)p.stride_c, (int)p.batch, compute, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmStridedBatchedEx");
    if (!rc) rc = cuda_launched("gemm", "cublasGemmStridedBatchedEx");
  }
  if (!rc && C) {
    struct kiln_call call;
    memset(&call, 0, sizeof call);
    call.op = KILN_OP_COPY;
    call.out = out;
    call.in[0] = C;
    call.nin = 1;
    rc = cuda_copy(&call);
  }
  kiln_tensor_release(A);
  kiln_tensor_release(Bm);
  kiln_tensor_release(C);
  return rc;
}
