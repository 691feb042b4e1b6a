/* kiln/device.h: where a tensor lives ("cpu", "cuda:0").
   Every op runs on its inputs' device through that device's backend table. */
#ifndef KILN_DEVICE_H
#define KILN_DEVICE_H
#include <stdint.h>

enum kiln_device_type {
  KILN_CPU = 0,
  KILN_CUDA = 1,
  KILN_DEVICE_TYPE_COUNT = 2
};

struct kiln_device {
  int32_t type;   /* enum kiln_device_type */
  int32_t index;  /* 0 for the CPU */
};

/* "cpu", "cuda", "cuda:1" -> *out; KILN_ERR_ARGUMENT for anything else. */
int kiln_device_parse(const char *name, struct kiln_device *out);
/* "cpu", "cuda:1" (a per-thread buffer, valid until the next call). */
const char *kiln_device_name(struct kiln_device device);
/* 1 when the device exists and its backend is loaded, else 0. */
int kiln_device_available(struct kiln_device device);

#endif
