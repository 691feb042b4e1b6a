/* dist/reducer.c: the gradient reducer of data parallelism (kiln/dist.h).
   Parameters go into buckets in reverse order (backward makes the last layer's grads first), one
   dtype per bucket. Autograd says when each parameter's grad is final; a bucket whose grads are
   all final is packed into one flat tensor and its all-reduce (mean) is queued at once, in bucket
   order on every rank, so the communication thread works while backward goes on. At the end of
   backward the reducer waits for its buckets and writes the means back into the grads. Each
   bucket ends with one flag per parameter (1 where the rank had a grad to give), averaged with the
   grads: a parameter whose flag comes back 0 had no grad on any rank, and keeps its grad as it was,
   without a collective of its own. */
#include "../internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bucket {
  int first, count;              /* into order[] */
  int64_t numel;                 /* of the grads; the count flags follow them */
  int dtype;
  int ready;                     /* params of this bucket whose grad is final */
  struct kiln_tensor *flat;
  struct kiln_work *work;
};

struct kiln_reducer {
  struct kiln_group *group;
  struct kiln_tensor **params;   /* retained */
  int n;
  int *order;                    /* bucket order: params from last to first */
  int *bucket_of;                /* [n], by param index */
  int64_t *offset;               /* [n]: where the param sits in its bucket's flat tensor */
  char *is_ready;                /* [n], this backward */
  char *any;                     /* [n], after a backward: some rank had a grad of the param */
  struct bucket *b;
  int nb, next;                  /* buckets; the next one to start */
  int enabled, active, early, last_early, failed;
  char error[1024];
};

static int find(const struct kiln_reducer *r, const struct kiln_tensor *t) {
  for (int i = 0; i < r->n; i++) if (r->params[i] == t) return i;
  return -1;
}

static void note_error(struct kiln_reducer *r) {
  if (r->failed) return;
  r->failed = kiln_error_code() ? kiln_error_code() : KILN_ERR_STATE;
  snprintf(r->error, sizeof r->error, "%s", kiln_error_message());
}

/* The part of bucket b's flat tensor that holds param i, shaped as the param (a view). */
static struct kiln_tensor *slot(struct kiln_reducer *r, struct bucket *b, int i) {
  struct kiln_tensor *p = r->params[i];
  struct kiln_tensor *part = kiln_narrow(b->flat, 0, r->offset[i], p->numel);
  if (!part) return NULL;
  struct kiln_tensor *v = kiln_view(part, p->ndim, p->sizes);
  kiln_tensor_release(part);
  return v;
}

/* Copy between a grad and its slot: memcpy on the CPU, the device's copy on CUDA. */
static int move(struct kiln_reducer *r, struct bucket *b, int i, struct kiln_tensor *grad, int into_flat) {
  struct kiln_tensor *p = r->params[i];
  if (b->flat->device.type == KILN_CPU && kiln_is_contiguous(grad) && grad->device.type == KILN_CPU && grad->dtype == b->dtype) {
    char *at = (char *)kiln_tensor_data(b->flat) + (size_t)r->offset[i] * (size_t)kiln_dtype_size(b->dtype);
    size_t bytes = (size_t)p->numel * (size_t)kiln_dtype_size(b->dtype);
    if (into_flat) memcpy(at, kiln_tensor_data(grad), bytes); else memcpy(kiln_tensor_data(grad), at, bytes);
    return KILN_OK;
  }
  struct kiln_tensor *v = slot(r, b, i);
  if (!v) return kiln_error_code();
  int prev = kiln_set_grad_enabled(0);
  int rc = into_flat ? kiln_copy_(v, grad) : kiln_copy_(grad, v);
  kiln_set_grad_enabled(prev);
  kiln_tensor_release(v);
  return rc;
}

/* The bucket's flags: 1 for each param that has a grad on this rank, else 0. */
static int set_flags(struct kiln_reducer *r, struct bucket *b) {
  int64_t one[1] = {b->count};
  double *v = malloc(sizeof(double) * (size_t)b->count);
  if (!v) return kiln_fail(KILN_ERR_MEMORY, "DataParallel: out of memory");
  for (int j = 0; j < b->count; j++) v[j] = r->params[r->order[b->first + j]]->grad != NULL;
  struct kiln_tensor *host = kiln_tensor_from_f64(1, one, v, b->dtype, (struct kiln_device){KILN_CPU, 0});
  free(v);
  struct kiln_tensor *flags = host ? kiln_narrow(b->flat, 0, b->numel, b->count) : NULL;
  int rc = flags ? kiln_copy_(flags, host) : kiln_error_code();
  kiln_tensor_release(flags);
  kiln_tensor_release(host);
  return rc;
}

