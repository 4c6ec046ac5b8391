"""Every panel of the Grafana dashboards against the lab's real Prometheus after a demo-like
run (Xid 79 node, leftover rank, an `srun --triage` training step whose node4 hangs and whose
node1 link goes down once): each query, variables substituted, parses and returns data.
Skipped (with the reason) when `make lab-up` has not run."""
from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import ExitStack
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import lab as labmod
from test_alerts_lab import CLI, FAST_WATCHER, RULES, delete_check_group, healthy_run, prom_get, reload, wait_for
from test_dashboards import DASHBOARDS, load, targets

SET_RDMA = str(labmod.ROOT / "lab" / "set-rdma")
TRAIN = labmod.ROOT / "lab" / "workload" / "train.py"


def set_rdma(lab: labmod.Lab, *args: str) -> None:
    subprocess.run([SET_RDMA, *args], check=True, capture_output=True, text=True,
                   env={"PATH": "/usr/bin:/bin", "LAB_DIR": str(lab.dir)})


def delete_group(lab: labmod.Lab, path: str) -> None:
    req = urllib.request.Request(f"{lab.pushgateway_url}/metrics/job/{path}", method="DELETE")
    urllib.request.urlopen(req, timeout=10).close()


def label_values(lab: labmod.Lab, definition: str, start: float) -> List[str]:
    """Grafana's `label_values(selector, label)` through /api/v1/series."""
    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", definition.strip())
    assert m, definition
    series = prom_get(lab, "/api/v1/series", **{"match[]": m.group(1), "start": str(start), "end": str(time.time())})
    return sorted({s[m.group(2)] for s in series if m.group(2) in s})


