-- kiln.data.datasets: datasets: tensors sharing their first dim (TensorDataset) and image folders.
local core = require "kiln.core"
local transforms = require "kiln.data.transforms"
local ffi, C = core.ffi, core.C
local wrap, raise, is_tensor = core.wrap, core.raise, core.is_tensor
local check_integer = core.integer_arg
local CPU = core.device("cpu")

local M = {}

local TensorDataset = {}
TensorDataset.__index = core.class_index(TensorDataset)   -- ds:lenght() names ds:len()
TensorDataset.__name = "TensorDataset"   -- help(ds) and ?ds:get find data.TensorDataset's lines by it

-- TensorDataset(x, y, ...) or TensorDataset{x, y, ...}: sample i is (x[i], y[i], ...).
function M.TensorDataset(...)
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
  if type(src.tensors) == "table" then return M.TensorDataset(src.tensors).tensors end
  if is_tensor(src[1]) then return M.TensorDataset(src).tensors end
  if type(src.len) == "function" and type(src.get) == "function" then return nil end
  raise(what .. ": expected a dataset (tensors, or len and get), a tensor or a list of tensors")
end
M.tensors_of = tensors_of

local ImageFolder = {}
ImageFolder.__index = core.class_index(ImageFolder)
ImageFolder.__name = "ImageFolder"

-- ImageFolder(root, {channels = 3, transform =}): the images under root/<class>/ (sub-folders
-- included), classes sorted by name, files sorted by path. Sample i is (f32 [C,H,W] in [0, 1]
-- after the transform, label from 1). Fields: classes (names, classes[label]), class_to_idx, root.
function M.ImageFolder(root, opts)
  opts = core.opts_arg(opts, "ImageFolder")
  if type(root) ~= "string" then raise("ImageFolder: the root must be a string, got " .. type(root)) end
  local channels = opts.channels or 3
  check_integer(channels, "ImageFolder", "channels")
  local c = C.kiln_dataset_image_folder(root, channels)
  if c == nil then core.fail() end
  c = ffi.gc(c, C.kiln_dataset_release)
  if opts.transform ~= nil then transforms.pipeline(opts.transform, "ImageFolder") end
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
  local rc = C.kiln_dataset_get(self.c, i - 1, transforms.pipeline(self.transform, "ImageFolder"), opts.seed or 0, opts.epoch or 0, 2, out)
  local x = out[0] ~= nil and wrap(out[0]) or nil
  local y = out[1] ~= nil and wrap(out[1]) or nil
  core.check(rc)
  return x, y:add_(1)
end

-- Whether src is an ImageFolder.
function M.is_image_folder(src) return getmetatable(src) == ImageFolder end
function M.is_tensor_dataset(src) return getmetatable(src) == TensorDataset end

return M
