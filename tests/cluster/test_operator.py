"""Operators' tools against the standard cluster: check, the ray.init hook,
and verl's driver paths (see conftest.py for the nodes)."""

import json
import subprocess
import sys
import time

import pytest

from configs import FSDP_YAML, MEGATRON_FSDP, MEGATRON_YAML, verl
from ray_megatron_env import build_runtime_env
from ray_megatron_env.check import NodeReport, observe
from ray_megatron_env.cli import PROBLEM, format_check
from ray_megatron_env.record import Decision
from ray_megatron_env.names import DRIVER_HOOK_PATH as HOOK_PATH, TAKE_OVER_VARIABLE

from conftest import NODE_SETS, UNREGISTERED
from drivers import run_driver, seen_in

CLI = [sys.executable, "-m", "ray_megatron_env"]
# The node of the standard set whose GPU probe fails on purpose (conftest.py).
PROBE_FAILS = {"smi_hang"}
NODE_SETS_NAMES = {node.name for node in NODE_SETS["standard"]}


@pytest.fixture(scope="module")
def strict_check(cluster):
    """One `check --strict --json` run over the whole cluster, as a user runs it."""
    result = subprocess.run([*CLI, "check", "--address", cluster.address, "--config",
                             str(MEGATRON_YAML), "--strict", "--json"],
                            capture_output=True, text=True, timeout=300)
    return result


# check's own use of Ray: the alive nodes and their agent ports (ray.nodes()),
# one actor pinned per node, and what an unregistered node does with the
# field and the job env's setup hook.
@pytest.mark.ray_version_specific
def test_check_strict_shows_which_path_decides_on_every_node(cluster, strict_check):
    assert strict_check.returncode == PROBLEM, strict_check.stderr  # the probe failures
    reports = json.loads(strict_check.stdout)
    assert len(reports) == len(NODE_SETS["standard"])
    by_id = {r["node_id"]: r for r in reports}
    # Unregistered nodes are decided by the job env's setup hook: not a problem.
    for name in UNREGISTERED:
        report = by_id[cluster.node_ids[name]]
        assert (report["registered"], report["via"], report["ok"]) == (False, "setup-hook", True)
    unplugged = by_id[cluster.node_ids["unplugged"]]
    assert (unplugged["value"], unplugged["decision"]["gpus"]) == ("1", ["9.0"])
    for name in PROBE_FAILS:
        report = by_id[cluster.node_ids[name]]
        assert report["registered"] and not report["ok"]
        assert report["problem"].startswith("the GPU probe failed")
    registered = {cluster.node_ids[name] for name in NODE_SETS_NAMES - UNREGISTERED - PROBE_FAILS}
    assert all(by_id[node_id]["ok"] and by_id[node_id]["registered"] and by_id[node_id]["ip"]
               and by_id[node_id]["via"] == "plugin" for node_id in registered)
    mixed = by_id[cluster.node_ids["h100_b200"]]
    assert (mixed["value"], mixed["decision"]["gpus"]) == ("1", ["9.0", "10.0"])
    # NVML cannot load on the "smi" node; its nvidia-smi reports 9.0 there.
    smi = by_id[cluster.node_ids["smi"]]
    assert (smi["value"], smi["decision"]["gpus"]) == ("1", ["9.0"])
    assert smi["decision"]["probe"]["method"] == "nvidia-smi"


