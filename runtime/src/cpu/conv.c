/* cpu/conv.c: 2-d convolution on the CPU. The batch is cut into a fixed number of parts (a
   function of the shapes only, never of the thread count); kiln's pool runs the parts, and
   each part takes its images a few at a time: im2col into the worker's own buffer, then one
   GEMM through OpenBLAS (single-threaded) per group for small images, or one per image, reading
   and writing the tensors in place, for large ones (DIRECT_P). Backward: grad input by GEMM + col2im,
   grad weight by GEMM into one partial per part, the partials added in order; grad bias by a
   sum. Every result is therefore bitwise the same at any thread count. */
#include "cpu.h"
#include "dtype_math.h"
#include "nn_calls.h"
#include <stdlib.h>
#include <string.h>

enum {
  PARTS = KILN_CONV_PARTS,  /* batch parts: the most threads a conv can use, and the grad-weight partials */
  COL_BYTES = 1024 << 10,   /* aim for an im2col buffer of about this size (in L2) */
  DIRECT_P = 256            /* from this many output pixels per image, the forward GEMMs write y directly */
};

struct geom {
  int64_t N, C, H, W;       /* input x (or grad input) */
  int64_t O, OH, OW;        /* output y (or grad output) */
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int64_t G, Cg, Og;        /* groups, channels per group in and out */
  int64_t K, P;             /* Cg*kh*kw (rows of a column buffer), OH*OW (columns per image) */
  int64_t nb;               /* images per im2col buffer */
  int64_t parts;
};

static void geom_init(struct geom *g, const int64_t *ints, int64_t N, int64_t C, int64_t H, int64_t W,
                      const struct kiln_tensor *w, int64_t O, int64_t OH, int64_t OW, int es) {
  g->N = N; g->C = C; g->H = H; g->W = W; g->O = O; g->OH = OH; g->OW = OW;
  g->kh = w->sizes[2]; g->kw = w->sizes[3];
  g->sh = ints[0]; g->sw = ints[1]; g->ph = ints[2]; g->pw = ints[3]; g->dh = ints[4]; g->dw = ints[5];
  g->G = ints[6]; g->Cg = C / g->G; g->Og = O / g->G;
  g->K = g->Cg * g->kh * g->kw;
  g->P = OH * OW;
  g->parts = N < PARTS ? N : PARTS;
  int64_t per_image = g->K * g->P * es;
  int64_t nb = per_image > 0 ? COL_BYTES / per_image : 1;
  int64_t most = g->parts > 0 ? (N + g->parts - 1) / g->parts : 1;   /* images in the largest part */
  g->nb = nb < 1 ? 1 : nb > most ? most : nb;
}

/* The output columns ow whose input column ow*sw + iw0 lies inside [0, W). */
static void ow_range(const struct geom *g, int64_t iw0, int64_t *lo, int64_t *hi) {
  int64_t a = iw0 >= 0 ? 0 : (-iw0 + g->sw - 1) / g->sw;
  int64_t b = g->W - 1 - iw0 < 0 ? 0 : (g->W - 1 - iw0) / g->sw + 1;
  if (b > g->OW) b = g->OW;
  if (a > b) a = b;
  *lo = a; *hi = b;
}

/* The rows im2col copies are short (8 floats in the benchmark's second conv): plain vector moves
   beat a call to memcpy, which gcc would otherwise put in place of the copy loops. */
#define NO_MEMCPY __attribute__((optimize("no-tree-loop-distribute-patterns")))

/* The valid output columns [lo[kj], hi[kj]) of each kernel column kj (kw entries). */
static void kernel_cols(const struct geom *g, int64_t *lo, int64_t *hi) {
  for (int64_t kj = 0; kj < g->kw; kj++) ow_range(g, kj * g->dw - g->pw, &lo[kj], &hi[kj]);
}

/* Each kernel below is one body over dt (cpu/dtype_math.h), with a named function per dtype that
   the convolution calls. */

/* col [K, nb*P] from images n0..n0+nb-1, input channels c0..c0+Cg-1 of x [N,C,H,W]. Each input
   row is read once for all kernel columns kj; rows outside the image give zeros. */
