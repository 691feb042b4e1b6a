/* cpu/ctc.c: connectionist temporal classification (Graves et al. 2006). The loss by the forward
   (alpha) recursion in log space, and its gradient w.r.t. the log-probabilities by the backward
   (beta) recursion, one sample per task of the thread pool. Arithmetic runs in double for f32 and
   f64; the forward variables are kept in the dtype of log_probs for the backward, as PyTorch does.

   The extended target l' puts a blank around every label: l'_s = blank for even s, l_{s/2} for odd
   s, s < E = 2L + 1. With y_t(c) = exp(log_probs[t,n,c]):
     alpha_t(s) = y_t(l'_s) (alpha_{t-1}(s) + alpha_{t-1}(s-1) + [l'_s != blank, l'_s != l'_{s-2}] alpha_{t-1}(s-2))
     beta_t(s)  = y_t(l'_s) (beta_{t+1}(s) + beta_{t+1}(s+1) + [l'_s != blank, l'_s != l'_{s+2}] beta_{t+1}(s+2))
     p = alpha_{T-1}(E-1) + alpha_{T-1}(E-2);  nll = -log p
   Both include y_t, so the paths through (t, s) weigh alpha_t(s) beta_t(s) / y_t(l'_s), and each of
   them holds log y_t(c) once where l'_s = c:
     d nll / d log_probs[t,n,c] = -exp(logsumexp_{s: l'_s = c}(log alpha_t(s) + log beta_t(s)) + nll - log_probs[t,n,c]).
   This is the derivative with log_probs as free values. PyTorch's kernel adds exp(log_probs), which
   sums to nothing through a log_softmax; kiln's gradient through a log_softmax is the same. */
#include "cpu.h"
#include "nn_calls.h"
#include <math.h>
#include <stdlib.h>

static inline double log_add(double a, double b) {
  if (a < b) { double t = a; a = b; b = t; }
  if (a == -INFINITY) return a;
  return a + log1p(exp(b - a));
}

struct ctc_job {
  int64_t T, N, C, S, W;        /* S: the longest target; W = 2S + 1 */
  int64_t blank;
  int reduction, zero_infinity, f32;
  const void *lp;               /* [T,N,C], contiguous */
  const int64_t *labels;        /* [N, 2 + S]: input length, target length, target */
  void *nll;                    /* [N] */
  void *alpha;                  /* [N,T,W] */
  const void *g;                /* backward: the loss's grad, [N] or 0-d */
  void *grad;                   /* backward: [T,N,C] */
  double *scratch;              /* backward: 2W + C per sample */
};

static inline double load(const void *p, int f32, int64_t i) {
  return f32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}
static inline void store(void *p, int f32, int64_t i, double v) {
  if (f32) ((float *)p)[i] = (float)v;
  else ((double *)p)[i] = v;
}

/* The class at position s of the extended target. */
static inline int64_t ext(const int64_t *l, int64_t blank, int64_t s) { return s & 1 ? l[s >> 1] : blank; }

static void ctc_forward_samples(void *ctx, int64_t begin, int64_t end) {
  const struct ctc_job *j = ctx;
  int64_t N = j->N, C = j->C, W = j->W, blank = j->blank;
  int f32 = j->f32;
  for (int64_t n = begin; n < end; n++) {
    const int64_t *row = j->labels + n * (2 + j->S), *l = row + 2;
    int64_t Tn = row[0], L = row[1], E = 2 * L + 1, base = n * j->T * W;
    double nll;
    if (Tn == 0) {
      nll = L == 0 ? 0 : INFINITY;
    } else {
      for (int64_t s = 0; s < E; s++)
        store(j->alpha, f32, base + s, s < 2 ? load(j->lp, f32, n * C + ext(l, blank, s)) : -INFINITY);
      for (int64_t t = 1; t < Tn; t++) {
        int64_t prev = base + (t - 1) * W, cur = base + t * W, lt = (t * N + n) * C;
        for (int64_t s = 0; s < E; s++) {
          int64_t c = ext(l, blank, s);
          double a = load(j->alpha, f32, prev + s);
          if (s >= 1) a = log_add(a, load(j->alpha, f32, prev + s - 1));
          if (s >= 2 && c != blank && c != ext(l, blank, s - 2)) a = log_add(a, load(j->alpha, f32, prev + s - 2));
          store(j->alpha, f32, cur + s, a == -INFINITY ? -INFINITY : a + load(j->lp, f32, lt + c));
        }
      }
      int64_t last = base + (Tn - 1) * W;
      double p = load(j->alpha, f32, last + E - 1);
      if (L > 0) p = log_add(p, load(j->alpha, f32, last + E - 2));
      nll = -p;
    }
    store(j->nll, f32, n, nll);
  }
}

