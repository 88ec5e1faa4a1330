"""What ToMA did in the Compare node's ToMA run, read from its run line's record (run/report.py
RunRecord): how many steps it merged of those its settings ask for, the run line's main reason for
the unmerged calls, and the change that would make it merge, on the ToMA node the user has (found
by following the queued prompt's links from Compare's toma_model input: `toma_node`).

The basic ToMA Patch runs min_tokens "auto" and has no min_tokens input (toma_nodes.py ToMAPatch), so
a call that "auto" keeps unmerged is fixed there by switching to ToMA Patch (Advanced).
"""

from __future__ import annotations

import re
from typing import Any

from ..run.report import STATUS_TEXT, RunRecord
from ..settings import ToMASettings
from .compare_report import Merged

NODE_NAMES = {"ToMAPatch": "ToMA Patch", "ToMAPatchAdvanced": "ToMA Patch (Advanced)"}
"""ToMA's node types (class_type in a queued prompt) and their display names."""
FORCE_MERGING = "a number forces merging at every size, 0 merges every call"
AUTO_HINT = re.compile(r"; a number in min_tokens forces merging(?=\))")
"""The cost model's hint inside its reason (run/prediction.py auto_veto), dropped where the fix below
names the input on the user's node instead."""
UPSTREAM_LIMIT = 64
"""Nodes followed upstream from toma_model before giving up (a prompt's chains are short)."""


def toma_node(prompt: dict | None, node_id: str | None) -> str | None:
    """The class_type of the ToMA node that feeds the `toma_model` input of node `node_id` in the
    queued `prompt` (API format), following `model` inputs through nodes in between (e.g. a LoRA
    loader); None when unknown (no prompt, as in a direct call, or no ToMA node found)."""
    if not prompt or node_id not in prompt:
        return None
    link: Any = prompt[node_id].get("inputs", {}).get("toma_model")
    for _ in range(UPSTREAM_LIMIT):
        if not isinstance(link, list) or str(link[0]) not in prompt:
            return None
        node = prompt[str(link[0])]
        if node.get("class_type") in NODE_NAMES:
            return node["class_type"]
        link = node.get("inputs", {}).get("model")
    return None


def merged(record: RunRecord, settings: ToMASettings, node: str | None) -> Merged:
    """What ToMA merged in the run of `record` (with `settings`, from node type `node`)."""
    schedule = settings.schedule
    planned = record.total_steps * max(0.0, schedule.end_percent - schedule.start_percent) / schedule.merge_every
    reason = main_reason(record)
    return Merged(record.steps_merged, record.total_steps, planned, AUTO_HINT.sub("", reason), fix(reason, node))


SCHEDULED = ("outside the sigma window", "between merge steps")
"""Unmerged-call reasons that are the schedule the settings ask for (run/wrappers.py call_veto)."""


def main_reason(record: RunRecord) -> str:
    """The run line's reason for most unmerged calls, a reason beyond the schedule first (the calls
    inside it that did not merge); its status where one says why nothing ran."""
    if record.status is not None:
        return STATUS_TEXT[record.status].format(eligible_calls=record.eligible_calls)
    if not record.unmerged_calls:
        return "no unmerged call"
    beyond = {why: n for why, n in record.unmerged_calls.items() if not why.startswith(SCHEDULED)}
    reason, calls = max((beyond or record.unmerged_calls).items(), key=lambda item: item[1])
    return f"{calls} of {record.total_calls} model calls unmerged: {reason}"


def fix(reason: str, node: str | None) -> str:
    """The change that would make ToMA merge the calls kept unmerged for `reason`, on node type `node`."""
    name = NODE_NAMES.get(node, "the ToMA node")
    if "min_tokens auto" in reason:
        return _min_tokens(node)
    if "fewer than min_tokens=" in reason:
        return f"lower min_tokens on ToMA Patch (Advanced) ({FORCE_MERGING})"
    if "outside the sigma window" in reason:
        return f"lower start_percent (or raise end_percent) on {name}"
    if "between merge steps" in reason:
        return f"set merge_every to 1 on {name}"
    if "ratio " in reason:
        return f"raise ratio on {name} (a ratio of at least 1 / (tile_size * tile_size) merges a token per tile)"
    if "bypassed" in reason or "no block run" in reason:
        return ("connect ToMA Patch after the nodes that replace the model's blocks (another pack, a step cache): "
                "its block hooks did not run")
    return "see ToMA's run line below for the reason of each unmerged call"


def _min_tokens(node: str | None) -> str:
    if node == "ToMAPatchAdvanced":
        return f"set min_tokens on ToMA Patch (Advanced) to a number ({FORCE_MERGING})"
    if node == "ToMAPatch":
        return f"ToMA Patch has no min_tokens: use ToMA Patch (Advanced) with the same settings and set its min_tokens to a number ({FORCE_MERGING})"
    return f"set min_tokens to a number on ToMA Patch (Advanced) ({FORCE_MERGING}; the basic ToMA Patch has no min_tokens)"
