/* test_loader.c: the data loader's ring and ordering (every worker count and ring size gives the
   batches of the order, in order; early stops, skips, sampler orders, freeing mid-epoch), the
   per-sample random stream and the epoch permutation, transforms through the loader against
   kiln_transforms_apply, image folders (scan, labels, pixels) and bad files surfacing at the batch
   that needs them, and a brief byte-flipping pass over the image reader. Runs under ASan/UBSan. */
#define _GNU_SOURCE
#include "check.h"
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

/* The first element of t (the public header is enough). */
static void *kiln_tensor_data(const struct kiln_tensor *t) {
  return (char *)t->storage->data + t->offset * kiln_dtype_size(t->dtype);
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) { fprintf(stderr, "cannot write %s\n", path); return; }
  fwrite(data, 1, n, f);
  fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
  *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  *n = 0;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *p = malloc((size_t)len + 1);
  *n = fread(p, 1, (size_t)len, f);
  fclose(f);
  return p;
}

/* ---- the permutation and the per-sample stream ---- */

static void test_permutation(void) {
  int64_t p[10];
  CHECK(kiln_permutation_fill(p, 10, 1, 0) == 0);
  /* kiln.data.permutation(10, {seed = 1}) is {7, 9, 10, 1, 8, 5, 6, 4, 2, 3} (from 1) */
  const int64_t want[10] = {6, 8, 9, 0, 7, 4, 5, 3, 1, 2};
  CHECK(memcmp(p, want, sizeof want) == 0);
  for (int64_t n = 0; n < 300; n += 7) {
    int64_t *q = malloc(sizeof(int64_t) * (size_t)(n + 1));
    char *seen = calloc((size_t)n + 1, 1);
    int ok = kiln_permutation_fill(q, n, -12345 + n, n % 5) == 0;
    for (int64_t i = 0; i < n && ok; i++) {
      if (q[i] < 0 || q[i] >= n || seen[q[i]]) ok = 0;
      else seen[q[i]] = 1;
    }
    CHECK(ok);
    free(q);
    free(seen);
  }
  int64_t a[50], b[50];
  kiln_permutation_fill(a, 50, 7, 1);
  kiln_permutation_fill(b, 50, 7, 2);
  CHECK(memcmp(a, b, sizeof a) != 0);
  kiln_permutation_fill(b, 50, 7, 1);
  CHECK(memcmp(a, b, sizeof a) == 0);
  CHECK_ERR(kiln_permutation_fill(a, -1, 0, 0), "n is -1");
}

static void test_sample_stream(void) {
  uint32_t r1[4], r2[4];
  kiln_sample_philox(3, 1, 17, 2, r1);
  kiln_sample_philox(3, 1, 17, 2, r2);
  CHECK(memcmp(r1, r2, sizeof r1) == 0);
  /* each coordinate of the key changes the block */
  const int64_t variants[4][4] = {{4, 1, 17, 2}, {3, 2, 17, 2}, {3, 1, 18, 2}, {3, 1, 17, 3}};
  for (int v = 0; v < 4; v++) {
    kiln_sample_philox(variants[v][0], variants[v][1], variants[v][2], (uint32_t)variants[v][3], r2);
    CHECK(memcmp(r1, r2, sizeof r1) != 0);
  }
  /* seed 1 epoch 2 and seed 2 epoch 1 are different streams */
  kiln_sample_philox(1, 2, 0, 0, r1);
  kiln_sample_philox(2, 1, 0, 0, r2);
  CHECK(memcmp(r1, r2, sizeof r1) != 0);
  /* uniform words: the mean of 4 x 20000 words / 2^32 is near 1/2, and no two blocks collide */
  double sum = 0;
  int collisions = 0;
  uint32_t prev = 0;
  for (int64_t i = 0; i < 20000; i++) {
    uint32_t r[4];
    kiln_sample_philox(42, 0, i, 0, r);
    for (int k = 0; k < 4; k++) sum += r[k] * 0x1p-32;
    if (i && r[0] == prev) collisions++;
    prev = r[0];
  }
  CHECK_NEAR(sum / 80000, 0.5, 0.005);
  CHECK(collisions == 0);
}

