-- Data: IDX files written here byte by byte (plain and gzip) read back for every type code, and every
-- malformed, truncated or over-long variant an error naming the file; Fashion-MNIST against the bytes
-- of its files; minibatches (each sample once per epoch, seeded orders, the global generator left
-- alone); and kiln.ui's JSON lines and progress output.
local kiln = kiln or require "kiln"
package.path = "./?.lua;" .. package.path
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "?.lua;" .. package.path
local H = require "helpers"
local ffi = require "ffi"
local data, ui = kiln.data, kiln.ui

local SRC = debug.getinfo(1, "S").short_src
local err = H.error_of

local function assert_contains(msg, ...)
  for _, part in ipairs({...}) do
    assert(H.contains(msg, part), string.format("message %q lacks %q", msg, part))
  end
end

-- ---- IDX bytes, written without kiln ----

local function be(v, nbytes)
  local b = {}
  for i = nbytes, 1, -1 do b[i] = v % 256 v = math.floor(v / 256) end
  return string.char(unpack(b))
end

local function float_bytes(ctype, v)
  local n = ffi.sizeof(ctype)
  local x = ffi.new(ctype .. "[1]", v)
  local s = ffi.string(x, n)
  return ffi.abi("le") and s:reverse() or s
end

local encoders = {
  [0x08] = function(v) return be(v, 1) end,
  [0x09] = function(v) return be(v % 256, 1) end,
  [0x0B] = function(v) return be(v % 65536, 2) end,
  [0x0C] = function(v) return be(v % 2 ^ 32, 4) end,
  [0x0D] = function(v) return float_bytes("float", v) end,
  [0x0E] = function(v) return float_bytes("double", v) end,
}

