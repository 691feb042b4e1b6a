-- tests/dist/fault_case.lua CASE: one rank of a 2-rank job fails in the way CASE names
-- (tests/dist/faults.lua runs each case and checks how the job ends).
local dist = kiln.dist
local case = arg[1]
if case == "never_joins" and os.getenv("OMPI_COMM_WORLD_RANK") == "1" then os.execute("sleep 60") end
dist.init()
local rank = dist.rank()
local model = kiln.nn.Linear(8, 4)
local dp = dist.DataParallel(model)
for step = 1, 3 do
  if step == 2 and rank == 1 then
    if case == "killed" then os.execute("kill -9 $PPID") os.execute("sleep 60") end
    if case == "lua_error" then error("a deliberate failure in step 2") end
    if case == "absent" then os.execute("sleep 60") end
    if case == "other_collective" then dist.broadcast(kiln.ones(3), 0) end
  end
  local loss = dp(kiln.randn(4, 8)):pow(2):mean()
  loss:backward()
end
print("rank " .. rank .. " finished")
