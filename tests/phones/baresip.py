"""The tests' SIP phone: baresip, driven by bench/phones.py (the phone suite drives the same one)."""

from bench.phones import BARESIP, Baresip, free_sip_port, phone_wav

__all__ = ["BARESIP", "Baresip", "free_sip_port", "phone_wav"]
