/* test_sgemm.c: f32 matrix products on kiln's own kernel (cpu/sgemm.c, forced with
   KILN_SGEMM=kiln; ctest runs it at the avx512 and avx2 levels, and at the baseline the BLAS runs
   them and the same checks hold) against a
   naive loop in double: shapes around the micro-kernel's 6 rows and 64-column panels, k past the
   2048-row block, a short k's panels packed all at once, every layout of the operands, C^T
   computed for a wide C, addmm's alpha and beta
   (beta 0 ignores NaN in C, alpha 0 NaN in A and B), and the same bits at 1 and 2 threads. */
#include "check.h"
#include "internal.h"

static uint64_t rng = 88172645463325252ull;
static float next_value(void) {   /* xorshift: values in [-1, 1) */
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2 - 1);
}

static struct kiln_tensor *filled(int64_t r, int64_t c) {
  struct kiln_tensor *t = kiln_tensor_empty(2, (int64_t[]){r, c}, KILN_F32, (struct kiln_device){KILN_CPU, 0});
  float *v = kiln_tensor_data(t);
  for (int64_t i = 0; i < r * c; i++) v[i] = next_value();
  return t;
}

/* op(A) [m, k] as stored: transposed means A is [k, m] and viewed transposed. */
static struct kiln_tensor *operand(int64_t r, int64_t c, int transposed, struct kiln_tensor **base) {
  *base = transposed ? filled(c, r) : filled(r, c);
  return transposed ? kiln_transpose(*base, 0, 1) : (kiln_tensor_retain(*base), *base);
}

static double at(const struct kiln_tensor *t, int64_t i, int64_t j) {
  return ((const float *)kiln_tensor_data(t))[i * t->strides[0] + j * t->strides[1]];
}

/* beta * c + alpha * (a @ b) against double, within k * 2^-22 of the sum of |terms| */
static void check_product(int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta) {
  struct kiln_tensor *ab, *bb;
  struct kiln_tensor *a = operand(m, k, ta, &ab), *b = operand(k, n, tb, &bb), *c0 = filled(m, n);
  if (beta == 0) {   /* NaN in C must not reach the result when beta is 0 */
    float *cv = kiln_tensor_data(c0);
    for (int64_t i = 0; i < m * n; i += 7) cv[i] = NAN;
  }
  struct kiln_tensor *c = alpha == 1 && beta == 0 ? kiln_matmul(a, b) : kiln_addmm(c0, a, b, beta, alpha);
  int ok = c != NULL;
  double worst = 0;
  for (int64_t i = 0; ok && i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; p++) { s += at(a, i, p) * at(b, p, j); mag += fabs(at(a, i, p) * at(b, p, j)); }
      double want = alpha * s + (beta != 0 ? beta * at(c0, i, j) : 0);
      double cterm = beta != 0 ? fabs(beta * at(c0, i, j)) : 0;
      double tol = (double)(k + 2) * 2.4e-7 * (fabs(alpha) * mag + cterm) + 1e-30;
      double got = at(c, i, j), err = fabs(got - want) / tol;
      if (!(err <= 1)) { ok = 0; worst = err; break; }
    }
  check_report(ok, __FILE__, __LINE__, "sgemm m=%lld n=%lld k=%lld ta=%d tb=%d alpha=%g beta=%g: %s (error %.3g of tol)",
               (long long)m, (long long)n, (long long)k, ta, tb, alpha, beta, c ? "wrong values" : kiln_error_message(), worst);
  kiln_tensor_release(c); kiln_tensor_release(c0);
  kiln_tensor_release(a); kiln_tensor_release(ab); kiln_tensor_release(b); kiln_tensor_release(bb);
}

