/* transforms.c: the per-sample pipeline (resize, crops, flips, random affine, normalise) on planar
   f32 images, the counter-based random stream each sample draws from, and the epoch's order. A transform reads the
   current buffer of a kiln_scratch and writes the other (or works in place); the random ones take
   one Philox block of (seed, epoch, sample index, position in the pipeline) and nothing else. */
#include "data.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the per-sample random stream ---- */

static uint64_t mix64(uint64_t z) {   /* splitmix64's finaliser */
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static const uint64_t GOLDEN = 0x9E3779B97F4A7C15ull;

uint64_t kiln_sample_key(int64_t seed, int64_t epoch) {
  /* the permutation's stream state of (seed, epoch) (see kiln_permutation_fill), moved to a stream
     of its own by a constant so that the order and the augmentations do not share draws */
  uint64_t s = mix64((uint64_t)seed + GOLDEN) + mix64((uint64_t)epoch * 0xBF58476D1CE4E5B9ull + GOLDEN);
  return mix64(s ^ 0xD1B54A32D192ED03ull);
}

KILN_API void kiln_sample_philox(int64_t seed, int64_t epoch, int64_t index, uint32_t step, uint32_t *out4) {
  if (!out4) return;
  kiln_philox(((uint64_t)index << 8) | (step & 0xFF), kiln_sample_key(seed, epoch), out4);
}

/* Fisher-Yates driven by splitmix64, exactly as kiln.data's Lua code did it: state
   mix(seed + G) + mix(epoch * M1 + G); for i = n-1 .. 1: state += G, u = (mix(state) >> 11) * 2^-53,
   j = floor(u * (i + 1)). (seed, epoch) is hashed, not added, so that seed 1 epoch 2 and seed 2
   epoch 1 differ. The arithmetic is the same in C and LuaJIT (u64 wrap-around, doubles). */
KILN_API int kiln_permutation_fill(int64_t *out, int64_t n, int64_t seed, int64_t epoch) {
  if (n < 0) return kiln_fail(KILN_ERR_ARGUMENT, "permutation: n is %lld (expected >= 0)", (long long)n);
  if (n > ((int64_t)1 << 53)) return kiln_fail(KILN_ERR_ARGUMENT, "permutation: n is %lld (at most 2^53)", (long long)n);
  if (n > 0 && !out) return kiln_fail(KILN_ERR_ARGUMENT, "permutation: the output is missing (NULL)");
  for (int64_t i = 0; i < n; i++) out[i] = i;
  uint64_t s = mix64((uint64_t)seed + GOLDEN) + mix64((uint64_t)epoch * 0xBF58476D1CE4E5B9ull + GOLDEN);
  for (int64_t i = n - 1; i >= 1; i--) {
    s += GOLDEN;
    double u = (double)(mix64(s) >> 11) * 0x1p-53;
    int64_t j = (int64_t)floor(u * (double)(i + 1));
    int64_t t = out[i];
    out[i] = out[j];
    out[j] = t;
  }
  return KILN_OK;
}

static double unit32(uint32_t r) { return (double)r * 0x1p-32; }   /* [0, 1) */

/* ---- scratch ---- */

static float *ensure(struct kiln_scratch *s, int which, size_t n) {
  if (n == 0) n = 1;
  if (s->cap[which] < n) {
    size_t cap = s->cap[which] ? s->cap[which] : 1024;
    while (cap < n) cap *= 2;
    float *p = realloc(s->buf[which], cap * sizeof(float));
    if (!p) return NULL;
    s->buf[which] = p;
    s->cap[which] = cap;
  }
  return s->buf[which];
}

float *kiln_scratch_current(struct kiln_scratch *s, size_t n) { return ensure(s, s->cur, n); }

void kiln_scratch_free(struct kiln_scratch *s) {
  free(s->buf[0]);
  free(s->buf[1]);
  memset(s, 0, sizeof *s);
}

/* The other buffer with room for n floats, or NULL with an error. */
static float *other(struct kiln_scratch *s, size_t n, const char *op) {
  float *p = ensure(s, 1 - s->cur, n);
  if (!p) kiln_fail(KILN_ERR_MEMORY, "%s: out of memory for a %zu-float image", op, n);
  return p;
}

/* ---- the transforms ---- */

/* PyTorch's bilinear source index (align_corners=False): negative positions clamp to 0. */
static void bilinear_taps(int64_t in, int64_t out, int64_t *i0, int64_t *i1, float *l1) {
  double scale = (double)in / (double)out;
  for (int64_t o = 0; o < out; o++) {
    double src = scale * ((double)o + 0.5) - 0.5;
    if (src < 0) src = 0;
    int64_t a = (int64_t)src;
    if (a > in - 1) a = in - 1;
    i0[o] = a;
    i1[o] = a < in - 1 ? a + 1 : a;
    l1[o] = (float)(src - (double)a);
  }
}

static int resize(struct kiln_scratch *s, struct kiln_fimage *img, int64_t oh, int64_t ow) {
  if (ow == 0) {   /* the shorter side becomes oh */
    int64_t size = oh;
    if (img->h <= img->w) { oh = size; ow = (int64_t)((double)size * (double)img->w / (double)img->h); }
    else { ow = size; oh = (int64_t)((double)size * (double)img->h / (double)img->w); }
    if (oh < 1) oh = 1;
    if (ow < 1) ow = 1;
  }
  if (oh == img->h && ow == img->w) return KILN_OK;
  float *dst = other(s, (size_t)(img->c * oh * ow), "resize");
  int64_t *taps = malloc(sizeof(int64_t) * 2 * (size_t)(oh + ow));
  float *w8 = malloc(sizeof(float) * (size_t)(oh + ow));
  if (!dst || !taps || !w8) {
    free(taps);
    free(w8);
    return dst ? kiln_fail(KILN_ERR_MEMORY, "resize: out of memory") : kiln_error_code();
  }
  int64_t *y0 = taps, *y1 = taps + oh, *x0 = taps + 2 * oh, *x1 = taps + 2 * oh + ow;
  float *ly = w8, *lx = w8 + oh;
  bilinear_taps(img->h, oh, y0, y1, ly);
  bilinear_taps(img->w, ow, x0, x1, lx);
  for (int64_t ch = 0; ch < img->c; ch++) {
    const float *src = img->data + ch * img->h * img->w;
    float *out = dst + ch * oh * ow;
    for (int64_t y = 0; y < oh; y++) {
      const float *r0 = src + y0[y] * img->w, *r1 = src + y1[y] * img->w;
      float b = ly[y], a = 1.0f - b;
      for (int64_t x = 0; x < ow; x++) {
        float d = lx[x], c = 1.0f - d;
        out[y * ow + x] = a * (c * r0[x0[x]] + d * r0[x1[x]]) + b * (c * r1[x0[x]] + d * r1[x1[x]]);
      }
    }
  }
  free(taps);
  free(w8);
  s->cur = 1 - s->cur;
  img->data = dst;
  img->h = oh;
  img->w = ow;
  return KILN_OK;
}

/* out(y, x) = in(y + top, x + left), fill outside the image. */
static int crop(struct kiln_scratch *s, struct kiln_fimage *img, int64_t oh, int64_t ow, int64_t top, int64_t left,
                float fill, const char *op) {
  if (oh == img->h && ow == img->w && top == 0 && left == 0) return KILN_OK;
  float *dst = other(s, (size_t)(img->c * oh * ow), op);
  if (!dst) return kiln_error_code();
  for (int64_t ch = 0; ch < img->c; ch++) {
    const float *src = img->data + ch * img->h * img->w;
    float *out = dst + ch * oh * ow;
    for (int64_t y = 0; y < oh; y++) {
      int64_t sy = y + top;
      float *row = out + y * ow;
      if (sy < 0 || sy >= img->h) {
        for (int64_t x = 0; x < ow; x++) row[x] = fill;
        continue;
      }
      /* the columns [a, b) come from the image */
      int64_t a = left < 0 ? -left : 0, b = img->w - left < ow ? img->w - left : ow;
      if (b < a) b = a;
      for (int64_t x = 0; x < a && x < ow; x++) row[x] = fill;
      if (b > a) memcpy(row + a, src + sy * img->w + a + left, sizeof(float) * (size_t)(b - a));
      for (int64_t x = b; x < ow; x++) row[x] = fill;
    }
  }
  s->cur = 1 - s->cur;
  img->data = dst;
  img->h = oh;
  img->w = ow;
  return KILN_OK;
}

/* Python's round(): halves to even. */
static int64_t half_even_div2(int64_t d) {
  int64_t q = d >= 0 ? d / 2 : -((-d + 1) / 2);
  if (d % 2 != 0 && (q % 2 != 0)) q += 1;
  return q;
}

static int center_crop(struct kiln_scratch *s, struct kiln_fimage *img, int64_t oh, int64_t ow) {
  /* torchvision: int(round((H - h) / 2)) when the image is larger; padded by (h - H) // 2 above when smaller */
  int64_t top = img->h >= oh ? half_even_div2(img->h - oh) : -((oh - img->h) / 2);
  int64_t left = img->w >= ow ? half_even_div2(img->w - ow) : -((ow - img->w) / 2);
  return crop(s, img, oh, ow, top, left, 0.0f, "center_crop");
}

static int random_crop(struct kiln_scratch *s, struct kiln_fimage *img, const struct kiln_transform *t,
                       const uint32_t r[4]) {
  int64_t ph = img->h + 2 * t->pad, pw = img->w + 2 * t->pad;
  if (ph < t->h || pw < t->w)
    return kiln_fail(KILN_ERR_SHAPE, "random_crop: the image [%lld,%lld,%lld] padded by %lld is %lld x %lld, smaller "
                     "than the %lld x %lld crop", (long long)img->c, (long long)img->h, (long long)img->w,
                     (long long)t->pad, (long long)ph, (long long)pw, (long long)t->h, (long long)t->w);
  uint64_t a = (uint64_t)r[0] << 32 | r[1], b = (uint64_t)r[2] << 32 | r[3];
  int64_t top = (int64_t)(a % (uint64_t)(ph - t->h + 1)), left = (int64_t)(b % (uint64_t)(pw - t->w + 1));
  return crop(s, img, t->h, t->w, top - t->pad, left - t->pad, (float)t->fill, "random_crop");
}

static void hflip(struct kiln_fimage *img) {
  for (int64_t row = 0; row < img->c * img->h; row++) {
    float *p = img->data + row * img->w;
    for (int64_t x = 0, y = img->w - 1; x < y; x++, y--) {
      float t = p[x];
      p[x] = p[y];
      p[y] = t;
    }
  }
}

static void vflip(struct kiln_fimage *img) {
  for (int64_t ch = 0; ch < img->c; ch++) {
    float *plane = img->data + ch * img->h * img->w;
    for (int64_t a = 0, b = img->h - 1; a < b; a++, b--) {
      float *ra = plane + a * img->w, *rb = plane + b * img->w;
      for (int64_t x = 0; x < img->w; x++) {
        float t = ra[x];
        ra[x] = rb[x];
        rb[x] = t;
      }
    }
  }
}

/* Output pixel (x, y) samples the input at centre + R(-angle) (p - centre - t), bilinearly; taps
   outside the image read fill. The centre is ((W-1)/2, (H-1)/2) in pixel indices. */
static int random_affine(struct kiln_scratch *s, struct kiln_fimage *img, const struct kiln_transform *t,
                         const uint32_t r[4]) {
  double angle = t->degrees * (2.0 * unit32(r[0]) - 1.0);
  double max_dx = t->tx * (double)img->w, max_dy = t->ty * (double)img->h;
  double tx = nearbyint(max_dx * (2.0 * unit32(r[1]) - 1.0)), ty = nearbyint(max_dy * (2.0 * unit32(r[2]) - 1.0));
  if (angle == 0 && tx == 0 && ty == 0) return KILN_OK;
  float *dst = other(s, (size_t)(img->c * img->h * img->w), "random_affine");
  if (!dst) return kiln_error_code();
  double th = angle * M_PI / 180.0, cs = cos(th), sn = sin(th);
  double cx = (double)(img->w - 1) * 0.5, cy = (double)(img->h - 1) * 0.5;
  float fill = (float)t->fill;
  int64_t H = img->h, W = img->w, plane = H * W;
  for (int64_t y = 0; y < H; y++) {
    for (int64_t x = 0; x < W; x++) {
      double dx = (double)x - cx - tx, dy = (double)y - cy - ty;
      double sx = cx + dx * cs - dy * sn, sy = cy + dx * sn + dy * cs;
      double fx0 = floor(sx), fy0 = floor(sy);
      float wx = (float)(sx - fx0), wy = (float)(sy - fy0);
      int64_t x0 = (int64_t)fx0, y0 = (int64_t)fy0, x1 = x0 + 1, y1 = y0 + 1;
      int in00 = x0 >= 0 && x0 < W && y0 >= 0 && y0 < H, in01 = x1 >= 0 && x1 < W && y0 >= 0 && y0 < H;
      int in10 = x0 >= 0 && x0 < W && y1 >= 0 && y1 < H, in11 = x1 >= 0 && x1 < W && y1 >= 0 && y1 < H;
      float w00 = (1 - wx) * (1 - wy), w01 = wx * (1 - wy), w10 = (1 - wx) * wy, w11 = wx * wy;
      for (int64_t ch = 0; ch < img->c; ch++) {
        const float *src = img->data + ch * plane;
        float v = w00 * (in00 ? src[y0 * W + x0] : fill) + w01 * (in01 ? src[y0 * W + x1] : fill) +
                  w10 * (in10 ? src[y1 * W + x0] : fill) + w11 * (in11 ? src[y1 * W + x1] : fill);
        dst[ch * plane + y * W + x] = v;
      }
    }
  }
  s->cur = 1 - s->cur;
  img->data = dst;
  return KILN_OK;
}

static int normalize(struct kiln_fimage *img, const struct kiln_transform *t) {
  if (t->n != 1 && t->n != img->c)
    return kiln_fail(KILN_ERR_SHAPE, "normalize: %d means and stds for an image of %lld channels [%lld,%lld,%lld]",
                     t->n, (long long)img->c, (long long)img->c, (long long)img->h, (long long)img->w);
  int64_t plane = img->h * img->w;
  for (int64_t ch = 0; ch < img->c; ch++) {
    float m = (float)t->mean[t->n == 1 ? 0 : ch], sd = (float)t->std[t->n == 1 ? 0 : ch];
    float *p = img->data + ch * plane;
    for (int64_t i = 0; i < plane; i++) p[i] = (p[i] - m) / sd;
  }
  return KILN_OK;
}

int kiln_transforms_run(const struct kiln_transforms *t, struct kiln_scratch *s, struct kiln_fimage *img, uint64_t key,
                        int64_t index) {
  if (!t) return KILN_OK;
  for (int k = 0; k < t->n; k++) {
    const struct kiln_transform *tf = &t->items[k];
    uint32_t r[4] = {0, 0, 0, 0};
    if (tf->kind == KILN_TF_RANDOM_CROP || tf->kind == KILN_TF_HFLIP || tf->kind == KILN_TF_VFLIP ||
        tf->kind == KILN_TF_RANDOM_AFFINE)
      kiln_philox(((uint64_t)index << 8) | (uint64_t)k, key, r);
    int rc = KILN_OK;
    switch (tf->kind) {
    case KILN_TF_RESIZE: rc = resize(s, img, tf->h, tf->w); break;
    case KILN_TF_CENTER_CROP: rc = center_crop(s, img, tf->h, tf->w); break;
    case KILN_TF_RANDOM_CROP: rc = random_crop(s, img, tf, r); break;
    case KILN_TF_HFLIP: if (unit32(r[0]) < tf->p) hflip(img); break;
    case KILN_TF_VFLIP: if (unit32(r[0]) < tf->p) vflip(img); break;
    case KILN_TF_RANDOM_AFFINE: rc = random_affine(s, img, tf, r); break;
    case KILN_TF_NORMALIZE: rc = normalize(img, tf); break;
    }
    if (rc) return rc;
  }
  return KILN_OK;
}

/* ---- building a pipeline ---- */

KILN_API struct kiln_transforms *kiln_transforms_new(void) {
  struct kiln_transforms *t = calloc(1, sizeof *t);
  if (!t) kiln_fail(KILN_ERR_MEMORY, "transforms: out of memory");
  return t;
}

KILN_API void kiln_transforms_free(struct kiln_transforms *t) { free(t); }

KILN_API int kiln_transforms_count(const struct kiln_transforms *t) { return t ? t->n : 0; }

static struct kiln_transform *append(struct kiln_transforms *t, int kind, const char *op) {
  if (!t) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: the pipeline is missing (NULL)", op);
    return NULL;
  }
  if (t->n >= KILN_TRANSFORMS_MAX) {
    kiln_fail(KILN_ERR_ARGUMENT, "%s: the pipeline already holds %d transforms (the most it takes)", op, t->n);
    return NULL;
  }
  struct kiln_transform *tf = &t->items[t->n];
  memset(tf, 0, sizeof *tf);
  tf->kind = kind;
  return tf;
}

