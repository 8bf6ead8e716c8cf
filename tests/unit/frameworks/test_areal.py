"""Reading AReaL's layout: backend strings, roles, the value AReaL writes itself.

Fixtures under fixtures/areal/ mirror AReaL's experiment YAMLs (same keys and
nesting; values chosen here). Expected values are written by hand from the
rule table (docs/rules.md): Megatron TP or CP > 1 asks "1" below compute
capability 10 and nothing from 10 on; FSDP-style and inference engines ask
"not 1"; AReaL runs no Megatron check, so all of these are preferences, and
in one job-level env the preferences that accept 1 win.
"""

import logging

import pytest

from ray_megatron_env.agent import NodeAgent
from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.explanation import explain
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.frameworks.areal_grammar import parse_allocation_mode
from ray_megatron_env.node import NodeGpus
from ray_megatron_env.cache import ProbeCache
from ray_megatron_env.frameworks.loading import load_spec, load_yaml
from ray_megatron_env.runtime_env import build_runtime_env
from ray_megatron_env.spec import ProcessRule
from paths import FIXTURES

FIXTURES = FIXTURES / "areal"
VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
GPUS = ("8.0", "9.0", "10.0", "9.0,10.0")
UNSET = (None, None, None, None)
ONE_BELOW_10 = ("1", "1", None, "1")

# fixture -> (engines by role, omitted roles, value on each of GPUS), by hand.
GOLDEN = {
    "grpo_megatron_tp2_sglang.yaml": (
        {"actor": "megatron TP=2 CP=1", "rollout": "sglang"}, {"ref"}, ONE_BELOW_10),
    "grpo_fsdp_vllm_ref.yaml": (
        {"actor": "fsdp", "ref": "fsdp", "rollout": "vllm"}, set(), UNSET),
    "grpo_moe_hybrid.yaml": (
        {"actor": "megatron TP=2 CP=2 EP=4", "rollout": "sglang"}, set(), ONE_BELOW_10),
    "ppo_megatron_critic_cp2.yaml": (
        {"actor": "megatron TP=1 CP=2", "critic": "megatron TP=1 CP=2", "rollout": "sglang"},
        {"ref"}, ONE_BELOW_10),
    "grpo_fsdp_user_env.yaml": ({"actor": "fsdp", "rollout": "sglang"}, set(), UNSET),
    "legacy_allocation_mode.yaml": (
        {"actor": "megatron TP=2 CP=1", "rollout": "sglang"}, set(), ONE_BELOW_10),
    "grpo_megatron_fsdp.yaml": (
        {"actor": "megatron TP=2 CP=1 Megatron-FSDP", "rollout": "sglang"}, set(), UNSET),
    "distill_megatron_teacher.yaml": (
        {"actor": "fsdp", "teacher": "megatron TP=2 CP=1", "rollout": "vllm"}, set(),
        ONE_BELOW_10),
    "sft_archon.yaml": ({"actor": "archon (fsdp)"}, set(), UNSET),
}


def spec_of(name):
    return load_spec(str(FIXTURES / name))[0]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_engines_and_omitted_roles(name):
    engines, omitted, _ = GOLDEN[name]
    spec = spec_of(name)
    assert {role: e.describe() for role, e in spec.engines} == engines
    assert set(dict(spec.omitted)) == omitted
    assert spec.framework == "areal"


@pytest.mark.parametrize("name,gpus", [(n, g) for n in sorted(GOLDEN) for g in GPUS])
def test_value_per_gpu_class(name, gpus):
    expected = GOLDEN[name][2][GPUS.index(gpus)]
    assert explain(str(FIXTURES / name), gpus).value == expected


def test_megatron_tp2_with_sglang_shares_one_env():
    # One job-level env covers actor and rollout: on 9.0 the actor's "1"
    # wins over SGLang's "not 1", which is named in a warning.
    mixed = explain(str(FIXTURES / "grpo_megatron_tp2_sglang.yaml"), "9.0")
    assert mixed.value == "1" and len(mixed.warnings) == 1 and "rollout" in mixed.warnings[0]
    assert explain(str(FIXTURES / "grpo_megatron_tp2_sglang.yaml"), "10.0").value is None