def test_check_text_names_the_node_by_short_id_and_ip(cluster, strict_check):
    # The same reports as check prints them without --json.
    reports = [NodeReport(**{**{k: v for k, v in r.items() if k not in ("ok", "problem", "via")},
                             "decision": Decision.from_dict(r["decision"])
                             if r["decision"] else None})
               for r in json.loads(strict_check.stdout)]
    text = format_check(reports)
    bad = cluster.node_ids["smi_hang"]
    assert f"{bad[:8]} (" in text and "setup-hook" in text
    assert bad not in text  # short ids in text; --json has the full ones
    assert f"{len(NODE_SETS['standard'])} node(s) checked, 1 with a problem." in text
    assert "PROBLEM: the GPU probe failed" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_check_flags_an_explicit_value_that_breaks_a_required_rule(cluster):
    # Megatron-FSDP under a framework that runs Megatron-LM's argument check
    # (slime): "not 1" is required, so an explicit 1 is a problem.
    checked = {"engines": {"actor": {"strategy": "megatron", "megatron_fsdp": True,
                                     "checks": ["megatron-lm"]}}}
    explicit_1 = {"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}
    report, = observe([(cluster.node_ids["a100"], "-")], build_runtime_env(checked, base=explicit_1))
    assert report.registered and not report.ok
    assert "breaks a required rule" in report.problem()
    assert "Megatron-LM's argument check (validate_args) asserts it" in report.problem()
    # Under verl, which builds Megatron-Core directly, the same is a preference:
    # the node is fine, and the warning still says so.
    report, = observe([(cluster.node_ids["a100"], "-")],
                      build_runtime_env(verl(*MEGATRON_FSDP), base=explicit_1))
    assert report.ok and "breaks a preferred rule" in report.decision.warnings[0]


HOOK = {"RAY_RUNTIME_ENV_HOOK": HOOK_PATH}


# RAY_RUNTIME_ENV_HOOK: when ray.init calls it and with what.
@pytest.mark.ray_version_specific
def test_ray_init_takes_a_dictconfig_through_the_hook(cluster, tmp_path):
    result = run_driver(cluster, tmp_path, f"""
        from omegaconf import OmegaConf
        cfg = OmegaConf.load({str(MEGATRON_YAML)!r})
        ray.init(address=ADDRESS, log_to_driver=False, runtime_env={{"megatron_env": cfg}})
        print(json.dumps(on(["h100_b200", "b200"])))
    """, env=HOOK)
    assert result.returncode == 0, result.stderr
    got = seen_in(result)
    (mixed, mixed_decision), (b200, _) = got["h100_b200"], got["b200"]
    assert (mixed, b200) == ("1", None) and mixed_decision["gpus"] == ["9.0", "10.0"]


# RAY_RUNTIME_ENV_HOOK: its error stops ray.init before it connects.
@pytest.mark.ray_version_specific
def test_ray_init_with_a_bad_config_fails_on_the_driver(cluster, tmp_path):
    result = run_driver(cluster, tmp_path, f"""
        from omegaconf import OmegaConf
        cfg = OmegaConf.load({str(MEGATRON_YAML)!r})
        cfg.actor_rollout_ref.actor.strategy = "megatorn"
        try:
            ray.init(address=ADDRESS, runtime_env={{"megatron_env": cfg}})
        except ValueError as exc:
            print("REFUSED", ray.is_initialized(), exc)
    """, env=HOOK)
    assert "REFUSED False megatron_env: unknown strategy 'megatorn'" in result.stdout, result.stderr


# What verl's driver does: its own defaults, hard-coding the value, merged
# with the job's runtime env by ray.init.
VERL_DRIVER = """
    def get_ppo_ray_runtime_env():
        return {"env_vars": {"TOKENIZERS_PARALLELISM": "true", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}}
"""


# ray.init's job runtime env reaching every worker, as verl's driver passes it.
@pytest.mark.ray_version_specific
def test_verl_main_ppo_few_line_change(cluster, tmp_path):
    result = run_driver(cluster, tmp_path, VERL_DRIVER, f"""
        from omegaconf import OmegaConf
        from ray_megatron_env import build_runtime_env
        config = OmegaConf.load({str(FSDP_YAML)!r})
        runtime_env = get_ppo_ray_runtime_env()
        runtime_env = build_runtime_env(config, base=runtime_env, take_over=True)  # the change
        ray.init(address=ADDRESS, log_to_driver=False, runtime_env=runtime_env)
        print(json.dumps(on(["a100", "b200", "a100_inherit1"])))
    """)
    assert result.returncode == 0 and result.stdout, result.stderr
    # FSDP: the hard-coded 1 is gone; the node that exported 1 gets CUDA's default.
    assert [value for value, _ in seen_in(result).values()] == [None, None, "8"]


# ray job submit's RAY_JOB_CONFIG_JSON_ENV_VAR merged into ray.init's env,
# then the hook.
@pytest.mark.ray_version_specific
def test_ray_job_submit_path_takes_over_verls_value_without_editing_verl(cluster, tmp_path):
    # `ray job submit --runtime-env job.yaml -- python main_ppo.py` runs the
    # entrypoint with the job's runtime env in RAY_JOB_CONFIG_JSON_ENV_VAR and
    # its env_vars exported; ray.init in the driver merges both, then calls
    # the hook. job.yaml comes from `ray-megatron-env runtime-env`.
    base = tmp_path / "runtime_env.yaml"
    base.write_text('env_vars:\n  CUDA_DEVICE_MAX_CONNECTIONS: "1"\n  NCCL_DEBUG: WARN\n')
    made = subprocess.run([*CLI, "runtime-env", str(MEGATRON_YAML), "--role", "critic",
                           "--base", str(base), "--take-over", "--json"],
                          capture_output=True, text=True, check=True)
    job_env = json.loads(made.stdout)
    result = run_driver(cluster, tmp_path, VERL_DRIVER, """
        ray.init(address=ADDRESS, log_to_driver=False, runtime_env=get_ppo_ray_runtime_env())
        print(json.dumps(on(["a100", "b200"])))
    """, env={**job_env["env_vars"],
              "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": job_env})})
    assert result.returncode == 0, result.stderr
    got = seen_in(result)
    (a100, decision), (b200, _) = got["a100"], got["b200"]
    # The critic is Megatron TP=1: it needs nothing, so verl's "1" is gone.
    assert (a100, b200) == (None, None)
    assert decision["source"] == "none" and list(decision["engines"]) == ["critic"]


# RAY_RUNTIME_ENV_HOOK on an env without the field.
@pytest.mark.ray_version_specific
def test_legacy_call_without_a_config_keeps_verls_value(cluster, tmp_path):
    result = run_driver(cluster, tmp_path, VERL_DRIVER, """
        ray.init(address=ADDRESS, log_to_driver=False, runtime_env=get_ppo_ray_runtime_env())
        print(json.dumps(on(["b200"])))
    """, env={**HOOK, TAKE_OVER_VARIABLE: "1"})
    assert result.returncode == 0, result.stderr
    assert seen_in(result) == {"b200": ("1", None)}
    assert "no megatron_env field" in result.stderr


# Ray's error for an actor pinned to a node that is not there ("Unschedulable").
@pytest.mark.ray_version_specific
def test_check_reports_a_node_gone_since_it_was_listed_within_its_timeout(cluster):
    # A node id nobody has (a node that died between listing and probing): the
    # probe actor can never start, and check reports it instead of waiting on.
    started = time.monotonic()
    report, = observe([("ab" * 28, "10.0.0.9")], build_runtime_env(verl()), timeout_s=5)
    assert report.registered is None and report.decision is None and not report.ok
    assert report.problem() == report.error and "Unschedulable" in report.error, report.error
    assert time.monotonic() - started < 30
