-- What kiln runs on: the CPU's features against /proc/cpuinfo, and the BLAS core kiln loads:
-- never generic on a CPU with AVX2, whatever OpenBLAS's own detection says.
local kiln = require "kiln"
local H = require "helpers"

local function cpuinfo()
  local f = io.open("/proc/cpuinfo")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  local flags = {}
  for flag in (text:match("\nflags%s*:%s*([^\n]*)") or ""):gmatch("%S+") do flags[flag] = true end
  return {flags = flags, family = tonumber(text:match("cpu family%s*:%s*(%d+)")),
          model = tonumber(text:match("\nmodel%s*:%s*(%d+)"))}
end

-- OpenBLAS's cores whose kernels use AVX2 or AVX-512
local avx2_cores = {Haswell = true, Zen = true, SkylakeX = true, Cooperlake = true, SapphireRapids = true}

-- The core kiln should name for a CPU with these /proc/cpuinfo flags.
local function best_core(flags, vendor)
  if flags.avx512f and flags.avx512bw and flags.avx512vl and flags.avx512dq and flags.avx512cd then
    return flags.avx512_bf16 and "Cooperlake" or "SkylakeX"
  end
  return vendor == "AuthenticAMD" and "Zen" or "Haswell"
end

-- kiln -e code in a fresh process, with the environment changed by `env` (a shell prefix).
local function run(env, code)
  local exe = H.kiln_exe()
  local log = os.tmpname()
  local out = H.capture(string.format("{ %s %s -e '%s' 2> %s; }", env, exe, code, log))
  local f = assert(io.open(log))
  local err = f:read("*a")
  f:close()
  os.remove(log)
  return out, err
end

-- A product the BLAS computes, printed for comparison with a loop in this process.
local product = "local a = kiln.arange(1, 13, {dtype = \"f64\"}):view(3, 4) " ..
                "local b = kiln.arange(1, 9, {dtype = \"f64\"}):view(4, 2) " ..
                "local i = kiln.info().blas print(i.state, i.core) print(table.concat(a:matmul(b):view(-1):totable(), \" \"))"

