/* cpu/gemm.c: GEMM through OpenBLAS, run inside kiln's thread pool. OpenBLAS itself is kept
   single-threaded; the pool splits the output into row or column panels (or the batch) and
   each worker calls cblas on its part, so exactly one pool ever runs. */
#include "cpu.h"
#include "convert.h"
#include "dtype_math.h"
#include <stdlib.h>
#include <string.h>

struct gemm_job {
  int dtype;                 /* f32 or f64 */
  int64_t nbatch, n, k, m;
  const char *a, *b;         /* first element of each operand */
  char *c;
  int64_t sa, sb, sc;        /* batch strides, in elements */
  int ta, tb;
  int64_t lda, ldb, ldc;
  double alpha, beta;
  int split;                 /* 0: by batch, 1: by rows of c, 2: by columns of c */
  int64_t panel;             /* rows or columns per part */
  int own;                   /* f32 on kiln's own kernel (cpu/sgemm.c), chosen for the whole product */
  const void *bias;          /* LINEAR: + bias[column of c] as c is stored (or NULL) */
  int relu;                  /* LINEAR: then x < 0 ? 0 : x */
  int bf16;                  /* a and b are bf16, on kiln_cpu_sgemm_bf16 (dtype f32, own): 1 c f32, 2 c bf16 */
  int failed;                /* a part's buffers found no memory (bf16) */
};

/* LINEAR's arithmetic after the product, one body over dt (a constant at each call): + bias[q],
   then relu (NaN and -0 kept), rounded to the dtype as the add and relu ops round. */
static inline __attribute__((always_inline)) void linear_finish(int dt, int64_t m, int64_t n, void *c, int64_t ldc,
                                                                const void *bias, int relu) {
  for (int64_t i = 0; i < m; i++) {
    void *o = dt_at(c, dt, i * ldc);
    for (int64_t q = 0; q < n; q++) {
      double y = bias ? dt_add(dt, dt_load(o, dt, q), dt_load(bias, dt, q)) : dt_load(o, dt, q);
      dt_store(o, dt, q, relu && y < 0 ? 0.0 : y);
    }
  }
}
void kiln_cpu_linear_finish(int dtype, int64_t m, int64_t n, void *c, int64_t ldc, const void *bias, int relu) {
  if (dtype == KILN_F32) linear_finish(KILN_F32, m, n, c, ldc, bias, relu);
  else linear_finish(KILN_F64, m, n, c, ldc, bias, relu);
}

