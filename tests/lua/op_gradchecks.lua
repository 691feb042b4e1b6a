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

-- Ops whose output's grad_fn is another op's (the check covers the op inside it).
-- matmul records gemm on 3-d operands and returns a view of its result.
local grad_fn_of = {gemm = "ViewBackward"}

return {checks = checks, grad_fn_of = grad_fn_of}
