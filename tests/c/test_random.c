/* test_random.c: the Philox generator: reproducibility from (seed, offset), independence from the
   thread count, the offset bookkeeping, and the shape of the distributions. */
#include "check.h"

enum { BIG = 1000003 };

static struct kiln_tensor *empty1(int64_t n, int dtype) { return kiln_tensor_empty(1, &n, dtype, CPU); }

static int same_bits(const struct kiln_tensor *a, const struct kiln_tensor *b) {
  if (!a || !b || a->numel != b->numel || a->dtype != b->dtype) return 0;
  size_t bytes = (size_t)a->numel * (size_t)kiln_dtype_size(a->dtype);
  return memcmp((const char *)a->storage->data + a->offset * kiln_dtype_size(a->dtype),
                (const char *)b->storage->data + b->offset * kiln_dtype_size(b->dtype), bytes) == 0;
}

/* Fill t with op at generator state (seed, offset). */
static int fill(int op, struct kiln_tensor *t, uint64_t seed, uint64_t offset) {
  kiln_random_set_state(seed, offset);
  switch (op) {
  case KILN_OP_UNIFORM: return kiln_uniform_(t, -1, 3);
  case KILN_OP_NORMAL: return kiln_normal_(t, 0.5, 2);
  default: return kiln_randint_(t, -1000, 1000);
  }
}

