/* test_cuda_geometry.c: the CUDA kernels' index arithmetic (runtime/cuda/geometry.c, compiled into
   this test), checked on the CPU: the coalesced N-d iteration visits every element at the offsets
   its tensors' strides give, launch geometry covers every item, and the cuBLAS plan of a GEMM,
   played by a column-major reference loop on the raw storage, gives what kiln_matmul gives. */
#include "check.h"
#include "geometry.h"
#include "internal.h"   /* kiln_tensor_data */

static struct kiln_tensor *seq(int ndim, const int64_t *sizes, int dtype) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sizes[d];
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = hashval((uint64_t)i + 17u * (uint64_t)ndim);
  struct kiln_tensor *t = T(ndim, sizes, v, dtype);
  free(v);
  return t;
}

/* The offset of element (row-major linear index i of shape out) in t broadcast to that shape. */
static int64_t naive_offset(const struct kiln_tensor *t, const struct kiln_tensor *out, int64_t i) {
  int64_t off = 0;
  int lead = out->ndim - t->ndim;
  for (int d = out->ndim - 1; d >= 0; d--) {
    int64_t idx = i % out->sizes[d];
    i /= out->sizes[d];
    if (d >= lead && t->sizes[d - lead] != 1) off += idx * t->strides[d - lead];
  }
  return off;
}

/* Every linear index: the iterator's offsets (64- and 32-bit) against the naive ones. */
static int iter_matches(const struct kiln_tensor *out, int nin, const struct kiln_tensor *const *in, int *ndim_out) {
  struct kiln_cuda_iter it;
  kiln_cuda_iter_build(&it, out, nin, in);
  if (ndim_out) *ndim_out = it.ndim;
  if (it.numel != out->numel || it.nops != nin + 1) return 0;
  int64_t prod = 1;
  for (int d = 0; d < it.ndim; d++) prod *= it.sizes[d];
  if (out->numel && prod != out->numel) return 0;
  for (int64_t i = 0; i < out->numel; i++) {
    int64_t off[KILN_CUDA_MAX_OPERANDS], off32[KILN_CUDA_MAX_OPERANDS];
    kiln_cuda_iter_offsets(&it, i, off);
    kiln_cuda_iter_offsets32(&it, (uint32_t)i, off32);
    for (int k = 0; k <= nin; k++) {
      int64_t want = naive_offset(k == 0 ? out : in[k - 1], out, i);
      if (off[k] != want || off32[k] != want) {
        fprintf(stderr, "element %lld, operand %d: offset %lld (32-bit %lld), expected %lld\n", (long long)i, k,
                (long long)off[k], (long long)off32[k], (long long)want);
        return 0;
      }
    }
  }
  return 1;
}

