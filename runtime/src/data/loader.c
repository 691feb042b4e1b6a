/* loader.c: datasets that C threads read without Lua (rows of tensors, image folders), the making
   of one batch, and the loader: worker threads that claim batches in order and fill a ring of
   `prefetch` slots ahead of the consumer, sleeping on condition variables when the ring is full.
   What a batch holds depends only on the order and on (seed, epoch, sample index), never on which
   worker made it or when, so every worker count gives the same batches. */
#define _GNU_SOURCE
#include "data.h"
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

static const struct kiln_device CPU_DEVICE = {KILN_CPU, 0};

/* ---- datasets ---- */

enum { DATASET_TENSORS, DATASET_IMAGES };
enum { MAX_FOLDER_DEPTH = 16 };

struct kiln_dataset {
  int32_t refcount;
  int kind;
  int64_t n;                                        /* samples */
  /* tensors: contiguous, sharing dim 0 */
  int nt;
  struct kiln_tensor *t[KILN_LOADER_MAX_TENSORS];
  int64_t row_bytes[KILN_LOADER_MAX_TENSORS];
  /* image folders */
  char *root;
  int channels;
  int nclasses;
  char **classes;
  char **files;                                     /* n paths */
  int64_t *labels;                                  /* n class indices */
};

static void dataset_destroy(struct kiln_dataset *d) {
  for (int k = 0; k < d->nt; k++) kiln_tensor_release(d->t[k]);
  for (int k = 0; k < d->nclasses; k++) free(d->classes[k]);
  if (d->files)
    for (int64_t i = 0; i < d->n; i++) free(d->files[i]);
  free(d->classes);
  free(d->files);
  free(d->labels);
  free(d->root);
  free(d);
}

KILN_API void kiln_dataset_retain(struct kiln_dataset *d) {
  if (d) __atomic_add_fetch(&d->refcount, 1, __ATOMIC_RELAXED);
}

KILN_API void kiln_dataset_release(struct kiln_dataset *d) {
  if (d && __atomic_sub_fetch(&d->refcount, 1, __ATOMIC_ACQ_REL) == 0) dataset_destroy(d);
}

KILN_API struct kiln_dataset *kiln_dataset_tensors(int n, struct kiln_tensor *const *tensors) {
  if (n < 1 || n > KILN_LOADER_MAX_TENSORS || !tensors) {
    kiln_fail(KILN_ERR_ARGUMENT, "dataset_tensors: %d tensors (expected 1 to %d)", n, KILN_LOADER_MAX_TENSORS);
    return NULL;
  }
  for (int k = 0; k < n; k++) {
    const struct kiln_tensor *t = tensors[k];
    if (kiln_check_live("dataset_tensors", t)) return NULL;
    if (t->ndim < 1) {
      kiln_fail(KILN_ERR_SHAPE, "dataset_tensors: tensor %d is 0-dim (samples run along dim 0)", k);
      return NULL;
    }
    if (t->device.type != KILN_CPU) {
      kiln_fail(KILN_ERR_DEVICE, "dataset_tensors: tensor %d %s is on %s; the loader's workers read the cpu (keep the "
                "dataset there and move each batch)", k, kiln_shape_string(t), kiln_device_name(t->device));
      return NULL;
    }
    if (t->sizes[0] != tensors[0]->sizes[0]) {
      kiln_fail(KILN_ERR_SHAPE, "dataset_tensors: tensor %d %s has %lld samples, tensor 0 %s has %lld (dim 0 must agree)",
                k, kiln_shape_string(t), (long long)t->sizes[0], kiln_shape_string(tensors[0]),
                (long long)tensors[0]->sizes[0]);
      return NULL;
    }
  }
  struct kiln_dataset *d = calloc(1, sizeof *d);
  if (!d) {
    kiln_fail(KILN_ERR_MEMORY, "dataset_tensors: out of memory");
    return NULL;
  }
  d->refcount = 1;
  d->kind = DATASET_TENSORS;
  d->n = tensors[0]->sizes[0];
  for (int k = 0; k < n; k++) {
    d->t[k] = kiln_contiguous(tensors[k]);
    if (!d->t[k]) {
      dataset_destroy(d);
      return NULL;
    }
    d->nt = k + 1;
    int64_t row = 1;
    for (int i = 1; i < tensors[k]->ndim; i++) row *= tensors[k]->sizes[i];
    d->row_bytes[k] = row * kiln_dtype_size(tensors[k]->dtype);
  }
  return d;
}

/* -- image folders -- */

struct strings {
  char **v;
  int64_t n, cap;
};

