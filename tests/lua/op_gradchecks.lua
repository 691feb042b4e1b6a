-- op_gradchecks.lua: one f64 gradient check per differentiable op of the op table, by op name:
-- a function of kiln giving the function to check and its inputs (f64, requiring grad, of odd
-- sizes; non-contiguous where the op reads strides). op_table_spec.lua runs every one, checks that
-- the output's grad_fn is the op's own, and fails when a differentiable op has none;
-- tools/ops_doc.lua lists them in docs/ops.md.
local function sizes(...) local s = {...} s[#s + 1] = {dtype = "f64"} return unpack(s) end
local function x64(kiln, ...) return kiln.randn(sizes(...)):requires_grad_() end
local function pos64(kiln, ...) return (kiln.rand(sizes(...)) + 0.5):requires_grad_() end
local function t64(kiln, a, b) return kiln.randn(b, a, {dtype = "f64"}):t():requires_grad_() end   -- transposed view

local function unary(method)
  return function(kiln) return function(a) return a[method](a) end, {t64(kiln, 3, 4)} end
end
local function unary_pos(method)
  return function(kiln) return function(a) return a[method](a) end, {pos64(kiln, 3, 4)} end
end
local function binary(method)
  return function(kiln) return function(a, b) return a[method](a, b) end, {t64(kiln, 3, 4), x64(kiln, 4)} end
end
local function reduce(method, ...)
  local args = {...}
  return function(kiln) return function(a) return a[method](a, unpack(args)) end, {t64(kiln, 3, 5)} end
end

local checks = {
  neg = unary("neg"), abs = unary("abs"), sin = unary("sin"), cos = unary("cos"), tanh = unary("tanh"),
  sigmoid = unary("sigmoid"), relu = unary("relu"), square = unary("square"), erf = unary("erf"), exp = unary("exp"),
  expm1 = unary("expm1"), sqrt = unary_pos("sqrt"), rsqrt = unary_pos("rsqrt"), log = unary_pos("log"),
  log1p = unary_pos("log1p"), reciprocal = unary_pos("reciprocal"),
  add = binary("add"), sub = binary("sub"), mul = binary("mul"), maximum = binary("maximum"), minimum = binary("minimum"),
  div = function(kiln) return function(a, b) return a / b end, {t64(kiln, 3, 4), pos64(kiln, 4)} end,
  pow = function(kiln) return function(a, b) return a ^ b end, {pos64(kiln, 3, 4), x64(kiln, 3, 4)} end,
  remainder = function(kiln) return function(a, b) return a % b end, {x64(kiln, 3, 4), (pos64(kiln, 4) + 1):detach():requires_grad_()} end,
  where = function(kiln)
    local cond = kiln.randn(3, 4):gt(0)
    return function(a, b) return kiln.where(cond, a, b) end, {x64(kiln, 3, 4), t64(kiln, 3, 4)}
  end,
  erfinv = function(kiln)
    return function(a) return a:erfinv() end, {(kiln.rand(4, 3, {dtype = "f64"}) * 1.6 - 0.8):t():requires_grad_()}
  end,
  atan2 = function(kiln) return function(a, b) return a:atan2(b) end, {t64(kiln, 3, 4), x64(kiln, 4)} end,
  relu_backward = function(kiln)
    -- linear in g; y (relu's output, no grad of its own) broadcast, with zeros and negatives
    local y = kiln.tensor({0.5, 0, -1, 2}, {dtype = "f64"})
    return function(g) return g:relu_backward(y) end, {t64(kiln, 3, 4)}
  end,
  cumsum = function(kiln) return function(a) return a:cumsum(2) end, {t64(kiln, 3, 5)} end,
  cumprod = function(kiln)
    -- a zero on purpose: the derivative must not divide by x
    local x = kiln.randn(5, 3, {dtype = "f64"})
    x[2][2] = 0
    return function(a) return a:cumprod(1) end, {x:t():requires_grad_()}
  end,
  clamp = function(kiln) return function(a) return a:clamp(-0.5, 0.7) end, {t64(kiln, 3, 4)} end,
  sum = reduce("sum", 2), mean = reduce("mean", 1), prod = reduce("prod", 2), var = reduce("var", 2),
  std = reduce("std", 1), norm = reduce("norm", 2, 2), logsumexp = reduce("logsumexp", 2),
  max = function(kiln) return function(a) return (a:max(2)) end, {t64(kiln, 3, 5)} end,
  min = function(kiln) return function(a) return a:min() end, {t64(kiln, 3, 5)} end,
  gemm = function(kiln)
    local b = kiln.randn(2, 5, 4, {dtype = "f64"}):transpose(2, 3):requires_grad_()   -- column-major matrices
    return function(x, y) return x:bmm(y) end, {x64(kiln, 2, 3, 4), b}
  end,
  cat = function(kiln) return function(a, b) return kiln.cat({a, b}, 2) end, {x64(kiln, 3, 2), t64(kiln, 3, 4)} end,
  index_select = function(kiln)
    local i = kiln.tensor({3, 1, 3}, {dtype = "i64"})
    return function(a) return a:index_select(1, i) end, {t64(kiln, 3, 4)}
  end,
  gather = function(kiln)
    local i = kiln.tensor({{1, 2}, {3, 3}, {2, 1}}, {dtype = "i64"})
    return function(a) return a:gather(2, i) end, {x64(kiln, 3, 4)}
  end,
  scatter_add = function(kiln)
    local i = kiln.tensor({{1, 2}, {3, 3}, {2, 1}}, {dtype = "i64"})
    return function(a, s) return a:scatter_add(2, i, s) end, {x64(kiln, 3, 4), x64(kiln, 3, 2)}
  end,
  masked_fill = function(kiln)
    local m = kiln.randn(4):gt(0)
    return function(a) return a:masked_fill(m, 2) end, {t64(kiln, 3, 4)}
  end,
  masked_select = function(kiln)
    local m = kiln.tensor({true, false, true, true})
    return function(a) return a:masked_select(m) end, {t64(kiln, 3, 4)}
  end,
  conv2d = function(kiln)
    return function(x, w, b) return kiln.F.conv2d(x, w, b, {stride = 2, padding = 1}) end,
           {x64(kiln, 2, 3, 5, 6), x64(kiln, 4, 3, 3, 3), x64(kiln, 4)}
  end,
  -- f64 runs the three ops (the f32 kernel is checked against them bit for bit: nn_ops_spec)
  conv2d_relu_max_pool2d = function(kiln)
    return function(x, w, b) return kiln.F.conv2d_relu_max_pool2d(x, w, b, {padding = 1}) end,
           {x64(kiln, 2, 3, 5, 6), x64(kiln, 4, 3, 3, 3), x64(kiln, 4)}
  end,
  -- relu and the bias through the op's own derivative (f64 runs the fused op); x read transposed
  linear = function(kiln)
    return function(x, w, b) return kiln.F.linear_relu(x, w, b) end, {t64(kiln, 5, 4), x64(kiln, 3, 4), x64(kiln, 3)}
  end,
  max_pool2d = function(kiln) return function(x) return kiln.F.max_pool2d(x, 2) end, {x64(kiln, 2, 3, 4, 6)} end,
  avg_pool2d = function(kiln) return function(x) return kiln.F.avg_pool2d(x, 3, 2) end, {x64(kiln, 2, 3, 5, 5)} end,
  batch_norm = function(kiln)
    return function(x, w, b) return kiln.F.batch_norm(x, nil, nil, w, b, {training = true}) end,
           {x64(kiln, 4, 3, 2, 2), x64(kiln, 3), x64(kiln, 3)}
  end,
  layer_norm = function(kiln)
    return function(x, w, b) return kiln.F.layer_norm(x, {5}, w, b) end, {x64(kiln, 3, 5), x64(kiln, 5), x64(kiln, 5)}
  end,
  group_norm = function(kiln)
    return function(x, w, b) return kiln.F.group_norm(x, 2, w, b) end, {x64(kiln, 2, 4, 3), x64(kiln, 4), x64(kiln, 4)}
  end,
  softmax = function(kiln) return function(x) return kiln.F.softmax(x, 2) end, {t64(kiln, 3, 5)} end,
  log_softmax = function(kiln) return function(x) return kiln.F.log_softmax(x, 1) end, {t64(kiln, 3, 5)} end,
  nll_loss = function(kiln)
    local target = kiln.tensor({1, 3, 2}, {dtype = "i64"})
    return function(x) return kiln.F.nll_loss(x, target) end, {x64(kiln, 3, 4)}
  end,
  dropout = function(kiln)
    return function(x) kiln.manual_seed(5) return kiln.F.dropout(x, 0.4) end, {x64(kiln, 4, 5)}
  end,
  rnn = function(kiln)
    local T, B, I, H = 3, 2, 4, 3
    return function(x, h0, w_ih, w_hh, b_ih, b_hh)
             return (kiln.F.rnn_layer("gru", x, h0, nil, w_ih, w_hh, b_ih, b_hh))
           end,
           {x64(kiln, T, B, I), x64(kiln, B, H), x64(kiln, 3 * H, I), x64(kiln, 3 * H, H), x64(kiln, 3 * H), x64(kiln, 3 * H)}
  end,
  ctc_loss = function(kiln)
    return function(x) return kiln.F.ctc_loss(kiln.F.log_softmax(x, 3), {{2, 3}, {4}}, {4, 3}) end, {x64(kiln, 4, 2, 5)}
  end,
}

-- The composites: ops written in Lua with the ops of the table (their gradients are those ops'),
-- in docs/ops.md's last section. Each: its help name, what it is written with, and its f64 check.
local F = function(kiln) return kiln.F end
local composites = {
  {"Tensor:sort", "argsort, gather", function(kiln) return function(a) return (a:sort(2, true)) end, {t64(kiln, 3, 5)} end},
  {"Tensor:topk", "argsort, narrow, gather", function(kiln) return function(a) return (a:topk(2, 1)) end, {t64(kiln, 4, 3)} end},
  {"Tensor:tile", "reshape, expand", function(kiln) return function(a) return a:tile(2, 1, 3) end, {t64(kiln, 2, 3)} end},
  {"Tensor:repeat", "reshape, expand", function(kiln) return function(a) return a["repeat"](a, 2, 2) end, {t64(kiln, 2, 3)} end},
  {"Tensor:repeat_interleave", "reshape, expand; index_select", function(kiln)
    return function(a) return a:repeat_interleave({2, 0, 1}, 1) + a:repeat_interleave(2, 1):narrow(1, 1, 3) end, {t64(kiln, 3, 4)}
  end},
  {"Tensor:roll", "index_select", function(kiln) return function(a) return a:roll({1, -2}, {1, 2}) end, {t64(kiln, 3, 4)} end},
  {"Tensor:multinomial", "cumsum, uniform; argsort (not differentiable)"},
  {"Tensor:addcmul", "mul, add", function(kiln)
    -- the three broadcast to [2,3,4], as PyTorch's
    return function(a, b, c) return a:addcmul(b, c, 0.5) end, {t64(kiln, 3, 4), x64(kiln, 3, 1), x64(kiln, 2, 1, 4)}
  end},
  {"Tensor:addcdiv", "div, mul, add", function(kiln)
    return function(a, b, c) return a:addcdiv(b, c, 0.5) end, {t64(kiln, 3, 4), x64(kiln, 3, 1), pos64(kiln, 2, 1, 4)}
  end},
  {"Tensor:lerp", "sub, mul, add", function(kiln)
    return function(a, b, w) return a:lerp(b, w) end, {t64(kiln, 3, 4), x64(kiln, 3, 1), x64(kiln, 2, 1, 4)}
  end},
  {"Tensor:outer", "view, mul", function(kiln) return function(a, b) return a:outer(b) end, {x64(kiln, 3), x64(kiln, 4)} end},
  {"Tensor:diag", "index_select; scatter_add", function(kiln)
    return function(m, v) return m:diag(1):sum() + v:diag(-1) end, {t64(kiln, 4, 5), x64(kiln, 3)}
  end},
  {"Tensor:trace", "diag, sum", function(kiln) return function(m) return m:trace() end, {t64(kiln, 4, 4)} end},
  {"Tensor:baddbmm", "bmm, mul, add", function(kiln)
    -- input [3,4] and [2,1,4], both broadcast to the product's [2,3,4]
    return function(c, d, a, b) return c:baddbmm(a, b, {beta = 0.5, alpha = 2}) + d:baddbmm(a, b) end,
           {x64(kiln, 3, 4), x64(kiln, 2, 1, 4), x64(kiln, 2, 3, 5), x64(kiln, 2, 5, 4)}
  end},
  {"Tensor:clamp", "maximum, minimum (tensor bounds)", function(kiln)
    return function(x, lo, hi) return x:clamp(lo, hi) end, {t64(kiln, 3, 4), (x64(kiln, 3, 1) - 1):detach():requires_grad_(),
                                                             (x64(kiln, 2, 1, 4) + 1):detach():requires_grad_()}
  end},
  {"kiln.einsum", "permute, reshape, sum, bmm; index_select (diagonals)", function(kiln)
    return function(a, b, c)
      return kiln.einsum("bij,bjk,k->bi", a, b, c) + kiln.einsum("ii->i", b:narrow(1, 1, 1):view(4, 4)):sum()
             -- size-1 dims broadcast: j of [3,1] against [4,4], the "..." batch [1] against [2]
             + kiln.einsum("ij,jk->i", a:select(1, 1):narrow(2, 1, 1), b:select(1, 2))
             + kiln.einsum("...ij,...jk->...ik", a:narrow(1, 2, 1), b):sum(3)
    end, {x64(kiln, 2, 3, 4), x64(kiln, 2, 4, 4), x64(kiln, 4)}
  end},
  {"kiln.nn.functional.pad", "cat, narrow; index_select (reflect, replicate, circular)", function(kiln)
    return function(x)
      -- each mode weighted differently, so that a gradient in the wrong place shows
      local w = kiln.arange(1, 6, {dtype = "f64"}):view(5, 1)
      return (F(kiln).pad(x, {1, -1, 2, 0}, {value = 0.5}) * w):sum() + (F(kiln).pad(x, {1, 0, 1, 1}, "reflect") * w):sum()
             + (F(kiln).pad(x, {0, 1, 1, 1}, "replicate") * w):sum() + (F(kiln).pad(x, {1, 0, 2, 0}, "circular") * w):sum()
    end, {x64(kiln, 2, 2, 3, 4)}
  end},
  {"kiln.nn.functional.interpolate", "index_select, mul, add; adaptive_avg_pool2d (area)", function(kiln)
    -- each resize weighted by position, so that a gradient in the wrong place shows
    local function weighted(y)
      local n = y:numel()
      return (y * kiln.arange(1, n + 1, {dtype = "f64"}):view(y:size()) / n):sum()
    end
    local I = F(kiln).interpolate
    return function(x, v)
      return I(x, {size = {5, 7}, mode = "bilinear"}):sum(4)
             + I(x, {size = {5, 2}, mode = "bilinear", align_corners = true}):sum(4)
             + I(x, {scale_factor = {5 / 3, 1.5}}):sum(4)
             + weighted(I(x, {size = {5, 7}, mode = "bicubic"})) + weighted(I(x, {size = {2, 3}, mode = "bicubic"}))
             + weighted(I(x, {size = {4, 6}, mode = "bicubic", align_corners = true}))
             + weighted(I(x, {size = {2, 5}, mode = "area"})) + weighted(I(x, {size = {5, 2}, mode = "nearest-exact"}))
             + weighted(I(v, {size = {3, 4, 3}, mode = "trilinear"}))
             + weighted(I(v, {size = {1, 2, 5}, mode = "trilinear", align_corners = true}))
             + weighted(I(v, {size = {3, 2, 1}, mode = "area"}))
    end, {x64(kiln, 1, 2, 3, 4), x64(kiln, 1, 2, 2, 3, 2)}
  end},
  {"kiln.nn.functional.unfold", "pad, index_select", function(kiln)
    return function(x) return F(kiln).unfold(x, {2, 3}, {padding = 1, stride = {2, 1}, dilation = {1, 2}}) end, {x64(kiln, 2, 2, 4, 5)}
  end},
  {"kiln.nn.functional.fold", "scatter_add, narrow", function(kiln)
    return function(c) return F(kiln).fold(c, {4, 5}, {2, 3}, {padding = 1, stride = {2, 1}, dilation = {1, 2}}) end,
           {x64(kiln, 2, 12, 9)}
  end},
}

-- Ops whose output's grad_fn is another op's (the check covers the op inside it).
-- matmul records gemm on 3-d operands and returns a view of its result.
-- the f64 check of conv2d_relu_max_pool2d runs the three ops: the last is max_pool2d
local grad_fn_of = {gemm = "ViewBackward", conv2d_relu_max_pool2d = "Max_pool2dBackward"}

return {checks = checks, grad_fn_of = grad_fn_of, composites = composites}
