"""`make demo`: what slurm-triage shows an operator, on the local 4-node lab.

1. a healthy 4-node job: every node's Prolog and Epilog verdict, the job summary;
2. faults: node2's GPU 3 falls off the bus (Xid 79); a rank of an earlier job on node3
   escaped its job and still holds an NCCL listener, a /dev/shm segment and GPU memory;
3. a batch job lands on node2: drained with our reason, the job requeued and held;
   released, it runs on healthy nodes; node3's Prolog names the leftovers;
4. `srun --triage` on node3 is refused before launch, naming node3 and why;
5. the in-step watcher catches a hang when node4's GPUs switch to busy-at-idle-power;
6. the summaries read back from the Pushgateway and queried from Prometheus; `triage JOB`;
7. the training stand-in (lab/workload/train.py): a rank lagging behind a GPU that throttles by
   heat, found through step time; a job restored from a checkpoint with leaked communicator
   threads, against its fresh run; RDMA retransmits on one node's port.

Exit 0 when everything behaved as expected, 1 otherwise (each expectation is printed).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from labctl import DEFAULT_SCENARIO, ROOT, TEST_USER, Lab, find  # noqa: E402

CLI = str(ROOT / ".venv" / "bin" / "slurm-triage")
GREEN, RED, BOLD, DIM, OFF = ("\033[32m", "\033[31m", "\033[1m", "\033[2m", "\033[0m") \
    if sys.stdout.isatty() else ("",) * 5
LEAKED_THREADS = 6  # per rank of the restored job: enough to slow it whatever else the machine runs
DEMO_CONFIG = """
# --- added by lab/demo.py for the demo (removed when it ends) ---
[watcher]
interval_seconds = 1.0
hang_window_seconds = 3.0
straggler_window_seconds = 3.0
"""


class Demo:
    def __init__(self, lab: Lab):
        self.lab = lab
        self.failures: List[str] = []
        self.t0 = time.monotonic()
        self.steps: List[Tuple[Any, ...]] = []  # (title, start[, seconds])
        self.work = lab.dir / "demo"
        self.work.mkdir(exist_ok=True)
        os.chmod(self.work, 0o1777)
        self.stack = ExitStack()

    # -- output ----------------------------------------------------------------------
    def step(self, title: str) -> None:
        now = time.monotonic()
        self.end_step(now)
        self.steps.append((title, now))
        print(f"\n{BOLD}==> {title}{OFF}  {DIM}[{now - self.t0:5.1f} s]{OFF}")

    def end_step(self, now: float) -> None:
        """Close the running step: print how long it took (the stories must fit the demo's budget)."""
        if self.steps and len(self.steps[-1]) == 2:
            title, start = self.steps[-1]
            self.steps[-1] = (title, start, now - start)
            print(f"    {DIM}({now - start:.1f} s){OFF}")

    def timing(self) -> str:
        return "\n".join(f"{t[2]:5.1f} s  {t[0][:80]}" for t in self.steps if len(t) == 3)

    def show(self, text: str) -> None:
        for line in text.rstrip().splitlines():
            print(f"    {line}")

    def expect(self, ok: bool, what: str) -> bool:
        print(f"    {GREEN + '✔' if ok else RED + '✘'} {what}{OFF}")
        if not ok:
            self.failures.append(what)
        return ok

    # -- lab -----------------------------------------------------------------------------
    def sh(self, *argv: str, user: Optional[str] = TEST_USER, timeout: float = 90) -> subprocess.CompletedProcess:
        return self.lab.run(*argv, user=user, timeout=timeout)

    def state(self, node: str, job: int, kind: str) -> Optional[Dict[str, Any]]:
        try:
            return json.loads((self.lab.node_dir(node) / "state" / "jobs" / str(job) / f"{kind}.json")
                              .read_text())["data"]
        except (OSError, ValueError, KeyError):
            return None

    def wait(self, what: Callable[[], Any], seconds: float) -> Any:
        deadline = time.monotonic() + seconds
        while True:
            got = what()
            if got or time.monotonic() > deadline:
                return got
            time.sleep(0.3)

    def groups(self) -> List[Dict[str, Any]]:
        with urllib.request.urlopen(self.lab.pushgateway_url + "/api/v1/metrics", timeout=5) as r:
            return json.load(r)["data"]

    def prom(self, query: str) -> List[Dict[str, Any]]:
        url = self.lab.prometheus_url + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)["data"]["result"]

    def findings_table(self, findings: List[Dict[str, Any]]) -> str:
        rows = [f"{f['verdict']:<5} {f['id']:<20} {f['summary'][:110]}" for f in findings if f["verdict"] != "OK"]
        return "\n".join(rows) or "(no findings)"

    # -- the story -----------------------------------------------------------------------
    def healthy_job(self) -> None:
        self.step("A healthy 4-node job: Prolog and Epilog on every node")
        r = self.sh("srun", "-N4", "sh", "-c", 'test "$SLURM_NODEID" = 0 && echo $SLURM_JOB_ID; true')
        self.expect(r.returncode == 0, "srun -N4 ran")
        job = int(r.stdout.split()[-1])
        self.lab.wait_idle()
        for node in self.lab.nodes:
            pro, epi = self.state(node, job, "prolog"), self.wait(lambda: self.state(node, job, "epilog"), 20)
            diffs = list((epi or {}).get("gpu_diff", {}).values())
            energy = sum((d.get("energy_joules") or 0) for d in diffs)
            reset = any("energy_joules" in d.get("counter_reset", []) for d in diffs)
            self.show(f"{node}: Prolog {pro and pro['verdict']}, Epilog {epi and epi['verdict']}, "
                      f"{len((pro or {}).get('job_gpus', []))} GPUs, job energy "
                      + ("counter reset" if reset else f"{energy:.0f} J"))
        self.expect(all((self.state(n, job, "prolog") or {}).get("verdict") == "OK" for n in self.lab.nodes),
                    "every node's Prolog says OK")

    def leave_a_rank_behind(self) -> Dict[str, Any]:
        self.step("Job on node3 whose rank escapes and keeps an NCCL listener, /dev/shm and GPU 0")
        rank = self.stack.enter_context(self.lab.escaped_process("node3", shm="/dev/shm/nccl-demo-rank"))
        # What NVML shows on a real node: the dead job's rank still holds GPU 0's memory.
        scen = json.loads((ROOT / "tests/fakenvml/scenarios" / DEFAULT_SCENARIO).read_text())
        scen["gpus"][0]["procs"] = [[rank["pid"], 61 << 30]]
        scen["_source"] = "lab/demo.py: h100x8-idle with the escaped rank of job %d on GPU 0" % rank["job"]
        path = self.work / "node3-orphan.json"
        path.write_text(json.dumps(scen))
        self.lab.set_scenario("node3", str(path))
        self.show(f"job {rank['job']} ended; its rank pid {rank['pid']} still listens on 127.0.0.1:{rank['port']}, "
                  f"holds {rank['shm']}")
        # From here on the Epilogs clean up after their own job (hooks.cleanup): what a site
        # turns on once it trusts the tool. The escaped rank stays: it is not theirs to kill.
        self.lab.wait_idle(["node3"])  # its job's Epilog is done
        with open(self.lab.triage_config, "a") as fh:
            fh.write("\n[hooks]\ncleanup = true\ncleanup_grace_seconds = 1.0\n")
        return rank

    def fault_and_requeue(self, rank: Dict[str, Any]) -> int:
        self.step("node2's GPU 3 falls off the bus (Xid 79); a 3-node batch job lands on node[1-3]")
        self.lab.set_scenario("node2", "h100x8-xid79.json")
        self.lab.wait_idle()
        job = self.lab.sbatch("-N3", "-o", "/dev/null", "--wrap", "srun hostname")

        def held() -> Optional[Dict[str, str]]:  # requeued only once its Epilogs are done
            i = self.lab.job_info(job)
            return i if i.get("JobState") == "PENDING" and i.get("Reason") == "launch_failed_requeued_held" else None

        info = self.wait(held, 40) or self.lab.job_info(job)
        self.show(self.sh("sinfo", "-R", "-o", "%8N %9T %E", user=None).stdout)
        self.show(self.sh("squeue", "-j", str(job), "-o", "%.6i %.9T %.30r", user=None).stdout)
        reason = self.lab.node_info("node2").get("Reason", "")
        self.expect(reason.startswith("triage: GPU-") and "Xid 79" in reason, "node2 drained with a triage: reason naming the GPU and Xid 79")
        self.expect(info.get("Reason") == "launch_failed_requeued_held", "the batch job was requeued and held")
        pro3 = self.wait(lambda: self.state("node3", job, "prolog"), 20) or {}
        self.show("node3's Prolog for this job:\n" + self.findings_table(pro3.get("findings", [])))
        text = json.dumps(pro3.get("findings", []))
        self.expect(str(rank["pid"]) in text and str(rank["job"]) in text and rank["shm"] in text,
                    f"node3's Prolog names the leftover rank {rank['pid']} of job {rank['job']} and its shm")
        self.step("The operator releases the job: it runs on the healthy nodes")
        self.sh("scontrol", "release", str(job), user=None)
        # Slurm holds a requeued job back for a while (Reason=BeginTime); the operator need not wait.
        self.sh("scontrol", "update", f"jobid={job}", "starttime=now", user=None)
        done = self.lab.wait_job(job, timeout=60)
        self.show(f"job {job}: {done['JobState']} on {done.get('NodeList')}, Restarts={done.get('Restarts')}")
        self.lab.wait_idle(["node1", "node3", "node4"])
        for node in ("node1", "node3", "node4"):
            killed = ((self.state(node, job, "epilog") or {}).get("cleanup") or {}).get("killed")
            if killed:
                self.show(f"{node}: the Epilog killed what the failed first launch left behind: pids {killed}")
        self.expect(done["JobState"] == "COMPLETED" and "node2" not in self.expand(done.get("NodeList", "")),
                    "the requeued job completed without node2")
        return job

    def expand(self, hostlist: str) -> List[str]:
        from slurm_triage.step.gate import expand_hostlist

        return expand_hostlist(hostlist)

    def gate_refuses(self, rank: Dict[str, Any]) -> None:
        self.step("srun --triage on node[1,3-4]: the gang gate refuses the bad allocation")
        r = self.sh("srun", "--triage", "-N3", "-w", "node1,node3,node4", "hostname", timeout=90)
        self.show(r.stderr)
        self.expect(r.returncode != 0 and "node3" in r.stderr and not r.stdout.strip(),
                    "nothing launched, node3 named")
        self.stack.close()  # the operator kills the leftover rank and removes its segment
        self.lab.set_scenario("node3", DEFAULT_SCENARIO)
        r = self.sh("srun", "--triage", "-N3", "-w", "node1,node3,node4", "hostname", timeout=90)
        self.expect(r.returncode == 0 and len(r.stdout.split()) == 3, "after clean-up the same srun --triage launches")

    def watcher_catches_a_hang(self) -> int:
        self.step("srun --triage: node4's GPUs switch to 100 % util at idle power mid-step (NCCL hang)")
        self.lab.wait_idle(["node1", "node3", "node4"])  # the last job's Epilogs read the old scenario
        self.lab.set_scenario("node4", "h100x8-busy.json")
        release = self.work / "hang-release"
        proc = self.job_until(release, "--triage", "-N3", "-w", "node1,node3,node4")
        time.sleep(3)
        self.lab.set_scenario("node4", "h100x8-nccl-hang.json")

        def hang() -> Optional[Dict[str, Any]]:
            for g in self.groups():
                if g["labels"].get("phase") == "watch" and g["labels"].get("instance") == "node4":
                    for m in (g.get("slurm_triage_hang_suspected") or {}).get("metrics", []):
                        if float(m["value"]) == 1.0:
                            return g
            return None

        g = self.wait(hang, 25)
        self.expect(g is not None, "the watcher on node4 pushed slurm_triage_hang_suspected 1")
        if g:  # the job ends once Prometheus holds the flag: triage reads the job's time window there
            jid = str(g["labels"].get("slurm_job_id"))
            sel = f'instance="node4",slurm_job_id="{jid}"'
            self.wait(lambda: self.lab.prom(f"max_over_time(slurm_triage_hang_suspected{{{sel}}}[5m]) == 1"), 20)
            # and two samples of every node's GPU series, for each node's timeline in the report
            self.wait(lambda: self.lab.scraped("slurm_triage_watch_gpu_power_watts", jid,
                                               ["node1", "node3", "node4"], 2), 20)
        release.touch()
        out, _ = proc.communicate(timeout=60)
        job = int(out.split()[0]) if out.split() else 0
        bundles = sorted((Path("/tmp") / f"slurm-triage-{self.uid()}" / str(job)).glob("hang-node4-*.json"))
        self.show(f"evidence bundle: {bundles[-1] if bundles else 'none'}")
        self.expect(bool(bundles), "an evidence bundle was written for the job, as the user")
        self.lab.wait_idle(["node1", "node3", "node4"])
        def watchers() -> str:
            return subprocess.run(["pgrep", "-u", TEST_USER, "triage-watcher"], capture_output=True,
                                  text=True).stdout.strip()

        self.expect(self.wait(lambda: not watchers(), 5), "no watcher process outlived the step")
        self.lab.set_scenario("node4", DEFAULT_SCENARIO)
        return job

    def job_until(self, release: Path, *srun_args: str, seconds: int = 30) -> subprocess.Popen:
        """`srun ARGS` of a job that prints its id (node 0) and runs until the demo creates
        `release` (at most `seconds`): as long as what the story must see takes, no longer."""
        if release.exists():
            release.unlink()
        wait = f"i=0; while [ ! -e {release} ] && [ $i -lt {seconds * 10} ]; do sleep 0.1; i=$((i+1)); done"
        return subprocess.Popen(["runuser", "-u", TEST_USER, "--", "env", "-i", "PATH=/usr/bin:/bin",
                                 f"SLURM_CONF={self.lab.slurm_conf}", "srun", *srun_args, "sh", "-c",
                                 f'test "$SLURM_NODEID" = 0 && echo "$SLURM_JOB_ID"; {wait}'],
                                cwd=str(self.lab.workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def uid(self) -> int:
        import pwd

        return pwd.getpwnam(TEST_USER).pw_uid

    def summaries(self, jobs: List[int]) -> None:
        self.step("What the Pushgateway and Prometheus hold")
        rows = []
        for g in self.groups():
            lab = g["labels"]
            if lab.get("job") != "slurm_triage":
                continue
            verdict = next((m["labels"] for m in (g.get("slurm_triage_node_verdict") or {}).get("metrics", [])
                            if float(m["value"]) == 1.0), {})
            rows.append(f"{lab.get('instance') or '-':<6} {lab.get('phase') or 'check':<9} "
                        f"job {lab.get('slurm_job_id') or verdict.get('slurm_job_id', '-'):<5}"
                        f" verdict {verdict.get('verdict', '-')}")
        newest = {r.split(" job ")[0]: r for r in sorted(rows, key=lambda r: int(r.split(" job ")[1].split()[0])
                                                          if r.split(" job ")[1].split()[0].isdigit() else 0)}
        self.show("\n".join(sorted(newest.values())))  # the newest group of each node and phase
        query = 'sum by (instance, slurm_job_id) (slurm_triage_job_gpu_energy_joules)'
        res = self.wait(lambda: self.prom(query), 20)
        self.show(f"Prometheus: {query}")
        self.show("\n".join(f"{r['metric'].get('instance')} job {r['metric'].get('slurm_job_id')}: "
                            f"{float(r['value'][1]):.0f} J" for r in res[:8]))
        self.expect(bool(res), "Prometheus has the job summaries (scraped from the Pushgateway)")
        self.step(f"triage {jobs[-1]}")
        r = subprocess.run([CLI, "triage", str(jobs[-1])], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "SLURM_TRIAGE_CONFIG": str(self.lab.triage_config),
                                "SLURM_CONF": self.lab.slurm_conf})
        self.show(r.stdout[:3000])
        root = r.stdout.split("ROOT CAUSE", 1)[-1].splitlines()[0:2] if "ROOT CAUSE" in r.stdout else []
        self.expect(r.returncode == 1 and "collective_hang" in " ".join(root) and "node4" in " ".join(root),
                    "triage names the collective hang on node4 as the root cause")
        page = self.lab.dir / "reports" / f"triage-{jobs[-1]}.html"
        page.parent.mkdir(exist_ok=True)
        h = subprocess.run([CLI, "triage", str(jobs[-1]), "--format", "html", "--output", str(page)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "SLURM_TRIAGE_CONFIG": str(self.lab.triage_config),
                                "SLURM_CONF": self.lab.slurm_conf})
        html = page.read_text() if page.exists() else ""
        self.show(f"the report for a browser: {page} ({len(html) // 1024} KiB)")
        self.expect(h.returncode == 1 and html.count("<svg") >= 3 and "node4" in html,
                    "triage --format html wrote a self-contained page with node4's timeline plots")

    def triage_json(self, job: str, *extra: str) -> Dict[str, Any]:
        r = subprocess.run([CLI, "triage", job, *extra, "--format", "json"], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "SLURM_TRIAGE_CONFIG": str(self.lab.triage_config),
                                             "SLURM_CONF": self.lab.slurm_conf})
        return json.loads(r.stdout) if r.stdout.strip() else {"findings": [], "error": r.stderr}

    def show_root(self, report: Dict[str, Any], n: int = 2) -> None:
        for f in report["findings"][:n]:
            cause = f" (caused by {f['caused_by']})" if f.get("caused_by") else ""
            self.show(f"[{f['category']}] {f['summary']}{cause}")

    def thermal_straggler(self) -> None:
        self.step("A training job whose rank on node2 lags: step time finds the node, the GPU says why")
        for n in ("node1", "node2"):
            self.lab.set_scenario(n, "h100x8-busy.json")
        job = self.lab.train("slow-rank", 3, during=lambda: self.lab.set_scenario("node2", "h100x8-thermal.json"),
                             extra=["--slow-node", "node2", "--slow-factor", "6"])
        report = self.triage_json(job)
        self.show_root(report)
        root = (report["findings"] or [{}])[0]
        strag = [f for f in report["findings"] if f["id"] == "metric.straggler.node2"]
        self.expect(root.get("category") == "thermal_power" and root.get("node") == "node2" and
                    str(root.get("gpu", "")).startswith("GPU-5291"), "root cause: GPU 5 of node2 throttling by heat")
        self.expect(bool(strag) and strag[0]["caused_by"] == root.get("id"),
                    "the step-time straggler on node2 follows from it")
        for n in ("node1", "node2"):
            self.lab.set_scenario(n, DEFAULT_SCENARIO)
        self.lab.wait_node("node2", lambda st: "COMPLETING" not in st)
        if "DRAIN" in self.lab.node_state("node2"):  # its Epilog drained it for the heat: back for the next story
            self.lab.resume("node2")

    def thread_leak(self) -> None:
        self.step("The same job fresh and restored from a checkpoint: the restored one is slower")
        # In sequence: the lab's nodes share one kernel, and the run queue is the node's (/proc/stat).
        fresh = self.lab.train("fresh", 3)
        restored = self.lab.train("restored", 3, extra=["--restore-threads", str(LEAKED_THREADS)])
        self.show(f"triage {restored} --baseline {fresh}")
        report = self.triage_json(restored, "--baseline", fresh)
        self.show_root(report, 1)
        root = (report["findings"] or [{}])[0]
        self.expect(root.get("id") == "metric.baseline.threads"
                    and f"pt_nccl_watchdg x{LEAKED_THREADS} in pid" in root.get("summary", ""),
                    f"triage names the {LEAKED_THREADS} leaked communicator threads of a rank against the fresh run")

    def start_rdma_job(self) -> Dict[str, Any]:
        """The RDMA story's job on node3 and node4, started before the thermal story (it needs no CPU,
        they share no node): a thread advances node4's counters once both Prologs took their baseline."""
        release = self.work / "rdma-release"
        story: Dict[str, Any] = {"t0": time.monotonic(), "proc": self.job_until(release, "-N2", "-w", "node3,node4")}

        def drive() -> None:
            try:
                story["job"] = story["proc"].stdout.readline().strip()
                if self.wait(lambda: all(self.state(n, int(story["job"]), "prolog") for n in ("node3", "node4")), 30):
                    self.lab.set_rdma("node4", "local_ack_timeout_err+=300", "out_of_sequence+=1200", "symbol_error+=25")
                    time.sleep(2)  # the Epilog gives rates per second of the job: let it last
            except Exception as e:  # noqa: BLE001 - reported by rdma_retransmits
                story["error"] = f"{type(e).__name__}: {e}"
            finally:
                release.touch()

        story["thread"] = threading.Thread(target=drive, daemon=True)
        story["thread"].start()
        return story

    def rdma_retransmits(self, story: Dict[str, Any]) -> None:
        self.step("RDMA retransmits climbed on node4's port during a job (it ran alongside the last story)")
        story["thread"].join(60)
        out, err = story["proc"].communicate(timeout=60)
        self.lab.wait_idle(["node3", "node4"])
        self.show(f"job {story.get('job')} on node[3-4]: {time.monotonic() - story['t0']:.1f} s from its srun")
        report = self.triage_json(story.get("job") or "0")
        net = [f for f in report["findings"] if f["category"] == "network"]
        self.show_root({"findings": net}, 1)
        self.expect(not story.get("error") and story["proc"].returncode == 0 and bool(net)
                    and net[0]["node"] == "node4" and "mlx5_0 port 1" in net[0]["summary"] and "/s)" in net[0]["summary"],
                    "triage names node4's mlx5_0 port 1 and the counters' rates"
                    + (f" ({story['error'] or err.strip()[-200:]})" if story.get("error") or story["proc"].returncode else ""))
        self.lab.set_rdma("node4", reset=True)

    def restore(self) -> None:
        self.step("The operator resumes node2 once its GPU is back (only our drain reasons are ours to clear)")
        self.lab.set_scenario("node2", DEFAULT_SCENARIO)
        # `node resume` runs here, not on node2: it decides on node2's own fresh pushed check
        env = {"SLURM_TRIAGE_CONFIG": str(self.lab.triage_config)}
        r = self.lab.run(CLI, "check", "--push", user=None, extra_env={**env, "SLURMD_NODENAME": "node2"})
        self.show(r.stdout)
        self.expect("push: delivered" in r.stdout, "a fresh check of node2 (node2's own GPUs), pushed as node2")
        r = self.lab.run(CLI, "node", "resume", "node2", user=None, extra_env=env)
        self.show(r.stdout + r.stderr)
        self.expect(r.returncode == 0 and "pushed from node2" in r.stdout,
                    "slurm-triage node resume node2, on node2's evidence")