static int strings_push(struct strings *l, char *s, const char *op) {
  if (!s) return kiln_fail(KILN_ERR_MEMORY, "%s: out of memory", op);
  if (l->n == l->cap) {
    int64_t cap = l->cap ? 2 * l->cap : 64;
    char **v = realloc(l->v, sizeof(char *) * (size_t)cap);
    if (!v) {
      free(s);
      return kiln_fail(KILN_ERR_MEMORY, "%s: out of memory", op);
    }
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = s;
  return KILN_OK;
}

static void strings_free(struct strings *l) {
  for (int64_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  memset(l, 0, sizeof *l);
}

static char *join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  size_t k = a;
  if (a == 0 || dir[a - 1] != '/') p[k++] = '/';
  memcpy(p + k, name, b + 1);
  return p;
}

static const char *const image_extensions[] = {"png", "jpg", "jpeg", "bmp", "gif", "tga", "pnm", "pgm", "ppm"};
#define IMAGE_EXTENSIONS ".png, .jpg, .jpeg, .bmp, .gif, .tga, .pnm, .pgm, .ppm"

static int is_image_name(const char *name) {
  const char *dot = strrchr(name, '.');
  if (!dot) return 0;
  for (size_t i = 0; i < sizeof image_extensions / sizeof image_extensions[0]; i++)
    if (!strcasecmp(dot + 1, image_extensions[i])) return 1;
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of dir, sorted by name (byte order); hidden ones (".name") are left out. */
static int list_dir(const char *dir, struct strings *names, const char *op) {
  DIR *dp = opendir(dir);
  if (!dp) return kiln_fail(KILN_ERR_IO, "%s: cannot open the folder %s: %s", op, dir, strerror(errno));
  int rc = KILN_OK;
  for (;;) {
    errno = 0;
    struct dirent *e = readdir(dp);
    if (!e) {
      if (errno) rc = kiln_fail(KILN_ERR_IO, "%s: cannot read the folder %s: %s", op, dir, strerror(errno));
      break;
    }
    if (e->d_name[0] == '.') continue;
    if ((rc = strings_push(names, strdup(e->d_name), op))) break;
  }
  closedir(dp);
  if (rc) {
    strings_free(names);
    return rc;
  }
  if (names->n > 1) qsort(names->v, (size_t)names->n, sizeof(char *), by_name);
  return KILN_OK;
}

/* A folder, following symbolic links (a dangling link is a file: reading it will say so). */
static int is_folder(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Appends the image files under dir (sub-folders included) to files, sorted by path. */
static int collect(const char *dir, int depth, struct strings *files, const char *op) {
  if (depth > MAX_FOLDER_DEPTH)
    return kiln_fail(KILN_ERR_IO, "%s: %s: folders nested more than %d deep (a symbolic link loop?)", op, dir,
                     MAX_FOLDER_DEPTH);
  struct strings names = {0};
  int rc = list_dir(dir, &names, op);
  if (rc) return rc;
  for (int64_t i = 0; i < names.n && !rc; i++) {
    char *path = join(dir, names.v[i]);
    if (!path) rc = kiln_fail(KILN_ERR_MEMORY, "%s: out of memory", op);
    else if (is_folder(path)) {
      rc = collect(path, depth + 1, files, op);
      free(path);
    } else if (is_image_name(names.v[i])) rc = strings_push(files, path, op);
    else free(path);
  }
  strings_free(&names);
  return rc;
}

KILN_API struct kiln_dataset *kiln_dataset_image_folder(const char *root, int channels) {
  const char *op = "ImageFolder";
  if (!root) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: the root is missing (NULL)", op);
    return NULL;
  }
  if (channels < 0 || channels > 4) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: %s: %d channels (expected 1 grey, 2 grey+alpha, 3 RGB, 4 RGBA, or 0 for each "
              "file's own)", op, root, channels);
    return NULL;
  }
  struct stat st;
  if (stat(root, &st) != 0) {
    kiln_fail(KILN_ERR_IO, "%s: cannot open the folder %s: %s", op, root, strerror(errno));
    return NULL;
  }
  if (!S_ISDIR(st.st_mode)) {
    kiln_fail(KILN_ERR_IO, "%s: %s is not a folder (expected root/<class>/<image files>)", op, root);
    return NULL;
  }
  struct strings names = {0}, classes = {0}, files = {0};
  int64_t *labels = NULL;
  int rc = list_dir(root, &names, op);
  for (int64_t i = 0; i < names.n && !rc; i++) {
    char *path = join(root, names.v[i]);
    if (!path) rc = kiln_fail(KILN_ERR_MEMORY, "%s: out of memory", op);
    else if (is_folder(path)) rc = strings_push(&classes, path, op);
    else free(path);
  }
  if (!rc && classes.n == 0)
    rc = kiln_fail(KILN_ERR_IO, "%s: %s holds no class folders (expected root/<class>/<image files>)", op, root);
  if (!rc && classes.n > INT32_MAX) rc = kiln_fail(KILN_ERR_ARGUMENT, "%s: %s: too many classes", op, root);
  int64_t cap = 0;
  for (int64_t k = 0; k < classes.n && !rc; k++) {
    int64_t before = files.n;
    rc = collect(classes.v[k], 0, &files, op);
    if (!rc && files.n == before)
      rc = kiln_fail(KILN_ERR_IO, "%s: the class folder %s holds no images (files named " IMAGE_EXTENSIONS ")", op,
                     classes.v[k]);
    if (!rc && files.n > cap) {
      cap = files.cap;
      int64_t *p = realloc(labels, sizeof(int64_t) * (size_t)cap);
      if (!p) rc = kiln_fail(KILN_ERR_MEMORY, "%s: out of memory", op);
      else labels = p;
    }
    for (int64_t i = before; i < files.n && !rc; i++) labels[i] = k;
  }
  struct kiln_dataset *d = rc ? NULL : calloc(1, sizeof *d);
  if (!rc && !d) rc = kiln_fail(KILN_ERR_MEMORY, "%s: out of memory", op);
  if (d) d->root = strdup(root);
  if (d && !d->root) rc = kiln_fail(KILN_ERR_MEMORY, "%s: out of memory", op);
  if (rc) {
    free(d);
    strings_free(&names);
    strings_free(&classes);
    strings_free(&files);
    free(labels);
    return NULL;
  }
  /* the class names are the folder names (the entries of root, in the same order) */
  char **class_names = malloc(sizeof(char *) * (size_t)classes.n);
  if (!class_names) {
    free(d->root);
    free(d);
    strings_free(&names);
    strings_free(&classes);
    strings_free(&files);
    free(labels);
    kiln_fail(KILN_ERR_MEMORY, "%s: out of memory", op);
    return NULL;
  }
  for (int64_t k = 0; k < classes.n; k++) {
    const char *slash = strrchr(classes.v[k], '/');
    class_names[k] = classes.v[k];
    memmove(class_names[k], slash + 1, strlen(slash + 1) + 1);
  }
  free(classes.v);
  strings_free(&names);
  d->refcount = 1;
  d->kind = DATASET_IMAGES;
  d->channels = channels;
  d->nclasses = (int)classes.n;
  d->classes = class_names;
  d->files = files.v;
  d->n = files.n;
  d->labels = labels;
  return d;
}

KILN_API int64_t kiln_dataset_len(const struct kiln_dataset *d) { return d ? d->n : 0; }

KILN_API int kiln_dataset_num_tensors(const struct kiln_dataset *d) {
  if (!d) return 0;
  return d->kind == DATASET_IMAGES ? 2 : d->nt;
}

KILN_API int kiln_dataset_num_classes(const struct kiln_dataset *d) { return d ? d->nclasses : 0; }

KILN_API const char *kiln_dataset_class_name(const struct kiln_dataset *d, int k) {
  return d && k >= 0 && k < d->nclasses ? d->classes[k] : NULL;
}

KILN_API const char *kiln_dataset_file(const struct kiln_dataset *d, int64_t i) {
  return d && d->kind == DATASET_IMAGES && i >= 0 && i < d->n ? d->files[i] : NULL;
}

KILN_API int64_t kiln_dataset_label(const struct kiln_dataset *d, int64_t i) {
  return d && d->kind == DATASET_IMAGES && i >= 0 && i < d->n ? d->labels[i] : -1;
}

/* ---- one batch ---- */

enum { CANCELLED = -1 };

struct batch_ctx {
  const struct kiln_dataset *d;
  const struct kiln_transforms *tf;   /* NULL or empty: none */
  uint64_t key;
  int64_t epoch, batch;               /* for messages; batch < 0: a single sample (dataset_get) */
  const uint64_t *gen;                /* cancelled when *gen moves away from want (NULL: never) */
  uint64_t want;
  int pinned;                         /* collate into page-locked memory */
};

/* A batch tensor: in pinned memory when the loader pins its batches. */
static struct kiln_tensor *batch_empty(const struct batch_ctx *c, int ndim, const int64_t *sizes, int dtype) {
  if (c->pinned) return kiln_tensor_empty_pinned(ndim, sizes, dtype, "loader: pin_memory");
  return kiln_tensor_empty(ndim, sizes, dtype, CPU_DEVICE);
}

static int cancelled(const struct batch_ctx *c) {
  return c->gen && __atomic_load_n(c->gen, __ATOMIC_ACQUIRE) != c->want;
}

static int transformed(const struct kiln_dataset *d, const struct kiln_transforms *tf) {
  return d->kind == DATASET_IMAGES || (tf && tf->n > 0);
}

/* Sample index as a planar f32 image in s's current buffer, through the transforms. */
static int load_image(const struct batch_ctx *c, int64_t index, struct kiln_scratch *s, struct kiln_fimage *img) {
  const struct kiln_dataset *d = c->d;
  s->cur = 0;
  if (d->kind == DATASET_IMAGES) {
    struct kiln_u8_image u;
    int rc = kiln_image_decode(d->files[index], d->channels, &u);
    if (rc) return rc;
    int64_t plane = (int64_t)u.h * u.w;
    float *p = kiln_scratch_current(s, (size_t)(plane * u.c));
    if (!p) {
      kiln_image_free(&u);
      return kiln_fail(KILN_ERR_MEMORY, "image: %s: out of memory for %d x %d x %d floats", d->files[index], u.w, u.h, u.c);
    }
    for (int ch = 0; ch < u.c; ch++) {
      const unsigned char *src = u.pixels + ch;
      float *dst = p + ch * plane;
      for (int64_t i = 0; i < plane; i++) dst[i] = (float)src[i * u.c] / 255.0f;
    }
    *img = (struct kiln_fimage){p, u.c, u.h, u.w};
    kiln_image_free(&u);
  } else {
    const struct kiln_tensor *t = d->t[0];
    int three = t->ndim == 4;
    int64_t ch = three ? t->sizes[1] : 1, h = t->sizes[t->ndim - 2], w = t->sizes[t->ndim - 1];
    float *p = kiln_scratch_current(s, (size_t)(ch * h * w));
    if (!p) return kiln_fail(KILN_ERR_MEMORY, "out of memory for a [%lld,%lld,%lld] image", (long long)ch, (long long)h,
                             (long long)w);
    kiln_convert(p, KILN_F32, (const char *)kiln_tensor_data(t) + index * d->row_bytes[0], t->dtype, ch * h * w);
    *img = (struct kiln_fimage){p, ch, h, w};
  }
  return kiln_transforms_run(c->tf, s, img, c->key, index);
}

/* Where sample index sits, for messages: "sample 17 (from 0) of batch 3, epoch 2" plus its file. */
static const char *sample_where(const struct batch_ctx *c, int64_t index) {
  static _Thread_local char buf[2][600];
  static _Thread_local int next;
  char *b = buf[next++ & 1];
  const char *file = c->d->kind == DATASET_IMAGES ? c->d->files[index] : NULL;
  if (c->batch >= 0)
    snprintf(b, sizeof buf[0], "sample %lld (from 0%s%s) of batch %lld (from 0), epoch %lld", (long long)index,
             file ? "; " : "", file ? file : "", (long long)c->batch, (long long)c->epoch);
  else
    snprintf(b, sizeof buf[0], "sample %lld (from 0%s%s)", (long long)index, file ? "; " : "", file ? file : "");
  return b;
}

static const char *dims3(const struct kiln_fimage *img) {
  static _Thread_local char buf[2][96];
  static _Thread_local int next;
  char *b = buf[next++ & 1];
  snprintf(b, sizeof buf[0], "[%lld,%lld,%lld]", (long long)img->c, (long long)img->h, (long long)img->w);
  return b;
}

/* out[0..nt) = the batch of samples idx[0..B); KILN_OK, CANCELLED or an error status. */
static int make_batch(const struct batch_ctx *c, const int64_t *idx, int64_t B, struct kiln_scratch *s,
                      struct kiln_tensor **out) {
  const struct kiln_dataset *d = c->d;
  int nt = kiln_dataset_num_tensors(d);
  int images = transformed(d, c->tf);
  int rc = KILN_OK;
  for (int k = 0; k < nt; k++) out[k] = NULL;
  /* rows copied as they are */
  if (d->kind == DATASET_TENSORS) {
    for (int k = images ? 1 : 0; k < nt && !rc; k++) {
      const struct kiln_tensor *t = d->t[k];
      int64_t sizes[KILN_MAX_DIMS];
      memcpy(sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
      sizes[0] = B;
      out[k] = batch_empty(c, t->ndim, sizes, t->dtype);
      if (!out[k]) { rc = kiln_error_code(); break; }
      char *dst = kiln_tensor_data(out[k]);
      const char *src = kiln_tensor_data(t);
      size_t row = (size_t)d->row_bytes[k];
      for (int64_t b = 0; b < B; b++) memcpy(dst + (size_t)b * row, src + (size_t)idx[b] * row, row);
    }
  } else {
    int64_t sizes[1] = {B};
    out[1] = batch_empty(c, 1, sizes, KILN_I64);
    if (!out[1]) rc = kiln_error_code();
    else {
      int64_t *labels = kiln_tensor_data(out[1]);
      for (int64_t b = 0; b < B; b++) labels[b] = d->labels[idx[b]];
    }
  }
  /* samples decoded and transformed one by one */
  struct kiln_fimage first = {0};
  for (int64_t b = 0; b < B && images && !rc; b++) {
    if (cancelled(c)) { rc = CANCELLED; break; }
    struct kiln_fimage img;
    if ((rc = load_image(c, idx[b], s, &img))) {
      kiln_fail(rc, "loader: %s: %s", sample_where(c, idx[b]), kiln_error_message());
      break;
    }
    if (b == 0) {
      first = img;
      int64_t sizes[4] = {B, img.c, img.h, img.w};
      out[0] = batch_empty(c, 4, sizes, KILN_F32);
      if (!out[0]) { rc = kiln_error_code(); break; }
    } else if (img.c != first.c || img.h != first.h || img.w != first.w) {
      rc = kiln_fail(KILN_ERR_SHAPE, "loader: %s is %s after the transforms, but %s, the first of its batch, is %s: the "
                     "samples of a batch must share one size (add a Resize or CenterCrop)", sample_where(c, idx[b]),
                     dims3(&img), sample_where(c, idx[0]), dims3(&first));
      break;
    }
    size_t row = (size_t)(img.c * img.h * img.w);
    memcpy((float *)kiln_tensor_data(out[0]) + (size_t)b * row, img.data, sizeof(float) * row);
  }
  if (!rc && cancelled(c)) rc = CANCELLED;
  if (rc)
    for (int k = 0; k < nt; k++) {
      kiln_tensor_release(out[k]);
      out[k] = NULL;
    }
  return rc;
}

/* Transforms apply to the first tensor of a tensor dataset only when its rows are images. */
static int check_transforms(const char *op, const struct kiln_dataset *d, const struct kiln_transforms *tf) {
  if (!tf || tf->n == 0 || d->kind == DATASET_IMAGES) return KILN_OK;
  const struct kiln_tensor *t = d->t[0];
  if (t->ndim != 3 && t->ndim != 4)
    return kiln_fail(KILN_ERR_SHAPE, "%s: transforms take samples that are images [C,H,W] or [H,W], but tensor 0 is %s "
                     "(samples of %d dims)", op, kiln_shape_string(t), t->ndim - 1);
  return KILN_OK;
}

KILN_API int kiln_dataset_get(const struct kiln_dataset *d, int64_t index, const struct kiln_transforms *t, int64_t seed,
                              int64_t epoch, int n, struct kiln_tensor **out) {
  if (!d || !out) return kiln_fail(KILN_ERR_ARGUMENT, "dataset_get: the dataset or the output is missing (NULL)");
  int nt = kiln_dataset_num_tensors(d);
  if (n < nt) return kiln_fail(KILN_ERR_ARGUMENT, "dataset_get: room for %d tensors, a sample has %d", n, nt);
  for (int k = 0; k < n; k++) out[k] = NULL;
  if (index < 0 || index >= d->n)
    return kiln_fail(KILN_ERR_INDEX, "dataset_get: index %lld out of range for a dataset of %lld samples (C counts from 0)",
                     (long long)index, (long long)d->n);
  if (check_transforms("dataset_get", d, t)) return kiln_error_code();
  struct batch_ctx c = {d, t, kiln_sample_key(seed, epoch), epoch, -1, NULL, 0, 0};
  struct kiln_scratch s = {0};
  struct kiln_tensor *batch[KILN_LOADER_MAX_TENSORS];
  int rc = make_batch(&c, &index, 1, &s, batch);
  kiln_scratch_free(&s);
  if (rc) {
    /* drop make_batch's "loader: " prefix: here the caller asked for the sample */
    const char *m = kiln_error_message();
    if (!strncmp(m, "loader: ", 8)) kiln_fail(rc, "dataset_get: %s", m + 8);
    return rc;
  }
  for (int k = 0; k < nt && !rc; k++) {
    out[k] = kiln_select(batch[k], 0, 0);
    if (!out[k]) rc = kiln_error_code();
  }
  for (int k = 0; k < nt; k++) kiln_tensor_release(batch[k]);
  if (rc)
    for (int k = 0; k < nt; k++) {
      kiln_tensor_release(out[k]);
      out[k] = NULL;
    }
  return rc;
}

/* ---- the loader ---- */

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_FAILED };
enum { MAX_PREFETCH = 4096 };

struct slot {
  int64_t batch;                                   /* the batch it holds or is being filled with; -1: none */
  int state;
  int code;                                        /* SLOT_FAILED: the status and message */
  char *message;
  struct kiln_tensor *out[KILN_LOADER_MAX_TENSORS];
};

struct worker {
  struct kiln_loader *l;
  struct kiln_scratch scratch;
  pthread_t thread;
};

struct kiln_loader {
  struct kiln_dataset *d;
  struct kiln_transforms *tf;                      /* NULL: none */
  int64_t batch_size, seed;
  int shuffle, drop_last, nworkers, prefetch, ntensors;
  int pinned;                                      /* batches in page-locked memory */
  pthread_mutex_t lock;
  pthread_cond_t work;                             /* workers wait here for a batch to claim */
  pthread_cond_t ready;                            /* next and stop wait here for a batch or for idle workers */
  struct worker *workers;
  int started;                                     /* threads running */
  struct kiln_scratch own;                         /* the caller's, with 0 workers */
  struct slot *slots;                              /* prefetch slots: batch b lives in slot b % prefetch */
  uint64_t gen;                                    /* bumped to cancel the batches in flight */
  int active, stop, busy;                          /* an epoch is running; the workers must exit; batches in hand */
  int64_t epoch;
  uint64_t key;
  int64_t *order, n, nbatches;
  int64_t claimed, consumed;                       /* the next batch to claim, and to hand out */
  int failed_code;                                 /* 0 workers: the epoch's error, repeated by later next calls */
  char *failed_message;
  double wait;
};

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *copy_message(void) {
  const char *m = kiln_error_message();
  return strdup(m[0] ? m : "loader: unknown error");
}

static void clear_slot(struct slot *s) {
  for (int k = 0; k < KILN_LOADER_MAX_TENSORS; k++) {
    kiln_tensor_release(s->out[k]);
    s->out[k] = NULL;
  }
  free(s->message);
  s->message = NULL;
  s->state = SLOT_FREE;
  s->batch = -1;
  s->code = 0;
}

static struct batch_ctx batch_context(const struct kiln_loader *l, int64_t b, uint64_t gen) {
  return (struct batch_ctx){l->d, l->tf, l->key, l->epoch, b, &l->gen, gen, l->pinned};
}

static int64_t batch_length(const struct kiln_loader *l, int64_t b) {
  int64_t start = b * l->batch_size;
  return l->n - start < l->batch_size ? l->n - start : l->batch_size;
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  struct kiln_loader *l = w->l;
  pthread_mutex_lock(&l->lock);
  for (;;) {
    while (!l->stop && !(l->active && l->claimed < l->nbatches && l->claimed < l->consumed + l->prefetch))
      pthread_cond_wait(&l->work, &l->lock);
    if (l->stop) break;
    int64_t b = l->claimed++;
    struct slot *s = &l->slots[b % l->prefetch];
    s->batch = b;
    s->state = SLOT_FILLING;
    uint64_t gen = l->gen;
    struct batch_ctx c = batch_context(l, b, gen);
    const int64_t *idx = l->order + b * l->batch_size;
    int64_t B = batch_length(l, b);
    l->busy++;
    pthread_mutex_unlock(&l->lock);

    /* the order, transforms and dataset stay as they are while busy > 0 (see quiesce) */
    struct kiln_tensor *out[KILN_LOADER_MAX_TENSORS];
    int rc = make_batch(&c, idx, B, &w->scratch, out);
    char *message = rc > 0 ? copy_message() : NULL;

    pthread_mutex_lock(&l->lock);
    l->busy--;
    if (rc != CANCELLED && gen == l->gen) {
      if (rc) {
        s->state = SLOT_FAILED;
        s->code = rc;
        s->message = message;
        message = NULL;
      } else {
        for (int k = 0; k < l->ntensors; k++) s->out[k] = out[k];
        s->state = SLOT_READY;
      }
    } else if (rc == KILN_OK) {   /* made, but the epoch moved on meanwhile */
      for (int k = 0; k < l->ntensors; k++) kiln_tensor_release(out[k]);
    }
    free(message);
    pthread_cond_broadcast(&l->ready);
  }
  pthread_mutex_unlock(&l->lock);
  return NULL;
}

/* With the lock held: cancel the batches in flight, wait until no worker holds one, empty the ring. */
static void quiesce(struct kiln_loader *l) {
  __atomic_add_fetch(&l->gen, 1, __ATOMIC_ACQ_REL);
  l->active = 0;
  while (l->busy > 0) pthread_cond_wait(&l->ready, &l->lock);
  for (int i = 0; i < l->prefetch; i++) clear_slot(&l->slots[i]);
  free(l->failed_message);
  l->failed_message = NULL;
  l->failed_code = 0;
}

static void stop_workers(struct kiln_loader *l) {
  pthread_mutex_lock(&l->lock);
  l->stop = 1;
  __atomic_add_fetch(&l->gen, 1, __ATOMIC_ACQ_REL);
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->lock);
  for (int i = 0; i < l->started; i++) pthread_join(l->workers[i].thread, NULL);
  l->started = 0;
}

