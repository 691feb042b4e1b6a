/* cpu/index.c: cat's copies aside, the indexing kernels: index_select, gather, scatter_add,
   masked_fill, masked_select. Every index is checked before anything is written. */
#include "cpu.h"
#include <string.h>

/* Walks every position of a shape, keeping element offsets into up to three tensors. */
struct walk {
  int ndim;
  int64_t sizes[KILN_MAX_DIMS], idx[KILN_MAX_DIMS];
  int64_t strides[3][KILN_MAX_DIMS];
  int64_t off[3];
  int n;
};

static void walk_init(struct walk *w, int ndim, const int64_t *sizes, int n, const struct kiln_tensor *const *ts) {
  memset(w, 0, sizeof *w);
  w->ndim = ndim;
  w->n = n;
  memcpy(w->sizes, sizes, sizeof(int64_t) * (size_t)ndim);
  for (int k = 0; k < n; k++) {
    w->off[k] = ts[k]->offset;
    for (int d = 0; d < ndim; d++) w->strides[k][d] = ts[k]->strides[d];
  }
}

static void walk_next(struct walk *w) {
  for (int d = w->ndim - 1; d >= 0; d--) {
    w->idx[d]++;
    for (int k = 0; k < w->n; k++) w->off[k] += w->strides[k][d];
    if (w->idx[d] < w->sizes[d]) return;
    for (int k = 0; k < w->n; k++) w->off[k] -= w->strides[k][d] * w->sizes[d];
    w->idx[d] = 0;
  }
}

static int64_t load_index(const struct kiln_tensor *t, int64_t off) {
  const char *p = t->storage->data;
  return t->dtype == KILN_I64 ? ((const int64_t *)p)[off] : ((const int32_t *)p)[off];
}

static char *elem(const struct kiln_tensor *t, int64_t off) {
  return (char *)t->storage->data + off * kiln_dtype_size(t->dtype);
}

/* Check every index of idx against size; 0 or an error naming the first bad one. */
static int check_indices(const char *op, const struct kiln_tensor *idx, int64_t size, int d, const struct kiln_tensor *a) {
  struct walk w;
  walk_init(&w, idx->ndim, idx->sizes, 1, &idx);
  for (int64_t i = 0; i < idx->numel; i++, walk_next(&w)) {
    int64_t v = load_index(idx, w.off[0]);
    if (v < 0 || v >= size)
      return kiln_fail(KILN_ERR_INDEX, "%s: index %lld out of range for dim %d of size %lld (tensor %s; C counts from 0)", op,
                       (long long)v, d, (long long)size, kiln_shape_string(a));
  }
  return KILN_OK;
}

int cpu_index_select(const struct kiln_call *c) {
  const struct kiln_tensor *a = c->in[0], *idx = c->in[1];
  struct kiln_tensor *out = c->out;
  int d = (int)c->ints[0];
  if (a->ndim == 0) return check_indices("index_select", idx, 1, 0, a) ? kiln_error_code() : kiln_cpu_copy(out, a);
  if (check_indices("index_select", idx, a->sizes[d], d, a)) return kiln_error_code();
  /* One slice per index: headers on the stack over the same storages. */
  struct kiln_tensor src = *a, dst = *out;
  src.ndim = dst.ndim = a->ndim;
  src.sizes[d] = dst.sizes[d] = 1;
  src.numel = dst.numel = a->sizes[d] ? a->numel / a->sizes[d] : 0;
  if (a->sizes[d] == 0) { src.numel = 1; for (int k = 0; k < a->ndim; k++) if (k != d) src.numel *= a->sizes[k]; dst.numel = src.numel; }
  int64_t istride = idx->ndim ? idx->strides[0] : 0;
  int rowcopy = kiln_is_contiguous(a) && kiln_is_contiguous(out) && d == 0;
  size_t rowbytes = (size_t)(src.numel * kiln_dtype_size(a->dtype));
  for (int64_t i = 0; i < idx->numel; i++) {
    int64_t j = load_index(idx, idx->offset + i * istride);
    if (rowcopy) {
      memcpy(elem(out, out->offset + i * out->strides[0]), elem(a, a->offset + j * a->strides[0]), rowbytes);
      continue;
    }
    src.offset = a->offset + j * a->strides[d];
    dst.offset = out->offset + i * out->strides[d];
    kiln_cpu_copy(&dst, &src);
  }
  return KILN_OK;
}

