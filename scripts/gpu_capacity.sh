#!/usr/bin/env bash
# Whole-product capacity on one GPU host (issue 16), in two device calls of at most 9 minutes each.
#
#   scripts/gpu_capacity.sh wheels           # here, once: the wheels the GPU host lacks, into .whl/ and .whl-oracle/
#   scripts/gpu_capacity.sh engine           # call A: random real-size 0.6B and 1.7B checkpoints, the 1.7B float32
#                                            #   parity against the official code, bench_engine.py at 1/64/256 streams
#   scripts/gpu_capacity.sh gateway          # call B: an engine process + `serve --workers 12` + 4 load-generator
#                                            #   processes: 0.6B at 100..500 sessions (Poisson; aligned at 400),
#                                            #   then 1.7B at 200 and 400 (Poisson) with the time left: 9 minutes
#                                            #   in all (SESSIONS=..., SESSIONS_17=... change the levels)
#   scripts/gpu_capacity.sh more             # call C: the 1.7B checkpoint and the gateway in front of it (200,
#                                            #   400 sessions), then issue 14's echo benchmark before and after the
#                                            #   one-port server (.before/ holds `git archive 6d27b35` of the
#                                            #   websockets-server tree: carry it with .whl)
#   scripts/gpu_capacity.sh frontdoor        # issue 14's echo benchmark alone, before and after
#   scripts/gpu_capacity.sh layout           # the echo benchmark before the layered layout and after, twice each,
#                                            #   alternated, on the host's quiet CPUs (.before/ holds
#                                            #   `git archive 50669cf`: carry it with .whl)
#   scripts/gpu_capacity.sh prepare-codec    # here, once: .before-codec/ = main's engine/ before the codec work
#                                            #   ($CODEC_BEFORE, default 155a1c2); carry it with .whl
#   scripts/gpu_capacity.sh codec            # issue 25, one call: the kernels' tests on the GPU, the codec step
#                                            #   alone after and before (bench_codec.py), the engine alone: 0.6B at
#                                            #   1/64/256/1024 streams, then 1.7B at 1/256/512 with the time left
#   scripts/gpu_capacity.sh codec-check      # here: the codec call on the CPU, small (tiny checkpoint and codec)
#   scripts/gpu_capacity.sh codec2           # issue 25, second call: the engine's GPU tests (kernels, codec, the
#                                            #   runner on the tiny checkpoint), the codec step alone with its
#                                            #   numerics, the engine alone: 0.6B at 1/256/512/1024 streams opened at
#                                            #   once and staggered, then 1.7B at 1/256/512 with the time left
#   scripts/gpu_capacity.sh codec2-check     # here: the codec2 call on the CPU, small
#   scripts/gpu_capacity.sh dry              # here: call B's gateway runs on the CPU, small (the tiny checkpoint
#                                            #   of tests/data, 2 workers, 2 and 4 sessions)
#   ORACLE_SITE=DIR scripts/gpu_capacity.sh check
#                                            # here: every step above on the CPU, with tiny checkpoints (DIR: an
#                                            #   environment's site-packages holding qwen-tts, transformers 4.57.3)
#
# The GPU host (device tool: nvidia-h100-x1 or nvidia-h200) has python3 3.12 with torch, triton, numpy,
# onnxruntime, prometheus-client, aiohttp and uvloop, and no internet: the wheels travel in .whl/ (name it in
# the call's `carry`). The gateway's go to /tmp/site, the official qwen-tts oracle's (transformers 4.57.3; in
# .whl-oracle/, carried only by the calls that make checkpoints: a call carries 64 MiB at most) to
# /tmp/site-oracle, which only the fixture script sees. Results are written under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu-capacity-out}
mkdir -p "$OUT"

# Exact versions, for CPython 3.12 on manylinux x86_64. The gateway's runtime (what the host lacks or has too
# old: openai's aiohttp transport wants aiohttp >= 3.14.4), pyzmq for the engine processes, the pipecat-ai
# wheel for the Smart Turn model it ships (the gateway loads it at start), starlette and uvicorn for the
# coming front door. Not mcp: the benchmark's gateway runs with [mcp] off (its sessions call no tools).
GATEWAY_WHEELS="websockets==15.0.1 orjson==3.13.0 soxr==1.1.0 silero-vad==6.2.3 pyzmq==27.3.0
  openai==3.54.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 sniffio==1.3.1
  pydantic==2.14.3 pydantic-core==2.50.4 typing-inspection==0.4.5 annotated-types==0.8.0
  typing-extensions==4.16.0 anyio==4.16.0 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4
  frozenlist==1.8.0 aiosignal==1.4.0 aiohappyeyeballs==2.7.1 attrs==26.1.0 starlette==1.10.0 uvicorn==0.54.0
  pipecat-ai==1.14.0"
