-- Helpers of the nb_*_spec.lua specs: running `kiln nb`, temporary folders, reading JSON.
local H = require "helpers"
local cjson = require "cjson"

local M = {}

M.exe = H.kiln_exe

-- Runs a shell command; returns its output (stdout and stderr) and its exit status.
function M.sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1; echo \"exit status $?\""))
  local out = p:read("*a")
  p:close()
  local body, status = out:match("^(.*)exit status (%d+)\n$")
  return body or out, tonumber(status)
end

function M.tmpdir(tag)
  local dir = M.sh("mktemp -d /tmp/kiln-nb-" .. tag .. "-XXXXXX"):gsub("%s+$", "")
  return dir
end

function M.rmdir(dir)
  if dir and dir:match("^/tmp/kiln%-nb%-") then os.execute("rm -rf '" .. dir .. "'") end
end

function M.write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

function M.json(path) return cjson.decode((assert(M.read(path), "missing " .. path))) end

function M.lines(path)
  local rows = {}
  for line in io.lines(path) do rows[#rows + 1] = cjson.decode(line) end
  return rows
end

-- Debian's python3 with nbformat, or nil.
function M.python_with(module)
  for _, py in ipairs{"/usr/bin/python3", "python3"} do
    local _, status = M.sh(py .. " -c 'import " .. module .. "'")
    if status == 0 then return py end
  end
end

-- The text of all outputs of a code cell of an executed notebook.
function M.outputs_text(cell)
  local parts = {}
  for _, o in ipairs(cell.outputs or {}) do
    if o.text then parts[#parts + 1] = table.concat(o.text) end
    if o.data and o.data["text/plain"] then parts[#parts + 1] = table.concat(o.data["text/plain"]) end
    if o.traceback then parts[#parts + 1] = table.concat(o.traceback, "\n") end
  end
  return table.concat(parts, "\n")
end

return M
