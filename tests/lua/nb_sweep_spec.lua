-- `kiln nb sweep`: every combination of the parameter lists runs, each result matches the same
-- computation done here, and one page compares them (a curve a run, a row a run, nothing fetched).
local N = require "nb_helpers"
local sweep = require "kiln.nb.sweep"
local params = require "kiln.nb.params"

local BOOK = [[
-- %% tags=["parameters"]
local lr = 0.1
local seed = 1

-- %%
kiln.manual_seed(seed)
local log = kiln.ui.metrics(METRICS .. "-" .. lr .. "-" .. seed, {mode = "w"})
local w = kiln.randn(1):item()
for step = 1, 30 do
  w = w - lr * 2 * w
  log:log{step = step, loss = w * w}
end
log:close()
]]

-- the notebook's computation, done here
local function final_loss(lr, seed)
  kiln.manual_seed(seed)
  local w = kiln.randn(1):item()
  for _ = 1, 30 do w = w - lr * 2 * w end
  return w * w
end

describe("kiln nb sweep", function()
  local dir, exe
  setup(function()
    exe = N.exe()
    dir = N.tmpdir("sweep")
    N.write(dir .. "/quad.lua", (BOOK:gsub("METRICS", '"' .. dir .. '/m"')))
  end)
  teardown(function() N.rmdir(dir) end)

  it("takes every combination, the first parameter varying slowest", function()
    local combos = sweep.combinations(params.parse_args({"lr=0.1,0.01", "seed=1,2,3"}, true))
    assert.equal(6, #combos)
    assert.same({"0.1", "1"}, {combos[1][1].text, combos[1][2].text})
    assert.same({"0.1", "3"}, {combos[3][1].text, combos[3][2].text})
    assert.same({"0.01", "1"}, {combos[4][1].text, combos[4][2].text})
  end)

  it("runs each combination and compares them in one report", function()
    if not exe then pending("not running under the kiln launcher") return end
    local out, status = N.sh(string.format("cd %s && %s nb sweep quad.lua -p lr=0.1,0.01 -p seed=1,2 -o sw", dir, exe))
    assert.equal(0, status, out)
    local index = N.lines(dir .. "/sw/runs.jsonl")
    assert.equal(4, #index)
    local want = {{0.1, 1}, {0.1, 2}, {0.01, 1}, {0.01, 2}}
    for i, line in ipairs(index) do
      assert.equal("ok", line.status)
      assert.same({lr = want[i][1], seed = want[i][2]}, line.parameters)
      assert.equal(final_loss(want[i][1], want[i][2]), line.metrics.loss)
      assert.equal(30, line.metrics.step)
    end
    local html = N.read(dir .. "/sw/sweep.html")
    assert.falsy(html:lower():find("http", 1, true))
    for _, label in ipairs{"lr=0.1, seed=1", "lr=0.1, seed=2", "lr=0.01, seed=1", "lr=0.01, seed=2"} do
      assert.truthy(html:find(label, 1, true), label)
    end
    local _, curves = html:gsub("<polyline", "")
    assert.truthy(curves >= 4 + 4, curves)   -- a curve a run (and a legend line each)
    assert.truthy(html:find(string.format("%.5g", final_loss(0.01, 2)), 1, true))
    assert.truthy(N.read(dir .. "/sw/quad-4.html"))
  end)

  it("rejects a list with a value that is not a literal before running anything", function()
    if not exe then pending("not running under the kiln launcher") return end
    local out, status = N.sh(string.format("cd %s && %s nb sweep quad.lua -p lr=0.1,fast -o bad", dir, exe))
    assert.equal(1, status, out)
    assert.truthy(out:find("fast is a name, not a value", 1, true), out)
    assert.is_nil(N.read(dir .. "/bad/runs.jsonl"))
  end)
end)