static void test_reproducible(void) {
  kiln_manual_seed(42);
  CHECK(kiln_initial_seed() == 42 && kiln_random_offset() == 0);
  struct kiln_tensor *a = empty1(1000, KILN_F32), *b = empty1(1000, KILN_F32);
  CHECK(kiln_uniform_(a, 0, 1) == 0);
  CHECK(kiln_random_offset() == 1000);
  kiln_manual_seed(42);
  CHECK(kiln_uniform_(b, 0, 1) == 0);
  CHECK(same_bits(a, b));
  kiln_manual_seed(43);
  CHECK(kiln_uniform_(b, 0, 1) == 0);
  CHECK(!same_bits(a, b));
  /* the next draw continues the sequence: it differs from the first */
  kiln_manual_seed(42);
  CHECK(kiln_uniform_(b, 0, 1) == 0 && kiln_uniform_(b, 0, 1) == 0);
  CHECK(!same_bits(a, b));
  CHECK(kiln_random_offset() == 2000);

  /* element i depends only on (seed, offset + i): one draw of 15 is a draw of 10 then one of 5 */
  struct kiln_tensor *whole = empty1(15, KILN_F64), *first = empty1(10, KILN_F64), *second = empty1(5, KILN_F64);
  kiln_random_set_state(7, 100);
  CHECK(kiln_normal_(whole, 0, 1) == 0);
  CHECK(kiln_random_offset() == 115 && kiln_initial_seed() == 7);
  kiln_random_set_state(7, 100);
  CHECK(kiln_normal_(first, 0, 1) == 0 && kiln_normal_(second, 0, 1) == 0);
  struct kiln_tensor *w1 = kiln_narrow(whole, 0, 0, 10), *w2 = kiln_narrow(whole, 0, 10, 5);
  CHECK(same_bits(w1, first) && same_bits(w2, second));
  kiln_tensor_release(w1); kiln_tensor_release(w2);

  /* set_state restores a sequence */
  kiln_manual_seed(1234);
  struct kiln_tensor *x = empty1(64, KILN_F32), *y = empty1(64, KILN_I64);
  CHECK(kiln_uniform_(x, 0, 1) == 0);
  uint64_t seed = kiln_initial_seed(), off = kiln_random_offset();
  struct kiln_tensor *p1 = empty1(64, KILN_F32), *p2 = empty1(64, KILN_I64), *q1 = empty1(64, KILN_F32), *q2 = empty1(64, KILN_I64);
  CHECK(kiln_normal_(p1, 0, 1) == 0 && kiln_randint_(p2, 0, 100) == 0);
  kiln_uniform_(x, 0, 1);   /* anything in between */
  kiln_randint_(y, 5, 9);
  kiln_random_set_state(seed, off);
  CHECK(kiln_random_offset() == off);
  CHECK(kiln_normal_(q1, 0, 1) == 0 && kiln_randint_(q2, 0, 100) == 0);
  CHECK(same_bits(p1, q1) && same_bits(p2, q2));

  /* offsets advance by numel, whatever the op and dtype; a failed call does not advance */
  kiln_manual_seed(5);
  struct kiln_tensor *m = kiln_tensor_empty(3, (int64_t[]){3, 5, 7}, KILN_BF16, CPU);
  CHECK(kiln_uniform_(m, 0, 1) == 0 && kiln_random_offset() == 105);
  CHECK(kiln_normal_(m, 0, 1) == 0 && kiln_random_offset() == 210);
  CHECK(kiln_randint_(m, 0, 3) == 0 && kiln_random_offset() == 315);
  CHECK_ERR(kiln_uniform_(y, 0, 1), "expected a float dtype");
  CHECK_ERR(kiln_uniform_(m, 1, 0), "uniform: range [1, 0)");
  CHECK_ERR(kiln_uniform_(m, 0, INFINITY), "not finite");
  CHECK_ERR(kiln_normal_(m, 0, -1), "std must be >= 0");
  CHECK_ERR(kiln_randint_(y, 3, 3), "empty");
  struct kiln_tensor *bo = empty1(10, KILN_BOOL);
  CHECK_ERR(kiln_randint_(bo, 0, 3), "does not fit bool");
  CHECK(kiln_random_offset() == 315);
  kiln_tensor_release(bo);

  /* a non-contiguous target gets the draw in its own row-major order */
  struct kiln_tensor *base = kiln_tensor_empty(2, (int64_t[]){3, 4}, KILN_F32, CPU), *tv = kiln_transpose(base, 0, 1);
  struct kiln_tensor *ref = kiln_tensor_empty(2, (int64_t[]){4, 3}, KILN_F32, CPU);
  kiln_random_set_state(99, 0);
  CHECK(kiln_uniform_(tv, 0, 1) == 0);
  CHECK(kiln_random_offset() == 12);
  kiln_random_set_state(99, 0);
  CHECK(kiln_uniform_(ref, 0, 1) == 0);
  double *vt = V(tv), *vr = V(ref);
  CHECK_ARRAY_NEAR(vt, vr, 12, 0);
  free(vt); free(vr);
  kiln_tensor_release(ref); kiln_tensor_release(tv); kiln_tensor_release(base);

  kiln_tensor_release(m); kiln_tensor_release(p1); kiln_tensor_release(p2); kiln_tensor_release(q1); kiln_tensor_release(q2);
  kiln_tensor_release(x); kiln_tensor_release(y);
  kiln_tensor_release(whole); kiln_tensor_release(first); kiln_tensor_release(second);
  kiln_tensor_release(a); kiln_tensor_release(b);
}

/* Known answers: Philox4x32-10 of counter 0 under key 0 is {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}
   (the first test vector of Random123, Salmon et al.). randint reads words 0 and 1 as one 64-bit
   number, uniform f32 the top 24 bits of word 0. */
static void test_known_answers(void) {
  struct kiln_tensor *t = empty1(1, KILN_I64);
  kiln_random_set_state(0, 0);
  CHECK(kiln_randint_(t, 0, (int64_t)1 << 62) == 0);
  int64_t got = ((int64_t *)t->storage->data)[0];
  check_report(got == (int64_t)0x2627e8d5e169c58dll, __FILE__, __LINE__, "randint at (0, 0): 0x%016llx, expected 0x2627e8d5e169c58d",
               (unsigned long long)got);
  kiln_tensor_release(t);
  t = empty1(1, KILN_F32);
  kiln_random_set_state(0, 0);
  CHECK(kiln_uniform_(t, 0, 1) == 0);
  CHECK(((float *)t->storage->data)[0] == (float)(0x6627e8 * 0x1p-24));
  kiln_tensor_release(t);
}

