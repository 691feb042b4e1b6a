/* test_tensor.c: creation, views (sizes, strides, offsets and values against hand-computed
   index formulas), reference counts, early free, empty tensors, copy_ across every dtype pair,
   and the memory statistics. */
#include "check.h"

/* arange(0, n) as f64, viewed with the given sizes. */
static struct kiln_tensor *iota(int ndim, const int64_t *sizes) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sizes[d];
  struct kiln_tensor *a = kiln_tensor_arange(0, (double)n, 1, KILN_F64, CPU);
  struct kiln_tensor *v = kiln_view(a, ndim, sizes);
  kiln_tensor_release(a);
  return v;
}

static void test_creation(void) {
  /* empty: contiguous strides, its own storage of the right size */
  struct kiln_tensor *e = kiln_tensor_empty(3, (int64_t[]){2, 3, 4}, KILN_F32, CPU);
  CHECK(e && e->ndim == 3 && e->numel == 24 && e->dtype == KILN_F32 && e->offset == 0 && e->refcount == 1);
  CHECK_SIZES(e, 2, 3, 4);
  CHECK_STRIDES(e, 12, 4, 1);
  CHECK(e && e->storage->nbytes == 96 && e->storage->refcount == 1);
  CHECK(e && kiln_is_contiguous(e));
  CHECK(e && strcmp(kiln_shape_string(e), "[2,3,4]") == 0);
  kiln_tensor_release(e);
  CHECK_ERR(kiln_tensor_empty(2, (int64_t[]){2, -1}, KILN_F32, CPU), "negative size");
  CHECK_ERR(kiln_tensor_empty(9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, KILN_F32, CPU), "at most 8");
  CHECK_ERR(kiln_tensor_empty(1, (int64_t[]){2}, 99, CPU), "unknown dtype");
  CHECK_ERR(kiln_tensor_empty(2, (int64_t[]){(int64_t)1 << 40, (int64_t)1 << 40}, KILN_F32, CPU), "do not fit in memory");
  CHECK_ERR(kiln_tensor_empty(1, (int64_t[]){2}, KILN_F32, ((struct kiln_device){7, 0})), "unknown device");

  /* full, in several dtypes */
  static const struct { int dtype; double value, want; } fulls[] = {
    {KILN_F32, 2.5, 2.5}, {KILN_F64, -1e100, -1e100}, {KILN_F16, 0.1, 0.0999755859375}, {KILN_BF16, 3.0, 3.0},
    {KILN_I64, -7, -7}, {KILN_I32, 123456, 123456}, {KILN_U8, 200, 200}, {KILN_BOOL, 0.5, 1},
  };
  for (size_t i = 0; i < sizeof fulls / sizeof fulls[0]; i++) {
    struct kiln_tensor *f = kiln_tensor_full(2, (int64_t[]){3, 5}, fulls[i].value, fulls[i].dtype, CPU);
    double *v = V(f), want[15];
    for (int k = 0; k < 15; k++) want[k] = fulls[i].want;
    CHECK(f && f->dtype == fulls[i].dtype);
    check_arrays(v, want, 15, 0, 0, kiln_dtype_name(fulls[i].dtype), __FILE__, __LINE__);
    free(v);
    kiln_tensor_release(f);
  }
  /* a 0-dim tensor holds one element */
  struct kiln_tensor *s = kiln_tensor_full(0, NULL, 4.25, KILN_F32, CPU);
  double x = 0;
  CHECK(s && s->ndim == 0 && s->numel == 1);
  CHECK(kiln_tensor_item(s, &x) == 0 && x == 4.25);
  CHECK(s && strcmp(kiln_shape_string(s), "[]") == 0);
  kiln_tensor_release(s);

  /* arange */
  struct kiln_tensor *a = kiln_tensor_arange(0, 5, 1, KILN_I64, CPU);
  double *v = V(a);
  CHECK(a && a->dtype == KILN_I64);
  CHECK_SIZES(a, 5);
  CHECK_ARRAY_NEAR(v, ((double[]){0, 1, 2, 3, 4}), 5, 0);
  free(v); kiln_tensor_release(a);
  a = kiln_tensor_arange(1, 2, 0.3, KILN_F64, CPU);   /* ceil(1 / 0.3) = 4 elements */
  v = V(a);
  CHECK_SIZES(a, 4);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 1.3, 1.6, 1.9}), 4, 1e-12);
  free(v); kiln_tensor_release(a);
  a = kiln_tensor_arange(5, 0, -2, KILN_F32, CPU);
  v = V(a);
  CHECK_SIZES(a, 3);
  CHECK_ARRAY_NEAR(v, ((double[]){5, 3, 1}), 3, 0);
  free(v); kiln_tensor_release(a);
  a = kiln_tensor_arange(3, 3, 1, KILN_F32, CPU);
  CHECK(a && a->numel == 0 && a->ndim == 1);
  kiln_tensor_release(a);
  a = kiln_tensor_arange(0, 5, -1, KILN_F32, CPU);   /* the wrong direction: empty, like PyTorch's error-free cases */
  CHECK(a && a->numel == 0);
  kiln_tensor_release(a);
  CHECK_ERR(kiln_tensor_arange(0, 5, 0, KILN_F32, CPU), "step");
  CHECK_ERR(kiln_tensor_arange(0, INFINITY, 1, KILN_F32, CPU), "finite");

  /* linspace: both ends exact */
  a = kiln_tensor_linspace(0, 1, 5, KILN_F64, CPU);
  v = V(a);
  CHECK_ARRAY_NEAR(v, ((double[]){0, 0.25, 0.5, 0.75, 1}), 5, 0);
  free(v); kiln_tensor_release(a);
  a = kiln_tensor_linspace(-1, 0.3, 7, KILN_F64, CPU);
  v = V(a);
  double want7[7];
  for (int i = 0; i < 7; i++) want7[i] = -1 + 1.3 * i / 6;
  CHECK_ARRAY_NEAR(v, want7, 7, 1e-15);
  CHECK(v[0] == -1 && v[6] == 0.3);
  free(v); kiln_tensor_release(a);
  a = kiln_tensor_linspace(2, 9, 1, KILN_F32, CPU);
  v = V(a);
  CHECK(a && a->numel == 1 && v[0] == 2);
  free(v); kiln_tensor_release(a);
  a = kiln_tensor_linspace(2, 9, 0, KILN_F32, CPU);
  CHECK(a && a->numel == 0);
  kiln_tensor_release(a);
  CHECK_ERR(kiln_tensor_linspace(0, 1, -1, KILN_F32, CPU), "negative");

  /* eye */
  a = kiln_tensor_eye(3, -1, KILN_F32, CPU);
  v = V(a);
  CHECK_SIZES(a, 3, 3);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 0, 0, 0, 1, 0, 0, 0, 1}), 9, 0);
  free(v); kiln_tensor_release(a);
  a = kiln_tensor_eye(2, 4, KILN_I32, CPU);
  v = V(a);
  CHECK_SIZES(a, 2, 4);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 0, 0, 0, 0, 1, 0, 0}), 8, 0);
  free(v); kiln_tensor_release(a);
  a = kiln_tensor_eye(4, 2, KILN_BOOL, CPU);
  v = V(a);
  CHECK_ARRAY_NEAR(v, ((double[]){1, 0, 0, 1, 0, 0, 0, 0}), 8, 0);
  free(v); kiln_tensor_release(a);

  /* from_f64, item, get/set */
  const double vals[6] = {1.9, -2.9, 3, 4, 5, 6};
  a = T(2, (int64_t[]){2, 3}, vals, KILN_I32);
  v = V(a);
  CHECK_ARRAY_NEAR(v, ((double[]){1, -2, 3, 4, 5, 6}), 6, 0);
  free(v);
  CHECK(kiln_tensor_get(a, 4) == 5);
  CHECK(kiln_tensor_set(a, 4, -50.7) == 0 && kiln_tensor_get(a, 4) == -50);
  CHECK_ERR(kiln_tensor_item(a, &x), "6 elements");
  kiln_tensor_release(a);
  CHECK_ERR(kiln_tensor_from_f64(1, (int64_t[]){3}, NULL, KILN_F32, CPU), "NULL");
  a = kiln_tensor_from_f64(1, (int64_t[]){0}, NULL, KILN_F32, CPU);   /* nothing to read: fine */
  CHECK(a && a->numel == 0);
  kiln_tensor_release(a);
  a = kiln_tensor_from_f64(2, (int64_t[]){4, 0}, NULL, KILN_F64, CPU);   /* the same dtype: no copy from NULL */
  CHECK(a && a->numel == 0);
  kiln_tensor_release(a);
}

