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
#                                            #   (random real-geometry checkpoints made here; carry .whl .site-slim)
#   scripts/gpu_capacity.sh codec2-check     # here: the codec2 call on the CPU, small
#   scripts/gpu_capacity.sh family           # issue 23, call 1: random real-geometry 0.6B Base, 1.7B Base,
#                                            #   1.7B VoiceDesign and 1.7B CustomVoice checkpoints through the
#                                            #   official code, each one's float32 parity (tests/engine/test_family.py)
#   scripts/gpu_capacity.sh family-bench     # issue 23, call 2: bench_engine.py on 0.6B and 1.7B Base (clones,
#                                            #   in-context and x-vector, 8 voices a wave) at 1/24/64/256 streams,
#                                            #   and preparing a 10 s reference (checkpoints of call 1, else made)
#   scripts/gpu_capacity.sh family-more      # issue 23, call 3: the same on 1.7B VoiceDesign (designed voices)
#                                            #   and 1.7B CustomVoice (named speakers, with and without instructions)
#   scripts/gpu_capacity.sh family-check     # here: the three family calls on the CPU with tiny checkpoints
#                                            #   (ORACLE_SITE as for check)
#   scripts/gpu_capacity.sh icl              # issue 23, in-context clones (carry .whl): graph replay against eager
#                                            #   on the GPU, bench_engine.py on a random real-geometry 0.6B Base
#                                            #   checkpoint, in-context and x-vector clones, 8 voices a wave,
#                                            #   1/24/64/256 streams; then issue 25's 0.6B CustomVoice at 1 and 1024
#                                            #   streams, at once and staggered, in the time left
#   scripts/gpu_capacity.sh icl-check        # here: the icl call on the CPU, small (the tiny Base checkpoint)
#   scripts/gpu_capacity.sh capacity-0.6b    # issue 25 (carry .whl .site-slim): 0.6B at 1000 sessions twice
#                                            #   (Poisson), then 1000 aligned,
#                                            #   12 workers, 1024 engine rows, CPU by stage (py-spy)
#   scripts/gpu_capacity.sh capacity-1.7b    # issue 25: the 1.7B at 800 sessions twice, then 800 aligned
#   scripts/gpu_capacity.sh capacity-check   # here: both on the CPU, small (tiny checkpoint, 2 workers)
#   scripts/gpu_capacity.sh speech           # issue 24, one call: /v1/audio/speech (bench_speech.py) on random
#                                            #   real-geometry 0.6B CustomVoice + 0.6B Base checkpoints in one engine
#                                            #   process, the gateway as `serve --workers 12` (SPEECH_WORKERS) on
#                                            #   14 cores, the load generator on the other 2 (CLIENT_CPUS): a
#                                            #   speaker and an in-context clone at 1/24/64/256 concurrent
#                                            #   requests (pcm, 10 s answers), then at 24 while 200 realtime sessions
#                                            #   share the engine (random checkpoints made here; carry .whl and
#                                            #   .site-slim)
#   scripts/gpu_capacity.sh speech-17        # issue 24, a second call: the same on 1.7B CustomVoice + 1.7B Base
#   scripts/gpu_capacity.sh speech-burst     # issue 24: the 1.7B speaker, 256 requests at once three times, per
#                                            #   gateway setup (BURST_SETUPS: workers:clients[:cores of the load
#                                            #   generator's own] each)
#   scripts/gpu_capacity.sh speech-burst-check  # here: the same on the CPU, small
#   scripts/gpu_capacity.sh speech-clones    # issues 24 and 23 in one call: `speech` on 0.6B without its sessions'
#                                            #   level, then the 0.6B Base clones' benchmark of `icl`
#   scripts/gpu_capacity.sh speech-clones-check  # here: the same on the CPU, small
#   scripts/gpu_capacity.sh speech-check     # here: the speech call on the CPU with the tiny checkpoints, small
#   scripts/gpu_capacity.sh final            # issue 25, the last call (~5 minutes; carry .whl .site-slim): a random
#                                            #   real-geometry 0.6B CustomVoice checkpoint made here, bench_engine.py
#                                            #   at 1 and 1024 streams opened at once and staggered; then, with 150 s
#                                            #   or more left, a 0.6B Base made here and the speech API on both
#                                            #   (bench_speech.py) at 1/24/64/256 in the time left
#   scripts/gpu_capacity.sh final-check      # here: the final call on the CPU with the tiny checkpoints, small
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
GATEWAY_WHEELS="websockets==15.0.1 orjson==3.13.0 pybase64==1.5.1 soxr==1.1.0 pyzmq==27.3.0
  openai==3.54.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 sniffio==1.3.1
  pydantic==2.14.3 pydantic-core==2.50.4 typing-inspection==0.4.5 annotated-types==0.8.0
  typing-extensions==4.16.0 anyio==4.16.0 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4
  frozenlist==1.8.0 aiosignal==1.4.0 aiohappyeyeballs==2.7.1 attrs==26.1.0 starlette==1.10.0 uvicorn==0.54.0
  httptools==0.9.0
  py-spy==0.4.3 cryptography==50.0.2 cffi==2.0.0 pycparser==2.23"
