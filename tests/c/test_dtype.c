/* test_dtype.c: dtype sizes and names, type promotion, and the f16 / bf16 conversions
   against known bit patterns and an independent nearest-value search. */
#include "check.h"
#include <float.h>

static float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t bits_of_f32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static void test_names_and_sizes(void) {
  static const struct { int dtype, size, is_float; const char *name; } want[] = {
    {KILN_F32, 4, 1, "f32"}, {KILN_F64, 8, 1, "f64"}, {KILN_F16, 2, 1, "f16"}, {KILN_BF16, 2, 1, "bf16"},
    {KILN_I64, 8, 0, "i64"}, {KILN_I32, 4, 0, "i32"}, {KILN_U8, 1, 0, "u8"}, {KILN_BOOL, 1, 0, "bool"},
  };
  CHECK(sizeof want / sizeof want[0] == KILN_DTYPE_COUNT);
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    CHECK(kiln_dtype_size(want[i].dtype) == want[i].size);
    CHECK(strcmp(kiln_dtype_name(want[i].dtype), want[i].name) == 0);
    CHECK(kiln_dtype_is_float(want[i].dtype) == want[i].is_float);
    CHECK(kiln_dtype_from_name(want[i].name) == want[i].dtype);
  }
  CHECK(strcmp(kiln_dtype_name(-1), "?") == 0);
  CHECK(strcmp(kiln_dtype_name(KILN_DTYPE_COUNT), "?") == 0);
  CHECK(kiln_dtype_size(-1) == 0 && kiln_dtype_size(KILN_DTYPE_COUNT) == 0);
  static const struct { const char *name; int dtype; } aliases[] = {
    {"float32", KILN_F32}, {"float", KILN_F32}, {"float64", KILN_F64}, {"double", KILN_F64}, {"float16", KILN_F16},
    {"half", KILN_F16}, {"bfloat16", KILN_BF16}, {"int64", KILN_I64}, {"long", KILN_I64}, {"int32", KILN_I32},
    {"int", KILN_I32}, {"uint8", KILN_U8}, {"byte", KILN_U8},
  };
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) CHECK(kiln_dtype_from_name(aliases[i].name) == aliases[i].dtype);
  CHECK(kiln_dtype_from_name("f33") == -1);
  CHECK(kiln_dtype_from_name("") == -1);
  CHECK(kiln_dtype_from_name(NULL) == -1);
}

/* PyTorch's table (torch.promote_types) restricted to kiln's dtypes, written out by hand. */
static void test_promotion(void) {
  enum { F32 = KILN_F32, F64 = KILN_F64, F16 = KILN_F16, BF = KILN_BF16, I64 = KILN_I64, I32 = KILN_I32, U8 = KILN_U8, B = KILN_BOOL };
  static const int order[8] = {F32, F64, F16, BF, I64, I32, U8, B};
  static const int table[8][8] = {
    /*          f32  f64  f16  bf16 i64  i32  u8   bool */
    /* f32  */ {F32, F64, F32, F32, F32, F32, F32, F32},
    /* f64  */ {F64, F64, F64, F64, F64, F64, F64, F64},
    /* f16  */ {F32, F64, F16, F32, F16, F16, F16, F16},
    /* bf16 */ {F32, F64, F32, BF,  BF,  BF,  BF,  BF},
    /* i64  */ {F32, F64, F16, BF,  I64, I64, I64, I64},
    /* i32  */ {F32, F64, F16, BF,  I64, I32, I32, I32},
    /* u8   */ {F32, F64, F16, BF,  I64, I32, U8,  U8},
    /* bool */ {F32, F64, F16, BF,  I64, I32, U8,  B},
  };
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 8; j++) {
      int got = kiln_promote_types(order[i], order[j]);
      check_report(got == table[i][j], __FILE__, __LINE__, "promote(%s, %s) = %s, expected %s", kiln_dtype_name(order[i]),
                   kiln_dtype_name(order[j]), kiln_dtype_name(got), kiln_dtype_name(table[i][j]));
    }
}

static void check_f16(float x, uint16_t want, int line) {
  uint16_t got = kiln_f32_to_f16(x);
  check_report(got == want, __FILE__, line, "f32_to_f16(%.9g) = 0x%04x, expected 0x%04x", (double)x, got, want);
}
static void check_bf16(float x, uint16_t want, int line) {
  uint16_t got = kiln_f32_to_bf16(x);
  check_report(got == want, __FILE__, line, "f32_to_bf16(%.9g) = 0x%04x, expected 0x%04x", (double)x, got, want);
}
#define F16(x, want) check_f16((float)(x), (want), __LINE__)
#define BF16(x, want) check_bf16((float)(x), (want), __LINE__)

static int f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
static int bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

