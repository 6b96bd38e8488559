"""A SIP endpoint in the gateway: phones and trunks call it directly, or through a proxy or PBX.

signalling.py is the user-agent server (RFC 3261: INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, NOTIFY in;
BYE and REFER out), listener.py its UDP, TCP and TLS sockets and the bounds on what a source may send,
sdp.py the offer/answer (RFC 4566/3264), rtp.py and media.py the audio: G.711 over RTP (RFC 3550),
DTMF by RFC 4733, a reordering jitter buffer, played on one media clock for every call.
"""