def test_spmd_trainer_processes_are_decided_for_the_trainer_roles_alone():
    path = str(FIXTURES / "grpo_megatron_tp2_sglang.yaml")
    trainer = explain(path, "9.0", worker_env={"AREAL_SPMD_MODE": "1"})
    assert trainer.value == "1" and trainer.warnings == () and set(trainer.engines) == {"actor"}
    server = explain(path, "9.0")  # an SGLang server task: no marker, every role
    assert set(server.engines) == {"actor", "rollout"}


def test_process_rule_names_the_trainer_roles_present():
    assert spec_of("ppo_megatron_critic_cp2.yaml").processes == (
        ProcessRule(("actor", "critic"), "AREAL_SPMD_MODE", "1"),)
    assert spec_of("grpo_megatron_tp2_sglang.yaml").others is None
    assert spec_of("sft_archon.yaml").processes == ()  # no rollout: nothing to split


def test_areal_own_value_is_replaced_unless_the_user_sets_it():
    assert spec_of("grpo_fsdp_vllm_ref.yaml").replaces == "1"
    assert spec_of("grpo_fsdp_user_env.yaml").replaces is None


def test_fsdp_replaces_areal_one_and_an_inherited_one():
    path = str(FIXTURES / "grpo_fsdp_vllm_ref.yaml")
    assert explain(path, "9.0", explicit="1").value is None  # AReaL's own "1"
    assert explain(path, "9.0", node_value="1").value == "8"  # the node's "1"
    kept = explain(str(FIXTURES / "grpo_fsdp_user_env.yaml"), "10.0", explicit="1")
    assert kept.value == "1" and kept.source == "explicit"


# --- NodeAgent on a node faked as compute capability 10.0 ------------------------

def agent_on(capability):
    return NodeAgent(ProbeCache(lambda: NodeGpus.known([capability], "fake")))


@pytest.mark.parametrize("field_from", ["build_runtime_env", "raw config"])
def test_agent_removes_areal_one_for_an_fsdp_actor_on_blackwell(field_from):
    path = FIXTURES / "grpo_fsdp_vllm_ref.yaml"
    runtime_env = (build_runtime_env(str(path)) if field_from == "build_runtime_env"
                   else {"megatron_env": load_yaml(path)})
    env_vars = {VARIABLE: "1"}  # what AReaL's BASE_ENVIRONS puts in every worker
    decision = agent_on((10, 0)).decide_and_write(runtime_env, env_vars, {}, logging.getLogger("t"))
    assert VARIABLE not in env_vars and decision.source != "explicit"


def test_agent_keeps_the_users_own_value():
    runtime_env = build_runtime_env(str(FIXTURES / "grpo_fsdp_user_env.yaml"))
    env_vars = {VARIABLE: "1"}
    decision = agent_on((10, 0)).decide_and_write(runtime_env, env_vars, {}, logging.getLogger("t"))
    assert env_vars[VARIABLE] == "1" and decision.source == "explicit"


def test_agent_sets_one_for_megatron_tp2_before_blackwell():
    runtime_env = build_runtime_env(str(FIXTURES / "grpo_megatron_tp2_sglang.yaml"))
    for capability, expected in (((9, 0), "1"), ((10, 0), None)):
        env_vars = {VARIABLE: "1"}
        agent_on(capability).decide_and_write(runtime_env, env_vars, {}, logging.getLogger("t"))
        assert env_vars.get(VARIABLE) == expected


# --- Backends in a config (the grammar itself: test_areal_grammar.py) ---------------

def test_bad_backend_in_a_config_names_the_key():
    with pytest.raises(FieldValueError, match=r"actor\.backend 'megatron\.d2t2'"):
        spec_of("bad_backend.yaml")


def test_a_backend_of_the_wrong_kind_for_the_role():
    with pytest.raises(FieldValueError, match=r"rollout\.backend 'megatron:d2'.*rollout takes"):
        parse_field({"actor": {"backend": "fsdp:d2"}, "rollout": {"backend": "megatron:d2"}})
    with pytest.raises(FieldValueError, match=r"actor\.backend 'vllm:d2'.*actor takes"):
        parse_field({"actor": {"backend": "vllm:d2"}})