/* Start the worker threads (at construction, and for an epoch after one that failed). */
static int start_workers(struct kiln_loader *l) {
  l->stop = 0;
  for (int i = 0; i < l->nworkers; i++) {
    l->workers[i].l = l;
    int e = pthread_create(&l->workers[i].thread, NULL, worker_main, &l->workers[i]);
    if (e) {
      stop_workers(l);
      return kiln_fail(KILN_ERR_MEMORY, "loader: cannot start worker %d of %d: %s", i, l->nworkers, strerror(e));
    }
    l->started = i + 1;
    char name[16];
    snprintf(name, sizeof name, "kiln-loader-%d", i < 99 ? i : 99);   /* as top and debuggers show it */
    pthread_setname_np(l->workers[i].thread, name);
  }
  return KILN_OK;
}

KILN_API void kiln_loader_free(struct kiln_loader *l) {
  if (!l) return;
  stop_workers(l);
  if (l->slots)
    for (int i = 0; i < l->prefetch; i++) clear_slot(&l->slots[i]);
  if (l->workers)
    for (int i = 0; i < l->nworkers; i++) kiln_scratch_free(&l->workers[i].scratch);
  kiln_scratch_free(&l->own);
  pthread_mutex_destroy(&l->lock);
  pthread_cond_destroy(&l->work);
  pthread_cond_destroy(&l->ready);
  free(l->workers);
  free(l->slots);
  free(l->order);
  free(l->failed_message);
  kiln_transforms_free(l->tf);
  kiln_dataset_release(l->d);
  free(l);
}

