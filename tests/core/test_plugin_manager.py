"""The plugin manager against real installed distributions (entry points on sys.path)."""

from __future__ import annotations

import importlib
import textwrap

import pytest

from kdplug.errors import PluginError
from kdplug.plugins import PluginManager

GOOD = """
import kdplug
from torch import nn

class Cosine(nn.Module):
    ild_loss, needs_teacher_heads, default_weights = "mse", False, {"eta": 0.5, "lam": 0.2}
    def __init__(self, request, **options):
        super().__init__()

@kdplug.hookimpl
def kdplug_register_projectors(register):
    register("cosine-test", Cosine, description="a third-party projector")
"""
BROKEN = "raise RuntimeError('this plugin is broken on purpose')\n"
DUPLICATE = """
import kdplug

@kdplug.hookimpl
def kdplug_register_projectors(register):
    register("rkd", lambda request, **kw: None)
    register("dup-own-name", lambda request, **kw: None)
"""
RIVAL = """
import kdplug

@kdplug.hookimpl
def kdplug_register_projectors(register):
    register("dup-own-name", lambda request, **kw: None)
"""
RAISES_IN_HOOK = """
import kdplug

@kdplug.hookimpl
def kdplug_register_losses(register):
    raise ValueError("registration failed on purpose")
"""


def install(site, dist: str, module: str, source: str, *, requires: str = "") -> None:
    """Write a minimal installed distribution: a module plus a dist-info with an entry point."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    metadata = f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n"
    if requires:
        metadata += f"Requires-Dist: {requires}\n"
    (info / "METADATA").write_text(metadata)
    (info / "entry_points.txt").write_text(f"[kdplug]\n{dist} = {module}\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    importlib.invalidate_caches()


def test_third_party_entry_point_is_loaded_with_its_distribution(site):
    install(site, "kdplug-cosine-test", "kdplug_cosine_test", GOOD)
    manager = PluginManager()
    entry = manager.registry.resolve("projector", "cosine-test")[0]
    assert (entry.distribution, entry.version, entry.plugin) == ("kdplug-cosine-test", "1.0", "kdplug-cosine-test")
    assert "pkd-skip" in manager.registry.names("projector")  # first-party plugins load the same way


def test_broken_plugin_is_reported_and_skipped(site):
    install(site, "kdplug-broken-test", "kdplug_broken_test", BROKEN)
    install(site, "kdplug-cosine-test", "kdplug_cosine_test", GOOD)
    manager = PluginManager()
    failure = next(f for f in manager.failures if f.name == "kdplug-broken-test")
    assert failure.distribution == "kdplug-broken-test" and failure.stage == "import"
    assert "broken on purpose" in failure.message()
    assert "cosine-test" in manager.registry.names("projector")


def test_registration_error_only_removes_that_plugin(site):
    install(site, "kdplug-hookfail-test", "kdplug_hookfail_test", RAISES_IN_HOOK)
    manager = PluginManager()
    assert "ce" in manager.registry.names("loss")
    failure = next(f for f in manager.failures if f.name == "kdplug-hookfail-test")
    assert failure.stage == "register" and "on purpose" in failure.error


def test_block_list_from_argument_and_environment(site, monkeypatch):
    install(site, "kdplug-cosine-test", "kdplug_cosine_test", GOOD)
    assert "cosine-test" not in PluginManager(disabled=["kdplug-cosine-test"]).registry.names("projector")
    monkeypatch.setenv("KDPLUG_DISABLE_PLUGINS", "kdplug-cosine-test, pkd")
    manager = PluginManager()
    assert "cosine-test" not in manager.registry.names("projector")
    assert "pkd-skip" not in manager.registry.names("projector")
    assert "alp" in manager.registry.names("projector")


def test_a_plugin_that_reuses_a_built_in_name_is_skipped_and_the_rest_keeps_working(site):
    install(site, "kdplug-dup-test", "kdplug_dup_test", DUPLICATE)
    manager = PluginManager()
    registry = manager.registry  # no error: the built-in keeps its name
    assert registry.resolve("projector", "rkd")[0].distribution == "kdplug"
    assert "dup-own-name" in registry.names("projector")  # the plugin's other names still work
    failure = next(f for f in manager.failures if f.name == "kdplug-dup-test")
    assert failure.stage == "duplicate name"
    assert (
        "'rkd'" in failure.message() and "kdplug-dup-test" in failure.message() and "kdplug 0.1.0" in failure.message()
    )


def test_two_plugins_with_one_name_fail_only_the_runs_that_ask_for_it(site):
    install(site, "kdplug-dup-test", "kdplug_dup_test", DUPLICATE)
    install(site, "kdplug-rival-test", "kdplug_rival_test", RIVAL)
    manager = PluginManager()
    registry = manager.registry
    assert "alp" in registry.names("projector")
    with pytest.raises(PluginError) as error:
        registry.resolve("projector", "dup-own-name")
    assert "kdplug-dup-test" in str(error.value) and "kdplug-rival-test" in str(error.value)
    assert "--disable-plugin" in str(error.value)
    assert error.value.exit_code == 2  # the user picks one: a usage error, as docs/robustness.md says
    assert {f.name for f in manager.failures if f.stage == "duplicate name"} >= {"kdplug-dup-test", "kdplug-rival-test"}


def test_plugin_needing_a_newer_kdplug_is_skipped_with_a_clear_message(site):
    install(site, "kdplug-future-test", "kdplug_future_test", GOOD, requires="kdplug>=99")
    manager = PluginManager()
    failure = next(f for f in manager.failures if f.name == "kdplug-future-test")
    assert failure.stage == "version" and "kdplug>=99" in failure.error
    assert "cosine-test" not in manager.registry.names("projector")
