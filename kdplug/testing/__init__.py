"""Helpers for testing kdplug and its plugins: tiny models (:mod:`kdplug.testing.tiny`), a tiny
run's command line (:func:`tiny_run_args`), contracts (:mod:`kdplug.testing.contracts`)."""

from .runs import set_args, tiny_run_args, tiny_run_settings

__all__ = ["set_args", "tiny_run_args", "tiny_run_settings"]
