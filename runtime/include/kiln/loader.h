/* kiln/loader.h: datasets that C worker threads read without Lua (tensors in memory, image folders),
   the per-sample transform pipeline, and the loader that keeps batches ready ahead of the training loop. */
#ifndef KILN_LOADER_H
#define KILN_LOADER_H
#include <stdint.h>

struct kiln_tensor;
struct kiln_dataset;      /* a list of samples: rows of tensors, or the files of an image folder */
struct kiln_transforms;   /* a pipeline of per-sample transforms */
struct kiln_loader;       /* worker threads turning a dataset into batches, in a seeded order */

enum kiln_loader_limits {
  KILN_IMAGE_MAX_BYTES = 268435456,       /* about what decoding one image may allocate (256 MiB) */
  KILN_IMAGE_MAX_FILE_BYTES = 268435456,  /* the size of an image file */
  KILN_LOADER_MAX_TENSORS = 8,            /* tensors per sample (and per batch) */
  KILN_LOADER_MAX_WORKERS = 256,
  KILN_TRANSFORMS_MAX = 64                /* transforms in one pipeline */
};

/* ---- images ---- */

/* Decodes a PNG, JPEG, BMP, GIF (its first frame), TGA or PNM (P5/P6) file into a new u8 tensor
   [C,H,W]. channels: 1 grey, 2 grey+alpha, 3 RGB, 4 RGBA (converted as stb_image does), or 0 for
   the file's own. The declared size is checked against KILN_IMAGE_MAX_BYTES before decoding
   (width x height x (the file's channels + channels), more for GIF and 16-bit files); an empty,
   truncated or corrupt file is an error naming the file. */
struct kiln_tensor *kiln_image_read(const char *path, int channels);
/* The same at depth 8 (u8, as kiln_image_read) or 16 bits: an i32 tensor of samples 0 to 65535 (a
   16-bit PNG or PNM keeps its samples; an 8-bit file is scaled by 257, a PNM of any maxval to 65535). */
struct kiln_tensor *kiln_image_read_depth(const char *path, int channels, int depth);
/* Writes a u8 tensor [C,H,W] (C 1 to 4) or [H,W] as a PNG file (stb_image_write). */
int kiln_image_write_png(const char *path, const struct kiln_tensor *image);

/* ---- transforms ---- */

/* Transforms work on one sample at a time: an image as f32 [C,H,W] (decoded images scaled to
   [0, 1]; rows of a tensor dataset converted as they are), in the order they were added. A random
   transform draws from kiln_sample_philox(seed, epoch, sample index, its position in the pipeline),
   so a sample's result depends on nothing else (not on workers, batches or order). */
struct kiln_transforms *kiln_transforms_new(void);
void kiln_transforms_free(struct kiln_transforms *t);
int kiln_transforms_count(const struct kiln_transforms *t);
/* Bilinear (half-pixel centres, no antialiasing) to height x width; width 0: the shorter side
   becomes height and the other keeps the aspect ratio (rounded down), as torchvision's Resize(n). */
int kiln_transforms_resize(struct kiln_transforms *t, int64_t height, int64_t width);
/* The centre height x width window (top = round-half-even((H - height) / 2), as torchvision);
   where the image is smaller, the outside is 0. */
int kiln_transforms_center_crop(struct kiln_transforms *t, int64_t height, int64_t width);
/* Pads every side by padding pixels of value fill, then takes a uniformly random window. */
int kiln_transforms_random_crop(struct kiln_transforms *t, int64_t height, int64_t width, int64_t padding, double fill);
/* Mirrors left-right (horizontal) or top-bottom (vertical) with probability p. */
int kiln_transforms_hflip(struct kiln_transforms *t, double p);
int kiln_transforms_vflip(struct kiln_transforms *t, double p);
/* Rotates by an angle uniform in [-degrees, degrees] (counter-clockwise as displayed) about the
   centre and shifts by whole pixels uniform in [-translate_x * W, translate_x * W] (rounded;
   likewise y), sampling bilinearly; pixels from outside the image take fill. */
int kiln_transforms_random_affine(struct kiln_transforms *t, double degrees, double translate_x, double translate_y,
                                  double fill);
/* (x - mean[c]) / std[c]; n = 1 applies to every channel, else n must equal C. */
int kiln_transforms_normalize(struct kiln_transforms *t, int n, const double *mean, const double *std);
/* The pipeline applied to image ([C,H,W] or [H,W], any dtype, values as they are) as sample index
   of epoch under seed: a new f32 [C,H',W'] tensor. */
struct kiln_tensor *kiln_transforms_apply(const struct kiln_transforms *t, const struct kiln_tensor *image,
                                          int64_t seed, int64_t epoch, int64_t index);
/* The random block of sample index in (seed, epoch), for the step-th random transform: Philox
   4x32-10 with counter index * 256 + step under a key hashed from (seed, epoch). */
void kiln_sample_philox(int64_t seed, int64_t epoch, int64_t index, uint32_t step, uint32_t *out4);
/* The shuffled order of an epoch: out[0..n) = a Fisher-Yates permutation of 0..n-1 drawn from a
   splitmix64 stream of (seed, epoch); kiln.data.permutation (plus 1) and kiln.data.batches use it. */