def test_non_string_and_unresolved_backend():
    with pytest.raises(FieldTypeError, match=r"actor\.backend must be"):
        parse_field({"actor": {"backend": 4}})
    with pytest.raises(FieldValueError, match="unresolved interpolation"):
        parse_field({"actor": {"backend": "fsdp:d2"}, "ref": {"backend": "${actor.backend}"}})


# --- Roles -----------------------------------------------------------------------

def engines(config):
    return {role: e.describe() for role, e in parse_field(config).engines}


def test_ref_is_created_only_with_kl_ctl_above_zero():
    base = {"actor": {"backend": "megatron:d2t2"}, "ref": {"backend": "fsdp:d2"}}
    assert engines(base)["ref"] == "fsdp"  # kl_ctl defaults to 0.1
    spec = parse_field({**base, "actor": {"backend": "megatron:d2t2", "kl_ctl": 0}})
    assert "ref" not in dict(spec.engines) and "kl_ctl" in dict(spec.omitted)["ref"]


def test_null_sections_are_not_created():
    assert engines({"actor": {"backend": "fsdp:d2"}, "critic": None, "teacher": None,
                    "ref": None}) == {"actor": "fsdp"}


def test_empty_critic_and_ref_backends_are_the_actors():
    assert engines({"actor": {"backend": "megatron:d1c2"}, "critic": {"backend": ""},
                    "ref": {"backend": ""}}) == {
        "actor": "megatron TP=1 CP=2", "critic": "megatron TP=1 CP=2",
        "ref": "megatron TP=1 CP=2"}


def test_megatron_flags_are_read_per_role():
    found = dict(parse_field({
        "actor": {"backend": "megatron:d2t2", "megatron": {"use_torch_fsdp2": True}},
        "critic": {"backend": "megatron:d2t2", "megatron": {"use_custom_fsdp": True}},
    }).engines)
    assert found["actor"].torch_fsdp2 and not found["actor"].megatron_fsdp
    assert found["critic"].megatron_fsdp and found["actor"].checks == ()


# --- The deprecated allocation_mode ------------------------------------------------

def test_allocation_mode_alone():
    assert engines({"allocation_mode": "sglang:d4+megatron:(attn:d1t2c2|ffn:e4)"}) == {
        "actor": "megatron TP=2 CP=2 EP=4", "rollout": "sglang"}


def test_allocation_mode_colocated_critic_needs_its_section():
    text = "sglang[rollout]:d2+fsdp[actor]:d4|fsdp[critic]:d4"
    assert [(a.name, colocated) for a, colocated in parse_allocation_mode(text)] == [
        ("rollout", False), ("actor", False), ("critic", True)]
    assert engines({"allocation_mode": text}) == {"actor": "fsdp", "rollout": "sglang"}
    assert engines({"allocation_mode": text, "critic": {"path": "x"}})["critic"] == "fsdp"


def test_allocation_mode_that_disagrees_with_a_backend_is_an_error():
    with pytest.raises(FieldValueError, match=r"actor\.backend 'fsdp:d4' and allocation_mode"):
        parse_field({"allocation_mode": "sglang:d4+megatron:d2t2",
                     "actor": {"backend": "fsdp:d4"}})


@pytest.mark.parametrize("text", ["sglang:d1+d1", "sglang.d4t1+fsdp.d4",
                                  "sglang:d4+fsdp:d4+fsdp:d2"])
def test_bad_allocation_mode_names_the_key(text):
    with pytest.raises(FieldValueError, match=r"allocation_mode"):
        parse_field({"allocation_mode": text})


def test_user_value_is_checked_and_named():
    config = {"actor": {"backend": "fsdp:d2",
                        "scheduling_spec": [{"env_vars": {VARIABLE: "99"}}]}}
    with pytest.raises(FieldValueError, match=r"actor\.scheduling_spec\[0\]\.env_vars"):
        parse_field(config)


