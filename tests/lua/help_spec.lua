-- Help for every public name: `?x` / kiln.help(x) answers for each function and class of kiln,
-- kiln.nn, kiln.functional, kiln.optim, kiln.data, kiln.audio and kiln.checkpoint, and the
-- reference sections of docs/*.md are generated from the same lines (tools/api_doc.lua).
local kiln = kiln or require "kiln"
local help = require "kiln.help"
local docs = require "kiln.docs"

local root = debug.getinfo(1, "S").source:match("^@(.*/)tests/lua/") or "./"

-- The namespaces a user reaches, and what each holds: every string key not starting with "_"
-- whose value is a function or a table (a class, a module table).
local NAMESPACES = {
  {"kiln", function() return kiln end},
  {"kiln.nn", function() return kiln.nn end},
  {"kiln.nn.Module", function() return kiln.nn.Module end},
  {"kiln.nn.init", function() return kiln.nn.init end},
  {"kiln.functional", function() return kiln.functional end},
  {"kiln.optim", function() return kiln.optim end},
  {"kiln.optim.Optimizer", function() return kiln.optim.Optimizer end},
  {"kiln.optim.lr_scheduler", function() return kiln.optim.lr_scheduler end},
  {"kiln.optim.lr_scheduler.LRScheduler", function() return kiln.optim.lr_scheduler.LRScheduler end},
  {"kiln.data", function() return kiln.data end},
  {"kiln.data.transforms", function() return kiln.data.transforms end},
  {"kiln.audio", function() return kiln.audio end},
  {"kiln.checkpoint", function() return kiln.checkpoint end},
  {"kiln.amp", function() return kiln.amp end},
  {"kiln.amp.GradScaler", function() return kiln.amp.GradScaler end},
  {"kiln.autograd", function() return kiln.autograd end},
  {"kiln.ui", function() return kiln.ui end},
  {"kiln.io", function() return kiln.io end},
  {"kiln.cuda", function() return kiln.cuda end},
  {"kiln.dist", function() return kiln.dist end},
  {"kiln.plot", function() return kiln.plot end},
  {"kiln.autograd.FunctionContext", function() return kiln.autograd.FunctionContext end},
}