def main() -> int:
    lab = find()
    if lab is None:
        print("the lab is not up: run `make lab-up` (as root)", file=sys.stderr)
        return 2
    demo = Demo(lab)
    lab.reset()
    saved = lab.triage_config.read_text()
    lab.triage_config.write_text(saved + DEMO_CONFIG)
    os.environ["SLURM_TRIAGE_CONFIG"] = str(lab.triage_config)
    jobs: List[int] = []
    try:
        demo.healthy_job()
        rank = demo.leave_a_rank_behind()
        jobs.append(demo.fault_and_requeue(rank))
        demo.gate_refuses(rank)
        jobs.append(demo.watcher_catches_a_hang())
        demo.summaries(jobs)
        demo.restore()
        rdma = demo.start_rdma_job()
        demo.thermal_straggler()
        demo.rdma_retransmits(rdma)
        demo.thread_leak()
    except Exception as e:  # noqa: BLE001 - the demo reports, then restores the lab
        demo.expect(False, f"demo step failed: {type(e).__name__}: {e}")
    finally:
        lab.triage_config.write_text(saved)
        demo.stack.close()
        for p in demo.work.glob("*"):
            p.unlink()
        lab.reset()
    took = time.monotonic() - demo.t0
    demo.end_step(time.monotonic())
    print(f"\n{BOLD}timing{OFF}")
    demo.show(demo.timing())
    if demo.failures:
        print(f"\n{RED}{BOLD}demo: {len(demo.failures)} expectation(s) failed in {took:.0f} s:{OFF}")
        for f in demo.failures:
            print(f"  - {f}")
        return 1
    print(f"\n{GREEN}{BOLD}demo: everything behaved as expected ({took:.0f} s){OFF}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
