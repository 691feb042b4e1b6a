-- kiln.plot: charts as SVG (written here) and PNG (kiln.plot.raster, then write_png): line charts
-- from the metrics logger's JSON lines (several runs overlaid, log scale, smoothing with the raw
-- curve drawn faintly, min/max-per-bucket downsampling that keeps spikes), scatter plots,
-- histograms, image grids and confusion matrices. A plot shows itself through kiln.display.
--   local p = kiln.plot.metrics("runs/a/metrics.jsonl", {y = {"loss"}, smooth = 0.9, log = true})
--   kiln.display(p); p:save("loss.svg"); p:save("loss.png")
local core = require "kiln.core"
local files = require "kiln.data.files"
local metrics = require "kiln.metrics"
local raster = require "kiln.plot.raster"

local floor, ceil, log10, max, min, abs = math.floor, math.ceil, math.log10, math.max, math.min, math.abs
local is_tensor = core.is_tensor

local plot = {}

-- Matplotlib's tab10 colours, as {r, g, b}.
plot.colors = {
  {31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}, {148, 103, 189},
  {140, 86, 75}, {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207},
}
local AXIS, GRID, TEXT = {68, 68, 68}, {225, 225, 225}, {34, 34, 34}

local function fail(what, msg) error("kiln.plot." .. what .. ": " .. msg, 3) end

local function hex(c) return string.format("#%02x%02x%02x", c[1], c[2], c[3]) end

