-- tests/gpu/ops_spec.lua: every op that has a CUDA kernel, run on cuda:0 and on the CPU on the same
-- random inputs (odd shapes, transposed, narrowed and permuted views, broadcasting, mixed dtypes,
-- scalars on either side, 0-dim and empty tensors; in-place and out= targets poisoned with NaN
-- first, fresh device blocks too when KILN_CUDA_POISON=1), compared element by element: the
-- largest normalised error per op against its tolerance, in a table, and in $OUT/gpu_ops.txt and
-- $OUT/gpu_ops.jsonl when OUT is set. Also: the caching allocator in steady state, out of memory,
-- and an op without a CUDA kernel. Exits 1 when a case fails.
--   build/bin/kiln tests/gpu/ops_spec.lua           (tests/gpu/run.sh runs it)
-- Without a GPU it prints "skipped: no CUDA device" and exits 0. KILN_GPU_OPS_DEVICE=cpu runs the
-- whole script with the CPU in the device's place (every error 0): a check of the script itself.
local kiln = kiln or require "kiln"
local ffi = require "ffi"
local core = require "kiln.core"
local C, wrap, check = kiln.C, core.wrap, core.check

local DEV = os.getenv("KILN_GPU_OPS_DEVICE") or "cuda"
if DEV ~= "cpu" and not kiln.cuda.is_available() then
  print("skipped: no CUDA device (" .. tostring(kiln.cuda.unavailable_reason()) .. ")")
  os.exit(0)
end
local ON_GPU = DEV ~= "cpu"

local op_number = {}
for i = 0, C.KILN_OP_COUNT - 1 do op_number[ffi.string(C.kiln_op_name(i))] = i end
local function has_kernel(name) return not ON_GPU or kiln.cuda.has_kernel(name) end

-- ---- tolerances ----

local exact = {}
for name in ([[copy fill neg abs sign relu floor ceil round trunc square logical_not add sub mul div sqrt rsqrt
  reciprocal maximum minimum remainder eq ne lt le gt ge logical_and logical_or where clamp uniform randint
  relu_backward]]):gmatch("%S+") do
  exact[name] = true
end

-- ctype: the dtype the op computes in; out: the result's dtype.
local function tolerance(name, ctype, out)
  if exact[name] or ctype == "i64" then return 0 end
  if name == "gemm" then return ({f32 = 2e-5, f64 = 1e-12, f16 = 4e-3, bf16 = 3e-2})[out] or 0 end
  if name == "normal" then return out == "f64" and 1e-13 or 1e-6 end
  -- the device's exp, log, sin, pow, ... are within a few ulps of the C library's
  if out == "f16" then return 2e-3 elseif out == "bf16" then return 1.6e-2 end
  return ctype == "f64" and 1e-14 or 4e-6
end

-- ---- comparing ----

local function f64_values(t)
  local n = t:numel()
  local buf = ffi.new("double[?]", n > 0 and n or 1)
  check(C.kiln_tensor_to_f64(t.p, buf))
  return buf, n
end

-- Largest error of g against c: per element |g - c| / max(1, |c|) (global: / max |c|, for sums);
-- NaN must meet NaN and an infinity the same infinity, else the error is infinite.
local function max_error(g, c, global)
  if g:dtype() ~= c:dtype() then return math.huge, "dtype " .. g:dtype() .. " vs " .. c:dtype() end
  local gs, cs = table.concat(g:size(), ","), table.concat(c:size(), ",")
  if gs ~= cs then return math.huge, "shape [" .. gs .. "] vs [" .. cs .. "]" end
  local gv, n = f64_values(g)
  local cv = f64_values(c)
  local scale = 1
  if global then
    scale = 0
    for i = 0, n - 1 do local a = math.abs(cv[i]) if a == a and a < math.huge and a > scale then scale = a end end
    if scale == 0 then scale = 1 end
  end
  local worst, where = 0, nil
  for i = 0, n - 1 do
    local x, y = gv[i], cv[i]
    local e
    if y ~= y then e = (x ~= x) and 0 or math.huge
    elseif y == math.huge or y == -math.huge then e = (x == y) and 0 or math.huge
    else
      e = math.abs(x - y) / (global and scale or math.max(1, math.abs(y)))
      if e ~= e then e = math.huge end
    end
    if e > worst then worst, where = e, string.format("element %d: %.17g, cpu %.17g", i, x, y) end
  end
  return worst, where
end

-- ---- bookkeeping ----

