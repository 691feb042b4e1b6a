-- kiln.nb.cells: notebooks as lists of cells, read from a cell script (jupytext's percent format
-- for Lua) or an .ipynb file (nbformat 4), and written as .ipynb (nbformat 4.5, with cell ids).
--   -- %%                              a code cell
--   -- %% [markdown]                   a Markdown cell; its lines are "-- " comments
--   -- %% tags=["parameters"]          cell metadata, as jupytext writes it (JSON values)
-- A cell is {cell_type = "code"|"markdown"|"raw", source = "text", metadata = {...}, line = N}
-- (line: where the cell's text starts in the file).
local ok_cjson, cjson = pcall(require, "cjson")

local M = {}

local function need_cjson(what)
  if not ok_cjson then error(what .. ": lua-cjson is not installed (Debian: lua-cjson)", 0) end
end

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then error("kiln nb: cannot read " .. tostring(err), 0) end
  local text = f:read("*a")
  f:close()
  return text
end

local function lines_of(text)
  local lines = {}
  for line in (text:gsub("\r\n", "\n") .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  if text:sub(-1) == "\n" or text == "" then lines[#lines] = nil end
  return lines
end

-- The end of the JSON value that starts at position i of s (brackets and strings balanced).
local function json_value_end(s, i)
  local c = s:sub(i, i)
  if c == '"' then
    local j = i + 1
    while j <= #s do
      local d = s:sub(j, j)
      if d == "\\" then j = j + 2
      elseif d == '"' then return j
      else j = j + 1 end
    end
    return nil
  elseif c == "[" or c == "{" then
    local depth, j = 0, i
    while j <= #s do
      local d = s:sub(j, j)
      if d == '"' then
        j = json_value_end(s, j)
        if not j then return nil end
      elseif d == "[" or d == "{" then depth = depth + 1
      elseif d == "]" or d == "}" then
        depth = depth - 1
        if depth == 0 then return j end
      end
      j = j + 1
    end
    return nil
  end
  return (s:find("%s", i) or #s + 1) - 1
end

-- The marker line's rest (after "%%"): an optional title, an optional [type], key=value metadata.
-- Returns cell_type, metadata; errors name the line.
local function parse_marker(rest, where)
  local metadata, cell_type = {}, "code"
  local s = rest
  local kind = s:match("%[(%a+)%]")
  if kind then
    local k = kind:lower()
    if k == "markdown" or k == "md" then cell_type = "markdown"
    elseif k == "raw" then cell_type = "raw"
    else error(string.format("%s: unknown cell type [%s] (markdown, md or raw)", where, kind), 0) end
    s = s:gsub("%[%a+%]", " ", 1)
  end
  local title = {}
  local i = 1
  while i <= #s do
    local a, b, key = s:find("^([%a_][%w_%-%.]*)=", i)
    if a then
      local j = json_value_end(s, b + 1)
      local raw = j and s:sub(b + 1, j)
      local ok, value = false, nil
      if raw and raw ~= "" then
        need_cjson("kiln nb")
        ok, value = pcall(cjson.decode, raw)
        if not ok and not raw:match('^["%[{]') then ok, value = true, raw end   -- a bare word
      end
      if not ok then error(string.format("%s: the value of %s is not JSON: %s", where, key, tostring(raw)), 0) end
      metadata[key] = value
      i = j + 1
    else
      local word_end = (s:find("%s", i) or #s + 1) - 1
      local word = s:sub(i, word_end)
      if word:match("%S") then title[#title + 1] = word end
      i = word_end + 1
    end
    local sp = s:find("%S", i)
    if not sp then break end
    i = sp
  end
  if #title > 0 then metadata.title = table.concat(title, " ") end
  return cell_type, metadata
end

local function trim_blank_ends(list)
  while #list > 0 and not list[#list]:match("%S") do list[#list] = nil end
  while #list > 0 and not list[1]:match("%S") do table.remove(list, 1) end
  return list
end

-- A Markdown line from its comment: "-- text" -> "text", "--" -> "".
local function uncomment(line)
  local s = line:match("^%s*%-%- ?(.*)$")
  if s then return s end
  return line
end

-- The cells of a cell script. Lines before the first marker make a code cell of their own when
-- they hold anything but blank lines; a file with no marker is one code cell.
function M.parse_script(text, name)
  name = name or "script"
  local cells = {}
  local current = {cell_type = "code", metadata = {}, lines = {}, line = 1, first = true}
  local function flush()
    local body = current.lines
    if current.cell_type ~= "code" then
      for k, l in ipairs(body) do body[k] = uncomment(l) end
    end
    local start = current.line
    while #body > 0 and not body[1]:match("%S") do table.remove(body, 1) start = start + 1 end
    trim_blank_ends(body)
    if not (current.first and #body == 0) then
      cells[#cells + 1] = {cell_type = current.cell_type, metadata = current.metadata,
                           source = table.concat(body, "\n"), line = start}
    end
  end
  for n, line in ipairs(lines_of(text)) do
    local rest = line:match("^%-%- ?%%%%(.*)$")
    if rest and (rest == "" or rest:match("^%s")) then
      flush()
      local cell_type, metadata = parse_marker(rest, string.format("%s:%d", name, n))
      current = {cell_type = cell_type, metadata = metadata, lines = {}, line = n + 1}
    else
      current.lines[#current.lines + 1] = line
    end
  end
  flush()
  return {cells = cells, metadata = {}, source = name}
end

-- ---- .ipynb ----

local function joined(source, where)
  if type(source) == "string" then return source end
  if type(source) ~= "table" then error(where .. ": source is a " .. type(source) .. ", not a string or a list of strings", 0) end
  for k, s in ipairs(source) do
    if type(s) ~= "string" then error(string.format("%s: source line %d is a %s, not a string", where, k, type(s)), 0) end
  end
  return table.concat(source)
end

-- The cells of an .ipynb file (nbformat 4); anything malformed is an error naming the file.
function M.parse_ipynb(text, name)
  need_cjson("kiln nb")
  name = name or "notebook"
  local ok, nb = pcall(cjson.decode, text)
  if not ok then error(string.format("kiln nb: %s is not valid JSON: %s", name, tostring(nb)), 0) end
  if type(nb) ~= "table" then error("kiln nb: " .. name .. " does not hold a JSON object", 0) end
  if nb.nbformat ~= 4 then
    error(string.format("kiln nb: %s: nbformat is %s; kiln reads nbformat 4", name, nb.nbformat == nil and "missing" or tostring(nb.nbformat)), 0)
  end
  if type(nb.cells) ~= "table" then error("kiln nb: " .. name .. ": \"cells\" is missing or not a list", 0) end
  local cells = {}
  for k, c in ipairs(nb.cells) do
    local where = string.format("kiln nb: %s: cell %d", name, k)
    if type(c) ~= "table" then error(where .. " is not an object", 0) end
    local t = c.cell_type
    if t ~= "code" and t ~= "markdown" and t ~= "raw" then
      error(string.format("%s: cell_type is %s, not code, markdown or raw", where, t == nil and "missing" or tostring(t)), 0)
    end
    if c.source == nil then error(where .. ": source is missing", 0) end
    local metadata = c.metadata
    if metadata ~= nil and type(metadata) ~= "table" then error(where .. ": metadata is not an object", 0) end
    metadata = metadata or {}
    if metadata.tags ~= nil and type(metadata.tags) ~= "table" then error(where .. ": metadata.tags is not a list", 0) end
    cells[#cells + 1] = {cell_type = t, source = joined(c.source, where), metadata = metadata, id = c.id, line = 1}
  end
  return {cells = cells, metadata = type(nb.metadata) == "table" and nb.metadata or {}, source = name}
end

-- A notebook from a file: .ipynb by its extension, otherwise a cell script.
function M.read(path)
  if type(path) ~= "string" then error("kiln nb: the file must be a path, got " .. type(path), 2) end
  local text = read_file(path)
  if path:match("%.ipynb$") then return M.parse_ipynb(text, path) end
  return M.parse_script(text, path)
end

function M.has_tag(cell, tag)
  local tags = cell.metadata and cell.metadata.tags
  if type(tags) ~= "table" then return false end
  for _, t in ipairs(tags) do if t == tag then return true end end
  return false
end

-- ---- writing JSON the way Jupyter does (indent 1, keys sorted) ----

-- Marks a table as a JSON array even when it is empty; M.null is JSON's null.
local array_mt = {}
M.null = setmetatable({}, {__tostring = function() return "null" end})
function M.array(t) return setmetatable(t or {}, array_mt) end

local escapes = {['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t"}
local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return escapes[c] or string.format("\\u%04x", c:byte()) end) .. '"'
end

local function is_array(t)
  if getmetatable(t) == array_mt then return true end
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n > 0 and n == #t
end

local function encode(v, indent, out)
  local tv = type(v)
  if tv == "string" then out[#out + 1] = encode_string(v)
  elseif tv == "number" then
    if v ~= v or v == math.huge or v == -math.huge then out[#out + 1] = "null"
    elseif v == math.floor(v) and math.abs(v) < 2 ^ 53 then out[#out + 1] = string.format("%d", v)
    else out[#out + 1] = string.format("%.17g", v) end
  elseif tv == "boolean" then out[#out + 1] = tostring(v)
  elseif v == nil or v == M.null or (ok_cjson and v == cjson.null) then out[#out + 1] = "null"
  elseif tv == "table" then
    local inner = indent .. " "
    if is_array(v) then
      if #v == 0 then out[#out + 1] = "[]" return end
      out[#out + 1] = "[\n"
      for k, x in ipairs(v) do
        out[#out + 1] = inner
        encode(x, inner, out)
        out[#out + 1] = k < #v and ",\n" or "\n"
      end
      out[#out + 1] = indent .. "]"
    else
      local keys = {}
      for k in pairs(v) do
        if type(k) ~= "string" then error("kiln nb: a JSON object key must be a string, got " .. type(k), 0) end
        keys[#keys + 1] = k
      end
      table.sort(keys)
      if #keys == 0 then out[#out + 1] = "{}" return end
      out[#out + 1] = "{\n"
      for k, key in ipairs(keys) do
        out[#out + 1] = inner .. encode_string(key) .. ": "
        encode(v[key], inner, out)
        out[#out + 1] = k < #keys and ",\n" or "\n"
      end
      out[#out + 1] = indent .. "}"
    end
  else
    error("kiln nb: cannot write a " .. tv .. " as JSON", 0)
  end
end

function M.json(v)
  local out = {}
  encode(v, "", out)
  return table.concat(out)
end

-- Text as Jupyter stores it: a list of lines, each but the last ending in "\n".
function M.multiline(text)
  local list = M.array()
  for line in text:gmatch("[^\n]*\n?") do
    if line ~= "" then list[#list + 1] = line end
  end
  return list
end

-- A notebook {cells, metadata} as nbformat 4.5 JSON. Code cells may carry outputs and
-- execution_count; every cell gets an id (its own, or "cell-<n>").
function M.to_ipynb(nb)
  local cells = M.array()
  local used = {}
  for k, c in ipairs(nb.cells) do
    local id = type(c.id) == "string" and c.id:match("^[%w_%-]+$") and #c.id <= 64 and not used[c.id] and c.id
               or string.format("cell-%d", k)
    used[id] = true
    local metadata = {}
    for key, v in pairs(c.metadata or {}) do metadata[key] = v end
    if metadata.tags then metadata.tags = M.array(metadata.tags) end
    local cell = {cell_type = c.cell_type, id = id, metadata = metadata, source = M.multiline(c.source or "")}
    if c.cell_type == "code" then
      cell.outputs = M.array(c.outputs or {})
      cell.execution_count = c.execution_count or M.null
    end
    cells[#cells + 1] = cell
  end
  local metadata = {}
  for key, v in pairs(nb.metadata or {}) do metadata[key] = v end
  metadata.kernelspec = metadata.kernelspec or {name = "kiln", display_name = "kiln (LuaJIT)", language = "lua"}
  metadata.language_info = metadata.language_info or {name = "lua", file_extension = ".lua", mimetype = "text/x-lua"}
  if metadata.jupytext == nil and nb.from_script then
    metadata.jupytext = {formats = "ipynb,lua:percent"}
  end
  return M.json({cells = cells, metadata = metadata, nbformat = 4, nbformat_minor = 5}) .. "\n"
end

return M
