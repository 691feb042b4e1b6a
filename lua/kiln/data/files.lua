-- kiln.data.files: files to tensors: IDX (MNIST) files, single images, and PNG output.
local core = require "kiln.core"
local ffi, C = core.ffi, core.C
local wrap, raise, is_tensor = core.wrap, core.raise, core.is_tensor
local check_integer = core.integer_arg
local CPU = core.device("cpu")

local M = {}

-- An IDX file (the MNIST format), plain or gzip-compressed: u8 stays u8, i8/i16/i32 become i32,
-- f32 and f64 stay. Any malformed, truncated or over-long file is an error naming it.
function M.read_idx(path)
  if type(path) ~= "string" then raise("read_idx: the path must be a string, got " .. type(path)) end
  return wrap(C.kiln_idx_read(path))
end

-- One decoded image as a u8 tensor [C,H,W] (channels: 1 grey, 3 RGB (the default), 4 RGBA, 0 the file's).
-- read_image(path[, channels = 3]) or read_image(path, {channels = 3, depth = 8}): depth 16 keeps
-- 16-bit samples, in an i32 tensor (0 to 65535).
local image_options = core.set("channels", "depth")
function M.read_image(path, channels)
  if type(path) ~= "string" then raise("read_image: the path must be a string, got " .. type(path)) end
  local depth = 8
  if type(channels) == "table" then
    local o = core.options(channels, image_options, "read_image")
    channels, depth = o.channels, o.depth or 8
    check_integer(depth, "read_image", "depth")
  end
  if channels ~= nil then check_integer(channels, "read_image", "channels") end
  return wrap(C.kiln_image_read_depth(path, channels or 3, depth))
end

-- Writes a u8 image [C,H,W] or [H,W] as a PNG file.
function M.write_png(path, image)
  if type(path) ~= "string" then raise("write_png: the path must be a string, got " .. type(path)) end
  if not is_tensor(image) then raise("write_png: expected a u8 tensor [C,H,W] or [H,W], got " .. type(image)) end
  core.check(C.kiln_image_write_png(path, image.p))
end

return M
