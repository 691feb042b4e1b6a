-- kiln.io: tensors to and from safetensors files (the format of Hugging Face and PyTorch).
--   kiln.save("model.safetensors", model:state_dict(), {epoch = "3"})
--   local tensors, metadata = kiln.load("model.safetensors")
-- Writing is crash-safe (a temporary file, flushed and renamed over the target); reading checks the
-- whole header against the file first, and maps the data instead of copying them.
local core = require "kiln.core"
local ffi, C = core.ffi, core.C
local wrap, raise, is_tensor = core.wrap, core.raise, core.is_tensor

local M = {}

local StringArray = ffi.typeof("const char *[?]")
local TensorArray = ffi.typeof("struct kiln_tensor *[?]")

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

-- Metadata values are strings in the format; numbers and booleans are written as their text.
local function meta_string(k, v)
  if type(v) == "string" then return v end
  if type(v) == "number" then
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
    return string.format("%.17g", v)
  end
  if type(v) == "boolean" then return tostring(v) end
  raise(string.format("save: metadata %q is a %s (values are strings, numbers or booleans)", tostring(k), type(v)))
end

-- kiln.save(path, {name = tensor, ...} [, {key = "value", ...}]): the same tensors always give the
-- same bytes, those PyTorch's safetensors writes for them. Tensors on a GPU are copied to the CPU.
function M.save(path, tensors, metadata)
  if type(path) ~= "string" then raise("save: the path must be a string, got " .. type(path)) end
  if type(tensors) ~= "table" or is_tensor(tensors) then
    raise("save: expected a table of named tensors ({name = tensor}), got " .. (is_tensor(tensors) and "a tensor" or type(tensors)))
  end
  if type(tensors.state_dict) == "function" then tensors = tensors:state_dict() end   -- a module
  local names = {}
  for k, v in pairs(tensors) do
    if type(k) ~= "string" then raise(string.format("save: tensor names must be strings, got the %s %s", type(k), tostring(k))) end
    if not is_tensor(v) then raise(string.format("save: %q is a %s, not a tensor", k, type(v))) end
    names[#names + 1] = k
  end
  table.sort(names)
  local n = #names
  local cnames, cts = StringArray(n + 1), TensorArray(n + 1)
  for i, k in ipairs(names) do
    cnames[i - 1] = k          -- the Lua strings stay alive in names until the call returns
    cts[i - 1] = tensors[k].p
  end
  local keys, values = {}, {}
  if metadata ~= nil then
    if type(metadata) ~= "table" then raise("save: the metadata must be a table of strings, got " .. type(metadata)) end
    for _, k in ipairs(sorted_keys(metadata)) do
      if type(k) ~= "string" then raise(string.format("save: metadata keys must be strings, got the %s %s", type(k), tostring(k))) end
      keys[#keys + 1] = k
      values[#values + 1] = meta_string(k, metadata[k])
    end
  end
  local nm = #keys
  local ckeys, cvalues = StringArray(nm + 1), StringArray(nm + 1)
  for i = 1, nm do ckeys[i - 1], cvalues[i - 1] = keys[i], values[i] end
  if C.kiln_safetensors_save(path, n, cnames, cts, nm, ckeys, cvalues) ~= 0 then core.fail() end
  return path
end

-- kiln.load(path [, {mmap = false}]) -> tensors, metadata: a table of CPU tensors by name and a
-- table of the metadata strings. Tensors share the file's mapping (copy on write) unless
-- mmap = false; either way, changing them never changes the file.
function M.load(path, opts)
  if type(path) ~= "string" then raise("load: the path must be a string, got " .. type(path)) end
  local flags = (opts and opts.mmap == false) and C.KILN_SAFETENSORS_NO_MMAP or 0
  local h = C.kiln_safetensors_open(path, flags)
  if h == nil then core.fail() end
  h = ffi.gc(h, C.kiln_safetensors_close)
  local tensors, metadata = {}, {}
  for i = 0, C.kiln_safetensors_count(h) - 1 do
    tensors[ffi.string(C.kiln_safetensors_name(h, i))] = wrap(C.kiln_safetensors_tensor(h, i))
  end
  for i = 0, C.kiln_safetensors_meta_count(h) - 1 do
    metadata[ffi.string(C.kiln_safetensors_meta_key(h, i))] = ffi.string(C.kiln_safetensors_meta_value(h, i))
  end
  C.kiln_safetensors_close(ffi.gc(h, nil))
  return tensors, metadata
end

return M
