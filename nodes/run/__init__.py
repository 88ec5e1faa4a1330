"""Per-run and per-call state of a ToMA patch and what is decided from it: the two wrappers ComfyUI
calls (wrappers.py: OUTER_SAMPLE per sampling run, APPLY_MODEL per model call, where each call's
merge decision is made), the state they create and the block hooks read (runtime.py; the run and
calls open now, where a hook finds its call: current.py), the run's counters (stats.py), what a merged
call gains (predicted by the cost model's view of the patched model, prediction.py; measured by the
run's call timer, gain.py; and min_tokens "auto", which asks both, gain.py, judging the measurements
in judge.py), the run line (report.py) and the fixed description of a patch (config.py). Imports
only the shared ../contract.py and ../settings.py and ../../toma_core: never a family or the machinery.
"""
