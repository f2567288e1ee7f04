#!/bin/sh
# Used to draw docs/img/timeline.svg:
#   tiderun --standalone --nproc-per-node=4 --max-restarts=2 --file-timer \
#     --events jsonl:run.jsonl examples/timeline_job.sh
#   tide-timeline run.jsonl -o docs/img/timeline.svg --title "tiderun: 4 workers, a crash, a hang, then success"
# A stand-in training job: attempt 0 loses rank 1 to an error it reports the
# way torch's @record does; in attempt 1, rank 2 hangs inside a step guarded
# by an expiration timer and the agent's watchdog kills it; attempt 2 runs.
now() { date +%s.%N; }
case "$TORCHELASTIC_RESTART_COUNT.$LOCAL_RANK" in
  0.1)
    sleep 1.2
    printf '{"message": {"message": "RuntimeError: rank 1 crashed (simulated)", "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "%s"}}}\n' \
      "$(date +%s)" > "$TORCHELASTIC_ERROR_FILE"
    exit 1 ;;
  1.2)
    sleep 0.6
    printf '{"version": 1, "pid": %d, "scope_id": "train_step", "expiration_time": %s, "signal": 9}\n' \
      $$ "$(awk -v t="$(now)" 'BEGIN { printf "%.6f", t + 0.5 }')" > "$TORCHELASTIC_TIMER_FILE"
    sleep 60 ;;
esac
sleep 2
