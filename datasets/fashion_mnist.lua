-- datasets.fashion_mnist: Zalando's Fashion-MNIST (70,000 28x28 grey images of 10 kinds of clothing)
-- from the Debian package dataset-fashion-mnist, as tensors. Labels count from 1 (1..10) like every
-- class label in kiln's Lua API, so that `logits:argmax(2) == labels` holds.
--   local fashion_mnist = require "datasets.fashion_mnist"
--   local train = fashion_mnist.load{split = "train"}
--   train.images  -- [60000,1,28,28] f32        train.labels  -- [60000] i64, 1..10
--   for i, x, y in kiln.data.batches(train, {batch_size = 64, seed = 1}) do ... end
local data = require "kiln.data"

local M = {}

M.root = "/usr/share/datasets/fashion-mnist"
M.classes = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"}
-- The mean and standard deviation of the training pixels scaled to [0, 1].
M.mean, M.std = 0.2860, 0.3530

local splits = {
  train = {images = "train-images-idx3-ubyte", labels = "train-labels-idx1-ubyte", n = 60000},
  test = {images = "t10k-images-idx3-ubyte", labels = "t10k-labels-idx1-ubyte", n = 10000},
}

local INSTALL = "install the Debian package dataset-fashion-mnist (sudo apt-get install dataset-fashion-mnist)"

local function readable(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- The file of a name under root: gzip-compressed as Debian ships it, or already uncompressed.
local function locate(root, name)
  for _, path in ipairs({root .. "/" .. name .. ".gz", root .. "/" .. name}) do
    if readable(path) then return path end
  end
  error(string.format("fashion_mnist: %s/%s.gz not found: %s", root, name, INSTALL), 3)
end

local function shape_string(t) return "[" .. table.concat(t:size(), ",") .. "]" end

-- load{split = "train" | "test", root = M.root, normalize = true, dtype = "f32"}: a TensorDataset of
-- (image, label) with the fields images [N,1,28,28] (pixels scaled to [0,1], then (x - 0.2860) / 0.3530
-- when normalize), labels [N] i64 counting from 1, classes (the 10 names) and split.
function M.load(opts)
  opts = opts or {}
  local split = opts.split or "train"
  local files = splits[split]
  if not files then error(string.format("fashion_mnist: unknown split %q (train or test)", tostring(split)), 2) end
  local root = opts.root or M.root
  local dtype = opts.dtype or "f32"
  if not ({f32 = true, f64 = true, f16 = true, bf16 = true})[dtype] then
    error(string.format("fashion_mnist: dtype %q is not a float dtype (f32, f64, f16, bf16)", tostring(dtype)), 2)
  end
  local images_path, labels_path = locate(root, files.images), locate(root, files.labels)
  local images = data.read_idx(images_path)
  local labels = data.read_idx(labels_path)
  local n = files.n
  local is = images:size()
  if images:dtype() ~= "u8" or #is ~= 3 or is[1] ~= n or is[2] ~= 28 or is[3] ~= 28 then
    error(string.format("fashion_mnist: %s holds %s %s (expected u8 [%d,28,28])", images_path, images:dtype(),
                        shape_string(images), n), 2)
  end
  if labels:dtype() ~= "u8" or labels:dim() ~= 1 or labels:size(1) ~= n then
    error(string.format("fashion_mnist: %s holds %s %s (expected u8 [%d])", labels_path, labels:dtype(),
                        shape_string(labels), n), 2)
  end
  local top = labels:max():item()
  if top > 9 then
    error(string.format("fashion_mnist: %s holds label %d (expected 0 to 9)", labels_path, top), 2)
  end
  -- f64 is computed in f64; f32, f16 and bf16 in f32.
  local work = dtype == "f64" and "f64" or "f32"
  local x = images:to(work):view(n, 1, 28, 28)
  x:div_(255)
  if opts.normalize ~= false then x:sub_(M.mean):div_(M.std) end
  if dtype ~= work then x = x:to(dtype) end
  local y = labels:to("i64"):add_(1)
  local ds = data.TensorDataset(x, y)
  ds.images, ds.labels, ds.classes, ds.split = x, y, M.classes, split
  return ds
end

M.INSTALL = INSTALL
return M
