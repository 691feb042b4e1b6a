-- The tensor ops added for PyTorch's habits (sort, topk, scans, multinomial, repeat, roll, einsum,
-- pad, interpolate, unfold/fold, diag, ...): values against loops over Lua tables on odd and
-- non-contiguous shapes, edge cases, and the errors of bad input (they name the op, the shapes and
-- the dtype, and the process goes on). PyTorch's own values: torch_ops_fixture_spec.lua; the f64
-- gradient checks: op_gradchecks.lua (run by op_table_spec.lua).
local kiln = require "kiln"
local F = kiln.F
require "kiln.testing"

local function raises(pattern, fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "no error for " .. pattern)
  assert.truthy(tostring(err):find(pattern, 1, true), "expected \"" .. pattern .. "\" in: " .. tostring(err))
end

describe("sort, argsort and topk", function()
  it("sort each line of a transposed tensor, stable, in every dtype", function()
    for _, dt in ipairs({"f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool"}) do
      local rows = {{3, 1, 2, 1, 0}, {0, 2, 2, 1, 3}, {1, 1, 1, 1, 1}}
      local x = kiln.tensor(rows, {dtype = dt == "bool" and "f32" or dt}):to(dt):t()   -- [5,3], columns are the rows
      local v, i = x:sort(1)
      assert.equal(dt, v:dtype())
      for c = 1, 3 do
        local line = {}
        for r = 1, 5 do line[r] = {value = x[r][c], at = r} end
        table.sort(line, function(a, b)
          local av, bv = a.value, b.value
          if type(av) == "boolean" then av, bv = av and 1 or 0, bv and 1 or 0 end
          if av ~= bv then return av < bv end
          return a.at < b.at   -- stable
        end)
        for r = 1, 5 do
          assert.equal(line[r].at, i[r][c], dt .. " column " .. c)
          assert.equal(line[r].value, v[r][c], dt .. " column " .. c)
        end
      end
    end
  end)

  it("handle empty tensors, 0-d tensors and k = 0", function()
    local e = kiln.zeros(3, 0)
    local v, i = e:sort(2)
    assert.same({3, 0}, {v:size(1), v:size(2)})
    assert.equal("i64", i:dtype())
    local s = kiln.tensor(4)
    assert.equal(4, (s:sort()):item())
    assert.equal(1, s:argsort():item())
    local tv = kiln.randn(3, 4):topk(0)
    assert.same({3, 0}, {tv:size(1), tv:size(2)})
  end)

  it("refuse a bad k, dim or option by name", function()
    local x = kiln.randn(3, 4)
    raises("topk: k = 5 is out of range for dim 2 of size 4 (tensor [3,4])", function() x:topk(5) end)
    raises("sort: dim 3 out of range for a tensor of 2 dims", function() x:sort(3) end)
    raises("argsort: unknown option \"decending\"", function() x:argsort{decending = true} end)
    raises("cumsum: give the dim", function() x:cumsum() end)
    assert.equal(12, x:numel())   -- and the process goes on
  end)
end)

describe("cumsum and cumprod", function()
  it("run along any dim of a non-contiguous tensor, integers giving i64", function()
    local x = kiln.tensor({{1, 2, 3}, {4, 5, 6}}):t()   -- [3,2]
    assert.same({{1, 4}, {3, 9}, {6, 15}}, x:cumsum(1):totable())
    assert.same({{1, 4}, {2, 10}, {3, 18}}, x:cumprod(2):totable())
    local i = kiln.tensor({1, 2, 3}, {dtype = "i32"})
    assert.equal("i64", i:cumsum(1):dtype())
    assert.same({1, 3, 6}, i:cumsum(1):totable())
    assert.equal("i64", kiln.tensor({true, true, false}):cumsum(1):dtype())
    assert.equal("f16", kiln.ones(4, {dtype = "f16"}):cumsum(1):dtype())
    assert.same({1, 0, 0}, kiln.tensor({1, 0, 5}):cumprod(1):totable())
  end)
end)
