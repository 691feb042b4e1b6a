-- The op table (runtime/src/dispatch/op_table.c): a row for every op, an f64 gradient check for
-- every differentiable one (op_gradchecks.lua), and docs/ops.md generated from it and current.
local kiln = require "kiln"
local ffi, C = kiln.ffi, kiln.C
local G = require "op_gradchecks"

local function rows()
  local list = {}
  local d = ffi.new("struct kiln_op_desc")
  for op = 0, tonumber(C.KILN_OP_COUNT) - 1 do
    assert(C.kiln_op_describe(op, d) == 0, ffi.string(C.kiln_error_message()))
    list[#list + 1] = {op = op, name = ffi.string(d.name), family = ffi.string(d.family),
                       differentiable = d.differentiable == 1, backward_kernel = d.backward_kernel == 1,
                       comparison = d.comparison == 1, dtypes_cpu = tonumber(d.dtypes_cpu)}
  end
  return list
end

local function capitalised(name) return name:sub(1, 1):upper() .. name:sub(2) end

describe("the op table", function()
  local list = rows()

  it("lists the CPU dtypes the elementwise kernels take: each listed one runs, each other is refused", function()
    local dtypes = {"f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool"}   -- bit d for enum kiln_dtype d
    local wrong = {}
    for _, r in ipairs(list) do
      if r.family == "unary" or r.family == "binary" or r.family == "comparison" then
        for d, dt in ipairs(dtypes) do
          local t = kiln.ones(3, {dtype = dt})
          local out = r.family == "unary" and C.kiln_unary(r.op, t.p) or C.kiln_binary(r.op, t.p, t.p)
          local ran = out ~= nil
          if ran then C.kiln_tensor_release(out) end
          local listed = bit.band(r.dtypes_cpu, bit.lshift(1, d - 1)) ~= 0
          if ran ~= listed then
            wrong[#wrong + 1] = string.format("%s on %s: %s, the table says %s", r.name, dt, ran and "runs" or "refused",
                                              listed and "listed" or "not listed")
          end
        end
      end
    end
    assert.are.same({}, wrong)
  end)

  it("has a named row for every op, and refuses a value outside the enum", function()
    local seen = {}
    for _, r in ipairs(list) do
      assert.truthy(r.name:match("^[a-z][a-z0-9_]*$"), r.op)
      assert.is_nil(seen[r.name], r.name)
      seen[r.name] = true
      assert.are.equal(r.name, ffi.string(C.kiln_op_name(r.op)))
      assert.truthy(r.family ~= "", r.name)
    end
    local d = ffi.new("struct kiln_op_desc")
    assert.are.equal(C.KILN_ERR_ARGUMENT, C.kiln_op_describe(C.KILN_OP_COUNT, d))
    assert.matches("op_describe: %d+ is not an op", ffi.string(C.kiln_error_message()))
    assert.are.equal(C.KILN_ERR_ARGUMENT, C.kiln_op_describe(-1, d))
  end)

  it("says what the elementwise front ends do with dtypes", function()
    local byname = {}
    for _, r in ipairs(list) do byname[r.name] = r end
    -- comparisons give bool; ops that keep integers give an integer tensor's dtype back; others f32
    local i = kiln.tensor({-2, 3}, {dtype = "i32"})
    for _, r in ipairs(list) do
      if r.family == "unary" then
        local d = ffi.new("struct kiln_op_desc")
        C.kiln_op_describe(r.op, d)
        local p = C.kiln_unary(r.op, i.p)
        assert.truthy(p ~= nil, r.name .. ": " .. ffi.string(C.kiln_error_message()))
        local want = d.comparison == 1 and C.KILN_BOOL or d.keeps_integers == 1 and C.KILN_I32 or C.KILN_F32
        assert.are.equal(tonumber(want), tonumber(p.dtype), r.name)
        C.kiln_tensor_release(p)
      end
    end
    assert.is_true(byname.eq.comparison and byname.logical_and.comparison and not byname.add.comparison)
  end)

  it("has an f64 gradient check for every differentiable op, and each passes", function()
    for _, r in ipairs(list) do
      if r.differentiable and not r.backward_kernel then
        local make = G.checks[r.name]
        assert.truthy(make, r.name .. " is differentiable but has no gradient check in tests/lua/op_gradchecks.lua")
        kiln.manual_seed(r.op)
        local fn, inputs = make(kiln)
        local out = fn(unpack(inputs))
        assert.are.equal(G.grad_fn_of[r.name] or capitalised(r.name) .. "Backward", out.grad_fn, r.name)
        local ok, err = kiln.gradcheck(fn, inputs)
        assert.is_true(ok, r.name .. ": " .. tostring(err))
      end
    end
  end)

  it("has an f64 gradient check for every differentiable composite, and each passes", function()
    for k, c in ipairs(G.composites) do
      local name, make = c[1], c[3]
      assert.truthy(kiln.help(name), name .. " has no help line")
      if make then
        kiln.manual_seed(1000 + k)
        local fn, inputs = make(kiln)
        local ok, err = kiln.gradcheck(fn, inputs)
        assert.is_true(ok, name .. ": " .. tostring(err))
      end
    end
  end)

  it("has no gradient check for an op that is not differentiable", function()
    local differentiable = {}
    for _, r in ipairs(list) do if r.differentiable then differentiable[r.name] = true end end
    for name in pairs(G.checks) do assert.truthy(differentiable[name], name) end
  end)

  it("finds the help of the fused ops through kiln.F and kiln.functional", function()
    assert.matches("^F%.conv2d%(input", kiln.help(kiln.F.conv2d))
    assert.matches("^F%.ctc_loss%(", kiln.help(kiln.functional.ctc_loss))
    assert.matches("^F%.softmax%(", kiln.help("F.softmax"))
    assert.matches("^optim%.Adagrad%(", kiln.help(kiln.optim.Adagrad))
  end)

  it("is what docs/ops.md says (regenerate with: build/bin/kiln tools/ops_doc.lua > docs/ops.md)", function()
    local root = (debug.getinfo(1, "S").source:match("^@(.*/)tests/lua/") or "./")
    local gen = dofile(root .. "tools/ops_doc.lua")
    local f = assert(io.open(root .. "docs/ops.md"))
    local text = f:read("*a")
    f:close()
    local want = gen(root)
    assert.falsy(want:find("| none |", 1, true), "an op without a help line")
    assert.falsy(want:find("**missing**", 1, true), "a differentiable op without a gradient check")
    if text ~= want then
      local a, b = {}, {}
      for l in text:gmatch("[^\n]*") do a[#a + 1] = l end
      for l in want:gmatch("[^\n]*") do b[#b + 1] = l end
      for k = 1, math.max(#a, #b) do
        assert.are.equal(b[k], a[k], "docs/ops.md is stale at line " .. k)
      end
    end
  end)
end)
