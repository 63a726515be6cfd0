# SPDX-License-Identifier: MIT
"""plotdata.py RESULTS.json PREFIX: the data files of bench/python/plot.gp from a
pybench.py results file: PREFIX-roundtrip.dat and PREFIX-tesseract.dat, one row per
size, one column per method (median ms), "?" where a row was not measured."""

import json
import sys


def write(path, records, scenario, sizes):
    names = []
    for r in records:
        if r["scenario"] == scenario and r["method"] not in names:
            names.append(r["method"])
    with open(path, "w") as f:
        f.write("size\t" + "\t".join(names) + "\n")
        for n in sizes:
            cells = []
            for name in names:
                r = next((r for r in records if r["scenario"] == scenario and r["method"] == name
                          and r["elements"] == n and "median_ms" in r), None)
                cells.append(f"{r['median_ms']:.6g}" if r else "?")
            f.write(f"{n:.0e} ({8 * n / 1e6:g} MB)".replace("e+0", "e") + "\t" + "\t".join(cells) + "\n")
    return len(names)


def main():
    doc = json.load(open(sys.argv[1]))
    prefix = sys.argv[2]
    a = write(prefix + "-roundtrip.dat", doc["records"], "roundtrip", doc["sizes"])
    b = write(prefix + "-tesseract.dat", doc["records"], "tesseract", doc["sizes"])
    print(a, b)


if __name__ == "__main__":
    main()