NO_MEMCPY static inline __attribute__((always_inline)) void im2col(int dt, const struct geom *g, const void *restrict x,
                                                                  int64_t n0, int64_t nb, int64_t c0, void *restrict col,
                                                                  int64_t *lo, int64_t *hi) {
  const int64_t ld = nb * g->P, OH = g->OH, OW = g->OW, H = g->H, W = g->W, kh = g->kh, kw = g->kw;
  const int64_t sh = g->sh, sw = g->sw, ph = g->ph, pw = g->pw, dh = g->dh, dw = g->dw;
  for (int64_t c = 0; c < g->Cg; c++)
    for (int64_t ki = 0; ki < kh; ki++) {
      void *rows = dt_at(col, dt, (c * kh + ki) * kw * ld);
      for (int64_t i = 0; i < nb; i++) {
        const void *plane = dt_at(x, dt, ((n0 + i) * g->C + c0 + c) * H * W);
        for (int64_t oh = 0; oh < OH; oh++) {
          int64_t ih = oh * sh - ph + ki * dh, at = i * g->P + oh * OW;
          if (ih < 0 || ih >= H) {
            for (int64_t kj = 0; kj < kw; kj++) memset(dt_at(rows, dt, kj * ld + at), 0, dt_size(dt) * (size_t)OW);
            continue;
          }
          const void *s = dt_at(plane, dt, ih * W);
          for (int64_t kj = 0; kj < kw; kj++) {
            void *d = dt_at(rows, dt, kj * ld + at);
            int64_t a = lo[kj], b = hi[kj], off = kj * dw - pw;
            if (sw == 1 && a == 0 && b == OW && (OW & 7) == 0) {   /* whole rows, in blocks of 8 */
              for (int64_t ow = 0; ow < OW; ow += 8)
                for (int k = 0; k < 8; k++) dt_store(d, dt, ow + k, dt_load(s, dt, ow + k + off));
              continue;
            }
            for (int64_t ow = 0; ow < a; ow++) dt_store(d, dt, ow, 0);
            if (sw == 1) for (int64_t ow = a; ow < b; ow++) dt_store(d, dt, ow, dt_load(s, dt, ow + off));
            else for (int64_t ow = a; ow < b; ow++) dt_store(d, dt, ow, dt_load(s, dt, ow * sw + off));
            for (int64_t ow = b; ow < OW; ow++) dt_store(d, dt, ow, 0);
          }
        }
      }
    }
}
NO_MEMCPY static void im2col_f32(const struct geom *g, const float *restrict x, int64_t n0, int64_t nb, int64_t c0,
                                 float *restrict col, int64_t *lo, int64_t *hi) {
  im2col(KILN_F32, g, x, n0, nb, c0, col, lo, hi);
}
NO_MEMCPY static void im2col_f64(const struct geom *g, const double *restrict x, int64_t n0, int64_t nb, int64_t c0,
                                 double *restrict col, int64_t *lo, int64_t *hi) {
  im2col(KILN_F64, g, x, n0, nb, c0, col, lo, hi);
}

/* The adjoint of im2col: add col [K, nb*P] into images n0.. of gx [N,C,H,W]. The kernel column kj
   is the outer loop: neighbouring kj write overlapping stretches of a row, and a load right
   after an overlapping store would stall on store forwarding. */
static inline __attribute__((always_inline)) void col2im(int dt, const struct geom *g, const void *restrict col, int64_t n0,
                                                         int64_t nb, int64_t c0, void *restrict gx, int64_t *lo, int64_t *hi) {
  const int64_t ld = nb * g->P, OH = g->OH, OW = g->OW, H = g->H, W = g->W, kh = g->kh, kw = g->kw;
  const int64_t sh = g->sh, sw = g->sw, ph = g->ph, pw = g->pw, dh = g->dh, dw = g->dw;
  for (int64_t c = 0; c < g->Cg; c++)
    for (int64_t ki = 0; ki < kh; ki++)
      for (int64_t kj = 0; kj < kw; kj++) {
        const void *row = dt_at(col, dt, ((c * kh + ki) * kw + kj) * ld);
        int64_t a = lo[kj], b = hi[kj], off = kj * dw - pw;
        for (int64_t i = 0; i < nb; i++) {
          void *plane = dt_at(gx, dt, ((n0 + i) * g->C + c0 + c) * H * W);
          for (int64_t oh = 0; oh < OH; oh++) {
            int64_t ih = oh * sh - ph + ki * dh;
            if (ih < 0 || ih >= H) continue;
            const void *d = dt_at(row, dt, i * g->P + oh * OW);
            void *s = dt_at(plane, dt, ih * W);
            if (sw == 1) for (int64_t ow = a; ow < b; ow++) dt_store(s, dt, ow + off, dt_add(dt, dt_load(s, dt, ow + off), dt_load(d, dt, ow)));
            else for (int64_t ow = a; ow < b; ow++) dt_store(s, dt, ow * sw + off, dt_add(dt, dt_load(s, dt, ow * sw + off), dt_load(d, dt, ow)));
          }
        }
      }
}
static void col2im_f32(const struct geom *g, const float *restrict col, int64_t n0, int64_t nb, int64_t c0,
                       float *restrict gx, int64_t *lo, int64_t *hi) {
  col2im(KILN_F32, g, col, n0, nb, c0, gx, lo, hi);
}
static void col2im_f64(const struct geom *g, const double *restrict col, int64_t n0, int64_t nb, int64_t c0,
                       double *restrict gx, int64_t *lo, int64_t *hi) {
  col2im(KILN_F64, g, col, n0, nb, c0, gx, lo, hi);
}

