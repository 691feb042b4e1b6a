-- LuaRocks: `luarocks make` in this folder builds libkiln and the launcher with CMake and installs
-- them, with the Lua library, into the rock's tree (the Debian packages of scripts/install-deps.sh
-- must be there first: OpenBLAS, zlib, cJSON, readline, LuaJIT's headers). With Debian's luarocks,
-- whose Lua is 5.1 under LuaJIT: luarocks --lua-version 5.1 make LUA_INCDIR=/usr/include/luajit-2.1
package = "kiln"
version = "0.1.0-1"
source = {url = "git+file://."}
description = {
  summary = "Deep learning in LuaJIT over a C runtime: tensors, autograd, nn, optim, data",
  detailed = "kiln: a C runtime (tensors, kernels, autograd) under LuaJIT, with a small Lua library on top.",
}
dependencies = {"lua == 5.1"}   -- LuaJIT
build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    CMAKE_INSTALL_PREFIX = "$(PREFIX)",
    KILN_INSTALL_LUADIR = "$(LUADIR)",
    KILN_INSTALL_LIBDIR = "$(LIBDIR)",
    KILN_CUDA = "OFF",
    KILN_VERSIONED_LIBRARY = "OFF",   -- LuaRocks moves files one by one: no symbolic links
  },
}