static void test_f16_known(void) {
  F16(1.0, 0x3C00); F16(-2.0, 0xC000); F16(0.5, 0x3800); F16(0.0, 0x0000); F16(-0.0, 0x8000);
  F16(65504.0, 0x7BFF); F16(-65504.0, 0xFBFF);
  F16(65519.99609375, 0x7BFF);                 /* the f32 just below the midpoint to infinity */
  F16(65520.0, 0x7C00); F16(-65520.0, 0xFC00); F16(1e10, 0x7C00); F16(FLT_MAX, 0x7C00);
  F16(INFINITY, 0x7C00); F16(-INFINITY, 0xFC00);
  F16(ldexp(1, -24), 0x0001);                  /* smallest subnormal */
  F16(ldexp(1, -14), 0x0400);                  /* smallest normal */
  F16(ldexp(1, -14) - ldexp(1, -24), 0x03FF);  /* largest subnormal */
  F16(ldexp(1, -25), 0x0000);                  /* half the smallest subnormal: a tie, to even (0) */
  F16(ldexp(1, -25) * 1.0001, 0x0001);         /* just above the tie */
  F16(-ldexp(1, -25) * 1.0001, 0x8001);
  F16(ldexp(3, -25), 0x0002);                  /* 1.5 units: tie, to even (2) */
  F16(ldexp(5, -25), 0x0002);                  /* 2.5 units: tie, to even (2) */
  F16(ldexp(7, -25), 0x0004);                  /* 3.5 units: tie, to even (4) */
  F16(ldexp(1, -14) - ldexp(1, -25), 0x0400);  /* 1023.5 units: tie, rounds up into the first normal */
  F16(ldexp(1, -30), 0x0000);                  /* far below: zero */
  F16(1e-45, 0x0000);                          /* an f32 subnormal */
  F16(1.0 + ldexp(1, -11), 0x3C00);            /* tie, to even */
  F16(1.0 + ldexp(3, -11), 0x3C02);            /* tie, to even (up) */
  F16(1.0 + ldexp(1, -11) + ldexp(1, -20), 0x3C01);  /* just above the tie */
  F16(1.0 + ldexp(1, -11) - ldexp(1, -20), 0x3C00);  /* just below it */
  F16(2047.5, 0x6800);                         /* tie that carries into the exponent: 2048 */
  F16(2049.0, 0x6800);                         /* tie between 2048 and 2050: to even (2048) */
  F16(2051.0, 0x6802);                         /* tie between 2050 and 2052: to even (2052) */
  F16(3.140625, 0x4248);
  F16(0.1, 0x2E66);                            /* 0.0999755859375 */

  uint16_t h = kiln_f32_to_f16(NAN);
  CHECK(f16_is_nan(h));
  h = kiln_f32_to_f16(f32_from_bits(0x7f800001u));   /* payload only in bits the f16 drops */
  CHECK(f16_is_nan(h));
  h = kiln_f32_to_f16(f32_from_bits(0xffc00000u));   /* negative NaN */
  CHECK(f16_is_nan(h) && (h & 0x8000u));

  CHECK(kiln_f16_to_f32(0x3C00) == 1.0f);
  CHECK(kiln_f16_to_f32(0xC000) == -2.0f);
  CHECK(kiln_f16_to_f32(0x0001) == (float)ldexp(1, -24));
  CHECK(kiln_f16_to_f32(0x03FF) == (float)ldexp(1023, -24));
  CHECK(kiln_f16_to_f32(0x8001) == -(float)ldexp(1, -24));
  CHECK(kiln_f16_to_f32(0x0400) == (float)ldexp(1, -14));
  CHECK(kiln_f16_to_f32(0x7BFF) == 65504.0f);
  CHECK(kiln_f16_to_f32(0x7C00) == INFINITY);
  CHECK(kiln_f16_to_f32(0xFC00) == -INFINITY);
  CHECK(isnan(kiln_f16_to_f32(0x7E00)) && isnan(kiln_f16_to_f32(0x7C01)) && isnan(kiln_f16_to_f32(0xFE00)));
  float nz = kiln_f16_to_f32(0x8000);
  CHECK(nz == 0.0f && signbit(nz));
  CHECK(kiln_f16_to_f32(0x3555) == (float)(1365.0 / 4096.0));   /* 0.333251953125 */
}

/* Every f16 pattern: decode, encode again, and get the same pattern back (NaN stays NaN). */
static void test_f16_round_trip(void) {
  int bad = 0, nan_bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = kiln_f16_to_f32((uint16_t)h);
    uint16_t back = kiln_f32_to_f16(f);
    if (f16_is_nan((uint16_t)h)) nan_bad += !(isnan(f) && f16_is_nan(back));
    else if (back != h && !bad) {
      bad = 1;
      fprintf(stderr, "f16 0x%04x -> %.9g -> 0x%04x\n", h, (double)f, back);
    }
  }
  CHECK(bad == 0);
  CHECK(nan_bad == 0);
  /* Decoding is monotonic over the positive finite patterns (the search below relies on it). */
  int mono = 1;
  for (uint32_t h = 1; h <= 0x7BFF; h++) mono &= kiln_f16_to_f32((uint16_t)h) > kiln_f16_to_f32((uint16_t)(h - 1));
  CHECK(mono);
}