static int check_side(const char *op, const char *what, int64_t v, int64_t lo) {
  if (v < lo || v > (1 << 20))
    return kiln_fail(KILN_ERR_ARGUMENT, "%s: %s is %lld (expected %lld to %d)", op, what, (long long)v, (long long)lo, 1 << 20);
  return KILN_OK;
}

KILN_API int kiln_transforms_resize(struct kiln_transforms *t, int64_t height, int64_t width) {
  struct kiln_transform *tf = append(t, KILN_TF_RESIZE, "resize");
  if (!tf) return kiln_error_code();
  if (check_side("resize", "height", height, 1) || check_side("resize", "width", width, 0)) return kiln_error_code();
  tf->h = height;
  tf->w = width;
  t->n++;
  return KILN_OK;
}

KILN_API int kiln_transforms_center_crop(struct kiln_transforms *t, int64_t height, int64_t width) {
  struct kiln_transform *tf = append(t, KILN_TF_CENTER_CROP, "center_crop");
  if (!tf) return kiln_error_code();
  if (check_side("center_crop", "height", height, 1) || check_side("center_crop", "width", width, 1)) return kiln_error_code();
  tf->h = height;
  tf->w = width;
  t->n++;
  return KILN_OK;
}

KILN_API int kiln_transforms_random_crop(struct kiln_transforms *t, int64_t height, int64_t width, int64_t padding,
                                         double fill) {
  struct kiln_transform *tf = append(t, KILN_TF_RANDOM_CROP, "random_crop");
  if (!tf) return kiln_error_code();
  if (check_side("random_crop", "height", height, 1) || check_side("random_crop", "width", width, 1) ||
      check_side("random_crop", "padding", padding, 0))
    return kiln_error_code();
  if (!isfinite(fill)) return kiln_fail(KILN_ERR_ARGUMENT, "random_crop: fill is %g (expected a finite number)", fill);
  tf->h = height;
  tf->w = width;
  tf->pad = padding;
  tf->fill = fill;
  t->n++;
  return KILN_OK;
}

