-- tools/api_doc.lua: the reference sections of docs/nn.md, docs/autograd.md, docs/optim.md and
-- docs/data.md, generated from the help lines (lua/kiln/docs.lua), so that `?x` in the REPL and
-- the docs say the same. Each doc is prose written by hand down to the marker line, then the
-- generated reference.
-- usage: build/bin/kiln tools/api_doc.lua          rewrites the generated part of each doc
--        build/bin/kiln tools/api_doc.lua --check  lists the stale docs, exit status 1 if any
-- (tests/lua/help_spec.lua fails while one is stale)
local docs = require "kiln.docs"

local M = {}

M.MARKER = "<!-- Generated from lua/kiln/docs.lua by tools/api_doc.lua: edit the help lines there, not below. -->"

-- The name a reader types, without the "kiln." of the module tables.
local function short(name)
  return (name:gsub("^kiln%.nn%.functional%.", "F."):gsub("^kiln%.nn%.", "nn."):gsub("^kiln%.optim%.", "optim.")
              :gsub("^kiln%.data%.", "data."))
end

-- Every help line whose key matches one of the patterns, sorted by key.
local function select(patterns, exclude)
  local keys = {}
  for k in pairs(docs) do
    local skip = exclude and exclude[k]
    if not skip then
      for _, p in ipairs(patterns) do
        if k:find(p) then keys[#keys + 1] = k break end
      end
    end
  end
  table.sort(keys, function(a, b) return a:lower() < b:lower() end)
  return keys
end

-- A help line is "call: what it does"; the call ends at the first ": " outside brackets and quotes.
function M.split(line)
  local depth, quote = 0, nil
  for i = 1, #line do
    local c = line:sub(i, i)
    if quote then
      if c == quote then quote = nil end
    elseif c == '"' then quote = c
    elseif c == "(" or c == "[" or c == "{" then depth = depth + 1
    elseif c == ")" or c == "]" or c == "}" then depth = depth - 1
    elseif c == ":" and depth == 0 and line:sub(i + 1, i + 1) == " " then
      return line:sub(1, i - 1), line:sub(i + 2)
    end
  end
  return nil, line
end

local function markdown_text(s)
  return (s:gsub("([*_<>|])", "\\%1"))
end

-- "- `call`: what it does; e.g. `example`" (the example, Lua after "; e.g. ", as code)
local function entry(key)
  local call, what = M.split(docs[key])
  local text, example = what:match("^(.-); e%.g%. (.*)$")
  what = example and (markdown_text(text) .. "; e.g. `" .. example .. "`") or markdown_text(what)
  return string.format("- `%s`: %s", call or short(key), what)
end

local CONTAINERS = {["kiln.nn.Sequential"] = true, ["kiln.nn.ModuleList"] = true, ["kiln.nn.Module"] = true,
                    ["kiln.nn.define"] = true, ["kiln.nn.is_module"] = true, ["kiln.nn.init"] = true,
                    ["kiln.nn.functional"] = true}

-- doc -> its sections {title, patterns, exclude}
M.DOCS = {
  ["docs/nn.md"] = {
    {"Defining modules", {"^kiln%.nn%.define$", "^kiln%.nn%.is_module$", "^kiln%.nn%.Module$"}},
    {"Module methods", {"^kiln%.nn%.Module%."}},
    {"Containers", {"^kiln%.nn%.Sequential", "^kiln%.nn%.ModuleList"}},
    {"Layers and losses", {"^kiln%.nn%.%u[%w]*$"}, CONTAINERS},
    {"Initialisation (nn.init)", {"^kiln%.nn%.init"}},
    {"Functions (kiln.nn.functional, also kiln.F)", {"^kiln%.nn%.functional"}},
  },
  ["docs/autograd.md"] = {
    {"Grad mode and gradient checks", {"^kiln%.autograd$", "^kiln%.autograd%.[%l_]+$", "^kiln%.no_grad$", "^kiln%.enable_grad$",
                                       "^kiln%.set_grad_enabled$", "^kiln%.is_grad_enabled$", "^kiln%.gradcheck$"}},
    {"Custom functions", {"^kiln%.autograd%.Function"}},
    {"Tensors and the graph", {"^Tensor:backward$", "^Tensor:detach", "^Tensor:requires_grad", "^Tensor:grad$",
                               "^Tensor:retain_grad$", "^Tensor:register_hook$"}},
  },
  ["docs/optim.md"] = {
    {"Optimizers", {"^kiln%.optim$", "^kiln%.optim%.%u%w*$", "^kiln%.optim%.Optimizer%.", "^kiln%.optim%.define$",
                    "^kiln%.optim%.clip_grad"}},
    {"Learning-rate schedulers", {"^kiln%.optim%.lr_scheduler"}},
  },
  ["docs/data.md"] = {
    {"Datasets and loaders", {"^kiln%.data$", "^kiln%.data%.%a[%w_]*$", "^kiln%.data%.DataLoader%.",
                              "^kiln%.data%.TensorDataset%.", "^kiln%.data%.ImageFolder%."}, {["kiln.data.transforms"] = true}},
    {"Transforms (kiln.data.transforms)", {"^kiln%.data%.transforms"}},
  },
}

-- The generated part of a doc (from the marker line on).
function M.reference(path)
  local out = {M.MARKER, "", "## Reference", "",
               "The help lines of `?x` in the REPL (`kiln.help(x)`), one per name.", ""}
  for _, section in ipairs(M.DOCS[path]) do
    local keys = select(section[2], section[3])
    if #keys > 0 then
      out[#out + 1] = "### " .. section[1]
      out[#out + 1] = ""
      for _, k in ipairs(keys) do out[#out + 1] = entry(k) end
      out[#out + 1] = ""
    end
  end
  return table.concat(out, "\n")
end

local function read(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- The doc as it should be: its prose (what is above the marker; the whole file when there is no
-- marker yet) and the generated reference.
function M.expected(root, path)
  local text = read(root .. path) or ("# " .. path .. "\n\n")
  local at = text:find(M.MARKER, 1, true)
  local prose = at and text:sub(1, at - 1) or (text:gsub("%s*$", "") .. "\n\n")
  return prose .. M.reference(path), text
end

function M.paths()
  local list = {}
  for path in pairs(M.DOCS) do list[#list + 1] = path end
  table.sort(list)
  return list
end

if arg and arg[0] and arg[0]:find("api_doc%.lua$") then
  local root = arg[0]:match("^(.*/)tools/api_doc%.lua$") or "./"
  local check = arg[1] == "--check"
  local stale = 0
  for _, path in ipairs(M.paths()) do
    local want, have = M.expected(root, path)
    if want ~= have then
      stale = stale + 1
      if check then
        print("stale: " .. path)
      else
        local f = assert(io.open(root .. path, "w"))
        f:write(want)
        f:close()
        print("wrote " .. path)
      end
    end
  end
  if check and stale > 0 then os.exit(1) end
end

return M