static int float_dtype(const char *op, const struct kiln_tensor *t) {
  if (t->dtype == KILN_F32 || t->dtype == KILN_F64) return KILN_OK;
  return kiln_fail(KILN_ERR_DTYPE, "%s: %s tensors are not supported on cpu (f32 or f64; got %s)", op,
                   kiln_dtype_name(t->dtype), kiln_shape_string(t));
}

static void ctc_job_init(struct ctc_job *j, const struct kiln_tensor *lp, const struct kiln_tensor *labels, const int64_t *ints) {
  j->T = lp->sizes[0]; j->N = lp->sizes[1]; j->C = lp->sizes[2];
  j->S = labels->sizes[1] - 2; j->W = 2 * j->S + 1;
  j->blank = ints[0]; j->reduction = (int)ints[1]; j->zero_infinity = (int)ints[2];
  j->f32 = lp->dtype == KILN_F32;
  j->labels = kiln_tensor_data(labels);
}

int cpu_ctc_loss(const struct kiln_call *c) {
  const struct kiln_ctc_extra *ex = c->extra;
  if (float_dtype("ctc_loss", c->in[0])) return kiln_error_code();
  struct kiln_tensor *lp = kiln_cpu_contiguous(c->in[0]), *labels = kiln_cpu_contiguous(c->in[1]);
  int rc = KILN_OK;
  if (!lp || !labels) { rc = kiln_error_code(); goto done; }
  struct ctc_job j = {.lp = kiln_tensor_data(lp), .nll = kiln_tensor_data(ex->nll), .alpha = kiln_tensor_data(ex->log_alpha)};
  ctc_job_init(&j, lp, labels, c->ints);
  kiln_parallel_for(j.N, 1, ctc_forward_samples, &j);
  /* PyTorch: zero_infinity replaces +inf losses by 0; mean divides by the target length (at least 1) */
  double sum = 0;
  for (int64_t n = 0; n < j.N; n++) {
    double v = load(j.nll, j.f32, n);
    if (j.zero_infinity && v == INFINITY) v = 0;
    int64_t L = j.labels[n * (2 + j.S) + 1];
    if (j.reduction == KILN_REDUCTION_NONE) store(kiln_tensor_data(c->out), j.f32, n, v);
    else sum += j.reduction == KILN_REDUCTION_MEAN ? v / (double)(L > 1 ? L : 1) : v;
  }
  if (j.reduction != KILN_REDUCTION_NONE)
    kiln_store_f64(kiln_tensor_data(c->out), c->out->dtype, j.reduction == KILN_REDUCTION_MEAN ? sum / (double)j.N : sum);
done:
  kiln_tensor_release(lp); kiln_tensor_release(labels);
  return rc;
}

