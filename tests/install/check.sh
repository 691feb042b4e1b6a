#!/bin/sh
# Installs kiln into a scratch prefix and uses it as a user would, with nothing set by hand:
# bin/kiln --version (its run path finds libkiln), bin/kiln running a script with the installed
# Lua library, a stock luajit's require "kiln", a C program built with kiln.pc's flags, and the
# rockspec's CMake variables.
# usage: sh tests/install/check.sh BUILD_DIR    (ctest's install/prefix)
set -u
build=${1:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
failures=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; echo "$2" | sed 's/^/    /'; failures=$((failures + 1)); }

cmake --install "$build" --prefix "$prefix" >/dev/null || { echo "FAIL - cmake --install"; exit 1; }

# a clean environment: no LD_LIBRARY_PATH, no KILN_* variables, another working directory
clean() { (cd / && env -i PATH=/usr/bin:/bin HOME="$prefix" "$@" 2>&1); }

out=$(clean "$prefix/bin/kiln" --version)
case "$out" in "kiln "*) pass "installed bin/kiln --version" ;; *) fail "installed bin/kiln --version" "$out" ;; esac

out=$(clean "$prefix/bin/kiln" -e 'print(package.searchpath("kiln", package.path)); print(kiln.ones(3):sum():item())')
case "$out" in
  "$prefix/bin/../share/lua/5.1/kiln/init.lua
3") pass "installed bin/kiln runs the installed Lua library" ;;
  *) fail "installed bin/kiln runs the installed Lua library" "$out" ;;
esac

# the libraries libkiln opens at run time lie next to it and load from there (when built)
if [ -f "$build/lib/libkiln_onednn.so" ]; then
  out=$(clean "$prefix/bin/kiln" -e 'kiln.functional.conv2d(kiln.ones(1, 1, 4, 4), kiln.ones(1, 1, 3, 3)) print(kiln.info().onednn.name) print(kiln.conv_choices()[1])')
  case "$out" in
    "oneDNN "*": onednn "*) pass "installed kiln convolves through the installed libkiln_onednn.so" ;;
    *) fail "installed kiln convolves through the installed libkiln_onednn.so" "$out" ;;
  esac
fi
if [ -f "$build/lib/libkiln_mpi.so" ]; then
  if [ -f "$prefix/lib/libkiln_mpi.so" ]; then pass "libkiln_mpi.so installed next to libkiln"
  else fail "libkiln_mpi.so installed next to libkiln" "$(ls "$prefix/lib")"; fi
fi

lua_path="$prefix/share/lua/5.1/?.lua;$prefix/share/lua/5.1/?/init.lua;;"
out=$(clean env LUA_PATH="$lua_path" luajit -e 'local kiln = require "kiln"; print(kiln.version, kiln.tensor{1, 2, 3}:sum():item())')
case "$out" in "0."*"	6") pass "a stock luajit: require \"kiln\"" ;; *) fail "a stock luajit: require \"kiln\"" "$out" ;; esac

cat >"$prefix/hello.c" <<'C'
#include <stdio.h>
#include <kiln/kiln.h>
int main(void) {
  int64_t sizes[1] = {4};
  struct kiln_tensor *t = kiln_tensor_full(1, sizes, 2.5, KILN_F32, (struct kiln_device){KILN_CPU, 0});
  if (!t) { printf("%s\n", kiln_error_message()); return 1; }
  printf("kiln %s: %g\n", kiln_version(), kiln_tensor_get(t, 3));
  kiln_tensor_release(t);
  return 0;
}
C
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs kiln 2>&1)
if cc -o "$prefix/hello" "$prefix/hello.c" $flags -Wl,-rpath,"$prefix/lib" 2>"$prefix/cc.log"; then
  out=$(clean "$prefix/hello")
  case "$out" in "kiln "*": 2.5") pass "a C program built with pkg-config kiln" ;; *) fail "a C program built with pkg-config kiln" "$out" ;; esac
else
  fail "a C program built with pkg-config kiln ($flags)" "$(cat "$prefix/cc.log")"
fi

# The rockspec (LuaRocks' cmake build type): its variables, passed to a configure of their own.
rock=$(ls "$root"/kiln-*.rockspec 2>/dev/null | head -1)
out=$(luajit - "$rock" 2>&1 <<'LUA'
local env = {}
local chunk = assert(loadfile(arg[1]))
setfenv(chunk, env)
chunk()
assert(env.package == "kiln" and env.build.type == "cmake", "a cmake build of package kiln")
for _, k in ipairs{"CMAKE_INSTALL_PREFIX", "KILN_INSTALL_LUADIR", "KILN_INSTALL_LIBDIR"} do
  assert(env.build.variables[k], "variable " .. k)
end
print(env.version)
LUA
)
case "$out" in *-*) pass "the rockspec $(basename "$rock") builds with cmake into the rock's tree" ;; *) fail "the rockspec" "$out" ;; esac

[ "$failures" -eq 0 ] && echo "all install checks passed" && exit 0
echo "$failures install check(s) failed"
exit 1
