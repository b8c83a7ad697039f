"""Plugins' own model types reach transformers' Auto classes (kdplug.model_types), against real
installed distributions in a fresh process (the registration runs once per process)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# A plugin module written as `kdplug new-plugin --kind student` once wrote it: transformers' Auto
# classes imported at the top, so importing the plugin sets off the registration of its own model
# type while the module is still half imported.
SELF_REGISTERING = """
from transformers import AutoConfig, AutoModelForSequenceClassification, PretrainedConfig

import kdplug


class SelfConfig(PretrainedConfig):
    model_type = "kdplug-self-registering-test"


@kdplug.hookimpl
def kdplug_register_projectors(register):
    pass


def register_model_types():
    AutoConfig.register(SelfConfig.model_type, SelfConfig, exist_ok=True)
"""

CHECK = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import kdplug
    from kdplug.plugins import PluginManager
    PluginManager().registry  # loads the plugins: the test plugin imports transformers' Auto classes
from transformers import AutoConfig
print(type(AutoConfig.for_model("kdplug-self-registering-test")).__name__)
print("warnings:", [str(w.message) for w in caught if "model types" in str(w.message)])
"""


def test_a_plugin_importing_the_auto_classes_at_its_top_registers_its_model_type_without_a_warning(tmp_path):
    (tmp_path / "kdplug_self_registering.py").write_text(textwrap.dedent(SELF_REGISTERING))
    info = tmp_path / "kdplug_self_registering-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kdplug-self-registering\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[kdplug]\nself-registering = kdplug_self_registering\n\n"
        "[kdplug.model_types]\nself-registering = kdplug_self_registering:register_model_types\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["SelfConfig", "warnings: []"], done.stdout + done.stderr[-2000:]
