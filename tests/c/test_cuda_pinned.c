/* test_cuda_pinned.c: the cache of page-locked host blocks (runtime/cuda/pinned.c, compiled into
   this test) over a fake host and fake events the test completes by hand: sizes, reuse, a block
   read by a copy in flight is never handed out again nor given back before the copy's event has
   completed, empty_cache and destroy wait for those copies, out of memory (give the cache back,
   retry once, then a message naming the request and the pinned memory held), and threads. */
#include "check.h"
#include "pinned.h"
#include <pthread.h>

enum { MAX_RAW = 1024, MAX_EVENTS = 4096 };
struct fake {
  int64_t capacity, in_use;
  int nraw;
  struct { void *p; int64_t n; } raw[MAX_RAW];
  int allocs, frees, bad_frees;
  /* events: done[k] set by the test (or by waiting); released[k] when the cache let go */
  int nevents, done[MAX_EVENTS], released[MAX_EVENTS], waited[MAX_EVENTS];
  uintptr_t stream_of[MAX_EVENTS];
  int fail_record;
};

static int fake_alloc(void *ctx, int64_t n, void **out, char *err, size_t errlen) {
  struct fake *f = ctx;
  if (f->in_use + n > f->capacity || f->nraw == MAX_RAW) {
    snprintf(err, errlen, "cudaHostAlloc: fake host full (%lld of %lld bytes locked)", (long long)f->in_use,
             (long long)f->capacity);
    return 2;
  }
  void *p = malloc((size_t)n);   /* real memory: the test writes into blocks */
  if (!p) return 2;
  f->raw[f->nraw].p = p;
  f->raw[f->nraw].n = n;
  f->nraw++;
  f->in_use += n;
  f->allocs++;
  *out = p;
  return 0;
}

static void fake_free(void *ctx, void *p, int64_t n) {
  struct fake *f = ctx;
  for (int i = 0; i < f->nraw; i++)
    if (f->raw[i].p == p) {
      if (f->raw[i].n != n) f->bad_frees++;
      f->in_use -= f->raw[i].n;
      f->raw[i] = f->raw[--f->nraw];
      f->frees++;
      free(p);
      return;
    }
  f->bad_frees++;
}

/* An event is its number plus one, as a pointer. */
static int fake_record(void *ctx, uintptr_t stream, void **event, char *err, size_t errlen) {
  struct fake *f = ctx;
  if (f->fail_record || f->nevents == MAX_EVENTS) {
    snprintf(err, errlen, "cudaEventRecord: fake failure");
    return 3;
  }
  int k = f->nevents++;
  f->stream_of[k] = stream;
  *event = (void *)(uintptr_t)(k + 1);
  return 0;
}
static int fake_query(void *ctx, void *e) { return ((struct fake *)ctx)->done[(uintptr_t)e - 1]; }
static void fake_wait(void *ctx, void *e) {
  struct fake *f = ctx;
  f->done[(uintptr_t)e - 1] = 1;
  f->waited[(uintptr_t)e - 1] = 1;
}
static void fake_release(void *ctx, void *e) { ((struct fake *)ctx)->released[(uintptr_t)e - 1]++; }

static struct kiln_pinned_cache *fresh(struct fake *f, int64_t capacity) {
  memset(f, 0, sizeof *f);
  f->capacity = capacity;
  return kiln_pinned_new((struct kiln_pinned_backing){f, fake_alloc, fake_free, fake_record, fake_query, fake_wait,
                                                      fake_release});
}

static void *get(struct kiln_pinned_cache *c, int64_t n) {
  void *p = NULL;
  char err[512];
  if (kiln_pinned_alloc(c, n, &p, err, sizeof err)) {
    fprintf(stderr, "pinned alloc %lld failed: %s\n", (long long)n, err);
    return NULL;
  }
  return p;
}

static int record(struct kiln_pinned_cache *c, const void *p, uintptr_t stream) {
  char err[256];
  return kiln_pinned_record(c, p, stream, err, sizeof err);
}

#define CHECK_INVARIANTS(c)                                                                                \
  do {                                                                                                     \
    char check_e_[256] = "";                                                                               \
    int check_r_ = kiln_pinned_check((c), check_e_, sizeof check_e_);                                      \
    check_report(check_r_ == 0, __FILE__, __LINE__, "pinned cache invariants: %s", check_e_);              \
  } while (0)

