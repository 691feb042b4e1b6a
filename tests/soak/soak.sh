#!/bin/sh
# tests/soak/soak.sh: the main job under repeated kill -9, resumed from its checkpoints each time.
# Not run by CI (make test); run it by hand for as long as wanted:
#   sh tests/soak/soak.sh [MINUTES] [KILN]     (defaults: 30 minutes, build/bin/kiln)
# 1. An uninterrupted reference run of examples/fashion_mnist.lua (LeNet, checkpoints every
#    CHECKPOINT_EVERY steps), sampling its resident memory, open file descriptors and threads.
# 2. Rounds of the same run killed with SIGKILL at random moments and resumed with --resume until
#    it ends, each round's final parameters compared with the reference's, until MINUTES pass.
# 3. Checks: the final parameters equal the reference's bit for bit; resident memory after the
#    first epoch grows by less than 5%; file descriptors and threads at the end are no more than after
#    the first epoch (one more file for the moment a checkpoint is written is not a leak).
# Prints one JSON line of figures and exits non-zero when a check fails.
set -u
MINUTES=${1:-30}
KILN=${2:-build/bin/kiln}
EPOCHS=${SOAK_EPOCHS:-4}
LIMIT=${SOAK_LIMIT:-24000}
CHECKPOINT_EVERY=${SOAK_CHECKPOINT_EVERY:-60}
DIR=$(mktemp -d /tmp/kiln-soak-XXXXXX)
ARGS="examples/fashion_mnist.lua --model lenet --epochs $EPOCHS --limit $LIMIT --threads 2 --seed 3 --checkpoint-every $CHECKPOINT_EVERY"
cd "$(dirname "$0")/../.."

# 1. the reference, sampled every second
$KILN $ARGS --checkpoint "$DIR/ref" > "$DIR/ref.log" 2>&1 &
pid=$!
: > "$DIR/samples"
while kill -0 $pid 2>/dev/null; do
  if [ -r /proc/$pid/status ]; then
    rss=$(awk '/^VmRSS/ {print $2}' /proc/$pid/status 2>/dev/null)
    thr=$(awk '/^Threads/ {print $2}' /proc/$pid/status 2>/dev/null)
    fds=$(ls /proc/$pid/fd 2>/dev/null | wc -l)
    epoch=$(grep -c "^epoch [0-9]*: train loss" "$DIR/ref.log")
    [ -n "$rss" ] && echo "$epoch $rss $thr $fds $(date +%s)" >> "$DIR/samples"
  fi
  sleep 1
done
wait $pid || { echo "soak: the reference run failed:"; tail -20 "$DIR/ref.log"; exit 1; }

# 2. rounds until MINUTES pass: the same run from scratch, killed with SIGKILL at random moments
#    (between 0.5 s and 70% of the reference's duration after each start) and resumed, until it ends
duration=$(awk 'NR == 1 { t0 = $5 } { t = $5 } END { print (t - t0 > 2 ? t - t0 : 2) }' "$DIR/samples")
start=$(date +%s)
rounds=0
runs=0
kills=0
failed=0
while [ $rounds -eq 0 ] || [ $(( $(date +%s) - start )) -lt $((MINUTES * 60)) ]; do
  rounds=$((rounds + 1))
  rm -rf "$DIR/soak"
  while :; do
    runs=$((runs + 1))
    $KILN $ARGS --checkpoint "$DIR/soak" --resume >> "$DIR/soak.log" 2>&1 &
    pid=$!
    sleep $(awk -v s="$runs$$" -v d="$duration" 'BEGIN { srand(s); printf "%.1f", 0.5 + rand() * d * 0.7 }')
    if kill -0 $pid 2>/dev/null; then
      kill -9 $pid
      wait $pid 2>/dev/null
      kills=$((kills + 1))
      continue
    fi
    wait $pid || { echo "soak: a resumed run failed:"; tail -20 "$DIR/soak.log"; exit 1; }
    break
  done
  # the final parameters against the reference's, bit for bit
  same=$($KILN -e "
    local a = kiln.load((kiln.checkpoint.latest('$DIR/ref')))
    local b = kiln.load((kiln.checkpoint.latest('$DIR/soak')))
    local n, same = 0, true
    for k, t in pairs(a) do
      n = n + 1
      local u = b[k]
      if not u or u:numel() ~= t:numel() or u:dtype() ~= t:dtype() then same = false
      elseif t:dtype() == 'f32' or t:dtype() == 'f64' then
        if t:view(-1):ne(u:view(-1)):sum():item() ~= 0 then same = false end
      end
    end
    for k in pairs(b) do if not a[k] then same = false end end
    print(same and n > 0)")
  [ "$same" = "true" ] || failed=$((failed + 1))
done
same=$([ $failed -eq 0 ] && echo true || echo false)

# 3. the figures and checks
figures=$(awk -v rounds=$rounds -v runs=$runs -v kills=$kills -v same="$same" '
  $1 >= 1 { if (!base) { base = $2; thr0 = $3; fd0 = $4 } if ($2 > rss) rss = $2; if ($3 > thr) thr = $3; if ($4 > fd) fd = $4
             thr_end = $3; fd_end = $4 }
  END { growth = base ? (rss - base) / base : 0
        printf "{\"rounds\":%d,\"runs\":%d,\"kills\":%d,\"bitwise_equal\":%s,\"rss_after_epoch1_kb\":%d,\"rss_max_kb\":%d,\"rss_growth\":%.4f,\"threads_after_epoch1\":%d,\"threads_max\":%d,\"threads_end\":%d,\"fds_after_epoch1\":%d,\"fds_max\":%d,\"fds_end\":%d}\n",
               rounds, runs, kills, same, base, rss, growth, thr0, thr, thr_end, fd0, fd, fd_end
        # a leak grows and stays; a checkpoint being written holds one more file for a moment
        exit !(same == "true" && growth < 0.05 && thr_end <= thr0 && fd_end <= fd0 && fd <= fd0 + 1) }' "$DIR/samples")
status=$?
echo "$figures"
[ $status -eq 0 ] && rm -rf "$DIR" || echo "soak: kept $DIR"
exit $status
