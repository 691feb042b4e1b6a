-- Runs the busted specs of a folder under the kiln launcher (LuaJIT, with `kiln` loaded).
-- usage: kiln tests/lua/run.lua tests/lua [busted options]
local dir = arg[1] or "tests/lua"
-- the specs' shared helpers (helpers.lua) are found next to them
local folder = dir:match("%.lua$") and (dir:match("^(.*)/[^/]*$") or ".") or dir
package.path = folder .. "/?.lua;" .. package.path
-- busted unloads the modules a spec file loaded when the file ends, but kiln (loaded by the launcher)
-- keeps the nn and functional it loads on first use: load them now, so every file shares them.
local _ = kiln.nn, kiln.functional
-- An OPENBLAS_CORETYPE that holds OpenBLAS to generic kernels on a CPU that runs better ones makes
-- every kiln warn on stderr, which the specs' child processes would add to the output they
-- compare: they run without it (system_spec sets it where it tests it).
if os.getenv("OPENBLAS_CORETYPE") and kiln.info().blas.state == "generic" then
  local ffi = require "ffi"
  pcall(ffi.cdef, "int unsetenv(const char *name);")
  ffi.C.unsetenv("OPENBLAS_CORETYPE")
  io.stderr:write("tests: OPENBLAS_CORETYPE unset for the specs' child processes\n")
end
local args = {"--pattern=_spec", "--output=utfTerminal"}
if not os.getenv("TERM") or os.getenv("CI") then args[2] = "--output=plainTerminal" end
for i = 2, #arg do args[#args + 1] = arg[i] end
args[#args + 1] = dir
local script = arg[0]
arg = {[0] = "busted"}
for i, a in ipairs(args) do arg[i] = a end
require("busted.runner")({standalone = false})
