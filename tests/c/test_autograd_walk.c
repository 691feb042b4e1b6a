/* test_autograd_walk.c: the stepped backward walk (kiln_backward_start/step/end) through a custom
   function node, run here as its caller would (the derivative of exp, written by hand), and
   kiln_autograd_assign (an in-place op recorded by its caller), also on views, whose base takes the
   change (CopySlices); under ASan, nothing leaks. */
#include "check.h"

static const struct kiln_device cpu = {KILN_CPU, 0};

static struct kiln_tensor *vec(const double *v, int n, int requires_grad) {
  int64_t sizes[1] = {n};
  struct kiln_tensor *t = kiln_tensor_full(1, sizes, 0, KILN_F64, cpu);
  for (int i = 0; i < n; i++) kiln_tensor_set(t, i, v[i]);
  if (requires_grad) kiln_requires_grad_(t, 1);
  return t;
}

/* y = x * 2; z = F(y) with F = exp as a custom function (id 7); backward of z with grad ones:
   x.grad = 2 exp(2x), the function's derivative given by this caller. */
static void function_walk(void) {
  const double xs[3] = {-0.5, 0.25, 1.0};
  struct kiln_tensor *x = vec(xs, 3, 1);
  struct kiln_tensor *y = kiln_binary_scalar(KILN_OP_MUL, x, 2.0, 0);
  int prev = kiln_set_grad_enabled(0);
  struct kiln_tensor *z = kiln_unary(KILN_OP_EXP, y);
  kiln_set_grad_enabled(prev);
  struct kiln_tensor *ins[1] = {y}, *outs[1] = {z};
  CHECK(kiln_function_record(7, "MyExp", 1, ins, 1, outs) == 0);
  CHECK(z->requires_grad && z->grad_fn != NULL);
  CHECK(strcmp(kiln_grad_fn_name(z), "MyExpBackward") == 0);
  CHECK(kiln_function_nodes_live() == 1);
  int64_t sizes[1] = {3};
  struct kiln_tensor *ones = kiln_tensor_full(1, sizes, 1.0, KILN_F64, cpu);

  /* the C backward cannot run it */
  CHECK_ERR(kiln_backward(z, ones, 1), "MyExp, a function whose derivative runs in Lua");

  /* a walk left at the function node, then ended: the graph is clean for the next one */
  struct kiln_backward_walk *w = kiln_backward_start(z, ones, 1);
  int64_t id = -1;
  CHECK(w != NULL && kiln_backward_step(w, &id) == 0 && id == 7);
  kiln_backward_end(w);

  w = kiln_backward_start(z, ones, 0);
  CHECK(kiln_backward_step(w, &id) == 0 && id == 7);
  struct kiln_tensor *g = kiln_backward_output_grad(w, 0);
  CHECK(g != NULL && kiln_tensor_get(g, 1) == 1.0);
  struct kiln_tensor *scalar = kiln_tensor_full(0, sizes, 1, KILN_F64, cpu);
  CHECK_ERR(kiln_backward_input_grad(w, 0, scalar), "the grad of input 1 is [], but the input is [3]");
  kiln_tensor_release(scalar);
  struct kiln_tensor *gy = kiln_binary(KILN_OP_MUL, g, z);   /* d exp(y) / dy = exp(y) = z */
  CHECK(kiln_backward_input_grad(w, 0, gy) == 0);
  CHECK(kiln_backward_step(w, &id) == 0 && id == 0);
  kiln_backward_end(w);
  for (int i = 0; i < 3; i++) CHECK_NEAR(kiln_tensor_get(x->grad, i), 2 * exp(2 * xs[i]), 1e-12);

  /* used without retain_graph: a second walk is refused, saying how to keep it */
  w = kiln_backward_start(z, ones, 0);
  CHECK_ERR(kiln_backward_step(w, &id), "retain_graph");
  kiln_backward_end(w);

  /* the node is freed with its outputs, and its id handed back */
  kiln_tensor_release(g);
  kiln_tensor_release(gy);
  kiln_tensor_release(z);
  int64_t released[4];
  CHECK(kiln_function_nodes_live() == 0);
  CHECK(kiln_function_released(released, 4) == 1 && released[0] == 7);
  CHECK(kiln_function_released(released, 4) == 0);
  kiln_tensor_release(ones);
  kiln_tensor_release(y);
  kiln_tensor_release(x);
}

/* h = x * 3; h takes relu(h) in place (kiln_autograd_assign): x.grad = 3 where x > 0. A saved
   tensor of h's storage (exp's output) changed that way is refused at backward, naming it. */
