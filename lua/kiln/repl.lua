-- kiln.repl: the read-eval-print loop of the `kiln` command.
-- Everything but the terminal lives here, so that busted can test it: the launcher
-- (bindings/kiln.c) passes readline and add_history to run(), and calls complete() on Tab.
local help = require "kiln.help"
local core = require "kiln.core"

local repl = {}

repl.prompt = "kiln> "
repl.continuation_prompt = "  ... > "
repl.max_items = 16     -- entries shown in a table summary
repl.max_width = 100    -- characters of a table summary before "..."

local keywords = {
  "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if",
  "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
}
local is_keyword = {}
for _, k in ipairs(keywords) do is_keyword[k] = true end

local function is_identifier(s)
  return type(s) == "string" and s:match("^[%a_][%w_]*$") ~= nil and not is_keyword[s]
end

local function pack(...)
  return {n = select("#", ...), ...}
end

-- ---- printing values ----

-- tostring that cannot raise (a __tostring may fail, e.g. on a freed tensor).
local function safe_tostring(v)
  local ok, s = pcall(tostring, v)
  if ok and type(s) == "string" then return s end
  return "<" .. type(v) .. ": __tostring failed: " .. tostring(s) .. ">"
end

local function quote(s)
  return (string.format("%q", s):gsub("\\\n", "\\n"))
end

local function has_tostring(t)
  local mt = getmetatable(t)
  return type(mt) == "table" and rawget(mt, "__tostring") ~= nil
end

