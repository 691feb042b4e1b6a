/* safetensors.c: the safetensors writer (crash-safe: temporary file, fsync, rename) and reader
   (the whole header validated against the file before any tensor is made; data mapped, not
   copied, where aligned). The JSON goes through cJSON. Format:
   https://github.com/huggingface/safetensors#format */
#include "internal.h"
#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The format is little-endian; kiln writes and maps host memory as it is. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors.c assumes a little-endian host");

/* The reference implementation's limit on the JSON header (100 MB): a larger claim is refused
   before anything is allocated for it. */
enum { HEADER_MAX = 100000000 };
/* Integers in the header are read as doubles by cJSON: exact up to 2^53. */
#define JSON_INT_MAX 9007199254740992.0

/* rank: the dtype's place in the reference implementation's Dtype enum (BOOL, U8, ..., F16, BF16,
   I32, ..., F32, F64, I64): its writer lays data out by descending rank, then by name, which puts
   larger elements first (every tensor aligned). kiln does the same, so that the same tensors give
   the same bytes as PyTorch's safetensors. */
static const struct {
  int dtype;
  const char *name;
  int rank;
} dtype_names[] = {
  {KILN_F32, "F32", 5}, {KILN_F64, "F64", 6}, {KILN_F16, "F16", 2}, {KILN_BF16, "BF16", 3},
  {KILN_I64, "I64", 7}, {KILN_I32, "I32", 4}, {KILN_U8, "U8", 1},   {KILN_BOOL, "BOOL", 0},
};
_Static_assert(sizeof dtype_names / sizeof dtype_names[0] == KILN_DTYPE_COUNT, "a kiln dtype has no safetensors name");

static int st_rank(int dtype) {
  for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
    if (dtype_names[i].dtype == dtype) return dtype_names[i].rank;
  return -1;
}

static const char *st_dtype_name(int dtype) {
  for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
    if (dtype_names[i].dtype == dtype) return dtype_names[i].name;
  return "?";
}

static int st_dtype(const char *name) {
  for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
    if (strcmp(dtype_names[i].name, name) == 0) return dtype_names[i].dtype;
  return -1;
}

/* ---- writing ---- */

struct out_entry {
  const char *name;
  struct kiln_tensor *t;   /* contiguous, on the CPU (a new reference) */
  int64_t begin, end;
};

/* Descending dtype rank (larger elements first, so every tensor is aligned), then by name: the
   same tensors give the same file whatever order they come in. */
static int out_order(const void *a, const void *b) {
  const struct out_entry *x = a, *y = b;
  int rx = st_rank(x->t->dtype), ry = st_rank(y->t->dtype);
  if (rx != ry) return rx > ry ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static int write_all(int fd, const void *buf, int64_t n) {
  const char *p = buf;
  while (n > 0) {
    size_t want = n > (1 << 30) ? (size_t)1 << 30 : (size_t)n;
    ssize_t w = write(fd, p, want);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    n -= w;
  }
  return 0;
}

static cJSON *json_int(int64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%lld", (long long)v);
  return cJSON_CreateRaw(buf);   /* exact at any size: cJSON prints numbers through a double */
}

/* The JSON header: "__metadata__" first, then the entries in data order; NULL when out of memory. */
static char *header_json(const struct out_entry *e, int n, int nmeta, const char *const *keys, const char *const *values) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return NULL;
  int ok = 1;
  if (nmeta > 0) {
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    ok = meta != NULL;
    for (int i = 0; ok && i < nmeta; i++) ok = cJSON_AddStringToObject(meta, keys[i], values[i]) != NULL;
  }
  for (int i = 0; ok && i < n; i++) {
    const struct kiln_tensor *t = e[i].t;
    cJSON *entry = cJSON_AddObjectToObject(root, e[i].name);
    cJSON *shape = entry ? cJSON_CreateArray() : NULL, *offsets = shape ? cJSON_CreateArray() : NULL;
    ok = entry && shape && offsets && cJSON_AddStringToObject(entry, "dtype", st_dtype_name(t->dtype));
    if (ok) cJSON_AddItemToObject(entry, "shape", shape); else cJSON_Delete(shape);
    if (ok) cJSON_AddItemToObject(entry, "data_offsets", offsets); else cJSON_Delete(offsets);
    for (int d = 0; ok && d < t->ndim; d++) ok = cJSON_AddItemToArray(shape, json_int(t->sizes[d]));
    if (ok) ok = cJSON_AddItemToArray(offsets, json_int(e[i].begin)) && cJSON_AddItemToArray(offsets, json_int(e[i].end));
  }
  char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  return text;
}