static void ctc_backward_samples(void *ctx, int64_t begin, int64_t end) {
  const struct ctc_job *j = ctx;
  int64_t T = j->T, N = j->N, C = j->C, W = j->W, blank = j->blank;
  int f32 = j->f32;
  for (int64_t n = begin; n < end; n++) {
    const int64_t *row = j->labels + n * (2 + j->S), *l = row + 2;
    int64_t Tn = row[0], L = row[1], E = 2 * L + 1, base = n * T * W;
    double nll = load(j->nll, f32, n);
    double gn = load(j->g, f32, j->reduction == KILN_REDUCTION_NONE ? n : 0);
    if (j->reduction == KILN_REDUCTION_MEAN) gn /= (double)N * (double)(L > 1 ? L : 1);
    int zero = Tn == 0 || (j->zero_infinity && nll == INFINITY);
    for (int64_t t = zero ? 0 : Tn; t < T; t++)
      for (int64_t c = 0; c < C; c++) store(j->grad, f32, (t * N + n) * C + c, 0);
    if (zero) continue;
    double *bcur = j->scratch + n * (2 * W + C), *bnext = bcur + W, *acc = bnext + W;
    for (int64_t t = Tn - 1; t >= 0; t--) {
      int64_t lt = (t * N + n) * C;
      if (t == Tn - 1) {
        for (int64_t s = 0; s < E; s++) bcur[s] = s >= E - 2 ? load(j->lp, f32, lt + ext(l, blank, s)) : -INFINITY;
      } else {
        double *tmp = bnext; bnext = bcur; bcur = tmp;
        for (int64_t s = 0; s < E; s++) {
          int64_t c = ext(l, blank, s);
          double b = bnext[s];
          if (s + 1 < E) b = log_add(b, bnext[s + 1]);
          if (s + 2 < E && c != blank && c != ext(l, blank, s + 2)) b = log_add(b, bnext[s + 2]);
          bcur[s] = b == -INFINITY ? -INFINITY : b + load(j->lp, f32, lt + c);
        }
      }
      for (int64_t c = 0; c < C; c++) acc[c] = -INFINITY;
      for (int64_t s = 0; s < E; s++) {
        int64_t c = ext(l, blank, s);
        acc[c] = log_add(acc[c], load(j->alpha, f32, base + t * W + s) + bcur[s]);
      }
      for (int64_t c = 0; c < C; c++) {
        double v = acc[c] == -INFINITY ? 0 : -exp(acc[c] + nll - load(j->lp, f32, lt + c)) * gn;
        store(j->grad, f32, lt + c, v);
      }
    }
  }
}

int cpu_ctc_loss_backward(const struct kiln_call *c) {
  if (float_dtype("ctc_loss_backward", c->out)) return kiln_error_code();
  struct kiln_tensor *g = kiln_cpu_contiguous(c->in[0]), *lp = kiln_cpu_contiguous(c->in[1]), *labels = kiln_cpu_contiguous(c->in[2]);
  struct kiln_tensor *nll = kiln_cpu_contiguous(c->in[3]), *alpha = kiln_cpu_contiguous(c->extra);
  struct ctc_job j = {0};
  int rc = KILN_OK;
  if (!g || !lp || !labels || !nll || !alpha) { rc = kiln_error_code(); goto done; }
  ctc_job_init(&j, lp, labels, c->ints);
  j.lp = kiln_tensor_data(lp); j.nll = kiln_tensor_data(nll); j.alpha = kiln_tensor_data(alpha);
  j.g = kiln_tensor_data(g); j.grad = kiln_tensor_data(c->out);
  j.scratch = malloc(sizeof(double) * (size_t)(j.N * (2 * j.W + j.C) + 1));
  if (!j.scratch) {
    rc = kiln_fail(KILN_ERR_MEMORY, "ctc_loss_backward: out of memory for the backward variables of log_probs %s",
                   kiln_shape_string(lp));
    goto done;
  }
  kiln_parallel_for(j.N, 1, ctc_backward_samples, &j);
done:
  free(j.scratch);
  kiln_tensor_release(g); kiln_tensor_release(lp); kiln_tensor_release(labels);
  kiln_tensor_release(nll); kiln_tensor_release(alpha);
  return rc;
}
