-- safetensors, checkpoints and metrics: every dtype round-trips bitwise; a file written byte by byte
-- from the format's specification loads, and kiln's files match the specification byte for byte;
-- every malformed file is an error naming it; checkpoints restore a run bitwise, keep the last N,
-- survive a crash mid-write, and a training run killed with SIGKILL resumes to the same result.
local kiln = kiln or require "kiln"
local ffi = require "ffi"
local cjson = require "cjson"
local nn, optim = kiln.nn, kiln.optim
local checkpoint = kiln.checkpoint
local metrics = require "kiln.metrics"
package.path = "./?.lua;" .. package.path

local dir

setup(function()
  local p = assert(io.popen("mktemp -d /tmp/kiln-io-spec-XXXXXX"))
  dir = p:read("*l")
  p:close()
  assert(dir and #dir > 0, "mktemp -d failed")
end)

teardown(function()
  if dir and dir:match("^/tmp/kiln%-io%-spec%-") then os.execute("rm -rf '" .. dir .. "'") end
end)

-- ---- helpers ----

local function path_of(name) return dir .. "/" .. name end

local function write_file(path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
  return path
end

local function read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function read_if_any(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("*a")
  f:close()
  return s
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- The raw bytes of a tensor's elements in row-major order.
local function bytes_of(t)
  local c = t:contiguous()
  local n = c:numel() * c:element_size()
  return ffi.string(ffi.cast("const char *", c.p.storage.data) + c.p.offset * c:element_size(), n)
end

-- n as 8 little-endian bytes (n < 2^53).
local function le64(n)
  local b = {}
  for i = 1, 8 do
    b[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(b)
end

local function le_uint(s)
  local n = 0
  for i = #s, 1, -1 do n = n * 256 + s:byte(i) end
  return n
end

local function hex(s) return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end

-- A safetensors file from its JSON header and data bytes, exactly as given (no padding).
local function st_bytes(header, data) return le64(#header) .. header .. (data or "") end

local function load_error(path, ...)
  local ok, err = pcall(kiln.load, path)
  assert.is_false(ok, "loading " .. path .. " should fail")
  err = tostring(err)
  assert.is_truthy(err:find(path, 1, true), "the error does not name the file: " .. err)
  for _, pattern in ipairs({...}) do
    assert.is_truthy(err:find(pattern, 1, true), "the error lacks '" .. pattern .. "': " .. err)
  end
  return err
end

local kiln_exe = require("helpers").kiln_exe

local function execute(cmd)
  local r = os.execute(cmd)
  return r == 0 or r == true
end

local dtype_values = {
  f32 = {0, -0.0, 1.5, -2.25, 1e-45, 3.4e38, 0.1, math.huge, -math.huge, 0 / 0},
  f64 = {0.1, 1 / 3, -0.0, 5e-324, 1.7976931348623157e308, -math.huge, 0 / 0},
  f16 = {0, -0.0, 1, -2.5, 6e-8, 65504, 0.1, math.huge, 0 / 0},
  bf16 = {0, -0.0, 1, -2.5, 1e-40, 3e38, 0.1, -math.huge, 0 / 0},
  i64 = {0, -1, 2 ^ 53, -2 ^ 53, 123456789012345, 7},
  i32 = {0, -1, 2 ^ 31 - 1, -2 ^ 31, 100000},
  u8 = {0, 1, 127, 128, 255},
  bool = {true, false, true, true},
}

describe("kiln.save and kiln.load", function()
  it("round-trip every dtype bitwise, with shapes, names and metadata", function()
    local tensors = {}
    for dtype, values in pairs(dtype_values) do
      tensors[dtype] = kiln.tensor(values, {dtype = dtype})
      tensors[dtype .. ".matrix"] = kiln.tensor(dtype == "bool" and {{true, false, true}, {false, false, true}}
                                                or {{1, 2, 3}, {4, 5, 6}}, {dtype = dtype})
    end
    tensors.scalar = kiln.tensor(3.25, {dtype = "f64"})
    tensors.empty = kiln.zeros(0, 3)
    tensors.transposed = kiln.arange(12, {dtype = "f32"}):view(3, 4):t()   -- non-contiguous: written row-major
    local path = path_of("all.safetensors")
    kiln.save(path, tensors, {note = "every dtype", n = 3})
    for _, opts in ipairs({{}, {mmap = false}}) do
      local loaded, meta = kiln.load(path, opts)
      assert.are.same({note = "every dtype", n = "3"}, meta)
      local count = 0
      for name, t in pairs(tensors) do
        count = count + 1
        local l = loaded[name]
        assert.is_not_nil(l, name)
        assert.are.equal(t:dtype(), l:dtype(), name)
        assert.are.same(t:size(), l:size(), name)
        assert.are.equal(hex(bytes_of(t)), hex(bytes_of(l)), name)
      end
      for _ in pairs(loaded) do count = count - 1 end
      assert.are.equal(0, count)
      assert.is_true(loaded.transposed:is_contiguous())
      assert.are.same({{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}}, loaded.transposed:totable())
      assert.are.equal(0, loaded.scalar:dim())
    end
  end)

  it("saves a module as its state_dict, with PyTorch's names", function()
    kiln.manual_seed(1)
    local m = nn.Sequential({nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)})
    local path = kiln.save(path_of("module.safetensors"), m)
    local t = kiln.load(path)
    assert.are.same({"0.bias", "0.weight", "2.bias", "2.weight"}, (function()
      local names = {}
      for k in pairs(t) do names[#names + 1] = k end
      table.sort(names)
      return names
    end)())
    assert.are.equal(hex(bytes_of(m:state_dict()["0.weight"])), hex(bytes_of(t["0.weight"])))
    local m2 = nn.Sequential({nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)})
    m2:load_state_dict(t)
    assert.are.equal(hex(bytes_of(m:state_dict()["2.bias"])), hex(bytes_of(m2:state_dict()["2.bias"])))
  end)

  it("gives the same bytes for the same tensors, whatever their order or the process", function()
    local a = kiln.arange(6, {dtype = "f32"})
    local b = kiln.arange(4, {dtype = "i64"})
    kiln.save(path_of("o1.safetensors"), {a = a, b = b, c = kiln.ones(3, {dtype = "u8"})}, {x = "1", y = "2"})
    kiln.save(path_of("o2.safetensors"), {c = kiln.ones(3, {dtype = "u8"}), b = b, a = a}, {y = "2", x = "1"})
    assert.are.equal(read_file(path_of("o1.safetensors")), read_file(path_of("o2.safetensors")))
  end)

  it("loads a file written byte by byte from the format's specification (unpadded: misaligned data are copied)", function()
    -- 8 bytes: the header length, little-endian; the JSON header; the data, little-endian, row-major.
    local header = '{"__metadata__":{"source":"hand"},'
      .. '"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},'
      .. '"b":{"dtype":"BF16","shape":[2],"data_offsets":[16,20]},'
      .. '"h":{"dtype":"F16","shape":[1],"data_offsets":[20,22]},'
      .. '"m":{"dtype":"BOOL","shape":[2],"data_offsets":[22,24]},'
      .. '"n":{"dtype":"I64","shape":[],"data_offsets":[24,32]},'
      .. '"k":{"dtype":"U8","shape":[3],"data_offsets":[32,35]},'
      .. '"i":{"dtype":"I32","shape":[1],"data_offsets":[35,39]},'
      .. '"d":{"dtype":"F64","shape":[1],"data_offsets":[39,47]},'
      .. '"z":{"dtype":"F32","shape":[0,4],"data_offsets":[47,47]}}'
    local data = "\0\0\128\63" .. "\0\0\0\64" .. "\0\0\0\191" .. "\0\0\128\62"   -- 1, 2, -0.5, 0.25
      .. "\128\63" .. "\0\192"                                                    -- bf16 1, -2
      .. "\0\56"                                                                  -- f16 0.5
      .. "\1\0"                                                                   -- true, false
      .. "\254\255\255\255\255\255\255\255"                                       -- i64 -2
      .. "\0\127\255"                                                             -- u8 0, 127, 255
      .. "\160\134\1\0"                                                           -- i32 100000
      .. "\154\153\153\153\153\153\185\63"                                        -- f64 0.1
    for _, pad in ipairs({0, (8 - #header % 8) % 8}) do
      local h = header .. string.rep(" ", pad)
      local path = write_file(path_of("hand" .. pad .. ".safetensors"), st_bytes(h, data))
      local t, meta = kiln.load(path)
      assert.are.same({source = "hand"}, meta)
      assert.are.same({{1, 2}, {-0.5, 0.25}}, t.w:totable())
      assert.are.same({1, -2}, t.b:totable())
      assert.are.equal("bf16", t.b:dtype())
      assert.are.same({0.5}, t.h:totable())
      assert.are.same({true, false}, t.m:totable())
      assert.are.equal(-2, t.n:item())
      assert.are.equal(0, t.n:dim())
      assert.are.same({0, 127, 255}, t.k:totable())
      assert.are.same({100000}, t.i:totable())
      assert.are.equal(0.1, t.d:item())
      assert.are.same({0, 4}, {t.z:size(1), t.z:size(2)})
    end
  end)

  it("writes files that follow the specification byte for byte", function()
    local path = path_of("spec.safetensors")
    kiln.save(path, {w = kiln.tensor({{1, 2}, {-0.5, 0.25}}), n = kiln.tensor({-2}, {dtype = "i64"}),
                     k = kiln.tensor({0, 127, 255}, {dtype = "u8"}), m = kiln.tensor({true, false})}, {source = "kiln"})
    local s = read_file(path)
    local n = le_uint(s:sub(1, 8))
    assert.are.equal(0, (8 + n) % 8, "the data start at a multiple of 8")
    local header = s:sub(9, 8 + n)
    local json = header:match("^(.-) *$")
    assert.are.equal("{", json:sub(1, 1))
    assert.are.equal("}", json:sub(-1))
    assert.is_nil(json:find("%s"), "compact JSON, padded with spaces only after it")
    assert.is_truthy(header:find('^{"__metadata__":{"source":"kiln"}'))
    local h = cjson.decode(header)
    assert.are.same({source = "kiln"}, h.__metadata__)
    -- entries tile the data area in the order of their offsets: 8-byte elements, 4-byte, 1-byte
    local expect = {
      n = {"I64", {1}, "\254\255\255\255\255\255\255\255"},
      w = {"F32", {2, 2}, "\0\0\128\63\0\0\0\64\0\0\0\191\0\0\128\62"},
      k = {"U8", {3}, "\0\127\255"},
      m = {"BOOL", {2}, "\1\0"},
    }
    local pos, data_start = 0, 8 + n
    for _, name in ipairs({"n", "w", "k", "m"}) do
      local e = h[name]
      assert.are.equal(expect[name][1], e.dtype, name)
      assert.are.same(expect[name][2], e.shape, name)
      assert.are.same({pos, pos + #expect[name][3]}, e.data_offsets, name)
      assert.are.equal(hex(expect[name][3]), hex(s:sub(data_start + pos + 1, data_start + e.data_offsets[2])), name)
      pos = e.data_offsets[2]
    end
    assert.are.equal(#s, data_start + pos, "nothing after the data")
  end)

  it("gives tensors that stay valid after the file is gone, and whose changes never reach the file", function()
    local path = path_of("cow.safetensors")
    kiln.save(path, {x = kiln.arange(1000, {dtype = "f32"})})
    local before = read_file(path)
    local t = kiln.load(path)
    t.x:fill_(7)
    assert.are.equal(before, read_file(path))
    assert.are.equal(7000, kiln.load(path, {mmap = false}).x:fill_(7):sum():item())
    local u = kiln.load(path).x
    os.remove(path)
    collectgarbage()
    assert.are.equal(999 * 1000 / 2, u:sum():item())
  end)

  it("refuses bad arguments with a message", function()
    assert.has_error(function() kiln.save(path_of("x.safetensors"), kiln.ones(2)) end)
    local ok, err = pcall(kiln.save, path_of("x.safetensors"), {a = 3})
    assert.is_false(ok)
    assert.matches('"a" is a number', err)
    ok, err = pcall(kiln.save, path_of("x.safetensors"), {__metadata__ = kiln.ones(1)})
    assert.is_false(ok)
    assert.matches("reserved", err)
    local freed = kiln.ones(3)
    freed:free()
    ok, err = pcall(kiln.save, path_of("x.safetensors"), {f = freed})
    assert.is_false(ok)
    assert.matches('"f" %[3%] f32 was freed', err)
    ok, err = pcall(kiln.save, path_of("no/such/dir/x.safetensors"), {a = kiln.ones(1)})
    assert.is_false(ok)
    assert.matches("no/such/dir/x.safetensors", err)
    assert.matches("No such file", err)
  end)
end)

describe("kiln.load on malformed files", function()
  -- A valid two-entry file; each case changes one thing.
  local function header_of(a, b)
    return '{"a":' .. a .. ',"b":' .. b .. '}'
  end
  local A = '{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
  local B = '{"dtype":"U8","shape":[3],"data_offsets":[8,11]}'
  local DATA = "\0\0\128\63\0\0\0\64\1\2\3"
  local function case(name, bytes, ...)
    return load_error(write_file(path_of(name .. ".safetensors"), bytes), ...)
  end

  it("loads the valid base file", function()
    local t = kiln.load(write_file(path_of("base.safetensors"), st_bytes(header_of(A, B), DATA)))
    assert.are.same({1, 2}, t.a:totable())
    assert.are.same({1, 2, 3}, t.b:totable())
  end)

  it("names the file and the problem for truncated files, at every length", function()
    local good = st_bytes(header_of(A, B), DATA)
    case("empty", "", "truncated")
    case("cut4", good:sub(1, 4), "truncated")
    case("cut8", good:sub(1, 8), "larger than the rest of the file")
    case("cut20", good:sub(1, 20), "larger than the rest of the file")
    case("cut-header", good:sub(1, 8 + #header_of(A, B)), '"a"', "end past the data area")
    case("cut-data", good:sub(1, #good - 1), '"b"', "end past the data area")
    local path = path_of("cut.safetensors")
    for len = 0, #good - 1 do
      write_file(path, good:sub(1, len))
      load_error(path)
    end
    -- a kiln-written file too
    local kiln_file = path_of("kcut-src.safetensors")
    kiln.save(kiln_file, {x = kiln.ones(3, 5), y = kiln.arange(7)}, {m = "v"})
    local bytes = read_file(kiln_file)
    for len = 0, #bytes - 1, 3 do
      write_file(path, bytes:sub(1, len))
      load_error(path)
    end
  end)

  it("rejects a header length larger than the file, or past the 100 MB limit, before allocating", function()
    case("hlen-big", le64(1000000) .. header_of(A, B) .. DATA, "header length 1000000", "larger than the rest of the file")
    case("hlen-max", string.rep("\255", 8) .. header_of(A, B) .. DATA, "larger than the rest of the file")
    case("hlen-zero", le64(0) .. header_of(A, B) .. DATA, "too short")
  end)

  it("rejects malformed JSON", function()
    local h = header_of(A, B)
    case("json-unclosed", st_bytes(h:sub(1, -2) .. " ", DATA), "JSON header is malformed")
    case("json-garbage", st_bytes('{"a": nope}', ""), "JSON header is malformed")
    case("json-not-object", st_bytes('["a"]', ""), "does not start with '{'")
    case("json-trailing", st_bytes(h .. "xyz", DATA), "stray bytes after the JSON header")
    case("json-binary", "\17\0\0\0\0\0\0\0" .. "\0\1\2\3\4\5\6\7\8\9\10\11\12\13\14\15\16", "does not start")
  end)

  it("rejects unknown dtypes, bad shapes and bad offsets, naming the entry", function()
    case("dtype-unknown", st_bytes(header_of('{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}', B), DATA), '"a"',
         'unknown dtype "F8_E4M3"')
    case("dtype-number", st_bytes(header_of('{"dtype":4,"shape":[2],"data_offsets":[0,8]}', B), DATA), '"a"', "not a string")
    case("shape-negative", st_bytes(header_of('{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}', B), DATA), '"a"',
         "non-negative integer")
    case("shape-fraction", st_bytes(header_of('{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}', B), DATA), '"a"',
         "non-negative integer")
    case("shape-dims", st_bytes(header_of('{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}', B), DATA),
         '"a"', "at most 8")
    case("no-offsets", st_bytes(header_of('{"dtype":"F32","shape":[2]}', B), DATA), '"a"', "has no data_offsets")
    case("offsets-one", st_bytes(header_of('{"dtype":"F32","shape":[2],"data_offsets":[0]}', B), DATA), '"a"', "[begin, end]")
    case("offsets-out", st_bytes(header_of(A, '{"dtype":"U8","shape":[3],"data_offsets":[8,1000]}'), DATA), '"b"',
         "end past the data area")
    case("offsets-reversed", st_bytes(header_of(A, '{"dtype":"U8","shape":[3],"data_offsets":[11,8]}'), DATA), '"b"',
         "begin after they end")
    case("offsets-overlap", st_bytes(header_of(A, '{"dtype":"U8","shape":[3],"data_offsets":[4,7]}'), DATA), '"b"',
         "overlaps entry \"a\"")
    case("offsets-gap", st_bytes(header_of(A, '{"dtype":"U8","shape":[3],"data_offsets":[9,12]}'), DATA .. "\0"), "belong to no entry")
    case("data-trailing", st_bytes(header_of(A, B), DATA .. "\0\0"), "belong to no entry")
    case("size-wrong", st_bytes(header_of('{"dtype":"F32","shape":[3],"data_offsets":[0,8]}', B), DATA), '"a"',
         "hold 8 bytes, but [3] F32 needs 12")
    case("size-huge", st_bytes(header_of('{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}', B), DATA),
         '"a"', "too many elements")
    case("offsets-huge", st_bytes(header_of('{"dtype":"F32","shape":[1000000000000000],"data_offsets":[0,4000000000000000]}', B),
         DATA), '"a"', "end past the data area")
    case("offsets-1e300", st_bytes(header_of('{"dtype":"F32","shape":[2],"data_offsets":[0,1e300]}', B), DATA), '"a"',
         "not non-negative integers")
    case("entry-twice", st_bytes('{"a":' .. A .. ',"a":' .. A .. '}', DATA:sub(1, 8)), 'entry "a" appears twice')
    case("entry-string", st_bytes(header_of('"F32"', B), DATA), '"a"', "not an object")
    case("meta-number", st_bytes('{"__metadata__":{"k":3},"a":' .. A .. '}', DATA:sub(1, 8)), '"k"', "not a string")
    case("meta-array", st_bytes('{"__metadata__":[],"a":' .. A .. '}', DATA:sub(1, 8)), "__metadata__", "not an object")
    case("bool-byte", st_bytes('{"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}', "\1\2"), '"m"', "expected 0 or 1")
  end)

  it("rejects what is not a regular file", function()
    load_error(dir, "directory")
    load_error(path_of("missing.safetensors"), "cannot open")
  end)

  it("never crashes on corrupted bytes, and still works afterwards", function()
    local src = path_of("corrupt-src.safetensors")
    kiln.save(src, {x = kiln.ones(2, 3), y = kiln.arange(5), z = kiln.tensor({true, false})}, {a = "b"})
    local good = read_file(src)
    local path = path_of("corrupt.safetensors")
    local seed = 12345
    local function rand(n)   -- a small LCG: the same cases every run
      seed = (seed * 1103515245 + 12345) % 2147483648
      return seed % n
    end
    local failures = 0
    for _ = 1, 400 do
      local b = {good:byte(1, -1)}
      for _ = 1, 1 + rand(3) do
        local at = 1 + rand(#b)
        b[at] = rand(256)
      end
      write_file(path, string.char(unpack(b)))
      local ok, err = pcall(kiln.load, path)
      if not ok then
        failures = failures + 1
        assert.is_truthy(tostring(err):find(path, 1, true), tostring(err))
      end
    end
    assert.is_true(failures > 100)
    assert.are.same({true, false}, kiln.load(src).z:totable())
    assert.are.equal(10, kiln.load(src).y:sum():item())
  end)
end)

-- ---- checkpoints ----

local function small_model(seed)
  kiln.manual_seed(seed)
  return nn.Sequential({nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)})
end

local function train_steps(model, opt, sched, steps, seed)
  kiln.manual_seed(seed)
  local x, y = kiln.randn(16, 6), kiln.randint(1, 4, {16})
  local loss_fn = nn.CrossEntropyLoss()
  for _ = 1, steps do
    local loss = loss_fn(model(x), y)
    opt:zero_grad()
    loss:backward()
    opt:step()
    if sched then sched:step() end
  end
end

local function assert_same_tensors(a, b, what)
  local n = 0
  for k, t in pairs(a) do
    n = n + 1
    assert.is_not_nil(b[k], what .. ": " .. k .. " missing")
    assert.are.equal(t:dtype(), b[k]:dtype(), k)
    assert.are.equal(hex(bytes_of(t)), hex(bytes_of(b[k])), what .. ": " .. k)
  end
  for _ in pairs(b) do n = n - 1 end
  assert.are.equal(0, n, what .. ": different names")
end

local function params_of(model)
  local r = {}
  for _, np in ipairs(model:named_parameters()) do r[np[1]] = np[2] end
  return r
end

describe("kiln.checkpoint", function()
  local function make(seed, kind)
    local model = small_model(seed)
    local opt, sched
    if kind == "adam" then
      opt = optim.Adam(model:parameters(), {lr = 0.01, weight_decay = 1e-3})
      sched = optim.lr_scheduler.OneCycleLR(opt, {max_lr = 0.05, total_steps = 20})
    else
      opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 1e-4})
      sched = optim.lr_scheduler.CosineAnnealingLR(opt, {T_max = 20})
    end
    return model, opt, sched
  end

  for _, kind in ipairs({"sgd", "adam"}) do
    it("restores model, optimizer (" .. kind .. "), scheduler and RNG bitwise, and training goes on identically", function()
      local m1, o1, s1 = make(1, kind)
      train_steps(m1, o1, s1, 3, 7)
      kiln.manual_seed(99)
      kiln.rand(5)
      local path = checkpoint.save(path_of("ck-" .. kind), {model = m1, optimizer = o1, scheduler = s1, step = 3, epoch = 1,
                                                             data = {epoch = 1, batch = 3},
                                                             extra = {note = "x", tenth = 0.1, third = 1 / 3, inf = math.huge,
                                                                      list = {1, 2.5, "s", true}, keyed = {[0] = "zero", [5] = 0.2},
                                                                      t = kiln.arange(4, {dtype = "i64"})}})
      assert.are.equal(path_of("ck-" .. kind) .. "/ckpt-3.safetensors", path)
      local after_save = kiln.rand(3):totable()

      local m2, o2, s2 = make(2, kind)
      kiln.manual_seed(5)
      local st = checkpoint.load(path_of("ck-" .. kind), {model = m2, optimizer = o2, scheduler = s2})
      assert.are.same(after_save, kiln.rand(3):totable())   -- the RNG resumes where it was saved
      assert.are.equal(3, st.step)
      assert.are.equal(1, st.epoch)
      assert.are.same({epoch = 1, batch = 3}, st.data)
      assert.are.equal("x", st.extra.note)
      assert.are.equal(0.1, st.extra.tenth)
      assert.are.equal(1 / 3, st.extra.third)
      assert.are.equal(math.huge, st.extra.inf)
      assert.are.same({1, 2.5, "s", true}, st.extra.list)
      assert.are.same({[0] = "zero", [5] = 0.2}, st.extra.keyed)
      assert.are.same({0, 1, 2, 3}, st.extra.t:totable())
      assert_same_tensors(params_of(m1), params_of(m2), "parameters")
      local sd1, sd2 = o1:state_dict(), o2:state_dict()
      assert.are.same(sd1.param_groups, sd2.param_groups)
      for i, s in pairs(sd1.state) do
        local tens1, tens2 = {}, {}
        for k, v in pairs(s) do
          if kiln.is_tensor(v) then tens1[k] = v else assert.are.equal(v, sd2.state[i][k], k) end
        end
        for k, v in pairs(sd2.state[i]) do if kiln.is_tensor(v) then tens2[k] = v end end
        assert_same_tensors(tens1, tens2, "optimizer state " .. i)
      end
      assert.are.same(s1:state_dict(), s2:state_dict())
      -- the decisive check: more steps give the same parameters
      train_steps(m1, o1, s1, 4, 11)
      train_steps(m2, o2, s2, 4, 11)
      assert_same_tensors(params_of(m1), params_of(m2), "parameters after 4 more steps")
    end)
  end

  it("saves a state_dict with PyTorch's names under model.", function()
    local m = small_model(3)
    local path = checkpoint.save(path_of("names.safetensors"), {model = m, step = 0})
    local t, meta = kiln.load(path)
    assert.is_not_nil(t["model.0.weight"])
    assert.is_not_nil(t["model.2.bias"])
    assert.are.equal("1", meta["kiln.checkpoint"])
    local st = checkpoint.load(path)
    assert.is_not_nil(st.model["0.weight"])
  end)

  it("keeps the last N checkpoints of a folder, and finds the latest", function()
    local d = path_of("keep")
    local m = small_model(4)
    for step = 1, 5 do checkpoint.save(d, {model = m, step = step}, {keep = 2}) end
    assert.are.same({d .. "/ckpt-5.safetensors", d .. "/ckpt-4.safetensors"}, checkpoint.list(d))
    local p, step = checkpoint.latest(d)
    assert.are.equal(d .. "/ckpt-5.safetensors", p)
    assert.are.equal(5, step)
    assert.is_nil(checkpoint.latest(path_of("nothing-here")))
    -- step 10 sorts after step 9 (numbers, not text); a dead writer's temporary file goes, a live one's stays
    pcall(ffi.cdef, "int kiln_spec_getpid(void) __asm__(\"getpid\");")
    local dead = write_file(d .. "/ckpt-6.safetensors.tmp.4194305", "partial")   -- above any pid_max
    local live = write_file(d .. "/ckpt-7.safetensors.tmp." .. ffi.C.kiln_spec_getpid(), "partial")
    checkpoint.save(d, {model = m, step = 10}, {keep = 2})
    assert.are.same({d .. "/ckpt-10.safetensors", d .. "/ckpt-5.safetensors"}, checkpoint.list(d))
    assert.is_false(exists(dead))
    assert.is_true(exists(live))
  end)

  it("gives clear errors for files that are not checkpoints and for mismatched models", function()
    local plain = path_of("plain.safetensors")
    kiln.save(plain, {x = kiln.ones(2)})
    local ok, err = pcall(checkpoint.load, plain)
    assert.is_false(ok)
    assert.matches("not a kiln checkpoint", err)
    ok, err = pcall(checkpoint.load, path_of("empty-dir-" .. os.time()))
    assert.is_false(ok)
    local path = checkpoint.save(path_of("mismatch.safetensors"), {model = small_model(1), step = 1})
    local other = nn.Sequential({nn.Linear(6, 9), nn.ReLU(), nn.Linear(9, 3)})
    ok, err = pcall(checkpoint.load, path, {model = other})
    assert.is_false(ok)
    assert.matches("shape mismatch", err)
  end)

  it("names the checkpoint and the entry when a tensor, a parameter or a buffer does not fit", function()
    local model = small_model(1)
    local opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
    train_steps(model, opt, nil, 1, 3)   -- momentum buffers exist
    local path = checkpoint.save(path_of("names.safetensors"), {model = model, optimizer = opt, step = 1})
    local function fails(targets, pattern)
      local ok, err = pcall(checkpoint.load, path, targets)
      assert.is_false(ok)
      assert.matches("^[^\n]*io_spec%.lua:%d+: checkpoint%.load: ", tostring(err))   -- at the caller's line
      assert.truthy(tostring(err):find(path, 1, true), tostring(err))
      assert.matches(pattern, tostring(err))
    end
    -- a parameter the checkpoint lacks
    fails({model = nn.Sequential({nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3), nn.Linear(3, 2)})}, "model: .*3%.weight")
    -- a weight of the wrong shape
    fails({model = nn.Sequential({nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4)})}, "model: .*2%.weight")
    -- a tensor of a plain table that the checkpoint lacks, and one of the wrong shape
    fails({model = {["9.weight"] = kiln.zeros(2)}}, "has no tensor model%.9%.weight")
    fails({model = {["0.weight"] = kiln.zeros(2, 2)}}, "model%.0%.weight is %[8, 6%] in the checkpoint, %[2, 2%] in the model")
    -- one that copy_ would broadcast (a bias of [8] into [2, 8]) too, before any tensor of the table is written
    local w, b = kiln.zeros(8, 6), kiln.zeros(2, 8)
    fails({model = {["0.weight"] = w, ["0.bias"] = b}}, "model%.0%.bias is %[8%] in the checkpoint, %[2, 8%] in the model")
    assert.are.equal(0, w:abs():sum():item())
    fails({model = {["0.weight"] = "w"}}, "the model's 0%.weight is a string, not a tensor")
    -- a momentum buffer that does not fit the optimizer's parameters
    local other = nn.Sequential({nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4)})
    fails({optimizer = optim.SGD(other:parameters(), {lr = 0.1, momentum = 0.9})}, "optimizer: ")
  end)

  it("leaves the previous checkpoint intact when the process dies mid-write, or the write fails", function()
    local exe = kiln_exe()
    if not exe then pending("not running under the kiln launcher") return end
    local target = path_of("crash.safetensors")
    checkpoint.save(target, {model = small_model(1), step = 1})
    local before = read_file(target)
    -- A child writes a 4 MB checkpoint over it under a 64 KB file-size limit: the kernel kills it
    -- with SIGXFSZ in the middle of writing (a crash), or, with the signal ignored, write() fails.
    local script = write_file(path_of("crash-child.lua"), string.format([[
      local kiln = require "kiln"
      kiln.checkpoint.save(%q, {model = {big = kiln.ones(1024, 1024)}, step = 2})
    ]], target))
    local log = path_of("crash.log")
    execute(string.format("sh -c 'ulimit -c 0; ulimit -f 128; exec %s %s' > %s 2>&1", exe, script, log))
    assert.are.equal(before, read_file(target))
    local stale = {}
    for name in require("lfs").dir(dir) do if name:match("^crash%.safetensors%.tmp%.") then stale[#stale + 1] = name end end
    assert.are.equal(1, #stale, "the killed writer leaves its temporary file: " .. read_file(log))
    assert.are.equal(1, checkpoint.load(target).step)
    os.remove(dir .. "/" .. stale[1])

    execute(string.format("sh -c 'trap \"\" XFSZ; ulimit -c 0; ulimit -f 128; exec %s %s' > %s 2>&1", exe, script, log))
    local out = read_file(log)
    assert.is_truthy(out:find(target, 1, true), out)
    assert.is_truthy(out:find("File too large", 1, true), out)
    assert.are.equal(before, read_file(target))
    for name in require("lfs").dir(dir) do assert.is_nil(name:match("^crash%.safetensors%.tmp%."), "a failed write cleans up") end
  end)

  it("reports a full disk (ENOSPC) and leaves the previous checkpoint loadable", function()
    local exe = kiln_exe()
    if not exe then pending("not running under the kiln launcher") return end
    -- a 256 KB tmpfs in a mount namespace of the child's own (unshare -rm: no root needed where
    -- user namespaces are allowed)
    local mnt = path_of("small-disk")
    execute("mkdir -p " .. mnt)
    if not execute("unshare -rm sh -c 'mount -t tmpfs -o size=256k tmpfs " .. mnt .. "' 2>/dev/null") then
      pending("a tmpfs cannot be mounted in a user and mount namespace here (unshare -rm)")
      return
    end
    local script = write_file(path_of("enospc-child.lua"), string.format([[
      local kiln = require "kiln"
      local dir = %q
      local first = kiln.checkpoint.save(dir .. "/ckpt.safetensors", {model = {w = kiln.ones(4, 4)}, step = 1})
      local ok, err = pcall(kiln.checkpoint.save, dir .. "/ckpt.safetensors", {model = {w = kiln.ones(512, 512)}, step = 2})
      print("second save:", ok, err)
      print("loaded step:", kiln.checkpoint.load(first).step)
      for name in require("lfs").dir(dir) do if name:match("%%.tmp%%.") then print("left behind:", name) end end
    ]], mnt))
    local log = path_of("enospc.log")
    execute(string.format("unshare -rm sh -c 'mount -t tmpfs -o size=256k tmpfs %s && %s %s' > %s 2>&1", mnt, exe, script, log))
    local out = read_file(log)
    assert.matches("second save:%s+false", out)
    assert.truthy(out:find(mnt .. "/ckpt.safetensors", 1, true), out)
    assert.truthy(out:find("No space left on device", 1, true), out)
    assert.matches("loaded step:%s+1", out)
    assert.falsy(out:find("left behind:", 1, true), out)
  end)
end)

describe("the metrics logger", function()
  it("appends one flushed JSON line per call, with a time, exact numbers and sorted keys", function()
    local path = path_of("metrics.jsonl")
    local m = kiln.ui.metrics(path)
    local t0 = metrics.time()
    m:log{step = 1, epoch = 1, loss = 1 / 3, accuracy = 0.5, lr = 0.1, samples_per_s = 1234.5}
    assert.is_truthy(read_file(path):find('"loss":0.3333333333333333', 1, true))   -- flushed before close
    m:log{step = 2, loss = kiln.tensor(0.25)}
    m:close()
    local m2 = kiln.ui.metrics(path)
    m2:log{step = 3, loss = 2}
    m2:close()
    local rows = metrics.read(path)
    assert.are.equal(3, #rows)
    assert.are.equal(1 / 3, rows[1].loss)
    assert.are.equal(0.1, rows[1].lr)
    assert.are.equal(0.25, rows[2].loss)
    assert.is_true(rows[1].time >= t0 - 1 and rows[3].time >= rows[1].time)
    assert.is_truthy(read_file(path):match('^{"accuracy":0.5,"epoch":1,"loss"'))
  end)
end)

-- ---- resume after SIGKILL ----

describe("examples/fashion_mnist.lua --resume", function()
  it("on SIGTERM finishes the step, writes its checkpoint and exits with a message; the run resumes from it", function()
    local exe = kiln_exe()
    if not exe then pending("not running under the kiln launcher") return end
    if not exists("examples/fashion_mnist.lua") then pending("run from the source tree") return end
    local ok_data = pcall(function() return require("datasets.fashion_mnist").load{split = "test"} end)
    if not ok_data then pending("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)") return end
    local run = path_of("run-term")
    local common = string.format("%s examples/fashion_mnist.lua --model mlp --epochs 1 --limit 2048 --threads 2 "
                                 .. "--checkpoint-every 1000 --checkpoint %s", exe, run)
    -- it pauses after step 5 (no checkpoint is due before the epoch ends), and gets SIGTERM there
    local pidfile = run .. ".pid"
    -- a subshell starts kiln in the background, writes its pid, and waits for its status
    execute(string.format("(%s --pause-after 5 > %s.log 2>&1 & echo $! > %s; wait $!; echo $? > %s.status) &", common, run,
                          pidfile, run))
    local waited = 0
    while not read_if_any(run .. ".log"):find("paused after step 5", 1, true) and waited < 600 do
      execute("sleep 0.1")
      waited = waited + 1
    end
    assert.is_false(exists(run .. "/ckpt-5.safetensors"), read_file(run .. ".log"))
    local pid = read_file(pidfile):match("%d+")
    assert.is_not_nil(pid)
    assert.is_true(execute("kill -TERM " .. pid))
    waited = 0
    while not exists(run .. ".status") and waited < 600 do execute("sleep 0.1") waited = waited + 1 end
    assert.are.equal("143", read_file(run .. ".status"):match("%d+"), read_file(run .. ".log"))
    local log = read_file(run .. ".log")
    assert.truthy(log:find("terminated after step 5: checkpoint written to " .. run .. "/ckpt-5.safetensors", 1, true), log)
    assert.are.equal(5, checkpoint.load(run).step)
    -- and --resume goes on from step 5 to the end of the epoch
    assert.is_true(execute(string.format("%s --resume > %s.resumed.log 2>&1", common, run)), read_file(run .. ".resumed.log"))
    assert.truthy(read_file(run .. ".resumed.log"):find("resumed from .*ckpt%-5%.safetensors: step 5, epoch 1, batch 5"))
    assert.truthy(read_file(run .. ".resumed.log"):find('"test_accuracy":', 1, true))   -- the epoch's end
  end)

  it("after SIGKILL at step 8 resumes to step 16 with bitwise-identical parameters and losses", function()
    local exe = kiln_exe()
    if not exe then pending("not running under the kiln launcher") return end
    if not exists("examples/fashion_mnist.lua") then pending("run from the source tree") return end
    local ok_data = pcall(function() return require("datasets.fashion_mnist").load{split = "test"} end)
    if not ok_data then pending("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)") return end
    local common = string.format("%s examples/fashion_mnist.lua --model mlp --epochs 1 --limit 2048 --threads 2 "
                                 .. "--checkpoint-every 8", exe)
    local straight, killed = path_of("run-straight"), path_of("run-killed")
    assert.is_true(execute(string.format("%s --checkpoint %s --metrics %s.jsonl > %s.log 2>&1", common, straight, straight,
                                         straight)), read_file(straight .. ".log"))
    -- the second run stops after writing its step-8 checkpoint; it is killed there with SIGKILL
    local pidfile = killed .. ".pid"
    execute(string.format("(exec %s --checkpoint %s --metrics %s.jsonl --pause-after 8 > %s.log 2>&1) & echo $! > %s",
                          common, killed, killed, killed, pidfile))
    local pid = read_file(pidfile):match("%d+")
    assert.is_not_nil(pid)
    local waited = 0
    while not read_if_any(killed .. ".log"):find("paused after step 8", 1, true) and waited < 600 do
      execute("sleep 0.1")
      waited = waited + 1
    end
    assert.is_true(exists(killed .. "/ckpt-8.safetensors"), read_file(killed .. ".log"))
    assert.is_true(execute("kill -9 " .. pid))
    for _ = 1, 200 do   -- gone, or a zombie nobody reaps (a container without init)
      local stat = io.open("/proc/" .. pid .. "/stat")
      local state = stat and stat:read("*l"):match("^%d+ %b() (%a)")
      if stat then stat:close() end
      if not state or state == "Z" then break end
      execute("sleep 0.05")
    end
    assert.is_false(exists(killed .. "/ckpt-16.safetensors"))
    assert.is_true(execute(string.format("%s --checkpoint %s --metrics %s.jsonl --resume > %s.resumed.log 2>&1", common,
                                         killed, killed, killed)), read_file(killed .. ".resumed.log"))
    assert.is_truthy(read_file(killed .. ".resumed.log"):find("resumed from .*ckpt%-8%.safetensors: step 8, epoch 1, batch 8"))

    local a = kiln.load(straight .. "/ckpt-16.safetensors")
    local b = kiln.load(killed .. "/ckpt-16.safetensors")
    assert_same_tensors(a, b, "checkpoint at step 16")
    local sa, sb = checkpoint.load(straight), checkpoint.load(killed)
    assert.are.same(sa.optimizer.param_groups, sb.optimizer.param_groups)
    assert.are.same(sa.scheduler, sb.scheduler)
    local function losses(path)
      local r = {}
      for _, row in ipairs(metrics.read(path)) do
        if row.loss then r[row.step] = row.loss end
        if row.train_loss then r.final = row.train_loss; r.accuracy = row.accuracy end
      end
      return r
    end
    local la, lb = losses(straight .. ".jsonl"), losses(killed .. ".jsonl")
    for step = 1, 16 do assert.are.equal(la[step], lb[step], "loss at step " .. step) end
    assert.are.equal(la.final, lb.final)
    assert.are.equal(la.accuracy, lb.accuracy)
  end)
end)

-- ---- PyTorch ----

describe("interop with PyTorch's safetensors", function()
  local python = os.getenv("KILN_PYTHON") or "/usr/bin/python3"

  it("reads kiln's files with the same names and values, and writes files kiln reads (byte-identical state dicts)", function()
    if not execute(python .. ' -c "import torch, safetensors" > /dev/null 2>&1') then
      pending("needs " .. python .. " with torch and safetensors (Debian 12 packages no python3-safetensors; "
              .. "set KILN_PYTHON to a python that has both)")
      return
    end
    -- a state dict of the MLP kiln's examples train, and one tensor of every dtype
    kiln.manual_seed(1)
    local model = require("models.mlp")({inputs = 12, hidden = {16, 8}})
    local sd_path = path_of("mlp.safetensors")
    kiln.save(sd_path, model:state_dict())
    local all_path = path_of("dtypes.safetensors")
    local tensors = {}
    for dtype, values in pairs(dtype_values) do tensors[dtype] = kiln.tensor(values, {dtype = dtype}) end
    kiln.save(all_path, tensors, {who = "kiln"})
    local script = write_file(path_of("interop.py"), [[
import sys, json, torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open
sd_path, all_path, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
# kiln's MLP state dict loads into the same PyTorch model, strictly, and saves to the same bytes
net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8),
                          torch.nn.ReLU(), torch.nn.Linear(8, 10))
net.load_state_dict(load_file(sd_path), strict=True)
save_file(net.state_dict(), out_dir + "/torch_mlp.safetensors")
# every dtype: values as PyTorch reads them, and the file re-saved by PyTorch
t = load_file(all_path)
with safe_open(all_path, "pt") as f:
    meta = f.metadata()
report = {"meta": meta}
for k, v in t.items():
    report[k] = {"dtype": str(v.dtype), "shape": list(v.shape),
                 "values": [repr(x) for x in (v.float() if v.dtype in (torch.float16, torch.bfloat16) else v).tolist()]}
save_file(t, out_dir + "/torch_dtypes.safetensors", metadata=meta)
# and PyTorch's own tensors, for kiln to read
save_file({"ramp": torch.arange(10, dtype=torch.float32).reshape(2, 5) / 4, "ids": torch.tensor([3, -1], dtype=torch.int64),
           "half": torch.tensor([0.5, -1.0], dtype=torch.float16), "mask": torch.tensor([True, False])},
          out_dir + "/torch_own.safetensors", metadata={"who": "torch"})
print(json.dumps(report))
]])
    local p = io.popen(string.format("%s %s %s %s %s 2>&1", python, script, sd_path, all_path, dir))
    local out = p:read("*a")
    p:close()
    local last
    for line in out:gmatch("[^\n]+") do last = line end
    local ok, report = pcall(cjson.decode, last or "")
    assert.is_true(ok, out)
    assert.are.same({who = "kiln"}, report.meta)
    local torch_names = {f32 = "torch.float32", f64 = "torch.float64", f16 = "torch.float16", bf16 = "torch.bfloat16",
                         i64 = "torch.int64", i32 = "torch.int32", u8 = "torch.uint8", bool = "torch.bool"}
    for dtype, t in pairs(tensors) do
      assert.are.equal(torch_names[dtype], report[dtype].dtype)
      assert.are.same({t:numel()}, report[dtype].shape)
    end
    assert.are.equal("True", report.bool.values[1])
    assert.are.equal("0.1", report.f64.values[1])
    assert.are.equal(read_file(sd_path), read_file(path_of("torch_mlp.safetensors")), "same names and bytes as PyTorch's")
    assert.are.equal(read_file(all_path), read_file(path_of("torch_dtypes.safetensors")))
    local own, meta = kiln.load(path_of("torch_own.safetensors"))
    assert.are.same({who = "torch"}, meta)
    assert.are.same({{0, 0.25, 0.5, 0.75, 1}, {1.25, 1.5, 1.75, 2, 2.25}}, own.ramp:totable())
    assert.are.same({3, -1}, own.ids:totable())
    assert.are.equal("i64", own.ids:dtype())
    assert.are.same({0.5, -1}, own.half:totable())
    assert.are.same({true, false}, own.mask:totable())
  end)
end)