static void test_iteration(void) {
  int nd = 0;
  struct kiln_tensor *a = seq(3, (int64_t[]){3, 5, 7}, KILN_F32);
  struct kiln_tensor *out = kiln_tensor_empty(3, (int64_t[]){3, 5, 7}, KILN_F32, CPU);
  const struct kiln_tensor *in1[1] = {a};
  /* contiguous: one flat dim */
  CHECK(iter_matches(out, 1, in1, &nd) && nd == 1);
  struct kiln_cuda_iter it;
  kiln_cuda_iter_build(&it, out, 1, in1);
  CHECK(kiln_cuda_iter_is_flat(&it) && kiln_cuda_iter_fits32(&it) && it.sizes[0] == 105);

  /* a transposed input: not flat, and every offset still right */
  struct kiln_tensor *at = kiln_transpose(a, 0, 2);                                     /* [7,5,3] */
  struct kiln_tensor *out2 = kiln_tensor_empty(3, (int64_t[]){7, 5, 3}, KILN_F32, CPU);
  const struct kiln_tensor *in2[1] = {at};
  CHECK(iter_matches(out2, 1, in2, &nd) && nd == 3);
  kiln_cuda_iter_build(&it, out2, 1, in2);
  CHECK(!kiln_cuda_iter_is_flat(&it));

  /* broadcasting: [5,1] and [7] against [3,5,7], plus a scalar-shaped [1,1,1] */
  struct kiln_tensor *col = seq(2, (int64_t[]){5, 1}, KILN_F64), *row = seq(1, (int64_t[]){7}, KILN_I64);
  struct kiln_tensor *one = seq(3, (int64_t[]){1, 1, 1}, KILN_F32);
  const struct kiln_tensor *in3[3] = {col, row, one};
  CHECK(iter_matches(out, 3, in3, &nd) && nd == 3);   /* col steps over the 5, row over the 7: nothing merges */

  /* narrowed and permuted views of a 4-d tensor, and a size-1 dim in the middle */
  struct kiln_tensor *b = seq(4, (int64_t[]){4, 1, 6, 5}, KILN_F32);
  struct kiln_tensor *bn = kiln_narrow(b, 2, 1, 4);                                    /* [4,1,4,5] */
  struct kiln_tensor *bp = kiln_permute(bn, 4, (int[]){3, 1, 0, 2});                   /* [5,1,4,4] */
  struct kiln_tensor *out3 = kiln_tensor_empty(4, (int64_t[]){5, 1, 4, 4}, KILN_F32, CPU);
  struct kiln_tensor *o3t = kiln_transpose(out3, 2, 3);                                /* a strided output */
  const struct kiln_tensor *in4[1] = {bp};
  CHECK(iter_matches(out3, 1, in4, NULL));
  CHECK(iter_matches(o3t, 1, in4, NULL));
  /* expanded (stride 0) input */
  struct kiln_tensor *e = kiln_expand(row, 3, (int64_t[]){3, 5, 7});
  const struct kiln_tensor *in5[1] = {e};
  CHECK(iter_matches(out, 1, in5, &nd) && nd == 2);

  /* a 0-dim output and an empty one */
  struct kiln_tensor *s0 = kiln_tensor_empty(0, NULL, KILN_F32, CPU);
  const struct kiln_tensor *in6[1] = {s0};
  CHECK(iter_matches(s0, 1, in6, &nd) && nd == 1);
  kiln_cuda_iter_build(&it, s0, 1, in6);
  CHECK(it.numel == 1 && it.sizes[0] == 1 && kiln_cuda_iter_is_flat(&it));
  struct kiln_tensor *em = kiln_tensor_empty(2, (int64_t[]){0, 3}, KILN_F32, CPU);
  kiln_cuda_iter_build(&it, em, 0, NULL);
  CHECK(it.numel == 0);

  /* 32-bit indexing stops where uint32 ends */
  struct kiln_cuda_iter big = {.ndim = 2, .nops = 1, .numel = (int64_t)1 << 33, .sizes = {(int64_t)1 << 17, (int64_t)1 << 16}};
  CHECK(!kiln_cuda_iter_fits32(&big));
  big.numel = (int64_t)1 << 31;
  big.sizes[0] = (int64_t)1 << 15;
  CHECK(kiln_cuda_iter_fits32(&big));

  kiln_tensor_release(a); kiln_tensor_release(out); kiln_tensor_release(at); kiln_tensor_release(out2);
  kiln_tensor_release(col); kiln_tensor_release(row); kiln_tensor_release(one); kiln_tensor_release(b);
  kiln_tensor_release(bn); kiln_tensor_release(bp); kiln_tensor_release(out3); kiln_tensor_release(o3t);
  kiln_tensor_release(e); kiln_tensor_release(s0); kiln_tensor_release(em);
}

static void test_launch(void) {
  struct kiln_cuda_launch l = kiln_cuda_launch_1d(0, 256, 1000);
  CHECK(l.blocks == 0 && l.threads == 256);
  l = kiln_cuda_launch_1d(1, 256, 1000);
  CHECK(l.blocks == 1);
  l = kiln_cuda_launch_1d(256, 256, 1000);
  CHECK(l.blocks == 1);
  l = kiln_cuda_launch_1d(257, 256, 1000);
  CHECK(l.blocks == 2);
  l = kiln_cuda_launch_1d((int64_t)1 << 40, 256, kiln_cuda_max_blocks(132, 256));
  CHECK(l.blocks == 132 * 8 * 4);
  l = kiln_cuda_launch_1d((int64_t)1 << 50, 128, (int64_t)1 << 40);
  CHECK(l.blocks == 2147483647);
  CHECK(kiln_cuda_max_blocks(0, 0) >= 1);
  /* grid-stride coverage: every item is visited exactly once */
  for (int64_t n = 1; n < 5000; n += 97) {
    struct kiln_cuda_launch g = kiln_cuda_launch_1d(n, 64, 7);
    int64_t seen = 0, stride = g.blocks * g.threads;
    for (int64_t b = 0; b < g.blocks; b++)
      for (int t = 0; t < g.threads; t++)
        for (int64_t i = b * g.threads + t; i < n; i += stride) seen++;
    CHECK(seen == n);
  }
}

