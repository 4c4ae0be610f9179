"""Tools for agentic (multi-turn) rollouts: the tool registry and custom tool files (`tools`), tool-call
parsers (`parsers`), the concurrent executor (`executor`) and the python sandbox (`sandbox`, `launch`).

Import the submodules you need; this package's `__init__` imports nothing, so a sandbox process that imports
`rlhf_mcore.agent.sandbox` starts in tens of milliseconds.
"""
