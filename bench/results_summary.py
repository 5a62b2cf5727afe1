"""Writing a results directory's summary: summary.json (indented, one trailing newline) and the
markdown tables a BENCHMARKS.md section includes, by the summarize.py scripts under
bench/results/ (each recomputed by a test, so what they write is exactly what they compute)."""
import json
import os


def write(here, summ, tables):
    """summary.json of summ in here, and each {file name: markdown} of tables beside it."""
    with open(os.path.join(here, "summary.json"), "w") as f:
        json.dump(summ, f, indent=1)
        f.write("\n")
    for name, text in tables.items():
        with open(os.path.join(here, name), "w") as f:
            f.write(text)
