/* test_cuda_gemm_plan.c: the host-side choices of the CUDA GEMM through cuBLASLt (runtime/cuda/
   gemm_plan.c, compiled into this test), checked on the CPU: the compute, scale and data types for
   every dtype and f32 matmul precision against a table of cuBLAS's numbers, operand alignment, the
   cache key (what makes two problems the same), the cache of heuristic answers (hits, "none",
   replacement of the least recently used), and cuBLASLt's matrix layouts, played by a column-major
   reference loop on the raw storage, against kiln_matmul.
   `test_cuda_gemm_plan fake`, with $KILN_CUDA_LIB naming fake_kiln_cuda_device (whose GEMM records the
   precision it reads through kiln_cuda_host, then refuses): the setting reaches the CUDA backend's
   GEMM, every product reading the value of its moment. */
#include "check.h"
#include "fake_cuda_backend.h"
#include "gemm_plan.h"
#include "internal.h"   /* kiln_tensor_data */
#include <dlfcn.h>

/* ---- types: the table, with cuBLAS's own numbers written out (cublas_api.h, library_types.h) ---- */

enum { COMPUTE_32F = 68, COMPUTE_64F = 70, COMPUTE_32F_FAST_16BF = 75, COMPUTE_32F_FAST_TF32 = 77 };
enum { R_32F = 0, R_64F = 1, R_16F = 2, R_16BF = 14 };

static void test_types(void) {
  static const struct {
    int dtype, precision, compute, scale, data, use_lt;
  } table[] = {
    {KILN_F32, KILN_MATMUL_HIGHEST, COMPUTE_32F, R_32F, R_32F, 1},
    {KILN_F32, KILN_MATMUL_HIGH, COMPUTE_32F_FAST_TF32, R_32F, R_32F, 1},
    {KILN_F32, KILN_MATMUL_MEDIUM, COMPUTE_32F_FAST_16BF, R_32F, R_32F, 1},
    {KILN_BF16, KILN_MATMUL_HIGHEST, COMPUTE_32F, R_32F, R_16BF, 1},
    {KILN_BF16, KILN_MATMUL_HIGH, COMPUTE_32F, R_32F, R_16BF, 1},
    {KILN_BF16, KILN_MATMUL_MEDIUM, COMPUTE_32F, R_32F, R_16BF, 1},
    {KILN_F16, KILN_MATMUL_HIGHEST, COMPUTE_32F, R_32F, R_16F, 1},
    {KILN_F16, KILN_MATMUL_HIGH, COMPUTE_32F, R_32F, R_16F, 1},
    {KILN_F16, KILN_MATMUL_MEDIUM, COMPUTE_32F, R_32F, R_16F, 1},
    {KILN_F64, KILN_MATMUL_HIGHEST, COMPUTE_64F, R_64F, R_64F, 0},
    {KILN_F64, KILN_MATMUL_HIGH, COMPUTE_64F, R_64F, R_64F, 0},
    {KILN_F64, KILN_MATMUL_MEDIUM, COMPUTE_64F, R_64F, R_64F, 0},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    struct kiln_cuda_gemm_types t;
    int rc = kiln_cuda_gemm_types(table[i].dtype, table[i].precision, &t);
    check_report(rc == 0 && t.compute == table[i].compute && t.scale == table[i].scale && t.data == table[i].data &&
                   t.use_lt == table[i].use_lt,
                 __FILE__, __LINE__, "types of %s at precision %d: rc %d, compute %d scale %d data %d lt %d; expected %d %d %d %d",
                 kiln_dtype_name(table[i].dtype), table[i].precision, rc, t.compute, t.scale, t.data, t.use_lt,
                 table[i].compute, table[i].scale, table[i].data, table[i].use_lt);
  }
  /* integers and bool are not cuBLAS's; nor is a precision outside the enum */
  int no_blas[] = {KILN_I64, KILN_I32, KILN_U8, KILN_BOOL};
  for (size_t i = 0; i < sizeof no_blas / sizeof no_blas[0]; i++) {
    struct kiln_cuda_gemm_types t;
    CHECK(kiln_cuda_gemm_types(no_blas[i], KILN_MATMUL_HIGHEST, &t) == -1 && t.use_lt == 0);
  }
  struct kiln_cuda_gemm_types t;
  CHECK(kiln_cuda_gemm_types(KILN_F32, 3, &t) == -1);
  CHECK(kiln_cuda_gemm_types(KILN_F32, -1, &t) == -1);
  CHECK(strcmp(kiln_cuda_gemm_compute_name(COMPUTE_32F_FAST_TF32), "f32 with TF32 tensor cores") == 0);
  CHECK(strcmp(kiln_cuda_gemm_compute_name(COMPUTE_32F), "f32") == 0);
  CHECK(strcmp(kiln_cuda_gemm_compute_name(12345), "an unknown compute type") == 0);
}

