/* data.h: what image.c, transforms.c and loader.c share and the rest of the runtime does not: a
   decoded image, an image as planar floats, the transform list and the per-thread scratch space. */
#ifndef KILN_DATA_H
#define KILN_DATA_H
#include "internal.h"
#include <kiln/loader.h>

/* A decoded file: h x w x c samples, interleaved (stb_image's layout), of 8 bits (bytes) or 16
   (uint16_t, by kiln_image_decode_depth); free with kiln_image_free. */
struct kiln_u8_image {
  unsigned char *pixels;
  int w, h, c;
  int bits;
};
/* Reads and decodes path (image.c) into 8-bit samples; errors name the file. */
int kiln_image_decode(const char *path, int channels, struct kiln_u8_image *out);
/* The same into samples of depth bits, 8 or 16: a 16-bit file keeps its samples, an 8-bit one is
   scaled (v * 257), a PNM of any maxval to 65535. */
int kiln_image_decode_depth(const char *path, int channels, int depth, struct kiln_u8_image *out);
void kiln_image_free(struct kiln_u8_image *img);

/* An image as planar f32: data[(ch * h + y) * w + x]. */
struct kiln_fimage {
  float *data;
  int64_t c, h, w;
};

/* Two growable float buffers that a pipeline ping-pongs between (one set per thread). */
struct kiln_scratch {
  float *buf[2];
  size_t cap[2];      /* in floats */
  int cur;            /* the buffer holding the current image */
};
/* The current buffer with room for n floats (its contents are lost when it grows). */
float *kiln_scratch_current(struct kiln_scratch *s, size_t n);
void kiln_scratch_free(struct kiln_scratch *s);

enum kiln_transform_kind {
  KILN_TF_RESIZE, KILN_TF_CENTER_CROP, KILN_TF_RANDOM_CROP, KILN_TF_HFLIP, KILN_TF_VFLIP,
  KILN_TF_RANDOM_AFFINE, KILN_TF_NORMALIZE
};
enum { KILN_TF_MAX_CHANNELS = 64 };   /* mean/std entries of normalize */

struct kiln_transform {
  int kind;
  int64_t h, w, pad;
  double p, fill, degrees, tx, ty;
  int n;                              /* normalize: entries of mean and std */
  double mean[KILN_TF_MAX_CHANNELS], std[KILN_TF_MAX_CHANNELS];
};

struct kiln_transforms {
  int n;
  struct kiln_transform items[KILN_TRANSFORMS_MAX];
};

/* The Philox key of (seed, epoch) for kiln_sample_philox. */
uint64_t kiln_sample_key(int64_t seed, int64_t epoch);
/* Runs t over img (held in s's current buffer) as sample index under key; img describes the
   result, again in s's current buffer. */
int kiln_transforms_run(const struct kiln_transforms *t, struct kiln_scratch *s, struct kiln_fimage *img, uint64_t key,
                        int64_t index);

#endif
