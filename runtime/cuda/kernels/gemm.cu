/* cuda/gemm.cu: KILN_OP_GEMM on CUDA: out[B,n,m] = alpha * a[B,n,k] @ b[B,k,m] + beta * out, batch
   strides possibly 0. Float dtypes go to cuBLASLt (cublasLtMatmul), row-major handled by swapping the
   operands (geometry.h), the batch as a strided batch (stride 0 broadcasts). The compute type comes
   from the dtype and the process's f32 matmul precision (gemm_plan.h): f32 is exact by default
   (CUBLAS_COMPUTE_32F), TF32 under "high", BF16 under "medium"; f16 and bf16 accumulate in f32. The
   heuristic's algorithm is cached per problem; where cuBLASLt has none (or refuses it), and for f64,
   the product goes to cublasGemmStridedBatchedEx with the same types. One cuBLAS handle, one cuBLASLt
   handle and one workspace per device, on the device's one stream. KILN_GEMM_LT=0 skips cuBLASLt.
   Integer dtypes take a plain kernel with the CPU's wrap-around arithmetic. */
#include "common.h"
#include "elements.cuh"
#include "geometry.h"
#include "gemm_plan.h"
#include <cublas_v2.h>
#include <cublasLt.h>
#include <pthread.h>
#include <stdlib.h>

using namespace kiln_el;

enum { THREADS = 256 };

/* gemm_plan.h speaks cuBLAS's numbers without its headers. */
static_assert((int)CUBLAS_COMPUTE_32F == KILN_BLAS_COMPUTE_32F, "cublasComputeType_t");
static_assert((int)CUBLAS_COMPUTE_64F == KILN_BLAS_COMPUTE_64F, "cublasComputeType_t");
static_assert((int)CUBLAS_COMPUTE_32F_FAST_16BF == KILN_BLAS_COMPUTE_32F_FAST_16BF, "cublasComputeType_t");
static_assert((int)CUBLAS_COMPUTE_32F_FAST_TF32 == KILN_BLAS_COMPUTE_32F_FAST_TF32, "cublasComputeType_t");
static_assert((int)CUDA_R_32F == KILN_BLAS_R_32F && (int)CUDA_R_64F == KILN_BLAS_R_64F, "cudaDataType_t");
static_assert((int)CUDA_R_16F == KILN_BLAS_R_16F && (int)CUDA_R_16BF == KILN_BLAS_R_16BF, "cudaDataType_t");
static_assert(sizeof(cublasLtMatmulAlgo_t) == KILN_CUDA_LT_ALGO_BYTES, "cublasLtMatmulAlgo_t");

static int blas_check(cublasStatus_t s, const char *call) {
  if (s == CUBLAS_STATUS_SUCCESS) return KILN_OK;
  return cuda_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? KILN_ERR_MEMORY : KILN_ERR_DEVICE, "gemm: %s: %s (%s)", call,
                   cublasGetStatusString(s), cublasGetStatusName(s));
}

static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;

/* The device's cuBLAS and cuBLASLt handles and their workspace, made on its first GEMM. */
static int blas_handles(struct cuda_device *dev, cublasHandle_t *out, cublasLtHandle_t *lt_out) {
  int rc = KILN_OK;
  pthread_mutex_lock(&handle_lock);
  if (!dev->blas) {
    cublasHandle_t h = NULL;
    cublasLtHandle_t lt = NULL;
    void *ws = NULL;
    rc = blas_check(cublasCreate(&h), "cublasCreate");
    if (!rc) rc = blas_check(cublasSetStream(h, dev->stream), "cublasSetStream");
    if (!rc) rc = blas_check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    if (!rc) rc = blas_check(cublasLtCreate(&lt), "cublasLtCreate");
    if (!rc) rc = cuda_check(cudaMalloc(&ws, KILN_CUBLAS_WORKSPACE_BYTES), "gemm", "cudaMalloc (cuBLAS workspace)");
    if (!rc) rc = blas_check(cublasSetWorkspace(h, ws, KILN_CUBLAS_WORKSPACE_BYTES), "cublasSetWorkspace");
    if (rc) {
      if (h) cublasDestroy(h);
      if (lt) cublasLtDestroy(lt);
      if (ws) cudaFree(ws);
    } else {
      dev->blas_lt = lt;
      dev->blas_workspace = ws;
      dev->blas = h;
    }
  }
  pthread_mutex_unlock(&handle_lock);
  *out = (cublasHandle_t)dev->blas;
  if (lt_out) *lt_out = (cublasLtHandle_t)dev->blas_lt;
  return rc;
}

static int blas_handle(struct cuda_device *dev, cublasHandle_t *out) { return blas_handles(dev, out, NULL); }

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

