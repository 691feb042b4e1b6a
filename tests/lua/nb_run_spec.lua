-- `kiln nb run` end to end: parameters injected after the parameters cell, outputs captured per
-- cell, the executed notebook valid for nbformat (Debian's python3-nbformat) and read back the same,
-- a failing cell, a cell that never ends (--timeout, Ctrl-C), bad parameters, the runs index, and a
-- report that references nothing on the network.
local N = require "nb_helpers"
local cells = require "kiln.nb.cells"
local cjson = require "cjson"

local SCRIPT = [[
-- A notebook for the specs.

-- %% [markdown]
-- # A test notebook

-- %% tags=["parameters"]
local lr = 0.1
label = "base"

-- %%
local doubled = lr * 2
print("lr is " .. lr .. ", doubled " .. doubled)
io.write("label: ", label, "\n")

-- %%
local log = kiln.ui.metrics(OUT_METRICS, {mode = "w"})
for step = 1, 3 do log:log{step = step, loss = 1 / step} end
log:close()
kiln.display(kiln.tensor{{1, 2}, {3, 4}})
doubled + 1
]]

describe("kiln nb run", function()
  local dir, exe
  setup(function()
    exe = N.exe()
    dir = N.tmpdir("run")
    N.write(dir .. "/book.lua", (SCRIPT:gsub("OUT_METRICS", '"' .. dir .. '/logged.jsonl"')))
    N.write(dir .. "/fails.lua", "-- %%\nprint('first')\n-- %%\nprint('second')\nlocal t = nil\nlocal y = t.field\n-- %%\nprint('third')\n")
    N.write(dir .. "/loops.lua", "-- %%\nprint('before')\n-- %%\nwhile true do local _ = debug.getinfo(1, 'l') end\n-- %%\nprint('never')\n")
    N.write(dir .. "/jit_loop.lua", "-- %%\nprint('before')\n-- %%\nwhile true do end\n")
  end)
  teardown(function() N.rmdir(dir) end)

  local function run(args)
    return N.sh(string.format("cd %s && %s nb run %s", dir, exe, args))
  end

  it("injects parameters after the parameters cell and captures each cell's outputs", function()
    if not exe then pending("not running under the kiln launcher") return end
    local out, status = run("book.lua -p lr=0.25 -p 'label=\"swept\"' -o book")
    assert.equal(0, status, out)
    local nb = N.json(dir .. "/book/book.ipynb")
    -- header, markdown, parameters, injected, two code cells
    assert.equal(6, #nb.cells)
    assert.same({"parameters"}, nb.cells[3].metadata.tags)
    assert.same({"injected-parameters"}, nb.cells[4].metadata.tags)
    assert.equal("-- Parameters\nlocal lr = 0.25\nlabel = \"swept\"", table.concat(nb.cells[4].source))
    assert.equal("lr is 0.25, doubled 0.5\nlabel: swept\n", table.concat(nb.cells[5].outputs[1].text))
    local outs = nb.cells[6].outputs
    assert.equal("display_data", outs[1].output_type)
    assert.truthy(table.concat(outs[1].data["text/html"]):find("<td>4</td>", 1, true))
    assert.equal("execute_result", outs[2].output_type)
    assert.equal("1.5", table.concat(outs[2].data["text/plain"]))
    assert.equal(nb.cells[6].execution_count, outs[2].execution_count)
    -- the runs index: one line, with the final metrics the notebook logged
    local index = N.lines(dir .. "/book/runs.jsonl")
    assert.equal(1, #index)
    assert.equal("ok", index[1].status)
    assert.same({lr = 0.25, label = "swept"}, index[1].parameters)
    assert.same({step = 3, loss = 1 / 3}, index[1].metrics)
    assert.truthy(index[1].start:match("^%d%d%d%d%-%d%d%-%d%dT"))
    assert.truthy(index[1]["end"] >= index[1].start)
    -- the report: everything inline
    local html = N.read(dir .. "/book/book.html")
    assert.truthy(html:find("lr is 0.25, doubled 0.5", 1, true))
    assert.falsy(html:lower():find("http", 1, true))
  end)

  it("writes a notebook that nbformat validates and that reads back into the same cells", function()
    if not exe then pending("not running under the kiln launcher") return end
    local py = N.python_with("nbformat")
    if not py then pending("python3-nbformat is not installed (sudo apt-get install python3-nbformat)") return end
    local out, status = run("book.lua -o valid.ipynb")
    assert.equal(0, status, out)
    out, status = N.sh(py .. " -c \"import nbformat, sys; nb = nbformat.read(sys.argv[1], as_version=nbformat.NO_CONVERT); "
                       .. "nbformat.validate(nb); assert nb.nbformat == 4 and nb.nbformat_minor == 5; "
                       .. "print(len(nb.cells), nb.cells[3].outputs[0].text)\" " .. dir .. "/valid.ipynb")
    assert.equal(0, status, out)
    assert.equal("5 lr is 0.1, doubled 0.2\nlabel: base\n\n", out)
    -- round trip: the executed notebook, read as input, has the script's cells
    local again = cells.read(dir .. "/valid.ipynb").cells
    local script = cells.read(dir .. "/book.lua").cells
    assert.equal(#script, #again)
    for k, c in ipairs(script) do assert.equal(c.source, again[k].source) end
    -- and runs as a notebook itself
    out, status = run("valid.ipynb -o again")
    assert.equal(0, status, out)
    assert.equal("lr is 0.1, doubled 0.2\nlabel: base\n", table.concat(N.json(dir .. "/again/valid.ipynb").cells[4].outputs[1].text))
  end)

  it("stops at a failing cell: non-zero exit, the error with its cell and line, earlier outputs kept", function()
    if not exe then pending("not running under the kiln launcher") return end
    local out, status = run("fails.lua -o fails")
    assert.equal(1, status, out)
    assert.truthy(out:find("cell 2", 1, true), out)
    local nb = N.json(dir .. "/fails/fails.ipynb")
    assert.equal("first\n", table.concat(nb.cells[1].outputs[1].text))
    assert.equal("second\n", table.concat(nb.cells[2].outputs[1].text))
    local err = nb.cells[2].outputs[2]
    assert.equal("error", err.output_type)
    assert.truthy(err.evalue:find("fails.lua:6 (cell 2): attempt to index local 't'", 1, true), err.evalue)
    assert.truthy(table.concat(err.traceback, "\n"):find("Error in cell 2", 1, true))
    assert.same({}, nb.cells[3].outputs)
    assert.equal(cjson.null, nb.cells[3].execution_count)
    local index = N.lines(dir .. "/fails/runs.jsonl")
    assert.equal("error", index[1].status)
    assert.equal(2, index[1].error.cell)
    assert.truthy(N.read(dir .. "/fails/fails.html"):find("attempt to index local", 1, true))
  end)

  it("rejects a parameter that is not a Lua literal before anything runs, and warns of an unknown name", function()
    if not exe then pending("not running under the kiln launcher") return end
    local out, status = run("book.lua -p lr=adam -o never")
    assert.equal(1, status, out)
    assert.truthy(out:find("-p lr=adam: adam is not a Lua literal", 1, true), out)
    assert.is_nil(N.read(dir .. "/never/book.ipynb"))
    out, status = run("book.lua -p 'lr=os.exit(3)' -o never")
    assert.equal(1, status, out)
    assert.truthy(out:find("is not a Lua literal", 1, true), out)
    out, status = run("book.lua -p rate=0.5 -o unknown")
    assert.equal(0, status, out)
    assert.truthy(out:find("warning: rate is not set in the parameters cell", 1, true), out)
  end)

  it("converts a cell script to a notebook that nbformat validates", function()
    if not exe then pending("not running under the kiln launcher") return end
    local out, status = N.sh(string.format("cd %s && %s nb convert book.lua -o converted.ipynb", dir, exe))
    assert.equal(0, status, out)
    local nb = N.json(dir .. "/converted.ipynb")
    assert.equal(5, #nb.cells)
    assert.same({}, nb.cells[4].outputs)
    local py = N.python_with("nbformat")
    if py then
      out, status = N.sh(py .. " -c \"import nbformat, sys; nbformat.validate(nbformat.read(sys.argv[1], as_version=4))\" "
                         .. dir .. "/converted.ipynb")
      assert.equal(0, status, out)
    end
  end)

  it("says what is wrong with a malformed .ipynb", function()
    if not exe then pending("not running under the kiln launcher") return end
    N.write(dir .. "/broken.ipynb", '{"nbformat": 4, "cells": [{"cell_type": "code", "source": "x = 1"}, {"source": "y"}]}')
    local out, status = run("broken.ipynb -o broken")
    assert.equal(1, status, out)
    assert.truthy(out:find("broken.ipynb: cell 2: cell_type is missing", 1, true), out)
  end)

  it("stops a cell that runs past --timeout, keeping the outputs before it", function()
    if not exe then pending("not running under the kiln launcher") return end
    local t0 = os.time()
    local out, status = run("loops.lua --timeout 1 -o loops")
    assert.equal(124, status, out)
    assert.truthy(os.time() - t0 < 10)
    local nb = N.json(dir .. "/loops/loops.ipynb")
    assert.equal("before\n", table.concat(nb.cells[1].outputs[1].text))
    assert.equal("timeout", nb.cells[2].outputs[1].ename)
    assert.truthy(nb.cells[2].outputs[1].evalue:find("ran past --timeout 1 s", 1, true))
    assert.equal("timeout", N.lines(dir .. "/loops/runs.jsonl")[1].status)
    -- a loop LuaJIT has compiled never sees the hook: kiln ends itself, the files written before the cell
    out, status = run("jit_loop.lua --timeout 1 -o jit")
    assert.equal(124, status, out)
    assert.truthy(out:find("JIT-compiled loop", 1, true), out)
    nb = N.json(dir .. "/jit/jit_loop.ipynb")
    assert.equal("before\n", table.concat(nb.cells[1].outputs[1].text))
    assert.equal("cell 2 did not end", nb.cells[2].outputs[1].evalue)
  end)

  it("stops a cell on Ctrl-C (SIGINT), keeping the outputs before it", function()
    if not exe then pending("not running under the kiln launcher") return end
    local out, status = N.sh(string.format("cd %s && (%s nb run loops.lua -o int & pid=$!; sleep 1; kill -INT $pid; wait $pid)", dir, exe))
    assert.equal(130, status, out)
    local nb = N.json(dir .. "/int/loops.ipynb")
    assert.equal("before\n", table.concat(nb.cells[1].outputs[1].text))
    assert.equal("interrupted", nb.cells[2].outputs[1].ename)
    assert.equal("interrupted", N.lines(dir .. "/int/runs.jsonl")[1].status)
  end)
end)
