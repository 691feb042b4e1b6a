/* io.c: the IDX reader (plain or gzip through zlib). Every field is checked against the file
   before it is trusted; the tensor is allocated only when the header is consistent with the
   file's size, and handed back only when every data byte was read and nothing follows. */
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* Deflate cannot compress better than about 1032:1; a gzip file of n bytes never holds more. */
enum { DEFLATE_MAX_RATIO = 1032 };

struct idx_type {
  int code;
  const char *name;
  int file_size;   /* bytes per element in the file */
  int dtype;       /* what kiln makes of it */
};

static const struct idx_type idx_types[] = {
  {0x08, "u8", 1, KILN_U8},  {0x09, "i8", 1, KILN_I32},  {0x0B, "i16", 2, KILN_I32},
  {0x0C, "i32", 4, KILN_I32}, {0x0D, "f32", 4, KILN_F32}, {0x0E, "f64", 8, KILN_F64},
};

struct reader {
  const char *path;
  gzFile gz;
  int gzip;          /* the file is gzip-compressed: offsets count uncompressed bytes */
  int64_t offset;    /* bytes consumed so far */
  int cut;           /* the compressed stream ended early (no gzip trailer) */
};

static const char *where(const struct reader *r) { return r->gzip ? " (uncompressed)" : ""; }

/* Reads up to n bytes; returns how many were read, or -1 with an error naming the offset. */
static int64_t read_some(struct reader *r, void *buf, int64_t n) {
  int64_t done = 0;
  while (done < n) {
    int64_t want = n - done;
    if (want > (1 << 30)) want = 1 << 30;
    int got = gzread(r->gz, (char *)buf + done, (unsigned)want);
    if (got < 0) {
      int zerr = 0;
      const char *msg = gzerror(r->gz, &zerr);
      kiln_fail(KILN_ERR_FORMAT, "read_idx: %s: corrupt gzip stream at offset %lld%s: %s", r->path,
                (long long)(r->offset + done), where(r), msg ? msg : "read error");
      return -1;
    }
    if (got == 0) break;
    done += got;
  }
  /* zlib ends a read short with Z_BUF_ERROR when the compressed stream was cut off. */
  if (done < n) {
    int zerr = Z_OK;
    gzerror(r->gz, &zerr);
    if (zerr == Z_BUF_ERROR) r->cut = 1;
  }
  r->offset += done;
  return done;
}

/* Reads exactly n bytes of the part called what, or fails naming it, the offset and the counts. */
static int read_exact(struct reader *r, void *buf, int64_t n, const char *what) {
  int64_t start = r->offset;
  int64_t got = read_some(r, buf, n);
  if (got < 0) return KILN_ERR_FORMAT;
  if (got < n)
    return kiln_fail(KILN_ERR_FORMAT,
                     "read_idx: %s: truncated: %s at offset %lld%s needs %lld bytes, only %lld remain (the %s "
                     "ends at offset %lld)", r->path, what, (long long)start, where(r), (long long)n, (long long)got,
                     r->cut ? "cut-off gzip stream" : "file", (long long)r->offset);
  return KILN_OK;
}

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* The elements were read raw into the start of t's storage; convert them in place to the host's
   representation. Widening runs from the last element back so that no unread byte is overwritten. */
static void idx_decode(void *data, int64_t n, int code) {
  unsigned char *raw = data;
  switch (code) {
  case 0x08: break;
  case 0x09: {
    int32_t *out = data;
    for (int64_t i = n - 1; i >= 0; i--) out[i] = (int8_t)raw[i];
    break;
  }
  case 0x0B: {
    int32_t *out = data;
    for (int64_t i = n - 1; i >= 0; i--) out[i] = (int16_t)((uint16_t)raw[2 * i] << 8 | raw[2 * i + 1]);
    break;
  }
  case 0x0C: case 0x0D: {
    uint32_t *out = data;
    for (int64_t i = 0; i < n; i++) out[i] = be32(raw + 4 * i);  /* i32 and f32 share the bit layout */
    break;
  }
  case 0x0E: {
    uint64_t *out = data;
    for (int64_t i = 0; i < n; i++) out[i] = (uint64_t)be32(raw + 8 * i) << 32 | be32(raw + 8 * i + 4);
    break;
  }
  }
}

