"""The command line, offline verbs: explain, register, runtime-env, help."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from configs import FSDP_YAML, MEGATRON_YAML
from ray_megatron_env import build_runtime_env
from ray_megatron_env.cli import BAD_INPUT, OK, UNREACHABLE, main
from ray_megatron_env.names import DRIVER_HOOK_PATH as HOOK_PATH, TAKE_OVER_VARIABLE

PLUGIN = {"class": "ray_megatron_env.plugin.MegatronEnvPlugin"}


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("verb", ["demo", "check", "explain", "register", "runtime-env"])
def test_every_verb_has_help(capsys, verb):
    with pytest.raises(SystemExit) as info:
        main([verb, "--help"])
    assert info.value.code == 0
    assert f"usage: ray-megatron-env {verb}" in capsys.readouterr().out


def test_console_script_and_module_entry_point():
    script = str(Path(sys.executable).parent / "ray-megatron-env")  # installed with the package
    for command in ([script], [sys.executable, "-m", "ray_megatron_env"]):
        out = subprocess.run([*command, "--version"], capture_output=True, text=True, check=True)
        assert out.stdout.startswith("ray-megatron-env 0.")


def test_check_against_no_cluster_exits_3_in_seconds(capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    started = time.monotonic()
    code, out, err = run(capsys, "check", "--address", "127.0.0.1:1")
    assert code == UNREACHABLE and out == "" and "nothing answers at" in err
    assert time.monotonic() - started < 10


def test_explain_prints_value_reason_and_rules(capsys):
    code, out, _ = run(capsys, "explain", MEGATRON_YAML, "--gpus", "8.0", "--role", "actor")
    assert code == OK
    assert out.startswith("CUDA_DEVICE_MAX_CONNECTIONS: 1  (source: policy; requirement: 1)")
    assert "actor: megatron TP=2 CP=1 -> megatron-model-parallel (1)" in out
    assert "preferred: keeps tensor/context-parallel collectives ahead of compute" in out
    assert "source: Megatron-LM megatron/training/arguments.py, validate_args" in out


@pytest.mark.parametrize("gpus,value", [("9.0,9.0", "1"), ("10.0", None), ("none", None),
                                        ("10.0,8.0", "1")])
def test_explain_json_is_one_object(capsys, gpus, value):
    code, out, _ = run(capsys, "explain", MEGATRON_YAML, "--gpus", gpus, "--role", "actor,ref",
                       "--json")
    data = json.loads(out)
    assert code == OK and data["value"] == value and data["reason"]
    assert sorted(data["engines"]) == ["actor", "ref"]


def test_explain_json_replaces_an_inherited_1_for_fsdp(capsys):
    # Golden: every FSDP-style and inference engine asks "not 1" (preferred),
    # so the node's 1 is replaced by CUDA's default.
    _, out, _ = run(capsys, "explain", FSDP_YAML, "--gpus", "9.0", "--node-value", "1", "--json")
    data = json.loads(out)
    assert (data["value"], data["source"], data["node_value"]) == ("8", "policy", "1")
    # A worker without verl's rollout markers is a trainer worker: the
    # rollout runs in its own processes (see --worker-env).
    assert data["rules"] == {"actor": "fsdp-style", "critic": "fsdp-style", "ref": "fsdp-style"}
    assert set(data["strengths"].values()) == {"preferred"} and data["satisfied"]


def test_explain_explicit_value(capsys):
    _, out, _ = run(capsys, "explain", FSDP_YAML, "--gpus", "9.0", "--explicit", "1", "--json")
    data = json.loads(out)
    # FSDP's "not 1" is a preference: kept, satisfied, but never silent.
    assert (data["value"], data["source"], data["satisfied"]) == ("1", "explicit", True)
    assert "breaks a preferred rule of actor (asks not 1)" in data["warnings"][0]


@pytest.mark.parametrize("argv,words", [
    (["explain", "/no/such.yaml", "--gpus", "9.0"], ["does not exist"]),
    (["explain", MEGATRON_YAML, "--gpus", "9.x"], ["--gpus", "9.x"]),
    (["explain", MEGATRON_YAML, "--gpus", "9.0", "--role", "judge"], ["unknown role 'judge'"]),
    (["explain", MEGATRON_YAML, "--gpus", "9.0", "--explicit", "0"], ["1 to 32"]),
    (["runtime-env", "/no/such.yaml"], ["does not exist"]),
    (["runtime-env", MEGATRON_YAML, "--base", "/no/base.yaml"], ["'/no/base.yaml' does not exist"]),
    (["demo", "--role", "actor"], ["--role applies to --config"]),
])
def test_bad_input_exits_2_with_the_helpers_message(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code == BAD_INPUT and out == ""
    for word in words:
        assert word in err


def test_explain_bad_config_message_is_the_driver_helpers(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor_rollout_ref:\n  actor:\n    strategy: megatorn\n")
    with pytest.raises(ValueError) as info:
        build_runtime_env(bad)
    code, _, err = run(capsys, "explain", bad, "--gpus", "9.0")
    assert code == BAD_INPUT and str(info.value) in err


@pytest.mark.parametrize("existing,expected", [
    (None, [PLUGIN]),
    ("", [PLUGIN]),
    ('[{"class": "acme.Plugin", "priority": 5}]', [{"class": "acme.Plugin", "priority": 5}, PLUGIN]),
    ('[{"class": "acme.Plugin"}, {"class": "ray_megatron_env.plugin.MegatronEnvPlugin", '
     '"priority": 3}, {"class": "z.P"}]', [{"class": "acme.Plugin"}, {"class": "z.P"}, PLUGIN]),
])
def test_register_keeps_other_plugins_and_lists_this_one_once(capsys, monkeypatch, existing,
                                                                expected):
    if existing is None:
        monkeypatch.delenv("RAY_RUNTIME_ENV_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("RAY_RUNTIME_ENV_PLUGINS", existing)
    code, out, _ = run(capsys, "register", "--format", "json")
    assert code == OK and json.loads(out) == expected


def test_register_formats(capsys, monkeypatch):
    monkeypatch.setenv("RAY_RUNTIME_ENV_PLUGINS", '[{"class": "acme.Plugin"}]')
    _, shell, _ = run(capsys, "register", "--priority", "50")
    value = shell.strip().removeprefix("export RAY_RUNTIME_ENV_PLUGINS=")
    # The shell form survives a real shell.
    echoed = subprocess.run(["bash", "-c", f"{shell.strip()}; echo \"$RAY_RUNTIME_ENV_PLUGINS\""],
                            capture_output=True, text=True, check=True).stdout
    assert json.loads(echoed) == [{"class": "acme.Plugin"}, {**PLUGIN, "priority": 50}]
    assert value.startswith("'")
    _, kuberay, _ = run(capsys, "register", "--format", "kuberay")
    stanza = yaml.safe_load(kuberay)["env"][0]
    assert stanza["name"] == "RAY_RUNTIME_ENV_PLUGINS"
    assert json.loads(stanza["value"]) == [{"class": "acme.Plugin"}, PLUGIN]


def test_register_for_the_kuberay_operator_prints_its_charts_values(capsys, monkeypatch):
    # The kuberay-operator chart's keys (KubeRay 1.5+, helm-chart/kuberay-operator/
    # values.yaml): configuration.defaultContainerEnvs, rendered into the
    # operator's ConfigMap only with configuration.enabled (templates/configmap.yaml).
    monkeypatch.delenv("RAY_RUNTIME_ENV_PLUGINS", raising=False)
    code, out, _ = run(capsys, "register", "--format", "kuberay-operator")
    values = yaml.safe_load(out)
    assert code == OK and values == {"configuration": {"enabled": True, "defaultContainerEnvs": [
        {"name": "RAY_RUNTIME_ENV_PLUGINS", "value": json.dumps([PLUGIN])}]}}
    # Merged with the operator's own plugin list, as the other formats are.
    monkeypatch.setenv("RAY_RUNTIME_ENV_PLUGINS", '[{"class": "acme.Plugin", "priority": 20}]')
    _, out, _ = run(capsys, "register", "--format", "kuberay-operator", "--priority", "95")
    env, = yaml.safe_load(out)["configuration"]["defaultContainerEnvs"]
    assert json.loads(env["value"]) == [{"class": "acme.Plugin", "priority": 20},
                                        {**PLUGIN, "priority": 95}]


@pytest.mark.parametrize("existing,priority,words", [
    ("not json", None, ["not JSON", "no plugin in it is lost"]),
    ('{"class": "x"}', None, ["not a JSON list"]),
    ("", "101", ["0 to 100"]),
])
def test_register_refuses_to_lose_anything(capsys, monkeypatch, existing, priority, words):
    monkeypatch.setenv("RAY_RUNTIME_ENV_PLUGINS", existing)
    code, out, err = run(capsys, "register", *(["--priority", priority] if priority else []))
    assert code == BAD_INPUT and out == ""
    for word in words:
        assert word in err


VERL_RUNTIME_ENV = """\
working_dir: ./
excludes: ["/.git/"]
env_vars:
  TORCH_NCCL_AVOID_RECORD_STREAMS: "1"
  CUDA_DEVICE_MAX_CONNECTIONS: "1"
