-- kiln.nb.run: runs a notebook's code cells in this Lua state, as one chunk, so that a `local`
-- of one cell is seen by the next exactly as when the cell script runs as a script. Each cell ends
-- with a yield; between cells the runner collects the cell's outputs (print and io.write as
-- "stream", kiln.display as "display_data", the value of a last line that is an expression as
-- "execute_result", an error as "error" with its traceback and cell), and writes the files.
local cells = require "kiln.nb.cells"
local params = require "kiln.nb.params"
local report = require "kiln.nb.report"
local display = require "kiln.display"
local metrics = require "kiln.metrics"
local json = require "kiln.json"
local ok_rl, readline = pcall(require, "kiln.readline")   -- the launcher's: time limits, Ctrl-C

local M = {}

local CHUNK = "kiln_nb"   -- the chunk's name in messages, relabelled with the cell and line

local function interrupt_caught()
  if ok_rl and readline.interrupt_caught then readline.interrupt_caught() end
end

local function interrupt_after(seconds)
  if ok_rl and readline.interrupt_after then readline.interrupt_after(seconds) end
end

local function iso_time(t)
  return os.date("!%Y-%m-%dT%H:%M:%S", math.floor(t)) .. string.format(".%03dZ", math.floor((t % 1) * 1000))
end

local function write_file(path, text)
  local f, err = io.open(path, "wb")
  if not f then error("kiln nb: cannot write " .. tostring(err), 0) end
  f:write(text)
  f:close()
end

local function dirname(path) return path:match("^(.*)/[^/]*$") or "." end
local function basename(path) return path:match("([^/]*)$") end
local function stem(path) return (basename(path):gsub("%.[^.]*$", "")) end

local function mkdir_p(dir)
  if dir == "" or dir == "." then return end
  local ok = os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'")
  if ok ~= 0 and ok ~= true then error("kiln nb: cannot create the folder " .. dir, 0) end
end

-- Where a run writes: -o DIR (the default runs/<stem>) or -o NAME.ipynb.
function M.paths(file, out, index)
  local nb_path
  if out and out:match("%.ipynb$") then nb_path = out
  else nb_path = (out or ("runs/" .. stem(file))) .. "/" .. stem(file) .. ".ipynb" end
  local base = nb_path:gsub("%.ipynb$", "")
  return {dir = dirname(nb_path), notebook = nb_path, report = base .. ".html", metrics = base .. ".metrics.jsonl",
          index = index or (dirname(nb_path) .. "/runs.jsonl")}
end

-- ---- the chunk ----