/* ---- alignment ---- */

static void test_alignment(void) {
  static const struct {
    uintptr_t address;
    uint32_t align;
  } table[] = {
    {0x7f0000000000u, 256}, {0x7f0000000100u, 256}, {0x7f0000000080u, 128}, {0x7f0000000010u, 16},
    {0x7f0000000004u, 4},   {0x7f0000000002u, 2},   {0x7f0000000003u, 1},   {0x7f0000000c40u, 64},
    {0, 256},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    check_report(kiln_cuda_gemm_alignment(table[i].address) == table[i].align, __FILE__, __LINE__,
                 "alignment of %#llx: %u, expected %u", (unsigned long long)table[i].address,
                 kiln_cuda_gemm_alignment(table[i].address), table[i].align);
  /* every address: the answer divides it and twice the answer does not (below 256) */
  for (uintptr_t a = 1; a < 4096; a++) {
    uint32_t al = kiln_cuda_gemm_alignment(a);
    if (a % al != 0 || (al < 256 && a % (2 * al) == 0)) {
      CHECK(!"alignment divides the address, twice it does not");
      break;
    }
  }
}

/* ---- keys ---- */

static struct kiln_cuda_gemm_plan plan(int64_t m, int64_t n, int64_t k, int64_t batch) {
  struct kiln_cuda_gemm_plan p;
  memset(&p, 0, sizeof p);
  p.m = m; p.n = n; p.k = k; p.batch = batch;
  p.lda = m; p.ldb = k; p.ldc = m;
  p.stride_a = m * k; p.stride_b = k * n; p.stride_c = m * n;
  return p;
}

static int same_key(const struct kiln_cuda_lt_key *x, const struct kiln_cuda_lt_key *y) {
  return memcmp(x, y, sizeof *x) == 0;
}

static void test_keys(void) {
  struct kiln_cuda_gemm_types f32, tf32, bf16;
  kiln_cuda_gemm_types(KILN_F32, KILN_MATMUL_HIGHEST, &f32);
  kiln_cuda_gemm_types(KILN_F32, KILN_MATMUL_HIGH, &tf32);
  kiln_cuda_gemm_types(KILN_BF16, KILN_MATMUL_HIGHEST, &bf16);
  const uintptr_t A = 0x10000, B = 0x20000, Cc = 0x30000;
  struct kiln_cuda_gemm_plan p = plan(64, 32, 16, 4);
  struct kiln_cuda_lt_key k0, k1;
  kiln_cuda_lt_key_build(&k0, 0, KILN_F32, &f32, &p, A, B, Cc);
  CHECK(k0.m == 64 && k0.n == 32 && k0.k == 16 && k0.batch == 4 && k0.stride_b == 16 * 32 && k0.compute == 68);
  CHECK(k0.align_a == 256 && k0.align_b == 256 && k0.align_c == 256);
  /* the same problem at other (equally aligned) addresses: the same key */
  kiln_cuda_lt_key_build(&k1, 0, KILN_F32, &f32, &p, A + 0x1000, B + 0x4000, Cc + 0x100);
  CHECK(same_key(&k0, &k1));
  /* a batch stride that breaks the alignment of the later matrices lowers the operand's: 1028
     floats (4112 bytes) -> 16; 1025 floats -> 4; in f64 1025 -> 8; one matrix ignores it */
  struct kiln_cuda_gemm_plan odd = p;
  odd.stride_a = 1028; odd.stride_b = 1025; odd.stride_c = 2050;
  kiln_cuda_lt_key_build(&k1, 0, KILN_F32, &f32, &odd, A, B, Cc);
  CHECK(k1.align_a == 16 && k1.align_b == 4 && k1.align_c == 8);
  struct kiln_cuda_gemm_types f64t;
  kiln_cuda_gemm_types(KILN_F64, KILN_MATMUL_HIGHEST, &f64t);
  kiln_cuda_lt_key_build(&k1, 0, KILN_F64, &f64t, &odd, A, B, Cc);
  CHECK(k1.align_a == 32 && k1.align_b == 8 && k1.align_c == 16);
  kiln_cuda_lt_key_build(&k1, 0, KILN_BF16, &bf16, &odd, A, B, Cc);
  CHECK(k1.align_a == 8 && k1.align_b == 2 && k1.align_c == 4);
  odd.batch = 1;
  kiln_cuda_lt_key_build(&k1, 0, KILN_F32, &f32, &odd, A, B, Cc);
  CHECK(k1.align_a == 256 && k1.align_b == 256 && k1.align_c == 256);

  /* each of these makes another problem */
  struct {
    const char *what;
    int device, dtype;
    const struct kiln_cuda_gemm_types *t;
    struct kiln_cuda_gemm_plan p;
    uintptr_t a, b, c;
  } other[16];
  int n = 0;
#define OTHER(w, dev, dt, ty, pl, aa, bb, cc) \
  other[n].what = w; other[n].device = dev; other[n].dtype = dt; other[n].t = ty; other[n].p = pl; \
  other[n].a = aa; other[n].b = bb; other[n].c = cc; n++
  struct kiln_cuda_gemm_plan q;
  OTHER("another device", 1, KILN_F32, &f32, p, A, B, Cc);
  OTHER("TF32", 0, KILN_F32, &tf32, p, A, B, Cc);
  OTHER("bf16", 0, KILN_BF16, &bf16, p, A, B, Cc);
  q = p; q.m = 65; q.lda = 65; q.ldc = 65;
  OTHER("m", 0, KILN_F32, &f32, q, A, B, Cc);
  q = p; q.k = 17;
  OTHER("k", 0, KILN_F32, &f32, q, A, B, Cc);
  q = p; q.trans_a = 1; q.lda = 16;
  OTHER("A transposed", 0, KILN_F32, &f32, q, A, B, Cc);
  q = p; q.trans_b = 1; q.ldb = 32;
  OTHER("B transposed", 0, KILN_F32, &f32, q, A, B, Cc);
  q = p; q.ldb = 24;
  OTHER("ldb", 0, KILN_F32, &f32, q, A, B, Cc);
  q = p; q.stride_a = 0;
  OTHER("A broadcast over the batch", 0, KILN_F32, &f32, q, A, B, Cc);
  q = p; q.stride_c = 64 * 32 + 8;
  OTHER("C's batch stride", 0, KILN_F32, &f32, q, A, B, Cc);
  q = p; q.batch = 3;
  OTHER("batch", 0, KILN_F32, &f32, q, A, B, Cc);
  OTHER("A at 4 bytes", 0, KILN_F32, &f32, p, A + 4, B, Cc);
  OTHER("B at 16 bytes", 0, KILN_F32, &f32, p, A, B + 16, Cc);
  OTHER("C at 8 bytes", 0, KILN_F32, &f32, p, A, B, Cc + 8);
#undef OTHER
  for (int i = 0; i < n; i++) {
    struct kiln_cuda_lt_key k;
    kiln_cuda_lt_key_build(&k, other[i].device, other[i].dtype, other[i].t, &other[i].p, other[i].a, other[i].b, other[i].c);
    check_report(!same_key(&k, &k0), __FILE__, __LINE__, "key: %s gives the same key", other[i].what);
    for (int j = 0; j < i; j++) {   /* and no two of them coincide */
      struct kiln_cuda_lt_key kj;
      kiln_cuda_lt_key_build(&kj, other[j].device, other[j].dtype, other[j].t, &other[j].p, other[j].a, other[j].b,
                             other[j].c);
      if (same_key(&k, &kj)) check_report(0, __FILE__, __LINE__, "key: %s and %s coincide", other[i].what, other[j].what);
    }
  }

  /* a batch of one: strides are never read, so they do not split the key */
  struct kiln_cuda_gemm_plan one = plan(64, 32, 16, 1), one2 = one;
  one2.stride_a = 0; one2.stride_b = 999; one2.stride_c = 12345;
  struct kiln_cuda_lt_key ko, ko2;
  kiln_cuda_lt_key_build(&ko, 0, KILN_F32, &f32, &one, A, B, Cc);
  kiln_cuda_lt_key_build(&ko2, 0, KILN_F32, &f32, &one2, A, B, Cc);
  CHECK(same_key(&ko, &ko2) && ko.stride_a == 0 && ko.stride_c == 0);
  /* no padding for garbage to hide in: the fields fill the struct */
  CHECK(sizeof(struct kiln_cuda_lt_key) == 10 * 4 + 10 * 8);
}

/* ---- the cache ---- */

static struct kiln_cuda_lt_key key_of(int64_t m) {
  struct kiln_cuda_gemm_types t;
  kiln_cuda_gemm_types(KILN_F32, KILN_MATMUL_HIGHEST, &t);
  struct kiln_cuda_gemm_plan p = plan(m, 8, 8, 1);
  struct kiln_cuda_lt_key k;
  kiln_cuda_lt_key_build(&k, 0, KILN_F32, &t, &p, 0x1000, 0x2000, 0x3000);
  return k;
}

static void fill_algo(unsigned char *algo, int seed) {
  for (int i = 0; i < KILN_CUDA_LT_ALGO_BYTES; i++) algo[i] = (unsigned char)(seed * 31 + i);
}

static void test_cache(void) {
  struct kiln_cuda_lt_cache *c = calloc(1, sizeof *c);
  unsigned char algo[KILN_CUDA_LT_ALGO_BYTES], got[KILN_CUDA_LT_ALGO_BYTES], want[KILN_CUDA_LT_ALGO_BYTES];
  struct kiln_cuda_lt_key k1 = key_of(1), k2 = key_of(2);
  CHECK(kiln_cuda_lt_cache_count(c) == 0);
  CHECK(kiln_cuda_lt_cache_find(c, &k1, got) == KILN_CUDA_LT_MISS && c->misses == 1);

  fill_algo(algo, 1);
  kiln_cuda_lt_cache_put(c, &k1, KILN_CUDA_LT_ALGO, algo);
  memset(got, 0, sizeof got);
  CHECK(kiln_cuda_lt_cache_find(c, &k1, got) == KILN_CUDA_LT_ALGO && memcmp(got, algo, sizeof algo) == 0);
  CHECK(c->hits == 1 && kiln_cuda_lt_cache_count(c) == 1);
  CHECK(kiln_cuda_lt_cache_find(c, &k2, got) == KILN_CUDA_LT_MISS);

  /* "none": the fallback is remembered too, and leaves the caller's buffer alone */
  kiln_cuda_lt_cache_put(c, &k2, KILN_CUDA_LT_NONE, NULL);
  memset(got, 0xab, sizeof got);
  memset(want, 0xab, sizeof want);
  CHECK(kiln_cuda_lt_cache_find(c, &k2, got) == KILN_CUDA_LT_NONE && memcmp(got, want, sizeof got) == 0);
  /* a new answer for a known key replaces the old one (an algorithm refused at run time) */
  kiln_cuda_lt_cache_put(c, &k1, KILN_CUDA_LT_NONE, NULL);
  CHECK(kiln_cuda_lt_cache_find(c, &k1, got) == KILN_CUDA_LT_NONE && kiln_cuda_lt_cache_count(c) == 2);
  fill_algo(algo, 7);
  kiln_cuda_lt_cache_put(c, &k1, KILN_CUDA_LT_ALGO, algo);
  CHECK(kiln_cuda_lt_cache_find(c, &k1, got) == KILN_CUDA_LT_ALGO && memcmp(got, algo, sizeof algo) == 0);
  CHECK(kiln_cuda_lt_cache_count(c) == 2 && c->evictions == 0);

  /* full: the least recently used goes. Fill every slot, touch key 1, add one more. */
  for (int64_t m = 3; m <= KILN_CUDA_LT_CACHE_ENTRIES; m++) {
    struct kiln_cuda_lt_key k = key_of(m);
    fill_algo(algo, (int)m);
    kiln_cuda_lt_cache_put(c, &k, KILN_CUDA_LT_ALGO, algo);
  }
  CHECK(kiln_cuda_lt_cache_count(c) == KILN_CUDA_LT_CACHE_ENTRIES && c->evictions == 0);
  CHECK(kiln_cuda_lt_cache_find(c, &k1, got) == KILN_CUDA_LT_ALGO);   /* key 1 is now the most recent */
  struct kiln_cuda_lt_key extra = key_of(1000);
  fill_algo(algo, 1000);
  kiln_cuda_lt_cache_put(c, &extra, KILN_CUDA_LT_ALGO, algo);
  CHECK(c->evictions == 1 && kiln_cuda_lt_cache_count(c) == KILN_CUDA_LT_CACHE_ENTRIES);
  CHECK(kiln_cuda_lt_cache_find(c, &k2, got) == KILN_CUDA_LT_MISS);    /* key 2 was the oldest */
  CHECK(kiln_cuda_lt_cache_find(c, &k1, got) == KILN_CUDA_LT_ALGO);
  CHECK(kiln_cuda_lt_cache_find(c, &extra, got) == KILN_CUDA_LT_ALGO && memcmp(got, algo, sizeof algo) == 0);
  struct kiln_cuda_lt_key k3 = key_of(3);
  fill_algo(want, 3);
  CHECK(kiln_cuda_lt_cache_find(c, &k3, got) == KILN_CUDA_LT_ALGO && memcmp(got, want, sizeof want) == 0);
  free(c);
}

/* ---- layouts: cuBLASLt's descriptors played on the raw storage ---- */

/* Element (r, c) of column-major layout l in batch bi, with its bounds checked. */
static int at(const struct kiln_cuda_lt_layout *l, const double *base, int64_t bi, int64_t r, int64_t c, double *v) {
  if (r < 0 || r >= l->rows || c < 0 || c >= l->cols || bi >= l->batch || l->ld < l->rows) return 0;
  *v = base[bi * l->stride + r + c * l->ld];
  return 1;
}

/* What cublasLtMatmul computes on the layouts, D = C = alpha op(A) op(B) + beta C. */
static int play_lt(const struct kiln_cuda_gemm_plan *p, const struct kiln_cuda_lt_layout *l, const double *A,
                   const double *B, double *C) {
  for (int64_t bi = 0; bi < p->batch; bi++)
    for (int64_t j = 0; j < p->n; j++)
      for (int64_t i = 0; i < p->m; i++) {
        double s = 0, x, y, cur;
        for (int64_t q = 0; q < p->k; q++) {
          int ok = p->trans_a ? at(&l[0], A, bi, q, i, &x) : at(&l[0], A, bi, i, q, &x);
          ok &= p->trans_b ? at(&l[1], B, bi, j, q, &y) : at(&l[1], B, bi, q, j, &y);
          if (!ok) return 0;
          s += x * y;
        }
        if (!at(&l[2], C, bi, i, j, &cur)) return 0;
        C[bi * l[2].stride + i + j * l[2].ld] = s;
      }
  return 1;
}

static struct kiln_tensor *seq(int ndim, const int64_t *sizes) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sizes[d];
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = hashval((uint64_t)i + 31u * (uint64_t)ndim);
  struct kiln_tensor *t = T(ndim, sizes, v, KILN_F64);
  free(v);
  return t;
}