local function escape(s)
  return (tostring(s):gsub("[&<>\"]", {["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;"}))
end

-- Numbers of a Lua list or a tensor, as a Lua list.
local function numbers(v, what, name)
  if is_tensor(v) then
    local flat = v:detach():to("cpu"):to("f64"):contiguous():view(-1)
    local ptr = core.ffi.cast("double *", flat.p.storage.data) + flat.p.offset
    local list = {}
    for i = 0, flat:numel() - 1 do list[i + 1] = ptr[i] end
    return list
  end
  if type(v) ~= "table" then fail(what, name .. " must be a list of numbers or a tensor, got " .. type(v)) end
  for i = 1, #v do
    if type(v[i]) ~= "number" then fail(what, string.format("%s[%d] is a %s, not a number", name, i, type(v[i]))) end
  end
  return v
end

-- ---- the plot object: primitives in pixels, drawn as SVG or PNG ----

local Plot = {}
Plot.__index = Plot

local function new_plot(width, height, what)
  width, height = width or 640, height or 360
  if type(width) ~= "number" or type(height) ~= "number" or width < 16 or height < 16 or width > 8192 or height > 8192 then
    fail(what, "width and height must be numbers from 16 to 8192")
  end
  return setmetatable({width = floor(width), height = floor(height), items = {}}, Plot)
end

function Plot:add(item) self.items[#self.items + 1] = item return item end

function Plot:svg()
  local out = {string.format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
                             .. 'font-family="DejaVu Sans, Arial, sans-serif" font-size="11">',
                             self.width, self.height, self.width, self.height),
               string.format('<rect width="%d" height="%d" fill="#ffffff"/>', self.width, self.height)}
  for _, it in ipairs(self.items) do
    local k = it.kind
    if k == "rect" then
      out[#out + 1] = string.format('<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s"%s%s/>', it.x, it.y, it.w, it.h,
                                    it.fill and hex(it.fill) or "none", it.alpha and it.alpha < 1 and string.format(' fill-opacity="%.3f"', it.alpha) or "",
                                    it.stroke and string.format(' stroke="%s" stroke-width="1"', hex(it.stroke)) or "")
    elseif k == "line" then
      local pts = {}
      for i = 1, #it.points, 2 do pts[#pts + 1] = string.format("%.2f,%.2f", it.points[i], it.points[i + 1]) end
      out[#out + 1] = string.format('<polyline points="%s" fill="none" stroke="%s" stroke-width="%g" stroke-linejoin="round"%s/>',
                                    table.concat(pts, " "), hex(it.color), it.width or 1,
                                    it.alpha and it.alpha < 1 and string.format(' stroke-opacity="%.3f"', it.alpha) or "")
    elseif k == "circle" then
      out[#out + 1] = string.format('<circle cx="%.2f" cy="%.2f" r="%g" fill="%s"%s/>', it.x, it.y, it.r, hex(it.color),
                                    it.alpha and it.alpha < 1 and string.format(' fill-opacity="%.3f"', it.alpha) or "")
    elseif k == "text" then
      local anchor = it.anchor and it.anchor ~= "start" and string.format(' text-anchor="%s"', it.anchor) or ""
      out[#out + 1] = string.format('<text x="%.2f" y="%.2f" fill="%s"%s%s>%s</text>', it.x, it.y, hex(it.color or TEXT), anchor,
                                    it.bold and ' font-weight="bold"' or "", escape(it.text))
    elseif k == "image" then
      out[#out + 1] = string.format('<image x="%.2f" y="%.2f" width="%d" height="%d" style="image-rendering:pixelated" '
                                    .. 'preserveAspectRatio="none" href="data:image/png;base64,%s"/>', it.x, it.y,
                                    it.image:size(3) * it.scale, it.image:size(2) * it.scale, plot.base64(plot.png_bytes(it.image)))
    end
  end
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n")
end

-- The plot drawn into an RGB u8 tensor [3,H,W].
function Plot:raster()
  local cv = raster.canvas(self.width, self.height)
  for _, it in ipairs(self.items) do
    local k = it.kind
    if k == "rect" then
      if it.fill then cv:rect(it.x, it.y, it.w, it.h, it.fill, it.alpha) end
      if it.stroke then
        cv:rect(it.x, it.y, it.w, 1, it.stroke) cv:rect(it.x, it.y + it.h - 1, it.w, 1, it.stroke)
        cv:rect(it.x, it.y, 1, it.h, it.stroke) cv:rect(it.x + it.w - 1, it.y, 1, it.h, it.stroke)
      end
    elseif k == "line" then cv:polyline(it.points, it.color, it.width or 1, it.alpha or 1)
    elseif k == "circle" then cv:circle(it.x, it.y, it.r, it.color, it.alpha or 1)
    elseif k == "text" then cv:text(it.x, it.y, it.text, it.color or TEXT, it.anchor)
    elseif k == "image" then cv:image(it.x, it.y, it.image, it.scale)
    end
  end
  return cv.tensor
end

local tmp_count = 0
-- The PNG file's bytes of a u8 image [3,H,W] (stb_image_write through kiln.data.write_png).
function plot.png_bytes(image)
  tmp_count = tmp_count + 1
  local path = os.tmpname()
  local ok, err = pcall(files.write_png, path, image)
  if not ok then os.remove(path) error(err, 0) end
  local f = assert(io.open(path, "rb"))
  local bytes = f:read("*a")
  f:close()
  os.remove(path)
  return bytes
end

function Plot:png() return plot.png_bytes(self:raster()) end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
function plot.base64(s)
  local out, n = {}, #s
  for i = 1, n, 3 do
    local a, b, c = s:byte(i, i + 2)
    local v = a * 65536 + (b or 0) * 256 + (c or 0)
    local c1, c2, c3, c4 = floor(v / 262144) % 64, floor(v / 4096) % 64, floor(v / 64) % 64, v % 64
    out[#out + 1] = B64:sub(c1 + 1, c1 + 1) .. B64:sub(c2 + 1, c2 + 1)
                    .. (b and B64:sub(c3 + 1, c3 + 1) or "=") .. (c and B64:sub(c4 + 1, c4 + 1) or "=")
  end
  return table.concat(out)
end

-- save(path): SVG or PNG by the extension.
function Plot:save(path)
  if type(path) ~= "string" then error("plot:save: the path must be a string, got " .. type(path), 2) end
  if path:match("%.png$") then
    files.write_png(path, self:raster())
  elseif path:match("%.svg$") then
    local f, err = io.open(path, "wb")
    if not f then error("plot:save: cannot write " .. tostring(err), 2) end
    f:write(self:svg(), "\n")
    f:close()
  else
    error("plot:save: " .. path .. ": the name must end in .svg or .png", 2)
  end
  return path
end

-- The display bundle: SVG, PNG (base64) and a line of text.
function Plot.__bundle(p)
  return {["text/plain"] = tostring(p), ["image/svg+xml"] = p:svg(), ["image/png"] = plot.base64(p:png())}
end

function Plot.__tostring(p)
  return string.format("<kiln.plot %s, %dx%d>", p.title or p.kind or "plot", p.width, p.height)
end

-- ---- axes ----

-- About n round tick values covering [lo, hi].
local function nice_ticks(lo, hi, n)
  if hi <= lo then hi = lo + 1 end
  local span = (hi - lo) / max(n - 1, 1)
  local mag = 10 ^ floor(log10(span))
  local step
  for _, m in ipairs{1, 2, 2.5, 5, 10} do
    step = m * mag
    if step >= span then break end
  end
  local ticks = {}
  local first = ceil(lo / step - 1e-9) * step
  for v = first, hi + step * 1e-9, step do ticks[#ticks + 1] = abs(v) < step * 1e-9 and 0 or v end
  return ticks
end

local function tick_text(v)
  if v == 0 then return "0" end
  local a = abs(v)
  if a >= 1e5 or a < 1e-3 then return (string.format("%.0e", v):gsub("e%+?(%-?)0*(%d)", "e%1%2")) end
  local s = string.format("%.4g", v)
  return s
end

-- An axes frame at the plot's inner rectangle, mapping data to pixels.
local Axes = {}
Axes.__index = Axes

local function axes(p, xlo, xhi, ylo, yhi, opts)
  opts = opts or {}
  local a = setmetatable({p = p, logx = opts.logx, logy = opts.log}, Axes)
  a.left, a.top = opts.left or 62, opts.top or (p.title and 30 or 14)
  a.right, a.bottom = p.width - (opts.right_margin or 16), p.height - (opts.xlabel and 44 or 30)
  local function tr(v, is_log) return is_log and log10(v) or v end
  a.x0, a.x1 = tr(xlo, a.logx), tr(xhi, a.logx)
  a.y0, a.y1 = tr(ylo, a.logy), tr(yhi, a.logy)
  if a.x1 == a.x0 then a.x0, a.x1 = a.x0 - 0.5, a.x1 + 0.5 end
  if a.y1 == a.y0 then a.y0, a.y1 = a.y0 - 0.5, a.y1 + 0.5 end
  return a
end

function Axes:px(x)
  if self.logx then x = log10(x) end
  return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.right - self.left)
end

function Axes:py(y)
  if self.logy then y = log10(y) end
  return self.bottom - (y - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)
end

local function log_ticks(lo, hi)
  local ticks = {}
  for e = floor(lo), ceil(hi) do
    if e >= lo - 1e-9 and e <= hi + 1e-9 then ticks[#ticks + 1] = 10 ^ e end
  end
  if #ticks < 2 then
    for e = floor(lo), ceil(hi) do
      for _, m in ipairs{2, 5} do
        local v = m * 10 ^ e
        if log10(v) >= lo and log10(v) <= hi then ticks[#ticks + 1] = v end
      end
    end
    table.sort(ticks)
  end
  return ticks
end

function Axes:draw(opts)
  local p = self.p
  opts = opts or {}
  local xt = self.logx and log_ticks(self.x0, self.x1) or nice_ticks(self.x0, self.x1, opts.xticks or 7)
  local yt = self.logy and log_ticks(self.y0, self.y1) or nice_ticks(self.y0, self.y1, opts.yticks or 6)
  for _, v in ipairs(yt) do
    local y = self:py(v)
    if y >= self.top - 0.5 and y <= self.bottom + 0.5 then
      if opts.grid ~= false then p:add{kind = "rect", x = self.left, y = floor(y), w = self.right - self.left, h = 1, fill = GRID} end
      p:add{kind = "text", x = self.left - 6, y = y + 4, text = tick_text(v), anchor = "end"}
    end
  end
  for _, v in ipairs(xt) do
    local x = self:px(v)
    if x >= self.left - 0.5 and x <= self.right + 0.5 then
      if opts.grid ~= false then p:add{kind = "rect", x = floor(x), y = self.top, w = 1, h = self.bottom - self.top, fill = GRID} end
      p:add{kind = "text", x = x, y = self.bottom + 15, text = tick_text(v), anchor = "middle"}
    end
  end
  p:add{kind = "rect", x = self.left, y = self.top, w = self.right - self.left, h = self.bottom - self.top, stroke = AXIS}
  if opts.xlabel then p:add{kind = "text", x = (self.left + self.right) / 2, y = p.height - 8, text = opts.xlabel, anchor = "middle"} end
  if opts.ylabel then p:add{kind = "text", x = 4, y = self.top - 4 > 10 and self.top - 4 or 10, text = opts.ylabel} end
  if p.title then p:add{kind = "text", x = p.width / 2, y = 18, text = p.title, anchor = "middle", bold = true} end
end

-- A legend in the top right corner of the axes.
function Axes:legend(entries)
  if #entries == 0 then return end
  local w = 0
  for _, e in ipairs(entries) do w = max(w, raster.text_width(e.label)) end
  local x = self.right - w - 34
  local y = self.top + 6
  self.p:add{kind = "rect", x = x - 6, y = y - 2, w = w + 36, h = #entries * 15 + 4, fill = {255, 255, 255}, alpha = 0.85, stroke = GRID}
  for i, e in ipairs(entries) do
    local cy = y + (i - 1) * 15 + 7
    self.p:add{kind = "line", points = {x, cy, x + 18, cy}, color = e.color, width = 2}
    self.p:add{kind = "text", x = x + 24, y = cy + 4, text = e.label}
  end
end

-- ---- line charts ----

-- An exponential moving average with TensorBoard's debiasing: weight in [0, 1).
function plot.smooth(ys, weight)
  ys = numbers(ys, "smooth", "ys")
  if type(weight) ~= "number" or not (weight >= 0 and weight < 1) then fail("smooth", "weight must be a number in [0, 1)") end
  local out, last, n = {}, 0, 0
  for i, y in ipairs(ys) do
    last = last * weight + (1 - weight) * y
    n = n + 1
    out[i] = last / (1 - weight ^ n)
  end
  return out
end

-- At most about `points` points of (xs, ys): the points in x order, and in each of points/2 buckets
-- of consecutive points only the smallest and the largest y, so that spikes survive.
function plot.downsample(xs, ys, points)
  xs, ys = numbers(xs, "downsample", "xs"), numbers(ys, "downsample", "ys")
  if #xs ~= #ys then fail("downsample", string.format("%d x values for %d y values", #xs, #ys)) end
  if type(points) ~= "number" or not (points >= 2) then fail("downsample", "points must be a number, at least 2") end
  local n = #xs
  if n <= points then return xs, ys end
  local buckets = max(1, floor(points / 2))
  local ox, oy = {}, {}
  for b = 0, buckets - 1 do
    local i0, i1 = floor(b * n / buckets) + 1, floor((b + 1) * n / buckets)
    if i1 >= i0 then
      local lo, hi = i0, i0
      for i = i0, i1 do
        if ys[i] < ys[lo] then lo = i end
        if ys[i] > ys[hi] then hi = i end
      end
      local first, second = min(lo, hi), max(lo, hi)
      ox[#ox + 1], oy[#oy + 1] = xs[first], ys[first]
      if second ~= first then ox[#ox + 1], oy[#oy + 1] = xs[second], ys[second] end
    end
  end
  return ox, oy
end

local function finite(v) return v == v and v ~= math.huge and v ~= -math.huge end

-- plot.line(series[, opts]): series is {x = {...}, y = {...}, label = "..."} or a list of them (x may
-- be left out: 1, 2, ...). opts: title, xlabel, ylabel, log (a log y axis), logx, smooth (0 to 1:
-- the weight of an exponential moving average; the raw curve is drawn faintly under it), points
-- (the downsampling target, default 1000), ylim = {lo, hi}, width (640), height (360), legend,
-- markers (series of at most this many points, 30, get a dot at each; false for none).
function plot.line(series, opts)
  opts = opts or {}
  if type(series) ~= "table" then fail("line", "expected a series {x =, y =} or a list of them, got " .. type(series)) end
  if type(opts) ~= "table" then fail("line", "opts must be a table, got " .. type(opts)) end
  if series.y ~= nil then series = {series} end
  if #series == 0 then fail("line", "no series to draw") end
  local smooth = opts.smooth
  if smooth ~= nil and (type(smooth) ~= "number" or smooth < 0 or smooth >= 1) then fail("line", "smooth must be a number in [0, 1)") end
  local points = opts.points or 1000
  if type(points) ~= "number" or not (points >= 2) then fail("line", "points must be a number, at least 2") end
  if opts.markers ~= nil and opts.markers ~= false and type(opts.markers) ~= "number" then fail("line", "markers must be a number or false") end
  local p = new_plot(opts.width, opts.height, "line")
  p.title, p.kind = opts.title, "line chart"
  local prepared = {}
  local xlo, xhi, ylo, yhi = math.huge, -math.huge, math.huge, -math.huge
  for si, s in ipairs(series) do
    if type(s) ~= "table" or s.y == nil then fail("line", "series " .. si .. " has no y") end
    local ys = numbers(s.y, "line", "y")
    local xs = s.x and numbers(s.x, "line", "x")
    if xs and #xs ~= #ys then fail("line", string.format("series %d: %d x values for %d y values", si, #xs, #ys)) end
    local fx, fy = {}, {}
    for i = 1, #ys do
      local x, y = xs and xs[i] or i, ys[i]
      if finite(x) and finite(y) and (not opts.log or y > 0) and (not opts.logx or x > 0) then fx[#fx + 1], fy[#fy + 1] = x, y end
    end
    local entry = {label = s.label, color = s.color or plot.colors[(si - 1) % #plot.colors + 1], xs = fx, ys = fy}
    if smooth and smooth > 0 and #fy > 0 then entry.sy = plot.smooth(fy, smooth) end
    for i = 1, #fx do
      xlo, xhi = min(xlo, fx[i]), max(xhi, fx[i])
      ylo, yhi = min(ylo, fy[i]), max(yhi, fy[i])
    end
    prepared[#prepared + 1] = entry
  end
  if xlo > xhi then xlo, xhi, ylo, yhi = 0, 1, opts.log and 0.1 or 0, 1 end
  if opts.ylim then ylo, yhi = opts.ylim[1], opts.ylim[2] end
  if not opts.log then
    local pad = (yhi - ylo) * 0.05
    if pad == 0 then pad = abs(yhi) * 0.05 + 0.5 end
    ylo, yhi = ylo - pad, yhi + pad
  else
    ylo, yhi = ylo / 1.15, yhi * 1.15
  end
  local ax = axes(p, xlo, xhi, ylo, yhi, {log = opts.log, logx = opts.logx, xlabel = opts.xlabel})
  ax:draw{xlabel = opts.xlabel, ylabel = opts.ylabel}
  p.axes = ax
  local legend = {}
  for _, e in ipairs(prepared) do
    local function poly(xs, ys, alpha, width)
      local dx, dy = plot.downsample(xs, ys, points)
      local pts = {}
      for i = 1, #dx do pts[#pts + 1] = ax:px(dx[i]) pts[#pts + 1] = ax:py(dy[i]) end
      if #pts > 0 then p:add{kind = "line", points = pts, color = e.color, width = width, alpha = alpha} end
    end
    if e.sy then
      poly(e.xs, e.ys, 0.25, 1)
      poly(e.xs, e.sy, 1, 2)
    else
      poly(e.xs, e.ys, 1, 2)
    end
    -- a few points: each marked, so that one point alone shows
    if opts.markers ~= false and #e.xs <= (opts.markers or 30) then
      for i = 1, #e.xs do p:add{kind = "circle", x = ax:px(e.xs[i]), y = ax:py(e.ys[i]), r = 3, color = e.color} end
    end
    if e.label then legend[#legend + 1] = {label = tostring(e.label), color = e.color} end
  end
  if opts.legend ~= false and (#legend > 1 or (#legend == 1 and opts.legend)) then ax:legend(legend) end
  return p
end

-- The pixel where data (x, y) lies in a plot with axes (line, scatter, histogram).
function Plot:to_pixel(x, y)
  if not self.axes then error("plot:to_pixel: this plot has no axes", 2) end
  return self.axes:px(x), self.axes:py(y)
end

-- Rows of one run: a path of JSON lines (kiln.metrics), or a list of rows.
local function rows_of(src, what)
  if type(src) == "string" then return metrics.read(src) end
  if type(src) == "table" then
    for i, row in ipairs(src) do
      if type(row) ~= "table" then fail(what, string.format("row %d is a %s, not a table of fields", i, type(row))) end
    end
    return src
  end
  fail(what, "a run is a path of JSON lines or a list of rows, got " .. type(src))
end

-- plot.metrics(source[, opts]): curves of the metrics logger's JSON lines. source: a path, a list
-- of rows, or several runs {label = path_or_rows, ...} / {{label =, rows = or path =}, ...}.
-- opts: y (a key or a list, default "loss"), x (default "step" when the rows have it), and those of
-- plot.line. Each run and key is one curve; rows without the key are skipped.
function plot.metrics(source, opts)
  opts = opts or {}
  if type(opts) ~= "table" then fail("metrics", "opts must be a table, got " .. type(opts)) end
  local runs = {}
  if type(source) == "string" then
    runs[1] = {rows = rows_of(source, "metrics")}
  elseif type(source) == "table" and type(source[1]) == "table" and (source[1].rows or source[1].path) then
    for _, r in ipairs(source) do runs[#runs + 1] = {label = r.label, rows = rows_of(r.rows or r.path, "metrics")} end
  elseif type(source) == "table" and source[1] ~= nil then
    runs[1] = {rows = rows_of(source, "metrics")}
  elseif type(source) == "table" and next(source) ~= nil then
    local labels = {}
    for k in pairs(source) do labels[#labels + 1] = tostring(k) end
    table.sort(labels)
    for _, k in ipairs(labels) do runs[#runs + 1] = {label = k, rows = rows_of(source[k], "metrics")} end
  else
    fail("metrics", "expected a path, a list of rows or a table of runs, got " .. (type(source) == "table" and "an empty table" or type(source)))
  end
  local keys = opts.y or "loss"
  if type(keys) == "string" then keys = {keys} end
  if type(keys) ~= "table" or #keys == 0 then fail("metrics", "y must be a key or a list of keys") end
  for _, k in ipairs(keys) do if type(k) ~= "string" then fail("metrics", "y must be a key or a list of keys") end end
  if opts.x ~= nil and type(opts.x) ~= "string" then fail("metrics", "x must be a key, got " .. type(opts.x)) end
  local series = {}
  for _, run in ipairs(runs) do
    local xkey = opts.x
    if xkey == nil then
      for _, row in ipairs(run.rows) do if type(row.step) == "number" then xkey = "step" break end end
    end
    for _, key in ipairs(keys) do
      local xs, ys = {}, {}
      for i, row in ipairs(run.rows) do
        local y = row[key]
        local x = xkey and row[xkey] or i
        if type(y) == "number" and type(x) == "number" then xs[#xs + 1], ys[#ys + 1] = x, y end
      end
      if #ys > 0 then
        local label = run.label and (#keys > 1 and (run.label .. ": " .. key) or run.label) or key
        series[#series + 1] = {x = xs, y = ys, label = label}
      end
    end
  end
  if #series == 0 then fail("metrics", "no rows hold " .. table.concat(keys, " or ")) end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.xlabel = o.xlabel or opts.x or "step"
  o.ylabel = o.ylabel or table.concat(keys, ", ")
  o.legend = o.legend == nil and (#series > 1 or #runs > 1) or o.legend
  return plot.line(series, o)
end

-- plot.scatter(x, y[, opts]): points; opts.groups (a list or tensor of group numbers, 1, 2, ...)
-- colours them, opts.labels names the groups, opts.size the radius (3), and title, xlabel, ylabel.
function plot.scatter(x, y, opts)
  opts = opts or {}
  if type(opts) ~= "table" then fail("scatter", "opts must be a table, got " .. type(opts)) end
  local xs, ys = numbers(x, "scatter", "x"), numbers(y, "scatter", "y")
  if #xs ~= #ys then fail("scatter", string.format("%d x values for %d y values", #xs, #ys)) end
  local groups = opts.groups and numbers(opts.groups, "scatter", "groups")
  local p = new_plot(opts.width, opts.height, "scatter")
  p.title, p.kind = opts.title, "scatter plot"
  local xlo, xhi, ylo, yhi = math.huge, -math.huge, math.huge, -math.huge
  for i = 1, #xs do
    if finite(xs[i]) and finite(ys[i]) then
      xlo, xhi, ylo, yhi = min(xlo, xs[i]), max(xhi, xs[i]), min(ylo, ys[i]), max(yhi, ys[i])
    end
  end
  if xlo > xhi then xlo, xhi, ylo, yhi = 0, 1, 0, 1 end
  local px, py = (xhi - xlo) * 0.05 + 1e-9, (yhi - ylo) * 0.05 + 1e-9
  local ax = axes(p, xlo - px, xhi + px, ylo - py, yhi + py, {xlabel = opts.xlabel})
  ax:draw{xlabel = opts.xlabel, ylabel = opts.ylabel}
  p.axes = ax
  local used = {}
  for i = 1, #xs do
    if finite(xs[i]) and finite(ys[i]) then
      local g = groups and groups[i] or 1
      used[g] = true
      local color = plot.colors[(floor(g) - 1) % #plot.colors + 1]
      p:add{kind = "circle", x = ax:px(xs[i]), y = ax:py(ys[i]), r = opts.size or 3, color = color, alpha = 0.8}
    end
  end
  if opts.labels then
    local entries = {}
    for g, name in ipairs(opts.labels) do
      if used[g] then entries[#entries + 1] = {label = tostring(name), color = plot.colors[(g - 1) % #plot.colors + 1]} end
    end
    ax:legend(entries)
  end
  return p
end

-- plot.histogram(values[, opts]): counts of values in opts.bins (30) equal bins; title, xlabel.
function plot.histogram(values, opts)
  opts = opts or {}
  if type(opts) ~= "table" then fail("histogram", "opts must be a table, got " .. type(opts)) end
  local vs = numbers(values, "histogram", "values")
  local bins = opts.bins or 30
  if type(bins) ~= "number" or bins < 1 or bins > 10000 or bins % 1 ~= 0 then fail("histogram", "bins must be a whole number from 1 to 10000") end
  local lo, hi = math.huge, -math.huge
  for _, v in ipairs(vs) do if finite(v) then lo, hi = min(lo, v), max(hi, v) end end
  if lo > hi then lo, hi = 0, 1 end
  if hi == lo then lo, hi = lo - 0.5, hi + 0.5 end
  local counts = {}
  for b = 1, bins do counts[b] = 0 end
  for _, v in ipairs(vs) do
    if finite(v) then
      local b = min(bins, floor((v - lo) / (hi - lo) * bins) + 1)
      counts[b] = counts[b] + 1
    end
  end
  local top = 0
  for _, c in ipairs(counts) do top = max(top, c) end
  local p = new_plot(opts.width, opts.height, "histogram")
  p.title, p.kind, p.counts, p.edges = opts.title, "histogram", counts, {lo = lo, hi = hi}
  local ax = axes(p, lo, hi, 0, top * 1.05 + 1e-9, {xlabel = opts.xlabel})
  ax:draw{xlabel = opts.xlabel, ylabel = opts.ylabel or "count"}
  p.axes = ax
  local color = opts.color or plot.colors[1]
  for b = 1, bins do
    if counts[b] > 0 then
      local x0, x1 = ax:px(lo + (b - 1) * (hi - lo) / bins), ax:px(lo + b * (hi - lo) / bins)
      local y = ax:py(counts[b])
      p:add{kind = "rect", x = x0, y = y, w = max(x1 - x0 - 1, 1), h = ax.bottom - y, fill = color}
    end
  end
  return p
end

-- A batch of images as u8 [N,3,H,W] on the cpu: from [N,H,W], [N,1,H,W] or [N,3,H,W], any dtype
-- (floats are scaled from their smallest to their largest value).
local function as_rgb_batch(images, what)
  if not is_tensor(images) then fail(what, "expected a tensor of images [N,C,H,W] or [N,H,W], got " .. type(images)) end
  local t = images:detach():to("cpu")
  local d = t:dim()
  if d == 2 then t = t:view(1, 1, t:size(1), t:size(2)) d = 4 end
  if d == 3 then t = t:view(t:size(1), 1, t:size(2), t:size(3)) d = 4 end
  if d ~= 4 or (t:size(2) ~= 1 and t:size(2) ~= 3) then
    fail(what, "expected images [N,C,H,W] with C 1 or 3, or [N,H,W], got " .. tostring(images:size()))
  end
  if t:dtype() ~= "u8" then
    t = t:to("f32")
    local lo, hi = t:min():item(), t:max():item()
    local scale = hi > lo and 255 / (hi - lo) or 0
    t = ((t - lo) * scale):clamp(0, 255):round():to("u8")
  end
  if t:size(2) == 1 then t = t:expand(t:size(1), 3, t:size(3), t:size(4)) end
  return t:contiguous()
end

-- plot.images(batch[, opts]): a grid of images; opts: nrow (images a row, default about square),
-- labels (a caption under each), scale (pixels a pixel, default to fit 640 wide), title,
-- colors (a colour index a caption, for marking).
function plot.images(batch, opts)
  opts = opts or {}
  if type(opts) ~= "table" then fail("images", "opts must be a table, got " .. type(opts)) end
  for _, k in ipairs{"nrow", "scale"} do
    local v = opts[k]
    if v ~= nil and (type(v) ~= "number" or v < 1 or v > 64 or v % 1 ~= 0) then fail("images", k .. " must be a whole number from 1 to 64") end
  end
  if opts.labels ~= nil and type(opts.labels) ~= "table" then fail("images", "labels must be a list of captions") end
  if opts.colors ~= nil and type(opts.colors) ~= "table" then fail("images", "colors must be a list of colour numbers") end
  local t = as_rgb_batch(batch, "images")
  local n, h, w = t:size(1), t:size(3), t:size(4)
  if n == 0 then fail("images", "no images") end
  local ncol = opts.nrow or min(n, max(1, ceil(math.sqrt(n))))
  local nrows = ceil(n / ncol)
  local scale = opts.scale or max(1, min(4, floor(600 / (ncol * (w + 2)))))
  local cap = opts.labels and 14 or 0
  local cw, ch = w * scale + 6, h * scale + 6 + cap
  local top = opts.title and 26 or 4
  local p = new_plot(max(ncol * cw + 8, 64), top + nrows * ch + 4, "images")
  p.title, p.kind = opts.title, "image grid"
  if p.title then p:add{kind = "text", x = p.width / 2, y = 17, text = p.title, anchor = "middle", bold = true} end
  -- one image of the whole grid, so that SVG holds one PNG
  local sheet = raster.canvas(ncol * cw, nrows * ch)
  for i = 1, n do
    local r, c = floor((i - 1) / ncol), (i - 1) % ncol
    sheet:image(c * cw + 3, r * ch + 3, t[i], scale)
  end
  p:add{kind = "image", x = 4, y = top, image = sheet.tensor, scale = 1}
  if opts.labels then
    for i = 1, n do
      local r, c = floor((i - 1) / ncol), (i - 1) % ncol
      local color = opts.colors and opts.colors[i] and plot.colors[opts.colors[i]] or TEXT
      p:add{kind = "text", x = 4 + c * cw + cw / 2, y = top + r * ch + h * scale + 6 + 11, text = tostring(opts.labels[i] or ""),
            anchor = "middle", color = color}
    end
  end
  p.cell = {x = 4 + 3, y = top + 3, w = cw, h = ch, scale = scale, ncol = ncol}
  return p
end

-- plot.confusion(matrix[, opts]): a confusion matrix (rows: true class, columns: predicted) as a heat
-- map with the counts; matrix is a 2-d tensor or a list of rows. opts: classes (names), title.
function plot.confusion(matrix, opts)
  opts = opts or {}
  if type(opts) ~= "table" then fail("confusion", "opts must be a table, got " .. type(opts)) end
  local rows
  if is_tensor(matrix) then
    if matrix:dim() ~= 2 then fail("confusion", "expected a 2-d matrix, got sizes " .. tostring(matrix:size())) end
    rows = matrix:detach():to("cpu"):to("f64"):tolist()
  elseif type(matrix) == "table" then rows = matrix
  else fail("confusion", "expected a 2-d tensor or a list of rows, got " .. type(matrix)) end
  local k = #rows
  if k == 0 then fail("confusion", "the matrix is empty") end
  local top = 0
  for i = 1, k do
    if type(rows[i]) ~= "table" or #rows[i] ~= k then fail("confusion", "the matrix must be square") end
    for j = 1, k do top = max(top, numbers(rows[i], "confusion", "row " .. i)[j]) end
  end
  local classes = opts.classes or {}
  local label_w = 0
  for i = 1, k do label_w = max(label_w, raster.text_width(tostring(classes[i] or i))) end
  local cell = opts.cell or max(18, min(44, floor(400 / k)))
  local left, ttop = label_w + 12, (opts.title and 30 or 8) + 14
  local p = new_plot(left + k * cell + 12, ttop + k * cell + 34, "confusion")
  p.title, p.kind = opts.title, "confusion matrix"
  if p.title then p:add{kind = "text", x = p.width / 2, y = 18, text = p.title, anchor = "middle", bold = true} end
  p:add{kind = "text", x = left + k * cell / 2, y = ttop - 4, text = "predicted", anchor = "middle"}
  for i = 1, k do
    for j = 1, k do
      local v = rows[i][j]
      local a = top > 0 and v / top or 0
      local c = {floor(255 - a * (255 - 8)), floor(255 - a * (255 - 48)), floor(255 - a * (255 - 107))}
      local x, y = left + (j - 1) * cell, ttop + (i - 1) * cell
      p:add{kind = "rect", x = x, y = y, w = cell, h = cell, fill = c}
      if cell >= 18 then
        p:add{kind = "text", x = x + cell / 2, y = y + cell / 2 + 4, text = tick_text(v), anchor = "middle",
              color = a > 0.5 and {255, 255, 255} or TEXT}
      end
    end
    p:add{kind = "text", x = left - 4, y = ttop + (i - 0.5) * cell + 4, text = tostring(classes[i] or i), anchor = "end"}
    p:add{kind = "text", x = left + (i - 0.5) * cell, y = ttop + k * cell + 14, text = tostring(classes[i] or i), anchor = "middle"}
  end
  p:add{kind = "rect", x = left, y = ttop, w = k * cell, h = k * cell, stroke = AXIS}
  p:add{kind = "text", x = 4, y = ttop + k * cell + 28, text = "true class: rows"}
  p.grid = {left = left, top = ttop, cell = cell}
  return p
end

plot.Plot = Plot

return plot
