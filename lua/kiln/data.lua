-- kiln.data: files to tensors (read_idx, read_image), datasets (tensors sharing their first dim,
-- image folders), minibatches in a seeded order that never touches kiln's global generator, and
-- the DataLoader, whose C worker threads decode, transform and collate batches ahead of the loop.
--   local x, y = fashion_mnist.load{split = "train"}
--   for epoch = 1, 10 do
--     for i, xb, yb in data.batches({x, y}, {batch_size = 64, seed = 1, epoch = epoch}) do ... end
--   end
--   local loader = data.DataLoader{dataset = data.TensorDataset(x, y), batch_size = 64, shuffle = true,
--                                  seed = 1, workers = 2}
--   for epoch = 1, 10 do for xb, yb in loader:epoch(epoch) do ... end end
local core = require "kiln.core"
local Tensor = require "kiln.tensor"
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

-- ---- a seeded order of its own ----

local function check_integer(v, what, name)
  if type(v) ~= "number" or v ~= math.floor(v) or v ~= v or math.abs(v) >= 2 ^ 63 then
    raise(string.format("%s: %s must be an integer, got %s", what, name, tostring(v)))
  end
end

-- Fisher-Yates over n 0-based int64s at p, drawn from a splitmix64 stream of (seed, epoch)
-- (C: kiln_permutation_fill, the one the C loader uses too). The same seed gives the same order
-- on every machine, and kiln's global generator is never touched.
local function shuffle(p, n, seed, epoch)
  core.check(C.kiln_permutation_fill(p, n, seed, epoch))
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
  opts = core.options(opts, core.set("seed", "epoch"), "permutation")
  check_integer(n, "permutation", "n")
  local seed = opts.seed
  if seed == nil then seed = default_seed() end
  check_integer(seed, "permutation", "seed")
  check_integer(opts.epoch or 0, "permutation", "epoch")
  local perm = order0(n, true, seed, opts.epoch or 0)
  return wrap(C.kiln_binary_scalar(C.KILN_OP_ADD, perm.p, 1, 0))
end

-- ---- minibatches ----

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

-- ---- transforms (run in C, per sample) ----

