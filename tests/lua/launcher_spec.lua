-- The kiln launcher with scripts: tracebacks of the user's frames only, `kiln -i` after an error,
-- and "did you mean" for misspelt options and tensor methods.
local kiln = kiln or require "kiln"
local H = require "helpers"

local exe = H.kiln_exe()

local function script(text)
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

describe("the launcher", function()
  it("shows the user's frames in a script's traceback, not kiln's library", function()
    if not exe then return end
    local path = script("local function layer(x)\n  local y = x:matmul(kiln.zeros(4, 5))\n  return y\nend\nlayer(kiln.zeros(2, 3))\n")
    local out, ok = H.capture(exe .. " " .. path)
    os.remove(path)
    assert.is_false(ok)
    assert.matches(":2: matmul: %[2,3%] @ %[4,5%]: inner sizes differ", out)
    assert.matches("stack traceback:\n\t[^\n]*:2: in function 'layer'\n\t[^\n]*:5: in main chunk\n", out)
    assert.falsy(out:find("lua/kiln/", 1, true), out)
    assert.falsy(out:find("function 'error'", 1, true), out)
    assert.falsy(out:find("[C]: at", 1, true), out)
  end)

  it("keeps going into the REPL after an error with -i", function()
    if not exe then return end
    local path = script("before = 6\nerror('script failed')\n")
    local out = H.capture("echo 'print(before * 7)' | " .. exe .. " -i " .. path)
    os.remove(path)
    assert.matches("script failed", out)
    assert.matches("\n42\n", out)
    -- without -i an error ends the script with status 1
    local _, ok = H.capture(exe .. " -e \"error('x')\"")
    assert.is_false(ok)
  end)
end)

describe("did you mean", function()
  it("names the option meant by a misspelt one", function()
    assert.error_matches(function() kiln.zeros(2):requires_grad_():sum():backward{retain_grahp = true} end,
                         'unknown option "retain_grahp" %(known: retain_graph%); did you mean retain_graph%?')
    assert.error_matches(function() kiln.optim.SGD({kiln.zeros(2):requires_grad_()}, {lr = 0.1, momentun = 0.9}) end,
                         'SGD: unknown option "momentun" %(known: [%w_, ]+%); did you mean momentum%?')
    assert.error_matches(function() kiln.nn.Linear(2, 3, {baias = false}) end, 'did you mean bias%?')
    assert.error_matches(function() kiln.data.transforms.RandomCrop{32, pading = 4} end, 'did you mean padding%?')
    -- and nothing when no known option is close
    local ok, err = pcall(kiln.nn.Linear, 2, 3, {xyzzy = 1})
    assert.is_false(ok)
    assert.falsy(err:find("did you mean", 1, true))
  end)

  it("names the tensor method meant by a misspelt one", function()
    local t = kiln.zeros(2, 3)
    assert.error_matches(function() return t:vew(6) end, "t:vew: a tensor has no method or field vew; did you mean t:view%?")
    assert.error_matches(function() return t:trasnpose(1, 2) end, "did you mean t:transpose%?")
    assert.is_nil(t.no_such_field_at_all)
  end)

  it("finds the closest name by edit distance", function()
    local core = require "kiln.core"
    assert.equal("momentum", core.closest("momentun", {"lr", "momentum", "nesterov"}))
    assert.equal("transpose", core.closest("trasnpose", {"transpose", "t"}))   -- a swap of neighbours is one edit
    assert.is_nil(core.closest("lr", {"momentum"}))
  end)
end)

describe("the backward-twice error", function()
  it("says how to pass retain_graph", function()
    local x = kiln.randn(3):requires_grad_()
    local y = x:exp():sum()
    y:backward()
    assert.error_matches(function() y:backward() end, "loss:backward{retain_graph = true}", nil, true)
  end)
end)