KILN_API struct kiln_loader *kiln_loader_new(struct kiln_dataset *dataset, int64_t batch_size, int shuffle, int drop_last,
                                             int workers, int prefetch, int64_t seed) {
  if (!dataset) {
    kiln_fail(KILN_ERR_ARGUMENT, "loader: the dataset is missing (NULL)");
    return NULL;
  }
  if (batch_size < 1) {
    kiln_fail(KILN_ERR_ARGUMENT, "loader: batch_size is %lld (expected >= 1)", (long long)batch_size);
    return NULL;
  }
  if (workers < 0 || workers > KILN_LOADER_MAX_WORKERS) {
    kiln_fail(KILN_ERR_ARGUMENT, "loader: %d workers (expected 0 to %d)", workers, KILN_LOADER_MAX_WORKERS);
    return NULL;
  }
  if (prefetch < 1 || prefetch > MAX_PREFETCH) {
    kiln_fail(KILN_ERR_ARGUMENT, "loader: prefetch is %d (expected 1 to %d batches)", prefetch, MAX_PREFETCH);
    return NULL;
  }
  struct kiln_loader *l = calloc(1, sizeof *l);
  if (!l) {
    kiln_fail(KILN_ERR_MEMORY, "loader: out of memory");
    return NULL;
  }
  kiln_dataset_retain(dataset);
  l->d = dataset;
  l->batch_size = batch_size;
  l->shuffle = shuffle != 0;
  l->drop_last = drop_last != 0;
  l->nworkers = workers;
  l->prefetch = prefetch;
  l->seed = seed;
  l->ntensors = kiln_dataset_num_tensors(dataset);
  pthread_mutex_init(&l->lock, NULL);
  pthread_cond_init(&l->work, NULL);
  pthread_cond_init(&l->ready, NULL);
  l->slots = calloc((size_t)prefetch, sizeof *l->slots);
  l->workers = workers ? calloc((size_t)workers, sizeof *l->workers) : NULL;
  if (!l->slots || (workers && !l->workers)) {
    kiln_loader_free(l);
    kiln_fail(KILN_ERR_MEMORY, "loader: out of memory");
    return NULL;
  }
  for (int i = 0; i < prefetch; i++) l->slots[i].batch = -1;
  if (start_workers(l)) {
    kiln_loader_free(l);
    return NULL;
  }
  return l;
}

