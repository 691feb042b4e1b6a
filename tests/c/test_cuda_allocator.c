/* test_cuda_allocator.c: the CUDA caching allocator's bookkeeping (runtime/cuda/allocator.c,
   compiled into this test) over a fake device: size classes, splitting and merging, best fit,
   streams, reuse without raw allocations in steady state, emptying the cache, and out of memory
   (give the cache back, retry once, then a message naming the request and the memory in use). */
#include "check.h"
#include "allocator.h"

/* A fake device: hands out addresses of a pretend address space (never dereferenced), refuses
   past `capacity` bytes in use, and checks that every raw free matches a raw allocation. */
enum { MAX_RAW = 4096 };
struct fake {
  int64_t capacity, in_use;
  uintptr_t next;
  int nraw;
  struct { uintptr_t p; int64_t n; } raw[MAX_RAW];
  int allocs, frees, bad_frees;
};

static int fake_alloc(void *ctx, int64_t n, void **out, char *err, size_t errlen) {
  struct fake *f = ctx;
  if (f->in_use + n > f->capacity || f->nraw == MAX_RAW) {
    snprintf(err, errlen, "fake device full (%lld of %lld bytes in use)", (long long)f->in_use, (long long)f->capacity);
    return 2;   /* cudaErrorMemoryAllocation */
  }
  f->raw[f->nraw].p = f->next;
  f->raw[f->nraw].n = n;
  f->nraw++;
  *out = (void *)f->next;
  f->next += (uintptr_t)((n + (2 << 20) - 1) / (2 << 20) * (2 << 20)) + (2 << 20);   /* gaps between segments */
  f->in_use += n;
  f->allocs++;
  return 0;
}

static void fake_free(void *ctx, void *p, int64_t n) {
  struct fake *f = ctx;
  for (int i = 0; i < f->nraw; i++)
    if (f->raw[i].p == (uintptr_t)p) {
      if (f->raw[i].n != n) f->bad_frees++;
      f->in_use -= f->raw[i].n;
      f->raw[i] = f->raw[--f->nraw];
      f->frees++;
      return;
    }
  f->bad_frees++;
}

static struct kiln_caching_allocator *fresh(struct fake *f, int64_t capacity) {
  memset(f, 0, sizeof *f);
  f->capacity = capacity;
  f->next = (uintptr_t)1 << 40;
  return kiln_caching_new(0, (struct kiln_alloc_backing){f, fake_alloc, fake_free});
}

static void *get(struct kiln_caching_allocator *a, uintptr_t stream, int64_t n) {
  void *p = NULL;
  char err[512];
  if (kiln_caching_alloc(a, stream, n, &p, err, sizeof err)) {
    fprintf(stderr, "alloc %lld failed: %s\n", (long long)n, err);
    return NULL;
  }
  return p;
}

#define CHECK_INVARIANTS(a)                                                                                \
  do {                                                                                                     \
    char check_e_[256] = "";                                                                               \
    int check_r_ = kiln_caching_check((a), check_e_, sizeof check_e_);                                     \
    check_report(check_r_ == 0, __FILE__, __LINE__, "allocator invariants: %s", check_e_);                 \
  } while (0)

static const int64_t MiB = (int64_t)1 << 20;

static void test_sizes(void) {
  CHECK(kiln_caching_round(0) == 512);
  CHECK(kiln_caching_round(1) == 512);
  CHECK(kiln_caching_round(512) == 512);
  CHECK(kiln_caching_round(513) == 1024);
  CHECK(kiln_caching_round(MiB) == MiB);
  CHECK(kiln_caching_round(MiB + 1) == MiB + 512);
  CHECK(kiln_caching_round(-1) == -1);
  CHECK(kiln_caching_round(INT64_MAX) == -1);
  CHECK(kiln_caching_segment_size(512) == 2 * MiB);
  CHECK(kiln_caching_segment_size(MiB) == 2 * MiB);
  CHECK(kiln_caching_segment_size(MiB + 512) == 20 * MiB);
  CHECK(kiln_caching_segment_size(10 * MiB - 512) == 20 * MiB);
  CHECK(kiln_caching_segment_size(10 * MiB) == 10 * MiB);
  CHECK(kiln_caching_segment_size(10 * MiB + 512) == 12 * MiB);
  CHECK(kiln_caching_segment_size(1000 * MiB + 512) == 1002 * MiB);
}

