#!/bin/bash
# Moves every gateway whose config says "cpu_nice: 18" (the marked contender) into the idle cgroup.
while true; do
  for pid in $(pgrep -f "adp_gateway serve"); do
    cfg=$(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null | grep -o -- "--config [^ ]*" | cut -d' ' -f2)
    if [ -n "$cfg" ] && grep -q "cpu_nice: 18" "$cfg" 2>/dev/null; then
      if ! grep -qx "$pid" /sys/fs/cgroup/cpu/adp-idle/cgroup.procs; then
        echo $pid > /sys/fs/cgroup/cpu/adp-idle/cgroup.procs && echo "$(date +%T) moved $pid"
      fi
    fi
  done
  sleep 0.2
done
