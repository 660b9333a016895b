#!/bin/sh
# Steady HTTP load, run inside a busybox pod by vagrant/rollout.sh: one request (and one new
# TCP connection) every INTERVAL seconds to URL, until the file STOP_FILE appears.
# Prints a line per failed request and, at the end, "loadgen: sent=N failed=M".
URL="${URL:?}"
INTERVAL="${INTERVAL:-0.02}"
STOP_FILE="${STOP_FILE:-/tmp/stop}"
sent=0
failed=0
while [ ! -e "$STOP_FILE" ]; do
	sent=$((sent + 1))
	if ! out="$(wget -q -T 2 -O /dev/null "$URL" 2>&1)"; then
		failed=$((failed + 1))
		echo "loadgen: FAIL $(date +%H:%M:%S) request=$sent: $out"
	fi
	if [ $((sent % 500)) -eq 0 ]; then
		echo "loadgen: progress sent=$sent failed=$failed"
	fi
	sleep "$INTERVAL"
done
echo "loadgen: sent=$sent failed=$failed"