static void test_small_blocks_share_a_segment(void) {
  struct fake f;
  struct kiln_caching_allocator *a = fresh(&f, 1 << 30);
  char *p[4];
  for (int i = 0; i < 4; i++) p[i] = get(a, 0, 1000);
  CHECK(f.allocs == 1);
  for (int i = 1; i < 4; i++) CHECK(p[i] == p[i - 1] + 1024);
  CHECK(kiln_caching_block_size(a, p[0]) == 1024);
  void *z = get(a, 0, 0);   /* an empty tensor still gets a block (and a pointer) */
  CHECK(z != NULL && kiln_caching_block_size(a, z) == 512);
  struct kiln_cuda_memory s;
  kiln_caching_stats(a, &s);
  CHECK(s.allocated == 4 * 1024 + 512 && s.reserved == 2 * MiB && s.device_allocs == 1 && s.requests == 5);
  CHECK(s.cache_hits == 4);   /* all but the first came from the segment's rest */
  CHECK_INVARIANTS(a);
  CHECK(kiln_caching_free(a, p[1]) == 0 && kiln_caching_free(a, p[2]) == 0);
  CHECK_INVARIANTS(a);
  /* the hole of p[1] and p[2] merged: 2048 bytes fit there exactly (best fit before the big rest) */
  char *q = get(a, 0, 2048);
  CHECK(q == p[1]);
  CHECK_INVARIANTS(a);
  CHECK(kiln_caching_free(a, q) == 0 && kiln_caching_free(a, p[0]) == 0 && kiln_caching_free(a, p[3]) == 0 &&
        kiln_caching_free(a, z) == 0);
  kiln_caching_stats(a, &s);
  CHECK(s.allocated == 0 && s.reserved == 2 * MiB);
  CHECK_INVARIANTS(a);
  CHECK(kiln_caching_free(a, p[0]) == -1);          /* twice */
  CHECK(kiln_caching_free(a, (void *)12345) == -1);  /* never handed out */
  CHECK(kiln_caching_empty(a) == 2 * MiB);
  kiln_caching_stats(a, &s);
  CHECK(s.reserved == 0 && s.device_frees == 1 && f.in_use == 0 && f.bad_frees == 0);
  CHECK_INVARIANTS(a);
  kiln_caching_destroy(a);
}

static void test_best_fit_and_large_rules(void) {
  struct fake f;
  struct kiln_caching_allocator *a = fresh(&f, (int64_t)1 << 34);
  /* free blocks of 4 KiB and 8 KiB kept apart by held ones: 4000 bytes takes the 4 KiB one */
  char *b1 = get(a, 0, 8192), *h1 = get(a, 0, 512), *b2 = get(a, 0, 4096), *h2 = get(a, 0, 512);
  kiln_caching_free(a, b1);
  kiln_caching_free(a, b2);
  CHECK(get(a, 0, 4000) == b2);
  CHECK(get(a, 0, 5000) == b1);   /* and 5000 bytes the front of the 8 KiB one */
  CHECK_INVARIANTS(a);
  (void)h1; (void)h2;
  /* 12 MiB gets its own 12 MiB segment; 11 MiB then reuses it whole (a rest of 1 MiB is not split) */
  void *l = get(a, 0, 12 * MiB);
  struct kiln_cuda_memory s0, s;
  kiln_caching_stats(a, &s0);
  kiln_caching_free(a, l);
  void *l2 = get(a, 0, 11 * MiB);
  kiln_caching_stats(a, &s);
  CHECK(l2 == l && kiln_caching_block_size(a, l2) == 12 * MiB && s.device_allocs == s0.device_allocs);
  /* 2 MiB comes from a 20 MiB segment whose 18 MiB rest serves the next requests */
  int allocs = f.allocs;
  char *m1 = get(a, 0, 2 * MiB), *m2 = get(a, 0, 3 * MiB);
  CHECK(f.allocs == allocs + 1 && m2 == m1 + 2 * MiB);
  CHECK(kiln_caching_block_size(a, m1) == 2 * MiB);
  /* the small pool never serves from a large segment, nor the other way round */
  char *sm = get(a, 0, 4096);
  CHECK(!(sm >= m1 && sm < m1 + 20 * MiB));
  CHECK_INVARIANTS(a);
  kiln_caching_destroy(a);
  CHECK(f.in_use == 0 && f.bad_frees == 0);   /* destroy gives back segments with held blocks too */
}

