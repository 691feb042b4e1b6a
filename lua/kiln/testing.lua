-- kiln.testing: busted assertions for kiln tensors. `require "kiln.testing"` in a spec adds
-- assert.gradcheck(fn, inputs [, opts]), built on kiln.autograd.gradcheck.
local autograd = require "kiln.autograd"
local say = require "say"
local luassert = require "luassert"

local function gradcheck(state, args)
  local ok, report = autograd.gradcheck(args[1], args[2], args[3])
  state.failure_message = report
  return ok
end

say:set("assertion.gradcheck.positive", "Expected backward to match finite differences:\n%s")
say:set("assertion.gradcheck.negative", "Expected backward not to match finite differences:\n%s")
luassert:register("assertion", "gradcheck", gradcheck, "assertion.gradcheck.positive", "assertion.gradcheck.negative")

return {}
