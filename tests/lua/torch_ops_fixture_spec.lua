-- kiln's tensor ops (sort, topk, the scans, pad, interpolate, repeat, roll, einsum, unfold/fold,
-- diag, ...) against PyTorch itself: tests/fixtures/torch_ops.safetensors holds what PyTorch 2.15
-- computed in f64 (values, and the gradients of sum(y * r) for a stored r) on the same inputs
-- (tools/torch_fixtures.py --only torch_ops wrote it). PyTorch counts dims and indices from 0,
-- kiln from 1: the calls below say each in kiln's terms.
local kiln = kiln or require "kiln"
local F = require "kiln.functional"
local DIR = debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/"
package.path = DIR .. "?.lua;" .. package.path
local H = require "helpers"

local fx, DEV = H.torch_fixture("torch_ops.safetensors")
if not fx then
  describe("tensor ops against PyTorch", function() it("needs the device", function() pending(DEV) end) end)
  return
end
local TOL = 1e-10

local function get(case, name)
  return assert(fx[case .. "." .. name], "the fixture lacks " .. case .. "." .. name):to(DEV)
end
local function near(got, want, what, tol)
  assert.same(want:size(), got:size(), what .. ": shape")
  local ok, msg = H.compare(got:to("cpu"), want:to("cpu"):totable(), tol or TOL)
  assert(ok, what .. ": " .. tostring(msg))
end
-- PyTorch's indices (from 0) as kiln's (from 1)
local function indices(case, name) return get(case, name) + 1 end

-- y = fn(inputs...) against the case's y, then the grads of sum(y * r) against grad_<name>.
local function check(case, names, fn, tol)
  local inputs = {}
  for i, name in ipairs(names) do inputs[i] = get(case, name):clone():requires_grad_() end
  local y = fn(unpack(inputs))
  near(y, get(case, "y"), case .. ": value", tol)
  ;(y * get(case, "r")):sum():backward()
  for i, name in ipairs(names) do
    local g = inputs[i].grad or kiln.zeros_like(inputs[i])
    near(g, get(case, "grad_" .. name), case .. ": grad of " .. name, tol)
  end
end