static void test_views(void) {
  struct kiln_tensor *b = iota(3, (int64_t[]){2, 3, 4});   /* b[i][j][k] = 12i + 4j + k */
  CHECK_SIZES(b, 2, 3, 4);
  double *v, want[24];

  /* view with -1 */
  struct kiln_tensor *w = kiln_view(b, 2, (int64_t[]){4, -1});
  CHECK_SIZES(w, 4, 6);
  CHECK_STRIDES(w, 6, 1);
  CHECK(w && w->storage == b->storage);
  v = V(w);
  for (int i = 0; i < 24; i++) want[i] = i;
  CHECK_ARRAY_NEAR(v, want, 24, 0);
  free(v); kiln_tensor_release(w);
  w = kiln_view(b, 4, (int64_t[]){2, 1, 12, 1});
  CHECK_SIZES(w, 2, 1, 12, 1);
  kiln_tensor_release(w);
  CHECK_ERR(kiln_view(b, 2, (int64_t[]){-1, -1}), "only one size may be -1");
  CHECK_ERR(kiln_view(b, 2, (int64_t[]){5, -1}), "[5,-1] is invalid for [2,3,4]");
  CHECK_ERR(kiln_view(b, 2, (int64_t[]){7, 3}), "invalid for [2,3,4]");
  CHECK_ERR(kiln_view(b, 1, (int64_t[]){-3}), "negative size");

  /* transpose: t[k][j][i] = b[i][j][k] */
  struct kiln_tensor *t = kiln_transpose(b, 0, 2);
  CHECK_SIZES(t, 4, 3, 2);
  CHECK_STRIDES(t, 1, 4, 12);
  CHECK(t && !kiln_is_contiguous(t) && t->storage == b->storage);
  v = V(t);
  for (int k = 0; k < 4; k++)
    for (int j = 0; j < 3; j++)
      for (int i = 0; i < 2; i++) want[(k * 3 + j) * 2 + i] = 12 * i + 4 * j + k;
  CHECK_ARRAY_NEAR(v, want, 24, 0);
  free(v);
  struct kiln_tensor *tn = kiln_transpose(b, -1, 0);   /* negative dims count from the end */
  CHECK_STRIDES(tn, 1, 4, 12);
  kiln_tensor_release(tn);
  CHECK_ERR(kiln_transpose(b, 0, 3), "dim 3 out of range");

  /* a view that needs a copy: the message names both shapes */
  struct kiln_tensor *m = iota(2, (int64_t[]){3, 4});
  struct kiln_tensor *mt = kiln_transpose(m, 0, 1);   /* [4,3], strides [1,4] */
  CHECK_ERR(kiln_view(mt, 1, (int64_t[]){12}), "[4,3]");
  CHECK_ERR(kiln_view(mt, 1, (int64_t[]){12}), "[12]");
  CHECK_ERR(kiln_view(mt, 1, (int64_t[]){-1}), "without a copy");
  /* but splitting a dim of a transposed tensor is a view */
  w = kiln_view(mt, 3, (int64_t[]){2, 2, 3});
  CHECK_SIZES(w, 2, 2, 3);
  CHECK_STRIDES(w, 2, 1, 4);
  v = V(w);
  for (int a = 0; a < 2; a++)
    for (int c = 0; c < 2; c++)
      for (int r = 0; r < 3; r++) want[(a * 2 + c) * 3 + r] = 4 * r + (2 * a + c);
  CHECK_ARRAY_NEAR(v, want, 12, 0);
  free(v); kiln_tensor_release(w);

  /* reshape: a view when possible, else a copy in row-major order of the source */
  w = kiln_reshape(b, 2, (int64_t[]){6, 4});
  CHECK(w && w->storage == b->storage);
  CHECK_STRIDES(w, 4, 1);
  kiln_tensor_release(w);
  w = kiln_reshape(mt, 1, (int64_t[]){-1});
  CHECK_SIZES(w, 12);
  CHECK(w && w->storage != m->storage && kiln_is_contiguous(w));
  v = V(w);
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 3; c++) want[r * 3 + c] = 4 * c + r;
  CHECK_ARRAY_NEAR(v, want, 12, 0);
  free(v); kiln_tensor_release(w);
  CHECK_ERR(kiln_reshape(mt, 1, (int64_t[]){13}), "invalid");

  /* permute: p[k][i][j] = b[i][j][k] */
  struct kiln_tensor *p = kiln_permute(b, 3, (int[]){2, 0, 1});
  CHECK_SIZES(p, 4, 2, 3);
  CHECK_STRIDES(p, 1, 12, 4);
  v = V(p);
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 3; j++) want[(k * 2 + i) * 3 + j] = 12 * i + 4 * j + k;
  CHECK_ARRAY_NEAR(v, want, 24, 0);
  free(v); kiln_tensor_release(p);
  CHECK_ERR(kiln_permute(b, 3, (int[]){0, 0, 1}), "repeated");
  CHECK_ERR(kiln_permute(b, 2, (int[]){0, 1}), "2 dims given");

  /* narrow: n[i][j][k] = b[i][j + 1][k], j < 2 */
  struct kiln_tensor *n = kiln_narrow(b, 1, 1, 2);
  CHECK_SIZES(n, 2, 2, 4);
  CHECK_STRIDES(n, 12, 4, 1);
  CHECK(n && n->offset == 4 && n->numel == 16 && !kiln_is_contiguous(n));
  v = V(n);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 4; k++) want[(i * 2 + j) * 4 + k] = 12 * i + 4 * (j + 1) + k;
  CHECK_ARRAY_NEAR(v, want, 16, 0);
  free(v);
  /* narrow of the transposed: tn2[k][j][i] = b[i][j][k + 1], k < 3 */
  struct kiln_tensor *tn2 = kiln_narrow(t, 0, -3, 3);
  CHECK_SIZES(tn2, 3, 3, 2);
  CHECK(tn2 && tn2->offset == 1);
  v = V(tn2);
  for (int k = 0; k < 3; k++)
    for (int j = 0; j < 3; j++)
      for (int i = 0; i < 2; i++) want[(k * 3 + j) * 2 + i] = 12 * i + 4 * j + k + 1;
  CHECK_ARRAY_NEAR(v, want, 18, 0);
  free(v); kiln_tensor_release(tn2);
  CHECK_ERR(kiln_narrow(b, 1, 2, 2), "out of range");
  CHECK_ERR(kiln_narrow(b, 2, 0, -1), "out of range");
  struct kiln_tensor *n0 = kiln_narrow(b, 2, 4, 0);   /* an empty slice at the end is allowed */
  CHECK(n0 && n0->numel == 0);
  CHECK_SIZES(n0, 2, 3, 0);
  kiln_tensor_release(n0);

  /* select */
  struct kiln_tensor *s = kiln_select(b, 1, 2);   /* s[i][k] = b[i][2][k] */
  CHECK_SIZES(s, 2, 4);
  CHECK_STRIDES(s, 12, 1);
  CHECK(s && s->offset == 8);
  v = V(s);
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 4; k++) want[i * 4 + k] = 12 * i + 8 + k;
  CHECK_ARRAY_NEAR(v, want, 8, 0);
  free(v); kiln_tensor_release(s);
  s = kiln_select(n, -1, -1);   /* s[i][j] = n[i][j][3] = b[i][j + 1][3] */
  CHECK_SIZES(s, 2, 2);
  v = V(s);
  CHECK_ARRAY_NEAR(v, ((double[]){7, 11, 19, 23}), 4, 0);
  free(v); kiln_tensor_release(s);
  CHECK_ERR(kiln_select(b, 0, 2), "index 2 out of range for dim 0 of size 2");
  CHECK_ERR(kiln_select(b, 0, -3), "out of range");
  struct kiln_tensor *s1 = kiln_select(b, 0, 1), *s2 = kiln_select(s1, 0, 0);   /* s2[k] = b[1][0][k] */
  CHECK_SIZES(s2, 4);
  CHECK(s2 && s2->offset == 12 && s2->ndim == 1);
  struct kiln_tensor *s3 = kiln_select(s2, 0, 3);   /* a 0-dim view */
  double x3 = 0;
  CHECK(s3 && s3->ndim == 0 && kiln_tensor_item(s3, &x3) == 0 && x3 == 15);
  CHECK_ERR(kiln_select(s3, 0, 0), "0-dim");
  kiln_tensor_release(s3); kiln_tensor_release(s2); kiln_tensor_release(s1);
  kiln_tensor_release(n);

  /* squeeze / unsqueeze */
  struct kiln_tensor *u = kiln_unsqueeze(m, 1);   /* [3,1,4] */
  CHECK_SIZES(u, 3, 1, 4);
  CHECK_STRIDES(u, 4, 4, 1);
  struct kiln_tensor *u2 = kiln_unsqueeze(u, -1);   /* [3,1,4,1] */
  CHECK_SIZES(u2, 3, 1, 4, 1);
  CHECK_STRIDES(u2, 4, 4, 1, 1);
  struct kiln_tensor *q = kiln_squeeze(u2, 1);
  CHECK_SIZES(q, 3, 4, 1);
  kiln_tensor_release(q);
  q = kiln_squeeze(u2, 0);   /* size 3: nothing to squeeze */
  CHECK_SIZES(q, 3, 1, 4, 1);
  kiln_tensor_release(q);
  q = kiln_squeeze_all(u2);
  CHECK_SIZES(q, 3, 4);
  CHECK_STRIDES(q, 4, 1);
  v = V(q);
  for (int i = 0; i < 12; i++) want[i] = i;
  CHECK_ARRAY_NEAR(v, want, 12, 0);
  free(v); kiln_tensor_release(q);
  q = kiln_unsqueeze(mt, 0);   /* [1,4,3] over a transposed tensor */
  CHECK_SIZES(q, 1, 4, 3);
  v = V(q);
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 3; c++) want[r * 3 + c] = 4 * c + r;
  CHECK_ARRAY_NEAR(v, want, 12, 0);
  free(v); kiln_tensor_release(q);
  CHECK_ERR(kiln_unsqueeze(m, 3), "out of range");
  CHECK_ERR(kiln_squeeze(m, 2), "out of range");
  kiln_tensor_release(u); kiln_tensor_release(u2);

  /* expand: x[3,1] to [2,3,4]: e[a][i][k] = x[i] */
  struct kiln_tensor *col = T(2, (int64_t[]){3, 1}, (double[]){10, 20, 30}, KILN_F32);
  struct kiln_tensor *ex = kiln_expand(col, 3, (int64_t[]){2, 3, 4});
  CHECK_SIZES(ex, 2, 3, 4);
  CHECK_STRIDES(ex, 0, 1, 0);
  CHECK(ex && ex->storage == col->storage && ex->numel == 24);
  v = V(ex);
  for (int a = 0; a < 2; a++)
    for (int i = 0; i < 3; i++)
      for (int k = 0; k < 4; k++) want[(a * 3 + i) * 4 + k] = 10.0 * (i + 1);
  CHECK_ARRAY_NEAR(v, want, 24, 0);
  free(v); kiln_tensor_release(ex);
  ex = kiln_expand(col, 2, (int64_t[]){-1, 5});
  CHECK_SIZES(ex, 3, 5);
  kiln_tensor_release(ex);
  CHECK_ERR(kiln_expand(col, 2, (int64_t[]){4, 4}), "cannot expand [3,1] to [4,4]");
  CHECK_ERR(kiln_expand(col, 1, (int64_t[]){3}), "cannot expand");
  kiln_tensor_release(col);

  /* flatten */
  struct kiln_tensor *f = kiln_flatten(b, 1, 2);
  CHECK_SIZES(f, 2, 12);
  CHECK(f && f->storage == b->storage);
  kiln_tensor_release(f);
  f = kiln_flatten(b, 0, -1);
  CHECK_SIZES(f, 24);
  kiln_tensor_release(f);
  f = kiln_flatten(t, 0, 1);   /* [4,3,2] transposed: [12,2], a copy */
  CHECK_SIZES(f, 12, 2);
  v = V(f);
  for (int k = 0; k < 4; k++)
    for (int j = 0; j < 3; j++)
      for (int i = 0; i < 2; i++) want[(k * 3 + j) * 2 + i] = 12 * i + 4 * j + k;
  CHECK_ARRAY_NEAR(v, want, 24, 0);
  free(v); kiln_tensor_release(f);
  CHECK_ERR(kiln_flatten(b, 2, 1), "start dim");

  /* contiguous: the same tensor when it already is, else a row-major copy */
  struct kiln_tensor *c = kiln_contiguous(b);
  CHECK(c == b && b->refcount == 2);
  kiln_tensor_release(c);
  c = kiln_contiguous(t);
  CHECK(c && c != t && c->storage != t->storage && kiln_is_contiguous(c));
  CHECK_SIZES(c, 4, 3, 2);
  CHECK_STRIDES(c, 6, 2, 1);
  v = V(c);
  for (int k = 0; k < 4; k++)
    for (int j = 0; j < 3; j++)
      for (int i = 0; i < 2; i++) want[(k * 3 + j) * 2 + i] = 12 * i + 4 * j + k;
  CHECK_ARRAY_NEAR(v, want, 24, 0);
  free(v); kiln_tensor_release(c);

  /* alias: a new header over the same view */
  struct kiln_tensor *al = kiln_alias(t);
  CHECK(al && al != t && al->storage == t->storage && al->offset == t->offset);
  CHECK_STRIDES(al, 1, 4, 12);
  kiln_tensor_release(al);

  kiln_tensor_release(t); kiln_tensor_release(mt); kiln_tensor_release(m);
  kiln_tensor_release(b);
}