/* ---- the ring and the order ---- */

enum { N = 103, COLS = 5 };

static struct kiln_dataset *rows_dataset(void) {
  double xv[N * COLS], yv[N];
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < COLS; j++) xv[i * COLS + j] = i * 10 + j;
    yv[i] = i;
  }
  int64_t xs[2] = {N, COLS}, ys[1] = {N};
  struct kiln_tensor *t[2] = {T(2, xs, xv, KILN_F32), T(1, ys, yv, KILN_I64)};
  struct kiln_dataset *d = kiln_dataset_tensors(2, t);
  kiln_tensor_release(t[0]);
  kiln_tensor_release(t[1]);
  return d;
}

/* Reads the rest of the epoch; each batch must hold the rows order[pos...] (x row i is i*10+j, y is i).
   Returns the number of batches read, or -1 on a mismatch. */
static int64_t drain(struct kiln_loader *l, const int64_t *order, int64_t n, int64_t bs, int drop_last, int64_t first) {
  int64_t pos = first * bs < n ? first * bs : n, batches = 0;
  for (;;) {
    struct kiln_tensor *x = NULL, *y = NULL;
    if (kiln_loader_next(l, &x, &y)) {
      fprintf(stderr, "next: %s\n", kiln_error_message());
      return -1;
    }
    if (!x) { if (y) return -1; break; }
    int64_t B = x->sizes[0];
    int ok = y && y->sizes[0] == B && x->sizes[1] == COLS && B <= bs && B > 0 && (B == bs || (!drop_last && pos + B == n));
    const float *xp = kiln_tensor_data(x);
    const int64_t *yp = ok ? kiln_tensor_data(y) : NULL;
    for (int64_t b = 0; b < B && ok; b++) {
      int64_t i = order[pos + b];
      if (yp[b] != i) ok = 0;
      for (int j = 0; j < COLS && ok; j++)
        if (xp[b * COLS + j] != (float)(i * 10 + j)) ok = 0;
    }
    kiln_tensor_release(x);
    kiln_tensor_release(y);
    if (!ok) return -1;
    pos += B;
    batches++;
  }
  int64_t expect = drop_last ? n / bs : (n + bs - 1) / bs;
  return batches == expect - first && (drop_last ? pos == (n / bs) * bs : pos == n) ? batches : -1;
}

static void test_order_every_ring(void) {
  struct kiln_dataset *d = rows_dataset();
  CHECK(d && kiln_dataset_len(d) == N && kiln_dataset_num_tensors(d) == 2);
  const int64_t sizes[] = {1, 7, 103, 200};
  const int workers[] = {0, 1, 2, 3, 5};
  const int prefetches[] = {1, 2, 4, 7};
  int bad = 0, runs = 0;
  for (size_t a = 0; a < 4; a++)
    for (int drop = 0; drop <= 1; drop++)
      for (size_t w = 0; w < 5; w++)
        for (size_t p = 0; p < 4; p++) {
          int shuffle = (int)((a + w + p) % 2);
          struct kiln_loader *l = kiln_loader_new(d, sizes[a], shuffle, drop, workers[w], prefetches[p], 99);
          if (!l) { bad++; continue; }
          for (int64_t epoch = 0; epoch < 2; epoch++) {
            int64_t order[N];
            if (shuffle) kiln_permutation_fill(order, N, 99, epoch);
            else for (int i = 0; i < N; i++) order[i] = i;
            if (kiln_loader_start_epoch(l, epoch, NULL, 0)) { bad++; continue; }
            if (drain(l, order, N, sizes[a], drop, 0) < 0) {
              bad++;
              fprintf(stderr, "batch %lld drop %d workers %d prefetch %d epoch %lld: wrong batches\n",
                      (long long)sizes[a], drop, workers[w], prefetches[p], (long long)epoch);
            }
            runs++;
            /* after the end, next keeps saying so */
            struct kiln_tensor *x = (void *)1, *y = (void *)1;
            if (kiln_loader_next(l, &x, &y) || x || y) bad++;
          }
          kiln_loader_free(l);
        }
  CHECK(bad == 0);
  CHECK(runs == 4 * 2 * 5 * 4 * 2);
  kiln_dataset_release(d);
}