KILN_API int kiln_loader_set_transforms(struct kiln_loader *l, const struct kiln_transforms *t) {
  if (!l) return kiln_fail(KILN_ERR_ARGUMENT, "loader: set_transforms: the loader is missing (NULL)");
  if (check_transforms("loader", l->d, t)) return kiln_error_code();
  struct kiln_transforms *copy = NULL;
  if (t && t->n > 0) {
    copy = malloc(sizeof *copy);
    if (!copy) return kiln_fail(KILN_ERR_MEMORY, "loader: set_transforms: out of memory");
    memcpy(copy, t, sizeof *copy);
  }
  pthread_mutex_lock(&l->lock);
  quiesce(l);
  kiln_transforms_free(l->tf);
  l->tf = copy;
  pthread_mutex_unlock(&l->lock);
  return KILN_OK;
}

KILN_API int kiln_loader_set_pin_memory(struct kiln_loader *l, int pin) {
  if (!l) return kiln_fail(KILN_ERR_ARGUMENT, "loader: set_pin_memory: the loader is missing (NULL)");
  if (pin && !kiln_pinned_backend("loader: pin_memory")) return kiln_error_code();
  pthread_mutex_lock(&l->lock);
  quiesce(l);
  l->pinned = pin != 0;
  pthread_mutex_unlock(&l->lock);
  return KILN_OK;
}

