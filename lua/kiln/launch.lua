-- kiln.launch: `kiln launch -n N [--hosts h1,h2] [--timeout S] script.lua args...` starts N ranks of
-- kiln running script.lua through Open MPI's mpirun, prefixes every line they print with its rank
-- ("[1] ..."), and ends with one line naming the rank that failed, if one did: mpirun ends the
-- whole job when a rank dies or exits with an error.
local core = require "kiln.core"
local ffi = core.ffi

local M = {}

local USAGE = "usage: kiln launch -n N [--hosts h1,h2,...] [--timeout SECONDS] [--mpirun-arg ARG]... script.lua [args...]"

ffi.cdef [[
long readlink(const char *path, char *buf, size_t size);
int getpid(void);
unsigned int geteuid(void);
]]

local function self_exe()
  local buf = ffi.new("char[4096]")
  local n = ffi.C.readlink("/proc/self/exe", buf, 4095)
  if n <= 0 then return arg and arg[-1] or "kiln" end
  return ffi.string(buf, n)
end

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function which(name)
  for dir in (os.getenv("PATH") or "/usr/bin:/bin"):gmatch("[^:]+") do
    local f = io.open(dir .. "/" .. name, "r")
    if f then f:close() return dir .. "/" .. name end
  end
end

-- Parse the command line; returns opts or nil and a message.
function M.parse(args)
  local o = {n = nil, hosts = nil, timeout = nil, extra = {}, script = nil, args = {}}
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "-n" or a == "--np" or a == "-np" then
      o.n = tonumber(args[i + 1])
      if not o.n or o.n < 1 or o.n ~= math.floor(o.n) then return nil, "launch: -n needs a number of ranks >= 1" end
      i = i + 2
    elseif a == "--hosts" then
      if not args[i + 1] then return nil, "launch: --hosts needs a list (h1,h2 or h1:4,h2:4)" end
      o.hosts = args[i + 1]
      i = i + 2
    elseif a == "--timeout" then
      o.timeout = tonumber(args[i + 1])
      if not o.timeout or o.timeout <= 0 then return nil, "launch: --timeout needs a number of seconds > 0" end
      i = i + 2
    elseif a == "--mpirun-arg" then
      if not args[i + 1] then return nil, "launch: --mpirun-arg needs an argument" end
      o.extra[#o.extra + 1] = args[i + 1]
      i = i + 2
    elseif a == "-h" or a == "--help" then
      return nil, USAGE
    elseif a:sub(1, 1) == "-" then
      return nil, "launch: unknown option " .. a .. "\n" .. USAGE
    else
      o.script = a
      for k = i + 1, #args do o.args[#o.args + 1] = args[k] end
      break
    end
  end
  if not o.n then return nil, "launch: give the number of ranks with -n\n" .. USAGE end
  if not o.script then return nil, "launch: no script given\n" .. USAGE end
  return o
end

-- The mpirun command line for opts.
function M.command(o, mpirun)
  -- mpi_yield_when_idle: a rank waiting in a collective gives its core away instead of spinning on
  -- it, which matters when the ranks' computing threads and their communication threads share cores
  local parts = {quote(mpirun), "-np", tostring(o.n), "--tag-output", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1",
                 "-x", "KILN_LAUNCHED=1"}
  if ffi.C.geteuid() == 0 then parts[#parts + 1] = "--allow-run-as-root" end
  if o.hosts then parts[#parts + 1] = "--host" parts[#parts + 1] = quote(o.hosts) end
  if o.timeout then parts[#parts + 1] = "-x" parts[#parts + 1] = quote("KILN_DIST_TIMEOUT=" .. o.timeout) end
  for _, e in ipairs(o.extra) do parts[#parts + 1] = quote(e) end
  parts[#parts + 1] = quote(self_exe())
  parts[#parts + 1] = quote(o.script)
  for _, a in ipairs(o.args) do parts[#parts + 1] = quote(a) end
  return table.concat(parts, " ")
end

-- The first failed rank and why, noted in st as the job's output comes in: a rank's own error
-- message ("kiln: ...") or a signal is specific; mpirun's report that a rank called MPI_Abort is
-- generic, and gives way to that rank's specific reason when it arrives later (the two come through
-- different channels, and the abort can overtake the message that caused it). Else the first wins.
function M.note_failure(st, rank, reason, generic)
  if st.failed and not (st.generic and not generic and st.failed == rank) then return end
  st.failed, st.reason, st.generic = rank, reason, generic
end

-- main(argv): argv[1..] are the words after `kiln launch`.
function M.main(argv)
  local words = {}
  for i = 1, #(argv or {}) do words[i] = argv[i] end
  local o, err = M.parse(words)
  if not o then
    io.stderr:write(err, "\n")
    return err == USAGE and 0 or 2
  end
  local mpirun = which("mpirun")
  if not mpirun then
    io.stderr:write("kiln launch: mpirun not found; install Debian's openmpi-bin (sudo apt-get install openmpi-bin)\n")
    return 2
  end
  local status_file = os.tmpname()
  local cmd = "sh -c " .. quote(M.command(o, mpirun) .. " 2>&1; echo $? > " .. quote(status_file))
  local pipe = assert(io.popen(cmd, "r"))
  local st, in_banner = {}, false
  for line in pipe:lines() do
    local rank, stream, text = line:match("^%[%d+,(%d+)%]<(%a+)>:(.*)$")
    if rank then
      local out = stream == "stderr" and io.stderr or io.stdout
      out:write("[", rank, "] ", text, "\n")
      out:flush()
      if stream == "stderr" and text:match("^kiln: ") then M.note_failure(st, tonumber(rank), text:sub(7), false) end
    elseif line:match("^%-%-%-%-%-%-%-%-%-%-") then
      in_banner = not in_banner   -- mpirun's own boxed reports: read, summarised below
    else
      local r, sig = line:match("process rank (%d+) with PID %d+ on node %S+ exited on signal (%d+)")
      if r then M.note_failure(st, tonumber(r), "killed by signal " .. sig, false) end
      local ar = line:match("MPI_ABORT was invoked on rank (%d+)")
      if ar then M.note_failure(st, tonumber(ar), "it ended the job (MPI_Abort)", true) end
      local chatter = line:match("^%[[%w%.%-]+:%d+%] ")   -- mpirun's own notes ("[host:pid] ...")
      if not in_banner and not chatter and not line:match("^%s*$") and not r then io.stderr:write(line, "\n") end
    end
  end
  pipe:close()
  local f = io.open(status_file, "r")
  local code = f and tonumber(f:read("*l")) or 1
  if f then f:close() end
  os.remove(status_file)
  if code ~= 0 then
    if st.failed then
      io.stderr:write(string.format("kiln launch: rank %d failed: %s; the job was stopped (exit %d)\n", st.failed, st.reason, code))
    else
      io.stderr:write(string.format("kiln launch: the job failed (mpirun exit %d)\n", code))
    end
  end
  return code
end

return M
