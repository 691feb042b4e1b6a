/* test_cuda_conv_cache.c: the host side of the cuDNN convolutions (runtime/cuda/conv_cache.c,
   compiled into this test): shape keys compare and hash by every field (the graph API's and each
   buffer alignment included), the algorithm table answers hits and misses, keeps the first choice
   of a key, holds graph-API plans and legacy fallbacks beside legacy algorithms and survives
   growing, KILN_CUDNN_API values parse (graph by default, anything unknown refused), and the
   per-device workspace grows only when a pass needs more, keeping its block when an allocation
   fails. */
#include "check.h"
#include "conv_cache.h"

static const int64_t X[4] = {8, 6, 17, 13}, W[4] = {12, 3, 3, 5}, Y[4] = {8, 12, 9, 7};
static const int64_t INTS[7] = {2, 2, 1, 2, 1, 1, 2};

static struct kiln_conv_key key(int pass) {
  struct kiln_conv_key k;
  kiln_conv_key_make(&k, pass, KILN_F32, 0, 0, X, W, Y, INTS);
  return k;
}

static void test_keys(void) {
  struct kiln_conv_key a = key(KILN_CONV_FORWARD), b = key(KILN_CONV_FORWARD);
  CHECK(kiln_conv_key_equal(&a, &b));
  CHECK(kiln_conv_key_hash(&a) == kiln_conv_key_hash(&b));
  /* every field that can change an algorithm changes the key */
  struct kiln_conv_key c;
  c = key(KILN_CONV_BACKWARD_DATA); CHECK(!kiln_conv_key_equal(&a, &c));
  c = key(KILN_CONV_BACKWARD_FILTER); CHECK(!kiln_conv_key_equal(&a, &c));
  kiln_conv_key_make(&c, KILN_CONV_FORWARD, KILN_F64, 0, 0, X, W, Y, INTS); CHECK(!kiln_conv_key_equal(&a, &c));
  kiln_conv_key_make(&c, KILN_CONV_FORWARD, KILN_F32, 1, 0, X, W, Y, INTS); CHECK(!kiln_conv_key_equal(&a, &c));
  kiln_conv_key_make(&c, KILN_CONV_FORWARD, KILN_F32, 0, 1, X, W, Y, INTS); CHECK(!kiln_conv_key_equal(&a, &c));
  for (int i = 0; i < 4; i++) {
    int64_t x[4], w[4], y[4];
    memcpy(x, X, sizeof x); memcpy(w, W, sizeof w); memcpy(y, Y, sizeof y);
    x[i]++;
    kiln_conv_key_make(&c, KILN_CONV_FORWARD, KILN_F32, 0, 0, x, W, Y, INTS);
    CHECK(!kiln_conv_key_equal(&a, &c));
    if (i != 1) {   /* w[1] is c/groups: the key holds c and groups instead */
      w[i]++;
      kiln_conv_key_make(&c, KILN_CONV_FORWARD, KILN_F32, 0, 0, X, w, Y, INTS);
      CHECK(!kiln_conv_key_equal(&a, &c));
    }
    if (i >= 2) {
      y[i]++;
      kiln_conv_key_make(&c, KILN_CONV_FORWARD, KILN_F32, 0, 0, X, W, y, INTS);
      CHECK(!kiln_conv_key_equal(&a, &c));
    }
  }
  for (int i = 0; i < 7; i++) {
    int64_t ints[7];
    memcpy(ints, INTS, sizeof ints);
    ints[i]++;
    kiln_conv_key_make(&c, KILN_CONV_FORWARD, KILN_F32, 0, 0, X, W, Y, ints);
    CHECK(!kiln_conv_key_equal(&a, &c));
    CHECK(kiln_conv_key_hash(&a) != kiln_conv_key_hash(&c));
  }
  /* the graph API's keys differ from the legacy API's, and by every buffer alignment */
  struct kiln_conv_key g = key(KILN_CONV_FORWARD);
  g.api = KILN_CONV_API_GRAPH; g.align_x = g.align_w = g.align_y = 16;
  CHECK(!kiln_conv_key_equal(&a, &g));
  for (int i = 0; i < 3; i++) {
    struct kiln_conv_key h = g;
    int32_t *align[3] = {&h.align_x, &h.align_w, &h.align_y};
    *align[i] = 4;
    CHECK(!kiln_conv_key_equal(&g, &h));
    CHECK(kiln_conv_key_hash(&g) != kiln_conv_key_hash(&h));
  }
  /* keys made over dirty memory still compare equal: kiln_conv_key_make clears the padding */
  struct kiln_conv_key d;
  memset(&d, 0xab, sizeof d);
  kiln_conv_key_make(&d, KILN_CONV_FORWARD, KILN_F32, 0, 0, X, W, Y, INTS);
  CHECK(kiln_conv_key_equal(&a, &d));
  CHECK(kiln_conv_key_hash(&a) == kiln_conv_key_hash(&d));
}