# The official code as the parity oracle (qwen-tts pins transformers 4.57.3, which wants tokenizers <= 0.23.0
# and huggingface-hub < 1.0; librosa and soundfile are imported by its model files):
ORACLE_WHEELS="qwen-tts==0.1.1 transformers==4.57.3 tokenizers==0.22.1 huggingface-hub==0.36.0
  accelerate==1.12.0 librosa==0.11.0 audioread==3.1.0 decorator==5.2.1 pooch==1.8.2 platformdirs==4.5.0
  soundfile==0.13.1 cffi==2.0.0 pycparser==2.23 soxr==1.1.0"

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/run.log"; }

# step SECONDS NAME COMMAND...: one step, bounded in time, its output appended to $OUT/NAME.log (the device
# call returns at most 8 files); a failed step is logged and the next one runs.
step() {
  local limit=$1 name=$2; shift 2
  log "start $name: $*"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  log "end $name: exit $rc"
  tail -n 40 "$OUT/$name.log"
  return $rc
}

setup() {
  export PYTHONUNBUFFERED=1
  if [ -z "${CPU_CHECK:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
    if [ -d .whl-oracle ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site-oracle .whl-oracle/*.whl || exit 1
    fi
    { nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)"; \
      nproc; free -g; git log -1 --format='%H %s' 2>/dev/null; } >>"$OUT/run.log" 2>&1
  fi
  export PYTHONPATH=$ROOT:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  ORACLE_PATH=${ORACLE_PATH:-/tmp/site-oracle:$ROOT}
}

# checkpoint SIZE DIR FRAMES [SECONDS]: a real-size checkpoint with seeded random weights, written through the
# official code (FRAMES: the greedy references it records, 2 when only the checkpoint is needed).
checkpoint() {
  [ -f "$2/references.json" ] && return 0
  PYTHONPATH=$ORACLE_PATH step "${4:-400}" fixtures python3 scripts/make_parity_fixture.py \
    --config "${FIXTURE:-real-$1}" --out "$2" --device "$DEVICE" --dtype float32 --frames "$3"
}

engine() {
  setup
  checkpoint 1.7b "$Q17" 24
  checkpoint 0.6b "$Q06" 2
  QWEN3_TTS_FIXTURE=$Q17 QWEN3_TTS_DEVICE=$DEVICE step 150 parity-1.7b \
    python3 -m pytest -q --noconftest -p no:cacheprovider tests/engine/test_parity.py
  for size in 1.7b 0.6b; do  # 1.7B first: bench/RESULTS.md has 0.6B figures already
    dir=$Q06; [ $size = 1.7b ] && dir=$Q17
    step 170 "bench-engine-$size" python3 scripts/bench_engine.py --checkpoint "$dir" --impl ours \
      --device "$DEVICE" --frames "$FRAMES" --streams "$STREAMS" --eager-streams "" --runs 2 --time-budget 120 \
      --json "$OUT/bench-engine-$size.json"
  done
}

# bench SIZE DIR SESSIONS ALIGNED SECONDS: the gateway as `serve --workers $WORKERS` runs it, on an engine
# process of the SIZE checkpoint in DIR, at the SESSIONS levels (Poisson arrivals; aligned too at the ALIGNED
# levels, none when empty).
bench() {
  local arrivals=(--arrivals poisson)
  [ -n "$4" ] && arrivals=(--arrivals poisson,aligned --aligned-sessions "$4")
  step "$5" "bench-gateway-$1" python3 scripts/bench_gateway.py --responder pipeline --tts engine \
    --checkpoint "$2" --engine-mode process --engine-devices "$ENGINE_DEVICES" --max-streams "$MAX_STREAMS" \
    --workers "$WORKERS" --sessions "$3" "${arrivals[@]}" --cycles "$CYCLES" --clients "$CLIENTS" --port "$PORT" \
    --json "$OUT/bench-gateway-$1.json"
}

gateway() {
  setup
  local start=$SECONDS
  checkpoint 0.6b "$Q06" 2
  bench 0.6b "$Q06" "$SESSIONS" "$ALIGNED" "$LIMIT_06"
  # 1.7B with what is left of the call (its checkpoint is made by call A; made here, it takes minutes).
  local left=$((BUDGET - (SECONDS - start)))
  if [ ! -f "$Q17/references.json" ] || [ "$left" -lt 150 ]; then
    log "1.7B skipped: ${left} s left, checkpoint $( [ -f "$Q17/references.json" ] && echo present || echo absent)"
    return 0
  fi
  bench 1.7b "$Q17" "$SESSIONS_17" "" "$((left - 10))"
}

more() {
  setup
  checkpoint 1.7b "$Q17" 2
  bench 1.7b "$Q17" "$SESSIONS_17" "" 220
  frontdoor
}

# Issue 14's benchmark: the echo responder on the websockets server (.before/) and on the one-port server.
# The old tree starts its sessions uniformly over 2 s from one client process, one scenario each: the same here.
frontdoor() {
  setup
  step 130 echo-before env PYTHONPATH="$ROOT/.before:/tmp/site" python3 .before/scripts/bench_gateway.py \
    --responder echo --sessions 10,50,100 --port 18766
  step 130 echo-after python3 scripts/bench_gateway.py --responder echo --sessions 10,50,100 --spread 2 \
    --clients 1 --cycles 1 --port 18767
}

# The layered layout's benchmark: CPU per session-minute and loop lag with the echo responder, before and after.
layout() {
  setup
  for run in 1 2; do
    step 150 "echo-before-$run" python3 .before/scripts/bench_gateway.py --responder echo --sessions 10,50,100 \
      --spread 2 --clients 1 --cycles 1 --port 18766
    step 150 "echo-after-$run" python3 scripts/bench_gateway.py --responder echo --sessions 10,50,100 --spread 2 \
      --clients 1 --cycles 1 --port 18767
  done
}

# Issue 25: the codec's kernels and the engine alone up to 1024 streams. Files under $OUT (8): run.log,
# tests.log, codec.log + codec.json (after and before: steps at each batch, memory, profiles, numerics),
# fixtures.log, engine.log + bench-engine-0.6b.json, bench-engine-1.7b.json. Triton caches its autotuning on
# disk, so the engine runs reuse what bench_codec chose (and log it: TRITON_PRINT_AUTOTUNING).
codec() {
  setup
  export TRITON_CACHE_AUTOTUNING=1 TRITON_PRINT_AUTOTUNING=1
  local start=$SECONDS left
  # shellcheck disable=SC2086
  step 170 tests python3 -m pytest -q -p no:cacheprovider $TESTS_K tests/engine/test_kernels.py \
    tests/engine/test_codec.py
  # shellcheck disable=SC2086
  step 150 codec python3 scripts/bench_codec.py --label after $CODEC_ARGS --json "$OUT/codec.json"
  if [ -d .before-codec/engine ]; then
    # shellcheck disable=SC2086
    step 90 codec python3 scripts/bench_codec.py --engine-root .before-codec --label before $CODEC_ARGS \
      --batches "$BEFORE_BATCHES" --frames 4 --profile "$BEFORE_PROFILE" --json "$OUT/codec.json"
  else
    log "no .before-codec/ (scripts/gpu_capacity.sh prepare-codec, then carry it): no before run"
  fi
  checkpoint 0.6b "$Q06" 2 200
  step 200 engine python3 scripts/bench_engine.py --checkpoint "$Q06" --impl ours --device "$DEVICE" \
    --frames "$FRAMES" --streams "$STREAMS_06" --eager-streams "" --runs 1 --time-budget 100 \
    --json "$OUT/bench-engine-0.6b.json"
  left=$((BUDGET - (SECONDS - start)))
  if [ "$left" -lt 150 ]; then
    log "1.7B skipped: ${left} s left"
    return 0
  fi
  checkpoint 1.7b "$Q17" 2 $((left - 90))
  left=$((BUDGET - (SECONDS - start)))
  [ -f "$Q17/references.json" ] && [ "$left" -ge 60 ] || { log "1.7B skipped: ${left} s left"; return 0; }
  step "$left" engine python3 scripts/bench_engine.py --checkpoint "$Q17" --impl ours --device "$DEVICE" \
    --frames "$FRAMES" --streams "$STREAMS_17" --eager-streams "" --runs 1 --time-budget $((left - 45)) \
    --json "$OUT/bench-engine-1.7b.json"
}

# Issue 25, second call, 9 minutes at most. Files under $OUT (8): run.log, tests.log (each pytest run stops at
# its first failure and prints it; unbuffered, so a timeout keeps what ran), codec.log + codec.json,
# fixtures.log, engine.log + bench-engine-0.6b.json, bench-engine-1.7b.json. Triton caches its autotuning on
# disk: the engine runs reuse what bench_codec chose for the codec's convs (batch 1 included, the engine's
# small batches).
codec2() {
  setup
  export TRITON_CACHE_AUTOTUNING=1
  local start=$SECONDS left
  # shellcheck disable=SC2086
  step "$TESTS_S" tests python3 -m pytest -x -q --tb=short -rfE --durations=8 -p no:cacheprovider $TESTS_K \
    tests/engine/test_kernels.py tests/engine/test_codec.py
  QWEN3_TTS_DEVICE=$DEVICE step "$BATCHING_S" tests python3 -m pytest -x -q --tb=short -rfE -p no:cacheprovider \
    tests/engine/test_batching.py
  # shellcheck disable=SC2086
  step "$CODEC_S" codec python3 scripts/bench_codec.py --label after $CODEC_ARGS --json "$OUT/codec.json"
  checkpoint 0.6b "$Q06" 2 "$FIXTURE_S"
  step "$ENGINE_S" engine python3 scripts/bench_engine.py --checkpoint "$Q06" --impl ours --device "$DEVICE" \
    --frames "$FRAMES" --streams "$STREAMS_06" --eager-streams "" --runs 1 --staggered \
    --time-budget $((ENGINE_S - 60)) --json "$OUT/bench-engine-0.6b.json"
  left=$((BUDGET - (SECONDS - start)))
  if [ "$left" -lt 150 ]; then
    log "1.7B skipped: ${left} s left"
    return 0
  fi
  checkpoint 1.7b "$Q17" 2 $((left - 70))
  left=$((BUDGET - (SECONDS - start)))
  [ -f "$Q17/references.json" ] && [ "$left" -ge 60 ] || { log "1.7B skipped: ${left} s left"; return 0; }
  step "$left" engine python3 scripts/bench_engine.py --checkpoint "$Q17" --impl ours --device "$DEVICE" \
    --frames "$FRAMES" --streams "$STREAMS_17" --eager-streams "" --runs 1 --staggered \
    --time-budget $((left - 35)) --json "$OUT/bench-engine-1.7b.json"
}

prepare_codec() {
  rm -rf .before-codec && mkdir .before-codec && git archive "${CODEC_BEFORE:-155a1c2}" engine | tar -x -C .before-codec
  echo ".before-codec/engine: $(git log -1 --format='%h %s' "${CODEC_BEFORE:-155a1c2}" | cut -c1-80)"
}

wheels() {
  local platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64"
  local args="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms"
  mkdir -p .whl .whl-oracle
  # shellcheck disable=SC2086
  python3 -m pip download -q $args -d .whl $GATEWAY_WHEELS && python3 -m pip download -q $args -d .whl-oracle $ORACLE_WHEELS
  du -sh .whl .whl-oracle
}

case "${1:-}" in
  wheels) wheels ;;
  prepare-codec) prepare_codec ;;
  codec)
    DEVICE=cuda Q06=/tmp/q06 Q17=/tmp/q17 FRAMES=125 STREAMS_06=${STREAMS_06:-1,64,256,1024}
    STREAMS_17=${STREAMS_17:-1,256,512} TESTS_K="" BUDGET=${BUDGET:-530}
    CODEC_ARGS="--batches 1,64,128,256,1024 --frames 4,1 --profile 64,256" BEFORE_BATCHES=64,256 BEFORE_PROFILE=64
    codec ;;
  codec-check)
    # The codec call on this machine's CPU: the kernels' tests in Triton's interpreter (the float32 ones), the
    # codec benchmark eager on the tiny codec (after and before), the engine on the committed tiny checkpoint.
    CPU_CHECK=1 DEVICE=cpu Q06=$ROOT/tests/data/qwen3_tts_tiny Q17=$ROOT/tests/data/qwen3_tts_tiny FRAMES=6
    STREAMS_06=1,2 STREAMS_17=1,2 TESTS_K="-k f32" BUDGET=530
    CODEC_ARGS="--device cpu --config tests/data/codec_tiny/config.json --batches 1,2 --frames 4,1 --reps 2 --profile 1"
    BEFORE_BATCHES=2 BEFORE_PROFILE=""
    export PATH=$ROOT/.venv/bin:$PATH OMP_NUM_THREADS=1
    codec ;;
  codec2)
    DEVICE=cuda Q06=/tmp/q06 Q17=/tmp/q17 FRAMES=125 STREAMS_06=${STREAMS_06:-1,256,512,1024}
    STREAMS_17=${STREAMS_17:-1,256,512} TESTS_K="" BUDGET=${BUDGET:-525} TESTS_S=100 BATCHING_S=50 CODEC_S=140
    FIXTURE_S=60 ENGINE_S=180 CODEC_ARGS="--batches 1,64,256,1024 --frames 4,1 --profile 256 --time-budget 100"
    codec2 ;;
  codec2-check)
    # The codec2 call on this machine's CPU: the float32 kernel tests in Triton's interpreter, the runner's tests,
    # the codec benchmark eager on the tiny codec, the engine on the committed tiny checkpoint (both sizes).
    CPU_CHECK=1 DEVICE=cpu Q06=$ROOT/tests/data/qwen3_tts_tiny Q17=$ROOT/tests/data/qwen3_tts_tiny FRAMES=6
    STREAMS_06=1,2 STREAMS_17=1,2 TESTS_K="-k f32" BUDGET=530 TESTS_S=300 BATCHING_S=120 CODEC_S=150 FIXTURE_S=60
    ENGINE_S=170 CODEC_ARGS="--device cpu --config tests/data/codec_tiny/config.json --batches 1,2 --frames 4,1 --reps 2 --profile 1"
    export PATH=$ROOT/.venv/bin:$PATH OMP_NUM_THREADS=1
    codec2 ;;
  engine|gateway|more|frontdoor|layout)
    # The gateway call: 12 workers and 4 load-generator processes share the 16 cores with the engine
    # process; one cycle per session (two turns) keeps a level near 35 s.
    DEVICE=cuda Q06=/tmp/q06 Q17=/tmp/q17 FRAMES=125 STREAMS=1,64,256 ENGINE_DEVICES=auto MAX_STREAMS=512
    WORKERS=${WORKERS:-12} CLIENTS=${CLIENTS:-4} SESSIONS=${SESSIONS:-100,200,300,400,500} ALIGNED=400
    SESSIONS_17=${SESSIONS_17:-200,400} CYCLES=1 PORT=18765 BUDGET=510 LIMIT_06=330
    "$@" ;;
  dry)
    CPU_CHECK=1 Q06=$ROOT/tests/data/qwen3_tts_tiny Q17=$ROOT/tests/data/qwen3_tts_tiny ENGINE_DEVICES=cpu
    MAX_STREAMS=4 WORKERS=2 CLIENTS=1 SESSIONS=2,4 ALIGNED=4 SESSIONS_17=2 CYCLES=1 PORT=${PORT:-28765}
    BUDGET=530 LIMIT_06=200
    export PATH=$ROOT/.venv/bin:$PATH GATEWAY_ENGINE_VOICES=alloy=vivian OMP_NUM_THREADS=1
    gateway ;;
  check)
    # The same steps on this machine's CPU with tiny checkpoints, in the gateway's .venv (the tiny checkpoint
    # has five speakers: the voices map to one of them).
    : "${ORACLE_SITE:?set ORACLE_SITE to the site-packages of an environment holding qwen-tts}"
    CPU_CHECK=1 DEVICE=cpu FIXTURE=tiny Q06=/tmp/gpu-check-a Q17=/tmp/gpu-check-b FRAMES=6 STREAMS=1,2
    ENGINE_DEVICES=cpu MAX_STREAMS=4 WORKERS=2 SESSIONS=2 ALIGNED=2 SESSIONS_17=2 CYCLES=1 CLIENTS=1
    PORT=${PORT:-28765} BUDGET=530 LIMIT_06=200
    export PATH=$ROOT/.venv/bin:$PATH GATEWAY_ENGINE_VOICES=alloy=vivian OMP_NUM_THREADS=1
    ORACLE_PATH=$ORACLE_SITE:$ROOT
    rm -rf "$Q06" "$Q17"
    engine
    gateway ;;
  *) sed -n 2,18p "$0"; exit 2 ;;
esac