/* y[n0+i, o0+o, :] = buf[o, i*P : (i+1)*P] + bias[o0+o] (bias may be NULL). */
static inline __attribute__((always_inline)) void scatter(int dt, const struct geom *g, const void *buf, int64_t n0, int64_t nb,
                                                          int64_t o0, int64_t no, int64_t O, const void *bias, void *y) {
  int64_t P = g->P, ld = nb * P;
  for (int64_t i = 0; i < nb; i++)
    for (int64_t o = 0; o < no; o++) {
      double b = dt_load_or(bias, dt, o0 + o, 0);
      void *d = dt_at(y, dt, ((n0 + i) * O + o0 + o) * P);
      const void *s = dt_at(buf, dt, o * ld + i * P);
      for (int64_t p = 0; p < P; p++) dt_store(d, dt, p, dt_add(dt, dt_load(s, dt, p), b));
    }
}
static void scatter_f32(const struct geom *g, const float *buf, int64_t n0, int64_t nb, int64_t o0, int64_t no,
                        int64_t O, const float *bias, float *y) {
  scatter(KILN_F32, g, buf, n0, nb, o0, no, O, bias, y);
}
static void scatter_f64(const struct geom *g, const double *buf, int64_t n0, int64_t nb, int64_t o0, int64_t no,
                        int64_t O, const double *bias, double *y) {
  scatter(KILN_F64, g, buf, n0, nb, o0, no, O, bias, y);
}

/* x[n, c, :] += bias[c] for images n0.. of x [N, C, HW]; with one image and C the block's rows,
   y[o, :] += bias[o] for the rows of one image's block [no, P]. */
static inline __attribute__((always_inline)) void add_bias(int dt, const void *bias, int64_t n0, int64_t nb, int64_t C,
                                                           int64_t HW, void *x) {
  for (int64_t i = 0; i < nb; i++)
    for (int64_t c = 0; c < C; c++) {
      double b = dt_load(bias, dt, c);
      void *d = dt_at(x, dt, ((n0 + i) * C + c) * HW);
      for (int64_t p = 0; p < HW; p++) dt_store(d, dt, p, dt_add(dt, dt_load(d, dt, p), b));
    }
}
static void bias_rows_f32(const float *bias, int64_t no, int64_t P, float *y) { add_bias(KILN_F32, bias, 0, 1, no, P, y); }
static void bias_rows_f64(const double *bias, int64_t no, int64_t P, double *y) { add_bias(KILN_F64, bias, 0, 1, no, P, y); }
/* the bias of conv_transpose2d */
static void add_bias_f32(const float *bias, int64_t n0, int64_t nb, int64_t C, int64_t HW, float *x) {
  add_bias(KILN_F32, bias, n0, nb, C, HW, x);
}
static void add_bias_f64(const double *bias, int64_t n0, int64_t nb, int64_t C, int64_t HW, double *x) {
  add_bias(KILN_F64, bias, n0, nb, C, HW, x);
}