/* What cublasGemmStridedBatchedEx computes, column-major, on the plan's arguments. */
static void play_cublas(const struct kiln_cuda_gemm_plan *p, const double *A, const double *B, double *C, double alpha,
                        double beta) {
  for (int64_t bi = 0; bi < p->batch; bi++) {
    const double *a = A + bi * p->stride_a, *b = B + bi * p->stride_b;
    double *c = C + bi * p->stride_c;
    for (int64_t j = 0; j < p->n; j++)
      for (int64_t i = 0; i < p->m; i++) {
        double s = 0;
        for (int64_t l = 0; l < p->k; l++) {
          double x = p->trans_a ? a[l + i * p->lda] : a[i + l * p->lda];
          double y = p->trans_b ? b[j + l * p->ldb] : b[l + j * p->ldb];
          s += x * y;
        }
        c[i + j * p->ldc] = alpha * s + (beta != 0 ? beta * c[i + j * p->ldc] : 0);
      }
  }
}

static double *data(const struct kiln_tensor *t) { return (double *)kiln_tensor_data(t); }

/* out = a @ b through the plan (copying operands when it asks), compared with kiln_matmul. */
static int gemm_case(const char *what, struct kiln_tensor *a, struct kiln_tensor *b, struct kiln_tensor *out,
                     int want_copy_a, int want_copy_b, int want_copy_out) {
  int ok = 1;
  struct kiln_cuda_gemm_plan p;
  ok &= kiln_cuda_gemm_plan(out, a, b, &p) == 0;
  if (p.copy_a != want_copy_b || p.copy_b != want_copy_a || p.copy_out != want_copy_out) {
    fprintf(stderr, "%s: copies a %d b %d out %d, expected %d %d %d\n", what, p.copy_b, p.copy_a, p.copy_out,
            want_copy_a, want_copy_b, want_copy_out);
    ok = 0;
  }
  struct kiln_tensor *A = p.copy_b ? kiln_clone(a) : kiln_alias(a);    /* clone: contiguous */
  struct kiln_tensor *Bt = p.copy_a ? kiln_clone(b) : kiln_alias(b);
  struct kiln_tensor *O = p.copy_out ? kiln_tensor_empty(3, out->sizes, out->dtype, CPU) : kiln_alias(out);
  struct kiln_cuda_gemm_plan q;
  ok &= kiln_cuda_gemm_plan(O, A, Bt, &q) == 0 && !q.copy_a && !q.copy_b && !q.copy_out;
  play_cublas(&q, data(Bt), data(A), data(O), 1.0, 0.0);
  if (p.copy_out) kiln_copy_(out, O);
  struct kiln_tensor *want = kiln_matmul(a, b);
  double *g = V(out), *w = V(want);
  for (int64_t i = 0; i < out->numel && ok; i++)
    if (fabs(g[i] - w[i]) > 1e-12) {
      fprintf(stderr, "%s: element %lld is %g, expected %g\n", what, (long long)i, g[i], w[i]);
      ok = 0;
    }
  free(g); free(w);
  kiln_tensor_release(A); kiln_tensor_release(Bt); kiln_tensor_release(O); kiln_tensor_release(want);
  return check_report(ok, __FILE__, __LINE__, "gemm plan: %s", what);
}

static struct kiln_tensor *out3(int64_t B, int64_t n, int64_t m) {
  return kiln_tensor_full(3, (int64_t[]){B, n, m}, NAN, KILN_F64, CPU);
}

