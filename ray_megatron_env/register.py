"""The RAY_RUNTIME_ENV_PLUGINS value that registers this plugin on a node.

Merged with what the environment already has: another plugin is never
dropped, and this one is never listed twice.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Dict, List, Optional

from .errors import RegistrationError
from .names import PLUGIN_CLASS_PATH as CLASS_PATH, PLUGINS_VARIABLE
from .plugin import MegatronEnvPlugin
FORMATS = ("shell", "json", "kuberay", "kuberay-operator")


def merged_plugins(existing: Optional[str], priority: Optional[int] = None) -> List[Dict[str, Any]]:
    """The plugin list with this plugin in it exactly once, others untouched."""
    plugins: List[Any] = []
    if existing and existing.strip():
        try:
            plugins = json.loads(existing)
        except ValueError as exc:
            raise RegistrationError(f"the current {PLUGINS_VARIABLE} is not JSON ({exc}); fix or "
                                  "unset it first, so no plugin in it is lost") from None
        if not isinstance(plugins, list):
            raise RegistrationError(f"the current {PLUGINS_VARIABLE} is not a JSON list: "
                                    f"{existing!r}")
    if priority is not None and not 0 <= priority <= 100:
        raise RegistrationError(f"--priority must be from 0 to 100 (Ray's range), got {priority}")
    ours: Dict[str, Any] = {"class": CLASS_PATH}
    if priority is not None:
        ours["priority"] = priority
    others = [p for p in plugins if not (isinstance(p, dict) and p.get("class") == CLASS_PATH)]
    return others + [ours]


def render(plugins: List[Dict[str, Any]], fmt: str) -> str:
    value = json.dumps(plugins)
    if fmt == "json":
        return value
    if fmt == "shell":
        return f"export {PLUGINS_VARIABLE}={shlex.quote(value)}"
    if fmt == "kuberay":
        # JSON is valid YAML: a quoted scalar survives any indentation.
        return "\n".join([
            "# Add to the container env of headGroupSpec and of every workerGroupSpecs entry.",
            f"# (plugin: {CLASS_PATH}; without a priority in the list, its class's "
            f"{MegatronEnvPlugin.priority} applies)",
            "env:",
            f"  - name: {PLUGINS_VARIABLE}",
            f"    value: {json.dumps(value)}",
        ])
    if fmt == "kuberay-operator":
        # The kuberay-operator chart (KubeRay 1.5+): configuration.defaultContainerEnvs
        # goes into the operator's ConfigMap, which the chart renders only with
        # configuration.enabled (templates/configmap.yaml); the operator adds
        # each variable to the Ray container of every pod of every RayCluster
        # that does not set that name itself (common/pod.go, setContainerEnvVars).
        return "\n".join([
            "# Helm values for the kuberay-operator chart (KubeRay 1.5+): every Ray container of",
            "# every RayCluster this operator manages gets the variable, unless the RayCluster",
            "# sets RAY_RUNTIME_ENV_PLUGINS itself (then its own value wins, nothing is merged).",
            "# helm upgrade --install kuberay-operator kuberay/kuberay-operator -f THIS_FILE",
            f"# (plugin: {CLASS_PATH}; without a priority in the list, its class's "
            f"{MegatronEnvPlugin.priority} applies)",
            "configuration:",
            "  enabled: true",
            "  defaultContainerEnvs:",
            f"    - name: {PLUGINS_VARIABLE}",
            f"      value: {json.dumps(value)}",
        ])
    raise RegistrationError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
