-- kiln.data.batches: minibatches of tensors or datasets in a seeded order, in the loop's own thread.
local core = require "kiln.core"
local Tensor = require "kiln.tensor"
local datasets = require "kiln.data.datasets"
local order = require "kiln.data.order"
local ffi, C = core.ffi, core.C
local wrap, raise, is_tensor = core.wrap, core.raise, core.is_tensor
local check_integer = core.integer_arg
local CPU = core.device("cpu")

local M = {}
local tensors_of, order0, default_seed = datasets.tensors_of, order.order0, order.default_seed

local function flag(what, name, v, default) return core.flag(v, default, what, name) end

local function options(src_n, opts, what)
  opts = core.options(opts, core.set("batch_size", "shuffle", "seed", "epoch", "drop_last"), what)
  local bs = opts.batch_size or 1
  check_integer(bs, what, "batch_size")
  if bs < 1 then raise(string.format("%s: batch_size must be positive, got %d", what, bs)) end
  local shuffled = flag(what, "shuffle", opts.shuffle, true)
  local seed = opts.seed
  if shuffled and seed == nil then seed = default_seed() end
  if seed ~= nil then check_integer(seed, what, "seed") end
  local epoch = opts.epoch or 0
  check_integer(epoch, what, "epoch")
  local count = flag(what, "drop_last", opts.drop_last, false) and math.floor(src_n / bs) or math.ceil(src_n / bs)
  return bs, shuffled, seed, epoch, count
end

local function length_of(src, tensors)
  if tensors then return tonumber(tensors[1].p.sizes[0]) end
  return src:len()
end

-- How many batches batches(src, opts) yields.
function M.num_batches(src, opts)
  local tensors = tensors_of(src, "num_batches")
  local _, _, _, _, count = options(length_of(src, tensors), opts, "num_batches")
  return count
end

-- for i, x, y in M.batches({x, y} or dataset or x, {batch_size = 64, shuffle = true, seed = 1,
--                                                      epoch = e, drop_last = false}) do ... end
-- i counts batches from 1. Each batch of a tensor dataset is one index_select per tensor; datasets
-- that only have len/get are stacked sample by sample. With shuffle (the default) the order is a
-- permutation drawn from (seed, epoch) by a generator of the iterator's own.
function M.batches(src, opts)
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

return M
