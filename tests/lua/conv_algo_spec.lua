-- The CPU convolutions' three algorithms (docs/cpu.md): oneDNN's kernels (libkiln_onednn.so) and
-- kiln's Winograd kernels (cpu/winograd.c: 3x3 and 5x5, stride 1, at the avx512 level) against the
-- im2col + GEMM path, all against the f64 result (which the naive loops of nn_ops_spec check),
-- forward and every grad, on shapes that stress the batch parts, strides, padding, dilation,
-- groups, 1x1 and one-channel kernels, channels that fill part of a 16-lane block, planes that
-- fill part of a tile; bitwise equal at 1 and 2 threads; the per-shape choice, benchmark mode,
-- infinities and NaN, and kiln without oneDNN.
local kiln = require "kiln"
local H = require "helpers"
local F = kiln.functional

local onednn = kiln.info().onednn

local cases = {
  {x = {64, 32, 12, 12}, w = {64, 32, 5, 5}, o = {}},                                   -- the benchmark CNN's second conv
  {x = {3, 1, 28, 28}, w = {32, 1, 5, 5}, o = {}},                                      -- one input channel
  {x = {5, 3, 11, 9}, w = {4, 3, 3, 3}, o = {stride = 2, padding = 1}},
  {x = {18, 4, 10, 10}, w = {6, 2, 3, 3}, o = {groups = 2, padding = 2, dilation = 2}}, -- parts of 1 and 2 images
  {x = {2, 8, 7, 7}, w = {8, 8, 1, 1}, o = {}},                                         -- 1x1
  {x = {4, 6, 9, 8}, w = {6, 1, 3, 3}, o = {groups = 6, padding = 1}},                  -- depthwise
  {x = {2, 3, 11, 11}, w = {4, 3, 4, 4}, o = {stride = 3}},                             -- a last row no output reads
  {x = {3, 2, 19, 19}, w = {3, 2, 4, 4}, o = {}},   -- bf16 columns by permutes: rows of 16, inputs over 32 values apart
  {x = {2, 3, 10, 6}, w = {2, 3, 3, 3}, o = {}},    -- and rows of 4, 8 rows to a permute
  {x = {18, 20, 9, 7}, w = {24, 20, 3, 3}, o = {padding = 1}},   -- Winograd F(4x4, 3x3): part tiles, part blocks
  {x = {3, 17, 11, 10}, w = {33, 17, 5, 5}, o = {padding = 2}},  -- F(2x2, 5x5), odd sides; parts of 0 and 1 image
  {x = {2, 130, 5, 3}, w = {70, 130, 3, 3}, o = {padding = 2}},  -- a padding past the kernel's half, 3 panels of O
}
-- Winograd's kernels are built at the avx512 level (and in a KILN_NATIVE build on a CPU with AVX-512)
local cpu = kiln.info().cpu
local winograd_here = cpu.level == "avx512" or (cpu.level == "native" and (","  .. table.concat(cpu.features, ",") .. ","):find(",avx512f,", 1, true) ~= nil)

-- y = conv(x, w, b) and the grads of sum(y * g), with the algorithm set, in dtype.
local function run(c, algo, dtype, seed, prep)
  kiln.set_conv_algorithm(algo)
  kiln.manual_seed(seed or 1)
  prep = prep or function(t) return t:to(dtype) end
  local x = prep(kiln.randn(table.unpack(c.x))):requires_grad_()
  local w = prep(kiln.randn(table.unpack(c.w))):requires_grad_()
  local b = prep(kiln.randn(c.w[1])):requires_grad_()
  local y = F.conv2d(x, w, b, c.o)
  local g = prep(kiln.randn(table.unpack(H.shape(y))))
  local loss = (y * g):sum()
  loss:backward()
  kiln.set_conv_algorithm("auto")
  return {y = y:detach(), gx = x.grad, gw = w.grad, gb = b.grad}
end

-- bitwise equal (no NaN here)
local function same(a, b) return a:ne(b):sum():item() == 0 end

