-- Cell scripts and .ipynb input: kiln's reading of a percent-format script against jupytext's own
-- (tests/fixtures/nb/percent.ipynb, written by tools/nb_fixtures.sh), .ipynb input, the notebook
-- written back, malformed files and parameter values as clear errors.
local cells = require "kiln.nb.cells"
local params = require "kiln.nb.params"
local N = require "nb_helpers"
local cjson = require "cjson"

local FIX = "tests/fixtures/nb/"

describe("kiln.nb.cells", function()
  it("splits a cell script into the cells jupytext finds, with their types, tags and titles", function()
    local mine = cells.read(FIX .. "percent.lua").cells
    local theirs = N.json(FIX .. "percent.ipynb").cells
    assert.equal(#theirs, #mine)
    for k, c in ipairs(theirs) do
      assert.equal(c.cell_type, mine[k].cell_type, "cell " .. k)
      assert.equal(table.concat(c.source), mine[k].source, "cell " .. k)
      assert.same(c.metadata.tags or {}, mine[k].metadata.tags or {}, "cell " .. k)
      assert.equal(c.metadata.title, mine[k].metadata.title, "cell " .. k)
    end
    -- where each cell's text starts in the file, for error messages
    assert.equal(12, mine[3].line)
  end)

  it("reads an .ipynb into the same cells, and writes them back as nbformat 4.5 with ids", function()
    local from_ipynb = cells.read(FIX .. "percent.ipynb")
    local from_script = cells.read(FIX .. "percent.lua")
    for k, c in ipairs(from_script.cells) do
      assert.equal(c.source, from_ipynb.cells[k].source)
      assert.equal(c.cell_type, from_ipynb.cells[k].cell_type)
    end
    local written = cjson.decode(cells.to_ipynb(from_script))
    assert.equal(4, written.nbformat)
    assert.equal(5, written.nbformat_minor)
    local ids = {}
    for k, c in ipairs(written.cells) do
      assert.truthy(c.id:match("^[%w_%-]+$"), c.id)
      assert.is_nil(ids[c.id])
      ids[c.id] = true
      assert.equal(from_script.cells[k].source, table.concat(c.source))
      if c.cell_type == "code" then assert.same({}, c.outputs) assert.equal(cjson.null, c.execution_count) end
    end
    assert.same({"parameters"}, written.cells[3].metadata.tags)
  end)

  it("says what is wrong with a malformed .ipynb, naming the file", function()
    local cases = {
      {'{"cells": [', "is not valid JSON"},
      {'[1, 2]', "nbformat is missing"},
      {'{"nbformat": 3, "cells": []}', "nbformat is 3; kiln reads nbformat 4"},
      {'{"nbformat": 4}', '"cells" is missing'},
      {'{"nbformat": 4, "cells": [{"cell_type": "code"}]}', "cell 1: source is missing"},
      {'{"nbformat": 4, "cells": [{"cell_type": "sql", "source": ""}]}', "cell 1: cell_type is sql"},
      {'{"nbformat": 4, "cells": [{"cell_type": "code", "source": [1]}]}', "source line 1 is a number"},
    }
    for _, case in ipairs(cases) do
      local ok, err = pcall(cells.parse_ipynb, case[1], "bad.ipynb")
      assert.is_false(ok)
      assert.truthy(err:find("bad.ipynb", 1, true), err)
      assert.truthy(err:find(case[2], 1, true), err .. "\nwanted: " .. case[2])
    end
  end)

  it("rejects an unknown cell type and metadata that is not JSON, naming the line", function()
    local ok, err = pcall(cells.parse_script, "-- %% [sql]\nx = 1\n", "s.lua")
    assert.is_false(ok)
    assert.truthy(err:find("s.lua:1: unknown cell type [sql]", 1, true), err)
    ok, err = pcall(cells.parse_script, "x = 1\n-- %% tags=[parameters\n", "s.lua")
    assert.is_false(ok)
    assert.truthy(err:find("s.lua:2: the value of tags is not JSON", 1, true), err)
  end)
end)

describe("kiln.nb.params", function()
  it("reads Lua literals, and only literals", function()
    local cases = {{"0.01", 0.01}, {"-3", -3}, {"1e-3", 1e-3}, {"0x10", 16}, {'"adam"', "adam"}, {"'a,b'", "a,b"},
                   {"true", true}, {"false", false}, {"{1, 2, n = 3}", {1, 2, n = 3}}, {"{[1] = 'x'}", {"x"}},
                   {"[[long]]", "long"}}
    for _, c in ipairs(cases) do
      local items = params.parse("p", c[1], false)
      assert.equal(1, #items)
      assert.same(c[2], items[1].value, c[1])
    end
    for _, bad in ipairs{"adam", "os.exit(1)", "1 + 2", "{x}", "{f()}", "'open", "", "lr"} do
      local ok, err = pcall(params.parse, "p", bad, false)
      assert.is_false(ok, bad)
      assert.truthy(err:find("-p p=" .. bad .. ": ", 1, true), err)
      assert.truthy(err:find("is not a Lua literal", 1, true), err)
    end
    local ok, err = pcall(params.parse, "lr", "0.1,0.01", false)
    assert.is_false(ok)
    assert.truthy(err:find("kiln nb sweep takes lists", 1, true), err)
  end)

  it("splits a sweep's list at the commas between values, not inside tables or strings", function()
    local items = params.parse("p", "0.1, {1,2}, 'a,b', 3", true)
    assert.same({0.1, {1, 2}, "a,b", 3}, {items[1].value, items[2].value, items[3].value, items[4].value})
  end)

  it("knows which names the parameters cell sets, and how", function()
    assert.same({lr = "local", a = "local", b = "local", seed = "global"},
                params.declared("local lr = 0.1 -- the rate\nlocal a, b = 1, 2\nseed = 1\nif seed == 2 then end"))
  end)
end)

describe("help", function()
  it("has a line for every public name of kiln.nb, kiln.display and kiln.plot", function()
    local help = require "kiln.help"
    local nb = require "kiln.nb"
    local missing = {}
    local function check(prefix, t)
      for k, v in pairs(t) do
        if type(k) == "string" and k:sub(1, 1) ~= "_" and (type(v) == "function" or (type(v) == "table" and getmetatable(v) == nil and k ~= "colors")) then
          if not help.lookup(prefix .. "." .. k) then missing[#missing + 1] = prefix .. "." .. k end
        end
      end
    end
    check("kiln.nb", nb)
    check("kiln.display", kiln.display)
    check("kiln.plot", kiln.plot)
    table.sort(missing)
    assert.same({}, missing)
    for _, name in ipairs{"kiln.nb", "kiln.display", "kiln.plot", "kiln.plot.colors"} do assert.truthy(help.lookup(name), name) end
    assert.equal(help.lookup("kiln.plot.line"), help.help(kiln.plot.line))
  end)
end)