local function public_names()
  local list = {}
  for _, ns in ipairs(NAMESPACES) do
    local t = ns[2]()
    local keys = {}
    for k, v in pairs(t) do
      if type(k) == "string" and k:sub(1, 1) ~= "_" and (type(v) == "function" or type(v) == "table") then
        keys[#keys + 1] = k
      end
    end
    table.sort(keys)
    for _, k in ipairs(keys) do list[#list + 1] = {ns[1] .. "." .. k, t[k]} end
  end
  return list
end

describe("help", function()
  before_each(function() help.reset() end)

  it("answers for every public name of kiln, nn, functional, optim, data, audio and checkpoint", function()
    local missing = {}
    local names = public_names()
    assert.is_true(#names > 300, "the walk found " .. #names .. " names")
    for _, nv in ipairs(names) do
      local line = help.help(nv[2], nv[1])
      if line:find("^no help") then missing[#missing + 1] = nv[1] end
    end
    assert.are.same({}, missing, "names without a help line (add them to lua/kiln/docs.lua): " .. table.concat(missing, " "))
  end)

  it("answers by value with the line filed under the name", function()
    assert.equal(docs["kiln.nn.Linear"], kiln.help(kiln.nn.Linear))
    assert.equal(docs["kiln.nn.Module.parameters"], kiln.help(kiln.nn.Module.parameters))
    assert.equal(docs["kiln.optim.lr_scheduler.StepLR"], kiln.help(kiln.optim.StepLR))
    assert.equal(docs["kiln.data.DataLoader"], kiln.help(kiln.data.DataLoader))
    assert.equal(docs["kiln.checkpoint.save"], kiln.help(kiln.checkpoint.save))
    assert.equal(docs["kiln.nn.functional.conv1d"], kiln.help(kiln.F.conv1d))
  end)

  it("answers help(f) for a function value as help(\"its name\") and ?name: a sample", function()
    local repl = require "kiln.repl"
    local state = repl.new{env = setmetatable({kiln = kiln}, {__index = _G})}
    local cases = {
      {kiln.sort, "kiln.sort", docs["Tensor:sort"]},
      {kiln.Tensor.sort, "Tensor:sort", docs["Tensor:sort"]},
      {kiln.einsum, "kiln.einsum", docs["kiln.einsum"]},
      {kiln.F.einsum, "F.einsum", docs["kiln.einsum"]},   -- one function, one line naming both
      {kiln.no_grad, "kiln.no_grad", docs["kiln.autograd.no_grad"]},
      {kiln.seed, "kiln.seed", docs["kiln.manual_seed"]},
      {kiln.F.interpolate, "kiln.nn.functional.interpolate", docs["kiln.nn.functional.interpolate"]},
      {kiln.functional, "kiln.functional", docs["kiln.nn.functional"]},
      {kiln.help, "help", docs.help},
      {kiln.optim.lr_scheduler.LRScheduler.step, "kiln.optim.lr_scheduler.LRScheduler.step",
       docs["kiln.optim.lr_scheduler.LRScheduler.step"]},   -- also reachable as kiln.optim.LRScheduler
      {kiln.nn.Sequential{}.add, "kiln.nn.Sequential.add", docs["kiln.nn.Sequential.add"]},   -- a class's method
      {kiln.data.DataLoader{dataset = kiln.data.TensorDataset(kiln.zeros(2, 1)), batch_size = 1}.epoch,
       "kiln.data.DataLoader.epoch", docs["kiln.data.DataLoader.epoch"]},
    }
    for _, c in ipairs(cases) do
      assert.is_string(c[3], c[2])
      assert.equal(c[3], kiln.help(c[1]), "help(value) of " .. c[2])
      assert.equal(c[3], kiln.help(c[2]), "help(\"" .. c[2] .. "\")")
      assert.equal(c[3], select(2, repl.eval_line(state, "?" .. c[2])), "?" .. c[2])
    end
  end)

  it("answers by value as by name for every name the help lines are filed under, and every public name", function()
    -- kiln.nb and kiln.repl are loaded by the launcher's commands, not by kiln
    require "kiln.nb"
    require "kiln.repl"
    -- the class a constructor closes over (its __name is the constructor's name): where a class's
    -- methods are, found here by reflection, not the way kiln.help finds them
    local function class_of(ctor, name)
      for i = 1, 200 do
        local n, v = debug.getupvalue(ctor, i)
        if n == nil then return nil end
        if type(v) == "table" and rawget(v, "__name") == name then return v end
      end
    end
    local function value(name)
      if name == "help" then return kiln.help elseif name == "kiln" then return kiln elseif name == "Tensor" then return kiln.Tensor end
      local method = name:match("^Tensor:(.+)$")
      if method then return rawget(kiln.Tensor, method) end
      local parts = {}
      for p in name:gmatch("[^.]+") do parts[#parts + 1] = p end
      if parts[1] ~= "kiln" then return nil end
      local v = kiln
      for i = 2, #parts do
        if type(v) == "function" then
          local class = class_of(v, parts[i - 1])
          if not class then return nil end
          v = rawget(class, parts[i])
          if v == nil and type(rawget(class, "methods")) == "table" then v = rawget(class.methods, parts[i]) end
        elseif type(v) == "table" then
          local t = v
          v = rawget(t, parts[i])
          if v == nil and t == kiln then v = package.loaded["kiln." .. parts[i]] end
        else
          return nil
        end
      end
      return v
    end
    local names = {}
    for name in pairs(docs) do names[#names + 1] = name end
    for name in pairs(help.aliases) do names[#names + 1] = name end
    table.sort(names)
    local differ, unreached, checked = {}, {}, 0
    for _, name in ipairs(names) do
      local v = value(name)
      if type(v) == "function" or type(v) == "table" then
        checked = checked + 1
        local by_value, by_name = kiln.help(v), kiln.help(name)
        if by_value ~= by_name then differ[#differ + 1] = name .. ": by value: " .. by_value .. " | by name: " .. by_name end
      else
        unreached[#unreached + 1] = name
      end
    end
    assert.are.same({}, differ, "help by value differs from help by name")
    assert.is_true(checked > 500, checked .. " names checked")
    -- the names that hold no function or table: tensor properties (t.grad), abstract methods a
    -- class's user writes, a string
    assert.are.same({"Tensor:grad", "Tensor:requires_grad", "kiln.nn.Module.forward", "kiln.nn.Module.init",
                     "kiln.optim.lr_scheduler.LRScheduler.get_lr", "kiln.version"}, unreached)
    -- and the public names the walk above finds (kiln.F.conv1d, kiln.optim.LRScheduler, ...)
    for _, nv in ipairs(public_names()) do
      local by_value, by_name = help.help(nv[2]), help.help(nv[1])
      if by_value ~= by_name then differ[#differ + 1] = nv[1] .. ": by value: " .. by_value .. " | by name: " .. by_name end
    end
    assert.are.same({}, differ, "help by value differs from help by name")
  end)

  it("tells kiln.<method>(t) by the line of t:<method>()", function()
    assert.equal(docs["Tensor:exp"], kiln.help(kiln.exp))
    assert.equal(docs["Tensor:sum"], kiln.help("kiln.sum"))
    assert.equal(docs["Tensor:exp"] .. "; t:exp_ does it in place, into t", kiln.help(kiln.exp_))
  end)

  it("tells an object made by a class by its class's line", function()
    local lin = kiln.nn.Linear(2, 3)
    assert.equal(docs["kiln.nn.Linear"], kiln.help(lin))
    assert.equal(docs["kiln.nn.Sequential"], kiln.help(kiln.nn.Sequential{lin}))
    local opt = kiln.optim.AdamW(lin:parameters())
    assert.equal(docs["kiln.optim.AdamW"], kiln.help(opt))
    assert.equal(docs["kiln.optim.lr_scheduler.StepLR"], kiln.help(kiln.optim.StepLR(opt, {step_size = 2})))
    local loader = kiln.data.DataLoader{dataset = kiln.data.TensorDataset(kiln.zeros(4, 2)), batch_size = 2}
    assert.equal(docs["kiln.data.DataLoader"], kiln.help(loader))
  end)

  it("answers for the methods of kiln's objects, by their class (?loader:epoch, ?seq:add)", function()
    local repl = require "kiln.repl"
    local ds = kiln.data.TensorDataset(kiln.zeros(4, 2), kiln.zeros(4))
    local env = setmetatable({kiln = kiln, seq = kiln.nn.Sequential{kiln.nn.Linear(2, 2)}, list = kiln.nn.ModuleList{},
                              loader = kiln.data.DataLoader{dataset = ds, batch_size = 2}, ds = ds,
                              opt = kiln.optim.SGD(kiln.nn.Linear(2, 2):parameters()),
                              sched = nil}, {__index = _G})
    env.sched = kiln.optim.StepLR(env.opt, {step_size = 1})
    local state = repl.new{env = env}
    -- every method of each object's class (and its bases) has a line
    local missing = {}
    local objects = {seq = env.seq, list = env.list, ds = env.ds, opt = env.opt, sched = env.sched,
                     loader = getmetatable(env.loader).methods}
    for oname, obj in pairs(objects) do
      local methods = {}
      local class = oname == "loader" and obj or getmetatable(obj)
      for _ = 1, 4 do
        if type(class) ~= "table" then break end
        for k, v in pairs(class) do if type(k) == "string" and type(v) == "function" and not k:find("^_") then methods[k] = true end end
        local mt = getmetatable(class)
        class = type(mt) == "table" and rawget(mt, "__index") or nil
      end
      for m in pairs(methods) do
        local _, line = repl.eval_line(state, "?" .. oname .. ":" .. m)
        if line:find("^no help") then missing[#missing + 1] = oname .. ":" .. m end
      end
    end
    table.sort(missing)
    assert.are.same({}, missing, "methods without a help line: " .. table.concat(missing, " "))
    assert.equal(docs["kiln.data.DataLoader.epoch"], select(2, repl.eval_line(state, "?loader:epoch")))
    assert.equal(docs["kiln.nn.Sequential.add"], select(2, repl.eval_line(state, "?seq:add")))
    assert.equal(docs["kiln.nn.Module.parameters"], select(2, repl.eval_line(state, "?seq:parameters")))
    assert.equal(docs["kiln.optim.Optimizer.step"], select(2, repl.eval_line(state, "?opt:step")))
    assert.equal(docs["kiln.data.TensorDataset.get"], select(2, repl.eval_line(state, "?ds:get")))
  end)

  it("runs the example of every line that has one (\"; e.g. CODE [-- [sizes]]\")", function()
    local nn = kiln.nn
    local nn_before = {}
    for k in pairs(nn) do nn_before[k] = true end
    local model = nn.Sequential{nn.Linear(4, 2)}
    local count = 0
    for key, line in pairs(docs) do
      local example = line:match("; e%.g%. (.*)$")
      if example then
        count = count + 1
        local code, sizes = example:match("^(.-)%s*%-%- (%[[%d, ]*%])$")
        code = code or example
        local env = setmetatable({kiln = kiln, nn = nn, F = kiln.F, optim = kiln.optim, data = kiln.data,
                                  T = kiln.data.transforms, model = model, arg = {},
                                  opt = kiln.optim.SGD(model:parameters(), {lr = 0.1}),
                                  X = kiln.randn(70, 4), Y = kiln.randint(1, 3, {70})}, {__index = _G})
        local fn = loadstring("return " .. code, "=" .. key) or loadstring(code, "=" .. key)
        assert.truthy(fn, key .. ": the example does not compile: " .. code)
        setfenv(fn, env)
        local ok, value = pcall(fn)
        assert.is_true(ok, key .. ": " .. tostring(value))
        if sizes then assert.equal(sizes, tostring(value:size()), key) end
      end
    end
    assert.is_true(count >= 10, count .. " examples")
    for k in pairs(nn) do if not nn_before[k] then nn[k] = nil end end   -- nn.define's example made a class
  end)

  it("starts each line of a function with its call, which the docs split off", function()
    local api_doc = dofile(root .. "tools/api_doc.lua")
    local call, what = api_doc.split(docs["kiln.nn.Conv2d"])
    assert.equal("nn.Conv2d(in_channels, out_channels, kernel_size[, {stride = 1, padding = 0, dilation = 1, groups = 1, bias = true, dtype}])", call)
    assert.matches("^%[N,C,H,W%]", what)
  end)

  it("and the docs say the same (regenerate with: build/bin/kiln tools/api_doc.lua)", function()
    local api_doc = dofile(root .. "tools/api_doc.lua")
    for _, path in ipairs(api_doc.paths()) do
      local want, have = api_doc.expected(root, path)
      assert.truthy(have:find(api_doc.MARKER, 1, true), path .. " has no generated reference")
      if want ~= have then
        local a, b = {}, {}
        for l in have:gmatch("[^\n]*") do a[#a + 1] = l end
        for l in want:gmatch("[^\n]*") do b[#b + 1] = l end
        for k = 1, math.max(#a, #b) do assert.are.equal(b[k], a[k], path .. " is stale at line " .. k) end
      end
      -- every name of the doc's namespaces is in it
      assert.truthy(want:find("`nn.Linear(", 1, true) or path ~= "docs/nn.md", path)
    end
  end)

  it("the README's docs index links every page of docs/", function()
    local f = assert(io.open(root .. "README.md"))
    local readme = f:read("*a")
    f:close()
    local p = assert(io.popen("ls " .. root .. "docs"))
    local unlisted = {}
    for name in p:lines() do
      if name:match("%.md$") and not readme:find("(docs/" .. name .. ")", 1, true) then unlisted[#unlisted + 1] = name end
    end
    p:close()
    assert.are.same({}, unlisted, "docs/ pages missing from the README's index")
  end)
end)
