"""Keys merged after rope, per family: the attention error of scope keys_values at the first merged
self-attention of each family's tiny random-weight ComfyUI model, against merging the queries too.

    COMFYUI_PATH=/path/to/ComfyUI python -m bench.tokens.roped_keys      # CPU, about 10 s

What each column is: harness/keys_values_probe.py (ratio 0.5, tiles of 4 x 4 tokens, one step at cfg 1;
errors relative to the exact attention over the N image query rows). The weights are random and the
latent is noise, so read the columns against each other, not as image quality. A family whose class
this ComfyUI lacks is listed as such.
"""

from __future__ import annotations

import argparse

from harness import keys_values_probe

from .. import cli


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    args = argparse.Namespace(device="cpu", dtype="fp32", attention="pytorch")
    root = cli.import_comfy(args)
    print(cli.run_header(root, args) + "ratio 0.5, tile 4")
    print("| family | positions | N -> D keys | keys_values | without log-mass | queries merged too | kernel vs formula |")
    print("|---|---|---|---|---|---|---|")
    for name, case in keys_values_probe.CASES.items():
        r = keys_values_probe.probe(case)
        if r is None:
            print(f"| {name} | {case.positions} | class not in this ComfyUI | | | | |")
            continue
        print(f"| {name} | {case.positions} | {r.tokens} -> {r.kept} | {r.keys_values:.3f} | {r.no_mass:.3f} | {r.queries_too:.3f} | {r.kernel:.0e} |")


if __name__ == "__main__":
    main()
