-- Random numbers: Philox 4x32-10 checked against a Lua implementation (itself checked with the
-- Random123 known-answer vectors), seeding, saving and restoring the state, and independence
-- from the thread count.
local kiln = kiln or require "kiln"
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "?.lua;" .. package.path
local H = require "helpers"
local ffi = require "ffi"
local bit = require "bit"

local U32 = 4294967296
local function u32(x) return x % U32 end                  -- bit ops return signed 32-bit numbers
local function mulhilo(a, b)
  local p = ffi.new("uint64_t", a) * b
  return tonumber(p / U32), tonumber(p % U32)
end

-- Philox 4x32-10 (Salmon et al., SC'11) on a 4-word counter and a 2-word key.
local function philox(c, k)
  local c0, c1, c2, c3 = c[1], c[2], c[3], c[4]
  local k0, k1 = k[1], k[2]
  for r = 1, 10 do
    local hi0, lo0 = mulhilo(0xD2511F53, c0)
    local hi1, lo1 = mulhilo(0xCD9E8D57, c2)
    c0, c1, c2, c3 = u32(bit.bxor(hi1, c1, k0)), lo1, u32(bit.bxor(hi0, c3, k1)), lo0
    if r < 10 then k0, k1 = (k0 + 0x9E3779B9) % U32, (k1 + 0xBB67AE85) % U32 end
  end
  return {c0, c1, c2, c3}
end

-- Element i of a draw: counter = offset + i, key = seed (low word first).
local function block(seed, index)
  return philox({index % U32, math.floor(index / U32), 0, 0}, {seed % U32, math.floor(seed / U32)})
end
local function unit53(a, b) return (a * 2 ^ 21 + math.floor(b / 2 ^ 11)) * 2 ^ -53 end

local function first_differences(a, b)
  local ok, msg = H.compare(a, b, 0)
  return ok, msg
end

describe("Philox in Lua", function()
  it("matches the Random123 known-answer vectors", function()
    assert.same({0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}, philox({0, 0, 0, 0}, {0, 0}))
    assert.same({0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                philox({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}))
    assert.same({0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
                philox({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}))
  end)
end)

describe("the generator", function()
  local threads
  setup(function() threads = kiln.get_num_threads() end)
  teardown(function() kiln.set_num_threads(threads) end)

  it("rand in f64 and f32 draws Philox blocks at seed and offset", function()
    local seed = 0x123456789
    kiln.manual_seed(seed)
    assert.equal(seed, kiln.initial_seed())
    local d = kiln.rand(50, {dtype = "f64"}):totable()
    local f = kiln.rand(50):totable()              -- offset 50 now
    for i = 1, 50 do
      local r = block(seed, i - 1)
      assert.equal(unit53(r[1], r[2]), d[i])
      local s = block(seed, 50 + i - 1)
      assert.equal(math.floor(s[1] / 256) * 2 ^ -24, f[i])
    end
  end)

  it("randn is Box-Muller on the same blocks; randint takes the 64-bit word modulo the range", function()
    kiln.manual_seed(99)
    local n = kiln.randn(40, {dtype = "f64"}):totable()
    local k = kiln.randint(-5, 1000, {40}):totable()
    for i = 1, 40 do
      local r = block(99, i - 1)
      local u1 = 1 - unit53(r[1], r[2])
      local u2 = unit53(r[3], r[4])
      assert.near(math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2), n[i], 1e-12)
      local s = block(99, 40 + i - 1)
      local x = ffi.new("uint64_t", s[1]) * U32 + s[2]
      assert.equal(-5 + tonumber(x % 1005), k[i])
    end
  end)

  it("manual_seed makes every draw repeat", function()
    local function draws()
      return {kiln.rand(3, 4):totable(), kiln.randn(5, {dtype = "f64"}):totable(), kiln.randint(0, 10, {6}):totable(),
              kiln.empty(7):uniform_(-2, 3):totable(), kiln.empty(4):normal_(1, 0.5):totable(),
              kiln.empty(5, {dtype = "i32"}):random_(3, 8):totable()}
    end
    kiln.manual_seed(2024)
    local a = draws()
    kiln.manual_seed(2024)
    local b = draws()
    assert.same(a, b)
    kiln.manual_seed(2025)
    local c = draws()
    assert.are_not.same(a[1], c[1])
    assert.are_not.same(a[2], c[2])
    -- consecutive draws differ
    assert.are_not.same(a[1][1], a[1][2])
  end)

  it("two draws in a row equal one draw of both sizes: the offset advances by numel", function()
    kiln.manual_seed(5)
    local a, b = kiln.randn(10):totable(), kiln.randn(15):totable()
    kiln.manual_seed(5)
    local c = kiln.randn(25):totable()
    for i = 1, 10 do assert.equal(c[i], a[i]) end
    for i = 1, 15 do assert.equal(c[10 + i], b[i]) end
  end)

  it("a non-contiguous tensor is filled in its own row-major order", function()
    kiln.manual_seed(8)
    local a = kiln.empty(6, 4):uniform_()
    kiln.manual_seed(8)
    local b = kiln.empty(4, 6):t():uniform_()
    assert.same(a:totable(), b:totable())
  end)

  it("random_(lo, hi) draws [lo, hi) as PyTorch; random_(n) draws [1, n] as Torch7", function()
    kiln.manual_seed(5)
    local count = {}
    for _, v in ipairs(kiln.empty(4000, {dtype = "i64"}):random_(-1, 2):totable()) do count[v] = (count[v] or 0) + 1 end
    assert.same({-1, 0, 1}, (function() local k = {} for v in pairs(count) do k[#k + 1] = v end table.sort(k) return k end)())
    count = {}
    for _, v in ipairs(kiln.empty(4000, {dtype = "i32"}):random_(3):totable()) do count[v] = (count[v] or 0) + 1 end
    assert.same({1, 2, 3}, (function() local k = {} for v in pairs(count) do k[#k + 1] = v end table.sort(k) return k end)())
    for v = 1, 3 do assert(count[v] > 1000, "value " .. v .. " drawn " .. count[v] .. " times in 4000") end
  end)

  it("get_rng_state and set_rng_state resume a run", function()
    kiln.manual_seed(77)
    kiln.randn(13)
    local state = kiln.get_rng_state()
    assert.same({seed = 77, offset = 13}, state)
    local a = {kiln.randn(100):totable(), kiln.rand(3, {dtype = "f64"}):totable()}
    kiln.manual_seed(1)
    kiln.rand(1000)
    kiln.set_rng_state(state)
    local b = {kiln.randn(100):totable(), kiln.rand(3, {dtype = "f64"}):totable()}
    assert.same(a, b)
    assert.same({seed = 77, offset = 116}, kiln.get_rng_state())
  end)

  it("gives the same numbers with 1 and 2 threads", function()
    local function run(n)
      kiln.set_num_threads(n)
      assert.equal(n, kiln.get_num_threads())
      kiln.manual_seed(31)
      local x = kiln.randn(50000, {dtype = "f64"})
      local u = kiln.rand(40000)
      local k = kiln.randint(0, 7, {30000})
      -- reductions and products split across threads must not change the result either
      local m = x:view(500, 100)
      return {x:totable(), u:totable(), k:totable(), x:sum():item(), (m * 3 + 1):exp():mean(2):totable(),
              m:sum(1):totable(), x:max():item(), m:argmax(1):totable()}, m:mm(m:t())
    end
    local one, p1 = run(1)
    local two, p2 = run(2)
    kiln.set_num_threads(threads)
    for i = 1, #one do
      local ok, msg = first_differences(two[i], one[i])
      assert(ok, "result " .. i .. ": " .. tostring(msg))
    end
    -- OpenBLAS's dgemm may round a row differently when the threads split the rows into
    -- panels, so products agree to rounding only
    assert.tensor_near(p2, p1:totable(), 1e-13)
  end)

  it("rand in f32 and f64 stays in [0, 1) over many draws", function()
    for _, dt in ipairs({"f32", "f64"}) do
      local t = kiln.rand(200000, {dtype = dt})
      assert.equal(0, t:ge(1):sum():item())
      assert.equal(0, t:lt(0):sum():item())
    end
  end)

  -- f16 and bf16 round after the draw: about 1 in 4000 f16 and 1 in 500 bf16 draws would land on 1.0
  it("rand in f16 and bf16 stays in [0, 1) over many draws", function()
    for _, dt in ipairs({"f16", "bf16"}) do
      local t = kiln.rand(1000000, {dtype = dt})
      assert.equal(0, t:ge(1):sum():item())
      assert.equal(0, t:lt(0):sum():item())
      assert.is_true(t:max():item() > 0.99)
    end
    local u = kiln.empty(100000, {dtype = "f16"}):uniform_(-3, -1)
    assert.equal(0, u:ge(-1):sum():item())
  end)

  it("rejects a bad thread count and bad ranges", function()
    assert.has_error(function() kiln.set_num_threads(0) end)
    assert.equal(threads, kiln.get_num_threads())
    local t = kiln.empty(3)
    assert.is_truthy(H.contains(H.error_of(t.uniform_, t, 1, 0), "uniform"))
    assert.is_truthy(H.contains(H.error_of(t.normal_, t, 0, -1), "normal"))
    local i = kiln.empty(3, {dtype = "i64"})
    assert.is_truthy(H.contains(H.error_of(i.uniform_, i), "i64"))
  end)
end)