KILN_API int kiln_loader_start_epoch_at(struct kiln_loader *l, int64_t epoch, const int64_t *order, int64_t n,
                                        int64_t first_batch) {
  if (!l) return kiln_fail(KILN_ERR_ARGUMENT, "loader: start_epoch: the loader is missing (NULL)");
  if (order && n < 0) return kiln_fail(KILN_ERR_ARGUMENT, "loader: start_epoch: the order has %lld entries", (long long)n);
  if (!order) n = l->d->n;
  int64_t *o = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
  if (!o) return kiln_fail(KILN_ERR_MEMORY, "loader: start_epoch: out of memory for an order of %lld", (long long)n);
  if (order) {
    for (int64_t i = 0; i < n; i++) {
      if (order[i] < 0 || order[i] >= l->d->n) {
        free(o);
        return kiln_fail(KILN_ERR_INDEX, "loader: start_epoch: the order's entry %lld is %lld, out of range for a "
                         "dataset of %lld samples (C counts from 0)", (long long)i, (long long)order[i],
                         (long long)l->d->n);
      }
      o[i] = order[i];
    }
  } else if (l->shuffle) {
    if (kiln_permutation_fill(o, n, l->seed, epoch)) {
      free(o);
      return kiln_error_code();
    }
  } else {
    for (int64_t i = 0; i < n; i++) o[i] = i;
  }
  int64_t nb = l->drop_last ? n / l->batch_size : (n + l->batch_size - 1) / l->batch_size;
  if (first_batch < 0 || first_batch > nb) {
    free(o);
    return kiln_fail(KILN_ERR_ARGUMENT, "loader: start_epoch: first batch %lld for an epoch of %lld batches",
                     (long long)first_batch, (long long)nb);
  }
  pthread_mutex_lock(&l->lock);
  quiesce(l);
  free(l->order);
  l->order = o;
  l->n = n;
  l->nbatches = nb;
  l->epoch = epoch;
  l->key = kiln_sample_key(l->seed, epoch);
  l->claimed = l->consumed = first_batch;
  l->active = 1;
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->lock);
  if (l->started == 0 && l->nworkers > 0 && start_workers(l)) return kiln_error_code();   /* after a failed epoch */
  return KILN_OK;
}