static int flip(struct kiln_transforms *t, int kind, double p, const char *op) {
  struct kiln_transform *tf = append(t, kind, op);
  if (!tf) return kiln_error_code();
  if (!(p >= 0 && p <= 1)) return kiln_fail(KILN_ERR_ARGUMENT, "%s: p is %g (expected a probability, 0 to 1)", op, p);
  tf->p = p;
  t->n++;
  return KILN_OK;
}

KILN_API int kiln_transforms_hflip(struct kiln_transforms *t, double p) { return flip(t, KILN_TF_HFLIP, p, "hflip"); }
KILN_API int kiln_transforms_vflip(struct kiln_transforms *t, double p) { return flip(t, KILN_TF_VFLIP, p, "vflip"); }

KILN_API int kiln_transforms_random_affine(struct kiln_transforms *t, double degrees, double translate_x,
                                           double translate_y, double fill) {
  struct kiln_transform *tf = append(t, KILN_TF_RANDOM_AFFINE, "random_affine");
  if (!tf) return kiln_error_code();
  if (!(degrees >= 0 && degrees <= 360))
    return kiln_fail(KILN_ERR_ARGUMENT, "random_affine: degrees is %g (expected 0 to 360)", degrees);
  if (!(translate_x >= 0 && translate_x <= 1) || !(translate_y >= 0 && translate_y <= 1))
    return kiln_fail(KILN_ERR_ARGUMENT, "random_affine: translate is (%g, %g) (expected fractions of the size, 0 to 1)",
                     translate_x, translate_y);
  if (!isfinite(fill)) return kiln_fail(KILN_ERR_ARGUMENT, "random_affine: fill is %g (expected a finite number)", fill);
  tf->degrees = degrees;
  tf->tx = translate_x;
  tf->ty = translate_y;
  tf->fill = fill;
  t->n++;
  return KILN_OK;
}

