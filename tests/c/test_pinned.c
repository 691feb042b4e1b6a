/* test_pinned.c: pinned (page-locked) CPU tensors, uploads that do not wait, and the loader's pinned
   batches. Three ways, by what the CUDA backend offers:
   - `test_pinned` without a usable device (CI): pin_memory, uploads and the loader's pin_memory
     fail with "pin_memory: no CUDA device: <why>", and the CPU carries on;
   - `test_pinned fake` with $KILN_CUDA_LIB naming fake_kiln_cuda_device (tests/c/fake_cuda_backend.c:
     a pretend device over host memory, the real pinned cache behind it, counters of its calls):
     which backend entries the runtime used, that pinned batches are allocated through the backend
     with the pinned flag and hold the same bytes as unpinned ones, for 0 and 2 workers;
   - `test_pinned` with a GPU (tests/gpu/run.sh): the same round trips on the device. */
#include "check.h"
#include "fake_cuda_backend.h"
#include <dlfcn.h>

static const struct kiln_device CUDA0 = {KILN_CUDA, 0};

static struct fake_cuda_counters *fake;   /* NULL on a real device */

static int64_t counter(size_t offset) { return fake ? *(int64_t *)((char *)fake + offset) : 0; }
#define C_(field) counter(offsetof(struct fake_cuda_counters, field))

static int equal_values(const struct kiln_tensor *a, const struct kiln_tensor *b) {
  if (!a || !b || a->numel != b->numel || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] != b->sizes[d]) return 0;
  double *va = V(a), *vb = V(b);
  int same = memcmp(va, vb, sizeof(double) * (size_t)(a->numel > 0 ? a->numel : 1)) == 0;
  free(va);
  free(vb);
  return same;
}

static struct kiln_tensor *ramp(int ndim, const int64_t *sizes, int dtype) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sizes[d];
  double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = (double)((i * 37) % 101) - 50.0;
  struct kiln_tensor *t = T(ndim, sizes, v, dtype);
  free(v);
  return t;
}

static void no_device(void) {
  const char *reason = kiln_cuda_unavailable_reason();
  printf("test_pinned: %s\n", reason ? reason : "(null)");
  struct kiln_tensor *t = ramp(2, (int64_t[]){3, 4}, KILN_F32);
  CHECK(!kiln_tensor_is_pinned(t) && !kiln_tensor_is_pinned(NULL));
  CHECK_ERR(kiln_tensor_pin_memory(t), "pin_memory: no CUDA device: ");
  if (reason) CHECK_ERR(kiln_tensor_pin_memory(t), reason);   /* the loader's own words */
  CHECK_ERR(kiln_to_device_non_blocking(t, CUDA0), "no CUDA device");
  struct kiln_tensor *x = ramp(2, (int64_t[]){10, 3}, KILN_F32);
  struct kiln_dataset *d = kiln_dataset_tensors(1, &x);
  struct kiln_loader *l = kiln_loader_new(d, 4, 0, 0, 1, 2, 1);
  CHECK_ERR(kiln_loader_set_pin_memory(l, 1), "loader: pin_memory: no CUDA device: ");
  CHECK(kiln_loader_set_pin_memory(l, 0) == KILN_OK);
  /* still working, unpinned */
  struct kiln_tensor *b = NULL;
  CHECK(kiln_loader_start_epoch(l, 0, NULL, 0) == 0 && kiln_loader_next(l, &b, NULL) == 0 && b && !kiln_tensor_is_pinned(b));
  kiln_tensor_release(b);
  kiln_loader_free(l);
  kiln_dataset_release(d);
  kiln_tensor_release(x);
  kiln_tensor_release(t);
}

