-- kiln's type promotion against PyTorch's: tests/fixtures/torch_promotion.json holds the dtype
-- of each op's result as PyTorch 1.13 gives it for every pair of dtypes, a tensor beside a Lua
-- number (an integer or a fraction: a "weak" scalar), and the reductions and unary ops of each
-- dtype (tools/torch_fixtures.py wrote it). Where PyTorch gives a dtype, kiln must give the same
-- one. Where PyTorch refuses ("error": bool arithmetic, the mean of integers, half-precision
-- kernels its CPU lacks), kiln may do more; those cases are not checked.
local kiln = kiln or require "kiln"
local cjson = require "cjson"
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "?.lua;" .. package.path
local H = require "helpers"

local f = assert(io.open(H.fixture_path("torch_promotion.json")))
local want = cjson.decode(f:read("*a")).dtypes
f:close()

local function ones(d) return kiln.ones(2, {dtype = d}) end
local binary = {
  add = function(a, b) return a + b end, sub = function(a, b) return a - b end, mul = function(a, b) return a * b end,
  div = function(a, b) return a / b end, pow = function(a, b) return a:pow(b) end,
  maximum = function(a, b) return a:maximum(b) end, minimum = function(a, b) return a:minimum(b) end,
  eq = function(a, b) return a:eq(b) end, lt = function(a, b) return a:lt(b) end,
  remainder = function(a, b) return a:remainder(b) end,
}
local scalars = {int = 2, float = 2.5}

-- key "op a b" (b a dtype or int/float) or "op a": kiln's result dtype, or "error" and the message
local function kiln_dtype(key)
  local op, a, b = key:match("^(%S+) (%S+) ?(%S*)$")
  local ok, r = pcall(function()
    if b == "" then local x = ones(a) return x[op](x) end
    return binary[op](ones(a), scalars[b] or ones(b))
  end)
  if not ok then return "error", tostring(r) end
  return r:dtype()
end

describe("type promotion against PyTorch", function()
  it("gives PyTorch's dtype wherever PyTorch gives one", function()
    local checked, wrong = 0, {}
    for key, dtype in pairs(want) do
      if dtype ~= "error" then
        checked = checked + 1
        local got, err = kiln_dtype(key)
        if got ~= dtype then wrong[#wrong + 1] = string.format("%s: PyTorch %s, kiln %s %s", key, dtype, got, err or "") end
      end
    end
    table.sort(wrong)
    assert(#wrong == 0, #wrong .. " of " .. checked .. " differ:\n" .. table.concat(wrong, "\n"))
    assert(checked > 700, "only " .. checked .. " results checked")
  end)
end)
