"""Topical: round three of the rule table (cuda-connections), through the
framework readers: named non-CUDA accelerators, the MoE flex dispatcher,
Megatron-Core's UCC assert
(the compact form's dispatcher keys: tests/unit/frameworks/test_compact.py).

Expected values come from the sources the rows cite (docs/rules.md): LM's
TP/CP assert fires on Ascend and MUSA, whose runtimes ignore the variable;
Megatron-Bridge's launcher gives DeepEP/HybridEP 32 except TP/CP > 1 without
A2A overlap before Blackwell; Megatron-Core's parallel_state.py refuses a set
"1" with the UCC pipeline backend, in every framework.
"""

import json

import pytest
from omegaconf import OmegaConf

from ray_megatron_env.cli import main
from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.explanation import explain
from ray_megatron_env.frameworks.nemo_rl import READER as NEMO_RL
from ray_megatron_env.frameworks.loading import load_spec

from configs import ACTOR, FSDP_YAML, plain
from paths import FIXTURES

SLIME = FIXTURES / "slime" / "run-qwen3-4B.args.json"
NEMO_RL_MEGATRON = (FIXTURES / "nemo_rl" / "configs" /
                    "grpo_math_1B_megatron.yaml")
OVERRIDE = f"+{ACTOR}.megatron.override_transformer_config"


def slime_args(*extra: str) -> list:
    return [*json.loads(SLIME.read_text()), *extra]  # argparse: the last value wins


# --- Ascend, MUSA, AMD --------------------------------------------------------------

def test_verl_megatron_tp2_on_an_ascend_node_gets_1_and_names_the_npus():
    decision = explain(plain(), "npu", role="actor")
    assert decision.value == "1" and decision.source == "policy"
    assert decision.gpus == ["ascend"] and "Huawei Ascend NPUs" in decision.reason
    assert decision.rules == {"actor": "non-cuda-megatron-model-parallel"}
    assert decision.strengths == {"actor": "preferred"}  # verl runs no validate_args


def test_verl_fsdp_on_an_ascend_node_gets_nothing():
    decision = explain(plain(base=FSDP_YAML), "npu")
    assert decision.value is None and decision.source == "none"
    assert set(decision.rules.values()) == {"non-cuda"}
    assert "no GPU" not in decision.reason and "Huawei Ascend NPUs" in decision.reason


def test_slime_tp2_on_an_ascend_node_is_a_required_1():
    decision = explain(slime_args(), "npu", role="actor")
    assert decision.value == "1" and decision.satisfied
    assert decision.strengths == {"actor": "required"}
    assert "validate_args" in decision.because["actor"]
    # Without it slime's driver would fail there, as verl's Ascend CI did.
    assert not explain(slime_args(), "npu", role="actor", explicit="8").satisfied


def test_slime_tp2_on_a_musa_node_is_a_required_1():
    decision = explain(slime_args(), "musa", role="actor")
    assert decision.value == "1" and decision.gpus == ["musa"]
    assert "Moore Threads (MUSA) GPUs" in decision.reason


def test_explain_cli_names_the_npu(capsys, tmp_path):
    path = tmp_path / "verl.yaml"
    path.write_text(OmegaConf.to_yaml(plain()))
    assert main(["explain", str(path), "--gpus", "npu", "--role", "actor"]) == 0
    out = capsys.readouterr().out
    assert "CUDA_DEVICE_MAX_CONNECTIONS: 1" in out and "Huawei Ascend NPUs" in out


def test_explain_names_the_vendor_tokens_when_gpus_is_wrong():
    with pytest.raises(FieldValueError, match="npu"):
        explain(plain(), "tpu")


# --- the flex dispatcher in verl, NeMo-RL and slime -------------------------------

@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
@pytest.mark.parametrize("gpus", ["8.0", "9.0", "10.0"])
def test_verl_flex_dispatcher_at_tp1_gets_32_everywhere(backend, gpus):
    config = plain("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
                   f"{OVERRIDE}.moe_token_dispatcher_type=flex",
                   f"{OVERRIDE}.moe_flex_dispatcher_backend={backend}")
    decision = explain(config, gpus, role="actor")
    assert decision.value == "32", decision.reason
    assert decision.rules == {"actor": "megatron-flex-dispatcher"}
    assert f"dispatcher={backend}" in decision.engines["actor"]


def test_verl_older_moe_enable_deepep_reads_as_deepep():
    config = plain("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
                   f"{OVERRIDE}.moe_token_dispatcher_type=flex",
                   f"{OVERRIDE}.moe_enable_deepep=true")
    assert explain(config, "9.0", role="actor").value == "32"