static void tensors(void) {
  struct kiln_tensor *t = ramp(2, (int64_t[]){5, 7}, KILN_F32);
  int64_t allocs = C_(host_allocs);
  struct kiln_tensor *p = kiln_tensor_pin_memory(t);
  CHECK(p && kiln_tensor_is_pinned(p) && !kiln_tensor_is_pinned(t) && p->device.type == KILN_CPU);
  CHECK(p && p->storage->flags & KILN_STORAGE_PINNED);
  CHECK(equal_values(p, t));
  if (fake) CHECK(C_(host_allocs) == allocs + 1);
  struct kiln_tensor *p2 = kiln_tensor_pin_memory(p);   /* pinned already: the same tensor */
  CHECK(p2 == p);
  kiln_tensor_release(p2);
  if (fake) CHECK(C_(host_allocs) == allocs + 1);
  /* a view of a pinned tensor is pinned; a non-contiguous source gives a contiguous pinned copy */
  struct kiln_tensor *tt = kiln_transpose(t, 0, 1);
  struct kiln_tensor *pt = kiln_tensor_pin_memory(tt);
  CHECK(pt && kiln_tensor_is_pinned(pt) && kiln_is_contiguous(pt) && equal_values(pt, tt));
  struct kiln_tensor *row = kiln_select(p, 0, 2);
  CHECK(row && kiln_tensor_is_pinned(row));
  /* an empty tensor can be pinned too */
  struct kiln_tensor *e = kiln_tensor_empty(1, (int64_t[]){0}, KILN_F32, CPU), *pe = kiln_tensor_pin_memory(e);
  CHECK(pe && kiln_tensor_is_pinned(pe) && pe->numel == 0);

  /* uploads: pinned + non_blocking goes through the async entry (tracked); everything else waits */
  int64_t async = C_(async_copies_from_host), sync = C_(copies_from_host), events = C_(events_recorded);
  struct kiln_tensor *g = kiln_to_device_non_blocking(p, CUDA0);
  CHECK(g && g->device.type == KILN_CUDA);
  if (fake) CHECK(C_(async_copies_from_host) == async + 1 && C_(copies_from_host) == sync && C_(events_recorded) == events + 1);
  CHECK(kiln_cuda_synchronize(0) == KILN_OK);
  struct kiln_tensor *back = kiln_to_device(g, CPU);
  CHECK(equal_values(back, t) && !kiln_tensor_is_pinned(back));
  /* a pinned view with an offset: the copy starts inside the block */
  struct kiln_tensor *grow = kiln_to_device_non_blocking(row, CUDA0);
  struct kiln_tensor *rback = grow ? kiln_to_device(grow, CPU) : NULL;
  CHECK(equal_values(rback, row));
  if (fake) CHECK(C_(async_copies_untracked) == 0);
  struct kiln_tensor *g2 = kiln_to_device(p, CUDA0);                 /* blocking from pinned */
  struct kiln_tensor *g3 = kiln_to_device_non_blocking(t, CUDA0);    /* pageable: waits */
  if (fake) CHECK(C_(async_copies_from_host) == async + 2 && C_(copies_from_host) == sync + 2);
  struct kiln_tensor *b2 = g2 ? kiln_to_device(g2, CPU) : NULL, *b3 = g3 ? kiln_to_device(g3, CPU) : NULL;
  CHECK(equal_values(b2, t) && equal_values(b3, t));
  struct kiln_tensor *gp = g ? kiln_to_device_non_blocking(g, CPU) : NULL;   /* downloads always wait */
  CHECK(equal_values(gp, t));
  CHECK_ERR(kiln_tensor_pin_memory(g), "only cpu tensors can be pinned");

  struct kiln_cuda_memory m;
  CHECK(kiln_cuda_memory_stats(0, &m) == 0 && m.pinned_allocated >= 2 * 4096 && m.pinned_reserved >= m.pinned_allocated);

  /* freeing gives the block back to the backend's cache, which hands it out again */
  int64_t frees = C_(host_frees), raw = C_(raw_host_allocs);
  kiln_tensor_free(pt);
  CHECK(!kiln_tensor_is_pinned(pt));
  if (fake) CHECK(C_(host_frees) == frees + 1);
  struct kiln_tensor *again = kiln_tensor_pin_memory(tt);
  CHECK(again && equal_values(again, tt));
  if (fake) CHECK(C_(raw_host_allocs) == raw && C_(bad_host_frees) == 0);

  struct kiln_tensor *all[] = {t, p, tt, pt, row, e, pe, g, back, grow, rback, g2, g3, b2, b3, gp, again};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
  if (fake) CHECK(C_(host_frees) == C_(host_allocs) && C_(bad_host_frees) == 0);
}

