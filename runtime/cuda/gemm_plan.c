/* cuda/gemm_plan.c: the host-side choices of a cuBLASLt GEMM (gemm_plan.h): types for a dtype and
   precision, operand alignment, and the cache of heuristic answers. Plain C: CI tests it on the CPU. */
#include "gemm_plan.h"
#include <string.h>

int kiln_cuda_gemm_types(int dtype, int precision, struct kiln_cuda_gemm_types *t) {
  memset(t, 0, sizeof *t);
  if (precision != KILN_MATMUL_HIGHEST && precision != KILN_MATMUL_HIGH && precision != KILN_MATMUL_MEDIUM) return -1;
  t->scale = KILN_BLAS_R_32F;
  t->compute = KILN_BLAS_COMPUTE_32F;
  t->use_lt = 1;
  switch (dtype) {
  case KILN_F32:
    t->data = KILN_BLAS_R_32F;
    if (precision == KILN_MATMUL_HIGH) t->compute = KILN_BLAS_COMPUTE_32F_FAST_TF32;
    if (precision == KILN_MATMUL_MEDIUM) t->compute = KILN_BLAS_COMPUTE_32F_FAST_16BF;
    return 0;
  case KILN_F16: t->data = KILN_BLAS_R_16F; return 0;    /* tensor cores either way; f32 accumulation */
  case KILN_BF16: t->data = KILN_BLAS_R_16BF; return 0;
  case KILN_F64:
    t->data = t->scale = KILN_BLAS_R_64F;
    t->compute = KILN_BLAS_COMPUTE_64F;
    t->use_lt = 0;   /* no tensor-core gain to win: the legacy call, as before */
    return 0;
  default:
    memset(t, 0, sizeof *t);
    return -1;
  }
}

const char *kiln_cuda_gemm_compute_name(int compute) {
  switch (compute) {
  case KILN_BLAS_COMPUTE_32F: return "f32";
  case KILN_BLAS_COMPUTE_32F_FAST_TF32: return "f32 with TF32 tensor cores";
  case KILN_BLAS_COMPUTE_32F_FAST_16BF: return "f32 with BF16 tensor cores";
  case KILN_BLAS_COMPUTE_64F: return "f64";
  default: return "an unknown compute type";
  }
}

void kiln_cuda_lt_layouts(const struct kiln_cuda_gemm_plan *p, struct kiln_cuda_lt_layout out[3]) {
  int batched = p->batch > 1;   /* a batch of one: its strides are never read */
  out[0] = (struct kiln_cuda_lt_layout){p->trans_a ? p->k : p->m, p->trans_a ? p->m : p->k, p->lda, p->batch,
                                        batched ? p->stride_a : 0};
  out[1] = (struct kiln_cuda_lt_layout){p->trans_b ? p->n : p->k, p->trans_b ? p->k : p->n, p->ldb, p->batch,
                                        batched ? p->stride_b : 0};
  out[2] = (struct kiln_cuda_lt_layout){p->m, p->n, p->ldc, p->batch, batched ? p->stride_c : 0};
}

uint32_t kiln_cuda_gemm_alignment(uintptr_t address) {
  uint32_t a = 1;
  while (a < 256 && (address & a) == 0) a <<= 1;
  return a;
}

/* The alignment cuBLASLt may assume of an operand: that of its first matrix and, in a batch, that
   of every later one too (the byte stride), since the kernel chosen for the first reads them all
   with the same vector loads. */
static uint32_t operand_alignment(uintptr_t address, int64_t stride, int64_t batch, int dtype) {
  if (batch > 1) address |= (uintptr_t)stride * (uintptr_t)kiln_dtype_size(dtype);
  return kiln_cuda_gemm_alignment(address);
}

void kiln_cuda_lt_key_build(struct kiln_cuda_lt_key *key, int device, int dtype, const struct kiln_cuda_gemm_types *t,
                            const struct kiln_cuda_gemm_plan *p, uintptr_t a, uintptr_t b, uintptr_t c) {
  memset(key, 0, sizeof *key);
  key->device = device;
  key->dtype = dtype;
  key->compute = t->compute;
  key->scale = t->scale;
  key->data = t->data;
  key->trans_a = p->trans_a;
  key->trans_b = p->trans_b;
  key->align_a = operand_alignment(a, p->stride_a, p->batch, dtype);
  key->align_b = operand_alignment(b, p->stride_b, p->batch, dtype);
  key->align_c = operand_alignment(c, p->stride_c, p->batch, dtype);
  key->m = p->m;
  key->n = p->n;
  key->k = p->k;
  key->lda = p->lda;
  key->ldb = p->ldb;
  key->ldc = p->ldc;
  key->batch = p->batch;
  /* one matrix: its batch strides are never read */
  key->stride_a = p->batch > 1 ? p->stride_a : 0;
  key->stride_b = p->batch > 1 ? p->stride_b : 0;
  key->stride_c = p->batch > 1 ? p->stride_c : 0;
}

static uint64_t key_hash(const struct kiln_cuda_lt_key *key) {
  const unsigned char *s = (const unsigned char *)key;
  uint64_t h = 1469598103934665603ull;   /* FNV-1a */
  for (size_t i = 0; i < sizeof *key; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h;
}

static struct kiln_cuda_lt_entry *lookup(struct kiln_cuda_lt_cache *c, const struct kiln_cuda_lt_key *key, uint64_t h) {
  for (int i = 0; i < KILN_CUDA_LT_CACHE_ENTRIES; i++) {
    struct kiln_cuda_lt_entry *e = &c->entries[i];
    if (e->used && e->hash == h && memcmp(&e->key, key, sizeof *key) == 0) return e;
  }
  return NULL;
}

int kiln_cuda_lt_cache_find(struct kiln_cuda_lt_cache *c, const struct kiln_cuda_lt_key *key, void *algo) {
  struct kiln_cuda_lt_entry *e = lookup(c, key, key_hash(key));
  if (!e) {
    c->misses++;
    return KILN_CUDA_LT_MISS;
  }
  c->hits++;
  e->used = ++c->clock;
  if (e->state == KILN_CUDA_LT_ALGO && algo) memcpy(algo, e->algo, KILN_CUDA_LT_ALGO_BYTES);
  return e->state;
}

void kiln_cuda_lt_cache_put(struct kiln_cuda_lt_cache *c, const struct kiln_cuda_lt_key *key, int state,
                            const void *algo) {
  uint64_t h = key_hash(key);
  struct kiln_cuda_lt_entry *e = lookup(c, key, h);
  if (!e) {
    e = &c->entries[0];   /* an empty slot, else the least recently used */
    for (int i = 0; i < KILN_CUDA_LT_CACHE_ENTRIES && e->used; i++)
      if (!c->entries[i].used || c->entries[i].used < e->used) e = &c->entries[i];
    if (e->used) c->evictions++;
    memset(e, 0, sizeof *e);
    e->key = *key;
    e->hash = h;
  }
  e->state = state == KILN_CUDA_LT_ALGO ? KILN_CUDA_LT_ALGO : KILN_CUDA_LT_NONE;
  if (e->state == KILN_CUDA_LT_ALGO) memcpy(e->algo, algo, KILN_CUDA_LT_ALGO_BYTES);
  else memset(e->algo, 0, sizeof e->algo);
  e->used = ++c->clock;
}

int kiln_cuda_lt_cache_count(const struct kiln_cuda_lt_cache *c) {
  int n = 0;
  for (int i = 0; i < KILN_CUDA_LT_CACHE_ENTRIES; i++) n += c->entries[i].used != 0;
  return n;
}
