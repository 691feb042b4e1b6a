-- kiln.dist: a job of several processes, started by `kiln launch` or `mpirun`: process groups and
-- collectives (kiln.dist.collectives), data parallelism and sharded optimizer state
-- (kiln.dist.data_parallel), model-parallel layers (kiln.dist.model_parallel) and the scaling model
-- (kiln.dist.simulate), under one name. docs/distributed.md.
local collectives = require "kiln.dist.collectives"
local data_parallel = require "kiln.dist.data_parallel"
local model_parallel = require "kiln.dist.model_parallel"
local simulate = require "kiln.dist.simulate"

local M = {}
for _, part in ipairs{collectives, data_parallel, model_parallel, simulate} do
  for k, v in pairs(part) do if k ~= "need_init" then M[k] = v end end
end
return M
