-- Memory: the runtime's byte counters see every storage, the GC is paced by them so that
-- garbage tensors do not pile up, and free() gives memory back at once.
local kiln = kiln or require "kiln"
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "?.lua;" .. package.path
local H = require "helpers"

local MB = 2 ^ 20
local SIZES = {f32 = 4, f64 = 8, f16 = 2, bf16 = 2, i64 = 8, i32 = 4, u8 = 1, bool = 1}

local function live() return kiln.memory_stats().live_bytes end
-- Collect everything collectable: until a collection frees no tensor memory any more (finalizers
-- run in one pass and may let go of what only a later one frees; an earlier spec's garbage once
-- took more than two).
local function settle()
  collectgarbage("collect")
  for _ = 1, 20 do
    local before = live()
    collectgarbage("collect")
    if live() == before then return end
  end
end

describe("memory accounting", function()
  before_each(settle)

  it("live_bytes grows by numel * element size for every dtype, and falls once collected", function()
    for dtype, size in pairs(SIZES) do
      for _, shape in ipairs({{7}, {100, 30}, {3, 300, 5}}) do     -- small (inline) and large storages
        settle()
        local before = live()
        local t = kiln.empty(shape, {dtype = dtype})
        assert.equal(before + H.numel(shape) * size, live(), dtype .. " " .. table.concat(shape, "x"))
        assert.equal(dtype, t:dtype())
        t = nil
        settle()
        assert.equal(before, live(), dtype .. " after collection")
      end
    end
  end)

  it("views share their storage and add nothing; the storage lives while a view does", function()
    local before = live()
    local t = kiln.zeros(1000, 100)
    local after = live()
    assert.equal(before + 1000 * 100 * 4, after)
    local v = t:narrow(2, 2, 10):t():unsqueeze(1)
    local r = t[3]
    assert.equal(after, live())
    t = nil
    settle()
    assert.equal(after, live())          -- the views keep the storage alive
    assert.equal(0, v:sum():item())
    v, r = nil, nil
    settle()
    assert.equal(before, live())
  end)

  it("counts allocations and frees, and the peak", function()
    local s0 = kiln.memory_stats()
    local t = kiln.empty(1000)
    local s1 = kiln.memory_stats()
    assert.equal(s0.allocs + 1, s1.allocs)
    assert.is_true(s1.peak_bytes >= s1.live_bytes)
    t = nil
    settle()
    assert.equal(s1.frees + 1, kiln.memory_stats().frees)
    local cuda = kiln.memory_stats("cuda")
    assert.equal(0, cuda.live_bytes)
  end)

  it("free() drops live_bytes at once, and collecting the tensor later does not count it twice", function()
    local before = live()
    local t = kiln.ones(512, 1024)            -- 2 MB
    local view = t:narrow(1, 1, 10)
    assert.equal(before + 2 * MB, live())
    t:free()
    assert.equal(before, live())
    view:free()                                -- the storage is already freed: nothing more
    assert.equal(before, live())
    t, view = nil, nil
    settle()
    assert.equal(before, live())
    assert.equal(6, kiln.ones(2, 3):sum():item())
  end)

  it("many large temporaries stay bounded: the byte threshold drives the GC", function()
    local saved = kiln.memory_stats().threshold
    finally(function() kiln.set_gc_threshold(saved) end)
    kiln.set_gc_threshold(32 * MB)
    assert.equal(32 * MB, kiln.memory_stats().threshold)
    settle()
    local before, collections = live(), kiln.memory_stats().collections
    local peak = 0
    local n, each = 200, 8 * MB
    for i = 1, n do
      local t = kiln.empty(2 * MB)             -- 8 MB of f32, dropped at once
      t[1] = i
      peak = math.max(peak, live() - before)
    end
    -- 200 x 8 MB = 1600 MB allocated in all; what is alive at once stays near the threshold
    assert.is_true(peak >= each)
    assert.is_true(peak <= 32 * MB + 4 * each, string.format("peak %.0f MB", peak / MB))
    -- one collection each time more than 32 MB piled up: every 5th tensor, 40 in all
    local ran = kiln.memory_stats().collections - collections
    assert.is_true(ran >= 30 and ran <= 41, "collections: " .. ran)
    settle()
    assert.equal(before, live())
  end)

  it("temporaries of an expression in a loop stay bounded too", function()
    local saved = kiln.memory_stats().threshold
    finally(function() kiln.set_gc_threshold(saved) end)
    kiln.set_gc_threshold(16 * MB)
    local x = kiln.ones(256, 1024)             -- 1 MB
    settle()
    local before = live()
    local peak = 0
    local acc = 0
    for _ = 1, 100 do
      local y = (x * 2 + 1):sqrt()             -- three 1 MB temporaries per step
      acc = acc + y[1][1]
      peak = math.max(peak, live() - before)
    end
    assert.near(100 * math.sqrt(3), acc, 1e-4)
    assert.is_true(peak <= 16 * MB + 8 * MB, string.format("peak %.0f MB", peak / MB))
  end)
end)

describe("an allocation larger than memory", function()
  it("is an error naming the request and the bytes in use, and the process goes on", function()
    local held = kiln.ones(10 * 1024 * 1024)   -- 40 MiB in use at least
    local ok, err = pcall(kiln.empty, 1e14)      -- 400 TB of f32: more than any machine's memory
    assert.is_false(ok)
    assert.matches("empty: out of memory allocating 400000000000000 bytes on cpu %((%d+) bytes in use%)", tostring(err))
    local in_use = tonumber(tostring(err):match("%((%d+) bytes in use%)"))
    assert.is_true(in_use >= 40 * 1024 * 1024, tostring(err))
    -- and a size that cannot even be counted names the sizes
    ok, err = pcall(kiln.empty, 4e9, 4e9, 4e9)
    assert.is_false(ok)
    assert.matches("%[4000000000,4000000000,4000000000%] elements of f32 do not fit in memory", tostring(err))
    -- the process is usable: the tensor held is intact, new ones work
    assert.are.equal(10 * 1024 * 1024, held:sum():item())
    assert.are.equal(6, kiln.ones(2, 3):sum():item())
    held:free()
    kiln.empty_cache()   -- the 40 MiB block leaves the CPU's cache, which the next specs measure
  end)
end)

describe("the CPU's cache of large blocks", function()
  it("keeps a freed block of 32 MiB or more, reuses it for the same size, and empty_cache gives it back", function()
    kiln.empty_cache()
    assert.equal(0, kiln.memory_stats().cached_bytes)
    local small = kiln.empty(1000, 1000)           -- 4 MB: never cached
    small:free()
    assert.equal(0, kiln.memory_stats().cached_bytes)
    local big = kiln.empty(9 * MB)                 -- 36 MiB of f32
    big:fill_(3)
    big:free()
    assert.equal(36 * MB, kiln.memory_stats().cached_bytes)
    local again = kiln.zeros(9 * MB)               -- the same block, zeroed as asked
    assert.equal(0, kiln.memory_stats().cached_bytes)
    assert.equal(0, again:sum():item())
    again:free()
    assert.equal(36 * MB, kiln.memory_stats().cached_bytes)
    kiln.empty_cache()
    assert.equal(0, kiln.memory_stats().cached_bytes)
    assert.is_nil(kiln.memory_stats("cuda").cached_bytes)
  end)
end)
