-- tests/soak/dist_faults.lua [RUNS (200)] [KILN]: by hand, not in CI. Runs the fault cases of
-- tests/dist/faults.lua (a rank killed, a Lua error, a rank that never joins, one that stops coming,
-- ranks in different collectives) RUNS times in turn, at 2 and 4 ranks, each under `timeout`
-- (deadline + 60 s), and counts the runs that ended as they must, those that ended otherwise, and
-- hangs (killed by timeout). One JSON line at the end; exit 1 on any hang or wrong ending.
local runs = tonumber(arg[1] or "200")
local kiln_exe = arg[2] or "build/bin/kiln"
local deadline = 3
local cases = {
  {"killed", "failed: killed by signal 9"},
  {"lua_error", "a deliberate failure in step 2"},
  {"never_joins", "a rank never joined"},
  {"absent", "had not arrived after 3 s"},
  {"other_collective", "entered [%w_ ]+ .-instead"},
}
local ok, wrong, hangs, slowest = 0, 0, 0, 0
local function now() local f = io.popen("date +%s.%N") local t = tonumber(f:read("*l")) f:close() return t end
for i = 1, runs do
  local c = cases[(i - 1) % #cases + 1]
  local n = (math.floor((i - 1) / #cases) % 2 == 0) and 2 or 4
  local out = os.tmpname()
  local t0 = now()
  os.execute(string.format("timeout -s KILL %d %s launch -n %d --timeout %d tests/dist/fault_case.lua %s > %s 2>&1; echo $? >> %s",
                           deadline + 60, kiln_exe, n, deadline, c[1], out, out))
  local dt = now() - t0
  local f = io.open(out)
  local text = f:read("*a")
  f:close()
  os.remove(out)
  local code = tonumber(text:match("(%d+)%s*$"))
  slowest = math.max(slowest, dt)
  if code == 137 and dt >= deadline + 59 then
    hangs = hangs + 1
    print(string.format("run %d (%s, %d ranks): HANG", i, c[1], n))
  elseif code ~= 0 and text:find(c[2]) and text:find("kiln launch: rank %d failed") and dt < deadline + 5 + 2 then
    ok = ok + 1
  else
    wrong = wrong + 1
    print(string.format("run %d (%s, %d ranks): ended otherwise (exit %s, %.1f s)\n%s", i, c[1], n, tostring(code), dt, text))
  end
end
print(string.format('{"soak":"dist_faults","runs":%d,"as_expected":%d,"otherwise":%d,"hangs":%d,"slowest_s":%.1f}',
                    runs, ok, wrong, hangs, slowest))
if hangs > 0 or wrong > 0 then os.exit(1) end
