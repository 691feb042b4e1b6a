/* cuda/index.cu: joining and indexing on CUDA: cat (each input copied into its slice of the
   output by the copy kernel), index_select, gather, scatter_add (atomic adds, f16 and bf16 too;
   mixed dtypes take one thread, in the CPU's order), masked_fill and masked_select (a scan over
   the mask, then a scatter). As on the CPU, every index is checked before anything is written:
   a kernel finds the first bad one and the error names its value. */
#include "kernels.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cub/device/device_scan.cuh>

using namespace kiln_el;
using namespace kiln_k;

/* ---- checking indices ---- */

__global__ void check_indices_kernel(struct kiln_cuda_iter it, const char *idx, int i64, int64_t size,
                                     unsigned long long *first_bad) {
  KILN_GRID_LOOP(i, it.numel) {
    int64_t off[KILN_CUDA_MAX_OPERANDS];
    kiln_cuda_iter_offsets(&it, i, off);
    int64_t v = i64 ? ((const int64_t *)idx)[off[0]] : ((const int32_t *)idx)[off[0]];
    if (v < 0 || v >= size) atomicMin(first_bad, (unsigned long long)i);
  }
}

/* 0, or the error the CPU gives for the first index (in idx's row-major order) outside [0, size). */
static int check_indices(struct cuda_device *dev, const char *op, const struct kiln_tensor *idx, int64_t size, int d,
                         const struct kiln_tensor *a) {
  if (idx->numel == 0) return KILN_OK;
  struct kiln_tensor *flag = cuda_scratch(8, idx->device);
  if (!flag) return kiln_error_code();
  unsigned long long *first = (unsigned long long *)kiln_tensor_data(flag), bad = 0;
  struct kiln_cuda_iter it;
  kiln_cuda_iter_build(&it, idx, 0, NULL);
  int rc = cuda_check(cudaMemsetAsync(first, 0xff, 8, dev->stream), op, "cudaMemsetAsync (index check)");
  if (!rc) {
    struct kiln_cuda_launch g = grid_for(dev, it.numel);
    check_indices_kernel<<<(unsigned)g.blocks, g.threads, 0, dev->stream>>>(it, (const char *)kiln_tensor_data(idx),
                                                                           idx->dtype == KILN_I64, size, first);
    rc = cuda_launched(op, "check_indices_kernel");
  }
  if (!rc) rc = cuda_check(cudaMemcpyAsync(&bad, first, 8, cudaMemcpyDeviceToHost, dev->stream), op, "cudaMemcpyAsync (index check)");
  if (!rc) rc = cuda_check(cudaStreamSynchronize(dev->stream), op, "cudaStreamSynchronize (index check)");
  if (!rc && bad != ~0ull) {
    int64_t off[KILN_CUDA_MAX_OPERANDS], v = 0;
    kiln_cuda_iter_offsets(&it, (int64_t)bad, off);
    int es = kiln_dtype_size(idx->dtype);
    int32_t v32 = 0;
    rc = cuda_check(cudaMemcpyAsync(idx->dtype == KILN_I64 ? (void *)&v : (void *)&v32,
                                    (const char *)kiln_tensor_data(idx) + off[0] * es, (size_t)es, cudaMemcpyDeviceToHost,
                                    dev->stream),
                    op, "cudaMemcpyAsync (index check)");
    if (!rc) rc = cuda_check(cudaStreamSynchronize(dev->stream), op, "cudaStreamSynchronize (index check)");
    if (idx->dtype != KILN_I64) v = v32;
    if (!rc)
      rc = cuda_fail(KILN_ERR_INDEX, "%s: index %lld out of range for dim %d of size %lld (tensor %s; C counts from 0)", op,
                     (long long)v, d, (long long)size, kiln_shape_string(a));
  }
  kiln_tensor_release(flag);
  return rc;
}

/* ---- index_select, gather, scatter_add ---- */