/* The folder of path, for the fsync that makes the rename durable. */
static void sync_folder(const char *path) {
  char dir[PATH_MAX];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);   /* best effort: some file systems refuse fsync on a folder */
    close(fd);
  }
}

static int check_name(const char *path, const char *what, int i, const char *name) {
  if (!name) return kiln_fail(KILN_ERR_ARGUMENT, "save: %s: %s %d is missing (NULL)", path, what, i);
  int64_t bad = kiln_utf8_invalid_at((const unsigned char *)name, (int64_t)strlen(name));
  if (bad >= 0)
    return kiln_fail(KILN_ERR_ARGUMENT, "save: %s: %s %d is not valid UTF-8 (at byte %lld); the header is UTF-8 JSON", path,
                     what, i, (long long)bad);
  return KILN_OK;
}

KILN_API int kiln_safetensors_save(const char *path, int n, const char *const *names, struct kiln_tensor *const *tensors,
                                   int nmeta, const char *const *meta_keys, const char *const *meta_values) {
  if (!path) return kiln_fail(KILN_ERR_ARGUMENT, "save: the path is missing (NULL)");
  if (n < 0 || nmeta < 0) return kiln_fail(KILN_ERR_ARGUMENT, "save: %s: negative count (%d tensors, %d metadata)", path, n, nmeta);
  if ((n > 0 && (!names || !tensors)) || (nmeta > 0 && (!meta_keys || !meta_values)))
    return kiln_fail(KILN_ERR_ARGUMENT, "save: %s: a names, tensors or metadata array is missing (NULL)", path);
  for (int i = 0; i < n; i++) {
    if (check_name(path, "tensor name", i, names[i])) return kiln_error_code();
    if (strcmp(names[i], "__metadata__") == 0)
      return kiln_fail(KILN_ERR_ARGUMENT, "save: %s: \"__metadata__\" is reserved for the metadata; it cannot name a tensor", path);
    const struct kiln_tensor *t = tensors[i];
    if (!t) return kiln_fail(KILN_ERR_ARGUMENT, "save: %s: tensor \"%s\" is missing (NULL)", path, names[i]);
    if (t->storage && (t->storage->flags & KILN_STORAGE_FREED))
      return kiln_fail(KILN_ERR_STATE, "save: %s: tensor \"%s\" %s %s was freed", path, names[i], kiln_shape_string(t),
                       kiln_dtype_name(t->dtype));
  }
  for (int i = 0; i < nmeta; i++)
    if (check_name(path, "metadata key", i, meta_keys[i]) || check_name(path, "metadata value", i, meta_values[i])) return kiln_error_code();

  int rc = KILN_OK;
  struct out_entry *e = calloc((size_t)(n ? n : 1), sizeof *e);
  const char **sorted = calloc((size_t)(n + nmeta + 1), sizeof *sorted);
  const char **mk = NULL;
  char *header = NULL, *tmp = NULL;
  int fd = -1;
  if (!e || !sorted) { rc = kiln_fail(KILN_ERR_MEMORY, "save: %s: out of memory", path); goto done; }
  /* Names and metadata keys must be unique. */
  for (int pass = 0; pass < 2; pass++) {
    int m = pass == 0 ? n : nmeta;
    const char *const *list = pass == 0 ? names : meta_keys;
    for (int i = 0; i < m; i++) sorted[i] = list[i];
    qsort(sorted, (size_t)m, sizeof *sorted, cmp_str);
    for (int i = 1; i < m; i++)
      if (strcmp(sorted[i - 1], sorted[i]) == 0) {
        rc = kiln_fail(KILN_ERR_ARGUMENT, "save: %s: the %s \"%s\" appears twice", path, pass == 0 ? "tensor name" : "metadata key", sorted[i]);
        goto done;
      }
  }
  /* Contiguous CPU copies where needed; the layout; the header. */
  for (int i = 0; i < n; i++) {
    struct kiln_tensor *t = tensors[i];
    kiln_tensor_retain(t);
    if (t->device.type != KILN_CPU) {
      struct kiln_tensor *c = kiln_to_device(t, (struct kiln_device){KILN_CPU, 0});
      kiln_tensor_release(t);
      t = c;
    }
    if (t && !kiln_is_contiguous(t)) {
      struct kiln_tensor *c = kiln_contiguous(t);
      kiln_tensor_release(t);
      t = c;
    }
    if (!t) { rc = kiln_fail(kiln_error_code(), "save: %s: tensor \"%s\": %s", path, names[i], kiln_error_message()); goto done; }
    e[i].name = names[i];
    e[i].t = t;
  }
  qsort(e, (size_t)n, sizeof *e, out_order);
  int64_t pos = 0;
  for (int i = 0; i < n; i++) {
    e[i].begin = pos;
    pos += e[i].t->numel * kiln_dtype_size(e[i].t->dtype);
    e[i].end = pos;
  }
  /* Metadata keys sorted too: reproducible bytes. */
  mk = calloc((size_t)(2 * nmeta + 1), sizeof *mk);
  if (!mk) { rc = kiln_fail(KILN_ERR_MEMORY, "save: %s: out of memory", path); goto done; }
  const char **mv = mk + nmeta;
  for (int i = 0; i < nmeta; i++) { mk[i] = meta_keys[i]; mv[i] = meta_values[i]; }
  for (int i = 1; i < nmeta; i++)   /* insertion sort: metadata lists are short */
    for (int j = i; j > 0 && strcmp(mk[j - 1], mk[j]) > 0; j--) {
      const char *k = mk[j], *v = mv[j];
      mk[j] = mk[j - 1]; mv[j] = mv[j - 1];
      mk[j - 1] = k; mv[j - 1] = v;
    }
  header = header_json(e, n, nmeta, mk, mv);
  if (!header) { rc = kiln_fail(KILN_ERR_MEMORY, "save: %s: out of memory writing the header", path); goto done; }
  size_t hlen = strlen(header);
  size_t padded = (hlen + 7) / 8 * 8;   /* 8 + padded is a multiple of 8: the data start aligned */
  char *h2 = realloc(header, padded + 1);
  if (!h2) { rc = kiln_fail(KILN_ERR_MEMORY, "save: %s: out of memory", path); goto done; }
  header = h2;
  memset(header + hlen, ' ', padded - hlen);
  unsigned char len8[8];
  for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)padded >> (8 * k));

  size_t tlen = strlen(path) + 32;
  tmp = malloc(tlen);
  if (!tmp) { rc = kiln_fail(KILN_ERR_MEMORY, "save: %s: out of memory", path); goto done; }
  snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) { rc = kiln_fail(KILN_ERR_IO, "save: %s: cannot create the temporary file %s: %s", path, tmp, strerror(errno)); goto done; }
  const char *step = "write";
  int failed = write_all(fd, len8, 8) || write_all(fd, header, (int64_t)padded);
  for (int i = 0; !failed && i < n; i++)
    failed = write_all(fd, kiln_tensor_data(e[i].t), e[i].end - e[i].begin);
  if (!failed) { step = "fsync"; failed = fsync(fd) != 0; }
  if (!failed) { step = "close"; failed = close(fd) != 0; fd = -1; }
  if (!failed) { step = "rename"; failed = rename(tmp, path) != 0; }
  if (failed) {
    int err = errno;
    if (fd >= 0) close(fd);
    fd = -1;
    unlink(tmp);
    rc = kiln_fail(KILN_ERR_IO, "save: %s: %s of the temporary file %s failed: %s (%s left as it was)", path, step, tmp,
                   strerror(err), path);
    goto done;
  }
  sync_folder(path);