/* ---- cuBLASLt ---- */

static pthread_mutex_t lt_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kiln_cuda_lt_cache lt_cache;   /* every device's problems (the key names the device) */
static pthread_once_t lt_env_once = PTHREAD_ONCE_INIT;
static int lt_disabled;                      /* KILN_GEMM_LT=0 */

static void lt_read_env(void) {
  const char *v = getenv("KILN_GEMM_LT");
  lt_disabled = v && strcmp(v, "0") == 0;
}

/* The descriptors of one cublasLtMatmul, destroyed together. */
struct lt_descs {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulPreference_t pref;
};

static void lt_descs_destroy(struct lt_descs *d) {
  if (d->pref) cublasLtMatmulPreferenceDestroy(d->pref);
  if (d->c) cublasLtMatrixLayoutDestroy(d->c);
  if (d->b) cublasLtMatrixLayoutDestroy(d->b);
  if (d->a) cublasLtMatrixLayoutDestroy(d->a);
  if (d->op) cublasLtMatmulDescDestroy(d->op);
}

/* One of gemm_plan.h's layouts as a cuBLASLt descriptor. */
static int lt_layout(cublasLtMatrixLayout_t *out, int data, const struct kiln_cuda_lt_layout *l) {
  int rc = blas_check(cublasLtMatrixLayoutCreate(out, (cudaDataType_t)data, (uint64_t)l->rows, (uint64_t)l->cols, l->ld),
                      "cublasLtMatrixLayoutCreate");
  int32_t count = (int32_t)l->batch;
  int64_t offset = l->stride;
  if (!rc)
    rc = blas_check(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
                    "cublasLtMatrixLayoutSetAttribute (batch count)");
  if (!rc)
    rc = blas_check(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset,
                                                     sizeof offset),
                    "cublasLtMatrixLayoutSetAttribute (strided batch offset)");
  return rc;
}

/* C = alpha * op(A) @ op(B) + beta * C through cuBLASLt, in plan p's terms. *done = 0 (and KILN_OK)
   when cuBLASLt has no algorithm for the problem: the caller falls back to the legacy call. */
static int lt_gemm(struct cuda_device *dev, cublasLtHandle_t lt, int dtype, const struct kiln_cuda_gemm_types *ty,
                   const struct kiln_cuda_gemm_plan *p, const void *A, const void *B, void *C, const void *alpha,
                   const void *beta, int *done) {
  *done = 0;
  struct kiln_cuda_lt_key key;
  kiln_cuda_lt_key_build(&key, dev->index, dtype, ty, p, (uintptr_t)A, (uintptr_t)B, (uintptr_t)C);
  cublasLtMatmulAlgo_t algo;
  memset(&algo, 0, sizeof algo);
  pthread_mutex_lock(&lt_lock);
  int state = kiln_cuda_lt_cache_find(&lt_cache, &key, &algo);
  pthread_mutex_unlock(&lt_lock);
  if (state == KILN_CUDA_LT_NONE) return KILN_OK;

  struct lt_descs d;
  memset(&d, 0, sizeof d);
  int32_t ta = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  int rc = blas_check(cublasLtMatmulDescCreate(&d.op, (cublasComputeType_t)ty->compute, (cudaDataType_t)ty->scale),
                      "cublasLtMatmulDescCreate");
  if (!rc)
    rc = blas_check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
                    "cublasLtMatmulDescSetAttribute (transa)");
  if (!rc)
    rc = blas_check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
                    "cublasLtMatmulDescSetAttribute (transb)");
  struct kiln_cuda_lt_layout l[3];
  kiln_cuda_lt_layouts(p, l);
  if (!rc) rc = lt_layout(&d.a, ty->data, &l[0]);
  if (!rc) rc = lt_layout(&d.b, ty->data, &l[1]);
  if (!rc) rc = lt_layout(&d.c, ty->data, &l[2]);

  if (!rc && state == KILN_CUDA_LT_MISS) {
    uint64_t ws = KILN_CUBLAS_WORKSPACE_BYTES;
    rc = blas_check(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate");
    if (!rc)
      rc = blas_check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                      "cublasLtMatmulPreferenceSetAttribute (workspace)");
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t align[4] = {key.align_a, key.align_b, key.align_c, key.align_c};
    for (int i = 0; i < 4 && !rc; i++)
      rc = blas_check(cublasLtMatmulPreferenceSetAttribute(d.pref, align_attr[i], &align[i], sizeof align[i]),
                      "cublasLtMatmulPreferenceSetAttribute (alignment)");
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    if (!rc) {
      /* Any refusal but a lack of memory means no algorithm: the legacy call takes the problem
         (and names a problem that is really wrong itself). */
      cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &res, &found);
      if (st == CUBLAS_STATUS_ALLOC_FAILED) rc = blas_check(st, "cublasLtMatmulAlgoGetHeuristic");
      else if (st != CUBLAS_STATUS_SUCCESS) found = 0;
    }
    if (!rc) {
      int ok = found > 0 && res.state == CUBLAS_STATUS_SUCCESS && res.workspaceSize <= KILN_CUBLAS_WORKSPACE_BYTES;
      state = ok ? KILN_CUDA_LT_ALGO : KILN_CUDA_LT_NONE;
      algo = res.algo;
      pthread_mutex_lock(&lt_lock);
      kiln_cuda_lt_cache_put(&lt_cache, &key, state, &algo);
      pthread_mutex_unlock(&lt_lock);
    }
  }
  if (!rc && state == KILN_CUDA_LT_ALGO) {
    cublasStatus_t st = cublasLtMatmul(lt, d.op, alpha, A, d.a, B, d.b, beta, C, d.c, C, d.c, &algo,
                                       dev->blas_workspace, KILN_CUBLAS_WORKSPACE_BYTES, dev->stream);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {   /* refused: remember, fall back */
      pthread_mutex_lock(&lt_lock);
      kiln_cuda_lt_cache_put(&lt_cache, &key, KILN_CUDA_LT_NONE, NULL);
      pthread_mutex_unlock(&lt_lock);
    } else {
      rc = blas_check(st, "cublasLtMatmul");
      if (!rc) rc = cuda_launched("gemm", "cublasLtMatmul");
      if (!rc) *done = 1;
    }
  }
  lt_descs_destroy(&d);
  return rc;
}