static struct kiln_tensor *idx_read(struct reader *r, int64_t file_bytes) {
  unsigned char magic[4];
  if (read_exact(r, magic, 4, "the 4-byte magic number")) return NULL;
  if (magic[0] != 0 || magic[1] != 0) {
    kiln_fail(KILN_ERR_FORMAT, "read_idx: %s: not an IDX file: the magic number at offset 0%s starts with "
              "0x%02X 0x%02X (expected 0x00 0x00)", r->path, where(r), magic[0], magic[1]);
    return NULL;
  }
  const struct idx_type *type = NULL;
  for (size_t i = 0; i < sizeof idx_types / sizeof idx_types[0]; i++)
    if (idx_types[i].code == magic[2]) type = &idx_types[i];
  if (!type) {
    kiln_fail(KILN_ERR_FORMAT, "read_idx: %s: unknown IDX type code 0x%02X at offset 2%s (expected 0x08 u8, "
              "0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32 or 0x0E f64)", r->path, magic[2], where(r));
    return NULL;
  }
  int ndim = magic[3];
  if (ndim < 1 || ndim > KILN_MAX_DIMS) {
    kiln_fail(KILN_ERR_FORMAT, "read_idx: %s: %d dims at offset 3%s (expected 1 to %d)", r->path, ndim, where(r),
              KILN_MAX_DIMS);
    return NULL;
  }
  unsigned char raw_sizes[4 * KILN_MAX_DIMS];
  if (read_exact(r, raw_sizes, 4 * ndim, "the sizes")) return NULL;
  int64_t sizes[KILN_MAX_DIMS];
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    uint32_t s = be32(raw_sizes + 4 * d);
    if (s > INT32_MAX) {
      kiln_fail(KILN_ERR_FORMAT, "read_idx: %s: size %d of %d at offset %d%s is negative (%d)", r->path, d + 1,
                ndim, 4 + 4 * d, where(r), (int)(int32_t)s);
      return NULL;
    }
    sizes[d] = s;
    if (s && numel > INT64_MAX / 16 / (int64_t)s) {
      kiln_fail(KILN_ERR_FORMAT, "read_idx: %s: the sizes %s at offset 4%s hold too many elements", r->path,
                kiln_sizes_string(d + 1, sizes), where(r));
      return NULL;
    }
    numel *= s;
  }
  int64_t header = 4 + 4 * (int64_t)ndim;
  int64_t data_bytes = numel * type->file_size;
  /* Check the claimed length against the file before allocating for it. */
  if (file_bytes >= 0 && !r->gzip && header + data_bytes != file_bytes) {
    if (header + data_bytes > file_bytes)
      kiln_fail(KILN_ERR_FORMAT, "read_idx: %s: truncated: the header says %s %s (%lld data bytes after the "
                "%lld-byte header, %lld in all) but the file has %lld bytes", r->path,
                kiln_sizes_string(ndim, sizes), type->name, (long long)data_bytes, (long long)header,
                (long long)(header + data_bytes), (long long)file_bytes);
    else
      kiln_fail(KILN_ERR_FORMAT, "read_idx: %s: %lld trailing bytes after the data, from offset %lld (the header "
                "says %s %s: %lld data bytes after the %lld-byte header)", r->path,
                (long long)(file_bytes - header - data_bytes), (long long)(header + data_bytes),
                kiln_sizes_string(ndim, sizes), type->name, (long long)data_bytes, (long long)header);
    return NULL;
  }
  if (file_bytes >= 0 && r->gzip && (header + data_bytes) / DEFLATE_MAX_RATIO > file_bytes) {
    kiln_fail(KILN_ERR_FORMAT, "read_idx: %s: truncated: the header says %s %s (%lld data bytes) but a gzip "
              "file of %lld bytes cannot hold that much", r->path, kiln_sizes_string(ndim, sizes), type->name,
              (long long)data_bytes, (long long)file_bytes);
    return NULL;
  }
  struct kiln_tensor *t = kiln_tensor_empty(ndim, sizes, type->dtype, (struct kiln_device){KILN_CPU, 0});
  if (!t) {
    kiln_fail(kiln_error_code(), "read_idx: %s: %s", r->path, kiln_error_message());
    return NULL;
  }
  void *data = kiln_tensor_data(t);
  char what[160];
  snprintf(what, sizeof what, "the data (%s %s)", kiln_sizes_string(ndim, sizes), type->name);
  if (read_exact(r, data, data_bytes, what)) {
    kiln_tensor_release(t);
    return NULL;
  }
  unsigned char extra[256];
  int64_t end = r->offset;
  int64_t more = read_some(r, extra, sizeof extra);
  if (more != 0) {
    if (more > 0) {
      int64_t n = more;
      while ((more = read_some(r, extra, sizeof extra)) > 0) n += more;
      if (more == 0)
        kiln_fail(KILN_ERR_FORMAT, "read_idx: %s: %lld trailing bytes after the data, from offset %lld%s (the "
                  "header says %s %s: %lld data bytes after the %lld-byte header)", r->path, (long long)n,
                  (long long)end, where(r), kiln_sizes_string(ndim, sizes), type->name, (long long)data_bytes,
                  (long long)header);
    }
    kiln_tensor_release(t);
    return NULL;
  }
  if (r->cut) {
    kiln_fail(KILN_ERR_FORMAT, "read_idx: %s: truncated gzip stream: the data are complete but the gzip trailer "
              "(CRC and length) after offset %lld%s is missing", r->path, (long long)end, where(r));
    kiln_tensor_release(t);
    return NULL;
  }
  idx_decode(data, numel, type->code);
  return t;
}

KILN_API struct kiln_tensor *kiln_idx_read(const char *path) {
  if (!path) {
    kiln_fail(KILN_ERR_ARGUMENT, "read_idx: the path is missing (NULL)");
    return NULL;
  }
  int64_t file_bytes = 0;
  int fd = kiln_open_regular("read_idx", path, &file_bytes);
  if (fd < 0) return NULL;
  unsigned char head[2] = {0, 0};
  ssize_t nhead = pread(fd, head, 2, 0);
  struct reader r = {.path = path, .gzip = nhead == 2 && head[0] == 0x1f && head[1] == 0x8b};
  r.gz = gzdopen(fd, "rb");
  if (!r.gz) {
    kiln_fail(KILN_ERR_MEMORY, "read_idx: %s: out of memory opening the file", path);
    close(fd);
    return NULL;
  }
  gzbuffer(r.gz, 1 << 17);
  struct kiln_tensor *t = idx_read(&r, file_bytes);
  gzclose_r(r.gz);
  return t;
}
