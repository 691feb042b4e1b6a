-- kiln.json: one line of JSON for metrics logs and kiln.ui: numbers (NaN and infinities become
-- null; integers up to 2^53 exactly, others as the shortest text that reads back the same double),
-- strings, booleans, nested tables (arrays when keyed 1..n, else objects with sorted keys) and
-- tensors (nested arrays).
local ffi = require "ffi"

local M = {}

local function is_tensor(x) return type(x) == "cdata" and ffi.istype("struct kiln_ref", x) end

local escapes = {['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t"}
local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return escapes[c] or string.format("\\u%04x", c:byte()) end) .. '"'
end

-- The shortest of %.15g, %.16g, %.17g that reads back as the same double; integers without a point.
local function encode_number(x)
  if x ~= x or x == math.huge or x == -math.huge then return "null" end
  if x == math.floor(x) and math.abs(x) < 2 ^ 53 then return string.format("%d", x) end
  for digits = 15, 17 do
    local s = string.format("%." .. digits .. "g", x)
    if tonumber(s) == x then return s end
  end
end

local encode

-- A table is an array when its keys are exactly 1..#t (and it is not empty); otherwise an object
-- with its keys sorted. An empty table is {}.
local function encode_table(t, seen)
  if seen[t] then error("json_encode: a table contains itself", 0) end
  seen[t] = true
  local n, count = #t, 0
  for _ in pairs(t) do count = count + 1 end
  local out = {}
  if n > 0 and count == n then
    for i = 1, n do out[i] = encode(t[i], seen) end
    seen[t] = nil
    return "[" .. table.concat(out, ",") .. "]"
  end
  local entries = {}
  for k, v in pairs(t) do
    if type(k) == "number" then k = encode_number(k)
    elseif type(k) ~= "string" then error("json_encode: a key of type " .. type(k) .. " (keys must be strings or numbers)", 0) end
    entries[#entries + 1] = {k, v}
  end
  table.sort(entries, function(a, b) return a[1] < b[1] end)
  for i, e in ipairs(entries) do out[i] = encode_string(e[1]) .. ":" .. encode(e[2], seen) end
  seen[t] = nil
  return "{" .. table.concat(out, ",") .. "}"
end

function encode(v, seen)
  local kind = type(v)
  if v == nil then return "null" end
  if kind == "boolean" then return v and "true" or "false" end
  if kind == "number" then return encode_number(v) end
  if kind == "string" then return encode_string(v) end
  if kind == "table" then return encode_table(v, seen) end
  if is_tensor(v) then
    if v:dim() == 0 then return encode(v:item(), seen) end
    return encode(v:totable(), seen)
  end
  if kind == "cdata" and tonumber(v) then return encode_number(tonumber(v)) end
  error("json_encode: cannot encode a " .. kind, 0)
end

-- One line of JSON: numbers (NaN and infinities become null), strings, booleans, nested tables
-- (arrays when keyed 1..n, else objects with sorted keys) and tensors (nested arrays).
function M.encode(v)
  local ok, s = pcall(encode, v, {})
  if not ok then error(s, 2) end
  return s
end

return M