KILN_API int kiln_loader_start_epoch(struct kiln_loader *l, int64_t epoch, const int64_t *order, int64_t n) {
  return kiln_loader_start_epoch_at(l, epoch, order, n, 0);
}

KILN_API int64_t kiln_loader_num_batches(const struct kiln_loader *l) { return l ? l->nbatches : 0; }
KILN_API int64_t kiln_loader_position(const struct kiln_loader *l) { return l ? l->consumed : 0; }
KILN_API double kiln_loader_wait_seconds(const struct kiln_loader *l) { return l ? l->wait : 0; }

/* With 0 workers: make the batch here. */
static int next_inline(struct kiln_loader *l, int n, struct kiln_tensor **out) {
  if (l->failed_message) return kiln_fail(l->failed_code, "%s", l->failed_message);
  int64_t b = l->consumed;
  struct batch_ctx c = {l->d, l->tf, l->key, l->epoch, b, NULL, 0, l->pinned};
  struct kiln_tensor *got[KILN_LOADER_MAX_TENSORS];
  double t0 = now_seconds();
  int rc = make_batch(&c, l->order + b * l->batch_size, batch_length(l, b), &l->own, got);
  l->wait += now_seconds() - t0;
  if (rc) {
    l->failed_code = rc;
    l->failed_message = copy_message();
    return rc;
  }
  for (int k = 0; k < n; k++) out[k] = k < l->ntensors ? got[k] : NULL;
  l->consumed++;
  return KILN_OK;
}