local function idx_bytes(code, sizes, values)
  local parts = {string.char(0, 0, code, #sizes)}
  for _, s in ipairs(sizes) do parts[#parts + 1] = be(s, 4) end
  for _, v in ipairs(values) do parts[#parts + 1] = encoders[code](v) end
  return table.concat(parts)
end

local dir
local function path_of(name) return dir .. "/" .. name end
local function write(name, bytes)
  local f = assert(io.open(path_of(name), "wb"))
  f:write(bytes)
  f:close()
  return path_of(name)
end
-- name.gz next to name, by the gzip program.
local function gzip(name)
  os.execute("gzip -k -f '" .. path_of(name) .. "'")
  local f = assert(io.open(path_of(name) .. ".gz", "rb"), "gzip did not write " .. name .. ".gz")
  local bytes = f:read("*a")
  f:close()
  return path_of(name) .. ".gz", bytes
end

setup(function()
  local p = assert(io.popen("mktemp -d /tmp/kiln-data-spec-XXXXXX"))
  dir = p:read("*l")
  p:close()
  assert(dir and #dir > 0, "mktemp -d failed")
end)

teardown(function()
  if dir and dir:match("^/tmp/kiln%-data%-spec%-") then os.execute("rm -rf '" .. dir .. "'") end
end)

describe("data.read_idx", function()
  local cases = {
    {code = 0x08, dtype = "u8", sizes = {2, 3}, values = {0, 1, 127, 128, 254, 255}},
    {code = 0x09, dtype = "i32", sizes = {5}, values = {-128, -1, 0, 1, 127}},
    {code = 0x0B, dtype = "i32", sizes = {3, 2}, values = {-32768, -1, 0, 1, 32767, 258}},
    {code = 0x0C, dtype = "i32", sizes = {1, 2, 3}, values = {-2147483648, -1, 0, 1, 2147483647, 16909060}},
    {code = 0x0D, dtype = "f32", sizes = {2, 2, 1}, values = {1.5, -0.1, 3e38, 1e-40}},
    {code = 0x0E, dtype = "f64", sizes = {4}, values = {math.pi, -1e300, 5e-324, 0.1}},
  }

  it("reads every type code, plain and gzip-compressed, with its values, shape and dtype", function()
    for _, c in ipairs(cases) do
      local name = string.format("type%02x", c.code)
      local plain = write(name, idx_bytes(c.code, c.sizes, c.values))
      local gz = gzip(name)
      local want = {}
      for i, v in ipairs(c.values) do want[i] = c.dtype == "f32" and tonumber(ffi.new("float", v)) or v end
      for _, path in ipairs({plain, gz}) do
        local t = data.read_idx(path)
        assert.are.equal(c.dtype, t:dtype(), path)
        assert.are.same(c.sizes, {unpack(t:size())}, path)
        assert.is_true(t:is_contiguous())
        assert.tensor_near(t:view(-1), want, 0)
      end
    end
  end)

  it("tells gzip by its magic bytes, not by the file's name", function()
    local bytes = idx_bytes(0x08, {3}, {7, 8, 9})
    assert.tensor_near(data.read_idx(write("plain.gz", bytes)), {7, 8, 9}, 0)
    write("zipped", bytes)
    local _, gz = gzip("zipped")
    assert.tensor_near(data.read_idx(write("zipped-no-suffix", gz)), {7, 8, 9}, 0)
  end)

  it("reads an empty dim and a file of more than one gzip block", function()
    local t = data.read_idx(write("empty-dim", idx_bytes(0x0D, {3, 0}, {})))
    assert.are.same({3, 0}, {unpack(t:size())})
    local values = {}
    for i = 1, 300 * 300 do values[i] = (i * 7919) % 65536 - 32768 end
    write("big", idx_bytes(0x0B, {300, 300}, values))
    local big = data.read_idx((gzip("big")))
    assert.are.same({300, 300}, {unpack(big:size())})
    assert.are.equal(values[1], big[1][1])
    assert.are.equal(values[300 * 300], big[300][300])
    assert.are.equal(values[12345], big:view(-1)[12345])
  end)

  it("rejects malformed headers with the file and the offset in the message", function()
    local bad = {
      {"bad-magic", string.char(1, 0, 8, 1) .. be(1, 4) .. "x", "not an IDX file", "offset 0"},
      {"bad-type", string.char(0, 0, 7, 1) .. be(1, 4) .. "x", "unknown IDX type code 0x07", "offset 2"},
      {"zero-dims", string.char(0, 0, 8, 0), "0 dims at offset 3"},
      {"nine-dims", string.char(0, 0, 8, 9) .. string.rep(be(1, 4), 9) .. "x", "9 dims at offset 3"},
      {"negative", string.char(0, 0, 8, 2) .. be(2, 4) .. be(2 ^ 32 - 1, 4), "negative", "offset 8"},
      {"overflow", string.char(0, 0, 0x0E, 3) .. string.rep(be(2 ^ 31 - 1, 4), 3), "too many elements"},
      {"short-magic", string.char(0, 0), "truncated", "needs 4 bytes, only 2 remain"},
      {"short-sizes", string.char(0, 0, 8, 2, 0, 0, 0, 1, 0), "truncated", "the sizes at offset 4 needs 8 bytes"},
      {"empty-file", "", "truncated"},
    }
    for _, b in ipairs(bad) do
      local path = write(b[1], b[2])
      local msg = err(data.read_idx, path)
      assert_contains(msg, "read_idx", path, unpack(b, 3))
    end
    assert_contains(err(data.read_idx, path_of("does-not-exist")), path_of("does-not-exist"), "No such file")
    assert_contains(err(data.read_idx, dir), "directory")
    assert_contains(err(data.read_idx, 42), "path must be a string")
  end)

  it("rejects truncated data and trailing bytes, naming the file and both byte counts", function()
    local full = idx_bytes(0x0C, {2, 3}, {1, 2, 3, 4, 5, 6})   -- 12-byte header + 24 data bytes
    local path = write("short", full:sub(1, 30))
    assert_contains(err(data.read_idx, path), path, "truncated", "24 data bytes", "36 in all", "file has 30 bytes")
    path = write("long", full .. "xyz")
    assert_contains(err(data.read_idx, path), path, "3 trailing bytes", "offset 36")
    -- the same in gzip: the offsets count uncompressed bytes
    write("short-z", full:sub(1, 30))
    path = gzip("short-z")
    assert_contains(err(data.read_idx, path), path, "truncated", "offset 12 (uncompressed) needs 24 bytes, only 18 remain")
    write("long-z", full .. "xyz")
    path = gzip("long-z")
    assert_contains(err(data.read_idx, path), path, "3 trailing bytes", "offset 36 (uncompressed)")
    -- a cut or corrupted gzip stream
    write("ok-z", full)
    local _, gz = gzip("ok-z")
    path = write("cut.gz", gz:sub(1, #gz - 4))
    assert_contains(err(data.read_idx, path), path, "gzip")
    local flipped = gz:sub(1, #gz - 8) .. string.char((gz:byte(#gz - 7) + 1) % 256) .. gz:sub(#gz - 6)
    path = write("crc.gz", flipped)
    assert_contains(err(data.read_idx, path), path, "corrupt gzip stream")
  end)

  it("raises at the caller's line", function()
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, msg = pcall(function() return data.read_idx(path_of("missing")) end)
    assert.is_false(ok)
    assert_contains(msg, SRC .. ":" .. line .. ":")
  end)

  it("survives every truncation and random header bytes: an error or a valid tensor, never a crash", function()
    local full = idx_bytes(0x0B, {2, 3, 2}, {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12})
    write("fuzz", full)
    local _, gz = gzip("fuzz")
    for _, src in ipairs({full, gz}) do
      for cut = 0, #src - 1 do
        local path = write("cut", src:sub(1, cut))
        assert_contains(err(data.read_idx, path), path)
      end
    end
    local rnd = H.lcg(7)
    local outcomes = {error = 0, tensor = 0}
    for _ = 1, 500 do
      local bytes = {full:byte(1, -1)}
      for _ = 1, 1 + math.floor(rnd() * 3) do
        local at = 1 + math.floor(rnd() * 20)       -- the 16-byte header and the first data bytes
        bytes[at] = math.floor(rnd() * 256)
      end
      local path = write("flip", string.char(unpack(bytes)))
      local ok, t = pcall(data.read_idx, path)
      if ok then
        outcomes.tensor = outcomes.tensor + 1
        local n = 1
        for _, s in ipairs(t:size()) do n = n * s end
        assert.are.equal(n, t:numel())
        assert.are.equal(n, #t:view(-1):totable())
      else
        outcomes.error = outcomes.error + 1
        assert_contains(t, path)
      end
    end
    assert.is_true(outcomes.error > 0 and outcomes.tensor > 0)
    assert.are.equal(3, kiln.tensor{1, 2}:sum():item())   -- the runtime still works
  end)
end)

describe("datasets.fashion_mnist", function()
  local fm = require "datasets.fashion_mnist"
  local root = fm.root
  local present = io.open(root .. "/train-labels-idx1-ubyte.gz", "rb")
  if present then present:close() end

  -- The first n bytes of a gzip file, decompressed by the gzip program.
  local function head(path, n)
    local p = assert(io.popen("gzip -dc '" .. path .. "' | head -c " .. n))
    local s = p:read("*a")
    p:close()
    return s
  end

  it("says how to install the package when the files are missing", function()
    local msg = err(fm.load, {root = dir .. "/nowhere"})
    assert_contains(msg, dir .. "/nowhere/train-images-idx3-ubyte.gz",
                    "install the Debian package dataset-fashion-mnist (sudo apt-get install dataset-fashion-mnist)")
    assert_contains(err(fm.load, {split = "valid"}), "unknown split")
  end)

  if not present then
    pending("Fashion-MNIST is not installed (sudo apt-get install dataset-fashion-mnist)")
    return
  end

  it("loads the training split normalised, labels counting from 1", function()
    local train = fm.load{split = "train"}
    local x, y, classes = train.images, train.labels, train.classes
    assert.are.equal(60000, train:len())
    assert.are.equal(1, data.num_batches(train, {batch_size = 60000}))
    assert.are.same({60000, 1, 28, 28}, {unpack(x:size())})
    assert.are.equal("f32", x:dtype())
    assert.are.same({60000}, {unpack(y:size())})
    assert.are.equal("i64", y:dtype())
    assert.are.equal(1, y:min():item())
    assert.are.equal(10, y:max():item())
    assert.are.equal(10, #classes)
    assert.are.equal("T-shirt/top", classes[1])
    assert.are.equal("Ankle boot", classes[10])
    local labels = head(root .. "/train-labels-idx1-ubyte.gz", 10)
    assert.are.equal(labels:byte(9) + 1, y[1])
    assert.are.equal(labels:byte(10) + 1, y[2])
    -- normalised with the training set's own statistics
    assert.is_true(math.abs(x:mean():item()) < 0.01)
    assert.is_true(math.abs(x:std():item() - 1) < 0.01)
  end)

  it("loads the test split unnormalised: pixels are the file's bytes / 255", function()
    local test = fm.load{split = "test", normalize = false, dtype = "f64"}
    local x, y = test.images, test.labels
    assert.are.equal("test", test.split)
    local xi, yi = test:get(1)
    assert.are.same({1, 28, 28}, {unpack(xi:size())})
    assert.are.equal(y[1], yi:item())
    assert.are.same({10000, 1, 28, 28}, {unpack(x:size())})
    assert.are.equal("f64", x:dtype())
    assert.is_true(x:min():item() >= 0 and x:max():item() <= 1)
    assert.are.equal(0, x:min():item())
    assert.are.equal(1, x:max():item())
    local bytes = head(root .. "/t10k-images-idx3-ubyte.gz", 16 + 784)
    local first = x[1][1]
    for r = 1, 28 do
      for c = 1, 28 do
        local b = bytes:byte(16 + (r - 1) * 28 + c)
        assert(math.abs(first[r][c] - b / 255) < 1e-12, string.format("pixel (%d,%d): %g vs %d/255", r, c, first[r][c], b))
      end
    end
    local labels = head(root .. "/t10k-labels-idx1-ubyte.gz", 9)
    assert.are.equal(labels:byte(9) + 1, y[1])
    assert.are.equal(1, y:min():item())
    assert.are.equal(10, y:max():item())
  end)
end)

describe("data.batches", function()
  local n = 103
  local x = kiln.arange(1, n + 1, {dtype = "f32"})
  local y = x * 10

  -- Every batch of an epoch: the x values in order, and the batch sizes.
  local function epoch(src, opts)
    local seen, sizes, count = {}, {}, 0
    for i, xb, yb in data.batches(src, opts) do
      count = count + 1
      assert.are.equal(count, i)
      sizes[#sizes + 1] = xb:size(1)
      for k, v in ipairs(xb:totable()) do
        seen[#seen + 1] = v
        if yb then assert.are.equal(v * 10, yb[k]) end
      end
    end
    return seen, sizes
  end

  it("visits every sample exactly once per epoch, rows of x and y together", function()
    local seen, sizes = epoch({x, y}, {batch_size = 10, seed = 5})
    assert.are.equal(n, #seen)
    local sorted = {unpack(seen)}
    table.sort(sorted)
    for i = 1, n do assert.are.equal(i, sorted[i]) end
    assert.are.same({10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 3}, sizes)
    assert.are.equal(11, data.num_batches({x, y}, {batch_size = 10}))
    local ordered = {}
    for i = 1, n do ordered[i] = i end
    assert.are_not.same(ordered, seen)
  end)

  it("drops the last short batch when asked", function()
    local seen, sizes = epoch({x, y}, {batch_size = 10, seed = 5, drop_last = true})
    assert.are.equal(100, #seen)
    assert.are.same({10, 10, 10, 10, 10, 10, 10, 10, 10, 10}, sizes)
    local distinct = {}
    for _, v in ipairs(seen) do assert.is_nil(distinct[v]) distinct[v] = true end
    assert.are.equal(10, data.num_batches({x, y}, {batch_size = 10, drop_last = true}))
  end)

  it("keeps the order without shuffle", function()
    local seen, sizes = epoch(x, {batch_size = 50, shuffle = false})
    for i = 1, n do assert.are.equal(i, seen[i]) end
    assert.are.same({50, 50, 3}, sizes)
  end)

  it("gives the same order for the same seed, another for another seed or epoch", function()
    local a = epoch({x, y}, {batch_size = 7, seed = 42})
    local b = epoch({x, y}, {batch_size = 7, seed = 42})
    local c = epoch({x, y}, {batch_size = 7, seed = 43})
    local d = epoch({x, y}, {batch_size = 7, seed = 42, epoch = 1})
    assert.are.same(a, b)
    assert.are_not.same(a, c)
    assert.are_not.same(a, d)
    assert.are_not.same(data.permutation(20, {seed = 1, epoch = 2}):totable(),
                        data.permutation(20, {seed = 2, epoch = 1}):totable())
    -- pinned: the generator is integer arithmetic, so this order holds on every machine
    assert.are.same({7, 9, 10, 1, 8, 5, 6, 4, 2, 3}, data.permutation(10, {seed = 1}):totable())
  end)

  it("leaves kiln's global generator untouched, seeded or not", function()
    kiln.manual_seed(123)
    local before = kiln.get_rng_state()
    epoch({x, y}, {batch_size = 16, seed = 9})
    epoch({x, y}, {batch_size = 16})
    data.permutation(50)
    assert.are.same(before, kiln.get_rng_state())
    local r1 = kiln.rand(4):totable()
    kiln.manual_seed(123)
    assert.are.same(r1, kiln.rand(4):totable())
    -- unseeded calls still shuffle differently from one call to the next
    assert.are_not.same(epoch(x, {batch_size = 200}), epoch(x, {batch_size = 200}))
  end)

  it("batches tensors of several dims along the first", function()
    local images = kiln.arange(0, 12 * 2 * 3, {dtype = "f32"}):view(12, 2, 3)
    local labels = kiln.arange(1, 13)
    local count = 0
    for _, xb, yb in data.batches({images, labels}, {batch_size = 5, seed = 3}) do
      assert.are.same({yb:size(1), 2, 3}, {unpack(xb:size())})
      assert.are.equal("i64", yb:dtype())
      for k = 1, yb:size(1) do assert.are.equal((yb[k] - 1) * 6, xb[k][1][1]) end
      count = count + yb:size(1)
    end
    assert.are.equal(12, count)
  end)

  it("takes a TensorDataset, or any dataset with len and get", function()
    local ds = data.TensorDataset(x, y)
    assert.are.equal(n, ds:len())
    local xi, yi = ds:get(4)
    assert.are.equal(4, xi:item())
    assert.are.equal(40, yi:item())
    local seen = epoch(ds, {batch_size = 32, seed = 1})
    assert.are.same(epoch({x, y}, {batch_size = 32, seed = 1}), seen)
    local squares = {len = function() return 9 end, get = function(_, i) return kiln.tensor{i, i * i}, i end}
    local total = 0
    for _, xb, yb in data.batches(squares, {batch_size = 4, seed = 2}) do
      assert.are.equal(2, xb:dim())
      for k = 1, yb:size(1) do assert.are.equal(yb[k] * yb[k], xb[k][2]) end
      total = total + yb:size(1)
    end
    assert.are.equal(9, total)
  end)

  it("rejects mismatched first dims and bad options", function()
    assert_contains(err(data.TensorDataset, x, kiln.zeros(5)), "[5]", "[103]", "first dims")
    assert_contains(err(data.batches, {x, kiln.zeros(5)}), "first dims")
    assert_contains(err(data.batches, x, {batch_size = 0}), "batch_size must be positive")
    assert_contains(err(data.batches, x, {seed = 1.5}), "seed must be an integer")
    assert_contains(err(data.batches, "x"), "expected a dataset")
  end)
end)

describe("kiln.ui", function()
  -- A file-like object that keeps what is written.
  local function sink()
    local s = {text = ""}
    function s:write(...) for _, v in ipairs({...}) do self.text = self.text .. v end return self end
    function s:flush() end
    return s
  end

  it("encodes JSON with sorted keys, numbers that read back exactly, and escaped strings", function()
    assert.are.equal('{"a":[1,2,3],"b":1.5,"c":"x\\"y\\n\\t\\\\","d":true,"e":{"y":{},"z":0.1},"f":null}',
                     ui.json_encode{b = 1.5, a = {1, 2, 3}, c = 'x"y\n\t\\', d = true, e = {z = 0.1, y = {}}, f = 0 / 0})
    assert.are.equal("0.3333333333333333", ui.json_encode(1 / 3))
    assert.are.equal("9007199254740992", ui.json_encode(2 ^ 53))
    assert.are.equal("1e+300", ui.json_encode(1e300))
    assert.are.equal("-42", ui.json_encode(-42))
    assert.are.equal("null", ui.json_encode(math.huge))
    assert.are.equal('"\\u0001"', ui.json_encode("\1"))
    assert.are.equal('[[1,2],[3,4]]', ui.json_encode(kiln.tensor{{1, 2}, {3, 4}}))
    assert.are.equal('{"loss":0.25}', ui.json_encode{loss = kiln.tensor(0.25)})
    assert.are.equal('{"1":"a","3":"b"}', ui.json_encode{[1] = "a", [3] = "b"})
    assert.are.equal('[false,"x"]', ui.json_encode{false, "x"})
    local t = {}
    t.self = t
    assert_contains(err(ui.json_encode, t), "contains itself")
    assert_contains(err(ui.json_encode, {f = print}), "cannot encode a function")
  end)

  it("prints one JSON line, to standard output or appended to a file", function()
    local out = sink()
    assert.are.equal('{"epoch":1,"loss":0.5}', ui.json({epoch = 1, loss = 0.5}, out))
    assert.are.equal('{"epoch":1,"loss":0.5}\n', out.text)
    local path = path_of("metrics.jsonl")
    ui.json({step = 1}, path)
    ui.json({step = 2}, path)
    local f = assert(io.open(path))
    assert.are.equal('{"step":1}\n{"step":2}\n', f:read("*a"))
    f:close()
    local stdout = io.stdout
    io.stdout = sink()
    local ok, e = pcall(function()
      ui.json{a = "b"}
      ui.log("step %d: %.2f", 3, 0.127)
      ui.log("100% plain")
    end)
    local text = io.stdout.text
    io.stdout = stdout
    assert(ok, e)
    assert.are.equal('{"a":"b"}\nstep 3: 0.13\n100% plain\n', text)
  end)

  it("logs progress as plain lines every 10% and at the end when not on a terminal", function()
    local now, out = 0, sink()
    local bar = ui.progress{total = 200, desc = "train", out = out, tty = false, clock = function() return now end}
    for i = 1, 200 do
      now = now + 0.01
      bar:update(1, {loss = 1 / i})
    end
    bar:close()
    bar:close()
    local lines = {}
    for l in out.text:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal(10, #lines)                         -- 10%, ..., 90%, and the final line
    assert.are.equal("train 20/200 (10%) 100 it/s, eta 00:02 loss=0.05", lines[1])
    assert.are.equal("train 200/200 (100%) in 00:02, 100 it/s, loss=0.005", lines[10])
    assert.is_nil(out.text:find("\r", 1, true))
  end)

  it("logs at most every interval when the total is unknown", function()
    local now, out = 0, sink()
    local bar = ui.progress{desc = "stream", out = out, tty = false, interval = 10, clock = function() return now end}
    for _ = 1, 100 do now = now + 0.5 bar:update(3) end
    bar:close()
    local lines = {}
    for l in out.text:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.same({"stream 60 it in 00:10, 6.00 it/s", "stream 120 it in 00:20, 6.00 it/s",
                     "stream 180 it in 00:30, 6.00 it/s", "stream 240 it in 00:40, 6.00 it/s",
                     "stream 300 it in 00:50, 6.00 it/s"}, lines)
  end)

  it("redraws one line with \\r on a terminal", function()
    local now, out = 0, sink()
    local bar = ui.progress{total = 4, desc = "ep", out = out, tty = true, width = 100, clock = function() return now end}
    for _ = 1, 4 do now = now + 1 bar:update(1, {loss = 0.5}) end
    bar:close()
    assert.is_nil(out.text:sub(1, -2):find("\n", 1, true))   -- a single line until close
    assert.are.equal("\n", out.text:sub(-1))
    assert_contains(out.text, "\rep  25%|", "| 1/4 [00:01<00:03, 1.00 it/s] loss=0.5",
                    "\rep 100%|####################| 4/4 [00:04<00:00, 1.00 it/s] loss=0.5")
    assert.is_true(ui.isatty(1) == true or ui.isatty(1) == false)
    assert.is_true(ui.clock() > 0)
  end)
end)
