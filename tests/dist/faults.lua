-- tests/dist/faults.lua [KILN]: a 2-rank job in which one rank is killed, raises an error, never
-- joins, stops coming to collectives, or enters a different collective. Each time the whole job
-- must end within the deadline (3 s here) plus 5 s, non-zero, with a message that names the
-- failed rank, and, where a collective was waiting, the collective.
local kiln_exe = arg[1] or "build/bin/kiln"
local here = arg[0]:match("^(.*)/") or "."
local deadline = 3
local cases = {
  {"killed", "rank 1 failed: killed by signal 9"},
  {"lua_error", "rank 1 failed: .*a deliberate failure in step 2"},
  {"never_joins", "did not all start within 3 s %(a rank never joined%)"},
  {"absent", "all_reduce %(mean%) of f32 %[%d+%] on group world: rank 1 had not arrived after 3 s"},
  {"other_collective", "rank %d entered [%w_ ]+ .-instead"},
}
local function now()
  local f = io.popen("date +%s.%N")
  local t = tonumber(f:read("*l"))
  f:close()
  return t
end
local failures = 0
for _, c in ipairs(cases) do
  local out = os.tmpname()
  local t0 = now()
  local cmd = string.format("%s launch -n 2 --timeout %d %s/fault_case.lua %s > %s 2>&1; echo $? >> %s",
                            kiln_exe, deadline, here, c[1], out, out)
  os.execute(cmd)
  local elapsed = now() - t0
  local f = io.open(out)
  local text = f:read("*a")
  f:close()
  os.remove(out)
  local code = tonumber(text:match("(%d+)%s*$"))
  local ok = code ~= 0 and elapsed < deadline + 5 + 2 and text:find(c[2]) ~= nil
  -- the launcher's own summary names the failed rank
  ok = ok and text:find("kiln launch: rank %d failed") ~= nil
  print(string.format("%-17s exit %s after %.1f s: %s", c[1], tostring(code), elapsed, ok and "ok" or "FAILED"))
  if not ok then
    failures = failures + 1
    io.stderr:write(text, "\n")
  end
end
if failures > 0 then error(failures .. " fault case(s) did not end as they must") end
