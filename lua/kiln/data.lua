-- kiln.data: files to tensors (read_idx), datasets of tensors sharing their first dim, and
-- minibatches in a seeded order that never touches kiln's global generator.
--   local x, y = fashion_mnist.load{split = "train"}
--   for epoch = 1, 10 do
--     for i, xb, yb in data.batches({x, y}, {batch_size = 64, seed = 1, epoch = epoch}) do ... end
--   end
local core = require "kiln.core"
local Tensor = require "kiln.tensor"
local bit = require "bit"
local ffi, C = core.ffi, core.C
local wrap, raise, is_tensor = core.wrap, core.raise, core.is_tensor

local data = {}

local CPU = core.device("cpu")

-- ---- files ----

-- An IDX file (the MNIST format), plain or gzip-compressed: u8 stays u8, i8/i16/i32 become i32,
-- f32 and f64 stay. Any malformed, truncated or over-long file is an error naming it.
function data.read_idx(path)
  if type(path) ~= "string" then raise("read_idx: the path must be a string, got " .. type(path)) end
  return wrap(C.kiln_idx_read(path))
end

-- ---- datasets ----

local TensorDataset = {}
TensorDataset.__index = TensorDataset

-- TensorDataset(x, y, ...) or TensorDataset{x, y, ...}: sample i is (x[i], y[i], ...).
function data.TensorDataset(...)
  local tensors = {...}
  if select("#", ...) == 1 and type(tensors[1]) == "table" and not is_tensor(tensors[1]) then tensors = tensors[1] end
  if #tensors == 0 then raise("TensorDataset: expected at least one tensor") end
  local n
  for k, t in ipairs(tensors) do
    if not is_tensor(t) then raise(string.format("TensorDataset: argument %d is a %s, not a tensor", k, type(t))) end
    if t.p.ndim == 0 then raise(string.format("TensorDataset: tensor %d is 0-dim (samples run along dim 1)", k)) end
    local size = tonumber(t.p.sizes[0])
    if n == nil then n = size
    elseif size ~= n then
      raise(string.format("TensorDataset: tensor %d %s has %d samples, tensor 1 %s has %d (the first dims must agree)",
                          k, tostring(t:size()), size, tostring(tensors[1]:size()), n))
    end
  end
  return setmetatable({tensors = tensors, n = n}, TensorDataset)
end

function TensorDataset:len() return self.n end