static void test_refcounts(void) {
  struct kiln_tensor *i = iota(2, (int64_t[]){3, 4});
  CHECK(i->base && !i->base->base);           /* iota views an arange */
  struct kiln_tensor *b = kiln_clone(i);      /* not a view */
  kiln_tensor_release(i);
  struct kiln_storage *st = b->storage;
  CHECK(st->refcount == 1 && !b->base);
  struct kiln_tensor *t = kiln_transpose(b, 0, 1);
  struct kiln_tensor *n = kiln_narrow(b, 0, 1, 2);
  /* views share the storage and hold their base (an in-place op on a view changes the base too) */
  CHECK(st->refcount == 3 && b->refcount == 3 && t->base == b && n->base == b);
  struct kiln_tensor *s = kiln_select(n, 0, 0);   /* a view of a view holds the first one's base */
  CHECK(s && s->base == b && b->refcount == 4 && n->refcount == 1);
  kiln_tensor_release(s);
  CHECK(b->refcount == 3 && st->refcount == 3);
  kiln_tensor_retain(b);
  CHECK(b->refcount == 4);
  kiln_tensor_release(b);
  kiln_tensor_release(b);   /* the caller lets go of the base; its views keep it, and the storage, alive */
  CHECK(b->refcount == 2 && st->refcount == 3);
  double *v = V(t), want[12];
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 3; c++) want[r * 3 + c] = 4 * c + r;
  CHECK_ARRAY_NEAR(v, want, 12, 0);
  free(v);
  kiln_tensor_release(t);
  CHECK(st->refcount == 2 && b->refcount == 1);
  v = V(n);
  for (int i = 0; i < 8; i++) want[i] = 4 + i;
  CHECK_ARRAY_NEAR(v, want, 8, 0);
  free(v);
  /* kiln_ref: the handle Lua holds */
  struct kiln_ref ref = {n};
  kiln_ref_release(&ref);
  CHECK(ref.p == NULL);
  kiln_ref_release(&ref);   /* twice is harmless */
  kiln_tensor_release(NULL);
  kiln_tensor_retain(NULL);
  /* a view past 2^63 elements is an error, not a negative element count */
  {
    struct kiln_tensor *x = kiln_tensor_empty(1, (int64_t[]){3}, KILN_F32, (struct kiln_device){KILN_CPU, 0});
    struct kiln_tensor *e = kiln_expand(x, 2, (int64_t[]){(int64_t)1 << 62, 3});
    CHECK(e == NULL && strstr(kiln_error_message(), "expand: [3] to [4611686018427387904,3] would have more than 2^63 elements"));
    e = kiln_expand(x, 3, (int64_t[]){(int64_t)1 << 40, (int64_t)1 << 20, 3});   /* 3 * 2^60: fits */
    CHECK(e != NULL && e->numel == (int64_t)3 << 60);
    kiln_tensor_release(e);
    kiln_tensor_release(x);
  }
  /* NULL arrays and outputs with a nonzero count are errors, not reads through NULL */
  {
    struct kiln_tensor *x = kiln_tensor_full(2, (int64_t[]){2, 3}, 1, KILN_F32, (struct kiln_device){KILN_CPU, 0});
    CHECK(kiln_view(x, 2, NULL) == NULL && strstr(kiln_error_message(), "view: the sizes are NULL for 2 dims"));
    CHECK(kiln_reshape(x, 1, NULL) == NULL && strstr(kiln_error_message(), "reshape: the sizes are NULL"));
    CHECK(kiln_expand(x, 2, NULL) == NULL && strstr(kiln_error_message(), "expand: the sizes are NULL"));
    CHECK(kiln_permute(x, 2, NULL) == NULL && strstr(kiln_error_message(), "permute: the dims are NULL"));
    CHECK(kiln_tensor_to_f64(x, NULL) != KILN_OK && strstr(kiln_error_message(), "to_f64: out is NULL"));
    CHECK(kiln_scatter_add(NULL, 0, NULL, NULL) == NULL);
    CHECK(isnan(kiln_tensor_get(NULL, 0)));
    kiln_sample_philox(1, 0, 0, 0, NULL);   /* nothing to write to: nothing written */
    CHECK(kiln_view(x, 0, NULL) == NULL);  /* 0 dims of 6 elements: a shape error, not a NULL read */
    kiln_tensor_release(x);
  }
  /* the predicates answer for no tensor too */
  CHECK(kiln_is_contiguous(NULL) == 0);
  CHECK(kiln_tensor_is_freed(NULL) == 0);
  CHECK(kiln_tensor_is_pinned(NULL) == 0);
}

