#!/bin/sh
# Installs the Debian 12 packages kiln builds and runs with, when they are missing.
# Uses sudo when not root. Nothing is fetched from anywhere but Debian's archive.
# With --test: the packages only the tests need (nbformat checks the notebooks kiln nb writes,
# headless Chromium looks at its reports), so that `make demo` does not pull in a browser.
set -e
PACKAGES="build-essential cmake pkg-config luajit libluajit-5.1-dev libopenblas-dev zlib1g-dev libstb-dev \
lua-busted libreadline-dev tmux dataset-fashion-mnist libcjson-dev lua-cjson lua-filesystem clang libclang-rt-14-dev \
fortunes bible-kjv espeak-ng openmpi-bin libopenmpi-dev libdnnl-dev"
[ "$1" = "--test" ] && PACKAGES="python3-nbformat chromium"   # what only the tests use (make test, not make demo)
missing=""
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "kiln: installing$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y --no-install-recommends $missing || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends $missing; }
