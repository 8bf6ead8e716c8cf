"""Every bad input and fault this project was tried against, as data.

The tests iterate these lists (cluster/test_bad_input.py on the driver and in the
agent of a real cluster; the fault rows name the tests that prove them), and
``docs/reliability.md`` is rendered from them: ``python tests/helpers/reliability_cases.py``
rewrites it, and house/test_docs.py fails if it drifts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Tuple

from ray_megatron_env.errors import FieldTypeError, FieldValueError

VAR = "CUDA_DEVICE_MAX_CONNECTIONS"
GOOD = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}


def verl_actor(**actor: Any) -> Dict[str, Any]:
    return {"actor_rollout_ref": {"actor": {"strategy": "megatron", **actor}}}


def megatron(**megatron: Any) -> Dict[str, Any]:
    sizes = {"tensor_model_parallel_size": 1, "context_parallel_size": 1}
    return verl_actor(megatron={**sizes, **megatron})


def engine(**keys: Any) -> Dict[str, Any]:
    return {"engines": {"actor": {"strategy": "megatron", **keys}}}


def _deep(levels: int) -> Dict[str, Any]:
    node: Dict[str, Any] = {"critic": {"strategy": "fsdp"}}
    for _ in range(levels):
        node = {"x": node}
    return {"critic": {"strategy": "fsdp"}, "nest": node}


@dataclass(frozen=True)
class BadInput:
    id: str
    what: str  # the input, in words
    runtime_env: Dict[str, Any]  # exactly what the user passes to Ray
    error: type  # raised on the driver (build_runtime_env and the hook)
    says: str  # a fragment of the message, on the driver and in the agent
    # False where Ray itself refuses the value when the task is submitted,
    # so it never reaches a node (non-JSON values, non-string env vars).
    reaches_agent: bool = True
    agent_says: str = ""  # where the agent's message differs from the driver's

    @property
    def in_agent(self) -> str:
        return self.agent_says or self.says


def field(value: Any, **kw) -> Dict[str, Any]:
    return {"megatron_env": value, **kw}


def explicit(value: Any) -> Dict[str, Any]:
    return {"megatron_env": GOOD, "env_vars": {VAR: value}}


BAD_INPUTS: Tuple[BadInput, ...] = (
    # The field itself
    BadInput("field-str", "the field is a word (a path on the driver)", field("megatron"),
             FieldValueError, "config file 'megatron' does not exist",
             agent_says="the field must be a mapping"),
    BadInput("field-path", "the field is a file path (opened on the driver only)",
             field("/nonexistent/megatron.yaml"), FieldValueError, "does not exist",
             agent_says="the field must be a mapping"),
    BadInput("field-list", "the field is a list", field([GOOD]), FieldTypeError,
             "the field must be a mapping"),
    BadInput("field-int", "the field is a number", field(7), FieldTypeError,
             "the field must be a mapping"),
    BadInput("field-bool", "the field is a boolean", field(True), FieldTypeError,
             "the field must be a mapping"),
    BadInput("field-empty", "an empty mapping", field({}), FieldValueError,
             "neither the compact form"),
    BadInput("field-unrelated", "a mapping that is neither layout", field({"trainer": {"nnodes": 2}}),
             FieldValueError, "top-level keys: trainer"),
    BadInput("field-nan", "NaN inside the value", field({**GOOD, "x": float("nan")}),
             FieldValueError, "not valid JSON"),
    BadInput("field-set", "a non-JSON value (a set)", field({**GOOD, "x": {1, 2}}),
             FieldTypeError, "not JSON-serialisable", reaches_agent=False),
    BadInput("field-huge", "a config of 600 KB of JSON (the cap is 512 KiB)",
             field({"critic": {"strategy": "fsdp"}, "pad": "x" * 600_000}), FieldValueError,
             "the limit is 524288"),
    BadInput("field-deep", "a config nested 40 levels deep", field(_deep(40)), FieldValueError,
             "nested more than 32 levels"),
    # The compact form
    BadInput("compact-unknown-top", "an unknown top-level key (LD_PRELOAD)",
             field({**GOOD, "LD_PRELOAD": "/tmp/x.so"}), FieldValueError, "'LD_PRELOAD'"),
    BadInput("compact-env-vars", "an env_vars key inside the field",
             field({**GOOD, "env_vars": {"PATH": "/tmp"}}), FieldValueError, "'env_vars'"),
    BadInput("compact-version-str", "version as a string", field({**GOOD, "version": "1"}),
             FieldTypeError, "version must be an integer"),
    BadInput("compact-version-new", "a newer format version", field({**GOOD, "version": 3}),
             FieldValueError, "format version 3 is not supported"),
    BadInput("compact-version-bool", "version as a boolean", field({**GOOD, "version": True}),
             FieldTypeError, "version must be an integer"),
    BadInput("compact-engines-list", "engines is a list", field({"engines": ["megatron"]}),
             FieldTypeError, "engines must be a mapping"),
    BadInput("compact-engines-str", "engines is a string", field({"engines": "megatron"}),
             FieldTypeError, "engines must be a mapping"),
    BadInput("compact-too-many", "65 roles",
             field({"engines": {f"r{i}": {"strategy": "fsdp"} for i in range(65)}}),
             FieldValueError, "at most 64"),
    BadInput("compact-role-dollar", "a role name that would expand ($HOME)",
             field({"engines": {"$HOME": {"strategy": "fsdp"}}}), FieldValueError,
             "not a valid name"),
    BadInput("compact-role-path", "a role name with a path (../x)",
             field({"engines": {"../x": {"strategy": "fsdp"}}}), FieldValueError,
             "not a valid name"),
    BadInput("compact-engine-str", "an engine that is not a mapping",
             field({"engines": {"actor": "megatron"}}), FieldTypeError,
             "engines.actor must be a mapping"),
    BadInput("compact-no-strategy", "an engine without strategy", field({"engines": {"actor": {}}}),
             FieldValueError, "engines.actor.strategy is missing"),
    BadInput("compact-strategy-int", "strategy is a number", field(engine(strategy=3)),
             FieldTypeError, "engines.actor.strategy must be a string"),
    BadInput("compact-strategy-typo", "an unknown strategy (megatorn)",
             field(engine(strategy="megatorn")), FieldValueError, "unknown strategy 'megatorn'"),
    BadInput("compact-strategy-code", "a strategy that looks like code",
             field(engine(strategy="__import__('os').system('id')")), FieldValueError,
             "not a valid name"),
    BadInput("compact-kind-unknown", "an unknown engine kind", field(
        {"engines": {"a": {"strategy": "mine", "kind": "gpu"}}}), FieldValueError,
        "kinds are megatron, fsdp, inference"),
    BadInput("compact-kind-relabel", "a known engine declared as another kind",
             field(engine(kind="fsdp")), FieldValueError, "declared as 'fsdp'"),
    BadInput("compact-engine-extra", "an unknown key inside an engine (env_vars)",
             field(engine(env_vars={"LD_PRELOAD": "x"})), FieldValueError, "'env_vars'"),
    BadInput("compact-tp-zero", "tensor_parallel 0", field(engine(tensor_parallel=0)),
             FieldValueError, "engines.actor.tensor_parallel must be an integer from 1"),
    BadInput("compact-tp-negative", "tensor_parallel -4", field(engine(tensor_parallel=-4)),
             FieldValueError, "engines.actor.tensor_parallel"),
    BadInput("compact-tp-float", "tensor_parallel 2.0", field(engine(tensor_parallel=2.0)),
             FieldTypeError, "engines.actor.tensor_parallel must be an integer"),
    BadInput("compact-tp-str", "tensor_parallel '2'", field(engine(tensor_parallel="2")),
             FieldTypeError, "got '2' (str)"),
    BadInput("compact-tp-bool", "tensor_parallel true", field(engine(tensor_parallel=True)),
             FieldTypeError, "got True (bool)"),
    BadInput("compact-tp-huge", "tensor_parallel 10**12", field(engine(tensor_parallel=10**12)),
             FieldValueError, "from 1 to 65536"),
    BadInput("compact-cp-null", "context_parallel null", field(engine(context_parallel=None)),
             FieldTypeError, "engines.actor.context_parallel"),
    BadInput("compact-flag-str", "megatron_fsdp 'false' (a boolean as a string)",
             field(engine(megatron_fsdp="false")), FieldTypeError, "must be true or false"),
    BadInput("compact-flag-int", "moe_overlap 1", field(engine(moe_overlap=1)),
             FieldTypeError, "engines.actor.moe_overlap must be true or false"),
    # verl's layout
    BadInput("verl-root-list", "actor_rollout_ref is a list", field({"actor_rollout_ref": [1]}),
             FieldTypeError, "actor_rollout_ref must be a mapping"),
    BadInput("verl-section-str", "actor section is a string",
             field({"actor_rollout_ref": {"actor": "megatron"}}), FieldTypeError,
             "actor_rollout_ref.actor must be a mapping"),
    BadInput("verl-strategy-typo", "strategy: megatorn", field(verl_actor(strategy="megatorn")),
             FieldValueError, "unknown strategy 'megatorn' at actor_rollout_ref.actor.strategy"),
    BadInput("verl-strategy-case", "strategy: Megatron (wrong case)",
             field(verl_actor(strategy="Megatron")), FieldValueError, "unknown strategy 'Megatron'"),
    BadInput("verl-critic-typo", "critic.strategy: fsdp3", field({"critic": {"strategy": "fsdp3"}}),
             FieldValueError, "'fsdp3' at critic.strategy"),
    BadInput("verl-tp-str", "tensor_model_parallel_size '2'", field(megatron(tensor_model_parallel_size="2")),
             FieldTypeError, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"),
    BadInput("verl-tp-zero", "tensor_model_parallel_size 0",
             field(megatron(tensor_model_parallel_size=0)), FieldValueError,
             "tensor_model_parallel_size must be an integer from 1"),
    BadInput("verl-cp-huge", "context_parallel_size 2**40", field(megatron(context_parallel_size=2**40)),
             FieldValueError, "context_parallel_size must be an integer from 1 to 65536"),
    BadInput("verl-no-sizes", "a Megatron actor without its parallel sizes",
             field(verl_actor()), FieldValueError,
             "has no actor_rollout_ref.actor.megatron.tensor_model_parallel_size; looked for"),
    BadInput("verl-fsdp-str", "use_megatron_fsdp 'true'", field(megatron(use_megatron_fsdp="true")),
             FieldTypeError, "use_megatron_fsdp must be true or false"),
    BadInput("verl-enable-str", "critic.enable 'false'",
             field({"critic": {"strategy": "fsdp", "enable": "false"}}), FieldTypeError,
             "critic.enable must be true or false"),
    BadInput("verl-interpolation", "an unresolved ${oc.env:...} where a value is read",
             field(verl_actor(strategy="${oc.env:HOME}")), FieldValueError,
             "unresolved interpolation"),
    BadInput("verl-kinds-str", "megatron_env.engine_kinds is not a mapping",
             field({**verl_actor(), "megatron_env": {"engine_kinds": "fsdp"}}), FieldTypeError,
             "engine_kinds must be a mapping"),
    BadInput("verl-kinds-extra", "megatron_env section with an env_vars key",
             field({**verl_actor(), "megatron_env": {"env_vars": {"PATH": "/tmp"}}}),
             FieldValueError, "unknown key(s) 'env_vars' in megatron_env"),
    BadInput("driver-env-unknown", "driver_env names a variable no pack of the job decides",
             field({**GOOD, "driver_env": {"TORCH_CUDA_ARCH_LIST": "8.0"}}), FieldValueError,
             "which no pack of this job decides"),
    # An explicit env_vars value next to the field
    BadInput("explicit-zero", f"env_vars {VAR}='0'", explicit("0"), FieldValueError,
             "CUDA accepts an integer from 1 to 32"),
    BadInput("explicit-33", f"env_vars {VAR}='33'", explicit("33"), FieldValueError,
             "CUDA accepts an integer from 1 to 32"),
    BadInput("explicit-word", f"env_vars {VAR}='max'", explicit("max"), FieldValueError,
             "CUDA accepts an integer from 1 to 32"),
    BadInput("explicit-negative", f"env_vars {VAR}='-1'", explicit("-1"), FieldValueError,
             "CUDA accepts an integer from 1 to 32"),
    BadInput("explicit-expand", f"env_vars {VAR}='${{OTHER}}'", explicit("${OTHER}"),
             FieldValueError, "CUDA accepts an integer from 1 to 32"),
    BadInput("explicit-int", f"env_vars {VAR}=1 (an int, not a string)", explicit(1),
             FieldTypeError, "must be a string", reaches_agent=False),
)


@dataclass(frozen=True)
class Fault:
    what: str
    user_sees: str
    lost: str
    tests: Tuple[str, ...]  # test module::function that proves it


FAULTS: Tuple[Fault, ...] = (
    Fault("NVML library cannot be loaded", "nvidia-smi is asked, then the kernel driver's "
          "device listing (/proc/driver/nvidia/gpus): NVIDIA devices there make the node "
          "'unknown' (conservative rule, reason recorded), /dev/kfd names an AMD node, "
          "/dev/davinci<N> an Ascend node, /dev/mtgpu.<N> a Moore Threads node; only when "
          "every source says none is the node 'no GPU'", "nothing",
          ("unit/probe/test_probe.py::test_library_not_found_is_not_no_gpu_nvidia_smi_is_asked",
           "unit/probe/test_listings.py::test_devices_in_the_driver_listing_make_the_node_unknown_not_gpu_free",
           "unit/probe/test_listings.py::test_an_amd_node_is_named_as_such",
           "unit/probe/test_listings.py::test_ascend_and_moore_threads_nodes_are_named_never_no_gpu",
           "unit/probe/test_listings.py::test_library_and_nvidia_smi_missing_and_no_listing_is_no_gpu",
           "cluster/test_plugin.py::test_nvml_path_on_a_real_node_agrees_with_a_local_probe",
           "cluster/test_plugin.py::test_nvml_unloadable_falls_back_to_nvidia_smi_on_a_real_node",
           "cluster/test_faults.py::test_nvidia_devices_listed_by_the_kernel_are_never_no_gpu",
           "cluster/test_faults.py::test_an_amd_node_is_named_and_follows_megatrons_major_9")),
    Fault("an NVML call hangs in the driver", "given up after 3 s (unknown, conservative, "
          "reason recorded); the stuck call is never waited on again; nvidia-smi still asked",
          "nothing",
          ("unit/probe/test_nvml.py::test_a_hung_nvml_gives_unknown_within_its_bound_and_is_not_waited_on_twice",)),
    Fault("NVML init error (driver not loaded, version mismatch)",
          "nvidia-smi is tried; if it fails too, the GPUs are 'unknown', the conservative rule "
          "applies and the decision's probe.error and warnings say why", "nothing",
          ("unit/probe/test_probe.py::test_nvml_init_error_falls_back_to_nvidia_smi",)),
    Fault("a per-device NVML error (GPU lost)", "as above", "nothing",
          ("unit/probe/test_probe.py::test_nvml_device_error_falls_back_to_nvidia_smi",)),
    Fault("garbage from nvidia-smi", "unknown GPUs, conservative rule, error recorded", "nothing",
          ("unit/probe/test_smi.py::test_nvidia_smi_errors",)),
    Fault("nvidia-smi hangs", "killed with its process group after 3 s; the worker starts with "
          "the conservative value; other runtime envs on the node start meanwhile (the probe "
          "runs off the agent's event loop)", "nothing",
          ("cluster/test_plugin.py::test_a_hung_nvidia_smi_does_not_block_the_agent",)),
    Fault("malformed RAY_MEGATRON_ENV_FAKE_GPUS", "unknown GPUs, conservative rule, error recorded",
          "nothing", ("unit/test_agent.py::test_a_malformed_fake_is_recorded_and_treated_conservatively",)),
    Fault("the node's CUDA_VISIBLE_DEVICES names a missing GPU", "unknown GPUs, conservative "
          "rule, the error names the device (no silent truncation as CUDA would do)", "nothing",
          ("unit/probe/test_probe.py::test_nvml_visible_devices_error_does_not_fall_back",
           "cluster/test_faults.py::test_visible_devices_naming_a_missing_gpu_on_a_real_node")),
    Fault("plugin not registered on one node", "Ray ignores the field there (one WARNING in "
          "that node's log); the job env's setup hook decides in each worker instead, with the "
          "same value and `via: setup-hook`; `check` shows PLUGIN no, VIA setup-hook",
          "nothing, with a job env from build_runtime_env; with a task or actor env alone "
          "(no job-level hook), the value on that node",
          ("cluster/test_fallback.py::test_every_node_gets_its_value_registered_or_not",
           "cluster/test_plugin.py::test_a_task_env_alone_is_not_decided_on_a_node_without_the_plugin",
           "cluster/test_operator.py::test_check_strict_shows_which_path_decides_on_every_node")),
    Fault("a driver started inside a worker (vLLM's Ray executor: ray.init with the worker's "
          "own runtime env), on Ray 2.41 to 2.54, which assert on the setup hook's variable "
          "beside the field", "it starts: the setup hook sets this package's "
          "RAY_RUNTIME_ENV_HOOK in the worker, which drops that variable and Ray writes it "
          "anew; its workers get their node's value and record on both paths", "nothing",
          ("cluster/test_fallback.py::test_a_driver_nested_in_a_worker_starts_and_its_workers_are_decided",
           "cluster/test_job_submit.py::test_a_driver_nested_in_a_worker_of_a_submitted_job_starts_and_decides",
           "unit/test_job_submission.py::test_a_driver_nested_in_a_worker_passes_rays_upload")),
    Fault("a worker's first task arrives after its setup hook ran (Ray orders the two on no "
          "release; forced with Ray's PushTask delay), on a node without the plugin",
          "the hook reads only the worker's own environment (the field and each pack "
          "variable's mark beside it), never Ray's job config: the job's namespace, the "
          "driver's directory on sys.path and an explicit value equal to the node's own "
          "(job, per-role or per-actor) are kept, as on a registered node",
          "nothing; a plain per-actor env_vars value equal to the node's own, of a variable "
          "no env from this package set, is read as the node's (docs/limitations.md)",
          ("cluster/test_setup_hook_race.py::test_a_job_value_equal_to_the_nodes_own_stays_explicit_under_the_race",
           "cluster/test_setup_hook_race.py::test_an_actors_value_equal_to_the_nodes_own_over_the_jobs_is_explicit",
           "cluster/test_setup_hook_race.py::test_fresh_workers_without_the_delay_keep_the_jobs_config_and_value",
           "unit/test_setup_hook.py::test_the_setup_hook_asks_ray_nothing_it_fills_with_the_first_task")),
    Fault("plugin registered but the package not installed on a node", "Ray's agent cannot "
          "import the class, the raylet exits and the node never joins; the agent's "
          "runtime_env_agent*.err names the missing module (Ray's behaviour, not the plugin's)",
          "the node, until the package is installed",
          ("cluster/test_faults.py::test_a_registered_but_missing_package_keeps_the_node_out",)),
    Fault("a broken install (a module of the package missing)", "workers with the field fail "
          "with RuntimeEnvSetupError naming BrokenInstallError and the fix; the node stays up and "
          "runs everything else", "nothing but those workers' start",
          ("house/test_import.py::test_a_broken_install_fails_the_worker_not_the_import",
           "cluster/test_faults.py::test_a_broken_install_fails_workers_not_the_node")),
    Fault("an older package on a node than on the driver (format version)", "RuntimeEnvSetupError: "
          "format version N is not supported ... install the same version", "nothing",
          ("cluster/test_faults.py::test_an_old_install_refuses_a_newer_format_clearly",)),
    Fault("RAY_RUNTIME_ENV_PLUGINS lists other plugins too", "both plugins run; `register` "
          "merges without dropping or duplicating", "nothing",
          ("cluster/test_faults.py::test_another_plugin_registered_beside_this_one",
           "unit/test_cli.py::test_register_keeps_other_plugins_and_lists_this_one_once")),
    Fault("64 actors at once on 4 nodes, 5 different runtime envs", "every worker gets its "
          "node's value; one probe per node per agent process; no deadlock; the agents' "
          "resident memory stays flat", "nothing",
          ("cluster/test_load.py::test_many_actors_at_once",)),
    Fault("the plugin called 500 times as the agent calls it (`validate`, `create`, "
          "`modify_context`), 5 runtime envs", "less than 32 bytes kept per call "
          "(tracemalloc, after a collection)", "nothing",
          ("unit/test_plugin.py::test_the_plugin_keeps_nothing_per_worker",)),
)


def render() -> str:
    rows = ["| input | on the driver (`build_runtime_env`, the `RAY_RUNTIME_ENV_HOOK` hook) "
            "| in the agent (what the caller gets) | lost |", "|---|---|---|---|"]
    for case in BAD_INPUTS:
        agent = (f"`RuntimeEnvSetupError` within seconds: \"…{case.in_agent}…\"" if case.reaches_agent
                 else "Ray refuses it at submission (`TypeError`); nothing reaches a node")
        rows.append(f"| {case.what} (`{case.id}`) | `{case.error.__name__}`: \"…{case.says}…\" "
                    f"| {agent} | nothing |")
    faults = ["| fault | what the user sees | lost | proven by |", "|---|---|---|---|"]
    for fault in FAULTS:
        tests = "<br>".join(f"`{t}`" for t in fault.tests)
        faults.append(f"| {fault.what} | {fault.user_sees} | {fault.lost} | {tests} |")
    return "\n".join(rows) + "\n\n" + "\n".join(faults)


if __name__ == "__main__":
    doc = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
    text = doc.read_text()
    head, rest = text.split("<!-- cases:begin -->", 1)
    tail = rest.split("<!-- cases:end -->", 1)[1]
    doc.write_text(f"{head}<!-- cases:begin -->\n{render()}\n<!-- cases:end -->{tail}")
