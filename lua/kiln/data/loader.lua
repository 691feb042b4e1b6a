-- kiln.data.loader: the DataLoader, whose C worker threads decode, transform and collate batches
-- ahead of the training loop.
local core = require "kiln.core"
local Tensor = require "kiln.tensor"
local datasets = require "kiln.data.datasets"
local order = require "kiln.data.order"
local transforms = require "kiln.data.transforms"
local ffi, C = core.ffi, core.C
local wrap, raise, is_tensor = core.wrap, core.raise, core.is_tensor
local check_integer = core.integer_arg
local CPU = core.device("cpu")

local M = {}
local tensors_of, order0, default_seed = datasets.tensors_of, order.order0, order.default_seed
local pipeline = transforms.pipeline
local function flag(what, name, v, default) return core.flag(v, default, what, name) end

local DataLoader = {__name = "DataLoader"}   -- help(loader) finds data.DataLoader's line by it
local DataLoader_methods = {}
DataLoader.methods = DataLoader_methods       -- for ?loader:epoch
DataLoader_methods.__name = "DataLoader"
local method_of = core.class_index(DataLoader_methods)   -- loader:epcoh(1) names loader:epoch
DataLoader.__index = function(self, k)
  if k == "wait_seconds" then
    local c = rawget(self, "c")
    return (c and tonumber(C.kiln_loader_wait_seconds(c)) or 0) + rawget(self, "lua_wait")
  end
  return method_of(self, k)
end
core.indexed_classes[DataLoader.__index] = DataLoader_methods

-- for x, y in loader do ... end: one epoch, as PyTorch's `for x, y in loader`; each such loop is
-- the next epoch (0, 1, 2, ...), so a shuffled order changes from loop to loop as loader:epoch(e)'s
-- does. The generic for calls the loader for each batch with the batch before as its control
-- value: nil means a new loop (also after a break out of the last one).
local function loop_batch(self, ...)   -- the batch, or nil at the epoch's end (then forgotten)
  if ... == nil then rawset(self, "_loop", nil) end
  return ...
end
DataLoader.__call = function(self, _, control)
  local it = rawget(self, "_loop")
  if control == nil or not it then
    local e = rawget(self, "_loop_epoch") or 0
    rawset(self, "_loop_epoch", e + 1)
    it = self:epoch(e)
    rawset(self, "_loop", it)
  end
  return loop_batch(self, it())
end