/* c = op(a) @ op(b) + beta * c, row-major. */
static void gemm(int dt, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *a,
                 int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {   /* BLAS wants k >= 1; the product is zero */
    int es = dt == KILN_F32 ? 4 : 8;
    if (beta == 0) for (int64_t i = 0; i < m; i++) memset((char *)c + i * ldc * es, 0, (size_t)(n * es));
    return;
  }
  if (dt == KILN_F32 && kiln_cpu_sgemm_here(m, n, k))   /* the parts are fixed: the choice is the threads' too */
    kiln_cpu_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, (float)beta, c, ldc);
  else if (dt == KILN_F32)
    kiln_sgemm(ta, tb, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, (float)beta, c, (int)ldc);
  else
    kiln_dgemm(ta, tb, (int)m, (int)n, (int)k, 1.0, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

static int64_t part_begin(const struct geom *g, int64_t t) { return t * g->N / g->parts; }

static int float_dtype(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_F32 || t->dtype == KILN_F64) return KILN_OK;
  return kiln_fail(KILN_ERR_DTYPE, "%s: %s tensors are not supported on cpu (f32 or f64; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

/* A contiguous version of t (a new reference), or NULL with an error. */
static struct kiln_tensor *dense(const struct kiln_tensor *t) { return t ? kiln_cpu_contiguous(t) : NULL; }

/* ---- forward ---- */

struct fwd_job {
  struct geom g;
  int dt;
  const char *x, *w, *bias;
  char *y;
  const struct kiln_tensor *input;
  int failed;
};

/* The choice's view of a convolution (cpu/onednn.c). */
static void conv_job(struct kiln_conv_job *cj, const struct geom *g, int dt, const void *x, const void *w) {
  memset(cj, 0, sizeof *cj);
  cj->dtype = dt; cj->N = g->N; cj->C = g->C; cj->H = g->H; cj->W = g->W; cj->O = g->O; cj->OH = g->OH; cj->OW = g->OW;
  cj->kh = g->kh; cj->kw = g->kw; cj->sh = g->sh; cj->sw = g->sw; cj->ph = g->ph; cj->pw = g->pw; cj->dh = g->dh;
  cj->dw = g->dw; cj->G = g->G; cj->parts = g->parts; cj->x = x; cj->w = w;
  if (kiln_cpu_winograd_takes(cj)) cj->winograd = kiln_cpu_winograd_run;
}

static void conv_forward_parts(void *ctx, int64_t begin, int64_t end) {
  struct fwd_job *j = ctx;
  const struct geom *g = &j->g;
  int es = j->dt == KILN_F32 ? 4 : 8;
  char *col = malloc((size_t)(g->K * g->nb * g->P * es) + 64);
  char *buf = malloc(g->P >= DIRECT_P ? 64 : (size_t)(g->Og * g->nb * g->P * es) + 64);
  int64_t *lo = malloc(sizeof(int64_t) * (size_t)(2 * g->kw)), *hi = lo ? lo + g->kw : NULL;
  if (!col || !buf || !lo) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); free(col); free(buf); free(lo); return; }
  kernel_cols(g, lo, hi);
  for (int64_t t = begin; t < end; t++) {
    for (int64_t n0 = part_begin(g, t), n1 = part_begin(g, t + 1); n0 < n1; n0 += g->nb) {
      int64_t nb = n1 - n0 < g->nb ? n1 - n0 : g->nb, ld = nb * g->P;
      for (int64_t gi = 0; gi < g->G; gi++) {
        const char *wg = j->w + gi * g->Og * g->K * es;
        if (g->P >= DIRECT_P) {   /* large images: one GEMM per image, straight into y */
          if (j->dt == KILN_F32) im2col_f32(g, (const float *)j->x, n0, nb, gi * g->Cg, (float *)col, lo, hi);
          else im2col_f64(g, (const double *)j->x, n0, nb, gi * g->Cg, (double *)col, lo, hi);
          for (int64_t i = 0; i < nb; i++) {
            char *yi = j->y + ((n0 + i) * g->O + gi * g->Og) * g->P * es;
            gemm(j->dt, KILN_BLAS_NO_TRANS, KILN_BLAS_NO_TRANS, g->Og, g->P, g->K, wg, g->K, col + i * g->P * es, ld, 0, yi, g->P);
            if (j->bias && j->dt == KILN_F32) bias_rows_f32((const float *)j->bias + gi * g->Og, g->Og, g->P, (float *)yi);
            else if (j->bias) bias_rows_f64((const double *)j->bias + gi * g->Og, g->Og, g->P, (double *)yi);
          }
        } else if (j->dt == KILN_F32) {
          im2col_f32(g, (const float *)j->x, n0, nb, gi * g->Cg, (float *)col, lo, hi);
          gemm(j->dt, KILN_BLAS_NO_TRANS, KILN_BLAS_NO_TRANS, g->Og, ld, g->K, wg, g->K, col, ld, 0, buf, ld);
          scatter_f32(g, (const float *)buf, n0, nb, gi * g->Og, g->Og, g->O, (const float *)j->bias, (float *)j->y);
        } else {
          im2col_f64(g, (const double *)j->x, n0, nb, gi * g->Cg, (double *)col, lo, hi);
          gemm(j->dt, KILN_BLAS_NO_TRANS, KILN_BLAS_NO_TRANS, g->Og, ld, g->K, wg, g->K, col, ld, 0, buf, ld);
          scatter_f64(g, (const double *)buf, n0, nb, gi * g->Og, g->Og, g->O, (const double *)j->bias, (double *)j->y);
        }
      }
    }
  }
  free(col);
  free(buf);
  free(lo);
}

static int forward_im2col(void *ctx) {
  struct fwd_job *j = ctx;
  j->failed = 0;
  kiln_parallel_for(j->g.parts, 1, conv_forward_parts, j);
  if (j->failed) return kiln_fail(KILN_ERR_MEMORY, "conv2d: out of memory for the im2col buffers (input %s)", kiln_shape_string(j->input));
  return KILN_OK;
}

int cpu_conv2d(const struct kiln_call *c) {
  struct kiln_tensor *y = c->out;
  if (c->in[0]->dtype == KILN_BF16) return cpu_conv2d_bf16(c);   /* cpu/bf16_conv.c */
  if (float_dtype("conv2d", c->in[0])) return kiln_error_code();
  if (y->numel == 0) return KILN_OK;
  struct kiln_tensor *x = dense(c->in[0]), *w = dense(c->in[1]), *b = c->in[2] ? dense(c->in[2]) : NULL;
  int rc = KILN_OK;
  if (!x || !w || (c->in[2] && !b)) { rc = kiln_error_code(); goto done; }
  struct fwd_job j = {.dt = y->dtype};
  geom_init(&j.g, c->ints, x->sizes[0], x->sizes[1], x->sizes[2], x->sizes[3], w, y->sizes[1], y->sizes[2], y->sizes[3],
            kiln_dtype_size(y->dtype));
  j.x = kiln_tensor_data(x); j.w = kiln_tensor_data(w); j.bias = b ? kiln_tensor_data(b) : NULL;
  j.y = kiln_tensor_data(y);
  j.input = x;
  struct kiln_conv_job cj;
  conv_job(&cj, &j.g, j.dt, j.x, j.w);
  cj.bias = j.bias; cj.y = j.y; cj.im2col = forward_im2col; cj.ctx = &j;
  rc = kiln_cpu_conv_run(&cj);
done:
  kiln_tensor_release(x); kiln_tensor_release(w); kiln_tensor_release(b);
  return rc;
}

