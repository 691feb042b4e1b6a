/* cuda/reduce.cuh: what a reduction does to one element and to two partial results, as
   __host__ __device__ functions with the semantics of cpu/reduce.c (floats accumulate in double;
   integer sums and products wrap; the first NaN, else the first extremum, wins in max, min,
   argmax and argmin; var and std merge (count, mean, M2) as Chan et al.; logsumexp keeps a running
   maximum). reduce.cu's kernels call them; tests/c/test_cuda_kernels.cu plays the kernels'
   order of operations with them on the CPU against libkiln's kernel. */
#ifndef KILN_CUDA_REDUCE_CUH
#define KILN_CUDA_REDUCE_CUH
#include "elements.cuh"

namespace kiln_red {
using namespace kiln_el;

struct acc {
  double s, m, q;   /* sum, product, extremum or norm sum; mean or running max; M2 */
  int64_t n, idx;   /* elements seen; index of the extremum within the row */
  int64_t is;       /* integer sum, product or extremum */
};

KILN_EL bool is_max(int op) { return op == KILN_OP_MAX || op == KILN_OP_ARGMAX; }
KILN_EL bool is_extremum(int op) {
  return op == KILN_OP_MAX || op == KILN_OP_ARGMAX || op == KILN_OP_MIN || op == KILN_OP_ARGMIN;
}
KILN_EL bool isinf_(double p) { return p == INFINITY || p == -INFINITY; }

KILN_EL acc acc_init(int op) {
  acc a;
  a.s = op == KILN_OP_PROD ? 1 : 0;
  a.m = op == KILN_OP_LOGSUMEXP ? -INFINITY : 0;
  a.q = 0;
  a.n = 0;
  a.idx = 0;
  a.is = op == KILN_OP_PROD ? 1 : 0;
  return a;
}

/* Element i (its index within the row) of value v, on the float path. */
KILN_EL void acc_push(int op, acc *a, double v, int64_t i, double p) {
  switch (op) {
  case KILN_OP_SUM: case KILN_OP_MEAN: a->s += v; break;
  case KILN_OP_PROD: a->s *= v; break;
  case KILN_OP_MAX: case KILN_OP_ARGMAX: case KILN_OP_MIN: case KILN_OP_ARGMIN:
    /* Within one thread indices only grow: keep the first NaN, else the first extremum. */
    if (a->n == 0 || (a->s == a->s && (v != v || (is_max(op) ? v > a->s : v < a->s)))) { a->s = v; a->idx = i; }
    break;
  case KILN_OP_VAR: case KILN_OP_STD: {   /* Welford */
    double d = v - a->m;
    a->m += d / (double)(a->n + 1);
    a->q += d * (v - a->m);
    break;
  }
  case KILN_OP_NORM:
    if (p == 2) a->s += v * v;
    else if (p == 1) a->s += fabs(v);
    else if (p == INFINITY) { double w = fabs(v); if (w > a->s || w != w) a->s = w; }
    else if (isinf_(p)) { double w = fabs(v); if (a->n == 0 || (a->s == a->s && (w < a->s || w != w))) a->s = w; }
    else if (p == 0) a->s += v != 0;
    else a->s += pow(fabs(v), p);
    break;
  case KILN_OP_LOGSUMEXP:   /* s is the sum of exp(x - m) over the elements seen */
    if (v != v) a->m = v;
    else if (v > a->m) { a->s = (a->m == -INFINITY ? 0 : a->s * exp(a->m - v)) + 1; a->m = v; }
    else if (a->m > -INFINITY && a->m < INFINITY) a->s += exp(v - a->m);
    break;
  }
  a->n++;
}

/* The same on the exact integer path (i64 rows). */
KILN_EL void acc_push_int(int op, acc *a, int64_t v, int64_t i) {
  switch (op) {
  case KILN_OP_SUM: a->is = (int64_t)((uint64_t)a->is + (uint64_t)v); break;
  case KILN_OP_PROD: a->is = (int64_t)((uint64_t)a->is * (uint64_t)v); break;
  default:
    if (a->n == 0 || (is_max(op) ? v > a->is : v < a->is)) { a->is = v; a->idx = i; }
  }
  a->n++;
}

/* Fold b into a. Their elements may interleave (a block's threads stride over a chunk), so
   extremum ties go to the smaller index, which is the CPU's first-in-order rule. */
KILN_EL void acc_combine(int op, bool ints, acc *a, const acc *b, double p) {
  if (b->n == 0) return;
  if (a->n == 0) { *a = *b; return; }
  if (ints) {
    switch (op) {
    case KILN_OP_SUM: a->is = (int64_t)((uint64_t)a->is + (uint64_t)b->is); break;
    case KILN_OP_PROD: a->is = (int64_t)((uint64_t)a->is * (uint64_t)b->is); break;
    default:
      if ((is_max(op) ? b->is > a->is : b->is < a->is) || (b->is == a->is && b->idx < a->idx)) { a->is = b->is; a->idx = b->idx; }
    }
  } else {
    switch (op) {
    case KILN_OP_SUM: case KILN_OP_MEAN: a->s += b->s; break;
    case KILN_OP_PROD: a->s *= b->s; break;
    case KILN_OP_MAX: case KILN_OP_ARGMAX: case KILN_OP_MIN: case KILN_OP_ARGMIN: {
      bool an = a->s != a->s, bn = b->s != b->s, take;
      if (an || bn) take = bn && (!an || b->idx < a->idx);
      else take = (is_max(op) ? b->s > a->s : b->s < a->s) || (b->s == a->s && b->idx < a->idx);
      if (take) { a->s = b->s; a->idx = b->idx; }
      break;
    }
    case KILN_OP_VAR: case KILN_OP_STD: {
      double na = (double)a->n, nb = (double)b->n, d = b->m - a->m;
      a->q += b->q + d * d * na * nb / (na + nb);
      a->m += d * nb / (na + nb);
      break;
    }
    case KILN_OP_NORM:
      if (p == INFINITY) { if (a->s == a->s && (b->s > a->s || b->s != b->s)) a->s = b->s; }
      else if (isinf_(p)) { if (a->s == a->s && (b->s < a->s || b->s != b->s)) a->s = b->s; }
      else a->s += b->s;
      break;
    case KILN_OP_LOGSUMEXP: {
      double m = a->m > b->m || a->m != a->m ? a->m : b->m;
      if (m > -INFINITY && m < INFINITY) a->s = a->s * exp(a->m - m) + b->s * exp(b->m - m);
      a->m = m;
      break;
    }
    }
  }
  a->n += b->n;
}

/* The float path's result (cpu/reduce.c's finish). */
KILN_EL double acc_finish(int op, const acc *a, double p) {
  double n = (double)a->n;
  switch (op) {
  case KILN_OP_SUM: return a->n ? a->s : 0;
  case KILN_OP_MEAN: return a->s / n;
  case KILN_OP_VAR: return a->q / fmax(n - p, 0.0);
  case KILN_OP_STD: return sqrt(a->q / fmax(n - p, 0.0));
  case KILN_OP_NORM:
    if (p == 2) return sqrt(a->s);
    if (p == 1 || p == 0 || isinf_(p)) return a->s;
    return pow(a->s, 1.0 / p);
  case KILN_OP_LOGSUMEXP:
    if (a->n == 0) return -INFINITY;
    if (!(a->m > -INFINITY && a->m < INFINITY)) return a->m == a->m && a->m < 0 ? -INFINITY : a->m;
    return a->m + log(a->s);
  case KILN_OP_PROD: return a->n ? a->s : 1;
  default: return a->s;
  }
}

/* Row m's result into out (element m of a contiguous tensor of dtype od). */
KILN_EL void acc_store(int op, bool ints, const acc *a, double p, char *out, int od, int64_t m) {
  char *o = out + m * dtype_size(od);
  if (op == KILN_OP_ARGMAX || op == KILN_OP_ARGMIN) { *(int64_t *)o = a->idx; return; }
  if (ints) {
    int64_t v = a->n ? a->is : (op == KILN_OP_PROD ? 1 : 0);
    if (od == KILN_I64) *(int64_t *)o = v;
    else store_f64(o, od, (double)v);
    return;
  }
  store_f64(o, od, acc_finish(op, a, p));
}

/* The row dtype of a reduction (cpu_reduce's rdtype) and whether it takes the integer path. */
KILN_EL bool takes_ints(int op, int dtype) {
  return !(dtype == KILN_F32 || dtype == KILN_F64 || dtype == KILN_F16 || dtype == KILN_BF16) &&
         (op == KILN_OP_SUM || op == KILN_OP_PROD || is_extremum(op));
}
KILN_EL int row_dtype(int op, int dtype) {
  return takes_ints(op, dtype) ? KILN_I64 : dtype == KILN_F32 ? KILN_F32 : KILN_F64;
}

}  // namespace kiln_red

#endif