static void gemm_block(struct gemm_job *j, int64_t bi, int64_t r0, int64_t rn, int64_t c0, int64_t cn) {
  int es = j->bf16 ? 2 : j->dtype == KILN_F32 ? 4 : 8, ces = j->bf16 == 2 ? 2 : j->dtype == KILN_F32 ? 4 : 8;
  /* Row r0 of op(A) and column c0 of op(B). */
  const char *a = j->a + (bi * j->sa + (j->ta == KILN_BLAS_NO_TRANS ? r0 * j->lda : r0)) * es;
  const char *b = j->b + (bi * j->sb + (j->tb == KILN_BLAS_NO_TRANS ? c0 : c0 * j->ldb)) * es;
  char *c = j->c + (bi * j->sc + r0 * j->ldc + c0) * ces;
  const char *bias = j->bias ? (const char *)j->bias + c0 * es : NULL;
  if (j->bf16) {
    if (kiln_cpu_sgemm_bf16(j->ta, j->tb, rn, cn, j->k, (float)j->alpha, (const uint16_t *)a, j->lda, (const uint16_t *)b,
                            j->ldb, (float)j->beta, c, j->ldc, j->bf16 == 2) < 0)
      __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  if (j->dtype == KILN_F32 && j->own) {   /* LINEAR's bias and relu as the tiles are stored */
    struct kiln_sgemm_ep ep = {(const float *)bias, j->relu};
    kiln_cpu_sgemm_ep(j->ta, j->tb, rn, cn, j->k, (float)j->alpha, (const float *)a, j->lda, (const float *)b, j->ldb,
                      (float)j->beta, (float *)c, j->ldc, bias || j->relu ? &ep : NULL);
    return;
  }
  if (j->dtype == KILN_F32)
    kiln_sgemm(j->ta, j->tb, (int)rn, (int)cn, (int)j->k, (float)j->alpha, (const float *)a, (int)j->lda,
                (const float *)b, (int)j->ldb, (float)j->beta, (float *)c, (int)j->ldc);
  else
    kiln_dgemm(j->ta, j->tb, (int)rn, (int)cn, (int)j->k, j->alpha, (const double *)a, (int)j->lda,
                (const double *)b, (int)j->ldb, j->beta, (double *)c, (int)j->ldc);
  if (bias || j->relu) kiln_cpu_linear_finish(j->dtype, rn, cn, c, j->ldc, bias, j->relu);   /* the part still in cache */
}

static void gemm_range(void *ctx, int64_t begin, int64_t end) {
  struct gemm_job *j = ctx;
  for (int64_t t = begin; t < end; t++) {
    if (j->split == 0) gemm_block(j, t, 0, j->n, 0, j->m);
    else {
      int64_t total = j->split == 1 ? j->n : j->m;
      int64_t nparts = (total + j->panel - 1) / j->panel;
      int64_t bi = t / nparts, p = t % nparts;
      int64_t s = p * j->panel, len = total - s < j->panel ? total - s : j->panel;
      if (j->split == 1) gemm_block(j, bi, s, len, 0, j->m);
      else gemm_block(j, bi, 0, j->n, s, len);
    }
  }
}

/* Run job j (a, b, c, strides and layouts set) in the pool: split by batch, or into row or column
   panels of c when the batch is smaller than the pool. */
static void gemm_run_parts(struct gemm_job *j, int fixed_parts);
static void gemm_run(struct gemm_job *j) { gemm_run_parts(j, 0); }

/* fixed_parts > 0: split as for that many threads, whatever the pool's size, so that the bits do
   not depend on the thread count (each panel is one BLAS call, and a BLAS call's result can depend
   on its shape), unless kiln's own GEMM runs it. */
static void gemm_run_parts(struct gemm_job *j, int fixed_parts) {
  if (j->k <= 0) {   /* BLAS wants k >= 1: the product is zero, only beta * C remains */
    int es = j->dtype == KILN_F32 ? 4 : 8;
    for (int64_t bi = 0; bi < j->nbatch; bi++)
      for (int64_t r = 0; r < j->n; r++)
        for (int64_t q = 0; q < j->m; q++) {
          char *p = j->c + (bi * j->sc + r * j->ldc + q) * es;
          if (es == 4) *(float *)p = j->beta != 0 ? (float)(j->beta * *(float *)p) : 0.0f;
          else *(double *)p = j->beta != 0 ? j->beta * *(double *)p : 0.0;
        }
    if (j->bias || j->relu)
      for (int64_t bi = 0; bi < j->nbatch; bi++)
        kiln_cpu_linear_finish(j->dtype, j->n, j->m, j->c + bi * j->sc * es, j->ldc, j->bias, j->relu);
    return;
  }
  j->own = j->bf16 || (j->dtype == KILN_F32 && kiln_cpu_sgemm_here(j->n, j->m, j->k));
  /* kiln's own f32 GEMM sums each element in one order whatever the part (cpu/sgemm.c): fixed parts
     would only pack op(B) again for each of them */
  int nt = fixed_parts > 0 && !j->own ? fixed_parts : kiln_get_num_threads();
  double flops = 2.0 * (double)j->n * (double)j->m * (double)j->k;
  int64_t tasks;
  if (nt == 1 || flops * (double)j->nbatch < 2e5) { j->split = 0; tasks = j->nbatch; nt = 1; }
  else if (j->nbatch >= nt) { j->split = 0; tasks = j->nbatch; }
  else {
    /* Split the larger side into nt panels, aligned to 16 for the micro-kernels. */
    j->split = j->n >= j->m ? 1 : 2;
    int64_t total = j->split == 1 ? j->n : j->m;
    j->panel = ((total + nt - 1) / nt + 15) / 16 * 16;
    tasks = j->nbatch * ((total + j->panel - 1) / j->panel);
  }
  if (nt == 1) gemm_range(j, 0, tasks);
  else kiln_parallel_for(tasks, 1, gemm_range, j);
}

static void gemm_raw(int dtype, int trans_a, int trans_b, int64_t n, int64_t m, int64_t k, double alpha, const void *a,
                     int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc, int fixed_parts) {
  if (n <= 0 || m <= 0) return;
  struct gemm_job j = {.dtype = dtype == KILN_F64 ? KILN_F64 : KILN_F32, .nbatch = 1, .n = n, .m = m, .k = k,
                       .a = a, .b = b, .c = c, .ta = trans_a ? KILN_BLAS_TRANS : KILN_BLAS_NO_TRANS,
                       .tb = trans_b ? KILN_BLAS_TRANS : KILN_BLAS_NO_TRANS, .lda = lda, .ldb = ldb, .ldc = ldc,
                       .alpha = alpha, .beta = beta};
  gemm_run_parts(&j, fixed_parts);
}

void kiln_cpu_gemm_raw(int dtype, int trans_a, int trans_b, int64_t n, int64_t m, int64_t k, double alpha,
                       const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc) {
  gemm_raw(dtype, trans_a, trans_b, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc, 0);
}

void kiln_cpu_gemm_raw_fixed(int dtype, int trans_a, int trans_b, int64_t n, int64_t m, int64_t k, double alpha,
                             const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc) {
  gemm_raw(dtype, trans_a, trans_b, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc, 16);
}

int kiln_cpu_gemm_raw_bf16(int trans_a, int trans_b, int64_t n, int64_t m, int64_t k, float alpha, const uint16_t *a,
                           int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (n <= 0 || m <= 0) return 0;
  struct gemm_job j = {.dtype = KILN_F32, .nbatch = 1, .n = n, .m = m, .k = k, .a = (const char *)a, .b = (const char *)b,
                       .c = (char *)c, .ta = trans_a ? KILN_BLAS_TRANS : KILN_BLAS_NO_TRANS,
                       .tb = trans_b ? KILN_BLAS_TRANS : KILN_BLAS_NO_TRANS, .lda = lda, .ldb = ldb, .ldc = ldc,
                       .alpha = alpha, .beta = beta, .bf16 = 1};
  gemm_run(&j);
  return j.failed ? -1 : 0;
}

/* A BLAS view of a rows x cols matrix with strides s0, s1: transposed or not, and its leading dim. */
int kiln_cpu_blas_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1, int *tr, int64_t *ld) {
  if ((s1 == 1 || cols == 1) && s0 >= (cols > 1 ? cols : 1)) { *tr = KILN_BLAS_NO_TRANS; *ld = s0 > 0 ? s0 : 1; if (rows == 1) *ld = cols > 1 ? cols : 1; return 1; }
  if ((s0 == 1 || rows == 1) && s1 >= (rows > 1 ? rows : 1)) { *tr = KILN_BLAS_TRANS; *ld = s1 > 0 ? s1 : 1; if (cols == 1) *ld = rows > 1 ? rows : 1; return 1; }
  return 0;
}
/* The same for dims 1, 2 of a 3-d tensor. */
static int blas_layout(const struct kiln_tensor *t, int *tr, int64_t *ld) {
  return kiln_cpu_blas_layout(t->sizes[1], t->sizes[2], t->strides[1], t->strides[2], tr, ld);
}

