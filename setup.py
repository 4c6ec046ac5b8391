"""slurm-triage: Slurm SPANK plugin, Prolog/Epilog hooks and triage for GPU training jobs."""
from setuptools import find_packages, setup

setup(
    name="slurm-triage",
    version="0.1.0",
    description="Make gang-scheduled GPU jobs on Slurm fail fast and explain themselves",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["slurm_triage", "slurm_triage.*"]),
    package_data={"slurm_triage.triage.catalog": ["*.toml"], "slurm_triage.triage": ["lexicon.toml", "healthy.toml", "prior.json"]},
    install_requires=[
        "nvidia-ml-py>=12.535.133",
        "psutil>=5.9",
        "requests>=2.25",
        "prometheus_client>=0.16",
        "tomli>=1.1; python_version < '3.11'",
    ],
    extras_require={
        "test": ["pytest>=7"],
        "slurm": ["pyslurm"],
        # The MCP SDK 2.x (MCPServer; 2.0 renamed FastMCP) needs Python >= 3.10; the core does not.
        "mcp": ["mcp>=2.3,<3; python_version >= '3.10'"],
        "html": ["matplotlib>=3.5"],
    },
    entry_points={
        "console_scripts": [
            "slurm-triage=slurm_triage.cli:main",
            "triage=slurm_triage.cli:triage_main",
        ],
    },
)