static void test_shapes(void) {
  static const int64_t ms[] = {1, 5, 6, 7, 13, 64};
  static const int64_t ns[] = {16, 17, 31, 63, 64, 65, 130};
  static const int64_t ks[] = {1, 3, 8, 9, 100};
  for (size_t x = 0; x < sizeof ms / sizeof *ms; x++)
    for (size_t y = 0; y < sizeof ns / sizeof *ns; y++)
      for (size_t z = 0; z < sizeof ks / sizeof *ks; z++)
        for (int l = 0; l < 4; l++) check_product(ms[x], ns[y], ks[z], l & 1, l >> 1, 1, 0);
  /* A^T's rows packed first (8 panels of columns or more in one thread's part), and the k past a
     block of 2048 with it */
  int threads = kiln_get_num_threads();
  kiln_set_num_threads(1);
  for (int l = 0; l < 4; l++) check_product(50, 600, 300, l & 1, l >> 1, 1, 0);
  for (int l = 0; l < 2; l++) check_product(13, 520, 2048 + 37, 1, l, -0.5, 2);
  /* a short k (256 or less) over more than one panel: every panel packed first, C by rows of
     tiles; for C^T too (B transposed, 130 rows of C: three panels of C^T's columns); and k just
     past it */
  for (int l = 0; l < 4; l++) {
    check_product(130, 600, 256, l & 1, l >> 1, -0.5, 2);
    check_product(20, 200, 257, l & 1, l >> 1, 1, 0);
  }
  /* B read in place (not transposed, its rows exactly C's columns, a multiple of 16, at most 1 MB):
     a short k; a k past 256 (by rows of tiles all the same); the last panel one vector wide; and
     just over 1 MB, packed a block of k at a time */
  for (int l = 0; l < 2; l++) {
    check_product(130, 96, 256, l, 0, -0.5, 2);
    check_product(20, 192, 700, l, 0, 1, 0);
    check_product(13, 80, 1500, l, 0, 3, 0);
    check_product(9, 128, 2100, l, 0, 0.25, -1);
  }
  kiln_set_num_threads(threads);
  /* k past a block of 2048 rows: the second block is added to C */
  for (int l = 0; l < 4; l++) check_product(9, 70, 2048 + 37, l & 1, l >> 1, 1, 0);
  /* addmm: alpha and beta, in one block and across two */
  for (int l = 0; l < 4; l++) {
    check_product(11, 80, 40, l & 1, l >> 1, -0.5, 2);
    check_product(11, 80, 40, l & 1, l >> 1, 3, 0);
    check_product(7, 33, 2100, l & 1, l >> 1, 0.25, -1);
    /* C^T computed (B stored transposed, 16 times as many columns as rows) */
    check_product(3, 70, 40, l & 1, l >> 1, -0.5, 2);
    check_product(2, 40, 2100, l & 1, l >> 1, 0.25, -1);
  }
}

/* alpha 0: C = beta C, and NaN in A or B does not reach it (the BLAS reads neither) */
static void test_alpha_zero(void) {
  struct kiln_tensor *a = filled(9, 40), *b = filled(40, 70), *c = filled(9, 70);
  ((float *)kiln_tensor_data(a))[5] = NAN;
  ((float *)kiln_tensor_data(b))[77] = INFINITY;
  struct kiln_tensor *r = kiln_addmm(c, a, b, 0.5, 0);
  int ok = r != NULL;
  for (int64_t i = 0; ok && i < 9 * 70; i++)
    ok = ((float *)kiln_tensor_data(r))[i] == 0.5f * ((float *)kiln_tensor_data(c))[i];
  CHECK(ok);
  kiln_tensor_release(r); kiln_tensor_release(a); kiln_tensor_release(b); kiln_tensor_release(c);
}

/* The same bits at 1 and 2 threads on kiln's kernel (each element is one sum over k in order;
   the BLAS's split products need not be). */
static void test_threads(void) {
  if (strcmp(kiln_cpu_level(), "baseline") == 0) return;
  struct kiln_tensor *a = filled(300, 500), *b = filled(500, 260);
  struct kiln_tensor *bt0 = filled(260, 500), *bt = kiln_transpose(bt0, 0, 1);
  kiln_set_num_threads(1);
  struct kiln_tensor *c1 = kiln_matmul(a, b), *d1 = kiln_matmul(a, bt);
  kiln_set_num_threads(2);
  struct kiln_tensor *c2 = kiln_matmul(a, b), *d2 = kiln_matmul(a, bt);
  CHECK(c1 && c2 && memcmp(kiln_tensor_data(c1), kiln_tensor_data(c2), sizeof(float) * 300 * 260) == 0);
  CHECK(d1 && d2 && memcmp(kiln_tensor_data(d1), kiln_tensor_data(d2), sizeof(float) * 300 * 260) == 0);
  kiln_tensor_release(c1); kiln_tensor_release(c2); kiln_tensor_release(d1); kiln_tensor_release(d2);
  kiln_tensor_release(a); kiln_tensor_release(b); kiln_tensor_release(bt); kiln_tensor_release(bt0);
  /* B read in place at 1 thread; at 2, split by columns, each part packs its share: the same bits */
  struct kiln_tensor *e = filled(100, 500), *f = filled(500, 320);
  kiln_set_num_threads(1);
  struct kiln_tensor *g1 = kiln_matmul(e, f);
  kiln_set_num_threads(2);
  struct kiln_tensor *g2 = kiln_matmul(e, f);
  CHECK(g1 && g2 && memcmp(kiln_tensor_data(g1), kiln_tensor_data(g2), sizeof(float) * 100 * 320) == 0);
  kiln_tensor_release(g1); kiln_tensor_release(g2); kiln_tensor_release(e); kiln_tensor_release(f);
}

int main(void) {
  setenv("KILN_SGEMM", "kiln", 1);   /* read at the first f32 product */
  test_shapes();
  test_alpha_zero();
  test_threads();
  return check_done("test_sgemm");
}