static void gemm_naive_i64(struct kiln_tensor *out, const struct kiln_tensor *a, const struct kiln_tensor *b, double alpha, double beta) {
  int64_t B = out->sizes[0], n = out->sizes[1], m = out->sizes[2], k = a->sizes[2];
  int64_t al = (int64_t)alpha, be = (int64_t)beta;
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < m; j++) {
        uint64_t s = 0;
        for (int64_t p = 0; p < k; p++) {
          int64_t x = (int64_t)kiln_tensor_get(a, a->offset + bi * a->strides[0] + i * a->strides[1] + p * a->strides[2]);
          int64_t y = (int64_t)kiln_tensor_get(b, b->offset + bi * b->strides[0] + p * b->strides[1] + j * b->strides[2]);
          s += (uint64_t)x * (uint64_t)y;
        }
        int64_t off = out->offset + bi * out->strides[0] + i * out->strides[1] + j * out->strides[2];
        int64_t prev = be ? (int64_t)kiln_tensor_get(out, off) : 0;
        kiln_store_f64((char *)out->storage->data + off * kiln_dtype_size(out->dtype), out->dtype,
                       (double)(int64_t)((uint64_t)al * s + (uint64_t)be * (uint64_t)prev));
      }
}

/* The storage a 3-d operand's elements span, from its first: 0 where that is not a plain forward
   layout worth widening whole (a zero size, a negative stride, or a view of a small part of a
   larger storage). */
