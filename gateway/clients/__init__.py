"""Clients of a Realtime endpoint, ours or OpenAI's: the terminal client (cli.py) and the headless replay
(replay.py), over WebSocket or WebRTC (connection.py). The server never imports them.
"""
