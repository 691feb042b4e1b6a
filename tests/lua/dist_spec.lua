-- kiln.dist in a process no launcher started (the collectives themselves run under tests/dist/,
-- through kiln launch): every call says how to launch; the launcher's command line is checked.
local kiln = require "kiln"
local launch = require "kiln.launch"

describe("kiln.dist outside a launcher", function()
  it("says how to launch, from init and from every collective", function()
    assert.is_false(kiln.dist.launched())
    for _, f in ipairs{function() kiln.dist.init() end, function() kiln.dist.all_reduce(kiln.ones(2)) end,
                       function() kiln.dist.rank() end, function() kiln.dist.barrier() end,
                       function() kiln.dist.DataParallel(kiln.nn.Linear(2, 2)) end} do
      local ok, e = pcall(f)
      assert.is_false(ok)
      assert.truthy(tostring(e):find("kiln launch -n 2 script.lua", 1, true), tostring(e))
    end
    assert.is_false(kiln.dist.is_initialized())
    assert.are.equal(2, kiln.ones(2):sum():item())   -- the process goes on
  end)

  it("refuses a deadline that is not a number of seconds > 0", function()
    local before = kiln.dist.timeout()
    assert.has_error(function() kiln.dist.set_timeout(0) end)
    assert.has_error(function() kiln.dist.set_timeout("5") end)
    assert.are.equal(before, kiln.dist.timeout())
    kiln.dist.set_timeout(42)
    assert.are.equal(42, kiln.dist.timeout())
    kiln.dist.set_timeout(before)
  end)
end)