/* ---- backward ---- */

struct bwd_job {
  struct geom g;
  int dt;
  const char *gy, *x, *w, *bias;
  char *gx;
  char *partials;           /* [parts, O, K]: grad weight of each part, or NULL */
  int failed;
};

/* gy of image n, group gi: [Og, P]. */
static const char *gy_block(const struct bwd_job *j, int64_t n, int64_t gi, int es) {
  return j->gy + (n * j->g.O + gi * j->g.Og) * j->g.P * es;
}

static void conv_backward_parts(void *ctx, int64_t begin, int64_t end) {
  struct bwd_job *j = ctx;
  const struct geom *g = &j->g;
  int es = j->dt == KILN_F32 ? 4 : 8;
  char *col = malloc((size_t)(g->K * g->nb * g->P * es) + 64);
  char *gyc = malloc(g->P >= DIRECT_P ? 64 : (size_t)(g->Og * g->nb * g->P * es) + 64);
  int64_t *lo = malloc(sizeof(int64_t) * (size_t)(2 * g->kw)), *hi = lo ? lo + g->kw : NULL;
  if (!col || !gyc || !lo) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); free(col); free(gyc); free(lo); return; }
  kernel_cols(g, lo, hi);
  int64_t HW = g->H * g->W;
  for (int64_t t = begin; t < end; t++) {
    char *partial = j->partials ? j->partials + t * g->O * g->K * es : NULL;
    int first = 1;
    for (int64_t n0 = part_begin(g, t), n1 = part_begin(g, t + 1); n0 < n1; n0 += g->nb) {
      int64_t nb = n1 - n0 < g->nb ? n1 - n0 : g->nb, ld = nb * g->P;
      if (j->gx) memset(j->gx + n0 * g->C * HW * es, 0, (size_t)(nb * g->C * HW * es));
      for (int64_t gi = 0; gi < g->G; gi++) {
        const char *wg = j->w + gi * g->Og * g->K * es;
        /* large images: one GEMM per image, reading gy in place; small ones: this group's grad
           output for the images gathered into gyc [Og, nb*P], and one GEMM for them all */
        int direct = g->P >= DIRECT_P;
        if (!direct)
          for (int64_t i = 0; i < nb; i++)
            for (int64_t o = 0; o < g->Og; o++)
              memcpy(gyc + (o * ld + i * g->P) * es, j->gy + ((n0 + i) * g->O + gi * g->Og + o) * g->P * es,
                     (size_t)(g->P * es));
        if (partial) {
          char *pw = partial + gi * g->Og * g->K * es;
          if (j->dt == KILN_F32) im2col_f32(g, (const float *)j->x, n0, nb, gi * g->Cg, (float *)col, lo, hi);
          else im2col_f64(g, (const double *)j->x, n0, nb, gi * g->Cg, (double *)col, lo, hi);
          if (direct)
            for (int64_t i = 0; i < nb; i++)
              gemm(j->dt, KILN_BLAS_NO_TRANS, KILN_BLAS_TRANS, g->Og, g->K, g->P, gy_block(j, n0 + i, gi, es), g->P,
                   col + i * g->P * es, ld, first && i == 0 ? 0 : 1, pw, g->K);
          else
            gemm(j->dt, KILN_BLAS_NO_TRANS, KILN_BLAS_TRANS, g->Og, g->K, ld, gyc, ld, col, ld, first ? 0 : 1, pw, g->K);
        }
        if (j->gx) {
          if (direct)
            for (int64_t i = 0; i < nb; i++)
              gemm(j->dt, KILN_BLAS_TRANS, KILN_BLAS_NO_TRANS, g->K, g->P, g->Og, wg, g->K, gy_block(j, n0 + i, gi, es), g->P, 0,
                   col + i * g->P * es, ld);
          else
            gemm(j->dt, KILN_BLAS_TRANS, KILN_BLAS_NO_TRANS, g->K, ld, g->Og, wg, g->K, gyc, ld, 0, col, ld);
          if (j->dt == KILN_F32) col2im_f32(g, (const float *)col, n0, nb, gi * g->Cg, (float *)j->gx, lo, hi);
          else col2im_f64(g, (const double *)col, n0, nb, gi * g->Cg, (double *)j->gx, lo, hi);
        }
      }
      if (j->gx && j->bias) {
        if (j->dt == KILN_F32) add_bias_f32((const float *)j->bias, n0, nb, g->C, HW, (float *)j->gx);
        else add_bias_f64((const double *)j->bias, n0, nb, g->C, HW, (double *)j->gx);
      }
      first = 0;
    }
  }
  free(col);
  free(gyc);
  free(lo);
}

