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
from .deadline import Running, Spare, start_probes

SCHEMA = 1
# section -> collector module under slurm_triage.collect; each exposes collect(cfg, **kw) -> dict.
COLLECTORS = ("gpu", "procs", "kernel", "rdma")


def run_job(job: Dict[str, Any]) -> Any:
    """A collector run in a spare child, from the job ``start`` handed it (JSON)."""
    cfg = Config(job["values"], job["source"])
    return _probe(job["section"], cfg, job["kwargs"])()


GPU_SPARE = (run_job, ("slurm_triage.collect.nvml", "slurm_triage.collect.gpu"))
"""What a hook pre-forks for its GPU probe (deadline.Spare): pynvml's import is the largest
part of that probe, and it then overlaps the hook's own imports and config read."""


def _probe(section: str, cfg: Config, kwargs: Dict[str, Any]) -> Callable[[], Any]:
    def run() -> Any:
        mod = importlib.import_module(f"slurm_triage.collect.{section}")
        return mod.collect(cfg, **kwargs)

    return run


class Pending:
    """A snapshot whose probes are running: a hook starts it as soon as it has its config."""

    def __init__(self, cfg: Config, running: Running, t0: float):
        self.cfg, self.running, self.t0 = cfg, running, t0

    def cancel(self) -> None:
        self.running.cancel()

    def result(self, meanwhile: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
        """Wait for the probes (``meanwhile`` runs in this process while they work)."""
        results = self.running.wait(meanwhile)
        snap: Dict[str, Any] = {"schema": SCHEMA, "node": self.cfg.get("node", "name"), "time": self.t0,
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

            update(self.cfg.get("node", "state_dir"), snap["gpu"], self.t0)
        return snap


def start(cfg: Config, sections: Optional[Sequence[str]] = None,
          options: Optional[Dict[str, Dict[str, Any]]] = None,
          spares: Optional[Dict[str, Spare]] = None) -> Pending:
    """Fork the collectors of ``sections`` (default: every enabled one) and return at once.

    ``options`` passes per-collector keyword arguments, e.g. ``{"gpu": {"indices": [0, 1]}}``;
    ``spares``: pre-forked children (GPU_SPARE) that run a section's collector instead.
    """
    options = options or {}
    wanted = [s for s in (sections or COLLECTORS) if cfg.get(s, "enabled")]
    probes: Dict[str, Tuple[Callable[[], Any], float]] = {
        s: (_probe(s, cfg, options.get(s, {})), cfg.get(s, "deadline_seconds")) for s in wanted}
    jobs = {s: (sp, {"section": s, "values": cfg.values, "source": cfg.source, "kwargs": options.get(s, {})})
            for s, sp in (spares or {}).items()}
    t0 = time.time()
    return Pending(cfg, start_probes(probes, jobs), t0)


def starter(gpu_spare: Optional[Spare]) -> Callable[[Config], Pending]:
    """A hook's ``run_hook(start=...)``: every probe, the GPU's in ``gpu_spare`` when there is one."""
    spares = {"gpu": gpu_spare} if gpu_spare is not None else None
    return lambda cfg: start(cfg, spares=spares)


def take(cfg: Config, sections: Optional[Sequence[str]] = None,
         options: Optional[Dict[str, Dict[str, Any]]] = None,
         meanwhile: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """Collect ``sections`` in parallel children and wait for them (see ``start``)."""
    return start(cfg, sections, options).result(meanwhile)


def preload_sinks() -> None:
    """Import what a push needs (requests, prometheus_client: 150+ ms) while probes run."""
    import prometheus_client  # noqa: F401
    import requests  # noqa: F401