/* Batches of a loader with pin_memory against the same loader without: the same bytes, in the same
   order, every tensor pinned and allocated through the backend's host_alloc. */
static void loader(int workers, int with_transforms) {
  int64_t N = 37;
  struct kiln_tensor *x = ramp(4, (int64_t[]){N, 2, 4, 6}, KILN_F32), *y = ramp(1, (int64_t[]){N}, KILN_I64);
  struct kiln_tensor *xy[2] = {x, y};
  struct kiln_dataset *d = kiln_dataset_tensors(2, xy);
  struct kiln_transforms *tf = kiln_transforms_new();
  CHECK(kiln_transforms_hflip(tf, 0.5) == 0 && kiln_transforms_normalize(tf, 1, (double[]){0.5}, (double[]){2.0}) == 0);
  struct kiln_loader *plain = kiln_loader_new(d, 8, 1, 0, workers, 3, 42), *pinned = kiln_loader_new(d, 8, 1, 0, workers, 3, 42);
  if (with_transforms) CHECK(kiln_loader_set_transforms(plain, tf) == 0 && kiln_loader_set_transforms(pinned, tf) == 0);
  CHECK(kiln_loader_set_pin_memory(pinned, 1) == KILN_OK);
  int64_t allocs = C_(host_allocs);
  int batches = 0, same = 1, all_pinned = 1, none_pinned = 1;
  for (int epoch = 0; epoch < 2; epoch++) {
    CHECK(kiln_loader_start_epoch(plain, epoch, NULL, 0) == 0 && kiln_loader_start_epoch(pinned, epoch, NULL, 0) == 0);
    for (;;) {
      struct kiln_tensor *a[2] = {0}, *b[2] = {0};
      CHECK(kiln_loader_next(plain, &a[0], &a[1]) == 0 && kiln_loader_next(pinned, &b[0], &b[1]) == 0);
      if (!a[0] || !b[0]) {
        CHECK(!a[0] && !b[0]);
        break;
      }
      batches++;
      for (int k = 0; k < 2; k++) {
        same &= equal_values(a[k], b[k]);
        all_pinned &= kiln_tensor_is_pinned(b[k]);
        none_pinned &= !kiln_tensor_is_pinned(a[k]);
        /* the upload a training loop makes, not waiting, then checked */
        struct kiln_tensor *g = kiln_to_device_non_blocking(b[k], CUDA0);
        kiln_tensor_release(b[k]);   /* the pinned block may go while the copy is in flight */
        struct kiln_tensor *h = g && kiln_cuda_synchronize(0) == 0 ? kiln_to_device(g, CPU) : NULL;
        same &= equal_values(h, a[k]);
        kiln_tensor_release(a[k]);
        kiln_tensor_release(g);
        kiln_tensor_release(h);
      }
    }
  }
  CHECK(batches == 2 * 5);
  CHECK(same);
  CHECK(all_pinned && none_pinned);
  if (fake) CHECK(C_(host_allocs) == allocs + 2 * batches && C_(bad_host_frees) == 0 && C_(async_copies_untracked) == 0);
  printf("test_pinned: loader with %d workers%s: %d batches, pinned and plain identical\n", workers,
         with_transforms ? " and transforms" : "", batches);
  CHECK_ERR(kiln_loader_set_pin_memory(NULL, 1), "the loader is missing");
  kiln_loader_free(plain);
  kiln_loader_free(pinned);
  kiln_transforms_free(tf);
  kiln_dataset_release(d);
  kiln_tensor_release(x);
  kiln_tensor_release(y);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "default";
  if (!kiln_cuda_is_available()) {
    CHECK(strcmp(mode, "fake") != 0);   /* the fake device must have loaded */
    no_device();
    return check_done("test_pinned");
  }
  if (strcmp(mode, "fake") == 0) {
    const char *lib = getenv("KILN_CUDA_LIB");
    void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
    void *sym = h ? dlsym(h, "fake_cuda_counters") : NULL;
    fake_cuda_counters_fn fn;
    memcpy(&fn, &sym, sizeof fn);
    CHECK(fn != NULL);
    if (!fn) return check_done("test_pinned");
    fake = fn();
  }
  tensors();
  loader(0, 0);
  loader(2, 1);
  loader(3, 0);
  return check_done("test_pinned");
}
