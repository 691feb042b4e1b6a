-- kiln.data.transforms: image transforms, run in C on each sample by the DataLoader and ImageFolder.
local core = require "kiln.core"
local ffi, C = core.ffi, core.C
local wrap, raise, is_tensor = core.wrap, core.raise, core.is_tensor
local check_integer = core.integer_arg
local CPU = core.device("cpu")

local M = {}

-- Each builder returns a transform; Compose{...} a list of them. The pipeline runs in C on each
-- sample as planar f32 [C,H,W] (images scaled to [0, 1] first, like torchvision's ToTensor):
--   local T = kiln.M.transforms
--   T.Compose{T.RandomCrop{32, padding = 4}, T.RandomHorizontalFlip(), T.Normalize{mean = {0.5}, std = {0.25}}}
-- A random transform draws from (seed, epoch, sample index, its position in the pipeline) only.
-- A transform is callable on one image: tf(img, {seed =, epoch =, index =}) (index from 1).
local transforms = M

local Transform = {}
Transform.__index = Transform

local function transform(kind, fields)
  fields.kind = kind
  return setmetatable(fields, Transform)
end

local function is_transform(t) return getmetatable(t) == Transform end

-- The named fields of a transform's table must be known ones (its positional entries are not
-- checked here): a misspelt option is an error, never ignored.
local function known_fields(o, what, ...)
  if type(o) ~= "table" then return end
  local known = {}
  for _, k in ipairs{...} do known[k] = true end
  for k in pairs(o) do
    if type(k) ~= "number" and not known[k] then
      local names = {...}
      table.sort(names)
      raise(string.format("%s: unknown option %q (known: %s)%s", what, tostring(k), table.concat(names, ", "),
                          core.did_you_mean(k, known)))
    end
  end
end

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
  known_fields(o, "RandomCrop", "size", "padding", "fill")
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
  known_fields(o, "RandomAffine", "degrees", "translate", "fill")
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
  if type(a) == "table" and not (type(a[1]) == "number" and b ~= nil) then known_fields(a, "Normalize", "mean", "std") end
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
  if not is_transform(t) then raise(string.format("%s: transform must be built with kiln.M.transforms, got %s", what, type(t))) end
  if t._c then return t._c end
  local c = C.kiln_transforms_new()
  if c == nil then core.fail() end
  c = ffi.gc(c, C.kiln_transforms_free)
  for _, u in ipairs(t.kind == "compose" and t.items or {t}) do core.check(adders[u.kind](c, u)) end
  rawset(t, "_c", c)
  return c
end
M.pipeline = pipeline   -- kiln.M.transform_pipeline

-- tf(image, {seed = 0, epoch = 0, index = 1}): the transform applied to one image [C,H,W] or [H,W],
-- as the loader would apply it to sample index: a new f32 [C,H,W] tensor.
function Transform.__call(t, image, opts)
  opts = opts or {}
  if not is_tensor(image) then raise("transform: expected an image tensor [C,H,W] or [H,W], got " .. type(image)) end
  local index = opts.index or 1
  check_integer(index, "transform", "index")
  return wrap(C.kiln_transforms_apply(pipeline(t, "transform"), image.p, opts.seed or 0, opts.epoch or 0, index - 1))
end

return M
