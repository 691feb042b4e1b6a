-- kiln.nb.params: notebook parameters. `-p name=value` takes a Lua literal (a number, a quoted
-- string, true, false, nil, or a table of literals); a sweep's `-p name=a,b,c` takes a list of them.
-- The injected cell assigns them after the cell tagged "parameters", as papermill does.
local M = {}

local function fail(name, text, why)
  error(string.format("kiln nb: -p %s=%s: %s is not a Lua literal (%s); a number, a quoted string "
                      .. "(-p name='\"text\"'), true, false, nil or a table of them", name, text, text, why), 0)
end

-- Reads one literal at position i of s; returns the position after it, or nil, why.
local read_literal

local function skip(s, i)
  while true do
    local a, b = s:find("^%s+", i)
    if a then i = b + 1 end
    if s:sub(i, i + 1) == "--" then
      local e = s:find("\n", i) or #s
      i = e + 1
    else
      return i
    end
  end
end

local function read_string(s, i)
  local q = s:sub(i, i)
  if q == '"' or q == "'" then
    local j = i + 1
    while j <= #s do
      local c = s:sub(j, j)
      if c == "\\" then j = j + 2
      elseif c == q then return j + 1
      elseif c == "\n" then return nil, "a string runs past the end of the line"
      else j = j + 1 end
    end
    return nil, "a string is not closed"
  end
  local eq = s:match("^%[(=*)%[", i)
  if eq then
    local a, b = s:find("]" .. eq .. "]", i + #eq + 2, true)
    if not a then return nil, "a long string is not closed" end
    return b + 1
  end
end

function read_literal(s, i, depth)
  i = skip(s, i)
  if depth > 32 then return nil, "tables nest too deep" end
  local c = s:sub(i, i)
  if c == "" then return nil, "a value is missing" end
  local j, why = read_string(s, i)
  if j then return j end
  if why then return nil, why end
  for _, word in ipairs{"true", "false", "nil"} do
    if s:match("^" .. word .. "%f[^%w_]", i) then return i + #word end
  end
  local num = s:match("^%-?%s*0[xX]%x+", i) or s:match("^%-?%s*%d*%.?%d*[eE][%+%-]?%d+", i)
              or s:match("^%-?%s*%d+%.?%d*", i) or s:match("^%-?%s*%.%d+", i)
  if num and tonumber((num:gsub("%s", ""))) and not s:match("^[%w_%.]", i + #num) then return i + #num end
  if c == "{" then
    i = skip(s, i + 1)
    while s:sub(i, i) ~= "}" do
      if s:sub(i, i) == "[" and not s:match("^%[=*%[", i) then
        local e, w = read_literal(s, i + 1, depth + 1)
        if not e then return nil, w end
        e = skip(s, e)
        if s:sub(e, e + 1) ~= "]=" and not s:match("^%]%s*=", e) then return nil, "a [key] needs = after it" end
        i = s:find("=", e, true) + 1
      else
        local key = s:match("^([%a_][%w_]*)%s*=[^=]", i)
        if key then i = s:find("=", i, true) + 1 end
      end
      local e, w = read_literal(s, i, depth + 1)
      if not e then return nil, w end
      i = skip(s, e)
      local sep = s:sub(i, i)
      if sep == "," or sep == ";" then i = skip(s, i + 1)
      elseif sep ~= "}" then return nil, "a table needs , or } after a value" end
    end
    return i + 1
  end
  local word = s:match("^[%a_][%w_%.]*", i)
  if word then return nil, word .. " is a name, not a value" end
  return nil, "unexpected " .. c
end

-- The values of one literal (list = false) or of a comma-separated list (list = true), as
-- {text = "...", value = v} entries. Errors name the parameter.
function M.parse(name, text, list)
  local items, i = {}, 1
  while true do
    local start = skip(text, i)
    local e, why = read_literal(text, start, 0)
    if not e then fail(name, text, why) end
    local piece = text:sub(start, e - 1)
    local fn = loadstring("return " .. piece)
    if not fn then fail(name, text, "it does not compile") end
    setfenv(fn, {})
    local ok, value = pcall(fn)
    if not ok then fail(name, text, tostring(value)) end
    items[#items + 1] = {text = piece, value = value}
    i = skip(text, e)
    if i > #text then break end
    if text:sub(i, i) ~= "," then fail(name, text, "unexpected " .. text:sub(i, i) .. " after a value") end
    if not list then
      fail(name, text, "it is a list of values; kiln nb sweep takes lists")
    end
    i = i + 1
  end
  return items
end

-- "-p name=value" arguments -> {{name =, text =, value =}...} in the given order.
function M.parse_args(pairs_list, list)
  local out = {}
  for _, p in ipairs(pairs_list) do
    local name, text = p:match("^([%a_][%w_]*)=(.*)$")
    if not name then
      error(string.format("kiln nb: -p %s: expected name=value, with name a Lua identifier", p), 0)
    end
    out[#out + 1] = {name = name, text = text, items = M.parse(name, text, list)}
  end
  return out
end

-- The names the parameters cell sets: name -> "local" or "global".
function M.declared(source)
  local names = {}
  for line in (source .. "\n"):gmatch("([^\n]*)\n") do
    local code = line:gsub("%-%-.*$", "")
    local locals = code:match("^%s*local%s+([%a_][%w_%s,]*)=")
    if locals then
      for n in locals:gmatch("[%a_][%w_]*") do names[n] = "local" end
    else
      local globals = code:match("^%s*([%a_][%w_%s,]*)=[^=]")
      if globals then
        for n in globals:gmatch("[%a_][%w_]*") do
          if names[n] == nil then names[n] = "global" end
        end
      end
    end
  end
  return names
end

-- The source of the injected cell: one assignment per parameter, in the given order, local
-- where the parameters cell declared the name local. Returns source, unknown names.
function M.injected_source(values, declared)
  local lines, unknown = {"-- Parameters"}, {}
  for _, p in ipairs(values) do
    local kind = declared and declared[p.name]
    if declared and not kind then unknown[#unknown + 1] = p.name end
    lines[#lines + 1] = string.format("%s%s = %s", kind == "local" and "local " or "", p.name, p.text)
  end
  return table.concat(lines, "\n"), unknown
end

return M
