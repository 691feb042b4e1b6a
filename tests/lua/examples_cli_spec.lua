-- Every example's command line goes through one parser (kiln.ui.parse_args): --help lists its
-- options and exits 0; a bad argument is one line on standard error and exit status 2, without a
-- traceback.
local kiln = kiln or require "kiln"
local H = require "helpers"
local ui = kiln.ui

local exe = H.kiln_exe()

-- stdout, stderr and the exit status of a command
local function run(cmd)
  local err = os.tmpname()
  local p = assert(io.popen(cmd .. " 2>" .. err .. "; echo \"exit status $?\""))
  local out = p:read("*a")
  p:close()
  local f = io.open(err)
  local stderr = f:read("*a")
  f:close()
  os.remove(err)
  local body, status = out:match("^(.*)exit status (%d+)\n$")
  return body, stderr, tonumber(status)
end

local function examples()
  local list = {}
  local p = assert(io.popen("ls examples/*.lua"))
  for path in p:lines() do list[#list + 1] = path end
  p:close()
  return list
end

describe("the examples' command line", function()
  it("answers --help with the example's usage and options, for every example", function()
    if not exe then return end
    local list = examples()
    assert.is_true(#list >= 5)
    for _, path in ipairs(list) do
      local out, err, status = run(exe .. " " .. path .. " --help")
      assert.equal(0, status, path .. ": " .. err)
      assert.truthy(out:find("\noptions:\n", 1, true), path .. ": " .. out)
      assert.truthy(out:find("--help, -h", 1, true), path)
      assert.equal("", err, path)
    end
    local out = run(exe .. " examples/fashion_mnist.lua --help")
    assert.matches("^examples/fashion_mnist.lua: train a model on Fashion%-MNIST", out)
    assert.matches("\n  %-%-batch%-size N\n", out)
    assert.matches("\n  %-%-workers N %(default 2%)\n", out)
  end)

  it("answers a bad argument with one line and status 2, for every example", function()
    if not exe then return end
    for _, path in ipairs(examples()) do
      local name = path:match("([%w_]+)%.lua$")
      local out, err, status = run(exe .. " " .. path .. " --no-such-option 1")
      assert.equal(2, status, path .. ": " .. out .. err)
      assert.equal(name .. ": unknown option --no-such-option (--help lists the options)\n", err)
    end
    local _, err, status = run(exe .. " examples/fashion_mnist.lua --epochs three")
    assert.equal(2, status)
    assert.equal('fashion_mnist: --epochs needs a number, got "three" (--help lists the options)\n', err)
    _, err, status = run(exe .. " examples/fashion_mnist.lua --model vgg")
    assert.equal(2, status)
    assert.equal("fashion_mnist: unknown model vgg (mlp, lenet, resnet) (--help lists the options)\n", err)
    _, err, status = run(exe .. " examples/char_lm.lua --hiden 8")
    assert.equal(2, status)
    assert.equal("char_lm: unknown option --hiden; did you mean --hidden? (--help lists the options)\n", err)
    _, err, status = run(exe .. " examples/speech_digits.lua --epochs")
    assert.equal(2, status)
    assert.equal("speech_digits: --epochs needs a value (--help lists the options)\n", err)
  end)
end)

describe("ui.parse_args", function()
  local spec = {name = "t", defaults = {lr = 0.1, model = "mlp"}, flags = {resume = true}, strict = {"steps"},
                numbers = {"steps"}, raise = true}

  it("reads --key value, --key=value and flags, with defaults and numbers", function()
    assert.are.same({lr = 0.5, model = "mlp", resume = "true", steps = 3},
                    (function()
                      local o = ui.parse_args({"--lr", "0.5", "--resume", "--steps=3"}, spec)
                      o.resume = tostring(o.resume)
                      return o
                    end)())
    assert.are.same({lr = 0.1, model = "lenet"}, ui.parse_args({"--model", "lenet"}, spec))
  end)

  it("names what is wrong", function()
    assert.error_matches(function() ui.parse_args({"--lrr", "1"}, spec) end, "^t: unknown option %-%-lrr; did you mean %-%-lr%?$")
    assert.error_matches(function() ui.parse_args({"--steps", "x"}, spec) end, '^t: %-%-steps needs a number, got "x"$')
    assert.error_matches(function() ui.parse_args({"--lr", "fast"}, spec) end, '^t: %-%-lr needs a number, got "fast"$')
    assert.error_matches(function() ui.parse_args({"--model"}, spec) end, "^t: %-%-model needs a value$")
    assert.error_matches(function() ui.parse_args({"extra"}, spec) end, "^t: unexpected argument extra$")
  end)
end)
