-- kiln.ui: what a training script shows: a progress bar (redrawn in place on a terminal, plain log
-- lines elsewhere), metrics as JSON lines, and log lines that do not tear the bar.
--   local bar = ui.progress{total = kiln.data.num_batches(ds, opts), desc = "epoch 1"}
--   for i, x, y in kiln.data.batches(ds, opts) do ...; bar:update(1, {loss = loss:item()}) end
--   bar:close()
--   ui.json{epoch = 1, loss = 0.31, acc = 0.89}
local ffi = require "ffi"
local core = require "kiln.core"
local json = require "kiln.json"
local metrics = require "kiln.metrics"

local ui = {}

-- The C calls under names of our own, so that no other ffi.cdef of isatty or clock_gettime clashes.
pcall(ffi.cdef, [[
int kiln_ui_isatty(int fd) __asm__("isatty");
int kiln_ui_ioctl(int fd, unsigned long request, ...) __asm__("ioctl");
]])
local C = ffi.C
local TIOCGWINSZ = 0x5413
local is_tensor = core.is_tensor

-- Seconds on a monotonic clock.
ui.clock = core.clock

-- Whether file descriptor fd (1: standard output) is a terminal.
function ui.isatty(fd) return C.kiln_ui_isatty(fd or 1) == 1 end

local function columns(fd)
  local ws = ffi.new("unsigned short[4]")
  if C.kiln_ui_ioctl(fd, TIOCGWINSZ, ws) == 0 and ws[1] > 0 then return ws[1] end
  return tonumber(os.getenv("COLUMNS")) or 80
end

-- ---- JSON ----

-- One line of JSON (kiln.json): numbers (NaN and infinities become null), strings, booleans,
-- nested tables and tensors.
ui.json_encode = json.encode

-- ---- output that knows about the bar on the terminal ----

local active = nil   -- the progress bar drawn on the terminal, if any

local function write_line(out, line)
  if active and active.out == out then
    out:write("\r\27[K", line, "\n")
    active:draw(true)
  else
    out:write(line, "\n")
  end
  out:flush()
end

-- ui.json(tbl [, file]): the JSON line of tbl, on standard output or file (a path to append to, or a
-- file handle).
function ui.json(tbl, file)
  local line = ui.json_encode(tbl)
  if type(file) == "string" then
    local f = assert(io.open(file, "a"))
    f:write(line, "\n")
    f:close()
  else
    write_line(file or io.stdout, line)
  end
  return line
end

-- ui.metrics(path [, {mode = "a"}]): a logger appending one JSON line per log{...} call, each
-- with a time field and flushed at once (kiln.metrics).
ui.metrics = metrics.open

-- ui.log(fmt, ...): a formatted line on standard output (fmt is printed as is when alone).
function ui.log(fmt, ...)
  local line = select("#", ...) > 0 and string.format(fmt, ...) or tostring(fmt)
  write_line(io.stdout, line)
end

-- ---- command-line options ----