static void test_stops_skips_and_orders(void) {
  struct kiln_dataset *d = rows_dataset();
  int64_t perm[N];
  kiln_permutation_fill(perm, N, 5, 3);
  for (int workers = 0; workers <= 3; workers++) {
    struct kiln_loader *l = kiln_loader_new(d, 8, 1, 0, workers, 3, 5);
    CHECK(l != NULL);
    if (!l) continue;
    /* next before any epoch */
    struct kiln_tensor *x = NULL, *y = NULL;
    CHECK_ERR(kiln_loader_next(l, &x, &y), "no epoch is running");
    /* two batches, then another epoch abandons the rest */
    CHECK(kiln_loader_start_epoch(l, 1, NULL, 0) == 0);
    for (int i = 0; i < 2; i++) {
      CHECK(kiln_loader_next(l, &x, &y) == 0 && x);
      kiln_tensor_release(x);
      kiln_tensor_release(y);
    }
    CHECK(kiln_loader_position(l) == 2);
    CHECK(kiln_loader_start_epoch(l, 3, NULL, 0) == 0);
    CHECK(kiln_loader_num_batches(l) == 13);
    CHECK(drain(l, perm, N, 8, 0, 0) == 13);
    /* skipping: the tail of the same epoch */
    CHECK(kiln_loader_start_epoch_at(l, 3, NULL, 0, 9) == 0);
    CHECK(drain(l, perm, N, 8, 0, 9) == 4);
    CHECK(kiln_loader_start_epoch_at(l, 3, NULL, 0, 13) == 0);
    CHECK(drain(l, perm, N, 8, 0, 13) == 0);
    CHECK_ERR(kiln_loader_start_epoch_at(l, 3, NULL, 0, 14), "first batch 14 for an epoch of 13 batches");
    /* a sampler's order: a subset with repeats, in its own order */
    int64_t order[20];
    for (int i = 0; i < 20; i++) order[i] = (i * 37) % 11;
    CHECK(kiln_loader_start_epoch(l, 0, order, 20) == 0);
    CHECK(drain(l, order, 20, 8, 0, 0) == 3);
    CHECK(kiln_loader_start_epoch(l, 0, order, 0) == 0);
    CHECK(drain(l, order, 0, 8, 0, 0) == 0);
    order[7] = N;
    CHECK_ERR(kiln_loader_start_epoch(l, 0, order, 20), "entry 7 is 103, out of range for a dataset of 103");
    /* and the loader still works */
    CHECK(kiln_loader_start_epoch(l, 3, NULL, 0) == 0);
    CHECK(drain(l, perm, N, 8, 0, 0) == 13);
    CHECK(kiln_loader_wait_seconds(l) >= 0);
    /* freed mid-epoch, with the ring full and workers asleep */
    CHECK(kiln_loader_start_epoch(l, 4, NULL, 0) == 0);
    CHECK(kiln_loader_next(l, &x, &y) == 0 && x);
    kiln_tensor_release(x);
    kiln_tensor_release(y);
    usleep(2000);
    kiln_loader_free(l);
  }
  /* freed before any epoch, and right after starting one */
  kiln_loader_free(kiln_loader_new(d, 4, 0, 0, 3, 2, 0));
  struct kiln_loader *l = kiln_loader_new(d, 1, 1, 0, 4, 64, 0);
  CHECK(l && kiln_loader_start_epoch(l, 0, NULL, 0) == 0);
  kiln_loader_free(l);
  kiln_loader_free(NULL);
  /* bad arguments */
  CHECK(kiln_loader_new(d, 0, 0, 0, 1, 1, 0) == NULL && strstr(kiln_error_message(), "batch_size is 0"));
  CHECK(kiln_loader_new(d, 1, 0, 0, -1, 1, 0) == NULL && strstr(kiln_error_message(), "-1 workers"));
  CHECK(kiln_loader_new(d, 1, 0, 0, 1, 0, 0) == NULL && strstr(kiln_error_message(), "prefetch is 0"));
  CHECK(kiln_loader_new(NULL, 1, 0, 0, 1, 1, 0) == NULL);
  kiln_dataset_release(d);
}

