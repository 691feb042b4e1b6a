/* system.c: the CPU's features, read once with cpuid, and the BLAS, loaded once with dlopen.

   OpenBLAS picks its kernels when it is loaded, from the CPU model it knows. A build older than
   the CPU (Debian 12's 0.3.21 on an Emerald Rapids Xeon) falls back to its generic SSE3 kernels,
   4-5x slower than the AVX-512 ones the CPU runs. libkiln does not link OpenBLAS: it loads it
   when libkiln itself is loaded, asks which core it chose, and when that core is generic on a CPU
   with AVX2, loads it again with OPENBLAS_CORETYPE naming the best core for the CPU's features.
   An OPENBLAS_CORETYPE set by the user is kept. The launcher and a stock luajit take the same
   path, since both reach here through libkiln's constructor. */
#define _GNU_SOURCE
#include "internal.h"
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KILN_X86 1
#endif

/* ---- the CPU ---- */

static struct {
  char vendor[13];
  char name[49];
  int family, model;
  char features[256];
} cpu;

static void add_feature(const char *name, int present) {
  if (!present) return;
  size_t n = strlen(cpu.features);
  snprintf(cpu.features + n, sizeof cpu.features - n, "%s%s", n ? " " : "", name);
}

#ifdef KILN_X86
static unsigned long long xgetbv0(void) {
  unsigned int lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}
#endif

static void cpu_read(void) {
  strcpy(cpu.vendor, "unknown");
  strcpy(cpu.name, "unknown");
#ifdef KILN_X86
  unsigned int a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return;
  unsigned int max_leaf = a;
  memcpy(cpu.vendor, &b, 4);
  memcpy(cpu.vendor + 4, &d, 4);
  memcpy(cpu.vendor + 8, &c, 4);
  cpu.vendor[12] = 0;
  __get_cpuid(1, &a, &b, &c, &d);
  unsigned int ecx1 = c, edx1 = d;
  int base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  cpu.family = base_family == 0xf ? base_family + (int)((a >> 20) & 0xff) : base_family;
  cpu.model = base_family == 0x6 || base_family == 0xf ? base_model + (int)(((a >> 16) & 0xf) << 4) : base_model;
  unsigned int b7 = 0, c7 = 0, d7 = 0, a71 = 0;
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b7, c7, d7);
    if (a >= 1) __cpuid_count(7, 1, a71, b, c, d);
  }
  /* What the operating system saves on a context switch: the SSE and AVX registers (bits 1-2),
     the AVX-512 ones (5-7) and the AMX tiles (17-18). */
  unsigned long long xcr0 = (ecx1 >> 27) & 1 ? xgetbv0() : 0;
  int os_avx = (xcr0 & 0x6) == 0x6, os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
  int os_amx = (xcr0 & 0x60000) == 0x60000;
  add_feature("sse2", (edx1 >> 26) & 1);
  add_feature("sse3", ecx1 & 1);
  add_feature("ssse3", (ecx1 >> 9) & 1);
  add_feature("sse4.1", (ecx1 >> 19) & 1);
  add_feature("sse4.2", (ecx1 >> 20) & 1);
  add_feature("popcnt", (ecx1 >> 23) & 1);
  add_feature("avx", os_avx && ((ecx1 >> 28) & 1));
  add_feature("f16c", os_avx && ((ecx1 >> 29) & 1));
  add_feature("fma", os_avx && ((ecx1 >> 12) & 1));
  add_feature("avx2", os_avx && ((b7 >> 5) & 1));
  unsigned int ecx81 = 0;
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000001) __get_cpuid(0x80000001, &a, &b, &ecx81, &d);
  add_feature("bmi1", (b7 >> 3) & 1);
  add_feature("bmi2", (b7 >> 8) & 1);
  add_feature("lzcnt", (ecx81 >> 5) & 1);
  add_feature("movbe", (ecx1 >> 22) & 1);
  add_feature("avx_vnni", os_avx && ((a71 >> 4) & 1));
  add_feature("avx512f", os_avx512 && ((b7 >> 16) & 1));
  add_feature("avx512dq", os_avx512 && ((b7 >> 17) & 1));
  add_feature("avx512cd", os_avx512 && ((b7 >> 28) & 1));
  add_feature("avx512bw", os_avx512 && ((b7 >> 30) & 1));
  add_feature("avx512vl", os_avx512 && ((b7 >> 31) & 1));
  add_feature("avx512_vnni", os_avx512 && ((c7 >> 11) & 1));
  add_feature("avx512_bf16", os_avx512 && ((a71 >> 5) & 1));
  add_feature("avx512_fp16", os_avx512 && ((d7 >> 23) & 1));
  add_feature("amx_tile", os_amx && ((d7 >> 24) & 1));
  add_feature("amx_bf16", os_amx && ((d7 >> 22) & 1));
  add_feature("amx_int8", os_amx && ((d7 >> 25) & 1));
  unsigned int brand[12];
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
    for (unsigned int i = 0; i < 3; i++)
      __get_cpuid(0x80000002 + i, &brand[4 * i], &brand[4 * i + 1], &brand[4 * i + 2], &brand[4 * i + 3]);
    memcpy(cpu.name, brand, 48);
    cpu.name[48] = 0;
    char *s = cpu.name;   /* brand strings are padded with spaces at either end */
    while (*s == ' ') s++;
    memmove(cpu.name, s, strlen(s) + 1);
    for (size_t n = strlen(cpu.name); n > 0 && cpu.name[n - 1] == ' '; n--) cpu.name[n - 1] = 0;
  }