/* A large fill is bitwise the same with 1, 2 and 3 threads. */
static void test_thread_independence(void) {
  static const struct { int op, dtype; } cases[] = {
    {KILN_OP_UNIFORM, KILN_F32}, {KILN_OP_NORMAL, KILN_F32}, {KILN_OP_RANDINT, KILN_I64}, {KILN_OP_UNIFORM, KILN_F64},
    {KILN_OP_NORMAL, KILN_BF16}, {KILN_OP_RANDINT, KILN_I32},
  };
  int saved = kiln_get_num_threads();
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    struct kiln_tensor *ref = empty1(BIG, cases[c].dtype);
    CHECK(kiln_set_num_threads(1) == 0);
    CHECK(fill(cases[c].op, ref, 2024, 17) == 0);
    CHECK(kiln_random_offset() == 17 + BIG);
    for (int nt = 2; nt <= 3; nt++) {
      struct kiln_tensor *t = empty1(BIG, cases[c].dtype);
      CHECK(kiln_set_num_threads(nt) == 0 && kiln_get_num_threads() == nt);
      CHECK(fill(cases[c].op, t, 2024, 17) == 0);
      check_report(same_bits(ref, t), __FILE__, __LINE__, "%s %s with %d threads differs from 1 thread",
                   kiln_op_name(cases[c].op), kiln_dtype_name(cases[c].dtype), nt);
      kiln_tensor_release(t);
    }
    kiln_tensor_release(ref);
  }
  kiln_set_num_threads(saved);
}

static double mean_of(const double *v, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += v[i];
  return s / (double)n;
}

