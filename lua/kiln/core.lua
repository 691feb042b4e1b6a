-- kiln.core: what every part of the Lua library shares: the C library, error raising,
-- wrapping of returned tensors, and the conversions between Lua's 1-based and C's 0-based dims.
local ffi = require "ffi"
local cdef = require "kiln.cdef"
local C = cdef.lib

local M = {C = C, ffi = ffi}

-- Seconds on a monotonic clock (clock_gettime under a name of kiln's own, so that no other cdef clashes).
pcall(ffi.cdef, 'int kiln_core_clock_gettime(int clock, long *ts) __asm__("clock_gettime");')
local clock_ts = ffi.new("long[2]")
function M.clock()
  ffi.C.kiln_core_clock_gettime(1, clock_ts)   -- CLOCK_MONOTONIC
  return tonumber(clock_ts[0]) + tonumber(clock_ts[1]) * 1e-9
end

local cpu_stats = C.kiln_memory_stats(C.KILN_CPU)
local cuda_stats = C.kiln_memory_stats(C.KILN_CUDA)
-- A tensor in Lua is a struct kiln_ref holding the C pointer. A bare pointer would not do:
-- LuaJIT gives pointers built-in arithmetic and indexing (p + 1, p[2]) that metamethods cannot
-- override, and a tensor needs both.
local Ref = ffi.typeof("struct kiln_ref")
M.Ref = Ref
local finalize = C.kiln_ref_release

-- C counts dims and indices from 0; messages are rewritten to count from 1 as Lua does.
local raise
local function lua_message(msg)
  msg = msg:gsub("dim (%d+)", function(d) return "dim " .. (tonumber(d) + 1) end)
  msg = msg:gsub("index (%-?%d+) out of range", function(i) return "index " .. (tonumber(i) + 1) .. " out of range" end)
  msg = msg:gsub("start (%-?%d+), length", function(i) return "start " .. (tonumber(i) + 1) .. ", length" end)
  -- "sample 3 (from 0; a.png) of batch 1 (from 0)" -> "sample 4 (a.png) of batch 2"
  msg = msg:gsub("(%-?%d+) %(from 0; ", function(d) return tostring(tonumber(d) + 1) .. " (" end)
  msg = msg:gsub("(%-?%d+) %(from 0%)", function(d) return tostring(tonumber(d) + 1) end)
  msg = msg:gsub("%(C counts from 0%)", "(counting from 1)")
  msg = msg:gsub("; C counts from 0%)", "; counting from 1)")
  return msg
end
M.lua_message = lua_message

-- Errors point at the user's line: the first frame on the stack that is neither C nor a file of
-- this library (operators reach the library through metamethod frames of their own).
local library_prefix = debug.getinfo(1, "S").source:match("^(@.*/)[^/]*$") or "@lua/kiln/"

function M.raise(msg)
  local level = 2
  while true do
    local info = debug.getinfo(level, "S")
    if not info then level = 1 break end
    if info.what ~= "C" and info.source:sub(1, #library_prefix) ~= library_prefix then break end
    level = level + 1
  end
  error(msg, level)
end

raise = M.raise

local collectgarbage = collectgarbage
local collect

-- The CUDA device whose allocator ran out of memory in the last error ("... on cuda:N ..."), or nil.
local function cuda_oom_device()
  if C.kiln_error_code() ~= C.KILN_ERR_MEMORY then return nil end
  local m = ffi.string(C.kiln_error_message())
  if not m:find("out of memory", 1, true) then return nil end
  return tonumber(m:match("on cuda:(%d+)"))
end

local function mib(bytes) return string.format("%.1f MiB", tonumber(bytes) / 2 ^ 20) end

-- Out of device memory: free what Lua no longer holds (a full collection runs the finalizers of
-- unreachable tensors) and give the allocator's unused blocks back to the driver.
local oom_stats = ffi.new("struct kiln_cuda_memory")
local function relieve(device)
  collect()
  C.kiln_cuda_empty_cache()
  if C.kiln_cuda_memory_stats(device, oom_stats) ~= 0 then return "" end
  return string.format("; after collecting garbage and emptying the cache: %s in use, %s cached on cuda:%d",
                       mib(oom_stats.allocated), mib(oom_stats.reserved - oom_stats.allocated), device)
end

-- Raise the runtime's last error, its dims and indices counted from 1. Out of CUDA memory, the
-- garbage is collected and the cache emptied first, so that the process (the REPL) can go on.
function M.fail()
  local msg = ffi.string(C.kiln_error_message())
  local device = cuda_oom_device()
  if device then msg = msg .. relieve(device) end
  M.raise(lua_message(msg))
end

local fail = M.fail

-- The GC cannot see the memory behind a tensor's small cdata, so the runtime counts bytes and a
-- collection runs when enough were allocated since the last one. The CPU threshold follows the
-- Lua heap (a collection costs about its size): 8x the heap, at least 64 MB, unless set by hand.
-- (A full collection of kiln's own heap, 1.3 MB, takes about a millisecond: at 16 MB a char-LM
-- step that leaves 8 MB for the collector spent 0.65 ms a step collecting, at 64 MB 0.16 ms.)
M.gc_threshold_fixed = false
M.collections = 0   -- the collections kiln ran (kiln.memory_stats().collections)
function collect()
  M.collections = M.collections + 1
  C.kiln_memory_collected()
  collectgarbage("collect")
  if not M.gc_threshold_fixed then
    local heap = collectgarbage("count") * 1024
    C.kiln_memory_set_threshold(C.KILN_CPU, math.min(math.max(64 * 2 ^ 20, 8 * heap), 2 ^ 30))
  end
end
M.collect = collect

-- Take ownership of a tensor C returned; nil means the call failed.
function M.wrap(p)
  if p == nil then fail() end
  local r = ffi.gc(Ref(p), finalize)
  if cpu_stats.since_collect > cpu_stats.threshold or cuda_stats.since_collect > cuda_stats.threshold then collect() end
  return r
end

-- wrap(f(...)) for a call that may allocate device memory: when the CUDA caching allocator cannot
-- serve it even after giving its own cache back, Lua's garbage is collected (tensors nobody holds
-- any more), the cache emptied and the call made once more; then the error names the op, the
-- request and the memory in use and cached.
function M.wrap_retry(f, ...)
  local p = f(...)
  if p == nil then
    local device = cuda_oom_device()
    if device then
      relieve(device)
      p = f(...)
    end
  end
  return M.wrap(p)
end

-- A status: 0 is fine, anything else raises.
function M.check(status)
  if status ~= 0 then fail() end
end

function M.is_tensor(x) return ffi.istype(Ref, x) end

-- What a value is, for an error message: "a tensor", "the number 2.5", "a string", "nil".
function M.describe(x)
  if ffi.istype(Ref, x) then return "a tensor" end
  if type(x) == "number" or type(x) == "boolean" then return "the " .. type(x) .. " " .. tostring(x) end
  if x == nil then return "nil" end
  return "a " .. type(x)
end

-- x.p for an argument that must be a tensor; else an error naming the op and the argument.
function M.tensor_arg(x, what, name)
  if ffi.istype(Ref, x) then return x.p end
  M.raise(string.format("%s: %s must be a tensor, got %s", what, name, M.describe(x)))
end

-- The options table of a call (nil: none); else an error naming the op.
function M.opts_arg(opts, what)
  if opts == nil then return {} end
  if type(opts) == "table" and not ffi.istype(Ref, opts) then return opts end
  M.raise(string.format("%s: the options must be a table ({name = value, ...}), got %s", what, M.describe(opts)))
end

-- kiln.f(t, ...) for a method t:f(...): the same, after checking that t is a tensor.
function M.function_of_tensor(name, fn)
  return function(t, ...)
    if not M.is_tensor(t) then
      M.raise(string.format("kiln.%s: argument 1 must be a tensor, got %s", name, M.describe(t)))
    end
    return fn(t, ...)
  end
end

-- An integer argument name of op (an integer-valued number below 2^63), else an error naming both.
function M.integer_arg(v, op, name)
  if type(v) ~= "number" or v ~= math.floor(v) or v ~= v or math.abs(v) >= 2 ^ 63 then
    M.raise(string.format("%s: %s must be an integer, got %s", op, name, tostring(v)))
  end
end

-- A count (an integer >= 0, as integer_arg takes it) named name of op, else an error naming both.
function M.count_arg(v, op, name)
  M.integer_arg(v, op, name)
  if v < 0 then M.raise(string.format("%s: %s must be >= 0, got %s", op, name, tostring(v))) end
end

-- A true/false option of op (nil: the default); anything else is an error naming it.
function M.flag(v, default, op, name)
  if v == nil then return default end
  if type(v) ~= "boolean" then M.raise(string.format("%s: %s must be true or false, got %s", op, name, M.describe(v))) end
  return v
end

-- The options of a factory (kiln.zeros, kiln.randn, kiln.tensor, the *_like, ...): {dtype =,
-- device =, requires_grad =}; any other key is an error (a misspelt option must not be ignored).
local factory_keys = {dtype = true, device = true, requires_grad = true}
function M.factory_opts(opts, what) return M.options(opts, factory_keys, what) end

-- t, made a leaf that requires grad when the factory's options ask for it.
function M.factory_done(t, opts)
  if opts.requires_grad then M.check(C.kiln_requires_grad_(t.p, 1)) end
  return t
end

-- x for an argument that must be a number; else an error naming the op and the argument.
function M.number_arg(x, what, name)
  if type(x) == "number" then return x end
  M.raise(string.format("%s: %s must be a number, got %s", what, name, M.describe(x)))
end

-- A Lua dim (1-based, -1 is the last) to a C dim (0-based, negative counts from the end).
function M.cdim(t, d, what, extra)
  local n = t.p.ndim + (extra or 0)
  if type(d) ~= "number" or d ~= math.floor(d) then
    raise(string.format("%s: dim must be an integer, got %s", what or "kiln", tostring(d)))
  end
  if d == 0 or d > n or d < -n or (n == 0 and d ~= 1 and d ~= -1) then
    raise(string.format("%s: dim %d out of range for a tensor of %d dims (dims count from 1; -1 is the last)",
                        what or "kiln", d, t.p.ndim))
  end
  if d > 0 then return d - 1 end
  return d + n
end

-- dtypes by name and by number.
M.dtype_names = {}
for i = 0, C.KILN_DTYPE_COUNT - 1 do M.dtype_names[i] = ffi.string(C.kiln_dtype_name(i)) end

function M.dtype(name, what)
  if name == nil then return C.KILN_F32 end
  if type(name) == "number" then return name end
  local d = C.kiln_dtype_from_name(tostring(name))
  if d < 0 then raise(string.format("%s: unknown dtype %q (f32, f64, f16, bf16, i64, i32, u8, bool)", what or "kiln", tostring(name))) end
  return d
end

local devices = {}
function M.device(name, what)
  if name == nil then name = "cpu" end
  if ffi.istype("struct kiln_device", name) then return name end
  local d = devices[name]
  if d then return d end
  d = ffi.new("struct kiln_device")
  if C.kiln_device_parse(tostring(name), d) ~= 0 then fail() end
  devices[name] = d
  return d
end

function M.device_name(d) return ffi.string(C.kiln_device_name(d)) end

-- Size arguments: (2, 3), ({2, 3}) or (t:size()); a trailing table with string keys is options.
function M.sizes_and_options(...)
  local n = select("#", ...)
  local opts = nil
  local last = n > 0 and select(n, ...) or nil
  -- a trailing table without an array part is options ({} alone is the size of a 0-dim tensor)
  if n > 0 and type(last) == "table" and last[1] == nil and (n > 1 or next(last) ~= nil) then
    opts = last
    n = n - 1
  elseif n > 0 and last == nil then
    n = n - 1
  end
  local sizes = {}
  local first = ...
  if n == 1 and type(first) == "table" then
    for i = 1, #first do sizes[i] = first[i] end
  else
    for i = 1, n do sizes[i] = (select(i, ...)) end
  end
  for i = 1, #sizes do
    local s = sizes[i]
    if type(s) ~= "number" or s ~= math.floor(s) then
      raise(string.format("kiln: size %d is %s (expected an integer)", i, M.describe(s)))
    end
  end
  return sizes, opts or {}
end

-- A Lua list of numbers as an int64_t[]; keep the returned array alive across the call.
function M.int64_array(list)
  local n = #list
  local a = ffi.new("int64_t[?]", n > 0 and n or 1)
  for i = 1, n do a[i - 1] = list[i] end
  return a, n
end

-- A 1-d i64 tensor of the C indices (from 0) in list, on device dev (for the composites' gathers).
function M.index_tensor(list, dev)
  local n = #list
  local a = ffi.new("double[?]", n > 0 and n or 1)
  for i = 1, n do a[i - 1] = list[i] end
  local sizes = ffi.new("int64_t[1]", n)
  return M.wrap(C.kiln_tensor_from_f64(1, sizes, a, C.KILN_I64, dev))
end

-- A tensor from a number or nested Lua tables (booleans give bool unless a dtype is named).
function M.from_table(data, dtype, device)
  local sizes, flat = {}, {}
  local is_bool = false
  local leaf_depth = nil   -- the depth of numbers: the first one seen fixes it
  local function shape(x, d)
    if type(x) == "table" then
      if leaf_depth and d >= leaf_depth then
        raise(string.format("tensor: ragged nested table: a table where dim %d expects a number", leaf_depth - 1))
      end
      local n = #x
      if sizes[d] == nil then sizes[d] = n
      elseif sizes[d] ~= n then
        raise(string.format("tensor: ragged nested table: dim %d has %d and %d elements", d, sizes[d], n))
      end
      for i = 1, n do shape(x[i], d + 1) end
    else
      if sizes[d] ~= nil and d <= #sizes then
        raise(string.format("tensor: ragged nested table: a number where dim %d expects a table", d))
      end
      leaf_depth = leaf_depth or d
      if type(x) == "boolean" then is_bool = true; x = x and 1 or 0
      elseif type(x) ~= "number" then raise("tensor: expected numbers, got a " .. type(x)) end
      flat[#flat + 1] = x
    end
  end
  shape(data, 1)
  if dtype == nil and is_bool then dtype = "bool" end
  local dt = M.dtype(dtype, "tensor")
  local a, n = M.int64_array(sizes)
  local buf = ffi.new("double[?]", #flat > 0 and #flat or 1)
  for i = 1, #flat do buf[i - 1] = flat[i] end
  return M.wrap(C.kiln_tensor_from_f64(n, a, buf, dt, M.device(device)))
end

-- Options tables the library made and checked itself (a module's, at construction): the functions
-- it passes them to on every call skip the check, whose loop over the keys (pairs) LuaJIT cannot
-- compile, and which would keep a training step's loop from being compiled.
local trusted = setmetatable({}, {__mode = "k"})
function M.trust(opts) trusted[opts] = true return opts end

-- The edit distance of two short strings (insertions, deletions, substitutions, swaps of neighbours).
local function distance(a, b)
  local prev2, prev, cur = {}, {}, {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    cur = {[0] = i}
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      local d = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
      if i > 1 and j > 1 and a:byte(i) == b:byte(j - 1) and a:byte(i - 1) == b:byte(j) then d = math.min(d, prev2[j - 2] + 1) end
      cur[j] = d
    end
    prev2, prev = prev, cur
  end
  return prev[#b]
end

-- The candidate closest to word, when close enough to be a misspelling of it (nil otherwise):
-- an edit distance, ignoring case, of at most a third of the word's length (at least 1), and at
-- most limit when given. candidates: a list, or a set (names as keys).
function M.closest(word, candidates, limit)
  if type(word) ~= "string" then return nil end
  local most = math.max(1, math.floor(#word / 3))
  if limit then most = math.min(most, limit) end
  local best, best_d
  local function try(c)
    if type(c) ~= "string" or c == word then return end
    local d = distance(word:lower(), c:lower())
    if d <= most and (not best_d or d < best_d or (d == best_d and c < best)) then
      best, best_d = c, d
    end
  end
  if candidates[1] ~= nil then for _, c in ipairs(candidates) do try(c) end
  else for c in pairs(candidates) do try(c) end end
  return best
end

-- "; did you mean x?" for a misspelt word, else "".
function M.did_you_mean(word, candidates)
  local c = M.closest(word, candidates)
  return c and string.format("; did you mean %s?", c) or ""
end

-- ---- the objects of kiln's classes (modules, optimizers, schedulers, datasets, the DataLoader) ----

-- The __index functions class_index made, and the class each looks in: the REPL's completion and
-- help walk a class chain through them as through a table __index.
M.indexed_classes = setmetatable({}, {__mode = "k"})

-- The names of the methods (functions under keys not starting with "_") of class and of the tables
-- its metatables' __index chain names.
local function method_names(class)
  local names, t = {}, class
  for _ = 1, 16 do
    if type(t) ~= "table" then break end
    for k, v in next, t do
      if type(k) == "string" and k:sub(1, 1) ~= "_" and type(v) == "function" then names[k] = true end
    end
    local mt = getmetatable(t)
    local index = type(mt) == "table" and rawget(mt, "__index") or nil
    t = M.indexed_classes[index] or index
  end
  return names
end

-- The __index of the objects of class: what the class (and its chain) holds under k, else nil; but
-- a key that misspells a method of the chain (an edit distance of at most 2 and at most a third of
-- its length, or a case difference) raises "<name>: no method or field 'k'; did you mean 'm'?", so
-- that model:paramters() says what was meant while an absent field (if self.bias then) reads nil.
-- name: the class's __name when nil. Keys starting with "_" are never checked.
function M.class_index(class, name)
  local near_of = {}   -- key -> the method it misspells, or false (the methods rarely change)
  local function index(_, k)
    local v = class[k]
    if v ~= nil or type(k) ~= "string" then return v end
    local near = near_of[k]
    if near == nil then
      near = k:sub(1, 1) ~= "_" and M.closest(k, method_names(class), 2) or false
      near_of[k] = near
    end
    if near then
      M.raise(string.format("%s: no method or field '%s'; did you mean '%s'?", tostring(name or rawget(class, "__name")),
                            k, near))
    end
    return nil
  end
  M.indexed_classes[index] = class
  return index
end

-- A trailing options table of op: nil gives {}, a key outside known (a set) is an error naming
-- the known ones (and the one meant, for a misspelling).
function M.options(opts, known, op)
  if opts == nil then return {} end
  if trusted[opts] then return opts end
  M.opts_arg(opts, op)
  for k in pairs(opts) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      M.raise(string.format("%s: unknown option %q (known: %s)%s", op, tostring(k), table.concat(names, ", "),
                            M.did_you_mean(k, known)))
    end
  end
  return opts
end

-- set("a", "b") -> {a = true, b = true}
function M.set(...)
  local s = {}
  for _, k in ipairs{...} do s[k] = true end
  return s
end

return M