/* After the all-reduce: which params of bucket b had a grad on some rank. */
static int read_flags(struct kiln_reducer *r, struct bucket *b) {
  struct kiln_tensor *flags = kiln_narrow(b->flat, 0, b->numel, b->count);
  struct kiln_tensor *host = flags ? kiln_to_device(flags, (struct kiln_device){KILN_CPU, 0}) : NULL;
  struct kiln_tensor *f64 = host ? kiln_to_dtype(host, KILN_F64) : NULL;
  kiln_tensor_release(flags);
  kiln_tensor_release(host);
  if (!f64) return kiln_error_code();
  const double *v = kiln_tensor_data(f64);
  for (int j = 0; j < b->count; j++) r->any[r->order[b->first + j]] = v[j] > 0;
  kiln_tensor_release(f64);
  return KILN_OK;
}

/* Pack bucket k's grads (zeros where a param has none) and queue its all-reduce. */
static void start(struct kiln_reducer *r, int k) {
  struct bucket *b = &r->b[k];
  for (int j = b->first; j < b->first + b->count; j++) {
    int i = r->order[j];
    struct kiln_tensor *p = r->params[i], *g = p->grad;
    if (g && (g->numel != p->numel || g->device.type != p->device.type)) {
      kiln_fail(KILN_ERR_STATE, "DataParallel: the grad of parameter %d (%s %s) is %s %s on %s", i + 1, kiln_shape_string(p),
                kiln_dtype_name(p->dtype), kiln_shape_string(g), kiln_dtype_name(g->dtype), kiln_device_name(g->device));
      note_error(r);
      return;
    }
    int rc;
    if (g) rc = move(r, b, i, g, 1);
    else {
      struct kiln_tensor *v = slot(r, b, i);
      rc = v ? kiln_fill_(v, 0) : kiln_error_code();
      kiln_tensor_release(v);
    }
    if (rc) { note_error(r); return; }
  }
  if (set_flags(r, b)) { note_error(r); return; }
  if (kiln_all_reduce(r->group, b->flat, KILN_REDUCE_MEAN, &b->work)) { b->work = NULL; note_error(r); }
}

static void start_full(struct kiln_reducer *r) {
  while (r->next < r->nb && r->b[r->next].ready == r->b[r->next].count && !r->failed) start(r, r->next++);
}

static void leaf_ready(void *ctx, struct kiln_tensor *leaf) {
  struct kiln_reducer *r = ctx;
  if (!r->enabled) return;
  int i = find(r, leaf);
  if (i < 0 || r->is_ready[i]) return;
  r->active = 1;
  r->is_ready[i] = 1;
  r->b[r->bucket_of[i]].ready++;
  int before = r->next;
  start_full(r);
  r->early += r->next - before;
}

/* The end of a backward: the params that got no grad count as zeros, the remaining buckets start,
   and every bucket's mean goes back into the grads, but for params that had no grad on any rank
   (their grad stays as it was, as in one process). */
static int done(void *ctx, int rc) {
  struct kiln_reducer *r = ctx;
  if (!r->enabled || !r->active) return KILN_OK;
  for (int i = 0; i < r->n; i++)
    if (!r->is_ready[i]) { r->is_ready[i] = 1; r->b[r->bucket_of[i]].ready++; }
  if (!rc) start_full(r);
  const char *any = r->any;
  for (int k = 0; k < r->nb; k++) {
    struct bucket *b = &r->b[k];
    if (!b->work) continue;
    if (kiln_work_wait(b->work)) note_error(r);
    kiln_work_release(b->work);
    b->work = NULL;
    if (r->failed || rc) continue;
    if (read_flags(r, b)) { note_error(r); continue; }
    for (int j = b->first; j < b->first + b->count; j++) {
      int i = r->order[j];
      struct kiln_tensor *p = r->params[i];
      if (!any[i]) continue;
      if (!p->grad) {
        p->grad = kiln_tensor_empty(p->ndim, p->sizes, p->dtype, p->device);
        if (!p->grad) { note_error(r); break; }
      }
      if (move(r, b, i, p->grad, 0)) { note_error(r); break; }
      p->grad->storage->version++;
    }
  }
  r->last_early = r->early;
  r->early = r->active = r->next = 0;
  memset(r->is_ready, 0, (size_t)r->n);
  for (int k = 0; k < r->nb; k++) r->b[k].ready = 0;
  if (r->failed && !rc) {
    r->failed = 0;
    return kiln_fail(KILN_ERR_STATE, "%s", r->error);
  }
  r->failed = 0;
  return KILN_OK;
}

KILN_API void kiln_reducer_free(struct kiln_reducer *r) {
  if (!r) return;
  kiln_backward_hooks_remove(r);
  for (int k = 0; k < r->nb; k++) {
    if (r->b[k].work) { kiln_work_wait(r->b[k].work); kiln_work_release(r->b[k].work); }
    kiln_tensor_release(r->b[k].flat);
  }
  for (int i = 0; i < r->n; i++) kiln_tensor_release(r->params[i]);
  free(r->any);
  free(r->params);
  free(r->order);
  free(r->bucket_of);
  free(r->offset);
  free(r->is_ready);
  free(r->b);
  free(r);
}

