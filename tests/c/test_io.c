/* test_io.c: the IDX reader: every type code round-trips (plain and gzip), every malformed header,
   truncation and trailing byte is an error naming the file, and corrupted variants of small files
   (every truncation, random byte flips in the header and in the gzip stream) never crash. */
#include "check.h"
#include <unistd.h>

static char dir[64];

/* ---- writing test files ---- */

struct buf {
  unsigned char *p;
  size_t n, cap;
};

static void put(struct buf *b, const void *data, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}
static void put8(struct buf *b, unsigned v) { unsigned char c = (unsigned char)v; put(b, &c, 1); }
static void put32be(struct buf *b, uint32_t v) {
  unsigned char c[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
  put(b, c, 4);
}
static void put32le(struct buf *b, uint32_t v) {
  unsigned char c[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
  put(b, c, 4);
}

/* An IDX header: magic 0 0 code ndim, then the sizes. */
static void idx_header(struct buf *b, int code, int ndim, const uint32_t *sizes) {
  put8(b, 0); put8(b, 0); put8(b, (unsigned)code); put8(b, (unsigned)ndim);
  for (int d = 0; d < ndim; d++) put32be(b, sizes[d]);
}

/* The values of n elements of an IDX type, big-endian. */
static void idx_values(struct buf *b, int code, const double *v, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    switch (code) {
    case 0x08: put8(b, (unsigned)(uint8_t)v[i]); break;
    case 0x09: put8(b, (unsigned)(uint8_t)(int8_t)v[i]); break;
    case 0x0B: { uint16_t x = (uint16_t)(int16_t)v[i]; put8(b, x >> 8); put8(b, x & 255); break; }
    case 0x0C: put32be(b, (uint32_t)(int32_t)v[i]); break;
    case 0x0D: { float f = (float)v[i]; uint32_t x; memcpy(&x, &f, 4); put32be(b, x); break; }
    case 0x0E: { uint64_t x; memcpy(&x, &v[i], 8); put32be(b, (uint32_t)(x >> 32)); put32be(b, (uint32_t)x); break; }
    }
  }
}

static uint32_t crc32_of(const unsigned char *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
  }
  return c ^ 0xFFFFFFFFu;
}