/* Many short lives: start, read a few, restart or free; races and leaks show under the sanitizers. */
static void test_churn(void) {
  struct kiln_dataset *d = rows_dataset();
  int bad = 0;
  for (int round = 0; round < 200; round++) {
    int workers = round % 4, bs = 1 + round % 9;
    struct kiln_loader *l = kiln_loader_new(d, bs, 1, round % 3 == 0, workers, 1 + round % 5, round);
    if (!l) { bad++; continue; }
    for (int e = 0; e < 3; e++) {
      if (kiln_loader_start_epoch(l, e, NULL, 0)) bad++;
      for (int k = 0; k < (round * 7 + e) % 6; k++) {
        struct kiln_tensor *x = NULL, *y = NULL;
        if (kiln_loader_next(l, &x, &y)) bad++;
        kiln_tensor_release(x);
        kiln_tensor_release(y);
      }
    }
    kiln_loader_free(l);
  }
  CHECK(bad == 0);
  kiln_dataset_release(d);
}

/* ---- transforms through the loader ---- */

static void test_transforms_every_worker_count(void) {
  enum { M = 37, H = 9, W = 7 };
  double v[M * 2 * H * W], lab[M];
  for (int i = 0; i < M * 2 * H * W; i++) v[i] = (double)((i * 2654435761u) % 256);
  for (int i = 0; i < M; i++) lab[i] = i;
  int64_t xs[4] = {M, 2, H, W}, ys[1] = {M};
  struct kiln_tensor *t[2] = {T(4, xs, v, KILN_U8), T(1, ys, lab, KILN_I64)};
  struct kiln_dataset *d = kiln_dataset_tensors(2, t);
  struct kiln_transforms *tf = kiln_transforms_new();
  double mean[2] = {100, 120}, sd[2] = {50, 60};
  CHECK(kiln_transforms_random_crop(tf, 8, 8, 2, 0.5) == 0);
  CHECK(kiln_transforms_hflip(tf, 0.5) == 0);
  CHECK(kiln_transforms_vflip(tf, 0.3) == 0);
  CHECK(kiln_transforms_random_affine(tf, 20, 0.1, 0.2, 0) == 0);
  CHECK(kiln_transforms_resize(tf, 5, 6) == 0);
  CHECK(kiln_transforms_normalize(tf, 2, mean, sd) == 0);
  CHECK(kiln_transforms_count(tf) == 6);
  float *first = NULL;
  size_t bytes = 0;
  int same = 1, applied = 1;
  for (int workers = 0; workers <= 3; workers++) {
    struct kiln_loader *l = kiln_loader_new(d, 6, 1, 0, workers, 2, 11);
    CHECK(l && kiln_loader_set_transforms(l, tf) == 0);
    if (!l) continue;
    CHECK(kiln_loader_start_epoch(l, 2, NULL, 0) == 0);
    float *all = malloc(sizeof(float) * M * 2 * 5 * 6);
    int64_t got = 0;
    for (;;) {
      struct kiln_tensor *x = NULL, *y = NULL;
      if (kiln_loader_next(l, &x, &y) || !x) break;
      CHECK(x->dtype == KILN_F32 && x->ndim == 4 && x->sizes[1] == 2 && x->sizes[2] == 5 && x->sizes[3] == 6);
      memcpy(all + got * 60, kiln_tensor_data(x), sizeof(float) * 60 * (size_t)x->sizes[0]);
      /* each sample is what kiln_transforms_apply makes of it */
      const int64_t *yp = kiln_tensor_data(y);
      for (int64_t b = 0; b < x->sizes[0] && workers == 2; b++) {
        struct kiln_tensor *img = kiln_select(t[0], 0, yp[b]);
        struct kiln_tensor *one = kiln_transforms_apply(tf, img, 11, 2, yp[b]);
        if (!one || memcmp(kiln_tensor_data(one), (float *)kiln_tensor_data(x) + b * 60, sizeof(float) * 60)) applied = 0;
        kiln_tensor_release(one);
        kiln_tensor_release(img);
      }
      got += x->sizes[0];
      kiln_tensor_release(x);
      kiln_tensor_release(y);
    }
    CHECK(got == M);
    if (!first) { first = all; bytes = sizeof(float) * M * 60; }
    else { if (memcmp(first, all, bytes)) same = 0; free(all); }
    kiln_loader_free(l);
  }
  CHECK(same);
  CHECK(applied);
  free(first);
  /* transforms need image rows */
  int64_t fs[2] = {M, 3};
  double fv[M * 3] = {0};
  struct kiln_tensor *flat = T(2, fs, fv, KILN_F32);
  struct kiln_dataset *fd = kiln_dataset_tensors(1, &flat);
  struct kiln_loader *l = kiln_loader_new(fd, 4, 0, 0, 1, 2, 0);
  CHECK_ERR(kiln_loader_set_transforms(l, tf), "transforms take samples that are images");
  kiln_loader_free(l);
  kiln_dataset_release(fd);
  kiln_tensor_release(flat);
  /* a crop larger than the padded image fails at the batch, naming the sample */
  struct kiln_transforms *big = kiln_transforms_new();
  CHECK(kiln_transforms_random_crop(big, 20, 20, 1, 0) == 0);
  l = kiln_loader_new(d, 4, 0, 0, 2, 2, 0);
  CHECK(kiln_loader_set_transforms(l, big) == 0);
  CHECK(kiln_loader_start_epoch(l, 0, NULL, 0) == 0);
  struct kiln_tensor *x = NULL, *y = NULL;
  CHECK_ERR(kiln_loader_next(l, &x, &y), "sample 0 (from 0) of batch 0 (from 0), epoch 0: random_crop: the image [2,9,7] padded by 1");
  kiln_loader_free(l);
  kiln_transforms_free(big);
  CHECK_ERR(kiln_transforms_normalize(tf, 0, mean, sd), "0 means and stds");
  CHECK_ERR(kiln_transforms_hflip(tf, 1.5), "p is 1.5");
  kiln_transforms_free(tf);
  kiln_dataset_release(d);
  kiln_tensor_release(t[0]);
  kiln_tensor_release(t[1]);
}