int cpu_gather(const struct kiln_call *c) {
  const struct kiln_tensor *a = c->in[0], *idx = c->in[1];
  struct kiln_tensor *out = c->out;
  int d = (int)c->ints[0];
  int64_t size = a->ndim ? a->sizes[d] : 1;
  if (check_indices("gather", idx, size, d, a)) return kiln_error_code();
  const struct kiln_tensor *ts[3] = {out, idx, a};
  struct walk w;
  walk_init(&w, idx->ndim, idx->sizes, 3, ts);
  /* a's offset walks with every dim but d; d comes from the index. */
  if (a->ndim) w.strides[2][d] = 0;
  int es = kiln_dtype_size(a->dtype);
  for (int64_t i = 0; i < idx->numel; i++, walk_next(&w)) {
    int64_t j = load_index(idx, w.off[1]);
    memcpy(elem(out, w.off[0]), elem(a, w.off[2] + (a->ndim ? j * a->strides[d] : 0)), (size_t)es);
  }
  return KILN_OK;
}

/* scatter_add along dim 0 of whole rows: a and src contiguous in f32 or f64, the index one value
   per row of src expanded along the rest (index_select's backward, an embedding's among them).
   Returns 1 when it did the work (or failed on a bad index), 0 when the general walk must. */
static int scatter_add_rows(const struct kiln_tensor *idx, const struct kiln_tensor *src, struct kiln_tensor *a, int d,
                            int *rc) {
  if (d != 0 || a->ndim < 1 || a->dtype != src->dtype || (a->dtype != KILN_F32 && a->dtype != KILN_F64) ||
      !kiln_is_contiguous(a) || !kiln_is_contiguous(src) || idx->ndim != src->ndim || a->ndim != src->ndim ||
      a->storage == src->storage)
    return 0;
  int64_t rows = idx->sizes[0], width = 1;   /* idx may have fewer rows than src, never more */
  if (rows > src->sizes[0]) return 0;
  for (int k = 1; k < idx->ndim; k++) {
    if (idx->strides[k] != 0 || idx->sizes[k] != src->sizes[k] || src->sizes[k] != a->sizes[k]) return 0;
    width *= src->sizes[k];
  }
  /* every index checked before anything is written: one per row, as a column of idx */
  struct kiln_tensor col = *idx;
  col.ndim = 1;
  col.numel = rows;
  *rc = check_indices("scatter_add", &col, a->sizes[0], 0, a) ? kiln_error_code() : KILN_OK;
  if (*rc) return 1;
  for (int64_t i = 0; i < rows; i++) {
    int64_t v = load_index(idx, idx->offset + i * idx->strides[0]);
    if (a->dtype == KILN_F32) {
      float *restrict dst = (float *)kiln_tensor_data(a) + v * width;
      const float *restrict s = (const float *)kiln_tensor_data(src) + i * width;
      for (int64_t k = 0; k < width; k++) dst[k] += s[k];
    } else {
      double *restrict dst = (double *)kiln_tensor_data(a) + v * width;
      const double *restrict s = (const double *)kiln_tensor_data(src) + i * width;
      for (int64_t k = 0; k < width; k++) dst[k] += s[k];
    }
  }
  return 1;
}