describe("tensor ops against PyTorch", function()
  it("sort and argsort: stable among ties, ascending and descending, along either dim", function()
    local x = get("sort", "x")
    for _, c in ipairs({{"last", -1, false}, {"last_desc", -1, true}, {"first", 1, false}, {"first_desc", 1, true}}) do
      local v, i = x:sort(c[2], c[3])
      near(v, get("sort", c[1] .. "_values"), "sort " .. c[1])
      assert.same(indices("sort", c[1] .. "_indices"):totable(), i:totable(), "sort " .. c[1] .. " indices")
      assert.same(i:totable(), x:argsort{dim = c[2], descending = c[3]}:totable(), "argsort " .. c[1])
    end
  end)

  it("sort puts NaN last ascending and first descending", function()
    local x = get("sort_nan", "x")
    for _, c in ipairs({{"asc", false}, {"desc", true}}) do
      local v, i = x:sort(2, c[2])
      assert.same(indices("sort_nan", c[1] .. "_indices"):totable(), i:totable(), c[1])
      assert.same(get("sort_nan", c[1] .. "_values"):isnan():totable(), v:isnan():totable(), c[1])
    end
    check("sort_grad", {"x"}, function(x) return (x:sort(2)) end)
  end)

  it("topk: the largest and the smallest, along either dim, with their indices", function()
    local x = get("topk", "x")
    for _, c in ipairs({{"largest", 3, 2, true}, {"smallest", 3, 2, false}, {"dim0", 2, 1, true}}) do
      local v, i = x:topk(c[2], c[3], c[4])
      near(v, get("topk", c[1] .. "_values"), "topk " .. c[1])
      assert.same(indices("topk", c[1] .. "_indices"):totable(), i:totable(), "topk " .. c[1] .. " indices")
    end
    check("topk_grad", {"x"}, function(x) return (x:topk(2, 2)) end)
  end)

  it("cumsum and cumprod (through a zero), with their gradients", function()
    check("cumsum", {"x"}, function(x) return x:cumsum(2) end)
    check("cumprod", {"x"}, function(x) return x:cumprod(1) end)
  end)

  it("erfinv and atan2 (broadcast), with their gradients", function()
    check("erfinv", {"x"}, function(x) return x:erfinv() end, 1e-9)
    check("atan2", {"a", "b"}, function(a, b) return a:atan2(b) end)
  end)

  it("pad: constant (with a value, and cropping), reflect, replicate, circular, in PyTorch's order", function()
    check("pad_constant", {"x"}, function(x) return F.pad(x, {1, 2, 0, 1}, {value = 0.5}) end)
    check("pad_negative", {"x"}, function(x) return F.pad(x, {-1, 2, 1, -2}) end)
    check("pad_reflect", {"x"}, function(x) return F.pad(x, {2, 1, 1, 3}, "reflect") end)
    check("pad_replicate", {"x"}, function(x) return F.pad(x, {2, 3, 1, 0}, {mode = "replicate"}) end)
    check("pad_circular", {"x"}, function(x) return F.pad(x, {1, 2, 2, 1}, "circular") end)
    check("pad_reflect1d", {"x"}, function(x) return F.pad(x, {2, 3}, "reflect") end)
  end)

  it("interpolate: nearest and (bi)linear, align_corners both ways, by size and by scale_factor", function()
    check("interp_nearest_size", {"x"}, function(x) return F.interpolate(x, {size = {7, 3}}) end)
    check("interp_nearest_scale", {"x"}, function(x) return F.interpolate(x, {scale_factor = 2, mode = "nearest"}) end)
    check("interp_bilinear", {"x"}, function(x) return F.interpolate(x, {size = {7, 8}, mode = "bilinear"}) end)
    check("interp_bilinear_ac", {"x"}, function(x)
      return F.interpolate(x, {size = {7, 8}, mode = "bilinear", align_corners = true})
    end)
    check("interp_bilinear_scale", {"x"}, function(x)
      return F.interpolate(x, {scale_factor = 1.5, mode = "bilinear", align_corners = false})
    end)
    check("interp_bilinear_down", {"x"}, function(x) return F.interpolate(x, {size = {3, 2}, mode = "bilinear"}) end)
    check("interp_linear", {"x"}, function(x) return F.interpolate(x, {size = 8, mode = "linear"}) end)
  end)

  it("interpolate: bicubic (align_corners both ways), area, trilinear and nearest-exact, up, down, by size and scale", function()
    local sizes = {
      up = {size = {7, 8}}, down = {size = {3, 2}}, mixed = {size = {2, 9}}, scale = {scale_factor = {1.7, 0.6}},
      recompute = {scale_factor = 1.7, recompute_scale_factor = true},
    }
    for name, o in pairs(sizes) do
      for _, ac in ipairs({false, true}) do
        local case = "interp_bicubic_" .. name .. (ac and "_ac" or "")
        check(case, {"x"}, function(x)
          local opts = {mode = "bicubic", align_corners = ac}
          for k, v in pairs(o) do opts[k] = v end
          return F.interpolate(x, opts)
        end)
      end
    end
    for name, o in pairs({up = {size = {7, 8}}, down = {size = {3, 2}}, mixed = {size = {3, 7}}, scale = {scale_factor = 0.5}}) do
      for _, mode in ipairs({"area", "nearest-exact"}) do
        check("interp_" .. mode:gsub("-", "_") .. "_" .. name, {"x"}, function(x)
          return F.interpolate(x, {mode = mode, size = o.size, scale_factor = o.scale_factor})
        end)
      end
    end
    check("interp_area_1d", {"x"}, function(x) return F.interpolate(x, {size = 3, mode = "area"}) end)
    check("interp_area_1d_up", {"x"}, function(x) return F.interpolate(x, {size = 10, mode = "area"}) end)
    check("interp_nearest_exact_1d", {"x"}, function(x) return F.interpolate(x, {scale_factor = 1.6, mode = "nearest-exact"}) end)
    check("interp_area_3d", {"x"}, function(x) return F.interpolate(x, {size = {2, 5, 3}, mode = "area"}) end)
    check("interp_nearest_3d", {"x"}, function(x) return F.interpolate(x, {size = {5, 3, 7}}) end)
    check("interp_nearest_exact_3d", {"x"}, function(x) return F.interpolate(x, {size = {5, 3, 7}, mode = "nearest-exact"}) end)
    for name, o in pairs({up = {size = {5, 6, 7}}, down = {size = {2, 3, 2}}, scale = {scale_factor = {1.5, 0.7, 2}}}) do
      for _, ac in ipairs({false, true}) do
        check("interp_trilinear_" .. name .. (ac and "_ac" or ""), {"x"}, function(x)
          return F.interpolate(x, {mode = "trilinear", align_corners = ac, size = o.size, scale_factor = o.scale_factor})
        end)
      end
    end
    check("interp_bilinear_kept", {"x"}, function(x) return F.interpolate(x, {scale_factor = {1.3, 1.5}, mode = "bilinear"}) end)
  end)

  it("repeat, tile, repeat_interleave (a count, counts per element, flat) and roll", function()
    check("repeat", {"x"}, function(x) return x["repeat"](x, 2, 1, 3) end)
    check("tile", {"x"}, function(x) return x:tile(2) end)
    check("repeat_interleave", {"x"}, function(x) return x:repeat_interleave(2, 1) end)
    check("repeat_interleave_tensor", {"x"}, function(x)
      return x:repeat_interleave(kiln.tensor({1, 0, 3}, {dtype = "i64"}), 1)
    end)
    check("repeat_interleave_flat", {"x"}, function(x) return x:repeat_interleave(2) end)
    check("roll", {"x"}, function(x) return x:roll(1, 2) end)
    check("roll_two", {"x"}, function(x) return x:roll({2, -1}, {1, 2}) end)
    check("roll_flat", {"x"}, function(x) return x:roll(5) end)
  end)

  it("einsum: products, batches, attention scores, outer, diagonal, trace, sums, implicit output, three operands", function()
    check("einsum_mm", {"a", "b"}, function(a, b) return kiln.einsum("ij,jk->ik", a, b) end)
    check("einsum_bmm", {"a", "b"}, function(a, b) return kiln.einsum("bij,bjk->bik", a, b) end)
    check("einsum_attn", {"a", "b"}, function(a, b) return kiln.einsum("bhqd,bhkd->bhqk", a, b) end)
    check("einsum_outer", {"a", "b"}, function(a, b) return kiln.einsum("i,j->ij", a, b) end)
    check("einsum_diag", {"a"}, function(a) return kiln.einsum("ii->i", a) end)
    check("einsum_trace", {"a"}, function(a) return kiln.einsum("ii", a):reshape(1) end)
    check("einsum_transpose", {"a"}, function(a) return kiln.einsum("ij->ji", a) end)
    check("einsum_sum", {"a", "b"}, function(a, b) return kiln.einsum("ijk,ik->j", a, b) end)
    check("einsum_implicit", {"a", "b"}, function(a, b) return kiln.einsum("ij,jk", a, b) end)
    check("einsum_three", {"a", "b", "c"}, function(a, b, c) return kiln.einsum("ij, jk, kl -> il", {a, b, c}) end)
  end)

  it("unfold and fold (im2col, col2im) with per-dim kernel, dilation and stride, and padding", function()
    local o = {dilation = {1, 2}, padding = 1, stride = {2, 1}}
    check("unfold", {"x"}, function(x) return F.unfold(x, {2, 3}, o) end)
    check("fold", {"c"}, function(c) return F.fold(c, {5, 6}, {2, 3}, o) end)
  end)

  it("diag, trace, outer, baddbmm, addcmul, addcdiv, lerp and clamp with tensor bounds", function()
    check("diag_vector", {"v"}, function(v) return v:diag(1) end)
    check("diag_vector_below", {"v"}, function(v) return v:diag(-2) end)
    check("diag_matrix", {"m"}, function(m) return m:diag() end)
    check("diag_matrix_above", {"m"}, function(m) return m:diag(2) end)
    check("diag_matrix_below", {"m"}, function(m) return m:diag(-1) end)
    check("trace", {"m"}, function(m) return m:trace():reshape(1) end)
    check("outer", {"a", "b"}, function(a, b) return a:outer(b) end)
    check("baddbmm", {"c", "a", "b"}, function(c, a, b) return c:baddbmm(a, b, {beta = 0.5, alpha = 2}) end)
    check("addcmul", {"a", "b", "c"}, function(a, b, c) return a:addcmul(b, c, 0.3) end)
    check("addcdiv", {"a", "b", "c"}, function(a, b, c) return a:addcdiv(b, c, {value = 0.3}) end)
    check("lerp", {"a", "b", "w"}, function(a, b, w) return a:lerp(b, w) end)
    check("lerp_scalar", {"a", "b"}, function(a, b) return a:lerp(b, 0.3) end)
    check("clamp_tensor", {"x", "lo", "hi"}, function(x, lo, hi) return x:clamp(lo, hi) end)
  end)

  it("einsum broadcasts size-1 dims: elementwise, contracted, batch, under \"...\", implicit, diagonal, three operands", function()
    check("einsum_bc_elementwise", {"a", "b"}, function(a, b) return kiln.einsum("ij,ij->ij", a, b) end)
    check("einsum_bc_contract", {"a", "b"}, function(a, b) return kiln.einsum("ij,jk->ik", a, b) end)
    check("einsum_bc_batch", {"a", "b"}, function(a, b) return kiln.einsum("bij,bjk->bik", a, b) end)
    check("einsum_bc_ellipsis", {"a", "b"}, function(a, b) return kiln.einsum("...ij,...jk->...ik", a, b) end)
    check("einsum_bc_implicit", {"a", "b"}, function(a, b) return kiln.einsum("ij,ij", a, b):reshape(1) end)
    check("einsum_bc_diag", {"a", "b"}, function(a, b) return kiln.einsum("ii,i->i", a, b) end)
    check("einsum_bc_three", {"a", "b", "c"}, function(a, b, c) return kiln.einsum("ij,jk,kl->il", a, b, c) end)
  end)

  it("addcmul, addcdiv, lerp, clamp with tensor bounds, atan2 and baddbmm's input broadcast as PyTorch's", function()
    check("addcmul_bc", {"a", "b", "c"}, function(a, b, c) return a:addcmul(b, c, 0.3) end)
    check("addcdiv_bc", {"a", "b", "c"}, function(a, b, c) return a:addcdiv(b, c, 0.3) end)
    check("lerp_bc", {"a", "b", "w"}, function(a, b, w) return a:lerp(b, w) end)
    check("clamp_bc", {"x", "lo", "hi"}, function(x, lo, hi) return x:clamp(lo, hi) end)
    check("clamp_ties", {"x", "lo", "hi"}, function(x, lo, hi) return x:clamp(lo, hi) end)
    check("clamp_ties_swapped", {"x", "lo", "hi"}, function(x, lo, hi) return x:clamp(lo, hi) end)
    check("atan2_bc", {"a", "b"}, function(a, b) return a:atan2(b) end)
    check("baddbmm_bc", {"c", "a", "b"}, function(c, a, b) return c:baddbmm(a, b, {beta = 0.5, alpha = 2}) end)
  end)
end)