int kiln_permutation_fill(int64_t *out, int64_t n, int64_t seed, int64_t epoch);

/* ---- datasets ---- */

/* Sample i is row i of every tensor (all share dim 0, at most KILN_LOADER_MAX_TENSORS, on the CPU).
   The rows are copied into a contiguous form when a tensor is not contiguous. */
struct kiln_dataset *kiln_dataset_tensors(int n, struct kiln_tensor *const *tensors);
/* root/<class>/<file>: classes are the folders of root sorted by name (byte order), label k the
   k-th from 0; files are found under each class folder, sub-folders included, sorted by path;
   files named .png .jpg .jpeg .bmp .gif .tga .pnm .pgm .ppm (any case) are samples, others are
   skipped. Sample i is (f32 [channels,H,W] in [0, 1], i64 label). A missing root, no class folder,
   or a class folder without images is an error naming it; files are read only when loaded. */
struct kiln_dataset *kiln_dataset_image_folder(const char *root, int channels);
void kiln_dataset_retain(struct kiln_dataset *d);
void kiln_dataset_release(struct kiln_dataset *d);
int64_t kiln_dataset_len(const struct kiln_dataset *d);
/* The tensors a sample has (2 for an image folder). */
int kiln_dataset_num_tensors(const struct kiln_dataset *d);
/* Image folders: the classes, the file and label of sample i (NULL / -1 out of range or for tensors). */
int kiln_dataset_num_classes(const struct kiln_dataset *d);
const char *kiln_dataset_class_name(const struct kiln_dataset *d, int k);
const char *kiln_dataset_file(const struct kiln_dataset *d, int64_t i);
int64_t kiln_dataset_label(const struct kiln_dataset *d, int64_t i);
/* Sample index through transforms (NULL: none) as in epoch under seed: up to n new tensors in out
   (the sample's tensors without the batch dim). */
int kiln_dataset_get(const struct kiln_dataset *d, int64_t index, const struct kiln_transforms *t, int64_t seed,
                     int64_t epoch, int n, struct kiln_tensor **out);

/* ---- the loader ---- */

/* Batches of batch_size samples (the last one short unless drop_last). workers: threads that read,
   decode, transform and collate (0: all on the caller's thread, inside next); they fill a ring of
   prefetch batches ahead of the consumer and sleep when it is full. shuffle: each epoch's order is
   kiln_permutation_fill(seed, epoch); otherwise 0..n-1. The loader holds a reference to dataset. */
struct kiln_loader *kiln_loader_new(struct kiln_dataset *dataset, int64_t batch_size, int shuffle, int drop_last,
                                    int workers, int prefetch, int64_t seed);
/* The per-sample pipeline (copied; NULL clears it), applied to the image of an image folder or to
   the first tensor of a tensor dataset (its rows [C,H,W] or [H,W]; the batch becomes f32). Any
   epoch in progress is stopped. */
int kiln_loader_set_transforms(struct kiln_loader *l, const struct kiln_transforms *t);
/* pin != 0: the workers collate every batch into page-locked memory (kiln_tensor_is_pinned), ready
   for uploads that do not wait (kiln_to_device_non_blocking); the batches hold the same values as
   without. Without a usable CUDA device: "loader: pin_memory: no CUDA device: <why>". Any epoch in
   progress is stopped. */
int kiln_loader_set_pin_memory(struct kiln_loader *l, int pin);
/* Starts epoch (stopping one in progress): order holds n sample indices from 0 (a sampler's
   choice; copied), or is NULL for the loader's own order of the whole dataset. */
int kiln_loader_start_epoch(struct kiln_loader *l, int64_t epoch, const int64_t *order, int64_t n);
/* The same, skipping the first first_batch batches (to resume within an epoch). */
int kiln_loader_start_epoch_at(struct kiln_loader *l, int64_t epoch, const int64_t *order, int64_t n,
                               int64_t first_batch);
/* Batches in the current epoch (counting those skipped), and the index of the next one. */
int64_t kiln_loader_num_batches(const struct kiln_loader *l);
int64_t kiln_loader_position(const struct kiln_loader *l);
/* The next batch, strictly in order, waiting for it when needed: new references in *batch_x and
   *batch_y (the first two tensors of the batch; *batch_y NULL when samples have one). At the end
   of the epoch both are NULL and the status is 0. A sample that cannot be loaded makes this call
   fail with a message naming the sample (and its file), and every later call of the epoch too. */
int kiln_loader_next(struct kiln_loader *l, struct kiln_tensor **batch_x, struct kiln_tensor **batch_y);
/* The same with every tensor of the batch: out[0..n) (n >= the dataset's tensors). */
int kiln_loader_next_all(struct kiln_loader *l, int n, struct kiln_tensor **out);
/* Seconds spent inside next waiting for batches (or making them, with 0 workers), since new. */
double kiln_loader_wait_seconds(const struct kiln_loader *l);
/* Stops the workers (abandoning the batches in flight), joins them and frees the loader. */
void kiln_loader_free(struct kiln_loader *l);

#endif