#endif
}

KILN_API int kiln_cpu_has(const char *feature) {
  if (!feature || !*feature) return 0;
  size_t n = strlen(feature);
  for (const char *p = cpu.features; (p = strstr(p, feature)) != NULL; p += n)
    if ((p == cpu.features || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
  return 0;
}

KILN_API const char *kiln_cpu_name(void) { return cpu.name; }
KILN_API const char *kiln_cpu_vendor(void) { return cpu.vendor; }
KILN_API int kiln_cpu_family(void) { return cpu.family; }
KILN_API int kiln_cpu_model(void) { return cpu.model; }
KILN_API const char *kiln_cpu_features(void) { return cpu.features; }

/* ---- the BLAS ---- */

static struct {
  void *handle;
  kiln_sgemm_fn sgemm;
  kiln_dgemm_fn dgemm;
  char *(*corename)(void);
  char *(*config)(void);
  int state;
  char core[64];
  char note[320];
} blas;

/* The GEMM when OpenBLAS is missing: row-major only, as kiln calls it. Correct and slow. */
#define PLAIN_GEMM(T, sfx)                                                                                   \
  static void plain_##sfx(int order, int ta, int tb, int m, int n, int k, T alpha, const T *a, int lda,    \
                          const T *b, int ldb, T beta, T *c, int ldc) {                                    \
    (void)order;                                                                                           \
    for (int i = 0; i < m; i++)                                                                            \
      for (int j = 0; j < n; j++) {                                                                        \
        T s = 0;                                                                                           \
        for (int p = 0; p < k; p++)                                                                        \
          s += (ta == KILN_BLAS_NO_TRANS ? a[i * lda + p] : a[p * lda + i]) *                              \
               (tb == KILN_BLAS_NO_TRANS ? b[p * ldb + j] : b[j * ldb + p]);                               \
        c[i * ldc + j] = alpha * s + (beta == 0 ? 0 : beta * c[i * ldc + j]);                              \
      }                                                                                                    \
  }
PLAIN_GEMM(float, sgemm)
PLAIN_GEMM(double, dgemm)

static int blas_open(void) {
  const char *names[] = {"libopenblas.so.0", "libopenblas.so"};
  /* OpenBLAS starts its own server threads when it loads, one per core but one, unless
     OPENBLAS_NUM_THREADS says 1; kiln only ever calls it single-threaded, and an idle server thread
     still wakes to yield (a few percent of a core, taken from kiln's pool). Said for the load
     only, unless the user set it: processes kiln starts see the environment they had. */
  const char *nt = getenv("OPENBLAS_NUM_THREADS");
  int set_nt = !nt || !*nt;
  if (set_nt) setenv("OPENBLAS_NUM_THREADS", "1", 1);
  for (size_t i = 0; i < sizeof names / sizeof *names && !blas.handle; i++)
    blas.handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (set_nt) unsetenv("OPENBLAS_NUM_THREADS");
  if (!blas.handle) return -1;
  blas.sgemm = (kiln_sgemm_fn)dlsym(blas.handle, "cblas_sgemm");
  blas.dgemm = (kiln_dgemm_fn)dlsym(blas.handle, "cblas_dgemm");
  blas.corename = (char *(*)(void))dlsym(blas.handle, "openblas_get_corename");
  blas.config = (char *(*)(void))dlsym(blas.handle, "openblas_get_config");
  void (*set_threads)(int) = (void (*)(int))dlsym(blas.handle, "openblas_set_num_threads");
  if (!blas.sgemm || !blas.dgemm) {
    dlclose(blas.handle);
    blas.handle = NULL;
    return -1;
  }
  if (set_threads) set_threads(1);   /* OpenBLAS runs inside kiln's pool, never in a pool of its own */
  snprintf(blas.core, sizeof blas.core, "%s", blas.corename ? blas.corename() : "unknown");
  return 0;
}

/* OpenBLAS's cores whose kernels use AVX2 or AVX-512: on a CPU with AVX2, any other is generic. */
static int core_is_generic(const char *core) {
  const char *good[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    if (strcasecmp(core, good[i]) == 0) return 0;
  return 1;
}

/* The best OpenBLAS core for this CPU's features ("" when the CPU has no AVX2). */
static const char *best_core(void) {
  if (kiln_cpu_has("avx512f") && kiln_cpu_has("avx512bw") && kiln_cpu_has("avx512vl") && kiln_cpu_has("avx512dq") &&
      kiln_cpu_has("avx512cd"))
    return kiln_cpu_has("avx512_bf16") ? "Cooperlake" : "SkylakeX";
  if (kiln_cpu_has("avx2") && kiln_cpu_has("fma")) return strcmp(cpu.vendor, "AuthenticAMD") == 0 ? "Zen" : "Haswell";
  return "";
}

/* The features (kiln_cpu_has's names) that an OpenBLAS core's kernels need and this CPU lacks,
   into out ("" for a core whose needs kiln does not know, or that this CPU runs). */
static void core_lacks(const char *core, char *out, size_t size) {
  static const struct { const char *core, *needs; } cores[] = {
    {"Haswell", "avx2 fma"}, {"Zen", "avx2 fma"},
    {"SkylakeX", "avx512f avx512bw avx512vl avx512dq avx512cd"},
    {"Cooperlake", "avx512f avx512bw avx512vl avx512dq avx512cd avx512_bf16"},
    {"SapphireRapids", "avx512f avx512bw avx512vl avx512dq avx512cd avx512_bf16"},
  };
  out[0] = 0;
  for (size_t i = 0; i < sizeof cores / sizeof *cores; i++) {
    if (strcasecmp(core, cores[i].core) != 0) continue;
    char name[32];
    for (const char *p = cores[i].needs; *p;) {
      size_t n = strcspn(p, " ");
      snprintf(name, sizeof name, "%.*s", (int)n, p);
      if (!kiln_cpu_has(name)) snprintf(out + strlen(out), size - strlen(out), "%s%s", out[0] ? " " : "", name);
      p += n + (p[n] == ' ');
    }
  }
}

static void blas_choose(void) {
  const char *env = getenv("OPENBLAS_CORETYPE");
  int user_set = env && *env;
  const char *best = best_core();
  /* KILN_BLAS_TEST_GENERIC=1 (tests only): the first load gets OpenBLAS's generic Prescott kernels,
     as an unknown CPU would, so that the correction below runs for real. */
  const char *test = getenv("KILN_BLAS_TEST_GENERIC");
  int forced = !user_set && test && strcmp(test, "1") == 0;
  if (forced) setenv("OPENBLAS_CORETYPE", "Prescott", 1);
  if (blas_open() != 0) {
    snprintf(blas.note, sizeof blas.note, "OpenBLAS could not be loaded (%s): the GEMM runs on kiln's plain loops, "
             "many times slower; install Debian's libopenblas0", dlerror());
    blas.sgemm = plain_sgemm;
    blas.dgemm = plain_dgemm;
    strcpy(blas.core, "none");
    blas.state = KILN_BLAS_MISSING;
    if (forced) unsetenv("OPENBLAS_CORETYPE");
    return;
  }
  if (!*best || !core_is_generic(blas.core)) {
    blas.state = user_set ? KILN_BLAS_FROM_ENV : KILN_BLAS_DETECTED;
    if (user_set)
      snprintf(blas.note, sizeof blas.note, "OPENBLAS_CORETYPE=%s was set before kiln started, and kiln kept it", env);
    return;
  }
  if (user_set) {
    blas.state = KILN_BLAS_GENERIC;
    snprintf(blas.note, sizeof blas.note, "OpenBLAS runs its generic %s kernels because OPENBLAS_CORETYPE=%s is set; "
             "this CPU runs %s's, several times faster (unset OPENBLAS_CORETYPE to let kiln choose)", blas.core, env, best);
    return;
  }
  /* A generic core that nobody asked for: load OpenBLAS again with the best core named. */
  char was[64];
  snprintf(was, sizeof was, "%s", blas.core);
  dlclose(blas.handle);
  blas.handle = NULL;
  setenv("OPENBLAS_CORETYPE", best, 1);
  if (blas_open() != 0 || core_is_generic(blas.core)) {
    snprintf(blas.note, sizeof blas.note, "OpenBLAS chose its generic %s kernels on this CPU and kept them with "
             "OPENBLAS_CORETYPE=%s: the GEMM runs several times slower than it could", was, best);
    if (!blas.handle) {
      blas.sgemm = plain_sgemm;
      blas.dgemm = plain_dgemm;
      strcpy(blas.core, "none");
    }
    blas.state = KILN_BLAS_GENERIC;
    return;
  }
  blas.state = KILN_BLAS_CORRECTED;
  snprintf(blas.note, sizeof blas.note, "OpenBLAS chose its generic %s kernels on this CPU; kiln loaded it again with "
           "OPENBLAS_CORETYPE=%s", was, best);
}

/* An OPENBLAS_CORETYPE naming kernels this CPU cannot run (an environment carried over from
   another machine) would stop the first GEMM on an illegal instruction: kiln unsets it and lets
   OpenBLAS, then itself, choose, and says so in the note. */
static void blas_load(void) {
  const char *env = getenv("OPENBLAS_CORETYPE");
  char dropped[160] = "", lacks[120];
  if (env && *env) {
    core_lacks(env, lacks, sizeof lacks);
    if (lacks[0]) {
      snprintf(dropped, sizeof dropped, "OPENBLAS_CORETYPE=%s names kernels this CPU cannot run (it lacks %s); kiln "
               "unset it", env, lacks);
      unsetenv("OPENBLAS_CORETYPE");
    }
  }
  blas_choose();
  if (dropped[0]) {
    char note[sizeof dropped + 2 + sizeof blas.note];
    snprintf(note, sizeof note, "%s%s%s", dropped, blas.note[0] ? "; " : "", blas.note);
    note[sizeof blas.note - 1] = 0;   /* cut to the note's size */
    memcpy(blas.note, note, sizeof blas.note);
  }
}

/* Before anything of libkiln runs: the launcher links libkiln, a stock luajit loads it with
   ffi.load; both run this first, while the process has one thread. cpu/backend.c's choice of the
   kernels' level (constructor 102) reads the features. */
__attribute__((constructor(101))) static void system_init(void) {
  cpu_read();
  blas_load();
}

KILN_API const char *kiln_blas_name(void) {
  if (blas.state == KILN_BLAS_MISSING || !blas.config) return "none";
  return blas.config();
}
KILN_API const char *kiln_blas_core(void) { return blas.core; }
KILN_API int kiln_blas_state(void) { return blas.state; }
KILN_API const char *kiln_blas_note(void) { return blas.note; }

/* No products (alpha 0 or k 0): C = beta C here, reading neither A nor B, and not C when beta is 0
   (it may hold NaN), as the reference BLAS does. OpenBLAS 0.3.21's SkylakeX and Cooperlake kernels
   multiply anyway, so that a NaN or an infinity in A or B reached C through 0 * inf. */
#define KILN_SCALE_ONLY(T)                                                                 \
  for (int i = 0; i < m; i++)                                                             \
    for (int j = 0; j < n; j++) c[(int64_t)i * ldc + j] = beta == 0 ? (T)0 : beta * c[(int64_t)i * ldc + j];
void kiln_sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                float beta, float *c, int ldc) {
  if (alpha == 0 || k <= 0) { KILN_SCALE_ONLY(float) return; }
  blas.sgemm(KILN_BLAS_ROW_MAJOR, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void kiln_dgemm(int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda, const double *b, int ldb,
                double beta, double *c, int ldc) {
  if (alpha == 0 || k <= 0) { KILN_SCALE_ONLY(double) return; }
  blas.dgemm(KILN_BLAS_ROW_MAJOR, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#undef KILN_SCALE_ONLY

/* ---- SIGTERM, caught on request ---- */

static volatile sig_atomic_t terminate_requested;

static void on_terminate(int sig) {
  (void)sig;
  terminate_requested = 1;
}

KILN_API int kiln_terminate_catch(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_terminate;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGTERM, &sa, NULL) != 0) return kiln_fail(KILN_ERR_STATE, "terminate_catch: sigaction failed");
  return KILN_OK;
}

KILN_API int kiln_terminate_requested(void) { return terminate_requested != 0; }