/* ---- image folders ---- */

static void write_png(const char *path, int c, int h, int w, int seed) {
  double v[4 * 16 * 16];
  for (int i = 0; i < c * h * w; i++) v[i] = (double)((i * 37 + seed * 101) % 256);
  int64_t s[3] = {c, h, w};
  struct kiln_tensor *t = T(3, s, v, KILN_U8);
  if (kiln_image_write_png(path, t)) fprintf(stderr, "write_png: %s\n", kiln_error_message());
  kiln_tensor_release(t);
}

static void test_image_folder(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/folder", tmpdir);
  mkdir(path, 0755);
  const char *classes[3] = {"cat", "ant", "bee"};
  for (int k = 0; k < 3; k++) {
    snprintf(path, sizeof path, "%s/folder/%s", tmpdir, classes[k]);
    mkdir(path, 0755);
    for (int i = 0; i < 4; i++) {
      snprintf(path, sizeof path, "%s/folder/%s/%c.png", tmpdir, classes[k], 'd' - i);
      write_png(path, 3, 6, 5, k * 10 + i);
    }
  }
  snprintf(path, sizeof path, "%s/folder/ant/notes.txt", tmpdir);
  write_bytes(path, "not an image", 12);
  snprintf(path, sizeof path, "%s/folder", tmpdir);
  struct kiln_dataset *d = kiln_dataset_image_folder(path, 3);
  CHECK(d != NULL);
  if (!d) return;
  CHECK(kiln_dataset_len(d) == 12 && kiln_dataset_num_classes(d) == 3 && kiln_dataset_num_tensors(d) == 2);
  CHECK(!strcmp(kiln_dataset_class_name(d, 0), "ant") && !strcmp(kiln_dataset_class_name(d, 2), "cat"));
  CHECK(kiln_dataset_label(d, 0) == 0 && kiln_dataset_label(d, 4) == 1 && kiln_dataset_label(d, 11) == 2);
  CHECK(strstr(kiln_dataset_file(d, 0), "/folder/ant/a.png") && strstr(kiln_dataset_file(d, 5), "/folder/bee/b.png"));
  CHECK(kiln_dataset_file(d, 12) == NULL && kiln_dataset_label(d, -1) == -1);
  /* pixels come out scaled to [0, 1], planar */
  struct kiln_tensor *out[2];
  CHECK(kiln_dataset_get(d, 5, NULL, 0, 0, 2, out) == 0);
  double *px = V(out[0]);
  CHECK_SIZES(out[0], 3, 6, 5);
  int ok = 1;
  for (int i = 0; i < 90; i++)  /* bee/b.png: seed 2 * 10 + 2 */
    if (fabs(px[i] - ((i * 37 + 22 * 101) % 256) / 255.0) > 1e-7) ok = 0;
  CHECK(ok);
  free(px);
  kiln_tensor_release(out[0]);
  kiln_tensor_release(out[1]);
  /* a corrupt file surfaces at the batch that needs it (and at every next call after), naming it */
  snprintf(path, sizeof path, "%s/folder/bee/c.png", tmpdir);
  write_bytes(path, "\x89PNG\r\n\x1a\n garbage garbage garbage garbage", 40);
  for (int workers = 0; workers <= 3; workers++) {
    struct kiln_loader *l = kiln_loader_new(d, 2, 0, 0, workers, 3, 0);
    CHECK(l && kiln_loader_start_epoch(l, 0, NULL, 0) == 0);
    if (!l) continue;
    struct kiln_tensor *x, *y;
    for (int b = 0; b < 3; b++) {   /* samples 0..5 are fine */
      CHECK(kiln_loader_next(l, &x, &y) == 0 && x && y);
      CHECK_SIZES(x, 2, 3, 6, 5);
      kiln_tensor_release(x);
      kiln_tensor_release(y);
    }
    CHECK_ERR(kiln_loader_next(l, &x, &y), "bee/c.png: corrupt PNG");
    CHECK_ERR(kiln_loader_next(l, &x, &y), "sample 6 (from 0;");
    /* an order that avoids it works */
    int64_t order[4] = {0, 11, 7, 3};
    CHECK(kiln_loader_start_epoch(l, 0, order, 4) == 0);
    CHECK(kiln_loader_next(l, &x, &y) == 0 && x);
    kiln_tensor_release(x);
    kiln_tensor_release(y);
    kiln_loader_free(l);
  }
  /* a class folder without images */
  snprintf(path, sizeof path, "%s/folder/dog", tmpdir);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/folder", tmpdir);
  CHECK(kiln_dataset_image_folder(path, 3) == NULL && strstr(kiln_error_message(), "folder/dog holds no images"));
  snprintf(path, sizeof path, "%s/folder/nothing", tmpdir);
  CHECK(kiln_dataset_image_folder(path, 3) == NULL && strstr(kiln_error_message(), "folder/nothing: No such file"));
  kiln_dataset_release(d);
}

