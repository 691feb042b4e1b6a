-- kiln.set_float32_matmul_precision: the setting itself (default, round trip, bad values, the C
-- API behind it), and that CPU products ignore it: f32 products stay exact under "high" and
-- "medium", checked against a reference whose inputs TF32 or BF16 rounding would change.
local kiln = kiln or require "kiln"
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "?.lua;" .. package.path
local H = require "helpers"
local core = require "kiln.core"
local C, ffi = core.C, core.ffi

local function assert_contains(msg, ...)
  for _, part in ipairs({...}) do
    assert(H.contains(msg, part), string.format("message %q lacks %q", msg, part))
  end
end

describe("kiln.set_float32_matmul_precision", function()
  after_each(function() kiln.set_float32_matmul_precision("highest") end)

  it("starts at \"highest\" in a fresh process", function()
    local exe = H.kiln_exe()
    if exe then   -- a child process, since other specs may have changed it in this one
      local out, ok = H.capture(exe .. " -e 'print(require(\"kiln\").get_float32_matmul_precision())'")
      assert.is_true(ok, out)
      assert.are.equal("highest", (out:gsub("%s+$", "")))
    end
    assert.are.equal("highest", kiln.get_float32_matmul_precision())
  end)

  it("round-trips every precision through libkiln", function()
    for _, p in ipairs({"high", "medium", "highest", "medium", "high"}) do
      kiln.set_float32_matmul_precision(p)
      assert.are.equal(p, kiln.get_float32_matmul_precision())
    end
    kiln.set_float32_matmul_precision("medium")
    assert.are.equal(2, tonumber(C.kiln_get_float32_matmul_precision()))
    kiln.set_float32_matmul_precision("high")
    assert.are.equal(1, tonumber(C.kiln_get_float32_matmul_precision()))
  end)

  it("refuses anything else, names the three, and keeps the setting", function()
    kiln.set_float32_matmul_precision("high")
    for _, bad in ipairs({"HIGH", "low", "", 1, true}) do
      local msg = H.error_of(kiln.set_float32_matmul_precision, bad)
      assert_contains(msg, "set_float32_matmul_precision", '"highest"', '"high"', '"medium"')
      assert.are.equal("high", kiln.get_float32_matmul_precision())
    end
    assert_contains(H.error_of(kiln.set_float32_matmul_precision), "nil is not a precision")
    assert_contains(H.error_of(kiln.set_float32_matmul_precision, "low"), '"low" is not a precision')
    -- the C API checks its argument too
    assert.are.equal(C.KILN_ERR_ARGUMENT, C.kiln_set_float32_matmul_precision(3))
    assert_contains(ffi.string(C.kiln_error_message()), "set_float32_matmul_precision: 3 is not a precision",
                    "KILN_MATMUL_HIGHEST", "KILN_MATMUL_HIGH", "KILN_MATMUL_MEDIUM")
    assert.are.equal(C.KILN_ERR_ARGUMENT, C.kiln_set_float32_matmul_precision(-1))
    assert.are.equal("high", kiln.get_float32_matmul_precision())
  end)

  it("leaves CPU f32 products exact under \"high\" and \"medium\"", function()
    -- entries 1 + j * 2^-20: TF32 (10 mantissa bits) and BF16 (7) would round them all to 1
    local A = H.filled({5, 7}, function(i) return 1 + (i % 13) * 2 ^ -20 end)
    local B = H.filled({7, 3}, function(i) return ((i % 5) - 2) * (1 + (i % 7) * 2 ^ -19) end)
    local a, b = kiln.tensor(A), kiln.tensor(B)
    local want = H.matmul(A, B)
    local base = a:matmul(b)
    assert.tensor_near(base, want, 1e-6)
    -- the rounded inputs would give a visibly different product: the check can fail
    local rounded = H.matmul(H.map(A, function() return 1 end), B)
    assert.is_false((H.compare(base, rounded, 1e-6)))
    for _, p in ipairs({"high", "medium"}) do
      kiln.set_float32_matmul_precision(p)
      assert.are.same(base:totable(), a:matmul(b):totable())
      local at, bt = a:t():contiguous():t(), b:t():contiguous():t()   -- other layouts, same values
      assert.are.same(base:totable(), at:matmul(bt):totable())
      local batched = kiln.stack({a, a}):bmm(kiln.stack({b, b}))
      assert.are.same({base:totable(), base:totable()}, batched:totable())
      -- f64 ignores the setting as well
      assert.tensor_near(a:to("f64"):matmul(b:to("f64")), want, 1e-12)
    end
  end)
end)