static void test_free(void) {
  struct kiln_memory_stats *ms = kiln_memory_stats(KILN_CPU);
  int64_t live0 = ms->live_bytes;
  struct kiln_tensor *a = kiln_tensor_full(1, (int64_t[]){10000}, 1, KILN_F32, CPU);
  struct kiln_tensor *v = kiln_narrow(a, 0, 10, 20);
  struct kiln_tensor *b = kiln_tensor_full(1, (int64_t[]){20}, 2, KILN_F32, CPU);
  CHECK(ms->live_bytes == live0 + 40000 + 80);
  CHECK(!kiln_tensor_is_freed(a));
  kiln_tensor_free(a);
  CHECK(kiln_tensor_is_freed(a) && kiln_tensor_is_freed(v));
  CHECK(ms->live_bytes == live0 + 80);   /* released at once, not when the headers go */
  CHECK_ERR(kiln_unary(KILN_OP_NEG, a), "freed");
  CHECK_ERR(kiln_unary(KILN_OP_NEG, a), "neg");
  CHECK_ERR(kiln_binary(KILN_OP_ADD, b, v), "freed");
  CHECK_ERR(kiln_reduce(KILN_OP_SUM, a, 0, NULL, 0, 0), "freed");
  CHECK_ERR(kiln_view(a, 2, (int64_t[]){100, 100}), "freed");
  CHECK_ERR(kiln_transpose(v, 0, 0), "freed");
  CHECK_ERR(kiln_clone(v), "freed");
  CHECK_ERR(kiln_copy_(v, b), "freed");
  CHECK_ERR(kiln_copy_(b, v), "freed");
  CHECK_ERR(kiln_fill_(a, 3), "freed");
  CHECK_ERR(kiln_uniform_(a, 0, 1), "freed");
  CHECK_ERR(kiln_matmul(v, v), "freed");
  CHECK_ERR(kiln_cat(2, (struct kiln_tensor *[]){b, v}, 0), "freed");
  double x;
  CHECK_ERR(kiln_tensor_to_f64(v, &x), "freed");
  CHECK_ERR(kiln_tensor_item(v, &x), "freed");
  CHECK_ERR(kiln_tensor_set(v, 0, 1), "freed");
  /* the process goes on: the next op on another tensor works */
  struct kiln_tensor *c = kiln_binary(KILN_OP_ADD, b, b);
  double *cv = V(c), want[20];
  for (int i = 0; i < 20; i++) want[i] = 4;
  CHECK_ARRAY_NEAR(cv, want, 20, 0);
  free(cv);
  kiln_tensor_free(a);   /* twice: nothing more happens */
  CHECK(ms->live_bytes == live0 + 160);
  kiln_tensor_release(v); kiln_tensor_release(a);
  kiln_tensor_release(b); kiln_tensor_release(c);
  CHECK(ms->live_bytes == live0);
  /* a small (inline) storage freed early */
  struct kiln_tensor *s = kiln_tensor_full(1, (int64_t[]){3}, 1, KILN_F64, CPU);
  kiln_tensor_free(s);
  CHECK(ms->live_bytes == live0);
  CHECK_ERR(kiln_unary(KILN_OP_EXP, s), "freed");
  kiln_tensor_release(s);
  CHECK(ms->live_bytes == live0);
}