static void test_gemm_plans(void) {
  struct kiln_tensor *a = seq(3, (int64_t[]){2, 5, 3}, KILN_F64), *b = seq(3, (int64_t[]){2, 3, 4}, KILN_F64);
  struct kiln_tensor *o = out3(2, 5, 4);
  gemm_case("contiguous", a, b, o, 0, 0, 0);
  /* transposed operands: views of [2,3,5] and [2,4,3] */
  struct kiln_tensor *a2 = seq(3, (int64_t[]){2, 3, 5}, KILN_F64), *b2 = seq(3, (int64_t[]){2, 4, 3}, KILN_F64);
  struct kiln_tensor *at = kiln_transpose(a2, 1, 2), *bt = kiln_transpose(b2, 1, 2);
  gemm_case("a transposed", at, b, o, 0, 0, 0);
  gemm_case("b transposed", a, bt, o, 0, 0, 0);
  gemm_case("both transposed", at, bt, o, 0, 0, 0);
  /* a batch broadcast (stride 0) */
  struct kiln_tensor *b1 = seq(3, (int64_t[]){1, 3, 4}, KILN_F64);
  struct kiln_tensor *be = kiln_expand(b1, 3, (int64_t[]){2, 3, 4});
  gemm_case("b broadcast over the batch", a, be, o, 0, 0, 0);
  /* rows narrowed out of wider ones: the leading dim exceeds the row length */
  struct kiln_tensor *aw = seq(3, (int64_t[]){2, 5, 8}, KILN_F64);
  struct kiln_tensor *an = kiln_narrow(aw, 2, 2, 3);
  gemm_case("a narrowed (lda 8)", an, b, o, 0, 0, 0);
  /* every other column: neither layout, so a copy */
  struct kiln_tensor *a6 = seq(4, (int64_t[]){2, 5, 3, 2}, KILN_F64);
  struct kiln_tensor *as = kiln_select(a6, 3, 1);                                      /* strides (30, 6, 2) */
  gemm_case("a with column stride 2", as, b, o, 1, 0, 0);
  /* an expanded row (stride 0 inside the matrix): a copy */
  struct kiln_tensor *r = seq(3, (int64_t[]){2, 1, 3}, KILN_F64);
  struct kiln_tensor *re = kiln_expand(r, 3, (int64_t[]){2, 5, 3});
  gemm_case("a with repeated rows", re, b, o, 1, 0, 0);
  /* a transposed output: computed in a buffer and copied */
  struct kiln_tensor *ob = out3(2, 4, 5);
  struct kiln_tensor *ot = kiln_transpose(ob, 1, 2);
  gemm_case("transposed out", a, b, ot, 0, 0, 1);
  /* one row, one column, k = 1 */
  struct kiln_tensor *a1 = seq(3, (int64_t[]){3, 1, 6}, KILN_F64), *bb = seq(3, (int64_t[]){3, 6, 1}, KILN_F64);
  struct kiln_tensor *o11 = out3(3, 1, 1);
  gemm_case("row times column", a1, bb, o11, 0, 0, 0);
  struct kiln_tensor *ak = seq(3, (int64_t[]){1, 4, 1}, KILN_F64), *bk = seq(3, (int64_t[]){1, 1, 6}, KILN_F64);
  struct kiln_tensor *ok1 = out3(1, 4, 6);
  gemm_case("outer product (k = 1)", ak, bk, ok1, 0, 0, 0);
  /* a transposed single column, and a batch of one */
  struct kiln_tensor *c1 = seq(3, (int64_t[]){1, 6, 1}, KILN_F64);
  struct kiln_tensor *c1t = kiln_transpose(c1, 1, 2);                                  /* [1,1,6], strides (6,1,1) */
  struct kiln_tensor *m6 = seq(3, (int64_t[]){1, 6, 7}, KILN_F64), *o17 = out3(1, 1, 7);
  gemm_case("transposed column", c1t, m6, o17, 0, 0, 0);

  /* sizes past 32 bits cannot go to cuBLAS as they are */
  struct kiln_tensor fake = *o;
  fake.sizes[2] = (int64_t)1 << 32;
  struct kiln_cuda_gemm_plan p;
  CHECK(kiln_cuda_gemm_plan(&fake, a, b, &p) != 0);

  struct kiln_tensor *all[] = {a, b, o, a2, b2, at, bt, b1, be, aw, an, a6, as, r, re, ob, ot, a1, bb, o11, ak, bk, ok1,
                               c1, c1t, m6, o17};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
}

/* index.cu's walk, played on the CPU: index_select, gather and scatter_add through the geometry
   (element moves at the offsets it gives) against libkiln's kernels, on views. */
static int64_t index_at(const struct kiln_tensor *idx, int64_t off) {
  const char *p = kiln_tensor_data(idx);
  return idx->dtype == KILN_I64 ? ((const int64_t *)p)[off] : ((const int32_t *)p)[off];
}

