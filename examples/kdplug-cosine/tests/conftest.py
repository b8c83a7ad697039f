import pytest

pytest_plugins = ["kdplug.testing.pytest_plugin"]


@pytest.fixture
def kdplug_plugin_under_test():
    # the entry-point name once installed; kdplug.testing also accepts the module path
    return "kdplug_cosine.cosine"
