"""Evidence sources for ``triage JOBID``: Slurm, Prometheus, the Pushgateway and node state.

Sources do I/O only and never judge. Each returns plain JSON-able facts plus a record for the
report's ``sources`` block (``{"read": bool, "error": ..., ...}``): an unreachable source is a
note in that block, never an exception, because triage at 3 a.m. must say what it could not see.

``settings(cfg)`` gives the ``[triage]`` config section as one dict for the rules.
"""
from __future__ import annotations

from typing import Any, Dict

from ...config import Config, defaults

# The [triage] defaults (config.SCHEMA), for callers that build settings without a file.
DEFAULTS: Dict[str, Any] = defaults()["triage"]


def settings(cfg: Config) -> Dict[str, Any]:
    """Every [triage] setting; the Pushgateway URL falls back to pushgateway.url."""
    out = dict(cfg.values["triage"])
    out["pushgateway_url"] = out["pushgateway_url"] or cfg.get("pushgateway", "url")
    return out