/* gw = the partials added in part order. */
struct sum_job { const struct geom *g; int dt; const char *partials; char *gw; int64_t n; };
static void sum_partials(void *ctx, int64_t begin, int64_t end) {
  const struct sum_job *s = ctx;
  int64_t parts = s->g->parts, n = s->n;
  if (s->dt == KILN_F32) {
    const float *p = (const float *)s->partials;
    float *o = (float *)s->gw;
    for (int64_t i = begin; i < end; i++) o[i] = p[i];
    for (int64_t t = 1; t < parts; t++)
      for (int64_t i = begin; i < end; i++) o[i] += p[t * n + i];
  } else {
    const double *p = (const double *)s->partials;
    double *o = (double *)s->gw;
    for (int64_t i = begin; i < end; i++) o[i] = p[i];
    for (int64_t t = 1; t < parts; t++)
      for (int64_t i = begin; i < end; i++) o[i] += p[t * n + i];
  }
}

/* gb[o] = the sum of gy[:, o, :], in double, in a fixed order. */
struct bias_job { const struct geom *g; int dt; const char *gy; char *gb; };
static void sum_bias(void *ctx, int64_t begin, int64_t end) {
  const struct bias_job *b = ctx;
  const struct geom *g = b->g;
  for (int64_t o = begin; o < end; o++) {
    double s = 0;
    for (int64_t n = 0; n < g->N; n++) {
      int64_t off = (n * g->O + o) * g->P;
      if (b->dt == KILN_F32) {   /* eight lanes, so that the loop vectorises; added in a fixed order */
        const float *p = (const float *)b->gy + off;
        float lane[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= g->P; i += 8)
          for (int l = 0; l < 8; l++) lane[l] += p[i + l];
        for (; i < g->P; i++) lane[0] += p[i];
        for (int l = 0; l < 8; l++) s += lane[l];
      } else {
        const double *p = (const double *)b->gy + off;
        for (int64_t i = 0; i < g->P; i++) s += p[i];
      }
    }
    if (b->dt == KILN_F32) ((float *)b->gb)[o] = (float)s;
    else ((double *)b->gb)[o] = s;
  }
}

static int backward_im2col(void *ctx) {
  struct bwd_job *j = ctx;
  j->failed = 0;
  kiln_parallel_for(j->g.parts, 1, conv_backward_parts, j);
  if (j->failed) return kiln_fail(KILN_ERR_MEMORY, "conv2d_backward: out of memory for the im2col buffers");
  return KILN_OK;
}

int cpu_conv2d_backward(const struct kiln_call *c) {
  const struct kiln_conv_grads *out = c->extra;
  if (c->in[0]->dtype == KILN_BF16) return cpu_conv2d_backward_bf16(c);   /* cpu/bf16_conv.c */
  if (float_dtype("conv2d_backward", c->in[0])) return kiln_error_code();
  struct kiln_tensor *gy = dense(c->in[0]), *x = NULL, *w = dense(c->in[2]), *bias = NULL;
  char *partials = NULL;
  int rc = KILN_OK;
  if (!gy || !w) { rc = kiln_error_code(); goto done; }
  if (out->gw && c->in[1] && !(x = dense(c->in[1]))) { rc = kiln_error_code(); goto done; }
  if (out->gx && c->in[3] && !(bias = dense(c->in[3]))) { rc = kiln_error_code(); goto done; }
  const struct kiln_tensor *xs = out->gx ? out->gx : x;   /* the input's sizes */
  int cj_summed = 0;   /* oneDNN added the parts' grad weights, into gw */
  int es = kiln_dtype_size(gy->dtype);
  struct bwd_job j = {.dt = gy->dtype};
  geom_init(&j.g, c->ints, gy->sizes[0], w->sizes[1] * c->ints[6], xs ? xs->sizes[2] : 0, xs ? xs->sizes[3] : 0, w,
            gy->sizes[1], gy->sizes[2], gy->sizes[3], es);
  const struct geom *g = &j.g;
  if (out->gw && (!x || g->N == 0 || g->P == 0)) {   /* no images: the grad weight is zero */
    kiln_cpu_fill(out->gw, 0);
  } else if (out->gw) {
    partials = malloc((size_t)(g->parts * g->O * g->K * es) + 64);
    if (!partials) { rc = kiln_fail(KILN_ERR_MEMORY, "conv2d_backward: out of memory for the grad-weight partials"); goto done; }
  }
  j.gy = kiln_tensor_data(gy); j.w = kiln_tensor_data(w); j.x = x ? kiln_tensor_data(x) : NULL;
  j.bias = bias ? kiln_tensor_data(bias) : NULL;
  j.gx = out->gx && out->gx->numel ? kiln_tensor_data(out->gx) : NULL;
  j.partials = partials;
  if (j.gx || j.partials) {
    if (g->P == 0 && j.gx) {   /* an empty output: grad input is zero (plus the bias) */
      memset(j.gx, 0, (size_t)(out->gx->numel * es));
      if (bias) {
        if (j.dt == KILN_F32) add_bias_f32((const float *)j.bias, 0, g->N, g->C, g->H * g->W, (float *)j.gx);
        else add_bias_f64((const double *)j.bias, 0, g->N, g->C, g->H * g->W, (double *)j.gx);
      }
    } else if (j.bias || g->N == 0) {   /* conv_transpose2d's forward (a bias on gx): im2col alone */
      if ((rc = backward_im2col(&j))) goto done;
    } else {
      struct kiln_conv_job cj;
      conv_job(&cj, g, j.dt, j.x, j.w);
      cj.gy = j.gy; cj.gx = j.gx; cj.partials = j.partials; cj.im2col = backward_im2col; cj.ctx = &j;
      /* oneDNN's sum straight there (it sums only f32: bf16 went to cpu/bf16_conv.c, f64 it does not take) */
      cj.gw = partials ? kiln_tensor_data(out->gw) : NULL;
      if ((rc = kiln_cpu_conv_run(&cj))) goto done;
      cj_summed = cj.partials_summed;
    }
  }
  if (partials && !cj_summed) {
    struct sum_job s = {g, j.dt, partials, kiln_tensor_data(out->gw), g->O * g->K};
    kiln_parallel_for(s.n, 16384, sum_partials, &s);
  }
  if (out->gb) {
    struct bias_job b = {g, j.dt, j.gy, kiln_tensor_data(out->gb)};
    kiln_parallel_for(g->O, 8, sum_bias, &b);
  }
done:
  free(partials);
  kiln_tensor_release(gy); kiln_tensor_release(x); kiln_tensor_release(w); kiln_tensor_release(bias);
  return rc;
}