static int64_t widen_span(const struct kiln_tensor *t) {
  int64_t span = 1;
  for (int d = 0; d < 3; d++) {
    if (t->sizes[d] <= 0 || t->strides[d] < 0) return 0;
    span += (t->sizes[d] - 1) * t->strides[d];
  }
  return span <= 2 * t->numel + 4096 ? span : 0;
}

/* n bf16 values widened to f32 (exactly) in parts of 64 K elements over the pool: a pass over
   memory that one thread would run alone while the others wait for the product */
struct widen_job { float *dst; const uint16_t *src; int64_t n; };
enum { WIDEN_PART = 1 << 16 };
static void widen_range(void *ctx, int64_t begin, int64_t end) {
  const struct widen_job *j = ctx;
  int64_t i0 = begin * WIDEN_PART, i1 = end * WIDEN_PART < j->n ? end * WIDEN_PART : j->n;
  convert_vectorised(j->dst + i0, KILN_F32, j->src + i0, KILN_BF16, i1 - i0);
}
void kiln_cpu_widen_bf16(float *dst, const uint16_t *src, int64_t n) {
  struct widen_job j = {dst, src, n};
  kiln_parallel_for((n + WIDEN_PART - 1) / WIDEN_PART, 1, widen_range, &j);
}

/* bf16 operands where f32 FMAs are the faster way (!kiln_cpu_bf16_products_native): the f32
   product of the widened values, rounded to bf16 once (nearest even). On kiln's kernel where it
   takes them (kiln_cpu_sgemm_bf16: widened as packed, rounded as stored, no f32 copies); else each
   operand's storage widened to f32 as it lies (exactly, in one vectorised pass, its strides kept)
   and the f32 product rounded after. The same bits either way. 1 when the layouts do not suit it. */