static void layout_case(const char *what, struct kiln_tensor *a, struct kiln_tensor *b, int64_t B, int64_t n, int64_t m) {
  struct kiln_tensor *out = kiln_tensor_full(3, (int64_t[]){B, n, m}, NAN, KILN_F64, CPU);
  struct kiln_cuda_gemm_plan p;
  int ok = kiln_cuda_gemm_plan(out, a, b, &p) == 0 && !p.copy_a && !p.copy_b && !p.copy_out;
  struct kiln_cuda_lt_layout l[3];
  kiln_cuda_lt_layouts(&p, l);
  /* cuBLAS's A is kiln's b, its B kiln's a */
  ok = ok && play_lt(&p, l, (double *)kiln_tensor_data(b), (double *)kiln_tensor_data(a), (double *)kiln_tensor_data(out));
  struct kiln_tensor *want = kiln_matmul(a, b);
  double *g = V(out), *w = V(want);
  for (int64_t i = 0; i < out->numel && ok; i++)
    if (fabs(g[i] - w[i]) > 1e-12) {
      fprintf(stderr, "%s: element %lld is %g, expected %g\n", what, (long long)i, g[i], w[i]);
      ok = 0;
    }
  check_report(ok, __FILE__, __LINE__, "lt layouts: %s", what);
  free(g); free(w);
  kiln_tensor_release(out); kiln_tensor_release(want);
}