-- The usage of the script that called parse_args: its opening comment block (every script under
-- examples/ starts with one, usage lines included), without the comment marks; nil when none.
local function script_usage(source)
  if type(source) ~= "string" or source:sub(1, 1) ~= "@" then return nil end
  local f = io.open(source:sub(2))
  if not f then return nil end
  local lines = {}
  for line in f:lines() do
    if (#lines == 0 and line:match("^#!")) or line:match("^%-%- %%%%") then -- a shebang line, a cell marker
    elseif line:match("^%-%-") then lines[#lines + 1] = (line:gsub("^%-%- ?", ""))
    else break end
  end
  f:close()
  return #lines > 0 and table.concat(lines, "\n") or nil
end

local function numbers_set(list)
  local set = {}
  for _, k in ipairs(list) do set[k] = true end
  return set
end

-- The help of parse_args' spec: the script's usage, then every option with its default.
local function help_text(spec, source)
  local name, defaults, flags = spec.name or "kiln", spec.defaults or {}, spec.flags or {}
  local out = {script_usage(source) or ("usage: kiln " .. name .. ".lua [--option value ...]"), "", "options:"}
  local keys, seen = {}, {}
  local function add(k) if not seen[k] then seen[k] = true keys[#keys + 1] = k end end
  for k in pairs(defaults) do add(k) end
  for k in pairs(flags) do add((k:gsub("%-", "_"))) end
  if type(spec.strict) == "table" then for _, k in ipairs(spec.strict) do add(k) end end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local opt = "--" .. k:gsub("_", "-")
    if flags[k] or flags[opt:sub(3)] then out[#out + 1] = "  " .. opt
    elseif defaults[k] ~= nil then out[#out + 1] = string.format("  %s %s (default %s)", opt, type(defaults[k]) == "number" and "N" or "VALUE", tostring(defaults[k]))
    else out[#out + 1] = string.format("  %s %s", opt, (spec.numbers and numbers_set(spec.numbers)[k]) and "N" or "VALUE") end
  end
  out[#out + 1] = "  --help, -h (this text)"
  return table.concat(out, "\n")
end

-- A bad command line: one line on standard error naming the problem, and exit status 2 (no
-- traceback: the user typed it, no code of theirs failed).
function ui.usage_error(name, msg)
  io.stderr:write(string.format("%s: %s (--help lists the options)\n", name or "kiln", msg))
  io.stderr:flush()
  os.exit(2)
end

-- ui.parse_args(arg, {name =, defaults =, flags =, strict =, numbers =, raise =}) -> options: "--key value"
-- and "--key=value" (dashes in keys become underscores, numbers become numbers), and for the keys in
-- flags "--key" alone (true). defaults fill what is not given, and a key whose default is a number
-- (or that numbers lists) takes numbers only; with strict, a key that is neither in defaults nor in flags nor in strict (a
-- list of further keys) is an error naming it (and the one meant). --help or -h prints the calling
-- script's opening comment and the options with their defaults, and exits. A bad argument is one
-- line on standard error and exit status 2 (ui.usage_error); with raise = true, an error instead.
function ui.parse_args(args, spec)
  spec = spec or {}
  local name, flags, defaults = spec.name or "kiln", spec.flags or {}, spec.defaults or {}
  local numbers = {}
  for _, k in ipairs(spec.numbers or {}) do numbers[k] = true end
  local function fail(msg)
    if spec.raise then error(name .. ": " .. msg, 0) end
    ui.usage_error(name, msg)
  end
  local known
  if spec.strict then
    known = {}
    for k in pairs(defaults) do known[k] = true end
    for k in pairs(flags) do known[(k:gsub("%-", "_"))] = true end
    if type(spec.strict) == "table" then for _, k in ipairs(spec.strict) do known[k] = true end end
  end
  local o, i = {}, 1
  args = args or {}
  while i <= #args do
    if args[i] == "--help" or args[i] == "-h" then
      if spec.raise then error(name .. ": --help", 0) end
      io.stdout:write(help_text(spec, debug.getinfo(2, "S").source), "\n")
      io.stdout:flush()
      os.exit(0)
    end
    local k, v = args[i]:match("^%-%-([%w%-]+)=?(.*)$")
    if not k then fail("unexpected argument " .. args[i]) end
    local key = k:gsub("%-", "_")
    if known and not known[key] then
      local near = core.closest(key, known)
      fail("unknown option --" .. k .. (near and ("; did you mean --" .. near:gsub("_", "-") .. "?") or ""))
    end
    if v == "" and (flags[k] or flags[key]) then v = "true"
    elseif v == "" then i = i + 1 v = args[i] end
    if v == nil then fail("--" .. k .. " needs a value") end
    if (type(defaults[key]) == "number" or numbers[key]) and tonumber(v) == nil then
      fail(string.format("--%s needs a number, got %q", k, v))
    end
    o[key] = tonumber(v) or v
    i = i + 1
  end
  for k, v in pairs(defaults) do if o[k] == nil then o[k] = v end end
  return o
end

-- ---- progress ----

local function duration(s)
  if s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return string.format("%d:%02d:%02d", s / 3600, s % 3600 / 60, s % 60) end
  return string.format("%02d:%02d", s / 60, s % 60)
end

local function rate_string(r)
  if r >= 99.95 then return string.format("%.0f", r) end
  if r >= 9.995 then return string.format("%.1f", r) end
  return string.format("%.2f", r)
end

local function field_string(v)
  if is_tensor(v) and v:numel() == 1 then v = v:item() end
  if type(v) == "number" then
    if v == math.floor(v) and math.abs(v) < 1e15 then return string.format("%d", v) end
    return string.format("%.4g", v)
  end
  return tostring(v)
end

local Bar = {}
Bar.__index = Bar

-- ui.progress{total = n, desc = "train", unit = "it", out = io.stdout, tty = (auto), interval = 10,
--             width = (the terminal's), clock = ui.clock}: on a terminal a one-line bar redrawn with \r (done/total,
-- percentage, items/s, ETA, fields); elsewhere a plain line at most every `interval` seconds or
-- every 10%, and a final line at close. Under kiln launch (a rank's output is a terminal that
-- mpirun forwards line by line, prefixed) it is the plain form.
function ui.progress(opts)
  opts = opts or {}
  local out = opts.out or io.stdout
  local tty = opts.tty
  if tty == nil then tty = out == io.stdout and ui.isatty(1) and not os.getenv("KILN_LAUNCHED") end
  local clock = opts.clock or ui.clock
  local self = setmetatable({
    total = opts.total, desc = opts.desc, unit = opts.unit or "it", out = out, tty = tty, clock = clock,
    interval = opts.interval or 10, done = 0, fields = {}, closed = false,
  }, Bar)
  self.start = clock()
  self.last_draw = -math.huge
  self.last_line, self.last_tenth = self.start, 0
  if tty then
    if active and active ~= self then active:close() end
    active = self
    self.width = opts.width or columns(1)
    self:draw(true)
  end
  return self
end

-- Seconds since the start, items per second, and the fields as "k=v k=v" (keys sorted).
function Bar:status(now)
  local elapsed = now - self.start
  local rate = elapsed > 0 and self.done / elapsed or 0
  local fields = {}
  local keys = {}
  for k in pairs(self.fields) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do fields[#fields + 1] = k .. "=" .. field_string(self.fields[k]) end
  return elapsed, rate, table.concat(fields, " ")
end

function Bar:line(now, final)
  local elapsed, rate, fields = self:status(now)
  local head = self.desc and (self.desc .. " ") or ""
  local s
  if self.total then
    local pct = self.total > 0 and 100 * self.done / self.total or 100
    local left = rate > 0 and (self.total - self.done) / rate or math.huge
    if final then
      s = string.format("%s%d/%d (%d%%) in %s, %s %s/s", head, self.done, self.total, pct, duration(elapsed),
                        rate_string(rate), self.unit)
    else
      s = string.format("%s%d/%d (%d%%) %s %s/s, eta %s", head, self.done, self.total, pct, rate_string(rate),
                        self.unit, duration(left))
    end
  else
    s = string.format("%s%d %s in %s, %s %s/s", head, self.done, self.unit, duration(elapsed), rate_string(rate), self.unit)
  end
  if fields ~= "" then s = s .. (final and ", " or " ") .. fields end
  return s
end

-- The terminal form: "desc  42%|########            | 420/1000 [00:03<00:04, 140 it/s] loss=0.31"
function Bar:tty_line(now)
  local elapsed, rate, fields = self:status(now)
  local head = self.desc and (self.desc .. " ") or ""
  local s
  local max = (self.width or 80) - 1
  local tail = fields ~= "" and (" " .. fields) or ""
  if self.total then
    local frac = self.total > 0 and math.min(self.done / self.total, 1) or 1
    local left = rate > 0 and math.max(self.total - self.done, 0) / rate or math.huge
    local pct = string.format("%s%3d%%", head, math.floor(100 * frac))
    local counts = string.format(" %d/%d [%s<%s, %s %s/s]", self.done, self.total, duration(elapsed), duration(left),
                                 rate_string(rate), self.unit)
    -- The bar gives way to the numbers and fields on a narrow terminal.
    local width = math.min(20, max - #pct - #counts - #tail - 2)
    if width >= 5 then
      local filled = math.floor(frac * width + 1e-9)
      s = pct .. "|" .. string.rep("#", filled) .. string.rep(" ", width - filled) .. "|" .. counts .. tail
    else
      s = pct .. counts .. tail
    end
  else
    s = string.format("%s%d %s [%s, %s %s/s]", head, self.done, self.unit, duration(elapsed), rate_string(rate), self.unit) .. tail
  end
  if #s > max then s = s:sub(1, max) end
  return s
end

-- Redraw on the terminal (at most 10 times a second unless forced).
function Bar:draw(force)
  if not self.tty or self.closed then return end
  local now = self.clock()
  if not force and now - self.last_draw < 0.1 then return end
  self.last_draw = now
  self.out:write("\r", self:tty_line(now), "\27[K")
  self.out:flush()
end

-- bar:update(n = 1, {loss = ..., ...}): n more items done; fields replace the shown values.
function Bar:update(n, fields)
  if type(n) == "table" then n, fields = nil, n end
  if self.closed then return self end
  self.done = self.done + (n or 1)
  if fields then for k, v in pairs(fields) do self.fields[k] = v end end
  if self.tty then
    self:draw(self.total ~= nil and self.done >= self.total)
    return self
  end
  local now = self.clock()
  local tenth = self.total and self.total > 0 and math.floor(self.done * 10 / self.total) or 0
  if (tenth > self.last_tenth and self.done < self.total) or now - self.last_line >= self.interval then
    self.last_line, self.last_tenth = now, tenth
    self.last_text = self:line(now, false)
    self.out:write(self.last_text, "\n")
    self.out:flush()
  end
  return self
end

-- The final state: the bar drawn once more and a newline on a terminal, a summary line elsewhere.
function Bar:close()
  if self.closed then return end
  local now = self.clock()
  if self.tty then
    self.out:write("\r", self:tty_line(now), "\27[K\n")
    if active == self then active = nil end
  else
    local line = self:line(now, true)
    if line ~= self.last_text then self.out:write(line, "\n") end
  end
  self.out:flush()
  self.closed = true
end

return ui