static int gemm_bf16_widened(struct kiln_tensor *out, const struct kiln_tensor *a, const struct kiln_tensor *b, double alpha,
                             double beta, int *rc) {
  struct gemm_job j = {.dtype = KILN_F32, .nbatch = out->sizes[0], .n = out->sizes[1], .m = out->sizes[2], .k = a->sizes[2],
                       .alpha = alpha, .beta = beta};
  if (!blas_layout(a, &j.ta, &j.lda) || !blas_layout(b, &j.tb, &j.ldb)) return 1;
  j.sa = a->sizes[0] > 1 ? a->strides[0] : 0;
  j.sb = b->sizes[0] > 1 ? b->strides[0] : 0;
  /* on kiln's kernel: widened as packed, C rounded as stored (no f32 copies), where it can */
  if (out->strides[2] == 1 && out->strides[1] >= out->sizes[2] && kiln_is_contiguous(out) &&
      kiln_cpu_sgemm_bf16_here(j.n, j.m, j.k, (float)alpha, 1)) {
    j.bf16 = 2;
    j.a = kiln_tensor_data(a); j.b = kiln_tensor_data(b); j.c = kiln_tensor_data(out);
    j.sc = out->strides[0];
    j.ldc = out->strides[1] > 0 ? out->strides[1] : 1;
    gemm_run(&j);
    *rc = j.failed ? kiln_fail(KILN_ERR_MEMORY, "matmul: out of memory for the buffers of a bf16 product %s x %s",
                               kiln_shape_string(a), kiln_shape_string(b))
                   : KILN_OK;
    return 0;
  }
  int64_t sa = widen_span(a), sb = widen_span(b);   /* else widened copies, where the storage is not much more */
  if (!sa || !sb) return 1;
  float *af = malloc(sizeof(float) * (size_t)(sa + sb) + 64);
  struct kiln_tensor *C = af ? kiln_tensor_empty(3, out->sizes, KILN_F32, out->device) : NULL;
  if (!C) {
    free(af);
    *rc = af ? kiln_error_code() : kiln_fail(KILN_ERR_MEMORY, "matmul: out of memory widening bf16 operands %s and %s",
                                           kiln_shape_string(a), kiln_shape_string(b));
    return 0;
  }
  float *bf = af + sa;
  kiln_cpu_widen_bf16(af, kiln_tensor_data(a), sa);
  kiln_cpu_widen_bf16(bf, kiln_tensor_data(b), sb);
  if (beta != 0) kiln_cpu_copy(C, out);
  j.a = (const char *)af; j.b = (const char *)bf; j.c = kiln_tensor_data(C);
  j.sc = C->strides[0];
  j.ldc = C->strides[1] > 0 ? C->strides[1] : 1;
  gemm_run(&j);
  *rc = kiln_cpu_copy(out, C);
  free(af);
  kiln_tensor_release(C);
  return 0;
}

int cpu_gemm(const struct kiln_call *c) {
  struct kiln_tensor *out = c->out;
  const struct kiln_tensor *a = c->in[0], *b = c->in[1];
  double alpha = c->scalar[0], beta = c->scalar[1];
  if (out->numel == 0) return KILN_OK;
  if (!kiln_dtype_is_float(out->dtype)) { gemm_naive_i64(out, a, b, alpha, beta); return KILN_OK; }
  if (out->dtype == KILN_BF16 && a->dtype == KILN_BF16 && b->dtype == KILN_BF16 && alpha == 1 && beta == 0) {
    int rc;   /* where the CPU has AMX: oneDNN's matmul (cpu/onednn.c) */
    if (kiln_cpu_onednn_gemm(out, a, b, &rc)) return rc;
  }
  if (out->dtype == KILN_BF16 && a->dtype == KILN_BF16 && b->dtype == KILN_BF16 && kiln_cpu_bf16_products_native())
    return cpu_gemm_bf16(out, a, b, alpha, beta);   /* cpu/bf16_gemm.c: AVX512-BF16 */
  if (out->dtype == KILN_BF16 && a->dtype == KILN_BF16 && b->dtype == KILN_BF16) {
    int rc = KILN_OK;
    if (!gemm_bf16_widened(out, a, b, alpha, beta, &rc)) return rc;
  }
  int dt = out->dtype == KILN_F64 ? KILN_F64 : KILN_F32;
  struct kiln_tensor *A = NULL, *Bm = NULL, *C = NULL;
  int rc = KILN_OK;
  struct gemm_job j = {.dtype = dt, .nbatch = out->sizes[0], .n = out->sizes[1], .m = out->sizes[2], .k = a->sizes[2],
                       .alpha = alpha, .beta = beta};
  /* Operands BLAS cannot read in place (other dtype, odd strides) are copied first. */
  A = (a->dtype == dt && blas_layout(a, &j.ta, &j.lda)) ? kiln_layout_alias(a) : NULL;
  if (!A) {
    A = kiln_tensor_empty(3, a->sizes, dt, a->device);
    if (!A) return kiln_error_code();
    kiln_cpu_copy(A, a);
    blas_layout(A, &j.ta, &j.lda);
  }
  Bm = (b->dtype == dt && blas_layout(b, &j.tb, &j.ldb)) ? kiln_layout_alias(b) : NULL;
  if (!Bm) {
    Bm = kiln_tensor_empty(3, b->sizes, dt, b->device);
    if (!Bm) { rc = kiln_error_code(); goto done; }
    kiln_cpu_copy(Bm, b);
    blas_layout(Bm, &j.tb, &j.ldb);
  }
  int direct_out = out->dtype == dt && out->strides[2] == 1 && out->strides[1] >= out->sizes[2] && kiln_is_contiguous(out);
  C = direct_out ? kiln_layout_alias(out) : kiln_tensor_empty(3, out->sizes, dt, out->device);
  if (!C) { rc = kiln_error_code(); goto done; }
  if (!direct_out && beta != 0) kiln_cpu_copy(C, out);
  j.a = kiln_tensor_data(A); j.b = kiln_tensor_data(Bm); j.c = kiln_tensor_data(C);
  j.sa = A->sizes[0] > 1 ? A->strides[0] : 0;
  j.sb = Bm->sizes[0] > 1 ? Bm->strides[0] : 0;
  j.sc = C->strides[0];
  j.ldc = C->strides[1] > 0 ? C->strides[1] : 1;
  gemm_run(&j);
  if (!direct_out) kiln_cpu_copy(out, C);
done:
  kiln_tensor_release(A); kiln_tensor_release(Bm); kiln_tensor_release(C);
  return rc;
}