static void test_empty(void) {
  struct kiln_tensor *e = kiln_tensor_empty(3, (int64_t[]){3, 0, 2}, KILN_F32, CPU);
  CHECK(e && e->numel == 0);
  CHECK(e && kiln_is_contiguous(e));
  struct kiln_tensor *e2 = kiln_tensor_empty(2, (int64_t[]){3, 0}, KILN_F32, CPU);
  CHECK(e2 && kiln_is_contiguous(e2));   /* a fresh tensor is contiguous, whatever its sizes */
  struct kiln_tensor *c = kiln_contiguous(e2);
  CHECK(c == e2);
  kiln_tensor_release(c);
  kiln_tensor_release(e2);
  struct kiln_tensor *w = kiln_view(e, 2, (int64_t[]){0, 6});
  CHECK_SIZES(w, 0, 6);
  kiln_tensor_release(w);
  w = kiln_view(e, 2, (int64_t[]){5, 0});
  CHECK_SIZES(w, 5, 0);
  kiln_tensor_release(w);
  CHECK_ERR(kiln_view(e, 2, (int64_t[]){-1, 0}), "invalid");
  w = kiln_transpose(e, 0, 2);
  CHECK_SIZES(w, 2, 0, 3);
  struct kiln_tensor *cl = kiln_clone(w);
  CHECK(cl && cl->numel == 0);
  CHECK_SIZES(cl, 2, 0, 3);
  kiln_tensor_release(cl);
  cl = kiln_reshape(w, 2, (int64_t[]){0, 7});
  CHECK_SIZES(cl, 0, 7);
  kiln_tensor_release(cl);
  kiln_tensor_release(w);
  CHECK(kiln_fill_(e, 5) == 0);
  double x = 42;
  CHECK(kiln_tensor_to_f64(e, &x) == 0 && x == 42);   /* nothing written */
  w = kiln_select(e, 2, 1);
  CHECK_SIZES(w, 3, 0);
  kiln_tensor_release(w);
  w = kiln_expand(e, 4, (int64_t[]){4, 3, 0, 2});
  CHECK_SIZES(w, 4, 3, 0, 2);
  CHECK(w && w->numel == 0);
  kiln_tensor_release(w);
  struct kiln_tensor *one = kiln_tensor_full(2, (int64_t[]){1, 2}, 1, KILN_F32, CPU);
  CHECK(kiln_copy_(e, one) == 0);   /* broadcasts to nothing */
  w = kiln_expand(one, 2, (int64_t[]){0, 2});
  CHECK_SIZES(w, 0, 2);
  kiln_tensor_release(w);
  kiln_tensor_release(one);
  w = kiln_to_dtype(e, KILN_I64);
  CHECK(w && w->dtype == KILN_I64 && w->numel == 0);
  kiln_tensor_release(w);
  kiln_tensor_release(e);
}