static void test_distributions(void) {
  kiln_manual_seed(31337);
  /* uniform [0, 1): mean 1/2 within 5 sigma, variance 1/12, ten equal buckets */
  struct kiln_tensor *u = empty1(BIG, KILN_F64);
  CHECK(kiln_uniform_(u, 0, 1) == 0);
  double *v = V(u);
  double lo = 1, hi = 0, m = mean_of(v, BIG), var = 0;
  int64_t buckets[10] = {0};
  for (int64_t i = 0; i < BIG; i++) {
    lo = fmin(lo, v[i]); hi = fmax(hi, v[i]);
    var += (v[i] - m) * (v[i] - m);
    int k = (int)(v[i] * 10);
    buckets[k < 0 ? 0 : k > 9 ? 9 : k]++;
  }
  var /= BIG;
  CHECK(lo >= 0 && hi < 1);
  CHECK_NEAR(m, 0.5, 5 * sqrt(1.0 / 12 / BIG));
  CHECK_NEAR(var, 1.0 / 12, 5 * sqrt(1.0 / 180 / BIG));   /* Var of (U - 1/2)^2 is 1/80 - 1/144 = 1/180 */
  int bad = 0;
  for (int k = 0; k < 10; k++) bad += fabs((double)buckets[k] - BIG / 10.0) > 5 * sqrt(BIG * 0.1 * 0.9);
  CHECK(bad == 0);
  free(v); kiln_tensor_release(u);

  /* uniform [lo, hi) never reaches hi, in every float dtype (rounding to the dtype included) */
  static const int fdts[4] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};
  for (int d = 0; d < 4; d++) {
    struct kiln_tensor *t = empty1(200003, fdts[d]);
    CHECK(kiln_uniform_(t, -2, 3) == 0);
    double *tv = V(t), tlo = INFINITY, thi = -INFINITY;
    for (int64_t i = 0; i < t->numel; i++) { tlo = fmin(tlo, tv[i]); thi = fmax(thi, tv[i]); }
    check_report(tlo >= -2 && thi < 3, __FILE__, __LINE__, "uniform_(%s, -2, 3): values in [%g, %g]", kiln_dtype_name(fdts[d]), tlo, thi);
    CHECK_NEAR(mean_of(tv, t->numel), 0.5, 5 * 5 * sqrt(1.0 / 12 / 200003) + (fdts[d] == KILN_BF16 ? 0.01 : 0.001));
    CHECK(kiln_uniform_(t, 0, 1) == 0);
    free(tv);
    tv = V(t);
    tlo = INFINITY; thi = -INFINITY;
    for (int64_t i = 0; i < t->numel; i++) { tlo = fmin(tlo, tv[i]); thi = fmax(thi, tv[i]); }
    check_report(tlo >= 0 && thi < 1, __FILE__, __LINE__, "uniform_(%s, 0, 1): values in [%g, %g]", kiln_dtype_name(fdts[d]), tlo, thi);
    free(tv);
    kiln_tensor_release(t);
  }
  /* lo == hi: every value is lo */
  struct kiln_tensor *c = empty1(100, KILN_F32);
  CHECK(kiln_uniform_(c, 2.5, 2.5) == 0);
  v = V(c);
  double twos[100];
  for (int i = 0; i < 100; i++) twos[i] = 2.5;
  CHECK_ARRAY_NEAR(v, twos, 100, 0);
  free(v);
  CHECK(kiln_normal_(c, 2.5, 0) == 0);   /* std 0: every value is the mean */
  v = V(c);
  CHECK_ARRAY_NEAR(v, twos, 100, 0);
  free(v);
  kiln_tensor_release(c);

  /* normal: mean, std, and the share within one sigma (0.6827) */
  struct kiln_tensor *n = empty1(BIG, KILN_F32);
  CHECK(kiln_normal_(n, 0, 1) == 0);
  v = V(n);
  m = mean_of(v, BIG);
  double q = 0, inside = 0, mx = 0;
  for (int64_t i = 0; i < BIG; i++) {
    q += (v[i] - m) * (v[i] - m);
    inside += fabs(v[i]) < 1;
    mx = fmax(mx, fabs(v[i]));
  }
  double sd = sqrt(q / (BIG - 1));
  CHECK_NEAR(m, 0, 5 / sqrt(BIG));
  CHECK_NEAR(sd, 1, 5 / sqrt(2.0 * BIG));
  CHECK_NEAR(inside / BIG, 0.682689492, 5 * sqrt(0.6827 * 0.3173 / BIG));
  CHECK(mx > 4 && mx < 7 && isfinite(mx));
  free(v);
  CHECK(kiln_normal_(n, 3, 2) == 0);
  v = V(n);
  m = mean_of(v, BIG);
  q = 0;
  for (int64_t i = 0; i < BIG; i++) q += (v[i] - m) * (v[i] - m);
  CHECK_NEAR(m, 3, 5 * 2 / sqrt(BIG));
  CHECK_NEAR(sqrt(q / (BIG - 1)), 2, 5 * 2 / sqrt(2.0 * BIG));
  free(v); kiln_tensor_release(n);

  /* randint [lo, hi): every value in range and every value hit, about equally often */
  static const struct { int dtype; int64_t lo, hi; } ri[] = {
    {KILN_I64, -3, 4}, {KILN_I32, 100, 117}, {KILN_U8, 0, 256}, {KILN_BOOL, 0, 2}, {KILN_F32, -5, 5}, {KILN_I64, 0, 1},
  };
  for (size_t k = 0; k < sizeof ri / sizeof ri[0]; k++) {
    int64_t N = 100003, range = ri[k].hi - ri[k].lo;
    struct kiln_tensor *t = empty1(N, ri[k].dtype);
    CHECK(kiln_randint_(t, ri[k].lo, ri[k].hi) == 0);
    double *tv = V(t);
    int64_t *count = calloc((size_t)range, sizeof *count);
    int out = 0, frac = 0;
    for (int64_t i = 0; i < N; i++) {
      if (tv[i] != floor(tv[i])) frac++;
      if (tv[i] < (double)ri[k].lo || tv[i] >= (double)ri[k].hi) out++;
      else count[(int64_t)tv[i] - ri[k].lo]++;
    }
    int missing = 0, skewed = 0;
    double expect = (double)N / (double)range, sig = sqrt(expect * (1 - 1.0 / (double)range));
    for (int64_t j = 0; j < range; j++) {
      missing += count[j] == 0;
      skewed += fabs((double)count[j] - expect) > 5 * sig + 1e-9;
    }
    check_report(out == 0 && frac == 0 && missing == 0 && skewed == 0, __FILE__, __LINE__,
                 "randint_(%s, %lld, %lld): %d out of range, %d not integers, %d values never drawn, %d counts off",
                 kiln_dtype_name(ri[k].dtype), (long long)ri[k].lo, (long long)ri[k].hi, out, frac, missing, skewed);
    free(count); free(tv);
    kiln_tensor_release(t);
  }
  /* a 64-bit range works too */
  struct kiln_tensor *w = empty1(1000, KILN_I64);
  CHECK(kiln_randint_(w, -((int64_t)1 << 40), (int64_t)1 << 40) == 0);
  v = V(w);
  int in = 1, neg = 0;
  for (int i = 0; i < 1000; i++) { in &= v[i] >= -0x1p40 && v[i] < 0x1p40; neg += v[i] < 0; }
  CHECK(in && neg > 400 && neg < 600);
  free(v); kiln_tensor_release(w);

  /* bounds beyond 2^53 are exact, up to the whole i64 range */
  static const struct { int64_t lo, hi; } wide[] = {
    {INT64_MIN, INT64_MAX}, {INT64_MAX - 3, INT64_MAX}, {INT64_MIN, INT64_MIN + 2}, {((int64_t)1 << 53), ((int64_t)1 << 53) + 3},
  };
  for (size_t k = 0; k < sizeof wide / sizeof wide[0]; k++) {
    w = empty1(4000, KILN_I64);
    int rc = kiln_randint_(w, wide[k].lo, wide[k].hi);
    const int64_t *iv = w->storage->data;
    uint64_t range = (uint64_t)wide[k].hi - (uint64_t)wide[k].lo;   /* unsigned: no overflow */
    int out = 0, pos = 0, hits[3] = {0};
    for (int i = 0; i < 4000; i++) {
      out += iv[i] < wide[k].lo || iv[i] >= wide[k].hi;
      pos += iv[i] > 0;
      if (range <= 3 && iv[i] >= wide[k].lo && iv[i] < wide[k].hi) hits[(uint64_t)iv[i] - (uint64_t)wide[k].lo]++;
    }
    int all_hit = k == 0 ? pos > 1800 && pos < 2200 : hits[0] > 0 && hits[1] > 0 && (range < 3 || hits[2] > 0);
    check_report(rc == 0 && out == 0 && all_hit, __FILE__, __LINE__, "randint_(i64, %lld, %lld): rc %d, %d out of range, hits %d %d %d, %d positive",
                 (long long)wide[k].lo, (long long)wide[k].hi, rc, out, hits[0], hits[1], hits[2], pos);
    kiln_tensor_release(w);
  }

  /* empty tensors: nothing drawn, the offset unchanged */
  uint64_t off = kiln_random_offset();
  struct kiln_tensor *e = empty1(0, KILN_F32);
  CHECK(kiln_uniform_(e, 0, 1) == 0 && kiln_normal_(e, 0, 1) == 0);
  CHECK(kiln_random_offset() == off);
  kiln_tensor_release(e);
}

int main(void) {
  struct kiln_memory_stats *ms = kiln_memory_stats(KILN_CPU);
  int64_t live0 = ms->live_bytes;
  test_reproducible();
  test_known_answers();
  test_thread_independence();
  test_distributions();
  CHECK(ms->live_bytes == live0);
  return check_done("test_random");
}
