/* cpu/backend.c: the CPU backend table, and the choice of the kernels' instruction-set level.

   The kernels of cpu/ are compiled once per level (docs/cpu.md): baseline (x86-64-v2: SSE4.2),
   avx2 (x86-64-v3: AVX2, FMA, F16C) and avx512 (x86-64-v4: AVX-512 F, BW, CD, DQ, VL). When libkiln
   is loaded, after core/system.c has read the CPU's features, the highest level the CPU runs fills
   kiln_cpu_backend's kernel table; KILN_CPU_LEVEL=baseline|avx2|avx512 asks for one (for tests),
   and is refused when the CPU lacks it. A KILN_NATIVE build has one level, native (-march=native). */
#include "cpu.h"
#include "philox.h"
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Training loops allocate and free the same buffers every step. glibc would serve each one above
   128 KiB from a fresh mmap (and page-fault it in again); keep those up to 32 MiB in the heap, and
   the larger ones in kiln_cpu_alloc's cache (cpu/big_blocks.c). */
__attribute__((constructor)) static void cpu_malloc_setup(void) {
  mallopt(M_MMAP_THRESHOLD, KILN_BIG_BLOCK);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

/* 64-byte alignment for vector loads; at least one byte so that empty tensors have a pointer. */
static void *cpu_alloc(int64_t nbytes, int device_index) {
  (void)device_index;
  return kiln_cpu_alloc((size_t)(nbytes > 0 ? nbytes : 1));
}

static void cpu_free(void *data, int64_t nbytes, int device_index) {
  (void)device_index;
  kiln_cpu_free(data, (size_t)(nbytes > 0 ? nbytes : 1));
}

static int cpu_memcpy(void *dst, const void *src, int64_t nbytes, int device_index) {
  (void)device_index;
  memcpy(dst, src, (size_t)nbytes);
  return KILN_OK;
}

/* The levels of this build, highest first, and the CPU features (kiln_cpu_has's names) each needs:
   those of its -march level that kiln reads with cpuid. */
extern const struct kiln_backend kiln_cpu_kernels_avx512, kiln_cpu_kernels_avx2, kiln_cpu_kernels_baseline,
    kiln_cpu_kernels_native;
/* each level's rule for where f32 products run (cpu/sgemm.c) */
int kiln_cpu_sgemm_here_avx512(int64_t, int64_t, int64_t), kiln_cpu_sgemm_here_avx2(int64_t, int64_t, int64_t),
    kiln_cpu_sgemm_here_baseline(int64_t, int64_t, int64_t), kiln_cpu_sgemm_here_native(int64_t, int64_t, int64_t);
static const struct cpu_level {
  const char *name;
  const struct kiln_backend *kernels;
  const char *needs;
  int (*sgemm_here)(int64_t, int64_t, int64_t);
} levels[] = {
#if defined(KILN_CPU_NATIVE)
  {"native", &kiln_cpu_kernels_native, "", kiln_cpu_sgemm_here_native},
#elif defined(KILN_CPU_X86_LEVELS)
  {"avx512", &kiln_cpu_kernels_avx512,
   "avx512f avx512bw avx512cd avx512dq avx512vl avx2 avx fma f16c bmi1 bmi2 lzcnt movbe sse4.2 popcnt",
   kiln_cpu_sgemm_here_avx512},
  {"avx2", &kiln_cpu_kernels_avx2, "avx2 avx fma f16c bmi1 bmi2 lzcnt movbe sse4.2 popcnt", kiln_cpu_sgemm_here_avx2},
  {"baseline", &kiln_cpu_kernels_baseline, "sse4.2 sse4.1 ssse3 popcnt", kiln_cpu_sgemm_here_baseline},
#else
  {"baseline", &kiln_cpu_kernels_baseline, "", kiln_cpu_sgemm_here_baseline},
#endif
};
enum { LEVEL_COUNT = sizeof levels / sizeof levels[0] };

static const struct cpu_level *chosen = &levels[LEVEL_COUNT - 1];
static char level_error[320];

/* The features of needs that this CPU lacks, space-separated, into out ("" when it has them all). */
static void missing_features(const char *needs, char *out, size_t size) {
  char name[32];
  out[0] = 0;
  for (const char *p = needs; *p;) {
    size_t n = strcspn(p, " ");
    snprintf(name, sizeof name, "%.*s", (int)n, p);
    if (!kiln_cpu_has(name)) snprintf(out + strlen(out), size - strlen(out), "%s%s", out[0] ? " " : "", name);
    p += n + (p[n] == ' ');
  }
}

/* After core/system.c has read the CPU (its constructor runs first), before any kernel runs. */
__attribute__((constructor(102))) static void cpu_level_choose(void) {
  char missing[160];
  const struct cpu_level *best = NULL;
  for (int i = 0; i < LEVEL_COUNT && !best; i++) {
    missing_features(levels[i].needs, missing, sizeof missing);
    if (!missing[0]) best = &levels[i];
  }
  if (!best) {   /* not even the baseline: run it all the same, and say so */
    best = &levels[LEVEL_COUNT - 1];
    missing_features(best->needs, missing, sizeof missing);
    snprintf(level_error, sizeof level_error, "this CPU lacks %s, which kiln's CPU kernels need at their lowest level "
             "(%s); it may stop on an illegal instruction", missing, best->name);
  }
  chosen = best;
  const char *want = getenv("KILN_CPU_LEVEL");
  if (want && *want && !level_error[0]) {
    const struct cpu_level *asked = NULL;
    for (int i = 0; i < LEVEL_COUNT; i++)
      if (strcmp(want, levels[i].name) == 0) asked = &levels[i];
    char names[64] = "";
    for (int i = 0; i < LEVEL_COUNT; i++)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", levels[i].name);
    if (!asked) {
      snprintf(level_error, sizeof level_error, "KILN_CPU_LEVEL=%s is not a level of this build (%s); the kernels run at %s",
               want, names, best->name);
    } else {
      missing_features(asked->needs, missing, sizeof missing);
      if (missing[0])
        snprintf(level_error, sizeof level_error, "KILN_CPU_LEVEL=%s: this CPU lacks %s; the kernels run at %s",
                 want, missing, best->name);
      else
        chosen = asked;
    }
  }
  kiln_cpu_backend.elementwise = chosen->kernels->elementwise;
  memcpy(kiln_cpu_backend.kernel, chosen->kernels->kernel, sizeof kiln_cpu_backend.kernel);
}

KILN_API const char *kiln_cpu_level(void) { return chosen->name; }

KILN_API const char *kiln_cpu_f32_gemm(void) { return chosen->sgemm_here(64, 64, 64) ? "kiln" : "blas"; }

KILN_API int kiln_cpu_level_check(void) {
  return level_error[0] ? kiln_fail(KILN_ERR_UNSUPPORTED, "%s", level_error) : KILN_OK;
}

/* The kernel table is filled by cpu_level_choose. */
struct kiln_backend kiln_cpu_backend = {
  .name = "cpu",
  .alloc = cpu_alloc,
  .free = cpu_free,
  .memcpy_to_host = cpu_memcpy,
  .memcpy_from_host = cpu_memcpy,
};

/* The layers above reach the chosen level's copy (ops/factories.c). */
int kiln_cpu_copy(struct kiln_tensor *dst, const struct kiln_tensor *src) {
  struct kiln_call call = {.op = KILN_OP_COPY, .out = dst, .in = {src}, .nin = 1};
  return kiln_cpu_backend.kernel[KILN_OP_COPY](&call);
}

/* For the data transforms (data/transforms.c); the kernels inline kiln_philox4x32 themselves. */
void kiln_philox(uint64_t ctr, uint64_t key, uint32_t out[4]) { kiln_philox4x32(ctr, key, out); }
