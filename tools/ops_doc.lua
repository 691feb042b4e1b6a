-- tools/ops_doc.lua: writes docs/ops.md from the op table (kiln_op_describe), the backends' kernel
-- tables (runtime/src/cpu/kernels.c, runtime/cuda/backend.c), the gradient checks
-- (tests/lua/op_gradchecks.lua) and the help lines (lua/kiln/docs.lua).
-- usage: build/bin/kiln tools/ops_doc.lua > docs/ops.md   (tests/lua/op_table_spec.lua checks it is current)
local kiln = kiln or require "kiln"
local ffi, C = kiln.ffi, kiln.C

-- The Lua name a user calls, where it is not the op's own.
local LUA_NAME = {
  copy = "Tensor:copy_", fill = "Tensor:fill_", gemm = "Tensor:matmul", uniform = "Tensor:uniform_",
  normal = "Tensor:normal_", randint = "kiln.randint", cat = "kiln.cat", where = "kiln.where",
  sgd_step = "kiln.optim.SGD", adam_step = "kiln.optim.Adam", rmsprop_step = "kiln.optim.RMSprop",
  adagrad_step = "kiln.optim.Adagrad", rnn = "kiln.nn.functional.rnn_layer",
}
local FUNCTIONAL = {conv2d = 1, conv2d_relu_max_pool2d = 1, linear = 1, max_pool2d = 1, avg_pool2d = 1, batch_norm = 1, layer_norm = 1, group_norm = 1,
                    softmax = 1, log_softmax = 1, nll_loss = 1, dropout = 1, ctc_loss = 1}

local function read(path)
  local f = io.open(path)
  if not f then return "" end
  local s = f:read("*a")
  f:close()
  return s
end

-- op name (upper case, as in the enum) -> the kernel function a backend's table gives it
local function kernels(text, ew)
  local t = {}
  for op, fn in text:gmatch("%[KILN_OP_([%w_]+)%]%s*=%s*([%w_]+)") do if t[op] == nil then t[op] = fn end end
  for op in text:gmatch("EW%(KILN_OP_([%w_]+)%)") do t[op] = t[op] or ew end
  t.elementwise = text:match("%.elementwise%s*=%s*([%w_]+)")   -- the kernel of the elementwise families
  return t
end

local DTYPES = {"f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool"}
local function dtypes(mask)
  local all, float = true, true
  local list = {}
  for i, name in ipairs(DTYPES) do
    local d = tonumber(C["KILN_" .. name:upper()])
    local on = bit.band(mask, bit.lshift(1, d)) ~= 0
    if on then list[#list + 1] = name end
    all = all and on
    if i <= 4 then float = float and on else float = float and not on end
  end
  if all then return "all" end
  if float then return "float" end
  if #list == 7 and not list[8] and list[7] == "u8" then return "all but bool" end
  return table.concat(list, " ")
end

local function saves(mask)
  local list = {}
  for k = 0, 2 do if bit.band(mask, bit.lshift(1, k)) ~= 0 then list[#list + 1] = "in" .. (k + 1) end end
  if bit.band(mask, 16) ~= 0 then list[#list + 1] = "out" end
  return #list > 0 and table.concat(list, " ") or "—"
end

local function generate(root)
  root = root or "./"
  local help = dofile(root .. "lua/kiln/docs.lua")
  local gradchecks = dofile(root .. "tests/lua/op_gradchecks.lua")
  local checks, composite_list = gradchecks.checks, gradchecks.composites
  local cpu = kernels(read(root .. "runtime/src/cpu/kernels.c"), "cpu_elementwise")
  local cuda = kernels(read(root .. "runtime/cuda/backend.c"), "cuda_elementwise")
  local out = {[[
# The ops

Generated from the op table (`runtime/src/dispatch/op_table.c`) by `tools/ops_doc.lua`; do not edit
by hand (`tests/lua/op_table_spec.lua` fails when this page is stale). One row per op: the CPU and
CUDA kernels the backends' tables name, with the dtypes each accepts; the derivative the table
names; the tensors backward saves (inN: input N, out: the output); the class under mixed precision
(keep: the inputs' dtype, lower: bf16/f16, f32, promote: the widest input's); the f64 gradient check
(`tests/lua/op_gradchecks.lua`, run by `tests/lua/op_table_spec.lua`); and the help line's name
(`?name` in the REPL). `*_backward` ops are the backward kernels of fused ops: their forward's
derivative runs them.
]]}
  local family_rows, order = {}, {}
  local d = ffi.new("struct kiln_op_desc")
  for op = 0, tonumber(C.KILN_OP_COUNT) - 1 do
    assert(C.kiln_op_describe(op, d) == 0)
    local name, family = ffi.string(d.name), ffi.string(d.family)
    local up = name:upper()
    local lua = LUA_NAME[name] or (FUNCTIONAL[name] and "kiln.nn.functional." .. name) or "Tensor:" .. name
    local helpline = d.backward_kernel == 1 and "—" or (help[lua] and "`" .. lua .. "`" or "none")
    local check = d.differentiable == 0 and "—" or d.backward_kernel == 1 and "—"
                  or (checks[name] and "yes" or "**missing**")
    local elementwise = family == "unary" or family == "binary" or family == "ternary"
    local function kernel(t, mask)
      local fn = t[up] or (elementwise and t.elementwise)
      if not fn or fn == "NULL" then return "—" end
      return "`" .. fn .. "` (" .. dtypes(mask) .. ")"
    end
    if not family_rows[family] then family_rows[family] = {} order[#order + 1] = family end
    local rows = family_rows[family]
    rows[#rows + 1] = string.format("| `%s` | %s%s | %s | %s | %s | %s | %s | %s | %s |", name, d.arity,
      d.variadic == 1 and "+" or "", kernel(cpu, d.dtypes_cpu), kernel(cuda, d.dtypes_cuda),
      ffi.string(d.derivative) ~= "" and "`" .. ffi.string(d.derivative) .. "`" or "—",
      d.differentiable == 1 and saves(d.saves) or "—", ffi.string(d.autocast), check, helpline)
  end
  for _, family in ipairs(order) do
    out[#out + 1] = "## " .. family .. "\n"
    out[#out + 1] = "| op | inputs | CPU | CUDA | derivative | saves | autocast | gradcheck | help |"
    out[#out + 1] = "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    for _, r in ipairs(family_rows[family]) do out[#out + 1] = r end
    out[#out + 1] = ""
  end
  out[#out + 1] = "## composites\n"
  out[#out + 1] = [[
Ops written in Lua with the ops above (`lua/kiln/tensor.lua`, `lua/kiln/functional.lua`): they have
no row of their own, take their gradients from the ops they are written with, and run on every
device where those ops have kernels.
]]
  out[#out + 1] = "| op | written with | gradcheck | help |"
  out[#out + 1] = "| --- | --- | --- | --- |"
  for _, c in ipairs(composite_list) do
    out[#out + 1] = string.format("| `%s` | %s | %s | %s |", c[1], c[2], c[3] and "yes" or "—",
                                  help[c[1]] and "`" .. c[1] .. "`" or "none")
  end
  out[#out + 1] = ""
  return table.concat(out, "\n")
end
if arg and arg[0] and arg[0]:match("ops_doc%.lua$") then
  io.write(generate((arg[0]:match("^(.*/)tools/ops_doc%.lua$")) or "./"))
end
return generate
