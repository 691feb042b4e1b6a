-- kiln.nb.report: a notebook as one self-contained HTML page: inline CSS, SVG inline, PNG as
-- data: URIs, nothing fetched from anywhere (not even the SVG namespace is named).
local display = require "kiln.display"

local M = {}

local escape = display.escape

M.css = [[
body{font:14px/1.45 "DejaVu Sans",Arial,sans-serif;color:#222;margin:0;background:#fff}
main{max-width:980px;margin:0 auto;padding:16px 24px}
h1.kiln-title{font-size:20px;margin:8px 0}
table.kiln-info{border-collapse:collapse;margin:6px 0 14px}
table.kiln-info td,table.kiln-info th{border:1px solid #ddd;padding:2px 8px;text-align:left;font-size:13px}
.kiln-status-ok{color:#2a7a2a;font-weight:bold}
.kiln-status-bad{color:#b22222;font-weight:bold}
.kiln-cell{margin:10px 0}
.kiln-in{display:flex}
.kiln-count{color:#999;font:12px monospace;min-width:52px;padding-top:6px}
pre{margin:0;white-space:pre-wrap;word-break:break-word;font:12.5px/1.35 "DejaVu Sans Mono",monospace}
.kiln-src{background:#f6f6f6;border:1px solid #e4e4e4;padding:6px 8px;flex:1}
.kiln-out{margin-left:52px;padding:4px 8px}
.kiln-err{background:#fdeaea;color:#8b0000;padding:6px 8px}
.kiln-md{margin-left:52px}
.kiln-tensor table,.kiln-table{border-collapse:collapse;font:12px monospace}
.kiln-tensor td,.kiln-table td,.kiln-table th{border:1px solid #ddd;padding:1px 6px;text-align:right}
.kiln-head{color:#666;font-size:12px}
.kiln-module ul{list-style:none;padding-left:18px;margin:0}
.kiln-module .kiln-mod{font-weight:bold}
.kiln-module .kiln-count,.kiln-module .kiln-shapes{color:#777;font-size:12px;min-width:0;padding:0}
svg,img{max-width:100%;height:auto}
]]

-- ---- Markdown, the common subset ----

local function inline(s)
  s = escape(s)
  s = s:gsub("`([^`]+)`", "<code>%1</code>")
  s = s:gsub("%*%*(.-)%*%*", "<b>%1</b>")
  s = s:gsub("%f[%w*]%*([^*]+)%*", "<i>%1</i>")
  s = s:gsub("%[([^%]]+)%]%(([^)%s]+)%)", '<a href="%2">%1</a>')
  return s
end

function M.markdown(text)
  local out, para, list, code = {}, {}, nil, nil
  local function end_para()
    if #para > 0 then out[#out + 1] = "<p>" .. inline(table.concat(para, " ")) .. "</p>" para = {} end
  end
  local function end_list()
    if list then out[#out + 1] = "</" .. list .. ">" list = nil end
  end
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    if code then
      if line:match("^%s*```") then out[#out + 1] = "<pre>" .. escape(table.concat(code, "\n")) .. "</pre>" code = nil
      else code[#code + 1] = line end
    elseif line:match("^%s*```") then end_para() end_list() code = {}
    else
      local hashes, title = line:match("^(#+)%s+(.*)$")
      local bullet = line:match("^%s*[-*+]%s+(.*)$")
      local numbered = line:match("^%s*%d+[.)]%s+(.*)$")
      if hashes and #hashes <= 6 then
        end_para() end_list()
        out[#out + 1] = string.format("<h%d>%s</h%d>", #hashes, inline(title), #hashes)
      elseif bullet or numbered then
        end_para()
        local kind = bullet and "ul" or "ol"
        if list ~= kind then end_list() out[#out + 1] = "<" .. kind .. ">" list = kind end
        out[#out + 1] = "<li>" .. inline(bullet or numbered) .. "</li>"
      elseif not line:match("%S") then end_para() end_list()
      else end_list() para[#para + 1] = line end
    end
  end
  if code then out[#out + 1] = "<pre>" .. escape(table.concat(code, "\n")) .. "</pre>" end
  end_para() end_list()
  return table.concat(out, "\n")
end

-- ---- outputs ----

local function text_of(v)
  if type(v) == "table" then return table.concat(v) end
  return tostring(v or "")
end

-- SVG for inline use in HTML: no XML declaration, no namespace attributes (HTML does not need them).
function M.inline_svg(svg)
  svg = svg:gsub("^%s*<%?xml[^>]*%?>%s*", "")
  svg = svg:gsub('%s+xmlns:?%w*="[^"]*"', "")
  return svg
end

function M.output_html(o)
  local t = o.output_type
  if t == "stream" then
    return '<div class="kiln-out"><pre>' .. escape(text_of(o.text)) .. "</pre></div>"
  elseif t == "error" then
    return '<div class="kiln-out kiln-err"><pre>' .. escape(table.concat(o.traceback or {}, "\n")) .. "</pre></div>"
  end
  local data = o.data or {}
  local body
  if data["text/html"] then body = text_of(data["text/html"])
  elseif data["image/svg+xml"] then body = M.inline_svg(text_of(data["image/svg+xml"]))
  elseif data["image/png"] then
    body = '<img alt="plot" src="data:image/png;base64,' .. text_of(data["image/png"]):gsub("%s", "") .. '">'
  else body = "<pre>" .. escape(text_of(data["text/plain"])) .. "</pre>" end
  return '<div class="kiln-out">' .. body .. "</div>"
end

-- info: {file, parameters = {{name, text}...}, status, start, end, running}
function M.header(info)
  local rows = {}
  local bad = info.status ~= "ok" or info.running
  local status = info.running and "running (or stopped in a cell)" or info.status
  rows[#rows + 1] = string.format('<tr><th>status</th><td class="%s">%s</td></tr>', bad and "kiln-status-bad" or "kiln-status-ok", escape(status))
  rows[#rows + 1] = "<tr><th>start</th><td>" .. escape(info.start or "") .. "</td></tr>"
  if info["end"] then rows[#rows + 1] = "<tr><th>end</th><td>" .. escape(info["end"]) .. "</td></tr>" end
  for _, p in ipairs(info.parameters or {}) do
    rows[#rows + 1] = string.format("<tr><th>%s</th><td><code>%s</code></td></tr>", escape(p.name), escape(p.text))
  end
  return '<h1 class="kiln-title">' .. escape(info.file or "notebook") .. '</h1><table class="kiln-info">'
         .. table.concat(rows) .. "</table>"
end

function M.page(title, body)
  return "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" .. escape(title)
         .. "</title><style>" .. M.css .. "</style></head><body><main>\n" .. body .. "\n</main></body></html>\n"
end

-- The report of an executed notebook.
function M.html(nb, info)
  local parts = {M.header(info)}
  for _, c in ipairs(nb.cells) do
    if c.cell_type == "markdown" then
      parts[#parts + 1] = '<div class="kiln-cell kiln-md">' .. M.markdown(c.source) .. "</div>"
    elseif c.cell_type == "code" then
      local count = c.execution_count and ("[" .. c.execution_count .. "]") or "[ ]"
      local label = c.injected and " injected" or ""
      parts[#parts + 1] = string.format('<div class="kiln-cell"><div class="kiln-in"><div class="kiln-count">%s%s</div>'
                                        .. '<pre class="kiln-src">%s</pre></div>', count, label, escape(c.source))
      for _, o in ipairs(c.outputs or {}) do parts[#parts + 1] = M.output_html(o) end
      parts[#parts + 1] = "</div>"
    end
  end
  return M.page(info.file or "notebook", table.concat(parts, "\n"))
end

return M
