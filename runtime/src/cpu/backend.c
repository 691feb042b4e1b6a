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

/* Whether this CPU's vdpbf16ps (32 bf16 products summed into 16 f32 lanes) multiplies faster than
   its vfmadd231ps (16 f32 products): 16 independent chains of each, timed once, best of 7. Zen 4
   and Zen 5 run the two at the same instruction rate (bf16 twice the products); Sapphire and
   Emerald Rapids run vdpbf16ps at a quarter of it (half the products of f32), so that the f32
   FMAs on widened bf16 values are the faster way there. bf16 wins when it does the same products
   in at most two thirds of the time. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <pthread.h>
#include <time.h>
static double seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#define KILN_CHAINS16(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14) OP(15)
/* 16 independent chains of vdpbf16ps (bf16) or of vfmadd231ps, n instructions each; the seconds */
__attribute__((target("avx512f,avx512bf16,fma"), noinline))
static double time_chains(int bf16, int64_t n) {
  __m512 c[16];
  for (int i = 0; i < 16; i++) c[i] = _mm512_set1_ps((float)i);
  __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(0.0078125f);
  __m512bh xb = (__m512bh)_mm512_set1_epi32(0x3f803f80), yb = (__m512bh)_mm512_set1_epi32(0x3c003c00);
  double t = seconds_now();
#define KILN_DP(i) c[i] = _mm512_dpbf16_ps(c[i], xb, yb);
#define KILN_FMA(i) c[i] = _mm512_fmadd_ps(x, y, c[i]);
  if (bf16)
    for (int64_t i = 0; i < n; i++) {
      KILN_CHAINS16(KILN_DP)
      __asm__ volatile("" : "+v"(xb), "+v"(yb));
    }
  else
    for (int64_t i = 0; i < n; i++) {
      KILN_CHAINS16(KILN_FMA)
      __asm__ volatile("" : "+v"(x), "+v"(y));
    }
#undef KILN_DP
#undef KILN_FMA
  t = seconds_now() - t;
  __m512 s = c[0];
  for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, c[i]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return t;
}
#undef KILN_CHAINS16
static int bf16_fast;
static double bf16_dp_s, bf16_fma_s;
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;
static void bf16_measure(void) {
  if (!kiln_cpu_has("avx512_bf16") || !kiln_cpu_has("avx512f")) return;
  double dp = 1e9, fma = 1e9;
  for (int r = 0; r < 7; r++) {
    double a = time_chains(1, 2048), b = time_chains(0, 2048);
    if (a < dp) dp = a;
    if (b < fma) fma = b;
  }
  bf16_dp_s = dp;
  bf16_fma_s = fma;
  bf16_fast = dp <= 1.5 * fma;
}
int kiln_cpu_bf16_fast(void) {
  pthread_once(&bf16_once, bf16_measure);
  return bf16_fast;
}
#else
int kiln_cpu_bf16_fast(void) { return 0; }
static double bf16_dp_s, bf16_fma_s;
#endif

/* What multiplies bf16 in kiln's own kernels. */
static const char *bf16_products_own(void) {
  static char what[200];
  const char *e = getenv("KILN_BF16_EMULATE");
  if (!kiln_cpu_has("avx512_bf16")) return "f32 FMAs on the widened values (no AVX512-BF16)";
  if (e && strcmp(e, "1") == 0) return "f32 FMAs on the widened values (KILN_BF16_EMULATE=1)";
  if (e && strcmp(e, "0") == 0) return "vdpbf16ps (AVX512-BF16; KILN_BF16_EMULATE=0)";
  int fast = kiln_cpu_bf16_fast();
  snprintf(what, sizeof what, "%s (vdpbf16ps takes %.2fx an f32 FMA's time here)",
           fast ? "vdpbf16ps (AVX512-BF16)"
                : "matrix products and the recurrent layers' steps by f32 FMAs on the widened values",
           bf16_fma_s > 0 ? bf16_dp_s / bf16_fma_s : 0.0);
  return what;
}

/* What computes bf16 products (autocast's on the CPU), for kiln.info() and kiln --version. */
KILN_API const char *kiln_cpu_bf16_products(void) {
  static char with_onednn[300];
  if (kiln_cpu_onednn_matmul_wanted()) {   /* matrix products by oneDNN (AMX), the recurrent steps as below */
    const char *rest = bf16_products_own();
    snprintf(with_onednn, sizeof with_onednn, "matrix products by oneDNN's matmul (%s); the rest: %s",
             kiln_cpu_onednn_matmul_impl(), rest);
    return with_onednn;
  }
  return bf16_products_own();
}

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