template <class E>
__global__ void index_move_kernel(struct kiln_cuda_index_geom g, char *out, const char *idx, int i64, const char *in) {
  KILN_GRID_LOOP(i, g.numel) {
    int64_t off[3];
    kiln_cuda_index_offsets(&g, i, off);
    int64_t j = i64 ? ((const int64_t *)idx)[off[1]] : ((const int32_t *)idx)[off[1]];
    ((E *)out)[off[0]] = ((const E *)in)[off[2] + j * g.jump];
  }
}

template <class E>
static void launch_move(const struct cuda_device *dev, const struct kiln_cuda_index_geom *g, char *out, const char *idx,
                        int i64, const char *in) {
  struct kiln_cuda_launch l = grid_for(dev, g->numel);
  index_move_kernel<E><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(*g, out, idx, i64, in);
}

static int index_move(struct cuda_device *dev, int op, struct kiln_tensor *out, const struct kiln_tensor *a,
                      const struct kiln_tensor *idx, int d) {
  struct kiln_cuda_index_geom g;
  kiln_cuda_index_geom_build(&g, op, out, idx, a, d);
  if (g.numel == 0) return KILN_OK;
  char *o = (char *)kiln_tensor_data(out);
  const char *x = (const char *)kiln_tensor_data(a), *ix = (const char *)kiln_tensor_data(idx);
  int i64 = idx->dtype == KILN_I64;
  switch (kiln_dtype_size(a->dtype)) {
  case 1: launch_move<uint8_t>(dev, &g, o, ix, i64, x); break;
  case 2: launch_move<uint16_t>(dev, &g, o, ix, i64, x); break;
  case 4: launch_move<uint32_t>(dev, &g, o, ix, i64, x); break;
  default: launch_move<uint64_t>(dev, &g, o, ix, i64, x); break;
  }
  return cuda_launched(kiln_op_name(op), "index_move_kernel");
}

extern "C" int cuda_index_select(const struct kiln_call *c) {
  const struct kiln_tensor *a = c->in[0], *idx = c->in[1];
  struct kiln_tensor *out = c->out;
  int d = (int)c->ints[0];
  struct cuda_device *dev = cuda_device_enter(out->device.index, "index_select");
  if (!dev) return kiln_error_code();
  if (check_indices(dev, "index_select", idx, a->ndim ? a->sizes[d] : 1, d, a)) return kiln_error_code();
  if (a->ndim == 0) {
    struct kiln_call call;
    memset(&call, 0, sizeof call);
    call.op = KILN_OP_COPY;
    call.out = out;
    call.in[0] = a;
    call.nin = 1;
    return cuda_copy(&call);
  }
  return index_move(dev, KILN_OP_INDEX_SELECT, out, a, idx, d);
}

extern "C" int cuda_gather(const struct kiln_call *c) {
  const struct kiln_tensor *a = c->in[0], *idx = c->in[1];
  int d = (int)c->ints[0];
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, "gather");
  if (!dev) return kiln_error_code();
  if (check_indices(dev, "gather", idx, a->ndim ? a->sizes[d] : 1, d, a)) return kiln_error_code();
  return index_move(dev, KILN_OP_GATHER, c->out, a, idx, d);
}

/* Same dtype f32, f64, i64, i32, f16 or bf16: device atomics (integers wrap as on the CPU; f16 and
   bf16, whose bits kiln keeps as uint16, through the device's half-precision adds, each rounded to
   the dtype as the CPU rounds each of its adds). */
template <class T, class A> __device__ __forceinline__ A atomic_operand(const T *p) { return (A)*p; }
template <> __device__ __forceinline__ __half atomic_operand<uint16_t, __half>(const uint16_t *p) {
  return *(const __half *)p;
}
template <> __device__ __forceinline__ __nv_bfloat16 atomic_operand<uint16_t, __nv_bfloat16>(const uint16_t *p) {
  return *(const __nv_bfloat16 *)p;
}
template <class T, class A>
__global__ void scatter_add_kernel(struct kiln_cuda_index_geom g, char *a, const char *idx, int i64, const char *src) {
  KILN_GRID_LOOP(i, g.numel) {
    int64_t off[3];
    kiln_cuda_index_offsets(&g, i, off);
    int64_t j = i64 ? ((const int64_t *)idx)[off[1]] : ((const int32_t *)idx)[off[1]];
    atomicAdd((A *)((T *)a + off[0] + j * g.jump), atomic_operand<T, A>((const T *)src + off[2]));
  }
}