/* ---- conv2d, relu and 2x2 max pooling as one call ----
   The three ops of a LeNet layer, where oneDNN convolves: its forward leaves each part's output in
   its blocked layout (nChw16c: sixteen channels a vector, cpu/onednn.c), the epilogue takes the
   relu and the 2x2 stride-2 max from there while the part is in cache, and backward the prologue
   writes each part's output grad in that layout for oneDNN's passes (cpu/blocked_pool.h, shared
   with bf16). No activation of the layer is ever in NCHW but the pooled one, and every result has
   the bits of conv2d -> relu -> max_pool2d. Taken at the avx512 level only (sixteen-channel
   blocks), where the three ops would convolve on oneDNN in that layout; elsewhere the front end
   runs them. */
#include "blocked_pool.h"
#if defined(__AVX512BW__)
static void pool_epilogue(void *ctx, int64_t n0, int64_t nb, const void *blocked) {
  kiln_blocked_pool_epilogue(0, ctx, n0, nb, blocked);
}
static void pool_prologue(void *ctx, int64_t n0, int64_t nb, void *blocked) {
  kiln_blocked_pool_prologue(0, ctx, n0, nb, blocked);
}
#endif

int cpu_conv2d_relu_pool(const struct kiln_call *c) {
  struct kiln_conv_pool *cp = (struct kiln_conv_pool *)c->extra;
  if (c->in[0]->dtype == KILN_BF16) return cpu_conv2d_relu_pool_bf16(c);   /* cpu/bf16_conv.c */
  cp->taken = 0;
#if defined(__AVX512BW__)
  struct kiln_tensor *y = c->out;
  /* planes of even width (max_pool2d's vector case: the same pick) */
  if (c->in[0]->dtype != KILN_F32 || y->numel == 0 || (c->ints[KILN_CONV_INTS + 1] & 1)) return KILN_OK;
  struct kiln_tensor *x = dense(c->in[0]), *w = dense(c->in[1]), *b = c->in[2] ? dense(c->in[2]) : NULL;
  int rc = KILN_OK;
  if (!x || !w || (c->in[2] && !b)) { rc = kiln_error_code(); goto done; }
  struct geom g;
  geom_init(&g, c->ints, x->sizes[0], x->sizes[1], x->sizes[2], x->sizes[3], w, y->sizes[1], c->ints[KILN_CONV_INTS],
            c->ints[KILN_CONV_INTS + 1], 4);
  struct kiln_pool_fuse f = {.O = g.O, .OH = g.OH, .OW = g.OW, .PH = y->sizes[2], .PW = y->sizes[3], .y = kiln_tensor_data(y)};
  struct kiln_conv_job cj;
  conv_job(&cj, &g, KILN_F32, kiln_tensor_data(x), kiln_tensor_data(w));
  if (kiln_cpu_conv_fused_way(&cj, cp->input_grad) != 0) goto done;   /* the three ops would not run oneDNN */
  int64_t ncodes = g.N * (g.O + 15) / 16 * 16 * f.PH * f.PW;
  if (!(cp->codes = kiln_tensor_empty(1, &ncodes, KILN_U8, y->device))) { rc = kiln_error_code(); goto done; }
  f.codes = kiln_tensor_data(cp->codes);
  cj.bias = b ? kiln_tensor_data(b) : NULL; cj.epilogue = pool_epilogue; cj.ctx = &f;
  rc = kiln_cpu_conv_run(&cj);
  if (rc == 1) rc = KILN_OK;   /* not taken */
  else if (rc == KILN_OK) cp->taken = 1;
  if (!cp->taken) { kiln_tensor_release(cp->codes); cp->codes = NULL; }
done:
  kiln_tensor_release(x); kiln_tensor_release(w); kiln_tensor_release(b);
  return rc;
#else
  return KILN_OK;   /* not taken below avx512 */
#endif
}

