"""Writes the schedule.item_overlap trials: each committed cell below with item_overlap: true (and its name ending
in _io), one file per dtype, into trial_specs/. Usage: python3 docs/hopper-h200/item_overlap/make_trials.py"""
from pathlib import Path

import yaml

from attngen.spec import load_spec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CELLS = ("h100_wgmma_d128_persistent_q2", "h100_wgmma_d128_persistent_q2_kmpb", "h100_wgmma_d64_persistent_q2",
         "h100_wgmma_d64_persistent_q2_c3")


def main():
    for cell in CELLS:
        for suffix in ("", "_bf16"):
            name = cell + suffix
            spec = load_spec(ROOT / "specs" / f"{name}.yaml")
            data = spec.model_dump(mode="json", exclude_defaults=True, by_alias=True)
            data["schedule"]["item_overlap"] = True
            data["name"] = f"{cell}_io{suffix}"
            data["description"] = f"{name} with schedule.item_overlap: true"
            text = (f"# Trial: specs/{name}.yaml with schedule.item_overlap: true (the next query block's first S "
                    f"issued before this block's epilogue); made by make_trials.py.\n" + yaml.safe_dump(data, sort_keys=False))
            (HERE / "trial_specs" / f"{data['name']}.yaml").write_text(text)
            print(data["name"])


if __name__ == "__main__":
    main()