KILN_API struct kiln_reducer *kiln_reducer_new(struct kiln_group *g, struct kiln_tensor **params, int n, int64_t bucket_bytes,
                                               int64_t first_bucket_bytes) {
  if (!kiln_dist_is_initialized()) { kiln_fail(KILN_ERR_STATE, "DataParallel: kiln.dist is not initialised (call kiln.dist.init() first)"); return NULL; }
  if (!g || kiln_group_rank(g) < 0) { kiln_fail(KILN_ERR_ARGUMENT, "DataParallel: no group, or this rank is not in it"); return NULL; }
  if (n < 1 || !params) { kiln_fail(KILN_ERR_ARGUMENT, "DataParallel: no parameters given"); return NULL; }
  if (bucket_bytes < 1 || first_bucket_bytes < 1) {
    kiln_fail(KILN_ERR_ARGUMENT, "DataParallel: bucket sizes must be > 0 bytes (got %lld and %lld)", (long long)bucket_bytes,
              (long long)first_bucket_bytes);
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    if (kiln_check_live("DataParallel", params[i])) return NULL;
    if (!kiln_dtype_is_float(params[i]->dtype) || params[i]->grad_fn ||
        params[i]->device.type != params[0]->device.type || params[i]->device.index != params[0]->device.index) {
      kiln_fail(KILN_ERR_ARGUMENT, "DataParallel: parameter %d (%s %s on %s) must be a float leaf tensor on the device of "
                "the first (%s)", i + 1, kiln_shape_string(params[i]), kiln_dtype_name(params[i]->dtype),
                kiln_device_name(params[i]->device), kiln_device_name(params[0]->device));
      return NULL;
    }
    for (int j = 0; j < i; j++)
      if (params[j] == params[i]) { kiln_fail(KILN_ERR_ARGUMENT, "DataParallel: parameter %d is parameter %d again", i + 1, j + 1); return NULL; }
  }
  struct kiln_reducer *r = calloc(1, sizeof *r);
  if (!r) { kiln_fail(KILN_ERR_MEMORY, "DataParallel: out of memory"); return NULL; }
  r->group = g;
  r->n = n;
  r->enabled = 1;
  r->params = calloc((size_t)n, sizeof *r->params);
  r->order = calloc((size_t)n, sizeof *r->order);
  r->bucket_of = calloc((size_t)n, sizeof *r->bucket_of);
  r->offset = calloc((size_t)n, sizeof *r->offset);
  r->is_ready = calloc((size_t)n, 1);
  r->b = calloc((size_t)n, sizeof *r->b);
  if (!r->params || !r->order || !r->bucket_of || !r->offset || !r->is_ready || !r->b) {
    kiln_reducer_free(r);
    kiln_fail(KILN_ERR_MEMORY, "DataParallel: out of memory");
    return NULL;
  }
  for (int i = 0; i < n; i++) { r->params[i] = params[i]; kiln_tensor_retain(params[i]); }
  /* Buckets, from the last param back: a bucket closes when it reaches its size or the dtype changes. */
  int64_t bytes = 0;
  for (int j = 0; j < n; j++) {
    int i = n - 1 - j;
    struct kiln_tensor *p = params[i];
    int64_t size = p->numel * kiln_dtype_size(p->dtype);
    struct bucket *b = r->nb ? &r->b[r->nb - 1] : NULL;
    int64_t limit = r->nb == 1 ? first_bucket_bytes : bucket_bytes;
    if (!b || b->dtype != p->dtype || bytes >= limit) {
      b = &r->b[r->nb++];
      b->first = j;
      b->dtype = p->dtype;
      bytes = 0;
    }
    r->order[j] = i;
    r->bucket_of[i] = r->nb - 1;
    r->offset[i] = b->numel;
    b->numel += p->numel;
    b->count++;
    bytes += size;
  }
  for (int k = 0; k < r->nb; k++) {
    int64_t sizes[1] = {r->b[k].numel + r->b[k].count};
    r->b[k].flat = kiln_tensor_empty(1, sizes, r->b[k].dtype, params[0]->device);
    if (!r->b[k].flat) { kiln_reducer_free(r); return NULL; }
  }
  r->any = calloc((size_t)n, 1);
  if (!r->any) { kiln_reducer_free(r); kiln_fail(KILN_ERR_MEMORY, "DataParallel: out of memory"); return NULL; }
  struct kiln_backward_hooks h = {leaf_ready, done, r};
  if (kiln_backward_hooks_add(&h)) { kiln_reducer_free(r); return NULL; }
  return r;
}

KILN_API int kiln_reducer_set_enabled(struct kiln_reducer *r, int enabled) {
  if (!r) return kiln_fail(KILN_ERR_ARGUMENT, "DataParallel: no reducer");
  r->enabled = enabled != 0;
  return KILN_OK;
}

KILN_API int kiln_reducer_bucket_count(const struct kiln_reducer *r) { return r ? r->nb : 0; }
KILN_API int64_t kiln_reducer_bucket_numel(const struct kiln_reducer *r, int k) {
  return r && k >= 0 && k < r->nb ? r->b[k].numel : -1;
}
KILN_API int kiln_reducer_started_early(const struct kiln_reducer *r) { return r ? r->last_early : 0; }