done:
  if (fd >= 0) close(fd);
  for (int i = 0; e && i < n; i++) kiln_tensor_release(e[i].t);
  free(e);
  free(sorted);
  free(mk);
  free(header);
  free(tmp);
  return rc;
}

/* ---- reading ---- */

/* The file's bytes, mapped (or read into memory), shared by the handle and every tensor that
   borrows from it; released with the last of them. */
struct blob {
  unsigned char *base;
  size_t len;
  int mapped;
  int32_t refcount;
};

static void blob_release(void *ctx) {
  struct blob *b = ctx;
  if (b && __atomic_sub_fetch(&b->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    if (b->mapped) munmap(b->base, b->len);
    else free(b->base);
    free(b);
  }
}

struct entry {
  char *name;
  int dtype, ndim;
  int64_t sizes[KILN_MAX_DIMS];
  int64_t begin, end;   /* in the data area */
};

struct kiln_safetensors {
  char *path;
  struct blob *blob;
  int64_t data_start;   /* 8 + the header length */
  int n;
  struct entry *entries;
  int nmeta;
  char **meta_keys, **meta_values;
};

static int by_offsets(const void *a, const void *b) {
  const struct entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(const struct entry *const *)a)->name, (*(const struct entry *const *)b)->name);
}

static const char *json_kind(const cJSON *v) {
  if (cJSON_IsObject(v)) return "an object";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNull(v)) return "null";
  return "invalid";
}

