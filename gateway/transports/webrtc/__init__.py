"""The WebRTC transport: signalling over HTTP (signalling.py), calls with Opus audio and the ``oai-events``
data channel (calls.py), and the aiortc audio both ends of a call share (media.py). aiortc is the optional
``webrtc`` extra: only signalling.py is imported without it, and answers 404.
"""
