-- The REPL's logic (lua/kiln/repl.lua) without a terminal: evaluation, printing, multi-line
-- input, errors, `?x` help and Tab-completion candidates. Uses the real kiln when it loads
-- (as under `kiln tests/lua/run.lua`), else a small fake with the same shape.
local have_kiln, real_kiln = pcall(require, "kiln")

local function fake_kiln()
  local Tensor = {}
  local tensor_mt = {__index = Tensor, __tostring = function(t) return "[fake tensor " .. t.n .. "]" end}
  local k = {Tensor = Tensor}
  local function new(n) return setmetatable({n = n}, tensor_mt) end
  function Tensor.view(t, n) return new(n) end
  function Tensor.size(t) return t.n end
  function Tensor.sum(t) return t.n end
  function k.rand(n) return new(n) end
  function k.randn(n) return new(n) end
  function k.randint(lo, hi, n) return new(n) end
  function k.zeros(n) return new(n) end
  function k.is_tensor(x) return getmetatable(x) == tensor_mt end
  return k
end

local kiln = have_kiln and real_kiln or fake_kiln()
-- help() finds kiln through package.loaded (busted restores package.loaded after this file).
package.loaded.kiln = kiln
local repl = require "kiln.repl"
local help = require "kiln.help"

-- A fresh environment per test: globals assigned by the evaluated lines stay in it.
local function new_env()
  return setmetatable({kiln = kiln}, {__index = _G})
end

local function contains(list, value)
  for _, v in ipairs(list) do
    if v == value then return true end
  end
  return false
end

