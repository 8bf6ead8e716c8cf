"""Against AReaL itself (1.0.4): its own config loading, and the object its
entry points hold, passed to build_runtime_env as it is. Runs where AReaL's
config module imports; .ci/run installs it (pip install --no-deps
areal==1.0.4 and the areal-test extra: what areal.api.cli_args imports).

The fixtures under fixtures/areal/examples/ mirror AReaL's example YAMLs of
the same path at v1.0.4. Expected values are written by hand from the rule
table and match docs/frameworks.md's AReaL table: a Megatron TP=1 actor (and
critic) with an SGLang rollout asks nothing anywhere; TP=2 CP=2 asks 1 below
compute capability 10.
"""

import asyncio
import contextlib
import json
import logging

import pytest


@contextlib.contextmanager
def areal_contained():
    """AReaL's getLogger (areal/utils/logging.py) swaps the root logger and
    manager and runs dictConfig with disable_existing_loggers: every other
    test's loggers and caplog would go quiet. Its cli_args module also runs
    uvloop.install() on import, which sets asyncio's loop policy for the
    whole process (and Ray's driver in later tests). Put everything back."""
    policy = asyncio.get_event_loop_policy()
    manager, root = logging.Logger.manager, logging.root
    loggers = {name: (lg, lg.disabled, lg.level, list(lg.handlers), lg.propagate)
               for name, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    root_state = (root.level, list(root.handlers), root.disabled)
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(policy)
        logging.Logger.manager, logging.Logger.root, logging.root = manager, root, root
        root.level, root.handlers[:], root.disabled = root_state[0], root_state[1], root_state[2]
        for lg, disabled, level, handlers, propagate in loggers.values():
            lg.disabled, lg.level, lg.propagate = disabled, level, propagate
            lg.handlers[:] = handlers
        manager._clear_cache()


from omegaconf import OmegaConf

from ray_megatron_env import build_runtime_env
from ray_megatron_env.explanation import explain
from paths import FIXTURES


@pytest.fixture(scope="module")
def cli_args():
    """AReaL's config module, imported when a test here runs, not when the
    module is collected: the import takes seconds (torch among others), and
    a run that deselects these tests (-m slow) would pay it anyway."""
    with areal_contained():
        return pytest.importorskip(
            "areal.api.cli_args",
            reason="AReaL is not installed; .ci/run installs areal 1.0.4 without its dependency tree")


EXAMPLES = FIXTURES / "areal" / "examples" / "math"
GRPO = EXAMPLES / "gsm8k_grpo_megatron.yaml"
PPO = EXAMPLES / "gsm8k_ppo_megatron.yaml"
GPUS = ("8.0", "9.0", "10.0", "9.0,10.0")
KL_CTL_0 = {"ref": "actor.kl_ctl is 0, so AReaL creates no ref engine"}

# By hand: what each example's field holds (docs/frameworks.md, AReaL table).
GOLDEN = {
    GRPO: ("GRPOConfig", {
        "version": 2, "framework": "areal", "replaces": "1", "omitted": KL_CTL_0,
        "engines": {"actor": {"strategy": "megatron"}, "rollout": {"strategy": "sglang"}},
        "processes": [{"roles": ["actor"], "variable": "AREAL_SPMD_MODE", "prefix": "1"}]}),
    PPO: ("PPOConfig", {
        "version": 2, "framework": "areal", "replaces": "1", "omitted": KL_CTL_0,
        "engines": {"actor": {"strategy": "megatron"}, "critic": {"strategy": "megatron"},
                    "rollout": {"strategy": "sglang"}},
        "processes": [{"roles": ["actor", "critic"], "variable": "AREAL_SPMD_MODE",
                       "prefix": "1"}]}),
}


def areal_loads(cli_args, path, config_class, *overrides):
    """What AReaL's load_expr_config does before it touches the file system:
    Hydra compose, merge onto the config class (named), then the dataclass
    object."""
    from hydra.core.global_hydra import GlobalHydra

    with areal_contained():
        raw, _ = cli_args.parse_cli_args(["--config", str(path), *overrides])
        GlobalHydra.instance().clear()  # parse_cli_args leaves Hydra initialised
        structured = cli_args.to_structured_cfg(raw, config_cls=getattr(cli_args, config_class))
        return raw, structured, OmegaConf.to_object(structured)


@pytest.mark.parametrize("path", sorted(GOLDEN), ids=lambda p: p.name)
def test_areals_own_objects_give_the_same_field_as_the_file(cli_args, path):
    config_class, expected = GOLDEN[path]
    raw, structured, loaded = areal_loads(cli_args, path, config_class)
    assert type(loaded) is getattr(cli_args, config_class)
    for form in (str(path), raw, structured, loaded):
        env = build_runtime_env(form)
        assert env["megatron_env"] == expected, type(form)
        json.dumps(env)  # nothing that cannot become JSON reaches the runtime env


@pytest.mark.parametrize("path", sorted(GOLDEN), ids=lambda p: p.name)
def test_areals_object_on_each_gpu_class(cli_args, path):
    _, _, loaded = areal_loads(cli_args, path, GOLDEN[path][0])
    assert [explain(loaded, gpus).value for gpus in GPUS] == [None, None, None, None]
    # AReaL's own "1" in a worker's env_vars is decided anew: removed.
    assert explain(loaded, "9.0", explicit="1").value is None


def test_a_command_line_override_reaches_the_field(cli_args):
    # docs/en/tutorial/megatron.md's MoE layout, as Hydra overrides.
    _, _, loaded = areal_loads(cli_args, GRPO, "GRPOConfig",
                               'actor.backend="megatron:(attn:d1p4t2c2|ffn:d1p4t1e4)"',
                               "rollout.backend=sglang:d4t4")
    assert build_runtime_env(loaded)["megatron_env"]["engines"]["actor"] == {
        "strategy": "megatron", "tensor_parallel": 2, "context_parallel": 2,
        "expert_parallel": 4}
    assert [explain(loaded, gpus).value for gpus in GPUS] == ["1", "1", None, "1"]


def test_areals_loader_and_this_reader_refuse_a_missing_actor_backend(cli_args, tmp_path):
    text = GRPO.read_text().replace('  backend: "megatron:d4p1t1"', '  backnd: "megatron:d4p1t1"')
    broken = tmp_path / "broken.yaml"
    broken.write_text(text)
    with pytest.raises(Exception):  # AReaL: unknown key, or backend MISSING
        areal_loads(cli_args, broken, "GRPOConfig")
    with pytest.raises(ValueError, match=r"actor\.backend is missing"):
        build_runtime_env(str(broken))