static void assign_in_place(void) {
  const double xs[4] = {-1, 2, -3, 4};
  struct kiln_tensor *x = vec(xs, 4, 1);
  struct kiln_tensor *h = kiln_binary_scalar(KILN_OP_MUL, x, 3.0, 0);
  struct kiln_tensor *r = kiln_unary(KILN_OP_RELU, h);
  CHECK(kiln_autograd_assign(h, r, "relu_") == 0);
  CHECK(strcmp(kiln_grad_fn_name(h), "ReluBackward") == 0);
  CHECK(kiln_tensor_get(h, 0) == 0 && kiln_tensor_get(h, 1) == 6);
  int64_t sizes[1] = {4};
  struct kiln_tensor *ones = kiln_tensor_full(1, sizes, 1.0, KILN_F64, cpu);
  CHECK(kiln_backward(h, ones, 0) == 0);
  const double want[4] = {0, 3, 0, 3};
  for (int i = 0; i < 4; i++) CHECK_NEAR(kiln_tensor_get(x->grad, i), want[i], 0);

  struct kiln_tensor *e = kiln_unary(KILN_OP_EXP, x);          /* exp saves its output */
  struct kiln_tensor *re = kiln_unary(KILN_OP_RELU, e);
  CHECK(kiln_autograd_assign(e, re, "relu_") == 0);
  CHECK_ERR(kiln_backward(e, ones, 0), "exp saved its output [4] for its derivative, and it was changed in place");
  CHECK_ERR(kiln_autograd_assign(x, r, "add_"), "a leaf that requires grad");
  kiln_tensor_release(re);
  kiln_tensor_release(e);
  kiln_tensor_release(ones);
  kiln_tensor_release(r);
  kiln_tensor_release(h);
  kiln_tensor_release(x);
}

/* out = zeros(2, 3), no history; out[0] takes x * 2 through a view (as copy_ does): out takes that
   history, and backward of out reaches x. A row viewed before the write follows it; writing into a
   view of a leaf that requires grad is refused. Everything is released (ASan). */
static void assign_view(void) {
  const double xs[3] = {1, 2, 3};
  struct kiln_tensor *x = vec(xs, 3, 1);
  int64_t sizes[2] = {2, 3};
  struct kiln_tensor *out = kiln_tensor_full(2, sizes, 0, KILN_F64, cpu);
  struct kiln_tensor *row1 = kiln_select(out, 0, 1);       /* taken before the writes */
  struct kiln_tensor *row0 = kiln_select(out, 0, 0);
  CHECK(row0->base == out && row1->base == out && !row0->grad_fn && out->refcount == 3);
  struct kiln_tensor *r = kiln_binary_scalar(KILN_OP_MUL, x, 2.0, 0);
  CHECK(kiln_autograd_assign(row0, r, "copy_") == 0);
  CHECK(out->requires_grad && strcmp(kiln_grad_fn_name(out), "CopySlices") == 0);
  CHECK(strcmp(kiln_grad_fn_name(row0), "AsStridedBackward") == 0);
  CHECK(kiln_tensor_get(out, 2) == 6 && kiln_tensor_get(out, 3) == 0);
  /* the second row: r2 = row1 + x * x, written back through row1, whose history was stale */
  CHECK(!row1->requires_grad);
  struct kiln_tensor *xx = kiln_binary(KILN_OP_MUL, x, x);
  struct kiln_tensor *r2 = kiln_binary(KILN_OP_ADD, row1, xx);   /* refreshes row1: a view of out's history */
  CHECK(row1->requires_grad && strcmp(kiln_grad_fn_name(row1), "AsStridedBackward") == 0);
  CHECK(kiln_autograd_assign(row1, r2, "add_") == 0);
  struct kiln_tensor *ones = kiln_tensor_full(2, sizes, 1.0, KILN_F64, cpu);
  CHECK(kiln_backward(out, ones, 0) == 0);
  for (int i = 0; i < 3; i++) CHECK_NEAR(kiln_tensor_get(x->grad, i), 2 + 2 * xs[i], 0);
  /* a view of a leaf that requires grad */
  struct kiln_tensor *xv = kiln_narrow(x, 0, 1, 2);
  struct kiln_tensor *r3 = kiln_binary_scalar(KILN_OP_MUL, xv, 2.0, 0);
  CHECK_ERR(kiln_autograd_assign(xv, r3, "mul_"), "a view of a leaf that requires grad (a parameter [3])");
  kiln_tensor_release(r3);
  kiln_tensor_release(xv);
  kiln_tensor_release(ones);
  kiln_tensor_release(r2);
  kiln_tensor_release(xx);
  kiln_tensor_release(r);
  kiln_tensor_release(row0);
  kiln_tensor_release(out);
  CHECK(row1->base->refcount == 1);   /* the last view holds the base */
  kiln_tensor_release(row1);
  kiln_tensor_release(x);
}

int main(void) {
  function_walk();
  assign_in_place();
  assign_view();
  return check_done("test_autograd_walk");
}
