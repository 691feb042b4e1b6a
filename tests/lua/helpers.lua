-- Test helpers: naive references on nested Lua tables, written without kiln so that every
-- check compares kiln with something independent, and assertions that name the first
-- position where a tensor and its reference differ.
-- Dims count from 1 and -1 is the last, as in the kiln Lua API.
local ffi = require "ffi"

local M = {}

local function is_tensor(x) return type(x) == "cdata" and x.totable ~= nil end
M.is_tensor = is_tensor

-- ---- nested tables <-> (shape, flat list) ----

-- The shape of a nested table; a number (or boolean) has shape {}. An empty table stops the walk,
-- so pass shapes explicitly where a dim after an empty one matters.
function M.shape(x)
  local s = {}
  while type(x) == "table" do
    s[#s + 1] = #x
    x = x[1]
  end
  return s
end

function M.numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

function M.flatten(x)
  local flat = {}
  local function walk(y)
    if type(y) == "table" then for i = 1, #y do walk(y[i]) end else flat[#flat + 1] = y end
  end
  walk(x)
  return flat, M.shape(x)
end

-- Row-major flat list to nested tables of the given shape (a scalar for shape {}).
function M.unflatten(flat, shape)
  local pos = 0
  local function build(d)
    if d > #shape then pos = pos + 1 return flat[pos] end
    local r = {}
    for i = 1, shape[d] do r[i] = build(d + 1) end
    return r
  end
  return build(1)
end

-- Row-major strides of a shape (in elements).
local function strides_of(shape)
  local st, acc = {}, 1
  for d = #shape, 1, -1 do st[d] = acc acc = acc * shape[d] end
  return st
end

-- The multi-index (1-based) of flat position k (0-based).
local function unravel(k, shape)
  local idx = {}
  for d = #shape, 1, -1 do
    idx[d] = k % shape[d] + 1
    k = math.floor(k / shape[d])
  end
  return idx
end
M.unravel = unravel

local function norm_dim(d, n)
  if d < 0 then d = d + n + 1 end
  assert(d >= 1 and d <= n, "helpers: dim out of range")
  return d
end

-- ---- elementwise ----

function M.map(x, f)
  if type(x) ~= "table" then return f(x) end
  local r = {}
  for i = 1, #x do r[i] = M.map(x[i], f) end
  return r
end

-- NumPy broadcasting of two shapes; errors when they do not broadcast.
function M.broadcast_shapes(a, b)
  local n = math.max(#a, #b)
  local out = {}
  for i = 1, n do
    local sa = a[#a - n + i] or 1
    local sb = b[#b - n + i] or 1
    if sa ~= sb and sa ~= 1 and sb ~= 1 then error("helpers: shapes do not broadcast") end
    out[i] = sa == 1 and sb or sa
  end
  return out
end

-- Apply f to corresponding elements of any number of nested tables (or scalars), broadcast.
-- `shapes` (optional) gives the operands' shapes where an empty dim hides the later ones.
function M.zipn(f, args, shapes)
  local flats, ashapes = {}, {}
  local out_shape = {}
  for k, a in ipairs(args) do
    local flat, s = M.flatten(a)
    flats[k] = flat
    ashapes[k] = shapes and shapes[k] or s
    out_shape = M.broadcast_shapes(out_shape, ashapes[k])
  end
  local n = M.numel(out_shape)
  local st = {}
  for k, s in ipairs(ashapes) do
    -- Strides of operand k over the output's dims: 0 where it is broadcast.
    local own = strides_of(s)
    st[k] = {}
    local lead = #out_shape - #s
    for d = 1, #out_shape do
      local sd = s[d - lead]
      st[k][d] = (d <= lead or sd == 1) and 0 or own[d - lead]
    end
  end
  local out = {}
  local vals = {}
  for i = 0, n - 1 do
    local idx = unravel(i, out_shape)
    for k = 1, #args do
      local off = 0
      for d = 1, #out_shape do off = off + (idx[d] - 1) * st[k][d] end
      vals[k] = flats[k][off + 1]
    end
    out[i + 1] = f(unpack(vals, 1, #args))
  end
  return M.unflatten(out, out_shape)
end

function M.zip(a, b, f) return M.zipn(f, {a, b}) end

-- ---- shape changes ----

-- Permute dims: result dim i is input dim perm[i].
function M.permute(x, perm)
  local flat, shape = M.flatten(x)
  local st = strides_of(shape)
  local out_shape = {}
  for i, p in ipairs(perm) do out_shape[i] = shape[p] end
  local out = {}
  for k = 0, M.numel(out_shape) - 1 do
    local idx = unravel(k, out_shape)
    local off = 0
    for i, p in ipairs(perm) do off = off + (idx[i] - 1) * st[p] end
    out[k + 1] = flat[off + 1]
  end
  return M.unflatten(out, out_shape)
end

function M.transpose(x, d0, d1)
  local n = #M.shape(x)
  d0, d1 = norm_dim(d0 or 1, n), norm_dim(d1 or 2, n)
  local perm = {}
  for i = 1, n do perm[i] = i end
  perm[d0], perm[d1] = perm[d1], perm[d0]
  return M.permute(x, perm)
end

-- ---- reductions ----

-- Reduce dim `dim` of x with f(list of values along the dim, positions) -> value.
-- keepdim keeps the reduced dim with size 1.
function M.reduce_dim(x, dim, f, keepdim)
  local flat, shape = M.flatten(x)
  dim = norm_dim(dim, #shape)
  local st = strides_of(shape)
  local out_shape = {}
  for d = 1, #shape do
    if d ~= dim then out_shape[#out_shape + 1] = shape[d]
    elseif keepdim then out_shape[#out_shape + 1] = 1 end
  end
  local kept = {}
  for d = 1, #shape do if d ~= dim then kept[#kept + 1] = d end end
  local kept_shape = {}
  for i, d in ipairs(kept) do kept_shape[i] = shape[d] end
  local out = {}
  for k = 0, M.numel(kept_shape) - 1 do
    local idx = unravel(k, kept_shape)
    local base = 0
    for i, d in ipairs(kept) do base = base + (idx[i] - 1) * st[d] end
    local vals = {}
    for j = 1, shape[dim] do vals[j] = flat[base + (j - 1) * st[dim] + 1] end
    out[k + 1] = f(vals)
  end
  return M.unflatten(out, out_shape)
end

-- Reduce over several dims (a list) or all dims (nil): f gets every value in row-major order.
function M.reduce_dims(x, dims, f, keepdim)
  local flat, shape = M.flatten(x)
  local set = {}
  if dims == nil then for d = 1, #shape do set[d] = true end
  else for _, d in ipairs(type(dims) == "table" and dims or {dims}) do set[norm_dim(d, #shape)] = true end end
  local kept, out_shape = {}, {}
  for d = 1, #shape do
    if not set[d] then kept[#kept + 1] = d out_shape[#out_shape + 1] = shape[d]
    elseif keepdim then out_shape[#out_shape + 1] = 1 end
  end
  local groups, order = {}, {}
  for k = 0, #flat - 1 do
    local idx = unravel(k, shape)
    local key = 0
    local kst = 1
    for i = #kept, 1, -1 do key = key + (idx[kept[i]] - 1) * kst kst = kst * shape[kept[i]] end
    if not groups[key] then groups[key] = {} order[#order + 1] = key end
    local g = groups[key]
    g[#g + 1] = flat[k + 1]
  end
  local out = {}
  for k = 0, M.numel(out_shape) - 1 do out[k + 1] = f(groups[k] or {}) end
  if #out_shape == 0 then return out[1] end
  return M.unflatten(out, out_shape)
end

local function lsum(v) local s = 0 for _, x in ipairs(v) do s = s + x end return s end
local function lprod(v) local s = 1 for _, x in ipairs(v) do s = s * x end return s end
local function lmean(v) return lsum(v) / #v end
-- The largest value and its 1-based position (the first one on ties, NaN wins).
local function lmax(v)
  local best, bi = v[1], 1
  for i = 2, #v do
    if best ~= best then break end
    if v[i] ~= v[i] or v[i] > best then best, bi = v[i], i end
  end
  return best, bi
end
local function lmin(v)
  local best, bi = v[1], 1
  for i = 2, #v do
    if best ~= best then break end
    if v[i] ~= v[i] or v[i] < best then best, bi = v[i], i end
  end
  return best, bi
end
local function lvar(v, correction)
  local m = lmean(v)
  local q = 0
  for _, x in ipairs(v) do q = q + (x - m) ^ 2 end
  return q / (#v - (correction or 1))
end
M.list = {sum = lsum, prod = lprod, mean = lmean, max = lmax, min = lmin, var = lvar}

function M.sum(x, dims, keepdim) return M.reduce_dims(x, dims, lsum, keepdim) end
function M.prod(x, dims, keepdim) return M.reduce_dims(x, dims, lprod, keepdim) end
function M.mean(x, dims, keepdim) return M.reduce_dims(x, dims, lmean, keepdim) end
function M.max(x, dim, keepdim)
  if dim == nil then return (M.reduce_dims(x, nil, function(v) return (lmax(v)) end)) end
  return M.reduce_dim(x, dim, function(v) return (lmax(v)) end, keepdim),
         M.reduce_dim(x, dim, function(v) return select(2, lmax(v)) end, keepdim)
end
function M.min(x, dim, keepdim)
  if dim == nil then return (M.reduce_dims(x, nil, function(v) return (lmin(v)) end)) end
  return M.reduce_dim(x, dim, function(v) return (lmin(v)) end, keepdim),
         M.reduce_dim(x, dim, function(v) return select(2, lmin(v)) end, keepdim)
end
-- 1-based positions; without a dim, the position in the flattened tensor.
function M.argmax(x, dim, keepdim)
  if dim == nil then return (select(2, lmax((M.flatten(x))))) end
  return M.reduce_dim(x, dim, function(v) return select(2, lmax(v)) end, keepdim)
end
function M.argmin(x, dim, keepdim)
  if dim == nil then return (select(2, lmin((M.flatten(x))))) end
  return M.reduce_dim(x, dim, function(v) return select(2, lmin(v)) end, keepdim)
end
function M.var(x, dims, keepdim, correction)
  return M.reduce_dims(x, dims, function(v) return lvar(v, correction) end, keepdim)
end
function M.std(x, dims, keepdim, correction)
  return M.reduce_dims(x, dims, function(v) return math.sqrt(lvar(v, correction)) end, keepdim)
end
function M.norm(x, p, dims, keepdim)
  p = p or 2
  return M.reduce_dims(x, dims, function(v)
    if p == math.huge then local m = 0 for _, a in ipairs(v) do m = math.max(m, math.abs(a)) end return m end
    if p == -math.huge then local m = math.huge for _, a in ipairs(v) do m = math.min(m, math.abs(a)) end return m end
    local s = 0
    for _, a in ipairs(v) do s = s + math.abs(a) ^ p end
    return s ^ (1 / p)
  end, keepdim)
end
function M.logsumexp(x, dims, keepdim)
  return M.reduce_dims(x, dims, function(v)
    local m = -math.huge
    for _, a in ipairs(v) do m = math.max(m, a) end
    local s = 0
    for _, a in ipairs(v) do s = s + math.exp(a - m) end
    return m + math.log(s)
  end, keepdim)
end

-- ---- linear algebra ----

-- a [n,k] @ b [k,m], a triple loop.
function M.matmul(a, b)
  local n, k, m = #a, #b, #b[1]
  assert(#a[1] == k, "helpers.matmul: inner sizes differ")
  local c = {}
  for i = 1, n do
    c[i] = {}
    for j = 1, m do
      local s = 0
      for p = 1, k do s = s + a[i][p] * b[p][j] end
      c[i][j] = s
    end
  end
  return c
end

-- Batched: a [B,n,k] @ b [B,k,m].
function M.bmm(a, b)
  local c = {}
  for i = 1, #a do c[i] = M.matmul(a[i], b[i]) end
  return c
end

-- ---- number formats ----

-- x rounded to a float format with `mant` mantissa bits (stored, excluding the implicit one) and
-- minimum normal exponent `emin`, to nearest, ties to even; overflow past `maxval` gives inf.
local function round_float(x, mant, emin, maxval)
  if x ~= x or x == 0 or x == math.huge or x == -math.huge then return x end
  local a = math.abs(x)
  local _, e = math.frexp(a)      -- a = f * 2^e, f in [0.5, 1)
  e = math.max(e - 1, emin)       -- a = 1.xxx * 2^e for normals
  local ulp = 2 ^ (e - mant)
  local q = a / ulp
  local r = math.floor(q)
  local frac = q - r
  if frac > 0.5 or (frac == 0.5 and r % 2 == 1) then r = r + 1 end
  local v = r * ulp
  if v > maxval then v = math.huge end
  return x < 0 and -v or v
end

-- The value of x once stored in dtype (integers truncate toward zero, as C casts do).
function M.round_to(x, dtype)
  if type(x) == "boolean" then x = x and 1 or 0 end
  if dtype == "f64" then return x end
  if dtype == "f32" then return tonumber(ffi.new("float", x)) end
  if dtype == "f16" then return round_float(x, 10, -14, 65504) end
  if dtype == "bf16" then return round_float(x, 7, -126, 3.3895313892515355e38) end
  if dtype == "bool" then return x ~= 0 end
  local t = x >= 0 and math.floor(x) or math.ceil(x)
  if dtype == "u8" then return t % 256 end
  return t
end

-- A relative tolerance fit for a dtype's precision.
M.tol = {f64 = 1e-12, f32 = 1e-5, f16 = 2e-3, bf16 = 1.6e-2, i64 = 0, i32 = 0, u8 = 0, bool = 0}

-- ---- comparison ----

local function fmt_index(idx)
  return "[" .. table.concat(idx, ",") .. "]"
end

local function close(a, e, tol)
  if type(a) == "boolean" or type(e) == "boolean" then return a == e end
  if type(a) ~= "number" or type(e) ~= "number" then return false end
  if e ~= e then return a ~= a end
  if a == e then return true end
  if e == math.huge or e == -math.huge then return false end
  return math.abs(a - e) <= tol * (1 + math.abs(e))
end

-- Compares actual (a tensor or nested table) with expected; returns true, or false and a message
-- naming the first differing position. tol is relative (plus the same absolute); 0 means exact.
function M.compare(actual, expected, tol)
  tol = tol or 0
  local got = is_tensor(actual) and actual:totable() or actual
  local function walk(a, e, idx)
    if type(e) == "table" then
      if type(a) ~= "table" then
        return false, string.format("at %s: got a %s (%s), expected a table of %d", fmt_index(idx), type(a), tostring(a), #e)
      end
      if #a ~= #e then
        return false, string.format("at %s: got %d elements, expected %d", fmt_index(idx), #a, #e)
      end
      for i = 1, #e do
        idx[#idx + 1] = i
        local ok, msg = walk(a[i], e[i], idx)
        if not ok then return false, msg end
        idx[#idx] = nil
      end
      return true
    end
    if not close(a, e, tol) then
      return false, string.format("at %s: got %s, expected %s (tolerance %g)", fmt_index(idx),
                                  type(a) == "number" and string.format("%.17g", a) or tostring(a),
                                  type(e) == "number" and string.format("%.17g", e) or tostring(e), tol)
    end
    return true
  end
  return walk(got, expected, {})
end

-- Raises (at the caller's line) unless t matches the nested table within tol.
function M.assert_close(t, expected, tol)
  local ok, msg = M.compare(t, expected, tol)
  if not ok then error("assert_close: " .. msg, 2) end
end

-- assert.tensor_near(t, expected_table, tol)
local luassert_ok, luassert = pcall(require, "luassert")
local say_ok, say = pcall(require, "say")
if luassert_ok and say_ok then
  say:set("assertion.tensor_near.positive", "Expected the tensor to match the reference: %s")
  say:set("assertion.tensor_near.negative", "Expected the tensor not to match the reference: %s")
  luassert:register("assertion", "tensor_near", function(state, args)
    local ok, msg = M.compare(args[1], args[2], args[3])
    state.failure_message = (ok and "they match" or msg)
    return ok
  end, "assertion.tensor_near.positive", "assertion.tensor_near.negative")
end

-- ---- errors ----

-- Calls fn, which must raise; returns the message (a string).
function M.error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected an error, the call succeeded")
  return tostring(err)
end

-- True for a message from inside Lua or the FFI ("attempt to index a nil value", "bad argument #2
-- to 'format'", "cannot convert ...") or C's NULL guard, where kiln should have named the op and
-- the argument.
local internal = {"attempt to", "bad argument", "cannot convert", "stack overflow", "(NULL)"}
function M.lua_internal(msg)
  for _, pat in ipairs(internal) do
    if msg:find(pat, 1, true) then return true end
  end
  return false
end

-- Plain-text find (no patterns).
function M.contains(s, part) return s:find(part, 1, true) ~= nil end

-- Nested table of random numbers (or of f(i) over the row-major position) of a shape.
function M.filled(shape, f)
  local flat = {}
  for i = 1, M.numel(shape) do flat[i] = f(i) end
  return M.unflatten(flat, shape)
end

-- A deterministic pseudo-random sequence independent of kiln's generator.
function M.lcg(seed)
  local s = seed or 12345
  return function()
    s = (s * 1103515245 + 12345) % 2147483648
    return s / 2147483648
  end
end

-- ---- child processes ----

-- The running kiln launcher (to start child processes with), or nil when the specs run elsewhere.
function M.kiln_exe()
  local ffi = require "ffi"
  pcall(ffi.cdef, "long kiln_spec_readlink(const char *path, char *buf, unsigned long size) __asm__(\"readlink\");")
  local buf = ffi.new("char[4096]")
  local n = ffi.C.kiln_spec_readlink("/proc/self/exe", buf, 4096)
  if n <= 0 then return nil end
  local exe = ffi.string(buf, n)
  return exe:match("/kiln$") and exe or nil
end

-- Run the Lua source script under the kiln launcher exe once per environment prefix of envs
-- (for example "KILN_CPU_LEVEL=avx2"), each child writing its tensors to the path arg[1] with
-- kiln.save; the tables kiln.load reads back, in envs' order. A child that fails fails the spec
-- with its output.
function M.children_outputs(exe, script, envs)
  local kiln = require "kiln"
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write(script)
  f:close()
  local outs = {}
  for k, env in ipairs(envs) do
    local out = os.tmpname() .. ".safetensors"
    local log, ok = M.capture(string.format("%s %s %s %s", env, exe, path, out))
    if not ok then os.remove(path) error("child " .. env .. " failed:\n" .. log, 2) end
    outs[k] = kiln.load(out)
    os.remove(out)
  end
  os.remove(path)
  return outs
end

-- ---- values PyTorch computed (tests/fixtures/, written by tools/torch_fixtures.py) ----

local FIXTURES = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "../fixtures/"
function M.fixture_path(name) return FIXTURES .. name end

-- The tensors of tests/fixtures/NAME (kiln.load), and the device the fixture specs run on:
-- $KILN_FIXTURE_DEVICE (default cpu); without that device, nil and why.
function M.torch_fixture(name)
  local kiln = require "kiln"
  local dev = os.getenv("KILN_FIXTURE_DEVICE") or "cpu"
  if dev ~= "cpu" and not kiln.cuda.is_available() then return nil, dev .. ": " .. tostring(kiln.cuda.unavailable_reason()) end
  return kiln.load(M.fixture_path(name)), dev
end

-- The output (stdout and stderr) of a shell command and whether it exited with 0 (LuaJIT's popen
-- close does not tell).
function M.capture(cmd)
  local p = assert(io.popen(cmd .. " 2>&1; echo \"exit status $?\""))
  local out = p:read("*a")
  p:close()
  local body, status = out:match("^(.*)exit status (%d+)\n$")
  return body or out, status == "0"
end

-- erf by its Taylor series near 0 (accurate to ~1e-13 for |x| <= 2.5), and beyond by the
-- continued fraction of erfc.
function M.erf(x)
  if math.abs(x) > 2.5 then
    local a = math.abs(x)
    local t = a
    for k = 60, 1, -1 do t = a + (k / 2) / t end
    local erfc = math.exp(-a * a) / math.sqrt(math.pi) / t
    return x > 0 and 1 - erfc or erfc - 1
  end
  local sum, term, n = 0, x, 0
  while n < 80 do
    sum = sum + term / (2 * n + 1)
    n = n + 1
    term = -term * x * x / n
  end
  return 2 / math.sqrt(math.pi) * sum
end

return M
