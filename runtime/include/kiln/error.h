/* kiln/error.h: status codes and the per-thread error message.
   A runtime call that fails returns a non-zero status (or NULL) and leaves a message here. */
#ifndef KILN_ERROR_H
#define KILN_ERROR_H

enum kiln_status {
  KILN_OK = 0,
  KILN_ERR_ARGUMENT = 1,   /* a bad argument: a dim out of range, a negative size */
  KILN_ERR_SHAPE = 2,      /* shapes that do not fit together */
  KILN_ERR_DTYPE = 3,      /* a dtype the op does not take */
  KILN_ERR_DEVICE = 4,     /* tensors on different devices, or a device that is absent */
  KILN_ERR_INDEX = 5,      /* an index out of range */
  KILN_ERR_MEMORY = 6,     /* an allocation failed */
  KILN_ERR_IO = 7,         /* a file could not be read or written */
  KILN_ERR_FORMAT = 8,     /* a malformed file */
  KILN_ERR_UNSUPPORTED = 9,/* an op not implemented on a device or dtype */
  KILN_ERR_STATE = 10      /* a freed tensor, a used-up graph */
};

/* The message of the last failure on this thread ("" when none). */
const char *kiln_error_message(void);
int kiln_error_code(void);
void kiln_error_clear(void);

/* "0.1.0" and the API version that backends loaded at run time must match. */
const char *kiln_version(void);
int kiln_api_version(void);

#endif
