#!/usr/bin/env bash
# tide's RPC against torch.distributed.rpc (Debian's python3-torch 1.13.1,
# TensorPipe backend) and against the physical limits, measured in one run.
# Builds rpc_bench and rpc_phys optimised (Release, in build-bench/ unless
# BUILD_DIR says otherwise), then runs --reps rounds (default 3), each of:
#
#   phys   rpc_phys: TCP_NODELAY ping-pong of 64 B (where the scheduler puts
#          the ends, then with both ends polling, then both on CPU 0, then on
#          CPUs 0 and 1), one-way TCP throughput of 1 GiB, memcpy of 64 MiB
#   tide   rpc_bench, both ranks on 127.0.0.1 (its choice of transport), then
#          rpc_bench --transport tcp (TCP forced)
#   torch  /usr/bin/python3 bench/peers/torch_rpc_peer.py (TensorPipe's choice)
#   tide-py the same Python program on tide's backend of torch.distributed.rpc
#          (torch_rpc_peer.py --backend tide, tide.torch_rpc from BUILD_DIR/python)
#
# interleaved (phys, tide, torch, tide-py, phys, ...) so that noise hits every side
# alike. Each side measures rank 0 calling rank 1: rpc_sync no-op round trips
# (median, p99), rpc_async no-op calls/s with 64 and 256 outstanding, echo of
# a 1 MiB and a 64 MiB float32 tensor (round trip, bytes each way per second),
# RRefs (remote()+to_here(), a proxy call, passing one on) and the
# model-parallel training step of shared/peers/rpc/dist_autograd_bench.py
# (distributed autograd and optimizer, two variants).
# Prints a markdown table of the medians across rounds, torch/tide (how many
# times faster tide is) and tide against the limits (bench/rpc/summarize.py),
# then RESULT lines. A round takes about 15 s on 2 cores plus rpc_bench's
# time (torch is 10 s of it), --netns rounds a little more.
#
# --netns: the same comparison between two "hosts": network namespaces
# tiderpc<pid>-a (10.201.0.1, the driving rank 0) and -b (10.201.0.2, the
# serving rank 1) joined by a veth pair, everything over TCP. Needs root (ip
# netns); the namespaces are deleted on exit. There torch runs with
# --transport uv --channel mpt_uv, what TensorPipe picks between two real
# hosts: left to choose, it moves tensors with its cma channel
# (process_vm_readv), usable because both namespaces share one kernel and PID
# namespace, so the 64 MiB echo would not touch the network. torch also binds
# where the host name resolves (here 127.0.0.1, unreachable from the other
# namespace): TP_SOCKET_IFNAME (TensorPipe) and GLOO_SOCKET_IFNAME (the Gloo
# group init_rpc creates) name the veth instead; without them rank 0 fails
# with "connect [127.0.0.1]:PORT: Connection refused".
#
# Needs /usr/bin/python3 with Debian's python3-torch (apt-get install
# python3-torch; the python3 first on PATH may lack torch), python3 for the
# summary, iproute2 and root for --netns.
#
#   bench/rpc/run.sh [--reps 5] [--json out.jsonl]
#   bench/rpc/run.sh --netns --reps 3
#   BUILD_DIR=build-rpc bench/rpc/run.sh --no-build
#
# Exit status: 0; 1 if a run failed (the table shows what the others
# measured); 2 on bad arguments or a missing prerequisite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
torch_python=/usr/bin/python3
torch_peer="$root/bench/peers/torch_rpc_peer.py"
summarize="$root/bench/rpc/summarize.py"
run_timeout=300  # seconds for one run of one side; a hang fails that run

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

reps=3
json=""
do_build=1
netns=0
while (($# > 0)); do
  case "$1" in
    --reps) reps="${2:?--reps needs a value}"; shift 2 ;;
    --json) json="${2:?--json needs a file}"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --netns) netns=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
if ! [[ "$reps" =~ ^[1-9][0-9]*$ ]]; then
  echo "run.sh: --reps expects a positive integer, got '$reps'" >&2
  exit 2
fi
if ! "$torch_python" -c 'import torch.distributed.rpc' 2> /dev/null; then
  echo "run.sh: $torch_python cannot import torch.distributed.rpc;" \
    "apt-get install python3-torch" >&2
  exit 2
fi

if ((do_build)); then
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    generator=()
    if command -v ninja > /dev/null; then
      generator=(-G Ninja)
    fi
    cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
  fi
  cmake --build "$build" -j2 --target rpc_bench rpc_phys tide_torch_rpc_module
fi
rpc_bench="$build/bench/rpc_bench"
phys="$build/bench/rpc_phys"
for bin in "$rpc_bench" "$phys"; do
  if [[ ! -x "$bin" ]]; then
    echo "run.sh: $bin is missing (build it, or drop --no-build)" >&2
    exit 2
  fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/tide-rpc-bench.XXXXXX")"
