"""Benchmarks and evidence scripts of ComfyUI-ToMA, run from the repository root as
``python -m bench.<group>.<script>`` (see bench/README.md). They use the pack and the harness
shared with the tests (``harness/`` at the repository root); nothing outside bench imports bench."""
