/* kiln/autograd.h: reverse-mode automatic differentiation. An op on tensors that require grad
   records a node; kiln_backward walks the nodes in reverse and accumulates into leaves' grad. */
#ifndef KILN_AUTOGRAD_H
#define KILN_AUTOGRAD_H
#include <kiln/tensor.h>

/* Grad mode is per thread; when off (no_grad), ops record nothing. Returns the previous mode. */
int kiln_set_grad_enabled(int enabled);
int kiln_grad_enabled(void);

/* Mark a leaf (a tensor no recorded op made) as requiring grad; float dtypes only. */
int kiln_requires_grad_(struct kiln_tensor *t, int requires_grad);
int kiln_is_leaf(const struct kiln_tensor *t);
/* "MulBackward", or NULL for a leaf. */
const char *kiln_grad_fn_name(const struct kiln_tensor *t);

/* Accumulate d(t)/d(leaf) * grad into every leaf's grad. grad may be NULL when t has one element.
   Without retain_graph the saved tensors are freed as the walk passes, and a second backward
   through the same nodes is an error. */
int kiln_backward(struct kiln_tensor *t, const struct kiln_tensor *grad, int retain_graph);

/* A view of t that shares its storage but not its history. */
struct kiln_tensor *kiln_detach(const struct kiln_tensor *t);
/* Replace t's grad (NULL clears it). */
int kiln_set_grad(struct kiln_tensor *t, const struct kiln_tensor *grad);

#endif