local function expected_product()
  local r = {}
  for i = 0, 2 do
    for j = 0, 1 do
      local s = 0
      for k = 0, 3 do s = s + (i * 4 + k + 1) * (k * 2 + j + 1) end
      r[#r + 1] = string.format("%g", s)
    end
  end
  return table.concat(r, " ")
end

describe("kiln.info", function()
  local info = kiln.info()

  it("reads the CPU's features as Linux does", function()
    local ci = cpuinfo()
    if not ci or next(ci.flags) == nil or not jit.arch:match("x") then pending("no x86 /proc/cpuinfo") return end
    assert.are.equal(ci.flags.abm and 1 or 0, kiln.C.kiln_cpu_has("lzcnt"))   -- Linux says abm
    for _, f in ipairs{"popcnt", "bmi1", "bmi2", "movbe", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
                       "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"} do
      assert.are.equal(ci.flags[f] and 1 or 0, kiln.C.kiln_cpu_has(f), f)
    end
    local listed = {}
    for _, f in ipairs(info.cpu.features) do listed[f] = true end
    assert.is_true(listed.sse2)
    assert.are.equal(ci.flags.avx2 == true, listed.avx2 == true)
    assert.are.equal(ci.family, info.cpu.family)
    assert.are.equal(ci.model, info.cpu.model)
    assert.are.equal(0, kiln.C.kiln_cpu_has("avx"  .. "2x"))   -- a prefix of no feature
    assert.are.equal(0, kiln.C.kiln_cpu_has(""))
  end)

  it("names the BLAS, its core and its state", function()
    assert.matches("^OpenBLAS", info.blas.name)
    assert.truthy(info.blas.name:find(info.blas.core, 1, true), info.blas.name)
    assert.truthy(({detected = 1, corrected = 1, from_env = 1, generic = 1})[info.blas.state], info.blas.state)
    assert.are.equal(kiln.get_num_threads(), info.threads)
  end)

  it("says what computes f32 products: kiln's kernel at the avx512 and avx2 levels, KILN_SGEMM overriding", function()
    local env, level = os.getenv("KILN_SGEMM"), info.cpu.level
    if env == "blas" or level == "baseline" then assert.are.equal("blas", info.blas.f32_gemm)
    elseif level == "avx512" or level == "avx2" then assert.are.equal("kiln", info.blas.f32_gemm) end   -- native: as -march made it
    if not H.kiln_exe() then return end
    local out = run("KILN_SGEMM=blas", "print(kiln.info().blas.f32_gemm)")
    assert.are.equal("blas", out:match("%S+"))
    out = run("KILN_SGEMM=kiln KILN_CPU_LEVEL=baseline", "print(kiln.info().blas.f32_gemm)")
    if info.cpu.level ~= "native" then assert.are.equal("blas", out:match("%S+")) end   -- the baseline: the BLAS
    if level == "avx512" or level == "avx2" then   -- this CPU runs the avx2 level
      out = run("env -u KILN_SGEMM KILN_CPU_LEVEL=avx2", "print(kiln.info().blas.f32_gemm)")
      assert.are.equal("kiln", out:match("%S+"))
    end
    if info.cpu.level == "avx512" then
      assert.are.equal("kiln", run("env -u KILN_SGEMM", "print(kiln.info().blas.f32_gemm)"):match("%S+"))
      local v = H.capture("env -u KILN_SGEMM " .. H.kiln_exe() .. " --version")
      assert.truthy(v:find("f32 products: kiln's own kernel", 1, true), v)
    end
  end)
end)

describe("the BLAS core", function()
  local ci = cpuinfo()
  local function need_avx2()
    if not H.kiln_exe() then pending("not running under the kiln launcher") return false end
    if not ci or not ci.flags.avx2 or not ci.flags.fma then pending("the CPU has no AVX2") return false end
    return true
  end

  it("is not generic on a CPU with AVX2 when OPENBLAS_CORETYPE is unset", function()
    if not need_avx2() then return end
    local out, err = run("env -u OPENBLAS_CORETYPE", product)
    local state, core = out:match("^(%S+)\t(%S+)")
    assert.truthy(avx2_cores[core], out .. err)
    assert.truthy(state == "detected" or state == "corrected", out)
    assert.are.equal(expected_product(), out:match("\n([^\n]*)\n?$"))
    assert.are.equal("", err)
  end)

  it("is corrected when OpenBLAS picks its generic kernels (KILN_BLAS_TEST_GENERIC)", function()
    if not need_avx2() then return end
    local out, err = run("env -u OPENBLAS_CORETYPE KILN_BLAS_TEST_GENERIC=1", product ..
                         " print(kiln.info().blas.note) print(os.getenv(\"OPENBLAS_CORETYPE\"))")
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    local vendor = kiln.info().cpu.vendor
    assert.are.equal("corrected\t" .. best_core(ci.flags, vendor), lines[1], out .. err)
    assert.are.equal(expected_product(), lines[2])
    assert.matches("generic Prescott kernels", lines[3])
    assert.are.equal(best_core(ci.flags, vendor), lines[4])   -- for the processes kiln starts
    assert.are.equal("", err)
  end)

  it("warns once when a generic core was asked for, and keeps it", function()
    if not need_avx2() then return end
    local out, err = run("OPENBLAS_CORETYPE=Prescott", product .. " package.loaded.kiln = nil require \"kiln\"")
    assert.are.equal("generic\tPrescott", out:match("^[^\n]*"))
    assert.are.equal(expected_product(), out:match("\n([^\n]*)\n?$"))
    local _, count = err:gsub("kiln: warning: OpenBLAS runs its generic Prescott kernels because OPENBLAS_CORETYPE=Prescott", "")
    assert.are.equal(1, count, err)
  end)

  it("falls back to kiln's plain loops, with a warning, when OpenBLAS cannot be loaded", function()
    if not H.kiln_exe() then pending("not running under the kiln launcher") return end
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir " .. dir .. " && : > " .. dir .. "/libopenblas.so.0 && : > " .. dir .. "/libopenblas.so") == 0)
    local out, err = run("LD_LIBRARY_PATH=" .. dir .. ":$LD_LIBRARY_PATH", product)
    os.execute("rm -r " .. dir)
    assert.are.equal("missing\tnone", out:match("^[^\n]*"), out .. err)
    assert.are.equal(expected_product(), out:match("\n([^\n]*)\n?$"))
    assert.matches("kiln: warning: OpenBLAS could not be loaded", err)
  end)

  it("starts no thread of OpenBLAS's own, and leaves OPENBLAS_NUM_THREADS as it found it", function()
    -- a process with a pool of one thread, after a product: the main thread alone (OpenBLAS
    -- would start one server thread per core but one unless told 1 when it loads)
    local code = "kiln.set_num_threads(1) kiln.ones(64, 64):matmul(kiln.ones(64, 64)) " ..
                 "local ffi = require \"ffi\" ffi.cdef \"int getpid(void);\" " ..
                 "local n = 0 for _ in io.popen(\"ls /proc/\" .. ffi.C.getpid() .. \"/task\"):lines() do n = n + 1 end " ..
                 "print(n, os.getenv(\"OPENBLAS_NUM_THREADS\"))"
    local out = run("env -u OPENBLAS_NUM_THREADS", code)
    assert.equal("1\tnil\n", out)
    out = run("OPENBLAS_NUM_THREADS=3", code)
    assert.truthy(out:match("\t3\n$"), out)
  end)

  it("is reported by kiln --version", function()
    if not H.kiln_exe() then pending("not running under the kiln launcher") return end
    local out = H.capture("env -u OPENBLAS_CORETYPE " .. H.kiln_exe() .. " --version")
    assert.matches("\ncpu: ", out)
    assert.matches("\ncpu features: [^\n]*sse2", out)
    assert.matches("\nblas: OpenBLAS [^\n]*, core %a+", out)
  end)
end)

describe("the CPU kernels' level", function()
  local ci = cpuinfo()
  local flags = ci and ci.flags or {}
  -- The highest level this CPU runs, from /proc/cpuinfo's flags (docs/cpu.md).
  local function best_level()
    local v3 = flags.avx2 and flags.avx and flags.fma and flags.f16c and flags.bmi1 and flags.bmi2 and flags.abm
               and flags.movbe
    if v3 and flags.avx512f and flags.avx512bw and flags.avx512cd and flags.avx512dq and flags.avx512vl then
      return "avx512"
    end
    return v3 and "avx2" or "baseline"
  end
  local runs = {baseline = true, avx2 = best_level() ~= "baseline", avx512 = best_level() == "avx512"}
  -- the three levels of a default x86-64 build (a KILN_NATIVE build has one, native)
  local function levels_built()
    if not jit.arch:match("x64") then pending("not an x86-64") return false end
    if kiln.info().cpu.level == "native" then pending("a KILN_NATIVE build: one level, native") return false end
    return true
  end
  -- a small network's loss and gradient norm, printed to 9 digits for comparison between levels
  local step = "kiln.manual_seed(7) local m = kiln.nn.Sequential(kiln.nn.Linear(37, 29), kiln.nn.Tanh(), " ..
               "kiln.nn.Linear(29, 5)) local x = kiln.randn(19, 37) local y = kiln.randint(1, 6, {19}) " ..
               "local loss = kiln.F.cross_entropy(m(x), y) loss:backward() " ..
               "local g = 0 for _, p in ipairs(m:parameters()) do g = g + p.grad:pow(2):sum():item() end " ..
               "print(kiln.info().cpu.level, string.format(\"%.9g %.9g\", loss:item(), g))"

  it("is the highest the CPU runs, or the one KILN_CPU_LEVEL names", function()
    if not levels_built() then return end
    if not ci then pending("no /proc/cpuinfo") return end
    local want = os.getenv("KILN_CPU_LEVEL")
    assert.are.equal(want and want ~= "" and want or best_level(), kiln.info().cpu.level)
  end)

  it("is chosen with KILN_CPU_LEVEL, and gives the same results at every level within f32 rounding", function()
    if not H.kiln_exe() then pending("not running under the kiln launcher") return end
    if not levels_built() then return end
    local ref
    for _, level in ipairs{"baseline", "avx2", "avx512"} do
      if runs[level] then
        local out, err = run("KILN_CPU_LEVEL=" .. level, step)
        local got, loss, g = out:match("^(%S+)\t(%S+) (%S+)")
        assert.are.equal(level, got, out .. err)
        loss, g = tonumber(loss), tonumber(g)
        ref = ref or {loss, g}
        assert.is_true(math.abs(loss - ref[1]) <= 1e-5 * math.abs(ref[1]), level .. ": " .. out)
        assert.is_true(math.abs(g - ref[2]) <= 1e-4 * math.abs(ref[2]), level .. ": " .. out)
        local version = H.capture("KILN_CPU_LEVEL=" .. level .. " " .. H.kiln_exe() .. " --version")
        assert.matches("\ncpu level: " .. level .. "\n", version)
      end
    end
  end)

  it("draws the same random numbers at every level, bit for bit", function()
    if not H.kiln_exe() then pending("not running under the kiln launcher") return end
    if not levels_built() then return end
    if not runs.avx2 then pending("this CPU runs only the baseline level: nothing to compare it with") return end
    -- normal's mean + std * draw is one rounding at every level (the baseline has no FMA)
    local draw = "kiln.manual_seed(11) local t = {} " ..
                 "for _, d in ipairs{\"f64\", \"f32\"} do " ..
                 "for _, v in ipairs(kiln.empty({300}, {dtype = d}):normal_(0.3, 2.5):totable()) do " ..
                 "t[#t + 1] = string.format(\"%a\", v) end " ..
                 "for _, v in ipairs(kiln.rand({300}, {dtype = d}):totable()) do t[#t + 1] = string.format(\"%a\", v) end end " ..
                 "print(table.concat(t, \" \"))"
    local ref
    for _, level in ipairs{"avx512", "avx2", "baseline"} do
      if runs[level] then
        local out, err = run("KILN_CPU_LEVEL=" .. level, draw)
        assert.is_true(#out > 1000, level .. ": " .. out .. err)
        ref = ref or out
        assert.are.equal(ref, out, level)
      end
    end
  end)

  it("refuses a level the CPU lacks or the build does not have, naming it", function()
    if not H.kiln_exe() then pending("not running under the kiln launcher") return end
    if not levels_built() then return end
    local out, err = run("KILN_CPU_LEVEL=avx1024", "print(kiln.info().cpu.level)")
    assert.are.equal("", out)
    assert.matches("KILN_CPU_LEVEL=avx1024 is not a level of this build %(avx512, avx2, baseline%)", err)
    if not runs.avx512 then
      out, err = run("KILN_CPU_LEVEL=avx512", "print(kiln.info().cpu.level)")
      assert.are.equal("", out)
      assert.matches("KILN_CPU_LEVEL=avx512: this CPU lacks avx512f", err)
    end
    local version = H.capture("KILN_CPU_LEVEL=avx1024 " .. H.kiln_exe() .. " --version")
    assert.matches("\ncpu level: " .. best_level() .. "\ncpu level note: KILN_CPU_LEVEL=avx1024", version)
  end)
end)