/* LINEAR: out [N, O] (contiguous, made by the front end) = x [N, I] w^T + bias, then relu when
   ints[0] is 1: one product whose stores add the bias and clamp (kiln's own f32 kernel), or the
   BLAS's product and then the same arithmetic on each part while it is in cache. Either way each
   element is the product's, + bias, then relu: the bits of matmul, add and relu. */
int cpu_linear(const struct kiln_call *c) {
  struct kiln_tensor *out = c->out;
  const struct kiln_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
  if (out->numel == 0) return KILN_OK;
  struct gemm_job j = {.dtype = out->dtype, .nbatch = 1, .n = x->sizes[0], .m = w->sizes[0], .k = x->sizes[1], .alpha = 1.0,
                       .beta = 0.0, .bias = b ? kiln_tensor_data(b) : NULL, .relu = c->ints[0] != 0, .ldc = out->sizes[1]};
  struct kiln_tensor *X = NULL;
  if (!kiln_cpu_blas_layout(x->sizes[0], x->sizes[1], x->strides[0], x->strides[1], &j.ta, &j.lda)) {   /* odd strides: a copy */
    if (!(X = kiln_tensor_empty(2, x->sizes, x->dtype, x->device))) return kiln_error_code();
    kiln_cpu_copy(X, x);
    kiln_cpu_blas_layout(X->sizes[0], X->sizes[1], X->strides[0], X->strides[1], &j.ta, &j.lda);
  }
  /* op(B) = w^T, [I, O] */
  struct kiln_tensor *W = NULL;
  if (!kiln_cpu_blas_layout(w->sizes[1], w->sizes[0], w->strides[1], w->strides[0], &j.tb, &j.ldb)) {
    if (!(W = kiln_tensor_empty(2, w->sizes, w->dtype, w->device))) { kiln_tensor_release(X); return kiln_error_code(); }
    kiln_cpu_copy(W, w);
    kiln_cpu_blas_layout(W->sizes[1], W->sizes[0], W->strides[1], W->strides[0], &j.tb, &j.ldb);
  }
  j.a = kiln_tensor_data(X ? X : x); j.b = kiln_tensor_data(W ? W : w); j.c = kiln_tensor_data(out);
  gemm_run(&j);
  kiln_tensor_release(X); kiln_tensor_release(W);
  return KILN_OK;
}