int cpu_scatter_add(const struct kiln_call *c) {
  struct kiln_tensor *a = c->out;
  const struct kiln_tensor *idx = c->in[1], *src = c->in[2];
  int d = (int)c->ints[0];
  int64_t size = a->ndim ? a->sizes[d] : 1;
  int rc;
  if (scatter_add_rows(idx, src, a, d, &rc)) return rc;
  if (check_indices("scatter_add", idx, size, d, a)) return kiln_error_code();
  const struct kiln_tensor *ts[3] = {a, idx, src};
  struct walk w;
  walk_init(&w, idx->ndim, idx->sizes, 3, ts);
  if (a->ndim) w.strides[0][d] = 0;
  for (int64_t i = 0; i < idx->numel; i++, walk_next(&w)) {
    int64_t j = load_index(idx, w.off[1]);
    char *dst = elem(a, w.off[0] + (a->ndim ? j * a->strides[d] : 0));
    const char *s = elem(src, w.off[2]);
    if (a->dtype == KILN_F32 && src->dtype == KILN_F32) *(float *)dst += *(const float *)s;
    else if (a->dtype == KILN_F64 && src->dtype == KILN_F64) *(double *)dst += *(const double *)s;
    else if (a->dtype == KILN_I64 && src->dtype == KILN_I64) *(int64_t *)dst = (int64_t)((uint64_t)*(int64_t *)dst + (uint64_t)*(const int64_t *)s);
    else kiln_store_f64(dst, a->dtype, kiln_load_f64(dst, a->dtype) + kiln_load_f64(s, src->dtype));
  }
  return KILN_OK;
}

int cpu_masked_fill(const struct kiln_call *c) {
  struct kiln_tensor *a = c->out;
  struct kiln_tensor *m = kiln_layout_expand(c->in[1], a->ndim, a->sizes);
  if (!m) return kiln_error_code();
  char value[8];
  kiln_store_f64(value, a->dtype, c->scalar[0]);
  int es = kiln_dtype_size(a->dtype);
  const struct kiln_tensor *ts[2] = {a, m};
  struct walk w;
  walk_init(&w, a->ndim, a->sizes, 2, ts);
  for (int64_t i = 0; i < a->numel; i++, walk_next(&w))
    if (*(const uint8_t *)elem(m, w.off[1])) memcpy(elem(a, w.off[0]), value, (size_t)es);
  kiln_tensor_release(m);
  return KILN_OK;
}

int cpu_masked_select(const struct kiln_call *c) {
  const struct kiln_tensor *a0 = c->in[0], *m0 = c->in[1];
  int nd;
  int64_t shape[KILN_MAX_DIMS];
  kiln_broadcast_shapes("masked_select", a0->ndim, a0->sizes, m0->ndim, m0->sizes, &nd, shape);
  struct kiln_tensor *a = kiln_layout_expand(a0, nd, shape), *m = kiln_layout_expand(m0, nd, shape);
  int rc = KILN_OK;
  if (!a || !m) { rc = kiln_error_code(); goto done; }
  const struct kiln_tensor *ts[2] = {a, m};
  struct walk w;
  int64_t count = 0;
  walk_init(&w, nd, shape, 2, ts);
  for (int64_t i = 0; i < a->numel; i++, walk_next(&w)) count += *(const uint8_t *)elem(m, w.off[1]) != 0;
  struct kiln_tensor *out = kiln_tensor_empty(1, &count, a->dtype, a->device);
  if (!out) { rc = kiln_error_code(); goto done; }
  int es = kiln_dtype_size(a->dtype);
  char *o = kiln_tensor_data(out);
  walk_init(&w, nd, shape, 2, ts);
  for (int64_t i = 0; i < a->numel; i++, walk_next(&w))
    if (*(const uint8_t *)elem(m, w.off[1])) { memcpy(o, elem(a, w.off[0]), (size_t)es); o += es; }
  *(struct kiln_tensor **)c->extra = out;
done:
  kiln_tensor_release(a);
  kiln_tensor_release(m);
  return rc;
}

/* cat: each input is copied (and converted) into its slice of the output along dim. */
int cpu_cat(const struct kiln_call *c) {
  struct kiln_tensor *const *ts = c->extra;
  int d = (int)c->ints[0], n = (int)c->ints[1];
  struct kiln_tensor part = *c->out;
  int64_t start = 0;
  for (int i = 0; i < n; i++) {
    const struct kiln_tensor *t = ts[i];
    if (t->ndim == 1 && t->numel == 0) continue;
    part.offset = c->out->offset + start * c->out->strides[d];
    part.sizes[d] = t->sizes[d];
    part.numel = t->numel;
    kiln_cpu_copy(&part, t);
    start += t->sizes[d];
  }
  return KILN_OK;
}
