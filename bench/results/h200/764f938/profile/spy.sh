#!/bin/bash
# Profiles the restore phase's gateway and lmcache server with py-spy (raw stacks, idle included).
SPY=$PWD/.stage/py-spy
until G1=$(pgrep -f "adp_gateway serve" | head -1) && [ -n "$G1" ]; do sleep 0.2; done
while kill -0 "$G1" 2>/dev/null; do sleep 0.1; done
until G2=$(pgrep -f "adp_gateway serve" | head -1) && [ -n "$G2" ]; do sleep 0.05; done
until S=$(pgrep -n -f "gpu_lmc.py server") && [ -n "$S" ]; do sleep 0.05; done
echo "spy: gateway $G2 server $S"
$SPY record -p "$G2" -r 200 -d 30 -f raw --threads --idle -o "$OUT/spy-gateway.txt" > "$OUT/spy-gw.log" 2>&1 &
$SPY record -p "$S" -r 200 -d 30 -f raw --threads --idle -o "$OUT/spy-server.txt" > "$OUT/spy-srv.log" 2>&1 &
wait