KILN_API int kiln_transforms_normalize(struct kiln_transforms *t, int n, const double *mean, const double *std) {
  struct kiln_transform *tf = append(t, KILN_TF_NORMALIZE, "normalize");
  if (!tf) return kiln_error_code();
  if (n < 1 || n > KILN_TF_MAX_CHANNELS || !mean || !std)
    return kiln_fail(KILN_ERR_ARGUMENT, "normalize: %d means and stds (expected 1 to %d, one per channel)", n,
                     KILN_TF_MAX_CHANNELS);
  for (int c = 0; c < n; c++) {
    if (!isfinite(mean[c])) return kiln_fail(KILN_ERR_ARGUMENT, "normalize: mean %d is %g (expected a finite number)", c, mean[c]);
    if (!(std[c] > 0) || !isfinite(std[c]))
      return kiln_fail(KILN_ERR_ARGUMENT, "normalize: std %d is %g (expected a positive number)", c, std[c]);
    tf->mean[c] = mean[c];
    tf->std[c] = std[c];
  }
  tf->n = n;
  t->n++;
  return KILN_OK;
}

/* ---- one image ---- */

KILN_API struct kiln_tensor *kiln_transforms_apply(const struct kiln_transforms *t, const struct kiln_tensor *image,
                                                   int64_t seed, int64_t epoch, int64_t index) {
  if (kiln_check_live("transforms_apply", image)) return NULL;
  if (image->ndim != 2 && image->ndim != 3) {
    kiln_fail(KILN_ERR_SHAPE, "transforms_apply: the image is %s (expected [C,H,W] or [H,W])", kiln_shape_string(image));
    return NULL;
  }
  if (image->device.type != KILN_CPU) {
    kiln_fail(KILN_ERR_DEVICE, "transforms_apply: the image is on %s (expected the cpu)", kiln_device_name(image->device));
    return NULL;
  }
  struct kiln_fimage img = {NULL, image->ndim == 3 ? image->sizes[0] : 1, image->sizes[image->ndim - 2],
                            image->sizes[image->ndim - 1]};
  struct kiln_tensor *src = kiln_contiguous(image);
  if (!src) return NULL;
  struct kiln_scratch s = {0};
  struct kiln_tensor *out = NULL;
  img.data = kiln_scratch_current(&s, (size_t)(img.c * img.h * img.w));
  if (!img.data) kiln_fail(KILN_ERR_MEMORY, "transforms_apply: out of memory");
  else {
    kiln_convert(img.data, KILN_F32, kiln_tensor_data(src), src->dtype, img.c * img.h * img.w);
    if (!kiln_transforms_run(t, &s, &img, kiln_sample_key(seed, epoch), index)) {
      int64_t sizes[3] = {img.c, img.h, img.w};
      out = kiln_tensor_empty(3, sizes, KILN_F32, (struct kiln_device){KILN_CPU, 0});
      if (out) memcpy(kiln_tensor_data(out), img.data, sizeof(float) * (size_t)(img.c * img.h * img.w));
    }
  }
  kiln_scratch_free(&s);
  kiln_tensor_release(src);
  return out;
}