-- Sample i (counting from 1; -1 is the last): one view per tensor, its first dim removed.
function TensorDataset:get(i)
  local t = self.tensors
  if #t == 1 then return t[1]:select(1, i) end
  if #t == 2 then return t[1]:select(1, i), t[2]:select(1, i) end
  local out = {}
  for k = 1, #t do out[k] = t[k]:select(1, i) end
  return unpack(out, 1, #t)
end

-- A list of tensors (nil when src is a dataset that only has len/get).
local function tensors_of(src, what)
  if is_tensor(src) then return {src} end
  if type(src) ~= "table" then raise(string.format("%s: expected a dataset, a tensor or a list of tensors, got %s", what, type(src))) end
  if getmetatable(src) == TensorDataset then return src.tensors end
  if type(src.tensors) == "table" then return data.TensorDataset(src.tensors).tensors end
  if is_tensor(src[1]) then return data.TensorDataset(src).tensors end
  if type(src.len) == "function" and type(src.get) == "function" then return nil end
  raise(what .. ": expected a dataset (tensors, or len and get), a tensor or a list of tensors")
end

-- ---- a seeded generator of its own ----

-- splitmix64 (Steele, Lea and Flood 2014) in 64-bit integer arithmetic: the same seed gives the same
-- sequence on every machine, and kiln's global generator is never touched.
local u64 = ffi.typeof("uint64_t")
local GOLDEN = 0x9E3779B97F4A7C15ULL
local M1, M2 = 0xBF58476D1CE4E5B9ULL, 0x94D049BB133111EBULL
local bxor, rshift = bit.bxor, bit.rshift
local TWO_M53 = 2 ^ -53

local function mix(z)
  z = bxor(z, rshift(z, 30)) * M1
  z = bxor(z, rshift(z, 27)) * M2
  return bxor(z, rshift(z, 31))
end

local function check_integer(v, what, name)
  if type(v) ~= "number" or v ~= math.floor(v) or v ~= v or math.abs(v) >= 2 ^ 63 then
    raise(string.format("%s: %s must be an integer, got %s", what, name, tostring(v)))
  end
end

local function seed_state(seed, epoch)
  local s = ffi.cast(u64, ffi.cast("int64_t", seed))
  -- Each epoch starts a stream of its own: (seed, epoch) is hashed, not added, so that
  -- seed 1 epoch 2 and seed 2 epoch 1 shuffle differently.
  return mix(s + GOLDEN) + mix(ffi.cast(u64, ffi.cast("int64_t", epoch)) * M1 + GOLDEN)
end

-- Fisher-Yates over n 0-based int64s at p, drawing from the stream of (seed, epoch).
local function shuffle(p, n, seed, epoch)
  local s = seed_state(seed, epoch)
  for i = n - 1, 1, -1 do
    s = s + GOLDEN
    local u = tonumber(rshift(mix(s), 11)) * TWO_M53      -- 53 random bits: u in [0, 1), exact
    local j = math.floor(u * (i + 1))
    p[i], p[j] = p[j], p[i]
  end
end

-- The order of an epoch as an i64 tensor of 0-based indices (what C's index_select takes).
local function order0(n, shuffled, seed, epoch)
  local perm = wrap(C.kiln_tensor_arange(0, n, 1, C.KILN_I64, CPU))
  if shuffled and n > 1 then shuffle(ffi.cast("int64_t *", perm.p.storage.data) + perm.p.offset, n, seed, epoch) end
  return perm
end

-- Calls without a seed draw one from kiln's initial seed and a counter: reproducible after
-- kiln.manual_seed, different on every call, and still without drawing from the global generator.
local unseeded_calls = 0
local function default_seed()
  unseeded_calls = unseeded_calls + 1
  return tonumber(C.kiln_initial_seed() % 2 ^ 52) + unseeded_calls * 1000003
end

-- permutation(n, {seed =, epoch =}): the shuffled order batches() uses, counting from 1.
function data.permutation(n, opts)
  opts = opts or {}
  check_integer(n, "permutation", "n")
  local seed = opts.seed
  if seed == nil then seed = default_seed() end
  check_integer(seed, "permutation", "seed")
  check_integer(opts.epoch or 0, "permutation", "epoch")
  local perm = order0(n, true, seed, opts.epoch or 0)
  return wrap(C.kiln_binary_scalar(C.KILN_OP_ADD, perm.p, 1, 0))
end

-- ---- minibatches ----

local function options(src_n, opts, what)
  opts = opts or {}
  local bs = opts.batch_size or 1
  check_integer(bs, what, "batch_size")
  if bs < 1 then raise(string.format("%s: batch_size must be positive, got %d", what, bs)) end
  local shuffled = opts.shuffle ~= false
  local seed = opts.seed
  if shuffled and seed == nil then seed = default_seed() end
  if seed ~= nil then check_integer(seed, what, "seed") end
  local epoch = opts.epoch or 0
  check_integer(epoch, what, "epoch")
  local count = opts.drop_last and math.floor(src_n / bs) or math.ceil(src_n / bs)
  return bs, shuffled, seed, epoch, count
end

local function length_of(src, tensors)
  if tensors then return tonumber(tensors[1].p.sizes[0]) end
  return src:len()
end

-- How many batches batches(src, opts) yields.
function data.num_batches(src, opts)
  local tensors = tensors_of(src, "num_batches")
  local _, _, _, _, count = options(length_of(src, tensors), opts, "num_batches")
  return count
end

-- for i, x, y in data.batches({x, y} or dataset or x, {batch_size = 64, shuffle = true, seed = 1,
--                                                      epoch = e, drop_last = false}) do ... end
-- i counts batches from 1. Each batch of a tensor dataset is one index_select per tensor; datasets
-- that only have len/get are stacked sample by sample. With shuffle (the default) the order is a
-- permutation drawn from (seed, epoch) by a generator of the iterator's own.
function data.batches(src, opts)
  local tensors = tensors_of(src, "batches")
  local n = length_of(src, tensors)
  local bs, shuffled, seed, epoch, count = options(n, opts, "batches")
  local perm = order0(n, shuffled, seed, epoch)
  local b = 0
  if tensors == nil then
    -- A dataset of samples: gather with get(i) and stack.
    local pp = ffi.cast("int64_t *", perm.p.storage.data) + perm.p.offset
    return function()
      if b >= count then return nil end
      b = b + 1
      local start = (b - 1) * bs
      local len = math.min(bs, n - start)
      local columns = {}
      for k = 0, len - 1 do
        local sample = {src:get(tonumber(pp[start + k]) + 1)}
        for c = 1, #sample do
          columns[c] = columns[c] or {}
          local v = sample[c]
          columns[c][k + 1] = is_tensor(v) and v or core.from_table(v)
        end
      end
      local out = {}
      for c = 1, #columns do out[c] = Tensor.stack(columns[c], 1) end
      return b, unpack(out, 1, #columns)
    end
  end
  local nt = #tensors
  local t1, t2, t3 = tensors[1], tensors[2], tensors[3]
  -- The index of a batch, on the device of each tensor (a copy only for tensors not on the CPU).
  local function gather(t, idx)
    if t.p.device.type ~= CPU.type then idx = wrap(C.kiln_to_device(idx.p, t.p.device)) end
    return wrap(C.kiln_index_select(t.p, 0, idx.p))
  end
  return function()
    if b >= count then return nil end
    b = b + 1
    local start = (b - 1) * bs
    local idx = wrap(C.kiln_narrow(perm.p, 0, start, math.min(bs, n - start)))
    if nt == 1 then return b, gather(t1, idx) end
    if nt == 2 then return b, gather(t1, idx), gather(t2, idx) end
    if nt == 3 then return b, gather(t1, idx), gather(t2, idx), gather(t3, idx) end
    local out = {}
    for k = 1, nt do out[k] = gather(tensors[k], idx) end
    return b, unpack(out, 1, nt)
  end
end

return data
