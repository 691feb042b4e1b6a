-- examples/fashion_mnist_nb.lua as a notebook, on a small part of Fashion-MNIST: the report shows
-- the training curves, a confusion matrix and the misclassified images; the same seed gives the
-- same metrics bit for bit in two runs; a sweep over two learning rates is compared in one report;
-- and the cell script still runs as a plain script.
local N = require "nb_helpers"

local SMALL = "-p epochs=1 -p train_size=1200 -p test_size=400 -p threads=1"

local function dataset_installed()
  local f = io.open("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz")
  if f then f:close() return true end
  return false
end

-- The logged rows without their wall-clock times.
local function without_time(path)
  local rows = N.lines(path)
  for _, r in ipairs(rows) do r.time = nil end
  return rows
end

describe("examples/fashion_mnist_nb.lua", function()
  local dir, exe, src
  setup(function()
    exe = N.exe()
    dir = N.tmpdir("example")
    src = io.popen("pwd"):read("*l") .. "/examples/fashion_mnist_nb.lua"
  end)
  teardown(function() N.rmdir(dir) end)

  local function skip()
    if not exe then pending("not running under the kiln launcher") return true end
    if not dataset_installed() then pending("Fashion-MNIST is not installed (sudo apt-get install dataset-fashion-mnist)") return true end
  end

  it("reports curves, a confusion matrix and misclassified images, the same each run", function()
    if skip() then return end
    local out, status = N.sh(string.format("cd %s && %s nb run %s %s -o a", dir, exe, src, SMALL))
    assert.equal(0, status, out)
    out, status = N.sh(string.format("cd %s && %s nb run %s %s -o b", dir, exe, src, SMALL))
    assert.equal(0, status, out)
    local a, b = without_time(dir .. "/a/fashion_mnist_nb.metrics.jsonl"), without_time(dir .. "/b/fashion_mnist_nb.metrics.jsonl")
    assert.equal(20, #a)   -- 19 steps of 64 (1200 images) and the epoch's evaluation
    assert.same(a, b)      -- numbers compared with ==: bit for bit
    local index = N.lines(dir .. "/a/runs.jsonl")[1]
    assert.equal("ok", index.status)
    assert.truthy(index.metrics.accuracy > 0.5, index.metrics.accuracy)
    local html = N.read(dir .. "/a/fashion_mnist_nb.html")
    assert.falsy(html:lower():find("http", 1, true))
    for _, title in ipairs{"training loss", "test accuracy", "confusion matrix", "misclassified test images"} do
      assert.truthy(html:find(">" .. title, 1, true), title)
    end
    assert.truthy(html:find("Sequential", 1, true))
    local py = N.python_with("nbformat")
    if py then
      out, status = N.sh(py .. " -c \"import nbformat, sys; nbformat.validate(nbformat.read(sys.argv[1], as_version=4))\" "
                         .. dir .. "/a/fashion_mnist_nb.ipynb")
      assert.equal(0, status, out)
    end
  end)

  it("compares a sweep over two learning rates in one report", function()
    if skip() then return end
    local out, status = N.sh(string.format("cd %s && %s nb sweep %s %s -p lr=0.05,0.01 -o sweep", dir, exe, src, SMALL))
    assert.equal(0, status, out)
    local index = N.lines(dir .. "/sweep/runs.jsonl")
    assert.equal(2, #index)
    assert.same({0.05, 0.01}, {index[1].parameters.lr, index[2].parameters.lr})
    local html = N.read(dir .. "/sweep/sweep.html")
    assert.truthy(html:find("lr=0.05", 1, true) and html:find("lr=0.01", 1, true))
    assert.truthy(html:find(">accuracy</text>", 1, true))
    assert.truthy(html:find(string.format("%.5g", index[2].metrics.accuracy), 1, true))
  end)

  it("still runs as a plain script", function()
    if skip() then return end
    local script = dir .. "/plain.lua"
    -- the same file with a smaller parameters cell
    local text = N.read(src):gsub("local train_size = 6000", "local train_size = 600"):gsub("local epochs = 2", "local epochs = 1")
    N.write(script, text)
    local out, status = N.sh(string.format("%s %s", exe, script))
    assert.equal(0, status, out)
    assert.truthy(out:find('"test_accuracy":', 1, true), out)
    assert.truthy(out:find("<kiln.plot confusion matrix", 1, true), out)
  end)
end)
