/* cpu/cpu.h: the CPU kernels that cpu/backend.c puts in the op table. */
#ifndef KILN_CPU_H
#define KILN_CPU_H
#include "../internal.h"

int cpu_elementwise(const struct kiln_call *c);
int cpu_copy(const struct kiln_call *c);
int cpu_fill(const struct kiln_call *c);
int cpu_reduce(const struct kiln_call *c);
int cpu_gemm(const struct kiln_call *c);
int cpu_cat(const struct kiln_call *c);
int cpu_index_select(const struct kiln_call *c);
int cpu_gather(const struct kiln_call *c);
int cpu_scatter_add(const struct kiln_call *c);
int cpu_masked_fill(const struct kiln_call *c);
int cpu_masked_select(const struct kiln_call *c);
int cpu_random(const struct kiln_call *c);

#endif
