"""Against SkyRL itself (0.4.0): the config object its entry points build
from their argv (``SkyRLTrainConfig.from_cli_overrides``, and
``SFTConfig.from_cli_overrides`` for ``skyrl.train.main_sft``), passed to
build_runtime_env as it is, reads as the override list does. Runs where
SkyRL's config module imports (Python >= 3.12); .ci/run installs it
(``pip install --no-deps skyrl==0.4.0`` and the ``skyrl-test`` extra: what
``skyrl.train.config`` imports).

What stands in for anything heavy: ``SkyRLTrainConfig.__post_init__``
imports ``_uses_lora_weight_sync`` from
``skyrl.backends.skyrl_train.inference_servers.utils``, a module that
imports vLLM and torch (and patches vLLM at import). A stand-in module of
that name answers False ("no LoRA adapter sync"), which only decides a
warning about ``enforce_eager`` with LoRA there; no key read here depends on
it. Nothing else is replaced: the dataclasses, the override parser and the
defaults are SkyRL's.
"""

import shlex
import sys
import types
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Dict, Optional

import pytest

_STAND_IN = "skyrl.backends.skyrl_train.inference_servers.utils"
if _STAND_IN not in sys.modules:
    _module = types.ModuleType(_STAND_IN)
    _module._uses_lora_weight_sync = lambda cfg: False
    sys.modules[_STAND_IN] = _module

config = pytest.importorskip(
    "skyrl.train.config",
    reason="SkyRL is not installed (Python >= 3.12); .ci/run installs skyrl 0.4.0 without its "
           "dependency tree")
sft_config = pytest.importorskip("skyrl.train.config.sft_config")

from ray_megatron_env import build_runtime_env  # noqa: E402
from ray_megatron_env.explanation import explain  # noqa: E402
from paths import FIXTURES

FIXTURES = FIXTURES / "skyrl"
GPUS = ("8.0", "9.0", "10.0")

# script -> value on GPUS, by hand (the table; tests/unit/frameworks/test_skyrl.py's GOLDEN).
SCRIPTS = {
    "run_megatron.txt": ("1", "1", None),
    "run_megatron_qwen3-30b-a3b.txt": ("1", "1", None),
    "run_megatron_lora_qwen3-0.6b.txt": (None, None, None),
    "run_megatron_grpo_glm4_7_30b.txt": (None, None, None),
    "run_fsdp_baseline.txt": (None, None, None),
}
DAPO = "run_megatron_dapo_qwen3_4b.txt"


def args_of(name):
    return shlex.split((FIXTURES / name).read_text().replace("\\\n", " "), comments=True)


def field(cfg):
    return build_runtime_env(cfg)["megatron_env"]


def test_the_config_is_skyrls_own_dataclass():
    cfg = config.SkyRLTrainConfig.from_cli_overrides(args_of("run_megatron.txt"))
    assert type(cfg) is config.SkyRLTrainConfig
    assert cfg.trainer.policy.megatron_config.tensor_model_parallel_size == 2


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_skyrls_object_reads_as_its_overrides(name):
    args = args_of(name)
    cfg = config.SkyRLTrainConfig.from_cli_overrides(args)
    assert field(cfg) == field(args)
    assert tuple(explain(cfg, gpus).value for gpus in GPUS) == SCRIPTS[name]


def dapo_config():
    """The config class of examples/train/algorithms/dapo/main_dapo.py, built
    as it builds it (that file imports torch, so its two fields are
    declared here as it declares them)."""
    @dataclass
    class DAPOAlgorithmConfig(config.AlgorithmConfig):
        overlong_buffer_len: int = 512
        overlong_buffer_penalty_factor: float = 1.0

    return config.make_config(algorithm_cls=DAPOAlgorithmConfig)


def test_the_dapo_entry_points_extended_config():
    args = args_of(DAPO)
    with pytest.raises(ValueError, match="overlong_buffer_len"):
        config.SkyRLTrainConfig.from_cli_overrides(args)  # the base class refuses DAPO's keys
    cfg = dapo_config().from_cli_overrides(args)
    assert cfg.trainer.algorithm.overlong_buffer_len == 4096
    assert field(cfg) == field(args)
    assert field(cfg)["replaces"] == "1"
    assert tuple(explain(cfg, gpus).value for gpus in GPUS) == ("1", "1", None)