local function all_start_with(list, prefix)
  for _, v in ipairs(list) do
    if v:sub(1, #prefix) ~= prefix then return false end
  end
  return true
end

describe("kiln.repl completion", function()
  it("completes globals and keywords for a bare word", function()
    local env = new_env()
    env.my_variable = 1
    local c = repl.complete("my_v", "my_v", env)
    assert.same({"my_variable"}, c)
    assert.is_true(contains(repl.complete("pri", "pri", env), "print"))
    assert.is_true(contains(repl.complete("fun", "local f = fun", env), "function"))
    assert.is_true(contains(repl.complete("ki", "ki", env), "kiln"))
  end)

  it("completes table fields as whole words: kiln.ra", function()
    local c = repl.complete("kiln.ra", "x = kiln.ra", new_env())
    assert.is_true(contains(c, "kiln.rand"))
    assert.is_true(contains(c, "kiln.randn"))
    assert.is_true(contains(c, "kiln.randint"))
    assert.is_true(all_start_with(c, "kiln.ra"))
  end)

  it("completes nested fields and library tables", function()
    local c = repl.complete("string.up", "string.up", new_env())
    assert.same({"string.upper"}, c)
    local env = new_env()
    env.cfg = {model = {layers = 3, lr = 0.1}}
    assert.same({"cfg.model.layers", "cfg.model.lr"}, repl.complete("cfg.model.l", "cfg.model.l", env))
  end)

  it("completes tensor methods after t:", function()
    local env = new_env()
    env.t = kiln.randn(4)
    local c = repl.complete("t:vi", "t:vi", env)
    assert.is_true(contains(c, "t:view"))
    assert.is_true(all_start_with(c, "t:vi"))
    local all = repl.complete("t:", "t:", env)
    assert.is_true(contains(all, "t:size"))
    assert.is_true(contains(all, "t:sum"))
  end)

  it("completes methods of a tensor held in a real global (the default environment)", function()
    rawset(_G, "repl_spec_tensor", kiln.randn(2))
    local ok, c = pcall(repl.complete, "repl_spec_tensor:si", "repl_spec_tensor:si")
    rawset(_G, "repl_spec_tensor", nil)
    assert.is_true(ok)
    assert.is_true(contains(c, "repl_spec_tensor:size"))
  end)

  it("completes the methods of strings and values whose metatable __index is a table", function()
    local env = new_env()
    env.s = "abc"
    assert.is_true(contains(repl.complete("s:up", "s:up", env), "s:upper"))
    local Class = {forward = function() end, name = "not a method"}
    env.obj = setmetatable({}, {__index = Class})
    assert.same({"obj:forward"}, repl.complete("obj:", "obj:", env))
    assert.is_true(contains(repl.complete("obj.", "obj.", env), "obj.name"))
  end)

  it("gives nothing for unknown paths and odd text, without raising", function()
    local env = new_env()
    assert.same({}, repl.complete("nosuch.fi", "nosuch.fi", env))
    assert.same({}, repl.complete("kiln..x", "kiln..x", env))
    assert.same({}, repl.complete("1.5", "1.5", env))
    env.bad = setmetatable({}, {__index = function() error("no fields here") end})
    assert.same({}, repl.complete("bad.x.y", "bad.x.y", env))
  end)
end)

describe("kiln.repl evaluation", function()
  local state
  before_each(function() state = repl.new{env = new_env()} end)

  it("evaluates an expression and prints its value", function()
    assert.same({"ok", "3"}, {repl.eval_line(state, "1 + 2")})
    assert.same({"ok", ""}, {repl.eval_line(state, "x = 1 + 2")})
    assert.same({"ok", "6"}, {repl.eval_line(state, "x * 2")})
    assert.same({"ok", "1\tnil\tabc"}, {repl.eval_line(state, "1, nil, 'abc'")})
    assert.same({"ok", "5"}, {repl.eval_line(state, "=5")})
  end)

  it("prints nothing for nil results and blank lines", function()
    assert.same({"ok", ""}, {repl.eval_line(state, "nil")})
    assert.same({"ok", ""}, {repl.eval_line(state, "print_nothing_global")})
    assert.same({"ok", ""}, {repl.eval_line(state, "   ")})
  end)

  it("summarises tables on one line", function()
    local _, out = repl.eval_line(state, "{1, 2, a = 1, b = 'x', [10] = true, sub = {3}}")
    assert.equal('{1, 2, [10]=true, a=1, b="x", sub={3}}', out)
    local _, long = repl.eval_line(state, "(function() local t = {} for i = 1, 500 do t[i] = i end return t end)()")
    assert.truthy(long:find(", ...}$"))
    assert.is_true(#long < 200)
  end)

  it("prints a tensor through its __tostring", function()
    state.env.t = kiln.zeros(3)
    local status, out = repl.eval_line(state, "t")
    assert.equal("ok", status)
    assert.equal(tostring(state.env.t), out)
  end)

  it("reports an error and the next line still works", function()
    assert.same({"ok", ""}, {repl.eval_line(state, "x = 3")})
    local status, msg = repl.eval_line(state, "error('boom')")
    assert.equal("error", status)
    assert.equal("stdin:1: boom", msg)  -- no frames from the REPL itself
    assert.same({"ok", "6"}, {repl.eval_line(state, "x * 2")})
    local status2, msg2 = repl.eval_line(state, "x = = 1")
    assert.equal("error", status2)
    assert.truthy(msg2:find("stdin:1:", 1, true))
    assert.same({"ok", "6"}, {repl.eval_line(state, "x * 2")})
  end)

  it("shows the user's frames, not the REPL's, in a deeper error", function()
    repl.eval_line(state, "function inner() error('deep') end")
    local status, msg = repl.eval_line(state, "inner()")
    assert.equal("error", status)
    assert.truthy(msg:find("^stdin:1: deep\nstack traceback:"))
    assert.truthy(msg:find("in function 'inner'", 1, true))
    assert.falsy(msg:find("repl.lua", 1, true))
    assert.falsy(msg:find("xpcall", 1, true))
  end)

  it("leaves kiln's own library frames out of a traceback", function()
    if not have_kiln then return end
    repl.eval_line(state, "function layer(x) return x:matmul(kiln.zeros(4, 5)) + 1 end")
    local status, msg = repl.eval_line(state, "layer(kiln.zeros(2, 3))")
    assert.equal("error", status)
    assert.truthy(msg:find("^stdin:1: matmul: %[2,3%] @ %[4,5%]"), msg)
    assert.truthy(msg:find("in function 'layer'", 1, true), msg)
    assert.falsy(msg:find("kiln/core.lua", 1, true), msg)
    assert.falsy(msg:find("kiln/tensor.lua", 1, true), msg)
    assert.falsy(msg:find("function 'error'", 1, true), msg)
  end)

  it("runs what is typed with the JIT off, so that a debug hook stops a loop typed there", function()
    if not jit then return end
    local fired = 0
    debug.sethook(function()
      fired = fired + 1
      if fired > 1000 then debug.sethook() error("stopped by the hook", 0) end
    end, "", 1000)
    local status, msg = repl.eval_line(state, "local i = 0 while true do i = i + 1 end")
    debug.sethook()
    assert.equal("error", status)
    assert.equal("stopped by the hook", msg:match("^[^\n]*"))   -- a compiled loop never calls the hook
  end)

  it("reports error objects that are not strings", function()
    local status, msg = repl.eval_line(state, "error({code = 1})")
    assert.equal("error", status)
    assert.equal("(error object is a table value)", msg)
  end)

  it("reads a multi-line chunk until it is complete", function()
    assert.equal("more", (repl.eval_line(state, "function add(a, b)")))
    assert.equal("more", (repl.eval_line(state, "  return a + b")))
    assert.same({"ok", ""}, {repl.eval_line(state, "end")})
    assert.same({"ok", "5"}, {repl.eval_line(state, "add(2, 3)")})
    assert.equal("more", (repl.eval_line(state, "{1,")))
    assert.same({"ok", "{1, 2}"}, {repl.eval_line(state, "2}")})
    assert.equal("more", (repl.eval_line(state, "s = [[a")))
    assert.same({"ok", ""}, {repl.eval_line(state, "b]]")})
    assert.same({"ok", "a\nb"}, {repl.eval_line(state, "s")})
  end)

  it("drops a pending chunk on reset (Ctrl-C)", function()
    assert.equal("more", (repl.eval_line(state, "for i = 1, 3 do")))
    repl.reset(state)
    assert.same({"ok", "7"}, {repl.eval_line(state, "7")})
  end)
end)

describe("kiln.repl help", function()
  local state
  before_each(function()
    state = repl.new{env = new_env()}
    help.reset()
  end)

  it("?kiln.randn prints the help line of kiln.randn", function()
    local status, out = repl.eval_line(state, "?kiln.randn")
    assert.equal("ok", status)
    assert.equal(require("kiln.docs")["kiln.randn"], out)
    assert.truthy(out:find("randn", 1, true))
  end)

  it("help finds functions by identity, and names", function()
    assert.equal(require("kiln.docs")["kiln.zeros"], help.help(kiln.zeros))
    assert.equal(require("kiln.docs")["Tensor:view"], help.help(kiln.Tensor.view))
    assert.equal(require("kiln.docs")["Tensor:view"], help.help("Tensor.view"))
    assert.equal(require("kiln.docs")["kiln.randn"], help.help("randn"))
    assert.equal(require("kiln.docs").Tensor, help.help(kiln.zeros(2)))
    assert.equal("no help for nosuchthing", help.help("nosuchthing"))
    assert.equal("no help for nosuch.thing", select(2, repl.eval_line(state, "?nosuch.thing")))
    assert.truthy(help.help(function() end):find("^no help for function"))
  end)

  it("help tells aliases and in-place methods by the line of their twin", function()
    local docs = require "kiln.docs"
    assert.equal(docs["Tensor:clamp"], help.help("Tensor:clip"))
    assert.equal(docs["Tensor:exp"] .. "; t:exp_ does it in place, into t", help.help("Tensor.exp_"))
    assert.equal(docs.help, help.help())
  end)

  it("?t:view on a tensor variable gives the method's help", function()
    state.env.t = kiln.zeros(2)
    assert.equal(require("kiln.docs")["Tensor:view"], select(2, repl.eval_line(state, "?t:view")))
    assert.equal(require("kiln.docs")["Tensor:view"], select(2, repl.eval_line(state, "?t.view")))
  end)
end)

describe("kiln.repl.run", function()
  -- A file-like sink that collects what is written.
  local function sink()
    local s = {text = ""}
    function s:write(...)
      for i = 1, select("#", ...) do self.text = self.text .. select(i, ...) end
      return self
    end
    function s:flush() return self end
    return s
  end

  it("loops over lines until end of input, printing results and errors", function()
    local lines = {"x = 20", "x + 1", "error('boom')", "function f()", "return x * 2", "end", "f()"}
    local prompts, history = {}, {}
    local i = 0
    local function readline(prompt)
      prompts[#prompts + 1] = prompt
      i = i + 1
      return lines[i]
    end
    local out, err = sink(), sink()
    repl.run(readline, function(l) history[#history + 1] = l end, {env = new_env(), stdout = out, stderr = err})
    assert.equal("21\n40\n\n", out.text)
    assert.equal("stdin:1: boom\n", err.text)
    assert.same(lines, history)
    assert.equal(repl.continuation_prompt, prompts[5])
    assert.equal(repl.prompt, prompts[7])
  end)

  it("survives an interrupted line and a failing readline", function()
    local script = {
      function() return "for i = 1, 2 do" end,
      function() return nil, "interrupted" end,  -- Ctrl-C drops the pending chunk
      function() error("stray interrupt") end,
      function() return "1 + 1" end,
      function() return nil end,
    }
    local i = 0
    local out, err = sink(), sink()
    repl.run(function() i = i + 1 return script[i]() end, nil, {env = new_env(), stdout = out, stderr = err})
    assert.equal("2\n\n", out.text)
    assert.truthy(err.text:find("stray interrupt", 1, true))
  end)

  it("installs help as a global of its environment", function()
    local env = new_env()
    repl.run(function() return nil end, nil, {env = env, stdout = sink(), stderr = sink()})
    assert.equal("function", type(rawget(env, "help")))
  end)
end)

describe("Ctrl-C under the kiln launcher", function()
  local H = require "helpers"
  local exe = H.kiln_exe()
  -- Runs the shell lines `start` (which start kiln in the background and set pid), waits until
  -- the shell condition `ready` holds (the code is running: at most 10 s), sends kiln SIGINT
  -- 0.3 s later and gives it 5 s to end; the output, and whether it had to be killed. (A fixed
  -- wait sent it, on a loaded machine, while kiln was still loading its library or reading the
  -- REPL's line, an interrupt of something else.)
  local function interrupt(start, ready)
    local out = H.capture(start .. "\ni=0\nwhile ! (" .. ready .. ") && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done" .. [[

sleep 0.3
kill -INT $pid
i=0
while kill -0 $pid 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
if kill -0 $pid 2>/dev/null; then kill -9 $pid; echo STILL-RUNNING; fi
wait $pid 2>/dev/null]])
    return out, out:find("STILL-RUNNING", 1, true) ~= nil
  end
  -- Lua that creates the file at path: the first statement of a script, so that the test knows
  -- the script runs
  local function mark(path) return string.format('io.open("%s", "w"):close() ', path) end
  local function read_and_remove(path)
    local f = assert(io.open(path))
    local text = f:read("*a")
    f:close()
    os.remove(path)
    return text
  end

  -- A pcall in the running code catches the "interrupted" error; it is raised again after it.
  local loops = {"while true do pcall(error) end",
                 "jit.off() while true do pcall(function() for i = 1, 1e5 do end end) end"}
  for _, code in ipairs(loops) do
    it("ends a script that catches the interrupt in a pcall: " .. code, function()
      if not exe then pending("not running under the kiln launcher") return end
      local log, started = os.tmpname(), os.tmpname()
      os.remove(started)
      local out, hung = interrupt(string.format("%s -e '%s%s' > %s 2>&1 &\npid=$!", exe, mark(started), code, log),
                                  "[ -e " .. started .. " ]")
      os.remove(started)
      local text = read_and_remove(log)
      assert.is_false(hung, out .. text)
      assert.truthy(text:find("kiln: interrupted", 1, true), text)
    end)
  end

  it("says a Ctrl-C while the library loads is an interrupt, not a library that cannot load", function()
    if not exe then pending("not running under the kiln launcher") return end
    -- a kiln module first on the path (KILN_LUA_PATH) that says it has started, then loops
    local dir, log, started = os.tmpname(), os.tmpname(), os.tmpname()
    os.remove(dir)
    os.remove(started)
    assert(os.execute("mkdir " .. dir) == 0)
    local f = assert(io.open(dir .. "/kiln.lua", "w"))
    f:write(mark(started), "jit.off() while true do end\n")
    f:close()
    local out, hung = interrupt(string.format("KILN_LUA_PATH=%s %s -e 'print(1)' > %s 2>&1 &\npid=$!", dir, exe, log),
                                "[ -e " .. started .. " ]")
    os.remove(started)
    os.remove(dir .. "/kiln.lua")
    os.remove(dir)
    local text = read_and_remove(log)
    assert.is_false(hung, out .. text)
    assert.truthy(text:find("kiln: interrupted", 1, true), text)
    assert.is_nil(text:find("could not load", 1, true), text)
    assert.is_nil(text:find("\n1\n", 1, true), text)
  end)

  it("lets a script handle the interrupt from an xpcall handler that calls kiln.interrupt_caught", function()
    if not exe then pending("not running under the kiln launcher") return end
    local log = os.tmpname()
    local code = "local ok, e = xpcall(function() jit.off() while true do pcall(function() for i = 1, 1e5 do end end) end end, " ..
                 "function(e) kiln.interrupt_caught() return e end) for i = 1, 1e5 do end print(\"handled: \" .. e) os.exit(3)"
    local started = os.tmpname()
    os.remove(started)
    local out, hung = interrupt(string.format("%s -e '%s%s' > %s 2>&1 &\npid=$!", exe, mark(started), code, log),
                                "[ -e " .. started .. " ]")
    os.remove(started)
    local text = read_and_remove(log)
    assert.is_false(hung, out .. text)
    assert.matches("^handled: .*interrupted", text)
  end)

  for _, code in ipairs(loops) do
    it("brings the REPL back to its prompt through a pcall that catches the interrupt: " .. code, function()
      if not exe then pending("not running under the kiln launcher") return end
      local log, fifo = os.tmpname(), os.tmpname()
      os.remove(fifo)
      -- the REPL reads the loop, then (after the interrupt) 40 + 2, from a pipe; -i: a REPL on a pipe
      local out, hung = interrupt(string.format([[
mkfifo %s
(echo '%s'; sleep 1.5; echo '40 + 2') > %s &
%s -i < %s > %s 2>&1 &
pid=$!]], fifo, code, fifo, exe, fifo, log), string.format("grep -qF '%s' %s", code, log))
      os.remove(fifo)
      local text = read_and_remove(log)
      assert.is_false(hung, out .. text)
      assert.truthy(text:find("\ninterrupted\n", 1, true), text)
      assert.truthy(text:find("\n42\n", 1, true), text)
    end)
  end
end)