-- The C dataset of src, the tensors' count and the label offset (1 for image folders), or nil for
-- a dataset that only has len/get.
local function c_dataset(src)
  if datasets.is_image_folder(src) then return src.c, 2, 1 end
  local tensors = tensors_of(src, "DataLoader")
  if tensors == nil then return nil end
  for k, t in ipairs(tensors) do
    if t.p.device.type ~= CPU.type then
      raise(string.format("DataLoader: tensor %d is on %s; the loader's workers read the cpu: keep the dataset there "
                          .. "and move each batch (x:to(device))", k, core.device_name(t.p.device)))
    end
  end
  if #tensors > C.KILN_LOADER_MAX_TENSORS then
    raise(string.format("DataLoader: %d tensors per sample (at most %d)", #tensors, C.KILN_LOADER_MAX_TENSORS))
  end
  local list = ffi.new("struct kiln_tensor *[?]", #tensors)
  for k, t in ipairs(tensors) do list[k - 1] = t.p end
  local c = C.kiln_dataset_tensors(#tensors, list)
  if c == nil then core.fail() end
  return ffi.gc(c, C.kiln_dataset_release), #tensors, nil
end

-- The device batches go to (nil: they stay on the cpu) and whether they are pinned, checked now:
-- pin_memory without a usable CUDA device is an error here, not a warning at the first batch.
local function placement(opts)
  local dev
  if opts.device ~= nil then dev = core.device(opts.device, "DataLoader") end
  local cuda = dev ~= nil and dev.type == C.KILN_CUDA
  local pin = opts.pin_memory
  if pin == nil then pin = cuda end
  if type(pin) ~= "boolean" then raise("DataLoader: pin_memory must be true or false, got " .. tostring(pin)) end
  if pin and C.kiln_cuda_is_available() == 0 then
    raise("DataLoader: pin_memory: " .. ffi.string(C.kiln_cuda_unavailable_reason()) ..
          " (pinned batches are for uploads to a CUDA device: leave pin_memory off on the cpu)")
  end
  if dev ~= nil and C.kiln_device_available(dev) == 0 then
    local why = cuda and C.kiln_cuda_unavailable_reason() or nil
    raise(string.format("DataLoader: device %s: %s", core.device_name(dev),
                        why ~= nil and ffi.string(why) or "no such device"))
  end
  if dev ~= nil and dev.type == C.KILN_CPU then dev = nil end
  return dev, pin
end

-- DataLoader{dataset =, batch_size = 1, shuffle = false, drop_last = false, workers = 0,
--            prefetch = max(2, 2 * workers), seed =, transform =, sampler =, device =, pin_memory =}
-- dataset: a TensorDataset (or tensors), an ImageFolder, or any table with len and get (collated
-- on the calling thread). Iterate with `for x, y in loader:epoch(e) do ... end` (or loader:iter(e)).
-- The order of epoch e depends only on (seed, e): M.batches' order for the same seed and epoch,
-- on every worker count. sampler(epoch, n) may return the order instead (indices from 1, a table or
-- an i64 tensor). transform (default: the dataset's) runs on each sample's image (the first tensor).
-- loader.wait_seconds: the time spent waiting in the iterator for batches, since the loader was made.
-- device = "cuda" (or "cuda:N"): each batch is uploaded there, in order, without waiting when it is
-- pinned. pin_memory (default: true when device is a CUDA device): the workers collate batches into
-- page-locked memory; it needs a CUDA device (an error at construction without one).
function M.DataLoader(opts)
  if type(opts) ~= "table" then raise("DataLoader: expected a table of options") end
  core.options(opts, core.set("dataset", "batch_size", "shuffle", "drop_last", "workers", "prefetch", "seed", "sampler",
                              "transform", "device", "pin_memory"), "DataLoader")
  local src = opts.dataset
  if src == nil then raise("DataLoader: dataset is missing") end
  local bs = opts.batch_size or 1
  check_integer(bs, "DataLoader", "batch_size")
  if bs < 1 then raise(string.format("DataLoader: batch_size must be positive, got %d", bs)) end
  local workers = opts.workers or 0
  check_integer(workers, "DataLoader", "workers")
  local prefetch = opts.prefetch or math.max(2, 2 * workers)
  check_integer(prefetch, "DataLoader", "prefetch")
  local seed = opts.seed
  if seed == nil then seed = default_seed() end
  check_integer(seed, "DataLoader", "seed")
  if opts.sampler ~= nil and type(opts.sampler) ~= "function" then
    raise("DataLoader: sampler must be a function(epoch, n) returning the order, got " .. type(opts.sampler))
  end
  local transform = opts.transform
  if transform == nil and type(src) == "table" and not datasets.is_tensor_dataset(src) then transform = rawget(src, "transform") end
  local tf = pipeline(transform, "DataLoader")
  local dev, pin = placement(opts)
  local self = setmetatable({dataset = src, batch_size = bs, shuffle = flag("DataLoader", "shuffle", opts.shuffle, false),
                             drop_last = flag("DataLoader", "drop_last", opts.drop_last, false),
                             workers = workers, prefetch = prefetch, seed = seed, sampler = opts.sampler, transform = transform,
                             lua_wait = 0, nbatches = nil, pin_memory = pin, device = dev and core.device_name(dev) or "cpu",
                             dev = dev}, DataLoader)
  local cd, ntensors, label_offset = c_dataset(src)
  if cd == nil then
    self.n = src:len()
    self.tf = tf
    return self
  end
  local c = C.kiln_loader_new(cd, bs, self.shuffle and 1 or 0, self.drop_last and 1 or 0, workers, prefetch, seed)
  if c == nil then core.fail() end
  self.c = ffi.gc(c, C.kiln_loader_free)
  self.cd, self.ntensors, self.label_offset = cd, ntensors, label_offset
  self.n = tonumber(C.kiln_dataset_len(cd))
  self.out = ffi.new("struct kiln_tensor *[?]", C.KILN_LOADER_MAX_TENSORS)
  if tf ~= nil then core.check(C.kiln_loader_set_transforms(c, tf)) end
  if pin then core.check(C.kiln_loader_set_pin_memory(c, 1)) end
  return self
end

-- A batch tensor where the loop wants it: uploaded to the loader's device (not waiting when pinned).
local function place(self, t)
  local dev = rawget(self, "dev")
  if dev == nil then return t end
  local g = core.wrap_retry(C.kiln_to_device_non_blocking, t.p, dev)
  -- Nobody else sees the host batch: its (pinned) block goes back to the cache now rather than at
  -- the next collection, and is reused once the upload has finished.
  C.kiln_tensor_free(t.p)
  return g
end

-- The sampler's order of epoch as 0-based int64s (and their count).
local function sampler_order(self, epoch)
  local order = self.sampler(epoch, self.n)
  local n, get
  if is_tensor(order) then
    if order:dim() ~= 1 then raise(string.format("DataLoader: the sampler returned a tensor %s (expected 1-dim indices)", tostring(order:size()))) end
    order = order:to("i64"):contiguous()
    n = order:numel()
    local p = ffi.cast("int64_t *", order.p.storage.data) + order.p.offset
    get = function(i) return p[i - 1] end
  elseif type(order) == "table" then
    n = #order
    get = function(i) return order[i] end
  else
    raise("DataLoader: the sampler must return a table or an i64 tensor of indices (from 1), got " .. type(order))
  end
  local a = ffi.new("int64_t[?]", n > 0 and n or 1)
  local len = self.n
  for i = 1, n do
    local v = get(i)
    local num = tonumber(v)
    if num == nil or num ~= math.floor(num) or num < 1 or num > len then
      raise(string.format("DataLoader: the sampler's entry %d is %s, out of range for a dataset of %d samples (indices count from 1)",
                          i, tostring(v), len))
    end
    a[i - 1] = num - 1
  end
  local _ = order   -- a tensor's data stay alive until here
  return a, n
end

-- Batches in an epoch (of the epoch last started when a sampler is set).
function DataLoader_methods:num_batches()
  if self.nbatches then return self.nbatches end
  local n = self.n
  return self.drop_last and math.floor(n / self.batch_size) or math.ceil(n / self.batch_size)
end

-- A dataset with len/get, collated here like M.batches does it.
local function lua_epoch(self, epoch, order, n, skip)
  local bs, src, tf = self.batch_size, self.dataset, self.tf
  local perm
  if order == nil then
    perm = order0(self.n, self.shuffle, self.seed, epoch)
    order = ffi.cast("int64_t *", perm.p.storage.data) + perm.p.offset
    n = self.n
  end
  local count = self.drop_last and math.floor(n / bs) or math.ceil(n / bs)
  self.nbatches = count
  local b = skip
  local clock = core.clock
  return function()
    if b >= count then return nil end
    local t0 = clock()
    local keep = perm   -- the order stays alive while the loop runs
    local start = b * bs
    b = b + 1
    local len = math.min(bs, n - start)
    local columns = {}
    for k = 0, len - 1 do
      local index = tonumber(order[start + k])
      local sample = {src:get(index + 1)}
      for c = 1, #sample do
        columns[c] = columns[c] or {}
        local v = sample[c]
        v = is_tensor(v) and v or core.from_table(v)
        if c == 1 and tf ~= nil then v = wrap(C.kiln_transforms_apply(tf, v.p, self.seed, epoch, index)) end
        columns[c][k + 1] = v
      end
    end
    local out = {}
    for c = 1, #columns do
      out[c] = Tensor.stack(columns[c], 1)
      if self.pin_memory then out[c] = wrap(C.kiln_tensor_pin_memory(out[c].p)) end
      out[c] = place(self, out[c])
    end
    self.lua_wait = self.lua_wait + (clock() - t0)
    local _ = keep
    return unpack(out, 1, #columns)
  end
end

-- for x, y in loader:epoch(e, {skip = 0}) do ... end: the batches of epoch e (default 0) in order,
-- the first skip of them left out (to resume within an epoch). Starting another epoch, or breaking
-- out of the loop and starting one, abandons the batches still in flight.
function DataLoader_methods:epoch(epoch, opts)
  epoch = epoch or 0
  check_integer(epoch, "DataLoader:epoch", "epoch")
  local skip = opts and opts.skip or 0
  check_integer(skip, "DataLoader:epoch", "skip")
  if rawget(self, "closed") then raise("DataLoader:epoch: the loader was closed") end
  local order, n
  if self.sampler then order, n = sampler_order(self, epoch) end
  if not self.c then return lua_epoch(self, epoch, order, n, skip) end
  local c, out, nt, offset = self.c, self.out, self.ntensors, self.label_offset
  core.check(C.kiln_loader_start_epoch_at(c, epoch, order, n or 0, skip))
  local _ = order   -- C copied the order
  self.nbatches = tonumber(C.kiln_loader_num_batches(c))
  local max = C.KILN_LOADER_MAX_TENSORS
  return function()
    local rc = C.kiln_loader_next_all(c, max, out)
    if rc ~= 0 then core.fail() end
    if out[0] == nil then return nil end
    local x = place(self, wrap(out[0]))
    if nt == 1 then return x end
    local y = wrap(out[1])
    if offset then y:add_(offset) end   -- on the cpu, before the upload
    y = place(self, y)
    if nt == 2 then return x, y end
    local rest = {}
    for k = 3, nt do rest[k - 2] = place(self, wrap(out[k - 1])) end
    return x, y, unpack(rest, 1, nt - 2)
  end
end
DataLoader_methods.iter = DataLoader_methods.epoch

-- Stops and joins the workers now (the loader cannot be used after).
function DataLoader_methods:close()
  local c = rawget(self, "c")
  if c then
    rawset(self, "lua_wait", self.wait_seconds)
    ffi.gc(c, nil)
    C.kiln_loader_free(c)
    rawset(self, "c", nil)
  end
  rawset(self, "closed", true)
end

return M
