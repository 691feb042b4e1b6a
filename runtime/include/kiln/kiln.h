/* kiln/kiln.h: the whole public API of libkiln, in the order the FFI loader reads it.
   Each header stays in the C subset that LuaJIT's ffi.cdef accepts. */
#ifndef KILN_H
#define KILN_H
#include <kiln/error.h>
#include <kiln/dtype.h>
#include <kiln/device.h>
#include <kiln/memory.h>
#include <kiln/cuda.h>
#include <kiln/parallel.h>
#include <kiln/system.h>
#include <kiln/tensor.h>
#include <kiln/random.h>
#include <kiln/ops.h>
#include <kiln/autograd.h>
#include <kiln/nn.h>
#include <kiln/rnn.h>
#include <kiln/optim.h>
#include <kiln/io.h>
#include <kiln/loader.h>
#include <kiln/audio.h>
#include <kiln/dist.h>

/* The public headers above, concatenated as they are on disk (the FFI loader strips their
   preprocessor lines and feeds the rest to ffi.cdef). */
const char *kiln_cdefs(void);

#endif