/* A non-negative integer that a double holds exactly; -1 otherwise. */
static int64_t json_count(const cJSON *v) {
  if (!cJSON_IsNumber(v)) return -1;
  double d = v->valuedouble;
  if (!(d >= 0 && d <= JSON_INT_MAX) || d != floor(d)) return -1;
  return (int64_t)d;
}

static const char *json_number_text(const cJSON *v, char *buf, size_t size) {
  if (cJSON_IsNumber(v)) snprintf(buf, size, "%.17g", v->valuedouble);
  else snprintf(buf, size, "%s", json_kind(v));
  return buf;
}

/* Fills e from the header's object for one tensor; data_bytes is the size of the data area. */
static int parse_entry(const char *path, const cJSON *v, struct entry *e, int64_t data_bytes) {
  const char *name = e->name;
  char num[64];
  if (!cJSON_IsObject(v))
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\" is %s, not an object with dtype, shape and data_offsets",
                     path, name, json_kind(v));
  for (const cJSON *a = v->child; a; a = a->next)   /* JSON objects name each field once */
    for (const cJSON *b = a->next; b; b = b->next)
      if (strcmp(a->string, b->string) == 0)
        return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": the field \"%s\" appears twice", path, name, a->string);
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(v, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(v, "shape");
  const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(v, "data_offsets");
  if (!dtype || !shape || !offsets)
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\" has no %s", path, name,
                     !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
  if (!cJSON_IsString(dtype))
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": dtype is %s, not a string", path, name, json_kind(dtype));
  e->dtype = st_dtype(dtype->valuestring);
  if (e->dtype < 0)
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": unknown dtype \"%.40s\" (kiln reads F32, F64, F16, BF16, I64, "
                     "I32, U8 and BOOL)", path, name, dtype->valuestring);
  if (!cJSON_IsArray(shape))
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": shape is %s, not an array", path, name, json_kind(shape));
  int ndim = cJSON_GetArraySize(shape);
  if (ndim > KILN_MAX_DIMS)
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": shape has %d sizes (kiln holds at most %d)", path, name, ndim,
                     KILN_MAX_DIMS);
  e->ndim = ndim;
  int64_t numel = 1;
  int esize = kiln_dtype_size(e->dtype);
  int d = 0;
  for (const cJSON *s = shape->child; s; s = s->next, d++) {
    int64_t size = json_count(s);
    if (size < 0)
      return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": shape size %d is %s (expected a non-negative integer)", path,
                       name, d + 1, json_number_text(s, num, sizeof num));
    e->sizes[d] = size;
    if (size && numel > INT64_MAX / 16 / size)
      return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": shape %s holds too many elements", path, name,
                       kiln_sizes_string(d + 1, e->sizes));
    numel *= size;
  }
  if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2)
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": data_offsets is %s (expected [begin, end])", path, name,
                     cJSON_IsArray(offsets) ? "an array whose length is not 2" : json_kind(offsets));
  const cJSON *b = offsets->child, *en = b->next;
  e->begin = json_count(b);
  e->end = json_count(en);
  if (e->begin < 0 || e->end < 0)
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": data_offsets [%s, %s] are not non-negative integers", path, name,
                     json_number_text(b, num, 32), json_number_text(en, num + 32, 32));
  if (e->begin > e->end)
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": data_offsets [%lld, %lld] begin after they end", path, name,
                     (long long)e->begin, (long long)e->end);
  if (e->end > data_bytes)
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": data_offsets [%lld, %lld] end past the data area (%lld bytes: "
                     "the file is truncated or the offsets are wrong)", path, name, (long long)e->begin, (long long)e->end,
                     (long long)data_bytes);
  if (e->end - e->begin != numel * esize)
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": data_offsets [%lld, %lld] hold %lld bytes, but %s %s needs "
                     "%lld", path, name, (long long)e->begin, (long long)e->end, (long long)(e->end - e->begin),
                     kiln_sizes_string(ndim, e->sizes), dtype->valuestring, (long long)(numel * esize));
  return KILN_OK;
}

