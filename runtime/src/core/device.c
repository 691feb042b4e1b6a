/* device.c: devices by name: "cpu", "cuda", "cuda:N". */
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

KILN_API int kiln_device_parse(const char *name, struct kiln_device *out) {
  if (!name || !out) return kiln_fail(KILN_ERR_ARGUMENT, "device: no name given");
  if (strcmp(name, "cpu") == 0) { *out = (struct kiln_device){KILN_CPU, 0}; return KILN_OK; }
  if (strncmp(name, "cuda", 4) == 0) {
    const char *rest = name + 4;
    if (*rest == 0) { *out = (struct kiln_device){KILN_CUDA, 0}; return KILN_OK; }
    if (*rest == ':' && rest[1]) {
      char *end;
      long idx = strtol(rest + 1, &end, 10);
      if (*end == 0 && idx >= 0 && idx < 1024) { *out = (struct kiln_device){KILN_CUDA, (int32_t)idx}; return KILN_OK; }
    }
  }
  return kiln_fail(KILN_ERR_ARGUMENT, "device: unknown device \"%s\" (expected \"cpu\", \"cuda\" or \"cuda:N\")", name);
}

KILN_API const char *kiln_device_name(struct kiln_device device) {
  static _Thread_local char bufs[2][32];
  static _Thread_local int next;
  char *b = bufs[next++ & 1];
  if (device.type == KILN_CPU) snprintf(b, 32, "cpu");
  else if (device.type == KILN_CUDA) snprintf(b, 32, "cuda:%d", (int)device.index);
  else snprintf(b, 32, "device(%d:%d)", (int)device.type, (int)device.index);
  return b;
}