SLIM_WHEELS="silero-vad==6.2.3 pipecat-ai==1.14.0"
SMART_TURN_FILE=pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx
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
    if [ -d .whl-speech ]; then  # PyAV, for the speech API's compressed formats (the speech call needs none)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl-speech/*.whl || exit 1
    fi
    if [ -d .whl-oracle ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site-oracle .whl-oracle/*.whl || exit 1
    fi
    { nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)"; \
      nproc; uname -r; free -g; git log -1 --format='%H %s' 2>/dev/null; } >>"$OUT/run.log" 2>&1
  fi
  if [ -z "${CPU_CHECK:-}" ]; then
    cp -r .site-slim/silero_vad /tmp/site/
    export GATEWAY_SEMANTIC_VAD_MODEL_PATH=$ROOT/.site-slim/smart-turn-v3.2-cpu.onnx
  fi
  export PYTHONPATH=$ROOT:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH  # py-spy's binary too
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
    --engine-max-frames "${MAX_FRAMES:-250}" --profile "${PROFILE:-0}" --json "$OUT/bench-gateway-$1.json"
}

# random_checkpoint CONFIG DIR [SECONDS]: real geometry, seeded random weights, written by the engine's own
# modules (no official code: for the benchmarks, where only the geometry matters; CPU_CHECK: DIR is a tiny
# checkpoint).
random_checkpoint() {
  [ -n "${CPU_CHECK:-}" ] || [ -f "$2/model.safetensors" ] && return 0
  step "${3:-120}" fixtures python3 scripts/make_random_checkpoint.py --config "$1" --out "$2"
}

# Issue 25's targets through the whole product, one size a call: the levels twice in a row (Poisson), then the
# aligned worst case, with every worker's spread and CPU by stage (py-spy on one worker).
capacity() {
  setup
  random_checkpoint "real-$1" "$2"
  bench "$1" "$2" "$3" "$4" "$LIMIT"
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

# engine_bench SIZE DIR STREAMS SECONDS RESERVE: bench_engine.py on DIR's checkpoint, the STREAMS levels opened
# at once and staggered (one wave each), in SECONDS at most; no level starts in the last RESERVE seconds (the
# step times at each batch size come after the levels).
engine_bench() {
  step "$4" engine python3 scripts/bench_engine.py --checkpoint "$2" --impl ours --device "$DEVICE" \
    --frames "$FRAMES" --streams "$3" --eager-streams "" --runs 1 --staggered --time-budget $(($4 - $5)) \
    --json "$OUT/bench-engine-$1.json"
}

# Issue 25, second call, 9 minutes at most. Files under $OUT (8): run.log, tests.log (each pytest run stops at
# its first failure and prints it; unbuffered, so a timeout keeps what ran), codec.log + codec.json,
# fixtures.log, engine.log + bench-engine-0.6b.json, bench-engine-1.7b.json. Triton caches its autotuning on
# disk: the engine runs reuse what bench_codec chose for the codec's convs (batch 1 included, the engine's
# small batches).
codec2() {
  setup
  export TRITON_CACHE_AUTOTUNING=1
  local start=$SECONDS left fixtures
  # The random checkpoints are CPU work (~15 s and ~35 s): made while the GPU runs the tests.
  { random_checkpoint real-0.6b "$Q06" "$FIXTURE_S"; random_checkpoint real-1.7b "$Q17" "$FIXTURE_S"; } &
  fixtures=$!
  # shellcheck disable=SC2086
  step "$TESTS_S" tests python3 -m pytest -x -q --tb=short -rfE --durations=8 -p no:cacheprovider $TESTS_K \
    tests/engine/test_kernels.py tests/engine/test_codec.py
  QWEN3_TTS_DEVICE=$DEVICE step "$BATCHING_S" tests python3 -m pytest -x -q --tb=short -rfE -p no:cacheprovider \
    tests/engine/test_batching.py
  # shellcheck disable=SC2086
  step "$CODEC_S" codec python3 scripts/bench_codec.py --label after $CODEC_ARGS --json "$OUT/codec.json"
  wait "$fixtures"
  engine_bench 0.6b "$Q06" "$STREAMS_06" "$ENGINE_S" 60
  left=$((BUDGET - (SECONDS - start)))
  [ -f "$Q17/config.json" ] && [ "$left" -ge 120 ] || { log "1.7B skipped: ${left} s left"; return 0; }
  # What is left, less the 10 s a step may take past its limit to stop.
  engine_bench 1.7b "$Q17" "$STREAMS_17" $((left - 10)) 45
}

# Issue 25's last call, BUDGET seconds in all (setup included): first audio P50/P95, RTF and stalls of 0.6B
# CustomVoice at 1 and 1024 streams, opened at once and staggered, then (150 s or more left) the speech API.
# The engine autotunes its kernels as it starts (no bench_codec before it), onto Triton's disk cache, which the
# speech call's engine process reads. Files under $OUT: run.log, fixtures.log, engine.log +
# bench-engine-0.6b.json, bench-speech-0.6b.log + .json.
final() {
  local start=$SECONDS left
  setup
  export TRITON_CACHE_AUTOTUNING=1
  random_checkpoint real-0.6b "$Q06" "$FIXTURE_S"
  engine_bench 0.6b "$Q06" "$STREAMS_06" "$ENGINE_S" "$RESERVE_S"
  left=$((BUDGET - (SECONDS - start)))
  if [ "$left" -lt 150 ]; then
    log "speech skipped: ${left} s left"
    return 0
  fi
  random_checkpoint real-0.6b-base "$F06B" "$FIXTURE_S"
  [ -f "$Q06/config.json" ] && [ -f "$F06B/config.json" ] || { log "speech: a checkpoint is missing"; return 1; }
  # What is left, less the 10 s a step may take past its limit to stop.
  speech_bench 0.6b "$Q06" "$F06B" $((BUDGET - (SECONDS - start) - 10)) 0 "$SPEECH_LEVELS"
}

prepare_codec() {
  rm -rf .before-codec && mkdir .before-codec && git archive "${CODEC_BEFORE:-155a1c2}" engine | tar -x -C .before-codec
  echo ".before-codec/engine: $(git log -1 --format='%h %s' "${CODEC_BEFORE:-155a1c2}" | cut -c1-80)"
}

# family_checkpoint CONFIG DIR FRAMES: a real-geometry checkpoint of make_parity_fixture.py's CONFIG (CPU_CHECK:
# the tiny one of the same kind) with seeded random weights, written through the official code.
family_checkpoint() {
  [ -f "$2/references.json" ] && return 0
  local config=$1
  if [ -n "${CPU_CHECK:-}" ]; then
    case $config in *-base) config=tiny-base ;; *-design) config=tiny-design ;; *) config=tiny-instruct ;; esac
  fi
  PYTHONPATH=$ORACLE_PATH step 300 "fixture-$config" python3 scripts/make_parity_fixture.py --config "$config" \
    --out "$2" --device "$DEVICE" --dtype float32 --frames "$3"
}

# family_bench NAME DIR [MODES [SECONDS]]: bench_engine.py in the voices of DIR's checkpoint (default: its
# kind's), in SECONDS at most (270).
family_bench() {
  local limit=${4:-270}
  step "$limit" "bench-$1" python3 scripts/bench_engine.py --checkpoint "$2" --impl ours --device "$DEVICE" \
    --frames "$FRAMES" --streams "$FAMILY_STREAMS" --eager-streams "" --runs 2 --voices "$VOICES" \
    --modes "${3:-}" --time-budget $((limit - 70)) --json "$OUT/bench-$1.json"
}

family() {
  setup
  family_checkpoint real-0.6b-base "$F06B" 24
  family_checkpoint real-1.7b-base "$F17B" 24
  family_checkpoint real-1.7b-design "$F17D" 24
  family_checkpoint real-1.7b "$F17C" 24
  local present=""
  for dir in "$F06B" "$F17B" "$F17D" "$F17C"; do
    [ -f "$dir/references.json" ] && present="$present${present:+,}$dir"
  done
  QWEN3_TTS_FAMILY=$present QWEN3_TTS_DEVICE=$DEVICE step 240 parity-family \
    python3 -m pytest -q --noconftest -p no:cacheprovider tests/engine/test_family.py
}

family_bench_base() {
  setup
  family_checkpoint real-0.6b-base "$F06B" 2
  family_bench 0.6b-base "$F06B"
  family_checkpoint real-1.7b-base "$F17B" 2
  family_bench 1.7b-base "$F17B"
}

family_more() {
  setup
  family_checkpoint real-1.7b-design "$F17D" 2
  family_bench 1.7b-design "$F17D"
  family_checkpoint real-1.7b "$F17C" 2
  family_bench 1.7b-instruct "$F17C" speaker,instruct
}

# Issue 23's in-context clones, then issue 25's 1024 streams opened at once, after the prefill's host waits
# went: BUDGET seconds in all. Files under $OUT: run.log, tests.log, fixtures.log, bench-0.6b-base.log + .json,
# engine.log + bench-engine-0.6b.json.
icl() {
  local start=$SECONDS left fixtures
  setup
  export TRITON_CACHE_AUTOTUNING=1
  # The random checkpoints are CPU work: made while the GPU runs the tests.
  { random_checkpoint real-0.6b-base "$F06B" "$FIXTURE_S"; random_checkpoint real-0.6b "$Q06" "$FIXTURE_S"; } &
  fixtures=$!
  # The prefill's kernels against their references, and graph replay against eager, the longer prefills (an
  # in-context clone's prompt) included.
  QWEN3_TTS_DEVICE=$DEVICE step "$TESTS_S" tests python3 -m pytest -x -q --tb=short -rfE -p no:cacheprovider \
    -k "graph_replay or qk_norm_rope or decode_attention" tests/engine/test_kernels.py tests/engine/test_batching.py
  wait "$fixtures"
  family_bench 0.6b-base "$F06B" icl,xvec "$BENCH_S"
  left=$((BUDGET - (SECONDS - start)))
  [ "$left" -ge 120 ] || { log "0.6B CustomVoice skipped: ${left} s left"; return 0; }
  engine_bench 0.6b "$Q06" "$STREAMS_06" $((left - 10)) 40
}

# speech_bench NAME CUSTOMVOICE BASE SECONDS SESSIONS LEVELS: bench_speech.py on one engine process holding
# both checkpoints (SESSIONS realtime sessions share it during each level; 0 = none), the gateway in
# SPEECH_WORKERS worker processes (`serve --workers N`; default 1), the load generator on CLIENT_CPUS cores of
# its own (default 0: sharing them all).
speech_bench() {
  step "$4" "bench-speech-$1" python3 scripts/bench_speech.py --checkpoint "$2,$3" --voices speaker,clone \
    --concurrency "$6" --requests 2 --frames "$FRAMES" --max-streams "$MAX_STREAMS" --engine-mode process \
    --workers "${SPEECH_WORKERS:-1}" --client-cpus "${CLIENT_CPUS:-0}" \
    --engine-devices "$ENGINE_DEVICES" --clients "$CLIENTS" --sessions "$5" --time-budget $(($4 - 60)) \
    --port "$PORT" --json "$OUT/bench-speech-$1.json"
}

# Issue 24: the speech API on one size (SIZE 0.6b or 1.7b), then with realtime sessions sharing the engine,
# in the time left. Files under $OUT: run.log, tests.log, fixtures.log, bench-speech-*.log and .json.
speech_size() {
  setup
  # The first engine process autotunes its kernels onto Triton's disk cache; the sessions' one reads it.
  export TRITON_CACHE_AUTOTUNING=1
  local size=$1 cv=$2 base=$3 start=$SECONDS left
  # Each stream's own sampling goes through the fused sampling kernel (per-row top-k, top-p, temperature):
  # its tests against the PyTorch code, on this GPU's Triton.
  step 90 tests python3 -m pytest -q -p no:cacheprovider tests/engine/test_sampling.py tests/engine/test_kernels.py \
    -k "sample or warp or penalty or draws or sampling"
  random_checkpoint "real-$size" "$cv"
  random_checkpoint "real-$size-base" "$base"
  [ -f "$cv/config.json" ] && [ -f "$base/config.json" ] || { log "speech $size: a checkpoint is missing"; return 1; }
  speech_bench "$size" "$cv" "$base" "$SPEECH_LIMIT" 0 "$SPEECH_LEVELS"
  left=$((BUDGET - (SECONDS - start)))
  if [ "${SPEECH_SESSIONS:-0}" = 0 ] || [ "$left" -lt 150 ]; then
    log "speech $size with sessions skipped: ${left} s left"
    return 0
  fi
  speech_bench "$size-sessions" "$cv" "$base" "$((left - 10))" "$SPEECH_SESSIONS" "$SPEECH_SESSION_LEVELS"
}

# speech_burst SIZE CUSTOMVOICE: the speaker at BURST_LEVELS (256 at once, three times) with one gateway per
# setup of BURST_SETUPS, each WORKERS:CLIENTS[:CPUS] (gateway workers, load-generator processes, and the
# cores the load generator has to itself, the gateway the rest); each setup's figures go to
# $OUT/speech-burst-SIZE-WORKERS-CLIENTS[-CPUS].json as its levels end.
speech_burst() {
  setup
  export TRITON_CACHE_AUTOTUNING=1  # the first engine process tunes its kernels; the others read them
  local size=$1 cv=$2 setup_ workers clients cpus
  random_checkpoint "real-$size" "$cv"
  for setup_ in $BURST_SETUPS; do
    IFS=: read -r workers clients cpus <<<"$setup_"
    step "$BURST_LIMIT" "bench-speech-burst" python3 scripts/bench_speech.py --checkpoint "$cv" --voices speaker \
      --concurrency "$BURST_LEVELS" --requests 2 --frames "$FRAMES" --max-streams "$MAX_STREAMS" --engine-mode process \
      --workers "$workers" --engine-devices "$ENGINE_DEVICES" --clients "$clients" --client-cpus "${cpus:-0}" \
      --port "$PORT" --json "$OUT/speech-burst-$size-$workers-$clients${cpus:+-$cpus}.json"
  done
}

# The speech API on 0.6B (issue 24, as `speech` without the sessions' level), then the 0.6B Base clones' benchmark
# (issue 23), its engine starting from the kernels the speech call's engine tuned.
speech_clones() {
  speech_size 0.6b "$Q06" "$F06B"
  family_bench 0.6b-base "$F06B" icl,xvec "$BENCH_S"
}

wheels() {
  local platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64"
  local args="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms"
  rm -rf .whl .whl-oracle .site-slim .whl-speech && mkdir -p .whl .whl-oracle .site-slim
  # shellcheck disable=SC2086
  python3 -m pip download -q $args -d .whl $GATEWAY_WHEELS && python3 -m pip download -q $args -d .whl-oracle $ORACLE_WHEELS
  # Of the silero-vad and pipecat-ai wheels (23 MB) the gateway reads two model files: only those travel, the
  # Silero package with its one ONNX model (.site-slim/ goes to /tmp/site as it is) and the Smart Turn model
  # ([semantic_vad] model_path names it).
  local tmp
  tmp=$(mktemp -d)
  # shellcheck disable=SC2086
  python3 -m pip download -q $args -d "$tmp" $SLIM_WHEELS
  unzip -q "$tmp"/silero_vad-*.whl 'silero_vad/*.py' silero_vad/data/silero_vad.onnx -d .site-slim
  unzip -q -j "$tmp"/pipecat_ai-*.whl "$SMART_TURN_FILE" -d .site-slim
  rm -rf "$tmp"
  # PyAV (35 MB) for the speech API's mp3, opus, aac, flac and wav: its own folder, carried only when a call
  # wants those formats (with .whl it passes a call's 64 MiB; the speech call answers pcm without it).
  # shellcheck disable=SC2086
  mkdir -p .whl-speech && python3 -m pip download -q $args -d .whl-speech av==18.1.0
  du -sh .whl .whl-oracle .site-slim .whl-speech
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
    STREAMS_17=${STREAMS_17:-1,256,512} TESTS_K="" BUDGET=${BUDGET:-550} TESTS_S=60 BATCHING_S=30 CODEC_S=120
    FIXTURE_S=90 ENGINE_S=230 CODEC_ARGS="--batches 1,64,256,1024 --frames 4,1 --profile 256 --time-budget 80"
    codec2 ;;
  codec2-check)
    # The codec2 call on this machine's CPU: the float32 kernel tests in Triton's interpreter, the runner's tests,
    # the codec benchmark eager on the tiny codec, the engine on the committed tiny checkpoint (both sizes).
    CPU_CHECK=1 DEVICE=cpu Q06=$ROOT/tests/data/qwen3_tts_tiny Q17=$ROOT/tests/data/qwen3_tts_tiny FRAMES=6
    STREAMS_06=1,2 STREAMS_17=1,2 TESTS_K="-k f32" BUDGET=530 TESTS_S=300 BATCHING_S=120 CODEC_S=150 FIXTURE_S=60
    ENGINE_S=170 CODEC_ARGS="--device cpu --config tests/data/codec_tiny/config.json --batches 1,2 --frames 4,1 --reps 2 --profile 1"
    export PATH=$ROOT/.venv/bin:$PATH OMP_NUM_THREADS=1
    codec2 ;;
  final)
    DEVICE=cuda Q06=/tmp/q06 F06B=/tmp/f06b FRAMES=125 STREAMS_06=${STREAMS_06:-1,1024} BUDGET=${BUDGET:-290}
    FIXTURE_S=45 ENGINE_S=215 RESERVE_S=50 ENGINE_DEVICES=auto MAX_STREAMS=512 CLIENTS=${CLIENTS:-4}
    SPEECH_LEVELS=${SPEECH_LEVELS:-1,24,64,256} PORT=18775
    final ;;
  final-check)
    # The final call on this machine's CPU, with its budgets: the tiny CustomVoice and Base checkpoints of
    # tests/data (nothing to make), 1 and 2 streams, the speech API at 1 and 2 (BUDGET=160: it is skipped).
    CPU_CHECK=1 DEVICE=cpu Q06=$ROOT/tests/data/qwen3_tts_tiny F06B=$ROOT/tests/data/qwen3_tts_tiny_base FRAMES=20
    STREAMS_06=1,2 BUDGET=${BUDGET:-290} FIXTURE_S=45 ENGINE_S=215 RESERVE_S=50 ENGINE_DEVICES=cpu MAX_STREAMS=4
    CLIENTS=1 SPEECH_LEVELS=1,2 PORT=${PORT:-28775}
    export PATH=$ROOT/.venv/bin:$PATH GATEWAY_ENGINE_VOICES=alloy=vivian OMP_NUM_THREADS=1
    final ;;
  capacity-0.6b|capacity-1.7b)
    DEVICE=cuda Q06=/tmp/q06 Q17=/tmp/q17 ENGINE_DEVICES=auto MAX_STREAMS=1024 WORKERS=${WORKERS:-12}
    CLIENTS=${CLIENTS:-4} CYCLES=1 PORT=18765 PROFILE=${PROFILE:-15} LIMIT=${LIMIT:-420}
    if [ "$1" = capacity-0.6b ]; then
      capacity 0.6b "$Q06" "${SESSIONS:-1000,1000}" "${ALIGNED:-1000}"
    else
      capacity 1.7b "$Q17" "${SESSIONS:-800,800}" "${ALIGNED:-800}"
    fi ;;
  capacity-check)
    CPU_CHECK=1 DEVICE=cpu Q06=$ROOT/tests/data/qwen3_tts_tiny ENGINE_DEVICES=cpu MAX_STREAMS=4 WORKERS=2 CLIENTS=1
    CYCLES=1 PORT=${PORT:-28765} PROFILE=5 LIMIT=400 MAX_FRAMES=60
    export PATH=$ROOT/.venv/bin:$PATH GATEWAY_ENGINE_VOICES=alloy=vivian OMP_NUM_THREADS=1
    capacity 0.6b "$Q06" 4,4 4 ;;
  family|family-bench|family-more)
    DEVICE=cuda F06B=/tmp/f06b F17B=/tmp/f17b F17D=/tmp/f17d F17C=/tmp/f17c FRAMES=125 FAMILY_STREAMS=1,24,64,256
    VOICES=8
    case $1 in family) family ;; family-bench) family_bench_base ;; family-more) family_more ;; esac ;;
  family-check)
    : "${ORACLE_SITE:?set ORACLE_SITE to the site-packages of an environment holding qwen-tts}"
    CPU_CHECK=1 DEVICE=cpu F06B=/tmp/family-check-a F17B=/tmp/family-check-b F17D=/tmp/family-check-c
    F17C=/tmp/family-check-d FRAMES=6 FAMILY_STREAMS=1,2 VOICES=2
    export PATH=$ROOT/.venv/bin:$PATH OMP_NUM_THREADS=1
    ORACLE_PATH=$ORACLE_SITE:$ROOT
    rm -rf "$F06B" "$F17B" "$F17D" "$F17C"
    for call in family family_bench_base family_more; do
      start=$SECONDS
      "$call"
      log "$call took $((SECONDS - start)) s"
    done ;;
  icl)
    DEVICE=cuda F06B=/tmp/f06b Q06=/tmp/q06 FRAMES=125 FAMILY_STREAMS=1,24,64,256 VOICES=8 BUDGET=${BUDGET:-560}
    STREAMS_06=${STREAMS_06:-1,1024} TESTS_S=90 FIXTURE_S=60 BENCH_S=230
    icl ;;
  icl-check)
    CPU_CHECK=1 DEVICE=cpu F06B=$ROOT/tests/data/qwen3_tts_tiny_base Q06=$ROOT/tests/data/qwen3_tts_tiny FRAMES=6
    FAMILY_STREAMS=1,2 VOICES=2 STREAMS_06=1,2 BUDGET=560 TESTS_S=90 FIXTURE_S=60 BENCH_S=230
    export PATH=$ROOT/.venv/bin:$PATH OMP_NUM_THREADS=1
    icl ;;
  speech|speech-17)
    # The gateway as deployed, `serve --workers N` (the load is HTTP streams; bench_gateway's load generator
    # runs the sessions), and its engine process on the GPU; answers of 125 frames (10 s), two per client; 256
    # at once five times. The load generator (2 processes) has 2 cores of its own, as if on another host; on
    # the other 14, 12 workers: `serve`'s own choice for 14 cores (two left to the engine process).
    DEVICE=cuda Q06=/tmp/q06 Q17=/tmp/q17 F06B=/tmp/f06b F17B=/tmp/f17b FRAMES=125 ENGINE_DEVICES=auto MAX_STREAMS=512
    SPEECH_WORKERS=${SPEECH_WORKERS:-12} CLIENT_CPUS=${CLIENT_CPUS:-2} CLIENTS=${CLIENTS:-2}
    SPEECH_LEVELS=${SPEECH_LEVELS:-1,24,64,256,256,256,256,256} SPEECH_SESSIONS=${SPEECH_SESSIONS:-200}
    SPEECH_SESSION_LEVELS=${SPEECH_SESSION_LEVELS:-24} SPEECH_LIMIT=${SPEECH_LIMIT:-360} BUDGET=520 PORT=18775
    if [ "$1" = speech ]; then speech_size 0.6b "$Q06" "$F06B"; else speech_size 1.7b "$Q17" "$F17B"; fi ;;
  speech-burst)
    # The HTTP path in a burst: the 1.7B speaker, 256 requests at once three times, per gateway setup.
    DEVICE=cuda Q17=/tmp/q17 FRAMES=125 ENGINE_DEVICES=auto MAX_STREAMS=512 PORT=18775
    BURST_LIMIT=${BURST_LIMIT:-150} BURST_LEVELS=${BURST_LEVELS:-1,256,256,256} BURST_SETUPS=${BURST_SETUPS:-8:4 12:4 14:4}
    speech_burst 1.7b "$Q17" ;;
  speech-burst-check)
    CPU_CHECK=1 DEVICE=cpu ENGINE_DEVICES=cpu MAX_STREAMS=4 FRAMES=20 PORT=${PORT:-28775} BURST_LIMIT=150
    BURST_LEVELS=1,2,2 BURST_SETUPS="2:1 1:1:1"
    export PATH=$ROOT/.venv/bin:$PATH GATEWAY_ENGINE_VOICES=alloy=vivian OMP_NUM_THREADS=1
    speech_burst 0.6b "$ROOT/tests/data/qwen3_tts_tiny" ;;
  speech-clones)
    DEVICE=cuda Q06=/tmp/q06 F06B=/tmp/f06b FRAMES=125 ENGINE_DEVICES=auto MAX_STREAMS=512 SPEECH_WORKERS=8 CLIENTS=4
    SPEECH_LEVELS=1,24,64,256 SPEECH_LIMIT=250 BUDGET=0 PORT=18775 FAMILY_STREAMS=1,24,64,256 VOICES=8 BENCH_S=170
    speech_clones ;;
  speech-clones-check)
    CPU_CHECK=1 DEVICE=cpu ENGINE_DEVICES=cpu MAX_STREAMS=4 FRAMES=20 CLIENTS=1 SPEECH_LEVELS=1,2 SPEECH_WORKERS=2
    SPEECH_LIMIT=300 BUDGET=0 PORT=${PORT:-28775} Q06=$ROOT/tests/data/qwen3_tts_tiny
    F06B=$ROOT/tests/data/qwen3_tts_tiny_base FAMILY_STREAMS=1,2 VOICES=2 BENCH_S=170
    export PATH=$ROOT/.venv/bin:$PATH GATEWAY_ENGINE_VOICES=alloy=vivian OMP_NUM_THREADS=1
    speech_clones ;;
  speech-check)
    # The speech call on this machine's CPU: the tiny CustomVoice and Base checkpoints of tests/data (nothing
    # to make), two levels, 2 sessions; the tiny checkpoint's speakers stand in for the voices.
    CPU_CHECK=1 DEVICE=cpu ENGINE_DEVICES=cpu MAX_STREAMS=4 FRAMES=20 CLIENTS=1 SPEECH_LEVELS=1,2 SPEECH_WORKERS=2
    CLIENT_CPUS=1 SPEECH_SESSIONS=2 SPEECH_SESSION_LEVELS=2 SPEECH_LIMIT=300 BUDGET=520 PORT=${PORT:-28775}
    export PATH=$ROOT/.venv/bin:$PATH GATEWAY_ENGINE_VOICES=alloy=vivian OMP_NUM_THREADS=1
    speech_size 0.6b "$ROOT/tests/data/qwen3_tts_tiny" "$ROOT/tests/data/qwen3_tts_tiny_base" ;;
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
  *) sed -n 2,74p "$0"; exit 2 ;;
esac