static void test_streams(void) {
  struct fake f;
  struct kiln_caching_allocator *a = fresh(&f, 1 << 30);
  void *p = get(a, 1, 100000);
  kiln_caching_free(a, p);
  void *q = get(a, 2, 100000);   /* cached on stream 1: stream 2 gets a segment of its own */
  CHECK(f.allocs == 2 && q != p);
  void *r = get(a, 1, 100000);
  CHECK(r == p && f.allocs == 2);
  CHECK_INVARIANTS(a);
  kiln_caching_destroy(a);
  CHECK(f.in_use == 0 && f.bad_frees == 0);
}

static void test_steady_state(void) {
  struct fake f;
  struct kiln_caching_allocator *a = fresh(&f, (int64_t)1 << 34);
  const int64_t sizes[] = {4, 1000, 300000, 5 * MiB, 33 * MiB + 7, 1 * MiB, 64};
  enum { N = sizeof sizes / sizeof sizes[0] };
  int after_first = 0;
  for (int step = 0; step < 100; step++) {
    void *p[N];
    for (int i = 0; i < N; i++) p[i] = get(a, 0, sizes[i]);
    for (int i = N - 1; i >= 0; i -= 2) kiln_caching_free(a, p[i]);   /* out of order */
    for (int i = N - 2; i >= 0; i -= 2) kiln_caching_free(a, p[i]);
    if (step == 0) after_first = f.allocs;
  }
  struct kiln_cuda_memory s;
  kiln_caching_stats(a, &s);
  CHECK(f.allocs == after_first);   /* a training loop's allocations never reach the driver again */
  CHECK(s.requests == 100 * N && s.cache_hits >= 99 * N && s.allocated == 0);
  CHECK(s.peak_allocated > 38 * MiB && s.peak_reserved == s.reserved);
  CHECK_INVARIANTS(a);
  kiln_caching_destroy(a);
}

static void test_out_of_memory(void) {
  struct fake f;
  struct kiln_caching_allocator *a = fresh(&f, 64 * MiB);
  void *big = get(a, 0, 40 * MiB);
  kiln_caching_free(a, big);   /* cached: 40 MiB reserved, nothing held */
  void *p = get(a, 0, 50 * MiB);   /* refused at first; the cache goes back; the retry succeeds */
  struct kiln_cuda_memory s;
  kiln_caching_stats(a, &s);
  CHECK(p != NULL && s.oom_retries == 1 && s.device_frees == 1 && s.reserved == 50 * MiB);
  CHECK_INVARIANTS(a);
  void *q = NULL;
  char err[512] = "";
  int rc = kiln_caching_alloc(a, 0, 30 * MiB, &q, err, sizeof err);
  CHECK(rc == KILN_ERR_MEMORY && q == NULL);
  CHECK(strstr(err, "out of memory") && strstr(err, "30.0 MiB") && strstr(err, "31457280 bytes") && strstr(err, "cuda:0"));
  CHECK(strstr(err, "tensors hold 50.0 MiB") && strstr(err, "50.0 MiB reserved") && strstr(err, "fake device full"));
  if (rc != KILN_ERR_MEMORY || !strstr(err, "tensors hold")) fprintf(stderr, "message: %s\n", err);
  CHECK_INVARIANTS(a);
  /* still usable: a small request fits beside */
  void *r = get(a, 0, 1000);
  CHECK(r != NULL);
  kiln_caching_free(a, p);
  kiln_caching_free(a, r);
  CHECK_INVARIANTS(a);
  kiln_caching_destroy(a);
  CHECK(f.in_use == 0 && f.bad_frees == 0);
}

