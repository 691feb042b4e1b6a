#!/bin/sh
# tests/gpu/prepare.sh: run on a build machine (Debian 12 with its archive reachable), once, before
# a GPU run. The GPU machine has nvcc, CMake, gcc and PyTorch but no LuaJIT, OpenBLAS, busted or
# any Debian package, and no network: this downloads those packages with `apt-get download` and
# unpacks them with `dpkg -x` into shared/gpu-deps/ (ignored by git, copied along with the
# checkout), where tests/gpu/run.sh finds them. Nothing is installed on this machine.
#   sh tests/gpu/prepare.sh [DEST]        (DEST defaults to shared/gpu-deps)
set -e
cd "$(dirname "$0")/../.."
DEST=${1:-shared/gpu-deps}

# kiln's own list (scripts/install-deps.sh), less the tools the GPU machine has or does not need
# and the examples' data (fortunes, bible-kjv, espeak-ng: no GPU check uses them), plus pkgconf for CMake's
# FindPkgConfig; then, until nothing new turns up, the libraries and Lua modules each depends on
# (the first of alternatives), less what every Linux has.
WANTED=$(sed -n '/^PACKAGES="/,/"$/p' scripts/install-deps.sh | sed 's/^PACKAGES=//' | tr -d '"\\' | tr ' ' '\n' |
         grep -vE '^(build-essential|cmake|pkg-config|tmux|clang|libclang.*|dataset-.*|fortunes|bible-kjv|espeak-ng|)$')
WANTED="$WANTED libopenblas-pthread-dev pkgconf libtinfo6"
BASE=" libc6 libc6-dev libc-dev libgcc-s1 libstdc++6 gcc-12-base dpkg install-info libncurses-dev libncurses6 tar "

# Direct dependencies of one package: library, Lua and LuaJIT packages, first of each alternative.
deps_of() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances "$1" |
    awk '/^ *\|Depends:/ { if (!alt) print $2; alt = 1; next }
         /^ *Depends:/ { if (!alt) print $2; alt = 0; next }' |
    grep -E '^(lib|lua|zlib|pkgconf|readline-common)' | grep -v '^<'
}

todo=$WANTED
ALL=" "
while [ -n "$(echo $todo)" ]; do
  next=""
  for p in $todo; do
    case "$ALL$BASE" in *" $p "*) continue ;; esac
    ALL="$ALL$p "
    next="$next $(deps_of "$p" | tr '\n' ' ')"
  done
  todo=$next
done
PACKAGES=$(echo $ALL)
[ -n "$PACKAGES" ] || { echo "prepare.sh: no packages found (run apt-get update?)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "prepare.sh: downloading $PACKAGES"
(cd "$tmp" && apt-get download $PACKAGES >/dev/null 2>&1) || (cd "$tmp" && apt-get download $PACKAGES)

rm -rf "$DEST"
mkdir -p "$DEST"
for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$DEST"; done
(cd "$tmp" && ls *.deb) > "$DEST/PACKAGES"
# Static archives (58 MB of OpenBLAS alone), documentation and manual pages are not needed there.
find "$DEST" -name '*.a' -exec rm -f {} +
rm -rf "$DEST/usr/share/doc" "$DEST/usr/share/man" "$DEST/usr/share/info" "$DEST/usr/share/lintian"
# Links into the real root (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) must stay inside DEST.
find "$DEST" -type l -lname '/*' | while read -r link; do
  ln -sf "$(realpath -m --relative-to="$(dirname "$link")" "$DEST$(readlink "$link")")" "$link"
done
# Debian's maintainer scripts would have made these links (update-alternatives).
lib="$DEST/usr/lib/x86_64-linux-gnu"
# kiln links libopenblas alone, so OpenBLAS's separate BLAS and LAPACK libraries stay behind (7 MB).
rm -f "$lib"/openblas-pthread/libblas.so* "$lib"/openblas-pthread/liblapack.so*
[ -e "$lib/openblas-pthread/libopenblas.so.0" ] && ln -sf "openblas-pthread/libopenblas.so.0" "$lib/libopenblas.so.0"
[ -e "$DEST/usr/bin/luajit" ] || ln -sf "$(cd "$DEST/usr/bin" && ls luajit-2.1* | head -n 1)" "$DEST/usr/bin/luajit"
# Every link, so that run.sh can make them again if the copy to the GPU machine drops links.
(cd "$DEST" && find . -type l -printf '%p %l\n') > "$DEST/LINKS"
echo "prepare.sh: $(wc -l < "$DEST/PACKAGES") packages unpacked into $DEST ($(du -sh "$DEST" | cut -f1))"
# The checkout travels to the GPU machine with shared/ in it, 64 MiB in all: keep well under that.
kib=$(du -sk "$DEST" | cut -f1)
tracked=$(git ls-files -z 2>/dev/null | du -ck --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
if [ $((kib + ${tracked:-0})) -gt $((60 * 1024)) ]; then
  echo "prepare.sh: $DEST ($kib KiB) and the tracked files (${tracked:-?} KiB) exceed 60 MiB; the copy to the GPU machine takes 64 MiB in all" >&2
  exit 1
fi