def test_verl_flex_dispatcher_at_tp2_without_overlap_stays_1_on_hopper():
    config = plain(f"{OVERRIDE}.moe_token_dispatcher_type=flex",
                   f"{OVERRIDE}.moe_flex_dispatcher_backend=deepep")
    assert explain(config, "9.0", role="actor").value == "1"
    assert explain(config, "10.0", role="actor").value == "32"


def test_a_backend_without_the_flex_type_is_not_a_flex_dispatcher():
    # Megatron-Core reads the backend only when the dispatcher type is flex.
    config = plain("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
                   f"{OVERRIDE}.moe_token_dispatcher_type=alltoall",
                   f"{OVERRIDE}.moe_flex_dispatcher_backend=deepep")
    assert explain(config, "9.0", role="actor").value is None


def test_verl_bad_dispatcher_value_names_the_key():
    config = plain(f"{OVERRIDE}.moe_token_dispatcher_type=7")
    with pytest.raises(Exception, match="override_transformer_config.moe_token_dispatcher_type"):
        load_spec(config)


def test_nemo_rl_megatron_cfg_dispatcher():
    config = OmegaConf.to_container(OmegaConf.load(NEMO_RL_MEGATRON))
    megatron_cfg = config["policy"]["megatron_cfg"]
    megatron_cfg.update(tensor_model_parallel_size=1, moe_token_dispatcher_type="flex",
                        moe_flex_dispatcher_backend="hybridep")
    policy = dict(NEMO_RL.read(config).engines)["policy"]
    assert policy.dispatcher == "hybridep"
    megatron_cfg["moe_token_dispatcher_type"] = "alltoall"
    assert dict(NEMO_RL.read(config).engines)["policy"].dispatcher is None


def test_slime_dispatcher_and_pipeline_backend_flags():
    spec, _ = load_spec(slime_args("--tensor-model-parallel-size", "1",
                                   "--moe-token-dispatcher-type", "flex",
                                   "--moe-enable-deepep"))
    assert dict(spec.engines)["actor"].dispatcher == "deepep"
    spec, _ = load_spec(slime_args("--pipeline-model-parallel-comm-backend", "ucc"))
    assert dict(spec.engines)["actor"].pipeline_backend == "ucc"


# --- Megatron-Core's UCC assert --------------------------------------------------

def test_slime_tp2_with_ucc_before_blackwell_is_a_hard_conflict():
    args = slime_args("--pipeline-model-parallel-comm-backend", "ucc")
    decision = explain(args, "9.0", role="actor")
    assert not decision.satisfied and decision.conflict
    assert decision.rules == {"actor": "megatron-model-parallel+megatron-core-ucc-pipeline"}
    assert "initialize_model_parallel" in decision.because["actor"]
    assert any("megatron-core-ucc-pipeline" in w for w in decision.warnings)
    # One engine asks both: a per-role env cannot help, and the advice says so.
    assert "change that engine's settings" in decision.reason
    assert not any("role=" in w for w in decision.warnings), decision.warnings
    # On Blackwell only UCC's "not 1" holds, and unset meets it.
    blackwell = explain(args, "10.0", role="actor")
    assert blackwell.satisfied and blackwell.value is None


def test_explain_cli_shows_both_rows_and_exits_1_for_the_ucc_conflict(capsys, tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps(slime_args("--pipeline-model-parallel-comm-backend", "ucc")))
    assert main(["explain", str(path), "--gpus", "9.0", "--role", "actor"]) == 1
    out = capsys.readouterr().out
    assert "-> megatron-model-parallel (1)" in out
    assert "-> megatron-core-ucc-pipeline (not 1)" in out


@pytest.mark.parametrize("override, key", [
    ("moe_token_dispatcher_type=Flex", "moe_token_dispatcher_type"),
    ("moe_flex_dispatcher_backend=deep_ep", "moe_flex_dispatcher_backend"),
])
def test_a_dispatcher_typo_is_an_error_not_a_silent_all_to_all(override, key):
    # Megatron-Core's Literal choices: a value it would refuse is refused here too.
    config = plain(f"{OVERRIDE}.moe_token_dispatcher_type=flex", f"{OVERRIDE}.{override}")
    with pytest.raises(FieldValueError, match=f"override_transformer_config.{key}.*Megatron-Core"):
        load_spec(config)


def test_slime_bad_pipeline_backend_names_the_flag():
    with pytest.raises(FieldValueError, match="pipeline_model_parallel_comm_backend.*nccl, ucc"):
        load_spec(slime_args("--pipeline-model-parallel-comm-backend", "gloo"))