-- Keys of t that are not 1..n, in a stable order: numbers first, then by text.
local function other_keys(t, n, limit)
  local keys = {}
  for k in next, t do
    if not (type(k) == "number" and k >= 1 and k <= n and k % 1 == 0) then
      keys[#keys + 1] = k
      if #keys >= limit then break end
    end
  end
  table.sort(keys, function(a, b)
    local ta, tb = type(a) == "number", type(b) == "number"
    if ta ~= tb then return ta end
    if ta then return a < b end
    return safe_tostring(a) < safe_tostring(b)
  end)
  return keys
end

local summarize

local function short(v, depth)
  if type(v) == "string" then return quote(v) end
  if type(v) == "table" and not has_tostring(v) then return summarize(v, depth + 1) end
  return safe_tostring(v)
end

-- A one-line summary of a table: {1, 2, a=1, ["x y"]=2, ...}, nested one level deep.
function summarize(t, depth)
  if depth > 2 then return "{...}" end
  local parts, width = {}, 0
  local function add(s)
    if #parts >= repl.max_items or width + #s > repl.max_width then return false end
    parts[#parts + 1] = s
    width = width + #s + 2
    return true
  end
  local n = 0
  while rawget(t, n + 1) ~= nil do n = n + 1 end
  for i = 1, n do
    if not add(short(rawget(t, i), depth)) then return "{" .. table.concat(parts, ", ") .. ", ...}" end
  end
  local keys = other_keys(t, n, 256)
  for _, k in ipairs(keys) do
    local key = is_identifier(k) and k or "[" .. short(k, depth) .. "]"
    if not add(key .. "=" .. short(rawget(t, k), depth)) then
      return "{" .. table.concat(parts, ", ") .. ", ...}"
    end
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- How the REPL shows one result: strings as they are (like print), tables summarised,
-- everything else (tensors included) through tostring.
function repl.format_value(v)
  if type(v) == "table" and not has_tostring(v) then return summarize(v, 1) end
  return safe_tostring(v)
end

-- All results tab-separated; nothing when every result is nil.
function repl.format_results(r, first)
  local any = false
  for i = first, r.n do
    if r[i] ~= nil then any = true end
  end
  if not any then return "" end
  local parts = {}
  for i = first, r.n do parts[#parts + 1] = repl.format_value(r[i]) end
  return table.concat(parts, "\t")
end

-- ---- errors ----

local function error_text(err)
  if type(err) == "string" then return err end
  local mt = getmetatable(err)
  if type(mt) == "table" and rawget(mt, "__tostring") then return safe_tostring(err) end
  return "(error object is a " .. type(err) .. " value)"
end

-- The frames that belong to the user: from below the `error` call (C frames on top) to the
-- REPL's own xpcall. When no Lua function of the user's is among them, the traceback adds
-- nothing to the message and is left out.
-- A frame of kiln's own Lua library (source tree or installed): left out, with the C functions
-- it called (error, pcall), so that the frames shown are the user's.
local function library_frame(frame)
  return frame:find("/lua/kiln/", 1, true) or frame:find("/lua/5.1/kiln/", 1, true)
end

local function user_traceback(tb)
  local frames, interesting = {}, false
  local lines = {}
  for frame in tb:gmatch("[^\n]+") do lines[#lines + 1] = frame end
  for n, frame in ipairs(lines) do
    if frame:find("in function 'xpcall'", 1, true) or frame:find("kiln/repl.lua", 1, true) then break end
    local c_frame = frame:find("^%s*%[C%]") or frame:find("^%s*%[builtin#")
    local called_by_library = c_frame and lines[n + 1] and library_frame(lines[n + 1])
    if frame ~= "stack traceback:" and not (c_frame and #frames == 0) and not library_frame(frame)
       and not called_by_library then
      frames[#frames + 1] = frame
      if not c_frame and not frame:find("^%s*stdin:%d+: in main chunk") then interesting = true end
    end
  end
  if not interesting then return "" end
  return "\nstack traceback:\n" .. table.concat(frames, "\n")
end

-- Under the kiln launcher a Ctrl-C's "interrupted" error is raised again after every pcall that
-- catches it, until a handler at the top says it has it.
local interrupt_caught = function() end
do
  local ok, readline = pcall(require, "kiln.readline")
  if ok and type(readline) == "table" and readline.interrupt_caught then interrupt_caught = readline.interrupt_caught end
end

local function message_handler(err)
  interrupt_caught()
  return error_text(err) .. user_traceback(debug.traceback("", 2))
end

-- ---- evaluating ----

function repl.new(opts)
  opts = opts or {}
  return {env = opts.env or _G, pending = nil}
end

-- fn, or nil, message, incomplete (the chunk could go on: lua.c's "<eof>" test).
-- What is typed runs with the JIT off (and so do the functions it defines), so that Ctrl-C's
-- debug hook stops a loop typed at the prompt; kiln's library and scripts keep the JIT.
local function compile(state, chunk)
  local fn, err = loadstring(chunk, "=stdin")
  if fn then
    if state.env ~= _G then setfenv(fn, state.env) end
    if jit and jit.off then jit.off(fn, true) end
    return fn
  end
  return nil, err, err:sub(-7) == "'<eof>'"
end

-- Runs fn; "ok", the printed results, or "error", the message.
function repl.call(state, fn)
  local r = pack(xpcall(fn, message_handler))
  if not r[1] then return "error", r[2] end
  return "ok", repl.format_results(r, 2)
end

-- `?x`: help on the value of x, or on the name x when it is not an expression with a value.
function repl.help_text(state, expr)
  if expr == "" then return help.help() end
  if help.lookup(expr) then return help.help(expr) end
  -- "loader:epoch", "seq.add": a method of an object, by the object's class
  local obj_expr, method = expr:match("^(.+)[.:]([%a_][%w_]*)$")
  if obj_expr then
    local get = compile(state, "return " .. obj_expr)
    local ok, obj = pcall(get or error)
    local line = ok and help.method(obj, method)
    if line then return line end
  end
  -- "t:view" names the method that t.view holds.
  local fn = compile(state, "return " .. expr:gsub("^(.+):([%a_][%w_]*)$", "%1.%2"))
  if fn then
    local ok, value = pcall(fn)
    if ok and value ~= nil then return help.help(value, expr) end
  end
  return help.help(expr)
end

-- One line of input. Returns "ok", output ("" when nothing to print); "more" when the
-- chunk is incomplete and the next line continues it; or "error", message.
function repl.eval_line(state, line)
  local chunk = line
  if state.pending then
    chunk = state.pending .. "\n" .. line
  else
    local expr = line:match("^%s*%?%s*(.-)%s*$")
    if expr then return "ok", repl.help_text(state, expr) end
    if not line:find("%S") then return "ok", "" end
    chunk = chunk:gsub("^%s*=", "return ", 1)  -- Lua 5.1's "=expr"
  end
  -- An expression first, so that its values are printed; then a statement.
  local fn, _, expr_incomplete = compile(state, "return " .. chunk)
  if fn then
    -- Not a tail call, so that error() in a call typed at the prompt still names "stdin:1:".
    fn = compile(state, "return select(1, " .. chunk .. "\n)") or fn
  else
    local err, incomplete
    fn, err, incomplete = compile(state, chunk)
    if not fn then
      if incomplete or expr_incomplete then
        state.pending = chunk
        return "more"
      end
      state.pending = nil
      return "error", err
    end
  end
  state.pending = nil
  return repl.call(state, fn)
end

-- Drops a half-typed multi-line chunk (Ctrl-C).
function repl.reset(state)
  state.pending = nil
end

-- ---- completion ----

local function starts_with(s, prefix)
  return s:sub(1, #prefix) == prefix
end

local function kiln_table()
  local k = rawget(_G, "kiln") or package.loaded.kiln
  if type(k) == "table" then return k end
end

-- The methods table of a kiln tensor (kiln.Tensor), or nil when v is not a tensor.
local function tensor_methods(v)
  local k = kiln_table()
  local methods = k and rawget(k, "Tensor")
  if type(methods) ~= "table" then return nil end
  local is_tensor = rawget(k, "is_tensor")
  if type(is_tensor) == "function" then
    local ok, yes = pcall(is_tensor, v)
    return ok and yes and methods or nil
  end
  local ok, ffi = pcall(require, "ffi")
  if ok and safe_tostring(ffi.typeof(v)):find("struct kiln_", 1, true) then return methods end
end

local function callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__call") ~= nil
end

-- Adds the completable keys of t, and of the tables its metatables' __index chain names.
local function collect_keys(t, names, methods_only)
  for _ = 1, 8 do
    for k, v in next, t do
      if is_identifier(k) and not starts_with(k, "__") and (not methods_only or callable(v)) then
        names[k] = true
      end
    end
    local mt = getmetatable(t)
    local index = type(mt) == "table" and rawget(mt, "__index")
    index = core.indexed_classes[index] or index   -- a class's __index that says "did you mean"
    if type(index) ~= "table" then return end
    t = index
  end
end

local function fields_of(value, methods_only)
  local names = {}
  if type(value) == "table" then
    collect_keys(value, names, methods_only)
  elseif type(value) == "cdata" then
    local methods = tensor_methods(value)
    if methods then collect_keys(methods, names, methods_only) end
  else
    local mt = getmetatable(value)  -- strings, files: their methods
    local index = type(mt) == "table" and rawget(mt, "__index")
    if type(index) == "table" then collect_keys(index, names, methods_only) end
  end
  return names
end

-- The value of a dotted path ("kiln.nn") in env; nil when any step fails.
local function resolve(env, path)
  local v = env
  for name in path:gmatch("[^.]+") do
    if type(v) ~= "table" and type(v) ~= "cdata" and type(v) ~= "userdata" and type(v) ~= "string" then
      return nil
    end
    local ok, next_v = pcall(function() return v[name] end)
    if not ok then return nil end
    v = next_v
  end
  return v
end

-- Completion candidates for the word text ("pri", "kiln.ra", "t:vi"); each candidate is
-- the whole word, as readline replaces text with it. line is the line up to the cursor.
function repl.complete(text, line, env)
  env = env or repl.env or _G
  local out = {}
  local path, sep, partial = text:match("^(.*)([.:])([%w_]*)$")
  if not path then
    if not text:match("^[%a_]?[%w_]*$") then return out end
    for _, k in ipairs(keywords) do
      if starts_with(k, text) then out[#out + 1] = k end
    end
    for k in pairs(fields_of(env, false)) do
      if starts_with(k, text) then out[#out + 1] = k end
    end
  else
    if not (path:match("^[%a_][%w_.]*$") and not path:find("..", 1, true) and path:sub(-1) ~= ".") then
      return out
    end
    local value = resolve(env, path)
    if value == nil then return out end
    for k in pairs(fields_of(value, sep == ":")) do
      if starts_with(k, partial) then out[#out + 1] = path .. sep .. k end
    end
  end
  table.sort(out)
  return out
end

-- ---- the loop ----

local function install_help(env)
  if rawget(env, "help") == nil then rawset(env, "help", help.help) end
  local k = rawget(env, "kiln")
  if type(k) == "table" and rawget(k, "help") == nil then rawset(k, "help", help.help) end
end

local function step(state, readline, add_history, out, err_out)
  local line, why = readline(state.pending and repl.continuation_prompt or repl.prompt)
  if line == nil then
    if why == "interrupted" then
      repl.reset(state)
      return false
    end
    out:write("\n")  -- the shell's prompt on a line of its own after Ctrl-D
    return true
  end
  if add_history then add_history(line) end
  local status, text = repl.eval_line(state, line)
  if status == "error" then
    err_out:write(text, "\n")
    err_out:flush()
  elseif text and text ~= "" then
    out:write(text, "\n")
  end
  out:flush()
  return false
end

-- The loop: readline(prompt) -> line | nil (end) | nil, "interrupted"; add_history(line).
-- opts: env (default _G), stdout, stderr (files, for tests).
function repl.run(readline, add_history, opts)
  opts = opts or {}
  local state = repl.new(opts)
  local out, err_out = opts.stdout or io.stdout, opts.stderr or io.stderr
  repl.env = state.env
  install_help(state.env)
  while true do
    -- Protected: a Ctrl-C that lands between two evaluations must not end the REPL.
    local ok, done = xpcall(function() return step(state, readline, add_history, out, err_out) end, message_handler)
    if ok and done then break end
    if not ok then
      repl.reset(state)
      err_out:write(error_text(done), "\n")
      err_out:flush()
    end
  end
  repl.env = nil
end

return repl