"""


def test_runtime_env_for_ray_job_submit_takes_over_verls_hard_coded_value(capsys, tmp_path):
    base = tmp_path / "runtime_env.yaml"
    base.write_text(VERL_RUNTIME_ENV)
    code, out, _ = run(capsys, "runtime-env", MEGATRON_YAML, "--base", base, "--take-over")
    env = yaml.safe_load(out)
    assert code == OK
    assert env["working_dir"] == "./" and env["excludes"] == ["/.git/"]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env["env_vars"]
    assert env["env_vars"]["TORCH_NCCL_AVOID_RECORD_STREAMS"] == "1"
    assert env["env_vars"]["RAY_RUNTIME_ENV_HOOK"] == HOOK_PATH
    assert env["env_vars"][TAKE_OVER_VARIABLE] == "1"
    assert env["megatron_env"] == build_runtime_env(MEGATRON_YAML)["megatron_env"]


def test_runtime_env_without_take_over_keeps_the_value_explicit(capsys, tmp_path):
    base = tmp_path / "runtime_env.yaml"
    base.write_text(VERL_RUNTIME_ENV)
    _, out, _ = run(capsys, "runtime-env", MEGATRON_YAML, "--base", base, "--json",
                    "--role", "critic", "--role=actor")
    env = json.loads(out)
    assert env["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert sorted(env["megatron_env"]["engines"]) == ["actor", "critic"]


def test_runtime_env_ships_the_package_beside_the_bases_own_modules(capsys, tmp_path):
    # For ray job submit to a cluster without the package: the job uploads it.
    import ray_megatron_env

    folder = str(Path(ray_megatron_env.__file__).parent)
    base = tmp_path / "runtime_env.yaml"
    base.write_text("py_modules: [./mine]\n")
    code, out, _ = run(capsys, "runtime-env", MEGATRON_YAML, "--base", base, "--ship-package")
    assert code == OK
    assert yaml.safe_load(out)["py_modules"] == ["./mine", folder]
    # Already there: not twice.
    _, out, _ = run(capsys, "runtime-env", MEGATRON_YAML, "--ship-package", "--json",
                    "--base-json", json.dumps({"py_modules": [folder]}))
    assert json.loads(out)["py_modules"] == [folder]


def test_runtime_env_leaves_a_value_set_in_the_config_to_verls_driver(capsys, tmp_path):
    # verl's driver applies ray_kwargs.ray_init.runtime_env itself; a second
    # copy in the job env would make Ray refuse to merge the two.
    base = tmp_path / "runtime_env.yaml"
    base.write_text(VERL_RUNTIME_ENV)
    config = tmp_path / "config.yaml"
    config.write_text(MEGATRON_YAML.read_text() + "ray_kwargs:\n  ray_init:\n    runtime_env:\n"
                      "      env_vars:\n        CUDA_DEVICE_MAX_CONNECTIONS: '4'\n")
    code, out, err = run(capsys, "runtime-env", config, "--base", base, "--take-over")
    env_vars = yaml.safe_load(out)["env_vars"]
    assert code == OK and "CUDA_DEVICE_MAX_CONNECTIONS" not in env_vars
    # Nothing to take over; the driver hook is there as in every submitted env.
    assert TAKE_OVER_VARIABLE not in env_vars and env_vars["RAY_RUNTIME_ENV_HOOK"] == HOOK_PATH
    assert "sets CUDA_DEVICE_MAX_CONNECTIONS=4 itself" in err


def test_runtime_env_chains_an_existing_hook(capsys, tmp_path):
    base = tmp_path / "runtime_env.yaml"
    base.write_text("env_vars:\n  RAY_RUNTIME_ENV_HOOK: acme.hook\n")
    _, out, _ = run(capsys, "runtime-env", FSDP_YAML, "--base", base, "--take-over")
    env_vars = yaml.safe_load(out)["env_vars"]
    assert env_vars["RAY_RUNTIME_ENV_HOOK"] == HOOK_PATH
    assert env_vars["RAY_MEGATRON_ENV_NEXT_HOOK"] == "acme.hook"


def test_tp_override_shows_in_explain(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(MEGATRON_YAML.read_text().replace("tensor_model_parallel_size: 2",
                                                        "tensor_model_parallel_size: 1"))
    _, out, _ = run(capsys, "explain", config, "--gpus", "9.0", "--role", "actor", "--json")
    assert json.loads(out)["value"] is None


def test_explain_worker_env_classifies_the_process(capsys):
    # Golden: verl_megatron.yaml on 9.0; a standalone rollout worker group
    # (WG_PREFIX rollout_standalone_0) runs vLLM only: "not 1", nothing set;
    # the trainer's own workers run Megatron TP=2: 1.
    _, out, _ = run(capsys, "explain", MEGATRON_YAML, "--gpus", "9.0", "--json",
                    "--worker-env", "WG_PREFIX=rollout_standalone_0")
    rollout = json.loads(out)
    assert (rollout["value"], list(rollout["engines"])) == (None, ["rollout"])
    assert "WG_PREFIX=rollout_standalone_*" in rollout["process"]
    _, out, _ = run(capsys, "explain", MEGATRON_YAML, "--gpus", "9.0", "--json",
                    "--worker-env", "WG_PREFIX=x1y2z3")
    assert json.loads(out)["value"] == "1"


def test_explain_worker_env_must_be_name_equals_value(capsys):
    code, _, err = run(capsys, "explain", MEGATRON_YAML, "--gpus", "9.0", "--worker-env", "WG")
    assert code == BAD_INPUT and "--worker-env takes NAME=VALUE" in err


@pytest.mark.parametrize("argv", [
    ["explain", str(MEGATRON_YAML), "--gpus", "9.0"],
    ["explain", str(MEGATRON_YAML), "--gpus", "9.0", "--json"],
    ["register", "--format", "kuberay"],
    ["runtime-env", str(MEGATRON_YAML)],
    ["--help"],
])
def test_every_verb_ends_quietly_when_its_output_pipe_closes(argv):
    # The reader closes the pipe before anything is written, as `| head -0` does.
    proc = subprocess.Popen([sys.executable, "-m", "ray_megatron_env", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == OK
    assert err == ""


def test_check_reports_problems_but_fails_only_with_strict(capsys, monkeypatch):
    from ray_megatron_env import check
    from ray_megatron_env.check import NodeReport

    unplugged = NodeReport("ab12cd34" + "0" * 48, "10.0.0.7", False, None)
    monkeypatch.setattr(check, "check_cluster", lambda *a, **k: [unplugged])
    code, out, _ = run(capsys, "check")
    assert code == OK
    assert "1 node(s) checked, 1 with a problem." in out
    assert "ab12cd34 (10.0.0.7): no path decided on this node: the plugin is not" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    code, _, _ = run(capsys, "check", "--strict")
    assert code == 1


ALIVE = [("ab12cd34" + "1" * 48, "10.0.0.7"), ("ab12ff00" + "2" * 48, "10.0.0.8"),
         ("9f00aa11" + "3" * 48, "10.0.0.8")]


def test_check_passes_node_to_check_cluster_and_exits_2_for_one_not_alive(capsys, monkeypatch):
    from ray_megatron_env import check
    from ray_megatron_env.check import select_nodes

    asked = []

    def check_cluster(*args, nodes=None, **kwargs):
        asked.append(nodes)
        select_nodes(ALIVE, nodes)
        return []

    monkeypatch.setattr(check, "check_cluster", check_cluster)
    assert run(capsys, "check", "--node", "ab12cd34,10.0.0.8", "--node", "9f00")[0] == OK
    code, _, err = run(capsys, "check", "--node", "10.9.9.9")
    assert asked == [["ab12cd34", "10.0.0.8", "9f00"], ["10.9.9.9"]]
    assert code == BAD_INPUT and "ray-megatron-env check: no alive node has" in err


def test_check_json_stays_json_when_ray_prints_to_stdout(capsys, monkeypatch):
    # Ray's driver prints "(raylet) A worker died ..." to sys.stdout from a
    # thread of its own while connected; --json must still parse.
    from ray_megatron_env import check
    from ray_megatron_env.check import NodeReport

    def check_cluster(*args, **kwargs):
        print("(raylet) A worker died or was killed while executing a task")
        return [NodeReport("ab12cd34" + "0" * 48, "10.0.0.7", False, None)]

    monkeypatch.setattr(check, "check_cluster", check_cluster)
    code, out, err = run(capsys, "check", "--json")
    assert json.loads(out)[0]["ip"] == "10.0.0.7"
    assert "(raylet) A worker died" in err


def test_a_table_of_workers_classified_alike_leaves_the_classification_out():
    from ray_megatron_env.check import NodeReport
    from ray_megatron_env.cli import format_reports
    from ray_megatron_env.record import Decision

    def report(node, process, via):
        decision = Decision.from_dict({  # a record of version 1
            "value": "1", "source": "policy", "requirement": "1", "gpus": ["9.0"],
            "reason": f"{process}: compute capability 9.0: set to 1.", "process": process,
            "via": via})
        return NodeReport(node * 7, "10.0.0.1", via == "plugin", "1", decision)

    alike = format_reports([report("a", "actor worker (no process rule matched)", "plugin"),
                            report("b", "actor worker (no process rule matched)", "setup-hook")])
    assert "no process rule matched" not in alike
    assert "    compute capability 9.0: set to 1." in alike
    assert [line.split()[2:4] for line in alike.splitlines()[1::2]] == [
        ["yes", "plugin"], ["no", "setup-hook"]]
    mixed = format_reports([report("a", "actor worker (x)", "plugin"),
                            report("b", "rollout process (y)", "plugin")])
    assert "actor worker (x): compute" in mixed and "rollout process (y): compute" in mixed


def test_explain_takes_a_vendors_name_in_gpus_and_node_alike(capsys):
    code = main(["explain", str(MEGATRON_YAML), "--gpus", "npu", "--node", '{"gpus": "npu"}',
                 "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == OK and data["gpus"] == ["ascend"]
    # verl's Megatron actor is TP=2 and nothing runs Megatron-LM's check:
    # the Ascend row asks 1 as a preference (rules.md#non-cuda-accelerators).
    assert data["value"] == "1"


def test_node_env_takes_name_value(capsys):
    assert main(["explain", str(MEGATRON_YAML), "--gpus", "8.0", "--node-env", "X"]) == 2
    assert "--node-env takes NAME=VALUE" in capsys.readouterr().err
