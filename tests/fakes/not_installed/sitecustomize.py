"""A node where ray_megatron_env is not installed (conftest.py, the
"not_installed" node): Python loads this at start-up from the node's
PYTHONPATH, in every process Ray starts there.

The package stays importable from anywhere but the installed copy
(RAY_MEGATRON_ENV_TEST_HIDE, its folder), so a copy a job ships in
``py_modules`` is found, as on a real node without the package.
"""

import os
import sys
from importlib.machinery import PathFinder

_PACKAGE = "ray_megatron_env"
_HIDDEN = os.path.realpath(os.environ.get("RAY_MEGATRON_ENV_TEST_HIDE", ""))


class _NotInstalledHere:
    """First on sys.meta_path: the package only from a sys.path entry whose
    copy is not the hidden one; never through an installer's own finder
    (an editable install's meta-path finder comes later and is not asked)."""

    def find_spec(self, name, path=None, target=None):
        if name != _PACKAGE:
            return None
        spec = PathFinder.find_spec(name, sys.path)
        origin = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations \
            else None
        if origin is None or os.path.realpath(origin) == _HIDDEN:
            raise ModuleNotFoundError(f"No module named {_PACKAGE!r}", name=_PACKAGE)
        return spec


if _HIDDEN:
    sys.meta_path.insert(0, _NotInstalledHere())
