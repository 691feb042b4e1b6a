-- kiln.display: the display protocol. An object renders itself as a bundle, a table from MIME
-- type to text: "text/plain" always; "text/html" for tensors (a table, summarised when large) and
-- nn modules (the module tree with parameter shapes and counts); plots add "image/svg+xml" and
-- "image/png" (base64). An object with a __bundle metamethod renders itself.
--   kiln.display(x)            show x: in `kiln nb run`, a display_data output; elsewhere its text
--   kiln.display.bundle(x)     the bundle of x
local core = require "kiln.core"
local nn = require "kiln.nn"

local display = {}

display.max_rows = 10      -- rows of a tensor's HTML table before "..." (the first and last half)
display.max_cols = 10

function display.escape(s)
  return (tostring(s):gsub("[&<>\"]", {["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;"}))
end
local escape = display.escape

local function safe_tostring(v)
  local ok, s = pcall(tostring, v)
  if ok and type(s) == "string" then return s end
  return "<" .. type(v) .. ">"
end

-- A one-line text of a plain table: {1, 2, a = 3}, one level deep.
local function table_text(t)
  local parts, n = {}, #t
  for i = 1, math.min(n, 16) do parts[#parts + 1] = type(t[i]) == "string" and string.format("%q", t[i]) or safe_tostring(t[i]) end
  if n > 16 then parts[#parts + 1] = "..." end
  local keys = {}
  for k in pairs(t) do
    if not (type(k) == "number" and k >= 1 and k <= n and k % 1 == 0) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return safe_tostring(a) < safe_tostring(b) end)
  for i, k in ipairs(keys) do
    if i > 16 then parts[#parts + 1] = "..." break end
    local v = t[k]
    parts[#parts + 1] = safe_tostring(k) .. " = " .. (type(v) == "string" and string.format("%q", v) or safe_tostring(v))
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

local function number_text(x)
  if type(x) == "boolean" then return tostring(x) end
  if x == math.floor(x) and math.abs(x) < 1e15 then return string.format("%d", x) end
  return string.format("%.5g", x)
end

-- Indices shown of a dim of size n: all, or the first and last halves of the limit.
local function shown(n, limit)
  if n <= limit then
    local all = {}
    for i = 1, n do all[i] = i end
    return all, false
  end
  local half, list = math.floor(limit / 2), {}
  for i = 1, half do list[#list + 1] = i end
  for i = n - half + 1, n do list[#list + 1] = i end
  return list, half
end

local function tensor_html(t)
  local sizes = t:size()
  local dims = #sizes
  local head = string.format('<div class="kiln-tensor"><div class="kiln-head">%s tensor %s on %s</div>',
                             escape(t:dtype()), escape(tostring(sizes)), escape(tostring(t:device())))
  if t:numel() == 0 then return head .. "<div>(empty)</div></div>" end
  if dims > 2 then
    return head .. "<pre>" .. escape(safe_tostring(t)) .. "</pre></div>"
  end
  local m = t:detach():to("cpu")
  if m:dtype() == "f16" or m:dtype() == "bf16" then m = m:to("f32") end
  if dims == 0 then return head .. "<table><tr><td>" .. escape(number_text(m:item())) .. "</td></tr></table></div>" end
  if dims == 1 then m = m:view(1, sizes[1]) end
  local rows, row_cut = shown(m:size(1), display.max_rows)
  local cols, col_cut = shown(m:size(2), display.max_cols)
  local out = {head, "<table>"}
  for ri, r in ipairs(rows) do
    if row_cut and ri == row_cut + 1 then
      out[#out + 1] = "<tr>" .. string.rep("<td>&#8942;</td>", #cols + (col_cut and 1 or 0)) .. "</tr>"
    end
    local cells = {}
    local row = m[r]
    for ci, c in ipairs(cols) do
      if col_cut and ci == col_cut + 1 then cells[#cells + 1] = "<td>&#8230;</td>" end
      cells[#cells + 1] = "<td>" .. escape(number_text(row[c])) .. "</td>"
    end
    out[#out + 1] = "<tr>" .. table.concat(cells) .. "</tr>"
  end
  out[#out + 1] = "</table></div>"
  return table.concat(out)
end

local function count_text(n)
  if n >= 1e6 then return string.format("%.2fM", n / 1e6) end
  if n >= 1e4 then return string.format("%.1fk", n / 1e3) end
  return tostring(n)
end

local function module_html(m, key, out)
  local ok, extra = pcall(m.extra_repr, m)
  extra = ok and extra or ""
  out[#out + 1] = string.format('<li><span class="kiln-mod">%s%s</span>%s', key and (escape(key) .. ": ") or "",
                                escape(m.__name or "Module"), extra ~= "" and ("(" .. escape(extra) .. ")") or "")
  local n = m:num_parameters()
  if n > 0 then out[#out + 1] = string.format(' <span class="kiln-count">%s params</span>', count_text(n)) end
  local own = {}
  for _, name in ipairs(m._param_names or {}) do
    local p = rawget(m, name) or m[name]
    if core.is_tensor(p) then own[#own + 1] = string.format("%s %s", escape(name), escape(tostring(p:size()))) end
  end
  if #own > 0 then out[#out + 1] = ' <span class="kiln-shapes">' .. table.concat(own, ", ") .. "</span>" end
  local children = m:named_children()
  if #children > 0 then
    out[#out + 1] = "<ul>"
    for _, kc in ipairs(children) do module_html(kc[2], kc[1], out) end
    out[#out + 1] = "</ul>"
  end
  out[#out + 1] = "</li>"
end

-- The bundle of x.
function display.bundle(x)
  local mt = getmetatable(x)
  if type(mt) == "table" and type(rawget(mt, "__bundle")) == "function" then
    local b = mt.__bundle(x)
    if type(b) ~= "table" then error("display: __bundle of " .. type(x) .. " returned a " .. type(b) .. ", not a table", 2) end
    if b["text/plain"] == nil then b["text/plain"] = safe_tostring(x) end
    return b
  end
  if core.is_tensor(x) then
    return {["text/plain"] = safe_tostring(x), ["text/html"] = tensor_html(x)}
  end
  if nn.is_module(x) then
    local out = {'<div class="kiln-module"><ul>'}
    module_html(x, nil, out)
    out[#out + 1] = "</ul></div>"
    return {["text/plain"] = safe_tostring(x), ["text/html"] = table.concat(out)}
  end
  if type(x) == "table" and not (type(mt) == "table" and rawget(mt, "__tostring")) then
    return {["text/plain"] = table_text(x)}
  end
  return {["text/plain"] = safe_tostring(x)}
end

-- Where shown bundles go: nil prints their text; `kiln nb run` sets a function(bundle).
display.sink = nil

function display.show(...)
  for i = 1, select("#", ...) do
    local b = display.bundle((select(i, ...)))
    if display.sink then display.sink(b) else io.write(b["text/plain"], "\n") end
  end
end

return setmetatable(display, {__call = function(_, ...) return display.show(...) end})
