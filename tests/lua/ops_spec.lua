-- Ops: every elementwise op, reduction, product, join and index op against the naive references
-- of tests/lua/helpers.lua, on odd shapes, non-contiguous views, broadcasting, empty tensors and
-- every dtype; and misuse, whose errors name the shapes and point at the line of this file.
local kiln = kiln or require "kiln"
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "?.lua;" .. package.path
local H = require "helpers"

local SRC = debug.getinfo(1, "S").short_src
local function here() return debug.getinfo(2, "l").currentline end
local err = H.error_of

local function assert_contains(msg, ...)
  for _, part in ipairs({...}) do
    assert(H.contains(msg, part), string.format("message %q lacks %q", msg, part))
  end
end

-- The message starts with this file's name and the given line.
local function assert_at(line, msg)
  local prefix = SRC .. ":" .. line .. ":"
  assert(msg:sub(1, #prefix) == prefix, string.format("message %q does not start with %q", msg, prefix))
end

local DTYPES = {"f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool"}
local FLOAT = {f32 = true, f64 = true, f16 = true, bf16 = true}

-- The promotion lattice as the docs state it: bool < u8 < i32 < i64 < f16, bf16 < f32 < f64,
-- and f16 with bf16 meets at f32.
local RANK = {bool = 0, u8 = 1, i32 = 2, i64 = 3, f16 = 4, bf16 = 4, f32 = 5, f64 = 6}
local function promote(a, b)
  if a == b then return a end
  if RANK[a] == RANK[b] then return "f32" end
  return RANK[a] > RANK[b] and a or b
end

-- Values of a shape, drawn by an LCG (not kiln's generator) from [lo, hi], as held in dtype.
-- step > 0 draws multiples of step (exact in every float dtype for step = 0.25).
local function data(shape, dtype, lo, hi, seed, step)
  local rnd = H.lcg(seed or 7)
  return H.filled(shape, function()
    local v
    if dtype == "bool" then v = rnd() < 0.5 and 0 or 1
    elseif not FLOAT[dtype] then v = math.floor(lo + rnd() * (hi - lo + 1))
    elseif step then v = math.floor((lo + rnd() * (hi - lo)) / step + 0.5) * step
    else v = lo + rnd() * (hi - lo) end
    if dtype ~= "bool" then v = H.round_to(v, dtype) end
    return v
  end)
end

local function as_number(x) if type(x) == "boolean" then return x and 1 or 0 end return x end

local function round_half_even(x)
  local f = math.floor(x)
  local d = x - f
  if d > 0.5 then return f + 1 elseif d < 0.5 then return f end
  return f % 2 == 0 and f or f + 1
end

local erf = H.erf

-- erfinv by Newton's method on the reference erf (x in (-1, 1)); +-1 give +-inf, beyond NaN
local function erfinv(x)
  if x == 1 or x == -1 then return x * math.huge end
  if x > 1 or x < -1 then return 0 / 0 end
  local y = 0
  for _ = 1, 60 do y = y - (erf(y) - x) / (2 / math.sqrt(math.pi) * math.exp(-y * y)) end
  return y
end

local function trunc(x) return x >= 0 and math.floor(x) or math.ceil(x) end
local function sign(x) return x > 0 and 1 or x < 0 and -1 or 0 end

-- Unary ops: reference, the float domain, whether integers stay integers.
local UNARY = {
  neg = {function(x) return -x end, -3, 3, true},
  abs = {math.abs, -3, 3, true},
  sign = {sign, -3, 3, true},
  sqrt = {math.sqrt, 0.1, 5, false, true},
  rsqrt = {function(x) return 1 / math.sqrt(x) end, 0.1, 5, false, true},
  exp = {math.exp, -3, 3, false},
  log = {math.log, 0.1, 5, false, true},
  log1p = {function(x) return math.log(1 + x) end, -0.9, 3, false},
  expm1 = {function(x) return math.exp(x) - 1 end, -3, 3, false},
  sin = {math.sin, -3, 3, false},
  cos = {math.cos, -3, 3, false},
  tanh = {function(x) local e = math.exp(2 * x) return (e - 1) / (e + 1) end, -3, 3, false},
  sigmoid = {function(x) return 1 / (1 + math.exp(-x)) end, -3, 3, false},
  relu = {function(x) return math.max(x, 0) end, -3, 3, true},
  floor = {math.floor, -3, 3, true},
  ceil = {math.ceil, -3, 3, true},
  round = {round_half_even, -3, 3, true},
  trunc = {trunc, -3, 3, true},
  reciprocal = {function(x) return 1 / x end, 0.1, 5, false, true},
  square = {function(x) return x * x end, -3, 3, true},
  erf = {erf, -2.5, 2.5, false},
  erfinv = {erfinv, -0.95, 0.95, false},
  logical_not = {function(x) return x == 0 and 1 or 0 end, -2, 2, true},
  isnan = {function(x) return x ~= x and 1 or 0 end, -3, 3, true},
  isinf = {function(x) return (x == math.huge or x == -math.huge) and 1 or 0 end, -3, 3, true},
  isfinite = {function(x) return (x == x and x ~= math.huge and x ~= -math.huge) and 1 or 0 end, -3, 3, true},
}
local UNARY_NAMES = {}
for name in pairs(UNARY) do UNARY_NAMES[#UNARY_NAMES + 1] = name end
table.sort(UNARY_NAMES)

local function unary_result_dtype(name, dt)
  if name == "logical_not" or name == "isnan" or name == "isinf" or name == "isfinite" then return "bool" end
  if UNARY[name][4] or FLOAT[dt] then return dt end
  return "f32"
end

local function unary_data(name, dt, shape, seed)
  local spec = UNARY[name]
  local lo, hi = spec[2], spec[3]
  if not FLOAT[dt] then
    if spec[5] then lo, hi = 1, 9 elseif dt == "u8" then lo, hi = 0, 9 else lo, hi = -5, 5 end
  end
  local step = nil
  if name == "round" or name == "logical_not" then step = 0.5 end   -- halves: ties to even; zeros
  return data(shape, dt, lo, hi, seed, step)
end

local function unary_expected(name, x, rdt)
  return H.map(x, function(v) return H.round_to(UNARY[name][1](as_number(v)), rdt) end)
end

describe("unary elementwise ops", function()
  for _, name in ipairs(UNARY_NAMES) do
    it(name .. " matches the reference in every dtype, contiguous and not", function()
      for _, dt in ipairs(DTYPES) do
        if not (dt == "bool" and name == "neg") then
          local rdt = unary_result_dtype(name, dt)
          local tol = H.tol[rdt]
          -- contiguous [3,5,7]
          local x = unary_data(name, dt, {3, 5, 7}, 11)
          local r = kiln[name](kiln.tensor(x, {dtype = dt}))
          assert.equal(rdt, r:dtype(), name .. " on " .. dt)
          assert.tensor_near(r, unary_expected(name, x, rdt), tol)
          -- transposed: [7,5,3] viewed as [3,5,7]
          local xt = unary_data(name, dt, {7, 5, 3}, 12)
          local rt = kiln[name](kiln.tensor(xt, {dtype = dt}):transpose(1, 3))
          assert.tensor_near(rt, unary_expected(name, H.transpose(xt, 1, 3), rdt), tol)
          -- narrowed in the last dim: strides skip elements
          local xn = unary_data(name, dt, {3, 9}, 13)
          local narrowed = {}
          for i = 1, 3 do narrowed[i] = {unpack(xn[i], 3, 7)} end
          local rn = kiln[name](kiln.tensor(xn, {dtype = dt}):narrow(2, 3, 5))
          assert.tensor_near(rn, unary_expected(name, narrowed, rdt), tol)
        end
      end
      -- expanded (stride 0) and empty
      local col = unary_data(name, "f64", {4, 1}, 14)
      local e = kiln.tensor(col, {dtype = "f64"}):expand(4, 6)
      local expected = unary_expected(name, H.zip(col, H.filled({4, 6}, function() return 0 end), function(a) return a end),
                                      unary_result_dtype(name, "f64"))
      assert.tensor_near(e[name](e), expected, 1e-12)
      local empty = kiln.zeros(2, 0, 3)[name](kiln.zeros(2, 0, 3))
      assert.same({2, 0, 3}, {empty:size(1), empty:size(2), empty:size(3)})
    end)
  end

  it("sign, relu and abs at zero, and round to even at halves", function()
    assert.same({-1, 0, 1}, kiln.tensor{-2, 0, 3}:sign():totable())
    assert.same({0, 0, 3}, kiln.tensor{-2, 0, 3}:relu():totable())
    assert.same({-2, 2, 0, -0, 4, -4}, kiln.tensor{-2.5, 2.5, 0.5, -0.5, 3.5, -3.5}:round():totable())
    assert.same({false, true, false}, kiln.tensor{1, 0, -0.5}:logical_not():totable())
  end)

  it("isnan, isinf and isfinite in every float dtype, through views; integers are finite", function()
    local nan, inf = 0 / 0, math.huge
    local v = {{1, nan, -inf}, {nan, 0, inf}}
    local want = {{false, true, false}, {true, false, false}}
    for _, dt in ipairs{"f32", "f64", "f16", "bf16"} do
      local t = kiln.tensor(v, {dtype = dt})
      assert.same(want, t:isnan():totable(), dt)
      assert.same({{false, true}, {true, false}, {false, false}}, t:t():isnan():totable(), dt .. " transposed")
    end
    assert.same({false, false}, kiln.tensor({7, -3}, {dtype = "i64"}):isnan():totable())
    assert.are.equal(0, kiln.zeros(0, 4):isnan():numel())
    -- isinf and isfinite on the same values
    for _, dt in ipairs{"f32", "f64", "f16", "bf16"} do
      local t = kiln.tensor(v, {dtype = dt})
      assert.same({{false, false, true}, {false, false, true}}, t:isinf():totable(), dt)
      assert.same({{true, false, false}, {false, true, false}}, t:isfinite():totable(), dt)
    end
    assert.same({false, false}, kiln.tensor({7, -3}, {dtype = "i32"}):isinf():totable())
    assert.same({true, true}, kiln.tensor({7, -3}, {dtype = "i32"}):isfinite():totable())
    -- f16 overflows to inf: 70000 is inf in f16, finite in f32
    assert.same({true}, kiln.tensor({70000}, {dtype = "f16"}):isinf():totable())
    assert.same({false}, kiln.tensor({70000}, {dtype = "f32"}):isinf():totable())
  end)

  it("neg of a bool tensor is an error that names logical_not", function()
    assert_contains(err(kiln.neg, kiln.tensor{true}), "neg", "bool", "logical_not")
  end)

  it("in place: keeps the tensor, writes through views, refuses a float result in an integer tensor", function()
    for _, name in ipairs(UNARY_NAMES) do
      if name ~= "logical_not" then
        local x = unary_data(name, "f64", {3, 5}, 21)
        local t = kiln.tensor(x, {dtype = "f64"})
        local same = t[name .. "_"](t)
        assert.is_true(rawequal(same, t) or same.p == t.p, name .. "_ returns its tensor")
        assert.tensor_near(t, unary_expected(name, x, "f64"), 1e-12)
        -- through a transposed view: the base changes
        local base = kiln.tensor(x, {dtype = "f64"})
        local v = base:t()
        v[name .. "_"](v)
        assert.tensor_near(base, unary_expected(name, x, "f64"), 1e-12)
      end
    end
    local i = kiln.tensor({1, 4, 9}, {dtype = "i64"})
    local e = err(i.sqrt_, i)
    assert_contains(e, "sqrt_", "f32", "i64", "[3]")
    assert.same({1, 4, 9}, i:totable())
    assert.same({-1, -4, -9}, i:neg_():totable())
  end)
end)

-- Binary ops: reference, domain kind.
local BINARY = {
  add = {function(x, y) return x + y end},
  sub = {function(x, y) return x - y end},
  mul = {function(x, y) return x * y end},
  div = {function(x, y) return x / y end, "divisor"},
  pow = {function(x, y) return x ^ y end, "pow"},
  maximum = {math.max},
  minimum = {math.min},
  remainder = {function(x, y) return x - math.floor(x / y) * y end, "divisor"},
  atan2 = {math.atan2},
  relu_backward = {function(x, y) if y <= 0 then return 0 end return x end},   -- NaN in y passes x
  eq = {function(x, y) return x == y end, nil, true},
  ne = {function(x, y) return x ~= y end, nil, true},
  lt = {function(x, y) return x < y end, nil, true},
  le = {function(x, y) return x <= y end, nil, true},
  gt = {function(x, y) return x > y end, nil, true},
  ge = {function(x, y) return x >= y end, nil, true},
  logical_and = {function(x, y) return x ~= 0 and y ~= 0 end, nil, true},
  logical_or = {function(x, y) return x ~= 0 or y ~= 0 end, nil, true},
}
local BINARY_NAMES = {}
for name in pairs(BINARY) do BINARY_NAMES[#BINARY_NAMES + 1] = name end
table.sort(BINARY_NAMES)

local function binary_result_dtype(name, da, db)
  if BINARY[name][3] then return "bool" end
  local p = promote(da, db)
  if (name == "div" or name == "atan2") and not FLOAT[p] then return "f32" end
  return p
end

-- Operands for op `name`: a in dtype da and b in dtype db, kept away from 0 divisors, and in
-- ranges where integer powers stay small.
local function binary_data(name, which, dt, shape, seed)
  local kind = BINARY[name][2]
  if dt == "bool" then return data(shape, dt, 0, 1, seed) end
  local lo, hi = -4, 4
  if kind == "pow" then
    if which == "a" then lo, hi = FLOAT[dt] and 0.25 or (dt == "u8" and 0 or -3), FLOAT[dt] and 4 or 3
    else lo, hi = FLOAT[dt] and -2 or 0, FLOAT[dt] and 2 or 3 end
  elseif dt == "u8" then lo, hi = 0, 9
  elseif not FLOAT[dt] then lo, hi = -5, 5 end
  local x = data(shape, dt, lo, hi, seed, 0.25)
  if kind == "divisor" and which == "b" then
    x = H.map(x, function(v) if v == 0 then return dt == "u8" and 3 or -1.5 end return v end)
    if not FLOAT[dt] then x = H.map(x, function(v) return math.floor(v) end) end
  end
  return x
end

local function binary_expected(name, a, b, rdt)
  return H.zip(a, b, function(x, y)
    local r = BINARY[name][1](as_number(x), as_number(y))
    if type(r) == "boolean" then return r end
    return H.round_to(r, rdt)
  end)
end

-- The dtype pairs checked: every dtype with itself, and mixed pairs across the lattice.
local PAIRS = {}
for _, d in ipairs(DTYPES) do PAIRS[#PAIRS + 1] = {d, d} end
for _, p in ipairs({{"i32", "i64"}, {"f16", "bf16"}, {"u8", "f32"}, {"bool", "i64"}, {"f64", "f16"},
                    {"i64", "f32"}, {"u8", "i32"}, {"bf16", "f64"}, {"i32", "f16"}}) do
  PAIRS[#PAIRS + 1] = p
end

local function skip_pair(name, da, db)
  local kind = BINARY[name][2]
  if kind == "pow" and (da == "bool" or db == "bool") then return true end
  if kind == "divisor" and db == "bool" then return true end
  return false
end

describe("relu and relu_backward of bf16 (on the bits, cpu/elementwise.c)", function()
  -- every bf16 bit pattern as x, and as y in another order, against the f32 kernels through exact
  -- widening and rounding back (NaN quietened), which the bits path must match bit for bit
  local ffi = require "ffi"
  local function bf16_of(f)
    local t = kiln.zeros(65536, {dtype = "bf16"})
    local p = ffi.cast("uint16_t *", t.p.storage.data) + t.p.offset
    for i = 0, 65535 do p[i] = f(i) end
    return t
  end
  local function bits(t)
    local p, r = ffi.cast("const uint16_t *", t.p.storage.data) + t.p.offset, {}
    for i = 0, t:numel() - 1 do r[i + 1] = p[i] end
    return r
  end
  local x, y = bf16_of(function(i) return i end), bf16_of(function(i) return (i * 40503) % 65536 end)
  it("relu", function()
    assert.same(bits(x:to("f32"):relu():to("bf16")), bits(x:relu()))
    assert.equal(0x8000, bits(x:relu())[0x8000 + 1])   -- relu(-0) is -0, as in f32
  end)
  it("relu_backward", function()
    local got = bits(x:relu_backward(y))
    assert.same(bits(x:to("f32"):relu_backward(y:to("f32")):to("bf16")), got)
    local yb = bits(y)
    for i = 1, 65536 do   -- and the rule itself: 0 where y is +-0 or negative, else x (NaN quietened)
      local v, g = yb[i], i - 1
      local masked = v == 0 or (v >= 0x8000 and v <= 0xff80)
      local want = masked and 0 or ((g % 32768 > 0x7f80) and bit.bor(g, 0x40) or g)
      if got[i] ~= want then error(string.format("y %04x g %04x: %04x, want %04x", v, g, got[i], want)) end
    end
  end)
end)

describe("binary elementwise ops", function()
  for _, name in ipairs(BINARY_NAMES) do
    it(name .. " matches the reference for every dtype pair, broadcast and non-contiguous", function()
      for _, pair in ipairs(PAIRS) do
        local da, db = pair[1], pair[2]
        if not skip_pair(name, da, db) then
          local rdt = binary_result_dtype(name, da, db)
          local tol = H.tol[rdt] or 0
          local what = name .. "(" .. da .. ", " .. db .. ")"
          -- broadcast: [3,1,7] with [5,7] gives [3,5,7]
          local a = binary_data(name, "a", da, {3, 1, 7}, 31)
          local b = binary_data(name, "b", db, {5, 7}, 32)
          local r = kiln[name](kiln.tensor(a, {dtype = da}), kiln.tensor(b, {dtype = db}))
          assert.equal(rdt, r:dtype(), what)
          assert.same({3, 5, 7}, {r:size(1), r:size(2), r:size(3)})
          local ok, msg = H.compare(r, binary_expected(name, a, b, rdt), tol)
          assert(ok, what .. " broadcast: " .. tostring(msg))
          -- non-contiguous: a transposed, b narrowed
          local at = binary_data(name, "a", da, {7, 5, 3}, 33)
          local bn = binary_data(name, "b", db, {3, 5, 9}, 34)
          local A = kiln.tensor(at, {dtype = da}):transpose(1, 3)
          local B = kiln.tensor(bn, {dtype = db}):narrow(3, 2, 7)
          local bref = H.map(bn, function(v) return v end)
          for i = 1, 3 do for j = 1, 5 do bref[i][j] = {unpack(bn[i][j], 2, 8)} end end
          ok, msg = H.compare(A[name](A, B), binary_expected(name, H.transpose(at, 1, 3), bref, rdt), tol)
          assert(ok, what .. " strided: " .. tostring(msg))
        end
      end
    end)
  end

  it("take a number on either side; integer tensors with a fraction give f32", function()
    local x = {{1, -2, 3}, {4, 5, -6}}
    local t = kiln.tensor(x, {dtype = "i32"})
    local function check(r, dtype, f)
      assert.equal(dtype, r:dtype())
      assert.tensor_near(r, H.map(x, f), 1e-6)
    end
    check(t + 2, "i32", function(v) return v + 2 end)
    check(t + 0.5, "f32", function(v) return v + 0.5 end)
    check(2 - t, "i32", function(v) return 2 - v end)
    check(t - 2, "i32", function(v) return v - 2 end)
    check(3 * t, "i32", function(v) return 3 * v end)
    check(t * 1.5, "f32", function(v) return v * 1.5 end)
    check(1 / t, "f32", function(v) return 1 / v end)
    check(t / 4, "f32", function(v) return v / 4 end)
    check(t % 4, "i32", function(v) return v % 4 end)         -- Lua's % has the divisor's sign too
    check(7 % t, "i32", function(v) return 7 % v end)
    check(t ^ 2, "i32", function(v) return v ^ 2 end)
    check(2 ^ kiln.tensor(x, {dtype = "f32"}), "f32", function(v) return 2 ^ v end)
    check(-t, "i32", function(v) return -v end)
    check(t:maximum(2), "i32", function(v) return math.max(v, 2) end)
    local f = kiln.tensor(x, {dtype = "f16"})
    assert.equal("f16", (f + 2.5):dtype())
    assert.equal("f16", (2.5 * f):dtype())
    assert.equal("i64", (kiln.tensor{true, false} + 1):dtype())
    assert.same({2, 1}, (kiln.tensor{true, false} + 1):totable())
    assert.same({true, false, false}, kiln.tensor{1, 2, 3}:lt(1.5):totable())
    assert.same({false, true, false}, kiln.tensor({1, 2, 3}, {dtype = "i64"}):eq(2):totable())
  end)

  it("promote dtypes as the lattice says", function()
    local function z(d) return kiln.zeros(2, {dtype = d}) end
    local cases = {
      {"i32", "i64", "i64"}, {"f16", "bf16", "f32"}, {"u8", "i32", "i32"}, {"bool", "u8", "u8"},
      {"f16", "i64", "f16"}, {"f64", "f16", "f64"}, {"f32", "f64", "f64"}, {"bool", "bool", "bool"},
      {"bf16", "i32", "bf16"}, {"u8", "f32", "f32"},
    }
    for _, c in ipairs(cases) do
      assert.equal(c[3], (z(c[1]) + z(c[2])):dtype(), c[1] .. " + " .. c[2])
      assert.equal(c[3], (z(c[2]) + z(c[1])):dtype(), c[2] .. " + " .. c[1])
    end
    assert.equal("f32", (z("i64") / z("i64")):dtype())
    assert.equal("f64", (z("f64") / z("i64")):dtype())
    for _, c in ipairs(cases) do assert.equal("bool", z(c[1]):lt(z(c[2])):dtype()) end
  end)

  it("broadcast 0-dim tensors, size-1 dims and empty dims", function()
    local s = kiln.tensor(2)
    local m = kiln.tensor{{1, 2}, {3, 4}}
    assert.same({{3, 4}, {5, 6}}, (m + s):totable())
    assert.same({{1, 0}, {-1, -2}}, (s - m):totable())
    assert.same({{11, 21}, {12, 22}}, (kiln.tensor{{1}, {2}} + kiln.tensor{10, 20}):totable())
    local e = kiln.zeros(0, 3) + kiln.ones(3)
    assert.same({0, 3}, {e:size(1), e:size(2)})
    local e2 = kiln.zeros(4, 1, 0) * kiln.ones(5, 1)
    assert.same({4, 5, 0}, {e2:size(1), e2:size(2), e2:size(3)})
    assert.same({2, 0}, {kiln.zeros(2, 0):lt(kiln.zeros(1)):size(1), kiln.zeros(2, 0):lt(kiln.zeros(1)):size(2)})
  end)

  it("maximum and minimum propagate NaN", function()
    local nan = 0 / 0
    local r = kiln.tensor{nan, 1, 2}:maximum(kiln.tensor{0, nan, 3}):totable()
    assert.is_true(r[1] ~= r[1] and r[2] ~= r[2])
    assert.equal(3, r[3])
    local q = kiln.tensor{nan, 1}:minimum(kiln.tensor{0, 0}):totable()
    assert.is_true(q[1] ~= q[1])
    assert.equal(0, q[2])
  end)

  it("in place: broadcast the other operand, write through views, refuse to widen", function()
    for _, name in ipairs(BINARY_NAMES) do
      if not BINARY[name][3] then
        local a = binary_data(name, "a", "f64", {3, 4}, 41)
        local b = binary_data(name, "b", "f64", {4}, 42)
        local t = kiln.tensor(a, {dtype = "f64"})
        local r = t[name .. "_"](t, kiln.tensor(b, {dtype = "f64"}))
        assert.is_true(r.p == t.p)
        assert.tensor_near(t, binary_expected(name, a, b, "f64"), 1e-12)
        local base = kiln.tensor(a, {dtype = "f64"})
        local v = base:t()
        v[name .. "_"](v, kiln.tensor(H.transpose({b}, 1, 2), {dtype = "f64"}))
        assert.tensor_near(base, binary_expected(name, a, b, "f64"), 1e-12)
        local s = kiln.tensor(a, {dtype = "f64"})
        s[name .. "_"](s, 2)
        assert.tensor_near(s, binary_expected(name, a, 2, "f64"), 1e-12)
      end
    end
    local i = kiln.ones(2, 3, {dtype = "i64"})
    assert_contains(err(i.add_, i, 0.5), "add_", "f32", "i64", "[2,3]")
    assert_contains(err(i.div_, i, kiln.ones(3, {dtype = "i64"})), "div_", "f32")
    local small = kiln.ones(3)
    assert_contains(err(small.add_, small, kiln.ones(2, 3)), "[2,3]", "[3]")
    assert.same({{2, 2, 2}, {2, 2, 2}}, i:add_(1):totable())
    local c = kiln.tensor{1, 2, 3}
    c:lt_(2)                                    -- a comparison in place stores 1 and 0
    assert.same({1, 0, 0}, c:totable())
  end)
end)

describe("where and clamp", function()
  it("where picks from a or b by a broadcast condition, with promotion", function()
    local cond = {{true, false, true}, {false, false, true}}
    local a = {{1, 2, 3}, {4, 5, 6}}
    local b = {-1, -2, -3}
    local r = kiln.where(kiln.tensor(cond), kiln.tensor(a, {dtype = "i32"}), kiln.tensor(b, {dtype = "f64"}))
    assert.equal("f64", r:dtype())
    assert.same(H.zipn(function(c, x, y) if c then return x end return y end, {cond, a, b}), r:totable())
    local s = kiln.where(kiln.tensor(cond), kiln.tensor(a), 0)
    assert.same({{1, 0, 3}, {0, 0, 6}}, s:totable())
    local col = kiln.tensor{{true}, {false}}
    assert.same({{1, 2, 3}, {-1, -2, -3}}, kiln.where(col, kiln.tensor(a), kiln.tensor(b)):totable())
    -- t:where(cond, other) reads like PyTorch
    assert.same({{1, 9, 3}, {9, 9, 6}}, kiln.tensor(a):where(kiln.tensor(cond), 9):totable())
    local e = err(kiln.where, kiln.tensor{true, false}, kiln.ones(3), kiln.ones(3))
    assert_contains(e, "where", "[2]", "[3]")
  end)

  it("clamp takes lo and hi, either alone, or a table", function()
    local x = data({3, 5, 7}, "f32", -3, 3, 51)
    local t = kiln.tensor(x)
    assert.tensor_near(t:clamp(-1, 0.5), H.map(x, function(v) return math.min(math.max(v, -1), 0.5) end), 0)
    assert.tensor_near(t:clamp{min = 0}, H.map(x, function(v) return math.max(v, 0) end), 0)
    assert.tensor_near(t:clamp{max = 1}, H.map(x, function(v) return math.min(v, 1) end), 0)
    assert.tensor_near(t:transpose(1, 3):clamp(-2, 2), H.map(H.transpose(x, 1, 3), function(v) return math.min(math.max(v, -2), 2) end), 0)
    local i = kiln.tensor({-5, 0, 5}, {dtype = "i32"})
    assert.equal("i32", i:clamp(-2, 2):dtype())
    assert.same({-2, 0, 2}, i:clamp(-2, 2):totable())
    assert.equal("f32", i:clamp(-2.5, 2):dtype())
    assert.same({-2.5, 0, 2}, i:clamp(-2.5, 2):totable())
    assert_contains(err(t.clamp, t), "clamp")
    assert_contains(err(kiln.clamp, kiln.tensor{true}, 0, 1), "clamp", "bool")
  end)
end)

describe("reductions", function()
  local x = data({3, 5, 7}, "f64", -2, 2, 61)
  local xt = data({7, 5, 3}, "f64", -2, 2, 62)
  local T = kiln.tensor(x, {dtype = "f64"})
  local Tt = kiln.tensor(xt, {dtype = "f64"}):transpose(1, 3)   -- non-contiguous
  local ref_t = H.transpose(xt, 1, 3)
  local dim_sets = {1, 2, 3, -1, {1, 3}, {2, 3}, {1, 2, 3}}

  local function check(name, kiln_fn, ref_fn, tol)
    for _, case in ipairs({{T, x}, {Tt, ref_t}}) do
      local t, ref = case[1], case[2]
      local all = kiln_fn(t, nil, false)
      assert.equal(0, all:dim(), name .. " over all")
      assert.near(ref_fn(ref, nil, false), all:item(), tol)
      for _, dims in ipairs(dim_sets) do
        for _, keep in ipairs({false, true}) do
          local ok, msg = H.compare(kiln_fn(t, dims, keep), ref_fn(ref, dims, keep), tol)
          local label = type(dims) == "table" and table.concat(dims, ",") or tostring(dims)
          assert(ok, name .. " over " .. label .. (keep and " keepdim" or "") .. ": " .. tostring(msg))
        end
      end
    end
  end

  it("sum, mean and prod", function()
    check("sum", function(t, d, k) return t:sum(d, k) end, H.sum, 1e-12)
    check("mean", function(t, d, k) return t:mean(d, k) end, H.mean, 1e-12)
    check("prod", function(t, d, k) return t:prod(d, k) end, H.prod, 1e-12)
  end)

  it("var and std, unbiased by default, with a correction", function()
    check("var", function(t, d, k) return t:var(d, k) end, function(r, d, k) return H.var(r, d, k, 1) end, 1e-12)
    check("std", function(t, d, k) return t:std(d, k) end, function(r, d, k) return H.std(r, d, k, 1) end, 1e-12)
    check("var0", function(t, d, k) return t:var(d, k, {correction = 0}) end, function(r, d, k) return H.var(r, d, k, 0) end, 1e-12)
    check("std0", function(t, d, k) return t:std{dim = d, keepdim = k, unbiased = false} end,
          function(r, d, k) return H.std(r, d, k, 0) end, 1e-12)
  end)

  it("norm of order 1, 2, 3, inf and -inf", function()
    for _, p in ipairs({1, 2, 3, math.huge, -math.huge}) do
      check("norm" .. p, function(t, d, k) return t:norm(p, d, k) end, function(r, d, k) return H.norm(r, p, d, k) end, 1e-12)
    end
    -- -inf: the smallest magnitude, NaN wherever a NaN is; an order below 0 otherwise is an error
    local t = kiln.tensor({{3, -4, 0.5}, {-2, 0 / 0, 1}, {-7, 2, -3}}, {dtype = "f64"})
    assert.equal(0.5, t:norm(-math.huge, 2):totable()[1])
    assert.is_true(t:norm(-math.huge, 2):totable()[2] ~= t:norm(-math.huge, 2):totable()[2])
    assert.same({2, 0.5}, {t:norm(-math.huge, 1):totable()[1], t:narrow(1, 1, 1):norm(-math.huge):item()})
    assert.matches("norm: order p = %-1 %(expected p >= 0, or %-inf", H.error_of(function() return t:norm(-1) end))
    assert.matches("cannot reduce over an empty dim", H.error_of(function() return kiln.zeros(0):norm(-math.huge) end))
  end)

  it("logsumexp, stable for large values", function()
    check("logsumexp", function(t, d, k) return t:logsumexp(d, k) end, H.logsumexp, 1e-12)
    local big = kiln.tensor({1000, 1000, 999}, {dtype = "f64"})
    assert.near(1000 + math.log(2 + math.exp(-1)), big:logsumexp():item(), 1e-9)
    assert.equal(-math.huge, kiln.tensor{-1 / 0, -1 / 0}:logsumexp():item())
  end)

  it("max and min give values and 1-based indices along a dim; the first of ties wins", function()
    -- small integers: many ties
    local ties = data({3, 5, 7}, "i64", 0, 3, 63)
    for _, src in ipairs({{T, x}, {Tt, ref_t}, {kiln.tensor(ties, {dtype = "i64"}), ties}}) do
      local t, ref = src[1], src[2]
      assert.equal(H.max(ref), t:max():item())
      assert.equal(H.min(ref), t:min():item())
      for _, d in ipairs({1, 2, 3, -1}) do
        for _, keep in ipairs({false, true}) do
          local v, i = t:max(d, keep)
          local rv, ri = H.max(ref, d, keep)
          assert.tensor_near(v, rv, 0)
          assert.tensor_near(i, ri, 0)
          assert.equal("i64", i:dtype())
          v, i = t:min(d, keep)
          rv, ri = H.min(ref, d, keep)
          assert.tensor_near(v, rv, 0)
          assert.tensor_near(i, ri, 0)
          assert.tensor_near(t:argmax(d, keep), H.argmax(ref, d, keep), 0)
          assert.tensor_near(t:argmin(d, keep), H.argmin(ref, d, keep), 0)
        end
      end
      -- without a dim: the index into the flattened tensor, from 1
      assert.equal(H.argmax(ref), t:argmax():item())
      assert.equal(H.argmin(ref), t:argmin():item())
    end
    assert.same({{2}}, kiln.tensor{{1, 5, 5}}:argmax(2, true):totable())
    assert.same({1, 1}, {kiln.tensor{{7}}:argmax(nil, true):size(1), kiln.tensor{{7}}:argmax(nil, true):size(2)})
  end)

  it("max and argmax see NaN as the largest", function()
    local t = kiln.tensor{1, 0 / 0, 3}
    local m = t:max():item()
    assert.is_true(m ~= m)
    assert.equal(2, t:argmax():item())
  end)

  it("result dtypes: integer sums widen to i64, means of integers are f32, max keeps the dtype", function()
    local i = kiln.tensor({{1, 2}, {3, 4}}, {dtype = "i32"})
    assert.same({"i64", 10}, {i:sum():dtype(), i:sum():item()})
    assert.same({"f32", 2.5}, {i:mean():dtype(), i:mean():item()})
    assert.same({"i64", 24}, {i:prod():dtype(), i:prod():item()})
    assert.same({"i32", 4}, {i:max():dtype(), i:max():item()})
    local u = kiln.tensor({200, 100}, {dtype = "u8"})
    assert.same({"i64", 300}, {u:sum():dtype(), u:sum():item()})
    assert.same({"u8", 200}, {u:max():dtype(), u:max():item()})
    local b = kiln.tensor{true, false, true}
    assert.same({"i64", 2}, {b:sum():dtype(), b:sum():item()})
    local h = kiln.tensor({0.5, 0.25, 1000}, {dtype = "f16"})
    assert.same({"f16", 1001}, {h:sum():dtype(), h:sum():item()})   -- 1000.75 is halfway: even is 1001
    assert.equal("bf16", kiln.ones(3, {dtype = "bf16"}):mean():dtype())
    assert.equal("f32", kiln.ones(3, {dtype = "i64"}):std():dtype())
  end)

  it("reduce f16, bf16 and f32 data with a double accumulator", function()
    for _, dt in ipairs({"f32", "f16", "bf16"}) do
      local v = data({3, 5, 7}, dt, -2, 2, 64)
      local t = kiln.tensor(v, {dtype = dt})
      local tol = H.tol[dt]
      assert.tensor_near(t:sum(2), H.map(H.sum(v, 2), function(s) return H.round_to(s, dt) end), tol)
      assert.tensor_near(t:mean({1, 3}), H.map(H.mean(v, {1, 3}), function(s) return H.round_to(s, dt) end), tol)
      assert.near(H.round_to(H.sum(v), dt), t:sum():item(), tol * (1 + math.abs(H.sum(v))))
    end
  end)

  it("over empty dims: sum 0, prod 1, mean NaN, max an error", function()
    local e = kiln.zeros(3, 0)
    assert.same({0, 0, 0}, e:sum(2):totable())
    assert.same({1, 1, 1}, e:prod(2):totable())
    assert.equal(0, e:sum():item())
    local m = kiln.zeros(0):mean():item()
    assert.is_true(m ~= m)
    assert.equal(0, e:sum(1):numel())
    assert_contains(err(e.max, e, 2), "max", "empty", "[3,0]")
    assert_contains(err(e.argmin, e), "argmin", "[3,0]")
    assert.equal(0, e:max(1):numel())
  end)

  it("reject dims out of range or given twice", function()
    local t = kiln.zeros(2, 3)
    assert_contains(err(t.sum, t, 3), "sum", "dim 3")
    assert_contains(err(t.sum, t, 0), "sum", "dim 0")
    assert_contains(err(t.sum, t, {1, -2}), "sum", "twice")
    assert_contains(err(t.argmax, t, {1, 2}), "argmax")
    assert.equal(0, t:sum():item())
  end)
end)

describe("matrix products", function()
  local function rand_matrix(n, m, seed) return data({n, m}, "f64", -1, 1, seed) end

  it("mm matches the triple loop, with transposed operands, in f32 and f64", function()
    for _, dt in ipairs({"f32", "f64"}) do
      local tol = dt == "f64" and 1e-12 or 1e-5
      local a, b = rand_matrix(3, 5, 71), rand_matrix(5, 4, 72)
      local A, B = kiln.tensor(a, {dtype = dt}), kiln.tensor(b, {dtype = dt})
      local ref = H.matmul(H.map(a, function(v) return H.round_to(v, dt) end), H.map(b, function(v) return H.round_to(v, dt) end))
      assert.tensor_near(A:mm(B), ref, tol)
      assert.tensor_near(A:matmul(B), ref, tol)
      -- a^T and b^T stored, transposed back as views
      local At = kiln.tensor(H.transpose(a, 1, 2), {dtype = dt}):t()
      local Bt = kiln.tensor(H.transpose(b, 1, 2), {dtype = dt}):t()
      assert.tensor_near(At:mm(Bt), ref, tol)
      assert.tensor_near(At:mm(B), ref, tol)
      assert.tensor_near(A:mm(Bt), ref, tol)
      -- a narrowed operand (row stride larger than its width)
      local wide = rand_matrix(3, 9, 73)
      local Wn = kiln.tensor(wide, {dtype = dt}):narrow(2, 3, 5)
      local wref = {}
      for i = 1, 3 do wref[i] = {unpack(wide[i], 3, 7)} end
      assert.tensor_near(Wn:mm(B), H.matmul(H.map(wref, function(v) return H.round_to(v, dt) end),
                                            H.map(b, function(v) return H.round_to(v, dt) end)), tol)
    end
  end)

  it("a larger product, split across threads, matches the triple loop", function()
    local a, b = rand_matrix(70, 50, 74), rand_matrix(50, 90, 75)
    local r = kiln.tensor(a, {dtype = "f64"}):mm(kiln.tensor(b, {dtype = "f64"}))
    assert.tensor_near(r, H.matmul(a, b), 1e-12)
  end)

  it("f16, bf16 and i64 products", function()
    local a, b = data({4, 3}, "f16", -2, 2, 76, 0.25), data({3, 5}, "f16", -2, 2, 77, 0.25)
    local ref = H.matmul(a, b)     -- exact: quarters, short sums
    for _, dt in ipairs({"f16", "bf16"}) do
      local r = kiln.tensor(a, {dtype = dt}):mm(kiln.tensor(b, {dtype = dt}))
      assert.equal(dt, r:dtype())
      assert.tensor_near(r, H.map(ref, function(v) return H.round_to(v, dt) end), 0)
    end
    local ia, ib = data({4, 3}, "i64", -9, 9, 78), data({3, 5}, "i64", -9, 9, 79)
    local ri = kiln.tensor(ia, {dtype = "i64"}):t():t():mm(kiln.tensor(H.transpose(ib, 1, 2), {dtype = "i64"}):t())
    assert.equal("i64", ri:dtype())
    assert.tensor_near(ri, H.matmul(ia, ib), 0)
  end)

  it("bmm and batched matmul with broadcasting", function()
    local a, b = data({2, 3, 4}, "f64", -1, 1, 81), data({2, 4, 5}, "f64", -1, 1, 82)
    local A, B = kiln.tensor(a, {dtype = "f64"}), kiln.tensor(b, {dtype = "f64"})
    assert.tensor_near(A:bmm(B), H.bmm(a, b), 1e-12)
    local Bt = kiln.tensor(H.permute(b, {1, 3, 2}), {dtype = "f64"}):transpose(2, 3)
    assert.tensor_near(A:bmm(Bt), H.bmm(a, b), 1e-12)
    -- [2,3,4] @ [4,5]: the matrix is shared by the batch
    assert.tensor_near(A:matmul(kiln.tensor(b[1], {dtype = "f64"})), H.bmm(a, {b[1], b[1]}), 1e-12)
    -- [4] @ [4,5] and [3,4] @ [4]
    local v = {1, -2, 0.5, 3}
    assert.tensor_near(kiln.tensor(v, {dtype = "f64"}):matmul(kiln.tensor(b[2], {dtype = "f64"})), H.matmul({v}, b[2])[1], 1e-12)
    local mv = kiln.tensor(a[1], {dtype = "f64"}):matmul(kiln.tensor(v, {dtype = "f64"}))
    assert.tensor_near(mv, H.flatten(H.matmul(a[1], H.transpose({v}, 1, 2))), 1e-12)
    -- dot gives a 0-dim tensor
    local d = kiln.tensor(v, {dtype = "f64"}):dot(kiln.tensor({2, 1, 4, -1}, {dtype = "f64"}))
    assert.equal(0, d:dim())
    assert.equal(1 * 2 - 2 * 1 + 0.5 * 4 - 3, d:item())
  end)

  it("addmm: beta * c + alpha * a @ b, c broadcast; beta = 0 ignores c", function()
    local a, b = rand_matrix(3, 5, 83), rand_matrix(5, 4, 84)
    local c = {1, -1, 2, 0.5}
    local C = kiln.tensor(c, {dtype = "f64"})
    local r = C:addmm(kiln.tensor(a, {dtype = "f64"}), kiln.tensor(b, {dtype = "f64"}), {beta = 0.5, alpha = 2})
    local ref = H.zip(H.matmul(a, b), c, function(p, q) return 2 * p + 0.5 * q end)
    assert.tensor_near(r, ref, 1e-12)
    local plain = C:addmm(kiln.tensor(a, {dtype = "f64"}), kiln.tensor(b, {dtype = "f64"}))
    assert.tensor_near(plain, H.zip(H.matmul(a, b), c, function(p, q) return p + q end), 1e-12)
    local nan = kiln.full({3, 4}, 0 / 0, {dtype = "f64"})
    local z = nan:addmm(kiln.tensor(a, {dtype = "f64"}), kiln.tensor(b, {dtype = "f64"}), {beta = 0})
    assert.tensor_near(z, H.matmul(a, b), 1e-12)
    local bad = kiln.ones(2, {dtype = "f64"})
    assert_contains(err(bad.addmm, bad, kiln.tensor(a, {dtype = "f64"}), kiln.tensor(b, {dtype = "f64"})), "addmm", "[2]", "[3,4]")
  end)

  it("empty inner dims give zeros", function()
    local r = kiln.zeros(3, 0):mm(kiln.zeros(0, 4))
    assert.same({{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}}, r:totable())
  end)

  it("misuse names both shapes or both dtypes", function()
    local a = kiln.ones(3, 5)
    local line, e = here(), err(function() local r = a:mm(kiln.ones(4, 5)) return r end)
    assert_at(line, e)
    assert_contains(e, "mm", "[3,5]", "[4,5]")
    assert_contains(err(a.mm, a, kiln.ones(5, 2, {dtype = "f64"})), "f32", "f64", "[3,5]", "[5,2]")
    assert_contains(err(a.matmul, a, kiln.ones(4)), "matmul", "[3,5]", "[4]")
    assert_contains(err(a.bmm, a, a), "bmm", "3-d")
    assert_contains(err(a.mm, a, kiln.ones(5)), "mm", "2-d")
    assert.same({{5, 5}, {5, 5}, {5, 5}}, a:mm(kiln.ones(5, 2)):totable())
  end)
end)

describe("joining and splitting", function()
  it("cat joins along any dim, promoting dtypes and skipping empty 1-d tensors", function()
    local a, b = {{1, 2}, {3, 4}}, {{5, 6}}
    assert.same({{1, 2}, {3, 4}, {5, 6}}, kiln.cat({kiln.tensor(a), kiln.tensor(b)}):totable())
    assert.same({{1, 2, 7}, {3, 4, 8}}, kiln.cat({kiln.tensor(a), kiln.tensor{{7}, {8}}}, 2):totable())
    assert.same({{1, 2, 7}, {3, 4, 8}}, kiln.cat({kiln.tensor(a), kiln.tensor{{7}, {8}}}, -1):totable())
    local x = data({2, 3, 4}, "f64", -1, 1, 91)
    local y = data({2, 2, 4}, "f64", -1, 1, 92)
    local r = kiln.cat({kiln.tensor(x, {dtype = "f64"}):transpose(1, 3):transpose(1, 3), kiln.tensor(y, {dtype = "f64"})}, 2)
    local expected = {}
    for i = 1, 2 do
      expected[i] = {}
      for _, row in ipairs(x[i]) do expected[i][#expected[i] + 1] = row end
      for _, row in ipairs(y[i]) do expected[i][#expected[i] + 1] = row end
    end
    assert.same(expected, r:totable())
    local p = kiln.cat({kiln.tensor({1}, {dtype = "i32"}), kiln.tensor({0.5}, {dtype = "f32"})})
    assert.same({"f32", {1, 0.5}}, {p:dtype(), p:totable()})
    assert.same({{1, 2}, {3, 4}}, kiln.cat({kiln.zeros(0), kiln.tensor(a)}):totable())
    assert_contains(err(kiln.cat, {kiln.ones(2, 3), kiln.ones(2, 4)}), "cat", "[2,4]", "[2,3]")
    assert_contains(err(kiln.cat, {}), "cat")
  end)

  it("stack adds a dim anywhere", function()
    local a, b = kiln.tensor{1, 2, 3}, kiln.tensor{4, 5, 6}
    assert.same({{1, 2, 3}, {4, 5, 6}}, kiln.stack({a, b}):totable())
    assert.same({{1, 4}, {2, 5}, {3, 6}}, kiln.stack({a, b}, 2):totable())
    assert.same({{1, 4}, {2, 5}, {3, 6}}, kiln.stack({a, b}, -1):totable())
    local m = kiln.stack({kiln.tensor{{1, 2}}, kiln.tensor{{3, 4}}}, 3)
    assert.same({{{1, 3}, {2, 4}}}, m:totable())
    assert_contains(err(kiln.stack, {a, kiln.ones(4)}), "stack", "[4]", "[3]")
  end)

  it("split and chunk give views", function()
    local t = kiln.arange(10):view(5, 2)
    local parts = t:split(2)
    assert.equal(3, #parts)
    assert.same({{0, 1}, {2, 3}}, parts[1]:totable())
    assert.same({{8, 9}}, parts[3]:totable())
    local ex = t:split({1, 4})
    assert.same({{{0, 1}}, {{2, 3}, {4, 5}, {6, 7}, {8, 9}}}, {ex[1]:totable(), ex[2]:totable()})
    local cols = t:split(1, 2)
    assert.same({0, 2, 4, 6, 8}, cols[1]:view(5):totable())
    parts[2][1][1] = 100                        -- row 3 of t
    assert.equal(100, t[3][1])
    local c = kiln.arange(7):chunk(3)
    assert.same({{0, 1, 2}, {3, 4, 5}, {6}}, {c[1]:totable(), c[2]:totable(), c[3]:totable()})
    assert.equal(3, #kiln.arange(6):chunk(4))     -- as PyTorch: chunks of ceil(6/4) = 2
    assert_contains(err(t.split, t, {1, 2}), "split", "3", "5")
    assert_contains(err(t.chunk, t, 0), "chunk")
  end)
end)

describe("indexing by tensors", function()
  local x = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}}

  it("index_select takes 1-based indices, from a table or an i64/i32 tensor", function()
    local t = kiln.tensor(x)
    assert.same({{3, 1, 3}, {7, 5, 7}, {11, 9, 11}}, t:index_select(2, {3, 1, 3}):totable())
    assert.same({{9, 10, 11, 12}, {1, 2, 3, 4}}, t:index_select(1, kiln.tensor({3, 1}, {dtype = "i32"})):totable())
    assert.same({{4, 1}, {8, 5}, {12, 9}}, t:t():index_select(1, kiln.tensor({4, 1}, {dtype = "i64"})):t():totable())
    assert.equal(0, t:index_select(1, kiln.zeros(0, {dtype = "i64"})):size(1))
  end)

  it("gather picks one element per index position", function()
    local t = kiln.tensor(x)
    local idx = {{4, 1}, {2, 2}, {1, 3}}
    local expected = {}
    for i = 1, 3 do expected[i] = {x[i][idx[i][1]], x[i][idx[i][2]]} end
    assert.same(expected, t:gather(2, idx):totable())
    local idx1 = {{3, 1, 2, 3}}
    local e1 = {{}}
    for j = 1, 4 do e1[1][j] = x[idx1[1][j]][j] end
    assert.same(e1, t:gather(1, idx1):totable())
  end)

  it("scatter_add adds src at the indices, duplicates accumulating", function()
    local base = H.filled({3, 4}, function() return 0 end)
    local idx = {{1, 1, 4}, {2, 3, 3}, {4, 4, 4}}
    local src = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}
    local expected = H.map(base, function(v) return v end)
    for i = 1, 3 do for j = 1, 3 do expected[i][idx[i][j]] = expected[i][idx[i][j]] + src[i][j] end end
    local t = kiln.zeros(3, 4)
    assert.same(expected, t:scatter_add(2, idx, kiln.tensor(src)):totable())
    assert.same(base, t:totable())
    t:scatter_add_(2, kiln.tensor(idx, {dtype = "i64"}), kiln.tensor(src))
    assert.same(expected, t:totable())
    local col = kiln.zeros(3, 2):scatter_add(1, {{3, 1}, {3, 1}}, kiln.tensor{{1, 2}, {10, 20}})
    assert.same({{0, 22}, {0, 0}, {11, 0}}, col:totable())
    -- whole rows: index_select's backward scatters its grad back with one index per row,
    -- expanded along the other dims (an embedding's backward)
    for _, dtype in ipairs{"f32", "f64"} do
      local rows = {4, 1, 4, 2, 4}
      local x = kiln.zeros(4, 2, 3, {dtype = dtype}):requires_grad_()
      local g = kiln.arange(5 * 2 * 3, {dtype = dtype}):reshape(5, 2, 3)
      local want = H.filled({4, 2, 3}, function() return 0 end)
      local gv = g:totable()
      for i, r in ipairs(rows) do for j = 1, 2 do for k = 1, 3 do want[r][j][k] = want[r][j][k] + gv[i][j][k] end end end
      (x:index_select(1, rows) * g):sum():backward()
      assert.same(want, x.grad:totable())
    end
  end)

  it("masked_fill and masked_select broadcast the mask", function()
    local t = kiln.tensor(x)
    local mask = {{true, false, false, true}, {false, false, false, false}, {true, true, true, true}}
    local filled = H.zip(x, mask, function(v, m) return m and -1 or v end)
    assert.same(filled, t:masked_fill(kiln.tensor(mask), -1):totable())
    assert.same(x, t:totable())
    local row = kiln.tensor{false, true, false, true}
    assert.same({{1, 0, 3, 0}, {5, 0, 7, 0}, {9, 0, 11, 0}}, t:masked_fill(row, 0):totable())
    assert.same({1, 4, 9, 10, 11, 12}, t:masked_select(kiln.tensor(mask)):totable())
    assert.same({2, 4, 6, 8, 10, 12}, t:masked_select(row):totable())
    -- a transposed input is read in its own row-major order: column 2 of x
    assert.same({2, 6, 10}, t:t():masked_select(kiln.tensor{{false}, {true}, {false}, {false}}):totable())
    t:masked_fill_(kiln.tensor(mask), 0)
    assert.same(H.zip(x, mask, function(v, m) return m and 0 or v end), t:totable())
    assert_contains(err(t.masked_fill, t, kiln.ones(3, 4), 0), "masked_fill", "mask", "f32")
    assert_contains(err(t.masked_fill, t, kiln.tensor{true, false}, 0), "masked_fill", "[2]", "[3,4]")
  end)

  it("an index of 0 or size + 1 is an error counted from 1, and the next op works", function()
    local t = kiln.tensor(x)
    local line, e = here(), err(function() local r = t:index_select(2, {0}) return r end)
    assert_at(line, e)
    assert_contains(e, "index_select", "index 0", "size 4", "[3,4]", "counting from 1")
    assert_contains(err(t.index_select, t, 2, {1, 5}), "index 5", "size 4")
    assert_contains(err(t.index_select, t, 1, {4}), "index 4", "size 3")
    assert_contains(err(t.gather, t, 2, {{1}, {5}, {1}}), "gather", "index 5", "size 4")
    assert_contains(err(t.gather, t, 1, {{0, 1}}), "gather", "index 0", "size 3")
    assert_contains(err(t.scatter_add, t, 2, {{5}}, kiln.ones(1, 1)), "scatter_add", "index 5")
    assert_contains(err(t.index_select, t, 1, kiln.tensor{1}), "index", "f32")
    assert_contains(err(t.index_select, t, 3, {1}), "index_select", "dim 3")
    assert.same({{2}, {6}, {10}}, t:index_select(2, {2}):totable())
  end)
end)

describe("misuse", function()
  it("a shape mismatch names both shapes, at the caller's line, and the next op works", function()
    local a, b = kiln.ones(2, 3), kiln.ones(4)
    local line, e = here(), err(function() local r = a + b return r end)
    assert_at(line, e)
    assert_contains(e, "add", "[2,3]", "[4]")
    line, e = here(), err(function() local r = a:mul(b) return r end)
    assert_at(line, e)
    assert_contains(e, "mul", "[2,3]", "[4]")
    line, e = here(), err(function() local r = kiln.sub(b, a) return r end)
    assert_at(line, e)
    assert_contains(e, "[4]", "[2,3]")
    line, e = here(), err(function() local r = a:lt(b) return r end)
    assert_at(line, e)
    assert_contains(e, "lt", "[2,3]", "[4]")
    line, e = here(), err(function() local r = kiln.ones(3, 2) * a return r end)
    assert_at(line, e)
    assert_contains(e, "[3,2]", "[2,3]")
    assert.same({{2, 2, 2}, {2, 2, 2}}, (a + a):totable())
  end)

  it("a wrong dtype or argument names what was expected", function()
    local a = kiln.ones(2, 3)
    local line, e = here(), err(function() local r = a + "x" return r end)
    assert_at(line, e)
    assert_contains(e, "add", "string")
    assert_contains(err(function() local r = a:add({}) return r end), "add", "table")
    assert_contains(err(function() local r = a:mm(kiln.ones(3, 2, {dtype = "i32"})) return r end), "f32", "i32")
    assert_contains(err(function() local r = a:masked_select(kiln.ones(2, 3, {dtype = "i64"})) return r end), "mask", "i64")
    assert_contains(err(function() local r = a:to("f12") return r end), "f12")
    assert.equal(12, (a * 2):sum():item())
  end)

  it("a dim out of range is counted from 1", function()
    local a = kiln.ones(2, 3)
    local line, e = here(), err(function() local r = a:sum(3) return r end)
    assert_at(line, e)
    assert_contains(e, "sum", "dim 3", "2 dims")
    assert_contains(err(function() local r = a:transpose(1, 0) return r end), "transpose", "dim 0")
    assert_contains(err(function() local r = a:max(-3) return r end), "max", "dim -3")
    assert_contains(err(function() local r = a:unsqueeze(4) return r end), "unsqueeze", "dim 4")
    assert_contains(err(function() local r = a:narrow(3, 1, 1) return r end), "narrow", "dim 3")
    assert_contains(err(function() local r = kiln.cat({a, a}, 3) return r end), "cat", "dim 3")
    assert_contains(err(function() local r = a:squeeze(5) return r end), "squeeze", "dim 5")
    assert.same({3, 3}, a:sum(2):totable())
  end)

  it("functions of the kiln table take the tensor first", function()
    local t = kiln.tensor{1, 4, 9}
    assert.same({1, 2, 3}, kiln.sqrt(t):totable())
    assert.same({2, 5, 10}, kiln.add(t, 1):totable())
    assert.equal(14, kiln.sum(t):item())
  end)
end)