/* Any other pair of dtypes: through double, one element after the other, as the CPU does. */
__global__ void scatter_add_serial_kernel(struct kiln_cuda_index_geom g, char *a, int ad, const char *idx, int i64,
                                          const char *src, int sd) {
  int ae = dtype_size(ad), se = dtype_size(sd);
  for (int64_t i = 0; i < g.numel; i++) {
    int64_t off[3];
    kiln_cuda_index_offsets(&g, i, off);
    int64_t j = i64 ? ((const int64_t *)idx)[off[1]] : ((const int32_t *)idx)[off[1]];
    char *dst = a + (off[0] + j * g.jump) * ae;
    store_f64(dst, ad, load_f64(dst, ad) + load_f64(src + off[2] * se, sd));
  }
}

extern "C" int cuda_scatter_add(const struct kiln_call *c) {
  struct kiln_tensor *a = c->out;
  const struct kiln_tensor *idx = c->in[1], *src = c->in[2];
  int d = (int)c->ints[0];
  struct cuda_device *dev = cuda_device_enter(a->device.index, "scatter_add");
  if (!dev) return kiln_error_code();
  if (check_indices(dev, "scatter_add", idx, a->ndim ? a->sizes[d] : 1, d, a)) return kiln_error_code();
  struct kiln_cuda_index_geom g;
  kiln_cuda_index_geom_build(&g, KILN_OP_SCATTER_ADD, a, idx, src, d);
  if (g.numel == 0) return KILN_OK;
  char *p = (char *)kiln_tensor_data(a);
  const char *ix = (const char *)kiln_tensor_data(idx), *s = (const char *)kiln_tensor_data(src);
  int i64 = idx->dtype == KILN_I64;
  struct kiln_cuda_launch l = grid_for(dev, g.numel);
  if (a->dtype == src->dtype && a->dtype == KILN_F32)
    scatter_add_kernel<float, float><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(g, p, ix, i64, s);
  else if (a->dtype == src->dtype && a->dtype == KILN_F64)
    scatter_add_kernel<double, double><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(g, p, ix, i64, s);
  else if (a->dtype == src->dtype && a->dtype == KILN_I64)
    scatter_add_kernel<int64_t, unsigned long long><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(g, p, ix, i64, s);
  else if (a->dtype == src->dtype && a->dtype == KILN_I32)
    scatter_add_kernel<int32_t, int><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(g, p, ix, i64, s);
  else if (a->dtype == src->dtype && a->dtype == KILN_F16)
    scatter_add_kernel<uint16_t, __half><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(g, p, ix, i64, s);
  else if (a->dtype == src->dtype && a->dtype == KILN_BF16)
    scatter_add_kernel<uint16_t, __nv_bfloat16><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(g, p, ix, i64, s);
  else
    scatter_add_serial_kernel<<<1, 1, 0, dev->stream>>>(g, p, a->dtype, ix, i64, s, src->dtype);
  return cuda_launched("scatter_add", "scatter_add_kernel");
}

/* ---- masks ---- */

template <class E> __global__ void masked_fill_kernel(struct kiln_cuda_iter it, char *a, const uint8_t *mask, E v) {
  KILN_GRID_LOOP(i, it.numel) {
    int64_t off[KILN_CUDA_MAX_OPERANDS];
    kiln_cuda_iter_offsets(&it, i, off);
    if (mask[off[1]]) ((E *)a)[off[0]] = v;
  }
}

template <class E> static void launch_fill(const struct cuda_device *dev, const struct kiln_cuda_iter *it, char *a,
                                           const uint8_t *mask, const double *bits) {
  E v;
  memcpy(&v, bits, sizeof v);
  struct kiln_cuda_launch l = grid_for(dev, it->numel);
  masked_fill_kernel<E><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(*it, a, mask, v);
}