extern "C" int cuda_gemm(const struct kiln_call *c) {
  struct kiln_tensor *out = c->out;
  const struct kiln_tensor *a = c->in[0], *b = c->in[1];
  struct cuda_device *dev = cuda_device_enter(out->device.index, "gemm");
  if (!dev) return kiln_error_code();
  if (out->numel == 0) return KILN_OK;
  if (!kiln_dtype_is_float(out->dtype)) return gemm_integer(c, dev);
  if (a->sizes[2] == 0) return scale_only(c);
  struct kiln_cuda_gemm_types ty;
  int precision = cuda_host->float32_matmul_precision();
  if (kiln_cuda_gemm_types(out->dtype, precision, &ty))
    return cuda_fail(KILN_ERR_UNSUPPORTED, "gemm: %s @ %s: no cuBLAS types for %s at matmul precision %d",
                     kiln_shape_string(a), kiln_shape_string(b), kiln_dtype_name(out->dtype), precision);
  struct kiln_cuda_gemm_plan p;
  if (kiln_cuda_gemm_plan(out, a, b, &p))
    return cuda_fail(KILN_ERR_UNSUPPORTED, "gemm: %s @ %s on %s: sizes beyond cuBLAS's 32-bit arguments",
                     kiln_shape_string(a), kiln_shape_string(b), kiln_device_name(out->device));
  cublasHandle_t h;
  cublasLtHandle_t lt;
  if (blas_handles(dev, &h, &lt)) return kiln_error_code();
  pthread_once(&lt_env_once, lt_read_env);
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
    int wide = ty.scale == KILN_BLAS_R_64F;
    const void *alpha = wide ? (const void *)&alpha64 : (const void *)&alpha32;
    const void *beta = wide ? (const void *)&beta64 : (const void *)&beta32;
    int done = 0;
    /* cuBLAS's A is kiln's b, its B kiln's a (geometry.h) */
    if (ty.use_lt && !lt_disabled)
      rc = lt_gemm(dev, lt, out->dtype, &ty, &p, kiln_tensor_data(rb), kiln_tensor_data(ra), kiln_tensor_data(ro), alpha,
                   beta, &done);
    if (!rc && !done) {
      cudaDataType_t type = (cudaDataType_t)ty.data;
      rc = blas_check(cublasGemmStridedBatchedEx(h, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                 (int)p.m, (int)p.n, (int)p.k, alpha, kiln_tensor_data(rb), type, (int)p.lda,
                                                 (long long)p.stride_a, kiln_tensor_data(ra), type, (int)p.ldb,
                                                 (long long)p.stride_b, beta, kiln_tensor_data(ro), type, (int)p.ldc,
                                                 (long long)p.stride_c, (int)p.batch, (cublasComputeType_t)ty.compute,
                                                 CUBLAS_GEMM_DEFAULT),
                      "cublasGemmStridedBatchedEx");
      if (!rc) rc = cuda_launched("gemm", "cublasGemmStridedBatchedEx");
    }
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