static void test_layouts(void) {
  struct kiln_tensor *a = seq(3, (int64_t[]){3, 5, 4}), *b = seq(3, (int64_t[]){3, 4, 6});
  layout_case("contiguous", a, b, 3, 5, 6);
  struct kiln_cuda_gemm_plan p;
  struct kiln_tensor *o = kiln_tensor_empty(3, (int64_t[]){3, 5, 6}, KILN_F64, CPU);
  kiln_cuda_gemm_plan(o, a, b, &p);
  struct kiln_cuda_lt_layout l[3];
  kiln_cuda_lt_layouts(&p, l);
  /* out^T = b^T @ a^T: A is b read as 6 x 4 (ld 6), B is a read as 4 x 5 (ld 4), C is 6 x 5 (ld 6) */
  CHECK(l[0].rows == 6 && l[0].cols == 4 && l[0].ld == 6 && l[0].batch == 3 && l[0].stride == 24);
  CHECK(l[1].rows == 4 && l[1].cols == 5 && l[1].ld == 4 && l[1].stride == 20);
  CHECK(l[2].rows == 6 && l[2].cols == 5 && l[2].ld == 6 && l[2].stride == 30);

  struct kiln_tensor *a2 = seq(3, (int64_t[]){3, 4, 5}), *b2 = seq(3, (int64_t[]){3, 6, 4});
  struct kiln_tensor *at_ = kiln_transpose(a2, 1, 2), *bt = kiln_transpose(b2, 1, 2);
  layout_case("a transposed", at_, b, 3, 5, 6);
  layout_case("b transposed", a, bt, 3, 5, 6);
  layout_case("both transposed", at_, bt, 3, 5, 6);
  kiln_cuda_gemm_plan(o, at_, bt, &p);
  kiln_cuda_lt_layouts(&p, l);
  CHECK(p.trans_a && p.trans_b && l[0].rows == 4 && l[0].cols == 6 && l[1].rows == 5 && l[1].cols == 4);

  /* a broadcast over the batch: stride 0 */
  struct kiln_tensor *b1 = seq(3, (int64_t[]){1, 4, 6});
  struct kiln_tensor *be = kiln_expand(b1, 3, (int64_t[]){3, 4, 6});
  layout_case("b broadcast over the batch", a, be, 3, 5, 6);
  kiln_cuda_gemm_plan(o, a, be, &p);
  kiln_cuda_lt_layouts(&p, l);
  CHECK(l[0].stride == 0 && l[0].batch == 3 && l[1].stride == 20);
  /* rows narrowed out of wider ones: ld beyond the rows */
  struct kiln_tensor *aw = seq(3, (int64_t[]){3, 5, 9});
  struct kiln_tensor *an = kiln_narrow(aw, 2, 3, 4);
  layout_case("a narrowed (ld 9)", an, b, 3, 5, 6);
  /* one matrix: batch 1, strides 0 */
  struct kiln_tensor *a1 = seq(3, (int64_t[]){1, 7, 3}), *b1b = seq(3, (int64_t[]){1, 3, 2});
  layout_case("one matrix", a1, b1b, 1, 7, 2);
  struct kiln_tensor *o1 = kiln_tensor_empty(3, (int64_t[]){1, 7, 2}, KILN_F64, CPU);
  kiln_cuda_gemm_plan(o1, a1, b1b, &p);
  kiln_cuda_lt_layouts(&p, l);
  CHECK(l[0].batch == 1 && l[0].stride == 0 && l[1].stride == 0 && l[2].stride == 0);
  /* a row times a column, and an outer product */
  struct kiln_tensor *r = seq(3, (int64_t[]){2, 1, 6}), *cl = seq(3, (int64_t[]){2, 6, 1});
  layout_case("row times column", r, cl, 2, 1, 1);
  struct kiln_tensor *ck = seq(3, (int64_t[]){2, 4, 1}), *rk = seq(3, (int64_t[]){2, 1, 3});
  layout_case("outer product", ck, rk, 2, 4, 3);

  struct kiln_tensor *all[] = {a, b, o, a2, b2, at_, bt, b1, be, aw, an, a1, b1b, o1, r, cl, ck, rk};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
}