extern "C" int cuda_masked_fill(const struct kiln_call *c) {
  struct kiln_tensor *a = c->out;
  struct cuda_device *dev = cuda_device_enter(a->device.index, "masked_fill");
  if (!dev) return kiln_error_code();
  if (a->numel == 0) return KILN_OK;
  double bits = 0;   /* the value in a's dtype, in the bytes of a double */
  store_f64(&bits, a->dtype, c->scalar[0]);
  struct kiln_cuda_iter it;
  const struct kiln_tensor *in[1] = {c->in[1]};
  kiln_cuda_iter_build(&it, a, 1, in);
  char *p = (char *)kiln_tensor_data(a);
  const uint8_t *m = (const uint8_t *)kiln_tensor_data(c->in[1]);
  switch (kiln_dtype_size(a->dtype)) {
  case 1: launch_fill<uint8_t>(dev, &it, p, m, &bits); break;
  case 2: launch_fill<uint16_t>(dev, &it, p, m, &bits); break;
  case 4: launch_fill<uint32_t>(dev, &it, p, m, &bits); break;
  default: launch_fill<uint64_t>(dev, &it, p, m, &bits); break;
  }
  return cuda_launched("masked_fill", "masked_fill_kernel");
}

/* flags[i] = mask element i (of the broadcast shape, row-major) is set. */
__global__ void mask_flags_kernel(struct kiln_cuda_iter it, const uint8_t *mask, int64_t *flags) {
  KILN_GRID_LOOP(i, it.numel) {
    int64_t off[KILN_CUDA_MAX_OPERANDS];
    kiln_cuda_iter_offsets(&it, i, off);
    flags[i] = mask[off[1]] != 0;
  }
}

/* pos: the exclusive scan of the flags; out[pos[i]] = a element i where the mask is set. */
template <class E>
__global__ void masked_select_kernel(struct kiln_cuda_iter it, const char *a, const uint8_t *mask, const int64_t *pos,
                                     char *out) {
  KILN_GRID_LOOP(i, it.numel) {
    int64_t off[KILN_CUDA_MAX_OPERANDS];
    kiln_cuda_iter_offsets(&it, i, off);
    if (mask[off[1]]) ((E *)out)[pos[i]] = ((const E *)a)[off[0]];
  }
}

template <class E>
static void launch_select(const struct cuda_device *dev, const struct kiln_cuda_iter *it, const char *a, const uint8_t *mask,
                          const int64_t *pos, char *out) {
  struct kiln_cuda_launch l = grid_for(dev, it->numel);
  masked_select_kernel<E><<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(*it, a, mask, pos, out);
}