def run_query(lab: labmod.Lab, expr: str, instant: bool, start: float) -> Tuple[str, int]:
    """('', number of series with samples) or (the error Prometheus gave, 0)."""
    now = time.time()
    params = {"query": expr, "time": str(now)} if instant else \
        {"query": expr, "start": str(start), "end": str(now), "step": "5"}
    url = lab.prometheus_url + ("/api/v1/query?" if instant else "/api/v1/query_range?") + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=15) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e).get("error", str(e)), 0
    return "", sum(1 for s in body["data"]["result"] if s.get("value") or s.get("values"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    """The lab after a demo-like run whose faults stay in place while the panels are queried."""
    lab = labmod.require()
    lab.reset()
    rules_dir = lab.dir / "prom" / "rules"
    rules_dir.mkdir(exist_ok=True)
    (rules_dir / RULES.name).write_text(RULES.read_text())  # the records the fleet panels read
    reload(lab)
    start = time.time()
    with ExitStack() as stack:
        stack.callback(lambda: (lab.reset(), healthy_run(lab)))
        stack.callback(set_rdma, lab, "node1", "--reset")
        stack.callback(delete_check_group, lab, "node2")
        set_rdma(lab, "node1", "--reset")
        # node2's GPU 3 falls off the bus: the Prolog drains it; the admin confirms with check --push
        lab.set_scenario("node2", "h100x8-xid79.json")
        assert lab.srun("-N4", "true", timeout=60).returncode != 0
        # after node2's Epilog: its group (kernel events since the Prolog only) must not be fresher
        # than the admin's check, whose kernel.xid finding the fleet's kernel panel shows
        lab.wait_node("node2", lambda s: "COMPLETING" not in s, timeout=60)
        lab.run(CLI, "check", "--push", user=None,
                extra_env={"SLURM_TRIAGE_CONFIG": str(lab.triage_config), "SLURMD_NODENAME": "node2"})
        # a rank of a job on node3 escapes; the next job there finds it
        stack.enter_context(lab.escaped_process("node3", shm="/dev/shm/nccl-lab-dashboards"))
        lab.wait_idle(["node3"])
        assert lab.srun("-N1", "-w", "node3", "true", timeout=60).returncode == 0
        # srun --triage on node1 (training) and node4 (hung collective); node1's link flaps meanwhile
        stack.enter_context(lab.config(FAST_WATCHER))
        lab.set_scenario("node1", "h100x8-busy.json")
        lab.set_scenario("node4", "h100x8-nccl-hang.json")
        # the step's output goes to files: ~600 log lines in 12 s (more on a faster CPU) overflow
        # an unread 64 KiB pipe, and a blocked srun never ends (CI, 2026-12-02)
        out_dir = tmp_path_factory.mktemp("step")
        out, err = stack.enter_context(open(out_dir / "out", "w+")), stack.enter_context(open(out_dir / "err", "w+"))
        step = subprocess.Popen(
            ["runuser", "-u", labmod.TEST_USER, "--", "env", "-i", "PATH=/usr/bin:/bin", f"SLURM_CONF={lab.slurm_conf}",
             "srun", "--triage", "-N2", "-w", "node1,node4", "sh", "-c",
             'test "$SLURM_NODEID" = 0 && echo "$SLURM_JOB_ID"; '
             f'timeout -s INT 12 python3 {TRAIN} --steps 100000 --log-every 2 --pushgateway {lab.pushgateway_url}; true'],
            cwd=str(lab.workdir), stdout=out, stderr=err, text=True)
        job = wait_for(lambda: next((ln.strip() for ln in (out_dir / "out").read_text().splitlines()
                                     if ln.strip().isdigit()), "") or step.poll() is not None and "-", 60)
        assert job.isdigit(), (out_dir / "err").read_text()
        for node, rank in (("node1", 0), ("node4", 1)):  # the workload's own step-time groups
            stack.callback(delete_group, lab, f"training/slurm_job_id/{job}/instance/{node}/rank/{rank}")
        set_rdma(lab, "node1", "link_downed+=1")
        assert wait_for(lambda: prom_get(lab, "/api/v1/query", query=f'slurm_triage_hang_suspected{{slurm_job_id="{job}"}} == 1')["result"], 40), \
            "the watcher's hang flag never reached Prometheus"
        assert step.wait(60) == 0, (out_dir / "err").read_text()
        lab.wait_idle(["node1", "node4"])
        assert wait_for(lambda: prom_get(lab, "/api/v1/query", query=f'slurm_triage_job_gpu_energy_joules{{slurm_job_id="{job}"}}')["result"], 30)
        time.sleep(12)  # the records (fresh findings) catch up with the last scrape
        yield {"lab": lab, "job": job, "start": start}


def test_the_job_variable_lists_the_hang_job_and_its_nodes(demo):
    lab, job, start = demo["lab"], demo["job"], demo["start"]
    variables = {v["name"]: v for v in load(labmod.ROOT / "etc" / "grafana" / "slurm-triage-job.json")["templating"]["list"]}
    assert job in label_values(lab, variables["job_id"]["definition"], start)
    assert label_values(lab, variables["node"]["definition"].replace("$job_id", job), start) == ["node1", "node4"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_query_parses_and_returns_data(demo, path):
    lab, job, start = demo["lab"], demo["job"], demo["start"]
    subst = {"$job_id": job, "$__range": f"{int(time.time() - start) + 60}s",
             "$node": "node1|node4" if path.name.endswith("-job.json") else ".*"}
    subst.update({f"${v['name']}": v["query"] for v in load(path)["templating"]["list"] if v["type"] == "textbox"})
    problems = []
    n = 0
    for panel, t in targets(load(path)):
        expr = t["expr"]
        for var, value in subst.items():
            expr = expr.replace(var, value)
        assert "$" not in expr.replace("$1", ""), f"unsubstituted variable in {expr}"
        error, series = run_query(lab, expr, bool(t.get("instant")), start)
        n += 1
        if error or not series:
            problems.append(f"{panel['title']!r} {t['refId']}: {error or 'no data'}: {expr}")
    assert n >= 10 and not problems, "\n".join(problems)
