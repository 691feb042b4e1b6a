/* error.c: the per-thread error buffer behind kiln_error_message(). */
#include "internal.h"
#include <stdarg.h>
#include <stdio.h>

static _Thread_local char error_buffer[1024];
static _Thread_local int error_code;

int kiln_fail(int code, const char *fmt, ...) {
  char tmp[sizeof error_buffer];   /* fmt's arguments may point into error_buffer */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  snprintf(error_buffer, sizeof error_buffer, "%s", tmp);
  error_code = code;
  return code;
}

KILN_API const char *kiln_error_message(void) { return error_buffer; }
KILN_API int kiln_error_code(void) { return error_code; }
KILN_API void kiln_error_clear(void) { error_buffer[0] = 0; error_code = 0; }

KILN_API const char *kiln_version(void) { return KILN_VERSION_STRING; }
KILN_API int kiln_api_version(void) { return KILN_API_VERSION; }
