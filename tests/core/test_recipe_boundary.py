"""A recipe sees only what kdplug.types.RecipeContext declares: the engine's configuration,
registry and caches stay out of its reach, on a real run."""

from __future__ import annotations

import pytest

import kdplug
from kdplug.plugins import PluginManager
from kdplug.testing import tiny_run_settings


class ReachesForTheConfig:
    """A recipe that reads the engine's configuration instead of ``ctx.settings``."""

    def run(self, ctx):
        seen = {"has config": hasattr(ctx, "config"), "config in dir": "config" in dir(ctx)}
        with pytest.raises(AttributeError, match="read-only"):
            ctx.config = None
        ReachesForTheConfig.seen = seen
        return ctx.config.epochs


class Plugin:
    @kdplug.hookimpl
    def kdplug_register_recipes(self, register):
        register("reaches-for-the-config", ReachesForTheConfig, description="reads ctx.config")


@pytest.fixture
def manager():
    previous = kdplug.get_plugin_manager()
    manager = PluginManager()
    manager.register(Plugin(), "reaches-for-the-config")
    kdplug.set_plugin_manager(manager)
    yield manager
    kdplug.set_plugin_manager(previous)


def test_a_recipe_cannot_reach_the_engines_config(manager, tmp_path, tiny_bert_dir, sst2_dir):
    settings = tiny_run_settings(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), measure_speed=False)
    with pytest.raises(AttributeError) as raised:
        kdplug.distill(**settings, recipe="reaches-for-the-config", output=str(tmp_path / "run"), echo=None)
    assert "a recipe's context has no 'config'" in str(raised.value)
    assert "use settings" in str(raised.value)  # what to read instead
    assert ReachesForTheConfig.seen == {"has config": False, "config in dir": False}