-- the largest difference, relative to the largest magnitude of ref
local function rel_err(a, ref)
  local r = ref:to("f64")
  return (a:to("f64") - r):abs():max():item() / math.max(r:abs():max():item(), 1e-30)
end

describe("CPU convolution algorithms", function()
  after_each(function() kiln.set_conv_algorithm("auto") kiln.set_conv_benchmark(false) end)

  it("loads oneDNN when libkiln_onednn.so was built", function()
    local built = io.open((H.kiln_exe():gsub("bin/kiln$", "lib/libkiln_onednn.so")))
    if not built then return pending("libkiln_onednn.so not built (no libdnnl-dev)") end
    built:close()
    assert.is_string(onednn.name, onednn.note)
    assert.truthy(onednn.name:match("^oneDNN %d+%.%d+"))
  end)

  for i, c in ipairs(cases) do
    it(string.format("agree with f64, forward and grads: case %d (x %s, w %s)", i, table.concat(c.x, "x"),
                     table.concat(c.w, "x")), function()
      local ref = run(c, "im2col", "f64")
      for _, algo in ipairs{"im2col", "onednn", "winograd"} do
        local got = run(c, algo, "f32")
        for _, k in ipairs{"y", "gx", "gw", "gb"} do
          local e = rel_err(got[k], ref[k])
          assert(e < 2e-5, string.format("%s %s: relative error %.3g", algo, k, e))
        end
      end
    end)
  end

  -- bf16 (what autocast's conv2d runs): the three paths against f64 on the same bf16-rounded inputs
  -- (Winograd in f32 arithmetic, widening its inputs and rounding its outputs); each result is
  -- rounded to bf16 once (2^-8 relative), the grad of the weights summed in f32
  for i, c in ipairs(cases) do
    it(string.format("agree with f64 in bf16: case %d", i), function()
      local function rounded(dtype)
        return function(t) return t:to("bf16"):to(dtype) end
      end
      local ref = run(c, "im2col", "f64", 1, rounded("f64"))
      for _, algo in ipairs{"im2col", "onednn", "winograd"} do
        local got = run(c, algo, "bf16", 1, rounded("bf16"))
        for _, k in ipairs{"y", "gx", "gw", "gb"} do
          local e = rel_err(got[k], ref[k])
          assert(e < 1e-2, string.format("%s %s: relative error %.3g", algo, k, e))
        end
      end
    end)
  end

  it("chooses Winograd where it takes the shape, oneDNN where it has a kernel, im2col where it has none or measured slower", function()
    if not onednn.name then return pending(onednn.note) end
    kiln.conv_choices(true)
    run(cases[1], "auto", "f32")
    run(cases[3], "auto", "f32")
    run(cases[7], "auto", "f32")
    run(cases[2], "auto", "f32")
    run(cases[2], "auto", "bf16")
    run(cases[1], "auto", "bf16")
    local lines = kiln.conv_choices()
    local function find(pat)
      for _, l in ipairs(lines) do if l:find(pat, 1, true) then return l end end
    end
    local five = winograd_here and ": winograd$" or ": onednn "   -- 5x5, stride 1, 32 channels
    assert.truthy(find("forward f32 x [64,32,12,12] w [64,32,5,5]"):match(five), table.concat(lines, "\n"))
    assert.truthy(find("backward input weight f32 x [64,32,12,12]"):match(five), table.concat(lines, "\n"))
    assert.truthy(find("forward f32 x [5,3,11,9]"):match(": onednn "), table.concat(lines, "\n"))   -- stride 2
    assert.truthy(find("forward f32 x [2,3,11,11]"):match(": im2col$"), table.concat(lines, "\n"))
    -- a one-channel input's grad: im2col (measured about twice as fast); its forward: oneDNN
    assert.truthy(find("forward f32 x [3,1,28,28]"):match(": onednn "), table.concat(lines, "\n"))
    assert.truthy(find("backward input weight f32 x [3,1,28,28]"):match(": im2col$"), table.concat(lines, "\n"))
    -- in bf16 a one-channel input goes to im2col for every pass (measured faster forward too)
    assert.truthy(find("forward bf16 x [3,1,28,28]"):match(": im2col$"), table.concat(lines, "\n"))
    assert.truthy(find("backward input weight bf16 x [3,1,28,28]"):match(": im2col$"), table.concat(lines, "\n"))
    -- bf16 takes Winograd too (f32 arithmetic between its widened inputs and rounded outputs) where
    -- the CPU's bf16 products are no faster than f32's (kiln.info says which) and it has no AMX;
    -- elsewhere oneDNN's bf16 kernels (with KILN_BF16_EMULATE set, the string does not say)
    local products, amx = kiln.info().blas.bf16_products, false
    for _, f in ipairs(cpu.features) do amx = amx or f == "amx_bf16" end
    local rule
    if products:match("^matrix products by f32") or products:match("no AVX512%-BF16") then rule = not amx
    elseif products:match("^vdpbf16ps %(AVX512%-BF16%) ") then rule = false end
    if rule ~= nil then
      local five_bf16 = (winograd_here and rule) and ": winograd$" or ": onednn "
      assert.truthy(find("forward bf16 x [64,32,12,12] w [64,32,5,5]"):match(five_bf16), table.concat(lines, "\n"))
      assert.truthy(find("backward input weight bf16 x [64,32,12,12]"):match(five_bf16), table.concat(lines, "\n"))
    end
  end)

  it("gives the same bits at 1 and 2 threads", function()
    if not onednn.name then return pending(onednn.note) end
    local threads = kiln.get_num_threads()
    for _, r in ipairs{{1, "onednn"}, {4, "onednn"}, {1, "winograd"}, {10, "winograd"}, {11, "winograd"}} do
      local i, algo = r[1], r[2]
      kiln.set_num_threads(1)
      local one = run(cases[i], algo, "f32")
      kiln.set_num_threads(2)
      local two = run(cases[i], algo, "f32")
      for _, k in ipairs{"y", "gx", "gw", "gb"} do
        assert.is_true(same(one[k], two[k]), string.format("case %d by %s: %s differs between 1 and 2 threads", i, algo, k))
      end
    end
    kiln.set_num_threads(threads)
  end)

  -- benchmark mode on a shape Winograd does not take (stride 2) and on one it does
  for _, b in ipairs{{case = 3, algos = {"im2col", "onednn"}, times = "%(timed: im2col [%d.]+ ms, onednn [%d.]+ ms[^)]*%)$"},
                     {case = 10, algos = {"im2col", "onednn", "winograd"},
                      times = "%(timed: im2col [%d.]+ ms, onednn [%d.]+ ms[^)]*, winograd [%d.]+ ms%)$"}} do
    it(string.format("times %s on a shape's first call in benchmark mode, and keeps the fastest's result",
                     table.concat(b.algos, ", ")), function()
      if not onednn.name then return pending(onednn.note) end
      if #b.algos == 3 and not winograd_here then return pending("Winograd runs at the avx512 level only") end
      local c = cases[b.case]
      local by = {}
      for _, algo in ipairs(b.algos) do by[algo] = run(c, algo, "f32") end
      if by.winograd then assert.is_false(same(by.winograd.y, by.onednn.y)) end   -- a different computation: other bits
      kiln.conv_choices(true)
      kiln.set_conv_benchmark(true)
      local first = run(c, "auto", "f32")
      local again = run(c, "auto", "f32")
      local lines = kiln.conv_choices()
      assert.equal(2, #lines, table.concat(lines, "\n"))
      for _, l in ipairs(lines) do
        local algo = l:match(": (%w+)")
        assert.truthy(l:match(b.times), l)
        local key = l:match("^forward") and "y" or "gw"
        assert.is_true(same(first[key], by[algo][key]), l)
        assert.is_true(same(again[key], by[algo][key]), l)
      end
    end)
  end

  it("leaves an input or weights with an infinity or a NaN to the other algorithms, whose results it gives", function()
    if not winograd_here then return pending("Winograd runs at the avx512 level only") end
    -- a tile's transforms would spread a NaN to the tile's every output and make inf - inf a NaN
    local c = cases[1]
    local function bits(t)   -- NaN as a string, so that positions compare
      local out = {}
      for i, v in ipairs(t:contiguous():reshape(-1):totable()) do out[i] = v ~= v and "nan" or v end
      return out
    end
    for _, dtype in ipairs{"f32", "bf16"} do
      for _, which in ipairs{"x", "w"} do
        local function prep(t)
          if (which == "x" and t:dim() == 4 and t:size(2) == 32) or (which == "w" and t:dim() == 4 and t:size(1) == 64) then
            local d = t:contiguous():reshape(-1):totable()
            d[5] = 1 / 0
            d[700] = 0 / 0
            t = kiln.tensor(d, {dtype = "f32"}):view(t:size())
          end
          return t:to(dtype)
        end
        local auto = run(c, "winograd", dtype, 1, prep)
        local other = run(c, "onednn", dtype, 1, prep)
        assert.same(bits(other.y), bits(auto.y), dtype .. " " .. which)
        assert.is_true(auto.y:isinf():any():item() or which == "w", dtype .. " " .. which)
      end
    end
  end)

  it("refuses an algorithm it does not know, naming the four", function()
    local ok, err = pcall(kiln.set_conv_algorithm, "fft")
    assert.is_false(ok)
    assert.truthy(tostring(err):find('"fft" is not an algorithm: "auto", "im2col", "onednn" or "winograd"', 1, true), err)
    assert.equal("auto", kiln.conv_algorithm())
  end)

  it("convolves by im2col, saying why, when oneDNN cannot be loaded", function()
    local code = "local F = kiln.functional kiln.manual_seed(3) " ..
                 "local y = F.conv2d(kiln.randn(2, 3, 6, 6), kiln.randn(4, 3, 3, 3)) " ..
                 "print(kiln.info().onednn.name) print(kiln.info().onednn.note) print(kiln.conv_choices()[1]) " ..
                 "print(string.format(\"%.6f\", y:sum():item()))"
    local out = H.capture(string.format("KILN_ONEDNN_LIB=/nonexistent/libkiln_onednn.so %s -e '%s' 2>&1", H.kiln_exe(), code))
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal("nil", lines[1], out)
    assert.truthy(lines[2]:find("oneDNN not loaded", 1, true), out)
    assert.truthy(lines[2]:find("/nonexistent/libkiln_onednn.so", 1, true), out)
    assert.is_nil(lines[3]:find("onednn", 1, true), out)
    kiln.manual_seed(3)
    kiln.set_conv_algorithm("im2col")
    local y = F.conv2d(kiln.randn(2, 3, 6, 6), kiln.randn(4, 3, 3, 3))
    kiln.set_conv_algorithm("auto")
    assert.equal(string.format("%.6f", y:sum():item()), lines[4], out)
  end)

  it("convolves by im2col, saying why, when KILN_ONEDNN_LIB names another library", function()
    local lib = "/usr/lib/x86_64-linux-gnu/libz.so.1"   -- zlib: kiln's own dependency, always there
    local f = io.open(lib)
    if not f then return pending(lib .. " not found") end
    f:close()
    local code = "print(kiln.info().onednn.name) print(kiln.info().onednn.note) " ..
                 "print(kiln.functional.conv2d(kiln.ones(1, 1, 3, 3), kiln.ones(1, 1, 3, 3)):item())"
    local out = H.capture(string.format("KILN_ONEDNN_LIB=%s %s -e '%s' 2>&1", lib, H.kiln_exe(), code))
    assert.equal("nil\n" .. lib .. " is not kiln's oneDNN library (version 3)\n9\n", out)
  end)
end)