static void close_handle(struct kiln_safetensors *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) free(f->entries[i].name);
  for (int i = 0; i < f->nmeta; i++) { free(f->meta_keys[i]); free(f->meta_values[i]); }
  free(f->entries);
  free(f->meta_keys);
  free(f->meta_values);
  free(f->path);
  blob_release(f->blob);
  free(f);
}

static char *copy_string(const char *s) {
  size_t n = strlen(s) + 1;
  char *r = malloc(n);
  if (r) memcpy(r, s, n);
  return r;
}

/* Everything but the file's bytes: the header parsed, every entry checked. */
static int parse_header(struct kiln_safetensors *f, const char *path) {
  const unsigned char *p = f->blob->base;
  int64_t size = (int64_t)f->blob->len;
  uint64_t hlen = 0;
  for (int k = 0; k < 8; k++) hlen |= (uint64_t)p[k] << (8 * k);
  if (hlen > (uint64_t)(size - 8))
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: the header length %llu (the first 8 bytes) is larger than the rest of the file "
                     "(%lld bytes): truncated or not a safetensors file", path, (unsigned long long)hlen, (long long)(size - 8));
  if (hlen > HEADER_MAX)
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: the header length %llu is over the %d-byte limit", path,
                     (unsigned long long)hlen, HEADER_MAX);
  if (hlen < 2)
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: the header length is %llu: too short to hold a JSON object", path,
                     (unsigned long long)hlen);
  f->data_start = 8 + (int64_t)hlen;
  int64_t data_bytes = size - f->data_start;
  const char *text = (const char *)p + 8;
  if (text[0] != '{')
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: the header (at offset 8) does not start with '{': not a safetensors file", path);
  /* The header is UTF-8 JSON: its bytes must be UTF-8, and no string may hold a NUL (\u0000), which
     would cut a name short once decoded. */
  int64_t bad = kiln_utf8_invalid_at((const unsigned char *)text, (int64_t)hlen);
  if (bad >= 0)
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: the header is not valid UTF-8 at file offset %lld (byte %02X)", path,
                     (long long)(8 + bad), (unsigned)(unsigned char)text[bad]);
  for (int64_t i = 0, in_string = 0; i < (int64_t)hlen; i++) {
    if (text[i] == '"') in_string = !in_string;
    else if (in_string && text[i] == '\\') {
      if (i + 5 < (int64_t)hlen && text[i + 1] == 'u' && !memcmp(text + i + 2, "0000", 4))
        return kiln_fail(KILN_ERR_FORMAT, "load: %s: a string of the header holds a NUL (\\u0000 at file offset %lld); "
                         "names and metadata may not", path, (long long)(8 + i));
      i++;   /* the escaped character */
    }
  }
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0);
  if (!root) {
    int64_t at = end ? (int64_t)(end - text) : 0;
    if (at < 0 || at > (int64_t)hlen) at = 0;
    return kiln_fail(KILN_ERR_FORMAT, "load: %s: the JSON header is malformed at byte %lld of %llu (file offset %lld)%s", path,
                     (long long)at, (unsigned long long)hlen, (long long)(8 + at),
                     at >= (int64_t)hlen - 1 ? ": it ends early (truncated?)" : "");
  }
  int rc = KILN_OK;
  for (const char *q = end; q < text + hlen; q++)
    if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
      rc = kiln_fail(KILN_ERR_FORMAT, "load: %s: stray bytes after the JSON header, at file offset %lld (only spaces may pad it)",
                     path, (long long)(8 + (q - text)));
      goto out;
    }
  if (!cJSON_IsObject(root)) {
    rc = kiln_fail(KILN_ERR_FORMAT, "load: %s: the header is %s, not a JSON object", path, json_kind(root));
    goto out;
  }
  int count = cJSON_GetArraySize(root);
  f->entries = calloc((size_t)(count ? count : 1), sizeof *f->entries);
  if (!f->entries) { rc = kiln_fail(KILN_ERR_MEMORY, "load: %s: out of memory", path); goto out; }
  const cJSON *meta = NULL;
  for (const cJSON *v = root->child; v; v = v->next) {
    if (strcmp(v->string, "__metadata__") == 0) {
      if (meta) { rc = kiln_fail(KILN_ERR_FORMAT, "load: %s: \"__metadata__\" appears twice in the header", path); goto out; }
      meta = v;
      continue;
    }
    struct entry *e = &f->entries[f->n];
    e->name = copy_string(v->string);
    if (!e->name) { rc = kiln_fail(KILN_ERR_MEMORY, "load: %s: out of memory", path); goto out; }
    f->n++;
    if ((rc = parse_entry(path, v, e, data_bytes))) goto out;
  }
  if (meta) {
    if (!cJSON_IsObject(meta)) {
      rc = kiln_fail(KILN_ERR_FORMAT, "load: %s: \"__metadata__\" is %s, not an object of strings", path, json_kind(meta));
      goto out;
    }
    int m = cJSON_GetArraySize(meta);
    f->meta_keys = calloc((size_t)(m ? m : 1), sizeof *f->meta_keys);
    f->meta_values = calloc((size_t)(m ? m : 1), sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values) { rc = kiln_fail(KILN_ERR_MEMORY, "load: %s: out of memory", path); goto out; }
    for (const cJSON *v = meta->child; v; v = v->next) {
      if (!cJSON_IsString(v)) {
        rc = kiln_fail(KILN_ERR_FORMAT, "load: %s: \"__metadata__\": the value of \"%s\" is %s, not a string", path, v->string,
                       json_kind(v));
        goto out;
      }
      for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta_keys[i], v->string) == 0) {
          rc = kiln_fail(KILN_ERR_FORMAT, "load: %s: \"__metadata__\": the key \"%s\" appears twice", path, v->string);
          goto out;
        }
      f->meta_keys[f->nmeta] = copy_string(v->string);
      f->meta_values[f->nmeta] = copy_string(v->valuestring);
      f->nmeta++;
      if (!f->meta_keys[f->nmeta - 1] || !f->meta_values[f->nmeta - 1]) {
        rc = kiln_fail(KILN_ERR_MEMORY, "load: %s: out of memory", path);
        goto out;
      }
    }
  }
  /* Names unique; entries tiling the data area from 0 to its end, in order, without overlap. */
  {
    struct entry **names = calloc((size_t)(f->n ? f->n : 1), sizeof *names);
    if (!names) { rc = kiln_fail(KILN_ERR_MEMORY, "load: %s: out of memory", path); goto out; }
    for (int i = 0; i < f->n; i++) names[i] = &f->entries[i];
    qsort(names, (size_t)f->n, sizeof *names, by_name);
    for (int i = 1; i < f->n && !rc; i++)
      if (strcmp(names[i - 1]->name, names[i]->name) == 0)
        rc = kiln_fail(KILN_ERR_FORMAT, "load: %s: the entry \"%s\" appears twice in the header", path, names[i]->name);
    free(names);
    if (rc) goto out;
  }
  qsort(f->entries, (size_t)f->n, sizeof *f->entries, by_offsets);
  int64_t pos = 0;
  for (int i = 0; i < f->n; i++) {
    const struct entry *e = &f->entries[i];
    if (e->begin < pos) {
      const struct entry *prev = &f->entries[i - 1];
      rc = kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\" (data_offsets [%lld, %lld]) overlaps entry \"%s\" ([%lld, %lld])",
                     path, e->name, (long long)e->begin, (long long)e->end, prev->name, (long long)prev->begin,
                     (long long)prev->end);
      goto out;
    }
    if (e->begin > pos) {
      rc = kiln_fail(KILN_ERR_FORMAT, "load: %s: bytes [%lld, %lld) of the data area belong to no entry (the next, \"%s\", "
                     "begins at %lld)", path, (long long)pos, (long long)e->begin, e->name, (long long)e->begin);
      goto out;
    }
    pos = e->end;
  }
  if (pos != data_bytes) {
    rc = kiln_fail(KILN_ERR_FORMAT, "load: %s: the data area has %lld bytes but the entries cover %lld: %lld bytes from file "
                   "offset %lld belong to no entry", path, (long long)data_bytes, (long long)pos, (long long)(data_bytes - pos),
                   (long long)(f->data_start + pos));
    goto out;
  }
  /* BOOL elements are the bytes 0 and 1. */
  for (int i = 0; i < f->n; i++) {
    const struct entry *e = &f->entries[i];
    if (e->dtype != KILN_BOOL) continue;
    const unsigned char *q = p + f->data_start + e->begin;
    for (int64_t k = 0; k < e->end - e->begin; k++)
      if (q[k] > 1) {
        rc = kiln_fail(KILN_ERR_FORMAT, "load: %s: entry \"%s\": BOOL element %lld is the byte %u (expected 0 or 1)", path,
                       e->name, (long long)k, q[k]);
        goto out;
      }
  }
