-- kiln.checkpoint: everything a run needs to resume, in one safetensors file written crash-safely.
--   checkpoint.save("runs/a", {model = model, optimizer = opt, scheduler = sched, step = step,
--                              scaler = scaler, epoch = epoch, data = {epoch = epoch, batch = b}, extra = {...}}, {keep = 3})
--   local state = checkpoint.load("runs/a", {model = model, optimizer = opt, scheduler = sched})
-- Tensors (the model's "model.<name>", the optimizer's "optimizer.state.<i>.<name>", tensors in
-- data or extra) are the file's entries; everything else (hyper-parameters, step counts, scheduler,
-- RNG state, data position, extra) is JSON (lua-cjson) in the metadata key "kiln.state".
-- Given a folder, files are named ckpt-<step>.safetensors and the last `keep` are kept.
local core = require "kiln.core"
local kio = require "kiln.io"
local factory = require "kiln.factory"
local autograd = require "kiln.autograd"
local ffi = core.ffi
local raise, is_tensor = core.raise, core.is_tensor

local ok_cjson, cjson = pcall(require, "cjson")
local ok_lfs, lfs = pcall(require, "lfs")

local M = {}

M.FORMAT = "1"   -- metadata "kiln.checkpoint": the layout of "kiln.state"

local function need(ok, what, package)
  if not ok then raise(string.format("checkpoint: %s needs the Lua module %s (Debian's %s; run scripts/install-deps.sh)", what, package, package)) end
end

-- ---- values <-> JSON ----
-- JSON holds what Lua tables hold, with three tagged objects for what it cannot:
--   {"$tensor": name}   a tensor, stored as the file's entry `name`
--   {"$f64": "0.1000000000000000055"}   a number %.14g would not give back exactly (cjson prints at
--                       most 14 digits), or "inf", "-inf", "nan"
--   {"$map": [[key, value], ...]}   a table with keys that are not all strings (optimizer state
--                       is keyed by parameter number)
-- Objects are written with their keys sorted, so the same state gives the same bytes.

local Array = {}   -- the metatable marking a JSON array

local function encode_number(x)
  if x ~= x then return {["$f64"] = "nan"} end
  if x == math.huge then return {["$f64"] = "inf"} end
  if x == -math.huge then return {["$f64"] = "-inf"} end
  if tonumber(string.format("%.14g", x)) == x then return x end
  return {["$f64"] = string.format("%.17g", x)}
end

