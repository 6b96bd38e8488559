import random

import pytest

from gateway.responders.text_bridge import TextBridge


def raw_segments(text: str, starter: int = 24, cap: int = 160, step: int | None = None) -> list[str]:
    """Feed ``text`` whole (step None) or in deltas of ``step`` characters."""
    bridge = TextBridge(starter_chars=starter, max_segment_chars=cap)
    out: list[str] = []
    pieces = [text] if step is None else [text[i : i + step] for i in range(0, len(text), step)]
    for piece in pieces:
        out += bridge.feed(piece)
    return out + bridge.end()


def segment(text: str, starter: int = 24, cap: int = 160, step: int | None = None) -> list[str]:
    """The segments as the TTS engine gets them."""
    return [s.strip() for s in raw_segments(text, starter, cap, step)]


def test_starter_cut_at_first_punctuation():
    assert segment("Sure, I can help with that. What do you need?") == [
        "Sure,",
        "I can help with that.",
        "What do you need?",
    ]


def test_starter_cut_at_first_word_boundary_past_starter_chars():
    text = "The quick brown fox jumps over the lazy dog and keeps running far away"
    out = segment(text, starter=10)
    assert out[0] == "The quick brown"  # "brown" crosses character 10; the cut waits for its end
    assert " ".join(out) == text


def test_later_segments_wait_for_punctuation():
    text = "Hi. The quick brown fox jumps over the lazy dog and keeps running far away"
    assert segment(text, starter=5) == ["Hi.", text[4:]]


def test_clause_punctuation_and_question_marks():
    text = "Well; first: do this! Then? That, and more."
    assert segment(text) == ["Well;", "first:", "do this!", "Then?", "That,", "and more."]


def test_numbers_and_abbreviations_are_not_cut():
    text = "Version 3.5 costs 1,000 dollars, says Dr. Smith. Really."
    assert segment(text) == ["Version 3.5 costs 1,000 dollars,", "says Dr. Smith.", "Really."]


def test_closing_quotes_stay_with_their_sentence():
    assert segment('He said "yes." Then left.') == ['He said "yes."', "Then left."]


def test_punctuation_runs_stay_together():
    assert segment("Really?! Wait... okay.") == ["Really?!", "Wait...", "okay."]


def test_punctuation_is_not_decided_until_the_next_character():
    bridge = TextBridge()
    assert bridge.feed("Costs 3.") == []
    assert bridge.feed("5 now, ok") == ["Costs 3.5 now,"]
    assert bridge.end() == [" ok"]


def test_segments_keep_the_whitespace_before_them():
    text = "  Sure, I can.\nHere:\n\n- one\n- two 🙂  "
    out = raw_segments(text, starter=3)
    assert out == ["Sure,", " I can.", "\nHere:", "\n\n- one\n", "- two 🙂"]


def test_cap_cuts_at_a_word_boundary():
    words = " ".join(f"word{i}" for i in range(60))
    out = segment(words, starter=1000, cap=40)
    assert all(len(s) <= 40 for s in out)
    assert " ".join(out) == words
    assert all(s.split()[-1].startswith("word") for s in out)  # no word split


def test_cap_cuts_a_giant_word():
    assert segment("x" * 25, starter=1000, cap=10) == ["x" * 10, "x" * 10, "x" * 5]


def test_newline_is_a_boundary_and_leading_whitespace_is_dropped():
    assert segment("\n\n  Here is a list\n- one\n- two") == ["Here is a list", "- one", "- two"]


def test_unspeakable_segments_are_merged_or_dropped():
    assert segment("... Hello. 🙂") == ["... Hello."]


def test_cjk_punctuation():
    text = "好的，我明白了。你想知道什么？我们可以；慢慢来：一步、一步。"
    assert segment(text) == [
        "好的，",
        "我明白了。",
        "你想知道什么？",
        "我们可以；",
        "慢慢来：",
        "一步、",
        "一步。",
    ]


def test_cjk_starter_and_cap_by_characters():
    text = "今天天气非常好我们一起去公园散步然后去吃午饭吧"
    out = segment(text, starter=6, cap=8)
    assert out[0] == "今天天气非常"
    assert all(len(s) <= 8 for s in out)
    assert "".join(out) == text


def test_cjk_punctuation_at_end_of_delta_waits_for_closer():
    bridge = TextBridge()
    assert bridge.feed("他说「好。") == []
    assert bridge.feed("」然后") == ["他说「好。」"]
    assert bridge.end() == ["然后"]


def test_mixed_latin_comma_before_cjk():
    assert segment("好的,我们开始吧. OK") == ["好的,", "我们开始吧.", "OK"]


def test_end_resets_for_a_new_response():
    bridge = TextBridge(starter_chars=5)
    bridge.feed("First response here")
    bridge.end()
    assert bridge.feed("Second one, yes") == ["Second", " one,"]  # a new starter


TEXTS = [
    "Sure, I can help with that. Version 3.5 costs 1,000 dollars, says Dr. Smith! Really?! Wait...",
    "The quick brown fox jumps over the lazy dog " * 8,
    "好的，我明白了。今天天气非常好我们一起去公园散步然后去吃午饭吧「真的吗？」当然。",
    'He said "yes." Then\nleft; and 1.5 hours later: nothing, ok.',
]


@pytest.mark.parametrize("text", TEXTS)
def test_segmentation_does_not_depend_on_delta_sizes(text):
    whole = raw_segments(text, starter=12, cap=40)
    assert "".join(whole) == text.strip()
    rng = random.Random(7)
    for step in (1, 2, 3, 5, 8):
        assert raw_segments(text, starter=12, cap=40, step=step) == whole
    # irregular deltas, as an LLM streams them
    bridge = TextBridge(starter_chars=12, max_segment_chars=40)
    out: list[str] = []
    i = 0
    while i < len(text):
        n = rng.randint(1, 7)
        out += bridge.feed(text[i : i + n])
        i += n
    assert out + bridge.end() == whole
    assert all(len(s) <= 40 for s in whole)