def test_a_users_one_in_a_dataset_scheduling_spec_keeps_every_one():
    # A worker carrying "1" could be that dataset's: it is kept, not replaced.
    config = {"actor": {"backend": "fsdp:d2"},
              "train_dataset": {"scheduling_spec": {"env_vars": {VARIABLE: "1"}}}}
    assert parse_field(config).replaces is None


def test_a_users_other_value_in_one_role_leaves_areals_one_replaced_elsewhere():
    # Issue 17, item 6: "8" only in actor.scheduling_spec. The actor's workers
    # carry "8" (explicit, kept); the rollout's carry AReaL's "1" (replaced).
    config = {"rollout": {"backend": "sglang:d4"},
              "actor": {"backend": "fsdp:d4", "scheduling_spec": [
                  {"task_type": "worker", "env_vars": {VARIABLE: "8"}}]}}
    assert parse_field(config).replaces == "1"
    rollout_worker = {VARIABLE: "1"}
    decision = agent_on((9, 0)).decide_and_write(build_runtime_env(config), rollout_worker, {},
                                      logging.getLogger("t"))
    assert VARIABLE not in rollout_worker and decision.source != "explicit"
    actor_worker = {VARIABLE: "8"}
    decision = agent_on((9, 0)).decide_and_write(build_runtime_env(config), actor_worker, {},
                                      logging.getLogger("t"))
    assert actor_worker[VARIABLE] == "8" and decision.source == "explicit"


# --- Broken sections: refused, never a role dropped ---------------------------------

@pytest.mark.parametrize("config,key", [
    ({"rollout": {"backend": "sglang:d4"}, "actor": {"backnd": "megatron:d2p1t2"}},
     "actor.backend"),
    ({"rollout": {"backend": "sglang:d4"}, "actor": {"backend": None}}, "actor.backend"),
    ({"actor": {"backend": "megatron:d2p1t2"}, "rollout": {"backed": "sglang:d4"}},
     "rollout.backend"),
    ({"actor": {"backend": "fsdp:d2"}, "teacher": {"path": "x"}}, "teacher.backend"),
])
def test_a_section_without_its_backend_is_refused_naming_the_key(tmp_path, config, key):
    from omegaconf import OmegaConf

    path = tmp_path / "config.yaml"
    OmegaConf.save(OmegaConf.create(config), path)
    for form in (config, str(path), OmegaConf.create(config)):
        with pytest.raises(FieldValueError, match=rf"{key} is missing; AReaL requires it"):
            build_runtime_env(form)


def test_a_misspelt_rollout_section_is_refused():
    config = {"actor": {"backend": "megatron:d2p1t2"}, "rolout": {"backend": "sglang:d4"}}
    with pytest.raises(FieldValueError, match=r"'rolout' looks like AReaL's 'rollout'"):
        build_runtime_env(config)


def test_a_critic_section_without_a_backend_key_reads_alike_from_every_form(tmp_path):
    # Issue 17, item 3: a critic named only in allocation_mode, its section
    # holding no backend; and the documented empty-backend fallback.
    from omegaconf import OmegaConf

    configs = (
        {"allocation_mode": "sglang:d2+megatron:d2t2|megatron[critic]:d2t2",
         "critic": {"is_critic": True}},
        {"actor": {"backend": "megatron:d2t2"}, "rollout": {"backend": "sglang:d2"},
         "critic": {"is_critic": True}},
    )
    for config in configs:
        path = tmp_path / "config.yaml"
        OmegaConf.save(OmegaConf.create(config), path)
        fields = [build_runtime_env(form) for form in
                  (config, str(path), OmegaConf.create(config))]
        assert fields[0]["megatron_env"]["engines"]["critic"] == {
            "strategy": "megatron", "tensor_parallel": 2}
        assert fields[1] == fields[0] and fields[2] == fields[0]


