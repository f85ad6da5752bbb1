"""The kit's optional parts, each an extra of the `quiesce` distribution: the Docker SDK
(`quiesce[docker]`: containers reached through the Docker engine's API) and cryptography
(`quiesce[crypto]`: markers' and attestations' signatures checked, keys made). `pip install
quiesce` alone carries the binaries and the `quiesce` command, which need neither.
"""

from __future__ import annotations

import importlib


class MissingExtra(ImportError):
    """An optional part of the kit is not installed; the message names the extra."""


def need(module: str, extra: str, what: str) -> None:
    """Nothing when `module` imports; MissingExtra naming `pip install 'quiesce[EXTRA]'` when
    it is not installed (an import error of another module it imports is raised as it is)."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        if e.name is None or e.name.split(".")[0] != top:
            raise
        raise MissingExtra(
            f"{what} needs the {top} package, which this install of quiesce lacks: "
            f"pip install 'quiesce[{extra}]'"
        ) from None