static void test_cache(void) {
  struct kiln_conv_cache *cache = kiln_conv_cache_new();
  CHECK(cache != NULL);
  if (!cache) return;
  struct kiln_conv_key k = key(KILN_CONV_FORWARD);
  struct kiln_conv_choice got = {-1, 0}, first = {3, 4096}, second = {5, 1};
  CHECK(!kiln_conv_cache_get(cache, &k, &got));   /* a miss leaves the choice alone */
  CHECK(got.algo == -1);
  CHECK(kiln_conv_cache_put(cache, &k, &first) == 0);
  CHECK(kiln_conv_cache_get(cache, &k, &got));
  CHECK(got.algo == 3 && got.workspace == 4096);
  CHECK(kiln_conv_cache_put(cache, &k, &second) == 0);   /* the first choice stays */
  CHECK(kiln_conv_cache_get(cache, &k, &got) && got.algo == 3);
  CHECK(kiln_conv_cache_count(cache) == 1);
  struct kiln_conv_key other = key(KILN_CONV_BACKWARD_DATA);
  CHECK(!kiln_conv_cache_get(cache, &other, &got));
  /* many shapes: the table grows and every key still finds its own choice */
  enum { MANY = 1000 };
  for (int i = 0; i < MANY; i++) {
    int64_t x[4] = {1 + i, 3, 32, 32};
    struct kiln_conv_key ki;
    kiln_conv_key_make(&ki, KILN_CONV_BACKWARD_FILTER, KILN_F64, i % 3, i % 2, x, W, Y, INTS);
    struct kiln_conv_choice ch = {i, (size_t)i * 7};
    CHECK(kiln_conv_cache_put(cache, &ki, &ch) == 0);
  }
  CHECK(kiln_conv_cache_count(cache) == MANY + 1);
  int all = 1;
  for (int i = 0; i < MANY; i++) {
    int64_t x[4] = {1 + i, 3, 32, 32};
    struct kiln_conv_key ki;
    kiln_conv_key_make(&ki, KILN_CONV_BACKWARD_FILTER, KILN_F64, i % 3, i % 2, x, W, Y, INTS);
    struct kiln_conv_choice ch = {-1, 0};
    all &= kiln_conv_cache_get(cache, &ki, &ch) && ch.algo == i && ch.workspace == (size_t)i * 7;
    ki.benchmark ^= 1;   /* the same shape searched the other way: not there */
    all &= !kiln_conv_cache_get(cache, &ki, &ch);
  }
  CHECK(all);
  CHECK(kiln_conv_cache_get(cache, &k, &got) && got.algo == 3);
  /* a graph-API entry: its plan pointer and legacy flag come back as stored */
  int plan_stand_in;
  struct kiln_conv_key kg = key(KILN_CONV_FORWARD);
  kg.api = KILN_CONV_API_GRAPH; kg.align_x = kg.align_w = kg.align_y = 16;
  struct kiln_conv_choice pc = {0, 1 << 20, &plan_stand_in, 0}, lc = {0, 0, NULL, 1};
  CHECK(!kiln_conv_cache_get(cache, &kg, &got));
  CHECK(kiln_conv_cache_put(cache, &kg, &pc) == 0);
  CHECK(kiln_conv_cache_get(cache, &kg, &got) && got.plan == &plan_stand_in && !got.legacy && got.workspace == 1 << 20);
  kg.align_y = 4;
  CHECK(kiln_conv_cache_put(cache, &kg, &lc) == 0);
  CHECK(kiln_conv_cache_get(cache, &kg, &got) && got.plan == NULL && got.legacy == 1);
  CHECK(kiln_conv_cache_get(cache, &k, &got) && got.algo == 3 && got.plan == NULL && !got.legacy);   /* the legacy entry untouched */
  kiln_conv_cache_free(cache);
  kiln_conv_cache_free(NULL);
}

