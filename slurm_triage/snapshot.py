"""Take a node snapshot: every enabled collector at once, each under its own deadline.

The snapshot is a JSON-able dict of fact sections (``gpu``, ``procs``, ``kernel``,
``rdma``); a section whose probe failed or timed out is ``None`` and its error is in
``errors``. Collectors are imported lazily in the children so the parent pays only for
what it uses.
"""
from __future__ import annotations

import importlib
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from .config import Config
from .deadline import run_probes

SCHEMA = 1
# section -> collector module under slurm_triage.collect; each exposes collect(cfg, **kw) -> dict.
COLLECTORS = ("gpu", "procs", "kernel", "rdma")


def _probe(section: str, cfg: Config, kwargs: Dict[str, Any]) -> Callable[[], Any]:
    def run() -> Any:
        mod = importlib.import_module(f"slurm_triage.collect.{section}")
        return mod.collect(cfg, **kwargs)

    return run


def take(cfg: Config, sections: Optional[Sequence[str]] = None,
         options: Optional[Dict[str, Dict[str, Any]]] = None,
         meanwhile: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """Collect ``sections`` (default: every enabled one) in parallel children.

    ``options`` passes per-collector keyword arguments, e.g. ``{"gpu": {"indices": [0, 1]}}``;
    ``meanwhile`` runs in this process while the children collect.
    """
    options = options or {}
    wanted = [s for s in (sections or COLLECTORS) if cfg.get(s, "enabled")]
    probes: Dict[str, Tuple[Callable[[], Any], float]] = {
        s: (_probe(s, cfg, options.get(s, {})), cfg.get(s, "deadline_seconds")) for s in wanted}
    t0 = time.time()
    results = run_probes(probes, meanwhile)
    snap: Dict[str, Any] = {"schema": SCHEMA, "node": cfg.get("node", "name"), "time": t0,
                            "errors": {}, "probe_seconds": {}}
    for s in COLLECTORS:
        snap[s] = None
    for name, r in results.items():
        snap["probe_seconds"][name] = round(r.seconds, 4)
        if r.ok:
            snap[name] = r.value
        else:
            snap["errors"][name] = r.error
    if snap["gpu"]:
        from .inventory import update

        update(cfg.get("node", "state_dir"), snap["gpu"], t0)
    return snap


def preload_sinks() -> None:
    """Import what a push needs (requests, prometheus_client: 150+ ms) while probes run."""
    import prometheus_client  # noqa: F401
    import requests  # noqa: F401