def test_judge_engine_is_read_as_an_inference_engine():
    # examples/search_agent/tongyi_deepresearch/config.yaml: judge_engine sglang:d1
    assert engines({"actor": {"backend": "megatron:d2p2t1"},
                    "rollout": {"backend": "sglang:d4"},
                    "judge_engine": {"backend": "sglang:d1"}}) == {
        "actor": "megatron TP=1 CP=1", "judge_engine": "sglang", "rollout": "sglang"}
    with pytest.raises(FieldValueError, match=r"judge_engine\.backend .*training backend"):
        parse_field({"actor": {"backend": "fsdp:d2"}, "judge_engine": {"backend": "fsdp:d1"}})


def test_a_missing_actor_backend_is_named_before_what_falls_back_to_it():
    config = {"rollout": {"backend": "sglang:d4"}, "actor": {"backnd": "megatron:d2t2"},
              "critic": {"backend": ""}}
    with pytest.raises(FieldValueError, match=r"actor\.backend is missing"):
        parse_field(config)


def test_an_interpolation_to_a_misspelt_backend_names_the_cause(tmp_path):
    # As AReaL's examples write it: ref.backend: ${actor.backend}.
    path = tmp_path / "config.yaml"
    path.write_text("rollout:\n  backend: sglang:d4\nactor:\n  backnd: megatron:d2t2\n"
                    "  kl_ctl: 0.1\nref:\n  backend: ${actor.backend}\n")
    with pytest.raises(FieldValueError) as info:
        build_runtime_env(str(path))
    assert str(info.value).startswith("megatron_env: actor.backend is missing")
    assert "cannot resolve ref.backend" in str(info.value)


def test_a_config_dataclass_is_read_like_a_mapping_without_touching_other_fields():
    # The shape AReaL's load_expr_config returns (GRPOConfig: nested engine
    # dataclasses, SchedulingSpec lists, a None critic), with a field that
    # cannot become JSON where no reader looks.
    import dataclasses
    import json
    from typing import Any, List, Optional

    @dataclasses.dataclass
    class SchedulingSpec:
        env_vars: dict = dataclasses.field(default_factory=dict)

    @dataclasses.dataclass
    class Engine:
        backend: str = ""
        kl_ctl: float = 0.1
        scheduling_spec: List[SchedulingSpec] = dataclasses.field(default_factory=list)
        tokenizer: Any = dataclasses.field(default_factory=object)

    @dataclasses.dataclass
    class Config:
        experiment_name: str = "x"
        allocation_mode: str = ""
        actor: Engine = dataclasses.field(default_factory=lambda: Engine("megatron:d2t2"))
        rollout: Engine = dataclasses.field(default_factory=lambda: Engine("sglang:d4"))
        ref: Optional[Engine] = dataclasses.field(default_factory=lambda: Engine(""))
        critic: Optional[Engine] = None

    as_dict = {"experiment_name": "x", "allocation_mode": "",
               "actor": {"backend": "megatron:d2t2"}, "rollout": {"backend": "sglang:d4"},
               "ref": {"backend": ""}, "critic": None}
    env = build_runtime_env(Config())
    assert env == build_runtime_env(as_dict)
    assert env["megatron_env"]["engines"] == {
        "actor": {"strategy": "megatron", "tensor_parallel": 2},
        "ref": {"strategy": "megatron", "tensor_parallel": 2},
        "rollout": {"strategy": "sglang"}}
    json.dumps(env)
    user = Config()
    user.actor.scheduling_spec = [SchedulingSpec({VARIABLE: "1"})]
    assert build_runtime_env(user)["megatron_env"].get("replaces") is None


@pytest.mark.parametrize("scheduler", ["local", "slurm"])
def test_a_scheduler_without_ray_is_warned_about(scheduler):
    config = {"actor": {"backend": "fsdp:d2"}, "scheduler": {"type": scheduler}}
    with pytest.warns(UserWarning, match=rf"scheduler\.type is '{scheduler}'"):
        build_runtime_env(config)


def test_the_ray_scheduler_is_not_warned_about(recwarn):
    build_runtime_env({"actor": {"backend": "fsdp:d2"}, "scheduler": {"type": "ray"}})
    assert not [w for w in recwarn if "scheduler.type" in str(w.message)]