/* An 8x8 JPEG of one colour, (200, 100, 50), written by stb_image_write at quality 75. */
static const char jpeg_hex[] =
    "ffd8ffe000104a46494600010100000100010000ffdb008400080606070605080707070909080a0c140d0c0b0b0c1912130f"
    "141d1a1f1e1d1a1c1c20242e2720222c231c1c2837292c30313434341f27393d38323c2e333432010909090c0b0c180d0d18"
    "32211c2132323232323232323232323232323232323232323232323232323232323232323232323232323232323232323232"
    "32323232ffc00011080008000803012200021101031101ffc401a20000010501010101010100000000000000000102030405"
    "060708090a0b100002010303020403050504040000017d01020300041105122131410613516107227114328191a1082342b1"
    "c11552d1f02433627282090a161718191a25262728292a3435363738393a434445464748494a535455565758595a63646566"
    "6768696a737475767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4"
    "c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9fa010003010101010101010101000000"
    "0000000102030405060708090a0b110002010204040304070504040001027700010203110405213106124151076171132232"
    "8108144291a1b1c109233352f0156272d10a162434e125f11718191a262728292a35363738393a434445464748494a535455"
    "565758595a636465666768696a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3"
    "b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c030100"
    "02110311003f008e8a28af9a3ec0ffd9";

