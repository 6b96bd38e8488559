"""Phone calls in OpenAI's call model: pending calls, their webhook, the decisions on them, their sideband.

A line (a SIP dialog, gateway/transports/sip/; a Twilio media stream, gateway/transports/twilio.py) brings
a call in; ``PhoneCalls`` (phone_calls.py) makes it pending with an id ``rtc_...``, sends the
``realtime.call.incoming`` webhook (webhooks.py) and carries out the application's decision
(control.py's routes): accept opens a Realtime session on the line, like any other transport's.
"""
