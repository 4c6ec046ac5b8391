"""SLURM_PREFIX: the lab and the SPANK plugin on a Slurm built from source (docs/slurm-24.11.md).

Slurm loads only a plugin whose plugin_version is its own release, so the plugin must take
every header from the prefix; and the default (Debian's packages) must stay as it was.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_HEADERS = Path("/usr/include/slurm")
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def common_sh(**env: str) -> List[str]:
    """$LAB_PATH and $TEST_USER as lab/common.sh sets them."""
    out = subprocess.run(["bash", "-c", 'source lab/common.sh && printf "%s\n%s" "$LAB_PATH" "$TEST_USER"'],
                         cwd=ROOT, env={"PATH": DEBIAN_PATH, "LAB_DIR": "/nonexistent", **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.split("\n")


def test_lab_is_debians_by_default_and_a_second_lab_has_its_prefix_and_user() -> None:
    assert common_sh() == [DEBIAN_PATH, "triage-test"]
    assert common_sh(SLURM_PREFIX="/opt/slurm-x", LAB_USER="triage-x") == \
        ["/opt/slurm-x/sbin:/opt/slurm-x/bin:" + DEBIAN_PATH, "triage-x"]


def _plugin_version(so: Path) -> int:
    # RTLD_LAZY: the spank_* functions come from the Slurm process that loads it
    return ctypes.c_uint32.in_dll(ctypes.CDLL(str(so), mode=os.RTLD_LAZY), "plugin_version").value


def test_plugin_built_for_a_prefix_takes_that_releases_headers(tmp_path: Path) -> None:
    """A prefix whose headers say 24.11.7 while /usr/include/slurm says another release: the
    plugin must carry 24.11.7 (it carried the system's before `-I$(SLURM_PREFIX)/include`)."""
    if not (SYSTEM_HEADERS / "spank.h").exists() or shutil.which("gcc") is None:
        pytest.skip("slurm/spank.h (libslurm-dev) or gcc missing")
    inc = tmp_path / "include" / "slurm"
    shutil.copytree(SYSTEM_HEADERS, inc)
    version = inc / "slurm_version.h"
    text = version.read_text()
    if "0x180b07" in text:
        pytest.skip("the system's headers are 24.11.7 already")
    version.write_text(re.sub(r"(?m)^#define SLURM_VERSION_NUMBER .*$", "#define SLURM_VERSION_NUMBER 0x180b07", text))
    so = tmp_path / "plugin.so"
    r = subprocess.run(["make", "-B", "-C", str(ROOT / "spank"), f"SLURM_PREFIX={tmp_path}", f"PLUGIN={so}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _plugin_version(so) == 0x180B07
    default = subprocess.run(["make", "-n", "-B", "-C", str(ROOT / "spank")], capture_output=True, text=True,
                             env={k: v for k, v in os.environ.items() if k != "SLURM_PREFIX"}, check=True).stdout
    assert re.findall(r"-I\S+", default) == [f"-I{SYSTEM_HEADERS}"]
