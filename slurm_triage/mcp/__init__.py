"""The read-only Model Context Protocol server (`slurm-triage mcp`): triage for AI agents.

``tools`` holds the tools as plain functions (no SDK needed), ``guard`` what may run and be
accepted, ``server`` the SDK wiring and transports, ``cli`` the subcommand.
"""