-- Each builder returns a transform; Compose{...} a list of them. The pipeline runs in C on each
-- sample as planar f32 [C,H,W] (images scaled to [0, 1] first, like torchvision's ToTensor):
--   local T = kiln.data.transforms
--   T.Compose{T.RandomCrop{32, padding = 4}, T.RandomHorizontalFlip(), T.Normalize{mean = {0.5}, std = {0.25}}}
-- A random transform draws from (seed, epoch, sample index, its position in the pipeline) only.
-- A transform is callable on one image: tf(img, {seed =, epoch =, index =}) (index from 1).
local transforms = {}
data.transforms = transforms

local Transform = {}
Transform.__index = Transform

local function transform(kind, fields)
  fields.kind = kind
  return setmetatable(fields, Transform)
end

local function is_transform(t) return getmetatable(t) == Transform end

-- size: n (n x n) or {h, w}.
local function two_sides(v, what)
  if type(v) == "number" then check_integer(v, what, "size") return v, v end
  if type(v) == "table" and #v == 2 then
    check_integer(v[1], what, "size[1]")
    check_integer(v[2], what, "size[2]")
    return v[1], v[2]
  end
  raise(string.format("%s: size must be a number or {height, width}, got %s", what, tostring(v)))
end

-- Resize(n): the shorter side becomes n (aspect kept); Resize{h, w}: exactly h x w. Bilinear.
function transforms.Resize(a)
  if type(a) == "number" then check_integer(a, "Resize", "size") return transform("resize", {h = a, w = 0}) end
  local size = type(a) == "table" and (a.size or (#a == 2 and a) or a[1]) or a
  if type(size) == "number" then return transform("resize", {h = size, w = 0}) end
  local h, w = two_sides(size, "Resize")
  return transform("resize", {h = h, w = w})
end

-- CenterCrop(n) or CenterCrop{h, w}.
function transforms.CenterCrop(a)
  local size = type(a) == "table" and (a.size or (#a == 1 and a[1]) or a) or a
  local h, w = two_sides(size, "CenterCrop")
  return transform("center_crop", {h = h, w = w})
end

-- RandomCrop(n, {padding =, fill =}) or RandomCrop{n or {h, w}, padding = 0, fill = 0}.
function transforms.RandomCrop(a, b)
  local size, o
  if type(a) == "table" then size, o = a.size or a[1], a
    if type(size) == "number" and type(a[2]) == "number" then size = {a[1], a[2]} end
  else size, o = a, b or {} end
  local h, w = two_sides(size, "RandomCrop")
  local padding = o.padding or 0
  check_integer(padding, "RandomCrop", "padding")
  return transform("random_crop", {h = h, w = w, padding = padding, fill = o.fill or 0})
end

local function probability(a, what)
  local p = type(a) == "table" and (a.p or a[1]) or a
  if p == nil then return 0.5 end
  if type(p) ~= "number" then raise(string.format("%s: p must be a number, got %s", what, tostring(p))) end
  return p
end

-- RandomHorizontalFlip(p = 0.5), RandomVerticalFlip(p = 0.5): mirror with probability p.
function transforms.RandomHorizontalFlip(a) return transform("hflip", {p = probability(a, "RandomHorizontalFlip")}) end
function transforms.RandomVerticalFlip(a) return transform("vflip", {p = probability(a, "RandomVerticalFlip")}) end

-- RandomAffine{degrees, translate = {fx, fy}, fill = 0}: a rotation uniform in [-degrees, degrees]
-- (counter-clockwise as displayed) and a shift of whole pixels up to fx * width, fy * height.
function transforms.RandomAffine(a, b)
  local o = type(a) == "table" and a or (b or {})
  local degrees = type(a) == "table" and (a.degrees or a[1]) or a
  if type(degrees) ~= "number" then raise("RandomAffine: degrees must be a number, got " .. tostring(degrees)) end
  local translate = o.translate or {0, 0}
  if type(translate) ~= "table" or type(translate[1]) ~= "number" or type(translate[2]) ~= "number" then
    raise("RandomAffine: translate must be {fx, fy} (fractions of the width and height)")
  end
  return transform("random_affine", {degrees = degrees, tx = translate[1], ty = translate[2], fill = o.fill or 0})
end

local function numbers(v, what, name)
  if type(v) == "number" then return {v} end
  if type(v) == "table" and #v > 0 then
    for i = 1, #v do
      if type(v[i]) ~= "number" then raise(string.format("%s: %s[%d] is %s (expected a number)", what, name, i, tostring(v[i]))) end
    end
    return v
  end
  raise(string.format("%s: %s must be a number or a list of numbers, got %s", what, name, tostring(v)))
end

-- Normalize{mean, std}: (x - mean[c]) / std[c]; one number, or one per channel.
function transforms.Normalize(a, b)
  local mean, std
  if type(a) == "table" and (a.mean ~= nil or a.std ~= nil) then mean, std = a.mean, a.std
  elseif type(a) == "table" and b == nil then mean, std = a[1], a[2]
  else mean, std = a, b end
  mean, std = numbers(mean, "Normalize", "mean"), numbers(std, "Normalize", "std")
  if #mean ~= #std then raise(string.format("Normalize: %d means and %d stds (expected as many)", #mean, #std)) end
  return transform("normalize", {mean = mean, std = std})
end

-- Compose{t1, t2, ...}: the transforms in order (nested Compose lists are flattened).
function transforms.Compose(list)
  if type(list) ~= "table" then raise("Compose: expected a list of transforms") end
  local items = {}
  for i, t in ipairs(list) do
    if not is_transform(t) then raise(string.format("Compose: entry %d is not a transform (%s)", i, type(t))) end
    if t.kind == "compose" then for _, u in ipairs(t.items) do items[#items + 1] = u end
    else items[#items + 1] = t end
  end
  return transform("compose", {items = items})
end

local adders = {
  resize = function(c, t) return C.kiln_transforms_resize(c, t.h, t.w) end,
  center_crop = function(c, t) return C.kiln_transforms_center_crop(c, t.h, t.w) end,
  random_crop = function(c, t) return C.kiln_transforms_random_crop(c, t.h, t.w, t.padding, t.fill) end,
  hflip = function(c, t) return C.kiln_transforms_hflip(c, t.p) end,
  vflip = function(c, t) return C.kiln_transforms_vflip(c, t.p) end,
  random_affine = function(c, t) return C.kiln_transforms_random_affine(c, t.degrees, t.tx, t.ty, t.fill) end,
  normalize = function(c, t)
    local n = #t.mean
    local m, s = ffi.new("double[?]", n), ffi.new("double[?]", n)
    for i = 1, n do m[i - 1], s[i - 1] = t.mean[i], t.std[i] end
    return C.kiln_transforms_normalize(c, n, m, s)
  end,
}

-- The C pipeline of a transform (built once and kept; nil for nil).
local function pipeline(t, what)
  if t == nil then return nil end
  if not is_transform(t) then raise(string.format("%s: transform must be built with kiln.data.transforms, got %s", what, type(t))) end
  if t._c then return t._c end
  local c = C.kiln_transforms_new()
  if c == nil then core.fail() end
  c = ffi.gc(c, C.kiln_transforms_free)
  for _, u in ipairs(t.kind == "compose" and t.items or {t}) do core.check(adders[u.kind](c, u)) end
  rawset(t, "_c", c)
  return c
end
data.transform_pipeline = pipeline

-- tf(image, {seed = 0, epoch = 0, index = 1}): the transform applied to one image [C,H,W] or [H,W],
-- as the loader would apply it to sample index: a new f32 [C,H,W] tensor.
function Transform.__call(t, image, opts)
  opts = opts or {}
  if not is_tensor(image) then raise("transform: expected an image tensor [C,H,W] or [H,W], got " .. type(image)) end
  local index = opts.index or 1
  check_integer(index, "transform", "index")
  return wrap(C.kiln_transforms_apply(pipeline(t, "transform"), image.p, opts.seed or 0, opts.epoch or 0, index - 1))
end

-- ---- image folders ----

-- One decoded image as a u8 tensor [C,H,W] (channels: 1 grey, 3 RGB (the default), 4 RGBA, 0 the file's).
function data.read_image(path, channels)
  if type(path) ~= "string" then raise("read_image: the path must be a string, got " .. type(path)) end
  if channels ~= nil then check_integer(channels, "read_image", "channels") end
  return wrap(C.kiln_image_read(path, channels or 3))
end

-- Writes a u8 image [C,H,W] or [H,W] as a PNG file.
function data.write_png(path, image)
  if type(path) ~= "string" then raise("write_png: the path must be a string, got " .. type(path)) end
  if not is_tensor(image) then raise("write_png: expected a u8 tensor [C,H,W] or [H,W], got " .. type(image)) end
  core.check(C.kiln_image_write_png(path, image.p))
end

local ImageFolder = {}
ImageFolder.__index = ImageFolder

-- ImageFolder(root, {channels = 3, transform =}): the images under root/<class>/ (sub-folders
-- included), classes sorted by name, files sorted by path. Sample i is (f32 [C,H,W] in [0, 1]
-- after the transform, label from 1). Fields: classes (names, classes[label]), class_to_idx, root.
function data.ImageFolder(root, opts)
  opts = core.opts_arg(opts, "ImageFolder")
  if type(root) ~= "string" then raise("ImageFolder: the root must be a string, got " .. type(root)) end
  local channels = opts.channels or 3
  check_integer(channels, "ImageFolder", "channels")
  local c = C.kiln_dataset_image_folder(root, channels)
  if c == nil then core.fail() end
  c = ffi.gc(c, C.kiln_dataset_release)
  if opts.transform ~= nil then pipeline(opts.transform, "ImageFolder") end
  local classes, class_to_idx = {}, {}
  for k = 1, C.kiln_dataset_num_classes(c) do
    classes[k] = ffi.string(C.kiln_dataset_class_name(c, k - 1))
    class_to_idx[classes[k]] = k
  end
  return setmetatable({c = c, root = root, channels = channels, transform = opts.transform, classes = classes,
                       class_to_idx = class_to_idx, n = tonumber(C.kiln_dataset_len(c))}, ImageFolder)
end

function ImageFolder:len() return self.n end

local function sample_index(self, i, what)
  check_integer(i, what, "index")
  local n = self.n
  if i < 0 then i = n + 1 + i end
  if i < 1 or i > n then raise(string.format("%s: index %d out of range for %d samples (counting from 1)", what, i, n)) end
  return i
end

-- The file and the label (from 1) of sample i.
function ImageFolder:file(i) return ffi.string(C.kiln_dataset_file(self.c, sample_index(self, i, "ImageFolder:file") - 1)) end
function ImageFolder:label(i) return tonumber(C.kiln_dataset_label(self.c, sample_index(self, i, "ImageFolder:label") - 1)) + 1 end

-- Sample i (from 1): image (through the transform, drawn as in {seed =, epoch =}, default 0) and label.
function ImageFolder:get(i, opts)
  opts = opts or {}
  i = sample_index(self, i, "ImageFolder:get")
  local out = ffi.new("struct kiln_tensor *[2]")
  local rc = C.kiln_dataset_get(self.c, i - 1, pipeline(self.transform, "ImageFolder"), opts.seed or 0, opts.epoch or 0, 2, out)
  local x = out[0] ~= nil and wrap(out[0]) or nil
  local y = out[1] ~= nil and wrap(out[1]) or nil
  core.check(rc)
  return x, y:add_(1)
end

-- ---- the loader ----

local DataLoader = {}
local DataLoader_methods = {}
DataLoader.__index = function(self, k)
  if k == "wait_seconds" then
    local c = rawget(self, "c")
    return (c and tonumber(C.kiln_loader_wait_seconds(c)) or 0) + rawget(self, "lua_wait")
  end
  return DataLoader_methods[k]
end

-- The C dataset of src, the tensors' count and the label offset (1 for image folders), or nil for
-- a dataset that only has len/get.
local function c_dataset(src)
  if getmetatable(src) == ImageFolder then return src.c, 2, 1 end
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
-- The order of epoch e depends only on (seed, e): data.batches' order for the same seed and epoch,
-- on every worker count. sampler(epoch, n) may return the order instead (indices from 1, a table or
-- an i64 tensor). transform (default: the dataset's) runs on each sample's image (the first tensor).
-- loader.wait_seconds: the time spent waiting in the iterator for batches, since the loader was made.
-- device = "cuda" (or "cuda:N"): each batch is uploaded there, in order, without waiting when it is
-- pinned. pin_memory (default: true when device is a CUDA device): the workers collate batches into
-- page-locked memory; it needs a CUDA device (an error at construction without one).
function data.DataLoader(opts)
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
  if transform == nil and type(src) == "table" and getmetatable(src) ~= TensorDataset then transform = rawget(src, "transform") end
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

-- A dataset with len/get, collated here like data.batches does it.
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

return data
