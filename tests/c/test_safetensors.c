/* test_safetensors.c: the safetensors writer and reader through the C API, run under ASan/UBSan
   too (make test-asan): every dtype round-trips bitwise, mapped and copied; tensors borrowed from
   a mapping outlive the handle and kiln_tensor_free releases them early; a failed write leaves
   the target as it was; every truncation of a file is an error naming it, without a leak. */
#include "check.h"
#include "internal.h"
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];
static char path[128];

static struct kiln_tensor *vec(int dtype, int64_t n, const double *v) {
  return kiln_tensor_from_f64(1, &n, v, dtype, (struct kiln_device){KILN_CPU, 0});
}

static long file_size(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

/* 0 when path opens (the handle is closed again), else the error's status. */
static int open_status(const char *p) {
  struct kiln_safetensors *f = kiln_safetensors_open(p, 0);
  if (!f) return kiln_error_code() ? kiln_error_code() : -1;
  kiln_safetensors_close(f);
  return 0;
}

static void test_round_trip(void) {
  const double v[5] = {0, -1.5, 2.25, 100, 1};
  struct kiln_tensor *t[KILN_DTYPE_COUNT];
  const char *names[KILN_DTYPE_COUNT];
  char name_buf[KILN_DTYPE_COUNT][16];
  for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
    t[d] = vec(d, 5, v);
    snprintf(name_buf[d], sizeof name_buf[d], "t.%s", kiln_dtype_name(d));
    names[d] = name_buf[d];
  }
  const char *keys[2] = {"b", "a"}, *values[2] = {"2", "1"};
  CHECK(kiln_safetensors_save(path, KILN_DTYPE_COUNT, names, (struct kiln_tensor *const *)t, 2, keys, values) == 0);
  for (int flags = 0; flags <= KILN_SAFETENSORS_NO_MMAP; flags++) {
    struct kiln_safetensors *f = kiln_safetensors_open(path, flags);
    CHECK(f != NULL);
    if (!f) continue;
    CHECK(kiln_safetensors_count(f) == KILN_DTYPE_COUNT);
    CHECK(kiln_safetensors_meta_count(f) == 2 && strcmp(kiln_safetensors_meta_key(f, 0), "a") == 0);
    struct kiln_tensor *got[KILN_DTYPE_COUNT] = {0};
    for (int i = 0; i < kiln_safetensors_count(f); i++) {
      struct kiln_tensor *g = kiln_safetensors_tensor(f, i);
      int d = -1;
      for (int k = 0; k < KILN_DTYPE_COUNT; k++)
        if (strcmp(kiln_safetensors_name(f, i), names[k]) == 0) d = k;
      CHECK(d >= 0 && g && g->dtype == d && g->numel == 5);
      if (d < 0 || !g) { kiln_tensor_release(g); continue; }
      CHECK(memcmp(kiln_tensor_data(g), kiln_tensor_data(t[d]), (size_t)(5 * kiln_dtype_size(d))) == 0);
      CHECK((g->storage->flags & KILN_STORAGE_EXTERNAL) != 0);   /* aligned: borrowed, not copied */
      got[d] = g;
    }
    kiln_safetensors_close(f);   /* the tensors keep the mapping alive */
    double out[5];
    CHECK(kiln_tensor_to_f64(got[KILN_F64], out) == 0);
    CHECK_ARRAY_NEAR(out, v, 5, 0);
    kiln_tensor_free(got[KILN_F32]);   /* early release: later use is an error, not a crash */
    CHECK_ERR(kiln_tensor_to_f64(got[KILN_F32], out), "was freed");
    for (int d = 0; d < KILN_DTYPE_COUNT; d++) kiln_tensor_release(got[d]);
  }
  for (int d = 0; d < KILN_DTYPE_COUNT; d++) kiln_tensor_release(t[d]);
}

static void test_errors(void) {
  const double v[3] = {1, 2, 3};
  struct kiln_tensor *t = vec(KILN_F32, 3, v);
  const char *name = "x";
  CHECK(kiln_safetensors_save(path, 1, &name, &t, 0, NULL, NULL) == 0);
  long size = file_size(path);
  CHECK(size > 8);
  /* every truncation */
  FILE *src = fopen(path, "rb");
  unsigned char buf[256];
  size_t n = src ? fread(buf, 1, sizeof buf, src) : 0;
  if (src) fclose(src);
  CHECK((long)n == size);
  char cut[160];
  snprintf(cut, sizeof cut, "%s/cut.safetensors", dir);
  for (size_t len = 0; len < n; len++) {
    FILE *o = fopen(cut, "wb");
    if (!o) break;
    fwrite(buf, 1, len, o);
    fclose(o);
    CHECK_ERR(open_status(cut), cut);
  }
  /* duplicate names and a reserved name are refused before anything is written */
  const char *twice[2] = {"a", "a"};
  struct kiln_tensor *two[2] = {t, t};
  CHECK_ERR(kiln_safetensors_save(path, 2, twice, two, 0, NULL, NULL), "appears twice");
  const char *reserved = "__metadata__";
  CHECK_ERR(kiln_safetensors_save(path, 1, &reserved, &t, 0, NULL, NULL), "reserved");
  CHECK(file_size(path) == size);
  /* a folder that does not exist: the error names the target, nothing is left behind */
  char missing[160];
  snprintf(missing, sizeof missing, "%s/no/such.safetensors", dir);
  CHECK_ERR(kiln_safetensors_save(missing, 1, &name, &t, 0, NULL, NULL), missing);
  CHECK_ERR(open_status(dir), "not a regular file");
  kiln_tensor_release(t);
}

/* A non-contiguous view is written row-major. */
static void test_views(void) {
  int64_t sizes[2] = {2, 3};
  const double v[6] = {1, 2, 3, 4, 5, 6};
  struct kiln_tensor *a = kiln_tensor_from_f64(2, sizes, v, KILN_F64, (struct kiln_device){KILN_CPU, 0});
  struct kiln_tensor *tr = kiln_transpose(a, 0, 1);
  const char *name = "tr";
  CHECK(kiln_safetensors_save(path, 1, &name, &tr, 0, NULL, NULL) == 0);
  struct kiln_safetensors *f = kiln_safetensors_open(path, 0);
  struct kiln_tensor *g = f ? kiln_safetensors_tensor(f, 0) : NULL;
  double out[6], want[6] = {1, 4, 2, 5, 3, 6};
  CHECK(g && g->sizes[0] == 3 && g->sizes[1] == 2 && kiln_tensor_to_f64(g, out) == 0);
  CHECK_ARRAY_NEAR(out, want, 6, 0);
  kiln_safetensors_close(f);
  kiln_tensor_release(g);
  kiln_tensor_release(tr);
  kiln_tensor_release(a);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/kiln-test-safetensors-XXXXXX");
  if (!mkdtemp(dir)) return 1;
  snprintf(path, sizeof path, "%s/t.safetensors", dir);
  test_round_trip();
  test_errors();
  test_views();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return check_done("test_safetensors");
}