out:
  cJSON_Delete(root);
  return rc;
}

KILN_API struct kiln_safetensors *kiln_safetensors_open(const char *path, int flags) {
  if (!path) {
    kiln_fail(KILN_ERR_ARGUMENT, "load: the path is missing (NULL)");
    return NULL;
  }
  int64_t size = 0;
  int fd = kiln_open_regular("load", path, &size);
  if (fd < 0) return NULL;
  if (size < 8) {
    kiln_fail(KILN_ERR_FORMAT, "load: %s: truncated: %lld bytes, fewer than the 8 of the header length", path, (long long)size);
    close(fd);
    return NULL;
  }
  struct kiln_safetensors *f = calloc(1, sizeof *f);
  struct blob *b = calloc(1, sizeof *b);
  char *pathcopy = copy_string(path);
  if (!f || !b || !pathcopy) {
    free(f); free(b); free(pathcopy);
    close(fd);
    kiln_fail(KILN_ERR_MEMORY, "load: %s: out of memory", path);
    return NULL;
  }
  f->path = pathcopy;
  f->blob = b;
  b->refcount = 1;
  b->len = (size_t)size;
  /* Private and writable: tensors that borrow the mapping may be changed in place (copy on write). */
  void *m = (flags & KILN_SAFETENSORS_NO_MMAP) ? MAP_FAILED : mmap(NULL, b->len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (m != MAP_FAILED) {
    b->base = m;
    b->mapped = 1;
  } else {
    b->base = malloc(b->len);
    if (!b->base) {
      kiln_fail(KILN_ERR_MEMORY, "load: %s: out of memory reading %lld bytes", path, (long long)size);
      goto fail;
    }
    size_t done = 0;
    while (done < b->len) {
      ssize_t r = pread(fd, b->base + done, b->len - done, (off_t)done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        kiln_fail(KILN_ERR_IO, "load: %s: read failed at offset %zu: %s", path, done, r < 0 ? strerror(errno) : "the file shrank");
        goto fail;
      }
      done += (size_t)r;
    }
  }
  close(fd);
  fd = -1;
  if (parse_header(f, path)) goto fail;
  return f;
fail:
  if (fd >= 0) close(fd);
  close_handle(f);
  return NULL;
}

KILN_API int kiln_safetensors_count(const struct kiln_safetensors *f) { return f ? f->n : 0; }

KILN_API const char *kiln_safetensors_name(const struct kiln_safetensors *f, int i) {
  return f && i >= 0 && i < f->n ? f->entries[i].name : NULL;
}

KILN_API int kiln_safetensors_meta_count(const struct kiln_safetensors *f) { return f ? f->nmeta : 0; }

KILN_API const char *kiln_safetensors_meta_key(const struct kiln_safetensors *f, int i) {
  return f && i >= 0 && i < f->nmeta ? f->meta_keys[i] : NULL;
}

KILN_API const char *kiln_safetensors_meta_value(const struct kiln_safetensors *f, int i) {
  return f && i >= 0 && i < f->nmeta ? f->meta_values[i] : NULL;
}

KILN_API struct kiln_tensor *kiln_safetensors_tensor(struct kiln_safetensors *f, int i) {
  if (!f) {
    kiln_fail(KILN_ERR_ARGUMENT, "load: the file handle is missing (NULL)");
    return NULL;
  }
  if (i < 0 || i >= f->n) {
    kiln_fail(KILN_ERR_INDEX, "load: %s: entry %d of %d does not exist", f->path, i, f->n);
    return NULL;
  }
  const struct entry *e = &f->entries[i];
  unsigned char *data = f->blob->base + f->data_start + e->begin;
  int esize = kiln_dtype_size(e->dtype);
  if (e->end > e->begin && (uintptr_t)data % (uintptr_t)esize == 0) {
    __atomic_add_fetch(&f->blob->refcount, 1, __ATOMIC_RELAXED);
    struct kiln_tensor *t = kiln_tensor_external(e->ndim, e->sizes, e->dtype, data, blob_release, f->blob);
    if (!t) blob_release(f->blob);
    return t;
  }
  /* Empty, or misaligned (a header not padded to 8 bytes): a copy. */
  struct kiln_tensor *t = kiln_tensor_empty(e->ndim, e->sizes, e->dtype, (struct kiln_device){KILN_CPU, 0});
  if (!t) {
    kiln_fail(kiln_error_code(), "load: %s: entry \"%s\": %s", f->path, e->name, kiln_error_message());
    return NULL;
  }
  if (e->end > e->begin) memcpy(kiln_tensor_data(t), data, (size_t)(e->end - e->begin));
  return t;
}

KILN_API void kiln_safetensors_close(struct kiln_safetensors *f) { close_handle(f); }
