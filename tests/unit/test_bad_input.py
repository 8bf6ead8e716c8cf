"""Topical: the bad-input matrix (helpers/reliability_cases.py) on the driver:
the driver helper and the hook raise the documented error (the agent of a
real node: tests/cluster/test_bad_input.py)."""

import pytest

from ray_megatron_env import build_runtime_env
from ray_megatron_env.hook import runtime_env_hook
from reliability_cases import BAD_INPUTS


def test_the_matrix_is_big_enough_and_ids_are_unique():
    assert len(BAD_INPUTS) >= 40
    assert len({case.id for case in BAD_INPUTS}) == len(BAD_INPUTS)


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda case: case.id)
def test_driver_helper_refuses(case):
    base = {k: v for k, v in case.runtime_env.items() if k != "megatron_env"}
    with pytest.raises(case.error) as info:
        build_runtime_env(case.runtime_env["megatron_env"], base=base)
    assert str(info.value).startswith("megatron_env: ") and case.says in str(info.value)


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda case: case.id)
def test_hook_refuses(case):
    with pytest.raises(case.error) as info:
        runtime_env_hook(dict(case.runtime_env))
    assert case.says in str(info.value)
