/* nn.c: the front ends of the fused neural-network ops and their derivatives. */
#include "internal.h"

int kiln_nn_derivative(struct kiln_node *n, struct kiln_tensor *g, struct kiln_tensor **gin) {
  (void)g; (void)gin;
  return kiln_fail(KILN_ERR_UNSUPPORTED, "backward: no derivative for %s", kiln_op_name(n->kind));
}