static unsigned char *jpeg_fixture(size_t *n) {
  size_t len = strlen(jpeg_hex) / 2;
  unsigned char *p = malloc(len);
  for (size_t i = 0; i < len; i++) {
    unsigned v;
    sscanf(jpeg_hex + 2 * i, "%2x", &v);
    p[i] = (unsigned char)v;
  }
  *n = len;
  return p;
}

/* Flipped bytes in valid files: every result is an image or an error naming the file. */
static void test_flipped_bytes(void) {
  char png[512], jpg[512], bad[512];
  snprintf(png, sizeof png, "%s/f.png", tmpdir);
  snprintf(jpg, sizeof jpg, "%s/f.jpg", tmpdir);
  snprintf(bad, sizeof bad, "%s/flipped", tmpdir);
  write_png(png, 3, 16, 16, 1);
  size_t jn;
  unsigned char *jb = jpeg_fixture(&jn);
  write_bytes(jpg, jb, jn);
  free(jb);
  struct kiln_tensor *img = kiln_image_read(jpg, 3);
  double *px = V(img);
  CHECK_SIZES(img, 3, 8, 8);
  CHECK(px[0] == 200 && px[64] == 100 && px[191] == 50);
  free(px);
  kiln_tensor_release(img);
  const char *files[2] = {png, jpg};
  int bad_results = 0, decoded = 0;
  for (int f = 0; f < 2; f++) {
    size_t n;
    unsigned char *orig = read_bytes(files[f], &n);
    unsigned char *buf = malloc(n);
    for (int round = 0; round < 300; round++) {
      memcpy(buf, orig, n);
      for (int k = 0; k < 1 + round % 4; k++) {
        uint64_t h = (uint64_t)(hashval((uint64_t)(round * 8 + k + f * 10000)) * 1e9 + 1e9);
        buf[h % n] ^= (unsigned char)(1 + (h >> 20) % 255);
      }
      write_bytes(bad, buf, round % 7 == 0 ? n / 2 : n);
      kiln_error_clear();
      img = kiln_image_read(bad, round % 5);
      if (img) { decoded++; kiln_tensor_release(img); }
      else if (!strstr(kiln_error_message(), "flipped")) bad_results++;
    }
    free(orig);
    free(buf);
  }
  CHECK(bad_results == 0);
  CHECK(decoded < 600);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln-test-loader-XXXXXX");
  if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
  test_permutation();
  test_sample_stream();
  test_order_every_ring();
  test_stops_skips_and_orders();
  test_churn();
  test_transforms_every_worker_count();
  test_image_folder();
  test_flipped_bytes();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  return check_done("test_loader");
}
