"""Where the tests' files are, whichever folder a test lives in."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
DATA = TESTS / "data"
TINY_CHECKPOINT = DATA / "qwen3_tts_tiny"
JS = TESTS / "js"
