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
end)