/* A gzip file of raw: deflate "stored" blocks (written by hand, independent of zlib). */
static struct buf gzip_of(const struct buf *raw) {
  struct buf g = {0};
  static const unsigned char head[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  put(&g, head, sizeof head);
  size_t pos = 0;
  do {
    size_t len = raw->n - pos > 65535 ? 65535 : raw->n - pos;
    int final = pos + len == raw->n;
    put8(&g, final ? 1 : 0);
    put8(&g, len & 255); put8(&g, len >> 8);
    put8(&g, ~len & 255); put8(&g, (~len >> 8) & 255);
    put(&g, raw->p + pos, len);
    pos += len;
  } while (pos < raw->n);
  put32le(&g, crc32_of(raw->p, raw->n));
  put32le(&g, (uint32_t)raw->n);
  return g;
}

static const char *write_file(const char *name, const void *data, size_t n) {
  static char path[4][128];
  static int next;
  char *p = path[next++ & 3];
  snprintf(p, 128, "%s/%s", dir, name);
  FILE *f = fopen(p, "wb");
  if (!f) { perror(p); abort(); }
  if (n && fwrite(data, 1, n, f) != n) abort();
  fclose(f);
  return p;
}

/* ---- round trips ---- */

struct case_ {
  int code, dtype;
  int ndim;
  uint32_t sizes[3];
  double values[8];
};

static void test_round_trip(void) {
  static const struct case_ cases[] = {
    {0x08, KILN_U8, 2, {2, 3}, {0, 1, 127, 128, 254, 255}},
    {0x09, KILN_I32, 1, {5}, {-128, -1, 0, 1, 127}},
    {0x0B, KILN_I32, 2, {3, 2}, {-32768, -1, 0, 1, 32767, 258}},
    {0x0C, KILN_I32, 3, {1, 2, 3}, {-2147483648.0, -1, 0, 1, 2147483647.0, 16909060}},
    {0x0D, KILN_F32, 1, {6}, {1.5, -0.25, 3.4028234663852886e38, 1.401298464324817e-45, 0, -7}},
    {0x0E, KILN_F64, 2, {2, 2}, {3.141592653589793, -1e300, 4.9406564584124654e-324, 0.1}},
    {0x08, KILN_U8, 3, {2, 0, 4}, {0}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const struct case_ *k = &cases[c];
    int64_t n = 1, sizes[3];
    for (int d = 0; d < k->ndim; d++) { n *= k->sizes[d]; sizes[d] = k->sizes[d]; }
    struct buf raw = {0};
    idx_header(&raw, k->code, k->ndim, k->sizes);
    idx_values(&raw, k->code, k->values, n);
    struct buf gz = gzip_of(&raw);
    for (int z = 0; z < 2; z++) {
      char name[32];
      snprintf(name, sizeof name, "case%zu%s", c, z ? ".gz" : "");
      const char *path = z ? write_file(name, gz.p, gz.n) : write_file(name, raw.p, raw.n);
      struct kiln_tensor *t = kiln_idx_read(path);
      if (!CHECK(t != NULL)) { fprintf(stderr, "  %s: %s\n", path, kiln_error_message()); continue; }
      CHECK(t->dtype == k->dtype && t->ndim == k->ndim && t->numel == n && kiln_is_contiguous(t));
      CHECK(same_sizes(t, k->ndim, sizes));
      double *v = V(t);
      check_arrays(v, k->values, n, 0, 0, name, __FILE__, __LINE__);
      free(v);
      kiln_tensor_release(t);
    }
    free(raw.p);
    free(gz.p);
  }
  /* A name ending in .gz does not make a plain file gzip, nor the reverse. */
  struct buf raw = {0};
  idx_header(&raw, 0x08, 1, (uint32_t[]){3});
  idx_values(&raw, 0x08, (double[]){7, 8, 9}, 3);
  struct kiln_tensor *t = kiln_idx_read(write_file("plain.gz", raw.p, raw.n));
  CHECK(t && t->numel == 3 && kiln_tensor_get(t, 2) == 9);
  kiln_tensor_release(t);
  struct buf gz = gzip_of(&raw);
  t = kiln_idx_read(write_file("gzip-named-plain", gz.p, gz.n));
  CHECK(t && t->numel == 3 && kiln_tensor_get(t, 0) == 7);
  kiln_tensor_release(t);
  free(raw.p);
  free(gz.p);
}

/* A file larger than one stored block and one zlib buffer. */
static void test_large(void) {
  uint32_t sizes[2] = {600, 700};
  int64_t n = 600 * 700;
  double *v = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = (double)(int16_t)(hashval((uint64_t)i) * 32767);
  struct buf raw = {0};
  idx_header(&raw, 0x0B, 2, sizes);
  idx_values(&raw, 0x0B, v, n);
  struct buf gz = gzip_of(&raw);
  struct kiln_tensor *t = kiln_idx_read(write_file("large.gz", gz.p, gz.n));
  CHECK(t && t->dtype == KILN_I32);
  CHECK_SIZES(t, 600, 700);
  double *got = V(t);
  CHECK_ARRAY_NEAR(got, v, n, 0);
  free(got);
  kiln_tensor_release(t);
  free(v); free(raw.p); free(gz.p);
}

/* ---- errors ---- */

static void expect_error(const void *data, size_t n, const char *name, const char *part) {
  const char *path = write_file(name, data, n);
  CHECK_ERR(kiln_idx_read(path), path);
  CHECK_ERR(kiln_idx_read(path), part);
}

static void test_errors(void) {
  char missing[128];
  snprintf(missing, sizeof missing, "%s/no-such-file", dir);
  CHECK_ERR(kiln_idx_read(missing), "no-such-file");
  CHECK_ERR(kiln_idx_read(missing), "No such file");
  CHECK_ERR(kiln_idx_read(dir), "directory");
  CHECK_ERR(kiln_idx_read(NULL), "path");

  expect_error("", 0, "empty", "truncated");
  expect_error((unsigned char[]){0, 0, 8}, 3, "short-magic", "needs 4 bytes, only 3 remain");
  expect_error((unsigned char[]){1, 0, 8, 1, 0, 0, 0, 1, 5}, 9, "bad-magic", "not an IDX file");
  expect_error((unsigned char[]){0, 0, 7, 1, 0, 0, 0, 1, 5}, 9, "bad-type", "unknown IDX type code 0x07");
  expect_error((unsigned char[]){0, 0, 8, 0}, 4, "zero-dims", "0 dims");
  expect_error((unsigned char[]){0, 0, 8, 9}, 4, "nine-dims", "9 dims");
  expect_error((unsigned char[]){0, 0, 8, 2, 0, 0, 0, 1, 0, 0}, 10, "short-sizes", "the sizes at offset 4 needs 8 bytes");
  expect_error((unsigned char[]){0, 0, 8, 1, 0x80, 0, 0, 1, 5}, 9, "negative-size", "negative");
  expect_error((unsigned char[]){0, 0, 0x0E, 3, 0x7F, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF},
               16, "overflow", "too many elements");
  /* truncated data: the message names both byte counts */
  unsigned char trunc[] = {0, 0, 0x0C, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5};
  expect_error(trunc, sizeof trunc, "truncated", "24 data bytes after the 12-byte header, 36 in all) but the file has 17 bytes");
  /* trailing bytes */
  unsigned char trail[] = {0, 0, 8, 1, 0, 0, 0, 2, 5, 6, 7};
  expect_error(trail, sizeof trail, "trailing", "1 trailing bytes after the data, from offset 10");

  /* the same in gzip: offsets count uncompressed bytes */
  struct buf raw = {0}, gz;
  put(&raw, trunc, sizeof trunc);
  gz = gzip_of(&raw);
  expect_error(gz.p, gz.n, "truncated.gz", "the data ([2,3] i32) at offset 12 (uncompressed) needs 24 bytes, only 5 remain");
  free(gz.p);
  raw.n = 0;
  put(&raw, trail, sizeof trail);
  gz = gzip_of(&raw);
  expect_error(gz.p, gz.n, "trailing.gz", "1 trailing bytes after the data, from offset 10 (uncompressed)");
  free(gz.p);
  /* a gzip file whose CRC does not match, and one cut off before its trailer */
  raw.n = 0;
  put(&raw, trail, sizeof trail - 1);
  gz = gzip_of(&raw);
  gz.p[gz.n - 8] ^= 1;
  expect_error(gz.p, gz.n, "bad-crc.gz", "corrupt gzip stream");
  gz.p[gz.n - 8] ^= 1;
  expect_error(gz.p, gz.n - 8, "no-trailer.gz", "gzip trailer");
  expect_error(gz.p, gz.n - 3, "short-trailer.gz", "gzip trailer");
  /* a header that claims far more than a small gzip file can hold is refused before allocating */
  raw.n = 0;
  idx_header(&raw, 0x0E, 2, (uint32_t[]){0x7FFFFFFF, 0x7FFFFF});
  free(gz.p);
  gz = gzip_of(&raw);
  expect_error(gz.p, gz.n, "huge.gz", "cannot hold that much");
  free(gz.p);
  free(raw.p);
}

/* ---- corrupted variants ---- */

/* t is NULL with the path in the message, or a consistent tensor whose every element reads. */
static int sane(struct kiln_tensor *t, const char *path) {
  if (!t) return strstr(kiln_error_message(), path) != NULL;
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
  int ok = n == t->numel && t->ndim >= 1 && t->ndim <= KILN_MAX_DIMS && kiln_is_contiguous(t) &&
           t->storage->nbytes == n * kiln_dtype_size(t->dtype);
  double *v = V(t);
  for (int64_t i = 0; i < n; i++) ok &= v[i] == v[i] || t->dtype == KILN_F32 || t->dtype == KILN_F64;
  free(v);
  kiln_tensor_release(t);
  return ok;
}

static void test_fuzz(void) {
  uint32_t sizes[3] = {2, 3, 4};
  double v[24];
  for (int i = 0; i < 24; i++) v[i] = hashval((uint64_t)i) * 100;
  static const int codes[] = {0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E};
  int bad = 0, errors = 0, tensors = 0;
  for (size_t c = 0; c < sizeof codes / sizeof codes[0]; c++) {
    struct buf raw = {0};
    idx_header(&raw, codes[c], 3, sizes);
    idx_values(&raw, codes[c], v, 24);
    struct buf gz = gzip_of(&raw);
    /* every truncation, plain and gzip: always an error */
    for (size_t cut = 0; cut < raw.n; cut++) {
      const char *path = write_file("cut", raw.p, cut);
      struct kiln_tensor *t = kiln_idx_read(path);
      if (t || !strstr(kiln_error_message(), path)) { bad++; fprintf(stderr, "plain cut at %zu: %s\n", cut, t ? "read" : kiln_error_message()); }
      kiln_tensor_release(t);
    }
    for (size_t cut = 0; cut < gz.n; cut++) {
      const char *path = write_file("cut.gz", gz.p, cut);
      struct kiln_tensor *t = kiln_idx_read(path);
      if (t || !strstr(kiln_error_message(), path)) { bad++; fprintf(stderr, "gzip cut at %zu: %s\n", cut, t ? "read" : kiln_error_message()); }
      kiln_tensor_release(t);
    }
    /* random flips: in the header of the plain file, anywhere in the gzip file */
    struct buf mut = {0};
    for (int trial = 0; trial < 400; trial++) {
      int z = trial & 1;
      const struct buf *src = z ? &gz : &raw;
      mut.n = 0;
      put(&mut, src->p, src->n);
      uint64_t h = (uint64_t)(c * 100000 + (size_t)trial) * 7919;
      int flips = 1 + (int)((hashval(h) + 1) * 2);
      for (int f = 0; f < flips; f++) {
        size_t span = z ? mut.n : 16;
        size_t at = (size_t)((hashval(h + 2 * (uint64_t)f + 1) + 1) / 2 * (double)span);
        unsigned char x = (unsigned char)((hashval(h + 2 * (uint64_t)f + 2) + 1) * 128);
        mut.p[at < mut.n ? at : mut.n - 1] ^= x ? x : 0x80;
      }
      const char *path = write_file(z ? "flip.gz" : "flip", mut.p, mut.n);
      struct kiln_tensor *t = kiln_idx_read(path);
      if (t) tensors++; else errors++;
      if (!sane(t, path)) { bad++; fprintf(stderr, "flip trial %d: %s\n", trial, kiln_error_message()); }
    }
    free(mut.p); free(raw.p); free(gz.p);
  }
  CHECK(bad == 0);
  CHECK(errors > 0 && tensors > 0);   /* the flips reach both outcomes */
  printf("fuzz: %d corrupted variants read as errors, %d as valid tensors\n", errors, tensors);
}

static void test_fashion_mnist(void) {
  const char *path = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
  if (access(path, R_OK) != 0) { printf("skipped: %s is missing (apt-get install dataset-fashion-mnist)\n", path); return; }
  struct kiln_tensor *t = kiln_idx_read(path);
  CHECK(t && t->dtype == KILN_U8);
  CHECK_SIZES(t, 10000);
  int ok = t != NULL;
  for (int64_t i = 0; t && i < t->numel; i++) ok &= kiln_tensor_get(t, i) <= 9;
  CHECK(ok);
  kiln_tensor_release(t);
  t = kiln_idx_read("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz");
  CHECK_SIZES(t, 10000, 28, 28);
  kiln_tensor_release(t);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/kiln-test-io-XXXXXX");
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
  test_round_trip();
  test_large();
  test_errors();
  test_fuzz();
  test_fashion_mnist();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return check_done("test_io");
}
