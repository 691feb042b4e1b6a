-- The fused nn ops (kiln.functional): each against a naive loop written here in Lua, an f64
-- gradient check w.r.t. every differentiable input (non-contiguous inputs for conv and softmax),
-- misuse errors after which the next op works, and conv results that do not depend on the
-- thread count.
local kiln = kiln or require "kiln"
require "kiln.testing"
local F = require "kiln.functional"

-- ---- flat data ----

local function flat(t) return t:contiguous():reshape(-1):totable() end
local function tensor(list, shape, dtype) return kiln.tensor(list, {dtype = dtype or "f64"}):view(shape) end
local function randn(shape, dtype) return kiln.randn(shape, {dtype = dtype or "f64"}) end
local function leaf(t) return t:detach():requires_grad_() end
local function numel(shape) local n = 1 for _, s in ipairs(shape) do n = n * s end return n end

local function assert_shape(t, shape)
  local s = t:size()
  assert(#s == #shape, string.format("shape %s, expected [%s]", tostring(s), table.concat(shape, ", ")))
  for i = 1, #shape do
    assert(s[i] == shape[i], string.format("shape %s, expected [%s]", tostring(s), table.concat(shape, ", ")))
  end
end

-- t (a tensor) equals the flat list expected of the given shape, within a relative tolerance.
local function assert_close(t, expected, shape, tol)
  tol = tol or 1e-10
  if shape then assert_shape(t, shape) end
  local got = flat(t)
  assert(#got == #expected, string.format("%d elements, expected %d", #got, #expected))
  for i = 1, #got do
    local a, e = got[i], expected[i]
    local ok = (a == e) or (e ~= e and a ~= a) or math.abs(a - e) <= tol * (1 + math.abs(e))
    assert(ok, string.format("element %d: got %.17g, expected %.17g (tolerance %g)", i, a, e, tol))
  end
end

local function error_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert(not ok, "expected an error")
  return tostring(e)
end
local function assert_contains(msg, ...)
  for _, part in ipairs({...}) do
    assert(msg:find(part, 1, true), string.format("message %q lacks %q", msg, part))
  end
end

-- ---- naive references on flat lists (indices from 0 inside, Lua lists from 1) ----

local function conv_out(n, k, s, p, d) return math.floor((n + 2 * p - d * (k - 1) - 1) / s) + 1 end

-- x [N,C,H,W], w [O,C/G,kh,kw], b [O] or nil; o = {stride = {sh, sw}, padding = {ph, pw}, dilation = {dh, dw}, groups}
local function ref_conv2d(x, xs, w, ws, b, o)
  local N, C, H, W = xs[1], xs[2], xs[3], xs[4]
  local O, Cg, kh, kw = ws[1], ws[2], ws[3], ws[4]
  local sh, sw, ph, pw, dh, dw = o.stride[1], o.stride[2], o.padding[1], o.padding[2], o.dilation[1], o.dilation[2]
  local G = o.groups or 1
  local Og = O / G
  local OH, OW = conv_out(H, kh, sh, ph, dh), conv_out(W, kw, sw, pw, dw)
  local y = {}
  for n = 0, N - 1 do
    for oc = 0, O - 1 do
      local g = math.floor(oc / Og)
      for oh = 0, OH - 1 do
        for ow = 0, OW - 1 do
          local s = b and b[oc + 1] or 0
          for c = 0, Cg - 1 do
            for ki = 0, kh - 1 do
              for kj = 0, kw - 1 do
                local ih, iw = oh * sh - ph + ki * dh, ow * sw - pw + kj * dw
                if ih >= 0 and ih < H and iw >= 0 and iw < W then
                  s = s + x[((n * C + g * Cg + c) * H + ih) * W + iw + 1] * w[((oc * Cg + c) * kh + ki) * kw + kj + 1]
                end
              end
            end
          end
          y[#y + 1] = s
        end
      end
    end
  end
  return y, {N, O, OH, OW}
end

-- x [N,C,H,W], w [C,O/G,kh,kw]: every input pixel scatters its kernel into the output.
local function ref_conv_transpose2d(x, xs, w, ws, b, o)
  local N, C, H, W = xs[1], xs[2], xs[3], xs[4]
  local Og, kh, kw = ws[2], ws[3], ws[4]
  local sh, sw, ph, pw, dh, dw = o.stride[1], o.stride[2], o.padding[1], o.padding[2], o.dilation[1], o.dilation[2]
  local oph, opw = o.output_padding[1], o.output_padding[2]
  local G = o.groups or 1
  local Cg, O = C / G, Og * G
  local OH = (H - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
  local OW = (W - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
  local y = {}
  for n = 0, N - 1 do
    for oc = 0, O - 1 do
      for i = 0, OH * OW - 1 do y[(n * O + oc) * OH * OW + i + 1] = b and b[oc + 1] or 0 end
    end
  end
  for n = 0, N - 1 do
    for c = 0, C - 1 do
      local g = math.floor(c / Cg)
      for ih = 0, H - 1 do
        for iw = 0, W - 1 do
          local v = x[((n * C + c) * H + ih) * W + iw + 1]
          for oc = 0, Og - 1 do
            for ki = 0, kh - 1 do
              for kj = 0, kw - 1 do
                local oh, ow = ih * sh - ph + ki * dh, iw * sw - pw + kj * dw
                if oh >= 0 and oh < OH and ow >= 0 and ow < OW then
                  local k = ((n * O + g * Og + oc) * OH + oh) * OW + ow + 1
                  y[k] = y[k] + v * w[((c * Og + oc) * kh + ki) * kw + kj + 1]
                end
              end
            end
          end
        end
      end
    end
  end
  return y, {N, O, OH, OW}
end

-- Output size of a pooling window, PyTorch's rule (ceil_mode drops a window that starts in the padding).
local function pool_out(n, k, s, p, d, ceil_mode)
  local span = n + 2 * p - d * (k - 1) - 1
  local o = (ceil_mode and math.ceil(span / s) or math.floor(span / s)) + 1
  if ceil_mode and (o - 1) * s >= n + p then o = o - 1 end
  return o
end

-- planes: the product of the leading dims; o = {k = {kh, kw}, stride, padding, dilation, ceil_mode}
local function ref_max_pool2d(x, planes, H, W, o)
  local kh, kw, sh, sw = o.k[1], o.k[2], o.stride[1], o.stride[2]
  local ph, pw, dh, dw = o.padding[1], o.padding[2], o.dilation[1], o.dilation[2]
  local OH, OW = pool_out(H, kh, sh, ph, dh, o.ceil_mode), pool_out(W, kw, sw, pw, dw, o.ceil_mode)
  local y = {}
  for p = 0, planes - 1 do
    for oh = 0, OH - 1 do
      for ow = 0, OW - 1 do
        local best = -math.huge
        for ki = 0, kh - 1 do
          for kj = 0, kw - 1 do
            local ih, iw = oh * sh - ph + ki * dh, ow * sw - pw + kj * dw
            if ih >= 0 and ih < H and iw >= 0 and iw < W then best = math.max(best, x[(p * H + ih) * W + iw + 1]) end
          end
        end
        y[#y + 1] = best
      end
    end
  end
  return y, OH, OW
end

local function ref_avg_pool2d(x, planes, H, W, o)
  local kh, kw, sh, sw, ph, pw = o.k[1], o.k[2], o.stride[1], o.stride[2], o.padding[1], o.padding[2]
  local OH, OW = pool_out(H, kh, sh, ph, 1, o.ceil_mode), pool_out(W, kw, sw, pw, 1, o.ceil_mode)
  local y = {}
  for p = 0, planes - 1 do
    for oh = 0, OH - 1 do
      for ow = 0, OW - 1 do
        local s, n, padded = 0, 0, 0
        for ih = oh * sh - ph, oh * sh - ph + kh - 1 do
          for iw = ow * sw - pw, ow * sw - pw + kw - 1 do
            -- the padded window ends at the padding's edge, not beyond
            if ih < H + ph and iw < W + pw then padded = padded + 1 end
            if ih >= 0 and ih < H and iw >= 0 and iw < W then s = s + x[(p * H + ih) * W + iw + 1]; n = n + 1 end
          end
        end
        y[#y + 1] = s / (o.count_include_pad and padded or n)
      end
    end
  end
  return y, OH, OW
end

local function ref_adaptive_avg_pool2d(x, planes, H, W, OH, OW)
  local y = {}
  for p = 0, planes - 1 do
    for oh = 0, OH - 1 do
      for ow = 0, OW - 1 do
        local h0, h1 = math.floor(oh * H / OH), math.ceil((oh + 1) * H / OH)
        local w0, w1 = math.floor(ow * W / OW), math.ceil((ow + 1) * W / OW)
        local s = 0
        for ih = h0, h1 - 1 do for iw = w0, w1 - 1 do s = s + x[(p * H + ih) * W + iw + 1] end end
        y[#y + 1] = s / ((h1 - h0) * (w1 - w0))
      end
    end
  end
  return y
end

-- Normalise groups of a flat list: members(g) lists the (1-based) positions of group g.
local function normalise(x, groups, members, eps, affine)
  local y, means, vars = {}, {}, {}
  for g = 1, groups do
    local idx = members(g)
    local s = 0
    for _, i in ipairs(idx) do s = s + x[i] end
    local m = s / #idx
    local q = 0
    for _, i in ipairs(idx) do q = q + (x[i] - m) ^ 2 end
    means[g], vars[g] = m, q / #idx
    for _, i in ipairs(idx) do
      local w, b = affine(i)
      y[i] = (x[i] - m) / math.sqrt(q / #idx + eps) * w + b
    end
  end
  return y, means, vars
end

-- x [N,C,S...] as N, C, S; the positions of channel c (0-based).
local function channel_members(N, C, S)
  return function(g)
    local c, idx = g - 1, {}
    for n = 0, N - 1 do for s = 0, S - 1 do idx[#idx + 1] = (n * C + c) * S + s + 1 end end
    return idx
  end
end

-- Softmax of a flat list of shape along dim (1-based).
local function ref_softmax(x, shape, dim, log)
  local inner, outer = 1, 1
  for d = dim + 1, #shape do inner = inner * shape[d] end
  for d = 1, dim - 1 do outer = outer * shape[d] end
  local D, y = shape[dim], {}
  for o = 0, outer - 1 do
    for i = 0, inner - 1 do
      local m = -math.huge
      for d = 0, D - 1 do m = math.max(m, x[(o * D + d) * inner + i + 1]) end
      local s = 0
      for d = 0, D - 1 do s = s + math.exp(x[(o * D + d) * inner + i + 1] - m) end
      for d = 0, D - 1 do
        local k = (o * D + d) * inner + i + 1
        y[k] = log and x[k] - m - math.log(s) or math.exp(x[k] - m) / s
      end
    end
  end
  return y
end

-- Cross entropy / nll on logp [N,C,S] with Lua labels (1..C): PyTorch's definitions.
-- Returns the per-position losses (ignored ones 0) and the weight sum the mean divides by.
local function ref_nll(logp, N, C, S, target, o)
  local losses, total = {}, 0
  local eps = o.label_smoothing or 0
  for n = 0, N - 1 do
    for s = 0, S - 1 do
      local t = target[n * S + s + 1]
      local l = 0
      if t ~= o.ignore_index then
        local wt = o.weight and o.weight[t] or 1
        total = total + wt
        l = -wt * logp[(n * C + t - 1) * S + s + 1]
        if eps > 0 then
          local sm = 0
          for c = 1, C do sm = sm - (o.weight and o.weight[c] or 1) * logp[(n * C + c - 1) * S + s + 1] end
          l = (1 - eps) * l + eps / C * sm
        end
      end
      losses[#losses + 1] = l
    end
  end
  return losses, total
end

local function reduce(losses, total, reduction)
  if reduction == "none" then return losses end
  local s = 0
  for _, l in ipairs(losses) do s = s + l end
  if reduction == "sum" then return {s} end
  return {s / total}
end

-- ---- convolution ----

describe("conv2d", function()
  before_each(function() kiln.manual_seed(1) end)

  local cases = {
    {name = "plain 3x3", xs = {2, 3, 7, 6}, ws = {4, 3, 3, 3}, o = {stride = {1, 1}, padding = {0, 0}, dilation = {1, 1}}},
    {name = "stride 2, padding 1", xs = {2, 3, 7, 6}, ws = {5, 3, 3, 2}, o = {stride = {2, 2}, padding = {1, 1}, dilation = {1, 1}}},
    {name = "uneven stride, padding and dilation", xs = {3, 2, 9, 8}, ws = {3, 2, 3, 2}, o = {stride = {2, 3}, padding = {2, 1}, dilation = {2, 3}}},
    {name = "groups 3 with bias", xs = {2, 6, 5, 7}, ws = {9, 2, 3, 3}, o = {stride = {1, 2}, padding = {1, 0}, dilation = {1, 1}, groups = 3}, bias = true},
    {name = "depthwise 1x1", xs = {2, 4, 5, 5}, ws = {4, 1, 1, 1}, o = {stride = {1, 1}, padding = {0, 0}, dilation = {1, 1}, groups = 4}, bias = true},
    {name = "many images (several im2col chunks)", xs = {37, 3, 6, 5}, ws = {4, 3, 2, 2}, o = {stride = {1, 1}, padding = {1, 1}, dilation = {1, 1}}, bias = true},
    {name = "large images (a GEMM per image), groups 2", xs = {3, 4, 18, 17}, ws = {6, 2, 3, 3}, o = {stride = {1, 1}, padding = {1, 1}, dilation = {1, 1}, groups = 2}, bias = true},
  }
  for _, cs in ipairs(cases) do
    for _, dtype in ipairs{"f64", "f32"} do
      it(cs.name .. " matches the naive loop (" .. dtype .. ")", function()
        local x, w = randn(cs.xs, dtype), randn(cs.ws, dtype)
        local b = cs.bias and randn({cs.ws[1]}, dtype) or nil
        local y = F.conv2d(x, w, b, {stride = cs.o.stride, padding = cs.o.padding, dilation = cs.o.dilation, groups = cs.o.groups})
        local ref, shape = ref_conv2d(flat(x), cs.xs, flat(w), cs.ws, b and flat(b), cs.o)
        assert_close(y, ref, shape, dtype == "f64" and 1e-10 or 1e-4)
        assert.are.equal(dtype, y:dtype())
      end)
    end
  end

  it("reads non-contiguous inputs", function()
    local x = randn({2, 3, 6, 5}):transpose(3, 4)        -- [2,3,5,6]
    local w = randn({4, 3, 3, 3}):transpose(3, 4)
    local o = {stride = {1, 2}, padding = {1, 1}, dilation = {1, 1}}
    local y = F.conv2d(x, w, nil, {stride = o.stride, padding = 1})
    local ref, shape = ref_conv2d(flat(x), {2, 3, 5, 6}, flat(w), {4, 3, 3, 3}, nil, o)
    assert_close(y, ref, shape)
  end)

  it("padding \"same\" and \"valid\"", function()
    local x, w = randn({1, 2, 6, 5}), randn({3, 2, 3, 5})
    assert_shape(F.conv2d(x, w, nil, {padding = "same"}), {1, 3, 6, 5})
    assert_shape(F.conv2d(x, w, nil, {padding = "valid"}), {1, 3, 4, 1})
  end)

  it("conv1d is conv2d over one row", function()
    local x, w, b = randn({2, 3, 11}), randn({4, 3, 3}), randn({4})
    local y = F.conv1d(x, w, b, {stride = 2, padding = 1, dilation = 2})
    local ref, shape = ref_conv2d(flat(x), {2, 3, 1, 11}, flat(w), {4, 3, 1, 3}, flat(b),
                                  {stride = {1, 2}, padding = {0, 1}, dilation = {1, 2}})
    assert_close(y, ref, {shape[1], shape[2], shape[4]})
  end)

  for _, cs in ipairs{
    {name = "stride 2, padding 1, dilation 2, groups 2, non-contiguous input", xs = {2, 4, 6, 7}, ws = {4, 2, 2, 3},
     o = {stride = {2, 1}, padding = {1, 1}, dilation = {2, 1}, groups = 2}},
    {name = "plain, with bias", xs = {3, 2, 5, 4}, ws = {3, 2, 3, 3}, o = {stride = {1, 1}, padding = {0, 0}, dilation = {1, 1}}},
    {name = "large images (a GEMM per image)", xs = {2, 2, 17, 16}, ws = {2, 2, 2, 3}, o = {stride = {1, 1}, padding = {1, 1}, dilation = {1, 1}}},
  } do
    it("gradients match finite differences: " .. cs.name, function()
      local xs = cs.xs
      local x = leaf(randn({xs[1], xs[2], xs[4], xs[3]}):transpose(3, 4))
      local w, b = leaf(randn(cs.ws)), leaf(randn({cs.ws[1]}))
      assert.gradcheck(function(a, c, d) return F.conv2d(a, c, d, cs.o) end, {x, w, b})
    end)
  end

  it("conv1d gradients match finite differences", function()
    local x, w, b = leaf(randn({2, 2, 7})), leaf(randn({3, 2, 3})), leaf(randn({3}))
    assert.gradcheck(function(a, c, d) return F.conv1d(a, c, d, {stride = 2, padding = 1}) end, {x, w, b})
  end)

  it("a grad for the weight alone, or the bias alone", function()
    local x, w, b = randn({2, 2, 5, 5}), leaf(randn({3, 2, 3, 3})), randn({3})
    assert.gradcheck(function(c) return F.conv2d(x, c, b) end, {w})
    local bb = leaf(randn({3}))
    assert.gradcheck(function(d) return F.conv2d(x, w:detach(), d, {padding = 1}) end, {bb})
  end)
end)

describe("conv_transpose2d", function()
  before_each(function() kiln.manual_seed(2) end)

  local cases = {
    {name = "stride 1", xs = {2, 3, 4, 5}, ws = {3, 2, 3, 3}, o = {stride = {1, 1}, padding = {0, 0}, output_padding = {0, 0}, dilation = {1, 1}}, bias = true},
    {name = "stride 2, padding 1, output padding 1", xs = {2, 3, 4, 3}, ws = {3, 4, 3, 3}, o = {stride = {2, 2}, padding = {1, 1}, output_padding = {1, 1}, dilation = {1, 1}}},
    {name = "groups 2, dilation 2, uneven stride", xs = {1, 4, 3, 5}, ws = {4, 3, 2, 3}, o = {stride = {3, 2}, padding = {1, 0}, output_padding = {2, 0}, dilation = {2, 2}, groups = 2}, bias = true},
    {name = "large input (a GEMM per image)", xs = {2, 2, 16, 17}, ws = {2, 3, 3, 2}, o = {stride = {1, 1}, padding = {1, 0}, output_padding = {0, 0}, dilation = {1, 1}}, bias = true},
  }
  for _, cs in ipairs(cases) do
    it(cs.name .. " matches the naive scatter", function()
      local x, w = randn(cs.xs), randn(cs.ws)
      local b = cs.bias and randn({cs.ws[2] * (cs.o.groups or 1)}) or nil
      local y = F.conv_transpose2d(x, w, b, cs.o)
      local ref, shape = ref_conv_transpose2d(flat(x), cs.xs, flat(w), cs.ws, b and flat(b), cs.o)
      assert_close(y, ref, shape)
    end)
    it(cs.name .. ": gradients match finite differences", function()
      local x, w = leaf(randn(cs.xs)), leaf(randn(cs.ws))
      local b = leaf(randn({cs.ws[2] * (cs.o.groups or 1)}))
      assert.gradcheck(function(a, c, d) return F.conv_transpose2d(a, c, d, cs.o) end, {x, w, b})
    end)
  end

  it("is the input-gradient of conv2d", function()
    local x, w = leaf(randn({2, 3, 7, 6})), randn({4, 3, 3, 3})
    local y = F.conv2d(x, w, nil, {stride = 2, padding = 1})
    local g = randn(y:size())
    y:backward(g)
    local t = F.conv_transpose2d(g, w, nil, {stride = 2, padding = 1, output_padding = {0, 1}})
    assert_close(t, flat(x.grad), {2, 3, 7, 6})
  end)
end)

-- ---- pooling ----

describe("pooling", function()
  before_each(function() kiln.manual_seed(3) end)

  local max_cases = {
    {name = "2x2", shape = {2, 3, 6, 7}, o = {k = {2, 2}, stride = {2, 2}, padding = {0, 0}, dilation = {1, 1}}},
    {name = "3x3 stride 2 padding 1", shape = {2, 2, 7, 6}, o = {k = {3, 3}, stride = {2, 2}, padding = {1, 1}, dilation = {1, 1}}},
    {name = "ceil mode", shape = {1, 2, 7, 5}, o = {k = {2, 3}, stride = {2, 2}, padding = {0, 1}, dilation = {1, 1}, ceil_mode = true}},
    {name = "dilation and a 3-d input", shape = {3, 9, 8}, o = {k = {3, 2}, stride = {1, 2}, padding = {1, 1}, dilation = {2, 3}, ceil_mode = true}},
  }
  for _, cs in ipairs(max_cases) do
    it("max_pool2d " .. cs.name .. " matches the naive loop", function()
      local x = randn(cs.shape)
      local y = F.max_pool2d(x, cs.o.k, {stride = cs.o.stride, padding = cs.o.padding, dilation = cs.o.dilation, ceil_mode = cs.o.ceil_mode})
      local nd = #cs.shape
      local H, W = cs.shape[nd - 1], cs.shape[nd]
      local ref, OH, OW = ref_max_pool2d(flat(x), numel(cs.shape) / (H * W), H, W, cs.o)
      local shape = {unpack(cs.shape)}
      shape[nd - 1], shape[nd] = OH, OW
      assert_close(y, ref, shape, 0)
    end)
    it("max_pool2d " .. cs.name .. ": gradient matches finite differences", function()
      local x = leaf(randn(cs.shape))
      assert.gradcheck(function(a)
        return F.max_pool2d(a, cs.o.k, {stride = cs.o.stride, padding = cs.o.padding, dilation = cs.o.dilation, ceil_mode = cs.o.ceil_mode})
      end, {x})
    end)
  end

  -- where the 2x2 window (oh, ow) of plane p of vals (H x W planes, flat from 1) has its maximum:
  -- the first in raster order, or the last NaN
  local function window_max_at(vals, p, H, W, oh, ow)
    local best, at
    for ki = 0, 1 do
      for kj = 0, 1 do
        local i = p * H * W + (2 * oh + ki) * W + 2 * ow + kj + 1
        local v = vals[i]
        if at == nil or v ~= v or (best == best and v > best) then best, at = v, i end
      end
    end
    return at
  end

  it("max_pool2d 2x2 in f32 and bf16 picks the first maximum in raster order, or the last NaN, on every tie", function()
    -- values from {0, 1, 2} and NaNs, so that most windows tie; planes of 8 x 10 and 6 x 40 (the
    -- whole-plane path; at the avx512 level 16 outputs a vector, 20 a row) and 7 x 9 (the general
    -- body)
    for _, case in ipairs{{8, 10, "f32"}, {6, 40, "f32"}, {7, 9, "f32"}, {8, 10, "bf16"}, {6, 40, "bf16"}, {7, 9, "bf16"}} do
      local hw, dtype = case, case[3]
      local H, W = hw[1], hw[2]
      local vals, n = {}, 3 * H * W
      local r = 12345
      for i = 1, n do
        r = (r * 1103515245 + 12345) % 2147483648
        local v = r % 7
        vals[i] = v == 6 and 0 / 0 or v % 3
      end
      local x = leaf(kiln.tensor(vals):view(3, H, W):to(dtype))
      local y = F.max_pool2d(x, 2)
      y:sum():backward()
      local OH, OW = math.floor(H / 2), math.floor(W / 2)
      local grad = {}
      for i = 1, n do grad[i] = 0 end
      local want = {}
      for p = 0, 2 do
        for oh = 0, OH - 1 do
          for ow = 0, OW - 1 do
            local at = window_max_at(vals, p, H, W, oh, ow)
            local best = vals[at]
            want[#want + 1] = best
            grad[at] = grad[at] + 1
          end
        end
      end
      local got = flat(y)
      for i = 1, #want do
        local same = (got[i] ~= got[i] and want[i] ~= want[i]) or got[i] == want[i]
        assert(same, string.format("%s %dx%d: output %d is %s, want %s", dtype, H, W, i, tostring(got[i]), tostring(want[i])))
      end
      assert.are.same(grad, flat(x.grad))
    end
  end)

  it("max_pool2d 2x2's grad in f32 and bf16 is gy at each maximum and 0 elsewhere (-0 as +0, NaN kept)", function()
    -- planes of 9 x 10, 8 x 10 and 7 x 34 (a row past the last window in the first and the last;
    -- bf16 at the avx512 level: the written-once backward, 16 outputs a vector, 17 a row) and 7 x 9
    -- (the scatter); gy of mixed signs with -0 and NaN among them
    for _, case in ipairs{{9, 10, "f32"}, {8, 10, "f32"}, {7, 34, "f32"}, {7, 9, "f32"}, {9, 10, "bf16"}, {8, 10, "bf16"},
                          {7, 34, "bf16"}, {7, 9, "bf16"}} do
      local H, W, dtype = case[1], case[2], case[3]
      local OH, OW = math.floor(H / 2), math.floor(W / 2)
      local x = leaf(kiln.randn(2, H, W):to(dtype))
      local y = F.max_pool2d(x, 2)
      local gvals = {}
      for i = 1, 2 * OH * OW do gvals[i] = i % 5 == 0 and -0.0 or i % 7 == 0 and 0 / 0 or (i % 3 - 1) * 0.5 * i end
      y:backward(kiln.tensor(gvals):view(2, OH, OW):to(dtype))
      local xs, want = flat(x), {}
      for i = 1, 2 * H * W do want[i] = 0 end
      for p = 0, 1 do
        for oh = 0, OH - 1 do
          for ow = 0, OW - 1 do
            want[window_max_at(xs, p, H, W, oh, ow)] = gvals[p * OH * OW + oh * OW + ow + 1] + 0
          end
        end
      end
      local got = flat(x.grad)
      for i = 1, #want do
        local a, b = got[i], want[i]
        local same = (a ~= a and b ~= b) or (a == b and 1 / a == 1 / b)
        assert(same, string.format("%s %dx%d: grad %d is %s, want %s", dtype, H, W, i, tostring(a), tostring(b)))
      end
    end
  end)

  it("max_pool2d's stride defaults to the kernel size, and a stride may be given in place", function()
    local x = randn({1, 1, 6, 6})
    assert_shape(F.max_pool2d(x, 2), {1, 1, 3, 3})
    assert_shape(F.max_pool2d(x, 3, 1), {1, 1, 4, 4})
  end)

  local avg_cases = {
    {name = "2x2", shape = {2, 3, 6, 7}, o = {k = {2, 2}, stride = {2, 2}, padding = {0, 0}, count_include_pad = true}},
    {name = "3x3 padding 1, counting the padding", shape = {2, 2, 7, 6}, o = {k = {3, 3}, stride = {2, 2}, padding = {1, 1}, count_include_pad = true}},
    {name = "3x3 padding 1, not counting the padding", shape = {2, 2, 7, 6}, o = {k = {3, 3}, stride = {2, 2}, padding = {1, 1}, count_include_pad = false}},
    {name = "ceil mode", shape = {1, 2, 7, 5}, o = {k = {3, 2}, stride = {2, 2}, padding = {1, 1}, ceil_mode = true, count_include_pad = true}},
    {name = "ceil mode, not counting the padding", shape = {2, 8, 5}, o = {k = {3, 3}, stride = {3, 2}, padding = {1, 0}, ceil_mode = true, count_include_pad = false}},
  }
  for _, cs in ipairs(avg_cases) do
    it("avg_pool2d " .. cs.name .. " matches the naive loop", function()
      local x = randn(cs.shape)
      local y = F.avg_pool2d(x, cs.o.k, {stride = cs.o.stride, padding = cs.o.padding, ceil_mode = cs.o.ceil_mode,
                                         count_include_pad = cs.o.count_include_pad})
      local nd = #cs.shape
      local H, W = cs.shape[nd - 1], cs.shape[nd]
      local ref, OH, OW = ref_avg_pool2d(flat(x), numel(cs.shape) / (H * W), H, W, cs.o)
      local shape = {unpack(cs.shape)}
      shape[nd - 1], shape[nd] = OH, OW
      assert_close(y, ref, shape)
    end)
    it("avg_pool2d " .. cs.name .. ": gradient matches finite differences", function()
      local x = leaf(randn(cs.shape))
      assert.gradcheck(function(a)
        return F.avg_pool2d(a, cs.o.k, {stride = cs.o.stride, padding = cs.o.padding, ceil_mode = cs.o.ceil_mode,
                                        count_include_pad = cs.o.count_include_pad})
      end, {x})
    end)
  end

  for _, cs in ipairs{{shape = {2, 3, 7, 5}, out = {3, 2}}, {shape = {2, 6, 6}, out = {4, 4}}, {shape = {1, 2, 5, 9}, out = {1, 1}},
                      {shape = {1, 1, 3, 4}, out = {5, 7}}} do
    local name = string.format("adaptive_avg_pool2d [%s] -> %dx%d", table.concat(cs.shape, ","), cs.out[1], cs.out[2])
    it(name .. " matches the naive loop and finite differences", function()
      local x = leaf(randn(cs.shape))
      local y = F.adaptive_avg_pool2d(x, cs.out)
      local nd = #cs.shape
      local H, W = cs.shape[nd - 1], cs.shape[nd]
      local shape = {unpack(cs.shape)}
      shape[nd - 1], shape[nd] = cs.out[1], cs.out[2]
      assert_close(y, ref_adaptive_avg_pool2d(flat(x), numel(cs.shape) / (H * W), H, W, cs.out[1], cs.out[2]), shape)
      assert.gradcheck(function(a) return F.adaptive_avg_pool2d(a, cs.out) end, {x})
    end)
  end

  it("adaptive_avg_pool2d keeps a size given as nil", function()
    assert_shape(F.adaptive_avg_pool2d(randn({1, 2, 5, 6}), {nil, 3}), {1, 2, 5, 3})
  end)
end)

-- ---- normalisation ----

describe("batch_norm", function()
  before_each(function() kiln.manual_seed(4) end)

  it("training normalises with the batch statistics and updates the running stats (unbiased)", function()
    local N, C, S = 3, 4, 10
    local x = randn({N, C, 2, 5})
    local w, b = randn({C}), randn({C})
    local rm, rv = kiln.zeros(C, {dtype = "f64"}), kiln.ones(C, {dtype = "f64"})
    local y = F.batch_norm(x, rm, rv, w, b, {training = true, momentum = 0.1, eps = 1e-5})
    local wl, bl = flat(w), flat(b)
    local ref, means, vars = normalise(flat(x), C, channel_members(N, C, S), 1e-5, function(i)
      local c = math.floor((i - 1) / S) % C
      return wl[c + 1], bl[c + 1]
    end)
    assert_close(y, ref, {N, C, 2, 5})
    local erm, erv = {}, {}
    for c = 1, C do
      erm[c] = 0.1 * means[c]
      erv[c] = 0.9 + 0.1 * vars[c] * (N * S) / (N * S - 1)
    end
    assert_close(rm, erm)
    assert_close(rv, erv)
    -- a second step moves them on from there
    F.batch_norm(x, rm, rv, w, b, {training = true, momentum = 0.1})
    for c = 1, C do erm[c] = 0.9 * erm[c] + 0.1 * means[c]; erv[c] = 0.9 * erv[c] + 0.1 * vars[c] * (N * S) / (N * S - 1) end
    assert_close(rm, erm)
    assert_close(rv, erv)
  end)

  it("training on an empty batch leaves the running stats alone, and its grads are 0 (as PyTorch)", function()
    local rm, rv = randn({3}), kiln.rand(3, {dtype = "f64"}) + 0.5
    local rml, rvl = flat(rm), flat(rv)
    for _, shape in ipairs({{0, 3}, {2, 3, 0}}) do
      local x, w, b = leaf(randn(shape)), leaf(randn({3})), leaf(randn({3}))
      local y = F.batch_norm(x, rm, rv, w, b, {training = true})
      assert_shape(y, shape)
      y:backward(randn(shape))
      assert_close(rm, rml)
      assert_close(rv, rvl)
      assert_close(w.grad, {0, 0, 0})
      assert_close(b.grad, {0, 0, 0})
    end
  end)

  it("eval uses the running stats and leaves them alone", function()
    local x = randn({5, 3})
    local rm, rv = randn({3}), kiln.rand(3, {dtype = "f64"}) + 0.5
    local rml, rvl = flat(rm), flat(rv)
    local y = F.batch_norm(x, rm, rv, {training = false, eps = 1e-3})
    local xl, ref = flat(x), {}
    for i = 1, #xl do
      local c = (i - 1) % 3 + 1
      ref[i] = (xl[i] - rml[c]) / math.sqrt(rvl[c] + 1e-3)
    end
    assert_close(y, ref, {5, 3})
    assert_close(rm, rml)
    assert_close(rv, rvl)
  end)

  it("without running stats, uses the batch statistics even in eval", function()
    local x = randn({6, 2})
    local y = F.batch_norm(x, nil, nil)
    local ref = normalise(flat(x), 2, channel_members(6, 2, 1), 1e-5, function() return 1, 0 end)
    assert_close(y, ref, {6, 2})
  end)

  it("f32 matches the f64 result", function()
    local x = randn({4, 3, 5})
    local y64 = F.batch_norm(x, nil, nil, {training = true})
    local y32 = F.batch_norm(x:float(), nil, nil, {training = true})
    assert_close(y32, flat(y64), nil, 1e-5)
  end)

  it("gradients match finite differences in training (x, weight, bias)", function()
    local x, w, b = leaf(randn({4, 3, 2, 3})), leaf(randn({3})), leaf(randn({3}))
    local rm, rv = kiln.zeros(3, {dtype = "f64"}), kiln.ones(3, {dtype = "f64"})
    assert.gradcheck(function(a, c, d) return F.batch_norm(a, rm, rv, c, d, {training = true}) end, {x, w, b})
  end)

  it("gradients match finite differences in eval (x, weight, bias)", function()
    local x, w, b = leaf(randn({4, 3})), leaf(randn({3})), leaf(randn({3}))
    local rm, rv = randn({3}), kiln.rand(3, {dtype = "f64"}) + 0.5
    assert.gradcheck(function(a, c, d) return F.batch_norm(a, rm, rv, c, d) end, {x, w, b})
  end)
end)

describe("layer_norm and group_norm", function()
  before_each(function() kiln.manual_seed(5) end)

  it("layer_norm over the last two dims matches the naive loop", function()
    local x, w, b = randn({3, 4, 5}), randn({4, 5}), randn({4, 5})
    local y = F.layer_norm(x, {4, 5}, w, b, {eps = 1e-5})
    local wl, bl = flat(w), flat(b)
    local ref = normalise(flat(x), 3, function(g)
      local idx = {}
      for i = 1, 20 do idx[i] = (g - 1) * 20 + i end
      return idx
    end, 1e-5, function(i) local k = (i - 1) % 20 + 1 return wl[k], bl[k] end)
    assert_close(y, ref, {3, 4, 5})
  end)

  it("layer_norm without weights, f32", function()
    local x = randn({2, 7})
    local y = F.layer_norm(x:float(), 7)
    local ref = normalise(flat(x), 2, function(g) local idx = {} for i = 1, 7 do idx[i] = (g - 1) * 7 + i end return idx end,
                          1e-5, function() return 1, 0 end)
    assert_close(y, ref, {2, 7}, 1e-5)
  end)

  it("layer_norm gradients match finite differences (x, weight, bias)", function()
    local x = leaf(randn({3, 5, 4}):transpose(2, 3))   -- [3,4,5], non-contiguous
    local w, b = leaf(randn({5})), leaf(randn({5}))
    assert.gradcheck(function(a, c, d) return F.layer_norm(a, 5, c, d) end, {x, w, b})
    local x2, w2 = leaf(randn({2, 3, 4})), leaf(randn({3, 4}))
    assert.gradcheck(function(a, c) return F.layer_norm(a, {3, 4}, c) end, {x2, w2})
  end)

  it("group_norm matches the naive loop", function()
    local N, C, G, S = 2, 6, 3, 4
    local x, w, b = randn({N, C, 2, 2}), randn({C}), randn({C})
    local y = F.group_norm(x, G, w, b, {eps = 1e-5})
    local wl, bl = flat(w), flat(b)
    local per = C / G * S
    local ref = normalise(flat(x), N * G, function(g)
      local idx = {}
      for i = 1, per do idx[i] = (g - 1) * per + i end
      return idx
    end, 1e-5, function(i) local c = math.floor((i - 1) / S) % C + 1 return wl[c], bl[c] end)
    assert_close(y, ref, {N, C, 2, 2})
  end)

  it("group_norm gradients match finite differences (x, weight, bias)", function()
    local x, w, b = leaf(randn({3, 4, 3})), leaf(randn({4})), leaf(randn({4}))
    assert.gradcheck(function(a, c, d) return F.group_norm(a, 2, c, d) end, {x, w, b})
    local x2 = leaf(randn({2, 6}))
    assert.gradcheck(function(a) return F.group_norm(a, 3) end, {x2})
  end)
end)

-- ---- softmax ----

describe("softmax and log_softmax", function()
  before_each(function() kiln.manual_seed(6) end)

  for _, log in ipairs{false, true} do
    local name = log and "log_softmax" or "softmax"
    for dim = 1, 3 do
      it(name .. " along dim " .. dim .. " matches the naive loop", function()
        local x = randn({3, 4, 5}) * 3
        local y = F[name](x, dim)
        assert_close(y, ref_softmax(flat(x), {3, 4, 5}, dim, log), {3, 4, 5})
        local y32 = F[name](x:float(), dim - 4)   -- the same dim, counted from the end
        assert_close(y32, ref_softmax(flat(x), {3, 4, 5}, dim, log), {3, 4, 5}, 1e-5)
      end)
      it(name .. " along dim " .. dim .. ": gradient matches finite differences (non-contiguous)", function()
        local x = leaf(randn({5, 4, 3}):permute(3, 2, 1))   -- [3,4,5], non-contiguous
        assert.gradcheck(function(a) return F[name](a, dim) end, {x})
      end)
    end
  end

  it("is a method too, and stays finite for large inputs", function()
    local x = kiln.tensor({{1000, 1001, 1002}, {-1000, -1000, -1000}}, {dtype = "f64"})
    assert_close(x:softmax(2), ref_softmax(flat(x), {2, 3}, 2, false), {2, 3})
    assert_close(x:log_softmax(-1), ref_softmax(flat(x), {2, 3}, 2, true), {2, 3})
  end)

  it("in f32 along a last dim longer than a block of exps, with -inf masked entries exactly 0", function()
    local x = randn({3, 600}) * 4
    for _, log in ipairs{false, true} do
      local y32 = F[log and "log_softmax" or "softmax"](x:float(), 2)
      assert_close(y32, ref_softmax(flat(x), {3, 600}, 2, log), {3, 600}, 1e-5)
    end
    local m = kiln.tensor({{0.5, -math.huge, 2, -math.huge, -90}}):float()
    local p = m:softmax(2):totable()[1]
    assert.equal(0, p[2]) assert.equal(0, p[4])
    assert.is_true(p[5] >= 0 and p[5] < 1e-38)
    assert.near(1, p[1] + p[3] + p[5], 1e-6)
    local lp = m:log_softmax(2):totable()[1]
    assert.equal(-math.huge, lp[2])
    assert.near(0.5 - math.log(math.exp(0.5) + math.exp(2)), lp[1], 1e-6)
  end)

  it("in f32 along a long last dim: the max wherever it lies, a NaN anywhere makes its line NaN", function()
    for _, at in ipairs{1, 7, 16, 17, 300, 599, 600} do       -- in the vector lanes and in the tail
      local x = randn({2, 600})
      x[{1, at}] = 100                                        -- exp(100 - the rest) overflows f32: the max must be found
      x[{2, at}] = 0 / 0
      for _, log in ipairs{false, true} do
        local y = F[log and "log_softmax" or "softmax"](x:float(), 2):totable()
        local want = log and 0 or 1                            -- the max takes (almost) all the mass
        assert(math.abs(y[1][at] - want) < 1e-6, string.format("at %d: %g", at, y[1][at]))
        for c = 1, 600 do assert(y[2][c] ~= y[2][c], string.format("a NaN at %d: column %d is %g", at, c, y[2][c])) end
      end
    end
  end)
end)

-- ---- losses ----

describe("nll_loss and cross_entropy", function()
  before_each(function() kiln.manual_seed(7) end)

  local function labels(list, shape) return kiln.tensor(list, {dtype = "i64"}):view(shape) end

  local cases = {
    {name = "[N,C]", shape = {5, 4}, target = {1, 4, 2, 2, 3}},
    {name = "[N,C,d] with weights", shape = {2, 3, 4}, target = {1, 3, 2, 2, 3, 1, 1, 2}, weight = {0.2, 1.5, 0.7}},
    {name = "ignore_index", shape = {6, 3}, target = {1, 2, 3, 2, 3, 1}, ignore_index = 2, weight = {1.3, 0.4, 2.0}},
    {name = "label smoothing", shape = {4, 5}, target = {5, 1, 3, 3}, label_smoothing = 0.2},
    {name = "label smoothing, weights and ignore_index", shape = {2, 4, 3}, target = {4, 1, 2, 3, 4, 4},
     weight = {0.5, 1, 2, 0.25}, ignore_index = 4, label_smoothing = 0.1},
  }
  for _, cs in ipairs(cases) do
    for _, reduction in ipairs{"mean", "sum", "none"} do
      local function opts()
        return {weight = cs.weight and kiln.tensor(cs.weight, {dtype = "f64"}), ignore_index = cs.ignore_index,
                reduction = reduction}
      end
      local N, C = cs.shape[1], cs.shape[2]
      local S = numel(cs.shape) / (N * C)
      local tshape = {N}
      for d = 3, #cs.shape do tshape[#tshape + 1] = cs.shape[d] end
      local expected_shape = reduction == "none" and tshape or {}

      if not cs.label_smoothing then
        it("nll_loss " .. cs.name .. ", reduction " .. reduction .. " matches the reference", function()
          local logp = F.log_softmax(randn(cs.shape), 2)
          local loss = F.nll_loss(logp, labels(cs.target, tshape), opts())
          local l, total = ref_nll(flat(logp), N, C, S, cs.target, {weight = cs.weight, ignore_index = cs.ignore_index})
          assert_close(loss, reduce(l, total, reduction), expected_shape)
        end)
        it("nll_loss " .. cs.name .. ", reduction " .. reduction .. ": gradient matches finite differences", function()
          local logp = leaf(randn(cs.shape))
          assert.gradcheck(function(a) return F.nll_loss(a, labels(cs.target, tshape), opts()) end, {logp})
        end)
      end

      it("cross_entropy " .. cs.name .. ", reduction " .. reduction .. " matches the reference", function()
        local logits = randn(cs.shape) * 2
        local o = opts()
        o.label_smoothing = cs.label_smoothing
        local loss = F.cross_entropy(logits, labels(cs.target, tshape), o)
        local logp = ref_softmax(flat(logits), cs.shape, 2, true)
        local l, total = ref_nll(logp, N, C, S, cs.target, {weight = cs.weight, ignore_index = cs.ignore_index,
                                                            label_smoothing = cs.label_smoothing})
        assert_close(loss, reduce(l, total, reduction), expected_shape)
        local loss32 = F.cross_entropy(logits:float(), labels(cs.target, tshape), {weight = o.weight and o.weight:float(),
                                       ignore_index = o.ignore_index, label_smoothing = o.label_smoothing, reduction = reduction})
        assert_close(loss32, reduce(l, total, reduction), expected_shape, 1e-5)
      end)
      it("cross_entropy " .. cs.name .. ", reduction " .. reduction .. ": gradient matches finite differences", function()
        local logits = leaf(randn(cs.shape))
        local o = opts()
        o.label_smoothing = cs.label_smoothing
        assert.gradcheck(function(a) return F.cross_entropy(a, labels(cs.target, tshape), o) end, {logits})
      end)
    end
  end

  it("cross_entropy equals nll_loss of log_softmax, and takes a non-contiguous input", function()
    local logits = randn({5, 3}):t()   -- [3,5]
    local target = labels({5, 1, 3}, {3})
    local a = F.cross_entropy(logits, target)
    local b = F.nll_loss(F.log_softmax(logits, 2), target)
    assert_close(a, {b:item()}, {})
  end)

  it("mean over only ignored targets is NaN, as in PyTorch", function()
    local loss = F.cross_entropy(randn({2, 3}), labels({2, 2}, {2}), {ignore_index = 2})
    assert.is_true(loss:item() ~= loss:item())
  end)
end)

-- ---- dropout ----

describe("dropout", function()
  it("zeroes about p of the elements and scales the rest by 1/(1-p)", function()
    kiln.manual_seed(8)
    local x = kiln.ones(100, 100, {dtype = "f64"})
    local y = F.dropout(x, 0.3)
    local zeros, kept = 0, 0
    for _, v in ipairs(flat(y)) do
      if v == 0 then zeros = zeros + 1 else kept = kept + 1; assert.is_true(math.abs(v - 1 / 0.7) < 1e-12) end
    end
    assert.is_true(math.abs(zeros / 10000 - 0.3) < 0.03, "dropped " .. zeros)
  end)

  it("draws from the generator: a seed repeats the mask, the next call draws another", function()
    local x = kiln.ones(50, {dtype = "f32"})
    kiln.manual_seed(9)
    local a = flat(F.dropout(x, 0.5))
    local b = flat(F.dropout(x, 0.5))
    kiln.manual_seed(9)
    local c = flat(F.dropout(x, 0.5))
    assert.are.same(a, c)
    assert.are_not.same(a, b)
  end)

  it("is the identity in eval or with p = 0 (a new tensor that keeps the graph)", function()
    local x = leaf(randn({3, 4}))
    for _, y in ipairs{F.dropout(x, 0.5, false), F.dropout(x, 0), F.dropout(x, {p = 0.5, training = false})} do
      assert_close(y, flat(x), {3, 4}, 0)
      assert.is_true(y.requires_grad)
    end
  end)

  it("gradient matches finite differences (with the mask fixed by the seed)", function()
    local x = leaf(randn({4, 5}))
    assert.gradcheck(function(a) kiln.manual_seed(10) return F.dropout(a, 0.4) end, {x})
  end)
end)

-- ---- misuse ----

describe("misuse", function()
  it("a wrong channel count names both shapes; the next op works", function()
    local x, w = kiln.randn(2, 3, 8, 8), kiln.randn(4, 5, 3, 3)
    local msg = error_of(F.conv2d, x, w)
    assert_contains(msg, "conv2d", "[2,3,8,8]", "[4,5,3,3]", "3 channels")
    assert_shape(F.conv2d(x, kiln.randn(4, 3, 3, 3)), {2, 4, 6, 6})
  end)

  it("a 3-d input to conv2d", function()
    local msg = error_of(F.conv2d, kiln.randn(3, 8, 8), kiln.randn(4, 3, 3, 3))
    assert_contains(msg, "conv2d", "[3,8,8]", "has 3 dims", "[N,C,H,W]")
    assert_shape(F.conv2d(kiln.randn(1, 3, 8, 8), kiln.randn(4, 3, 3, 3)), {1, 4, 6, 6})
  end)

  it("labels out of range name the label and the class count; the next loss works", function()
    local logits = kiln.randn(3, 5)
    local msg = error_of(F.cross_entropy, logits, kiln.tensor({1, 6, 2}, {dtype = "i64"}))
    assert_contains(msg, "cross_entropy", "target index 6", "5 classes")
    msg = error_of(F.nll_loss, logits, kiln.tensor({0, 1, 2}, {dtype = "i64"}))
    assert_contains(msg, "nll_loss", "target index 0", "5 classes", "counting from 1")
    assert.is_true(F.cross_entropy(logits, kiln.tensor({1, 5, 2}, {dtype = "i64"})):item() > 0)
  end)

  it("other bad arguments", function()
    assert_contains(error_of(F.conv2d, kiln.ones(1, 1, 4, 4, {dtype = "i64"}), kiln.ones(1, 1, 2, 2, {dtype = "i64"})),
                    "conv2d", "i64", "f32 or f64")
    assert_contains(error_of(F.conv2d, kiln.randn(1, 1, 4, 4), kiln.randn(1, 1, 2, 2, {dtype = "f64"})), "weight", "f64", "f32")
    assert_contains(error_of(F.conv2d, kiln.randn(1, 1, 2, 2), kiln.randn(1, 1, 3, 3)), "conv2d", "smaller than the kernel")
    assert_contains(error_of(F.conv2d, kiln.randn(1, 4, 5, 5), kiln.randn(4, 2, 3, 3), {groups = 3}), "groups")
    assert_contains(error_of(F.conv2d, kiln.randn(1, 1, 5, 5), kiln.randn(2, 1, 3, 3), kiln.randn(3)), "bias", "[3]")
    assert_contains(error_of(F.conv2d, kiln.randn(1, 1, 5, 5), kiln.randn(2, 1, 3, 3), nil, {strides = 2}), "unknown option")
    assert_contains(error_of(F.max_pool2d, kiln.randn(1, 1, 5, 5), 2, {padding = 2}), "max_pool2d", "padding")
    assert_contains(error_of(F.max_pool2d, kiln.randn(5, 5), 2), "max_pool2d", "[5,5]")
    assert_contains(error_of(F.batch_norm, kiln.randn(4, 3), kiln.zeros(2), kiln.ones(2)), "running_mean", "[2]", "[4,3]")
    assert_contains(error_of(F.batch_norm, kiln.randn(1, 3), nil, nil, {training = true}), "batch_norm", "one value per channel")
    assert_contains(error_of(F.layer_norm, kiln.randn(2, 3), 4), "layer_norm", "normalized_shape")
    assert_contains(error_of(F.group_norm, kiln.randn(2, 6), 4), "group_norm", "6 channels", "4 groups")
    assert_contains(error_of(F.softmax, kiln.randn(2, 3), 3), "softmax", "dim 3 out of range")
    assert_contains(error_of(F.cross_entropy, kiln.randn(3, 5), kiln.tensor({1, 2}, {dtype = "i64"})), "target [2]", "[3,5]")
    assert_contains(error_of(F.cross_entropy, kiln.randn(3, 5), kiln.ones(3)), "target", "f32")
    assert_contains(error_of(F.cross_entropy, kiln.randn(3, 5), kiln.ones(3, {dtype = "i64"}), {reduction = "avg"}), "reduction")
    assert_contains(error_of(F.dropout, kiln.randn(3), 1), "dropout", "p = 1")
    assert_contains(error_of(F.dropout, kiln.randn(3), -0.1), "dropout")
    assert_shape(F.dropout(kiln.randn(3), 0.5), {3})
  end)
end)

-- ---- threads ----

describe("conv at 1 and 2 threads", function()
  local saved
  before_each(function() saved = kiln.get_num_threads() end)
  after_each(function() kiln.set_num_threads(saved) end)

  local function run(threads, x, w, b, opts)
    kiln.set_num_threads(threads)
    local xl, wl, bl = leaf(x), leaf(w), leaf(b)
    local y = F.conv2d(xl, wl, bl, opts)
    local g = y:detach() * 0.5 - 0.25
    y:backward(g)
    return flat(y), flat(xl.grad), flat(wl.grad), flat(bl.grad)
  end

  for _, cs in ipairs{
    {name = "the benchmark's first conv", xs = {64, 1, 28, 28}, ws = {32, 1, 5, 5}},
    {name = "the benchmark's second conv", xs = {64, 32, 12, 12}, ws = {64, 32, 5, 5}},
    {name = "an odd batch with stride, padding and groups", xs = {19, 4, 9, 7}, ws = {6, 2, 3, 3}, opts = {stride = 2, padding = 1, groups = 2}},
  } do
    it("forward and backward are bitwise the same: " .. cs.name, function()
      kiln.manual_seed(11)
      local x, w, b = kiln.randn(cs.xs), kiln.randn(cs.ws), kiln.randn(cs.ws[1])
      local r1 = {run(1, x, w, b, cs.opts)}
      local r2 = {run(2, x, w, b, cs.opts)}
      for k = 1, 4 do
        assert.are.equal(#r1[k], #r2[k])
        for i = 1, #r1[k] do
          if r1[k][i] ~= r2[k][i] then
            error(string.format("result %d, element %d: %.9g at 1 thread, %.9g at 2", k, i, r1[k][i], r2[k][i]))
          end
        end
      end
    end)
  end
end)

-- bit for bit: NaN equals NaN, and +0 differs from -0
local function same_bits(a, b, what)
  local x, y = flat(a), flat(b)
  assert(#x == #y, what .. ": sizes differ")
  for i = 1, #x do
    local u, v = x[i], y[i]
    local ok = (u ~= u and v ~= v) or (u == v and (u ~= 0 or 1 / u == 1 / v))
    assert(ok, string.format("%s: element %d is %.9g, expected %.9g", what, i, u, v))
  end
end
local function grads(fn, x, w, b, gy)
  local y = fn(x, w, b)
  y:mul(gy):sum():backward()
  local r = {y = y:detach(), gx = x.grad, gw = w.grad, gb = b and b.grad}
  for _, t in ipairs{x, w, b} do t.grad = nil end
  return r
end
-- the fused call and the three ops give the same output and grads, bit for bit, at 1 and 2 threads
local function agree(fused, three, x, w, b, label)
  local threads = kiln.get_num_threads()
  local gy = kiln.randn(fused(x, w, b):size())
  for _, t in ipairs{1, 2} do
    kiln.set_num_threads(t)
    local a, e = grads(fused, x, w, b, gy), grads(three, x, w, b, gy)
    local what = string.format("%s at %d threads", label, t)
    same_bits(a.y, e.y, what .. ": output")
    for _, g in ipairs{"gx", "gw", "gb"} do
      assert(not a[g] == not e[g], what .. ": " .. g .. " given by one and not the other")
      if a[g] then same_bits(a[g], e[g], what .. ": " .. g) end
    end
  end
  kiln.set_num_threads(threads)
end

describe("conv2d_relu_max_pool2d", function()
  local fused_here = kiln.info().cpu.level == "avx512" and kiln.info().onednn.name ~= nil

  it("has the bits of conv2d, relu and max_pool2d in its output and every grad, at 1 and 2 threads", function()
    -- x [N,C,H,W], O, k, options, which inputs want grads (x, w, b; b false: no bias)
    local cases = {
      {{64, 1, 28, 28}, 32, 5, {}, {false, true, true}},     -- the CNN's first layer
      {{64, 32, 12, 12}, 64, 5, {}, {true, true, true}},     -- and its second
      {{5, 3, 13, 11}, 20, 3, {padding = 1}, {true, true, true}},   -- 20 channels: a part-filled block; odd sides
      {{3, 17, 9, 40}, 33, 3, {}, {true, true, false}},      -- pooled rows of 19: two chunks of sixteen
      {{2, 8, 15, 36}, 16, 2, {stride = 2}, {false, false, true}},  -- the bias grad alone
      {{4, 6, 10, 10}, 12, 3, {groups = 2, dilation = 2}, {true, true, true}},
      {{17, 4, 9, 9}, 16, 2, {}, {true, true, true}},        -- 17 images: parts of two sizes
    }
    for n, case in ipairs(cases) do
      kiln.manual_seed(n)
      local shape, O, k, opts, want = case[1], case[2], case[3], case[4], case[5]
      local x = kiln.randn(shape):requires_grad_(want[1])
      if n == 3 then   -- NaN in an image: its windows are NaN, and the grads equal the three ops'
        local d = flat(x)
        d[numel(shape) / shape[1] + 2 * shape[4] + 4] = 0 / 0
        x = kiln.tensor(d, {dtype = "f32"}):view(shape):requires_grad_(want[1])
      end
      local w = (kiln.randn(O, shape[2] / (opts.groups or 1), k, k) * 0.3):requires_grad_(want[2])
      local b = want[3] ~= false and kiln.randn(O):requires_grad_(want[3]) or nil
      local fused = function(x_, w_, b_) return F.conv2d_relu_max_pool2d(x_, w_, b_, opts) end
      local three = function(x_, w_, b_) return F.max_pool2d(F.conv2d(x_, w_, b_, opts):relu(), 2) end
      agree(fused, three, x, w, b, "case " .. n)
      if n == 3 then assert.is_true(fused(x, w, b):isnan():any():item()) end
    end
  end)

  it("under bf16 autocast has the bits of the three bf16 ops, in oneDNN's layout and in the columns", function()
    -- x [N,C,H,W], O, k, options, which inputs want grads (x, w, b), the layout it runs in here
    local cases = {
      {{64, 1, 28, 28}, 32, 5, {}, {false, true, true}, "columns"},   -- the one-channel first layer (auto rule)
      {{6, 1, 20, 20}, 16, 3, {padding = 1}, {true, true, true}, "columns"},
      {{64, 32, 12, 12}, 64, 5, {}, {true, true, true}, "oneDNN"},
      {{3, 17, 9, 40}, 33, 3, {}, {true, true, false}, "oneDNN"},     -- a part-filled block, pooled rows of 19
      {{4, 16, 11, 12}, 32, 3, {}, {false, false, true}, "oneDNN"},   -- the bias grad alone; 90 positions a plane
      {{2, 1, 13, 12}, 8, 3, {}, {false, true, true}, "columns"},     -- an odd last row; 110 positions
    }
    for n, case in ipairs(cases) do
      kiln.manual_seed(20 + n)
      local shape, O, k, opts, want = case[1], case[2], case[3], case[4], case[5]
      local d = flat(kiln.randn(shape))
      if n == 3 then d[7] = 0 / 0 d[8] = -0.0 end   -- a NaN and a -0 in the first image
      local x = kiln.tensor(d, {dtype = "f32"}):view(shape):requires_grad_(want[1])
      local w = (kiln.randn(O, shape[2], k, k) * 0.3):requires_grad_(want[2])
      local b = want[3] ~= false and kiln.randn(O):requires_grad_(want[3]) or nil
      local function amp(fn) return function(x_, w_, b_) return kiln.amp.autocast("bf16", function() return fn(x_, w_, b_):float() end) end end
      local fused = amp(function(x_, w_, b_) return F.conv2d_relu_max_pool2d(x_, w_, b_, opts) end)
      local three = amp(function(x_, w_, b_) return F.max_pool2d(F.conv2d(x_, w_, b_, opts):relu(), 2) end)
      agree(fused, three, x, w, b, "bf16 case " .. n)
      if fused_here and kiln.conv_algorithm() == "auto" and not kiln.conv_benchmark() then   -- it ran as one kernel
        local y = kiln.amp.autocast("bf16", function() return F.conv2d_relu_max_pool2d(x, w, b, opts) end)
        assert.equal("Conv2d_relu_max_pool2dBackward", y.grad_fn, "bf16 case " .. n .. " (" .. case[6] .. ")")
      end
    end
  end)

  it("runs as one kernel for f32 where it can (avx512 and oneDNN), and as the three ops elsewhere", function()
    local x, w = kiln.randn(2, 3, 12, 12):requires_grad_(), kiln.randn(16, 3, 3, 3):requires_grad_()
    -- im2col forced or benchmark mode: the three ops (the choice is theirs)
    local one = fused_here and kiln.conv_algorithm() ~= "im2col" and not kiln.conv_benchmark()
    assert.equal(one and "Conv2d_relu_max_pool2dBackward" or "Max_pool2dBackward", F.conv2d_relu_max_pool2d(x, w).grad_fn)
    assert.equal("Max_pool2dBackward", F.conv2d_relu_max_pool2d(x:double(), w:double()).grad_fn)
    assert_shape(F.conv2d_relu_max_pool2d(x, w), {2, 16, 5, 5})
  end)

  it("is what nn.Sequential runs for Conv2d, ReLU, MaxPool2d(2), with the bits of nn.fusion = false", function()
    local nn = kiln.nn
    kiln.manual_seed(3)
    local model = nn.Sequential{nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
                                nn.Flatten(), nn.Linear(16 * 5 * 5, 10)}
    local x = kiln.randn(6, 1, 26, 26)
    local function run()
      model:zero_grad()
      local y = model(x)
      y:sum():backward()
      local r = {y:detach()}
      for _, p in ipairs(model:parameters()) do r[#r + 1] = p.grad:clone() end
      return r
    end
    local fused = run()
    nn.fusion = false
    local ok, three = pcall(run)
    nn.fusion = nil
    assert(ok, three)
    for i = 1, #fused do same_bits(fused[i], three[i], "tensor " .. i) end
    -- what fuses: the three modules as kiln defines them, the pool 2x2 at stride 2
    local conv, relu = nn.Conv2d(1, 4, 3), nn.ReLU()
    assert.is_true(nn._fuses_relu_max_pool2d(conv, relu, nn.MaxPool2d(2)))
    assert.is_false(nn._fuses_relu_max_pool2d(conv, relu, nn.MaxPool2d(3)))
    assert.is_false(nn._fuses_relu_max_pool2d(conv, relu, nn.MaxPool2d(2, {stride = 1})))
    assert.is_false(nn._fuses_relu_max_pool2d(conv, nn.Tanh(), nn.MaxPool2d(2)))
    local own = nn.Conv2d(1, 4, 3)
    own.forward = function(self, t) return t end
    assert.is_false(nn._fuses_relu_max_pool2d(own, relu, nn.MaxPool2d(2)))
  end)

  it("says what was wrong in its own name, and the next call works", function()
    local x, w = kiln.randn(2, 3, 8, 8), kiln.randn(4, 5, 3, 3)
    local ok, err = pcall(F.conv2d_relu_max_pool2d, x, w)
    assert.is_false(ok)
    assert.matches("conv2d_relu_max_pool2d: input %[2,3,8,8%] has 3 channels but weight %[4,5,3,3%] expects 5", err)
    ok, err = pcall(F.conv2d_relu_max_pool2d, kiln.randn(2, 3, 3, 3), kiln.randn(4, 3, 3, 3))
    assert.is_false(ok)
    assert.matches("max_pool2d: input %[2,4,1,1%] is too small", err)
    assert_shape(F.conv2d_relu_max_pool2d(x, kiln.randn(4, 3, 3, 3)), {2, 4, 3, 3})
  end)
end)

describe("linear and linear_relu", function()
  local nn = kiln.nn
  -- the leading dims of x flattened into one product, as PyTorch's linear does
  local function three(relu)
    return function(x, w, b)
      local sizes, rows = {}, 1
      for d = 1, x:dim() - 1 do sizes[d], rows = x:size(d), rows * x:size(d) end
      sizes[math.max(x:dim(), 1)] = w:size(1)
      local y = x:reshape(rows, x:size(-1)):matmul(w:t())
      if b then y = y + b end
      return (relu and y:relu() or y):view(sizes)
    end
  end

  it("have the bits of matmul, add and relu in the output and every grad, f32 and f64, at 1 and 2 threads", function()
    -- x's sizes, out features, which inputs want grads (x, w, b; b false: no bias)
    local cases = {
      {{128, 784}, 512, {false, true, true}},    -- the MLP's first layer
      {{128, 256}, 10, {true, true, true}},      -- 10 columns: the BLAS's product, then bias and relu
      {{7, 2100}, 33, {true, true, true}},       -- k past kiln's 2048-row block: the last block's stores
      {{4, 40}, 80, {true, true, true}},         -- C^T computed (a sixteenth as many rows as columns): bias by rows
      {{2, 3, 5, 64}, 70, {true, true, false}},  -- 4-d input, no bias
      {{1, 48}, 80, {true, true, true}},         -- one row: the BLAS's product
      {{64}, 16, {true, false, true}},           -- 1-d input
      {{9, 0}, 5, {true, true, true}},           -- no features: the bias alone
    }
    for n, case in ipairs(cases) do
      for _, dtype in ipairs{"f32", "f64"} do
        kiln.manual_seed(n)
        local shape, O, want = case[1], case[2], case[3]
        local d = flat(kiln.randn(shape))
        if n == 2 then d[5] = 0 / 0 end   -- NaN in a row: NaN through relu, and in the grads
        local x = kiln.tensor(d, {dtype = dtype}):view(shape):requires_grad_(want[1])
        local w = (kiln.randn(O, shape[#shape], {dtype = dtype}) * 0.3):requires_grad_(want[2])
        local b = want[3] ~= false and kiln.randn(O, {dtype = dtype}):requires_grad_(want[3]) or nil
        agree(F.linear, three(false), x, w, b, string.format("linear case %d %s", n, dtype))
        agree(F.linear_relu, three(true), x, w, b, string.format("linear_relu case %d %s", n, dtype))
        if n == 2 then assert.is_true(F.linear_relu(x, w, b):isnan():any():item()) end
      end
    end
  end)

  it("reads a transposed input and weight, a strided bias, and operands with odd strides", function()
    local x = kiln.randn(20, 30):t():requires_grad_()          -- [30, 20], columns along
    local w = kiln.randn(20, 40):t():requires_grad_()          -- [40, 20]
    local b = kiln.randn(40, 2):select(2, 1):requires_grad_()  -- every other element
    agree(F.linear_relu, three(true), x, w, b, "strided")
    -- every other column: strides no BLAS layout takes, copied first (f32 and f64)
    for _, dtype in ipairs{"f32", "f64"} do
      local xs = kiln.randn(30, 20, 2, {dtype = dtype}):select(3, 1):requires_grad_()   -- [30, 20], strides (40, 2)
      local ws = kiln.randn(40, 20, 2, {dtype = dtype}):select(3, 2):requires_grad_()   -- [40, 20]
      agree(F.linear_relu, three(true), xs, ws, kiln.randn(40, {dtype = dtype}):requires_grad_(), "every other column " .. dtype)
      agree(F.linear, three(false), xs, ws, nil, "every other column, no bias " .. dtype)
    end
  end)

  it("is one op on the CPU in f32 and f64, and matmul, add and relu under bf16 autocast", function()
    local x, w, b = kiln.randn(6, 8):requires_grad_(), kiln.randn(5, 8):requires_grad_(), kiln.randn(5):requires_grad_()
    assert.equal("LinearBackward", F.linear(x, w, b).grad_fn)
    assert.equal("LinearBackward", F.linear_relu(x:double(), w:double(), b:double()).grad_fn)
    assert.equal("ViewBackward", F.linear(x:view(2, 3, 8), w).grad_fn)   -- the op's [6, 5] viewed as [2, 3, 5]
    local y = kiln.amp.autocast("bf16", function() return F.linear_relu(x, w, b) end)
    assert.equal("bf16", y:dtype())
    assert.equal("ReluBackward", y.grad_fn)
    -- the bias is cast with the input and the weight, as PyTorch's autocast casts linear's
    local e = (x:bfloat16():matmul(w:bfloat16():t()) + b:bfloat16()):relu()
    same_bits(y:float(), e:float(), "bf16 linear_relu")
    -- the three ops flatten a 3-d input into one product too
    local x3 = kiln.randn(2, 3, 8)
    local y3 = kiln.amp.autocast("bf16", function() return F.linear(x3, w, b) end)
    assert_shape(y3, {2, 3, 5})
    same_bits(y3:float(), (x3:reshape(6, 8):bfloat16():matmul(w:bfloat16():t()) + b:bfloat16()):view(2, 3, 5):float(),
              "bf16 linear of a 3-d input")
  end)

  it("is what nn.Sequential runs for a Linear and a ReLU, unless nn.fusion is false", function()
    kiln.manual_seed(3)
    local net = nn.Sequential{nn.Linear(12, 20), nn.ReLU(), nn.Linear(20, 7), nn.ReLU(), nn.Linear(7, 3)}
    local x = kiln.randn(9, 12)
    local y = net(x)
    local a = net[4](net[3](net[2](net[1](x))))
    assert.equal("ReluBackward", a.grad_fn)
    same_bits(net[5](a), y, "Sequential")
    local h = nn.Sequential{net[1], net[2]}(x)
    assert.equal("LinearBackward", h.grad_fn)
    nn.fusion = false
    local ok, r = pcall(function() return nn.Sequential{net[1], net[2]}(x) end)
    nn.fusion = nil
    assert.is_true(ok, tostring(r))
    assert.equal("ReluBackward", r.grad_fn)
    same_bits(r, h, "nn.fusion = false")
    local relu = nn.ReLU()
    relu.forward = function(_, t) return t:relu() * 2 end   -- a replaced forward: not fused
    same_bits(nn.Sequential{net[1], relu}(x), net[1](x):relu() * 2, "replaced ReLU forward")
  end)

  it("names the shapes and dtypes that do not fit, and the next call works", function()
    local function err(fn, ...) local ok, e = pcall(fn, ...) assert.is_false(ok) return tostring(e) end
    assert.matches("linear: input %[4,6%] has 6 features in its last dim but weight %[3,5%] expects 5",
                   err(F.linear, kiln.randn(4, 6), kiln.randn(3, 5)))
    assert.matches("linear: weight %[15%] must be 2%-d", err(F.linear, kiln.randn(4, 5), kiln.randn(15)))
    assert.matches("linear: bias %[4%] does not fit weight %[3,5%] %(expected %[3%]%)",
                   err(F.linear_relu, kiln.randn(4, 5), kiln.randn(3, 5), kiln.randn(4)))
    assert.matches("linear: input %[4,5%] f32, weight %[3,5%] f64: dtypes differ",
                   err(F.linear, kiln.randn(4, 5), kiln.randn(3, 5, {dtype = "f64"})))
    assert.matches("linear: not defined for bool tensors",
                   err(F.linear, kiln.ones(4, 5, {dtype = "bool"}), kiln.ones(3, 5, {dtype = "bool"})))
    local freed = kiln.randn(4, 5)
    freed:free()
    assert.matches("linear: tensor %[4,5%] f32 was freed", err(F.linear, freed, kiln.randn(3, 5)))
    assert_shape(F.linear_relu(kiln.randn(4, 5), kiln.randn(3, 5), kiln.randn(3)), {4, 3})
    assert_shape(F.linear(kiln.randn(2, 0, 5), kiln.randn(3, 5), kiln.randn(3)), {2, 0, 3})
    -- relu's saved output written in place before backward: the error names the op
    local x, w = kiln.randn(4, 5):requires_grad_(), kiln.randn(3, 5):requires_grad_()
    local y = F.linear_relu(x, w)
    y:add_(1)
    assert.matches("backward: linear saved %[4,3%] for its derivative, and it was changed in place",
                   err(function() y:sum():backward() end))
  end)
end)
