-- The FFI must see exactly what the C compiler sees: every enum value, struct size and field
-- offset of the public headers, every declared function exported, every export declared.
local kiln = kiln or require "kiln"
local ffi = require "ffi"
local cdef = require "kiln.cdef"
package.path = "tools/?.lua;" .. package.path
local abi = require "abi"

local function dump_path()
  local p = os.getenv("KILN_ABI_DUMP")
  if p then return p end
  for _, c in ipairs({"build/bin/kiln_abi_dump"}) do
    local f = io.open(c)
    if f then f:close() return c end
  end
end

local function library_path()
  local p = os.getenv("KILN_LIB") or (os.getenv("KILN_LIB_DIR") and os.getenv("KILN_LIB_DIR") .. "/libkiln.so")
  return p or "build/lib/libkiln.so"
end

describe("the FFI declarations", function()
  local lines = {}
  setup(function()
    local path = dump_path()
    assert(path, "kiln_abi_dump not found: build it (cmake --build build) or set KILN_ABI_DUMP")
    local p = assert(io.popen(path))
    for line in p:lines() do lines[#lines + 1] = line end
    p:close()
  end)

  it("cover the headers: enums, structs and functions were all found", function()
    local kinds = {}
    for _, l in ipairs(lines) do local k = l:match("^(%S+)") kinds[k] = (kinds[k] or 0) + 1 end
    assert.is_true((kinds.enum or 0) > 80, "few enum constants")
    assert.is_true((kinds.sizeof or 0) >= 4, "few structs")
    assert.is_true((kinds["function"] or 0) > 70, "few functions")
  end)

  it("give every enum constant the value C gives it", function()
    for _, l in ipairs(lines) do
      local name, value = l:match("^enum (%S+) (%-?%d+)$")
      if name then assert.are.equal(tonumber(value), tonumber(cdef.lib[name]), name) end
    end
  end)

  it("give every struct the size and field offsets C gives it", function()
    for _, l in ipairs(lines) do
      local s, size = l:match("^sizeof (%S+) (%d+)$")
      if s then assert.are.equal(tonumber(size), ffi.sizeof("struct " .. s), "sizeof struct " .. s) end
      local s2, field, off = l:match("^offsetof (%S+)%.(%S+) (%d+)$")
      if s2 then assert.are.equal(tonumber(off), ffi.offsetof("struct " .. s2, field), s2 .. "." .. field) end
    end
  end)

  it("resolve every declared function in the library", function()
    for _, l in ipairs(lines) do
      local f = l:match("^function (%S+)")
      if f then
        local ok = pcall(function() return cdef.lib[f] end)
        assert.is_true(ok, "declared but not resolvable through the FFI: " .. f)
      end
    end
  end)

  it("declare every function the library exports, and nothing it does not", function()
    local declared = {}
    for _, f in ipairs(abi.parse(cdef.text .. "\nconst char *kiln_cdefs(void);").functions) do declared[f] = true end
    local p = assert(io.popen("nm -D --defined-only " .. library_path() .. " 2>/dev/null"))
    local exported = {}
    for line in p:lines() do
      local kind, name = line:match("^%x+ (%a) (kiln_[%w_]+)$")
      if name and kind == "T" then exported[name] = true end
    end
    p:close()
    assert.is_not_nil(next(exported), "nm found no kiln_ symbols in " .. library_path())
    for name in pairs(exported) do assert.is_true(declared[name] == true, "exported but not declared: " .. name) end
    for name in pairs(declared) do assert.is_true(exported[name] == true, "declared but not exported: " .. name) end
  end)

  it("are fed to ffi.cdef without preprocessor lines", function()
    assert.is_nil(cdef.text:match("\n%s*#"))
    assert.is_not_nil(cdef.text:match("struct kiln_tensor"))
  end)
end)