/* ---- the precision, from kiln_set_float32_matmul_precision to the backend's GEMM ---- */

static void test_fake_device(void) {
  int available = kiln_cuda_is_available();   /* loads the backend */
  const char *lib = getenv("KILN_CUDA_LIB");
  void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
  void *sym = h ? dlsym(h, "fake_cuda_counters") : NULL;
  fake_cuda_counters_fn fn;
  memcpy(&fn, &sym, sizeof fn);
  CHECK(available && fn != NULL);   /* the fake device must have loaded */
  if (!fn || !available) return;
  struct fake_cuda_counters *fake = fn();
  const struct kiln_device cuda0 = {KILN_CUDA, 0};
  struct kiln_tensor *a = seq(2, (int64_t[]){2, 3}), *b = seq(2, (int64_t[]){3, 4});
  struct kiln_tensor *ga = kiln_to_device(a, cuda0), *gb = kiln_to_device(b, cuda0);
  CHECK(ga && gb);
  int order[] = {KILN_MATMUL_HIGH, KILN_MATMUL_MEDIUM, KILN_MATMUL_HIGHEST, KILN_MATMUL_HIGH};
  for (int i = 0; i < 4 && ga && gb; i++) {
    int64_t calls = fake->gemm_calls;
    CHECK(kiln_set_float32_matmul_precision(order[i]) == KILN_OK);
    CHECK_ERR(kiln_matmul(ga, gb), "the fake CUDA device does not multiply");
    check_report(fake->gemm_calls == calls + 1 && fake->gemm_precision == order[i], __FILE__, __LINE__,
                 "the backend's GEMM read precision %lld (call %lld), expected %d", (long long)fake->gemm_precision,
                 (long long)fake->gemm_calls, order[i]);
  }
  /* a refused value changes nothing the backend sees */
  CHECK_ERR(kiln_set_float32_matmul_precision(7), "set_float32_matmul_precision: 7 is not a precision");
  if (ga && gb) {
    CHECK_ERR(kiln_matmul(ga, gb), "the fake CUDA device does not multiply");
    CHECK(fake->gemm_precision == KILN_MATMUL_HIGH);
  }
  /* the CPU product is untouched, and never reaches the device */
  int64_t calls = fake->gemm_calls;
  struct kiln_tensor *cpu = kiln_matmul(a, b);
  CHECK(cpu != NULL && fake->gemm_calls == calls);
  kiln_set_float32_matmul_precision(KILN_MATMUL_HIGHEST);
  kiln_tensor_release(cpu);
  kiln_tensor_release(ga); kiln_tensor_release(gb); kiln_tensor_release(a); kiln_tensor_release(b);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "fake") == 0) {
    test_fake_device();
    return check_done("test_cuda_gemm_plan fake");
  }
  test_types();
  test_alignment();
  test_keys();
  test_cache();
  test_layouts();
  return check_done("test_cuda_gemm_plan");
}