KILN_API int kiln_loader_next_all(struct kiln_loader *l, int n, struct kiln_tensor **out) {
  if (!l || !out) return kiln_fail(KILN_ERR_ARGUMENT, "loader: next: the loader or the output is missing (NULL)");
  if (n < l->ntensors)
    return kiln_fail(KILN_ERR_ARGUMENT, "loader: next: room for %d tensors, a batch has %d", n, l->ntensors);
  for (int k = 0; k < n; k++) out[k] = NULL;
  if (!l->active) return kiln_fail(KILN_ERR_STATE, "loader: next: no epoch is running (call start_epoch first)");
  if (l->consumed >= l->nbatches) return KILN_OK;
  if (l->nworkers == 0) return next_inline(l, n, out);
  if (l->failed_message) return kiln_fail(l->failed_code, "%s", l->failed_message);

  pthread_mutex_lock(&l->lock);
  int64_t b = l->consumed;
  struct slot *s = &l->slots[b % l->prefetch];
  double t0 = now_seconds();
  while (!(s->batch == b && (s->state == SLOT_READY || s->state == SLOT_FAILED))) pthread_cond_wait(&l->ready, &l->lock);
  l->wait += now_seconds() - t0;
  if (s->state == SLOT_FAILED) {
    /* The epoch has failed: every later call of it fails the same way, and the workers stop now,
       rather than go on with batches nobody will take (the next epoch starts them again). */
    int code = s->code;
    l->failed_code = code;
    l->failed_message = strdup(s->message ? s->message : "loader: unknown error");
    pthread_mutex_unlock(&l->lock);
    stop_workers(l);
    return kiln_fail(code, "%s", l->failed_message ? l->failed_message : "loader: unknown error (and out of memory)");
  }
  for (int k = 0; k < l->ntensors; k++) {
    out[k] = s->out[k];
    s->out[k] = NULL;
  }
  clear_slot(s);
  l->consumed++;
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->lock);
  return KILN_OK;
}

KILN_API int kiln_loader_next(struct kiln_loader *l, struct kiln_tensor **batch_x, struct kiln_tensor **batch_y) {
  struct kiln_tensor *out[KILN_LOADER_MAX_TENSORS];
  if (batch_x) *batch_x = NULL;
  if (batch_y) *batch_y = NULL;
  if (!batch_x) return kiln_fail(KILN_ERR_ARGUMENT, "loader: next: batch_x is missing (NULL)");
  int rc = kiln_loader_next_all(l, KILN_LOADER_MAX_TENSORS, out);
  if (rc) return rc;
  *batch_x = out[0];
  if (batch_y) *batch_y = out[1];
  else kiln_tensor_release(out[1]);
  for (int k = 2; k < KILN_LOADER_MAX_TENSORS; k++) kiln_tensor_release(out[k]);
  return KILN_OK;
}