static void test_sizes_and_reuse(void) {
  CHECK(kiln_pinned_round(0) == 4096 && kiln_pinned_round(1) == 4096 && kiln_pinned_round(4096) == 4096);
  CHECK(kiln_pinned_round(4097) == 8192 && kiln_pinned_round(-1) == -1 && kiln_pinned_round(INT64_MAX) == -1);
  struct fake f;
  struct kiln_pinned_cache *c = fresh(&f, 1 << 30);
  char *a = get(c, 10000), *b = get(c, 0);
  CHECK(a && b && f.allocs == 2 && kiln_pinned_contains(c, a + 12287) && !kiln_pinned_contains(c, a + 12288));
  memset(a, 7, 10000);   /* real, writable memory */
  CHECK(kiln_pinned_free(c, a) == 0);
  CHECK(kiln_pinned_free(c, a) == -1);         /* twice */
  CHECK(kiln_pinned_free(c, a + 8) == -1);     /* not a block's start */
  CHECK(!kiln_pinned_contains(c, a));          /* free blocks are not "held" */
  CHECK(get(c, 12000) == a && f.allocs == 2);  /* same rounded size: reused */
  kiln_pinned_free(c, a);
  CHECK(get(c, 6000) == a);                    /* 12 KiB serves 8 KiB (at most twice the request) */
  kiln_pinned_free(c, a);
  char *d = get(c, 4096);                      /* 12 KiB is more than twice 4 KiB: a new block */
  CHECK(d != a && f.allocs == 3);
  struct kiln_pinned_stats s;
  kiln_pinned_stats(c, &s);
  CHECK(s.requests == 5 && s.cache_hits == 2 && s.raw_allocs == 3 && s.allocated == 4096 + 4096 && s.reserved == 12288 + 8192);
  CHECK_INVARIANTS(c);
  CHECK(kiln_pinned_empty(c) == 12288 && f.frees == 1);
  kiln_pinned_free(c, b);
  kiln_pinned_free(c, d);
  CHECK_INVARIANTS(c);
  kiln_pinned_destroy(c);
  CHECK(f.in_use == 0 && f.nraw == 0 && f.bad_frees == 0);
}

/* The point of the events: a block whose copy is in flight is not reused, however it is freed. */
static void test_copies_in_flight(void) {
  struct fake f;
  struct kiln_pinned_cache *c = fresh(&f, 1 << 30);
  char *a = get(c, 50000);
  CHECK(record(c, a, 11) == 0);            /* a copy of the whole block */
  CHECK(record(c, a + 4096, 11) == 0);     /* and one of a view inside it */
  CHECK(f.nevents == 2 && f.stream_of[0] == 11);
  CHECK(record(c, (char *)&f, 11) == -1);  /* not pinned: the caller must wait itself */
  kiln_pinned_free(c, a);                  /* the storage let go while both copies still read it */
  struct kiln_pinned_stats s;
  kiln_pinned_stats(c, &s);
  CHECK(s.events_pending == 2 && s.allocated == 0);
  char *b = get(c, 50000);
  CHECK(b != NULL && b != a && f.allocs == 2);   /* a new block, not the busy one */
  kiln_pinned_stats(c, &s);
  CHECK(s.skipped_busy == 1);
  f.done[0] = 1;                                  /* one of the two copies finished: still busy */
  char *b2 = get(c, 50000);
  CHECK(b2 != a && f.allocs == 3);
  f.done[1] = 1;                                  /* both finished: the block comes back */
  char *b3 = get(c, 50000);
  CHECK(b3 == a && f.allocs == 3);
  CHECK(f.released[0] == 1 && f.released[1] == 1 && !f.waited[0] && !f.waited[1]);
  kiln_pinned_stats(c, &s);
  CHECK(s.events_pending == 0 && s.events_recorded == 2);
  CHECK_INVARIANTS(c);
  /* empty_cache waits for the copies of the free blocks it gives back */
  CHECK(record(c, b, 12) == 0);
  kiln_pinned_free(c, b);
  CHECK(kiln_pinned_empty(c) == kiln_pinned_round(50000) && f.waited[2] && f.released[2] == 1);
  /* destroy waits for the held blocks' copies too */
  CHECK(record(c, b2, 12) == 0);
  kiln_pinned_stats(c, &s);
  CHECK(s.events_pending == 1);
  CHECK_INVARIANTS(c);
  kiln_pinned_destroy(c);
  CHECK(f.waited[3] && f.released[3] == 1 && f.in_use == 0 && f.bad_frees == 0);
  for (int k = 0; k < f.nevents; k++) CHECK(f.released[k] == 1);
}

