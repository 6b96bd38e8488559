"""The wheels a GPU host lacks, gathered here for the device tool to carry (the host has no internet).

    python -m bench.wheels [--oracle] [--speech-formats]

A GPU host of the device tool has Python 3.12 with torch, triton, numpy, onnxruntime, prometheus-client,
aiohttp and uvloop. This downloads, for CPython 3.12 on manylinux x86_64:

- .whl/: the gateway's runtime that the host lacks or has too old (aiohttp, the backends' HTTP client, and
  openai for `gateway --backends`'s comparison; pyzmq for the engine processes; uvicorn, starlette and httptools
  for the server; py-spy for the CPU by stage; pybase64 for the audio payloads; aiosipua, which the app imports
  for phone calls). Not mcp, nor webrtc-noise-gain: the benchmarks' gateway runs with [mcp] off and no noise
  reduction.
- .site-slim/: of the silero-vad wheel, the Silero package with its ONNX model and the TorchScript one the engine
  processes run (4 MB, copied into the host's site as it is). The Smart Turn model needs nothing: the gateway
  ships it (gateway/models).
- with --oracle, .whl-oracle/: the official qwen-tts 0.1.1 and transformers 4.57.3, for the peers suite
  (--oracle-site) and the parity fixtures; with --speech-formats, .whl-speech/: PyAV, for the speech API's
  compressed formats (pcm needs none).

A device call carries 64 MiB at most: .whl and .site-slim fit together; the others travel only in the calls that
need them. bench/device.sh installs them there.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = """websockets==15.0.1 orjson==3.13.0 soxr==1.1.0 pyzmq==27.3.0 openai==3.54.0 httpx2==2.16.2 httpcore2==2.16.2
truststore==0.10.5 jiter==0.19.0 sniffio==1.3.1 pydantic==2.14.3 pydantic-core==2.50.4 typing-inspection==0.4.5
annotated-types==0.8.0 typing-extensions==4.16.0 anyio==4.16.0 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1
propcache==0.5.4 frozenlist==1.8.0 aiosignal==1.4.0 aiohappyeyeballs==2.7.1 attrs==26.1.0 starlette==1.10.0
uvicorn==0.54.0 httptools==0.9.0 py-spy==0.4.3 cryptography==50.0.2 cffi==2.0.0 pycparser==2.23
pybase64==1.5.1 aiosipua==0.7.1""".split()
SLIM = ["silero-vad==6.2.3"]
# qwen-tts pins transformers 4.57.3, which wants tokenizers <= 0.23.0 and huggingface-hub < 1.0; librosa and
# soundfile are imported by its model files
ORACLE = """qwen-tts==0.1.1 transformers==4.57.3 tokenizers==0.22.1 huggingface-hub==0.36.0 accelerate==1.12.0
librosa==0.11.0 audioread==3.1.0 decorator==5.2.1 pooch==1.8.2 platformdirs==4.5.0 soundfile==0.13.1 cffi==2.0.0
pycparser==2.23 soxr==1.1.0""".split()
SPEECH = ["av==18.1.0"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]


def download(names: list[str], into: Path) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(into), *names],
                   check=True)


def slim(into: Path) -> None:
    """The Silero package of the silero-vad wheel, with its models for onnxruntime and for the engine."""
    with tempfile.TemporaryDirectory() as folder:
        download(SLIM, Path(folder))
        (silero,) = Path(folder).glob("silero_vad-*.whl")
        with zipfile.ZipFile(silero) as wheel:
            for name in wheel.namelist():
                if name.startswith("silero_vad/") and name.endswith((".py", "/silero_vad.onnx", "/silero_vad.jit")):
                    wheel.extract(name, into)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--oracle", action="store_true", help="also .whl-oracle/: the official qwen-tts")
    parser.add_argument("--speech-formats", action="store_true", help="also .whl-speech/: PyAV")
    args = parser.parse_args()
    plan = [(".whl", GATEWAY), (".site-slim", None)]
    plan += [(".whl-oracle", ORACLE)] * args.oracle + [(".whl-speech", SPEECH)] * args.speech_formats
    for name, wheels in plan:
        folder = ROOT / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        if wheels is None:
            slim(folder)
        else:
            download(wheels, folder)
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        print(f"{name}/: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
