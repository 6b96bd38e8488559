"""A WebRTC offer's SDP text, read before aiortc sees it: which media it has, and what makes it unusable in words a
client can act on (aiortc's own errors are cryptic). No aiortc here: the signalling checks offers without it."""

from __future__ import annotations


def has_media(sdp: str, kind: str) -> bool:
    """Whether an SDP has a media line of ``kind`` ("audio", "application"): its lines, not its text anywhere."""
    return any(line.strip().startswith(f"m={kind} ") for line in sdp.splitlines())


def offer_problem(sdp: str) -> str | None:
    """What makes a body unusable as an SDP offer, in words (aiortc's own errors are cryptic)."""
    if not sdp.strip():
        return "The body is empty: send the SDP offer (application/sdp)."
    if not sdp.lstrip().startswith("v=0"):
        return "The body is not an SDP offer (it should start with 'v=0')."
    lines = [line.strip() for line in sdp.splitlines()]
    if not has_media(sdp, "audio") and not has_media(sdp, "application"):
        return "The offer has no media: it needs an audio track (m=audio) and/or a data channel (m=application)."
    if "a=end-of-candidates" in lines and not any(line.startswith("a=candidate:") for line in lines):
        # Gathering ended with nothing to offer: the answer could never connect, and the call would hold a
        # pending place until its connect timeout.
        return "The offer's ICE gathering ended with no candidates: nothing can connect to it."
    return None