results="$work/results.jsonl"
: > "$results"
ns_a=""
ns_b=""
driver_pid=""  # the measuring end running now, if any
server_pid=""  # the serving end running now, if any

# Every run is `timeout ... command`, and timeout puts itself in a process
# group of its own: TERM to that group reaches the command and its children
# (torch's spawned ranks). timeout goes on to KILL them 10 s later if needed.
stop() {
  kill -TERM -- "-$1" 2> /dev/null || true
}

cleanup() {
  for pid in "$driver_pid" "$server_pid"; do
    if [[ -n "$pid" ]]; then
      stop "$pid"
      wait "$pid" 2> /dev/null || true
    fi
  done
  for ns in "$ns_a" "$ns_b"; do
    if [[ -n "$ns" ]]; then
      ip netns del "$ns" 2> /dev/null || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

failures=0
setup=local
if ((netns)); then
  setup=netns
fi

# Runs one measuring command; its stdout's JSON lines, tagged with the run,
# the rep and the setup, go to $results (and to stderr, to show progress).
# A failed run counts in $failures and the round goes on. The command runs in
# the background so that INT and TERM reach this script's trap at once.
collect() {
  local run="$1" rep="$2"
  shift 2
  local out="$work/out" status=0
  timeout --kill-after=10 "$run_timeout" "$@" > "$out" &
  driver_pid=$!
  wait "$driver_pid" || status=$?
  driver_pid=""
  local line
  while IFS= read -r line; do
    if [[ "$line" == "{"* ]]; then
      line="{\"run\":\"$run\",\"rep\":$rep,\"setup\":\"$setup\",${line#\{}"
      echo "$line" >> "$results"
      echo "  $line" >&2
    elif [[ -n "$line" ]]; then
      echo "run.sh: $run: not a JSON line on stdout: $line" >&2
    fi
  done < "$out"
  if ((status != 0)); then
    echo "run.sh: $run, rep $rep: failed (exit status $status): $*" >&2
    failures=$((failures + 1))
  fi
}

# Starts a serving command in the background (its stdout goes to stderr:
# only the measuring end reports), for collect_pair.
serve() {
  timeout --kill-after=10 "$run_timeout" "$@" >&2 &
  server_pid=$!
}

# collect for the measuring end of a pair started by serve. Then the serving
# end must exit by itself within 30 s; it is stopped at once if the measuring
# end failed.
collect_pair() {
  local before="$failures"
  collect "$@"
  if ((failures != before)); then
    stop "$server_pid"
  fi
  local tenths=0
  while kill -0 "$server_pid" 2> /dev/null && ((tenths < 300)); do
    sleep 0.1
    tenths=$((tenths + 1))
  done
  local hung=0 status=0
  if kill -0 "$server_pid" 2> /dev/null; then
    hung=1
    stop "$server_pid"
  fi
  wait "$server_pid" || status=$?
  server_pid=""
  if ((failures == before && hung)); then
    echo "run.sh: $1, rep $2: the serving end did not exit within 30 s" \
      "of the measuring one; stopped it" >&2
    failures=$((failures + 1))
  elif ((failures == before && status != 0)); then
    echo "run.sh: $1, rep $2: the serving end failed (exit status $status)" >&2
    failures=$((failures + 1))
  fi
}

if ((netns)); then
  if ! command -v ip > /dev/null; then
    echo "run.sh: --netns needs ip (apt-get install iproute2)" >&2
    exit 2
  fi
  for side in a b; do
    ns="tiderpc$$-$side"
    if ! err="$(ip netns add "$ns" 2>&1)"; then
      echo "run.sh: --netns needs network namespaces (root, CAP_SYS_ADMIN):" \
        "ip netns add $ns: $err" >&2
      exit 2
    fi
    if [[ "$side" == a ]]; then ns_a="$ns"; else ns_b="$ns"; fi
  done
  # Interface names are per namespace: the same pair of names in every run.
  ip link add veth-a netns "$ns_a" type veth peer name veth-b netns "$ns_b"
  ip -n "$ns_a" addr add 10.201.0.1/24 dev veth-a
  ip -n "$ns_b" addr add 10.201.0.2/24 dev veth-b
  for ns in "$ns_a" "$ns_b"; do
    ip -n "$ns" link set lo up
  done
  ip -n "$ns_a" link set veth-a up
  ip -n "$ns_b" link set veth-b up
  echo "run.sh: namespaces $ns_a (10.201.0.1) and $ns_b (10.201.0.2)" >&2
  # Two hosts: tide's workers admit another host's only with a shared
  # secret (docs/security.md); torch reads none.
  export TIDE_RPC_TOKEN="bench-$$-$RANDOM"
fi

port=29800  # a new one for every pair: fresh namespaces have them all free
next_port() {
  port=$((port + 1))
}
host_a=10.201.0.1  # the driver's (rank 0's) namespace
host_b=10.201.0.2  # the server's (rank 1's)
in_a=(ip netns exec "$ns_a")
in_b=(ip netns exec "$ns_b")

# phys_pair RUN REP "MODE [FLAGS]" [LISTENING_CPU CONNECTING_CPU]: a TCP
# mode of phys from namespace a (measuring) to b (listening); the flags go
# to the measuring end, which passes them on.
phys_pair() {
  local run="$1" rep="$2" pin_b=() pin_a=() how=()
  read -r -a how <<<"$3"
  if (($# == 5)); then
    pin_b=(--cpu "$4")
    pin_a=(--cpu "$5")
  fi
  next_port
  serve "${in_b[@]}" "$phys" "${how[0]}" --listen "$host_b:$port" "${pin_b[@]}"
  collect_pair "$run" "$rep" \
    "${in_a[@]}" "$phys" "${how[@]}" --connect "$host_b:$port" "${pin_a[@]}"
}

# Ping-pong also with both ends on CPU 0 and on CPUs 0 and 1: left to the
# scheduler, it is one or the other from one run to the next. And with both
# ends polling (as tide's waiting threads do): no wake-up in the round trip.
run_phys() {
  local rep="$1" two_cpus=0
  if (($(nproc) >= 2)); then
    two_cpus=1
  fi
  if ((netns)); then
    phys_pair phys "$rep" pingpong
    phys_pair phys-poll "$rep" "pingpong --poll"
    phys_pair phys-1cpu "$rep" pingpong 0 0
    if ((two_cpus)); then
      phys_pair phys-2cpu "$rep" pingpong 1 0
    fi
    phys_pair phys "$rep" bulk
  else
    collect phys "$rep" "$phys" pingpong
    collect phys-poll "$rep" "$phys" pingpong --poll
    collect phys-1cpu "$rep" "$phys" pingpong --cpu 0
    if ((two_cpus)); then
      collect phys-2cpu "$rep" "$phys" pingpong --cpu 0 --peer-cpu 1
    fi
    collect phys "$rep" "$phys" bulk
  fi
  collect phys "$rep" "$phys" memcpy
}

run_tide() {
  local rep="$1"
  if ((netns)); then
    next_port
    local ranks=(--world-size 2 --init-method "tcp://$host_a:$port")
    serve "${in_b[@]}" \
      "$rpc_bench" --rank 1 "${ranks[@]}" --listen-host "$host_b"
    collect_pair tide "$rep" "${in_a[@]}" \
      "$rpc_bench" --rank 0 "${ranks[@]}" --listen-host "$host_a"
  else
    collect tide "$rep" "$rpc_bench"
    collect tide-tcp "$rep" "$rpc_bench" --transport tcp
  fi
}

run_torch() {
  local rep="$1"
  if ((netns)); then
    next_port
    local init=(--init-method "tcp://$host_a:$port")
    local tcp=(--transport uv --channel mpt_uv)
    serve "${in_b[@]}" env TP_SOCKET_IFNAME=veth-b GLOO_SOCKET_IFNAME=veth-b \
      "$torch_python" "$torch_peer" --rank 1 "${init[@]}" "${tcp[@]}"
    collect_pair torch "$rep" \
      "${in_a[@]}" env TP_SOCKET_IFNAME=veth-a GLOO_SOCKET_IFNAME=veth-a \
      "$torch_python" "$torch_peer" --rank 0 "${init[@]}" "${tcp[@]}"
  else
    collect torch "$rep" "$torch_python" "$torch_peer"
  fi
}

# The Python program on the TIDE backend: the same commands as run_torch,
# with tide's module on the path (across namespaces it listens on the
# address that routes to rank 0: no interface to name).
run_tide_py() {
  local rep="$1" py=(env "PYTHONPATH=$build/python")
  if ((netns)); then
    next_port
    local init=(--init-method "tcp://$host_a:$port")
    serve "${in_b[@]}" "${py[@]}" \
      "$torch_python" "$torch_peer" --backend tide --rank 1 "${init[@]}"
    collect_pair tide-py "$rep" "${in_a[@]}" "${py[@]}" \
      "$torch_python" "$torch_peer" --backend tide --rank 0 "${init[@]}"
  else
    collect tide-py "$rep" "${py[@]}" "$torch_python" "$torch_peer" --backend tide
  fi
}

started=$SECONDS
for ((rep = 0; rep < reps; rep++)); do
  echo "run.sh: round $((rep + 1))/$reps ($setup): phys" >&2
  run_phys "$rep"
  echo "run.sh: round $((rep + 1))/$reps ($setup): tide" >&2
  run_tide "$rep"
  echo "run.sh: round $((rep + 1))/$reps ($setup): torch" >&2
  run_torch "$rep"
  echo "run.sh: round $((rep + 1))/$reps ($setup): tide-py" >&2
  run_tide_py "$rep"
done
echo "run.sh: $reps rounds in $((SECONDS - started)) s;" \
  "$failures failed runs" >&2

if [[ -n "$json" ]]; then
  cp "$results" "$json"
fi
if [[ -s "$results" ]]; then
  python3 "$summarize" "$results"
fi
((failures == 0)) || exit 1