static int play_index(int op, struct kiln_tensor *written, const struct kiln_tensor *idx, const struct kiln_tensor *read, int d) {
  struct kiln_cuda_index_geom g;
  kiln_cuda_index_geom_build(&g, op, written, idx, read, d);
  char *w = kiln_tensor_data(written);
  const char *r = kiln_tensor_data(read);
  int we = kiln_dtype_size(written->dtype), re = kiln_dtype_size(read->dtype);
  for (int64_t i = 0; i < g.numel; i++) {
    int64_t off[3];
    kiln_cuda_index_offsets(&g, i, off);
    int64_t j = index_at(idx, off[1]);
    if (op == KILN_OP_SCATTER_ADD) {
      char *dst = w + (off[0] + j * g.jump) * we;
      *(float *)dst += *(const float *)(r + off[2] * re);   /* f32 here: index.cu's atomic add */
    } else {
      memcpy(w + off[0] * we, r + (off[2] + j * g.jump) * re, (size_t)we);
    }
  }
  return (int)g.numel;
}

static int same(const struct kiln_tensor *a, const struct kiln_tensor *b) {
  if (!a || !b || a->numel != b->numel) return 0;
  double *x = V(a), *y = V(b);
  int ok = 1;
  for (int64_t i = 0; i < a->numel; i++) ok &= x[i] == y[i] || (x[i] != x[i] && y[i] != y[i]);
  free(x); free(y);
  return ok;
}

static void test_index_geometry(void) {
  struct kiln_tensor *base = seq(3, (int64_t[]){4, 9, 6}, KILN_F32);
  struct kiln_tensor *a = kiln_transpose(base, 0, 2);   /* [6,9,4], non-contiguous */
  double iv[] = {8, 0, 3, 3, 7, 1, 2, 5, 0, 4};
  struct kiln_tensor *ibase = T(1, (int64_t[]){10}, iv, KILN_I64);
  struct kiln_tensor *idx = kiln_narrow(ibase, 0, 1, 9);            /* offset 1 */
  struct kiln_tensor *i32 = kiln_to_dtype(ibase, KILN_I32);
  for (int d = 0; d < 3; d++) {
    struct kiln_tensor *ix = d == 1 ? idx : kiln_narrow(i32, 0, 0, a->sizes[d] < 4 ? a->sizes[d] : 4);
    if (d != 1) {   /* values must fit dims of size 6 and 4 */
      double small[] = {3, 0, 2, 2};
      kiln_tensor_release(ix);
      ix = T(1, (int64_t[]){4}, small, d == 0 ? KILN_I32 : KILN_I64);
    }
    struct kiln_tensor *want = kiln_index_select(a, d, ix);
    struct kiln_tensor *got = want ? kiln_tensor_full(want->ndim, want->sizes, NAN, KILN_F32, CPU) : NULL;
    if (got) play_index(KILN_OP_INDEX_SELECT, got, ix, a, d);
    CHECK(same(got, want));
    kiln_tensor_release(got); kiln_tensor_release(want);
    if (ix != idx) kiln_tensor_release(ix);
  }
  /* gather along each dim with a transposed index, and scatter_add back */
  for (int d = 0; d < 3; d++) {
    int64_t isz[3] = {5, 7, 3};
    isz[d] = 8;
    int64_t n = isz[0] * isz[1] * isz[2];
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = (double)((i * 7 + 3) % a->sizes[d]);
    struct kiln_tensor *ib = T(3, (int64_t[]){isz[2], isz[1], isz[0]}, v, KILN_I64);
    struct kiln_tensor *ix = kiln_permute(ib, 3, (int[]){2, 1, 0});
    free(v);
    /* index sizes must not exceed the input's in the other dims */
    struct kiln_tensor *ixn = kiln_narrow(ix, d == 0 ? 1 : 0, 0, d == 0 ? 7 : 5);
    struct kiln_tensor *want = kiln_gather(a, d, ixn);
    struct kiln_tensor *got = want ? kiln_tensor_full(want->ndim, want->sizes, NAN, KILN_F32, CPU) : NULL;
    if (got) play_index(KILN_OP_GATHER, got, ixn, a, d);
    CHECK(same(got, want));
    struct kiln_tensor *wt = want ? kiln_transpose(want, 0, 2) : NULL, *wc = wt ? kiln_contiguous(wt) : NULL;
    struct kiln_tensor *src = wc ? kiln_transpose(wc, 0, 2) : NULL;   /* a transposed source */
    kiln_tensor_release(wt); kiln_tensor_release(wc);
    struct kiln_tensor *target = kiln_clone(a);
    struct kiln_tensor *want2 = src ? kiln_scatter_add(a, d, ixn, src) : NULL;
    if (want2) play_index(KILN_OP_SCATTER_ADD, target, ixn, src, d);
    CHECK(want2 && same(target, want2));
    kiln_tensor_release(got); kiln_tensor_release(want); kiln_tensor_release(want2); kiln_tensor_release(target);
    kiln_tensor_release(src); kiln_tensor_release(ixn); kiln_tensor_release(ix); kiln_tensor_release(ib);
  }
  /* 0-dim gather */
  struct kiln_tensor *s0 = T(0, NULL, (double[]){2.5}, KILN_F64), *i0 = T(0, NULL, (double[]){0}, KILN_I64);
  struct kiln_tensor *w0 = kiln_gather(s0, 0, i0), *g0 = kiln_tensor_full(0, NULL, NAN, KILN_F64, CPU);
  CHECK(play_index(KILN_OP_GATHER, g0, i0, s0, 0) == 1 && same(g0, w0));
  kiln_tensor_release(s0); kiln_tensor_release(i0); kiln_tensor_release(w0); kiln_tensor_release(g0);
  kiln_tensor_release(a); kiln_tensor_release(base); kiln_tensor_release(idx); kiln_tensor_release(ibase);
  kiln_tensor_release(i32);
}

