/* cuda/conv_cache.h: the host side of the cuDNN convolutions: the shape key of one convolution
   pass, the per-process table of the algorithm chosen for each key, and the per-device workspace
   that grows to the largest request. Plain C with no CUDA, so that CI tests it without a GPU. */
#ifndef KILN_CUDA_CONV_CACHE_H
#define KILN_CUDA_CONV_CACHE_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum kiln_conv_pass { KILN_CONV_FORWARD, KILN_CONV_BACKWARD_DATA, KILN_CONV_BACKWARD_FILTER };

/* Which of cuDNN's APIs runs the convolutions: the graph (backend) API, the default, or the legacy
   cudnnConvolution* calls. KILN_CUDNN_API=graph|legacy says which; it is read at every convolution,
   so that a script may switch (kiln.cuda.set_conv_api). */
enum kiln_conv_api { KILN_CONV_API_LEGACY, KILN_CONV_API_GRAPH };
/* The API a KILN_CUDNN_API value names (NULL or empty: the graph API), or -1 for anything else. */
int kiln_conv_api_parse(const char *value);

/* Everything an algorithm or plan choice depends on. Build it with kiln_conv_key_make (which zeroes
   the padding, so that keys compare and hash as bytes); the graph API then sets api and the byte
   alignments of the three buffers (a plan made for 16-byte aligned data may not run on less). */
struct kiln_conv_key {
  int32_t pass, dtype, device, benchmark;
  int32_t api, align_x, align_w, align_y;   /* 0 for the legacy API */
  int64_t n, c, h, w;          /* x (or gx) */
  int64_t o, kh, kw;           /* w is [o, c/groups, kh, kw] */
  int64_t oh, ow;              /* y (or gy) */
  int64_t sh, sw, ph, pw, dh, dw, groups;
};

/* ints: stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups (as KILN_OP_CONV2D carries them). */
void kiln_conv_key_make(struct kiln_conv_key *k, int pass, int dtype, int device, int benchmark, const int64_t x[4],
                        const int64_t w[4], const int64_t y[4], const int64_t ints[7]);
int kiln_conv_key_equal(const struct kiln_conv_key *a, const struct kiln_conv_key *b);
uint64_t kiln_conv_key_hash(const struct kiln_conv_key *k);

/* What the search chose: cuDNN's algorithm enum (legacy API) or the finalized plan (graph API,
   owned by the table for the life of the process; legacy set when no plan could be made and the
   shape goes to the legacy API), and the workspace it needs. */
struct kiln_conv_choice {
  int algo;
  size_t workspace;
  void *plan;
  int legacy;
};

/* A thread-safe table of choices, grown as it fills. */
struct kiln_conv_cache;
struct kiln_conv_cache *kiln_conv_cache_new(void);
void kiln_conv_cache_free(struct kiln_conv_cache *cache);
/* 1 and *out filled on a hit, 0 on a miss. */
int kiln_conv_cache_get(struct kiln_conv_cache *cache, const struct kiln_conv_key *k, struct kiln_conv_choice *out);
/* 0, or -1 when out of host memory (the choice is then simply not remembered). A key already
   there keeps its first choice. */
int kiln_conv_cache_put(struct kiln_conv_cache *cache, const struct kiln_conv_key *k, const struct kiln_conv_choice *c);
int64_t kiln_conv_cache_count(struct kiln_conv_cache *cache);

/* One device's workspace: kept between calls, replaced by a larger block when a pass needs more
   (the old one freed through the backing, which must not reuse it before its users are done: a
   stream-ordered caching allocator, or cudaFree, which waits). */
struct kiln_conv_workspace {
  void *ptr;
  size_t bytes;
  int (*alloc)(void *ctx, size_t bytes, void **out);   /* 0 on success */
  void (*free)(void *ctx, void *ptr);
  void *ctx;
};
/* ws->ptr holds at least need bytes afterwards (0), or the allocation failed (its status; the old
   block is kept). Grows to need rounded up to 1 MiB, so that slowly rising needs reallocate rarely. */
int kiln_conv_workspace_reserve(struct kiln_conv_workspace *ws, size_t need);
void kiln_conv_workspace_release(struct kiln_conv_workspace *ws);

#ifdef __cplusplus
}
#endif
#endif
