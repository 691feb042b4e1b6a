-- kiln.cdef: finds libkiln and feeds its public headers to ffi.cdef.
-- The header text is embedded in the library itself (kiln_cdefs()), so the declarations the
-- FFI sees are always the ones the library was compiled from.
local ffi = require "ffi"

local M = {}

ffi.cdef "const char *kiln_cdefs(void);"

local function dirname(path) return (path:match("^(.*)/[^/]*$") or ".") end

-- Where to look for libkiln when the process does not already hold it.
local function candidates()
  local list = {}
  if os.getenv("KILN_LIB") then list[#list + 1] = os.getenv("KILN_LIB") end
  if os.getenv("KILN_LIB_DIR") then list[#list + 1] = os.getenv("KILN_LIB_DIR") .. "/libkiln.so" end
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) == "@" then
    local kiln_dir = dirname(src:sub(2))
    local root = dirname(dirname(kiln_dir))               -- lua/kiln/cdef.lua -> the source tree
    list[#list + 1] = root .. "/build/lib/libkiln.so"
    -- installed: <prefix>/share/lua/5.1/kiln/cdef.lua -> <prefix>/lib/libkiln.so
    list[#list + 1] = dirname(dirname(dirname(dirname(kiln_dir)))) .. "/lib/libkiln.so"
  end
  -- a LuaRocks tree: libkiln beside the C modules (package.cpath)
  for template in package.cpath:gmatch("[^;]+") do
    local path = template:gsub("%?", "libkiln")
    local f = io.open(path)
    if f then f:close() list[#list + 1] = path end
  end
  list[#list + 1] = "kiln"                               -- the dynamic linker's own search
  return list
end

local function find_library()
  -- The kiln launcher links libkiln: its symbols are already in the process.
  if pcall(function() return ffi.C.kiln_cdefs end) then return ffi.C end
  local errors = {}
  for _, name in ipairs(candidates()) do
    local ok, lib = pcall(ffi.load, name)
    if ok then return lib end
    errors[#errors + 1] = "  " .. name .. ": " .. tostring(lib)
  end
  error("kiln: cannot load libkiln (set KILN_LIB to its path, or LD_LIBRARY_PATH to its folder):\n" ..
        table.concat(errors, "\n"), 0)
end

-- The declarations of the headers, without preprocessor lines and without kiln_cdefs itself.
function M.declarations(lib)
  local text = ffi.string(lib.kiln_cdefs())
  local out = {}
  for line in (text .. "\n"):gmatch("(.-)\n") do
    if not line:match("^%s*#") and not line:match("kiln_cdefs%s*%(") then out[#out + 1] = line end
  end
  return table.concat(out, "\n")
end

M.lib = find_library()
M.text = M.declarations(M.lib)
ffi.cdef(M.text)

return M
