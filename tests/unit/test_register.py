"""register.py: the RAY_RUNTIME_ENV_PLUGINS value, merged with the one a
node already has, and each of its text forms, called directly. The
``register`` verb, every format end to end: tests/unit/test_cli.py."""

import json
import subprocess

import pytest

from ray_megatron_env.errors import RegistrationError
from ray_megatron_env.register import FORMATS, merged_plugins, render

OURS = {"class": "ray_megatron_env.plugin.MegatronEnvPlugin"}


def test_the_class_registered_is_the_plugin():
    from ray_megatron_env.plugin import MegatronEnvPlugin

    assert merged_plugins(None) == [OURS]
    assert MegatronEnvPlugin.__module__ + "." + MegatronEnvPlugin.__name__ == OURS["class"]


@pytest.mark.parametrize("existing", [None, "", "  \n", "[]"])
def test_nothing_registered_yet_gives_this_plugin_alone(existing):
    assert merged_plugins(existing) == [OURS]


def test_an_entry_of_any_shape_is_kept_as_it_is():
    existing = json.dumps(["acme.Plugin", {"class": "b.P", "priority": 7, "x": [1]}, OURS])
    assert merged_plugins(existing, priority=0) == [
        "acme.Plugin", {"class": "b.P", "priority": 7, "x": [1]}, {**OURS, "priority": 0}]


@pytest.mark.parametrize("priority,allowed", [(0, True), (100, True), (-1, False), (101, False)])
def test_the_priority_is_rays_range(priority, allowed):
    if allowed:
        assert merged_plugins(None, priority) == [{**OURS, "priority": priority}]
    else:
        with pytest.raises(RegistrationError, match=f"from 0 to 100 .*got {priority}"):
            merged_plugins(None, priority)


def test_the_json_form_is_the_value_alone():
    assert render([OURS], "json") == '[{"class": "ray_megatron_env.plugin.MegatronEnvPlugin"}]'


def test_the_shell_form_keeps_a_quote_inside_the_value():
    plugins = [{"class": "it's.P"}, OURS]
    line = render(plugins, "shell")
    echoed = subprocess.run(["bash", "-c", f'{line}; printf %s "$RAY_RUNTIME_ENV_PLUGINS"'],
                            capture_output=True, text=True, check=True).stdout
    assert json.loads(echoed) == plugins


def test_an_unknown_format_lists_the_known_ones():
    assert FORMATS == ("shell", "json", "kuberay", "kuberay-operator")
    with pytest.raises(RegistrationError, match="--format must be one of shell, json, kuberay, "
                                                "kuberay-operator, got 'toml'"):
        render([OURS], "toml")


@pytest.mark.parametrize("fmt", ["kuberay", "kuberay-operator"])
def test_the_kuberay_forms_say_which_priority_applies_without_one(fmt):
    # docs/cli.md: --priority defaults to the class's, 90.
    assert "without a priority in the list, its class's 90 applies" in render([OURS], fmt)