/* Value after conversion to dtype, for the values used below (exact in every float dtype). */
static double as_dtype(double v, int dtype) {
  if (dtype == KILN_BOOL) return v != 0;
  if (!kiln_dtype_is_float(dtype)) return trunc(v);
  return v;
}

static void test_copy(void) {
  /* src [3,1] broadcast into dst [2,3,4], for every pair of dtypes, into a contiguous and a
     transposed destination. */
  const double vals[3] = {0, 1.5, 5.25};
  for (int sd = 0; sd < KILN_DTYPE_COUNT; sd++)
    for (int dd = 0; dd < KILN_DTYPE_COUNT; dd++) {
      struct kiln_tensor *src = T(2, (int64_t[]){3, 1}, vals, sd);
      struct kiln_tensor *dst = kiln_tensor_full(3, (int64_t[]){2, 3, 4}, 9, dd, CPU);
      double want[24];
      for (int a = 0; a < 2; a++)
        for (int i = 0; i < 3; i++)
          for (int k = 0; k < 4; k++) want[(a * 3 + i) * 4 + k] = as_dtype(as_dtype(vals[i], sd), dd);
      int rc = kiln_copy_(dst, src);
      double *v = V(dst);
      char what[64];
      snprintf(what, sizeof what, "copy %s -> %s", kiln_dtype_name(sd), kiln_dtype_name(dd));
      check_report(rc == 0, __FILE__, __LINE__, "%s: %s", what, kiln_error_message());
      check_arrays(v, want, 24, 0, 0, what, __FILE__, __LINE__);
      free(v);
      /* into a transposed view [3,2] of a [2,3] tensor, from a [3,1] column */
      struct kiln_tensor *base = kiln_tensor_full(2, (int64_t[]){2, 3}, 9, dd, CPU);
      struct kiln_tensor *tv = kiln_transpose(base, 0, 1);
      rc = kiln_copy_(tv, src);
      v = V(base);   /* base[a][i] = src[i] */
      double want2[6];
      for (int a = 0; a < 2; a++)
        for (int i = 0; i < 3; i++) want2[a * 3 + i] = as_dtype(as_dtype(vals[i], sd), dd);
      check_report(rc == 0, __FILE__, __LINE__, "%s (transposed): %s", what, kiln_error_message());
      check_arrays(v, want2, 6, 0, 0, what, __FILE__, __LINE__);
      free(v);
      kiln_tensor_release(tv); kiln_tensor_release(base);
      kiln_tensor_release(src); kiln_tensor_release(dst);
    }

  /* a strided source (every other column) into a contiguous destination */
  struct kiln_tensor *m = iota(2, (int64_t[]){4, 6});
  struct kiln_tensor *cols = kiln_view(m, 3, (int64_t[]){4, 3, 2});
  struct kiln_tensor *even = kiln_select(cols, 2, 0);   /* [4,3], strides [6,2] */
  struct kiln_tensor *d = kiln_tensor_empty(2, (int64_t[]){4, 3}, KILN_F16, CPU);
  CHECK(kiln_copy_(d, even) == 0);
  double *v = V(d), want[12];
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 3; c++) want[r * 3 + c] = 6 * r + 2 * c;
  CHECK_ARRAY_NEAR(v, want, 12, 0);
  free(v);
  /* a copy that does not broadcast names both shapes */
  struct kiln_tensor *wrong = kiln_tensor_empty(2, (int64_t[]){3, 4}, KILN_F32, CPU);
  CHECK_ERR(kiln_copy_(d, wrong), "[3,4]");
  CHECK_ERR(kiln_copy_(d, wrong), "[4,3]");
  struct kiln_tensor *big = kiln_tensor_empty(3, (int64_t[]){2, 4, 3}, KILN_F32, CPU);
  CHECK_ERR(kiln_copy_(d, big), "does not broadcast to destination [4,3]");
  /* version counter: bumped by every in-place write */
  int64_t ver = d->storage->version;
  CHECK(kiln_fill_(d, 1) == 0 && d->storage->version == ver + 1);
  /* clone: same values, new storage */
  struct kiln_tensor *cl = kiln_clone(even);
  CHECK(cl && cl->storage != m->storage && kiln_is_contiguous(cl) && cl->dtype == KILN_F64);
  v = V(cl);
  CHECK_ARRAY_NEAR(v, want, 12, 0);
  free(v);
  kiln_tensor_release(cl);
  kiln_tensor_release(big); kiln_tensor_release(wrong); kiln_tensor_release(d);
  kiln_tensor_release(even); kiln_tensor_release(cols); kiln_tensor_release(m);
}