local rows, order = {}, {}
local failures = 0
local extras = {}   -- lines for the end of the table (the allocator's counts, the rnn algorithm on the device)
local function record(name, err, tol, what, detail)
  local r = rows[name]
  if not r then
    r = {name = name, cases = 0, failed = 0, err = 0, tol = 0, worst = ""}
    rows[name] = r
    order[#order + 1] = name
  end
  r.cases = r.cases + 1
  if err > tol then
    r.failed = r.failed + 1
    failures = failures + 1
    io.stderr:write(string.format("FAIL %s %s: error %.3g > %.3g (%s)\n", name, what, err, tol, detail or ""))
  end
  if err > r.err or r.cases == 1 then r.err, r.worst = err, what end
  if tol > r.tol then r.tol = tol end
end

-- Run f; an error is recorded as a failed case rather than stopping the script.
local function guarded(name, what, f)
  local ok, err = pcall(f)
  if not ok then
    record(name, math.huge, 0, what, tostring(err))
  end
end

-- ---- inputs ----

kiln.manual_seed(20261130)
local float = {f32 = true, f64 = true, f16 = true, bf16 = true}

-- A CPU tensor of dtype with random values and, at its first elements (unless clean), edge values.
local function gen(shape, dtype, clean)
  local t
  if float[dtype] then
    t = kiln.randn(shape, {dtype = "f64"}) * 3
    local specials = {0, -0.0, 1 / 0, -1 / 0, 0 / 0, 0.5, 2.5, -1.5, 1e-3, 100}
    local n = clean and 0 or math.min(#specials, t:numel())
    for i = 1, n do check(C.kiln_tensor_set(t.p, i - 1, specials[i])) end
    t = t:to(dtype)
  elseif dtype == "bool" then
    t = kiln.randint(0, 2, shape, {dtype = "bool"})
  elseif dtype == "u8" then
    t = kiln.randint(0, 200, shape, {dtype = "u8"})
  else
    t = kiln.randint(-20, 20, shape, {dtype = dtype})
  end
  return t
end

-- Layouts: a base shape made on both devices and the same view taken of each.
local layouts = {
  {name = "contiguous", base = {37, 53}, view = function(t) return t end},
  {name = "transposed", base = {53, 37}, view = function(t) return t:transpose(1, 2) end},
  {name = "narrowed", base = {37, 60}, view = function(t) return t:narrow(2, 4, 53) end},
  {name = "permuted 3-d", base = {3, 5, 7, 2}, view = function(t) return t:select(4, 2):permute(3, 1, 2) end},
  {name = "0-dim", base = {}, view = function(t) return t end},
  {name = "empty", base = {0, 5}, view = function(t) return t end},
}

-- The same input on the CPU and on the device: (cpu view, device view).
local function pair(layout, dtype)
  local base = gen(layout.base, dtype)
  return layout.view(base), layout.view(base:to(DEV))
end

-- ---- elementwise ----

local unary_ops = {"neg", "abs", "sign", "sqrt", "rsqrt", "exp", "log", "log1p", "expm1", "sin", "cos", "tanh", "sigmoid",
                   "relu", "floor", "ceil", "round", "trunc", "reciprocal", "square", "erf", "logical_not", "erfinv"}
local binary_ops = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "remainder", "eq", "ne", "lt", "le", "gt",
                    "ge", "logical_and", "logical_or", "atan2", "relu_backward"}
local comparisons = {eq = true, ne = true, lt = true, le = true, gt = true, ge = true, logical_and = true,
                     logical_or = true, logical_not = true}

local function ctype_of(d) if d == "f64" then return "f64" elseif float[d] then return "f32" else return "i64" end end

for _, name in ipairs(unary_ops) do
  if has_kernel(name) then
    local op = op_number[name]
    for _, dtype in ipairs({"f32", "f64", "f16", "bf16", "i64", "i32", "bool"}) do
      for _, layout in ipairs(layouts) do
        local what = dtype .. " " .. layout.name
        guarded(name, what, function()
          local a, ga = pair(layout, dtype)
          local ok_cpu, c = pcall(function() return wrap(C.kiln_unary(op, a.p)) end)
          if not ok_cpu then return end   -- not defined for this dtype on the CPU either (neg of bool)
          local g = wrap(C.kiln_unary(op, ga.p))
          local ct = comparisons[name] and ctype_of(dtype) or ctype_of(c:dtype())
          local err, detail = max_error(g, c)
          record(name, err, tolerance(name, ct, c:dtype()), what, detail)
        end)
      end
    end
    -- in place, into a transposed view
    guarded(name, "f32 in place, transposed", function()
      local a, ga = pair(layouts[2], "f32")
      a, ga = a:clone():transpose(1, 2), ga:clone():transpose(1, 2)
      if comparisons[name] then return end
      check(C.kiln_unary_(op, a.p))
      check(C.kiln_unary_(op, ga.p))
      local err, detail = max_error(ga, a)
      record(name, err, tolerance(name, "f32", "f32"), "f32 in place, transposed", detail)
    end)
  end
end

-- dtype pairs for the binary ops, and the shapes b takes against a [37,53] view
local binary_dtypes = {{"f32", "f32"}, {"f64", "f64"}, {"i64", "i64"}, {"f16", "f16"}, {"bf16", "bf16"}, {"f32", "i64"},
                       {"i32", "u8"}, {"f16", "bf16"}, {"bool", "bool"}}
local b_shapes = {
  {name = "same shape, transposed", base = {53, 37}, view = function(t) return t:transpose(1, 2) end},
  {name = "broadcast [53]", base = {53}, view = function(t) return t end},
  {name = "broadcast [37,1]", base = {37, 1}, view = function(t) return t end},
  {name = "broadcast 0-dim", base = {}, view = function(t) return t end},
}

for _, name in ipairs(binary_ops) do
  if has_kernel(name) then
    local op = op_number[name]
    for _, dt in ipairs(binary_dtypes) do
      for li = 1, 3 do
        for _, bs in ipairs(b_shapes) do
          local what = string.format("%s %s, %s %s", dt[1], layouts[li].name, dt[2], bs.name)
          guarded(name, what, function()
            local a, ga = pair(layouts[li], dt[1])
            local b, gb = pair(bs, dt[2])
            local ok_cpu, c = pcall(function() return wrap(C.kiln_binary(op, a.p, b.p)) end)
            if not ok_cpu then return end
            local g = wrap(C.kiln_binary(op, ga.p, gb.p))
            local err, detail = max_error(g, c)
            local ct = comparisons[name] and "i64" or ctype_of(c:dtype())   -- a bool result is exact
            record(name, err, tolerance(name, ct, c:dtype()), what, detail)
          end)
        end
      end
      -- a scalar on either side
      for _, s in ipairs({2.5, 3, -2}) do
        for reverse = 0, 1 do
          local what = string.format("%s transposed, scalar %g%s", dt[1], s, reverse == 1 and " on the left" or "")
          guarded(name, what, function()
            local a, ga = pair(layouts[2], dt[1])
            local ok_cpu, c = pcall(function() return wrap(C.kiln_binary_scalar(op, a.p, s, reverse)) end)
            if not ok_cpu then return end
            local g = wrap(C.kiln_binary_scalar(op, ga.p, s, reverse))
            local err, detail = max_error(g, c)
            local ct = comparisons[name] and "i64" or ctype_of(c:dtype())
            record(name, err, tolerance(name, ct, c:dtype()), what, detail)
          end)
        end
      end
    end
    -- in place: a (transposed, poisoned copy) op= b broadcast
    guarded(name, "f32 in place with a broadcast [53]", function()
      if comparisons[name] then return end
      local a, ga = pair(layouts[2], "f32")
      local b, gb = pair(b_shapes[2], "f32")
      a, ga = a:clone(), ga:clone()
      check(C.kiln_binary_(op, a.p, b.p))
      check(C.kiln_binary_(op, ga.p, gb.p))
      local err, detail = max_error(ga, a)
      record(name, err, tolerance(name, "f32", "f32"), "f32 in place with a broadcast [53]", detail)
    end)
  end
end

-- ---- scans and sorting: argsort, cumsum, cumprod (and sort, topk, multinomial through them) ----

for _, name in ipairs({"cumsum", "cumprod", "argsort"}) do
  if has_kernel(name) then
    for _, dtype in ipairs({"f32", "f64", "f16", "i64", "i32", "bool"}) do
      for _, layout in ipairs(layouts) do
        for _, dim in ipairs({1, -1}) do
          local what = string.format("%s %s, dim %d", dtype, layout.name, dim)
          guarded(name, what, function()
            local a, ga = pair(layout, dtype)
            if name == "argsort" then
              if float[dtype] then a, ga = a:round(), ga:round() end   -- ties, which must keep their order
              for _, desc in ipairs({false, true}) do
                local err, detail = max_error(ga:argsort(dim, desc), a:argsort(dim, desc))
                record(name, err, 0, what .. (desc and ", descending" or ""), detail)
              end
            else
              local c, g = a[name](a, dim), ga[name](ga, dim)
              local err, detail = max_error(g, c)
              record(name, err, tolerance(name, ctype_of(c:dtype()), c:dtype()), what, detail)
            end
          end)
        end
      end
    end
  end
end

if has_kernel("cumprod_backward") then
  for _, dtype in ipairs({"f32", "f64"}) do
    guarded("cumprod_backward", dtype .. " transposed, through a zero", function()
      local base = gen({6, 9}, dtype, true)
      check(C.kiln_tensor_set(base.p, 4, 0))
      local a, ga = base:t():clone():requires_grad_(), base:to(DEV):t():clone():requires_grad_()
      local r = gen({9, 6}, dtype, true)
      a:cumprod(2):backward(r)
      ga:cumprod(2):backward(r:to(DEV))
      local err, detail = max_error(ga.grad, a.grad)
      record("cumprod_backward", err, tolerance("cumprod_backward", dtype, dtype), dtype .. " transposed, through a zero", detail)
    end)
  end
end

if has_kernel("argsort") and has_kernel("cumsum") then
  guarded("argsort", "sort, topk and multinomial draws", function()
    local a = gen({7, 40}, "f32", true)
    local ga = a:to(DEV)
    local v, i = a:sort(2, true)
    local gv, gi = ga:sort(2, true)
    record("argsort", math.max((max_error(gv, v)), (max_error(gi, i))), 0, "sort values and indices")
    local tv, ti = a:topk(5, 1)
    local gtv, gti = ga:topk(5, 1)
    record("argsort", math.max((max_error(gtv, tv)), (max_error(gti, ti))), 0, "topk values and indices")
    local w = a:abs() + 0.01
    for _, replacement in ipairs({true, false}) do
      kiln.manual_seed(11)
      local c = w:multinomial(6, replacement)
      kiln.manual_seed(11)
      local g = w:to(DEV):multinomial(6, replacement)
      record("argsort", (max_error(g, c)), 0, "multinomial draws, replacement " .. tostring(replacement))
    end
  end)
end

-- the composites of lua/kiln (pad, interpolate, einsum, unfold, fold, ...) on the device's ops
guarded("composites", "pad, interpolate, einsum, unfold, fold, repeat_interleave, roll, diag", function()
  local F = kiln.F
  local x = gen({2, 3, 5, 6}, "f32", true)
  local gx = x:to(DEV)
  local cases = {
    function(t) return F.pad(t, {2, 1, 1, 3}, "reflect") end,
    function(t) return F.pad(t, {1, -1, 2, 0}, {value = 0.5}) end,
    function(t) return F.pad(t, {2, 3, 1, 0}, "replicate") end,
    function(t) return F.interpolate(t, {size = {7, 4}, mode = "bilinear"}) end,
    function(t) return F.interpolate(t, {scale_factor = 2}) end,
    function(t) return F.interpolate(t, {size = {7, 4}, mode = "bicubic", align_corners = true}) end,
    function(t) return F.interpolate(t, {size = {3, 4}, mode = "area"}) + F.interpolate(t, {size = {3, 4}, mode = "nearest-exact"}) end,
    function(t) return kiln.einsum("bchw,bdhw->bcd", t:narrow(1, 1, 1), t) end,
    function(t) return kiln.einsum("bchw,bdhw->bcd", t, t) end,
    function(t) return kiln.einsum("ii->i", t:select(1, 1):select(1, 1):narrow(2, 1, 5)) end,
    function(t) return F.fold(F.unfold(t, {2, 3}, {padding = 1, stride = {2, 1}}), {5, 6}, {2, 3}, {padding = 1, stride = {2, 1}}) end,
    function(t) return t:repeat_interleave({1, 0, 2}, 2):roll({1, -2}, {3, 4}) end,
    function(t) return t:select(1, 1):select(1, 2):diag(1) end,
  }
  local worst = 0
  for _, f in ipairs(cases) do worst = math.max(worst, (max_error(f(gx), f(x)))) end
  record("composites", worst, tolerance("composites", "f32", "f32"), "13 cases, f32")
end)

if has_kernel("where") then
  for _, dt in ipairs({{"bool", "f32", "f32"}, {"bool", "f32", "f64"}, {"f32", "i64", "i64"}, {"u8", "f16", "bf16"}}) do
    local what = string.format("cond %s [37,1], %s transposed, %s [53]", dt[1], dt[2], dt[3])
    guarded("where", what, function()
      local cnd, gcnd = pair(b_shapes[3], dt[1])
      local a, ga = pair(layouts[2], dt[2])
      local b, gb = pair(b_shapes[2], dt[3])
      local c = wrap(C.kiln_where(cnd.p, a.p, b.p))
      local g = wrap(C.kiln_where(gcnd.p, ga.p, gb.p))
      local err, detail = max_error(g, c)
      record("where", err, 0, what, detail)
    end)
  end
end

if has_kernel("clamp") then
  for _, dtype in ipairs({"f32", "f64", "i64", "f16", "i32"}) do
    for _, bounds in ipairs({{-1, 2, 1, 1}, {0.5, 0, 1, 0}, {0, 1.5, 0, 1}, {3, -3, 1, 1}}) do
      local what = string.format("%s narrowed, [%g, %g] (%d, %d)", dtype, bounds[1], bounds[2], bounds[3], bounds[4])
      guarded("clamp", what, function()
        local a, ga = pair(layouts[3], dtype)
        local c = wrap(C.kiln_clamp(a.p, bounds[1], bounds[2], bounds[3], bounds[4]))
        local g = wrap(C.kiln_clamp(ga.p, bounds[1], bounds[2], bounds[3], bounds[4]))
        local err, detail = max_error(g, c)
        record("clamp", err, 0, what, detail)
      end)
    end
  end
end

-- contiguous operands of the same shape take the flat kernels: whole aligned 16-byte words when
-- every operand is aligned to its word (vector.cuh), element by element when a view starts off
-- a word; lengths around the word size test the tail
for _, n in ipairs({1, 3, 4, 5, 8, 1023, 1024, 1027, 1048579}) do
  for _, dtype in ipairs({"f32", "f64", "i64"}) do
    for _, off in ipairs({0, 1}) do
      local what = string.format("%s [%d] flat%s", dtype, n, off == 1 and ", one element in" or ", aligned")
      local function view(t) return off == 1 and t:narrow(1, 2, n) or t end
      for _, name in ipairs({"sub", "lt", "mul"}) do
        guarded(name, what, function()
          local a, b = gen({n + off}, dtype, true), gen({n + off}, dtype, true)
          local c = wrap(C.kiln_binary(op_number[name], view(a).p, view(b).p))
          local g = wrap(C.kiln_binary(op_number[name], view(a:to(DEV)).p, view(b:to(DEV)).p))
          local err, detail = max_error(g, c)
          record(name, err, 0, what, detail)
          local cs = wrap(C.kiln_binary_scalar(op_number[name], view(a).p, 2.5, 1))
          local gs = wrap(C.kiln_binary_scalar(op_number[name], view(a:to(DEV)).p, 2.5, 1))
          err, detail = max_error(gs, cs)
          record(name, err, 0, what .. ", scalar on the left", detail)
        end)
      end
      guarded("exp", what, function()
        if dtype == "i64" then return end
        local a = gen({n + off}, dtype, true)
        local c = wrap(C.kiln_unary(op_number.exp, view(a).p))
        local g = wrap(C.kiln_unary(op_number.exp, view(a:to(DEV)).p))
        local err, detail = max_error(g, c)
        record("exp", err, tolerance("exp", dtype, dtype), what, detail)
      end)
    end
  end
end

-- ---- copy and fill ----

local dtypes = {"f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool"}
local function poisoned(shape, dtype, dev)
  return kiln.full(shape, float[dtype] and 0 / 0 or 77, {dtype = dtype, device = dev})
end

if has_kernel("copy") then
  for _, sd in ipairs(dtypes) do
    for _, dd in ipairs(dtypes) do
      local what = string.format("%s transposed -> %s", sd, dd)
      guarded("copy", what, function()
        local s, gs = pair(layouts[2], sd)
        local d, gd = poisoned({37, 53}, dd, "cpu"), poisoned({37, 53}, dd, DEV)
        check(C.kiln_copy_(d.p, s.p))
        check(C.kiln_copy_(gd.p, gs.p))
        local err, detail = max_error(gd, d)
        record("copy", err, 0, what, detail)
      end)
    end
    -- same dtype: broadcast into a transposed destination (the strided move kernel), and contiguous
    guarded("copy", sd .. " [53] broadcast into a transposed view", function()
      local s, gs = pair(b_shapes[2], sd)
      local d = poisoned({53, 37}, sd, "cpu"):transpose(1, 2)
      local gd = poisoned({53, 37}, sd, DEV):transpose(1, 2)
      check(C.kiln_copy_(d.p, s.p))
      check(C.kiln_copy_(gd.p, gs.p))
      local err, detail = max_error(gd, d)
      record("copy", err, 0, sd .. " [53] broadcast into a transposed view", detail)
    end)
    guarded("copy", sd .. " contiguous (device to device)", function()
      local s, gs = pair(layouts[1], sd)
      local c, g = s:clone(), gs:clone()
      local err, detail = max_error(g, c)
      record("copy", err, 0, sd .. " contiguous (device to device)", detail)
    end)
  end
end

if has_kernel("fill") then
  for _, dtype in ipairs(dtypes) do
    for _, v in ipairs({0, 1.5, -2.25, 1e10, 0 / 0, 255}) do
      for _, li in ipairs({1, 2}) do
        local what = string.format("%s %s, %g", dtype, layouts[li].name, v)
        guarded("fill", what, function()
          local c = layouts[li].view(poisoned(layouts[li].base, dtype, "cpu"))
          local g = layouts[li].view(poisoned(layouts[li].base, dtype, DEV))
          check(C.kiln_fill_(c.p, v))
          check(C.kiln_fill_(g.p, v))
          local err, detail = max_error(g, c)
          record("fill", err, 0, what, detail)
        end)
      end
    end
  end
end

-- ---- random fills: the same generator state gives the same numbers ----

local function draw(name, dtype, dev, a1, a2, shape, strided)
  local t = strided and kiln.empty(shape[2], shape[1], {dtype = dtype, device = dev}):transpose(1, 2)
                    or kiln.empty(shape, {dtype = dtype, device = dev})
  kiln.manual_seed(4242)
  if name == "uniform" then check(C.kiln_uniform_(t.p, a1, a2))
  elseif name == "normal" then check(C.kiln_normal_(t.p, a1, a2))
  else check(C.kiln_randint_(t.p, a1, a2)) end
  return t
end

for _, spec in ipairs({
  {"uniform", "f32", 0, 1}, {"uniform", "f64", 0, 1}, {"uniform", "f32", -3.7, 11.1}, {"uniform", "f64", -3.7, 11.1},
  {"uniform", "f16", 0.999, 1}, {"uniform", "bf16", -2, 2}, {"normal", "f32", 0.5, 2}, {"normal", "f64", 0.5, 2},
  {"randint", "i64", -5, 1000}, {"randint", "i32", 0, 7}, {"randint", "u8", 0, 256}, {"randint", "f32", -3, 3},
}) do
  local name, dtype = spec[1], spec[2]
  if has_kernel(name) then
    for _, strided in ipairs({false, true}) do
      local what = string.format("%s [%g, %g)%s", dtype, spec[3], spec[4], strided and ", transposed target" or "")
      guarded(name, what, function()
        local c = draw(name, dtype, "cpu", spec[3], spec[4], {317, 331}, strided)
        local g = draw(name, dtype, DEV, spec[3], spec[4], {317, 331}, strided)
        local err, detail = max_error(g, c)
        record(name, err, tolerance(name, ctype_of(dtype), dtype), what, detail)
      end)
    end
  end
end

-- ---- GEMM ----

local function gemm_case(what, dtype, f)
  guarded("gemm", dtype .. " " .. what, function()
    local c, g = f("cpu"), f(DEV)
    local err, detail = max_error(g, c, true)
    record("gemm", err, tolerance("gemm", ctype_of(dtype), dtype), dtype .. " " .. what, detail)
  end)
end

if has_kernel("gemm") then
  for _, dtype in ipairs({"f32", "f64", "f16", "bf16", "i64", "i32"}) do
    local function inputs(sa, sb, views)
      local a, b = gen(sa, dtype, true), gen(sb, dtype, true)
      if not float[dtype] then a, b = kiln.randint(-9, 9, sa, {dtype = dtype}), kiln.randint(-9, 9, sb, {dtype = dtype}) end
      return function(dev)
        local x, y = a:to(dev), b:to(dev)
        if views then x, y = views(x, y) end
        return x, y
      end
    end
    local odd = inputs({37, 53}, {53, 29})
    gemm_case("[37,53] @ [53,29]", dtype, function(dev) local a, b = odd(dev) return a:matmul(b) end)
    local tr = inputs({53, 37}, {29, 53}, function(x, y) return x:t(), y:t() end)
    gemm_case("transposed @ transposed", dtype, function(dev) local a, b = tr(dev) return a:matmul(b) end)
    local big = inputs({257, 263}, {263, 129})
    gemm_case("[257,263] @ [263,129]", dtype, function(dev) local a, b = big(dev) return a:matmul(b) end)
    local bat = inputs({5, 37, 53}, {5, 53, 29})
    gemm_case("batched [5,37,53] @ [5,53,29]", dtype, function(dev) local a, b = bat(dev) return a:matmul(b) end)
    local bc = inputs({5, 37, 53}, {53, 29})
    gemm_case("[5,37,53] @ [53,29] (batch stride 0)", dtype, function(dev) local a, b = bc(dev) return a:matmul(b) end)
    local sel = inputs({37, 53, 2}, {53, 29})   -- a with column stride 2: copied first
    gemm_case("strided columns @ [53,29]", dtype, function(dev) local a, b = sel(dev) return a:select(3, 2):matmul(b) end)
    local vec = inputs({53}, {53, 29})
    gemm_case("vector @ matrix", dtype, function(dev) local a, b = vec(dev) return a:matmul(b) end)
    local k1 = inputs({37, 1}, {1, 29})
    gemm_case("k = 1", dtype, function(dev) local a, b = k1(dev) return a:matmul(b) end)
    local k0 = inputs({3, 0}, {0, 4})
    gemm_case("k = 0", dtype, function(dev) local a, b = k0(dev) return a:matmul(b) end)
    if float[dtype] then
      local am = inputs({37, 53}, {53, 29})
      local bias = gen({29}, dtype, true)
      gemm_case("addmm beta 0.5 alpha 2", dtype, function(dev)
        local a, b = am(dev)
        return wrap(C.kiln_addmm(bias:to(dev).p, a.p, b.p, 0.5, 2))
      end)
      gemm_case("out= a transposed, poisoned target", dtype, function(dev)
        local a, b = am(dev)
        local out = poisoned({29, 37}, dtype, dev):t()
        check(C.kiln_matmul_out(out.p, a.p, b.p))
        return out
      end)
    end
  end
end

-- ---- reductions ----

local reduce_ops = {"sum", "mean", "prod", "max", "min", "argmax", "argmin", "var", "std", "norm", "logsumexp"}
local int_path = {sum = true, prod = true, max = true, min = true, argmax = true, argmin = true}

-- Both devices accumulate floats in double (in another order), then round to the result's dtype.
local function reduce_tolerance(name, in_dtype, out)
  if name == "argmax" or name == "argmin" or (int_path[name] and not float[in_dtype]) then return 0 end
  return ({f64 = 1e-12, f32 = 1e-5, f16 = 2e-3, bf16 = 1.6e-2})[out] or 0
end

local function reduce_case(name, layout, dtype, dims, keepdim, p)
  local what = string.format("%s %s, dims {%s}%s%s", dtype, layout.name, table.concat(dims, ","),
                             keepdim == 1 and " keepdim" or "", p and string.format(" p %g", p) or "")
  guarded(name, what, function()
    local a, ga = pair(layout, dtype)
    local nd = #dims
    local cdims = ffi.new("int[?]", nd > 0 and nd or 1, dims)
    local ok_cpu, c = pcall(function() return wrap(C.kiln_reduce(op_number[name], a.p, nd, cdims, keepdim, p or 0)) end)
    if not ok_cpu then return end   -- refused on the CPU too (max over an empty dim, two dims to argmax)
    local g = wrap(C.kiln_reduce(op_number[name], ga.p, nd, cdims, keepdim, p or 0))
    local err, detail = max_error(g, c)
    record(name, err, reduce_tolerance(name, dtype, c:dtype()), what, detail)
  end)
end

for _, name in ipairs(reduce_ops) do
  if has_kernel(name) then
    local ps = {false}
    if name == "norm" then ps = {2, 1, 0, 1 / 0, -1 / 0, 3} elseif name == "var" or name == "std" then ps = {1, 0} end
    for _, dtype in ipairs({"f32", "f64", "f16", "bf16", "i64", "i32", "bool"}) do
      for _, p in ipairs(ps) do
        for li, layout in ipairs(layouts) do
          local nd = #layout.base
          if li == 4 then nd = 3 end   -- the permuted view is 3-d
          -- the C API counts dims from 0
          reduce_case(name, layout, dtype, {}, 0, p or nil)
          if nd >= 1 then reduce_case(name, layout, dtype, {0}, 1, p or nil) end
          if nd >= 2 then reduce_case(name, layout, dtype, {-1}, 0, p or nil) end
          if nd >= 3 then reduce_case(name, layout, dtype, {0, 2}, 1, p or nil) end
        end
      end
    end
    -- long rows: several blocks per row, folded in order
    for _, dtype in ipairs({"f32", "f64", "i64"}) do
      for _, shape in ipairs({{3, 70001}, {200003}}) do
        local layout = {name = "[" .. table.concat(shape, ",") .. "]", base = shape, view = function(t) return t end}
        reduce_case(name, layout, dtype, {-1}, 0, ps[1] or nil)
      end
      local tall = {name = "[70001,3] over dim 0", base = {70001, 3}, view = function(t) return t end}
      reduce_case(name, tall, dtype, {0}, 0, ps[1] or nil)
    end
  end
end

-- ---- joining and indexing (the C API counts dims and indices from 0) ----

-- Indices in [0, n) (i64 or i32), of shape, made on the CPU.
local function indices(shape, n, dtype)
  return kiln.randint(0, n, shape, {dtype = dtype or "i64"})
end

-- Run f on the CPU and on the device with the same inputs (f(dev) moves them); compare.
local function both(name, what, tol, f)
  guarded(name, what, function()
    local ok_cpu, c = pcall(f, "cpu")
    if not ok_cpu then error("the CPU refused: " .. tostring(c)) end
    local g = f(DEV)
    local err, detail = max_error(g, c)
    record(name, err, tol, what, detail)
  end)
end

-- The same error on both devices (the message names the bad index and the shapes).
local function same_error(name, what, f)
  guarded(name, what, function()
    local ok1, e1 = pcall(f, "cpu")
    local ok2, e2 = pcall(f, DEV)
    local m1, m2 = tostring(e1):match(name .. ": .*"), tostring(e2):match(name .. ": .*")
    record(name, (not ok1 and not ok2 and m1 == m2) and 0 or math.huge, 0, what, tostring(e2) .. " vs " .. tostring(e1))
  end)
end

if has_kernel("cat") then
  for _, dtype in ipairs({"f32", "f64", "i64", "f16", "bool"}) do
    local a = layouts[2].view(gen(layouts[2].base, dtype))
    local b = layouts[3].view(gen(layouts[3].base, dtype))
    local c5 = gen({37, 5}, dtype == "f32" and "i64" or "f32")   -- another dtype: the result promotes
    local e = gen({0}, dtype)
    for _, case in ipairs({{"dim 0, two views", 0, {a, b}}, {"dim 1, views, another dtype, an empty 1-d", 1, {a, c5, e, b}},
                           {"dim -1, one tensor", -1, {b}}}) do
      both("cat", dtype .. " " .. case[1], 0, function(dev)
        local ts, keep = ffi.new("struct kiln_tensor *[?]", #case[3]), {}
        for i, t in ipairs(case[3]) do keep[i] = t:to(dev) ts[i - 1] = keep[i].p end
        return wrap(C.kiln_cat(#case[3], ts, case[2]))
      end)
    end
  end
end

if has_kernel("index_select") then
  for _, dtype in ipairs({"f32", "f64", "i64", "f16", "bool", "u8"}) do
    for li = 1, 4 do
      local layout = layouts[li]
      local base = gen(layout.base, dtype)
      local a = layout.view(base)
      for d = 0, a:dim() - 1 do
        for _, idt in ipairs({"i64", "i32"}) do
          local ib = indices({23, 2}, a:size(d + 1), idt)
          both("index_select", string.format("%s %s, dim %d, %s index with stride 2", dtype, layout.name, d, idt), 0,
               function(dev)
                 local ix = ib:to(dev):select(2, 1)
                 return wrap(C.kiln_index_select(layout.view(base:to(dev)).p, d, ix.p))
               end)
        end
      end
    end
  end
  same_error("index_select", "an index out of range", function(dev)
    local ix = kiln.tensor({1, 2, 37, 0}, {dtype = "i64"}):to(dev)
    return wrap(C.kiln_index_select(gen({37, 5}, "f32"):to(dev).p, 0, ix.p))
  end)
end

if has_kernel("gather") or has_kernel("scatter_add") then
  for _, dtype in ipairs({"f32", "f64", "i64", "i32", "f16", "bf16"}) do
    local a = gen({53, 37}, dtype, true)                 -- viewed transposed: [37,53]
    for d = 0, 1 do
      local ishape = d == 0 and {29, 53} or {37, 41}
      local ib = indices({ishape[2], ishape[1]}, d == 0 and 37 or 53)   -- viewed transposed
      local src = gen({ishape[2], ishape[1]}, dtype, true)
      if has_kernel("gather") then
        both("gather", string.format("%s transposed, dim %d, transposed index", dtype, d), 0, function(dev)
          return wrap(C.kiln_gather(a:to(dev):t().p, d, ib:to(dev):t().p))
        end)
      end
      if has_kernel("scatter_add") then
        -- atomic adds land in any order: floats within rounding, integers exact
        local tol = ({f32 = 1e-5, f64 = 1e-12, f16 = 2e-3, bf16 = 1.6e-2})[dtype] or 0
        both("scatter_add", string.format("%s transposed, dim %d, transposed index and src", dtype, d), tol, function(dev)
          return wrap(C.kiln_scatter_add(a:to(dev):t().p, d, ib:to(dev):t().p, src:to(dev):t().p))
        end)
        if dtype == "f32" then
          both("scatter_add", "f32 into f64, dim " .. d, 1e-12, function(dev)
            return wrap(C.kiln_scatter_add(a:to("f64"):to(dev):t().p, d, ib:to(dev):t().p, src:to(dev):t().p))
          end)
        end
      end
    end
  end
  if has_kernel("gather") then
    same_error("gather", "an index out of range", function(dev)
      local ix = kiln.tensor({{0, 1}, {-1, 2}}, {dtype = "i64"}):to(dev)
      return wrap(C.kiln_gather(gen({3, 3}, "f32"):to(dev).p, 1, ix.p))
    end)
  end
end

if has_kernel("masked_fill") then
  for _, dtype in ipairs({"f32", "f64", "i64", "f16", "bool"}) do
    for _, ms in ipairs({{37, 1}, {53}, {37, 53}}) do
      for _, v in ipairs({2.5, 0 / 0, -7}) do
        local mask = gen(ms, ms[1] == 53 and "u8" or "bool")
        local base = gen(layouts[2].base, dtype)
        both("masked_fill", string.format("%s transposed, mask [%s], %g", dtype, table.concat(ms, ","), v), 0, function(dev)
          return wrap(C.kiln_masked_fill(layouts[2].view(base:to(dev)).p, mask:to(dev).p, v))
        end)
      end
    end
  end
end

if has_kernel("masked_select") then
  for _, dtype in ipairs({"f32", "f64", "i64", "f16", "bool"}) do
    local a = gen({53, 37}, dtype)
    local row = gen({53}, dtype)
    for _, case in ipairs({{"transposed, mask [37,53]", {37, 53}}, {"transposed, mask [53]", {53}},
                           {"transposed, mask [37,1]", {37, 1}}, {"[53] broadcast by a mask [37,53]", {37, 53}, true},
                           {"transposed, all false", {37, 53}, false, true}}) do
      local mask = case[4] and kiln.zeros(case[2], {dtype = "bool"}) or gen(case[2], "bool")
      both("masked_select", dtype .. " " .. case[1], 0, function(dev)
        local x = case[3] and row:to(dev) or a:to(dev):t()
        return wrap(C.kiln_masked_select(x.p, mask:to(dev).p))
      end)
    end
  end
end

-- ---- softmax, losses, dropout: forward, and backward through autograd ----

-- f(dev) returns (leaf, out, gout or nil): out is compared as `name`, then out:backward(gout)
-- and the leaf's grad as `back` (the backward op's name). Inputs are made outside f.
local function with_grad(name, back, what, tol, f)
  guarded(name, what, function()
    local lc, c, gc = f("cpu")
    local lg, g, gg = f(DEV)
    local err, detail = max_error(g, c)
    record(name, err, tol, what, detail)
    if back and has_kernel(back) then
      c:backward(gc)
      g:backward(gg)
      err, detail = max_error(lg.grad, lc.grad)
      record(back, err, tol, what, detail)
    end
  end)
end

local function leaf(t, dev) return t:to(dev):requires_grad_() end
local function float_tol(dtype) return dtype == "f64" and 1e-12 or 1e-5 end

for _, name in ipairs({"softmax", "log_softmax"}) do
  if has_kernel(name) then
    local fn = name == "softmax" and C.kiln_softmax or C.kiln_log_softmax
    for _, dtype in ipairs({"f32", "f64"}) do
      for li = 1, 4 do
        local layout = layouts[li]
        local base = gen(layout.base, dtype, true)
        local nd = li == 4 and 3 or 2
        for d = 0, nd - 1 do
          local gout = gen(li == 4 and {7, 3, 5} or {37, 53}, dtype, true)
          with_grad(name, name .. "_backward", string.format("%s %s, dim %d", dtype, layout.name, d), float_tol(dtype),
                    function(dev)
                      local x = leaf(base, dev)
                      return x, wrap(fn(layout.view(x).p, d)), gout:to(dev)
                    end)
        end
      end
      -- a long line, a line of one, NaN and infinities in a line
      for _, case in ipairs({{{3, 5000}, true}, {{40, 1}, true}, {{6, 9}, false}}) do
        local base = gen(case[1], dtype, case[2])
        with_grad(name, nil, string.format("%s [%s]%s", dtype, table.concat(case[1], ","), case[2] and "" or " with NaN, inf"),
                  float_tol(dtype), function(dev) return nil, wrap(fn(base:to(dev).p, 1)) end)
      end
    end
  end
end

if has_kernel("nll_loss") then
  local NO_IGNORE = -2 ^ 63
  for _, dtype in ipairs({"f32", "f64"}) do
    for _, shape in ipairs({{37, 11}, {5, 7, 3, 4}, {1, 300}}) do
      local C_ = shape[2]
      local tshape = {shape[1]}
      for k = 3, #shape do tshape[#tshape + 1] = shape[k] end
      local logits = gen(shape, dtype, true)
      local target = kiln.randint(0, C_, tshape, {dtype = "i64"})
      local weight = kiln.rand(C_, {dtype = dtype}) + 0.5
      for _, fused in ipairs({true, false}) do
        for _, reduction in ipairs({0, 1, 2}) do
          for _, opt in ipairs({{w = false, ignore = NO_IGNORE, eps = 0}, {w = true, ignore = 2, eps = 0},
                                {w = true, ignore = NO_IGNORE, eps = 0.1}, {w = false, ignore = 0, eps = 0.25}}) do
            if fused or opt.eps == 0 then
              local what = string.format("%s %s [%s], %s, reduction %d%s%s%s", fused and "cross_entropy" or "nll_loss",
                                         dtype, table.concat(shape, ","), shape[3] and "spatial" or "rows", reduction,
                                         opt.w and ", weights" or "", opt.ignore ~= NO_IGNORE and ", ignore " .. opt.ignore or "",
                                         opt.eps > 0 and ", smoothing " .. opt.eps or "")
              local gout = reduction == 0 and gen(tshape, dtype, true) or nil
              with_grad("nll_loss", "nll_loss_backward", what, float_tol(dtype), function(dev)
                local x = leaf(logits, dev)
                local input = fused and x or wrap(C.kiln_log_softmax(x.p, 1))
                local w = opt.w and weight:to(dev).p or nil
                local t = target:to(dev).p
                local out = fused and wrap(C.kiln_cross_entropy(input.p, t, w, opt.ignore, opt.eps, reduction))
                                  or wrap(C.kiln_nll_loss(input.p, t, w, opt.ignore, reduction))
                return x, out, gout and gout:to(dev) or nil
              end)
            end
          end
        end
      end
    end
  end
  -- a target out of range: the same error on both
  same_error("cross_entropy", "a target out of range", function(dev)
    local t = kiln.tensor({0, 3, 11}, {dtype = "i64"}):to(dev)
    return wrap(C.kiln_cross_entropy(gen({3, 11}, "f32"):to(dev).p, t.p, nil, NO_IGNORE, 0, 1))
  end)
end

if has_kernel("dropout") then
  for _, dtype in ipairs({"f32", "f64"}) do
    for _, p in ipairs({0.1, 0.5, 0.9}) do
      for li = 1, 3 do
        local layout = layouts[li]
        local base = gen(layout.base, dtype, true)
        local gout = gen({37, 53}, dtype, true)
        -- the same generator state gives the same mask, bit for bit
        with_grad("dropout", nil, string.format("%s %s, p %g (and its backward)", dtype, layout.name, p), 0, function(dev)
          local x = leaf(base, dev)
          kiln.manual_seed(99)
          local y = wrap(C.kiln_dropout(layout.view(x).p, p, 1))
          y:backward(gout:to(dev))
          return x, wrap(C.kiln_alias(x.grad.p))
        end)
      end
    end
  end
end

-- ---- normalisation and pooling: forward, and backward through autograd, every leaf's grad ----

-- f(dev) returns (leaves, out, gout): out is compared as `name`, then out:backward(gout) and each
-- leaf's grad as `back`. Inputs are made outside f.
local function with_grads(name, back, what, tol, f)
  guarded(name, what, function()
    local lc, c, gc = f("cpu")
    local lg, g, gg = f(DEV)
    local err, detail = max_error(g, c)
    record(name, err, tol, what, detail)
    if back and has_kernel(back) and #lc > 0 then
      c:backward(gc)
      g:backward(gg)
      for k, l in ipairs(lc) do
        err, detail = max_error(lg[k].grad, l.grad)
        record(back, err, tol, what .. ", grad of leaf " .. k, detail)
      end
    end
  end)
end

-- Which of (x, weight, bias) need grad: all, the params only (no gx), x only.
local grad_sets = {{"x, w, b", true, true}, {"w, b only", false, true}, {"x only", true, false}}

-- A norm case: base (made once, on the CPU) viewed by view; params of pshape (or none);
-- call(x, w, b) runs the op on tensors of the device.
local function norm_case(name, what, dtype, base, view, pshape, call)
  local wb, bb = pshape and gen(pshape, dtype, true), pshape and gen(pshape, dtype, true)
  local gout
  for _, set in ipairs(grad_sets) do
    if pshape or set == grad_sets[1] then
      with_grads(name, name .. "_backward", string.format("%s %s, grads of %s", dtype, what, pshape and set[1] or "x"),
                 float_tol(dtype), function(dev)
        local x, w, b = base:to(dev), wb and wb:to(dev), bb and bb:to(dev)
        local leaves = {}
        if set[2] then x:requires_grad_() leaves[#leaves + 1] = x end
        if w and set[3] then w:requires_grad_() b:requires_grad_() leaves[#leaves + 1] = w leaves[#leaves + 1] = b end
        local y = call(view(x), w, b, dev)
        gout = gout or gen(y:size(), dtype, true)
        return leaves, y, gout:to(dev)
      end)
    end
  end
end

local function same(t) return t end
if has_kernel("layer_norm") then
  for _, dtype in ipairs({"f32", "f64"}) do
    for _, case in ipairs({
      {"[37,53], last dim", {37, 53}, same, 1},
      {"transposed [53,37], last dim", {37, 53}, function(t) return t:t() end, 1},
      {"permuted [7,3,5], last 2 dims", {3, 5, 7, 2}, function(t) return t:select(4, 2):permute(3, 1, 2) end, 2},
      {"[2,3,1000], last dim (long rows)", {2, 3, 1000}, same, 1},
      {"[600,40], last dim (many rows: the param grads in chunks)", {600, 40}, same, 1},
      {"[6,1], rows of one", {6, 1}, same, 1},
      {"[0,5], empty", {0, 5}, same, 1},
      {"[4,9], all dims", {4, 9}, same, 2},
    }) do
      local base = gen(case[2], dtype, true)
      local k = case[4]
      local shape = case[3](base):size()
      local pshape = {}
      for d = #shape - k + 1, #shape do pshape[#pshape + 1] = shape[d] end
      for _, affine in ipairs({false, true}) do
        norm_case("layer_norm", case[1] .. (affine and ", affine" or ""), dtype, base, case[3], affine and pshape or nil,
                  function(x, w, b) return wrap(C.kiln_layer_norm(x.p, k, w and w.p, b and b.p, 1e-5)) end)
      end
    end
    -- NaN and infinities in some rows stay in those rows
    local base = gen({6, 9}, dtype)
    both("layer_norm", dtype .. " [6,9] with NaN, inf", float_tol(dtype), function(dev)
      return wrap(C.kiln_layer_norm(base:to(dev).p, 1, nil, nil, 1e-5))
    end)
  end
end

if has_kernel("group_norm") then
  for _, dtype in ipairs({"f32", "f64"}) do
    for _, case in ipairs({
      {"[6,12,5,7], 3 groups", {6, 12, 5, 7}, same, 3},
      {"[6,12,5,7], 1 group", {6, 12, 5, 7}, same, 1},
      {"[6,12,5,7], 12 groups", {6, 12, 5, 7}, same, 12},
      {"permuted [6,12,5,7], 4 groups", {6, 5, 12, 7}, function(t) return t:permute(1, 3, 2, 4) end, 4},
      {"[37,12], 4 groups", {37, 12}, same, 4},
      {"[3,8,33,65], 2 groups (long rows)", {3, 8, 33, 65}, same, 2},
      {"[4,6,40,40], 3 groups (the param grads in chunks)", {4, 6, 40, 40}, same, 3},
      {"[0,6,3], empty batch", {0, 6, 3}, same, 3},
    }) do
      local base = gen(case[2], dtype, true)
      local G = case[4]
      local Cn = case[3](base):size()[2]
      for _, affine in ipairs({false, true}) do
        norm_case("group_norm", case[1] .. (affine and ", affine" or ""), dtype, base, case[3], affine and {Cn} or nil,
                  function(x, w, b) return wrap(C.kiln_group_norm(x.p, G, w and w.p, b and b.p, 1e-5)) end)
      end
    end
  end
end

if has_kernel("batch_norm") then
  for _, dtype in ipairs({"f32", "f64"}) do
    for _, case in ipairs({
      {"[8,5,7,9]", {8, 5, 7, 9}, same},
      {"permuted [8,5,7,9]", {8, 7, 5, 9}, function(t) return t:permute(1, 3, 2, 4) end},
      {"[37,11]", {37, 11}, same},
      {"[2,3], two per channel", {2, 3}, same},
      {"[64,3,33,33], long channels", {64, 3, 33, 33}, same},
      {"[0,4,3], empty batch", {0, 4, 3}, same},
    }) do
      local base = gen(case[2], dtype, true)
      local Cn = case[3](base):size()[2]
      local rbase = kiln.rand(Cn, 2, {dtype = dtype}) + 0.5   -- running stats: its columns, strided views
      for _, mode in ipairs({{"training, running stats", 1, true}, {"training, no running stats", 1, false},
                             {"evaluation", 0, true}}) do
        if not (mode[2] == 1 and case[2][1] * (case[2][3] or 1) <= 1 and case[2][1] > 0) then
          for _, affine in ipairs({false, true}) do
            local stats = {}
            local what = case[1] .. ", " .. mode[1] .. (affine and ", affine" or "")
            norm_case("batch_norm", what, dtype, base, case[3], affine and {Cn} or nil, function(x, w, b, dev)
              local r = mode[3] and rbase:to(dev) or nil
              local rm, rv = r and r:select(2, 1), r and r:select(2, 2)
              stats[dev] = {rm, rv}
              return wrap(C.kiln_batch_norm(x.p, w and w.p, b and b.p, rm and rm.p, rv and rv.p, mode[2], 0.1, 1e-5))
            end)
            if mode[3] and stats[DEV] then   -- the running stats after the update (in place, strided)
              for k, name in ipairs({"running_mean", "running_var"}) do
                local err, detail = max_error(stats[DEV][k], stats.cpu[k])
                record("batch_norm", err, float_tol(dtype), string.format("%s %s, %s", dtype, what, name), detail)
              end
            end
          end
        end
      end
    end
  end
end

-- Pooling: the same windows and the same order of additions on both: 0 (bit for bit), forward
-- and (gathered on the device, scattered on the CPU) backward; NaN and infinities in the inputs.
local pool_layouts = {
  {"[2,3,9,11]", {2, 3, 9, 11}, same},
  {"transposed [2,3,9,11]", {2, 3, 11, 9}, function(t) return t:transpose(3, 4) end},
  {"permuted [2,3,9,11]", {9, 2, 11, 3}, function(t) return t:permute(2, 4, 1, 3) end},
  {"[5,13,10] (3-d)", {5, 13, 10}, same},
  {"[0,3,6,6], empty batch", {0, 3, 6, 6}, same},
}
local function pool_case(name, what, dtype, layout, call)
  local base = gen(layout[2], dtype)   -- NaN, infinities and signed zeros at its first elements
  local gout
  with_grads(name, name .. "_backward", string.format("%s %s, %s", dtype, layout[1], what), 0, function(dev)
    local x = base:to(dev):requires_grad_()
    local y = call(layout[3](x))
    gout = gout or gen(y:size(), dtype, true)
    return {x}, y, gout:to(dev)
  end)
end

if has_kernel("max_pool2d") then
  for _, dtype in ipairs({"f32", "f64"}) do
    for _, layout in ipairs(pool_layouts) do
      for _, p in ipairs({{2, 2, 2, 2, 0, 0, 1, 1, 0}, {2, 2, 2, 2, 0, 0, 1, 1, 1}, {3, 3, 2, 2, 1, 1, 1, 1, 0},
                          {3, 3, 2, 2, 1, 1, 1, 1, 1}, {3, 2, 2, 1, 1, 1, 2, 1, 1}, {4, 4, 3, 3, 2, 2, 2, 2, 0},
                          {1, 1, 1, 1, 0, 0, 1, 1, 0},
                          -- every window's taps in the padding (width 11 only): index 0 takes all the grads
                          {2, 2, 2, 1, 0, 1, 1, 12, 0, only = "[2,3,9,11]"}}) do
        if p.only and not layout[1]:find(p.only, 1, true) then goto next_p end
        pool_case("max_pool2d", "kernel " .. table.concat(p, " ", 1, 2) .. ", stride " .. table.concat(p, " ", 3, 4) ..
                  ", padding " .. table.concat(p, " ", 5, 6) .. ", dilation " .. table.concat(p, " ", 7, 8) ..
                  (p[9] == 1 and ", ceil_mode" or ""), dtype, layout, function(x)
          return wrap(C.kiln_max_pool2d(x.p, p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]))
        end)
        ::next_p::
      end
    end
  end
end

if has_kernel("avg_pool2d") then
  for _, dtype in ipairs({"f32", "f64"}) do
    for _, layout in ipairs(pool_layouts) do
      for _, p in ipairs({{2, 2, 2, 2, 0, 0, 0, 1}, {3, 3, 2, 2, 1, 1, 0, 1}, {3, 3, 2, 2, 1, 1, 0, 0},
                          {3, 3, 2, 2, 1, 1, 1, 1}, {3, 3, 2, 2, 1, 1, 1, 0}, {3, 2, 3, 1, 1, 1, 1, 0}}) do
        pool_case("avg_pool2d", "kernel " .. table.concat(p, " ", 1, 2) .. ", stride " .. table.concat(p, " ", 3, 4) ..
                  ", padding " .. table.concat(p, " ", 5, 6) .. (p[7] == 1 and ", ceil_mode" or "") ..
                  (p[8] == 1 and ", count_include_pad" or ""), dtype, layout, function(x)
          return wrap(C.kiln_avg_pool2d(x.p, p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]))
        end)
      end
      for _, o in ipairs({{1, 1}, {3, 4}, {9, 11}, {13, 17}}) do   -- adaptive: shrinking, the same, growing
        pool_case("avg_pool2d", string.format("adaptive to %dx%d", o[1], o[2]), dtype, layout, function(x)
          return wrap(C.kiln_adaptive_avg_pool2d(x.p, o[1], o[2]))
        end)
      end
    end
  end
end

-- ---- convolution (cuDNN): forward, and backward through autograd (grads of x, w and b) ----

-- cuDNN's algorithms add in other orders than the CPU's GEMMs (some go through FFT or Winograd
-- transforms), so errors are measured against the largest |value| of the result, not per element.
local function conv_tol(dtype) return dtype == "f64" and 1e-11 or 1e-4 end

-- f(dev) returns (leaves, out, gout) as in with_grads.
local function conv_case(name, back, what, dtype, f)
  guarded(name, what, function()
    local lc, c, gc = f("cpu")
    local lg, g, gg = f(DEV)
    local err, detail = max_error(g, c, true)
    record(name, err, conv_tol(dtype), what, detail)
    if has_kernel(back) then
      c:backward(gc)
      g:backward(gg)
      for k, l in ipairs(lc) do
        err, detail = max_error(lg[k].grad, l.grad, true)
        record(back, err, conv_tol(dtype), what .. ", grad of " .. ({"x", "w", "b"})[k], detail)
      end
    end
  end)
end

if has_kernel("conv2d") then
  local F = kiln.functional
  local function perm(t) return t:permute(1, 4, 2, 3) end   -- base [N,H,W,C] viewed as [N,C,H,W]
  local function tr(t) return t:transpose(3, 4) end          -- base [N,C,W,H] viewed as [N,C,H,W]
  -- {what, x base, view of it, w [O,C/g,kh,kw], options, bias}
  local cases = {
    {"[2,3,9,11] * [4,3,3,3], padding 1", {2, 3, 9, 11}, same, {4, 3, 3, 3}, {padding = 1}, true},
    {"[2,3,9,11] * [5,3,3,2], stride 2, padding (1,2)", {2, 3, 9, 11}, same, {5, 3, 3, 2}, {stride = 2, padding = {1, 2}}, true},
    {"[3,4,13,10] * [6,4,3,3], dilation 2", {3, 4, 13, 10}, same, {6, 4, 3, 3}, {dilation = 2}, true},
    {"[2,6,8,9] * [4,3,3,3], groups 2, stride (2,1)", {2, 6, 8, 9}, same, {4, 3, 3, 3}, {groups = 2, stride = {2, 1}, padding = 1}, true},
    {"[2,8,7,7] * [8,1,3,3], depthwise", {2, 8, 7, 7}, same, {8, 1, 3, 3}, {groups = 8, padding = 1}, false},
    {"[2,6,9,9] * [9,2,2,3], groups 3, dilation (2,1), stride 3", {2, 6, 9, 9}, same, {9, 2, 2, 3},
     {groups = 3, dilation = {2, 1}, stride = 3, padding = {0, 1}}, true},
    {"[1,5,7,13] * [3,5,5,2], odd", {1, 5, 7, 13}, same, {3, 5, 5, 2}, {padding = {2, 0}}, true},
    {"[4,7,5,6] * [2,7,1,1], 1x1", {4, 7, 5, 6}, same, {2, 7, 1, 1}, {}, true},
    {"permuted [2,3,9,11] * [4,3,3,3]", {2, 9, 11, 3}, perm, {4, 3, 3, 3}, {padding = 1}, true},
    {"transposed [2,3,9,11] * [4,3,3,3], stride 2", {2, 3, 11, 9}, tr, {4, 3, 3, 3}, {stride = 2}, true},
    {"[8,16,32,32] * [32,16,3,3], padding 1", {8, 16, 32, 32}, same, {32, 16, 3, 3}, {padding = 1}, true},
    {"[0,3,6,6] * [4,3,3,3], empty batch", {0, 3, 6, 6}, same, {4, 3, 3, 3}, {}, true},
  }
  for _, dtype in ipairs({"f32", "f64"}) do
    for _, case in ipairs(cases) do
      local xb, wb = gen(case[2], dtype, true), gen(case[4], dtype, true)
      local bb = case[6] and gen({case[4][1]}, dtype, true) or nil
      local gout
      conv_case("conv2d", "conv2d_backward", dtype .. " " .. case[1] .. (bb and ", bias" or ""), dtype, function(dev)
        local x, w, b = xb:to(dev):requires_grad_(), wb:to(dev):requires_grad_(), bb and bb:to(dev):requires_grad_()
        local y = F.conv2d(case[3](x), w, b, case[5])
        gout = gout or gen(y:size(), dtype, true)
        return {x, w, b}, y, gout:to(dev)
      end)
    end
    -- conv_transpose2d: its forward is the conv's grad-input kernel (bias added there), its
    -- backward the conv forward and grad-weight kernels. {what, x, w [C,O/g,kh,kw], options}
    for _, case in ipairs({
      {"[2,4,5,6] * [4,3,3,3], stride 2, output padding 1", {2, 4, 5, 6}, {4, 3, 3, 3}, {stride = 2, output_padding = 1, padding = 1}},
      {"[2,6,5,5] * [6,2,3,2], groups 3, stride (1,2)", {2, 6, 5, 5}, {6, 2, 3, 2}, {groups = 3, stride = {1, 2}}},
      {"[1,3,7,4] * [3,5,3,3], dilation 2, output padding 1 (an edge the conv does not reach)", {1, 3, 7, 4}, {3, 5, 3, 3},
       {dilation = 2, output_padding = 1}},
      {"[3,2,4,4] * [2,4,4,4], stride 3, padding 2", {3, 2, 4, 4}, {2, 4, 4, 4}, {stride = 3, padding = 2}},
      -- a padding as well: the conv's passes still reach the first pad rows and columns past the
      -- padding-free corner (the second case needs the graph API's smaller padding after it)
      {"[2,3,5,4] * [3,4,3,2], stride 2, dilation 3, padding 1, output padding 2 (the last rows reached)", {2, 3, 5, 4},
       {3, 4, 3, 2}, {stride = 2, dilation = 3, padding = 1, output_padding = 2}},
      {"[1,3,7,4] * [3,5,3,3], dilation 2, padding 1, output padding 1 (the last row reached)", {1, 3, 7, 4}, {3, 5, 3, 3},
       {dilation = 2, padding = 1, output_padding = 1}},
    }) do
      local xb, wb = gen(case[2], dtype, true), gen(case[3], dtype, true)
      local bb = gen({case[3][2] * (case[4].groups or 1)}, dtype, true)
      local gout
      conv_case("conv2d_backward", "conv2d", dtype .. " conv_transpose2d " .. case[1] .. ", bias", dtype, function(dev)
        local x, w, b = xb:to(dev):requires_grad_(), wb:to(dev):requires_grad_(), bb:to(dev):requires_grad_()
        local y = F.conv_transpose2d(x, w, b, case[4])
        gout = gout or gen(y:size(), dtype, true)
        return {x, w, b}, y, gout:to(dev)
      end)
    end
  end
  -- a shape seen before reuses its algorithm: ten more runs of one shape give the same answer
  guarded("conv2d", "cached algorithm, repeated", function()
    local x, w = gen({4, 8, 16, 16}, "f32", true), gen({8, 8, 3, 3}, "f32", true)
    local c = F.conv2d(x, w, nil, {padding = 1})
    local xd, wd = x:to(DEV), w:to(DEV)
    local worst = 0
    for _ = 1, 10 do
      local err = max_error(F.conv2d(xd, wd, nil, {padding = 1}):cpu(), c, true)
      if err > worst then worst = err end
    end
    record("conv2d", worst, conv_tol("f32"), "f32 [4,8,16,16] * [8,8,3,3], the same shape 10 times", "")
  end)
end

-- ---- optimizer steps: three steps on several parameters (a transposed one among them) ----

local optim_cases = {
  {"sgd_step", "SGD", {lr = 0.1}}, {"sgd_step", "SGD", {lr = 0.1, momentum = 0.9, weight_decay = 0.01}},
  {"sgd_step", "SGD", {lr = 0.1, momentum = 0.9, dampening = 0.1, nesterov = false}},
  {"sgd_step", "SGD", {lr = 0.05, momentum = 0.8, nesterov = true}},
  {"adam_step", "Adam", {lr = 1e-2}}, {"adam_step", "Adam", {lr = 1e-2, weight_decay = 0.1, amsgrad = true}},
  {"adam_step", "AdamW", {lr = 1e-2, weight_decay = 0.1}}, {"adam_step", "Adam", {lr = 1e-2, betas = {0.3, 0.5}}},
  {"rmsprop_step", "RMSprop", {lr = 1e-2}}, {"rmsprop_step", "RMSprop", {lr = 1e-2, momentum = 0.9, centered = true}},
  {"rmsprop_step", "RMSprop", {lr = 1e-2, alpha = 0.3, weight_decay = 0.1, centered = true}},
  {"adagrad_step", "Adagrad", {lr = 0.1}}, {"adagrad_step", "Adagrad", {lr = 0.1, lr_decay = 0.01, weight_decay = 0.1}},
}
for _, case in ipairs(optim_cases) do
  local name, cls, opts = case[1], case[2], case[3]
  if has_kernel(name) then
    for _, dtype in ipairs({"f32", "f64"}) do
      local shapes = {{37, 53}, {53}, {1}, {7, 3, 5}}
      local inits, grads = {}, {}
      for i, sh in ipairs(shapes) do
        inits[i] = gen(sh, dtype, true)
        grads[i] = {gen(sh, dtype, true), gen(sh, dtype, true), gen(sh, dtype, true)}
      end
      local keys = {}
      for k, v in pairs(opts) do keys[#keys + 1] = k .. "=" .. tostring(type(v) == "table" and table.concat(v, "/") or v) end
      table.sort(keys)
      local what = string.format("%s %s {%s}", cls, dtype, table.concat(keys, ", "))
      guarded(name, what, function()
        local function run_on(dev)
          local params = {}
          for i = 1, #shapes do
            params[i] = inits[i]:to(dev):clone()
            if i == 1 then params[i] = params[i]:t():contiguous():t() end   -- a transposed parameter
          end
          local o = kiln.optim[cls](params, opts)
          for step = 1, 3 do
            for i = 1, #shapes do
              local g = grads[i][step]:to(dev)
              params[i].grad = i == 1 and g:t():contiguous():t() or g
            end
            o:step()
          end
          return params
        end
        local pc, pg = run_on("cpu"), run_on(DEV)
        local worst, wd = 0, nil
        for i = 1, #shapes do
          local err, detail = max_error(pg[i], pc[i])
          if err > worst then worst, wd = err, detail end
        end
        record(name, worst, dtype == "f64" and 1e-12 or 1e-5, what, wd)
      end)
    end
  end
end

-- ---- recurrent layers: one layer of each mode through kiln.functional.rnn_layer, and 2-layer
-- bidirectional modules (kiln.nn.RNN/GRU/LSTM moved with :to), forward and every grad ----

-- Twice: kiln's own kernels (algorithm "gemm", rows rnn / rnn_backward) and cuDNN's RNN API
-- (algorithm "cudnn", runtime/cuda/kernels/rnn_cudnn.cu, rows "rnn (cudnn)" / "rnn_backward (cudnn)"),
-- each against the CPU (where "cudnn" runs the GEMM path). Both run other products than the CPU's
-- BLAS and, in f32, other activations than the CPU's polynomial exp and tanh: one tolerance for
-- both. On the CPU these cases in f32 are within 2.3e-5 of f64 (the weight grads of the batch-64
-- case sum 1088 rows).
local function rnn_tol(dtype) return dtype == "f64" and 1e-11 or 2e-4 end
local rnn_modes = {"rnn_tanh", "rnn_relu", "gru", "lstm"}
local rnn_gates = {rnn_tanh = 1, rnn_relu = 1, gru = 3, lstm = 4}
-- a fresh leaf on dev: the CPU's copy must not make the source itself a leaf that needs grad
local function rnn_leaf(t, dev) return t:to(dev):detach():requires_grad_() end
local function rnn_small(shape, dtype, scale) return (gen(shape, "f64", true) * (scale / 3)):to(dtype) end

local rnn_algorithms = {{algorithm = "gemm", name = "rnn", back = "rnn_backward", suffix = ""}}
if not ON_GPU or kiln.cuda.has_cudnn() then
  rnn_algorithms[2] = {algorithm = "cudnn", name = "rnn (cudnn)", back = "rnn_backward (cudnn)", suffix = ", cudnn"}
end
local rnn_cases = {
  {"T 9 B 5 I 7 H 24", 9, 5, 7, 24},
  {"T 9 B 5 I 7 H 24, unsorted lengths, reverse, initial state", 9, 5, 7, 24, {9, 3, 1, 7, 9}, true, true},
  {"T 9 B 5 I 7 H 24, unsorted lengths, initial state", 9, 5, 7, 24, {2, 9, 5, 1, 8}, false, true},
  {"T 9 B 5 I 7 H 24, lengths, transposed input, initial state, no biases", 9, 5, 7, 24, {4, 9, 2, 2, 6}, false, true,
   true, true},
  {"T 9 B 5 I 7 H 24, reverse, no lengths, no biases", 9, 5, 7, 24, nil, true, false, false, true},
  {"T 1 B 1 I 3 H 5, reverse", 1, 1, 3, 5, nil, true},
  {"T 17 B 64 I 40 H 130, lengths, reverse", 17, 64, 40, 130, "mixed", true},
}

for _, alg in ipairs(has_kernel("rnn") and rnn_algorithms or {}) do
  local NAME, BACK = alg.name, alg.back
  for _, mode in ipairs(rnn_modes) do
    for _, dtype in ipairs({"f32", "f64"}) do
      local G = rnn_gates[mode]
      for _, case in ipairs(rnn_cases) do
        local T, B, I, H, lengths, reverse, state, transposed, nobias = unpack(case, 2, 10)
        if lengths == "mixed" then
          lengths = {}
          for b = 1, B do lengths[b] = 1 + (b * 7) % T end
          lengths[1] = T
        end
        local xb = transposed and rnn_small({B, T, I}, dtype, 1) or rnn_small({T, B, I}, dtype, 1)
        -- w_hh's spectral radius about 0.5: differences in the last bits shrink along the sequence
        local wi, wh = rnn_small({G * H, I}, dtype, 1 / math.sqrt(I)), rnn_small({G * H, H}, dtype, 0.5 / math.sqrt(H))
        local bi, bh = rnn_small({G * H}, dtype, 0.3), rnn_small({G * H}, dtype, 0.3)
        local h0, c0 = rnn_small({B, H}, dtype, 0.5), rnn_small({B, H}, dtype, 0.5)
        local gout = rnn_small({T + (mode == "lstm" and 2 or 1), B, H}, dtype, 1)
        with_grads(NAME, BACK, string.format("%s %s %s", mode, dtype, case[1]), rnn_tol(dtype), function(dev)
          local x, w_ih, w_hh = rnn_leaf(xb, dev), rnn_leaf(wi, dev), rnn_leaf(wh, dev)
          local leaves = {x, w_ih, w_hh}
          local b_ih, b_hh, hh, cc
          if not nobias then
            b_ih, b_hh = rnn_leaf(bi, dev), rnn_leaf(bh, dev)
            leaves[#leaves + 1] = b_ih leaves[#leaves + 1] = b_hh
          end
          if state then
            hh = rnn_leaf(h0, dev) leaves[#leaves + 1] = hh
            if mode == "lstm" then cc = rnn_leaf(c0, dev) leaves[#leaves + 1] = cc end
          end
          local z = kiln.functional.rnn_layer(mode, transposed and x:transpose(1, 2) or x, hh, cc, w_ih, w_hh, b_ih, b_hh,
                                              {lengths = lengths, reverse = reverse, algorithm = alg.algorithm})
          return leaves, z, gout:to(dev)
        end)
      end
      -- only the weights need grads (no grad of x, h0 or c0 asked of the backward)
      local T, B, I, H = 6, 3, 4, 8
      local xb, wi, wh = rnn_small({T, B, I}, dtype, 1), rnn_small({G * H, I}, dtype, 0.5), rnn_small({G * H, H}, dtype, 0.2)
      local gout = rnn_small({T + (mode == "lstm" and 2 or 1), B, H}, dtype, 1)
      with_grads(NAME, BACK, string.format("%s %s T 6 B 3 I 4 H 8, lengths, grads of the weights only", mode, dtype),
                 rnn_tol(dtype), function(dev)
        local w_ih, w_hh = rnn_leaf(wi, dev), rnn_leaf(wh, dev)
        local z = kiln.functional.rnn_layer(mode, xb:to(dev), nil, nil, w_ih, w_hh, nil, nil,
                                            {lengths = {6, 2, 4}, algorithm = alg.algorithm})
        return {w_ih, w_hh}, z, gout:to(dev)
      end)
    end
  end

  -- Modules: the same parameters on both (one seed), initial states, output, h_n (and c_n) in one
  -- tensor; the grads of the input and of every parameter, by name.
  for _, spec in ipairs({{"RNN", {}}, {"RNN", {nonlinearity = "relu"}}, {"GRU", {}}, {"LSTM", {}}}) do
    for _, dtype in ipairs({"f32", "f64"}) do
      local cls, opts = spec[1], {num_layers = 2, bidirectional = true, dtype = dtype, algorithm = alg.algorithm}
      for k, v in pairs(spec[2]) do opts[k] = v end
      local T, B, I, H = 11, 6, 5, 16
      local xb = (gen({T, B, I}, "f64", true) / 3):to(dtype)
      local lengths = {11, 4, 1, 11, 7, 2}
      local what = string.format("nn.%s%s %s, 2 layers, bidirectional, lengths%s", cls,
                                 opts.nonlinearity and "(relu)" or "", dtype, alg.suffix)
      local names
      guarded(NAME, what, function()
        local function run_on(dev)
          kiln.manual_seed(4242)
          local m = kiln.nn[cls](I, H, opts)
          if dev ~= "cpu" then m:to(dev) end
          local x = rnn_leaf(xb, dev)
          local h0 = (kiln.randn(2 * 2, B, H, {dtype = dtype}) * 0.3):to(dev)
          local out, hn = m(x, cls == "LSTM" and {h0, h0 * 0.5} or h0, lengths)
          local parts = {out:reshape(-1)}
          if cls == "LSTM" then parts[2], parts[3] = hn[1]:reshape(-1), hn[2]:reshape(-1) else parts[2] = hn:reshape(-1) end
          local y = kiln.cat(parts, 1)
          kiln.manual_seed(77)
          local gy = kiln.randn(y:size(), {dtype = dtype})
          y:backward(gy:to(dev))
          local grads = {x = x.grad}
          names = {"x"}
          for _, np in ipairs(m:named_parameters()) do
            names[#names + 1] = np[1]
            grads[np[1]] = np[2].grad
          end
          return y, grads
        end
        local yc, gc = run_on("cpu")
        local yg, gg = run_on(DEV)
        local err, detail = max_error(yg, yc)
        record(NAME, err, rnn_tol(dtype), what, detail)
        for _, name in ipairs(names) do
          local e, d = max_error(gg[name], gc[name])
          record(BACK, e, rnn_tol(dtype), what .. ", grad of " .. name, d)
        end
      end)
    end
  end
end

-- which algorithm a layer on the device runs, and cuDNN against kiln's own kernels on the device
-- itself (no CPU in between; nothing needs grad, so this is cuDNN's inference mode)
if ON_GPU and kiln.cuda.has_kernel("rnn") then
  local F, NAME = kiln.functional, "rnn (cudnn)"
  guarded(NAME, "the algorithm chosen on cuda:0", function()
    local a, why = F.rnn_algorithm("lstm", 8, 64, {device = DEV})
    local want = kiln.cuda.has_cudnn() and "cudnn" or "gemm"
    local g = F.rnn_algorithm("lstm", 8, 64, {device = DEV, algorithm = "gemm"})
    local p = F.rnn_algorithm("gru", 8, 64, {device = DEV, algorithm = "persistent"})
    extras[#extras + 1] = "rnn on cuda:0: " .. tostring(a) .. " (" .. why .. ")"
    record(NAME, (a == want and g == "gemm" and p == want) and 0 or math.huge, 0, "auto picks " .. want .. ", gemm when asked",
           string.format("auto %s (%s), gemm -> %s, persistent -> %s", tostring(a), why, tostring(g), tostring(p)))
  end)
  if kiln.cuda.has_cudnn() then
    guarded(NAME, "cudnn against gemm on cuda:0, lstm f32", function()
      local T, B, I, H = 12, 7, 9, 32
      local x = rnn_small({T, B, I}, "f32", 1):to(DEV)
      local wi, wh = rnn_small({4 * H, I}, "f32", 0.3):to(DEV), rnn_small({4 * H, H}, "f32", 0.2):to(DEV)
      local bi, bh = rnn_small({4 * H}, "f32", 0.3):to(DEV), rnn_small({4 * H}, "f32", 0.3):to(DEV)
      local o = {lengths = {12, 5, 1, 9, 12, 3, 7}, reverse = true}
      o.algorithm = "cudnn"
      local a = F.rnn_layer("lstm", x, nil, nil, wi, wh, bi, bh, o)
      o.algorithm = "gemm"
      local b = F.rnn_layer("lstm", x, nil, nil, wi, wh, bi, bh, o)
      local err, detail = max_error(a:cpu(), b:cpu())
      record(NAME, err, rnn_tol("f32"), "cudnn against gemm on cuda:0, lstm f32, lengths, reverse", detail)
    end)
  end
end

-- ---- the allocator and errors (the device only) ----

if ON_GPU then
  local function stats() return kiln.cuda.memory_stats(0) end
  guarded("allocator", "steady state", function()
    local x, y = kiln.randn(1000, 1000, {device = DEV}), kiln.randn(1000, 1000, {device = DEV})
    local before
    for step = 1, 30 do
      local z = ((x * y + x):exp() - y):relu()
      z:free()
      collectgarbage()
      if step == 5 then before = stats() end
    end
    kiln.cuda.synchronize()
    local after = stats()
    local grew = after.device_allocs - before.device_allocs
    extras[#extras + 1] = string.format("allocator: %d cudaMalloc calls in 25 steady steps; %d requests, %d cache hits, " ..
                                        "%.1f MiB reserved, peak %.1f MiB allocated", grew, after.requests,
                                        after.cache_hits, after.reserved / 2 ^ 20, after.peak_allocated / 2 ^ 20)
    record("allocator", grew, 0, "steady state: cudaMalloc calls after warm-up", "")
  end)
  guarded("allocator", "out of memory, then usable", function()
    local ok, err = pcall(function() return kiln.empty(2 ^ 46, {device = DEV}) end)   -- 256 TiB of f32
    local fine = not ok and tostring(err):match("out of memory") ~= nil
    local after = kiln.ones(3, {device = DEV}):cpu()
    extras[#extras + 1] = "out of memory: " .. tostring(err)
    record("allocator", (fine and after:numel() == 3) and 0 or math.huge, 0, "out of memory, then usable", tostring(err))
  end)
  guarded("allocator", "empty_cache gives blocks back", function()
    collectgarbage()
    kiln.cuda.empty_cache()
    local s = stats()
    extras[#extras + 1] = string.format("after empty_cache: %.1f MiB reserved, %.1f MiB allocated", s.reserved / 2 ^ 20,
                                        s.allocated / 2 ^ 20)
    record("allocator", s.reserved <= s.allocated + 64 * 2 ^ 20 and 0 or math.huge, 0, "empty_cache", "")
  end)
  guarded("errors", "an op without a CUDA kernel", function()
    if kiln.cuda.has_kernel("conv2d") then return end   -- a build without cuDNN
    local ok, err = pcall(function()
      return kiln.functional.conv2d(kiln.ones(1, 1, 3, 3, {device = DEV}), kiln.ones(1, 1, 2, 2, {device = DEV}))
    end)
    record("errors", (not ok and tostring(err):match("conv2d: not implemented on cuda:0")) and 0 or math.huge, 0,
           "conv2d on cuda:0", tostring(err))
  end)
  guarded("errors", "a conv of another dtype", function()
    if not kiln.cuda.has_kernel("conv2d") then return end
    local ok, err = pcall(function()
      return kiln.functional.conv2d(kiln.ones(1, 1, 3, 3, {device = DEV, dtype = "f16"}),
                                    kiln.ones(1, 1, 2, 2, {device = DEV, dtype = "f16"}))
    end)
    local after = kiln.functional.conv2d(kiln.ones(1, 1, 3, 3, {device = DEV}), kiln.ones(1, 1, 2, 2, {device = DEV})):cpu()
    local fine = not ok and tostring(err):match("conv2d") ~= nil and after:sum():item() == 16
    record("errors", fine and 0 or math.huge, 0, "conv2d in f16 on cuda:0 (an error, then usable)", tostring(err))
  end)
end

-- =================================================================================================
-- ---- CTC loss (ctc.cu): the loss and the grad of log_probs against the CPU ----
-- Padded ([N,S], made on the device) and concatenated (1-d) targets, each reduction, zero_infinity
-- (samples too short for their target, input length 0), a class of probability 0 (an infinite
-- loss, or 0 under zero_infinity), f32 and f64, blanks other than the first class, a block
-- striding over more positions (2S+1 > 256) and more classes (C > 256) than it has threads,
-- non-contiguous log_probs, the grad through a log_softmax, and the too-short sample's error
-- (the same message on both devices, then the device still works).
if has_kernel("ctc_loss") then
  local F = kiln.functional
  -- f32: alpha and the nll are stored in f32 between steps, so one rounding may fall either way
  local function ctc_tol(dtype) return dtype == "f64" and 1e-11 or 5e-5 end
  local function need_of(l)
    local need = #l
    for i = 2, #l do if l[i] == l[i - 1] then need = need + 1 end end
    return need
  end
  -- Targets (labels from 1, never the blank, a third of them repeats) and lengths; input lengths
  -- long enough for the targets unless short is set (then any, 0 included).
  local function ctc_targets(T, N, nclass, blank, maxL, short)
    local targets, il, tl = {}, {}, {}
    for n = 1, N do
      local l = {}
      for i = 1, math.random(0, maxL) do
        local c
        if i > 1 and math.random(3) == 1 then c = l[i - 1] else repeat c = math.random(1, nclass) until c ~= blank end
        l[i] = c
      end
      while need_of(l) > T do l[#l] = nil end
      targets[n], tl[n] = l, #l
      il[n] = short and math.random(0, T) or math.random(need_of(l), T)
    end
    if short then il[1] = math.max(0, need_of(targets[1]) - 1) end   -- at least one sample too short
    return targets, il, tl
  end
  local function padded_of(targets, tl)
    local S = 1
    for _, L in ipairs(tl) do S = math.max(S, L) end
    local rows = {}
    for n, l in ipairs(targets) do
      rows[n] = {}
      for i = 1, S do rows[n][i] = l[i] or 1 end   -- padding past the length: not read
    end
    return kiln.tensor(rows, {dtype = "i64"})
  end
  local function flat_of(targets)
    local flat = {}
    for _, l in ipairs(targets) do for _, c in ipairs(l) do flat[#flat + 1] = c end end
    return #flat > 0 and kiln.tensor(flat, {dtype = "i64"}) or nil
  end
  -- log_probs [T,N,C] made on the CPU; zero_at: {t, n, c} (from 1) set to -inf (probability 0).
  local function ctc_lp(T, N, C_, dtype, zero_at)
    local lp = (kiln.randn(T, N, C_, {dtype = "f64"}) * 2):log_softmax(3)
    if zero_at then
      check(C.kiln_tensor_set(lp.p, ((zero_at[1] - 1) * N + (zero_at[2] - 1)) * C_ + (zero_at[3] - 1), -1 / 0))
    end
    return lp:to(dtype)
  end

  math.randomseed(20261201)
  local shapes = {
    {T = 12, N = 5, C = 6, maxL = 5, blank = 1},
    {T = 30, N = 3, C = 9, maxL = 12, blank = 4},
    {T = 300, N = 2, C = 8, maxL = 140, blank = 8},     -- 2S+1 up to 281 positions: a block strides
    {T = 40, N = 3, C = 300, maxL = 15, blank = 2},     -- 300 classes: the gradient strides
  }
  for _, dtype in ipairs({"f32", "f64"}) do
    for _, sh in ipairs(shapes) do
      for _, padded in ipairs({true, false}) do
        for _, red in ipairs({"none", "mean", "sum"}) do
          for _, zi in ipairs({false, true}) do
            local targets, il, tl = ctc_targets(sh.T, sh.N, sh.C, sh.blank, sh.maxL, zi)
            local tg = padded and padded_of(targets, tl) or flat_of(targets)
            -- a class of probability 0 at one step of sample 2 in every other case
            local zero_at = (#targets[2] > 0 and red ~= "sum") and {1, 2, targets[2][1]} or nil
            local lp = ctc_lp(sh.T, sh.N, sh.C, dtype, zero_at)
            local gout = red == "none" and (kiln.rand(sh.N, {dtype = dtype}) + 0.5) or nil
            local what = string.format("%s T %d N %d C %d blank %d, %s targets, %s%s%s", dtype, sh.T, sh.N, sh.C, sh.blank,
                                       padded and "padded" or "concatenated", red, zi and ", zero_infinity (short samples)" or "",
                                       zero_at and ", a class of probability 0" or "")
            with_grad("ctc_loss", "ctc_loss_backward", what, ctc_tol(dtype), function(dev)
              local x = leaf(lp, dev)
              local out = F.ctc_loss(x, tg and tg:to(dev) or {}, il, tl, {blank = sh.blank, reduction = red, zero_infinity = zi})
              return x, out, gout and gout:to(dev) or nil
            end)
          end
        end
      end
    end
    -- non-contiguous log_probs (a transposed [N,T,C]), and the grad through a log_softmax of logits
    local targets, il, tl = ctc_targets(20, 4, 7, 3, 8, false)
    local tg = padded_of(targets, tl)
    local base = kiln.randn(4, 20, 7, {dtype = dtype})
    with_grad("ctc_loss", "ctc_loss_backward", dtype .. " transposed log_probs [N,T,C] -> [T,N,C], mean", ctc_tol(dtype),
              function(dev)
                local x = leaf(base:log_softmax(3), dev)
                return x, F.ctc_loss(x:transpose(1, 2), tg:to(dev), il, tl, {blank = 3})
              end)
    with_grad("ctc_loss", "ctc_loss_backward", dtype .. " through a log_softmax of the logits, sum", ctc_tol(dtype),
              function(dev)
                local x = leaf(base, dev)
                return x, F.ctc_loss(x:log_softmax(3):transpose(1, 2), tg:to(dev), il, tl, {blank = 3, reduction = "sum"})
              end)
  end
  -- a sample too short for its target: the front end's error, the same on both devices
  same_error("ctc_loss", "a sample too short for its target", function(dev)
    return F.ctc_loss(ctc_lp(6, 2, 4, "f32"):to(dev), {{2, 3}, {2, 2}}, {6, 2})
  end)
  guarded("ctc_loss", "the device after the error", function()
    local lp = ctc_lp(6, 2, 4, "f64")
    local c = F.ctc_loss(lp, {{2, 3}, {2, 2}}, {6, 6})
    local g = F.ctc_loss(lp:to(DEV), {{2, 3}, {2, 2}}, {6, 6})
    local err, detail = max_error(g, c)
    record("ctc_loss", err, ctc_tol("f64"), "f64, after the error", detail)
  end)
end

-- ---- cuDNN convolutions under both APIs: the graph (backend) API and the legacy calls ----
-- (appended last, before the table; kiln.cuda.set_conv_api / set_cudnn_benchmark switch at run time)
-- Every case runs under set_conv_api("graph") and ("legacy"), each with cuDNN's heuristics and with
-- benchmark mode (candidates timed on the call's buffers), in f32 and f64, against the CPU: the
-- forward and the grads of x, w and b. Batches of 3 keep these shapes new to the process, so each
-- setting plans them afresh. Under the graph API, KILN_CUDNN_GRAPH_STRICT=1 makes a shape it cannot
-- plan an error instead of a quiet fallback to the legacy API, so these cases prove the graph API
-- ran. Then the two APIs against each other, a cached plan reused, and a bad KILN_CUDNN_API value
-- refused by name, after which convolutions still work.
if ON_GPU and has_kernel("conv2d") then
  local F = kiln.functional
  local api0, bench0 = kiln.cuda.conv_api(), kiln.cuda.cudnn_benchmark()
  pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
  local function setting(api, bench)
    kiln.cuda.set_conv_api(api)
    kiln.cuda.set_cudnn_benchmark(bench)
    ffi.C.setenv("KILN_CUDNN_GRAPH_STRICT", api == "graph" and "1" or "0", 1)
    return api .. " api" .. (bench and ", benchmark" or "")
  end
  -- {what, x, w [O,C/g,kh,kw], options}
  local api_cases = {
    {"[3,3,9,11] * [4,3,3,3], padding 1", {3, 3, 9, 11}, {4, 3, 3, 3}, {padding = 1}},
    {"[3,6,8,9] * [4,3,3,3], groups 2, stride (2,1), padding 1", {3, 6, 8, 9}, {4, 3, 3, 3}, {groups = 2, stride = {2, 1}, padding = 1}},
    {"[3,6,9,9] * [9,2,2,3], groups 3, dilation (2,1), stride 3, padding (0,1)", {3, 6, 9, 9}, {9, 2, 2, 3},
     {groups = 3, dilation = {2, 1}, stride = 3, padding = {0, 1}}},
    {"[3,8,7,7] * [8,1,3,3], depthwise, padding 1", {3, 8, 7, 7}, {8, 1, 3, 3}, {groups = 8, padding = 1}},
    {"[3,5,7,13] * [3,5,5,2], odd, padding (2,0)", {3, 5, 7, 13}, {3, 5, 5, 2}, {padding = {2, 0}}},
    {"[3,7,5,6] * [2,7,1,1], 1x1", {3, 7, 5, 6}, {2, 7, 1, 1}, {}},
    {"[3,4,13,10] * [6,4,3,3], dilation 2, stride 2", {3, 4, 13, 10}, {6, 4, 3, 3}, {dilation = 2, stride = 2}},
    {"[3,16,20,20] * [24,16,3,3], padding 1", {3, 16, 20, 20}, {24, 16, 3, 3}, {padding = 1}},
  }
  for _, api in ipairs({"graph", "legacy"}) do
    for _, bench in ipairs({false, true}) do
      for _, dtype in ipairs({"f32", "f64"}) do
        for _, case in ipairs(api_cases) do
          local xb, wb, bb = gen(case[2], dtype, true), gen(case[3], dtype, true), gen({case[3][1]}, dtype, true)
          local gout
          local label = setting(api, bench)
          conv_case("conv2d", "conv2d_backward", label .. ": " .. dtype .. " " .. case[1] .. ", bias", dtype, function(dev)
            local x, w, b = xb:to(dev):requires_grad_(), wb:to(dev):requires_grad_(), bb:to(dev):requires_grad_()
            local y = F.conv2d(x, w, b, case[4])
            gout = gout or gen(y:size(), dtype, true)
            return {x, w, b}, y, gout:to(dev)
          end)
        end
        -- conv_transpose2d with an output padding past the conv's reach: x's corner, through its strides
        local xb, wb, bb = gen({3, 3, 7, 4}, dtype, true), gen({3, 5, 3, 3}, dtype, true), gen({5}, dtype, true)
        local gout
        local label = setting(api, bench)
        conv_case("conv2d_backward", "conv2d", label .. ": " .. dtype .. " conv_transpose2d [3,3,7,4] * [3,5,3,3], dilation 2, " ..
                  "output padding 1, bias", dtype, function(dev)
          local x, w, b = xb:to(dev):requires_grad_(), wb:to(dev):requires_grad_(), bb:to(dev):requires_grad_()
          local y = F.conv_transpose2d(x, w, b, {dilation = 2, output_padding = 1})
          gout = gout or gen(y:size(), dtype, true)
          return {x, w, b}, y, gout:to(dev)
        end)
      end
    end
  end
  -- the two APIs agree with each other (as closely as with the CPU)
  for _, dtype in ipairs({"f32", "f64"}) do
    guarded("conv2d", dtype .. " graph api vs legacy api", function()
      local x, w = gen({5, 6, 11, 9}, dtype, true):to(DEV), gen({8, 3, 3, 2}, dtype, true):to(DEV)
      setting("graph", false)
      local g = F.conv2d(x, w, nil, {groups = 2, stride = {1, 2}, padding = {1, 0}}):cpu()
      setting("legacy", false)
      local l = F.conv2d(x, w, nil, {groups = 2, stride = {1, 2}, padding = {1, 0}}):cpu()
      local err, detail = max_error(g, l, true)
      record("conv2d", err, conv_tol(dtype), dtype .. " [5,6,11,9] * [8,3,3,2], groups 2: graph api against legacy api", detail)
    end)
  end
  -- a planned shape reuses its cached plan: ten runs under each setting give the CPU's answer
  guarded("conv2d", "cached plans, repeated", function()
    local x, w = gen({3, 8, 16, 16}, "f32", true), gen({8, 8, 3, 3}, "f32", true)
    local c = F.conv2d(x, w, nil, {padding = 1})
    local xd, wd = x:to(DEV), w:to(DEV)
    for _, api in ipairs({"graph", "legacy"}) do
      for _, bench in ipairs({false, true}) do
        local label = setting(api, bench)
        local worst = 0
        for _ = 1, 10 do
          local err = max_error(F.conv2d(xd, wd, nil, {padding = 1}):cpu(), c, true)
          if err > worst then worst = err end
        end
        record("conv2d", worst, conv_tol("f32"), label .. ": f32 [3,8,16,16] * [8,8,3,3], the same shape 10 times", "")
      end
    end
  end)
  -- a bad KILN_CUDNN_API is refused by the op, naming the variable; then convolutions work again
  guarded("errors", "conv2d with KILN_CUDNN_API=bogus", function()
    ffi.C.setenv("KILN_CUDNN_API", "bogus", 1)
    local ok, err = pcall(function()
      return F.conv2d(kiln.ones(1, 1, 3, 3, {device = DEV}), kiln.ones(1, 1, 2, 2, {device = DEV}))
    end)
    setting("graph", false)
    local after = F.conv2d(kiln.ones(1, 1, 3, 3, {device = DEV}), kiln.ones(1, 1, 2, 2, {device = DEV})):cpu()
    local fine = not ok and tostring(err):match("conv2d: KILN_CUDNN_API='bogus'") ~= nil and after:sum():item() == 16
    record("errors", fine and 0 or math.huge, 0, "conv2d with KILN_CUDNN_API=bogus (an error, then usable)", tostring(err))
  end)
  kiln.cuda.set_conv_api(api0 == "legacy" and "legacy" or "graph")
  kiln.cuda.set_cudnn_benchmark(bench0)
  ffi.C.setenv("KILN_CUDNN_GRAPH_STRICT", "0", 1)
end


-- ==== matmul precision and cuBLASLt (kiln.set_float32_matmul_precision) ====
-- f32 GEMMs at "highest" (exact f32: f32 tolerance), "high" (TF32: inputs rounded to 10 mantissa
-- bits) and "medium" (BF16: 7 bits), each against the CPU's f32 product (which ignores the setting),
-- the normalised error bounded by what the rounding allows; "high" must also differ from exact f32 by
-- more than f32's tolerance (TF32 is in use). bf16 and f16 GEMMs through cuBLASLt at sizes where tensor
-- cores matter, batched with a broadcast operand and at misaligned addresses (views starting one
-- element in, so cuBLASLt is told 2- or 4-byte alignment). A repeated product (the cached algorithm)
-- gives the same bits. The setting is put back to "highest" afterwards, whatever happens.
local precision_tol = {highest = 2e-5, high = 2e-3, medium = 1.5e-2}
if has_kernel("gemm") then
  local function lt_case(what, precision, dtype, tol, f)
    guarded("gemm precision", what, function()
      local ok, err = pcall(function()
        kiln.set_float32_matmul_precision(precision)
        local g = f(DEV)
        kiln.set_float32_matmul_precision("highest")
        local c = f("cpu")
        local e, detail = max_error(g, c, true)
        record("gemm precision", e, tol, what, detail)
      end)
      kiln.set_float32_matmul_precision("highest")
      if not ok then error(err, 0) end
    end)
  end
  local function inputs(sa, sb, dtype, views)
    local a, b = gen(sa, dtype, true), gen(sb, dtype, true)
    return function(dev)
      local x, y = a:to(dev), b:to(dev)
      if views then x, y = views(x, y) end
      return x, y
    end
  end
  local sq = inputs({512, 768}, {768, 384}, "f32")
  local bt = inputs({4, 192, 256}, {256, 320}, "f32")                      -- b broadcast over the batch
  local tt = inputs({768, 512}, {384, 768}, "f32", function(x, y) return x:t(), y:t() end)
  local mis = inputs({300, 257}, {257, 130}, "f32", function(x, y) return x:narrow(2, 2, 256), y:narrow(1, 2, 256) end)
  for _, precision in ipairs({"highest", "high", "medium"}) do
    local tol = precision_tol[precision]
    lt_case("f32 " .. precision .. " [512,768] @ [768,384]", precision, "f32", tol,
            function(dev) local a, b = sq(dev) return a:matmul(b) end)
    lt_case("f32 " .. precision .. " [4,192,256] @ [256,320] (batch stride 0)", precision, "f32", tol,
            function(dev) local a, b = bt(dev) return a:matmul(b) end)
    lt_case("f32 " .. precision .. " transposed @ transposed", precision, "f32", tol,
            function(dev) local a, b = tt(dev) return a:matmul(b) end)
    lt_case("f32 " .. precision .. " misaligned views (4-byte alignment)", precision, "f32", tol,
            function(dev) local a, b = mis(dev) return a:matmul(b) end)
  end
  -- TF32 in effect: "high" must differ from exact f32 by more than f32's tolerance (randn inputs
  -- lose their low 13 mantissa bits), and still by less than TF32's.
  guarded("gemm precision", "f32 high differs from highest (TF32 in use)", function()
    local ok, err = pcall(function()
      local a, b = sq(DEV)
      kiln.set_float32_matmul_precision("highest")
      local exact = a:matmul(b):to("cpu")
      kiln.set_float32_matmul_precision("high")
      local fast = a:matmul(b):to("cpu")
      kiln.set_float32_matmul_precision("highest")
      local e = max_error(fast, exact, true)
      local in_use = not ON_GPU or (e > precision_tol.highest and e <= precision_tol.high)
      record("gemm precision", in_use and 0 or math.huge, 0, "f32 high differs from highest (TF32 in use)",
             string.format("normalised difference %.3g, expected in (%g, %g]", e, precision_tol.highest, precision_tol.high))
    end)
    kiln.set_float32_matmul_precision("highest")
    if not ok then error(err, 0) end
  end)
  for _, dtype in ipairs({"bf16", "f16"}) do
    local tol = tolerance("gemm", "f32", dtype)
    local big = inputs({1024, 1024}, {1024, 1024}, dtype)
    lt_case(dtype .. " [1024,1024] @ [1024,1024]", "highest", dtype, tol, function(dev) local a, b = big(dev) return a:matmul(b) end)
    lt_case(dtype .. " [1024,1024] @ [1024,1024] under high (no effect)", "high", dtype, tol,
            function(dev) local a, b = big(dev) return a:matmul(b) end)
    local bb = inputs({6, 128, 320}, {320, 200}, dtype)
    lt_case(dtype .. " [6,128,320] @ [320,200] (batch stride 0)", "highest", dtype, tol,
            function(dev) local a, b = bb(dev) return a:matmul(b) end)
    local tr = inputs({320, 128}, {200, 320}, dtype, function(x, y) return x:t(), y:t() end)
    lt_case(dtype .. " transposed @ transposed", "highest", dtype, tol, function(dev) local a, b = tr(dev) return a:matmul(b) end)
    local mb = inputs({129, 257}, {257, 65}, dtype, function(x, y) return x:narrow(2, 2, 256), y:narrow(1, 2, 256) end)
    lt_case(dtype .. " misaligned views (2-byte alignment)", "highest", dtype, tol,
            function(dev) local a, b = mb(dev) return a:matmul(b) end)
  end
  -- the cached algorithm: the same product twice, bit for bit (and the first one is the cache's miss)
  for _, case in ipairs({{"f32", "high"}, {"bf16", "highest"}}) do
    local what = case[1] .. " " .. case[2] .. " twice (the cached algorithm): the same bits"
    guarded("gemm precision", what, function()
      local ok, err = pcall(function()
        local x = inputs({96, 160}, {160, 224}, case[1])
        local a, b = x(DEV)
        kiln.set_float32_matmul_precision(case[2])
        local first, second = a:matmul(b):to("cpu"), a:matmul(b):to("cpu")
        kiln.set_float32_matmul_precision("highest")
        local e = max_error(first, second, false)
        record("gemm precision", e, 0, what, "")
      end)
      kiln.set_float32_matmul_precision("highest")
      if not ok then error(err, 0) end
    end)
  end
  -- the setting is checked before anything reaches the device
  guarded("gemm precision", "a bad precision is an error naming the three", function()
    local ok, err = pcall(kiln.set_float32_matmul_precision, "fast")
    local fine = not ok and tostring(err):find('"highest"', 1, true) and kiln.get_float32_matmul_precision() == "highest"
    record("gemm precision", fine and 0 or math.huge, 0, "a bad precision is an error naming the three", tostring(err))
  end)
end

-- ---- the table ----

local lines = {}
local function out(s) lines[#lines + 1] = s print(s) end
out(string.format("kiln %s, ops on %s against the cpu%s", kiln.version, DEV,
                  os.getenv("KILN_CUDA_POISON") == "1" and " (fresh device blocks poisoned)" or ""))
out(string.format("%-20s %6s %12s %10s  %-6s %s", "op", "cases", "max error", "tolerance", "result", "worst case"))
for _, name in ipairs(order) do
  local r = rows[name]
  out(string.format("%-20s %6d %12.3g %10.3g  %-6s %s", name, r.cases, r.err, r.tol,
                    r.failed == 0 and "pass" or ("FAIL " .. r.failed), r.worst))
end
local missing = {}
for name in pairs(op_number) do
  if ON_GPU and kiln.cuda.has_kernel(name) and not rows[name] then missing[#missing + 1] = name end
end
table.sort(missing)
if #missing > 0 then out("ops with a CUDA kernel but no case here: " .. table.concat(missing, ", ")) end
for _, e in ipairs(extras) do out(e) end
out(string.format("%d failed cases", failures))

local dir = os.getenv("OUT")
local base = os.getenv("KILN_GPU_OPS_OUT") or "gpu_ops"   -- run.sh's second, synchronous pass writes ops_sync.*
if dir and dir ~= "" then
  local f = io.open(dir .. "/" .. base .. ".txt", "w")
  if f then f:write(table.concat(lines, "\n"), "\n") f:close() end
  local j = io.open(dir .. "/" .. base .. ".jsonl", "w")
  if j then
    for _, name in ipairs(order) do
      local r = rows[name]
      j:write(string.format('{"op":"%s","cases":%d,"failed":%d,"max_error":%s,"tolerance":%g,"device":"%s"}\n', name,
                            r.cases, r.failed, r.err == math.huge and '"inf"' or string.format("%.6g", r.err), r.tol, DEV))
    end
    j:close()
  end
end
os.exit(failures == 0 and 0 or 1)