/* A pretend device: counts allocations and frees, refuses when told to, and refuses what no
   device holds (more than 1 TiB) without asking malloc (which ASan would abort on). */
struct fake { int allocs, frees, refuse; size_t live; };
static int fake_alloc(void *ctx, size_t bytes, void **out) {
  struct fake *f = ctx;
  if (f->refuse || bytes > ((size_t)1 << 40)) return KILN_ERR_MEMORY;
  *out = malloc(bytes);
  if (!*out) return KILN_ERR_MEMORY;
  f->allocs++;
  f->live += bytes;
  return 0;
}
static void fake_free(void *ctx, void *ptr) {
  struct fake *f = ctx;
  f->frees++;
  free(ptr);
}

static void test_workspace(void) {
  struct fake f = {0, 0, 0, 0};
  struct kiln_conv_workspace ws = {NULL, 0, fake_alloc, fake_free, &f};
  const size_t MIB = (size_t)1 << 20;
  CHECK(kiln_conv_workspace_reserve(&ws, 0) == 0);   /* nothing needed: nothing allocated */
  CHECK(ws.ptr == NULL && f.allocs == 0);
  CHECK(kiln_conv_workspace_reserve(&ws, 1000) == 0);
  CHECK(ws.ptr != NULL && ws.bytes == MIB && f.allocs == 1);
  void *p = ws.ptr;
  CHECK(kiln_conv_workspace_reserve(&ws, MIB) == 0);   /* fits: the same block */
  CHECK(ws.ptr == p && f.allocs == 1 && f.frees == 0);
  CHECK(kiln_conv_workspace_reserve(&ws, 10) == 0);
  CHECK(ws.ptr == p && ws.bytes == MIB);
  CHECK(kiln_conv_workspace_reserve(&ws, 3 * MIB + 1) == 0);   /* grows, rounded up; the old block freed */
  CHECK(ws.bytes == 4 * MIB && f.allocs == 2 && f.frees == 1);
  p = ws.ptr;
  f.refuse = 1;
  CHECK(kiln_conv_workspace_reserve(&ws, 64 * MIB) == KILN_ERR_MEMORY);   /* fails: the old block stays */
  CHECK(ws.ptr == p && ws.bytes == 4 * MIB && f.frees == 1);
  CHECK(kiln_conv_workspace_reserve(&ws, 2 * MIB) == 0);   /* and still serves what fits */
  f.refuse = 0;
  /* a need so large that rounding it up to whole MiB would wrap around: asked for as it is (and
     refused), never rounded down to a small block that is then taken for enough */
  CHECK(kiln_conv_workspace_reserve(&ws, SIZE_MAX) == KILN_ERR_MEMORY);
  CHECK(kiln_conv_workspace_reserve(&ws, SIZE_MAX - MIB / 2) == KILN_ERR_MEMORY);
  CHECK(ws.ptr == p && ws.bytes == 4 * MIB && f.frees == 1);
  kiln_conv_workspace_release(&ws);
  CHECK(ws.ptr == NULL && ws.bytes == 0 && f.frees == 2);
  kiln_conv_workspace_release(&ws);   /* twice: nothing more */
  CHECK(f.frees == 2);
}

static void test_api(void) {
  CHECK(kiln_conv_api_parse(NULL) == KILN_CONV_API_GRAPH);   /* the default */
  CHECK(kiln_conv_api_parse("") == KILN_CONV_API_GRAPH);
  CHECK(kiln_conv_api_parse("graph") == KILN_CONV_API_GRAPH);
  CHECK(kiln_conv_api_parse("legacy") == KILN_CONV_API_LEGACY);
  CHECK(kiln_conv_api_parse("Legacy") == -1);
  CHECK(kiln_conv_api_parse("graphs") == -1);
  CHECK(kiln_conv_api_parse("1") == -1);
}

int main(void) {
  test_keys();
  test_api();
  test_cache();
  test_workspace();
  return check_done("test_cuda_conv_cache");
}