-- A tree of plain values (strings, numbers, booleans, tables marked Array or objects) from v; the
-- tensors met on the way go into tensors under their path.
local function to_plain(v, path, tensors, seen)
  local kind = type(v)
  if kind == "number" then return encode_number(v) end
  if kind == "string" or kind == "boolean" then return v end
  if is_tensor(v) then
    if tensors[path] ~= nil then raise(string.format("checkpoint.save: two tensors are both named %q", path)) end
    tensors[path] = v
    return {["$tensor"] = path}
  end
  if kind == "cdata" and tonumber(v) then return encode_number(tonumber(v)) end
  if kind ~= "table" then raise(string.format("checkpoint.save: %s is a %s, which a checkpoint cannot hold", path, kind)) end
  if seen[v] then raise(string.format("checkpoint.save: %s contains itself", path)) end
  seen[v] = true
  local n, count, all_strings = #v, 0, true
  for k in pairs(v) do
    count = count + 1
    if type(k) ~= "string" or k:sub(1, 1) == "$" then all_strings = false end
  end
  local out
  if n > 0 and count == n then
    out = setmetatable({}, Array)
    for i = 1, n do out[i] = to_plain(v[i], path .. "." .. i, tensors, seen) end
  elseif all_strings then
    out = {}
    for k, x in pairs(v) do out[k] = to_plain(x, path .. "." .. k, tensors, seen) end
  else
    local keys = {}
    for k in pairs(v) do
      if type(k) ~= "string" and type(k) ~= "number" then
        raise(string.format("checkpoint.save: %s has a key of type %s (keys are strings or numbers)", path, type(k)))
      end
      keys[#keys + 1] = k
    end
    table.sort(keys, function(a, b)
      if type(a) == type(b) then return a < b end
      return type(a) == "number"
    end)
    local pairs_list = setmetatable({}, Array)
    for i, k in ipairs(keys) do
      pairs_list[i] = setmetatable({to_plain(k, path, {}, seen), to_plain(v[k], path .. "." .. tostring(k), tensors, seen)}, Array)
    end
    out = {["$map"] = pairs_list}
  end
  seen[v] = nil
  return out
end

-- JSON text of a plain tree: every scalar and key through cjson, objects with sorted keys.
local function json_text(v)
  if type(v) ~= "table" then return cjson.encode(v) end
  local parts = {}
  if getmetatable(v) == Array then
    for i = 1, #v do parts[i] = json_text(v[i]) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys)
  for i, k in ipairs(keys) do parts[i] = cjson.encode(k) .. ":" .. json_text(v[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

local function decode_f64(s)
  if s == "nan" then return 0 / 0 end
  if s == "inf" then return math.huge end
  if s == "-inf" then return -math.huge end
  local x = tonumber(s)
  if x == nil then raise(string.format("checkpoint.load: bad number %q in the state", tostring(s))) end
  return x
end

-- The inverse of to_plain, with the tagged objects resolved.
local function from_plain(v, tensors, path)
  if type(v) ~= "table" then
    if v == cjson.null then return nil end
    return v
  end
  if v["$tensor"] ~= nil then
    local t = tensors[v["$tensor"]]
    if t == nil then raise(string.format("checkpoint.load: %s refers to the tensor %q, which the file lacks", path, tostring(v["$tensor"]))) end
    return t
  end
  if v["$f64"] ~= nil then return decode_f64(v["$f64"]) end
  local out = {}
  if v["$map"] ~= nil then
    for _, kv in ipairs(v["$map"]) do
      local k = from_plain(kv[1], tensors, path)
      out[k] = from_plain(kv[2], tensors, path .. "." .. tostring(k))
    end
    return out
  end
  for k, x in pairs(v) do out[k] = from_plain(x, tensors, path .. "." .. tostring(k)) end
  return out
end

-- ---- files and folders ----

local function is_file_path(p) return p:match("%.safetensors$") ~= nil end

local function is_dir(p)
  need(ok_lfs, "a checkpoint folder", "lua-filesystem")
  return lfs.attributes(p, "mode") == "directory"
end

local function mkdir_p(dir)
  need(ok_lfs, "a checkpoint folder", "lua-filesystem")
  local prefix = dir:sub(1, 1) == "/" and "/" or ""
  for part in dir:gmatch("[^/]+") do
    prefix = prefix .. part
    if lfs.attributes(prefix, "mode") == nil then
      local ok, err = lfs.mkdir(prefix)
      if not ok and lfs.attributes(prefix, "mode") ~= "directory" then
        raise(string.format("checkpoint.save: cannot create the folder %s: %s", prefix, tostring(err)))
      end
    elseif lfs.attributes(prefix, "mode") ~= "directory" then
      raise(string.format("checkpoint.save: %s is not a folder", prefix))
    end
    prefix = prefix .. "/"
  end
end

-- The checkpoints of a folder as {step, path}, newest (highest step) first.
local function list(dir)
  local found = {}
  if not is_dir(dir) then return found end
  for name in lfs.dir(dir) do
    local step = name:match("^ckpt%-(%d+)%.safetensors$")
    if step then found[#found + 1] = {tonumber(step), dir .. "/" .. name} end
  end
  table.sort(found, function(a, b) return a[1] > b[1] end)
  return found
end
M.list = function(dir)
  local r = {}
  for i, e in ipairs(list(dir)) do r[i] = e[2] end
  return r
end

-- The newest checkpoint of a folder (the highest step): its path and step, or nil.
function M.latest(dir)
  if type(dir) ~= "string" then raise("checkpoint.latest: the folder must be a string, got " .. type(dir)) end
  local l = list(dir)
  if l[1] then return l[1][2], l[1][1] end
  return nil
end

pcall(ffi.cdef, "int kiln_checkpoint_kill(int pid, int sig) __asm__(\"kill\");")
local ESRCH = 3

-- Temporary files of writers that died mid-write ("<name>.tmp.<pid>" whose pid is gone).
local function remove_stale_temporaries(dir)
  for name in lfs.dir(dir) do
    local pid = name:match("^ckpt%-%d+%.safetensors%.tmp%.(%d+)$")
    if pid and ffi.C.kiln_checkpoint_kill(tonumber(pid), 0) ~= 0 and ffi.errno() == ESRCH then
      os.remove(dir .. "/" .. name)
    end
  end
end

-- Keep the newest `keep` checkpoints of dir (never the one just written: a restarted run that saves
-- lower steps does not delete its own file).
local function prune(dir, keep, written)
  local l = list(dir)
  for i = keep + 1, #l do
    if l[i][2] ~= written then os.remove(l[i][2]) end
  end
  remove_stale_temporaries(dir)
end

-- ---- save and load ----

local function state_of(obj, what)
  if type(obj) == "table" and type(obj.state_dict) == "function" then return obj:state_dict() end
  return obj
end

-- Scheduler state without functions (a scheduler of the user's may keep one; its constructor makes it).
local function without_functions(t)
  local r = {}
  for k, v in pairs(t) do if type(v) ~= "function" then r[k] = v end end
  return r
end

local function check_integer(v, what)
  if v ~= nil and (type(v) ~= "number" or v ~= math.floor(v) or v < 0) then
    raise(string.format("checkpoint.save: %s must be a non-negative integer, got %s", what, tostring(v)))
  end
end

-- checkpoint.save(path_or_dir, state [, {keep = N}]) -> the path written.
-- state: model (a module, or a table of tensors), optimizer, scheduler, scaler (kiln.amp.GradScaler), step, epoch, rng (default
-- kiln.get_rng_state(); false for none), data (the position in the epoch: a table, or an object
-- with state_dict()), extra (anything made of tables, numbers, strings, booleans and tensors).
-- A path ending in .safetensors is written as is; anything else is a folder, made if missing.
function M.save(where, state, opts)
  need(ok_cjson, "checkpoint.save", "lua-cjson")
  if type(where) ~= "string" then raise("checkpoint.save: the path or folder must be a string, got " .. type(where)) end
  if type(state) ~= "table" then raise("checkpoint.save: the state must be a table {model =, optimizer =, step =, ...}") end
  opts = opts or {}
  check_integer(state.step, "step")
  check_integer(state.epoch, "epoch")
  local keep = opts.keep
  if keep ~= nil and (type(keep) ~= "number" or keep < 1 or keep ~= math.floor(keep)) then
    raise("checkpoint.save: keep must be a positive integer, got " .. tostring(keep))
  end
  local path, dir = where, nil
  if not is_file_path(where) then
    if state.step == nil then raise("checkpoint.save: saving into a folder names the file by step: give state.step") end
    dir = where:gsub("/+$", "")
    if dir == "" then dir = "/" end
    mkdir_p(dir)
    path = string.format("%s/ckpt-%d.safetensors", dir, state.step)
  end

  local tensors = {}
  local model = state_of(state.model, "model")
  if model ~= nil then
    if type(model) ~= "table" then raise("checkpoint.save: model must be a module or a table of tensors, got " .. type(model)) end
    for k, v in pairs(model) do
      if not is_tensor(v) then raise(string.format("checkpoint.save: model entry %q is a %s, not a tensor", tostring(k), type(v))) end
      tensors["model." .. k] = v
    end
  end
  local rng = state.rng
  if rng == nil then rng = factory.get_rng_state() end
  local plain = {
    format = M.FORMAT,
    step = state.step, epoch = state.epoch, has_model = model ~= nil,
    rng = rng ~= false and to_plain(rng, "rng", tensors, {}) or nil,
    data = state.data ~= nil and to_plain(state_of(state.data), "data", tensors, {}) or nil,
    extra = state.extra ~= nil and to_plain(state.extra, "extra", tensors, {}) or nil,
    optimizer = state.optimizer ~= nil and to_plain(state_of(state.optimizer), "optimizer", tensors, {}) or nil,
    scheduler = state.scheduler ~= nil and to_plain(without_functions(state_of(state.scheduler)), "scheduler", tensors, {}) or nil,
    scaler = state.scaler ~= nil and to_plain(state_of(state.scaler), "scaler", tensors, {}) or nil,
  }
  local metadata = {["kiln.checkpoint"] = M.FORMAT, ["kiln.state"] = json_text(plain), ["kiln.version"] = ffi.string(core.C.kiln_version())}
  if state.step ~= nil then metadata.step = string.format("%d", state.step) end
  kio.save(path, tensors, metadata)
  if dir and keep then prune(dir, keep, path) end
  return path
end

local function resolve(where, what)
  if type(where) ~= "string" then raise(what .. ": the path or folder must be a string, got " .. type(where)) end
  if is_file_path(where) and not is_dir(where) then return where end
  if not is_dir(where) then
    -- something that exists but is no file (a FIFO, a device): say what it is
    local mode = ok_lfs and lfs.attributes(where, "mode")
    if mode and mode ~= "file" and core.C.kiln_file_check(what, where) ~= 0 then raise(ffi.string(core.C.kiln_error_message())) end
    raise(string.format("%s: %s is neither a checkpoint file nor a folder", what, where))
  end
  local path = M.latest(where)
  if not path then raise(string.format("%s: no checkpoint (ckpt-<step>.safetensors) in %s", what, where)) end
  return path
end

-- checkpoint.load(path_or_dir [, {model =, optimizer =, scheduler =, scaler =, data =, rng = true}]) -> state.
-- A folder means its newest checkpoint. Restores in place whatever is given (load_state_dict of
-- each; the global RNG unless rng = false) and returns {path, step, epoch, data, extra, rng, model
-- (the tensors by name), optimizer, scheduler (their state dicts)}.
function M.load(where, targets)
  need(ok_cjson, "checkpoint.load", "lua-cjson")
  targets = targets or {}
  local path = resolve(where, "checkpoint.load")
  local tensors, metadata = kio.load(path)
  if metadata["kiln.checkpoint"] == nil or metadata["kiln.state"] == nil then
    raise(string.format("checkpoint.load: %s is a safetensors file but not a kiln checkpoint (no kiln.state metadata); "
                        .. "read it with kiln.load", path))
  end
  if metadata["kiln.checkpoint"] ~= M.FORMAT then
    raise(string.format("checkpoint.load: %s has checkpoint format %s; this kiln reads format %s", path,
                        metadata["kiln.checkpoint"], M.FORMAT))
  end
  local ok, decoded = pcall(cjson.decode, metadata["kiln.state"])
  if not ok or type(decoded) ~= "table" then
    raise(string.format("checkpoint.load: %s: the kiln.state metadata is not valid JSON: %s", path, tostring(decoded)))
  end
  local plain = from_plain(decoded, tensors, "state")
  local model = {}
  for name, t in pairs(tensors) do
    local k = name:match("^model%.(.*)$")
    if k then model[k] = t end
  end
  local state = {path = path, step = plain.step, epoch = plain.epoch, data = plain.data, extra = plain.extra,
                 rng = plain.rng, model = plain.has_model and model or nil, optimizer = plain.optimizer,
                 scheduler = plain.scheduler, scaler = plain.scaler}
  -- An error of restoring a part names the checkpoint and the part (the load_state_dict that failed
  -- names the entry), raised at the caller's line.
  local function checked(what, fn, ...)
    local ok, err = pcall(fn, ...)
    if not ok then
      raise(string.format("checkpoint.load: %s: %s: %s", path, what, (tostring(err):gsub("^[^\n]-:%d+: ", ""))))
    end
  end
  local function restore(what, target, saved)
    if target == nil then return end
    if saved == nil then raise(string.format("checkpoint.load: %s holds no %s state", path, what)) end
    if type(target.load_state_dict) ~= "function" then
      raise(string.format("checkpoint.load: the %s given has no load_state_dict", what))
    end
    checked(what, target.load_state_dict, target, saved)
  end
  if targets.model ~= nil then
    if not plain.has_model then raise(string.format("checkpoint.load: %s holds no model", path)) end
    if type(targets.model.load_state_dict) == "function" then
      checked("model", targets.model.load_state_dict, targets.model, model)
    else   -- a table of tensors, filled in place: every one checked first (the same shape, not one
           -- that copy_ would broadcast), then all copied
      for k, t in pairs(targets.model) do
        local src = model[k]
        if src == nil then raise(string.format("checkpoint.load: %s has no tensor model.%s", path, tostring(k))) end
        if not is_tensor(t) then
          raise(string.format("checkpoint.load: %s: the model's %s is %s, not a tensor", path, tostring(k), core.describe(t)))
        end
        if not is_tensor(src) or tostring(src:size()) ~= tostring(t:size()) then
          raise(string.format("checkpoint.load: %s: model.%s is %s in the checkpoint, %s in the model", path, tostring(k),
                              is_tensor(src) and tostring(src:size()) or core.describe(src), tostring(t:size())))
        end
      end
      for k, t in pairs(targets.model) do
        checked("model." .. tostring(k), autograd.no_grad, function() t:copy_(model[k]) end)
      end
    end
  end
  restore("optimizer", targets.optimizer, plain.optimizer)
  restore("scheduler", targets.scheduler, plain.scheduler)
  restore("scaler", targets.scaler, plain.scaler)
  if targets.data ~= nil and type(targets.data) == "table" and type(targets.data.load_state_dict) == "function" then
    restore("data", targets.data, plain.data)
  end
  if targets.rng ~= false and plain.rng ~= nil then factory.set_rng_state(plain.rng) end
  return state
end

return M