#if defined(__AVX512BW__)
/* gb[o] = the sum of the prologue's lanes [N, O, 8] of channel o, each image's in order, in double */
struct lanes_job { const float *lanes; float *gb; int64_t N, O; };
static void sum_lanes(void *ctx, int64_t begin, int64_t end) {
  const struct lanes_job *j = ctx;
  for (int64_t o = begin; o < end; o++) {
    double s = 0;
    for (int64_t n = 0; n < j->N; n++)
      for (int l = 0; l < 8; l++) s += j->lanes[(n * j->O + o) * 8 + l];
    j->gb[o] = (float)s;
  }
}
#endif

int cpu_conv2d_relu_pool_backward(const struct kiln_call *c) {
  if (c->in[0]->dtype == KILN_BF16) return cpu_conv2d_relu_pool_backward_bf16(c);   /* cpu/bf16_conv.c */
#if defined(__AVX512BW__)
  const struct kiln_conv_grads *out = c->extra;
  struct kiln_tensor *gp = dense(c->in[0]), *x = c->in[1] ? dense(c->in[1]) : NULL, *w = dense(c->in[2]);
  const struct kiln_tensor *codes = c->in[3];
  char *partials = NULL;
  float *lanes = NULL;
  int rc = KILN_OK;
  if (!gp || !w || (c->in[1] && !x)) { rc = kiln_error_code(); goto done; }
  struct geom gg;
  geom_init(&gg, c->ints, gp->sizes[0], w->sizes[1] * c->ints[6], out->gx ? out->gx->sizes[2] : x->sizes[2],
            out->gx ? out->gx->sizes[3] : x->sizes[3], w, gp->sizes[1], c->ints[KILN_CONV_INTS], c->ints[KILN_CONV_INTS + 1], 4);
  const struct geom *g = &gg;
  struct kiln_pool_fuse f = {.O = g->O, .OH = g->OH, .OW = g->OW, .PH = gp->sizes[2], .PW = gp->sizes[3],
                             .gp = kiln_tensor_data(gp), .codes = kiln_tensor_data(codes)};
  if (out->gw && !(partials = malloc((size_t)(g->parts * g->O * g->K) * 4 + 64))) {
    rc = kiln_fail(KILN_ERR_MEMORY, "conv2d_relu_max_pool2d backward: out of memory for the grad-weight partials");
    goto done;
  }
  if (out->gb && !(f.lanes = lanes = malloc(sizeof(float) * (size_t)(g->N * g->O * 8)))) {
    rc = kiln_fail(KILN_ERR_MEMORY, "conv2d_relu_max_pool2d backward: out of memory for the bias grad");
    goto done;
  }
  struct kiln_conv_job cj;
  conv_job(&cj, g, KILN_F32, x ? kiln_tensor_data(x) : NULL, kiln_tensor_data(w));
  cj.gx = out->gx ? kiln_tensor_data(out->gx) : NULL; cj.partials = partials;
  cj.prologue = pool_prologue; cj.ctx = &f;
  cj.gw = partials ? kiln_tensor_data(out->gw) : NULL;   /* oneDNN's sum straight there */
  if (!cj.gx && !partials && lanes) {   /* the bias alone: the grad weight's pass runs the prologue, its sum unused */
    if (!(cj.partials = malloc((size_t)(g->parts * g->O * g->K) * 4 + 64))) {
      rc = kiln_fail(KILN_ERR_MEMORY, "conv2d_relu_max_pool2d backward: out of memory for the grad-weight partials");
      goto done;
    }
  }
  if (cj.gx || cj.partials) {
    rc = kiln_cpu_conv_run(&cj);
    if (cj.partials != partials) free(cj.partials);
    if (rc == 1)
      rc = kiln_fail(KILN_ERR_UNSUPPORTED, "conv2d_relu_max_pool2d backward: oneDNN no longer takes the shape of its forward");
    if (rc) goto done;
  }
  if (partials && !cj.partials_summed) {
    struct sum_job s = {g, KILN_F32, partials, kiln_tensor_data(out->gw), g->O * g->K};
    kiln_parallel_for(s.n, 16384, sum_partials, &s);
  }
  if (lanes) {   /* as sum_bias: each image's lanes in order, in double */
    struct lanes_job lj = {lanes, kiln_tensor_data(out->gb), g->N, g->O};
    kiln_parallel_for(g->O, 8, sum_lanes, &lj);
  }
done:
  free(partials);
  free(lanes);
  kiln_tensor_release(gp); kiln_tensor_release(x); kiln_tensor_release(w);
  return rc;
#else
  (void)c;
  return kiln_fail(KILN_ERR_UNSUPPORTED, "conv2d_relu_max_pool2d backward: no fused kernel at this instruction-set level");
#endif
}
