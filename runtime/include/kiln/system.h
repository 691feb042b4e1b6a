/* kiln/system.h: what kiln runs on: the CPU's features (read once with cpuid) and the level of
   kiln's kernels chosen from them, the BLAS behind the CPU's GEMM, with the kernels ("core") it
   uses and whether kiln had to correct its choice, and a SIGTERM a training loop may ask about
   instead of dying at once. */
#ifndef KILN_SYSTEM_H
#define KILN_SYSTEM_H
#include <stdint.h>

enum kiln_blas_state {
  KILN_BLAS_DETECTED = 0,   /* the BLAS chose kernels that suit this CPU */
  KILN_BLAS_CORRECTED = 1,  /* it chose generic kernels; kiln loaded it again with OPENBLAS_CORETYPE set */
  KILN_BLAS_FROM_ENV = 2,   /* OPENBLAS_CORETYPE was set before kiln started, and kiln kept it */
  KILN_BLAS_GENERIC = 3,    /* generic kernels on a CPU that runs better ones, and kiln could not fix it */
  KILN_BLAS_MISSING = 4     /* OpenBLAS could not be loaded: the GEMM runs on kiln's plain loops */
};

/* The CPU: its brand string, vendor ("GenuineIntel", "AuthenticAMD"), family and model as Linux
   prints them, and the features kiln uses, space-separated and in lower case ("avx2 fma avx512f ..."),
   counting only those the operating system has enabled. */
const char *kiln_cpu_name(void);
const char *kiln_cpu_vendor(void);
int kiln_cpu_family(void);
int kiln_cpu_model(void);
const char *kiln_cpu_features(void);
/* 1 when the CPU has the feature (a name from kiln_cpu_features), else 0. */
int kiln_cpu_has(const char *feature);
/* The instruction-set level of kiln's CPU kernels, chosen when libkiln is loaded: "avx512",
   "avx2" or "baseline", the highest this CPU runs, or the one KILN_CPU_LEVEL names ("native" in a
   build made with KILN_NATIVE). kiln_cpu_level_check fails, saying why, when KILN_CPU_LEVEL names
   a level this CPU lacks or this build does not have (the kernels then run at the highest level
   the CPU runs), or when the CPU lacks even the lowest level. */
const char *kiln_cpu_level(void);
int kiln_cpu_level_check(void);
/* What computes f32 matrix products: "kiln" (kiln's own kernel, the avx512 and avx2 levels: every
   product of 2 or more rows and 16 or more columns) or "blas"; KILN_SGEMM=kiln|blas forces it. */
const char *kiln_cpu_f32_gemm(void);
/* What computes bf16 products (autocast's on the CPU), in words: vdpbf16ps where the CPU has
   AVX512-BF16 and runs it faster than f32 FMAs (measured once, on the first call), else f32 FMAs on
   the widened values; KILN_BF16_EMULATE=1 or 0 forces one. */
const char *kiln_cpu_bf16_products(void);

/* The BLAS: its build string ("OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."), its core
   ("Haswell", "SkylakeX", "Prescott" ...), a kiln_blas_state, and one sentence on that state
   ("" when the BLAS chose well by itself). */
const char *kiln_blas_name(void);
const char *kiln_blas_core(void);
int kiln_blas_state(void);
const char *kiln_blas_note(void);

/* oneDNN, which kiln's f32 CPU convolutions use when libkiln_onednn.so and oneDNN load (on the
   first convolution): its name and version ("oneDNN 2.6.3"), NULL without it; and one sentence on
   what was loaded or why not. */
const char *kiln_onednn_name(void);
const char *kiln_onednn_note(void);
/* The CPU convolutions' algorithm per shape (docs/cpu.md): KILN_CONV_ALGO = auto (default),
   im2col or onednn; KILN_CONV_BENCHMARK=1 times both on a shape's first call and keeps the faster.
   Each shape run so far is one line ("forward x [64,32,12,12] w [64,32,5,5] ...: onednn
   jit:avx512_core"), i from 0 (the oldest) to kiln_conv_choice_count() - 1; the text lives until
   the thread's next call. kiln_conv_choices_clear forgets them (the next calls choose again). */
int64_t kiln_conv_choice_count(void);
const char *kiln_conv_choice(int64_t i);
void kiln_conv_choices_clear(void);

/* From kiln_terminate_catch() on, SIGTERM no longer ends the process: it sets a flag that
   kiln_terminate_requested() returns (1 after a SIGTERM), so that a training loop can finish its
   step, write a checkpoint and exit. Without the call, SIGTERM keeps its default action. */
int kiln_terminate_catch(void);
int kiln_terminate_requested(void);

#endif