/* Nearest f16 to x by binary search over the decoded values, ties to the even pattern; values at
   or past 65520 (the midpoint between 65504 and the next step, 65536) are infinity. */
static uint16_t f16_reference(float xf) {
  double x = xf, ax = fabs(x);
  uint16_t sign = signbit(xf) ? 0x8000 : 0;
  if (isnan(x)) return 0x7E00;
  if (ax >= 65520.0) return sign | 0x7C00;
  uint32_t lo = 0, hi = 0x7BFF;                /* largest pattern with value <= ax */
  while (lo < hi) {
    uint32_t mid = (lo + hi + 1) / 2;
    if ((double)kiln_f16_to_f32((uint16_t)mid) <= ax) lo = mid; else hi = mid - 1;
  }
  double vlo = kiln_f16_to_f32((uint16_t)lo);
  double vhi = lo == 0x7BFF ? 65536.0 : (double)kiln_f16_to_f32((uint16_t)(lo + 1));
  uint32_t r;
  if (ax - vlo < vhi - ax) r = lo;
  else if (ax - vlo > vhi - ax) r = lo + 1;
  else r = (lo & 1) ? lo + 1 : lo;
  return (uint16_t)(sign | r);
}

static void test_f16_against_reference(void) {
  int bad = 0;
  uint64_t tested = 0;
  /* Random bit patterns over every exponent. */
  for (uint64_t i = 0; i < 300000; i++) {
    uint32_t u = (uint32_t)((hashval(i) + 1.0) * 2147483648.0);
    float x = f32_from_bits(u);
    if (isnan(x)) continue;
    tested++;
    uint16_t got = kiln_f32_to_f16(x), want = f16_reference(x);
    if (got != want && bad++ < 5) fprintf(stderr, "f32_to_f16(%.9g [0x%08x]) = 0x%04x, reference 0x%04x\n", (double)x, u, got, want);
  }
  /* Every midpoint between two neighbouring f16 values, and the f32 on either side of it. */
  for (uint32_t h = 0; h < 0x7BFF; h++) {
    double mid = ((double)kiln_f16_to_f32((uint16_t)h) + (double)kiln_f16_to_f32((uint16_t)(h + 1))) / 2;
    float m = (float)mid;   /* exact: a midpoint has one more bit than an f16 */
    float xs[3] = {nextafterf(m, 0), m, nextafterf(m, INFINITY)};
    for (int k = 0; k < 3; k++) {
      tested++;
      uint16_t got = kiln_f32_to_f16(xs[k]), want = f16_reference(xs[k]);
      if (got != want && bad++ < 5) fprintf(stderr, "f32_to_f16(%.9g) = 0x%04x, reference 0x%04x\n", (double)xs[k], got, want);
    }
  }
  check_report(bad == 0, __FILE__, __LINE__, "f32_to_f16 differs from the reference on %d of %llu values", bad,
               (unsigned long long)tested);
}