/* kiln_cuda_vector_width against the rule written out: the widest w <= 16 / size with every
   address a multiple of w * size, and at least two words of n. */
static int width_by_hand(int64_t n, int count, const uintptr_t *addr, const int *size) {
  for (int w = 16; w > 1; w /= 2) {
    int ok = n >= 2 * w;
    for (int i = 0; i < count && ok; i++) ok = w * size[i] <= 16 && addr[i] % (uintptr_t)(w * size[i]) == 0;
    if (ok) return w;
  }
  return 1;
}

static void test_vector_width(void) {
  uintptr_t a[3] = {0x1000, 0x2000, 0x3000};
  int f32[3] = {4, 4, 4}, f64[2] = {8, 8}, cmp[3] = {1, 4, 4};
  CHECK(kiln_cuda_vector_width(1024, 3, a, f32) == 4);    /* f32 x 4: one 16-byte word */
  CHECK(kiln_cuda_vector_width(1024, 2, a, f64) == 2);    /* f64 x 2 */
  CHECK(kiln_cuda_vector_width(1024, 3, a, cmp) == 4);    /* a bool result: 4-byte words of it */
  uintptr_t off[3] = {0x1000, 0x2004, 0x3000};          /* a view one element in */
  CHECK(kiln_cuda_vector_width(1024, 3, off, f32) == 1);
  uintptr_t off8[3] = {0x1000, 0x2008, 0x3000};
  CHECK(kiln_cuda_vector_width(1024, 3, off8, f32) == 2);
  CHECK(kiln_cuda_vector_width(7, 3, a, f32) == 2);       /* too short for two f32 x 4 words */
  CHECK(kiln_cuda_vector_width(1, 3, a, f32) == 1);
  int bad[1] = {0};
  CHECK(kiln_cuda_vector_width(1024, 1, a, bad) == 1);
  /* random addresses and sizes against the rule */
  uint64_t r = 12345;
  int agree = 1;
  for (int t = 0; t < 20000; t++) {
    uintptr_t ad[4];
    int sz[4], count = 1 + (int)(t % 4);
    for (int i = 0; i < count; i++) {
      r = r * 6364136223846793005ULL + 1442695040888963407ULL;
      sz[i] = 1 << (int)((r >> 33) % 4);
      ad[i] = (uintptr_t)((r >> 40) % 4096) * (uintptr_t)sz[i];
    }
    int64_t n = (int64_t)((r >> 20) % 70);
    agree &= kiln_cuda_vector_width(n, count, ad, sz) == width_by_hand(n, count, ad, sz);
  }
  CHECK(agree);
}

int main(void) {
  test_iteration();
  test_launch();
  test_vector_width();
  test_gemm_plans();
  test_index_geometry();
  return check_done("test_cuda_geometry");
}