static void test_memory_stats(void) {
  struct kiln_memory_stats *ms = kiln_memory_stats(KILN_CPU);
  CHECK(ms != NULL);
  CHECK(kiln_memory_stats(-1) == NULL && kiln_memory_stats(KILN_DEVICE_TYPE_COUNT) == NULL);
  int64_t live = ms->live_bytes, allocs = ms->allocs, frees = ms->frees;
  kiln_memory_collected();
  CHECK(ms->since_collect == 0);
  struct kiln_tensor *a = kiln_tensor_empty(2, (int64_t[]){1000, 3}, KILN_F64, CPU);   /* 24000 bytes */
  CHECK(ms->live_bytes == live + 24000);
  CHECK(ms->allocs == allocs + 1);
  CHECK(ms->since_collect == 24000);
  CHECK(ms->peak_bytes >= ms->live_bytes);
  struct kiln_tensor *s = kiln_tensor_empty(1, (int64_t[]){5}, KILN_I32, CPU);   /* 20 bytes, inline */
  CHECK(ms->live_bytes == live + 24020);
  struct kiln_tensor *v = kiln_transpose(a, 0, 1);   /* a view allocates no storage */
  CHECK(ms->live_bytes == live + 24020 && ms->allocs == allocs + 2);
  kiln_tensor_release(a);
  CHECK(ms->live_bytes == live + 24020);   /* the view still holds it */
  kiln_tensor_release(v);
  CHECK(ms->live_bytes == live + 20);
  CHECK(ms->since_collect == 20);   /* what the runtime freed needs no collection */
  kiln_tensor_release(s);
  CHECK(ms->live_bytes == live);
  CHECK(ms->since_collect == 0);
  CHECK(ms->frees == frees + 2);
  /* a storage allocated before the last collection, freed after it: since_collect stays at 0 */
  struct kiln_tensor *old = kiln_tensor_empty(1, (int64_t[]){1000}, KILN_F32, CPU);
  kiln_memory_collected();
  kiln_tensor_release(old);
  CHECK(ms->since_collect == 0);
  kiln_memory_collected();
  CHECK(ms->since_collect == 0);
  int64_t th = ms->threshold;
  kiln_memory_set_threshold(KILN_CPU, 12345);
  CHECK(ms->threshold == 12345);
  kiln_memory_set_threshold(KILN_CPU, -1);   /* ignored */
  CHECK(ms->threshold == 12345);
  kiln_memory_set_threshold(KILN_CPU, th);
  /* 0-byte tensors are counted as 0 bytes */
  struct kiln_tensor *z = kiln_tensor_empty(1, (int64_t[]){0}, KILN_F32, CPU);
  CHECK(ms->live_bytes == live);
  kiln_tensor_release(z);
  CHECK(ms->live_bytes == live);
}

