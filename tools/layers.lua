-- tools/layers.lua: the runtime's layers, and the check that calls and includes only go down.
-- usage: luajit tools/layers.lua BUILD_DIR [SOURCE_DIR]   (exit 1 and one line per crossing)
-- The Lua library is checked the same way: its modules' requires, against LUA_LAYERS below.
--
-- The layers of libkiln, top to bottom; each is a folder of runtime/src (two folders in one layer
-- are peers). A file may call functions and include headers of its own layer and of the layers
-- below it, never above. runtime/src/internal.h, the runtime's private declarations, is shared by
-- every layer. The op front ends and autograd are peers: a front end records its node in the graph,
-- and the backward walk adds gradients with the elementwise ops.
local LAYERS = {{"dist", "data"}, {"ops", "autograd"}, {"dispatch"}, {"cpu"}, {"core"}}

-- Symbols every layer may use wherever they are defined: the op table is data that every layer
-- reads (an op's name, family and flags), and it names each op's derivative in ops/ by pointer.
local SHARED = {kiln_ops = true, kiln_op_info = true, kiln_op_has = true, kiln_op_name = true,
                kiln_op_family_names = true}

-- Crossings that are known and not yet undone, as "file -> symbol" (or "file -> include").
-- The check fails on any crossing not listed here, and on a listed one that no longer happens,
-- so that this list only shrinks.
local KNOWN = dofile((arg[0]:match("^(.*)/") or ".") .. "/layers_known.lua")

local build = arg[1] or "build"
local src = (arg[2] or ".") .. "/runtime/src"
-- libkiln's own objects, and the CPU kernels compiled once per instruction-set level
-- (CMakeFiles/kiln_cpu_<level>.dir): every copy is checked, each in the layer of its source file.
local objdirs = {build .. "/CMakeFiles/kiln.dir/runtime/src"}

local rank, folders = {}, {}
for i, group in ipairs(LAYERS) do
  for _, l in ipairs(group) do rank[l] = i folders[#folders + 1] = l end   -- smaller is higher
end

local function lines(cmd)
  local p = assert(io.popen(cmd))
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

local function layer_of(path)   -- "ops/nn.c" -> "ops"
  return path:match("^([%w_]+)/")
end

for _, d in ipairs(lines("ls -d " .. build .. "/CMakeFiles/kiln_cpu_*.dir/runtime/src 2>/dev/null")) do
  objdirs[#objdirs + 1] = d
end

-- Object files and the symbols each defines and needs.
local objects, objpath = {}, {}
for _, dir in ipairs(objdirs) do
  for _, o in ipairs(lines("cd " .. dir .. " && ls */*.o 2>/dev/null")) do
    if not objpath[o] then objects[#objects + 1] = o end
    objpath[o] = objpath[o] or {}
    table.insert(objpath[o], dir .. "/" .. o)
  end
end
if #objects == 0 then io.stderr:write("layers: no object files under " .. objdirs[1] .. "\n") os.exit(2) end
local defined_in = {}
local needs = {}
for _, o in ipairs(objects) do
  needs[o] = {}
  for _, path in ipairs(objpath[o]) do
    for _, l in ipairs(lines("nm -P " .. path)) do
      local name, kind = l:match("^(%S+) (%a)")
      if kind == "U" then needs[o][#needs[o] + 1] = name
      elseif kind and kind:match("[TDRBtdrb]") and kind:match("%u") then defined_in[name] = o end
    end
  end
end

local found, problems = {}, {}
local function crossing(file, what, from, to)
  -- the op table names each op's derivative (ops/) by pointer; autograd calls it
  if file == "dispatch/op_table.c" and what:match("^kiln_[%w_]+_derivative$") then return end
  local key = file .. " -> " .. what
  found[key] = true
  if not KNOWN[key] then
    problems[#problems + 1] = string.format("%s (%s) uses %s of %s, a layer above it", file, from, what, to)
  end
end

for _, o in ipairs(objects) do
  local file = o:gsub("%.o$", "")
  local from = layer_of(file)
  if rank[from] then
    for _, sym in ipairs(needs[o]) do
      local def = defined_in[sym]
      local to = def and layer_of(def)
      if to and not SHARED[sym] and rank[to] and rank[to] < rank[from] then
        crossing(file, sym, from, to)
      end
    end
  end
end

-- Includes: a quoted include names a file of runtime/src (next to the includer, or on the include
-- path: runtime/src and runtime/src/core).
local function exists(p) local f = io.open(p) if f then f:close() return true end return false end
for _, layer in ipairs(folders) do
  for _, name in ipairs(lines("cd " .. src .. "/" .. layer .. " && ls *.c *.h 2>/dev/null")) do
    local file = layer .. "/" .. name
    local f = assert(io.open(src .. "/" .. file))
    for l in f:lines() do
      local inc = l:match('^%s*#%s*include%s+"([^"]+)"')
      if inc then
        local target
        for _, base in ipairs{layer .. "/", "", "core/"} do
          if exists(src .. "/" .. base .. inc) then target = (base .. inc):gsub("[^/]+/%.%./", "") break end
        end
        local to = target and layer_of(target)
        if to and rank[to] and rank[to] < rank[layer] then crossing(file, "#include " .. inc, layer, to) end
      end
    end
    f:close()
  end
end

-- ---- the Lua library ----
-- Its modules in layers, top to bottom (peers share a line). A module requires only its own layer
-- and those below; every require is at the top level of its file (a require inside a function
-- hides a cycle), but for pcall(require, ...) of an optional module.
local LUA_LAYERS = {
  {"kiln.nb"},
  {"kiln.nb.run", "kiln.nb.sweep"},
  {"kiln.nb.cells", "kiln.nb.params", "kiln.nb.report"},
  {"kiln", "kiln.repl", "kiln.testing", "kiln.launch"},
  {"kiln.help"},
  {"kiln.nn", "kiln.nn.layers", "kiln.nn.rnn", "kiln.nn.initializers", "kiln.optim", "kiln.optim.sgd",
   "kiln.optim.adam", "kiln.optim.rmsprop", "kiln.optim.adagrad", "kiln.optim.lr_scheduler", "kiln.data",
   "kiln.data.files", "kiln.data.datasets", "kiln.data.order", "kiln.data.batches", "kiln.data.transforms",
   "kiln.data.loader", "kiln.checkpoint", "kiln.amp", "kiln.audio", "kiln.ui", "kiln.dist", "kiln.dist.collectives",
   "kiln.dist.data_parallel", "kiln.dist.model_parallel", "kiln.dist.simulate", "kiln.display", "kiln.plot",
   "kiln.plot.raster", "kiln.plot.font"},
  {"kiln.metrics"},
  {"kiln.json", "kiln.factory", "kiln.autograd", "kiln.io"},
  {"kiln.tensor"},
  {"kiln.functional", "kiln.format", "kiln.cuda"},
  {"kiln.core", "kiln.docs"},
  {"kiln.cdef"},
}
local lua_rank = {}
for i, group in ipairs(LUA_LAYERS) do for _, m in ipairs(group) do lua_rank[m] = i end end
local lua_root = (arg[2] or ".") .. "/lua/"
local function module_of(path)   -- "kiln/nn/init.lua" -> "kiln.nn"
  return (path:gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", "."))
end
for _, path in ipairs(lines("cd " .. lua_root .. " && find kiln -name '*.lua' | sort")) do
  local mod = module_of(path)
  if not lua_rank[mod] then
    problems[#problems + 1] = string.format("lua/%s: module %s has no layer in tools/layers.lua", path, mod)
  else
    local f = assert(io.open(lua_root .. path))
    local n = 0
    for l in f:lines() do
      n = n + 1
      local code = l:gsub("%-%-.*$", "")
      for call in code:gmatch("%f[%w_]require%s*[%(\"'][^)]*") do
        local target = call:match("[\"']([%w_.]+)[\"']")
        local optional = code:find("pcall%(%s*require%s*,") ~= nil
        if not optional and (l:match("^%s") or code:find("%f[%w_]function%f[^%w_].*require")) then
          problems[#problems + 1] = string.format("lua/%s:%d: a require inside a block (%s); require at the top of the file", path, n, target or "?")
        end
        if target and target:match("^kiln") and not optional then
          if not lua_rank[target] then
            problems[#problems + 1] = string.format("lua/%s:%d: %s requires %s, which has no layer in tools/layers.lua", path, n, mod, target)
          elseif lua_rank[target] < lua_rank[mod] then
            problems[#problems + 1] = string.format("lua/%s:%d: %s requires %s, a layer above it", path, n, mod, target)
          end
        end
      end
    end
    f:close()
  end
end

for key in pairs(KNOWN) do
  if not found[key] then problems[#problems + 1] = "listed in tools/layers_known.lua but no longer crosses: " .. key end
end
table.sort(problems)
for _, p in ipairs(problems) do print(p) end
local n = 0
for _ in pairs(found) do n = n + 1 end
io.stderr:write(string.format("layers: %d object files, %d known crossings, %d problems\n", #objects, n, #problems))
os.exit(#problems == 0 and 0 or 1)