local function split_lines(s)
  local list = {}
  for line in (s .. "\n"):gmatch("([^\n]*)\n") do list[#list + 1] = line end
  return list
end

-- The cell's lines; a last line that reads as an expression becomes __kiln_nb_result(<it>),
-- which shows its value and returns it (so that a call stays a call).
local function cell_lines(source)
  local lines = split_lines(source)
  local last = #lines
  while last > 0 and (not lines[last]:match("%S") or lines[last]:match("^%s*%-%-")) do last = last - 1 end
  if last > 0 then
    local expr = lines[last]:gsub(";%s*$", "")
    if not expr:match("^%s*%-%-") and loadstring("return " .. expr) then
      local copy = {unpack(lines)}
      copy[last] = "__kiln_nb_result(" .. expr .. ")"
      if loadstring("local __kiln_nb_result = ...\n" .. table.concat(copy, "\n")) then return copy end
    end
  end
  return lines
end

-- The chunk of code cells order[1..n] and its line map: chunk line -> {cell, line in cell}.
local function build_chunk(nb, order, n)
  local lines, map = {"local __kiln_nb_yield, __kiln_nb_result = ..."}, {}
  for i = 1, n do
    local k = order[i]
    local src = cell_lines(nb.cells[k].source)
    for j, l in ipairs(src) do
      lines[#lines + 1] = l
      map[#lines] = {k, j}
    end
    lines[#lines + 1] = "__kiln_nb_yield(" .. k .. ")"
    map[#lines] = {k, #src}
  end
  return table.concat(lines, "\n"), map
end

-- "kiln-nb:12:" -> "file.lua:40 (cell 3):" or "notebook.ipynb cell 3, line 2:".
local function relabel(text, nb, map)
  return (text:gsub(CHUNK .. ":(%d+):", function(n)
    local at = map[tonumber(n)]
    if not at then return nb.source .. ":" end
    local c = nb.cells[at[1]]
    if c.injected then return string.format("injected parameters, line %d:", at[2]) end
    if nb.from_script then return string.format("%s:%d (cell %d):", nb.source, c.line + at[2] - 1, at[1]) end
    return string.format("%s cell %d, line %d:", nb.source, at[1], at[2])
  end))
end

-- ---- output capture ----

local function error_text(err)
  if type(err) == "string" then return err end
  local ok, s = pcall(tostring, err)
  if ok and type(s) == "string" then return s end
  return "(error object is a " .. type(err) .. " value)"
end

local Capture = {}
Capture.__index = Capture

function Capture.new() return setmetatable({outputs = {}}, Capture) end

function Capture:text(s)
  local last = self.outputs[#self.outputs]
  if last and last.output_type == "stream" then last._text[#last._text + 1] = s
  else self.outputs[#self.outputs + 1] = {output_type = "stream", name = "stdout", _text = {s}} end
end

function Capture:bundle(b, kind, count)
  local data = {}
  for k, v in pairs(b) do data[k] = (k == "application/json") and v or cells.multiline(v) end
  local o = {output_type = kind or "display_data", data = data, metadata = {}}
  if kind == "execute_result" then o.execution_count = count end
  self.outputs[#self.outputs + 1] = o
end

function Capture:error(ename, evalue, traceback)
  self.outputs[#self.outputs + 1] = {output_type = "error", ename = ename, evalue = evalue,
                                     traceback = cells.array(split_lines(traceback))}
end

-- The outputs as nbformat wants them.
function Capture:finish()
  local list = cells.array()
  for _, o in ipairs(self.outputs) do
    if o._text then
      list[#list + 1] = {output_type = "stream", name = o.name, text = cells.multiline(table.concat(o._text))}
    else
      list[#list + 1] = o
    end
  end
  return list
end

-- Replaces print, io.write and io.stdout while fn runs.
local function captured(capture, fn, ...)
  local real_print, real_write, real_stdout = print, io.write, io.stdout
  local proxy = {}
  function proxy.write(_, ...)
    local n = select("#", ...)
    for i = 1, n do capture:text(tostring((select(i, ...)))) end
    return proxy
  end
  function proxy.flush() return proxy end
  function proxy.setvbuf() return true end
  function proxy.close() return nil, "cannot close standard output" end
  setmetatable(proxy, {__index = function(_, k)
    local f = real_stdout[k]
    if type(f) == "function" then return function(_, ...) return f(real_stdout, ...) end end
    return f
  end, __tostring = function() return tostring(real_stdout) end})
  _G.print = function(...)
    local n, parts = select("#", ...), {}
    for i = 1, n do parts[i] = tostring((select(i, ...))) end
    capture:text(table.concat(parts, "\t") .. "\n")
  end
  io.write = function(...) return proxy.write(proxy, ...) end
  io.stdout = proxy
  local old_sink = display.sink
  display.sink = function(b) capture:bundle(b) end
  local r = {pcall(fn, ...)}
  _G.print, io.write, io.stdout, display.sink = real_print, real_write, real_stdout, old_sink
  if not r[1] then error(r[2], 0) end
  return unpack(r, 2, table.maxn(r))
end

-- ---- running ----

-- The notebook with the injected parameters cell. Returns nb, the unknown names.
local function inject(nb, values)
  if #values == 0 then return nb, {} end
  local at, declared
  for k, c in ipairs(nb.cells) do
    if c.cell_type == "code" and cells.has_tag(c, "parameters") then at, declared = k, params.declared(c.source) end
  end
  local source, unknown = params.injected_source(values, declared or {})
  if not at then unknown = {} for _, v in ipairs(values) do unknown[#unknown + 1] = v.name end end
  local cell = {cell_type = "code", source = source, metadata = {tags = {"injected-parameters"}}, injected = true, line = 1}
  table.insert(nb.cells, (at or 0) + 1, cell)
  return nb, unknown, at == nil
end

-- Runs file with opts {params = {"name=value", ...}, out =, index =, timeout =, log = io.stderr};
-- returns the run's record {status =, exit =, paths =, metrics =, ...}. Errors before anything runs
-- (a bad file or parameter) are raised.
function M.run(file, opts)
  opts = opts or {}
  local log = opts.log or io.stderr
  local values = {}
  for _, p in ipairs(params.parse_args(opts.params or {}, false)) do
    values[#values + 1] = {name = p.name, text = p.items[1].text, value = p.items[1].value}
  end
  local nb = cells.read(file)
  nb.from_script = not file:match("%.ipynb$")
  local unknown, no_cell
  nb, unknown, no_cell = inject(nb, values)
  if no_cell then
    log:write("kiln nb: warning: ", file, " has no cell tagged parameters; the parameters go first\n")
  end
  for _, name in ipairs(unknown) do
    if not no_cell then log:write("kiln nb: warning: ", name, " is not set in the parameters cell of ", file, "\n") end
  end
  local paths = M.paths(file, opts.out, opts.index)
  mkdir_p(paths.dir)
  mkdir_p(dirname(paths.index))

  local order = {}
  for k, c in ipairs(nb.cells) do if c.cell_type == "code" then order[#order + 1] = k end end

  -- A cell that does not compile: the cells before it run, and it gets the syntax error.
  local n_ok, syntax_error = #order, nil
  local chunk, map = build_chunk(nb, order, n_ok)
  local fn, err = loadstring(chunk, "=" .. CHUNK)
  if not fn then
    syntax_error = relabel(err, nb, map)
    n_ok = 0
    for i = #order - 1, 0, -1 do
      local c2, m2 = build_chunk(nb, order, i)
      local f2 = loadstring(c2, "=" .. CHUNK)
      if f2 then fn, chunk, map, n_ok = f2, c2, m2, i break end
    end
  end

  local record = {file = file, parameters = {}, status = "ok", paths = paths}
  for _, v in ipairs(values) do record.parameters[v.name] = v.value end
  local start = metrics.time()
  record.start = iso_time(start)
  local rows = {}
  local old_on_log = metrics.on_log
  metrics.on_log = function(path, row)
    rows[#rows + 1] = row
    if old_on_log then old_on_log(path, row) end
  end
  local final = {}

  local count = 0
  local function save(running)
    local info = {file = file, parameters = values, status = record.status, start = record.start,
                  ["end"] = record["end"], running = running}
    nb.metadata.kiln = {parameters = record.parameters, start = record.start, ["end"] = record["end"] or cells.null,
                        status = running and "running" or record.status, source = file}
    write_file(paths.notebook, cells.to_ipynb(nb))
    write_file(paths.report, report.html(nb, info))
  end

  -- Before a cell runs, the files say what they would if kiln were stopped in it.
  local function prewrite(k)
    local c = nb.cells[k]
    c.outputs = cells.array{{output_type = "error", ename = "stopped", evalue = "cell " .. k .. " did not end",
                             traceback = cells.array{"kiln nb: cell " .. k .. " did not end: kiln was stopped while it ran (--timeout, or a signal)"}}}
    save(true)
  end

  local co = coroutine.create(function(...)
    return xpcall(fn, function(e)
      local text = error_text(e)
      if text:find("interrupted$") or text:find("timed out$") then interrupt_caught() end
      return {message = text, traceback = debug.traceback("", 2)}
    end, ...)
  end)
  local function yield_cell(k) coroutine.yield(k) end
  local capture
  local function result(...)
    if select("#", ...) > 0 and (...) ~= nil then capture:bundle(display.bundle((...)), "execute_result", count) end
    return ...
  end

  local i = 1
  while i <= n_ok do
    local k = order[i]
    count = count + 1
    nb.cells[k].execution_count = count
    prewrite(k)
    capture = Capture.new()
    if opts.timeout then interrupt_after(opts.timeout) end
    local ok, a, b
    local okc, cerr = pcall(function()
      ok, a, b = captured(capture, coroutine.resume, co, yield_cell, result)
    end)
    interrupt_after(0)
    if not okc then ok, a, b = true, false, {message = error_text(cerr), traceback = ""} end
    if not ok then a, b = false, {message = error_text(a), traceback = ""} end
    if coroutine.status(co) == "suspended" then
      nb.cells[k].outputs = capture:finish()
      i = i + 1
    elseif ok and a == true then   -- a `return` at the top level ended the chunk in cell k
      nb.cells[k].outputs = capture:finish()
      break
    else
      -- an error in cell k
      local e = type(b) == "table" and b or {message = error_text(b), traceback = ""}
      local message = relabel(e.message, nb, map)
      local ename = "error"
      if message:find("timed out$") then
        ename = "timeout"
        message = string.format("%s (cell %d ran past --timeout %g s)", message, k, opts.timeout or 0)
        record.status = "timeout"
      elseif message:find("interrupted$") then
        ename, record.status = "interrupted", "interrupted"
      else
        record.status = "error"
      end
      local tb = relabel(e.traceback, nb, map)
      -- the runner's own frames say nothing about the notebook
      local kept = {}
      for line in tb:gmatch("[^\n]+") do
        if line:find("kiln/nb/run.lua", 1, true) or line:find("in function 'xpcall'", 1, true) then break end
        if line ~= "stack traceback:" and not line:find("^%s*%[C%]: in function 'error'") and not line:find("^%s*%[builtin#") then
          kept[#kept + 1] = (line:gsub("in main chunk$", "in the notebook"))
        end
      end
      capture:error(ename, message, string.format("Error in cell %d: %s", k, message)
                    .. (#kept > 0 and ("\nstack traceback:\n" .. table.concat(kept, "\n")) or ""))
      nb.cells[k].outputs = capture:finish()
      record.error = {cell = k, message = message}
      log:write("kiln nb: ", file, ": cell ", k, ": ", message, "\n")
      break
    end
  end
  if syntax_error and record.status == "ok" then
    local k = order[n_ok + 1]
    count = count + 1
    nb.cells[k].execution_count = count
    local c = Capture.new()
    c:error("SyntaxError", syntax_error, "Error in cell " .. k .. ": " .. syntax_error)
    nb.cells[k].outputs = c:finish()
    record.status = "error"
    record.error = {cell = k, message = syntax_error}
    log:write("kiln nb: ", file, ": cell ", k, ": ", syntax_error, "\n")
  end
  metrics.on_log = old_on_log
  local stop = metrics.time()
  record["end"] = iso_time(stop)
  record.seconds = stop - start
  for _, row in ipairs(rows) do
    for key, v in pairs(row) do if key ~= "time" and type(v) == "number" then final[key] = v end end
  end
  record.metrics = final
  save(false)
  -- the metrics the notebook logged, for comparisons (kiln nb sweep)
  local lines = {}
  for _, row in ipairs(rows) do lines[#lines + 1] = json.encode(row) end
  write_file(paths.metrics, #lines > 0 and (table.concat(lines, "\n") .. "\n") or "")
  local line = json.encode({file = file, parameters = record.parameters, start = record.start, ["end"] = record["end"],
                            seconds = record.seconds, status = record.status, metrics = final,
                            notebook = paths.notebook, report = paths.report, metrics_file = paths.metrics,
                            error = record.error})
  local f, ferr = io.open(paths.index, "a")
  if not f then error("kiln nb: cannot append to the runs index: " .. tostring(ferr), 0) end
  f:write(line, "\n")
  f:close()
  record.exit = record.status == "ok" and 0 or (record.status == "timeout" and 124 or (record.status == "interrupted" and 130 or 1))
  return record
end

return M
