#!/usr/bin/env bash
# On a GPU host of the device tool (carry .whl and .site-slim: python -m bench.wheels makes them): installs the
# wheels into /tmp/site, then runs each argument as one `python3 -m bench` command on the GPU, writing its record
# into $OUT and everything it prints into $OUT/log.txt (a command that outlasts STEP_S seconds is stopped).
#
#   BENCH_COMMIT=<hash> BENCH_HOST_KIND=nvidia-h100-x1 bash bench/device.sh "engine --model 0.6b" "gateway ..."
set -uo pipefail
cd "$(dirname "$0")/.."
log="$OUT/log.txt"
export PYTHONUNBUFFERED=1 BENCH_RECORDS="$OUT" TRITON_CACHE_AUTOTUNING=1
if [ -d .whl ]; then  # the gateway's (a peers-only call may carry .whl-oracle alone: 64 MiB a call)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
fi
if [ -d .site-slim ]; then
  cp -r .site-slim/silero_vad /tmp/site/
fi
if [ -d .whl-oracle ]; then  # the peers suite's official qwen-tts: --oracle-site /tmp/site-oracle
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-oracle \
    .whl-oracle/*.whl || exit 1
fi
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
{ nvidia-smi -L; nproc; python3 -c "import torch; print(torch.__version__, torch.version.cuda)"; } >>"$log" 2>&1
for command in "$@"; do
  echo "[$(date -u +%T)] python3 -m bench $command --device cuda" | tee -a "$log"
  # shellcheck disable=SC2086  # each argument is one command line, split into its words
  timeout --kill-after=10 "${STEP_S:-540}" python3 -m bench $command --device cuda >>"$log" 2>&1
  echo "[$(date -u +%T)] exit $?" | tee -a "$log"
done
tail -n 40 "$log"
