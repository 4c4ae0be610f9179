"""Write the synthetic visual task (reward: `rlhf_mcore/rewards/shapes.py`) in verl's multimodal parquet schema.

Each image is 56 x 56 pixels, white, with shapes (square, disc or triangle):
- `colour`: one large shape (over the whole image) in red, green or blue; "<image>Colour? r, g or b." -> r / g / b
- `count`: one to three small shapes of one colour, in distinct cells of a 2 x 2 grid; "<image>How many shapes?
  1, 2 or 3." -> 1 / 2 / 3
Colours and counts are balanced (row i takes answer i mod 3 before the shuffle of the rest of the scene). The
images are PNG bytes in verl's / HF datasets' form, `images: [{"bytes": ..., "path": None}]`.

    python -m tools.make_shapes_dataset --out data/shapes --tasks colour
"""
from __future__ import annotations

import argparse
import io
import os
import random

COLOURS = {"r": (220, 40, 40), "g": (40, 170, 40), "b": (40, 40, 220)}
SIDE, CELL = 56, 28
KINDS = ("square", "disc", "triangle")
QUESTIONS = {"colour": "<image>Colour? r, g or b.", "count": "<image>How many shapes? 1, 2 or 3."}


def draw(shapes: list[tuple[str, str, int]]):
    """A white SIDE x SIDE image with (kind, colour letter, cell 0-3 of the 2 x 2 grid, or -1: the whole) shapes."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (SIDE, SIDE), (255, 255, 255))
    pen = ImageDraw.Draw(img)
    for kind, colour, cell in shapes:
        size = SIDE if cell < 0 else CELL  # cell -1: the whole image
        x, y = (0, 0) if cell < 0 else ((cell % 2) * CELL, (cell // 2) * CELL)
        x, y = x + 4, y + 4
        box, fill = (x, y, x + size - 8, y + size - 8), COLOURS[colour]
        if kind == "square":
            pen.rectangle(box, fill=fill)
        elif kind == "disc":
            pen.ellipse(box, fill=fill)
        else:
            pen.polygon([(x, box[3]), (box[2], box[3]), ((x + box[2]) // 2, y)], fill=fill)
    return img


def png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def scene(task: str, i: int, rng: random.Random) -> tuple[list[tuple[str, str, int]], str]:
    """(shapes, answer) of row i: the answer cycles over the three (balanced), the rest is drawn."""
    colour = "rgb"[i % 3] if task == "colour" else rng.choice("rgb")
    count = 1 if task == "colour" else i % 3 + 1
    cells = [-1] if task == "colour" else rng.sample(range(4), count)
    shapes = [(rng.choice(KINDS), colour, cell) for cell in cells]
    return shapes, colour if task == "colour" else str(count)


def rows(num: int, seed: int, split: str, tasks: tuple[str, ...] = ("colour", "count")) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(num):
        task = tasks[i % len(tasks)]
        shapes, answer = scene(task, i // len(tasks), rng)
        out.append({"data_source": "synthetic/shapes", "prompt": [{"role": "user", "content": QUESTIONS[task]}],
                    "images": [{"bytes": png(draw(shapes)), "path": None}], "ability": f"visual/{task}",
                    "reward_model": {"style": "rule", "ground_truth": answer},
                    "extra_info": {"split": split, "index": i, "task": task}})
    rng.shuffle(out)
    return out


def main(argv=None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data/shapes")
    parser.add_argument("--tasks", default="colour,count", help="comma-separated: colour, count")
    parser.add_argument("--num-train", type=int, default=192)
    parser.add_argument("--num-test", type=int, default=24)
    args = parser.parse_args(argv)
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    unknown = [t for t in tasks if t not in QUESTIONS]
    if unknown or not tasks:
        parser.error(f"--tasks: unknown {unknown} (choose from {sorted(QUESTIONS)})")
    os.makedirs(args.out, exist_ok=True)
    for split, num, seed in (("train", args.num_train, 0), ("test", args.num_test, 1)):
        pq.write_table(pa.Table.from_pylist(rows(num, seed, split, tasks)), os.path.join(args.out, f"{split}.parquet"))
    print(f"wrote {args.num_train} train and {args.num_test} test rows ({', '.join(tasks)}) to {args.out}")


if __name__ == "__main__":
    main()
