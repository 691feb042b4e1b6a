-- tools/isa_check.lua: the instructions of each level of kiln's CPU kernels stay within that level.
-- usage: luajit tools/isa_check.lua BUILD_DIR [SOURCE_DIR]   (exit 1 and one line per object that strays)
--
-- The kernels of runtime/src/cpu are compiled once per level (docs/cpu.md) and libkiln runs the
-- level the CPU has: an AVX2 instruction in the baseline copy, or an AVX-512 one in the avx2 copy,
-- would stop a CPU without it on an illegal instruction. Everything else in libkiln is compiled
-- for the compiler's default x86-64 and is held to the baseline's rule. objdump disassembles
-- each object; a rule names what its level may not contain. A function written with
-- __attribute__((target("..."))) in its source (the bf16 kernels' AVX512-BF16 paths) is called only
-- after its file has checked the CPU (kiln_cpu_bf16_native): its instructions are its own business,
-- and are skipped, with their GCC clones (name.constprop.0, ...).

local build = arg[1] or "build"

local function lines(cmd)
  local p = assert(io.popen(cmd))
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

-- No VEX or EVEX instruction (every AVX mnemonic begins with v; gcc emits no other that does),
-- no ymm or zmm register, and none of the BMI, LZCNT and MOVBE instructions of x86-64-v3.
local BMI = {andn = true, bextr = true, blsi = true, blsmsk = true, blsr = true, bzhi = true, mulx = true,
             pdep = true, pext = true, rorx = true, sarx = true, shlx = true, shrx = true, lzcnt = true,
             movbe = true}
local function no_avx(mnemonic, operands)
  if mnemonic:match("^v") then return "AVX instruction " .. mnemonic end
  if operands:match("%%[yz]mm") then return "ymm or zmm register in " .. mnemonic end
  if BMI[mnemonic] then return "x86-64-v3 instruction " .. mnemonic end
end
-- No AVX-512: no zmm register, no mask register, none of the registers 16-31 that only EVEX reaches.
local function no_avx512(mnemonic, operands)
  if operands:match("%%zmm") then return "zmm register in " .. mnemonic end
  if operands:match("%%k[0-7]") then return "mask register in " .. mnemonic end
  if operands:match("%%[xy]mm1[6-9]") or operands:match("%%[xy]mm[23]%d") then return "EVEX register in " .. mnemonic end
end

local checks = {
  {dir = build .. "/CMakeFiles/kiln_cpu_baseline.dir/runtime/src", rule = no_avx, what = "baseline kernels"},
  {dir = build .. "/CMakeFiles/kiln_cpu_avx2.dir/runtime/src", rule = no_avx512, what = "avx2 kernels"},
  {dir = build .. "/CMakeFiles/kiln.dir/runtime/src", rule = no_avx, what = "libkiln outside the kernels"},
}

-- The functions of a source file that carry a target attribute: the name on the line after it.
local source_root = (arg[2] or ".") .. "/runtime/src/"
local function targeted(object)   -- "cpu/bf16_gemm.c.o"
  local names = {}
  local f = io.open(source_root .. object:gsub("%.o$", ""), "r")
  if not f then return names end
  local after = false
  for line in f:lines() do
    if after then
      local name = line:match("([%w_]+)%s*%(")
      if name then names[name] = true end
      after = false
    end
    if line:match("__attribute__%(%(target%(") then after = not line:match("([%w_]+)%s*%(.-%)%s*{") end
  end
  f:close()
  return names
end

local problems, objects = {}, 0
for _, c in ipairs(checks) do
  local list = lines("cd " .. c.dir .. " && ls */*.o 2>/dev/null")
  if #list == 0 then
    problems[#problems + 1] = "no object files under " .. c.dir
  end
  for _, o in ipairs(list) do
    objects = objects + 1
    local first, count = nil, 0
    local skip, current = targeted(o), nil
    for _, l in ipairs(lines("objdump -d --no-show-raw-insn " .. c.dir .. "/" .. o)) do
      -- "0000000000000000 <store_rows.constprop.0>:" starts a function
      local fn = l:match("^%x+ <([^>]+)>:$")
      if fn then current = fn:match("^[^.]+") end
      -- "  4f:	vaddps %ymm1,%ymm0,%ymm0"
      local mnemonic, operands = l:match("^%s+%x+:%s+([%w.]+)%s*(.*)$")
      if mnemonic and not skip[current] then
        local why = c.rule(mnemonic, operands)
        if why then
          count = count + 1
          first = first or why
        end
      end
    end
    if count > 0 then
      problems[#problems + 1] = string.format("%s: %s: %d instructions beyond the level (first: %s)",
                                              c.what, o, count, first)
    end
  end
end

for _, p in ipairs(problems) do print(p) end
io.stderr:write(string.format("isa_check: %d object files, %d problems\n", objects, #problems))
os.exit(#problems == 0 and 0 or 1)
