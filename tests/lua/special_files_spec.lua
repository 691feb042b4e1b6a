-- Readers refuse what is not a regular file: a FIFO, a directory, a device or a socket gets an error
-- naming the file and what it is, and no reader blocks on one (a FIFO opened for reading without
-- O_NONBLOCK waits for a writer forever).
local H = require "helpers"

local KIND = {fifo = "a FIFO %(named pipe%)", dir = "a directory", device = "a character device", socket = "a socket"}

describe("readers of special files", function()
  it("name the file and its kind, and never block", function()
    local exe = H.kiln_exe()
    if not exe then pending("not running under the kiln launcher") return end
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir " .. dir .. " && mkdir " .. dir .. "/dir && mkfifo " .. dir .. "/fifo") == 0)
    -- a socket file, where python3 is there to bind one
    os.execute("python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' " .. dir ..
               "/socket 2>/dev/null")
    local script = (debug.getinfo(1, "S").source:match("^@(.*/)") or "tests/lua/") .. "special_files/readers.lua"
    local out = H.capture("timeout 60 " .. exe .. " " .. script .. " " .. dir)
    os.execute("rm -rf " .. dir)
    assert.matches("\ndone\n?$", out)   -- nothing blocked: the script ran to its end
    local n = 0
    for reader, kind, result in out:gmatch("([%w_.]+) (%a+): ([^\n]*)") do
      n = n + 1
      assert.matches("^error: ", result, reader .. " " .. kind)
      if reader == "checkpoint.load" and kind == "dir" then   -- a folder of checkpoints: its newest
        assert.matches("no checkpoint %(ckpt%-<step>%.safetensors%) in " .. dir .. "/dir", result)
        goto next
      end
      local path = kind == "device" and "/dev/null" or dir .. "/" .. kind
      assert.truthy(result:find(path, 1, true), reader .. " " .. kind .. ": the path is not named: " .. result)
      assert.matches(KIND[kind], result, reader .. " " .. kind)
      ::next::
    end
    assert.is_true(n >= 21, out)   -- 7 readers and at least the FIFO, the directory and the device
  end)
end)