/* Random allocations and frees on two streams, with every invariant checked as it goes. */
static void test_random_walk(void) {
  struct fake f;
  struct kiln_caching_allocator *a = fresh(&f, (int64_t)1 << 36);
  enum { SLOTS = 200 };
  void *held[SLOTS] = {0};
  int64_t want[SLOTS] = {0};
  uint64_t x = 12345;
  int ok = 1;
  for (int step = 0; step < 20000 && ok; step++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    int i = (int)((x >> 33) % SLOTS);
    if (held[i]) {
      ok &= kiln_caching_free(a, held[i]) == 0;
      held[i] = NULL;
    } else {
      uint64_t r = x >> 40;
      int64_t n = r % 4 == 0 ? (int64_t)(r % (40 * MiB)) : (int64_t)(r % 200000);
      held[i] = get(a, (x >> 20) & 1, n);
      want[i] = n;
      ok &= held[i] != NULL && kiln_caching_block_size(a, held[i]) >= want[i];
    }
    if (step % 500 == 0) {
      char e[256];
      ok &= kiln_caching_check(a, e, sizeof e) == 0;
      if (!ok) fprintf(stderr, "step %d: %s\n", step, e);
    }
    if (step % 5000 == 4999) kiln_caching_empty(a);
  }
  CHECK(ok);
  /* held blocks never overlap */
  for (int i = 0; i < SLOTS; i++)
    for (int j = i + 1; j < SLOTS; j++)
      if (held[i] && held[j]) {
        char *p = held[i], *q = held[j];
        int64_t np = kiln_caching_block_size(a, p), nq = kiln_caching_block_size(a, q);
        if (p < q + nq && q < p + np) ok = 0;
      }
  CHECK(ok);
  for (int i = 0; i < SLOTS; i++)
    if (held[i]) kiln_caching_free(a, held[i]);
  struct kiln_cuda_memory s;
  kiln_caching_stats(a, &s);
  CHECK(s.allocated == 0);
  CHECK_INVARIANTS(a);
  kiln_caching_empty(a);
  kiln_caching_stats(a, &s);
  CHECK(s.reserved == 0 && f.in_use == 0 && f.bad_frees == 0);
  kiln_caching_destroy(a);
}

/* Fake streams and events for blocks used on other streams: an event is a ticket on its stream,
   done once the test has "finished" that stream's work up to it; waiting finishes it. */
enum { STREAMS = 8 };
struct fake_events {
  int64_t issued[STREAMS], finished[STREAMS];
  int live, waits, records;
};
struct fake_event { int stream; int64_t ticket; };
static struct fake_events events;

static void *fake_event_record(void *ctx, uintptr_t stream) {
  (void)ctx;
  struct fake_event *e = malloc(sizeof *e);
  e->stream = (int)stream;
  e->ticket = ++events.issued[stream];
  events.live++;
  events.records++;
  return e;
}
static int fake_event_done(void *ctx, void *ev) {
  (void)ctx;
  struct fake_event *e = ev;
  if (events.finished[e->stream] < e->ticket) return 0;
  free(e);
  events.live--;
  return 1;
}
static void fake_event_wait(void *ctx, void *ev) {
  (void)ctx;
  struct fake_event *e = ev;
  if (events.finished[e->stream] < e->ticket) events.finished[e->stream] = e->ticket;
  events.waits++;
  free(e);
  events.live--;
}
static void finish(int stream) { events.finished[stream] = events.issued[stream]; }

static struct kiln_caching_allocator *fresh_with_events(struct fake *f, int64_t capacity) {
  memset(f, 0, sizeof *f);
  memset(&events, 0, sizeof events);
  f->capacity = capacity;
  f->next = (uintptr_t)1 << 40;
  return kiln_caching_new(0, (struct kiln_alloc_backing){f, fake_alloc, fake_free, fake_event_record, fake_event_done,
                                                          fake_event_wait});
}

