#!/usr/bin/env bash
# Run pipeline steps on the offline H200 host in the background and report on them in short
# remote commands: the host stays up only 30 s between commands and a command may run 10
# minutes at most (lab/gpu_host.md). Run from the checkout's root on the host, after the bundle is in.
#
#   bash lab/gpu/h200.sh install                    unpack the bundle (.gpu) into /tmp/site
#   bash lab/gpu/h200.sh start GROUP...             copy the checkout to /tmp/w/repo and run the
#                                                   groups one after the other, detached; the lanes
#                                                   of a group (joined by +) run side by side, the
#                                                   steps of a lane (joined by ,) one by one
#   bash lab/gpu/h200.sh unpack PREFIX...           put carried parts (PREFIX.partNN: a run's synth
#                                                   journal) into /tmp/w/repo, before start
#   bash lab/gpu/h200.sh poll [SECONDS [--step-end]]
#                                                   wait until the plan ends or SECONDS pass (or,
#                                                   with --step-end, a step ends), then print its
#                                                   status (default 540)
#   bash lab/gpu/h200.sh collect [--synth RUN...] [--drafters RUN...]
#                                                   pack the figures into $OUT/h200-results.tar.xz
#                                                   (and those runs' synth answers / drafters)
#
# Steps are the functions of lab/gpu/steps.sh, e.g.
#   bash lab/gpu/h200.sh start facts smoke,eff+quality_synth
set -euo pipefail
W=${W:-/tmp/w}
cmd=${1:?usage: h200.sh install|start|poll|collect}; shift
case $cmd in
  install)
    bash .gpu/s/install.sh .gpu
    ;;
  start)
    . .gpu/s/env.sh
    [ -f "$W/plan.pid" ] && kill -0 "$(cat "$W/plan.pid")" 2>/dev/null \
      && { echo "a plan is still running (pid $(cat "$W/plan.pid"))" >&2; exit 1; }
    mkdir -p "$W/repo"
    # A copy: the remote command's own tree is replaced by every later command.
    tar --exclude=./.gpu --exclude=./results --exclude=./.snakemake -cf - . | tar -xf - -C "$W/repo"
    cd "$W/repo"
    python3 lab/gpu/entry_points.py src  # the package's vLLM plugins, run from its source
    setsid nohup bash lab/gpu/steps.sh "$@" > "$W/plan.log" 2>&1 < /dev/null &
    echo $! > "$W/plan.pid"
    echo "plan started (pid $(cat "$W/plan.pid")): $*"
    ;;
  unpack)
    # Carried parts (a run's synth journal from `collect --synth`: PREFIX.part00, ...) into the
    # copy the plan runs in; `start` copies the checkout over it and leaves results/ alone.
    mkdir -p "$W/repo"
    for prefix in "$@"; do
      cat "$prefix".part* | tar -xJf - -C "$W/repo"
      echo "unpacked $(basename "$prefix")"
    done
    ;;
  poll)
    limit=${1:-540}; t=0
    # --step-end: return as soon as a step ends too, so that what it made (a drafter) can be
    # copied off in the same command, before a later step or a lost host can take it.
    ended() { cat "$W/status.log" 2>/dev/null | grep -cE " (ok|FAIL rc=[0-9]+) [0-9]+ s$" || true; }
    step_end=; [ "${2:-}" = --step-end ] && step_end=1
    before=$(ended)
    while [ "$t" -lt "$limit" ] && kill -0 "$(cat "$W/plan.pid")" 2>/dev/null; do
      [ -n "$step_end" ] && [ "$(ended)" != "$before" ] && break
      sleep 5; t=$((t + 5))
    done
    kill -0 "$(cat "$W/plan.pid")" 2>/dev/null && echo "== running" || echo "== plan ended"
    echo "== steps"; cat "$W/status.log" 2>/dev/null || true
    for f in "$W"/logs/*.log; do
      [ -f "$f" ] || continue
      echo "== $(basename "$f") (last lines)"; tail -n 4 "$f" | cut -c1-300
    done
    echo "== gpu"; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader || true
    echo "== disk"; df -h /tmp | tail -1
    ;;
  collect)
    python3 lab/gpu/pack_results.py "$W" "${OUT:?}/h200-results.tar.xz" "$@"
    ;;
  *)
    echo "unknown command $cmd" >&2; exit 2
    ;;
esac
