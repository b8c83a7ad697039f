"""Helpers for testing kdplug and its plugins (tiny models: :mod:`kdplug.testing.tiny`)."""
