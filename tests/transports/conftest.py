"""Fixtures of the transport tests."""

from tests.phones.gateway import phone_gateway  # noqa: F401 - the phone tests' gateway