def test_defaults_are_skyrls():
    # An almost empty override list: every key read falls back to SkyRL's default.
    args = ["trainer.policy.model.path=Qwen/Qwen3-0.6B"]
    assert field(config.SkyRLTrainConfig.from_cli_overrides(args)) == field(args)
    megatron = ["trainer.strategy=megatron",
                "trainer.policy.megatron_config.tensor_model_parallel_size=2"]
    cfg = config.SkyRLTrainConfig.from_cli_overrides(megatron)
    assert cfg.trainer.ref.megatron_config.tensor_model_parallel_size == 1  # the ref's own
    assert field(cfg) == field(megatron)


def test_transformer_config_kwargs_read_from_skyrls_object():
    kw = "trainer.policy.megatron_config.transformer_config_kwargs"
    args = ["trainer.strategy=megatron",
            "trainer.policy.megatron_config.tensor_model_parallel_size=2",
            "trainer.policy.megatron_config.expert_model_parallel_size=8",
            f"{kw}.overlap_moe_expert_parallel_comm=true",
            f"{kw}.moe_token_dispatcher_type=flex"]
    cfg = config.SkyRLTrainConfig.from_cli_overrides(args)
    policy = field(cfg)["engines"]["policy"]
    assert policy.get("moe_overlap") is True and policy.get("dispatcher") == "deepep"
    assert field(cfg) == field(args)


@pytest.mark.parametrize("args", [
    ["model.path=Qwen/Qwen3-0.6B"],  # SFTConfig's megatron_config default: TP=2, PP=2
    ["model.path=Qwen/Qwen3-0.6B", "megatron_config.context_parallel_size=2"],
    ["strategy=fsdp", "model.path=Qwen/Qwen3-0.6B"],
])
def test_the_sft_entry_points_config(args):
    cfg = sft_config.SFTConfig.from_cli_overrides(args)
    assert field(cfg) == field(args)
    assert field(cfg)["framework"] == "skyrl-sft"


# --- Entry points beyond main_base ---------------------------------------------------

MEGATRON_TP2 = ["trainer.strategy=megatron",
                "trainer.policy.megatron_config.tensor_model_parallel_size=2"]


def harbor_config():
    """HarborSkyRLConfig as examples/train_integrations/harbor/entrypoints/
    main_harbor.py declares it (SkyRL @ a9564572), and RateLimiterConfig's
    fields as skyrl/train/utils/rate_limiter.py declares them (importing that
    module imports torch through skyrl.train.utils)."""
    @dataclass
    class RateLimiterConfig:
        enabled: bool = False
        trajectories_per_second: Optional[float] = None
        max_concurrency: Optional[int] = None

    @dataclass
    class HarborGeneratorConfig(config.GeneratorConfig):
        rate_limit: RateLimiterConfig = dataclass_field(default_factory=RateLimiterConfig)

    @dataclass
    class HarborSkyRLConfig(config.SkyRLTrainConfig):
        harbor_trial_config: Dict[str, Any] = dataclass_field(default_factory=dict)
        generator: HarborGeneratorConfig = dataclass_field(default_factory=HarborGeneratorConfig)

    return HarborSkyRLConfig


def test_the_harbor_subclass_reads_as_its_overrides():
    args = [*args_of("run_codecontest.txt"), *MEGATRON_TP2]
    with pytest.raises(ValueError, match="harbor_trial_config"):
        config.SkyRLTrainConfig.from_cli_overrides(args)  # the base class refuses it
    cfg = harbor_config().from_cli_overrides(args)
    assert cfg.harbor_trial_config["trials_dir"] == "/mnt/local_storage/codecontest/trials_run"
    assert field(cfg) == field(args)
    assert "harbor_trial_config" in field(cfg)["omitted"]
    assert tuple(explain(cfg, gpus, explicit="1").value for gpus in GPUS) == ("1", "1", None)


def test_visgym_reads_as_skyrl_reads_what_its_entry_point_leaves():
    import warnings

    args = args_of("run_visgym_from_sft.txt")
    assert args[:2] == ["--env_variant", "sft"]
    cfg = config.SkyRLTrainConfig.from_cli_overrides(args[2:])  # after parse_known_args
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert field(cfg) == field(args)


@pytest.mark.parametrize("name", ["run_fully_async_sim_gsm8k_e2e.txt",
                                  "run_fully_async_sim_gsm8k_external.txt"])
def test_the_simulated_trainer_reads_as_its_overrides(name):
    args = [*args_of(name), *MEGATRON_TP2]
    cfg = config.SkyRLTrainConfig.from_cli_overrides(args)
    assert cfg.trainer.fully_async.simulate_training is True
    assert field(cfg) == field(args)
    assert "policy" in field(cfg)["omitted"]
    assert tuple(explain(cfg, gpus, explicit="1").value for gpus in GPUS) == (None, None, None)
