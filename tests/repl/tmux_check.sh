#!/usr/bin/env bash
# Drives the real kiln REPL through tmux, as a person at a terminal would: evaluation,
# an error and recovery, Tab completion, Ctrl-C (also in a pure-Lua loop, twice), a multi-line
# function, Ctrl-D and history, and kiln -i after a script's error.
# usage: tests/repl/tmux_check.sh [path/to/kiln]   (default: build/bin/kiln)
# Exits 0 when every check passes (or tmux is missing: skipped), 1 otherwise.
set -u

if ! command -v tmux >/dev/null 2>&1; then
  echo "skip: tmux is not installed"
  exit 0
fi

root=$(cd "$(dirname "$0")/../.." && pwd)
kiln=${1:-$root/build/bin/kiln}
if [ ! -x "$kiln" ]; then
  echo "FAIL: $kiln is not built"
  exit 1
fi
kiln=$(cd "$(dirname "$kiln")" && pwd)/$(basename "$kiln")

home=$(mktemp -d)
# A private tmux server (-L) with no user configuration (-f), so a user's tmux is untouched.
tm() { tmux -L "kiln-check-$$" -f /dev/null "$@"; }
cleanup() {
  tm kill-server >/dev/null 2>&1
  rm -rf "$home"
}
trap cleanup EXIT

failures=0
pass() { echo "ok   - $1"; }
fail() {
  echo "FAIL - $1"
  echo "---- screen ----"
  tm capture-pane -t repl -p -S -60 2>/dev/null | sed '/^$/d'
  echo "----------------"
  failures=$((failures + 1))
}

screen() { tm capture-pane -t repl -p -J -S -200 2>/dev/null; }

# wait_for WHAT GREP-ARGS...: polls the screen for up to 10 s.
wait_for() {
  local what=$1
  shift
  for _ in $(seq 100); do
    if screen | grep -q "$@"; then
      pass "$what"
      return 0
    fi
    sleep 0.1
  done
  fail "$what"
  return 1
}

type_line() {
  tm send-keys -t repl -l "$1"
  tm send-keys -t repl Enter
}

# Clears the screen (readline's Ctrl-L), so that a check sees only what follows.
clear_screen() {
  tm send-keys -t repl C-l
  tm clear-history -t repl
  sleep 0.3
}

# HOME is a fresh directory, so the history goes to $home/.kiln_history; no ~/.inputrc.
tm new-session -d -s repl -x 160 -y 40 \
  "env -u KILN_HISTORY HOME='$home' INPUTRC=/dev/null TERM=xterm '$kiln'; sleep 30"

wait_for "the REPL starts and shows the prompt" -F "kiln> " || exit 1

type_line 'x = 1 + 2'
type_line 'x'
wait_for "x = 1 + 2, then x prints 3" -x "3"

clear_screen
type_line 'error("boom")'
wait_for "error(\"boom\") reports the message" -F "stdin:1: boom"
type_line 'x * 2'
wait_for "the next line still works: x * 2 prints 6" -x "6"

clear_screen
tm send-keys -t repl -l 'kiln.ra'
tm send-keys -t repl Tab
sleep 0.5
tm send-keys -t repl Tab
wait_for "kiln.ra + Tab lists randn among the completions" -E "kiln\.randn( |$)"

clear_screen
tm send-keys -t repl C-c
sleep 0.3
type_line 'x + 100'
wait_for "Ctrl-C at the prompt drops the half-typed line" -x "103"

clear_screen
type_line 'function sq(n)'
type_line '  return n * n'
type_line 'end'
type_line 'sq(12)'
wait_for "a multi-line function definition, then a call: sq(12) prints 144" -x "144"

clear_screen
type_line '?kiln.randn'
wait_for "?kiln.randn prints its help line" -E "^kiln\.randn\(.*normal"

clear_screen
# error() is not compiled by the JIT, so this loop stays where the interrupt hook is seen.
type_line 'while true do pcall(error) end'
sleep 1
tm send-keys -t repl C-c
wait_for "Ctrl-C interrupts a running evaluation" -F "interrupted"
type_line 'x - 1'
wait_for "the REPL continues after the interrupt" -x "2"

clear_screen
# A pure-Lua loop, which the JIT would compile: what is typed runs with the JIT off, so the hook
# stops it; a second Ctrl-C does not end kiln, and the session's variables are still there.
type_line 'keep = 41; n = 0'
type_line 'while true do n = n + 1 end'
sleep 1
tm send-keys -t repl C-c
wait_for "Ctrl-C stops a pure-Lua loop" -F "interrupted"
type_line 'while true do n = n + 1 end'
sleep 1
tm send-keys -t repl C-c
sleep 0.2
tm send-keys -t repl C-c
sleep 0.5
type_line 'keep + 1, n > 0'
wait_for "after two Ctrl-C the REPL is still there with its variables" -E "^42[[:space:]]+true$"

tm send-keys -t repl C-d
# The pane runs "kiln; sleep 30": once kiln has exited, sleep is its command.
exited=0
for _ in $(seq 50); do
  if [ "$(tm display-message -p -t repl '#{pane_current_command}')" = sleep ]; then
    exited=1
    break
  fi
  sleep 0.1
done
[ "$exited" = 1 ] && pass "Ctrl-D ends the REPL" || fail "Ctrl-D ends the REPL"
if [ -s "$home/.kiln_history" ] && grep -qx 'x = 1 + 2' "$home/.kiln_history" \
   && grep -qx 'sq(12)' "$home/.kiln_history"; then
  pass "the history file holds the lines ($(wc -l <"$home/.kiln_history") lines)"
else
  fail "the history file $home/.kiln_history after exit"
  cat "$home/.kiln_history" 2>/dev/null
fi

# kiln -i script.lua: an error in the script is reported, and the REPL starts with its globals.
script=$home/fails.lua
printf 'before = 7\nerror("script failed")\n' >"$script"
tm kill-session -t repl 2>/dev/null
tm new-session -d -s repl -x 160 -y 40 \
  "env -u KILN_HISTORY HOME='$home' INPUTRC=/dev/null TERM=xterm '$kiln' -i '$script'; sleep 30"
wait_for "kiln -i reports the script's error" -F "script failed"
wait_for "and shows the prompt" -F "kiln> "
type_line 'before * 6'
wait_for "with the script's globals" -x "42"
tm send-keys -t repl C-d

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all REPL checks passed"
