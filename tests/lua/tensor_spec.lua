-- Tensors: creation, properties, indexing, views, conversions, printing and early freeing,
-- each checked against values written out by hand or computed by tests/lua/helpers.lua.
local kiln = kiln or require "kiln"
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "?.lua;" .. package.path
local H = require "helpers"

local SRC = debug.getinfo(1, "S").short_src
local function here() return debug.getinfo(2, "l").currentline end

-- The message of an error raised by fn, which must fail.
local err = H.error_of

local function assert_contains(msg, ...)
  for _, part in ipairs({...}) do
    assert(H.contains(msg, part), string.format("message %q lacks %q", msg, part))
  end
end

describe("the test helpers", function()
  it("name the first position where a tensor and its reference differ", function()
    local ok, msg = H.compare(kiln.tensor{{1, 2}, {3, 4}}, {{1, 2}, {3, 5}}, 0)
    assert.is_false(ok)
    assert_contains(msg, "[2,2]", "got 4", "expected 5")
    assert.is_false((H.compare(kiln.tensor{1, 2}, {1, 2, 3})))
    assert.is_false((H.compare(kiln.tensor{1, 0 / 0}, {1, 2}, 0.1)))
    assert.is_true((H.compare(kiln.tensor{1, 0 / 0}, {1, 0 / 0})))
    assert.is_true((H.compare(kiln.tensor{1, 2.0001}, {1, 2}, 1e-3)))
    assert.is_false((H.compare(kiln.tensor{true}, {1})))
    assert.has_error(function() H.assert_close(kiln.tensor{1}, {2}) end)
    assert.has_error(function() assert.tensor_near(kiln.tensor{{1, 2}}, {{1, 3}}, 1e-6) end)
    assert.tensor_near(kiln.tensor{{1, 2}}, {{1, 2}}, 0)
  end)

  it("compute references by hand-checkable rules", function()
    assert.same({{1, 4}, {2, 5}, {3, 6}}, H.transpose({{1, 2, 3}, {4, 5, 6}}, 1, 2))
    assert.same({{19, 22}, {43, 50}}, H.matmul({{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}))
    assert.same({{11, 21}, {12, 22}}, H.zip({{1}, {2}}, {10, 20}, function(a, b) return a + b end))
    assert.same({5, 7, 9}, H.sum({{1, 2, 3}, {4, 5, 6}}, 1))
    assert.same({{6}, {15}}, H.sum({{1, 2, 3}, {4, 5, 6}}, 2, true))
    assert.equal(21, H.sum({{1, 2, 3}, {4, 5, 6}}))
    local v, i = H.max({{1, 7, 7}, {9, 2, 3}}, 2)
    assert.same({{7, 9}, {2, 1}}, {v, i})
    assert.equal(4, H.argmax({{1, 7, 7}, {9, 2, 3}}))
    assert.equal(1, H.round_to(1 + 2 ^ -11, "f16"))
    assert.equal(254, H.round_to(-2.5, "u8"))
  end)
end)

describe("creating tensors", function()
  it("from nested tables keeps values, shape and the default f32", function()
    local t = kiln.tensor{{1, 2, 3}, {4, 5.5, -6}}
    assert.same({2, 3}, {t:size(1), t:size(2)})
    assert.equal("f32", t:dtype())
    assert.same({{1, 2, 3}, {4, 5.5, -6}}, t:totable())
  end)

  it("from nested tables in every dtype rounds like a C cast into that dtype", function()
    local data = {1.5, -2.5, 3, 0.1, 200.75}
    for _, d in ipairs({"f32", "f64", "f16", "bf16", "i64", "i32", "u8"}) do
      local t = kiln.tensor(data, {dtype = d})
      assert.equal(d, t:dtype())
      assert.same(H.map(data, function(x) return H.round_to(x, d) end), t:totable())
    end
  end)

  it("from booleans gives bool, or 1 and 0 in a named dtype", function()
    local b = kiln.tensor{{true, false}, {false, true}}
    assert.equal("bool", b:dtype())
    assert.same({{true, false}, {false, true}}, b:totable())
    assert.same({1, 0, 1}, kiln.tensor({true, false, true}, {dtype = "i32"}):totable())
  end)

  it("from a number gives a 0-dim tensor", function()
    local t = kiln.tensor(2.5)
    assert.equal(0, t:dim())
    assert.equal(1, t:numel())
    assert.equal(2.5, t:item())
    assert.equal(2.5, t:totable())
  end)

  it("from an empty table gives an empty tensor", function()
    assert.same({0}, {kiln.tensor{}:size(1)})
    local t = kiln.tensor{{}, {}}
    assert.same({2, 0}, {t:size(1), t:size(2)})
    assert.equal(0, t:numel())
  end)

  it("from a ragged table is an error naming the problem", function()
    assert_contains(err(kiln.tensor, {{1, 2}, {3}}), "ragged", "dim 2")
    assert_contains(err(kiln.tensor, {{1, 2}, 3}), "ragged")
    assert_contains(err(kiln.tensor, {1, {2}}), "ragged")
    assert_contains(err(kiln.tensor, {{1}, {{2}}}), "ragged")
    assert_contains(err(kiln.tensor, {1, "two"}), "string")
    -- and the next call works
    assert.same({{1}, {2}}, kiln.tensor{{1}, {2}}:totable())
  end)

  it("copies a tensor given to kiln.tensor", function()
    local a = kiln.tensor{1, 2, 3}
    local b = kiln.tensor(a, {dtype = "f64"})
    b[1] = 10
    assert.equal("f64", b:dtype())
    assert.same({1, 2, 3}, a:totable())
    local c = kiln.tensor(a)
    c[2] = 20
    assert.same({1, 2, 3}, a:totable())
  end)

  it("zeros, ones, full and empty take sizes as numbers or a table, and options", function()
    assert.same({{0, 0, 0}, {0, 0, 0}}, kiln.zeros(2, 3):totable())
    assert.same({{1, 1}, {1, 1}, {1, 1}}, kiln.ones({3, 2}):totable())
    assert.same({{7, 7, 7}, {7, 7, 7}}, kiln.full({2, 3}, 7):totable())
    local f = kiln.full(2, 2, -3.5, {dtype = "f64"})
    assert.equal("f64", f:dtype())
    assert.same({{-3.5, -3.5}, {-3.5, -3.5}}, f:totable())
    assert.same({{2, 2}}, kiln.full(1, 2, 2.9, {dtype = "i32"}):totable())
    local e = kiln.empty(4, 5, {dtype = "i64"})
    assert.same({4, 5, "i64"}, {e:size(1), e:size(2), e:dtype()})
    assert.equal("u8", kiln.zeros(3, {dtype = "u8"}):dtype())
    assert.equal(0, kiln.zeros():dim())
    assert.same({0, 3}, {kiln.zeros(0, 3):size(1), kiln.zeros(0, 3):size(2)})
  end)

  it("zeros_like, ones_like and full_like follow the model's shape and dtype", function()
    local m = kiln.empty(2, 3, {dtype = "i32"})
    local z = kiln.zeros_like(m)
    assert.same({"i32", 2, 3}, {z:dtype(), z:size(1), z:size(2)})
    assert.same({{1, 1, 1}, {1, 1, 1}}, kiln.ones_like(m):totable())
    assert.same({{4.5, 4.5, 4.5}, {4.5, 4.5, 4.5}}, kiln.full_like(m, 4.5, {dtype = "f64"}):totable())
  end)

  it("arange follows PyTorch: the end is excluded, i64 for integer arguments, f32 otherwise", function()
    local a = kiln.arange(5)
    assert.equal("i64", a:dtype())
    assert.same({0, 1, 2, 3, 4}, a:totable())
    assert.same({2, 3, 4}, kiln.arange(2, 5):totable())
    assert.same({10, 7, 4, 1}, kiln.arange(10, 0, -3):totable())
    local f = kiln.arange(1, 2, 0.25)
    assert.equal("f32", f:dtype())
    assert.same({1, 1.25, 1.5, 1.75}, f:totable())
    -- ceil((1 - 0) / 0.1) = 10 elements
    assert.equal(10, kiln.arange(0, 1, 0.1):numel())
    assert.equal(0, kiln.arange(0):numel())
    local d = kiln.arange(0, 3, {dtype = "f64"})
    assert.same({"f64", {0, 1, 2}}, {d:dtype(), d:totable()})
  end)

  it("linspace includes both ends", function()
    assert.same({0, 0.25, 0.5, 0.75, 1}, kiln.linspace(0, 1, 5):totable())
    assert.same({2}, kiln.linspace(2, 3, 1):totable())
    local l = kiln.linspace(-1, 1, 3, {dtype = "f64"})
    assert.same({"f64", {-1, 0, 1}}, {l:dtype(), l:totable()})
  end)

  it("eye is the identity, square or not", function()
    assert.same({{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}, kiln.eye(3):totable())
    assert.same({{1, 0, 0}, {0, 1, 0}}, kiln.eye(2, 3):totable())
    local e = kiln.eye(2, {dtype = "i64"})
    assert.same({"i64", {{1, 0}, {0, 1}}}, {e:dtype(), e:totable()})
  end)

  it("rand fills [0, 1) uniformly", function()
    local t = kiln.rand(20000, {dtype = "f64"})
    assert.equal("f64", t:dtype())
    local flat = t:totable()
    local lo, hi, sum, below = math.huge, -math.huge, 0, 0
    for _, v in ipairs(flat) do
      lo, hi, sum = math.min(lo, v), math.max(hi, v), sum + v
      if v < 0.25 then below = below + 1 end
    end
    assert.is_true(lo >= 0 and hi < 1)
    assert.is_true(math.abs(sum / #flat - 0.5) < 0.01)
    assert.is_true(math.abs(below / #flat - 0.25) < 0.015)
    assert.same({2, 3}, {kiln.rand(2, 3):size(1), kiln.rand(2, 3):size(2)})
  end)

  it("randn draws mean 0 and std 1", function()
    local flat = kiln.randn(20000):totable()
    local s, q = 0, 0
    for _, v in ipairs(flat) do s = s + v q = q + v * v end
    local mean = s / #flat
    local std = math.sqrt(q / #flat - mean * mean)
    assert.is_true(math.abs(mean) < 0.03, "mean " .. mean)
    assert.is_true(math.abs(std - 1) < 0.03, "std " .. std)
    assert.equal("bf16", kiln.randn(3, {dtype = "bf16"}):dtype())
  end)

  it("randint draws integers in [low, high), i64 unless told", function()
    local t = kiln.randint(3, 9, {2000})
    assert.equal("i64", t:dtype())
    local seen = {}
    for _, v in ipairs(t:totable()) do
      assert.is_true(v >= 3 and v < 9 and v == math.floor(v), "value " .. v)
      seen[v] = true
    end
    for v = 3, 8 do assert.is_true(seen[v], "never drew " .. v) end
    local u = kiln.randint(4, {3, 5}, {dtype = "i32"})
    assert.same({"i32", 3, 5}, {u:dtype(), u:size(1), u:size(2)})
    for _, row in ipairs(u:totable()) do for _, v in ipairs(row) do assert.is_true(v >= 0 and v < 4) end end
    assert_contains(err(kiln.randint, 5, 5, {3}), "randint", "empty")
  end)

  it("names the device, and rejects unknown devices and dtypes", function()
    assert.equal("cpu", kiln.zeros(2, {device = "cpu"}):device())
    assert_contains(err(kiln.zeros, 2, {device = "gpu"}), "gpu")
    assert_contains(err(kiln.zeros, 2, {dtype = "f17"}), "f17", "zeros")
    assert_contains(err(kiln.tensor, {1}, {dtype = "float8"}), "float8")
    assert.equal(2, kiln.zeros(2):numel())
  end)
end)

describe("tensor properties", function()
  it("size, dim, numel, dtype, # and stride", function()
    local t = kiln.zeros(2, 3, 4, {dtype = "f64"})
    assert.same({2, 3, 4}, {t:size(1), t:size(2), t:size(3)})
    assert.equal(4, t:size(-1))
    assert.equal(2, t:size(-3))
    local s = t:size()
    assert.same({2, 3, 4}, {s[1], s[2], s[3]})
    assert.equal(3, #s)
    assert.equal("[2, 3, 4]", tostring(s))
    assert.equal(3, t:dim())
    assert.equal(24, t:numel())
    assert.equal("f64", t:dtype())
    assert.equal(2, #t)
    assert.equal(0, #kiln.tensor(1))
    assert.same({12, 4, 1}, t:stride())
    assert.equal(8, t:element_size())
    assert.is_true(t:is_contiguous())
    assert.is_false(t:transpose(1, 3):is_contiguous())
  end)

  it("rejects a dim out of range, counting from 1", function()
    local t = kiln.zeros(2, 3)
    assert_contains(err(t.size, t, 3), "dim 3")
    assert_contains(err(t.size, t, 0), "dim 0")
    assert_contains(err(t.size, t, -3), "dim -3")
    assert.equal(3, t:size(2))
  end)
end)

describe("indexing", function()
  it("t[i] counts from 1, -1 is the last", function()
    local v = kiln.tensor{10, 20, 30}
    assert.equal(10, v[1])
    assert.equal(30, v[3])
    assert.equal(30, v[-1])
    assert.equal(10, v[-3])
    local b = kiln.tensor{true, false}
    assert.equal(true, b[1])
    assert.equal(false, b[2])
  end)

  it("t[i] of a matrix is a row that shares memory; t[i][j] and t{i, j} are elements", function()
    local m = kiln.tensor{{1, 2, 3}, {4, 5, 6}}
    local row = m[2]
    assert.is_true(kiln.is_tensor(row))
    assert.same({4, 5, 6}, row:totable())
    assert.equal(6, m[2][3])
    assert.equal(6, m[{2, 3}])
    assert.equal(3, m[{1, -1}])
    assert.equal(4, m[-1][1])
    assert.same({1, 2, 3}, m[{1}]:totable())
    row[1] = 40
    assert.equal(40, m[2][1])
  end)

  it("indexes views by their strides", function()
    local m = kiln.tensor{{1, 2, 3}, {4, 5, 6}}:t()      -- [[1,4],[2,5],[3,6]]
    assert.equal(2, m[2][1])
    assert.equal(6, m[{3, 2}])
    local n = kiln.arange(10):narrow(1, 4, 5)             -- 3..7
    assert.equal(3, n[1])
    assert.equal(7, n[-1])
  end)

  it("assigns t[i] = v, t[i][j] = v and t[{i, j}] = v", function()
    local m = kiln.zeros(2, 3)
    m[1][2] = 5
    m[{2, 3}] = -1
    m[{2, -3}] = 7
    assert.same({{0, 5, 0}, {7, 0, -1}}, m:totable())
    m[1] = 9                                   -- a row filled with a number
    assert.same({{9, 9, 9}, {7, 0, -1}}, m:totable())
    m[2] = kiln.tensor{1, 2, 3}                -- a row copied from a tensor
    assert.same({{9, 9, 9}, {1, 2, 3}}, m:totable())
    local v = kiln.zeros(3, {dtype = "i32"})
    v[-1] = 4.9                                -- stored as a C cast would
    assert.same({0, 0, 4}, v:totable())
    local b = kiln.zeros(2, {dtype = "bool"})
    b[2] = true
    assert.same({false, true}, b:totable())
  end)

  it("t[mask] and t[rows] select as masked_select and index_select; t[mask] = v and t[{}] = v fill", function()
    local m = kiln.tensor{{1, -2, 3}, {-4, 5, -6}}
    assert.same({1, 3, 5}, m[m:gt(0)]:totable())                        -- row-major order
    assert.same({{-4, 5, -6}, {1, -2, 3}, {-4, 5, -6}}, m[kiln.tensor({2, 1, -1 + 3}, {dtype = "i64"})]:totable())
    assert.same({{1, -2, 3}}, m[kiln.tensor({1}, {dtype = "i32"})]:totable())
    local c = m:clone()
    c[c:lt(0)] = 0                                                       -- in place, like masked_fill_
    assert.same({{1, 0, 3}, {0, 5, 0}}, c:totable())
    c[{}] = 7
    assert.same({{7, 7, 7}, {7, 7, 7}}, c:totable())
    c[{}] = kiln.tensor{1, 2, 3}                                         -- broadcast like copy_
    assert.same({{1, 2, 3}, {1, 2, 3}}, c:totable())
    assert.same({{1, -2, 3}, {-4, 5, -6}}, m:totable())                 -- the source untouched
  end)

  it("an index or a value of the wrong kind is named", function()
    local m = kiln.zeros(2, 3)
    assert_contains(err(function() return m[{1, 2, 3}] end), "3 indices for a tensor of 2 dims")
    assert_contains(err(function() m[{1, 2, 3}] = 1 end), "3 indices for a tensor of 2 dims")
    assert_contains(err(function() return m[kiln.ones(2)] end), "must be bool (a mask) or i64/i32", "got f32")
    assert_contains(err(function() m[1] = "x" end), "the value assigned must be a number, a boolean or a tensor, got a string")
    assert_contains(err(function() m[1] = nil end), "got nil")
    assert_contains(err(function() m[{1, 2}] = {} end), "got a table")
    assert_contains(err(function() m[m:gt(0)] = kiln.ones(1) end), "t[mask] = v takes a number")
    assert_contains(err(function() m[kiln.tensor({1}, {dtype = "i64"})] = 0 end), "index tensor of i64")
    assert_contains(err(function() m.grad = "x" end), "grad: must be a tensor or nil, got a string")
    assert_contains(err(function() return m[1e300] end), "index 1e+300 out of range")
    assert.equal(0, m:sum():item())
  end)

  it("an index out of range names the index and the size", function()
    local m = kiln.zeros(3, 4)
    local line, e = here(), err(function() local x = m[4] return x end)
    assert_contains(e, "index 4", "size 3", "[3,4]")
    assert.equal(SRC .. ":" .. line .. ":", e:sub(1, #SRC + #tostring(line) + 2))
    assert_contains(err(function() local x = m[0] return x end), "index 0", "size 3")
    assert_contains(err(function() local x = m[-4] return x end), "index -4", "size 3")
    assert_contains(err(function() local x = m[2][5] return x end), "index 5", "size 4")
    assert_contains(err(function() m[{1, 9}] = 1 end), "index 9", "size 4")
    assert_contains(err(function() m[4] = 1 end), "index 4", "size 3")
    assert_contains(err(function() local x = m[1.5] return x end), "integer")
    assert_contains(err(function() local x = kiln.tensor(1)[1] return x end), "0-dim")
    -- the tensor is unharmed and the next op works
    assert.equal(0, m[3][4])
    assert.equal(12, m:add(1):sum():item())
  end)
end)

describe("views", function()
  local base12 = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}}

  it("view and reshape", function()
    local a = kiln.arange(12)
    assert.same(base12, a:view(3, 4):totable())
    assert.same(base12, a:view(3, -1):totable())
    assert.same(base12, a:view({-1, 4}):totable())
    assert.same({{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}}, a:reshape(2, 6):totable())
    assert.same({2, 2, 3}, {a:view(2, 2, 3):size(1), a:view(2, 2, 3):size(2), a:view(2, 2, 3):size(3)})
    assert_contains(err(a.view, a, 5, 3), "view", "[12]")
    -- a transposed tensor cannot be viewed flat, but reshape copies
    local t = a:view(3, 4):t()
    assert_contains(err(t.view, t, 12), "view", "reshape")
    assert.same(H.flatten(H.transpose(base12, 1, 2)), t:reshape(12):totable())
  end)

  it("transpose, t and permute match the reference", function()
    local x = H.filled({2, 3, 4}, function(i) return i end)
    local t = kiln.tensor(x)
    assert.same(H.transpose(x, 1, 3), t:transpose(1, 3):totable())
    assert.same(H.transpose(x, 2, -1), t:transpose(2, -1):totable())
    assert.same(H.permute(x, {3, 1, 2}), t:permute(3, 1, 2):totable())
    assert.same(H.permute(x, {2, 3, 1}), t:permute({2, 3, 1}):totable())
    assert.same(H.transpose(base12, 1, 2), kiln.tensor(base12):t():totable())
    assert.same({1, 2}, kiln.tensor{1, 2}:t():totable())
    assert_contains(err(t.t, t), "t:", "[2,3,4]")
  end)

  it("narrow and select count from 1", function()
    local a = kiln.tensor(base12)
    assert.same({{1, 2}, {5, 6}, {9, 10}}, a:narrow(2, 2, 2):totable())
    assert.same({{4, 5, 6, 7}, {8, 9, 10, 11}}, a:narrow(1, 2, 2):totable())
    assert.same({{2, 3}, {6, 7}, {10, 11}}, a:narrow(2, -2, 2):totable())
    assert.same({2, 6, 10}, a:select(2, 3):totable())
    assert.same({8, 9, 10, 11}, a:select(1, -1):totable())
    assert_contains(err(a.narrow, a, 2, 4, 2), "narrow", "start 4", "length 2", "size 4")
    assert_contains(err(a.narrow, a, 2, 0, 1), "narrow", "start 0")
    assert_contains(err(a.select, a, 1, 4), "index 4", "size 3")
  end)

  it("squeeze, unsqueeze, expand and flatten", function()
    local a = kiln.zeros(1, 3, 1, 2)
    local s = a:squeeze()
    assert.same({3, 2}, {s:size(1), s:size(2)})
    local s3 = a:squeeze(3)
    assert.same({1, 3, 2}, {s3:size(1), s3:size(2), s3:size(3)})
    local v = kiln.tensor{1, 2, 3}
    assert.same({{1, 2, 3}}, v:unsqueeze(1):totable())
    assert.same({{1}, {2}, {3}}, v:unsqueeze(2):totable())
    assert.same({{1}, {2}, {3}}, v:unsqueeze(-1):totable())
    local e = v:view(3, 1):expand(3, 4)
    assert.same({{1, 1, 1, 1}, {2, 2, 2, 2}, {3, 3, 3, 3}}, e:totable())
    assert.same({1, 0}, e:stride())
    assert.same({{1, 2, 3}, {1, 2, 3}}, v:expand(2, -1):totable())
    assert_contains(err(v.expand, v, 2, 4), "expand", "[3]")
    local x = H.filled({2, 3, 4}, function(i) return i end)
    local t = kiln.tensor(x)
    assert.same(H.flatten(x), t:flatten():totable())
    local f = t:flatten(2)
    assert.same({2, 12}, {f:size(1), f:size(2)})
    assert.same(H.flatten(x[2]), f[2]:totable())
    local g = t:flatten(1, 2)
    assert.same({6, 4}, {g:size(1), g:size(2)})
  end)

  it("contiguous copies a non-contiguous view into row-major order", function()
    local t = kiln.tensor(base12):t()
    local c = t:contiguous()
    assert.is_true(c:is_contiguous())
    assert.same({3, 1}, c:stride())
    assert.same(H.transpose(base12, 1, 2), c:totable())
    c[1][1] = 100
    assert.equal(0, t[1][1])
  end)

  it("views share memory with their base, both ways", function()
    local base = kiln.zeros(3, 4)
    base:view(12)[6] = 1                     -- [2][2]
    base:t()[4][3] = 2                       -- [3][4]
    base:narrow(2, 2, 2)[1][2] = 3           -- [1][3]
    base:select(1, 2):fill_(0)[4] = 4        -- row 2 cleared, [2][4]
    base:unsqueeze(1)[1][3][1] = 5           -- [3][1]
    base:permute(2, 1)[1][1] = 6             -- [1][1]
    assert.same({{6, 0, 3, 0}, {0, 0, 0, 4}, {5, 0, 0, 2}}, base:totable())
    local row = base[3]
    base[3][2] = 7
    assert.equal(7, row[2])
    local flat = base:flatten()
    flat:fill_(1)
    assert.same({{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}}, base:totable())
  end)
end)

describe("totable and item", function()
  it("item reads a one-element tensor of any dim", function()
    assert.equal(3, kiln.tensor{{3}}:item())
    assert.equal(-2, kiln.tensor({-2}, {dtype = "i64"}):item())
    assert.equal(true, kiln.tensor{true}:item())
    assert.equal(0.5, kiln.tensor{1, 0.5}[{2}])
    assert_contains(err(function() local x = kiln.ones(2, 3):item() return x end), "item", "[2,3]")
  end)

  it("totable nests like the tensor and reads booleans as booleans", function()
    local x = H.filled({2, 1, 3}, function(i) return i * 0.5 end)
    assert.same(x, kiln.tensor(x, {dtype = "f64"}):totable())
    assert.same({{true}, {false}}, kiln.tensor{{1}, {0}}:bool():totable())
    assert.same({{}, {}}, kiln.zeros(2, 0):totable())
  end)
end)

describe("tostring", function()
  it("aligns the columns of a matrix and ends with a footer", function()
    assert.equal(" 1 2 3\n 4 5 6\n[kiln.Tensor f32 of size 2x3]", tostring(kiln.tensor{{1, 2, 3}, {4, 5, 6}}))
    assert.equal("  1.5000 -2.0000\n 10.0000  0.2500\n[kiln.Tensor f64 of size 2x2]",
                 tostring(kiln.tensor({{1.5, -2}, {10, 0.25}}, {dtype = "f64"})))
    assert.equal(" 10 -3  0\n[kiln.Tensor i32 of size 3]", tostring(kiln.tensor({10, -3, 0}, {dtype = "i32"})))
  end)

  it("prints a vector on one line, wrapped at the line width", function()
    assert.equal(" 1 2 3\n[kiln.Tensor f32 of size 3]", tostring(kiln.tensor{1, 2, 3}))
    local s = tostring(kiln.arange(60))
    local lines = {}
    for l in s:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(3, #lines)   -- 60 cells of 3 characters: two lines of at most 100, then the footer
    assert.is_true(#lines[1] <= 100 and #lines[1] > 90)
    assert.equal("  0  1  2", lines[1]:sub(1, 9))
    assert.equal(" 59", lines[2]:sub(-3))
    assert.equal(" 0 1 2 ... 1997 1998 1999", (tostring(kiln.arange(2000)):match("^[^\n]+"):gsub("%s+", " ")))
  end)

  it("prints scalars, booleans, special values and empty tensors", function()
    assert.equal("3\n[kiln.Tensor f32 of size []]", tostring(kiln.tensor(3)))
    assert.equal("  true false\n[kiln.Tensor bool of size 2]", tostring(kiln.tensor{true, false}))
    assert.equal("    nan    inf   -inf 1.5000\n[kiln.Tensor f32 of size 4]",
                 tostring(kiln.tensor{0 / 0, 1 / 0, -1 / 0, 1.5}))
    assert.equal(" 1.0000e-05 1.0000e+00\n[kiln.Tensor f32 of size 2]", tostring(kiln.tensor{1e-5, 1}))
    local e = tostring(kiln.zeros(0, 3))
    assert_contains(e, "no elements", "0x3")
  end)

  it("labels the 2-d slices of a 3-d tensor (i,.,.)", function()
    local expected = "(1,.,.) = \n 0 1\n 2 3\n\n(2,.,.) = \n 4 5\n 6 7\n\n[kiln.Tensor i64 of size 2x2x2]"
    assert.equal(expected, tostring(kiln.arange(8):view(2, 2, 2)))
    local four = tostring(kiln.arange(16):view(2, 2, 2, 2))
    assert_contains(four, "(1,1,.,.) = ", "(2,2,.,.) = \n 12 13\n 14 15", "[kiln.Tensor i64 of size 2x2x2x2]")
  end)

  it("summarises a 100x100 tensor with its edges and '...'", function()
    local s = tostring(kiln.arange(10000):view(100, 100))
    local lines = {}
    for l in (s .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = l end
    assert.equal(8, #lines)
    assert.equal("    0    1    2 ...   97   98   99", lines[1])
    assert.equal(" ...", lines[4])
    assert.equal(" 9900 9901 9902 ... 9997 9998 9999", lines[7])
    assert.equal("[kiln.Tensor i64 of size 100x100]", lines[8])
  end)

  it("numbers the slices after the '...' of a summarised 3-d tensor by their place", function()
    local s = tostring(kiln.arange(10 * 2 * 60):view(10, 2, 60))
    local labels = {}
    for l in s:gmatch("%(([%d,]+),%.,%.%)") do labels[#labels + 1] = l end
    assert.same({"1", "2", "3", "8", "9", "10"}, labels)
    -- the last slice starts with element (10, 1, 1) = 9 * 120
    assert_contains(s, "(10,.,.) = \n 1080 1081 1082 ...")
  end)

  it("prints a freed tensor without reading it", function()
    local t = kiln.ones(2)
    t:free()
    assert.equal("[kiln.Tensor f32 (freed)]", tostring(t))
  end)
end)

describe("copies and conversions", function()
  it("clone does not share memory", function()
    local a = kiln.tensor{1, 2, 3}
    local b = a:clone()
    b[1] = 10
    assert.same({1, 2, 3}, a:totable())
    local t = kiln.tensor{{1, 2}, {3, 4}}:t():clone()
    assert.same({{1, 3}, {2, 4}}, t:totable())
  end)

  it("copy_ converts, broadcasts and writes through views", function()
    local dst = kiln.zeros(2, 3, {dtype = "i32"})
    dst:copy_(kiln.tensor{1.9, -1.9, 3})
    assert.same({{1, -1, 3}, {1, -1, 3}}, dst:totable())
    local base = kiln.zeros(3, 3)
    base:t():copy_(kiln.tensor{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}})
    assert.same({{1, 4, 7}, {2, 5, 8}, {3, 6, 9}}, base:totable())
    local e = err(dst.copy_, dst, kiln.ones(4))
    assert_contains(e, "[2,3]", "[4]")
    assert.same({{2, 2, 2}, {2, 2, 2}}, dst:fill_(2):totable())
    assert.same({{0, 0, 0}, {0, 0, 0}}, dst:zero_():totable())
  end)

  it("to(dtype) converts every dtype to every other", function()
    local data = {0, 1, -2, 2.75, 100}
    local dtypes = {"f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool"}
    for _, from in ipairs(dtypes) do
      local src = kiln.tensor(data, {dtype = from})
      local held = H.map(data, function(x) return H.round_to(x, from) end)
      for _, to in ipairs(dtypes) do
        local r = src:to(to)
        assert.equal(to, r:dtype())
        local expected = H.map(held, function(x)
          if type(x) == "boolean" then x = x and 1 or 0 end
          return H.round_to(x, to)
        end)
        local ok, msg = H.compare(r, expected, 0)
        assert(ok, from .. " -> " .. to .. ": " .. tostring(msg))
      end
    end
    assert.equal("f64", kiln.ones(2):double():dtype())
    assert.equal("i64", kiln.ones(2):long():dtype())
    assert.equal("f16", kiln.ones(2):half():dtype())
    assert.equal("i32", kiln.ones(2):type("i32"):dtype())
    assert.equal("f32", kiln.ones(2):type())
    assert.equal("f64", kiln.ones(2):to(kiln.zeros(1, {dtype = "f64"})):dtype())
  end)

  it("rounds to f16 to nearest, ties to even", function()
    local f16 = function(x) return kiln.tensor{x}:to("f16"):item() end
    assert.equal(1, f16(1 + 2 ^ -11))                -- halfway to 1 + 2^-10: the even neighbour is 1
    assert.equal(1 + 2 ^ -9, f16(1 + 3 * 2 ^ -11))   -- halfway between 1 + 2^-10 and 1 + 2^-9: even is 1 + 2^-9
    assert.equal(1 + 2 ^ -10, f16(1 + 2 ^ -11 + 2 ^ -20))  -- above halfway rounds up
    assert.equal(65504, f16(65504))                  -- the largest f16
    assert.equal(65504, f16(65519))                  -- below the halfway point to 2^16
    assert.equal(math.huge, f16(65520))              -- halfway rounds to even: overflow
    assert.equal(-math.huge, f16(-1e6))
    assert.equal(2 ^ -24, f16(2 ^ -24))              -- the smallest subnormal
    assert.equal(0, f16(2 ^ -25))                    -- halfway to 0: even
    assert.equal(2 ^ -24, f16(3 * 2 ^ -26))          -- above halfway
    assert.equal(2 * 2 ^ -24, f16(5 * 2 ^ -25))      -- 2.5 subnormal ulps: even is 2
    assert.equal(3 * 2 ^ -24, f16(11 * 2 ^ -26))     -- 2.75 ulps rounds up to 3
  end)

  it("rounds to bf16 to nearest, ties to even", function()
    local bf = function(x) return kiln.tensor{x}:to("bf16"):item() end
    assert.equal(1, bf(1 + 2 ^ -8))
    assert.equal(1 + 2 ^ -6, bf(1 + 3 * 2 ^ -8))
    assert.equal(1 + 2 ^ -7, bf(1 + 2 ^ -8 + 2 ^ -12))
    assert.equal(256, bf(257))                       -- 257 = 256 + half an ulp (2): even
    assert.equal(260, bf(259))                       -- 259 = 258 + half an ulp: even is 260
    assert.equal(-3, bf(-3))
  end)

  it("casts a long contiguous tensor part by part as it rounds each value", function()
    -- contiguous casts convert straight into the output, over the pool's parts; known roundings at
    -- the start, across parts and at the end, and every value as a strided source (the iterator's
    -- blocks) gives it, in both directions and to f16
    local prev = kiln.get_num_threads()
    kiln.set_num_threads(2)
    local n = 3 * 65536 + 7
    local x = kiln.randn(n) * 1000
    local known = {[1] = {1 + 2 ^ -8, 1}, [65536] = {257, 256}, [65537] = {259, 260}, [131073] = {1e39, math.huge},
                   [n] = {-3, -3}}
    for i, c in pairs(known) do x[i] = c[1] end
    local y = x:to("bf16")
    for i, c in pairs(known) do assert.are.equal(c[2], y[i], i) end
    local strided = kiln.stack({x, x}, 2):select(2, 1)
    assert.are.equal(2, strided:stride(1))
    assert.are.same(strided:to("bf16"):float():totable(), y:float():totable())
    assert.are.same(strided:to("f16"):float():totable(), x:to("f16"):float():totable())
    local back = kiln.stack({y, y}, 2):select(2, 2)
    assert.are.same(back:float():totable(), y:float():totable())
    assert.is_true(kiln.tensor{0 / 0}:to("bf16"):float():isnan():item())
    kiln.set_num_threads(prev)
  end)

  it("converts f32 to integers by truncation, and integers wrap into u8", function()
    assert.same({2, -2, 0}, kiln.tensor{2.7, -2.7, 0.3}:to("i64"):totable())
    assert.same({44, 255}, kiln.tensor({300, -1}, {dtype = "i64"}):to("u8"):totable())
    assert.same({false, true, true}, kiln.tensor{0, 0.5, -2}:to("bool"):totable())
  end)
end)

describe("free", function()
  it("makes every later use an error that says freed, and the next op works", function()
    local t = kiln.ones(4)
    local view = t:narrow(1, 2, 2)
    t:free()
    assert.is_true(t:is_freed())
    assert.is_true(view:is_freed())
    local line, e = here(), err(function() local r = t + 1 return r end)
    assert_contains(e, "freed")
    assert.equal(SRC .. ":" .. line .. ":", e:sub(1, #SRC + #tostring(line) + 2))
    assert_contains(err(function() local r = view:sum() return r end), "freed")
    assert_contains(err(function() local r = t[1] return r end), "freed")
    assert_contains(err(function() t[1] = 2 end), "freed")
    assert_contains(err(function() local r = t:totable() return r end), "freed")
    assert_contains(err(function() local r = t:clone() return r end), "freed")
    t:free()                                     -- twice is harmless
    assert.same({3, 3}, (kiln.ones(2) * 3):totable())
  end)
end)

describe("documented call forms", function()
  it("kiln.where with a number beside an integer tensor promotes a fraction to f32, as the binary ops", function()
    local r = kiln.where(kiln.tensor{true, false}, 0.5, kiln.tensor({1, 2}, {dtype = "i64"}))
    assert.equal("f32", r:dtype())
    assert.same({0.5, 2}, r:totable())
    local q = kiln.where(kiln.tensor{true, false}, 3, kiln.tensor({1, 2}, {dtype = "i64"}))
    assert.equal("i64", q:dtype())
    assert.same({3, 2}, q:totable())
    -- the same rule as the binary ops: a bool tensor with an integer gives i64, as 3 + a bool tensor
    local flags = kiln.tensor{true, false}
    assert.equal((flags + 3):dtype(), kiln.where(kiln.tensor{true, false}, 3, flags):dtype())
    assert.same({3, 0}, kiln.where(kiln.tensor{true, false}, 3, flags):totable())
  end)

  it("addmm takes beta and alpha as numbers or as options", function()
    local c, a = kiln.tensor{{1, 2}, {3, 4}}, kiln.tensor{{1, 0}, {0, 1}}
    assert.same({{2.5, 1}, {1.5, 4}}, c:addmm(a, a, 0.5, 2):totable())          -- 0.5 c + 2 I
    assert.same({{2.5, 1}, {1.5, 4}}, kiln.addmm(c, a, a, {beta = 0.5, alpha = 2}):totable())
    assert.same({{1.5, 2}, {3, 4.5}}, c:addmm(a, a, 1, 0.5):totable())           -- c + I / 2
  end)

  it("randperm(n) is 1..n in an order the seed fixes", function()
    kiln.manual_seed(3)
    local p = kiln.randperm(50)
    assert.equal("i64", p:dtype())
    local seen, moved = {}, 0
    for i, v in ipairs(p:totable()) do
      assert(v >= 1 and v <= 50 and not seen[v], "not a permutation: " .. tostring(v))
      seen[v] = true
      if v ~= i then moved = moved + 1 end
    end
    assert(moved > 40, "hardly shuffled: " .. moved .. " of 50 moved")
    kiln.manual_seed(3)
    assert.same(p:totable(), kiln.randperm(50):totable())
    assert.not_same(p:totable(), kiln.randperm(50):totable())              -- the generator moved on
    assert.equal("f64", kiln.randperm(4, {dtype = "f64"}):dtype())
    assert.equal(0, kiln.randperm(0):numel())
  end)

  it("kiln.device names a device; memory_stats and set_gc_threshold read cuda:N as cuda", function()
    assert.equal("cpu", kiln.device("cpu"))
    assert.equal("cuda:1", kiln.device("cuda:1"))
    assert.equal("cpu", kiln.device(kiln.ones(1)))
    assert.is_truthy(H.contains(H.error_of(kiln.device, "tpu"), "unknown device \"tpu\""))
    local big = kiln.empty(1000000)
    assert.equal(kiln.memory_stats("cuda").live_bytes, kiln.memory_stats("cuda:0").live_bytes)
    assert(kiln.memory_stats("cpu").live_bytes >= 4000000)
    assert.is_nil(kiln.memory_stats("cuda:0").cached_bytes)
    local before = kiln.memory_stats().threshold
    kiln.set_gc_threshold(123456789, "cuda:0")
    assert.equal(before, kiln.memory_stats().threshold)                     -- the cpu's is untouched
    assert.equal(123456789, kiln.memory_stats("cuda").threshold)
    kiln.set_gc_threshold(nil, "cuda")
    big:free()
  end)
end)

describe("copies of transposed views", function()
  -- contiguous() of views whose stride-1 dim is not the last goes through a tiled copy (and 8x8
  -- register blocks for 4-byte elements): every element where an index-by-index copy puts it
  it("match an element-by-element copy for every element size, edge tiles included", function()
    kiln.manual_seed(11)
    local cases = {
      {sizes = {70, 45}, perm = {2, 1}}, {sizes = {32, 32}, perm = {2, 1}}, {sizes = {3, 41, 66}, perm = {1, 3, 2}},
      {sizes = {40, 3, 35}, perm = {3, 2, 1}}, {sizes = {2, 36, 5, 33}, perm = {1, 4, 3, 2}}, {sizes = {8, 100}, perm = {2, 1}},
    }
    for _, dtype in ipairs{"f32", "i32", "f64", "i64", "f16", "u8"} do
      for _, c in ipairs(cases) do
        local base = (kiln.rand(c.sizes) * 100):to(dtype)
        local v = base:permute(unpack(c.perm))
        local got = v:contiguous()
        assert.is_true(got:is_contiguous())
        -- the reference: each element read through the view's own indexing
        local flat, vs = got:reshape(-1):totable(), v:size()
        local n, idx = #flat, {}
        for d = 1, #vs do idx[d] = 1 end
        for k = 1, n do
          local want = v[idx]
          if flat[k] ~= want then error(string.format("%s %s perm %s: element %d is %s, the view has %s", dtype,
            table.concat(c.sizes, "x"), table.concat(c.perm, ","), k, tostring(flat[k]), tostring(want))) end
          for d = #vs, 1, -1 do idx[d] = idx[d] + 1 if idx[d] <= vs[d] then break end idx[d] = 1 end
        end
      end
    end
  end)
end)
