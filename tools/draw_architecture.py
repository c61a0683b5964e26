"""Draw docs/architecture.svg: the processes of one training job and the data of one step.

    python tools/draw_architecture.py [--out docs/architecture.svg]
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# name: (x, y, width, height, title, lines, colour); coordinates in a 16 x 9 box
BOXES = {
    "driver": (0.3, 3.4, 3.6, 2.2, "driver process", ["python -m vime_ext.train", "driver/loop.py: the loop",
                                                     "step, handover, recovery"], "#dbe9f6"),
    "ranks": (5.6, 5.9, 4.6, 2.6, "trainer ranks (Ray actors)", ["one per trainer GPU", "Megatron TP / PP / DP",
                                                                 "log-probs, loss, optimizer,", "checkpoints"],
              "#fde2c8"),
    "manager": (5.6, 0.4, 4.6, 2.8, "rollout manager (Ray actor)", ["prompt data and its position",
                                                                    "rollout plug-ins: generate,", "reward, filters",
                                                                    "starts / restarts engines"], "#d9f0d3"),
    "router": (11.6, 0.6, 2.0, 1.2, "vllm-router", [], "#eeeeee"),
    "engines": (11.6, 3.0, 4.1, 3.0, "vLLM engines", ["vllm serve subprocesses", "separate: GPUs of their own",
                                                      "colocated: on the trainer's GPUs,", "asleep while ranks train"],
                "#e8def8"),
}
# (from, to, label, label position offset); numbers are the order within one step
ARROWS = [
    ("driver", "manager", "1 rollout(n)", (-0.8, -0.2)),
    ("manager", "router", "2 requests", (0.0, 0.25)),
    ("router", "engines", "", (0, 0)),
    ("manager", "driver", "3 samples + rewards", (1.3, 0.2)),
    ("driver", "ranks", "4 train sequences,\none DP share per rank", (-1.1, 0.2)),
    ("ranks", "engines", "5 weights: NCCL (separate)\nor CUDA IPC (colocated)", (0.3, 0.75)),
]


def centre(name: str) -> tuple[float, float]:
    x, y, w, h, *_ = BOXES[name]
    return x + w / 2, y + h / 2


def edge_point(name: str, towards: tuple[float, float]) -> tuple[float, float]:
    """Where the line from the box's centre towards a point leaves the box."""
    x, y, w, h, *_ = BOXES[name]
    cx, cy = centre(name)
    dx, dy = towards[0] - cx, towards[1] - cy
    scale = min(abs(w / 2 / dx) if dx else float("inf"), abs(h / 2 / dy) if dy else float("inf"))
    return cx + dx * scale, cy + dy * scale


def draw(out: Path) -> None:
    plt.rcParams["svg.hashsalt"] = "vime_ext"  # the same file for the same picture
    fig, ax = plt.subplots(figsize=(12, 6.75))
    ax.set_xlim(0, 16)
    ax.set_ylim(0, 9)
    ax.axis("off")
    for x, y, w, h, title, lines, colour in BOXES.values():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05,rounding_size=0.15", fc=colour,
                                    ec="#444444", lw=1.2))
        ax.text(x + w / 2, y + h - 0.3, title, ha="center", va="top", fontsize=11, weight="bold")
        for i, line in enumerate(lines):
            ax.text(x + w / 2, y + h - 0.85 - 0.42 * i, line, ha="center", va="top", fontsize=9)
    for a, b, label, (ox, oy) in ARROWS:
        start, end = edge_point(a, centre(b)), edge_point(b, centre(a))
        if {a, b} == {"driver", "manager"}:  # two arrows between the same boxes: side by side, not on one line
            shift = 0.25 if a == "driver" else -0.25
            start, end = (start[0] - shift, start[1] - shift), (end[0] - shift, end[1] - shift)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.3, color="#333333",
                                     shrinkA=4, shrinkB=4))
        if label:
            mx, my = (start[0] + end[0]) / 2 + ox, (start[1] + end[1]) / 2 + oy
            ax.text(mx, my, label, ha="center", va="center", fontsize=9, color="#1a1a7a")
    ax.text(0.3, 8.6, "One training job: processes, and the data of one step (1-5)", fontsize=12, weight="bold")
    fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "architecture.svg")
    args = parser.parse_args(argv)
    draw(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
