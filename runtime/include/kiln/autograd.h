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

/* Custom functions whose derivative runs in the caller (kiln.autograd.Function in Lua): C never
   calls back into the caller. kiln_function_record makes a node over the inputs that require grad
   and gives each output (NULL entries: not differentiable) a grad_fn leading to it; the caller
   keeps what its derivative needs under id. A backward through such a node runs as a walk the
   caller steps: kiln_backward_step returns with *function_id set when the walk reaches a function
   node; the caller reads the grads of its outputs (kiln_backward_output_grad: a new reference, or
   NULL when none reached that output), gives the grads of its inputs (kiln_backward_input_grad,
   each the input's sizes), and steps again; *function_id 0 means the walk is done. Every walk
   ends with kiln_backward_end, also after an error. kiln_backward itself refuses such a graph.
   kiln_function_released hands out (up to cap) the ids of function nodes freed since the last
   call, so the caller can drop what it kept; kiln_function_nodes_live counts those alive. */
struct kiln_backward_walk;
int kiln_function_record(int64_t id, const char *name, int nin, struct kiln_tensor *const *inputs, int nout,
                         struct kiln_tensor *const *outputs);
int64_t kiln_function_nodes_live(void);
int kiln_function_released(int64_t *ids, int cap);
struct kiln_backward_walk *kiln_backward_start(struct kiln_tensor *t, const struct kiln_tensor *grad, int retain_graph);
int kiln_backward_step(struct kiln_backward_walk *w, int64_t *function_id);
struct kiln_tensor *kiln_backward_output_grad(struct kiln_backward_walk *w, int k);
int kiln_backward_input_grad(struct kiln_backward_walk *w, int k, const struct kiln_tensor *grad);
void kiln_backward_end(struct kiln_backward_walk *w);

/* An in-place op on a tensor with history (t:relu_() after a layer), as the caller runs it: r is
   the op's result computed out of place (and recorded); t takes r's values and r's history, so that
   backward goes through the op. Tensors r's node saved that share t's storage are copied first, so
   they keep the values the derivative needs. When t is a view (t->base), its base takes the change
   too, as PyTorch's CopySlices does: the base's history becomes the old one outside t's region and
   r's inside, and t's a view of that. Refused for a leaf that requires grad and for a view of one
   (change those under no_grad), for a view whose elements share memory (an expand), and for a view
   taken under no_grad of a tensor that requires grad. */
int kiln_autograd_assign(struct kiln_tensor *t, struct kiln_tensor *r, const char *op);
/* Brings a view up to date: when an in-place op changed its base's history since the view's own
   was derived (through the base or another view of it), the view's history becomes the base's,
   viewed (PyTorch regenerates a view's grad_fn the same way). Ops do this for their inputs; call it
   before reading t->requires_grad or t->grad_fn of a view (t->base) directly. */
int kiln_autograd_refresh(struct kiln_tensor *t);

/* A view of t that shares its storage but not its history. */
struct kiln_tensor *kiln_detach(const struct kiln_tensor *t);
/* Replace t's grad (NULL clears it). */
int kiln_set_grad(struct kiln_tensor *t, const struct kiln_tensor *grad);

#endif
