-- kiln.help: help(x), a one-line description of a kiln function, method or module.
-- x is a name or a value. A value is found by identity: first among the values of the names the
-- help lines are filed under (docs' keys and the aliases below), then in an index of everything
-- under the kiln table and kiln.Tensor (kiln.exp is t:exp); both are built when first needed and
-- rebuilt on a miss, as modules load lazily. help(kiln.sort) is help("kiln.sort").
local docs = require "kiln.docs"

local M = {}

local index   -- value -> list of names, weak keys
local by_value   -- value -> the documented name that holds it, weak keys
local instance_doc

local function kiln_table()
  local k = rawget(_G, "kiln") or package.loaded.kiln
  if type(k) == "table" then return k end
end

local function add(value, name)
  local names = index[value]
  if not names then
    names = {}
    index[value] = names
  end
  names[#names + 1] = name
end

-- Functions and tables under kiln, by raw access (a lazy-loading __index is not
-- triggered), to a few levels, each table once.
local function walk(t, prefix, depth, seen)
  if seen[t] or depth > 4 then return end
  seen[t] = true
  for k, v in next, t do
    if type(k) == "string" and (type(v) == "function" or type(v) == "table") then
      local name = prefix .. "." .. k
      add(v, name)
      if type(v) == "table" and k ~= "Tensor" then walk(v, name, depth + 1, seen) end
    end
  end
end

-- Where the objects' classes are filed: a class of __name n is documented as <home>n.
local class_homes = {"kiln.nn.", "kiln.optim.", "kiln.optim.lr_scheduler.", "kiln.data.", "kiln.dist."}

-- Aliases: the name of the line that documents them (a value under several names has one line,
-- which names the others).
local aliases = {
  ["Tensor:clip"] = "Tensor:clamp", ["Tensor:shape"] = "Tensor:size", ["Tensor:ndimension"] = "Tensor:dim",
  ["Tensor:nelement"] = "Tensor:numel", ["Tensor:greater"] = "Tensor:gt", ["Tensor:less"] = "Tensor:lt",
  ["Tensor:index"] = "Tensor:index_select", ["Tensor:totable"] = "Tensor:tolist", ["Tensor:ger"] = "Tensor:outer",
  ["kiln.F"] = "kiln.nn.functional", ["kiln.functional"] = "kiln.nn.functional",
  ["kiln.nn.functional.einsum"] = "kiln.einsum", ["kiln.seed"] = "kiln.manual_seed",
  ["kiln.cuda.manual_seed_all"] = "kiln.cuda.manual_seed", ["kiln.data.transform_pipeline"] = "kiln.data.transforms.pipeline",
  ["kiln.no_grad"] = "kiln.autograd.no_grad", ["kiln.enable_grad"] = "kiln.autograd.enable_grad",
  ["kiln.set_grad_enabled"] = "kiln.autograd.set_grad_enabled", ["kiln.is_grad_enabled"] = "kiln.autograd.is_grad_enabled",
  ["kiln.gradcheck"] = "kiln.autograd.gradcheck", ["kiln.data.DataLoader.iter"] = "kiln.data.DataLoader.epoch",
}
M.aliases = aliases

-- The classes of kiln's objects by the name their constructor has ("kiln.nn.Sequential"), from
-- the __index functions kiln.core made (core.indexed_classes), when kiln.core is loaded.
local function classes_by_name()
  local list = {}
  local core = package.loaded["kiln.core"]
  local known = type(core) == "table" and rawget(core, "indexed_classes")
  if type(known) ~= "table" then return list end
  for _, class in next, known do
    local n = type(class) == "table" and rawget(class, "__name")
    if type(n) == "string" then
      for _, home in ipairs(class_homes) do
        if docs[home .. n] and not list[home .. n] then list[home .. n] = class end
      end
    end
  end
  return list
end

-- The value a documented name holds, by raw access (nothing is loaded for it): "Tensor:x" in
-- kiln.Tensor; "kiln.a.b" from kiln (kiln.a also from package.loaded: kiln.nb, kiln.repl); past a
-- constructor ("kiln.nn.Sequential.add", "kiln.data.DataLoader.epoch"), in the class it makes.
local function documented_value(name, classes)
  local k = kiln_table()
  if not k then return nil end
  if name == "kiln" then return k end
  if name == "help" then return M.help end
  if name == "Tensor" then return rawget(k, "Tensor") end
  local method = name:match("^Tensor:([%a_][%w_]*)$")
  if method then
    local T = rawget(k, "Tensor")
    return type(T) == "table" and rawget(T, method) or nil
  end
  local rest = name:match("^kiln%.(.+)$")
  if not rest then return nil end
  local v, path = k, "kiln"
  for part in rest:gmatch("[^.]+") do
    local t = type(v) == "table" and v or classes[path]
    if type(t) ~= "table" then return nil end
    v = rawget(t, part)
    if v == nil and t == k then v = package.loaded["kiln." .. part] end
    path = path .. "." .. part
  end
  return v
end

-- value -> its documented name: every key of docs, then every alias, in order.
local function build_by_value()
  by_value = setmetatable({}, {__mode = "k"})
  local classes = classes_by_name()
  for _, names in ipairs({docs, aliases}) do
    local list = {}
    for name in pairs(names) do list[#list + 1] = name end
    table.sort(list)
    for _, name in ipairs(list) do
      local v = documented_value(name, classes)
      if (type(v) == "function" or type(v) == "table") and by_value[v] == nil then by_value[v] = name end
    end
  end
end

local function build()
  index = setmetatable({}, {__mode = "k"})
  local k = kiln_table()
  if not k then return end
  add(k, "kiln")
  add(M.help, "kiln.help")
  local methods = rawget(k, "Tensor")
  local seen = {}
  if type(methods) == "table" then
    add(methods, "Tensor")
    seen[methods] = true
    for name, v in next, methods do
      if type(name) == "string" and type(v) == "function" then add(v, "Tensor:" .. name) end
    end
  end
  walk(k, "kiln", 1, seen)
end

-- The documented name of value, else its first known name, else nil.
local function name_of(value)
  for attempt = 1, 2 do
    if not by_value or attempt == 2 then build_by_value() end
    if by_value[value] then return by_value[value] end
    if not index or attempt == 2 then build() end
    local names = index[value]
    if names then
      for _, name in ipairs(names) do
        if M.lookup(name) then return name end
      end
      if attempt == 2 then return names[1] end
    end
  end
end

-- The value a dotted name ("kiln.exp") holds, by raw access from the globals (kiln itself when it
-- is not a global); nil if none.
local function value_of(name)
  local v = _G
  if rawget(_G, "kiln") == nil and (name == "kiln" or name:find("^kiln%.")) then v = {kiln = kiln_table()} end
  for part in name:gmatch("[^.]+") do
    if type(v) ~= "table" then return nil end
    v = rawget(v, part)
  end
  if v ~= _G then return v end
end

-- A name as filed in docs: "Tensor.view" -> "Tensor:view", "randn" -> "kiln.randn".
local function canonical(name)
  local method = name:match("^Tensor[.:]([%a_][%w_]*)$")
  if method then return "Tensor:" .. method end
  -- kiln.F and kiln.functional are kiln.nn.functional, whose names the lines are filed under
  local f = name:match("^kiln%.F%.(.+)$") or name:match("^kiln%.functional%.(.+)$") or name:match("^F%.(.+)$")
  if f and (docs["kiln.nn.functional." .. f] or aliases["kiln.nn.functional." .. f]) then return "kiln.nn.functional." .. f end
  if docs[name] or name:find("^kiln%.") then return name end
  if docs["kiln." .. name] then return "kiln." .. name end
  return name
end

-- The line for a name, and the name it is filed under. An in-place method (t:exp_) is
-- told by its out-of-place twin.
function M.lookup(name)
  if type(name) ~= "string" then return nil end
  name = canonical(name:match("^%s*(.-)%s*$"))
  if docs[name] then return docs[name], name end
  if aliases[name] then return docs[aliases[name]], aliases[name] end
  -- kiln.exp(t) is t:exp()
  local method = name:match("^kiln%.([%a_][%w_]*)$")
  if method and (docs["Tensor:" .. method] or aliases["Tensor:" .. method] or method:sub(-1) == "_") then
    local doc = M.lookup("Tensor:" .. method)
    if doc then return doc, "Tensor:" .. method end
  end
  local base = name:match("^(Tensor:[%a_][%w_]*)_$")
  if base and docs[base] then
    return docs[base] .. "; " .. name:gsub("^Tensor:", "t:") .. " does it in place, into t", name
  end
end

local function is_tensor(v)
  local k = kiln_table()
  local is = k and rawget(k, "is_tensor")
  if type(is) == "function" then
    local ok, yes = pcall(is, v)
    return ok and yes
  end
  local ok, ffi = pcall(require, "ffi")
  return ok and type(v) == "cdata" and tostring(ffi.typeof(v)):find("struct kiln_", 1, true) ~= nil
end

-- An object made by a class (a module, an optimizer, a scheduler, a DataLoader): the line of its
-- class, found by the class's __name.
function instance_doc(x)
  local mt = getmetatable(x)
  local class_name = type(mt) == "table" and rawget(mt, "__name")
  if type(class_name) ~= "string" then return nil end
  for _, home in ipairs(class_homes) do
    if docs[home .. class_name] then return docs[home .. class_name] end
  end
end

-- The line of method `method` of object obj (?loader:epoch, ?seq:add): looked up along obj's class
-- chain, each class by its name in kiln (kiln.nn.Module) or its __name (DataLoader).
function M.method(obj, method)
  if type(obj) ~= "table" or type(method) ~= "string" then return nil end
  local class = getmetatable(obj)
  for _ = 1, 8 do
    if type(class) ~= "table" then return nil end
    local names = {}
    local known = name_of(class)
    if known then names[#names + 1] = known end
    local class_name = rawget(class, "__name")
    if type(class_name) == "string" then
      for _, home in ipairs(class_homes) do names[#names + 1] = home .. class_name end
    end
    for _, n in ipairs(names) do
      if docs[n .. "." .. method] then return docs[n .. "." .. method] end
    end
    local mt = getmetatable(class)
    class = type(mt) == "table" and rawget(mt, "__index") or nil
  end
end

-- help(x [, name]) -> one line. name (the text the user typed) is used when x is not known.
function M.help(x, name)
  if x == nil and name == nil then return docs.help end
  if type(x) == "string" and name == nil then
    local doc = M.lookup(x)
    if doc then return doc end
    -- "kiln.exp" is Tensor.exp under another name: help on the value the name holds.
    local v = x:match("^[%a_][%w_.]*$") and value_of(x)
    if type(v) == "function" or (type(v) == "table" and v ~= kiln_table()) then return M.help(v, x) end
    return "no help for " .. x
  end
  if is_tensor(x) then return docs.Tensor end
  local class_doc = type(x) == "table" and instance_doc(x)
  if class_doc then return class_doc end
  local known = (type(x) == "function" or type(x) == "table") and name_of(x)
  local doc = known and M.lookup(known) or M.lookup(name)
  if doc then return doc end
  return "no help for " .. (known or name or tostring(x))
end

-- For tests: forget the indexes, so that the next help() walks kiln again.
function M.reset()
  index, by_value = nil, nil
end

return M
