"""The suites: each a module with HELP (a line), HOW (how to run it, for the page), ``add_arguments(parser)`` and
``run(args)``, which measures and returns the record's body: its ``setup`` label, ``settings`` and ``levels``."""

NAMES = ("engine", "gateway", "speech", "webrtc", "turns", "demo", "peers", "local", "transport", "balancer", "live",
         "phone", "noise")
