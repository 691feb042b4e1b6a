-- kiln.nb.sweep: every combination of parameter lists (-p lr=0.1,0.01 -p seed=1,2), each run by
-- `kiln nb run` in a kiln process of its own, then one report comparing them: the curves of what
-- the notebooks logged, overlaid, and a table of parameters, status and final metrics.
local ffi = require "ffi"
local params = require "kiln.nb.params"
local report = require "kiln.nb.report"
local runner = require "kiln.nb.run"
local plot = require "kiln.plot"
local display = require "kiln.display"
local ok_cjson, cjson = pcall(require, "cjson")

local M = {}

pcall(ffi.cdef, "long kiln_nb_readlink(const char *path, char *buf, unsigned long size) __asm__(\"readlink\");")

-- This kiln's executable, for the runs.
local function launcher()
  local buf = ffi.new("char[4096]")
  local n = ffi.C.kiln_nb_readlink("/proc/self/exe", buf, 4096)
  if n <= 0 then error("kiln nb sweep: cannot find the kiln executable (/proc/self/exe)", 0) end
  return ffi.string(buf, n)
end

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function stem(path) return (path:match("([^/]*)$"):gsub("%.[^.]*$", "")) end

-- Every combination, the first parameter varying slowest: lists of {name, text, value}.
function M.combinations(lists)
  local out = {{}}
  for _, p in ipairs(lists) do
    local next_out = {}
    for _, combo in ipairs(out) do
      for _, item in ipairs(p.items) do
        local c = {unpack(combo)}
        c[#c + 1] = {name = p.name, text = item.text, value = item.value}
        next_out[#next_out + 1] = c
      end
    end
    out = next_out
  end
  return out
end

local function label_of(combo)
  local parts = {}
  for _, p in ipairs(combo) do parts[#parts + 1] = p.name .. "=" .. p.text end
  return table.concat(parts, ", ")
end

local function read_rows(path)
  local rows = {}
  local f = io.open(path)
  if not f then return rows end
  for line in f:lines() do
    if line:match("%S") then
      local ok, row = pcall(cjson.decode, line)
      if ok and type(row) == "table" then rows[#rows + 1] = row end
    end
  end
  f:close()
  return rows
end

local SKIP = {step = true, epoch = true, time = true}

-- The comparison page of the runs {label, combo, record (the index line), rows}.
function M.html(file, runs)
  local esc = display.escape
  local keys, seen = {}, {}
  for _, r in ipairs(runs) do
    for _, row in ipairs(r.rows) do
      for k, v in pairs(row) do
        if type(v) == "number" and not SKIP[k] and not seen[k] then seen[k] = true keys[#keys + 1] = k end
      end
    end
  end
  table.sort(keys)
  local parts = {'<h1 class="kiln-title">sweep of ' .. esc(file) .. "</h1>"}
  -- the table of final metrics
  local finals = {}
  for _, r in ipairs(runs) do
    for k, v in pairs(r.record and r.record.metrics or {}) do if type(v) == "number" and not SKIP[k] then finals[k] = true end end
  end
  local fkeys = {}
  for k in pairs(finals) do fkeys[#fkeys + 1] = k end
  table.sort(fkeys)
  local t = {'<table class="kiln-table"><tr><th>run</th>'}
  for _, p in ipairs(runs[1] and runs[1].combo or {}) do t[#t + 1] = "<th>" .. esc(p.name) .. "</th>" end
  t[#t + 1] = "<th>status</th>"
  for _, k in ipairs(fkeys) do t[#t + 1] = "<th>" .. esc(k) .. "</th>" end
  t[#t + 1] = "<th>report</th></tr>"
  for i, r in ipairs(runs) do
    t[#t + 1] = "<tr><td>" .. i .. "</td>"
    for _, p in ipairs(r.combo) do t[#t + 1] = "<td><code>" .. esc(p.text) .. "</code></td>" end
    local status = r.record and r.record.status or "did not finish"
    t[#t + 1] = string.format('<td class="%s">%s</td>', status == "ok" and "kiln-status-ok" or "kiln-status-bad", esc(status))
    for _, k in ipairs(fkeys) do
      local v = r.record and r.record.metrics and r.record.metrics[k]
      t[#t + 1] = "<td>" .. (type(v) == "number" and string.format("%.5g", v) or "") .. "</td>"
    end
    t[#t + 1] = string.format('<td><a href="%s">%s</a></td></tr>', esc(r.report_name), esc(r.report_name))
  end
  t[#t + 1] = "</table>"
  parts[#parts + 1] = table.concat(t)
  -- the curves, runs overlaid
  for _, key in ipairs(keys) do
    local series, positive = {}, true
    for _, r in ipairs(runs) do
      local xs, ys = {}, {}
      for i, row in ipairs(r.rows) do
        if type(row[key]) == "number" then
          xs[#xs + 1] = type(row.step) == "number" and row.step or i
          ys[#ys + 1] = row[key]
          if row[key] <= 0 then positive = false end
        end
      end
      if #ys > 0 then series[#series + 1] = {x = xs, y = ys, label = r.label} end
    end
    if #series > 0 then
      local many = 0
      for _, s in ipairs(series) do many = math.max(many, #s.y) end
      local p = plot.line(series, {title = key, xlabel = "step", ylabel = key, legend = true,
                                   log = key:find("loss") ~= nil and positive or nil, smooth = many > 50 and 0.6 or nil})
      parts[#parts + 1] = '<div class="kiln-out">' .. report.inline_svg(p:svg()) .. "</div>"
    end
  end
  return report.page("sweep of " .. file, table.concat(parts, "\n"))
end

-- Runs every combination; opts as kiln nb run's (params are lists). Returns {exit =, runs =, report =}.
function M.sweep(file, opts)
  if not ok_cjson then error("kiln nb sweep: lua-cjson is not installed (Debian: lua-cjson)", 0) end
  opts = opts or {}
  local lists = params.parse_args(opts.params or {}, true)
  if #lists == 0 then error("kiln nb sweep: no parameters to sweep (-p name=v1,v2,...)", 0) end
  local f = io.open(file)
  if not f then error("kiln nb sweep: cannot read " .. file, 0) end
  f:close()
  local dir = opts.out or ("runs/" .. stem(file) .. "-sweep")
  local index = opts.index or (dir .. "/runs.jsonl")
  os.execute("mkdir -p " .. quote(dir))
  local exe = launcher()
  local combos = M.combinations(lists)
  local runs, failed = {}, 0
  for i, combo in ipairs(combos) do
    local name = string.format("%s-%d", stem(file), i)
    local args = {}
    for _, p in ipairs(combo) do args[#args + 1] = "-p " .. quote(p.name .. "=" .. p.text) end
    local paths = runner.paths(file, dir .. "/" .. name .. ".ipynb", index)
    io.stderr:write(string.format("kiln nb sweep: run %d of %d: %s\n", i, #combos, label_of(combo)))
    local cmd = string.format("%s nb run %s %s -o %s --index %s%s", quote(exe), quote(file), table.concat(args, " "),
                              quote(paths.notebook), quote(index), opts.timeout and (" --timeout " .. opts.timeout) or "")
    local status = os.execute(cmd)
    if status ~= 0 and status ~= true then failed = failed + 1 end
    local record
    for _, line in ipairs(read_rows(index)) do if line.notebook == paths.notebook then record = line end end
    runs[#runs + 1] = {label = label_of(combo), combo = combo, record = record, rows = read_rows(paths.metrics),
                       report_name = name .. ".html"}
  end
  local out = dir .. "/sweep.html"
  local g, err = io.open(out, "wb")
  if not g then error("kiln nb sweep: cannot write " .. tostring(err), 0) end
  g:write(M.html(file, runs))
  g:close()
  io.stderr:write(string.format("kiln nb sweep: %d runs, %d failed; %s\n", #runs, failed, out))
  return {exit = failed == 0 and 0 or 1, runs = runs, report = out}
end

return M