static void test_devices(void) {
  struct kiln_device d;
  CHECK(kiln_device_parse("cpu", &d) == 0 && d.type == KILN_CPU && d.index == 0);
  CHECK(kiln_device_parse("cuda", &d) == 0 && d.type == KILN_CUDA && d.index == 0);
  CHECK(kiln_device_parse("cuda:3", &d) == 0 && d.type == KILN_CUDA && d.index == 3);
  CHECK_ERR(kiln_device_parse("gpu", &d), "unknown device \"gpu\"");
  CHECK_ERR(kiln_device_parse("cuda:", &d), "unknown device");
  CHECK_ERR(kiln_device_parse("cuda:x", &d), "unknown device");
  CHECK(strcmp(kiln_device_name(CPU), "cpu") == 0);
  CHECK(strcmp(kiln_device_name((struct kiln_device){KILN_CUDA, 2}), "cuda:2") == 0);
  CHECK(kiln_device_available(CPU) == 1);
  struct kiln_device cuda9 = {KILN_CUDA, 9};
  if (!kiln_device_available(cuda9)) {
    struct kiln_tensor *t = kiln_tensor_full(1, (int64_t[]){2}, 1, KILN_F32, CPU);
    CHECK_ERR(kiln_to_device(t, cuda9), "cuda:9");
    CHECK_ERR(kiln_tensor_empty(1, (int64_t[]){2}, KILN_F32, cuda9), "cuda:9");
    struct kiln_tensor *same = kiln_to_device(t, CPU);
    CHECK(same == t);
    kiln_tensor_release(same);
    kiln_tensor_release(t);
  }
}

int main(void) {
  struct kiln_memory_stats *ms = kiln_memory_stats(KILN_CPU);
  int64_t live0 = ms->live_bytes;
  test_creation();
  test_views();
  test_refcounts();
  test_free();
  test_empty();
  test_copy();
  test_memory_stats();
  test_devices();
  CHECK(ms->live_bytes == live0);   /* every tensor of the tests was released */
  return check_done("test_tensor");
}