static void test_record_stream(void) {
  struct fake f;
  struct kiln_caching_allocator *a = fresh_with_events(&f, 1 << 30);
  struct kiln_cuda_memory st;
  /* used on stream 2 too: after the free, stream 1 does not get it back until stream 2's work is done */
  void *p = get(a, 1, 100000);
  CHECK(kiln_caching_record_stream(a, p, 2) == 0);
  CHECK(kiln_caching_record_stream(a, p, 2) == 0);   /* twice: one use */
  CHECK(kiln_caching_record_stream(a, p, 1) == 0);   /* its own stream: nothing to note */
  CHECK(kiln_caching_free(a, p) == 0);
  CHECK(events.records == 1 && kiln_caching_pending(a) == 1);
  CHECK_INVARIANTS(a);
  kiln_caching_stats(a, &st);
  CHECK(st.allocated == kiln_caching_round(100000));   /* still counted while other streams may use it */
  void *q = get(a, 1, 100000);
  CHECK(q != p);
  CHECK_INVARIANTS(a);
  finish(2);
  CHECK(kiln_caching_pending(a) == 0 && events.live == 0);
  kiln_caching_free(a, q);
  void *r = get(a, 1, 100000);
  CHECK(r == p || r == q);                            /* both are free on stream 1 again */
  kiln_caching_stats(a, &st);
  CHECK(st.allocated == kiln_caching_round(100000));
  CHECK_INVARIANTS(a);
  kiln_caching_free(a, r);

  /* only its own stream: straight back */
  void *s1 = get(a, 3, 4096);
  CHECK(kiln_caching_record_stream(a, s1, 3) == 0);
  kiln_caching_free(a, s1);
  CHECK(kiln_caching_pending(a) == 0 && events.records == 1);
  CHECK(get(a, 3, 4096) == s1);
  kiln_caching_free(a, s1);

  /* several streams: back once all of them are done */
  void *m = get(a, 1, 3 * MiB);
  CHECK(kiln_caching_record_stream(a, m, 4) == 0 && kiln_caching_record_stream(a, m, 5) == 0);
  kiln_caching_free(a, m);
  finish(4);
  CHECK(kiln_caching_pending(a) == 1);
  finish(5);
  CHECK(kiln_caching_pending(a) == 0);
  CHECK(get(a, 1, 3 * MiB) == m);
  CHECK_INVARIANTS(a);

  /* a user stream destroyed (its work done): the block no longer waits for it, nor records on it */
  void *g = get(a, 1, 5000);
  CHECK(kiln_caching_record_stream(a, g, 6) == 0 && kiln_caching_record_stream(a, g, 7) == 0);
  kiln_caching_forget_stream(a, 6);
  int before = events.records;
  kiln_caching_free(a, g);
  CHECK(events.records == before + 1);   /* on stream 7 only */
  CHECK(kiln_caching_pending(a) == 1);
  finish(7);
  CHECK(kiln_caching_pending(a) == 0);
  g = get(a, 1, 5000);
  kiln_caching_forget_stream(a, 7);        /* a stream no block uses: nothing changes */
  kiln_caching_free(a, g);
  CHECK(kiln_caching_pending(a) == 0 && events.records == before + 1);
  CHECK_INVARIANTS(a);

  /* unknown pointers; a backing without events */
  CHECK(kiln_caching_record_stream(a, (void *)0x1234, 2) == -1);
  kiln_caching_free(a, m);
  kiln_caching_destroy(a);
  CHECK(f.in_use == 0 && f.bad_frees == 0 && events.live == 0);
  a = fresh(&f, 1 << 30);
  p = get(a, 1, 512);
  CHECK(kiln_caching_record_stream(a, p, 2) == -2);
  kiln_caching_destroy(a);

  /* out of memory waits for the pending blocks, gives the cache back and retries */
  a = fresh_with_events(&f, 24 * MiB);
  void *big = get(a, 1, 20 * MiB);
  CHECK(kiln_caching_record_stream(a, big, 2) == 0);
  kiln_caching_free(a, big);
  CHECK(kiln_caching_pending(a) == 1);
  void *other = get(a, 6, 20 * MiB);   /* another stream: needs the pending segment's memory */
  CHECK(other != NULL && events.waits == 1 && events.live == 0 && kiln_caching_pending(a) == 0);
  CHECK_INVARIANTS(a);
  kiln_caching_free(a, other);

  /* destroyed with a block pending: waited for, nothing leaks */
  void *d = get(a, 1, 1000);
  CHECK(kiln_caching_record_stream(a, d, 7) == 0);
  kiln_caching_free(a, d);
  kiln_caching_destroy(a);
  CHECK(f.in_use == 0 && f.bad_frees == 0 && events.live == 0);
}

int main(void) {
  test_sizes();
  test_small_blocks_share_a_segment();
  test_best_fit_and_large_rules();
  test_streams();
  test_record_stream();
  test_steady_state();
  test_out_of_memory();
  test_random_walk();
  return check_done("test_cuda_allocator");
}
