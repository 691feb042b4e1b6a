-- kiln.metrics: a training log as JSON lines, one object per call, for plots and reports.
--   local metrics = kiln.ui.metrics("runs/a/metrics.jsonl")
--   metrics:log{step = step, epoch = epoch, loss = loss, lr = lr, samples_per_s = rate}
--   metrics:close()
-- Each line gets "time" (seconds since 1970, UTC, to the microsecond) unless given. Numbers are
-- written so that they read back as the same double; lines are appended and flushed at once, so a
-- run killed at any moment leaves every line it logged (a resumed run appends after them).
local ffi = require "ffi"
local json = require "kiln.json"
local core = require "kiln.core"
local ok_cjson, cjson = pcall(require, "cjson")   -- lua-cjson reads the files back (M.read)

local M = {}

-- Called as on_log(path, row) after each line a logger writes, when set (kiln nb run collects the
-- metrics of a notebook this way).
M.on_log = nil

pcall(ffi.cdef, "int kiln_metrics_clock_gettime(int clock, long *ts) __asm__(\"clock_gettime\");")
local CLOCK_REALTIME = 0
local ts = ffi.new("long[2]")

-- Wall-clock seconds since the Unix epoch.
function M.time()
  ffi.C.kiln_metrics_clock_gettime(CLOCK_REALTIME, ts)
  return tonumber(ts[0]) + math.floor(tonumber(ts[1]) / 1000) * 1e-6
end

local Logger = {}
Logger.__index = Logger

-- metrics.open(path [, {mode = "a"}]): "a" appends (the default), "w" starts the file afresh.
function M.open(path, opts)
  if type(path) ~= "string" then error("metrics: the path must be a string, got " .. type(path), 2) end
  local mode = (opts and opts.mode) or "a"
  if mode ~= "a" and mode ~= "w" then error("metrics: mode must be \"a\" or \"w\", got " .. tostring(mode), 2) end
  -- a FIFO, a directory or a device would block io.open or take the lines: only a regular file,
  -- or one that does not exist yet
  if core.C.kiln_file_check("metrics", path) ~= 0 then
    local msg = ffi.string(core.C.kiln_error_message())
    if not msg:find("No such file or directory", 1, true) then error(msg, 2) end
  end
  local f, err = io.open(path, mode)
  if not f then error("metrics: cannot open " .. path .. ": " .. tostring(err), 2) end
  return setmetatable({path = path, file = f}, Logger)
end

-- log{...}: one JSON line (keys sorted; tensors of one element become numbers); returns the line.
function Logger:log(fields)
  if type(fields) ~= "table" then error("metrics:log: expected a table of fields, got " .. type(fields), 2) end
  if not self.file then error("metrics:log: the logger of " .. self.path .. " is closed", 2) end
  local row = {}
  for k, v in pairs(fields) do row[k] = v end
  if row.time == nil then row.time = M.time() end
  local ok, line = pcall(json.encode, row)
  if not ok then error("metrics:log: " .. tostring(line), 2) end
  self.file:write(line, "\n")
  self.file:flush()
  if M.on_log then M.on_log(self.path, row) end
  return line
end

function Logger:close()
  if self.file then self.file:close() end
  self.file = nil
end

-- Every line of a metrics file, decoded (lua-cjson), for tests and reports.
function M.read(path)
  if not ok_cjson then error("metrics.read: lua-cjson is not installed (Debian: lua-cjson)", 2) end
  if type(path) ~= "string" then error("metrics.read: the path must be a string, got " .. type(path), 2) end
  if core.C.kiln_file_check("metrics.read", path) ~= 0 then error(ffi.string(core.C.kiln_error_message()), 2) end
  local rows = {}
  for line in io.lines(path) do
    if line:match("%S") then rows[#rows + 1] = cjson.decode(line) end
  end
  return rows
end

return M
