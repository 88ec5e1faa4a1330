"""Benchmarks and evidence scripts of ComfyUI-ToMA, run from the repository root as
``python -m bench.<group>.<script>`` (see bench/README.md). ``bench.harness`` is shared with the
tests; nothing in bench imports tests/."""
