"""pynvml, imported without the module it needs only on Windows.

pynvml runs ``from ctypes.util import find_library`` when it is imported; on Linux it never calls
it. ctypes.util imports shutil, subprocess and tempfile: about 11 ms of CPU (measured) in every
Prolog's and Epilog's GPU probe, on every node of every job, a third of pynvml's import. While
pynvml is imported here, ``ctypes.util`` is a stand-in whose ``find_library`` imports the real
module when it is called; the stand-in is gone from ``sys.modules`` once pynvml is in, so any
later ``import ctypes.util`` gets the real one.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Optional

_NAME = "ctypes.util"


def _find_library(name: str) -> Optional[str]:
    """ctypes.util.find_library, the real one, imported on first call."""
    if getattr(sys.modules.get(_NAME), "__stand_in__", False):
        del sys.modules[_NAME]
    return importlib.import_module(_NAME).find_library(name)


def _import() -> Any:
    if "pynvml" in sys.modules or _NAME in sys.modules:
        return importlib.import_module("pynvml")
    stand_in = types.ModuleType(_NAME, "find_library only, until it is called (slurm_triage.collect.nvml)")
    stand_in.find_library = _find_library  # type: ignore[attr-defined]
    stand_in.__stand_in__ = True  # type: ignore[attr-defined]
    sys.modules[_NAME] = stand_in
    try:
        return importlib.import_module("pynvml")
    finally:
        if sys.modules.get(_NAME) is stand_in:
            del sys.modules[_NAME]


pynvml = _import()