describe("kiln.dist's samplers", function()
  it("share out each global batch by index, the same batches for any number of ranks", function()
    local n, B = 103, 12
    local whole = kiln.dist.sampler{batch_size = B, seed = 5, rank = 0, world_size = 1}(3, n):totable()
    assert.are.equal(8 * B, #whole)   -- the 9th global batch (7 samples) is dropped
    local seen = {}
    for _, i in ipairs(whole) do assert.is_nil(seen[i]) seen[i] = true assert.truthy(i >= 1 and i <= n) end
    for _, size in ipairs{2, 3, 4} do
      local per = B / size
      local shares = {}
      for r = 0, size - 1 do shares[r] = kiln.dist.sampler{batch_size = B, seed = 5, rank = r, world_size = size}(3, n):totable() end
      for b = 0, 7 do
        for r = 0, size - 1 do
          for k = 1, per do assert.are.equal(whole[b * B + r * per + k], shares[r][b * per + k]) end
        end
      end
    end
    -- another epoch, another order
    assert.are_not.same(whole, kiln.dist.sampler{batch_size = B, seed = 5, rank = 0, world_size = 1}(4, n):totable())
    assert.has_error(function() kiln.dist.sampler{batch_size = 10, rank = 0, world_size = 4} end,
                     "dist.sampler: the global batch 10 does not split into 4 equal shares")
  end)

  it("shard the test set so that every sample is on exactly one rank", function()
    for _, size in ipairs{1, 2, 3, 7} do
      local count = {}
      for r = 0, size - 1 do
        local first, n = kiln.dist.shard(100, {rank = r, world_size = size})
        for i = first, first + n - 1 do count[i] = (count[i] or 0) + 1 end
      end
      for i = 1, 100 do assert.are.equal(1, count[i]) end
    end
  end)
end)

describe("kiln.dist's scaling model", function()
  local links = {nvlink = {alpha = 1e-6, beta = 1e-9}, infiniband = {alpha = 1e-5, beta = 1e-8}}
  it("times an all-reduce by the alpha-beta model", function()
    -- one node of 4: a ring, 2*3 steps, 2*3/4 of the bytes
    local t, algo = kiln.dist.all_reduce_time(1000, 4, {links = links, gpus_per_node = 8})
    assert.are.equal("ring", algo)
    assert.near(6 * 1e-6 + 1.5 * 1000 * 1e-9, t, 1e-15)
    -- 4 nodes of 2: ring across (the slow link) or the tree (2 inside, log2(4) = 2 levels across)
    local ring = kiln.dist.all_reduce_time(1000, 8, {links = links, gpus_per_node = 2, algorithm = "ring"})
    assert.near(14 * 1e-5 + 2 * 7 / 8 * 1000 * 1e-8, ring, 1e-15)
    local tree = kiln.dist.all_reduce_time(1000, 8, {links = links, gpus_per_node = 2, algorithm = "tree"})
    assert.near((2 * 1e-6 + 1000 * 1e-9) + 4 * 1e-5 + 2 * 1000 * 1e-8 / 2, tree, 1e-15)
    assert.are.equal(0, kiln.dist.all_reduce_time(1000, 1))
  end)

  it("lays buckets out as DataParallel does and overlaps them with backward", function()
    local mb = 2 ^ 20
    local b = kiln.dist.buckets_of({10 * mb, 10 * mb, 10 * mb, 2 * mb}, {bucket_mb = 15, first_bucket_mb = 1})
    assert.are.same({{bytes = 2 * mb, ready = 2 / 32}, {bytes = 20 * mb, ready = 22 / 32}, {bytes = 10 * mb, ready = 1}}, b)
    -- step 0.3 s: forward 0.1, backward 0.2; all-reduces of 0.05 s each (alpha only)
    local slow = {nvlink = {alpha = 0.05 / 6, beta = 0}, infiniband = {alpha = 1, beta = 0}}
    local rows = kiln.dist.simulate{step_s = 0.3, buckets = {{bytes = 1, ready = 0.5}, {bytes = 1, ready = 1}}, gpus = {4},
                                    links = slow}
    -- bucket 1 at 0.2, done 0.25; bucket 2 at 0.3 (end of backward), done 0.35
    assert.near(0.35, rows[1].step_s, 1e-12)
    assert.near(0.3 / 0.35, rows[1].efficiency, 1e-12)
    local jit = kiln.dist.simulate{step_s = 0.3, jitter = 0.1, buckets = {}, gpus = {8}}
    assert.near(0.3 + 0.03 * math.sqrt(2 * math.log(8)), jit[1].step_s, 1e-12)
  end)
end)

describe("kiln launch's summary of a failed job", function()
  local function summary(events)
    local st = {}
    for _, e in ipairs(events) do launch.note_failure(st, e[1], e[2], e[3]) end
    return st.failed, st.reason
  end
  it("keeps a rank's own error over mpirun's MPI_Abort report, whichever comes first", function()
    local err, abort = {1, "x.lua:13: boom", false}, {1, "it ended the job (MPI_Abort)", true}
    assert.same({1, "x.lua:13: boom"}, {summary{abort, err}})
    assert.same({1, "x.lua:13: boom"}, {summary{err, abort}})
    assert.same({1, "it ended the job (MPI_Abort)"}, {summary{abort}})
  end)
  it("otherwise keeps the first failure", function()
    assert.same({0, "y.lua:2: first"}, {summary{{0, "y.lua:2: first", false}, {1, "killed by signal 9", false}}})
    -- another rank's error does not replace an abort's rank
    assert.same({1, "it ended the job (MPI_Abort)"}, {summary{{1, "it ended the job (MPI_Abort)", true}, {0, "z: later", false}}})
  end)
end)

describe("kiln launch's command line", function()
  it("builds mpirun's, with the rank count, oversubscription, the deadline and the script's arguments", function()
    local o = assert(launch.parse{"-n", "4", "--timeout", "30", "train.lua", "--lr", "0.1", "-n", "7"})
    assert.are.same({"--lr", "0.1", "-n", "7"}, o.args)   -- what follows the script is the script's
    local cmd = launch.command(o, "/usr/bin/mpirun")
    assert.truthy(cmd:find("'/usr/bin/mpirun' -np 4 --tag-output --oversubscribe --mca mpi_yield_when_idle 1", 1, true), cmd)
    assert.truthy(cmd:find("'KILN_DIST_TIMEOUT=30'", 1, true), cmd)
    local tail = "'train.lua' '--lr' '0.1' '-n' '7'"
    assert.are.equal(tail, cmd:sub(-#tail))
  end)

  it("names what is wrong in a bad command line", function()
    local cases = {
      {{"train.lua"}, "give the number of ranks with %-n"},
      {{"-n", "zero", "train.lua"}, "%-n needs a number of ranks >= 1"},
      {{"-n", "2"}, "no script given"},
      {{"-n", "2", "--bogus", "train.lua"}, "unknown option %-%-bogus"},
      {{"-n", "2", "--timeout", "-1", "t.lua"}, "%-%-timeout needs a number of seconds > 0"},
    }
    for _, c in ipairs(cases) do
      local o, e = launch.parse(c[1])
      assert.is_nil(o)
      assert.truthy(e:find(c[2]), e)
    end
  end)
end)
