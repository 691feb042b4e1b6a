-- tests/dist/deterministic.lua [KILN]: DataParallel's deterministic mode reaches bitwise the same
-- parameters at 1, 2 and 4 ranks from the same global batches; and a checkpoint written at 2 ranks
-- resumes at 1 and at 4 ranks to the same bits as the run that never stopped.
local kiln_exe = arg[1] or "build/bin/kiln"
local here = arg[0]:match("^(.*)/") or "."
local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. dir) == 0 or true)
local function run(n, out, from, to, resume)
  local cmd = string.format("%s launch -n %d %s/deterministic_run.lua %s/%s %d %d %s", kiln_exe, n, here, dir, out, from, to,
                            resume and (dir .. "/" .. resume .. ".ckpt") or "")
  local ok = os.execute(cmd)
  if ok ~= 0 and ok ~= true then error("failed: " .. cmd) end
end
local function bytes(name)
  local f = assert(io.open(dir .. "/" .. name .. ".safetensors", "rb"))
  local b = f:read("*a")
  f:close()
  return b
end
run(1, "r1", 1, 6)
run(2, "r2", 1, 6)
run(4, "r4", 1, 6)
run(2, "half", 1, 3)
run(1, "resumed1", 4, 6, "half")
run(4, "resumed4", 4, 6, "half")
local want = bytes("r1")
local failures = 0
for _, name in ipairs{"r2", "r4", "resumed1", "resumed4"} do
  local same = bytes(name) == want
  print(string.format("%-9s %s", name, same and "bitwise equal to 1 rank" or "DIFFERS"))
  if not same then failures = failures + 1 end
end
-- the usual mode, by contrast, adds in an order that depends on the rank count: its bits differ
-- (which shows that the comparison above can fail)
local saved = kiln_exe
kiln_exe = "KILN_TEST_PLAIN_DP=1 " .. saved
run(1, "plain1", 1, 6)
run(4, "plain4", 1, 6)
kiln_exe = saved
local differs = bytes("plain1") ~= bytes("plain4")
print(string.format("usual mode, 1 vs 4 ranks: %s", differs and "bits differ" or "equal"))
os.execute("rm -rf " .. dir)
if not differs then error("the usual mode gave the same bits at 1 and 4 ranks: the check cannot tell") end
if failures > 0 then error(failures .. " run(s) differ from the 1-rank run") end