extern "C" int cuda_masked_select(const struct kiln_call *c) {
  const struct kiln_tensor *a0 = c->in[0], *m0 = c->in[1];
  struct cuda_device *dev = cuda_device_enter(a0->device.index, "masked_select");
  if (!dev) return kiln_error_code();
  /* The front end checked that a and the mask broadcast. */
  int nd = a0->ndim > m0->ndim ? a0->ndim : m0->ndim;
  int64_t shape[KILN_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    int da = d - (nd - a0->ndim), dm = d - (nd - m0->ndim);
    int64_t sa = da >= 0 ? a0->sizes[da] : 1, sm = dm >= 0 ? m0->sizes[dm] : 1;
    shape[d] = sa == 1 ? sm : sa;
  }
  struct kiln_tensor *a = kiln_expand(a0, nd, shape), *m = kiln_expand(m0, nd, shape);
  struct kiln_tensor *flags = NULL, *pos = NULL, *tmp = NULL, *out = NULL;
  int rc = KILN_OK;
  int64_t n = 0, count = 0;
  struct kiln_cuda_iter it;
  if (!a || !m) { rc = kiln_error_code(); goto done; }
  n = a->numel;
  if (n > 0) {
    const struct kiln_tensor *in[1] = {m};
    kiln_cuda_iter_build(&it, a, 1, in);
    flags = cuda_scratch(n * 8, a->device);
    pos = cuda_scratch(n * 8, a->device);
    if (!flags || !pos) { rc = kiln_error_code(); goto done; }
    int64_t *f = (int64_t *)kiln_tensor_data(flags), *ps = (int64_t *)kiln_tensor_data(pos);
    struct kiln_cuda_launch l = grid_for(dev, n);
    mask_flags_kernel<<<(unsigned)l.blocks, l.threads, 0, dev->stream>>>(it, (const uint8_t *)kiln_tensor_data(m), f);
    if ((rc = cuda_launched("masked_select", "mask_flags_kernel"))) goto done;
    size_t tmp_bytes = 0;
    if ((rc = cuda_check(cub::DeviceScan::ExclusiveSum(NULL, tmp_bytes, f, ps, n, dev->stream), "masked_select",
                         "cub::DeviceScan::ExclusiveSum (size)")))
      goto done;
    tmp = cuda_scratch((int64_t)tmp_bytes, a->device);
    if (!tmp) { rc = kiln_error_code(); goto done; }
    if ((rc = cuda_check(cub::DeviceScan::ExclusiveSum(kiln_tensor_data(tmp), tmp_bytes, f, ps, n, dev->stream),
                         "masked_select", "cub::DeviceScan::ExclusiveSum")))
      goto done;
    int64_t last[2] = {0, 0};
    if ((rc = cuda_check(cudaMemcpyAsync(&last[0], ps + n - 1, 8, cudaMemcpyDeviceToHost, dev->stream), "masked_select",
                         "cudaMemcpyAsync (count)")) ||
        (rc = cuda_check(cudaMemcpyAsync(&last[1], f + n - 1, 8, cudaMemcpyDeviceToHost, dev->stream), "masked_select",
                         "cudaMemcpyAsync (count)")) ||
        (rc = cuda_check(cudaStreamSynchronize(dev->stream), "masked_select", "cudaStreamSynchronize (count)")))
      goto done;
    count = last[0] + last[1];
  }
  out = kiln_tensor_empty(1, &count, a->dtype, a->device);
  if (!out) { rc = kiln_error_code(); goto done; }
  if (count > 0) {
    const char *x = (const char *)kiln_tensor_data(a);
    const uint8_t *mk = (const uint8_t *)kiln_tensor_data(m);
    const int64_t *ps = (const int64_t *)kiln_tensor_data(pos);
    char *o = (char *)kiln_tensor_data(out);
    switch (kiln_dtype_size(a->dtype)) {
    case 1: launch_select<uint8_t>(dev, &it, x, mk, ps, o); break;
    case 2: launch_select<uint16_t>(dev, &it, x, mk, ps, o); break;
    case 4: launch_select<uint32_t>(dev, &it, x, mk, ps, o); break;
    default: launch_select<uint64_t>(dev, &it, x, mk, ps, o); break;
    }
    if ((rc = cuda_launched("masked_select", "masked_select_kernel"))) goto done;
  }
  *(struct kiln_tensor **)c->extra = out;
  out = NULL;
done:
  kiln_tensor_release(out);
  kiln_tensor_release(tmp);
  kiln_tensor_release(pos);
  kiln_tensor_release(flags);
  kiln_tensor_release(a);
  kiln_tensor_release(m);
  return rc;
}

/* ---- cat ---- */

extern "C" int cuda_cat(const struct kiln_call *c) {
  struct kiln_tensor *const *ts = (struct kiln_tensor *const *)c->extra;
  int d = (int)c->ints[0], n = (int)c->ints[1];
  struct cuda_device *dev = cuda_device_enter(c->out->device.index, "cat");
  if (!dev) return kiln_error_code();
  struct kiln_tensor part = *c->out;
  int64_t start = 0;
  for (int i = 0; i < n; i++) {
    const struct kiln_tensor *t = ts[i];
    if (t->ndim == 1 && t->numel == 0) continue;   /* skipped, as the front end did */
    part.offset = c->out->offset + start * c->out->strides[d];
    part.sizes[d] = t->sizes[d];
    part.numel = t->numel;
    struct kiln_call call;
    memset(&call, 0, sizeof call);
    call.op = KILN_OP_COPY;
    call.out = &part;
    call.in[0] = t;
    call.nin = 1;
    if (cuda_copy(&call)) return kiln_error_code();
    start += t->sizes[d];
  }
  return KILN_OK;
}
