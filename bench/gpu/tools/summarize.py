#!/usr/bin/env python3
"""Turns bench/gpu/run.sh throughput's results.jsonl into the BENCHMARKS.md tables."""
import json
import sys


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    tally = {r["name"]: r for r in rows if r["kind"] == "tally"}
    ceil = {(r["model"], r["precision"]): r["result"]["ceiling_images_per_second"] for r in rows if r["kind"] == "ceiling"}
    decode = {(r["format"], r["threads"]): r["images_per_second"] for r in rows if r["kind"] == "decode"}
    py = [r for r in rows if r["kind"] == "python"]
    cores = max([t for (_, t) in decode] or [0])

    def best_python(model, fmt, precision):
        c = [p for p in py if p["model"] == model and p["format"] == fmt and p["result"]["precision"] == precision]
        if not c:
            return None, ""
        b = max(c, key=lambda p: p["result"]["steady_images_per_second"])
        return b["result"]["steady_images_per_second"], \
            f'{b["result"]["workers"]} workers, pin_memory={"on" if b["result"]["pin_memory"] else "off"}'

    fmt_rate = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
    fmt_ratio = lambda a, b: "-" if not a or not b else f"{a / b:.2f}"  # noqa: E731
    print("| model, format, precision | Tally img/s (steady) | Tally img/s (wall, incl. start) | best Python DataLoader "
          "img/s (config) | model-only ceiling img/s | Tally / ceiling | Tally / best Python | decode-only img/s, "
          f"{cores} threads | first batch after `tally run` (s) | peak GPU memory (GiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, model, fmt, prec in (("lraspp_png_fp32", "lraspp", "png", "fp32"),
                                   ("lraspp_jpg_fp32", "lraspp", "jpg", "fp32"),
                                   ("deeplab_png_fp32", "deeplabv3", "png", "fp32"),
                                   ("deeplab_png_bf16", "deeplabv3", "png", "bf16")):
        t = tally.get(name)
        steady = t["steady_images_per_second"] if t else None
        bp, cfg = best_python(model, fmt, prec)
        c = ceil.get((model, prec))
        print(f"| {model} {fmt.upper()} {prec} | {fmt_rate(steady)} | {fmt_rate(t and t['wall_images_per_second'])} | "
              f"{fmt_rate(bp)} ({cfg}) | {fmt_rate(c)} | {fmt_ratio(steady, c)} | {fmt_ratio(steady, bp)} | "
              f"{fmt_rate(decode.get((fmt, cores)))} | "
              f"{', '.join(f'{x:.1f}' for x in t['first_batch_seconds_from_run']) if t else '-'} | "
              f"{', '.join(f'{x:.1f}' for x in t['peak_memory_gib']) if t else '-'} |")
    print()
    print("| metrics | model, format | `--metrics dice` img/s | `--metrics all` img/s | all / dice |")
    print("|---|---|---|---|---|")
    for base, full, label in (("deeplab_png_fp32", "deeplab_png_fp32_all", "deeplabv3 PNG fp32"),
                              ("lraspp_jpg_fp32", "lraspp_jpg_fp32_all", "lraspp JPEG fp32")):
        if base in tally and full in tally:
            a, b = tally[base]["steady_images_per_second"], tally[full]["steady_images_per_second"]
            print(f"| dice vs all | {label} | {a:.0f} | {b:.0f} | {b / a:.3f} |")
    for base, bench in (("lraspp_jpg_fp32", "lraspp_jpg_fp32_cudnnbench"), ("deeplab_png_fp32", "deeplab_png_fp32_cudnnbench")):
        if base in tally and bench in tally:
            a, b = tally[base]["steady_images_per_second"], tally[bench]["steady_images_per_second"]
            print(f"\ncuDNN benchmark mode, {base}: off {a:.0f} img/s, on {b:.0f} img/s ({b / a:.3f}x)")
    if "scaling_1gpu" in tally and "scaling_all" in tally:
        one, many = tally["scaling_1gpu"], tally["scaling_all"]
        same = [r for r in rows if r["kind"] == "scaling_identical"]
        print()
        print("| scaling | GPUs | img/s (steady) | img/s (wall) | vs linear | identical per_image.csv |")
        print("|---|---|---|---|---|---|")
        print(f"| deeplabv3 PNG fp32 | 1 | {one['steady_images_per_second']:.0f} | {one['wall_images_per_second']:.0f} | 1.00 | |")
        n = many["gpus"]
        print(f"| deeplabv3 PNG fp32 | {n} | {many['steady_images_per_second']:.0f} | "
              f"{many['wall_images_per_second']:.0f} | "
              f"{many['steady_images_per_second'] / (n * one['steady_images_per_second']):.3f} | "
              f"{same[-1]['identical'] if same else '?'} |")
    for r in rows:
        if r["kind"] == "dataset":
            print(f"\nDataset: {r['images']} images 512x512, PNG {r['png_kib'] / r['images']:.0f} KiB/image, "
                  f"JPEG q90 {r['jpg_kib'] / r['images']:.0f} KiB/image.")
    for fmt in ("png", "jpg"):
        if (fmt, 1) in decode:
            print(f"Decode (image + mask) {fmt.upper()}: {decode[(fmt, 1)]:.0f} img/s on 1 thread, "
                  f"{decode.get((fmt, cores), 0):.0f} on {cores}.")


if __name__ == "__main__":
    main(sys.argv[1])