static void test_bf16(void) {
  BF16(1.0, 0x3F80); BF16(-2.0, 0xC000); BF16(0.0, 0x0000); BF16(-0.0, 0x8000);
  BF16(1.0 + ldexp(1, -8), 0x3F80);                   /* tie, to even */
  BF16(1.0 + ldexp(3, -8), 0x3F82);                   /* tie, to even (up) */
  BF16(1.0 + ldexp(1, -8) + ldexp(1, -20), 0x3F81);   /* just above the tie */
  BF16(1.0 + ldexp(1, -8) - ldexp(1, -20), 0x3F80);   /* just below */
  BF16(3.140625, 0x4049);
  BF16(INFINITY, 0x7F80); BF16(-INFINITY, 0xFF80);
  BF16(FLT_MAX, 0x7F80);                              /* rounds past the largest bf16 */
  BF16(f32_from_bits(0x7F7F7FFFu), 0x7F7F);           /* just below that midpoint: the largest bf16 */
  BF16(f32_from_bits(0x00000001u), 0x0000);           /* the smallest f32 subnormal rounds to zero */
  BF16(f32_from_bits(0x00008000u), 0x0000);           /* subnormal tie, to even */
  BF16(f32_from_bits(0x00018000u), 0x0002);           /* subnormal tie, to even (up) */
  CHECK(bf16_is_nan(kiln_f32_to_bf16(NAN)));
  CHECK(bf16_is_nan(kiln_f32_to_bf16(f32_from_bits(0x7f800001u))));   /* payload only in the dropped bits */
  CHECK(bf16_is_nan(kiln_f32_to_bf16(f32_from_bits(0x7fffffffu))));   /* must not carry into infinity or sign */
  uint16_t nn = kiln_f32_to_bf16(f32_from_bits(0xff800001u));
  CHECK(bf16_is_nan(nn) && (nn & 0x8000u));
  CHECK(kiln_bf16_to_f32(0x3F80) == 1.0f);
  CHECK(kiln_bf16_to_f32(0xC049) == -3.140625f);
  CHECK(kiln_bf16_to_f32(0x7F80) == INFINITY);
  CHECK(isnan(kiln_bf16_to_f32(0x7FC0)));
  CHECK(kiln_bf16_to_f32(0x0001) == f32_from_bits(0x00010000u));

  int bad = 0, nan_bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = kiln_bf16_to_f32((uint16_t)h);
    if (bits_of_f32(f) != h << 16) bad++;
    uint16_t back = kiln_f32_to_bf16(f);
    if (bf16_is_nan((uint16_t)h)) nan_bad += !bf16_is_nan(back);
    else bad += back != h;
  }
  CHECK(bad == 0);
  CHECK(nan_bad == 0);

  /* Against the nearest of the two neighbouring bf16 values, computed in double. */
  bad = 0;
  for (uint64_t i = 0; i < 300000; i++) {
    uint32_t u = (uint32_t)((hashval(i + 999) + 1.0) * 2147483648.0);
    if (i % 3 == 0) u = (u & 0xffff0000u) | 0x8000u;   /* exact ties, a third of the time */
    float x = f32_from_bits(u);
    if (isnan(x)) continue;
    uint32_t a = u & 0x7fffffffu;
    uint16_t lo = (uint16_t)(a >> 16), want;
    double vlo = kiln_bf16_to_f32(lo), ax = fabs((double)x);
    double vhi = lo == 0x7F7F ? ldexp(1, 128) : (double)kiln_bf16_to_f32((uint16_t)(lo + 1));
    if (lo == 0x7F80) want = 0x7F80;
    else if (ax - vlo < vhi - ax) want = lo;
    else if (ax - vlo > vhi - ax) want = (uint16_t)(lo + 1);
    else want = (lo & 1) ? (uint16_t)(lo + 1) : lo;
    want |= (uint16_t)((u >> 16) & 0x8000u);
    uint16_t got = kiln_f32_to_bf16(x);
    if (got != want && bad++ < 5) fprintf(stderr, "f32_to_bf16(0x%08x) = 0x%04x, reference 0x%04x\n", u, got, want);
  }
  CHECK(bad == 0);
}

/* Conversions through tensors: every dtype from f64, as PyTorch's .to() would give. */
static void test_tensor_conversions(void) {
  const double src[] = {1.0, -2.7, 2.7, 0.0, 255.9, 65520.0, 0.1, -0.5};
  int64_t n = 8;
  struct kiln_tensor *t = T(1, &n, src, KILN_F64);
  static const struct { int dtype; double want[8]; } cases[] = {
    {KILN_F32, {1.0, (float)-2.7, (float)2.7, 0.0, (float)255.9, 65520.0, (float)0.1, -0.5}},
    {KILN_F16, {1.0, -2.69921875, 2.69921875, 0.0, 255.875, INFINITY, 0.0999755859375, -0.5}},
    {KILN_BF16, {1.0, -2.703125, 2.703125, 0.0, 256.0, 65536.0, 0.10009765625, -0.5}},
    {KILN_I64, {1, -2, 2, 0, 255, 65520, 0, 0}},      /* truncation toward zero */
    {KILN_I32, {1, -2, 2, 0, 255, 65520, 0, 0}},
    {KILN_BOOL, {1, 1, 1, 0, 1, 1, 1, 1}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct kiln_tensor *c = kiln_to_dtype(t, cases[i].dtype);
    CHECK(c && c->dtype == cases[i].dtype);
    double *v = V(c);
    check_arrays(v, cases[i].want, 8, 0, 0, kiln_dtype_name(cases[i].dtype), __FILE__, __LINE__);
    free(v);
    kiln_tensor_release(c);
  }
  /* to the same dtype: the same tensor, a new reference */
  struct kiln_tensor *same = kiln_to_dtype(t, KILN_F64);
  CHECK(same == t && t->refcount == 2);
  kiln_tensor_release(same);
  CHECK_ERR(kiln_to_dtype(t, 42), "unknown dtype");
  kiln_tensor_release(t);
}

int main(void) {
  test_names_and_sizes();
  test_promotion();
  test_f16_known();
  test_f16_round_trip();
  test_f16_against_reference();
  test_bf16();
  test_tensor_conversions();
  return check_done("test_dtype");
}
