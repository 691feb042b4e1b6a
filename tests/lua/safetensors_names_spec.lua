-- The safetensors header is UTF-8 JSON: names are checked as such (valid UTF-8, no NUL, no key
-- given twice) on load, and on save. Files written by hand, byte by byte.
local kiln = require "kiln"

local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)

local function le64(v) local b = {} for i = 1, 8 do b[i] = v % 256 v = math.floor(v / 256) end return string.char(unpack(b)) end

-- A safetensors file of one header text and 4 bytes of data (one f32: 1.5).
local function file(name, header)
  local path = dir .. "/" .. name
  local f = assert(io.open(path, "wb"))
  f:write(le64(#header), header, "\0\0\192\63")
  f:close()
  return path
end

local function entry(key, fields)
  return '{' .. key .. ':{' .. (fields or '"dtype":"F32","shape":[1],"data_offsets":[0,4]') .. '}}'
end

describe("safetensors names", function()
  it("refuses a NUL, invalid UTF-8 and a field given twice, naming the file and the place", function()
    local cases = {
      {"nul.safetensors", entry('"ab\\u0000cd"'), "holds a NUL %(\\u0000 at file offset 12%)"},
      {"latin1.safetensors", entry('"caf\233"'), "not valid UTF%-8 at file offset 13 %(byte E9%)"},
      {"overlong.safetensors", entry('"\192\175"'), "not valid UTF%-8 at file offset 10"},
      {"surrogate.safetensors", entry('"\237\160\128"'), "not valid UTF%-8 at file offset 10"},
      {"twice.safetensors", entry('"w"', '"dtype":"F32","shape":[1],"dtype":"I32","data_offsets":[0,4]'),
       'entry "w": the field "dtype" appears twice'},
      {"twice_meta.safetensors", '{"__metadata__":{"k":"a","k":"b"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
       '"__metadata__": the key "k" appears twice'},
      {"twice_name.safetensors", '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},' ..
       '"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 'the entry "w" appears twice'},
    }
    for _, c in ipairs(cases) do
      local path = file(c[1], c[2])
      local ok, err = pcall(kiln.load, path)
      assert.is_false(ok, c[1])
      assert.truthy(tostring(err):find(path, 1, true), tostring(err))
      assert.matches(c[3], tostring(err), c[1])
    end
  end)

  it("reads UTF-8 names, and a backslash before u0000 as text", function()
    local t = kiln.load(file("utf8.safetensors", entry('"poids_é_🙂"')))
    assert.are.equal(1.5, t["poids_é_🙂"]:item())
    t = kiln.load(file("escaped.safetensors", entry('"a\\\\u0000"')))   -- the name is a\u0000, six characters
    assert.are.equal(1.5, t["a\\u0000"]:item())
  end)

  it("refuses to save a name that is not UTF-8", function()
    local path = dir .. "/bad_name.safetensors"
    local ok, err = pcall(kiln.save, path, {["caf\233"] = kiln.ones(1)})
    assert.is_false(ok)
    assert.matches("is not valid UTF%-8 %(at byte 3%)", tostring(err))
    assert.is_nil(io.open(path))   -- nothing written
    kiln.save(path, {["café"] = kiln.ones(1)})
    assert.are.equal(1, kiln.load(path)["café"]:item())
  end)
end)
