/* grad_mode.c: whether ops record autograd history on this thread: no_grad's depth, and inside a
   kernel (dispatch brackets every kernel, so ops a kernel runs internally record nothing). */
#include "internal.h"

static _Thread_local int grad_off;      /* no_grad depth */
static _Thread_local int kernel_depth;  /* inside a kernel: record nothing */

void kiln_kernel_enter(void) { kernel_depth++; }
void kiln_kernel_leave(void) { kernel_depth--; }

KILN_API int kiln_set_grad_enabled(int enabled) {
  int prev = !grad_off;
  grad_off = !enabled;
  return prev;
}
KILN_API int kiln_grad_enabled(void) { return !grad_off; }
int kiln_autograd_active(void) { return !grad_off && kernel_depth == 0; }
