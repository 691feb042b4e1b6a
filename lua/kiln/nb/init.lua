-- kiln.nb: notebook-like batch runs of cell scripts (jupytext's percent format for Lua) and
-- .ipynb files: `kiln nb run`, `kiln nb sweep`, `kiln nb convert` (bindings/kiln.c calls main).
local cells = require "kiln.nb.cells"
local params = require "kiln.nb.params"
local runner = require "kiln.nb.run"
local sweep = require "kiln.nb.sweep"

local nb = {}

nb.read = cells.read
nb.run = runner.run
nb.sweep = sweep.sweep
nb.parse_literal = params.parse

nb.usage = [[
usage: kiln nb run FILE [-p name=value ...] [-o OUT] [--timeout SECONDS] [--index FILE]
       kiln nb sweep FILE -p name=v1,v2,... [-p ...] [-o DIR] [--timeout SECONDS]
       kiln nb convert FILE [-o OUT.ipynb]
FILE is a cell script (a .lua file with "-- %%" cell markers, jupytext's percent format) or an
.ipynb. Values are Lua literals: -p lr=0.01 -p model='"lenet"' -p sizes={64,32}.
run writes OUT/<name>.ipynb, OUT/<name>.html and OUT/<name>.metrics.jsonl (OUT defaults to
runs/<name>; -o X.ipynb names the notebook) and appends a line to OUT/runs.jsonl (or --index).
--timeout stops a cell that runs longer (Ctrl-C stops one too); the files keep every output so far.
sweep runs every combination of the lists, each in its own kiln, into DIR (runs/<name>-sweep),
and writes DIR/sweep.html comparing them.
]]

-- kiln nb's arguments -> command, file, options; errors say what is wrong.
function nb.parse_args(argv)
  local o = {params = {}}
  local command = argv[1]
  if command == nil or command == "-h" or command == "--help" or command == "help" then return "help" end
  if command ~= "run" and command ~= "sweep" and command ~= "convert" then
    error("kiln nb: unknown command " .. tostring(command) .. " (run, sweep or convert; kiln nb --help)", 0)
  end
  local i, file = 2, nil
  while i <= #argv do
    local a = argv[i]
    local function value()
      i = i + 1
      if argv[i] == nil then error("kiln nb: " .. a .. " needs a value", 0) end
      return argv[i]
    end
    if a == "-p" or a == "--parameter" then o.params[#o.params + 1] = value()
    elseif a:match("^%-p.") then o.params[#o.params + 1] = a:sub(3)
    elseif a == "-o" or a == "--output" then o.out = value()
    elseif a == "--index" then o.index = value()
    elseif a == "--timeout" then
      local v = value()
      o.timeout = tonumber(v)
      if not o.timeout or o.timeout <= 0 then error("kiln nb: --timeout takes a number of seconds, got " .. v, 0) end
    elseif a == "-h" or a == "--help" then return "help"
    elseif a:match("^%-") and a ~= "-" then error("kiln nb: unknown option " .. a .. " (kiln nb --help)", 0)
    elseif file == nil then file = a
    else error("kiln nb: one file at a time (" .. file .. ", then " .. a .. ")", 0) end
    i = i + 1
  end
  if not file then error("kiln nb " .. command .. ": which file? (kiln nb --help)", 0) end
  return command, file, o
end

-- The launcher's entry: returns the exit status.
function nb.main(argv)
  local ok, command, file, o = pcall(nb.parse_args, argv or {})
  if not ok then
    io.stderr:write(tostring(command), "\n")
    return 2
  end
  if command == "help" then io.stdout:write(nb.usage) return 0 end
  local ok2, result = pcall(function()
    if command == "run" then
      local r = runner.run(file, o)
      io.stderr:write(string.format("kiln nb: %s: %s in %.1f s; %s, %s\n", file, r.status, r.seconds, r.paths.notebook, r.paths.report))
      return r.exit
    elseif command == "sweep" then
      return sweep.sweep(file, o).exit
    else
      local book = cells.read(file)
      book.from_script = not file:match("%.ipynb$")
      local out = o.out or (file:gsub("%.[^./]*$", "") .. ".ipynb")
      local f, err = io.open(out, "wb")
      if not f then error("kiln nb: cannot write " .. tostring(err), 0) end
      f:write(cells.to_ipynb(book))
      f:close()
      return 0
    end
  end)
  if not ok2 then
    local msg = tostring(result)
    io.stderr:write(msg:match("^kiln") and msg or ("kiln nb: " .. msg), "\n")
    return msg:find("interrupted") and 130 or 1
  end
  return result
end

return nb
