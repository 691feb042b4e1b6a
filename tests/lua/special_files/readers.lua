-- Every reader of kiln against files that are not regular files (tests/lua/special_files_spec.lua
-- runs it in a process of its own, under a time limit, since a reader that blocks never returns).
-- usage: kiln readers.lua DIR   (DIR holds fifo, dir and, where it could be made, socket)
-- Prints one line per reader and file: "<reader> <kind>: ok" or "<reader> <kind>: error: <message>".
local dir = arg[1]
local files = {fifo = dir .. "/fifo", dir = dir .. "/dir", device = "/dev/null", socket = dir .. "/socket"}
local readers = {
  ["kiln.load"] = function(p) return kiln.load(p) end,
  ["checkpoint.load"] = function(p) return kiln.checkpoint.load(p) end,
  ["read_idx"] = function(p) return kiln.data.read_idx(p) end,
  ["read_image"] = function(p) return kiln.data.read_image(p) end,
  ["load_wav"] = function(p) return kiln.audio.load_wav(p) end,
  ["metrics.read"] = function(p) return require("kiln.metrics").read(p) end,
  ["metrics.open"] = function(p) return kiln.ui.metrics(p) end,
}
local names = {}
for name in pairs(readers) do names[#names + 1] = name end
table.sort(names)
for _, kind in ipairs{"fifo", "dir", "device", "socket"} do
  local exists = kind ~= "socket" or os.execute("test -S " .. files[kind]) == 0
  if exists then
    for _, name in ipairs(names) do
      local ok, err = pcall(readers[name], files[kind])
      print(string.format("%s %s: %s", name, kind, ok and "ok" or "error: " .. tostring(err)))
      io.stdout:flush()
    end
  end
end
print("done")
