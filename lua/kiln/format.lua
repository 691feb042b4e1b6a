-- kiln.format: tostring of tensors, in the manner of Torch7: aligned columns, one format for
-- the whole tensor, vectors on one line (wrapped at linewidth), 2-d slices of larger tensors labelled (i,.,.), and a summary of big ones.
local core = require "kiln.core"
local C = core.C

local M = {}

M.options = {threshold = 1000, edgeitems = 3, precision = 4, linewidth = 100}

-- Pick the printf format and its width from the values that will be shown.
local function number_format(values, is_float)
  local maxabs, minabs, all_int = 0, math.huge, true
  for _, v in ipairs(values) do
    if v == v and v ~= math.huge and v ~= -math.huge then
      local a = math.abs(v)
      if a > maxabs then maxabs = a end
      if a ~= 0 and a < minabs then minabs = a end
      if v ~= math.floor(v) then all_int = false end
    end
  end
  local p = M.options.precision
  local fmt
  if not is_float then fmt = "%d"
  elseif all_int and maxabs < 1e8 then fmt = "%.0f"
  elseif maxabs >= 1e5 or (minabs < 1e-4 and minabs ~= math.huge) then fmt = "%." .. p .. "e"
  else fmt = "%." .. p .. "f" end
  local function show(v)
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" end
    if v == -math.huge then return "-inf" end
    if fmt == "%d" then return string.format("%d", v) end
    return string.format(fmt, v)
  end
  local width = 1
  for _, v in ipairs(values) do width = math.max(width, #show(v)) end
  return show, width
end

-- The indices of a dim that are shown: all, or the edges around a "...".
-- The indices of a dim that are shown; a cut dim (its edges only) gets a "..." in the middle.
local function shown(size, cut)
  local r = {}
  for i = 1, size do
    if cut and i == size / 2 + 1 then r[#r + 1] = false end
    r[#r + 1] = i
  end
  return r
end

function M.tensor(t)
  local dtype = core.dtype_names[t.p.dtype]
  local dev = core.device_name(t.p.device)
  local sizes = {}
  for i = 0, t.p.ndim - 1 do sizes[#sizes + 1] = tostring(tonumber(t.p.sizes[i])) end
  local footer = string.format("[kiln.Tensor %s%s of size %s]", dtype, dev ~= "cpu" and (" on " .. dev) or "",
                               #sizes > 0 and table.concat(sizes, "x") or "[]")
  if C.kiln_tensor_is_freed(t.p) == 1 then return "[kiln.Tensor " .. dtype .. " (freed)]" end
  if t.p.numel == 0 then return "[kiln.Tensor " .. dtype .. " with no elements, size " .. (#sizes > 0 and table.concat(sizes, "x") or "[]") .. "]" end
  local ok, host = pcall(function() return t.p.device.type == 0 and t or t:cpu() end)
  if not ok then return footer end
  -- Big tensors: keep only the edges of each long dim before anything is read.
  local summarize = tonumber(t.p.numel) > M.options.threshold
  local e = M.options.edgeitems
  local cut = {}
  if summarize then
    for d = 1, t.p.ndim do
      local n = host:size(d)
      if n > 2 * e then
        cut[d] = true
        host = host.cat({host:narrow(d, 1, e), host:narrow(d, n - e + 1, e)}, d)
      end
    end
  end
  local values = host:totable()
  if t.p.ndim == 0 then
    if type(values) == "boolean" then return tostring(values) .. "\n" .. footer end
    local show = number_format({values}, C.kiln_dtype_is_float(t.p.dtype) == 1)
    return show(values) .. "\n" .. footer
  end
  -- Collect the shown values to choose one format.
  local flat = {}
  local function collect(x, d)
    if type(x) ~= "table" then flat[#flat + 1] = type(x) == "boolean" and (x and 1 or 0) or x return end
    for _, i in ipairs(shown(#x, cut[d])) do if i then collect(x[i], d + 1) end end
  end
  collect(values, 1)
  local is_bool = t.p.dtype == C.KILN_BOOL
  local show, width = number_format(flat, C.kiln_dtype_is_float(t.p.dtype) == 1)
  local function cell(v)
    local s = is_bool and (v and "true" or "false") or show(v)
    return string.rep(" ", (is_bool and 5 or width) - #s) .. s
  end
  local lines = {}
  local function row(r)
    local parts = {}
    for _, j in ipairs(shown(#r, cut[t.p.ndim])) do parts[#parts + 1] = j and cell(r[j]) or "..." end
    return " " .. table.concat(parts, " ")
  end
  local function matrix(m)
    for _, i in ipairs(shown(#m, cut[t.p.ndim - 1])) do
      lines[#lines + 1] = i and row(m[i]) or " ..."
    end
  end
  if t.p.ndim == 1 then
    -- A vector prints as a row (as NumPy and PyTorch print it), wrapped at linewidth.
    local line = ""
    for _, i in ipairs(shown(#values, cut[1])) do
      local c = " " .. (i and cell(values[i]) or "...")
      if #line > 0 and #line + #c > M.options.linewidth then
        lines[#lines + 1] = line
        line = ""
      end
      line = line .. c
    end
    lines[#lines + 1] = line
  elseif t.p.ndim == 2 then
    matrix(values)
  else
    local function slices(x, d, prefix)
      if d == t.p.ndim - 1 then
        lines[#lines + 1] = "(" .. table.concat(prefix, ",") .. ",.,.) = "
        matrix(x)
        lines[#lines + 1] = ""
        return
      end
      for _, i in ipairs(shown(#x, cut[d])) do
        if i then
          -- A cut dim holds its edges only: the slices after the "..." keep their own numbers.
          prefix[#prefix + 1] = (cut[d] and i > #x / 2) and i + tonumber(t.p.sizes[d - 1]) - #x or i
          slices(x[i], d + 1, prefix)
          prefix[#prefix] = nil
        else
          lines[#lines + 1] = "..."
          lines[#lines + 1] = ""
        end
      end
    end
    slices(values, 1, {})
  end
  lines[#lines + 1] = footer
  return table.concat(lines, "\n")
end

return M