static void test_record_failure(void) {
  struct fake f;
  struct kiln_pinned_cache *c = fresh(&f, 1 << 30);
  char *a = get(c, 100);
  f.fail_record = 1;
  char err[256] = "";
  CHECK(kiln_pinned_record(c, a, 1, err, sizeof err) > 0 && strstr(err, "cudaEventRecord"));
  f.fail_record = 0;
  CHECK_INVARIANTS(c);
  kiln_pinned_destroy(c);
  CHECK(f.in_use == 0);
}

static void test_out_of_memory(void) {
  struct fake f;
  struct kiln_pinned_cache *c = fresh(&f, 64 << 10);   /* 64 KiB of lockable memory */
  char *a = get(c, 40 << 10), *b = get(c, 16 << 10);
  CHECK(a && b);
  CHECK(record(c, a, 5) == 0);
  kiln_pinned_free(c, a);   /* cached, its copy in flight */
  /* 32 KiB: the busy 40 KiB block may not be reused yet, the host is full: the cache is given back
     (waiting for the copy) and the request succeeds on the retry */
  char *d = get(c, 32 << 10);
  CHECK(d != NULL && f.waited[0] && f.frees == 1);
  struct kiln_pinned_stats s;
  kiln_pinned_stats(c, &s);
  CHECK(s.waits == 1 && s.reserved == (48 << 10));
  CHECK_INVARIANTS(c);
  /* more than the host has, even with nothing cached: a clear error */
  void *p = (void *)1;
  char err[512] = "";
  CHECK(kiln_pinned_alloc(c, 1 << 20, &p, err, sizeof err) == KILN_ERR_MEMORY && p == NULL);
  CHECK(strstr(err, "out of pinned memory") && strstr(err, "1.0 MiB") && strstr(err, "1048576 bytes"));
  CHECK(strstr(err, "fake host full") && strstr(err, "pinned tensors hold 48.0 KiB"));
  printf("test_cuda_pinned: %s\n", err);
  CHECK(get(c, 4096) != NULL);   /* still usable */
  CHECK_INVARIANTS(c);
  kiln_pinned_destroy(c);
  CHECK(f.in_use == 0 && f.bad_frees == 0);
}

/* Threads allocating, recording, completing and freeing at once (loader workers and the consumer). */
struct worker_arg { struct kiln_pinned_cache *c; int id, ok; };
static void *worker(void *p) {
  struct worker_arg *w = p;
  w->ok = 1;
  for (int i = 0; i < 400; i++) {
    int64_t n = 4096 * (1 + (i + w->id) % 5);
    char *b = get(w->c, n);
    if (!b) { w->ok = 0; break; }
    memset(b, w->id, (size_t)n);
    for (int64_t k = 0; k < n; k += 997)
      if (b[k] != (char)w->id) w->ok = 0;   /* nobody else holds this block */
    kiln_pinned_free(w->c, b);
  }
  return NULL;
}

static void test_threads(void) {
  struct fake f;
  struct kiln_pinned_cache *c = fresh(&f, (int64_t)1 << 30);
  pthread_t t[4];
  struct worker_arg a[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (struct worker_arg){c, i + 1, 0};
    pthread_create(&t[i], NULL, worker, &a[i]);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 4; i++) CHECK(a[i].ok);
  struct kiln_pinned_stats s;
  kiln_pinned_stats(c, &s);
  CHECK(s.allocated == 0 && s.requests == 1600 && s.cache_hits + s.raw_allocs == 1600 && s.raw_allocs <= 40);
  CHECK_INVARIANTS(c);
  kiln_pinned_destroy(c);
  CHECK(f.in_use == 0 && f.bad_frees == 0);
}

int main(void) {
  test_sizes_and_reuse();
  test_copies_in_flight();
  test_record_failure();
  test_out_of_memory();
  test_threads();
  return check_done("test_cuda_pinned");
}
